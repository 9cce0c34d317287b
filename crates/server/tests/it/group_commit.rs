//! Group commit, at the ledger's port on the real MariaDB: purchases that arrive together
//! are written together, and every one of them gets the answer it would have had alone.

use std::sync::Arc;
use std::time::Duration;

use flashsale_app::ports::{Commit, HeldPurchase, LedgerPurchase};
use flashsale_app::Ledger;
use flashsale_app::PurchaseOutcome;
use flashsale_core::{HoldRef, ProductId, PurchaseRequest, Quantity, RequestId, Terms, UserId};
use flashsale_mysql::{LedgerConfig, MysqlLedger};

use crate::helpers::TestApp;

/// A ledger of its own on the test's database: the tests call its port directly.
async fn ledger(app: &TestApp) -> Arc<MysqlLedger> {
    let url = app.db.as_ref().expect("test database").url();
    Arc::new(
        MysqlLedger::connect(&LedgerConfig {
            url,
            max_connections: 8,
            acquire_timeout: Duration::from_secs(5),
            transaction_timeout: Duration::from_secs(10),
            cluster: None,
        })
        .await
        .expect("ledger"),
    )
}

/// The units the stock log says were reserved: a group commit's per-product rows plus a
/// purchase committed alone's own `reserve` row.
const UNITS_LOGGED: &str =
    "SELECT CAST((SELECT COALESCE(SUM(quantity), 0) FROM inventory_batch_log) \
     + (SELECT COALESCE(SUM(quantity), 0) FROM inventory_log WHERE type = 'reserve') AS SIGNED)";

/// A transaction holding a row lock; rolled back to release it.
type RowLock = sqlx::Transaction<'static, sqlx::MySql>;

/// A transaction holding `product`'s inventory row locked: a group transaction of the
/// product waits at its counter UPDATE until this one ends.
async fn locked_row(app: &TestApp, product: i64) -> RowLock {
    let mut lock = app.pool.begin().await.expect("begin");
    sqlx::query("SELECT available_stock FROM product_inventory WHERE product_id = ? FOR UPDATE")
        .bind(product)
        .execute(&mut *lock)
        .await
        .expect("lock the product's row");
    lock
}

/// Bound on a commit in these tests: far beyond any wait they make, so that only the
/// test decides when a commit ends.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(600);

/// Where the "commit in flight" tests start: a service selling `product` (10 units), its
/// ledger, the product's id, the hold a first purchase commits (generation 1, hold 1),
/// and the product's row locked from another connection ([`locked_row`]), so that a
/// group transaction of it waits at its counter UPDATE.
async fn commit_held_at_the_lock(
    product: i64,
) -> (TestApp, Arc<MysqlLedger>, ProductId, HoldRef, RowLock) {
    let app = TestApp::selling(product, 10, None).await;
    let ledger = ledger(&app).await;
    let id = ProductId::parse(product).expect("id");
    let hold = HoldRef::from_stored(1, 1).expect("hold");
    let lock = locked_row(&app, product).await;
    (app, ledger, id, hold, lock)
}

/// `call` with its own handles on `ledger` and `purchase`, in a task of its own: a caller
/// of its own, which the test may watch or abort.
fn in_a_task<T, F>(
    ledger: &Arc<MysqlLedger>,
    purchase: &HeldPurchase,
    call: impl FnOnce(Arc<MysqlLedger>, HeldPurchase) -> F,
) -> tokio::task::JoinHandle<T>
where
    T: Send + 'static,
    F: std::future::Future<Output = T> + Send + 'static,
{
    tokio::spawn(call(ledger.clone(), purchase.clone()))
}

/// `request` with `hold`, on terms with no per-user limit and a payment deadline no
/// test reaches.
fn held(request: &PurchaseRequest, hold: HoldRef) -> HeldPurchase {
    HeldPurchase::new(request, hold, terms(None, COMMIT_TIMEOUT))
}

/// Terms with the per-user `limit`, orders waiting `timeout` for payment.
fn terms(limit: Option<u32>, timeout: Duration) -> Terms {
    Terms {
        per_user_limit: limit,
        payment_timeout: timeout,
    }
}

