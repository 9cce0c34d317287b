//! Fault injection around the in-memory ports. Every call of a use case or worker to a
//! store goes through [`through`]:
//!
//! 1. a yield point: the scheduler may run anything else first, or abandon the caller
//!    here (its process died before the effect);
//! 2. the seeded fault decision: fail (error, nothing applied), lose the reply (applied,
//!    the caller gets an error: outcome unknown), run it twice and hand back one of the
//!    replies (what a lost reply followed by the caller's immediate retry looks like from
//!    the store: every port method must be idempotent for exactly this), or nothing;
//! 3. the effect itself (atomic, like a Lua script or a transaction);
//! 4. another yield point: the caller may be abandoned right after the effect, before it
//!    acts on the reply.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use flashsale_app::ports::{
    Applied, AuditClaim, AuditSchedule, CancelAttempt, Commit, CreateProduct, ErrorKind,
    ExpiredOrder, Fence, GateCount, GateFacts, GateMaintenance, GateState, Incident,
    IncidentClosing, Leave, LedgerFacts, LedgerMaintenance, ModeSwitch, Outbox, PayAttempt,
    PendingRestock, PendingReturn, PortError, RebuildPlan, RecordRestock, Release, ReleaseOf,
    Reserve, Restock, StaleHold, StatsStore, StockRepair, Watermark,
};
use flashsale_app::{
    EventType, GateError, Ledger, LedgerError, Order, OutboxMessage, Product, PurchaseRecord,
    StatsDelta, StockGate,
};
use flashsale_core::{
    CancelReason, Generation, HoldRef, InventoryCounters, NewProduct, OrderId, ProductId,
    PurchaseRequest, ReleaseReason, RequestId, UserId,
};

use flashsale_app::ports::{ParkedRow, PublishFailure};

use crate::ctx::{Ctx, Fault, Point, Port};
use crate::gate::MemGate;
use crate::ledger::MemLedger;

pub(crate) async fn through<T, E, F, Fut>(
    ctx: &Ctx,
    port: Port,
    what: &'static str,
    args: impl FnOnce() -> String,
    op: F,
) -> Result<T, E>
where
    T: Debug,
    E: PortError,
    F: Fn() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    ctx.maybe_kill(what);
    Point::new().await;
    let fault = ctx.fault(port);
    let args = if ctx.lock().trace.on {
        args()
    } else {
        String::new()
    };
    if fault == Fault::Fail {
        ctx.trace(|| format!("{what}({args}) FAILED (injected, not applied)"));
        return Err(E::new(
            ErrorKind::Unreachable,
            format!("{what}: unreachable (injected)"),
        ));
    }
    let mut reply = op().await;
    if let Fault::Duplicate { second } = fault {
        let again = op().await;
        ctx.trace(|| format!("{what}({args}) DUPLICATED: first {reply:?}, second {again:?}"));
        if second {
            reply = again;
        }
    }
    ctx.trace(|| format!("{what}({args}) -> {reply:?}"));
    if fault == Fault::LoseReply {
        ctx.trace(|| format!("{what}: REPLY LOST (injected, applied)"));
        return Err(E::new(
            ErrorKind::TimedOut,
            format!("{what}: no answer in time (injected)"),
        ));
    }
    ctx.maybe_kill(what);
    Point::new().await;
    reply
}

fn req(r: &PurchaseRequest) -> String {
    format!(
        "{} u{} p{} q{}",
        r.request_id, r.user_id, r.product_id, r.quantity
    )
}

/// The gate as the service sees it: [`MemGate`] behind the fault injector.
pub struct FaultyGate {
    pub inner: Arc<MemGate>,
    pub ctx: Arc<Ctx>,
}

#[async_trait]
impl StockGate for FaultyGate {
    fn committed(&self, product_id: ProductId, hold: StaleHold) {
        self.inner.committed(product_id, hold);
    }

    async fn ping(&self) -> Result<(), GateError> {
        through(&self.ctx, Port::Gate, "gate.ping", String::new, || {
            self.inner.ping()
        })
        .await
    }

    async fn load(
        &self,
        product_id: ProductId,
        available: i64,
        generation: Generation,
    ) -> Result<bool, GateError> {
        through(
            &self.ctx,
            Port::Gate,
            "gate.load",
            || format!("p{product_id} {available} gen {generation}"),
            || self.inner.load(product_id, available, generation),
        )
        .await
    }

