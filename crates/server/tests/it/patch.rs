//! Changing a product (`PATCH /v1/products/{id}`): what each change means for the
//! purchases after it and the orders before it, on every instance; its validation, its
//! idempotency, the operator's log and the event.

use chrono::{Duration as Days, Utc};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{assert_error, cleanup_all, code, order_id, TestApp, LIMIT_EXCEEDED};
use crate::invariants;
use crate::pause::ANNOUNCED_WITHIN;

/// A purchase's refusal outside the sale's window.
const NOT_ACTIVE: (StatusCode, &str) = (StatusCode::CONFLICT, "sale_not_active");

/// The admin's PATCH of `product` with `body`.
async fn patch(app: &TestApp, product: i64, body: Value) -> (StatusCode, Value) {
    app.send(
        reqwest::Method::PATCH,
        &format!("/v1/products/{product}"),
        Some(&body.to_string()),
        true,
    )
    .await
    .expect("request")
}

/// A PATCH that must answer 200; then the time the other instances are given to hear it.
async fn changed(app: &TestApp, product: i64, body: Value) -> Value {
    let (s, b) = patch(app, product, body).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    tokio::time::sleep(ANNOUNCED_WITHIN).await;
    b
}

// Checks the limit and the window, made on one instance and bought on another: user 7
// holds 2 units under a limit of 3; lowered to 1, the other instance refuses user 7's
// next purchase (409 limit_exceeded) and the two orders stay and are paid; taken off
// (null), user 7 buys again. `sale_ends_at` now ends the sale (409 sale_not_active) and
// an order made before is still paid; a window moved into the future keeps it closed,
// and its start taken off opens it (201). The name changes on GET. Invariants and audit.
#[tokio::test]
async fn a_change_holds_new_purchases_and_keeps_old_orders() {
    const PRODUCT: i64 = 4201;
    let (app, other) = TestApp::selling_on_two(PRODUCT, 100, Some(3)).await;
    let mut orders = Vec::new();
    for rid in ["REQ_pt_1", "REQ_pt_2"] {
        orders.push(order_id(&other.bought(rid, 7, PRODUCT, 1).await));
    }
    let b = changed(
        &app,
        PRODUCT,
        json!({"request_id": "OP_l1", "per_user_limit": 1}),
    )
    .await;
    assert_eq!(b["per_user_limit"], json!(1), "{b}");
    other
        .refused(("REQ_pt_3", 7, PRODUCT, 1), LIMIT_EXCEEDED)
        .await;
    for order in &orders {
        let (s, b) = other.pay(*order, 7).await;
        assert_eq!(s, StatusCode::OK, "kept under a lower limit: {b}");
    }
    let no_limit = json!({"request_id": "OP_l0", "per_user_limit": null});
    changed(&app, PRODUCT, no_limit).await;
    let before_end = order_id(&other.bought("REQ_pt_3", 7, PRODUCT, 1).await);
    let ended = json!({"request_id": "OP_end", "sale_ends_at": Utc::now(), "name": "Ended"});
    changed(&app, PRODUCT, ended).await;
    other.refused(("REQ_pt_4", 8, PRODUCT, 1), NOT_ACTIVE).await;
    let (s, b) = other.pay(before_end, 7).await;
    assert_eq!(
        s,
        StatusCode::OK,
        "an order made before the end is paid: {b}"
    );
    let tomorrow = Utc::now() + Days::days(1);
    let later = json!({"request_id": "OP_later", "sale_starts_at": tomorrow, "sale_ends_at": null});
    changed(&app, PRODUCT, later).await;
    other.refused(("REQ_pt_4", 8, PRODUCT, 1), NOT_ACTIVE).await;
    let now = json!({"request_id": "OP_now", "sale_starts_at": null});
    changed(&app, PRODUCT, now).await;
    other.bought("REQ_pt_4", 8, PRODUCT, 1).await;
    let (s, b) = other.get(&format!("/v1/products/{PRODUCT}")).await;
    assert_eq!(
        (s, &b["name"], &b["sale_starts_at"]),
        (StatusCode::OK, &json!("Ended"), &Value::Null)
    );
    invariants::assert_sound(&app, PRODUCT).await;
    cleanup_all([app, other]).await;
}

