//! `MemGate`: the Redis stock gate in memory, with the semantics of the Lua scripts in
//! `crates/redis/src/lua/` and of `RedisGate`'s plain commands (`crates/redis/src/lib.rs`).
//!
//! Each script is one method body that runs without yielding, as a script runs
//! atomically in Redis. Operations that take several round trips in `RedisGate` (the
//! recovery scan, the audit's facts) yield between them, so other work interleaves there
//! as it does against a real Redis. Hold records expire after the record retention on
//! Redis's own clock (the sim's true time); nothing else expires.
//!
//! Keys of one product (see the key table in `crates/redis/src/lib.rs`):
//! `inv` {avail, seq, gen} → [`Inv`]; `users` → `users`; `r:<request_id>` → `records`;
//! `pending` (zset) → `pending`; `restock:<id>` → `restocks`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, Utc};
use flashsale_app::ports::{
    ExistingHold, GateFacts, GateMaintenance, GateState, LeaseListener, RebuildPlan, Release,
    ReleaseOf, Reserve, Restock, SoldOutLease, StaleHold,
};
use flashsale_app::{GateError, StockGate};
use flashsale_core::{
    Generation, HoldId, HoldRef, ProductId, PurchaseRequest, Quantity, RequestId, UserId,
};

use crate::ctx::{Ctx, Point};

/// Deliberate defects, to prove the simulator catches what they break.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GateDefects {
    /// `reserve` skips its `avail < q` check, so the count can go below zero.
    pub reserve_below_zero: bool,
}

/// The inventory hash. It exists only with `avail` (every script checks `avail` first).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Inv {
    avail: i64,
    /// `seq`: the last hold id handed out (absent = 0).
    seq: Option<i64>,
    /// `gen`: the stock generation (absent = 1, as the scripts read it).
    gen: Option<i64>,
    /// `srv`: the run id of the Redis process that loaded or rebuilt it.
    srv: Option<u64>,
    /// `fresh`: until when (ms, Redis's clock) every hold record of the product still
    /// exists; set by load, brought forward by a shorter record lifetime, absent after a
    /// rebuild.
    fresh: Option<i64>,
    /// `loaded`: when load wrote the entry (ms, Redis's clock).
    loaded: Option<i64>,
    /// `lease`: until when (ms, Redis's clock) no hold is granted (the sold-out lease).
    lease: Option<i64>,
}

/// A hold record `r:<request_id>`. Fields are optional where a script may write a record
/// without them (release.lua's record of a lost hold has no `h` or `c`); the time it
/// was taken is kept only in the `pending` index, as in reserve.lua.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HoldRec {
    u: i64,
    q: i64,
    /// `s`: 'h' (held) or 'r' (released).
    released: bool,
    h: Option<i64>,
    /// `c`: whether the per-user count includes it.
    counted: bool,
    /// `g`: the generation it was taken in (absent = 1).
    g: Option<i64>,
    /// When Redis drops it (PEXPIRE), on Redis's clock, in ms.
    expires_ms: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Keys {
    inv: Option<Inv>,
    users: BTreeMap<i64, i64>,
    records: BTreeMap<String, HoldRec>,
    /// The `pending` zset: member → score (ms).
    pending: BTreeMap<String, i64>,
    restocks: BTreeSet<String>,
    /// `rel:<request_id>` markers: request_id → expiry (ms).
    release_markers: BTreeMap<String, i64>,
}

impl Keys {
    /// The live record of a request: an expired one is dropped first, as Redis would.
    fn record(&mut self, request_id: &str, now_ms: i64) -> Option<&mut HoldRec> {
        if self
            .records
            .get(request_id)
            .is_some_and(|r| r.expires_ms <= now_ms)
        {
            self.records.remove(request_id);
        }
        self.records.get_mut(request_id)
    }

    /// `HMGET r:<id> u q s h g` as `RedisGate::holds` parses it: None unless u, q, s and
    /// h are all there.
    fn hold_fields(&mut self, request_id: &str, now_ms: i64) -> Option<(i64, i64, bool, i64, i64)> {
        let r = self.record(request_id, now_ms)?;
        Some((r.u, r.q, r.released, r.h?, r.g.unwrap_or(1)))
    }
}

