//! Checks the invariants of docs/INVARIANTS.md that a quiet system (no request in
//! flight) must satisfy for one product, reading MariaDB and Redis directly. Returns
//! every violation found, described for a person, so a failing test says what broke.

use std::collections::BTreeMap;

use flashsale_core::InventoryCounters;
use sqlx::Row;

use crate::helpers::TestApp;

/// The checks, in the order the invariants are numbered:
/// - I1: units of PENDING_PAYMENT + PAID orders ≤ total; Redis available ≥ 0.
/// - I2: one order and one reservation per request_id; every order has its reservation.
/// - I3: each reservation's state matches its order's (PROCESSING ↔ PENDING_PAYMENT,
///   CONFIRMED ↔ PAID, RELEASED ↔ CANCELLED, REFUNDED or no order), and every RELEASED
///   one has its units back in Redis (a withdrawn refund's: its hold let go).
/// - I4: Redis available == total − units of live orders; the ledger's counters agree with
///   the orders; every hold Redis still has units for is a live reservation with the same
///   hold id, so no decrement is untraceable. (A live reservation may lack its Redis
///   record once the record's retention has passed; the units are then only counted.)
pub async fn check(app: &TestApp, product_id: i64) -> Vec<String> {
    check_on(app, &app.pool, product_id).await
}

/// [`check`] with the ledger read through `pool`: one node of a Galera cluster, say,
/// each of which must hold the same facts.
pub async fn check_on(app: &TestApp, pool: &sqlx::MySqlPool, product_id: i64) -> Vec<String> {
    let mut violations = Vec::new();
    let row = sqlx::query(
        "SELECT total_stock, available_stock, pre_deduct_stock, sold_count \
         FROM product_inventory WHERE product_id = ?",
    )
    .bind(product_id)
    .fetch_one(pool)
    .await
    .expect("inventory row");
    let counters = InventoryCounters {
        total: row.get("total_stock"),
        available: row.get("available_stock"),
        reserved: row.get("pre_deduct_stock"),
        sold: row.get("sold_count"),
    };
    let units = |status: &'static str| {
        sqlx::query_scalar::<_, i64>(
            "SELECT CAST(COALESCE(SUM(quantity), 0) AS SIGNED) FROM orders \
             WHERE product_id = ? AND status = ?",
        )
        .bind(product_id)
        .bind(status)
        .fetch_one(pool)
    };
    let pending = units("PENDING_PAYMENT").await.expect("sum");
    let paid = units("PAID").await.expect("sum");

    // I1
    if pending + paid > counters.total {
        violations.push(format!(
            "I1 oversell: {pending} pending + {paid} paid units > total {}",
            counters.total
        ));
    }
    let available = app.redis_available(product_id).await;
    match available {
        Some(a) if a < 0 => violations.push(format!("I1: Redis available is {a} < 0")),
        None => violations.push("Redis has no available count".into()),
        _ => {}
    }

    // I2
    let orphans = sqlx::query_scalar::<_, i64>(
        "SELECT COUNT(*) FROM orders o LEFT JOIN inventory_reservation r \
         ON r.request_id = o.request_id WHERE o.product_id = ? AND r.id IS NULL",
    )
    .bind(product_id)
    .fetch_one(pool)
    .await
    .expect("count");
    if orphans != 0 {
        violations.push(format!("I2: {orphans} orders without a reservation"));
    }

    // I3
    let mismatched: Vec<(String, Option<String>, String)> = sqlx::query(
        "SELECT r.request_id, o.status AS o_status, r.status AS r_status \
         FROM inventory_reservation r LEFT JOIN orders o ON o.request_id = r.request_id \
         WHERE r.product_id = ? AND NOT ( \
           (o.status = 'PENDING_PAYMENT' AND r.status = 'PROCESSING') OR \
           (o.status = 'PAID' AND r.status = 'CONFIRMED') OR \
           (o.status = 'CANCELLED' AND r.status = 'RELEASED') OR \
           (o.status = 'REFUNDED' AND r.status = 'RELEASED') OR \
           (o.status IS NULL AND r.status = 'RELEASED'))",
    )
    .bind(product_id)
    .fetch_all(pool)
    .await
    .expect("mismatch query")
    .iter()
    .map(|r| {
        (
            r.get_unchecked("request_id"),
            r.get_unchecked("o_status"),
            r.get_unchecked("r_status"),
        )
    })
    .collect();
    for (request_id, order, reservation) in mismatched.iter().take(10) {
        violations.push(format!(
            "I3: request {request_id}: order {order:?} with reservation {reservation}"
        ));
    }
    let unreturned = sqlx::query_scalar::<_, i64>(
        "SELECT COUNT(*) FROM inventory_reservation \
         WHERE product_id = ? AND status = 'RELEASED' AND stock_returned = 0",
    )
    .bind(product_id)
    .fetch_one(pool)
    .await
    .expect("count");
    if unreturned != 0 {
        violations.push(format!(
            "I3: {unreturned} released reservations whose units are not back in Redis"
        ));
    }

    // I4
    if let Some(a) = available {
        if a != counters.total - pending - paid {
            violations.push(format!(
                "I4: Redis available {a} != total {} - pending {pending} - paid {paid}",
                counters.total
            ));
        }
    }
    if let Err(e) = counters.check_against_orders(pending, paid) {
        violations.push(format!("I4: {e}"));
    }
    let live: BTreeMap<String, i64> = sqlx::query(
        "SELECT request_id, hold_id FROM inventory_reservation \
         WHERE product_id = ? AND status IN ('PROCESSING', 'CONFIRMED')",
    )
    .bind(product_id)
    .fetch_all(pool)
    .await
    .expect("live reservations")
    .iter()
    .map(|r| (r.get_unchecked("request_id"), r.get("hold_id")))
    .collect();
    let held = redis_holds(app, product_id).await;
    let untraced: Vec<_> = held
        .iter()
        .filter(|(request_id, hold)| live.get(*request_id) != Some(*hold))
        .take(10)
        .collect();
    if !untraced.is_empty() {
        violations.push(format!(
            "I4: Redis holds units for holds no live reservation accounts for \
             (request_id, hold id): {untraced:?}"
        ));
    }
    violations
}

