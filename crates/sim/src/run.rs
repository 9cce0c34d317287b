//! One simulated run, in phases:
//!
//! 1. **setup**: products are created through the service (faults on, crashes off);
//! 2. **sale**: clients buy (retrying `unavailable` and silence with the same
//!    request_id, with duplicates and conflicting copies), pay, cancel, pay late or race
//!    pay against cancel; an admin restocks; every instance runs expiry, recovery, the
//!    Redis watch (rebuild), reconciliation, the outbox relay, the statistics consumer
//!    and the fallback worker (products switch to ledger mode while Redis is down for
//!    it, and back once Redis has answered long enough). The seed fails calls, loses and
//!    duplicates replies, cuts stores off (Redis, in some seeds, for seconds: long
//!    enough to switch), abandons requests and passes between any two effects, crashes
//!    instances, restarts Redis empty or fails it over to a stale replica, and moves the
//!    clocks;
//! 3. **quiet**: faults stop, clocks agree, time moves past every payment deadline,
//!    recovery window and relay lease; admins still told `unavailable` retry; the
//!    workers run until a pass of each finds nothing to do; the products still in ledger
//!    mode are audited so;
//! 4. **way back**: the fallback workers hear Redis answer for `recover_after` and give
//!    every product in ledger mode back to the gate (rebuilt from the ledger's facts);
//!    the workers settle again;
//! 5. optionally **late replays**: past the hold records' retention, clients replay old
//!    requests, and the workers run again;
//! 6. **sweep**: fresh clients buy and pay every unit that can still be bought.
//!
//! Checked: I1 after every step (live order units ≤ stock, Redis count ≥ 0); the pure
//! audit (`flashsale_app::audit::check`: I1–I4, I6, I7's outbox half) after the sale,
//! the way back, the late replays and the sweep; I5 (every order a client was told about exists, with
//! its payload); I2 (one order per request_id in the ledger, one order per request_id in
//! the answers, and a replay that starts after its order committed gets it, never a
//! refusal); I3 (a paid / cancelled answer sticks, one terminal transition per
//! reservation); expiry never before the deadline on the database's clock; I6 (after the
//! sweep every unit is sold and paid, Redis at zero); I7 (every outbox event reached the
//! broker, first publications in order per request, the consumer applied each exactly
//! once and its statistics equal the events'); the per-user limit over live orders; the
//! restocked totals; and liveness (no phase runs forever, the quiet workers settle, no
//! `unavailable` in a quiet system).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use flashsale_app::audit;
use flashsale_app::fallback::REPORT_EVERY;
use flashsale_app::ports::{EventBus, Outbox, StatsStore};
use flashsale_app::ports::{GateFacts, GateMaintenance, LedgerMaintenance, StockGate};
use flashsale_app::{
    AdminAction, Clock, Consume, Error, Fallback, Flashsale, Ledger, Maintenance,
    MaintenanceSettings, Order, Ports, RecoveryReport, Relay, Repair, Settings, StatsDelta,
    REPAIR_UNITS_PER_PASS,
};
use flashsale_core::{
    AdminName, NewProduct, OrderId, OrderStatus, ProductId, PurchaseRequest, Quantity, RequestId,
    SaleWindow, UserId,
};

use crate::bus::MemBus;
use crate::ctx::{Ctx, FaultProfile, Point, Request, Sleep, Stats};
use crate::exec::{Executor, LocalFut};
use crate::faulty::{FaultyGate, FaultyLedger};
use crate::gate::{GateDefects, GateSnapshot, MemGate};
use crate::ledger::{LedgerDefects, MemLedger};
use crate::scenario::{Features, Intent, Scenario, Then, QUANTITY_MAX};

/// Steps one phase may take before the run is declared stuck: far above what a phase
/// needs (a few thousand), so only a livelock or an unbounded retry reaches it.
const PHASE_STEPS_MAX: u64 = 200_000;
/// Attempts of a client (purchase, pay, cancel, restock) before it gives up: clients
/// retry `unavailable` answers with the same request_id, as the API tells them to.
const CLIENT_ATTEMPTS_MAX: u32 = 12;
/// Longest pause between two attempts of a client, in yield points.
const RETRY_WAIT_MAX: u64 = 40;
/// Longest pause of a worker between passes, in yield points.
const WORKER_IDLE_MAX: u64 = 60;
/// Passes one worker runs at most while clients are active (the active phase ends when
/// the clients do; this only bounds a run whose clients never finish).
const WORKER_PASSES_MAX: u32 = 2_000;
/// Expiry + recovery passes the quiet phase runs before it calls the system unsettled.
const DRAIN_PASSES_MAX: u32 = 100;
/// The settle pause handed to reconciliation: none. A pause is wall time, which the
/// scheduler does not drive; the two looks are apart by every store call they make, at
/// each of which the other tasks run.
const RECONCILE_SETTLE: Duration = Duration::ZERO;
/// Longest pause of the reconciliation worker between passes, in steps: it runs about
/// once a simulated second (every minute in production; more often finds more).
const RECONCILE_IDLE_MAX: u64 = 300;

/// Messages the quiet phase's consumer handles per pass: more than a run ever makes
/// (a few events per order), so one pass catches up.
const DRAIN_CONSUME_MAX: usize = 10_000;
/// Purchases a sweep tries beyond the product's stock: the sweep ends at the first
/// sold-out answer; the extra attempts show units that should not be there.
const SWEEP_EXTRA: i64 = 3;
/// Attempts to create a product during setup before finishing it with faults off.
const SETUP_ATTEMPTS_MAX: u32 = 20;
/// Violations kept per run (the first ones tell the story).
const VIOLATIONS_MAX: usize = 30;
/// Requests of late replays: about half the intents, at most this many.
const LATE_REPLAYS_MAX: usize = 12;

/// Deliberately broken variants of the in-memory stores.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Defects {
    pub gate: GateDefects,
    pub ledger: LedgerDefects,
}

#[derive(Debug, Clone, Default)]
pub struct Options {
    pub seed: u64,
    /// Keep the last this many events of the run (0: no trace, faster; a failing seed is
    /// run again with one).
    pub trace: usize,
    pub defects: Defects,
    pub features: Features,
}

/// The result of one run.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub seed: u64,
    pub violations: Vec<String>,
    /// The last events (empty unless tracing).
    pub trace: Vec<String>,
    pub stats: Stats,
    pub scenario: String,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

fn start_time() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 29, 10, 0, 0)
        .single()
        .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
}

fn delta(d: Duration) -> TimeDelta {
    TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX)
}

/// An instance's clock: true time plus its own offset.
struct InstanceClock {
    ctx: Arc<Ctx>,
    instance: usize,
}

impl Clock for InstanceClock {
    fn now(&self) -> DateTime<Utc> {
        self.ctx.instance_now(self.instance)
    }

    /// True time (no offset, no jumps), as an instance's monotonic clock runs.
    fn monotonic(&self) -> Duration {
        (self.ctx.gate_now() - DateTime::<Utc>::UNIX_EPOCH)
            .to_std()
            .unwrap_or_default()
    }
}

struct Instance {
    service: Arc<Flashsale>,
    maint: Arc<Maintenance>,
    relay: Arc<Relay>,
    consume: Arc<Consume>,
    /// The fallback worker's use case over this process's own mode board (None: the
    /// seed runs without it).
    fallback: Option<Arc<Fallback>>,
}