/// The whole keyspace the gate uses: product id → its keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GateSnapshot {
    products: BTreeMap<i64, Keys>,
}

pub struct MemGate {
    ctx: Arc<Ctx>,
    record_ttl: TimeDelta,
    /// The sold-out lease reserve.lua grants (ms; 0 = none).
    sold_out_lease_ms: i64,
    defects: GateDefects,
    store: Mutex<GateSnapshot>,
    /// The run id of the "Redis process": a new one after every wipe or failover, as a
    /// restarted or promoted Redis has.
    server: AtomicU64,
    /// Each instance's subscription to lease revocations, by instance index. Delivery is
    /// modelled as instant; a wipe or failover breaks every subscription (the instance
    /// hears nothing in between) and the instance subscribes again at once.
    listeners: Mutex<Vec<(usize, Arc<dyn LeaseListener>)>>,
}

fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

fn bad_reply(script: &str, what: &str) -> GateError {
    GateError::corrupt(format!("unexpected reply from {script} script: {what}"))
}

impl MemGate {
    /// `forget.lua`: drops holds from the pending index, each only while its request_id's
    /// record is still that hold (or is gone).
    fn forget_now(&self, product_id: ProductId, holds: &[StaleHold]) {
        let redis_now = self.now_ms();
        let mut store = self.lock();
        let keys = store.products.entry(product_id.get()).or_default();
        for hold in holds {
            let rid = hold.request.request_id.as_str();
            let same = keys.record(rid, redis_now).is_none_or(|r| {
                r.h == Some(hold.hold.id.get()) && r.g.unwrap_or(1) == hold.hold.generation.get()
            });
            if same {
                keys.pending.remove(rid);
            }
        }
    }

    pub fn new(
        ctx: Arc<Ctx>,
        record_ttl: TimeDelta,
        sold_out_lease: TimeDelta,
        defects: GateDefects,
    ) -> Self {
        Self {
            ctx,
            record_ttl,
            sold_out_lease_ms: sold_out_lease.num_milliseconds().max(0),
            defects,
            store: Mutex::new(GateSnapshot::default()),
            server: AtomicU64::new(1),
            listeners: Mutex::new(Vec::new()),
        }
    }

    /// Instance `instance` (a new process of it, replacing any before) subscribes to
    /// lease revocations.
    pub fn listen(&self, instance: usize, listener: Arc<dyn LeaseListener>) {
        let mut listeners = self.listeners.lock().unwrap_or_else(|p| p.into_inner());
        listeners.retain(|(i, _)| *i != instance);
        listener.listening();
        listeners.push((instance, listener));
    }

    /// PUBLISH of a revocation (release.lua, restock.lua, adjust.lua, rebuild.lua).
    fn revoke(&self, product_id: ProductId) {
        let listeners = self.listeners.lock().unwrap_or_else(|p| p.into_inner());
        for (_, listener) in listeners.iter() {
            listener.revoked(Some(product_id));
        }
    }

    /// The Redis process changed: every subscription broke and is made again.
    fn resubscribe(&self) {
        let listeners = self.listeners.lock().unwrap_or_else(|p| p.into_inner());
        for (_, listener) in listeners.iter() {
            listener.deaf();
            listener.listening();
        }
    }

