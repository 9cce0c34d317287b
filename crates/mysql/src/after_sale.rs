//! Retiring ended sales in the ledger (app/src/after_sale.rs has the protocol): which
//! products qualify, and the retirement itself, one transaction under the inventory
//! row's lock (then the product row's, the lock a change of the sale window takes) that
//! checks the conditions again, moves the product to the next stock generation and marks
//! its gate not loaded; and the way back, a rebuild's plan in the next generation with the
//! gate marked loaded, for the gate to be rebuilt from.

use std::time::Duration;

use async_trait::async_trait;
use flashsale_app::after_sale::SaleRetirements;
use flashsale_app::ports::RebuildPlan;
use flashsale_app::LedgerError;
use flashsale_core::{Generation, ProductId, StockMode};
use sqlx::MySqlConnection;

use crate::ledger::MysqlLedger;
use crate::maintenance::{self, advance_locked, lock_inventory, lock_product_loaded};
use crate::sql::micros;

/// A product `p` whose sale may be retired (binds the grace in µs): gate mode, gate
/// loaded, its sale ended more than the grace ago by the database's clock, and nothing
/// the gate still owes or is owed: no unpaid order, no PROCESSING reservation, no
/// release the gate has not had, no restock not applied, no pending destock.
const RETIRABLE: &str = "p.stock_loaded = 1 AND i.stock_mode = 'GATE' \
     AND p.sale_ends_at IS NOT NULL AND p.sale_ends_at < NOW(6) - INTERVAL ? MICROSECOND \
     AND NOT EXISTS (SELECT 1 FROM orders o \
       WHERE o.product_id = p.product_id AND o.status = 'PENDING_PAYMENT') \
     AND NOT EXISTS (SELECT 1 FROM inventory_reservation r WHERE r.product_id = p.product_id \
       AND (r.status = 'PROCESSING' OR (r.status = 'RELEASED' AND r.stock_returned = 0))) \
     AND NOT EXISTS (SELECT 1 FROM restock_request s \
       WHERE s.product_id = p.product_id AND s.gate_applied = 0) \
     AND NOT EXISTS (SELECT 1 FROM destock_request d \
       WHERE d.product_id = p.product_id AND d.state = 'pending')";

#[async_trait]
impl SaleRetirements for MysqlLedger {
    async fn retirable_sales(
        &self,
        grace: Duration,
        limit: usize,
    ) -> Result<Vec<ProductId>, LedgerError> {
        let sql = format!(
            "SELECT p.product_id FROM products p \
             JOIN product_inventory i ON i.product_id = p.product_id \
             WHERE {RETIRABLE} ORDER BY p.sale_ends_at, p.product_id LIMIT ?"
        );
        let ids: Vec<i64> = self
            .run("retirable sales", || async {
                sqlx::query_scalar(&sql)
                    .bind(micros(grace))
                    .bind(maintenance::limit(limit))
                    .fetch_all(&self.pool())
                    .await
            })
            .await?;
        maintenance::product_ids(ids)
    }

    async fn retire_sale(
        &self,
        product_id: ProductId,
        grace: Duration,
    ) -> Result<Option<Generation>, LedgerError> {
        self.run("retire a sale", || self.retire_once(product_id, grace))
            .await
    }

    async fn reload_plan(&self, product_id: ProductId) -> Result<Option<RebuildPlan>, LedgerError> {
        self.run("reload a retired sale", || self.reload_once(product_id))
            .await
    }

    async fn unswept(&self, limit: usize) -> Result<Vec<(ProductId, Generation)>, LedgerError> {
        let rows: Vec<(i64, i64)> = self
            .run("unswept retirements", || async {
                sqlx::query_as(
                    "SELECT product_id, gate_sweep_generation FROM products \
                     WHERE gate_sweep_generation IS NOT NULL ORDER BY product_id LIMIT ?",
                )
                .bind(maintenance::limit(limit))
                .fetch_all(&self.pool())
                .await
            })
            .await?;
        rows.into_iter()
            .map(|(p, g)| {
                let product = ProductId::parse(p).map_err(crate::rows::corrupt)?;
                Ok((product, crate::rows::generation(g)?))
            })
            .collect()
    }

    async fn swept(
        &self,
        product_id: ProductId,
        generation: Generation,
    ) -> Result<(), LedgerError> {
        self.run("retirement swept", || async {
            sqlx::query(
                "UPDATE products SET gate_sweep_generation = NULL \
                 WHERE product_id = ? AND gate_sweep_generation = ?",
            )
            .bind(product_id.get())
            .bind(generation.get())
            .execute(&self.pool())
            .await
        })
        .await
        .map(drop)
    }
}

impl MysqlLedger {
    /// One attempt of [`SaleRetirements::retire_sale`].
    async fn retire_once(
        &self,
        product_id: ProductId,
        grace: Duration,
    ) -> Result<Option<Generation>, sqlx::Error> {
        let p = product_id.get();
        let mut tx = self.pool().begin().await?;
        let Some(locked) = lock_inventory(&mut tx, p).await? else {
            return Ok(None);
        };
        let generation = locked.generation;
        if !still_retirable(&mut tx, p, grace).await? {
            tx.rollback().await?;
            return Ok(None);
        }
        // The next generation fences every hold of the retired one (a late commit needs
        // its hold's generation); the gate's next load starts its hold ids afresh.
        sqlx::query(
            "UPDATE product_inventory SET generation = ?, version = version + 1 \
             WHERE product_id = ?",
        )
        .bind(generation.next().get())
        .bind(p)
        .execute(&mut *tx)
        .await?;
        // The gate's step is owed from this commit on, until the pass records it done.
        sqlx::query(
            "UPDATE products SET stock_loaded = 0, gate_sweep_generation = ? \
             WHERE product_id = ?",
        )
        .bind(generation.get())
        .bind(p)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Some(generation))
    }

    /// One attempt of [`SaleRetirements::reload_plan`].
    async fn reload_once(&self, product_id: ProductId) -> Result<Option<RebuildPlan>, sqlx::Error> {
        let p = product_id.get();
        let mut tx = self.pool().begin().await?;
        let Some(locked) = lock_inventory(&mut tx, p).await? else {
            return Ok(None);
        };
        let loaded = lock_product_loaded(&mut tx, p).await?;
        if locked.mode != StockMode::Gate || loaded != Some(false) {
            tx.rollback().await?;
            return Ok(None);
        }
        let plan = advance_locked(&mut tx, p, &locked, false).await?;
        sqlx::query("UPDATE products SET stock_loaded = 1 WHERE product_id = ?")
            .bind(p)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Some(plan))
    }
}

/// The conditions of [`RETIRABLE`] read again in `tx`, under the inventory row's lock
/// (taken) and the product row's (taken here): a change of the window commits before or
/// after, never in between.
async fn still_retirable(
    tx: &mut MySqlConnection,
    p: i64,
    grace: Duration,
) -> Result<bool, sqlx::Error> {
    lock_product_loaded(&mut *tx, p).await?;
    let sql = format!(
        "SELECT COUNT(*) FROM products p \
         JOIN product_inventory i ON i.product_id = p.product_id \
         WHERE p.product_id = ? AND {RETIRABLE}"
    );
    let n: i64 = sqlx::query_scalar(&sql)
        .bind(p)
        .bind(micros(grace))
        .fetch_one(&mut *tx)
        .await?;
    Ok(n == 1)
}
