//! After the sale (`FLASHSALE_SALE_RETIRE_AFTER`, app/src/after_sale.rs): an ended,
//! settled sale's Redis state is retired, the ledger keeps answering for it, and a
//! restock or a window moved into the future loads it again; and Redis's memory comes
//! back after a hundred small sales.

use std::time::Duration;

use chrono::{Duration as Days, Utc};
use flashsale_testkit::PrivateRedis;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{order_id, TestApp, LIMIT_EXCEEDED};
use crate::invariants;

/// The grace the tests run with: short, so a sale ended now is retirable a moment later.
const GRACE: (&str, &str) = ("SALE_RETIRE_AFTER", "1s");
/// How long after a sale's end the tests retire it: the grace and a margin for the two
/// clocks (the test's and the database's, on one host).
const PAST_GRACE: Duration = Duration::from_millis(1500);
/// Sales one pass may retire in these tests: more than either test has.
const PASS_LIMIT: usize = 200;

/// Units of each test sale, and its buyers (one unit each, each paying).
const STOCK: i64 = 3;
const BUYERS: i64 = 2;

/// A small sale of `product`: created with [`STOCK`] units, bought by [`BUYERS`] users
/// one unit each (request `R<product>_<user>`), each order paid unless `unpaid`. The
/// orders' ids, by buyer.
async fn small_sale(app: &TestApp, product: i64, unpaid: bool) -> Vec<i64> {
    app.create_product(product, STOCK, None).await;
    let mut orders = Vec::new();
    for user in 1..=BUYERS {
        let body = app
            .bought(&format!("R{product}_{user}"), user, product, 1)
            .await;
        let order = order_id(&body);
        if !unpaid {
            let (s, b) = app.pay(order, user).await;
            assert_eq!(s, StatusCode::OK, "{b}");
        }
        orders.push(order);
    }
    orders
}

/// The admin's PATCH of `product`'s sale end to `ends_at`, which must answer 200.
async fn sale_ends(app: &TestApp, product: i64, ends_at: chrono::DateTime<Utc>, op: &str) {
    let body = json!({"request_id": format!("OP_{op}_{product}"), "sale_ends_at": ends_at});
    let (s, b) = app
        .send(
            reqwest::Method::PATCH,
            &format!("/v1/products/{product}"),
            Some(&body.to_string()),
            true,
        )
        .await
        .expect("request");
    assert_eq!(s, StatusCode::OK, "{b}");
}

/// Every Redis key of `product` under the test's prefix.
async fn keys_of(app: &TestApp, product: i64) -> Vec<String> {
    let mut conn = app.redis.clone();
    redis::cmd("KEYS")
        .arg(format!("{}*", app.key(product, "")))
        .query_async(&mut conn)
        .await
        .expect("KEYS")
}

/// Runs the instance's retirement passes until one finds nothing more to retire.
async fn retire_all(app: &TestApp) {
    let retirement = app.retirement.as_ref().expect("retirement on");
    while retirement.retire_pass(PASS_LIMIT).await.expect("pass") > 0 {}
}

/// `GET /v1/products/{product}`'s counters: total, available, reserved, sold.
async fn counters(app: &TestApp, product: i64) -> (i64, i64, i64, i64) {
    let (s, b): (StatusCode, Value) = app.get(&format!("/v1/products/{product}")).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let n = |k: &str| {
        b["inventory"][k]
            .as_i64()
            .unwrap_or_else(|| panic!("{k} in {b}"))
    };
    (n("total"), n("available"), n("reserved"), n("sold"))
}

