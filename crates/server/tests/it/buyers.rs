//! Buyer identity (`FLASHSALE_BUYER_AUTH`): with a verified JWT or a gateway's header, a
//! request acts, reads and is limited as its authenticated buyer only (I9); with `none`,
//! the body's `user_id` is taken as given.

use jsonwebtoken::{Algorithm, EncodingKey};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::bad_input::snapshot;
use crate::helpers::{buyer_token, code, fixture, order_id, user_rate, TestApp};

/// The HS256 secret of the tests.
const SECRET: &str = "test-buyer-secret-of-at-least-32-bytes";

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

fn hs256(user: i64, lifetime_secs: i64) -> String {
    let key = EncodingKey::from_secret(SECRET.as_bytes()).expect("key");
    buyer_token(&key, Algorithm::HS256, user, lifetime_secs)
}

/// A purchase of one unit of `product` by whoever `auth` says, with `user` in the body
/// when given.
/// `POST /v1/orders/{order}/{action}` with `body`, as `auth`, which must answer 200 with
/// the order now in `status`.
async fn resolved(
    app: &TestApp,
    (order, action, body): (i64, &str, Option<Value>),
    auth: &[(&str, &str)],
    status: &str,
) {
    let path = format!("/v1/orders/{order}/{action}");
    let (s, b, _) = app.send_with(Method::POST, &path, body, auth).await;
    assert_eq!(
        (s, b["status"].as_str()),
        (StatusCode::OK, Some(status)),
        "{b}"
    );
}

/// [`buy`] of one unit of `product` with the `Authorization` header `auth` (the body
/// naming no user).
async fn buy_authorized(
    app: &TestApp,
    auth: &str,
    request_id: &str,
    product: i64,
) -> (StatusCode, Value, reqwest::header::HeaderMap) {
    buy(app, &[("authorization", auth)], request_id, None, product).await
}

async fn buy(
    app: &TestApp,
    auth: &[(&str, &str)],
    request_id: &str,
    user: Option<i64>,
    product: i64,
) -> (StatusCode, Value, reqwest::header::HeaderMap) {
    let mut body = json!({"request_id": request_id, "product_id": product, "quantity": 1});
    if let Some(user) = user {
        body["user_id"] = json!(user);
    }
    app.send_with(Method::POST, "/v1/purchases", Some(body), auth)
        .await
}

/// Checks that another buyer cannot see, pay or cancel an order: GET of the order and of
/// its purchase, pay and cancel, each as `intruder`, answer 404 `order_not_found` (as an
/// unused id would) and change nothing; then the owner reads it.
async fn confined(
    app: &TestApp,
    order: i64,
    request_id: &str,
    owner: &[(&str, &str)],
    intruder: &[(&str, &str)],
) {
    let before = snapshot(app).await;
    for (method, path) in [
        (Method::GET, format!("/v1/orders/{order}")),
        (Method::GET, format!("/v1/purchases/{request_id}")),
        (Method::POST, format!("/v1/orders/{order}/pay")),
        (Method::POST, format!("/v1/orders/{order}/cancel")),
    ] {
        let body = (method == Method::POST).then(|| json!({}));
        let (s, b, _) = app.send_with(method.clone(), &path, body, intruder).await;
        assert_eq!(
            (s, code(&b)),
            (StatusCode::NOT_FOUND, "order_not_found"),
            "{method} {path}: {b}"
        );
        assert_eq!(
            snapshot(app).await,
            before,
            "{method} {path} changed something"
        );
    }
    let (s, b, _) = app
        .send_with(Method::GET, &format!("/v1/orders/{order}"), None, owner)
        .await;
    assert_eq!(
        (s, b["status"].as_str()),
        (StatusCode::OK, Some("PENDING_PAYMENT")),
        "{b}"
    );
}

