//! The live sale page: `GET /dashboard` (HTML), its script and style sheet, all embedded
//! in the binary (the machines it runs on have no internet, and a page that loads
//! nothing from elsewhere can be held to `default-src 'self'`), and `GET /dashboard/data`,
//! the JSON the page polls once a second. The data reads no store itself: the stores'
//! figures come from the monitor's reads, which `GET /metrics` shares (one read at a
//! time, reused for a second), and the history from the sampler's memory.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use flashsale_app::dashboard::{Sample, HISTORY_MAX, SAMPLE_INTERVAL};
use flashsale_app::ports::AuditRun;
use flashsale_app::{Metrics, Monitor, ProductStock, Sampler, StoreView};
use serde::Serialize;
use utoipa::ToSchema;

use crate::openapi::stock_mode_schema;

/// The page.
pub(crate) const PAGE: Asset = Asset {
    content_type: "text/html; charset=utf-8",
    body: include_str!("dashboard/index.html"),
};
/// Its script.
pub(crate) const SCRIPT: Asset = Asset {
    content_type: "text/javascript; charset=utf-8",
    body: include_str!("dashboard/app.js"),
};
/// Its style sheet.
pub(crate) const STYLE: Asset = Asset {
    content_type: "text/css; charset=utf-8",
    body: include_str!("dashboard/style.css"),
};

/// The page may load only what this server serves (its script, style sheet and data),
/// runs no inline script or style, may not be framed (click-jacking an operator's page),
/// and submits no form anywhere.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
img-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; \
form-action 'none'; frame-ancestors 'none'";

/// What the page reads: the stores through the monitor, the history from the sampler,
/// and this instance's own counters.
#[derive(Debug, Clone)]
pub struct Dashboard {
    pub monitor: Arc<Monitor>,
    pub sampler: Arc<Sampler>,
    pub metrics: Arc<Metrics>,
}

/// One of the page's files, embedded in the binary, with its content type.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Asset {
    content_type: &'static str,
    body: &'static str,
}

