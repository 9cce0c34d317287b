//! The operator's controls of a sale in the ledger: a product's `paused` flag and its
//! definition (name, per-user limit, sale window), each changed in one transaction with
//! its line in the operator's log (`admin_action`) and its event, so the change, the log
//! and the event exist together or not at all.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use flashsale_app::control::{Acted, AdminAction, Controls, RefundAsk, Refunded, SaleSwitch};
use flashsale_app::{EventType, LedgerError};
use flashsale_core::{AdminName, Definition, ProductChange, ProductId};
use sqlx::{MySql, MySqlConnection, Transaction};

use crate::ledger::MysqlLedger;
use crate::sql::is_duplicate;

/// An action's event (binds its type twice), written from the `admin_action` row just
/// inserted (`LAST_INSERT_ID()`) in the JSON form docs/events.md gives. Its ordering key
/// is `ADMIN_<row id>`: an admin's request_id is of another namespace than the
/// purchases', and may spell one of theirs.
const ACTION_EVENT: &str = "INSERT INTO outbox (event_id, event_type, request_id, order_id, \
     product_id, sequence, payload, created_at) \
     SELECT e.event_id, ?, CONCAT('ADMIN_', a.id), NULL, a.product_id, 1, \
     JSON_OBJECT('event_id', e.event_id, 'event_type', ?, 'sequence', 1, 'order_id', NULL, \
     'request_id', CONCAT('ADMIN_', a.id), 'product_id', a.product_id, 'action_id', a.id, \
     'action_request_id', a.request_id, 'admin', a.admin, \
     'before', JSON_EXTRACT(a.before_state, '$'), 'after', JSON_EXTRACT(a.after_state, '$'), \
     'occurred_at', DATE_FORMAT(a.acted_at, '%Y-%m-%dT%H:%i:%s.%fZ')), a.acted_at \
     FROM admin_action a, (SELECT UUID() AS event_id) e WHERE a.id = LAST_INSERT_ID()";

/// One action as the log keeps it: its name, what was asked (None where the name says
/// it all), the event it writes (None for a refund, whose event is its order's), and the
/// state before and after as JSON.
pub(crate) struct Line<'a> {
    pub(crate) action: &'a str,
    pub(crate) asked: Option<String>,
    pub(crate) event: Option<EventType>,
    pub(crate) before: String,
    pub(crate) after: String,
}

/// The columns of a product's definition, to lock and read.
type DefinitionRow = (
    String,
    Option<u32>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
);

#[async_trait]
impl Controls for MysqlLedger {
    async fn switch_sale(
        &self,
        action: &AdminAction,
        switch: SaleSwitch,
    ) -> Result<Acted, LedgerError> {
        self.run("switch a sale", || self.switch_once(action, switch))
            .await
    }

    async fn change_product(
        &self,
        action: &AdminAction,
        change: &ProductChange,
    ) -> Result<Acted, LedgerError> {
        let asked =
            serde_json::to_string(change).map_err(|e| LedgerError::corrupt(e.to_string()))?;
        self.run("change a product", || {
            self.change_once(action, change, &asked)
        })
        .await
    }

    async fn refund(&self, ask: &RefundAsk) -> Result<Refunded, LedgerError> {
        // What the log records as asked: the order and where its units go.
        let asked = serde_json::json!({ "order_id": ask.order_id.get(), "restock": ask.restock })
            .to_string();
        self.run("refund an order", || self.refund_once(ask, &asked))
            .await
    }
}

impl MysqlLedger {
    /// One attempt at a pause or resume: the log's answer for a request_id it has, else
    /// the switch.
    async fn switch_once(
        &self,
        action: &AdminAction,
        switch: SaleSwitch,
    ) -> Result<Acted, sqlx::Error> {
        if let Some(logged) = self.logged(action, switch.as_str(), None).await? {
            return Ok(logged);
        }
        let mut tx = self.pool().begin().await?;
        let paused: Option<bool> =
            sqlx::query_scalar("SELECT paused FROM products WHERE product_id = ? FOR UPDATE")
                .bind(action.product_id.get())
                .fetch_optional(&mut *tx)
                .await?;
        let Some(before) = paused else {
            return Ok(Acted::NotFound);
        };
        sqlx::query("UPDATE products SET paused = ? WHERE product_id = ?")
            .bind(switch.paused())
            .bind(action.product_id.get())
            .execute(&mut *tx)
            .await?;
        let line = Line {
            action: switch.as_str(),
            asked: None,
            event: Some(match switch {
                SaleSwitch::Pause => EventType::ProductPaused,
                SaleSwitch::Resume => EventType::ProductResumed,
            }),
            before: serde_json::json!({ "paused": before }).to_string(),
            after: serde_json::json!({ "paused": switch.paused() }).to_string(),
        };
        self.log_and_commit(tx, action, &line).await
    }