    fn lock(&self) -> MutexGuard<'_, GateSnapshot> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now_ms(&self) -> i64 {
        ms(self.ctx.gate_now())
    }

    /// Between two round trips of one operation: other work may run here.
    async fn round_trip(&self, what: &str) {
        self.ctx.maybe_kill(what);
        Point::new().await;
    }

    /// Redis restarts empty: every key is gone.
    pub fn wipe(&self) {
        self.lock().products.clear();
        self.server.fetch_add(1, Ordering::Relaxed);
        self.resubscribe();
    }

    fn server(&self) -> u64 {
        self.server.load(Ordering::Relaxed)
    }

    /// A copy of the keyspace, to come back to after a failover that loses later writes.
    pub fn snapshot(&self) -> GateSnapshot {
        self.lock().clone()
    }

    /// A failover to a replica that had only `snapshot`: later writes are lost.
    pub fn restore(&self, snapshot: GateSnapshot) {
        *self.lock() = snapshot;
        self.server.fetch_add(1, Ordering::Relaxed);
        self.resubscribe();
    }

    /// The available count (for the online checks; no fault, no yield).
    pub fn peek_available(&self, product_id: i64) -> Option<i64> {
        self.lock()
            .products
            .get(&product_id)
            .and_then(|k| k.inv.as_ref().map(|i| i.avail))
    }

    /// `GateMaintenance::facts` in one atomic look (for the final checks of a quiet run).
    pub fn peek_facts(&self, product_id: i64) -> GateFacts {
        let now = self.now_ms();
        let mut store = self.lock();
        let keys = store.products.entry(product_id).or_default();
        let generation = keys.inv.as_ref().map_or(0, |i| i.gen.unwrap_or(1));
        GateFacts {
            available: keys.inv.as_ref().map(|i| i.avail),
            generation: Generation::from_stored(generation),
            last_hold_id: keys.inv.as_ref().and_then(|i| i.seq).unwrap_or(0),
            held: held(keys, generation, now).expect("the sim's gate hands out hold ids from 1"),
            pending: aged(&keys.pending, now),
        }
    }
}

/// The pending index with each hold's age at `now_ms`, as `RedisGate::facts` reads it.
fn aged(pending: &BTreeMap<String, i64>, now_ms: i64) -> BTreeMap<String, Duration> {
    pending
        .iter()
        .map(|(rid, taken)| {
            let age = u64::try_from(now_ms - taken).unwrap_or(0);
            (rid.clone(), Duration::from_millis(age))
        })
        .collect()
}

/// Records holding units in the gate's current generation (as `RedisGate::facts` reads
/// them).
fn held(
    keys: &mut Keys,
    generation: i64,
    now_ms: i64,
) -> Result<BTreeMap<String, (HoldId, i64)>, GateError> {
    let ids: Vec<String> = keys.records.keys().cloned().collect();
    let mut held = BTreeMap::new();
    for id in ids {
        if let Some((_, q, false, hold_id, g)) = keys.hold_fields(&id, now_ms) {
            if g == generation {
                let hold_id = HoldId::from_stored(hold_id).ok_or_else(|| {
                    GateError::corrupt(format!("hold record of {id} has hold id {hold_id}"))
                })?;
                held.insert(id, (hold_id, q));
            }
        }
    }
    Ok(held)
}

#[async_trait]
impl StockGate for MemGate {
    /// The Redis adapter trims a moment later; here at once (the script re-checks the
    /// record either way).
    fn committed(&self, product_id: ProductId, hold: StaleHold) {
        self.forget_now(product_id, &[hold]);
    }

    async fn ping(&self) -> Result<(), GateError> {
        Ok(())
    }

    /// load.lua
    async fn load(
        &self,
        product_id: ProductId,
        available: i64,
        generation: Generation,
    ) -> Result<bool, GateError> {
        let generation = generation.get();
        if available < 0 || generation < 1 {
            return Err(GateError::rejected("ERR flashsale load: invalid arguments"));
        }
        let mut store = self.lock();
        let keys = store.products.entry(product_id.get()).or_default();
        if keys.inv.is_some() {
            return Ok(false);
        }
        let loaded = self.now_ms();
        keys.inv = Some(Inv {
            avail: available,
            seq: Some(0),
            gen: Some(generation),
            srv: Some(self.server()),
            fresh: Some(loaded + self.record_ttl.num_milliseconds()),
            loaded: Some(loaded),
            lease: None,
        });
        Ok(true)
    }

