//! Sold-out leases: once a product has no unit left, Redis grants no hold for a while
//! (the lease), and an instance that heard the lease answers `sold_out` itself to every
//! request_id that never held units of the product — without a Redis call — while
//! replays of real purchases still get their orders.

use std::time::{Duration, Instant};

use flashsale_testkit::TcpProxy;
use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{code, order_id, redis_addr, Routes, TestApp};
use crate::invariants;

/// Long enough for the steps a test takes inside one lease on a slow CI machine.
const LEASE: &str = "3s";
/// Longest a test waits for a lease to end: the lease plus generous slack.
const LEASE_WAIT: Duration = Duration::from_secs(8);

/// Retries a fresh purchase (a new request_id each time) until it is sold, or fails the
/// test after [`LEASE_WAIT`]. Returns how long it took.
async fn buy_once_the_lease_ends(app: &TestApp, product: i64, user: i64) -> Duration {
    let start = Instant::now();
    let mut i = 0;
    loop {
        i += 1;
        let (s, b) = app
            .purchase(&format!("REQ_after_{user}_{i}"), user, product, 1)
            .await;
        if s == StatusCode::CREATED {
            return start.elapsed();
        }
        assert_eq!((s, code(&b)), (StatusCode::CONFLICT, "sold_out"), "{b}");
        assert!(
            start.elapsed() < LEASE_WAIT,
            "units given back never became buyable"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// Checks the local answer and its limits, with Redis behind a proxy the test cuts: after
// the product sells out and one refusal heard the lease, new request_ids are refused
// with 409 sold_out while Redis is unreachable (so no Redis call was made: a call would
// have been a 503), while a replay of a sold request_id is not answered locally (503,
// outcome unknown) and, with Redis back, gets its original order (200). Audit clean.
#[tokio::test]
async fn sold_out_is_answered_here_while_the_lease_lasts() {
    let proxy = TcpProxy::start(redis_addr()).await.expect("proxy");
    let routes = Routes {
        redis: Some(proxy.addr()),
        mysql: None,
    };
    let app = TestApp::spawn_with(routes, &[("SOLD_OUT_LEASE", LEASE)]).await;
    app.create_product(3700, 2, None).await;
    let mut orders = Vec::new();
    for (i, rid) in ["REQ_so_a", "REQ_so_b"].iter().enumerate() {
        let (s, b) = app.purchase(rid, 1 + i as i64, 3700, 1).await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
        orders.push(order_id(&b));
    }
    let (s, b) = app.purchase("REQ_so_first_refusal", 10, 3700, 1).await;
    assert_eq!((s, code(&b)), (StatusCode::CONFLICT, "sold_out"), "{b}");

    proxy.cut();
    for i in 0..20 {
        let (s, b) = app
            .purchase(&format!("REQ_so_local_{i}"), 100 + i, 3700, 1)
            .await;
        assert_eq!(
            (s, code(&b)),
            (StatusCode::CONFLICT, "sold_out"),
            "refused here, Redis unreachable: {b}"
        );
    }
    let (s, b) = app.purchase("REQ_so_a", 1, 3700, 1).await;
    assert_eq!(
        s,
        StatusCode::SERVICE_UNAVAILABLE,
        "a holder's replay must ask Redis, never hear sold_out: {b}"
    );
    proxy.restore();
    let (s, b) = app.purchase("REQ_so_a", 1, 3700, 1).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(order_id(&b), orders[0], "the replay's original order");

    assert_eq!(
        app.count("SELECT COUNT(*) FROM orders WHERE product_id = 3700")
            .await,
        2
    );
    invariants::assert_ok(&app, 3700).await;
    invariants::assert_audit_clean(&app, 3700).await;
    app.cleanup().await;
}

// Checks that a lease never strands stock: a unit given back (an order cancelled) while
// the lease holds is refused to a new buyer at once (the lease's promise), and sold to a
// buyer who tries again after the lease — within the lease plus slack. Redis's available
// count and the ledger agree at the end (audit clean, nothing in limbo).
#[tokio::test]
async fn units_given_back_during_a_lease_sell_after_it() {
    let app = TestApp::spawn_with(Routes::default(), &[("SOLD_OUT_LEASE", LEASE)]).await;
    app.create_product(3710, 1, None).await;
    let (s, b) = app.purchase("REQ_gb_a", 1, 3710, 1).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let order = order_id(&b);
    let (s, b) = app.purchase("REQ_gb_refused", 2, 3710, 1).await;
    assert_eq!((s, code(&b)), (StatusCode::CONFLICT, "sold_out"), "{b}");
    let (s, b) = app
        .post(&format!("/v1/orders/{order}/cancel"), json!({"user_id": 1}))
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(app.redis_available(3710).await, Some(1), "the unit is back");
    let (s, b) = app.purchase("REQ_gb_during", 3, 3710, 1).await;
    assert_eq!(
        (s, code(&b)),
        (StatusCode::CONFLICT, "sold_out"),
        "no hold while the lease lasts: {b}"
    );
    let waited = buy_once_the_lease_ends(&app, 3710, 4).await;
    assert!(waited <= LEASE_WAIT, "{waited:?}");
    assert_eq!(app.redis_available(3710).await, Some(0));
    invariants::assert_ok(&app, 3710).await;
    invariants::assert_audit_clean(&app, 3710).await;
    app.cleanup().await;
}

// Checks that a gate rebuilt from the ledger starts under a lease (the lost state may
// have granted one that instances still trust): the test deletes its own product's
// Redis keys, one gate-watch pass rebuilds them, the rebuilt entry carries a lease
// ending in the future, a purchase right away is refused, and one after the lease sells.
#[tokio::test]
async fn a_rebuilt_gate_starts_under_a_lease() {
    let app = TestApp::spawn_with(Routes::default(), &[("SOLD_OUT_LEASE", LEASE)]).await;
    app.create_product(3720, 3, None).await;
    let (s, b) = app.purchase("REQ_rb_a", 1, 3720, 1).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let mut conn = app.redis.clone();
    let _: () = redis::cmd("DEL")
        .arg(app.key(3720, "inv"))
        .arg(app.key(3720, "pending"))
        .query_async(&mut conn)
        .await
        .expect("del");
    let rebuilt = app.maintenance.watch_once().await.expect("watch");
    assert_eq!(rebuilt, 1);
    assert_eq!(app.redis_available(3720).await, Some(2));
    let lease: Option<i64> = redis::cmd("HGET")
        .arg(app.key(3720, "inv"))
        .arg("lease")
        .query_async(&mut conn)
        .await
        .expect("hget");
    let (secs, micros): (i64, i64) = redis::cmd("TIME")
        .query_async(&mut conn)
        .await
        .expect("time");
    let now_ms = secs * 1000 + micros / 1000;
    assert!(
        lease.is_some_and(|until| until > now_ms),
        "lease {lease:?} at {now_ms}"
    );
    let (s, b) = app.purchase("REQ_rb_early", 2, 3720, 1).await;
    assert_eq!((s, code(&b)), (StatusCode::CONFLICT, "sold_out"), "{b}");
    buy_once_the_lease_ends(&app, 3720, 3).await;
    invariants::assert_ok(&app, 3720).await;
    invariants::assert_audit_clean(&app, 3720).await;
    app.cleanup().await;
}
