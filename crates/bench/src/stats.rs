//! What the load records while it runs (latency histograms, status and error counts, a
//! timeline, the orders each request_id was answered with) and the pure
//! summaries drawn from it.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Highest latency the histograms hold, in microseconds: above the client's whole budget
/// for one exchange (see `load::CLIENT_TIMEOUT`), so only a clock jump could exceed it
/// (such values are clamped, not lost).
pub const LATENCY_MAX_US: u64 = 120_000_000;
/// Significant digits kept by the histograms: 0.1% resolution at every magnitude.
const LATENCY_SIGFIG: u8 = 3;
/// Seconds of load the command line allows (`--duration`); the timeline covers any run
/// (its step grows with the run).
pub const RUN_SECONDS_MAX: u64 = 3600;
/// The timeline's finest step: a run of a second or two still draws its charts from a
/// dozen points or more, and at a few thousand answers a second a step this long still
/// holds hundreds of answers, so the rate it shows is not mostly noise.
pub const TIMELINE_STEP_MIN_MS: u64 = 100;
/// Buckets a timeline holds at most: past it the step doubles and neighbouring buckets
/// merge. Enough points for a chart a page wide (a few pixels each), few enough that 32
/// shards of an hour's run stay within a few hundred kilobytes.
pub const TIMELINE_BUCKETS_MAX: usize = 256;
/// Conflicting answers kept verbatim for the report: enough to investigate, few enough
/// that a badly broken server can't grow the report without bound (all are counted).
pub const CONFLICTS_KEPT_MAX: usize = 20;
/// Orders left to expire that are kept to check afterwards that they did expire: a
/// sample, checked with one GET each, so the check stays a few seconds long.
pub const EXPIRE_SAMPLE_MAX: usize = 200;

/// The kinds of request the load sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Purchase,
    Pay,
    Cancel,
    /// `GET /healthz`: the HTTP ceiling (`--ceiling`).
    Healthz,
}

impl Op {
    pub const ALL: [Op; 4] = [Op::Purchase, Op::Pay, Op::Cancel, Op::Healthz];

    pub fn name(self) -> &'static str {
        match self {
            Op::Purchase => "purchase",
            Op::Pay => "pay",
            Op::Cancel => "cancel",
            Op::Healthz => "healthz",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Whole milliseconds of `d`, saturating (a run is at most an hour).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// One step of the run's timeline: answers by status class, orders created, attempts
/// dropped.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    /// Where the step starts, in milliseconds since the start of the load.
    pub start_ms: u64,
    /// 2xx answers of every kind.
    pub ok: u64,
    /// 4xx answers (sold_out, limit_exceeded, … — the expected rejections).
    pub rejected: u64,
    /// 5xx answers (503: unavailable or outcome unknown).
    pub unavailable: u64,
    /// Exchanges that got no HTTP answer (connect error, reset, client timeout).
    pub transport_errors: u64,
    /// 201 answers to purchases: orders created.
    pub orders: u64,
    /// Open loop: attempts not sent because the in-flight cap was reached.
    pub dropped: u64,
    /// The server's highest resident memory measured in this step, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_kb: Option<u64>,
}

/// Statistics of one kind of request.
#[derive(Debug, Clone)]
pub struct OpStats {
    pub latency: Histogram<u64>,
    /// HTTP status → count; 0 stands for "no HTTP answer".
    pub statuses: BTreeMap<u16, u64>,
    /// Error code of the JSON body → count.
    pub errors: BTreeMap<String, u64>,
}

fn histogram() -> Histogram<u64> {
    // The bounds are constants known to be valid (1 ≤ 2 × 1 ≤ max, sigfig ≤ 5), so this
    // cannot fail.
    Histogram::new_with_bounds(1, LATENCY_MAX_US, LATENCY_SIGFIG)
        .expect("constant histogram bounds are valid")
}

impl Default for OpStats {
    fn default() -> Self {
        Self {
            latency: histogram(),
            statuses: BTreeMap::new(),
            errors: BTreeMap::new(),
        }
    }
}

/// What one target of the load (one base URL) got of the run's main requests:
/// purchases, or `GET /healthz` for the ceiling. Follow-ups (pay, cancel) go to the
/// target of their purchase but are not counted here, so that the exchanges can be set
/// against that server's own count of its purchase answers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TargetStats {
    /// Attempts sent to it (each once, however often it was re-sent).
    pub attempts: u64,
    /// Attempts by the HTTP status of their last exchange; 0 is no answer even after
    /// the last re-send: the outcome is unknown, neither an order nor a refusal.
    pub outcomes: BTreeMap<u16, u64>,
    /// Every exchange (re-sends included) by HTTP status; 0 is no HTTP answer.
    pub statuses: BTreeMap<u16, u64>,
    /// Error code of every exchange's JSON answer → count.
    pub errors: BTreeMap<String, u64>,
}

