//! Every call the gate makes to Redis, once, over any [`Wire`]: which script or commands
//! it sends, with which keys and arguments, and how each reply is read. [`crate::RedisGate`]
//! sends them to a real Redis; the simulator (`crates/sim`) runs the very same calls, and
//! the very same Lua text ([`Lua`]), on its in-memory Redis. So the two cannot drift: a
//! change to a script, to its arguments or to the reading of its reply reaches both.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use flashsale_app::ports::{
    Destock, ExistingHold, GateCount, GateFacts, GateState, RebuildPlan, Release, ReleaseOf,
    Reserve, Restock, SoldOutLease, StaleHold, StockChange,
};
use flashsale_app::GateError;
use flashsale_core::{
    Generation, HoldId, HoldRef, ProductId, PurchaseRequest, Quantity, RequestId, UserId,
};
use redis::{FromRedisValue, Value};

/// One of the gate's Lua scripts: its name (for errors) and its text, the bytes sent.
#[derive(Debug, PartialEq, Eq)]
pub struct Lua {
    pub name: &'static str,
    pub source: &'static str,
}

/// A script of `lua/` by name, after the preludes every script shares (`lua/stamp.lua`,
/// `lua/lifetime.lua`).
macro_rules! script {
    ($name:literal) => {
        Lua {
            name: $name,
            source: concat!(
                include_str!("lua/stamp.lua"),
                include_str!("lua/lifetime.lua"),
                include_str!(concat!("lua/", $name, ".lua"))
            ),
        }
    };
}

pub const RESERVE: Lua = script!("reserve");
pub const RELEASE: Lua = script!("release");
pub const RESTOCK: Lua = script!("restock");
pub const DESTOCK: Lua = script!("destock");
pub const LOAD: Lua = script!("load");
pub const ADJUST: Lua = script!("adjust");
pub const REBUILD: Lua = script!("rebuild");
pub const RETIRE: Lua = script!("retire");
pub const STATE: Lua = script!("state");
pub const FORGET: Lua = script!("forget");
pub const HOLDERS: Lua = script!("holders");
pub const SEED_DECREMENT: Lua = script!("seed_decrement");
pub const ADOPT: Lua = script!("adopt");
pub const UNLOCK: Lua = script!("unlock");
pub const RETIRE_SALE: Lua = script!("retire_sale");
pub const RETIRE_KEYS: Lua = script!("retire_keys");

/// Every script, for a wire that prepares them all at once.
pub const SCRIPTS: [&Lua; 16] = [
    &RESERVE,
    &RELEASE,
    &RESTOCK,
    &DESTOCK,
    &LOAD,
    &ADJUST,
    &REBUILD,
    &RETIRE,
    &STATE,
    &FORGET,
    &HOLDERS,
    &SEED_DECREMENT,
    &ADOPT,
    &UNLOCK,
    &RETIRE_SALE,
    &RETIRE_KEYS,
];

/// One script call: the script, its KEYS and its ARGV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub script: &'static Lua,
    pub keys: Vec<String>,
    pub args: Vec<String>,
}

/// One plain command: its name and arguments, as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cmd(pub Vec<String>);

impl Cmd {
    fn new(name: &str) -> Self {
        Self(vec![name.to_owned()])
    }

    fn arg(mut self, arg: impl ToString) -> Self {
        self.0.push(arg.to_string());
        self
    }
}

