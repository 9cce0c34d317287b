//! `MemGate`: the Redis stock gate in memory — the Redis adapter's own calls
//! (`flashsale_redis::calls`: the same Lua scripts, keys, arguments and reply parsing as
//! `RedisGate`) sent to a [`MemRedis`] instead of a Redis server.
//!
//! A script runs atomically, as in Redis. Operations that take several round trips in
//! `RedisGate` (the recovery scan, the audit's facts) yield between them, so other work
//! interleaves there as it does against a real Redis. Reservations are batched as the
//! adapter batches them: per instance, the purchases that queue while a reserve call is
//! in flight go together in the next one, split by product by the adapter's own code;
//! which purchases share a call is decided by the scheduler, so by the seed. Lease
//! revocations the scripts PUBLISH reach every instance's listener at once; a wipe or a
//! failover breaks every subscription.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use chrono::TimeDelta;
use flashsale_app::ports::{
    Destock, GateCount, GateFacts, GateMaintenance, GateState, LeaseListener, RebuildPlan, Release,
    ReleaseOf, Reserve, Restock, StaleHold, StockChange,
};
use flashsale_app::{GateError, StockGate};
use flashsale_core::{Generation, ProductId, PurchaseRequest, RequestId};
use flashsale_redis::calls::{self, Call, Cmd, Item, Layout, Reply, Wire};
use flashsale_redis::RESERVE_BATCH_MAX;
use redis::Value;

use crate::ctx::{Ctx, Point};
use crate::exec::block_on;
use crate::memredis::{Keyspace, MemRedis, ScriptId};

/// The key prefix of the simulated deployment.
const PREFIX: &str = "sim:";
/// Polls an operation with no round trip in between may need (it never waits).
const INSTANT_POLLS_MAX: usize = 16;

/// Deliberate defects, planted in the scripts' text, to prove the simulator catches what
/// they break.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GateDefects {
    /// reserve.lua skips its `avail < q` check, so the count can go below zero.
    pub reserve_below_zero: bool,
    /// reserve.lua forgets the holds its batch granted so far, so a request_id twice in
    /// one batch takes units twice.
    pub batch_counts_twice: bool,
}

/// `reserve_below_zero`: the sold-out branch is taken only under a lease.
const AVAIL_CHECK: (&str, &str) = ("elseif leased or avail < q then", "elseif leased then");
/// `batch_counts_twice`: a request_id already granted in the batch is not looked up.
const SAME_IN_BATCH: (&str, &str) = ("local same = granted_key[KEYS[3 + i]]", "local same = nil");

/// `source` with `pattern` replaced; panics if the script no longer contains it, so an
/// edit to the script cannot silently disarm a defect.
fn plant(source: &str, (pattern, replacement): (&str, &str)) -> String {
    assert!(
        source.contains(pattern),
        "the planted defect's pattern {pattern:?} is no longer in the script"
    );
    source.replacen(pattern, replacement, 1)
}

/// The whole keyspace of the simulated Redis.
pub type GateSnapshot = Keyspace;

/// A purchase waiting for its reserve call, and where its answer goes.
type Waiting = (Item, Arc<Mutex<Option<Reply>>>);

/// One instance's reservation batcher: what queued, and whether a call is in flight
/// (`RESERVE_WORKERS` is one).
#[derive(Default)]
struct Batcher {
    waiting: VecDeque<Waiting>,
    busy: bool,
    /// Which process of the instance this is (its purchases die with it).
    process: u64,
}

pub struct MemGate {
    ctx: Arc<Ctx>,
    layout: Layout,
    redis: Mutex<MemRedis>,
    /// Each script's id in `redis` (the defects' texts in place of the originals).
    scripts: BTreeMap<&'static str, ScriptId>,
    /// Each instance's subscription to lease revocations, by instance index. Delivery is
    /// modelled as instant; a wipe or failover breaks every subscription (the instance
    /// hears nothing in between) and the instance subscribes again at once.
    listeners: Mutex<Vec<(usize, Arc<dyn LeaseListener>)>>,
    /// Reservation batchers, by instance.
    batchers: Mutex<BTreeMap<usize, Batcher>>,
    /// Each product's inventory key, for the check after every step.
    inv_keys: Mutex<BTreeMap<i64, Arc<str>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Single-threaded: a poisoned lock only means a panic is already unwinding.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The gate's connection to its [`MemRedis`]: with round trips that yield to the
/// scheduler, or none (the online checks, the final audit).
struct Conn<'a> {
    gate: &'a MemGate,
    yields: bool,
}

