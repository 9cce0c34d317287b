//! The lists' reads ([`Listings`]): one indexed query a page. Products walk the primary
//! key; a buyer's orders walk `idx_orders_user` (user_id, and the primary key InnoDB
//! appends to every secondary index) backwards from the cursor, so neither sorts; the
//! operator's log walks its primary key, or one product's `idx_admin_action_product`,
//! backwards too.

use async_trait::async_trait;
use flashsale_app::listing::Listings;
use flashsale_app::{LedgerError, LoggedAction, Order, Product};
use flashsale_core::{
    AdminName, InventoryCounters, OrderId, OrderStatus, ProductId, RequestId, UserId,
};
use sqlx::mysql::MySqlRow;
use sqlx::Row;

use crate::ledger::MysqlLedger;
use crate::maintenance::limit;
use crate::rows::{self, corrupt, ORDER_COLUMNS};
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

/// The operator's log before a cursor, newest first (binds the cursor — i64::MAX for the
/// first page — and the limit; with `of_product`, the product first): along the primary
/// key, or `idx_admin_action_product` for one product.
pub fn actions_sql(of_product: bool) -> String {
    let (index, filter) = if of_product {
        ("idx_admin_action_product", "a.product_id = ? AND ")
    } else {
        ("PRIMARY", "")
    };
    format!(
        "SELECT a.id, CAST(a.request_id AS CHAR) AS request_id, CAST(a.action AS CHAR) AS \
         action, a.product_id, CAST(a.admin AS CHAR) AS admin, CAST(a.asked AS CHAR) AS asked, \
         CAST(a.before_state AS CHAR) AS before_state, CAST(a.after_state AS CHAR) AS \
         after_state, a.acted_at FROM admin_action a FORCE INDEX ({index}) \
         WHERE {filter}a.id < ? ORDER BY a.id DESC LIMIT ?"
    )
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

    async fn actions(
        &self,
        product: Option<ProductId>,
        before: Option<i64>,
        n: usize,
    ) -> Result<Vec<LoggedAction>, LedgerError> {
        let sql = actions_sql(product.is_some());
        let found = self
            .run("list admin actions", || async {
                let mut query = sqlx::query(&sql);
                if let Some(product) = product {
                    query = query.bind(product.get());
                }
                query
                    .bind(before.unwrap_or(i64::MAX))
                    .bind(limit(n))
                    .fetch_all(&self.pool())
                    .await
            })
            .await?;
        found.iter().map(logged_action).collect()
    }
}

/// A row of the operator's log.
fn logged_action(row: &MySqlRow) -> Result<LoggedAction, LedgerError> {
    let text = |column: &str| row.try_get::<String, _>(column).map_err(db);
    let admin = text("admin")?;
    Ok(LoggedAction {
        id: row.try_get("id").map_err(db)?,
        request_id: row
            .try_get::<Option<String>, _>("request_id")
            .map_err(db)?
            .map(|r| RequestId::parse("request_id", &r).map_err(corrupt))
            .transpose()?,
        action: text("action")?,
        product_id: ProductId::parse(row.try_get("product_id").map_err(db)?).map_err(corrupt)?,
        admin: AdminName::parse("admin", &admin).map_err(corrupt)?,
        asked: row.try_get("asked").map_err(db)?,
        before: text("before_state")?,
        after: text("after_state")?,
        acted_at: row.try_get("acted_at").map_err(db)?,
    })
}
