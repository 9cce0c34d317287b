//! Shapes of requests and responses: the JSON bodies, and the decimal ids of paths and
//! headers. Each body also derives its OpenAPI schema (`utoipa::ToSchema`, gathered in
//! `openapi.rs`), with the bounds the domain's parsers enforce, so that the document
//! says what is accepted and a fuzzer's valid input is valid here. A body's unknown
//! field is refused (`deny_unknown_fields`, `additionalProperties: false` in the
//! document): were it ignored, a misspelt optional field such as `sale_starts_at` or
//! `per_user_limit` would silently take its default, opening a sale at once or without
//! its limit.

use std::borrow::Cow;

use chrono::{DateTime, Datelike, SecondsFormat, Timelike, Utc};
use flashsale_app::{Order, ProductView};
use serde::{Deserialize, Serialize, Serializer};
use utoipa::ToSchema;

use crate::openapi::{cancel_reason_schema, order_status_schema, stock_mode_schema};

/// A purchase as sent; `request_id` borrowed from the body when it has no escapes (the
/// flood's refusals then allocate nothing for it: `RequestId` copies it only once checked).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = Purchase, description = "A purchase: `quantity` units of a product for a buyer.")]
pub struct PurchaseBody<'a> {
    /// The purchase's idempotency key: a retry with the same one and the same payload
    /// answers the same order (200), with another payload `request_id_conflict`. With
    /// buyer authentication it is the buyer's own: another buyer's same request_id is
    /// another purchase.
    #[serde(borrow)]
    #[schema(value_type = String, min_length = 1, max_length = 64, pattern = r"^[A-Za-z0-9_.:-]+$")]
    pub request_id: Cow<'a, str>,
    /// The buyer. Required when no buyer authentication is configured (the default, and
    /// what this document describes); with one, it may be left out, and if given must
    /// name the authenticated buyer (else 403). Never null.
    #[schema(value_type = i64, required = true, format = Int64, minimum = 1)]
    pub user_id: Option<i64>,
    #[schema(format = Int64, minimum = 1)]
    pub product_id: i64,
    /// Units to buy: from 1 to the configured maximum per order
    /// (`FLASHSALE_MAX_QUANTITY_PER_ORDER`); more is `invalid_request`.
    #[schema(format = Int64, minimum = 1)]
    pub quantity: i64,
}

/// The body of a payment or a cancellation: the acting buyer, when not authenticated.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = OrderAction)]
pub struct UserBody {
    /// Required when no buyer authentication is configured (the default, and what this
    /// document describes); optional when the buyer is authenticated (it must then name
    /// that buyer). Never null.
    #[schema(value_type = i64, required = true, format = Int64, minimum = 1)]
    pub user_id: Option<i64>,
}

/// A strict decimal id, as paths and identity headers carry one: ASCII digits only, no
/// sign, no whitespace, no leading zero (but "0" itself, which the id's own parse then
/// refuses), at most what an `i64` holds. One spelling per id, so `/v1/orders/06` and
/// `/v1/orders/+6` are not another name of order 6.
pub fn decimal(s: &str) -> Option<i64> {
    let strict =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    strict.then(|| s.parse().ok()).flatten()
}

