//! Wires the adapters (Redis, MariaDB) to the use cases and the HTTP API. The binary in
//! `main.rs` is a thin command line over this; integration tests call it directly.

pub mod config;
pub mod demo;
pub mod events;
pub mod http;
pub mod incidents;
pub mod keys;
pub mod reach;
pub mod workers;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use flashsale_api::auth::AdminTokens;
use flashsale_api::{ApiConfig, PurchaseLimits};
use flashsale_app::baseline::{Baseline, Strategy};
use flashsale_app::limit::{self, Limiter};
use flashsale_app::ports::LeaseListener;
use flashsale_app::{
    AuditBounds, Fallback, Flashsale, Maintenance, MaintenanceSettings, Metrics, Monitor, Ports,
    Sampler, Settings, SystemClock,
};
use flashsale_app::{Clock, Destocking, Listing, Listings, SaleControl, SaleRetirement};
use flashsale_core::{AdminName, ProductId};
use flashsale_mysql::{LedgerConfig, MysqlLedger};
use flashsale_redis::{GateConfig, RedisGate};
use rand::Rng;
use tokio::sync::Notify;
use tracing::{info, warn};

pub use config::Config;

/// Longest wait for a database connection before 503; shorter when the request deadline
/// is (a third of it), so a purchase can still do its other steps.
const DATABASE_ACQUIRE_TIMEOUT_MAX: Duration = Duration::from_secs(3);
/// How long Redis may take to answer one command before the outcome is called unknown:
/// a script runs in microseconds, so a second means Redis is stalled or gone.
const REDIS_RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a Redis connection attempt may take.
const REDIS_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Most items one pass of a background worker handles: bounds the time and memory of a
/// pass; a backlog drains over consecutive passes.
pub(crate) const WORKER_BATCH_SIZE: usize = 500;
/// Products a worker reads from the ledger at once while it walks the loaded products:
/// one small query per thousand products, and a page's ids take a few kilobytes.
const PRODUCTS_PAGE: usize = 1_000;

/// Connections of the event workers' own database pool: the relay and the consumer use
/// one at a time each; a pool of their own never takes a connection a purchase waits for.
const EVENTS_DATABASE_CONNECTIONS: u32 = 2;

/// Starts the event relay (outbox → NATS JetStream) and the sales-statistics consumer,
/// on a database pool of their own, counting their work in `metrics`. Returns at once,
/// whether NATS is up or not: the broker is connected to in the background, and
/// purchases never wait for it.
pub async fn start_events(
    config: &Config,
    metrics: Arc<Metrics>,
) -> Result<flashsale_nats::EventWorkers, String> {
    let ledger = Arc::new(
        MysqlLedger::connect(&LedgerConfig {
            url: config.database_url.clone(),
            max_connections: EVENTS_DATABASE_CONNECTIONS,
            acquire_timeout: DATABASE_ACQUIRE_TIMEOUT_MAX,
            transaction_timeout: config.request_timeout,
            cluster: config.database_cluster.clone(),
        })
        .await
        .map_err(|e| format!("events database: {e}"))?,
    );
    let relay_id: String = rand::rng()
        .random::<[u8; 8]>()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    flashsale_nats::EventWorkers::start(
        nats_config(config),
        ledger.clone(),
        ledger,
        format!("relay-{relay_id}"),
        metrics,
    )
    .await
    .map_err(|e| format!("events: {e}"))
}

/// Where and how the events go on NATS, as configured.
pub fn nats_config(config: &Config) -> flashsale_nats::NatsConfig {
    flashsale_nats::NatsConfig {
        urls: config.nats_urls.clone(),
        subject_prefix: config.nats_subject_prefix.clone(),
        stream: config.nats_stream.clone(),
        events_per_message: config.nats_events_per_message,
        replicas: config.nats_stream_replicas,
        max_deliver: config.events_max_deliver,
    }
}

