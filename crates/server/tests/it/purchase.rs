//! The purchase path under concurrency and replays.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::stream::{self, StreamExt};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{
    answered, code, opening_in_an_hour, order_id, TestApp, LIMIT_EXCEEDED, SOLD_OUT,
};
use crate::invariants;

/// Concurrent requests the test client keeps in flight.
const CLIENT_CONCURRENCY: usize = 256;

// Checks the central promise under a flash-sale flood: one product with 1,000 units,
// 10,200 concurrent attempts from 2,500 users, of which 9,000 have distinct request_ids
// and 1,200 (11.8%) re-send another attempt's request_id at the same time (shuffled into
// the flood). Expects exactly 1,000 orders, exactly one 201 per order, every duplicate
// answered with its original's order, every other attempt sold_out, Redis at 0, the
// ledger's counters agreeing, and the invariant checks clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flood_sells_exactly_the_stock_once_per_request() {
    let app = TestApp::selling(1001, 1000, None).await;
    let seed: u64 = rand::rng().random();
    println!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let unique = 9_000;
    let users = 2_500;
    let mut attempts: Vec<(String, i64)> = (0..unique)
        .map(|i| (format!("REQ_flood_{i}"), (i % users) + 1))
        .collect();
    let duplicates: Vec<(String, i64)> = (0..1_200)
        .map(|_| attempts[rng.random_range(0..attempts.len())].clone())
        .collect();
    attempts.extend(duplicates);
    attempts.shuffle(&mut rng);

    let started = std::time::Instant::now();
    let total_attempts = attempts.len();
    let answers: Vec<(String, StatusCode, serde_json::Value, Vec<String>)> = stream::iter(attempts)
        .map(|(request_id, user)| {
            let app = &app;
            async move {
                let (status, body, unknowns) = app
                    .purchase_until_known_noting(&request_id, user, 1001, 1)
                    .await;
                (request_id, status, body, unknowns)
            }
        })
        .buffer_unordered(CLIENT_CONCURRENCY)
        .collect()
        .await;

    let elapsed = started.elapsed();
    println!(
        "flood: {total_attempts} attempts in {elapsed:.2?} ({:.0} attempts/s, {} build, \
         client and server in one process)",
        total_attempts as f64 / elapsed.as_secs_f64(),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    let mut orders_by_request: BTreeMap<String, BTreeSet<i64>> = BTreeMap::new();
    let mut created = 0;
    let mut sold_out_requests = BTreeSet::new();
    // What each answer that left an outcome unknown said, by kind and final status:
    // printed, and named when the count of 201s is off.
    let mut unknowns: BTreeMap<(String, u16), usize> = BTreeMap::new();
    for (_, status, _, seen) in &answers {
        for unknown in seen {
            *unknowns
                .entry((unknown.clone(), status.as_u16()))
                .or_default() += 1;
        }
    }
    println!("flood: unknown answers by kind and final status: {unknowns:?}");
    for (request_id, status, body, _) in &answers {
        match *status {
            StatusCode::CREATED | StatusCode::OK => {
                if *status == StatusCode::CREATED {
                    created += 1;
                }
                assert_eq!(body["request_id"], json!(request_id));
                assert_eq!(body["status"], "PENDING_PAYMENT");
                orders_by_request
                    .entry(request_id.clone())
                    .or_default()
                    .insert(order_id(body));
            }
            StatusCode::CONFLICT => {
                assert_eq!(code(body), "sold_out", "{request_id}: {body}");
                sold_out_requests.insert(request_id.clone());
            }
            other => panic!("{request_id}: unexpected {other} {body}"),
        }
    }
    let order_ids: BTreeSet<i64> = orders_by_request.values().flatten().copied().collect();
    assert_eq!(order_ids.len(), 1000, "distinct orders acknowledged");
    assert_eq!(orders_by_request.len(), 1000, "request_ids with an order");
    for (request_id, ids) in &orders_by_request {
        assert_eq!(
            ids.len(),
            1,
            "{request_id} answered with several orders: {ids:?}"
        );
        assert!(
            !sold_out_requests.contains(request_id),
            "{request_id} was answered both with an order and sold_out"
        );
    }
    assert_eq!(
        created, 1000,
        "exactly one 201 per order; unknown answers on the way: {unknowns:?}"
    );
    assert_eq!(app.count("SELECT COUNT(*) FROM orders").await, 1000);
    assert_eq!(
        app.count("SELECT COUNT(*) FROM inventory_reservation")
            .await,
        1000
    );
    assert_eq!(app.redis_available(1001).await, Some(0));
    let db_ids: BTreeSet<i64> = sqlx::query_scalar("SELECT id FROM orders")
        .fetch_all(&app.pool)
        .await
        .expect("ids")
        .into_iter()
        .collect();
    assert_eq!(
        db_ids, order_ids,
        "every acknowledged order is in MariaDB, and only those"
    );
    invariants::assert_ok(&app, 1001).await;
    let (_, product) = app.get("/v1/products/1001").await;
    assert_eq!(
        product["inventory"],
        json!({"total": 1000, "available": 0, "reserved": 1000, "sold": 0})
    );
    app.cleanup().await;
}

