//! Ledger mode (数据库兜底): while Redis is down the sale goes on from MariaDB, and when
//! Redis is back the products return to it. Each test runs the instance's own workers
//! (the fallback worker among them) with short settings, breaks Redis as a real outage
//! would (a private redis-server killed, or a proxy cut), and ends with the invariant
//! checks and the audit.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use flashsale::workers::Workers;
use flashsale_testkit::{PrivateRedis, TcpProxy};
use futures::{stream, StreamExt};
use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{
    cleanup_all, code, order_id, redis_addr, user_rate, wait_until, Routes, TestApp, SOLD_OUT,
};
use crate::invariants;

/// `FLASHSALE_FALLBACK_AFTER` in these tests.
const FALLBACK_AFTER: Duration = Duration::from_secs(1);
/// `FLASHSALE_FALLBACK_RECOVER_AFTER` in these tests.
const RECOVER_AFTER: Duration = Duration::from_secs(4);
/// The bound stated for the time from Redis's death to the first 201 beyond
/// `FALLBACK_AFTER`: a probe in flight when Redis died (its response timeout, 1 s), the
/// probe period (0.25 s), the switch's transaction, the ledger's wait before it sells
/// (`LEDGER_SALES_AFTER_SWITCH`, 1.5 s), a buyer's retry pause (0.1 s), and a second of
/// slack for a loaded CI machine.
const SWITCH_BOUND: Duration = Duration::from_millis(4000);
/// How long the way back may take beyond `RECOVER_AFTER`: the probe period, the leave
/// transaction and the rebuild, with the same slack.
const BACK_BOUND: Duration = Duration::from_secs(5);

fn settings() -> Vec<(&'static str, &'static str)> {
    vec![
        ("FALLBACK_AFTER", "1s"),
        ("FALLBACK_RECOVER_AFTER", "4s"),
        // Redis's clock ages holds; recovery must not fence a hold a retry is finishing.
        ("RECOVERY_AFTER", "15s"),
    ]
}

/// The instance's workers, with short periods: the fallback worker probes every 250 ms
/// whatever is set here.
pub(crate) fn start_workers(app: &TestApp) -> Workers {
    app.spawn_workers(&[
        ("EXPIRY_INTERVAL", "200ms"),
        ("RECOVERY_INTERVAL", "500ms"),
        ("GATE_WATCH_INTERVAL", "200ms"),
        ("RECONCILE_INTERVAL", "60s"),
    ])
}

