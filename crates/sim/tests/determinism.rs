//! Checks that a seed is a complete description of a run: the same seed run twice (with
//! tracing on, and once with it off) gives the same events, the same counters and the
//! same verdict, and different seeds give different runs. Without this a failing seed's
//! reproduce command would be worthless.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test's failed expectation is its failure, with the expectation's message"
)]

use flashsale_sim::{run_seed, runtime, Options};

/// Seeds compared: enough to cover runs with crashes, wipes and reconcile.
const SEEDS: u64 = 60;
/// Events kept per traced run: all of them.
const TRACE_ALL: usize = 1_000_000;

// Runs each of SEEDS seeds twice with every event traced and once without a trace, and
// compares traces, counters and violations; then checks no two seeds gave the same trace.
#[test]
fn same_seed_same_run() {
    let rt = runtime().expect("runtime");
    let mut traces = Vec::new();
    for seed in 0..SEEDS {
        let traced = Options {
            seed,
            trace: TRACE_ALL,
            ..Options::default()
        };
        let a = run_seed(&traced, &rt);
        let b = run_seed(&traced, &rt);
        assert!(!a.trace.is_empty(), "seed {seed}: no trace");
        assert_eq!(a.trace, b.trace, "seed {seed}: two runs differ");
        assert_eq!(a.stats, b.stats, "seed {seed}");
        assert_eq!(a.violations, b.violations, "seed {seed}");
        let quiet = run_seed(&Options { trace: 0, ..traced }, &rt);
        assert_eq!(quiet.stats, a.stats, "seed {seed}: tracing changed the run");
        assert_eq!(quiet.violations, a.violations, "seed {seed}");
        traces.push(a.trace);
    }
    traces.sort();
    traces.dedup();
    assert_eq!(
        traces.len() as u64,
        SEEDS,
        "different seeds gave the same run"
    );
}
