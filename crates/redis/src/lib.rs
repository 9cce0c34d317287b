//! The stock gate on Redis.
//!
//! Keys of one product share a hash tag, `{p:<id>}`, so every script touches one slot and
//! runs unchanged on Redis Cluster ([`Target::Cluster`]):
//!
//! | key                              | type   | holds                                      |
//! |----------------------------------|--------|--------------------------------------------|
//! | `<prefix>{p:<id>}:inv`           | hash   | `avail` units, `seq` last hold id, `gen` generation, `srv` stamp (`run_id:master_replid`, `lua/stamp.lua`) of the Redis process that loaded, rebuilt or adopted it, `lease` end of the sold-out lease (ms) |
//! | `<prefix>{p:<id>}:users`         | hash   | user id → units held (limited products)    |
//! | `<prefix>{p:<id>}:r:<request_id>`| hash   | one hold: user, quantity, state, hold id, generation |
//! | `<prefix>{p:<id>}:pending`       | zset   | request_ids of holds, scored by time (ms)  |
//! | `<prefix>{p:<id>}:restock:<id>`  | string | marker of an applied restock               |
//! | `<prefix>{p:<id>}:destock:<id>`  | string | a destock's outcome and generation, `<1 taken, 0 refused>:<generation>` |
//! | `<prefix>{p:<id>}:rel:<request_id>` | string | marker of a reservation's release (expires with the records) |
//! | `<prefix>{p:<id>}:lock`          | string | the redis-lock baseline's lock: its holder's random token, for the lease (benchmarks only) |
//!
//! Once a product's sale has ended and settled, the workers retire all of its keys
//! (`FLASHSALE_SALE_RETIRE_AFTER`, `app/src/after_sale.rs`): `retire_sale.lua` deletes
//! the entry, the per-user counts and the pending index while the entry is still of the
//! retired generation, then `retire_keys.lua` the keys a SCAN of the hash tag finds (of
//! a product loaded again since, only hold records of the retired generation or older).
//!
//! Two pub/sub channels, both heard by each instance's subscriber (`revoke.rs`):
//! `<prefix>lease:revoked`, where every script that adds units to a product ends its
//! sold-out lease and publishes `<product id>:<generation>` in the same atomic step; and
//! `<prefix>product:changed`, where an operator's change to a product's definition (a
//! pause) is announced as `<product id>` after the ledger committed it.
//!
//! Every script validates its arguments before its first write, and is idempotent on its
//! request or restock id: a client retry after a lost reply never takes or returns stock
//! twice. The hold record is written in the same atomic step as the decrement, so no
//! decrement is ever untraceable; the `pending` index lets recovery find holds without
//! scanning the keyspace. An attempt that takes nothing writes nothing, but for its
//! user's cell of the shared rate when that is on (`<prefix>{p:<id>}:rl:<user>`, a hash:
//! `t` the next attempt's theoretical arrival time in µs, `r` the request_id it last
//! admitted; see `reserve.lua`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

pub mod calls;
mod cluster;
mod reserve;
pub use reserve::RESERVE_BATCH_MAX;
pub mod revoke;
mod trim;

use async_trait::async_trait;

use calls::{Call, Cmd, Layout, Wire};
use flashsale_app::baseline::LockToken;
use flashsale_app::ports::ErrorKind;
use flashsale_app::ports::{
    Destock, GateCount, GateFacts, GateMaintenance, GateState, RebuildPlan, Release, ReleaseOf,
    Reserve, Restock, StaleHold, StockChange,
};
use flashsale_app::{GateError, StockGate};
use flashsale_core::{Generation, ProductId, PurchaseRequest, RequestId};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Script, Value};

/// Which Redis the gate runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One Redis, by URL (`redis://host:port/db`).
    Node(String),
    /// A Redis Cluster, by some of its nodes (`host:port` each): the client learns the
    /// rest, and every slot's primary, from them.
    Cluster(Vec<String>),
}

/// Connection settings of the gate.
#[derive(Debug, Clone)]
pub struct GateConfig {
    pub target: Target,
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
    /// Each user's purchase attempts of a product, limited by the reserve script itself
    /// so that the limit holds across every instance (`reserve.lua`); None: not here.
    pub shared_user_rate: Option<flashsale_app::limit::Rate>,
}

/// Reconnect attempts per failed connection before the call fails: a purchase must
/// answer 503 quickly when Redis is down rather than queue behind reconnects.
const RECONNECT_ATTEMPTS: usize = 1;