    /// One attempt at a PATCH: the log's answer for a request_id it has, else the change
    /// made to the definition read under its row lock, if it leaves a valid one.
    async fn change_once(
        &self,
        action: &AdminAction,
        change: &ProductChange,
        asked: &str,
    ) -> Result<Acted, sqlx::Error> {
        if let Some(logged) = self.logged(action, "patch", Some(asked)).await? {
            return Ok(logged);
        }
        let mut tx = self.pool().begin().await?;
        let row: Option<DefinitionRow> = sqlx::query_as(
            "SELECT CAST(name AS CHAR), per_user_limit, sale_starts_at, sale_ends_at \
             FROM products WHERE product_id = ? FOR UPDATE",
        )
        .bind(action.product_id.get())
        .fetch_optional(&mut *tx)
        .await?;
        let Some((name, per_user_limit, sale_starts_at, sale_ends_at)) = row else {
            return Ok(Acted::NotFound);
        };
        let before = Definition {
            name,
            per_user_limit,
            sale_starts_at,
            sale_ends_at,
        };
        let after = match change.apply(&before) {
            Ok(after) => after,
            Err(e) => return Ok(Acted::Invalid(e)),
        };
        sqlx::query(
            "UPDATE products SET name = ?, per_user_limit = ?, sale_starts_at = ?, \
             sale_ends_at = ? WHERE product_id = ?",
        )
        .bind(&after.name)
        .bind(after.per_user_limit)
        .bind(after.sale_starts_at)
        .bind(after.sale_ends_at)
        .bind(action.product_id.get())
        .execute(&mut *tx)
        .await?;
        let line = Line {
            action: "patch",
            asked: Some(asked.to_owned()),
            event: Some(EventType::ProductChanged),
            before: definition_json(&before)?,
            after: definition_json(&after)?,
        };
        self.log_and_commit(tx, action, &line).await
    }

    /// What the log says of `action`'s request_id: None if it has no line; a replay if
    /// its line is this action (`name`, asking `asked`) on this product.
    pub(crate) async fn logged(
        &self,
        action: &AdminAction,
        name: &str,
        asked: Option<&str>,
    ) -> Result<Option<Acted>, sqlx::Error> {
        let row: Option<(String, i64, Option<String>)> = sqlx::query_as(
            "SELECT CAST(action AS CHAR), product_id, CAST(asked AS CHAR) FROM admin_action \
             WHERE request_id = ?",
        )
        .bind(action.request_id.as_str())
        .fetch_optional(&self.pool())
        .await?;
        Ok(row.map(|(logged, product, logged_asked)| {
            let same = logged == name
                && product == action.product_id.get()
                && logged_asked.as_deref() == asked;
            if same {
                Acted::Replayed
            } else {
                Acted::Conflict
            }
        }))
    }

    /// The log's line and the event in `tx`, then the commit. A duplicate request_id
    /// (the same action committed meanwhile, a concurrent retry) rolls back, and the
    /// line that is there answers.
    pub(crate) async fn log_and_commit(
        &self,
        mut tx: Transaction<'_, MySql>,
        action: &AdminAction,
        line: &Line<'_>,
    ) -> Result<Acted, sqlx::Error> {
        match log(&mut tx, action, line).await {
            Err(e) if is_duplicate(&e) => {
                drop(tx);
                let logged = self
                    .logged(action, line.action, line.asked.as_deref())
                    .await?;
                debug_assert!(logged.is_some(), "a duplicate request_id is in the log");
                Ok(logged.unwrap_or(Acted::Conflict))
            }
            Err(e) => Err(e),
            Ok(()) => {
                tx.commit().await?;
                Ok(Acted::Done)
            }
        }
    }
}

/// A product's counters as the log shows them before and after an action that moves
/// stock, read under the inventory row's lock in `tx`.
pub(crate) async fn inventory_json(
    tx: &mut MySqlConnection,
    product_id: ProductId,
) -> Result<serde_json::Value, sqlx::Error> {
    let (total, available, reserved, sold): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT total_stock, available_stock, pre_deduct_stock, sold_count \
         FROM product_inventory WHERE product_id = ? FOR UPDATE",
    )
    .bind(product_id.get())
    .fetch_one(&mut *tx)
    .await?;
    Ok(serde_json::json!({
        "total": total, "available": available, "reserved": reserved, "sold": sold,
    }))
}

/// A definition as the log and the event show it.
fn definition_json(d: &Definition) -> Result<String, sqlx::Error> {
    serde_json::to_string(d).map_err(|e| sqlx::Error::Encode(Box::new(e)))
}

/// The log's line and the event, in `tx`.
pub(crate) async fn log(
    tx: &mut Transaction<'_, MySql>,
    action: &AdminAction,
    line: &Line<'_>,
) -> Result<(), sqlx::Error> {
    let by = Some(action.request_id.as_str());
    log_line(tx, by, action.product_id, &action.admin, line).await
}

/// The log's line under `request_id` (None for a creation, keyed by its product) and its
/// event if it has one, in the open transaction `tx`. A request_id the log holds already
/// fails on its unique key (`is_duplicate`).
pub(crate) async fn log_line(
    tx: &mut MySqlConnection,
    request_id: Option<&str>,
    product_id: ProductId,
    admin: &AdminName,
    line: &Line<'_>,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO admin_action (request_id, action, product_id, admin, asked, \
         before_state, after_state) VALUES (?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(request_id)
    .bind(line.action)
    .bind(product_id.get())
    .bind(admin.as_str())
    .bind(line.asked.as_deref())
    .bind(&line.before)
    .bind(&line.after)
    .execute(&mut *tx)
    .await?;
    let Some(event) = line.event else {
        return Ok(());
    };
    let kind = event.as_str();
    let event = sqlx::query(ACTION_EVENT)
        .bind(kind)
        .bind(kind)
        .execute(&mut *tx)
        .await?;
    debug_assert_eq!(event.rows_affected(), 1, "the action row just inserted");
    Ok(())
}
