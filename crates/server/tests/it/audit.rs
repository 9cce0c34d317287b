//! `flashsale audit` on a live system: work in flight within its bound is pending, not a
//! violation; work stuck past its bound is a violation (exit 1). Runs the audit as the
//! command does (`Maintenance::audit`, the function `flashsale audit` calls) and as the
//! binary itself.

use std::process::Output;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flashsale_core::ProductId;
use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{cleanup_all, order_id, Routes, TestApp, TestEvents, NATS_URL};

/// How long the buyers keep buying: long enough for several audits to run among them.
const FLOOD_FOR: Duration = Duration::from_secs(4);
/// Concurrent buyers: more than the machine's cores, so purchases overlap the audit's
/// reads at every step.
const BUYERS: i64 = 8;
/// Most purchases one buyer makes, whatever the machine's speed.
const PURCHASES_PER_BUYER_MAX: i64 = 2_000;
/// Every this many orders a buyer cancels the one it just got: cancels give units back
/// between the audit's reads too.
const CANCEL_EVERY: i64 = 5;

/// Runs `flashsale audit --product <id>` against the test's stores, with extra settings.
fn run_audit(app: &TestApp, product: i64, settings: &[(&str, &str)]) -> Output {
    app.run_binary(&["audit", "--product", &product.to_string()], settings)
}

// Checks the audit during a flood of purchases (8 concurrent buyers for 4 s, some orders
// cancelled at once, the relay running): every audit taken meanwhile, through
// `Maintenance::audit` and as the binary, finds no violation (the binary exits 0), and at
// least one of them saw work in flight and reported it as pending. After the flood the
// final audit is clean too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_during_a_flood_of_purchases_finds_no_violation() {
    let app = Arc::new(TestApp::spawn().await);
    let events = TestEvents::start(&app, NATS_URL).await;
    let product = 5301;
    app.create_product(product, 1_000_000, None).await;
    let done = Arc::new(AtomicBool::new(false));
    let orders = Arc::new(AtomicUsize::new(0));
    let mut buyers = Vec::new();
    for b in 0..BUYERS {
        let (app, done, orders) = (app.clone(), done.clone(), orders.clone());
        buyers.push(tokio::spawn(async move {
            for i in 0..PURCHASES_PER_BUYER_MAX {
                if done.load(Ordering::Relaxed) {
                    break;
                }
                let user = b + 1;
                let body = app
                    .bought(&format!("REQ_flood_{b}_{i}"), user, product, 1)
                    .await;
                orders.fetch_add(1, Ordering::Relaxed);
                if i % CANCEL_EVERY == 0 {
                    let (status, body) = app.cancel(order_id(&body), user).await;
                    assert_eq!(status, StatusCode::OK, "{body}");
                }
            }
        }));
    }
    let id = ProductId::parse(product).expect("product id");
    let started = Instant::now();
    let (mut audits, mut with_pending) = (0, 0);
    let mut binary_runs = 0;
    while started.elapsed() < FLOOD_FOR {
        let report = app.maintenance.audit(id).await.expect("audit");
        assert!(
            report.violations.is_empty(),
            "audit during the flood:\n{report}"
        );
        audits += 1;
        with_pending += usize::from(!report.pending.is_empty());
        if audits % 4 == 0 {
            let out = tokio::task::spawn_blocking({
                let app = app.clone();
                move || run_audit(&app, product, &[])
            })
            .await
            .expect("audit process");
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "flashsale audit during the flood:\n{text}"
            );
            binary_runs += 1;
        }
    }
    done.store(true, Ordering::Relaxed);
    for b in buyers {
        b.await.expect("buyer");
    }
    let bought = orders.load(Ordering::Relaxed);
    println!(
        "{audits} audits ({with_pending} with pending work, {binary_runs} by the binary) \
         during {bought} purchases"
    );
    assert!(binary_runs > 0, "the binary ran during the flood");
    assert!(
        with_pending > 0,
        "no audit saw work in flight: the flood was not live"
    );
    let report = app.maintenance.audit(id).await.expect("audit");
    assert!(
        report.violations.is_empty(),
        "audit after the flood:\n{report}"
    );
    events.cleanup().await;
    if let Ok(app) = Arc::try_unwrap(app) {
        app.cleanup().await;
    }
}

