//! The ledger's side of the background workers and the audit.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use async_trait::async_trait;
use flashsale_app::ports::{
    AuditClaim, AuditRun, AuditSchedule, AuditVerdict, CancelAttempt, ExpiredOrder, Incident,
    IncidentClosing, Leave, LedgerFacts, LedgerMaintenance, ModeSwitch, NewIncident, PendingReturn,
    RebuildPlan, ReleaseOf, StockChange, StockRepair, Watermark, AUDIT_RUNS_KEPT,
};
use flashsale_app::LedgerError;
use flashsale_core::{
    CancelReason, Generation, HoldId, InventoryCounters, OrderId, OrderStatus, ProductId,
    RequestId, StockMode, UserId,
};
use sqlx::mysql::MySqlRow;
use sqlx::{MySqlConnection, MySqlPool, Row};
use tracing::info;

use crate::ledger::MysqlLedger;
use crate::rows::{self, corrupt, quantity, text};
use crate::sql::db;

/// Most request_ids an audit lists per kind of problem.
const LISTED_MAX: i64 = 100;
/// Longest incident detail stored (the column width).
const INCIDENT_DETAIL_MAX: usize = 1000;

/// Most unapplied restocks of one product an audit reads: restocks are an operator's
/// few calls, and recovery applies them within a pass.
const UNAPPLIED_RESTOCKS_MAX: i64 = 10_000;

/// Most pending destocks of one product an audit reads: destocks are an operator's few
/// calls, each settled by its request or the workers' next pass.
const PENDING_DESTOCKS_MAX: i64 = 10_000;

/// An age the database measured in microseconds (never negative: a clock step back).
fn age(micros: i64) -> std::time::Duration {
    Duration::from_micros(u64::try_from(micros).unwrap_or(0))
}

pub(crate) fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

pub(crate) fn product_ids(ids: Vec<i64>) -> Result<Vec<ProductId>, LedgerError> {
    ids.into_iter()
        .map(|id| ProductId::parse(id).map_err(corrupt))
        .collect()
}

impl MysqlLedger {
    /// The product ids `sql` selects (its first column), with `after` bound in order and
    /// then `max`, the most ids, to the `LIMIT ?` it ends with.
    async fn product_ids_of(
        &self,
        label: &'static str,
        sql: &'static str,
        after: &[i64],
        max: usize,
    ) -> Result<Vec<ProductId>, LedgerError> {
        let binds: Vec<i64> = after.iter().copied().chain([limit(max)]).collect();
        let rows = self.rows_of(label, sql, &binds).await?;
        let ids = rows.iter().map(|r| r.try_get(0).map_err(db));
        product_ids(ids.collect::<Result<_, _>>()?)
    }
}

#[async_trait]
impl LedgerMaintenance for MysqlLedger {
    async fn loaded_products(
        &self,
        after: Option<ProductId>,
        max: usize,
    ) -> Result<Vec<ProductId>, LedgerError> {
        let after = after.map_or(0, ProductId::get);
        let sql = "SELECT product_id FROM products WHERE stock_loaded = 1 AND product_id > ? \
                   ORDER BY product_id LIMIT ?";
        self.product_ids_of("loaded products", sql, &[after], max)
            .await
    }

    async fn newest_products(&self, max: usize) -> Result<Vec<ProductId>, LedgerError> {
        let sql = "SELECT product_id FROM products WHERE stock_loaded = 1 \
                   ORDER BY product_id DESC LIMIT ?";
        self.product_ids_of("newest products", sql, &[], max).await
    }

    async fn expired_orders(&self, max: usize) -> Result<Vec<ExpiredOrder>, LedgerError> {
        let sql = "SELECT id, user_id FROM orders \
                   WHERE status = 'PENDING_PAYMENT' AND expires_at <= NOW(6) \
                   ORDER BY expires_at LIMIT ?";
        let rows = self.rows_of("expired orders", sql, &[limit(max)]).await?;
        rows.iter()
            .map(|r| {
                Ok(ExpiredOrder {
                    order_id: OrderId::parse(r.try_get("id").map_err(db)?).map_err(corrupt)?,
                    user_id: UserId::parse(r.try_get("user_id").map_err(db)?).map_err(corrupt)?,
                })
            })
            .collect()
    }

    async fn expire(&self, order: &ExpiredOrder) -> Result<Option<CancelAttempt>, LedgerError> {
        let found = self
            .apply(
                order.order_id,
                order.user_id,
                OrderStatus::Cancelled,
                Some(CancelReason::PaymentTimeout),
            )
            .await?;
        Ok(found.map(CancelAttempt::from))
    }