/// A product to put on sale (admin).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = NewProduct)]
pub struct NewProductBody {
    /// Chosen by the shop; taken once (`product_exists`).
    #[schema(format = Int64, minimum = 1)]
    pub product_id: i64,
    /// 1 to 200 characters once trimmed of surrounding whitespace; no control characters
    /// (Unicode Cc), no bidirectional formatting characters and no invisible ones. The
    /// pattern says so (`NewProduct::parse`): none of those characters (C0, DEL, C1, the
    /// bidi marks and embeddings, the zero-width space U+200B, the word joiner U+2060, the
    /// byte order mark U+FEFF, the line and paragraph separators U+2028 and U+2029)
    /// anywhere, and something besides whitespace.
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = r"^[^\u0000-\u001F\u007F-\u009F\u061C\u200B\u200E\u200F\u2028\u2029\u202A-\u202E\u2060\u2066-\u2069\uFEFF]*[^\s\u0000-\u001F\u007F-\u009F\u061C\u200B\u200E\u200F\u2028\u2029\u202A-\u202E\u2060\u2066-\u2069\uFEFF][^\u0000-\u001F\u007F-\u009F\u061C\u200B\u200E\u200F\u2028\u2029\u202A-\u202E\u2060\u2066-\u2069\uFEFF]*$"
    )]
    pub name: String,
    #[schema(format = Int64, minimum = 0, maximum = 1_000_000_000)]
    pub stock: i64,
    /// Most units one buyer may hold across live orders; absent or null: no limit.
    #[schema(format = Int64, minimum = 1, maximum = 4_294_967_295_i64)]
    pub per_user_limit: Option<i64>,
    /// Start of the sale window `[starts, ends)`, RFC 3339, kept to the microsecond,
    /// between 1000-01-01T00:00:00Z and 9999-12-31T23:59:59.999999Z; absent: open. The
    /// pattern says what the range and MariaDB's DATETIME allow: a year from 1000
    /// (`SALE_TIME_MIN`'s), real months, days and hours, seconds below 60 (no leap
    /// second); an offset can still carry a bound just outside the range, which the
    /// parser refuses.
    #[schema(
        pattern = r"^[1-9][0-9]{3}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})$"
    )]
    pub sale_starts_at: Option<DateTime<Utc>>,
    /// End of the sale window, later than its start, in the same range; absent: open.
    #[schema(
        pattern = r"^[1-9][0-9]{3}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})$"
    )]
    pub sale_ends_at: Option<DateTime<Utc>>,
}

/// A change to a product (admin), once per `request_id`: each field absent is kept, a
/// `per_user_limit` or a bound given as null is taken off. At least one field besides
/// the request_id. Each value is checked as at creation, and the window whole (its end
/// after its start, the unchanged bound included).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = ProductPatch)]
pub struct ProductPatchBody {
    /// The change's idempotency key: a retry changes nothing again; another change (or
    /// action, or product) under it is `request_id_conflict`.
    #[schema(min_length = 1, max_length = 64, pattern = r"^[A-Za-z0-9_.:-]+$")]
    pub request_id: String,
    /// As at creation: 1 to 200 characters once trimmed, none of them a control,
    /// bidirectional formatting or invisible character.
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = r"^[^\u0000-\u001F\u007F-\u009F\u061C\u200B\u200E\u200F\u2028\u2029\u202A-\u202E\u2060\u2066-\u2069\uFEFF]*[^\s\u0000-\u001F\u007F-\u009F\u061C\u200B\u200E\u200F\u2028\u2029\u202A-\u202E\u2060\u2066-\u2069\uFEFF][^\u0000-\u001F\u007F-\u009F\u061C\u200B\u200E\u200F\u2028\u2029\u202A-\u202E\u2060\u2066-\u2069\uFEFF]*$"
    )]
    pub name: Option<String>,
    /// Most units one buyer may hold across live orders; null: no limit. Lowered, it
    /// refuses new purchases over it and cancels no order.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<i64>, nullable, format = Int64, minimum = 1, maximum = 4_294_967_295_i64)]
    pub per_user_limit: Option<Option<i64>>,
    /// Start of the sale window, as at creation; null: open.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<DateTime<Utc>>, nullable, pattern = r"^[1-9][0-9]{3}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})$")]
    pub sale_starts_at: Option<Option<DateTime<Utc>>>,
    /// End of the sale window, as at creation; null: open. Now ends the sale now.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<DateTime<Utc>>, nullable, pattern = r"^[1-9][0-9]{3}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt]([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})$")]
    pub sale_ends_at: Option<Option<DateTime<Utc>>>,
}

