//! `--compare`: the HTTP ceiling and every purchase strategy, run one after the other with
//! the same sizes, mode and seed, side by side in one table — throughput, latency, cost
//! per order, and each row's throughput relative to the ceiling, to db-conditional and to
//! the bare SQL transaction (sql-conditional).
//! Everything here is pure: the runs are carried out in `lib.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::cli::{Database, RunSpec, Strategy, CEILING_LABEL, SQL_LABEL};
use crate::report::{human_us, BenchResult};

/// Names the comparison's JSON schema; bump the number on any incompatible change.
pub const SCHEMA: &str = "flashsale-bench-compare/2";
/// The second yardstick of the ratios: the simplest database design that sells exactly
/// the stock (one conditional UPDATE per attempt), what flashsale has to beat.
pub const REFERENCE: Strategy = Strategy::DB_CONDITIONAL;
/// The third: the same transaction with no HTTP and no server (`sql-conditional`, the
/// bench calling it on MariaDB itself), the floor under every database strategy.
pub const FLOOR: &str = SQL_LABEL;

/// How to read the database table.
const DATABASE_NOTE: &str = "database nodes: rows whose server wrote to a private database the bench started — one node (a MariaDB with the Galera nodes' InnoDB settings: 64 MB buffer pool, 8 MB redo log, a flush per commit) or galera (three nodes on the same machine; the server writes through node0, the others apply its writesets) — each run on a fresh database; ×one node: durable orders/s (the rush: attempts/s) over the same strategy's row on one node; nodeN µs/ord: each mariadbd's CPU per order created, from /proc; ms/COMMIT: the load's wall time over the writer's COMMITs; writesets/ord, B/ord: what the writer replicated (wsrep_replicated, wsrep_replicated_bytes); waits/ord: the writer's causality waits (wsrep_causal_reads: each read or BEGIN of a session with wsrep_sync_wait set); FC paused: share of the load replication was paused by flow control (wsrep_flow_control_paused_ns); send q, apply q: the writer's send queue and the longest apply queue of the others, averaged over the load (wsrep_local_send_queue_avg, wsrep_local_recv_queue_avg, since a FLUSH STATUS just before it); conflicts: certification failures and brute-force aborts, all nodes.";

/// A run of the comparison as it ended: its result, or why it could not be carried out.
#[derive(Debug)]
pub struct RunOutcome {
    pub spec: RunSpec,
    pub result: Result<BenchResult, String>,
}

/// What every run of the comparison shared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    pub scenario: String,
    /// RFC 3339, when the comparison started.
    pub started_at: String,
    pub seed: u64,
    /// How the load was driven, e.g. "closed loop, 64 connections".
    pub load: String,
    pub attempts_max: u64,
    pub stock: i64,
    pub users: u64,
    pub quick: bool,
    /// How many times the rows ran, interleaved (`--rounds`); 1 for a plain comparison.
    #[serde(default = "one_round")]
    pub rounds: u32,
}

fn one_round() -> u32 {
    1
}

/// One row of the table: one run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompareRow {
    /// The strategy, `http-ceiling` or `sql-conditional`.
    pub label: String,
    /// "purchase", "healthz" for the ceiling, "sql" for the bare SQL transaction.
    pub target: String,
    /// The server's FLASHSALE_STRATEGY (None for the ceiling); for the SQL row the
    /// strategy whose transaction it calls (db-conditional).
    pub strategy: Option<String>,
    /// Requests of the run's kind (purchase attempts; GET /healthz for the ceiling) sent
    /// per second of load.
    pub attempts_per_s: Option<f64>,
    /// Orders created (201) per second (None for the ceiling).
    pub orders_per_s: Option<f64>,
    /// Orders created (None for the ceiling).
    pub orders: Option<u64>,
    pub p50_us: Option<u64>,
    pub p99_us: Option<u64>,
    /// Per order created; None when not measured (the ceiling, no order, no probe).
    pub redis_commands_per_order: Option<f64>,
    pub redis_script_calls_per_order: Option<f64>,
    pub com_commit_per_order: Option<f64>,
    pub handler_commit_per_order: Option<f64>,
    /// CPU µs per attempt (per request for the ceiling): the server's, and the whole
    /// machine's (server, generator, stores, kernel); None when not read.
    #[serde(default)]
    pub server_cpu_us: Option<f64>,
    #[serde(default)]
    pub machine_cpu_us: Option<f64>,
    /// attempts_per_s / the ceiling's.
    pub vs_ceiling: Option<f64>,
    /// attempts_per_s / db-conditional's.
    pub vs_db_conditional: Option<f64>,
    /// attempts_per_s / sql-conditional's (the bare SQL transaction's).
    #[serde(default)]
    pub vs_sql_conditional: Option<f64>,
    /// Over several rounds: the lowest and highest of the rounds' own ×ceiling (the row's
    /// `vs_ceiling` is their median); None for a single round.
    #[serde(default)]
    pub vs_ceiling_range: Option<[f64; 2]>,
    /// The same for ×db-conditional.
    #[serde(default)]
    pub vs_db_conditional_range: Option<[f64; 2]>,
    /// The same for ×sql-conditional.
    #[serde(default)]
    pub vs_sql_conditional_range: Option<[f64; 2]>,
    /// Over several rounds: in how many of them this row was measured; None for a single
    /// round.
    #[serde(default)]
    pub measured_rounds: Option<u32>,
    /// Where the row's ledger lived (`Database::name`: "one node", "galera"); None for the
    /// server of --database-url.
    #[serde(default)]
    pub database: Option<String>,
    /// For a row on the Galera cluster: its durable orders/s (the rush's attempts/s: its
    /// orders stop at the stock) divided by the same strategy's row on one node.
    #[serde(default)]
    pub vs_one_node: Option<f64>,
    /// Over several rounds: the lowest and highest of the rounds' own ×one node.
    #[serde(default)]
    pub vs_one_node_range: Option<[f64; 2]>,
    /// What the private database's nodes did, for a row on one (`--galera`,
    /// `--compare-galera`).
    #[serde(default)]
    pub nodes: Option<NodeFigures>,
    /// "pass", "FAIL", "n/a" (the ceiling: nothing to check) or "error".
    pub verdict: String,
    pub violations: Vec<String>,
    /// Checks not run for this row, with the reason.
    pub skipped_checks: Vec<String>,
    /// Why the run could not be carried out.
    pub error: Option<String>,
}