    /// Of products in gate mode with the gate loaded: one not loaded (its ended sale
    /// retired, `after_sale.rs`) has no entry to give units back to, and its next load, a
    /// rebuild, counts them from the counters and settles the release.
    async fn pending_returns(&self, max: usize) -> Result<Vec<PendingReturn>, LedgerError> {
        let sql = "SELECT r.product_id, r.request_id, r.user_id, r.quantity, \
                   COALESCE(r.released_generation, 1) AS released_generation, r.hold_id, \
                   r.generation AS hold_generation, \
                   o.id IS NOT NULL AS has_order, p.per_user_limit IS NOT NULL AS limited, \
                   COALESCE(r.release_reason <> 'refund_withdrawn', 1) AS returns_units \
                   FROM inventory_reservation r \
                   LEFT JOIN orders o ON o.request_id = r.request_id \
                   LEFT JOIN products p ON p.product_id = r.product_id \
                   JOIN product_inventory i ON i.product_id = r.product_id \
                   WHERE r.stock_returned = 0 AND r.status = 'RELEASED' \
                   AND i.stock_mode = 'GATE' AND p.stock_loaded = 1 \
                   ORDER BY r.updated_at LIMIT ?";
        let rows = self.rows_of("pending returns", sql, &[limit(max)]).await?;
        rows.iter()
            .map(|r| {
                // A reservation with an order was counted by the ledger; a fence was not.
                let of = if r.try_get::<bool, _>("has_order").map_err(db)? {
                    ReleaseOf::Reservation {
                        generation: rows::generation(
                            r.try_get("released_generation").map_err(db)?,
                        )?,
                        hold: rows::hold(
                            r.try_get("hold_generation").map_err(db)?,
                            r.try_get("hold_id").map_err(db)?,
                        )?,
                        user_id: UserId::parse(r.try_get("user_id").map_err(db)?)
                            .map_err(corrupt)?,
                        quantity: quantity(r.try_get::<i32, _>("quantity").map_err(db)?)?,
                        limited: r.try_get::<bool, _>("limited").map_err(db)?,
                        returns_units: r.try_get::<bool, _>("returns_units").map_err(db)?,
                    }
                } else {
                    ReleaseOf::Hold {
                        hold: rows::hold(
                            r.try_get("hold_generation").map_err(db)?,
                            r.try_get("hold_id").map_err(db)?,
                        )?,
                    }
                };
                Ok(PendingReturn {
                    product_id: ProductId::parse(r.try_get("product_id").map_err(db)?)
                        .map_err(corrupt)?,
                    request_id: RequestId::stored("request_id", &text(r, "request_id")?)
                        .map_err(corrupt)?,
                    of,
                })
            })
            .collect()
    }

    async fn pending_restocks(&self, max: usize) -> Result<Vec<StockChange>, LedgerError> {
        let sql = "SELECT r.request_id, r.product_id, r.quantity, r.generation \
                   FROM restock_request r JOIN product_inventory i ON i.product_id = r.product_id \
                   WHERE r.gate_applied = 0 AND i.stock_mode = 'GATE' \
                   ORDER BY r.created_at LIMIT ?";
        let rows = self.rows_of("pending restocks", sql, &[limit(max)]).await?;
        rows.iter()
            .map(|r| {
                Ok(StockChange {
                    product_id: ProductId::parse(r.try_get("product_id").map_err(db)?)
                        .map_err(corrupt)?,
                    id: RequestId::stored("request_id", &text(r, "request_id")?)
                        .map_err(corrupt)?,
                    quantity: r.try_get("quantity").map_err(db)?,
                    generation: rows::generation(r.try_get("generation").map_err(db)?)?,
                })
            })
            .collect()
    }

    async fn record_incident(&self, incident: &NewIncident) -> Result<(), LedgerError> {
        let detail: String = incident.detail.chars().take(INCIDENT_DETAIL_MAX).collect();
        self.run("record incident", || async {
            // One open row per (request, kind): a repeated incident refreshes its detail.
            sqlx::query(
                "INSERT INTO recovery_incident (request_id, product_id, kind, detail) \
                 VALUES (?, ?, ?, ?) \
                 ON DUPLICATE KEY UPDATE detail = VALUES(detail), resolved_at = NULL, \
                 decision = NULL, resolved_by = NULL, note = NULL",
            )
            .bind(incident.request_id.as_str())
            .bind(incident.product_id.get())
            .bind(incident.kind.as_str())
            .bind(&detail)
            .execute(&self.pool())
            .await
        })
        .await
        .map(drop)
    }

    async fn resolve_incidents(&self, request_id: &RequestId) -> Result<(), LedgerError> {
        self.run("resolve incidents", || async {
            sqlx::query(
                "UPDATE recovery_incident SET resolved_at = NOW(6) \
                 WHERE request_id = ? AND resolved_at IS NULL",
            )
            .bind(request_id.as_str())
            .execute(&self.pool())
            .await
        })
        .await
        .map(drop)
    }

    async fn open_incidents(&self) -> Result<i64, LedgerError> {
        self.run("open incidents", || async {
            // `idx_incident_open` (resolved_at): the open rows only.
            sqlx::query_scalar("SELECT COUNT(*) FROM recovery_incident WHERE resolved_at IS NULL")
                .fetch_one(&self.pool())
                .await
        })
        .await
    }

    async fn incidents(&self, open_only: bool, limit: usize) -> Result<Vec<Incident>, LedgerError> {
        self.incidents_at(open_only, limit).await
    }

    async fn incident(&self, id: i64) -> Result<Option<Incident>, LedgerError> {
        self.incident_at(id).await
    }

    async fn close_incident(
        &self,
        id: i64,
        closing: &IncidentClosing,
    ) -> Result<bool, LedgerError> {
        self.close_incident_at(id, closing).await
    }

    /// A retry after a lost reply may record the verdict twice: the last audit reads the
    /// same either way.
    async fn record_audit(&self, verdict: &AuditVerdict) -> Result<(), LedgerError> {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let kept = count(AUDIT_RUNS_KEPT);
        self.run("record audit", || async {
            let mut tx = self.pool().begin().await?;
            let id = sqlx::query(
                "INSERT INTO audit_run (product_id, products, violations, pending) \
                 VALUES (?, ?, ?, ?)",
            )
            .bind(verdict.product.map(ProductId::get))
            .bind(count(verdict.products))
            .bind(count(verdict.violations))
            .bind(count(verdict.pending))
            .execute(&mut *tx)
            .await?
            .last_insert_id();
            // Below the newest `kept` ids, not below this id minus `kept`: ids are not
            // dense (a Galera node steps them by the cluster's size, and a rolled-back
            // insert leaves a gap).
            let id = i64::try_from(id).unwrap_or(i64::MAX);
            sqlx::query(
                "DELETE FROM audit_run WHERE id < (SELECT id FROM \
                 (SELECT id FROM audit_run WHERE id <= ? ORDER BY id DESC LIMIT 1 OFFSET ?) AS k)",
            )
            .bind(id)
            .bind(kept - 1)
            .execute(&mut *tx)
            .await?;
            tx.commit().await
        })
        .await
    }