fn request(i: i64, product: i64) -> PurchaseRequest {
    PurchaseRequest {
        request_id: RequestId::parse("request_id", &format!("REQ_group_{i}")).expect("id"),
        user_id: UserId::parse(1000 + i).expect("user"),
        product_id: ProductId::parse(product).expect("product"),
        quantity: Quantity::from_stored(1).expect("quantity"),
    }
}

// Checks group commit against the real MariaDB, straight through the ledger port (Redis
// is bypassed, so Redis-side invariants are not checked here): 200 purchases of a product
// with 150 units sent at once, plus 20 concurrent duplicates of the first 20 (same
// request_id and hold). Exactly 150 commit and 50 are refused for stock — a batch that
// meets too few units falls back to one-by-one commits, which sort it out — and every
// duplicate gets the order of its request_id. The rows agree: 150 orders, one
// `order_created` outbox event each (sequence 1, the payload's event_id and order_id
// equal to the columns, its buyer, product and quantity the order's, no reason, and
// `occurred_at` at or just after the order's `created_at`, equal to it for a group
// commit's packed events), every unit in the stock log once, and the counters.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_purchases_commit_together_with_the_same_answers() {
    let app = TestApp::selling(3500, 150, None).await;
    let ledger = ledger(&app).await;
    let timeout = Duration::from_secs(600);
    let calls = (0..220i64).map(|i| {
        let ledger = ledger.clone();
        // 200..220 repeat the first 20 (same request_id, same hold id).
        let n = if i >= 200 { i - 200 } else { i };
        tokio::spawn(async move {
            let r = ledger
                .commit_purchase(&HeldPurchase::new(
                    &request(n, 3500),
                    HoldRef::from_stored(1, n + 1).expect("hold"),
                    terms(None, timeout),
                ))
                .await;
            (n, r)
        })
    });
    let mut committed = std::collections::BTreeMap::new();
    let (mut refused, mut duplicates) = (0, 0);
    for call in futures::future::join_all(calls).await {
        let (n, r) = call.expect("task");
        match r.expect("ledger answered") {
            Commit::Committed(order) => {
                assert!(
                    committed.insert(n, order.order_id).is_none(),
                    "REQ_group_{n} committed twice"
                );
            }
            Commit::Duplicate(record) => {
                assert!(record.is_hold(
                    ProductId::parse(3500).expect("id"),
                    HoldRef::from_stored(1, n + 1).expect("hold"),
                ));
                duplicates += 1;
            }
            Commit::InsufficientStock => refused += 1,
            other => panic!("REQ_group_{n}: unexpected {other:?}"),
        }
    }
    assert_eq!(committed.len(), 150, "exactly the stock commits");
    assert_eq!(refused + duplicates, 70);
    assert!(
        refused >= 50,
        "at least the 50 beyond the stock are refused"
    );
    assert_eq!(app.count("SELECT COUNT(*) FROM orders").await, 150);
    assert_eq!(
        app.count(
            "SELECT COUNT(*) FROM outbox_event o JOIN orders r ON r.request_id = o.request_id \
             WHERE o.event_type = 'order_created' AND o.sequence = 1 AND o.order_id = r.id \
             AND JSON_VALUE(o.payload, '$.event_id') = o.event_id \
             AND JSON_VALUE(o.payload, '$.order_id') = r.id \
             AND JSON_VALUE(o.payload, '$.event_type') = 'order_created' \
             AND JSON_VALUE(o.payload, '$.user_id') = r.user_id \
             AND JSON_VALUE(o.payload, '$.product_id') = r.product_id \
             AND JSON_VALUE(o.payload, '$.quantity') = r.quantity \
             AND JSON_TYPE(JSON_EXTRACT(o.payload, '$.reason')) = 'NULL' \
             AND STR_TO_DATE(JSON_VALUE(o.payload, '$.occurred_at'), '%Y-%m-%dT%H:%i:%s.%fZ') \
                 BETWEEN r.created_at AND r.created_at + INTERVAL 1 SECOND"
        )
        .await,
        150,
        "one consistent order_created event per order"
    );
    // A packed event (a group commit's) occurred when its order was created, to the
    // microsecond.
    let packed = "FROM outbox_event e JOIN outbox p ON p.id = e.id AND p.request_id IS NULL \
                  JOIN orders r ON r.id = e.order_id";
    let packed_events = app.count(&format!("SELECT COUNT(*) {packed}")).await;
    assert!(packed_events > 0, "no purchase was committed in a group");
    assert_eq!(
        app.count(&format!(
            "SELECT COUNT(*) {packed} WHERE JSON_VALUE(e.payload, '$.occurred_at') = \
             DATE_FORMAT(r.created_at, '%Y-%m-%dT%H:%i:%s.%fZ')"
        ))
        .await,
        packed_events
    );
    assert_eq!(
        app.count("SELECT COUNT(DISTINCT event_id) FROM outbox_event")
            .await,
        150
    );
    assert_eq!(
        app.count(UNITS_LOGGED).await,
        150,
        "every unit reserved is in the stock log once"
    );
    assert_eq!(
        app.count(
            "SELECT COUNT(*) FROM product_inventory WHERE product_id = 3500 \
             AND available_stock = 0 AND pre_deduct_stock = 150"
        )
        .await,
        1
    );
    app.cleanup().await;
}