impl TargetStats {
    /// Attempts that ended without a definite answer: none at all (0), or a 5xx still
    /// after the last re-send. Each may have taken stock that no answer accounts for.
    pub fn unknown(&self) -> u64 {
        self.outcomes
            .iter()
            .filter(|(status, _)| **status == 0 || (500..=599).contains(*status))
            .map(|(_, n)| n)
            .sum()
    }

    fn add(&mut self, other: TargetStats) {
        self.attempts += other.attempts;
        for (map, theirs) in [
            (&mut self.outcomes, other.outcomes),
            (&mut self.statuses, other.statuses),
        ] {
            for (status, n) in theirs {
                *map.entry(status).or_default() += n;
            }
        }
        for (code, n) in other.errors {
            *self.errors.entry(code).or_default() += n;
        }
    }
}

/// An acknowledged request_id answered with another order than before.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conflict {
    pub intent: u64,
    pub first_order: i64,
    pub other_order: i64,
}

/// Everything one shard of the load records. The load keeps several shards (by intent)
/// so concurrent tasks rarely wait on one lock; [`Recorder::merge`] joins them.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    pub ops: [OpStats; 4],
    pub timeline: Timeline,
    /// intent → the order id its purchase was acknowledged with (201 or 200).
    pub acks: HashMap<u64, i64>,
    pub conflicts: Vec<Conflict>,
    pub conflicts_total: u64,
    /// Purchases answered 201.
    pub created: u64,
    /// Purchases answered 200 (a replay of an accepted request_id).
    pub replayed: u64,
    /// Re-sends after a 503 or a transport error.
    pub retries_503: u64,
    /// Exchanges still 503 / unanswered after the last allowed retry.
    pub gave_up: u64,
    /// Open loop: attempts not sent because the in-flight cap was reached.
    pub dropped: u64,
    pub paid: u64,
    pub cancelled: u64,
    pub left_to_expire: u64,
    /// (order id, user id) of a sample of the orders left to expire.
    pub expire_sample: Vec<(i64, i64)>,
    /// By target index (the load's base URLs in order); a target that got nothing yet
    /// may be missing from the end.
    pub targets: Vec<TargetStats>,
}

/// The run over time, in steps of equal length: the finest step
/// ([`TIMELINE_STEP_MIN_MS`]) that keeps the run within [`TIMELINE_BUCKETS_MAX`] buckets,
/// so a quick run's charts have as many points as a long one's. The step doubles, merging
/// neighbours, whenever the run outgrows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    step_ms: u64,
    buckets: Vec<Bucket>,
}

impl Default for Timeline {
    fn default() -> Self {
        Self {
            step_ms: TIMELINE_STEP_MIN_MS,
            buckets: Vec::new(),
        }
    }
}

impl Timeline {
    pub fn step_ms(&self) -> u64 {
        self.step_ms
    }

    pub fn buckets(&self) -> &[Bucket] {
        &self.buckets
    }

    /// The bucket of the instant `at_ms` after the start, the step grown first if the
    /// run has outgrown it.
    fn at(&mut self, at_ms: u64) -> &mut Bucket {
        while at_ms / self.step_ms >= TIMELINE_BUCKETS_MAX as u64 {
            self.coarsen();
        }
        let index = (at_ms / self.step_ms) as usize;
        while self.buckets.len() <= index {
            let start_ms = self.buckets.len() as u64 * self.step_ms;
            self.buckets.push(Bucket {
                start_ms,
                ..Bucket::default()
            });
        }
        &mut self.buckets[index]
    }

    /// Doubles the step: each pair of neighbours becomes one bucket.
    fn coarsen(&mut self) {
        self.step_ms *= 2;
        let mut merged: Vec<Bucket> = Vec::with_capacity(self.buckets.len().div_ceil(2));
        for b in self.buckets.drain(..) {
            let start_ms = b.start_ms - b.start_ms % self.step_ms;
            match merged.last_mut() {
                Some(last) if last.start_ms == start_ms => last.add(&b),
                _ => merged.push(Bucket { start_ms, ..b }),
            }
        }
        self.buckets = merged;
    }