    async fn last_audit(&self) -> Result<Option<AuditRun>, LedgerError> {
        let row = self
            .run("last audit", || async {
                sqlx::query(
                    "SELECT recorded_at, product_id, products, violations, pending \
                     FROM audit_run ORDER BY id DESC LIMIT 1",
                )
                .fetch_optional(&self.pool())
                .await
            })
            .await?;
        let Some(r) = row else {
            return Ok(None);
        };
        let count = |column: &str| -> Result<usize, LedgerError> {
            let n: i64 = r.try_get(column).map_err(db)?;
            usize::try_from(n).map_err(|_| corrupt(format!("audit_run.{column} {n}")))
        };
        let product = match r.try_get::<Option<i64>, _>("product_id").map_err(db)? {
            Some(id) => Some(
                ProductId::parse(id).map_err(|_| corrupt(format!("audit_run.product_id {id}")))?,
            ),
            None => None,
        };
        Ok(Some(AuditRun {
            verdict: AuditVerdict {
                product,
                products: count("products")?,
                violations: count("violations")?,
                pending: count("pending")?,
            },
            recorded_at: r.try_get("recorded_at").map_err(db)?,
        }))
    }

    async fn facts(&self, product_id: ProductId) -> Result<Option<LedgerFacts>, LedgerError> {
        let pool = &self.pool();
        let p = product_id.get();
        let Some(units) = self.facts_inventory(pool, p).await? else {
            return Ok(None);
        };
        let counters = inventory_counters(&units)?;
        let mode = rows::stock_mode(&units, "stock_mode")?;
        let listed = [p, LISTED_MAX];
        let ids = "facts: request ids";
        let orders_without_reservation = self
            .facts_request_ids(ids, pool, ORDERS_WITHOUT_RESERVATION, &listed)
            .await?;
        let mismatched = self
            .facts_request_ids(ids, pool, MISMATCHED, &listed)
            .await?;
        let event_mismatches = self.facts_event_mismatches(pool, p).await?;
        let (reserve_logged, ordered_units) = self.facts_stock_log(pool, p).await?;
        let log_mismatches = self
            .facts_request_ids(ids, pool, LOG_MISMATCHES, &listed)
            .await?;
        let (unsent_events, unsent_us) = self.facts_unsent(pool, p).await?;
        let parked_events = self
            .facts_count("facts: parked events", pool, PARKED_EVENTS, p)
            .await?;
        let reservations = self
            .facts_rows("facts: reservations", pool, RESERVATIONS, &[p])
            .await?;
        let restocks = self
            .facts_rows(
                "facts: unapplied restocks",
                pool,
                UNAPPLIED_RESTOCKS,
                &[p, UNAPPLIED_RESTOCKS_MAX],
            )
            .await?;
        let unapplied_restocks = unapplied_restocks(&restocks)?;
        let pending_destocks = self.facts_pending_destocks(pool, p).await?;
        let held = ReservationFacts::of(&reservations)?;
        let open_incidents = self
            .facts_count("facts: incidents", pool, OPEN_INCIDENTS, p)
            .await?;
        Ok(Some(LedgerFacts {
            counters,
            mode,
            gate_loaded: units.try_get::<bool, _>("stock_loaded").map_err(db)?,
            pending_units: units.try_get("pending").map_err(db)?,
            paid_units: units.try_get("paid").map_err(db)?,
            orders_without_reservation,
            mismatched,
            live: held.live,
            unreturned: held.unreturned,
            reserved_request_ids: held.reserved_request_ids,
            overdue_unpaid: units.try_get("overdue").map_err(db)?,
            overdue_oldest: age(units.try_get("overdue_us").map_err(db)?),
            unapplied_restocks,
            pending_destocks,
            open_incidents,
            event_mismatches,
            reserve_logged,
            ordered_units,
            log_mismatches,
            unsent_events,
            unsent_oldest: age(unsent_us),
            parked_events,
        }))
    }

    async fn watermark(&self, product_id: ProductId) -> Result<Option<Watermark>, LedgerError> {
        let sql = "SELECT pi.generation, pi.stock_mode, p.stock_loaded, \
                   (SELECT COALESCE(MAX(r.hold_id), 0) FROM inventory_reservation r \
                    WHERE r.product_id = pi.product_id AND r.generation = pi.generation) \
                   AS last_hold_id \
                   FROM product_inventory pi JOIN products p ON p.product_id = pi.product_id \
                   WHERE pi.product_id = ?";
        let row = self.product_row("watermark", sql, product_id).await?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(Watermark {
            generation: rows::generation(row.try_get("generation").map_err(db)?)?,
            last_hold_id: row.try_get("last_hold_id").map_err(db)?,
            stock_loaded: row.try_get::<bool, _>("stock_loaded").map_err(db)?,
            mode: rows::stock_mode(&row, "stock_mode")?,
        }))
    }

    async fn advance_generation(
        &self,
        product_id: ProductId,
    ) -> Result<Option<RebuildPlan>, LedgerError> {
        self.run("advance generation", || self.advance(product_id))
            .await?
            .ok_or_else(|| no_inventory(product_id))
    }

    async fn enter_ledger_mode(&self, product_id: ProductId) -> Result<ModeSwitch, LedgerError> {
        let switch = self
            .run("enter ledger mode", || self.enter(product_id))
            .await?
            .ok_or_else(|| no_inventory(product_id))?;
        if let ModeSwitch::Entered { generation } = switch {
            info!(%product_id, %generation, "product in ledger mode");
        }
        Ok(switch)
    }

    async fn leave_ledger_mode(
        &self,
        product_id: ProductId,
        quiet: Duration,
    ) -> Result<Leave, LedgerError> {
        let left = self
            .run("leave ledger mode", || self.leave(product_id, quiet))
            .await?
            .ok_or_else(|| no_inventory(product_id))?;
        if let Leave::Left(plan) = &left {
            info!(%product_id, generation = %plan.generation, available = plan.available,
                "product back in gate mode; the gate is to be rebuilt");
        }
        Ok(left)
    }

    async fn ledger_mode_products(&self, max: usize) -> Result<Vec<ProductId>, LedgerError> {
        let sql = "SELECT product_id FROM product_inventory WHERE stock_mode = 'LEDGER' \
                   ORDER BY product_id LIMIT ?";
        self.product_ids_of("ledger mode", sql, &[], max).await
    }

    async fn ended_sales(
        &self,
        settled_for: Duration,
        limit: usize,
    ) -> Result<Vec<ProductId>, LedgerError> {
        self.ended_sales_at(settled_for, limit).await
    }

    async fn claim_audit(
        &self,
        which: &AuditSchedule,
        holder: &str,
        lease: Duration,
    ) -> Result<Option<AuditClaim>, LedgerError> {
        self.claim_audit_at(which, holder, lease).await
    }

    async fn finish_audit(&self, claim: &AuditClaim) -> Result<(), LedgerError> {
        self.finish_audit_at(claim).await
    }

    async fn audit_violations_within(&self, window: Duration) -> Result<i64, LedgerError> {
        self.audit_violations_in(window).await
    }

    async fn record_repair(&self, repair: &StockRepair) -> Result<(), LedgerError> {
        self.record_repair_at(repair).await
    }

    fn writer(&self) -> Option<String> {
        Some(self.writer_addr())
    }
}