/// A wired service.
pub struct App {
    pub router: Router,
    pub service: Arc<Flashsale>,
    pub maintenance: Arc<Maintenance>,
    /// A token the admin endpoints take (`admin`'s, else the first named one).
    pub admin_token: String,
    /// What `GET /metrics` shows; the workers and event loops count into it too.
    pub metrics: Arc<Metrics>,
    /// `GET /metrics` for a listener of its own, when `FLASHSALE_METRICS_LISTEN` is set
    /// (the API's router then leaves it out).
    pub metrics_router: Option<Router>,
    /// Wakes the gate watch between its periods: a purchase met a gate behind the
    /// ledger, or the lease subscription came back (Redis may have restarted).
    pub gate_watch: Arc<Notify>,
    /// Switches products to ledger mode while Redis is down, and back
    /// (`flashsale_app::fallback`); its worker also keeps the service's mode board.
    pub fallback: Arc<Fallback>,
    /// Destocks; its workers' pass settles the ones a crash left pending.
    pub destocking: Arc<Destocking>,
    /// Retires ended sales' Redis state (None: `FLASHSALE_SALE_RETIRE_AFTER=off`).
    pub retirement: Option<Arc<SaleRetirement>>,
}

pub async fn connect_ledger(config: &Config) -> Result<MysqlLedger, String> {
    MysqlLedger::connect(&LedgerConfig {
        url: config.database_url.clone(),
        max_connections: config.database_max_connections,
        acquire_timeout: DATABASE_ACQUIRE_TIMEOUT_MAX.min(config.request_timeout / 3),
        // Below the request deadline, so the request itself still answers 503 in time.
        transaction_timeout: config.request_timeout * 4 / 5,
        cluster: config.database_cluster.clone(),
    })
    .await
    .map_err(|e| e.to_string())
}

fn gate_for(config: &Config) -> Result<RedisGate, String> {
    RedisGate::new(&GateConfig {
        target: config.redis.clone(),
        prefix: config.redis_prefix.clone(),
        record_ttl: config.redis_record_ttl,
        sold_out_lease: config.sold_out_lease,
        shared_user_rate: config
            .user_purchase_rate
            .filter(|_| config.user_purchase_rate_shared),
        response_timeout: REDIS_RESPONSE_TIMEOUT,
        connect_timeout: REDIS_CONNECT_TIMEOUT,
    })
    .map_err(|e| e.to_string())
}

/// The two stores' adapters as the use cases' ports, on the system clock.
fn ports(gate: &Arc<RedisGate>, ledger: &Arc<MysqlLedger>) -> Ports {
    Ports {
        gate: gate.clone(),
        gate_m: gate.clone(),
        ledger: ledger.clone(),
        ledger_m: ledger.clone(),
        clock: Arc::new(SystemClock),
    }
}

fn maintenance_for(
    config: &Config,
    ports: Ports,
    metrics: Option<Arc<Metrics>>,
) -> Arc<Maintenance> {
    let maintenance = Maintenance::new(
        ports,
        MaintenanceSettings {
            recovery_after: config.recovery_after,
            batch_size: WORKER_BATCH_SIZE,
            products_page: PRODUCTS_PAGE,
            audit_bounds: audit_bounds(config),
            payment_timeout: config.payment_timeout,
        },
    );
    Arc::new(match metrics {
        Some(metrics) => maintenance.with_metrics(metrics),
        None => maintenance,
    })
}

/// How long the audit lets work in flight take. Recovery releases a hold once it is
/// `recovery_after` old, in the first pass after that; expiry and the completion of
/// returns and restocks take a pass of their worker, well within the same time.
pub fn audit_bounds(config: &Config) -> AuditBounds {
    AuditBounds {
        workers: config
            .recovery_after
            .saturating_add(config.recovery_interval.max(config.expiry_interval)),
        outbox: config.outbox_pending_max,
    }
}

/// The workers and checks without the HTTP side, for the `audit` and `reconcile`
/// commands. Does not migrate: it only reads (and, asked to, repairs Redis).
pub async fn connect_maintenance(config: &Config) -> Result<Arc<Maintenance>, String> {
    let ledger = Arc::new(connect_ledger(config).await?);
    let gate = Arc::new(gate_for(config)?);
    Ok(maintenance_for(config, ports(&gate, &ledger), None))
}

