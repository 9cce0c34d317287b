//! A purchase request: the payload that one request_id stands for, and the terms its
//! commit holds it to.

use std::time::Duration;

use crate::ids::{ParseError, ProductId, Quantity, RequestId, UserId};

/// One purchase intent. Two attempts with the same `request_id` must carry the same
/// payload; a different payload under a used request_id is a client bug
/// (`request_id_conflict`), never a second purchase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurchaseRequest {
    pub request_id: RequestId,
    pub user_id: UserId,
    pub product_id: ProductId,
    pub quantity: Quantity,
}

impl PurchaseRequest {
    /// Parses the raw fields, checking the quantity against the configured maximum per
    /// order. Fields are checked in the order a client reads them, so the first error
    /// names the first bad field.
    pub fn parse(
        request_id: &str,
        user_id: i64,
        product_id: i64,
        quantity: i64,
        quantity_max: u32,
    ) -> Result<Self, ParseError> {
        Ok(Self {
            request_id: RequestId::parse("request_id", request_id)?,
            user_id: UserId::parse(user_id)?,
            product_id: ProductId::parse(product_id)?,
            quantity: Quantity::parse(quantity, quantity_max)?,
        })
    }

    /// Whether `other` is the same purchase (a legitimate replay) as `self`.
    pub fn same_payload(&self, other: &PurchaseRequest) -> bool {
        self == other
    }
}

/// What the ledger holds a purchase to when it commits it, besides the stock: the
/// product's per-user limit (None: no limit), checked in the commit's transaction, and
/// how long the order then waits for its payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms {
    pub per_user_limit: Option<u32>,
    pub payment_timeout: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that parsing reports the first bad field, and that a replay is recognised
    // only when every field of the payload matches.
    #[test]
    fn parse_and_compare() {
        let ok = PurchaseRequest::parse("REQ_1", 42, 1001, 1, 5).expect("valid");
        assert_eq!(
            PurchaseRequest::parse("bad id", 0, 0, 0, 5)
                .unwrap_err()
                .field,
            "request_id"
        );
        assert_eq!(
            PurchaseRequest::parse("R", 0, 1, 1, 5).unwrap_err().field,
            "user_id"
        );
        assert_eq!(
            PurchaseRequest::parse("R", 1, 1, 6, 5).unwrap_err().field,
            "quantity"
        );
        let same = PurchaseRequest::parse("REQ_1", 42, 1001, 1, 5).expect("valid");
        assert!(ok.same_payload(&same));
        for other in [
            PurchaseRequest::parse("REQ_1", 43, 1001, 1, 5),
            PurchaseRequest::parse("REQ_1", 42, 1002, 1, 5),
            PurchaseRequest::parse("REQ_1", 42, 1001, 2, 5),
        ] {
            assert!(!ok.same_payload(&other.expect("valid")));
        }
    }
}
