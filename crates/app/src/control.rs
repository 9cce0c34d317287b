//! The operator's controls of a running sale: pause, resume, changes to a product's
//! name, per-user limit and sale window, and refunds of paid orders.
//!
//! Each is the ledger's: the product's row changed in one transaction with the operator's
//! log entry (which admin, when, what was asked, before and after; its request_id makes
//! the action idempotent) and an event. Purchases read the product's definition
//! (`catalog.rs`): a paused product is refused with `sale_paused`, in gate mode and ledger
//! mode alike, and a changed limit or window applies to the purchases that read it; pay,
//! cancel and expiry look at neither, so orders already made are kept as they are.
//!
//! Every instance keeps the definition in memory, so the change is announced: after the
//! commit, this instance forgets its copy and publishes the product's id on the gate's
//! change channel, and every instance that hears it forgets its own ([`Hearing`]). An
//! instance refuses once the message reached it (milliseconds after the 200; measured
//! in the pause test). No copy is served past the catalog's `FOUND_TTL` (a second)
//! after the ledger state it shows, so one that missed the message (its subscription
//! down) reads the change within a second of the commit. When the announcement cannot
//! be published (Redis down), the action waits that second out before it answers, so
//! its 200 still means every instance refuses. A purchase that read the definition
//! before the change may still complete: it was decided before the pause was heard.

use std::sync::Arc;

use async_trait::async_trait;
use flashsale_core::{
    AdminName, OrderId, OrderStatus, ParseError, ProductChange, ProductId, RequestId,
};
use tracing::{info, warn};

use crate::catalog::{Catalog, FOUND_TTL};
use crate::error::Error;
use crate::metrics::Metrics;
pub use crate::model::AdminAction;
use crate::model::{Order, ProductView};
use crate::ports::{GateError, LeaseListener, LedgerError, ReleaseOf};
use crate::service::Flashsale;
use crate::sold_out::SoldOutBoard;

/// Whether a sale is paused or on: what pause and resume set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaleSwitch {
    Pause,
    Resume,
}

impl SaleSwitch {
    /// The action's name in the operator's log and the metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pause => "pause",
            Self::Resume => "resume",
        }
    }

    /// The `paused` flag it sets.
    pub const fn paused(self) -> bool {
        matches!(self, Self::Pause)
    }
}

/// What the ledger did with an action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acted {
    /// Recorded now (even when it changed nothing, a pause of a paused sale: the log
    /// still says who asked).
    Done,
    /// This request_id recorded the same action on the same product before.
    Replayed,
    /// This request_id recorded another action, or this one on another product or with
    /// other fields.
    Conflict,
    /// No such product.
    NotFound,
    /// The change would leave the product invalid (a window ending before it starts);
    /// nothing was written.
    Invalid(ParseError),
}

/// An admin's refund of a paid order, as its request names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefundAsk {
    /// The refund's idempotency key, in the same namespace as the other admin actions.
    pub request_id: RequestId,
    pub order_id: OrderId,
    pub admin: AdminName,
    /// Whether the units go back on sale (else they leave the stock).
    pub restock: bool,
}

/// What the ledger did with a refund.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refunded {
    /// The order is REFUNDED: by this request (`applied`), or before it (a replay, or a
    /// refund under another request_id: refunding twice changes nothing). `pending_return`
    /// is the gate's part still owed: the hold to let go of, and the units when they go
    /// back on sale.
    Done {
        order: Order,
        applied: bool,
        pending_return: Option<ReleaseOf>,
    },
    /// This request_id recorded another action, or a refund of another order or with the
    /// other `restock`.
    Conflict,
    /// No such order.
    NotFound,
    /// The order is not paid (PENDING_PAYMENT or CANCELLED): nothing was written.
    NotRefundable(OrderStatus),
}

/// The ledger's side of the controls.
#[async_trait]
pub trait Controls: Send + Sync + 'static {
    /// Sets the product's `paused` flag for `switch`, with its log entry and event, in
    /// one transaction; a request_id already in the log is answered from it.
    async fn switch_sale(
        &self,
        action: &AdminAction,
        switch: SaleSwitch,
    ) -> Result<Acted, LedgerError>;

    /// Makes `change` to the product's definition, with its log entry and event, in one
    /// transaction; a request_id already in the log is answered from it.
    async fn change_product(
        &self,
        action: &AdminAction,
        change: &ProductChange,
    ) -> Result<Acted, LedgerError>;

    /// Refunds a PAID order: order REFUNDED, its reservation RELEASED, `sold` less its
    /// units, which go back to `available` or out of `total` (`restock`), with the stock
    /// log's row, the order's `order_refunded` event and the operator's log line, in one
    /// transaction; a request_id already in the log is answered from it.
    async fn refund(&self, ask: &RefundAsk) -> Result<Refunded, LedgerError>;
}

