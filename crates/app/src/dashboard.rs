//! The live sale page's history (`GET /dashboard`): once a second the sampler reads this
//! instance's purchase counters ([`Metrics::purchase_tally`], in memory, no store read)
//! and keeps what changed in that second — answers by outcome, and the answer time's
//! median and 99th percentile from the latency buckets' deltas — for the last
//! [`HISTORY_MAX`] seconds. The stores' figures (stock, backlog, modes) are not sampled:
//! the page reads them through [`crate::Monitor`], whose reads `GET /metrics` shares.
//!
//! Memory: at most `HISTORY_MAX` samples of about 250 bytes each (a count per outcome
//! and two times), some 75 KB, however long the process runs.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::metrics::{Metrics, PurchaseTally, LATENCY_BUCKETS};
use crate::outcome::Outcome;

/// How often the sampler records a sample: a second is what a chart of "per second"
/// rates plots, and what an operator's eye follows live.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);
/// Samples kept: five minutes at one a second, the span of a flash sale's rush and of
/// its aftermath worth comparing with, in about 75 KB.
pub const HISTORY_MAX: usize = 300;

/// What the purchase endpoint answered during one interval.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// When the interval ended.
    pub at: DateTime<Utc>,
    /// How long the interval was, in seconds (about `SAMPLE_INTERVAL`; longer when the
    /// runtime was busy), so rates divide by the time that really passed.
    pub seconds: f64,
    /// Answers by outcome, in `Outcome::ALL`'s order, only those with answers.
    pub purchases: Vec<(Outcome, u64)>,
    /// The answer time's median and 99th percentile, in seconds, over the interval's
    /// answers (None: no answer), interpolated within the latency buckets.
    pub p50: Option<f64>,
    pub p99: Option<f64>,
}

/// Records a [`Sample`] per interval, keeping the last [`HISTORY_MAX`].
pub struct Sampler {
    metrics: Arc<Metrics>,
    state: Mutex<State>,
}

struct State {
    /// The tally at the end of the last interval, and when that was.
    last: (DateTime<Utc>, PurchaseTally),
    history: VecDeque<Sample>,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler").finish_non_exhaustive()
    }
}

impl Sampler {
    /// A sampler whose first interval starts `now`.
    pub fn new(metrics: Arc<Metrics>, now: DateTime<Utc>) -> Self {
        let tally = metrics.purchase_tally();
        Self {
            metrics,
            state: Mutex::new(State {
                last: (now, tally),
                history: VecDeque::with_capacity(HISTORY_MAX),
            }),
        }
    }

    /// Ends the current interval at `now`: records what the counters moved since the
    /// last call, dropping the oldest sample past `HISTORY_MAX`.
    pub fn sample(&self, now: DateTime<Utc>) {
        let tally = self.metrics.purchase_tally();
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (since, before) = state.last;
        let sample = delta(&before, &tally, since, now);
        state.last = (now, tally);
        if state.history.len() >= HISTORY_MAX {
            state.history.pop_front();
        }
        state.history.push_back(sample);
    }

    /// The samples kept, oldest first.
    pub fn history(&self) -> Vec<Sample> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.history.iter().cloned().collect()
    }
}

