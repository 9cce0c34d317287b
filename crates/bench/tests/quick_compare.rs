//! `--compare` end to end: `flashsale-bench sustained --spawn --compare` against a
//! debug-built flashsale, on the shared Redis, MariaDB and NATS (each run with its own
//! database, key prefix and stream, removed at the end by the bench).

mod common;

use flashsale_bench::cli::SQL_LABEL;
use flashsale_bench::compare::{CompareReport, CompareRow, SCHEMA};

/// A small sustained load per run, so two rounds of ten spawned debug servers (each
/// started, loaded, left to go quiet, checked and cleaned up) stay within about a
/// minute (half of one on a fast machine).
const ATTEMPTS: &str = "400";
const USERS: &str = "300";
const STOCK: &str = "1000";
/// The flashsale row's place in a round.
const FLASHSALE: usize = 8;

// Checks the comparison end to end by running the real binary with two rounds: it exits
// 0 and prints the table of medians and each round's; its JSON has the ten rows in
// order (ceiling, http-post-ceiling, sql-conditional, db-pessimistic, db-conditional,
// db-optimistic, redis-lock, redis-lua, flashsale, ceiling again), the ceilings without orders or cost per order,
// the flashsale row's ratio to the ceiling taken against the higher ceiling run (the
// POST ceiling is not one of them), the POST ceiling answering every attempt 409
// sold_out (no order), the SQL row making orders with no server (no server CPU, no
// server memory) through MariaDB's commits, every purchase row with throughput, latency
// and ratios to the ceiling, to db-conditional and to sql-conditional, the baselines
// and the SQL row passing with their flashsale-specific checks listed as skipped, and
// flashsale passing its audit, in each round; the medians' ratios are those of the
// rounds' own ratios (the mean of two).
#[test]
fn quick_compare_against_spawned_servers() {
    let json = common::scratch_path("compare.json");
    let stdout = common::quick_sustained(
        &["--compare", "--rounds", "2"],
        (ATTEMPTS, USERS, STOCK),
        &json,
    );
    let tables = stdout.lines().filter(|l| l.starts_with("strategy")).count();
    assert_eq!(tables, 3, "the medians and two rounds:\n{stdout}");
    assert!(stdout.contains("round 2 of 2:"), "{stdout}");
    assert!(stdout.contains("RESULT: PASS"), "{stdout}");

    let text = std::fs::read_to_string(&json).expect("JSON written");
    let _ = std::fs::remove_file(&json);
    let report: CompareReport = serde_json::from_str(&text).expect("JSON parses");
    assert_eq!(report.schema, SCHEMA);
    assert!(report.passed);
    assert_eq!(report.meta.rounds, 2);
    assert_eq!(report.rounds.len(), 2);
    assert_eq!(report.runs.len(), 20);
    for (k, round) in report.rounds.iter().enumerate() {
        check_round(&report, &round.rows, k);
        assert_eq!(round.runs, (k * 10..k * 10 + 10).collect::<Vec<_>>());
    }
    check_round(&report, &report.rows, 0);
    let flashsale_median = report.rows[FLASHSALE].vs_ceiling.unwrap_or(0.0);
    let own: Vec<f64> = report
        .rounds
        .iter()
        .map(|r| r.rows[FLASHSALE].vs_ceiling.unwrap_or(0.0))
        .collect();
    assert!(
        (flashsale_median - (own[0] + own[1]) / 2.0).abs() < 1e-9,
        "{flashsale_median} {own:?}"
    );
    assert_eq!(report.rows[FLASHSALE].measured_rounds, Some(2));
    // The POST ceiling refused every request it was sent, each with flashsale's own
    // sold-out answer: nothing else (no 503, no 400) hides behind its zero orders.
    for post in [&report.runs[1], &report.runs[11]] {
        assert_eq!(post.label(), "http-post-ceiling");
        let purchases = post.main_op().expect("purchases sent");
        let sent: u64 = purchases.statuses.values().sum();
        assert!(sent > 0 && sent == post.attempts.sent, "{purchases:?}");
        assert_eq!(purchases.statuses.get("409"), Some(&sent), "{purchases:?}");
        assert_eq!(
            purchases.errors.get("sold_out"),
            Some(&sent),
            "{purchases:?}"
        );
    }
    for flashsale in [&report.runs[FLASHSALE], &report.runs[10 + FLASHSALE]] {
        assert_eq!(flashsale.label(), "flashsale");
        assert_eq!(flashsale.checks.audit.status, "passed");
    }
    // The SQL row ran with no server: no server CPU or memory, MariaDB's commits for its
    // orders, every attempt answered (an order, a replay or sold out: nothing unknown),
    // the orders table's checks passed.
    for sql in [&report.runs[2], &report.runs[12]] {
        assert_eq!(sql.label(), SQL_LABEL);
        assert_eq!(sql.config.target, "sql");
        assert!(!sql.cpu.seconds.contains_key("server"), "{:?}", sql.cpu);
        assert_eq!(sql.memory.server_vm_hwm_kb, None);
        assert!(sql.costs.com_commit.unwrap_or(0) >= sql.orders.created);
        let purchases = sql.main_op().expect("purchases sent");
        let answered: u64 = ["200", "201"]
            .iter()
            .filter_map(|s| purchases.statuses.get(*s))
            .sum();
        assert_eq!(answered, sql.attempts.sent, "{purchases:?}");
        assert_eq!(sql.orders.created, sql.orders.acknowledged);
        assert!(sql
            .checks
            .client_passed
            .iter()
            .any(|c| c.contains("no request_id has two orders")));
    }
}

