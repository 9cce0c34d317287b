//! One contract per port: the behaviour the use cases rely on, written once as test
//! bodies over a port's trait, and run against every implementation of it — the real
//! adapters (Redis, MariaDB) and the simulator's stores. A behaviour the simulator gets
//! wrong then fails a test here instead of silently proving the wrong thing in a
//! simulated run.
//!
//! Each module holds a port's *world* trait (how to get a fresh store of that kind and
//! let time pass on its clock), the contract's bodies (`pub async fn`, each panicking
//! on a breach), and a macro that expands to one `#[tokio::test]` per body for a given
//! world: `tests/real.rs` and `tests/sim.rs` invoke them all at once through
//! [`contracts!`].
//!
//! - [`gate`]: `StockGate` + `GateMaintenance` (the Lua scripts and the adapter's
//!   commands);
//! - [`ledger`]: `Ledger` + `LedgerMaintenance` (the SQL: unique keys, conditional
//!   UPDATEs, the generation fence, group commit);
//! - [`outbox`]: `Outbox` (the events written with each change, leased to one relay).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "the contract's bodies are tests: a failed expectation is the failure"
)]

pub mod gate;
pub mod ledger;
pub mod outbox;

/// Expands to the modules `gate`, `ledger` and `outbox` of a test crate, each with the
/// tests of that contract: over the gate world `$gate` (when given) and the ledger
/// world `$ledger`, both types of the invoking module.
#[macro_export]
macro_rules! contracts {
    (gate: $gate:ident, ledger: $ledger:ident) => {
        mod gate {
            $crate::gate_contract!(super::$gate);
        }

        $crate::contracts!(ledger: $ledger);
    };
    (ledger: $ledger:ident) => {
        mod ledger {
            $crate::ledger_contract!(super::$ledger);
        }

        mod outbox {
            $crate::outbox_contract!(super::$ledger);
        }
    };
}

use chrono::{TimeZone, Utc};
use flashsale_app::AdminAction;
use flashsale_core::{
    AdminName, Generation, HoldRef, NewProduct, ProductId, PurchaseRequest, Quantity, RequestId,
    SaleWindow, UserId,
};

/// The product every contract test sells, unless it needs a second one.
pub fn product() -> ProductId {
    product_n(1)
}

pub fn product_n(id: i64) -> ProductId {
    ProductId::parse(id).expect("product id")
}

pub fn request_id(id: &str) -> RequestId {
    RequestId::parse("request_id", id).expect("request id")
}

pub fn user(id: i64) -> UserId {
    UserId::parse(id).expect("user id")
}

/// A purchase of `quantity` units of [`product`] by `user_id`.
pub fn purchase(id: &str, user_id: i64, quantity: i64) -> PurchaseRequest {
    purchase_of(product(), id, user_id, quantity)
}

pub fn purchase_of(
    product_id: ProductId,
    id: &str,
    user_id: i64,
    quantity: i64,
) -> PurchaseRequest {
    PurchaseRequest {
        request_id: request_id(id),
        user_id: user(user_id),
        product_id,
        quantity: Quantity::from_stored(quantity).expect("quantity"),
    }
}

/// The default admin's action on `product_id` under `request_id`.
pub fn action(product_id: ProductId, request_id: &RequestId) -> AdminAction {
    AdminAction {
        request_id: request_id.clone(),
        product_id,
        admin: AdminName::default(),
    }
}

pub fn generation(raw: i64) -> Generation {
    Generation::from_stored(raw).expect("generation")
}

pub fn hold(generation: i64, id: i64) -> HoldRef {
    HoldRef::from_stored(generation, id).expect("hold")
}

/// A product on sale from 2020 to 2090 (the ledger never reads the window; the use
/// cases do).
pub fn new_product(product_id: ProductId, stock: i64, per_user_limit: Option<i64>) -> NewProduct {
    let window = SaleWindow::new(
        Utc.with_ymd_and_hms(2020, 1, 1, 0, 0, 0).single(),
        Utc.with_ymd_and_hms(2090, 1, 1, 0, 0, 0).single(),
    )
    .expect("window");
    NewProduct::parse(product_id.get(), "contract", stock, per_user_limit, window).expect("product")
}
