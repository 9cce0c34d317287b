//! A flashsale instance per test, served on 127.0.0.1:0 over real HTTP, with its own
//! database and Redis key prefix, plus direct connections for checking the stores.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use flashsale::Config;
use flashsale_testkit::{delete_prefix, redis_prefix, TcpProxy, TestDb};
use futures::StreamExt;
use redis::aio::MultiplexedConnection;
use reqwest::StatusCode;
use serde_json::{json, Value};
use sqlx::mysql::MySqlPool;
use tokio::task::JoinHandle;

pub const MYSQL_SERVER: &str = "mysql://root@127.0.0.1:3306";
pub const REDIS_URL: &str = "redis://127.0.0.1:6379";
pub const ADMIN_TOKEN: &str = "test-admin-token";
/// How long a test client keeps retrying one purchase that answers 503 or can't connect:
/// longer than any fault a test injects, so every attempt ends with a known answer.
pub const RETRY_FOR: Duration = Duration::from_secs(60);
/// Pause between such retries.
pub const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// The in-process servers' warnings and errors, every test's, written to
/// `target/test-artifacts/it-server.log` (or under `CARGO_TARGET_DIR`), each line naming
/// its time and thread: when a test sees a 503 it did not cause, the server's reason is
/// there. Installed once per test binary, by the first [`TestApp`].
fn log_server_warnings() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let Ok(file) =
            artifacts("").and_then(|dir| std::fs::File::create(dir.join("it-server.log")))
        else {
            return;
        };
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("warn"))
            .with_writer(std::sync::Mutex::new(file))
            .with_ansi(false)
            .with_thread_names(true)
            .try_init();
    });
}

/// The folder `target/test-artifacts/<sub>` (or under `CARGO_TARGET_DIR`), created: where
/// tests keep what a person may want to look at after a run.
pub fn artifacts(sub: &str) -> std::io::Result<std::path::PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    let dir = target.join("test-artifacts").join(sub);
    std::fs::create_dir_all(&dir)?;
    Ok(dir.canonicalize().unwrap_or(dir))
}

pub fn redis_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 6379))
}

pub fn mysql_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 3306))
}

