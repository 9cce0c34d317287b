//! A product's sale definition: stock, per-user limit, sale window.

use chrono::{DateTime, Utc};

use crate::ids::{ParseError, ProductId};

/// Largest stock one product may have; keeps every counter far from integer overflow in
/// Redis (i64), Lua (doubles exact to 2^53) and MariaDB (BIGINT).
pub const STOCK_MAX: i64 = 1_000_000_000;
/// Longest product name accepted (the `products.name` column width).
pub const NAME_LEN_MAX: usize = 200;

/// When a product may be bought: `[starts_at, ends_at)`, either end open.
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
        let name = name.trim();
        if name.is_empty() || name.chars().count() > NAME_LEN_MAX {
            return Err(ParseError::new(
                "name",
                format!("must be 1 to {NAME_LEN_MAX} characters"),
            ));
        }
        if !(0..=STOCK_MAX).contains(&stock) {
            return Err(ParseError::new(
                "stock",
                format!("must be between 0 and {STOCK_MAX}"),
            ));
        }
        let per_user_limit = match per_user_limit {
            None => None,
            Some(n) if (1..=i64::from(u32::MAX)).contains(&n) => Some(n as u32),
            Some(_) => {
                return Err(ParseError::new(
                    "per_user_limit",
                    "must be a positive integer",
                ))
            }
        };
        Ok(Self {
            product_id,
            name: name.to_owned(),
            stock,
            per_user_limit,
            window,
        })
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
        ];
        for (result, field) in cases {
            assert_eq!(result.unwrap_err().field, field);
        }
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
