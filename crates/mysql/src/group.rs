//! Group commit: many purchases in one transaction, with multi-row INSERTs and one
//! counter UPDATE per product — the same rows, counters and events as one purchase's
//! transaction (`MysqlLedger::insert_purchase`), written for a whole batch at once. A
//! batch that meets anything but the plain case (a request_id or hold id already taken,
//! too few units, a rebuilt generation) is rolled back whole and its purchases are
//! committed one by one instead, where each such case has its answer.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use flashsale_core::{OrderId, OrderStatus, PurchaseRequest};
use sqlx::{MySqlConnection, Row};

use flashsale_app::Order;

/// One purchase of a batch.
#[derive(Debug, Clone)]
pub(crate) struct Purchase {
    pub request: PurchaseRequest,
    pub hold_id: i64,
    pub generation: i64,
    pub payment_timeout: Duration,
}

/// The request_ids of `batch` already taken in the ledger (committed by now).
pub(crate) async fn taken(
    pool: &sqlx::MySqlPool,
    batch: &[Purchase],
) -> Result<std::collections::HashSet<String>, sqlx::Error> {
    let sql = format!(
        "SELECT CONVERT(request_id USING utf8mb4) AS request_id FROM inventory_reservation \
         WHERE request_id IN ({})",
        crate::rows::list(batch.len(), "?")
    );
    let mut q = sqlx::query(&sql);
    for p in batch {
        q = q.bind(p.request.request_id.as_str());
    }
    q.fetch_all(pool)
        .await?
        .iter()
        .map(|row| row.try_get_unchecked::<String, _>("request_id"))
        .collect()
}

/// Writes every purchase of `batch` in the open transaction `tx`, or nothing: `Ok(None)`
/// when one of them can't go the plain way (the caller rolls back and commits them one by
/// one). On `Ok(Some(orders))` the caller commits; `orders` are in `batch` order.
pub(crate) async fn insert(
    tx: &mut MySqlConnection,
    batch: &[Purchase],
) -> Result<Option<Vec<Order>>, sqlx::Error> {
    let n = batch.len();
    let sql = format!(
        "INSERT INTO inventory_reservation \
         (request_id, product_id, user_id, quantity, hold_id, generation, status) VALUES {}",
        crate::rows::list(n, "(?, ?, ?, ?, ?, ?, 'PROCESSING')")
    );
    let mut q = sqlx::query(&sql);
    for p in batch {
        q = q
            .bind(p.request.request_id.as_str())
            .bind(p.request.product_id.get())
            .bind(p.request.user_id.get())
            .bind(p.request.quantity.get())
            .bind(p.hold_id)
            .bind(p.generation);
    }
    match q.execute(&mut *tx).await {
        // A request_id or a hold id taken: the one-by-one path tells which and answers.
        Err(e) if crate::ledger::is_duplicate(&e) => return Ok(None),
        other => other?,
    };
    // NOW(6) is the statement's start time: one value for every row.
    let sql = format!(
        "INSERT INTO orders (request_id, user_id, product_id, quantity, status, created_at, \
         expires_at) VALUES {}",
        crate::rows::list(
            n,
            "(?, ?, ?, ?, 'PENDING_PAYMENT', NOW(6), NOW(6) + INTERVAL ? MICROSECOND)"
        )
    );
    let mut q = sqlx::query(&sql);
    for p in batch {
        q = q
            .bind(p.request.request_id.as_str())
            .bind(p.request.user_id.get())
            .bind(p.request.product_id.get())
            .bind(p.request.quantity.get())
            .bind(crate::ledger::micros(p.payment_timeout));
    }
    match q.execute(&mut *tx).await {
        Err(e) if crate::ledger::is_duplicate(&e) => return Ok(None),
        other => other?,
    };
    let sql = format!(
        "SELECT id, CONVERT(request_id USING utf8mb4) AS request_id, created_at, expires_at \
         FROM orders WHERE request_id IN ({})",
        crate::rows::list(n, "?")
    );
    let mut q = sqlx::query(&sql);
    for p in batch {
        q = q.bind(p.request.request_id.as_str());
    }
    let mut written: HashMap<String, (i64, _, _)> = HashMap::with_capacity(n);
    for row in q.fetch_all(&mut *tx).await? {
        let request_id: String = row.try_get_unchecked("request_id")?;
        written.insert(
            request_id,
            (
                row.try_get::<i64, _>("id")?,
                row.try_get("created_at")?,
                row.try_get("expires_at")?,
            ),
        );
    }
    let mut orders = Vec::with_capacity(n);
    for p in batch {
        let Some(&(id, created_at, expires_at)) = written.get(p.request.request_id.as_str()) else {
            return Err(sqlx::Error::Protocol(format!(
                "order of {} not found right after its insert",
                p.request.request_id
            )));
        };
        orders.push(Order {
            order_id: OrderId::parse(id).map_err(|e| sqlx::Error::Decode(e.into()))?,
            request_id: p.request.request_id.clone(),
            user_id: p.request.user_id,
            product_id: p.request.product_id,
            quantity: p.request.quantity,
            status: OrderStatus::PendingPayment,
            created_at,
            expires_at,
            paid_at: None,
            cancelled_at: None,
            cancel_reason: None,
        });
    }
    let sql = format!(
        "INSERT INTO inventory_log (request_id, product_id, order_id, quantity, type) VALUES {}",
        crate::rows::list(n, "(?, ?, ?, ?, 'reserve')")
    );
    let mut q = sqlx::query(&sql);
    for (p, o) in batch.iter().zip(&orders) {
        q = q
            .bind(p.request.request_id.as_str())
            .bind(p.request.product_id.get())
            .bind(o.order_id.get())
            .bind(p.request.quantity.get());
    }
    q.execute(&mut *tx).await?;
    crate::outbox::record_created(&mut *tx, &orders).await?;
    // The hot rows last, in product order (two batches never wait on each other in a
    // cycle), each once for all its units; the conditions as in the one-purchase path.
    let mut units: BTreeMap<(i64, i64), i64> = BTreeMap::new();
    for p in batch {
        *units
            .entry((p.request.product_id.get(), p.generation))
            .or_default() += i64::from(p.request.quantity.get());
    }
    for ((product_id, generation), q) in units {
        let updated = sqlx::query(
            "UPDATE product_inventory SET available_stock = available_stock - ?, \
             pre_deduct_stock = pre_deduct_stock + ?, version = version + 1 \
             WHERE product_id = ? AND available_stock >= ? AND generation = ?",
        )
        .bind(q)
        .bind(q)
        .bind(product_id)
        .bind(q)
        .bind(generation)
        .execute(&mut *tx)
        .await?;
        if updated.rows_affected() != 1 {
            return Ok(None);
        }
    }
    Ok(Some(orders))
}
