//! Bad input: every case gets its status and stable error code, and changes nothing.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::{code, TestApp};

/// method, path, body, as admin, expected status, expected error code.
type Case = (Method, String, Option<String>, bool, u16, &'static str);

/// Everything a request could have changed: row counts of every table and every Redis
/// key of the test with its serialized value.
pub async fn snapshot(app: &TestApp) -> (Vec<i64>, Vec<(String, String)>) {
    let mut counts = Vec::new();
    for table in [
        "products",
        "product_inventory",
        "orders",
        "inventory_reservation",
        "inventory_log",
        "restock_request",
    ] {
        counts.push(app.count(&format!("SELECT COUNT(*) FROM {table}")).await);
    }
    let versions = app
        .count("SELECT CAST(COALESCE(SUM(version), 0) AS SIGNED) FROM product_inventory")
        .await;
    counts.push(versions);
    (counts, app.redis_dump().await)
}

// Checks a table of bad requests, one per way to get input wrong: each must answer its
// documented status and error code, and the stores must be byte-for-byte as before
// (row counts, counter versions, every Redis key and value). An admin endpoint without
// credentials answers 401 whatever else is wrong with the request. Among them: ids
// percent-encoded in a path, names with invisible characters, and a per-user limit over
// its bound, whose message must name that bound.
#[tokio::test]
async fn bad_inputs_are_refused_and_change_nothing() {
    let app = TestApp::selling(1100, 10, Some(1)).await;
    let future = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let (s, _) = app
        .admin_post(
            "/v1/products",
            json!({"product_id": 1101, "name": "later", "stock": 3, "sale_starts_at": future}),
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    let existing = app.bought("REQ_exist", 1, 1100, 1).await;
    let order = existing["order_id"].as_i64().expect("order id");
    let long_id = "x".repeat(65);
    let big = format!("{{\"request_id\": \"{}\"}}", "y".repeat(20_000));
    let purchase = |r: &str, u: serde_json::Value, p: serde_json::Value, q: serde_json::Value| {
        json!({"request_id": r, "user_id": u, "product_id": p, "quantity": q}).to_string()
    };
    let p = "/v1/purchases";
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        (Method::POST, p.into(), Some("{".into()), false, 400, "invalid_request"),
        (Method::POST, p.into(), Some("[]".into()), false, 400, "invalid_request"),
        (Method::POST, p.into(), Some("".into()), false, 400, "invalid_request"),
        (Method::POST, p.into(), Some(big), false, 413, "payload_too_large"),
        (Method::POST, p.into(), Some(json!({"user_id": 1, "product_id": 1100, "quantity": 1}).to_string()), false, 400, "invalid_request"),
        (Method::POST, p.into(), Some(json!({"request_id": "R", "product_id": 1100, "quantity": 1}).to_string()), false, 400, "invalid_request"),
        (Method::POST, p.into(), Some(json!({"request_id": "R", "user_id": 1, "product_id": 1100}).to_string()), false, 400, "invalid_request"),
        (Method::POST, p.into(), Some(purchase("", json!(1), json!(1100), json!(1))), false, 400, "invalid_request"),
        (Method::POST, p.into(), Some(purchase(&long_id, json!(1), json!(1100), json!(1))), false, 400, "invalid_request"),
        (Method::POST, p.into(), Some(purchase("a b", json!(1), json!(1100), json!(1))), false, 400, "invalid_request"),
        (Method::POST, p.into(), Some(purchase("a/b", json!(1), json!(1100), json!(1))), false, 400, "invalid_request"),
        (Method::POST, p.into(), Some(purchase("ä", json!(1), json!(1100), json!(1))), false, 400, "invalid_request"),
        (Method::POST, p.into(), Some(purchase("R1", json!(0), json!(1100), json!(1))), false, 400, "invalid_request"),
        (Method::POST, p.into(), Some(purchase("R1", json!(-3), json!(1100), json!(1))), false, 400, "invalid_request"),
        (Method::POST, p.into(), Some(purchase("R1", json!("1"), json!(1100), json!(1))), false, 400, "invalid_request"),
        (Method::POST, p.into(), Some(purchase("R1", json!(1), json!(0), json!(1))), false, 400, "invalid_request"),
        (Method::POST, p.into(), Some(purchase("R1", json!(2), json!(1100), json!(0))), false, 400, "invalid_request"),
        (Method::POST, p.into(), Some(purchase("R1", json!(2), json!(1100), json!(6))), false, 400, "invalid_request"),
        (Method::POST, p.into(), Some(purchase("R1", json!(2), json!(1100), json!(1.5))), false, 400, "invalid_request"),
        (Method::POST, p.into(), Some(purchase("R1", json!(2), json!(1100), json!(-1))), false, 400, "invalid_request"),
        // An unknown field is refused, not ignored: a misspelt one would take a default.
        (Method::POST, p.into(), Some(json!({"request_id": "R1", "user_id": 2, "product_id": 1100, "quantity": 1, "quantty": 2}).to_string()), false, 400, "invalid_request"),
        (Method::POST, p.into(), Some(json!({"request_id": "R1", "user_id": 2, "product_id": 1100, "quantity": 1, "price": 0}).to_string()), false, 400, "invalid_request"),
        // A body is an object, not the array of its fields in order.
        (Method::POST, p.into(), Some(json!(["R1", 2, 1100, 1]).to_string()), false, 400, "invalid_request"),
        (Method::POST, format!("/v1/orders/{order}/pay"), Some(json!({"user_id": 1, "amount": 0}).to_string()), false, 400, "invalid_request"),
        (Method::POST, format!("/v1/orders/{order}/cancel"), Some(json!({"user_id": 1, "reason": "x"}).to_string()), false, 400, "invalid_request"),
        (Method::POST, "/v1/products".into(), Some(json!({"product_id": 1102, "name": "typo", "stock": 1, "sale_start_at": future}).to_string()), true, 400, "invalid_request"),
        (Method::POST, "/v1/products".into(), Some(json!({"product_id": 1102, "name": "typo", "stock": 1, "per_user_limt": 1}).to_string()), true, 400, "invalid_request"),
        (Method::POST, "/v1/products/1100/restock".into(), Some(json!({"request_id": "RS", "quantity": 1, "qty": 5}).to_string()), true, 400, "invalid_request"),
        (Method::POST, p.into(), Some(purchase("R1", json!(2), json!(424242), json!(1))), false, 404, "product_not_found"),
        (Method::POST, p.into(), Some(purchase("R1", json!(2), json!(1101), json!(1))), false, 409, "sale_not_active"),
        (Method::POST, p.into(), Some(purchase("REQ_exist", json!(2), json!(1100), json!(1))), false, 409, "request_id_conflict"),
        (Method::POST, p.into(), Some(purchase("REQ_other", json!(1), json!(1100), json!(1))), false, 409, "limit_exceeded"),
        (Method::GET, "/v1/purchases/a%20b".into(), None, false, 400, "invalid_request"),
        (Method::GET, "/v1/purchases/%FF".into(), None, false, 400, "invalid_request"),
        (Method::GET, "/v1/orders/%FF%FE".into(), None, false, 400, "invalid_request"),
        (Method::POST, "/v1/orders/%C0/pay".into(), Some(json!({"user_id": 1}).to_string()), false, 400, "invalid_request"),
        (Method::GET, "/v1/purchases/REQ_nope".into(), None, false, 404, "order_not_found"),
        (Method::GET, "/v1/orders/abc".into(), None, false, 400, "invalid_request"),
        (Method::GET, "/v1/orders/0".into(), None, false, 400, "invalid_request"),
        (Method::GET, format!("/v1/orders/+{order}"), None, false, 400, "invalid_request"),
        (Method::GET, format!("/v1/orders/0{order}"), None, false, 400, "invalid_request"),
        (Method::GET, format!("/v1/orders/%20{order}"), None, false, 400, "invalid_request"),
        (Method::GET, format!("/v1/orders/{order}%20"), None, false, 400, "invalid_request"),
        (Method::POST, format!("/v1/orders/+{order}/pay"), Some(json!({"user_id": 1}).to_string()), false, 400, "invalid_request"),
        (Method::POST, format!("/v1/orders/0{order}/cancel"), Some(json!({"user_id": 1}).to_string()), false, 400, "invalid_request"),
        (Method::GET, "/v1/products/01100".into(), None, false, 400, "invalid_request"),
        // An id is its plain digits, never percent-encoded ones decoded.
        (Method::GET, format!("/v1/orders/{}", percent_encoded(order)), None, false, 400, "invalid_request"),
        (Method::POST, format!("/v1/orders/{}/pay", percent_encoded(order)), Some(json!({"user_id": 1}).to_string()), false, 400, "invalid_request"),
        (Method::POST, format!("/v1/orders/{}/cancel", percent_encoded(order)), Some(json!({"user_id": 1}).to_string()), false, 400, "invalid_request"),
        (Method::GET, "/v1/products/%31%31%30%30".into(), None, false, 400, "invalid_request"),
        (Method::GET, "/v1/products/11%300".into(), None, false, 400, "invalid_request"),
        (Method::POST, "/v1/products/%31100/restock".into(), Some(json!({"request_id": "RS", "quantity": 1}).to_string()), true, 400, "invalid_request"),
        (Method::POST, "/v1/products/+1100/restock".into(), Some(json!({"request_id": "RS", "quantity": 1}).to_string()), true, 400, "invalid_request"),
        (Method::GET, "/v1/orders/99999999".into(), None, false, 404, "order_not_found"),
        (Method::POST, format!("/v1/orders/{order}/pay"), Some("{}".into()), false, 400, "invalid_request"),
        (Method::POST, format!("/v1/orders/{order}/pay"), Some(json!({"user_id": 0}).to_string()), false, 400, "invalid_request"),
        (Method::POST, format!("/v1/orders/{order}/pay"), Some(json!({"user_id": 2}).to_string()), false, 404, "order_not_found"),
        (Method::POST, format!("/v1/orders/{order}/cancel"), Some(json!({"user_id": 2}).to_string()), false, 404, "order_not_found"),
        (Method::POST, "/v1/orders/x/cancel".into(), Some(json!({"user_id": 1}).to_string()), false, 400, "invalid_request"),
        (Method::GET, "/v1/products/abc".into(), None, false, 400, "invalid_request"),
        (Method::GET, "/v1/products/-1".into(), None, false, 400, "invalid_request"),
        (Method::GET, "/v1/products/31337".into(), None, false, 404, "product_not_found"),
        (Method::POST, "/v1/products".into(), Some(json!({"product_id": 1, "name": "x", "stock": 1}).to_string()), false, 401, "unauthorized"),
        (Method::POST, "/v1/products".into(), Some(json!({"product_id": 0, "name": "x", "stock": 1}).to_string()), true, 400, "invalid_request"),
        (Method::POST, "/v1/products".into(), Some(json!({"product_id": 1, "name": "", "stock": 1}).to_string()), true, 400, "invalid_request"),
        (Method::POST, "/v1/products".into(), Some(json!({"product_id": 1, "name": "x", "stock": -1}).to_string()), true, 400, "invalid_request"),
        (Method::POST, "/v1/products".into(), Some(json!({"product_id": 1, "name": "x", "stock": 1, "per_user_limit": 0}).to_string()), true, 400, "invalid_request"),
        (Method::POST, "/v1/products".into(), Some(json!({"product_id": 1, "name": "x", "stock": 1, "per_user_limit": i64::MAX}).to_string()), true, 400, "invalid_request"),
        (Method::POST, "/v1/products".into(), Some(json!({"product_id": 1, "name": "x", "stock": 1, "sale_starts_at": "tomorrow"}).to_string()), true, 400, "invalid_request"),
        (Method::POST, "/v1/products".into(), Some(json!({"product_id": 1, "name": "x", "stock": 1, "sale_starts_at": "2026-12-01T10:00:00Z", "sale_ends_at": "2026-12-01T09:00:00Z"}).to_string()), true, 400, "invalid_request"),
        (Method::POST, "/v1/products".into(), Some(json!({"product_id": 1, "name": "x", "stock": 1, "sale_starts_at": "+262142-01-01T00:00:00Z"}).to_string()), true, 400, "invalid_request"),
        (Method::POST, "/v1/products".into(), Some(json!({"product_id": 1, "name": "x", "stock": 1, "sale_ends_at": "+262142-01-01T00:00:00Z"}).to_string()), true, 400, "invalid_request"),
        (Method::POST, "/v1/products".into(), Some(json!({"product_id": 1, "name": "x", "stock": 1, "sale_starts_at": "0999-12-31T23:59:59Z"}).to_string()), true, 400, "invalid_request"),
        (Method::POST, "/v1/products".into(), Some(json!({"product_id": 1, "name": "x", "stock": 1, "sale_ends_at": "2016-12-31T23:59:60Z"}).to_string()), true, 400, "invalid_request"),
        (Method::POST, "/v1/products".into(), Some(json!({"product_id": 1, "name": "a\u{0}b", "stock": 1}).to_string()), true, 400, "invalid_request"),
        (Method::POST, "/v1/products".into(), Some(json!({"product_id": 1, "name": "\u{1b}[31mred", "stock": 1}).to_string()), true, 400, "invalid_request"),
        (Method::POST, "/v1/products".into(), Some(json!({"product_id": 1, "name": "abc\u{7f}", "stock": 1}).to_string()), true, 400, "invalid_request"),
        (Method::POST, "/v1/products".into(), Some(json!({"product_id": 1, "name": "evil\u{202e}gpj.exe", "stock": 1}).to_string()), true, 400, "invalid_request"),
        (Method::POST, "/v1/products".into(), Some(json!({"product_id": 1, "name": "x\u{2067}y", "stock": 1}).to_string()), true, 400, "invalid_request"),
        // Invisible characters: a name that looks like another, or a line break in a log.
        (Method::POST, "/v1/products".into(), Some(json!({"product_id": 1, "name": "Pho\u{200B}ne", "stock": 1}).to_string()), true, 400, "invalid_request"),
        (Method::POST, "/v1/products".into(), Some(json!({"product_id": 1, "name": "\u{FEFF}Phone", "stock": 1}).to_string()), true, 400, "invalid_request"),
        (Method::POST, "/v1/products".into(), Some(json!({"product_id": 1, "name": "Pho\u{2060}ne", "stock": 1}).to_string()), true, 400, "invalid_request"),
        (Method::POST, "/v1/products".into(), Some(json!({"product_id": 1, "name": "Phone\u{2028}level=ERROR", "stock": 1}).to_string()), true, 400, "invalid_request"),
        (Method::POST, "/v1/products".into(), Some(json!({"product_id": 1, "name": "Phone\u{2029}", "stock": 1}).to_string()), true, 400, "invalid_request"),
        (Method::POST, "/v1/products".into(), Some(json!({"product_id": 1100, "name": "again", "stock": 1}).to_string()), true, 409, "product_exists"),
        (Method::POST, "/v1/products/1100/restock".into(), Some(json!({"request_id": "RS", "quantity": 1}).to_string()), false, 401, "unauthorized"),
        // Without credentials, what the admin endpoints accept stays unsaid.
        (Method::POST, "/v1/products/abc/restock".into(), Some(json!({"request_id": "RS", "quantity": 1}).to_string()), false, 401, "unauthorized"),
        (Method::POST, "/v1/products/1100/restock".into(), Some(json!({"quantity": 0}).to_string()), false, 401, "unauthorized"),
        (Method::POST, "/v1/products".into(), Some(json!({"product_id": 0, "name": "", "stock": -1}).to_string()), false, 401, "unauthorized"),
        (Method::POST, "/v1/products/1100/restock".into(), Some(json!({"request_id": "RS", "quantity": 0}).to_string()), true, 400, "invalid_request"),
        (Method::POST, "/v1/products/1100/restock".into(), Some(json!({"request_id": "R S", "quantity": 1}).to_string()), true, 400, "invalid_request"),
        (Method::POST, "/v1/products/1100/restock".into(), Some(json!({"quantity": 1}).to_string()), true, 400, "invalid_request"),
        (Method::POST, "/v1/products/424242/restock".into(), Some(json!({"request_id": "RS", "quantity": 1}).to_string()), true, 404, "product_not_found"),
        (Method::GET, "/v1/nothing".into(), None, false, 404, "not_found"),
        (Method::DELETE, "/v1/purchases".into(), None, false, 405, "method_not_allowed"),
    ];
    let before = snapshot(&app).await;
    for (method, path, body, admin, status, expected) in &cases {
        let (s, b) = app
            .send(method.clone(), path, body.as_deref(), *admin)
            .await
            .expect("request");
        assert_eq!(
            (s.as_u16(), code(&b)),
            (*status, *expected),
            "{method} {path} {:?}: {b}",
            body.as_deref().map(|b| &b[..b.len().min(120)])
        );
        assert!(b["message"].as_str().is_some_and(|m| !m.is_empty()), "{b}");
        assert_eq!(
            snapshot(&app).await,
            before,
            "{method} {path} changed something"
        );
    }
    // A value over its bound is told the bound, not only what is below it.
    let over = json!({"product_id": 1, "name": "x", "stock": 1, "per_user_limit": i64::MAX});
    let (s, b) = app.admin_post("/v1/products", over).await;
    assert_eq!((s.as_u16(), code(&b)), (400, "invalid_request"), "{b}");
    let told = b["message"].as_str().unwrap_or_default();
    assert!(told.contains("between 1 and 4294967295"), "{told}");
    // A wrong token is refused like a missing one.
    let resp = app
        .http
        .post(format!("{}/v1/products", app.base))
        .bearer_auth("wrong-token")
        .body(json!({"product_id": 5, "name": "x", "stock": 1}).to_string())
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(snapshot(&app).await, before);
    app.cleanup().await;
}

/// `id` with every digit percent-encoded: `%31%32` for 12.
fn percent_encoded(id: i64) -> String {
    id.to_string()
        .bytes()
        .map(|d| format!("%{d:02X}"))
        .collect()
}

/// Sends `request` as raw bytes on a fresh connection and returns the answer's status
/// code and body.
async fn raw(app: &TestApp, request: &str) -> (u16, serde_json::Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = app.base.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    conn.write_all(request.as_bytes()).await.expect("send");
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        conn.read_to_end(&mut answer),
    )
    .await;
    status_and_body(&answer)
}

