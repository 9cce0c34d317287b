//! The seeds' database strategies (benchmark baselines, see `flashsale_app::baseline`):
//! one transaction per attempt on the product's hot stock row, each a stored procedure of
//! migration `…12_baseline_procedures.sql` called in one round trip; and the guarded
//! strategies' transaction (db-optimistic, redis-lock), migration
//! `…30_baseline_guarded.sql`'s procedure, with the one read they start with.
//!
//! The CALL is a prepared statement (sqlx prepares it once per connection and keeps it in
//! the connection's statement cache), sent in autocommit: the procedure begins and
//! commits its own transaction, so the product's row is locked only while MariaDB runs
//! it, never across a round trip. Its one result set is the answer; nothing is read back.
//! The connections are the ledger's own (`dedicated.rs`, as many as the pool's), not the
//! pool's: sqlx pings a pooled connection when it goes back to the pool, a second round
//! trip per transaction that flashsale's own group commit does not pay either (its
//! workers make 5–7 % more orders a second without it).

use std::time::Duration;

use async_trait::async_trait;
use flashsale_app::baseline::{BaselineLedger, BaselineOutcome, Guard, Guarded, StockRead};
use flashsale_app::{LedgerError, Order};
use flashsale_core::{
    CancelReason, OrderId, OrderStatus, ProductId, PurchaseRequest, RequestId, UserId,
};
use sqlx::mysql::MySqlRow;
use sqlx::Row;

use crate::dedicated::Dedicated;
use crate::ledger::MysqlLedger;
use crate::rows::{corrupt, undecodable};
use crate::sql::{db, micros};

/// `SELECT … FOR UPDATE`, compare, `UPDATE`, `INSERT` the order.
const PESSIMISTIC: &str = "CALL baseline_pessimistic(?, ?, ?, ?, ?)";
/// `UPDATE … WHERE available_stock >= q`, `ROW_COUNT()`, `INSERT` the order.
const CONDITIONAL: &str = "CALL baseline_conditional(?, ?, ?, ?, ?)";
/// `INSERT` the order (redis-lua: the units were taken in Redis).
const INSERT_ORDER: &str = "CALL baseline_insert_order(?, ?, ?, ?, ?)";
/// A replay check, `UPDATE … WHERE available_stock >= q` (and the version, if given),
/// the per-user limit, `INSERT` the order (db-optimistic, redis-lock).
const GUARDED: &str = "CALL baseline_guarded(?, ?, ?, ?, ?, ?)";
/// The guarded strategies' first read: the stock row, and whether the request_id has an
/// order; one statement, so both are read in one snapshot, without a lock.
const READ_STOCK: &str = "SELECT i.available_stock, i.version, \
     CAST(EXISTS (SELECT 1 FROM orders o WHERE o.request_id = ?) AS SIGNED) \
     FROM product_inventory i WHERE i.product_id = ?";

/// The result set's columns, by position (a prepared CALL's result set has no column
/// names in sqlx: its PREPARE announces none). Every answer starts with the outcome; a
/// created order or a replay go on with the order's id and times; a replay then with the
/// rest of the existing order.
mod column {
    pub(super) const OUTCOME: usize = 0;
    /// A conflict's row: its version and available stock.
    pub(super) const VERSION: usize = 1;
    pub(super) const AVAILABLE: usize = 2;
    pub(super) const ID: usize = 1;
    pub(super) const CREATED_AT: usize = 2;
    pub(super) const EXPIRES_AT: usize = 3;
    pub(super) const REQUEST_ID: usize = 4;
    pub(super) const USER_ID: usize = 5;
    pub(super) const PRODUCT_ID: usize = 6;
    pub(super) const QUANTITY: usize = 7;
    pub(super) const STATUS: usize = 8;
    pub(super) const PAID_AT: usize = 9;
    pub(super) const CANCELLED_AT: usize = 10;
    pub(super) const CANCEL_REASON: usize = 11;
}

/// Calls one of the baseline procedures for `request`: one prepared statement, one round
/// trip, on a connection of `conns` in autocommit. `guard` is the guarded procedure's
/// sixth parameter, None for migration 12's procedures, which take five.
pub(crate) async fn call(
    conns: &Dedicated,
    procedure: &'static str,
    request: &PurchaseRequest,
    payment_timeout: Duration,
    guard: Option<Guard>,
) -> Result<Guarded, sqlx::Error> {
    let mut own = conns.take().await?;
    let mut query = sqlx::query(procedure)
        .bind(request.request_id.as_str())
        .bind(request.user_id.get())
        .bind(request.product_id.get())
        .bind(request.quantity.get())
        .bind(micros(payment_timeout));
    if let Some(guard) = guard {
        query = query.bind(match guard {
            Guard::Version(version) => Some(version),
            Guard::Lock => None,
        });
    }
    let rows = query.fetch_all(own.conn()).await;
    own.give_back(&rows).await;
    let rows = rows?;
    match rows.as_slice() {
        [row] => outcome(row, request).map_err(undecodable),
        _ => Err(undecodable(corrupt(format!(
            "{procedure} answered {} rows instead of one",
            rows.len()
        )))),
    }
}

/// A migration 12 procedure's answer, which is never a conflict.
async fn unguarded(
    conns: &Dedicated,
    procedure: &'static str,
    request: &PurchaseRequest,
    payment_timeout: Duration,
) -> Result<BaselineOutcome, sqlx::Error> {
    match call(conns, procedure, request, payment_timeout, None).await? {
        Guarded::Done(outcome) => Ok(outcome),
        Guarded::Conflict(_) => Err(undecodable(corrupt(format!(
            "{procedure} answered a version conflict, which it has no version for"
        )))),
    }
}

