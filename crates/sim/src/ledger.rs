//! `MemLedger`: the MariaDB ledger in memory, with the semantics of `MysqlLedger`
//! (`crates/mysql/src/ledger.rs`, `maintenance.rs`, `outbox.rs`) and its schema
//! (`crates/mysql/migrations/`).
//!
//! Each transaction is one synchronous block that first checks everything that could
//! make it fail (unique keys, conditional UPDATEs, the CHECK constraint) and only then
//! writes, so a failed transaction leaves nothing behind, as a rollback does. Methods
//! that run several transactions or statements in `MysqlLedger` (a transition, then the
//! read of the order; a collision, then the lookup of the record that won) yield between
//! them, so other work interleaves there as it does against a real database (READ
//! COMMITTED: each statement sees what is committed when it runs). Times are the
//! database's own clock (`NOW(6)`), which the simulation moves separately from the
//! instances' clocks.
//!
//! Purchases commit as the adapter commits them, by group commit: `commit_purchase` calls
//! that queue while a group transaction runs go together in the next one
//! ([`crate::coalesce`], on the seeded scheduler), the group transaction checks what the
//! adapter's script checks and writes all or nothing, and `flashsale_app::group`'s
//! `GroupCommit` — the adapter's own decision — says which purchases go together, which
//! are set aside and committed one by one, and who gets the batch's result.
//! `find_purchase` calls are batched the same way. Each group transaction, lookup batch
//! and one-by-one commit the batch task sends draws a seeded fault of its own.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, Utc};
use flashsale_app::ports::{
    Applied, AuditClaim, AuditSchedule, CancelAttempt, Commit, CreateProduct, ExpiredOrder, Fence,
    HeldPurchase, Incident, IncidentClosed, IncidentClosing, Leave, LedgerFacts, LedgerMaintenance,
    LedgerPurchase, ModeSwitch, NewIncident, Outbox, PayAttempt, PendingReturn, RebuildPlan,
    RecordRestock, ReleaseOf, StatsStore, StockChange, StockRepair, Watermark, AUDIT_RUNS_KEPT,
};
use flashsale_app::ports::{ParkedRow, PublishFailure, StatsEvent};
use flashsale_app::{
    AdminAction, Event, EventType, Ledger, LedgerError, Order, OutboxMessage, Product,
    PurchaseOutcome, PurchaseRecord, StatsDelta,
};
use flashsale_core::{
    AdminName, CancelReason, Generation, HoldRef, InventoryCounters, NewProduct, OrderId,
    OrderStatus, ProductId, PurchaseRequest, ReleaseReason, RequestId, ReservationStatus,
    StockMode, UserId, STOCK_MAX,
};

use flashsale_app::group::{self, GroupCommit, Held, OverLimit};
use flashsale_app::modes::LEDGER_SALES_AFTER_SWITCH;

use crate::coalesce::Coalescer;
use crate::ctx::{Ctx, Fault, Point, Port};

/// `MysqlLedger`'s bound on transactions that collide with a row that then rolls back
/// (`TX_ATTEMPTS_MAX` there): in memory a collision is always with a committed row, so
/// the first lookup finds it, but the loop keeps the same shape and bound.
const TX_ATTEMPTS_MAX: u32 = 4;
/// Most request_ids the facts list per kind of problem (`LISTED_MAX` there).
const LISTED_MAX: usize = 100;
/// Most purchases one group commit takes (`GROUP_COMMIT_MAX` there).
const GROUP_COMMIT_MAX: usize = 256;
/// Most request_ids one batched lookup reads (`LOOKUP_BATCH_MAX` there).
const LOOKUP_BATCH_MAX: usize = 256;

/// The kinds of `audit_schedule` rows, as the adapter names them.
const SALE_END: &str = "sale_end";
const EVERY: &str = "every";

/// `d` as a time on the database's clock, at most the longest one.
fn delta(d: Duration) -> TimeDelta {
    TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX)
}

/// A row of `audit_schedule`.
#[derive(Debug, Clone)]
struct AuditClaimRow {
    holder: String,
    claimed_at: DateTime<Utc>,
    done: bool,
}

/// Deliberate defects, to prove the simulator catches what they break.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LedgerDefects {
    /// `commit_purchase` skips `available_stock >= q`, and the CHECK constraint that
    /// would otherwise refuse the negative counter is gone too.
    pub no_stock_guard: bool,
    /// `fence` answers Fenced without writing the fence row, so a late commit of the
    /// fenced request can still create an order after its units were given back.
    pub fence_writes_nothing: bool,
    /// Group commit answers the purchases it set aside from the batch's result (the
    /// committed transaction's first order) instead of committing them one by one.
    pub aside_from_batch: bool,
    /// A group transaction checks the request_ids (fences included), yields, then
    /// writes what it checked: a fence that lands in between is overwritten by an order.
    pub group_writes_late: bool,
    /// `enter_ledger_mode` switches the mode but keeps the generation (the ledger's hold
    /// ids still restart at 1, in the generation the gate's holds are recorded in).
    pub enter_keeps_generation: bool,
    /// `commit_ledger_purchase` sells whatever the mode: a purchase an instance sends
    /// to the ledger after the product went back to the gate is sold behind the gate.
    pub ledger_sells_in_gate_mode: bool,
}

#[derive(Debug, Clone)]
struct InventoryRow {
    total: i64,
    available: i64,
    reserved: i64,
    sold: i64,
    generation: Generation,
    /// `stock_mode`, and `ledger_hold_seq`: the last hold id the ledger handed out in
    /// the current generation (ledger mode).
    mode: StockMode,
    ledger_hold_seq: i64,
    /// `gate_unreachable_at`: the last report of an instance that could not reach the
    /// gate (the simulated database's clock).
    gate_unreachable_at: Option<DateTime<Utc>>,
    /// `mode_changed_at`: the last switch (the simulated database's clock).
    mode_changed_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone)]
struct ReservationRow {
    id: i64,
    request: PurchaseRequest,
    /// The (generation, hold_id) columns: the hold it accounts for.
    hold: HoldRef,
    status: ReservationStatus,
    release_reason: Option<ReleaseReason>,
    stock_returned: bool,
    released_generation: Option<Generation>,
    updated_at: DateTime<Utc>,
    /// Sim bookkeeping: terminal transitions applied to this row (I3: at most one).
    transitions: u32,
}

#[derive(Debug, Clone)]
struct RestockRow {
    product_id: i64,
    quantity: i64,
    gate_applied: bool,
    generation: Generation,
}

#[derive(Debug, Clone)]
struct IncidentRow {
    id: i64,
    product_id: i64,
    detail: String,
    created_at: DateTime<Utc>,
    open: bool,
    /// When it was closed, and a person's decision if one was recorded.
    closed_at: Option<DateTime<Utc>>,
    closing: Option<IncidentClosing>,
}

impl IncidentRow {
    /// Closed at `now`, unless it was closed before.
    fn close(&mut self, now: DateTime<Utc>) {
        if self.open {
            self.open = false;
            self.closed_at = Some(now);
        }
    }

    fn incident(&self, request_id: &str, kind: &str) -> Result<Incident, LedgerError> {
        let closed = self
            .closed_at
            .filter(|_| !self.open)
            .map(|at| IncidentClosed {
                at,
                closing: self.closing.clone(),
            });
        Ok(Incident {
            id: self.id,
            request_id: RequestId::parse("request_id", request_id)
                .map_err(|e| LedgerError::corrupt(e.to_string()))?,
            product_id: ProductId::parse(self.product_id)
                .map_err(|e| LedgerError::corrupt(e.to_string()))?,
            kind: kind.to_owned(),
            detail: self.detail.clone(),
            created_at: self.created_at,
            closed,
        })
    }
}

/// One `outbox` row.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    pub id: i64,
    pub event_id: String,
    pub event_type: EventType,
    pub request_id: String,
    pub order_id: Option<i64>,
    pub product_id: i64,
    pub user_id: i64,
    pub quantity: i64,
    pub reason: Option<&'static str>,
    pub sequence: i32,
    pub payload: String,
    pub created_at: DateTime<Utc>,
    pub sent: bool,
    attempts: u32,
    /// Refusals for good in a row (`PublishFailure::refused`).
    refusals: u32,
    claimed_by: Option<String>,
    claimed_until: Option<DateTime<Utc>>,
    /// Parked: the broker's last refusal and when (`Outbox::park`); not unsent then.
    parked: Option<(String, DateTime<Utc>)>,
}

impl OutboxRow {
    /// Whether it waits to be published: neither sent nor parked.
    fn unsent(&self) -> bool {
        !self.sent && self.parked.is_none()
    }

    /// The event as a consumer decodes it from the payload.
    pub fn event(&self) -> Option<Event> {
        Some(Event {
            event_id: self.event_id.clone(),
            event_type: self.event_type,
            sequence: u32::try_from(self.sequence).ok()?,
            order_id: match self.order_id {
                Some(id) => Some(OrderId::parse(id).ok()?),
                None => None,
            },
            request_id: RequestId::parse("request_id", &self.request_id).ok()?,
            product_id: ProductId::parse(self.product_id).ok()?,
            // A stock repair's row has no buyer (user_id and quantity 0).
            units: match self.event_type {
                t if t.of_product() => None,
                _ => Some((
                    UserId::parse(self.user_id).ok()?,
                    flashsale_core::Quantity::from_stored(self.quantity)?,
                )),
            },
            reason: self.reason.map(str::to_owned),
            occurred_at: self.created_at,
        })
    }
}

/// An event's `occurred_at` in its payload: microseconds, UTC.
const OCCURRED_AT: &str = "%Y-%m-%dT%H:%M:%S%.6fZ";

/// A new outbox row's own values; [`Tables::insert_event`] adds the rest.
struct RowValues {
    event_type: EventType,
    request_id: String,
    order_id: Option<i64>,
    product_id: i64,
    user_id: i64,
    quantity: i64,
    reason: Option<&'static str>,
    sequence: i32,
}

/// An event a transaction is about to write (`Draft` in `outbox.rs`).
struct Draft {
    event_type: EventType,
    order_id: Option<i64>,
    request: PurchaseRequest,
    reason: Option<&'static str>,
}

/// An order and the simulation step at which it was committed.
#[derive(Debug, Clone)]
pub struct OrderRow {
    pub order: Order,
    pub committed_step: u64,
}