/// What a client heard back from one purchase attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Heard {
    Order(i64),
    Refused(String),
    Unavailable(String),
    /// No answer at all (crash, deadline, lost connection).
    Nothing,
}

#[derive(Debug, Clone)]
struct Answer {
    request: PurchaseRequest,
    started_step: u64,
    heard: Heard,
    /// Given while the system was quiet (no faults): `unavailable` is then a finding.
    quiet: bool,
}

#[derive(Default)]
struct Observations {
    answers: Vec<Answer>,
    /// Orders a client was told are paid / cancelled.
    paid: Vec<i64>,
    cancelled: Vec<i64>,
    /// Restocks the admin was told are done.
    restocked: BTreeSet<String>,
    violations: Vec<String>,
    /// Products whose I1 online violation was already reported (once is enough).
    oversold: BTreeSet<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WorkerKind {
    Expiry,
    Recovery,
    Watch,
    Reconcile,
    Relay,
    Consume,
    Fallback,
}

struct World {
    ctx: Arc<Ctx>,
    gate: Arc<MemGate>,
    ledger: Arc<MemLedger>,
    fgate: Arc<FaultyGate>,
    fledger: Arc<FaultyLedger>,
    bus: Arc<MemBus>,
    sc: Scenario,
    instances: RefCell<Vec<Instance>>,
    spawned: RefCell<Vec<(Arc<str>, LocalFut)>>,
    obs: RefCell<Observations>,
    clients_active: Cell<usize>,
    /// Whether the current phase is quiet (answers then must not be `unavailable`).
    quiet: Cell<bool>,
    /// Whether Redis lost state during the run (a wipe or a rollback).
    gate_lost: Cell<bool>,
    snapshot: RefCell<Option<GateSnapshot>>,
    snapshot_taken: Cell<bool>,
    wiped: Cell<bool>,
    /// The long Redis outage (`Chaos::redis_down`) has begun.
    redis_down_begun: Cell<bool>,
    /// The drift (`Chaos::drift`) has been made.
    drifted: Cell<bool>,
}

impl World {
    fn new_instance(&self, i: usize) -> Instance {
        let clock: Arc<dyn Clock> = Arc::new(InstanceClock {
            ctx: self.ctx.clone(),
            instance: i,
        });
        let gate: Arc<dyn StockGate> = self.fgate.clone();
        let gate_m: Arc<dyn GateMaintenance> = self.fgate.clone();
        let ledger: Arc<dyn Ledger> = self.fledger.clone();
        let ledger_m: Arc<dyn LedgerMaintenance> = self.fledger.clone();
        let service = Flashsale::new(
            gate.clone(),
            ledger.clone(),
            clock.clone(),
            Settings {
                payment_timeout: self.sc.payment_timeout,
                max_quantity_per_order: QUANTITY_MAX,
            },
        );
        let ports = Ports {
            gate,
            gate_m,
            ledger,
            ledger_m,
            clock,
        };
        let fallback = self
            .sc
            .fallback
            .map(|settings| Arc::new(Fallback::new(ports.clone(), service.mode_board(), settings)));
        let maint = Maintenance::new(
            ports,
            MaintenanceSettings {
                recovery_after: self.sc.recovery_after,
                batch_size: self.sc.batch_size,
                // One product to a page: with two products, some seeds walk two pages.
                products_page: 1,
                audit_bounds: audit::AuditBounds::QUIET,
                payment_timeout: self.sc.payment_timeout,
            },
        );
        let outbox: Arc<dyn Outbox> = self.fledger.clone();
        let bus: Arc<dyn EventBus> = self.bus.clone();
        let stats: Arc<dyn StatsStore> = self.fledger.clone();
        // Subscribed to lease revocations as the server is (`revoke.rs`).
        self.gate.listen(i, service.lease_listener());
        // A restarted process picks a new relay id (the server draws a random one).
        let gen = self.ctx.lock().instance_gen.get(i).copied().unwrap_or(0);
        Instance {
            service: Arc::new(service),
            maint: Arc::new(maint),
            relay: Arc::new(Relay::new(outbox, bus, format!("relay-i{i}-g{gen}"))),
            consume: Arc::new(Consume::new(stats)),
            fallback,
        }
    }

    fn service(&self, i: usize) -> Option<Arc<Flashsale>> {
        self.instances.borrow().get(i).map(|x| x.service.clone())
    }

    fn maint(&self, i: usize) -> Option<Arc<Maintenance>> {
        self.instances.borrow().get(i).map(|x| x.maint.clone())
    }

    fn relay(&self, i: usize) -> Option<Arc<Relay>> {
        self.instances.borrow().get(i).map(|x| x.relay.clone())
    }

    fn consume(&self, i: usize) -> Option<Arc<Consume>> {
        self.instances.borrow().get(i).map(|x| x.consume.clone())
    }

    fn fallback(&self, i: usize) -> Option<Arc<Fallback>> {
        self.instances.borrow().get(i)?.fallback.clone()
    }

    fn spawn(&self, label: String, fut: impl Future<Output = ()> + 'static) {
        self.spawned
            .borrow_mut()
            .push((label.into(), Box::pin(fut)));
    }

    fn violation(&self, v: String) {
        let mut obs = self.obs.borrow_mut();
        if obs.violations.len() < VIOLATIONS_MAX {
            self.ctx.trace(|| format!("VIOLATION {v}"));
            obs.violations.push(v);
        }
    }

    fn pick_instance(&self) -> usize {
        self.ctx.below(self.sc.instances as u64) as usize
    }

    /// Sleeps `n` steps (a client's or worker's pause).
    async fn wait(&self, n: u64) {
        if n > 0 {
            Sleep::new(self.ctx.clone(), n).await;
        }
    }

    fn crash(&self, i: usize) {
        {
            let mut s = self.ctx.lock();
            if let Some(g) = s.instance_gen.get_mut(i) {
                *g += 1;
            }
            s.stats.crashes += 1;
        }
        let fresh = self.new_instance(i);
        if let Some(slot) = self.instances.borrow_mut().get_mut(i) {
            *slot = fresh;
        }
        self.ctx
            .trace(|| format!("CRASH instance {i}: restarted empty"));
    }

    /// Moves true time forward.
    fn advance(&self, by: TimeDelta) {
        self.ctx.lock().base += by;
    }

