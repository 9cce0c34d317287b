//! Taking units off sale (`POST /v1/products/{id}/destock`): only available units are
//! taken, never held or sold ones; more than are available is 409 `insufficient_stock`
//! with nothing changed; idempotent by the admin's request_id; exact under a flood of
//! purchases on two instances; in ledger mode with Redis dead; and a destock left
//! pending between the gate and the ledger is settled by the workers' pass.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flashsale_testkit::PrivateRedis;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{cleanup_all, code, order_id, TestApp};
use crate::invariants;
use crate::pause::act;

/// Tries a client makes of one destock while its outcome is unknown (503): each is
/// answered within the request deadline, so this bounds a test's wait on one.
const DESTOCK_TRIES_MAX: usize = 50;

/// A destock of `quantity` under `rid`, retried with the same request_id while the
/// answer is 503: the final status and body.
async fn destock(app: &TestApp, product: i64, rid: &str, quantity: i64) -> (StatusCode, Value) {
    let body = json!({ "request_id": rid, "quantity": quantity });
    for _ in 0..DESTOCK_TRIES_MAX {
        let (s, b) = act(app, product, "destock", body.clone()).await;
        if s != StatusCode::SERVICE_UNAVAILABLE {
            return (s, b);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("destock {rid} still unknown after {DESTOCK_TRIES_MAX} tries");
}

/// The product's ledger counters, as `GET /v1/products/{id}` shows them:
/// (total, available, reserved, sold).
async fn counters(app: &TestApp, product: i64) -> (i64, i64, i64, i64) {
    let (s, b) = app.get(&format!("/v1/products/{product}")).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    inventory(&b)
}

fn inventory(b: &Value) -> (i64, i64, i64, i64) {
    let i = &b["inventory"];
    let n = |k: &str| i[k].as_i64().unwrap_or(-1);
    (n("total"), n("available"), n("reserved"), n("sold"))
}

/// What the destock `rid` wrote: its stock-log rows, log lines and events.
async fn written(app: &TestApp, rid: &str) -> (i64, i64, i64) {
    let log = app
        .count(&format!(
            "SELECT COUNT(*) FROM inventory_log WHERE request_id = '{rid}' AND type = 'destock'"
        ))
        .await;
    let line = app
        .count(&format!(
            "SELECT COUNT(*) FROM admin_action WHERE request_id = '{rid}' AND action = 'destock'"
        ))
        .await;
    let event = app
        .count(&format!(
            "SELECT COUNT(*) FROM outbox o JOIN admin_action a \
             ON o.request_id = CONCAT('ADMIN_', a.id) \
             WHERE a.request_id = '{rid}' AND o.event_type = 'product_destocked'"
        ))
        .await;
    (log, line, event)
}

// Checks a destock's answers and records, in gate mode. How: on 10 units, 3 taken leave
// 7 (total 7) in the ledger and in Redis; the same request again answers the same and
// writes nothing more (one stock-log row, one log line, one event); its request_id with
// another quantity, or a pause's request_id, is 409 request_id_conflict; 8 is 409
// insufficient_stock and changes nothing. After a purchase of 2 (held) and one of 1
// (paid), exactly the 4 available are taken (total 3 = held 2 + sold 1) and one more is
// refused. Bad quantities (0, negative, past the bound) are 400, no token 401, an
// unknown product 404. The log line carries the admin and before/after counters, the
// workers find nothing pending, and the invariants and the audit hold.
#[tokio::test]
async fn a_destock_takes_only_available_units_once() {
    const PRODUCT: i64 = 4301;
    let app = TestApp::spawn().await;
    app.create_product(PRODUCT, 10, None).await;
    let (s, b) = destock(&app, PRODUCT, "DS_a_1", 3).await;
    assert_eq!((s, inventory(&b)), (StatusCode::OK, (7, 7, 0, 0)), "{b}");
    assert_eq!(app.redis_available(PRODUCT).await, Some(7));
    let (s, b) = destock(&app, PRODUCT, "DS_a_1", 3).await;
    assert_eq!(
        (s, inventory(&b)),
        (StatusCode::OK, (7, 7, 0, 0)),
        "replay: {b}"
    );
    assert_eq!(written(&app, "DS_a_1").await, (1, 1, 1));
    let (s, b) = destock(&app, PRODUCT, "DS_a_1", 2).await;
    assert_eq!((s, code(&b)), (StatusCode::CONFLICT, "request_id_conflict"));
    let (s, b) = act(&app, PRODUCT, "pause", json!({"request_id": "OP_a_p"})).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    act(&app, PRODUCT, "resume", json!({"request_id": "OP_a_r"})).await;
    let (s, b) = destock(&app, PRODUCT, "OP_a_p", 1).await;
    assert_eq!((s, code(&b)), (StatusCode::CONFLICT, "request_id_conflict"));
    let (s, b) = destock(&app, PRODUCT, "DS_a_2", 8).await;
    assert_eq!((s, code(&b)), (StatusCode::CONFLICT, "insufficient_stock"));
    assert_eq!(counters(&app, PRODUCT).await, (7, 7, 0, 0));
    assert_eq!(app.redis_available(PRODUCT).await, Some(7));
    assert_eq!(written(&app, "DS_a_2").await, (0, 0, 0));
    app.bought("REQ_a_held", 1, PRODUCT, 2).await;
    let paid = app.bought("REQ_a_paid", 2, PRODUCT, 1).await;
    let (s, b) = app.pay(order_id(&paid), 2).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let (s, b) = destock(&app, PRODUCT, "DS_a_3", 4).await;
    assert_eq!((s, inventory(&b)), (StatusCode::OK, (3, 0, 2, 1)), "{b}");
    let (s, b) = destock(&app, PRODUCT, "DS_a_4", 1).await;
    assert_eq!((s, code(&b)), (StatusCode::CONFLICT, "insufficient_stock"));
    refusals(&app, PRODUCT).await;
    let (admin, before, after): (String, String, String) = sqlx::query_as(
        "SELECT CAST(admin AS CHAR), CAST(before_state AS CHAR), CAST(after_state AS CHAR) \
         FROM admin_action WHERE request_id = 'DS_a_3'",
    )
    .fetch_one(&app.pool)
    .await
    .expect("log line");
    assert_eq!(admin, "admin");
    let (before, after): (Value, Value) = (
        serde_json::from_str(&before).expect("json"),
        serde_json::from_str(&after).expect("json"),
    );
    assert_eq!(
        (&before["available"], &after["available"]),
        (&json!(4), &json!(0))
    );
    assert_eq!((&before["total"], &after["total"]), (&json!(7), &json!(3)));
    let left = app.destocking.settle_pending(10).await.expect("pass");
    assert_eq!(left, 0, "every destock was settled by its request");
    invariants::assert_sound_and_clean_up(app, PRODUCT).await;
}

/// The refusals of bad destocks, none of which changes anything.
async fn refusals(app: &TestApp, product: i64) {
    for quantity in [json!(0), json!(-1), json!(2_000_000_000_i64), json!("3")] {
        let body = json!({ "request_id": "DS_bad", "quantity": quantity });
        let (s, b) = act(app, product, "destock", body).await;
        assert_eq!(
            (s, code(&b)),
            (StatusCode::BAD_REQUEST, "invalid_request"),
            "{quantity}"
        );
    }
    let body = json!({ "request_id": "DS_anon", "quantity": 1 });
    let (s, b) = app
        .post(&format!("/v1/products/{product}/destock"), body.clone())
        .await;
    assert_eq!((s, code(&b)), (StatusCode::UNAUTHORIZED, "unauthorized"));
    let (s, b) = act(app, 4399, "destock", body).await;
    assert_eq!((s, code(&b)), (StatusCode::NOT_FOUND, "product_not_found"));
}

/// Buyers per instance in the flood.
const BUYERS: usize = 4;
/// The flood's product's units: fewer than the buyers and destocks ask for together, so
/// they compete for the last ones.
const FLOOD_STOCK: i64 = 300;
/// Units each of the flood's destocks asks for.
const FLOOD_DESTOCK: i64 = 3;
/// Most destocks one instance's destocking task makes: past it the stock is surely gone.
const FLOOD_DESTOCKS_MAX: usize = 200;

/// Buyers that purchase one unit each with fresh request_ids on `app` until `stop`,
/// each purchase retried until its answer is known: the number of 201s.
fn buyers(
    app: &Arc<TestApp>,
    instance: usize,
    product: i64,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<i64>> {
    (0..BUYERS)
        .map(|b| {
            let (app, stop) = (app.clone(), stop.clone());
            tokio::spawn(async move {
                let mut created = 0;
                for i in 0.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let rid = format!("REQ_dflood_{instance}_{b}_{i}");
                    let user = (instance * BUYERS + b + 1) as i64;
                    let (s, _, _) = app.purchase_until_known(&rid, user, product, 1).await;
                    created += i64::from(s == StatusCode::CREATED);
                }
                created
            })
        })
        .collect()
}

/// Destocks of `FLOOD_DESTOCK` on `app`, one after another, until none is available:
/// (units taken, refusals).
fn destocks(
    app: &Arc<TestApp>,
    instance: usize,
    product: i64,
) -> tokio::task::JoinHandle<(i64, i64)> {
    let app = app.clone();
    tokio::spawn(async move {
        let (mut taken, mut refused) = (0, 0);
        for n in 0..FLOOD_DESTOCKS_MAX {
            let rid = format!("DS_flood_{instance}_{n}");
            let (s, b) = destock(&app, product, &rid, FLOOD_DESTOCK).await;
            match (s, code(&b)) {
                (StatusCode::OK, _) => taken += FLOOD_DESTOCK,
                (StatusCode::CONFLICT, "insufficient_stock") => refused += 1,
                other => panic!("destock {rid}: {other:?} {b}"),
            }
            if counters(&app, product).await.1 == 0 {
                break;
            }
        }
        (taken, refused)
    })
}

// Checks a destock's exactness under a flood, on two instances sharing the stores. How:
// buyers on both instances buy one unit at a time (each purchase retried to a known
// answer) while each instance also destocks 3 units at a time, until the stock is gone.
// Afterwards: units sold plus units destocked (the 200s) never exceed the initial
// stock, the destocks the ledger took are exactly the 200s, the orders are exactly the
// 201s, total == available + reserved + sold with the total the initial stock less the
// destocked units, and the invariants and the audit hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn destocks_during_a_flood_stay_exact() {
    const PRODUCT: i64 = 4302;
    let first = TestApp::spawn().await;
    let second = first.spawn_beside(&[]).await;
    let apps = [Arc::new(first), Arc::new(second)];
    apps[0].create_product(PRODUCT, FLOOD_STOCK, None).await;
    let stop = Arc::new(AtomicBool::new(false));
    let floods: Vec<_> = apps
        .iter()
        .enumerate()
        .map(|(i, app)| buyers(app, i, PRODUCT, &stop))
        .collect();
    let takers: Vec<_> = apps
        .iter()
        .enumerate()
        .map(|(i, app)| destocks(app, i, PRODUCT))
        .collect();
    let (mut destocked, mut refused) = (0, 0);
    for t in takers {
        let (taken, refusals) = t.await.expect("destocks");
        destocked += taken;
        refused += refusals;
    }
    stop.store(true, Ordering::Relaxed);
    let mut created = 0;
    for handles in floods {
        for h in handles {
            created += h.await.expect("buyer");
        }
    }
    println!("flood: {created} sold, {destocked} units destocked, {refused} refused");
    assert!(
        created + destocked <= FLOOD_STOCK,
        "{created} + {destocked}"
    );
    assert!(destocked > 0 && created > 0, "both took units");
    check_flood(&apps[0], PRODUCT, created, destocked).await;
    cleanup_all(apps).await;
}

/// The ledger after the flood: its taken destocks are the 200s' units, its orders the
/// 201s, its counters add up, and the invariants and the audit hold.
async fn check_flood(app: &TestApp, product: i64, created: i64, destocked: i64) {
    let taken = app
        .count(&format!(
            "SELECT CAST(COALESCE(SUM(quantity), 0) AS SIGNED) FROM destock_request \
             WHERE product_id = {product} AND state = 'taken'"
        ))
        .await;
    assert_eq!(taken, destocked, "the ledger took exactly the 200s");
    let orders = app
        .count(&format!(
            "SELECT COUNT(*) FROM orders WHERE product_id = {product}"
        ))
        .await;
    assert_eq!(orders, created, "one order per 201");
    let (total, available, reserved, sold) = counters(app, product).await;
    assert_eq!(total, available + reserved + sold);
    assert_eq!(total, FLOOD_STOCK - destocked);
    invariants::assert_sound(app, product).await;
}

/// An instance on a private Redis (for the test to kill) that falls back to ledger mode
/// a second after Redis stops answering, with its fallback worker, and `product` of 20
/// units created.
async fn on_private_redis(product: i64) -> (PrivateRedis, TestApp, flashsale::workers::Workers) {
    let settings = [
        ("FALLBACK_AFTER", "1s"),
        ("FALLBACK_RECOVER_AFTER", "60s"),
        ("RECOVERY_AFTER", "15s"),
    ];
    let redis = PrivateRedis::start().await.expect("private redis");
    let app = TestApp::spawn_on_redis(redis.url(), &settings).await;
    let workers = crate::fallback::start_workers(&app);
    app.create_product(product, 20, None).await;
    (redis, app, workers)
}

// Checks a destock in ledger mode with Redis dead, on one instance with its fallback
// worker. How: a private Redis is killed after a first sale; purchases move the product
// to ledger mode; a destock of 5 is taken from the ledger's counters (200, available
// down by 5, total too), its replay answers the same, one of more than remains is 409
// insufficient_stock with nothing changed, and a purchase still sells from the ledger.
// The audit (the ledger alone in ledger mode) is clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_destock_in_ledger_mode_with_redis_dead() {
    const PRODUCT: i64 = 4303;
    let (mut redis, app, workers) = on_private_redis(PRODUCT).await;
    let (s, _, _) = app.purchase_until_known("REQ_dl_1", 1, PRODUCT, 1).await;
    assert_eq!(s, StatusCode::CREATED);
    redis.kill9().expect("kill redis");
    let (s, b, _) = app.purchase_until_known("REQ_dl_2", 2, PRODUCT, 1).await;
    assert_eq!(s, StatusCode::CREATED, "sold from the ledger: {b}");
    let (s, b) = destock(&app, PRODUCT, "DS_l_1", 5).await;
    assert_eq!((s, inventory(&b)), (StatusCode::OK, (15, 13, 2, 0)), "{b}");
    assert_eq!(b["stock_mode"], json!("ledger"));
    let (s, b) = destock(&app, PRODUCT, "DS_l_1", 5).await;
    assert_eq!(
        (s, inventory(&b)),
        (StatusCode::OK, (15, 13, 2, 0)),
        "replay: {b}"
    );
    let (s, b) = destock(&app, PRODUCT, "DS_l_2", 14).await;
    assert_eq!((s, code(&b)), (StatusCode::CONFLICT, "insufficient_stock"));
    assert_eq!(counters(&app, PRODUCT).await, (15, 13, 2, 0));
    assert_eq!(written(&app, "DS_l_1").await, (1, 1, 1));
    let (s, b, _) = app.purchase_until_known("REQ_dl_3", 3, PRODUCT, 1).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    workers.stop().await;
    invariants::assert_audit_clean(&app, PRODUCT).await;
    app.cleanup().await;
}

