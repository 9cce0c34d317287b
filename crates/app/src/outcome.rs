//! Every outcome an answer can have, in one enum: the successes (`created`, `replayed`,
//! `ok`) and each error code of the API. The HTTP layer answers with an [`Outcome`] (its
//! status mapping is an exhaustive match over it), the metrics count answers by it (one
//! series per variant, indexed by `Outcome as usize`, no string search), and the tests
//! that list codes iterate [`Outcome::ALL`]. A variant is declared once, in the list
//! below, with its code: `ALL` and `as_str` are generated from that list, so a new code
//! is counted as soon as it exists.

/// Declares `Outcome` with its variants, `ALL` (in declaration order, so
/// `Outcome::ALL[o as usize] == o`) and `as_str`, from one list of `Variant => "code"`.
macro_rules! outcomes {
    ($($(#[$doc:meta])* $variant:ident => $code:literal,)+) => {
        /// What an answer was: a success, or the error code the client reads.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Outcome {
            $($(#[$doc])* $variant,)+
        }

        impl Outcome {
            /// Every outcome, in declaration order.
            pub const ALL: [Outcome; [$($code),+].len()] = [$(Outcome::$variant),+];

            /// The outcome's code: the `error` of an error answer's body and the
            /// `outcome` label of the metrics.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Outcome::$variant => $code,)+
                }
            }
        }
    };
}

outcomes! {
    /// Not enough stock left (409). First: most of a flash sale's answers are this one.
    SoldOut => "sold_out",
    /// A purchase committed now, or a product created (201).
    Created => "created",
    /// A purchase's replay: the original order again (200).
    Replayed => "replayed",
    /// Any other success (200).
    Ok => "ok",
    /// The per-user limit of the product reached (409).
    LimitExceeded => "limit_exceeded",
    /// A request that does not parse (400).
    InvalidRequest => "invalid_request",
    /// A body over the size bound (413).
    PayloadTooLarge => "payload_too_large",
    /// A body that did not arrive within the request deadline (408).
    RequestTimeout => "request_timeout",
    /// Credentials missing or refused (401).
    Unauthorized => "unauthorized",
    /// No such endpoint (404).
    NotFound => "not_found",
    /// A method the endpoint does not serve (405).
    MethodNotAllowed => "method_not_allowed",
    /// No such product (404).
    ProductNotFound => "product_not_found",
    /// No such order, or not the buyer's (404).
    OrderNotFound => "order_not_found",
    /// The product id is taken (409).
    ProductExists => "product_exists",
    /// The product's sale is not open now (409).
    SaleNotActive => "sale_not_active",
    /// The operator paused the product's sale (409).
    SalePaused => "sale_paused",
    /// A destock of more units than are available; nothing changed (409).
    InsufficientStock => "insufficient_stock",
    /// The request_id was used with another payload (409).
    RequestIdConflict => "request_id_conflict",
    /// The request_id's reservation was released without an order (409).
    RequestReleased => "request_released",
    /// The order can't be paid in its state (409).
    OrderNotPayable => "order_not_payable",
    /// The order's payment deadline passed (409).
    OrderExpired => "order_expired",
    /// The order can't be cancelled in its state (409).
    OrderNotCancellable => "order_not_cancellable",
    /// The order is not paid, so it can't be refunded (409).
    OrderNotRefundable => "order_not_refundable",
    /// Over a purchase rate; nothing was done (429).
    RateLimited => "rate_limited",
    /// A store unreachable or the outcome unknown; retry with the same request_id (503).
    Unavailable => "unavailable",
    /// A body's user_id that is not the authenticated buyer (403).
    Forbidden => "forbidden",
    /// A body not declared JSON (415).
    UnsupportedMediaType => "unsupported_media_type",
}

impl Outcome {
    /// The outcome's place in [`Outcome::ALL`]: what the metrics index their series by.
    pub const fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that `ALL` is in declaration order and each outcome's index is its place in
    // it (the metrics' cells rely on it), and that no two outcomes share a code (they
    // would share a metric series): by walking `ALL` and collecting the codes in a set.
    #[test]
    fn all_is_indexed_by_discriminant_and_codes_are_distinct() {
        let mut codes = std::collections::BTreeSet::new();
        for (i, o) in Outcome::ALL.iter().enumerate() {
            assert_eq!(o.index(), i, "{o}");
            assert!(codes.insert(o.as_str()), "{o} twice");
            assert!(
                o.as_str()
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{o}: a code is snake_case"
            );
        }
        assert_eq!(codes.len(), 27);
    }
}
