//! Refunds (`POST /v1/orders/{id}/refund`): a paid order's units back on sale or out of
//! stock, the buyer's limit freed, once per order and once per request_id; what it
//! refuses; a refund flood beside a purchase flood; and a refund in ledger mode.

use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::fallback::on_a_private_redis_with;
use crate::helpers::{assert_error, cleanup_all, code, order_id, TestApp, SOLD_OUT};
use crate::invariants;
use crate::pause::LEDGER_MODE_SOON;

/// The admin's refund of `order`.
async fn refund(app: &TestApp, order: i64, body: Value) -> (StatusCode, Value) {
    app.admin_post(&format!("/v1/orders/{order}/refund"), body)
        .await
}

/// A refund that must answer 200 with the order REFUNDED.
async fn refunded(app: &TestApp, order: i64, request_id: &str, restock: bool) -> Value {
    let body = json!({"request_id": request_id, "restock": restock});
    let (s, b) = refund(app, order, body).await;
    assert_eq!(
        (s, &b["status"]),
        (StatusCode::OK, &json!("REFUNDED")),
        "{b}"
    );
    assert!(b["refunded_at"].is_string(), "the refund's time: {b}");
    b
}

/// A purchase of one unit that must be answered 201, paid by its buyer: its order id.
async fn bought_and_paid(app: &TestApp, rid: &str, user: i64, product: i64) -> i64 {
    let order = order_id(&app.bought(rid, user, product, 1).await);
    let (s, b) = app.pay(order, user).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    order
}

/// The product's counters as GET shows them: (total, available, reserved, sold).
async fn inventory(app: &TestApp, product: i64) -> (i64, i64, i64, i64) {
    let (s, b) = app.get(&format!("/v1/products/{product}")).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let n = |k: &str| b["inventory"][k].as_i64().expect("counter");
    (n("total"), n("available"), n("reserved"), n("sold"))
}

/// The operator's log lines of refunds of the product.
async fn refund_lines(app: &TestApp, product: i64) -> i64 {
    app.count(&format!(
        "SELECT COUNT(*) FROM admin_action WHERE action = 'refund' AND product_id = {product}"
    ))
    .await
}

// Checks both kinds of refund on two instances, a product of 3 units with a limit of 1
// sold out and paid: order 1 refunded with restock puts its unit back on sale at once
// (the other instance sells it, 201) and frees its buyer's limit (user 1 buys again);
// order 2 refunded without restock takes its unit out (total 3 → 2, sold drops, nothing
// to sell). Each is one log line, one `order_refunded` event under the order's
// request_id with the reason, and one count in the metrics. Counters, invariants and
// the audit agree at the end.
#[tokio::test]
async fn a_refund_puts_units_back_on_sale_or_out_of_stock() {
    const PRODUCT: i64 = 4401;
    let (app, other) = TestApp::selling_on_two(PRODUCT, 3, Some(1)).await;
    let mut orders = Vec::new();
    for user in 1..=3 {
        orders.push(bought_and_paid(&other, &format!("REQ_rf_{user}"), user, PRODUCT).await);
    }
    other.refused(("REQ_rf_4", 4, PRODUCT, 1), SOLD_OUT).await;
    assert_eq!(inventory(&app, PRODUCT).await, (3, 0, 0, 3));

    let b = refunded(&app, orders[0], "OP_rf_back", true).await;
    assert_eq!(b["order_id"], json!(orders[0]), "{b}");
    assert_eq!(inventory(&app, PRODUCT).await, (3, 1, 0, 2));
    // The unit is on sale at once, on the other instance too, and user 1's limit is free.
    bought_and_paid(&other, "REQ_rf_1b", 1, PRODUCT).await;
    assert_eq!(inventory(&app, PRODUCT).await, (3, 0, 0, 3));

    refunded(&app, orders[1], "OP_rf_out", false).await;
    assert_eq!(inventory(&app, PRODUCT).await, (2, 0, 0, 2));
    other.refused(("REQ_rf_5", 5, PRODUCT, 1), SOLD_OUT).await;

    assert_eq!(refund_lines(&app, PRODUCT).await, 2);
    let (metrics, _) = app.scrape_metrics().await;
    for counted in [
        "flashsale_refunds_total{outcome=\"restocked\"} 1",
        "flashsale_refunds_total{outcome=\"withdrawn\"} 1",
        "flashsale_refunded_units_total 2",
    ] {
        assert!(
            metrics.lines().any(|l| l == counted),
            "no {counted:?} in:\n{metrics}"
        );
    }
    let reasons: Vec<(String, String)> = app
        .rows(
            "SELECT CAST(request_id AS CHAR), CAST(JSON_VALUE(payload, '$.reason') AS CHAR) \
             FROM outbox WHERE event_type = 'order_refunded' AND product_id = ? ORDER BY id",
            PRODUCT,
        )
        .await;
    assert_eq!(
        reasons,
        [
            ("REQ_rf_1".to_owned(), "refund_restocked".to_owned()),
            ("REQ_rf_2".to_owned(), "refund_withdrawn".to_owned()),
        ]
    );
    invariants::assert_sound(&app, PRODUCT).await;
    cleanup_all([app, other]).await;
}