/// The tests' own Redis connection for checks: one Redis, or a Redis Cluster (commands
/// routed by their key, KEYS sent to every primary and the answers joined).
#[derive(Clone)]
pub enum CheckRedis {
    Node(MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl From<MultiplexedConnection> for CheckRedis {
    fn from(conn: MultiplexedConnection) -> Self {
        Self::Node(conn)
    }
}

impl redis::aio::ConnectionLike for CheckRedis {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Self::Node(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Self::Node(c) => c.req_packed_commands(cmd, offset, count),
            Self::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// Where the service under test reaches its stores (tests may route it through proxies).
#[derive(Default)]
pub struct Routes {
    pub redis: Option<SocketAddr>,
    pub mysql: Option<SocketAddr>,
}

pub struct TestApp {
    pub base: String,
    /// The operator's listener (`/metrics`, `/dashboard`) when `METRICS_LISTEN` is set:
    /// served on a loopback port of its own, whatever address the setting names.
    pub metrics_base: Option<String>,
    pub http: reqwest::Client,
    /// The test's database; None on an instance beside another, which owns nothing.
    pub db: Option<TestDb>,
    /// The service's database URL and Redis settings, for an instance beside this one.
    pub database_url: String,
    redis_env: Vec<(String, String)>,
    /// Direct connections for checks, never through a test's proxy.
    pub pool: MySqlPool,
    pub redis: CheckRedis,
    pub prefix: String,
    /// The instance's workers and checks, driven by tests one pass at a time.
    pub maintenance: std::sync::Arc<flashsale_app::Maintenance>,
    /// What the instance's `GET /metrics` shows; event workers started for it count here.
    pub metrics: std::sync::Arc<flashsale_app::Metrics>,
    /// Wakes the gate watch of workers the test starts itself (`Workers::spawn`).
    pub gate_watch: std::sync::Arc<tokio::sync::Notify>,
    /// The instance's fallback to ledger mode, for workers the test starts itself.
    pub fallback: std::sync::Arc<flashsale_app::Fallback>,
    /// The instance's destocks, for tests that settle pending ones a pass at a time.
    pub destocking: std::sync::Arc<flashsale_app::Destocking>,
    /// The instance's retirement of ended sales (None: `SALE_RETIRE_AFTER=off`), for
    /// tests that run its pass themselves.
    pub retirement: Option<std::sync::Arc<flashsale_app::SaleRetirement>>,
    server: JoinHandle<()>,
}

/// What the instances of one test share: its clients, its database and its checks on
/// the stores.
struct Shared {
    http: reqwest::Client,
    db: Option<TestDb>,
    database_url: String,
    redis_env: Vec<(String, String)>,
    pool: MySqlPool,
    redis: CheckRedis,
    prefix: String,
}

/// An instance's settings: the database at `database_url`, the Redis key prefix
/// `prefix`, the Redis settings `redis_env`, the test admin token, no per-user purchase
/// rate, and extra `FLASHSALE_*` `settings`.
fn instance_env(
    database_url: String,
    prefix: &str,
    redis_env: Vec<(String, String)>,
    settings: &[(&str, &str)],
) -> HashMap<String, String> {
    let mut env: HashMap<String, String> = HashMap::from([
        ("FLASHSALE_DATABASE_URL".into(), database_url),
        ("FLASHSALE_REDIS_PREFIX".into(), prefix.to_owned()),
        ("FLASHSALE_ADMIN_TOKEN".into(), ADMIN_TOKEN.into()),
        // The tests of everything else send one user's purchases far faster than a
        // person would (floods, races, retries in a loop); `rate_limit.rs` tests the
        // limits with their settings.
        ("FLASHSALE_USER_PURCHASE_RATE".into(), "0".into()),
    ]);
    env.extend(redis_env);
    for (k, v) in settings {
        env.insert(format!("FLASHSALE_{k}"), (*v).to_owned());
    }
    env
}

/// Builds an instance from `env` and serves it on a free loopback port with the binary's
/// own listener (every request given its peer's address), with the test's `shared`
/// clients and stores.
async fn serve_with(env: &HashMap<String, String>, shared: Shared) -> TestApp {
    let config = Config::from_parts(None, env).expect("valid test config");
    let app = flashsale::build(&config).await.expect("build app");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let http = flashsale::http::HttpSettings {
        connect_info: true,
        ..flashsale::http_settings(&config)
    };
    let metrics_addr = match app.metrics_router {
        Some(router) => {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind the metrics listener");
            let addr = listener.local_addr().expect("addr");
            // Detached: it ends with the test's runtime.
            tokio::spawn(flashsale::http::serve(
                listener,
                router,
                http,
                std::future::pending(),
            ));
            Some(addr)
        }
        None => None,
    };
    let server = tokio::spawn(flashsale::http::serve(
        listener,
        app.router,
        http,
        std::future::pending(),
    ));
    TestApp {
        base: format!("http://{addr}"),
        metrics_base: metrics_addr.map(|a| format!("http://{a}")),
        http: shared.http,
        db: shared.db,
        database_url: shared.database_url,
        redis_env: shared.redis_env,
        pool: shared.pool,
        redis: shared.redis,
        prefix: shared.prefix,
        maintenance: app.maintenance,
        metrics: app.metrics,
        gate_watch: app.gate_watch,
        fallback: app.fallback,
        destocking: app.destocking,
        retirement: app.retirement,
        server,
    }
}

impl TestApp {
    pub async fn spawn() -> Self {
        Self::spawn_with(Routes::default(), &[]).await
    }

    /// [`TestApp::spawn`], with one product created (see [`TestApp::create_product`]).
    pub async fn selling(product_id: i64, stock: i64, per_user_limit: Option<i64>) -> Self {
        Self::selling_with(&[], (product_id, stock, per_user_limit)).await
    }

    /// [`TestApp::spawn_with`] the shared stores and `settings`, with one product
    /// created: `(product_id, stock, per_user_limit)`, as [`TestApp::create_product`]
    /// takes them.
    pub async fn selling_with(
        settings: &[(&str, &str)],
        (product_id, stock, per_user_limit): (i64, i64, Option<i64>),
    ) -> Self {
        let app = Self::spawn_with(Routes::default(), settings).await;
        app.create_product(product_id, stock, per_user_limit).await;
        app
    }

    /// Two instances of one service, the second beside the first, selling `product_id`
    /// (created through the first).
    pub async fn selling_on_two(
        product_id: i64,
        stock: i64,
        per_user_limit: Option<i64>,
    ) -> (Self, Self) {
        let app = Self::spawn().await;
        let beside = app.spawn_beside(&[]).await;
        app.create_product(product_id, stock, per_user_limit).await;
        (app, beside)
    }

    /// Starts a service whose stores are reached through `routes`, with extra
    /// `FLASHSALE_*` settings.
    pub async fn spawn_with(routes: Routes, settings: &[(&str, &str)]) -> Self {
        let redis_url = match routes.redis {
            Some(addr) => format!("redis://{addr}"),
            None => REDIS_URL.to_owned(),
        };
        Self::spawn_on(routes, redis_url, REDIS_URL, MYSQL_SERVER, settings).await
    }

    /// A service on the Redis at `redis_url` (a private one the test may kill and
    /// restart), checked there too, with the test's database on the shared MariaDB, and
    /// extra `FLASHSALE_*` settings.
    pub async fn spawn_on_redis(redis_url: String, settings: &[(&str, &str)]) -> Self {
        let check = redis_url.clone();
        Self::spawn_on(Routes::default(), redis_url, &check, MYSQL_SERVER, settings).await
    }

    /// A service on the shared Redis with the test's database on the MariaDB server
    /// `mysql_server` (a private one the test may kill or pause, a Galera node), with
    /// extra `FLASHSALE_*` settings.
    pub async fn spawn_on_mariadb(mysql_server: &str, settings: &[(&str, &str)]) -> Self {
        Self::spawn_on(
            Routes::default(),
            REDIS_URL.to_owned(),
            REDIS_URL,
            mysql_server,
            settings,
        )
        .await
    }

    /// A service that reaches Redis through a proxy of the test's own, to cut, hang and
    /// restore, with extra `FLASHSALE_*` settings: the proxy and the service.
    pub async fn spawn_via_redis_proxy(settings: &[(&str, &str)]) -> (TcpProxy, Self) {
        let proxy = TcpProxy::start(redis_addr()).await.expect("proxy");
        let routes = Routes {
            redis: Some(proxy.addr()),
            mysql: None,
        };
        let app = Self::spawn_with(routes, settings).await;
        (proxy, app)
    }

    /// [`TestApp::spawn_via_redis_proxy`] for MariaDB: the service reaches its database
    /// through the proxy.
    pub async fn spawn_via_mysql_proxy(settings: &[(&str, &str)]) -> (TcpProxy, Self) {
        let proxy = TcpProxy::start(mysql_addr()).await.expect("proxy");
        let routes = Routes {
            redis: None,
            mysql: Some(proxy.addr()),
        };
        let app = Self::spawn_with(routes, settings).await;
        (proxy, app)
    }

    /// Like [`TestApp::spawn_with`], with the service on `redis_url` and the checks on
    /// `check_redis_url` (a private Redis the test may kill and restart), and the test's
    /// database on `mysql_server` (a private MariaDB the test may kill or pause).
    pub async fn spawn_on(
        routes: Routes,
        redis_url: String,
        check_redis_url: &str,
        mysql_server: &str,
        settings: &[(&str, &str)],
    ) -> Self {
        let client = redis::Client::open(check_redis_url).expect("redis url");
        let check = client
            .get_multiplexed_async_connection()
            .await
            .expect("redis");
        let redis_env = vec![("FLASHSALE_REDIS_URL".to_owned(), redis_url)];
        Self::spawn_full(routes, redis_env, check.into(), mysql_server, settings).await
    }

    /// A service on the Redis Cluster of `seed_nodes` (`host:port,…`), checked through
    /// a cluster connection of the test's own, with the test's database on the shared
    /// MariaDB.
    pub async fn spawn_on_cluster(seed_nodes: &str, settings: &[(&str, &str)]) -> Self {
        let client = redis::cluster::ClusterClientBuilder::new(
            seed_nodes.split(',').map(|node| format!("redis://{node}/")),
        )
        .response_timeout(Duration::from_secs(5))
        .build()
        .expect("cluster client");
        let check = client
            .get_async_connection()
            .await
            .expect("cluster connection");
        let redis_env = vec![(
            "FLASHSALE_REDIS_CLUSTER_NODES".to_owned(),
            seed_nodes.to_owned(),
        )];
        Self::spawn_full(
            Routes::default(),
            redis_env,
            CheckRedis::Cluster(check),
            MYSQL_SERVER,
            settings,
        )
        .await
    }

    async fn spawn_full(
        routes: Routes,
        redis_env: Vec<(String, String)>,
        redis: CheckRedis,
        mysql_server: &str,
        settings: &[(&str, &str)],
    ) -> Self {
        log_server_warnings();
        let db = TestDb::create(mysql_server)
            .await
            .expect("create test database");
        let prefix = redis_prefix();
        let database_url = match routes.mysql {
            Some(addr) => db.url_via(addr),
            None => db.url(),
        };
        let env = instance_env(database_url, &prefix, redis_env, settings);
        let database_url = env["FLASHSALE_DATABASE_URL"].clone();
        let redis_env = env
            .iter()
            .filter(|(k, _)| k.starts_with("FLASHSALE_REDIS_") && *k != "FLASHSALE_REDIS_PREFIX")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let pool = MySqlPool::connect(&db.url()).await.expect("check pool");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(512)
            .build()
            .expect("http client");
        let shared = Shared {
            http,
            db: Some(db),
            database_url,
            redis_env,
            pool,
            redis,
            prefix,
        };
        serve_with(&env, shared).await
    }

    /// A second instance beside this one, as behind a balancer: its own router, caches
    /// and sold-out board, on the same database and Redis key prefix, with extra
    /// `FLASHSALE_*` settings. It owns neither store: clean it up before this one.
    pub async fn spawn_beside(&self, settings: &[(&str, &str)]) -> Self {
        let env = instance_env(
            self.database_url.clone(),
            &self.prefix,
            self.redis_env.clone(),
            settings,
        );
        let shared = Shared {
            http: self.http.clone(),
            db: None,
            database_url: self.database_url.clone(),
            redis_env: self.redis_env.clone(),
            pool: self.pool.clone(),
            redis: self.redis.clone(),
            prefix: self.prefix.clone(),
        };
        serve_with(&env, shared).await
    }

    /// The instance's workers, as `serve` runs them, with the worker `settings` (periods
    /// such as `("EXPIRY_INTERVAL", "200ms")`, named without `FLASHSALE_`).
    pub fn spawn_workers(&self, settings: &[(&str, &str)]) -> flashsale::workers::Workers {
        let env = settings
            .iter()
            .map(|(k, v)| (format!("FLASHSALE_{k}"), (*v).to_owned()))
            .collect();
        let config = Config::from_parts(None, &env).expect("worker config");
        flashsale::workers::Workers::spawn(
            self.maintenance.clone(),
            &config,
            self.metrics.clone(),
            self.gate_watch.clone(),
            self.fallback.clone(),
        )
    }

    /// A ledger of the test's own on the test's database, for writing what the service
    /// would.
    pub async fn connect_ledger(&self) -> flashsale_mysql::MysqlLedger {
        let env = HashMap::from([(
            "FLASHSALE_DATABASE_URL".to_owned(),
            self.db.as_ref().expect("test database").url(),
        )]);
        let config = Config::from_parts(None, &env).expect("config");
        flashsale::connect_ledger(&config).await.expect("ledger")
    }

    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&str>,
        admin: bool,
    ) -> Result<(StatusCode, Value), reqwest::Error> {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        if admin {
            req = req.bearer_auth(ADMIN_TOKEN);
        }
        if let Some(body) = body {
            req = req
                .header("content-type", "application/json")
                .body(body.to_owned());
        }
        let resp = req.send().await?;
        let status = resp.status();
        let text = resp.text().await?;
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok((status, value))
    }

    /// A request with extra headers (credentials, say) and an optional JSON body; the
    /// answer's status, body and headers.
    pub async fn send_with(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
        headers: &[(&str, &str)],
    ) -> (StatusCode, Value, reqwest::header::HeaderMap) {
        let mut req = self.http.request(method, format!("{}{path}", self.base));
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        if let Some(body) = body {
            req = req
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let resp = req.send().await.expect("request");
        let (status, headers) = (resp.status(), resp.headers().clone());
        let text = resp.text().await.expect("answer");
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, value, headers)
    }

    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.send(reqwest::Method::POST, path, Some(&body.to_string()), false)
            .await
            .expect("request")
    }

    pub async fn admin_post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.send(reqwest::Method::POST, path, Some(&body.to_string()), true)
            .await
            .expect("request")
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.send(reqwest::Method::GET, path, None, false)
            .await
            .expect("request")
    }

    pub async fn create_product(&self, product_id: i64, stock: i64, per_user_limit: Option<i64>) {
        let mut body = json!({"product_id": product_id, "name": format!("product {product_id}"), "stock": stock});
        if let Some(limit) = per_user_limit {
            body["per_user_limit"] = json!(limit);
        }
        let (status, body) = self.admin_post("/v1/products", body).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }

    /// The admin's restock of `quantity` units of `product_id` under `request_id`.
    pub async fn restock(
        &self,
        product_id: i64,
        request_id: &str,
        quantity: i64,
    ) -> (StatusCode, Value) {
        self.admin_post(
            &format!("/v1/products/{product_id}/restock"),
            json!({"request_id": request_id, "quantity": quantity}),
        )
        .await
    }

    /// [`TestApp::restock`] that must be answered 200: asserts it (the answer's body in
    /// the message) and returns the body.
    pub async fn restocked(&self, product_id: i64, request_id: &str, quantity: i64) -> Value {
        let (status, body) = self.restock(product_id, request_id, quantity).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }

    pub async fn purchase(
        &self,
        request_id: &str,
        user_id: i64,
        product_id: i64,
        quantity: i64,
    ) -> (StatusCode, Value) {
        self.post(
            "/v1/purchases",
            json!({"request_id": request_id, "user_id": user_id, "product_id": product_id, "quantity": quantity}),
        )
        .await
    }

    /// [`TestApp::purchase`] that must be answered 201: asserts it (the answer's body in
    /// the message) and returns the body.
    pub async fn bought(
        &self,
        request_id: &str,
        user_id: i64,
        product_id: i64,
        quantity: i64,
    ) -> Value {
        let (status, body) = self
            .purchase(request_id, user_id, product_id, quantity)
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body
    }

    /// [`TestApp::purchase`] that must be refused with `status` and the error code `error`:
    /// asserts it (the answer's body in the message) and returns the body.
    pub async fn refused(
        &self,
        (request_id, user_id, product_id, quantity): (&str, i64, i64, i64),
        (status, error): (StatusCode, &str),
    ) -> Value {
        let (got, body) = self
            .purchase(request_id, user_id, product_id, quantity)
            .await;
        assert_eq!((got, code(&body)), (status, error), "{body}");
        body
    }

    /// Pays the order `paid` and cancels the order `cancelled`, each `(order, user_id)`
    /// by its buyer; each must be answered 200.
    pub async fn pay_and_cancel(&self, paid: (i64, i64), cancelled: (i64, i64)) {
        let (status, body) = self.pay(paid.0, paid.1).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let (status, body) = self.cancel(cancelled.0, cancelled.1).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }

    /// `POST /v1/orders/{order}/pay` by `user_id`.
    pub async fn pay(&self, order: i64, user_id: i64) -> (StatusCode, Value) {
        self.post(
            &format!("/v1/orders/{order}/pay"),
            json!({"user_id": user_id}),
        )
        .await
    }

    /// `POST /v1/orders/{order}/cancel` by `user_id`.
    pub async fn cancel(&self, order: i64, user_id: i64) -> (StatusCode, Value) {
        self.post(
            &format!("/v1/orders/{order}/cancel"),
            json!({"user_id": user_id}),
        )
        .await
    }

    /// A well-behaved client: retries the same request_id after every 503 or failed
    /// connection, until it gets a definite answer (bounded by [`RETRY_FOR`]). Returns the
    /// final answer and how many 503s/connection errors it saw on the way.
    pub async fn purchase_until_known(
        &self,
        request_id: &str,
        user_id: i64,
        product_id: i64,
        quantity: i64,
    ) -> (StatusCode, Value, u32) {
        let (status, value, unknowns) = self
            .purchase_until_known_noting(request_id, user_id, product_id, quantity)
            .await;
        (status, value, unknowns.len() as u32)
    }

    /// `count` buyers of one unit of `product`, `concurrency` at a time, each a
    /// [`TestApp::purchase_until_known`]: the i-th (from 0) with request_id
    /// `{request_prefix}{i}`, as user `user(i)`. The answers come in the order they came.
    pub async fn rush(
        &self,
        count: i64,
        concurrency: usize,
        (request_prefix, product_id): (&str, i64),
        user: impl Fn(i64) -> i64,
    ) -> Vec<(StatusCode, Value, u32)> {
        futures::stream::iter(0..count)
            .map(|i| {
                let request_id = format!("{request_prefix}{i}");
                let user_id = user(i);
                async move {
                    self.purchase_until_known(&request_id, user_id, product_id, 1)
                        .await
                }
            })
            .buffer_unordered(concurrency)
            .collect()
            .await
    }

    /// [`TestApp::purchase_until_known`], with each answer that left the outcome unknown
    /// described (its code and message, or the client's error), so that a test can say
    /// what its unknowns were when it fails.
    pub async fn purchase_until_known_noting(
        &self,
        request_id: &str,
        user_id: i64,
        product_id: i64,
        quantity: i64,
    ) -> (StatusCode, Value, Vec<String>) {
        let body = json!({"request_id": request_id, "user_id": user_id, "product_id": product_id, "quantity": quantity}).to_string();
        let started = Instant::now();
        let mut unknowns = Vec::new();
        loop {
            let sent = self
                .send(reqwest::Method::POST, "/v1/purchases", Some(&body), false)
                .await;
            match sent {
                Ok((status, value)) if status != StatusCode::SERVICE_UNAVAILABLE => {
                    return (status, value, unknowns)
                }
                Ok((_, value)) => {
                    unknowns.push(format!("503 {} {}", value["error"], value["message"]))
                }
                Err(error) => unknowns.push(format!("client error: {error}")),
            }
            assert!(
                started.elapsed() < RETRY_FOR,
                "request {request_id} still unknown after {RETRY_FOR:?}"
            );
            tokio::time::sleep(RETRY_PAUSE).await;
        }
    }

    /// The body and content type of `GET /metrics`, which must answer 200.
    pub async fn scrape_metrics(&self) -> (String, String) {
        self.get_document("/metrics").await
    }

    /// The body and content type (empty without one) of `GET path`, which must
    /// answer 200.
    pub async fn get_document(&self, path: &str) -> (String, String) {
        let resp = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        assert_eq!(resp.status(), StatusCode::OK, "GET {path}");
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let text = resp
            .text()
            .await
            .unwrap_or_else(|e| panic!("GET {path}'s body: {e}"));
        (text, content_type)
    }

    pub fn key(&self, product_id: i64, suffix: &str) -> String {
        format!("{}{{p:{product_id}}}:{suffix}", self.prefix)
    }

    pub async fn redis_available(&self, product_id: i64) -> Option<i64> {
        self.entry_field(product_id, "avail").await
    }

    /// The field `field` of the product's stock entry in Redis (`HGET <key>inv field`),
    /// `None` where there is none.
    pub async fn entry_field<T: redis::FromRedisValue>(
        &self,
        product_id: i64,
        field: &str,
    ) -> Option<T> {
        let mut conn = self.redis.clone();
        redis::cmd("HGET")
            .arg(self.key(product_id, "inv"))
            .arg(field)
            .query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("redis HGET {field}: {e}"))
    }