    async fn reserve(
        &self,
        request: &PurchaseRequest,
        per_user_limit: Option<u32>,
    ) -> Result<Reserve, GateError> {
        through(
            &self.ctx,
            Port::Gate,
            "gate.reserve",
            || req(request),
            || self.inner.reserve(request, per_user_limit),
        )
        .await
    }

    async fn release(
        &self,
        product_id: ProductId,
        request_id: &RequestId,
        of: &ReleaseOf,
    ) -> Result<Release, GateError> {
        through(
            &self.ctx,
            Port::Gate,
            "gate.release",
            || format!("p{product_id} {request_id} {of:?}"),
            || self.inner.release(product_id, request_id, of),
        )
        .await
    }

    async fn restock(
        &self,
        product_id: ProductId,
        restock_id: &RequestId,
        quantity: i64,
        generation: Generation,
    ) -> Result<Restock, GateError> {
        through(
            &self.ctx,
            Port::Gate,
            "gate.restock",
            || format!("p{product_id} {restock_id} +{quantity} gen {generation}"),
            || {
                self.inner
                    .restock(product_id, restock_id, quantity, generation)
            },
        )
        .await
    }

    async fn available(&self, product_id: ProductId) -> Result<Option<i64>, GateError> {
        through(
            &self.ctx,
            Port::Gate,
            "gate.available",
            || format!("p{product_id}"),
            || self.inner.available(product_id),
        )
        .await
    }

    async fn pending_request_ids(
        &self,
        product_id: ProductId,
        max: usize,
    ) -> Result<Option<(Generation, Vec<RequestId>)>, GateError> {
        through(
            &self.ctx,
            Port::Gate,
            "gate.pending_request_ids",
            || format!("p{product_id}"),
            || self.inner.pending_request_ids(product_id, max),
        )
        .await
    }
}

#[async_trait]
impl GateMaintenance for FaultyGate {
    async fn stale_holds(
        &self,
        product_id: ProductId,
        older_than: Duration,
        limit: usize,
    ) -> Result<Vec<StaleHold>, GateError> {
        through(
            &self.ctx,
            Port::Gate,
            "gate.stale_holds",
            || format!("p{product_id} older than {older_than:?} limit {limit}"),
            || self.inner.stale_holds(product_id, older_than, limit),
        )
        .await
    }

    async fn forget_pending(
        &self,
        product_id: ProductId,
        holds: &[StaleHold],
    ) -> Result<(), GateError> {
        through(
            &self.ctx,
            Port::Gate,
            "gate.forget_pending",
            || {
                let ids: Vec<String> = holds
                    .iter()
                    .map(|h| {
                        format!(
                            "{}@{}/{}",
                            h.request.request_id, h.hold.generation, h.hold.id
                        )
                    })
                    .collect();
                format!("p{product_id} {ids:?}")
            },
            || self.inner.forget_pending(product_id, holds),
        )
        .await
    }

    async fn facts(&self, product_id: ProductId) -> Result<GateFacts, GateError> {
        through(
            &self.ctx,
            Port::Gate,
            "gate.facts",
            || format!("p{product_id}"),
            || self.inner.facts(product_id),
        )
        .await
    }

    async fn adjust(
        &self,
        product_id: ProductId,
        from: &GateCount,
        delta: i64,
    ) -> Result<bool, GateError> {
        through(
            &self.ctx,
            Port::Gate,
            "gate.adjust",
            || format!("p{product_id} {from:?} {delta:+}"),
            || self.inner.adjust(product_id, from, delta),
        )
        .await
    }

    async fn state(&self, product_id: ProductId) -> Result<Option<GateState>, GateError> {
        through(
            &self.ctx,
            Port::Gate,
            "gate.state",
            || format!("p{product_id}"),
            || self.inner.state(product_id),
        )
        .await
    }

    async fn retire(&self, product_id: ProductId) -> Result<bool, GateError> {
        through(
            &self.ctx,
            Port::Gate,
            "gate.retire",
            || format!("p{product_id}"),
            || self.inner.retire(product_id),
        )
        .await
    }

    async fn adopt(&self, product_id: ProductId) -> Result<bool, GateError> {
        through(
            &self.ctx,
            Port::Gate,
            "gate.adopt",
            || format!("p{product_id}"),
            || self.inner.adopt(product_id),
        )
        .await
    }