/// A row's database figures, when its server wrote to a private database: each node's
/// CPU, the writer's commits and, on the cluster, what replication carried and waited.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeFigures {
    /// CPU µs per order created, by node (`nodes::NODE_NAMES`; node0 is the writer).
    pub cpu_us_per_order: BTreeMap<String, f64>,
    /// The load's wall time per COMMIT on the writer, in ms: with one group commit in
    /// flight (or one transaction holding the product's row), about one commit's time.
    pub ms_per_commit: Option<f64>,
    pub writesets_per_order: Option<f64>,
    pub bytes_per_order: Option<f64>,
    /// Share of the load replication was paused by flow control.
    pub flow_control_paused: Option<f64>,
    pub send_queue_avg: Option<f64>,
    pub recv_queue_avg: Option<f64>,
    /// Certification failures and brute-force aborts over the load, all nodes.
    pub conflicts: Option<f64>,
    /// The writer's causality waits (`wsrep_sync_wait`) per order.
    #[serde(default)]
    pub sync_waits_per_order: Option<f64>,
}

/// The database figures of a run on a private database (None otherwise).
fn node_figures(r: &BenchResult) -> Option<NodeFigures> {
    r.config.database.as_ref()?;
    let g = r.galera.clone().unwrap_or_default();
    Some(NodeFigures {
        cpu_us_per_order: r
            .cpu
            .us_per_order
            .iter()
            .filter(|(name, _)| crate::nodes::NODE_NAMES.contains(&name.as_str()))
            .map(|(name, v)| (name.clone(), *v))
            .collect(),
        ms_per_commit: r
            .costs
            .com_commit
            .filter(|&c| c > 0)
            .map(|c| r.elapsed_s * 1000.0 / c as f64),
        writesets_per_order: g.writesets_per_order,
        bytes_per_order: g.bytes_per_order,
        flow_control_paused: g.flow_control_paused,
        send_queue_avg: g.send_queue_avg,
        recv_queue_avg: g.recv_queue_avg,
        conflicts: g.conflicts.map(|c| c as f64),
        sync_waits_per_order: g.sync_waits_per_order,
    })
}

/// One round of a comparison of several rounds: its own rows (their ratios to this
/// round's own ceiling and db-conditional) and which of the report's `runs` it carried out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Round {
    pub rows: Vec<CompareRow>,
    /// Indexes into `CompareReport::runs`.
    pub runs: Vec<usize>,
}

/// The whole comparison: the table's rows, the notes printed under it, and every run's
/// full result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareReport {
    pub schema: String,
    pub meta: Meta,
    /// One round: its rows. Several: per row, the median over the rounds of each figure,
    /// and of each round's own ratios.
    pub rows: Vec<CompareRow>,
    /// Each round, in the order run; empty for a single round (its rows are `rows`).
    #[serde(default)]
    pub rounds: Vec<Round>,
    /// The round the charts show: the one whose flashsale ×ceiling is nearest the median
    /// (0 for a single round).
    #[serde(default)]
    pub median_round: usize,
    /// How to read the table, the checks skipped and for which rows, the failures.
    pub notes: Vec<String>,
    /// No flashsale run found a violation (the baselines' checks are reported, not
    /// judged: they make none of flashsale's promises).
    pub passed: bool,
    /// The full result of every run that was carried out.
    pub runs: Vec<BenchResult>,
}

impl CompareReport {
    /// The runs the charts show: every run of a single round, or the median round's.
    pub fn chart_runs(&self) -> Vec<&BenchResult> {
        match self.rounds.get(self.median_round) {
            None => self.runs.iter().collect(),
            Some(round) => round
                .runs
                .iter()
                .filter_map(|&i| self.runs.get(i))
                .collect(),
        }
    }
}

/// The row of a finished run.
pub fn row_of(r: &BenchResult) -> CompareRow {
    let ceiling = r.is_ceiling();
    let main = r.main_op();
    let c = &r.costs;
    let mut violations = r.checks.client_violations.clone();
    if !matches!(r.checks.audit.status.as_str(), "passed" | "skipped") {
        violations.push(format!("flashsale audit: {}", r.checks.audit.status));
    }
    CompareRow {
        label: r.label(),
        target: r.config.target.clone(),
        strategy: r.config.strategy.clone(),
        attempts_per_s: (r.elapsed_s > 0.0).then(|| r.attempts.sent as f64 / r.elapsed_s),
        orders_per_s: (!ceiling).then_some(r.throughput.orders_per_s),
        orders: (!ceiling).then_some(r.orders.created),
        p50_us: main
            .filter(|o| o.latency.count > 0)
            .map(|o| o.latency.p50_us),
        p99_us: main
            .filter(|o| o.latency.count > 0)
            .map(|o| o.latency.p99_us),
        redis_commands_per_order: c.redis_commands_per_order.filter(|_| !ceiling),
        redis_script_calls_per_order: c.redis_script_calls_per_order.filter(|_| !ceiling),
        com_commit_per_order: c.com_commit_per_order.filter(|_| !ceiling),
        handler_commit_per_order: c.handler_commit_per_order.filter(|_| !ceiling),
        server_cpu_us: r.cpu.us_per_attempt.get("server").copied(),
        machine_cpu_us: r.cpu.us_per_attempt.get("machine").copied(),
        vs_ceiling: None,
        vs_db_conditional: None,
        vs_sql_conditional: None,
        vs_ceiling_range: None,
        vs_db_conditional_range: None,
        vs_sql_conditional_range: None,
        measured_rounds: None,
        database: r.config.database.clone(),
        vs_one_node: None,
        vs_one_node_range: None,
        nodes: node_figures(r),
        verdict: if ceiling {
            "n/a".into()
        } else if r.passed {
            "pass".into()
        } else {
            "FAIL".into()
        },
        violations,
        skipped_checks: if ceiling {
            Vec::new()
        } else {
            r.checks.skipped.clone()
        },
        error: None,
    }
}

/// The row of a run that could not be carried out.
pub fn error_row(spec: &RunSpec, error: &str) -> CompareRow {
    CompareRow {
        label: spec.label.clone(),
        target: spec.target.name().into(),
        strategy: spec.strategy.map(|s| s.name().to_owned()),
        verdict: "error".into(),
        error: Some(error.to_owned()),
        ..CompareRow::default()
    }
}

fn ratio(value: Option<f64>, base: Option<f64>) -> Option<f64> {
    match (value, base) {
        (Some(v), Some(b)) if b > 0.0 => Some(v / b),
        _ => None,
    }
}

