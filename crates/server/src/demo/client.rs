//! The demo's HTTP client of one flashsale service: the calls a shop and its buyers make,
//! each answer parsed into what it says (an order, a refusal by its code, "unknown: retry")
//! and never trusted further than that. Retrying is the caller's decision.

use std::time::Duration;

use chrono::{DateTime, Utc};
use flashsale_core::{OrderId, OrderStatus, ProductId, RequestId, UserId};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION, RETRY_AFTER};
use reqwest::{Method, StatusCode};
use serde::Deserialize;

/// How long one exchange may take before the client calls its outcome unknown: above the
/// service's default request deadline (10 s), so that a slow answer arrives as the
/// service's own 503 rather than as a client timeout.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(15);
/// How long connecting may take: the service is local or near, and a refused or silent
/// address is reported instead of waited on.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a health probe may take before the address counts as not answering: a
/// live service answers `/healthz` at once.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest answer body kept: every flashsale answer is well under a kilobyte; a larger one
/// is not an answer of ours.
const ANSWER_BYTES_MAX: usize = 64 * 1024;
/// Longest wait a `Retry-After` may ask for before the next attempt: the service says 1 s;
/// a larger value is capped so that a demo never sleeps for minutes.
const RETRY_AFTER_MAX: Duration = Duration::from_secs(5);

/// The status of an order as the service names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status(pub OrderStatus);

impl<'de> Deserialize<'de> for Status {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        OrderStatus::ALL
            .into_iter()
            .find(|s| s.as_str() == raw)
            .map(Status)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown order status {raw:?}")))
    }
}

/// An order as the service answers it (the fields the demo reads).
#[derive(Debug, Clone, Deserialize)]
pub struct Order {
    #[serde(deserialize_with = "order_id")]
    pub order_id: OrderId,
    pub request_id: String,
    pub status: Status,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub cancel_reason: Option<String>,
}

fn order_id<'de, D: serde::Deserializer<'de>>(d: D) -> Result<OrderId, D::Error> {
    OrderId::parse(i64::deserialize(d)?).map_err(serde::de::Error::custom)
}

/// A product's counters as `GET /v1/products/{id}` answers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct Inventory {
    pub total: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Product {
    pub name: String,
    pub inventory: Inventory,
}

/// An error answer's stable code.
#[derive(Deserialize)]
struct ErrorBody {
    error: String,
}

/// What one exchange said.
#[derive(Debug)]
pub enum Answer<T> {
    /// A success (2xx) with its parsed body and status.
    Done(StatusCode, T),
    /// A definite refusal (4xx): its status and stable code; nothing was done.
    Refused(StatusCode, String),
    /// 503, 429 or no answer at all: the outcome is unknown (or nothing was done); the
    /// same request may be sent again, after this long.
    Retry(Unknown),
}

/// Why an outcome is not known yet, and how long to wait before asking again.
#[derive(Debug, Clone, Copy)]
pub enum Unknown {
    /// 503: unavailable or outcome unknown.
    Unavailable(Option<Duration>),
    /// 429: over a rate; nothing was done.
    RateLimited(Option<Duration>),
    /// No answer arrived in time, or the connection failed.
    NoAnswer,
    /// The demo itself gave up waiting (an impatient buyer's first try).
    GaveUp,
}

impl Unknown {
    /// The wait the service asked for, capped.
    pub fn retry_after(self) -> Option<Duration> {
        match self {
            Self::Unavailable(d) | Self::RateLimited(d) => d.map(|d| d.min(RETRY_AFTER_MAX)),
            Self::NoAnswer | Self::GaveUp => None,
        }
    }
}

/// An answer flashsale never gives (a 5xx other than 503, a body that does not parse):
/// the demo stops rather than guess what it means.
#[derive(Debug, Clone)]
pub struct Unexpected(pub String);

impl std::fmt::Display for Unexpected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// How the service knows a buyer: by the body's `user_id` (FLASHSALE_BUYER_AUTH=none), or
/// by a header its gateway sets (`header`), which the demo sets as that gateway would.
#[derive(Debug, Clone)]
pub enum BuyerIdentity {
    Body,
    Header(HeaderName),
}

