//! Redis and MariaDB becoming unreachable during a sale. Each test puts its own TCP proxy
//! between flashsale and the shared service and breaks only the proxy, so the shared
//! services are never touched.

use std::collections::BTreeMap;
use std::time::Duration;

use flashsale_testkit::{PrivateMariadb, TcpProxy};
use futures::stream::{self, StreamExt};
use reqwest::StatusCode;

use crate::helpers::{code, order_id, TestApp};
use crate::invariants;

/// How the proxy breaks the connection during the sale.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Connections are closed and refused: the service is down.
    Cut,
    /// Connections stay open but nothing passes: the service hangs past the client's
    /// timeout, so the outcome of in-flight calls is unknown.
    Blackhole,
}

/// Runs a sale of `stock` units to `buyers` buyers (each retrying its request_id after
/// every 503, as a client must), breaks `proxy` with `fault` for `outage` once the sale is
/// under way, then restores it. Checks: the outage was seen as 503 (never as a false
/// success or false sold_out), every buyer ends with a definite answer, exactly `stock`
/// orders exist, every acknowledged order is in MariaDB, and the invariants hold.
async fn sale_through_outage(app: &TestApp, proxy: &TcpProxy, fault: Fault, product_id: i64) {
    let breaker = async {
        tokio::time::sleep(Duration::from_millis(800)).await;
        match fault {
            Fault::Cut => proxy.cut(),
            Fault::Blackhole => proxy.blackhole(),
        }
        tokio::time::sleep(Duration::from_millis(2500)).await;
        proxy.restore();
    };
    sale_with(app, breaker, &format!("{fault:?}"), product_id).await;
}

/// What happens to a private MariaDB during the sale.
#[derive(Clone, Copy)]
enum MariadbFault {
    /// SIGKILL, then restarted on the same data 1 s later.
    Kill,
    /// SIGSTOP for 3.5 s, then SIGCONT.
    Pause,
}

/// A sale (the checks of [`sale_through_outage`]) by a service with request timeout
/// `timeout` whose database is on a private MariaDB, which `fault` strikes 800 ms in.
async fn sale_through_mariadb_fault(fault: MariadbFault, timeout: &str, product_id: i64) {
    let mut mariadb = PrivateMariadb::start().await.expect("private mariadb");
    let app = TestApp::spawn_on_mariadb(&mariadb.url(), &[("REQUEST_TIMEOUT", timeout)]).await;
    let breaker = async {
        tokio::time::sleep(Duration::from_millis(800)).await;
        match fault {
            MariadbFault::Kill => {
                mariadb.kill9().expect("kill mariadb");
                tokio::time::sleep(Duration::from_millis(1000)).await;
                mariadb.restart().await.expect("restart mariadb");
            }
            MariadbFault::Pause => {
                mariadb.sigstop().expect("pause mariadb");
                tokio::time::sleep(Duration::from_millis(3500)).await;
                mariadb.sigcont().expect("resume mariadb");
            }
        }
    };
    let what = match fault {
        MariadbFault::Kill => "MariaDB kill -9",
        MariadbFault::Pause => "MariaDB SIGSTOP",
    };
    sale_with(&app, breaker, what, product_id).await;
    app.cleanup().await;
}

