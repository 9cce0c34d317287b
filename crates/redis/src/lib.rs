//! The stock gate on Redis.
//!
//! Keys of one product share a hash tag, `{p:<id>}`, so every script touches one slot and
//! would run unchanged on Redis Cluster:
//!
//! | key                              | type   | holds                                      |
//! |----------------------------------|--------|--------------------------------------------|
//! | `<prefix>{p:<id>}:inv`           | hash   | `avail` units, `seq` last hold id, `gen` generation, `srv` run_id of the Redis process that loaded or rebuilt it, `lease` end of the sold-out lease (ms) |
//! | `<prefix>{p:<id>}:users`         | hash   | user id → units held (limited products)    |
//! | `<prefix>{p:<id>}:r:<request_id>`| hash   | one hold: user, quantity, state, hold id, generation |
//! | `<prefix>{p:<id>}:pending`       | zset   | request_ids of holds, scored by time (ms)  |
//! | `<prefix>{p:<id>}:restock:<id>`  | string | marker of an applied restock               |
//! | `<prefix>{p:<id>}:rel:<request_id>` | string | marker of a reservation's release (expires with the records) |
//!
//! One pub/sub channel, `<prefix>lease:revoked`: every script that adds units to a
//! product ends its sold-out lease and publishes `<product id>:<generation>` there in the
//! same atomic step; each instance's subscriber (`revoke.rs`) hears it.
//!
//! Every script validates its arguments before its first write, and is idempotent on its
//! request or restock id: a client retry after a lost reply never takes or returns stock
//! twice. The hold record is written in the same atomic step as the decrement, so no
//! decrement is ever untraceable; the `pending` index lets recovery find holds without
//! scanning the keyspace. An attempt that takes nothing writes nothing.

use std::time::Duration;

mod reserve;
pub mod revoke;
mod trim;

use async_trait::async_trait;
use std::collections::BTreeMap;

use flashsale_app::ports::ErrorKind;
use flashsale_app::ports::{
    ExistingHold, GateFacts, GateMaintenance, GateState, RebuildPlan, Release, ReleaseOf, Reserve,
    Restock, SoldOutLease, StaleHold,
};
use flashsale_app::{GateError, StockGate};
use flashsale_core::{
    Generation, HoldId, HoldRef, ProductId, PurchaseRequest, Quantity, RequestId, UserId,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Script, Value};

/// Connection settings of the gate.
#[derive(Debug, Clone)]
pub struct GateConfig {
    pub url: String,
    /// Prepended to every key, so deployments and tests can share one Redis.
    pub prefix: String,
    /// How long a hold record is kept; replays after that are answered by the ledger.
    pub record_ttl: Duration,
    /// How long to wait for a reply before calling the outcome unknown.
    pub response_timeout: Duration,
    /// How long to wait for a connection before calling Redis unreachable.
    pub connect_timeout: Duration,
    /// How long a product found with no unit left grants no hold unless units come back
    /// (the sold-out lease, `reserve.lua`); zero grants none.
    pub sold_out_lease: Duration,
}

/// Reconnect attempts per failed connection before the call fails: a purchase must
/// answer 503 quickly when Redis is down rather than queue behind reconnects.
const RECONNECT_ATTEMPTS: usize = 1;

pub struct RedisGate {
    /// The reservation batcher, started on the first purchase (inside the runtime).
    reserver: std::sync::OnceLock<flashsale_batch::Coalescer<reserve::Item, reserve::Reply>>,
    /// The early trims of committed holds, started on the first commit (inside the runtime).
    trimmer: std::sync::OnceLock<trim::Trimmer>,
    conn: ConnectionManager,
    prefix: String,
    /// Where lease revocations are published ([`revoke::channel`]).
    revocations: String,
    record_ttl_ms: u64,
    sold_out_lease_ms: u64,
    reserve: Script,
    release: Script,
    restock: Script,
    load: Script,
    adjust: Script,
    rebuild: Script,
    state: Script,
    forget: Script,
    holders: Script,
    seed_decrement: Script,
}