// Checks that a retirement whose gate step did not happen (a crash or a Redis failure
// between the two steps) is finished by a later pass. How: a paid sale ends; the ledger's
// step alone is run (`SaleRetirements::retire_sale`, as a pass that died after it): the
// product is marked not loaded and owes its gate step (`gate_sweep_generation`), and its
// Redis keys are still there. The next pass finds nothing new to retire but the owed
// step: the keys go, nothing is owed any more, the metric counts it, the audit is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_owed_gate_step_is_done_by_a_later_pass() {
    use flashsale_app::after_sale::SaleRetirements;
    const PRODUCT: i64 = 9111;
    let app = TestApp::spawn_with(Default::default(), &[GRACE]).await;
    small_sale(&app, PRODUCT, false).await;
    sale_ends(&app, PRODUCT, Utc::now(), "end").await;
    tokio::time::sleep(PAST_GRACE).await;
    let ledger = app.connect_ledger().await;
    let product = flashsale_core::ProductId::parse(PRODUCT).expect("id");
    let retired = ledger
        .retire_sale(product, Duration::from_secs(1))
        .await
        .expect("ledger step")
        .expect("retirable");
    let owed = format!(
        "SELECT COUNT(*) FROM products WHERE product_id = {PRODUCT} \
         AND gate_sweep_generation = {}",
        retired.get()
    );
    assert_eq!(app.count(&owed).await, 1, "the gate step is owed");
    assert!(!keys_of(&app, PRODUCT).await.is_empty(), "the keys wait");
    retire_all(&app).await;
    assert_eq!(keys_of(&app, PRODUCT).await, Vec::<String>::new());
    let still = format!(
        "SELECT COUNT(*) FROM products WHERE product_id = {PRODUCT} \
         AND gate_sweep_generation IS NOT NULL"
    );
    assert_eq!(app.count(&still).await, 0, "nothing owed any more");
    let (text, _) = app.scrape_metrics().await;
    assert!(
        text.lines().any(|l| l == "flashsale_sales_retired_total 1"),
        "{text}"
    );
    invariants::assert_audit_clean(&app, PRODUCT).await;
    app.cleanup().await;
}

// Checks which sales are retired and what a retired one still answers. How: small sales
// on the shared Redis: 9101 and 9104 paid and ended, 9102 ended with its orders unpaid,
// 9103 paid with its window open, 9105 (1 per user) paid by user 1 and ended. Past the
// 1 s grace the passes retire 9101, 9104 and 9105 only: their keys are gone (KEYS), the
// others' entries stay; GET still answers the ledger's counters, the audit is clean and
// `flashsale_sales_retired_total` is 3. A refund (units back on sale) of a 9101 order
// while retired leaves recovery nothing to defer. Then 9101's window moved into the
// future sells again (201: the entry loaded again, the refunded unit with it) and an old
// request replays its order (200); 9104's
// restock loads it with the units left plus the restock's; 9105 reopened still refuses
// user 1 over the limit and sells to user 2; the invariants hold on all three.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ended_sales_are_retired_and_load_again() {
    let app = TestApp::spawn_with(Default::default(), &[GRACE]).await;
    let paid = small_sale(&app, 9101, false).await;
    small_sale(&app, 9102, true).await;
    small_sale(&app, 9103, false).await;
    small_sale(&app, 9104, false).await;
    app.create_product(9105, STOCK, Some(1)).await;
    let order = order_id(&app.bought("R9105_1", 1, 9105, 1).await);
    let (s, b) = app.pay(order, 1).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    for product in [9101, 9102, 9104, 9105] {
        sale_ends(&app, product, Utc::now(), "end").await;
    }
    tokio::time::sleep(PAST_GRACE).await;
    retire_all(&app).await;

    for (product, sold) in [(9101, BUYERS), (9104, BUYERS), (9105, 1)] {
        assert_eq!(keys_of(&app, product).await, Vec::<String>::new());
        assert_eq!(
            counters(&app, product).await,
            (STOCK, STOCK - sold, 0, sold)
        );
        invariants::assert_audit_clean(&app, product).await;
    }
    for product in [9102, 9103] {
        assert!(
            app.redis_available(product).await.is_some(),
            "{product} kept"
        );
    }
    let (text, _) = app.scrape_metrics().await;
    assert!(
        text.lines().any(|l| l == "flashsale_sales_retired_total 3"),
        "{text}"
    );

    let body = json!({"request_id": "RF_9101", "restock": true});
    let (s, b) = app
        .admin_post(&format!("/v1/orders/{}/refund", paid[1]), body)
        .await;
    assert_eq!(
        (s, &b["status"]),
        (StatusCode::OK, &json!("REFUNDED")),
        "{b}"
    );
    let recovery = app.maintenance.recover_once().await.expect("recovery");
    assert_eq!(recovery.deferred, 0, "nothing to give back while retired");
    assert_eq!(counters(&app, 9101).await, (STOCK, 2, 0, BUYERS - 1));

    sale_ends(&app, 9101, Utc::now() + Days::days(1), "reopen").await;
    app.bought("R9101_again", 3, 9101, 1).await;
    let (s, replay) = app.purchase("R9101_1", 1, 9101, 1).await;
    assert_eq!(
        (s, order_id(&replay)),
        (StatusCode::OK, paid[0]),
        "{replay}"
    );
    invariants::assert_sound(&app, 9101).await;

    app.restocked(9104, "RS_9104", 5).await;
    assert_eq!(app.redis_available(9104).await, Some(6));
    invariants::assert_sound(&app, 9104).await;

    sale_ends(&app, 9105, Utc::now() + Days::days(1), "reopen").await;
    app.refused(("R9105_2", 1, 9105, 1), LIMIT_EXCEEDED).await;
    app.bought("R9105_3", 2, 9105, 1).await;
    invariants::assert_sound_and_clean_up(app, 9105).await;
}