    /// One step's worth of events outside the calls.
    fn chaos(&self) {
        let c = self.sc.chaos;
        let step = self.ctx.step();
        if self.ctx.chance(c.tick) {
            let ms = self.ctx.below(c.tick_max_ms.max(1) as u64) as i64;
            self.advance(TimeDelta::milliseconds(ms));
        }
        if self.ctx.chance(c.jump) {
            let max = self.sc.payment_timeout.as_millis() as u64 * 2;
            let ms = self.ctx.below(max.max(1)) as i64;
            self.advance(TimeDelta::milliseconds(ms));
            self.ctx.lock().stats.clock_jumps += 1;
            self.ctx.trace(|| format!("CLOCK jumps {ms} ms"));
        }
        if self.ctx.chance(c.instance_clock_jump) {
            let i = self.pick_instance();
            let ms = self.ctx.below(7_200_000) as i64 - 3_600_000;
            if let Some(s) = self.ctx.lock().instance_skew.get_mut(i) {
                *s = TimeDelta::milliseconds(ms);
            }
            self.ctx.lock().stats.clock_jumps += 1;
            self.ctx
                .trace(|| format!("CLOCK of instance {i} now off by {ms} ms"));
        }
        if self.ctx.chance(c.ledger_clock_jump) {
            let max = self.sc.payment_timeout.as_millis() as u64;
            let ms = self.ctx.below(max.max(1)) as i64;
            self.ctx.lock().ledger_skew += TimeDelta::milliseconds(ms);
            self.ctx.lock().stats.clock_jumps += 1;
            self.ctx
                .trace(|| format!("CLOCK of the database jumps {ms} ms ahead"));
        }
        if self.ctx.chance(c.crash) {
            let i = self.pick_instance();
            self.crash(i);
        }
        if c.wipe_at.is_some_and(|at| step >= at) && !self.wiped.get() {
            self.wiped.set(true);
            self.gate.wipe();
            self.gate_lost.set(true);
            self.ctx.lock().stats.wipes += 1;
            self.ctx.trace(|| "REDIS restarts empty".to_owned());
        }
        if let Some((from, to)) = c.rollback {
            if step >= from && !self.snapshot_taken.get() {
                self.snapshot_taken.set(true);
                *self.snapshot.borrow_mut() = Some(self.gate.snapshot());
            }
            if step >= to {
                if let Some(snapshot) = self.snapshot.borrow_mut().take() {
                    self.gate.restore(snapshot);
                    self.gate_lost.set(true);
                    self.ctx.lock().stats.wipes += 1;
                    self.ctx.trace(|| {
                        format!("REDIS fails over to a replica that missed the writes since step {from}")
                    });
                }
            }
        }
        self.redis_down(step);
        self.drift(step);
        let outage = self.sc.faults.outage;
        if self.ctx.chance(outage) {
            let steps = 50 + self.ctx.below(450);
            let target = self.ctx.below(3);
            {
                let mut s = self.ctx.lock();
                let until = s.step + steps;
                match target {
                    0 => s.gate_down_until = until,
                    1 => s.ledger_down_until = until,
                    _ => s.bus_down_until = until,
                }
                s.stats.outages += 1;
            }
            let which = ["REDIS", "DATABASE", "BROKER"][target as usize];
            self.ctx
                .trace(|| format!("{which} unreachable for {steps} steps"));
        }
    }

    /// The drift: at its step, one product's count in Redis moves behind the service's
    /// back, once.
    fn drift(&self, step: u64) {
        let Some((at, by)) = self.sc.chaos.drift else {
            return;
        };
        if step < at || self.drifted.get() {
            return;
        }
        self.drifted.set(true);
        let Some(first) = self.sc.products.first() else {
            return;
        };
        let pick = self.ctx.below(self.sc.products.len() as u64) as usize;
        let product = self.sc.products.get(pick).unwrap_or(first).id.get();
        self.gate.bump_available(product, by);
        self.ctx.lock().stats.drifts += 1;
        self.ctx.trace(|| {
            format!("REDIS's count of product {product} moves by {by} behind the service")
        });
    }

    /// The long Redis outage: unreachable from its step until its time has passed, then
    /// back — empty, in some seeds.
    fn redis_down(&self, step: u64) {
        let Some(down) = self.sc.chaos.redis_down else {
            return;
        };
        if step >= down.at_step && !self.redis_down_begun.get() {
            self.redis_down_begun.set(true);
            {
                let mut s = self.ctx.lock();
                let until = s.base + TimeDelta::milliseconds(down.for_ms);
                s.gate_down_until_time = Some(until);
                s.stats.outages += 1;
            }
            self.ctx
                .trace(|| format!("REDIS unreachable for {} ms", down.for_ms));
        }
        let over = {
            let s = self.ctx.lock();
            s.gate_down_until_time.is_some_and(|until| s.base >= until)
        };
        if over {
            self.redis_back();
        }
    }

    /// The long Redis outage ends (when its time has passed, or when the system is let
    /// go quiet): Redis answers again, restarted empty if the seed says so.
    fn redis_back(&self) {
        if self.ctx.lock().gate_down_until_time.take().is_none() {
            return;
        }
        if self.sc.chaos.redis_down.is_some_and(|d| d.empty) {
            self.gate.wipe();
            self.gate_lost.set(true);
            self.ctx.lock().stats.wipes += 1;
            self.ctx
                .trace(|| "REDIS answers again, restarted empty".to_owned());
        } else {
            self.ctx.trace(|| "REDIS answers again".to_owned());
        }
    }

    /// I1 at every step: no product's live orders exceed its stock, and Redis's count
    /// never goes below zero.
    fn check_online(&self) {
        for (p, (live, total)) in self.ledger.live_units() {
            let avail = self.gate.peek_available(p);
            let over = live > total;
            let negative = avail.is_some_and(|a| a < 0);
            if (over || negative) && self.obs.borrow_mut().oversold.insert(p) {
                self.violation(format!(
                    "I1 no oversell: product {p} has {live} units in live orders of {total} in stock, \
                     Redis available {avail:?} (step {})",
                    self.ctx.step()
                ));
            }
        }
    }

    fn absorb(&self, exec: &mut Executor) {
        for (label, fut) in self.spawned.borrow_mut().drain(..) {
            exec.spawn(label, fut);
        }
    }

    /// Runs until every task has finished.
    fn run_phase(
        &self,
        exec: &mut Executor,
        rt: &tokio::runtime::Runtime,
        chaos: bool,
        name: &str,
    ) {
        let mut ready = Vec::new();
        let mut steps = 0;
        loop {
            self.absorb(exec);
            if exec.is_empty() {
                return;
            }
            if steps >= PHASE_STEPS_MAX {
                self.violation(format!(
                    "liveness: the {name} phase did not finish within {PHASE_STEPS_MAX} steps; \
                     still running: {:?}",
                    exec.labels()
                ));
                exec.clear();
                return;
            }
            steps += 1;
            {
                let mut s = self.ctx.lock();
                s.step += 1;
                s.stats.steps += 1;
            }
            if chaos {
                self.chaos();
            }
            self.ctx.fire_timers();
            if !exec.ready(self.ctx.step(), rt, &mut ready) {
                self.violation(format!(
                    "scheduler: a task in the {name} phase waits on something the simulation \
                     does not drive"
                ));
            }
            if ready.is_empty() {
                let next = match (self.ctx.next_timer(), exec.next_foreign()) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                if let Some(next) = next {
                    // Everyone sleeps: skip to the first waking. True time moves by what
                    // the skipped steps would have ticked on average.
                    let skipped = {
                        let mut s = self.ctx.lock();
                        let skipped = next.saturating_sub(s.step);
                        s.step = next;
                        s.stats.steps += skipped;
                        skipped
                    };
                    if chaos {
                        let c = self.sc.chaos;
                        let ms = (skipped as f64 * c.tick * c.tick_max_ms as f64 / 2.0) as i64;
                        self.advance(TimeDelta::milliseconds(ms));
                    }
                    continue;
                }
                self.violation(format!(
                    "scheduler: no task ready in the {name} phase: {:?}",
                    exec.labels()
                ));
                exec.clear();
                return;
            }
            let id = ready[self.ctx.below(ready.len() as u64) as usize];
            exec.poll(id, &self.ctx);
            self.check_online();
        }
    }

