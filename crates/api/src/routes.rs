use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::ConnectInfo;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post};
use axum::{Json, Router};
use flashsale_app::limit::{address_key, Limiter};
use flashsale_app::listing::page_size;
use flashsale_app::metrics::{index_of, ENDPOINTS};
use flashsale_app::{
    AdminAction, Destocking, Flashsale, InventoryView, Listing, Metrics, Monitor, Outcome,
    ProductView, RefundAsk, SaleControl, SaleSwitch,
};
use flashsale_core::{
    AdminName, NewProduct, OrderId, OrderStatus, ParseError, ProductChange, ProductId,
    PurchaseRequest, RequestId, SaleWindow, UserId,
};
use serde::Deserialize;
use tokio::sync::Semaphore;

use crate::auth::{acting_user, bearer, AdminTokens, BuyerAuth};
use crate::body::{lazy_timeout, read_whole};
use crate::chunks::{ChunkAlarm, BODY_BYTES_MAX};
use crate::dashboard::{self, Asset, Dashboard, DashboardJson};
use crate::error::ApiError;
use crate::openapi::{Health, Ready};
use crate::wire::{
    decimal, order_body, ActionBody, ActionPageJson, ActionsQuery, DestockBody, LoggedActionJson,
    NewProductBody, OrderJson, OrderPageJson, OrdersQuery, ProductJson, ProductPageJson,
    ProductPatchBody, ProductsQuery, PurchaseBody, RefundBody, RestockBody, UserBody,
};

#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// The bearer tokens the admin endpoints take, each naming its admin.
    pub admin_tokens: AdminTokens,
    /// Requests handled at once; past it, new requests get 503 at once instead of queueing
    /// (a flash sale's flood must not turn into unbounded memory and latency).
    pub in_flight_max: usize,
    /// Deadline of one request; past it the answer is 503 (outcome unknown, retry).
    pub request_timeout: Duration,
    /// A seeds' strategy serving `POST /v1/purchases` instead of flashsale's own path, for
    /// benchmarks only (`FLASHSALE_STRATEGY`).
    pub baseline: Option<Arc<flashsale_app::baseline::Baseline>>,
    /// Where every answer is counted.
    pub metrics: Arc<Metrics>,
    /// Reads the stores' gauges for `GET /metrics` (None: the endpoint shows the counters
    /// only).
    pub monitor: Option<Arc<Monitor>>,
    /// What the live sale page (`GET /dashboard`) reads (None: its routes answer 404).
    pub dashboard: Option<Arc<Dashboard>>,
    /// Whether this router serves the operator's endpoints, `GET /metrics` and the live
    /// sale page (false: they are served on a listener of their own, `metrics_router`).
    pub serve_metrics: bool,
    /// The purchase endpoint's rate limits.
    pub limits: Arc<PurchaseLimits>,
    /// How a buyer is known (`FLASHSALE_BUYER_AUTH`); with an identity, orders and
    /// purchases are read, paid and cancelled by their own buyer only.
    pub buyer_auth: BuyerAuth,
    /// The lists of products and of a buyer's orders.
    pub listing: Arc<Listing>,
    /// The operator's controls of a sale: pause and resume.
    pub control: Arc<SaleControl>,
    /// Destocks: available units taken off sale.
    pub destocking: Arc<Destocking>,
}

/// The per-address rate limit of `POST /v1/purchases` (`flashsale_app::limit`; the
/// per-user one is the use case's): a purchase over it is answered 429 `rate_limited`
/// with `Retry-After`, and nothing is done.
#[derive(Debug)]
pub struct PurchaseLimits {
    /// Per client address (an IPv6 client's /64), checked before the body is parsed.
    pub per_address: Option<Limiter<IpAddr>>,
    /// The origin of the times the limiter is given.
    pub epoch: Instant,
    /// Where the client's address is read instead of the connection's peer: a header
    /// that the proxy in front appends to (its last comma-separated entry is taken). A
    /// request without a parsable one is keyed by its peer.
    pub client_ip_header: Option<HeaderName>,
}

// The `endpoint` labels of the answers, checked against the list at compile time.
const PURCHASE: usize = index_of(&ENDPOINTS, "purchase");
const GET_PURCHASE: usize = index_of(&ENDPOINTS, "get_purchase");
const GET_ORDER: usize = index_of(&ENDPOINTS, "get_order");
const PAY: usize = index_of(&ENDPOINTS, "pay");
const CANCEL: usize = index_of(&ENDPOINTS, "cancel");
const REFUND: usize = index_of(&ENDPOINTS, "refund");
const CREATE_PRODUCT: usize = index_of(&ENDPOINTS, "create_product");
const GET_PRODUCT: usize = index_of(&ENDPOINTS, "get_product");
const RESTOCK: usize = index_of(&ENDPOINTS, "restock");
const PAUSE: usize = index_of(&ENDPOINTS, "pause");
const RESUME: usize = index_of(&ENDPOINTS, "resume");
const DESTOCK: usize = index_of(&ENDPOINTS, "destock");
const PATCH_PRODUCT: usize = index_of(&ENDPOINTS, "patch_product");
const LIST_ACTIONS: usize = index_of(&ENDPOINTS, "list_actions");
const LIST_PRODUCTS: usize = index_of(&ENDPOINTS, "list_products");
const LIST_ORDERS: usize = index_of(&ENDPOINTS, "list_orders");
const READYZ: usize = index_of(&ENDPOINTS, "readyz");
const METRICS: usize = index_of(&ENDPOINTS, "metrics");
const OTHER: usize = index_of(&ENDPOINTS, "other");
/// The content type of the OpenMetrics text format.
pub(crate) const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone)]
struct AppState {
    service: Arc<Flashsale>,
    config: Arc<ApiConfig>,
    /// The in-flight limit (`ApiConfig::in_flight_max`): a request holds one of these
    /// only while its use case works on the stores, after its body has arrived and been
    /// parsed, so a client that sends slowly (or never) holds none.
    slots: Arc<Semaphore>,
    /// The readiness probes' own slots, so a flood never starves them.
    probe_slots: Arc<Semaphore>,
}

/// Readiness probes answered at once: each pings both stores, and a probe has its own
/// slots (not the API's, so a flood never starves it), bounded so that probes cannot be
/// used to load the stores.
const PROBES_IN_FLIGHT_MAX: usize = 64;