/// A field that is present, null or not: `Some(None)` for null, so that null (take off)
/// is told from absent (`None` by `#[serde(default)]`: keep).
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// Stock to add to a product (admin), once per `request_id`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = Restock)]
pub struct RestockBody {
    /// The restock's idempotency key: a retry adds nothing again; another quantity under
    /// it is `request_id_conflict`.
    #[schema(min_length = 1, max_length = 64, pattern = r"^[A-Za-z0-9_.:-]+$")]
    pub request_id: String,
    /// Units to add, at most 1 000 000 000, and the total may not pass that either.
    #[schema(format = Int64, minimum = 1, maximum = 1_000_000_000)]
    pub quantity: i64,
}

/// A destock: available units taken off sale, once per `request_id`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = Destock)]
pub struct DestockBody {
    /// The destock's idempotency key, of the operator's actions' namespace: a retry takes
    /// nothing again and answers the same; another quantity, or another action, under it
    /// is `request_id_conflict`.
    #[schema(min_length = 1, max_length = 64, pattern = r"^[A-Za-z0-9_.:-]+$")]
    pub request_id: String,
    /// Units to take off sale, at most 1 000 000 000: no more than are available (units
    /// held by orders or sold are never taken).
    #[schema(format = Int64, minimum = 1, maximum = 1_000_000_000)]
    pub quantity: i64,
}

/// An admin's action on a product (pause, resume), once per `request_id`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = AdminAction)]
pub struct ActionBody {
    /// The action's idempotency key: a retry does nothing again; another action (or
    /// another product) under it is `request_id_conflict`. Admins' request_ids are a
    /// namespace of their own, apart from purchases'.
    #[schema(min_length = 1, max_length = 64, pattern = r"^[A-Za-z0-9_.:-]+$")]
    pub request_id: String,
}

/// An admin's refund of a paid order, once per `request_id`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = Refund)]
pub struct RefundBody {
    /// The refund's idempotency key, in the admins' namespace (see `AdminAction`): a
    /// retry does nothing again; another action, another order or the other `restock`
    /// under it is `request_id_conflict`.
    #[schema(min_length = 1, max_length = 64, pattern = r"^[A-Za-z0-9_.:-]+$")]
    pub request_id: String,
    /// true: the units go back on sale at once; false: they leave the stock (its total
    /// drops by them).
    pub restock: bool,
}

/// A time in an answer, as chrono's `Serialize` writes it: RFC 3339 in UTC with `Z`, and
/// the fraction in 3, 6 or 9 digits, or none, the shortest that is exact (its
/// `SecondsFormat::AutoSi`). Written into a buffer here and handed over whole: chrono's
/// own impl goes through `collect_str`, one character at a time through serde_json's
/// escaping writer, about 3,500 instructions for an order's two times, and its
/// `to_rfc3339_opts` still about 1,200 a time. A year
/// outside 0–9999, which no stored time has, is left to chrono.
fn rfc3339<S: Serializer>(time: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&rfc3339_text(time, &mut [0; RFC3339_BYTES_MAX]))
}

/// The longest time [`rfc3339_digits`] writes: nanoseconds and the `Z`.
const RFC3339_BYTES_MAX: usize = 30;

/// [`rfc3339`]'s text: written into `text`, or chrono's own for a year outside 0–9999.
fn rfc3339_text<'a>(time: &DateTime<Utc>, text: &'a mut [u8; RFC3339_BYTES_MAX]) -> Cow<'a, str> {
    match rfc3339_digits(time, text) {
        Some(text) => Cow::Borrowed(text),
        None => Cow::Owned(time.to_rfc3339_opts(SecondsFormat::AutoSi, true)),
    }
}