/// What a procedure's one row says.
fn outcome(row: &MySqlRow, request: &PurchaseRequest) -> Result<Guarded, LedgerError> {
    let said: String = row.try_get_unchecked(column::OUTCOME).map_err(db)?;
    Ok(Guarded::Done(match said.as_str() {
        "created" => BaselineOutcome::Created(Order {
            order_id: order_id(row)?,
            request_id: request.request_id.clone(),
            user_id: request.user_id,
            product_id: request.product_id,
            quantity: request.quantity,
            status: OrderStatus::PendingPayment,
            created_at: row.try_get(column::CREATED_AT).map_err(db)?,
            expires_at: row.try_get(column::EXPIRES_AT).map_err(db)?,
            paid_at: None,
            cancelled_at: None,
            cancel_reason: None,
            refunded_at: None,
        }),
        "replay" => BaselineOutcome::Existing(existing(row)?),
        "sold_out" => BaselineOutcome::SoldOut,
        "limit_exceeded" => BaselineOutcome::LimitExceeded,
        "conflict" => {
            return Ok(Guarded::Conflict(StockRead {
                version: row.try_get(column::VERSION).map_err(db)?,
                available: row.try_get(column::AVAILABLE).map_err(db)?,
            }))
        }
        other => return Err(corrupt(format!("baseline outcome {other:?}"))),
    }))
}

/// The guarded strategies' first read, on a connection of `conns`.
async fn read_stock(
    conns: &Dedicated,
    product_id: ProductId,
    request_id: &RequestId,
) -> Result<Option<(StockRead, bool)>, sqlx::Error> {
    let mut own = conns.take().await?;
    let row: Result<Option<(i64, i64, i64)>, _> = sqlx::query_as(READ_STOCK)
        .bind(request_id.as_str())
        .bind(product_id.get())
        .fetch_optional(own.conn())
        .await;
    own.give_back(&row).await;
    Ok(row?.map(|(available, version, ordered)| (StockRead { available, version }, ordered != 0)))
}

fn order_id(row: &MySqlRow) -> Result<OrderId, LedgerError> {
    OrderId::parse(row.try_get(column::ID).map_err(db)?).map_err(corrupt)
}

/// The existing order a replay answers with, as `rows::order` reads an order by name.
fn existing(row: &MySqlRow) -> Result<Order, LedgerError> {
    let text = |i: usize| row.try_get_unchecked::<String, _>(i).map_err(db);
    let request_id = text(column::REQUEST_ID)?;
    let status = text(column::STATUS)?;
    let cancel_reason = row
        .try_get_unchecked::<Option<String>, _>(column::CANCEL_REASON)
        .map_err(db)?
        .map(|r| r.parse::<CancelReason>().map_err(corrupt))
        .transpose()?;
    Ok(Order {
        order_id: order_id(row)?,
        request_id: RequestId::stored("request_id", &request_id).map_err(corrupt)?,
        user_id: UserId::parse(row.try_get(column::USER_ID).map_err(db)?).map_err(corrupt)?,
        product_id: ProductId::parse(row.try_get(column::PRODUCT_ID).map_err(db)?)
            .map_err(corrupt)?,
        quantity: crate::rows::quantity(row.try_get::<i32, _>(column::QUANTITY).map_err(db)?)?,
        status: status.parse::<OrderStatus>().map_err(corrupt)?,
        created_at: row.try_get(column::CREATED_AT).map_err(db)?,
        expires_at: row.try_get(column::EXPIRES_AT).map_err(db)?,
        paid_at: row.try_get(column::PAID_AT).map_err(db)?,
        cancelled_at: row.try_get(column::CANCELLED_AT).map_err(db)?,
        cancel_reason,
        // The baselines' orders are never refunded.
        refunded_at: None,
    })
}

#[async_trait]
impl BaselineLedger for MysqlLedger {
    async fn purchase_pessimistic(
        &self,
        request: &PurchaseRequest,
        payment_timeout: Duration,
    ) -> Result<BaselineOutcome, LedgerError> {
        self.run("baseline db-pessimistic", || {
            unguarded(&self.baseline_conns, PESSIMISTIC, request, payment_timeout)
        })
        .await
    }

    async fn purchase_conditional(
        &self,
        request: &PurchaseRequest,
        payment_timeout: Duration,
    ) -> Result<BaselineOutcome, LedgerError> {
        self.run("baseline db-conditional", || {
            unguarded(&self.baseline_conns, CONDITIONAL, request, payment_timeout)
        })
        .await
    }

    async fn insert_order(
        &self,
        request: &PurchaseRequest,
        payment_timeout: Duration,
    ) -> Result<BaselineOutcome, LedgerError> {
        self.run("baseline insert order", || {
            unguarded(&self.baseline_conns, INSERT_ORDER, request, payment_timeout)
        })
        .await
    }

    async fn read_stock(
        &self,
        product_id: ProductId,
        request_id: &RequestId,
    ) -> Result<Option<(StockRead, bool)>, LedgerError> {
        self.run("baseline read stock", || {
            read_stock(&self.baseline_conns, product_id, request_id)
        })
        .await
    }

    async fn purchase_guarded(
        &self,
        request: &PurchaseRequest,
        guard: Guard,
        payment_timeout: Duration,
    ) -> Result<Guarded, LedgerError> {
        self.run("baseline guarded", || {
            call(
                &self.baseline_conns,
                GUARDED,
                request,
                payment_timeout,
                Some(guard),
            )
        })
        .await
    }
}