/// Connects, applies migrations, and builds the router.
pub async fn build(config: &Config) -> Result<App, String> {
    let ledger = Arc::new(connect_and_migrate(config).await?);
    keys::check(config, &ledger).await?;
    let gate = Arc::new(gate_for(config)?);
    reach::warn_unreachable(config, &gate).await;
    let metrics = Arc::new(Metrics::new());
    let ports = ports(&gate, &ledger);
    let maintenance = maintenance_for(config, ports.clone(), Some(metrics.clone()));
    let gate_watch = Arc::new(Notify::new());
    let service = Arc::new(service_for(config, &gate, &ledger, &gate_watch));
    let stores = Stores {
        ledger: ledger.clone(),
        gate: gate.clone(),
        service: service.clone(),
        metrics: metrics.clone(),
    };
    let admin = SaleAdmin::new(config, &stores);
    let fallback = Arc::new(
        Fallback::new(ports, service.mode_board(), config.fallback).with_metrics(metrics.clone()),
    );
    // Detached, like the lease listener: it runs as long as the runtime.
    tokio::spawn(follow_modes(fallback.clone()));
    if config.strategy == Strategy::Flashsale {
        listen_for_revocations(config, &service, &gate_watch).await?;
    }
    if let Some(warning) = config.buyer_auth.startup_warning() {
        warn!("{warning}");
    }
    let routers = routers_for(config, &stores, &admin);
    Ok(App {
        router: routers.api,
        service,
        maintenance,
        admin_token: routers.admin_token,
        metrics,
        metrics_router: routers.metrics,
        gate_watch,
        fallback,
        destocking: admin.destocking,
        retirement: admin.retirement,
    })
}

/// The stores and the purchase use case every other use case and router is built over.
struct Stores {
    ledger: Arc<MysqlLedger>,
    gate: Arc<RedisGate>,
    service: Arc<Flashsale>,
    metrics: Arc<Metrics>,
}

/// The admin's use cases over a sale: pause and change, destock, and retirement of
/// ended sales (None: `FLASHSALE_SALE_RETIRE_AFTER=off`).
struct SaleAdmin {
    control: Arc<SaleControl>,
    destocking: Arc<Destocking>,
    retirement: Option<Arc<SaleRetirement>>,
}

impl SaleAdmin {
    fn new(config: &Config, s: &Stores) -> Self {
        let metrics = || Some(s.metrics.clone());
        let (ledger, gate, service) = (&s.ledger, &s.gate, &s.service);
        Self {
            control: Arc::new(SaleControl::new(
                ledger.clone(),
                gate.clone(),
                service.clone(),
                metrics(),
            )),
            destocking: Arc::new(Destocking::new(
                ledger.clone(),
                gate.clone(),
                service.clone(),
                metrics(),
            )),
            retirement: config.sale_retire_after.map(|grace| {
                let (ledger, gate) = (ledger.clone(), gate.clone());
                Arc::new(SaleRetirement::new(ledger, gate, grace, metrics()))
            }),
        }
    }
}

/// The API's router, the separate metrics router (when `metrics_listen` is set) and a
/// token the admin endpoints take, for the callers in this process (tests, the demo).
struct Routers {
    api: Router,
    metrics: Option<Router>,
    admin_token: String,
}

/// The routers over the use cases, with the monitor, the dashboard and its sampler.
fn routers_for(config: &Config, stores: &Stores, admin: &SaleAdmin) -> Routers {
    let Stores {
        ledger,
        gate,
        service,
        metrics,
    } = stores;
    let monitor = Arc::new(Monitor::new(
        metrics.clone(),
        gate.clone(),
        ledger.clone(),
        ledger.clone(),
        Some(ledger.clone()),
    ));
    let sampler = Arc::new(Sampler::new(metrics.clone(), SystemClock.now()));
    // Detached, like the mode follower: it runs as long as the runtime.
    tokio::spawn(sample(sampler.clone()));
    let dashboard = Arc::new(flashsale_api::Dashboard {
        monitor: monitor.clone(),
        sampler,
        metrics: metrics.clone(),
    });
    let admins = admin_tokens(config);
    let admin_token = admins[0].1.clone();
    let listing_ledger: Arc<dyn Listings> = ledger.clone();
    let api = flashsale_api::router(
        service.clone(),
        ApiConfig {
            admin_tokens: AdminTokens::new(admins),
            in_flight_max: config.in_flight_max,
            request_timeout: config.request_timeout,
            baseline: baseline_for(config, ledger, gate),
            metrics: metrics.clone(),
            monitor: Some(monitor.clone()),
            dashboard: Some(dashboard.clone()),
            serve_metrics: config.metrics_listen.is_none(),
            limits: Arc::new(purchase_limits(config)),
            buyer_auth: config.buyer_auth.clone(),
            listing: Arc::new(Listing::new(listing_ledger)),
            control: admin.control.clone(),
            destocking: admin.destocking.clone(),
        },
    );
    let metrics = config
        .metrics_listen
        .map(|_| flashsale_api::metrics_router(monitor, dashboard));
    Routers {
        api,
        metrics,
        admin_token,
    }
}