/// Most seed nodes a cluster is named by: a handful is enough to find the cluster when
/// some are down, and the client learns every other node from them.
pub const CLUSTER_SEEDS_MAX: usize = 64;
/// Retries of one call on a cluster after a redirection the client could not follow at
/// once (TRYAGAIN during a slot migration, CLUSTERDOWN or a lost connection during a
/// failover), with waits from [`CLUSTER_RETRY_WAIT_MIN_MS`] doubling up to
/// [`CLUSTER_RETRY_WAIT_MAX_MS`]: together about 1.5 s, below the response timeout, so a
/// purchase still answers (503) in time when the cluster does not settle; MOVED and ASK
/// are followed without a wait.
const CLUSTER_RETRIES: u32 = 6;
/// Shortest wait before a retry on a cluster (ms): a migrating slot's keys move in
/// milliseconds.
const CLUSTER_RETRY_WAIT_MIN_MS: u64 = 10;
/// Longest wait before a retry on a cluster (ms).
const CLUSTER_RETRY_WAIT_MAX_MS: u64 = 400;
/// How many times a script call is sent again after NOSCRIPT: the script is loaded (on a
/// cluster, on every node) and the call sent once more, but the slot may have moved to
/// a node that never had it in between (a replica promoted after a restart).
const NOSCRIPT_ATTEMPTS: usize = 3;

/// The connection to one Redis or to a cluster.
#[derive(Clone)]
enum Conn {
    Node(ConnectionManager),
    Cluster(redis::cluster_async::ClusterConnection),
}

/// The connection to the real Redis, with every script prepared (EVALSHA, loaded on
/// first use and again on NOSCRIPT; on a cluster, on every node).
pub(crate) struct RedisWire {
    conn: Conn,
    scripts: BTreeMap<&'static str, Script>,
}

impl RedisWire {
    /// Sends one command and reads its reply.
    async fn send(&self, cmd: &redis::Cmd) -> redis::RedisResult<Value> {
        match self.conn.clone() {
            Conn::Node(mut conn) => cmd.query_async(&mut conn).await,
            Conn::Cluster(mut conn) => cmd.query_async(&mut conn).await,
        }
    }

    /// Loads `script` (`SCRIPT LOAD`; on a cluster, on every node).
    async fn load(&self, script: &Script) -> redis::RedisResult<String> {
        match self.conn.clone() {
            Conn::Node(mut conn) => script.load_async(&mut conn).await,
            Conn::Cluster(mut conn) => script.load_async(&mut conn).await,
        }
    }
}

#[async_trait]
impl Wire for RedisWire {
    /// One `EVALSHA`, its keys and arguments written straight into the command's one
    /// buffer (redis-rs's `ScriptInvocation` keeps each in an allocation of its own,
    /// about nine an order). On NOSCRIPT (Redis restarted, failed over or flushed its
    /// scripts) the script is loaded and the call sent again.
    async fn eval(&self, call: &Call) -> Result<Value, GateError> {
        let script = self
            .scripts
            .get(call.script.name)
            .ok_or_else(|| GateError::config(format!("no script {}", call.script.name)))?;
        let bytes: usize = call.keys.iter().chain(&call.args).map(String::len).sum();
        let mut eval = redis::Cmd::with_capacity(3 + call.keys.len() + call.args.len(), bytes + 64);
        eval.arg("EVALSHA")
            .arg(script.get_hash())
            .arg(call.keys.len())
            .arg(&call.keys)
            .arg(&call.args);
        let mut loads = 0;
        loop {
            match self.send(&eval).await {
                Err(e)
                    if loads < NOSCRIPT_ATTEMPTS
                        && e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    loads += 1;
                    self.load(script).await.map_err(unavailable)?;
                }
                other => return other.map_err(unavailable),
            }
        }
    }

    async fn query(&self, at: &str, cmds: &[Cmd], atomic: bool) -> Result<Vec<Value>, GateError> {
        let mut pipe = redis::pipe();
        if atomic {
            pipe.atomic();
        }
        for Cmd(args) in cmds {
            let mut cmd = redis::Cmd::new();
            for arg in args {
                cmd.arg(arg);
            }
            pipe.add_command(cmd);
        }
        match self.conn.clone() {
            Conn::Node(mut conn) => pipe.query_async(&mut conn).await.map_err(unavailable),
            Conn::Cluster(mut conn) => {
                use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
                let node =
                    SingleNodeRoutingInfo::SpecificNode(Route::with_key(at, SlotAddr::Master));
                // The offsets `Pipeline::query_async` uses: a transaction's one reply is
                // EXEC's, after a QUEUED per command.
                let (offset, count) = if atomic {
                    (cmds.len() + 1, 1)
                } else {
                    (0, cmds.len())
                };
                let mut replies = conn
                    .route_pipeline(pipe, offset, count, node)
                    .await
                    .map_err(unavailable)?;
                if !atomic {
                    return Ok(replies);
                }
                match replies.pop() {
                    Some(Value::Array(items)) => Ok(items),
                    other => Err(GateError::corrupt(format!(
                        "redis: a transaction answered {other:?}"
                    ))),
                }
            }
        }
    }

    async fn peer_stamps(&self, at: &str) -> Result<Vec<String>, GateError> {
        let Conn::Cluster(conn) = &self.conn else {
            return Ok(Vec::new());
        };
        cluster::peer_stamps(conn.clone(), at).await
    }
}

