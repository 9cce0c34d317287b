//! Every setting, as serde reads it from the merged layers (the defaults below, the
//! file, the environment), and the defaults with their reasons.

use serde::Deserialize;

use super::values::{
    Addr, AdminToken, AdminTokenList, Claim, Count, DatabaseNodes, DatabaseUrl, Header, NatsUrls,
    OrOff, Period, RedisNodes, RedisPrefix, RedisUrl, Strat, StreamName, SubjectPrefix,
};

/// Every key a config file may hold; each is also read from the environment variable
/// `FLASHSALE_<KEY in upper case>`, which wins over the file. A key without an entry in
/// [`DEFAULTS`] is an `Option`: unset unless given. Unknown keys are refused. A whole
/// number is read as a `u64` within the bounds its type names.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Settings {
    pub listen: Addr,
    /// Unset: the operator's endpoints are served on `listen`.
    pub metrics_listen: Option<Addr>,
    pub redis_url: RedisUrl,
    /// Unset: the one Redis of `redis_url`.
    pub redis_cluster_nodes: Option<RedisNodes>,
    pub database_url: DatabaseUrl,
    /// Unset: the URL's server alone.
    pub database_nodes: Option<DatabaseNodes>,
    pub database_failback_after: Period,
    pub redis_prefix: RedisPrefix,
    /// Unset, and no `admin_tokens`: `serve` generates one and logs it once.
    pub admin_token: Option<AdminToken>,
    /// Named admin tokens, beside `admin_token` (whose name is `admin`).
    pub admin_tokens: Option<AdminTokenList>,
    pub payment_timeout: Period,
    pub max_quantity_per_order: Count<1, MAX_QUANTITY_PER_ORDER_LIMIT>,
    pub redis_record_ttl: Period,
    pub sold_out_lease: Period,
    pub log_format: LogFormat,
    pub database_max_connections: Count<1, DATABASE_CONNECTIONS_LIMIT>,
    pub request_timeout: Period,
    pub in_flight_max: Count<1, IN_FLIGHT_LIMIT>,
    pub connections_max: Count<1, CONNECTIONS_LIMIT>,
    /// Unset: half the fitted cap (`http::address_share`), or off with
    /// `client_ip_header` (every peer is the proxy then).
    pub connections_per_address_max: Option<Count<0, CONNECTIONS_LIMIT>>,
    pub header_timeout: Period,
    pub recovery_after: Period,
    pub expiry_interval: Period,
    pub recovery_interval: Period,
    pub gate_watch_interval: Period,
    pub reconcile_interval: Period,
    pub reconcile_repair: Repair,
    pub audit_every: OrOff,
    pub sale_retire_after: OrOff,
    pub fallback_after: OrOff,
    pub fallback_recover_after: Period,
    pub outbox_pending_max: Period,
    pub strategy: Strat,
    pub nats_url: NatsUrls,
    pub nats_subject_prefix: SubjectPrefix,
    pub nats_stream: StreamName,
    pub nats_events_per_message: Count<1, EVENTS_PER_MESSAGE_MAX>,
    pub nats_stream_replicas: Count<1, STREAM_REPLICAS_MAX>,
    pub events_max_deliver: Count<1, EVENTS_MAX_DELIVER_MAX>,
    pub user_purchase_rate: Count<0, RATE_LIMIT_MAX>,
    pub user_purchase_rate_scope: RateScope,
    pub user_purchase_burst: Count<1, RATE_LIMIT_MAX>,
    pub ip_purchase_rate: Count<0, RATE_LIMIT_MAX>,
    pub ip_purchase_burst: Count<1, RATE_LIMIT_MAX>,
    /// Unset: the client's address is the connection's peer.
    pub client_ip_header: Option<Header>,
    pub buyer_auth: BuyerMode,
    /// Unset so that setting it in another mode than `header`, where it would be
    /// ignored, can be refused; `header` mode then reads `X-User-Id`.
    pub buyer_header: Option<Header>,
    pub buyer_jwt_secret: Option<String>,
    /// A PEM file's path.
    pub buyer_jwt_public_key: Option<String>,
    pub buyer_jwt_issuer: Option<Claim>,
    pub buyer_jwt_audience: Option<Claim>,
}

