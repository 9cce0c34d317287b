//! The pure domain of flashsale.
//!
//! Nothing here performs I/O, awaits, or reads a clock: time is passed in. That keeps
//! every rule testable in isolation and lets the deterministic simulator drive it.

pub mod hold;
pub mod ids;
pub mod inventory;
pub mod mode;
pub mod product;
pub mod purchase;
pub mod state;

pub use hold::{Generation, HoldId, HoldRef};
pub use ids::{
    AdminName, OrderId, ParseError, ProductId, Quantity, RequestId, RequestScope, UserId,
};
pub use inventory::InventoryCounters;
pub use mode::StockMode;
pub use product::{
    parse_restock, Definition, NewProduct, ProductChange, SaleWindow, SALE_TIME_MAX, SALE_TIME_MIN,
    STOCK_MAX,
};
pub use purchase::{PurchaseRequest, Terms};
pub use state::{
    CancelReason, OrderStatus, ReleaseReason, ReservationStatus, Transition, TransitionError,
};