    /// Adds another shard's timeline, both brought to the coarser step first.
    fn merge(&mut self, mut other: Timeline) {
        while self.step_ms < other.step_ms {
            self.coarsen();
        }
        while other.step_ms < self.step_ms {
            other.coarsen();
        }
        for b in other.buckets {
            self.at(b.start_ms).add(&b);
        }
    }
}

impl Bucket {
    fn add(&mut self, other: &Bucket) {
        self.ok += other.ok;
        self.rejected += other.rejected;
        self.unavailable += other.unavailable;
        self.transport_errors += other.transport_errors;
        self.orders += other.orders;
        self.dropped += other.dropped;
        self.rss_kb = self.rss_kb.max(other.rss_kb);
    }
}

impl Recorder {
    /// Records one exchange: `status` 0 means no HTTP answer.
    pub fn record(
        &mut self,
        op: Op,
        status: u16,
        error: Option<&str>,
        latency: Duration,
        at: Duration,
    ) {
        let stats = &mut self.ops[op.index()];
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        stats
            .latency
            .saturating_record(micros.clamp(1, LATENCY_MAX_US));
        *stats.statuses.entry(status).or_default() += 1;
        if let Some(code) = error {
            match stats.errors.get_mut(code) {
                Some(n) => *n += 1,
                None => {
                    stats.errors.insert(code.to_owned(), 1);
                }
            }
        }
        let bucket = self.timeline.at(millis(at));
        match status {
            0 => bucket.transport_errors += 1,
            200..=299 => bucket.ok += 1,
            500..=599 => bucket.unavailable += 1,
            _ => bucket.rejected += 1,
        }
        if op == Op::Purchase && status == 201 {
            bucket.orders += 1;
        }
    }

    fn target(&mut self, target: usize) -> &mut TargetStats {
        if self.targets.len() <= target {
            self.targets.resize_with(target + 1, TargetStats::default);
        }
        &mut self.targets[target]
    }

    /// Records one exchange of a main request (purchase or `GET /healthz`) with
    /// `target`: `status` 0 means no HTTP answer. [`Recorder::record`] records it too.
    pub fn record_target_exchange(&mut self, target: usize, status: u16, error: Option<&str>) {
        let t = self.target(target);
        *t.statuses.entry(status).or_default() += 1;
        if let Some(code) = error {
            // No allocation once the code is known: most answers of a rush carry one.
            match t.errors.get_mut(code) {
                Some(n) => *n += 1,
                None => {
                    t.errors.insert(code.to_owned(), 1);
                }
            }
        }
    }

    /// Records an attempt sent to `target` and the status its last exchange ended with
    /// (0: no answer after the last re-send).
    pub fn record_target_attempt(&mut self, target: usize, status: u16) {
        let t = self.target(target);
        t.attempts += 1;
        *t.outcomes.entry(status).or_default() += 1;
    }

    /// Records an attempt the open loop could not send.
    pub fn record_dropped(&mut self, at: Duration) {
        self.dropped += 1;
        self.timeline.at(millis(at)).dropped += 1;
    }

    /// Records that `intent`'s purchase was acknowledged with `order_id`; a different
    /// order id than an earlier acknowledgement is a conflict.
    pub fn acknowledge(&mut self, intent: u64, order_id: i64) {
        match self.acks.get(&intent) {
            Some(&first) if first != order_id => self.conflict(Conflict {
                intent,
                first_order: first,
                other_order: order_id,
            }),
            Some(_) => {}
            None => {
                self.acks.insert(intent, order_id);
            }
        }
    }

    fn conflict(&mut self, c: Conflict) {
        self.conflicts_total += 1;
        if self.conflicts.len() < CONFLICTS_KEPT_MAX {
            self.conflicts.push(c);
        }
    }

    /// Records an order left unpaid to expire.
    pub fn leave_to_expire(&mut self, order_id: i64, user_id: i64) {
        self.left_to_expire += 1;
        if self.expire_sample.len() < EXPIRE_SAMPLE_MAX {
            self.expire_sample.push((order_id, user_id));
        }
    }

