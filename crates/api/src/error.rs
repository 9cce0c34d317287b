//! The one place where outcomes become HTTP statuses ([`status`]) and answers. The set of
//! codes (`flashsale_app::Outcome`) is part of the API contract (docs/api.md): add, never
//! rename.

use std::sync::OnceLock;
use std::time::Duration;

use axum::body::{Body as HttpBody, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use flashsale_app::ports::ErrorKind;
use flashsale_app::{Error, Outcome};
use serde::Serialize;
use tracing::warn;

/// Seconds a client should wait before retrying a 503.
const RETRY_AFTER_SECS: &str = "1";

/// The HTTP status of each outcome: an exhaustive match, so a new outcome needs its
/// status here before anything can answer it.
pub const fn status(outcome: Outcome) -> StatusCode {
    use Outcome as O;
    use StatusCode as S;
    match outcome {
        O::Created => S::CREATED,
        O::Replayed | O::Ok => S::OK,
        O::InvalidRequest => S::BAD_REQUEST,
        O::Unauthorized => S::UNAUTHORIZED,
        O::Forbidden => S::FORBIDDEN,
        O::NotFound | O::ProductNotFound | O::OrderNotFound => S::NOT_FOUND,
        O::MethodNotAllowed => S::METHOD_NOT_ALLOWED,
        O::RequestTimeout => S::REQUEST_TIMEOUT,
        O::SoldOut
        | O::LimitExceeded
        | O::ProductExists
        | O::SaleNotActive
        | O::SalePaused
        | O::InsufficientStock
        | O::RequestIdConflict
        | O::RequestReleased
        | O::OrderNotPayable
        | O::OrderExpired
        | O::OrderNotCancellable
        | O::OrderNotRefundable => S::CONFLICT,
        O::PayloadTooLarge => S::PAYLOAD_TOO_LARGE,
        O::UnsupportedMediaType => S::UNSUPPORTED_MEDIA_TYPE,
        O::RateLimited => S::TOO_MANY_REQUESTS,
        O::Unavailable => S::SERVICE_UNAVAILABLE,
    }
}

#[derive(Debug)]
pub struct ApiError {
    /// The answer's code, and what it is counted as.
    pub outcome: Outcome,
    message: String,
    /// `Retry-After` of a 429, in seconds (a 503's is always `RETRY_AFTER_SECS`).
    retry_after_secs: Option<u64>,
    /// `WWW-Authenticate` of a 401 whose credentials were a bearer token (RFC 6750 §3).
    challenge: Option<&'static str>,
    /// The store error behind a 503, by store and kind (counted in `store_errors`).
    pub fault: Option<(&'static str, ErrorKind)>,
    /// Whether the connection is closed after this answer (`Connection: close`): a request
    /// whose body never arrived leaves nothing worth reading on it.
    close: bool,
    /// The answer's body, encoded once for the process: outcomes whose message never
    /// varies (a flood's `sold_out`, above all), so refusing one costs no JSON encoding
    /// and no allocation of its text (about 6 % of a refusal's instructions).
    encoded: Option<&'static OnceLock<Bytes>>,
}

/// The encoded bodies of the outcomes whose text is fixed (the variants of [`Error`]
/// whose text never varies), by outcome index.
static FIXED: [OnceLock<Bytes>; Outcome::ALL.len()] =
    [const { OnceLock::new() }; Outcome::ALL.len()];

#[derive(Serialize)]
struct Body<'a> {
    error: &'a str,
    message: &'a str,
}

impl ApiError {
    /// The answer's HTTP status: its outcome's.
    pub const fn status(&self) -> StatusCode {
        status(self.outcome)
    }

    pub fn new(outcome: Outcome, message: impl Into<String>) -> Self {
        Self {
            outcome,
            message: message.into(),
            retry_after_secs: None,
            challenge: None,
            fault: None,
            close: false,
            encoded: None,
        }
    }

    /// The same answer, with the connection closed after it.
    pub fn closing(mut self) -> Self {
        self.close = true;
        self
    }

    /// Credentials missing or refused, with the `WWW-Authenticate` challenge when they
    /// are a bearer token's.
    pub fn unauthorized(message: impl Into<String>, challenge: Option<&'static str>) -> Self {
        let mut e = Self::new(Outcome::Unauthorized, message);
        e.challenge = challenge;
        e
    }

    /// A body that is not declared JSON.
    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(Outcome::UnsupportedMediaType, message)
    }

    /// A purchase over a rate limit (`what`: whose), to be retried after `retry_after`
    /// (rounded up to whole seconds, at least one): nothing was done.
    pub fn rate_limited(what: &str, retry_after: Duration) -> Self {
        let mut e = Self::new(
            Outcome::RateLimited,
            format!("too many purchase attempts from this {what}; nothing was done, retry after the Retry-After seconds"),
        );
        e.retry_after_secs = Some(whole_seconds(retry_after));
        e
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Outcome::InvalidRequest, message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(Outcome::Unavailable, message)
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let outcome = e.outcome();
        // Whether the variant's text never varies: then its body is encoded once, in
        // its outcome's cell.
        let fixed = !matches!(e, Error::Invalid(_) | Error::Unavailable(_));
        if fixed {
            let cell = &FIXED[outcome.index()];
            cell.get_or_init(|| encode(outcome.as_str(), &e.to_string()));
            let retry_after_secs = match e {
                Error::RateLimited { retry_after } => Some(whole_seconds(retry_after)),
                _ => None,
            };
            return Self {
                outcome,
                message: String::new(),
                retry_after_secs,
                challenge: None,
                fault: None,
                close: false,
                encoded: Some(cell),
            };
        }
        if let Error::Unavailable(why) = &e {
            // The cause is for operators; the client learns only that it should retry.
            warn!(error = %e, "request answered 503");
            let mut answer = Self::new(
                outcome,
                "temporarily unavailable or outcome unknown; retry with the same request_id",
            );
            answer.fault = why.store_fault();
            return answer;
        }
        Self::new(outcome, e.to_string())
    }
}