#[derive(Debug, Default)]
struct Tables {
    products: BTreeMap<i64, Product>,
    inventory: BTreeMap<i64, InventoryRow>,
    orders: BTreeMap<i64, OrderRow>,
    /// `orders.uk_request_id`.
    order_by_request: BTreeMap<String, i64>,
    /// `inventory_reservation`, by its unique request_id.
    reservations: BTreeMap<String, ReservationRow>,
    next_reservation_id: i64,
    next_order_id: i64,
    /// `inventory_log.uk_request_type`.
    log: BTreeSet<(String, &'static str)>,
    /// `outbox`, by row id.
    outbox: BTreeMap<i64, OutboxRow>,
    /// `uk_outbox_request_type`: (request_id, event type) → row id.
    outbox_keys: BTreeMap<(String, EventType), i64>,
    next_outbox_id: i64,
    /// `consumed_event` and `sales_stats` (the statistics consumer's store).
    consumed: BTreeSet<String>,
    sales_stats: BTreeMap<i64, StatsDelta>,
    restocks: BTreeMap<String, RestockRow>,
    /// `recovery_incident.uk_incident`: (request_id, kind).
    incidents: BTreeMap<(String, String), IncidentRow>,
    /// `audit_run`, oldest first, at most `AUDIT_RUNS_KEPT`.
    audits: std::collections::VecDeque<flashsale_app::ports::AuditRun>,
    /// `stock_repair`, oldest first.
    repairs: Vec<StockRepair>,
    /// The last `recovery_incident.id` handed out.
    next_incident_id: i64,
    /// `audit_schedule`: (kind, scope) → the claim.
    audit_claims: BTreeMap<(&'static str, i64), AuditClaimRow>,
    /// Errors that mean the ledger's data broke a rule (a CHECK failed, a reservation
    /// disagreed with its order): each is a finding.
    anomalies: Vec<String>,
}

/// What one simulated group transaction's checks found (`group::Written` there).
enum Checked {
    /// Nothing in the way: it writes.
    Plain,
    /// A request_id or hold id taken, too few units, a rebuilt generation.
    NotPlain,
    OverLimit(OverLimit),
}

type Lookup = Result<Option<PurchaseRecord>, LedgerError>;

pub struct MemLedger {
    ctx: Arc<Ctx>,
    defects: LedgerDefects,
    tables: Mutex<Tables>,
    /// Group commit: `commit_purchase` calls queued while a group transaction runs go
    /// together in the next one.
    group: Coalescer<HeldPurchase, Result<Commit, LedgerError>>,
    /// Batched lookups: `find_purchase` calls queued while a lookup runs go together.
    lookups: Coalescer<RequestId, Lookup>,
}

fn corrupt(what: impl std::fmt::Display) -> LedgerError {
    LedgerError::corrupt(format!("unexpected data in the ledger: {what}"))
}

/// What one purchase or fence transaction did (`Attempt` in `MysqlLedger`).
enum Attempt<T> {
    Done(T),
    Taken,
    /// `uk_reservation_hold`: the hold id is recorded already in this generation.
    HoldReused,
}

fn check_counters(c: &InventoryRow) -> bool {
    c.available >= 0
        && c.reserved >= 0
        && c.sold >= 0
        && c.available + c.reserved + c.sold == c.total
}

impl Tables {
    /// Who serves the product's stock (gate mode for a product with no inventory row).
    fn mode_of(&self, product_id: i64) -> StockMode {
        self.inventory
            .get(&product_id)
            .map_or(StockMode::Gate, |i| i.mode)
    }

    /// Whether the gate serves the product: what it is owed (returns, restocks) is
    /// given to it only then; in ledger mode the way back's rebuild settles it.
    fn gate_serves(&self, product_id: i64) -> bool {
        self.mode_of(product_id) == StockMode::Gate
    }

    /// `uk_reservation_hold (product_id, generation, hold_id)`.
    fn hold_recorded(&self, product_id: i64, hold: HoldRef) -> bool {
        self.reservations
            .values()
            .any(|r| r.request.product_id.get() == product_id && r.hold == hold)
    }

    fn purchase_record(&self, request_id: &str) -> Result<Option<PurchaseRecord>, LedgerError> {
        let Some(r) = self.reservations.get(request_id) else {
            return Ok(None);
        };
        let outcome = match self.order_by_request.get(request_id) {
            Some(id) => match self.orders.get(id) {
                Some(row) => PurchaseOutcome::Order(row.order.clone()),
                None => return Err(corrupt(format!("order {id} vanished"))),
            },
            None => match (r.status, r.release_reason) {
                (ReservationStatus::Released, Some(reason)) => PurchaseOutcome::Released { reason },
                _ => {
                    return Err(corrupt(format!(
                        "reservation {request_id} is {} without an order",
                        r.status
                    )))
                }
            },
        };
        Ok(Some(PurchaseRecord {
            request: r.request.clone(),
            hold: r.hold,
            outcome,
        }))
    }

    /// The writes of one purchase: its order, its reservation, the log, the
    /// `order_created` event and the counters. The caller has checked everything.
    fn write_purchase(
        &mut self,
        request: &PurchaseRequest,
        hold: HoldRef,
        payment_timeout: Duration,
        now: DateTime<Utc>,
        step: u64,
    ) -> Result<Order, LedgerError> {
        let rid = request.request_id.as_str();
        let timeout = TimeDelta::from_std(payment_timeout).unwrap_or(TimeDelta::MAX);
        let order_id = self.next_order_id;
        let order = Order {
            order_id: OrderId::parse(order_id).map_err(corrupt)?,
            request_id: request.request_id.clone(),
            user_id: request.user_id,
            product_id: request.product_id,
            quantity: request.quantity,
            status: OrderStatus::PendingPayment,
            created_at: now,
            expires_at: now + timeout,
            paid_at: None,
            cancelled_at: None,
            cancel_reason: None,
            refunded_at: None,
        };
        self.next_order_id += 1;
        let id = self.next_reservation_id;
        self.next_reservation_id += 1;
        self.reservations.insert(
            rid.to_owned(),
            ReservationRow {
                id,
                request: request.clone(),
                hold,
                status: ReservationStatus::Processing,
                release_reason: None,
                stock_returned: false,
                released_generation: None,
                updated_at: now,
                transitions: 0,
            },
        );
        self.orders.insert(
            order_id,
            OrderRow {
                order: order.clone(),
                committed_step: step,
            },
        );
        self.order_by_request.insert(rid.to_owned(), order_id);
        self.log.insert((rid.to_owned(), "reserve"));
        let events = vec![Draft {
            event_type: EventType::OrderCreated,
            order_id: Some(order_id),
            request: request.clone(),
            reason: None,
        }];
        self.write_events(events, now);
        if let Some(inv) = self.inventory.get_mut(&request.product_id.get()) {
            let q = i64::from(request.quantity.get());
            inv.available -= q;
            inv.reserved += q;
        }
        Ok(order)
    }

    /// Whether the events can be written: none may collide on `uk_outbox_request_type`
    /// (the INSERT would fail, and the transaction with it).
    fn events_fit(&self, drafts: &[Draft]) -> bool {
        drafts.iter().all(|d| {
            !self
                .outbox_keys
                .contains_key(&(d.request.request_id.as_str().to_owned(), d.event_type))
        })
    }

    /// `outbox::record`: one row per draft, its sequence one past the request's last.
    fn write_events(&mut self, drafts: Vec<Draft>, now: DateTime<Utc>) {
        for d in drafts {
            let rid = d.request.request_id.as_str().to_owned();
            let sequence = self
                .outbox
                .values()
                .filter(|r| r.request_id == rid)
                .map(|r| r.sequence)
                .max()
                .unwrap_or(0)
                + 1;
            let json_opt = |v: Option<String>| v.unwrap_or_else(|| "null".to_owned());
            let payload = |event_id: &str| {
                format!(
                    "{{\"event_id\": \"{event_id}\", \"event_type\": \"{}\", \"sequence\": {sequence}, \
                     \"order_id\": {}, \"request_id\": \"{rid}\", \"product_id\": {}, \
                     \"user_id\": {}, \"quantity\": {}, \"reason\": {}, \"occurred_at\": \"{}\"}}",
                    d.event_type.as_str(),
                    json_opt(d.order_id.map(|o| o.to_string())),
                    d.request.product_id,
                    d.request.user_id,
                    d.request.quantity,
                    json_opt(d.reason.map(|r| format!("\"{r}\""))),
                    now.format(OCCURRED_AT),
                )
            };
            let values = RowValues {
                event_type: d.event_type,
                request_id: rid.clone(),
                order_id: d.order_id,
                product_id: d.request.product_id.get(),
                user_id: d.request.user_id.get(),
                quantity: i64::from(d.request.quantity.get()),
                reason: d.reason,
                sequence,
            };
            self.insert_event(values, now, payload);
        }
    }

    /// `record_repair_at`'s event: request_id `REPAIR_<n>` of the n-th repair, no buyer.
    fn write_repair_event(&mut self, r: &StockRepair, number: usize, now: DateTime<Utc>) {
        let rid = format!("REPAIR_{number}");
        let payload = |event_id: &str| {
            format!(
                "{{\"event_id\": \"{event_id}\", \"event_type\": \"stock_repaired\", \"sequence\": 1, \
                 \"order_id\": null, \"request_id\": \"{rid}\", \"product_id\": {}, \
                 \"repair_id\": {number}, \"generation\": {}, \"redis_before\": {}, \
                 \"redis_after\": {}, \"delta\": {}, \"expected\": {}, \"total_stock\": {}, \
                 \"live_units\": {}, \"in_flight_units\": {}, \"reason\": \"{}\", \"occurred_at\": \"{}\"}}",
                r.product_id,
                r.generation.get(),
                r.redis_before,
                r.redis_after,
                r.redis_after - r.redis_before,
                r.expected,
                r.total,
                r.live_units,
                r.in_flight_units,
                r.reason,
                now.format(OCCURRED_AT),
            )
        };
        let values = RowValues {
            event_type: EventType::StockRepaired,
            request_id: rid.clone(),
            order_id: None,
            product_id: r.product_id.get(),
            user_id: 0,
            quantity: 0,
            reason: Some(r.reason),
            sequence: 1,
        };
        self.insert_event(values, now, payload);
    }

    /// Stores one new outbox row, unsent and unclaimed, under the next id: its event id
    /// made from the id (the database makes a UUID; any unique id will do here), its
    /// payload by `payload` from that event id.
    fn insert_event(
        &mut self,
        v: RowValues,
        now: DateTime<Utc>,
        payload: impl FnOnce(&str) -> String,
    ) {
        let id = self.next_outbox_id;
        self.next_outbox_id += 1;
        let event_id = format!("ev-{id:06}");
        let payload = payload(&event_id);
        self.outbox_keys
            .insert((v.request_id.clone(), v.event_type), id);
        self.outbox.insert(
            id,
            OutboxRow {
                id,
                event_id,
                event_type: v.event_type,
                request_id: v.request_id,
                order_id: v.order_id,
                product_id: v.product_id,
                user_id: v.user_id,
                quantity: v.quantity,
                reason: v.reason,
                sequence: v.sequence,
                payload,
                created_at: now,
                sent: false,
                attempts: 0,
                refusals: 0,
                claimed_by: None,
                claimed_until: None,
                parked: None,
            },
        );
    }

    /// The facts' `event_mismatches` query: reservations (of one product, or all) whose
    /// events differ from their changes: order_created iff an order exists, order_paid
    /// iff it is PAID, order_cancelled iff CANCELLED, reservation_released iff the
    /// reservation is RELEASED.
    fn event_mismatches(&self, product_id: Option<i64>, max: usize) -> Vec<String> {
        let has = |rid: &str, ty: EventType| self.outbox_keys.contains_key(&(rid.to_owned(), ty));
        self.reservations
            .iter()
            .filter(|(_, r)| product_id.is_none_or(|p| r.request.product_id.get() == p))
            .filter(|(rid, r)| {
                let status = self
                    .order_by_request
                    .get(*rid)
                    .and_then(|id| self.orders.get(id))
                    .map(|o| o.order.status);
                status.is_some() != has(rid, EventType::OrderCreated)
                    || (status == Some(OrderStatus::Paid)) != has(rid, EventType::OrderPaid)
                    || (status == Some(OrderStatus::Cancelled))
                        != has(rid, EventType::OrderCancelled)
                    || (r.status == ReservationStatus::Released)
                        != has(rid, EventType::ReservationReleased)
            })
            .map(|(rid, _)| rid.clone())
            .take(max)
            .collect()
    }

    /// `order_with_flags`: the order (this user's), whether it is past its deadline, and
    /// how to give its units back if they are not back yet.
    fn order_with_flags(
        &self,
        order_id: OrderId,
        user_id: UserId,
        now: DateTime<Utc>,
    ) -> Option<(Order, bool, Option<ReleaseOf>)> {
        let row = self.orders.get(&order_id.get())?;
        if row.order.user_id != user_id {
            return None;
        }
        let order = row.order.clone();
        let expired = order.expires_at <= now;
        let r = self.reservations.get(order.request_id.as_str());
        let pending = r.filter(|r| r.status == ReservationStatus::Released && !r.stock_returned);
        let pending_return = pending.map(|r| ReleaseOf::Reservation {
            generation: r.released_generation.unwrap_or(Generation::FIRST),
            hold: r.hold,
            user_id: order.user_id,
            quantity: order.quantity,
            limited: self
                .products
                .get(&order.product_id.get())
                .is_some_and(|p| p.per_user_limit.is_some()),
            // The simulator's ledger has no refunds: every release returns its units.
            returns_units: true,
        });
        Some((order, expired, pending_return))
    }
}

impl MemLedger {
    pub fn new(ctx: Arc<Ctx>, defects: LedgerDefects) -> Self {
        Self {
            ctx,
            defects,
            tables: Mutex::new(Tables {
                next_reservation_id: 1,
                next_order_id: 1,
                next_outbox_id: 1,
                ..Tables::default()
            }),
            group: Coalescer::new(GROUP_COMMIT_MAX, || {
                Err(LedgerError::stopped(
                    "commit purchase: the group committer stopped; outcome unknown",
                ))
            }),
            lookups: Coalescer::new(LOOKUP_BATCH_MAX, || {
                Err(LedgerError::stopped(
                    "find purchase: the lookup batcher stopped",
                ))
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `NOW(6)`: the database's clock, to the microsecond.
    fn now(&self) -> DateTime<Utc> {
        let t = self.ctx.ledger_now();
        DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap_or(t)
    }

    /// Between two statements or transactions of one operation.
    async fn round_trip(&self, what: &str) {
        self.ctx.maybe_kill(what);
        Point::new().await;
    }

    /// As `MysqlLedger::gate_behind`: a reused hold id means the gate lost writes;
    /// advance the generation (once per detection of the current one).
    async fn gate_behind(
        &self,
        product_id: ProductId,
        generation: Generation,
    ) -> Result<(), LedgerError> {
        let current = self
            .lock()
            .inventory
            .get(&product_id.get())
            .map(|i| i.generation);
        if current == Some(generation) {
            LedgerMaintenance::advance_generation(self, product_id).await?;
        }
        Ok(())
    }

    fn anomaly(&self, t: &mut Tables, what: String) -> LedgerError {
        t.anomalies.push(what.clone());
        LedgerError::rejected(what)
    }

    /// The checks of a purchase's row INSERTs (`write_purchase_rows` there): the
    /// request_id's unique keys, `uk_reservation_hold`, and what no write of ours can
    /// collide on (the log's and the outbox's keys). None: the rows fit.
    fn rows_refuse(
        &self,
        t: &mut Tables,
        request: &PurchaseRequest,
        hold: HoldRef,
    ) -> Result<Option<Attempt<Commit>>, LedgerError> {
        let rid = request.request_id.as_str();
        if t.reservations.contains_key(rid) || t.order_by_request.contains_key(rid) {
            return Ok(Some(Attempt::Taken));
        }
        if t.hold_recorded(request.product_id.get(), hold) {
            return Ok(Some(Attempt::HoldReused));
        }
        if t.log.contains(&(rid.to_owned(), "reserve")) {
            return Err(self.anomaly(t, format!("duplicate inventory_log (reserve) for {rid}")));
        }
        let events = vec![Draft {
            event_type: EventType::OrderCreated,
            order_id: Some(t.next_order_id),
            request: request.clone(),
            reason: None,
        }];
        if !t.events_fit(&events) {
            return Err(self.anomaly(t, format!("duplicate outbox order_created for {rid}")));
        }
        Ok(None)
    }

    /// The ledger's per-user check (`over_user_limit` there): the user's live units of
    /// the product with this purchase's would pass `limit`.
    fn over_user_limit(t: &Tables, request: &PurchaseRequest, limit: Option<u32>) -> bool {
        let Some(limit) = limit else { return false };
        let live: i64 = t
            .orders
            .values()
            .filter(|o| {
                o.order.user_id == request.user_id
                    && o.order.product_id == request.product_id
                    && o.order.status != OrderStatus::Cancelled
            })
            .map(|o| i64::from(o.order.quantity.get()))
            .sum();
        live + i64::from(request.quantity.get()) > i64::from(limit)
    }

    /// The CHECK constraint on the counters after `q` more units are reserved.
    fn reserve_fits(&self, t: &mut Tables, inv: &InventoryRow, q: i64) -> Result<(), LedgerError> {
        let counters = InventoryRow {
            available: inv.available - q,
            reserved: inv.reserved + q,
            ..inv.clone()
        };
        if !self.defects.no_stock_guard && !check_counters(&counters) {
            return Err(self.anomaly(
                t,
                format!("CHECK chk_inventory_conservation failed: {counters:?}"),
            ));
        }
        Ok(())
    }

    fn tx_purchase(&self, purchase: &HeldPurchase) -> Result<Attempt<Commit>, LedgerError> {
        let HeldPurchase {
            request,
            hold,
            terms,
        } = purchase;
        let hold = *hold;
        let now = self.now();
        let step = self.ctx.step();
        let mut guard = self.lock();
        let t = &mut *guard;
        if let Some(refused) = self.rows_refuse(t, request, hold)? {
            return Ok(refused);
        }
        let q = i64::from(request.quantity.get());
        let p = request.product_id.get();
        let in_hold_generation = t
            .inventory
            .get(&p)
            .is_some_and(|i| i.generation == hold.generation && i.mode == StockMode::Gate);
        let fits = in_hold_generation
            && t.inventory
                .get(&p)
                .is_some_and(|i| self.defects.no_stock_guard || i.available >= q);
        if !fits {
            return Ok(Attempt::Done(if in_hold_generation {
                Commit::InsufficientStock
            } else {
                Commit::StaleGeneration
            }));
        }
        let Some(inv) = t.inventory.get(&p).cloned() else {
            return Ok(Attempt::Done(Commit::StaleGeneration));
        };
        // The per-user check after the counters UPDATE, as in the SQL.
        if Self::over_user_limit(t, request, terms.per_user_limit) {
            return Ok(Attempt::Done(Commit::LimitExceeded));
        }
        self.reserve_fits(t, &inv, q)?;
        let order = t.write_purchase(request, hold, terms.payment_timeout, now, step)?;
        Ok(Attempt::Done(Commit::Committed(order)))
    }

    /// `MysqlLedger::insert_ledger_purchase`: the counter UPDATE (ledger mode, enough
    /// units) hands out the next hold id, then the purchase's rows and the per-user check.
    /// A refused UPDATE for a request_id taken answers as a taken one (the record).
    fn tx_ledger_purchase(
        &self,
        purchase: &LedgerPurchase,
    ) -> Result<Attempt<Commit>, LedgerError> {
        let LedgerPurchase { request, terms } = purchase;
        let now = self.now();
        let step = self.ctx.step();
        let mut guard = self.lock();
        let t = &mut *guard;
        let q = i64::from(request.quantity.get());
        let p = request.product_id.get();
        let Some(inv) = t.inventory.get(&p).cloned() else {
            return Err(corrupt(format!("product {p} has no inventory")));
        };
        let rid = request.request_id.as_str();
        let taken = t.reservations.contains_key(rid) || t.order_by_request.contains_key(rid);
        let settling = TimeDelta::from_std(LEDGER_SALES_AFTER_SWITCH).unwrap_or(TimeDelta::MAX);
        let refused = if inv.mode == StockMode::Gate && !self.defects.ledger_sells_in_gate_mode {
            Some(Commit::GateMode)
        } else if inv.mode == StockMode::Ledger
            && inv.mode_changed_at.is_some_and(|at| at > now - settling)
        {
            Some(Commit::Settling)
        } else if !self.defects.no_stock_guard && inv.available < q {
            Some(Commit::InsufficientStock)
        } else {
            None
        };
        if let Some(refused) = refused {
            return Ok(if taken {
                Attempt::Taken
            } else {
                Attempt::Done(refused)
            });
        }
        let hold = HoldRef::from_stored(inv.generation.get(), inv.ledger_hold_seq + 1)
            .ok_or_else(|| corrupt(format!("ledger hold seq {}", inv.ledger_hold_seq)))?;
        if let Some(refused) = self.rows_refuse(t, request, hold)? {
            return Ok(refused);
        }
        if Self::over_user_limit(t, request, terms.per_user_limit) {
            return Ok(Attempt::Done(Commit::LimitExceeded));
        }
        self.reserve_fits(t, &inv, q)?;
        let order = t.write_purchase(request, hold, terms.payment_timeout, now, step)?;
        if let Some(inv) = t.inventory.get_mut(&p) {
            inv.ledger_hold_seq += 1;
        }
        self.ctx.lock().stats.ledger_sales += 1;
        Ok(Attempt::Done(Commit::Committed(order)))
    }

    fn tx_fence(
        &self,
        request: &PurchaseRequest,
        hold: HoldRef,
        reason: ReleaseReason,
    ) -> Result<Attempt<()>, LedgerError> {
        let now = self.now();
        let mut guard = self.lock();
        let t = &mut *guard;
        let rid = request.request_id.as_str();
        if t.reservations.contains_key(rid) {
            return Ok(Attempt::Taken);
        }
        if t.hold_recorded(request.product_id.get(), hold) {
            return Ok(Attempt::HoldReused);
        }
        if self.defects.fence_writes_nothing {
            return Ok(Attempt::Done(()));
        }
        if t.log.contains(&(rid.to_owned(), "release")) {
            return Err(self.anomaly(t, format!("duplicate inventory_log (release) for {rid}")));
        }
        let events = vec![Draft {
            event_type: EventType::ReservationReleased,
            order_id: None,
            request: request.clone(),
            reason: Some(reason.as_str()),
        }];
        if !t.events_fit(&events) {
            return Err(self.anomaly(
                t,
                format!("duplicate outbox reservation_released for {rid}"),
            ));
        }
        let id = t.next_reservation_id;
        t.next_reservation_id += 1;
        t.reservations.insert(
            rid.to_owned(),
            ReservationRow {
                id,
                request: request.clone(),
                hold,
                status: ReservationStatus::Released,
                release_reason: Some(reason),
                stock_returned: false,
                released_generation: None,
                updated_at: now,
                transitions: 1,
            },
        );
        t.log.insert((rid.to_owned(), "release"));
        t.write_events(events, now);
        // `insert_fence`: the fence answers an `outcome_unknown` incident of the request.
        if let Some(i) = t
            .incidents
            .get_mut(&(rid.to_owned(), "outcome_unknown".to_owned()))
        {
            i.close(now);
        }
        Ok(Attempt::Done(()))
    }

    /// A statement or transaction the adapter's batch task sends on its own connection:
    /// a yield point (where the task leading the batch may be abandoned), then the
    /// seeded fault of that call.
    async fn send(&self, what: &'static str) -> Fault {
        self.round_trip(what).await;
        self.ctx.fault(Port::Ledger)
    }

    /// `MysqlLedger::group_commit`: the group transactions `GroupCommit` asks for, each
    /// fed back to it, then each member answered as it says (the set-aside ones by
    /// [`Self::commit_one`], one after the other).
    async fn group_commit(&self, batch: Vec<HeldPurchase>) -> Vec<Result<Commit, LedgerError>> {
        let mut decision = GroupCommit::new(batch.iter().map(|p| &p.request));
        let mut orders: Vec<Order> = Vec::new();
        let mut error = None;
        while let Some(plain) = decision.next() {
            let members: Vec<&HeldPurchase> = plain.iter().map(|&i| &batch[i]).collect();
            decision.written(match self.group_transaction(&members).await {
                Ok((written, written_orders)) => {
                    orders = written_orders;
                    written
                }
                Err(e) => {
                    error = Some(e);
                    group::Written::Unknown
                }
            });
        }
        let tried = decision.attempts();
        let answers = decision.answers();
        self.ctx.trace(|| {
            format!(
                "group commit of {} in {tried} transaction(s): {answers:?}",
                batch.len()
            )
        });
        let lost = || LedgerError::stopped("group commit: no answer");
        let mut results = Vec::with_capacity(batch.len());
        for (p, answer) in batch.iter().zip(answers) {
            results.push(match answer {
                group::Answer::Committed(n) => orders
                    .get(n)
                    .cloned()
                    .map(Commit::Committed)
                    .ok_or_else(lost),
                group::Answer::Unknown => Err(error.clone().unwrap_or_else(lost)),
                group::Answer::OneByOne => match orders.first() {
                    Some(order) if self.defects.aside_from_batch => {
                        Ok(Commit::Committed(order.clone()))
                    }
                    _ => self.commit_one_sent(p).await,
                },
            });
        }
        results
    }

    /// A set-aside purchase's own transaction, sent by the batch task (with its fault).
    async fn commit_one_sent(&self, p: &HeldPurchase) -> Result<Commit, LedgerError> {
        let fault = self.send("group commit: one by one").await;
        if fault == Fault::Fail {
            return Err(LedgerError::unreachable(
                "commit purchase: unreachable (injected)",
            ));
        }
        let answer = self.commit_one(p).await;
        if fault == Fault::LoseReply {
            return Err(LedgerError::timed_out(
                "commit purchase: no answer in time (injected)",
            ));
        }
        answer
    }

    /// One group transaction: the script with its fault (failed: nothing written; reply
    /// lost: written, the outcome unknown; a duplicate is drawn as nothing, since a
    /// transaction is never sent twice), and on a rollback that is not about a per-user
    /// limit, the separate read of which request_ids are taken (`group::taken`).
    async fn group_transaction(
        &self,
        members: &[&HeldPurchase],
    ) -> Result<(group::Written, Vec<Order>), LedgerError> {
        let fault = self.send("group commit").await;
        if fault == Fault::Fail {
            return Err(LedgerError::unreachable(
                "group commit: unreachable (injected)",
            ));
        }
        let checked = self.tx_group(members).await?;
        self.ctx.trace(|| {
            let ids: Vec<&str> = members
                .iter()
                .map(|m| m.request.request_id.as_str())
                .collect();
            let what = match &checked {
                Ok(orders) => format!("{} orders", orders.len()),
                Err(Checked::OverLimit(over)) => format!("over a limit {over:?}"),
                Err(_) => "not plain".to_owned(),
            };
            format!("group transaction {ids:?}: {what}")
        });
        if fault == Fault::LoseReply {
            return Err(LedgerError::timed_out(
                "group commit: no answer in time (injected)",
            ));
        }
        self.round_trip("group commit: the reply").await;
        match checked {
            Ok(orders) => Ok((group::Written::Orders, orders)),
            Err(Checked::OverLimit(over)) => Ok((group::Written::OverLimit(over), Vec::new())),
            Err(_) => {
                if matches!(
                    self.send("group commit: taken").await,
                    Fault::Fail | Fault::LoseReply
                ) {
                    return Err(LedgerError::unreachable(
                        "group commit: taken: unreachable (injected)",
                    ));
                }
                let t = self.lock();
                let taken = members
                    .iter()
                    .map(|m| &m.request.request_id)
                    .filter(|id| t.reservations.contains_key(id.as_str()))
                    .cloned()
                    .collect();
                Ok((group::Written::Taken(taken), Vec::new()))
            }
        }
    }

    /// The group transaction itself, all or nothing: the orders, or why it rolled back.
    async fn tx_group(
        &self,
        members: &[&HeldPurchase],
    ) -> Result<Result<Vec<Order>, Checked>, LedgerError> {
        let now = self.now();
        let step = self.ctx.step();
        let checked = {
            let mut guard = self.lock();
            let checked = self.group_check(&guard, members);
            if !self.defects.group_writes_late || !matches!(checked, Checked::Plain) {
                return match checked {
                    Checked::Plain => Ok(Ok(self.group_write(&mut guard, members, now, step)?)),
                    other => Ok(Err(other)),
                };
            }
            checked
        };
        // The defect: what was checked is written after a yield, whatever landed since.
        debug_assert!(matches!(checked, Checked::Plain));
        self.round_trip("group commit: write what was checked")
            .await;
        let mut guard = self.lock();
        Ok(Ok(self.group_write(&mut guard, members, now, step)?))
    }

    /// What the group transaction's statements check, in their order: the unique keys
    /// of the procedure's INSERTs (request_id, (product, generation, hold id), the log's
    /// and the outbox's), then one counter UPDATE per (product, generation) — `available
    /// >= q AND generation = g` — then the per-user check (`OVER_LIMIT`).
    fn group_check(&self, t: &Tables, members: &[&HeldPurchase]) -> Checked {
        let mut holds = BTreeSet::new();
        let mut units: BTreeMap<(ProductId, Generation), i64> = BTreeMap::new();
        for m in members {
            let r = &m.request;
            let rid = r.request_id.as_str();
            if t.reservations.contains_key(rid)
                || t.order_by_request.contains_key(rid)
                || t.hold_recorded(r.product_id.get(), m.hold)
                || !holds.insert((r.product_id, m.hold))
                || t.log.contains(&(rid.to_owned(), "reserve"))
                || t.outbox_keys
                    .contains_key(&(rid.to_owned(), EventType::OrderCreated))
            {
                return Checked::NotPlain;
            }
            *units.entry((r.product_id, m.hold.generation)).or_default() +=
                i64::from(r.quantity.get());
        }
        let mut available: BTreeMap<ProductId, i64> = BTreeMap::new();
        for ((p, generation), q) in &units {
            let Some(inv) = t.inventory.get(&p.get()) else {
                return Checked::NotPlain;
            };
            let left = available.entry(*p).or_insert(inv.available);
            if inv.generation != *generation
                || inv.mode != StockMode::Gate
                || (!self.defects.no_stock_guard && *left < *q)
            {
                return Checked::NotPlain;
            }
            *left -= q;
        }
        // (own units of the pair in the batch, the smallest limit among them)
        let mut pairs: BTreeMap<(UserId, ProductId), (i64, Option<i64>)> = BTreeMap::new();
        for m in members {
            let r = &m.request;
            let e = pairs.entry((r.user_id, r.product_id)).or_default();
            e.0 += i64::from(r.quantity.get());
            if let Some(limit) = m.terms.per_user_limit.map(i64::from) {
                e.1 = Some(e.1.map_or(limit, |l| l.min(limit)));
            }
        }
        let mut over = OverLimit::new();
        for ((user, product), (own, limit)) in pairs {
            let Some(limit) = limit else { continue };
            let before: i64 = t
                .orders
                .values()
                .filter(|o| {
                    o.order.user_id == user
                        && o.order.product_id == product
                        && o.order.status.holds_stock()
                })
                .map(|o| i64::from(o.order.quantity.get()))
                .sum();
            if before + own > limit {
                over.insert((user, product), Held { before, limit });
            }
        }
        if over.is_empty() {
            Checked::Plain
        } else {
            Checked::OverLimit(over)
        }
    }

    /// The group transaction's writes, every member's.
    fn group_write(
        &self,
        t: &mut Tables,
        members: &[&HeldPurchase],
        now: DateTime<Utc>,
        step: u64,
    ) -> Result<Vec<Order>, LedgerError> {
        members
            .iter()
            .map(|m| t.write_purchase(&m.request, m.hold, m.terms.payment_timeout, now, step))
            .collect()
    }

    /// `MysqlLedger::find_purchases`: one read for the whole batch, with its fault.
    async fn find_purchases(&self, ids: Vec<RequestId>) -> Vec<Lookup> {
        if matches!(
            self.send("find purchases").await,
            Fault::Fail | Fault::LoseReply
        ) {
            return ids
                .iter()
                .map(|_| {
                    Err(LedgerError::unreachable(
                        "find purchase: unreachable (injected)",
                    ))
                })
                .collect();
        }
        let mut guard = self.lock();
        let t = &mut *guard;
        ids.iter()
            .map(|id| match t.purchase_record(id.as_str()) {
                Ok(r) => Ok(r),
                Err(e) => Err(self.anomaly(t, e.detail().to_owned())),
            })
            .collect()
    }

    /// `MysqlLedger::purchase_or_taken`: runs `attempt` until it is done or meets a
    /// recorded hold id, answering a request_id taken by a transaction that committed
    /// with that transaction's record; a collision with one that rolled back is tried
    /// again, at most `TX_ATTEMPTS_MAX` times in all.
    async fn or_taken<T>(
        &self,
        what: &'static str,
        request_id: &RequestId,
        mut attempt: impl FnMut() -> Result<Attempt<T>, LedgerError>,
    ) -> Result<Result<Attempt<T>, PurchaseRecord>, LedgerError> {
        for _ in 0..TX_ATTEMPTS_MAX {
            match attempt()? {
                Attempt::Taken => {
                    self.round_trip(what).await;
                    if let Some(record) = self.find_purchase(request_id).await? {
                        return Ok(Err(record));
                    }
                }
                done => return Ok(Ok(done)),
            }
        }
        Err(LedgerError::contention(format!(
            "{what}: request_id {request_id} kept colliding with transactions that rolled \
             back"
        )))
    }

    /// One purchase in its own transaction (`MysqlLedger::commit_one`).
    async fn commit_one(&self, purchase: &HeldPurchase) -> Result<Commit, LedgerError> {
        let HeldPurchase { request, hold, .. } = purchase;
        let attempt = self
            .or_taken(
                "commit purchase: find the record that won",
                &request.request_id,
                || self.tx_purchase(purchase),
            )
            .await?;
        match attempt {
            Ok(Attempt::Done(commit)) => Ok(commit),
            Ok(_) => {
                self.gate_behind(request.product_id, hold.generation)
                    .await?;
                Ok(Commit::StaleGeneration)
            }
            Err(record) => Ok(Commit::Duplicate(record)),
        }
    }

    /// `MysqlLedger::transition`: the order out of PENDING_PAYMENT, its reservation out of
    /// PROCESSING, the counters, the events and the log, in one transaction; false when
    /// the conditional UPDATE matched nothing.
    fn tx_transition(
        &self,
        order_id: OrderId,
        user_id: UserId,
        to: OrderStatus,
        cancel_reason: Option<CancelReason>,
    ) -> Result<bool, LedgerError> {
        let now = self.now();
        let mut guard = self.lock();
        let t = &mut *guard;
        let Some(row) = t.orders.get(&order_id.get()) else {
            return Ok(false);
        };
        let o = &row.order;
        let matched = o.user_id == user_id
            && o.status == OrderStatus::PendingPayment
            && match to {
                OrderStatus::Paid => o.expires_at > now,
                OrderStatus::Cancelled if cancel_reason == Some(CancelReason::PaymentTimeout) => {
                    o.expires_at <= now
                }
                OrderStatus::Cancelled => true,
                // A refund is the operator's, which the simulator does not drive.
                OrderStatus::PendingPayment | OrderStatus::Refunded => {
                    return Err(LedgerError::rejected(format!(
                        "no buyer's transition to {to}"
                    )))
                }
            };
        if !matched {
            return Ok(false);
        }
        let rid = o.request_id.as_str().to_owned();
        let p = o.product_id.get();
        let q = i64::from(o.quantity.get());
        let request = o.request();
        if t.reservations.get(&rid).map(|r| r.status) != Some(ReservationStatus::Processing) {
            return Err(self.anomaly(
                t,
                format!(
                    "order {order_id} is PENDING_PAYMENT but its reservation is not PROCESSING"
                ),
            ));
        }
        let reason = cancel_reason.unwrap_or(CancelReason::UserCancelled);
        let draft = |event_type, reason| Draft {
            event_type,
            order_id: Some(order_id.get()),
            request: request.clone(),
            reason,
        };
        let events = match to {
            OrderStatus::Paid => vec![draft(EventType::OrderPaid, None)],
            _ => vec![
                draft(EventType::OrderCancelled, Some(reason.as_str())),
                draft(
                    EventType::ReservationReleased,
                    Some(ReleaseReason::for_cancel(reason).as_str()),
                ),
            ],
        };
        if !t.events_fit(&events) {
            return Err(self.anomaly(t, format!("duplicate outbox event for {rid} ({to})")));
        }
        let Some(inv) = t.inventory.get(&p).cloned() else {
            return Err(self.anomaly(
                t,
                format!("order {order_id} of a product without inventory"),
            ));
        };
        let counters = match to {
            OrderStatus::Paid => InventoryRow {
                reserved: inv.reserved - q,
                sold: inv.sold + q,
                ..inv.clone()
            },
            _ => InventoryRow {
                reserved: inv.reserved - q,
                available: inv.available + q,
                ..inv.clone()
            },
        };
        if !self.defects.no_stock_guard && !check_counters(&counters) {
            return Err(self.anomaly(
                t,
                format!("CHECK chk_inventory_conservation failed: {counters:?}"),
            ));
        }
        let log_type = if to == OrderStatus::Paid {
            "confirm"
        } else {
            "release"
        };
        if t.log.contains(&(rid.clone(), log_type)) {
            return Err(self.anomaly(t, format!("duplicate inventory_log ({log_type}) for {rid}")));
        }
        // Everything checked: apply.
        if let Some(row) = t.orders.get_mut(&order_id.get()) {
            row.order.status = to;
            if to == OrderStatus::Paid {
                row.order.paid_at = Some(now);
            } else {
                row.order.cancelled_at = Some(now);
                row.order.cancel_reason = cancel_reason;
            }
        }
        if let Some(r) = t.reservations.get_mut(&rid) {
            r.transitions += 1;
            r.updated_at = now;
            if to == OrderStatus::Paid {
                r.status = ReservationStatus::Confirmed;
            } else {
                r.status = ReservationStatus::Released;
                r.release_reason = Some(ReleaseReason::for_cancel(reason));
                // In ledger mode the units are back where the stock is served.
                r.stock_returned = inv.mode == StockMode::Ledger;
                r.released_generation = Some(inv.generation);
            }
        }
        t.write_events(events, now);
        t.inventory.insert(p, counters);
        t.log.insert((rid, log_type));
        Ok(true)
    }

    // ---- what the simulation's checks read (no faults, no yields) --------------------

    /// The products in ledger mode.
    pub fn peek_ledger_mode_products(&self) -> Vec<i64> {
        self.lock()
            .inventory
            .iter()
            .filter(|(_, inv)| inv.mode == StockMode::Ledger)
            .map(|(p, _)| *p)
            .collect()
    }

    /// Units of live (PENDING_PAYMENT or PAID) orders and the total stock, per product.
    pub fn live_units(&self) -> BTreeMap<i64, (i64, i64)> {
        let t = self.lock();
        let mut out: BTreeMap<i64, (i64, i64)> = t
            .inventory
            .iter()
            .map(|(p, i)| (*p, (0, i.total)))
            .collect();
        for row in t.orders.values() {
            if row.order.status.holds_stock() {
                let e = out.entry(row.order.product_id.get()).or_insert((0, 0));
                e.0 += i64::from(row.order.quantity.get());
            }
        }
        out
    }

    pub fn orders(&self) -> Vec<OrderRow> {
        self.lock().orders.values().cloned().collect()
    }

    pub fn order_row(&self, order_id: i64) -> Option<OrderRow> {
        self.lock().orders.get(&order_id).cloned()
    }

    pub fn order_of_request(&self, request_id: &str) -> Option<OrderRow> {
        let t = self.lock();
        let id = t.order_by_request.get(request_id)?;
        t.orders.get(id).cloned()
    }

    pub fn anomalies(&self) -> Vec<String> {
        self.lock().anomalies.clone()
    }

    /// Request_ids whose reservation made more than one terminal transition (I3).
    pub fn resolved_twice(&self) -> Vec<String> {
        self.lock()
            .reservations
            .iter()
            .filter(|(_, r)| r.transitions > 1)
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Request_ids whose outbox events do not match their state changes one to one
    /// (I7's first half), over every product.
    pub fn event_mismatches(&self) -> Vec<String> {
        self.lock().event_mismatches(None, usize::MAX)
    }

    /// The event of outbox row `id`, if it is `event_id`.
    pub fn event(&self, id: i64, event_id: &str) -> Option<Event> {
        self.lock()
            .outbox
            .get(&id)
            .filter(|r| r.event_id == event_id)
            .and_then(OutboxRow::event)
    }

    pub fn unsent_count(&self) -> usize {
        self.lock().outbox.values().filter(|r| r.unsent()).count()
    }

    /// Every outbox row.
    pub fn outbox_rows(&self) -> Vec<OutboxRow> {
        self.lock().outbox.values().cloned().collect()
    }

    /// The statistics consumer's counters and the event ids it consumed.
    pub fn sales_stats(&self) -> (BTreeMap<i64, StatsDelta>, BTreeSet<String>) {
        let t = self.lock();
        (t.sales_stats.clone(), t.consumed.clone())
    }

    /// The restocks recorded for a product: (request_id, quantity).
    pub fn restocks(&self, product_id: i64) -> Vec<(String, i64)> {
        self.lock()
            .restocks
            .iter()
            .filter(|(_, r)| r.product_id == product_id)
            .map(|(id, r)| (id.clone(), r.quantity))
            .collect()
    }

    pub fn per_user_live_units(&self) -> BTreeMap<(i64, i64), i64> {
        let t = self.lock();
        let mut out = BTreeMap::new();
        for row in t.orders.values() {
            if row.order.status.holds_stock() {
                *out.entry((row.order.product_id.get(), row.order.user_id.get()))
                    .or_insert(0) += i64::from(row.order.quantity.get());
            }
        }
        out
    }

    /// `LedgerMaintenance::facts` in one atomic look.
    pub fn peek_facts(&self, product_id: i64) -> Option<LedgerFacts> {
        let now = self.now();
        let t = self.lock();
        let counters = counters_of(&t, product_id)?;
        let mode = t.mode_of(product_id);
        let (pending_units, paid_units, overdue_unpaid) = units_of(&t, product_id, now);
        Some(rest_of(
            &t,
            product_id,
            (counters, mode),
            pending_units,
            paid_units,
            overdue_unpaid,
        ))
    }
}

fn counters_of(t: &Tables, product_id: i64) -> Option<InventoryCounters> {
    t.inventory.get(&product_id).map(|i| InventoryCounters {
        total: i.total,
        available: i.available,
        reserved: i.reserved,
        sold: i.sold,
    })
}

fn units_of(t: &Tables, product_id: i64, now: DateTime<Utc>) -> (i64, i64, i64) {
    let (mut pending, mut paid, mut overdue) = (0, 0, 0);
    for row in t.orders.values() {
        let o = &row.order;
        if o.product_id.get() != product_id {
            continue;
        }
        let q = i64::from(o.quantity.get());
        match o.status {
            OrderStatus::PendingPayment => {
                pending += q;
                if o.expires_at <= now {
                    overdue += 1;
                }
            }
            OrderStatus::Paid => paid += q,
            OrderStatus::Cancelled | OrderStatus::Refunded => {}
        }
    }
    (pending, paid, overdue)
}

fn rest_of(
    t: &Tables,
    product_id: i64,
    (counters, mode): (InventoryCounters, StockMode),
    pending_units: i64,
    paid_units: i64,
    overdue_unpaid: i64,
) -> LedgerFacts {
    let orders_without_reservation = t
        .orders
        .values()
        .filter(|o| {
            o.order.product_id.get() == product_id
                && !t.reservations.contains_key(o.order.request_id.as_str())
        })
        .map(|o| o.order.request_id.to_string())
        .take(LISTED_MAX)
        .collect();
    let mut mismatched = Vec::new();
    let mut log_mismatches = Vec::new();
    let (mut reserve_logged, mut ordered_units) = (0, 0);
    for o in t
        .orders
        .values()
        .filter(|o| o.order.product_id.get() == product_id)
    {
        let q = i64::from(o.order.quantity.get());
        ordered_units += q;
        if t.log.contains(&(o.order.request_id.to_string(), "reserve")) {
            reserve_logged += q;
        }
    }
    let mut live = BTreeMap::new();
    let mut unreturned = BTreeMap::new();
    let mut reserved_request_ids = BTreeSet::new();
    for (rid, r) in t
        .reservations
        .iter()
        .filter(|(_, r)| r.request.product_id.get() == product_id)
    {
        let order = t
            .order_by_request
            .get(rid)
            .and_then(|id| t.orders.get(id))
            .map(|o| o.order.status);
        let consistent = matches!(
            (order, r.status),
            (
                Some(OrderStatus::PendingPayment),
                ReservationStatus::Processing
            ) | (Some(OrderStatus::Paid), ReservationStatus::Confirmed)
                | (Some(OrderStatus::Cancelled), ReservationStatus::Released)
                | (None, ReservationStatus::Released)
        );
        if !consistent && mismatched.len() < LISTED_MAX {
            mismatched.push(rid.clone());
        }
        let logged = |log_type| t.log.contains(&(rid.clone(), log_type));
        let log_consistent = logged("confirm") == (r.status == ReservationStatus::Confirmed)
            && logged("release") == (r.status == ReservationStatus::Released);
        if !log_consistent && log_mismatches.len() < LISTED_MAX {
            log_mismatches.push(rid.clone());
        }
        let q = i64::from(r.request.quantity.get());
        if r.status == ReservationStatus::Released {
            if !r.stock_returned {
                unreturned.insert(rid.clone(), (q, Duration::ZERO));
            }
        } else {
            live.insert(rid.clone(), (r.hold.id, q));
        }
        reserved_request_ids.insert(rid.clone());
    }
    let open_incidents = t
        .incidents
        .values()
        .filter(|i| i.product_id == product_id && i.open)
        .count();
    let unsent_events = t
        .outbox
        .values()
        .filter(|e| e.product_id == product_id && e.unsent())
        .count();
    let parked_events = t
        .outbox
        .values()
        .filter(|e| e.product_id == product_id && e.parked.is_some())
        .count();
    LedgerFacts {
        counters,
        mode,
        gate_loaded: t.products.get(&product_id).is_some_and(|p| p.stock_loaded),
        pending_units,
        paid_units,
        orders_without_reservation,
        mismatched,
        live,
        unreturned,
        reserved_request_ids,
        overdue_unpaid,
        // The simulator audits a drained system with `AuditBounds::QUIET`: any work in
        // flight is a violation, whatever its age.
        overdue_oldest: Duration::ZERO,
        unapplied_restocks: BTreeMap::new(),
        // The simulator's workloads make no destocks (an admin's action on MariaDB).
        pending_destocks: BTreeMap::new(),
        open_incidents: i64::try_from(open_incidents).unwrap_or(i64::MAX),
        event_mismatches: t.event_mismatches(Some(product_id), LISTED_MAX),
        reserve_logged,
        ordered_units,
        log_mismatches,
        unsent_events: i64::try_from(unsent_events).unwrap_or(i64::MAX),
        unsent_oldest: Duration::ZERO,
        parked_events: i64::try_from(parked_events).unwrap_or(i64::MAX),
    }
}

#[async_trait]
impl Ledger for MemLedger {
    async fn ping(&self) -> Result<(), LedgerError> {
        Ok(())
    }

    // The simulator keeps no operator's log: `by` is MariaDB's to record.
    async fn create_product(
        &self,
        new: &NewProduct,
        _by: &AdminName,
    ) -> Result<CreateProduct, LedgerError> {
        let created = {
            let now = self.now();
            let mut guard = self.lock();
            let t = &mut *guard;
            let p = new.product_id.get();
            match t.products.entry(p) {
                std::collections::btree_map::Entry::Occupied(_) => false,
                std::collections::btree_map::Entry::Vacant(slot) => {
                    slot.insert(Product {
                        product_id: new.product_id,
                        name: new.name.clone(),
                        per_user_limit: new.per_user_limit,
                        window: new.window,
                        stock_loaded: false,
                        stock_mode: StockMode::Gate,
                        paused: false,
                        created_at: now,
                    });
                    t.inventory.insert(
                        p,
                        InventoryRow {
                            total: new.stock,
                            available: new.stock,
                            reserved: 0,
                            sold: 0,
                            generation: Generation::FIRST,
                            mode: StockMode::Gate,
                            ledger_hold_seq: 0,
                            gate_unreachable_at: None,
                            mode_changed_at: None,
                        },
                    );
                    true
                }
            }
        };
        self.round_trip("create product: read back").await;
        let product = self
            .product(new.product_id)
            .await?
            .ok_or_else(|| corrupt("product vanished after insert"))?;
        if created {
            return Ok(CreateProduct::Created(product));
        }
        self.round_trip("create product: inventory").await;
        let counters = self
            .inventory(new.product_id)
            .await?
            .ok_or_else(|| corrupt("product without inventory"))?;
        Ok(CreateProduct::Exists(product, counters.total))
    }

    async fn product(&self, product_id: ProductId) -> Result<Option<Product>, LedgerError> {
        let t = self.lock();
        let p = product_id.get();
        // The mode is the inventory row's (the SQL joins it).
        Ok(t.products.get(&p).map(|product| Product {
            stock_mode: t.inventory.get(&p).map_or(StockMode::Gate, |i| i.mode),
            ..product.clone()
        }))
    }

    async fn mark_stock_loaded(&self, product_id: ProductId) -> Result<(), LedgerError> {
        if let Some(p) = self.lock().products.get_mut(&product_id.get()) {
            p.stock_loaded = true;
        }
        Ok(())
    }

    async fn generation(&self, product_id: ProductId) -> Result<Option<Generation>, LedgerError> {
        Ok(self
            .lock()
            .inventory
            .get(&product_id.get())
            .map(|i| i.generation))
    }

    async fn inventory(
        &self,
        product_id: ProductId,
    ) -> Result<Option<InventoryCounters>, LedgerError> {
        Ok(counters_of(&self.lock(), product_id.get()))
    }

    async fn commit_purchase(&self, purchase: &HeldPurchase) -> Result<Commit, LedgerError> {
        self.group
            .call(&self.ctx, purchase.clone(), |batch| {
                self.group_commit(batch)
            })
            .await
    }

    async fn commit_ledger_purchase(
        &self,
        purchase: &LedgerPurchase,
    ) -> Result<Commit, LedgerError> {
        let request = &purchase.request;
        let attempt = self
            .or_taken(
                "commit ledger purchase: find the record that won",
                &request.request_id,
                || self.tx_ledger_purchase(purchase),
            )
            .await?;
        match attempt {
            Ok(Attempt::Done(commit)) => Ok(commit),
            Ok(_) => Err(corrupt(format!(
                "commit ledger purchase: product {}: the ledger's hold id was recorded \
                 already",
                request.product_id
            ))),
            Err(record) => Ok(Commit::Duplicate(record)),
        }
    }

    async fn fence(
        &self,
        request: &PurchaseRequest,
        hold: HoldRef,
        reason: ReleaseReason,
    ) -> Result<Fence, LedgerError> {
        let attempt = self
            .or_taken(
                "fence: find the record that won",
                &request.request_id,
                || self.tx_fence(request, hold, reason),
            )
            .await?;
        match attempt {
            Ok(Attempt::Done(())) => Ok(Fence::Fenced),
            Ok(_) => {
                self.gate_behind(request.product_id, hold.generation)
                    .await?;
                Err(LedgerError::not_ready(format!(
                    "hold {} of generation {} was handed out twice",
                    hold.id, hold.generation
                )))
            }
            Err(record) => Ok(Fence::Duplicate(record)),
        }
    }

    async fn find_purchase(
        &self,
        request_id: &RequestId,
    ) -> Result<Option<PurchaseRecord>, LedgerError> {
        self.lookups
            .call(&self.ctx, request_id.clone(), |ids| {
                self.find_purchases(ids)
            })
            .await
    }

    async fn order(&self, order_id: OrderId) -> Result<Option<Order>, LedgerError> {
        Ok(self
            .lock()
            .orders
            .get(&order_id.get())
            .map(|r| r.order.clone()))
    }

    async fn pay(
        &self,
        order_id: OrderId,
        user_id: UserId,
    ) -> Result<Option<PayAttempt>, LedgerError> {
        let applied = self.tx_transition(order_id, user_id, OrderStatus::Paid, None)?;
        self.round_trip("pay: read order").await;
        let now = self.now();
        Ok(self
            .lock()
            .order_with_flags(order_id, user_id, now)
            .map(|(order, expired, _)| PayAttempt {
                order,
                applied,
                expired,
            }))
    }

    async fn cancel(
        &self,
        order_id: OrderId,
        user_id: UserId,
        reason: CancelReason,
    ) -> Result<Option<CancelAttempt>, LedgerError> {
        let applied =
            self.tx_transition(order_id, user_id, OrderStatus::Cancelled, Some(reason))?;
        self.round_trip("cancel: read order").await;
        let now = self.now();
        Ok(self.lock().order_with_flags(order_id, user_id, now).map(
            |(order, _, pending_return)| CancelAttempt {
                order,
                applied,
                pending_return,
            },
        ))
    }

    async fn mark_stock_returned(&self, request_id: &RequestId) -> Result<(), LedgerError> {
        let now = self.now();
        if let Some(r) = self.lock().reservations.get_mut(request_id.as_str()) {
            if r.status == ReservationStatus::Released && !r.stock_returned {
                r.stock_returned = true;
                r.updated_at = now;
            }
        }
        Ok(())
    }

    async fn record_restock(
        &self,
        action: &AdminAction,
        quantity: i64,
    ) -> Result<RecordRestock, LedgerError> {
        let (product_id, restock_id) = (action.product_id, &action.request_id);
        let mut guard = self.lock();
        let t = &mut *guard;
        let rid = restock_id.as_str();
        if let Some(r) = t.restocks.get(rid) {
            return Ok(
                if r.product_id == product_id.get() && r.quantity == quantity {
                    RecordRestock::Recorded {
                        applied: r.gate_applied,
                        generation: r.generation,
                    }
                } else {
                    RecordRestock::Conflict
                },
            );
        }
        let p = product_id.get();
        let Some(inv) = t
            .inventory
            .get(&p)
            .filter(|i| i.total + quantity <= STOCK_MAX)
            .cloned()
        else {
            return Ok(RecordRestock::TooLarge);
        };
        if t.log.contains(&(rid.to_owned(), "restock")) {
            return Err(self.anomaly(t, format!("duplicate inventory_log (restock) for {rid}")));
        }
        let generation = inv.generation;
        // In ledger mode nothing is owed to the gate (its way back is a rebuild).
        let applied = inv.mode == StockMode::Ledger;
        t.inventory.insert(
            p,
            InventoryRow {
                total: inv.total + quantity,
                available: inv.available + quantity,
                ..inv
            },
        );
        t.restocks.insert(
            rid.to_owned(),
            RestockRow {
                product_id: p,
                quantity,
                gate_applied: applied,
                generation,
            },
        );
        t.log.insert((rid.to_owned(), "restock"));
        Ok(RecordRestock::Recorded {
            applied,
            generation,
        })
    }

    async fn mark_restock_applied(&self, restock_id: &RequestId) -> Result<(), LedgerError> {
        if let Some(r) = self.lock().restocks.get_mut(restock_id.as_str()) {
            r.gate_applied = true;
        }
        Ok(())
    }

    async fn reservation_request_ids(
        &self,
        product_id: ProductId,
        max: usize,
    ) -> Result<Option<Vec<RequestId>>, LedgerError> {
        let t = self.lock();
        let ids: Vec<&String> = t
            .reservations
            .iter()
            .filter(|(_, r)| r.request.product_id == product_id)
            .map(|(rid, _)| rid)
            .take(max.saturating_add(1))
            .collect();
        if ids.len() > max {
            return Ok(None);
        }
        ids.into_iter()
            .map(|rid| {
                RequestId::parse("request_id", rid).map_err(|e| {
                    LedgerError::corrupt(format!("reservation holds a bad request_id: {e}"))
                })
            })
            .collect::<Result<_, _>>()
            .map(Some)
    }
}

#[async_trait]
impl LedgerMaintenance for MemLedger {
    async fn loaded_products(
        &self,
        after: Option<ProductId>,
        limit: usize,
    ) -> Result<Vec<ProductId>, LedgerError> {
        let from = after.map_or(0, ProductId::get);
        Ok(self
            .lock()
            .products
            .range(from.saturating_add(1)..)
            .map(|(_, p)| p)
            .filter(|p| p.stock_loaded)
            .map(|p| p.product_id)
            .take(limit)
            .collect())
    }

    async fn newest_products(&self, limit: usize) -> Result<Vec<ProductId>, LedgerError> {
        Ok(self
            .lock()
            .products
            .values()
            .rev()
            .filter(|p| p.stock_loaded)
            .map(|p| p.product_id)
            .take(limit)
            .collect())
    }

    async fn expired_orders(&self, limit: usize) -> Result<Vec<ExpiredOrder>, LedgerError> {
        let now = self.now();
        let t = self.lock();
        let mut due: Vec<(DateTime<Utc>, i64, UserId)> = t
            .orders
            .values()
            .filter(|r| r.order.status == OrderStatus::PendingPayment && r.order.expires_at <= now)
            .map(|r| (r.order.expires_at, r.order.order_id.get(), r.order.user_id))
            .collect();
        due.sort();
        due.into_iter()
            .take(limit)
            .map(|(_, id, user_id)| {
                Ok(ExpiredOrder {
                    order_id: OrderId::parse(id).map_err(corrupt)?,
                    user_id,
                })
            })
            .collect()
    }

    async fn expire(&self, order: &ExpiredOrder) -> Result<Option<CancelAttempt>, LedgerError> {
        let applied = self.tx_transition(
            order.order_id,
            order.user_id,
            OrderStatus::Cancelled,
            Some(CancelReason::PaymentTimeout),
        )?;
        self.round_trip("expire: read order").await;
        let now = self.now();
        Ok(self
            .lock()
            .order_with_flags(order.order_id, order.user_id, now)
            .map(|(order, _, pending_return)| CancelAttempt {
                order,
                applied,
                pending_return,
            }))
    }

    async fn pending_returns(&self, limit: usize) -> Result<Vec<PendingReturn>, LedgerError> {
        let t = self.lock();
        let mut rows: Vec<(DateTime<Utc>, i64, &String, &ReservationRow)> = t
            .reservations
            .iter()
            .filter(|(_, r)| r.status == ReservationStatus::Released && !r.stock_returned)
            .filter(|(_, r)| t.gate_serves(r.request.product_id.get()))
            // A gate not loaded has no entry to take units back; its load counts them.
            .filter(|(_, r)| {
                let p = r.request.product_id.get();
                t.products.get(&p).is_some_and(|p| p.stock_loaded)
            })
            .map(|(rid, r)| (r.updated_at, r.id, rid, r))
            .collect();
        rows.sort_by_key(|(at, id, _, _)| (*at, *id));
        Ok(rows
            .into_iter()
            .take(limit)
            .map(|(_, _, rid, r)| {
                // A reservation with an order was counted by the ledger; a fence was not.
                let of = if t.order_by_request.contains_key(rid) {
                    ReleaseOf::Reservation {
                        generation: r.released_generation.unwrap_or(Generation::FIRST),
                        hold: r.hold,
                        user_id: r.request.user_id,
                        quantity: r.request.quantity,
                        limited: t
                            .products
                            .get(&r.request.product_id.get())
                            .is_some_and(|p| p.per_user_limit.is_some()),
                        returns_units: true,
                    }
                } else {
                    ReleaseOf::Hold { hold: r.hold }
                };
                PendingReturn {
                    product_id: r.request.product_id,
                    request_id: r.request.request_id.clone(),
                    of,
                }
            })
            .collect())
    }

    async fn pending_restocks(&self, limit: usize) -> Result<Vec<StockChange>, LedgerError> {
        let t = self.lock();
        t.restocks
            .iter()
            .filter(|(_, r)| !r.gate_applied && t.gate_serves(r.product_id))
            .take(limit)
            .map(|(id, r)| {
                Ok(StockChange {
                    product_id: ProductId::parse(r.product_id).map_err(corrupt)?,
                    id: RequestId::parse("request_id", id).map_err(corrupt)?,
                    quantity: r.quantity,
                    generation: r.generation,
                })
            })
            .collect()
    }

    async fn record_incident(&self, incident: &NewIncident) -> Result<(), LedgerError> {
        let now = self.now();
        let mut t = self.lock();
        let key = (
            incident.request_id.as_str().to_owned(),
            incident.kind.as_str().to_owned(),
        );
        // One row per (request, kind): a repeated incident reopens it, with its detail.
        let id = match t.incidents.get(&key) {
            Some(row) => row.id,
            None => {
                t.next_incident_id += 1;
                t.next_incident_id
            }
        };
        let created_at = t.incidents.get(&key).map_or(now, |row| row.created_at);
        let row = IncidentRow {
            id,
            product_id: incident.product_id.get(),
            detail: incident.detail.clone(),
            created_at,
            open: true,
            closed_at: None,
            closing: None,
        };
        t.incidents.insert(key, row);
        Ok(())
    }

    async fn resolve_incidents(&self, request_id: &RequestId) -> Result<(), LedgerError> {
        let now = self.now();
        let mut t = self.lock();
        for ((rid, _), row) in t.incidents.iter_mut() {
            if rid == request_id.as_str() {
                row.close(now);
            }
        }
        Ok(())
    }

    async fn incidents(&self, open_only: bool, limit: usize) -> Result<Vec<Incident>, LedgerError> {
        let t = self.lock();
        let mut rows: Vec<Incident> = t
            .incidents
            .iter()
            .filter(|(_, row)| row.open || !open_only)
            .map(|((rid, kind), row)| row.incident(rid, kind))
            .collect::<Result<_, _>>()?;
        rows.sort_by_key(|i| std::cmp::Reverse(i.id));
        rows.truncate(limit);
        Ok(rows)
    }

    async fn incident(&self, id: i64) -> Result<Option<Incident>, LedgerError> {
        let t = self.lock();
        t.incidents
            .iter()
            .find(|(_, row)| row.id == id)
            .map(|((rid, kind), row)| row.incident(rid, kind))
            .transpose()
    }

    async fn close_incident(
        &self,
        id: i64,
        closing: &IncidentClosing,
    ) -> Result<bool, LedgerError> {
        let now = self.now();
        let mut t = self.lock();
        let Some(row) = t.incidents.values_mut().find(|row| row.id == id) else {
            return Ok(false);
        };
        if row.closing.is_some() {
            return Ok(false);
        }
        row.close(now);
        row.closing = Some(closing.clone());
        Ok(true)
    }

    async fn open_incidents(&self) -> Result<i64, LedgerError> {
        let t = self.lock();
        Ok(t.incidents.values().filter(|row| row.open).count() as i64)
    }

    async fn record_audit(
        &self,
        verdict: &flashsale_app::ports::AuditVerdict,
    ) -> Result<(), LedgerError> {
        let recorded_at = self.now();
        let mut t = self.lock();
        if t.audits.len() >= AUDIT_RUNS_KEPT {
            t.audits.pop_front();
        }
        t.audits.push_back(flashsale_app::ports::AuditRun {
            verdict: verdict.clone(),
            recorded_at,
        });
        Ok(())
    }

    async fn last_audit(&self) -> Result<Option<flashsale_app::ports::AuditRun>, LedgerError> {
        Ok(self.lock().audits.back().cloned())
    }

    async fn ended_sales(
        &self,
        settled_for: Duration,
        limit: usize,
    ) -> Result<Vec<ProductId>, LedgerError> {
        let before = self.now() - delta(settled_for);
        let t = self.lock();
        let done = |id: i64| t.audit_claims.get(&(SALE_END, id)).is_some_and(|c| c.done);
        Ok(t.products
            .values()
            .filter(|p| p.stock_loaded && p.window.ends_at.is_some_and(|end| end <= before))
            .map(|p| p.product_id)
            .filter(|id| !done(id.get()))
            .take(limit)
            .collect())
    }

    async fn claim_audit(
        &self,
        which: &AuditSchedule,
        holder: &str,
        lease: Duration,
    ) -> Result<Option<AuditClaim>, LedgerError> {
        let now = self.now();
        let (kind, scope) = match which {
            AuditSchedule::SaleEnd(product_id) => (SALE_END, product_id.get()),
            AuditSchedule::Every(every) => {
                let seconds = i64::try_from(every.as_secs().max(1)).unwrap_or(i64::MAX);
                (EVERY, now.timestamp().div_euclid(seconds))
            }
        };
        let mut t = self.lock();
        let claimed = match t.audit_claims.get_mut(&(kind, scope)) {
            None => true,
            Some(c) if !c.done && c.claimed_at < now - delta(lease) => true,
            Some(_) => false,
        };
        if claimed {
            let row = AuditClaimRow {
                holder: holder.to_owned(),
                claimed_at: now,
                done: false,
            };
            t.audit_claims.insert((kind, scope), row);
        }
        Ok(claimed.then(|| AuditClaim {
            kind,
            scope: scope.to_string(),
            holder: holder.to_owned(),
        }))
    }

    async fn finish_audit(&self, claim: &AuditClaim) -> Result<(), LedgerError> {
        let scope: i64 = claim
            .scope
            .parse()
            .map_err(|_| LedgerError::corrupt(format!("audit claim scope {:?}", claim.scope)))?;
        let kind = if claim.kind == SALE_END {
            SALE_END
        } else {
            EVERY
        };
        let mut t = self.lock();
        if let Some(c) = t.audit_claims.get_mut(&(kind, scope)) {
            if c.holder == claim.holder {
                c.done = true;
            }
        }
        Ok(())
    }

    /// The repair and its `stock_repaired` event, in one step as in one transaction.
    async fn record_repair(&self, repair: &StockRepair) -> Result<(), LedgerError> {
        let now = self.now();
        let mut t = self.lock();
        t.repairs.push(repair.clone());
        let number = t.repairs.len();
        t.write_repair_event(repair, number, now);
        Ok(())
    }

    async fn audit_violations_within(&self, window: Duration) -> Result<i64, LedgerError> {
        let since = self.now() - delta(window);
        let t = self.lock();
        let found = t
            .audits
            .iter()
            .filter(|a| a.recorded_at >= since)
            .map(|a| a.verdict.violations)
            .sum::<usize>();
        Ok(i64::try_from(found).unwrap_or(i64::MAX))
    }

    /// The counters, the order units, then the rest: separate statements, each seeing
    /// what is committed when it runs.
    async fn facts(&self, product_id: ProductId) -> Result<Option<LedgerFacts>, LedgerError> {
        let p = product_id.get();
        // The counters and the units in one step, as the adapter reads them in one
        // statement.
        let now = self.now();
        let (counters, (pending, paid, overdue)) = {
            let t = self.lock();
            let Some(counters) = counters_of(&t, p) else {
                return Ok(None);
            };
            ((counters, t.mode_of(p)), units_of(&t, p, now))
        };
        self.round_trip("facts: reservations").await;
        let t = self.lock();
        Ok(Some(rest_of(&t, p, counters, pending, paid, overdue)))
    }

    async fn watermark(&self, product_id: ProductId) -> Result<Option<Watermark>, LedgerError> {
        let t = self.lock();
        let p = product_id.get();
        let Some(inv) = t.inventory.get(&p) else {
            return Ok(None);
        };
        let last_hold_id = t
            .reservations
            .values()
            .filter(|r| r.request.product_id.get() == p && r.hold.generation == inv.generation)
            .map(|r| r.hold.id.get())
            .max()
            .unwrap_or(0);
        Ok(Some(Watermark {
            generation: inv.generation,
            last_hold_id,
            stock_loaded: t.products.get(&p).is_some_and(|x| x.stock_loaded),
            mode: inv.mode,
        }))
    }

    async fn advance_generation(
        &self,
        product_id: ProductId,
    ) -> Result<Option<RebuildPlan>, LedgerError> {
        let now = self.now();
        let mut t = self.lock();
        // Not loaded (never, or retired): no entry by design, its next load makes one.
        let loaded = t
            .products
            .get(&product_id.get())
            .is_some_and(|p| p.stock_loaded);
        if t.mode_of(product_id.get()) == StockMode::Ledger || !loaded {
            return Ok(None);
        }
        advance_locked(&mut t, product_id, now, false).map(Some)
    }

    async fn enter_ledger_mode(&self, product_id: ProductId) -> Result<ModeSwitch, LedgerError> {
        let now = self.now();
        let mut t = self.lock();
        let p = product_id.get();
        let Some(inv) = t.inventory.get_mut(&p) else {
            return Err(no_inventory(product_id));
        };
        inv.gate_unreachable_at = Some(now);
        if inv.mode == StockMode::Ledger {
            return Ok(ModeSwitch::AlreadyLedger {
                generation: inv.generation,
            });
        }
        if !self.defects.enter_keeps_generation {
            inv.generation = inv.generation.next();
        }
        inv.mode = StockMode::Ledger;
        inv.ledger_hold_seq = 0;
        inv.mode_changed_at = Some(now);
        let generation = inv.generation;
        settle_owed(&mut t, p, now);
        if let Some(product) = t.products.get_mut(&p) {
            product.stock_loaded = true;
        }
        self.ctx.lock().stats.to_ledger += 1;
        Ok(ModeSwitch::Entered { generation })
    }

    async fn leave_ledger_mode(
        &self,
        product_id: ProductId,
        quiet: Duration,
    ) -> Result<Leave, LedgerError> {
        let now = self.now();
        let mut t = self.lock();
        let quiet = TimeDelta::from_std(quiet).unwrap_or(TimeDelta::MAX);
        match t.inventory.get(&product_id.get()) {
            None => Err(no_inventory(product_id)),
            Some(inv) if inv.mode == StockMode::Gate => Ok(Leave::NotLedger),
            Some(inv) if inv.gate_unreachable_at.is_some_and(|at| at > now - quiet) => {
                Ok(Leave::TooSoon)
            }
            Some(_) => {
                let plan = advance_locked(&mut t, product_id, now, true)?;
                self.ctx.lock().stats.to_gate += 1;
                Ok(Leave::Left(plan))
            }
        }
    }

    async fn ledger_mode_products(&self, limit: usize) -> Result<Vec<ProductId>, LedgerError> {
        let t = self.lock();
        t.inventory
            .iter()
            .filter(|(_, inv)| inv.mode == StockMode::Ledger)
            .take(limit)
            .map(|(p, _)| ProductId::parse(*p).map_err(corrupt))
            .collect()
    }
}

/// `settle_owed` in `MysqlLedger`: releases not yet returned to the gate and restocks
/// not yet applied to it count as done (the counters have their units), and the
/// product's open incidents are closed (about holds of the replaced gate state).
fn settle_owed(t: &mut Tables, p: i64, now: DateTime<Utc>) {
    for i in t.incidents.values_mut() {
        if i.product_id == p {
            i.close(now);
        }
    }
    for r in t.reservations.values_mut() {
        if r.request.product_id.get() == p
            && r.status == ReservationStatus::Released
            && !r.stock_returned
        {
            r.stock_returned = true;
            r.updated_at = now;
        }
    }
    for r in t.restocks.values_mut() {
        if r.product_id == p {
            r.gate_applied = true;
        }
    }
}

fn no_inventory(product_id: ProductId) -> LedgerError {
    LedgerError::corrupt(format!("product {product_id} has no inventory"))
}

/// `advance_locked` in `MysqlLedger`: the next generation (the ledger's hold ids restart
/// with it; with `to_gate`, back in gate mode), releases not yet returned and restocks
/// not yet applied settled, and the plan from the facts.
fn advance_locked(
    t: &mut Tables,
    product_id: ProductId,
    now: DateTime<Utc>,
    to_gate: bool,
) -> Result<RebuildPlan, LedgerError> {
    let p = product_id.get();
    let Some(inv) = t.inventory.get_mut(&p) else {
        return Err(no_inventory(product_id));
    };
    inv.generation = inv.generation.next();
    inv.ledger_hold_seq = 0;
    if to_gate {
        inv.mode = StockMode::Gate;
        inv.mode_changed_at = Some(now);
    }
    let generation = inv.generation;
    let available = inv.available;
    settle_owed(t, p, now);
    let mut user_units = Vec::new();
    if t.products
        .get(&p)
        .is_some_and(|x| x.per_user_limit.is_some())
    {
        let mut by_user: BTreeMap<UserId, i64> = BTreeMap::new();
        for row in t.orders.values() {
            let o = &row.order;
            if o.product_id.get() == p && o.status.holds_stock() {
                *by_user.entry(o.user_id).or_insert(0) += i64::from(o.quantity.get());
            }
        }
        user_units = by_user.into_iter().collect();
    }
    let last_hold_id = t
        .reservations
        .values()
        .filter(|r| r.request.product_id.get() == p)
        .map(|r| r.hold.id.get())
        .max()
        .unwrap_or(0);
    Ok(RebuildPlan {
        generation,
        available,
        last_hold_id,
        user_units,
    })
}

#[async_trait]
impl Outbox for MemLedger {
    /// The leasing UPDATE, then (a separate statement) the read of what this relay holds.
    async fn claim(
        &self,
        relay: &str,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<OutboxMessage>, LedgerError> {
        let now = self.now();
        let until = now + TimeDelta::from_std(lease).unwrap_or(TimeDelta::MAX);
        {
            let mut t = self.lock();
            for row in t
                .outbox
                .values_mut()
                .filter(|r| r.unsent() && r.claimed_until.is_none_or(|u| u < now))
                .take(limit)
            {
                row.claimed_by = Some(relay.to_owned());
                row.claimed_until = Some(until);
            }
        }
        self.round_trip("claim: read claimed rows").await;
        let t = self.lock();
        let mut mine: Vec<&OutboxRow> = t
            .outbox
            .values()
            .filter(|r| r.unsent() && r.claimed_by.as_deref() == Some(relay))
            .collect();
        mine.sort_by(|a, b| (&a.request_id, a.sequence).cmp(&(&b.request_id, b.sequence)));
        Ok(mine
            .into_iter()
            .take(limit)
            .map(|c| OutboxMessage {
                id: c.id,
                event_id: c.event_id.clone(),
                event_type: c.event_type,
                request_id: c.request_id.clone(),
                sequence: u32::try_from(c.sequence).unwrap_or(0),
                payload: c.payload.clone(),
                attempts: c.attempts,
                refusals: c.refusals,
                blocked: t.outbox.values().any(|e| {
                    e.request_id == c.request_id
                        && e.sequence < c.sequence
                        && e.unsent()
                        && e.claimed_by != c.claimed_by
                }),
            })
            .collect())
    }

    async fn mark_sent(&self, ids: &[i64]) -> Result<(), LedgerError> {
        let mut t = self.lock();
        for id in ids {
            if let Some(row) = t.outbox.get_mut(id).filter(|r| r.unsent()) {
                row.sent = true;
                row.claimed_by = None;
                row.claimed_until = None;
            }
        }
        Ok(())
    }

    async fn give_back(&self, relay: &str, failed: &[PublishFailure]) -> Result<(), LedgerError> {
        let mut t = self.lock();
        for f in failed {
            if let Some(row) = t.outbox.get_mut(&f.id).filter(|r| r.unsent()) {
                row.attempts += 1;
                row.refusals = if f.refused { row.refusals + 1 } else { 0 };
            }
        }
        for row in t
            .outbox
            .values_mut()
            .filter(|r| r.unsent() && r.claimed_by.as_deref() == Some(relay))
        {
            row.claimed_by = None;
            row.claimed_until = None;
        }
        Ok(())
    }

    async fn let_go(&self, relay: &str) -> Result<(), LedgerError> {
        let mut t = self.lock();
        for row in t
            .outbox
            .values_mut()
            .filter(|r| r.unsent() && r.claimed_by.as_deref() == Some(relay))
        {
            row.claimed_by = None;
            row.claimed_until = None;
        }
        Ok(())
    }

    /// The move of each unsent row's mark to the parked rows, one transaction a row.
    async fn park(&self, rows: &[(i64, String)]) -> Result<(), LedgerError> {
        let now = self.now();
        let mut t = self.lock();
        for (id, reason) in rows {
            if let Some(row) = t.outbox.get_mut(id).filter(|r| r.unsent()) {
                row.attempts += 1;
                row.claimed_by = None;
                row.claimed_until = None;
                row.parked = Some((reason.clone(), now));
            }
        }
        Ok(())
    }

    async fn parked(&self, limit: usize) -> Result<Vec<ParkedRow>, LedgerError> {
        let t = self.lock();
        Ok(t.outbox
            .values()
            .filter_map(|r| {
                let (reason, at) = r.parked.as_ref()?;
                Some(ParkedRow {
                    id: r.id,
                    event_type: r.event_type,
                    product_id: r.product_id,
                    request_id: Some(r.request_id.clone()),
                    events: 1,
                    attempts: r.attempts,
                    reason: reason.clone(),
                    parked_at: *at,
                })
            })
            .take(limit)
            .collect())
    }

    async fn parked_events(&self) -> Result<u64, LedgerError> {
        let n = self
            .lock()
            .outbox
            .values()
            .filter(|r| r.parked.is_some())
            .count();
        Ok(u64::try_from(n).unwrap_or(u64::MAX))
    }

    async fn unpark(&self, ids: &[i64]) -> Result<usize, LedgerError> {
        let mut t = self.lock();
        let mut unparked = 0;
        for id in ids {
            if let Some(row) = t.outbox.get_mut(id).filter(|r| r.parked.is_some()) {
                row.parked = None;
                row.attempts = 0;
                row.refusals = 0;
                unparked += 1;
            }
        }
        Ok(unparked)
    }

    async fn unsent(&self) -> Result<u64, LedgerError> {
        let n = self.lock().outbox.values().filter(|r| r.unsent()).count();
        Ok(u64::try_from(n).unwrap_or(u64::MAX))
    }
}

#[async_trait]
impl StatsStore for MemLedger {
    /// The consumed event id and the counters, in one transaction.
    async fn apply_once(&self, event: &StatsEvent) -> Result<Applied, LedgerError> {
        let mut t = self.lock();
        if !t.consumed.insert(event.event_id.clone()) {
            return Ok(Applied::AlreadyApplied);
        }
        let s = t.sales_stats.entry(event.product_id.get()).or_default();
        *s += &event.delta;
        Ok(Applied::Applied)
    }
}
