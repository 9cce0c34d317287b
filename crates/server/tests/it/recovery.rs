//! The background workers, driven one pass at a time: payment timeout, recovery of
//! abandoned holds and of stock returns that did not make it, and the audit.

use std::time::Duration;

use flashsale_app::ports::Reserve;
use flashsale_app::StockGate;
use flashsale_core::PurchaseRequest;
use flashsale_redis::RedisGate;
use futures::stream::{self, StreamExt};
use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{
    assert_error, code, order_id, wait_until, TestApp, TestEvents, NATS_URL, REQUEST_RELEASED,
};
use crate::invariants;

/// Settings that make the recovery window short enough for a test: requests give up
/// after 1 s, holds are recovered after 2 s.
pub(crate) const FAST_RECOVERY: &[(&str, &str)] =
    &[("REQUEST_TIMEOUT", "1s"), ("RECOVERY_AFTER", "2s")];

pub(crate) fn gate(app: &TestApp) -> RedisGate {
    crate::helpers::gate_on_shared_redis(&app.prefix)
}

/// Takes a hold the way a purchase's first step does, and stops there (as if the process
/// died before its commit).
pub(crate) async fn abandoned_hold(
    app: &TestApp,
    request_id: &str,
    user: i64,
    product: i64,
) -> i64 {
    let request = PurchaseRequest::parse(request_id, user, product, 1, 5).expect("valid");
    match gate(app).reserve(&request, None).await.expect("reserve") {
        Reserve::Reserved { hold } => hold.id.get(),
        other => panic!("expected a fresh hold, got {other:?}"),
    }
}