    /// Moves a field of the product's Redis stock entry by `by` behind flashsale's back
    /// (`avail` for drift, `gen` for a generation change), for a test to be found.
    pub async fn bump_entry(&self, product_id: i64, field: &str, by: i64) {
        let mut conn = self.redis.clone();
        let _: i64 = redis::cmd("HINCRBY")
            .arg(self.key(product_id, "inv"))
            .arg(field)
            .arg(by)
            .query_async(&mut conn)
            .await
            .expect("redis HINCRBY");
    }

    /// Deletes the product's Redis keys named by `suffixes` (one `DEL`) behind flashsale's
    /// back, as a lost entry or a repair by hand; `what` names it if Redis refuses.
    pub async fn delete_keys(&self, product_id: i64, suffixes: &[&str], what: &str) {
        let mut conn = self.redis.clone();
        let keys: Vec<String> = suffixes.iter().map(|s| self.key(product_id, s)).collect();
        let _: () = redis::cmd("DEL")
            .arg(keys)
            .query_async(&mut conn)
            .await
            .expect(what);
    }

    /// After the test's Redis at `url` restarted: the checks' connection made anew.
    pub async fn reconnect_checks(&mut self, url: &str) {
        self.redis = redis::Client::open(url)
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("reconnect")
            .into();
    }