    fn record(&self, request: &PurchaseRequest, started_step: u64, heard: Heard) {
        let quiet = self.quiet.get();
        {
            let mut s = self.ctx.lock();
            match &heard {
                Heard::Order(_) => s.stats.purchases_ok += 1,
                Heard::Refused(_) => s.stats.purchases_refused += 1,
                _ => {}
            }
        }
        self.obs.borrow_mut().answers.push(Answer {
            request: request.clone(),
            started_step,
            heard,
            quiet,
        });
    }
}

/// A refusal's code as the client reads it; the text of an error whose text varies.
fn refusal(e: &Error) -> String {
    match e {
        Error::Invalid(_) | Error::Unavailable(_) => e.to_string(),
        _ => e.outcome().as_str().into(),
    }
}

/// Runs one request on an instance as the HTTP layer would: abandoned on a crash or at
/// the request deadline. None when no answer reached the client.
async fn call<T, F, Fut>(w: &World, label: String, f: F) -> Option<Result<T, Error>>
where
    F: FnOnce(Arc<Flashsale>) -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let i = w.pick_instance();
    let service = w.service(i)?;
    let req = w.ctx.request(format!("{label}@i{i}"), i, true);
    let answer = Request::new(w.ctx.clone(), req, f(service)).await.ok()?;
    let http_lose = w.ctx.lock().faults.http_lose;
    if w.ctx.chance(http_lose) {
        w.ctx
            .trace(|| format!("{label}: the answer never reached the client"));
        return None;
    }
    Some(answer)
}

/// A client buying: retries `unavailable` and silence with the same request_id; after an
/// accepted purchase, does what its intent says.
async fn purchase_client(w: Rc<World>, request: PurchaseRequest, then: Then, arrive: u64) {
    w.wait(arrive).await;
    let rid = request.request_id.clone();
    let mut order = None;
    for attempt in 0..CLIENT_ATTEMPTS_MAX {
        let started = w.ctx.step();
        let r = request.clone();
        let answer = call(&w, format!("buy {rid}#{attempt}"), move |s| async move {
            s.purchase(r).await
        })
        .await;
        let heard = match &answer {
            None => Heard::Nothing,
            Some(Ok(p)) => Heard::Order(p.order.order_id.get()),
            Some(Err(Error::Unavailable(why))) => Heard::Unavailable(why.to_string()),
            Some(Err(e)) => Heard::Refused(refusal(e)),
        };
        w.ctx.trace(|| format!("client {rid} heard {heard:?}"));
        w.record(&request, started, heard.clone());
        match heard {
            Heard::Order(_) => {
                order = answer.and_then(|a| a.ok()).map(|p| p.order);
                break;
            }
            Heard::Refused(_) => break,
            Heard::Unavailable(_) | Heard::Nothing => {}
        }
        let pause = 1 + w.ctx.below(RETRY_WAIT_MAX);
        w.wait(pause).await;
    }
    if order.is_none() {
        let gave_up = !w.obs.borrow().answers.iter().any(|a| {
            a.request == request && matches!(a.heard, Heard::Order(_) | Heard::Refused(_))
        });
        if gave_up {
            w.ctx.lock().stats.purchases_gave_up += 1;
        }
    }
    if let Some(order) = order {
        let (id, user) = (order.order_id, order.user_id);
        match then {
            Then::Pay => pay_client(&w, id, user).await,
            Then::PayLate => {
                let pause = 200 + w.ctx.below(2_000);
                w.wait(pause).await;
                pay_client(&w, id, user).await;
            }
            Then::Cancel => cancel_client(&w, id, user).await,
            Then::PayAndCancel => {
                let w2 = w.clone();
                w.clients_active.set(w.clients_active.get() + 1);
                w.spawn(format!("cancel {id}"), async move {
                    cancel_client(&w2, id, user).await;
                    w2.clients_active.set(w2.clients_active.get() - 1);
                });
                pay_client(&w, id, user).await;
            }
            Then::Nothing => {}
        }
    }
}

async fn pay_client(w: &World, order_id: OrderId, user_id: UserId) {
    let pay = move |s: Arc<Flashsale>| async move { s.pay(order_id, user_id).await };
    let Some(order) = settle_client(w, ("pay", "paid"), order_id, pay).await else {
        return;
    };
    if order.status != OrderStatus::Paid {
        w.violation(format!(
            "pay of order {order_id} answered ok with status {}",
            order.status
        ));
    }
    w.obs.borrow_mut().paid.push(order_id.get());
    w.ctx.lock().stats.paid += 1;
}

async fn cancel_client(w: &World, order_id: OrderId, user_id: UserId) {
    let cancel = move |s: Arc<Flashsale>| async move { s.cancel(order_id, user_id).await };
    if settle_client(w, ("cancel", "cancelled"), order_id, cancel)
        .await
        .is_none()
    {
        return;
    }
    w.obs.borrow_mut().cancelled.push(order_id.get());
    w.ctx.lock().stats.cancelled += 1;
}

/// A client's pay or cancel (`verb`, and its past tense for the trace) of `order_id`,
/// sent again while its outcome is unknown (a 503, a lost answer), at most
/// CLIENT_ATTEMPTS_MAX times: the order answered, or None (refused, or never answered).
async fn settle_client<F, Fut>(
    w: &World,
    (verb, done): (&str, &str),
    order_id: OrderId,
    act: F,
) -> Option<Order>
where
    F: FnOnce(Arc<Flashsale>) -> Fut + Copy,
    Fut: Future<Output = Result<Order, Error>>,
{
    for attempt in 0..CLIENT_ATTEMPTS_MAX {
        match call(w, format!("{verb} {order_id}#{attempt}"), act).await {
            Some(Ok(order)) => {
                w.ctx
                    .trace(|| format!("client: order {order_id} {done} ({})", order.status));
                return Some(order);
            }
            Some(Err(Error::Unavailable(_))) | None => {}
            Some(Err(e)) => {
                w.ctx
                    .trace(|| format!("client: {verb} {order_id} refused: {}", refusal(&e)));
                return None;
            }
        }
        let pause = 1 + w.ctx.below(RETRY_WAIT_MAX);
        w.wait(pause).await;
    }
    None
}

async fn restock_client(w: &World, product_id: ProductId, restock_id: RequestId, quantity: i64) {
    let action = AdminAction {
        request_id: restock_id.clone(),
        product_id,
        admin: AdminName::default(),
    };
    for attempt in 0..CLIENT_ATTEMPTS_MAX {
        let action = action.clone();
        let answer = call(
            w,
            format!("restock {restock_id}#{attempt}"),
            move |s| async move { s.restock(action, quantity).await },
        )
        .await;
        match answer {
            Some(Ok(_)) => {
                w.obs
                    .borrow_mut()
                    .restocked
                    .insert(restock_id.as_str().to_owned());
                return;
            }
            Some(Err(Error::Unavailable(why))) if w.quiet.get() => {
                w.violation(format!(
                    "liveness: restock {restock_id} answered unavailable in a quiet system: {why}"
                ));
                return;
            }
            Some(Err(Error::Unavailable(_))) | None => {}
            Some(Err(e)) => {
                w.violation(format!("restock {restock_id} refused: {e}"));
                return;
            }
        }
        let pause = 1 + w.ctx.below(RETRY_WAIT_MAX);
        w.wait(pause).await;
    }
}

