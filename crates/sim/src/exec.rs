//! A single-threaded executor whose only policy is the seed: at each step it polls one
//! ready task, chosen by the run's RNG. Tasks are kept in a `BTreeMap` by spawn order, so
//! the set of ready tasks — and therefore every choice — is a pure function of the seed.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use crate::ctx::Ctx;

/// Turns of the tokio runtime's timer a task waiting on it may need before it is called
/// stuck: the only such wait in the use cases is reconcile's settle pause, which the
/// simulation sets to a millisecond, so a few turns suffice.
const FOREIGN_WAITS_MAX: usize = 50;
/// One turn of the runtime's timer while a task waits on it (wall time).
const FOREIGN_WAIT_SLICE: std::time::Duration = std::time::Duration::from_millis(1);
/// How many steps a task waiting on tokio's timer sleeps in the simulation (the settle
/// pause as simulated time): whatever the wall clock does, it resumes exactly then.
const FOREIGN_SLEEP_STEPS: (u64, u64) = (50, 400);

/// What one poll of a task ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Polled {
    Done,
    /// Stopped at a yield point of the simulation (ready again) or went to sleep.
    Yielded,
}

pub type LocalFut = Pin<Box<dyn Future<Output = ()>>>;

/// Set when the task may make progress: by our own yield points (which wake at once) or
/// by a foreign waker (tokio's timer, for reconcile's settle pause).
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Relaxed);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::Relaxed);
    }
}

struct Task {
    label: Arc<str>,
    fut: LocalFut,
    flag: Arc<Flag>,
    waker: Waker,
    /// Waiting on tokio's timer: not ready before this step, whatever its flag says.
    foreign_until: Option<u64>,
}

#[derive(Default)]
pub struct Executor {
    tasks: BTreeMap<u64, Task>,
    next_id: u64,
}

impl Executor {
    pub fn spawn(&mut self, label: Arc<str>, fut: LocalFut) {
        let flag = Arc::new(Flag(AtomicBool::new(true)));
        let waker = Waker::from(flag.clone());
        self.tasks.insert(
            self.next_id,
            Task {
                label,
                fut,
                flag,
                waker,
                foreign_until: None,
            },
        );
        self.next_id += 1;
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Ids of the tasks that may make progress at `step`, in spawn order. A task that
    /// waited on tokio's timer and whose simulated pause is over has the runtime driven
    /// until its wait ends (wall time, a millisecond or two), so it is ready exactly at
    /// the step the seed chose.
    pub fn ready(&mut self, step: u64, rt: &tokio::runtime::Runtime, out: &mut Vec<u64>) -> bool {
        out.clear();
        let mut stuck = false;
        for (id, t) in self.tasks.iter_mut() {
            if let Some(until) = t.foreign_until {
                if step < until {
                    continue;
                }
                for _ in 0..FOREIGN_WAITS_MAX {
                    if t.flag.0.load(Ordering::Relaxed) {
                        break;
                    }
                    rt.block_on(tokio::time::sleep(FOREIGN_WAIT_SLICE));
                }
                t.foreign_until = None;
                if !t.flag.0.load(Ordering::Relaxed) {
                    stuck = true;
                    // Poll it anyway; it will wait again and be reported.
                    t.flag.0.store(true, Ordering::Relaxed);
                }
            }
            if t.flag.0.load(Ordering::Relaxed) {
                out.push(*id);
            }
        }
        !stuck
    }

    /// The first step at which a task waiting on tokio's timer resumes.
    pub fn next_foreign(&self) -> Option<u64> {
        self.tasks.values().filter_map(|t| t.foreign_until).min()
    }

    /// Polls one task until it finishes, stops at one of the simulation's own yield
    /// points, or waits on something else (tokio's timer): then it sleeps a seeded number
    /// of steps, so when it resumes does not depend on the wall clock.
    pub fn poll(&mut self, id: u64, ctx: &Ctx) -> Polled {
        let Some(task) = self.tasks.get_mut(&id) else {
            return Polled::Done;
        };
        ctx.set_task(Some(task.label.clone()));
        ctx.take_parked();
        task.flag.0.store(false, Ordering::Relaxed);
        let mut cx = Context::from_waker(&task.waker);
        let outcome = if let Poll::Ready(()) = task.fut.as_mut().poll(&mut cx) {
            Polled::Done
        } else if task.flag.0.load(Ordering::Relaxed) || ctx.take_parked() {
            Polled::Yielded
        } else {
            let (min, max) = FOREIGN_SLEEP_STEPS;
            task.foreign_until = Some(ctx.step() + min + ctx.below(max - min));
            Polled::Yielded
        };
        ctx.set_task(None);
        if outcome == Polled::Done {
            self.tasks.remove(&id);
        }
        outcome
    }

    /// Labels of the tasks still there (for a report of what did not finish).
    pub fn labels(&self) -> Vec<String> {
        self.tasks.values().map(|t| t.label.to_string()).collect()
    }

    /// Drops every task (the end of a run, or of a process).
    pub fn clear(&mut self) {
        self.tasks.clear();
    }
}

/// Polls a future that only waits on the simulation's own yield points (a store call
/// outside the scheduler, in tests) to completion; None if it is still pending after
/// `polls_max` polls.
pub fn block_on<F: Future>(fut: F, polls_max: usize) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..polls_max {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return Some(v);
        }
    }
    None
}