// Checks the per-user limit under concurrency: one user fires 50 purchases with distinct
// request_ids at once on a product limited to 1 per user; exactly one succeeds, the rest
// are limit_exceeded, and the stock taken is exactly 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn per_user_limit_holds_under_concurrency() {
    let app = TestApp::selling(2002, 100, Some(1)).await;
    let answers: Vec<_> = app.rush(50, 50, ("REQ_lim_", 2002), |_| 7).await;
    let ok = answered(&answers, StatusCode::CREATED, None);
    let limited = answered(&answers, StatusCode::CONFLICT, Some("limit_exceeded"));
    assert_eq!((ok, limited), (1, 49), "{answers:?}");
    assert_eq!(
        app.count("SELECT COUNT(*) FROM orders WHERE user_id = 7")
            .await,
        1
    );
    assert_eq!(app.redis_available(2002).await, Some(99));
    // Another user is not affected by user 7's limit.
    app.bought("REQ_lim_other", 8, 2002, 1).await;
    invariants::assert_ok_and_clean_up(app, 2002).await;
}

// Checks replay semantics one by one: the first attempt gets 201, a replay of the same
// payload gets 200 with the identical body, the same request_id with another payload gets
// request_id_conflict, and GET /v1/purchases/{request_id} returns the order. After a
// cancel, the user may buy again with a new request_id (the limit counts live orders).
#[tokio::test]
async fn replays_return_the_original_order() {
    let app = TestApp::selling(3003, 10, Some(1)).await;
    let first = app.bought("REQ_r1", 42, 3003, 1).await;
    let (s2, again) = app.purchase("REQ_r1", 42, 3003, 1).await;
    assert_eq!(s2, StatusCode::OK);
    assert_eq!(first, again, "a replay answers with the original body");
    for (user, product, qty) in [(43, 3003, 1), (42, 3003, 2)] {
        app.refused(
            ("REQ_r1", user, product, qty),
            (StatusCode::CONFLICT, "request_id_conflict"),
        )
        .await;
    }
    let (s, by_request) = app.get("/v1/purchases/REQ_r1").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(by_request, first);
    let (s, by_id) = app.get(&format!("/v1/orders/{}", order_id(&first))).await;
    assert_eq!((s, &by_id), (StatusCode::OK, &first));
    // Limit 1 reached; cancel frees it.
    app.refused(("REQ_r2", 42, 3003, 1), LIMIT_EXCEEDED).await;
    let (s, _) = app.cancel(order_id(&first), 42).await;
    assert_eq!(s, StatusCode::OK);
    app.bought("REQ_r2", 42, 3003, 1).await;
    // The cancelled request's replay still answers with its (cancelled) order.
    let (s, b) = app.purchase("REQ_r1", 42, 3003, 1).await;
    assert_eq!(
        (s, b["status"].as_str()),
        (StatusCode::OK, Some("CANCELLED"))
    );
    invariants::assert_ok_and_clean_up(app, 3003).await;
}

