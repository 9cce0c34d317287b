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
//!
//! The wrappers are written by [`faulty!`] from one line per port method.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use flashsale_app::ports::{
    Applied, AuditClaim, AuditRun, AuditSchedule, AuditVerdict, CancelAttempt, Commit,
    CreateProduct, Destock, ErrorKind, ExpiredOrder, Fence, GateCount, GateFacts, GateMaintenance,
    GateState, HeldPurchase, Incident, IncidentClosing, Leave, LedgerFacts, LedgerMaintenance,
    LedgerPurchase, ModeSwitch, NewIncident, Outbox, ParkedRow, PayAttempt, PendingReturn,
    PortError, PublishFailure, RebuildPlan, RecordRestock, Release, ReleaseOf, Reserve, Restock,
    StaleHold, StatsEvent, StatsStore, StockChange, StockRepair, Watermark,
};
use flashsale_app::{
    AdminAction, GateError, Ledger, LedgerError, Order, OutboxMessage, Product, PurchaseRecord,
    StockGate,
};
use flashsale_core::{
    AdminName, CancelReason, Generation, HoldRef, InventoryCounters, NewProduct, OrderId,
    ProductId, PurchaseRequest, ReleaseReason, RequestId, UserId,
};

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

/// Implements a port trait for a wrapper of `inner` (with its `ctx`): each line
/// `fn name(arg: Type, …) -> T => shown;` becomes the trait's
/// `async fn name(&self, arg: Type, …) -> Result<T, Error>`, which passes the call to
/// `inner.name(arg, …)` through [`through`] on `port`, named `prefix.name` in the trace
/// and the kill points, its arguments shown by `shown` (built only while tracing). The
/// trait's other items (a plain method) come first, in a `plain { … }` block.
macro_rules! faulty {
    (
        impl $port_trait:ident for $wrapper:ty, $port:expr, $prefix:literal, $err:ty {
            $(plain { $($plain:item)* })?
            $(fn $name:ident($($arg:ident: $arg_ty:ty),* $(,)?) -> $ok:ty => $shown:expr;)*
        }
    ) => {
        #[async_trait]
        impl $port_trait for $wrapper {
            $($($plain)*)?
            $(
                async fn $name(&self, $($arg: $arg_ty),*) -> Result<$ok, $err> {
                    through(
                        &self.ctx,
                        $port,
                        concat!($prefix, ".", stringify!($name)),
                        || $shown,
                        || self.inner.$name($($arg),*),
                    )
                    .await
                }
            )*
        }
    };
}

fn req(r: &PurchaseRequest) -> String {
    format!(
        "{} u{} p{} q{}",
        r.request_id, r.user_id, r.product_id, r.quantity
    )
}

/// A hold's request and identity, as a trace line shows it.
fn hold_of(h: &StaleHold) -> String {
    format!(
        "{}@{}/{}",
        h.request.request_id, h.hold.generation, h.hold.id
    )
}

/// The gate as the service sees it: [`MemGate`] behind the fault injector.
pub struct FaultyGate {
    pub inner: Arc<MemGate>,
    pub ctx: Arc<Ctx>,
}

faulty! {
    impl StockGate for FaultyGate, Port::Gate, "gate", GateError {
        plain {
            fn committed(&self, product_id: ProductId, hold: StaleHold) {
                self.inner.committed(product_id, hold);
            }
        }
        fn ping() -> () => String::new();
        fn load(product_id: ProductId, available: i64, generation: Generation) -> bool
            => format!("p{product_id} {available} gen {generation}");
        fn reserve(request: &PurchaseRequest, per_user_limit: Option<u32>) -> Reserve
            => req(request);
        fn release(product_id: ProductId, request_id: &RequestId, of: &ReleaseOf) -> Release
            => format!("p{product_id} {request_id} {of:?}");
        fn restock(change: &StockChange) -> Restock => format!(
            "p{} {} +{} gen {}", change.product_id, change.id, change.quantity, change.generation
        );
        fn destock(change: &StockChange) -> Destock => format!(
            "p{} {} -{} gen {}", change.product_id, change.id, change.quantity, change.generation
        );
        fn available(product_id: ProductId) -> Option<i64> => format!("p{product_id}");
        fn pending_request_ids(product_id: ProductId, max: usize)
            -> Option<(Generation, Vec<RequestId>)> => format!("p{product_id}");
    }
}