impl RedisGate {
    /// Builds the gate without connecting: the first call connects, so the service starts
    /// (and reports not ready) while Redis is down.
    pub fn new(config: &GateConfig) -> Result<Self, GateError> {
        let client = redis::Client::open(config.url.as_str())
            .map_err(|e| GateError::caused(ErrorKind::Config, "invalid redis url", e))?;
        let manager_config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(config.response_timeout))
            .set_connection_timeout(Some(config.connect_timeout))
            .set_number_of_retries(RECONNECT_ATTEMPTS);
        let conn =
            ConnectionManager::new_lazy_with_config(client, manager_config).map_err(unavailable)?;
        Ok(Self {
            reserver: std::sync::OnceLock::new(),
            trimmer: std::sync::OnceLock::new(),
            conn,
            prefix: config.prefix.clone(),
            revocations: revoke::channel(&config.prefix),
            record_ttl_ms: u64::try_from(config.record_ttl.as_millis()).unwrap_or(u64::MAX),
            sold_out_lease_ms: u64::try_from(config.sold_out_lease.as_millis()).unwrap_or(u64::MAX),
            reserve: Script::new(include_str!("lua/reserve.lua")),
            release: Script::new(include_str!("lua/release.lua")),
            restock: Script::new(include_str!("lua/restock.lua")),
            load: Script::new(include_str!("lua/load.lua")),
            adjust: Script::new(include_str!("lua/adjust.lua")),
            rebuild: Script::new(include_str!("lua/rebuild.lua")),
            state: Script::new(include_str!("lua/state.lua")),
            forget: Script::new(include_str!("lua/forget.lua")),
            holders: Script::new(include_str!("lua/holders.lua")),
            seed_decrement: Script::new(include_str!("lua/seed_decrement.lua")),
        })
    }

    fn key(&self, product_id: ProductId, suffix: &str) -> String {
        key(&self.prefix, product_id.get(), suffix)
    }

    fn forget(&self) -> trim::Forget {
        trim::Forget {
            conn: self.conn.clone(),
            script: self.forget.clone(),
            prefix: self.prefix.clone(),
        }
    }

    fn hold_key(&self, product_id: ProductId, request_id: &RequestId) -> String {
        self.key(product_id, &format!("r:{request_id}"))
    }
}

/// A key of one product, as the table in the crate's documentation lays them out.
fn key(prefix: &str, product_id: i64, suffix: &str) -> String {
    format!("{prefix}{{p:{product_id}}}:{suffix}")
}