/// Purchases of one unit of `product` made to queue into one full group commit, straight
/// through the ledger port: a transaction of the test's own locks the product's row, one
/// purchase goes first and its batch waits at the counter UPDATE, then the other
/// `n` − 1 (request_ids of 64 characters, the longest kind, `REQ_{tag}_…` with a tag of
/// four characters) queue behind it; once the lock
/// is released the next batch takes up to 256 of them (GROUP_COMMIT_MAX). The pauses are
/// long enough for that, well inside the lock wait timeout. Asserts that every purchase
/// committed, and that the orders table holds them all.
async fn committed_behind_a_lock(app: &TestApp, product: i64, n: i64, tag: &str) {
    use sqlx::Connection;
    let ledger = ledger(app).await;
    let url = app.db.as_ref().expect("test database").url();
    let mut blocker = sqlx::MySqlConnection::connect(&url)
        .await
        .expect("blocker connection");
    let mut lock = blocker.begin().await.expect("begin");
    sqlx::query("SELECT product_id FROM product_inventory WHERE product_id = ? FOR UPDATE")
        .bind(product)
        .fetch_one(&mut *lock)
        .await
        .expect("lock the product row");
    let purchase = |i: i64| {
        let ledger = ledger.clone();
        let tag = tag.to_owned();
        tokio::spawn(async move {
            let request = PurchaseRequest {
                request_id: RequestId::parse("request_id", &format!("REQ_{tag}_{i:0>55}"))
                    .expect("id"),
                user_id: UserId::parse(1_000_000 + i).expect("user"),
                product_id: ProductId::parse(product).expect("product"),
                quantity: Quantity::from_stored(1).expect("quantity"),
            };
            ledger
                .commit_purchase(&HeldPurchase::new(
                    &request,
                    HoldRef::from_stored(1, i + 1).expect("hold"),
                    terms(None, Duration::from_secs(600)),
                ))
                .await
        })
    };
    let mut calls = vec![purchase(0)];
    tokio::time::sleep(Duration::from_millis(500)).await;
    calls.extend((1..n).map(purchase));
    tokio::time::sleep(Duration::from_millis(1000)).await;
    lock.commit().await.expect("release the product row");
    for (i, call) in futures::future::join_all(calls)
        .await
        .into_iter()
        .enumerate()
    {
        let answer = call.expect("task");
        assert!(
            matches!(answer, Ok(Commit::Committed(_))),
            "purchase {i}: {answer:?}"
        );
    }
    let _ = blocker.close().await;
    assert_eq!(
        app.count(&format!(
            "SELECT COUNT(*) FROM orders WHERE product_id = {product}"
        ))
        .await,
        n
    );
}