#[async_trait]
impl Wire for Conn<'_> {
    async fn eval(&self, call: &Call) -> Result<Value, GateError> {
        self.gate.eval(call)
    }

    async fn query(&self, _at: &str, cmds: &[Cmd], _atomic: bool) -> Result<Vec<Value>, GateError> {
        // One lock for the whole pipeline: nothing runs between its commands.
        let now = self.gate.now_ms();
        let redis = lock(&self.gate.redis);
        cmds.iter()
            .map(|Cmd(args)| redis.command(now, args).map_err(calls::refused))
            .collect()
    }

    async fn between(&self, what: &'static str) {
        if self.yields {
            self.gate.ctx.maybe_kill(what);
            Point::new().await;
        }
    }
}

/// Marks an instance's batcher free when its call ends — or when the caller driving it
/// is dropped, so another waiting purchase takes over.
struct Driving<'a> {
    gate: &'a MemGate,
    instance: usize,
    process: u64,
}

impl Drop for Driving<'_> {
    fn drop(&mut self) {
        if let Some(b) = lock(&self.gate.batchers).get_mut(&self.instance) {
            if b.process == self.process {
                b.busy = false;
            }
        }
    }
}

impl MemGate {
    #[allow(
        clippy::expect_used,
        reason = "the simulator's own setup: a failure is a broken build, not a run's outcome"
    )]
    pub fn new(
        ctx: Arc<Ctx>,
        record_ttl: TimeDelta,
        sold_out_lease: TimeDelta,
        defects: GateDefects,
    ) -> Self {
        let mut redis = MemRedis::new().expect("the simulated Redis's Lua starts");
        let mut scripts = BTreeMap::new();
        for lua in calls::SCRIPTS {
            let mut source = lua.source.to_owned();
            if lua == &calls::RESERVE {
                if defects.reserve_below_zero {
                    source = plant(&source, AVAIL_CHECK);
                }
                if defects.batch_counts_twice {
                    source = plant(&source, SAME_IN_BATCH);
                }
            }
            let id = redis
                .script_load(&source)
                .unwrap_or_else(|e| panic!("{}.lua compiles: {e}", lua.name));
            scripts.insert(lua.name, id);
        }
        let duration = |d: TimeDelta| d.to_std().unwrap_or_default();
        Self {
            ctx,
            layout: Layout::new(PREFIX, duration(record_ttl), duration(sold_out_lease)),
            redis: Mutex::new(redis),
            scripts,
            listeners: Mutex::new(Vec::new()),
            batchers: Mutex::new(BTreeMap::new()),
            inv_keys: Mutex::new(BTreeMap::new()),
        }
    }

    fn conn(&self) -> Conn<'_> {
        Conn {
            gate: self,
            yields: true,
        }
    }

    fn instant(&self) -> Conn<'_> {
        Conn {
            gate: self,
            yields: false,
        }
    }

    /// Redis's clock (ms).
    fn now_ms(&self) -> i64 {
        self.ctx.gate_now().timestamp_millis()
    }

    /// A script call, atomically; what it published is delivered before it returns.
    fn eval(&self, call: &Call) -> Result<Value, GateError> {
        let script = *self
            .scripts
            .get(call.script.name)
            .ok_or_else(|| GateError::config(format!("no script {}", call.script.name)))?;
        let (reply, published) =
            lock(&self.redis).eval(self.now_ms(), script, &call.keys, &call.args);
        for (channel, message) in published {
            if channel == self.layout.revocations.as_bytes() {
                let product_id = flashsale_redis::revoke::product_of(&message);
                for (_, listener) in lock(&self.listeners).iter() {
                    listener.revoked(product_id);
                }
            }
        }
        reply.map_err(calls::refused)
    }

    /// Instance `instance` (a new process of it, replacing any before) subscribes to
    /// lease revocations. The purchases its previous process had queued die with it.
    pub fn listen(&self, instance: usize, listener: Arc<dyn LeaseListener>) {
        {
            let mut batchers = lock(&self.batchers);
            let b = batchers.entry(instance).or_default();
            *b = Batcher {
                process: b.process + 1,
                ..Batcher::default()
            };
        }
        let mut listeners = lock(&self.listeners);
        listeners.retain(|(i, _)| *i != instance);
        listener.listening();
        listeners.push((instance, listener));
    }

    /// The Redis process changed: every subscription broke and is made again.
    fn resubscribe(&self) {
        for (_, listener) in lock(&self.listeners).iter() {
            listener.deaf();
            listener.listening();
        }
    }

    /// Redis restarts empty: every key is gone.
    pub fn wipe(&self) {
        lock(&self.redis).restart(Keyspace::default());
        self.resubscribe();
    }

    /// Moves a product's available count by `by` behind the service's back (a drift for
    /// reconciliation to find), down to 0 at most (a negative count is the I1 check's to
    /// find as an oversell, which a drift is not); nothing when it has no entry.
    pub fn bump_available(&self, product_id: i64, by: i64) {
        let Ok(product) = ProductId::parse(product_id) else {
            return;
        };
        let key = self.layout.key(product, "inv");
        if let Some(available) = self.peek_available(product_id) {
            let by = by.max(-available);
            let args = [
                "HINCRBY".to_owned(),
                key,
                "avail".to_owned(),
                by.to_string(),
            ];
            let _ = lock(&self.redis).command(self.now_ms(), &args);
        }
    }

    /// A copy of the keyspace, to come back to after a failover that loses later writes.
    pub fn snapshot(&self) -> GateSnapshot {
        lock(&self.redis).snapshot()
    }

    /// A failover to a replica that had only `snapshot`: later writes are lost.
    pub fn restore(&self, snapshot: GateSnapshot) {
        lock(&self.redis).restart(snapshot);
        self.resubscribe();
    }

    /// Runs an operation that never waits to its end.
    #[allow(
        clippy::expect_used,
        reason = "an operation with no round trip that waited is a simulator bug, loudly"
    )]
    fn now<T>(&self, fut: impl std::future::Future<Output = T>) -> T {
        block_on(fut, INSTANT_POLLS_MAX).expect("an operation without round trips never waits")
    }

    /// The available count (for the online checks; no fault, no yield).
    pub fn peek_available(&self, product_id: i64) -> Option<i64> {
        let key = {
            let mut keys = lock(&self.inv_keys);
            match keys.get(&product_id) {
                Some(key) => key.clone(),
                None => {
                    let key: Arc<str> = self
                        .layout
                        .key(ProductId::parse(product_id).ok()?, "inv")
                        .into();
                    keys.insert(product_id, key.clone());
                    key
                }
            }
        };
        let avail = lock(&self.redis).peek_hget(self.now_ms(), key.as_bytes(), b"avail")?;
        std::str::from_utf8(&avail).ok()?.parse().ok()
    }

    /// `GateMaintenance::facts` in one atomic look (for the final checks of a quiet run).
    #[allow(
        clippy::expect_used,
        reason = "the final checks read the run's products from the simulated Redis"
    )]
    pub fn peek_facts(&self, product_id: i64) -> GateFacts {
        let product_id = ProductId::parse(product_id).expect("a product id of the run");
        self.now(self.layout.facts(&self.instant(), product_id))
            .expect("the simulated Redis answers the audit's reads")
    }

    /// The instance the running request belongs to (its batcher).
    fn instance(&self) -> usize {
        self.ctx
            .lock()
            .current_req
            .as_ref()
            .map_or(usize::MAX, |r| r.instance)
    }

    /// Queues a purchase on its instance's batcher and waits for its answer. A waiting
    /// purchase that finds no call in flight sends one with everything queued (up to
    /// `RESERVE_BATCH_MAX`); the call travels (a yield point, where more purchases
    /// queue or the sender dies) before Redis runs it. A purchase whose caller is gone
    /// stays queued and is sent with a later batch, as the adapter's coalescer does.
    async fn reserve_batched(&self, item: Item) -> Reply {
        let instance = self.instance();
        let answer = Arc::new(Mutex::new(None));
        let mine = {
            let mut batchers = lock(&self.batchers);
            let b = batchers.entry(instance).or_default();
            b.waiting.push_back((item, answer.clone()));
            b.process
        };
        loop {
            if let Some(reply) = lock(&answer).take() {
                return reply;
            }
            let drive = {
                let mut batchers = lock(&self.batchers);
                let b = batchers.entry(instance).or_default();
                if b.process != mine {
                    return Err(GateError::stopped(
                        "reserve: the process that queued it is gone",
                    ));
                }
                (!std::mem::replace(&mut b.busy, true)).then_some(b.process)
            };
            let Some(process) = drive else {
                // A call is in flight: wait for it (bounded by the phase's steps).
                Point::new().await;
                continue;
            };
            let _driving = Driving {
                gate: self,
                instance,
                process,
            };
            self.conn().between("reserve: the batch's call").await;
            let batch: Vec<Waiting> = {
                let mut batchers = lock(&self.batchers);
                let b = batchers.entry(instance).or_default();
                let n = b.waiting.len().min(RESERVE_BATCH_MAX);
                b.waiting.drain(..n).collect()
            };
            let (items, answers): (Vec<Item>, Vec<_>) = batch.into_iter().unzip();
            if items.len() > 1 {
                self.ctx
                    .trace(|| format!("reserve: one call for a batch of {}", items.len()));
            }
            let replies = self.layout.reserve_batch(&self.instant(), &items).await;
            for (answer, reply) in answers.into_iter().zip(replies) {
                *lock(&answer) = Some(reply);
            }
        }
    }
}

