//! Records the use cases read and return.

use std::time::Duration;

use chrono::{DateTime, Utc};
use flashsale_core::{
    AdminName, CancelReason, HoldRef, OrderId, OrderStatus, ProductId, PurchaseRequest, Quantity,
    ReleaseReason, RequestId, SaleWindow, StockMode, Terms, UserId,
};

/// A product as the ledger stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Product {
    pub product_id: ProductId,
    pub name: String,
    pub per_user_limit: Option<u32>,
    pub window: SaleWindow,
    /// Whether the stock gate was loaded with this product's stock once. Before that no
    /// reservation can exist, so loading from the ledger's counters is safe; after it,
    /// a missing gate entry means the gate lost data.
    pub stock_loaded: bool,
    /// Who serves the stock now: the gate, or the ledger alone (see `StockMode`).
    pub stock_mode: StockMode,
    /// Whether the operator paused the sale: purchases are refused with `sale_paused`
    /// while it is, and pay, cancel and expiry go on (`control.rs`).
    pub paused: bool,
    pub created_at: DateTime<Utc>,
}

impl Product {
    /// The terms its purchases are committed under, orders waiting `payment_timeout`
    /// (the service's) for their payment.
    pub fn terms(&self, payment_timeout: Duration) -> Terms {
        Terms {
            per_user_limit: self.per_user_limit,
            payment_timeout,
        }
    }
}

/// An admin's action on a product, as its request names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminAction {
    /// The action's idempotency key: a retry with it finds the action done and changes
    /// nothing; another action under it is a conflict.
    pub request_id: RequestId,
    pub product_id: ProductId,
    /// Which admin token made it.
    pub admin: AdminName,
}

/// An order, the durable result of an accepted purchase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Order {
    pub order_id: OrderId,
    pub request_id: RequestId,
    pub user_id: UserId,
    pub product_id: ProductId,
    pub quantity: Quantity,
    pub status: OrderStatus,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub paid_at: Option<DateTime<Utc>>,
    pub cancelled_at: Option<DateTime<Utc>>,
    pub cancel_reason: Option<CancelReason>,
    /// When the operator refunded it (REFUNDED).
    pub refunded_at: Option<DateTime<Utc>>,
}

impl Order {
    /// The payload this order was created from, to compare with a replay.
    pub fn request(&self) -> PurchaseRequest {
        PurchaseRequest {
            request_id: self.request_id.clone(),
            user_id: self.user_id,
            product_id: self.product_id,
            quantity: self.quantity,
        }
    }
}

/// What the ledger knows about one request_id: the payload it was accepted with, the
/// gate hold it stands for, and what became of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurchaseRecord {
    pub request: PurchaseRequest,
    /// The stock gate hold this reservation accounts for.
    pub hold: HoldRef,
    pub outcome: PurchaseOutcome,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PurchaseOutcome {
    /// An order exists (in any state).
    Order(Order),
    /// The request's reservation was released before any order was written (a fence):
    /// the request_id is spent and no order can ever be created for it.
    Released { reason: ReleaseReason },
}

impl PurchaseRecord {
    /// Whether this record accounts for the given gate hold.
    pub fn is_hold(&self, product_id: ProductId, hold: HoldRef) -> bool {
        self.request.product_id == product_id && self.hold == hold
    }
}

/// The answer to a purchase: the order, and whether an earlier attempt had already been
/// accepted (a replay answers 200 instead of 201).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Purchased {
    pub order: Order,
    pub replay: bool,
}

/// Live inventory of a product: `available` from the stock gate, the rest from the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InventoryView {
    pub total: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProductView {
    pub product: Product,
    pub inventory: InventoryView,
}

/// A line of the operator's log: one admin action on a product, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggedAction {
    /// The line's id: the log's order and the cursor of its pages.
    pub id: i64,
    /// The admin's idempotency key; None for a creation, whose key is its product.
    pub request_id: Option<RequestId>,
    /// `create`, `restock`, `pause`, `resume`, `patch` or `refund`.
    pub action: String,
    pub product_id: ProductId,
    pub admin: AdminName,
    /// What was asked, as JSON (a PATCH's fields); None where the action says it all.
    pub asked: Option<String>,
    /// The product's state before and after the action, as JSON.
    pub before: String,
    pub after: String,
    pub acted_at: DateTime<Utc>,
}
