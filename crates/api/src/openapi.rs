//! The API's OpenAPI 3.1 document, generated from the code: the operations from the
//! handlers' `#[utoipa::path]` annotations (`routes.rs`), the bodies from the wire types'
//! `ToSchema` derives (`wire.rs`), and the error answers of each operation from
//! [`ERRORS`] and the one outcome → status mapping (`error::status`), so a code moved to
//! another status moves in the document too. Served at `GET /openapi.json` and committed
//! as `docs/openapi.json`; the server's `openapi` test keeps the two, and the router's
//! routes, in step.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use axum::body::Bytes;
use flashsale_app::Outcome;
use flashsale_core::{CancelReason, OrderStatus, StockMode};
use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::Operation;
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::{AdditionalProperties, KnownFormat, SchemaFormat};
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{ObjectBuilder, RefOr, Schema, Type};
use utoipa::{Modify, OpenApi, ToSchema};

use crate::error::status;
use crate::routes;

/// The body of `GET /healthz`.
#[derive(ToSchema)]
#[allow(dead_code)] // A schema only: the handler answers `{"status": "ok"}` itself.
pub(crate) struct Health {
    #[schema(schema_with = ok_schema)]
    status: String,
}

/// The body of `GET /readyz` when ready.
#[derive(ToSchema)]
#[allow(dead_code)] // A schema only: the handler answers `{"status": "ready"}` itself.
pub(crate) struct Ready {
    #[schema(schema_with = ready_schema)]
    status: String,
}

fn ok_schema() -> ObjectBuilder {
    string_of(["ok"])
}

fn ready_schema() -> ObjectBuilder {
    string_of(["ready"])
}

/// A string schema whose value is one of `values`.
fn string_of<'a>(values: impl IntoIterator<Item = &'a str>) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(values))
}

/// An order's `status`: every [`OrderStatus`]'s name.
pub(crate) fn order_status_schema() -> ObjectBuilder {
    string_of(OrderStatus::ALL.map(OrderStatus::as_str))
}

/// An order's `cancel_reason`: every [`CancelReason`]'s name.
pub(crate) fn cancel_reason_schema() -> ObjectBuilder {
    // The match fails to build when a reason is added, until it is listed here.
    let every = [CancelReason::UserCancelled, CancelReason::PaymentTimeout];
    let _listed = |r: CancelReason| match r {
        CancelReason::UserCancelled | CancelReason::PaymentTimeout => (),
    };
    string_of(every.map(CancelReason::as_str))
}

/// A product's `stock_mode`: every [`StockMode`]'s API name.
pub(crate) fn stock_mode_schema() -> ObjectBuilder {
    // The match fails to build when a mode is added, until it is listed here.
    let every = [StockMode::Gate, StockMode::Ledger];
    let _listed = |m: StockMode| match m {
        StockMode::Gate | StockMode::Ledger => (),
    };
    string_of(every.map(StockMode::as_str))
}

use Outcome as O;