// Checks that a full group commit of one product, with request_ids of the longest kind,
// writes its events as one pack, against the real MariaDB: 257 purchases of product 3700
// queue into a first batch and a full second one (`committed_behind_a_lock`): every
// purchase commits, none answers an error. And the largest pack holds over 200 events in
// more than 65,535 bytes, which an outbox payload of TEXT could not hold (the batch
// failed whole, 1406, every purchase in it answered 503).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_batch_of_long_request_ids_fits_one_pack() {
    let app = TestApp::selling(3700, 1000, None).await;
    committed_behind_a_lock(&app, 3700, 257, "full").await;
    assert_eq!(
        app.count("SELECT COUNT(DISTINCT event_id) FROM outbox_event")
            .await,
        257,
        "one order_created event per order"
    );
    let largest = app
        .count(
            "SELECT CAST(COALESCE(MAX(events), 0) AS SIGNED) FROM outbox WHERE request_id IS NULL",
        )
        .await;
    assert!(largest > 200, "the largest pack holds {largest} events");
    let bytes = app
        .count("SELECT CAST(COALESCE(MAX(LENGTH(payload)), 0) AS SIGNED) FROM outbox")
        .await;
    assert!(bytes > 65_535, "the largest pack is {bytes} bytes");
    app.cleanup().await;
}

// Checks that a small batch, whose rows the group transaction writes as `VALUES` lists,
// and a large one, written by the stored procedure from the batch's document, write the
// same rows (real MariaDB): 20 purchases of product 3720 and 100 of product 3730 queue
// behind a lock (`committed_behind_a_lock`), so each product's second batch holds 19 or
// 99 purchases, either side of `LISTED_BATCH_MAX` (32) in `group.rs`. For every order of
// both: its reservation PROCESSING with the same buyer, product and quantity, under a
// hold id one above its index in generation 1; the order PENDING_PAYMENT, expiring the
// payment timeout (600 s) after its creation; the orders of one batch created at one
// instant; and the stock log's units and the counters agree with the orders.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn listed_and_procedure_batches_write_the_same_rows() {
    let app = TestApp::spawn().await;
    for (product, n, tag) in [(3720, 20, "l020"), (3730, 100, "p100")] {
        app.create_product(product, 200, None).await;
        committed_behind_a_lock(&app, product, n, tag).await;
        let wrong = app
            .count(&format!(
                "SELECT COUNT(*) FROM orders o JOIN inventory_reservation r \
                 ON r.request_id = o.request_id WHERE o.product_id = {product} AND NOT ( \
                 r.status = 'PROCESSING' AND o.status = 'PENDING_PAYMENT' \
                 AND r.user_id = o.user_id AND r.product_id = o.product_id \
                 AND r.quantity = o.quantity AND o.quantity = 1 AND r.generation = 1 \
                 AND r.hold_id = CAST(RIGHT(o.request_id, 55) AS SIGNED) + 1 \
                 AND o.user_id = 1000000 + CAST(RIGHT(o.request_id, 55) AS SIGNED) \
                 AND TIMESTAMPDIFF(MICROSECOND, o.created_at, o.expires_at) = 600000000)"
            ))
            .await;
        assert_eq!(wrong, 0, "product {product}: rows unlike a purchase's");
        assert_eq!(
            app.count(&format!(
                "SELECT COUNT(*) FROM inventory_reservation WHERE product_id = {product}"
            ))
            .await,
            n
        );
        assert_eq!(
            app.count(&format!(
                "SELECT COUNT(DISTINCT created_at) FROM orders WHERE product_id = {product}"
            ))
            .await,
            2,
            "product {product}: the first purchase's batch, then the rest's"
        );
        assert_eq!(
            app.count(&format!(
                "SELECT CAST(SUM(quantity) AS SIGNED) FROM inventory_batch_log \
                 WHERE product_id = {product}"
            ))
            .await,
            n
        );
        assert_eq!(
            app.count(&format!(
                "SELECT COUNT(*) FROM product_inventory WHERE product_id = {product} \
                 AND available_stock = 200 - {n} AND pre_deduct_stock = {n}"
            ))
            .await,
            1
        );
    }
    app.cleanup().await;
}