// Checks what a PATCH refuses, each changing nothing (the product as GET shows it, and no
// line in the operator's log): a window whose new end is before the kept start (400), an
// empty change, a limit of 0, a bad name, an unknown field (400), no token (401), an
// unknown product (404). Then its idempotency: the same request_id and body again is 200
// with one log line, another body under it 409 request_id_conflict. The log line and
// the product_changed event carry the definition before and after.
#[tokio::test]
async fn a_change_is_checked_idempotent_and_logged() {
    const PRODUCT: i64 = 4202;
    let app = TestApp::spawn().await;
    let start = Utc::now() - Days::days(1);
    let body = json!({"product_id": PRODUCT, "name": "Phone", "stock": 5, "sale_starts_at": start});
    let (s, b) = app.admin_post("/v1/products", body).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (_, before) = app.get(&format!("/v1/products/{PRODUCT}")).await;
    let too_early = start - Days::days(1);
    for (body, status) in [
        (
            json!({"request_id": "OP_x1", "sale_ends_at": too_early}),
            StatusCode::BAD_REQUEST,
        ),
        (json!({"request_id": "OP_x2"}), StatusCode::BAD_REQUEST),
        (
            json!({"request_id": "OP_x3", "per_user_limit": 0}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"request_id": "OP_x4", "name": " \u{200B} "}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"request_id": "OP_x5", "stock": 3}),
            StatusCode::BAD_REQUEST,
        ),
        (
            json!({"request_id": "bad id", "name": "x"}),
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let (s, b) = patch(&app, PRODUCT, body.clone()).await;
        assert_eq!((s, code(&b)), (status, "invalid_request"), "{body}: {b}");
    }
    let unknown = patch(&app, 999_999, json!({"request_id": "OP_x6", "name": "x"})).await;
    assert_error(unknown, (StatusCode::NOT_FOUND, "product_not_found"));
    let stranger = app
        .send(
            reqwest::Method::PATCH,
            &format!("/v1/products/{PRODUCT}"),
            Some(r#"{"request_id":"OP_x7","name":"x"}"#),
            false,
        )
        .await
        .expect("request");
    assert_eq!(stranger.0, StatusCode::UNAUTHORIZED, "{}", stranger.1);
    let (_, unchanged) = app.get(&format!("/v1/products/{PRODUCT}")).await;
    assert_eq!(unchanged, before, "a refused change changes nothing");
    let log = format!(
        "SELECT COUNT(*) FROM admin_action WHERE product_id = {PRODUCT} AND action = 'patch'"
    );
    assert_eq!(app.count(&log).await, 0);
    let body = json!({"request_id": "OP_rename", "name": "Phone 2", "per_user_limit": 2});
    for _ in 0..2 {
        let (s, b) = patch(&app, PRODUCT, body.clone()).await;
        assert_eq!(
            (s, &b["name"], &b["per_user_limit"]),
            (StatusCode::OK, &json!("Phone 2"), &json!(2)),
            "{b}"
        );
    }
    assert_eq!(app.count(&log).await, 1, "a replay writes no second line");
    let other = json!({"request_id": "OP_rename", "name": "Phone 3"});
    let conflict = (StatusCode::CONFLICT, "request_id_conflict");
    assert_error(patch(&app, PRODUCT, other).await, conflict);
    check_change_event(&app, PRODUCT).await;
    invariants::assert_sound_and_clean_up(app, PRODUCT).await;
}

/// The one product_changed event: the admin, the request_id and the name and limit
/// before and after.
async fn check_change_event(app: &TestApp, product: i64) {
    let events: Vec<(String,)> = app
        .rows(
            "SELECT CAST(payload AS CHAR) FROM outbox WHERE product_id = ? \
             AND event_type = 'product_changed'",
            product,
        )
        .await;
    assert_eq!(events.len(), 1, "{events:?}");
    let payload: Value = serde_json::from_str(&events[0].0).expect("payload");
    assert_eq!(
        payload["action_request_id"],
        json!("OP_rename"),
        "{payload}"
    );
    assert_eq!(payload["admin"], json!("admin"), "{payload}");
    assert_eq!(
        (
            &payload["before"]["name"],
            &payload["before"]["per_user_limit"]
        ),
        (&json!("Phone"), &Value::Null),
        "{payload}"
    );
    assert_eq!(
        (
            &payload["after"]["name"],
            &payload["after"]["per_user_limit"]
        ),
        (&json!("Phone 2"), &json!(2)),
        "{payload}"
    );
}

// Checks named admin tokens (FLASHSALE_ADMIN_TOKENS beside FLASHSALE_ADMIN_TOKEN): a
// pause with alice's token, a change with bob's and a resume with the single token are
// each logged under their admin's name (alice, bob, admin), and a token that is none of
// them is 401 and logs nothing.
#[tokio::test]
async fn each_admin_token_names_its_admin_in_the_log() {
    const PRODUCT: i64 = 4203;
    let tokens = "alice:alice-token-1, bob:bob-token-22";
    let app = TestApp::spawn_with(Default::default(), &[("ADMIN_TOKENS", tokens)]).await;
    app.create_product(PRODUCT, 5, None).await;
    let as_admin = |token: &str| format!("Bearer {token}");
    for (method, path, body, token) in [
        (
            "POST",
            "pause",
            json!({"request_id": "NT_1"}),
            "alice-token-1",
        ),
        (
            "PATCH",
            "",
            json!({"request_id": "NT_2", "name": "Renamed"}),
            "bob-token-22",
        ),
        (
            "POST",
            "resume",
            json!({"request_id": "NT_3"}),
            crate::helpers::ADMIN_TOKEN,
        ),
        (
            "POST",
            "pause",
            json!({"request_id": "NT_4"}),
            "mallory-token",
        ),
    ] {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let path = match path {
            "" => format!("/v1/products/{PRODUCT}"),
            what => format!("/v1/products/{PRODUCT}/{what}"),
        };
        let auth = as_admin(token);
        let headers = [("authorization", auth.as_str())];
        let (s, b, _) = app.send_with(method, &path, Some(body), &headers).await;
        let want = match token {
            "mallory-token" => StatusCode::UNAUTHORIZED,
            _ => StatusCode::OK,
        };
        assert_eq!(s, want, "{token}: {b}");
    }
    let log: Vec<(String, String)> = app
        .rows(
            "SELECT CAST(request_id AS CHAR), CAST(admin AS CHAR) FROM admin_action \
             WHERE product_id = ? AND action <> 'create' ORDER BY id",
            PRODUCT,
        )
        .await;
    let want = [("NT_1", "alice"), ("NT_2", "bob"), ("NT_3", "admin")];
    let got: Vec<(&str, &str)> = log.iter().map(|(r, a)| (r.as_str(), a.as_str())).collect();
    assert_eq!(got, want);
    app.cleanup().await;
}