async fn worker(w: Rc<World>, i: usize, kind: WorkerKind) {
    for pass in 0..WORKER_PASSES_MAX {
        if w.clients_active.get() == 0 {
            return;
        }
        let (Some(m), Some(relay), Some(consume)) = (w.maint(i), w.relay(i), w.consume(i)) else {
            return;
        };
        let fallback = w.fallback(i);
        let (w2, batch) = (w.clone(), w.sc.batch_size);
        let req = w.ctx.request(format!("{kind:?}#{pass}@i{i}"), i, false);
        let result = Request::new(w.ctx.clone(), req, async move {
            match kind {
                WorkerKind::Expiry => m.expire_once().await.map(|n| format!("expired {n}")),
                WorkerKind::Recovery => m.recover_once().await.map(|r| format!("{r:?}")),
                WorkerKind::Watch => m.watch_once().await.map(|n| format!("rebuilt {n}")),
                // The periodic reconciliation worker, as the service runs it: repairing
                // what two looks agree on, a bounded number of units a pass.
                WorkerKind::Reconcile => m
                    .reconcile_all(Repair::UpTo(REPAIR_UNITS_PER_PASS), RECONCILE_SETTLE)
                    .await
                    .map(|drifts| {
                        drifts
                            .iter()
                            .map(|r| {
                                format!(
                                    "p{} drift {} repaired {}",
                                    r.product_id, r.drift, r.repaired
                                )
                            })
                            .collect::<Vec<_>>()
                            .join(", ")
                    }),
                WorkerKind::Relay => relay
                    .relay_once(batch)
                    .await
                    .map(|n| format!("published {n}"))
                    .map_err(|e| Error::Unavailable(e.to_string().into())),
                WorkerKind::Consume => consume_some(&w2, &consume, CONSUMER_BATCH)
                    .await
                    .map(|n| format!("consumed {n}"))
                    .map_err(|e| Error::Unavailable(e.to_string().into())),
                WorkerKind::Fallback => match fallback {
                    Some(f) => f.pass().await.map(|p| format!("{p:?}")),
                    None => Ok("off".to_owned()),
                },
            }
        })
        .await;
        w.ctx.trace(|| format!("{kind:?} pass: {result:?}"));
        let idle = if kind == WorkerKind::Reconcile {
            RECONCILE_IDLE_MAX
        } else {
            WORKER_IDLE_MAX
        };
        let pause = 1 + w.ctx.below(idle);
        w.wait(pause).await;
    }
}

/// Messages one consumer pass handles at most (`CONSUMER_BATCH`-like; small, so passes
/// of several instances interleave).
const CONSUMER_BATCH: usize = 5;

/// The statistics consumer: takes the next unacknowledged messages, applies each once
/// (by event id), and acknowledges it — unless the ack is lost, and then the message
/// comes again. The payload is decoded by the sim from the outbox row (decoding is the
/// NATS adapter's job, not a use case). Returns how many it applied.
async fn consume_some(w: &World, consume: &Consume, max: usize) -> Result<usize, String> {
    let mut handled = 0;
    for _ in 0..max {
        if w.bus.ready().is_err() {
            return Err("broker unreachable".into());
        }
        let Some((position, message)) = w.bus.next_delivery() else {
            break;
        };
        let event = w.ledger.event(message.id, &message.event_id);
        let Some(event) = event else {
            w.violation(format!(
                "I7 events: the broker has {} which the outbox does not",
                message.event_id
            ));
            w.bus.ack(position);
            continue;
        };
        consume.apply(&event).await.map_err(|e| e.to_string())?;
        let lose = w.ctx.lock().faults.bus_lose;
        if w.ctx.chance(lose) {
            w.ctx
                .trace(|| format!("consumer: ack of {} lost; it comes again", message.event_id));
        } else {
            w.bus.ack(position);
        }
        handled += 1;
        Point::new().await;
    }
    Ok(handled)
}

/// The quiet phase's workers: rebuild lost gate state, expire, recover, until a pass of
/// each finds nothing to do.
async fn drain(w: Rc<World>) {
    let (Some(m), Some(relay), Some(consume)) = (w.maint(0), w.relay(0), w.consume(0)) else {
        return;
    };
    // Reconciliation repairs a drift the sale left (only where its workers run, as in the
    // sale: elsewhere a drift is the final audit's to find).
    let repair = match w.sc.reconcile {
        true => Repair::UpTo(REPAIR_UNITS_PER_PASS),
        false => Repair::Off,
    };
    for _ in 0..DRAIN_PASSES_MAX {
        let watched = m.watch_once().await;
        let expired = m.expire_once().await;
        let recovered = m.recover_once().await;
        let reconciled = m.reconcile_all(repair, RECONCILE_SETTLE).await;
        let relayed = relay.relay_once(w.sc.batch_size).await;
        let consumed = consume_some(&w, &consume, DRAIN_CONSUME_MAX).await;
        w.ctx.trace(|| {
            format!(
                "drain: watch {watched:?}, expire {expired:?}, recover {recovered:?}, \
                 reconcile {reconciled:?}, relay {relayed:?}, consume {consumed:?}"
            )
        });
        let unsent = w.ledger.unsent_count();
        // In ledger mode a gate hold whose fence was settled by the switch stays in the
        // gate's pending index until the way back's rebuild drops it: recovery defers it
        // at every pass. Only then; the drain after the way back allows no deferral.
        let in_ledger_mode = !w.ledger.peek_ledger_mode_products().is_empty();
        let recovery_settled = |r: &RecoveryReport| {
            *r == RecoveryReport::default()
                || (in_ledger_mode
                    && *r
                        == RecoveryReport {
                            deferred: r.deferred,
                            ..RecoveryReport::default()
                        })
        };
        // A drift found and repaired this pass: the next one must find none.
        let repaired = matches!(&reconciled, Ok(d) if d.iter().any(|r| r.repaired));
        if matches!(watched, Ok(0))
            && !repaired
            && matches!(expired, Ok(0))
            && matches!(&recovered, Ok(r) if recovery_settled(r))
            && matches!(relayed, Ok(0))
            && unsent == 0
            && matches!(consumed, Ok(0))
            && w.bus.caught_up()
        {
            return;
        }
    }
    w.violation(format!(
        "liveness: the workers (recovery, expiry, relay, consumer) still had work after \
         {DRAIN_PASSES_MAX} passes in a quiet system"
    ));
}

/// Buys every unit left, one at a time, and pays for it: if some unit is stuck in limbo
/// (neither sold nor available), the sweep ends before the stock is sold out.
async fn sweep(w: Rc<World>, product_id: ProductId, total: i64) {
    let Some(service) = w.service(0) else { return };
    for k in 0..total + SWEEP_EXTRA {
        let raw = format!("SWEEP-{product_id}-{k}");
        let Ok(request_id) = RequestId::parse("request_id", &raw) else {
            return;
        };
        let (Ok(user_id), Some(quantity)) = (UserId::parse(100_000 + k), Quantity::from_stored(1))
        else {
            return;
        };
        let request = PurchaseRequest {
            request_id,
            user_id,
            product_id,
            quantity,
        };
        let started = w.ctx.step();
        match service.purchase(request.clone()).await {
            Ok(p) => {
                w.record(&request, started, Heard::Order(p.order.order_id.get()));
                if let Err(e) = service.pay(p.order.order_id, user_id).await {
                    w.violation(format!(
                        "sweep: paying order {} in a quiet system failed: {e}",
                        p.order.order_id
                    ));
                    return;
                }
            }
            Err(Error::SoldOut) => return,
            Err(e) => {
                w.violation(format!(
                    "sweep: buying the remaining units of product {product_id} in a quiet \
                     system failed: {e}"
                ));
                return;
            }
        }
    }
}

