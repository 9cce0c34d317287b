//! Product creation: sale windows across the whole accepted range, and concurrent
//! creations of one product.

use chrono::{DateTime, Utc};
use futures::future::join_all;
use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{code, TestApp};

/// Concurrent creations of one product per round: about what an admin tool retrying in
/// a loop, or several operators, send at once.
const CREATORS: usize = 30;
/// Rounds of them, each on a product of its own: the race the 503 came from lost about
/// one round in five.
const CREATE_ROUNDS: i64 = 5;

fn at(raw: &str) -> DateTime<Utc> {
    raw.parse().expect("RFC 3339")
}

/// A window bound of an answer, parsed.
fn bound(body: &Value, field: &str) -> Option<DateTime<Utc>> {
    body[field]
        .as_str()
        .map(|raw| raw.parse().expect("an RFC 3339 bound"))
}

/// The stored window of a product, as MariaDB writes it, to the microsecond.
async fn stored_window(app: &TestApp, product_id: i64) -> (Option<String>, Option<String>) {
    app.row(
        "SELECT DATE_FORMAT(sale_starts_at, '%Y-%m-%dT%H:%i:%s.%fZ'), \
         DATE_FORMAT(sale_ends_at, '%Y-%m-%dT%H:%i:%s.%fZ') FROM products WHERE product_id = ?",
        product_id,
    )
    .await
}

// Checks sale windows outside TIMESTAMP's 1970–2038 are kept exactly, never dropped: each
// window below is created, and the 201's body, a later GET and the stored columns (read
// as text, to the microsecond) all carry the bounds sent (cut to the microsecond where
// sent in nanoseconds). A window in 2040 (not yet open) and one in 1960–1961 (long over)
// both refuse a purchase now with 409 sale_not_active and leave the gate's count as it
// was; a window from the first to the last instant accepted (1000-01-01 to
// 9999-12-31T23:59:59.999999Z) is open now, and sells.
#[tokio::test]
async fn sale_windows_are_stored_exactly_over_the_whole_range() {
    let app = TestApp::spawn().await;
    // Product, bounds sent, bounds kept, whether the window is open now.
    let windows = [
        (
            3801,
            ("2040-01-01T10:00:00Z", "2040-01-01T12:00:00.123456789Z"),
            ("2040-01-01T10:00:00.000000Z", "2040-01-01T12:00:00.123456Z"),
            false,
        ),
        (
            3802,
            ("1960-01-01T00:00:00Z", "1961-01-01T00:00:00Z"),
            ("1960-01-01T00:00:00.000000Z", "1961-01-01T00:00:00.000000Z"),
            false,
        ),
        (
            3803,
            ("1000-01-01T00:00:00Z", "9999-12-31T23:59:59.999999Z"),
            ("1000-01-01T00:00:00.000000Z", "9999-12-31T23:59:59.999999Z"),
            true,
        ),
    ];
    for (product, (sent_starts, sent_ends), (starts, ends), open) in windows {
        let (s, created) = app
            .admin_post(
                "/v1/products",
                json!({"product_id": product, "name": format!("window {product}"), "stock": 5,
                       "sale_starts_at": sent_starts, "sale_ends_at": sent_ends}),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{created}");
        let (s, read) = app.get(&format!("/v1/products/{product}")).await;
        assert_eq!(s, StatusCode::OK, "{read}");
        for body in [&created, &read] {
            assert_eq!(bound(body, "sale_starts_at"), Some(at(starts)), "{body}");
            assert_eq!(bound(body, "sale_ends_at"), Some(at(ends)), "{body}");
        }
        assert_eq!(
            stored_window(&app, product).await,
            (Some(starts.to_owned()), Some(ends.to_owned()))
        );
        let (s, b) = app
            .purchase(&format!("REQ_window_{product}"), 1, product, 1)
            .await;
        if open {
            assert_eq!(s, StatusCode::CREATED, "{b}");
            assert_eq!(app.redis_available(product).await, Some(4));
        } else {
            assert_eq!(
                (s, code(&b)),
                (StatusCode::CONFLICT, "sale_not_active"),
                "{b}"
            );
            assert_eq!(app.redis_available(product).await, Some(5));
        }
    }
    assert_eq!(app.count("SELECT COUNT(*) FROM orders").await, 1);
    app.cleanup().await;
}

// Checks concurrent creations of one product: in each of CREATE_ROUNDS rounds, CREATORS
// identical creations are sent at once (the case where every duplicate finishes the
// warm-up too); exactly one gets 201 and every other 409 product_exists, never a 503,
// and afterwards the product exists once, its stock loaded into the gate whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creations_have_one_winner() {
    let app = TestApp::spawn().await;
    for round in 0..CREATE_ROUNDS {
        let product = 3900 + round;
        let body = json!({"product_id": product, "name": "contested", "stock": 7});
        let answers =
            join_all((0..CREATORS).map(|_| app.admin_post("/v1/products", body.clone()))).await;
        let created = answers
            .iter()
            .filter(|(s, _)| *s == StatusCode::CREATED)
            .count();
        let exists = answers
            .iter()
            .filter(|(s, b)| *s == StatusCode::CONFLICT && code(b) == "product_exists")
            .count();
        assert_eq!(
            (created, exists),
            (1, CREATORS - 1),
            "round {round}: {:?}",
            answers
                .iter()
                .map(|(s, b)| (s.as_u16(), code(b).to_owned()))
                .collect::<Vec<_>>()
        );
        assert_eq!(app.redis_available(product).await, Some(7));
        let (s, b) = app.get(&format!("/v1/products/{product}")).await;
        assert_eq!(s, StatusCode::OK, "{b}");
        assert_eq!(b["inventory"]["available"], 7, "{b}");
    }
    assert_eq!(
        app.count("SELECT COUNT(*) FROM products WHERE stock_loaded = 1")
            .await,
        CREATE_ROUNDS
    );
    assert_eq!(
        app.count("SELECT COUNT(*) FROM product_inventory").await,
        CREATE_ROUNDS
    );
    app.cleanup().await;
}

