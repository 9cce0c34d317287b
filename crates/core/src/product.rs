//! A product's sale definition: stock, per-user limit, sale window.

use chrono::{DateTime, NaiveDate, NaiveDateTime, NaiveTime, SubsecRound, Utc};

use crate::ids::{ParseError, ProductId};

/// Largest stock one product may have; keeps every counter far from integer overflow in
/// Redis (i64), Lua (doubles exact to 2^53) and MariaDB (BIGINT).
pub const STOCK_MAX: i64 = 1_000_000_000;
/// Longest product name accepted (the `products.name` column width).
pub const NAME_LEN_MAX: usize = 200;

/// Bidirectional formatting characters (embeddings and overrides U+202A–U+202E, isolates
/// U+2066–U+2069, the marks U+200E, U+200F and U+061C): refused in a name, where they
/// would reorder how the name, and the text after it, is shown in a console or a log.
const BIDI_FORMATTING: [char; 12] = [
    '\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}', '\u{202E}', '\u{2066}', '\u{2067}', '\u{2068}',
    '\u{2069}', '\u{200E}', '\u{200F}', '\u{061C}',
];

/// Invisible characters and line breaks outside the control characters: the zero-width
/// space U+200B, the word joiner U+2060 and the byte order mark U+FEFF (a name that looks
/// like another one but is not equal to it), and the line and paragraph separators
/// U+2028 and U+2029 (a line break to a log or a console, like a newline). The joiners
/// U+200C and U+200D are kept on purpose: Persian and Indic names are spelt with them, and
/// emoji sequences (a family, a flag) are joined by them.
const INVISIBLE: [char; 5] = ['\u{200B}', '\u{2060}', '\u{FEFF}', '\u{2028}', '\u{2029}'];

/// Largest per-user limit accepted: the ledger and the gate keep it as an unsigned 32-bit
/// count.
pub const PER_USER_LIMIT_MAX: i64 = u32::MAX as i64;

/// Whether `c` may appear in a product name: neither a control character (Unicode
/// category Cc, NUL, ESC and DEL among them: they end strings, drive terminals, split log
/// lines), nor a bidirectional formatting character, nor an [`INVISIBLE`] one.
fn allowed_in_name(c: char) -> bool {
    !c.is_control() && !BIDI_FORMATTING.contains(&c) && !INVISIBLE.contains(&c)
}

/// Earliest sale window bound accepted: the first instant MariaDB's `DATETIME` stores
/// (`products.sale_starts_at`, `sale_ends_at`), so every accepted window is stored exactly.
pub const SALE_TIME_MIN: DateTime<Utc> = utc(1000, 1, 1, 0, 0, 0, 0);
/// Latest sale window bound accepted: the last instant MariaDB's `DATETIME(6)` stores.
pub const SALE_TIME_MAX: DateTime<Utc> = utc(9999, 12, 31, 23, 59, 59, 999_999);

/// A UTC instant from its fields, for the constants above (invalid fields fail the build).
const fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32, micro: u32) -> DateTime<Utc> {
    let (Some(date), Some(time)) = (
        NaiveDate::from_ymd_opt(y, mo, d),
        NaiveTime::from_hms_micro_opt(h, mi, s, micro),
    ) else {
        panic!("invalid date or time");
    };
    DateTime::from_naive_utc_and_offset(NaiveDateTime::new(date, time), Utc)
}

/// Nanoseconds in a second: chrono writes a leap second as a fraction of this or more.
const NANOS_PER_SECOND: u32 = 1_000_000_000;

/// Fractional digits of a second the sale window keeps: the columns' `DATETIME(6)`.
const SALE_TIME_DIGITS: u16 = 6;

