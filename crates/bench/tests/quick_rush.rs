//! The bench end to end: `flashsale-bench rush --quick --spawn` against a debug-built
//! flashsale, on the shared Redis, MariaDB and NATS (its own database, key prefix and
//! stream, removed at the end by the bench).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use flashsale_bench::report::BenchResult;

const BENCH: &str = env!("CARGO_BIN_EXE_flashsale-bench");
/// The quick rush, trimmed further so the whole test (server start, load, quiet wait,
/// audit, cleanup) stays under ~20 s on a busy 2-core machine with a debug server.
const ATTEMPTS: &str = "2000";
const USERS: &str = "800";
const STOCK: i64 = 100;
/// Warn (not fail) past this: the machine may be shared with other test binaries.
const EXPECTED_MAX: Duration = Duration::from_secs(20);

// Checks the quick rush end to end: the bench starts its own flashsale, sells a
// 100-unit product to 2,000 attempts from 800 users (per-user limit 1, 10% duplicate
// request_ids), and exits 0 with a JSON result that says it passed — exactly the stock
// sold, the rest refused with 409 sold_out/limit_exceeded, the audit passed, the
// server's own answer counts (GET /metrics) equal to the generator's, the server's
// memory and the CPU time of each process read — and an HTML report with the
// inline SVG plots. It runs the real binary as a user would.
#[test]
fn quick_rush_against_a_spawned_server() {
    let server = common::server_bin();
    let dir = common::scratch_path("test");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let json = dir.join("rush.json");
    let html = dir.join("rush.html");
    let started = Instant::now();
    let stdout = common::bench_stdout(
        Command::new(BENCH)
            .args(["rush", "--quick", "--spawn", "--no-progress"])
            .arg("--server-bin")
            .arg(&server)
            .args(["--attempts", ATTEMPTS, "--users", USERS])
            .args(["--stock", &STOCK.to_string(), "--connections", "32"])
            .arg("--json")
            .arg(&json)
            .arg("--html")
            .arg(&html),
    );
    let took = started.elapsed();
    if took > EXPECTED_MAX {
        eprintln!("note: the quick rush took {took:?} (busy machine?)");
    }
    assert!(stdout.contains("RESULT: PASS"), "{stdout}");

    let text = std::fs::read_to_string(&json).expect("JSON result written");
    let r: BenchResult = serde_json::from_str(&text).expect("JSON result parses");
    assert!(r.passed);
    assert_eq!(r.scenario, "rush");
    assert!(r.config.spawned && r.config.quick);
    assert_eq!(r.checks.audit.status, "passed", "{}", r.checks.audit.output);
    assert!(r.checks.client_violations.is_empty());
    // The server's own count of its purchase answers (GET /metrics) was compared with
    // the generator's, and agreed.
    common::assert_client_passed(&r, |l| {
        l.starts_with("the server's own count of its purchase answers")
    });
    assert_eq!(r.attempts.sent, 2000, "{stdout}");
    assert!(r.attempts.client_retries > 0, "some request_ids re-sent");
    // Exactly the stock was sold: each unit to one acknowledged order.
    assert_eq!(r.orders.created, STOCK as u64, "{stdout}");
    assert_eq!(r.orders.acknowledged, STOCK as u64);
    let inv = r.inventory.as_ref().expect("inventory read");
    assert_eq!((inv.total, inv.available, inv.reserved), (STOCK, 0, STOCK));
    let purchase = r.op("purchase").expect("purchase stats");
    assert!(purchase.latency.count >= 2000);
    assert!(purchase.latency.p50_us <= purchase.latency.p99_us);
    assert!(purchase.latency.p99_us <= purchase.latency.max_us);
    assert!(purchase.errors.get("sold_out").copied().unwrap_or(0) > 0);
    let answered: u64 = purchase.statuses.values().sum();
    assert_eq!(answered, purchase.latency.count);
    assert!(!r.timeline.is_empty());
    assert!(r.throughput.answers_per_s > 0.0);
    // The spawned server's memory was read from /proc, and the CPU time of the server,
    // the generator, the stores and the machine over the load: per attempt and per
    // order, the server's part of the machine's (2,000 attempts cost the server CPU
    // time, however fast the machine), and the machine's at least the server's and the
    // generator's together (give or take a few ticks of sampling).
    assert!(r.memory.server_vm_hwm_kb.unwrap_or(0) > 0);
    let cpu = |name: &str| r.cpu.seconds.get(name).copied().unwrap_or(0.0);
    // Redis and MariaDB are read too whenever they run on this machine (in CI they do).
    let local = flashsale_bench::probes::cpu_snapshot(&[], &[]);
    let stores = ["redis", "mariadb"]
        .into_iter()
        .filter(|s| local.ticks.keys().any(|(name, _)| name == s));
    for name in ["server", "generator", "machine"].into_iter().chain(stores) {
        assert!(
            r.cpu.us_per_attempt.contains_key(name),
            "{name}: {:?}",
            r.cpu
        );
        assert!(r.cpu.us_per_order.contains_key(name), "{name}: {:?}", r.cpu);
    }
    assert!(cpu("server") > 0.0, "{:?}", r.cpu);
    assert!(
        cpu("machine") + 0.05 >= cpu("server") + cpu("generator"),
        "{:?}",
        r.cpu
    );

    let report = std::fs::read_to_string(&html).expect("HTML written");
    assert!(report.starts_with("<!DOCTYPE html>"));
    assert!(
        report.matches("<svg").count() >= 2,
        "throughput and latency plots"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