/// Every error code each operation can answer, by (method, path) as in
/// [`routes::ROUTES`]; its status is the outcome's (`error::status`). Read off the
/// handlers: a JSON body can fail to parse or arrive (400, 413, 408, 415); a buyer's
/// credentials (401) and a body's `user_id` that is not the buyer (403) apply with buyer
/// authentication on; every use case runs in an in-flight slot under the request deadline
/// (503); the rest are the use cases' own refusals.
/// The errors of an admin's write on a product under a request_id (change, restock,
/// pause, resume): credentials, the body, the product, the request_id's other use, a store.
const PRODUCT_ACTION: &[Outcome] = &[
    O::InvalidRequest,
    O::Unauthorized,
    O::PayloadTooLarge,
    O::RequestTimeout,
    O::UnsupportedMediaType,
    O::ProductNotFound,
    O::RequestIdConflict,
    O::Unavailable,
];
/// A destock's errors: an admin's write on a product's, and too little stock available.
const DESTOCK: [Outcome; 9] = joined(&[O::InsufficientStock], PRODUCT_ACTION);
/// The errors of a buyer's write on an order (pay, cancel): the body, credentials, an
/// order not the buyer's or not found, a store; each adds the states that refuse it.
const ORDER_ACTION: &[Outcome] = &[
    O::InvalidRequest,
    O::Unauthorized,
    O::PayloadTooLarge,
    O::RequestTimeout,
    O::UnsupportedMediaType,
    O::Forbidden,
    O::OrderNotFound,
    O::Unavailable,
];
const PAY: [Outcome; 10] = joined(ORDER_ACTION, &[O::OrderNotPayable, O::OrderExpired]);
const CANCEL: [Outcome; 9] = joined(ORDER_ACTION, &[O::OrderNotCancellable]);
pub(crate) const ERRORS: &[(&str, &str, &[Outcome])] = &[
    ("get", "/metrics", &[]),
    ("get", "/dashboard", &[]),
    ("get", "/dashboard/app.js", &[]),
    ("get", "/dashboard/style.css", &[]),
    ("get", "/dashboard/data", &[]),
    ("get", "/healthz", &[]),
    ("get", "/readyz", &[O::Unavailable]),
    ("get", "/openapi.json", &[]),
    (
        "post",
        "/v1/products",
        &[
            O::Unauthorized,
            O::InvalidRequest,
            O::PayloadTooLarge,
            O::RequestTimeout,
            O::UnsupportedMediaType,
            O::ProductExists,
            O::Unavailable,
        ],
    ),
    (
        "get",
        "/v1/products",
        &[O::Unauthorized, O::InvalidRequest, O::Unavailable],
    ),
    (
        "get",
        "/v1/products/{id}",
        &[O::InvalidRequest, O::ProductNotFound, O::Unavailable],
    ),
    ("patch", "/v1/products/{id}", PRODUCT_ACTION),
    ("post", "/v1/products/{id}/restock", PRODUCT_ACTION),
    ("post", "/v1/products/{id}/pause", PRODUCT_ACTION),
    ("post", "/v1/products/{id}/resume", PRODUCT_ACTION),
    ("post", "/v1/products/{id}/destock", &DESTOCK),
    (
        "post",
        "/v1/purchases",
        &[
            O::RateLimited,
            O::Unauthorized,
            O::InvalidRequest,
            O::PayloadTooLarge,
            O::RequestTimeout,
            O::UnsupportedMediaType,
            O::Forbidden,
            O::ProductNotFound,
            O::SaleNotActive,
            O::SalePaused,
            O::SoldOut,
            O::LimitExceeded,
            O::RequestIdConflict,
            O::RequestReleased,
            O::Unavailable,
        ],
    ),
    (
        "get",
        "/v1/purchases/{request_id}",
        &[
            O::InvalidRequest,
            O::Unauthorized,
            O::OrderNotFound,
            O::Unavailable,
        ],
    ),
    (
        "get",
        "/v1/orders",
        &[
            O::Unauthorized,
            O::InvalidRequest,
            O::Forbidden,
            O::Unavailable,
        ],
    ),
    (
        "get",
        "/v1/orders/{id}",
        &[
            O::InvalidRequest,
            O::Unauthorized,
            O::OrderNotFound,
            O::Unavailable,
        ],
    ),
    ("post", "/v1/orders/{id}/pay", &PAY),
    ("post", "/v1/orders/{id}/cancel", &CANCEL),
    (
        "post",
        "/v1/orders/{id}/refund",
        &[
            O::InvalidRequest,
            O::Unauthorized,
            O::PayloadTooLarge,
            O::RequestTimeout,
            O::UnsupportedMediaType,
            O::OrderNotFound,
            O::OrderNotRefundable,
            O::RequestIdConflict,
            O::Unavailable,
        ],
    ),
    (
        "get",
        "/v1/admin/actions",
        &[O::Unauthorized, O::InvalidRequest, O::Unavailable],
    ),
];

/// `first`'s outcomes, then `then`'s: one operation's errors built on a shared list. The
/// order matters only among the codes of one status (the order of its `error` enum).
const fn joined<const N: usize>(first: &[Outcome], then: &[Outcome]) -> [Outcome; N] {
    assert!(first.len() + then.len() == N, "N is the two lists' length");
    let mut all = [O::Unavailable; N];
    let mut i = 0;
    while i < N {
        all[i] = if i < first.len() {
            first[i]
        } else {
            then[i - first.len()]
        };
        i += 1;
    }
    all
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "flashsale",
        description = "A flash-sale service: products with limited stock, purchases that \
reserve it (idempotent by `request_id`), and orders paid or cancelled before their deadline. \
Every error answer is `{\"error\": code, \"message\": text}`, its code one of those listed \
for the operation and status.",
    ),
    paths(
        routes::metrics_text,
        routes::dashboard_page,
        routes::dashboard_script,
        routes::dashboard_style,
        routes::dashboard_data,
        routes::healthz,
        routes::readyz,
        routes::openapi_json,
        routes::create_product,
        routes::list_products,
        routes::get_product,
        routes::patch_product,
        routes::restock,
        routes::pause,
        routes::resume,
        routes::destock,
        routes::purchase,
        routes::get_purchase,
        routes::list_orders,
        routes::get_order,
        routes::pay,
        routes::cancel,
        routes::refund,
        routes::list_actions,
    ),
    modifiers(&Security, &Errors, &Links),
    tags(
        (name = "probes", description = "Liveness, readiness, metrics and this document."),
        (name = "dashboard", description = "The live sale page, for the operator (moves with the metrics to `FLASHSALE_METRICS_LISTEN`)."),
        (name = "products", description = "Products on sale and their stock (changes: admin)."),
        (name = "purchases", description = "Buying: a purchase creates an order."),
        (name = "orders", description = "Orders: read, pay, cancel."),
    ),
)]
struct ApiDoc;

