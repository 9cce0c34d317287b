//! The result of a run: the JSON schema (`--json`) and the human summary table.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::stats::{Bucket, CurvePoint, LatencySummary};

/// Names this schema; bump the number on any incompatible change.
pub const SCHEMA: &str = "flashsale-bench/1";

/// Everything a run measured and checked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchResult {
    pub schema: String,
    pub scenario: String,
    /// RFC 3339, when the load started.
    pub started_at: String,
    pub config: RunConfig,
    /// How long the load ran (first send to last answer), in seconds.
    pub elapsed_s: f64,
    pub attempts: AttemptCounts,
    pub throughput: Throughput,
    pub ops: Vec<OpResult>,
    /// Each server the load was spread over (its base URLs in order; one unless several
    /// --base-url or --instances were given): its attempts and how they ended.
    #[serde(default)]
    pub targets: Vec<TargetResult>,
    pub orders: OrderCounts,
    /// The load over time, in steps of `timeline_step_ms` from its start (the step grows
    /// with the run's length: 100 ms for a run under 25 s).
    pub timeline: Vec<Bucket>,
    /// The timeline's step, in milliseconds.
    #[serde(default = "one_second_ms")]
    pub timeline_step_ms: u64,
    pub costs: Costs,
    pub memory: Memory,
    #[serde(default)]
    pub cpu: Cpu,
    /// What the Galera cluster did over the load (`--galera`, `--compare-galera`); None on
    /// one MariaDB.
    #[serde(default)]
    pub galera: Option<GaleraFigures>,
    /// The product's inventory as the API reports it after the run.
    pub inventory: Option<Inventory>,
    pub checks: Checks,
    /// No invariant violation found (client checks and audit).
    pub passed: bool,
}

/// A run's orders count as made early when the last of them came before this share of
/// the load had passed: a rush sells its stock in the first fraction of a second and
/// refuses the rest, and orders per second over the whole load would understate the
/// rate at which it sold by the load's length over that fraction.
const ORDERS_EARLY_SHARE: f64 = 0.5;

/// When every order was made early in the load ([`ORDERS_EARLY_SHARE`]): the time from
/// the load's start to the end of the last timeline step with an order, in seconds (to
/// the step, 100 ms in a short run). None when orders went on through the load, or none
/// were made.
pub fn orders_made_within(r: &BenchResult) -> Option<f64> {
    let last = r.timeline.iter().rev().find(|b| b.orders > 0)?;
    let secs = (last.start_ms + r.timeline_step_ms) as f64 / 1000.0;
    (secs < r.elapsed_s * ORDERS_EARLY_SHARE).then_some(secs)
}

/// A report's step before the timeline's step was recorded: one second.
fn one_second_ms() -> u64 {
    1_000
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    /// "closed" or "open".
    pub mode: String,
    pub connections: Option<u64>,
    pub rate_per_s: Option<f64>,
    pub max_in_flight: Option<u64>,
    pub attempts_max: u64,
    pub duration_max_s: f64,
    pub users: u64,
    pub stock: i64,
    pub per_user_limit: Option<i64>,
    pub retry_share: f64,
    pub pay_share: f64,
    pub cancel_share: f64,
    /// The server's payment timeout, when known (set with --spawn or given).
    pub payment_timeout_ms: Option<u64>,
    pub quick: bool,
    pub spawned: bool,
    /// The first target: the product is created there (the admin calls); `targets` lists
    /// every one.
    pub base_url: String,
    pub product_id: i64,
    pub seed: u64,
    /// What the load sent: "purchase", "healthz" for the HTTP ceiling (`--ceiling`), or
    /// "sql" for the bare SQL transaction (`--sql`: purchases as CALLs straight to
    /// MariaDB, no server).
    #[serde(default = "purchase_target")]
    pub target: String,
    /// The spawned server's purchase strategy (`FLASHSALE_STRATEGY`): "flashsale" or a
    /// baseline; None for the ceiling.
    #[serde(default)]
    pub strategy: Option<String>,
    /// Where the spawned server's ledger lived: "one node" (a private MariaDB) or
    /// "galera" (a private 3-node cluster); None for the server of --database-url.
    #[serde(default)]
    pub database: Option<String>,
}