/// `FLASHSALE_LOG_FORMAT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum LogFormat {
    Text,
    Json,
}

/// `FLASHSALE_RECONCILE_REPAIR`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Repair {
    Auto,
    Report,
}

/// `FLASHSALE_USER_PURCHASE_RATE_SCOPE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RateScope {
    Instance,
    Shared,
}

/// `FLASHSALE_BUYER_AUTH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum BuyerMode {
    None,
    Header,
    Jwt,
}

/// Upper bound of the per-order quantity setting: orders are for a flash sale, not bulk.
const MAX_QUANTITY_PER_ORDER_LIMIT: u64 = 1000;
/// Upper bound of the pool size: on a small machine more connections only add contention.
const DATABASE_CONNECTIONS_LIMIT: u64 = 256;
/// Upper bound of concurrently handled requests.
const IN_FLIGHT_LIMIT: u64 = 1_000_000;
/// Upper bound of the connection cap: each open connection holds about 12–30 KiB
/// (docs/configuration.md, measured by `tests/it/slow_clients.rs`), so a million would
/// be 30 GB.
const CONNECTIONS_LIMIT: u64 = 1_000_000;
/// Upper bound of a rate limit's rate and burst: a million purchase attempts a second
/// from one user or address is no limit at all.
const RATE_LIMIT_MAX: u64 = 1_000_000;
/// Most deliveries `FLASHSALE_EVENTS_MAX_DELIVER` may allow a refused message: each
/// costs the store a refused transaction, and past a hundred tries a second apart (about
/// two minutes) a refusal is no passing state.
const EVENTS_MAX_DELIVER_MAX: u64 = 100;

/// `flashsale_nats::EVENTS_PER_MESSAGE_MAX`: the most events a message carries.
const EVENTS_PER_MESSAGE_MAX: u64 = flashsale_nats::EVENTS_PER_MESSAGE_MAX as u64;
/// `flashsale_nats::STREAM_REPLICAS_MAX`: the most copies a NATS cluster keeps.
const STREAM_REPLICAS_MAX: u64 = flashsale_nats::STREAM_REPLICAS_MAX as u64;