pub fn router(service: Arc<Flashsale>, config: ApiConfig) -> Router {
    let state = AppState {
        service,
        slots: Arc::new(Semaphore::new(config.in_flight_max)),
        probe_slots: Arc::new(Semaphore::new(PROBES_IN_FLIGHT_MAX)),
        config: Arc::new(config),
    };
    routed(Router::new(), state.config.serve_metrics)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

/// Declares the API's routes once, as `method "path" => handler` (the method as
/// `axum::routing` and OpenAPI's path items name it): [`ROUTES`] lists them and `routed`
/// mounts them, so the list the OpenAPI test checks the document against is the router.
macro_rules! routes {
    ($($method:ident $path:literal => $handler:ident,)+) => {
        /// Every route of [`router`], as (method, path): the method in lower case, as
        /// OpenAPI's path items name it, and the path in axum's (and OpenAPI's) template
        /// syntax. The operator's routes ([`internal`]) are mounted only when the router
        /// serves them (`ApiConfig::serve_metrics`).
        pub const ROUTES: &[(&str, &str)] = &[$((stringify!($method), $path)),+];

        /// `router` with every route of [`ROUTES`] mounted (the operator's only when
        /// `serve_metrics`).
        fn routed(router: Router<AppState>, serve_metrics: bool) -> Router<AppState> {
            $(let router = match (serve_metrics, $path) {
                (false, path) if internal(path) => router,
                _ => router.route($path, $method($handler)),
            };)+
            router
        }
    };
}

/// Whether a route is the operator's: the metrics and the live sale page, which show the
/// backlog, incidents and every product's stock, and move to `FLASHSALE_METRICS_LISTEN`'s
/// internal address when it is set.
fn internal(path: &str) -> bool {
    path == "/metrics" || path == "/dashboard" || path.starts_with("/dashboard/")
}

routes! {
    get "/metrics" => metrics_text,
    get "/dashboard" => dashboard_page,
    get "/dashboard/app.js" => dashboard_script,
    get "/dashboard/style.css" => dashboard_style,
    get "/dashboard/data" => dashboard_data,
    get "/healthz" => healthz,
    get "/readyz" => readyz,
    get "/openapi.json" => openapi_json,
    post "/v1/products" => create_product,
    get "/v1/products" => list_products,
    get "/v1/products/{id}" => get_product,
    patch "/v1/products/{id}" => patch_product,
    post "/v1/products/{id}/restock" => restock,
    post "/v1/products/{id}/pause" => pause,
    post "/v1/products/{id}/resume" => resume,
    post "/v1/products/{id}/destock" => destock,
    post "/v1/purchases" => purchase,
    get "/v1/purchases/{request_id}" => get_purchase,
    get "/v1/orders" => list_orders,
    get "/v1/orders/{id}" => get_order,
    post "/v1/orders/{id}/pay" => pay,
    post "/v1/orders/{id}/cancel" => cancel,
    post "/v1/orders/{id}/refund" => refund,
    get "/v1/admin/actions" => list_actions,
}

/// The operator's endpoints alone, `GET /metrics` and the live sale page, for a listener
/// of its own (`FLASHSALE_METRICS_LISTEN`): outside the API's in-flight limit, so a scrape
/// still answers while a flood is shed, and off the API's address, so the public need
/// not reach them. Its requests are not counted.
pub fn metrics_router(monitor: Arc<Monitor>, dashboard: Arc<Dashboard>) -> Router {
    Router::new()
        .route(
            "/metrics",
            get(|| async move {
                (
                    [(header::CONTENT_TYPE, OPENMETRICS)],
                    monitor.scrape().await,
                )
            }),
        )
        .route("/dashboard", get(|| async { dashboard::PAGE.response() }))
        .route(
            "/dashboard/app.js",
            get(|| async { dashboard::SCRIPT.response() }),
        )
        .route(
            "/dashboard/style.css",
            get(|| async { dashboard::STYLE.response() }),
        )
        .route(
            "/dashboard/data",
            get(|State(d): State<Arc<Dashboard>>| async move { d.data().await }),
        )
        .fallback(|| async { ApiError::new(Outcome::NotFound, "no such endpoint") })
        // Without it axum answers a wrong method with an empty 405: the API's JSON instead.
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                Outcome::MethodNotAllowed,
                "method not allowed on this endpoint",
            )
        })
        .with_state(dashboard)
}

fn overloaded() -> ApiError {
    ApiError::unavailable("too many requests in flight; retry shortly")
}

async fn not_found(started: Started, State(state): State<AppState>) -> Response {
    counted::<()>(
        started,
        &state,
        OTHER,
        Err(ApiError::new(Outcome::NotFound, "no such endpoint")),
    )
}

async fn method_not_allowed(started: Started, State(state): State<AppState>) -> Response {
    counted::<()>(
        started,
        &state,
        OTHER,
        Err(ApiError::new(
            Outcome::MethodNotAllowed,
            "method not allowed on this endpoint",
        )),
    )
}

/// The answer of `result`, counted under `endpoint` (an index into `ENDPOINTS`) with its
/// outcome: its error code, or for a success `created` (201), `replayed` (a purchase's
/// 200: the original order again) or `ok`.
fn counted<T: IntoResponse>(
    Started(started): Started,
    state: &AppState,
    endpoint: usize,
    result: Result<T, ApiError>,
) -> Response {
    let (response, outcome) = match result {
        Ok(answer) => {
            let response = answer.into_response();
            let outcome = match response.status() {
                StatusCode::CREATED => Outcome::Created,
                _ if endpoint == PURCHASE => Outcome::Replayed,
                _ => Outcome::Ok,
            };
            (response, outcome)
        }
        Err(e) => {
            if let Some((store, kind)) = e.fault {
                state.config.metrics.store_failed(store, kind);
            }
            let outcome = e.outcome;
            (e.into_response(), outcome)
        }
    };
    state
        .config
        .metrics
        .answered_in(endpoint, outcome, started.elapsed());
    response
}

/// When a request's handler started: its first extractor, so reading the body counts.
struct Started(Instant);

impl<S: Send + Sync> FromRequestParts<S> for Started {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(_: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Started(Instant::now()))
    }
}

/// The raw body, read whole by [`read_whole`] (its size and time bounded; a failure is
/// our JSON 413, 408 or 400), declared JSON. A body must come with `Content-Type: application/json`
/// (parameters such as `charset` allowed); another type is refused unread, and a body
/// without one is refused too (415), since `curl -d` sends form encoding unasked. An
/// empty body needs no type.
struct Body(Bytes);

impl FromRequest<AppState> for Body {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, Self::Rejection> {
        let declared = req.headers().get(header::CONTENT_TYPE).map(is_json);
        if declared == Some(false) {
            return Err(ApiError::unsupported_media_type(
                "the body must be Content-Type: application/json",
            ));
        }
        // Read whole before the request takes an in-flight slot (`deadline`): a slow
        // body holds only its own connection, for at most the request deadline; one
        // whose chunks announced more than the bound is refused as soon as announced.
        let alarm = req.extensions().get::<ChunkAlarm>().cloned();
        let bytes = read_whole(
            req.into_body(),
            BODY_BYTES_MAX,
            state.config.request_timeout,
            alarm.as_ref(),
        )
        .await
        .map_err(|failure| failure.error(BODY_BYTES_MAX))?;
        if declared.is_none() && !bytes.is_empty() {
            return Err(ApiError::unsupported_media_type(
                "the body needs Content-Type: application/json",
            ));
        }
        Ok(Body(bytes))
    }
}

/// Whether a `Content-Type` is JSON's: `application/json`, in any case, with or without
/// parameters.
fn is_json(value: &HeaderValue) -> bool {
    // What clients send, compared at once: validating, splitting and trimming cost every
    // purchase about 250 instructions.
    if value.as_bytes() == b"application/json" {
        return true;
    }
    value.to_str().is_ok_and(|v| {
        v.split(';')
            .next()
            .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
    })
}