#[async_trait]
impl StockGate for MemGate {
    /// The Redis adapter trims a moment later; here at once (the script re-checks the
    /// record either way).
    fn committed(&self, product_id: ProductId, hold: StaleHold) {
        // Best effort, as the adapter's trimmer: recovery trims what this misses.
        let _ = self.now(self.layout.forget(&self.instant(), product_id, &[hold]));
    }

    async fn ping(&self) -> Result<(), GateError> {
        Ok(())
    }

    async fn load(
        &self,
        product_id: ProductId,
        available: i64,
        generation: Generation,
    ) -> Result<bool, GateError> {
        self.layout
            .load(&self.conn(), product_id, available, generation)
            .await
    }

    async fn reserve(
        &self,
        request: &PurchaseRequest,
        per_user_limit: Option<u32>,
    ) -> Result<Reserve, GateError> {
        self.reserve_batched((request.clone(), per_user_limit))
            .await
    }

    async fn release(
        &self,
        product_id: ProductId,
        request_id: &RequestId,
        of: &ReleaseOf,
    ) -> Result<Release, GateError> {
        self.layout
            .release(&self.conn(), product_id, request_id, of)
            .await
    }

    async fn restock(&self, change: &StockChange) -> Result<Restock, GateError> {
        self.layout.restock(&self.conn(), change).await
    }

