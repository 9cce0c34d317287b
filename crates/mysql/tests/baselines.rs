//! The benchmark baselines' stored procedures (migrations 12 and 30) on the real MariaDB,
//! through the adapter that calls them (`BaselineLedger`): what each answers, and what
//! each writes, for a new purchase, a replay and a sold-out product; the guarded one's
//! per-user limit and version conflicts, and db-optimistic's retry loop under
//! concurrency.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test's failed expectation is its failure, with the expectation's message"
)]

use std::time::Duration;

use flashsale_app::baseline::{
    Baseline, BaselineGate, BaselineLedger, BaselineOutcome, Guard, Guarded, LockToken, StockRead,
    Strategy,
};
use flashsale_app::{Error, GateError, Order};
use flashsale_core::{OrderStatus, ProductId, PurchaseRequest};
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
    sqlx::query("INSERT INTO products (product_id, name) VALUES (?, 'baseline test')")
        .bind(id)
        .execute(&ledger.pool())
        .await
        .expect("create the product");
    sqlx::query(
        "INSERT INTO product_inventory (product_id, total_stock, available_stock) \
         VALUES (?, ?, ?)",
    )
    .bind(id)
    .bind(stock)
    .bind(stock)
    .execute(&ledger.pool())
    .await
    .expect("create the product's inventory");
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

/// Product `id` with `stock` units and a per-user limit, as the ledger creates one.
async fn limited_product(ledger: &MysqlLedger, id: i64, stock: i64, per_user_limit: u32) {
    product(ledger, id, stock).await;
    sqlx::query("UPDATE products SET per_user_limit = ? WHERE product_id = ?")
        .bind(per_user_limit)
        .bind(id)
        .execute(&ledger.pool())
        .await
        .expect("set the limit");
}