/// An HTTP answer's status code and JSON body, from its raw bytes (0 and null where
/// there are none).
fn status_and_body(answer: &[u8]) -> (u16, serde_json::Value) {
    let text = String::from_utf8_lossy(answer);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b).ok())
        .unwrap_or_default();
    (status, body)
}

// Checks the body's framing and type: a body must be declared application/json (in
// any case, parameters allowed): text/plain, form encoding and a body without a type
// are 415 `unsupported_media_type`; a malformed chunked body is 400 `invalid_request`
// (only a body over the limit is 413); the admin token's scheme is case-insensitive.
// Nothing refused changes anything; the accepted ones create their orders.
#[tokio::test]
async fn bodies_must_be_json_and_well_framed() {
    let app = TestApp::selling(1200, 10, None).await;
    let before = snapshot(&app).await;
    let body = |r: &str| {
        json!({"request_id": r, "user_id": 1, "product_id": 1200, "quantity": 1}).to_string()
    };
    let post = |content_type: Option<&str>, body: String| {
        let mut req = app
            .http
            .post(format!("{}/v1/purchases", app.base))
            .body(body);
        if let Some(t) = content_type {
            req = req.header("content-type", t);
        }
        async move {
            let resp = req.send().await.expect("request");
            let status = resp.status();
            (
                status,
                resp.json::<serde_json::Value>().await.unwrap_or_default(),
            )
        }
    };
    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("application/jsonp"),
        None,
    ] {
        let (s, b) = post(content_type, body("CT_1")).await;
        assert_eq!(
            (s, code(&b)),
            (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type"),
            "{content_type:?}: {b}"
        );
    }
    let chunked = "POST /v1/purchases HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                   Transfer-Encoding: chunked\r\nConnection: close\r\n\r\nzz\r\n{}\r\n0\r\n\r\n";
    let (s, b) = raw(&app, chunked).await;
    assert_eq!((s, code(&b)), (400, "invalid_request"), "{b}");
    assert_eq!(
        snapshot(&app).await,
        before,
        "a refused body changed something"
    );

    let (s, b) = post(Some("application/json; charset=utf-8"), body("CT_2")).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let (s, b) = post(Some("Application/JSON"), body("CT_3")).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let resp = app
        .http
        .post(format!("{}/v1/products", app.base))
        .header(
            "authorization",
            format!("bearer {}", crate::helpers::ADMIN_TOKEN),
        )
        .header("content-type", "application/json")
        .body(json!({"product_id": 1201, "name": "x", "stock": 1}).to_string())
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), StatusCode::CREATED);
    app.cleanup().await;
}

