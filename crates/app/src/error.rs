//! The use cases' errors. Each variant is one stable, documented outcome; the HTTP layer
//! maps each to a status and an error code, and nothing else.

use std::time::Duration;

use flashsale_core::ParseError;

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
    /// This user sent purchases faster than its rate; nothing was done.
    #[error("too many purchase attempts from this user; nothing was done, retry after the Retry-After seconds")]
    RateLimited { retry_after: Duration },
    /// A dependency could not be reached or the outcome is unknown: the client retries
    /// with the same request_id. Never used for an outcome that is known.
    #[error("temporarily unavailable: {0}")]
    Unavailable(String),
}

impl From<crate::ports::GateError> for Error {
    fn from(e: crate::ports::GateError) -> Self {
        Self::Unavailable(e.to_string())
    }
}

impl From<crate::ports::LedgerError> for Error {
    fn from(e: crate::ports::LedgerError) -> Self {
        Self::Unavailable(e.to_string())
    }
}