// Checks a refund's idempotency and refusals, each refusal changing nothing (counters and
// log lines as before): the same request_id again answers 200 and writes nothing; the same
// request_id with the other `restock`, or for another order, is 409 request_id_conflict;
// another request_id for a refunded order answers 200 and changes nothing; an unpaid or a
// cancelled order is 409 order_not_refundable; an unknown order 404; no token 401; a body
// without `restock`, or with an unknown field, 400.
#[tokio::test]
async fn a_refund_happens_once_and_refuses_what_it_cannot_refund() {
    const PRODUCT: i64 = 4402;
    let app = TestApp::selling(PRODUCT, 10, None).await;
    let paid = bought_and_paid(&app, "REQ_ro_1", 1, PRODUCT).await;
    let other_paid = bought_and_paid(&app, "REQ_ro_2", 2, PRODUCT).await;
    let unpaid = order_id(&app.bought("REQ_ro_3", 3, PRODUCT, 1).await);
    let cancelled = order_id(&app.bought("REQ_ro_4", 4, PRODUCT, 1).await);
    let (s, b) = app.cancel(cancelled, 4).await;
    assert_eq!(s, StatusCode::OK, "{b}");

    refunded(&app, paid, "OP_ro", true).await;
    let after = inventory(&app, PRODUCT).await;
    assert_eq!(after, (10, 8, 1, 1));
    refunded(&app, paid, "OP_ro", true).await;
    refunded(&app, paid, "OP_ro_again", false).await;
    let conflicts = [
        (paid, json!({"request_id": "OP_ro", "restock": false})),
        (other_paid, json!({"request_id": "OP_ro", "restock": true})),
    ];
    for (order, body) in conflicts {
        let conflict = (StatusCode::CONFLICT, "request_id_conflict");
        assert_error(refund(&app, order, body).await, conflict);
    }
    for order in [unpaid, cancelled] {
        let body = json!({"request_id": "OP_ro_no", "restock": true});
        let not_refundable = (StatusCode::CONFLICT, "order_not_refundable");
        assert_error(refund(&app, order, body).await, not_refundable);
    }
    let unknown = refund(
        &app,
        999_999,
        json!({"request_id": "OP_ro_x", "restock": true}),
    );
    assert_error(unknown.await, (StatusCode::NOT_FOUND, "order_not_found"));
    let bad = [
        json!({"request_id": "OP_ro_b"}),
        json!({"request_id": "OP_ro_b", "restock": true, "why": 1}),
    ];
    for body in bad {
        let invalid = (StatusCode::BAD_REQUEST, "invalid_request");
        assert_error(refund(&app, other_paid, body).await, invalid);
    }
    let without_token = app
        .post(
            &format!("/v1/orders/{other_paid}/refund"),
            json!({"request_id": "OP_ro_t", "restock": true}),
        )
        .await;
    assert_error(without_token, (StatusCode::UNAUTHORIZED, "unauthorized"));

    assert_eq!(
        inventory(&app, PRODUCT).await,
        after,
        "refusals change nothing"
    );
    assert_eq!(
        refund_lines(&app, PRODUCT).await,
        1,
        "one line for the one refund"
    );
    let (s, b) = app.get(&format!("/v1/orders/{other_paid}")).await;
    assert_eq!((s, &b["status"]), (StatusCode::OK, &json!("PAID")), "{b}");
    invariants::assert_sound_and_clean_up(app, PRODUCT).await;
}

