//! Monitoring: `GET /metrics` on a real service (real Redis and MariaDB), read as
//! Prometheus would, in the OpenMetrics text format.

use std::time::{Duration, Instant};

use flashsale_app::metrics::SCRAPE_REUSE;
use reqwest::StatusCode;

use crate::helpers::{wait_until, TestApp};

/// How long a scrape may take while Redis hangs: the monitor gives each store read
/// `flashsale_app::metrics::STORE_TIMEOUT` (2 s), and Redis's own client gives up after a
/// second; the rest is room for a busy machine.
const SCRAPE_WITH_A_STORE_DOWN_MAX: Duration = Duration::from_secs(4);

/// The value of the sample named exactly `series` (name and labels), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn responses(endpoint: &str, outcome: &str) -> String {
    format!(r#"flashsale_http_responses_total{{endpoint="{endpoint}",outcome="{outcome}"}}"#)
}

/// The answer-time histogram's series `part` (`count`, `sum`) of (endpoint, outcome).
fn took(part: &str, endpoint: &str, outcome: &str) -> String {
    format!(
        r#"flashsale_http_response_seconds_{part}{{endpoint="{endpoint}",outcome="{outcome}"}}"#
    )
}

/// The number of (endpoint, outcome)'s answers that took at most `le` seconds.
fn took_at_most(le: &str, endpoint: &str, outcome: &str) -> String {
    format!(
        r#"flashsale_http_response_seconds_bucket{{le="{le}",endpoint="{endpoint}",outcome="{outcome}"}}"#
    )
}

// Checks that every answer is counted by endpoint and outcome, and that the stores'
// gauges are read at the scrape: after a product of 2 units, two purchases (201), a
// replay of the first (200), a refusal (409 sold_out), a bad body (400), an unknown path
// (404) and a method not allowed (405), the counters say exactly that; Redis and
// MariaDB are up; the product's stock reads total 2, available 0 (from Redis), reserved
// 2 and sold 0 (from MariaDB), and it is served by the gate (ledger mode 0); the two
// order_created events wait in the outbox (no relay runs here); every answer is timed
// too (as many observations as answers); and the answer is OpenMetrics text ending in
// "# EOF". A scrape within a second of the last answers its text again; a later one
// reads and counts anew, and shows the product in ledger mode (1) once the ledger
// switched it.
#[tokio::test]
async fn metrics_count_every_answer_and_read_the_stores() {
    let app = TestApp::selling(4101, 2, None).await;
    for (request_id, want) in [
        ("m-1", StatusCode::CREATED),
        ("m-2", StatusCode::CREATED),
        ("m-1", StatusCode::OK),
        ("m-3", StatusCode::CONFLICT),
    ] {
        let (status, body) = app.purchase(request_id, 7, 4101, 1).await;
        assert_eq!(status, want, "{request_id}: {body}");
    }
    let (status, _) = app
        .send(
            reqwest::Method::POST,
            "/v1/purchases",
            Some("{not json"),
            false,
        )
        .await
        .expect("request");
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = app.get("/v1/nowhere").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = app
        .send(reqwest::Method::DELETE, "/v1/purchases", None, false)
        .await
        .expect("request");
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);

    let (text, content_type) = app.scrape_metrics().await;
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    assert!(text.ends_with("# EOF\n"), "{text}");
    for (series, want) in [
        (responses("create_product", "created"), 1.0),
        (responses("purchase", "created"), 2.0),
        (responses("purchase", "replayed"), 1.0),
        (responses("purchase", "sold_out"), 1.0),
        (responses("purchase", "invalid_request"), 1.0),
        (responses("other", "not_found"), 1.0),
        (responses("other", "method_not_allowed"), 1.0),
        (r#"flashsale_store_up{store="redis"}"#.to_owned(), 1.0),
        (r#"flashsale_store_up{store="mariadb"}"#.to_owned(), 1.0),
        (
            r#"flashsale_product_stock{product_id="4101",state="total"}"#.to_owned(),
            2.0,
        ),
        (
            r#"flashsale_product_stock{product_id="4101",state="available"}"#.to_owned(),
            0.0,
        ),
        (
            r#"flashsale_product_stock{product_id="4101",state="reserved"}"#.to_owned(),
            2.0,
        ),
        (
            r#"flashsale_product_stock{product_id="4101",state="sold"}"#.to_owned(),
            0.0,
        ),
        ("flashsale_outbox_unsent".to_owned(), 2.0),
        (
            r#"flashsale_product_ledger_mode{product_id="4101"}"#.to_owned(),
            0.0,
        ),
    ] {
        assert_eq!(sample(&text, &series), Some(want), "{series}:\n{text}");
    }
    // Every answer counted is also timed: as many observations as answers, every one
    // within the last finite bucket (2.5 s; nothing here waits), a positive total time.
    for (endpoint, outcome, n) in [
        ("create_product", "created", 1.0),
        ("purchase", "created", 2.0),
        ("purchase", "replayed", 1.0),
        ("purchase", "sold_out", 1.0),
        ("purchase", "invalid_request", 1.0),
        ("other", "not_found", 1.0),
        ("other", "method_not_allowed", 1.0),
    ] {
        let series = took("count", endpoint, outcome);
        assert_eq!(sample(&text, &series), Some(n), "{series}:\n{text}");
        let series = took_at_most("2.5", endpoint, outcome);
        assert_eq!(sample(&text, &series), Some(n), "{series}:\n{text}");
        let series = took("sum", endpoint, outcome);
        assert!(
            sample(&text, &series).is_some_and(|t| t > 0.0),
            "{series}:\n{text}"
        );
    }
    // Within SCRAPE_REUSE the same text is answered again (the stores are not read
    // again): a refusal since is not in it yet; a second later a new scrape counts it,
    // and the two scrapes before.
    let (status, _) = app.purchase("m-4", 7, 4101, 1).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (again, _) = app.scrape_metrics().await;
    assert_eq!(again, text);
    let ledger = app.connect_ledger().await;
    flashsale_app::ports::LedgerMaintenance::enter_ledger_mode(
        &ledger,
        flashsale_core::ProductId::parse(4101).expect("id"),
    )
    .await
    .expect("ledger mode");
    tokio::time::sleep(SCRAPE_REUSE + Duration::from_millis(100)).await;
    let (fresh, _) = app.scrape_metrics().await;
    assert_eq!(
        sample(&fresh, &responses("purchase", "sold_out")),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &fresh,
            r#"flashsale_product_ledger_mode{product_id="4101"}"#
        ),
        Some(1.0)
    );
    assert_eq!(sample(&fresh, &responses("metrics", "ok")), Some(2.0));
    app.cleanup().await;
}