// Checks that a group transaction the database refuses sets its purchases aside, each
// committed on its own with its own answer, instead of answering the whole batch
// "unknown": a trigger of the test's own refuses (SIGNAL, error 1644) any outbox row of
// more than 100 events, which only a large group commit writes, and 257 purchases of
// product 3710 queue into a full batch (`committed_behind_a_lock`). Every purchase commits,
// no pack of over 100 events exists, at least 200 orders were committed one by one (each
// wrote its own `reserve` row in inventory_log), and every unit is in the stock log once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refused_group_transaction_goes_one_by_one() {
    let app = TestApp::selling(3710, 1000, None).await;
    sqlx::raw_sql(
        "CREATE TRIGGER test_refuse_large_packs BEFORE INSERT ON outbox FOR EACH ROW \
         IF NEW.events > 100 THEN \
         SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'test: pack refused'; END IF",
    )
    .execute(&app.pool)
    .await
    .expect("refusing trigger");
    committed_behind_a_lock(&app, 3710, 257, "full").await;
    assert_eq!(
        app.count("SELECT COUNT(*) FROM outbox WHERE events > 100")
            .await,
        0
    );
    let alone = app
        .count("SELECT COUNT(*) FROM inventory_log WHERE type = 'reserve'")
        .await;
    assert!(alone >= 200, "{alone} orders committed one by one");
    assert_eq!(
        app.count(UNITS_LOGGED).await,
        257,
        "every unit reserved is in the stock log once"
    );
    app.cleanup().await;
}

// Checks the ledger's per-user limit inside group commit, against the real MariaDB and
// straight through the ledger port (Redis, which counts per user too, is bypassed, so
// the ledger's check is the only guard): a product with 500 units and a limit of 2 per
// user; 40 users send 3 purchases each, all 120 at once (distinct request_ids and hold
// ids). Exactly 2 per user commit and every third is refused with LimitExceeded, the
// orders table and the counters agree, and orders that share one `created_at` (one
// statement's NOW(6)) show that limited purchases were written together, not one
// transaction each.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn per_user_limits_hold_inside_group_commits() {
    let app = TestApp::selling(3510, 500, Some(2)).await;
    let ledger = ledger(&app).await;
    let timeout = Duration::from_secs(600);
    let calls = (0..120i64).map(|i| {
        let ledger = ledger.clone();
        let user = i % 40;
        tokio::spawn(async move {
            let request = PurchaseRequest {
                request_id: RequestId::parse("request_id", &format!("REQ_limit_{i}")).expect("id"),
                user_id: UserId::parse(5000 + user).expect("user"),
                product_id: ProductId::parse(3510).expect("product"),
                quantity: Quantity::from_stored(1).expect("quantity"),
            };
            let r = ledger
                .commit_purchase(&HeldPurchase::new(
                    &request,
                    HoldRef::from_stored(1, i + 1).expect("hold"),
                    terms(Some(2), timeout),
                ))
                .await;
            (user, r)
        })
    });
    let mut per_user = std::collections::BTreeMap::new();
    let mut refused = 0;
    for call in futures::future::join_all(calls).await {
        let (user, r) = call.expect("task");
        match r.expect("ledger answered") {
            Commit::Committed(_) => *per_user.entry(user).or_insert(0) += 1,
            Commit::LimitExceeded => refused += 1,
            other => panic!("user {user}: unexpected {other:?}"),
        }
    }
    assert_eq!(per_user.len(), 40, "every user bought");
    assert!(per_user.values().all(|&n| n == 2), "{per_user:?}");
    assert_eq!(refused, 40, "every third purchase refused");
    assert_eq!(
        app.count(
            "SELECT COUNT(*) FROM (SELECT user_id FROM orders WHERE product_id = 3510 \
             GROUP BY user_id HAVING COUNT(*) = 2) u"
        )
        .await,
        40
    );
    assert_eq!(
        app.count(
            "SELECT COUNT(*) FROM product_inventory WHERE product_id = 3510 \
             AND available_stock = 420 AND pre_deduct_stock = 80"
        )
        .await,
        1
    );
    assert!(
        app.count(
            "SELECT COALESCE(MAX(n), 0) FROM (SELECT COUNT(*) AS n FROM orders \
             WHERE product_id = 3510 GROUP BY created_at) t"
        )
        .await
            >= 2,
        "no two orders written by one statement: limited purchases went one by one"
    );
    app.cleanup().await;
}