// Checks the payment-timeout worker: 20 orders expire unpaid (1 s deadline) while 10 more
// are paid in time; one expiry pass cancels exactly the 20 with reason payment_timeout
// and returns their units; a second pass does nothing; a late payment gets
// order_expired; the audit is clean.
#[tokio::test]
async fn unpaid_orders_expire_exactly_once() {
    let app = TestApp::selling_with(&[("PAYMENT_TIMEOUT", "1s")], (2100, 40, None)).await;
    let mut unpaid = Vec::new();
    for i in 0..30 {
        let b = app.bought(&format!("REQ_exp_{i}"), i + 1, 2100, 1).await;
        if i < 10 {
            let (s, _) = app.pay(order_id(&b), i + 1).await;
            assert_eq!(s, StatusCode::OK);
        } else {
            unpaid.push((order_id(&b), i + 1));
        }
    }
    assert_eq!(
        app.maintenance.expire_once().await.expect("pass"),
        0,
        "nothing due yet"
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(app.maintenance.expire_once().await.expect("pass"), 20);
    assert_eq!(
        app.maintenance.expire_once().await.expect("pass"),
        0,
        "exactly once"
    );
    let expired = app
        .count("SELECT COUNT(*) FROM orders WHERE status = 'CANCELLED' AND cancel_reason = 'payment_timeout'")
        .await;
    assert_eq!(expired, 20);
    assert_eq!(app.redis_available(2100).await, Some(30));
    let (id, user) = unpaid[0];
    let (s, b) = app.pay(id, user).await;
    assert_eq!((s, code(&b)), (StatusCode::CONFLICT, "order_expired"));
    invariants::assert_audit_clean(&app, 2100).await;
    invariants::assert_ok_and_clean_up(app, 2100).await;
}

// Checks that an order whose cancellation fails every time (its reservation made to
// disagree with it: no longer PROCESSING) does not stop the orders due after it. It is
// the oldest due, so the pass meets it first: the pass passes it over, expires the three
// others and gives their units back, and ends in its error; the order is left as it was.
#[tokio::test]
async fn an_order_that_cannot_expire_does_not_stop_the_others() {
    let app = TestApp::selling_with(&[("PAYMENT_TIMEOUT", "1s")], (2150, 10, None)).await;
    app.bought("REQ_exb_bad", 1, 2150, 1).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    for i in 0..3 {
        app.bought(&format!("REQ_exb_{i}"), i + 2, 2150, 1).await;
    }
    sqlx::query(
        "UPDATE inventory_reservation SET status = 'RELEASED' WHERE request_id = 'REQ_exb_bad'",
    )
    .execute(&app.pool)
    .await
    .expect("make the rows disagree");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let pass = app.maintenance.expire_once().await;
    assert!(pass.is_err(), "the pass reports the order it passed over");
    let cancelled = app
        .count("SELECT COUNT(*) FROM orders WHERE status = 'CANCELLED' AND request_id LIKE 'REQ_exb\\_%' AND request_id <> 'REQ_exb_bad'")
        .await;
    assert_eq!(cancelled, 3, "the orders due after it expired");
    let bad = app
        .count("SELECT COUNT(*) FROM orders WHERE status = 'PENDING_PAYMENT' AND request_id = 'REQ_exb_bad'")
        .await;
    assert_eq!(bad, 1, "the failing order is left as it was");
    assert_eq!(app.redis_available(2150).await, Some(9), "three units back");
    app.cleanup().await;
}

// Checks pay racing the expiry worker at the deadline, over 40 orders: for each, a payment
// and an expiry pass run at the same moment just after the deadline; every order ends
// either PAID or CANCELLED (payment_timeout), never both, and units match.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pay_racing_expiry_has_one_winner() {
    let app = TestApp::selling_with(&[("PAYMENT_TIMEOUT", "1s")], (2200, 40, None)).await;
    let mut orders = Vec::new();
    for i in 0..40 {
        let (_, b) = app.purchase(&format!("REQ_pe_{i}"), i + 1, 2200, 1).await;
        orders.push((order_id(&b), i + 1));
    }
    tokio::time::sleep(Duration::from_millis(950)).await;
    let payments = stream::iter(orders.clone())
        .map(|(id, user)| {
            let app = &app;
            async move {
                let path = format!("/v1/orders/{id}/pay");
                app.post(&path, json!({"user_id": user})).await
            }
        })
        .buffer_unordered(40)
        .collect::<Vec<_>>();
    let expiries = async {
        let mut n = 0;
        for _ in 0..20 {
            n += app.maintenance.expire_once().await.expect("pass");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        n
    };
    let (paid_answers, _) = tokio::join!(payments, expiries);
    tokio::time::sleep(Duration::from_millis(200)).await;
    app.maintenance.expire_once().await.expect("final pass");
    let paid_ok = paid_answers
        .iter()
        .filter(|(s, _)| *s == StatusCode::OK)
        .count() as i64;
    for (s, b) in &paid_answers {
        assert!(
            *s == StatusCode::OK || (*s == StatusCode::CONFLICT && code(b) == "order_expired"),
            "{s} {b}"
        );
    }
    assert_eq!(
        app.count("SELECT COUNT(*) FROM orders WHERE status = 'PAID'")
            .await,
        paid_ok
    );
    assert_eq!(
        app.count("SELECT COUNT(*) FROM orders WHERE status = 'CANCELLED'")
            .await,
        40 - paid_ok
    );
    assert_eq!(app.redis_available(2200).await, Some(40 - paid_ok));
    invariants::assert_ok_and_clean_up(app, 2200).await;
}

// Checks recovery of a hold whose attempt died before its commit: within the recovery
// window recovery leaves it alone (the attempt may still be working); after it, one pass
// fences the request_id in MariaDB (RELEASED, abandoned) and gives the units back, so a
// late retry of that request gets request_released and can never create an order. A
// committed order's index entry is trimmed, not released (by the gate's early trim, or
// by recovery if that missed it): the index ends with neither entry.
#[tokio::test]
async fn abandoned_hold_is_fenced_and_released() {
    let app = TestApp::selling_with(FAST_RECOVERY, (2300, 5, Some(1))).await;
    app.bought("REQ_kept", 1, 2300, 1).await;
    abandoned_hold(&app, "REQ_dead", 2, 2300).await;
    assert_eq!(app.redis_available(2300).await, Some(3));
    let report = app.maintenance.recover_once().await.expect("pass");
    assert_eq!(
        report.released, 0,
        "inside the window nothing is touched: {report:?}"
    );
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let report = app.maintenance.recover_once().await.expect("pass");
    assert_eq!(report.released, 1, "{report:?}");
    assert!(report.aligned <= 1, "{report:?}");
    let pending: Vec<String> = redis::cmd("ZRANGE")
        .arg(app.key(2300, "pending"))
        .arg(0)
        .arg(-1)
        .query_async(&mut app.redis.clone())
        .await
        .expect("zrange");
    assert!(pending.is_empty(), "{pending:?}");
    assert_eq!(app.redis_available(2300).await, Some(4));
    let fenced = app
        .count(
            "SELECT COUNT(*) FROM inventory_reservation WHERE request_id = 'REQ_dead' \
             AND status = 'RELEASED' AND release_reason = 'abandoned' AND stock_returned = 1",
        )
        .await;
    assert_eq!(fenced, 1);
    app.refused(("REQ_dead", 2, 2300, 1), REQUEST_RELEASED)
        .await;
    // User 2 is free to buy again under a new request_id (the limit was released too).
    app.bought("REQ_dead_again", 2, 2300, 1).await;
    let again = app.maintenance.recover_once().await.expect("pass");
    assert_eq!(
        again.released + again.orphans_released,
        0,
        "idempotent: {again:?}"
    );
    invariants::assert_audit_clean(&app, 2300).await;
    invariants::assert_ok_and_clean_up(app, 2300).await;
}

/// Brings Redis back (`proxy` restored), then: recovery passes (up to 30, 100 ms apart;
/// one may fail while the connection returns) until one completes the step that missed
/// Redis, as `completed` counts it in the pass's report. It is completed exactly once,
/// leaving `available` units in Redis, and a further pass changes nothing.
async fn restored_then_completed_once(
    (proxy, app): (&flashsale_testkit::TcpProxy, &TestApp),
    product: i64,
    available: i64,
    completed: fn(&flashsale_app::RecoveryReport) -> usize,
) {
    proxy.restore();
    let mut done = 0;
    for _ in 0..30 {
        if let Ok(report) = app.maintenance.recover_once().await {
            done += completed(&report);
        }
        if done > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(done, 1);
    assert_eq!(app.redis_available(product).await, Some(available));
    app.maintenance.recover_once().await.expect("pass");
    assert_eq!(
        app.redis_available(product).await,
        Some(available),
        "completed once"
    );
}

// Checks a cancel whose stock return could not reach Redis (Redis cut right after the
// cancel committed) is completed by recovery once Redis is back: the order is CANCELLED
// at once, the units come back exactly once, and a repeated recovery pass adds nothing.
#[tokio::test]
async fn stock_return_that_missed_redis_is_completed() {
    let (proxy, app) = TestApp::spawn_via_redis_proxy(FAST_RECOVERY).await;
    app.create_product(2400, 3, None).await;
    let (_, b) = app.purchase("REQ_ret", 1, 2400, 1).await;
    let id = order_id(&b);
    proxy.cut();
    let (s, b) = app.cancel(id, 1).await;
    assert_eq!(
        (s, b["status"].as_str()),
        (StatusCode::OK, Some("CANCELLED")),
        "{b}"
    );
    assert_eq!(app.redis_available(2400).await, Some(2), "not returned yet");
    // While Redis is unreachable a pass completes nothing (it may fail outright).
    if let Ok(report) = app.maintenance.recover_once().await {
        assert_eq!(report.returns_completed, 0, "{report:?}");
    }
    assert_eq!(app.redis_available(2400).await, Some(2));
    restored_then_completed_once((&proxy, &app), 2400, 3, |r| r.returns_completed).await;
    invariants::assert_ok_and_clean_up(app, 2400).await;
}

// Checks reconciliation and the audit against drift injected into Redis: the audit
// reports I4 with the figures; reconcile measures the drift exactly, counting a hold in
// flight as legitimate; --repair-style reconcile fixes it by a relative adjustment, after
// which the audit is clean.
#[tokio::test]
async fn reconcile_finds_and_repairs_drift() {
    let app = TestApp::selling(2500, 10, None).await;
    for i in 0..3 {
        app.bought(&format!("REQ_rc_{i}"), i + 1, 2500, 1).await;
    }
    // A hold in flight (taken, not yet committed) is not drift.
    abandoned_hold(&app, "REQ_rc_inflight", 99, 2500).await;
    let product = flashsale_core::ProductId::parse(2500).expect("id");
    let r = app
        .maintenance
        .reconcile(product, false, Duration::ZERO)
        .await
        .expect("reconcile");
    assert_eq!((r.drift, r.in_flight_units), (0, 1), "{r:?}");
    app.bump_entry(2500, "avail", 2).await;
    let audit = app.maintenance.audit(product).await.expect("audit");
    assert!(
        audit.violations.iter().any(|v| v.invariant == "I4"),
        "{audit}"
    );
    let r = app
        .maintenance
        .reconcile(product, true, Duration::from_millis(200))
        .await
        .expect("reconcile");
    assert_eq!((r.drift, r.repaired), (2, true), "{r:?}");
    assert_eq!(
        app.redis_available(2500).await,
        Some(6),
        "10 - 3 orders - 1 in flight"
    );
    let r = app
        .maintenance
        .reconcile(product, false, Duration::ZERO)
        .await
        .expect("reconcile");
    assert_eq!(r.drift, 0);
    app.cleanup().await;
}

// Checks that reconciliation does not repair a drift across a change of generation:
// drift of 2 is injected, and while the repair waits between its two looks (3 s apart)
// the entry's generation moves on with the count unchanged, 1 s in (what a rebuild that
// happened to leave the same count would do). Both looks find the same drift, but the
// second was read in generation 2 and the first in 1, so nothing is repaired and the
// count stays.
#[tokio::test]
async fn reconcile_does_not_repair_across_a_generation() {
    let app = TestApp::selling(2510, 10, None).await;
    app.bought("REQ_rg_1", 1, 2510, 1).await;
    app.bump_entry(2510, "avail", 2).await;
    let product = flashsale_core::ProductId::parse(2510).expect("id");
    let m = app.maintenance.clone();
    let repair =
        tokio::spawn(async move { m.reconcile(product, true, Duration::from_secs(3)).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    app.bump_entry(2510, "gen", 1).await;
    let r = repair.await.expect("task").expect("reconcile");
    assert_eq!((r.drift, r.repaired), (2, false), "{r:?}");
    assert_eq!(
        r.redis_generation,
        flashsale_core::Generation::from_stored(2)
    );
    assert_eq!(app.redis_available(2510).await, Some(11), "not repaired");
    app.cleanup().await;
}

// Checks recovery run by two instances at once (two Maintenance handles on the same
// stores, passes interleaved concurrently) over 30 abandoned holds: every hold is fenced
// and its units returned exactly once — Redis ends at the full stock, not above it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_recovery_workers_return_stock_once() {
    let app = TestApp::spawn_with(Default::default(), FAST_RECOVERY).await;
    let other = TestApp::spawn_with(Default::default(), FAST_RECOVERY).await;
    app.create_product(2600, 30, None).await;
    for i in 0..30 {
        abandoned_hold(&app, &format!("REQ_two_{i}"), i + 1, 2600).await;
    }
    assert_eq!(app.redis_available(2600).await, Some(0));
    tokio::time::sleep(Duration::from_millis(2100)).await;
    // The second instance shares the first's stores: same database, same prefix.
    let second = maintenance_beside(&app, settings(7, 2)).await;
    let (a, b) = tokio::join!(
        async {
            let mut n = 0;
            for _ in 0..10 {
                n += app.maintenance.recover_once().await.expect("pass").released;
            }
            n
        },
        async {
            let mut n = 0;
            for _ in 0..10 {
                n += second.recover_once().await.expect("pass").released;
            }
            n
        }
    );
    assert_eq!(
        a + b,
        30,
        "each hold released by exactly one worker ({a} + {b})"
    );
    assert_eq!(app.redis_available(2600).await, Some(30));
    assert_eq!(
        app.count("SELECT COUNT(*) FROM inventory_reservation WHERE status = 'RELEASED'")
            .await,
        30
    );
    invariants::assert_sound(&app, 2600).await;
    other.cleanup().await;
    app.cleanup().await;
}

// Checks that the workers reach every loaded product however many there are, and that
// one product that fails cannot keep them from the others: five products, read two to a
// page (the server reads a thousand). One recovery pass releases abandoned holds on the
// first and the last product; one gate-watch pass rebuilds the last product's lost Redis
// entry; one reconciliation pass reports drift on the fourth; the product list holds all
// five. Then the second product's pending index is damaged (a string where a sorted set
// belongs, so reading it fails): a recovery pass still releases a new abandoned hold on
// the fifth product, and the pass ends in an error naming the damage, not in silence.
// Before, the workers read one list capped at 10,000 products, and products past the cap
// were never looked after.
#[tokio::test]
async fn workers_walk_every_loaded_product_page_by_page() {
    let app = TestApp::spawn_with(Default::default(), FAST_RECOVERY).await;
    let ids = [2700, 2701, 2702, 2703, 2704];
    for id in ids {
        app.create_product(id, 3, None).await;
    }
    abandoned_hold(&app, "REQ_walk_first", 1, 2700).await;
    abandoned_hold(&app, "REQ_walk_last", 2, 2704).await;
    let m = maintenance_beside(&app, settings(100, 2)).await;
    let all: Vec<i64> = m
        .products()
        .await
        .expect("products")
        .into_iter()
        .map(|p| p.get())
        .collect();
    assert_eq!(all, ids, "pages of 2, 2 and 1: every product listed");
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let report = m.recover_once().await.expect("recovery pass");
    assert_eq!(report.released, 2, "2700 and 2704: {report:?}");
    assert_eq!(app.redis_available(2700).await, Some(3));
    assert_eq!(app.redis_available(2704).await, Some(3));

    let mut conn = app.redis.clone();
    app.delete_keys(2704, &["inv"], "lose the last product's entry")
        .await;
    assert_eq!(m.watch_once().await.expect("watch pass"), 1);
    assert_eq!(app.redis_available(2704).await, Some(3));

    app.bump_entry(2703, "avail", 2).await;
    let drifted = m
        .reconcile_all(flashsale_app::Repair::Off, Duration::ZERO)
        .await
        .expect("reconcile");
    let found: Vec<(i64, i64)> = drifted
        .iter()
        .map(|r| (r.product_id.get(), r.drift))
        .collect();
    assert_eq!(found, [(2703, 2)]);
    let repaired = m
        .reconcile(drifted[0].product_id, true, Duration::from_millis(50))
        .await
        .expect("repair");
    assert!(repaired.repaired, "{repaired:?}");

    let _: () = redis::cmd("SET")
        .arg(app.key(2701, "pending"))
        .arg("not a sorted set")
        .query_async(&mut conn)
        .await
        .expect("damage 2701's pending index");
    // 2704's rebuilt entry started under a fresh sold-out lease (250 ms here).
    tokio::time::sleep(Duration::from_millis(300)).await;
    abandoned_hold(&app, "REQ_walk_after_damage", 3, 2704).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let failed = m.recover_once().await.expect_err("2701 fails");
    assert!(failed.to_string().contains("WRONGTYPE"), "{failed}");
    assert_eq!(
        app.redis_available(2704).await,
        Some(3),
        "2704's hold released although 2701 failed before it"
    );
    app.delete_keys(2701, &["pending"], "repair 2701's pending index")
        .await;
    assert_eq!(m.recover_once().await.expect("recovery pass").released, 0);
    for id in ids {
        invariants::assert_sound(&app, id).await;
    }
    app.cleanup().await;
}

/// The maintenance of another instance on `app`'s stores (its own gate adapters and
/// ledger connections), with `settings`.
async fn maintenance_beside(
    app: &TestApp,
    settings: flashsale_app::MaintenanceSettings,
) -> flashsale_app::Maintenance {
    let ports = flashsale_app::Ports {
        gate: std::sync::Arc::new(gate(app)),
        gate_m: std::sync::Arc::new(gate(app)),
        ledger: ledger(app).await,
        ledger_m: ledger(app).await,
        clock: std::sync::Arc::new(flashsale_app::SystemClock),
    };
    flashsale_app::Maintenance::new(ports, settings)
}

fn settings(batch_size: usize, products_page: usize) -> flashsale_app::MaintenanceSettings {
    flashsale_app::MaintenanceSettings {
        recovery_after: Duration::from_secs(2),
        batch_size,
        products_page,
        // These instances only run recovery passes; the audits go through the app's.
        audit_bounds: flashsale_app::AuditBounds::QUIET,
        payment_timeout: Duration::from_secs(900),
    }
}

async fn ledger(app: &TestApp) -> std::sync::Arc<flashsale_mysql::MysqlLedger> {
    let url = app.db.as_ref().expect("db").url();
    std::sync::Arc::new(
        flashsale_mysql::MysqlLedger::connect(&flashsale_mysql::LedgerConfig {
            url,
            max_connections: 4,
            acquire_timeout: Duration::from_secs(3),
            transaction_timeout: Duration::from_secs(5),
            cluster: None,
        })
        .await
        .expect("ledger"),
    )
}

// Checks the reserve script validates its arguments before its first write (Redis does
// not roll back a script that fails halfway): called with a non-numeric quantity, a
// negative limit, a zero record ttl, a negative or non-numeric sold-out lease, an empty
// request_id, or a batch whose arguments don't match its keys — with a valid purchase
// first in the batch — it errors, and the product's keys are unchanged.
#[tokio::test]
async fn script_with_bad_arguments_writes_nothing() {
    let app = TestApp::selling(2700, 5, Some(1)).await;
    let before = app.redis_dump().await;
    let script = redis::Script::new(flashsale_redis::calls::RESERVE.source);
    // ARGV: ttl, sold-out lease, the shared rate's interval and tolerance, then
    // quantity, user, limit, request_id per purchase;
    // the first purchase (request OK) is valid each time.
    let bad_args: [&[&str]; 9] = [
        &[
            "1000", "0", "0", "0", "1", "1", "0", "OK", "x", "1", "0", "R",
        ],
        &[
            "1000", "0", "0", "0", "1", "1", "0", "OK", "1", "1", "-1", "R",
        ],
        &["0", "0", "0", "0", "1", "1", "0", "OK", "1", "1", "0", "R"],
        &[
            "1000", "-1", "0", "0", "1", "1", "0", "OK", "1", "1", "0", "R",
        ],
        &[
            "1000", "x", "0", "0", "1", "1", "0", "OK", "1", "1", "0", "R",
        ],
        &[
            "1000", "0", "0", "0", "1", "1", "0", "OK", "1", "1", "0", "",
        ],
        &["1000", "0", "0", "0", "1", "1", "0", "OK", "1", "1", "0"],
        &[
            "1000", "0", "-5", "0", "1", "1", "0", "OK", "1", "1", "0", "R",
        ],
        // The shared rate on, but no rate cell among the keys.
        &[
            "1000", "0", "100000", "0", "1", "1", "0", "OK", "1", "1", "0", "R",
        ],
    ];
    let mut conn = app.redis.clone();
    for args in bad_args {
        let mut call = script.prepare_invoke();
        call.key(app.key(2700, "inv"))
            .key(app.key(2700, "users"))
            .key(app.key(2700, "pending"))
            .key(app.key(2700, "r:OK"))
            .key(app.key(2700, "r:R"));
        for a in args.iter() {
            call.arg(a);
        }
        let result: redis::RedisResult<redis::Value> = call.invoke_async(&mut conn).await;
        assert!(result.is_err(), "{args:?} was accepted: {result:?}");
        assert_eq!(app.redis_dump().await, before, "{args:?} wrote something");
    }
    app.cleanup().await;
}

// Checks a restock whose Redis step failed (Redis cut just after MariaDB recorded it; the
// admin hears 503 and never retries) is finished by recovery once Redis is back: the
// units arrive once, a second pass adds nothing, and the audit is clean.
#[tokio::test]
async fn restock_that_missed_redis_is_completed() {
    let (proxy, app) = TestApp::spawn_via_redis_proxy(&[]).await;
    app.create_product(2800, 5, None).await;
    proxy.cut();
    let unavailable = (StatusCode::SERVICE_UNAVAILABLE, "unavailable");
    assert_error(app.restock(2800, "RS_missed", 7).await, unavailable);
    assert_eq!(
        app.count("SELECT COUNT(*) FROM restock_request WHERE gate_applied = 0")
            .await,
        1,
        "recorded in MariaDB, not yet in Redis"
    );
    restored_then_completed_once((&proxy, &app), 2800, 12, |r| r.restocks_completed).await;
    invariants::assert_sound_and_clean_up(app, 2800).await;
}

// Checks reserve.lua's `unseen` against a record lifetime shortened after the load (the
// setting changed between restarts): the product is loaded with 1-hour records, a
// purchase is then reserved with 1-second records. Right away a refusal of a new request
// vouches (`unseen` 1); once that record has expired, a refusal of the same request_id
// must not vouch (`unseen` 0: it may be a replay of an accepted purchase, the ledger
// must be asked), and neither may any other.
#[tokio::test]
async fn refusals_stop_vouching_when_records_may_have_expired() {
    let app = TestApp::spawn().await;
    let mut conn = app.redis.clone();
    let inv = app.key(2800, "inv");
    let load = redis::Script::new(flashsale_redis::calls::LOAD.source);
    let reserve = redis::Script::new(flashsale_redis::calls::RESERVE.source);
    let loaded: i64 = load
        .key(&inv)
        .arg(1)
        .arg(1)
        .arg(3_600_000)
        // A first load: it vouches for the records (`fresh`).
        .arg(1)
        .invoke_async(&mut conn)
        .await
        .expect("load");
    assert_eq!(loaded, 1);
    let call = |rid: &str, ttl: i64| {
        let mut invocation = reserve.prepare_invoke();
        invocation
            .key(&inv)
            .key(app.key(2800, "users"))
            .key(app.key(2800, "pending"))
            .key(app.key(2800, &format!("r:{rid}")))
            .arg(ttl)
            .arg(&[0, 0, 0, 1, 7, 0])
            .arg(rid);
        invocation
    };
    // The script's reply: one string, a purchase's fields joined by ','.
    let first: String = call("R1", 1000)
        .invoke_async(&mut conn)
        .await
        .expect("reserve");
    assert!(first.starts_with("1,"), "reserved: {first:?}");
    let other: String = call("R2", 1000)
        .invoke_async(&mut conn)
        .await
        .expect("reserve");
    assert_eq!(other, "0,1", "a new request is vouched for");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for rid in ["R1", "R3"] {
        let late: String = call(rid, 1000)
            .invoke_async(&mut conn)
            .await
            .expect("reserve");
        assert_eq!(late, "0,0", "{rid}: records may have expired");
    }
    app.cleanup().await;
}

// Checks the early trim of the pending index against the real Redis: the entries of holds
// whose orders committed leave the index within a few of the trimmer's rounds, with no
// recovery pass run (this test's service runs none by itself), while a hold that no order
// accounts for (taken by `reserve.lua` directly, as an attempt that died before its
// commit) stays there for recovery.
#[tokio::test]
async fn committed_holds_leave_the_pending_index_early() {
    let app = TestApp::selling(2900, 50, None).await;
    let mut conn = app.redis.clone();
    let pending = app.key(2900, "pending");
    let reserve = redis::Script::new(flashsale_redis::calls::RESERVE.source);
    let orphan: String = reserve
        .key(app.key(2900, "inv"))
        .key(app.key(2900, "users"))
        .key(&pending)
        .key(app.key(2900, "r:ORPHAN"))
        .arg(3_600_000)
        .arg(&[0, 0, 0, 1, 7, 0])
        .arg("ORPHAN")
        .invoke_async(&mut conn)
        .await
        .expect("reserve");
    assert!(orphan.starts_with("1,"), "reserved: {orphan:?}");
    for i in 0..20 {
        app.bought(&format!("REQ_trim_{i}"), 100 + i, 2900, 1).await;
    }
    let index = || {
        let mut conn = app.redis.clone();
        let pending = pending.clone();
        async move {
            redis::cmd("ZRANGE")
                .arg(&pending)
                .arg(0)
                .arg(-1)
                .query_async::<Vec<String>>(&mut conn)
                .await
                .expect("zrange")
        }
    };
    wait_until(
        "committed holds trimmed",
        Duration::from_secs(5),
        || async { index().await == ["ORPHAN"] },
    )
    .await;
    app.cleanup().await;
}

/// The `stock_repaired` events, each matched to its `stock_repair` row by request_id:
/// (event id, product, the payload's delta), by product.
async fn repair_events(app: &TestApp) -> Vec<(String, i64, i64)> {
    sqlx::query_as(
        "SELECT CONVERT(o.event_id USING utf8mb4), o.product_id, \
         CAST(JSON_VALUE(o.payload, '$.delta') AS SIGNED) \
         FROM outbox o JOIN stock_repair r ON o.request_id = CONCAT('REPAIR_', r.id) \
         WHERE o.event_type = 'stock_repaired' AND o.product_id = r.product_id \
         AND JSON_VALUE(o.payload, '$.redis_before') = r.redis_before \
         AND JSON_VALUE(o.payload, '$.redis_after') = r.redis_after \
         ORDER BY o.product_id",
    )
    .fetch_all(&app.pool)
    .await
    .expect("repair events")
}

// Checks the reconciliation worker's own repair during a flood (FLASHSALE_RECONCILE_REPAIR
// =auto, the default): Redis's count of one product is pushed up by 5 and another's down
// by 5 while buyers flood a third product. How: passes of the worker's reconciliation
// (a bounded number of units, two looks REPAIR_SETTLE apart) run beside the flood; both
// drifts are repaired within two passes, each repair recorded in `stock_repair` with the
// counts before and after and counted by `flashsale_reconcile_repairs_total`; a third
// pass finds nothing; the flood's orders never exceed its stock, and the invariants and
// the audit are clean on all three products. Each repair is also an event, written with
// its record (`stock_repaired`, request_id `REPAIR_<id>`, the counts in its payload):
// the event workers, started afterwards, publish and consume them with the orders'
// events, and the sales statistics still equal the orders (a repair sells nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn drift_is_repaired_during_a_flood_within_two_passes() {
    use flashsale_app::{Repair, REPAIR_SETTLE, REPAIR_UNITS_PER_PASS};
    let app = TestApp::spawn_with(Default::default(), FAST_RECOVERY).await;
    for (id, stock) in [(2801, 20), (2802, 20), (2803, 1_000)] {
        app.create_product(id, stock, None).await;
    }
    for (id, n) in [(2801, 4), (2802, 6)] {
        for i in 0..n {
            app.bought(&format!("rep-{id}-{i}"), 100 + i, id, 1).await;
        }
    }
    app.bump_entry(2801, "avail", 5).await;
    app.bump_entry(2802, "avail", -5).await;
    let flooding = std::sync::atomic::AtomicBool::new(true);
    let flood = async {
        let mut orders = 0;
        let mut n = 0;
        while flooding.load(std::sync::atomic::Ordering::SeqCst) {
            let batch = (0..16).map(|k| {
                let app = &app;
                async move {
                    let id = format!("flood-{n}-{k}");
                    app.purchase_until_known(&id, 1_000 + n * 16 + k, 2803, 1)
                        .await
                }
            });
            for (status, _, _) in futures::future::join_all(batch).await {
                orders += i64::from(status == StatusCode::CREATED);
            }
            n += 1;
        }
        orders
    };
    let started = std::time::Instant::now();
    let repairs = async {
        let mut passes = Vec::new();
        for n in 1..=2 {
            let pass = app
                .maintenance
                .reconcile_all(Repair::UpTo(REPAIR_UNITS_PER_PASS), REPAIR_SETTLE)
                .await
                .expect("pass");
            let repaired: Vec<_> = pass.iter().filter(|r| r.repaired).collect();
            println!(
                "pass {n} ended {:?} into the flood: repaired {:?}",
                started.elapsed(),
                repaired
                    .iter()
                    .map(|r| (r.product_id.get(), r.drift))
                    .collect::<Vec<_>>()
            );
            passes.push(pass);
        }
        flooding.store(false, std::sync::atomic::Ordering::SeqCst);
        passes
    };
    let (orders, passes) = tokio::join!(flood, repairs);
    println!("the flood made {orders} orders of 1,000 units meanwhile");
    let repaired: Vec<i64> = passes
        .iter()
        .flatten()
        .filter(|r| r.repaired)
        .map(|r| r.product_id.get())
        .collect();
    assert!(
        repaired.contains(&2801) && repaired.contains(&2802),
        "both repaired within two passes: {passes:?}"
    );
    assert_eq!(app.redis_available(2801).await, Some(16), "20 - 4 orders");
    assert_eq!(app.redis_available(2802).await, Some(14), "20 - 6 orders");
    let rows: Vec<(i64, i64, i64)> = sqlx::query_as(
        "SELECT product_id, redis_before, redis_after FROM stock_repair ORDER BY product_id",
    )
    .fetch_all(&app.pool)
    .await
    .expect("repairs");
    assert_eq!(rows, vec![(2801, 21, 16), (2802, 9, 14)]);
    let (text, _) = app.scrape_metrics().await;
    assert!(
        text.lines()
            .any(|l| l == "flashsale_reconcile_repairs_total 2"),
        "counted"
    );
    let again = app
        .maintenance
        .reconcile_all(Repair::UpTo(REPAIR_UNITS_PER_PASS), REPAIR_SETTLE)
        .await
        .expect("pass");
    assert!(again.is_empty(), "{again:?}");
    assert!(
        orders > 0 && orders <= 1_000,
        "{orders} orders of 1,000 units"
    );
    for id in [2801, 2802, 2803] {
        invariants::assert_sound(&app, id).await;
    }
    let events = repair_events(&app).await;
    assert_eq!(
        events.iter().map(|e| (e.1, e.2)).collect::<Vec<_>>(),
        vec![(2801, -5), (2802, 5)],
        "{events:?}"
    );
    let workers = TestEvents::start(&app, NATS_URL).await;
    crate::events::wait_drained(&app, &[2801, 2802, 2803]).await;
    for (event_id, ..) in events {
        let consumed = app
            .count(&format!(
                "SELECT COUNT(*) FROM consumed_event WHERE event_id = '{event_id}' \
                 AND event_type = 'stock_repaired'"
            ))
            .await;
        assert_eq!(consumed, 1, "the repair's event consumed");
    }
    let rows = crate::events::outbox(&app).await;
    crate::events::assert_one_event_per_change(&app, &rows).await;
    workers.cleanup().await;
    app.cleanup().await;
}