    async fn destock(&self, change: &StockChange) -> Result<Destock, GateError> {
        self.layout.destock(&self.conn(), change).await
    }

    async fn available(&self, product_id: ProductId) -> Result<Option<i64>, GateError> {
        self.layout.available(&self.conn(), product_id).await
    }

    async fn pending_request_ids(
        &self,
        product_id: ProductId,
        max: usize,
    ) -> Result<Option<(Generation, Vec<RequestId>)>, GateError> {
        self.layout
            .pending_request_ids(&self.conn(), product_id, max)
            .await
    }
}

#[async_trait]
impl GateMaintenance for MemGate {
    async fn stale_holds(
        &self,
        product_id: ProductId,
        older_than: std::time::Duration,
        limit: usize,
    ) -> Result<Vec<StaleHold>, GateError> {
        self.layout
            .stale_holds(&self.conn(), product_id, older_than, limit)
            .await
    }

    async fn forget_pending(
        &self,
        product_id: ProductId,
        holds: &[StaleHold],
    ) -> Result<(), GateError> {
        self.layout
            .forget(&self.conn(), product_id, holds)
            .await
            .map(drop)
    }

    async fn facts(&self, product_id: ProductId) -> Result<GateFacts, GateError> {
        self.layout.facts(&self.conn(), product_id).await
    }

    async fn adjust(
        &self,
        product_id: ProductId,
        from: &GateCount,
        delta: i64,
    ) -> Result<bool, GateError> {
        self.layout
            .adjust(&self.conn(), product_id, from, delta)
            .await
    }

    async fn state(&self, product_id: ProductId) -> Result<Option<GateState>, GateError> {
        self.layout.state(&self.conn(), product_id).await
    }

    async fn retire(&self, product_id: ProductId) -> Result<bool, GateError> {
        self.layout.retire(&self.conn(), product_id).await
    }

    async fn adopt(&self, product_id: ProductId) -> Result<bool, GateError> {
        self.layout.adopt(&self.conn(), product_id).await
    }

    async fn rebuild(&self, product_id: ProductId, plan: &RebuildPlan) -> Result<bool, GateError> {
        let rebuilt = self.layout.rebuild(&self.conn(), product_id, plan).await?;
        if rebuilt {
            self.ctx.lock().stats.rebuilds += 1;
        }
        Ok(rebuilt)
    }
}
