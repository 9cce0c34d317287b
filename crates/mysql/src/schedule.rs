//! The ledger's side of the checks `serve` runs by itself: which sales have ended and
//! settled, the claims in `audit_schedule` that let one instance run each audit, the
//! violations the recent audits found (migration 18 says what a row is), and the record
//! of each repair reconciliation made (`stock_repair`, migration 20).

use std::time::Duration;

use flashsale_app::ports::{AuditClaim, AuditSchedule, StockRepair};
use flashsale_app::LedgerError;
use flashsale_core::ProductId;

use crate::ledger::MysqlLedger;
use crate::rows::corrupt;
use crate::sql::{is_duplicate, micros};

/// The kinds of `audit_schedule` rows.
const SALE_END: &str = "sale_end";
const EVERY: &str = "every";

impl MysqlLedger {
    pub(crate) async fn ended_sales_at(
        &self,
        settled_for: Duration,
        limit: usize,
    ) -> Result<Vec<ProductId>, LedgerError> {
        let ids: Vec<i64> = self
            .run("ended sales", || async {
                sqlx::query_scalar(
                    "SELECT p.product_id FROM products p \
                     LEFT JOIN audit_schedule a ON a.kind = ? AND a.scope = p.product_id \
                     WHERE p.stock_loaded = 1 AND p.sale_ends_at IS NOT NULL \
                     AND p.sale_ends_at <= NOW(6) - INTERVAL ? MICROSECOND \
                     AND a.done_at IS NULL ORDER BY p.product_id LIMIT ?",
                )
                .bind(SALE_END)
                .bind(micros(settled_for))
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(&self.pool())
                .await
            })
            .await?;
        ids.into_iter()
            .map(|id| ProductId::parse(id).map_err(corrupt))
            .collect()
    }

    /// Takes the claim: a new row, or, over a claim older than `lease` and not done,
    /// the row taken over. Two statements, each deciding alone (a unique key, a
    /// conditional UPDATE), so two instances never both get it.
    pub(crate) async fn claim_audit_at(
        &self,
        which: &AuditSchedule,
        holder: &str,
        lease: Duration,
    ) -> Result<Option<AuditClaim>, LedgerError> {
        let (kind, scope) = match which {
            AuditSchedule::SaleEnd(product_id) => (SALE_END, product_id.get()),
            AuditSchedule::Every(every) => (EVERY, self.period(*every).await?),
        };
        let inserted = self
            .run("claim an audit", || async {
                let inserted = sqlx::query(
                    "INSERT INTO audit_schedule (kind, scope, holder, claimed_at) \
                     VALUES (?, ?, ?, NOW(6))",
                )
                .bind(kind)
                .bind(scope)
                .bind(holder)
                .execute(&self.pool())
                .await;
                match inserted {
                    Ok(_) => Ok(true),
                    Err(e) if is_duplicate(&e) => Ok(false),
                    Err(e) => Err(e),
                }
            })
            .await?;
        let claimed = inserted || self.take_over(kind, scope, holder, lease).await?;
        Ok(claimed.then(|| AuditClaim {
            kind,
            scope: scope.to_string(),
            holder: holder.to_owned(),
        }))
    }

    /// The number of the period of length `every` the database's clock is in.
    async fn period(&self, every: Duration) -> Result<i64, LedgerError> {
        let seconds = i64::try_from(every.as_secs().max(1)).unwrap_or(i64::MAX);
        self.run("audit period", || async {
            sqlx::query_scalar("SELECT CAST(FLOOR(UNIX_TIMESTAMP(NOW(6)) / ?) AS SIGNED)")
                .bind(seconds)
                .fetch_one(&self.pool())
                .await
        })
        .await
    }