/// A client of one flashsale service.
#[derive(Clone)]
pub struct Shop {
    http: reqwest::Client,
    base: String,
    admin: HeaderValue,
    buyers: BuyerIdentity,
}

impl Shop {
    /// A client of `base` (`http://host:port`, checked), with the admin token and the way
    /// buyers are named, keeping up to `connections` idle connections.
    pub fn new(
        base: &str,
        admin_token: &str,
        buyers: BuyerIdentity,
        connections: usize,
    ) -> Result<Self, String> {
        let base = parse_base_url(base)?;
        let admin = HeaderValue::from_str(&format!("Bearer {admin_token}"))
            .map_err(|_| "the admin token has characters a header cannot carry".to_owned())?;
        let http = reqwest::Client::builder()
            .timeout(EXCHANGE_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .pool_max_idle_per_host(connections)
            .tcp_nodelay(true)
            .build()
            .map_err(|e| format!("HTTP client: {e}"))?;
        Ok(Self {
            http,
            base,
            admin,
            buyers,
        })
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// `POST /v1/products` with the admin token.
    pub async fn create_product(
        &self,
        id: ProductId,
        name: &str,
        stock: u32,
        per_user_limit: u32,
    ) -> Result<Answer<serde_json::Value>, Unexpected> {
        let body = serde_json::json!({
            "product_id": id.get(), "name": name, "stock": stock, "per_user_limit": per_user_limit,
        });
        self.admin_post("/v1/products", body).await
    }

    /// `POST /v1/products/{id}/pause` or `…/resume` (`what`) with the admin token, under
    /// `request_id`: the product as it is now.
    pub async fn switch_sale(
        &self,
        id: ProductId,
        what: &str,
        request_id: &RequestId,
    ) -> Result<Answer<serde_json::Value>, Unexpected> {
        let body = serde_json::json!({ "request_id": request_id.as_str() });
        self.admin_post(&format!("/v1/products/{id}/{what}"), body)
            .await
    }

    /// `POST /v1/orders/{id}/refund` with the admin token, under `request_id`: the order
    /// as it is now.
    pub async fn refund(
        &self,
        id: OrderId,
        request_id: &RequestId,
        restock: bool,
    ) -> Result<Answer<serde_json::Value>, Unexpected> {
        let body = serde_json::json!({ "request_id": request_id.as_str(), "restock": restock });
        self.admin_post(&format!("/v1/orders/{id}/refund"), body)
            .await
    }

    /// `POST {path}` of `body` with the admin token, as every admin action is sent.
    async fn admin_post(
        &self,
        path: &str,
        body: serde_json::Value,
    ) -> Result<Answer<serde_json::Value>, Unexpected> {
        self.exchange(
            Method::POST,
            path,
            Some(body),
            Some(&self.admin),
            None,
            None,
        )
        .await
    }

    pub async fn product(&self, id: ProductId) -> Result<Answer<Product>, Unexpected> {
        self.exchange(
            Method::GET,
            &format!("/v1/products/{id}"),
            None,
            None,
            None,
            None,
        )
        .await
    }

    /// `POST /v1/purchases` of one unit; `give_up_after` bounds this one try below the
    /// usual deadline (an impatient buyer).
    pub async fn purchase(
        &self,
        request_id: &RequestId,
        user: UserId,
        product: ProductId,
        give_up_after: Option<Duration>,
    ) -> Result<Answer<Order>, Unexpected> {
        let body = serde_json::json!({
            "request_id": request_id.as_str(), "user_id": user.get(),
            "product_id": product.get(), "quantity": 1,
        });
        self.exchange(
            Method::POST,
            "/v1/purchases",
            Some(body),
            None,
            Some(user),
            give_up_after,
        )
        .await
    }

    /// `POST /v1/orders/{id}/pay` or `…/cancel` by its buyer.
    pub async fn settle(
        &self,
        order: OrderId,
        user: UserId,
        pay: bool,
    ) -> Result<Answer<Order>, Unexpected> {
        let verb = if pay { "pay" } else { "cancel" };
        let body = serde_json::json!({ "user_id": user.get() });
        self.exchange(
            Method::POST,
            &format!("/v1/orders/{order}/{verb}"),
            Some(body),
            None,
            Some(user),
            None,
        )
        .await
    }

    /// `GET /v1/orders/{id}` by its buyer.
    pub async fn order(&self, order: OrderId, user: UserId) -> Result<Answer<Order>, Unexpected> {
        self.exchange(
            Method::GET,
            &format!("/v1/orders/{order}"),
            None,
            None,
            Some(user),
            None,
        )
        .await
    }

    /// `GET /v1/purchases/{request_id}` by its buyer: the order of a request, if any.
    pub async fn purchase_of(
        &self,
        request_id: &RequestId,
        user: UserId,
    ) -> Result<Answer<Order>, Unexpected> {
        self.exchange(
            Method::GET,
            &format!("/v1/purchases/{request_id}"),
            None,
            None,
            Some(user),
            None,
        )
        .await
    }

    /// One exchange; `admin` or `buyer` credentials as the service wants them.
    async fn exchange<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
        admin: Option<&HeaderValue>,
        buyer: Option<UserId>,
        give_up_after: Option<Duration>,
    ) -> Result<Answer<T>, Unexpected> {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(admin) = admin {
            request = request.header(AUTHORIZATION, admin.clone());
        }
        if let (Some(user), BuyerIdentity::Header(name)) = (buyer, &self.buyers) {
            request = request.header(name.clone(), user.get().to_string());
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        if let Some(wait) = give_up_after {
            request = request.timeout(wait);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) if e.is_timeout() && give_up_after.is_some() => {
                return Ok(Answer::Retry(Unknown::GaveUp))
            }
            Err(_) => return Ok(Answer::Retry(Unknown::NoAnswer)),
        };
        let status = response.status();
        let retry_after = retry_after(response.headers());
        let bytes = match read_capped(response).await {
            Ok(bytes) => bytes,
            Err(Cut::Timeout) if give_up_after.is_some() => {
                return Ok(Answer::Retry(Unknown::GaveUp))
            }
            Err(Cut::Timeout | Cut::Broken) => return Ok(Answer::Retry(Unknown::NoAnswer)),
            Err(Cut::TooLarge) => {
                return Err(Unexpected(format!(
                    "{path}: an answer over {ANSWER_BYTES_MAX} bytes, not flashsale's"
                )))
            }
        };
        if status == StatusCode::SERVICE_UNAVAILABLE {
            return Ok(Answer::Retry(Unknown::Unavailable(retry_after)));
        }
        if status == StatusCode::TOO_MANY_REQUESTS {
            return Ok(Answer::Retry(Unknown::RateLimited(retry_after)));
        }
        let text = String::from_utf8_lossy(&bytes);
        if status.is_success() {
            return serde_json::from_slice(&bytes)
                .map(|v| Answer::Done(status, v))
                .map_err(|e| {
                    Unexpected(format!(
                        "{path}: {status} with a body that does not parse ({e}): {text}"
                    ))
                });
        }
        if status.is_client_error() {
            return serde_json::from_slice::<ErrorBody>(&bytes)
                .map(|b| Answer::Refused(status, b.error))
                .map_err(|_| {
                    Unexpected(format!("{path}: {status} without an error code: {text}"))
                });
        }
        Err(Unexpected(format!("{path}: answered {status}: {text}")))
    }
}

/// The wait an answer's `Retry-After` asks for: whole seconds, the only form flashsale
/// sends (an HTTP date or anything else is ignored).
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let seconds = headers
        .get(RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds))
}