    /// reserve.lua
    async fn reserve(
        &self,
        request: &PurchaseRequest,
        per_user_limit: Option<u32>,
    ) -> Result<Reserve, GateError> {
        // The hold's time is Redis's own clock (TIME inside the script).
        let redis_now = self.now_ms();
        let ttl = self.record_ttl.num_milliseconds();
        let mut store = self.lock();
        let keys = store.products.entry(request.product_id.get()).or_default();
        let Some(inv) = keys.inv.clone() else {
            return Ok(Reserve::NotLoaded);
        };
        let gen = inv.gen.unwrap_or(1);
        let rid = request.request_id.as_str();
        let server = self.server.load(Ordering::Relaxed);
        // reserve.lua: an entry another Redis process wrote answers nothing until rebuilt.
        if inv.srv.is_some_and(|srv| srv != server) {
            return Ok(Reserve::NotRebuilt);
        }
        // reserve.lua's `unseen`: no record in any generation, and the entry vouches.
        let unseen = keys.record(rid, redis_now).is_none()
            && inv.fresh.is_some_and(|f| redis_now < f)
            && inv.srv == Some(server);
        if let Some(rec) = keys.record(rid, redis_now) {
            if rec.g.unwrap_or(1) == gen {
                // `{2, h, u, q, released, gen}`: a nil `h` ends the Lua array at `{2}`,
                // which `parse_reserve` refuses.
                let hold_id = rec.h.ok_or_else(|| bad_reply("reserve", "[2]"))?;
                return Ok(Reserve::Existing(ExistingHold {
                    hold: HoldRef::from_stored(gen, hold_id)
                        .ok_or_else(|| bad_reply("reserve", "hold"))?,
                    user_id: UserId::parse(rec.u).map_err(|_| bad_reply("reserve", "user"))?,
                    quantity: Quantity::from_stored(rec.q)
                        .ok_or_else(|| bad_reply("reserve", "quantity"))?,
                    released: rec.released,
                }));
            }
        }
        let q = i64::from(request.quantity.get());
        let limit = i64::from(per_user_limit.unwrap_or(0));
        if ttl < 1 || rid.is_empty() {
            return Err(GateError::rejected(
                "ERR flashsale reserve: invalid arguments",
            ));
        }
        let leased = inv.lease.filter(|&until| until > redis_now);
        if leased.is_some() || (inv.avail < q && !self.defects.reserve_below_zero) {
            let leased = match leased {
                None if inv.avail == 0 && self.sold_out_lease_ms > 0 => {
                    let until = redis_now + self.sold_out_lease_ms;
                    if let Some(inv) = keys.inv.as_mut() {
                        inv.lease = Some(until);
                    }
                    Some(until)
                }
                leased => leased,
            };
            return Ok(Reserve::SoldOut {
                unseen,
                lease: match leased {
                    None => None,
                    Some(until) => Some(SoldOutLease {
                        remaining: Duration::from_millis(
                            until.saturating_sub(redis_now).unsigned_abs(),
                        ),
                        generation: Generation::from_stored(gen)
                            .ok_or_else(|| bad_reply("reserve", "generation"))?,
                        holds: inv.seq.unwrap_or(0),
                    }),
                },
            });
        }
        let user = request.user_id.get();
        let mut counted = false;
        if limit > 0 {
            let held = keys.users.get(&user).copied().unwrap_or(0);
            if held + q > limit {
                return Ok(Reserve::LimitExceeded { unseen });
            }
            counted = true;
        }
        let hold = inv.seq.unwrap_or(0) + 1;
        keys.inv = Some(Inv {
            avail: inv.avail - q,
            seq: Some(hold),
            gen: inv.gen,
            srv: inv.srv,
            fresh: match (inv.fresh, inv.loaded) {
                (Some(f), Some(l)) => Some(f.min(l + ttl)),
                (Some(_), None) => Some(0),
                (None, _) => None,
            },
            loaded: inv.loaded,
            lease: inv.lease,
        });
        if counted {
            *keys.users.entry(user).or_insert(0) += q;
        }
        keys.records.insert(
            rid.to_owned(),
            HoldRec {
                u: user,
                q,
                released: false,
                h: Some(hold),
                counted,
                g: Some(gen),
                expires_ms: redis_now + ttl,
            },
        );
        keys.pending.insert(rid.to_owned(), redis_now);
        Ok(Reserve::Reserved {
            hold: HoldRef::from_stored(gen, hold).ok_or_else(|| bad_reply("reserve", "hold"))?,
        })
    }

