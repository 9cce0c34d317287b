//! The use cases' errors. Each variant is one stable, documented outcome
//! ([`Error::outcome`]); the HTTP layer maps each outcome to a status, and nothing else.

use std::time::Duration;

use flashsale_core::ParseError;

use crate::outcome::Outcome;
use crate::ports::{ErrorKind, GateError, LedgerError, PortError};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid request: {0}")]
    Invalid(#[from] ParseError),
    #[error("product not found")]
    ProductNotFound,
    #[error("product already exists")]
    ProductExists,
    #[error("the sale of this product is not open now")]
    SaleNotActive,
    #[error("the sale of this product is paused by the operator; retry later")]
    SalePaused,
    #[error("fewer units are available than the destock asks for; nothing changed")]
    InsufficientStock,
    #[error("not enough stock left")]
    SoldOut,
    #[error("per-user limit of this product reached")]
    LimitExceeded,
    #[error("request_id already used with a different payload")]
    RequestIdConflict,
    #[error("this request_id's reservation was released without an order; purchase again with a new request_id")]
    RequestReleased,
    #[error("order not found")]
    OrderNotFound,
    #[error("order can't be paid in its current state")]
    OrderNotPayable,
    #[error("order's payment deadline has passed")]
    OrderExpired,
    #[error("order can't be cancelled in its current state")]
    OrderNotCancellable,
    #[error("only a paid order can be refunded")]
    OrderNotRefundable,
    /// This user sent purchases faster than its rate; nothing was done.
    #[error("too many purchase attempts from this user; nothing was done, retry after the Retry-After seconds")]
    RateLimited { retry_after: Duration },
    /// A dependency could not be reached or the outcome is unknown: the client retries
    /// with the same request_id. Never used for an outcome that is known.
    #[error("temporarily unavailable: {0}")]
    Unavailable(Unavailable),
}

/// Why an answer is `unavailable`: a store's error (which store, what kind, its
/// source), or the use case's own reason to have the client retry.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Unavailable {
    #[error(transparent)]
    Gate(#[from] GateError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    /// The stores answered, but not yet what the request needs: a product's stock not
    /// loaded or being rebuilt, an order changed concurrently, an outcome not known yet.
    #[error("{0}")]
    Retry(String),
}

impl Unavailable {
    /// The store whose error this is and its kind, for the `store_errors` metric; None
    /// for the use case's own reasons.
    pub fn store_fault(&self) -> Option<(&'static str, ErrorKind)> {
        match self {
            Self::Gate(e) => Some((GateError::STORE, e.kind())),
            Self::Ledger(e) => Some((LedgerError::STORE, e.kind())),
            Self::Retry(_) => None,
        }
    }
}

impl From<String> for Unavailable {
    fn from(why: String) -> Self {
        Self::Retry(why)
    }
}

impl From<&str> for Unavailable {
    fn from(why: &str) -> Self {
        Self::Retry(why.to_owned())
    }
}

impl Error {
    /// The outcome this error is answered with: one per variant, so an error cannot be
    /// answered without its outcome being counted.
    pub const fn outcome(&self) -> Outcome {
        match self {
            Self::Invalid(_) => Outcome::InvalidRequest,
            Self::ProductNotFound => Outcome::ProductNotFound,
            Self::ProductExists => Outcome::ProductExists,
            Self::SaleNotActive => Outcome::SaleNotActive,
            Self::SalePaused => Outcome::SalePaused,
            Self::InsufficientStock => Outcome::InsufficientStock,
            Self::SoldOut => Outcome::SoldOut,
            Self::LimitExceeded => Outcome::LimitExceeded,
            Self::RequestIdConflict => Outcome::RequestIdConflict,
            Self::RequestReleased => Outcome::RequestReleased,
            Self::OrderNotFound => Outcome::OrderNotFound,
            Self::OrderNotPayable => Outcome::OrderNotPayable,
            Self::OrderExpired => Outcome::OrderExpired,
            Self::OrderNotCancellable => Outcome::OrderNotCancellable,
            Self::OrderNotRefundable => Outcome::OrderNotRefundable,
            Self::RateLimited { .. } => Outcome::RateLimited,
            Self::Unavailable(_) => Outcome::Unavailable,
        }
    }
}

impl From<GateError> for Error {
    fn from(e: GateError) -> Self {
        Self::Unavailable(Unavailable::Gate(e))
    }
}

impl From<LedgerError> for Error {
    fn from(e: LedgerError) -> Self {
        Self::Unavailable(Unavailable::Ledger(e))
    }
}
