//! The `flashsale` binary as a user runs it: command line, configuration errors, logs,
//! startup (database creation and migrations) and draining on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use flashsale_testkit::{delete_prefix, free_port, redis_prefix, TcpProxy, TestDb};
use serde_json::json;

use crate::helpers::{
    create_product_1, delete_stream, own_stream, redis_addr, stream_name, TestApp, MYSQL_SERVER,
    NATS_URL, REDIS_URL,
};

const BIN: &str = env!("CARGO_BIN_EXE_flashsale");
/// How long the binary may take to start answering (it creates its database and migrates).
const STARTUP_MAX: Duration = Duration::from_secs(30);

// Checks `--help` works on the binary and on every subcommand, and names each command;
// `serve --help` lists the main settings and names the document of all of them.
#[test]
fn help_on_every_subcommand() {
    for args in [
        &["--help"][..],
        &["serve", "--help"],
        &["migrate", "--help"],
        &["demo", "--help"],
    ] {
        let out = Command::new(BIN)
            .args(args)
            .output()
            .expect("run flashsale");
        assert!(out.status.success(), "{args:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Usage"), "{args:?}: {text}");
    }
    let out = Command::new(BIN).arg("--help").output().expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("serve") && text.contains("migrate"), "{text}");
    // `serve --help` names the settings a first run needs and where all of them are.
    let out = Command::new(BIN)
        .args(["serve", "--help"])
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    for needed in [
        "FLASHSALE_LISTEN",
        "FLASHSALE_ADMIN_TOKEN",
        "FLASHSALE_DATABASE_URL",
        "FLASHSALE_REDIS_URL",
        "FLASHSALE_NATS_URL",
        "docs/configuration.md",
    ] {
        assert!(text.contains(needed), "no {needed} in:\n{text}");
    }
}

// Checks `flashsale --help` opens with what the service is, for its user (not the
// package description written for developers).
#[test]
fn help_opens_with_what_the_service_is() {
    let out = Command::new(BIN).arg("--help").output().expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("flashsale — a flash-sale inventory service"),
        "{text}"
    );
    assert!(!text.contains("wiring"), "{text}");
}

