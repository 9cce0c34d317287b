//! The benchmark baselines' stored procedures (migration 12) on the real MariaDB, through
//! the adapter that calls them (`BaselineLedger`): what each answers, and what each
//! writes, for a new purchase, a replay and a sold-out product.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test's failed expectation is its failure, with the expectation's message"
)]

use std::time::Duration;

use flashsale_app::baseline::{BaselineLedger, BaselineOutcome};
use flashsale_app::Order;
use flashsale_core::{OrderStatus, PurchaseRequest};
use flashsale_mysql::{LedgerConfig, MysqlLedger};
use flashsale_testkit::TestDb;
use futures::future::join_all;

const SERVER_URL: &str = "mysql://root@127.0.0.1:3306";
const PAYMENT_TIMEOUT: Duration = Duration::from_secs(900);

/// A migrated ledger on a database of its own.
async fn ledger() -> (TestDb, MysqlLedger) {
    let db = TestDb::create(SERVER_URL).await.expect("test database");
    let ledger = MysqlLedger::connect(&LedgerConfig {
        url: db.url(),
        max_connections: 8,
        acquire_timeout: Duration::from_secs(10),
        transaction_timeout: Duration::from_secs(10),
        cluster: None,
    })
    .await
    .expect("ledger");
    ledger.migrate().await.expect("migrations");
    (db, ledger)
}

/// Product `id` with `stock` units on its inventory row, as the ledger creates one.
async fn product(ledger: &MysqlLedger, id: i64, stock: i64) {
    for sql in [
        "INSERT INTO products (product_id, name) VALUES (?, 'baseline test')",
        "INSERT INTO product_inventory (product_id, total_stock, available_stock) \
         VALUES (?, ?, ?)",
    ] {
        sqlx::query(sql)
            .bind(id)
            .bind(stock)
            .bind(stock)
            .execute(&ledger.pool())
            .await
            .expect("create the product");
    }
}

fn request(request_id: &str, user_id: i64, product_id: i64) -> PurchaseRequest {
    PurchaseRequest::parse(request_id, user_id, product_id, 1, 10).expect("a valid request")
}

/// (available_stock, pre_deduct_stock) of the product.
async fn counters(ledger: &MysqlLedger, product_id: i64) -> (i64, i64) {
    sqlx::query_as(
        "SELECT available_stock, pre_deduct_stock FROM product_inventory WHERE product_id = ?",
    )
    .bind(product_id)
    .fetch_one(&ledger.pool())
    .await
    .expect("the inventory row")
}

async fn orders(ledger: &MysqlLedger, product_id: i64) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE product_id = ?")
        .bind(product_id)
        .fetch_one(&ledger.pool())
        .await
        .expect("count orders")
}

#[derive(Clone, Copy, Debug)]
enum Way {
    Pessimistic,
    Conditional,
    InsertOrder,
}

async fn buy(ledger: &MysqlLedger, way: Way, r: &PurchaseRequest) -> BaselineOutcome {
    match way {
        Way::Pessimistic => ledger.purchase_pessimistic(r, PAYMENT_TIMEOUT).await,
        Way::Conditional => ledger.purchase_conditional(r, PAYMENT_TIMEOUT).await,
        Way::InsertOrder => ledger.insert_order(r, PAYMENT_TIMEOUT).await,
    }
    .unwrap_or_else(|e| panic!("{way:?} {}: {e}", r.request_id.as_str()))
}

fn created(way: Way, outcome: BaselineOutcome) -> Order {
    match outcome {
        BaselineOutcome::Created(order) => order,
        other => panic!("{way:?}: expected a new order, got {other:?}"),
    }
}