/// Facts: the orders with no reservation row (binds the product and `LISTED_MAX`).
const ORDERS_WITHOUT_RESERVATION: &str = "SELECT o.request_id FROM orders o \
     LEFT JOIN inventory_reservation r ON r.request_id = o.request_id \
     WHERE o.product_id = ? AND r.id IS NULL LIMIT ?";

/// Facts: the reservations whose state does not match their order's (binds the product
/// and `LISTED_MAX`).
const MISMATCHED: &str = "SELECT r.request_id FROM inventory_reservation r \
     LEFT JOIN orders o ON o.request_id = r.request_id \
     WHERE r.product_id = ? AND NOT ( \
       (o.status = 'PENDING_PAYMENT' AND r.status = 'PROCESSING') OR \
       (o.status = 'PAID' AND r.status = 'CONFIRMED') OR \
       (o.status = 'CANCELLED' AND r.status = 'RELEASED') OR \
       (o.status = 'REFUNDED' AND r.status = 'RELEASED') OR \
       (o.status IS NULL AND r.status = 'RELEASED')) LIMIT ?";

/// Facts: one event per state change: created for every order, paid for a paid or
/// refunded one, cancelled or refunded for the order's terminal state, released for every
/// reservation released but by a refund — each exactly once, and no event for a change
/// that did not happen. Events are counted from the view that
/// unpacks a group commit's packs (migration `…13_batch_facts.sql`). Binds the product
/// twice and `LISTED_MAX`.
const EVENT_MISMATCHES: &str = "SELECT r.request_id FROM inventory_reservation r \
     LEFT JOIN orders o ON o.request_id = r.request_id \
     LEFT JOIN (SELECT e.request_id, \
       SUM(e.event_type = 'order_created') AS created, \
       SUM(e.event_type = 'order_paid') AS paid, \
       SUM(e.event_type = 'order_cancelled') AS cancelled, \
       SUM(e.event_type = 'reservation_released') AS released, \
       SUM(e.event_type = 'order_refunded') AS refunded \
       FROM outbox_event e WHERE e.product_id = ? GROUP BY e.request_id) e \
     ON e.request_id = r.request_id \
     WHERE r.product_id = ? AND ( \
       COALESCE(o.id IS NOT NULL, 0) <> COALESCE(e.created, 0) \
       OR COALESCE(o.status IN ('PAID', 'REFUNDED'), 0) <> COALESCE(e.paid, 0) \
       OR COALESCE(o.status = 'CANCELLED', 0) <> COALESCE(e.cancelled, 0) \
       OR COALESCE(o.status = 'REFUNDED', 0) <> COALESCE(e.refunded, 0) \
       OR (r.status = 'RELEASED' AND COALESCE(o.status <> 'REFUNDED', 1)) \
         <> COALESCE(e.released, 0)) \
     LIMIT ?";

/// Facts: the operator's actions whose events do not match them one to one (binds the
/// product three times and `LISTED_MAX`): a log line with no `ADMIN_<id>` event or more
/// than one, and an `ADMIN_<id>` event with no line. A creation and a restock write no
/// event, and a refund's is its order's (`REFUND_LOG_MISMATCHES`). Both are written in one transaction
/// (`controls.rs`), so either is a lost or a forged write.
const ACTION_EVENT_MISMATCHES: &str = "SELECT CONCAT('ADMIN_', a.id) AS request_id \
     FROM admin_action a \
     LEFT JOIN (SELECT o.request_id, COUNT(*) AS n FROM outbox o WHERE o.product_id = ? \
       AND o.request_id LIKE 'ADMIN\\_%' GROUP BY o.request_id) e \
     ON e.request_id = CONCAT('ADMIN_', a.id) \
     WHERE a.product_id = ? AND a.action NOT IN ('create', 'restock', 'refund') \
       AND COALESCE(e.n, 0) <> 1 \
     UNION ALL SELECT o.request_id FROM outbox o \
     LEFT JOIN admin_action a ON o.request_id = CONCAT('ADMIN_', a.id) \
     WHERE o.product_id = ? AND o.request_id LIKE 'ADMIN\\_%' AND a.id IS NULL \
     LIMIT ?";