/// The labels of the runs `--compare` plans, in order (the plan itself is checked in
/// `cli.rs`): each round's rows, and the medians', come in this order.
fn planned_labels() -> Vec<String> {
    let plan = common::args(&["sustained", "--spawn", "--compare"]).runs();
    plan.expect("runs").into_iter().map(|r| r.label).collect()
}

/// The rows of one round (or the medians, `k` 0): their order, the ceilings without
/// orders, each purchase row measured, passed and with its ratios; in a round, the
/// flashsale row's ratio taken against the higher of that round's own ceiling runs.
fn check_round(report: &CompareReport, rows: &[CompareRow], k: usize) {
    let labels: Vec<&str> = rows.iter().map(|r| r.label.as_str()).collect();
    assert_eq!(labels, planned_labels(), "round {k}");
    for ceiling in [&rows[0], &rows[9]] {
        assert_eq!(ceiling.verdict, "n/a");
        assert_eq!((ceiling.orders, ceiling.com_commit_per_order), (None, None));
        assert!(ceiling.attempts_per_s.unwrap_or(0.0) > 0.0);
    }
    if rows[FLASHSALE].measured_rounds.is_none() {
        let higher = rows[0]
            .attempts_per_s
            .unwrap_or(0.0)
            .max(rows[9].attempts_per_s.unwrap_or(0.0));
        let flashsale_row = &rows[FLASHSALE];
        let expected = flashsale_row.attempts_per_s.unwrap_or(0.0) / higher;
        assert!(
            (flashsale_row.vs_ceiling.unwrap_or(0.0) - expected).abs() < 1e-9,
            "{flashsale_row:?}"
        );
    }
    for row in &rows[1..9] {
        assert_eq!(row.verdict, "pass", "{row:?}");
        let post_ceiling = row.label == "http-post-ceiling";
        assert_eq!(row.orders.unwrap_or(0) > 0, !post_ceiling, "{row:?}");
        assert!(row.p50_us.is_some() && row.p99_us.is_some(), "{row:?}");
        assert!(
            row.vs_ceiling.is_some()
                && row.vs_db_conditional.is_some()
                && row.vs_sql_conditional.is_some(),
            "{row:?}"
        );
        assert_eq!(
            row.server_cpu_us.is_none(),
            row.label == SQL_LABEL,
            "{row:?}"
        );
        let baseline = row.label != "flashsale";
        assert_eq!(row.skipped_checks.is_empty(), !baseline, "{row:?}");
    }
    assert!(report.passed);
}
