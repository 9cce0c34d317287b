//! Pausing and resuming a sale (`POST /v1/products/{id}/pause|resume`): while paused,
//! purchases answer 409 `sale_paused` on every instance, replays still get their orders,
//! pay and cancel go on; the pause is idempotent by its request_id, logged with its admin
//! and before/after states, and published as an event.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::fallback::on_a_private_redis_with;
use crate::helpers::{assert_error, cleanup_all, code, order_id, TestApp, SALE_PAUSED};
use crate::invariants;

/// How soon after the pause's (or resume's) 200 every instance must act on it. The
/// announcement reaches an instance in milliseconds (printed); this leaves room for a
/// loaded CI machine while staying well under the catalog's one-second expiry, so a
/// test that passes shows the announcement working, not the expiry.
pub(crate) const ANNOUNCED_WITHIN: Duration = Duration::from_millis(300);
/// Buyers per instance in the flood.
const BUYERS: usize = 6;
/// The product's units: more than the flood can buy, so no answer is `sold_out`.
const STOCK: i64 = 1_000_000;

/// One purchase's answer, with when it was sent (relative to the test's start).
struct Answer {
    sent: Duration,
    status: StatusCode,
    code: String,
}

/// Buyers that purchase on `app` with fresh request_ids until `stop`.
fn flood(
    app: &Arc<TestApp>,
    instance: usize,
    product: i64,
    start: Instant,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<Vec<Answer>>> {
    (0..BUYERS)
        .map(|b| {
            let (app, stop) = (app.clone(), stop.clone());
            tokio::spawn(async move {
                let mut answers = Vec::new();
                let user = (instance * BUYERS + b + 1) as i64;
                for i in 0.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let sent = start.elapsed();
                    let rid = format!("REQ_flood_{instance}_{b}_{i}");
                    let (status, body) = app.purchase(&rid, user, product, 1).await;
                    let code = code(&body).to_owned();
                    answers.push(Answer { sent, status, code });
                }
                answers
            })
        })
        .collect()
}

/// A switch (`pause` or `resume`) made on `app`; returns when it was sent and when its
/// 200 came.
async fn switch(
    app: &TestApp,
    product: i64,
    what: &str,
    rid: &str,
    start: Instant,
) -> (Duration, Duration) {
    let sent = start.elapsed();
    let (status, body) = app
        .admin_post(
            &format!("/v1/products/{product}/{what}"),
            json!({ "request_id": rid }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{what}: {body}");
    assert_eq!(body["paused"], json!(what == "pause"), "{body}");
    (sent, start.elapsed())
}

/// Checks one instance's answers around a pause answered at `paused` and a resume sent
/// at `resuming` and answered at `resumed`: every purchase sent from `ANNOUNCED_WITHIN`
/// after the pause's 200 until the resume was sent is `sale_paused`, and every purchase
/// sent from `ANNOUNCED_WITHIN` after the resume's 200 is 201. Returns how long after the
/// pause's 200 a purchase was last sold, and the first sale's time after the resume's.
fn check_instance(
    instance: usize,
    answers: &[Answer],
    paused: Duration,
    (resuming, resumed): (Duration, Duration),
) -> (Duration, Duration) {
    for a in answers {
        let refused = a.status == StatusCode::CONFLICT && a.code == "sale_paused";
        let sold = a.status == StatusCode::CREATED;
        assert!(
            refused || sold,
            "instance {instance}: {} {}",
            a.status,
            a.code
        );
        if a.sent >= paused + ANNOUNCED_WITHIN && a.sent < resuming {
            assert!(
                refused,
                "instance {instance}: sold {:?} after the pause",
                a.sent - paused
            );
        }
        if a.sent >= resumed + ANNOUNCED_WITHIN {
            assert!(
                sold,
                "instance {instance}: refused {:?} after the resume",
                a.sent - resumed
            );
        }
    }
    assert!(
        answers.iter().any(|a| a.code == "sale_paused"),
        "instance {instance}: no refusal"
    );
    // How long after the pause's 200 the instance still sold (zero: not at all).
    let last_sale = answers
        .iter()
        .filter(|a| a.sent >= paused && a.sent < resuming && a.status == StatusCode::CREATED)
        .map(|a| a.sent - paused)
        .max()
        .unwrap_or_default();
    let first_sale_back = answers
        .iter()
        .find(|a| a.sent >= resumed && a.status == StatusCode::CREATED)
        .map(|a| a.sent - resumed)
        .expect("a sale after the resume");
    (last_sale, first_sale_back)
}

// Checks the pause under a flood on three instances (one router, catalog and
// subscription each, on one database and Redis): buyers purchase on every instance
// without pause; the pause is made on the first. Every purchase any instance was sent
// from ANNOUNCED_WITHIN after the pause's 200 is refused with `sale_paused`, and from
// ANNOUNCED_WITHIN after the resume's 200 (made on the second instance) sold again; the
// time to the first refusal and first sale on each instance is printed. Afterwards the
// ledger's orders are exactly the 201s and the invariants and the audit hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pause_reaches_every_instance_under_a_flood() {
    const PRODUCT: i64 = 4101;
    let first = TestApp::spawn().await;
    let (second, third) = (first.spawn_beside(&[]).await, first.spawn_beside(&[]).await);
    let apps = [Arc::new(first), Arc::new(second), Arc::new(third)];
    apps[0].create_product(PRODUCT, STOCK, None).await;
    let (start, stop) = (Instant::now(), Arc::new(AtomicBool::new(false)));
    let floods: Vec<_> = apps
        .iter()
        .enumerate()
        .map(|(i, app)| flood(app, i, PRODUCT, start, &stop))
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, paused) = switch(&apps[0], PRODUCT, "pause", "PAUSE_flood", start).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let resumed = switch(&apps[1], PRODUCT, "resume", "RESUME_flood", start).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    stop.store(true, Ordering::Relaxed);
    let mut created = 0;
    for (i, handles) in floods.into_iter().enumerate() {
        let mut answers: Vec<Answer> = Vec::new();
        for h in handles {
            answers.extend(h.await.expect("buyer"));
        }
        answers.sort_by_key(|a| a.sent);
        created += answers
            .iter()
            .filter(|a| a.status == StatusCode::CREATED)
            .count();
        let (sold_until, sold_after) = check_instance(i, &answers, paused, resumed);
        println!(
            "instance {i}: {} purchases; last 201 sent {sold_until:?} after the pause's \
             200, first 201 sent {sold_after:?} after the resume's 200",
            answers.len()
        );
    }
    let orders = apps[0]
        .count(&format!(
            "SELECT COUNT(*) FROM orders WHERE product_id = {PRODUCT}"
        ))
        .await;
    assert_eq!(orders, created as i64, "one order per 201");
    invariants::assert_sound(&apps[0], PRODUCT).await;
    cleanup_all(apps).await;
}