/// The holds Redis keeps for a product that still hold units: request_id → hold id.
pub async fn redis_holds(app: &TestApp, product_id: i64) -> BTreeMap<String, i64> {
    let mut conn = app.redis.clone();
    let pattern = app.key(product_id, "r:*");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(&pattern)
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    let marker = app.key(product_id, "r:");
    let generation: Option<i64> = app.entry_field(product_id, "gen").await;
    let mut held = BTreeMap::new();
    for key in keys {
        let (state, hold, g): (Option<String>, Option<i64>, Option<i64>) = redis::cmd("HMGET")
            .arg(&key)
            .arg("s")
            .arg("h")
            .arg("g")
            .query_async(&mut conn)
            .await
            .expect("HMGET");
        // Records of an older generation hold nothing: a rebuild counted without them.
        if state.as_deref() == Some("h") && g.unwrap_or(1) == generation.unwrap_or(1) {
            let request_id = key.strip_prefix(&marker).unwrap_or(&key).to_owned();
            held.insert(request_id, hold.unwrap_or(-1));
        }
    }
    held
}

/// Fails the test with every violation listed.
pub async fn assert_ok(app: &TestApp, product_id: i64) {
    let violations = check(app, product_id).await;
    assert!(
        violations.is_empty(),
        "invariant violations for product {product_id}:\n{}",
        violations.join("\n")
    );
}

/// Runs the service's own audit (the checks of `flashsale audit`) and fails on any
/// violation — except undelivered outbox events, since these tests run no relay (the
/// event tests and the crash tests, which do, check delivery).
pub async fn assert_audit_clean(app: &TestApp, product_id: i64) {
    let product = flashsale_core::ProductId::parse(product_id).expect("product id");
    let report = app.maintenance.audit(product).await.expect("audit");
    assert_report_clean(&report, "");
}

/// Fails the test, `context` before the report, when the audit `report` has a violation
/// other than undelivered outbox events (see [`assert_audit_clean`]).
pub fn assert_report_clean(report: &flashsale_app::audit::AuditReport, context: &str) {
    let real: Vec<_> = report
        .violations
        .iter()
        .filter(|v| !(v.invariant == "I7" && v.message.contains("not yet acknowledged")))
        .collect();
    assert!(real.is_empty(), "{context}{report}");
}

/// [`assert_ok`], then [`assert_audit_clean`]: the product's invariants hold and the
/// service's own audit finds nothing.
pub async fn assert_sound(app: &TestApp, product_id: i64) {
    assert_ok(app, product_id).await;
    assert_audit_clean(app, product_id).await;
}

/// A test's last step: [`assert_ok`], then the instance's stores are cleaned up.
pub async fn assert_ok_and_clean_up(app: TestApp, product_id: i64) {
    assert_ok(&app, product_id).await;
    app.cleanup().await;
}

/// A test's last step: [`assert_sound`], then the instance's stores are cleaned up.
pub async fn assert_sound_and_clean_up(app: TestApp, product_id: i64) {
    assert_sound(&app, product_id).await;
    app.cleanup().await;
}