/// The security schemes: the admin's token, and the buyer's optional JWT.
struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let mut admin = Http::new(HttpAuthScheme::Bearer);
        admin.description = Some(
            "The admin token (`FLASHSALE_ADMIN_TOKEN`), required by the admin endpoints."
                .to_owned(),
        );
        components.add_security_scheme("bearerAuth", SecurityScheme::Http(admin));
        let mut buyer = Http::new(HttpAuthScheme::Bearer);
        buyer.bearer_format = Some("JWT".to_owned());
        buyer.description = Some(
            "The buyer, when `FLASHSALE_BUYER_AUTH=jwt`: a JWT whose `sub` is the decimal \
             user id, verified with the configured key. With `FLASHSALE_BUYER_AUTH=header` a \
             gateway names the buyer in a configured header instead; with neither (the \
             default), the body's `user_id` says who buys."
                .to_owned(),
        );
        components.add_security_scheme("buyerJwt", SecurityScheme::Http(buyer));
    }
}

/// Adds each operation's error answers ([`ERRORS`]), one response per status with the
/// codes of that status as the body's `error` enum.
struct Errors;

impl Modify for Errors {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for &(method, path, outcomes) in ERRORS {
            let Some(operation) = operation_mut(openapi, method, path) else {
                // A route the document lacks: the openapi tests name it.
                continue;
            };
            let mut by_status: BTreeMap<u16, Vec<&str>> = BTreeMap::new();
            for &o in outcomes {
                by_status
                    .entry(status(o).as_u16())
                    .or_default()
                    .push(o.as_str());
            }
            for (code, codes) in by_status {
                operation
                    .responses
                    .responses
                    .insert(code.to_string(), RefOr::T(error_response(code, &codes)));
            }
        }
    }
}

/// The links a client (or a fuzzer's stateful phase) follows from one answer to the
/// next operation: from a created product to buying it, reading, changing, restocking,
/// pausing, resuming and destocking it;
/// from a purchase to its order, its request_id, paying and cancelling it; from a paid
/// order to refunding it. Each answer is (method, path, status), then its links.
const LINKS: &[(&str, &str, &str, &[LinkSpec])] = &[
    (
        "post",
        "/v1/products",
        "201",
        &[
            ("GetProduct", "get_product", PRODUCT_ID, None),
            ("Restock", "restock", PRODUCT_ID, None),
            ("Pause", "pause", PRODUCT_ID, None),
            ("Patch", "patch_product", PRODUCT_ID, None),
            ("Resume", "resume", PRODUCT_ID, None),
            ("Destock", "destock", PRODUCT_ID, None),
            (
                "Purchase",
                "purchase",
                &[],
                Some(&[("product_id", "$response.body#/product_id")]),
            ),
        ],
    ),
    (
        "post",
        "/v1/purchases",
        "201",
        &[
            ("GetOrder", "get_order", ORDER_ID, None),
            (
                "GetPurchase",
                "get_purchase",
                &[("request_id", "$response.body#/request_id")],
                None,
            ),
            ("Pay", "pay", ORDER_ID, Some(ORDER_BUYER)),
            ("Cancel", "cancel", ORDER_ID, Some(ORDER_BUYER)),
        ],
    ),
    (
        "post",
        "/v1/orders/{id}/pay",
        "200",
        &[("Refund", "refund", ORDER_ID, None)],
    ),
];
/// One link: (link name, target operation id, path parameters, body), the values runtime
/// expressions over the answer's body.
type LinkSpec = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
    Option<&'static [(&'static str, &'static str)]>,
);
/// The answer's product as the `id` path parameter.
const PRODUCT_ID: &[(&str, &str)] = &[("id", "$response.body#/product_id")];
/// The answer's order as the `id` path parameter.
const ORDER_ID: &[(&str, &str)] = &[("id", "$response.body#/order_id")];
/// The answer's order's buyer as the body's `user_id`.
const ORDER_BUYER: &[(&str, &str)] = &[("user_id", "$response.body#/user_id")];

/// Adds [`LINKS`] to the answers they start from.
struct Links;

impl Modify for Links {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for (method, path, status, links) in LINKS {
            let Some(RefOr::T(response)) = operation_mut(openapi, method, path)
                .and_then(|o| o.responses.responses.get_mut(*status))
            else {
                // An answer the document lacks: the openapi tests name the route.
                continue;
            };
            for (name, target, parameters, body) in *links {
                response.links.insert(
                    (*name).to_owned(),
                    RefOr::T(link(target, parameters, *body)),
                );
            }
        }
    }
}