/// The admin's POST of `what` on `product` with `body`.
pub(crate) async fn act(
    app: &TestApp,
    product: i64,
    what: &str,
    body: Value,
) -> (StatusCode, Value) {
    app.admin_post(&format!("/v1/products/{product}/{what}"), body)
        .await
}

/// A pause or resume (`what`) of `product` that must answer 200 with the product paused
/// or not as `what` asks.
async fn acted(app: &TestApp, product: i64, what: &str, request_id: &str) {
    let (s, b) = act(app, product, what, json!({"request_id": request_id})).await;
    let paused = what == "pause";
    assert_eq!((s, &b["paused"]), (StatusCode::OK, &json!(paused)), "{b}");
}

// Checks what a pause means for one buyer's orders and the operator's records, on one
// instance: a pending order made before the pause is still paid and another cancelled
// while paused, a replay of a purchase made before gets its order (200) while a new
// purchase gets 409 sale_paused and writes nothing; GET shows `paused`. The pause is
// idempotent (its request_id again: 200, no second log line), its request_id for a
// resume is 409 request_id_conflict, an unknown product 404, no token 401, a bad
// request_id 400. Resumed, a purchase is 201. The operator's log holds the pause and the
// resume with their admin and before/after states, and the outbox a product_paused and
// a product_resumed event keyed ADMIN_<log id>. Invariants and audit hold.
#[tokio::test]
async fn a_paused_sale_refuses_purchases_and_lets_orders_finish() {
    const PRODUCT: i64 = 4102;
    let app = TestApp::selling(PRODUCT, 10, None).await;
    let mut orders = Vec::new();
    for (rid, user) in [("REQ_p_1", 1), ("REQ_p_2", 2)] {
        orders.push(order_id(&app.bought(rid, user, PRODUCT, 1).await));
    }
    acted(&app, PRODUCT, "pause", "OP_pause_1").await;
    let (s, b) = app.get(&format!("/v1/products/{PRODUCT}")).await;
    assert_eq!((s, &b["paused"]), (StatusCode::OK, &json!(true)), "{b}");
    app.refused(("REQ_p_3", 3, PRODUCT, 1), SALE_PAUSED).await;
    let (s, b) = app.purchase("REQ_p_1", 1, PRODUCT, 1).await;
    assert_eq!(
        (s, order_id(&b)),
        (StatusCode::OK, orders[0]),
        "a replay: {b}"
    );
    let (s, b) = app.pay(orders[0], 1).await;
    assert_eq!(s, StatusCode::OK, "pay while paused: {b}");
    let (s, b) = app.cancel(orders[1], 2).await;
    assert_eq!(s, StatusCode::OK, "cancel while paused: {b}");
    let refused = app
        .count("SELECT COUNT(*) FROM inventory_reservation WHERE request_id = 'REQ_p_3'")
        .await;
    assert_eq!(refused, 0, "a refused purchase writes nothing");
    check_refusals(&app, PRODUCT, &json!({"request_id": "OP_pause_1"})).await;
    acted(&app, PRODUCT, "resume", "OP_resume_1").await;
    app.bought("REQ_p_3", 3, PRODUCT, 1).await;
    check_records(&app, PRODUCT).await;
    invariants::assert_sound(&app, PRODUCT).await;
    audit_sees_a_line_without_its_event(&app, PRODUCT).await;
    app.cleanup().await;
}