// Checks ledger mode's group commit against the real MariaDB, straight through the
// ledger port: product 3600 in ledger mode with 500 units and a limit of 2 per user;
// 60 users send 3 purchases each and the first 20 request_ids are sent twice, all 200 at
// once. Exactly 2 per user commit (120), every third is refused with LimitExceeded, each
// copy gets its first's answer (the order as a duplicate, or the same refusal), and
// orders sharing one `created_at` (one statement's NOW(6)) show they were written
// together. Then product 3601 in ledger mode with 50 units gets 80 purchases at once:
// exactly 50 commit, the rest are refused for stock, and the hold ids the ledger handed
// out are 1 to 50 without a gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ledger_mode_purchases_commit_together_with_the_same_answers() {
    use flashsale_app::ports::LedgerMaintenance;
    let app = TestApp::selling(3600, 500, Some(2)).await;
    app.create_product(3601, 50, None).await;
    let ledger = ledger(&app).await;
    for p in [3600, 3601] {
        ledger
            .enter_ledger_mode(ProductId::parse(p).expect("id"))
            .await
            .expect("ledger mode");
    }
    // The ledger sells once the switch has settled.
    tokio::time::sleep(flashsale_app::modes::LEDGER_SALES_AFTER_SWITCH + Duration::from_millis(50))
        .await;
    let timeout = Duration::from_secs(600);
    let limited = |i: i64| PurchaseRequest {
        request_id: RequestId::parse("request_id", &format!("REQ_lg_{i}")).expect("id"),
        user_id: UserId::parse(1000 + i % 60).expect("user"),
        product_id: ProductId::parse(3600).expect("product"),
        quantity: Quantity::from_stored(1).expect("quantity"),
    };
    let calls = (0..200i64).map(|i| {
        let ledger = ledger.clone();
        // 180..200 repeat the first 20.
        let n = if i >= 180 { i - 180 } else { i };
        tokio::spawn(async move {
            let r = ledger
                .commit_ledger_purchase(&LedgerPurchase {
                    request: limited(n),
                    terms: terms(Some(2), timeout),
                })
                .await;
            (i, n, r.expect("ledger answered"))
        })
    });
    let answers: Vec<(i64, i64, Commit)> = futures::future::join_all(calls)
        .await
        .into_iter()
        .map(|c| c.expect("task"))
        .collect();
    let first: std::collections::BTreeMap<i64, &Commit> = answers
        .iter()
        .filter(|(i, _, _)| *i < 180)
        .map(|(_, n, c)| (*n, c))
        .collect();
    let mut per_user = std::collections::BTreeMap::new();
    for (_, n, c) in answers.iter().filter(|(i, _, _)| *i < 180) {
        match c {
            Commit::Committed(_) => *per_user.entry(n % 60).or_insert(0) += 1,
            Commit::LimitExceeded => {}
            Commit::Duplicate(record) => {
                // A copy that committed first: the other one is the duplicate.
                assert!(matches!(
                    record.outcome,
                    flashsale_app::PurchaseOutcome::Order(_)
                ));
                *per_user.entry(n % 60).or_insert(0) += 1;
            }
            other => panic!("REQ_lg_{n}: unexpected {other:?}"),
        }
    }
    assert!(per_user.values().all(|&k| k == 2), "{per_user:?}");
    assert_eq!(per_user.len(), 60);
    for (_, n, copy) in answers.iter().filter(|(i, _, _)| *i >= 180) {
        match (first[n], copy) {
            (Commit::Committed(o), Commit::Duplicate(r))
            | (Commit::Duplicate(r), Commit::Committed(o)) => {
                assert_eq!(r.outcome, flashsale_app::PurchaseOutcome::Order(o.clone()));
            }
            (Commit::LimitExceeded, Commit::LimitExceeded) => {}
            (a, b) => panic!("REQ_lg_{n}: {a:?} then {b:?}"),
        }
    }
    assert_eq!(
        app.count("SELECT COUNT(*) FROM orders WHERE product_id = 3600")
            .await,
        120
    );
    let instants = app
        .count("SELECT COUNT(DISTINCT created_at) FROM orders WHERE product_id = 3600")
        .await;
    assert!(
        instants < 120,
        "written together: {instants} distinct created_at"
    );
    let stock = (0..80i64).map(|i| {
        let ledger = ledger.clone();
        tokio::spawn(async move {
            ledger
                .commit_ledger_purchase(&LedgerPurchase {
                    request: request(i, 3601),
                    terms: terms(None, timeout),
                })
                .await
                .expect("ledger answered")
        })
    });
    let mut sold = 0;
    for answer in futures::future::join_all(stock).await {
        match answer.expect("task") {
            Commit::Committed(_) => sold += 1,
            Commit::InsufficientStock => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(sold, 50);
    assert_eq!(
        app.count(
            "SELECT COUNT(DISTINCT hold_id) FROM inventory_reservation \
             WHERE product_id = 3601 AND hold_id BETWEEN 1 AND 50"
        )
        .await,
        50
    );
    assert_eq!(
        app.count(
            "SELECT COUNT(*) FROM product_inventory WHERE product_id IN (3600, 3601) \
             AND available_stock + pre_deduct_stock = total_stock"
        )
        .await,
        2
    );
    app.cleanup().await;
}

// Checks that a commit in flight outlives the caller that queued it (real MariaDB): the
// product's row is held locked from another connection, so the group transaction waits
// at its counter UPDATE; a second caller with the very same hold joins the first one's
// commit; the first caller then goes away (its task aborted, as hyper drops a request
// whose client hung up). Once the lock is released, the joiner still hears the outcome,
// the order of that hold as `Duplicate`, and exactly one order exists; a later commit of
// the same hold finds that order too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joined_commit_is_answered_after_its_first_caller_went_away() {
    let (app, ledger, product, hold, lock) = commit_held_at_the_lock(3550).await;
    let commit = |ledger: Arc<MysqlLedger>| {
        tokio::spawn(async move { ledger.commit_purchase(&held(&request(1, 3550), hold)).await })
    };
    let first = commit(ledger.clone());
    // The first caller's purchase is queued and its transaction waits for the lock.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let joiner = commit(ledger.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.abort();
    assert!(
        first.await.is_err_and(|e| e.is_cancelled()),
        "the first caller went away"
    );
    lock.rollback().await.expect("release the lock");
    let joined = joiner
        .await
        .expect("task")
        .expect("the joiner hears the outcome");
    match &joined {
        Commit::Duplicate(record) => assert!(record.is_hold(product, hold), "{record:?}"),
        other => panic!("the joiner: unexpected {other:?}"),
    }
    assert_eq!(
        app.count("SELECT COUNT(*) FROM orders WHERE product_id = 3550")
            .await,
        1
    );
    let again = commit(ledger.clone())
        .await
        .expect("task")
        .expect("answered");
    assert_eq!(again, joined, "the same order, found in the ledger");
    app.cleanup().await;
}