    /// release.lua
    async fn release(
        &self,
        product_id: ProductId,
        request_id: &RequestId,
        of: &ReleaseOf,
    ) -> Result<Release, GateError> {
        let redis_now = self.now_ms();
        let ttl = self.record_ttl.num_milliseconds();
        // release.lua's integer arguments.
        let (relgen, hgen, hold) = match of {
            ReleaseOf::Hold { hold } => (0, hold.generation.get(), hold.id.get()),
            ReleaseOf::Reservation {
                generation, hold, ..
            } => (generation.get(), hold.generation.get(), hold.id.get()),
        };
        if relgen < 0 || ttl < 1 {
            return Err(GateError::rejected(
                "ERR flashsale release: invalid arguments",
            ));
        }
        let rid = request_id.as_str();
        let mut store = self.lock();
        let keys = store.products.entry(product_id.get()).or_default();
        let Some(inv) = keys.inv.clone() else {
            return Ok(Release::NotLoaded);
        };
        let gen = inv.gen.unwrap_or(1);
        let rec = keys.record(rid, redis_now).cloned();
        let mine = rec
            .as_ref()
            .is_some_and(|r| r.h == Some(hold) && r.g.unwrap_or(1) == hgen);
        let (user, q, counted) = match of {
            ReleaseOf::Hold { .. } => {
                if gen < hgen {
                    return Ok(Release::NotLoaded);
                }
                if gen > hgen {
                    if mine && rec.as_ref().is_some_and(|r| !r.released) {
                        if let Some(r) = keys.records.get_mut(rid) {
                            r.released = true;
                        }
                        keys.pending.remove(rid);
                    }
                    return Ok(Release::AlreadyReleased);
                }
                let Some(rec) = rec.as_ref().filter(|_| mine) else {
                    return Ok(Release::Missing);
                };
                if rec.released {
                    return Ok(Release::AlreadyReleased);
                }
                (rec.u, rec.q, rec.counted)
            }
            ReleaseOf::Reservation {
                user_id,
                quantity,
                limited,
                ..
            } => {
                if gen < relgen {
                    return Ok(Release::NotLoaded);
                }
                if keys
                    .release_markers
                    .get(rid)
                    .is_some_and(|e| *e <= redis_now)
                {
                    keys.release_markers.remove(rid);
                }
                if keys.release_markers.contains_key(rid) {
                    return Ok(Release::AlreadyReleased);
                }
                if mine && rec.as_ref().is_some_and(|r| r.released) {
                    return Ok(Release::AlreadyReleased);
                }
                if gen > relgen {
                    if mine {
                        if let Some(r) = keys.records.get_mut(rid) {
                            r.released = true;
                        }
                        keys.pending.remove(rid);
                    }
                    return Ok(Release::AlreadyReleased);
                }
                (user_id.get(), i64::from(quantity.get()), *limited)
            }
        };
        if q < 1 {
            return Err(GateError::rejected(
                "ERR flashsale release: corrupt hold record",
            ));
        }
        if let Some(i) = keys.inv.as_mut() {
            i.avail += q;
            if i.lease.take().is_some() {
                self.revoke(product_id);
            }
        }
        if counted {
            let left = keys.users.get(&user).copied().unwrap_or(0) - q;
            if left <= 0 {
                keys.users.remove(&user);
            } else {
                keys.users.insert(user, left);
            }
        }
        if mine {
            if let Some(r) = keys.records.get_mut(rid) {
                r.released = true;
            }
            keys.pending.remove(rid);
        }
        if relgen > 0 {
            keys.release_markers.insert(rid.to_owned(), redis_now + ttl);
        }
        Ok(Release::Released)
    }