/// `Retry-After` for a wait: whole seconds, rounded up, at least one.
fn whole_seconds(wait: Duration) -> u64 {
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}

/// The JSON body of an error answer.
fn encode(code: &str, message: &str) -> Bytes {
    // Two strings into a struct of two strings: serializing cannot fail.
    serde_json::to_vec(&Body {
        error: code,
        message,
    })
    .map(Bytes::from)
    .unwrap_or_default()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = match self.encoded.and_then(OnceLock::get) {
            // A clone of the one encoding: a reference count, no copy.
            Some(body) => body.clone(),
            None => encode(self.outcome.as_str(), &self.message),
        };
        let mut response = Response::new(HttpBody::from(body));
        let status = self.status();
        *response.status_mut() = status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_static(RETRY_AFTER_SECS),
            );
        } else if let Some(secs) = self.retry_after_secs {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.close {
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        if let Some(challenge) = self.challenge {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(challenge),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    // What: every outcome's answer — status, `Content-Type`, and a body whose `error` is
    // its code and whose `message` is the outcome's text — whether its body was encoded
    // once (the fixed outcomes) or for this answer; a 503's `Retry-After`, and a 429's
    // (its wait rounded up to whole seconds). How: each
    // variant of `Error` turned into a response twice (the second from the encoded cell)
    // and its body read back as JSON; two variants sharing a cell would answer with the
    // other's code.
    use super::*;
    use flashsale_core::ParseError;

    async fn answer(
        e: Error,
    ) -> (
        StatusCode,
        Option<String>,
        Option<String>,
        serde_json::Value,
    ) {
        let response = ApiError::from(e).into_response();
        let status = response.status();
        let header = |name| {
            response
                .headers()
                .get(name)
                .map(|v: &HeaderValue| v.to_str().unwrap().to_owned())
        };
        let (content_type, retry_after) =
            (header(header::CONTENT_TYPE), header(header::RETRY_AFTER));
        let bytes = axum::body::to_bytes(response.into_body(), 4096)
            .await
            .unwrap();
        (
            status,
            content_type,
            retry_after,
            serde_json::from_slice(&bytes).unwrap(),
        )
    }

    fn every_outcome() -> Vec<(Error, u16, &'static str)> {
        vec![
            (
                Error::Invalid(ParseError::new("quantity", "must be at least 1")),
                400,
                "invalid_request",
            ),
            (Error::ProductNotFound, 404, "product_not_found"),
            (Error::OrderNotFound, 404, "order_not_found"),
            (Error::ProductExists, 409, "product_exists"),
            (Error::SaleNotActive, 409, "sale_not_active"),
            (Error::SalePaused, 409, "sale_paused"),
            (Error::InsufficientStock, 409, "insufficient_stock"),
            (Error::SoldOut, 409, "sold_out"),
            (Error::LimitExceeded, 409, "limit_exceeded"),
            (Error::RequestIdConflict, 409, "request_id_conflict"),
            (Error::RequestReleased, 409, "request_released"),
            (Error::OrderNotPayable, 409, "order_not_payable"),
            (Error::OrderExpired, 409, "order_expired"),
            (Error::OrderNotCancellable, 409, "order_not_cancellable"),
            (Error::OrderNotRefundable, 409, "order_not_refundable"),
            (
                Error::RateLimited {
                    retry_after: Duration::from_millis(1500),
                },
                429,
                "rate_limited",
            ),
            (
                Error::from(flashsale_app::ports::GateError::timed_out("redis: reserve")),
                503,
                "unavailable",
            ),
        ]
    }

    #[tokio::test]
    async fn every_outcome_answers_its_code_and_text_the_first_time_and_again() {
        for _round in 0..2 {
            for (e, status, code) in every_outcome() {
                let text = e.to_string();
                let (s, content_type, retry_after, body) = answer(e).await;
                assert_eq!(s.as_u16(), status, "{code}");
                assert_eq!(content_type.as_deref(), Some("application/json"), "{code}");
                assert_eq!(body["error"], code);
                assert_eq!(body.as_object().map(|o| o.len()), Some(2), "{code}: {body}");
                if status == 503 {
                    // The cause is for the logs; the client is told to retry.
                    assert_eq!(retry_after.as_deref(), Some(RETRY_AFTER_SECS));
                    assert!(!body["message"].as_str().unwrap().contains("redis"));
                } else if status == 429 {
                    // 1.5 s, rounded up.
                    assert_eq!(retry_after.as_deref(), Some("2"));
                    assert_eq!(body["message"], text.as_str(), "{code}");
                } else {
                    assert_eq!(retry_after, None, "{code}");
                    assert_eq!(body["message"], text.as_str(), "{code}");
                }
            }
        }
    }

    #[tokio::test]
    async fn an_error_built_by_hand_answers_its_own_text() {
        let response = ApiError::new(Outcome::NotFound, "no \"such\" endpoint").into_response();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        let bytes = axum::body::to_bytes(response.into_body(), 4096)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(body["error"], "not_found");
        assert_eq!(body["message"], "no \"such\" endpoint");
    }

    // Checks that each variant of `Error` answers an outcome of its own, with the code and
    // status the hand-written list above expects: by mapping every variant and collecting
    // the outcomes in a set (two variants on one outcome would share a fixed body).
    #[test]
    fn each_error_answers_an_outcome_of_its_own() {
        let mut seen = std::collections::BTreeSet::new();
        for (e, want_status, code) in every_outcome() {
            let outcome = e.outcome();
            assert_eq!(outcome.as_str(), code);
            assert_eq!(status(outcome).as_u16(), want_status, "{code}");
            assert!(seen.insert(code), "{code} twice");
        }
    }

    // Checks the table of error codes in docs/api.md against `Outcome::ALL`: every outcome that
    // is not a success is listed in the row of its status, and every code the table lists
    // is an outcome with that row's status. How: the table's rows parsed ("| 409 | `a`,
    // `b` |"), each backquoted word a code.
    #[test]
    fn the_api_reference_lists_every_error_code_under_its_status() {
        let readme = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/api.md"),
        )
        .expect("docs/api.md");
        let table = readme
            .split("## Error codes")
            .nth(1)
            .expect("docs/api.md has a section of error codes");
        let mut listed = Vec::new();
        for row in table.lines().skip_while(|l| !l.starts_with('|')) {
            let Some(cells) = row.strip_prefix('|') else {
                break;
            };
            let mut cells = cells.split('|');
            let (Some(code), Some(codes)) = (cells.next(), cells.next()) else {
                continue;
            };
            let Ok(code) = code.trim().parse::<u16>() else {
                continue;
            };
            // The codes are the backquoted words before any parenthesis of prose.
            let codes = codes.split('(').next().unwrap_or_default();
            for word in codes.split('`').skip(1).step_by(2) {
                listed.push((code, word.to_owned()));
            }
        }
        assert!(listed.len() >= 20, "the table parsed: {listed:?}");
        for &(code, ref word) in &listed {
            let outcome = Outcome::ALL.iter().find(|o| o.as_str() == word);
            assert!(outcome.is_some(), "docs/api.md lists {word}, no outcome");
            assert_eq!(
                outcome.map(|&o| status(o).as_u16()),
                Some(code),
                "{word} listed under {code}"
            );
        }
        for o in Outcome::ALL {
            if status(o).is_success() {
                continue;
            }
            let want = (status(o).as_u16(), o.as_str().to_owned());
            assert!(
                listed.contains(&want),
                "docs/api.md does not list {o} under {}",
                want.0
            );
        }
    }

    // Checks that a 503 keeps which store failed and how, for the `store_errors` metric,
    // and that nothing else carries one: a gate timeout and a ledger contention answer
    // with their (store, kind); the use case's own reason to retry and a refusal with
    // none. How: each turned into an ApiError and its `fault` read.
    #[test]
    fn a_503_names_the_store_and_kind_behind_it() {
        use flashsale_app::ports::{GateError, LedgerError};
        for (e, fault) in [
            (
                Error::from(GateError::timed_out("reserve")),
                Some(("redis", ErrorKind::TimedOut)),
            ),
            (
                Error::from(LedgerError::contention("commit")),
                Some(("mariadb", ErrorKind::Contention)),
            ),
            (Error::Unavailable("stock is being rebuilt".into()), None),
            (Error::SoldOut, None),
        ] {
            let text = e.to_string();
            let answer = ApiError::from(e);
            assert_eq!(answer.fault, fault, "{text}");
        }
    }
}
