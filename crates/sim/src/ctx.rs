//! The shared context of one simulated run: the seeded RNG every decision draws from, the
//! simulated clocks, the fault profile, the request being polled, the trace and the
//! counters.
//!
//! Everything runs on one thread, polled by [`crate::exec::Executor`]; the mutex is there
//! only because the ports must be `Send + Sync`. Nothing here reads the wall clock.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use chrono::{DateTime, TimeDelta, Utc};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Longest trace line kept (facts and records can be long; the start says enough).
const TRACE_LINE_MAX: usize = 240;

/// How likely each kind of fault is, per call or per step. All zero = a quiet system.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FaultProfile {
    /// A gate (Redis) call fails before it runs: nothing applied, the caller gets an error.
    pub gate_fail: f64,
    /// A gate call runs but its reply is lost: applied, the caller gets an error.
    pub gate_lose: f64,
    /// A gate call runs twice (a network-level duplicate); the caller gets either reply.
    pub gate_dup: f64,
    pub ledger_fail: f64,
    pub ledger_lose: f64,
    pub ledger_dup: f64,
    /// A publish to the broker fails / is stored but its acknowledgement is lost; the
    /// latter also stands for a consumer whose ack is lost (the message comes again).
    pub bus_fail: f64,
    pub bus_lose: f64,
    /// At each yield point of a request or worker pass: abandon it there (its process
    /// died, or the request deadline dropped it). Effects already applied stay.
    pub kill: f64,
    /// The service answered but the client never heard it (connection dropped).
    pub http_lose: f64,
    /// Per step: a store becomes unreachable for a while (an outage, not a blip).
    pub outage: f64,
}

impl FaultProfile {
    pub fn none() -> Self {
        Self::default()
    }
}

/// Which store a call goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    Gate,
    Ledger,
    Bus,
}

/// What the fault injector decided for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    None,
    /// Refused before it ran.
    Fail,
    /// Ran, reply lost.
    LoseReply,
    /// Ran twice; `second` says which reply the caller gets.
    Duplicate {
        second: bool,
    },
}

/// Counters of what happened in a run, for the summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub steps: u64,
    pub gate_calls: u64,
    pub ledger_calls: u64,
    pub failed_calls: u64,
    pub lost_replies: u64,
    pub duplicated_calls: u64,
    pub kills: u64,
    pub timeouts: u64,
    pub crashes: u64,
    pub wipes: u64,
    pub rebuilds: u64,
    pub clock_jumps: u64,
    /// Counts in Redis moved behind the service's back (`Chaos::drift`).
    pub drifts: u64,
    pub outages: u64,
    pub purchases_ok: u64,
    pub purchases_refused: u64,
    pub purchases_gave_up: u64,
    pub paid: u64,
    pub cancelled: u64,
    /// Products switched to ledger mode (`enter_ledger_mode` that switched).
    pub to_ledger: u64,
    /// Products given back to the gate (`leave_ledger_mode` that switched), and how many
    /// of those during the sale (the rest in the wind-down, with no fault on).
    pub to_gate: u64,
    pub to_gate_in_sale: u64,
    /// Purchases the ledger sold in ledger mode (`commit_ledger_purchase` committed).
    pub ledger_sales: u64,
    /// Runs that switched at least one product each way (0 or 1 per run).
    pub runs_switched_both_ways: u64,
}

impl Stats {
    pub fn add(&mut self, o: &Stats) {
        self.steps += o.steps;
        self.gate_calls += o.gate_calls;
        self.ledger_calls += o.ledger_calls;
        self.failed_calls += o.failed_calls;
        self.lost_replies += o.lost_replies;
        self.duplicated_calls += o.duplicated_calls;
        self.kills += o.kills;
        self.timeouts += o.timeouts;
        self.crashes += o.crashes;
        self.wipes += o.wipes;
        self.rebuilds += o.rebuilds;
        self.clock_jumps += o.clock_jumps;
        self.drifts += o.drifts;
        self.outages += o.outages;
        self.purchases_ok += o.purchases_ok;
        self.purchases_refused += o.purchases_refused;
        self.purchases_gave_up += o.purchases_gave_up;
        self.paid += o.paid;
        self.cancelled += o.cancelled;
        self.to_ledger += o.to_ledger;
        self.to_gate += o.to_gate;
        self.to_gate_in_sale += o.to_gate_in_sale;
        self.ledger_sales += o.ledger_sales;
        self.runs_switched_both_ways += o.runs_switched_both_ways;
    }
}