/// Why an answer's body could not be read whole.
enum Cut {
    Timeout,
    Broken,
    TooLarge,
}

async fn read_capped(mut response: reqwest::Response) -> Result<Vec<u8>, Cut> {
    let mut bytes = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                if bytes.len() + chunk.len() > ANSWER_BYTES_MAX {
                    return Err(Cut::TooLarge);
                }
                bytes.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(bytes),
            Err(e) if e.is_timeout() => return Err(Cut::Timeout),
            Err(_) => return Err(Cut::Broken),
        }
    }
}

/// Whether `{base}{path}` answers 200 within the probe's bound (`/healthz`, `/readyz`, or
/// a page such as `/dashboard`).
pub async fn answers(base: &str, path: &str) -> bool {
    let Ok(http) = reqwest::Client::builder().timeout(PROBE_TIMEOUT).build() else {
        return false;
    };
    http.get(format!("{base}{path}"))
        .send()
        .await
        .is_ok_and(|r| r.status() == StatusCode::OK)
}

/// Checks `base` names a server's root over plain HTTP (`http://host[:port]`, a trailing
/// `/` allowed) and returns it without the slash.
pub fn parse_base_url(base: &str) -> Result<String, String> {
    let url = reqwest::Url::parse(base)
        .map_err(|e| format!("base URL {base:?}: {e} (give http://host:port)"))?;
    if url.scheme() != "http" {
        return Err(format!(
            "base URL {base:?}: the demo speaks plain http:// (terminate TLS in front)"
        ));
    }
    let Some(host) = url.host_str() else {
        return Err(format!("base URL {base:?}: no host"));
    };
    if !matches!(url.path(), "" | "/") || url.query().is_some() || !url.username().is_empty() {
        return Err(format!(
            "base URL {base:?}: give the server's root (http://host:port), nothing more"
        ));
    }
    Ok(match url.port() {
        Some(port) => format!("http://{host}:{port}"),
        None => format!("http://{host}"),
    })
}

