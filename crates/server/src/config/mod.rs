//! Configuration: a TOML file (`--config`) overridden by `FLASHSALE_*` environment
//! variables, over the defaults. figment merges the layers and serde reads them
//! (`sources.rs`, `settings.rs`, with the whole numbers' bounds); the values with parsing
//! rules of their own are in `values.rs`, the durations' bounds and the rules between
//! settings in `rules.rs`. Every value is parsed and checked here, before anything
//! starts; a bad value, an unknown variable or an unknown key stops startup with a
//! message naming it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use flashsale_api::auth::BuyerAuth;
use flashsale_app::limit::Rate;

mod rules;
mod settings;
mod sources;
mod values;

use settings::{LogFormat, RateScope, Repair, Settings};
use sources::Origin;

/// Everything `serve` needs, parsed.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    /// Where `GET /metrics` is served instead of `listen` (None: on `listen`).
    pub metrics_listen: Option<SocketAddr>,
    /// One Redis (`FLASHSALE_REDIS_URL`), or a Redis Cluster when
    /// `FLASHSALE_REDIS_CLUSTER_NODES` names one.
    pub redis: flashsale_redis::Target,
    pub database_url: String,
    /// A Galera cluster to write through, one node at a time (`FLASHSALE_DATABASE_NODES`,
    /// with the user, password and database of the URL); None: the URL's node alone.
    pub database_cluster: Option<flashsale_mysql::ClusterConfig>,
    pub redis_prefix: String,
    /// The token named `admin` (`FLASHSALE_ADMIN_TOKEN`). None, with no `admin_tokens`:
    /// serve generates one and logs it once.
    pub admin_token: Option<String>,
    /// Named admin tokens (`FLASHSALE_ADMIN_TOKENS`), checked distinct from each other
    /// and from `admin_token`.
    pub admin_tokens: Vec<(flashsale_core::AdminName, String)>,
    pub payment_timeout: Duration,
    pub max_quantity_per_order: u32,
    pub redis_record_ttl: Duration,
    /// How long a sold-out product grants no hold (zero: never), see `reserve.lua`.
    pub sold_out_lease: Duration,
    pub log_json: bool,
    pub database_max_connections: u32,
    pub request_timeout: Duration,
    pub in_flight_max: usize,
    /// Most client connections open at once (lowered at startup to what the open-files
    /// limit allows).
    pub connections_max: usize,
    /// Most connections one client address holds at once, as set (None: unset, half the
    /// cap, or off behind the proxy `client_ip_header` implies; Some(0): off).
    pub connections_per_address_max: Option<usize>,
    /// A request head must arrive within this time of the connection opening or of the
    /// previous answer; an idle keep-alive connection is closed after it.
    pub header_timeout: Duration,
    pub recovery_after: Duration,
    pub expiry_interval: Duration,
    pub recovery_interval: Duration,
    pub gate_watch_interval: Duration,
    pub reconcile_interval: Duration,
    /// Whether the reconciliation worker repairs the drift it finds (`auto`) or only
    /// reports it (`report`).
    pub reconcile_repair: bool,
    /// Every product is audited once per this period, by one instance (None: `off`).
    pub audit_every: Option<Duration>,
    /// How long after its end an ended, settled sale's Redis state is retired (None:
    /// `off`, kept until the records' TTL; `after_sale.rs`).
    pub sale_retire_after: Option<Duration>,
    /// When products switch to ledger mode, and back (`flashsale_app::fallback`).
    pub fallback: flashsale_app::FallbackSettings,
    /// How long an outbox event may wait for the broker's acknowledgement before the
    /// audit calls it stuck.
    pub outbox_pending_max: Duration,
    pub strategy: flashsale_app::baseline::Strategy,
    /// NATS JetStream for events: the servers' URLs (one, or several of a cluster),
    /// subject prefix, stream name.
    pub nats_urls: Vec<String>,
    pub nats_subject_prefix: String,
    pub nats_stream: String,
    /// Copies of the stream and of its durable consumer the NATS cluster keeps.
    pub nats_stream_replicas: usize,
    /// Most events per NATS message (1 = one bare event object per message, the format
    /// before packing, for consumers that don't read arrays yet).
    pub nats_events_per_message: usize,
    /// Deliveries of a message the statistics store refuses before the consumer moves it
    /// to the dead-letter stream.
    pub events_max_deliver: u32,
    /// Purchase attempts per user (None: no limit).
    pub user_purchase_rate: Option<Rate>,
    /// Whether that limit is kept by the reserve script in Redis, per user and product
    /// for every instance at once (`shared`), rather than by each instance alone.
    pub user_purchase_rate_shared: bool,
    /// Purchase attempts per client address (None: no limit).
    pub ip_purchase_rate: Option<Rate>,
    /// The header the client's address is read from (None: the peer).
    pub client_ip_header: Option<axum::http::HeaderName>,
    /// How a buyer is known: a verified JWT, a gateway's header, or (development only)
    /// the body's `user_id`.
    pub buyer_auth: BuyerAuth,
}