// Checks the background workers' counters, by running them as `serve` does (every
// 50 ms) against a real service: within a few seconds each of the four workers
// (expiry, recovery, gate watch, reconciliation) has passes counted as ok; an order left
// unpaid past its 1 s payment timeout is counted expired; a product whose Redis stock
// entry is deleted is counted rebuilt by the gate watch; and the reconciliation gauges
// read no drift once the product is consistent again.
#[tokio::test]
async fn metrics_count_the_workers_passes() {
    let app = TestApp::selling_with(&[("PAYMENT_TIMEOUT", "1s")], (4102, 5, None)).await;
    app.bought("w-1", 7, 4102, 1).await;
    let workers = app.spawn_workers(&[
        ("EXPIRY_INTERVAL", "50ms"),
        ("RECOVERY_INTERVAL", "50ms"),
        ("GATE_WATCH_INTERVAL", "50ms"),
        ("RECONCILE_INTERVAL", "50ms"),
    ]);
    wait_until(
        "every worker counted, the order expired",
        Duration::from_secs(20),
        || async {
            let (text, _) = app.scrape_metrics().await;
            let passes = ["expiry", "recovery", "gate-watch", "reconcile", "fallback"]
                .iter()
                .all(|w| {
                    let series =
                        format!(r#"flashsale_worker_passes_total{{worker="{w}",result="ok"}}"#);
                    sample(&text, &series).unwrap_or(0.0) >= 2.0
                });
            passes && sample(&text, "flashsale_orders_expired_total") == Some(1.0)
        },
    )
    .await;
    app.delete_keys(4102, &["inv"], "DEL the stock entry").await;
    wait_until(
        "the gate rebuilt and counted",
        Duration::from_secs(20),
        || async {
            let (text, _) = app.scrape_metrics().await;
            sample(&text, "flashsale_gate_rebuilds_total") == Some(1.0)
                && sample(
                    &text,
                    r#"flashsale_product_stock{product_id="4102",state="available"}"#,
                ) == Some(5.0)
        },
    )
    .await;
    // Past the last reconciliation against the rebuilt entry.
    tokio::time::sleep(Duration::from_millis(300)).await;
    workers.stop().await;
    tokio::time::sleep(SCRAPE_REUSE + Duration::from_millis(100)).await;
    let (text, _) = app.scrape_metrics().await;
    assert_eq!(
        sample(&text, "flashsale_reconcile_drift_products"),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "flashsale_reconcile_drift_units"),
        Some(0.0),
        "{text}"
    );
    app.cleanup().await;
}