/// [`rfc3339_text`] written into `text`; None for a year outside 0–9999.
fn rfc3339_digits<'a>(
    time: &DateTime<Utc>,
    text: &'a mut [u8; RFC3339_BYTES_MAX],
) -> Option<&'a str> {
    /// Writes `value`'s last `out.len()` decimal digits into `out`.
    fn digits(out: &mut [u8], mut value: u32) {
        for b in out.iter_mut().rev() {
            // A digit: value % 10 < 10.
            *b = b'0' + (value % 10) as u8;
            value /= 10;
        }
        // Each field fits its digits: a year ≤ 9999, a fraction below 10⁹.
        debug_assert_eq!(value, 0, "a time field wider than its {} digits", out.len());
    }
    // The stored UTC time itself: each of `DateTime`'s own accessors converts it first.
    let naive = time.naive_utc();
    let year = u32::try_from(naive.year()).ok().filter(|&y| y <= 9999)?;
    let (mut second, mut nano) = (naive.second(), naive.nanosecond());
    // A leap second is second 59 with a nanosecond past 10⁹; chrono writes it as 60.
    if nano >= 1_000_000_000 {
        second += 1;
        nano -= 1_000_000_000;
    }
    *text = *b"0000-00-00T00:00:00.000000000Z";
    digits(&mut text[0..4], year);
    digits(&mut text[5..7], naive.month());
    digits(&mut text[8..10], naive.day());
    digits(&mut text[11..13], naive.hour());
    digits(&mut text[14..16], naive.minute());
    digits(&mut text[17..19], second);
    let end = match nano {
        0 => 19,
        n if n % 1_000_000 == 0 => {
            digits(&mut text[20..23], n / 1_000_000);
            23
        }
        n if n % 1_000 == 0 => {
            digits(&mut text[20..26], n / 1_000);
            26
        }
        n => {
            digits(&mut text[20..29], n);
            29
        }
    };
    text[end] = b'Z';
    // Digits and ASCII separators only.
    let written = std::str::from_utf8(&text[..=end]).ok();
    debug_assert!(written.is_some(), "an RFC 3339 time of ASCII digits");
    written
}

/// [`rfc3339`], or null.
fn rfc3339_or_null<S: Serializer>(time: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
    match time {
        Some(time) => rfc3339(time, s),
        None => s.serialize_none(),
    }
}

/// An order: what a purchase created, as it stands now.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Order)]
pub struct OrderJson {
    #[schema(format = Int64, minimum = 1)]
    pub order_id: i64,
    /// The purchase's idempotency key.
    #[schema(min_length = 1, max_length = 64, pattern = r"^[A-Za-z0-9_.:-]+$")]
    pub request_id: String,
    #[schema(format = Int64, minimum = 1)]
    pub user_id: i64,
    #[schema(format = Int64, minimum = 1)]
    pub product_id: i64,
    #[schema(format = Int64, minimum = 1, maximum = 4_294_967_295_i64)]
    pub quantity: u32,
    #[schema(schema_with = order_status_schema)]
    pub status: &'static str,
    #[serde(serialize_with = "rfc3339")]
    pub created_at: DateTime<Utc>,
    /// The payment deadline: unpaid past it, the order is cancelled (`payment_timeout`).
    #[serde(serialize_with = "rfc3339")]
    pub expires_at: DateTime<Utc>,
    /// Present once paid.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "rfc3339_or_null"
    )]
    #[schema(value_type = String, format = DateTime)]
    pub paid_at: Option<DateTime<Utc>>,
    /// Present once cancelled.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "rfc3339_or_null"
    )]
    #[schema(value_type = String, format = DateTime)]
    pub cancelled_at: Option<DateTime<Utc>>,
    /// Present once cancelled: why.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = cancel_reason_schema)]
    pub cancel_reason: Option<&'static str>,
    /// Present once refunded by the operator.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "rfc3339_or_null"
    )]
    #[schema(value_type = String, format = DateTime)]
    pub refunded_at: Option<DateTime<Utc>>,
}