/// Fills each row's throughput ratios to the ceiling, to db-conditional's row and to
/// sql-conditional's (each left empty when that row is missing, failed to run or measured
/// nothing). The ceiling is the highest of the ceiling rows (`--compare` runs it first
/// and last). The other two are found by label: the SQL row calls db-conditional's
/// transaction too.
pub fn add_ratios(rows: &mut [CompareRow]) {
    let find = |label: &str| {
        rows.iter()
            .find(|r| r.label == label)
            .and_then(|r| r.attempts_per_s)
    };
    let ceiling = rows
        .iter()
        .filter(|r| r.strategy.is_none())
        .filter_map(|r| r.attempts_per_s)
        .reduce(f64::max);
    let reference = find(REFERENCE.name());
    let floor = find(FLOOR);
    for row in rows.iter_mut() {
        row.vs_ceiling = ratio(row.attempts_per_s, ceiling);
        row.vs_db_conditional = ratio(row.attempts_per_s, reference);
        row.vs_sql_conditional = ratio(row.attempts_per_s, floor);
    }
}

/// Fills the ratio of each row on the Galera cluster to the same strategy's row on one
/// node: of durable orders/s (`by_orders`), or of attempts/s for the rush, whose orders
/// stop at the stock.
pub fn add_one_node_ratios(rows: &mut [CompareRow], by_orders: bool) {
    let pick = |r: &CompareRow| {
        if by_orders {
            r.orders_per_s
        } else {
            r.attempts_per_s
        }
    };
    let on = |r: &CompareRow, database: Database| r.database.as_deref() == database.name();
    let one_node: Vec<(Option<String>, Option<f64>)> = rows
        .iter()
        .filter(|r| on(r, Database::OneNode))
        .map(|r| (r.strategy.clone(), pick(r)))
        .collect();
    for row in rows.iter_mut().filter(|r| on(r, Database::Galera)) {
        let base = one_node
            .iter()
            .find(|(strategy, _)| *strategy == row.strategy)
            .and_then(|(_, v)| *v);
        row.vs_one_node = ratio(pick(row), base);
    }
}

/// Whether no flashsale run found a violation.
pub fn flashsale_passed(rows: &[CompareRow]) -> bool {
    rows.iter()
        .filter(|r| r.strategy.as_deref() == Some(Strategy::FLASHSALE.name()))
        .all(|r| r.verdict != "FAIL")
}

/// How to read the table, then what was skipped (grouped by reason) and what failed.
pub fn notes(rows: &[CompareRow]) -> Vec<String> {
    let mut notes = vec![
        format!(
            "attempts/s: purchase attempts sent per second of load ({CEILING_LABEL}: GET /healthz requests, same generator, mode and connections); orders/s, orders: orders created (201) per second, in all; ×ceiling, ×{} and ×{FLOOR}: attempts/s divided by that row's attempts/s (the ceiling runs first and last; ×ceiling divides by the higher of its runs).",
            REFERENCE.name()
        ),
        format!("{FLOOR}: {}'s transaction with no HTTP and no server — the bench calls its stored procedure (CALL baseline_conditional, one round trip) on the server's database itself, closed loop on connections of its own (at most {}), the same attempts, users and request_ids: the floor under every database strategy. Its server only created the product and was stopped (srv CPU: none); a CALL's answer is counted as the server's would be (201, 200, 409 sold_out, 503 on a database error).", REFERENCE.name(), crate::sql::CLIENTS_MAX),
        format!("{}: the purchase endpoint with no strategy behind it — every attempt read, parsed and answered 409 sold_out, no store touched: what a POST with a JSON body costs the server and the generator beyond {CEILING_LABEL}'s GET, the floor of any purchase path's cost (a run of one may still measure above it: the machine's speed drifts between runs).", Strategy::HTTP_POST_CEILING.name()),
        "p50, p99: latency of the run's requests (purchase; healthz for the ceiling) from send (open loop: intended send) to answer; 503 re-sends count as requests of their own.".into(),
        "per order: deltas of server-wide counters over the load divided by the orders created — Redis commands (INFO commandstats, including those run inside Lua scripts) and script calls (EVAL/EVALSHA/FCALL round trips); MariaDB Com_commit (COMMIT statements) and Handler_commit (engine commits, autocommit statements included); the server's background workers and anything else on the same Redis or MariaDB are counted too. '-': not measured (the ceilings make no orders).".into(),
        "srv CPU µs, all CPU µs: CPU time over the load per attempt sent (per request for the ceilings), from /proc — the server's, and the whole machine's busy time (server, generator, Redis, MariaDB, NATS, the kernel's work for them, anything else running); every run's summary splits it by process. It moves less than throughput when the box's share of its host drifts (time the host gives to others is not counted), but still with how fast the CPU runs.".into(),
    ];
    if rows.iter().any(|r| r.nodes.is_some()) {
        notes.push(DATABASE_NOTE.to_owned());
    }
    // The same reason applies to several baselines: listed once with their names.
    let mut skipped: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for row in rows {
        for reason in &row.skipped_checks {
            skipped.entry(reason).or_default().push(&row.label);
        }
    }
    for (reason, labels) in skipped {
        notes.push(format!(
            "checks skipped for {} (not counted as failures): {reason}",
            labels.join(", ")
        ));
    }
    for row in rows {
        for v in &row.violations {
            let judged = if row.strategy.as_deref() == Some(Strategy::FLASHSALE.name()) {
                ""
            } else {
                " (a baseline: reported, not judged)"
            };
            notes.push(format!("{}: CHECK FAILED{judged}: {v}", row.label));
        }
        if let Some(e) = &row.error {
            notes.push(format!(
                "{}: the run could not be carried out: {e}",
                row.label
            ));
        }
    }
    notes
}

/// The comparison of one round of runs, in the order given.
pub fn build(meta: Meta, outcomes: Vec<RunOutcome>) -> CompareReport {
    build_rounds(meta, vec![outcomes])
}