// Checks a scrape while Redis hangs (its proxy passes nothing): it still answers, within
// the monitor's bounds, with Redis down and MariaDB up, and no stale "available" figure
// for the product (MariaDB's figures still there); once Redis is back, it reads up again.
#[tokio::test]
async fn metrics_show_a_hanging_redis_as_down() {
    let (proxy, app) = TestApp::spawn_via_redis_proxy(&[]).await;
    app.create_product(4103, 3, None).await;
    let (text, _) = app.scrape_metrics().await;
    let available = r#"flashsale_product_stock{product_id="4103",state="available"}"#;
    assert_eq!(sample(&text, available), Some(3.0), "{text}");

    proxy.blackhole();
    // Past the reuse of the last scrape's text: this one reads the stores.
    tokio::time::sleep(SCRAPE_REUSE + Duration::from_millis(100)).await;
    let started = Instant::now();
    let (text, _) = app.scrape_metrics().await;
    let took = started.elapsed();
    assert!(took < SCRAPE_WITH_A_STORE_DOWN_MAX, "scrape took {took:?}");
    assert_eq!(
        sample(&text, r#"flashsale_store_up{store="redis"}"#),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, r#"flashsale_store_up{store="mariadb"}"#),
        Some(1.0),
        "{text}"
    );
    assert_eq!(sample(&text, available), None, "{text}");
    let total = r#"flashsale_product_stock{product_id="4103",state="total"}"#;
    assert_eq!(sample(&text, total), Some(3.0), "{text}");

    proxy.restore();
    wait_until("Redis up again", Duration::from_secs(10), || async {
        let (text, _) = app.scrape_metrics().await;
        sample(&text, r#"flashsale_store_up{store="redis"}"#) == Some(1.0)
    })
    .await;
    app.cleanup().await;
}

// Checks that the in-flight limit bounds the whole server, not each route, and that the
// requests it sheds are counted under their own endpoint: with FLASHSALE_IN_FLIGHT_MAX=2
// and Redis hanging (its proxy passes nothing, so a purchase waits about a second for
// Redis's timeout), two purchases in flight make a GET /v1/orders/{id} — another route,
// which would otherwise answer 404 at once from MariaDB — answer 503 unavailable; once
// they are done the same GET answers 404; the metrics count the shed GET as
// get_order/unavailable, timed under half a second (shed at once, not queued), and time
// each of the two purchases at over half a second.
#[tokio::test]
async fn the_in_flight_limit_is_global_and_shed_requests_are_counted() {
    let (proxy, app) = TestApp::spawn_via_redis_proxy(&[("IN_FLIGHT_MAX", "2")]).await;
    app.create_product(4104, 3, None).await;
    proxy.blackhole();
    let base = app.base.clone();
    let http = app.http.clone();
    let hanging: Vec<_> = (0..2)
        .map(|i| {
            let (base, http) = (base.clone(), http.clone());
            tokio::spawn(async move {
                http.post(format!("{base}/v1/purchases"))
                    .header("content-type", "application/json")
                    .body(format!(
                        r#"{{"request_id":"hang-{i}","user_id":{},"product_id":4104,"quantity":1}}"#,
                        i + 1
                    ))
                    .send()
                    .await
                    .map(|r| r.status())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, body) = app.get("/v1/orders/987654").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"], "unavailable", "{body}");
    for h in hanging {
        let answered = h.await.expect("task").expect("answer");
        assert_eq!(answered, StatusCode::SERVICE_UNAVAILABLE);
    }
    let (status, _) = app.get("/v1/orders/987654").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    proxy.restore();
    let (text, _) = app.scrape_metrics().await;
    assert_eq!(
        sample(&text, &responses("get_order", "unavailable")),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, &responses("get_order", "order_not_found")),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, &responses("purchase", "unavailable")),
        Some(2.0),
        "{text}"
    );
    // The two purchases waited for Redis's one-second timeout, and their answer times
    // say so; the shed GET was answered at once.
    for (le, n) in [("0.5", 0.0), ("2.5", 2.0)] {
        let series = took_at_most(le, "purchase", "unavailable");
        assert_eq!(sample(&text, &series), Some(n), "{series}:\n{text}");
    }
    let series = took_at_most("0.5", "get_order", "unavailable");
    assert_eq!(sample(&text, &series), Some(1.0), "{series}:\n{text}");
    app.cleanup().await;
}