// Checks that a replay arriving after its Redis hold record expired is answered from
// MariaDB (200, same order) and takes no stock: the fresh hold the replay's script makes
// is recognised as an orphan and given back. Also checks a replay after sold-out still
// gets its order, not sold_out. Record retention is set to 2 s to make this quick.
#[tokio::test]
async fn replay_after_record_expiry_is_answered_by_the_ledger() {
    let app = TestApp::selling_with(
        &[("PAYMENT_TIMEOUT", "1s"), ("REDIS_RECORD_TTL", "2s")],
        (4004, 2, None),
    )
    .await;
    let first = app.bought("REQ_old", 1, 4004, 1).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let hold_key = app.key(4004, "r:REQ_old");
    let mut conn = app.redis.clone();
    let exists: bool = redis::cmd("EXISTS")
        .arg(&hold_key)
        .query_async(&mut conn)
        .await
        .expect("EXISTS");
    assert!(!exists, "the hold record should have expired");
    let (s, replay) = app.purchase("REQ_old", 1, 4004, 1).await;
    assert_eq!(s, StatusCode::OK, "{replay}");
    assert_eq!(order_id(&replay), order_id(&first));
    assert_eq!(
        app.redis_available(4004).await,
        Some(1),
        "the replay took no stock"
    );
    // Sell the last unit, then replay the old request again: still its order.
    app.bought("REQ_last", 2, 4004, 1).await;
    let (s, replay) = app.purchase("REQ_old", 1, 4004, 1).await;
    assert_eq!((s, order_id(&replay)), (StatusCode::OK, order_id(&first)));
    assert_eq!(app.count("SELECT COUNT(*) FROM orders").await, 2);
    invariants::assert_ok_and_clean_up(app, 4004).await;
}

// Checks the ledger's own no-oversell guard: Redis is made to believe one more unit
// exists than MariaDB has (drift injected directly into Redis). The purchase that Redis
// admits is refused by the ledger's conditional UPDATE, fenced, its hold returned, and
// the client told sold_out — then and on replay. No order beyond the stock exists.
#[tokio::test]
async fn ledger_refuses_what_redis_wrongly_admits() {
    let app = TestApp::selling(5005, 1, None).await;
    app.bought("REQ_a", 1, 5005, 1).await;
    app.bump_entry(5005, "avail", 1).await;
    app.refused(("REQ_b", 2, 5005, 1), SOLD_OUT).await;
    app.refused(("REQ_b", 2, 5005, 1), SOLD_OUT).await;
    assert_eq!(app.count("SELECT COUNT(*) FROM orders").await, 1);
    let fenced = app
        .count(
            "SELECT COUNT(*) FROM inventory_reservation WHERE request_id = 'REQ_b' \
             AND status = 'RELEASED' AND release_reason = 'sold_out' AND stock_returned = 1",
        )
        .await;
    assert_eq!(
        fenced, 1,
        "the refused hold is fenced and its units returned"
    );
    assert_eq!(
        app.redis_available(5005).await,
        Some(1),
        "the injected drift remains, nothing more"
    );
    app.cleanup().await;
}