// Checks undelivered events with no relay running (the event workers are never started)
// and the outbox bound set to 2 s: just after the purchases the audit reports their
// events as pending I7 work and no violation; once they are older than the bound it
// reports the I7 violation, and `flashsale audit` with the same bound exits 1 naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undelivered_events_past_the_bound_are_a_violation() {
    const BOUND: &str = "2s";
    let bound = Duration::from_secs(2);
    let app = TestApp::spawn_with(Routes::default(), &[("OUTBOX_PENDING_MAX", BOUND)]).await;
    let product = 5302;
    app.create_product(product, 10, None).await;
    for i in 0..3 {
        app.bought(&format!("REQ_stuck_{i}"), i + 1, product, 1)
            .await;
    }
    let bought = Instant::now();
    let id = ProductId::parse(product).expect("product id");
    let report = app.maintenance.audit(id).await.expect("audit");
    if bought.elapsed() < bound {
        assert!(report.violations.is_empty(), "{report}");
        assert!(
            report.pending.iter().any(|p| p.invariant == "I7"),
            "{report}"
        );
    }
    tokio::time::sleep(bound.saturating_sub(bought.elapsed()) + Duration::from_millis(200)).await;
    let report = app.maintenance.audit(id).await.expect("audit");
    let broken: Vec<_> = report.violations.iter().map(|v| v.invariant).collect();
    assert_eq!(broken, vec!["I7"], "{report}");
    let out = run_audit(&app, product, &[("OUTBOX_PENDING_MAX", BOUND)]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("VIOLATION I7"), "{text}");
    app.cleanup().await;
}

// Checks the audit reads the stock log and the outbox's packs from MariaDB: after
// concurrent purchases (group commits, each writing one stock-log row and one pack of
// `order_created` events per product), a payment and a cancel, it finds no violation;
// then, tampering with one fact at a time and putting it back, it finds each: a group
// commit's stock-log row gone (I4: fewer units logged than ordered), the payment's
// `confirm` row gone (I4, naming its request), and one event copied inside its pack
// (I7, naming its request: its order then has two `order_created` events).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stock_log_and_packed_events_are_audited() {
    let app = TestApp::spawn().await;
    let product = 5303;
    app.create_product(product, 40, None).await;
    let bought = futures::future::join_all((0..24).map(|i| {
        let app = &app;
        async move {
            app.purchase(&format!("REQ_log_{i}"), i + 1, product, 1)
                .await
        }
    }))
    .await;
    let mut orders = Vec::new();
    for (i, (status, body)) in bought.iter().enumerate() {
        assert_eq!(*status, StatusCode::CREATED, "{body}");
        orders.push((order_id(body), i64::try_from(i).expect("small") + 1));
    }
    app.pay_and_cancel(orders[0], orders[1]).await;
    assert!(
        app.count("SELECT COUNT(*) FROM inventory_batch_log").await >= 1,
        "the purchases went through group commits"
    );
    let id = ProductId::parse(product).expect("product id");
    let audit = || async { app.maintenance.audit(id).await.expect("audit") };
    let report = audit().await;
    assert!(report.violations.is_empty(), "{report}");

    let pool = &app.pool;
    let exec = |sql: &'static str| async move {
        sqlx::query(sql).execute(pool).await.expect(sql);
    };
    let tampered = [
        (
            [
                "CREATE TABLE kept_batch_log AS SELECT * FROM inventory_batch_log ORDER BY id LIMIT 1",
                "DELETE FROM inventory_batch_log WHERE id = (SELECT id FROM kept_batch_log)",
            ],
            "stock log records",
            [
                "INSERT INTO inventory_batch_log SELECT * FROM kept_batch_log",
                "DROP TABLE kept_batch_log",
            ],
        ),
        (
            [
                "CREATE TABLE kept_log AS SELECT * FROM inventory_log WHERE type = 'confirm'",
                "DELETE FROM inventory_log WHERE type = 'confirm'",
            ],
            "REQ_log_0",
            [
                "INSERT INTO inventory_log SELECT * FROM kept_log",
                "DROP TABLE kept_log",
            ],
        ),
    ];
    for (tamper, naming, put_back) in tampered {
        for sql in tamper {
            exec(sql).await;
        }
        assert_audit_finds(&app, id, "I4", naming).await;
        for sql in put_back {
            exec(sql).await;
        }
        assert!(audit().await.violations.is_empty());
    }

    let copied: String = sqlx::query_scalar(
        "SELECT CONVERT(JSON_VALUE(payload, '$[0].request_id') USING utf8mb4) FROM outbox \
         WHERE request_id IS NULL ORDER BY id LIMIT 1",
    )
    .fetch_one(&app.pool)
    .await
    .expect("a pack");
    exec(
        "UPDATE outbox SET payload = JSON_ARRAY_APPEND(payload, '$', \
         JSON_EXTRACT(payload, '$[0]')), events = events + 1 \
         WHERE request_id IS NULL ORDER BY id LIMIT 1",
    )
    .await;
    assert_audit_finds(&app, id, "I7", &copied).await;
    app.cleanup().await;
}

