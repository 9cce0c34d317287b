//! Refunds in the ledger: a PAID order moved to REFUNDED in one transaction with its
//! reservation (CONFIRMED → RELEASED), the counters (`sold` less its units, which go back
//! to `available` or out of `total`), the stock log's `refund` row, the order's
//! `order_refunded` event and the operator's log line. The order row's lock and the
//! conditional UPDATE (`… WHERE status = 'PAID'`) make a refund happen once.

use flashsale_app::control::{Acted, AdminAction, RefundAsk, Refunded};
use flashsale_core::{OrderId, OrderStatus, ProductId, ReleaseReason, Transition, UserId};
use sqlx::{MySql, MySqlConnection, Transaction};

use crate::controls::{inventory_json, Line};
use crate::ledger::{stamp_release, MysqlLedger};
use crate::rows;

/// The order a refund is asked for, as read under its row's lock.
struct Refundable {
    request_id: String,
    user_id: UserId,
    product_id: ProductId,
    quantity: i32,
    status: OrderStatus,
}

impl Refundable {
    /// The order, its row locked for the rest of `tx`; None when there is no such order.
    async fn lock(
        tx: &mut MySqlConnection,
        order_id: OrderId,
    ) -> Result<Option<Self>, sqlx::Error> {
        let row: Option<(String, i64, i64, i32, String)> = sqlx::query_as(
            "SELECT CAST(request_id AS CHAR), user_id, product_id, quantity, \
             CAST(status AS CHAR) FROM orders WHERE id = ? FOR UPDATE",
        )
        .bind(order_id.get())
        .fetch_optional(&mut *tx)
        .await?;
        let Some((request_id, user_id, product_id, quantity, status)) = row else {
            return Ok(None);
        };
        let corrupt = |what: String| rows::undecodable(rows::corrupt(what));
        Ok(Some(Self {
            request_id,
            user_id: UserId::parse(user_id).map_err(|e| corrupt(e.to_string()))?,
            product_id: ProductId::parse(product_id).map_err(|e| corrupt(e.to_string()))?,
            quantity,
            status: status
                .parse::<OrderStatus>()
                .map_err(|e| corrupt(e.to_string()))?,
        }))
    }

    /// The refund's writes but the log line: the order, its reservation, the counters,
    /// the release's generation, the stock log's row and the event.
    async fn refund(
        &self,
        tx: &mut MySqlConnection,
        order_id: OrderId,
        reason: ReleaseReason,
    ) -> Result<(), sqlx::Error> {
        let moved = sqlx::query(
            "UPDATE orders SET status = 'REFUNDED', refunded_at = NOW(6) \
             WHERE id = ? AND status = 'PAID'",
        )
        .bind(order_id.get())
        .execute(&mut *tx)
        .await?;
        // The row is locked and was read PAID.
        debug_assert_eq!(moved.rows_affected(), 1, "a locked PAID order is refunded");
        self.release(tx, order_id, reason).await?;
        let change = crate::outbox::Change::Refunded {
            order: crate::outbox::OrderRef {
                order_id,
                user_id: self.user_id,
                request_id: &self.request_id,
                product_id: self.product_id.get(),
                quantity: self.quantity,
            },
            reason,
        };
        crate::outbox::record(&mut *tx, change).await
    }

    /// Refund, the stock: the CONFIRMED reservation RELEASED (its units owed to the gate
    /// until it lets go of the hold), the counters moved, and the stock log's row.
    async fn release(
        &self,
        tx: &mut MySqlConnection,
        order_id: OrderId,
        reason: ReleaseReason,
    ) -> Result<(), sqlx::Error> {
        let released = sqlx::query(
            "UPDATE inventory_reservation SET status = 'RELEASED', release_reason = ?, \
             stock_returned = 0 WHERE request_id = ? AND status = 'CONFIRMED'",
        )
        .bind(reason.as_str())
        .bind(&self.request_id)
        .execute(&mut *tx)
        .await?;
        if released.rows_affected() != 1 {
            // A PAID order always has a CONFIRMED reservation (I3): anything else is
            // corruption, and the transaction is dropped with nothing changed.
            debug_assert!(
                false,
                "order {order_id} is PAID without a CONFIRMED reservation"
            );
            return Err(sqlx::Error::Protocol(format!(
                "order {order_id} is PAID but its reservation is not CONFIRMED"
            )));
        }
        let counters = if reason.returns_units() {
            "UPDATE product_inventory SET sold_count = sold_count - ?, \
             available_stock = available_stock + ?, version = version + 1 WHERE product_id = ?"
        } else {
            "UPDATE product_inventory SET sold_count = sold_count - ?, \
             total_stock = total_stock - ?, version = version + 1 WHERE product_id = ?"
        };
        sqlx::query(counters)
            .bind(self.quantity)
            .bind(self.quantity)
            .bind(self.product_id.get())
            .execute(&mut *tx)
            .await?;
        stamp_release(tx, self.product_id.get(), &self.request_id).await?;
        sqlx::query(
            "INSERT INTO inventory_log (request_id, product_id, order_id, quantity, type, \
             remark) VALUES (?, ?, ?, ?, 'refund', ?)",
        )
        .bind(&self.request_id)
        .bind(self.product_id.get())
        .bind(order_id.get())
        .bind(self.quantity)
        .bind(reason.as_str())
        .execute(&mut *tx)
        .await?;
        Ok(())
    }
}