/// Facts: the stock log per reservation, a `confirm` row if and only if it was paid
/// (CONFIRMED, or refunded since), a `refund` row if and only if its order was refunded,
/// and a `release` row if and only if it is RELEASED otherwise (binds the product and
/// `LISTED_MAX`).
const LOG_MISMATCHES: &str = "SELECT r.request_id FROM inventory_reservation r \
     LEFT JOIN orders o ON o.request_id = r.request_id \
     LEFT JOIN inventory_log c ON c.request_id = r.request_id AND c.type = 'confirm' \
     LEFT JOIN inventory_log l ON l.request_id = r.request_id AND l.type = 'release' \
     LEFT JOIN inventory_log f ON f.request_id = r.request_id AND f.type = 'refund' \
     WHERE r.product_id = ? AND ( \
       (r.status = 'CONFIRMED' OR COALESCE(o.status = 'REFUNDED', 0)) <> (c.id IS NOT NULL) \
       OR COALESCE(o.status = 'REFUNDED', 0) <> (f.id IS NOT NULL) \
       OR (r.status = 'RELEASED' AND COALESCE(o.status <> 'REFUNDED', 1)) \
         <> (l.id IS NOT NULL)) LIMIT ?";

/// Facts: refunds against the operator's log (binds the product three times and
/// `LISTED_MAX`): a refunded order with no `refund` line or more than one, and a line
/// whose order is not refunded. The order and its line are written in one transaction
/// (`refunds.rs`), so either is a lost or a forged write.
const REFUND_LOG_MISMATCHES: &str = "SELECT CAST(o.request_id AS CHAR) AS request_id \
     FROM orders o \
     LEFT JOIN (SELECT CAST(JSON_VALUE(a.asked, '$.order_id') AS SIGNED) AS order_id, \
       COUNT(*) AS n FROM admin_action a WHERE a.product_id = ? AND a.action = 'refund' \
       GROUP BY 1) a ON a.order_id = o.id \
     WHERE o.product_id = ? AND o.status = 'REFUNDED' AND COALESCE(a.n, 0) <> 1 \
     UNION ALL SELECT CONCAT('ADMIN_', a.id) FROM admin_action a \
     LEFT JOIN orders o ON o.id = CAST(JSON_VALUE(a.asked, '$.order_id') AS SIGNED) \
     WHERE a.product_id = ? AND a.action = 'refund' \
       AND COALESCE(o.status <> 'REFUNDED', 1) \
     LIMIT ?";

/// Facts: the events of the product's parked outbox rows.
const PARKED_EVENTS: &str = "SELECT CAST(COALESCE(SUM(o.events), 0) AS SIGNED) \
     FROM outbox_parked p JOIN outbox o ON o.id = p.id WHERE o.product_id = ?";

/// Facts: every reservation of the product, with its age. A released reservation's
/// `updated_at` is its release: nothing updates it again until its units are back (then
/// it is no longer listed).
const RESERVATIONS: &str = "SELECT request_id, hold_id, quantity, status, stock_returned, \
     COALESCE(release_reason <> 'refund_withdrawn', 1) AS returns_units, \
     CAST(TIMESTAMPDIFF(MICROSECOND, updated_at, NOW(6)) AS SIGNED) AS age_us \
     FROM inventory_reservation WHERE product_id = ?";

/// Facts: the restocks whose units the gate does not have yet (binds the product and
/// `UNAPPLIED_RESTOCKS_MAX`).
const UNAPPLIED_RESTOCKS: &str = "SELECT request_id, generation, quantity, \
     CAST(TIMESTAMPDIFF(MICROSECOND, created_at, NOW(6)) AS SIGNED) AS age_us \
     FROM restock_request WHERE product_id = ? AND gate_applied = 0 LIMIT ?";

/// Facts: the destocks recorded and not settled (binds the product and
/// `PENDING_DESTOCKS_MAX`), in the columns of `UNAPPLIED_RESTOCKS`.
const PENDING_DESTOCKS: &str = "SELECT request_id, generation, quantity, \
     CAST(TIMESTAMPDIFF(MICROSECOND, created_at, NOW(6)) AS SIGNED) AS age_us \
     FROM destock_request WHERE product_id = ? AND state = 'pending' LIMIT ?";

/// Facts: the product's open recovery incidents.
const OPEN_INCIDENTS: &str = "SELECT COUNT(*) FROM recovery_incident \
     WHERE product_id = ? AND resolved_at IS NULL";

/// The audit's reads for `LedgerMaintenance::facts`, each on the pool the audit took
/// once, outside a transaction.
impl MysqlLedger {
    /// Facts, inventory: the counters and the orders' units in one statement, so one
    /// snapshot: a purchase or a payment changes both in one transaction, and two
    /// statements could see it between them. None when the product has no inventory.
    async fn facts_inventory(
        &self,
        pool: &MySqlPool,
        p: i64,
    ) -> Result<Option<MySqlRow>, LedgerError> {
        self.run("facts: inventory", || {
            sqlx::query(
                "SELECT i.total_stock, i.available_stock, i.pre_deduct_stock, i.sold_count, \
                 i.stock_mode, p.stock_loaded, u.pending, u.paid, u.overdue, u.overdue_us \
                 FROM product_inventory i JOIN products p ON p.product_id = i.product_id, \
                 (SELECT \
                 CAST(COALESCE(SUM(CASE WHEN status = 'PENDING_PAYMENT' THEN quantity END), 0) AS SIGNED) AS pending, \
                 CAST(COALESCE(SUM(CASE WHEN status = 'PAID' THEN quantity END), 0) AS SIGNED) AS paid, \
                 CAST(COALESCE(SUM(status = 'PENDING_PAYMENT' AND expires_at <= NOW(6)), 0) AS SIGNED) AS overdue, \
                 CAST(COALESCE(MAX(CASE WHEN status = 'PENDING_PAYMENT' AND expires_at <= NOW(6) \
                   THEN TIMESTAMPDIFF(MICROSECOND, expires_at, NOW(6)) END), 0) AS SIGNED) AS overdue_us \
                 FROM orders WHERE product_id = ?) u \
                 WHERE i.product_id = ?",
            )
            .bind(p)
            .bind(p)
            .fetch_optional(pool)
        })
        .await
    }