/// A link to the operation `target`, with its path `parameters` and its `body`'s fields.
fn link(
    target: &str,
    parameters: &[(&str, &str)],
    body: Option<&[(&str, &str)]>,
) -> utoipa::openapi::link::Link {
    let mut link = utoipa::openapi::link::LinkBuilder::new().operation_id(target);
    for (parameter, value) in parameters {
        link = link.parameter(*parameter, *value);
    }
    if let Some(fields) = body {
        let object: serde_json::Map<String, serde_json::Value> = fields
            .iter()
            .map(|(field, value)| ((*field).to_owned(), (*value).into()))
            .collect();
        link = link.request_body(Some(serde_json::Value::Object(object)));
    }
    link.build()
}

/// The operation of `method` on `path`, if the document has it.
fn operation_mut<'a>(
    openapi: &'a mut utoipa::openapi::OpenApi,
    method: &str,
    path: &str,
) -> Option<&'a mut Operation> {
    let item = openapi.paths.paths.get_mut(path)?;
    match method {
        "get" => item.get.as_mut(),
        "post" => item.post.as_mut(),
        "patch" => item.patch.as_mut(),
        _ => {
            debug_assert!(
                false,
                "ERRORS and LINKS name only the API's methods, not {method}"
            );
            None
        }
    }
}

/// An error answer of HTTP status `code` whose body's `error` is one of `codes`, with the
/// headers that status carries.
fn error_response(code: u16, codes: &[&str]) -> utoipa::openapi::Response {
    let reason = axum::http::StatusCode::from_u16(code)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error");
    let list = codes
        .iter()
        .map(|c| format!("`{c}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let body: Schema = ObjectBuilder::new()
        .schema_type(Type::Object)
        .property("error", string_of(codes.iter().copied()))
        .required("error")
        .property(
            "message",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .description(Some("What went wrong, for a person.")),
        )
        .required("message")
        .additional_properties(Some(AdditionalProperties::FreeForm(false)))
        .into();
    let mut response = ResponseBuilder::new()
        .description(format!("{reason}: {list}."))
        .content(
            "application/json",
            ContentBuilder::new().schema(Some(body)).build(),
        );
    let seconds = || {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
            .minimum(Some(1))
    };
    response = match code {
        429 => response.header(
            "Retry-After",
            HeaderBuilder::new()
                .schema(Some(seconds()))
                .description(Some("Seconds to wait before a retry; nothing was done."))
                .build(),
        ),
        503 => response.header(
            "Retry-After",
            HeaderBuilder::new()
                .schema(Some(seconds()))
                .description(Some(
                    "Seconds to wait before a retry with the same request.",
                ))
                .build(),
        ),
        401 => response.header(
            "WWW-Authenticate",
            HeaderBuilder::new()
                .schema(Some(ObjectBuilder::new().schema_type(Type::String)))
                .description(Some(
                    "The bearer challenge, when the credentials were a bearer token's.",
                ))
                .build(),
        ),
        _ => response,
    };
    response.build()
}

/// The document.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// The document as served and committed: pretty JSON, every object's keys sorted (through
/// `serde_json::Value`, whose maps are ordered), ending in a newline.
pub fn document_json() -> String {
    // A tree of strings, numbers and maps with string keys: encoding cannot fail.
    let text = serde_json::to_value(document())
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_default();
    text + "\n"
}

/// [`document_json`], encoded once for the process.
pub(crate) fn encoded() -> Bytes {
    static ENCODED: LazyLock<Bytes> = LazyLock::new(|| Bytes::from(document_json()));
    ENCODED.clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that the error table and the router name the same operations, once each, and
    // that the document has every one of them: by comparing `ERRORS`' (method, path) with
    // `ROUTES` and looking each up in the generated document.
    #[test]
    fn every_route_has_its_errors_and_an_operation() {
        let routes: Vec<_> = routes::ROUTES.to_vec();
        let errors: Vec<_> = ERRORS.iter().map(|&(m, p, _)| (m, p)).collect();
        assert_eq!(routes, errors);
        let mut doc = document();
        for &(method, path) in routes::ROUTES {
            assert!(
                operation_mut(&mut doc, method, path).is_some(),
                "{method} {path}"
            );
        }
    }

    // Checks that `/metrics`' documented content type is the one the handler answers.
    #[test]
    fn metrics_content_type_is_the_served_one() {
        let doc = serde_json::to_value(document()).unwrap();
        let content = &doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"];
        assert!(content.get(routes::OPENMETRICS).is_some(), "{content}");
    }
}