// Checks a bad configuration value stops startup before anything runs, with exit code 2
// and a message naming the variable (for each case, the variables it sets; the API
// listens on 127.0.0.1:8080 in all of them).
#[test]
fn bad_config_stops_startup_naming_the_variable() {
    for (var, value) in [
        ("FLASHSALE_PAYMENT_TIMEOUT", "soon"),
        ("FLASHSALE_MAX_QUANTITY_PER_ORDER", "-1"),
        ("FLASHSALE_METRICS_LISTEN", "nowhere"),
        ("FLASHSALE_METRICS_LISTEN", "127.0.0.1:8080"),
        ("FLASHSALE_METRICS_LISTEN", "0.0.0.0:8080"),
        ("FLASHSALE_LISTEN", "not-an-address"),
    ] {
        let out = Command::new(BIN)
            .arg("serve")
            .env("FLASHSALE_LISTEN", "127.0.0.1:8080")
            .env(var, value)
            .output()
            .expect("run flashsale");
        assert_eq!(out.status.code(), Some(2), "{var}={value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(var), "{var}={value}: {err}");
    }
}

/// `GET url`'s answer, whatever its status.
async fn get(http: &reqwest::Client, url: String) -> reqwest::Response {
    http.get(&url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

// Checks the logs of a command whose stderr is not a terminal (here a pipe, as with a
// redirect to a file): they are on stderr, in plain text with no colour escape codes,
// and stdout stays clear of them.
#[tokio::test]
async fn logs_go_to_stderr_without_colour_when_not_a_terminal() {
    let db = TestDb::create(MYSQL_SERVER).await.expect("test db");
    let out = Command::new(BIN)
        .arg("migrate")
        .env("FLASHSALE_DATABASE_URL", db.url())
        .env("FLASHSALE_LOG_FORMAT", "text")
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .output()
        .expect("run flashsale migrate");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("migrations applied"), "{stderr}");
    assert!(!stderr.contains('\x1b'), "colour escape codes: {stderr:?}");
    assert!(stdout.is_empty(), "on stdout: {stdout}");
    let _ = db.drop_db().await;
}

// Checks `flashsale reconcile`'s exit codes, which alerting reads: 0 with no drift, 1 with
// drift injected into Redis (+2 units) and no --repair, 0 once --repair fixed it (after
// which Redis is back to the stock), and 2 when the check cannot complete (a product
// that does not exist).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_exit_code_says_whether_drift_is_left() {
    let app = TestApp::spawn().await;
    let product = 2600;
    app.create_product(product, 10, None).await;
    let reconcile = |args: &[&str]| {
        Command::new(BIN)
            .arg("reconcile")
            .args(args)
            .env(
                "FLASHSALE_DATABASE_URL",
                app.db.as_ref().expect("the test's database").url(),
            )
            .env("FLASHSALE_REDIS_URL", REDIS_URL)
            .env("FLASHSALE_REDIS_PREFIX", &app.prefix)
            .env("RUST_LOG", "warn")
            .output()
            .expect("run flashsale reconcile")
    };
    let id = product.to_string();
    let out = reconcile(&["--product", &id]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "no drift: {text}");
    assert!(text.contains("drift 0"), "{text}");

    app.bump_entry(product, "avail", 2).await;
    let out = reconcile(&["--product", &id]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "drift left: {text}");
    assert!(text.contains("drift 2"), "{text}");

    let out = reconcile(&["--product", &id, "--repair"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "drift repaired: {text}");
    assert!(text.contains("repaired"), "{text}");
    assert_eq!(app.redis_available(product).await, Some(10));

    let out = reconcile(&["--product", "2601"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "unknown product: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    app.cleanup().await;
}

// Checks the service as started from the command line: with a database that does not
// exist yet (created and migrated at start), JSON logs that announce a generated admin
// token once, a product created with that token, `GET /metrics` on its own listener
// (FLASHSALE_METRICS_LISTEN; the API's address answers it 404), and SIGTERM draining a request in
// flight: a purchase stuck on a hanging Redis still gets its answer (503, not a dropped
// connection) and the process then exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_creates_database_logs_json_and_drains_on_sigterm() {
    let db = TestDb::create(MYSQL_SERVER).await.expect("test db");
    // Use a database name that does not exist yet: serve must create it.
    let fresh_name = format!("{}_fresh", db.name());
    let database_url = format!("{MYSQL_SERVER}/{fresh_name}");
    let prefix = redis_prefix();
    let proxy = TcpProxy::start(redis_addr()).await.expect("proxy");
    let port = free_port();
    // Another free port than the API's (the OS hands out the same one twice only rarely).
    let metrics_port = (0..10)
        .map(|_| free_port())
        .find(|&p| p != port)
        .expect("a second free port");
    let mut child = Command::new(BIN)
        .arg("serve")
        .env("FLASHSALE_LISTEN", format!("127.0.0.1:{port}"))
        .env(
            "FLASHSALE_METRICS_LISTEN",
            format!("127.0.0.1:{metrics_port}"),
        )
        .env("FLASHSALE_DATABASE_URL", &database_url)
        .env("FLASHSALE_REDIS_URL", format!("redis://{}", proxy.addr()))
        .env("FLASHSALE_REDIS_PREFIX", &prefix)
        .env("FLASHSALE_LOG_FORMAT", "json")
        // Its own stream and subjects, so the shared NATS's default stream never sees
        // this test's events.
        .envs(own_stream(&prefix))
        .env_remove("FLASHSALE_ADMIN_TOKEN")
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn flashsale");
    // Logs go to stderr.
    let stderr = child.stderr.take().expect("stderr");
    let (lines_tx, lines_rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let started = Instant::now();
    while http.get(format!("{base}/healthz")).send().await.is_err() {
        assert!(started.elapsed() < STARTUP_MAX, "flashsale did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut logs: Vec<serde_json::Value> = Vec::new();
    while let Ok(line) = lines_rx.try_recv() {
        logs.push(serde_json::from_str(&line).unwrap_or_else(|_| panic!("not JSON: {line}")));
    }
    let tokens: Vec<&str> = logs
        .iter()
        .filter_map(|l| l["fields"]["admin_token"].as_str())
        .collect();
    assert_eq!(
        tokens.len(),
        1,
        "the generated token is logged exactly once: {logs:?}"
    );
    let token = tokens[0].to_owned();

    create_product_1(&http, &base, &token, 5).await;

    let scraped = get(&http, format!("http://127.0.0.1:{metrics_port}/metrics")).await;
    assert_eq!(scraped.status(), 200);
    let text = scraped.text().await.expect("metrics text");
    assert!(
        text.contains(
            r#"flashsale_http_responses_total{endpoint="create_product",outcome="created"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(r#"flashsale_store_up{store="mariadb"} 1"#),
        "{text}"
    );
    let on_api = get(&http, format!("{base}/metrics")).await;
    assert_eq!(on_api.status(), 404);

    // A purchase in flight when SIGTERM arrives: Redis hangs, so it waits for its timeout.
    proxy.blackhole();
    let in_flight = tokio::spawn({
        let http = http.clone();
        let base = base.clone();
        async move {
            http.post(format!("{base}/v1/purchases"))
                .json(&json!({"request_id": "R1", "user_id": 1, "product_id": 1, "quantity": 1}))
                .send()
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pid = child.id().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    let answer = in_flight
        .await
        .expect("join")
        .expect("the in-flight request was answered");
    assert_eq!(answer.status(), 503, "answered while draining");
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("wait");
    assert!(status.success(), "exit status {status:?}");

    let pool = sqlx::MySqlPool::connect(&database_url)
        .await
        .expect("fresh db exists");
    let products: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM products")
        .fetch_one(&pool)
        .await
        .expect("migrated schema");
    assert_eq!(products, 1);
    sqlx::query(&format!("DROP DATABASE `{fresh_name}`"))
        .execute(&pool)
        .await
        .expect("drop");
    pool.close().await;
    let _ = delete_prefix(REDIS_URL, &prefix).await;
    delete_stream(NATS_URL, &stream_name(&prefix)).await;
    let _ = db.drop_db().await;
}

// Checks that SIGTERM drops no request already on its way: 200 clients open connections
// to the running server, SIGTERM is sent, and 20 ms later each client sends
// `GET /healthz` on its connection. Every one must get a whole answer, not a reset or an
// empty reply: a connection with no request in flight at the stop waits a moment
// (`STOP_IDLE_GRACE`, 250 ms) for one before it closes, and one the kernel still held in
// the listen backlog is taken in and served. The process then exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_requests_already_on_their_way() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const CLIENTS: usize = 200;
    let db = TestDb::create(MYSQL_SERVER).await.expect("test db");
    let prefix = redis_prefix();
    let port = free_port();
    let mut child = serve_quietly(port, &db, &prefix, &[]).await;
    let mut streams = Vec::new();
    for _ in 0..CLIENTS {
        streams.push(
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .expect("connect"),
        );
    }
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(status.success());
    tokio::time::sleep(Duration::from_millis(20)).await;
    let answers = streams.into_iter().map(|mut stream| async move {
        let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        if stream.write_all(request).await.is_err() {
            return false;
        }
        let mut answer = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer));
        matches!(read.await, Ok(Ok(_)))
            && answer.starts_with(b"HTTP/1.1 200")
            && answer.ends_with(b"}")
    });
    let answered = futures::future::join_all(answers)
        .await
        .into_iter()
        .filter(|ok| *ok)
        .count();
    println!(
        "requests sent 20 ms after SIGTERM on open connections: {answered} of {CLIENTS} answered"
    );
    assert_eq!(answered, CLIENTS);
    let status = child.wait().expect("flashsale exits");
    assert!(status.success(), "{status:?}");
    let _ = delete_prefix(REDIS_URL, &prefix).await;
    delete_stream(NATS_URL, &stream_name(&prefix)).await;
    let _ = db.drop_db().await;
}

// Checks that SIGTERM waits for a request in flight through both of its deadlines, the
// body's and then the use case's, each the request timeout (2 s here): a purchase whose
// body trickles in over 1.8 s, SIGTERM 0.2 s into it, and a use case slowed by 1.5 s
// after its reservation (the failpoint `purchase-after-reserve`) answers 201 about 3.4 s
// after it began, and the process then exits 0. A drain of one request timeout and a
// second ended 3.2 s after it began and closed the connection with no answer at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_waits_for_a_slow_body_and_its_use_case() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let db = TestDb::create(MYSQL_SERVER).await.expect("test db");
    let prefix = redis_prefix();
    let port = free_port();
    let settings = [
        ("FLASHSALE_REQUEST_TIMEOUT", "2s"),
        ("FAILPOINTS", "purchase-after-reserve=sleep(1500)"),
    ];
    let mut child = serve_quietly(port, &db, &prefix, &settings).await;
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    create_product_1(&http, &base, QUIET_TOKEN, 5).await;

    let body =
        json!({"request_id": "R_slow", "user_id": 1, "product_id": 1, "quantity": 1}).to_string();
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let head = format!(
        "POST /v1/purchases HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.expect("head");
    let began = Instant::now();
    // The body in nine pieces, 0.2 s apart: the last one 1.8 s after the head.
    let pieces: Vec<&[u8]> = body.as_bytes().chunks(body.len().div_ceil(9)).collect();
    for (i, piece) in pieces.iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if i == 0 {
            let killed = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status()
                .expect("kill -TERM");
            assert!(killed.success());
        }
        stream.write_all(piece).await.expect("a piece of the body");
    }
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(15), stream.read_to_end(&mut answer))
        .await
        .expect("the connection ends")
        .expect("read the answer");
    let answer = String::from_utf8_lossy(&answer);
    println!("answered {:?} after the head: {answer:?}", began.elapsed());
    assert!(
        answer.starts_with("HTTP/1.1 201"),
        "the purchase is answered, not cut off: {answer:?}"
    );
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("wait");
    assert!(status.success(), "exit status {status:?}");
    let _ = delete_prefix(REDIS_URL, &prefix).await;
    delete_stream(NATS_URL, &stream_name(&prefix)).await;
    let _ = db.drop_db().await;
}

/// The admin token of [`serve_quietly`]'s service.
const QUIET_TOKEN: &str = "binary-test-admin-token";

/// `flashsale serve` on `port` with the test's own database, Redis prefix and JetStream
/// stream, the admin token [`QUIET_TOKEN`], its output discarded and `settings` besides;
/// returned once it answers `/readyz`.
async fn serve_quietly(
    port: u16,
    db: &TestDb,
    prefix: &str,
    settings: &[(&str, &str)],
) -> std::process::Child {
    let child = Command::new(BIN)
        .arg("serve")
        .env("FLASHSALE_LISTEN", format!("127.0.0.1:{port}"))
        .env("FLASHSALE_DATABASE_URL", db.url())
        .env("FLASHSALE_REDIS_URL", REDIS_URL)
        .env("FLASHSALE_REDIS_PREFIX", prefix)
        .envs(own_stream(prefix))
        .env("FLASHSALE_ADMIN_TOKEN", QUIET_TOKEN)
        .envs(settings.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn flashsale");
    let http = reqwest::Client::new();
    let started = Instant::now();
    while http
        .get(format!("http://127.0.0.1:{port}/readyz"))
        .send()
        .await
        .is_err()
    {
        assert!(started.elapsed() < STARTUP_MAX, "flashsale did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    child
}