// Checks `join_commit`, the replay's way into a commit in flight (real MariaDB): the
// product's row is held locked from another connection, so the first caller's group
// transaction waits at its counter UPDATE. Meanwhile the ledger has no record of the
// request_id (the read a replay made before), and `join_commit` answers None for another
// hold of it and for a request_id nobody commits, but joins for the very same hold: it
// is still waiting while the lock is held. Once the lock is released, the first caller
// gets the order and the joiner the same order as `Duplicate` of that hold; exactly one
// order exists; and with the commit decided there is nothing left to join (None), the
// ledger's record answering instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_joins_the_commit_in_flight_without_a_read() {
    let (app, ledger, product, hold, lock) = commit_held_at_the_lock(3560).await;
    let request = request(7, 3560);
    let purchase = held(&request, hold);
    let first = in_a_task(&ledger, &purchase, |ledger, purchase| async move {
        ledger.commit_purchase(&purchase).await
    });
    // The first caller's purchase is queued and its transaction waits for the lock.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        ledger
            .find_purchase(&request.request_id)
            .await
            .expect("read"),
        None,
        "nothing committed yet: a read cannot answer the replay"
    );
    let other_hold = held(&request, HoldRef::from_stored(1, 2).expect("hold"));
    assert!(ledger.join_commit(&other_hold).await.is_none());
    let other_request = held(&self::request(8, 3560), hold);
    assert!(ledger.join_commit(&other_request).await.is_none());
    let joiner = in_a_task(&ledger, &purchase, |ledger, purchase| async move {
        ledger.join_commit(&purchase).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!joiner.is_finished(), "the joiner waits for the commit");
    lock.rollback().await.expect("release the lock");
    let order = match first.await.expect("task").expect("committed") {
        Commit::Committed(order) => order,
        other => panic!("the first caller: unexpected {other:?}"),
    };
    match joiner.await.expect("task") {
        Some(Ok(Commit::Duplicate(record))) => {
            assert!(record.is_hold(product, hold), "{record:?}");
            assert!(
                matches!(&record.outcome, PurchaseOutcome::Order(o) if o.order_id == order.order_id),
                "{record:?}"
            );
        }
        other => panic!("the joiner: unexpected {other:?}"),
    }
    assert_eq!(
        app.count("SELECT COUNT(*) FROM orders WHERE product_id = 3560")
            .await,
        1
    );
    assert!(ledger.join_commit(&purchase).await.is_none());
    assert!(ledger
        .find_purchase(&request.request_id)
        .await
        .expect("read")
        .is_some_and(|r| r.is_hold(product, hold)));
    app.cleanup().await;
}

