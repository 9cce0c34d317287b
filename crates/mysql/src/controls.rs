//! The operator's controls of a sale in the ledger: a product's `paused` flag, set in one
//! transaction with its line in the operator's log (`admin_action`) and its event, so
//! the flag, the log and the event exist together or not at all.

use async_trait::async_trait;
use flashsale_app::control::{AdminAction, Controls, SaleSwitch, Switched};
use flashsale_app::{EventType, LedgerError};
use sqlx::{MySql, Transaction};

use crate::ledger::MysqlLedger;
use crate::sql::is_duplicate;

/// The switch's event (binds its type twice), written from the `admin_action` row just
/// inserted (`LAST_INSERT_ID()`) in the JSON form docs/events.md gives. Its ordering key
/// is `ADMIN_<row id>`: an admin's request_id is of another namespace than the
/// purchases', and may spell one of theirs.
const SWITCH_EVENT: &str = "INSERT INTO outbox (event_id, event_type, request_id, order_id, \
     product_id, sequence, payload, created_at) \
     SELECT e.event_id, ?, CONCAT('ADMIN_', a.id), NULL, a.product_id, 1, \
     JSON_OBJECT('event_id', e.event_id, 'event_type', ?, 'sequence', 1, 'order_id', NULL, \
     'request_id', CONCAT('ADMIN_', a.id), 'product_id', a.product_id, 'action_id', a.id, \
     'action_request_id', a.request_id, 'admin', a.admin, \
     'paused', JSON_EXTRACT(a.after_state, '$.paused'), \
     'occurred_at', DATE_FORMAT(a.acted_at, '%Y-%m-%dT%H:%i:%s.%fZ')), a.acted_at \
     FROM admin_action a, (SELECT UUID() AS event_id) e WHERE a.id = LAST_INSERT_ID()";

/// The event a switch writes.
fn event_type(switch: SaleSwitch) -> EventType {
    match switch {
        SaleSwitch::Pause => EventType::ProductPaused,
        SaleSwitch::Resume => EventType::ProductResumed,
    }
}

/// A product's state as the operator's log keeps it, before and after an action.
fn state(paused: bool) -> String {
    serde_json::json!({ "paused": paused }).to_string()
}

#[async_trait]
impl Controls for MysqlLedger {
    async fn switch_sale(
        &self,
        action: &AdminAction,
        switch: SaleSwitch,
    ) -> Result<Switched, LedgerError> {
        self.run("switch a sale", || self.switch_once(action, switch))
            .await
    }
}

impl MysqlLedger {
    /// One attempt: the log's answer for a request_id it has, else the switch.
    async fn switch_once(
        &self,
        action: &AdminAction,
        switch: SaleSwitch,
    ) -> Result<Switched, sqlx::Error> {
        if let Some(logged) = self.logged(action, switch).await? {
            return Ok(logged);
        }
        let mut tx = self.pool().begin().await?;
        let paused: Option<bool> =
            sqlx::query_scalar("SELECT paused FROM products WHERE product_id = ? FOR UPDATE")
                .bind(action.product_id.get())
                .fetch_optional(&mut *tx)
                .await?;
        let Some(before) = paused else {
            return Ok(Switched::NotFound);
        };
        match log_and_switch(&mut tx, action, switch, before).await {
            // The same request_id committed meanwhile (a concurrent retry): its line
            // answers, and this transaction rolls back unapplied.
            Err(e) if is_duplicate(&e) => {
                drop(tx);
                let logged = self.logged(action, switch).await?;
                debug_assert!(logged.is_some(), "a duplicate request_id is in the log");
                Ok(logged.unwrap_or(Switched::Conflict))
            }
            Err(e) => Err(e),
            Ok(()) => {
                tx.commit().await?;
                Ok(Switched::Done)
            }
        }
    }

    /// What the log says of `action`'s request_id: None if it has no line.
    async fn logged(
        &self,
        action: &AdminAction,
        switch: SaleSwitch,
    ) -> Result<Option<Switched>, sqlx::Error> {
        let row: Option<(String, i64)> = sqlx::query_as(
            "SELECT CAST(action AS CHAR), product_id FROM admin_action WHERE request_id = ?",
        )
        .bind(action.request_id.as_str())
        .fetch_optional(&self.pool())
        .await?;
        Ok(row.map(|(logged, product)| {
            if logged == switch.as_str() && product == action.product_id.get() {
                Switched::Replayed
            } else {
                Switched::Conflict
            }
        }))
    }
}

/// The flag, the log's line and the event, in `tx`.
async fn log_and_switch(
    tx: &mut Transaction<'_, MySql>,
    action: &AdminAction,
    switch: SaleSwitch,
    before: bool,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO admin_action (request_id, action, product_id, admin, before_state, \
         after_state) VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(action.request_id.as_str())
    .bind(switch.as_str())
    .bind(action.product_id.get())
    .bind(action.admin.as_str())
    .bind(state(before))
    .bind(state(switch.paused()))
    .execute(&mut **tx)
    .await?;
    sqlx::query("UPDATE products SET paused = ? WHERE product_id = ?")
        .bind(switch.paused())
        .bind(action.product_id.get())
        .execute(&mut **tx)
        .await?;
    let kind = event_type(switch).as_str();
    let event = sqlx::query(SWITCH_EVENT)
        .bind(kind)
        .bind(kind)
        .execute(&mut **tx)
        .await?;
    debug_assert_eq!(event.rows_affected(), 1, "the action row just inserted");
    Ok(())
}