/// Held by each test that sets the failpoint `destock-after-gate`, whose configuration
/// is the process's: one at a time.
#[cfg(feature = "failpoints")]
static FAILPOINT: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The destock's row: (state, generation).
#[cfg(feature = "failpoints")]
async fn destock_row(app: &TestApp, rid: &str) -> (String, i64) {
    app.row(
        "SELECT CAST(state AS CHAR), generation FROM destock_request WHERE request_id = ?",
        rid,
    )
    .await
}

// Checks a crash between the gate's step and the ledger's settle (the failpoint
// `destock-after-gate` makes the request end there, 503). How: a destock of 4 of 10 is
// taken in Redis (6 left) and left pending in the ledger (10 available); the audit
// counts it as pending, not a violation; the workers' pass settles it (taken: 6 in the
// ledger, one log row) and its retry answers 200 with the same. A second one left
// pending meets a rebuild of the gate (a new generation, counted from counters without
// it): the pass records it anew in the new generation and takes it again, so Redis and
// the ledger both end at 4. Invariants and audit hold.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destock_left_pending_is_settled_by_the_workers() {
    let _failpoint = FAILPOINT.lock().await;
    const PRODUCT: i64 = 4304;
    let app = TestApp::spawn().await;
    app.create_product(PRODUCT, 10, None).await;
    fail::cfg("destock-after-gate", "return(DSCRASH_)").expect("failpoint");
    let body = json!({ "request_id": "DSCRASH_1", "quantity": 4 });
    let (s, _) = act(&app, PRODUCT, "destock", body).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(destock_row(&app, "DSCRASH_1").await.0, "pending");
    assert_eq!(app.redis_available(PRODUCT).await, Some(6));
    let ledger_available = format!(
        "SELECT CAST(available_stock AS SIGNED) FROM product_inventory WHERE product_id = {PRODUCT}"
    );
    assert_eq!(
        app.count(&ledger_available).await,
        10,
        "not in the ledger yet"
    );
    invariants::assert_audit_clean(&app, PRODUCT).await;
    fail::cfg("destock-after-gate", "off").expect("failpoint");
    assert_eq!(app.destocking.settle_pending(10).await.expect("pass"), 1);
    assert_eq!(destock_row(&app, "DSCRASH_1").await.0, "taken");
    let (s, b) = destock(&app, PRODUCT, "DSCRASH_1", 4).await;
    assert_eq!((s, inventory(&b)), (StatusCode::OK, (6, 6, 0, 0)), "{b}");
    assert_eq!(written(&app, "DSCRASH_1").await, (1, 1, 1));

    fail::cfg("destock-after-gate", "return(DSCRASH_)").expect("failpoint");
    let body = json!({ "request_id": "DSCRASH_2", "quantity": 2 });
    let (s, _) = act(&app, PRODUCT, "destock", body).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    fail::cfg("destock-after-gate", "off").expect("failpoint");
    let (_, recorded_in) = destock_row(&app, "DSCRASH_2").await;
    let product = flashsale_core::ProductId::parse(PRODUCT).expect("id");
    assert!(app.maintenance.rebuild(product).await.expect("rebuild"));
    assert_eq!(
        app.redis_available(PRODUCT).await,
        Some(6),
        "rebuilt without it"
    );
    assert_eq!(app.destocking.settle_pending(10).await.expect("pass"), 1);
    let (state, taken_in) = destock_row(&app, "DSCRASH_2").await;
    assert_eq!((state.as_str(), taken_in), ("taken", recorded_in + 1));
    assert_eq!(app.redis_available(PRODUCT).await, Some(4));
    assert_eq!(counters(&app, PRODUCT).await, (4, 4, 0, 0));
    invariants::assert_sound_and_clean_up(app, PRODUCT).await;
}

