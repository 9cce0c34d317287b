//! The lists' reads ([`Listings`]): one indexed query a page. Products walk the primary
//! key; a buyer's orders walk `idx_orders_user` (user_id, and the primary key InnoDB
//! appends to every secondary index) backwards from the cursor, so neither sorts.

use async_trait::async_trait;
use flashsale_app::listing::Listings;
use flashsale_app::{LedgerError, Order, Product};
use flashsale_core::{InventoryCounters, OrderId, OrderStatus, ProductId, UserId};
use sqlx::Row;

use crate::ledger::MysqlLedger;
use crate::rows::{self, ORDER_COLUMNS};
use crate::sql::db;

/// Products after a cursor (binds the cursor, 0 for the first page, and the limit).
pub const PRODUCTS_AFTER: &str = "SELECT p.product_id, p.name, p.per_user_limit, \
     p.sale_starts_at, p.sale_ends_at, p.stock_loaded, p.paused, p.created_at, i.stock_mode, \
     i.total_stock, i.available_stock, i.pre_deduct_stock, i.sold_count \
     FROM products p JOIN product_inventory i ON i.product_id = p.product_id \
     WHERE p.product_id > ? ORDER BY p.product_id LIMIT ?";

/// A buyer's orders before a cursor, newest first (binds the user, the cursor —
/// i64::MAX for the first page — the status or NULL, and the limit).
pub fn orders_sql() -> String {
    format!(
        "SELECT {ORDER_COLUMNS} FROM orders o FORCE INDEX (idx_orders_user) \
         WHERE o.user_id = ? AND o.id < ? AND (? IS NULL OR o.status = ?) \
         ORDER BY o.id DESC LIMIT ?"
    )
}

fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[async_trait]
impl Listings for MysqlLedger {
    async fn products_after(
        &self,
        after: Option<ProductId>,
        n: usize,
    ) -> Result<Vec<(Product, InventoryCounters)>, LedgerError> {
        let found = self
            .run("list products", || async {
                sqlx::query(PRODUCTS_AFTER)
                    .bind(after.map_or(0, ProductId::get))
                    .bind(limit(n))
                    .fetch_all(&self.pool())
                    .await
            })
            .await?;
        found
            .iter()
            .map(|row| {
                let counters = InventoryCounters {
                    total: row.try_get("total_stock").map_err(db)?,
                    available: row.try_get("available_stock").map_err(db)?,
                    reserved: row.try_get("pre_deduct_stock").map_err(db)?,
                    sold: row.try_get("sold_count").map_err(db)?,
                };
                Ok((rows::product(row)?, counters))
            })
            .collect()
    }

    async fn orders_of(
        &self,
        user: UserId,
        status: Option<OrderStatus>,
        before: Option<OrderId>,
        n: usize,
    ) -> Result<Vec<Order>, LedgerError> {
        let sql = orders_sql();
        let status = status.map(OrderStatus::as_str);
        let found = self
            .run("list orders", || async {
                sqlx::query(&sql)
                    .bind(user.get())
                    .bind(before.map_or(i64::MAX, OrderId::get))
                    .bind(status)
                    .bind(status)
                    .bind(limit(n))
                    .fetch_all(&self.pool())
                    .await
            })
            .await?;
        found.iter().map(rows::order).collect()
    }
}