fn purchase_target() -> String {
    "purchase".into()
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AttemptCounts {
    /// Purchase attempts started (each counted once, however often it was re-sent).
    pub sent: u64,
    /// Attempts with a request_id of their own.
    pub new_intents: u64,
    /// Attempts re-sending an earlier attempt's request_id (--retry-share).
    pub client_retries: u64,
    /// Re-sends after a 503 or a transport error, with the same request_id.
    pub retries_503: u64,
    /// Exchanges still unanswered / 503 after the last allowed re-send.
    pub gave_up: u64,
    /// Open loop: attempts not sent because the in-flight cap was reached.
    pub dropped: u64,
    /// Why the load stopped before every attempt was sent, if it did.
    pub stopped_early: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    /// HTTP answers of every kind per second.
    pub answers_per_s: f64,
    /// Orders created (201) per second.
    pub orders_per_s: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpResult {
    /// "purchase", "pay" or "cancel".
    pub op: String,
    pub latency: LatencySummary,
    /// The percentile curve (for the plot).
    pub curve: Vec<CurvePoint>,
    /// HTTP status → count; "0" is "no HTTP answer".
    pub statuses: BTreeMap<String, u64>,
    /// Error code → count.
    pub errors: BTreeMap<String, u64>,
}

/// What one server of the load (one base URL) got of the run's main requests
/// (purchases, or `GET /healthz` for the ceiling; follow-ups not counted).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TargetResult {
    pub base_url: String,
    /// Attempts sent to it (each once, however often it was re-sent).
    pub attempts: u64,
    /// Attempts by the HTTP status of their last exchange; "0" is no answer even after
    /// the last re-send (a server that stopped answering): the outcome is unknown,
    /// counted neither as an order nor as a refusal.
    pub outcomes: BTreeMap<String, u64>,
    /// Every exchange with it (re-sends included) by HTTP status; "0" is no HTTP answer.
    pub statuses: BTreeMap<String, u64>,
    /// Error code → count, over every exchange with it.
    pub errors: BTreeMap<String, u64>,
}

impl TargetResult {
    /// Attempts whose last exchange ended with a status in `statuses` (0: no answer).
    pub fn ended_in(&self, statuses: std::ops::RangeInclusive<u16>) -> u64 {
        self.outcomes
            .iter()
            .filter(|(s, _)| s.parse::<u16>().is_ok_and(|s| statuses.contains(&s)))
            .map(|(_, n)| n)
            .sum()
    }

    /// Orders it created: attempts answered 201.
    pub fn orders(&self) -> u64 {
        self.ended_in(201..=201)
    }

    /// Attempts with no answer even after the last re-send (a server that stopped
    /// answering).
    pub fn unanswered(&self) -> u64 {
        self.ended_in(0..=0)
    }

    /// Attempts of unknown outcome: no answer, or a 5xx still after the last re-send.
    /// Each may or may not have become an order.
    pub fn unknown(&self) -> u64 {
        self.unanswered() + self.ended_in(500..=599)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OrderCounts {
    /// Distinct request_ids acknowledged with an order (201 or 200).
    pub acknowledged: u64,
    /// Purchases answered 201.
    pub created: u64,
    /// Purchases answered 200 (replays of an accepted request_id).
    pub replayed: u64,
    /// Mixed: orders paid (200) / cancelled (200) / left unpaid to expire.
    pub paid: u64,
    pub cancelled: u64,
    pub left_to_expire: u64,
    /// Mixed: of the sample of orders left to expire, how many were looked at and how
    /// many were found CANCELLED by payment_timeout.
    pub expiry_checked: u64,
    pub expiry_confirmed: u64,
}

/// Cost per successful order, from server-wide counters.
///
/// Redis's `INFO commandstats` counts the commands a Lua script runs as well as the
/// script call itself, so two figures are kept: script calls (EVAL/EVALSHA/FCALL and
/// their read-only forms, one round trip each) and every command Redis executed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Costs {
    /// Script invocations during the load (None when Redis could not be read).
    pub redis_script_calls: Option<u64>,
    /// Every command Redis executed during the load, including those run inside
    /// scripts, minus the bench's own INFO/SCAN calls.
    pub redis_commands: Option<u64>,
    /// The same, per command.
    pub redis_commands_by_command: BTreeMap<String, u64>,
    /// MariaDB `Com_commit` delta (explicit COMMIT statements).
    pub com_commit: Option<u64>,
    /// MariaDB `Handler_commit` delta (storage-engine commits, autocommit included).
    pub handler_commit: Option<u64>,
    /// Per successful order (201).
    pub redis_script_calls_per_order: Option<f64>,
    pub redis_commands_per_order: Option<f64>,
    pub com_commit_per_order: Option<f64>,
    pub handler_commit_per_order: Option<f64>,
    /// Per purchase attempt sent.
    pub redis_script_calls_per_attempt: Option<f64>,
    pub redis_commands_per_attempt: Option<f64>,
    pub note: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Memory {
    /// The server's peak resident memory (VmHWM), kB: only with --spawn or --server-pid
    /// (with --instances, summed over them: an upper bound of their peak together).
    pub server_vm_hwm_kb: Option<u64>,
    /// The server's resident memory at the end of the load (VmRSS), kB.
    pub server_vm_rss_kb: Option<u64>,
    /// Redis `used_memory` before the load, at its end, and after the quiet wait.
    pub redis_used_memory_before: Option<u64>,
    pub redis_used_memory_after: Option<u64>,
    pub redis_used_memory_settled: Option<u64>,
    /// (after − before) / orders created, bytes.
    pub redis_bytes_per_order: Option<f64>,
    /// Keys under the run's Redis prefix before the load (after the product was
    /// created), at its end, and after the quiet wait.
    pub keys_before: Option<u64>,
    pub keys_after: Option<u64>,
    pub keys_settled: Option<u64>,
}

/// CPU time over the load (from its first request sent to its last answer), read from
/// `/proc` (Linux): the server (with --spawn or --server-pid; every instance together
/// with --instances), the generator itself, every Redis, MariaDB and NATS process on the
/// machine, and the whole machine's busy time ("machine": all of the above, the kernel's
/// work for them and anything else running).
/// Work a run leaves behind after its last answer (events still being delivered) is not
/// in it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Cpu {
    /// Seconds of CPU by name: server, generator, redis, mariadb, nats, machine.
    pub seconds: BTreeMap<String, f64>,
    /// The same in µs per request of the run's kind sent (purchase attempts; GET
    /// /healthz for the ceiling).
    pub us_per_attempt: BTreeMap<String, f64>,
    /// The same in µs per order created (empty when none was).
    pub us_per_order: BTreeMap<String, f64>,
}

/// The order the CPU figures are printed in: the private database's nodes that served
/// the run ("node0" the writer; `crate::nodes`) and the one that idled ("db-idle") after
/// every other MariaDB.
pub const CPU_NAMES: [&str; 10] = [
    "server",
    "generator",
    "redis",
    "mariadb",
    "node0",
    "node1",
    "node2",
    "db-idle",
    "nats",
    "machine",
];

/// What a private Galera cluster did over the load: deltas of its `wsrep_` status
/// counters (`SHOW GLOBAL STATUS`, read on every node before and after the load; the
/// writer is node 0), and the averages Galera keeps since a `FLUSH STATUS`, which the
/// bench sends just before the load.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GaleraFigures {
    /// Writesets the writer replicated (`wsrep_replicated`): one per transaction that
    /// wrote, each certified on every node before its COMMIT returns.
    pub writesets: Option<u64>,
    /// Their bytes (`wsrep_replicated_bytes`).
    pub replicated_bytes: Option<u64>,
    /// Per order created.
    pub writesets_per_order: Option<f64>,
    pub bytes_per_order: Option<f64>,
    /// Share of the load's time replication was paused by flow control
    /// (`wsrep_flow_control_paused_ns` over the load's wall time, on the writer).
    pub flow_control_paused: Option<f64>,
    /// Flow-control pauses the nodes asked for (`wsrep_flow_control_sent`, all nodes).
    pub flow_control_sent: Option<u64>,
    /// The writer's send queue, averaged over the load (`wsrep_local_send_queue_avg`).
    pub send_queue_avg: Option<f64>,
    /// The longest of the other nodes' receive queues, averaged over the load
    /// (`wsrep_local_recv_queue_avg`): writesets waiting to be applied.
    pub recv_queue_avg: Option<f64>,
    /// Transactions certification or a replicated write aborted
    /// (`wsrep_local_cert_failures` + `wsrep_local_bf_aborts`, all nodes).
    pub conflicts: Option<u64>,
    /// Causality waits on the writer (`wsrep_causal_reads`): each read or BEGIN of a
    /// session with `wsrep_sync_wait` set waits until the node has applied every writeset
    /// certified before it. Per order created.
    #[serde(default)]
    pub sync_waits_per_order: Option<f64>,
}

/// "server 10.8 (kernel 4.1), generator 14.8, …, machine 27.1 µs" for one of `Cpu`'s
/// per-unit maps, in `CPU_NAMES` order, the names measured only; the server's kernel
/// time ([`crate::probes::SERVER_KERNEL`]) is a part of its figure, in brackets.
pub fn cpu_line(per: &BTreeMap<String, f64>) -> String {
    let parts: Vec<String> = CPU_NAMES
        .iter()
        .filter_map(|name| {
            let v = per.get(*name)?;
            Some(match per.get(crate::probes::SERVER_KERNEL) {
                Some(kernel) if *name == "server" => format!("{name} {v:.1} (kernel {kernel:.1})"),
                _ => format!("{name} {v:.1}"),
            })
        })
        .collect();
    format!("{} µs", parts.join(", "))
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    pub total: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Checks {
    /// Violations found by the client's own checks (empty when none).
    pub client_violations: Vec<String>,
    /// Client checks that passed, as one line each.
    pub client_passed: Vec<String>,
    /// Checks not run, each with the reason (the baselines write no reservation rows or
    /// Redis holds; the ceiling makes no orders).
    #[serde(default)]
    pub skipped: Vec<String>,
    pub audit: AuditOutcome,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AuditOutcome {
    /// "passed", "failed", "skipped" or "error".
    pub status: String,
    /// How many times the audit ran (it is repeated while the system settles).
    pub runs: u32,
    /// The last run's output (stdout and stderr).
    pub output: String,
}

impl BenchResult {
    pub fn op(&self, name: &str) -> Option<&OpResult> {
        self.ops.iter().find(|o| o.op == name)
    }

    /// The HTTP-ceiling run (`GET /healthz` instead of purchases).
    pub fn is_ceiling(&self) -> bool {
        self.config.target == "healthz"
    }

    /// Whether the run's checks judge anything: a ceiling (`GET /healthz`, or the
    /// purchase endpoint with no store behind it) makes no order, so it passes no
    /// invariant — it only measures the HTTP path.
    pub fn judged(&self) -> bool {
        !self.is_ceiling() && self.config.strategy.as_deref() != Some("http-post-ceiling")
    }

    /// The bare SQL run (`--sql`: purchases called on MariaDB by the bench itself).
    pub fn is_sql(&self) -> bool {
        self.config.target == "sql"
    }

    /// The kind of request the load was made of: purchase (the SQL run's too), or healthz
    /// for the ceiling.
    pub fn main_op(&self) -> Option<&OpResult> {
        if self.is_sql() {
            self.op("purchase")
        } else {
            self.op(&self.config.target)
        }
    }

    /// The row's name: the strategy, `http-ceiling` or `sql-conditional`.
    pub fn label(&self) -> String {
        if self.is_ceiling() {
            crate::cli::CEILING_LABEL.to_owned()
        } else if self.is_sql() {
            crate::cli::SQL_LABEL.to_owned()
        } else {
            self.config
                .strategy
                .clone()
                .unwrap_or_else(|| "flashsale".to_owned())
        }
    }
}

/// Microseconds as a short human figure ("850µs", "12.3ms", "1.20s").
pub fn human_us(us: u64) -> String {
    if us < 1000 {
        format!("{us}µs")
    } else if us < 1_000_000 {
        format!("{:.2}ms", us as f64 / 1000.0)
    } else {
        format!("{:.2}s", us as f64 / 1_000_000.0)
    }
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "n/a".to_owned(), |v| v.to_string())
}

fn opt_f(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.digits$}"))
}

fn bytes(v: Option<u64>) -> String {
    v.map_or_else(
        || "n/a".to_owned(),
        |b| format!("{:.1} MB", b as f64 / 1_048_576.0),
    )
}

/// The summary table printed at the end of a run.
pub fn summary_table(r: &BenchResult) -> String {
    let mut out = String::new();
    summary_heading(&mut out, r);
    let _ = writeln!(out);
    latency_lines(&mut out, r);
    if r.targets.len() > 1 {
        let _ = writeln!(out);
        targets_table(&mut out, r);
    }
    let _ = writeln!(out);
    if r.is_ceiling() {
        let _ = writeln!(
            out,
            "orders, inventory, cost per order: n/a (HTTP ceiling: GET /healthz, no purchase sent)"
        );
    } else {
        orders_and_costs(&mut out, r);
    }
    memory_and_cpu_lines(&mut out, r);
    if let Some(g) = &r.galera {
        galera_line(&mut out, g);
    }
    let _ = writeln!(out);
    check_lines(&mut out, r);
    out
}

/// The summary's first lines: what ran (scenario, load, strategy), the attempts and
/// the throughput.
fn summary_heading(out: &mut String, r: &BenchResult) {
    let c = &r.config;
    let mode = match (c.mode.as_str(), c.connections, c.rate_per_s) {
        ("open", _, Some(rate)) => {
            format!("open loop {rate}/s, in-flight cap {}", opt(c.max_in_flight))
        }
        (_, Some(n), _) => format!("closed loop, {n} connections"),
        _ => c.mode.clone(),
    };
    let quick = if c.quick { " (quick)" } else { "" };
    if r.is_ceiling() {
        let _ = writeln!(
            out,
            "flashsale-bench {} — {mode}{quick} — HTTP ceiling: GET /healthz instead of purchases",
            r.scenario,
        );
    } else {
        let strategy = if r.is_sql() {
            format!(
                "{} (CALL baseline_conditional on MariaDB, no server)",
                crate::cli::SQL_LABEL
            )
        } else {
            c.strategy.as_deref().unwrap_or("flashsale").to_owned()
        };
        let _ = writeln!(
            out,
            "flashsale-bench {} — {mode}{quick} — strategy {strategy} — product {} stock {} — {} users, retry share {}",
            r.scenario, c.product_id, c.stock, c.users, c.retry_share
        );
    }
    let a = &r.attempts;
    let _ = writeln!(
        out,
        "attempts {} ({} new, {} client retries) in {:.2}s · 503/transport re-sends {} · gave up {} · dropped {}{}",
        a.sent,
        a.new_intents,
        a.client_retries,
        r.elapsed_s,
        a.retries_503,
        a.gave_up,
        a.dropped,
        a.stopped_early
            .as_ref()
            .map_or_else(String::new, |s| format!(" · stopped early: {s}"))
    );
    let _ = match orders_made_within(r) {
        Some(secs) => writeln!(
            out,
            "throughput {:.0} answers/s · {} orders, all made in the first {secs:.2} s",
            r.throughput.answers_per_s, r.orders.created
        ),
        None => writeln!(
            out,
            "throughput {:.0} answers/s · {:.0} orders/s",
            r.throughput.answers_per_s, r.throughput.orders_per_s
        ),
    };
}

/// Each kind of request's latency percentiles, statuses and error codes.
fn latency_lines(out: &mut String, r: &BenchResult) {
    let _ = writeln!(
        out,
        "{:<9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}  statuses / errors",
        "op", "answers", "p50", "p90", "p99", "p99.9", "max"
    );
    for o in &r.ops {
        let l = &o.latency;
        let statuses: Vec<String> = o.statuses.iter().map(|(s, n)| format!("{s}:{n}")).collect();
        let errors: Vec<String> = o.errors.iter().map(|(e, n)| format!("{e}:{n}")).collect();
        let _ = writeln!(
            out,
            "{:<9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}  {}{}{}",
            o.op,
            l.count,
            human_us(l.p50_us),
            human_us(l.p90_us),
            human_us(l.p99_us),
            human_us(l.p999_us),
            human_us(l.max_us),
            statuses.join(" "),
            if errors.is_empty() { "" } else { " / " },
            errors.join(" ")
        );
    }
}

/// The memory line (the server's; Redis's and the keys' too, but for the ceiling), the
/// cost note, and the CPU lines.
fn memory_and_cpu_lines(out: &mut String, r: &BenchResult) {
    let m = &r.memory;
    let kb = |v: Option<u64>| {
        v.map_or_else(
            || "n/a".to_owned(),
            |k| format!("{:.1} MB", k as f64 / 1024.0),
        )
    };
    if r.is_ceiling() {
        let _ = writeln!(
            out,
            "memory: server peak {} (VmHWM), end {}",
            kb(m.server_vm_hwm_kb),
            kb(m.server_vm_rss_kb)
        );
    } else {
        let _ = writeln!(
            out,
            "memory: server peak {} (VmHWM), end {} · Redis used_memory {} → {} → {} settled ({} B/order) · keys under prefix {} → {} → {} settled",
            kb(m.server_vm_hwm_kb),
            kb(m.server_vm_rss_kb),
            bytes(m.redis_used_memory_before),
            bytes(m.redis_used_memory_after),
            bytes(m.redis_used_memory_settled),
            opt_f(m.redis_bytes_per_order, 0),
            opt(m.keys_before),
            opt(m.keys_after),
            opt(m.keys_settled),
        );
        let _ = writeln!(out, "note: {}", r.costs.note);
    }
    if !r.cpu.us_per_attempt.is_empty() {
        let _ = writeln!(
            out,
            "CPU per {}: {}",
            if r.is_ceiling() { "request" } else { "attempt" },
            cpu_line(&r.cpu.us_per_attempt)
        );
    }
    if !r.cpu.us_per_order.is_empty() {
        let _ = writeln!(out, "CPU per order: {}", cpu_line(&r.cpu.us_per_order));
    }
}

/// The checks one a line, the audit's verdict, and the run's.
fn check_lines(out: &mut String, r: &BenchResult) {
    for line in &r.checks.client_passed {
        let _ = writeln!(out, "check ok: {line}");
    }
    for line in &r.checks.skipped {
        let _ = writeln!(out, "check skipped: {line}");
    }
    for line in &r.checks.client_violations {
        let _ = writeln!(out, "CHECK FAILED: {line}");
    }
    let _ = writeln!(
        out,
        "audit: {} ({} run{})",
        r.checks.audit.status,
        r.checks.audit.runs,
        if r.checks.audit.runs == 1 { "" } else { "s" }
    );
    let _ = writeln!(
        out,
        "{}",
        match (r.passed, r.judged()) {
            (true, true) => "RESULT: PASS — no invariant violation",
            (true, false) => "RESULT: NOT JUDGED — a ceiling run makes no order: it measures the HTTP path, no invariant is checked",
            (false, _) => "RESULT: FAIL — see the violations above",
        }
    );
}

/// The table of a run spread over several servers: each one's attempts by how they
/// ended (their last exchange's status class), the unknown ones apart.
fn targets_table(out: &mut String, r: &BenchResult) {
    type Column = (&'static str, fn(&TargetResult) -> u64);
    let columns: &[Column] = if r.is_ceiling() {
        &[
            ("2xx", |t| t.ended_in(200..=299)),
            ("4xx", |t| t.ended_in(400..=499)),
            ("5xx", |t| t.ended_in(500..=599)),
            ("no answer", TargetResult::unanswered),
        ]
    } else {
        &[
            ("orders 201", TargetResult::orders),
            ("replays 200", |t| t.ended_in(200..=200)),
            ("refused 4xx", |t| t.ended_in(400..=499)),
            ("5xx", |t| t.ended_in(500..=599)),
            ("no answer", TargetResult::unanswered),
        ]
    };
    let width = r
        .targets
        .iter()
        .map(|t| t.base_url.len())
        .chain(["target".len()])
        .max()
        .unwrap_or(0);
    let _ = write!(out, "{:<width$} {:>9}", "target", "attempts");
    for (name, _) in columns {
        let _ = write!(out, " {name:>11}");
    }
    let _ = writeln!(out);
    for t in &r.targets {
        let _ = write!(out, "{:<width$} {:>9}", t.base_url, t.attempts);
        for (_, value) in columns {
            let _ = write!(out, " {:>11}", value(t));
        }
        let _ = writeln!(out);
    }
    if r.targets.iter().any(|t| t.unanswered() > 0) {
        let _ = writeln!(
            out,
            "no answer: an attempt's last exchange (re-sent to the same server) got no HTTP answer — the server stopped answering or the connection broke; its outcome is unknown, counted neither as an order nor as a refusal"
        );
    }
}

/// The line of a run on a Galera cluster: what replication carried and how it waited.
fn galera_line(out: &mut String, g: &GaleraFigures) {
    let _ = writeln!(
        out,
        "galera: {} writesets replicated ({} per order, {} B per order) · {} causality waits per order · flow control paused {} of the load, {} pauses asked · send queue {} · apply queue {} · conflicts {}",
        opt(g.writesets),
        opt_f(g.writesets_per_order, 3),
        opt_f(g.bytes_per_order, 0),
        opt_f(g.sync_waits_per_order, 3),
        g.flow_control_paused
            .map_or_else(|| "n/a".to_owned(), |p| format!("{:.1} %", p * 100.0)),
        opt(g.flow_control_sent),
        opt_f(g.send_queue_avg, 2),
        opt_f(g.recv_queue_avg, 2),
        opt(g.conflicts),
    );
}

/// The orders, inventory and cost lines of a purchase run's summary.
fn orders_and_costs(out: &mut String, r: &BenchResult) {
    let o = &r.orders;
    let _ = writeln!(
        out,
        "orders: {} acknowledged ({} created 201, {} replays 200)",
        o.acknowledged, o.created, o.replayed
    );
    if o.paid + o.cancelled + o.left_to_expire > 0 {
        let _ = writeln!(
            out,
            "        {} paid, {} cancelled, {} left to expire ({} of {} sampled found expired)",
            o.paid, o.cancelled, o.left_to_expire, o.expiry_confirmed, o.expiry_checked
        );
    }
    if let Some(i) = &r.inventory {
        let _ = writeln!(
            out,
            "inventory: total {} available {} reserved {} sold {}",
            i.total, i.available, i.reserved, i.sold
        );
    }
    let k = &r.costs;
    let _ = writeln!(
        out,
        "cost per order: Redis {} script calls, {} commands (incl. inside scripts) · MariaDB {} Com_commit, {} Handler_commit",
        opt_f(k.redis_script_calls_per_order, 3),
        opt_f(k.redis_commands_per_order, 3),
        opt_f(k.com_commit_per_order, 3),
        opt_f(k.handler_commit_per_order, 3),
    );
    let _ = writeln!(
        out,
        "cost per attempt: Redis {} script calls, {} commands · totals: {} script calls, {} commands, {} Com_commit, {} Handler_commit",
        opt_f(k.redis_script_calls_per_attempt, 3),
        opt_f(k.redis_commands_per_attempt, 3),
        opt(k.redis_script_calls),
        opt(k.redis_commands),
        opt(k.com_commit),
        opt(k.handler_commit),
    );
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    // Checks the CPU line: names in CPU_NAMES order, only those measured, and the
    // server's kernel time in brackets after the server's figure when it was read.
    #[test]
    fn cpu_line_puts_the_servers_kernel_time_in_brackets() {
        let mut per = BTreeMap::from([
            ("machine".to_owned(), 27.14),
            ("server".to_owned(), 10.8),
            ("generator".to_owned(), 14.8),
        ]);
        assert_eq!(
            cpu_line(&per),
            "server 10.8, generator 14.8, machine 27.1 µs"
        );
        per.insert(crate::probes::SERVER_KERNEL.to_owned(), 4.06);
        assert_eq!(
            cpu_line(&per),
            "server 10.8 (kernel 4.1), generator 14.8, machine 27.1 µs"
        );
    }

    /// A result with every field filled in, values exactly representable in JSON.
    pub(crate) fn sample() -> BenchResult {
        BenchResult {
            schema: SCHEMA.into(),
            scenario: "mixed".into(),
            started_at: "2026-11-29T10:00:00Z".into(),
            config: RunConfig {
                mode: "open".into(),
                connections: None,
                rate_per_s: Some(2500.5),
                max_in_flight: Some(512),
                attempts_max: 3000,
                duration_max_s: 40.0,
                users: 1000,
                stock: 600,
                per_user_limit: None,
                retry_share: 0.125,
                pay_share: 0.5,
                cancel_share: 0.25,
                payment_timeout_ms: Some(2000),
                quick: true,
                spawned: true,
                base_url: "http://127.0.0.1:1234".into(),
                product_id: 1,
                seed: 7,
                target: "purchase".into(),
                strategy: Some("flashsale".into()),
                database: None,
            },
            elapsed_s: 1.25,
            attempts: AttemptCounts {
                sent: 3000,
                new_intents: 2700,
                client_retries: 300,
                retries_503: 3,
                gave_up: 0,
                dropped: 2,
                stopped_early: Some("duration".into()),
            },
            throughput: Throughput {
                answers_per_s: 2400.0,
                orders_per_s: 480.0,
            },
            ops: vec![OpResult {
                op: "purchase".into(),
                latency: LatencySummary {
                    count: 3000,
                    min_us: 100,
                    mean_us: 900.5,
                    p50_us: 800,
                    p90_us: 1500,
                    p99_us: 4000,
                    p999_us: 9000,
                    max_us: 12_000,
                },
                curve: vec![
                    CurvePoint {
                        percentile: 0.0,
                        micros: 100,
                    },
                    CurvePoint {
                        percentile: 100.0,
                        micros: 12_000,
                    },
                ],
                statuses: BTreeMap::from([("201".into(), 600), ("409".into(), 2400)]),
                errors: BTreeMap::from([("sold_out".into(), 2400)]),
            }],
            targets: vec![TargetResult {
                base_url: "http://127.0.0.1:1234".into(),
                attempts: 3000,
                outcomes: BTreeMap::from([("201".into(), 600), ("409".into(), 2400)]),
                statuses: BTreeMap::from([("201".into(), 600), ("409".into(), 2400)]),
                errors: BTreeMap::from([("sold_out".into(), 2400)]),
            }],
            orders: OrderCounts {
                acknowledged: 600,
                created: 600,
                replayed: 20,
                paid: 300,
                cancelled: 120,
                left_to_expire: 180,
                expiry_checked: 180,
                expiry_confirmed: 180,
            },
            timeline: vec![
                Bucket {
                    start_ms: 0,
                    ok: 500,
                    rejected: 1500,
                    unavailable: 1,
                    transport_errors: 0,
                    orders: 400,
                    dropped: 2,
                    rss_kb: Some(20_480),
                },
                Bucket {
                    start_ms: 1_000,
                    ok: 100,
                    rejected: 900,
                    rss_kb: None,
                    ..Bucket::default()
                },
            ],
            timeline_step_ms: 1_000,
            costs: Costs {
                redis_script_calls: Some(3000),
                redis_commands: Some(18_000),
                redis_commands_by_command: BTreeMap::from([
                    ("evalsha".into(), 3000),
                    ("hmget".into(), 15_000),
                ]),
                com_commit: Some(600),
                handler_commit: Some(1300),
                redis_script_calls_per_order: Some(5.0),
                redis_commands_per_order: Some(30.0),
                com_commit_per_order: Some(1.0),
                handler_commit_per_order: Some(2.25),
                redis_script_calls_per_attempt: Some(1.0),
                redis_commands_per_attempt: Some(6.0),
                note: "server-wide counters".into(),
            },
            memory: Memory {
                server_vm_hwm_kb: Some(40_000),
                server_vm_rss_kb: Some(38_000),
                redis_used_memory_before: Some(1_000_000),
                redis_used_memory_after: Some(1_100_000),
                redis_used_memory_settled: Some(1_050_000),
                redis_bytes_per_order: Some(166.5),
                keys_before: Some(3),
                keys_after: Some(603),
                keys_settled: Some(603),
            },
            cpu: Cpu {
                seconds: BTreeMap::from([("server".into(), 0.3), ("machine".into(), 1.2)]),
                us_per_attempt: BTreeMap::from([
                    ("server".into(), 100.0),
                    ("machine".into(), 400.0),
                ]),
                us_per_order: BTreeMap::from([
                    ("server".into(), 500.0),
                    ("machine".into(), 2000.0),
                ]),
            },
            galera: Some(GaleraFigures {
                writesets: Some(30),
                replicated_bytes: Some(60_000),
                writesets_per_order: Some(0.05),
                bytes_per_order: Some(100.0),
                flow_control_paused: Some(0.125),
                flow_control_sent: Some(2),
                send_queue_avg: Some(0.5),
                recv_queue_avg: Some(1.25),
                conflicts: Some(0),
                sync_waits_per_order: Some(0.1),
            }),
            inventory: Some(Inventory {
                total: 600,
                available: 300,
                reserved: 0,
                sold: 300,
            }),
            checks: Checks {
                client_violations: vec![],
                client_passed: vec!["no request_id answered with two order ids".into()],
                skipped: vec![],
                audit: AuditOutcome {
                    status: "passed".into(),
                    runs: 1,
                    output: "no violations\n".into(),
                },
            },
            passed: true,
        }
    }

    /// The sample turned into an HTTP-ceiling run: healthz for its target and its one
    /// op, no strategy.
    pub(crate) fn ceiling_sample() -> BenchResult {
        let mut r = sample();
        r.config.target = "healthz".into();
        r.config.strategy = None;
        r.ops[0].op = "healthz".into();
        r
    }

    // Checks the JSON schema round trip: a result with every field set serializes and
    // parses back to an equal value; the file carries the schema name and the documented
    // top-level keys; a bucket without rss_kb and a result without targets parse (the
    // fields are optional).
    #[test]
    fn json_round_trip() {
        let r = sample();
        let text = serde_json::to_string_pretty(&r).expect("serialize");
        let back: BenchResult = serde_json::from_str(&text).expect("parse back");
        assert_eq!(back, r);
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["schema"], SCHEMA);
        for key in [
            "scenario",
            "config",
            "elapsed_s",
            "attempts",
            "throughput",
            "ops",
            "orders",
            "timeline",
            "costs",
            "memory",
            "inventory",
            "checks",
            "passed",
        ] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        assert!(v["timeline"][1].get("rss_kb").is_none());
        assert_eq!(v["targets"][0]["outcomes"]["201"], 600);
        // A file written before the per-server counts parses, with none.
        let mut older = v.clone();
        older.as_object_mut().expect("object").remove("targets");
        let parsed: BenchResult = serde_json::from_value(older).expect("parse without targets");
        assert!(parsed.targets.is_empty());
        let bucket: Bucket =
            serde_json::from_str(r#"{"start_ms":3000,"ok":1,"rejected":0,"unavailable":0,"transport_errors":0,"orders":1,"dropped":0}"#)
                .expect("bucket without rss");
        assert_eq!(bucket.rss_kb, None);
    }

    // Checks the summary of an HTTP-ceiling run, by rendering the sample turned into one
    // (target healthz): it says so in its first line, lists the healthz latencies, has no
    // order, inventory or cost-per-order figures (one n/a line instead) and lists the
    // skipped checks.
    #[test]
    fn ceiling_summary_has_no_order_figures() {
        let mut r = ceiling_sample();
        r.checks.client_passed.clear();
        r.checks.skipped = vec!["order checks and audit: no purchase".into()];
        let text = summary_table(&r);
        assert!(text
            .lines()
            .next()
            .is_some_and(|l| l.contains("HTTP ceiling: GET /healthz")));
        assert!(text.contains("\nhealthz "), "{text}");
        assert!(text.contains("cost per order: n/a"), "{text}");
        for absent in [
            "orders: ",
            "inventory: ",
            "Redis 5.000 script calls",
            "Redis used_memory",
        ] {
            assert!(!text.contains(absent), "{absent:?} in\n{text}");
        }
        assert!(text.contains("check skipped: order checks and audit: no purchase"));
    }

    // Checks the per-server table of the summary, by rendering the sample with two
    // targets, the second of which lost 30 attempts (no answer): a row per base URL with
    // its attempts, orders and refusals, the unknown attempts in their own column and a
    // line saying they are neither orders nor refusals; the single-target sample has no
    // such table.
    #[test]
    fn summary_has_a_row_per_server() {
        let mut r = sample();
        let mut second = r.targets[0].clone();
        second.base_url = "http://127.0.0.1:5678".into();
        second.attempts = 1000;
        second.outcomes =
            BTreeMap::from([("0".into(), 30), ("201".into(), 70), ("409".into(), 900)]);
        r.targets.push(second);
        let text = summary_table(&r);
        let row = |url: &str| {
            text.lines()
                .find(|l| l.starts_with(url))
                .unwrap_or_else(|| panic!("no row for {url} in\n{text}"))
                .split_whitespace()
                .skip(1)
                .map(|v| v.parse::<u64>().expect("a count"))
                .collect::<Vec<_>>()
        };
        // attempts, orders 201, replays 200, refused 4xx, 5xx, no answer
        assert_eq!(row("http://127.0.0.1:1234"), [3000, 600, 0, 2400, 0, 0]);
        assert_eq!(row("http://127.0.0.1:5678"), [1000, 70, 0, 900, 0, 30]);
        assert!(
            text.contains("neither as an order nor as a refusal"),
            "{text}"
        );
        let single = summary_table(&sample());
        assert!(!single.contains("attempts  orders 201"), "{single}");
        assert!(!single.contains("http://127.0.0.1:1234 "), "{single}");
        assert_eq!(r.targets[1].unanswered(), 30);
        assert_eq!(r.targets[1].unknown(), 30);
        assert_eq!(r.targets[1].orders(), 70);
    }

    // Checks the summary table names every figure a reader looks for (percentiles,
    // throughput, costs, memory, verdict) by rendering the sample result.
    #[test]
    fn summary_table_shows_the_figures() {
        let text = summary_table(&sample());
        for needle in [
            "p99.9",
            "800µs",
            "12.00ms",
            "2400 answers/s",
            "480 orders/s",
            "Redis 5.000 script calls, 30.000 commands",
            "sold_out:2400",
            "RESULT: PASS",
            "left to expire",
            "galera: 30 writesets replicated (0.050 per order, 100 B per order) · 0.100 causality waits per order · flow control paused 12.5 % of the load",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
    }

    // Checks the orders' headline of a run whose orders all came early (a rush: the
    // stock gone in its first 0.3 s of 2 s): how many and within what time, not a rate
    // over the whole run; a run whose orders went on keeps its orders per second. And
    // the page's heading keeps its time on one line, its text boxes wrap long lines.
    #[test]
    fn a_rush_headlines_when_its_orders_were_made() {
        let mut r = sample();
        r.elapsed_s = 2.0;
        r.timeline_step_ms = 100;
        r.timeline[0].start_ms = 200;
        r.timeline[1].start_ms = 1_500;
        assert_eq!(orders_made_within(&r), Some(0.3));
        let text = summary_table(&r);
        assert!(
            text.contains("600 orders, all made in the first 0.30 s"),
            "{text}"
        );
        assert!(!text.contains("480 orders/s"), "{text}");
        let page = crate::html::report(&r);
        assert!(page.contains("600 in 0.30 s"), "the page's headline");
        // The start time ends the heading unbroken, and long lines wrap in their box.
        let when = format!("<span class=\"when\">{}</span></h1>", r.started_at);
        assert!(page.contains(&when), "the heading's time");
        assert!(page.contains("white-space: pre-wrap"), "wrapped lines");
        r.timeline[1].orders = 1;
        assert_eq!(orders_made_within(&r), None);
        assert!(summary_table(&r).contains("480 orders/s"));
    }

    // Checks that a ceiling run is not called a pass: it makes no order, so its verdict
    // says nothing was judged, while a failed check still fails it.
    #[test]
    fn a_ceiling_run_is_not_judged() {
        let mut r = sample();
        r.config.target = "healthz".into();
        assert!(!r.judged());
        let text = summary_table(&r);
        assert!(text.contains("RESULT: NOT JUDGED"), "{text}");
        assert!(!text.contains("RESULT: PASS"), "{text}");
        r.passed = false;
        assert!(summary_table(&r).contains("RESULT: FAIL"));
        let mut post = sample();
        post.config.strategy = Some("http-post-ceiling".into());
        assert!(!post.judged());
        assert!(sample().judged());
    }
}