    /// Every key under this test's prefix with a fingerprint of its value, to prove a
    /// refused request wrote nothing.
    pub async fn redis_dump(&self) -> Vec<(String, String)> {
        let mut conn = self.redis.clone();
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", self.prefix))
            .query_async(&mut conn)
            .await
            .expect("KEYS");
        keys.sort();
        let mut out = Vec::new();
        for key in keys {
            let dump: Option<Vec<u8>> = redis::cmd("DUMP")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .expect("DUMP");
            out.push((key, format!("{:?}", dump)));
        }
        out
    }

    /// The rows `sql` reads from the test's database, its one `?` bound to `arg`.
    pub async fn rows<'q, T, A>(&self, sql: &'q str, arg: A) -> Vec<T>
    where
        T: for<'r> sqlx::FromRow<'r, sqlx::mysql::MySqlRow> + Send + Unpin,
        A: 'q + Send + sqlx::Encode<'q, sqlx::MySql> + sqlx::Type<sqlx::MySql>,
    {
        sqlx::query_as(sql)
            .bind(arg)
            .fetch_all(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// The first row `sql` reads (there must be one), as [`TestApp::rows`].
    pub async fn row<'q, T, A>(&self, sql: &'q str, arg: A) -> T
    where
        T: for<'r> sqlx::FromRow<'r, sqlx::mysql::MySqlRow> + Send + Unpin,
        A: 'q + Send + sqlx::Encode<'q, sqlx::MySql> + sqlx::Type<sqlx::MySql>,
    {
        let rows = self.rows(sql, arg).await;
        rows.into_iter()
            .next()
            .unwrap_or_else(|| panic!("no row: {sql}"))
    }

    pub async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(&self.pool)
            .await
            .expect(sql)
    }

    /// Asserts that the ledger holds order `id` under `request_id`: an order the service
    /// acknowledged was not lost.
    pub async fn assert_order_kept(&self, id: i64, request_id: &str) {
        let found: Option<String> =
            sqlx::query_scalar("SELECT CONVERT(request_id USING utf8mb4) FROM orders WHERE id = ?")
                .bind(id)
                .fetch_optional(&self.pool)
                .await
                .expect("lookup");
        assert_eq!(
            found.as_deref(),
            Some(request_id),
            "acknowledged order lost"
        );
    }

    /// Runs `flashsale <args>` against this test's stores (its database reached directly,
    /// the shared Redis, its key prefix) with extra `FLASHSALE_*` settings, as an operator
    /// runs it: its exit status and output.
    pub fn run_binary(&self, args: &[&str], settings: &[(&str, &str)]) -> std::process::Output {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_flashsale"));
        cmd.args(args)
            .env(
                "FLASHSALE_DATABASE_URL",
                self.db.as_ref().expect("db").url(),
            )
            .env("FLASHSALE_REDIS_URL", REDIS_URL)
            .env("FLASHSALE_REDIS_PREFIX", &self.prefix)
            .env("RUST_LOG", "warn");
        for (k, v) in settings {
            cmd.env(format!("FLASHSALE_{k}"), v);
        }
        cmd.output()
            .unwrap_or_else(|e| panic!("run flashsale {}: {e}", args.join(" ")))
    }

    pub async fn cleanup(mut self) {
        self.server.abort();
        // An instance beside another shares its stores: they are the other's to drop.
        if let Some(db) = self.db.take() {
            self.pool.close().await;
            let _ = delete_prefix(REDIS_URL, &self.prefix).await;
            let _ = db.drop_db().await;
        }
    }
}