faulty! {
    impl GateMaintenance for FaultyGate, Port::Gate, "gate", GateError {
        fn stale_holds(product_id: ProductId, older_than: Duration, limit: usize)
            -> Vec<StaleHold> => format!("p{product_id} older than {older_than:?} limit {limit}");
        fn forget_pending(product_id: ProductId, holds: &[StaleHold]) -> ()
            => format!("p{product_id} {:?}", holds.iter().map(hold_of).collect::<Vec<_>>());
        fn facts(product_id: ProductId) -> GateFacts => format!("p{product_id}");
        fn adjust(product_id: ProductId, from: &GateCount, delta: i64) -> bool
            => format!("p{product_id} {from:?} {delta:+}");
        fn state(product_id: ProductId) -> Option<GateState> => format!("p{product_id}");
        fn retire(product_id: ProductId) -> bool => format!("p{product_id}");
        fn adopt(product_id: ProductId) -> bool => format!("p{product_id}");
        fn rebuild(product_id: ProductId, plan: &RebuildPlan) -> bool
            => format!("p{product_id} {plan:?}");
    }
}

/// The ledger as the service sees it: [`MemLedger`] behind the fault injector.
pub struct FaultyLedger {
    pub inner: Arc<MemLedger>,
    pub ctx: Arc<Ctx>,
}

faulty! {
    impl Ledger for FaultyLedger, Port::Ledger, "ledger", LedgerError {
        fn ping() -> () => String::new();
        fn create_product(product: &NewProduct, by: &AdminName) -> CreateProduct
            => format!("p{} stock {}", product.product_id, product.stock);
        fn product(product_id: ProductId) -> Option<Product> => format!("p{product_id}");
        fn mark_stock_loaded(product_id: ProductId) -> () => format!("p{product_id}");
        fn generation(product_id: ProductId) -> Option<Generation> => format!("p{product_id}");
        fn inventory(product_id: ProductId) -> Option<InventoryCounters>
            => format!("p{product_id}");
        fn commit_purchase(purchase: &HeldPurchase) -> Commit => format!(
            "{} hold {} gen {}", req(&purchase.request), purchase.hold.id, purchase.hold.generation
        );
        fn commit_ledger_purchase(purchase: &LedgerPurchase) -> Commit
            => req(&purchase.request);
        fn fence(request: &PurchaseRequest, hold: HoldRef, reason: ReleaseReason) -> Fence
            => format!("{} hold {} gen {} {reason}", req(request), hold.id, hold.generation);
        fn find_purchase(request_id: &RequestId) -> Option<PurchaseRecord>
            => request_id.to_string();
        fn order(order_id: OrderId) -> Option<Order> => format!("order {order_id}");
        fn pay(order_id: OrderId, user_id: UserId) -> Option<PayAttempt>
            => format!("order {order_id} u{user_id}");
        fn cancel(order_id: OrderId, user_id: UserId, reason: CancelReason)
            -> Option<CancelAttempt> => format!("order {order_id} u{user_id} {reason}");
        fn mark_stock_returned(request_id: &RequestId) -> () => request_id.to_string();
        fn record_restock(action: &AdminAction, quantity: i64) -> RecordRestock
            => format!("p{} {} +{quantity}", action.product_id, action.request_id);
        fn mark_restock_applied(restock_id: &RequestId) -> () => restock_id.to_string();
        fn reservation_request_ids(product_id: ProductId, max: usize)
            -> Option<Vec<RequestId>> => format!("p{product_id}");
    }
}

