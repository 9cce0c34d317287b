//! Redis losing state mid-sale: coming back empty (a private redis-server killed with
//! SIGKILL and restarted with nothing), coming back *behind* (a failover that lost its
//! last writes, simulated by restoring an older copy of the product's stock entry),
//! restarting from an older snapshot (a new process with old data: lost releases), and
//! losing its per-user counts (the ledger's own limit check).

use std::collections::BTreeMap;
use std::time::Duration;

use flashsale_testkit::PrivateRedis;
use futures::stream::{self, StreamExt};
use reqwest::StatusCode;

use crate::helpers::{code, order_id, TestApp, LIMIT_EXCEEDED};
use crate::invariants;

/// Runs the gate watch every 200 ms until `stop` flips, as the service's worker would
/// (every second by default).
fn watch(
    app: &TestApp,
) -> (
    tokio::task::JoinHandle<usize>,
    tokio::sync::watch::Sender<bool>,
) {
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let m = app.maintenance.clone();
    let task = tokio::spawn(async move {
        let mut rebuilt = 0;
        loop {
            if let Ok(n) = m.watch_once().await {
                rebuilt += n;
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
                _ = stopped.changed() => break,
            }
        }
        rebuilt
    });
    (task, stop)
}

/// Buyers `0..buyers` each buy one unit of `product`, retrying after every 503 with the
/// same request_id; arrivals are spread over ~3 s. Returns request_id → final answer.
async fn sale(
    app: &TestApp,
    product: i64,
    buyers: i64,
) -> BTreeMap<String, (StatusCode, serde_json::Value)> {
    stream::iter(0..buyers)
        .map(|i| async move {
            tokio::time::sleep(Duration::from_millis((i * 13) as u64 % 3000)).await;
            let request_id = format!("REQ_loss_{i}");
            let (s, b, _) = app
                .purchase_until_known(&request_id, i + 1, product, 1)
                .await;
            (request_id, (s, b))
        })
        .buffer_unordered(96)
        .collect()
        .await
}

/// Every buyer got a definite answer; exactly `stock` orders were acknowledged and exist.
async fn assert_sold_exactly(
    app: &TestApp,
    answers: &BTreeMap<String, (StatusCode, serde_json::Value)>,
    stock: i64,
) {
    let mut acknowledged = 0;
    for (request_id, (s, b)) in answers {
        match *s {
            StatusCode::CREATED | StatusCode::OK => {
                acknowledged += 1;
                app.assert_order_kept(order_id(b), request_id).await;
            }
            StatusCode::CONFLICT if code(b) == "sold_out" => {}
            other => panic!("{request_id}: unexpected final answer {other} {b}"),
        }
    }
    assert_eq!(
        acknowledged, stock,
        "demand exceeds stock: exactly the stock sells"
    );
    assert_eq!(app.count("SELECT COUNT(*) FROM orders").await, stock);
}

// Checks Redis restarting empty in the middle of a sale (a private redis-server killed
// with SIGKILL, restarted with no data): sales pause (503), the gate watch notices the
// missing stock entry, advances the product's generation in MariaDB and rebuilds Redis
// from the ledger's facts, buyers' retries then finish. Exactly the stock sells, no
// acknowledged order is lost, the invariants and the audit hold, and the generation
// moved once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_restarts_empty_mid_sale() {
    let mut redis = PrivateRedis::start().await.expect("private redis");
    let mut app = TestApp::spawn_on_redis(redis.url(), &[]).await;
    app.create_product(3100, 120, Some(1)).await;
    let (watcher, stop) = watch(&app);
    let buyers = sale(&app, 3100, 300);
    let crash = async {
        tokio::time::sleep(Duration::from_millis(1200)).await;
        redis.kill9().expect("kill redis");
        tokio::time::sleep(Duration::from_millis(300)).await;
        redis.restart().await.expect("restart redis");
    };
    let (answers, ()) = tokio::join!(buyers, crash);
    let _ = stop.send(true);
    let rebuilt = watcher.await.expect("watcher");
    // The test's own connection died with the old server.
    app.reconnect_checks(&redis.url()).await;
    assert!(rebuilt >= 1, "the gate was never rebuilt");
    assert_sold_exactly(&app, &answers, 120).await;
    assert!(app.count("SELECT generation FROM product_inventory").await >= 2);
    invariants::assert_sound_and_clean_up(app, 3100).await;
}