/// One request (or worker pass) in flight: what can end it early.
#[derive(Debug)]
pub struct ReqState {
    pub label: String,
    pub instance: usize,
    /// The instance's generation when the request started; a crash bumps it.
    pub gen: u64,
    /// When it started on the simulated clock, if a request deadline applies to it.
    pub started: Option<DateTime<Utc>>,
    killed: AtomicBool,
}

/// The recent events of a run.
#[derive(Debug, Default)]
pub struct Trace {
    pub on: bool,
    /// Most events kept (the last ones: where a violation's story usually is); older
    /// ones are dropped so memory stays bounded.
    pub keep: usize,
    pub events: VecDeque<String>,
    pub total: u64,
}

pub struct State {
    pub rng: StdRng,
    pub step: u64,
    pub start: DateTime<Utc>,
    /// The "true" time; every clock is this plus its own offset.
    pub base: DateTime<Utc>,
    /// The database's clock offset (orders expire on this clock).
    pub ledger_skew: TimeDelta,
    /// Each service instance's clock offset (sale windows, hold timestamps, recovery).
    pub instance_skew: Vec<TimeDelta>,
    /// Bumped when an instance crashes: its requests and passes in flight are dropped.
    pub instance_gen: Vec<u64>,
    pub faults: FaultProfile,
    /// Steps until which a store is unreachable (an outage).
    pub gate_down_until: u64,
    /// A long Redis outage, in true time: unreachable until the run ends it (the first
    /// step at or past this time, see `Chaos::redis_down`).
    pub gate_down_until_time: Option<DateTime<Utc>>,
    pub ledger_down_until: u64,
    pub bus_down_until: u64,
    pub request_timeout: TimeDelta,
    /// Tasks asleep until a step: (step, registration order) → waker.
    pub timers: BTreeMap<(u64, u64), Waker>,
    timer_seq: u64,
    /// Set when the task being polled went to sleep on a timer (not a foreign wait).
    pub parked: bool,
    pub current_task: Option<Arc<str>>,
    pub current_req: Option<Arc<ReqState>>,
    pub trace: Trace,
    pub stats: Stats,
}

pub struct Ctx {
    state: Mutex<State>,
}

