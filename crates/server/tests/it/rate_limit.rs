//! Rate limits of `POST /v1/purchases` (the seeds' 对每个 IP 与每个 UID 做限流): a user,
//! or a client address, past its rate is answered 429 `rate_limited` with `Retry-After`,
//! and that attempt changes nothing — no hold in Redis, no reservation or order in
//! MariaDB, no unit taken; other users and addresses are not affected; once the wait is
//! over the same client buys, with the very request_id that was refused. Against the
//! real Redis and MariaDB, through the router served with each connection's peer.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{code, user_rate, TestApp};
use crate::invariants;

/// A purchase sent with `headers`: status, `Retry-After` (seconds) and body.
async fn purchase_with(
    app: &TestApp,
    headers: &[(&str, &str)],
    request_id: &str,
    user_id: i64,
    product_id: i64,
) -> (StatusCode, Option<u64>, Value) {
    let mut req = app
        .http
        .post(format!("{}/v1/purchases", app.base))
        .json(&json!({"request_id": request_id, "user_id": user_id,
            "product_id": product_id, "quantity": 1}));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp = req.send().await.expect("purchase");
    let status = resp.status();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    (status, retry_after, resp.json().await.expect("JSON body"))
}

/// `flashsale_http_responses_total` of the purchase endpoint with `outcome`, as scraped.
async fn purchases_answered(app: &TestApp, outcome: &str) -> f64 {
    let text = app
        .http
        .get(format!("{}/metrics", app.base))
        .send()
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text");
    let series =
        format!(r#"flashsale_http_responses_total{{endpoint="purchase",outcome="{outcome}"}} "#);
    text.lines()
        .find_map(|l| l.strip_prefix(&series)?.parse().ok())
        .unwrap_or(0.0)
}

// Checks the per-user limit (1 a second, a burst of 3): of ten concurrent purchases by
// one user, at most the burst (plus one a second the round took) are sold and the rest
// answered 429 with a Retry-After of at least a second; the refused request_ids have no
// order, no hold and took no unit; another user buys at once; after the Retry-After the
// first user buys with a refused request_id; the metrics count every refusal; and the
// invariants and the audit hold.
#[tokio::test]
async fn the_per_user_limit_refuses_the_excess_and_changes_nothing() {
    let app = TestApp::selling_with(&user_rate(("1", "3"), &[]), (5101, 100, None)).await;
    let started = Instant::now();
    let attempts: Vec<_> = (0..10)
        .map(|i| {
            let app = &app;
            async move {
                let rid = format!("RL_u7_{i}");
                let answer = purchase_with(app, &[], &rid, 7, 5101).await;
                (rid, answer)
            }
        })
        .collect();
    let answers = futures::future::join_all(attempts).await;
    let took_secs = started.elapsed().as_secs();
    let mut sold = 0;
    let mut refused = Vec::new();
    for (rid, (status, retry_after, body)) in answers {
        match status {
            StatusCode::CREATED => sold += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                assert_eq!(code(&body), "rate_limited", "{body}");
                assert!(retry_after.is_some_and(|s| s >= 1), "{retry_after:?}");
                refused.push((rid, retry_after.unwrap_or(1)));
            }
            other => panic!("{rid}: {other} {body}"),
        }
    }
    assert!(
        (3..=3 + took_secs as usize).contains(&sold),
        "sold {sold} in {took_secs} s with a burst of 3 at 1/s"
    );
    assert_eq!(sold + refused.len(), 10);
    // Nothing of the refused attempts anywhere.
    for (rid, _) in &refused {
        let (status, body) = app.get(&format!("/v1/purchases/{rid}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{rid}: {body}");
    }
    assert_eq!(invariants::redis_holds(&app, 5101).await.len(), sold);
    assert_eq!(
        app.count("SELECT COUNT(*) FROM inventory_reservation WHERE product_id = 5101")
            .await,
        sold as i64
    );
    assert_eq!(app.redis_available(5101).await, Some(100 - sold as i64));
    // Another user is not held back.
    let (status, _, body) = purchase_with(&app, &[], "RL_u8_0", 8, 5101).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // Past the wait the user buys, with a request_id that was refused.
    let (rid, wait) = refused
        .first()
        .cloned()
        .expect("some attempts were refused");
    tokio::time::sleep(Duration::from_secs(wait)).await;
    let (status, _, body) = purchase_with(&app, &[], &rid, 7, 5101).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(
        purchases_answered(&app, "rate_limited").await,
        refused.len() as f64
    );
    invariants::assert_sound_and_clean_up(app, 5101).await;
}

// Checks that the per-user limit counts only the attempts that reach the gate: once a
// product is sold out (a long sold-out lease here), a user's burst of 2 at 1 a second is
// spent on the purchase that sold the unit and the one that heard the lease, and every
// later attempt is answered by the sold-out board with 409 sold_out, not 429 — the
// answer they would have had, at no store's cost. A product not sold out still limits
// the same user at once.
#[tokio::test]
async fn refusals_of_a_sold_out_product_are_not_rate_limited() {
    let settings = user_rate(("1", "2"), &[("SOLD_OUT_LEASE", "3s")]);
    let app = TestApp::selling_with(&settings, (5103, 1, None)).await;
    app.create_product(5104, 10, None).await;
    let (status, _, body) = purchase_with(&app, &[], "RL_s_0", 9, 5103).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    for i in 1..=10 {
        let (status, _, body) = purchase_with(&app, &[], &format!("RL_s_{i}"), 9, 5103).await;
        assert_eq!(
            (status, code(&body)),
            (StatusCode::CONFLICT, "sold_out"),
            "attempt {i}: {body}"
        );
    }
    // The burst is spent: the same user's purchase of a product with stock is refused.
    let (status, _, body) = purchase_with(&app, &[], "RL_s_other", 9, 5104).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
        "{body}"
    );
    assert_eq!(app.redis_available(5104).await, Some(10));
    invariants::assert_ok(&app, 5103).await;
    invariants::assert_ok_and_clean_up(app, 5104).await;
}

