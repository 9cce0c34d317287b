//! A flashsale instance per test, served on 127.0.0.1:0 over real HTTP, with its own
//! database and Redis key prefix, plus direct connections for checking the stores.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use flashsale::Config;
use flashsale_testkit::{delete_prefix, redis_prefix, TestDb};
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

pub fn redis_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 6379))
}

pub fn mysql_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 3306))
}

/// Where the service under test reaches its stores (tests may route it through proxies).
#[derive(Default)]
pub struct Routes {
    pub redis: Option<SocketAddr>,
    pub mysql: Option<SocketAddr>,
}

pub struct TestApp {
    pub base: String,
    pub http: reqwest::Client,
    pub db: Option<TestDb>,
    /// Direct connections for checks, never through a test's proxy.
    pub pool: MySqlPool,
    pub redis: MultiplexedConnection,
    pub prefix: String,
    /// The instance's workers and checks, driven by tests one pass at a time.
    pub maintenance: std::sync::Arc<flashsale_app::Maintenance>,
    server: JoinHandle<()>,
}

impl TestApp {
    pub async fn spawn() -> Self {
        Self::spawn_with(Routes::default(), &[]).await
    }

    /// Starts a service whose stores are reached through `routes`, with extra
    /// `FLASHSALE_*` settings.
    pub async fn spawn_with(routes: Routes, settings: &[(&str, &str)]) -> Self {
        let db = TestDb::create(MYSQL_SERVER)
            .await
            .expect("create test database");
        let prefix = redis_prefix();
        let database_url = match routes.mysql {
            Some(addr) => db.url_via(addr),
            None => db.url(),
        };
        let redis_url = match routes.redis {
            Some(addr) => format!("redis://{addr}"),
            None => REDIS_URL.to_owned(),
        };
        let mut env: HashMap<String, String> = HashMap::from([
            ("FLASHSALE_DATABASE_URL".into(), database_url),
            ("FLASHSALE_REDIS_URL".into(), redis_url),
            ("FLASHSALE_REDIS_PREFIX".into(), prefix.clone()),
            ("FLASHSALE_ADMIN_TOKEN".into(), ADMIN_TOKEN.into()),
        ]);
        for (k, v) in settings {
            env.insert(format!("FLASHSALE_{k}"), (*v).to_owned());
        }
        let config = Config::from_parts(None, &env).expect("valid test config");
        let app = flashsale::build(&config).await.expect("build app");
        let maintenance = app.maintenance.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app.router).await;
        });
        let pool = MySqlPool::connect(&db.url()).await.expect("check pool");
        let client = redis::Client::open(REDIS_URL).expect("redis url");
        let redis = client
            .get_multiplexed_async_connection()
            .await
            .expect("redis");
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(512)
            .build()
            .expect("http client");
        Self {
            base: format!("http://{addr}"),
            http,
            db: Some(db),
            pool,
            redis,
            prefix,
            maintenance,
            server,
        }
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
        let body = json!({"request_id": request_id, "user_id": user_id, "product_id": product_id, "quantity": quantity}).to_string();
        let started = Instant::now();
        let mut unknowns = 0;
        loop {
            let sent = self
                .send(reqwest::Method::POST, "/v1/purchases", Some(&body), false)
                .await;
            match sent {
                Ok((status, value)) if status != StatusCode::SERVICE_UNAVAILABLE => {
                    return (status, value, unknowns)
                }
                Ok(_) | Err(_) => {
                    unknowns += 1;
                    assert!(
                        started.elapsed() < RETRY_FOR,
                        "request {request_id} still unknown after {RETRY_FOR:?}"
                    );
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
            }
        }
    }

    pub fn key(&self, product_id: i64, suffix: &str) -> String {
        format!("{}{{p:{product_id}}}:{suffix}", self.prefix)
    }

    pub async fn redis_available(&self, product_id: i64) -> Option<i64> {
        let mut conn = self.redis.clone();
        redis::cmd("HGET")
            .arg(self.key(product_id, "inv"))
            .arg("avail")
            .query_async(&mut conn)
            .await
            .expect("redis HGET")
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

    pub async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(&self.pool)
            .await
            .expect(sql)
    }

    pub async fn cleanup(mut self) {
        self.server.abort();
        self.pool.close().await;
        let _ = delete_prefix(REDIS_URL, &self.prefix).await;
        if let Some(db) = self.db.take() {
            let _ = db.drop_db().await;
        }
    }
}

/// The order id of a successful purchase response.
pub fn order_id(body: &Value) -> i64 {
    body["order_id"]
        .as_i64()
        .unwrap_or_else(|| panic!("no order_id in {body}"))
}

pub fn code(body: &Value) -> &str {
    body["error"].as_str().unwrap_or("")
}