pub struct RedisGate {
    /// The reservation batcher, started on the first purchase (inside the runtime).
    reserver: std::sync::OnceLock<flashsale_batch::Coalescer<calls::Item, calls::Reply>>,
    /// The early trims of committed holds, started on the first commit (inside the runtime).
    trimmer: std::sync::OnceLock<trim::Trimmer>,
    wire: Arc<RedisWire>,
    layout: Arc<Layout>,
}

/// A redis-rs error by what happened: no reply in time, the connection failed, a reply
/// of the wrong shape, a bad client setting, or an error Redis answered.
fn unavailable(e: redis::RedisError) -> GateError {
    use redis::ErrorKind as K;
    use redis::ServerErrorKind as S;
    let kind = match e.kind() {
        _ if e.is_timeout() => ErrorKind::TimedOut,
        K::Io => ErrorKind::Unreachable,
        // A cluster that could not settle within the retries: a slot migrating (its
        // keys split between two nodes), or no primary for the slot yet (a failover).
        // Neither ran the call.
        K::Server(S::TryAgain) => ErrorKind::NotReady,
        K::Server(S::ClusterDown | S::MasterDown | S::Moved | S::Ask) => ErrorKind::Unreachable,
        K::Parse | K::UnexpectedReturnType => ErrorKind::Corrupt,
        K::InvalidClientConfig => ErrorKind::Config,
        _ => ErrorKind::Rejected,
    };
    GateError::caused(kind, "redis", e)
}

impl RedisGate {
    /// Builds the gate without connecting: the first call connects, so the service starts
    /// (and reports not ready) while Redis is down.
    pub fn new(config: &GateConfig) -> Result<Self, GateError> {
        let conn = match &config.target {
            Target::Node(url) => {
                let client = redis::Client::open(url.as_str())
                    .map_err(|e| GateError::caused(ErrorKind::Config, "invalid redis url", e))?;
                let manager_config = ConnectionManagerConfig::new()
                    .set_response_timeout(Some(config.response_timeout))
                    .set_connection_timeout(Some(config.connect_timeout))
                    .set_number_of_retries(RECONNECT_ATTEMPTS);
                Conn::Node(
                    ConnectionManager::new_lazy_with_config(client, manager_config)
                        .map_err(unavailable)?,
                )
            }
            Target::Cluster(nodes) => {
                let client = redis::cluster::ClusterClientBuilder::new(
                    nodes.iter().map(|node| format!("redis://{node}/")),
                )
                .connection_timeout(config.connect_timeout)
                .response_timeout(config.response_timeout)
                .retries(CLUSTER_RETRIES)
                .min_retry_wait(CLUSTER_RETRY_WAIT_MIN_MS)
                .max_retry_wait(CLUSTER_RETRY_WAIT_MAX_MS)
                .build()
                .map_err(|e| GateError::caused(ErrorKind::Config, "invalid redis cluster", e))?;
                Conn::Cluster(
                    client.get_pending_async_connection_with_config(
                        redis::cluster::ClusterConfig::default()
                            .set_connection_timeout(config.connect_timeout)
                            .set_response_timeout(config.response_timeout),
                    ),
                )
            }
        };
        let scripts = calls::SCRIPTS
            .iter()
            .map(|lua| (lua.name, Script::new(lua.source)))
            .collect();
        Ok(Self {
            reserver: std::sync::OnceLock::new(),
            trimmer: std::sync::OnceLock::new(),
            wire: Arc::new(RedisWire { conn, scripts }),
            layout: Arc::new(
                Layout::new(&config.prefix, config.record_ttl, config.sold_out_lease)
                    .with_shared_user_rate(config.shared_user_rate),
            ),
        })
    }