/// A sale window bound cut to the microsecond (the columns' precision; clients commonly
/// send nanoseconds, and a sale moved by less than a microsecond is the same sale), if
/// within [`SALE_TIME_MIN`, `SALE_TIME_MAX`] and not a leap second (which `DATETIME` has
/// no place for): what is kept is exactly what the ledger stores and the API shows; a
/// bound it could not hold is refused, never stored as something else.
fn sale_time(field: &'static str, at: DateTime<Utc>) -> Result<DateTime<Utc>, ParseError> {
    let at = at.trunc_subsecs(SALE_TIME_DIGITS);
    if !(SALE_TIME_MIN..=SALE_TIME_MAX).contains(&at) {
        return Err(ParseError::new(
            field,
            "must be between 1000-01-01T00:00:00Z and 9999-12-31T23:59:59.999999Z",
        ));
    }
    if at.timestamp_subsec_nanos() >= NANOS_PER_SECOND {
        return Err(ParseError::new(field, "must not be a leap second"));
    }
    Ok(at)
}

/// When a product may be bought: `[starts_at, ends_at)`, either end open; each bound
/// within [`SALE_TIME_MIN`, `SALE_TIME_MAX`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SaleWindow {
    pub starts_at: Option<DateTime<Utc>>,
    pub ends_at: Option<DateTime<Utc>>,
}

impl SaleWindow {
    pub fn new(
        starts_at: Option<DateTime<Utc>>,
        ends_at: Option<DateTime<Utc>>,
    ) -> Result<Self, ParseError> {
        let starts_at = starts_at
            .map(|at| sale_time("sale_starts_at", at))
            .transpose()?;
        let ends_at = ends_at
            .map(|at| sale_time("sale_ends_at", at))
            .transpose()?;
        if let (Some(s), Some(e)) = (starts_at, ends_at) {
            if e <= s {
                return Err(ParseError::new(
                    "sale_ends_at",
                    "must be later than sale_starts_at",
                ));
            }
        }
        Ok(Self { starts_at, ends_at })
    }

    pub fn is_open_at(&self, now: DateTime<Utc>) -> bool {
        self.starts_at.is_none_or(|s| now >= s) && self.ends_at.is_none_or(|e| now < e)
    }
}

/// A validated request to put a product on sale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewProduct {
    pub product_id: ProductId,
    pub name: String,
    pub stock: i64,
    /// Most units one user may hold across live (unpaid or paid) orders; None = no limit.
    pub per_user_limit: Option<u32>,
    pub window: SaleWindow,
}

impl NewProduct {
    pub fn parse(
        product_id: i64,
        name: &str,
        stock: i64,
        per_user_limit: Option<i64>,
        window: SaleWindow,
    ) -> Result<Self, ParseError> {
        let product_id = ProductId::parse(product_id)?;
        let name = parse_name(name)?;
        if !(0..=STOCK_MAX).contains(&stock) {
            return Err(ParseError::new(
                "stock",
                format!("must be between 0 and {STOCK_MAX}"),
            ));
        }
        let per_user_limit = per_user_limit.map(parse_limit).transpose()?;
        Ok(Self {
            product_id,
            name,
            stock,
            per_user_limit,
            window,
        })
    }
}

/// A product's name, trimmed, if allowed: 1 to [`NAME_LEN_MAX`] characters, none of them
/// a control, bidirectional formatting or invisible one.
fn parse_name(name: &str) -> Result<String, ParseError> {
    // The whole input, before trimming: a control character is refused even at an end.
    if !name.chars().all(allowed_in_name) {
        return Err(ParseError::new(
            "name",
            "must not contain control, bidirectional formatting or invisible characters \
             (zero-width space, word joiner, byte order mark, line or paragraph separator)",
        ));
    }
    let name = name.trim();
    if name.is_empty() || name.chars().count() > NAME_LEN_MAX {
        return Err(ParseError::new(
            "name",
            format!("must be 1 to {NAME_LEN_MAX} characters"),
        ));
    }
    Ok(name.to_owned())
}

/// A per-user limit, if within 1 to [`PER_USER_LIMIT_MAX`].
fn parse_limit(n: i64) -> Result<u32, ParseError> {
    u32::try_from(n).ok().filter(|n| *n >= 1).ok_or_else(|| {
        ParseError::new(
            "per_user_limit",
            format!("must be between 1 and {PER_USER_LIMIT_MAX}"),
        )
    })
}