/// The request's authenticated buyer, as `BuyerAuth::buyer` reads it from the headers in
/// place (a `HeaderMap` extractor would copy them for every purchase); `None` with buyer
/// authentication off.
struct Buyer(Result<Option<UserId>, ApiError>);

impl FromRequestParts<AppState> for Buyer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        Ok(Buyer(state.config.buyer_auth.buyer(&parts.headers)))
    }
}

/// The client's address for the per-address limit, when that limit is on: the last entry
/// of the configured header (what the proxy in front appended), else the connection's
/// peer (None when the server was not given it).
struct Client(Option<IpAddr>);

impl FromRequestParts<AppState> for Client {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let limits = &state.config.limits;
        if limits.per_address.is_none() {
            return Ok(Client(None));
        }
        let from_header = limits.client_ip_header.as_ref().and_then(|name| {
            parts
                .headers
                .get_all(name)
                .iter()
                .next_back()
                .and_then(|v| v.to_str().ok())
                .and_then(last_address)
        });
        let peer = || {
            parts
                .extensions
                .get::<ConnectInfo<SocketAddr>>()
                .map(|ConnectInfo(addr)| addr.ip())
        };
        Ok(Client(from_header.or_else(peer)))
    }
}

/// The address in the last comma-separated entry of a forwarding header: a bare IPv4 or
/// IPv6 address, or one with a port (`203.0.113.7:5555`, `[2001:db8::1]:443`), as
/// proxies write it.
fn last_address(value: &str) -> Option<IpAddr> {
    let entry = value.rsplit(',').next()?.trim();
    entry
        .parse::<IpAddr>()
        .ok()
        .or_else(|| entry.parse::<SocketAddr>().ok().map(|a| a.ip()))
        .or_else(|| {
            entry
                .strip_prefix('[')
                .and_then(|e| e.strip_suffix(']'))
                .and_then(|e| e.parse().ok())
        })
}

/// A JSON body read into `T`. Its UTF-8 is checked once, for the whole body: read from
/// bytes, serde_json checks every string (each key among them) on its own, about 600
/// instructions of a purchase's body.
/// Every body is a JSON object: serde would also read a struct from an array of its
/// fields in order (`["R_1",7,1,2]`), a shape the API does not have.
fn json<'a, T: Deserialize<'a>>(body: &'a Bytes) -> Result<T, ApiError> {
    let invalid = |e: &dyn std::fmt::Display| ApiError::invalid(format!("invalid JSON body: {e}"));
    let text = std::str::from_utf8(body).map_err(|e| invalid(&e))?;
    if !text
        .trim_start_matches([' ', '\t', '\n', '\r'])
        .starts_with('{')
    {
        return Err(invalid(&"expected a JSON object"));
    }
    serde_json::from_str(text).map_err(|e| invalid(&e))
}

/// A path parameter as extracted: the segment percent-decoded, or axum's rejection of it
/// (not valid UTF-8 once decoded), which `path` turns into our JSON `invalid_request`;
/// and whether the request's path was percent-encoded, which a numeric id never is
/// ([`path_id`]).
struct PathParam {
    decoded: Result<Path<String>, PathRejection>,
    encoded: bool,
}

impl<S: Send + Sync> FromRequestParts<S> for PathParam {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Ok(Self {
            encoded: parts.uri.path().contains('%'),
            decoded: Path::from_request_parts(parts, state).await,
        })
    }
}

fn path(p: PathParam) -> Result<String, ApiError> {
    p.decoded
        .map(|Path(v)| v)
        .map_err(|e| ApiError::invalid(e.body_text()))
}

fn invalid(e: ParseError) -> ApiError {
    ApiError::invalid(e.to_string())
}

/// A numeric id from the path, a strict decimal ([`decimal`]; zero is then refused by
/// the id's own parse), written as it is: the id is the routes' only free segment, so a
/// `%` in the path is the id percent-encoded (`/v1/orders/%31`), which is refused rather
/// than decoded, as a sign or a leading zero is: one id has one spelling.
fn path_id(p: PathParam, field: &'static str) -> Result<i64, ApiError> {
    let refused = || {
        ApiError::invalid(format!(
            "{field}: must be a positive integer in plain decimal digits \
             (no sign, leading zero or percent-encoding)"
        ))
    };
    if p.encoded {
        return Err(refused());
    }
    decimal(&path(p)?).ok_or_else(refused)
}

/// The order of `/v1/orders/{id}/…` and the user it acts for: the authenticated buyer,
/// or the body's `user_id` (an empty body is no fields, as an authenticated buyer may send
/// none).
fn order_and_user(
    Buyer(buyer): Buyer,
    id: PathParam,
    body: Result<Body, ApiError>,
) -> Result<(OrderId, UserId), ApiError> {
    let id = OrderId::parse(path_id(id, "order_id")?).map_err(invalid)?;
    let buyer = buyer?;
    let Body(body) = body?;
    let claimed = match body.is_empty() {
        true => None,
        false => json::<UserBody>(&body)?.user_id,
    };
    Ok((id, acting_user(buyer, claimed)?))
}

/// An order as its reader may see it: with buyer authentication on, only its own buyer;
/// anyone else is told it does not exist, as for an id never used (ids leak nothing).
fn visible(order: flashsale_app::Order, buyer: Option<UserId>) -> Result<OrderAnswer, ApiError> {
    match buyer {
        Some(buyer) if buyer != order.user_id => {
            Err(ApiError::from(flashsale_app::Error::OrderNotFound))
        }
        _ => Ok(OrderAnswer::of(&order)),
    }
}

/// An order as an answer: the JSON of `OrderJson`, written by [`order_body`].
struct OrderAnswer(Vec<u8>);

impl OrderAnswer {
    fn of(order: &flashsale_app::Order) -> Self {
        Self(order_body(order))
    }
}

impl IntoResponse for OrderAnswer {
    fn into_response(self) -> Response {
        json_answer(self.0)
    }
}

/// A JSON body encoded already, answered as `application/json`.
fn json_answer(body: impl Into<axum::body::Body>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body.into(),
    )
        .into_response()
}

/// Runs a use case in one of the in-flight slots, under the request deadline: with no
/// slot free the answer is 503 at once (a flood is shed, not queued), and past the
/// deadline the outcome is unknown (503).
async fn deadline<T>(
    state: &AppState,
    work: impl Future<Output = Result<T, flashsale_app::Error>>,
) -> Result<T, ApiError> {
    in_slot(&state.slots, state, work).await
}

/// `work` in one of `slots`, under the request deadline.
async fn in_slot<T>(
    slots: &Semaphore,
    state: &AppState,
    work: impl Future<Output = Result<T, flashsale_app::Error>>,
) -> Result<T, ApiError> {
    let _slot = slots.try_acquire().map_err(|_| overloaded())?;
    within(state.config.request_timeout, work).await
}