/// A buyer's JWT as an identity provider would issue it: `sub` the decimal user id,
/// `exp` `lifetime_secs` from now (negative: already expired), signed with `key` by
/// `algorithm`.
/// The HS256 secret of the tests' jwt buyers (`jwt_buyers()` configures it).
/// A purchase's refusal: 409 `sold_out`, no unit left.
pub const SOLD_OUT: (StatusCode, &str) = (StatusCode::CONFLICT, "sold_out");
/// A purchase's refusal: 409 `limit_exceeded`, over the per-user limit.
pub const LIMIT_EXCEEDED: (StatusCode, &str) = (StatusCode::CONFLICT, "limit_exceeded");
/// A purchase's refusal: 409 `sale_paused`, the sale is paused.
pub const SALE_PAUSED: (StatusCode, &str) = (StatusCode::CONFLICT, "sale_paused");
/// A purchase's refusal: 409 `request_released`, its hold was given back.
pub const REQUEST_RELEASED: (StatusCode, &str) = (StatusCode::CONFLICT, "request_released");

pub const BUYER_SECRET: &str = "test-buyer-secret-of-at-least-32-bytes";

/// The settings of jwt buyers verified with [`BUYER_SECRET`].
pub fn jwt_buyers() -> [(&'static str, &'static str); 2] {
    [("BUYER_AUTH", "jwt"), ("BUYER_JWT_SECRET", BUYER_SECRET)]
}