    /// restock.lua
    async fn restock(
        &self,
        product_id: ProductId,
        restock_id: &RequestId,
        quantity: i64,
        generation: Generation,
    ) -> Result<Restock, GateError> {
        let generation = generation.get();
        if quantity < 1 {
            return Err(GateError::rejected(
                "ERR flashsale restock: invalid arguments",
            ));
        }
        let mut store = self.lock();
        let keys = store.products.entry(product_id.get()).or_default();
        if keys.restocks.contains(restock_id.as_str()) {
            return Ok(Restock::AlreadyApplied);
        }
        let Some(inv) = keys.inv.as_mut() else {
            return Ok(Restock::NotLoaded);
        };
        let current = inv.gen.unwrap_or(1);
        if current < generation {
            return Ok(Restock::NotLoaded);
        }
        if current > generation {
            return Ok(Restock::Stale);
        }
        inv.avail += quantity;
        if inv.lease.take().is_some() {
            self.revoke(product_id);
        }
        keys.restocks.insert(restock_id.as_str().to_owned());
        Ok(Restock::Applied)
    }

    async fn available(&self, product_id: ProductId) -> Result<Option<i64>, GateError> {
        Ok(self.peek_available(product_id.get()))
    }

    /// holders.lua
    async fn pending_request_ids(
        &self,
        product_id: ProductId,
        max: usize,
    ) -> Result<Option<(Generation, Vec<RequestId>)>, GateError> {
        let server = self.server();
        let store = self.lock();
        let Some((keys, inv)) = store
            .products
            .get(&product_id.get())
            .and_then(|keys| Some((keys, keys.inv.as_ref()?)))
        else {
            return Err(GateError::not_ready("stock missing from the stock gate"));
        };
        if inv.srv != Some(server) {
            return Err(GateError::not_ready(
                "the stock gate can't vouch for its pending holds",
            ));
        }
        if keys.pending.len() > max {
            return Ok(None);
        }
        keys.pending
            .keys()
            .map(|rid| {
                RequestId::parse("request_id", rid).map_err(|e| {
                    GateError::corrupt(format!("pending index holds a bad request_id: {e}"))
                })
            })
            .collect::<Result<_, _>>()
            .and_then(|ids| {
                let generation = Generation::from_stored(inv.gen.unwrap_or(1))
                    .ok_or_else(|| bad_reply("holders", "generation"))?;
                Ok(Some((generation, ids)))
            })
    }
}

#[async_trait]
impl GateMaintenance for MemGate {
    /// TIME, ZRANGEBYSCORE, then the records in one pipeline, then ZREM of the gone ones:
    /// separate round trips, with other work possible in between.
    async fn stale_holds(
        &self,
        product_id: ProductId,
        older_than: std::time::Duration,
        limit: usize,
    ) -> Result<Vec<StaleHold>, GateError> {
        let older_than_ms = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
        let before = self.now_ms().saturating_sub(older_than_ms);
        self.round_trip("stale_holds: zrangebyscore").await;
        let ids: Vec<String> = {
            let mut store = self.lock();
            let keys = store.products.entry(product_id.get()).or_default();
            let mut by_score: Vec<(i64, &String)> = keys
                .pending
                .iter()
                .filter(|(_, score)| **score < before)
                .map(|(id, score)| (*score, id))
                .collect();
            by_score.sort();
            by_score
                .into_iter()
                .take(limit)
                .map(|(_, id)| id.clone())
                .collect()
        };
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        self.round_trip("stale_holds: records").await;
        let now = self.now_ms();
        let mut stale = Vec::new();
        let mut gone = Vec::new();
        {
            let mut store = self.lock();
            let keys = store.products.entry(product_id.get()).or_default();
            for id in ids {
                let parsed = keys
                    .hold_fields(&id, now)
                    .and_then(|(u, q, released, h, g)| {
                        Some(StaleHold {
                            request: PurchaseRequest {
                                request_id: RequestId::parse("request_id", &id).ok()?,
                                user_id: UserId::parse(u).ok()?,
                                product_id,
                                quantity: Quantity::from_stored(q)?,
                            },
                            hold: HoldRef::from_stored(g, h)?,
                            released,
                        })
                    });
                match parsed {
                    Some(hold) => stale.push(hold),
                    None => gone.push(id),
                }
            }
        }
        if !gone.is_empty() {
            self.round_trip("stale_holds: zrem").await;
            let mut store = self.lock();
            let keys = store.products.entry(product_id.get()).or_default();
            for id in &gone {
                keys.pending.remove(id);
            }
        }
        Ok(stale)
    }