/// The comparison of one or more rounds of the same rows (in the same order each round):
/// each round's ratios against its own ceiling and db-conditional, and for several rounds
/// a table of medians (`median_rows`).
pub fn build_rounds(meta: Meta, outcomes: Vec<Vec<RunOutcome>>) -> CompareReport {
    let mut rounds = Vec::with_capacity(outcomes.len());
    let mut runs = Vec::new();
    for round in outcomes {
        let mut rows = Vec::with_capacity(round.len());
        let mut indexes = Vec::with_capacity(round.len());
        for o in round {
            match o.result {
                Ok(r) => {
                    // The spec's label: the second ceiling run is named apart from the first.
                    rows.push(CompareRow {
                        label: o.spec.label.clone(),
                        ..row_of(&r)
                    });
                    indexes.push(runs.len());
                    runs.push(r);
                }
                Err(e) => rows.push(error_row(&o.spec, &e)),
            }
        }
        add_ratios(&mut rows);
        add_one_node_ratios(
            &mut rows,
            meta.scenario != crate::cli::Scenario::Rush.name(),
        );
        rounds.push(Round {
            rows,
            runs: indexes,
        });
    }
    let (rows, median_round) = if rounds.len() == 1 {
        (rounds.pop().map(|r| r.rows).unwrap_or_default(), 0)
    } else {
        let per_round: Vec<&[CompareRow]> = rounds.iter().map(|r| r.rows.as_slice()).collect();
        (median_rows(&per_round), median_round(&per_round))
    };
    let mut notes = notes(&rows);
    if !rounds.is_empty() {
        notes.insert(
            1,
            format!(
                "{} rounds, interleaved (every row once per round, in the table's order): each figure is the median over the rounds that measured the row; ×ceiling, ×{} and ×{FLOOR} are the medians of each round's own ratios, their lowest and highest in brackets; the charts show round {}, whose flashsale ×ceiling is nearest the median.",
                rounds.len(),
                REFERENCE.name(),
                median_round + 1
            ),
        );
    }
    CompareReport {
        schema: SCHEMA.into(),
        notes,
        passed: flashsale_passed(&rows),
        meta,
        rows,
        rounds,
        median_round,
        runs,
    }
}

/// The median of `values` (the mean of the middle two for an even count); None when empty.
pub fn median(mut values: Vec<f64>) -> Option<f64> {
    values.retain(|v| v.is_finite());
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

fn range(values: &[f64]) -> Option<[f64; 2]> {
    let low = values.iter().copied().reduce(f64::min)?;
    let high = values.iter().copied().reduce(f64::max)?;
    Some([low, high])
}

/// Per row position, the median of each figure over the rounds that measured it; ratios
/// are the medians of each round's own ratios (each round's drift stays inside it). A row
/// failed if it failed in any round, and is an error only if no round measured it.
pub fn median_rows(rounds: &[&[CompareRow]]) -> Vec<CompareRow> {
    let width = rounds.iter().map(|r| r.len()).max().unwrap_or(0);
    (0..width)
        .map(|i| {
            let all: Vec<&CompareRow> = rounds.iter().filter_map(|r| r.get(i)).collect();
            let measured: Vec<&CompareRow> =
                all.iter().copied().filter(|r| r.error.is_none()).collect();
            let Some(first) = measured.first().or(all.first()) else {
                return CompareRow::default();
            };
            let of = |pick: &dyn Fn(&CompareRow) -> Option<f64>| -> Vec<f64> {
                measured.iter().filter_map(|r| pick(r)).collect()
            };
            let med = |pick: &dyn Fn(&CompareRow) -> Option<f64>| median(of(pick));
            let med_u64 = |pick: &dyn Fn(&CompareRow) -> Option<u64>| {
                median(
                    measured
                        .iter()
                        .filter_map(|r| pick(r))
                        .map(|v| v as f64)
                        .collect(),
                )
                .map(|v| v.round() as u64)
            };
            let vs_ceiling = of(&|r| r.vs_ceiling);
            let vs_reference = of(&|r| r.vs_db_conditional);
            let vs_floor = of(&|r| r.vs_sql_conditional);
            let vs_one_node = of(&|r| r.vs_one_node);
            let (violations, errors) = by_round(&all);
            let verdict = if measured.is_empty() {
                "error"
            } else if measured.iter().any(|r| r.verdict == "FAIL") {
                "FAIL"
            } else {
                first.verdict.as_str()
            };
            CompareRow {
                label: first.label.clone(),
                target: first.target.clone(),
                strategy: first.strategy.clone(),
                attempts_per_s: med(&|r| r.attempts_per_s),
                orders_per_s: med(&|r| r.orders_per_s),
                orders: med_u64(&|r| r.orders),
                p50_us: med_u64(&|r| r.p50_us),
                p99_us: med_u64(&|r| r.p99_us),
                redis_commands_per_order: med(&|r| r.redis_commands_per_order),
                redis_script_calls_per_order: med(&|r| r.redis_script_calls_per_order),
                com_commit_per_order: med(&|r| r.com_commit_per_order),
                handler_commit_per_order: med(&|r| r.handler_commit_per_order),
                server_cpu_us: med(&|r| r.server_cpu_us),
                machine_cpu_us: med(&|r| r.machine_cpu_us),
                vs_ceiling: median(vs_ceiling.clone()),
                vs_db_conditional: median(vs_reference.clone()),
                vs_sql_conditional: median(vs_floor.clone()),
                vs_ceiling_range: range(&vs_ceiling),
                vs_db_conditional_range: range(&vs_reference),
                vs_sql_conditional_range: range(&vs_floor),
                measured_rounds: Some(measured.len() as u32),
                database: first.database.clone(),
                vs_one_node: median(vs_one_node.clone()),
                vs_one_node_range: range(&vs_one_node),
                nodes: median_nodes(&measured),
                verdict: verdict.to_owned(),
                violations,
                skipped_checks: first.skipped_checks.clone(),
                error: (!errors.is_empty()).then(|| errors.join("; ")),
            }
        })
        .collect()
}

/// The violations and errors of one row over the rounds (`all`, in round order), each
/// prefixed with its round.
fn by_round(all: &[&CompareRow]) -> (Vec<String>, Vec<String>) {
    let mut violations = Vec::new();
    let mut errors = Vec::new();
    for (round, r) in all.iter().enumerate() {
        violations.extend(
            r.violations
                .iter()
                .map(|v| format!("round {}: {v}", round + 1)),
        );
        if let Some(e) = &r.error {
            errors.push(format!("round {}: {e}", round + 1));
        }
    }
    (violations, errors)
}

/// The median of each database figure over the rounds that measured one (None when
/// none did), each node's CPU apart.
fn median_nodes(rows: &[&CompareRow]) -> Option<NodeFigures> {
    let all: Vec<&NodeFigures> = rows.iter().filter_map(|r| r.nodes.as_ref()).collect();
    if all.is_empty() {
        return None;
    }
    let med = |pick: fn(&NodeFigures) -> Option<f64>| {
        median(all.iter().filter_map(|f| pick(f)).collect())
    };
    let names: BTreeSet<&String> = all.iter().flat_map(|f| f.cpu_us_per_order.keys()).collect();
    Some(NodeFigures {
        cpu_us_per_order: names
            .into_iter()
            .filter_map(|name| {
                let values = all.iter().filter_map(|f| f.cpu_us_per_order.get(name));
                Some((name.clone(), median(values.copied().collect())?))
            })
            .collect(),
        ms_per_commit: med(|f| f.ms_per_commit),
        writesets_per_order: med(|f| f.writesets_per_order),
        bytes_per_order: med(|f| f.bytes_per_order),
        flow_control_paused: med(|f| f.flow_control_paused),
        send_queue_avg: med(|f| f.send_queue_avg),
        recv_queue_avg: med(|f| f.recv_queue_avg),
        conflicts: med(|f| f.conflicts),
        sync_waits_per_order: med(|f| f.sync_waits_per_order),
    })
}

/// The round whose flashsale ×ceiling is nearest the median of them (the first such; 0
/// when no round measured flashsale).
pub fn median_round(rounds: &[&[CompareRow]]) -> usize {
    let flashsale = |rows: &[CompareRow]| {
        rows.iter()
            .find(|r| r.strategy.as_deref() == Some(Strategy::FLASHSALE.name()))
            .and_then(|r| r.vs_ceiling)
    };
    let Some(mid) = median(rounds.iter().filter_map(|r| flashsale(r)).collect()) else {
        return 0;
    };
    rounds
        .iter()
        .enumerate()
        .filter_map(|(i, r)| flashsale(r).map(|v| (i, (v - mid).abs())))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map_or(0, |(i, _)| i)
}

fn dash<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map_or_else(|| "-".to_owned(), f)
}