// Checks a destock left pending in gate mode (the failpoint `destock-after-gate`) whose
// Redis then dies: once the product sells from the ledger, the workers' pass settles it
// by MariaDB's counters alone (Redis does not answer, and its take belonged to a
// generation the switch ended), and its retry answers 200 with the same counters. How:
// 20 units, one sold; 5 destocked and left pending (Redis 14, the ledger untouched);
// Redis killed; a purchase moves the product to ledger mode; one pass settles it: total
// 15, available 13. The audit (the ledger alone) is clean.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pending_destock_is_settled_by_the_ledger_once_redis_is_gone() {
    let _failpoint = FAILPOINT.lock().await;
    const PRODUCT: i64 = 4305;
    let (mut redis, app, workers) = on_private_redis(PRODUCT).await;
    let (s, _, _) = app.purchase_until_known("REQ_dg_1", 1, PRODUCT, 1).await;
    assert_eq!(s, StatusCode::CREATED);
    fail::cfg("destock-after-gate", "return(DSGONE_)").expect("failpoint");
    let body = json!({ "request_id": "DSGONE_1", "quantity": 5 });
    let (s, _) = act(&app, PRODUCT, "destock", body).await;
    fail::cfg("destock-after-gate", "off").expect("failpoint");
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(app.redis_available(PRODUCT).await, Some(14));
    assert_eq!(destock_row(&app, "DSGONE_1").await.0, "pending");
    redis.kill9().expect("kill redis");
    let (s, b, _) = app.purchase_until_known("REQ_dg_2", 2, PRODUCT, 1).await;
    assert_eq!(s, StatusCode::CREATED, "sold from the ledger: {b}");
    assert_eq!(app.destocking.settle_pending(10).await.expect("pass"), 1);
    assert_eq!(destock_row(&app, "DSGONE_1").await.0, "taken");
    let (s, b) = destock(&app, PRODUCT, "DSGONE_1", 5).await;
    assert_eq!((s, inventory(&b)), (StatusCode::OK, (15, 13, 2, 0)), "{b}");
    assert_eq!(written(&app, "DSGONE_1").await, (1, 1, 1));
    workers.stop().await;
    invariants::assert_audit_clean(&app, PRODUCT).await;
    app.cleanup().await;
}