// Checks the jwt mode with an HS256 secret: a buyer's token buys without a user_id in
// the body, and the order is theirs; a body naming another user is 403 `forbidden` and
// changes nothing; no token, a token signed with another key, an expired one, an
// unsigned one (`alg: none`) and one of another algorithm are 401 `unauthorized` with
// `WWW-Authenticate: Bearer…`; the scheme's name is case-insensitive; another buyer's
// GET, pay and cancel of the order are 404; the owner pays it with an empty body; the
// product's per_user_limit counts the token's user, whatever the body would say.
#[tokio::test]
async fn jwt_buyers_act_on_their_own_orders_only() {
    let app = TestApp::selling_with(
        &[("BUYER_AUTH", "jwt"), ("BUYER_JWT_SECRET", SECRET)],
        (9101, 10, Some(1)),
    )
    .await;
    let alice = bearer(&hs256(11, 600));
    let bob = bearer(&hs256(12, 600));
    let as_alice = [("authorization", alice.as_str())];
    let as_bob = [("authorization", bob.as_str())];

    let before = snapshot(&app).await;
    let (s, b, _) = buy(&app, &as_alice, "JWT_1", Some(12), 9101).await;
    assert_eq!((s, code(&b)), (StatusCode::FORBIDDEN, "forbidden"), "{b}");
    let forged = EncodingKey::from_secret(b"another-secret-of-at-least-32-bytes!").expect("key");
    let refused = [
        None,
        Some(buyer_token(&forged, Algorithm::HS256, 11, 600)),
        Some(hs256(11, -120)),
        // {"alg":"none","typ":"JWT"} . {"sub":"11","exp":9999999999} . no signature
        Some("eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiIxMSIsImV4cCI6OTk5OTk5OTk5OX0.".into()),
        Some(buyer_token(
            &EncodingKey::from_secret(SECRET.as_bytes()).expect("key"),
            Algorithm::HS512,
            11,
            600,
        )),
    ];
    for token in &refused {
        let value = token.as_deref().map(bearer);
        let auth: Vec<(&str, &str)> = value
            .iter()
            .map(|v| ("authorization", v.as_str()))
            .collect();
        let (s, b, h) = buy(&app, &auth, "JWT_1", Some(11), 9101).await;
        assert_eq!(
            (s, code(&b)),
            (StatusCode::UNAUTHORIZED, "unauthorized"),
            "{token:?}: {b}"
        );
        let challenge = h
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        assert!(challenge.starts_with("Bearer"), "{token:?}: {challenge:?}");
    }
    assert_eq!(
        snapshot(&app).await,
        before,
        "a refused purchase changed something"
    );

    let lower = format!("bearer {}", hs256(11, 600));
    let (s, b, _) = buy_authorized(&app, &lower, "JWT_1", 9101).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    assert_eq!(b["user_id"], 11);
    let order = order_id(&b);
    // The same user named again in the body is allowed; the limit of one is theirs.
    let (s, b, _) = buy(&app, &as_alice, "JWT_2", Some(11), 9101).await;
    assert_eq!(
        (s, code(&b)),
        (StatusCode::CONFLICT, "limit_exceeded"),
        "{b}"
    );

    confined(&app, order, "JWT_1", &as_alice, &as_bob).await;
    resolved(&app, (order, "pay", None), &as_alice, "PAID").await;
    let (s, b, _) = app
        .send_with(Method::GET, "/v1/purchases/JWT_1", None, &as_alice)
        .await;
    assert_eq!(
        (s, b["order_id"].as_i64()),
        (StatusCode::OK, Some(order)),
        "{b}"
    );
    app.cleanup().await;
}

// Checks the jwt mode with public keys, RS256 and EdDSA (test keys in
// tests/it/fixtures): a token signed with the matching private key buys; one signed
// with the other kind of key, and an HS256 token whose HMAC key is the configured
// public key's PEM (the algorithm-confusion attack), are 401; the order is confined to
// its buyer.
#[tokio::test]
async fn jwt_public_keys_verify_their_own_algorithm_only() {
    let rsa = EncodingKey::from_rsa_pem(&fixture("buyer_rsa_private.pem")).expect("rsa");
    let ed = EncodingKey::from_ed_pem(&fixture("buyer_ed25519_private.pem")).expect("ed");
    let dir = format!("{}/tests/it/fixtures", env!("CARGO_MANIFEST_DIR"));
    for (public, key, algorithm, other, other_algorithm) in [
        (
            "buyer_rsa_public.pem",
            &rsa,
            Algorithm::RS256,
            &ed,
            Algorithm::EdDSA,
        ),
        (
            "buyer_ed25519_public.pem",
            &ed,
            Algorithm::EdDSA,
            &rsa,
            Algorithm::RS256,
        ),
    ] {
        let path = format!("{dir}/{public}");
        let app = TestApp::selling_with(
            &[
                ("BUYER_AUTH", "jwt"),
                ("BUYER_JWT_PUBLIC_KEY", path.as_str()),
            ],
            (9102, 10, None),
        )
        .await;
        let confusion = EncodingKey::from_secret(&fixture(public)).expect("hmac");
        for token in [
            buyer_token(other, other_algorithm, 21, 600),
            buyer_token(&confusion, Algorithm::HS256, 21, 600),
            buyer_token(key, algorithm, 21, -120),
        ] {
            let auth = bearer(&token);
            let (s, b, _) = buy_authorized(&app, &auth, "PK_1", 9102).await;
            assert_eq!(
                (s, code(&b)),
                (StatusCode::UNAUTHORIZED, "unauthorized"),
                "{public}: {b}"
            );
        }
        let owner = bearer(&buyer_token(key, algorithm, 21, 600));
        let intruder = bearer(&buyer_token(key, algorithm, 22, 600));
        let (s, b, _) = buy_authorized(&app, &owner, "PK_1", 9102).await;
        assert_eq!(
            (s, b["user_id"].as_i64()),
            (StatusCode::CREATED, Some(21)),
            "{public}: {b}"
        );
        confined(
            &app,
            order_id(&b),
            "PK_1",
            &[("authorization", owner.as_str())],
            &[("authorization", intruder.as_str())],
        )
        .await;
        app.cleanup().await;
    }
}