/// Fails unless the audit of `id` reports a violation of `invariant` alone, and its
/// report names `naming`.
async fn assert_audit_finds(app: &TestApp, id: ProductId, invariant: &str, naming: &str) {
    let report = app.maintenance.audit(id).await.expect("audit");
    let broken: Vec<_> = report.violations.iter().map(|v| v.invariant).collect();
    assert_eq!(broken, vec![invariant], "{report}");
    assert!(report.to_string().contains(naming), "{report}");
}

/// The verdicts recorded for `product` (None: for every product), by `app`'s database.
async fn verdicts(app: &TestApp, product: Option<i64>) -> Vec<(i64, i64)> {
    let sql = match product {
        Some(_) => "SELECT products, violations FROM audit_run WHERE product_id = ? ORDER BY id",
        None => "SELECT products, violations FROM audit_run WHERE product_id IS NULL ORDER BY id",
    };
    app.rows(sql, product).await
}

// Checks the audits `serve` runs by itself, with two instances side by side: a product
// whose sale has ended and settled is audited by exactly one of them (both make a pass
// at once; one verdict recorded for it, by one instance), a product still on sale is not,
// and the period's audit of every product runs once over both; a second pass of either
// finds nothing left to do. Then a product whose Redis count was moved behind the
// service's back ends its sale: its scheduled audit records the violation, and
// `flashsale_audit_violations` on `/metrics` and the live page's data say so. (The
// lease's takeover is the ledger contract's: `scheduled_audits_are_claimed_once`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_audits_run_once_over_the_instances() {
    let a = TestApp::spawn().await;
    let b = a.spawn_beside(&[]).await;
    let settings = flashsale_app::AuditScheduleSettings {
        settled_for: Duration::ZERO,
        every: Some(Duration::from_secs(3600)),
    };
    let ends_soon = |id: i64| {
        let ends = chrono::Utc::now() + chrono::Duration::milliseconds(1_500);
        json!({"product_id": id, "name": "ending", "stock": 5,
            "sale_ends_at": ends.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)})
    };
    let (status, body) = a.admin_post("/v1/products", ends_soon(5401)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    a.create_product(5402, 5, None).await;
    a.bought("sched-1", 1, 5401, 2).await;
    a.bought("sched-2", 2, 5402, 1).await;
    tokio::time::sleep(Duration::from_millis(1_700)).await;

    let (one, two) = tokio::join!(
        a.maintenance.scheduled_audits_once("instance-a", &settings),
        b.maintenance.scheduled_audits_once("instance-b", &settings),
    );
    let (one, two) = (one.expect("a's pass"), two.expect("b's pass"));
    assert_eq!(
        one.sales + two.sales,
        1,
        "the ended sale audited once: {one:?} {two:?}"
    );
    assert!(
        one.every ^ two.every,
        "every product audited once: {one:?} {two:?}"
    );
    assert_eq!(one.violations + two.violations, 0);
    assert_eq!(verdicts(&a, Some(5401)).await, vec![(1, 0)]);
    assert_eq!(verdicts(&a, Some(5402)).await, vec![], "still on sale");
    assert_eq!(verdicts(&a, None).await, vec![(2, 0)]);
    let again = a
        .maintenance
        .scheduled_audits_once("instance-a", &settings)
        .await;
    assert_eq!(
        again.expect("pass"),
        flashsale_app::ScheduledAudits::default()
    );

    let (status, body) = a.admin_post("/v1/products", ends_soon(5403)).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    a.bought("sched-3", 3, 5403, 1).await;
    a.bump_entry(5403, "avail", 2).await;
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    let found = b
        .maintenance
        .scheduled_audits_once("instance-b", &settings)
        .await;
    let found = found.expect("pass");
    assert_eq!(found.sales, 1);
    assert!(found.violations > 0, "{found:?}");
    let recorded = verdicts(&a, Some(5403)).await;
    assert!(recorded.len() == 1 && recorded[0].1 > 0, "{recorded:?}");
    tokio::time::sleep(flashsale_app::metrics::SCRAPE_REUSE).await;
    let (text, _) = a.scrape_metrics().await;
    let gauge = text
        .lines()
        .find_map(|l| l.strip_prefix("flashsale_audit_violations "))
        .and_then(|v| v.trim().parse::<i64>().ok());
    assert!(gauge.is_some_and(|n| n > 0), "{gauge:?}");
    let (status, page) = a.get("/dashboard/data").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page["audit"]["violations_24h"]
            .as_i64()
            .is_some_and(|n| n > 0),
        "{page}"
    );
    cleanup_all([a, b]).await;
}
