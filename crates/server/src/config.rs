//! Configuration: a TOML file (`--config`) overridden by `FLASHSALE_*` environment
//! variables. Every value is parsed and checked here, before anything starts; a bad value
//! stops startup with a message naming the variable or key.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use flashsale_api::auth::{BuyerAuth, ExpectedClaims, JwtVerifier};
use flashsale_app::limit::Rate;

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
    /// None: serve generates one and logs it once.
    pub admin_token: Option<String>,
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

/// Every key a config file may hold, with its default; each is also read from the
/// environment variable `FLASHSALE_<KEY in upper case>`, which wins over the file.
pub const KEYS: &[(&str, Option<&str>)] = &[
    ("listen", Some("127.0.0.1:8080")),
    ("metrics_listen", None),
    ("redis_url", Some("redis://127.0.0.1:6379")),
    ("redis_cluster_nodes", None),
    (
        "database_url",
        Some("mysql://root@127.0.0.1:3306/flashsale"),
    ),
    ("database_nodes", None),
    // Long enough that a node which crashes again soon after rejoining does not take the
    // writes back each time; short enough that instances started meanwhile (which pick
    // the first healthy node at once) agree with the others again within seconds.
    ("database_failback_after", Some("10s")),
    ("redis_prefix", Some("flashsale:")),
    ("admin_token", None),
    ("payment_timeout", Some("15m")),
    ("max_quantity_per_order", Some("5")),
    ("redis_record_ttl", Some("24h")),
    ("sold_out_lease", Some("250ms")),
    ("log_format", Some("text")),
    ("database_max_connections", Some("16")),
    ("request_timeout", Some("10s")),
    ("in_flight_max", Some("4096")),
    ("connections_max", Some("10000")),
    // Unset: half the fitted cap (`http::address_share`), or off with
    // `client_ip_header` (every peer is the proxy then).
    ("connections_per_address_max", None),
    ("header_timeout", Some("10s")),
    ("recovery_after", Some("30s")),
    ("expiry_interval", Some("1s")),
    ("recovery_interval", Some("5s")),
    ("gate_watch_interval", Some("1s")),
    ("reconcile_interval", Some("60s")),
    // `auto`: a drift seen twice with the gate unchanged in between is repaired, a
    // bounded number of units a pass, each repair recorded; `report`: logged only.
    ("reconcile_repair", Some("auto")),
    // A sale's own audit runs when it ends; the daily one catches what no sale's end
    // covers (products without an end, damage between sales) within a day.
    ("audit_every", Some("24h")),
    // A Redis restart or failover takes a second or two; three seconds of 503s is what a
    // buyer retries through, longer loses the sale's first seconds.
    ("fallback_after", Some("3s")),
    // Long enough that a Redis which drops out every few seconds keeps the products in
    // ledger mode instead of making them switch back and forth.
    ("fallback_recover_after", Some("30s")),
    // An event waits for the relay's next round (200 ms), its backoff while NATS is down
    // (up to 5 s between tries) and, if a relay died holding it, the end of its claim
    // (30 s): a minute covers all three, and an outage of the broker longer than that is
    // worth an operator's look.
    ("outbox_pending_max", Some("60s")),
    ("strategy", Some("flashsale")),
    ("nats_url", Some("nats://127.0.0.1:4222")),
    ("nats_subject_prefix", Some("flashsale")),
    ("nats_stream", Some("FLASHSALE_EVENTS")),
    ("nats_events_per_message", Some("128")),
    // One copy: what a single server holds; a cluster's operator asks for 3 (or 5).
    ("nats_stream_replicas", Some("1")),
    // `flashsale_app::consume::MAX_DELIVER_DEFAULT`: five refusals a second or more
    // apart are the store's answer to a message, not a passing state.
    ("events_max_deliver", Some("5")),
    ("user_purchase_rate", Some("10")),
    // `instance`: each instance counts a user's attempts alone, in memory (N instances
    // let a user through at N times the rate); `shared`: the reserve script counts them
    // in Redis for every instance at once, per product.
    ("user_purchase_rate_scope", Some("instance")),
    ("user_purchase_burst", Some("20")),
    ("ip_purchase_rate", Some("0")),
    ("ip_purchase_burst", Some("100")),
    ("client_ip_header", None),
    ("buyer_auth", Some("none")),
    // Unset: `X-User-Id` in the header mode (unset so that setting it in another mode,
    // where it would be ignored, can be refused).
    ("buyer_header", None),
    ("buyer_jwt_secret", None),
    ("buyer_jwt_public_key", None),
    ("buyer_jwt_issuer", None),
    ("buyer_jwt_audience", None),
];

/// The header naming the buyer in the `header` mode, unless `FLASHSALE_BUYER_HEADER`
/// names another.
const BUYER_HEADER_DEFAULT: &str = "x-user-id";
/// Largest public key file read: a 4096-bit RSA key's PEM is about 800 bytes.
const PUBLIC_KEY_FILE_BYTES_MAX: u64 = 64 * 1024;
/// Shortest admin token: a guessable one would hand out the shop.
const ADMIN_TOKEN_LEN_MIN: usize = 8;

/// Upper bound of the per-order quantity setting: orders are for a flash sale, not bulk.
const MAX_QUANTITY_PER_ORDER_LIMIT: u32 = 1000;
/// Upper bound of the pool size: on a small machine more connections only add contention.
const DATABASE_CONNECTIONS_LIMIT: u32 = 256;
/// Shortest `FLASHSALE_AUDIT_EVERY`: an audit of every product reads each one's facts
/// from both stores, and more often than this it would weigh on a sale for little news.
const AUDIT_EVERY_MIN: Duration = Duration::from_secs(60);
/// Longest `FLASHSALE_AUDIT_EVERY`: a check a month apart would find a problem too late
/// to act on.
const AUDIT_EVERY_MAX: Duration = Duration::from_secs(30 * 24 * 3600);
/// Longest `FLASHSALE_DATABASE_FAILBACK_AFTER`: meanwhile an instance started after a
/// failover writes through another node than the older ones, which costs retries.
const DATABASE_FAILBACK_MAX: Duration = Duration::from_secs(3600);
/// Upper bound of concurrently handled requests.
const IN_FLIGHT_LIMIT: usize = 1_000_000;
/// Upper bound of the connection cap: each open connection holds about 12–30 KiB
/// (docs/configuration.md, measured by `tests/it/slow_clients.rs`), so a million would be 30 GB.
const CONNECTIONS_LIMIT: usize = 1_000_000;
/// Shortest `FLASHSALE_FALLBACK_AFTER`: two probes of the fallback worker, so one lost
/// probe never switches a product.
const FALLBACK_AFTER_MIN: Duration = Duration::from_millis(500);
/// Longest `FLASHSALE_FALLBACK_AFTER` and `FLASHSALE_FALLBACK_RECOVER_AFTER`: an hour of
/// a sale lost to waiting is no fallback.
const FALLBACK_MAX: Duration = Duration::from_secs(3600);
/// Longest header deadline: a slow client holds its connection this long.
const HEADER_TIMEOUT_MAX: Duration = Duration::from_secs(300);
/// Longest sold-out lease: units given back during a lease wait for its end, so a longer
/// one would hold stock back where buyers notice.
const SOLD_OUT_LEASE_MAX: Duration = Duration::from_secs(5);
/// Longest a hold record is kept in Redis: a year outlives any payment window and any
/// sale by far, and each record holds its bytes for its whole lifetime, so a slip of the
/// unit (`24000h`) is refused at startup instead of filling Redis.
const REDIS_RECORD_TTL_MAX: Duration = Duration::from_secs(365 * 24 * 3600);
/// Upper bound of a rate limit's rate and burst: a million purchase attempts a second
/// from one user or address is no limit at all.
const RATE_LIMIT_MAX: u32 = 1_000_000;
/// Longest Redis key prefix: it is repeated in every key.
const REDIS_PREFIX_LEN_MAX: usize = 64;
/// Most deliveries `FLASHSALE_EVENTS_MAX_DELIVER` may allow a refused message: each
/// costs the store a refused transaction, and past a hundred tries a second apart (about
/// two minutes) a refusal is no passing state.
const EVENTS_MAX_DELIVER_MAX: u32 = 100;
/// Longest NATS subject prefix and stream name: both are repeated in every subject or
/// API request, and JetStream stores the stream name in its file paths.
const NATS_NAME_LEN_MAX: usize = 64;