/// The pause's refusals: its replay changes nothing, its request_id names no other
/// action, and a stranger, an unknown product or a bad request_id are refused.
async fn check_refusals(app: &TestApp, product: i64, pause: &Value) {
    let (s, b) = act(app, product, "pause", pause.clone()).await;
    assert_eq!(
        (s, &b["paused"]),
        (StatusCode::OK, &json!(true)),
        "a replay: {b}"
    );
    let conflict = act(app, product, "resume", pause.clone()).await;
    assert_error(conflict, (StatusCode::CONFLICT, "request_id_conflict"));
    let unknown = act(app, 999_999, "pause", json!({"request_id": "OP_pause_x"})).await;
    assert_error(unknown, (StatusCode::NOT_FOUND, "product_not_found"));
    let without_token = app
        .post(
            &format!("/v1/products/{product}/resume"),
            json!({"request_id": "OP_r"}),
        )
        .await;
    assert_error(without_token, (StatusCode::UNAUTHORIZED, "unauthorized"));
    for bad in [
        json!({"request_id": "bad id"}),
        json!({"request_id": "OP_r", "x": 1}),
    ] {
        let invalid = (StatusCode::BAD_REQUEST, "invalid_request");
        assert_error(act(app, product, "resume", bad).await, invalid);
    }
}

/// A line forged into the operator's log, with no event: the audit reports I7 naming it.
async fn audit_sees_a_line_without_its_event(app: &TestApp, product: i64) {
    let forged = sqlx::query(
        "INSERT INTO admin_action (request_id, action, product_id, admin, before_state, \
         after_state) VALUES ('OP_forged', 'pause', ?, 'admin', '{}', '{}')",
    )
    .bind(product)
    .execute(&app.pool)
    .await
    .expect("forge a line")
    .last_insert_id();
    let id = flashsale_core::ProductId::parse(product).expect("id");
    let report = app.maintenance.audit(id).await.expect("audit");
    let i7: Vec<_> = report
        .violations
        .iter()
        .filter(|v| v.invariant == "I7")
        .collect();
    assert_eq!(i7.len(), 1, "{report}");
    assert_eq!(i7[0].request_ids, [format!("ADMIN_{forged}")], "{report}");
}

/// The operator's log and the events of one pause and one resume.
async fn check_records(app: &TestApp, product: i64) {
    let log: Vec<(i64, String, String, String, String, String)> = app
        .rows(
            "SELECT id, CAST(request_id AS CHAR), CAST(action AS CHAR), CAST(admin AS CHAR), \
             CAST(before_state AS CHAR), CAST(after_state AS CHAR) FROM admin_action \
             WHERE product_id = ? AND action <> 'create' ORDER BY id",
            product,
        )
        .await;
    let lines: Vec<_> = log
        .iter()
        .map(|(_, rid, action, admin, before, after)| {
            let state = |s: &str| serde_json::from_str::<Value>(s).expect("json")["paused"].clone();
            (
                rid.as_str(),
                action.as_str(),
                admin.as_str(),
                state(before),
                state(after),
            )
        })
        .collect();
    assert_eq!(
        lines,
        [
            ("OP_pause_1", "pause", "admin", json!(false), json!(true)),
            ("OP_resume_1", "resume", "admin", json!(true), json!(false)),
        ]
    );
    let events: Vec<(String, String, String)> = app
        .rows(
            "SELECT CAST(event_type AS CHAR), CAST(request_id AS CHAR), CAST(payload AS CHAR) \
             FROM outbox WHERE product_id = ? \
             AND request_id LIKE 'ADMIN\\_%' ORDER BY id",
            product,
        )
        .await;
    assert_eq!(events.len(), 2, "{events:?}");
    for ((kind, key, payload), (id, rid, ..)) in events.iter().zip(&log) {
        let payload: Value = serde_json::from_str(payload).expect("payload");
        assert_eq!(key, &format!("ADMIN_{id}"));
        assert_eq!(payload["action_request_id"], json!(rid), "{payload}");
        let paused = kind == "product_paused";
        assert_eq!(payload["before"]["paused"], json!(!paused), "{payload}");
        assert_eq!(payload["after"]["paused"], json!(paused), "{payload}");
        assert_eq!(payload["admin"], json!("admin"), "{payload}");
    }
    assert_eq!(events[0].0, "product_paused");
    assert_eq!(events[1].0, "product_resumed");
}

