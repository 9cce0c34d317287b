//! Buyer-scoped request_ids (I3 with buyers authenticated): with `jwt` (and `header`),
//! idempotency is keyed by (buyer, request_id), so another buyer's request_id is a new
//! purchase of one's own that reveals nothing; the ledger records which form its keys
//! take, refuses an instance of the other form, and `flashsale ledger rescope` moves a
//! ledger from one form to the other.

use std::time::Duration;

use futures::future::join_all;
use reqwest::{Method, StatusCode};
use serde_json::Value;

use flashsale_testkit::TestDb;

use crate::helpers::{
    as_buyer, buy_as, cleanup_all, code, failed, jwt_buyers, order_id, succeeded, TestApp,
    BUYER_SECRET, MYSQL_SERVER,
};

/// Attempts of the same-id races: the 200-way race.
const RACE: i64 = 200;
/// Retries of a purchase that met a gate being rebuilt: 10 s at 100 ms apart, far more
/// than a rebuild takes.
const RETRIES: usize = 100;

/// [`buy`] as a well-behaved client: again after each 503 (outcome unknown), at most
/// [`RETRIES`] times.
async fn buy_until_known(
    app: &TestApp,
    auth: &str,
    request_id: &str,
    product: i64,
) -> (StatusCode, Value) {
    for _ in 0..RETRIES {
        let (s, b) = buy_as(app, auth, request_id, product).await;
        if s != StatusCode::SERVICE_UNAVAILABLE {
            return (s, b);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    buy_as(app, auth, request_id, product).await
}

/// Runs the binary with `args` under `settings`, which must refuse, saying `why`.
fn refused(app: &TestApp, args: &[&str], settings: &[(&str, &str)], why: &str) {
    let said = failed(&app.run_binary(args, settings));
    assert!(said.contains(why), "{said}");
}

async fn get(app: &TestApp, auth: &str, path: &str) -> (StatusCode, Value) {
    let (s, b, _) = app
        .send_with(Method::GET, path, None, &[("authorization", auth)])
        .await;
    (s, b)
}

// Checks, with jwt buyers, that a request_id is each buyer's own: Bob reading Alice's
// request_id finds nothing (404, as for an unused id); Bob buying with it gets a purchase
// of his own (201, another order, answered with the request_id as he sent it); each
// retry finds its own buyer's order (200); Bob squatting an id (buy, cancel) does not
// stop Alice using it later (201); a used id and a fresh one get the same answer from
// another buyer, so nothing leaks. The ledger holds the scoped keys, and the unique key
// holds under the 200-way race of one buyer's id (one 201, one order), while 200 buyers
// racing with one id each get their own order.
#[tokio::test]
async fn request_ids_are_each_buyers_own() {
    let app = TestApp::selling_with(&jwt_buyers(), (9501, 1_000, None)).await;
    let (alice, bob) = (as_buyer(31), as_buyer(32));

    let (s, a) = buy_as(&app, &alice, "SHARED_1", 9501).await;
    assert_eq!(s, StatusCode::CREATED, "{a}");
    let (s, b) = get(&app, &bob, "/v1/purchases/SHARED_1").await;
    assert_eq!(
        (s, code(&b)),
        (StatusCode::NOT_FOUND, "order_not_found"),
        "{b}"
    );
    let (s, b) = buy_as(&app, &bob, "SHARED_1", 9501).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    assert_ne!(order_id(&a), order_id(&b));
    assert_eq!(
        (b["request_id"].as_str(), b["user_id"].as_i64()),
        (Some("SHARED_1"), Some(32))
    );
    for (who, first) in [(&alice, &a), (&bob, &b)] {
        let (s, again) = buy_as(&app, who, "SHARED_1", 9501).await;
        assert_eq!(
            (s, order_id(&again)),
            (StatusCode::OK, order_id(first)),
            "{again}"
        );
        let (s, read) = get(&app, who, "/v1/purchases/SHARED_1").await;
        assert_eq!(
            (s, order_id(&read)),
            (StatusCode::OK, order_id(first)),
            "{read}"
        );
    }

    // Squatting: Bob takes an id first and cancels; Alice's purchase with it is hers.
    let (s, squat) = buy_as(&app, &bob, "SQUAT_1", 9501).await;
    assert_eq!(s, StatusCode::CREATED, "{squat}");
    let cancel = format!("/v1/orders/{}/cancel", order_id(&squat));
    let (s, _, _) = app
        .send_with(Method::POST, &cancel, None, &[("authorization", &bob)])
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, mine) = buy_as(&app, &alice, "SQUAT_1", 9501).await;
    assert_eq!(
        (s, mine["status"].as_str()),
        (StatusCode::CREATED, Some("PENDING_PAYMENT")),
        "{mine}"
    );

    // No oracle: another buyer's used id and a fresh id answer alike, here for a product
    // that does not exist (the answer a probe would compare).
    let carol = as_buyer(33);
    let (used, _) = buy_as(&app, &carol, "SHARED_1", 9599).await;
    let (fresh, _) = buy_as(&app, &carol, "NEVER_USED_1", 9599).await;
    assert_eq!(used, fresh);
    let keys: Vec<String> = sqlx::query_scalar(
        "SELECT CONVERT(request_id USING utf8mb4) FROM orders \
         WHERE request_id LIKE '%SHARED_1' ORDER BY request_id",
    )
    .fetch_all(&app.pool)
    .await
    .expect("keys");
    assert_eq!(keys, ["31/SHARED_1", "32/SHARED_1"]);

    same_id_races(&app).await;
    app.cleanup().await;
}

/// One buyer's id sent 200 times at once: one 201, the rest 200 with the same order,
/// one order row. Then 200 buyers with one id between them: 200 orders, one each.
async fn same_id_races(app: &TestApp) {
    let dave = as_buyer(34);
    let answers = join_all((0..RACE).map(|_| buy_as(app, &dave, "RACE_1", 9501))).await;
    let created = answers
        .iter()
        .filter(|(s, _)| *s == StatusCode::CREATED)
        .count();
    assert_eq!(created, 1, "one purchase: {answers:?}");
    let first = order_id(&answers[0].1);
    for (s, b) in &answers {
        assert!(s.is_success(), "{s} {b}");
        assert_eq!(order_id(b), first, "{b}");
    }
    let tokens: Vec<String> = (0..RACE).map(|i| as_buyer(1_000 + i)).collect();
    let answers = join_all(tokens.iter().map(|t| buy_as(app, t, "RACE_2", 9501))).await;
    assert!(
        answers.iter().all(|(s, _)| *s == StatusCode::CREATED),
        "{answers:?}"
    );
    let orders = app
        .count("SELECT COUNT(*) FROM orders WHERE request_id LIKE '%/RACE_%'")
        .await;
    assert_eq!(orders, 1 + RACE);
}

// Checks the move of a ledger written without buyer authentication to buyer-scoped keys:
// an instance with jwt buyers refuses to start against it (naming the command); with
// every instance stopped, `flashsale ledger rescope --to buyer` rewrites the keys (the
// orders, reservations, stock log and events, packs included); a jwt instance then
// starts, a buyer's retry of a purchase made before the move is a replay of the same
// order (200, no second order), a new purchase is sold from the rebuilt gate, and the
// audit is clean. Going back to global keys after two buyers used one request_id is
// refused and changes nothing.
#[tokio::test]
async fn a_ledger_moves_to_buyer_scoped_keys() {
    let app = TestApp::selling(9502, 10, None).await;
    for (rid, user) in [("MOVE_1", 41), ("MOVE_2", 42)] {
        app.bought(rid, user, 9502, 1).await;
    }
    let scope = app.run_binary(&["ledger", "scope"], &[]);
    assert_eq!(
        String::from_utf8_lossy(&scope.stdout).trim(),
        "request scope: global"
    );

    let mut settings = jwt_buyers().to_vec();
    settings.push(("LISTEN", "127.0.0.1:0"));
    refused(&app, &["serve"], &settings, "ledger rescope --to buyer");

    let out = succeeded(&app.run_binary(&["ledger", "rescope", "--to", "buyer"], &[]));
    assert!(
        out.starts_with("request scope: buyer; keys rewritten: purchases 2,"),
        "{out}"
    );
    let stale = app
        .count("SELECT COUNT(*) FROM outbox_event WHERE request_id NOT LIKE '%/%' AND event_type <> 'stock_repaired'")
        .await;
    assert_eq!(stale, 0, "every purchase event carries its new key");

    let scoped = app.spawn_beside(&jwt_buyers()).await;
    let (s, b) = buy_as(&scoped, &as_buyer(41), "MOVE_1", 9502).await;
    assert_eq!(
        (s, b["request_id"].as_str()),
        (StatusCode::OK, Some("MOVE_1")),
        "{b}"
    );
    // The gate's generation is behind the ledger's: the watch (`serve` runs it every
    // few seconds; the test's instances do not) rebuilds it, and sales go on.
    let rebuilt = scoped.maintenance.watch_once().await.expect("watch");
    assert_eq!(rebuilt, 1, "the product's gate is rebuilt from the ledger");
    let (s, b) = buy_until_known(&scoped, &as_buyer(41), "MOVE_3", 9502).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    assert_eq!(app.count("SELECT COUNT(*) FROM orders").await, 3);
    let (s, b) = buy_until_known(&scoped, &as_buyer(43), "MOVE_1", 9502).await;
    assert_eq!(s, StatusCode::CREATED, "another buyer's MOVE_1: {b}");
    succeeded(&app.run_binary(&["audit", "--product", "9502"], &[]));

    refused(
        &app,
        &["ledger", "rescope", "--to", "global"],
        &[],
        "two buyers used the same request_id",
    );
    let kept = app
        .count("SELECT COUNT(*) FROM orders WHERE request_id LIKE '%/%'")
        .await;
    assert_eq!(kept, 4, "a refused rescope changes nothing");
    cleanup_all([app, scoped]).await;
}

// Checks that reading the scope records none: on a ledger no instance has served,
// `flashsale ledger scope` says none is recorded, twice over (the first read wrote
// nothing), and names the form this configuration would record.
#[tokio::test]
async fn reading_the_scope_records_none() {
    let db = TestDb::create(MYSQL_SERVER).await.expect("test database");
    for _ in 0..2 {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_flashsale"))
            .args(["ledger", "scope"])
            .env("FLASHSALE_DATABASE_URL", db.url())
            .env("FLASHSALE_BUYER_AUTH", "jwt")
            .env("FLASHSALE_BUYER_JWT_SECRET", BUYER_SECRET)
            .env("RUST_LOG", "warn")
            .output()
            .expect("run flashsale ledger scope");
        let said = succeeded(&out);
        assert!(
            said.starts_with("request scope: none recorded yet"),
            "{said}"
        );
        assert!(
            said.trim_end().ends_with("this configuration's is buyer)"),
            "{said}"
        );
    }
    db.drop_db().await.expect("drop the test database");
}