    fn forget(&self) -> trim::Forget {
        trim::Forget {
            wire: self.wire.clone(),
            layout: self.layout.clone(),
        }
    }
}

#[async_trait]
impl StockGate for RedisGate {
    /// On a cluster, every primary must answer: one that does not serves slots no
    /// purchase of theirs can reach.
    async fn ping(&self) -> Result<(), GateError> {
        match self.wire.conn.clone() {
            Conn::Node(mut conn) => redis::cmd("PING")
                .query_async::<String>(&mut conn)
                .await
                .map(drop)
                .map_err(unavailable),
            Conn::Cluster(mut conn) => {
                use redis::cluster_routing::{
                    MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo,
                };
                let all = RoutingInfo::MultiNode((
                    MultipleNodeRoutingInfo::AllMasters,
                    Some(ResponsePolicy::AllSucceeded),
                ));
                conn.route_command(redis::cmd("PING"), all)
                    .await
                    .map(drop)
                    .map_err(unavailable)
            }
        }
    }

    async fn load(
        &self,
        product_id: ProductId,
        available: i64,
        generation: Generation,
    ) -> Result<bool, GateError> {
        self.layout
            .load(self.wire.as_ref(), product_id, available, generation)
            .await
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
                wire: self.wire.clone(),
                layout: self.layout.clone(),
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
        self.layout
            .release(self.wire.as_ref(), product_id, request_id, of)
            .await
    }

    async fn restock(&self, change: &StockChange) -> Result<Restock, GateError> {
        self.layout.restock(self.wire.as_ref(), change).await
    }

    async fn destock(&self, change: &StockChange) -> Result<Destock, GateError> {
        self.layout.destock(self.wire.as_ref(), change).await
    }

    async fn available(&self, product_id: ProductId) -> Result<Option<i64>, GateError> {
        self.layout.available(self.wire.as_ref(), product_id).await
    }

    async fn pending_request_ids(
        &self,
        product_id: ProductId,
        max: usize,
    ) -> Result<Option<(Generation, Vec<RequestId>)>, GateError> {
        self.layout
            .pending_request_ids(self.wire.as_ref(), product_id, max)
            .await
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
        self.layout
            .stale_holds(self.wire.as_ref(), product_id, older_than, limit)
            .await
    }

    async fn forget_pending(
        &self,
        product_id: ProductId,
        holds: &[StaleHold],
    ) -> Result<(), GateError> {
        self.layout
            .forget(self.wire.as_ref(), product_id, holds)
            .await
            .map(drop)
    }

    async fn facts(&self, product_id: ProductId) -> Result<GateFacts, GateError> {
        self.layout.facts(self.wire.as_ref(), product_id).await
    }

    async fn adjust(
        &self,
        product_id: ProductId,
        from: &GateCount,
        delta: i64,
    ) -> Result<bool, GateError> {
        self.layout
            .adjust(self.wire.as_ref(), product_id, from, delta)
            .await
    }

    async fn state(&self, product_id: ProductId) -> Result<Option<GateState>, GateError> {
        self.layout.state(self.wire.as_ref(), product_id).await
    }

    async fn rebuild(&self, product_id: ProductId, plan: &RebuildPlan) -> Result<bool, GateError> {
        self.layout
            .rebuild(self.wire.as_ref(), product_id, plan)
            .await
    }

    async fn retire(&self, product_id: ProductId) -> Result<bool, GateError> {
        self.layout.retire(self.wire.as_ref(), product_id).await
    }

    async fn adopt(&self, product_id: ProductId) -> Result<bool, GateError> {
        self.layout.adopt(self.wire.as_ref(), product_id).await
    }
}

#[async_trait]
impl flashsale_app::Announcer for RedisGate {
    async fn announce_change(&self, product_id: ProductId) -> Result<(), GateError> {
        self.layout
            .announce_change(self.wire.as_ref(), product_id)
            .await
    }
}

#[async_trait]
impl flashsale_app::SaleRetirementGate for RedisGate {
    async fn retire_sale(
        &self,
        product_id: ProductId,
        generation: Generation,
    ) -> Result<flashsale_app::after_sale::GateRetired, GateError> {
        let (entry_deleted, keys_deleted) = self
            .layout
            .retire_sale(self.wire.as_ref(), product_id, generation)
            .await?;
        Ok(flashsale_app::after_sale::GateRetired {
            entry_deleted,
            keys_deleted,
        })
    }
}

