//! Several servers of one sale: two debug-built flashsale instances on one fresh
//! database, Redis prefix and NATS stream (on the shared MariaDB, Redis and NATS; removed
//! at the end), a quick rush spread over both — driven through the bench library
//! ([`flashsale_bench::drive`], the call a test of its own servers makes), and from the
//! command line (`--spawn --instances 2`).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use flashsale_bench::load::Live;
use flashsale_bench::server::{self, SpawnOptions};

/// The quick rush, trimmed as in `quick_rush.rs` so that two server starts, the load,
/// the quiet wait, the audit and the cleanup stay under ~30 s on a busy 2-core machine.
const ATTEMPTS: u64 = 2000;
const USERS: &str = "800";
const STOCK: i64 = 100;
/// Warn (not fail) past this: the machine may be shared with other test binaries.
const EXPECTED_MAX: Duration = Duration::from_secs(30);

// Checks a rush over two instances of one sale, driven through the library as a test of
// its own servers would: `server::spawn` starts two servers on one database, prefix and
// stream; `drive` gets both as --base-url (with their admin token, database and prefix)
// and returns a result that passed (client checks and audit), with a row per server in
// the order given, each of which got attempts (32 connections dealt 16 and 16) and
// answered them all, the attempts adding up to the run's; and the sale sold exactly its
// stock — 100 orders created over the two servers, each acknowledged, none left
// available. The future `drive` returns is Send (spawned on the runtime), so a test can
// kill a server while it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quick_rush_over_two_instances_sells_exactly_the_stock() {
    let bin = common::server_bin();
    // The stores' addresses as the command line has them (defaults or FLASHSALE_*).
    let defaults = common::args(&["rush"]);
    let started = Instant::now();
    let spawned = server::spawn(SpawnOptions {
        bin: &bin,
        database_url: &defaults.database_url,
        redis_url: &defaults.redis_url,
        nats_url: &defaults.nats_url,
        payment_timeout: None,
        extra_env: &[],
        log_level: "warn",
        log_path: None,
        instances: 2,
    })
    .await
    .expect("two servers start");
    let urls = spawned.base_urls();
    assert_eq!(urls.len(), 2);
    let attempts = ATTEMPTS.to_string();
    let stock = STOCK.to_string();
    let mut list = vec!["rush".to_owned(), "--quick".into(), "--no-progress".into()];
    list.extend(common::against(&spawned, &bin));
    for (flag, value) in [
        ("--attempts", attempts.as_str()),
        ("--users", USERS),
        ("--stock", stock.as_str()),
        ("--connections", "32"),
    ] {
        list.extend([flag.to_owned(), value.to_owned()]);
    }
    let run = common::args(&list.iter().map(String::as_str).collect::<Vec<_>>());
    let live = Arc::new(Live::default());
    let result = tokio::spawn(async move { flashsale_bench::drive(&run, live).await })
        .await
        .expect("the run did not panic");
    spawned.shutdown(false).await;
    let took = started.elapsed();
    let r = result.expect("the run was carried out");
    if took > EXPECTED_MAX {
        eprintln!("note: the rush over two instances took {took:?} (busy machine?)");
    }

    let summary = flashsale_bench::report::summary_table(&r);
    assert!(r.passed, "{summary}");
    assert_eq!(r.checks.audit.status, "passed", "{}", r.checks.audit.output);
    assert_eq!(r.config.base_url, urls[0]);
    let rows: Vec<&str> = r.targets.iter().map(|t| t.base_url.as_str()).collect();
    assert_eq!(rows, urls, "{summary}");
    for t in &r.targets {
        assert!(t.attempts > 0, "{}: no attempts\n{summary}", t.base_url);
        assert_eq!(t.unknown(), 0, "{}: unanswered\n{summary}", t.base_url);
    }
    let sent: u64 = r.targets.iter().map(|t| t.attempts).sum();
    assert_eq!(sent, ATTEMPTS, "{summary}");
    assert_eq!(r.attempts.sent, ATTEMPTS, "{summary}");
    // Exactly the stock was sold, over both servers: each unit to one acknowledged order.
    let orders: u64 = r.targets.iter().map(|t| t.orders()).sum();
    assert_eq!(orders, STOCK as u64, "{summary}");
    assert_eq!(r.orders.created, STOCK as u64, "{summary}");
    assert_eq!(r.orders.acknowledged, STOCK as u64, "{summary}");
    let inv = r.inventory.as_ref().expect("inventory read");
    assert_eq!(inv.total, STOCK);
    assert_eq!(inv.available, 0, "{summary}");
    assert_eq!(inv.reserved + inv.sold, STOCK, "{summary}");
    assert!(summary.contains(&urls[1]), "a row per server:\n{summary}");
}

// Checks `--spawn --instances 2` from the command line: the bench starts two servers on
// one database, deals its 32 connections over them, and exits 0 with a JSON result
// whose two targets (the first one the product's) each got attempts and answered every
// one, whose orders over both are exactly the stock, and in which each server's own
// count of its purchase answers (its GET /metrics) was found equal to what the
// generator got from it.
#[test]
fn spawn_instances_from_the_command_line() {
    let bin = common::server_bin();
    let json = common::scratch_path("instances.json");
    let stdout = common::bench_stdout(
        std::process::Command::new(env!("CARGO_BIN_EXE_flashsale-bench"))
            .args([
                "rush",
                "--quick",
                "--spawn",
                "--instances",
                "2",
                "--no-progress",
            ])
            .arg("--server-bin")
            .arg(&bin)
            .args(["--attempts", &ATTEMPTS.to_string(), "--users", USERS])
            .args(["--stock", &STOCK.to_string(), "--connections", "32"])
            .arg("--json")
            .arg(&json),
    );
    let text = std::fs::read_to_string(&json).expect("JSON result written");
    let _ = std::fs::remove_file(&json);
    let r: flashsale_bench::report::BenchResult =
        serde_json::from_str(&text).expect("JSON result parses");
    assert!(r.passed && r.config.spawned, "{stdout}");
    assert_eq!(r.targets.len(), 2, "{stdout}");
    assert_eq!(r.config.base_url, r.targets[0].base_url);
    for t in &r.targets {
        assert!(
            t.attempts > 0 && t.unknown() == 0,
            "{}\n{stdout}",
            t.base_url
        );
        let agreed = format!(
            "the server's own count of its purchase answers (GET /metrics) at {} agrees",
            t.base_url
        );
        assert!(
            r.checks
                .client_passed
                .iter()
                .any(|l| l.starts_with(&agreed)),
            "{agreed}: {:?}",
            r.checks
        );
    }
    let orders: u64 = r.targets.iter().map(|t| t.orders()).sum();
    assert_eq!(orders, STOCK as u64, "{stdout}");
    assert_eq!(r.orders.created, STOCK as u64, "{stdout}");
}
