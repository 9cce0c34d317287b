//! Events: what every order and reservation state change tells the rest of the world,
//! and every repair reconciliation makes to a product's count in the gate.
//!
//! The ledger writes one outbox row per state change in the transaction that makes the
//! change (so an event exists exactly when its change committed); the relay
//! ([`crate::relay`]) publishes the rows to the broker; consumers apply each event once,
//! deduplicating by its id ([`crate::consume`]). The JSON form is documented in
//! `docs/events.md`.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use flashsale_core::{OrderId, ProductId, Quantity, RequestId, UserId};

/// The kinds of state change that produce an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventType {
    /// A purchase was accepted: order PENDING_PAYMENT, reservation PROCESSING.
    OrderCreated,
    /// The order was paid: order PAID, reservation CONFIRMED.
    OrderPaid,
    /// The order was cancelled (by its buyer, or at its payment deadline); `reason` says
    /// which. Always followed by `ReservationReleased` of the same request.
    OrderCancelled,
    /// A reservation's units went back to the stock: after a cancellation, or a
    /// reservation released without ever having an order (a fence; `order_id` null).
    ReservationReleased,
    /// Reconciliation repaired a product's available count in the gate (a
    /// `stock_repair` row): no order, no buyer, no sale; its request_id is `REPAIR_<id>`
    /// of that row, and its payload carries the repair's facts (docs/events.md).
    StockRepaired,
    /// The operator paused the product's sale (`control.rs`): no order, no buyer; its
    /// request_id is `ADMIN_<id>` of the operator's log's row, and its payload names the
    /// admin and the action's own request_id (docs/events.md).
    ProductPaused,
    /// The operator resumed the product's sale; as `ProductPaused`.
    ProductResumed,
    /// The operator changed the product's name, per-user limit or sale window (PATCH);
    /// as `ProductPaused`, its payload with the definition before and after.
    ProductChanged,
    /// The operator refunded a paid order (order REFUNDED, reservation RELEASED); its
    /// `reason` says whether the units went back on sale (`refund_restocked`) or out of
    /// stock (`refund_withdrawn`). Under the order's request_id, after its `order_paid`.
    OrderRefunded,
    /// The operator took available units off sale (a destock); as `ProductPaused`, its
    /// payload with the inventory before and after and the quantity asked.
    ProductDestocked,
}

impl EventType {
    pub const ALL: [EventType; 10] = [
        Self::OrderCreated,
        Self::OrderPaid,
        Self::OrderCancelled,
        Self::ReservationReleased,
        Self::StockRepaired,
        Self::ProductPaused,
        Self::ProductResumed,
        Self::ProductChanged,
        Self::OrderRefunded,
        Self::ProductDestocked,
    ];

    /// The name used in the payload, the outbox and the subject
    /// (`<prefix>.events.<name>`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OrderCreated => "order_created",
            Self::OrderPaid => "order_paid",
            Self::OrderCancelled => "order_cancelled",
            Self::ReservationReleased => "reservation_released",
            Self::StockRepaired => "stock_repaired",
            Self::ProductPaused => "product_paused",
            Self::ProductResumed => "product_resumed",
            Self::ProductChanged => "product_changed",
            Self::OrderRefunded => "order_refunded",
            Self::ProductDestocked => "product_destocked",
        }
    }

    /// Whether the event is a product's, with no buyer and no units: a repair, or an
    /// operator's action.
    pub const fn of_product(self) -> bool {
        matches!(
            self,
            Self::StockRepaired
                | Self::ProductPaused
                | Self::ProductResumed
                | Self::ProductChanged
                | Self::ProductDestocked
        )
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An event type name that is none of ours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown event type {0:?}")]
pub struct UnknownEventType(pub String);

impl FromStr for EventType {
    type Err = UnknownEventType;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| UnknownEventType(s.to_owned()))
    }
}

/// One event as consumers see it (decoded from a message body, which packs one or more).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Unique id (a UUID the ledger generates when it writes the event): the consumers'
    /// deduplication key (the broker's `Nats-Msg-Id` names a message's events together).
    pub event_id: String,
    pub event_type: EventType,
    /// Position among the events of this purchase (request_id), from 1: order_created is
    /// 1, then order_paid or order_cancelled 2, then reservation_released 3. A fence's
    /// reservation_released is 1, as is a stock repair's event.
    pub sequence: u32,
    /// None for a reservation released without an order (a fence) and a stock repair.
    pub order_id: Option<OrderId>,
    pub request_id: RequestId,
    pub product_id: ProductId,
    /// The buyer and the units of an order's or a reservation's event; None for a stock
    /// repair, which has neither (its facts are in the payload, docs/events.md).
    pub units: Option<(UserId, Quantity)>,
    /// order_cancelled: `user_cancelled` or `payment_timeout`; reservation_released:
    /// `cancelled`, `payment_timeout`, `sold_out` or `abandoned`; stock_repaired: why the
    /// count was repaired; otherwise None.
    pub reason: Option<String>,
    /// When the change committed, on the database's clock.
    pub occurred_at: DateTime<Utc>,
}

/// An outbox row the relay holds a lease on, ready to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxMessage {
    /// The row's id in the outbox (not the event id).
    pub id: i64,
    pub event_id: String,
    pub event_type: EventType,
    /// The key that orders events: those of one request_id (one order) go out in
    /// `sequence` order.
    pub request_id: String,
    pub sequence: u32,
    /// The event as it goes on the wire: one JSON object (an element of a message's body,
    /// docs/events.md).
    pub payload: String,
    /// Failed publish attempts so far.
    pub attempts: u32,
    /// Of those, the last ones in a row that the broker refused for good (the message
    /// itself: too large): the relay parks the row after `PARK_AFTER_REFUSALS`.
    pub refusals: u32,
    /// An earlier event of the same request_id is unsent and not held by this relay (another
    /// relay has it): this one, and the later ones of its request_id, must wait.
    pub blocked: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks every event type survives the name round trip and unknown names are refused.
    #[test]
    fn names_round_trip() {
        for t in EventType::ALL {
            assert_eq!(t.as_str().parse::<EventType>(), Ok(t));
        }
        assert!("order_shipped".parse::<EventType>().is_err());
    }
}
