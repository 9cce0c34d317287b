//! The live sale page, `GET /dashboard`: its assets and headers, its data against the
//! API's own answers and the OpenAPI document, and where it is served (with the metrics).

use std::collections::BTreeSet;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{order_id, wait_until, Routes, TestApp};

/// A product name that is markup: the page must show it as text.
const MARKUP_NAME: &str = "<b>bold</b> & <img src=x>";

/// Longest wait for the page's data to catch up with the stores: the monitor reuses a
/// read for a second, the sampler samples once a second; the rest is room for a busy
/// machine.
const CATCH_UP_MAX: Duration = Duration::from_secs(15);

/// A GET of `url`: status, the headers asked for (missing: ""), body.
async fn fetch(
    http: &reqwest::Client,
    url: &str,
    headers: &[&str],
) -> (StatusCode, Vec<String>, String) {
    let resp = http.get(url).send().await.expect("GET");
    let status = resp.status();
    let values = headers
        .iter()
        .map(|h| {
            resp.headers()
                .get(*h)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    (status, values, resp.text().await.expect("body"))
}

/// The dashboard's data, which must answer 200 JSON.
async fn data(app: &TestApp) -> Value {
    let (status, body) = app.get("/dashboard/data").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

/// Purchase answers by outcome summed over the data's samples.
fn outcomes_in(data: &Value, outcome: &str) -> u64 {
    data["samples"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["purchases"][outcome].as_u64())
        .sum()
}

/// The data's entry for `product_id`.
fn product_in(data: &Value, product_id: i64) -> Option<Value> {
    data["products"]
        .as_array()?
        .iter()
        .find(|p| p["product_id"] == product_id)
        .cloned()
}

/// Drives a small sale on `product_id` (3 units): three purchases of one unit (201), a
/// replay of the first (200), two refusals (409 sold_out), one order paid and one
/// cancelled (its unit back to available). Returns nothing: the API's answers are
/// asserted here.
pub async fn drive_small_sale(app: &TestApp, product_id: i64, tag: &str) {
    let mut orders = Vec::new();
    for i in 0..3 {
        let (status, body) = app
            .purchase(&format!("{tag}-{i}"), 100 + i, product_id, 1)
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        orders.push((order_id(&body), 100 + i));
    }
    let (status, _) = app.purchase(&format!("{tag}-0"), 100, product_id, 1).await;
    assert_eq!(status, StatusCode::OK);
    for i in 3..5 {
        let (status, body) = app
            .purchase(&format!("{tag}-{i}"), 100 + i, product_id, 1)
            .await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert_eq!(body["error"], "sold_out", "{body}");
    }
    let (paid, user) = orders[0];
    let (status, body) = app
        .post(&format!("/v1/orders/{paid}/pay"), json!({"user_id": user}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (cancelled, user) = orders[1];
    let (status, body) = app
        .post(
            &format!("/v1/orders/{cancelled}/cancel"),
            json!({"user_id": user}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

// Checks the page and its assets as a browser gets them: each with its content type, the
// strict Content-Security-Policy (default-src 'self', no inline script or style, no
// framing) and nosniff; the HTML loads only its own script and style sheet (no inline
// <script> or <style>, no style attribute, nothing from another host) and the script
// never writes HTML (no innerHTML, outerHTML, insertAdjacentHTML or document.write), so
// a product's name can only ever be text.
#[tokio::test]
async fn the_page_and_its_assets_have_their_types_and_a_strict_policy() {
    let app = TestApp::spawn().await;
    let headers = [
        "content-type",
        "content-security-policy",
        "x-content-type-options",
    ];
    let mut bodies = Vec::new();
    for (path, content_type) in [
        ("/dashboard", "text/html; charset=utf-8"),
        ("/dashboard/app.js", "text/javascript; charset=utf-8"),
        ("/dashboard/style.css", "text/css; charset=utf-8"),
    ] {
        let (status, got, body) = fetch(&app.http, &format!("{}{path}", app.base), &headers).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(got[0], content_type, "{path}");
        assert_eq!(got[1], flashsale_api::DASHBOARD_CSP, "{path}");
        assert_eq!(got[2], "nosniff", "{path}");
        bodies.push(body);
    }
    let policy = flashsale_api::DASHBOARD_CSP;
    for directive in [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(policy.contains(directive), "{policy} lacks {directive}");
    }
    assert!(!policy.contains("unsafe"), "{policy}");
    let (html, js) = (&bodies[0], &bodies[1]);
    assert!(
        html.contains(r#"<script src="dashboard/app.js" defer></script>"#),
        "{html}"
    );
    assert_eq!(html.matches("<script").count(), 1, "one script, its own");
    assert!(html.contains(r#"<link rel="stylesheet" href="dashboard/style.css">"#));
    for banned in ["<style", "style=", "http://", "https://", "//cdn"] {
        assert!(!html.contains(banned), "the page has {banned}");
    }
    for banned in [
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
    ] {
        assert!(!js.contains(banned), "the script uses {banned}");
    }
    app.cleanup().await;
}

// Checks GET /dashboard/data against the API and the OpenAPI document: after a small
// sale (3 units: three orders, a replay, two sold_out refusals, one paid, one cancelled)
// on a product named with markup, the data names the product as given, in gate mode,
// with the very inventory GET /v1/products/{id} answers (total 3, available 1, reserved 1,
// sold 1), both stores up and the outbox's backlog a number; its samples count exactly
// the purchase answers sent (3 created, 1 replayed, 2 sold_out) with a median time in a
// second that had answers; it is not cached (no-store); and its fields, and each
// product's and sample's, are exactly the properties of the document's schemas, the
// required ones all present.
#[tokio::test]
async fn the_data_matches_the_api_and_its_schema() {
    let app = TestApp::spawn().await;
    let (status, body) = app
        .admin_post(
            "/v1/products",
            json!({"product_id": 4201, "name": MARKUP_NAME, "stock": 3}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    drive_small_sale(&app, 4201, "d").await;
    let (status, product) = app.get("/v1/products/4201").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        product["inventory"],
        json!({"total": 3, "available": 1, "reserved": 1, "sold": 1})
    );

    wait_until("the data caught up", CATCH_UP_MAX, || async {
        let d = data(&app).await;
        let inventory = product_in(&d, 4201).map(|p| {
            json!({"total": p["total"], "available": p["available"], "reserved": p["reserved"], "sold": p["sold"]})
        });
        inventory.as_ref() == Some(&product["inventory"])
            && outcomes_in(&d, "created") == 3
            && outcomes_in(&d, "sold_out") == 2
    })
    .await;
    let d = data(&app).await;
    let p = product_in(&d, 4201).expect("the product");
    assert_eq!(p["name"], MARKUP_NAME);
    assert_eq!(p["stock_mode"], "gate");
    assert_eq!(outcomes_in(&d, "replayed"), 1);
    assert_eq!(d["stores"]["redis_up"], true);
    assert_eq!(d["stores"]["mariadb_up"], true);
    assert!(d["outbox_unsent"].is_u64(), "{d}");
    assert_eq!(d["history_max"], 300);
    assert_eq!(d["sample_interval_seconds"], 1.0);
    let samples = d["samples"].as_array().expect("samples");
    assert!(
        samples.iter().any(
            |s| !s["purchases"].as_object().is_some_and(|m| m.is_empty())
                && s["p50_seconds"].as_f64().is_some_and(|t| t > 0.0)
                && s["p99_seconds"].as_f64().is_some_and(|t| t > 0.0)
        ),
        "{d}"
    );
    let (_, cache, _) = fetch(
        &app.http,
        &format!("{}/dashboard/data", app.base),
        &["cache-control"],
    )
    .await;
    assert_eq!(cache[0], "no-store");

    let (status, doc) = app.get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    let schemas = &doc["components"]["schemas"];
    let keys = |v: &Value| -> BTreeSet<String> {
        v.as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    };
    for (schema, value) in [
        ("Dashboard", d.clone()),
        ("DashboardProduct", p.clone()),
        ("DashboardStores", d["stores"].clone()),
        ("DashboardDrift", d["reconcile_drift"].clone()),
        ("DashboardSample", samples[0].clone()),
    ] {
        let properties = keys(&schemas[schema]["properties"]);
        assert!(!properties.is_empty(), "no schema {schema}");
        assert_eq!(keys(&value), properties, "{schema}: {value}");
        for required in schemas[schema]["required"].as_array().into_iter().flatten() {
            let name = required.as_str().expect("a name");
            assert!(
                value.get(name).is_some(),
                "{schema}.{name} missing: {value}"
            );
        }
    }
    app.cleanup().await;
}

// Checks that the page moves with the metrics: with FLASHSALE_METRICS_LISTEN set, the
// public listener answers 404 not_found for the page, its assets and its data (as for
// /metrics), and the operator's listener serves them all (200, the data as JSON).
#[tokio::test]
async fn the_page_is_served_where_the_metrics_are() {
    let app = TestApp::spawn_with(Routes::default(), &[("METRICS_LISTEN", "127.0.0.1:1")]).await;
    let internal = app.metrics_base.clone().expect("the operator's listener");
    for path in [
        "/metrics",
        "/dashboard",
        "/dashboard/app.js",
        "/dashboard/style.css",
        "/dashboard/data",
    ] {
        let (status, body) = app.get(path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "public {path}: {body}");
        assert_eq!(body["error"], "not_found", "public {path}: {body}");
        let (status, _, _) = fetch(&app.http, &format!("{internal}{path}"), &[]).await;
        assert_eq!(status, StatusCode::OK, "internal {path}");
    }
    let (_, _, body) = fetch(&app.http, &format!("{internal}/dashboard/data"), &[]).await;
    let d: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(d["stores"]["mariadb_up"], true, "{d}");
    app.cleanup().await;
}