async fn create_product(w: Rc<World>, new: NewProduct, attempts: u32) {
    for _ in 0..attempts {
        let n = new.clone();
        match call(
            &w,
            format!("create p{}", new.product_id),
            move |s| async move { s.create_product(n, &AdminName::default()).await },
        )
        .await
        {
            Some(Ok(_)) | Some(Err(Error::ProductExists)) => return,
            _ => w.wait(1 + w.ctx.below(RETRY_WAIT_MAX)).await,
        }
    }
}

/// Runs one seed.
pub fn run(opts: &Options, rt: &tokio::runtime::Runtime) -> Outcome {
    let Some(sc) = Scenario::generate(opts.seed, opts.features) else {
        return Outcome {
            seed: opts.seed,
            violations: vec!["the scenario generator made an invalid id".into()],
            trace: Vec::new(),
            stats: Stats::default(),
            scenario: String::new(),
        };
    };
    let scenario = sc.to_string();
    let _enter = rt.enter();
    let ctx = Ctx::new(
        opts.seed,
        start_time(),
        sc.instances,
        delta(sc.request_timeout),
        opts.trace,
    );
    {
        let mut s = ctx.lock();
        s.instance_skew = sc.instance_skew.clone();
        s.ledger_skew = sc.ledger_skew;
    }
    let gate = Arc::new(MemGate::new(
        ctx.clone(),
        sc.record_ttl,
        sc.sold_out_lease,
        opts.defects.gate,
    ));
    let ledger = Arc::new(MemLedger::new(ctx.clone(), opts.defects.ledger));
    let w = Rc::new(World {
        fgate: Arc::new(FaultyGate {
            inner: gate.clone(),
            ctx: ctx.clone(),
        }),
        fledger: Arc::new(FaultyLedger {
            inner: ledger.clone(),
            ctx: ctx.clone(),
        }),
        bus: Arc::new(MemBus::new(ctx.clone())),
        ctx: ctx.clone(),
        gate,
        ledger,
        sc,
        instances: RefCell::new(Vec::new()),
        spawned: RefCell::new(Vec::new()),
        obs: RefCell::new(Observations::default()),
        clients_active: Cell::new(0),
        quiet: Cell::new(false),
        gate_lost: Cell::new(false),
        snapshot: RefCell::new(None),
        snapshot_taken: Cell::new(false),
        wiped: Cell::new(false),
        redis_down_begun: Cell::new(false),
        drifted: Cell::new(false),
    });
    let instances: Vec<Instance> = (0..w.sc.instances).map(|i| w.new_instance(i)).collect();
    *w.instances.borrow_mut() = instances;
    let mut exec = Executor::default();
    let phased = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        phases(&w, &mut exec, rt);
    }));
    exec.clear();
    match phased {
        Ok(()) => check(&w),
        Err(panic) => {
            let msg = crate::panic_message(panic.as_ref());
            w.violation(format!("panic in the use cases or the simulation: {msg}"));
        }
    }
    let violations = w.obs.borrow().violations.clone();
    let stats = ctx.stats();
    let trace = ctx.lock().trace.events.iter().cloned().collect();
    // Break the cycle tasks → world → instances before dropping.
    w.instances.borrow_mut().clear();
    Outcome {
        seed: opts.seed,
        violations,
        trace,
        stats,
        scenario,
    }
}

/// The run's phases, in order: setup, the sale, the quiet-down and restock retries, the
/// way back to the gate, late replays, the sweep and the final checks.
fn phases(w: &Rc<World>, exec: &mut Executor, rt: &tokio::runtime::Runtime) {
    setup(w, exec, rt);
    sale(w, exec, rt);
    // Quiet: no faults, clocks agree again, and time moves past every deadline.
    quiet_down(w, exec, rt);
    restock_retries(w, exec, rt);
    // Products still in ledger mode are audited so (the ledger alone), then given back
    // to the gate, as the fallback workers would once Redis has answered long enough.
    audit_all(w, "after the sale");
    way_back(w, exec, rt);
    if w.sc.late_replays {
        late_replays(w, exec, rt);
    }
    sweep_all(w, exec, rt);
    // The sweep made events too: let the relay and the consumer finish.
    quiet_down(w, exec, rt);
    audit_all(w, "after the sweep");
    check_events(w);
    let mut s = w.ctx.lock();
    if s.stats.to_ledger > 0 && s.stats.to_gate > 0 {
        s.stats.runs_switched_both_ways = 1;
    }
}

/// Setup: the products, created through the service under the seed's call faults (but
/// no crashes yet), then finished quietly if the faults won.
fn setup(w: &Rc<World>, exec: &mut Executor, rt: &tokio::runtime::Runtime) {
    w.ctx.lock().faults = FaultProfile {
        kill: 0.0,
        outage: 0.0,
        ..w.sc.faults
    };
    let news: Vec<NewProduct> =
        w.sc.products
            .iter()
            .filter_map(|p| {
                NewProduct::parse(
                    p.id.get(),
                    &format!("Product {}", p.id),
                    p.stock,
                    p.limit.map(i64::from),
                    SaleWindow::default(),
                )
                .ok()
            })
            .collect();
    for new in &news {
        w.spawn(
            format!("admin create p{}", new.product_id),
            create_product(w.clone(), new.clone(), SETUP_ATTEMPTS_MAX),
        );
    }
    w.run_phase(exec, rt, false, "setup");
    w.ctx.lock().faults = FaultProfile::none();
    for new in &news {
        w.spawn(
            format!("admin create p{} (quiet)", new.product_id),
            create_product(w.clone(), new.clone(), SETUP_ATTEMPTS_MAX),
        );
    }
    w.run_phase(exec, rt, false, "setup (quiet)");
}

/// The sale: clients and workers under every fault.
fn sale(w: &Rc<World>, exec: &mut Executor, rt: &tokio::runtime::Runtime) {
    w.ctx.lock().faults = w.sc.faults;
    spawn_clients(w);
    for r in w.sc.restocks.clone() {
        w.clients_active.set(w.clients_active.get() + 1);
        let w2 = w.clone();
        w.spawn(format!("admin restock {}", r.restock_id), async move {
            w2.wait(r.arrive).await;
            restock_client(&w2, r.product_id, r.restock_id, r.quantity).await;
            w2.clients_active.set(w2.clients_active.get() - 1);
        });
    }
    spawn_workers(w);
    w.run_phase(exec, rt, true, "sale");
    let mut s = w.ctx.lock();
    s.stats.to_gate_in_sale = s.stats.to_gate;
}

