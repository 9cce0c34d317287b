//! The live sale page, `GET /dashboard`: its assets and headers, its data against the
//! API's own answers and the OpenAPI document, and where it is served (with the metrics).

use std::collections::BTreeSet;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::{order_id, wait_until, Routes, TestApp, REDIS_URL, SOLD_OUT};

/// A product name that is markup: the page must show it as text.
const MARKUP_NAME: &str = "<b>bold</b> & <img src=x>";

/// Longest wait for the page's data to catch up with the stores: the monitor reuses a
/// read for a second, the sampler samples once a second; the rest is room for a busy
/// machine.
const CATCH_UP_MAX: Duration = Duration::from_secs(15);

/// A GET of `url`: status, the headers asked for (missing: ""), body.
async fn fetch(
    http: &reqwest::Client,
    url: &str,
    headers: &[&str],
) -> (StatusCode, Vec<String>, String) {
    let resp = http.get(url).send().await.expect("GET");
    let status = resp.status();
    let values = headers
        .iter()
        .map(|h| {
            resp.headers()
                .get(*h)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    (status, values, resp.text().await.expect("body"))
}

/// The dashboard's data, which must answer 200 JSON.
async fn data(app: &TestApp) -> Value {
    let (status, body) = app.get("/dashboard/data").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}

/// Purchase answers by outcome summed over the data's samples.
fn outcomes_in(data: &Value, outcome: &str) -> u64 {
    data["samples"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["purchases"][outcome].as_u64())
        .sum()
}

/// The data's entry for `product_id`.
fn product_in(data: &Value, product_id: i64) -> Option<Value> {
    data["products"]
        .as_array()?
        .iter()
        .find(|p| p["product_id"] == product_id)
        .cloned()
}

/// Drives a small sale on `product_id` (3 units): three purchases of one unit (201), a
/// replay of the first (200), two refusals (409 sold_out), one order paid and one
/// cancelled (its unit back to available). Returns nothing: the API's answers are
/// asserted here.
pub async fn drive_small_sale(app: &TestApp, product_id: i64, tag: &str) {
    let mut orders = Vec::new();
    for i in 0..3 {
        let body = app
            .bought(&format!("{tag}-{i}"), 100 + i, product_id, 1)
            .await;
        orders.push((order_id(&body), 100 + i));
    }
    let (status, _) = app.purchase(&format!("{tag}-0"), 100, product_id, 1).await;
    assert_eq!(status, StatusCode::OK);
    for i in 3..5 {
        let request = (format!("{tag}-{i}"), 100 + i);
        app.refused((&request.0, request.1, product_id, 1), SOLD_OUT)
            .await;
    }
    app.pay_and_cancel(orders[0], orders[1]).await;
}

/// A service selling 3 units of `product_id`, named [`MARKUP_NAME`].
async fn selling_markup(product_id: i64) -> TestApp {
    let app = TestApp::spawn().await;
    let (status, body) = app
        .admin_post(
            "/v1/products",
            json!({"product_id": product_id, "name": MARKUP_NAME, "stock": 3}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    app
}

// Checks the page and its assets as a browser gets them: each with its content type, the
// strict Content-Security-Policy (default-src 'self', no inline script or style, no
// framing) and nosniff; the HTML loads only its own script and style sheet (no inline
// <script> or <style>, no style attribute, nothing from another host) and the script
// never writes HTML (no innerHTML, outerHTML, insertAdjacentHTML or document.write), so
// a product's name can only ever be text.
#[tokio::test]
async fn the_page_and_its_assets_have_their_types_and_a_strict_policy() {
    let app = TestApp::spawn().await;
    let headers = [
        "content-type",
        "content-security-policy",
        "x-content-type-options",
    ];
    let mut bodies = Vec::new();
    for (path, content_type) in [
        ("/dashboard", "text/html; charset=utf-8"),
        ("/dashboard/app.js", "text/javascript; charset=utf-8"),
        ("/dashboard/style.css", "text/css; charset=utf-8"),
    ] {
        let (status, got, body) = fetch(&app.http, &format!("{}{path}", app.base), &headers).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(got[0], content_type, "{path}");
        assert_eq!(got[1], flashsale_api::DASHBOARD_CSP, "{path}");
        assert_eq!(got[2], "nosniff", "{path}");
        bodies.push(body);
    }
    let policy = flashsale_api::DASHBOARD_CSP;
    for directive in [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(policy.contains(directive), "{policy} lacks {directive}");
    }
    assert!(!policy.contains("unsafe"), "{policy}");
    let (html, js) = (&bodies[0], &bodies[1]);
    assert!(
        html.contains(r#"<script src="dashboard/app.js" defer></script>"#),
        "{html}"
    );
    assert_eq!(html.matches("<script").count(), 1, "one script, its own");
    assert!(html.contains(r#"<link rel="stylesheet" href="dashboard/style.css">"#));
    for banned in ["<style", "style=", "http://", "https://", "//cdn"] {
        assert!(!html.contains(banned), "the page has {banned}");
    }
    for banned in [
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
    ] {
        assert!(!js.contains(banned), "the script uses {banned}");
    }
    app.cleanup().await;
}

// Checks GET /dashboard/data against the API and the OpenAPI document: after a small
// sale (3 units: three orders, a replay, two sold_out refusals, one paid, one cancelled)
// on a product named with markup, the data names the product as given, in gate mode,
// with the very inventory GET /v1/products/{id} answers (total 3, available 1, reserved 1,
// sold 1), both stores up and the outbox's backlog a number; its samples count exactly
// the purchase answers sent (3 created, 1 replayed, 2 sold_out) with a median time in a
// second that had answers; it is not cached (no-store); and its fields, and each
// product's and sample's, are exactly the properties of the document's schemas, the
// required ones all present.
#[tokio::test]
async fn the_data_matches_the_api_and_its_schema() {
    let app = selling_markup(4201).await;
    drive_small_sale(&app, 4201, "d").await;
    let (status, product) = app.get("/v1/products/4201").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        product["inventory"],
        json!({"total": 3, "available": 1, "reserved": 1, "sold": 1})
    );

    wait_until("the data caught up", CATCH_UP_MAX, || async {
        let d = data(&app).await;
        let inventory = product_in(&d, 4201).map(|p| {
            json!({"total": p["total"], "available": p["available"], "reserved": p["reserved"], "sold": p["sold"]})
        });
        inventory.as_ref() == Some(&product["inventory"])
            && outcomes_in(&d, "created") == 3
            && outcomes_in(&d, "sold_out") == 2
    })
    .await;
    let d = data(&app).await;
    let p = product_in(&d, 4201).expect("the product");
    assert_eq!(p["name"], MARKUP_NAME);
    assert_eq!(p["stock_mode"], "gate");
    assert_eq!(outcomes_in(&d, "replayed"), 1);
    assert_eq!(d["stores"]["redis_up"], true);
    assert_eq!(d["stores"]["mariadb_up"], true);
    assert!(d["outbox_unsent"].is_u64(), "{d}");
    assert_eq!(d["history_max"], 300);
    assert_eq!(d["sample_interval_seconds"], 1.0);
    let samples = d["samples"].as_array().expect("samples");
    assert!(
        samples.iter().any(
            |s| !s["purchases"].as_object().is_some_and(|m| m.is_empty())
                && s["p50_seconds"].as_f64().is_some_and(|t| t > 0.0)
                && s["p99_seconds"].as_f64().is_some_and(|t| t > 0.0)
        ),
        "{d}"
    );
    let (_, cache, _) = fetch(
        &app.http,
        &format!("{}/dashboard/data", app.base),
        &["cache-control"],
    )
    .await;
    assert_eq!(cache[0], "no-store");

    let (status, doc) = app.get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    let schemas = &doc["components"]["schemas"];
    let keys = |v: &Value| -> BTreeSet<String> {
        v.as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    };
    for (schema, value) in [
        ("Dashboard", d.clone()),
        ("DashboardProduct", p.clone()),
        ("DashboardStores", d["stores"].clone()),
        ("DashboardDrift", d["reconcile_drift"].clone()),
        ("DashboardIncidents", d["incidents"].clone()),
        ("DashboardAudits", d["audit"].clone()),
        ("DashboardSample", samples[0].clone()),
    ] {
        let properties = keys(&schemas[schema]["properties"]);
        assert!(!properties.is_empty(), "no schema {schema}");
        assert_eq!(keys(&value), properties, "{schema}: {value}");
        for required in schemas[schema]["required"].as_array().into_iter().flatten() {
            let name = required.as_str().expect("a name");
            assert!(
                value.get(name).is_some(),
                "{schema}.{name} missing: {value}"
            );
        }
    }
    app.cleanup().await;
}

// Checks that the page moves with the metrics: with FLASHSALE_METRICS_LISTEN set, the
// public listener answers 404 not_found for the page, its assets and its data (as for
// /metrics), and the operator's listener serves them all (200, the data as JSON). The
// operator's listener answers another method on them 405 and an unknown path 404, each
// with the API's JSON error body.
#[tokio::test]
async fn the_page_is_served_where_the_metrics_are() {
    let app = TestApp::spawn_with(Routes::default(), &[("METRICS_LISTEN", "127.0.0.1:1")]).await;
    let internal = app.metrics_base.clone().expect("the operator's listener");
    for path in [
        "/metrics",
        "/dashboard",
        "/dashboard/app.js",
        "/dashboard/style.css",
        "/dashboard/data",
    ] {
        let (status, body) = app.get(path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "public {path}: {body}");
        assert_eq!(body["error"], "not_found", "public {path}: {body}");
        let (status, _, _) = fetch(&app.http, &format!("{internal}{path}"), &[]).await;
        assert_eq!(status, StatusCode::OK, "internal {path}");
    }
    let (_, _, body) = fetch(&app.http, &format!("{internal}/dashboard/data"), &[]).await;
    let d: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(d["stores"]["mariadb_up"], true, "{d}");
    for (method, path, status, code) in [
        (reqwest::Method::POST, "/metrics", 405, "method_not_allowed"),
        (
            reqwest::Method::DELETE,
            "/dashboard",
            405,
            "method_not_allowed",
        ),
        (reqwest::Method::GET, "/nowhere", 404, "not_found"),
    ] {
        let answer = app
            .http
            .request(method.clone(), format!("{internal}{path}"))
            .send()
            .await
            .expect("the operator's listener answers");
        assert_eq!(answer.status().as_u16(), status, "{method} {path}");
        let body: Value = answer.json().await.expect("a JSON error body");
        assert_eq!(body["error"], code, "{method} {path}: {body}");
    }
    app.cleanup().await;
}

/// Runs `flashsale audit` (over `product`, else every loaded product) against the test's
/// stores; it must exit 0.
fn run_audit(app: &TestApp, product: Option<i64>) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_flashsale"));
    cmd.arg("audit")
        .env("FLASHSALE_DATABASE_URL", app.db.as_ref().expect("db").url())
        .env("FLASHSALE_REDIS_URL", REDIS_URL)
        .env("FLASHSALE_REDIS_PREFIX", &app.prefix)
        .env("RUST_LOG", "warn");
    if let Some(id) = product {
        cmd.args(["--product", &id.to_string()]);
    }
    let out = cmd.output().expect("run flashsale audit");
    assert!(
        out.status.success(),
        "audit: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

// Checks the figures the page reads from the ledger: before any audit the data says none
// was recorded (last null) and no incident is open; after `flashsale audit` over every
// product it shows that run (clean, both products, no product_id, no violation), after
// `--product` that one; an incident row left open shows as one open incident; and
// recording more verdicts than AUDIT_RUNS_KEPT keeps exactly that many rows, the newest.
#[tokio::test]
async fn the_last_audit_and_open_incidents_come_from_the_ledger() {
    let app = TestApp::selling(4401, 2, None).await;
    app.create_product(4402, 2, None).await;
    app.bought("a-1", 7, 4401, 1).await;
    let d = data(&app).await;
    assert_eq!(
        d["audit"],
        json!({"last": null, "violations_24h": 0}),
        "{d}"
    );
    assert_eq!(d["incidents"]["open"], 0, "{d}");

    run_audit(&app, None);
    wait_until("the audit shown", CATCH_UP_MAX, || async {
        let d = data(&app).await;
        let last = &d["audit"]["last"];
        last["clean"] == true
            && last["products"] == 2
            && last["product_id"].is_null()
            && last["violations"] == 0
    })
    .await;
    run_audit(&app, Some(4402));
    wait_until("the product's audit shown", CATCH_UP_MAX, || async {
        let d = data(&app).await;
        d["audit"]["last"]["product_id"] == 4402 && d["audit"]["last"]["products"] == 1
    })
    .await;

    sqlx::query(
        "INSERT INTO recovery_incident (request_id, product_id, kind, detail) \
         VALUES ('a-lost', 4401, 'test', 'left open by the test')",
    )
    .execute(&app.pool)
    .await
    .expect("an incident");
    wait_until("the open incident shown", CATCH_UP_MAX, || async {
        data(&app).await["incidents"]["open"] == 1
    })
    .await;

    let ledger = app.connect_ledger().await;
    let kept = flashsale_app::ports::AUDIT_RUNS_KEPT;
    for n in 0..kept + 5 {
        let verdict = flashsale_app::ports::AuditVerdict {
            product: None,
            products: n,
            violations: 0,
            pending: 0,
        };
        flashsale_app::ports::LedgerMaintenance::record_audit(&ledger, &verdict)
            .await
            .expect("record");
    }
    let rows = app.count("SELECT COUNT(*) FROM audit_run").await;
    assert_eq!(rows, kept as i64);
    let last = flashsale_app::ports::LedgerMaintenance::last_audit(&ledger)
        .await
        .expect("read")
        .expect("a verdict");
    assert_eq!(last.verdict.products, kept + 4);
    app.cleanup().await;
}

// ---- the page in a browser: headless Chromium driven through chromedriver ------------

/// Longest wait for chromedriver to answer after it started.
const DRIVER_START_MAX: Duration = Duration::from_secs(20);
/// Longest wait for the page to show what the API answers: a poll a second, a read of the
/// stores reused for a second, room for a busy machine.
const PAGE_CATCH_UP_MAX: Duration = Duration::from_secs(20);
/// The desktop's and the phone's viewport, in CSS pixels (the phone: an iPhone 12-15's).
const DESKTOP: (u32, u32) = (1280, 1100);
const PHONE: (u32, u32) = (390, 844);

/// A chromedriver of the test's own on a free loopback port, killed (and reaped) when
/// dropped, whatever the test's outcome.
struct Chromedriver {
    child: std::process::Child,
    url: String,
}

impl Chromedriver {
    async fn start() -> Self {
        let port = flashsale_testkit::free_port();
        let child = std::process::Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "chromedriver: {e}; install the browser with \
                     `scripts/services.sh --with-browser`"
                )
            });
        let driver = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let http = reqwest::Client::new();
        wait_until("chromedriver answers", DRIVER_START_MAX, || async {
            http.get(format!("{}/status", driver.url))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await;
        driver
    }

    /// A headless Chromium session (as root, as CI runs, it needs --no-sandbox).
    async fn session(&self) -> fantoccini::Client {
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".to_owned(),
            json!({"args": [
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--hide-scrollbars",
                "--force-device-scale-factor=1",
                format!("--window-size={},{}", DESKTOP.0, DESKTOP.1),
            ]}),
        );
        fantoccini::ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&self.url)
            .await
            .expect("a Chromium session")
    }
}

impl Drop for Chromedriver {
    fn drop(&mut self) {
        // Ending chromedriver ends the browsers it started.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where the screenshots are kept: `target/test-artifacts/dashboard/` (or under
/// `CARGO_TARGET_DIR`).
fn artifacts() -> std::path::PathBuf {
    crate::helpers::artifacts("dashboard").unwrap_or_else(|e| panic!("test artifacts: {e}"))
}

/// Tallest screenshot taken: a page of a hundred products is long, and a picture of its
/// first screens shows what there is to see.
const SCREENSHOT_HEIGHT_MAX: u32 = 3000;

/// A screenshot of the whole page at `width`: the window made as tall as the page first
/// (WebDriver's screenshot is of the viewport), up to `SCREENSHOT_HEIGHT_MAX`.
async fn screenshot(browser: &fantoccini::Client, width: u32, name: &str) {
    let height = browser
        .execute(
            // The window's height is the page's plus the browser's own frame.
            "return document.documentElement.scrollHeight + window.outerHeight - window.innerHeight;",
            vec![],
        )
        .await
        .expect("the page's height")
        .as_u64()
        .and_then(|h| u32::try_from(h).ok())
        .unwrap_or(SCREENSHOT_HEIGHT_MAX)
        .min(SCREENSHOT_HEIGHT_MAX);
    browser
        .set_window_size(width, height)
        .await
        .expect("a window the page's height");
    // Charts are redrawn on resize, after a short pause.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let png = browser.screenshot().await.expect("a screenshot");
    let path = artifacts().join(name);
    std::fs::write(&path, png).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    println!("screenshot: {}", path.display());
}

/// What the page shows, read from its DOM: a product's name, mode and figures (digits
/// only, as the API writes them), the rate legend's totals by series, the created line's
/// path and point count, the latest p50, whether the product list holds any element made
/// from a name, the status line, the order of the product's figures and of its bar's
/// segments, the cards' headings and values that take more than one line, and the
/// page's widths.
const READ_PAGE: &str = r##"
const [id] = arguments;
const p = document.querySelector(`[data-product-id="${id}"]`);
const field = (root, k) => {
  const e = root && root.querySelector(`[data-field="${k}"]`);
  return e ? e.textContent : null;
};
const digits = (t) => (t === null ? null : t.replace(/,/g, ""));
const totals = {};
for (const li of document.querySelectorAll("#legend-rate li")) {
  totals[li.dataset.series] = digits(field(li, "total"));
}
const created = document.querySelector('#chart-rate path[data-series="created"]');
const p50 = document.querySelector('#legend-latency li[data-series="p50_seconds"]');
return {
  name: field(p, "name"),
  mode: field(p, "mode"),
  total: digits(field(p, "total")),
  available: digits(field(p, "available")),
  reserved: digits(field(p, "reserved")),
  sold: digits(field(p, "sold")),
  totals,
  created_d: created ? created.getAttribute("d") : null,
  created_points: created ? Number(created.dataset.points) : 0,
  p50: field(p50, "latest"),
  markup: document.querySelectorAll("#products b, #products img").length,
  status: document.getElementById("status").className,
  audit: document.getElementById("audit").textContent,
  incidents: document.getElementById("incidents").textContent,
  status_text: document.getElementById("status").textContent,
  figure_order: p ? [...p.querySelectorAll(".figures .fig")].map((d) => d.classList[1]) : [],
  bar_order: p ? [...p.querySelectorAll(".bar .seg")].map((e) => e.classList[1].slice(4)) : [],
  wrapped: [...document.querySelectorAll(".card h2, .card .value")].filter((e) => {
    const r = document.createRange();
    r.selectNodeContents(e);
    return new Set([...r.getClientRects()].map((x) => Math.round(x.top))).size > 1;
  }).map((e) => e.textContent),
  scroll_width: Math.max(document.documentElement.scrollWidth, document.body.scrollWidth),
  inner_width: window.innerWidth,
};
"##;

async fn read_page(browser: &fantoccini::Client, product_id: i64) -> Value {
    browser
        .execute(READ_PAGE, vec![json!(product_id)])
        .await
        .expect("read the page")
}

/// The API's inventory of a product as the page writes it: each figure in decimal.
async fn api_inventory(app: &TestApp, product_id: i64) -> Value {
    let (status, product) = app.get(&format!("/v1/products/{product_id}")).await;
    assert_eq!(status, StatusCode::OK, "{product}");
    let inv = &product["inventory"];
    let s = |k: &str| json!(inv[k].as_i64().map(|n| n.to_string()));
    json!({"total": s("total"), "available": s("available"), "reserved": s("reserved"), "sold": s("sold")})
}

fn shown_inventory(page: &Value) -> Value {
    json!({"total": page["total"], "available": page["available"], "reserved": page["reserved"], "sold": page["sold"]})
}

// Checks the page in headless Chromium while a sale runs: after a small sale on a product
// named with markup (3 created, 1 replayed, 2 sold_out, one order paid, one cancelled),
// the page shows that product's name as text (no element made from it), in gate mode,
// no audit ever run and no open incident, the server's clock in UTC (24 hours), the
// figures in the order of the bar's segments, and no card heading or value on two lines,
// with the figures GET /v1/products/{id} answers, and the rate legend's totals are the
// answers sent; then, while purchases flow on a second product, the created line's path
// changes and gains points, the legend's created total grows by exactly the purchases
// made, the API's figures for that product show up on the page, and a p50 is shown. At
// a phone's width (390 px) the page has no horizontal overflow. Screenshots of the
// desktop and the phone views are kept under target/test-artifacts/dashboard/.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_a_live_sale_in_a_browser() {
    let app = selling_markup(4301).await;
    app.create_product(4302, 1000, None).await;
    drive_small_sale(&app, 4301, "b").await;
    let driver = Chromedriver::start().await;
    let browser = driver.session().await;
    browser
        .set_window_size(DESKTOP.0, DESKTOP.1)
        .await
        .expect("desktop size");
    browser
        .goto(&format!("{}/dashboard", app.base))
        .await
        .expect("open the page");

    let want = api_inventory(&app, 4301).await;
    let sale_totals = json!({"created": "3", "replayed": "1", "sold_out": "2"});
    let started = std::time::Instant::now();
    let page = loop {
        let page = read_page(&browser, 4301).await;
        let totals = &page["totals"];
        if shown_inventory(&page) == want
            && ["created", "replayed", "sold_out"]
                .iter()
                .all(|k| totals[k] == sale_totals[k])
        {
            break page;
        }
        assert!(
            started.elapsed() < PAGE_CATCH_UP_MAX,
            "the page never showed the API's figures {want} and the sale's answers \
             {sale_totals}: {page}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(page["name"], MARKUP_NAME, "{page}");
    assert_eq!(page["markup"], 0, "a name became markup: {page}");
    assert_eq!(page["mode"], "gate", "{page}");
    assert_eq!(page["status"], "status live", "{page}");
    assert_eq!(page["audit"], "never", "no audit was run: {page}");
    assert_eq!(page["incidents"], "0", "{page}");
    // The clock is the server's, in UTC and 24 hours, as the demo names its sales.
    let status = page["status_text"].as_str().unwrap_or_default();
    let clock = status.split(" · ").nth(1).unwrap_or_default();
    let digits = clock.trim_end_matches(" UTC").replace(':', "");
    assert!(
        clock.ends_with(" UTC") && clock.len() == 12 && digits.bytes().all(|b| b.is_ascii_digit()),
        "not a UTC clock: {status:?}"
    );
    // The figures read left to right as the bar's segments run, and no card's heading
    // or value wraps at a desk's width.
    let figures: Vec<&str> = page["figure_order"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let segments: Vec<&str> = page["bar_order"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert_eq!(figures[1..], segments[..segments.len() - 1], "{page}");
    assert_eq!(
        page["wrapped"],
        json!([]),
        "wrapped at {} px: {page}",
        DESKTOP.0
    );
    let before_d = page["created_d"].as_str().unwrap_or("").to_owned();
    let before_points = page["created_points"].as_u64().unwrap_or(0);

    // Purchases flow on the second product for a few seconds, one unit each.
    let mut made = 0;
    for i in 0..30 {
        app.bought(&format!("flow-{i}"), 1000 + i, 4302, 1).await;
        made += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let want = api_inventory(&app, 4302).await;
    let want_created = (3 + made).to_string();
    let started = std::time::Instant::now();
    let page = loop {
        let page = read_page(&browser, 4302).await;
        if page["totals"]["created"] == want_created.as_str() && shown_inventory(&page) == want {
            break page;
        }
        assert!(
            started.elapsed() < PAGE_CATCH_UP_MAX,
            "the page never showed {want_created} created and {want}: {page}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_ne!(
        page["created_d"],
        before_d.as_str(),
        "the chart did not move"
    );
    assert!(
        page["created_points"].as_u64().unwrap_or(0) > before_points,
        "no points added: {before_points} then {page}"
    );
    assert!(
        page["p50"].as_str().is_some_and(|t| t.ends_with(" ms")),
        "{page}"
    );
    screenshot(&browser, DESKTOP.0, "desktop.png").await;

    browser
        .set_window_size(PHONE.0, PHONE.1)
        .await
        .expect("phone size");
    // The resize handler redraws the charts to the new width within a poll.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let page = read_page(&browser, 4301).await;
    let inner = page["inner_width"].as_u64().expect("a width");
    assert!(inner <= u64::from(PHONE.0), "not at phone width: {page}");
    assert!(
        page["scroll_width"].as_u64().is_some_and(|w| w <= inner),
        "overflows sideways at {inner} px: {page}"
    );
    screenshot(&browser, PHONE.0, "phone.png").await;
    browser.close().await.expect("close the browser");
    drop(driver);
    app.cleanup().await;
}

/// Clicks the product's `what` button (pause or resume) as a person would: found, then
/// clicked through WebDriver, again if the page redrew the card in between (it does
/// once a second).
async fn click_action(browser: &fantoccini::Client, product_id: i64, what: &str) {
    let css = format!(r#"[data-product-id="{product_id}"] button[data-action="{what}"]"#);
    let started = std::time::Instant::now();
    loop {
        if let Ok(button) = browser.find(fantoccini::Locator::Css(&css)).await {
            if button.click().await.is_ok() {
                return;
            }
        }
        assert!(
            started.elapsed() < PAGE_CATCH_UP_MAX,
            "no {what} button on the page"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the page shows the product paused (`paused`) or not.
async fn shown_paused(browser: &fantoccini::Client, product_id: i64, paused: bool) {
    let script = format!(
        r#"return document.querySelector('[data-product-id="{product_id}"] [data-field="paused"]') !== null;"#
    );
    let started = std::time::Instant::now();
    while browser.execute(&script, vec![]).await.expect("read") != json!(paused) {
        assert!(
            started.elapsed() < PAGE_CATCH_UP_MAX,
            "never shown paused={paused}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// Checks the page's controls in headless Chromium: with the admin token entered in the
// page, the product offers Pause; clicked, the page shows the sale paused and a purchase
// answers 409 sale_paused; Resume clicked, the badge goes and a purchase is 201. The
// token stays in the page's memory (no cookie, nothing in local or session storage), and
// the operator's log holds the two actions under the page's own request_ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_pauses_and_resumes_a_sale() {
    const PRODUCT: i64 = 4402;
    let app = TestApp::spawn().await;
    app.create_product(PRODUCT, 100, None).await;
    let driver = Chromedriver::start().await;
    let browser = driver.session().await;
    browser
        .goto(&format!("{}/dashboard", app.base))
        .await
        .expect("open the page");
    let token = browser
        .find(fantoccini::Locator::Id("admin-token"))
        .await
        .expect("the token's field");
    token
        .send_keys(crate::helpers::ADMIN_TOKEN)
        .await
        .expect("type the token");
    browser
        .find(fantoccini::Locator::Css("#admin button"))
        .await
        .expect("the form's button")
        .click()
        .await
        .expect("use the token");
    click_action(&browser, PRODUCT, "pause").await;
    shown_paused(&browser, PRODUCT, true).await;
    let (s, b) = app.purchase("REQ_dash_1", 1, PRODUCT, 1).await;
    assert_eq!(
        (s, b["error"].as_str()),
        (StatusCode::CONFLICT, Some("sale_paused")),
        "{b}"
    );
    click_action(&browser, PRODUCT, "resume").await;
    shown_paused(&browser, PRODUCT, false).await;
    let (s, b) = app.purchase("REQ_dash_2", 1, PRODUCT, 1).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let kept = browser
        .execute(
            "return [document.cookie, localStorage.length, sessionStorage.length];",
            vec![],
        )
        .await
        .expect("storage");
    assert_eq!(kept, json!(["", 0, 0]), "the token is kept in memory only");
    let logged = app
        .count(&format!(
            "SELECT COUNT(*) FROM admin_action WHERE product_id = {PRODUCT} \
             AND request_id LIKE 'DASH\\_%'"
        ))
        .await;
    assert_eq!(logged, 2, "a pause and a resume from the page");
    browser.close().await.expect("close the browser");
    app.cleanup().await;
}