/// The order's state and the product's counters, as the operator's log shows them before
/// and after a refund.
async fn refund_state(
    tx: &mut MySqlConnection,
    order_id: OrderId,
    product_id: ProductId,
) -> Result<String, sqlx::Error> {
    let status: String = sqlx::query_scalar("SELECT CAST(status AS CHAR) FROM orders WHERE id = ?")
        .bind(order_id.get())
        .fetch_one(&mut *tx)
        .await?;
    let inventory = inventory_json(tx, product_id).await?;
    Ok(serde_json::json!({ "order_status": status, "inventory": inventory }).to_string())
}

impl MysqlLedger {
    /// One attempt at a refund: the log's answer for a request_id it has, else the
    /// refund of the order read under its lock, if it is PAID.
    pub(crate) async fn refund_once(
        &self,
        ask: &RefundAsk,
        asked: &str,
    ) -> Result<Refunded, sqlx::Error> {
        let mut tx = self.pool().begin().await?;
        let Some(order) = Refundable::lock(&mut tx, ask.order_id).await? else {
            return Ok(Refunded::NotFound);
        };
        let action = AdminAction {
            request_id: ask.request_id.clone(),
            product_id: order.product_id,
            admin: ask.admin.clone(),
        };
        if let Some(logged) = self.logged(&action, "refund", Some(asked)).await? {
            drop(tx);
            return self
                .refund_answer(logged, ask.order_id, order.user_id)
                .await;
        }
        match order.status.refund() {
            Ok(Transition::To(_)) => {}
            Ok(Transition::Unchanged) => {
                // Refunded before, under another request_id: nothing more to do.
                drop(tx);
                return self
                    .refund_answer(Acted::Replayed, ask.order_id, order.user_id)
                    .await;
            }
            Err(_) => return Ok(Refunded::NotRefundable(order.status)),
        }
        let acted = self.refund_in(tx, ask, asked, &order, &action).await?;
        self.refund_answer(acted, ask.order_id, order.user_id).await
    }

    /// Refund, write: everything in `tx`, then the log line and the commit.
    async fn refund_in(
        &self,
        mut tx: Transaction<'_, MySql>,
        ask: &RefundAsk,
        asked: &str,
        order: &Refundable,
        action: &AdminAction,
    ) -> Result<Acted, sqlx::Error> {
        let before = refund_state(&mut tx, ask.order_id, order.product_id).await?;
        let reason = ReleaseReason::for_refund(ask.restock);
        order.refund(&mut tx, ask.order_id, reason).await?;
        let after = refund_state(&mut tx, ask.order_id, order.product_id).await?;
        let line = Line {
            action: "refund",
            asked: Some(asked.to_owned()),
            event: None,
            before,
            after,
        };
        self.log_and_commit(tx, action, &line).await
    }

    /// The refund's answer: the order as it is now, with the gate's part still owed.
    async fn refund_answer(
        &self,
        acted: Acted,
        order_id: OrderId,
        user_id: UserId,
    ) -> Result<Refunded, sqlx::Error> {
        let applied = match acted {
            Acted::Done => true,
            Acted::Replayed => false,
            Acted::Conflict => return Ok(Refunded::Conflict),
            Acted::NotFound | Acted::Invalid(_) => {
                debug_assert!(false, "a refund's log answers done, replayed or conflict");
                return Err(sqlx::Error::Protocol("unexpected refund log answer".into()));
            }
        };
        let mut conn = self.pool().acquire().await?;
        let found = Self::order_with_flags(&mut conn, order_id, user_id).await?;
        let Some((order, _, pending_return)) = found else {
            debug_assert!(false, "a refunded order is still there");
            return Err(sqlx::Error::RowNotFound);
        };
        Ok(Refunded::Done {
            order,
            applied,
            pending_return,
        })
    }
}