// Checks Redis coming back *behind* (a failover that lost its last writes): after part of
// the sale, the product's stock entry is replaced by a copy taken earlier (more units
// available, a lower last hold id). Purchases Redis wrongly admits meanwhile are refused
// by the ledger's own stock check; the gate watch sees Redis's last hold id below the
// ledger's, rebuilds in a new generation, and the sale ends with exactly the stock sold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_comes_back_behind() {
    let app = TestApp::selling(3200, 100, None).await;
    let inv = app.key(3200, "inv");
    let mut conn = app.redis.clone();
    let snapshot: Vec<u8> = redis::cmd("DUMP")
        .arg(&inv)
        .query_async(&mut conn)
        .await
        .expect("DUMP");
    // First part of the sale, against the real state.
    for i in 0..40 {
        app.bought(&format!("REQ_pre_{i}"), 10_000 + i, 3200, 1)
            .await;
    }
    // The "failover": the stock entry goes back to before those 40 purchases.
    let _: () = redis::cmd("RESTORE")
        .arg(&inv)
        .arg(0)
        .arg(snapshot)
        .arg("REPLACE")
        .query_async(&mut conn)
        .await
        .expect("RESTORE");
    let (watcher, stop) = watch(&app);
    let answers = sale(&app, 3200, 200).await;
    let _ = stop.send(true);
    assert!(
        watcher.await.expect("watcher") >= 1,
        "lost writes were never detected"
    );
    let sold_after = answers.values().filter(|(s, _)| s.is_success()).count() as i64;
    assert_eq!(
        sold_after, 60,
        "the 60 units left after the first 40 sell, no more"
    );
    assert_eq!(app.count("SELECT COUNT(*) FROM orders").await, 100);
    invariants::assert_sound_and_clean_up(app, 3200).await;
}

// Checks Redis coming back from an *older copy* whose last hold id is not behind: a
// private redis-server is snapshotted (SAVE) after 30 purchases, then 10 of those orders
// are cancelled (their units go back to Redis), then Redis is killed with SIGKILL and
// restarts from the snapshot — a new process holding the data from before the cancels,
// as after a failover. Its last hold id equals the ledger's, so only the changed run id
// shows that writes may be lost. Until the gate watch rebuilds, a purchase gets 503 (the
// new process answers nothing); after it, a sale must sell exactly the 30 units the
// ledger has left (without the rebuild Redis would offer only 20: the cancelled units
// would be stuck).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_restarts_from_an_older_snapshot() {
    let mut redis = PrivateRedis::start().await.expect("private redis");
    let mut app = TestApp::spawn_on_redis(redis.url(), &[]).await;
    app.create_product(3300, 50, None).await;
    let mut orders = Vec::new();
    for i in 0..30 {
        let b = app
            .bought(&format!("REQ_snap_{i}"), 20_000 + i, 3300, 1)
            .await;
        orders.push((order_id(&b), 20_000 + i));
    }
    let mut conn = app.redis.clone();
    let _: () = redis::cmd("SAVE")
        .query_async(&mut conn)
        .await
        .expect("SAVE");
    for (order, user) in &orders[..10] {
        let (s, b) = app.cancel(*order, *user).await;
        assert_eq!(s, StatusCode::OK, "{b}");
    }
    assert_eq!(app.redis_available(3300).await, Some(30));
    redis.restart_from_snapshot().await.expect("restart redis");
    app.reconnect_checks(&redis.url()).await;
    assert_eq!(
        app.redis_available(3300).await,
        Some(20),
        "the snapshot predates the cancels"
    );
    // Until the entry is rebuilt, the new Redis process answers no purchase: it may be
    // behind (here it is), and the sold-out lease it should honour may be lost with it.
    let (s, b) = app
        .purchase("REQ_snap_before_rebuild", 29_999, 3300, 1)
        .await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{b}");
    let mut rebuilt = 0;
    for _ in 0..50 {
        rebuilt += app.maintenance.watch_once().await.unwrap_or(0);
        if rebuilt > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        rebuilt, 1,
        "the restart from an older copy was not detected"
    );
    assert_eq!(app.redis_available(3300).await, Some(30));
    let answers = sale(&app, 3300, 60).await;
    let sold_after = answers.values().filter(|(s, _)| s.is_success()).count();
    assert_eq!(
        sold_after, 30,
        "exactly the 30 units the ledger has left sell"
    );
    assert_eq!(
        app.count("SELECT COUNT(*) FROM orders WHERE status = 'PENDING_PAYMENT'")
            .await,
        50
    );
    invariants::assert_sound_and_clean_up(app, 3300).await;
}