/// Sends `request` as raw bytes on a fresh connection, keeps the connection open (the body
/// is left unfinished), and returns the answer's status, body and how long it took: the
/// head and its `Content-Length` bytes, read as they come.
async fn answer_to_unfinished(
    app: &TestApp,
    request: &[u8],
) -> (u16, serde_json::Value, std::time::Duration) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = app.base.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let started = std::time::Instant::now();
    conn.write_all(request).await.expect("send");
    let mut answer = Vec::new();
    let read = tokio::time::timeout(std::time::Duration::from_secs(15), async {
        let mut buf = [0u8; 4096];
        loop {
            let n = conn.read(&mut buf).await.unwrap_or(0);
            answer.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&answer);
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().to_owned())
                    })
                    .and_then(|v| v.parse::<usize>().ok())
                    .unwrap_or(0);
                if n == 0 || body.len() >= length {
                    return;
                }
            } else if n == 0 {
                return;
            }
        }
    })
    .await;
    assert!(read.is_ok(), "no answer within 15 s");
    let took = started.elapsed();
    let (status, body) = status_and_body(&answer);
    (status, body, took)
}

// Checks that a chunked body announcing more than the 16 KiB bound is refused at once with
// 413, as a `Content-Length` over it is, rather than waited out to the request deadline
// (10 s, then 408): one chunk announced past the bound with a byte of it sent, and chunks
// within the bound each that add up past it, the last one announced and not sent. The
// connections stay open; each answer must come within 2 s. A chunked body within the
// bound, stalled, still waits (it is not refused). Nothing changes in the stores.
#[tokio::test]
async fn an_oversized_chunk_is_refused_when_announced() {
    let app = TestApp::selling(1300, 10, None).await;
    let before = snapshot(&app).await;
    let head = "POST /v1/purchases HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
                Transfer-Encoding: chunked\r\n\r\n";
    let one = format!("{head}4001\r\nx");
    let summed = format!("{head}2000\r\n{}\r\n2001\r\n", "a".repeat(0x2000));
    for request in [one, summed] {
        let (status, body, took) = answer_to_unfinished(&app, request.as_bytes()).await;
        assert_eq!((status, code(&body)), (413, "payload_too_large"), "{body}");
        assert!(took < std::time::Duration::from_secs(2), "took {took:?}");
    }
    // Within the bound and stalled: no early answer (it waits for the rest or the
    // deadline).
    let within = format!("{head}10\r\nx");
    let addr = app.base.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    tokio::io::AsyncWriteExt::write_all(&mut conn, within.as_bytes())
        .await
        .expect("send");
    let mut buf = [0u8; 64];
    let early = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        tokio::io::AsyncReadExt::read(&mut conn, &mut buf),
    )
    .await;
    assert!(early.is_err(), "a body within the bound was answered early");
    assert_eq!(
        snapshot(&app).await,
        before,
        "a refused body changed something"
    );
    app.cleanup().await;
}
