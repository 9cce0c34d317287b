//! Pay and cancel: the order state machine through the API.

use futures::stream::{self, StreamExt};
use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::{code, order_id, TestApp};
use crate::invariants;

// Checks that pay and cancel racing on the same order resolve it exactly once, over 120
// orders: for each, pay and cancel are sent at the same moment; exactly one answers 200
// and the other the matching 409. Then stock matches: paid units are sold, cancelled
// units are back in Redis, counters and invariants agree. A second cancel of a cancelled
// order answers 200 and returns no more stock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pay_racing_cancel_has_exactly_one_winner() {
    let app = TestApp::spawn().await;
    let rounds: i64 = 120;
    app.create_product(8008, rounds, None).await;
    let mut orders = Vec::new();
    for i in 0..rounds {
        let b = app.bought(&format!("REQ_race_{i}"), i + 1, 8008, 1).await;
        orders.push((order_id(&b), i + 1));
    }
    let outcomes: Vec<_> = stream::iter(orders.clone())
        .map(|(id, user)| {
            let app = &app;
            async move {
                let (pay_path, cancel_path) = (
                    format!("/v1/orders/{id}/pay"),
                    format!("/v1/orders/{id}/cancel"),
                );
                let pay = app.post(&pay_path, json!({"user_id": user}));
                let cancel = app.post(&cancel_path, json!({"user_id": user}));
                let (pay, cancel) = tokio::join!(pay, cancel);
                (id, pay, cancel)
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let (mut paid, mut cancelled) = (0, 0);
    for (id, (ps, pb), (cs, cb)) in &outcomes {
        match (*ps, *cs) {
            (StatusCode::OK, StatusCode::CONFLICT) => {
                assert_eq!(pb["status"], "PAID");
                assert_eq!(code(cb), "order_not_cancellable");
                paid += 1;
            }
            (StatusCode::CONFLICT, StatusCode::OK) => {
                assert_eq!(cb["status"], "CANCELLED");
                assert_eq!(code(pb), "order_not_payable");
                cancelled += 1;
            }
            other => panic!("order {id}: both or neither won: {other:?} {pb} {cb}"),
        }
    }
    assert_eq!(paid + cancelled, rounds);
    assert_eq!(app.redis_available(8008).await, Some(cancelled));
    let (_, product) = app.get("/v1/products/8008").await;
    assert_eq!(
        product["inventory"],
        json!({"total": rounds, "available": cancelled, "reserved": 0, "sold": paid})
    );
    // Repeats change nothing: cancel again, pay again.
    for (id, (ps, _), _) in &outcomes {
        let user = orders
            .iter()
            .find(|(o, _)| o == id)
            .map(|(_, u)| *u)
            .expect("user");
        let path = if *ps == StatusCode::OK {
            "pay"
        } else {
            "cancel"
        };
        let (s, _) = app
            .post(&format!("/v1/orders/{id}/{path}"), json!({"user_id": user}))
            .await;
        assert_eq!(s, StatusCode::OK, "repeated {path} of order {id}");
    }
    assert_eq!(
        app.redis_available(8008).await,
        Some(cancelled),
        "stock returned once"
    );
    invariants::assert_ok_and_clean_up(app, 8008).await;
}

// Checks ownership and expiry: another user's order is 404 for pay and cancel; an order
// past its payment deadline can't be paid (order_expired) and changes nothing; unknown
// orders are 404.
#[tokio::test]
async fn pay_checks_owner_and_deadline() {
    let app = TestApp::selling_with(&[("PAYMENT_TIMEOUT", "1s")], (9009, 5, None)).await;
    let (_, b) = app.purchase("REQ_own", 5, 9009, 1).await;
    let id = order_id(&b);
    for path in ["pay", "cancel"] {
        let (s, b) = app
            .post(&format!("/v1/orders/{id}/{path}"), json!({"user_id": 6}))
            .await;
        assert_eq!((s, code(&b)), (StatusCode::NOT_FOUND, "order_not_found"));
    }
    let (s, b) = app
        .post("/v1/orders/999999/pay", json!({"user_id": 5}))
        .await;
    assert_eq!((s, code(&b)), (StatusCode::NOT_FOUND, "order_not_found"));
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let (s, b) = app.pay(id, 5).await;
    assert_eq!(
        (s, code(&b)),
        (StatusCode::CONFLICT, "order_expired"),
        "{b}"
    );
    let (_, order) = app.get(&format!("/v1/orders/{id}")).await;
    assert_eq!(order["status"], "PENDING_PAYMENT");
    app.cleanup().await;
}
