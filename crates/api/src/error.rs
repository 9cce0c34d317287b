//! The one place where outcomes become HTTP statuses and error codes. The set of codes is
//! part of the API contract (README): add, never rename.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use flashsale_app::Error;
use serde::Serialize;
use tracing::warn;

/// Seconds a client should wait before retrying a 503.
const RETRY_AFTER_SECS: &str = "1";

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

#[derive(Serialize)]
struct Body<'a> {
    error: &'a str,
    message: &'a str,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        use StatusCode as S;
        let (status, code) = match &e {
            Error::Invalid(_) => (S::BAD_REQUEST, "invalid_request"),
            Error::ProductNotFound => (S::NOT_FOUND, "product_not_found"),
            Error::OrderNotFound => (S::NOT_FOUND, "order_not_found"),
            Error::ProductExists => (S::CONFLICT, "product_exists"),
            Error::SaleNotActive => (S::CONFLICT, "sale_not_active"),
            Error::SoldOut => (S::CONFLICT, "sold_out"),
            Error::LimitExceeded => (S::CONFLICT, "limit_exceeded"),
            Error::RequestIdConflict => (S::CONFLICT, "request_id_conflict"),
            Error::RequestReleased => (S::CONFLICT, "request_released"),
            Error::OrderNotPayable => (S::CONFLICT, "order_not_payable"),
            Error::OrderExpired => (S::CONFLICT, "order_expired"),
            Error::OrderNotCancellable => (S::CONFLICT, "order_not_cancellable"),
            Error::Unavailable(_) => (S::SERVICE_UNAVAILABLE, "unavailable"),
        };
        if status.is_server_error() {
            // The cause is for operators; the client learns only that it should retry.
            warn!(error = %e, "request answered 503");
            return Self::new(
                status,
                code,
                "temporarily unavailable or outcome unknown; retry with the same request_id",
            );
        }
        Self::new(status, code, e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Body {
            error: self.code,
            message: &self.message,
        };
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_static(RETRY_AFTER_SECS),
            );
        }
        response
    }
}