impl From<&Order> for OrderJson {
    fn from(o: &Order) -> Self {
        Self {
            order_id: o.order_id.get(),
            request_id: o.request_id.client().to_owned(),
            user_id: o.user_id.get(),
            product_id: o.product_id.get(),
            quantity: o.quantity.get(),
            status: o.status.as_str(),
            created_at: o.created_at,
            expires_at: o.expires_at,
            paid_at: o.paid_at,
            cancelled_at: o.cancelled_at,
            cancel_reason: o.cancel_reason.map(|r| r.as_str()),
            refunded_at: o.refunded_at,
        }
    }
}

/// Largest answer body [`order_body`] reserves room for up front: an order with every
/// field, a 64-character request_id and 19-digit ids is about 400 bytes.
const ORDER_BODY_BYTES: usize = 512;

/// An order's answer body: the bytes serde_json writes for `OrderJson::from(order)` (a
/// test checks every shape), written by pushes. serde_json writes each key and string
/// value through its escaping writer: about 6,000 instructions for a purchase's answer,
/// a twentieth of a durable order's. Nothing here needs
/// escaping: the keys and the status and reason names are fixed ASCII, and a
/// `RequestId` holds only `[A-Za-z0-9_.:-]`.
pub fn order_body(o: &Order) -> Vec<u8> {
    fn time(out: &mut Vec<u8>, key: &str, time: &DateTime<Utc>) {
        out.extend_from_slice(key.as_bytes());
        out.push(b'"');
        out.extend_from_slice(rfc3339_text(time, &mut [0; RFC3339_BYTES_MAX]).as_bytes());
        out.push(b'"');
    }
    let mut integers = itoa::Buffer::new();
    let mut out = Vec::with_capacity(ORDER_BODY_BYTES);
    out.extend_from_slice(b"{\"order_id\":");
    out.extend_from_slice(integers.format(o.order_id.get()).as_bytes());
    out.extend_from_slice(b",\"request_id\":\"");
    // The request_id as its client sent it: a buyer-scoped key's buyer is `user_id`.
    let request_id = o.request_id.client();
    debug_assert!(!request_id
        .bytes()
        .any(|b| b == b'"' || b == b'\\' || b < 0x20));
    out.extend_from_slice(request_id.as_bytes());
    out.extend_from_slice(b"\",\"user_id\":");
    out.extend_from_slice(integers.format(o.user_id.get()).as_bytes());
    out.extend_from_slice(b",\"product_id\":");
    out.extend_from_slice(integers.format(o.product_id.get()).as_bytes());
    out.extend_from_slice(b",\"quantity\":");
    out.extend_from_slice(integers.format(o.quantity.get()).as_bytes());
    out.extend_from_slice(b",\"status\":\"");
    out.extend_from_slice(o.status.as_str().as_bytes());
    out.push(b'"');
    time(&mut out, ",\"created_at\":", &o.created_at);
    time(&mut out, ",\"expires_at\":", &o.expires_at);
    if let Some(paid_at) = &o.paid_at {
        time(&mut out, ",\"paid_at\":", paid_at);
    }
    if let Some(cancelled_at) = &o.cancelled_at {
        time(&mut out, ",\"cancelled_at\":", cancelled_at);
    }
    if let Some(reason) = o.cancel_reason {
        out.extend_from_slice(b",\"cancel_reason\":\"");
        out.extend_from_slice(reason.as_str().as_bytes());
        out.push(b'"');
    }
    if let Some(refunded_at) = &o.refunded_at {
        time(&mut out, ",\"refunded_at\":", refunded_at);
    }
    out.push(b'}');
    out
}

/// A product's units: `total` = `available` + `reserved` + `sold` (as of the read).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Inventory)]
pub struct InventoryJson {
    #[schema(format = Int64)]
    pub total: i64,
    #[schema(format = Int64)]
    pub available: i64,
    #[schema(format = Int64)]
    pub reserved: i64,
    #[schema(format = Int64)]
    pub sold: i64,
}

