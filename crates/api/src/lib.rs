//! flashsale's HTTP JSON API.
//!
//! Handlers parse input into domain types (bad input dies here, with a stable error code,
//! before anything is touched), call one use case of [`flashsale_app::Flashsale`], and
//! render its result. This crate never talks to Redis or MariaDB itself.

pub mod auth;
mod body;
pub mod chunks;
mod dashboard;
mod error;
mod openapi;
mod routes;
mod wire;

pub use dashboard::{Dashboard, CSP as DASHBOARD_CSP};
pub use error::ApiError;
pub use openapi::{document, document_json};
pub use routes::{metrics_router, router, ApiConfig, PurchaseLimits, ROUTES};