/// The product's stock mode, as `GET /v1/products/{id}` shows it ("unknown" while it
/// answers 503: in gate mode with Redis dead, its count can't be read).
async fn stock_mode(app: &TestApp, product: i64) -> String {
    let (_, b) = app.get(&format!("/v1/products/{product}")).await;
    b["stock_mode"].as_str().unwrap_or("unknown").to_owned()
}

/// A new purchase on `app`, retried while its outcome is unknown: its final status.
async fn buy(app: &TestApp, rid: &str, user: i64, product: i64) -> (StatusCode, Value) {
    let (s, b, _) = app.purchase_until_known(rid, user, product, 1).await;
    (s, b)
}

/// Settings for a test that kills its private Redis to sell from MariaDB: the product
/// moves to ledger mode a second after the gate fails, and stays there for the test.
pub(crate) const LEDGER_MODE_SOON: [(&str, &str); 3] = [
    ("FALLBACK_AFTER", "1s"),
    ("FALLBACK_RECOVER_AFTER", "60s"),
    ("RECOVERY_AFTER", "15s"),
];

// Checks a pause while Redis is dead and the product sells from MariaDB (ledger mode),
// on two instances: the pause cannot be announced (the channel is Redis's), so its 200
// waits out the catalog's one-second expiry, and from then on both instances answer
// `sale_paused` at once. The resume, unannounced too, lets both sell from the ledger
// again (201). The audit, which needs only the ledger in ledger mode, is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pause_holds_in_ledger_mode_with_redis_dead() {
    const PRODUCT: i64 = 4103;
    let (mut redis, app, workers) = on_a_private_redis_with(&LEDGER_MODE_SOON).await;
    let beside = app.spawn_beside(&LEDGER_MODE_SOON).await;
    app.create_product(PRODUCT, 100, None).await;
    for (i, instance) in [&app, &beside].into_iter().enumerate() {
        let (s, b) = buy(instance, &format!("REQ_lm_gate_{i}"), 1, PRODUCT).await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
    }
    redis.kill9().expect("kill redis");
    // Purchases meet the dead gate, and the product moves to the ledger.
    for (i, instance) in [&app, &beside].into_iter().enumerate() {
        let (s, b) = buy(instance, &format!("REQ_lm_ledger_{i}"), 2, PRODUCT).await;
        assert_eq!(s, StatusCode::CREATED, "sold from the ledger: {b}");
    }
    assert_eq!(stock_mode(&app, PRODUCT).await, "ledger");
    let asked = Instant::now();
    acted(&app, PRODUCT, "pause", "OP_lm_pause").await;
    assert!(
        asked.elapsed() >= Duration::from_secs(1),
        "waited out the expiry"
    );
    for (i, instance) in [&app, &beside].into_iter().enumerate() {
        let rid = format!("REQ_lm_paused_{i}");
        instance.refused((&rid, 3, PRODUCT, 1), SALE_PAUSED).await;
    }
    acted(&app, PRODUCT, "resume", "OP_lm_resume").await;
    for (i, instance) in [&app, &beside].into_iter().enumerate() {
        let (s, b) = buy(instance, &format!("REQ_lm_resumed_{i}"), 4, PRODUCT).await;
        assert_eq!(s, StatusCode::CREATED, "{i}: {b}");
    }
    workers.stop().await;
    // The audit reads the ledger alone in ledger mode (Redis is dead).
    invariants::assert_audit_clean(&app, PRODUCT).await;
    cleanup_all([app, beside]).await;
}