    async fn rebuild(&self, product_id: ProductId, plan: &RebuildPlan) -> Result<bool, GateError> {
        through(
            &self.ctx,
            Port::Gate,
            "gate.rebuild",
            || format!("p{product_id} {plan:?}"),
            || self.inner.rebuild(product_id, plan),
        )
        .await
    }
}

/// The ledger as the service sees it: [`MemLedger`] behind the fault injector.
pub struct FaultyLedger {
    pub inner: Arc<MemLedger>,
    pub ctx: Arc<Ctx>,
}

#[async_trait]
impl Ledger for FaultyLedger {
    async fn ping(&self) -> Result<(), LedgerError> {
        through(&self.ctx, Port::Ledger, "ledger.ping", String::new, || {
            self.inner.ping()
        })
        .await
    }

    async fn create_product(&self, product: &NewProduct) -> Result<CreateProduct, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.create_product",
            || format!("p{} stock {}", product.product_id, product.stock),
            || self.inner.create_product(product),
        )
        .await
    }

    async fn product(&self, product_id: ProductId) -> Result<Option<Product>, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.product",
            || format!("p{product_id}"),
            || self.inner.product(product_id),
        )
        .await
    }

    async fn mark_stock_loaded(&self, product_id: ProductId) -> Result<(), LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.mark_stock_loaded",
            || format!("p{product_id}"),
            || self.inner.mark_stock_loaded(product_id),
        )
        .await
    }

    async fn generation(&self, product_id: ProductId) -> Result<Option<Generation>, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.generation",
            || format!("p{product_id}"),
            || self.inner.generation(product_id),
        )
        .await
    }

    async fn inventory(
        &self,
        product_id: ProductId,
    ) -> Result<Option<InventoryCounters>, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.inventory",
            || format!("p{product_id}"),
            || self.inner.inventory(product_id),
        )
        .await
    }

    async fn commit_purchase(
        &self,
        request: &PurchaseRequest,
        hold: HoldRef,
        per_user_limit: Option<u32>,
        payment_timeout: Duration,
    ) -> Result<Commit, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.commit_purchase",
            || format!("{} hold {} gen {}", req(request), hold.id, hold.generation),
            || {
                self.inner
                    .commit_purchase(request, hold, per_user_limit, payment_timeout)
            },
        )
        .await
    }

    async fn commit_ledger_purchase(
        &self,
        request: &PurchaseRequest,
        per_user_limit: Option<u32>,
        payment_timeout: Duration,
    ) -> Result<Commit, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.commit_ledger_purchase",
            || req(request),
            || {
                self.inner
                    .commit_ledger_purchase(request, per_user_limit, payment_timeout)
            },
        )
        .await
    }

    async fn fence(
        &self,
        request: &PurchaseRequest,
        hold: HoldRef,
        reason: ReleaseReason,
    ) -> Result<Fence, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.fence",
            || {
                format!(
                    "{} hold {} gen {} {reason}",
                    req(request),
                    hold.id,
                    hold.generation
                )
            },
            || self.inner.fence(request, hold, reason),
        )
        .await
    }

    async fn find_purchase(
        &self,
        request_id: &RequestId,
    ) -> Result<Option<PurchaseRecord>, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.find_purchase",
            || request_id.to_string(),
            || self.inner.find_purchase(request_id),
        )
        .await
    }

    async fn order(&self, order_id: OrderId) -> Result<Option<Order>, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.order",
            || format!("order {order_id}"),
            || self.inner.order(order_id),
        )
        .await
    }

    async fn pay(
        &self,
        order_id: OrderId,
        user_id: UserId,
    ) -> Result<Option<PayAttempt>, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.pay",
            || format!("order {order_id} u{user_id}"),
            || self.inner.pay(order_id, user_id),
        )
        .await
    }

    async fn cancel(
        &self,
        order_id: OrderId,
        user_id: UserId,
        reason: CancelReason,
    ) -> Result<Option<CancelAttempt>, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.cancel",
            || format!("order {order_id} u{user_id} {reason}"),
            || self.inner.cancel(order_id, user_id, reason),
        )
        .await
    }

    async fn mark_stock_returned(&self, request_id: &RequestId) -> Result<(), LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.mark_stock_returned",
            || request_id.to_string(),
            || self.inner.mark_stock_returned(request_id),
        )
        .await
    }

    async fn record_restock(
        &self,
        product_id: ProductId,
        restock_id: &RequestId,
        quantity: i64,
    ) -> Result<RecordRestock, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.record_restock",
            || format!("p{product_id} {restock_id} +{quantity}"),
            || self.inner.record_restock(product_id, restock_id, quantity),
        )
        .await
    }

    async fn mark_restock_applied(&self, restock_id: &RequestId) -> Result<(), LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.mark_restock_applied",
            || restock_id.to_string(),
            || self.inner.mark_restock_applied(restock_id),
        )
        .await
    }

    async fn reservation_request_ids(
        &self,
        product_id: ProductId,
        max: usize,
    ) -> Result<Option<Vec<RequestId>>, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.reservation_request_ids",
            || format!("p{product_id}"),
            || self.inner.reservation_request_ids(product_id, max),
        )
        .await
    }
}

