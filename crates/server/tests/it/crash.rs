//! Faults of the flashsale process itself: kill -9 between two effects of a purchase,
//! stopped there by a failpoint (built with the `failpoints` feature, which
//! scripts/test.sh turns on), and an instance whose clock jumped hours ahead. Each test
//! then checks what the client's retry, recovery and the audit see.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flashsale_testkit::{delete_prefix, free_port, redis_prefix, TestDb};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{
    code, delete_stream, gate_on_shared_redis, opening_in_an_hour, own_stream, redis_addr,
    redis_conn, stream_name, ADMIN_TOKEN, MYSQL_SERVER, NATS_URL, REDIS_URL,
};

const BIN: &str = env!("CARGO_BIN_EXE_flashsale");
/// How long a started service may take to answer /healthz.
const STARTUP_MAX: Duration = Duration::from_secs(30);

/// One flashsale process on its own port, database and Redis prefix.
struct Service {
    child: Child,
    base: String,
}

impl Service {
    /// `GET /v1/products/{id}`'s body.
    async fn product(&self, id: i64) -> Value {
        reqwest::get(format!("{}/v1/products/{id}", self.base))
            .await
            .expect("get")
            .json()
            .await
            .expect("json")
    }

    async fn start(db: &TestDb, prefix: &str, extra: &[(&str, &str)]) -> Service {
        Self::start_with(Command::new(BIN), db, prefix, extra).await
    }

    /// Starts the service and puts product 1 on sale with 3 units.
    async fn start_selling(db: &TestDb, prefix: &str, extra: &[(&str, &str)]) -> Service {
        let service = Self::start(db, prefix, extra).await;
        let product = json!({"product_id": 1, "name": "x", "stock": 3});
        let (s, _) = service.post("/v1/products", product, true).await;
        assert_eq!(s, StatusCode::CREATED);
        service
    }