/// `work` bounded by `limit`, counted from when it first has to wait: a use case answered
/// without waiting (a refusal from the sold-out board, most of a flood) arms no timer and
/// reads no clock, and one that waits is polled once per wake-up, as under
/// `tokio::time::timeout`.
async fn within<T>(
    limit: Duration,
    work: impl Future<Output = Result<T, flashsale_app::Error>>,
) -> Result<T, ApiError> {
    match lazy_timeout(limit, work).await {
        Some(result) => result.map_err(ApiError::from),
        None => Err(ApiError::unavailable(
            "no answer within the request deadline; outcome unknown, retry with the same request_id",
        )),
    }
}

/// The admin whose token the request carries, or 401.
fn require_admin(state: &AppState, headers: &HeaderMap) -> Result<AdminName, ApiError> {
    let given = bearer(headers).unwrap_or("");
    state
        .config
        .admin_tokens
        .who(given.as_bytes())
        .ok_or_else(|| {
            ApiError::unauthorized(
                "admin endpoints need Authorization: Bearer <admin token>",
                Some("Bearer"),
            )
        })
}

/// Not counted: a liveness probe's count tells nothing, and this endpoint stays the
/// benchmark's trivial yardstick (the HTTP ceiling), as cheap as an answer gets.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "probes",
    summary = "Liveness: the process answers",
    responses((status = 200, description = "Alive.", body = Health)),
)]
async fn healthz() -> Response {
    // A static body: building `{"status":"ok"}` as a JSON value for each probe cost about
    // 1,500 instructions, a tenth of the whole answer, and inflated the yardstick.
    json_answer(Bytes::from_static(br#"{"status":"ok"}"#))
}

/// This API's OpenAPI document (`openapi.rs`), encoded once. Not counted, like
/// `/healthz`: it is static, and the endpoint labels of the metrics are the use cases'.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "probes",
    summary = "This document",
    responses((status = 200, description = "The OpenAPI 3.1 document of this API.", content_type = "application/json", body = Object)),
)]
async fn openapi_json() -> Response {
    json_answer(crate::openapi::encoded())
}

#[utoipa::path(
    get,
    path = "/readyz",
    tag = "probes",
    summary = "Readiness: both stores answer a ping",
    responses((status = 200, description = "Redis and MariaDB both answered.", body = Ready)),
)]
async fn readyz(started: Started, State(state): State<AppState>) -> Response {
    let ready = in_slot(&state.probe_slots, &state, state.service.ready())
        .await
        .map(|()| Json(serde_json::json!({"status": "ready"})));
    counted(started, &state, READYZ, ready)
}

/// Every metric in the OpenMetrics text format, the stores' gauges read now (bounded by
/// the monitor itself: a scrape answers even while a store hangs).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "probes",
    summary = "Every metric, in the OpenMetrics text format",
    description = "Served here unless `FLASHSALE_METRICS_LISTEN` moves it to a listener of \
its own (then this path answers 404 `not_found`).",
    responses((
        status = 200,
        description = "The metrics.",
        content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8",
        body = String,
    )),
)]
async fn metrics_text(started: Started, State(state): State<AppState>) -> Response {
    let text = match &state.config.monitor {
        Some(monitor) => monitor.scrape().await,
        None => state.config.metrics.encode(),
    };
    counted(
        started,
        &state,
        METRICS,
        Ok::<_, ApiError>(([(header::CONTENT_TYPE, OPENMETRICS)], text)),
    )
}

/// The page for a listener without a dashboard configured: as for an unknown path.
fn no_dashboard() -> Response {
    ApiError::new(Outcome::NotFound, "no such endpoint").into_response()
}

/// One of the page's files, where this listener serves the page; the three handlers below
/// differ only in the asset and their OpenAPI description.
fn dashboard_asset(state: &AppState, asset: Asset) -> Response {
    match &state.config.dashboard {
        Some(_) => asset.response(),
        None => no_dashboard(),
    }
}

/// The live sale page (`dashboard.rs`). Its assets and data are not counted, like
/// `/openapi.json`: the endpoint labels of the metrics are the use cases' and the probes'.
#[utoipa::path(
    get,
    path = "/dashboard",
    tag = "dashboard",
    summary = "The live sale page (HTML)",
    description = "Served here unless `FLASHSALE_METRICS_LISTEN` moves it to a listener of \
its own (then this path answers 404 `not_found`), as are its script, style sheet and data.",
    responses((status = 200, description = "The page.", content_type = "text/html; charset=utf-8", body = String)),
)]
async fn dashboard_page(State(state): State<AppState>) -> Response {
    dashboard_asset(&state, dashboard::PAGE)
}

#[utoipa::path(
    get,
    path = "/dashboard/app.js",
    tag = "dashboard",
    summary = "The live sale page's script",
    responses((status = 200, description = "The script.", content_type = "text/javascript; charset=utf-8", body = String)),
)]
async fn dashboard_script(State(state): State<AppState>) -> Response {
    dashboard_asset(&state, dashboard::SCRIPT)
}

#[utoipa::path(
    get,
    path = "/dashboard/style.css",
    tag = "dashboard",
    summary = "The live sale page's style sheet",
    responses((status = 200, description = "The style sheet.", content_type = "text/css; charset=utf-8", body = String)),
)]
async fn dashboard_style(State(state): State<AppState>) -> Response {
    dashboard_asset(&state, dashboard::STYLE)
}

/// The page's figures: read from the monitor's last read of the stores (shared with
/// `GET /metrics`, one read at a time, reused for a second) and the sampler's memory, so
/// polling it cannot load Redis or MariaDB.
#[utoipa::path(
    get,
    path = "/dashboard/data",
    tag = "dashboard",
    summary = "The live sale page's figures",
    description = "Each product's stock and stock mode, whether the stores answer, the \
outbox's backlog, recovery incidents, reconciliation drift, and this instance's purchase \
answers per second by outcome with their median and 99th-percentile time over the last \
minutes. The stores' figures are at most a second old.",
    responses((status = 200, description = "The figures.", body = DashboardJson)),
)]
async fn dashboard_data(State(state): State<AppState>) -> Response {
    match &state.config.dashboard {
        Some(d) => d.data().await,
        None => no_dashboard(),
    }
}

#[utoipa::path(
    post,
    path = "/v1/products",
    tag = "products",
    summary = "Put a product on sale (admin)",
    request_body(content = NewProductBody, content_type = "application/json"),
    security(("bearerAuth" = [])),
    responses((status = 201, description = "Created, its stock loaded.", body = ProductJson)),
)]
async fn create_product(
    started: Started,
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Result<Body, ApiError>,
) -> Response {
    let result = create_product_of(&state, &headers, body).await;
    counted(started, &state, CREATE_PRODUCT, result)
}

async fn create_product_of(
    state: &AppState,
    headers: &HeaderMap,
    body: Result<Body, ApiError>,
) -> Result<impl IntoResponse, ApiError> {
    // Credentials first: a stranger learns nothing about what else was wrong.
    let admin = require_admin(state, headers)?;
    let Body(body) = body?;
    let b: NewProductBody = json(&body)?;
    let window = SaleWindow::new(b.sale_starts_at, b.sale_ends_at).map_err(invalid)?;
    let new = NewProduct::parse(b.product_id, &b.name, b.stock, b.per_user_limit, window)
        .map_err(invalid)?;
    let view = deadline(state, state.service.create_product(new, &admin)).await?;
    Ok((StatusCode::CREATED, Json(ProductJson::from(&view))))
}