/// A ratio, "2.50×", with the rounds' lowest and highest when there were several:
/// "2.50× (2.10–2.80)".
fn ratio_cell(value: Option<f64>, range: Option<[f64; 2]>) -> String {
    match (value, range) {
        (Some(v), Some([low, high])) => format!("{v:.2}× ({low:.2}–{high:.2})"),
        (v, _) => dash(v, |v| format!("{v:.2}×")),
    }
}

/// A row's cells in the table's column order.
pub fn cells(r: &CompareRow) -> Vec<String> {
    let checks = match (r.verdict.as_str(), r.skipped_checks.len()) {
        (v, 0) => v.to_owned(),
        (v, n) => format!("{v} ({n} skipped)"),
    };
    vec![
        r.label.clone(),
        dash(r.attempts_per_s, |v| format!("{v:.0}")),
        dash(r.orders_per_s, |v| format!("{v:.0}")),
        dash(r.orders, |v| v.to_string()),
        dash(r.p50_us, human_us),
        dash(r.p99_us, human_us),
        dash(r.redis_commands_per_order, |v| format!("{v:.2}")),
        dash(r.redis_script_calls_per_order, |v| format!("{v:.2}")),
        dash(r.com_commit_per_order, |v| format!("{v:.2}")),
        dash(r.handler_commit_per_order, |v| format!("{v:.2}")),
        dash(r.server_cpu_us, |v| format!("{v:.1}")),
        dash(r.machine_cpu_us, |v| format!("{v:.1}")),
        ratio_cell(r.vs_ceiling, r.vs_ceiling_range),
        ratio_cell(r.vs_db_conditional, r.vs_db_conditional_range),
        ratio_cell(r.vs_sql_conditional, r.vs_sql_conditional_range),
        checks,
    ]
}