/// Small sales the memory test runs.
const SALES: i64 = 100;
/// How far above its start Redis's `used_memory` may end after the sales were retired:
/// a few KB, for the allocator's and the main dictionary's own rounding; a sale left
/// behind would be about 1.5 KB (its entry, per-user counts, index and two records).
const MEMORY_LEFT_MAX: i64 = 4 * 1024;
/// How long the memory test waits for Redis to shrink its main dictionary after the
/// deletes (its cron resizes it, ten times a second by default).
const SHRINK_WITHIN: Duration = Duration::from_secs(5);

/// `INFO memory`'s `used_memory` of the Redis at `url`.
async fn used_memory(url: &str) -> i64 {
    let mut conn = crate::helpers::redis_conn(url).await;
    let info = crate::helpers::redis_info(&mut conn, &["memory"]).await;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no used_memory in {info}"))
}

// Checks that retiring ended sales gives Redis's memory back. How: on a private Redis
// (no other test's keys), one sale run and retired first (scripts loaded, connections
// open), then `used_memory` read; a hundred small sales (3 units, 2 buyers paying each),
// each ended by a PATCH, retired past the grace; `used_memory` read again, waiting for
// Redis's cron to shrink its dictionary: it must be within MEMORY_LEFT_MAX of the start.
// Both numbers are printed (`--nocapture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_comes_back_after_a_hundred_sales() {
    let redis = PrivateRedis::start().await.expect("private redis");
    let app = TestApp::spawn_on_redis(redis.url(), &[GRACE]).await;
    small_sale(&app, 9200, false).await;
    sale_ends(&app, 9200, Utc::now(), "end").await;
    tokio::time::sleep(PAST_GRACE).await;
    retire_all(&app).await;
    let before = used_memory(&redis.url()).await;

    for product in 9201..=9200 + SALES {
        small_sale(&app, product, false).await;
        sale_ends(&app, product, Utc::now(), "end").await;
    }
    let during = used_memory(&redis.url()).await;
    tokio::time::sleep(PAST_GRACE).await;
    retire_all(&app).await;
    let mut after = used_memory(&redis.url()).await;
    let waited = std::time::Instant::now();
    while after - before > MEMORY_LEFT_MAX && waited.elapsed() < SHRINK_WITHIN {
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = used_memory(&redis.url()).await;
    }
    println!(
        "redis used_memory: {before} B before, {during} B with {SALES} ended sales, \
         {after} B after retiring them ({:+} B)",
        after - before
    );
    assert!(
        after - before <= MEMORY_LEFT_MAX,
        "{after} B after, {before} B before"
    );
    for product in 9200..=9200 + SALES {
        assert_eq!(keys_of(&app, product).await, Vec::<String>::new());
    }
    app.cleanup().await;
}
