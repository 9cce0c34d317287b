//! The order and reservation state machines.
//!
//! ```text
//! order:        PENDING_PAYMENT ──pay──▶ PAID ──refund──▶ REFUNDED
//!                      └──cancel / expire──▶ CANCELLED
//! reservation:  PROCESSING ──confirm──▶ CONFIRMED ──refund──▶ RELEASED
//!                      └──release──────▶ RELEASED
//! ```
//! A purchase's machine has one non-terminal state, PENDING_PAYMENT / PROCESSING, which
//! every buyer-facing transition leaves, so each reservation is resolved exactly once
//! (invariant I3). An operator's refund is the one way on from PAID: it releases the
//! confirmed reservation once (its units go back on sale, or out of stock), and never
//! again. Repeating the transition that
//! already happened is answered as `Unchanged` (idempotent retries); the opposite
//! transition is refused. The ledger applies these with conditional UPDATEs
//! (`… WHERE status = 'PENDING_PAYMENT'`) and consults [`OrderStatus::pay`] and friends
//! to classify an UPDATE that matched no row.

use std::fmt;
use std::str::FromStr;

/// Declares a status enum from one table of its variants and the text storage and the
/// API know each by: the enum, `ALL` (every variant, in the table's order), `as_str`,
/// `Display`, and `FromStr`, which refuses any other text as [`UnknownStatus`].
macro_rules! status_enum {
    (
        $(#[$meta:meta])*
        pub enum $ty:ident: $kind:literal {
            $($(#[$variant_meta:meta])* $variant:ident => $text:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $ty {
            $($(#[$variant_meta])* $variant,)+
        }

        impl $ty {
            pub const ALL: [$ty; [$($text),+].len()] = [$($ty::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $text,)+
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $ty {
            type Err = UnknownStatus;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok($ty::$variant),)+
                    _ => Err(UnknownStatus { kind: $kind, value: s.to_owned() }),
                }
            }
        }
    };
}

/// What applying an event to a state gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition<S> {
    /// The state moves to `S`.
    To(S),
    /// The event already happened; nothing changes and the caller answers as before.
    Unchanged,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    #[error("order is not payable in state {0}")]
    NotPayable(OrderStatus),
    #[error("order is not cancellable in state {0}")]
    NotCancellable(OrderStatus),
    #[error("order is not refundable in state {0}")]
    NotRefundable(OrderStatus),
    #[error("reservation is {0} and can't be confirmed")]
    NotConfirmable(ReservationStatus),
    #[error("reservation is {0} and can't be released")]
    NotReleasable(ReservationStatus),
}

status_enum! {
    pub enum OrderStatus: "order status" {
        PendingPayment => "PENDING_PAYMENT",
        Paid => "PAID",
        Cancelled => "CANCELLED",
        /// A paid order the operator refunded: its units are no longer sold.
        Refunded => "REFUNDED",
    }
}

impl OrderStatus {
    pub fn pay(self) -> Result<Transition<Self>, TransitionError> {
        match self {
            Self::PendingPayment => Ok(Transition::To(Self::Paid)),
            Self::Paid => Ok(Transition::Unchanged),
            Self::Cancelled | Self::Refunded => Err(TransitionError::NotPayable(self)),
        }
    }

    pub fn cancel(self) -> Result<Transition<Self>, TransitionError> {
        match self {
            Self::PendingPayment => Ok(Transition::To(Self::Cancelled)),
            Self::Cancelled => Ok(Transition::Unchanged),
            Self::Paid | Self::Refunded => Err(TransitionError::NotCancellable(self)),
        }
    }

    /// An operator's refund: only a paid order is refunded, and a refunded one again is
    /// a no-op.
    pub fn refund(self) -> Result<Transition<Self>, TransitionError> {
        match self {
            Self::Paid => Ok(Transition::To(Self::Refunded)),
            Self::Refunded => Ok(Transition::Unchanged),
            Self::PendingPayment | Self::Cancelled => Err(TransitionError::NotRefundable(self)),
        }
    }

    /// Whether the order's units count as taken from stock (invariant I1 sums these).
    pub fn holds_stock(self) -> bool {
        matches!(self, Self::PendingPayment | Self::Paid)
    }

    /// The reservation state that must accompany this order state.
    pub fn reservation(self) -> ReservationStatus {
        match self {
            Self::PendingPayment => ReservationStatus::Processing,
            Self::Paid => ReservationStatus::Confirmed,
            Self::Cancelled | Self::Refunded => ReservationStatus::Released,
        }
    }
}

status_enum! {
    pub enum ReservationStatus: "reservation status" {
        Processing => "PROCESSING",
        Confirmed => "CONFIRMED",
        Released => "RELEASED",
    }
}

impl ReservationStatus {
    pub fn confirm(self) -> Result<Transition<Self>, TransitionError> {
        match self {
            Self::Processing => Ok(Transition::To(Self::Confirmed)),
            Self::Confirmed => Ok(Transition::Unchanged),
            Self::Released => Err(TransitionError::NotConfirmable(self)),
        }
    }

    pub fn release(self) -> Result<Transition<Self>, TransitionError> {
        match self {
            Self::Processing => Ok(Transition::To(Self::Released)),
            Self::Released => Ok(Transition::Unchanged),
            Self::Confirmed => Err(TransitionError::NotReleasable(self)),
        }
    }

    pub fn is_terminal(self) -> bool {
        !matches!(self, Self::Processing)
    }
}

status_enum! {
    /// Why an order was cancelled; stored in `orders.cancel_reason`.
    pub enum CancelReason: "cancel reason" {
        UserCancelled => "user_cancelled",
        PaymentTimeout => "payment_timeout",
    }
}

status_enum! {
    /// Why a reservation's stock went back; stored in
    /// `inventory_reservation.release_reason`. A reservation released without ever
    /// having an order (`SoldOut`, `LimitExceeded`, `Abandoned`) is a fence: its row
    /// takes the request_id, so a late commit of the original attempt fails on the
    /// unique key and can never create an order after the stock was given back.
    pub enum ReleaseReason: "release reason" {
        /// The order was cancelled by its buyer.
        Cancelled => "cancelled",
        /// The order was not paid before `expires_at`.
        PaymentTimeout => "payment_timeout",
        /// The ledger's own stock check refused the order although Redis had reserved it.
        SoldOut => "sold_out",
        /// The ledger's own per-user limit check refused the order although Redis had
        /// reserved it (Redis's per-user counts were lost or stale).
        LimitExceeded => "limit_exceeded",
        /// The attempt died before writing its order; recovery fenced and released it.
        Abandoned => "abandoned",
        /// The paid order was refunded and its units put back on sale.
        RefundRestocked => "refund_restocked",
        /// The paid order was refunded and its units taken out of stock (damaged, kept).
        RefundWithdrawn => "refund_withdrawn",
    }
}

impl ReleaseReason {
    /// A refund's release, by whether its units go back on sale.
    pub fn for_refund(restock: bool) -> Self {
        if restock {
            Self::RefundRestocked
        } else {
            Self::RefundWithdrawn
        }
    }

    /// Whether the released units go back on sale. A withdrawn refund's leave the stock:
    /// the gate only forgets the hold (and the buyer's count of it).
    pub fn returns_units(self) -> bool {
        self != Self::RefundWithdrawn
    }

    pub fn for_cancel(reason: CancelReason) -> Self {
        match reason {
            CancelReason::UserCancelled => Self::Cancelled,
            CancelReason::PaymentTimeout => Self::PaymentTimeout,
        }
    }
}

/// A status string from storage that is none of ours: storage is corrupt or newer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} {value:?}")]
pub struct UnknownStatus {
    pub kind: &'static str,
    pub value: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use OrderStatus::*;
    use ReservationStatus::*;

    // Checks every (state, event) pair of the order machine against the table in the
    // module doc: one legal move out of PENDING_PAYMENT per buyer's event and one out of
    // PAID (the refund), the repeated event is Unchanged, every other state refuses.
    #[test]
    fn order_transitions_exhaustive() {
        assert_eq!(PendingPayment.pay(), Ok(Transition::To(Paid)));
        assert_eq!(Paid.pay(), Ok(Transition::Unchanged));
        for s in [Cancelled, Refunded] {
            assert_eq!(s.pay(), Err(TransitionError::NotPayable(s)));
        }
        assert_eq!(PendingPayment.cancel(), Ok(Transition::To(Cancelled)));
        assert_eq!(Cancelled.cancel(), Ok(Transition::Unchanged));
        for s in [Paid, Refunded] {
            assert_eq!(s.cancel(), Err(TransitionError::NotCancellable(s)));
        }
        assert_eq!(Paid.refund(), Ok(Transition::To(Refunded)));
        assert_eq!(Refunded.refund(), Ok(Transition::Unchanged));
        for s in [PendingPayment, Cancelled] {
            assert_eq!(s.refund(), Err(TransitionError::NotRefundable(s)));
        }
        assert!(
            !Refunded.holds_stock(),
            "a refunded order's units are not sold"
        );
        assert_eq!(Refunded.reservation(), Released);
        assert!(!ReleaseReason::for_refund(false).returns_units());
        assert!(ReleaseReason::for_refund(true).returns_units());
    }

    // Checks every (state, event) pair of the reservation machine, and that a reservation
    // can't reach both terminal states: once confirmed it refuses release and vice versa.
    #[test]
    fn reservation_transitions_exhaustive() {
        assert_eq!(Processing.confirm(), Ok(Transition::To(Confirmed)));
        assert_eq!(Confirmed.confirm(), Ok(Transition::Unchanged));
        assert_eq!(
            Released.confirm(),
            Err(TransitionError::NotConfirmable(Released))
        );
        assert_eq!(Processing.release(), Ok(Transition::To(Released)));
        assert_eq!(Released.release(), Ok(Transition::Unchanged));
        assert_eq!(
            Confirmed.release(),
            Err(TransitionError::NotReleasable(Confirmed))
        );
        for s in ReservationStatus::ALL {
            let both = s.confirm().is_ok() && s.release().is_ok();
            assert_eq!(
                both,
                s == Processing,
                "{s}: only PROCESSING may go either way"
            );
            assert_eq!(s.is_terminal(), s != Processing);
        }
    }

    // Checks that an order's state implies its reservation's state and whether it holds
    // stock, for every order state.
    #[test]
    fn order_state_implies_reservation_state() {
        let expected = [
            (PendingPayment, Processing, true),
            (Paid, Confirmed, true),
            (Cancelled, Released, false),
        ];
        for (order, reservation, holds) in expected {
            assert_eq!(order.reservation(), reservation);
            assert_eq!(order.holds_stock(), holds);
        }
    }

    // Checks that every status and reason survives a round trip through its stored text,
    // and that unknown text is refused rather than mapped to a default.
    #[test]
    fn stored_text_round_trips() {
        for s in OrderStatus::ALL {
            assert_eq!(s.as_str().parse::<OrderStatus>(), Ok(s));
        }
        for s in ReservationStatus::ALL {
            assert_eq!(s.as_str().parse::<ReservationStatus>(), Ok(s));
        }
        for r in ReleaseReason::ALL {
            assert_eq!(r.as_str().parse::<ReleaseReason>(), Ok(r));
        }
        assert!("paid".parse::<OrderStatus>().is_err());
        assert!("".parse::<ReservationStatus>().is_err());
        assert_eq!(
            ReleaseReason::for_cancel(CancelReason::PaymentTimeout),
            ReleaseReason::PaymentTimeout
        );
    }
}