    /// Adds `other` into `self`, checking acknowledgements across the two.
    pub fn merge(&mut self, other: Recorder) {
        for (mine, theirs) in self.ops.iter_mut().zip(other.ops) {
            // Same bounds on both sides, so adding cannot fail; saturate if it ever did.
            if mine.latency.add(&theirs.latency).is_err() {
                for v in theirs.latency.iter_recorded() {
                    mine.latency
                        .saturating_record_n(v.value_iterated_to(), v.count_at_value());
                }
            }
            for (s, n) in theirs.statuses {
                *mine.statuses.entry(s).or_default() += n;
            }
            for (e, n) in theirs.errors {
                *mine.errors.entry(e).or_default() += n;
            }
        }
        self.timeline.merge(other.timeline);
        for (intent, order) in other.acks {
            self.acknowledge(intent, order);
        }
        self.conflicts_total += other.conflicts_total;
        for c in other.conflicts {
            if self.conflicts.len() < CONFLICTS_KEPT_MAX {
                self.conflicts.push(c);
            }
        }
        self.created += other.created;
        self.replayed += other.replayed;
        self.retries_503 += other.retries_503;
        self.gave_up += other.gave_up;
        self.dropped += other.dropped;
        self.paid += other.paid;
        self.cancelled += other.cancelled;
        self.left_to_expire += other.left_to_expire;
        for s in other.expire_sample {
            if self.expire_sample.len() < EXPIRE_SAMPLE_MAX {
                self.expire_sample.push(s);
            }
        }
        for (i, t) in other.targets.into_iter().enumerate() {
            self.target(i).add(t);
        }
    }

    /// Notes the server's resident memory `at` after the start (a step keeps its highest).
    pub fn note_rss(&mut self, at: Duration, rss_kb: u64) {
        let bucket = self.timeline.at(millis(at));
        bucket.rss_kb = bucket.rss_kb.max(Some(rss_kb));
    }

    /// Order ids acknowledged for more than one request_id: (order id, intents).
    pub fn shared_orders(&self) -> Vec<(i64, Vec<u64>)> {
        let mut by_order: HashMap<i64, Vec<u64>> = HashMap::new();
        for (&intent, &order) in &self.acks {
            by_order.entry(order).or_default().push(intent);
        }
        let mut shared: Vec<(i64, Vec<u64>)> = by_order
            .into_iter()
            .filter(|(_, intents)| intents.len() > 1)
            .map(|(order, mut intents)| {
                intents.sort_unstable();
                (order, intents)
            })
            .collect();
        shared.sort();
        shared
    }

    pub fn op(&self, op: Op) -> &OpStats {
        &self.ops[op.index()]
    }
}

/// Latency percentiles of one kind of request, in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    pub count: u64,
    pub min_us: u64,
    pub mean_us: f64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
}

/// One point of a percentile curve: `percentile` (0–100) of requests took at most
/// `micros`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CurvePoint {
    pub percentile: f64,
    pub micros: u64,
}

/// The summary of a histogram (all zero when it is empty).
pub fn summarize(h: &Histogram<u64>) -> LatencySummary {
    if h.is_empty() {
        return LatencySummary::default();
    }
    LatencySummary {
        count: h.len(),
        min_us: h.min(),
        mean_us: h.mean(),
        p50_us: h.value_at_quantile(0.50),
        p90_us: h.value_at_quantile(0.90),
        p99_us: h.value_at_quantile(0.99),
        p999_us: h.value_at_quantile(0.999),
        max_us: h.max(),
    }
}

/// Steps per decade of the percentile curve's "nines" axis: enough for a smooth line.
const CURVE_STEPS_PER_NINE: u32 = 10;
/// Deepest percentile on the curve: 99.999%.
const CURVE_NINES_MAX: u32 = 5;