#[async_trait]
impl LedgerMaintenance for FaultyLedger {
    async fn loaded_products(
        &self,
        after: Option<ProductId>,
        limit: usize,
    ) -> Result<Vec<ProductId>, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.loaded_products",
            String::new,
            || self.inner.loaded_products(after, limit),
        )
        .await
    }

    async fn newest_products(&self, limit: usize) -> Result<Vec<ProductId>, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.newest_products",
            String::new,
            || self.inner.newest_products(limit),
        )
        .await
    }

    async fn expired_orders(&self, limit: usize) -> Result<Vec<ExpiredOrder>, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.expired_orders",
            || format!("limit {limit}"),
            || self.inner.expired_orders(limit),
        )
        .await
    }

    async fn expire(&self, order: &ExpiredOrder) -> Result<Option<CancelAttempt>, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.expire",
            || format!("order {}", order.order_id),
            || self.inner.expire(order),
        )
        .await
    }

    async fn pending_returns(&self, limit: usize) -> Result<Vec<PendingReturn>, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.pending_returns",
            || format!("limit {limit}"),
            || self.inner.pending_returns(limit),
        )
        .await
    }

    async fn pending_restocks(&self, limit: usize) -> Result<Vec<PendingRestock>, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.pending_restocks",
            || format!("limit {limit}"),
            || self.inner.pending_restocks(limit),
        )
        .await
    }

    async fn record_incident(
        &self,
        request_id: &RequestId,
        product_id: ProductId,
        kind: &str,
        detail: &str,
    ) -> Result<(), LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.record_incident",
            || format!("{request_id} p{product_id} {kind}: {detail}"),
            || {
                self.inner
                    .record_incident(request_id, product_id, kind, detail)
            },
        )
        .await
    }

    async fn resolve_incidents(&self, request_id: &RequestId) -> Result<(), LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.resolve_incidents",
            || request_id.to_string(),
            || self.inner.resolve_incidents(request_id),
        )
        .await
    }

    async fn open_incidents(&self) -> Result<i64, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.open_incidents",
            String::new,
            || self.inner.open_incidents(),
        )
        .await
    }

    async fn record_audit(
        &self,
        verdict: &flashsale_app::ports::AuditVerdict,
    ) -> Result<(), LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.record_audit",
            || format!("{verdict:?}"),
            || self.inner.record_audit(verdict),
        )
        .await
    }

    async fn last_audit(&self) -> Result<Option<flashsale_app::ports::AuditRun>, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.last_audit",
            String::new,
            || self.inner.last_audit(),
        )
        .await
    }

    async fn incidents(&self, open_only: bool, limit: usize) -> Result<Vec<Incident>, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.incidents",
            || format!("{open_only} {limit}"),
            || self.inner.incidents(open_only, limit),
        )
        .await
    }

    async fn incident(&self, id: i64) -> Result<Option<Incident>, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.incident",
            || id.to_string(),
            || self.inner.incident(id),
        )
        .await
    }

    async fn close_incident(
        &self,
        id: i64,
        closing: &IncidentClosing,
    ) -> Result<bool, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.close_incident",
            || format!("{id} {closing:?}"),
            || self.inner.close_incident(id, closing),
        )
        .await
    }

    async fn ended_sales(
        &self,
        settled_for: Duration,
        limit: usize,
    ) -> Result<Vec<ProductId>, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.ended_sales",
            || format!("{settled_for:?} {limit}"),
            || self.inner.ended_sales(settled_for, limit),
        )
        .await
    }

    async fn claim_audit(
        &self,
        which: &AuditSchedule,
        holder: &str,
        lease: Duration,
    ) -> Result<Option<AuditClaim>, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.claim_audit",
            || format!("{which:?} {holder}"),
            || self.inner.claim_audit(which, holder, lease),
        )
        .await
    }

    async fn finish_audit(&self, claim: &AuditClaim) -> Result<(), LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.finish_audit",
            || format!("{claim:?}"),
            || self.inner.finish_audit(claim),
        )
        .await
    }

    async fn record_repair(&self, repair: &StockRepair) -> Result<(), LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.record_repair",
            || format!("{repair:?}"),
            || self.inner.record_repair(repair),
        )
        .await
    }

    async fn audit_violations_within(&self, window: Duration) -> Result<i64, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.audit_violations_within",
            || format!("{window:?}"),
            || self.inner.audit_violations_within(window),
        )
        .await
    }

    async fn facts(&self, product_id: ProductId) -> Result<Option<LedgerFacts>, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.facts",
            || format!("p{product_id}"),
            || self.inner.facts(product_id),
        )
        .await
    }

    async fn watermark(&self, product_id: ProductId) -> Result<Option<Watermark>, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.watermark",
            || format!("p{product_id}"),
            || self.inner.watermark(product_id),
        )
        .await
    }

    async fn advance_generation(
        &self,
        product_id: ProductId,
    ) -> Result<Option<RebuildPlan>, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.advance_generation",
            || format!("p{product_id}"),
            || self.inner.advance_generation(product_id),
        )
        .await
    }

    async fn enter_ledger_mode(&self, product_id: ProductId) -> Result<ModeSwitch, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.enter_ledger_mode",
            || format!("p{product_id}"),
            || self.inner.enter_ledger_mode(product_id),
        )
        .await
    }

    async fn leave_ledger_mode(
        &self,
        product_id: ProductId,
        quiet: Duration,
    ) -> Result<Leave, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.leave_ledger_mode",
            || format!("p{product_id}"),
            || self.inner.leave_ledger_mode(product_id, quiet),
        )
        .await
    }

    async fn ledger_mode_products(&self, limit: usize) -> Result<Vec<ProductId>, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "ledger.ledger_mode_products",
            String::new,
            || self.inner.ledger_mode_products(limit),
        )
        .await
    }
}