    /// Facts, one statement's rows: `sql` with `binds` in order.
    async fn facts_rows(
        &self,
        what: &'static str,
        pool: &MySqlPool,
        sql: &'static str,
        binds: &[i64],
    ) -> Result<Vec<MySqlRow>, LedgerError> {
        self.run(what, || {
            let mut query = sqlx::query(sql);
            for &value in binds {
                query = query.bind(value);
            }
            query.fetch_all(pool)
        })
        .await
    }

    /// Facts, a list of request_ids: the `request_id` column of `sql`'s rows.
    /// Facts, I7's outbox side: the requests whose events do not match their state
    /// changes one to one, then the operator's actions whose events do not.
    async fn facts_event_mismatches(
        &self,
        pool: &MySqlPool,
        p: i64,
    ) -> Result<Vec<String>, LedgerError> {
        let mut mismatches = self
            .facts_request_ids("facts: events", pool, EVENT_MISMATCHES, &[p, p, LISTED_MAX])
            .await?;
        let actions = &[p, p, p, LISTED_MAX];
        let of_actions = "facts: action events";
        mismatches.extend(
            self.facts_request_ids(of_actions, pool, ACTION_EVENT_MISMATCHES, actions)
                .await?,
        );
        let of_refunds = "facts: refunds logged";
        mismatches.extend(
            self.facts_request_ids(of_refunds, pool, REFUND_LOG_MISMATCHES, actions)
                .await?,
        );
        Ok(mismatches)
    }

    /// Facts, the pending destocks: request_id → (generation, units, age).
    async fn facts_pending_destocks(
        &self,
        pool: &MySqlPool,
        p: i64,
    ) -> Result<BTreeMap<String, (Generation, i64, Duration)>, LedgerError> {
        let rows = self
            .facts_rows(
                "facts: pending destocks",
                pool,
                PENDING_DESTOCKS,
                &[p, PENDING_DESTOCKS_MAX],
            )
            .await?;
        // The same columns as the unapplied restocks'.
        unapplied_restocks(&rows)
    }

    async fn facts_request_ids(
        &self,
        what: &'static str,
        pool: &MySqlPool,
        sql: &'static str,
        binds: &[i64],
    ) -> Result<Vec<String>, LedgerError> {
        self.facts_rows(what, pool, sql, binds)
            .await?
            .iter()
            .map(|r| text(r, "request_id"))
            .collect::<Result<Vec<String>, LedgerError>>()
    }

    /// Facts, one count: `sql`'s one value, the product bound.
    async fn facts_count(
        &self,
        what: &'static str,
        pool: &MySqlPool,
        sql: &'static str,
        p: i64,
    ) -> Result<i64, LedgerError> {
        self.run(what, || sqlx::query_scalar(sql).bind(p).fetch_one(pool))
            .await
    }

    /// Facts, the stock log's units: the units it records reserved (a group commit's row
    /// per product and generation, a purchase committed alone its own `reserve` row)
    /// against the units of every order.
    async fn facts_stock_log(&self, pool: &MySqlPool, p: i64) -> Result<(i64, i64), LedgerError> {
        self.run("facts: stock log", || {
            sqlx::query_as(
                "SELECT CAST((SELECT COALESCE(SUM(quantity), 0) FROM inventory_log \
                   WHERE product_id = ? AND type = 'reserve') \
                 + (SELECT COALESCE(SUM(quantity), 0) FROM inventory_batch_log \
                   WHERE product_id = ?) AS SIGNED), \
                 CAST((SELECT COALESCE(SUM(quantity), 0) FROM orders \
                   WHERE product_id = ?) AS SIGNED)",
            )
            .bind(p)
            .bind(p)
            .bind(p)
            .fetch_one(pool)
        })
        .await
    }

    /// Facts, the unsent events: how many, and the oldest's age in microseconds.
    async fn facts_unsent(&self, pool: &MySqlPool, p: i64) -> Result<(i64, i64), LedgerError> {
        self.run("facts: unsent events", || {
            sqlx::query_as(
                "SELECT CAST(COALESCE(SUM(o.events), 0) AS SIGNED), \
                 CAST(COALESCE(MAX(TIMESTAMPDIFF(MICROSECOND, \
                 o.created_at, NOW(6))), 0) AS SIGNED) \
                 FROM outbox_unsent u JOIN outbox o ON o.id = u.id \
                 WHERE o.product_id = ?",
            )
            .bind(p)
            .fetch_one(pool)
        })
        .await
    }
}

/// Facts, the counters of the inventory row read.
fn inventory_counters(row: &MySqlRow) -> Result<InventoryCounters, LedgerError> {
    Ok(InventoryCounters {
        total: row.try_get("total_stock").map_err(db)?,
        available: row.try_get("available_stock").map_err(db)?,
        reserved: row.try_get("pre_deduct_stock").map_err(db)?,
        sold: row.try_get("sold_count").map_err(db)?,
    })
}

/// Facts, the unapplied restocks read: request_id → (generation, units, age).
fn unapplied_restocks(
    restocks: &[MySqlRow],
) -> Result<BTreeMap<String, (Generation, i64, Duration)>, LedgerError> {
    let mut unapplied = BTreeMap::new();
    for r in restocks {
        unapplied.insert(
            text(r, "request_id")?,
            (
                rows::generation(r.try_get("generation").map_err(db)?)?,
                r.try_get("quantity").map_err(db)?,
                age(r.try_get("age_us").map_err(db)?),
            ),
        );
    }
    Ok(unapplied)
}

/// Facts, the reservations read, by what the audit asks of each.
struct ReservationFacts {
    /// PROCESSING or CONFIRMED: request_id → (hold id, units).
    live: BTreeMap<String, (HoldId, i64)>,
    /// RELEASED with the gate's part not done: request_id → (units owed back on sale,
    /// time since the release). A withdrawn refund owes none: its hold is only let go.
    unreturned: BTreeMap<String, (i64, Duration)>,
    /// Every request_id with a reservation row.
    reserved_request_ids: BTreeSet<String>,
}