    /// forget.lua
    async fn forget_pending(
        &self,
        product_id: ProductId,
        holds: &[StaleHold],
    ) -> Result<(), GateError> {
        self.forget_now(product_id, holds);
        Ok(())
    }

    /// The state and the pending index in one step, then the records, as
    /// `RedisGate::facts` reads them.
    async fn facts(&self, product_id: ProductId) -> Result<GateFacts, GateError> {
        let (available, generation, last_hold_id, pending) = {
            let now = self.now_ms();
            let mut store = self.lock();
            let keys = store.products.entry(product_id.get()).or_default();
            let inv = keys.inv.as_ref();
            (
                inv.map(|i| i.avail),
                inv.map_or(0, |i| i.gen.unwrap_or(1)),
                inv.and_then(|i| i.seq).unwrap_or(0),
                aged(&keys.pending, now),
            )
        };
        self.round_trip("facts: records").await;
        let now = self.now_ms();
        let mut store = self.lock();
        let keys = store.products.entry(product_id.get()).or_default();
        Ok(GateFacts {
            available,
            generation: Generation::from_stored(generation),
            last_hold_id,
            held: held(keys, generation, now)?,
            pending,
        })
    }

    /// adjust.lua
    async fn adjust(&self, product_id: ProductId, delta: i64) -> Result<bool, GateError> {
        let mut store = self.lock();
        let keys = store.products.entry(product_id.get()).or_default();
        let Some(inv) = keys.inv.as_mut() else {
            return Ok(false);
        };
        if inv.avail + delta < 0 {
            return Ok(false);
        }
        inv.avail += delta;
        if delta > 0 && inv.lease.take().is_some() {
            self.revoke(product_id);
        }
        Ok(true)
    }

    async fn state(&self, product_id: ProductId) -> Result<Option<GateState>, GateError> {
        let server = self.server();
        let store = self.lock();
        Ok(store
            .products
            .get(&product_id.get())
            .and_then(|k| k.inv.as_ref())
            .map(|i| {
                Ok(GateState {
                    available: i.avail,
                    generation: Generation::from_stored(i.gen.unwrap_or(1))
                        .ok_or_else(|| bad_reply("state", "generation"))?,
                    last_hold_id: i.seq.unwrap_or(0),
                    server_changed: i.srv != Some(server),
                })
            })
            .transpose()?)
    }

    /// rebuild.lua
    async fn rebuild(&self, product_id: ProductId, plan: &RebuildPlan) -> Result<bool, GateError> {
        let generation = plan.generation.get();
        if generation < 1 || plan.available < 0 || plan.last_hold_id < 0 {
            return Err(GateError::rejected(
                "ERR flashsale rebuild: invalid arguments",
            ));
        }
        let server = self.server();
        let mut store = self.lock();
        let keys = store.products.entry(product_id.get()).or_default();
        let current = keys.inv.as_ref().and_then(|i| i.gen).unwrap_or(0);
        if current >= generation {
            return Ok(false);
        }
        keys.inv = Some(Inv {
            avail: plan.available,
            seq: Some(plan.last_hold_id),
            gen: Some(generation),
            srv: Some(server),
            fresh: None,
            loaded: None,
            // rebuild.lua: no lease, and the lost state's are revoked below.
            lease: None,
        });
        keys.users = plan
            .user_units
            .iter()
            .map(|(user, units)| (user.get(), *units))
            .collect();
        keys.pending.clear();
        drop(store);
        self.revoke(product_id);
        self.ctx.lock().stats.rebuilds += 1;
        Ok(true)
    }
}
