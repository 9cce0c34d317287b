//! The Grafana dashboard (`docs/grafana.json`, explained in `docs/grafana.md`) against
//! the metrics a real service exports.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use flashsale_app::ports::ErrorKind;
use flashsale_app::Outcome;
use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::TestApp;

/// The one data source every panel, query and variable uses: the dashboard's input,
/// chosen when it is imported.
const DATASOURCE: &str = "${DS_PROMETHEUS}";
/// Panels Grafana draws without a plugin; the dashboard must need no other.
const CORE_PANELS: [&str; 3] = ["row", "stat", "timeseries"];
/// Labels Prometheus adds to every series it scrapes (not in the text a server answers).
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

// Checks that the dashboard asks only for what the server exports, so no panel stays
// empty for a typo or a renamed metric. How: a real service (real Redis and MariaDB)
// sells a product (an order, a refusal) and every other family is given a series
// through the instance's own `Metrics`, then `GET /metrics` is read; its `# TYPE` lines
// give the sample names Prometheus stores (a counter `x` as `x_total`, a gauge `x` as
// `x`, a histogram `x` as `x_bucket`, `x_sum`, `x_count`) and its samples the label
// names of each. Then docs/grafana.json is parsed: every panel has a title, every panel
// but a row and every variable has at least one query, every query (`expr`, and each
// variable's `label_values(…)`) is scanned for `flashsale_…` names, and each must be a
// sample name exported; each `{label…}` selector after one may name only that metric's
// labels (or `instance`/`job`). Besides: schema 39, at least 20 panels in at least 5
// titled rows, unique panel ids, core panel types only, and every data source the
// dashboard names is its `DS_PROMETHEUS` input.
#[tokio::test]
async fn dashboard_queries_name_exported_metrics() {
    let app = TestApp::selling(4201, 1, None).await;
    for (request_id, want) in [("g-1", StatusCode::CREATED), ("g-2", StatusCode::CONFLICT)] {
        let (status, body) = app.purchase(request_id, 9, 4201, 1).await;
        assert_eq!(status, want, "{request_id}: {body}");
    }
    // The families no request above reaches, given one series each so their labels show.
    let m = &app.metrics;
    m.worker_pass("expiry", true);
    m.orders_expired(1);
    m.recovered(&flashsale_app::maintenance::RecoveryReport {
        released: 1,
        incidents: 1,
        ..Default::default()
    });
    m.gates_rebuilt(1);
    m.mode_switched(flashsale_core::StockMode::Ledger);
    m.reconciled(&[]);
    m.events_published(1);
    m.relay_failed();
    m.events_applied(1);
    m.consumer_failed();
    m.store_failed("redis", ErrorKind::TimedOut);
    m.connection_refused("cap");
    m.connection_evicted("body");
    m.answered_in(0, Outcome::Unavailable, Duration::from_millis(1));

    let (text, _) = app.scrape_metrics().await;
    let exported = Exported::read(&text);
    assert!(
        exported.labels.len() >= 15,
        "too few sample names read from the scrape: {:?}\n{text}",
        exported.labels.keys()
    );

    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/grafana.json");
    let json = std::fs::read_to_string(&path).expect("docs/grafana.json");
    let dashboard: Value = serde_json::from_str(&json).expect("docs/grafana.json is JSON");
    let problems = check_dashboard(&dashboard, &exported);
    assert!(
        problems.is_empty(),
        "docs/grafana.json:\n  {}\nexported: {:?}",
        problems.join("\n  "),
        exported.labels.keys()
    );
    app.cleanup().await;
}

/// What a scrape exports: each sample name Prometheus stores, with the label names its
/// samples carry in the scrape.
struct Exported {
    labels: BTreeMap<String, BTreeSet<String>>,
}

impl Exported {
    fn read(text: &str) -> Self {
        let mut labels: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for line in text.lines() {
            let Some(declared) = line.strip_prefix("# TYPE ") else {
                continue;
            };
            let (family, kind) = declared.split_once(' ').expect("# TYPE name kind");
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                "summary" => &["", "_sum", "_count"],
                "info" => &["_info"],
                _ => &[""],
            };
            for suffix in suffixes {
                labels.entry(format!("{family}{suffix}")).or_default();
            }
        }
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name_end = line.find(['{', ' ']).unwrap_or(line.len());
            let Some(names) = labels.get_mut(&line[..name_end]) else {
                continue;
            };
            if let Some(set) = line[name_end..]
                .strip_prefix('{')
                .and_then(|r| r.split_once('}'))
            {
                for pair in split_matchers(set.0) {
                    let name = pair.split('=').next().unwrap_or("").trim();
                    names.insert(name.to_owned());
                }
            }
        }
        Self { labels }
    }
}

