//! Batches of concurrent calls on the simulation's own scheduler: what `flashsale-batch`'s
//! `Coalescer` does for the adapters (group commit, batched lookups), without a task of
//! its own (the simulator's executor runs no tokio tasks).
//!
//! A call queues its item. If no batch is running, the caller leads one: it takes what
//! is queued (up to the bound), runs it, and posts each member's answer. Calls that
//! arrive meanwhile queue and park until a batch answers them, or until the running one
//! ends and one of them can lead the next. So a batch holds exactly what queued while
//! the previous one ran, and who leads, and when, is the seed's choice like everything
//! else. A leader abandoned half-way (killed, crashed, timed out) answers every member
//! it has not answered with `lost`: an outcome unknown, as when the adapter's batch task
//! stops.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use crate::ctx::Ctx;

struct State<T, A> {
    next_ticket: u64,
    /// No bound of its own (the adapter's queue has one, `GROUP_QUEUE_MAX`): it holds at
    /// most one item per simulated call in flight, and the scenario bounds those.
    queue: VecDeque<(u64, T)>,
    /// A batch is running.
    busy: bool,
    answers: BTreeMap<u64, A>,
    /// Tickets whose caller went away: their answers are dropped.
    gone: BTreeSet<u64>,
    /// Parked callers, by ticket.
    waiters: BTreeMap<u64, Waker>,
}

pub struct Coalescer<T, A> {
    state: Mutex<State<T, A>>,
    /// Most items one batch takes.
    batch_max: usize,
    lost: fn() -> A,
}

impl<T, A> Coalescer<T, A> {
    pub fn new(batch_max: usize, lost: fn() -> A) -> Self {
        Self {
            state: Mutex::new(State {
                next_ticket: 0,
                queue: VecDeque::new(),
                busy: false,
                answers: BTreeMap::new(),
                gone: BTreeSet::new(),
                waiters: BTreeMap::new(),
            }),
            batch_max: batch_max.max(1),
            lost,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T, A>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `item`'s answer, from the batch it ends up in; `run` answers a batch, one answer
    /// per item in order (a missing one is `lost`).
    pub async fn call<F, Fut>(&self, ctx: &Ctx, item: T, run: F) -> A
    where
        F: Fn(Vec<T>) -> Fut,
        Fut: Future<Output = Vec<A>>,
    {
        let ticket = {
            let mut s = self.lock();
            let ticket = s.next_ticket;
            s.next_ticket += 1;
            s.queue.push_back((ticket, item));
            ticket
        };
        let mut caller = Caller {
            of: self,
            ticket,
            answered: false,
        };
        // Each turn either returns, leads a batch, or parks until a batch ends: bounded by
        // the batches queued ahead of this one.
        loop {
            let batch = {
                let mut s = self.lock();
                if let Some(answer) = s.answers.remove(&ticket) {
                    caller.answered = true;
                    return answer;
                }
                if s.busy {
                    None
                } else {
                    s.busy = true;
                    let n = s.queue.len().min(self.batch_max);
                    Some(s.queue.drain(..n).collect::<Vec<_>>())
                }
            };
            let Some(batch) = batch else {
                Wait {
                    of: self,
                    ctx,
                    ticket,
                }
                .await;
                continue;
            };
            let (tickets, items): (Vec<u64>, Vec<T>) = batch.into_iter().unzip();
            let leading = Leading {
                of: self,
                tickets,
                posted: false,
            };
            let answers = run(items).await;
            leading.post(answers);
        }
    }

    /// Ends a batch: posts its answers (`lost` for any missing), and wakes every parked
    /// caller (those answered, and those queued, one of which leads next).
    fn end(&self, tickets: &[u64], answers: Vec<A>) {
        let wake: Vec<Waker> = {
            let mut s = self.lock();
            let mut answers = answers.into_iter();
            for &ticket in tickets {
                let answer = answers.next().unwrap_or_else(self.lost);
                if !s.gone.remove(&ticket) {
                    s.answers.insert(ticket, answer);
                }
            }
            s.busy = false;
            std::mem::take(&mut s.waiters).into_values().collect()
        };
        for waker in wake {
            waker.wake();
        }
    }
}

/// A running batch; dropped before it posts (its leader abandoned), it answers `lost`.
struct Leading<'a, T, A> {
    of: &'a Coalescer<T, A>,
    tickets: Vec<u64>,
    posted: bool,
}

impl<T, A> Leading<'_, T, A> {
    fn post(mut self, answers: Vec<A>) {
        self.posted = true;
        self.of.end(&self.tickets, answers);
    }
}

impl<T, A> Drop for Leading<'_, T, A> {
    fn drop(&mut self) {
        if !self.posted {
            self.of.end(&self.tickets, Vec::new());
        }
    }
}

/// A caller; dropped before its answer (abandoned), its answer is dropped when it comes.
struct Caller<'a, T, A> {
    of: &'a Coalescer<T, A>,
    ticket: u64,
    answered: bool,
}

impl<T, A> Drop for Caller<'_, T, A> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let mut s = self.of.lock();
        s.waiters.remove(&self.ticket);
        if s.answers.remove(&self.ticket).is_none() {
            // Still queued or in a running batch: it runs, and its answer is dropped.
            s.gone.insert(self.ticket);
        }
    }
}

/// Parks until the caller's answer is posted or no batch is running.
struct Wait<'a, T, A> {
    of: &'a Coalescer<T, A>,
    ctx: &'a Ctx,
    ticket: u64,
}

impl<T, A> Future for Wait<'_, T, A> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut s = self.of.lock();
        if !s.busy || s.answers.contains_key(&self.ticket) {
            return Poll::Ready(());
        }
        s.waiters.insert(self.ticket, cx.waker().clone());
        drop(s);
        self.ctx.park();
        Poll::Pending
    }
}