// Checks each database strategy's procedure (db-pessimistic, db-conditional) through its
// adapter, on a product of 2 units: a purchase is answered with a new PENDING_PAYMENT
// order (the request's fields, expiring the payment timeout after its creation) and takes
// one unit (available 2 -> 1, reserved 0 -> 1); the same request_id again is answered as
// a replay with that same order, field for field, and writes no second order and takes
// no second unit; a second buyer takes the last unit; a third is answered sold out with
// nothing written; a replay once sold out is answered sold out too (the seeds' designs
// take the stock before the unique key is reached) and still writes nothing; an unknown
// product is sold out.
#[tokio::test]
async fn the_database_strategies_answer_created_replay_and_sold_out() {
    let (db, ledger) = ledger().await;
    for (way, p) in [(Way::Pessimistic, 10), (Way::Conditional, 20)] {
        product(&ledger, p, 2).await;
        let first = request(&format!("REQ_{p}_a"), 1, p);
        let order = created(way, buy(&ledger, way, &first).await);
        assert_eq!(order.request_id, first.request_id, "{way:?}");
        assert_eq!(
            (order.user_id, order.product_id, order.quantity),
            (first.user_id, first.product_id, first.quantity),
            "{way:?}"
        );
        assert_eq!(order.status, OrderStatus::PendingPayment, "{way:?}");
        assert_eq!(
            (order.expires_at - order.created_at).to_std().ok(),
            Some(PAYMENT_TIMEOUT),
            "{way:?}"
        );
        assert_eq!(
            (order.paid_at, order.cancelled_at, order.cancel_reason),
            (None, None, None)
        );
        assert_eq!(counters(&ledger, p).await, (1, 1), "{way:?}");

        let replay = buy(&ledger, way, &first).await;
        assert_eq!(replay, BaselineOutcome::Existing(order.clone()), "{way:?}");
        assert_eq!(
            counters(&ledger, p).await,
            (1, 1),
            "{way:?}: no second unit"
        );
        assert_eq!(orders(&ledger, p).await, 1, "{way:?}: no second order");

        created(
            way,
            buy(&ledger, way, &request(&format!("REQ_{p}_b"), 2, p)).await,
        );
        assert_eq!(counters(&ledger, p).await, (0, 2), "{way:?}");
        let late = request(&format!("REQ_{p}_c"), 3, p);
        assert_eq!(buy(&ledger, way, &late).await, BaselineOutcome::SoldOut);
        assert_eq!(buy(&ledger, way, &first).await, BaselineOutcome::SoldOut);
        assert_eq!(counters(&ledger, p).await, (0, 2), "{way:?}");
        assert_eq!(orders(&ledger, p).await, 2, "{way:?}");

        let nowhere = request(&format!("REQ_{p}_x"), 1, 999_000 + p);
        assert_eq!(buy(&ledger, way, &nowhere).await, BaselineOutcome::SoldOut);
        assert_eq!(orders(&ledger, 999_000 + p).await, 0, "{way:?}");
    }
    ledger.pool().close().await;
    db.drop_db().await.expect("drop the test database");
}

// Checks redis-lua's order procedure (the units were taken in Redis): a purchase is
// answered with a new order and leaves the inventory row alone; the same request_id
// again is answered as a replay and writes no second order. The replay reads the order
// as it is now, every column: paid in between (status and paid_at set by SQL), the replay
// answers PAID with that payment time.
#[tokio::test]
async fn the_order_insert_answers_created_and_replay() {
    let (db, ledger) = ledger().await;
    product(&ledger, 30, 5).await;
    let first = request("REQ_30_a", 1, 30);
    let order = created(
        Way::InsertOrder,
        buy(&ledger, Way::InsertOrder, &first).await,
    );
    assert_eq!(
        buy(&ledger, Way::InsertOrder, &first).await,
        BaselineOutcome::Existing(order.clone())
    );
    assert_eq!(orders(&ledger, 30).await, 1);
    assert_eq!(counters(&ledger, 30).await, (5, 0), "the stock is Redis's");

    sqlx::query("UPDATE orders SET status = 'PAID', paid_at = NOW(6) WHERE id = ?")
        .bind(order.order_id.get())
        .execute(&ledger.pool())
        .await
        .expect("pay the order");
    let BaselineOutcome::Existing(paid) = buy(&ledger, Way::InsertOrder, &first).await else {
        panic!("a replay");
    };
    assert_eq!(paid.order_id, order.order_id);
    assert_eq!(paid.status, OrderStatus::Paid);
    assert!(paid.paid_at.is_some_and(|t| t >= order.created_at));
    assert_eq!(orders(&ledger, 30).await, 1);
    ledger.pool().close().await;
    db.drop_db().await.expect("drop the test database");
}

// Checks the conditional procedure under concurrency, by sending 40 buyers for 10 units,
// each request twice at once (80 CALLs on 8 connections): exactly 10 distinct orders, the
// two answers of each request the same (both the order, one created and one a replay, or
// both sold out), the inventory row at 0 available and 10 reserved.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_conditional_procedure_sells_exactly_the_stock_under_concurrency() {
    let (db, ledger) = ledger().await;
    product(&ledger, 40, 10).await;
    let requests: Vec<PurchaseRequest> = (0..40)
        .map(|i| request(&format!("REQ_40_{i}"), i + 1, 40))
        .collect();
    let answers = join_all(requests.iter().map(|r| async {
        let (a, b) = tokio::join!(
            buy(&ledger, Way::Conditional, r),
            buy(&ledger, Way::Conditional, r)
        );
        (a, b)
    }))
    .await;
    let mut sold = std::collections::BTreeSet::new();
    for (a, b) in &answers {
        match (a, b) {
            (BaselineOutcome::SoldOut, BaselineOutcome::SoldOut) => {}
            (BaselineOutcome::Created(x), BaselineOutcome::Existing(y))
            | (BaselineOutcome::Existing(y), BaselineOutcome::Created(x)) => {
                assert_eq!(x, y);
                sold.insert(x.order_id);
            }
            // One of the pair may take the unit and the other find the stock gone before
            // reaching the unique key: a refusal, never a second order.
            (BaselineOutcome::Created(x), BaselineOutcome::SoldOut)
            | (BaselineOutcome::SoldOut, BaselineOutcome::Created(x)) => {
                sold.insert(x.order_id);
            }
            other => panic!("answers {other:?}"),
        }
    }
    assert_eq!(sold.len(), 10);
    assert_eq!(orders(&ledger, 40).await, 10);
    assert_eq!(counters(&ledger, 40).await, (0, 10));
    ledger.pool().close().await;
    db.drop_db().await.expect("drop the test database");
}