/// A product, with its live inventory.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Product)]
pub struct ProductJson {
    #[schema(format = Int64, minimum = 1)]
    pub product_id: i64,
    pub name: String,
    /// Most units one buyer may hold across live orders; null: no limit.
    #[schema(required = true, format = Int64, minimum = 1, maximum = 4_294_967_295_i64)]
    pub per_user_limit: Option<u32>,
    /// Null: the sale has no start.
    #[serde(serialize_with = "rfc3339_or_null")]
    #[schema(required = true)]
    pub sale_starts_at: Option<DateTime<Utc>>,
    /// Null: the sale has no end.
    #[serde(serialize_with = "rfc3339_or_null")]
    #[schema(required = true)]
    pub sale_ends_at: Option<DateTime<Utc>>,
    #[serde(serialize_with = "rfc3339")]
    pub created_at: DateTime<Utc>,
    /// Who serves the stock now: `gate` (Redis) or `ledger` (MariaDB alone).
    #[schema(schema_with = stock_mode_schema)]
    pub stock_mode: &'static str,
    /// Whether the operator paused the sale: purchases answer `sale_paused` while it is.
    pub paused: bool,
    pub inventory: InventoryJson,
}

impl From<&ProductView> for ProductJson {
    fn from(v: &ProductView) -> Self {
        let p = &v.product;
        Self {
            product_id: p.product_id.get(),
            name: p.name.clone(),
            per_user_limit: p.per_user_limit,
            sale_starts_at: p.window.starts_at,
            sale_ends_at: p.window.ends_at,
            created_at: p.created_at,
            stock_mode: p.stock_mode.as_str(),
            paused: p.paused,
            inventory: InventoryJson {
                total: v.inventory.total,
                available: v.inventory.available,
                reserved: v.inventory.reserved,
                sold: v.inventory.sold,
            },
        }
    }
}

/// A page of products (admin): in id order, each with the ledger's counters.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ProductPage)]
pub struct ProductPageJson {
    /// Each with `inventory` as the ledger counts it: a unit held in Redis whose order
    /// is not written yet still counts as available here (`GET /v1/products/{id}` has
    /// the live count).
    pub products: Vec<ProductJson>,
    /// Pass as `cursor` for the next page; null on the last page.
    #[schema(required = true)]
    pub next_cursor: Option<String>,
}

/// A page of a buyer's orders, newest first.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = OrderPage)]
pub struct OrderPageJson {
    pub orders: Vec<OrderJson>,
    /// Pass as `cursor` for the next page; null on the last page.
    #[schema(required = true)]
    pub next_cursor: Option<String>,
}

/// A line of the operator's log.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = AdminActionRecord)]
pub struct LoggedActionJson {
    /// The line's id, in the log's order.
    #[schema(format = Int64, minimum = 1)]
    pub id: i64,
    /// The request_id the admin sent; null for a creation (its key is the product id).
    pub request_id: Option<String>,
    /// `create`, `restock`, `destock`, `pause`, `resume`, `patch` or `refund`.
    pub action: String,
    #[schema(format = Int64, minimum = 1)]
    pub product_id: i64,
    /// The name of the admin token that made it.
    pub admin: String,
    /// What was asked: a restock's or destock's `{"quantity"}`, a PATCH's fields, a
    /// refund's `{"order_id", "restock"}`; null for a creation, a pause or a resume.
    #[schema(value_type = Option<Object>, required = true)]
    pub asked: Option<serde_json::Value>,
    /// The state before the action: `{"paused": …}` for a pause or a resume, the
    /// definition (name, per_user_limit, sale_starts_at, sale_ends_at) for a PATCH, the
    /// counters for a restock or destock, the order's status and the counters for a
    /// refund; null for a creation.
    #[schema(value_type = Option<Object>, required = true)]
    pub before: serde_json::Value,
    /// The state after it, in the same form (a creation's: its definition and stock).
    #[schema(value_type = Object)]
    pub after: serde_json::Value,
    #[serde(serialize_with = "rfc3339")]
    pub acted_at: DateTime<Utc>,
}