// Checks refunds under a flood, on two instances: 40 units sold out and paid; then 20
// refunds with restock (on one instance) race 60 new buyers (on both), each retrying
// 503s. Exactly the 20 refunded units are sold again: 20 new 201s, the rest sold_out,
// never more. Then total == available + reserved + sold, and invariants and the audit
// hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refunds_racing_a_flood_sell_exactly_the_units_they_give_back() {
    const PRODUCT: i64 = 4403;
    const STOCK: i64 = 40;
    const REFUNDS: usize = 20;
    let app = Arc::new(TestApp::spawn().await);
    let other = Arc::new(app.spawn_beside(&[]).await);
    app.create_product(PRODUCT, STOCK, None).await;
    let mut orders = Vec::new();
    for user in 0..STOCK {
        orders.push(bought_and_paid(&app, &format!("REQ_rr_{user}"), user + 1, PRODUCT).await);
    }
    let refunds = orders[..REFUNDS].iter().enumerate().map(|(i, &order)| {
        let app = app.clone();
        tokio::spawn(async move { refunded(&app, order, &format!("OP_rr_{i}"), true).await })
    });
    let buyers = (0..60_i64).map(|i| {
        let instance = if i % 2 == 0 {
            app.clone()
        } else {
            other.clone()
        };
        tokio::spawn(async move {
            let rid = format!("REQ_rr_new_{i}");
            let (s, b, _) = instance
                .purchase_until_known(&rid, 1000 + i, PRODUCT, 1)
                .await;
            (s, b)
        })
    });
    let buyers: Vec<_> = buyers.collect();
    for r in refunds {
        r.await.expect("refund task");
    }
    let mut sold_again = 0;
    for b in buyers {
        let (s, b) = b.await.expect("buyer task");
        match s {
            StatusCode::CREATED => sold_again += 1,
            StatusCode::CONFLICT => assert_eq!(code(&b), "sold_out", "{b}"),
            other => panic!("unexpected {other}: {b}"),
        }
    }
    // Buyers that met the sold-out product before a refund landed may all have been
    // refused; those after it take the units. Retry until every refunded unit is sold.
    let mut extra = 0;
    while sold_again < REFUNDS as i64 && extra < 200 {
        let (s, _) = app
            .purchase(&format!("REQ_rr_late_{extra}"), 5000 + extra, PRODUCT, 1)
            .await;
        if s == StatusCode::CREATED {
            sold_again += 1;
        }
        extra += 1;
    }
    assert_eq!(
        sold_again, REFUNDS as i64,
        "exactly the refunded units sell again"
    );
    other
        .refused(("REQ_rr_over", 9999, PRODUCT, 1), SOLD_OUT)
        .await;
    let (total, available, reserved, sold) = inventory(&app, PRODUCT).await;
    assert_eq!((total, available), (STOCK, 0));
    assert_eq!(reserved + sold, STOCK);
    invariants::assert_sound(&app, PRODUCT).await;
    cleanup_all([app, other]).await;
}

// Checks a refund while Redis is dead and the product sells from MariaDB (ledger mode):
// the refund with restock puts its unit back in the ledger's counters, where a purchase
// takes it at once (201); a refund without restock takes its unit out of the total. The
// ledger-only audit is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refund_in_ledger_mode_moves_the_ledgers_counters() {
    const PRODUCT: i64 = 4404;
    let (mut redis, app, workers) = on_a_private_redis_with(&LEDGER_MODE_SOON).await;
    app.create_product(PRODUCT, 2, None).await;
    let first = bought_and_paid(&app, "REQ_rl_1", 1, PRODUCT).await;
    redis.kill9().expect("kill redis");
    let (s, b, _) = app.purchase_until_known("REQ_rl_2", 2, PRODUCT, 1).await;
    assert_eq!(s, StatusCode::CREATED, "sold from the ledger: {b}");
    let second = order_id(&b);
    let (s, b) = app.pay(second, 2).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(inventory(&app, PRODUCT).await, (2, 0, 0, 2));

    refunded(&app, first, "OP_rl_back", true).await;
    assert_eq!(inventory(&app, PRODUCT).await, (2, 1, 0, 1));
    let (s, b, _) = app.purchase_until_known("REQ_rl_3", 3, PRODUCT, 1).await;
    assert_eq!(
        s,
        StatusCode::CREATED,
        "the refunded unit sold from the ledger: {b}"
    );
    refunded(&app, second, "OP_rl_out", false).await;
    assert_eq!(inventory(&app, PRODUCT).await, (1, 0, 1, 0));
    workers.stop().await;
    invariants::assert_audit_clean(&app, PRODUCT).await;
    app.cleanup().await;
}