/// The settings `more`, with a per-user purchase rate of `rate` a second and a burst of
/// `burst`.
pub fn user_rate(
    (rate, burst): (&'static str, &'static str),
    more: &[(&'static str, &'static str)],
) -> Vec<(&'static str, &'static str)> {
    let mut settings = vec![("USER_PURCHASE_RATE", rate), ("USER_PURCHASE_BURST", burst)];
    settings.extend_from_slice(more);
    settings
}

/// `Authorization`'s value for `user`, a jwt buyer for ten minutes.
pub fn as_buyer(user: i64) -> String {
    let key = jsonwebtoken::EncodingKey::from_secret(BUYER_SECRET.as_bytes()).expect("key");
    format!(
        "Bearer {}",
        buyer_token(&key, jsonwebtoken::Algorithm::HS256, user, 600)
    )
}

/// `POST /v1/purchases` of one unit of `product` by the buyer `auth` names.
pub async fn buy_as(
    app: &TestApp,
    auth: &str,
    request_id: &str,
    product: i64,
) -> (StatusCode, Value) {
    let body = json!({"request_id": request_id, "product_id": product, "quantity": 1});
    let (s, b, _) = app
        .send_with(
            reqwest::Method::POST,
            "/v1/purchases",
            Some(body),
            &[("authorization", auth)],
        )
        .await;
    (s, b)
}

