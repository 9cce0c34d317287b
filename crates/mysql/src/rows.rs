//! Mapping rows to records. A value our own writes could not have produced is reported
//! as an error, never mapped to a default.

use chrono::{DateTime, Utc};
use flashsale_app::{LedgerError, Order, Product, PurchaseOutcome, PurchaseRecord};
use flashsale_core::{
    CancelReason, Generation, HoldRef, OrderId, OrderStatus, ProductId, PurchaseRequest, Quantity,
    ReleaseReason, RequestId, SaleWindow, StockMode, UserId,
};
use sqlx::mysql::MySqlRow;
use sqlx::Row;

use crate::sql::db;

pub(crate) fn corrupt(what: impl std::fmt::Display) -> LedgerError {
    LedgerError::corrupt(format!("unexpected data in the ledger: {what}"))
}

/// For row mappers that answer in sqlx's error type.
pub(crate) fn undecodable(e: LedgerError) -> sqlx::Error {
    sqlx::Error::Decode(Box::new(e))
}

/// A stock generation column's value: the schema only ever stores generations from 1 up.
pub(crate) fn generation(raw: i64) -> Result<Generation, LedgerError> {
    Generation::from_stored(raw).ok_or_else(|| corrupt(format!("stock generation {raw}")))
}

/// A hold's (generation, hold_id) columns: hold ids, too, start at 1.
pub(crate) fn hold(generation: i64, hold_id: i64) -> Result<HoldRef, LedgerError> {
    HoldRef::from_stored(generation, hold_id)
        .ok_or_else(|| corrupt(format!("hold {hold_id} of stock generation {generation}")))
}

/// Columns `ORDER_COLUMNS` selects, prefixed by `o.`.
pub(crate) const ORDER_COLUMNS: &str = "o.id, o.request_id, o.user_id, o.product_id, \
     o.quantity, o.status, o.created_at, o.expires_at, o.paid_at, o.cancelled_at, \
     o.cancel_reason, o.refunded_at";

pub(crate) fn order(row: &MySqlRow) -> Result<Order, LedgerError> {
    let id: i64 = row.try_get("id").map_err(db)?;
    let request_id = text(row, "request_id")?;
    let status = text(row, "status")?;
    let cancel_reason = opt_text(row, "cancel_reason")?;
    let cancel_reason = match cancel_reason.as_deref() {
        None => None,
        Some(text) => Some(text.parse::<CancelReason>().map_err(corrupt)?),
    };
    Ok(Order {
        order_id: OrderId::parse(id).map_err(corrupt)?,
        request_id: RequestId::stored("request_id", &request_id).map_err(corrupt)?,
        user_id: UserId::parse(row.try_get("user_id").map_err(db)?).map_err(corrupt)?,
        product_id: ProductId::parse(row.try_get("product_id").map_err(db)?).map_err(corrupt)?,
        quantity: quantity(row.try_get::<i32, _>("quantity").map_err(db)?)?,
        status: status.parse::<OrderStatus>().map_err(corrupt)?,
        created_at: row.try_get("created_at").map_err(db)?,
        expires_at: row.try_get("expires_at").map_err(db)?,
        paid_at: row.try_get("paid_at").map_err(db)?,
        cancelled_at: row.try_get("cancelled_at").map_err(db)?,
        cancel_reason,
        refunded_at: row.try_get("refunded_at").map_err(db)?,
    })
}

pub(crate) fn quantity(raw: i32) -> Result<Quantity, LedgerError> {
    Quantity::from_stored(i64::from(raw)).ok_or_else(|| corrupt(format!("quantity {raw}")))
}

pub(crate) fn product(row: &MySqlRow) -> Result<Product, LedgerError> {
    let limit: Option<u32> = row.try_get("per_user_limit").map_err(db)?;
    let starts: Option<DateTime<Utc>> = row.try_get("sale_starts_at").map_err(db)?;
    let ends: Option<DateTime<Utc>> = row.try_get("sale_ends_at").map_err(db)?;
    Ok(Product {
        product_id: ProductId::parse(row.try_get("product_id").map_err(db)?).map_err(corrupt)?,
        name: text(row, "name")?,
        per_user_limit: limit,
        window: SaleWindow::new(starts, ends).map_err(corrupt)?,
        stock_loaded: row.try_get::<bool, _>("stock_loaded").map_err(db)?,
        stock_mode: stock_mode(row, "stock_mode")?,
        paused: row.try_get::<bool, _>("paused").map_err(db)?,
        created_at: row.try_get("created_at").map_err(db)?,
    })
}

/// A `stock_mode` column's value (`GATE` / `LEDGER`).
pub(crate) fn stock_mode(row: &MySqlRow, column: &str) -> Result<StockMode, LedgerError> {
    StockMode::from_stored(&text(row, column)?).map_err(corrupt)
}

/// A row of the purchase lookup: reservation columns `r_*` and order columns (nullable).
pub(crate) fn purchase(row: &MySqlRow) -> Result<PurchaseRecord, LedgerError> {
    let request_id = text(row, "r_request_id")?;
    let request = PurchaseRequest {
        request_id: RequestId::stored("request_id", &request_id).map_err(corrupt)?,
        user_id: UserId::parse(row.try_get("r_user_id").map_err(db)?).map_err(corrupt)?,
        product_id: ProductId::parse(row.try_get("r_product_id").map_err(db)?).map_err(corrupt)?,
        quantity: quantity(row.try_get::<i32, _>("r_quantity").map_err(db)?)?,
    };
    let hold = hold(
        row.try_get("r_generation").map_err(db)?,
        row.try_get("r_hold_id").map_err(db)?,
    )?;
    let order_id: Option<i64> = row.try_get("id").map_err(db)?;
    let outcome = if order_id.is_some() {
        PurchaseOutcome::Order(order(row)?)
    } else {
        let status = text(row, "r_status")?;
        match (
            status.as_str(),
            opt_text(row, "r_release_reason")?.as_deref(),
        ) {
            ("RELEASED", Some(reason)) => PurchaseOutcome::Released {
                reason: reason.parse::<ReleaseReason>().map_err(corrupt)?,
            },
            _ => {
                return Err(corrupt(format!(
                    "reservation {request_id} is {status} without an order"
                )))
            }
        }
    };
    Ok(PurchaseRecord {
        request,
        hold,
        outcome,
    })
}

/// A text column. Our tables use binary collations (ids and statuses compare exactly),
/// which MariaDB reports with the BINARY flag that sqlx's checked `String` decoding
/// refuses; the bytes are UTF-8 all the same, and decoding still validates that.
pub(crate) fn text(row: &MySqlRow, column: &str) -> Result<String, LedgerError> {
    row.try_get_unchecked::<String, _>(column).map_err(db)
}

pub(crate) fn opt_text(row: &MySqlRow, column: &str) -> Result<Option<String>, LedgerError> {
    row.try_get_unchecked::<Option<String>, _>(column)
        .map_err(db)
}

/// `n` copies of an SQL fragment, comma separated: the placeholders of an `IN (…)` list
/// or the rows of a multi-row `VALUES`.
pub(crate) fn list(n: usize, item: &str) -> String {
    vec![item; n].join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashsale_app::ports::ErrorKind;

    // Checks that a value our writes could not have produced is typed as corrupt data,
    // its text naming what was found.
    #[test]
    fn unexpected_values_are_corrupt() {
        let e = corrupt("x");
        assert_eq!(e.kind(), ErrorKind::Corrupt);
        assert!(
            e.to_string().contains("unexpected data in the ledger: x"),
            "{e}"
        );
    }
}