// Checks the header mode: the gateway's X-User-Id names the buyer; a request without
// it, or with a value that is no strict decimal id, is 401; a body naming another user
// is 403; another buyer's GET, pay and cancel are 404; and the per-user rate limit
// counts the header's user (rate 1/s, burst 2: the third purchase in a row is 429
// `rate_limited`, the second having met the per_user_limit), so changing the body's
// user_id no longer dodges either limit; and the other buyer's purchase with the owner's
// request_id is a new order of their own (request_ids are scoped by buyer).
#[tokio::test]
async fn header_buyers_are_confined_and_limited() {
    let settings = user_rate(("1", "2"), &[("BUYER_AUTH", "header")]);
    let app = TestApp::selling_with(&settings, (9103, 10, Some(1))).await;
    let (owner, intruder) = ([("x-user-id", "31")], [("x-user-id", "32")]);
    for bad in [
        &[][..],
        &[("x-user-id", "031")],
        &[("x-user-id", "+31")],
        &[("x-user-id", "abc")],
    ] {
        let (s, b, _) = buy(&app, bad, "HDR_1", Some(31), 9103).await;
        assert_eq!(
            (s, code(&b)),
            (StatusCode::UNAUTHORIZED, "unauthorized"),
            "{bad:?}: {b}"
        );
    }
    let (s, b, _) = buy(&app, &owner, "HDR_1", Some(32), 9103).await;
    assert_eq!((s, code(&b)), (StatusCode::FORBIDDEN, "forbidden"), "{b}");
    let (s, b, _) = buy(&app, &owner, "HDR_1", None, 9103).await;
    assert_eq!(
        (s, b["user_id"].as_i64()),
        (StatusCode::CREATED, Some(31)),
        "{b}"
    );
    let order = order_id(&b);
    let (s, b, _) = buy(&app, &owner, "HDR_2", None, 9103).await;
    assert_eq!(
        (s, code(&b)),
        (StatusCode::CONFLICT, "limit_exceeded"),
        "{b}"
    );
    let (s, b, h) = buy(&app, &owner, "HDR_3", Some(31), 9103).await;
    assert_eq!(
        (s, code(&b)),
        (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
        "{b}"
    );
    assert!(h.get("retry-after").is_some());
    confined(&app, order, "HDR_1", &owner, &intruder).await;
    resolved(
        &app,
        (order, "cancel", Some(json!({}))),
        &owner,
        "CANCELLED",
    )
    .await;
    // The owner's request_id is the owner's own: the other buyer's HDR_1 is theirs.
    let (s, b, _) = buy(&app, &intruder, "HDR_1", None, 9103).await;
    assert_eq!(
        (s, b["user_id"].as_i64(), b["request_id"].as_str()),
        (StatusCode::CREATED, Some(32), Some("HDR_1")),
        "{b}"
    );
    assert_ne!(order_id(&b), order);
    app.cleanup().await;
}

// Checks the none mode (the default, for development): the body's user_id is the buyer
// and must be there (400 without it), and any client may read any order — the trust the
// configuration reference (docs/configuration.md) warns about.
#[tokio::test]
async fn without_buyer_auth_the_body_names_the_buyer() {
    let app = TestApp::selling(9104, 10, None).await;
    let (s, b, _) = buy(&app, &[], "NONE_1", None, 9104).await;
    assert_eq!(
        (s, code(&b)),
        (StatusCode::BAD_REQUEST, "invalid_request"),
        "{b}"
    );
    let (s, b, _) = buy(&app, &[], "NONE_1", Some(41), 9104).await;
    assert_eq!(
        (s, b["user_id"].as_i64()),
        (StatusCode::CREATED, Some(41)),
        "{b}"
    );
    let (s, read) = app.get(&format!("/v1/orders/{}", order_id(&b))).await;
    assert_eq!(
        (s, read["user_id"].as_i64()),
        (StatusCode::OK, Some(41)),
        "{read}"
    );
    let (s, b) = app
        .post(&format!("/v1/orders/{}/pay", order_id(&b)), json!({}))
        .await;
    assert_eq!(
        (s, code(&b)),
        (StatusCode::BAD_REQUEST, "invalid_request"),
        "{b}"
    );
    app.cleanup().await;
}
