//! The ports: what the use cases need from the outside world, and nothing more.
//!
//! Every method is idempotent, so a caller that lost a reply may call again. An `Err`
//! means "could not be done, or the outcome is unknown"; the use cases answer it with
//! `unavailable` (503) and the client retries with the same request_id.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use flashsale_core::{
    CancelReason, InventoryCounters, NewProduct, OrderId, ProductId, PurchaseRequest, Quantity,
    ReleaseReason, RequestId, UserId,
};

use crate::model::{Order, Product, PurchaseRecord};

/// The stock gate could not be reached, or did not answer in time (outcome unknown).
#[derive(Debug, Clone, thiserror::Error)]
#[error("stock gate: {0}")]
pub struct GateError(pub String);

/// The ledger could not be reached, or a commit's outcome is unknown.
#[derive(Debug, Clone, thiserror::Error)]
#[error("ledger: {0}")]
pub struct LedgerError(pub String);

/// The fast, shared counter of available stock (Redis). It admits or refuses each
/// purchase atomically and keeps a trace of every unit it hands out.
#[async_trait]
pub trait StockGate: Send + Sync + 'static {
    async fn ping(&self) -> Result<(), GateError>;

    /// Sets the product's available count unless the gate already has one (warm-up);
    /// returns whether it set it.
    async fn load(&self, product_id: ProductId, available: i64) -> Result<bool, GateError>;

    /// Checks stock and the per-user limit and takes the units, atomically, recording a
    /// hold under (product, request_id). Idempotent on request_id: a second call finds
    /// the hold and reports it instead of taking stock again.
    async fn reserve(
        &self,
        request: &PurchaseRequest,
        per_user_limit: Option<u32>,
        now: DateTime<Utc>,
    ) -> Result<Reserve, GateError>;

    /// Gives a hold's units back, once: a repeated or concurrent call returns nothing more.
    async fn release(
        &self,
        product_id: ProductId,
        request_id: &RequestId,
    ) -> Result<Release, GateError>;

    /// Adds units once per restock id.
    async fn restock(
        &self,
        product_id: ProductId,
        restock_id: &RequestId,
        quantity: i64,
    ) -> Result<Restock, GateError>;

    /// The live available count; None when the gate holds nothing for the product.
    async fn available(&self, product_id: ProductId) -> Result<Option<i64>, GateError>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserve {
    /// Units taken; `hold_id` identifies this hold among the product's holds.
    Reserved {
        hold_id: i64,
    },
    SoldOut,
    LimitExceeded,
    /// The gate has no stock entry for the product.
    NotLoaded,
    /// A hold already exists for this request_id (a replay, or a concurrent duplicate).
    Existing(ExistingHold),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExistingHold {
    pub hold_id: i64,
    pub user_id: UserId,
    pub quantity: Quantity,
    pub released: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    Released,
    AlreadyReleased,
    /// No hold is recorded (it outlived its retention, or the gate lost it): nothing was
    /// returned, and the caller must leave the return pending for reconciliation.
    Missing,
    /// The gate has no stock entry for the product; nothing was changed.
    NotLoaded,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restock {
    Applied,
    AlreadyApplied,
    NotLoaded,
}

/// The durable record of products, orders and reservations (MariaDB): the business facts
/// everything else is rebuilt from.
#[async_trait]
pub trait Ledger: Send + Sync + 'static {
    async fn ping(&self) -> Result<(), LedgerError>;

    async fn create_product(&self, product: &NewProduct) -> Result<CreateProduct, LedgerError>;

    async fn product(&self, product_id: ProductId) -> Result<Option<Product>, LedgerError>;

    async fn mark_stock_loaded(&self, product_id: ProductId) -> Result<(), LedgerError>;

    async fn inventory(
        &self,
        product_id: ProductId,
    ) -> Result<Option<InventoryCounters>, LedgerError>;

    /// In one transaction: the reservation (PROCESSING), the order (PENDING_PAYMENT,
    /// expiring `payment_timeout` after the database's now), the reserve log row, and the
    /// counters — unless the request_id is already taken or the ledger's own counters say
    /// there is not enough stock.
    async fn commit_purchase(
        &self,
        request: &PurchaseRequest,
        hold_id: i64,
        payment_timeout: Duration,
    ) -> Result<Commit, LedgerError>;

    /// Takes the request_id with a RELEASED reservation and no order, so no attempt can
    /// ever commit an order for it; afterwards its hold may be returned to the gate.
    async fn fence(
        &self,
        request: &PurchaseRequest,
        hold_id: i64,
        reason: ReleaseReason,
    ) -> Result<Fence, LedgerError>;

    async fn find_purchase(
        &self,
        request_id: &RequestId,
    ) -> Result<Option<PurchaseRecord>, LedgerError>;

    async fn order(&self, order_id: OrderId) -> Result<Option<Order>, LedgerError>;

    /// PENDING_PAYMENT → PAID (and the reservation → CONFIRMED) if not expired on the
    /// database's clock. None when no such order belongs to this user.
    async fn pay(
        &self,
        order_id: OrderId,
        user_id: UserId,
    ) -> Result<Option<PayAttempt>, LedgerError>;

    /// PENDING_PAYMENT → CANCELLED (and the reservation → RELEASED with its stock return
    /// pending). None when no such order belongs to this user.
    async fn cancel(
        &self,
        order_id: OrderId,
        user_id: UserId,
        reason: CancelReason,
    ) -> Result<Option<CancelAttempt>, LedgerError>;

    /// Records that a released reservation's units are back in the gate.
    async fn mark_stock_returned(&self, request_id: &RequestId) -> Result<(), LedgerError>;

    /// Records a restock (counters and log) once per restock id.
    async fn record_restock(
        &self,
        product_id: ProductId,
        restock_id: &RequestId,
        quantity: i64,
    ) -> Result<RecordRestock, LedgerError>;

    async fn mark_restock_applied(&self, restock_id: &RequestId) -> Result<(), LedgerError>;
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateProduct {
    Created(Product),
    /// The product id is taken; the stored product and its total stock.
    Exists(Product, i64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Commit {
    Committed(Order),
    /// The request_id was already taken; what the ledger holds for it.
    Duplicate(PurchaseRecord),
    /// The ledger's counters have fewer units available than requested.
    InsufficientStock,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fence {
    Fenced,
    Duplicate(PurchaseRecord),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayAttempt {
    /// The order after the attempt.
    pub order: Order,
    /// Whether this call moved it to PAID.
    pub applied: bool,
    /// Whether its payment deadline has passed on the database's clock.
    pub expired: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelAttempt {
    pub order: Order,
    pub applied: bool,
    /// The reservation is RELEASED but its units are not yet recorded as back in the gate.
    pub stock_return_pending: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordRestock {
    /// Recorded now or before; `applied` says whether the gate already has the units.
    Recorded { applied: bool },
    /// The restock id was used for another product or quantity.
    Conflict,
    /// The total would exceed the largest stock a product may have.
    TooLarge,
}

/// Where the use cases read the time for sale windows. Payment deadlines are decided on
/// the ledger's clock instead, so one instance with a wrong clock can't expire early.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> DateTime<Utc>;
}

#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}