impl ReservationFacts {
    /// Sorts the reservations read into live, unreturned and all.
    fn of(reservations: &[MySqlRow]) -> Result<Self, LedgerError> {
        let mut live = BTreeMap::new();
        let mut unreturned = BTreeMap::new();
        let mut reserved_request_ids = BTreeSet::new();
        for r in reservations {
            let request_id = text(r, "request_id")?;
            let quantity = i64::from(r.try_get::<i32, _>("quantity").map_err(db)?);
            let status = text(r, "status")?;
            if status == "RELEASED" {
                if !r.try_get::<bool, _>("stock_returned").map_err(db)? {
                    let released_for = age(r.try_get("age_us").map_err(db)?);
                    let owed = if r.try_get::<bool, _>("returns_units").map_err(db)? {
                        quantity
                    } else {
                        0
                    };
                    unreturned.insert(request_id.clone(), (owed, released_for));
                }
            } else {
                let hold_id: i64 = r.try_get("hold_id").map_err(db)?;
                let hold_id = HoldId::from_stored(hold_id).ok_or_else(|| {
                    corrupt(format!("reservation {request_id} hold id {hold_id}"))
                })?;
                live.insert(request_id.clone(), (hold_id, quantity));
            }
            reserved_request_ids.insert(request_id);
        }
        Ok(Self {
            live,
            unreturned,
            reserved_request_ids,
        })
    }
}

fn no_inventory(product_id: ProductId) -> LedgerError {
    LedgerError::corrupt(format!("product {product_id} has no inventory"))
}

/// Locks the product's row, after its inventory row's (the order a purchase's commit
/// reaches them in: its counters, then its order's reference to the product), and reads
/// whether its gate is loaded; None when there is no such product.
pub(crate) async fn lock_product_loaded(
    tx: &mut MySqlConnection,
    p: i64,
) -> Result<Option<bool>, sqlx::Error> {
    sqlx::query_scalar("SELECT stock_loaded FROM products WHERE product_id = ? FOR UPDATE")
        .bind(p)
        .fetch_optional(&mut *tx)
        .await
}

/// A product's inventory row, locked for the rest of the transaction.
pub(crate) struct Locked {
    pub(crate) generation: Generation,
    available: i64,
    pub(crate) mode: StockMode,
}

/// Locks the product's inventory row (`FOR UPDATE`: waits for the transactions that hold
/// it, the purchases in flight among them) and reads what a switch needs; None when the
/// product has none.
pub(crate) async fn lock_inventory(
    tx: &mut MySqlConnection,
    p: i64,
) -> Result<Option<Locked>, sqlx::Error> {
    let row = sqlx::query(
        "SELECT generation, available_stock, stock_mode FROM product_inventory \
         WHERE product_id = ? FOR UPDATE",
    )
    .bind(p)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else { return Ok(None) };
    let available: i64 = row.try_get("available_stock")?;
    // chk_inventory_conservation keeps every counter ≥ 0, manual edits included.
    debug_assert!(available >= 0, "product {p}: available_stock {available}");
    Ok(Some(Locked {
        generation: rows::generation(row.try_get("generation")?).map_err(rows::undecodable)?,
        available,
        mode: rows::stock_mode(&row, "stock_mode").map_err(rows::undecodable)?,
    }))
}

/// Records every release and restock of the product the gate has not had yet as done: the
/// counters have their units, and the gate's next state is made from the counters (a
/// rebuild's plan, or ledger mode, where the gate is not used until that rebuild). The
/// product's open recovery incidents are closed too: each is about a hold of the gate
/// state being replaced (its outcome unknown, or its units not returnable), which can no
/// longer commit or be returned, so the ledger's record of it is final.
async fn settle_owed(tx: &mut MySqlConnection, p: i64) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE recovery_incident SET resolved_at = NOW(6) \
         WHERE product_id = ? AND resolved_at IS NULL",
    )
    .bind(p)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE inventory_reservation SET stock_returned = 1 \
         WHERE product_id = ? AND status = 'RELEASED' AND stock_returned = 0",
    )
    .bind(p)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE restock_request SET gate_applied = 1 WHERE product_id = ? AND gate_applied = 0",
    )
    .bind(p)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// What the gate gets when a product is rebuilt in the next generation, in the open
/// transaction `tx` that locked its row (`locked`): the generation advances (the ledger's
/// hold ids restart with it), and with `to_gate` the product goes back to gate mode;
/// releases not yet returned and restocks not yet applied count as done; the plan is
/// computed from the committed facts.
pub(crate) async fn advance_locked(
    tx: &mut MySqlConnection,
    p: i64,
    locked: &Locked,
    to_gate: bool,
) -> Result<RebuildPlan, sqlx::Error> {
    let generation = locked.generation.next();
    let sql = if to_gate {
        "UPDATE product_inventory SET generation = ?, ledger_hold_seq = 0, \
         stock_mode = 'GATE', mode_changed_at = NOW(6), version = version + 1 \
         WHERE product_id = ?"
    } else {
        "UPDATE product_inventory SET generation = ?, ledger_hold_seq = 0, \
         version = version + 1 WHERE product_id = ?"
    };
    let advanced = sqlx::query(sql)
        .bind(generation.get())
        .bind(p)
        .execute(&mut *tx)
        .await?;
    // The row is locked by this transaction (`lock_inventory`), and the generation moves.
    debug_assert_eq!(
        advanced.rows_affected(),
        1,
        "product {p}: the generation advanced"
    );
    // Units of releases and restocks not yet applied to the gate are in the counters
    // the plan is made from: the new gate state has them, so they are settled.
    settle_owed(tx, p).await?;
    let limited: Option<Option<u32>> =
        sqlx::query_scalar("SELECT per_user_limit FROM products WHERE product_id = ?")
            .bind(p)
            .fetch_optional(&mut *tx)
            .await?;
    let mut user_units = Vec::new();
    if matches!(limited, Some(Some(_))) {
        let rows = sqlx::query(
            "SELECT user_id, CAST(SUM(quantity) AS SIGNED) AS units FROM orders \
             WHERE product_id = ? AND status IN ('PENDING_PAYMENT', 'PAID') \
             GROUP BY user_id",
        )
        .bind(p)
        .fetch_all(&mut *tx)
        .await?;
        for r in &rows {
            let user =
                UserId::parse(r.try_get("user_id")?).map_err(|e| sqlx::Error::Decode(e.into()))?;
            let units: i64 = r.try_get("units")?;
            // A sum of live orders' quantities, each > 0 (chk_orders_quantity).
            debug_assert!(units > 0, "product {p}: user {user} holds {units} units");
            user_units.push((user, units));
        }
    }
    // Every hold id recorded, of any generation and the ledger's own (ledger mode)
    // included: the gate's next ones start above them all.
    let last_hold_id: i64 = sqlx::query_scalar(
        "SELECT CAST(COALESCE(MAX(hold_id), 0) AS SIGNED) FROM inventory_reservation \
         WHERE product_id = ?",
    )
    .bind(p)
    .fetch_one(&mut *tx)
    .await?;
    Ok(RebuildPlan {
        generation,
        available: locked.available,
        last_hold_id,
        user_units,
    })
}