impl Ctx {
    pub fn new(
        seed: u64,
        start: DateTime<Utc>,
        instances: usize,
        request_timeout: TimeDelta,
        trace_keep: usize,
    ) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                rng: StdRng::seed_from_u64(seed),
                step: 0,
                start,
                base: start,
                ledger_skew: TimeDelta::zero(),
                instance_skew: vec![TimeDelta::zero(); instances],
                instance_gen: vec![0; instances],
                faults: FaultProfile::none(),
                gate_down_until: 0,
                gate_down_until_time: None,
                ledger_down_until: 0,
                bus_down_until: 0,
                request_timeout,
                timers: BTreeMap::new(),
                timer_seq: 0,
                parked: false,
                current_task: None,
                current_req: None,
                trace: Trace {
                    on: trace_keep > 0,
                    keep: trace_keep,
                    ..Trace::default()
                },
                stats: Stats::default(),
            }),
        })
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        // Single-threaded: a poisoned lock only means a panic is already unwinding.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records an event; `what` is only formatted when tracing is on.
    pub fn trace(&self, what: impl FnOnce() -> String) {
        {
            let mut s = self.lock();
            s.trace.total += 1;
            if !s.trace.on {
                return;
            }
        }
        // Formatted without the lock held, so `what` may read the context.
        let mut text = what();
        if text.len() > TRACE_LINE_MAX {
            let mut cut = TRACE_LINE_MAX;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push('…');
        }
        let mut s = self.lock();
        let elapsed = (s.base - s.start).num_milliseconds();
        let who = match (&s.current_req, &s.current_task) {
            (Some(r), _) => r.label.clone(),
            (None, Some(t)) => t.to_string(),
            (None, None) => "sim".to_owned(),
        };
        let line = format!(
            "#{:<6} t+{:>5}.{:03}s {who}: {text}",
            s.step,
            elapsed / 1000,
            elapsed.rem_euclid(1000)
        );
        if s.trace.events.len() >= s.trace.keep {
            s.trace.events.pop_front();
        }
        s.trace.events.push_back(line);
    }

    pub fn chance(&self, p: f64) -> bool {
        p > 0.0 && self.lock().rng.random::<f64>() < p
    }

    /// A uniform draw in `0..n` (0 when n is 0).
    pub fn below(&self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        self.lock().rng.random_range(0..n)
    }

    pub fn step(&self) -> u64 {
        self.lock().step
    }

    pub fn instance_now(&self, instance: usize) -> DateTime<Utc> {
        let s = self.lock();
        s.base + s.instance_skew.get(instance).copied().unwrap_or_default()
    }

    pub fn ledger_now(&self) -> DateTime<Utc> {
        let s = self.lock();
        s.base + s.ledger_skew
    }

    /// Redis's own clock (record retention); the sim keeps it on true time.
    pub fn gate_now(&self) -> DateTime<Utc> {
        self.lock().base
    }

    pub fn stats(&self) -> Stats {
        self.lock().stats.clone()
    }

    pub fn set_task(&self, label: Option<Arc<str>>) {
        self.lock().current_task = label;
    }

    /// A yield point inside a request or pass: maybe abandon it here (the process died or
    /// the request was dropped at this point). The request notices at its next poll.
    pub fn maybe_kill(&self, at: &str) {
        let victim = {
            let mut s = self.lock();
            let p = s.faults.kill;
            let Some(req) = s.current_req.clone() else {
                return;
            };
            if !(p > 0.0 && s.rng.random::<f64>() < p) {
                return;
            }
            s.stats.kills += 1;
            req
        };
        victim.killed.store(true, Ordering::Relaxed);
        self.trace(|| format!("KILL here, before {at}"));
    }

    /// Decides the fate of one call to a store.
    pub fn fault(&self, port: Port) -> Fault {
        let mut s = self.lock();
        let f = s.faults;
        let (fail, lose, dup, down_until) = match port {
            Port::Gate => {
                s.stats.gate_calls += 1;
                let down_until = if s.gate_down_until_time.is_some() {
                    u64::MAX
                } else {
                    s.gate_down_until
                };
                (f.gate_fail, f.gate_lose, f.gate_dup, down_until)
            }
            Port::Ledger => {
                s.stats.ledger_calls += 1;
                (
                    f.ledger_fail,
                    f.ledger_lose,
                    f.ledger_dup,
                    s.ledger_down_until,
                )
            }
            Port::Bus => (f.bus_fail, f.bus_lose, 0.0, s.bus_down_until),
        };
        if s.step < down_until {
            s.stats.failed_calls += 1;
            return Fault::Fail;
        }
        let r: f64 = s.rng.random();
        if r < fail {
            s.stats.failed_calls += 1;
            Fault::Fail
        } else if r < fail + lose {
            s.stats.lost_replies += 1;
            Fault::LoseReply
        } else if r < fail + lose + dup {
            s.stats.duplicated_calls += 1;
            Fault::Duplicate {
                second: s.rng.random(),
            }
        } else {
            Fault::None
        }
    }

    /// A new request (or worker pass) on an instance, with the request deadline or not.
    pub fn request(&self, label: String, instance: usize, deadline: bool) -> Arc<ReqState> {
        let s = self.lock();
        Arc::new(ReqState {
            label,
            instance,
            gen: s.instance_gen.get(instance).copied().unwrap_or(0),
            started: deadline.then_some(s.base),
            killed: AtomicBool::new(false),
        })
    }
}

/// Gives control back to the scheduler once: every port call passes through one before
/// and one after its effect, so the seed decides what runs in between.
#[derive(Debug, Default)]
pub struct Point(bool);

impl Point {
    pub fn new() -> Self {
        Self(false)
    }
}

