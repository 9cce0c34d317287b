//! `flashsale demo` as a newcomer runs it: the built binary, against a service it starts
//! itself and against one already running, its summary read and its claims checked
//! against MariaDB.

use std::process::{Command, Output};

use flashsale_testkit::{delete_prefix, free_port, redis_prefix, TestDb};
use sqlx::MySqlPool;

use crate::helpers::{
    delete_stream, stream_name, Routes, TestApp, TestEvents, ADMIN_TOKEN, MYSQL_SERVER, NATS_URL,
    REDIS_URL,
};

const BIN: &str = env!("CARGO_BIN_EXE_flashsale");

/// The demo's stdout, and its log file removed: named (and written) when the demo started
/// a service, else neither named nor left in `tmp`, the demo's temporary directory.
fn stdout_of(out: &Output, tmp: &std::path::Path, started_one: bool) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let log = text
        .lines()
        .find_map(|line| line.strip_prefix("log       "))
        .and_then(|rest| rest.split_whitespace().next());
    match (log, started_one) {
        (Some(path), true) => {
            let written = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            assert!(written > 0, "the demo's log {path} is missing or empty");
            std::fs::remove_file(path).expect("remove the demo's log");
        }
        (None, false) => {}
        (log, _) => panic!("the demo named log {log:?}, started a service: {started_one}:\n{text}"),
    }
    let left: Vec<_> = std::fs::read_dir(tmp)
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "the demo left {left:?}");
    let _ = std::fs::remove_dir(tmp);
    text
}

/// `flashsale demo` with `tmp` as its TMPDIR and no admin token from the environment;
/// the caller adds the rest.
fn demo_in(tmp: &std::path::Path) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.arg("demo")
        .env("TMPDIR", tmp)
        .env_remove("FLASHSALE_ADMIN_TOKEN");
    cmd
}

/// Runs `demo` to its end, off the test's runtime threads.
async fn run(mut demo: Command) -> Output {
    tokio::task::spawn_blocking(move || demo.output().expect("run flashsale demo"))
        .await
        .expect("join")
}

/// Runs `demo`, which must exit 0, and returns its stdout (see [`stdout_of`]).
async fn succeeded(demo: Command, tmp: &std::path::Path, started_one: bool) -> String {
    let out = run(demo).await;
    let text = stdout_of(&out, tmp, started_one);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// A fresh temporary directory for one run of the demo (its TMPDIR), to see what it leaves.
fn scratch() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("flashsale-demo-it-{}", redis_prefix()));
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

/// Fails unless the demo's output `text` holds every one of `says` and none of `never`.
fn assert_says(text: &str, says: &[&str], never: &[&str]) {
    for line in says {
        assert!(text.contains(line), "no {line:?} in:\n{text}");
    }
    for line in never {
        assert!(!text.contains(line), "{line:?} in:\n{text}");
    }
}

/// The number in the summary line starting with `start`, right after it.
fn number_after(text: &str, start: &str) -> i64 {
    let line = text
        .lines()
        .find_map(|l| l.split_once(start).map(|(_, rest)| rest.to_owned()))
        .unwrap_or_else(|| panic!("no {start:?} in:\n{text}"));
    line.trim_start()
        .split(|c: char| !c.is_ascii_digit() && c != ',')
        .next()
        .map(|n| n.replace(',', ""))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after {start:?}: {line}"))
}

/// MariaDB's facts about `product`: (orders, distinct request_ids among them, PAID
/// orders, PENDING_PAYMENT orders, the counters' total, sold and reserved).
async fn facts(pool: &MySqlPool, product: i64) -> (i64, i64, i64, i64, i64, i64, i64) {
    let (orders, requests, paid, pending): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT COUNT(*), COUNT(DISTINCT request_id), \
         CAST(COALESCE(SUM(status = 'PAID'), 0) AS SIGNED), \
         CAST(COALESCE(SUM(status = 'PENDING_PAYMENT'), 0) AS SIGNED) \
         FROM orders WHERE product_id = ?",
    )
    .bind(product)
    .fetch_one(pool)
    .await
    .expect("orders");
    let (total, sold, reserved): (i64, i64, i64) = sqlx::query_as(
        "SELECT total_stock, sold_count, pre_deduct_stock FROM product_inventory WHERE product_id = ?",
    )
    .bind(product)
    .fetch_one(pool)
    .await
    .expect("inventory");
    (orders, requests, paid, pending, total, sold, reserved)
}