/// A sale during which `breaker` runs (it breaks something and repairs it), with the
/// checks of [`sale_through_outage`].
async fn sale_with(
    app: &TestApp,
    breaker: impl std::future::Future<Output = ()>,
    fault: &str,
    product_id: i64,
) {
    let stock = 150;
    let buyers: i64 = 300;
    app.create_product(product_id, stock, None).await;
    let sale = stream::iter(0..buyers)
        .map(|i| {
            let app = &app;
            async move {
                // Spread arrivals over the outage so some land before, during and after it.
                tokio::time::sleep(Duration::from_millis((i * 17) as u64 % 4000)).await;
                let request_id = format!("REQ_fault_{i}");
                let answer = app
                    .purchase_until_known(&request_id, i + 1, product_id, 1)
                    .await;
                (request_id, answer)
            }
        })
        .buffer_unordered(128)
        .collect::<Vec<_>>();
    let (answers, ()) = tokio::join!(sale, breaker);

    let mut acknowledged = BTreeMap::new();
    let mut unknowns_seen = 0;
    for (request_id, (status, body, unknowns)) in &answers {
        unknowns_seen += unknowns;
        match *status {
            StatusCode::CREATED | StatusCode::OK => {
                acknowledged.insert(request_id.clone(), order_id(body));
            }
            StatusCode::CONFLICT if code(body) == "sold_out" => {}
            other => panic!("{request_id}: unexpected final answer {other} {body}"),
        }
    }
    assert!(
        unknowns_seen > 0,
        "the {fault:?} outage was never observed as 503"
    );
    assert_eq!(
        acknowledged.len() as i64,
        stock,
        "demand exceeds stock: all of it sells"
    );
    for (request_id, id) in &acknowledged {
        app.assert_order_kept(*id, request_id).await;
    }
    assert_eq!(app.count("SELECT COUNT(*) FROM orders").await, stock);
    invariants::assert_sound(app, product_id).await;
}

// Checks Redis going down (connections cut and refused for 2.5 s) in the middle of a sale:
// purchases answer 503 meanwhile, retries with the same request_id finish after Redis
// returns, nothing is oversold or lost. (See sale_through_outage for the full list.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_down_during_sale() {
    let (proxy, app) = TestApp::spawn_via_redis_proxy(&[]).await;
    sale_through_outage(&app, &proxy, Fault::Cut, 1201).await;
    app.cleanup().await;
}

// Checks Redis hanging past the client timeout (nothing passes the proxy for 2.5 s): the
// outcome of scripts in flight is unknown, the client hears 503 and retries; a script
// that did run is found by the retry (idempotent on request_id), never run twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_hangs_during_sale() {
    let (proxy, app) = TestApp::spawn_via_redis_proxy(&[]).await;
    sale_through_outage(&app, &proxy, Fault::Blackhole, 1202).await;
    app.cleanup().await;
}

// Checks MariaDB going down (connections cut and refused for 2.5 s) mid-sale: holds
// taken in Redis whose commit failed stay traceable, the client's retries complete them
// once MariaDB is back, so every unit sells exactly once and no order is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_down_during_sale() {
    let (proxy, app) = TestApp::spawn_via_mysql_proxy(&[("REQUEST_TIMEOUT", "3s")]).await;
    sale_through_outage(&app, &proxy, Fault::Cut, 1203).await;
    app.cleanup().await;
}

// Checks readiness follows the dependencies: /readyz is 200 when both answer, 503 while
// Redis is cut, 200 again once it is back; /healthz stays 200 throughout.
#[tokio::test]
async fn readiness_follows_dependencies() {
    let (proxy, app) = TestApp::spawn_via_redis_proxy(&[]).await;
    assert_eq!(app.get("/readyz").await.0, StatusCode::OK);
    proxy.cut();
    let (s, b) = app.get("/readyz").await;
    assert_eq!(
        (s, code(&b)),
        (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
    );
    assert_eq!(app.get("/healthz").await.0, StatusCode::OK);
    proxy.restore();
    let mut ready = false;
    for _ in 0..50 {
        if app.get("/readyz").await.0 == StatusCode::OK {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "readiness did not come back after Redis returned");
    app.cleanup().await;
}

// Checks a private MariaDB killed with SIGKILL mid-sale and restarted on the same data:
// purchases in flight fail with 503 and are retried with their request_id; every order
// committed before the crash survives (InnoDB), holds whose commit died are completed by
// the retries, so exactly the stock sells and the invariants and the audit hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_killed_and_restarted_mid_sale() {
    sale_through_mariadb_fault(MariadbFault::Kill, "3s", 1204).await;
}

// Checks a private MariaDB paused (SIGSTOP) past the service's deadline mid-sale, then
// resumed: commits in flight have an unknown outcome — the client hears 503, never a
// guess — and its retry finds the real state by request_id (the late commit's order, or
// completes the hold), so exactly the stock sells once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mariadb_paused_past_the_deadline() {
    sale_through_mariadb_fault(MariadbFault::Pause, "2s", 1205).await;
}