/// What an operator may change of a product once it exists: its name, per-user limit
/// and sale window (the stock moves by restocks).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Definition {
    pub name: String,
    pub per_user_limit: Option<u32>,
    pub sale_starts_at: Option<DateTime<Utc>>,
    pub sale_ends_at: Option<DateTime<Utc>>,
}

impl Definition {
    /// The window the definition's bounds make (already checked when they were stored).
    pub fn window(&self) -> SaleWindow {
        SaleWindow {
            starts_at: self.sale_starts_at,
            ends_at: self.sale_ends_at,
        }
    }
}

/// A change to a [`Definition`], as a PATCH asks for it: each field absent (`None`: kept)
/// or given (`Some`), a limit or a bound given as `None` taken off. Each given value is
/// checked as at creation; the window is checked whole against the product's when the
/// change is applied ([`ProductChange::apply`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct ProductChange {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    per_user_limit: Option<Option<u32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sale_starts_at: Option<Option<DateTime<Utc>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sale_ends_at: Option<Option<DateTime<Utc>>>,
}

/// A bound of a change: kept, taken off, or moved to an instant in range.
type BoundChange = Option<Option<DateTime<Utc>>>;

impl ProductChange {
    pub fn parse(
        name: Option<&str>,
        per_user_limit: Option<Option<i64>>,
        sale_starts_at: BoundChange,
        sale_ends_at: BoundChange,
    ) -> Result<Self, ParseError> {
        let bound = |field, b: BoundChange| {
            b.map(|at| at.map(|at| sale_time(field, at)).transpose())
                .transpose()
        };
        let change = Self {
            name: name.map(parse_name).transpose()?,
            per_user_limit: per_user_limit
                .map(|l| l.map(parse_limit).transpose())
                .transpose()?,
            sale_starts_at: bound("sale_starts_at", sale_starts_at)?,
            sale_ends_at: bound("sale_ends_at", sale_ends_at)?,
        };
        if change == Self::default() {
            return Err(ParseError::new(
                "request",
                "names nothing to change (name, per_user_limit, sale_starts_at, sale_ends_at)",
            ));
        }
        Ok(change)
    }

    /// `before` with the change made, if its window is still a window (the end after the
    /// start).
    pub fn apply(&self, before: &Definition) -> Result<Definition, ParseError> {
        let after = Definition {
            name: self.name.clone().unwrap_or_else(|| before.name.clone()),
            per_user_limit: self.per_user_limit.unwrap_or(before.per_user_limit),
            sale_starts_at: self.sale_starts_at.unwrap_or(before.sale_starts_at),
            sale_ends_at: self.sale_ends_at.unwrap_or(before.sale_ends_at),
        };
        SaleWindow::new(after.sale_starts_at, after.sale_ends_at)?;
        Ok(after)
    }
}

