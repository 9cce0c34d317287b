//! Deterministic simulation of flashsale.
//!
//! The use cases of `flashsale-app` — purchase, pay, cancel, restock, and the workers'
//! expire, recover, watch (rebuild), reconcile, the outbox relay and the statistics
//! consumer — run unchanged against in-memory implementations of the same ports:
//! [`gate::MemGate`] (the Redis adapter's own calls — its Lua scripts, run by an embedded
//! Lua 5.1, its plain commands, its reply parsing and its batched reservations — over
//! [`memredis::MemRedis`], an in-memory Redis), [`ledger::MemLedger`] (the MariaDB
//! transactions' semantics, outbox, group commit and batched lookups included) and
//! [`bus::MemBus`] (JetStream's). A seeded,
//! single-threaded scheduler ([`exec::Executor`]) interleaves many concurrent clients and
//! workers; the fault injector ([`faulty`]) fails calls, loses replies and duplicates
//! them; the run ([`run`]) crashes instances between any two effects, restarts Redis
//! empty or rolls it back, and moves the clocks. After each run the system is let go
//! quiet and the invariants of `docs/INVARIANTS.md` are checked (see [`run::run`]).
//!
//! The same seed always gives the same run: no threads, no wall clock in any decision,
//! every choice drawn from one `StdRng`, every collection ordered.

pub mod bus;
pub mod coalesce;
pub mod ctx;
pub mod exec;
pub mod faulty;
pub mod gate;
pub mod ledger;
pub mod memredis;
pub mod run;
pub mod scenario;

use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub use ctx::Stats;
pub use run::{Defects, Options, Outcome};
pub use scenario::{Features, FEATURES};

/// Trace lines a failure report shows: enough to follow the last requests around the
/// violation, few enough to read.
pub const REPORT_TRACE_LINES: usize = 50;

/// The named defects the command line and the tests can switch on.
pub const DEFECTS: &[&str] = &[
    "oversell",
    "no-fence",
    "aside-from-batch",
    "late-group-write",
    "batch-twice",
    "enter-same-generation",
    "ledger-sells-in-gate-mode",
];

impl Defects {
    /// `oversell`: Redis lets `reserve` go below zero and the ledger has neither its
    /// `available_stock >= q` guard nor the CHECK constraint. `no-fence`: the ledger's
    /// fence writes nothing, so a late commit can follow a release. `aside-from-batch`:
    /// group commit answers the purchases it set aside from the batch's result.
    /// `late-group-write`: a group transaction checks, yields, then writes, so a fence
    /// that lands in between is overwritten by an order. `batch-twice`: reserve.lua
    /// takes units again for a request_id already granted in the same batch.
    /// `enter-same-generation`: `enter_ledger_mode` keeps the generation.
    /// `ledger-sells-in-gate-mode`: `commit_ledger_purchase` ignores the mode.
    pub fn named(name: &str) -> Option<Self> {
        let mut d = Self::default();
        match name {
            "oversell" => {
                d.gate.reserve_below_zero = true;
                d.ledger.no_stock_guard = true;
            }
            "no-fence" => d.ledger.fence_writes_nothing = true,
            "aside-from-batch" => d.ledger.aside_from_batch = true,
            "late-group-write" => d.ledger.group_writes_late = true,
            "batch-twice" => d.gate.batch_counts_twice = true,
            "enter-same-generation" => d.ledger.enter_keeps_generation = true,
            "ledger-sells-in-gate-mode" => d.ledger.ledger_sells_in_gate_mode = true,
            _ => return None,
        }
        Some(d)
    }

    pub fn name(&self) -> Option<&'static str> {
        DEFECTS
            .iter()
            .copied()
            .find(|n| Self::named(n).as_ref() == Some(self))
    }
}

/// A current-thread runtime with a timer, for the one tokio sleep the use cases contain
/// (reconcile's settle pause).
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
}

/// Runs one seed; a panic in the use cases is reported as a violation.
pub fn run_seed(opts: &Options, rt: &tokio::runtime::Runtime) -> Outcome {
    match catch_unwind(AssertUnwindSafe(|| run::run(opts, rt))) {
        Ok(outcome) => outcome,
        Err(panic) => {
            let msg = panic_message(panic.as_ref());
            Outcome {
                seed: opts.seed,
                violations: vec![format!("panic: {msg}")],
                trace: Vec::new(),
                stats: Stats::default(),
                scenario: String::new(),
            }
        }
    }
}

/// A caught panic's message (its payload, a `String` or a `&str`).
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "(no message)".into())
}

/// The one line that reproduces a seed run with `opts`' defects and features.
pub fn reproduce_command(seed: u64, opts: &Options) -> String {
    let mut cmd = format!("cargo run -p flashsale-sim -- --seed {seed}");
    if let Some(name) = opts.defects.name() {
        cmd.push_str(&format!(" --defect {name}"));
    }
    let off = opts.features.disabled();
    if !off.is_empty() {
        cmd.push_str(&format!(" --without {}", off.join(",")));
    }
    cmd
}

