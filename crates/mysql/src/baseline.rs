//! The seeds' database strategies (benchmark baselines, see `flashsale_app::baseline`):
//! one transaction per attempt on the product's hot stock row, each a stored procedure of
//! migration `…12_baseline_procedures.sql` called in one round trip.
//!
//! The CALL is a prepared statement (sqlx prepares it once per connection and keeps it in
//! the connection's statement cache), sent in autocommit: the procedure begins and
//! commits its own transaction, so the product's row is locked only while MariaDB runs
//! it, never across a round trip. Its one result set is the answer; nothing is read back.
//! The connections are the ledger's own (`dedicated.rs`, as many as the pool's), not the
//! pool's: sqlx pings a pooled connection when it goes back to the pool, a second round
//! trip per transaction that flashsale's own group commit does not pay either
//! (BENCHMARKS.md, ablation row L12).

use std::time::Duration;

use async_trait::async_trait;
use flashsale_app::baseline::{BaselineLedger, BaselineOutcome};
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

/// The result set's columns, by position (a prepared CALL's result set has no column
/// names in sqlx: its PREPARE announces none). Every answer starts with the outcome; a
/// created order or a replay go on with the order's id and times; a replay then with the
/// rest of the existing order.
mod column {
    pub(super) const OUTCOME: usize = 0;
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
/// trip, on a connection of `conns` in autocommit.
pub(crate) async fn call(
    conns: &Dedicated,
    procedure: &'static str,
    request: &PurchaseRequest,
    payment_timeout: Duration,
) -> Result<BaselineOutcome, sqlx::Error> {
    let mut own = conns.take().await?;
    let rows = sqlx::query(procedure)
        .bind(request.request_id.as_str())
        .bind(request.user_id.get())
        .bind(request.product_id.get())
        .bind(request.quantity.get())
        .bind(micros(payment_timeout))
        .fetch_all(own.conn())
        .await;
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

/// What a procedure's one row says.
fn outcome(row: &MySqlRow, request: &PurchaseRequest) -> Result<BaselineOutcome, LedgerError> {
    let said: String = row.try_get_unchecked(column::OUTCOME).map_err(db)?;
    match said.as_str() {
        "created" => Ok(BaselineOutcome::Created(Order {
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
        })),
        "replay" => Ok(BaselineOutcome::Existing(existing(row)?)),
        "sold_out" => Ok(BaselineOutcome::SoldOut),
        other => Err(corrupt(format!("baseline outcome {other:?}"))),
    }
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
        request_id: RequestId::parse("request_id", &request_id).map_err(corrupt)?,
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
            call(&self.baseline_conns, PESSIMISTIC, request, payment_timeout)
        })
        .await
    }

    async fn purchase_conditional(
        &self,
        request: &PurchaseRequest,
        payment_timeout: Duration,
    ) -> Result<BaselineOutcome, LedgerError> {
        self.run("baseline db-conditional", || {
            call(&self.baseline_conns, CONDITIONAL, request, payment_timeout)
        })
        .await
    }

    async fn insert_order(
        &self,
        request: &PurchaseRequest,
        payment_timeout: Duration,
    ) -> Result<BaselineOutcome, LedgerError> {
        self.run("baseline insert order", || {
            call(&self.baseline_conns, INSERT_ORDER, request, payment_timeout)
        })
        .await
    }
}