#[derive(Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// Reads the optional file and the process environment.
    pub fn load(file: Option<&Path>) -> Result<Self, ConfigError> {
        let env: HashMap<String, String> = std::env::vars().collect();
        let text = match file {
            None => None,
            Some(path) => Some(std::fs::read_to_string(path).map_err(|e| {
                ConfigError(format!("reading config file {}: {e}", path.display()))
            })?),
        };
        Self::from_parts(text.as_deref(), &env)
    }

    /// A token the admin endpoints take: `admin`'s, else the first named one.
    pub fn any_admin_token(&self) -> Option<String> {
        self.admin_token
            .clone()
            .or_else(|| self.admin_tokens.first().map(|(_, token)| token.clone()))
    }

    /// Parses a config file's text (if any) and environment variables.
    pub fn from_parts(
        file: Option<&str>,
        env: &HashMap<String, String>,
    ) -> Result<Self, ConfigError> {
        let (settings, origin) = sources::read(file, env)?;
        rules::check(&settings, &origin)?;
        Self::from_settings(settings, &origin)
    }

    /// The checked settings as the rest of the server takes them. Whole numbers are
    /// narrowed from `u64` within the bounds their types (`settings.rs`) hold them to.
    fn from_settings(s: Settings, o: &Origin) -> Result<Self, ConfigError> {
        let buyer_auth = rules::buyer_auth(&s, o)?;
        Ok(Self {
            listen: s.listen.0,
            metrics_listen: s.metrics_listen.map(|m| m.0),
            redis: match s.redis_cluster_nodes {
                None => flashsale_redis::Target::Node(s.redis_url.0),
                Some(nodes) => flashsale_redis::Target::Cluster(nodes.0),
            },
            database_url: s.database_url.0,
            database_cluster: s
                .database_nodes
                .map(|nodes| flashsale_mysql::ClusterConfig {
                    nodes: nodes.0,
                    failback_after: s.database_failback_after.0,
                }),
            redis_prefix: s.redis_prefix.0,
            admin_token: s.admin_token.map(|t| t.0),
            admin_tokens: s.admin_tokens.map(|t| t.0).unwrap_or_default(),
            payment_timeout: s.payment_timeout.0,
            max_quantity_per_order: s.max_quantity_per_order.0 as u32,
            redis_record_ttl: s.redis_record_ttl.0,
            sold_out_lease: s.sold_out_lease.0,
            log_json: s.log_format == LogFormat::Json,
            database_max_connections: s.database_max_connections.0 as u32,
            request_timeout: s.request_timeout.0,
            in_flight_max: s.in_flight_max.0 as usize,
            connections_max: s.connections_max.0 as usize,
            connections_per_address_max: s.connections_per_address_max.map(|n| n.0 as usize),
            header_timeout: s.header_timeout.0,
            recovery_after: s.recovery_after.0,
            expiry_interval: s.expiry_interval.0,
            recovery_interval: s.recovery_interval.0,
            gate_watch_interval: s.gate_watch_interval.0,
            reconcile_interval: s.reconcile_interval.0,
            reconcile_repair: s.reconcile_repair == Repair::Auto,
            audit_every: s.audit_every.0,
            sale_retire_after: s.sale_retire_after.0,
            fallback: flashsale_app::FallbackSettings {
                after: s.fallback_after.0,
                recover_after: s.fallback_recover_after.0,
            },
            outbox_pending_max: s.outbox_pending_max.0,
            strategy: s.strategy.0,
            nats_urls: s.nats_url.0,
            nats_subject_prefix: s.nats_subject_prefix.0,
            nats_stream: s.nats_stream.0,
            nats_stream_replicas: s.nats_stream_replicas.0 as usize,
            nats_events_per_message: s.nats_events_per_message.0 as usize,
            events_max_deliver: s.events_max_deliver.0 as u32,
            user_purchase_rate: rules::rate(s.user_purchase_rate.0, s.user_purchase_burst.0),
            user_purchase_rate_shared: s.user_purchase_rate_scope == RateScope::Shared,
            ip_purchase_rate: rules::rate(s.ip_purchase_rate.0, s.ip_purchase_burst.0),
            client_ip_header: s.client_ip_header.map(|h| h.0),
            buyer_auth,
        })
    }
}

#[cfg(test)]
mod tests;