#[utoipa::path(
    get,
    path = "/v1/products/{id}",
    tag = "products",
    summary = "A product and its live inventory",
    params(("id" = i64, Path, description = "The product id, in decimal digits without sign or leading zero.", format = Int64, minimum = 1)),
    responses((status = 200, description = "The product.", body = ProductJson)),
)]
async fn get_product(started: Started, State(state): State<AppState>, id: PathParam) -> Response {
    let result = async {
        let id = ProductId::parse(path_id(id, "product_id")?).map_err(invalid)?;
        let view = deadline(&state, state.service.product_view(id)).await?;
        Ok::<_, ApiError>(Json(ProductJson::from(&view)))
    }
    .await;
    counted(started, &state, GET_PRODUCT, result)
}

#[utoipa::path(
    get,
    path = "/v1/products",
    tag = "products",
    summary = "The products, a page at a time, in id order (admin)",
    params(ProductsQuery),
    security(("bearerAuth" = [])),
    responses((status = 200, description = "A page of products.", body = ProductPageJson)),
)]
async fn list_products(
    started: Started,
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<ProductsQuery>, QueryRejection>,
) -> Response {
    let result = async {
        require_admin(&state, &headers)?;
        let Query(q) = query.map_err(bad_query)?;
        let limit = page_size(q.limit).map_err(ApiError::from)?;
        let after = cursor(q.cursor.as_deref())?
            .map(ProductId::parse)
            .transpose()
            .map_err(invalid)?;
        let page = deadline(&state, state.config.listing.products(after, limit)).await?;
        let products = page
            .items
            .iter()
            .map(|(product, c)| {
                ProductJson::from(&ProductView {
                    product: product.clone(),
                    inventory: InventoryView {
                        total: c.total,
                        available: c.available,
                        reserved: c.reserved,
                        sold: c.sold,
                    },
                })
            })
            .collect();
        let next_cursor = page.next.map(|id| id.to_string());
        Ok::<_, ApiError>(Json(ProductPageJson {
            products,
            next_cursor,
        }))
    }
    .await;
    counted(started, &state, LIST_PRODUCTS, result)
}

#[utoipa::path(
    get,
    path = "/v1/admin/actions",
    tag = "products",
    summary = "The operator's log: admin actions, newest first (admin)",
    description = "Every pause, resume and change (PATCH) of a product, with its request_id, \
the admin token's name, what was asked and the product's state before and after. One \
indexed read a page.",
    params(ActionsQuery),
    security(("bearerAuth" = [])),
    responses((status = 200, description = "A page of the log.", body = ActionPageJson)),
)]
async fn list_actions(
    started: Started,
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<ActionsQuery>, QueryRejection>,
) -> Response {
    let result = async {
        require_admin(&state, &headers)?;
        let Query(q) = query.map_err(bad_query)?;
        let limit = page_size(q.limit).map_err(ApiError::from)?;
        let product = q
            .product_id
            .map(ProductId::parse)
            .transpose()
            .map_err(invalid)?;
        let before = cursor(q.cursor.as_deref())?;
        let page = deadline(&state, state.config.listing.actions(product, before, limit)).await?;
        Ok::<_, ApiError>(Json(ActionPageJson {
            actions: page.items.iter().map(LoggedActionJson::of).collect(),
            next_cursor: page.next.map(|id| id.to_string()),
        }))
    }
    .await;
    counted(started, &state, LIST_ACTIONS, result)
}

#[utoipa::path(
    get,
    path = "/v1/orders",
    tag = "orders",
    summary = "A buyer's orders, a page at a time, newest first",
    description = "With buyer authentication, the caller's own orders; the admin token reads \
anyone's (`user_id` then required).",
    params(OrdersQuery),
    security((), ("buyerJwt" = []), ("bearerAuth" = [])),
    responses((status = 200, description = "A page of orders.", body = OrderPageJson)),
)]
async fn list_orders(
    started: Started,
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<OrdersQuery>, QueryRejection>,
) -> Response {
    let result = list_orders_of(&state, &headers, query).await;
    counted(started, &state, LIST_ORDERS, result)
}

async fn list_orders_of(
    state: &AppState,
    headers: &HeaderMap,
    query: Result<Query<OrdersQuery>, QueryRejection>,
) -> Result<Json<OrderPageJson>, ApiError> {
    // The admin token reads anyone's orders; anyone else acts as their buyer, as for
    // one order.
    let admin = require_admin(state, headers).is_ok();
    let buyer = if admin {
        None
    } else {
        state.config.buyer_auth.buyer(headers)?
    };
    let Query(q) = query.map_err(bad_query)?;
    let user = acting_user(buyer, q.user_id)?;
    let status = q
        .status
        .as_deref()
        .map(|s| {
            s.parse::<OrderStatus>().map_err(|_| {
                ApiError::invalid("status: must be PENDING_PAYMENT, PAID or CANCELLED")
            })
        })
        .transpose()?;
    let limit = page_size(q.limit).map_err(ApiError::from)?;
    let before = cursor(q.cursor.as_deref())?
        .map(OrderId::parse)
        .transpose()
        .map_err(invalid)?;
    let page = deadline(
        state,
        state.config.listing.orders(user, status, before, limit),
    )
    .await?;
    Ok(Json(OrderPageJson {
        orders: page.items.iter().map(OrderJson::from).collect(),
        next_cursor: page.next.map(|id| id.to_string()),
    }))
}

/// A page's cursor as a strict decimal id (the `next_cursor` of the page before).
fn cursor(raw: Option<&str>) -> Result<Option<i64>, ApiError> {
    raw.map(|c| {
        decimal(c)
            .filter(|&id| id > 0)
            .ok_or_else(|| ApiError::invalid("cursor: must be the next_cursor of an earlier page"))
    })
    .transpose()
}

/// A query string the list's parameters do not read: an unknown parameter, a repeated
/// one, a number that is none.
fn bad_query(e: QueryRejection) -> ApiError {
    ApiError::invalid(format!("query: {}", e.body_text()))
}

#[utoipa::path(
    post,
    path = "/v1/products/{id}/restock",
    tag = "products",
    summary = "Add stock, once per request_id (admin)",
    params(("id" = i64, Path, description = "The product id, in decimal digits without sign or leading zero.", format = Int64, minimum = 1)),
    request_body(content = RestockBody, content_type = "application/json"),
    security(("bearerAuth" = [])),
    responses((status = 200, description = "Restocked (or already, under this request_id): the product now.", body = ProductJson)),
)]
async fn restock(
    started: Started,
    State(state): State<AppState>,
    headers: HeaderMap,
    id: PathParam,
    body: Result<Body, ApiError>,
) -> Response {
    let result = async {
        let (admin, product_id, body) = admin_target(&state, &headers, id, body)?;
        let b: RestockBody = json(&body)?;
        let action = admin_action(admin, product_id, &b.request_id)?;
        let restocked = state.service.restock(action, b.quantity);
        let view = deadline(&state, restocked).await?;
        Ok::<_, ApiError>(Json(ProductJson::from(&view)))
    }
    .await;
    counted(started, &state, RESTOCK, result)
}