// Checks the per-address limit (1 a second, a burst of 2) with the client's address read
// from X-Forwarded-For: the last entry counts (what the proxy in front appended), one
// address's third purchase is refused while another address buys; an IPv6 client is
// keyed by its /64 (a neighbour in the same network is refused); a request without the
// header, or with one that names no address, is keyed by its peer (127.0.0.1 here); a
// refused attempt takes no unit. Every purchase is by another user, so only the address
// limit can refuse.
#[tokio::test]
async fn the_per_address_limit_keys_by_the_proxy_header_or_the_peer() {
    let app = TestApp::selling_with(
        &[
            ("IP_PURCHASE_RATE", "1"),
            ("IP_PURCHASE_BURST", "2"),
            ("CLIENT_IP_HEADER", "X-Forwarded-For"),
        ],
        (5102, 100, None),
    )
    .await;
    let cases: [(&[(&str, &str)], StatusCode); 10] = [
        // The client claims 198.51.100.1; the proxy appended the real 10.0.0.1.
        (
            &[("x-forwarded-for", "198.51.100.1, 10.0.0.1")],
            StatusCode::CREATED,
        ),
        (&[("x-forwarded-for", "10.0.0.1")], StatusCode::CREATED),
        (
            &[("x-forwarded-for", "203.0.113.5, 10.0.0.1")],
            StatusCode::TOO_MANY_REQUESTS,
        ),
        // Another address, written with a port as some proxies do.
        (
            &[("x-forwarded-for", "10.0.0.2:40123")],
            StatusCode::CREATED,
        ),
        (
            &[("x-forwarded-for", "2001:db8:0:1::1")],
            StatusCode::CREATED,
        ),
        (
            &[("x-forwarded-for", "2001:db8:0:1::2")],
            StatusCode::CREATED,
        ),
        (
            &[("x-forwarded-for", "2001:db8:0:1:ffff::3")],
            StatusCode::TOO_MANY_REQUESTS,
        ),
        (&[], StatusCode::CREATED),
        (
            &[("x-forwarded-for", "not an address")],
            StatusCode::CREATED,
        ),
        (&[], StatusCode::TOO_MANY_REQUESTS),
    ];
    let started = Instant::now();
    let mut sold = 0;
    for (i, (headers, want)) in cases.iter().enumerate() {
        let user = 100 + i as i64;
        let (status, retry_after, body) =
            purchase_with(&app, headers, &format!("RL_a_{i}"), user, 5102).await;
        // Each address gets a unit back a second: the cases must all run within one.
        assert_eq!(
            status,
            *want,
            "case {i} {headers:?} after {:?}: {body}",
            started.elapsed()
        );
        match status {
            StatusCode::CREATED => sold += 1,
            _ => {
                assert_eq!(code(&body), "rate_limited", "{body}");
                assert!(retry_after.is_some_and(|s| s >= 1));
            }
        }
    }
    assert_eq!(app.redis_available(5102).await, Some(100 - sold));
    invariants::assert_ok_and_clean_up(app, 5102).await;
}

/// One user's `n` purchases of `product`, each a new request_id, sent one after the other
/// and alternating between `apps`: how many each answer (status) got.
async fn alternating(
    apps: &[&TestApp],
    tag: &str,
    product: i64,
    n: usize,
) -> std::collections::BTreeMap<u16, usize> {
    let mut answers = std::collections::BTreeMap::new();
    for i in 0..n {
        let app = apps[i % apps.len()];
        let (status, _, _) = purchase_with(app, &[], &format!("REQ_{tag}_{i}"), 77, product).await;
        *answers.entry(status.as_u16()).or_default() += 1;
    }
    answers
}

// Checks the shared per-user rate (FLASHSALE_USER_PURCHASE_RATE_SCOPE=shared) across two
// instances of one sale, against the per-instance default: with 1 a second and a burst
// of 2, twelve purchases by one user within a fraction of a second, alternating between
// the instances, get 2 orders in all when the limit is shared (the reserve script keeps
// one cell per user and product in Redis, reached by both), but 2 per instance (4) when
// each instance counts alone. The refused ones are 429 `rate_limited` with Retry-After
// and took nothing: the invariants and the audit hold.
#[tokio::test]
async fn a_shared_rate_holds_across_instances() {
    for (scope, orders) in [("shared", 2), ("instance", 4)] {
        let settings = user_rate(("1", "2"), &[("USER_PURCHASE_RATE_SCOPE", scope)]);
        let one = TestApp::spawn_with(Default::default(), &settings).await;
        let two = one.spawn_beside(&settings).await;
        one.create_product(3900, 100, None).await;
        let answers = alternating(&[&one, &two], scope, 3900, 12).await;
        assert_eq!(
            answers.get(&201).copied().unwrap_or(0),
            orders,
            "{scope}: {answers:?}"
        );
        assert_eq!(
            answers.get(&429).copied().unwrap_or(0),
            12 - orders,
            "{scope}: {answers:?}"
        );
        let (status, retry_after, body) = purchase_with(&two, &[], "REQ_last", 77, 3900).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
        assert_eq!(code(&body), "rate_limited");
        assert!(retry_after.is_some_and(|s| s >= 1), "{retry_after:?}");
        invariants::assert_sound(&one, 3900).await;
        two.cleanup().await;
        one.cleanup().await;
    }
}