    async fn take_over(
        &self,
        kind: &str,
        scope: i64,
        holder: &str,
        lease: Duration,
    ) -> Result<bool, LedgerError> {
        let done = self
            .run("take an audit over", || async {
                sqlx::query(
                    "UPDATE audit_schedule SET holder = ?, claimed_at = NOW(6) \
                     WHERE kind = ? AND scope = ? AND done_at IS NULL \
                     AND claimed_at < NOW(6) - INTERVAL ? MICROSECOND",
                )
                .bind(holder)
                .bind(kind)
                .bind(scope)
                .bind(micros(lease))
                .execute(&self.pool())
                .await
            })
            .await?;
        Ok(done.rows_affected() == 1)
    }

    pub(crate) async fn finish_audit_at(&self, claim: &AuditClaim) -> Result<(), LedgerError> {
        let scope: i64 = claim
            .scope
            .parse()
            .map_err(|_| LedgerError::corrupt(format!("audit claim scope {:?}", claim.scope)))?;
        self.run("finish an audit", || async {
            sqlx::query(
                "UPDATE audit_schedule SET done_at = NOW(6) \
                 WHERE kind = ? AND scope = ? AND holder = ? AND done_at IS NULL",
            )
            .bind(claim.kind)
            .bind(scope)
            .bind(&claim.holder)
            .execute(&self.pool())
            .await
        })
        .await
        .map(drop)
    }

    pub(crate) async fn audit_violations_in(&self, window: Duration) -> Result<i64, LedgerError> {
        self.run("recent audit violations", || async {
            sqlx::query_scalar(
                "SELECT CAST(COALESCE(SUM(violations), 0) AS SIGNED) FROM audit_run \
                 WHERE recorded_at >= NOW(6) - INTERVAL ? MICROSECOND",
            )
            .bind(micros(window))
            .fetch_one(&self.pool())
            .await
        })
        .await
    }
}

/// A repair's `stock_repaired` event, written from the `stock_repair` row just inserted
/// (`LAST_INSERT_ID()`), in the JSON form docs/events.md gives: the row's facts, its
/// time on the database's clock.
const REPAIR_EVENT: &str = "INSERT INTO outbox (event_id, event_type, request_id, order_id, \
     product_id, sequence, payload, created_at) \
     SELECT e.event_id, 'stock_repaired', CONCAT('REPAIR_', r.id), NULL, r.product_id, 1, \
     JSON_OBJECT('event_id', e.event_id, 'event_type', 'stock_repaired', 'sequence', 1, \
     'order_id', NULL, 'request_id', CONCAT('REPAIR_', r.id), 'product_id', r.product_id, \
     'repair_id', r.id, 'generation', r.generation, 'redis_before', r.redis_before, \
     'redis_after', r.redis_after, 'delta', r.redis_after - r.redis_before, \
     'expected', r.expected, 'total_stock', r.total_stock, 'live_units', r.live_units, \
     'in_flight_units', r.in_flight_units, 'reason', r.reason, \
     'occurred_at', DATE_FORMAT(r.repaired_at, '%Y-%m-%dT%H:%i:%s.%fZ')), r.repaired_at \
     FROM stock_repair r, (SELECT UUID() AS event_id) e WHERE r.id = LAST_INSERT_ID()";

impl MysqlLedger {
    /// Records a repair and its event in one transaction: the event exists exactly when
    /// the record does.
    pub(crate) async fn record_repair_at(&self, r: &StockRepair) -> Result<(), LedgerError> {
        self.run("record a repair", || self.insert_repair(r)).await
    }

    async fn insert_repair(&self, r: &StockRepair) -> Result<(), sqlx::Error> {
        let mut tx = self.pool().begin().await?;
        sqlx::query(
            "INSERT INTO stock_repair (product_id, generation, redis_before, redis_after, \
             expected, total_stock, live_units, in_flight_units, reason) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(r.product_id.get())
        .bind(r.generation.get())
        .bind(r.redis_before)
        .bind(r.redis_after)
        .bind(r.expected)
        .bind(r.total)
        .bind(r.live_units)
        .bind(r.in_flight_units)
        .bind(r.reason)
        .execute(&mut *tx)
        .await?;
        let event = sqlx::query(REPAIR_EVENT).execute(&mut *tx).await?;
        debug_assert_eq!(event.rows_affected(), 1, "the repair row just inserted");
        tx.commit().await
    }
}