pub fn buyer_token(
    key: &jsonwebtoken::EncodingKey,
    algorithm: jsonwebtoken::Algorithm,
    user_id: i64,
    lifetime_secs: i64,
) -> String {
    let exp = jsonwebtoken::get_current_timestamp() as i64 + lifetime_secs;
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(algorithm),
        &json!({"sub": user_id.to_string(), "exp": exp}),
        key,
    )
    .expect("sign a test token")
}

/// The contents of a test key in `tests/it/fixtures`.
pub fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/it/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A new product's definition: `stock` units named "later", its sale opening an hour
/// from now.
pub fn opening_in_an_hour(product_id: i64, stock: i64) -> Value {
    let opens = chrono::Utc::now() + chrono::Duration::hours(1);
    json!({"product_id": product_id, "name": "later", "stock": stock,
           "sale_starts_at": opens.to_rfc3339()})
}

/// The order id of a successful purchase response.
pub fn order_id(body: &Value) -> i64 {
    body["order_id"]
        .as_i64()
        .unwrap_or_else(|| panic!("no order_id in {body}"))
}

/// How many of `answers` (status, body, anything) have `status` and, where given, the
/// error code `error`.
pub fn answered<T>(
    answers: &[(StatusCode, Value, T)],
    status: StatusCode,
    error: Option<&str>,
) -> usize {
    answers
        .iter()
        .filter(|(s, b, _)| *s == status && error.is_none_or(|e| code(b) == e))
        .count()
}

/// The stdout of a run of the binary that must have succeeded (the failure's message
/// shows its stdout and stderr).
pub fn succeeded(out: &std::process::Output) -> String {
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    said
}

pub fn code(body: &Value) -> &str {
    body["error"].as_str().unwrap_or("")
}

/// Asserts that `answer` (status, body) is the refusal `expected`: its status and the
/// error code (the answer's body in the message). Returns the body.
#[track_caller]
pub fn assert_error((status, body): (StatusCode, Value), expected: (StatusCode, &str)) -> Value {
    assert_eq!((status, code(&body)), expected, "{body}");
    body
}