impl Future for Point {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

/// Sleeps until a step: the task is not polled (and costs nothing) meanwhile.
pub struct Sleep {
    ctx: Arc<Ctx>,
    until: u64,
}

impl Sleep {
    pub fn new(ctx: Arc<Ctx>, steps: u64) -> Self {
        let until = ctx.step().saturating_add(steps);
        Self { ctx, until }
    }
}

impl Future for Sleep {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut s = self.ctx.lock();
        if s.step >= self.until {
            return Poll::Ready(());
        }
        let seq = s.timer_seq;
        s.timer_seq += 1;
        s.timers.insert((self.until, seq), cx.waker().clone());
        s.parked = true;
        Poll::Pending
    }
}

impl Ctx {
    /// Wakes the tasks whose sleep ends at or before the current step.
    pub fn fire_timers(&self) {
        let due: Vec<Waker> = {
            let mut s = self.lock();
            let step = s.step;
            let mut due = Vec::new();
            // Bounded by the timers registered (one per sleeping task).
            while let Some(entry) = s.timers.first_entry() {
                if entry.key().0 > step {
                    break;
                }
                due.push(entry.remove());
            }
            due
        };
        for waker in due {
            waker.wake();
        }
    }

    /// The step the earliest sleeper wakes at.
    pub fn next_timer(&self) -> Option<u64> {
        self.lock().timers.keys().next().map(|k| k.0)
    }

    /// The task being polled waits for a waker of the simulation's own (a batch it
    /// queued in, `coalesce.rs`): it is not polled until that wakes it.
    pub fn park(&self) {
        self.lock().parked = true;
    }

    /// Whether the task just polled went to sleep (and clears the mark).
    pub fn take_parked(&self) -> bool {
        std::mem::take(&mut self.lock().parked)
    }
}

/// Why a request or pass ended without an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abandoned {
    /// Dropped at a yield point (its process died there, or its client went away).
    Killed,
    /// Its instance crashed.
    Crashed,
    /// It outlived the request deadline (the HTTP layer dropped it and answered 503).
    Timeout,
}

/// Runs a request or worker pass so the simulation can abandon it between any two
/// effects: at each poll it first checks whether it was killed, its instance crashed or
/// its deadline passed, and if so drops the inner future right there.
pub struct Request<F: Future> {
    ctx: Arc<Ctx>,
    req: Arc<ReqState>,
    inner: Option<Pin<Box<F>>>,
}

impl<F: Future> Request<F> {
    pub fn new(ctx: Arc<Ctx>, req: Arc<ReqState>, inner: F) -> Self {
        Self {
            ctx,
            req,
            inner: Some(Box::pin(inner)),
        }
    }
}

impl<F: Future> Future for Request<F> {
    type Output = Result<F::Output, Abandoned>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if this.inner.is_none() {
            return Poll::Ready(Err(Abandoned::Killed));
        }
        let verdict = {
            let mut s = this.ctx.lock();
            let gen = s.instance_gen.get(this.req.instance).copied().unwrap_or(0);
            let timed_out = this
                .req
                .started
                .is_some_and(|t| s.base - t > s.request_timeout);
            if this.req.killed.load(Ordering::Relaxed) {
                Some(Abandoned::Killed)
            } else if gen != this.req.gen {
                Some(Abandoned::Crashed)
            } else if timed_out {
                s.stats.timeouts += 1;
                Some(Abandoned::Timeout)
            } else {
                None
            }
        };
        if let Some(why) = verdict {
            // Dropping the future is the crash: nothing after this point happens.
            this.inner = None;
            let label = this.req.label.clone();
            this.ctx.trace(|| format!("{label} abandoned: {why:?}"));
            return Poll::Ready(Err(why));
        }
        let prev = this.ctx.lock().current_req.replace(this.req.clone());
        let polled = match this.inner.as_mut() {
            Some(inner) => inner.as_mut().poll(cx),
            None => Poll::Pending,
        };
        this.ctx.lock().current_req = prev;
        match polled {
            Poll::Ready(v) => {
                this.inner = None;
                Poll::Ready(Ok(v))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