#[utoipa::path(
    post,
    path = "/v1/products/{id}/pause",
    tag = "products",
    summary = "Pause a product's sale (admin)",
    description = "Every instance answers purchases of the product with 409 `sale_paused` \
within milliseconds of the 200 (it is announced to them before the answer; when it cannot \
be, the answer waits a second, until no instance's copy of the product is older than the \
pause). Pay, cancel and expiry go on. Idempotent by `request_id`: on 503 the outcome is \
unknown, retry with the same request_id.",
    params(("id" = i64, Path, description = "The product id, in decimal digits without sign or leading zero.", format = Int64, minimum = 1)),
    request_body(content = ActionBody, content_type = "application/json"),
    security(("bearerAuth" = [])),
    responses((status = 200, description = "Paused (or already, under this request_id): the product now.", body = ProductJson)),
)]
async fn pause(
    started: Started,
    State(state): State<AppState>,
    headers: HeaderMap,
    id: PathParam,
    body: Result<Body, ApiError>,
) -> Response {
    let result = switch_sale(&state, &headers, id, body, SaleSwitch::Pause).await;
    counted(started, &state, PAUSE, result)
}

#[utoipa::path(
    post,
    path = "/v1/products/{id}/resume",
    tag = "products",
    summary = "Resume a paused sale (admin)",
    description = "Purchases are served again on every instance, as a pause is refused on \
every instance (see pause). Idempotent by `request_id`.",
    params(("id" = i64, Path, description = "The product id, in decimal digits without sign or leading zero.", format = Int64, minimum = 1)),
    request_body(content = ActionBody, content_type = "application/json"),
    security(("bearerAuth" = [])),
    responses((status = 200, description = "On sale again (or already, under this request_id): the product now.", body = ProductJson)),
)]
async fn resume(
    started: Started,
    State(state): State<AppState>,
    headers: HeaderMap,
    id: PathParam,
    body: Result<Body, ApiError>,
) -> Response {
    let result = switch_sale(&state, &headers, id, body, SaleSwitch::Resume).await;
    counted(started, &state, RESUME, result)
}

#[utoipa::path(
    post,
    path = "/v1/products/{id}/destock",
    tag = "products",
    summary = "Take available units off sale, once per request_id (admin)",
    description = "Removes `quantity` of the product's available units from its stock \
(total and available go down together); units held by orders or sold are never taken. \
Asking for more than are available answers 409 `insufficient_stock` and changes nothing. \
Exact while purchases run: in gate mode Redis takes the units first, so no purchase is \
told 201 for a unit taken back. Idempotent by `request_id` (the operator's actions' \
namespace): on 503 the outcome is unknown, retry with the same request_id; a destock left \
unsettled by a crash is settled by the workers.",
    params(("id" = i64, Path, description = "The product id, in decimal digits without sign or leading zero.", format = Int64, minimum = 1)),
    request_body(content = DestockBody, content_type = "application/json"),
    security(("bearerAuth" = [])),
    responses((status = 200, description = "Taken off sale (or already, under this request_id): the product now.", body = ProductJson)),
)]
async fn destock(
    started: Started,
    State(state): State<AppState>,
    headers: HeaderMap,
    id: PathParam,
    body: Result<Body, ApiError>,
) -> Response {
    let result = async {
        let (admin, product_id, body) = admin_target(&state, &headers, id, body)?;
        let b: DestockBody = json(&body)?;
        let action = admin_action(admin, product_id, &b.request_id)?;
        let destocked = state.config.destocking.destock(action, b.quantity);
        let view = deadline(&state, destocked).await?;
        Ok::<_, ApiError>(Json(ProductJson::from(&view)))
    }
    .await;
    counted(started, &state, DESTOCK, result)
}

/// Pause or resume: the admin's credentials first, then the product and the body.
async fn switch_sale(
    state: &AppState,
    headers: &HeaderMap,
    id: PathParam,
    body: Result<Body, ApiError>,
    switch: SaleSwitch,
) -> Result<Json<ProductJson>, ApiError> {
    let (admin, product_id, body) = admin_target(state, headers, id, body)?;
    let b: ActionBody = json(&body)?;
    let action = admin_action(admin, product_id, &b.request_id)?;
    let view = deadline(state, state.config.control.switch(action, switch)).await?;
    Ok(Json(ProductJson::from(&view)))
}

#[utoipa::path(
    patch,
    path = "/v1/products/{id}",
    tag = "products",
    summary = "Change a product's name, per-user limit or sale window (admin)",
    description = "Fields absent are kept; `per_user_limit` or a bound null is taken off. \
Every instance holds purchases to the new definition within milliseconds of the 200, as \
for a pause. Orders already made are kept: a lowered limit refuses new purchases over it \
and cancels none, and a sale ended early (`sale_ends_at` now) leaves its unpaid orders \
payable until their own deadline. Idempotent by `request_id`.",
    params(("id" = i64, Path, description = "The product id, in decimal digits without sign or leading zero.", format = Int64, minimum = 1)),
    request_body(content = ProductPatchBody, content_type = "application/json"),
    security(("bearerAuth" = [])),
    responses((status = 200, description = "Changed (or already, under this request_id): the product now.", body = ProductJson)),
)]
async fn patch_product(
    started: Started,
    State(state): State<AppState>,
    headers: HeaderMap,
    id: PathParam,
    body: Result<Body, ApiError>,
) -> Response {
    let result = async {
        let (admin, product_id, body) = admin_target(&state, &headers, id, body)?;
        let b: ProductPatchBody = json(&body)?;
        let action = admin_action(admin, product_id, &b.request_id)?;
        let change = ProductChange::parse(
            b.name.as_deref(),
            b.per_user_limit,
            b.sale_starts_at,
            b.sale_ends_at,
        )
        .map_err(invalid)?;
        let view = deadline(&state, state.config.control.change(action, change)).await?;
        Ok::<_, ApiError>(Json(ProductJson::from(&view)))
    }
    .await;
    counted(started, &state, PATCH_PRODUCT, result)
}

/// The admin, the product and the body of an admin's action on a product, in the order
/// they are checked: credentials first (a stranger learns nothing of what else was
/// wrong), then the product id, then the body's arrival.
fn admin_target(
    state: &AppState,
    headers: &HeaderMap,
    id: PathParam,
    body: Result<Body, ApiError>,
) -> Result<(AdminName, ProductId, Bytes), ApiError> {
    let admin = require_admin(state, headers)?;
    let product_id = ProductId::parse(path_id(id, "product_id")?).map_err(invalid)?;
    let Body(body) = body?;
    Ok((admin, product_id, body))
}

/// The action an admin's body names under its request_id.
fn admin_action(
    admin: AdminName,
    product_id: ProductId,
    request_id: &str,
) -> Result<AdminAction, ApiError> {
    Ok(AdminAction {
        request_id: RequestId::parse("request_id", request_id).map_err(invalid)?,
        product_id,
        admin,
    })
}