async fn mode(app: &TestApp, product_id: i64) -> String {
    let (status, body) = app.get(&format!("/v1/products/{product_id}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["stock_mode"].as_str().unwrap_or("none").to_owned()
}

/// Puts the product in ledger mode as an operator's tooling or another instance would:
/// through a ledger of its own on the test's database.
async fn switch_elsewhere(app: &TestApp, product_id: i64) {
    let env = [(
        "FLASHSALE_DATABASE_URL".to_owned(),
        app.db.as_ref().expect("test database").url(),
    )]
    .into_iter()
    .collect();
    let ledger =
        flashsale::connect_ledger(&flashsale::Config::from_parts(None, &env).expect("config"))
            .await
            .expect("ledger");
    let product = flashsale_core::ProductId::parse(product_id).expect("id");
    flashsale_app::ports::LedgerMaintenance::enter_ledger_mode(&ledger, product)
        .await
        .expect("ledger mode");
}

/// The mode as the ledger stores it, read directly.
async fn stored_mode(app: &TestApp, product_id: i64) -> String {
    sqlx::query_scalar(
        "SELECT CAST(stock_mode AS CHAR) FROM product_inventory WHERE product_id = ?",
    )
    .bind(product_id)
    .fetch_one(&app.pool)
    .await
    .expect("mode")
}

/// One buyer's final answer, when it came, and how many 503s or failed connections the
/// buyer retried through on the way.
pub(crate) struct Answer {
    pub request_id: String,
    pub status: StatusCode,
    pub body: Value,
    pub at: Instant,
    pub retries: u32,
}

impl Answer {
    /// The buyer's number, which its request_id ends with (`…_<i>`).
    fn buyer(&self) -> Option<i64> {
        self.request_id.rsplit('_').next()?.parse().ok()
    }
}

/// Buyers `from..to` each buy one unit of `product`, retrying every 503 with the same
/// request_id (spread over `spread`, the `i`-th buyer on `apps[i % apps.len()]`).
pub(crate) async fn buyers(
    apps: &[&TestApp],
    product: i64,
    from: i64,
    to: i64,
    spread: Duration,
) -> Vec<Answer> {
    let span = u64::try_from(to - from).expect("count").max(1);
    stream::iter(from..to)
        .map(|i| async move {
            let offset = u64::try_from(i - from).expect("offset");
            tokio::time::sleep(
                spread * u32::try_from(offset).expect("fits") / u32::try_from(span).expect("fits"),
            )
            .await;
            let app = apps[usize::try_from(i).expect("index") % apps.len()];
            let request_id = format!("REQ_fb_{product}_{i}");
            let (status, body, retries) = app
                .purchase_until_known(&request_id, i + 1, product, 1)
                .await;
            Answer {
                request_id,
                status,
                body,
                at: Instant::now(),
                retries,
            }
        })
        .buffer_unordered(256)
        .collect()
        .await
}

/// Request_id → order id of every acknowledged purchase; panics on any answer but an
/// order or `sold_out`.
pub(crate) fn acknowledged(answers: &[Answer]) -> BTreeMap<String, i64> {
    let mut orders = BTreeMap::new();
    for a in answers {
        match a.status {
            StatusCode::CREATED | StatusCode::OK => {
                orders.insert(a.request_id.clone(), order_id(&a.body));
            }
            StatusCode::CONFLICT if code(&a.body) == "sold_out" => {}
            other => panic!(
                "{}: unexpected final answer {other} {}",
                a.request_id, a.body
            ),
        }
    }
    orders
}

/// Every acknowledged order is in the ledger under its request_id, and exactly `stock`
/// units sold (in orders not cancelled).
pub(crate) async fn assert_sold_exactly(
    app: &TestApp,
    product: i64,
    stock: i64,
    orders: &BTreeMap<String, i64>,
) {
    let cancelled = app
        .count(&format!(
            "SELECT COUNT(*) FROM orders WHERE status = 'CANCELLED' AND product_id = {product}"
        ))
        .await;
    assert_eq!(
        orders.len() as i64,
        stock + cancelled,
        "demand exceeds the stock: all of it sells"
    );
    for (request_id, id) in orders {
        app.assert_order_kept(*id, request_id).await;
    }
    let sold: i64 = sqlx::query_scalar(
        "SELECT CAST(COALESCE(SUM(quantity), 0) AS SIGNED) FROM orders \
         WHERE product_id = ? AND status <> 'CANCELLED'",
    )
    .bind(product)
    .fetch_one(&app.pool)
    .await
    .expect("sum");
    assert_eq!(sold, stock);
}

/// Waits (bounded: RECOVER_AFTER and BACK_BOUND) until the product is in gate mode in
/// the ledger and Redis has its entry again (rebuilt).
async fn back_in_gate_mode(app: &TestApp, product: i64) {
    wait_until(
        "the product back in gate mode",
        RECOVER_AFTER + BACK_BOUND,
        || async {
            stored_mode(app, product).await == "GATE"
                && app.redis_available(product).await.is_some()
        },
    )
    .await;
}

/// The modes the ledger stored for the product, each change once, read every 100 ms for
/// `watched`.
async fn modes_seen(app: &TestApp, product: i64, watched: Duration) -> Vec<String> {
    let mut seen = Vec::new();
    let started = Instant::now();
    while started.elapsed() < watched {
        let now = stored_mode(app, product).await;
        if seen.last() != Some(&now) {
            seen.push(now);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    seen
}

/// The end of every test: the buyers' answers are orders or `sold_out`, exactly the
/// stock sold ([`assert_sold_exactly`]), and once the workers stopped, the invariant
/// checks and the audit pass; then the app is cleaned up.
async fn sold_exactly_and_audited(
    app: TestApp,
    workers: Workers,
    product: i64,
    stock: i64,
    answers: &[Answer],
) {
    let orders = acknowledged(answers);
    assert_sold_exactly(&app, product, stock, &orders).await;
    workers.stop().await;
    invariants::assert_sound_and_clean_up(app, product).await;
}

/// A private redis-server, a service on it with [`settings`], and the service's workers
/// running ([`start_workers`]).
async fn on_a_private_redis() -> (PrivateRedis, TestApp, Workers) {
    on_a_private_redis_with(&settings()).await
}

/// [`on_a_private_redis`] with the instance's `settings`.
pub(crate) async fn on_a_private_redis_with(
    settings: &[(&str, &str)],
) -> (PrivateRedis, TestApp, Workers) {
    let redis = PrivateRedis::start().await.expect("private redis");
    let app = TestApp::spawn_on_redis(redis.url(), settings).await;
    let workers = start_workers(&app);
    (redis, app, workers)
}

/// A counter of `/metrics`, 0 when absent.
pub(crate) async fn metric(app: &TestApp, series: &str) -> f64 {
    let (text, _) = app.scrape_metrics().await;
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

// Checks a private redis-server killed with SIGKILL mid-sale: purchases answer 201 again
// within FALLBACK_AFTER plus SWITCH_BOUND, from the ledger (the product in ledger mode in
// the API and the metrics); once Redis is back (restarted empty) the product returns to
// the gate after RECOVER_AFTER, Redis is rebuilt from the ledger's facts and the sale goes
// on through it; requests acknowledged in ledger mode replay with their order; exactly
// the stock sells, every 201 is an order, and the invariants and the audit hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_mid_sale_sells_from_the_ledger_and_comes_back() {
    const PRODUCT: i64 = 5101;
    const STOCK: i64 = 120;
    let (mut redis, mut app, workers) = on_a_private_redis().await;
    app.create_product(PRODUCT, STOCK, None).await;
    let before = buyers(&[&app], PRODUCT, 0, 40, Duration::from_millis(300)).await;
    assert!(before.iter().all(|a| a.status == StatusCode::CREATED));
    assert_eq!(mode(&app, PRODUCT).await, "gate");

    redis.kill9().expect("kill redis");
    let killed = Instant::now();
    let during = buyers(&[&app], PRODUCT, 40, 100, Duration::from_millis(500)).await;
    let first = during
        .iter()
        .filter(|a| a.status == StatusCode::CREATED)
        .map(|a| a.at)
        .min()
        .expect("sales went on while Redis was down");
    let took = first - killed;
    println!("Redis killed → first 201 from the ledger: {took:?}");
    assert!(
        took < FALLBACK_AFTER + SWITCH_BOUND,
        "first 201 {took:?} after Redis died (bound {:?})",
        FALLBACK_AFTER + SWITCH_BOUND
    );
    assert!(during.iter().all(|a| a.status == StatusCode::CREATED));
    assert_eq!(mode(&app, PRODUCT).await, "ledger");
    assert_eq!(stored_mode(&app, PRODUCT).await, "LEDGER");
    assert_eq!(
        metric(&app, r#"flashsale_mode_switches_total{to="ledger"}"#).await,
        1.0
    );
    assert_eq!(
        metric(
            &app,
            &format!(r#"flashsale_product_ledger_mode{{product_id="{PRODUCT}"}}"#)
        )
        .await,
        1.0
    );
    // The audit works without Redis in ledger mode.
    invariants::assert_audit_clean(&app, PRODUCT).await;

    redis.restart().await.expect("restart redis");
    app.reconnect_checks(&redis.url()).await;
    let back = Instant::now();
    back_in_gate_mode(&app, PRODUCT).await;
    println!(
        "Redis back → product in gate mode, Redis rebuilt: {:?}",
        back.elapsed()
    );
    assert_eq!(app.redis_available(PRODUCT).await, Some(STOCK - 100));
    assert_eq!(
        metric(&app, r#"flashsale_mode_switches_total{to="gate"}"#).await,
        1.0
    );
    for a in during.iter().take(5) {
        let i = a.buyer().expect("i");
        let (status, body) = app.purchase(&a.request_id, i + 10_000, PRODUCT, 1).await;
        assert_eq!(
            code(&body),
            "request_id_conflict",
            "{status}: another payload"
        );
        let (status, body) = app.purchase(&a.request_id, i + 1, PRODUCT, 1).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(
            order_id(&body),
            order_id(&a.body),
            "replayed with its order"
        );
    }
    // An order taken in ledger mode, cancelled through the gate (twice: once takes
    // effect): its unit goes back to the rebuilt Redis, once.
    let cancelled = &during[0];
    let i = cancelled.buyer().expect("i");
    for _ in 0..2 {
        let (status, body) = app.cancel(order_id(&cancelled.body), i + 1).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    assert_eq!(app.redis_available(PRODUCT).await, Some(STOCK - 100 + 1));
    let after = buyers(&[&app], PRODUCT, 100, 160, Duration::from_millis(300)).await;
    let mut all = before;
    all.extend(during);
    all.extend(after);
    sold_exactly_and_audited(app, workers, PRODUCT, STOCK, &all).await;
}

// Checks a Redis that answers one second and not the next, for 20 seconds, through a
// proxy cut and restored: the product switches to ledger mode once and stays there while
// Redis flaps (no thrashing: one switch each way in the metrics), returns to the gate
// RECOVER_AFTER after Redis settles, exactly the stock sells and the audit holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_flapping_for_20_seconds_does_not_thrash_the_mode() {
    const PRODUCT: i64 = 5102;
    const STOCK: i64 = 150;
    let (proxy, app) = TestApp::spawn_via_redis_proxy(&settings()).await;
    let workers = start_workers(&app);
    app.create_product(PRODUCT, STOCK, None).await;
    let flapping = async {
        for _ in 0..10 {
            proxy.cut();
            tokio::time::sleep(Duration::from_secs(1)).await;
            proxy.restore();
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    };
    let watching = modes_seen(&app, PRODUCT, Duration::from_secs(20));
    let apps = [&app];
    let (answers, (), seen) = tokio::join!(
        buyers(&apps, PRODUCT, 0, 300, Duration::from_secs(18)),
        flapping,
        watching
    );
    println!("modes while Redis flapped: {seen:?}");
    assert_eq!(
        seen,
        ["GATE", "LEDGER"],
        "one switch, no way back while flapping"
    );
    back_in_gate_mode(&app, PRODUCT).await;
    assert_eq!(
        metric(&app, r#"flashsale_mode_switches_total{to="ledger"}"#).await,
        1.0
    );
    assert_eq!(
        metric(&app, r#"flashsale_mode_switches_total{to="gate"}"#).await,
        1.0
    );
    sold_exactly_and_audited(app, workers, PRODUCT, STOCK, &answers).await;
}

// Checks two instances of which only one can reach Redis (the other's goes through a
// proxy that is cut): the one that cannot switches the product to ledger mode, the other
// follows it and sells from the ledger too; the one that can reach Redis never takes the
// product back while the other still reports Redis unreachable (the mode stays LEDGER for
// more than twice RECOVER_AFTER), nothing is oversold, and once the proxy is restored
// the product returns to the gate, exactly the stock sells, and the audit holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_with_a_split_view_of_redis_never_oversell() {
    const PRODUCT: i64 = 5103;
    const STOCK: i64 = 100;
    let proxy = TcpProxy::start(redis_addr()).await.expect("proxy");
    let a = TestApp::spawn_with(Routes::default(), &settings()).await;
    let through_proxy = format!("redis://{}", proxy.addr());
    let mut beside = settings();
    beside.push(("REDIS_URL", through_proxy.as_str()));
    let b = a.spawn_beside(&beside).await;
    let workers = (start_workers(&a), start_workers(&b));
    a.create_product(PRODUCT, STOCK, None).await;
    proxy.cut();
    let watching = modes_seen(&a, PRODUCT, RECOVER_AFTER * 2 + Duration::from_secs(2));
    let apps = [&a, &b];
    let (answers, seen) = tokio::join!(buyers(&apps, PRODUCT, 0, 150, RECOVER_AFTER * 2), watching);
    println!("modes during the split: {seen:?}");
    assert_eq!(
        seen,
        ["GATE", "LEDGER"],
        "never given back while B cannot reach Redis"
    );
    let from_a = answers
        .iter()
        .filter(|x| x.status == StatusCode::CREATED)
        .filter(|x| x.buyer().is_some_and(|i| i % 2 == 0))
        .count();
    assert!(from_a > 0, "the instance that reaches Redis sold too");
    assert_eq!(
        metric(&a, r#"flashsale_mode_switches_total{to="gate"}"#).await,
        0.0
    );
    proxy.restore();
    back_in_gate_mode(&a, PRODUCT).await;
    let after = buyers(&[&a, &b], PRODUCT, 150, 200, Duration::from_millis(500)).await;
    let mut all = answers;
    all.extend(after);
    let orders = acknowledged(&all);
    assert_sold_exactly(&a, PRODUCT, STOCK, &orders).await;
    workers.0.stop().await;
    workers.1.stop().await;
    invariants::assert_sound(&a, PRODUCT).await;
    cleanup_all([a, b]).await;
}

// Checks a product created while Redis is down, so its stock was never loaded into
// Redis: the creation answers 503 (the product is recorded, its stock not loaded), its
// buyers' purchases find Redis unreachable and switch it to ledger mode, where it sells;
// once Redis is back it is given to the gate from MariaDB's facts (not loaded again from
// the counters as if nothing had sold), and exactly the stock sells.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_product_never_loaded_into_redis_sells_from_the_ledger() {
    const PRODUCT: i64 = 5104;
    const STOCK: i64 = 20;
    let (mut redis, mut app, workers) = on_a_private_redis().await;
    redis.kill9().expect("kill redis");
    let body =
        serde_json::json!({"product_id": PRODUCT, "name": "born in an outage", "stock": STOCK});
    let (status, body) = app.admin_post("/v1/products", body).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let answers = buyers(&[&app], PRODUCT, 0, 30, Duration::from_millis(500)).await;
    assert_eq!(mode(&app, PRODUCT).await, "ledger");
    redis.restart().await.expect("restart redis");
    app.reconnect_checks(&redis.url()).await;
    back_in_gate_mode(&app, PRODUCT).await;
    let rebuilt = app.redis_available(PRODUCT).await;
    if rebuilt != Some(0) {
        let ledger: Vec<(i64, String, i64, Option<String>)> = app
            .rows(
                "SELECT generation, CAST(stock_mode AS CHAR), available_stock, \
                 CAST(mode_changed_at AS CHAR) FROM product_inventory WHERE product_id = ?",
                PRODUCT,
            )
            .await;
        let holds: Vec<(i64, i64, String)> = app
            .rows(
                "SELECT generation, hold_id, CAST(created_at AS CHAR) FROM inventory_reservation \
                 WHERE product_id = ? ORDER BY id",
                PRODUCT,
            )
            .await;
        panic!(
            "Redis rebuilt with units the ledger sold: {rebuilt:?}; Redis holds {:?}; \
             ledger {ledger:?}; reservations {holds:?}",
            app.redis_dump().await
        );
    }
    sold_exactly_and_audited(app, workers, PRODUCT, STOCK, &answers).await;
}

// Checks a product an operator's tooling (or another instance) put in ledger mode while
// this instance's Redis answers: the instance follows the switch within the fallback
// worker's period, sells from MariaDB, and the per-user rate limit still applies (the
// third purchase of a user with a burst of 2 gets 429, nothing written); once it is sold
// out, refusals are `sold_out`; with Redis answering all along, the product returns to
// the gate after RECOVER_AFTER.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_instance_follows_a_switch_made_elsewhere_and_its_limits_hold() {
    const PRODUCT: i64 = 5105;
    let s = user_rate(("1", "2"), &settings());
    let app = TestApp::spawn_with(Routes::default(), &s).await;
    let workers = start_workers(&app);
    app.create_product(PRODUCT, 3, None).await;
    switch_elsewhere(&app, PRODUCT).await;
    // The instance reads the modes every 250 ms and the ledger sells 1.5 s after the
    // switch: after that and some slack, the instance must send the purchase to the
    // ledger (a gate hold would be refused in the new generation and answered 503).
    tokio::time::sleep(
        flashsale_app::modes::LEDGER_SALES_AFTER_SWITCH + Duration::from_millis(350),
    )
    .await;
    app.bought("REQ_follow_0", 1, PRODUCT, 1).await;
    let hold: i64 = sqlx::query_scalar(
        "SELECT generation FROM inventory_reservation WHERE request_id = 'REQ_follow_0'",
    )
    .fetch_one(&app.pool)
    .await
    .expect("reservation");
    assert_eq!(hold, 2, "sold in the ledger mode's generation");
    app.bought("REQ_follow_1", 1, PRODUCT, 1).await;
    app.refused(
        ("REQ_follow_2", 1, PRODUCT, 1),
        (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
    )
    .await;
    assert_eq!(app.count("SELECT COUNT(*) FROM orders").await, 2);
    app.bought("REQ_follow_3", 2, PRODUCT, 1).await;
    for i in 4..8 {
        app.refused((&format!("REQ_follow_{i}"), i, PRODUCT, 1), SOLD_OUT)
            .await;
    }
    back_in_gate_mode(&app, PRODUCT).await;
    assert_eq!(app.redis_available(PRODUCT).await, Some(0));
    workers.stop().await;
    invariants::assert_sound_and_clean_up(app, PRODUCT).await;
}

// Checks that a product that cannot come back to the gate does not keep the others in
// ledger mode: two products are switched to ledger mode elsewhere with Redis answering
// all along, and the lower id's stock entry in Redis is damaged (a string where its hash
// was), so retiring it fails on every pass. The other product, after it in the pass,
// still comes back to the gate and is rebuilt within RECOVER_AFTER and BACK_BOUND; the
// damaged one stays in ledger mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_product_that_cannot_come_back_does_not_hold_the_others() {
    const DAMAGED: i64 = 5110;
    const OTHER: i64 = 5111;
    let app = TestApp::spawn_with(Routes::default(), &settings()).await;
    let workers = start_workers(&app);
    app.create_product(DAMAGED, 3, None).await;
    app.create_product(OTHER, 3, None).await;
    switch_elsewhere(&app, DAMAGED).await;
    switch_elsewhere(&app, OTHER).await;
    let mut conn = app.redis.clone();
    let _: () = redis::cmd("SET")
        .arg(app.key(DAMAGED, "inv"))
        .arg("damaged")
        .query_async(&mut conn)
        .await
        .expect("damage the entry");
    back_in_gate_mode(&app, OTHER).await;
    assert_eq!(stored_mode(&app, DAMAGED).await, "LEDGER");
    workers.stop().await;
    app.cleanup().await;
}