/// `request` under another request_id.
fn named(request_id: &str, i: i64, product: i64) -> PurchaseRequest {
    PurchaseRequest {
        request_id: RequestId::parse("request_id", request_id).expect("id"),
        ..request(i, product)
    }
}

// Checks that a taken request_id is told from a reused gate hold by the key MariaDB names,
// not by a search of its error message, which quotes the duplicated value first (real
// MariaDB): request_ids that spell the hold key's name, `uk_reservation_hold` and
// `a.uk_reservation_hold.1`, each buy once and are then sent again. In ledger mode the
// retry gets its order back as `Duplicate`; read as a reused hold it was an error (a
// 503 for every retry). Through the gate a second hold of the same request_id (its
// hold record gone from Redis) gets the first hold's order as `Duplicate`, and the
// product's generation stays where it was; read as a reused hold it advanced the
// generation, voiding every hold in flight for the product.
#[tokio::test]
async fn a_request_id_spelling_a_key_name_is_a_taken_request_id() {
    use flashsale_app::ports::LedgerMaintenance;
    let app = TestApp::selling(3570, 10, None).await;
    app.create_product(3571, 10, None).await;
    let ledger = ledger(&app).await;
    let timeout = Duration::from_secs(600);
    ledger
        .enter_ledger_mode(ProductId::parse(3571).expect("id"))
        .await
        .expect("ledger mode");
    tokio::time::sleep(flashsale_app::modes::LEDGER_SALES_AFTER_SWITCH + Duration::from_millis(50))
        .await;
    let in_ledger = LedgerPurchase {
        request: named("uk_reservation_hold", 1, 3571),
        terms: terms(None, timeout),
    };
    let order = match ledger
        .commit_ledger_purchase(&in_ledger)
        .await
        .expect("ledger answered")
    {
        Commit::Committed(order) => order,
        other => panic!("the first purchase: unexpected {other:?}"),
    };
    match ledger
        .commit_ledger_purchase(&in_ledger)
        .await
        .expect("the retry is answered, not an error")
    {
        Commit::Duplicate(record) => {
            assert_eq!(record.outcome, PurchaseOutcome::Order(order.clone()))
        }
        other => panic!("the retry: unexpected {other:?}"),
    }

    let generation = "SELECT generation FROM product_inventory WHERE product_id = 3570";
    let before = app.count(generation).await;
    let through_gate = named("a.uk_reservation_hold.1", 2, 3570);
    let first = HoldRef::from_stored(before, 1).expect("hold");
    let order = match ledger
        .commit_purchase(&held(&through_gate, first))
        .await
        .expect("committed")
    {
        Commit::Committed(order) => order,
        other => panic!("the first hold: unexpected {other:?}"),
    };
    let second = HoldRef::from_stored(before, 2).expect("hold");
    match ledger
        .commit_purchase(&held(&through_gate, second))
        .await
        .expect("the second hold is answered, not an error")
    {
        Commit::Duplicate(record) => {
            assert!(
                record.is_hold(ProductId::parse(3570).expect("id"), first),
                "{record:?}"
            );
            assert_eq!(record.outcome, PurchaseOutcome::Order(order));
        }
        other => panic!("the second hold: unexpected {other:?}"),
    }
    assert_eq!(
        app.count(generation).await,
        before,
        "no generation advanced"
    );
    assert_eq!(
        app.count("SELECT COUNT(*) FROM orders WHERE product_id IN (3570, 3571)")
            .await,
        2
    );
    app.cleanup().await;
}