// Checks the ledger's own per-user limit: Redis's per-user counts are lost (the `users`
// hash deleted, as a failover to a replica without them would), so Redis admits a third
// unit to a user whose limit is 2. The commit must refuse it (409 limit_exceeded), fence
// the request_id with release_reason `limit_exceeded`, give the unit back to Redis, and
// a replay of it must get the same answer; the invariants and the audit hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn per_user_limit_holds_when_redis_loses_its_counts() {
    let app = TestApp::selling(3400, 10, Some(2)).await;
    for i in 0..2 {
        app.bought(&format!("REQ_lim_{i}"), 77, 3400, 1).await;
    }
    app.refused(("REQ_lim_gate", 77, 3400, 1), LIMIT_EXCEEDED)
        .await;
    app.delete_keys(3400, &["users"], "DEL users").await;
    app.refused(("REQ_lim_2", 77, 3400, 1), LIMIT_EXCEEDED)
        .await;
    app.refused(("REQ_lim_2", 77, 3400, 1), LIMIT_EXCEEDED)
        .await;
    let reason: Option<String> = sqlx::query_scalar(
        "SELECT CONVERT(release_reason USING utf8mb4) FROM inventory_reservation \
         WHERE request_id = 'REQ_lim_2'",
    )
    .fetch_optional(&app.pool)
    .await
    .expect("fence row");
    assert_eq!(reason.as_deref(), Some("limit_exceeded"));
    assert_eq!(
        app.count("SELECT COUNT(*) FROM orders WHERE user_id = 77")
            .await,
        2
    );
    assert_eq!(
        app.redis_available(3400).await,
        Some(8),
        "the unit went back"
    );
    // Another user is not affected.
    app.bought("REQ_lim_other", 78, 3400, 2).await;
    invariants::assert_sound_and_clean_up(app, 3400).await;
}

// Checks that a purchase meeting a gate Redis can't vouch for wakes the gate watch: with
// the workers running every 60 s, a private redis-server restarted from a snapshot (a
// new process) answers no purchase until the entry is rebuilt, and the buyer's retries
// with the same request_id get 201 within 10 s of the restart — the watch was woken (by
// the 503 purchase, or by the lease subscription coming back), not left to its period.
// Exactly one order for that request_id, and the invariants and the audit hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_purchase_behind_a_restarted_redis_wakes_the_gate_watch() {
    const PERIOD: &str = "60s";
    let mut redis = PrivateRedis::start().await.expect("private redis");
    let mut app = TestApp::spawn_on_redis(redis.url(), &[]).await;
    app.create_product(3500, 10, None).await;
    app.bought("REQ_nudge_0", 40_000, 3500, 1).await;
    // Their first passes run at once; the next ones only a period later, unless woken.
    let workers = app.spawn_workers(&[
        ("EXPIRY_INTERVAL", PERIOD),
        ("RECOVERY_INTERVAL", PERIOD),
        ("GATE_WATCH_INTERVAL", PERIOD),
        ("RECONCILE_INTERVAL", PERIOD),
    ]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut conn = app.redis.clone();
    let _: () = redis::cmd("SAVE")
        .query_async(&mut conn)
        .await
        .expect("SAVE");
    redis.restart_from_snapshot().await.expect("restart redis");
    app.reconnect_checks(&redis.url()).await;
    let restarted = std::time::Instant::now();
    let mut unavailable = 0;
    loop {
        let (s, b) = app.purchase("REQ_nudge_1", 40_001, 3500, 1).await;
        if s == StatusCode::CREATED {
            break;
        }
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{b}");
        unavailable += 1;
        assert!(
            restarted.elapsed() < Duration::from_secs(10),
            "no rebuild within 10 s of the restart: the gate watch waited for its period"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "bought {:?} after the restart, after {unavailable} answers 503",
        restarted.elapsed()
    );
    assert_eq!(
        app.count("SELECT COUNT(*) FROM orders WHERE request_id = 'REQ_nudge_1'")
            .await,
        1
    );
    workers.stop().await;
    invariants::assert_sound_and_clean_up(app, 3500).await;
}