/// The stderr of a run of the binary that must have failed (the failure's message shows
/// its stdout).
pub fn failed(out: &std::process::Output) -> String {
    assert!(
        !out.status.success(),
        "succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Cleans up instances, the last spawned first: the first instance owns the stores the
/// ones beside it use. Each is owned, or shared with tasks that have finished.
pub async fn cleanup_all<A, I>(apps: I)
where
    A: Into<std::sync::Arc<TestApp>>,
    I: IntoIterator<Item = A>,
    I::IntoIter: DoubleEndedIterator,
{
    for app in apps.into_iter().rev() {
        std::sync::Arc::try_unwrap(app.into())
            .ok()
            .expect("no buyer left")
            .cleanup()
            .await;
    }
}

// ---- events (outbox → NATS JetStream → sales_stats) -----------------------------------

/// The shared NATS JetStream server on this machine.
/// The JetStream stream of a binary started by a test with Redis prefix `prefix`, its
/// subjects' prefix in lower case: its own on the shared NATS, deleted at the end.
pub fn stream_name(prefix: &str) -> String {
    prefix.trim_end_matches(':').to_uppercase()
}

/// The gate adapter on the shared Redis, its keys under `prefix` (a test's service's
/// own): 1-hour records, 1-second bounds, a 250 ms sold-out lease.
pub fn gate_on_shared_redis(prefix: &str) -> flashsale_redis::RedisGate {
    flashsale_redis::RedisGate::new(&flashsale_redis::GateConfig {
        target: flashsale_redis::Target::Node(REDIS_URL.into()),
        prefix: prefix.to_owned(),
        record_ttl: Duration::from_secs(3600),
        response_timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(1),
        sold_out_lease: Duration::from_millis(250),
        shared_user_rate: None,
    })
    .expect("gate")
}

/// Creates product 1, named "x", with `stock` units, on the service at `base` (a spawned
/// binary) with the admin token `token`; it must answer 201.
pub async fn create_product_1(http: &reqwest::Client, base: &str, token: &str, stock: i64) {
    let created = http
        .post(format!("{base}/v1/products"))
        .bearer_auth(token)
        .json(&json!({"product_id": 1, "name": "x", "stock": stock}))
        .send()
        .await
        .expect("create");
    assert_eq!(created.status(), 201);
}

/// The settings that give a spawned service its own stream, and subjects, on the shared
/// NATS: named after its Redis key `prefix` (see [`stream_name`]).
pub fn own_stream(prefix: &str) -> [(&'static str, String); 2] {
    [
        (
            "FLASHSALE_NATS_SUBJECT_PREFIX",
            stream_name(prefix).to_lowercase(),
        ),
        ("FLASHSALE_NATS_STREAM", stream_name(prefix)),
    ]
}

/// The `sections` of Redis's `INFO` on `conn`, as it prints them.
pub async fn redis_info(conn: &mut impl redis::aio::ConnectionLike, sections: &[&str]) -> String {
    redis::cmd("INFO")
        .arg(sections)
        .query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("INFO {sections:?}: {e}"))
}

/// A connection to the Redis at `url` (a node of a cluster, or the shared one).
pub async fn redis_conn(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap_or_else(|e| panic!("redis url {url}: {e}"))
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

pub const NATS_URL: &str = "nats://127.0.0.1:4222";

/// A client of the broker at `nats_url`: one `nats://host:port`, or several of a cluster
/// separated by commas, as `FLASHSALE_NATS_URL` takes them.
pub async fn nats_connect(nats_url: &str) -> Result<async_nats::Client, async_nats::ConnectError> {
    async_nats::connect(nats_url.split(',').collect::<Vec<_>>()).await
}

/// Deletes a test's own JetStream `stream` on the broker at `nats_url`, when it is
/// reachable: every test that starts event workers or a `serve` on the shared NATS ends
/// with this, so that a run of the suite leaves no stream behind.
pub async fn delete_stream(nats_url: &str, stream: &str) {
    if let Ok(client) = nats_connect(nats_url).await {
        let _ = async_nats::jetstream::new(client)
            .delete_stream(stream)
            .await;
    }
}

/// One test's event workers (relay and consumer, as `serve` runs them) and the NATS names
/// only this test uses: its own subject prefix and stream, so tests never share a stream
/// (two streams may not capture the same subjects) and each reads back only its events.
pub struct TestEvents {
    pub workers: Option<flashsale_nats::EventWorkers>,
    pub nats_url: String,
    pub subject_prefix: String,
    pub stream: String,
}

impl TestEvents {
    /// Starts the event workers of `app`'s database against the broker at `nats_url` (one
    /// server, or several of a cluster separated by commas), with a subject prefix and
    /// stream named after the app's unique Redis prefix.
    pub async fn start(app: &TestApp, nats_url: &str) -> Self {
        Self::start_with(app, nats_url, &[]).await
    }

    /// A service ([`TestApp::spawn`]) with its event workers [`start`](Self::start)ed on
    /// the shared NATS, then `product_id` created with `stock` units.
    pub async fn selling(product_id: i64, stock: i64) -> (TestApp, Self) {
        let app = TestApp::spawn().await;
        let events = Self::start(&app, NATS_URL).await;
        app.create_product(product_id, stock, None).await;
        (app, events)
    }

    /// [`start`](Self::start) with more settings (`FLASHSALE_*` variables).
    pub async fn start_with(app: &TestApp, nats_url: &str, settings: &[(&str, &str)]) -> Self {
        let tag = app
            .prefix
            .trim_start_matches("fs_test_")
            .trim_end_matches(':');
        let subject_prefix = format!("fs_test_{tag}");
        let stream = format!("FS_TEST_{tag}");
        let db = app.db.as_ref().expect("test database");
        let mut env = HashMap::from([
            ("FLASHSALE_DATABASE_URL".to_owned(), db.url()),
            ("FLASHSALE_NATS_URL".to_owned(), nats_url.to_owned()),
            (
                "FLASHSALE_NATS_SUBJECT_PREFIX".to_owned(),
                subject_prefix.clone(),
            ),
            ("FLASHSALE_NATS_STREAM".to_owned(), stream.clone()),
        ]);
        env.extend(settings.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let config = Config::from_parts(None, &env).expect("valid events config");
        let workers = flashsale::start_events(&config, app.metrics.clone())
            .await
            .expect("start event workers");
        Self {
            workers: Some(workers),
            nats_url: nats_url.to_owned(),
            subject_prefix,
            stream,
        }
    }

    /// A JetStream context of the test's own (not the service's connection).
    pub async fn jetstream(&self) -> async_nats::jetstream::Context {
        let client = nats_connect(&self.nats_url).await.expect("connect to nats");
        async_nats::jetstream::new(client)
    }

    /// Every message in the test's stream, in stream order, as JetStream stored it: its
    /// headers, subject, body and the time its leader stored it.
    pub async fn stream_stored(&self) -> Vec<async_nats::jetstream::message::StreamMessage> {
        let js = self.jetstream().await;
        let stream = js.get_stream(&self.stream).await.expect("test stream");
        let state = stream.get_info().await.expect("stream info").state;
        let mut out = Vec::new();
        if state.messages == 0 {
            return out;
        }
        for seq in state.first_sequence..=state.last_sequence {
            out.push(stream.get_raw_message(seq).await.expect("stream message"));
        }
        out
    }

    /// Every message in the test's stream, in stream order: (Nats-Msg-Id, subject, body).
    pub async fn stream_messages(&self) -> Vec<(String, String, Vec<u8>)> {
        self.stream_stored()
            .await
            .into_iter()
            .map(|m| {
                let id = m
                    .headers
                    .get("Nats-Msg-Id")
                    .map(|v| v.as_str().to_owned())
                    .unwrap_or_default();
                (id, m.subject.to_string(), m.payload.to_vec())
            })
            .collect()
    }

    /// Stops the workers (as `serve` does on shutdown).
    pub async fn stop(&mut self) {
        if let Some(workers) = self.workers.take() {
            workers.stop().await;
        }
    }

    /// Stops the workers and deletes the test's stream and its dead-letter stream (when
    /// the broker is reachable).
    pub async fn cleanup(mut self) {
        self.stop().await;
        delete_stream(&self.nats_url, &self.stream).await;
        delete_stream(&self.nats_url, &format!("{}_DEAD", self.stream)).await;
    }
}

/// Polls `check` every 100 ms until it returns true; fails the test after `bound`.
pub async fn wait_until<F, Fut>(what: &str, bound: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < bound, "{what}: not within {bound:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
