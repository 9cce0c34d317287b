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

/// Longest request_id a client may send.
pub const REQUEST_ID_LEN_MAX: usize = 64;

/// Longest key the stores keep: a buyer-scoped key ([`RequestId::scoped`]) is a user id
/// (19 digits at most), the separator and a client's request_id. It is the width of the
/// ledger's `request_id` columns (VARCHAR(84)).
pub const REQUEST_KEY_LEN_MAX: usize = 19 + 1 + REQUEST_ID_LEN_MAX;

/// Between the buyer and the client's id in a scoped key: outside the client's grammar.
const SCOPE_SEPARATOR: char = '/';

/// A client's stable identifier of one purchase intent, the idempotency key of the whole
/// purchase path: 1–64 characters of `[A-Za-z0-9_.:-]`, so it is safe inside Redis keys,
/// SQL and logs without escaping.
///
/// Shared, not copied: a purchase's request_id travels with it through the gate, the
/// group commit, its in-flight entry, its answer and its trim, about ten clones an
/// order, each an allocation and a copy as a `String`.
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
        // predicate cost every purchase about 200 instructions more; the refusal's
        // message still names the whole character.
        if !raw.bytes().all(|b| REQUEST_ID_BYTES[usize::from(b)]) {
            let bad = raw.chars().find(|&c| !request_id_char(c)).unwrap_or('?');
            return Err(ParseError::new(
                field,
                format!("character {bad:?} is not allowed (use A-Z a-z 0-9 _ . : -)"),
            ));
        }
        Ok(Self(Arc::from(raw)))
    }

    /// The key of a buyer's own request: `{user}/{client}`. With buyers authenticated,
    /// idempotency is scoped by buyer, so another buyer's request_id is a new request of
    /// your own and reveals nothing. `/` is outside the client's grammar, so no client
    /// id can pose as a scoped key, and the buyer's part is the user id's digits.
    pub fn scoped(user: UserId, client: &RequestId) -> Self {
        debug_assert!(
            client.scope().is_none(),
            "a key is scoped once, by the buyer the request came from"
        );
        Self(Arc::from(format!("{user}{SCOPE_SEPARATOR}{client}")))
    }

    /// A key read back from a store: a client's request_id as it was sent (an admin's,
    /// or a buyer's when buyers are not authenticated), or a buyer-scoped key
    /// ([`RequestId::scoped`]).
    pub fn stored(field: &'static str, raw: &str) -> Result<Self, ParseError> {
        let Some((user, client)) = raw.split_once(SCOPE_SEPARATOR) else {
            return Self::parse(field, raw);
        };
        let digits =
            !user.is_empty() && !user.starts_with('0') && user.bytes().all(|b| b.is_ascii_digit());
        let user = digits
            .then(|| user.parse::<i64>().ok())
            .flatten()
            .filter(|u| *u > 0)
            .ok_or_else(|| ParseError::new(field, "a scoped key starts with a user id"))?;
        debug_assert!(user > 0);
        Self::parse(field, client)?;
        Ok(Self(Arc::from(raw)))
    }

    /// The whole key, as the stores keep it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The request_id as its client sent it: the key without its buyer.
    pub fn client(&self) -> &str {
        self.0
            .split_once(SCOPE_SEPARATOR)
            .map_or(&self.0, |(_, client)| client)
    }

    /// The buyer a scoped key belongs to; None for a key as its client sent it.
    pub fn scope(&self) -> Option<UserId> {
        let (user, _) = self.0.split_once(SCOPE_SEPARATOR)?;
        user.parse().ok().and_then(|u| UserId::parse(u).ok())
    }
}

/// Longest name of an admin token (`FLASHSALE_ADMIN_TOKENS`): short enough to read in a
/// log line, and within the operator's log's `admin` column (64).
pub const ADMIN_NAME_LEN_MAX: usize = 32;

/// Which admin token made an action, as the operator's log records it: 1–32 characters
/// of `[A-Za-z0-9_.-]`, so it reads plainly in logs and JSON.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AdminName(Arc<str>);

impl AdminName {
    pub fn parse(field: &'static str, raw: &str) -> Result<Self, ParseError> {
        let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
        if raw.is_empty() || raw.len() > ADMIN_NAME_LEN_MAX || !raw.chars().all(allowed) {
            return Err(ParseError::new(
                field,
                format!("an admin's name is 1 to {ADMIN_NAME_LEN_MAX} of A-Z a-z 0-9 _ . -"),
            ));
        }
        Ok(Self(Arc::from(raw)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The name of the one token `FLASHSALE_ADMIN_TOKEN` sets.
impl Default for AdminName {
    fn default() -> Self {
        Self(Arc::from("admin"))
    }
}

impl fmt::Display for AdminName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Which form a ledger's purchase keys take; one ledger holds one form, so that every
/// instance finds a retry under the key its first attempt was written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestScope {
    /// The request_id as the client sent it, one namespace for every buyer: buyers are
    /// not authenticated, so anyone can act as anyone, and a scope would protect nothing.
    Global,
    /// `{user_id}/{request_id}` ([`RequestId::scoped`]): buyers are authenticated, and
    /// each one's request_ids are their own.
    Buyer,
}

impl RequestScope {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Global => "global",
            Self::Buyer => "buyer",
        }
    }

    /// The scope recorded in a ledger, as [`RequestScope::as_str`] wrote it.
    pub fn from_stored(raw: &str) -> Option<Self> {
        [Self::Global, Self::Buyer]
            .into_iter()
            .find(|s| s.as_str() == raw)
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

    // Checks a buyer-scoped key: it is `{user}/{id}`, gives back the client's id and its
    // buyer, reads back from a store as itself, and no malformed scoped key (no user, a
    // zero or signed or padded user, a bad client part) is read back.
    #[test]
    fn scoped_keys() {
        let client = RequestId::parse("request_id", "REQ_1").expect("valid");
        let user = UserId::parse(42).expect("valid");
        let key = RequestId::scoped(user, &client);
        assert_eq!(key.as_str(), "42/REQ_1");
        assert_eq!(key.client(), "REQ_1");
        assert_eq!(key.scope(), Some(user));
        assert_eq!(client.client(), "REQ_1");
        assert_eq!(client.scope(), None);
        assert_ne!(
            key,
            RequestId::scoped(UserId::parse(43).expect("valid"), &client)
        );
        assert_eq!(RequestId::stored("request_id", "42/REQ_1"), Ok(key));
        assert_eq!(RequestId::stored("request_id", "REQ_1"), Ok(client));
        let widest = RequestId::scoped(
            UserId::parse(i64::MAX).expect("valid"),
            &RequestId::parse("request_id", &"x".repeat(64)).expect("valid"),
        );
        assert_eq!(widest.as_str().len(), REQUEST_KEY_LEN_MAX);
        for bad in [
            "/R", "0/R", "-1/R", "+1/R", "01/R", "1/", "1/a b", "1/2/R", "x/R",
        ] {
            assert!(RequestId::stored("request_id", bad).is_err(), "{bad:?}");
        }
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