/// `Com_stmt_execute` of the server behind `pool`: the prepared statements it ran, every
/// client's together (the test's own reads of it included).
async fn statements_run(pool: &sqlx::MySqlPool) -> i64 {
    let value: String = sqlx::query_scalar(
        "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS \
         WHERE VARIABLE_NAME = 'COM_STMT_EXECUTE'",
    )
    .fetch_one(pool)
    .await
    .expect("status");
    value.parse().expect("a count")
}

// Checks the negative cache: purchases of products that do not exist cost the ledger
// one read per unknown id per second (the cache's time for "no such product"), however
// many arrive at once, concurrent misses of one id sharing one read. How: on a private
// MariaDB (so that its statement count is the service's and this test's alone), 10,000
// purchases of 100 unknown ids, 200 at a time, each id's 100 one after the other, all
// answered 404 `product_not_found`; the prepared statements MariaDB ran meanwhile (its
// own `Com_stmt_execute`) are at most three per id, plus this test's two reads of the
// counter: an id's 100 requests are in flight together, and within the second or two
// they take its entry expires at most twice. (Without the shared read: 417 statements,
// the misses in flight at once each reading.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn misses_of_unknown_products_share_one_read_per_id() {
    const IDS: i64 = 100;
    const REQUESTS: i64 = 10_000;
    let mariadb = flashsale_testkit::PrivateMariadb::start()
        .await
        .expect("private mariadb");
    let app = TestApp::spawn_on_mariadb(&mariadb.url(), &[]).await;
    let before = statements_run(&app.pool).await;
    let started = std::time::Instant::now();
    let answers: Vec<(StatusCode, Value)> = futures::stream::iter(0..REQUESTS)
        .map(|n| {
            let app = &app;
            async move {
                // Each id's requests one after the other, so that those in flight at once
                // are mostly of the same id or two.
                let product = 90_000 + n / (REQUESTS / IDS);
                app.purchase(&format!("miss-{n}"), 1 + n, product, 1).await
            }
        })
        .buffer_unordered(200)
        .collect()
        .await;
    let took = started.elapsed();
    let reads = statements_run(&app.pool).await - before;
    for (status, body) in &answers {
        assert_eq!(*status, StatusCode::NOT_FOUND, "{body}");
        assert_eq!(code(body), "product_not_found", "{body}");
    }
    println!("{REQUESTS} purchases of {IDS} unknown products in {took:?}: {reads} statements");
    assert!(
        reads <= IDS * 3 + 2,
        "{reads} statements for {REQUESTS} misses of {IDS} ids in {took:?}"
    );
    app.cleanup().await;
}