#[async_trait]
impl Outbox for FaultyLedger {
    async fn claim(
        &self,
        relay: &str,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<OutboxMessage>, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "outbox.claim",
            || format!("{relay} limit {limit}"),
            || self.inner.claim(relay, limit, lease),
        )
        .await
    }

    async fn mark_sent(&self, ids: &[i64]) -> Result<(), LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "outbox.mark_sent",
            || format!("{ids:?}"),
            || self.inner.mark_sent(ids),
        )
        .await
    }

    async fn give_back(&self, relay: &str, failed: &[PublishFailure]) -> Result<(), LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "outbox.give_back",
            || format!("{relay} {failed:?}"),
            || self.inner.give_back(relay, failed),
        )
        .await
    }

    async fn park(&self, rows: &[(i64, String)]) -> Result<(), LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "outbox.park",
            || format!("{rows:?}"),
            || self.inner.park(rows),
        )
        .await
    }

    async fn parked(&self, limit: usize) -> Result<Vec<ParkedRow>, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "outbox.parked",
            || format!("limit {limit}"),
            || self.inner.parked(limit),
        )
        .await
    }

    async fn parked_events(&self) -> Result<u64, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "outbox.parked_events",
            String::new,
            || self.inner.parked_events(),
        )
        .await
    }

    async fn unpark(&self, ids: &[i64]) -> Result<usize, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "outbox.unpark",
            || format!("{ids:?}"),
            || self.inner.unpark(ids),
        )
        .await
    }

    async fn let_go(&self, relay: &str) -> Result<(), LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "outbox.let_go",
            || relay.to_owned(),
            || self.inner.let_go(relay),
        )
        .await
    }

    async fn unsent(&self) -> Result<u64, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "outbox.unsent",
            String::new,
            || self.inner.unsent(),
        )
        .await
    }
}

#[async_trait]
impl StatsStore for FaultyLedger {
    async fn apply_once(
        &self,
        event_id: &str,
        event_type: EventType,
        product_id: ProductId,
        delta: &StatsDelta,
    ) -> Result<Applied, LedgerError> {
        through(
            &self.ctx,
            Port::Ledger,
            "stats.apply_once",
            || format!("{event_id} {event_type} p{product_id}"),
            || {
                self.inner
                    .apply_once(event_id, event_type, product_id, delta)
            },
        )
        .await
    }
}