impl LoggedActionJson {
    /// The line as the API shows it, its states as JSON objects (the ledger wrote them
    /// from serde_json, so they parse; one that does not shows as a string).
    pub fn of(a: &flashsale_app::LoggedAction) -> Self {
        let object = |text: &str| {
            serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.into()))
        };
        Self {
            id: a.id,
            request_id: a.request_id.as_ref().map(ToString::to_string),
            action: a.action.clone(),
            product_id: a.product_id.get(),
            admin: a.admin.to_string(),
            asked: a.asked.as_deref().map(object),
            before: object(&a.before),
            after: object(&a.after),
            acted_at: a.acted_at,
        }
    }
}

/// A page of the operator's log, newest first.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = AdminActionPage)]
pub struct ActionPageJson {
    pub actions: Vec<LoggedActionJson>,
    /// Pass as `cursor` for the next page; null on the last page.
    #[schema(required = true)]
    pub next_cursor: Option<String>,
}

/// The query of `GET /v1/admin/actions`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ActionsQuery {
    /// One product's actions only; absent: every product's.
    #[param(minimum = 1, format = Int64)]
    pub product_id: Option<i64>,
    /// Lines on the page, 1 to 100 (default 20).
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<u64>,
    /// The `next_cursor` of the page before; absent for the first page.
    #[param(pattern = r"^[1-9][0-9]{0,18}$")]
    pub cursor: Option<String>,
}

/// The query of `GET /v1/products`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ProductsQuery {
    /// Products on the page, 1 to 100 (default 20).
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<u64>,
    /// The `next_cursor` of the page before; absent for the first page.
    #[param(pattern = r"^[1-9][0-9]{0,18}$")]
    pub cursor: Option<String>,
}