    /// Starts `cmd` (the binary, or a wrapper that runs it) as the service.
    async fn start_with(
        mut cmd: Command,
        db: &TestDb,
        prefix: &str,
        extra: &[(&str, &str)],
    ) -> Service {
        let port = free_port();
        cmd.arg("serve")
            .env("FLASHSALE_LISTEN", format!("127.0.0.1:{port}"))
            .env("FLASHSALE_DATABASE_URL", db.url())
            .env("FLASHSALE_REDIS_URL", REDIS_URL)
            .env("FLASHSALE_REDIS_PREFIX", prefix)
            .env("FLASHSALE_ADMIN_TOKEN", ADMIN_TOKEN)
            // Its own stream and subjects on the shared NATS, deleted at the end.
            .envs(own_stream(prefix))
            .env("RUST_LOG", "warn")
            .env_remove("FAILPOINTS")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn flashsale");
        let base = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        let http = reqwest::Client::new();
        while http.get(format!("{base}/healthz")).send().await.is_err() {
            assert!(started.elapsed() < STARTUP_MAX, "flashsale did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Service { child, base }
    }

    fn kill9(mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }

    async fn post(&self, path: &str, body: Value, admin: bool) -> (StatusCode, Value) {
        let mut req = reqwest::Client::new()
            .post(format!("{}{path}", self.base))
            .timeout(Duration::from_secs(20))
            .json(&body);
        if admin {
            req = req.bearer_auth(ADMIN_TOKEN);
        }
        let resp = req.send().await.expect("request");
        let status = resp.status();
        (status, resp.json().await.unwrap_or(Value::Null))
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn purchase(request_id: &str) -> Value {
    json!({"request_id": request_id, "user_id": 7, "product_id": 1, "quantity": 1})
}

/// Sends a purchase that will hang at the failpoint, waits for it to get there, and
/// kills the process under it. Returns nothing: the client never hears back.
async fn purchase_then_kill(service: Service, request_id: &str) {
    let base = service.base.clone();
    let body = purchase(request_id);
    let hanging = tokio::spawn(async move {
        reqwest::Client::new()
            .post(format!("{base}/v1/purchases"))
            .timeout(Duration::from_secs(30))
            .json(&body)
            .send()
            .await
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    service.kill9();
    assert!(
        hanging.await.expect("join").is_err(),
        "the client must not have been answered"
    );
}

/// Fresh stores ([`fresh_stores`]) and a service selling on them, with `settings` and the
/// failpoint `failpoint` sleeping a minute, killed by [`purchase_then_kill`] while the
/// purchase `request_id` waits there. Returns the stores.
async fn killed_mid_purchase(
    failpoint: &str,
    settings: &[(&str, &str)],
    request_id: &str,
) -> (TestDb, String) {
    let (db, prefix) = fresh_stores().await;
    let sleeping = format!("{failpoint}=sleep(60000)");
    let mut with_fp = settings.to_vec();
    with_fp.push(("FAILPOINTS", &sleeping));
    let first = Service::start_selling(&db, &prefix, &with_fp).await;
    purchase_then_kill(first, request_id).await;
    (db, prefix)
}

/// `HGET key field` on the shared Redis.
async fn hget<T: redis::FromRedisValue>(key: String, field: &str) -> T {
    redis::cmd("HGET")
        .arg(key)
        .arg(field)
        .query_async(&mut redis_conn(REDIS_URL).await)
        .await
        .expect("HGET")
}

/// Waits (bounded) until the running service's relay has delivered every outbox event,
/// so the audit's I7 check sees a quiet system. A relay killed in the middle of a round
/// holds the outbox's lease until it ends: the bound is one lease and some.
async fn drained(pool: &sqlx::MySqlPool) {
    let deadline = Instant::now() + flashsale_app::relay::CLAIM_LEASE + Duration::from_secs(20);
    while count(pool, "SELECT COUNT(*) FROM outbox_unsent").await > 0 {
        assert!(Instant::now() < deadline, "the outbox never drained");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A database of the test's own on the shared MariaDB, and a Redis key prefix of its own.
async fn fresh_stores() -> (TestDb, String) {
    let db = TestDb::create(MYSQL_SERVER).await.expect("db");
    (db, redis_prefix())
}

/// How a crash test that ends with a service `second` running ends: once its relay has
/// delivered every event ([`drained`]), the service is stopped, `flashsale audit` must
/// pass, and the test's stores go.
async fn audited_and_cleaned(db: TestDb, prefix: &str, pool: sqlx::MySqlPool, second: Service) {
    drained(&pool).await;
    drop(second);
    audit_passes(&db, prefix).await;
    cleanup(db, prefix, pool).await;
}

async fn cleanup(db: TestDb, prefix: &str, pool: sqlx::MySqlPool) {
    pool.close().await;
    let _ = delete_prefix(REDIS_URL, prefix).await;
    delete_stream(NATS_URL, &stream_name(prefix)).await;
    let _ = db.drop_db().await;
}

async fn count(pool: &sqlx::MySqlPool, sql: &str) -> i64 {
    sqlx::query_scalar::<_, i64>(sql)
        .fetch_one(pool)
        .await
        .expect(sql)
}

async fn audit_passes(db: &TestDb, prefix: &str) {
    let out = Command::new(BIN)
        .arg("audit")
        .env("FLASHSALE_DATABASE_URL", db.url())
        .env("FLASHSALE_REDIS_URL", REDIS_URL)
        .env("FLASHSALE_REDIS_PREFIX", prefix)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run audit");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "audit failed:\n{text}");
}

// Checks a process killed (SIGKILL) after Redis took the units and before MariaDB
// committed: the hold stays traceable in Redis with no order; after a restart the
// client's retry with the same request_id completes it (200, one order); the audit
// passes (run as `flashsale audit`, the operator's command).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_between_reserve_and_commit_then_retried() {
    let (db, prefix) = killed_mid_purchase("purchase-after-reserve", &[], "REQ_k1").await;

    let pool = sqlx::MySqlPool::connect(&db.url()).await.expect("pool");
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM orders").await, 0);
    let state: Option<String> = hget(format!("{prefix}{{p:1}}:r:REQ_k1"), "s").await;
    assert_eq!(state.as_deref(), Some("h"), "the hold is traceable");

    let second = Service::start(&db, &prefix, &[]).await;
    let (s, b) = second
        .post("/v1/purchases", purchase("REQ_k1"), false)
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM orders").await, 1);
    audited_and_cleaned(db, &prefix, pool, second).await;
}

// Checks the same crash when the client never comes back: after the recovery window the
// restarted service's recovery worker fences the request_id and returns the units, so a
// late retry gets request_released, the stock is whole again, and the audit passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_between_reserve_and_commit_then_recovered() {
    let fast = [
        ("FLASHSALE_REQUEST_TIMEOUT", "1s"),
        ("FLASHSALE_RECOVERY_AFTER", "2s"),
        ("FLASHSALE_RECOVERY_INTERVAL", "200ms"),
    ];
    let (db, prefix) = killed_mid_purchase("purchase-after-reserve", &fast, "REQ_k2").await;

    let second = Service::start(&db, &prefix, &fast).await;
    let pool = sqlx::MySqlPool::connect(&db.url()).await.expect("pool");
    let deadline = Instant::now() + Duration::from_secs(15);
    while count(
        &pool,
        "SELECT COUNT(*) FROM inventory_reservation WHERE status = 'RELEASED' AND stock_returned = 1",
    )
    .await
        == 0
    {
        assert!(Instant::now() < deadline, "recovery never released the hold");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (s, b) = second
        .post("/v1/purchases", purchase("REQ_k2"), false)
        .await;
    assert_eq!(
        (s, code(&b)),
        (StatusCode::CONFLICT, "request_released"),
        "{b}"
    );
    let product = second.product(1).await;
    assert_eq!(product["inventory"]["available"], 3, "{product}");
    audited_and_cleaned(db, &prefix, pool, second).await;
}

// Checks a process killed after MariaDB committed the order and before the client heard
// 201: the order survives; after a restart the retry gets 200 with that same order, and
// no second order exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_commit_before_reply() {
    let (db, prefix) = killed_mid_purchase("purchase-after-commit", &[], "REQ_k3").await;
    let pool = sqlx::MySqlPool::connect(&db.url()).await.expect("pool");
    let committed: i64 = count(&pool, "SELECT id FROM orders WHERE request_id = 'REQ_k3'").await;

    let second = Service::start(&db, &prefix, &[]).await;
    let (s, b) = second
        .post("/v1/purchases", purchase("REQ_k3"), false)
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["order_id"], committed);
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM orders").await, 1);
    audited_and_cleaned(db, &prefix, pool, second).await;
}

/// Buys one unit of product 2 as user `user`, retrying every 503 (bounded): the final
/// status and body.
async fn buy_until_known(service: &Service, request_id: &str, user: i64) -> (StatusCode, Value) {
    let body =
        json!({"request_id": request_id, "user_id": user + 1, "product_id": 2, "quantity": 1});
    let started = Instant::now();
    loop {
        let (s, b) = service.post("/v1/purchases", body.clone(), false).await;
        if s != StatusCode::SERVICE_UNAVAILABLE {
            return (s, b);
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{request_id} still unknown"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// Checks an instance killed (SIGKILL) in the middle of the way back from ledger mode:
// Redis (through a proxy) is cut until the product switches to ledger mode and sells
// from MariaDB, then restored; the instance gives the product back to the gate in
// MariaDB and is killed before it rebuilds Redis (a failpoint holds it there). Another
// instance's gate watch finds Redis a generation behind and rebuilds it, the sale goes
// on through Redis, exactly the stock sells, every 201 is an order, and the audit
// passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_between_leaving_ledger_mode_and_the_rebuild() {
    const STOCK: i64 = 30;
    let (db, prefix) = fresh_stores().await;
    let proxy = flashsale_testkit::TcpProxy::start(redis_addr())
        .await
        .expect("proxy");
    let through_proxy = format!("redis://{}", proxy.addr());
    let first = Service::start(
        &db,
        &prefix,
        &[
            ("FAILPOINTS", "fallback-after-leave=sleep(60000)"),
            ("FLASHSALE_REDIS_URL", through_proxy.as_str()),
            ("FLASHSALE_FALLBACK_AFTER", "1s"),
            ("FLASHSALE_FALLBACK_RECOVER_AFTER", "2s"),
            ("FLASHSALE_USER_PURCHASE_RATE", "0"),
        ],
    )
    .await;
    let product = json!({"product_id": 2, "name": "x", "stock": STOCK});
    let (s, b) = first.post("/v1/products", product, true).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let mut acknowledged = Vec::new();
    for i in 0..5 {
        let (s, b) = buy_until_known(&first, &format!("REQ_w{i}"), i).await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
        acknowledged.push((format!("REQ_w{i}"), b["order_id"].clone()));
    }
    proxy.cut();
    for i in 5..10 {
        let (s, b) = buy_until_known(&first, &format!("REQ_w{i}"), i).await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
        acknowledged.push((format!("REQ_w{i}"), b["order_id"].clone()));
    }
    let pool = sqlx::MySqlPool::connect(&db.url()).await.expect("pool");
    let mode = || async {
        sqlx::query_scalar::<_, String>(
            "SELECT CAST(stock_mode AS CHAR) FROM product_inventory WHERE product_id = 2",
        )
        .fetch_one(&pool)
        .await
        .expect("mode")
    };
    assert_eq!(
        mode().await,
        "LEDGER",
        "sold from MariaDB while Redis was cut"
    );
    proxy.restore();
    let started = Instant::now();
    while mode().await != "GATE" {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "never left ledger mode"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Held at the failpoint: MariaDB says gate mode in a new generation, Redis is behind.
    let ledger_gen: i64 = count(
        &pool,
        "SELECT generation FROM product_inventory WHERE product_id = 2",
    )
    .await;
    let gate_gen: Option<i64> = hget(format!("{prefix}{{p:2}}:inv"), "gen").await;
    assert!(
        gate_gen < Some(ledger_gen),
        "Redis not rebuilt yet: {gate_gen:?} < {ledger_gen}"
    );
    first.kill9();

    let second = Service::start(&db, &prefix, &[("FLASHSALE_USER_PURCHASE_RATE", "0")]).await;
    let mut sold_out = 0;
    for i in 10..(STOCK + 5) {
        let (s, b) = buy_until_known(&second, &format!("REQ_w{i}"), i).await;
        match s {
            StatusCode::CREATED => acknowledged.push((format!("REQ_w{i}"), b["order_id"].clone())),
            StatusCode::CONFLICT if code(&b) == "sold_out" => sold_out += 1,
            other => panic!("REQ_w{i}: {other} {b}"),
        }
    }
    assert_eq!((acknowledged.len() as i64, sold_out), (STOCK, 5));
    for (request_id, order_id) in &acknowledged {
        let found: i64 = count(
            &pool,
            &format!("SELECT id FROM orders WHERE request_id = '{request_id}'"),
        )
        .await;
        assert_eq!(
            Some(found),
            order_id.as_i64(),
            "{request_id}: acknowledged order lost"
        );
    }
    assert_eq!(count(&pool, "SELECT COUNT(*) FROM orders").await, STOCK);
    audited_and_cleaned(db, &prefix, pool, second).await;
}

/// libfaketime's shared library (Debian's `faketime` package, installed by
/// `scripts/services.sh --with-faketime`, which `scripts/test.sh` runs), wherever the
/// platform puts it.
fn libfaketime() -> std::path::PathBuf {
    let found = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|arch| arch.path().join("faketime/libfaketime.so.1"))
        .chain(std::iter::once(std::path::PathBuf::from(
            "/usr/lib/faketime/libfaketime.so.1",
        )))
        .find(|p| p.exists());
    found.expect(
        "libfaketime.so.1 not found: install the faketime package (scripts/services.sh --with-faketime does)",
    )
}

// Checks a clock jump on one instance: a service running two hours in the future
// (faketime; its monotonic clock untouched so its timers still work) with its expiry,
// recovery and reconcile workers running every 200 ms, next to fresh orders and a fresh
// hold without an order. Expiry is decided on MariaDB's clock and holds age on Redis's,
// so nothing is expired, fenced or released early: orders stay PENDING_PAYMENT, the hold
// stays, Redis's count is unchanged — while a sale opening an hour from now is already
// open on that instance (its own clock really is ahead).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_jump_on_one_instance_releases_nothing_early() {
    let (db, prefix) = fresh_stores().await;
    // libfaketime preloaded into the service itself (not the `faketime` wrapper, which
    // forks: killing the wrapper would leave the service running).
    let mut cmd = Command::new(BIN);
    cmd.env("LD_PRELOAD", libfaketime())
        .env("FAKETIME", "+2h")
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
        .env("FLASHSALE_EXPIRY_INTERVAL", "200ms")
        .env("FLASHSALE_RECOVERY_INTERVAL", "200ms")
        .env("FLASHSALE_RECONCILE_INTERVAL", "200ms");
    let skewed = Service::start_with(cmd, &db, &prefix, &[]).await;
    let (s, _) = skewed
        .post(
            "/v1/products",
            json!({"product_id": 1, "name": "x", "stock": 5}),
            true,
        )
        .await;
    assert_eq!(s, StatusCode::CREATED);
    for i in 0..3 {
        let body = json!({"request_id": format!("REQ_clk_{i}"), "user_id": i + 1, "product_id": 1, "quantity": 1});
        let (s, b) = skewed.post("/v1/purchases", body, false).await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
    }
    // A hold whose attempt is still (as far as anyone knows) in flight.
    let gate = gate_on_shared_redis(&prefix);
    let request =
        flashsale_core::PurchaseRequest::parse("REQ_clk_hold", 9, 1, 1, 5).expect("valid");
    flashsale_app::StockGate::reserve(&gate, &request, None)
        .await
        .expect("reserve");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pool = sqlx::MySqlPool::connect(&db.url()).await.expect("pool");
    assert_eq!(
        count(
            &pool,
            "SELECT COUNT(*) FROM orders WHERE status = 'PENDING_PAYMENT'"
        )
        .await,
        3,
        "no order expired early"
    );
    assert_eq!(
        count(
            &pool,
            "SELECT COUNT(*) FROM inventory_reservation WHERE status = 'RELEASED'"
        )
        .await,
        0,
        "no hold fenced early"
    );
    let available = skewed.product(1).await;
    assert_eq!(available["inventory"]["available"], 1, "{available}");
    // The skew is real: a sale opening in an hour is already open on this instance.
    let (s, b) = skewed
        .post("/v1/products", opening_in_an_hour(2, 1), true)
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let body = json!({"request_id": "REQ_clk_later", "user_id": 1, "product_id": 2, "quantity": 1});
    let (s, b) = skewed.post("/v1/purchases", body, false).await;
    assert_eq!(
        s,
        StatusCode::CREATED,
        "the instance's clock is not ahead: {b}"
    );
    drop(skewed);
    cleanup(db, &prefix, pool).await;
}
