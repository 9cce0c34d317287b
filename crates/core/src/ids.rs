//! Identifiers and quantities you can only obtain by parsing: bad input dies at the edge.

use std::fmt;
use std::sync::Arc;

/// Why a value was rejected; the message names the field so a client can fix its request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ParseError {
    pub field: &'static str,
    pub reason: String,
}

impl ParseError {
    pub fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self {
            field,
            reason: reason.into(),
        }
    }
}

/// Longest request_id accepted; it is the width of the `request_id` column (VARCHAR(64)).
pub const REQUEST_ID_LEN_MAX: usize = 64;

/// A client's stable identifier of one purchase intent, the idempotency key of the whole
/// purchase path: 1–64 characters of `[A-Za-z0-9_.:-]`, so it is safe inside Redis keys,
/// SQL and logs without escaping.
///
/// Shared, not copied: a purchase's request_id travels with it through the gate, the
/// group commit, its in-flight entry, its answer and its trim, about ten clones an
/// order, each an allocation and a copy as a `String` (BENCHMARKS.md, ablation row S12).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(Arc<str>);

/// Whether a request_id may hold `c`: `[A-Za-z0-9_.:-]`.
const fn request_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-')
}

/// [`request_id_char`] for each byte value: every allowed character is a single ASCII
/// byte, so a request_id is valid exactly when each of its bytes is marked here.
const REQUEST_ID_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 128 {
        table[b] = request_id_char(b as u8 as char);
        b += 1;
    }
    table
};

impl RequestId {
    pub fn parse(field: &'static str, raw: &str) -> Result<Self, ParseError> {
        if raw.is_empty() || raw.len() > REQUEST_ID_LEN_MAX {
            return Err(ParseError::new(
                field,
                format!("must be 1 to {REQUEST_ID_LEN_MAX} characters long"),
            ));
        }
        // Byte by byte through a table: every allowed character is one ASCII byte, and
        // any byte of a multi-byte character is refused. Walking `chars()` with the
        // predicate cost every purchase about 200 instructions more (BENCHMARKS.md,
        // ablation row S30); the refusal's message still names the whole character.
        if !raw.bytes().all(|b| REQUEST_ID_BYTES[usize::from(b)]) {
            let bad = raw.chars().find(|&c| !request_id_char(c)).unwrap_or('?');
            return Err(ParseError::new(
                field,
                format!("character {bad:?} is not allowed (use A-Z a-z 0-9 _ . : -)"),
            ));
        }
        Ok(Self(Arc::from(raw)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

macro_rules! positive_id {
    ($name:ident, $field:literal, $doc:literal) => {
        #[doc = $doc]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(i64);

        impl $name {
            /// Accepts 1..=i64::MAX; zero and negatives are never valid ids.
            pub fn parse(raw: i64) -> Result<Self, ParseError> {
                if raw <= 0 {
                    return Err(ParseError::new($field, "must be a positive integer"));
                }
                Ok(Self(raw))
            }

            pub fn get(self) -> i64 {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
    };
}

positive_id!(
    UserId,
    "user_id",
    "A buyer, as the client's identity system knows it."
);
positive_id!(
    ProductId,
    "product_id",
    "A product on sale, chosen by the shop."
);
positive_id!(OrderId, "order_id", "An order, assigned by the ledger.");

/// How many units one purchase takes: 1..=the configured maximum per order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Quantity(u32);

impl Quantity {
    pub fn parse(raw: i64, max: u32) -> Result<Self, ParseError> {
        if raw < 1 || raw > i64::from(max) {
            return Err(ParseError::new(
                "quantity",
                format!("must be between 1 and {max}"),
            ));
        }
        // In range 1..=u32::MAX by the check above.
        Ok(Self(raw as u32))
    }

    /// For values read back from our own stores, which only ever hold parsed quantities.
    pub fn from_stored(raw: i64) -> Option<Self> {
        u32::try_from(raw).ok().filter(|q| *q > 0).map(Self)
    }

    pub fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the request_id grammar at its edges: length 1 and 64 pass, 0 and 65 fail,
    // every allowed punctuation passes, and anything else (space, slash, unicode) fails.
    #[test]
    fn request_id_grammar() {
        let ok = ["a", "REQ_20261021_000001", "a.b:c-d_e", &"x".repeat(64)];
        for raw in ok {
            assert!(RequestId::parse("request_id", raw).is_ok(), "{raw:?}");
        }
        let bad = ["", &"x".repeat(65), "a b", "a/b", "ä", "a\n", "{x}", "a*"];
        for raw in bad {
            let err = RequestId::parse("request_id", raw).unwrap_err();
            assert_eq!(err.field, "request_id", "{raw:?}");
        }
    }

    // Checks that the byte table behind `RequestId::parse` marks exactly the bytes that
    // are allowed characters on their own (each byte value against the char predicate;
    // bytes from 0x80 up are never characters alone and must be refused), and that a
    // refused multi-byte character is named whole in the message.
    #[test]
    fn request_id_byte_table_is_the_grammar() {
        for b in 0..=255u8 {
            let expected = b < 0x80 && request_id_char(char::from(b));
            assert_eq!(REQUEST_ID_BYTES[usize::from(b)], expected, "byte {b:#04x}");
        }
        let err = RequestId::parse("request_id", "ab\u{e4}c").unwrap_err();
        assert!(err.reason.contains("'\u{e4}'"), "{}", err.reason);
        let err = RequestId::parse("request_id", "ab c").unwrap_err();
        assert!(err.reason.contains("' '"), "{}", err.reason);
    }

    // Checks that ids accept exactly the positive integers.
    #[test]
    fn ids_must_be_positive() {
        assert!(UserId::parse(1).is_ok());
        assert!(UserId::parse(i64::MAX).is_ok());
        assert_eq!(UserId::parse(0).unwrap_err().field, "user_id");
        assert_eq!(ProductId::parse(-5).unwrap_err().field, "product_id");
        assert_eq!(OrderId::parse(0).unwrap_err().field, "order_id");
    }

    // Checks the quantity range 1..=max at both edges, and that stored values round-trip.
    #[test]
    fn quantity_range() {
        assert_eq!(Quantity::parse(1, 5).map(Quantity::get), Ok(1));
        assert_eq!(Quantity::parse(5, 5).map(Quantity::get), Ok(5));
        assert!(Quantity::parse(0, 5).is_err());
        assert!(Quantity::parse(6, 5).is_err());
        assert!(Quantity::parse(-1, 5).is_err());
        assert!(Quantity::parse(i64::MAX, u32::MAX).is_err());
        assert_eq!(Quantity::from_stored(3).map(Quantity::get), Some(3));
        assert_eq!(Quantity::from_stored(0), None);
    }
}