/// The query of `GET /v1/orders`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct OrdersQuery {
    /// Whose orders. Required with the admin token, or without buyer authentication;
    /// with it, it may be left out, and if given must name the authenticated buyer.
    #[param(minimum = 1)]
    pub user_id: Option<i64>,
    /// Only orders in this state: `PENDING_PAYMENT`, `PAID` or `CANCELLED`.
    pub status: Option<String>,
    /// Orders on the page, 1 to 100 (default 20).
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<u64>,
    /// The `next_cursor` of the page before; absent for the first page.
    #[param(pattern = r"^[1-9][0-9]{0,18}$")]
    pub cursor: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer's times read exactly as chrono's own `Serialize` writes them: whole
    /// seconds, milliseconds, microseconds and nanoseconds, at both ends of the accepted
    /// range, a leap second, a year of one digit and one of five; and an absent one is
    /// null.
    #[test]
    fn times_are_written_as_chrono_writes_them() {
        #[derive(Serialize)]
        struct Ours {
            #[serde(serialize_with = "rfc3339")]
            at: DateTime<Utc>,
            #[serde(serialize_with = "rfc3339_or_null")]
            maybe: Option<DateTime<Utc>>,
        }
        #[derive(Serialize)]
        struct Chronos {
            at: DateTime<Utc>,
            maybe: Option<DateTime<Utc>>,
        }
        for text in [
            "2026-12-03T16:00:00Z",
            "2026-12-03T16:00:00.120Z",
            "2026-12-03T16:00:00.123456Z",
            "2026-12-03T16:00:00.000001Z",
            "2026-12-03T16:00:00.123456789Z",
            "1000-01-01T00:00:00Z",
            "9999-12-31T23:59:59.999999Z",
            "0001-02-03T04:05:06.007Z",
            "2016-12-31T23:59:60.5Z",
            "+10000-01-01T00:00:00Z",
        ] {
            let at: DateTime<Utc> = text.parse().expect("a time");
            for maybe in [Some(at), None] {
                let ours = serde_json::to_string(&Ours { at, maybe }).expect("json");
                let chronos = serde_json::to_string(&Chronos { at, maybe }).expect("json");
                assert_eq!(ours, chronos);
            }
        }
    }

    // Checks that an order's answer body, written by pushes, is byte for byte what
    // serde_json writes for `OrderJson` of the same order: awaiting payment, paid,
    // cancelled with each reason, the largest ids, a 64-character request_id using every
    // character a request_id may hold, scoped by its buyer (answered as its client sent it), times with every fraction length, and a year
    // beyond 9999 (chrono's own text).
    #[test]
    fn order_bodies_are_what_serde_writes() {
        use flashsale_core::{
            CancelReason, OrderId, OrderStatus, ProductId, Quantity, RequestId, UserId,
        };
        let at = |text: &str| -> DateTime<Utc> { text.parse().expect("a time") };
        let long_id = format!("{}_.:-90", "Az".repeat(29));
        let pending = Order {
            order_id: OrderId::parse(1).expect("id"),
            request_id: RequestId::parse("request_id", "REQ_1").expect("request_id"),
            user_id: UserId::parse(7).expect("user"),
            product_id: ProductId::parse(1001).expect("product"),
            quantity: Quantity::from_stored(1).expect("quantity"),
            status: OrderStatus::PendingPayment,
            created_at: at("2026-12-04T10:00:00.123456Z"),
            expires_at: at("2026-12-04T10:15:00.123456Z"),
            paid_at: None,
            cancelled_at: None,
            cancel_reason: None,
            refunded_at: None,
        };
        let paid = Order {
            order_id: OrderId::parse(i64::MAX).expect("id"),
            request_id: RequestId::scoped(
                UserId::parse(i64::MAX).expect("user"),
                &RequestId::parse("request_id", &long_id).expect("request_id"),
            ),
            user_id: UserId::parse(i64::MAX).expect("user"),
            product_id: ProductId::parse(i64::MAX).expect("product"),
            quantity: Quantity::from_stored(i64::from(u32::MAX)).expect("quantity"),
            status: OrderStatus::Paid,
            created_at: at("2026-12-04T10:00:00Z"),
            expires_at: at("+10000-01-01T00:00:00Z"),
            paid_at: Some(at("2026-12-04T10:01:00.5Z")),
            ..pending.clone()
        };
        let cancelled = |reason| Order {
            status: OrderStatus::Cancelled,
            cancelled_at: Some(at("2026-12-04T10:15:00.000000001Z")),
            cancel_reason: Some(reason),
            ..pending.clone()
        };
        let refunded = Order {
            status: OrderStatus::Refunded,
            refunded_at: Some(at("2026-12-05T09:00:00.25Z")),
            ..paid.clone()
        };
        for order in [
            pending.clone(),
            paid,
            refunded,
            cancelled(CancelReason::UserCancelled),
            cancelled(CancelReason::PaymentTimeout),
        ] {
            let serde = serde_json::to_vec(&OrderJson::from(&order)).expect("json");
            let text = String::from_utf8_lossy(&serde);
            assert!(
                !text.contains('/'),
                "a scoped key is answered as sent: {text}"
            );
            assert_eq!(
                String::from_utf8_lossy(&order_body(&order)),
                String::from_utf8_lossy(&serde)
            );
        }
    }

    // Checks what a strict decimal id is: digits only, without sign, whitespace, leading
    // zeros or overflow; "0" parses (the id's own parse refuses it).
    #[test]
    fn strict_decimal_ids() {
        for (s, want) in [
            ("6", Some(6)),
            ("0", Some(0)),
            ("1234567890", Some(1_234_567_890)),
            ("9223372036854775807", Some(i64::MAX)),
            ("9223372036854775808", None),
            ("06", None),
            ("00", None),
            ("+6", None),
            ("-6", None),
            (" 6", None),
            ("6 ", None),
            ("6\n", None),
            ("", None),
            ("6a", None),
            ("\u{0666}", None),
            ("1_000", None),
        ] {
            assert_eq!(decimal(s), want, "{s:?}");
        }
    }
}