/// Every intent's clients: its first, its copies and its conflicting request.
fn spawn_clients(w: &Rc<World>) {
    let intents: Vec<Intent> = w.sc.intents.clone();
    let mut n = 0;
    for intent in &intents {
        let mut clients = vec![(intent.request.clone(), intent.then)];
        for _ in 0..intent.copies {
            clients.push((intent.request.clone(), intent.then));
        }
        if let Some(conflict) = &intent.conflict {
            clients.push((conflict.clone(), Then::Nothing));
        }
        for (k, (request, then)) in clients.into_iter().enumerate() {
            let arrive = if k == 0 {
                intent.arrive
            } else {
                intent.arrive + w.ctx.below(20)
            };
            w.clients_active.set(w.clients_active.get() + 1);
            let w2 = w.clone();
            n += 1;
            w.spawn(format!("client{n} {}", request.request_id), async move {
                purchase_client(w2.clone(), request, then, arrive).await;
                w2.clients_active.set(w2.clients_active.get() - 1);
            });
        }
    }
}

/// Every instance's workers: those every instance runs, then reconcile and fallback
/// where the scenario has them.
fn spawn_workers(w: &Rc<World>) {
    for i in 0..w.sc.instances {
        for kind in [
            WorkerKind::Expiry,
            WorkerKind::Recovery,
            WorkerKind::Watch,
            WorkerKind::Relay,
            WorkerKind::Consume,
        ] {
            w.spawn(format!("{kind:?} worker i{i}"), worker(w.clone(), i, kind));
        }
    }
    if w.sc.reconcile {
        for i in 0..w.sc.instances {
            w.spawn(
                format!("Reconcile worker i{i}"),
                worker(w.clone(), i, WorkerKind::Reconcile),
            );
        }
    }
    if w.sc.fallback.is_some() {
        for i in 0..w.sc.instances {
            w.spawn(
                format!("Fallback worker i{i}"),
                worker(w.clone(), i, WorkerKind::Fallback),
            );
        }
    }
}

/// An admin told `unavailable` retries until told otherwise (as the API asks): a
/// restock is recorded in the ledger before it reaches Redis, and no worker finishes it
/// (see the report).
fn restock_retries(w: &Rc<World>, exec: &mut Executor, rt: &tokio::runtime::Runtime) {
    for r in w.sc.restocks.clone() {
        if w.obs.borrow().restocked.contains(r.restock_id.as_str()) {
            continue;
        }
        let w2 = w.clone();
        w.spawn(
            format!("admin restock {} (again)", r.restock_id),
            async move {
                restock_client(&w2, r.product_id, r.restock_id, r.quantity).await;
            },
        );
    }
    w.run_phase(exec, rt, false, "restock retries");
}

/// Every Redis record has expired; clients replay old requests.
fn late_replays(w: &Rc<World>, exec: &mut Executor, rt: &tokio::runtime::Runtime) {
    w.advance(w.sc.record_ttl + TimeDelta::seconds(1));
    let intents = w.sc.intents.clone();
    for intent in intents.iter().take(LATE_REPLAYS_MAX) {
        if !w.ctx.chance(0.5) {
            continue;
        }
        let request = intent.request.clone();
        let w2 = w.clone();
        w.spawn(format!("late replay {}", request.request_id), async move {
            let started = w2.ctx.step();
            let Some(service) = w2.service(0) else { return };
            let heard = match service.purchase(request.clone()).await {
                Ok(p) => Heard::Order(p.order.order_id.get()),
                Err(Error::Unavailable(why)) => Heard::Unavailable(why.to_string()),
                Err(e) => Heard::Refused(refusal(&e)),
            };
            w2.ctx
                .trace(|| format!("late replay {} heard {heard:?}", request.request_id));
            w2.record(&request, started, heard);
        });
    }
    w.run_phase(exec, rt, false, "late replays");
    quiet_down(w, exec, rt);
    audit_all(w, "after late replays");
}

/// I6: whatever is not sold must be buyable — once any sold-out lease has ended (a
/// rebuild in the quiet-down starts one; a real buyer told sold_out tries again later).
fn sweep_all(w: &Rc<World>, exec: &mut Executor, rt: &tokio::runtime::Runtime) {
    w.advance(w.sc.sold_out_lease + TimeDelta::milliseconds(1));
    for p in w.sc.products.clone() {
        let total = w
            .ledger
            .peek_facts(p.id.get())
            .map_or(0, |f| f.counters.total);
        w.spawn(format!("sweep p{}", p.id), sweep(w.clone(), p.id, total));
        w.run_phase(exec, rt, false, "sweep");
        if let Some(f) = w.ledger.peek_facts(p.id.get()) {
            let avail = w.gate.peek_available(p.id.get());
            if f.paid_units != f.counters.total || f.pending_units != 0 || avail != Some(0) {
                w.violation(format!(
                    "I6 no stock limbo: after buying and paying all that could be bought, product {} \
                     has {} of {} units sold ({} unpaid), Redis available {avail:?}",
                    p.id, f.paid_units, f.counters.total, f.pending_units
                ));
            }
        }
    }
}

/// Rounds of fallback passes the way back may take: one pass of every instance gives
/// every product back (a handful of products, `SWITCHES_PER_PASS_MAX` a pass).
const WAY_BACK_ROUNDS_MAX: u32 = 5;

/// The way back in a quiet system: every instance's fallback hears Redis answer, time
/// moves past `recover_after` (and past every report of Redis unreachable, on the
/// database's clock, which moves with true time), and the fallbacks give every product
/// in ledger mode back to the gate, rebuilt from the ledger's facts. Then the workers
/// settle again and the stores are audited — in gate mode, so the sweep's exact check
/// (every unit sold, Redis at zero) covers the rebuild.
fn way_back(w: &Rc<World>, exec: &mut Executor, rt: &tokio::runtime::Runtime) {
    let Some(settings) = w.sc.fallback else {
        return;
    };
    let in_ledger_mode = |w: &World| w.ledger.peek_ledger_mode_products();
    if in_ledger_mode(w).is_empty() {
        return;
    }
    for round in 0..=WAY_BACK_ROUNDS_MAX {
        if round == 1 {
            w.advance(delta(settings.recover_after) + delta(REPORT_EVERY));
        }
        let w2 = w.clone();
        w.spawn(format!("way back #{round}"), async move {
            for i in 0..w2.sc.instances {
                let Some(f) = w2.fallback(i) else { continue };
                let pass = f.pass().await;
                w2.ctx
                    .trace(|| format!("way back: fallback i{i}: {pass:?}"));
                if let Err(e) = pass {
                    w2.violation(format!(
                        "liveness: a fallback pass in a quiet system failed: {e}"
                    ));
                }
            }
        });
        w.run_phase(exec, rt, false, "way back");
        if round > 0 && in_ledger_mode(w).is_empty() {
            quiet_down(w, exec, rt);
            audit_all(w, "after the way back");
            return;
        }
    }
    w.violation(format!(
        "liveness: products {:?} still in ledger mode after {WAY_BACK_ROUNDS_MAX} rounds of \
         fallback passes in a quiet system whose Redis answers",
        in_ledger_mode(w)
    ));
}