/// Validates a restock quantity: positive and at most [`STOCK_MAX`]; the ledger refuses a
/// restock that would push the product's total past [`STOCK_MAX`].
pub fn parse_restock(quantity: i64) -> Result<i64, ParseError> {
    if !(1..=STOCK_MAX).contains(&quantity) {
        return Err(ParseError::new(
            "quantity",
            format!("must be between 1 and {STOCK_MAX}"),
        ));
    }
    Ok(quantity)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(h: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 29, h, 0, 0)
            .single()
            .expect("valid")
    }

    // Checks a change as PATCH makes it: absent fields kept, a null limit or bound taken
    // off, each value checked as at creation, the window checked whole against the
    // product's, and a change of nothing refused.
    #[test]
    fn a_change_keeps_what_it_does_not_name() {
        let before = Definition {
            name: "Phone".into(),
            per_user_limit: Some(2),
            sale_starts_at: Some(at(10)),
            sale_ends_at: Some(at(12)),
        };
        let limit = ProductChange::parse(None, Some(Some(1)), None, None).expect("valid");
        let after = limit.apply(&before).expect("applies");
        assert_eq!(
            (after.per_user_limit, after.name.as_str()),
            (Some(1), "Phone")
        );
        assert_eq!(after.window(), before.window());
        let off = ProductChange::parse(Some(" Tablet "), Some(None), None, Some(None));
        let after = off.expect("valid").apply(&before).expect("applies");
        assert_eq!(after.name, "Tablet");
        assert_eq!((after.per_user_limit, after.sale_ends_at), (None, None));
        let early_end = ProductChange::parse(None, None, None, Some(Some(at(9))));
        let refused = early_end.expect("valid alone").apply(&before);
        assert_eq!(refused.expect_err("before the start").field, "sale_ends_at");
        for bad in [
            ProductChange::parse(None, None, None, None),
            ProductChange::parse(Some(""), None, None, None),
            ProductChange::parse(None, Some(Some(0)), None, None),
            ProductChange::parse(None, Some(Some(PER_USER_LIMIT_MAX + 1)), None, None),
        ] {
            assert!(bad.is_err(), "{bad:?}");
        }
    }

    // Checks the half-open sale window [start, end): open at start, closed at end, and an
    // absent bound never closes it; an end not after the start is refused.
    #[test]
    fn sale_window_is_half_open() {
        let w = SaleWindow::new(Some(at(10)), Some(at(11))).expect("valid");
        assert!(!w.is_open_at(at(9)));
        assert!(w.is_open_at(at(10)));
        assert!(!w.is_open_at(at(11)));
        assert!(SaleWindow::default().is_open_at(at(0)));
        assert!(SaleWindow::new(None, Some(at(1)))
            .expect("ok")
            .is_open_at(at(0)));
        assert_eq!(
            SaleWindow::new(Some(at(11)), Some(at(11)))
                .unwrap_err()
                .field,
            "sale_ends_at"
        );
    }

    // Checks each field's validation of a new product names the field at fault.
    #[test]
    fn new_product_validation() {
        let w = SaleWindow::default();
        assert!(NewProduct::parse(1, "Phone", 1000, Some(1), w).is_ok());
        assert!(NewProduct::parse(1, "Phone", 0, None, w).is_ok());
        let cases = [
            (NewProduct::parse(0, "x", 1, None, w), "product_id"),
            (NewProduct::parse(1, "  ", 1, None, w), "name"),
            (NewProduct::parse(1, &"n".repeat(201), 1, None, w), "name"),
            (NewProduct::parse(1, "x", -1, None, w), "stock"),
            (NewProduct::parse(1, "x", STOCK_MAX + 1, None, w), "stock"),
            (NewProduct::parse(1, "x", 1, Some(0), w), "per_user_limit"),
            (
                NewProduct::parse(1, "x", 1, Some(PER_USER_LIMIT_MAX + 1), w),
                "per_user_limit",
            ),
        ];
        for (result, field) in cases {
            assert_eq!(result.unwrap_err().field, field);
        }
        // The message names the upper bound, not only positivity.
        let over = NewProduct::parse(1, "x", 1, Some(i64::MAX), w).unwrap_err();
        assert!(over.to_string().contains("4294967295"), "{over}");
        let most = NewProduct::parse(1, "x", 1, Some(PER_USER_LIMIT_MAX), w);
        assert_eq!(most.expect("the bound").per_user_limit, Some(u32::MAX));
    }

    // Checks the sale window's range: both ends of [SALE_TIME_MIN, SALE_TIME_MAX] are
    // accepted as either bound (so 1960 and 2040, outside TIMESTAMP's 1970–2038, are too),
    // kept as given; a microsecond outside either end is refused naming the field, and so
    // is a leap second, which the columns cannot hold; a bound finer than a microsecond
    // is cut to the microsecond (so the last nanosecond of 9999 is still in range).
    #[test]
    fn sale_window_range() {
        let micro = chrono::Duration::microseconds(1);
        let parsed = |s: &str| s.parse::<DateTime<Utc>>().expect("RFC 3339");
        assert_eq!(SALE_TIME_MIN, parsed("1000-01-01T00:00:00Z"));
        assert_eq!(SALE_TIME_MAX, parsed("9999-12-31T23:59:59.999999Z"));
        let edges = [
            (SALE_TIME_MIN, SALE_TIME_MIN + micro),
            (SALE_TIME_MAX - micro, SALE_TIME_MAX),
            (
                parsed("1960-01-01T00:00:00Z"),
                parsed("1961-01-01T00:00:00Z"),
            ),
            (
                parsed("2040-01-01T10:00:00Z"),
                parsed("2040-01-01T12:00:00Z"),
            ),
        ];
        for (s, e) in edges {
            let w = SaleWindow::new(Some(s), Some(e)).expect("within the range");
            assert_eq!((w.starts_at, w.ends_at), (Some(s), Some(e)));
        }
        let refused = [
            SALE_TIME_MIN - micro,
            SALE_TIME_MAX + micro,
            parsed("+262142-01-01T00:00:00Z"),
            parsed("0999-12-31T23:59:59.999999999Z"),
            parsed("2016-12-31T23:59:60Z"),
        ];
        for at in refused {
            assert_eq!(
                SaleWindow::new(Some(at), None).unwrap_err().field,
                "sale_starts_at",
                "{at:?}"
            );
            assert_eq!(
                SaleWindow::new(None, Some(at)).unwrap_err().field,
                "sale_ends_at",
                "{at:?}"
            );
        }
        let cut = SaleWindow::new(
            Some(parsed("2040-01-01T10:00:00.123456789Z")),
            Some(parsed("9999-12-31T23:59:59.999999999Z")),
        )
        .expect("cut to the microsecond, within the range");
        assert_eq!(cut.starts_at, Some(parsed("2040-01-01T10:00:00.123456Z")));
        assert_eq!(cut.ends_at, Some(SALE_TIME_MAX));
    }

    // Checks a name with any control character (category Cc: NUL, ESC, DEL, C1's NEL,
    // also a newline at an end, which trimming would otherwise hide), any bidirectional
    // formatting character or any invisible one (zero-width space, word joiner, BOM, line
    // and paragraph separators) is refused naming the field, while other non-ASCII text
    // (accents, CJK, emoji, Arabic and Hebrew letters, inner spaces, and the joiners of
    // Persian spelling and emoji sequences) is accepted.
    #[test]
    fn name_refuses_control_bidi_and_invisible_characters() {
        let w = SaleWindow::default();
        let kept = ["Téléphone", "手机 Pro", "📱 Phone", "هاتف", "טלפון", "A  B"];
        let joined = ["می\u{200C}خواهم", "👨\u{200D}👩\u{200D}👧 set"];
        for ok in kept.into_iter().chain(joined) {
            assert_eq!(NewProduct::parse(1, ok, 1, None, w).expect(ok).name, ok);
        }
        let mut refused: Vec<char> = vec!['\0', '\u{1B}', '\u{7F}', '\u{85}', '\u{9F}', '\t'];
        refused.extend(BIDI_FORMATTING);
        refused.extend(INVISIBLE);
        for c in refused {
            for name in [format!("ab{c}cd"), format!("{c}abc"), format!("abc{c}")] {
                assert_eq!(
                    NewProduct::parse(1, &name, 1, None, w).unwrap_err().field,
                    "name",
                    "{name:?}"
                );
            }
        }
        assert_eq!(
            BIDI_FORMATTING.len(),
            5 + 4 + 3,
            "U+202A–E, U+2066–9, three marks"
        );
        assert!(NewProduct::parse(1, "Phone\n", 1, None, w).is_err());
    }

    // Checks restock bounds: 1..=STOCK_MAX.
    #[test]
    fn restock_bounds() {
        assert_eq!(parse_restock(5), Ok(5));
        assert_eq!(parse_restock(STOCK_MAX), Ok(STOCK_MAX));
        assert_eq!(parse_restock(0).unwrap_err().field, "quantity");
        assert!(parse_restock(-3).is_err());
        assert!(parse_restock(STOCK_MAX + 1).is_err());
    }
}