faulty! {
    impl LedgerMaintenance for FaultyLedger, Port::Ledger, "ledger", LedgerError {
        fn loaded_products(after: Option<ProductId>, limit: usize) -> Vec<ProductId>
            => String::new();
        fn newest_products(limit: usize) -> Vec<ProductId> => String::new();
        fn expired_orders(limit: usize) -> Vec<ExpiredOrder> => format!("limit {limit}");
        fn expire(order: &ExpiredOrder) -> Option<CancelAttempt>
            => format!("order {}", order.order_id);
        fn pending_returns(limit: usize) -> Vec<PendingReturn> => format!("limit {limit}");
        fn pending_restocks(limit: usize) -> Vec<StockChange> => format!("limit {limit}");
        fn record_incident(incident: &NewIncident) -> () => format!(
            "{} p{} {}: {}",
            incident.request_id, incident.product_id, incident.kind.as_str(), incident.detail
        );
        fn resolve_incidents(request_id: &RequestId) -> () => request_id.to_string();
        fn open_incidents() -> i64 => String::new();
        fn record_audit(verdict: &AuditVerdict) -> () => format!("{verdict:?}");
        fn last_audit() -> Option<AuditRun> => String::new();
        fn incidents(open_only: bool, limit: usize) -> Vec<Incident>
            => format!("{open_only} {limit}");
        fn incident(id: i64) -> Option<Incident> => id.to_string();
        fn close_incident(id: i64, closing: &IncidentClosing) -> bool
            => format!("{id} {closing:?}");
        fn ended_sales(settled_for: Duration, limit: usize) -> Vec<ProductId>
            => format!("{settled_for:?} {limit}");
        fn claim_audit(which: &AuditSchedule, holder: &str, lease: Duration)
            -> Option<AuditClaim> => format!("{which:?} {holder}");
        fn finish_audit(claim: &AuditClaim) -> () => format!("{claim:?}");
        fn record_repair(repair: &StockRepair) -> () => format!("{repair:?}");
        fn audit_violations_within(window: Duration) -> i64 => format!("{window:?}");
        fn facts(product_id: ProductId) -> Option<LedgerFacts> => format!("p{product_id}");
        fn watermark(product_id: ProductId) -> Option<Watermark> => format!("p{product_id}");
        fn advance_generation(product_id: ProductId) -> Option<RebuildPlan>
            => format!("p{product_id}");
        fn enter_ledger_mode(product_id: ProductId) -> ModeSwitch => format!("p{product_id}");
        fn leave_ledger_mode(product_id: ProductId, quiet: Duration) -> Leave
            => format!("p{product_id}");
        fn ledger_mode_products(limit: usize) -> Vec<ProductId> => String::new();
    }
}

faulty! {
    impl Outbox for FaultyLedger, Port::Ledger, "outbox", LedgerError {
        fn claim(relay: &str, limit: usize, lease: Duration) -> Vec<OutboxMessage>
            => format!("{relay} limit {limit}");
        fn mark_sent(ids: &[i64]) -> () => format!("{ids:?}");
        fn give_back(relay: &str, failed: &[PublishFailure]) -> ()
            => format!("{relay} {failed:?}");
        fn park(rows: &[(i64, String)]) -> () => format!("{rows:?}");
        fn parked(limit: usize) -> Vec<ParkedRow> => format!("limit {limit}");
        fn parked_events() -> u64 => String::new();
        fn unpark(ids: &[i64]) -> usize => format!("{ids:?}");
        fn let_go(relay: &str) -> () => relay.to_owned();
        fn unsent() -> u64 => String::new();
    }
}

faulty! {
    impl StatsStore for FaultyLedger, Port::Ledger, "stats", LedgerError {
        fn apply_once(event: &StatsEvent) -> Applied
            => format!("{} {} p{}", event.event_id, event.event_type, event.product_id);
    }
}