/// I7: every event reached the broker (first publications in order per request), and the
/// consumer applied each exactly once.
fn check_events(w: &World) {
    let rows = w.ledger.outbox_rows();
    let published = w.bus.messages();
    let mut first_seen: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for m in &published {
        if seen.insert(m.event_id.clone()) {
            first_seen
                .entry(m.request_id.clone())
                .or_default()
                .push(m.sequence);
        }
    }
    for (rid, seqs) in &first_seen {
        if seqs.windows(2).any(|p| p[0] >= p[1]) {
            w.violation(format!(
                "I7 events: the events of {rid} first reached the broker out of order: {seqs:?}"
            ));
        }
    }
    let mut expected: BTreeMap<i64, StatsDelta> = BTreeMap::new();
    let mut all = BTreeSet::new();
    for r in &rows {
        all.insert(r.event_id.clone());
        if !seen.contains(&r.event_id) {
            w.violation(format!(
                "I7 events: {} ({} of {}) never reached the broker",
                r.event_id, r.event_type, r.request_id
            ));
        }
        if let Some(event) = r.event() {
            let d = StatsDelta::of(&event);
            let e = expected.entry(r.product_id).or_default();
            *e += &d;
        }
    }
    let (stats, consumed) = w.ledger.sales_stats();
    if consumed != all {
        let missing: Vec<&String> = all.difference(&consumed).take(10).collect();
        w.violation(format!(
            "I7 events: the consumer did not apply every event once; missing {missing:?}"
        ));
    }
    if stats != expected {
        w.violation(format!(
            "I7 events: the consumer's statistics {stats:?} differ from the events {expected:?}"
        ));
    }
}

fn quiet_down(w: &Rc<World>, exec: &mut Executor, rt: &tokio::runtime::Runtime) {
    w.quiet.set(true);
    {
        let mut s = w.ctx.lock();
        s.faults = FaultProfile::none();
        s.gate_down_until = 0;
        s.ledger_down_until = 0;
        s.bus_down_until = 0;
        for d in s.instance_skew.iter_mut() {
            *d = TimeDelta::zero();
        }
    }
    w.redis_back();
    // Past every payment deadline (on the database's clock, which moves with true time),
    // past the recovery window of every hold (on Redis's clock, true time too) and past
    // every relay's lease — but well within the hold records' retention.
    w.advance(
        delta(w.sc.payment_timeout)
            + delta(w.sc.recovery_after)
            + delta(flashsale_app::relay::CLAIM_LEASE)
            + TimeDelta::seconds(1),
    );
    w.spawn("drain".into(), drain(w.clone()));
    w.run_phase(exec, rt, false, "drain");
}

/// The pure audit of every product (I1–I4, I6), on an atomic look at both stores.
fn audit_all(w: &World, when: &str) {
    for p in &w.sc.products {
        let id = p.id.get();
        let Some(ledger) = w.ledger.peek_facts(id) else {
            w.violation(format!("product {id} missing from the ledger {when}"));
            continue;
        };
        let gate: GateFacts = w.gate.peek_facts(id);
        let report = audit::check(id, &gate, &ledger, &audit::AuditBounds::QUIET);
        for v in report.violations {
            w.violation(format!(
                "{} (audit {when}): {} {:?}",
                v.invariant, v.message, v.request_ids
            ));
        }
    }
}

/// The checks of the clients' record against the ledger, and of the ledger's own rules.
fn check(w: &World) {
    for a in w.ledger.anomalies() {
        w.violation(format!(
            "ledger refused a write that would break its rules: {a}"
        ));
    }
    let answers = w.obs.borrow().answers.clone();
    let mut acked: BTreeMap<String, BTreeSet<i64>> = BTreeMap::new();
    for a in &answers {
        let rid = a.request.request_id.as_str();
        match &a.heard {
            Heard::Order(order_id) => {
                acked.entry(rid.to_owned()).or_default().insert(*order_id);
                match w.ledger.order_row(*order_id) {
                    Some(row) if row.order.request() == a.request => {}
                    Some(row) => w.violation(format!(
                        "I5 no acknowledged loss: {rid} was answered with order {order_id}, which \
                         the ledger holds for {:?}",
                        row.order.request()
                    )),
                    None => w.violation(format!(
                        "I5 no acknowledged loss: {rid} was answered with order {order_id}, which \
                         the ledger does not have"
                    )),
                }
            }
            Heard::Refused(kind) => {
                // A replay that starts after its order was committed must get the order.
                if let Some(row) = w.ledger.order_of_request(rid) {
                    if row.committed_step < a.started_step && row.order.request() == a.request {
                        w.violation(format!(
                            "I2 replay: {rid} was refused ({kind}) by an attempt that started at \
                             step {} although its order {} was committed at step {}",
                            a.started_step, row.order.order_id, row.committed_step
                        ));
                    }
                }
            }
            Heard::Unavailable(why) if a.quiet => w.violation(format!(
                "liveness: {rid} was answered unavailable in a quiet system: {why}"
            )),
            _ => {}
        }
    }
    for (rid, orders) in &acked {
        if orders.len() > 1 {
            w.violation(format!(
                "I2 one order per request: {rid} was answered with orders {orders:?}"
            ));
        }
    }
    let mut per_request: BTreeMap<String, usize> = BTreeMap::new();
    for row in w.ledger.orders() {
        *per_request
            .entry(row.order.request_id.to_string())
            .or_default() += 1;
        let o = &row.order;
        if o.cancel_reason == Some(flashsale_core::CancelReason::PaymentTimeout)
            && o.cancelled_at.is_some_and(|at| at < o.expires_at)
        {
            w.violation(format!(
                "early expiry: order {} was cancelled for payment timeout at {:?}, before its \
                 deadline {}",
                o.order_id, o.cancelled_at, o.expires_at
            ));
        }
    }
    for (rid, n) in per_request {
        if n > 1 {
            w.violation(format!("I2 one order per request: {rid} has {n} orders"));
        }
    }
    let (paid, cancelled) = {
        let obs = w.obs.borrow();
        (obs.paid.clone(), obs.cancelled.clone())
    };
    for id in paid {
        let status = w.ledger.order_row(id).map(|r| r.order.status);
        if status != Some(OrderStatus::Paid) {
            w.violation(format!(
                "I3 resolved once: order {id} was answered paid but is {status:?}"
            ));
        }
    }
    for id in cancelled {
        let status = w.ledger.order_row(id).map(|r| r.order.status);
        if status != Some(OrderStatus::Cancelled) {
            w.violation(format!(
                "I3 resolved once: order {id} was answered cancelled but is {status:?}"
            ));
        }
    }
    for rid in w.ledger.resolved_twice() {
        w.violation(format!(
            "I3 resolved once: reservation {rid} made more than one terminal transition"
        ));
    }
    for rid in w.ledger.event_mismatches() {
        w.violation(format!(
            "I7 events: the outbox events of {rid} do not match its state changes"
        ));
    }
    let limits: BTreeMap<i64, u32> =
        w.sc.products
            .iter()
            .filter_map(|p| p.limit.map(|l| (p.id.get(), l)))
            .collect();
    for ((p, user), units) in w.ledger.per_user_live_units() {
        if let Some(limit) = limits.get(&p) {
            if units > i64::from(*limit) {
                w.violation(format!(
                    "per-user limit: user {user} holds {units} units of product {p}, limit {limit}"
                ));
            }
        }
    }
    for p in &w.sc.products {
        let restocked: i64 = w.ledger.restocks(p.id.get()).iter().map(|(_, q)| q).sum();
        let total = w
            .ledger
            .peek_facts(p.id.get())
            .map_or(-1, |f| f.counters.total);
        if total != p.stock + restocked {
            w.violation(format!(
                "restock: product {} has total {total}, expected {} + {restocked}",
                p.id, p.stock
            ));
        }
    }
}