/// Whether `s` is 1..=NATS_NAME_LEN_MAX letters, digits, `_` and `-`, with single dots
/// between such tokens when `dots` (a subject prefix; never wildcards or spaces).
fn nats_name(s: &str, dots: bool) -> bool {
    let token = |t: &str| {
        !t.is_empty()
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    };
    !s.is_empty()
        && s.len() <= NATS_NAME_LEN_MAX
        && if dots {
            s.split('.').all(token)
        } else {
            token(s)
        }
}

#[derive(Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// Raw values by key, each with the name to blame when it is bad.
struct Raw(HashMap<&'static str, (String, String)>);

impl Raw {
    fn get(&self, key: &str) -> Option<(&str, &str)> {
        self.0.get(key).map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// The value of a key that has a default.
    fn value(&self, key: &str) -> (&str, &str) {
        self.get(key).unwrap_or(("", ""))
    }
}

fn invalid(name: &str, message: impl std::fmt::Display) -> ConfigError {
    ConfigError(format!("{name}: {message}"))
}

/// The refusal of a Redis record TTL not longer than the payment timeout, under the name
/// of the setting the user chose: the TTL when it was set, else the payment timeout (a
/// user who set only `FLASHSALE_PAYMENT_TIMEOUT=2y` is told about that one), with the
/// rule between the two. A hold record must outlive its order's payment window:
/// returning the stock of an unpaid order exactly once relies on the record.
fn record_outlives_payment(raw: &Raw) -> ConfigError {
    let (timeout_name, timeout) = raw.value("payment_timeout");
    let (ttl_name, ttl) = raw.value("redis_record_ttl");
    let ttl_default = KEYS.contains(&("redis_record_ttl", Some(ttl)));
    let rule = format!(
        "a purchase's hold record in Redis must outlive its order's payment window, so \
         the payment timeout must be shorter than FLASHSALE_REDIS_RECORD_TTL, which is at \
         most {}",
        humantime::format_duration(REDIS_RECORD_TTL_MAX)
    );
    if ttl_default {
        let ttl_name = ttl_name.trim_end_matches(" (config file)");
        invalid(
            timeout_name,
            format!("{timeout} is not shorter than {ttl_name} ({ttl}, its default): {rule}"),
        )
    } else {
        invalid(
            ttl_name,
            format!(
                "{ttl} is not longer than the payment timeout ({timeout_name}={timeout}): {rule}"
            ),
        )
    }
}

/// `FLASHSALE_REDIS_CLUSTER_NODES`: `host:port` seed nodes, comma-separated, at least
/// one and at most [`flashsale_redis::CLUSTER_SEEDS_MAX`].
fn cluster_nodes(value: &str) -> Result<Vec<String>, String> {
    let nodes: Vec<&str> = value.split(',').map(str::trim).collect();
    if nodes.len() > flashsale_redis::CLUSTER_SEEDS_MAX {
        return Err(format!(
            "at most {} seed nodes",
            flashsale_redis::CLUSTER_SEEDS_MAX
        ));
    }
    nodes
        .into_iter()
        .map(|node| {
            let bad = || {
                format!("{node:?} is not a node like 127.0.0.1:7000 (host:port, comma-separated)")
            };
            let (host, port) = node.rsplit_once(':').ok_or_else(bad)?;
            let host_ok = !host.is_empty()
                && host.chars().all(|c| {
                    c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '[' | ']' | ':')
                });
            match port.parse::<u16>() {
                Ok(p) if p > 0 && host_ok => Ok(node.to_owned()),
                _ => Err(bad()),
            }
        })
        .collect()
}

/// `FLASHSALE_DATABASE_NODES` (`host:port`, comma-separated) and
/// `FLASHSALE_DATABASE_FAILBACK_AFTER`, which matters only with nodes.
fn database_cluster(raw: &Raw) -> Result<Option<flashsale_mysql::ClusterConfig>, ConfigError> {
    let failback = raw.value("database_failback_after");
    let failback_after = duration(failback)?;
    if failback_after > DATABASE_FAILBACK_MAX {
        return Err(invalid(
            failback.0,
            format!(
                "must be at most {}",
                humantime::format_duration(DATABASE_FAILBACK_MAX)
            ),
        ));
    }
    let Some((name, nodes)) = raw.get("database_nodes") else {
        return Ok(None);
    };
    let nodes = flashsale_mysql::NodeAddr::parse_list(nodes).map_err(|message| {
        invalid(
            name,
            format!(
                "{message} (comma-separated, at most {})",
                flashsale_mysql::NODES_MAX
            ),
        )
    })?;
    Ok(Some(flashsale_mysql::ClusterConfig {
        nodes,
        failback_after,
    }))
}

/// `FLASHSALE_FALLBACK_AFTER` (`off`, or a duration) and
/// `FLASHSALE_FALLBACK_RECOVER_AFTER`, each within its bounds, the way back no quicker
/// than the way in (or a Redis that drops out for a moment would make the mode thrash).
fn fallback(raw: &Raw) -> Result<flashsale_app::FallbackSettings, ConfigError> {
    let bounded = |(name, value): (&str, &str), min: Duration| {
        let d = duration((name, value))?;
        if d < min || d > FALLBACK_MAX {
            return Err(invalid(
                name,
                format!(
                    "must be between {} and {}",
                    humantime::format_duration(min),
                    humantime::format_duration(FALLBACK_MAX)
                ),
            ));
        }
        Ok(d)
    };
    let after = match raw.value("fallback_after") {
        (_, v) if v.trim() == "off" => None,
        value => Some(bounded(value, FALLBACK_AFTER_MIN)?),
    };
    let recover_name = raw.value("fallback_recover_after").0;
    let recover_after = bounded(raw.value("fallback_recover_after"), FALLBACK_AFTER_MIN)?;
    if after.is_some_and(|after| recover_after < after) {
        return Err(invalid(
            recover_name,
            "must be at least FLASHSALE_FALLBACK_AFTER (the way back no quicker than the way in)",
        ));
    }
    Ok(flashsale_app::FallbackSettings {
        after,
        recover_after,
    })
}

/// `FLASHSALE_AUDIT_EVERY`: `off`, or a period between [`AUDIT_EVERY_MIN`] and
/// [`AUDIT_EVERY_MAX`].
fn audit_every((name, raw): (&str, &str)) -> Result<Option<Duration>, ConfigError> {
    if raw.trim() == "off" {
        return Ok(None);
    }
    let every = duration((name, raw))?;
    if every < AUDIT_EVERY_MIN || every > AUDIT_EVERY_MAX {
        return Err(invalid(
            name,
            format!(
                "must be off, or between {} and {}",
                humantime::format_duration(AUDIT_EVERY_MIN),
                humantime::format_duration(AUDIT_EVERY_MAX)
            ),
        ));
    }
    Ok(Some(every))
}

fn duration((name, raw): (&str, &str)) -> Result<Duration, ConfigError> {
    let d = humantime::parse_duration(raw.trim()).map_err(|e| {
        invalid(
            name,
            format!("{raw:?} is not a duration like 15m, 2s, 500ms ({e})"),
        )
    })?;
    if d.is_zero() {
        return Err(invalid(name, "must be longer than zero"));
    }
    Ok(d)
}

fn number<T>((name, raw): (&str, &str), lo: T, hi: T) -> Result<T, ConfigError>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
{
    let n: T = raw
        .trim()
        .parse()
        .map_err(|_| invalid(name, format!("{raw:?} is not a whole number")))?;
    if n < lo || n > hi {
        return Err(invalid(name, format!("must be between {lo} and {hi}")));
    }
    Ok(n)
}

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

    /// Parses a config file's text (if any) and environment variables.
    pub fn from_parts(
        file: Option<&str>,
        env: &HashMap<String, String>,
    ) -> Result<Self, ConfigError> {
        let table: toml::Table = match file {
            None => toml::Table::new(),
            Some(text) => {
                toml::from_str(text).map_err(|e| ConfigError(format!("config file: {e}")))?
            }
        };
        if let Some(unknown) = table.keys().find(|k| KEYS.iter().all(|(key, _)| key != k)) {
            return Err(ConfigError(format!(
                "config file: unknown key {unknown:?} (known: {})",
                KEYS.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
            )));
        }
        let mut raw = HashMap::new();
        for (key, default) in KEYS {
            let var = format!("FLASHSALE_{}", key.to_uppercase());
            let value = if let Some(v) = env.get(&var) {
                Some((var, v.clone()))
            } else if let Some(v) = table.get(*key) {
                let text = match v {
                    toml::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                Some((format!("{key} (config file)"), text))
            } else {
                default.map(|d| (var, d.to_owned()))
            };
            if let Some(value) = value {
                raw.insert(*key, value);
            }
        }
        Self::parse(&Raw(raw))
    }

    fn parse(raw: &Raw) -> Result<Self, ConfigError> {
        let (name, v) = raw.value("listen");
        let listen: SocketAddr = v
            .parse()
            .map_err(|_| invalid(name, format!("{v:?} is not an address like 127.0.0.1:8080")))?;
        let metrics_listen = match raw.get("metrics_listen") {
            None => None,
            Some((name, v)) => Some(v.parse::<SocketAddr>().map_err(|_| {
                invalid(name, format!("{v:?} is not an address like 127.0.0.1:9100"))
            })?),
        };
        if let Some(m) = metrics_listen {
            // The same port on the same address, or on any address when either binds
            // them all (0.0.0.0, ::): the second bind would fail after startup's work.
            let overlap =
                m.ip() == listen.ip() || m.ip().is_unspecified() || listen.ip().is_unspecified();
            if m.port() != 0 && m.port() == listen.port() && overlap {
                return Err(invalid(
                    raw.value("metrics_listen").0,
                    format!("{m} overlaps the API's listen address {listen}"),
                ));
            }
        }

        let (name, redis_url) = raw.value("redis_url");
        if !(redis_url.starts_with("redis://") || redis_url.starts_with("rediss://")) {
            return Err(invalid(name, "must start with redis:// or rediss://"));
        }
        let redis = match raw.get("redis_cluster_nodes") {
            None => flashsale_redis::Target::Node(redis_url.to_owned()),
            Some((name, nodes)) => flashsale_redis::Target::Cluster(
                cluster_nodes(nodes).map_err(|message| invalid(name, message))?,
            ),
        };
        let (name, database_url) = raw.value("database_url");
        if !database_url.starts_with("mysql://") {
            return Err(invalid(name, "must start with mysql://"));
        }
        let database_cluster = database_cluster(raw)?;
        let (name, redis_prefix) = raw.value("redis_prefix");
        if redis_prefix.contains(['{', '}', ' ']) || redis_prefix.len() > REDIS_PREFIX_LEN_MAX {
            return Err(invalid(
                name,
                format!("at most {REDIS_PREFIX_LEN_MAX} characters, without braces or spaces"),
            ));
        }
        let admin_token = match raw.get("admin_token") {
            None => None,
            // Only visible ASCII can be sent in an Authorization header as it is: a token
            // with whitespace or other characters could never be presented.
            Some((name, t))
                if t.len() < ADMIN_TOKEN_LEN_MIN || !t.bytes().all(|b| b.is_ascii_graphic()) =>
            {
                return Err(invalid(
                    name,
                    format!(
                        "must be at least {ADMIN_TOKEN_LEN_MIN} characters, visible ASCII \
                         only (no whitespace)"
                    ),
                ))
            }
            Some((_, t)) => Some(t.to_owned()),
        };
        let payment_timeout = duration(raw.value("payment_timeout"))?;
        let max_quantity_per_order = number(
            raw.value("max_quantity_per_order"),
            1,
            MAX_QUANTITY_PER_ORDER_LIMIT,
        )?;
        let redis_record_ttl = duration(raw.value("redis_record_ttl"))?;
        if redis_record_ttl > REDIS_RECORD_TTL_MAX {
            return Err(invalid(
                raw.value("redis_record_ttl").0,
                format!(
                    "must be at most {}",
                    humantime::format_duration(REDIS_RECORD_TTL_MAX)
                ),
            ));
        }
        if redis_record_ttl <= payment_timeout {
            return Err(record_outlives_payment(raw));
        }
        let sold_out_lease = match raw.value("sold_out_lease") {
            (_, "0") => Duration::ZERO,
            value => duration(value)?,
        };
        if sold_out_lease > SOLD_OUT_LEASE_MAX {
            return Err(invalid(
                raw.value("sold_out_lease").0,
                format!(
                    "must be at most {} (units given back wait for the lease's end); 0 turns \
                     sold-out leases off",
                    humantime::format_duration(SOLD_OUT_LEASE_MAX)
                ),
            ));
        }
        let (name, format) = raw.value("log_format");
        let log_json = match format {
            "text" => false,
            "json" => true,
            _ => return Err(invalid(name, "must be text or json")),
        };
        let database_max_connections = number(
            raw.value("database_max_connections"),
            1,
            DATABASE_CONNECTIONS_LIMIT,
        )?;
        let request_timeout = duration(raw.value("request_timeout"))?;
        let in_flight_max = number(raw.value("in_flight_max"), 1, IN_FLIGHT_LIMIT)?;
        let connections_max = number(raw.value("connections_max"), 1, CONNECTIONS_LIMIT)?;
        let header_timeout = duration(raw.value("header_timeout"))?;
        if header_timeout > HEADER_TIMEOUT_MAX {
            return Err(invalid(
                raw.value("header_timeout").0,
                format!(
                    "must be at most {} (a slow client holds its connection this long)",
                    humantime::format_duration(HEADER_TIMEOUT_MAX)
                ),
            ));
        }
        let recovery_after = duration(raw.value("recovery_after"))?;
        if recovery_after <= request_timeout {
            // An attempt may still be working on its hold until its deadline; recovery
            // must not fence it before then.
            return Err(invalid(
                raw.value("recovery_after").0,
                "must be longer than the request timeout",
            ));
        }
        let expiry_interval = duration(raw.value("expiry_interval"))?;
        let recovery_interval = duration(raw.value("recovery_interval"))?;
        let gate_watch_interval = duration(raw.value("gate_watch_interval"))?;
        let reconcile_interval = duration(raw.value("reconcile_interval"))?;
        let audit_every = audit_every(raw.value("audit_every"))?;
        let reconcile_repair = match raw.value("reconcile_repair") {
            (_, "auto") => true,
            (_, "report") => false,
            (name, _) => return Err(invalid(name, "must be auto or report")),
        };
        let outbox_pending_max = duration(raw.value("outbox_pending_max"))?;
        let fallback = fallback(raw)?;
        let (name, raw_strategy) = raw.value("strategy");
        let strategy = flashsale_app::baseline::Strategy::parse(raw_strategy).ok_or_else(|| {
            invalid(
                name,
                "must be flashsale, or a benchmark baseline: db-pessimistic, \
                 db-conditional, db-optimistic, redis-lock, redis-lua, http-post-ceiling",
            )
        })?;
        let (name, nats_url) = raw.value("nats_url");
        let nats_urls = flashsale_nats::server_urls(nats_url).map_err(|e| invalid(name, e))?;
        let (name, nats_subject_prefix) = raw.value("nats_subject_prefix");
        if !nats_name(nats_subject_prefix, true) {
            return Err(invalid(
                name,
                format!(
                    "at most {NATS_NAME_LEN_MAX} characters: letters, digits, _ and -, \
                     in tokens separated by single dots"
                ),
            ));
        }
        let (name, nats_stream) = raw.value("nats_stream");
        if !nats_name(nats_stream, false) {
            return Err(invalid(
                name,
                format!("at most {NATS_NAME_LEN_MAX} characters: letters, digits, _ and -"),
            ));
        }
        let nats_events_per_message = number(
            raw.value("nats_events_per_message"),
            1,
            flashsale_nats::EVENTS_PER_MESSAGE_MAX,
        )?;
        let nats_stream_replicas = number(
            raw.value("nats_stream_replicas"),
            1,
            flashsale_nats::STREAM_REPLICAS_MAX,
        )?;
        let events_max_deliver =
            number(raw.value("events_max_deliver"), 1, EVENTS_MAX_DELIVER_MAX)?;
        let user_purchase_rate = rate(raw, "user_purchase_rate", "user_purchase_burst")?;
        let user_purchase_rate_shared = match raw.value("user_purchase_rate_scope") {
            (_, "instance") => false,
            (_, "shared") => true,
            (name, _) => return Err(invalid(name, "must be instance or shared")),
        };
        let ip_purchase_rate = rate(raw, "ip_purchase_rate", "ip_purchase_burst")?;
        let client_ip_header = match raw.get("client_ip_header") {
            None => None,
            Some((name, h)) => {
                let header = axum::http::HeaderName::from_bytes(h.trim().as_bytes())
                    .map_err(|_| invalid(name, format!("{h:?} is not a header name")))?;
                if ip_purchase_rate.is_none() {
                    return Err(invalid(
                        name,
                        "is read only for the per-address limit: set FLASHSALE_IP_PURCHASE_RATE too",
                    ));
                }
                Some(header)
            }
        };
        let connections_per_address_max =
            connections_per_address_max(raw, client_ip_header.is_some())?;
        let buyer_auth = buyer_auth(raw)?;
        Ok(Self {
            listen,
            metrics_listen,
            redis,
            database_url: database_url.to_owned(),
            database_cluster,
            redis_prefix: redis_prefix.to_owned(),
            admin_token,
            payment_timeout,
            max_quantity_per_order,
            redis_record_ttl,
            sold_out_lease,
            log_json,
            database_max_connections,
            request_timeout,
            in_flight_max,
            connections_max,
            connections_per_address_max,
            header_timeout,
            recovery_after,
            expiry_interval,
            recovery_interval,
            gate_watch_interval,
            reconcile_interval,
            audit_every,
            reconcile_repair,
            fallback,
            outbox_pending_max,
            strategy,
            nats_urls,
            nats_subject_prefix: nats_subject_prefix.to_owned(),
            nats_stream: nats_stream.to_owned(),
            nats_stream_replicas,
            nats_events_per_message,
            events_max_deliver,
            user_purchase_rate,
            user_purchase_rate_shared,
            ip_purchase_rate,
            client_ip_header,
            buyer_auth,
        })
    }
}

/// The buyer authentication of `FLASHSALE_BUYER_AUTH` and the settings of its mode; a
/// setting of another mode is refused rather than silently ignored (a JWT secret set
/// while buyers go unauthenticated is a deployment that believes it is safe).
fn buyer_auth(raw: &Raw) -> Result<BuyerAuth, ConfigError> {
    let (mode_name, mode) = raw.value("buyer_auth");
    let mode_keys: &[&str] = match mode {
        "none" => &[],
        "header" => &["buyer_header"],
        "jwt" => &[
            "buyer_jwt_secret",
            "buyer_jwt_public_key",
            "buyer_jwt_issuer",
            "buyer_jwt_audience",
        ],
        _ => return Err(invalid(mode_name, "must be jwt, header or none")),
    };
    for key in [
        "buyer_header",
        "buyer_jwt_secret",
        "buyer_jwt_public_key",
        "buyer_jwt_issuer",
        "buyer_jwt_audience",
    ] {
        if let Some((name, _)) = raw.get(key) {
            if !mode_keys.contains(&key) {
                return Err(invalid(
                    name,
                    format!("is not read with FLASHSALE_BUYER_AUTH={mode}"),
                ));
            }
        }
    }
    match mode {
        "header" => {
            let (name, h) = raw
                .get("buyer_header")
                .unwrap_or(("FLASHSALE_BUYER_HEADER", BUYER_HEADER_DEFAULT));
            let header = axum::http::HeaderName::from_bytes(h.trim().as_bytes())
                .map_err(|_| invalid(name, format!("{h:?} is not a header name")))?;
            Ok(BuyerAuth::Header(header))
        }
        "jwt" => {
            let claim = |key| -> Result<Option<String>, ConfigError> {
                match raw.get(key) {
                    None => Ok(None),
                    Some((name, v)) if v.trim().is_empty() || v.trim() != v => Err(invalid(
                        name,
                        "must be non-empty, without surrounding spaces",
                    )),
                    Some((_, v)) => Ok(Some(v.to_owned())),
                }
            };
            let expected = ExpectedClaims {
                issuer: claim("buyer_jwt_issuer")?,
                audience: claim("buyer_jwt_audience")?,
            };
            let verifier = match (raw.get("buyer_jwt_secret"), raw.get("buyer_jwt_public_key")) {
                (Some((name, secret)), None) => JwtVerifier::hs256(secret.as_bytes(), &expected)
                    .map_err(|e| invalid(name, e))?,
                (None, Some((name, path))) => {
                    let pem = read_key_file(Path::new(path)).map_err(|e| invalid(name, e))?;
                    JwtVerifier::from_public_pem(&pem, &expected)
                        .map_err(|e| invalid(name, format!("{path}: {e}")))?
                }
                (Some((name, _)), Some(_)) => {
                    return Err(invalid(
                        name,
                        "give either it (HS256) or FLASHSALE_BUYER_JWT_PUBLIC_KEY (RS256, EdDSA), \
                         not both",
                    ))
                }
                (None, None) => {
                    return Err(ConfigError(
                        "FLASHSALE_BUYER_JWT_SECRET or FLASHSALE_BUYER_JWT_PUBLIC_KEY: one is \
                         needed with FLASHSALE_BUYER_AUTH=jwt"
                            .to_owned(),
                    ))
                }
            };
            Ok(BuyerAuth::Jwt(std::sync::Arc::new(verifier)))
        }
        _ => Ok(BuyerAuth::None),
    }
}

/// A key file's bytes, refused past [`PUBLIC_KEY_FILE_BYTES_MAX`].
fn read_key_file(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut pem = Vec::new();
    file.take(PUBLIC_KEY_FILE_BYTES_MAX + 1)
        .read_to_end(&mut pem)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if pem.len() as u64 > PUBLIC_KEY_FILE_BYTES_MAX {
        return Err(format!(
            "{}: larger than {PUBLIC_KEY_FILE_BYTES_MAX} bytes, no public key",
            path.display()
        ));
    }
    Ok(pem)
}

/// `FLASHSALE_CONNECTIONS_PER_ADDRESS_MAX`, if set: 0 (off) up to [`CONNECTIONS_LIMIT`].
/// It counts each connection's peer, so with a client address header (`behind_proxy`),
/// where every peer is the proxy, only 0 is taken: a share would throttle the proxy.
fn connections_per_address_max(
    raw: &Raw,
    behind_proxy: bool,
) -> Result<Option<usize>, ConfigError> {
    let Some(value) = raw.get("connections_per_address_max") else {
        return Ok(None);
    };
    let n = number(value, 0, CONNECTIONS_LIMIT)?;
    if behind_proxy && n > 0 {
        return Err(invalid(
            value.0,
            "counts connections by their peer, which with FLASHSALE_CLIENT_IP_HEADER set is \
             the proxy in front: limit each client's connections at the proxy (0 turns \
             this off)",
        ));
    }
    Ok(Some(n))
}

/// A rate limit from its two keys: attempts a second (0: no limit) and the burst.
fn rate(raw: &Raw, rate_key: &str, burst_key: &str) -> Result<Option<Rate>, ConfigError> {
    let per_second = number(raw.value(rate_key), 0, RATE_LIMIT_MAX)?;
    let burst = number(raw.value(burst_key), 1, RATE_LIMIT_MAX)?;
    Ok((per_second > 0).then_some(Rate { per_second, burst }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    // Checks the documented defaults apply when nothing is set.
    #[test]
    fn defaults() {
        let c = Config::from_parts(None, &env(&[])).expect("defaults are valid");
        assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(c.metrics_listen, None);
        // A metrics listener of its own: another port, or another address; not one the
        // API's listener overlaps (the same address and port, or an unspecified address).
        for (metrics, ok) in [
            ("127.0.0.1:9100", true),
            ("127.0.0.2:8080", true),
            ("127.0.0.1:0", true),
            ("127.0.0.1:8080", false),
            ("0.0.0.0:8080", false),
            ("[::]:8080", false),
        ] {
            let env = HashMap::from([("FLASHSALE_METRICS_LISTEN".to_owned(), metrics.to_owned())]);
            let parsed = Config::from_parts(None, &env);
            assert_eq!(parsed.is_ok(), ok, "{metrics}: {parsed:?}");
        }
        assert_eq!(
            c.redis,
            flashsale_redis::Target::Node("redis://127.0.0.1:6379".into())
        );
        let cluster = Config::from_parts(
            None,
            &env(&[(
                "FLASHSALE_REDIS_CLUSTER_NODES",
                "127.0.0.1:7000, redis-a.internal:7001",
            )]),
        )
        .expect("a cluster by its seed nodes");
        assert_eq!(
            cluster.redis,
            flashsale_redis::Target::Cluster(vec![
                "127.0.0.1:7000".into(),
                "redis-a.internal:7001".into()
            ])
        );
        assert_eq!(c.database_url, "mysql://root@127.0.0.1:3306/flashsale");
        assert_eq!(c.payment_timeout, Duration::from_secs(15 * 60));
        assert_eq!(c.max_quantity_per_order, 5);
        assert_eq!(c.redis_record_ttl, Duration::from_secs(24 * 3600));
        assert_eq!(c.admin_token, None);
        assert!(!c.log_json);
        assert_eq!(c.sold_out_lease, Duration::from_millis(250));
        let off = Config::from_parts(None, &env(&[("FLASHSALE_SOLD_OUT_LEASE", "0")]))
            .expect("0 turns leases off");
        assert_eq!(off.sold_out_lease, Duration::ZERO);
        assert_eq!(
            c.user_purchase_rate,
            Some(Rate {
                per_second: 10,
                burst: 20
            })
        );
        assert_eq!(c.ip_purchase_rate, None);
        assert_eq!(c.client_ip_header, None);
        assert_eq!(c.connections_per_address_max, None);
    }

    // Checks FLASHSALE_CONNECTIONS_PER_ADDRESS_MAX: unset by default, a number from 0
    // (off) up to the connection bound taken as given, 0 taken behind a proxy; refused,
    // naming the variable: not a number, past the bound, and a share behind a proxy
    // (FLASHSALE_CLIENT_IP_HEADER set), where it would count the proxy's connections.
    #[test]
    fn connections_per_address_settings() {
        let var = "FLASHSALE_CONNECTIONS_PER_ADDRESS_MAX";
        let proxy = [
            ("FLASHSALE_IP_PURCHASE_RATE", "50"),
            ("FLASHSALE_CLIENT_IP_HEADER", "X-Forwarded-For"),
        ];
        for (value, want) in [("0", 0), ("1", 1), ("250", 250), ("1000000", 1_000_000)] {
            let c = Config::from_parts(None, &env(&[(var, value)])).expect(value);
            assert_eq!(c.connections_per_address_max, Some(want), "{value}");
        }
        let behind = Config::from_parts(None, &env(&[proxy[0], proxy[1], (var, "0")]))
            .expect("0 behind a proxy");
        assert_eq!(behind.connections_per_address_max, Some(0));
        for pairs in [
            vec![(var, "many")],
            vec![(var, "-1")],
            vec![(var, "1000001")],
            vec![proxy[0], proxy[1], (var, "100")],
        ] {
            let err = Config::from_parts(None, &env(&pairs)).unwrap_err();
            assert!(err.0.starts_with(var), "{pairs:?}: {err}");
        }
    }

    // Checks the rate limits' settings: 0 turns one off, the burst and the header are
    // taken as given (the header in lower case), and bad values (not a number, a burst of
    // 0, past the bound, a header that is no header name, a header without the
    // per-address limit it is for) stop startup naming the variable.
    #[test]
    fn rate_limit_settings() {
        let c = Config::from_parts(
            None,
            &env(&[
                ("FLASHSALE_USER_PURCHASE_RATE", "0"),
                ("FLASHSALE_IP_PURCHASE_RATE", "50"),
                ("FLASHSALE_IP_PURCHASE_BURST", "1"),
                ("FLASHSALE_CLIENT_IP_HEADER", "X-Forwarded-For"),
            ]),
        )
        .expect("valid");
        assert_eq!(c.user_purchase_rate, None);
        assert!(!c.user_purchase_rate_shared);
        let shared = Config::from_parts(
            None,
            &env(&[("FLASHSALE_USER_PURCHASE_RATE_SCOPE", "shared")]),
        )
        .expect("valid");
        assert!(shared.user_purchase_rate_shared);
        assert!(Config::from_parts(
            None,
            &env(&[("FLASHSALE_USER_PURCHASE_RATE_SCOPE", "global")])
        )
        .is_err());
        assert_eq!(
            c.ip_purchase_rate,
            Some(Rate {
                per_second: 50,
                burst: 1
            })
        );
        assert_eq!(
            c.client_ip_header.as_ref().map(|h| h.as_str()),
            Some("x-forwarded-for")
        );
        for (var, value) in [
            ("FLASHSALE_USER_PURCHASE_RATE", "fast"),
            ("FLASHSALE_USER_PURCHASE_RATE", "-1"),
            ("FLASHSALE_USER_PURCHASE_RATE", "1000001"),
            ("FLASHSALE_USER_PURCHASE_BURST", "0"),
            ("FLASHSALE_IP_PURCHASE_BURST", "x"),
            ("FLASHSALE_CLIENT_IP_HEADER", "x forwarded"),
            ("FLASHSALE_CLIENT_IP_HEADER", "x-real-ip"),
        ] {
            let err = Config::from_parts(None, &env(&[(var, value)])).unwrap_err();
            assert!(err.0.starts_with(var), "{var}={value}: {err}");
        }
    }

    // Checks the buyer authentication settings: none by default; header mode with its
    // default and a configured header; jwt with an HS256 secret, an RS256 or Ed25519
    // public key file, issuer and audience. Refused, naming the variable: an unknown
    // mode, a short secret, a missing, private, small or damaged key file, both a secret
    // and a key, neither, a setting of another mode, a blank issuer; and an admin token
    // that is short or holds whitespace (it could never be sent).
    #[test]
    fn buyer_auth_settings() {
        let fixture =
            |name: &str| format!("{}/tests/it/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
        let secret = "0123456789abcdef0123456789abcdef";
        let c = Config::from_parts(None, &env(&[])).expect("defaults");
        assert!(c.buyer_auth.is_none());
        let header = |pairs: &[(&str, &str)]| match Config::from_parts(None, &env(pairs)) {
            Ok(Config {
                buyer_auth: BuyerAuth::Header(h),
                ..
            }) => Some(h.as_str().to_owned()),
            _ => None,
        };
        assert_eq!(
            header(&[("FLASHSALE_BUYER_AUTH", "header")]).as_deref(),
            Some("x-user-id")
        );
        assert_eq!(
            header(&[
                ("FLASHSALE_BUYER_AUTH", "header"),
                ("FLASHSALE_BUYER_HEADER", "X-Buyer")
            ])
            .as_deref(),
            Some("x-buyer")
        );
        let algorithm = |pairs: &[(&str, &str)]| match Config::from_parts(None, &env(pairs)) {
            Ok(Config {
                buyer_auth: BuyerAuth::Jwt(v),
                ..
            }) => Some(v.algorithm()),
            _ => None,
        };
        use jsonwebtoken::Algorithm;
        let (rsa, ed) = (
            fixture("buyer_rsa_public.pem"),
            fixture("buyer_ed25519_public.pem"),
        );
        for (pairs, want) in [
            (
                vec![("FLASHSALE_BUYER_JWT_SECRET", secret)],
                Algorithm::HS256,
            ),
            (
                vec![("FLASHSALE_BUYER_JWT_PUBLIC_KEY", rsa.as_str())],
                Algorithm::RS256,
            ),
            (
                vec![("FLASHSALE_BUYER_JWT_PUBLIC_KEY", ed.as_str())],
                Algorithm::EdDSA,
            ),
            (
                vec![
                    ("FLASHSALE_BUYER_JWT_SECRET", secret),
                    ("FLASHSALE_BUYER_JWT_ISSUER", "https://id.example"),
                    ("FLASHSALE_BUYER_JWT_AUDIENCE", "flashsale"),
                ],
                Algorithm::HS256,
            ),
        ] {
            let mut pairs = pairs;
            pairs.push(("FLASHSALE_BUYER_AUTH", "jwt"));
            assert_eq!(algorithm(&pairs), Some(want), "{pairs:?}");
        }
        let (private, small, missing) = (
            fixture("buyer_rsa_private.pem"),
            fixture("rsa_1024_public.pem"),
            fixture("no_such.pem"),
        );
        let readme = fixture("README.md");
        let jwt = ("FLASHSALE_BUYER_AUTH", "jwt");
        for (pairs, blamed) in [
            (
                vec![("FLASHSALE_BUYER_AUTH", "oauth")],
                "FLASHSALE_BUYER_AUTH",
            ),
            (vec![jwt], "FLASHSALE_BUYER_JWT_SECRET"),
            (
                vec![jwt, ("FLASHSALE_BUYER_JWT_SECRET", "short")],
                "FLASHSALE_BUYER_JWT_SECRET",
            ),
            (
                vec![
                    jwt,
                    ("FLASHSALE_BUYER_JWT_SECRET", secret),
                    ("FLASHSALE_BUYER_JWT_PUBLIC_KEY", rsa.as_str()),
                ],
                "FLASHSALE_BUYER_JWT_SECRET",
            ),
            (
                vec![jwt, ("FLASHSALE_BUYER_JWT_PUBLIC_KEY", private.as_str())],
                "FLASHSALE_BUYER_JWT_PUBLIC_KEY",
            ),
            (
                vec![jwt, ("FLASHSALE_BUYER_JWT_PUBLIC_KEY", small.as_str())],
                "FLASHSALE_BUYER_JWT_PUBLIC_KEY",
            ),
            (
                vec![jwt, ("FLASHSALE_BUYER_JWT_PUBLIC_KEY", missing.as_str())],
                "FLASHSALE_BUYER_JWT_PUBLIC_KEY",
            ),
            (
                vec![jwt, ("FLASHSALE_BUYER_JWT_PUBLIC_KEY", readme.as_str())],
                "FLASHSALE_BUYER_JWT_PUBLIC_KEY",
            ),
            (
                vec![
                    jwt,
                    ("FLASHSALE_BUYER_JWT_SECRET", secret),
                    ("FLASHSALE_BUYER_JWT_ISSUER", " "),
                ],
                "FLASHSALE_BUYER_JWT_ISSUER",
            ),
            (
                vec![
                    jwt,
                    ("FLASHSALE_BUYER_JWT_SECRET", secret),
                    ("FLASHSALE_BUYER_HEADER", "x-user-id"),
                ],
                "FLASHSALE_BUYER_HEADER",
            ),
            (
                vec![("FLASHSALE_BUYER_JWT_SECRET", secret)],
                "FLASHSALE_BUYER_JWT_SECRET",
            ),
            (
                vec![
                    ("FLASHSALE_BUYER_AUTH", "header"),
                    ("FLASHSALE_BUYER_JWT_AUDIENCE", "a"),
                ],
                "FLASHSALE_BUYER_JWT_AUDIENCE",
            ),
            (
                vec![
                    ("FLASHSALE_BUYER_AUTH", "header"),
                    ("FLASHSALE_BUYER_HEADER", "x user"),
                ],
                "FLASHSALE_BUYER_HEADER",
            ),
            (
                vec![("FLASHSALE_ADMIN_TOKEN", "        ")],
                "FLASHSALE_ADMIN_TOKEN",
            ),
            (
                vec![("FLASHSALE_ADMIN_TOKEN", "secret token")],
                "FLASHSALE_ADMIN_TOKEN",
            ),
            (
                vec![("FLASHSALE_ADMIN_TOKEN", "1234567")],
                "FLASHSALE_ADMIN_TOKEN",
            ),
        ] {
            let err = Config::from_parts(None, &env(&pairs)).unwrap_err();
            assert!(err.0.starts_with(blamed), "{pairs:?}: {err}");
        }
        let ok = Config::from_parts(None, &env(&[("FLASHSALE_ADMIN_TOKEN", "s3cret-t0ken")]));
        assert_eq!(
            ok.map(|c| c.admin_token),
            Ok(Some("s3cret-t0ken".to_owned()))
        );
    }

    // Checks the fallback settings: 3 s and 30 s by default, `off` turns the switch to
    // ledger mode off (the way back stays), and values out of bounds, unparsable, or a
    // way back quicker than the way in stop startup naming the variable.
    #[test]
    fn fallback_settings() {
        let c = Config::from_parts(None, &env(&[])).expect("defaults");
        assert_eq!(
            c.fallback,
            flashsale_app::FallbackSettings {
                after: Some(Duration::from_secs(3)),
                recover_after: Duration::from_secs(30),
            }
        );
        let off =
            Config::from_parts(None, &env(&[("FLASHSALE_FALLBACK_AFTER", "off")])).expect("off");
        assert_eq!(off.fallback.after, None);
        let quick = Config::from_parts(
            None,
            &env(&[
                ("FLASHSALE_FALLBACK_AFTER", "500ms"),
                ("FLASHSALE_FALLBACK_RECOVER_AFTER", "2s"),
            ]),
        )
        .expect("quick");
        assert_eq!(quick.fallback.after, Some(Duration::from_millis(500)));
        assert_eq!(quick.fallback.recover_after, Duration::from_secs(2));
        for (var, value) in [
            ("FLASHSALE_FALLBACK_AFTER", "never"),
            ("FLASHSALE_FALLBACK_AFTER", "100ms"),
            ("FLASHSALE_FALLBACK_AFTER", "2h"),
            ("FLASHSALE_FALLBACK_RECOVER_AFTER", "off"),
            ("FLASHSALE_FALLBACK_RECOVER_AFTER", "2s"),
        ] {
            let err = Config::from_parts(None, &env(&[(var, value)])).unwrap_err();
            assert!(err.0.starts_with(var), "{var}={value}: {err}");
        }
    }

    // Checks the database cluster settings: none by default (the URL's node alone), the
    // nodes in their order with the failback time (10 s by default), and node lists or
    // failback times out of bounds stopping startup naming the variable.
    #[test]
    fn database_cluster_settings() {
        let c = Config::from_parts(None, &env(&[])).expect("defaults");
        assert_eq!(c.database_cluster, None);
        let c = Config::from_parts(
            None,
            &env(&[(
                "FLASHSALE_DATABASE_NODES",
                "db-2:3306,db-1:3306,10.0.0.3:3307",
            )]),
        )
        .expect("nodes");
        let cluster = c.database_cluster.expect("a cluster");
        let nodes: Vec<String> = cluster.nodes.iter().map(ToString::to_string).collect();
        assert_eq!(nodes, ["db-2:3306", "db-1:3306", "10.0.0.3:3307"]);
        assert_eq!(cluster.failback_after, Duration::from_secs(10));
        let c = Config::from_parts(
            None,
            &env(&[
                ("FLASHSALE_DATABASE_NODES", "a:1"),
                ("FLASHSALE_DATABASE_FAILBACK_AFTER", "2m"),
            ]),
        )
        .expect("failback");
        let failback = c.database_cluster.map(|c| c.failback_after);
        assert_eq!(failback, Some(Duration::from_secs(120)));
        for (var, value) in [
            ("FLASHSALE_DATABASE_NODES", ""),
            ("FLASHSALE_DATABASE_NODES", "a"),
            ("FLASHSALE_DATABASE_NODES", "a:1,a:1"),
            ("FLASHSALE_DATABASE_NODES", "mysql://a:1"),
            ("FLASHSALE_DATABASE_FAILBACK_AFTER", "0s"),
            ("FLASHSALE_DATABASE_FAILBACK_AFTER", "2h"),
        ] {
            let err = Config::from_parts(None, &env(&[(var, value)])).unwrap_err();
            assert!(err.0.starts_with(var), "{var}={value}: {err}");
        }
    }

    // Checks the scheduled audit's period: a day by default, `off` turns it off, and a
    // period out of bounds or unparsable stops startup naming the variable; and the
    // reconciliation's repair, `auto` by default, `report` to only log.
    #[test]
    fn audit_every_settings() {
        let c = Config::from_parts(None, &env(&[])).expect("defaults");
        assert_eq!(c.audit_every, Some(Duration::from_secs(24 * 3600)));
        let off = Config::from_parts(None, &env(&[("FLASHSALE_AUDIT_EVERY", "off")]));
        assert_eq!(off.expect("off").audit_every, None);
        let hourly = Config::from_parts(None, &env(&[("FLASHSALE_AUDIT_EVERY", "1h")]));
        assert_eq!(
            hourly.expect("1h").audit_every,
            Some(Duration::from_secs(3600))
        );
        let c = Config::from_parts(None, &env(&[("FLASHSALE_RECONCILE_REPAIR", "report")]));
        assert!(!c.expect("report").reconcile_repair);
        assert!(
            Config::from_parts(None, &env(&[]))
                .expect("defaults")
                .reconcile_repair
        );
        let err =
            Config::from_parts(None, &env(&[("FLASHSALE_RECONCILE_REPAIR", "yes")])).unwrap_err();
        assert!(err.0.starts_with("FLASHSALE_RECONCILE_REPAIR"), "{err}");
        for value in ["10s", "60d", "daily", "0s"] {
            let err =
                Config::from_parts(None, &env(&[("FLASHSALE_AUDIT_EVERY", value)])).unwrap_err();
            assert!(err.0.starts_with("FLASHSALE_AUDIT_EVERY"), "{value}: {err}");
        }
    }

    // Checks that the file sets values and the environment overrides the file.
    #[test]
    fn env_overrides_file() {
        let file =
            "listen = \"127.0.0.1:9000\"\npayment_timeout = \"2s\"\nmax_quantity_per_order = 3\n";
        let c = Config::from_parts(Some(file), &env(&[("FLASHSALE_PAYMENT_TIMEOUT", "500ms")]))
            .expect("valid");
        assert_eq!(c.listen.port(), 9000);
        assert_eq!(c.max_quantity_per_order, 3);
        assert_eq!(c.payment_timeout, Duration::from_millis(500));
    }

    // Checks that each kind of bad value is refused with a message naming its source:
    // the variable when it came from the environment, the key when from the file.
    #[test]
    fn bad_values_name_their_source() {
        let cases = [
            ("FLASHSALE_PAYMENT_TIMEOUT", "soon"),
            ("FLASHSALE_PAYMENT_TIMEOUT", "0s"),
            ("FLASHSALE_MAX_QUANTITY_PER_ORDER", "0"),
            ("FLASHSALE_LISTEN", "nowhere"),
            ("FLASHSALE_REDIS_URL", "http://x"),
            ("FLASHSALE_REDIS_CLUSTER_NODES", ""),
            ("FLASHSALE_REDIS_CLUSTER_NODES", "127.0.0.1"),
            (
                "FLASHSALE_REDIS_CLUSTER_NODES",
                "127.0.0.1:7000,,127.0.0.1:7001",
            ),
            ("FLASHSALE_REDIS_CLUSTER_NODES", "redis://127.0.0.1:7000"),
            ("FLASHSALE_REDIS_CLUSTER_NODES", "127.0.0.1:0"),
            ("FLASHSALE_REDIS_CLUSTER_NODES", "127.0.0.1:70000"),
            ("FLASHSALE_DATABASE_URL", "postgres://x"),
            ("FLASHSALE_ADMIN_TOKEN", "short"),
            ("FLASHSALE_LOG_FORMAT", "xml"),
            ("FLASHSALE_REDIS_PREFIX", "a{b}"),
            ("FLASHSALE_REDIS_RECORD_TTL", "1m"),
            ("FLASHSALE_REDIS_RECORD_TTL", "366days"),
            ("FLASHSALE_SOLD_OUT_LEASE", "6s"),
            ("FLASHSALE_SOLD_OUT_LEASE", "-1"),
        ];
        for (var, value) in cases {
            let err = Config::from_parts(None, &env(&[(var, value)])).unwrap_err();
            assert!(err.0.starts_with(var), "{var}={value}: {err}");
        }
        // Each side of the rule between the payment timeout and the record TTL is told
        // under the name the user set, with the rule.
        let long = env(&[("FLASHSALE_PAYMENT_TIMEOUT", "2y")]);
        let err = Config::from_parts(None, &long).unwrap_err();
        assert!(err.0.starts_with("FLASHSALE_PAYMENT_TIMEOUT: 2y"), "{err}");
        assert!(err.0.contains("FLASHSALE_REDIS_RECORD_TTL (24h"), "{err}");
        let err = Config::from_parts(Some("payment_timeout = \"2y\""), &env(&[])).unwrap_err();
        assert!(err.0.starts_with("payment_timeout (config file)"), "{err}");
        let both = env(&[
            ("FLASHSALE_PAYMENT_TIMEOUT", "2h"),
            ("FLASHSALE_REDIS_RECORD_TTL", "1h"),
        ]);
        let err = Config::from_parts(None, &both).unwrap_err();
        assert!(err.0.starts_with("FLASHSALE_REDIS_RECORD_TTL: 1h"), "{err}");
        assert!(err.0.contains("FLASHSALE_PAYMENT_TIMEOUT=2h"), "{err}");
        let err = Config::from_parts(Some("payment_timeout = \"x\""), &env(&[])).unwrap_err();
        assert!(err.0.starts_with("payment_timeout (config file)"), "{err}");
        let err = Config::from_parts(Some("colour = 1"), &env(&[])).unwrap_err();
        assert!(err.0.contains("unknown key \"colour\""), "{err}");
    }

    // Checks the NATS settings' defaults, several servers and a replica count taken, and
    // that subject prefixes and stream names that NATS would refuse or misread
    // (wildcards, spaces, empty tokens, dots in a stream name), non-nats URLs (alone or
    // among others: the message names the bad one), events per message outside 1..=128
    // and replicas outside 1..=5 stop startup naming the variable.
    #[test]
    fn nats_settings() {
        let c = Config::from_parts(None, &env(&[])).expect("defaults are valid");
        assert_eq!(c.nats_urls, ["nats://127.0.0.1:4222"]);
        assert_eq!(c.nats_subject_prefix, "flashsale");
        assert_eq!(c.nats_stream, "FLASHSALE_EVENTS");
        assert_eq!(c.nats_events_per_message, 128);
        assert_eq!(c.nats_stream_replicas, 1);
        assert_eq!(c.events_max_deliver, 5);
        let ok = env(&[
            (
                "FLASHSALE_NATS_URL",
                "nats://10.0.0.1:4222,nats://10.0.0.2:4222",
            ),
            ("FLASHSALE_NATS_SUBJECT_PREFIX", "shop.eu-1"),
            ("FLASHSALE_NATS_STREAM", "T_1-a"),
            ("FLASHSALE_NATS_EVENTS_PER_MESSAGE", "1"),
            ("FLASHSALE_NATS_STREAM_REPLICAS", "3"),
            ("FLASHSALE_EVENTS_MAX_DELIVER", "3"),
        ]);
        let c = Config::from_parts(None, &ok).expect("valid");
        assert_eq!(
            c.nats_urls,
            ["nats://10.0.0.1:4222", "nats://10.0.0.2:4222"]
        );
        assert_eq!(c.nats_events_per_message, 1);
        assert_eq!(c.nats_stream_replicas, 3);
        assert_eq!(c.events_max_deliver, 3);
        let err = Config::from_parts(
            None,
            &env(&[("FLASHSALE_NATS_URL", "nats://a:4222,http://b:4222")]),
        )
        .unwrap_err();
        assert!(
            err.0.starts_with("FLASHSALE_NATS_URL: \"http://b:4222\""),
            "{err}"
        );
        for (var, value) in [
            ("FLASHSALE_NATS_URL", "http://x"),
            ("FLASHSALE_NATS_URL", "nats://"),
            ("FLASHSALE_NATS_URL", "nats://a:4222,"),
            ("FLASHSALE_NATS_STREAM_REPLICAS", "0"),
            ("FLASHSALE_NATS_STREAM_REPLICAS", "6"),
            ("FLASHSALE_NATS_SUBJECT_PREFIX", ""),
            ("FLASHSALE_NATS_SUBJECT_PREFIX", "a..b"),
            ("FLASHSALE_NATS_SUBJECT_PREFIX", "a.*"),
            ("FLASHSALE_NATS_SUBJECT_PREFIX", "a >"),
            ("FLASHSALE_NATS_STREAM", "A.B"),
            ("FLASHSALE_NATS_STREAM", ""),
            ("FLASHSALE_NATS_EVENTS_PER_MESSAGE", "0"),
            ("FLASHSALE_NATS_EVENTS_PER_MESSAGE", "129"),
            ("FLASHSALE_NATS_EVENTS_PER_MESSAGE", "many"),
            ("FLASHSALE_EVENTS_MAX_DELIVER", "0"),
            ("FLASHSALE_EVENTS_MAX_DELIVER", "101"),
        ] {
            let err = Config::from_parts(None, &env(&[(var, value)])).unwrap_err();
            assert!(err.0.starts_with(var), "{var}={value}: {err}");
        }
    }
}