/// The ledger, connected and migrated, retried while the database is not ready yet
/// ([`reach::STARTUP_DATABASE_ATTEMPTS`], [`reach::STARTUP_DATABASE_RETRY`] apart).
async fn connect_and_migrate(config: &Config) -> Result<MysqlLedger, String> {
    let mut attempt = 1;
    loop {
        let result = match connect_ledger(config).await {
            Ok(ledger) => ledger
                .migrate()
                .await
                .map(|()| ledger)
                .map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        match result {
            Ok(ledger) => return Ok(ledger),
            Err(e) if attempt < reach::STARTUP_DATABASE_ATTEMPTS => {
                warn!(
                    attempt,
                    of = reach::STARTUP_DATABASE_ATTEMPTS,
                    error = %e,
                    "{} not ready; retrying",
                    reach::database(config)
                );
                tokio::time::sleep(reach::STARTUP_DATABASE_RETRY).await;
                attempt += 1;
            }
            Err(e) => return Err(reach::database_gave_up(config, &e)),
        }
    }
}

/// The benchmark baseline that serves purchases instead of flashsale, if one is set.
fn baseline_for(
    config: &Config,
    ledger: &Arc<MysqlLedger>,
    gate: &Arc<RedisGate>,
) -> Option<Arc<Baseline>> {
    match config.strategy {
        Strategy::Flashsale => None,
        strategy => {
            warn!(
                strategy = strategy.as_str(),
                "serving purchases with a benchmark baseline, not flashsale's guarantees"
            );
            Some(Arc::new(Baseline::new(
                strategy,
                ledger.clone(),
                gate.clone(),
                config.payment_timeout,
            )))
        }
    }
}

/// The purchase use case with its settings, rate limits and the gate watch to nudge.
fn service_for(
    config: &Config,
    gate: &Arc<RedisGate>,
    ledger: &Arc<MysqlLedger>,
    gate_watch: &Arc<Notify>,
) -> Flashsale {
    let mut service = Flashsale::new(
        gate.clone(),
        ledger.clone(),
        Arc::new(SystemClock),
        Settings {
            payment_timeout: config.payment_timeout,
            max_quantity_per_order: config.max_quantity_per_order,
        },
    );
    match config.user_purchase_rate {
        Some(rate) if config.user_purchase_rate_shared => {
            service = service.with_user_rate_at_gate(rate);
        }
        Some(rate) => service = service.with_user_rate(rate),
        None => {}
    }
    service
        .with_gate_watch(gate_watch.clone())
        .with_reload(ledger.clone(), gate.clone())
}

/// Subscribes to the sold-out leases' revocations and the products' changes (a pause),
/// detached: it runs as long as the runtime, like the server itself.
async fn listen_for_revocations(
    config: &Config,
    service: &Flashsale,
    gate_watch: &Arc<Notify>,
) -> Result<(), String> {
    flashsale_redis::revoke::listen(
        &config.redis,
        &config.redis_prefix,
        Arc::new(NudgeWhenHeard {
            inner: service.lease_listener(),
            gate_watch: gate_watch.clone(),
        }),
    )
    .await
    .map(drop)
    .map_err(|e| format!("invalid redis url: {e}"))
}

/// The admin tokens: `admin`'s and the named ones as configured; with none at all, one
/// named `admin` generated for this run (and logged).
fn admin_tokens(config: &Config) -> Vec<(AdminName, String)> {
    let mut tokens = config.admin_tokens.clone();
    if let Some(token) = &config.admin_token {
        tokens.insert(0, (AdminName::default(), token.clone()));
    }
    if tokens.is_empty() {
        tokens.push((AdminName::default(), admin_token(config)));
    }
    info!(admins = ?tokens.iter().map(|(name, _)| name.as_str()).collect::<Vec<_>>(),
        "admin tokens");
    tokens
}

/// `admin`'s token: the configured one, or one generated for this run (and logged).
fn admin_token(config: &Config) -> String {
    match &config.admin_token {
        Some(token) => token.clone(),
        None => {
            let token: String = rand::rng()
                .random::<[u8; 16]>()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            warn!(admin_token = %token, "FLASHSALE_ADMIN_TOKEN is not set; generated this admin token for this run");
            token
        }
    }
}

/// Reads the products' stock modes into the service's board every
/// [`flashsale_app::modes::FOLLOW_INTERVAL`], apart from the fallback worker (whose probe
/// of a hanging Redis would delay it): while these reads fail, the purchase path checks
/// Redis's refusals with MariaDB (`flashsale_app::modes::FOLLOW_FRESH_MAX`). Logs when
/// the reads start and stop failing, not every failure.
async fn follow_modes(fallback: Arc<Fallback>) {
    let mut failing = false;
    loop {
        match fallback.follow().await {
            Ok(_) if failing => {
                info!("the products' stock modes are read again");
                failing = false;
            }
            Ok(_) => {}
            Err(e) if !failing => {
                warn!(error = %e, "cannot read the products' stock modes; Redis's refusals are checked with MariaDB meanwhile");
                failing = true;
            }
            Err(_) => {}
        }
        tokio::time::sleep(flashsale_app::modes::FOLLOW_INTERVAL).await;
    }
}

/// Records the live sale page's samples, one per
/// [`flashsale_app::dashboard::SAMPLE_INTERVAL`]: reads only this process's counters.
/// A tick the runtime was too busy for is not made up (the next sample covers the longer
/// interval and says how long it was).
async fn sample(sampler: Arc<Sampler>) {
    let mut ticks = tokio::time::interval(flashsale_app::dashboard::SAMPLE_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is at once: the sampler's first interval started just now.
    ticks.tick().await;
    loop {
        ticks.tick().await;
        sampler.sample(SystemClock.now());
    }
}

/// Passes lease news on to the service and wakes the gate watch whenever the
/// subscription to revocations is (re-)established: after a break, the Redis process
/// may be a new one (restarted, failed over), whose entries only a rebuild can vouch for.
struct NudgeWhenHeard {
    inner: Arc<dyn LeaseListener>,
    gate_watch: Arc<Notify>,
}

impl LeaseListener for NudgeWhenHeard {
    fn listening(&self) {
        self.inner.listening();
        self.gate_watch.notify_one();
    }

    fn deaf(&self) {
        self.inner.deaf();
    }

    fn revoked(&self, product_id: Option<ProductId>) {
        self.inner.revoked(product_id);
    }

    fn changed(&self, product_id: Option<ProductId>) {
        self.inner.changed(product_id);
    }
}

/// The purchase endpoint's per-address rate limit as configured.
fn purchase_limits(config: &Config) -> PurchaseLimits {
    PurchaseLimits {
        epoch: std::time::Instant::now(),
        per_address: config
            .ip_purchase_rate
            .map(|rate| Limiter::new(rate, limit::KEYS_MAX)),
        client_ip_header: config.client_ip_header.clone(),
    }
}

/// Connections the metrics listener keeps open at once: a few Prometheus servers scrape
/// it, each on one connection.
const METRICS_CONNECTIONS_MAX: usize = 64;

/// The API listener's bounds as configured, the connection cap fitted to the open-files
/// limit (logged).
pub fn http_settings(config: &Config) -> http::HttpSettings {
    let (connections_max, descriptors) = http::fit_connections(config.connections_max);
    if connections_max < config.connections_max {
        warn!(
            wanted = config.connections_max,
            connections_max,
            open_files_limit = descriptors,
            "FLASHSALE_CONNECTIONS_MAX lowered to fit the open-files limit"
        );
    }
    // Counted by the peer, so off behind the proxy that `client_ip_header` implies:
    // every peer is the proxy there (config/rules.rs refuses an explicit share with it).
    let connections_per_address_max = match config.connections_per_address_max {
        Some(0) => None,
        Some(n) => Some(n),
        None if config.client_ip_header.is_some() => None,
        None => Some(http::address_share(connections_max)),
    };
    let settings = http::HttpSettings {
        connections_max,
        connections_per_address_max,
        header_timeout: config.header_timeout,
        drain_timeout: http::drain_timeout(config.request_timeout),
        connect_info: config.ip_purchase_rate.is_some(),
    };
    http::announce(&settings, descriptors);
    settings
}

/// Serves until SIGTERM or Ctrl-C, then stops accepting and drains in-flight requests.
pub async fn serve(config: &Config) -> Result<(), String> {
    serve_until(config, shutdown_signal()).await
}

/// Serves until `shutdown` completes, then stops accepting and drains in-flight requests
/// (`serve`, with the stop in the caller's hands: the demo's own service stops when the
/// demo ends).
pub async fn serve_until(
    config: &Config,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    let app = build(config).await?;
    let listener =
        http::listen(config.listen).map_err(|e| format!("binding {}: {e}", config.listen))?;
    if let Some(backlog) = http::granted_backlog().filter(|&b| b < http::LISTEN_BACKLOG) {
        warn!(
            backlog,
            wanted = http::LISTEN_BACKLOG,
            "net.core.somaxconn caps the listen backlog: a burst of more connects than that \
             loses SYNs, each a 1 s wait for its client (raise it with sysctl)"
        );
    }
    // Both listeners bound before anything is announced or started.
    let metrics_listener = match config.metrics_listen {
        Some(addr) => Some(
            http::listen(addr)
                .map_err(|e| format!("binding {addr} (FLASHSALE_METRICS_LISTEN): {e}"))?,
        ),
        None => None,
    };
    let settings = http_settings(config);
    info!(listen = %config.listen, "flashsale serving");
    let metrics_server = match (metrics_listener, app.metrics_router) {
        (Some(listener), Some(router)) => {
            info!(listen = ?listener.local_addr().ok(), "metrics served on their own listener");
            let settings = http::HttpSettings {
                connections_max: METRICS_CONNECTIONS_MAX,
                connections_per_address_max: None,
                connect_info: false,
                ..settings
            };
            Some(tokio::spawn(http::serve(
                listener,
                router,
                settings,
                std::future::pending(),
            )))
        }
        (listener, router) => {
            debug_assert!(
                listener.is_none() && router.is_none(),
                "`build` makes the metrics router exactly when FLASHSALE_METRICS_LISTEN is set, \
                 as the listener above is bound"
            );
            None
        }
    };
    let workers = workers::Workers::spawn(
        app.maintenance.clone(),
        config,
        app.metrics.clone(),
        app.gate_watch.clone(),
        app.fallback.clone(),
    )
    .with_destocks(app.destocking.clone(), config.recovery_interval);
    let workers = match &app.retirement {
        Some(retirement) => workers.with_retirement(retirement.clone()),
        None => workers,
    };
    let events = start_events(config, app.metrics.clone()).await?;
    http::serve_counted(
        listener,
        app.router,
        settings,
        Some(app.metrics.clone()),
        shutdown,
    )
    .await;
    workers.stop().await;
    events.stop().await;
    // Last: the drain above is still worth watching.
    if let Some(metrics_server) = metrics_server {
        metrics_server.abort();
    }
    info!("drained; bye");
    Ok(())
}

/// What one run of the audit found, over the products it looked at.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuditTotals {
    pub products: usize,
    pub violations: usize,
    /// Findings of work in flight within its bound: reported, never failing.
    pub pending: usize,
}

/// The `audit` command's check: audits each of `ids` and writes the reports to `out` as
/// the command prints them, with the notes on what the audit cannot see, then records the
/// verdict in the ledger for the live sale page (`scope`: the one product asked for, or
/// every product). The demo runs its product's audit through here too.
pub async fn audit_products(
    maintenance: &Maintenance,
    ids: &[ProductId],
    scope: Option<ProductId>,
    out: &mut (dyn std::io::Write + Send),
) -> Result<AuditTotals, String> {
    let write = |out: &mut (dyn std::io::Write + Send), text: &str| {
        out.write_all(text.as_bytes())
            .map_err(|e| format!("writing the audit's report: {e}"))
    };
    let mut totals = AuditTotals {
        products: ids.len(),
        ..AuditTotals::default()
    };
    write(out, &format!("flashsale audit: {} product(s)\n", ids.len()))?;
    for id in ids {
        let report = maintenance.audit(*id).await.map_err(|e| e.to_string())?;
        totals.violations += report.violations.len();
        totals.pending += report.pending.len();
        write(out, &report.to_string())?;
    }
    // Work in flight within its bound is how a live sale looks: reported, never failing.
    if totals.pending > 0 {
        write(
            out,
            &format!(
                "{} finding(s) pending: work in flight within its bound\n",
                totals.pending
            ),
        )?;
    }
    write(
        out,
        "I5 (no acknowledged loss) needs the clients' record of acknowledged orders; \
         the fault tests check it. I7 is checked on the outbox side (one event per state \
         change, all delivered); consumers dedup by event id.\n",
    )?;
    // Failing to record the verdict does not change what this audit found, so it is
    // only said.
    let verdict = flashsale_app::ports::AuditVerdict {
        product: scope,
        products: totals.products,
        violations: totals.violations,
        pending: totals.pending,
    };
    if let Err(e) = maintenance.record_audit(&verdict).await {
        write(
            out,
            &format!("the verdict was not recorded in the ledger for the live sale page: {e}\n"),
        )?;
    }
    Ok(totals)
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    info!("shutdown requested; draining in-flight requests");
}