/// Tells every instance that a product's definition changed, so each reads it anew.
#[async_trait]
pub trait Announcer: Send + Sync + 'static {
    async fn announce_change(&self, product_id: ProductId) -> Result<(), GateError>;
}

/// The controls use case.
pub struct SaleControl {
    controls: Arc<dyn Controls>,
    announcer: Arc<dyn Announcer>,
    service: Arc<Flashsale>,
    /// Where refunds are counted (None in tests without metrics).
    metrics: Option<Arc<Metrics>>,
}

impl std::fmt::Debug for SaleControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SaleControl")
    }
}

impl SaleControl {
    pub fn new(
        controls: Arc<dyn Controls>,
        announcer: Arc<dyn Announcer>,
        service: Arc<Flashsale>,
        metrics: Option<Arc<Metrics>>,
    ) -> Self {
        Self {
            controls,
            announcer,
            service,
            metrics,
        }
    }

    /// Pauses or resumes the product's sale, and answers the product as it is now. A
    /// retry (the same request_id) announces the change again: the first attempt may
    /// have failed after its commit, before its announcement.
    pub async fn switch(
        &self,
        action: AdminAction,
        switch: SaleSwitch,
    ) -> Result<ProductView, Error> {
        let acted = self.controls.switch_sale(&action, switch).await?;
        self.answer(&action, switch.as_str(), acted).await
    }

    /// Changes the product's name, per-user limit or sale window (PATCH), and answers
    /// the product as it is now. Purchases read from the answer on are held to the new
    /// definition; orders already made are not touched. A retry announces again.
    pub async fn change(
        &self,
        action: AdminAction,
        change: ProductChange,
    ) -> Result<ProductView, Error> {
        let acted = self.controls.change_product(&action, &change).await?;
        self.answer(&action, "patch", acted).await
    }

    /// Refunds a paid order and answers it as it is now (REFUNDED). The ledger decides;
    /// then, in gate mode, the gate lets go of the hold (and the buyer's count of it) and,
    /// with `restock`, puts the units back on sale, once: a crash before that leaves the
    /// release pending in the ledger, which the workers finish like a cancel's.
    pub async fn refund(&self, ask: RefundAsk) -> Result<Order, Error> {
        let (order, applied, pending_return) = match self.controls.refund(&ask).await? {
            Refunded::Done {
                order,
                applied,
                pending_return,
            } => (order, applied, pending_return),
            Refunded::Conflict => return Err(Error::RequestIdConflict),
            Refunded::NotFound => return Err(Error::OrderNotFound),
            Refunded::NotRefundable(_) => return Err(Error::OrderNotRefundable),
        };
        debug_assert_eq!(
            order.status,
            OrderStatus::Refunded,
            "a refund answers REFUNDED"
        );
        if applied {
            info!(order_id = %ask.order_id, admin = %ask.admin, request_id = %ask.request_id,
                restock = ask.restock, "admin action: refund");
            if let Some(m) = &self.metrics {
                m.refunded(ask.restock, order.quantity.get());
            }
        }
        self.service
            .refunded(&order, applied && ask.restock, pending_return)
            .await;
        Ok(order)
    }

    /// The product after an action the ledger took (`acted`), once every instance acts on
    /// it: this instance's copy forgotten, the others' by the announcement, or by time
    /// when it cannot be made.
    async fn answer(
        &self,
        action: &AdminAction,
        what: &str,
        acted: Acted,
    ) -> Result<ProductView, Error> {
        match acted {
            Acted::Done | Acted::Replayed => {}
            Acted::Conflict => return Err(Error::RequestIdConflict),
            Acted::NotFound => return Err(Error::ProductNotFound),
            Acted::Invalid(e) => return Err(Error::Invalid(e)),
        }
        let product_id = action.product_id;
        self.service.product_changed(product_id);
        if let Err(e) = self.announcer.announce_change(product_id).await {
            warn!(%product_id, error = %e, wait = ?FOUND_TTL, action = what,
                "recorded but not announced: answering once every instance's copy of the \
                 product has expired");
            tokio::time::sleep(FOUND_TTL).await;
        }
        info!(%product_id, admin = %action.admin, request_id = %action.request_id,
            action = what, "admin action");
        self.service.product_view(product_id).await
    }
}

/// What an instance hears on the gate's channels, passed on: lease revocations to the
/// sold-out board, changed definitions to the catalog.
pub(crate) struct Hearing {
    pub(crate) sold_out: Arc<SoldOutBoard>,
    pub(crate) catalog: Arc<Catalog>,
}

impl LeaseListener for Hearing {
    fn listening(&self) {
        self.sold_out.listening();
    }

    fn deaf(&self) {
        self.sold_out.deaf();
    }

    fn revoked(&self, product_id: Option<ProductId>) {
        self.sold_out.revoked(product_id);
    }

    fn changed(&self, product_id: Option<ProductId>) {
        match product_id {
            Some(product_id) => self.catalog.forget(product_id),
            None => self.catalog.forget_all(),
        }
    }
}
