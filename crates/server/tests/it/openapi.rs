//! Checks that the OpenAPI document a server serves at `GET /openapi.json` is the committed
//! `docs/openapi.json`, and that it covers the router: every route of
//! `flashsale_api::ROUTES` (the list the router is built from) is an operation of the
//! document, every operation is such a route, and the running router answers each route
//! itself rather than with its fallback (404 `not_found`, 405). How: a real service is
//! spawned; its document is fetched over HTTP and compared with the file as
//! `serde_json::Value`s (formatting aside), the differing JSON pointers named on failure;
//! each route is then requested once with harmless input (no body, no credentials, ids no
//! product or order has).
//!
//! To regenerate the committed file after changing the API, run
//! `FLASHSALE_WRITE_OPENAPI=1 cargo test -p flashsale --test it -- openapi`: the served
//! document is then written to `docs/openapi.json` before the comparison.

use std::collections::BTreeSet;
use std::path::PathBuf;

use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::helpers::TestApp;

/// The committed document.
fn committed_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json")
}

/// The JSON pointers where `a` and `b` differ, at most `max` of them.
fn differences(a: &Value, b: &Value, at: &str, max: usize, out: &mut Vec<String>) {
    if out.len() >= max || a == b {
        return;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let here = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                match (x.get(k), y.get(k)) {
                    (Some(u), Some(v)) => differences(u, v, &here, max, out),
                    _ => out.push(here),
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (u, v)) in x.iter().zip(y).enumerate() {
                differences(u, v, &format!("{at}/{i}"), max, out);
            }
        }
        _ => out.push(at.to_owned()),
    }
}

/// The (method, path) of every operation in the document's `paths`.
fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    const METHODS: [&str; 8] = [
        "get", "put", "post", "delete", "options", "head", "patch", "trace",
    ];
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().into_iter().flatten() {
        for method in METHODS {
            if item.get(method).is_some() {
                ops.insert((method.to_owned(), path.clone()));
            }
        }
    }
    ops
}

#[tokio::test]
async fn the_served_document_is_the_committed_one_and_covers_every_route() {
    let app = TestApp::spawn().await;
    let (text, content_type) = app.get_document("/openapi.json").await;
    assert_eq!(content_type, "application/json");
    let served: Value = serde_json::from_str(&text).expect("the served document is JSON");
    assert_eq!(served["openapi"], "3.1.0");

    let path = committed_path();
    if std::env::var("FLASHSALE_WRITE_OPENAPI").as_deref() == Ok("1") {
        std::fs::write(&path, &text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    let regenerate = "regenerate it with \
        `FLASHSALE_WRITE_OPENAPI=1 cargo test -p flashsale --test it -- openapi`";
    let committed: Value = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| panic!("{} is missing or not JSON; {regenerate}", path.display()));
    // The router's routes and the document's operations: the same set.
    let routes: BTreeSet<(String, String)> = flashsale_api::ROUTES
        .iter()
        .map(|&(m, p)| (m.to_owned(), p.to_owned()))
        .collect();
    assert_eq!(routes.len(), flashsale_api::ROUTES.len(), "a route twice");
    let documented = operations(&served);
    let missing: Vec<_> = routes.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&routes).collect();
    assert!(missing.is_empty(), "routes the document lacks: {missing:?}");
    assert!(extra.is_empty(), "operations no route serves: {extra:?}");

    let mut differ = Vec::new();
    differences(&committed, &served, "", 20, &mut differ);
    assert!(
        differ.is_empty(),
        "docs/openapi.json differs from the served document at {differ:?}; if the API's \
         change is meant, {regenerate}"
    );

    // Each route answers as itself: no body and no credentials are refused (400, 401) or
    // found absent (404 with the resource's own code), never the fallback's answers.
    for &(method, route) in flashsale_api::ROUTES {
        let path = route
            .replace("{id}", "987654321")
            .replace("{request_id}", "openapi-probe");
        let method = Method::from_bytes(method.to_uppercase().as_bytes()).expect("a method");
        let (status, body) = app
            .send(method.clone(), &path, None, false)
            .await
            .expect("request");
        assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        assert!(
            !(status == StatusCode::NOT_FOUND && body["error"] == "not_found"),
            "{method} {path}: the router's fallback answered: {body}"
        );
    }
    app.cleanup().await;
}