/// The sample of the interval from `since` (tally `before`) to `now` (tally `after`).
/// Counters only grow; a smaller value (none in one process) counts as no change.
fn delta(
    before: &PurchaseTally,
    after: &PurchaseTally,
    since: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Sample {
    let purchases = Outcome::ALL
        .iter()
        .zip(before.by_outcome.iter().zip(&after.by_outcome))
        .filter_map(|(&o, (b, a))| Some((o, a.checked_sub(*b).filter(|&n| n > 0)?)))
        .collect();
    let buckets: Vec<u64> = before
        .buckets
        .iter()
        .zip(&after.buckets)
        .map(|(b, a)| a.saturating_sub(*b))
        .collect();
    let seconds = (now - since)
        .to_std()
        .map_or(0.0, |d| d.as_secs_f64())
        .max(f64::EPSILON);
    Sample {
        at: now,
        seconds,
        purchases,
        p50: quantile(&buckets, 0.5),
        p99: quantile(&buckets, 0.99),
    }
}

/// The `q` quantile of the times counted in `buckets` (each bucket's own count, by
/// `LATENCY_BUCKETS`' bounds, the last past the largest), as Prometheus's
/// `histogram_quantile` estimates it: linear within the bucket that holds the rank, from
/// the bucket below's bound (0 for the first); a rank in the last bucket reads the
/// largest bound. None without any count.
pub fn quantile(buckets: &[u64], q: f64) -> Option<f64> {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total as f64;
    let mut below = 0u64;
    for (i, &n) in buckets.iter().enumerate() {
        let through = below + n;
        if n > 0 && through as f64 >= rank {
            let Some(&upper) = LATENCY_BUCKETS.get(i) else {
                return LATENCY_BUCKETS.last().copied();
            };
            let lower = match i {
                0 => 0.0,
                _ => LATENCY_BUCKETS[i - 1],
            };
            let within = (rank - below as f64) / n as f64;
            return Some(lower + (upper - lower) * within);
        }
        below = through;
    }
    LATENCY_BUCKETS.last().copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::index_of;
    use crate::metrics::ENDPOINTS;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).expect("a time")
    }

    // Checks the quantile estimate on hand-made buckets: none without counts; all in
    // one bucket interpolates between its bounds (the median of 10 answers in
    // (0.001, 0.0025] halfway through it); a rank past the finite buckets reads the
    // largest bound; the 99th percentile of 99 fast answers and one slow one lands in
    // the fast bucket's top, and of 98 and two in the slow one.
    #[test]
    fn quantiles_interpolate_within_the_bucket_holding_the_rank() {
        let n = LATENCY_BUCKETS.len() + 1;
        assert_eq!(quantile(&vec![0; n], 0.5), None);
        let mut b = vec![0; n];
        b[4] = 10; // (0.001, 0.0025]
        let p50 = quantile(&b, 0.5).expect("a median");
        assert!((p50 - 0.00175).abs() < 1e-9, "{p50}");
        let mut b = vec![0; n];
        b[n - 1] = 3;
        assert_eq!(quantile(&b, 0.5), Some(2.5));
        let mut b = vec![0; n];
        b[0] = 99; // (0, 0.0001]
        b[9] = 1; // (0.05, 0.1]
        assert_eq!(quantile(&b, 0.99), Some(0.0001));
        b[0] = 98;
        b[9] = 2;
        let p99 = quantile(&b, 0.99).expect("a p99");
        assert!(p99 > 0.05 && p99 <= 0.1, "{p99}");
    }

    // Checks the sampler against real counters: each sample holds only what was
    // answered in its interval (by outcome, zero outcomes left out), its times' median
    // from that interval's buckets, no times in an idle interval; and the history keeps
    // the last HISTORY_MAX samples, oldest dropped first.
    #[test]
    fn samples_hold_each_intervals_answers_and_the_history_is_bounded() {
        let m = Arc::new(Metrics::new());
        let purchase = index_of(&ENDPOINTS, "purchase");
        m.answered_in(purchase, Outcome::Created, Duration::from_millis(2));
        let sampler = Sampler::new(m.clone(), at(0));
        for _ in 0..3 {
            m.answered_in(purchase, Outcome::SoldOut, Duration::from_micros(50));
        }
        m.answered_in(purchase, Outcome::Created, Duration::from_millis(2));
        m.answered_in(
            index_of(&ENDPOINTS, "pay"),
            Outcome::Ok,
            Duration::from_secs(1),
        );
        sampler.sample(at(1));
        sampler.sample(at(3));
        let h = sampler.history();
        assert_eq!(h.len(), 2);
        assert_eq!(
            h[0].purchases,
            vec![(Outcome::SoldOut, 3), (Outcome::Created, 1)]
        );
        assert_eq!(h[0].seconds, 1.0);
        let p50 = h[0].p50.expect("a median");
        assert!(p50 > 0.0 && p50 <= 0.0001, "{p50}");
        let p99 = h[0].p99.expect("a p99");
        assert!(p99 > 0.001 && p99 <= 0.0025, "{p99}");
        assert_eq!(
            (h[1].purchases.len(), h[1].p50, h[1].seconds),
            (0, None, 2.0)
        );
        for s in 4..(4 + HISTORY_MAX as i64) {
            sampler.sample(at(s));
        }
        let h = sampler.history();
        assert_eq!(h.len(), HISTORY_MAX);
        assert_eq!(h[0].at, at(4));
        assert_eq!(h[HISTORY_MAX - 1].at, at(3 + HISTORY_MAX as i64));
    }
}