// Checks the sale window: before it opens, purchases get sale_not_active and change
// nothing; a product whose window is open sells.
#[tokio::test]
async fn sale_window_is_enforced() {
    let app = TestApp::spawn().await;
    let (s, b) = app
        .admin_post("/v1/products", opening_in_an_hour(6006, 5))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let past = chrono::Utc::now() - chrono::Duration::hours(1);
    let (s, _) = app
        .admin_post(
            "/v1/products",
            json!({"product_id": 6007, "name": "ended", "stock": 5,
                   "sale_starts_at": (past - chrono::Duration::hours(1)).to_rfc3339(),
                   "sale_ends_at": past.to_rfc3339()}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    for product in [6006, 6007] {
        app.refused(
            (&format!("REQ_w{product}"), 1, product, 1),
            (StatusCode::CONFLICT, "sale_not_active"),
        )
        .await;
        assert_eq!(app.redis_available(product).await, Some(5));
    }
    assert_eq!(app.count("SELECT COUNT(*) FROM orders").await, 0);
    app.cleanup().await;
}

// Checks restock while purchases run, and its idempotency: 200 buyers race for 50 units
// while two restocks of 25 are each sent three times concurrently; exactly 100 orders
// result, each restock counted once, and the invariants hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restock_is_idempotent_and_safe_during_sales() {
    let app = TestApp::selling(7007, 50, None).await;
    let buyers = app.rush(200, 64, ("REQ_rs_", 7007), |i| i + 1);
    let restocks = stream::iter([1, 1, 1, 2, 2, 2])
        .map(|n| {
            let app = &app;
            async move { app.restock(7007, &format!("RESTOCK_{n}"), 25).await }
        })
        .buffer_unordered(6)
        .collect::<Vec<_>>();
    let (buys, restocked) = tokio::join!(buyers, restocks);
    for (s, b) in &restocked {
        assert_eq!(*s, StatusCode::OK, "{b}");
    }
    let created = answered(&buys, StatusCode::CREATED, None);
    let sold_out = answered(&buys, StatusCode::CONFLICT, Some("sold_out"));
    assert_eq!(created + sold_out, 200, "{buys:?}");
    let (_, product) = app.get("/v1/products/7007").await;
    assert_eq!(product["inventory"]["total"], 100);
    // Every unit sold or still available; buy up what's left to prove none are lost.
    // Units restocked while the product was sold out wait for the end of its sold-out
    // lease (250 ms by default), so a refusal is retried, with a new request_id, until
    // a bound far past it.
    let left = product["inventory"]["available"]
        .as_i64()
        .expect("available");
    assert_eq!(created as i64 + left, 100);
    let until = std::time::Instant::now() + Duration::from_secs(5);
    let (mut bought, mut attempt) = (0, 0);
    while bought < left {
        attempt += 1;
        let (s, b) = app
            .purchase(&format!("REQ_rest_{attempt}"), 10_000 + attempt, 7007, 1)
            .await;
        match (s, code(&b)) {
            (StatusCode::CREATED, _) => bought += 1,
            (StatusCode::CONFLICT, "sold_out") if std::time::Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            _ => panic!("buying what is left: {s} {b}"),
        }
    }
    app.refused(("REQ_rest_end", 1, 7007, 1), SOLD_OUT).await;
    assert_eq!(app.count("SELECT COUNT(*) FROM orders").await, 100);
    invariants::assert_ok_and_clean_up(app, 7007).await;
}

// Checks a purchase whose first attempt died half way — after Redis took the units and
// recorded the hold, before MariaDB committed (simulated by running only the gate's
// reserve step) — is completed by the client's retry: 200 with an order that accounts
// for that very hold, no second hold taken, invariants clean.
#[tokio::test]
async fn retry_completes_an_attempt_that_died_after_reserving() {
    use flashsale_app::ports::Reserve;
    use flashsale_app::StockGate;
    use flashsale_core::PurchaseRequest;

    let app = TestApp::selling(1300, 3, Some(1)).await;
    let gate = crate::recovery::gate(&app);
    let request = PurchaseRequest::parse("REQ_died", 77, 1300, 1, 5).expect("valid");
    let reserved = gate.reserve(&request, Some(1)).await.expect("reserve");
    let Reserve::Reserved { hold } = reserved else {
        panic!("expected a fresh hold, got {reserved:?}");
    };
    assert_eq!(app.redis_available(1300).await, Some(2));
    assert_eq!(app.count("SELECT COUNT(*) FROM orders").await, 0);

    let (s, b) = app.purchase("REQ_died", 77, 1300, 1).await;
    assert_eq!(
        s,
        StatusCode::OK,
        "a retry of an accepted request is a replay: {b}"
    );
    assert_eq!(b["status"], "PENDING_PAYMENT");
    assert_eq!(app.redis_available(1300).await, Some(2), "no second hold");
    let recorded_hold = app
        .count("SELECT hold_id FROM inventory_reservation WHERE request_id = 'REQ_died'")
        .await;
    assert_eq!(
        recorded_hold,
        hold.id.get(),
        "the order accounts for the original hold"
    );
    invariants::assert_ok_and_clean_up(app, 1300).await;
}
