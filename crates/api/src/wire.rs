//! Shapes of requests and responses: the JSON bodies, and the decimal ids of paths and
//! headers.

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use flashsale_app::{Order, ProductView};
use serde::{Deserialize, Serialize};

/// A purchase as sent; `request_id` borrowed from the body when it has no escapes (the
/// flood's refusals then allocate nothing for it: `RequestId` copies it only once checked).
#[derive(Debug, Deserialize)]
pub struct PurchaseBody<'a> {
    #[serde(borrow)]
    pub request_id: Cow<'a, str>,
    /// Optional when the buyer is authenticated (it must then name that buyer).
    pub user_id: Option<i64>,
    pub product_id: i64,
    pub quantity: i64,
}

#[derive(Debug, Deserialize)]
pub struct UserBody {
    /// Optional when the buyer is authenticated (it must then name that buyer).
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

#[derive(Debug, Deserialize)]
pub struct NewProductBody {
    pub product_id: i64,
    pub name: String,
    pub stock: i64,
    pub per_user_limit: Option<i64>,
    pub sale_starts_at: Option<DateTime<Utc>>,
    pub sale_ends_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Deserialize)]
pub struct RestockBody {
    pub request_id: String,
    pub quantity: i64,
}

#[derive(Debug, Serialize)]
pub struct OrderJson {
    pub order_id: i64,
    pub request_id: String,
    pub user_id: i64,
    pub product_id: i64,
    pub quantity: u32,
    pub status: &'static str,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paid_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancelled_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancel_reason: Option<&'static str>,
}

impl From<&Order> for OrderJson {
    fn from(o: &Order) -> Self {
        Self {
            order_id: o.order_id.get(),
            request_id: o.request_id.to_string(),
            user_id: o.user_id.get(),
            product_id: o.product_id.get(),
            quantity: o.quantity.get(),
            status: o.status.as_str(),
            created_at: o.created_at,
            expires_at: o.expires_at,
            paid_at: o.paid_at,
            cancelled_at: o.cancelled_at,
            cancel_reason: o.cancel_reason.map(|r| r.as_str()),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct InventoryJson {
    pub total: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
}

#[derive(Debug, Serialize)]
pub struct ProductJson {
    pub product_id: i64,
    pub name: String,
    pub per_user_limit: Option<u32>,
    pub sale_starts_at: Option<DateTime<Utc>>,
    pub sale_ends_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    /// Who serves the stock now: `gate` (Redis) or `ledger` (MariaDB alone).
    pub stock_mode: &'static str,
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
            inventory: InventoryJson {
                total: v.inventory.total,
                available: v.inventory.available,
                reserved: v.inventory.reserved,
                sold: v.inventory.sold,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