// Checks `flashsale demo --spawn` end to end: the built binary starts its own service
// (a private database, Redis prefix and NATS stream; 100 units, 1,000 buyers, a 3 s
// payment timeout), pauses and resumes the sale, waits for the unpaid orders to expire,
// refunds a paid order with its unit back on sale, sells the units that came back, and
// exits 0 with every summary line "ok"; the flood is unpaced
// (`--flood-duration 0s`) to keep the suite fast. It names its log, which holds its
// service's lines. Then MariaDB is asked directly: one order per request_id, sold ==
// PAID orders == the stock, nothing held, and as many orders as the demo says its
// requests got.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_spawns_a_service_sells_out_and_checks_it() {
    let db = TestDb::create(MYSQL_SERVER).await.expect("test db");
    let prefix = redis_prefix();
    let stream = stream_name(&prefix);
    let tmp = scratch();
    let mut demo = demo_in(&tmp);
    demo.args(["--spawn", "--stock", "100", "--buyers", "1000"])
        .args(["--payment-timeout", "3s", "--flood-duration", "0s"])
        .env("FLASHSALE_LISTEN", format!("127.0.0.1:{}", free_port()))
        .env("FLASHSALE_DATABASE_URL", db.url())
        .env("FLASHSALE_REDIS_URL", REDIS_URL)
        .env("FLASHSALE_REDIS_PREFIX", &prefix)
        .env("FLASHSALE_NATS_STREAM", &stream)
        .env("FLASHSALE_NATS_SUBJECT_PREFIX", stream.to_lowercase())
        .env_remove("FLASHSALE_METRICS_LISTEN");
    let text = succeeded(demo, &tmp, true).await;
    let says = [
        "ok    the counters add up: sold 100 + reserved 0 + available 0 == stock 100",
        "ok    sold == stock: 100 of 100 units sold, none held or left",
        "ok    sold == the orders paid: 100 units sold, 100 orders paid",
        "ok    every order left unpaid expired:",
        "ok    one order per request:",
        "ok    double-clicks never got two orders:",
        "ok    every buyer got an answer:",
        "ok    a paused sale refused a purchase (409 sale_paused) and was resumed",
        "ok    a paid order refunded (REFUNDED) put its unit back on sale:",
        "ok    the audit of product 1001: 0 violations",
        "all 10 checks passed",
    ];
    assert_says(&text, &says, &["FAIL"]);

    let pool = MySqlPool::connect(&db.url()).await.expect("check pool");
    let (orders, requests, paid, pending, total, sold, reserved) = facts(&pool, 1001).await;
    assert_eq!(orders, requests, "one order per request_id");
    assert_eq!(
        (total, sold, paid),
        (100, 100, 100),
        "sold == paid == stock"
    );
    assert_eq!((pending, reserved), (0, 0), "nothing held");
    assert_eq!(
        orders,
        number_after(&text, "one order per request: "),
        "the demo saw every order: {text}"
    );
    pool.close().await;
    let _ = delete_prefix(REDIS_URL, &prefix).await;
    delete_stream(NATS_URL, &stream).await;
    let _ = db.drop_db().await;
}

// Checks `flashsale demo --base-url` against a service already running (a TestApp with
// its event workers, the default 15-minute payment timeout, buyers named by a gateway's
// header, which the demo sets as that gateway would). Without the service's
// admin token it stops at once with exit 2, saying so, and creates nothing. With it (on
// the command line) the demo does not wait for the unpaid orders and says so — "sold ==
// stock" is reported as not made, never as passed — and exits 0. MariaDB agrees: one
// order per request_id, sold == PAID orders, the units held == the PENDING_PAYMENT
// orders == the demo's count of orders left unpaid, and sold + held == the stock.
// Neither run starts a service, so neither names a log nor leaves a file in its
// temporary directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_against_a_running_service_does_not_claim_what_it_did_not_wait_for() {
    let app = TestApp::spawn_with(Routes::default(), &[("BUYER_AUTH", "header")]).await;
    let events = TestEvents::start(&app, NATS_URL).await;
    let db_url = app.db.as_ref().expect("the test's database").url();
    let tmp = scratch();
    let mut demo = demo_in(&tmp);
    demo.args(["--base-url", &app.base]);
    let no_token = run(demo).await;
    let _ = stdout_of(&no_token, &tmp, false);
    let err = String::from_utf8_lossy(&no_token.stderr);
    assert_eq!(no_token.status.code(), Some(2), "{err}");
    assert!(err.contains("needs its admin token"), "{err}");
    assert_eq!(app.count("SELECT COUNT(*) FROM products").await, 0);
    let tmp = scratch();
    let mut demo = demo_in(&tmp);
    demo.args(["--base-url", &app.base, "--admin-token", ADMIN_TOKEN])
        .args(["--stock", "50", "--buyers", "500", "--flood-duration", "0s"])
        .env("FLASHSALE_DATABASE_URL", db_url)
        .env("FLASHSALE_REDIS_URL", REDIS_URL)
        .env("FLASHSALE_REDIS_PREFIX", &app.prefix)
        .env("FLASHSALE_BUYER_AUTH", "header");
    let text = succeeded(demo, &tmp, false).await;
    let answers = format!("service   {} answers", app.base);
    let says = [
        answers.as_str(),
        "the demo does not wait for them",
        "--    sold == stock: not yet",
        "--    every order left unpaid expired: not waited for",
        "ok    sold out: none available",
        "ok    the audit of product 1001: 0 violations",
    ];
    assert_says(&text, &says, &["ok    sold == stock", "FAIL"]);

    let (orders, requests, paid, pending, total, sold, reserved) = facts(&app.pool, 1001).await;
    assert_eq!(orders, requests, "one order per request_id");
    assert_eq!(sold, paid, "sold == PAID orders");
    assert_eq!(reserved, pending, "held == PENDING_PAYMENT orders");
    assert!(pending > 0, "some orders were left unpaid");
    assert_eq!(
        pending,
        number_after(&text, "units held by the "),
        "the demo's count of unpaid orders: {text}"
    );
    assert_eq!(sold + reserved, total, "sold out");
    assert_eq!(total, 50);
    events.cleanup().await;
    app.cleanup().await;
}