#[utoipa::path(
    post,
    path = "/v1/purchases",
    tag = "purchases",
    summary = "Buy: reserve units and create an order awaiting payment",
    description = "Idempotent by `request_id`: on 503 the outcome is unknown, retry with the \
same request_id until the answer is known.",
    request_body(content = PurchaseBody, content_type = "application/json"),
    security((), ("buyerJwt" = [])),
    responses(
        (status = 201, description = "Purchased: the order, awaiting payment.", body = OrderJson),
        (status = 200, description = "A replay of an earlier purchase with this request_id: the same order, as it stands now.", body = OrderJson),
    ),
)]
async fn purchase(
    started: Started,
    State(state): State<AppState>,
    client: Client,
    buyer: Buyer,
    body: Result<Body, ApiError>,
) -> Response {
    let result = purchase_of(&state, started.0, client, buyer, body).await;
    counted(started, &state, PURCHASE, result)
}

async fn purchase_of(
    state: &AppState,
    now: Instant,
    Client(client): Client,
    Buyer(buyer): Buyer,
    body: Result<Body, ApiError>,
) -> Result<impl IntoResponse, ApiError> {
    let limits = &state.config.limits;
    if let (Some(limiter), Some(ip)) = (&limits.per_address, client) {
        limiter
            .check(address_key(ip), now.saturating_duration_since(limits.epoch))
            .map_err(|l| ApiError::rate_limited("client address", l.retry_after))?;
    }
    let buyer = buyer?;
    let Body(body) = body?;
    let b: PurchaseBody = json(&body)?;
    // The per-user limits (the rate and `per_user_limit`) then count this user.
    let user = acting_user(buyer, b.user_id)?;
    let max = state.service.settings().max_quantity_per_order;
    let mut request =
        PurchaseRequest::parse(&b.request_id, user.get(), b.product_id, b.quantity, max)
            .map_err(invalid)?;
    if buyer.is_some() {
        request.request_id = RequestId::scoped(user, &request.request_id);
        debug_assert_eq!(
            request.request_id.scope(),
            Some(request.user_id),
            "an authenticated purchase is keyed by the buyer who makes it"
        );
    }
    // Both boxed: each future is large, and each layer it passes through (`deadline`,
    // `in_slot`, `within`, `lazy_timeout`) would move it by value; boxed, a refusal costs
    // about 900 instructions less. The baselines' future is boxed too: held inline, it
    // made this function's future, and every future holding it, 1.5 KB larger, copied at
    // each of their moves, flashsale's path included.
    let purchased = match &state.config.baseline {
        Some(baseline) => deadline(state, Box::pin(baseline.purchase(request))).await?,
        None => deadline(state, Box::pin(state.service.purchase(request))).await?,
    };
    let status = if purchased.replay {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, OrderAnswer::of(&purchased.order)))
}

#[utoipa::path(
    get,
    path = "/v1/purchases/{request_id}",
    tag = "purchases",
    summary = "The order a purchase's request_id created",
    params(("request_id" = String, Path, description = "The purchase's idempotency key. With buyer authentication, the caller's own request_ids only: another buyer's is not found.", min_length = 1, max_length = 64, pattern = r"^[A-Za-z0-9_.:-]+$")),
    security((), ("buyerJwt" = [])),
    responses((status = 200, description = "The order.", body = OrderJson)),
)]
async fn get_purchase(
    started: Started,
    State(state): State<AppState>,
    Buyer(buyer): Buyer,
    request_id: PathParam,
) -> Response {
    let result = async {
        let request_id = path(request_id)?;
        let request_id = RequestId::parse("request_id", &request_id).map_err(invalid)?;
        let buyer = buyer?;
        // An authenticated buyer's request_ids are their own: the key is scoped by them,
        // so another buyer's request_id finds nothing, as one never used.
        let request_id = match buyer {
            Some(user) => RequestId::scoped(user, &request_id),
            None => request_id,
        };
        let order = deadline(&state, state.service.purchase_record(&request_id)).await?;
        visible(order, buyer)
    }
    .await;
    counted(started, &state, GET_PURCHASE, result)
}

#[utoipa::path(
    get,
    path = "/v1/orders/{id}",
    tag = "orders",
    summary = "An order",
    params(("id" = i64, Path, description = "The order id, in decimal digits without sign or leading zero.", format = Int64, minimum = 1)),
    security((), ("buyerJwt" = [])),
    responses((status = 200, description = "The order.", body = OrderJson)),
)]
async fn get_order(
    started: Started,
    State(state): State<AppState>,
    Buyer(buyer): Buyer,
    id: PathParam,
) -> Response {
    let result = async {
        let id = OrderId::parse(path_id(id, "order_id")?).map_err(invalid)?;
        let buyer = buyer?;
        let order = deadline(&state, state.service.order(id)).await?;
        visible(order, buyer)
    }
    .await;
    counted(started, &state, GET_ORDER, result)
}

#[utoipa::path(
    post,
    path = "/v1/orders/{id}/pay",
    tag = "orders",
    summary = "Pay an order awaiting payment (idempotent)",
    params(("id" = i64, Path, description = "The order id, in decimal digits without sign or leading zero.", format = Int64, minimum = 1)),
    request_body(content = UserBody, content_type = "application/json", description = "The acting buyer. Without buyer authentication (the default) it is required; with it the body may be left out (no Content-Type needed)."),
    security((), ("buyerJwt" = [])),
    responses((status = 200, description = "Paid (or already): the order.", body = OrderJson)),
)]
async fn pay(
    started: Started,
    State(state): State<AppState>,
    buyer: Buyer,
    id: PathParam,
    body: Result<Body, ApiError>,
) -> Response {
    let result = async {
        let (id, user) = order_and_user(buyer, id, body)?;
        let order = deadline(&state, state.service.pay(id, user)).await?;
        Ok::<_, ApiError>(OrderAnswer::of(&order))
    }
    .await;
    counted(started, &state, PAY, result)
}

#[utoipa::path(
    post,
    path = "/v1/orders/{id}/cancel",
    tag = "orders",
    summary = "Cancel an order awaiting payment, returning its stock (idempotent)",
    params(("id" = i64, Path, description = "The order id, in decimal digits without sign or leading zero.", format = Int64, minimum = 1)),
    request_body(content = UserBody, content_type = "application/json", description = "The acting buyer. Without buyer authentication (the default) it is required; with it the body may be left out (no Content-Type needed)."),
    security((), ("buyerJwt" = [])),
    responses((status = 200, description = "Cancelled (or already): the order.", body = OrderJson)),
)]
async fn cancel(
    started: Started,
    State(state): State<AppState>,
    buyer: Buyer,
    id: PathParam,
    body: Result<Body, ApiError>,
) -> Response {
    let result = async {
        let (id, user) = order_and_user(buyer, id, body)?;
        let order = deadline(&state, state.service.cancel(id, user)).await?;
        Ok::<_, ApiError>(OrderAnswer::of(&order))
    }
    .await;
    counted(started, &state, CANCEL, result)
}