impl Asset {
    /// The asset with its type, the page's security headers, and `no-cache`: the browser
    /// asks again (cheaply) so a new binary's page is never mixed with an old script.
    pub(crate) fn response(self) -> Response {
        (
            [
                (
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(self.content_type),
                ),
                (
                    header::CONTENT_SECURITY_POLICY,
                    HeaderValue::from_static(CSP),
                ),
                (
                    header::X_CONTENT_TYPE_OPTIONS,
                    HeaderValue::from_static("nosniff"),
                ),
                (
                    header::REFERRER_POLICY,
                    HeaderValue::from_static("no-referrer"),
                ),
                (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            ],
            self.body,
        )
            .into_response()
    }
}

impl Dashboard {
    /// The page's figures now: the stores as last read (a read at most
    /// `SCRAPE_REUSE` old, or one made for this call), the history, this instance's
    /// counters.
    pub(crate) async fn data(&self) -> Response {
        let view = self.monitor.view().await;
        let (drift_products, drift_units) = self.metrics.drift();
        let body = DashboardJson {
            generated_at: Utc::now(),
            sample_interval_seconds: SAMPLE_INTERVAL.as_secs_f64(),
            history_max: HISTORY_MAX,
            stores: StoresJson::from(view.as_ref()),
            outbox_unsent: view.outbox_unsent,
            outbox_parked: view.outbox_parked,
            incidents: IncidentsJson {
                open: view.open_incidents,
                recorded_here: self.metrics.incidents_recorded(),
            },
            audit: view.last_audit.as_ref().map(|last| AuditsJson {
                last: last.as_ref().map(AuditRunJson::from),
                violations_24h: view.audit_violations,
            }),
            reconcile_drift: DriftJson {
                products: drift_products,
                units: drift_units,
            },
            products: view
                .products
                .iter()
                .filter_map(ProductStockJson::of)
                .collect(),
            samples: self
                .sampler
                .history()
                .iter()
                .map(SampleJson::from)
                .collect(),
        };
        (
            [
                (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
                (
                    header::X_CONTENT_TYPE_OPTIONS,
                    HeaderValue::from_static("nosniff"),
                ),
            ],
            Json(body),
        )
            .into_response()
    }
}

/// The live sale page's figures.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Dashboard)]
pub struct DashboardJson {
    /// When this answer was made.
    pub generated_at: DateTime<Utc>,
    /// Seconds between two samples.
    pub sample_interval_seconds: f64,
    /// Most samples kept (the history's span is this times the interval).
    #[schema(minimum = 1)]
    pub history_max: usize,
    pub stores: StoresJson,
    /// Events waiting in the outbox to be published; null: MariaDB did not answer.
    #[schema(required = true, minimum = 0)]
    pub outbox_unsent: Option<u64>,
    /// Events of outbox rows the relay parked (the broker refused them for good: an
    /// operator's to retry, `flashsale events parked`); null: MariaDB did not answer.
    #[schema(required = true, minimum = 0)]
    pub outbox_parked: Option<u64>,
    pub incidents: IncidentsJson,
    /// The audits recorded by `flashsale audit`; null: MariaDB did not answer.
    #[schema(required = true)]
    pub audit: Option<AuditsJson>,
    /// What this instance's last reconciliation pass found.
    pub reconcile_drift: DriftJson,
    /// The newest products (at most 100), highest id first; one whose row could not be
    /// read in time is left out of this answer.
    pub products: Vec<ProductStockJson>,
    /// This instance's purchase answers, one sample per interval, oldest first.
    pub samples: Vec<SampleJson>,
}

/// Whether the stores answered at the last read.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = DashboardStores)]
pub struct StoresJson {
    /// When the stores were last read (at most a second before `generated_at`, or the
    /// read's own time); null: not yet.
    #[schema(required = true)]
    pub read_at: Option<DateTime<Utc>>,
    pub redis_up: bool,
    pub mariadb_up: bool,
}

impl From<&StoreView> for StoresJson {
    fn from(v: &StoreView) -> Self {
        Self {
            read_at: v.read_at,
            redis_up: v.redis_up,
            mariadb_up: v.mariadb_up,
        }
    }
}

/// Recovery incidents: outcomes recovery could not learn, each waiting for an operator.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = DashboardIncidents)]
pub struct IncidentsJson {
    /// Open in the ledger (`recovery_incident`), over every instance; null: MariaDB did
    /// not answer.
    #[schema(required = true, format = Int64, minimum = 0)]
    pub open: Option<i64>,
    /// Recorded by this instance's recovery since it started.
    #[schema(minimum = 0)]
    pub recorded_here: u64,
}

/// The audits recorded.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = DashboardAudits)]
pub struct AuditsJson {
    /// The last one; null: no audit was ever recorded.
    #[schema(required = true)]
    pub last: Option<AuditRunJson>,
    /// Violations the audits recorded in the last 24 hours found (serve's scheduled
    /// audits and `flashsale audit`'s), summed; null: not read this time.
    #[schema(required = true)]
    pub violations_24h: Option<i64>,
}

/// One run of `flashsale audit`: what it checked and found.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = DashboardAuditRun)]
pub struct AuditRunJson {
    /// When its verdict was recorded (the database's clock).
    pub recorded_at: DateTime<Utc>,
    /// The one product audited; null: every product whose stock was loaded.
    #[schema(required = true, format = Int64, minimum = 1)]
    pub product_id: Option<i64>,
    /// Products audited.
    #[schema(minimum = 0)]
    pub products: u64,
    /// Invariant violations found.
    #[schema(minimum = 0)]
    pub violations: u64,
    /// Findings of work in flight within its bound (not violations).
    #[schema(minimum = 0)]
    pub pending: u64,
    /// No violation.
    pub clean: bool,
}

impl From<&AuditRun> for AuditRunJson {
    fn from(run: &AuditRun) -> Self {
        let v = &run.verdict;
        let n = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        Self {
            recorded_at: run.recorded_at,
            product_id: v.product.map(|p| p.get()),
            products: n(v.products),
            violations: n(v.violations),
            pending: n(v.pending),
            clean: v.clean(),
        }
    }
}

/// Reconciliation drift: products whose Redis count differed from MariaDB's facts.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = DashboardDrift)]
pub struct DriftJson {
    #[schema(format = Int64, minimum = 0)]
    pub products: i64,
    /// Units of drift, summed over the products (absolute values).
    #[schema(format = Int64, minimum = 0)]
    pub units: i64,
}

/// A product's stock as last read; a figure that could not be read is null.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = DashboardProduct)]
pub struct ProductStockJson {
    #[schema(format = Int64, minimum = 1)]
    pub product_id: i64,
    pub name: String,
    /// Who serves the stock: `gate` (Redis) or `ledger` (MariaDB alone).
    #[schema(schema_with = stock_mode_schema)]
    pub stock_mode: &'static str,
    /// Whether the operator paused the sale.
    pub paused: bool,
    #[schema(required = true, format = Int64)]
    pub total: Option<i64>,
    /// As `GET /v1/products/{id}` counts it: Redis's count through the gate, the
    /// ledger's in ledger mode.
    #[schema(required = true, format = Int64)]
    pub available: Option<i64>,
    #[schema(required = true, format = Int64)]
    pub reserved: Option<i64>,
    #[schema(required = true, format = Int64)]
    pub sold: Option<i64>,
}

impl ProductStockJson {
    /// The product as read, if its own row was (its name and mode; a product whose row
    /// did not answer in time is left out of this answer rather than shown nameless).
    fn of(p: &ProductStock) -> Option<Self> {
        let c = p.counters.as_ref();
        Some(Self {
            product_id: p.product_id.get(),
            name: p.name.clone()?,
            stock_mode: p.mode?.as_str(),
            paused: p.paused?,
            total: c.map(|c| c.total),
            available: p.available,
            reserved: c.map(|c| c.reserved),
            sold: c.map(|c| c.sold),
        })
    }
}

/// What the purchase endpoint answered on this instance during one interval.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = DashboardSample)]
pub struct SampleJson {
    /// When the interval ended.
    pub at: DateTime<Utc>,
    /// How long it was, in seconds.
    pub seconds: f64,
    /// Answers by outcome (`created`, `sold_out`, … as the metrics' `outcome` label),
    /// only those with any.
    #[schema(value_type = BTreeMap<String, u64>)]
    pub purchases: BTreeMap<&'static str, u64>,
    /// The answer time's median over the interval's purchases, in seconds, estimated
    /// from the latency buckets; null: no purchase answered.
    #[schema(required = true)]
    pub p50_seconds: Option<f64>,
    /// The 99th percentile, likewise.
    #[schema(required = true)]
    pub p99_seconds: Option<f64>,
}

impl From<&Sample> for SampleJson {
    fn from(s: &Sample) -> Self {
        Self {
            at: s.at,
            seconds: s.seconds,
            purchases: s.purchases.iter().map(|(o, n)| (o.as_str(), *n)).collect(),
            p50_seconds: s.p50,
            p99_seconds: s.p99,
        }
    }
}