async fn guarded(ledger: &MysqlLedger, guard: Guard, r: &PurchaseRequest) -> Guarded {
    ledger
        .purchase_guarded(r, guard, PAYMENT_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{guard:?} {}: {e}", r.request_id.as_str()))
}

async fn stock_read(ledger: &MysqlLedger, r: &PurchaseRequest) -> (StockRead, bool) {
    ledger
        .read_stock(r.product_id, &r.request_id)
        .await
        .expect("read the stock")
        .expect("the product exists")
}

// Checks the guarded procedure (migration 30) under each guard, on a product of 2 units
// and 1 per user: the first read shows the row and no order; a purchase at the version
// read (or under the lock) is a new order that takes one unit and moves the version;
// the same user's second request is limit_exceeded with nothing written; a versioned
// attempt at the stale version is a conflict that names the row as it is now (1 unit,
// the new version) and writes nothing; another user takes the last unit; then a new
// buyer is sold out while the first request_id is still answered with its order (the
// replay is looked up before the stock), and the read reports that order; an unknown
// product reads as none and is sold out.
#[tokio::test]
async fn the_guarded_procedure_answers_replay_limit_conflict_and_sold_out() {
    let (db, ledger) = ledger().await;
    for (p, lock) in [(50, false), (60, true)] {
        limited_product(&ledger, p, 2, 1).await;
        let first = request(&format!("REQ_{p}_a"), 1, p);
        let (row, ordered) = stock_read(&ledger, &first).await;
        assert_eq!((row.available, ordered), (2, false));
        let guard = |version| {
            if lock {
                Guard::Lock
            } else {
                Guard::Version(version)
            }
        };
        let Guarded::Done(BaselineOutcome::Created(order)) =
            guarded(&ledger, guard(row.version), &first).await
        else {
            panic!("{p}: a new order");
        };
        assert_eq!(counters(&ledger, p).await, (1, 1));
        let (now, _) = stock_read(&ledger, &first).await;
        assert_eq!(
            now.version,
            row.version + 1,
            "the deduction moves the version"
        );

        let again = request(&format!("REQ_{p}_b"), 1, p);
        assert_eq!(
            guarded(&ledger, guard(now.version), &again).await,
            Guarded::Done(BaselineOutcome::LimitExceeded)
        );
        assert_eq!(counters(&ledger, p).await, (1, 1), "nothing written");
        if !lock {
            let stale = request(&format!("REQ_{p}_c"), 2, p);
            assert_eq!(
                guarded(&ledger, Guard::Version(row.version), &stale).await,
                Guarded::Conflict(now)
            );
            assert_eq!(orders(&ledger, p).await, 1, "nothing written");
        }
        let last = request(&format!("REQ_{p}_d"), 2, p);
        let Guarded::Done(BaselineOutcome::Created(_)) =
            guarded(&ledger, guard(now.version), &last).await
        else {
            panic!("{p}: the last unit");
        };
        let late = request(&format!("REQ_{p}_e"), 3, p);
        let (gone, _) = stock_read(&ledger, &late).await;
        assert_eq!(
            guarded(&ledger, guard(gone.version), &late).await,
            Guarded::Done(BaselineOutcome::SoldOut)
        );
        assert_eq!(
            guarded(&ledger, guard(gone.version), &first).await,
            Guarded::Done(BaselineOutcome::Existing(order))
        );
        assert!(
            stock_read(&ledger, &first).await.1,
            "the read reports the order"
        );
        assert_eq!(
            (counters(&ledger, p).await, orders(&ledger, p).await),
            ((0, 2), 2)
        );
        let nowhere = request(&format!("REQ_{p}_x"), 1, 999_000 + p);
        assert_eq!(
            ledger
                .read_stock(nowhere.product_id, &nowhere.request_id)
                .await
                .ok(),
            Some(None)
        );
        assert_eq!(
            guarded(&ledger, guard(0), &nowhere).await,
            Guarded::Done(BaselineOutcome::SoldOut)
        );
    }
    ledger.pool().close().await;
    db.drop_db().await.expect("drop the test database");
}

/// Tries of one purchase answered busy (conflicts past db-optimistic's bound) before the
/// test gives up: 160 purchases on one row each meet at most 159 others, so a purchase
/// that stays busy this often is spinning, not unlucky.
const BUSY_RETRIES_MAX: u32 = 200;

/// A gate db-optimistic never calls.
struct NoGate;

#[async_trait::async_trait]
impl BaselineGate for NoGate {
    async fn seed_decrement(&self, _: ProductId, _: u32) -> Result<i64, GateError> {
        unreachable!("db-optimistic takes no stock in Redis")
    }
    async fn try_lock(&self, _: ProductId, _: Duration) -> Result<Option<LockToken>, GateError> {
        unreachable!("db-optimistic takes no lock")
    }
    async fn unlock(&self, _: ProductId, _: &LockToken) -> Result<bool, GateError> {
        unreachable!("db-optimistic takes no lock")
    }
}

// Checks db-optimistic's retry loop (`Baseline`, the server's own) on the real MariaDB
// under concurrency: 60 buyers, 20 of them with two requests and a limit of 2 units
// each, buy a product of 25 units, every request sent twice at once (160 purchases at
// once on 8 connections), a busy answer (conflicts past the bound) sent again until
// known. Exactly 25 distinct orders are made, the inventory row is at 0 available and
// 25 reserved, the copies of a request never make two orders, nobody holds more than 2
// units, every refusal is sold_out or limit_exceeded, and the product's version moved
// once per order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn db_optimistic_sells_exactly_the_stock_under_concurrency() {
    let (db, ledger) = ledger().await;
    let ledger = std::sync::Arc::new(ledger);
    limited_product(&ledger, 70, 25, 2).await;
    let (before, _) = stock_read(&ledger, &request("REQ_70_v", 1, 70)).await;
    let baseline = Baseline::new(
        Strategy::DbOptimistic,
        ledger.clone(),
        std::sync::Arc::new(NoGate),
        PAYMENT_TIMEOUT,
    );
    let requests: Vec<PurchaseRequest> = (0..80)
        .map(|i| request(&format!("REQ_70_{i}"), i % 60 + 1, 70))
        .collect();
    let until_known = |r: PurchaseRequest| {
        let baseline = &baseline;
        async move {
            for _ in 0..BUSY_RETRIES_MAX {
                match baseline.purchase(r.clone()).await {
                    Err(Error::Unavailable(_)) => continue,
                    answer => return answer.map(|p| p.order.order_id),
                }
            }
            panic!(
                "{}: still busy after {BUSY_RETRIES_MAX} tries",
                r.request_id.as_str()
            )
        }
    };
    let answers = join_all(
        requests
            .iter()
            .flat_map(|r| [until_known(r.clone()), until_known(r.clone())]),
    )
    .await;
    let mut sold = std::collections::BTreeMap::new();
    for (k, answer) in answers.iter().enumerate() {
        let r = &requests[k / 2];
        match answer {
            Ok(order_id) => {
                let first = sold.entry(r.request_id.clone()).or_insert(*order_id);
                assert_eq!(first, order_id, "{}: two orders", r.request_id.as_str());
            }
            Err(Error::SoldOut | Error::LimitExceeded) => {}
            Err(e) => panic!("{}: {e}", r.request_id.as_str()),
        }
    }
    assert_eq!(sold.len(), 25);
    assert_eq!(
        (counters(&ledger, 70).await, orders(&ledger, 70).await),
        ((0, 25), 25)
    );
    let over: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM (SELECT user_id FROM orders WHERE product_id = 70 \
         GROUP BY user_id HAVING SUM(quantity) > 2) over_limit",
    )
    .fetch_one(&ledger.pool())
    .await
    .expect("count users over the limit");
    assert_eq!(over, 0);
    let (after, _) = stock_read(&ledger, &request("REQ_70_v", 1, 70)).await;
    assert_eq!(after.version - before.version, 25);
    ledger.pool().close().await;
    db.drop_db().await.expect("drop the test database");
}