#[async_trait]
impl flashsale_app::baseline::BaselineGate for RedisGate {
    async fn seed_decrement(&self, product_id: ProductId, quantity: u32) -> Result<i64, GateError> {
        self.layout
            .seed_decrement(self.wire.as_ref(), product_id, quantity)
            .await
    }

    async fn try_lock(
        &self,
        product_id: ProductId,
        lease: Duration,
    ) -> Result<Option<LockToken>, GateError> {
        // 128 random bits: no two holders, of any instance, ever share a token, so a
        // holder whose lease ran out cannot release its successor's lock.
        let token = format!("{:032x}", rand::random::<u128>());
        let set = self
            .layout
            .try_lock(self.wire.as_ref(), product_id, &token, lease)
            .await?;
        Ok(set.then_some(LockToken(token)))
    }

    async fn unlock(&self, product_id: ProductId, token: &LockToken) -> Result<bool, GateError> {
        self.layout
            .unlock(self.wire.as_ref(), product_id, &token.0)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use calls::{parse_reserve, parse_reserve_batch};
    use flashsale_app::ports::SoldOutLease;
    use flashsale_core::HoldRef;

    // Checks that every reply shape of the reserve script maps to its outcome, that ids
    // above 2^53 survive (they travel as decimal text), that a batch's replies are read
    // in order and counted, and that malformed replies are errors, never a guessed
    // outcome.
    #[test]
    fn reserve_replies() {
        assert_eq!(
            parse_reserve("1,7,3").ok(),
            Some(Reserve::Reserved {
                hold: HoldRef::from_stored(3, 7).expect("hold")
            })
        );
        assert_eq!(
            parse_reserve("0").ok(),
            Some(Reserve::SoldOut {
                unseen: false,
                lease: None
            })
        );
        assert_eq!(
            parse_reserve("0,1").ok(),
            Some(Reserve::SoldOut {
                unseen: true,
                lease: None
            })
        );
        assert_eq!(
            parse_reserve("0,0,250,3,1000").ok(),
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
            parse_reserve("0,0,0,3,1000").is_err(),
            "a lease with no time left is no lease"
        );
        assert_eq!(parse_reserve("-1").ok(), Some(Reserve::NotLoaded));
        assert_eq!(parse_reserve("-3").ok(), Some(Reserve::NotRebuilt));
        assert_eq!(
            parse_reserve("-2").ok(),
            Some(Reserve::LimitExceeded { unseen: false })
        );
        assert_eq!(
            parse_reserve("-2,1").ok(),
            Some(Reserve::LimitExceeded { unseen: true })
        );
        assert_eq!(
            parse_reserve("-4,120").ok(),
            Some(Reserve::RateLimited {
                retry_after: Duration::from_millis(120)
            })
        );
        let existing = parse_reserve(&format!("2,9,{},3,1,2", i64::MAX));
        match existing {
            Ok(Reserve::Existing(h)) => {
                assert_eq!(h.hold, HoldRef::from_stored(2, 9).expect("hold"));
                assert_eq!(h.user_id.get(), i64::MAX);
                assert_eq!(h.quantity.get(), 3);
                assert!(h.released);
            }
            other => panic!("unexpected {other:?}"),
        }
        for malformed in [
            "5",
            "2,x",
            "",
            "1,,3",
            "1,7,3,",
            "1,7,3,4,5,6,7",
            "1e3,7,3",
            "2,9,,3,1,2",
        ] {
            assert!(
                parse_reserve(malformed).is_err(),
                "{malformed:?} is not a reply"
            );
        }
        assert!(parse_reserve("1,0,3").is_err(), "hold id 0 names no hold");

        let bulk = |t: &str| Value::BulkString(t.as_bytes().to_vec());
        let batch = parse_reserve_batch(&bulk("1,7,3 0,1 2,x"), 3).expect("batch");
        assert_eq!(batch.len(), 3);
        assert_eq!(
            batch[0].as_ref().ok(),
            Some(&Reserve::Reserved {
                hold: HoldRef::from_stored(3, 7).expect("hold")
            })
        );
        assert_eq!(
            batch[1].as_ref().ok(),
            Some(&Reserve::SoldOut {
                unseen: true,
                lease: None
            })
        );
        assert!(
            batch[2].is_err(),
            "a malformed reply is its purchase's error"
        );
        assert!(
            parse_reserve_batch(&bulk("1,7,3 0,1"), 3).is_err(),
            "fewer replies than purchases"
        );
        assert!(
            parse_reserve_batch(&Value::Array(vec![bulk("1,7,3")]), 1).is_err(),
            "not one string"
        );
    }

    /// The gate's own wire, with a retry of `retry` sent through `gate` between the
    /// recovery scan's read of the records and its removal of the gone ones.
    struct RetryBeforeRemoval {
        inner: Arc<RedisWire>,
        gate: Arc<RedisGate>,
        retry: PurchaseRequest,
    }

    #[async_trait]
    impl Wire for RetryBeforeRemoval {
        async fn eval(&self, call: &Call) -> Result<Value, GateError> {
            self.inner.eval(call).await
        }
        async fn query(
            &self,
            at: &str,
            cmds: &[Cmd],
            atomic: bool,
        ) -> Result<Vec<Value>, GateError> {
            self.inner.query(at, cmds, atomic).await
        }
        async fn between(&self, what: &'static str) {
            if what == "stale_holds: zrem" {
                let retried = self.gate.reserve(&self.retry, None).await;
                assert!(
                    matches!(retried, Ok(Reserve::Reserved { .. })),
                    "the retry takes a new hold: {retried:?}"
                );
            }
        }
    }

    // Checks that the recovery scan takes out of the pending index only the entries whose
    // hold records are still gone (real Redis): two entries have outlived their records;
    // between the scan's read of the records and its removal, a client's retry of one of
    // them takes a new hold (which writes its record and its entry again). That entry
    // stays, beside its new record, so that recovery and the sold-out board's holders
    // still see the hold; the other entry goes. A plain ZREM of what the read found gone
    // took both out.
    #[tokio::test]
    async fn the_stale_scan_spares_a_hold_taken_meanwhile() {
        const URL: &str = "redis://127.0.0.1:6379";
        let prefix = flashsale_testkit::redis_prefix();
        let config = GateConfig {
            target: Target::Node(URL.to_owned()),
            prefix: prefix.clone(),
            record_ttl: Duration::from_secs(600),
            response_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            sold_out_lease: Duration::ZERO,
            shared_user_rate: None,
        };
        let gate = Arc::new(RedisGate::new(&config).expect("gate"));
        let product = ProductId::parse(1).expect("product");
        let generation = Generation::from_stored(1).expect("generation");
        gate.load(product, 10, generation).await.expect("load");
        let request = |id: &str| PurchaseRequest {
            request_id: RequestId::parse("request_id", id).expect("id"),
            user_id: flashsale_core::UserId::parse(7).expect("user"),
            product_id: product,
            quantity: flashsale_core::Quantity::from_stored(1).expect("quantity"),
        };
        let pending = gate.layout.key(product, "pending");
        let mut conn = redis::Client::open(URL)
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("redis");
        // Entries from long ago, their records expired.
        let _: () = redis::cmd("ZADD")
            .arg(&pending)
            .arg(0)
            .arg("R_retried")
            .arg(0)
            .arg("R_lost")
            .query_async(&mut conn)
            .await
            .expect("ZADD");
        let wire = RetryBeforeRemoval {
            inner: gate.wire.clone(),
            gate: gate.clone(),
            retry: request("R_retried"),
        };
        let stale = gate
            .layout
            .stale_holds(&wire, product, Duration::from_millis(1), 10)
            .await
            .expect("stale holds");
        assert!(stale.is_empty(), "both records were gone at the read");
        let score = |id: &'static str| {
            let mut conn = conn.clone();
            let pending = pending.clone();
            async move {
                redis::cmd("ZSCORE")
                    .arg(&pending)
                    .arg(id)
                    .query_async::<Option<f64>>(&mut conn)
                    .await
                    .expect("ZSCORE")
            }
        };
        assert!(
            score("R_retried").await.is_some_and(|s| s > 0.0),
            "the retried hold keeps its entry"
        );
        assert_eq!(score("R_lost").await, None, "the lost entry is gone");
        let record: bool = redis::cmd("EXISTS")
            .arg(gate.layout.hold_key(product, "R_retried"))
            .query_async(&mut conn)
            .await
            .expect("EXISTS");
        assert!(record, "beside its new record");
        let _ = flashsale_testkit::delete_prefix(URL, &prefix).await;
    }
}