impl MysqlLedger {
    /// One transaction: lock the inventory row (waiting for commits in flight), move to
    /// the next generation, settle what the rebuild counts, and compute the plan; in
    /// ledger mode, nothing (`Some(None)`): a caller that looked at the mode before the
    /// lock (the gate watch) may have raced the switch.
    async fn advance(
        &self,
        product_id: ProductId,
    ) -> Result<Option<Option<RebuildPlan>>, sqlx::Error> {
        let p = product_id.get();
        let mut tx = self.pool().begin().await?;
        let Some(locked) = lock_inventory(&mut tx, p).await? else {
            return Ok(None);
        };
        // Not loaded (never, or its ended sale retired, `after_sale.rs`): no entry by
        // design, and its next load makes one. The product row's lock orders this with
        // a retirement, which takes it too.
        let loaded = lock_product_loaded(&mut tx, p).await?;
        if locked.mode == StockMode::Ledger || loaded == Some(false) {
            tx.rollback().await?;
            return Ok(Some(None));
        }
        let plan = advance_locked(&mut tx, p, &locked, false).await?;
        tx.commit().await?;
        Ok(Some(Some(plan)))
    }

    /// In ledger mode already: one statement records the report (no wait for the
    /// purchases in flight). Otherwise one transaction: lock the inventory row (waiting
    /// for commits in flight); in gate mode, move to the next generation in ledger mode,
    /// the ledger's hold ids from 0, and settle what was owed to the gate.
    async fn enter(&self, product_id: ProductId) -> Result<Option<ModeSwitch>, sqlx::Error> {
        let p = product_id.get();
        let reported = sqlx::query(
            "UPDATE product_inventory SET gate_unreachable_at = NOW(6) \
             WHERE product_id = ? AND stock_mode = 'LEDGER'",
        )
        .bind(p)
        .execute(&self.pool())
        .await?;
        let mut tx = self.pool().begin().await?;
        let Some(locked) = lock_inventory(&mut tx, p).await? else {
            return Ok(None);
        };
        if locked.mode == StockMode::Ledger {
            if reported.rows_affected() == 0 {
                // Entered between the two statements: this report counts from now.
                sqlx::query(
                    "UPDATE product_inventory SET gate_unreachable_at = NOW(6) \
                     WHERE product_id = ?",
                )
                .bind(p)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            return Ok(Some(ModeSwitch::AlreadyLedger {
                generation: locked.generation,
            }));
        }
        let generation = locked.generation.next();
        sqlx::query(
            "UPDATE product_inventory SET generation = ?, stock_mode = 'LEDGER', \
             ledger_hold_seq = 0, mode_changed_at = NOW(6), gate_unreachable_at = NOW(6), \
             version = version + 1 WHERE product_id = ?",
        )
        .bind(generation.get())
        .bind(p)
        .execute(&mut *tx)
        .await?;
        settle_owed(&mut tx, p).await?;
        // From now on the ledger serves the stock: it is never again loaded from the
        // counters as if nothing had been sold (the way back rebuilds it from a plan).
        sqlx::query("UPDATE products SET stock_loaded = 1 WHERE product_id = ?")
            .bind(p)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Some(ModeSwitch::Entered { generation }))
    }

    /// One transaction: lock the inventory row (waiting for commits in flight); in ledger
    /// mode with no report of an unreachable gate within `quiet`, what [`Self::advance`]
    /// does and the mode back to gate.
    async fn leave(
        &self,
        product_id: ProductId,
        quiet: Duration,
    ) -> Result<Option<Leave>, sqlx::Error> {
        let p = product_id.get();
        let mut tx = self.pool().begin().await?;
        let Some(locked) = lock_inventory(&mut tx, p).await? else {
            return Ok(None);
        };
        if locked.mode == StockMode::Gate {
            tx.rollback().await?;
            return Ok(Some(Leave::NotLedger));
        }
        let quiet_us = i64::try_from(quiet.as_micros()).unwrap_or(i64::MAX);
        let reported_lately: bool = sqlx::query_scalar(
            "SELECT COALESCE(gate_unreachable_at > NOW(6) - INTERVAL ? MICROSECOND, 0) \
             FROM product_inventory WHERE product_id = ?",
        )
        .bind(quiet_us)
        .bind(p)
        .fetch_one(&mut *tx)
        .await?;
        if reported_lately {
            tx.rollback().await?;
            return Ok(Some(Leave::TooSoon));
        }
        let plan = advance_locked(&mut tx, p, &locked, true).await?;
        tx.commit().await?;
        Ok(Some(Leave::Left(plan)))
    }
}
