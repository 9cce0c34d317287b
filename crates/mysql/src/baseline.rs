//! The seeds' database strategies (benchmark baselines, see `flashsale_app::baseline`):
//! one transaction per attempt on the product's hot stock row.

use std::time::Duration;

use async_trait::async_trait;
use flashsale_app::baseline::{BaselineLedger, BaselineOutcome};
use flashsale_app::LedgerError;
use flashsale_core::PurchaseRequest;

use crate::ledger::{insert_order, is_duplicate, MysqlLedger};

/// How a baseline takes its units in its transaction.
#[derive(Clone, Copy)]
enum Take {
    /// `SELECT … FOR UPDATE`, compare, `UPDATE`.
    Pessimistic,
    /// `UPDATE … WHERE available_stock >= q`.
    Conditional,
    /// Nothing: the units were taken in Redis.
    None,
}

impl MysqlLedger {
    async fn baseline(
        &self,
        request: &PurchaseRequest,
        payment_timeout: Duration,
        take: Take,
    ) -> Result<BaselineOutcome, sqlx::Error> {
        let q = request.quantity.get();
        let p = request.product_id.get();
        let mut tx = self.pool().begin().await?;
        let enough = match take {
            Take::Pessimistic => {
                let available: Option<i64> = sqlx::query_scalar(
                    "SELECT available_stock FROM product_inventory WHERE product_id = ? FOR UPDATE",
                )
                .bind(p)
                .fetch_optional(&mut *tx)
                .await?;
                if available.unwrap_or(0) < i64::from(q) {
                    false
                } else {
                    sqlx::query(
                        "UPDATE product_inventory SET available_stock = available_stock - ?, \
                         pre_deduct_stock = pre_deduct_stock + ? WHERE product_id = ?",
                    )
                    .bind(q)
                    .bind(q)
                    .bind(p)
                    .execute(&mut *tx)
                    .await?;
                    true
                }
            }
            Take::Conditional => {
                sqlx::query(
                    "UPDATE product_inventory SET available_stock = available_stock - ?, \
                     pre_deduct_stock = pre_deduct_stock + ? \
                     WHERE product_id = ? AND available_stock >= ?",
                )
                .bind(q)
                .bind(q)
                .bind(p)
                .bind(q)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                    == 1
            }
            Take::None => true,
        };
        if !enough {
            tx.rollback().await?;
            return Ok(BaselineOutcome::SoldOut);
        }
        match insert_order(&mut tx, request, payment_timeout).await {
            Ok(order) => {
                tx.commit().await?;
                Ok(BaselineOutcome::Created(order))
            }
            Err(e) if is_duplicate(&e) => {
                tx.rollback().await?;
                let row = sqlx::query(&format!(
                    "SELECT {} FROM orders o WHERE o.request_id = ?",
                    crate::rows::ORDER_COLUMNS
                ))
                .bind(request.request_id.as_str())
                .fetch_one(self.pool())
                .await?;
                let order = crate::rows::order(&row).map_err(crate::rows::undecodable)?;
                Ok(BaselineOutcome::Existing(order))
            }
            Err(e) => Err(e),
        }
    }
}

#[async_trait]
impl BaselineLedger for MysqlLedger {
    async fn purchase_pessimistic(
        &self,
        request: &PurchaseRequest,
        payment_timeout: Duration,
    ) -> Result<BaselineOutcome, LedgerError> {
        self.run("baseline db-pessimistic", || {
            self.baseline(request, payment_timeout, Take::Pessimistic)
        })
        .await
    }

    async fn purchase_conditional(
        &self,
        request: &PurchaseRequest,
        payment_timeout: Duration,
    ) -> Result<BaselineOutcome, LedgerError> {
        self.run("baseline db-conditional", || {
            self.baseline(request, payment_timeout, Take::Conditional)
        })
        .await
    }

    async fn insert_order(
        &self,
        request: &PurchaseRequest,
        payment_timeout: Duration,
    ) -> Result<BaselineOutcome, LedgerError> {
        self.run("baseline insert order", || {
            self.baseline(request, payment_timeout, Take::None)
        })
        .await
    }
}