/// The report of a failing seed: the command that reproduces it, the violations, the
/// scenario and the end of its trace (the seed is run again with tracing on; being
/// deterministic, it fails the same way).
pub fn failure_report(outcome: &Outcome, opts: &Options, trace_lines: usize) -> String {
    let mut out = format!("reproduce: {}\n", reproduce_command(outcome.seed, opts));
    for v in &outcome.violations {
        out.push_str(&format!("  violation: {v}\n"));
    }
    let traced = match runtime() {
        Ok(rt) => run_seed(
            &Options {
                seed: outcome.seed,
                trace: TRACE_FOR_REPORT,
                ..opts.clone()
            },
            &rt,
        ),
        Err(e) => {
            out.push_str(&format!("  (no trace: {e})\n"));
            return out;
        }
    };
    if traced.violations != outcome.violations {
        out.push_str("  NOTE: the traced re-run found different violations (non-determinism!):\n");
        for v in &traced.violations {
            out.push_str(&format!("    {v}\n"));
        }
    }
    out.push_str(&format!("  scenario: {}\n", traced.scenario));
    // The events of the requests the violations name, then the run up to the first
    // violation.
    let ids = request_ids(&outcome.violations);
    if !ids.is_empty() {
        let about: Vec<&String> = traced
            .trace
            .iter()
            .filter(|line| ids.iter().any(|id| mentions(line, id)))
            .collect();
        let skip = about.len().saturating_sub(trace_lines);
        out.push_str(&format!(
            "  last {} events of {}:\n",
            about.len() - skip,
            ids.join(", ")
        ));
        for line in &about[skip..] {
            out.push_str(&format!("    {line}\n"));
        }
    }
    let end = traced
        .trace
        .iter()
        .position(|l| l.contains("VIOLATION"))
        .map_or(traced.trace.len(), |i| i + 1);
    let start = end.saturating_sub(trace_lines);
    out.push_str(&format!(
        "  last {} events up to the first violation:\n",
        end - start
    ));
    for line in &traced.trace[start..end] {
        out.push_str(&format!("    {line}\n"));
    }
    out
}

/// Events a report's re-run keeps: every event of a run (a few thousand).
const TRACE_FOR_REPORT: usize = 1_000_000;

/// The request ids (`R<n>`, `SWEEP-…`) a set of violations names.
fn request_ids(violations: &[String]) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    for v in violations {
        for word in v.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')) {
            let is_id = word.len() > 1
                && word.starts_with('R')
                && word[1..].chars().all(|c| c.is_ascii_digit())
                || word.starts_with("SWEEP-");
            if is_id && !ids.iter().any(|i| i == word) {
                ids.push(word.to_owned());
            }
        }
    }
    ids
}

/// Whether a trace line mentions a request id (as a whole word).
fn mentions(line: &str, id: &str) -> bool {
    line.match_indices(id).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + id.len()..].chars().next();
        !before.is_some_and(|c| c.is_ascii_alphanumeric())
            && !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-')
    })
}

/// The result of many seeds.
#[derive(Debug, Default)]
pub struct Summary {
    pub runs: u64,
    /// Failing outcomes, by seed.
    pub failures: Vec<Outcome>,
    pub stats: Stats,
    pub elapsed: Duration,
}

/// Runs `seeds` on `threads` threads (each run is single-threaded and independent), and
/// stops taking new seeds after `max_failures` failures.
pub fn run_seeds(
    seeds: Range<u64>,
    opts: &Options,
    threads: usize,
    max_failures: usize,
) -> Summary {
    let started = Instant::now();
    let next = AtomicU64::new(seeds.start);
    let failed = AtomicUsize::new(0);
    let total = Mutex::new(Summary::default());
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| {
                let rt = match runtime() {
                    Ok(rt) => rt,
                    Err(_) => return,
                };
                let mut mine = Summary::default();
                loop {
                    if failed.load(Ordering::Relaxed) >= max_failures {
                        break;
                    }
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= seeds.end {
                        break;
                    }
                    let outcome = run_seed(
                        &Options {
                            seed,
                            trace: 0,
                            ..opts.clone()
                        },
                        &rt,
                    );
                    mine.runs += 1;
                    mine.stats.add(&outcome.stats);
                    if !outcome.ok() {
                        failed.fetch_add(1, Ordering::Relaxed);
                        mine.failures.push(outcome);
                    }
                }
                let mut total = total.lock().unwrap_or_else(|p| p.into_inner());
                total.runs += mine.runs;
                total.stats.add(&mine.stats);
                total.failures.append(&mut mine.failures);
            });
        }
    });
    let mut summary = total.into_inner().unwrap_or_else(|p| p.into_inner());
    summary.failures.sort_by_key(|o| o.seed);
    summary.elapsed = started.elapsed();
    summary
}

/// Threads to run seeds on: every core.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