/// The table's column headers.
pub fn headers() -> Vec<String> {
    [
        "strategy",
        "attempts/s",
        "orders/s",
        "orders",
        "p50",
        "p99",
        "Redis cmd/ord",
        "Redis eval/ord",
        "COMMIT/ord",
        "Hdl commit/ord",
        "srv CPU µs",
        "all CPU µs",
        "×ceiling",
        &format!("×{}", REFERENCE.name()),
        &format!("×{FLOOR}"),
        "checks",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect()
}

/// `rows` as lines of aligned cells under the headers (first and last columns left
/// aligned, figures right aligned), then an empty line.
fn grid(out: &mut String, rows: &[CompareRow]) {
    let mut lines = vec![headers()];
    lines.extend(rows.iter().map(cells));
    aligned(out, &lines);
}

/// The header line and the rows of the database table: one line per row that ran on a
/// private database.
fn node_lines(rows: &[CompareRow]) -> Vec<Vec<String>> {
    let mut lines = vec![[
        "row",
        "database",
        "×one node",
        "node0 µs/ord",
        "node1 µs/ord",
        "node2 µs/ord",
        "ms/COMMIT",
        "writesets/ord",
        "B/ord",
        "waits/ord",
        "FC paused",
        "send q",
        "apply q",
        "conflicts",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect::<Vec<String>>()];
    for r in rows {
        let Some(n) = &r.nodes else {
            continue;
        };
        let cpu = |name: &str| dash(n.cpu_us_per_order.get(name), |v| format!("{v:.1}"));
        let f2 = |v: Option<f64>| dash(v, |v| format!("{v:.2}"));
        lines.push(vec![
            r.label.clone(),
            r.database.clone().unwrap_or_default(),
            ratio_cell(r.vs_one_node, r.vs_one_node_range),
            cpu("node0"),
            cpu("node1"),
            cpu("node2"),
            f2(n.ms_per_commit),
            dash(n.writesets_per_order, |v| format!("{v:.3}")),
            dash(n.bytes_per_order, |v| format!("{v:.0}")),
            dash(n.sync_waits_per_order, |v| format!("{v:.3}")),
            dash(n.flow_control_paused, |v| format!("{:.1} %", v * 100.0)),
            f2(n.send_queue_avg),
            f2(n.recv_queue_avg),
            dash(n.conflicts, |v| format!("{v:.0}")),
        ]);
    }
    lines
}

/// The database table of `rows` (after a line naming it), when any ran on a private
/// database.
fn nodes_grid(out: &mut String, rows: &[CompareRow]) {
    if rows.iter().all(|r| r.nodes.is_none()) {
        return;
    }
    let _ = writeln!(out, "database nodes:");
    aligned(out, &node_lines(rows));
}

/// `lines` (the first the headers) as aligned cells (first and last columns left
/// aligned, figures right aligned), then an empty line.
fn aligned(out: &mut String, grid: &[Vec<String>]) {
    let columns = grid.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            grid.iter()
                .map(|row| row.get(i).map_or(0, |c| c.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in grid {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            let pad = widths[i].saturating_sub(cell.chars().count());
            if i > 0 {
                line.push_str("  ");
            }
            if i == 0 || i == columns - 1 {
                line.push_str(cell);
                line.push_str(&" ".repeat(pad));
            } else {
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    let _ = writeln!(out);
}

/// The comparison as text: a header line, the table (first and last columns left
/// aligned, figures right aligned), the notes, and the verdict.
pub fn table(report: &CompareReport) -> String {
    let m = &report.meta;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "flashsale-bench compare — {}{} — {} — {} attempts, stock {}, {} users, seed {} — started {}",
        m.scenario,
        if m.quick { " (quick)" } else { "" },
        m.load,
        m.attempts_max,
        m.stock,
        m.users,
        m.seed,
        m.started_at
    );
    let _ = writeln!(out);
    if !report.rounds.is_empty() {
        let _ = writeln!(
            out,
            "medians over {} rounds (each round's own table follows the notes):",
            report.rounds.len()
        );
    }
    grid(&mut out, &report.rows);
    nodes_grid(&mut out, &report.rows);
    for note in &report.notes {
        let _ = writeln!(out, "note: {note}");
    }
    if !report.rounds.is_empty() {
        let _ = writeln!(out);
    }
    for (i, round) in report.rounds.iter().enumerate() {
        let _ = writeln!(out, "round {} of {}:", i + 1, report.rounds.len());
        grid(&mut out, &round.rows);
        nodes_grid(&mut out, &round.rows);
    }
    let _ = writeln!(
        out,
        "{}",
        if report.passed {
            "RESULT: PASS — no invariant violation in the flashsale run (baselines reported, not judged)"
        } else {
            "RESULT: FAIL — the flashsale run has invariant violations (see above)"
        }
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Target;
    use crate::report::tests::{ceiling_sample, sample};

    fn meta() -> Meta {
        Meta {
            scenario: "sustained".into(),
            started_at: "2026-11-29T10:00:00Z".into(),
            seed: 7,
            load: "closed loop, 64 connections".into(),
            attempts_max: 4000,
            stock: 5000,
            users: 1500,
            quick: true,
            rounds: 1,
        }
    }

    /// A purchase run of `strategy` that sent `sent` attempts in one second.
    fn run(strategy: &str, sent: u64, passed: bool) -> BenchResult {
        let mut r = sample();
        r.config.strategy = Some(strategy.into());
        r.elapsed_s = 1.0;
        r.attempts.sent = sent;
        r.passed = passed;
        if !passed {
            r.checks.client_violations = vec!["orders acknowledged 9 exceed the stock 5".into()];
        }
        if strategy != "flashsale" {
            r.checks.skipped = vec!["inventory checks: baseline".into()];
        }
        r
    }

    fn ceiling(sent: u64) -> BenchResult {
        let mut r = ceiling_sample();
        r.elapsed_s = 1.0;
        r.attempts.sent = sent;
        r.checks.skipped = vec!["order checks: the ceiling sends no purchase".into()];
        r
    }

    fn spec(label: &str, strategy: Option<Strategy>) -> RunSpec {
        RunSpec {
            label: label.into(),
            target: if strategy.is_some() {
                Target::Purchase
            } else {
                Target::Healthz
            },
            strategy,
            server_env: vec![],
            server_log: None,
            database: Database::Given,
        }
    }

    fn outcome(result: BenchResult) -> RunOutcome {
        RunOutcome {
            spec: spec(&result.label(), None),
            result: Ok(result),
        }
    }

    // Checks the ceiling run twice (first and last, as --compare does): the ratios use
    // the higher of the two runs (10,000/s, the second), the rows keep their own labels,
    // and the lower ceiling's own ratio is below 1.
    #[test]
    fn the_higher_of_two_ceiling_runs_is_the_ceiling() {
        let again = RunOutcome {
            spec: spec(crate::cli::CEILING_AGAIN_LABEL, None),
            result: Ok(ceiling(10_000)),
        };
        let report = build(
            meta(),
            vec![
                outcome(ceiling(8_000)),
                outcome(run("flashsale", 5000, true)),
                again,
            ],
        );
        let [first, f, last] = &report.rows[..] else {
            panic!("three rows: {:?}", report.rows);
        };
        assert_eq!(first.label, CEILING_LABEL);
        assert_eq!(last.label, crate::cli::CEILING_AGAIN_LABEL);
        assert_eq!(first.vs_ceiling, Some(0.8));
        assert_eq!(last.vs_ceiling, Some(1.0));
        assert_eq!(f.vs_ceiling, Some(0.5));
    }

    // Checks the ratios and the ceiling row, by building a comparison of a ceiling at
    // 10,000/s, db-conditional at 2,000/s and flashsale at 5,000/s: flashsale is 0.50× the
    // ceiling and 2.50× db-conditional; the ceiling's own ratio is 1; the ceiling row has
    // no orders/s, no cost per order and no verdict ("n/a"), whatever its costs held.
    #[test]
    fn ratios_and_the_ceiling_row() {
        let report = build(
            meta(),
            vec![
                outcome(ceiling(10_000)),
                outcome(run("db-conditional", 2000, true)),
                outcome(run("flashsale", 5000, true)),
            ],
        );
        let [c, d, f] = &report.rows[..] else {
            panic!("three rows: {:?}", report.rows);
        };
        assert_eq!(c.label, CEILING_LABEL);
        assert_eq!(c.vs_ceiling, Some(1.0));
        assert_eq!(c.vs_db_conditional, Some(5.0));
        assert_eq!(
            (
                c.orders_per_s,
                c.redis_commands_per_order,
                c.com_commit_per_order
            ),
            (None, None, None)
        );
        assert_eq!(c.verdict, "n/a");
        assert_eq!(d.vs_db_conditional, Some(1.0));
        assert_eq!(f.vs_ceiling, Some(0.5));
        assert_eq!(f.vs_db_conditional, Some(2.5));
        assert_eq!(f.p50_us, Some(800));
        assert_eq!(f.redis_commands_per_order, Some(30.0));
        assert!(report.passed);
        assert_eq!(report.runs.len(), 3);
    }

    // Checks the third yardstick: with the bare SQL row (label sql-conditional, running
    // db-conditional's transaction, 4,000/s) listed before db-conditional's (2,000/s),
    // ×db-conditional still divides by db-conditional's own row and ×sql-conditional by
    // the SQL row's: flashsale at 5,000/s is 2.50× and 1.25×; the SQL row's own
    // ×sql-conditional is 1; the table has the column; a comparison without the SQL row
    // leaves the ratio empty.
    #[test]
    fn the_sql_row_is_the_third_yardstick() {
        let mut sql = run("db-conditional", 4000, true);
        sql.config.target = "sql".into();
        assert_eq!(sql.label(), SQL_LABEL);
        let report = build(
            meta(),
            vec![
                outcome(ceiling(10_000)),
                outcome(sql),
                outcome(run("db-conditional", 2000, true)),
                outcome(run("flashsale", 5000, true)),
            ],
        );
        let [_, s, d, f] = &report.rows[..] else {
            panic!("four rows: {:?}", report.rows);
        };
        assert_eq!(s.label, SQL_LABEL);
        assert_eq!(s.vs_sql_conditional, Some(1.0));
        assert_eq!(s.vs_db_conditional, Some(2.0));
        assert_eq!(d.vs_db_conditional, Some(1.0));
        assert_eq!(f.vs_db_conditional, Some(2.5));
        assert_eq!(f.vs_sql_conditional, Some(1.25));
        let text = table(&report);
        assert!(text.contains("×sql-conditional"), "{text}");
        assert!(text.contains("1.25×"), "{text}");
        let without = build(meta(), vec![outcome(run("flashsale", 5000, true))]);
        assert_eq!(without.rows[0].vs_sql_conditional, None);
    }

    // Checks the rendered table: the header names every requested column; every row is
    // one line whose cells line up under the headers (each header ends where its figures
    // end); the ceiling's cost cells are "-"; ratios read "2.50×"; baselines show how many
    // checks were skipped and a note says which and why.
    #[test]
    fn table_lines_up_and_names_the_columns() {
        let report = build(
            meta(),
            vec![
                outcome(ceiling(10_000)),
                outcome(run("db-conditional", 2000, true)),
                outcome(run("flashsale", 5000, true)),
            ],
        );
        let text = table(&report);
        let lines: Vec<&str> = text.lines().collect();
        let header = lines
            .iter()
            .position(|l| l.starts_with("strategy"))
            .expect("header line");
        for name in [
            "attempts/s",
            "orders/s",
            "p50",
            "p99",
            "Redis cmd/ord",
            "COMMIT/ord",
            "×ceiling",
            "×db-conditional",
            "checks",
        ] {
            assert!(lines[header].contains(name), "missing {name}");
        }
        let ceiling_line = lines[header + 1];
        let flashsale_line = lines[header + 3];
        assert!(ceiling_line.starts_with("http-ceiling"));
        assert!(flashsale_line.starts_with("flashsale"));
        // Right-aligned figures end at the same column as their header.
        let end_of = |line: &str, needle: &str| {
            line.find(needle)
                .map(|i| line[..i + needle.len()].chars().count())
        };
        assert_eq!(
            end_of(lines[header], "attempts/s"),
            end_of(flashsale_line, "5000")
        );
        assert_eq!(
            end_of(lines[header], "×ceiling"),
            end_of(flashsale_line, "0.50×")
        );
        assert!(flashsale_line.contains("2.50×"));
        let ceiling_cells: Vec<&str> = ceiling_line.split_whitespace().collect();
        assert_eq!(ceiling_cells[2], "-", "{ceiling_line}");
        assert!(ceiling_cells.ends_with(&["n/a"]), "{ceiling_line}");
        assert!(lines[header + 2].ends_with("pass (1 skipped)"));
        assert!(text.contains(
            "checks skipped for db-conditional (not counted as failures): inventory checks: baseline"
        ));
        assert!(text.contains("RESULT: PASS"));
    }

    // Checks the verdict: a baseline's violation is shown (FAIL, and the violation noted
    // as not judged) but leaves the comparison passed; a flashsale violation fails it; a
    // run that could not be carried out is an "error" row with empty figures and its
    // reason noted, and the ratios of the others stay empty without their reference.
    #[test]
    fn only_flashsale_violations_fail_and_errors_are_rows() {
        let report = build(
            meta(),
            vec![
                RunOutcome {
                    spec: spec(CEILING_LABEL, None),
                    result: Err("the server exited during startup".into()),
                },
                outcome(run("redis-lua", 3000, false)),
                outcome(run("flashsale", 5000, true)),
            ],
        );
        assert!(report.passed);
        assert_eq!(report.rows[0].verdict, "error");
        assert_eq!(report.rows[0].attempts_per_s, None);
        assert_eq!(report.rows[1].verdict, "FAIL");
        assert_eq!(report.rows[2].vs_ceiling, None);
        let text = table(&report);
        assert!(text.contains("redis-lua: CHECK FAILED (a baseline: reported, not judged)"));
        assert!(text.contains(
            "http-ceiling: the run could not be carried out: the server exited during startup"
        ));
        let failed = build(meta(), vec![outcome(run("flashsale", 5000, false))]);
        assert!(!failed.passed);
        assert!(table(&failed).contains("RESULT: FAIL"));
    }

    // Checks the JSON document round-trips (serialize, parse back, equal) and carries
    // its schema name, the rows with null cost cells for the ceiling, and the full runs.
    #[test]
    fn json_round_trip() {
        let report = build(
            meta(),
            vec![outcome(ceiling(100)), outcome(run("flashsale", 50, true))],
        );
        let text = serde_json::to_string_pretty(&report).expect("serialize");
        let back: CompareReport = serde_json::from_str(&text).expect("parse back");
        assert_eq!(back, report);
        let v: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["schema"], SCHEMA);
        assert!(v["rows"][0]["redis_commands_per_order"].is_null());
        assert_eq!(v["runs"].as_array().map(Vec::len), Some(2));
    }

    // Checks the median of a few values: odd count the middle one, even count the mean
    // of the middle two, none for no values; NaN is left out.
    #[test]
    fn medians() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![f64::NAN, 5.0]), Some(5.0));
    }

    /// One round: the ceiling at `c`/s, db-conditional at 2,000/s, flashsale at `f`/s.
    fn round(c: u64, f: u64, passed: bool) -> Vec<RunOutcome> {
        vec![
            outcome(ceiling(c)),
            outcome(run("db-conditional", 2000, true)),
            outcome(run("flashsale", f, passed)),
        ]
    }

    // Checks a comparison of three rounds, the second one on a box that slowed down (its
    // ceiling 6,000/s and flashsale 3,000/s): each row's throughput is the median of the
    // rounds' (flashsale 7,600), its ×ceiling the median of each round's own ratio (0.90:
    // rounds of 0.90, 0.50 and 0.95), with the lowest and highest; the charts show the
    // round nearest the median (the first); the table holds the medians, then each
    // round's own table; a violation in any one round fails the comparison and names it.
    #[test]
    fn rounds_take_the_median_of_each_rounds_own_ratio() {
        let report = build_rounds(
            meta(),
            vec![
                round(10_000, 9_000, true),
                round(6_000, 3_000, true),
                round(8_000, 7_600, true),
            ],
        );
        let f = &report.rows[2];
        assert_eq!(f.label, "flashsale");
        assert_eq!(f.attempts_per_s, Some(7_600.0));
        assert_eq!(f.vs_ceiling, Some(0.9));
        assert_eq!(f.vs_ceiling_range, Some([0.5, 0.95]));
        assert_eq!(f.vs_db_conditional, Some(3.8));
        assert_eq!(f.vs_db_conditional_range, Some([1.5, 4.5]));
        assert_eq!(f.measured_rounds, Some(3));
        assert_eq!(report.rounds.len(), 3);
        assert_eq!(report.rounds[1].rows[2].vs_ceiling, Some(0.5));
        assert_eq!(report.median_round, 0);
        assert_eq!(report.runs.len(), 9);
        let charted: Vec<u64> = report
            .chart_runs()
            .iter()
            .map(|r| r.attempts.sent)
            .collect();
        assert_eq!(charted, vec![10_000, 2000, 9_000]);
        assert!(report.passed);
        let text = table(&report);
        assert!(text.contains("medians over 3 rounds"), "{text}");
        assert!(text.contains("0.90× (0.50–0.95)"), "{text}");
        assert!(text.contains("round 2 of 3:"), "{text}");
        assert!(text.contains("note: 3 rounds, interleaved"), "{text}");
        let back: CompareReport =
            serde_json::from_str(&serde_json::to_string(&report).expect("serialize"))
                .expect("parse back");
        assert_eq!(back, report);

        let failed = build_rounds(
            meta(),
            vec![round(10_000, 9_000, true), round(10_000, 9_000, false)],
        );
        assert!(!failed.passed);
        assert_eq!(failed.rows[2].verdict, "FAIL");
        assert!(table(&failed).contains(
            "flashsale: CHECK FAILED: round 2: orders acknowledged 9 exceed the stock 5"
        ));
    }

    /// A run of `strategy` on `database` that made `orders` orders in one second (and
    /// half again as many attempts), its writer's CPU per order `node0`.
    fn on(strategy: &str, database: Database, orders: u64, node0: f64) -> BenchResult {
        let mut r = run(strategy, orders * 3 / 2, true);
        r.config.database = database.name().map(str::to_owned);
        r.throughput.orders_per_s = orders as f64;
        r.cpu.us_per_order = BTreeMap::from([("node0".into(), node0), ("server".into(), 30.0)]);
        r.costs.com_commit = Some(orders / 20);
        r
    }

    // Checks --compare-galera's table: each row on the cluster gets its durable orders/s
    // over the same strategy's on one node (flashsale 3,000 / 5,000 = 0.60×,
    // db-conditional 1,000 / 2,000 = 0.50×), over two rounds the median of the rounds'
    // own ratios with their range; the database table follows the main one, a line per
    // row with each node's CPU per order (node0 only: the server's is not a node's) and
    // the wall time per COMMIT; in the rush the ratio is of attempts/s; a comparison
    // without private databases has no such table.
    #[test]
    fn galera_rows_against_one_node() {
        let labelled = |label: &str, result: BenchResult| RunOutcome {
            spec: spec(label, None),
            result: Ok(result),
        };
        let round = |galera_orders: u64| {
            vec![
                outcome(on("flashsale", Database::OneNode, 5000, 40.0)),
                labelled(
                    "flashsale@galera",
                    on("flashsale", Database::Galera, galera_orders, 60.0),
                ),
                outcome(on("db-conditional", Database::OneNode, 2000, 200.0)),
                labelled(
                    "db-conditional@galera",
                    on("db-conditional", Database::Galera, 1000, 300.0),
                ),
            ]
        };
        let report = build(meta(), round(3000));
        let f = &report.rows[1];
        assert_eq!(f.database.as_deref(), Some("galera"));
        assert_eq!(f.vs_one_node, Some(0.6));
        assert_eq!(report.rows[3].vs_one_node, Some(0.5));
        assert_eq!(report.rows[0].vs_one_node, None);
        let nodes = f.nodes.as_ref().expect("database figures");
        assert_eq!(
            nodes.cpu_us_per_order,
            BTreeMap::from([("node0".to_owned(), 60.0)])
        );
        assert_eq!(nodes.ms_per_commit, Some(1000.0 / 150.0));
        let text = table(&report);
        let tables: Vec<&str> = text.split("database nodes:\n").collect();
        assert_eq!(tables.len(), 2, "{text}");
        let line = tables[1]
            .lines()
            .find(|l| l.starts_with("flashsale@galera "))
            .unwrap_or_default();
        assert!(line.contains("0.60×") && line.contains("60.0"), "{text}");
        assert!(text.contains("×one node"), "{text}");

        let two = build_rounds(meta(), vec![round(3000), round(4000)]);
        assert_eq!(two.rows[1].vs_one_node, Some(0.7));
        assert_eq!(two.rows[1].vs_one_node_range, Some([0.6, 0.8]));
        assert!(table(&two).contains("0.70× (0.60–0.80)"), "{}", table(&two));

        let mut rush = meta();
        rush.scenario = "rush".into();
        let by_attempts = build(rush, round(3000));
        assert_eq!(by_attempts.rows[1].vs_one_node, Some(4500.0 / 7500.0));
        let plain = build(meta(), vec![outcome(run("flashsale", 5000, true))]);
        assert!(!table(&plain).contains("database nodes:"));
    }

    // Checks a row that could not be carried out in one round of two: its figures are the
    // other round's, it is not an error row, and the note names the round that failed; a
    // row no round measured is an error row with empty figures.
    #[test]
    fn a_round_that_failed_to_run_a_row_leaves_the_others() {
        let mut second = round(10_000, 5_000, true);
        second[2] = RunOutcome {
            spec: spec("flashsale", Some(Strategy::FLASHSALE)),
            result: Err("the server exited during startup".into()),
        };
        second[0] = RunOutcome {
            spec: spec(CEILING_LABEL, None),
            result: Err("refused".into()),
        };
        let mut first = round(10_000, 6_000, true);
        first[0] = RunOutcome {
            spec: spec(CEILING_LABEL, None),
            result: Err("refused".into()),
        };
        let report = build_rounds(meta(), vec![first, second]);
        let f = &report.rows[2];
        assert_eq!(f.verdict, "pass");
        assert_eq!(f.measured_rounds, Some(1));
        assert_eq!(f.vs_db_conditional, Some(3.0));
        assert_eq!(
            f.error.as_deref(),
            Some("round 2: the server exited during startup")
        );
        let c = &report.rows[0];
        assert_eq!(c.verdict, "error");
        assert_eq!(c.attempts_per_s, None);
        assert_eq!(f.vs_ceiling, None);
        assert_eq!(report.runs.len(), 3);
    }
}