/// A redis-rs error by what happened: no reply in time, the connection failed, a reply
/// of the wrong shape, a bad client setting, or an error Redis answered.
fn unavailable(e: redis::RedisError) -> GateError {
    use redis::ErrorKind as K;
    let kind = match e.kind() {
        _ if e.is_timeout() => ErrorKind::TimedOut,
        K::Io => ErrorKind::Unreachable,
        K::Parse | K::UnexpectedReturnType => ErrorKind::Corrupt,
        K::InvalidClientConfig => ErrorKind::Config,
        _ => ErrorKind::Rejected,
    };
    GateError::caused(kind, "redis", e)
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn unexpected(script: &str, value: &Value) -> GateError {
    GateError::corrupt(format!("unexpected reply from {script} script: {value:?}"))
}

fn parse_reserve(reply: &Value) -> Result<Reserve, GateError> {
    let bad = || unexpected("reserve", reply);
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    let ints: Vec<i64> = items
        .iter()
        .map(int)
        .collect::<Option<_>>()
        .ok_or_else(bad)?;
    Ok(match ints.as_slice() {
        [1, hold_id, generation] => Reserve::Reserved {
            hold: HoldRef::from_stored(*generation, *hold_id).ok_or_else(bad)?,
        },
        [0] => Reserve::SoldOut {
            unseen: false,
            lease: None,
        },
        [0, unseen] => Reserve::SoldOut {
            unseen: *unseen == 1,
            lease: None,
        },
        [0, unseen, remaining, generation, holds] if *remaining > 0 => Reserve::SoldOut {
            unseen: *unseen == 1,
            lease: Some(SoldOutLease {
                remaining: Duration::from_millis(remaining.unsigned_abs()),
                generation: Generation::from_stored(*generation).ok_or_else(bad)?,
                holds: *holds,
            }),
        },
        [-1] => Reserve::NotLoaded,
        [-3] => Reserve::NotRebuilt,
        [-2] => Reserve::LimitExceeded { unseen: false },
        [-2, unseen] => Reserve::LimitExceeded {
            unseen: *unseen == 1,
        },
        [2, hold_id, user, quantity, released, generation] => Reserve::Existing(ExistingHold {
            hold: HoldRef::from_stored(*generation, *hold_id).ok_or_else(bad)?,
            user_id: UserId::parse(*user).map_err(|_| bad())?,
            quantity: Quantity::from_stored(*quantity).ok_or_else(bad)?,
            released: *released == 1,
        }),
        _ => return Err(bad()),
    })
}

#[async_trait]
impl StockGate for RedisGate {
    async fn ping(&self) -> Result<(), GateError> {
        let mut conn = self.conn.clone();
        redis::cmd("PING")
            .query_async::<String>(&mut conn)
            .await
            .map(drop)
            .map_err(unavailable)
    }

    async fn load(
        &self,
        product_id: ProductId,
        available: i64,
        generation: Generation,
    ) -> Result<bool, GateError> {
        let mut conn = self.conn.clone();
        let loaded: i64 = self
            .load
            .key(self.key(product_id, "inv"))
            .arg(available)
            .arg(generation.get())
            .arg(self.record_ttl_ms)
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(loaded == 1)
    }

    fn committed(&self, product_id: ProductId, hold: StaleHold) {
        self.trimmer
            .get_or_init(|| trim::Trimmer::start(self.forget()))
            .committed(product_id, hold);
    }

    async fn reserve(
        &self,
        request: &PurchaseRequest,
        per_user_limit: Option<u32>,
    ) -> Result<Reserve, GateError> {
        let reserver = self.reserver.get_or_init(|| {
            reserve::Reserver {
                conn: self.conn.clone(),
                script: self.reserve.clone(),
                prefix: self.prefix.clone(),
                record_ttl_ms: self.record_ttl_ms,
                sold_out_lease_ms: self.sold_out_lease_ms,
            }
            .start()
        });
        reserver
            .call((request.clone(), per_user_limit))
            .await
            .map_err(|_| GateError::stopped("reserve: the batcher stopped; outcome unknown"))?
    }

    async fn release(
        &self,
        product_id: ProductId,
        request_id: &RequestId,
        of: &ReleaseOf,
    ) -> Result<Release, GateError> {
        let mut conn = self.conn.clone();
        // The script takes integers; 0 stands for "no release generation" (a hold the
        // ledger never counted) and for "no user".
        let (generation, hold, user, quantity, limited) = match of {
            ReleaseOf::Hold { hold } => (0, *hold, 0, 0, false),
            ReleaseOf::Reservation {
                generation,
                hold,
                user_id,
                quantity,
                limited,
            } => (
                generation.get(),
                *hold,
                user_id.get(),
                quantity.get(),
                *limited,
            ),
        };
        let code: i64 = self
            .release
            .key(self.key(product_id, "inv"))
            .key(self.key(product_id, "users"))
            .key(self.hold_key(product_id, request_id))
            .key(self.key(product_id, "pending"))
            .key(self.key(product_id, &format!("rel:{request_id}")))
            .arg(request_id.as_str())
            .arg(generation)
            .arg(user)
            .arg(quantity)
            .arg(u8::from(limited))
            .arg(self.record_ttl_ms)
            .arg(hold.id.get())
            .arg(hold.generation.get())
            .arg(&self.revocations)
            .arg(product_id.get())
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        match code {
            1 => Ok(Release::Released),
            0 => Ok(Release::AlreadyReleased),
            -1 => Ok(Release::Missing),
            -2 => Ok(Release::NotLoaded),
            other => Err(unexpected("release", &Value::Int(other))),
        }
    }

    async fn restock(
        &self,
        product_id: ProductId,
        restock_id: &RequestId,
        quantity: i64,
        generation: Generation,
    ) -> Result<Restock, GateError> {
        let mut conn = self.conn.clone();
        let code: i64 = self
            .restock
            .key(self.key(product_id, "inv"))
            .key(self.key(product_id, &format!("restock:{restock_id}")))
            .arg(quantity)
            .arg(generation.get())
            .arg(&self.revocations)
            .arg(product_id.get())
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        match code {
            1 => Ok(Restock::Applied),
            0 => Ok(Restock::AlreadyApplied),
            -1 => Ok(Restock::NotLoaded),
            -3 => Ok(Restock::Stale),
            other => Err(unexpected("restock", &Value::Int(other))),
        }
    }

    async fn available(&self, product_id: ProductId) -> Result<Option<i64>, GateError> {
        let mut conn = self.conn.clone();
        redis::cmd("HGET")
            .arg(self.key(product_id, "inv"))
            .arg("avail")
            .query_async::<Option<i64>>(&mut conn)
            .await
            .map_err(unavailable)
    }

    async fn pending_request_ids(
        &self,
        product_id: ProductId,
        max: usize,
    ) -> Result<Option<(Generation, Vec<RequestId>)>, GateError> {
        let mut conn = self.conn.clone();
        let reply: Value = self
            .holders
            .key(self.key(product_id, "inv"))
            .key(self.key(product_id, "pending"))
            .arg(max)
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        let Value::Array(items) = &reply else {
            return Err(unexpected("holders", &reply));
        };
        let generation = items.get(1).and_then(int).and_then(Generation::from_stored);
        match (items.first().and_then(int), generation) {
            (Some(1), Some(generation)) => items[2..]
                .iter()
                .map(|id| match id {
                    Value::BulkString(bytes) => std::str::from_utf8(bytes)
                        .ok()
                        .and_then(|id| RequestId::parse("request_id", id).ok())
                        .ok_or_else(|| unexpected("holders", id)),
                    other => Err(unexpected("holders", other)),
                })
                .collect::<Result<_, _>>()
                .map(|ids| Some((generation, ids))),
            (Some(2), Some(_)) => Ok(None),
            (Some(-1), _) => Err(GateError::not_ready(format!(
                "stock of product {product_id} is missing from the stock gate"
            ))),
            (Some(-3), _) => Err(GateError::not_ready(
                "the stock gate can't vouch for its pending holds (another Redis process \
                 wrote the entry, or keys may be evicted)",
            )),
            _ => Err(unexpected("holders", &reply)),
        }
    }
}

/// Keys one SCAN step asks for when collecting a product's hold records (audit only).
const SCAN_COUNT: usize = 1000;
/// Most hold records an audit reads for one product; far above any product's live holds
/// (bounded by its stock), it stops a runaway scan on a corrupted keyspace.
const FACTS_HOLDS_MAX: usize = 5_000_000;

/// A hold record's fields as HMGET returns them: user, quantity, state, hold id,
/// generation.
type RawHold = (
    Option<i64>,
    Option<i64>,
    Option<String>,
    Option<i64>,
    Option<i64>,
);

/// A parsed hold record: user, quantity, released, hold id, generation.
type Hold = (i64, i64, bool, i64, i64);

impl RedisGate {
    /// Reads hold records (user, quantity, state, hold id) for request_ids, in one round
    /// trip; None where the record is gone.
    async fn holds(
        &self,
        product_id: ProductId,
        request_ids: &[String],
    ) -> Result<Vec<Option<Hold>>, GateError> {
        if request_ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for request_id in request_ids {
            pipe.cmd("HMGET")
                .arg(self.key(product_id, &format!("r:{request_id}")))
                .arg("u")
                .arg("q")
                .arg("s")
                .arg("h")
                .arg("g");
        }
        let mut conn = self.conn.clone();
        let rows: Vec<RawHold> = pipe.query_async(&mut conn).await.map_err(unavailable)?;
        Ok(rows
            .into_iter()
            .map(|row| match row {
                (Some(u), Some(q), Some(s), Some(h), g) => {
                    Some((u, q, s == "r", h, g.unwrap_or(1)))
                }
                _ => None,
            })
            .collect())
    }
}

#[async_trait]
impl GateMaintenance for RedisGate {
    async fn stale_holds(
        &self,
        product_id: ProductId,
        older_than: Duration,
        limit: usize,
    ) -> Result<Vec<StaleHold>, GateError> {
        let mut conn = self.conn.clone();
        let pending = self.key(product_id, "pending");
        // Holds are aged on Redis's clock, the one that stamped them.
        let (secs, micros): (i64, i64) = redis::cmd("TIME")
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        let older_than_ms = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
        let taken_before_ms = (secs * 1000 + micros / 1000).saturating_sub(older_than_ms);
        let ids: Vec<String> = redis::cmd("ZRANGEBYSCORE")
            .arg(&pending)
            .arg("-inf")
            .arg(format!("({taken_before_ms}"))
            .arg("LIMIT")
            .arg(0)
            .arg(limit)
            .query_async(&mut conn)
            .await
            .map_err(unavailable)?;
        let records = self.holds(product_id, &ids).await?;
        let mut stale = Vec::new();
        let mut gone = Vec::new();
        for (request_id, record) in ids.into_iter().zip(records) {
            let parsed = record.and_then(|(u, q, released, hold_id, generation)| {
                Some(StaleHold {
                    request: PurchaseRequest {
                        request_id: RequestId::parse("request_id", &request_id).ok()?,
                        user_id: UserId::parse(u).ok()?,
                        product_id,
                        quantity: Quantity::from_stored(q)?,
                    },
                    hold: HoldRef::from_stored(generation, hold_id)?,
                    released,
                })
            });
            match parsed {
                Some(hold) => stale.push(hold),
                // The record outlived its retention: nothing left to recover here.
                None => gone.push(request_id),
            }
        }
        if !gone.is_empty() {
            let _: i64 = redis::cmd("ZREM")
                .arg(&pending)
                .arg(&gone)
                .query_async(&mut conn)
                .await
                .map_err(unavailable)?;
        }
        Ok(stale)
    }

    async fn forget_pending(
        &self,
        product_id: ProductId,
        holds: &[StaleHold],
    ) -> Result<(), GateError> {
        self.forget()
            .forget(product_id, holds)
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn facts(&self, product_id: ProductId) -> Result<GateFacts, GateError> {
        let mut conn = self.conn.clone();
        // One atomic look (MULTI/EXEC) at the count, the last hold id and the pending
        // index, with Redis's clock to age the holds on: every hold the count has taken
        // is either in the index or has reached the ledger, and one taken after the look
        // has a higher id. The records are read after it.
        let (inv, index, (secs, micros)): (Vec<Option<i64>>, Vec<(String, f64)>, (i64, i64)) =
            redis::pipe()
                .atomic()
                .cmd("HMGET")
                .arg(self.key(product_id, "inv"))
                .arg("avail")
                .arg("seq")
                .arg("gen")
                .cmd("ZRANGE")
                .arg(self.key(product_id, "pending"))
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .cmd("TIME")
                .query_async(&mut conn)
                .await
                .map_err(unavailable)?;
        let field = |i: usize| inv.get(i).copied().flatten();
        let available = field(0);
        let last_hold_id = field(1).unwrap_or(0);
        let generation = available.and_then(|_| Generation::from_stored(field(2).unwrap_or(1)));
        let now_ms = secs.saturating_mul(1000).saturating_add(micros / 1000);
        let pending: BTreeMap<String, Duration> = index
            .into_iter()
            .map(|(request_id, taken_ms)| {
                // Scores are whole milliseconds; a hold stamped ahead of now is new.
                let age_ms = u64::try_from(now_ms.saturating_sub(taken_ms as i64)).unwrap_or(0);
                (request_id, Duration::from_millis(age_ms))
            })
            .collect();
        let marker = self.key(product_id, "r:");
        let mut request_ids = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{marker}*"))
                .arg("COUNT")
                .arg(SCAN_COUNT)
                .query_async(&mut conn)
                .await
                .map_err(unavailable)?;
            request_ids.extend(
                keys.iter()
                    .filter_map(|k| k.strip_prefix(&marker).map(str::to_owned)),
            );
            if request_ids.len() > FACTS_HOLDS_MAX {
                return Err(GateError::too_large(format!(
                    "more than {FACTS_HOLDS_MAX} hold records for product {product_id}"
                )));
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        let mut held = BTreeMap::new();
        for chunk in request_ids.chunks(SCAN_COUNT) {
            let records = self.holds(product_id, chunk).await?;
            for (request_id, record) in chunk.iter().zip(records) {
                // Records of older generations hold nothing: the rebuild counted stock
                // without them.
                if let Some((_, q, false, hold_id, g)) = record {
                    if generation.is_some_and(|generation| generation.get() == g) {
                        let hold_id = HoldId::from_stored(hold_id).ok_or_else(|| {
                            GateError::corrupt(format!(
                                "hold record of {request_id} has hold id {hold_id}"
                            ))
                        })?;
                        held.insert(request_id.clone(), (hold_id, q));
                    }
                }
            }
        }
        Ok(GateFacts {
            available,
            generation,
            last_hold_id,
            held,
            pending,
        })
    }

    async fn adjust(&self, product_id: ProductId, delta: i64) -> Result<bool, GateError> {
        let mut conn = self.conn.clone();
        let code: i64 = self
            .adjust
            .key(self.key(product_id, "inv"))
            .arg(delta)
            .arg(&self.revocations)
            .arg(product_id.get())
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(code == 1)
    }

    async fn state(&self, product_id: ProductId) -> Result<Option<GateState>, GateError> {
        let mut conn = self.conn.clone();
        let reply: Vec<i64> = self
            .state
            .key(self.key(product_id, "inv"))
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        let bad =
            || GateError::corrupt(format!("unexpected reply from the state script: {reply:?}"));
        match reply[..] {
            [] => Ok(None),
            [available, last_hold_id, generation, changed] => Ok(Some(GateState {
                available,
                generation: Generation::from_stored(generation).ok_or_else(bad)?,
                last_hold_id,
                server_changed: changed == 1,
            })),
            _ => Err(bad()),
        }
    }

    async fn rebuild(&self, product_id: ProductId, plan: &RebuildPlan) -> Result<bool, GateError> {
        let mut conn = self.conn.clone();
        let mut invocation = self.rebuild.prepare_invoke();
        invocation
            .key(self.key(product_id, "inv"))
            .key(self.key(product_id, "users"))
            .key(self.key(product_id, "pending"))
            .arg(plan.generation.get())
            .arg(plan.available)
            .arg(plan.last_hold_id)
            .arg(&self.revocations)
            .arg(product_id.get());
        for (user, units) in &plan.user_units {
            invocation.arg(user.get()).arg(*units);
        }
        let code: i64 = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)?;
        Ok(code == 1)
    }
}

#[async_trait]
impl flashsale_app::baseline::BaselineGate for RedisGate {
    async fn seed_decrement(&self, product_id: ProductId, quantity: u32) -> Result<i64, GateError> {
        let mut conn = self.conn.clone();
        self.seed_decrement
            .key(self.key(product_id, "inv"))
            .arg(quantity)
            .invoke_async(&mut conn)
            .await
            .map_err(unavailable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that every reply shape of the reserve script maps to its outcome, that ids
    // above 2^53 survive (they travel as strings), and that malformed replies are errors,
    // never a guessed outcome.
    #[test]
    fn reserve_replies() {
        let arr = |v: Vec<Value>| Value::Array(v);
        let s = |t: &str| Value::BulkString(t.as_bytes().to_vec());
        assert_eq!(
            parse_reserve(&arr(vec![Value::Int(1), Value::Int(7), s("3")])).ok(),
            Some(Reserve::Reserved {
                hold: HoldRef::from_stored(3, 7).expect("hold")
            })
        );
        assert_eq!(
            parse_reserve(&arr(vec![Value::Int(0)])).ok(),
            Some(Reserve::SoldOut {
                unseen: false,
                lease: None
            })
        );
        assert_eq!(
            parse_reserve(&arr(vec![Value::Int(0), Value::Int(1)])).ok(),
            Some(Reserve::SoldOut {
                unseen: true,
                lease: None
            })
        );
        assert_eq!(
            parse_reserve(&arr(vec![
                Value::Int(0),
                Value::Int(0),
                Value::Int(250),
                s("3"),
                s("1000")
            ]))
            .ok(),
            Some(Reserve::SoldOut {
                unseen: false,
                lease: Some(SoldOutLease {
                    remaining: Duration::from_millis(250),
                    generation: Generation::from_stored(3).expect("generation"),
                    holds: 1000
                })
            })
        );
        assert!(
            parse_reserve(&arr(vec![
                Value::Int(0),
                Value::Int(0),
                Value::Int(0),
                s("3"),
                s("1000")
            ]))
            .is_err(),
            "a lease with no time left is no lease"
        );
        assert_eq!(
            parse_reserve(&arr(vec![Value::Int(-1)])).ok(),
            Some(Reserve::NotLoaded)
        );
        assert_eq!(
            parse_reserve(&arr(vec![Value::Int(-3)])).ok(),
            Some(Reserve::NotRebuilt)
        );
        assert_eq!(
            parse_reserve(&arr(vec![Value::Int(-2)])).ok(),
            Some(Reserve::LimitExceeded { unseen: false })
        );
        assert_eq!(
            parse_reserve(&arr(vec![Value::Int(-2), Value::Int(1)])).ok(),
            Some(Reserve::LimitExceeded { unseen: true })
        );
        let big = i64::MAX.to_string();
        let existing = parse_reserve(&arr(vec![
            Value::Int(2),
            s("9"),
            s(&big),
            s("3"),
            Value::Int(1),
            s("2"),
        ]));
        match existing {
            Ok(Reserve::Existing(h)) => {
                assert_eq!(h.hold, HoldRef::from_stored(2, 9).expect("hold"));
                assert_eq!(h.user_id.get(), i64::MAX);
                assert_eq!(h.quantity.get(), 3);
                assert!(h.released);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(parse_reserve(&Value::Int(1)).is_err());
        assert!(parse_reserve(&arr(vec![Value::Int(5)])).is_err());
        assert!(parse_reserve(&arr(vec![Value::Int(2), s("x")])).is_err());
        assert!(
            parse_reserve(&arr(vec![Value::Int(1), Value::Int(0), s("3")])).is_err(),
            "hold id 0 names no hold"
        );
    }
}
