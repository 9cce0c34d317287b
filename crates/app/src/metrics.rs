//! What an operator watches during a sale, as Prometheus metrics (`GET /metrics`, the
//! OpenMetrics text format): the answers of every endpoint by outcome (the purchases'
//! refusal and failure rates among them) and how long they took, what the background workers did (payment
//! timeouts, recoveries, incidents, gate rebuilds, reconciliation drift), the events'
//! flow (published, applied, waiting in the outbox), whether Redis and MariaDB answer,
//! each product's stock, and the listener's connections (open, against the cap, and
//! those refused or evicted at it).
//!
//! Counters are plain atomics, counted where the work happens; the gauges that describe
//! the stores (`Monitor`) are read when the metrics are scraped, so a scrape shows the
//! stores as they are, not as a worker last saw them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use flashsale_core::{InventoryCounters, ProductId, StockMode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Metric, Registry};
use tracing::warn;

use crate::error::Error;
use crate::maintenance::{Reconciliation, RecoveryReport};
use crate::outcome::Outcome;
use crate::ports::{AuditRun, ErrorKind, Ledger, LedgerMaintenance, Outbox, StockGate};

/// Most products whose stock one scrape reports (the highest ids, the latest created
/// when ids grow): each costs a Redis and a MariaDB read per scrape, and a flash sale's
/// products worth watching are few; a bound keeps a shop with thousands of products from
/// making each scrape slow and each series set huge.
pub const PRODUCTS_MAX: usize = 100;
/// Longest one store read of a scrape may take before that store counts as down (a
/// scrape must answer even while a store hangs: that is when it matters most).
pub const STORE_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest all of a scrape's store reads may take together; the figures not read by then
/// are left out and the rest goes out (a slow database must not cost the counters).
pub const SCRAPE_BUDGET: Duration = Duration::from_secs(3);
/// A scrape this recent is answered again instead of reading the stores once more: one
/// scrape at a time reads them, however many scrapers (or anyone else) ask, so
/// `GET /metrics` cannot be used to load Redis and MariaDB.
pub const SCRAPE_REUSE: Duration = Duration::from_secs(1);
/// How far back the audits' violations are summed for `flashsale_audit_violations`: a
/// day holds the last scheduled audit of every product, and a problem found stays
/// visible to the alert until a day of audits has passed over it.
pub const AUDIT_VIOLATIONS_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// The HTTP endpoints, as the `endpoint` label names them (`GET /healthz` is not counted:
/// see the route).
pub const ENDPOINTS: [&str; 19] = [
    "purchase",
    "get_purchase",
    "get_order",
    "pay",
    "cancel",
    "refund",
    "create_product",
    "get_product",
    "restock",
    "pause",
    "resume",
    "patch_product",
    "destock",
    "list_actions",
    "list_products",
    "list_orders",
    "readyz",
    "metrics",
    "other",
];

/// Where `name` is in `list`, at compile time (a name missing from it fails the build).
pub const fn index_of(list: &[&str], name: &str) -> usize {
    let mut i = 0;
    while i < list.len() {
        let (a, b) = (list[i].as_bytes(), name.as_bytes());
        if a.len() == b.len() {
            let mut j = 0;
            while j < a.len() && a[j] == b[j] {
                j += 1;
            }
            if j == a.len() {
                return i;
            }
        }
        i += 1;
    }
    panic!("not in the list")
}

/// Upper bounds of the answer-time buckets, in seconds: a refusal takes tens of
/// microseconds, a durable order a millisecond or a few, a request past its deadline
/// (2 s by default) ends by then; fourteen buckets keep each series set small.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// The purchase endpoint's index in `ENDPOINTS`, whose answers the dashboard also tallies.
const PURCHASE: usize = index_of(&ENDPOINTS, "purchase");