/// The URL a client uses for a listen address: an unspecified address (0.0.0.0, ::)
/// listens on every interface, loopback included.
pub fn url_of(addr: std::net::SocketAddr) -> String {
    let ip = match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    format!("http://{}", std::net::SocketAddr::new(ip, addr.port()))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks which base URLs the demo takes (a plain http:// root, trailing slash or not)
    // and refuses (https, a path, a query, credentials, not a URL), and the client URL of
    // a listen address (an unspecified one is reached on loopback).
    #[test]
    fn base_urls_and_listen_addresses() {
        assert_eq!(
            parse_base_url("http://127.0.0.1:8080/").as_deref(),
            Ok("http://127.0.0.1:8080")
        );
        assert_eq!(
            parse_base_url("http://localhost").as_deref(),
            Ok("http://localhost")
        );
        for bad in [
            "https://127.0.0.1:8080",
            "http://127.0.0.1:8080/v1",
            "http://127.0.0.1:8080/?a=1",
            "http://u:p@127.0.0.1:8080",
            "127.0.0.1:8080",
            "",
        ] {
            assert!(parse_base_url(bad).is_err(), "{bad:?} was taken");
        }
        let addr = |s: &str| s.parse::<std::net::SocketAddr>().expect("address");
        assert_eq!(url_of(addr("0.0.0.0:8080")), "http://127.0.0.1:8080");
        assert_eq!(url_of(addr("[::]:8080")), "http://[::1]:8080");
        assert_eq!(url_of(addr("10.0.0.5:81")), "http://10.0.0.5:81");
    }

    // Checks an order answer parses into typed values, and that an unknown status or a
    // non-positive order id is refused rather than taken.
    #[test]
    fn order_answers_parse_strictly() {
        let good = r#"{"order_id":7,"request_id":"r","user_id":1,"product_id":2,"quantity":1,
            "status":"PAID","created_at":"2030-01-01T00:00:00Z","expires_at":"2030-01-01T00:00:10Z"}"#;
        let order: Order = serde_json::from_str(good).expect("parses");
        assert_eq!(order.order_id.get(), 7);
        assert_eq!(order.status, Status(OrderStatus::Paid));
        assert!(serde_json::from_str::<Order>(&good.replace("PAID", "SHIPPED")).is_err());
        assert!(
            serde_json::from_str::<Order>(&good.replace("\"order_id\":7", "\"order_id\":0"))
                .is_err()
        );
    }
}