/// The default of every key that has one, as the text a user would write: the lowest
/// layer, read by the same rules as the file and the environment. Each with its reason.
pub(super) const DEFAULTS: &[(&str, &str)] = &[
    // Loopback: a fresh install serves no one but its own machine until told to.
    ("listen", "127.0.0.1:8080"),
    // Redis's own port on this machine, where scripts/services.sh starts it.
    ("redis_url", "redis://127.0.0.1:6379"),
    // MariaDB's own port on this machine, as scripts/services.sh sets it up.
    ("database_url", "mysql://root@127.0.0.1:3306/flashsale"),
    // Long enough that a node which crashes again soon after rejoining does not take the
    // writes back each time; short enough that instances started meanwhile (which pick
    // the first healthy node at once) agree with the others again within seconds.
    ("database_failback_after", "10s"),
    // Ends in Redis's usual separator, so keys read `flashsale:…`.
    ("redis_prefix", "flashsale:"),
    // Time to pay by card with a second factor; longer keeps unpaid units out of a sale
    // that is still running.
    ("payment_timeout", "15m"),
    // A flash sale's cap per order: a household's need, not a reseller's.
    ("max_quantity_per_order", "5"),
    // Far past the payment timeout, as it must be; later replays of a purchase are
    // answered from MariaDB, and each record holds its bytes in Redis until then.
    ("redis_record_ttl", "24h"),
    // Spares Redis a sold-out product's stampede, while a unit given back ends every
    // lease at once (ARCHITECTURE.md, "A sold-out product is refused without Redis").
    ("sold_out_lease", "250ms"),
    // Text for a person at a terminal; a log collector asks for json.
    ("log_format", "text"),
    // The pool serves the requests' reads and writes (the group committer, the lookup
    // workers and the event workers have connections of their own); on a small machine
    // more connections only add contention.
    ("database_max_connections", "16"),
    // A client waits about this long before it retries; past it a 503 (outcome unknown,
    // retry) tells it so instead of a longer wait.
    ("request_timeout", "10s"),
    // Room for a sale's opening burst on one instance; past it a 503 at once is better
    // than a queue that outlasts the request deadline.
    ("in_flight_max", "4096"),
    // About 300 MB of connections at most (docs/configuration.md, measured by
    // tests/it/slow_clients.rs); lowered at startup to the open-files limit.
    ("connections_max", "10000"),
    // The request deadline's length: a head slower than that is a slow client's, not a
    // buyer's.
    ("header_timeout", "10s"),
    // Three request timeouts: well past the deadline of an attempt still working on its
    // hold, which recovery must not fence.
    ("recovery_after", "30s"),
    // An expired order's units go back to the sale within a second of its deadline.
    ("expiry_interval", "1s"),
    // A crashed attempt's hold waits at most `recovery_after` and one such interval.
    ("recovery_interval", "5s"),
    // A Redis that lost its state is noticed, and rebuilt, within a second.
    ("gate_watch_interval", "1s"),
    // Drift is found within a minute; each pass reads every product from both stores,
    // too much to do every second.
    ("reconcile_interval", "60s"),
    // `auto`: a drift seen twice with the gate unchanged in between is repaired, a
    // bounded number of units a pass, each repair recorded; `report`: logged only.
    ("reconcile_repair", "auto"),
    // A sale's own audit runs when it ends; the daily one catches what no sale's end
    // covers (products without an end, damage between sales) within a day.
    ("audit_every", "24h"),
    // Ten minutes after its end a sale has long stopped selling: its last orders are
    // paid or expiring, and a retry of a late purchase or payment is answered by the
    // ledger anyway. Soon enough that a shop running sale after sale keeps in Redis
    // only the sales of the last minutes, not a year of them (the hold records' TTL).
    ("sale_retire_after", "10m"),
    // A Redis restart or failover takes a second or two; three seconds of 503s is what a
    // buyer retries through, longer loses the sale's first seconds.
    ("fallback_after", "3s"),
    // Long enough that a Redis which drops out every few seconds keeps the products in
    // ledger mode instead of making them switch back and forth.
    ("fallback_recover_after", "30s"),
    // An event waits for the relay's next round (200 ms), its backoff while NATS is down
    // (up to 5 s between tries) and, if a relay died holding it, the end of its claim
    // (30 s): a minute covers all three, and an outage of the broker longer than that is
    // worth an operator's look.
    ("outbox_pending_max", "60s"),
    // flashsale's own purchase path; the others are benchmark baselines.
    ("strategy", "flashsale"),
    // NATS's own port on this machine, where scripts/services.sh starts it.
    ("nats_url", "nats://127.0.0.1:4222"),
    // The service's name: events go to `flashsale.events.<type>`.
    ("nats_subject_prefix", "flashsale"),
    // The service's name, apart from any other service's stream on the same NATS.
    ("nats_stream", "FLASHSALE_EVENTS"),
    // The most a message carries (`flashsale_nats::EVENTS_PER_MESSAGE_MAX`): packing
    // divides the broker's work per event by the pack's size.
    ("nats_events_per_message", "128"),
    // One copy: what a single server holds; a cluster's operator asks for 3 (or 5).
    ("nats_stream_replicas", "1"),
    // `flashsale_app::consume::MAX_DELIVER_DEFAULT`: five refusals a second or more
    // apart are the store's answer to a message, not a passing state.
    ("events_max_deliver", "5"),
    // More attempts a second than a person clicks, fewer than a script sends.
    ("user_purchase_rate", "10"),
    // `instance`: each instance counts a user's attempts alone, in memory (N instances
    // let a user through at N times the rate); `shared`: the reserve script counts them
    // in Redis for every instance at once, per product.
    ("user_purchase_rate_scope", "instance"),
    // Two seconds' worth: a person's double-clicks and retries at the sale's opening.
    ("user_purchase_burst", "20"),
    // Off: behind a proxy or a NAT many buyers share one address.
    ("ip_purchase_rate", "0"),
    // Once a rate is set: the buyers behind one shared address at the sale's opening.
    ("ip_purchase_burst", "100"),
    // Nothing to set up for a first run on a laptop; `serve` warns that any user can then
    // be claimed.
    ("buyer_auth", "none"),
];