/// A connection to a Redis, real or simulated.
#[async_trait]
pub trait Wire: Send + Sync {
    /// Runs one script call; an error reply is an `Err`.
    async fn eval(&self, call: &Call) -> Result<Value, GateError>;
    /// Sends `cmds` in one round trip (a pipeline; MULTI/EXEC when `atomic`), one reply
    /// each, to the Redis that holds key `at` (on a cluster, the primary of its slot:
    /// the commands are about one product, and TIME and SCAN name no key of their own).
    async fn query(&self, at: &str, cmds: &[Cmd], atomic: bool) -> Result<Vec<Value>, GateError>;
    /// The stamps (`lua/stamp.lua`) of the healthy primaries other than the one holding
    /// key `at`, as that primary sees the cluster: a stock entry stamped by one of them
    /// was migrated here whole (`Layout::adopt`). A single Redis has none.
    async fn peer_stamps(&self, _at: &str) -> Result<Vec<String>, GateError> {
        Ok(Vec::new())
    }
    /// Between two round trips of one operation (the simulator lets other work run here).
    async fn between(&self, _what: &'static str) {}
}

/// A purchase waiting for a reserve call, with its per-user limit.
pub type Item = (PurchaseRequest, Option<u32>);
/// A purchase's answer.
pub type Reply = Result<Reserve, GateError>;

/// The hold id and generation `forget.lua` is given for an entry that must leave the
/// pending index only while its record is gone: no hold has them (both start at 1).
const NO_HOLD: i64 = 0;

/// Keys one SCAN step asks for when collecting a product's hold records (the audit) or
/// its keys (a retired sale's, deleted a step's worth per script call).
const SCAN_COUNT: usize = 1000;
/// Most hold records an audit reads for one product; far above any product's live holds
/// (bounded by its stock), it stops a runaway scan on a corrupted keyspace.
const FACTS_HOLDS_MAX: usize = 5_000_000;

/// A parsed hold record: user, quantity, released, hold id, generation.
type Hold = (i64, i64, bool, i64, i64);

/// A hold record's fields as HMGET returns them: user, quantity, state, hold id,
/// generation.
type RawHold = (
    Option<i64>,
    Option<i64>,
    Option<String>,
    Option<i64>,
    Option<i64>,
);

/// One product call's purchases (their places in the batch) and its answers.
pub type ProductReplies = (Vec<usize>, Result<Vec<Reply>, GateError>);

/// A reply that is not what the script or command answers.
pub fn unexpected(script: &str, value: &Value) -> GateError {
    GateError::corrupt(format!("unexpected reply from {script} script: {value:?}"))
}

/// An error reply from Redis to a command or a script (a script's `error_reply`, a
/// refused argument): the call was refused.
pub fn refused(e: impl std::fmt::Display) -> GateError {
    GateError::rejected(format!("redis: {e}"))
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

/// A reply read as `T`, or the error naming what answered it.
fn typed<T: FromRedisValue>(what: &str, value: &Value) -> Result<T, GateError> {
    if let Value::ServerError(e) = value {
        return Err(refused(format!("{e:?}")));
    }
    redis::from_redis_value_ref(value).map_err(|_| unexpected(what, value))
}

/// The one reply a one-command round trip gets.
fn only(what: &str, replies: Vec<Value>) -> Result<Value, GateError> {
    let mut replies = replies.into_iter();
    match (replies.next(), replies.next()) {
        (Some(v), None) => Ok(v),
        _ => Err(GateError::corrupt(format!("{what}: not one reply"))),
    }
}

/// Most integers in one purchase's reply of `reserve.lua` (an existing hold's six).
const RESERVE_FIELDS_MAX: usize = 6;

/// Reads one purchase's reply of `reserve.lua`: its integers in decimal, joined by `,`.
pub fn parse_reserve(reply: &str) -> Result<Reserve, GateError> {
    let bad = || GateError::corrupt(format!("unexpected reply from reserve script: {reply:?}"));
    let mut fields = [0i64; RESERVE_FIELDS_MAX];
    let mut count = 0;
    for field in reply.split(',') {
        let slot = fields.get_mut(count).ok_or_else(bad)?;
        *slot = field.parse().map_err(|_| bad())?;
        count += 1;
    }
    Ok(match &fields[..count] {
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
        [-4, wait_ms] if *wait_ms >= 0 => Reserve::RateLimited {
            retry_after: Duration::from_millis(wait_ms.unsigned_abs()),
        },
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

/// Reads a batch's reply of `reserve.lua`: one string, the purchases' replies in order
/// joined by ` `. A malformed purchase's reply is that purchase's error; a reply of
/// another shape or count fails the whole batch.
pub fn parse_reserve_batch(reply: &Value, purchases: usize) -> Result<Vec<Reply>, GateError> {
    let bad = || unexpected("reserve", reply);
    let Value::BulkString(bytes) = reply else {
        return Err(bad());
    };
    let text = std::str::from_utf8(bytes).map_err(|_| bad())?;
    let replies: Vec<Reply> = text.split(' ').map(parse_reserve).collect();
    if replies.len() != purchases {
        return Err(bad());
    }
    Ok(replies)
}

/// A batch's purchases by product (ascending), each product's in batch order: one
/// `reserve.lua` call each.
pub fn split_by_product(batch: &[Item]) -> Vec<(ProductId, Vec<usize>)> {
    let mut by_product: BTreeMap<ProductId, Vec<usize>> = BTreeMap::new();
    for (i, (request, _)) in batch.iter().enumerate() {
        by_product.entry(request.product_id).or_default().push(i);
    }
    by_product.into_iter().collect()
}

/// Each purchase's answer in batch order, from each product call's answers (a failed
/// call answers each of its purchases with its error).
pub fn gather(len: usize, calls: Vec<ProductReplies>) -> Vec<Reply> {
    let mut out: Vec<Option<Reply>> = (0..len).map(|_| None).collect();
    for (members, replies) in calls {
        match replies {
            Ok(replies) => {
                // `parse_reserve_batch` refuses a reply of another count than the call's.
                debug_assert_eq!(
                    members.len(),
                    replies.len(),
                    "replies of one product's call"
                );
                for (i, reply) in members.into_iter().zip(replies) {
                    debug_assert!(i < len, "purchase {i} of a batch of {len}");
                    if let Some(slot) = out.get_mut(i) {
                        *slot = Some(reply);
                    }
                }
            }
            Err(e) => {
                for i in members {
                    if let Some(slot) = out.get_mut(i) {
                        *slot = Some(Err(e.clone()));
                    }
                }
            }
        }
    }
    out.into_iter()
        .map(|r| {
            // `split_by_product` puts every purchase of the batch in exactly one call.
            debug_assert!(r.is_some(), "a purchase of the batch in no product's call");
            r.unwrap_or_else(|| Err(GateError::corrupt("reserve: no reply for the purchase")))
        })
        .collect()
}

/// Where a deployment's keys live and the settings its scripts take.
#[derive(Debug, Clone)]
pub struct Layout {
    pub prefix: String,
    /// Where lease revocations are published ([`crate::revoke::channel`]).
    pub revocations: String,
    /// Where changed product definitions are announced ([`crate::revoke::changes`]).
    pub changes: String,
    pub record_ttl_ms: u64,
    pub sold_out_lease_ms: u64,
    /// The shared per-user rate as `reserve.lua` takes it: the interval between two
    /// attempts and the burst's tolerance, in µs; (0, 0) when off.
    pub user_rate_us: (u64, u64),
}

impl Layout {
    pub fn new(prefix: &str, record_ttl: Duration, sold_out_lease: Duration) -> Self {
        Self {
            prefix: prefix.to_owned(),
            revocations: crate::revoke::channel(prefix),
            changes: crate::revoke::changes(prefix),
            record_ttl_ms: u64::try_from(record_ttl.as_millis()).unwrap_or(u64::MAX),
            sold_out_lease_ms: u64::try_from(sold_out_lease.as_millis()).unwrap_or(u64::MAX),
            user_rate_us: (0, 0),
        }
    }

    /// With each user's attempts of a product limited to `rate` by the reserve script
    /// (None, or a rate of zero: no such limit).
    pub fn with_shared_user_rate(mut self, rate: Option<flashsale_app::limit::Rate>) -> Self {
        self.user_rate_us = match rate {
            Some(rate) if rate.per_second > 0 => {
                let interval = 1_000_000_u64.div_ceil(u64::from(rate.per_second));
                (interval, interval * u64::from(rate.burst.max(1) - 1))
            }
            _ => (0, 0),
        };
        self
    }

    /// A key of one product, as the table in the crate's documentation lays them out.
    pub fn key(&self, product_id: ProductId, suffix: &str) -> String {
        self.key_of(product_id, &[suffix])
    }

    /// [`Self::key`] with its suffix in parts, joined as they are written in: built by
    /// pushes, not `format!`, as a hold's key is made once per purchase and once per trim,
    /// and `format!` twice cost about 2,300 instructions a key.
    fn key_of(&self, product_id: ProductId, suffix: &[&str]) -> String {
        use std::fmt::Write;
        // `{p:` + up to 19 digits + `}:`.
        const FIXED_MAX: usize = 24;
        let parts: usize = suffix.iter().map(|part| part.len()).sum();
        let mut key = String::with_capacity(self.prefix.len() + FIXED_MAX + parts);
        key.push_str(&self.prefix);
        key.push_str("{p:");
        // Writing an integer into a String cannot fail.
        let _ = write!(key, "{}", product_id.get());
        key.push_str("}:");
        for part in suffix {
            key.push_str(part);
        }
        key
    }

    pub(crate) fn hold_key(&self, product_id: ProductId, request_id: &str) -> String {
        self.key_of(product_id, &["r:", request_id])
    }

    pub async fn load(
        &self,
        w: &dyn Wire,
        product_id: ProductId,
        available: i64,
        generation: Generation,
    ) -> Result<bool, GateError> {
        let call = Call {
            script: &LOAD,
            keys: vec![self.key(product_id, "inv")],
            args: vec![
                available.to_string(),
                generation.get().to_string(),
                self.record_ttl_ms.to_string(),
                // Only a first load vouches for the records (`fresh`): a product loaded
                // again after its sale was retired lost the records of its earlier life.
                u8::from(generation == Generation::FIRST).to_string(),
            ],
        };
        let reply = w.eval(&call).await?;
        Ok(typed::<i64>("load", &reply)? == 1)
    }

    /// One `reserve.lua` call for purchases of one product, in order.
    pub fn reserve_call(&self, product_id: ProductId, purchases: &[&Item]) -> Call {
        let mut keys = vec![
            self.key(product_id, "inv"),
            self.key(product_id, "users"),
            self.key(product_id, "pending"),
        ];
        let (interval_us, tolerance_us) = self.user_rate_us;
        let mut args = vec![
            self.record_ttl_ms.to_string(),
            self.sold_out_lease_ms.to_string(),
            interval_us.to_string(),
            tolerance_us.to_string(),
        ];
        for (request, limit) in purchases {
            keys.push(self.hold_key(product_id, request.request_id.as_str()));
            args.push(request.quantity.get().to_string());
            args.push(request.user_id.get().to_string());
            args.push(limit.unwrap_or(0).to_string());
            args.push(request.request_id.as_str().to_owned());
        }
        if interval_us > 0 {
            for (request, _) in purchases {
                keys.push(self.key(product_id, &format!("rl:{}", request.user_id.get())));
            }
        }
        Call {
            script: &RESERVE,
            keys,
            args,
        }
    }

    /// A batch of purchases: one script call per product, sent together; each purchase
    /// answered in the batch's order.
    pub async fn reserve_batch(&self, w: &dyn Wire, batch: &[Item]) -> Vec<Reply> {
        let calls = split_by_product(batch)
            .into_iter()
            .map(|(product_id, members)| async move {
                let purchases: Vec<&Item> = members.iter().filter_map(|&i| batch.get(i)).collect();
                let call = self.reserve_call(product_id, &purchases);
                let replies = match w.eval(&call).await {
                    Ok(reply) => parse_reserve_batch(&reply, members.len()),
                    Err(e) => Err(e),
                };
                (members, replies)
            });
        gather(batch.len(), futures::future::join_all(calls).await)
    }

    pub async fn release(
        &self,
        w: &dyn Wire,
        product_id: ProductId,
        request_id: &RequestId,
        of: &ReleaseOf,
    ) -> Result<Release, GateError> {
        // The script takes integers; 0 stands for "no release generation" (a hold the
        // ledger never counted) and for "no user".
        let (generation, hold, user, quantity, limited, returns_units) = match of {
            ReleaseOf::Hold { hold } => (0, *hold, 0, 0, false, true),
            ReleaseOf::Reservation {
                generation,
                hold,
                user_id,
                quantity,
                limited,
                returns_units,
            } => (
                generation.get(),
                *hold,
                user_id.get(),
                quantity.get(),
                *limited,
                *returns_units,
            ),
        };
        let call = Call {
            script: &RELEASE,
            keys: vec![
                self.key(product_id, "inv"),
                self.key(product_id, "users"),
                self.hold_key(product_id, request_id.as_str()),
                self.key(product_id, "pending"),
                self.key_of(product_id, &["rel:", request_id.as_str()]),
            ],
            args: vec![
                request_id.as_str().to_owned(),
                generation.to_string(),
                user.to_string(),
                quantity.to_string(),
                u8::from(limited).to_string(),
                self.record_ttl_ms.to_string(),
                hold.id.get().to_string(),
                hold.generation.get().to_string(),
                self.revocations.clone(),
                product_id.get().to_string(),
                u8::from(returns_units).to_string(),
            ],
        };
        let reply = w.eval(&call).await?;
        match typed::<i64>("release", &reply)? {
            1 => Ok(Release::Released),
            0 => Ok(Release::AlreadyReleased),
            -1 => Ok(Release::Missing),
            -2 => Ok(Release::NotLoaded),
            _ => Err(unexpected("release", &reply)),
        }
    }

    pub async fn restock(&self, w: &dyn Wire, change: &StockChange) -> Result<Restock, GateError> {
        let product_id = change.product_id;
        let call = Call {
            script: &RESTOCK,
            keys: vec![
                self.key(product_id, "inv"),
                self.key(product_id, &format!("restock:{}", change.id)),
            ],
            args: vec![
                change.quantity.to_string(),
                change.generation.get().to_string(),
                self.revocations.clone(),
                product_id.get().to_string(),
            ],
        };
        let reply = w.eval(&call).await?;
        match typed::<i64>("restock", &reply)? {
            1 => Ok(Restock::Applied),
            0 => Ok(Restock::AlreadyApplied),
            -1 => Ok(Restock::NotLoaded),
            -3 => Ok(Restock::Stale),
            _ => Err(unexpected("restock", &reply)),
        }
    }

    /// Takes `quantity` available units off sale once per destock id (`destock.lua`).
    pub async fn destock(&self, w: &dyn Wire, change: &StockChange) -> Result<Destock, GateError> {
        let product_id = change.product_id;
        let call = Call {
            script: &DESTOCK,
            keys: vec![
                self.key(product_id, "inv"),
                self.key(product_id, &format!("destock:{}", change.id)),
            ],
            args: vec![
                change.quantity.to_string(),
                change.generation.get().to_string(),
            ],
        };
        let reply = w.eval(&call).await?;
        match typed::<i64>("destock", &reply)? {
            1 => Ok(Destock::Taken),
            0 => Ok(Destock::Refused),
            -1 => Ok(Destock::NotLoaded),
            -3 => Ok(Destock::Stale),
            _ => Err(unexpected("destock", &reply)),
        }
    }

    /// Publishes that `product_id`'s definition changed, for every instance's
    /// subscriber (`revoke.rs`). On a cluster any node takes it: a cluster passes every
    /// PUBLISH to all its nodes.
    pub async fn announce_change(
        &self,
        w: &dyn Wire,
        product_id: ProductId,
    ) -> Result<(), GateError> {
        let publish = Cmd::new("PUBLISH")
            .arg(&self.changes)
            .arg(product_id.get().to_string());
        only("PUBLISH", w.query(&self.changes, &[publish], false).await?).map(drop)
    }

    pub async fn available(
        &self,
        w: &dyn Wire,
        product_id: ProductId,
    ) -> Result<Option<i64>, GateError> {
        let get = Cmd::new("HGET")
            .arg(self.key(product_id, "inv"))
            .arg("avail");
        let reply = only(
            "HGET",
            w.query(&self.key(product_id, "inv"), &[get], false).await?,
        )?;
        typed("HGET", &reply)
    }

    pub async fn pending_request_ids(
        &self,
        w: &dyn Wire,
        product_id: ProductId,
        max: usize,
    ) -> Result<Option<(Generation, Vec<RequestId>)>, GateError> {
        let call = Call {
            script: &HOLDERS,
            keys: vec![self.key(product_id, "inv"), self.key(product_id, "pending")],
            args: vec![max.to_string()],
        };
        let reply = w.eval(&call).await?;
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
                        .and_then(|id| RequestId::stored("request_id", id).ok())
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

    /// Reads hold records (user, quantity, state, hold id, generation) for request_ids,
    /// in one round trip; None where the record is gone.
    async fn holds(
        &self,
        w: &dyn Wire,
        product_id: ProductId,
        request_ids: &[String],
    ) -> Result<Vec<Option<Hold>>, GateError> {
        if request_ids.is_empty() {
            return Ok(Vec::new());
        }
        let cmds: Vec<Cmd> = request_ids
            .iter()
            .map(|request_id| {
                Cmd::new("HMGET")
                    .arg(self.hold_key(product_id, request_id))
                    .arg("u")
                    .arg("q")
                    .arg("s")
                    .arg("h")
                    .arg("g")
            })
            .collect();
        let rows = w.query(&self.key(product_id, "inv"), &cmds, false).await?;
        if rows.len() != request_ids.len() {
            return Err(GateError::corrupt("HMGET: not one reply per record"));
        }
        rows.iter()
            .map(|row| {
                let fields: RawHold = typed("HMGET", row)?;
                Ok(match fields {
                    (Some(u), Some(q), Some(s), Some(h), g) => {
                        Some((u, q, s == "r", h, g.unwrap_or(1)))
                    }
                    _ => None,
                })
            })
            .collect()
    }

    pub async fn stale_holds(
        &self,
        w: &dyn Wire,
        product_id: ProductId,
        older_than: Duration,
        limit: usize,
    ) -> Result<Vec<StaleHold>, GateError> {
        let pending = self.key(product_id, "pending");
        // Holds are aged on Redis's clock, the one that stamped them.
        let time = only("TIME", w.query(&pending, &[Cmd::new("TIME")], false).await?)?;
        let (secs, micros): (i64, i64) = typed("TIME", &time)?;
        let older_than_ms = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
        let taken_before_ms = (secs * 1000 + micros / 1000).saturating_sub(older_than_ms);
        w.between("stale_holds: zrangebyscore").await;
        let range = Cmd::new("ZRANGEBYSCORE")
            .arg(&pending)
            .arg("-inf")
            .arg(format!("({taken_before_ms}"))
            .arg("LIMIT")
            .arg(0)
            .arg(limit);
        let ids: Vec<String> = typed(
            "ZRANGEBYSCORE",
            &only("ZRANGEBYSCORE", w.query(&pending, &[range], false).await?)?,
        )?;
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        w.between("stale_holds: records").await;
        let records = self.holds(w, product_id, &ids).await?;
        let mut stale = Vec::new();
        let mut gone = Vec::new();
        for (request_id, record) in ids.into_iter().zip(records) {
            let parsed = record.and_then(|(u, q, released, hold_id, generation)| {
                Some(StaleHold {
                    request: PurchaseRequest {
                        request_id: RequestId::stored("request_id", &request_id).ok()?,
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
            w.between("stale_holds: zrem").await;
            // Each only while its record is still gone: a client's retry may have taken a
            // new hold under the request_id since the read, and its entry is what makes
            // recovery, and the sold-out board's holders, see that hold.
            let entries = gone.iter().map(|id| (id.as_str(), NO_HOLD, NO_HOLD));
            self.forget_entries(w, product_id, entries).await?;
        }
        Ok(stale)
    }

    /// Removes `holds` from the product's pending index, each only while its
    /// request_id's record is still that hold (`forget.lua`); how many it removed.
    pub async fn forget(
        &self,
        w: &dyn Wire,
        product_id: ProductId,
        holds: &[StaleHold],
    ) -> Result<i64, GateError> {
        let entries = holds.iter().map(|hold| {
            (
                hold.request.request_id.as_str(),
                hold.hold.id.get(),
                hold.hold.generation.get(),
            )
        });
        self.forget_entries(w, product_id, entries).await
    }

    /// `forget.lua` over `(request_id, hold id, generation)` entries: each leaves the
    /// pending index only while its record is that hold or is gone; with [`NO_HOLD`]
    /// (which no hold has), only while it is gone.
    async fn forget_entries<'a>(
        &self,
        w: &dyn Wire,
        product_id: ProductId,
        entries: impl ExactSizeIterator<Item = (&'a str, i64, i64)>,
    ) -> Result<i64, GateError> {
        if entries.len() == 0 {
            return Ok(0);
        }
        let mut keys = vec![self.key(product_id, "pending")];
        let mut args = Vec::with_capacity(entries.len() * 3);
        for (request_id, hold_id, generation) in entries {
            keys.push(self.hold_key(product_id, request_id));
            args.push(request_id.to_owned());
            args.push(hold_id.to_string());
            args.push(generation.to_string());
        }
        let call = Call {
            script: &FORGET,
            keys,
            args,
        };
        typed("forget", &w.eval(&call).await?)
    }

    /// Deletes a retired sale's state (`retire_sale.lua`), then every other key under
    /// its hash tag, a SCAN step's keys at a time (`retire_keys.lua`), all on the
    /// product's node. Answers whether the entry went (false: loaded again in a newer
    /// generation, kept) and how many keys were deleted.
    pub async fn retire_sale(
        &self,
        w: &dyn Wire,
        product_id: ProductId,
        generation: Generation,
    ) -> Result<(bool, u64), GateError> {
        let inv = self.key(product_id, "inv");
        let call = Call {
            script: &RETIRE_SALE,
            keys: vec![
                inv.clone(),
                self.key(product_id, "users"),
                self.key(product_id, "pending"),
            ],
            args: vec![generation.get().to_string()],
        };
        let entry_deleted = typed::<i64>("retire_sale", &w.eval(&call).await?)? == 1;
        let pattern = format!("{}*", self.key(product_id, ""));
        let mut deleted = 0;
        let mut cursor: u64 = 0;
        loop {
            w.between("retire: scan").await;
            let scan = Cmd::new("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT);
            let (next, found): (u64, Vec<String>) =
                typed("SCAN", &only("SCAN", w.query(&inv, &[scan], false).await?)?)?;
            if !found.is_empty() {
                let mut keys = Vec::with_capacity(found.len() + 1);
                keys.push(inv.clone());
                keys.extend(found);
                let call = Call {
                    script: &RETIRE_KEYS,
                    keys,
                    args: vec![generation.get().to_string()],
                };
                let n: i64 = typed("retire_keys", &w.eval(&call).await?)?;
                deleted += n.unsigned_abs();
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        Ok((entry_deleted, deleted))
    }

    pub async fn facts(&self, w: &dyn Wire, product_id: ProductId) -> Result<GateFacts, GateError> {
        // One atomic look (MULTI/EXEC) at the count, the last hold id and the pending
        // index, with Redis's clock to age the holds on: every hold the count has taken
        // is either in the index or has reached the ledger, and one taken after the look
        // has a higher id. The records are read after it. Every round trip goes to the
        // product's node (`marker` is one of its keys): on a cluster, SCAN lists only
        // the keys of the node it is sent to.
        let marker = self.key(product_id, "r:");
        let look = [
            Cmd::new("HMGET")
                .arg(self.key(product_id, "inv"))
                .arg("avail")
                .arg("seq")
                .arg("gen"),
            Cmd::new("ZRANGE")
                .arg(self.key(product_id, "pending"))
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES"),
            Cmd::new("TIME"),
        ];
        let replies = w.query(&marker, &look, true).await?;
        let [inv, index, time] = replies.as_slice() else {
            return Err(GateError::corrupt("facts: not three replies"));
        };
        let inv: Vec<Option<i64>> = typed("HMGET", inv)?;
        let index: Vec<(String, f64)> = typed("ZRANGE", index)?;
        let (secs, micros): (i64, i64) = typed("TIME", time)?;
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
        let mut request_ids = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            w.between("facts: scan").await;
            let scan = Cmd::new("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(format!("{marker}*"))
                .arg("COUNT")
                .arg(SCAN_COUNT);
            let (next, keys): (u64, Vec<String>) = typed(
                "SCAN",
                &only("SCAN", w.query(&marker, &[scan], false).await?)?,
            )?;
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
            w.between("facts: records").await;
            let records = self.holds(w, product_id, chunk).await?;
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

    pub async fn adjust(
        &self,
        w: &dyn Wire,
        product_id: ProductId,
        from: &GateCount,
        delta: i64,
    ) -> Result<bool, GateError> {
        let call = Call {
            script: &ADJUST,
            keys: vec![self.key(product_id, "inv")],
            args: vec![
                delta.to_string(),
                self.revocations.clone(),
                product_id.get().to_string(),
                from.available.to_string(),
                from.generation.get().to_string(),
                from.last_hold_id.to_string(),
            ],
        };
        Ok(typed::<i64>("adjust", &w.eval(&call).await?)? == 1)
    }

    pub async fn state(
        &self,
        w: &dyn Wire,
        product_id: ProductId,
    ) -> Result<Option<GateState>, GateError> {
        Ok(self
            .entry(w, product_id)
            .await?
            .map(|(state, _writer)| state))
    }

    /// The stock entry as `state.lua` reads it, with the stamp of the process that wrote
    /// it when that is another one (`Some`, possibly empty for an entry with none).
    async fn entry(
        &self,
        w: &dyn Wire,
        product_id: ProductId,
    ) -> Result<Option<(GateState, Option<String>)>, GateError> {
        let call = Call {
            script: &STATE,
            keys: vec![self.key(product_id, "inv")],
            args: Vec::new(),
        };
        let reply = w.eval(&call).await?;
        let bad = || unexpected("state", &reply);
        let Value::Array(items) = &reply else {
            return Err(bad());
        };
        if items.is_empty() {
            return Ok(None);
        }
        let [available, last_hold_id, generation, changed, writer] = items.as_slice() else {
            return Err(bad());
        };
        let number = |v: &Value| int(v).ok_or_else(bad);
        let changed = number(changed)? == 1;
        let state = GateState {
            available: number(available)?,
            generation: Generation::from_stored(number(generation)?).ok_or_else(bad)?,
            last_hold_id: number(last_hold_id)?,
            server_changed: changed,
        };
        let writer = match (changed, writer) {
            (false, _) => None,
            (true, Value::BulkString(bytes)) => {
                Some(String::from_utf8(bytes.clone()).map_err(|_| bad())?)
            }
            (true, _) => return Err(bad()),
        };
        Ok(Some((state, writer)))
    }

    /// Takes over a stock entry another Redis process wrote if it arrived whole: its
    /// writer is still a healthy primary with the very stamp it wrote (the slot was
    /// migrated here; a failover or a restart changes the writer's stamp, or takes it
    /// out of the healthy primaries). Whether the entry is this process's now.
    pub async fn adopt(&self, w: &dyn Wire, product_id: ProductId) -> Result<bool, GateError> {
        let inv = self.key(product_id, "inv");
        let writer = match self.entry(w, product_id).await? {
            None => return Ok(false),
            Some((_, None)) => return Ok(true),
            Some((_, Some(writer))) if writer.is_empty() => return Ok(false),
            Some((_, Some(writer))) => writer,
        };
        w.between("adopt: peers").await;
        if !w.peer_stamps(&inv).await?.contains(&writer) {
            return Ok(false);
        }
        w.between("adopt: take over").await;
        let call = Call {
            script: &ADOPT,
            keys: vec![inv],
            args: vec![writer],
        };
        Ok(typed::<i64>("adopt", &w.eval(&call).await?)? == 1)
    }

    pub async fn rebuild(
        &self,
        w: &dyn Wire,
        product_id: ProductId,
        plan: &RebuildPlan,
    ) -> Result<bool, GateError> {
        let mut args = vec![
            plan.generation.get().to_string(),
            plan.available.to_string(),
            plan.last_hold_id.to_string(),
            self.revocations.clone(),
            product_id.get().to_string(),
        ];
        for (user, units) in &plan.user_units {
            args.push(user.get().to_string());
            args.push(units.to_string());
        }
        let call = Call {
            script: &REBUILD,
            keys: vec![
                self.key(product_id, "inv"),
                self.key(product_id, "users"),
                self.key(product_id, "pending"),
            ],
            args,
        };
        Ok(typed::<i64>("rebuild", &w.eval(&call).await?)? == 1)
    }

    pub async fn retire(&self, w: &dyn Wire, product_id: ProductId) -> Result<bool, GateError> {
        let call = Call {
            script: &RETIRE,
            keys: vec![self.key(product_id, "inv")],
            args: vec![self.revocations.clone(), product_id.get().to_string()],
        };
        Ok(typed::<i64>("retire", &w.eval(&call).await?)? == 1)
    }

    pub async fn seed_decrement(
        &self,
        w: &dyn Wire,
        product_id: ProductId,
        quantity: u32,
    ) -> Result<i64, GateError> {
        let call = Call {
            script: &SEED_DECREMENT,
            keys: vec![self.key(product_id, "inv")],
            args: vec![quantity.to_string()],
        };
        typed("seed_decrement", &w.eval(&call).await?)
    }

    /// redis-lock's lock of a product: its hash tag's slot, so it lives beside the
    /// product's other keys on a cluster, under the deployment's prefix.
    fn lock_key(&self, product_id: ProductId) -> String {
        self.key(product_id, "lock")
    }

    /// One try at the product's lock: `SET <lock> <token> NX PX <lease>`; true if set.
    pub async fn try_lock(
        &self,
        w: &dyn Wire,
        product_id: ProductId,
        token: &str,
        lease: Duration,
    ) -> Result<bool, GateError> {
        let key = self.lock_key(product_id);
        let lease_ms = lease.as_millis().max(1);
        let set = Cmd::new("SET")
            .arg(&key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(lease_ms);
        match only("lock", w.query(&key, &[set], false).await?)? {
            Value::Okay => Ok(true),
            Value::Nil => Ok(false),
            Value::ServerError(e) => Err(refused(format!("{e:?}"))),
            other => Err(unexpected("lock", &other)),
        }
    }

    /// Deletes the product's lock only while it holds `token` (`unlock.lua`).
    pub async fn unlock(
        &self,
        w: &dyn Wire,
        product_id: ProductId,
        token: &str,
    ) -> Result<bool, GateError> {
        let call = Call {
            script: &UNLOCK,
            keys: vec![self.lock_key(product_id)],
            args: vec![token.to_owned()],
        };
        Ok(typed::<i64>("unlock", &w.eval(&call).await?)? == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hold's key is its product's key with the suffix `r:<request_id>`, as the crate's
    /// key table lays it out, for the smallest and the largest product ids; and both are
    /// the table's text exactly.
    #[test]
    fn a_hold_key_is_the_product_key_of_its_record() {
        let layout = Layout::new("fs:", Duration::from_secs(1), Duration::from_secs(1));
        for raw in [1, 42, i64::MAX] {
            let product_id = ProductId::parse(raw).expect("positive");
            for request_id in ["a", "REQ_0001:x.y-z", &"q".repeat(64)] {
                assert_eq!(
                    layout.hold_key(product_id, request_id),
                    layout.key(product_id, &format!("r:{request_id}"))
                );
            }
        }
        let product_id = ProductId::parse(7).expect("positive");
        assert_eq!(layout.hold_key(product_id, "R1"), "fs:{p:7}:r:R1");
        assert_eq!(layout.key(product_id, "inv"), "fs:{p:7}:inv");
        let largest = ProductId::parse(i64::MAX).expect("positive");
        assert_eq!(
            layout.hold_key(largest, "R1"),
            "fs:{p:9223372036854775807}:r:R1"
        );
    }
}