#[utoipa::path(
    post,
    path = "/v1/orders/{id}/refund",
    tag = "orders",
    summary = "Refund a paid order (admin)",
    description = "Moves a PAID order to REFUNDED: `sold` drops by its units, which go back on \
sale at once with `restock: true` (a purchase may take them the next moment) or leave the \
stock with `restock: false` (the total drops by them). The buyer's per-user limit no longer \
counts them. Refunding a refunded order again changes nothing and answers it; a \
PENDING_PAYMENT or CANCELLED order is 409 `order_not_refundable`. Idempotent by \
`request_id`: on 503 the outcome is unknown, retry with the same request_id.",
    params(("id" = i64, Path, description = "The order id, in decimal digits without sign or leading zero.", format = Int64, minimum = 1)),
    request_body(content = RefundBody, content_type = "application/json"),
    security(("bearerAuth" = [])),
    responses((status = 200, description = "Refunded (now, or before): the order.", body = OrderJson)),
)]
async fn refund(
    started: Started,
    State(state): State<AppState>,
    headers: HeaderMap,
    id: PathParam,
    body: Result<Body, ApiError>,
) -> Response {
    let result = async {
        let admin = require_admin(&state, &headers)?;
        let order_id = OrderId::parse(path_id(id, "order_id")?).map_err(invalid)?;
        let Body(body) = body?;
        let b: RefundBody = json(&body)?;
        let ask = RefundAsk {
            request_id: RequestId::parse("request_id", &b.request_id).map_err(invalid)?,
            order_id,
            admin,
            restock: b.restock,
        };
        let order = deadline(&state, state.config.control.refund(ask)).await?;
        Ok::<_, ApiError>(OrderAnswer::of(&order))
    }
    .await;
    counted(started, &state, REFUND, result)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the request deadline's three outcomes: a use case answered without waiting
    // returns its result without a timer (the runtime here has none: arming one would
    // panic); one that never answers gets 503 unavailable once the limit passed; one that
    // answers after waiting, within the limit, returns its result.
    #[test]
    fn the_deadline_bounds_only_what_waits() {
        let no_timers = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let ready = no_timers.block_on(within(Duration::from_millis(1), async { Ok(7) }));
        assert_eq!(ready.ok(), Some(7));
        let refused = no_timers.block_on(within(Duration::from_millis(1), async {
            Err::<(), _>(flashsale_app::Error::SoldOut)
        }));
        assert_eq!(refused.err().map(|e| e.outcome), Some(Outcome::SoldOut));

        let timers = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let never = timers.block_on(within(
            Duration::from_millis(20),
            std::future::pending::<Result<(), flashsale_app::Error>>(),
        ));
        let e = never.expect_err("past the deadline");
        assert_eq!(
            (e.status(), e.outcome),
            (StatusCode::SERVICE_UNAVAILABLE, Outcome::Unavailable)
        );
        let late = timers.block_on(within(Duration::from_secs(30), async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            Ok(8)
        }));
        assert_eq!(late.ok(), Some(8));
    }

    // Checks the liveness answer: 200, JSON, and the body `{"status":"ok"}` that the
    // OpenAPI document's `Health` schema describes. How: the handler's response read whole.
    #[tokio::test]
    async fn healthz_answers_ok_as_json() {
        let response = healthz().await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers().get(header::CONTENT_TYPE),
            Some(&HeaderValue::from_static("application/json"))
        );
        let body = axum::body::to_bytes(response.into_body(), 1024)
            .await
            .expect("body");
        let v: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(v, serde_json::json!({"status": "ok"}));
    }

    // Checks which Content-Types are JSON's: the exact `application/json`, any case, with
    // parameters or spaces; not another type, a longer name, or bytes that are not text.
    #[test]
    fn a_content_type_is_json_in_any_spelling() {
        let is = |v: &[u8]| is_json(&HeaderValue::from_bytes(v).expect("header value"));
        for json in [
            &b"application/json"[..],
            b"Application/JSON",
            b"application/json; charset=utf-8",
            b" application/json ;q=1",
        ] {
            assert!(is(json), "{:?}", String::from_utf8_lossy(json));
        }
        for other in [
            &b"text/plain"[..],
            b"application/jsonx",
            b"application/json-seq",
            b"application/\xffjson",
            b"",
        ] {
            assert!(!is(other), "{:?}", String::from_utf8_lossy(other));
        }
    }

    // Checks which address a forwarding header names: its last entry, bare or with a
    // port, IPv6 bracketed or not; nothing when that entry is no address.
    #[test]
    fn a_forwarding_header_names_its_last_address() {
        let ip = |s: &str| s.parse::<IpAddr>().ok();
        for (value, want) in [
            ("203.0.113.7", ip("203.0.113.7")),
            ("198.51.100.1, 203.0.113.7", ip("203.0.113.7")),
            ("198.51.100.1,203.0.113.7:5555", ip("203.0.113.7")),
            ("2001:db8::1", ip("2001:db8::1")),
            ("[2001:db8::1]", ip("2001:db8::1")),
            ("10.0.0.1, [2001:db8::1]:443", ip("2001:db8::1")),
            ("203.0.113.7, unknown", None),
            ("", None),
            ("203.0.113.7,", None),
        ] {
            assert_eq!(last_address(value), want, "{value:?}");
        }
    }

    // Checks a JSON body's reading: a purchase reads with its request_id borrowed, an
    // escaped one (\u0041) decoded, after JSON's whitespace; a body that is not UTF-8 (a
    // bare 0xff, inside a string or outside), not JSON, of the wrong shape, an array of
    // the fields in order, or with a field the body does not have is `invalid_request`.
    #[test]
    fn a_body_is_read_as_json_text() {
        let body =
            Bytes::from_static(br#"{"request_id":"R_1","user_id":7,"product_id":1,"quantity":2}"#);
        let p: PurchaseBody<'_> = json(&body).expect("a purchase");
        assert!(matches!(p.request_id, std::borrow::Cow::Borrowed("R_1")));
        assert_eq!((p.user_id, p.product_id, p.quantity), (Some(7), 1, 2));
        let escaped =
            Bytes::from_static(br#"{"request_id":"R_\u0041","product_id":1,"quantity":1}"#);
        let p: PurchaseBody<'_> = json(&escaped).expect("a purchase");
        assert_eq!(p.request_id, "R_A");
        let spaced =
            Bytes::from_static(b" \r\n\t{\"request_id\":\"R_2\",\"product_id\":1,\"quantity\":1}");
        let p: PurchaseBody<'_> = json(&spaced).expect("a purchase");
        assert_eq!(p.request_id, "R_2");
        for bad in [
            &b"{\"request_id\":\"R_\xff\",\"product_id\":1,\"quantity\":1}"[..],
            b"\xff{}",
            b"{\"request_id\":",
            b"[]",
            b"[\"R_1\",7,1,2]",
            b" [\"R_1\",7,1,2]",
            b"{\"request_id\":\"R_1\",\"product_id\":1,\"quantity\":1,\"quantity_max\":9}",
        ] {
            let e = json::<PurchaseBody<'_>>(&Bytes::copy_from_slice(bad)).expect_err("refused");
            assert_eq!(e.outcome, Outcome::InvalidRequest, "{bad:?}");
        }
    }
}