/// What the purchase endpoint answered since the process started, as the dashboard's
/// sampler reads it (`crate::dashboard`): answers by outcome (indexed as `Outcome::ALL`)
/// and answer times by bucket of `LATENCY_BUCKETS`, each bucket's own count (not
/// cumulative), the last one past the largest bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurchaseTally {
    pub by_outcome: [u64; Outcome::ALL.len()],
    pub buckets: [u64; LATENCY_BUCKETS.len() + 1],
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    endpoint: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkerLabels {
    worker: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    action: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreLabels {
    store: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabels {
    node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreErrorLabels {
    store: &'static str,
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StockLabels {
    product_id: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SettledLabels {
    outcome: &'static str,
}

/// Counts an operator's stock action that settled with `outcome`, and its `units`.
fn settled(
    by_outcome: &Family<SettledLabels, Counter>,
    units: &Counter,
    outcome: &'static str,
    n: u64,
) {
    by_outcome.get_or_create(&SettledLabels { outcome }).inc();
    units.inc_by(n);
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModeLabels {
    to: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProductLabels {
    product_id: String,
}

/// The cell of (endpoint, outcome) in `Metrics::cells` and `latency_cells`, and its
/// labels (an endpoint index past the list's end counts as its last entry, `other`).
fn cell_of(endpoint: usize, outcome: Outcome) -> (usize, HttpLabels) {
    let endpoint = endpoint.min(ENDPOINTS.len() - 1);
    let labels = HttpLabels {
        endpoint: ENDPOINTS[endpoint],
        outcome: outcome.as_str(),
    };
    (endpoint * Outcome::ALL.len() + outcome.index(), labels)
}

/// `metric`, registered in `registry` under `name` with `help`: the handle kept to count
/// with.
fn registered<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// Every metric of one server process, registered in its own registry.
pub struct Metrics {
    registry: Registry,
    responses: Family<HttpLabels, Counter>,
    /// `responses`' counters by (endpoint, outcome) index, taken out of the family on
    /// first use: counting an answer is then one atomic add, no hashing, no lock.
    cells: Box<[OnceLock<Counter>]>,
    latency: Family<HttpLabels, Histogram, fn() -> Histogram>,
    /// `latency`'s histograms by (endpoint, outcome) index, as `cells`.
    latency_cells: Box<[OnceLock<Histogram>]>,
    /// The purchase answers' times by bucket (`PurchaseTally::buckets`), all outcomes
    /// together: prometheus-client does not let its histograms' buckets be read back.
    purchase_buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    workers: Workers,
    events: EventMetrics,
    stores: Stores,
    listener: Listener,
}

/// The background workers' passes and what they did: expiry, recovery, rebuilds, mode
/// switches, reconciliation's drift and repairs.
struct Workers {
    worker_passes: Family<WorkerLabels, Counter>,
    orders_expired: Counter,
    recovery: Family<ActionLabels, Counter>,
    incidents: Counter,
    gate_rebuilds: Counter,
    actions: StockActions,
    mode_switches: Family<ModeLabels, Counter>,
    drift_products: Gauge,
    drift_units: Gauge,
    repairs: Counter,
    units_repaired: Counter,
}

/// What the operator's stock actions and the sale's end did: destocks, refunds, retired
/// sales.
struct StockActions {
    sales_retired: Counter,
    destocks: Family<SettledLabels, Counter>,
    units_destocked: Counter,
    refunds: Family<SettledLabels, Counter>,
    units_refunded: Counter,
}

impl StockActions {
    fn register(registry: &mut Registry) -> Self {
        Self {
            sales_retired: registered(
                registry,
                "sales_retired",
                "Ended sales whose Redis state was retired (FLASHSALE_SALE_RETIRE_AFTER after the end, nothing in flight); the ledger keeps their counters",
                Counter::default(),
            ),
            destocks: registered(
                registry,
                "destocks",
                "Destocks the ledger settled, by outcome: taken (units off sale) or refused (fewer available; nothing changed)",
                Family::default(),
            ),
            units_destocked: registered(
                registry,
                "destocked_units",
                "Units taken off sale by destocks",
                Counter::default(),
            ),
            refunds: registered(
                registry,
                "refunds",
                "Paid orders refunded, by outcome: restocked (units back on sale) or withdrawn (units out of stock)",
                Family::default(),
            ),
            units_refunded: registered(
                registry,
                "refunded_units",
                "Units of refunded orders, no longer sold",
                Counter::default(),
            ),
        }
    }
}

impl Workers {
    fn register(registry: &mut Registry) -> Self {
        Self {
            worker_passes: registered(
                registry,
                "worker_passes",
                "Passes of each background worker, by result (ok, or error: a store did not answer, or a product's step failed and was passed over)",
                Family::default(),
            ),
            orders_expired: registered(
                registry,
                "orders_expired",
                "Unpaid orders cancelled at their payment deadline, their stock given back",
                Counter::default(),
            ),
            recovery: registered(
                registry,
                "recovery_actions",
                "What recovery did: aligned (the order existed), released (no order: fenced and given back), orphans_released, returns_completed, restocks_completed, deferred (a store did not answer; tried again)",
                Family::default(),
            ),
            incidents: registered(
                registry,
                "recovery_incidents",
                "Outcomes recovery could not learn after its tries, recorded in recovery_incident for an operator",
                Counter::default(),
            ),
            gate_rebuilds: registered(
                registry,
                "gate_rebuilds",
                "Products whose Redis state was lost and rebuilt from MariaDB's facts in a new stock generation",
                Counter::default(),
            ),
            actions: StockActions::register(registry),
            mode_switches: registered(
                registry,
                "mode_switches",
                "Products this instance switched to ledger mode (to=\"ledger\": Redis unreachable) or back to the Redis gate (to=\"gate\", Redis rebuilt)",
                Family::default(),
            ),
            drift_products: registered(
                registry,
                "reconcile_drift_products",
                "Products whose Redis available count differed from what MariaDB's facts imply at the last reconciliation pass",
                Gauge::default(),
            ),
            drift_units: registered(
                registry,
                "reconcile_drift_units",
                "Units of that drift, summed over products (absolute values)",
                Gauge::default(),
            ),
            repairs: registered(
                registry,
                "reconcile_repairs",
                "Repairs reconciliation made to a product's available count in Redis (a drift seen twice, the gate unchanged in between), each recorded in the ledger's stock_repair",
                Counter::default(),
            ),
            units_repaired: registered(
                registry,
                "reconcile_repaired_units",
                "Units those repairs added to or took from the counts (absolute values)",
                Counter::default(),
            ),
        }
    }
}

/// The relay's publishing and the statistics consumer's applying, dead letters and parked
/// rows.
struct EventMetrics {
    events_published: Counter,
    relay_failures: Counter,
    events_applied: Counter,
    consumer_failures: Counter,
    dead_lettered: Family<ReasonLabels, Counter>,
    outbox_parked_rows: Counter,
}

impl EventMetrics {
    fn register(registry: &mut Registry) -> Self {
        Self {
            events_published: registered(
                registry,
                "events_published",
                "Outbox events published to NATS JetStream and marked sent by this instance's relay",
                Counter::default(),
            ),
            relay_failures: registered(
                registry,
                "relay_failures",
                "Relay rounds that failed (NATS or MariaDB did not answer); the events wait in the outbox",
                Counter::default(),
            ),
            events_applied: registered(
                registry,
                "events_applied",
                "Events the sales-statistics consumer applied (each once, duplicates not counted)",
                Counter::default(),
            ),
            consumer_failures: registered(
                registry,
                "consumer_failures",
                "Chunks of events the consumer could not apply (MariaDB did not answer); redelivered later",
                Counter::default(),
            ),
            dead_lettered: registered(
                registry,
                "events_dead_lettered",
                "Messages the sales-statistics consumer moved to the dead-letter stream, by reason: refused (the statistics store refused them at their last allowed delivery, FLASHSALE_EVENTS_MAX_DELIVER) or undecodable (at once)",
                Family::default(),
            ),
            outbox_parked_rows: registered(
                registry,
                "outbox_parked",
                "Outbox rows this instance's relay parked: the broker refused them for good (too large) each time it was offered them, so they left the unsent events for an operator (flashsale events parked)",
                Counter::default(),
            ),
        }
    }
}

/// The stores as the sampler last read them: errors, up, the outbox, each product's stock
/// and mode, the writer, the audits' violations.
struct Stores {
    store_errors: Family<StoreErrorLabels, Counter>,
    store_up: Family<StoreLabels, Gauge>,
    outbox_unsent: Gauge,
    outbox_parked: Gauge,
    stock: Family<StockLabels, Gauge>,
    ledger_mode: Family<ProductLabels, Gauge>,
    paused: Family<ProductLabels, Gauge>,
    audit_violations: Gauge,
    ledger_writer: Family<NodeLabels, Gauge>,
}

impl Stores {
    fn register(registry: &mut Registry) -> Self {
        Self {
            store_errors: registered(
                registry,
                "store_errors",
                "Store errors that ended an answer (503), a worker pass, a relay round or a consumer chunk, by store and kind (unreachable, timed_out, rejected, contention, not_ready, corrupt, too_large, stopped, config)",
                Family::default(),
            ),
            store_up: registered(
                registry,
                "store_up",
                "Whether the store answered when the metrics were read (1) or not (0)",
                Family::default(),
            ),
            outbox_unsent: registered(
                registry,
                "outbox_unsent",
                "Events waiting in the outbox to be published, when the metrics were read (-1: MariaDB did not answer)",
                Gauge::default(),
            ),
            outbox_parked: registered(
                registry,
                "outbox_parked_events",
                "Events of parked outbox rows (the broker refused them for good; an operator's to retry), when the metrics were read (-1: MariaDB did not answer)",
                Gauge::default(),
            ),
            stock: registered(
                registry,
                "product_stock",
                "Units of each product (at most 100, the highest ids) by state — available (Redis), total, reserved and sold (MariaDB) — when the metrics were read",
                Family::default(),
            ),
            ledger_mode: registered(
                registry,
                "product_ledger_mode",
                "Whether each product (the same ones as product_stock) is sold from MariaDB (1: ledger mode, Redis unreachable) or through the Redis gate (0), when the metrics were read",
                Family::default(),
            ),
            paused: registered(
                registry,
                "product_paused",
                "Whether the operator paused each product's sale (1) or not (0), for the same products as product_stock, when the metrics were read",
                Family::default(),
            ),
            audit_violations: registered(
                registry,
                "audit_violations",
                "Invariant violations found by the audits recorded in the last 24 hours (serve's scheduled ones and flashsale audit's), when the metrics were read (-1: MariaDB did not answer)",
                Gauge::default(),
            ),
            ledger_writer: registered(
                registry,
                "ledger_writer",
                "The database node the ledger writes through (1, labelled host:port): on a Galera cluster the first healthy node listed, when the metrics were read",
                Family::default(),
            ),
        }
    }
}

/// The API listener's connections against its cap.
struct Listener {
    connections_open: Gauge,
    connections_max: Gauge,
    connections_refused: Family<ReasonLabels, Counter>,
    connections_evicted: Family<ReasonLabels, Counter>,
}

impl Listener {
    fn register(registry: &mut Registry) -> Self {
        Self {
            connections_open: registered(
                registry,
                "http_connections_open",
                "Client connections the API listener holds open now",
                Gauge::default(),
            ),
            connections_max: registered(
                registry,
                "http_connections_max",
                "The API listener's cap on open connections (FLASHSALE_CONNECTIONS_MAX, fitted to the open-files limit)",
                Gauge::default(),
            ),
            connections_refused: registered(
                registry,
                "http_connections_refused",
                "Connections answered 503 and closed as they arrived, by reason: cap (every open connection's request was being worked on), address (its address held its share, FLASHSALE_CONNECTIONS_PER_ADDRESS_MAX)",
                Family::default(),
            ),
            connections_evicted: registered(
                registry,
                "http_connections_evicted",
                "Connections closed at the cap to make room for a newcomer, by what they were waiting for: head (a request head: idle, or arriving slowly), body (a request's body)",
                Family::default(),
            ),
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("flashsale");
        Self {
            responses: registered(
                &mut registry,
                "http_responses",
                "Answers by endpoint and outcome (a success, or the error code answered)",
                Family::default(),
            ),
            latency: registered(
                &mut registry,
                "http_response_seconds",
                "Time from a request's handler starting (after routing and admission) to its answer, by endpoint and outcome",
                Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            ),
            workers: Workers::register(&mut registry),
            events: EventMetrics::register(&mut registry),
            stores: Stores::register(&mut registry),
            listener: Listener::register(&mut registry),
            cells: (0..ENDPOINTS.len() * Outcome::ALL.len())
                .map(|_| OnceLock::new())
                .collect(),
            latency_cells: (0..ENDPOINTS.len() * Outcome::ALL.len())
                .map(|_| OnceLock::new())
                .collect(),
            purchase_buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            registry,
        }
    }

    /// Counts one answer by index into `ENDPOINTS` and its outcome: the hot path's form,
    /// without name lookups.
    pub fn answered_at(&self, endpoint: usize, outcome: Outcome) {
        let (cell, labels) = cell_of(endpoint, outcome);
        self.cells[cell]
            .get_or_init(|| self.responses.get_or_create_owned(&labels))
            .inc();
    }

    /// Counts one answer as `answered_at` does and records how long it took.
    pub fn answered_in(&self, endpoint: usize, outcome: Outcome, took: Duration) {
        let (cell, labels) = cell_of(endpoint, outcome);
        self.cells[cell]
            .get_or_init(|| self.responses.get_or_create_owned(&labels))
            .inc();
        let seconds = took.as_secs_f64();
        self.latency_cells[cell]
            .get_or_init(|| self.latency.get_or_create_owned(&labels))
            .observe(seconds);
        if endpoint == PURCHASE {
            // The first bucket whose bound is at or above the time, as Prometheus's `le`.
            let bucket = LATENCY_BUCKETS.partition_point(|&le| le < seconds);
            self.purchase_buckets[bucket].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// What the purchase endpoint answered so far, by outcome and answer time.
    pub fn purchase_tally(&self) -> PurchaseTally {
        let by_outcome = std::array::from_fn(|i| {
            self.cells[PURCHASE * Outcome::ALL.len() + i]
                .get()
                .map_or(0, Counter::get)
        });
        let buckets = std::array::from_fn(|i| self.purchase_buckets[i].load(Ordering::Relaxed));
        PurchaseTally {
            by_outcome,
            buckets,
        }
    }

    /// The last reconciliation pass's drift: products, and units summed over them.
    pub fn drift(&self) -> (i64, i64) {
        (
            self.workers.drift_products.get(),
            self.workers.drift_units.get(),
        )
    }

    /// Incidents this instance's recovery recorded since it started.
    pub fn incidents_recorded(&self) -> u64 {
        self.workers.incidents.get()
    }

    /// Counts one pass of `worker`, and what it did.
    pub fn worker_pass(&self, worker: &'static str, ok: bool) {
        self.workers
            .worker_passes
            .get_or_create(&WorkerLabels {
                worker,
                result: if ok { "ok" } else { "error" },
            })
            .inc();
    }

    pub fn orders_expired(&self, n: usize) {
        self.workers.orders_expired.inc_by(n as u64);
    }

    pub fn recovered(&self, r: &RecoveryReport) {
        for (action, n) in [
            ("aligned", r.aligned),
            ("released", r.released),
            ("orphans_released", r.orphans_released),
            ("returns_completed", r.returns_completed),
            ("restocks_completed", r.restocks_completed),
            ("deferred", r.deferred),
        ] {
            if n > 0 {
                self.workers
                    .recovery
                    .get_or_create(&ActionLabels { action })
                    .inc_by(n as u64);
            }
        }
        self.workers.incidents.inc_by(r.incidents as u64);
    }

    /// This instance switched a product to `to`.
    pub fn mode_switched(&self, to: flashsale_core::StockMode) {
        self.workers
            .mode_switches
            .get_or_create(&ModeLabels { to: to.as_str() })
            .inc();
    }

    /// A destock settled: taken (`units` off sale) or refused.
    pub fn destocked(&self, taken: bool, units: i64) {
        let outcome = if taken { "taken" } else { "refused" };
        let w = &self.workers.actions;
        settled(
            &w.destocks,
            &w.units_destocked,
            outcome,
            units.unsigned_abs(),
        );
    }

    /// A paid order refunded: its `units` back on sale (`restocked`) or out of stock.
    pub fn refunded(&self, restocked: bool, units: u32) {
        let outcome = if restocked { "restocked" } else { "withdrawn" };
        let w = &self.workers.actions;
        settled(&w.refunds, &w.units_refunded, outcome, u64::from(units));
    }

    /// An ended sale's Redis state retired (`after_sale.rs`).
    pub fn sale_retired(&self) {
        self.workers.actions.sales_retired.inc();
    }

    pub fn gates_rebuilt(&self, n: usize) {
        self.workers.gate_rebuilds.inc_by(n as u64);
    }

    /// A repair reconciliation made: `delta` units added to (or taken from) a count.
    pub fn stock_repaired(&self, delta: i64) {
        self.workers.repairs.inc();
        self.workers.units_repaired.inc_by(delta.unsigned_abs());
    }

    /// The drifts the last reconciliation pass found (an empty list: none).
    pub fn reconciled(&self, drifted: &[Reconciliation]) {
        self.workers.drift_products.set(drifted.len() as i64);
        self.workers
            .drift_units
            .set(drifted.iter().map(|r| r.drift.saturating_abs()).sum());
    }

    pub fn events_published(&self, n: usize) {
        self.events.events_published.inc_by(n as u64);
    }

    pub fn relay_failed(&self) {
        self.events.relay_failures.inc();
    }

    pub fn events_applied(&self, n: usize) {
        self.events.events_applied.inc_by(n as u64);
    }

    pub fn consumer_failed(&self) {
        self.events.consumer_failures.inc();
    }

    /// Counts a message moved to the dead-letter stream, by why.
    pub fn event_dead_lettered(&self, reason: crate::consume::DeadReason) {
        self.events
            .dead_lettered
            .get_or_create(&ReasonLabels {
                reason: reason.as_str(),
            })
            .inc();
    }

    /// Counts outbox rows the relay parked.
    pub fn outbox_parked(&self, rows: usize) {
        self.events.outbox_parked_rows.inc_by(rows as u64);
    }

    /// Counts one store error by store (`redis`, `mariadb`, `nats`) and kind.
    pub fn store_failed(&self, store: &'static str, kind: ErrorKind) {
        self.stores
            .store_errors
            .get_or_create(&StoreErrorLabels {
                store,
                kind: kind.as_str(),
            })
            .inc();
    }

    /// Counts the store error an answer or a pass ended with, if it ended with one.
    pub fn failed(&self, e: &Error) {
        if let Error::Unavailable(why) = e {
            if let Some((store, kind)) = why.store_fault() {
                self.store_failed(store, kind);
            }
        }
    }

    /// The API listener's connection cap, as fitted at startup.
    pub fn connections_capped(&self, max: usize) {
        self.listener
            .connections_max
            .set(i64::try_from(max).unwrap_or(i64::MAX));
    }

    /// One client connection more (`true`) or less (`false`) open on the API listener.
    pub fn connection_open(&self, opened: bool) {
        match opened {
            true => self.listener.connections_open.inc(),
            false => self.listener.connections_open.dec(),
        };
    }

    /// Counts one connection refused as it arrived (`cap`, `address`).
    pub fn connection_refused(&self, reason: &'static str) {
        self.listener
            .connections_refused
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Counts one connection evicted at the cap, by what it was waiting for (`head`,
    /// `body`).
    pub fn connection_evicted(&self, reason: &'static str) {
        self.listener
            .connections_evicted
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Every metric in the OpenMetrics text format (what Prometheus scrapes).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            // Only a formatting error of a label: the metrics encoded so far still go out.
            warn!(error = %e, "encoding metrics failed part-way");
        }
        out
    }
}

/// The stores as one read found them: what `GET /metrics` reports as gauges, and what
/// the live sale page (`GET /dashboard/data`) shows. A figure that could not be read in
/// time is None, never a stale value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreView {
    /// When the read finished (None: no read yet).
    pub read_at: Option<DateTime<Utc>>,
    pub redis_up: bool,
    pub mariadb_up: bool,
    /// Events waiting in the outbox (None: not read, or no outbox).
    pub outbox_unsent: Option<u64>,
    /// Events of parked outbox rows: refused by the broker for good, an operator's to
    /// retry (None: not read, or no outbox).
    pub outbox_parked: Option<u64>,
    /// Recovery incidents open in the ledger (None: not read).
    pub open_incidents: Option<i64>,
    /// The last audit's verdict: None not read, Some(None) no audit recorded yet.
    pub last_audit: Option<Option<AuditRun>>,
    /// Violations found by the audits recorded in the last 24 hours (None: not read).
    pub audit_violations: Option<i64>,
    /// The newest `PRODUCTS_MAX` products, highest id first.
    pub products: Vec<ProductStock>,
}

/// One product's stock as a read found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProductStock {
    pub product_id: ProductId,
    /// The product's name and who serves its stock (None: not read).
    pub name: Option<String>,
    pub mode: Option<StockMode>,
    /// Whether the operator paused its sale (None: not read).
    pub paused: Option<bool>,
    /// MariaDB's counters (None: not read).
    pub counters: Option<InventoryCounters>,
    /// Units a buyer can still get, as `GET /v1/products/{id}` counts them: Redis's
    /// count while the gate serves the stock, the ledger's in ledger mode or before the
    /// stock was loaded (None: not read).
    pub available: Option<i64>,
}

/// Reads the stores when the metrics are scraped or the live sale page asks: whether
/// Redis and MariaDB answer, the outbox's backlog, and the stock of `PRODUCTS_MAX`
/// products, into the gauges and a [`StoreView`].
/// Each read is bounded by `STORE_TIMEOUT` and all of them by `SCRAPE_BUDGET`; a figure
/// not read is left out (the backlog reads -1), never shown stale. One read of the stores
/// runs at a time, and one younger than `SCRAPE_REUSE` is answered again, whoever asks.
pub struct Monitor {
    metrics: Arc<Metrics>,
    gate: Arc<dyn StockGate>,
    ledger: Arc<dyn Ledger>,
    ledger_m: Arc<dyn LedgerMaintenance>,
    outbox: Option<Arc<dyn Outbox>>,
    /// The last read: when it finished, the metrics' text and the view.
    last: tokio::sync::Mutex<Option<(Instant, Arc<Scraped>)>>,
}

/// One read of the stores, as text for Prometheus and as a view for the page.
struct Scraped {
    text: String,
    view: Arc<StoreView>,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor").finish_non_exhaustive()
    }
}

/// `f`'s value if it answers within `STORE_TIMEOUT` and before `deadline`.
async fn bounded<T, E>(
    deadline: Instant,
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Option<T> {
    let limit = deadline.min(Instant::now() + STORE_TIMEOUT);
    tokio::time::timeout_at(limit.into(), f).await.ok()?.ok()
}

impl Monitor {
    pub fn new(
        metrics: Arc<Metrics>,
        gate: Arc<dyn StockGate>,
        ledger: Arc<dyn Ledger>,
        ledger_m: Arc<dyn LedgerMaintenance>,
        outbox: Option<Arc<dyn Outbox>>,
    ) -> Self {
        Self {
            metrics,
            gate,
            ledger,
            ledger_m,
            outbox,
            last: tokio::sync::Mutex::new(None),
        }
    }

    /// Every metric as text, the stores' gauges read now — or by a read that finished
    /// less than `SCRAPE_REUSE` ago, or while this caller waited for it: a caller waits
    /// at most for the one read in progress (`SCRAPE_BUDGET`), however many queue.
    pub async fn scrape(&self) -> String {
        self.read().await.text.clone()
    }

    /// The stores as read now, or by a read as recent as [`scrape`](Self::scrape)'s:
    /// the same reads serve both, so the page adds no load to the stores.
    pub async fn view(&self) -> Arc<StoreView> {
        self.read().await.view.clone()
    }

    async fn read(&self) -> Arc<Scraped> {
        let arrived = Instant::now();
        let mut last = self.last.lock().await;
        if let Some((finished, scraped)) = last.as_ref() {
            if *finished >= arrived || finished.elapsed() < SCRAPE_REUSE {
                return scraped.clone();
            }
        }
        let view = self.read_stores(Instant::now() + SCRAPE_BUDGET).await;
        let scraped = Arc::new(Scraped {
            text: self.metrics.encode(),
            view: Arc::new(view),
        });
        *last = Some((Instant::now(), scraped.clone()));
        scraped
    }

    async fn read_stores(&self, deadline: Instant) -> StoreView {
        // Together: a hanging store must not eat the other's share of the budget.
        let (redis, mariadb) = tokio::join!(
            bounded(deadline, self.gate.ping()),
            bounded(deadline, self.ledger.ping())
        );
        let (redis_up, mariadb_up) = (redis.is_some(), mariadb.is_some());
        self.stores_up(redis_up, mariadb_up);
        let mut view = StoreView {
            redis_up,
            mariadb_up,
            ..StoreView::default()
        };
        if mariadb_up {
            self.read_ledger_state(deadline, &mut view).await;
        }
        let m = &self.metrics;
        m.stores
            .audit_violations
            .set(view.audit_violations.unwrap_or(-1));
        if self.outbox.is_some() {
            let count = |n: Option<u64>| n.map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX));
            m.stores.outbox_unsent.set(count(view.outbox_unsent));
            m.stores.outbox_parked.set(count(view.outbox_parked));
        }
        // Products gone from the list, or whose figures could not be read this time,
        // must not keep their last value.
        m.stores.stock.clear();
        m.stores.ledger_mode.clear();
        m.stores.paused.clear();
        let products = match mariadb_up {
            true => bounded(deadline, self.ledger_m.newest_products(PRODUCTS_MAX))
                .await
                .unwrap_or_default(),
            false => Vec::new(),
        };
        for product_id in products {
            if Instant::now() >= deadline {
                break;
            }
            let stock = self.read_product(deadline, product_id, redis_up).await;
            view.products.push(stock);
        }
        view.read_at = Some(Utc::now());
        view
    }

    /// Sets the stores' up gauges and the ledger's writer.
    fn stores_up(&self, redis_up: bool, mariadb_up: bool) {
        let m = &self.metrics;
        for (store, up) in [("redis", redis_up), ("mariadb", mariadb_up)] {
            m.stores
                .store_up
                .get_or_create(&StoreLabels { store })
                .set(i64::from(up));
        }
        m.stores.ledger_writer.clear();
        if let Some(node) = self.ledger_m.writer() {
            m.stores
                .ledger_writer
                .get_or_create(&NodeLabels { node })
                .set(1);
        }
    }

    /// The ledger's figures of the whole sale, MariaDB having answered: the outbox's
    /// unsent and parked events, the open incidents, the last audit and the recent
    /// audits' violations (None where a read did not answer in time).
    async fn read_ledger_state(&self, deadline: Instant, view: &mut StoreView) {
        if let Some(outbox) = &self.outbox {
            view.outbox_unsent = bounded(deadline, outbox.unsent()).await;
            view.outbox_parked = bounded(deadline, outbox.parked_events()).await;
        }
        // For the page only (alerting has flashsale_recovery_incidents_total and the
        // audit's exit code): two small reads, on an index and the newest row.
        view.open_incidents = bounded(deadline, self.ledger_m.open_incidents()).await;
        view.last_audit = bounded(deadline, self.ledger_m.last_audit()).await;
        let window = self
            .ledger_m
            .audit_violations_within(AUDIT_VIOLATIONS_WINDOW);
        view.audit_violations = bounded(deadline, window).await;
    }

    /// One product's figures, each store's read within `deadline`, into its gauges and
    /// the page's view.
    async fn read_product(
        &self,
        deadline: Instant,
        product_id: ProductId,
        redis_up: bool,
    ) -> ProductStock {
        let m = &self.metrics;
        let id = product_id.to_string();
        let set = |state: &'static str, v: i64| {
            m.stores
                .stock
                .get_or_create(&StockLabels {
                    product_id: id.clone(),
                    state,
                })
                .set(v);
        };
        let counters = bounded(deadline, self.ledger.inventory(product_id))
            .await
            .flatten();
        if let Some(c) = &counters {
            set("total", c.total);
            set("reserved", c.reserved);
            set("sold", c.sold);
        }
        let product = bounded(deadline, self.ledger.product(product_id))
            .await
            .flatten();
        if let Some(p) = &product {
            let labels = ProductLabels {
                product_id: id.clone(),
            };
            m.stores
                .ledger_mode
                .get_or_create(&labels)
                .set(i64::from(p.stock_mode == StockMode::Ledger));
            m.stores
                .paused
                .get_or_create(&labels)
                .set(i64::from(p.paused));
        }
        let mut in_gate = None;
        if redis_up {
            in_gate = bounded(deadline, self.gate.available(product_id))
                .await
                .flatten();
            if let Some(available) = in_gate {
                set("available", available);
            }
        }
        // As `Flashsale::product_view` counts it.
        let available = match (&product, &counters) {
            (Some(p), Some(c)) if p.stock_mode == StockMode::Ledger || !p.stock_loaded => {
                Some(c.available)
            }
            (Some(_), _) => in_gate,
            (None, _) => None,
        };
        ProductStock {
            product_id,
            name: product.as_ref().map(|p| p.name.clone()),
            mode: product.as_ref().map(|p| p.stock_mode),
            paused: product.as_ref().map(|p| p.paused),
            counters,
            available,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the text the counters encode to: two answers counted by index land in one
    // series; an endpoint index past the list is counted as "other", not dropped; the worker, recovery and event counters and the
    // drift gauges appear with their values; the format ends with OpenMetrics' "# EOF".
    #[test]
    fn counters_encode_as_openmetrics() {
        let m = Metrics::new();
        let purchase = index_of(&ENDPOINTS, "purchase");
        m.answered_at(purchase, Outcome::SoldOut);
        m.answered_at(purchase, Outcome::SoldOut);
        m.answered_at(purchase, Outcome::Created);
        m.answered_at(usize::MAX, Outcome::NotFound);
        m.worker_pass("recovery", true);
        m.worker_pass("recovery", false);
        m.recovered(&RecoveryReport {
            released: 2,
            incidents: 1,
            ..RecoveryReport::default()
        });
        m.events_published(5);
        m.reconciled(&[]);
        m.stock_repaired(-5);
        let text = m.encode();
        for line in [
            r#"flashsale_http_responses_total{endpoint="purchase",outcome="sold_out"} 2"#,
            r#"flashsale_http_responses_total{endpoint="purchase",outcome="created"} 1"#,
            r#"flashsale_http_responses_total{endpoint="other",outcome="not_found"} 1"#,
            r#"flashsale_worker_passes_total{worker="recovery",result="ok"} 1"#,
            r#"flashsale_worker_passes_total{worker="recovery",result="error"} 1"#,
            r#"flashsale_recovery_actions_total{action="released"} 2"#,
            "flashsale_recovery_incidents_total 1",
            "flashsale_events_published_total 5",
            "flashsale_reconcile_drift_products 0",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(
            !text.contains(r#"{action="aligned"}"#),
            "zero actions add no series:\n{text}"
        );
    }

    // Checks that every outcome of every endpoint is counted and timed in a series of
    // its own, labelled with its code: each (endpoint, outcome) pair answered a distinct
    // number of times (1 + its cell's index), then each series' count read back from the
    // text; two pairs sharing a cell, or an outcome without one, would read another count.
    #[test]
    fn every_outcome_of_every_endpoint_has_its_own_series() {
        let m = Metrics::new();
        let mut n = 0;
        for endpoint in ENDPOINTS {
            for outcome in Outcome::ALL {
                n += 1;
                for _ in 0..n {
                    m.answered_in(
                        index_of(&ENDPOINTS, endpoint),
                        outcome,
                        Duration::from_millis(1),
                    );
                }
            }
        }
        let text = m.encode();
        let mut n = 0;
        for endpoint in ENDPOINTS {
            for outcome in Outcome::ALL {
                n += 1;
                let labels = format!(r#"{{endpoint="{endpoint}",outcome="{outcome}"}}"#);
                for line in [
                    format!("flashsale_http_responses_total{labels} {n}"),
                    format!("flashsale_http_response_seconds_count{labels} {n}"),
                ] {
                    assert!(text.lines().any(|l| l == line), "missing {line}");
                }
            }
        }
    }

    // Checks the store errors' counter: an error that ended an answer or a pass is
    // counted under its store and kind, the use case's own reasons and the other
    // outcomes not at all. How: `failed` called with each and the text read back.
    #[test]
    fn store_errors_are_counted_by_store_and_kind() {
        use crate::ports::{GateError, LedgerError};
        let m = Metrics::new();
        m.failed(&GateError::timed_out("reserve").into());
        m.failed(&GateError::timed_out("release").into());
        m.failed(&LedgerError::unreachable("pool").into());
        m.failed(&Error::Unavailable("being rebuilt".into()));
        m.failed(&Error::SoldOut);
        let text = m.encode();
        let series: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("flashsale_store_errors_total"))
            .collect();
        let mut want = vec![
            r#"flashsale_store_errors_total{store="redis",kind="timed_out"} 2"#,
            r#"flashsale_store_errors_total{store="mariadb",kind="unreachable"} 1"#,
        ];
        let mut got = series.clone();
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(got, want, "{text}");
    }

    // Checks the listener's connection metrics: the gauge of open connections follows
    // opens and closes, the cap is its own gauge, and refusals and evictions are counted
    // under their reasons. How: each method called, the text read back line by line.
    #[test]
    fn connections_are_counted_open_refused_and_evicted_by_reason() {
        let m = Metrics::new();
        m.connections_capped(200);
        for opened in [true, true, true, false] {
            m.connection_open(opened);
        }
        m.connection_refused("cap");
        m.connection_refused("address");
        m.connection_refused("address");
        m.connection_evicted("head");
        m.connection_evicted("body");
        m.connection_evicted("body");
        let text = m.encode();
        for line in [
            "flashsale_http_connections_open 2",
            "flashsale_http_connections_max 200",
            r#"flashsale_http_connections_refused_total{reason="cap"} 1"#,
            r#"flashsale_http_connections_refused_total{reason="address"} 2"#,
            r#"flashsale_http_connections_evicted_total{reason="head"} 1"#,
            r#"flashsale_http_connections_evicted_total{reason="body"} 2"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
        }
    }

    // Checks the alert rules with Prometheus's own tool where it is installed (Debian:
    // `apt install prometheus`): `promtool check rules docs/alerts.yml` parses them and
    // `promtool test rules docs/alerts_test.yml` feeds each rule the series that must make
    // it fire and those that must not. Without promtool on the PATH it says so and passes:
    // the tool is no dependency of the project.
    #[test]
    fn alert_rules_pass_promtool() {
        let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
        for args in [
            ["check", "rules", "alerts.yml"],
            ["test", "rules", "alerts_test.yml"],
        ] {
            let run = match std::process::Command::new("promtool")
                .args(args)
                .current_dir(&docs)
                .output()
            {
                Ok(run) => run,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    println!("promtool not installed: docs/alerts.yml not checked by it");
                    return;
                }
                Err(e) => panic!("running promtool: {e}"),
            };
            assert!(
                run.status.success(),
                "promtool {}:\n{}{}",
                args.join(" "),
                String::from_utf8_lossy(&run.stdout),
                String::from_utf8_lossy(&run.stderr)
            );
        }
    }

    /// Every metric with at least one series: each counting method called once, and
    /// the gauges the monitor sets given a value.
    fn all_touched() -> Metrics {
        let m = Metrics::new();
        m.answered_in(0, Outcome::Created, Duration::from_millis(3));
        m.worker_pass("expiry", true);
        m.orders_expired(1);
        m.recovered(&RecoveryReport {
            released: 1,
            incidents: 1,
            ..RecoveryReport::default()
        });
        m.gates_rebuilt(1);
        m.mode_switched(flashsale_core::StockMode::Ledger);
        m.reconciled(&[]);
        m.events_published(1);
        m.relay_failed();
        m.events_applied(1);
        m.consumer_failed();
        m.event_dead_lettered(crate::consume::DeadReason::Refused);
        m.outbox_parked(1);
        m.store_failed("redis", ErrorKind::TimedOut);
        m.stores
            .store_up
            .get_or_create(&StoreLabels { store: "redis" })
            .set(1);
        m.stores.outbox_unsent.set(0);
        m.stores.outbox_parked.set(0);
        m.stores
            .stock
            .get_or_create(&StockLabels {
                product_id: "1".into(),
                state: "total",
            })
            .set(1);
        m.stores
            .ledger_mode
            .get_or_create(&ProductLabels {
                product_id: "1".into(),
            })
            .set(0);
        m.stores
            .paused
            .get_or_create(&ProductLabels {
                product_id: "1".into(),
            })
            .set(0);
        m.stores.audit_violations.set(0);
        m.stores
            .ledger_writer
            .get_or_create(&NodeLabels {
                node: "127.0.0.1:3306".into(),
            })
            .set(1);
        m.connections_capped(10_000);
        m.connection_open(true);
        m.connection_refused("cap");
        m.connection_evicted("body");
        m.destocked(true, 3);
        m.refunded(false, 1);
        m.sale_retired();
        m
    }

    // Checks the alert rules (docs/alerts.yml) and the API reference's list (docs/api.md,
    // "Health") name only series
    // that exist: every `flashsale_…` word in them is the name of a sample the metrics
    // encode to (a counter's with its `_total`, a gauge's bare) or a histogram's family
    // name, all 36 families touched.
    #[test]
    fn alert_rules_name_real_metrics() {
        let text = all_touched().encode();
        let families = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
        assert_eq!(
            families, 36,
            "every family registered in Metrics::new:\n{text}"
        );
        // A histogram is named by its family (its samples add _bucket, _sum, _count).
        let histograms = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" histogram"));
        let samples: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split(['{', ' ']).next())
            .chain(histograms)
            .collect();
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        for doc in ["docs/alerts.yml", "docs/api.md"] {
            let text = std::fs::read_to_string(root.join(doc)).expect(doc);
            let mut seen = 0;
            for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                // Crate names and settings are not metrics.
                if !word.starts_with("flashsale_") || word.starts_with("flashsale_app") {
                    continue;
                }
                seen += 1;
                assert!(
                    samples.contains(&word),
                    "{doc}: {word} is no metric's samples"
                );
            }
            assert!(seen >= 10, "{doc}: only {seen} metric names found");
        }
    }
}