/// The comma-separated items of a label set, commas inside quoted values kept.
fn split_matchers(set: &str) -> Vec<&str> {
    let (mut items, mut start, mut quoted, mut escaped) = (Vec::new(), 0, false, false);
    for (i, c) in set.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ',' if !quoted => {
                items.push(&set[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&set[start..]);
    items.retain(|s| !s.trim().is_empty());
    items
}

/// Every `flashsale_…` metric name in the PromQL `expr`, with the label names of the
/// selector right after it (empty without one). String literals are skipped, so a label
/// value or a `$variable` inside one is never taken for a name.
fn metric_selectors(expr: &str) -> Vec<(String, Vec<String>)> {
    let b = expr.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'"' || c == b'\'' || c == b'`' {
            i += 1;
            while i < b.len() && b[i] != c {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c.is_ascii_alphabetic() || c == b'_' || c == b':' {
            let start = i;
            while i < b.len() && ident(b[i]) {
                i += 1;
            }
            let word = &expr[start..i];
            if !word.starts_with("flashsale_") {
                continue;
            }
            let rest = expr[i..].trim_start();
            let mut labels = Vec::new();
            if let Some(set) = rest.strip_prefix('{').and_then(|r| r.split_once('}')) {
                for m in split_matchers(set.0) {
                    let name = m.split(['=', '!']).next().unwrap_or("").trim();
                    labels.push(name.to_owned());
                }
            }
            out.push((word.to_owned(), labels));
        } else if c.is_ascii_digit() {
            // A number or a duration (`1m`, `0.99`): not a name.
            while i < b.len() && (ident(b[i]) || b[i] == b'.') {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Every object under `v` (itself included).
fn objects(v: &Value, out: &mut Vec<serde_json::Map<String, Value>>) {
    match v {
        Value::Object(o) => {
            out.push(o.clone());
            o.values().for_each(|v| objects(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| objects(v, out)),
        _ => {}
    }
}

/// What is wrong with `dashboard` against what the server `exported` (empty: nothing).
fn check_dashboard(dashboard: &Value, exported: &Exported) -> Vec<String> {
    let mut problems = Vec::new();
    let mut fail = |p: String| problems.push(p);
    if dashboard["schemaVersion"] != 39 {
        fail(format!(
            "schemaVersion {}, not 39",
            dashboard["schemaVersion"]
        ));
    }
    let input = dashboard["__inputs"].as_array().and_then(|inputs| {
        inputs
            .iter()
            .find(|i| i["name"] == "DS_PROMETHEUS" && i["type"] == "datasource")
    });
    if input.is_none_or(|i| i["pluginId"] != "prometheus") {
        fail("no DS_PROMETHEUS input of a prometheus data source".into());
    }
    // Every data source named anywhere is the input (or Grafana's built-in annotations).
    let mut all = Vec::new();
    objects(dashboard, &mut all);
    for o in &all {
        if let Some(ds) = o.get("datasource") {
            let uid = ds["uid"].as_str().unwrap_or("");
            if uid != DATASOURCE && uid != "-- Grafana --" {
                fail(format!("a data source other than the input: {ds}"));
            }
        }
    }

    // The queries: (where, PromQL).
    let mut queries: Vec<(String, String)> = Vec::new();
    let panels = dashboard["panels"].as_array().cloned().unwrap_or_default();
    let (mut rows, mut drawn) = (0, 0);
    let mut ids = HashSet::new();
    for panel in &panels {
        let title = panel["title"].as_str().unwrap_or("").trim();
        let kind = panel["type"].as_str().unwrap_or("");
        let at = format!("panel {} {title:?}", panel["id"]);
        if title.is_empty() {
            fail(format!("{at}: no title"));
        }
        if !ids.insert(panel["id"].to_string()) {
            fail(format!("{at}: its id is another panel's"));
        }
        if !CORE_PANELS.contains(&kind) {
            fail(format!("{at}: type {kind:?} is not a core panel"));
        }
        if kind == "row" {
            rows += 1;
            if panel["panels"].as_array().is_some_and(|p| !p.is_empty()) {
                fail(format!(
                    "{at}: a collapsed row hides its panels from this test"
                ));
            }
            continue;
        }
        drawn += 1;
        if panel["datasource"]["uid"] != DATASOURCE {
            fail(format!("{at}: its data source is not the input"));
        }
        let targets = panel["targets"].as_array().cloned().unwrap_or_default();
        if targets.is_empty() {
            fail(format!("{at}: no query"));
        }
        for target in targets {
            let expr = target["expr"].as_str().unwrap_or("").trim();
            if expr.is_empty() {
                fail(format!("{at}: query {} has no expr", target["refId"]));
            }
            queries.push((at.clone(), expr.to_owned()));
        }
    }
    if drawn < 20 || rows < 5 {
        fail(format!(
            "{drawn} panels in {rows} rows: expected 20 in 5 at least"
        ));
    }
    for var in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let at = format!("variable {}", var["name"]);
        let query = match &var["query"] {
            Value::String(q) => q.as_str(),
            q => q["query"].as_str().unwrap_or(""),
        };
        if query.trim().is_empty() {
            fail(format!("{at}: no query"));
        }
        queries.push((at, query.to_owned()));
    }

    let mut names = 0;
    for (at, expr) in &queries {
        for (metric, labels) in metric_selectors(expr) {
            names += 1;
            let Some(known) = exported.labels.get(&metric) else {
                fail(format!("{at}: {metric} is not exported, in {expr}"));
                continue;
            };
            for label in labels {
                if !known.contains(&label) && !TARGET_LABELS.contains(&label.as_str()) {
                    fail(format!(
                        "{at}: {metric} has no label {label:?} (it has {known:?}), in {expr}"
                    ));
                }
            }
        }
    }
    if names < 30 {
        fail(format!("only {names} metric names found in the queries"));
    }
    problems
}