/// The percentile curve of a histogram, evenly spaced on the "nines" axis
/// (0%, …, 90%, …, 99%, …, 99.999%) and ending at 100% (the maximum). Points deeper than
/// the sample can resolve (beyond one request in `count`) are left out, except the last.
pub fn percentile_curve(h: &Histogram<u64>) -> Vec<CurvePoint> {
    if h.is_empty() {
        return Vec::new();
    }
    let mut points = Vec::new();
    let count = h.len() as f64;
    for step in 0..=(CURVE_NINES_MAX * CURVE_STEPS_PER_NINE) {
        let nines = f64::from(step) / f64::from(CURVE_STEPS_PER_NINE);
        let tail = 10f64.powf(-nines);
        if tail * count < 1.0 {
            break;
        }
        let q = 1.0 - tail;
        points.push(CurvePoint {
            percentile: q * 100.0,
            micros: h.value_at_quantile(q),
        });
    }
    points.push(CurvePoint {
        percentile: 100.0,
        micros: h.max(),
    });
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    fn within(value: u64, expected: u64) -> bool {
        // The histogram keeps 3 significant digits: 0.1% (rounded up to 1 µs).
        value.abs_diff(expected) <= (expected / 1000).max(1)
    }

    // Checks histogram → summary on a known distribution: the values 1..=10,000 µs once
    // each give p50 ≈ 5,000, p90 ≈ 9,000, p99 ≈ 9,900, p99.9 ≈ 9,990, max ≈ 10,000,
    // mean ≈ 5,000.5 (within the histogram's 0.1% precision); an empty histogram is all
    // zeros rather than garbage.
    #[test]
    fn summary_of_a_known_distribution() {
        let mut r = Recorder::default();
        for us in 1..=10_000u64 {
            r.record(
                Op::Purchase,
                201,
                None,
                Duration::from_micros(us),
                Duration::ZERO,
            );
        }
        let s = summarize(&r.op(Op::Purchase).latency);
        assert_eq!(s.count, 10_000);
        assert_eq!(s.min_us, 1);
        for (got, want) in [
            (s.p50_us, 5000),
            (s.p90_us, 9000),
            (s.p99_us, 9900),
            (s.p999_us, 9990),
            (s.max_us, 10_000),
        ] {
            assert!(within(got, want), "{got} vs {want}: {s:?}");
        }
        assert!((s.mean_us - 5000.5).abs() < 10.0, "{s:?}");
        assert_eq!(summarize(&histogram()), LatencySummary::default());
    }

    // Checks the percentile curve: it rises monotonically, spans 0% to 100%, stops at the
    // depth the sample resolves (1,000 values: 99.9%, not 99.99%), and ends at the max.
    #[test]
    fn percentile_curve_is_monotonic_and_bounded() {
        let mut h = histogram();
        for us in 1..=1000u64 {
            h.record(us * us).expect("in range");
        }
        let curve = percentile_curve(&h);
        assert_eq!(curve[0].percentile, 0.0);
        let last = curve.last().expect("points");
        assert_eq!(last.percentile, 100.0);
        assert!(within(last.micros, 1_000_000));
        assert!(curve
            .windows(2)
            .all(|w| w[0].percentile < w[1].percentile && w[0].micros <= w[1].micros));
        let deepest = curve[curve.len() - 2].percentile;
        assert!((99.89..99.91).contains(&deepest), "{deepest}");
        assert!(percentile_curve(&histogram()).is_empty());
    }

    // Checks merging shards: counts, statuses, error codes and timeline buckets add up;
    // an intent acknowledged with two order ids in two shards is caught as a conflict;
    // order ids shared by two intents are reported; latencies above the histogram's range
    // are clamped instead of lost.
    #[test]
    fn merge_adds_up_and_catches_conflicts() {
        let mut a = Recorder::default();
        let mut b = Recorder::default();
        let step = Duration::from_millis(TIMELINE_STEP_MIN_MS);
        a.record(
            Op::Purchase,
            201,
            None,
            Duration::from_millis(2),
            Duration::ZERO,
        );
        a.record(
            Op::Purchase,
            409,
            Some("sold_out"),
            Duration::from_millis(1),
            step,
        );
        b.record(
            Op::Purchase,
            409,
            Some("sold_out"),
            Duration::from_millis(1),
            step,
        );
        b.record(Op::Pay, 0, None, Duration::from_secs(10_000), step * 3);
        b.record_dropped(step * 3);
        a.acknowledge(1, 100);
        a.acknowledge(1, 100);
        b.acknowledge(1, 101);
        b.acknowledge(2, 100);
        a.merge(b);
        let p = a.op(Op::Purchase);
        assert_eq!(p.latency.len(), 3);
        assert_eq!(p.statuses[&409], 2);
        assert_eq!(p.errors["sold_out"], 2);
        assert!(a.op(Op::Pay).latency.max() >= LATENCY_MAX_US * 999 / 1000);
        let timeline = a.timeline.buckets();
        assert_eq!(timeline.len(), 4);
        assert_eq!(timeline[1].rejected, 2);
        assert_eq!(timeline[0].orders, 1);
        assert_eq!(timeline[3].transport_errors, 1);
        assert_eq!(timeline[3].dropped, 1);
        assert_eq!(a.dropped, 1);
        assert_eq!(a.conflicts_total, 1);
        assert_eq!(
            a.conflicts[0],
            Conflict {
                intent: 1,
                first_order: 100,
                other_order: 101
            }
        );
        assert_eq!(a.shared_orders(), vec![(100, vec![1, 2])]);
    }

    // Checks the per-target counts: attempts and their last statuses, every exchange's
    // status and error code, by target; merging shards adds them up target by target,
    // including a target one shard never saw.
    #[test]
    fn targets_add_up_across_shards() {
        let mut a = Recorder::default();
        let mut b = Recorder::default();
        a.record_target_exchange(0, 201, None);
        a.record_target_attempt(0, 201);
        a.record_target_exchange(0, 409, Some("sold_out"));
        a.record_target_attempt(0, 409);
        // Target 1: twice no answer, then a 409 after the re-send; then a lost attempt.
        b.record_target_exchange(1, 0, None);
        b.record_target_exchange(1, 409, Some("sold_out"));
        b.record_target_attempt(1, 409);
        b.record_target_exchange(1, 0, None);
        b.record_target_attempt(1, 0);
        b.record_target_exchange(0, 409, Some("sold_out"));
        b.record_target_attempt(0, 409);
        a.merge(b);
        assert_eq!(a.targets.len(), 2);
        let [zero, one] = [&a.targets[0], &a.targets[1]];
        assert_eq!(zero.attempts, 3);
        assert_eq!(zero.outcomes, BTreeMap::from([(201, 1), (409, 2)]));
        assert_eq!(zero.errors["sold_out"], 2);
        assert_eq!(one.attempts, 2);
        assert_eq!(one.outcomes, BTreeMap::from([(0, 1), (409, 1)]));
        assert_eq!(one.statuses, BTreeMap::from([(0, 2), (409, 1)]));
        assert_eq!((zero.unknown(), one.unknown()), (0, 1));
    }

    // Checks the timeline's step follows the run's length: a two-second run keeps the
    // finest step (20 points, where one-second steps would give two), an hour-long
    // run stays within the bucket bound with every answer still counted, and shards that
    // grew to different steps merge at the coarser one without losing a count or moving
    // one to another time.
    #[test]
    fn timeline_step_follows_the_run_length() {
        // A purchase answered `status` in a millisecond, sent `at` into the load.
        let purchase = |rec: &mut Recorder, status: u16, at: Duration| {
            rec.record(Op::Purchase, status, None, Duration::from_millis(1), at);
        };
        let mut quick = Recorder::default();
        for ms in (0..2_000).step_by(10) {
            purchase(&mut quick, 201, Duration::from_millis(ms));
        }
        assert_eq!(quick.timeline.step_ms(), TIMELINE_STEP_MIN_MS);
        assert_eq!(quick.timeline.buckets().len(), 20);
        assert!(quick.timeline.buckets().iter().all(|b| b.orders == 10));

        let mut long = Recorder::default();
        let mut short = Recorder::default();
        for s in 0..RUN_SECONDS_MAX {
            purchase(&mut long, 409, Duration::from_secs(s));
        }
        long.note_rss(Duration::from_secs(7), 5_000);
        long.note_rss(Duration::from_secs(8), 7_000);
        purchase(&mut short, 201, Duration::from_millis(1_850));
        assert!(long.timeline.buckets().len() <= TIMELINE_BUCKETS_MAX);
        assert!(long.timeline.buckets().len() > TIMELINE_BUCKETS_MAX / 2);
        let step = long.timeline.step_ms();
        long.merge(short);
        assert_eq!(long.timeline.step_ms(), step);
        let all: u64 = long.timeline.buckets().iter().map(|b| b.rejected).sum();
        assert_eq!(all, RUN_SECONDS_MAX);
        let first = &long.timeline.buckets()[0];
        assert_eq!(first.start_ms, 0);
        assert_eq!(
            first.orders, 1,
            "the short shard's order lands in the step holding 1.85 s"
        );
        assert_eq!(first.rss_kb, Some(7_000), "a step keeps its highest memory");
        for (i, b) in long.timeline.buckets().iter().enumerate() {
            assert_eq!(b.start_ms, i as u64 * step);
        }
    }
}
