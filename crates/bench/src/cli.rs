//! The command line and the scenarios' sizes.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgGroup, Parser, ValueEnum};

/// Most users a run may simulate: user ids are scrambled with 64-bit arithmetic that
/// must not overflow (see `Workload::user_of`).
const USERS_MAX: u64 = 1 << 32;
/// Most attempts per run: 100 million, hours at any realistic rate.
const ATTEMPTS_MAX: u64 = 100_000_000;
/// Longest load allowed: an hour, far longer than a sale's rush or a benchmark's round.
const DURATION_MAX: Duration = Duration::from_secs(crate::stats::RUN_SECONDS_MAX);
/// Most concurrent connections / requests in flight: beyond this the client's sockets
/// and the 2-core box are the bottleneck, not the server.
const CONCURRENCY_MAX: u64 = 16_384;
/// Most servers one run may spread its load over (`--base-url` given several times, or
/// `--instances`): a flash sale served by a handful of instances is the case studied; each
/// target has its own connection pool and its own row in the report.
pub const TARGETS_MAX: usize = 16;
/// At most this many `--rounds`: a rush comparison round takes about two and a half
/// minutes, so nine are over twenty minutes; more rounds narrow a median little further.
pub const ROUNDS_MAX: u32 = 9;
/// The server setting that selects the purchase strategy (a benchmark baseline or
/// flashsale's own path).
pub const STRATEGY_ENV: &str = "FLASHSALE_STRATEGY";
/// The server settings of buyer authentication, which --buyer-jwt-secret sets for a
/// spawned server.
pub const BUYER_AUTH_ENV: &str = "FLASHSALE_BUYER_AUTH";
pub const BUYER_SECRET_ENV: &str = "FLASHSALE_BUYER_JWT_SECRET";
/// The folder of the HTML reports written without `--html`, in the temporary directory.
pub const REPORTS_DIR: &str = "flashsale-bench";
/// The label of the HTTP-ceiling run (`--ceiling`, and the first row of `--compare`).
pub const CEILING_LABEL: &str = "http-ceiling";
/// The label of `--compare`'s second HTTP-ceiling run, after every strategy's.
pub const CEILING_AGAIN_LABEL: &str = "http-ceiling-again";
/// The label of the bare SQL run (`--sql`, and a row of `--compare`): db-conditional's
/// transaction called by the bench straight on MariaDB, no HTTP and no server.
pub const SQL_LABEL: &str = "sql-conditional";
/// What `--compare-galera` appends to the label of a row served by the Galera cluster
/// (`flashsale@galera`); the same strategy's row on one node keeps the plain name.
pub const GALERA_SUFFIX: &str = "@galera";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// 1,000 units, 200,000 attempts from 50,000 users: almost all rejected.
    Rush,
    /// More stock than attempts: every new request becomes an order.
    Sustained,
    /// Orders paid, cancelled and left to expire while the sale runs.
    Mixed,
}

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Rush => "rush",
            Scenario::Sustained => "sustained",
            Scenario::Mixed => "mixed",
        }
    }
}

/// What the server serves `POST /v1/purchases` with (`FLASHSALE_STRATEGY`), by the name
/// the server takes. The bench only names a strategy to the server, so a strategy here
/// is its name, one of [`Strategy::ALL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strategy(&'static str);

impl Strategy {
    /// flashsale's own path: Redis hold + durable reservation, every guarantee.
    pub const FLASHSALE: Strategy = Strategy("flashsale");
    /// Baseline: `SELECT … FOR UPDATE` on the stock row per attempt.
    pub const DB_PESSIMISTIC: Strategy = Strategy("db-pessimistic");
    /// Baseline: conditional `UPDATE … WHERE available_stock >= q` per attempt.
    pub const DB_CONDITIONAL: Strategy = Strategy("db-conditional");
    /// Baseline: a version read, then `UPDATE … WHERE version = v AND available_stock >=
    /// q` with the order, retried on conflict (bounded).
    pub const DB_OPTIMISTIC: Strategy = Strategy("db-optimistic");
    /// Baseline: a per-product Redis lock (`SET NX PX`, released by token) around the
    /// database deduction and the order.
    pub const REDIS_LOCK: Strategy = Strategy("redis-lock");
    /// Baseline: the seeds' Lua check-and-decrement in Redis, then an order insert.
    pub const REDIS_LUA: Strategy = Strategy("redis-lua");
    /// Not a strategy: every purchase parsed and answered `sold_out` with no store
    /// touched — the HTTP ceiling of the purchase endpoint (a POST with a JSON body).
    pub const HTTP_POST_CEILING: Strategy = Strategy("http-post-ceiling");

    pub const ALL: [Strategy; 7] = [
        Strategy::FLASHSALE,
        Strategy::DB_PESSIMISTIC,
        Strategy::DB_CONDITIONAL,
        Strategy::DB_OPTIMISTIC,
        Strategy::REDIS_LOCK,
        Strategy::REDIS_LUA,
        Strategy::HTTP_POST_CEILING,
    ];

    /// The name the server's `FLASHSALE_STRATEGY` takes.
    pub fn name(self) -> &'static str {
        self.0
    }

    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == raw)
    }

    /// A benchmark baseline: writes no reservation rows and no Redis holds, so the
    /// checks built on them (and `flashsale audit`) do not apply.
    pub fn is_baseline(self) -> bool {
        self != Strategy::FLASHSALE
    }
}

/// What the load sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Purchase attempts (`POST /v1/purchases`).
    Purchase,
    /// The HTTP ceiling: `GET /healthz`, which touches no store.
    Healthz,
    /// The floor of the database strategies: each purchase attempt one `CALL
    /// baseline_conditional(…)` sent by the bench itself on a connection of its own to the
    /// server's database (`sql.rs`), with no HTTP and no server in between.
    Sql,
}

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Purchase => "purchase",
            Target::Healthz => "healthz",
            Target::Sql => "sql",
        }
    }
}

/// One run of the bench: a single run, or one row of `--compare`.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSpec {
    /// The row's name: the strategy, `http-ceiling` or `sql-conditional`.
    pub label: String,
    pub target: Target,
    /// The purchase strategy (None for the ceiling, which sends no purchase): the spawned
    /// server's, or for the SQL run the strategy whose transaction it calls (its server
    /// only creates the product and is stopped before the load).
    pub strategy: Option<Strategy>,
    /// The settings for a spawned server (the user's --server-env, plus the strategy).
    pub server_env: Vec<(String, String)>,
    /// Where a spawned server's log goes.
    pub server_log: Option<PathBuf>,
    /// Where a spawned server's ledger lives.
    pub database: Database,
}

/// Where a spawned server's ledger lives (`--galera`, `--compare-galera`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Database {
    /// A fresh database on the server of `--database-url` (the shared MariaDB by default).
    #[default]
    Given,
    /// A fresh database on a private MariaDB the bench starts with the Galera nodes' own
    /// InnoDB settings: the one node a Galera row is measured against.
    OneNode,
    /// A fresh database on a private 3-node Galera cluster the bench starts; the server
    /// writes through node 0 (`FLASHSALE_DATABASE_NODES` names the three).
    Galera,
}

impl Database {
    /// How the reports name it; None for the server of `--database-url`.
    pub fn name(self) -> Option<&'static str> {
        match self {
            Database::Given => None,
            Database::OneNode => Some("one node"),
            Database::Galera => Some("galera"),
        }
    }
}

/// flashsale-bench — a load generator for a running flashsale server (or one it starts
/// with --spawn): drives a scenario, measures latency, throughput and cost per order,
/// then audits the invariants and fails on any violation.
#[derive(Debug, Parser)]
#[command(version, about)]
#[command(group(ArgGroup::new("comparison").args(["compare", "compare_galera"])))]
pub struct Args {
    /// The scenario.
    #[arg(value_enum)]
    pub scenario: Scenario,

    /// Small sizes: every scenario finishes in well under a minute.
    #[arg(long)]
    pub quick: bool,

    // --- the server ---
    /// Start `<server-bin> serve` on a free port with a fresh database and Redis prefix,
    /// and stop it and drop them at the end.
    #[arg(long)]
    pub spawn: bool,
    /// With --spawn: start this many servers on the same fresh database, Redis prefix and
    /// NATS stream, each on its own port with its own log (--server-log PATH becomes
    /// PATH.1, PATH.2, …), and spread the load over them as over several --base-url.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        requires = "spawn",
        conflicts_with_all = ["compare", "compare_galera", "outage"]
    )]
    pub instances: u32,
    /// The flashsale binary, for --spawn and for the audit.
    #[arg(long, value_name = "PATH", default_value = "target/release/flashsale")]
    pub server_bin: PathBuf,
    /// The server to drive, as http://host:port (ignored with --spawn). Repeat the flag
    /// for several instances of one sale (one URL per flag, no comma-separated lists):
    /// the load is dealt round-robin over them — closed loop by connection, open loop by
    /// attempt — and the report counts each one's attempts and outcomes. The product is
    /// created through the first one.
    #[arg(
        long = "base-url",
        value_name = "URL",
        default_value = "http://127.0.0.1:8080",
        value_parser = parse_base_url
    )]
    pub base_urls: Vec<String>,
    /// The server's admin token (ignored with --spawn).
    #[arg(long, env = "FLASHSALE_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// The HS256 secret of a server that authenticates buyers
    /// (`FLASHSALE_BUYER_AUTH=jwt`): each user's requests carry a bearer token signed with
    /// it, all minted before the load. With --spawn, the server is started with it.
    #[arg(
        long,
        value_name = "SECRET",
        env = "FLASHSALE_BUYER_JWT_SECRET",
        hide_env_values = true
    )]
    pub buyer_jwt_secret: Option<String>,
    /// The server's MariaDB (for the audit and the commit counters); with --spawn, the
    /// server that hosts the fresh database.
    #[arg(
        long,
        env = "FLASHSALE_DATABASE_URL",
        default_value = "mysql://root@127.0.0.1:3306/flashsale"
    )]
    pub database_url: String,
    /// The server's Redis.
    #[arg(
        long,
        env = "FLASHSALE_REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    pub redis_url: String,
    /// The server's Redis Cluster, as `host:port` seed nodes, comma-separated (e.g.
    /// what `scripts/cluster.sh start` prints): used instead of --redis-url by the
    /// bench's Redis figures (summed over the primaries), by the audit and, with
    /// --spawn, by the spawned servers and the cleanup of their keys.
    #[arg(
        long,
        value_name = "HOST:PORT,…",
        env = "FLASHSALE_REDIS_CLUSTER_NODES",
        conflicts_with = "outage"
    )]
    pub redis_cluster_nodes: Option<String>,
    /// The server's Redis key prefix (ignored with --spawn, which uses a fresh one).
    #[arg(long, env = "FLASHSALE_REDIS_PREFIX", default_value = "flashsale:")]
    pub redis_prefix: String,
    /// NATS for a spawned server (its own stream and subjects are used and deleted).
    #[arg(
        long,
        env = "FLASHSALE_NATS_URL",
        default_value = "nats://127.0.0.1:4222"
    )]
    pub nats_url: String,
    /// The pid of a server not spawned by the bench, to read its memory from /proc.
    #[arg(long, value_name = "PID")]
    pub server_pid: Option<u32>,
    /// Extra setting for a spawned server, e.g. FLASHSALE_DATABASE_MAX_CONNECTIONS=32
    /// (repeatable).
    #[arg(long, value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub server_env: Vec<(String, String)>,
    /// RUST_LOG of a spawned server.
    #[arg(long, value_name = "FILTER", default_value = "warn")]
    pub server_log_level: String,
    /// Where a spawned server's log goes (default: a temporary file, removed at the end
    /// unless the server failed to start).
    #[arg(long, value_name = "PATH")]
    pub server_log: Option<PathBuf>,
    /// Keep a spawned server's database, Redis keys and NATS stream.
    #[arg(long)]
    pub keep: bool,

    // --- how the load is driven ---
    /// Open loop: attempts per second on a fixed timeline (latency counted from each
    /// attempt's intended send time). Without it the load is closed-loop.
    #[arg(long, value_name = "N")]
    pub rate: Option<f64>,
    /// Closed loop: connections, each sending as soon as its answer arrived.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub connections: u64,
    /// The SQL run (--sql, and --compare's sql-conditional row): MariaDB connections
    /// calling the procedure at once, each a client of its own (default: --connections,
    /// at most 16; see `sql::CLIENTS_MAX`).
    #[arg(long, value_name = "N")]
    pub sql_clients: Option<u64>,
    /// Open loop: most requests in flight; attempts due beyond it are dropped and counted.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub max_in_flight: u64,
    /// Most purchase attempts (default: the scenario's).
    #[arg(long, value_name = "N")]
    pub attempts: Option<u64>,
    /// Longest the load may run, e.g. 30s or 5m (default: 10m, quick 40s).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,

    // --- the workload ---
    /// Distinct users (default: the scenario's).
    #[arg(long, value_name = "N")]
    pub users: Option<u64>,
    /// Units on sale (default: the scenario's).
    #[arg(long, value_name = "N")]
    pub stock: Option<i64>,
    /// Units one user may buy (0: no limit; default 1 for rush, none otherwise).
    #[arg(long, value_name = "N")]
    pub per_user_limit: Option<i64>,
    /// Share of attempts that re-send an earlier, recent request_id (concurrent
    /// duplicates).
    #[arg(long, value_name = "SHARE", default_value_t = 0.1)]
    pub retry_share: f64,
    /// Mixed: share of new orders paid at once.
    #[arg(long, value_name = "SHARE", default_value_t = 0.5)]
    pub pay_share: f64,
    /// Mixed: share of new orders cancelled at once (the rest are left to expire).
    #[arg(long, value_name = "SHARE", default_value_t = 0.2)]
    pub cancel_share: f64,
    /// Mixed: the server's payment timeout. With --spawn it is set on the server
    /// (default 3s, quick 2s); otherwise it tells the bench how long to wait before
    /// checking that unpaid orders expired (without it that check is skipped).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    pub payment_timeout: Option<Duration>,
    /// The product to create (default: 1 with --spawn, else a random id).
    #[arg(long, value_name = "ID")]
    pub product_id: Option<i64>,
    /// Seed of the workload (which attempts are retries, users, follow-ups).
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,

    // --- output ---
    /// Write the result as JSON.
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Write the HTML report with plots here (default: flashsale-bench/<scenario>-<UTC
    /// time>.html in the temporary directory; the path is printed).
    #[arg(long, value_name = "PATH", conflicts_with = "no_html")]
    pub html: Option<PathBuf>,
    /// Write no HTML report.
    #[arg(long)]
    pub no_html: bool,
    /// Skip the audit at the end (the client-side checks still run).
    #[arg(long)]
    pub no_audit: bool,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,

    // --- side by side ---
    /// HTTP ceiling: send `GET /healthz` (answered without touching any store) instead of
    /// purchase attempts, with the same generator, mode and connections; no product is
    /// created, no order checked, no cost per order measured.
    #[arg(long, conflicts_with = "compare")]
    pub ceiling: bool,
    /// The bare SQL transaction (needs --spawn; rush or sustained): the spawned server
    /// creates the product and is stopped, then the bench itself calls db-conditional's
    /// stored procedure (`CALL baseline_conditional`) on the server's database for every
    /// attempt, closed loop, on --sql-clients connections: the floor under every database
    /// strategy, with no HTTP and no server.
    #[arg(long, requires = "spawn", conflicts_with_all = ["compare", "ceiling", "rate"])]
    pub sql: bool,
    /// Side by side in one run (needs --spawn; rush or sustained): the HTTP ceiling,
    /// http-post-ceiling (purchases parsed and refused, no store touched),
    /// sql-conditional (the bare SQL transaction, as --sql), db-pessimistic,
    /// db-conditional, db-optimistic, redis-lock, redis-lua, flashsale and the ceiling
    /// again one after the other,
    /// each on its own freshly spawned server (FLASHSALE_STRATEGY) with the same sizes,
    /// mode and seed, then one comparison table (and --json / --html of it); ratios to the
    /// ceiling use the higher of its two runs. Exit status 1 only if the flashsale run has
    /// a violation.
    #[arg(long, requires = "spawn")]
    pub compare: bool,
    /// With --compare: run all its rows this many times, interleaved (round 1's rows, then
    /// round 2's, …), and tabulate the median of each figure and of each round's own
    /// ratios (with their range): a box whose speed drifts during a run moves one round's
    /// ratios, not the medians. Every round's own table is printed too.
    #[arg(long, default_value_t = 1, requires = "comparison")]
    pub rounds: u32,

    // --- a Galera cluster ---
    /// With --spawn: the server's ledger on a private 3-node MariaDB Galera cluster the
    /// bench starts (and removes at the end), its fresh database created through node 0;
    /// the server gets FLASHSALE_DATABASE_NODES (the three nodes) and a
    /// FLASHSALE_DATABASE_URL on node 0, and so does the audit. The report adds each
    /// node's CPU time and the writer's `wsrep_` counters over the load. With --compare,
    /// every row runs on the cluster.
    #[arg(long, requires = "spawn", conflicts_with_all = ["outage", "keep", "compare_galera"])]
    pub galera: bool,
    /// Side by side (needs --spawn; rush or sustained): flashsale and db-conditional
    /// (one commit per purchase: what flashsale's group commit saves) each on one private
    /// MariaDB and on a private 3-node Galera cluster, both started by the bench with the
    /// same InnoDB settings, one after the other (--rounds: interleaved); the table adds
    /// each row's ratio to the same strategy on one node, CPU per order of every node and
    /// the writer's `wsrep_` counters.
    #[arg(long, requires = "spawn", conflicts_with_all = ["outage", "keep", "ceiling", "sql"])]
    pub compare_galera: bool,

    // --- a Redis outage ---
    /// A sale through a Redis outage (needs --spawn; sustained): the server gets a private
    /// redis-server, which is killed with SIGKILL after a phase of sales through Redis and
    /// restarted empty after a phase in ledger mode; prints durable orders/s through Redis,
    /// in ledger mode and through Redis again, the time from Redis's death to the first
    /// order from MariaDB and from its restart to gate mode, then audits.
    #[arg(long, requires = "spawn", conflicts_with_all = ["compare", "ceiling"])]
    pub outage: bool,
    /// With --outage: how long each phase of sales runs (default 10s, quick 5s).
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration, requires = "outage")]
    pub outage_phase: Option<Duration>,
}

/// One `--base-url`: a plain `http://host:port` root, returned without a trailing `/`.
fn parse_base_url(s: &str) -> Result<String, String> {
    if s.contains(',') {
        return Err(format!(
            "{s:?}: one URL per --base-url; repeat the flag for several servers"
        ));
    }
    crate::http::parse_base_url(s)
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))?;
    if k.is_empty() {
        return Err(format!("empty key in {s:?}"));
    }
    Ok((k.to_owned(), v.to_owned()))
}

/// One row of `--compare`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Row {
    /// `GET /healthz` (`http-ceiling`, and `http-ceiling-again` when last).
    Ceiling,
    /// Purchases served by a spawned server with this strategy.
    Purchase(Strategy),
    /// The bare SQL transaction (`sql-conditional`, `Target::Sql`).
    Sql,
}

/// The order of `--compare`'s rows: the yardsticks first — the ceiling, the purchase
/// endpoint's own ceiling (`http-post-ceiling`) and the bare SQL transaction
/// (`sql-conditional`) —, the baselines from the slowest expected to the fastest,
/// flashsale, and the ceiling once more at the end. The ratios to the ceiling use the
/// higher of its two runs: a ceiling measured while the box was still busy (a database
/// flushing what the run before wrote) must not flatter the rest.
pub const COMPARE_ROWS: [Row; 10] = [
    Row::Ceiling,
    Row::Purchase(Strategy::HTTP_POST_CEILING),
    Row::Sql,
    Row::Purchase(Strategy::DB_PESSIMISTIC),
    Row::Purchase(Strategy::DB_CONDITIONAL),
    Row::Purchase(Strategy::DB_OPTIMISTIC),
    Row::Purchase(Strategy::REDIS_LOCK),
    Row::Purchase(Strategy::REDIS_LUA),
    Row::Purchase(Strategy::FLASHSALE),
    Row::Ceiling,
];

/// The rows of `--compare-galera`, each strategy on one node and then on the cluster, so
/// that the two runs the ratio divides are neighbours in time: flashsale, whose group
/// commit pays the replication once per batch, and db-conditional, whose every purchase
/// is a transaction of its own (a commit, and on Galera a replication, each): the nearest
/// thing to flashsale without group commit that needs no build of its own.
pub const GALERA_ROWS: [(Strategy, Database); 4] = [
    (Strategy::FLASHSALE, Database::OneNode),
    (Strategy::FLASHSALE, Database::Galera),
    (Strategy::DB_CONDITIONAL, Database::OneNode),
    (Strategy::DB_CONDITIONAL, Database::Galera),
];

/// The sizes of one run, after the scenario's defaults and the flags.
#[derive(Debug, Clone, PartialEq)]
pub struct Sizes {
    pub stock: i64,
    pub attempts: u64,
    pub users: u64,
    pub per_user_limit: Option<i64>,
    pub duration: Duration,
    pub follow_ups: bool,
    pub payment_timeout: Option<Duration>,
}

/// Every scenario's default sizes, full and quick.
pub fn defaults(scenario: Scenario, quick: bool) -> Sizes {
    let (stock, attempts, users) = match (scenario, quick) {
        (Scenario::Rush, false) => (1000, 200_000, 50_000),
        (Scenario::Rush, true) => (100, 4000, 1500),
        (Scenario::Sustained, false) => (250_000, 200_000, 50_000),
        (Scenario::Sustained, true) => (5000, 4000, 1500),
        (Scenario::Mixed, false) => (10_000, 50_000, 10_000),
        (Scenario::Mixed, true) => (600, 3000, 1000),
    };
    Sizes {
        stock,
        attempts,
        users,
        per_user_limit: (scenario == Scenario::Rush).then_some(1),
        duration: if quick {
            Duration::from_secs(40)
        } else {
            Duration::from_secs(600)
        },
        follow_ups: scenario == Scenario::Mixed,
        payment_timeout: (scenario == Scenario::Mixed).then(|| {
            if quick {
                Duration::from_secs(2)
            } else {
                Duration::from_secs(3)
            }
        }),
    }
}

fn share(name: &str, v: f64, max: f64) -> Result<(), String> {
    if (0.0..=max).contains(&v) {
        Ok(())
    } else {
        Err(format!("{name} must be between 0 and {max}, got {v}"))
    }
}

impl Args {
    /// Where the HTML report goes: `--html`, else [`REPORTS_DIR`] in the temporary
    /// directory, named after the scenario and the time (UTC) so that runs never overwrite
    /// each other; None with `--no-html`.
    pub fn html_path(&self, started: chrono::DateTime<chrono::Utc>) -> Option<PathBuf> {
        if self.no_html {
            return None;
        }
        let default = || {
            std::env::temp_dir().join(REPORTS_DIR).join(format!(
                "{}-{}.html",
                self.scenario.name(),
                started.format("%Y%m%dT%H%M%SZ")
            ))
        };
        Some(self.html.clone().unwrap_or_else(default))
    }

    /// The run's sizes, with the flags checked.
    pub fn sizes(&self) -> Result<Sizes, String> {
        let mut s = defaults(self.scenario, self.quick);
        if let Some(v) = self.stock {
            s.stock = v;
        }
        if let Some(v) = self.attempts {
            s.attempts = v;
        }
        if let Some(v) = self.users {
            s.users = v;
        }
        if let Some(v) = self.per_user_limit {
            s.per_user_limit = (v > 0).then_some(v);
        }
        if let Some(v) = self.duration {
            s.duration = v;
        }
        if self.payment_timeout.is_some() {
            s.payment_timeout = self.payment_timeout;
        } else if !self.spawn {
            // Not ours to set: unknown unless told.
            s.payment_timeout = None;
        }
        if s.stock < 1 {
            return Err("--stock must be at least 1".into());
        }
        if !(1..=ATTEMPTS_MAX).contains(&s.attempts) {
            return Err(format!("--attempts must be 1..={ATTEMPTS_MAX}"));
        }
        if !(1..=USERS_MAX).contains(&s.users) {
            return Err(format!("--users must be 1..={USERS_MAX}"));
        }
        if s.duration.is_zero() || s.duration > DURATION_MAX {
            return Err(format!(
                "--duration must be above 0 and at most {DURATION_MAX:?}"
            ));
        }
        if !(1..=CONCURRENCY_MAX).contains(&self.connections) {
            return Err(format!("--connections must be 1..={CONCURRENCY_MAX}"));
        }
        self.check_targets()?;
        if !(1..=CONCURRENCY_MAX).contains(&self.max_in_flight) {
            return Err(format!("--max-in-flight must be 1..={CONCURRENCY_MAX}"));
        }
        if let Some(rate) = self.rate {
            if !(rate.is_finite() && rate > 0.0) {
                return Err(format!("--rate must be a positive number, got {rate}"));
            }
        }
        // Above 0.9 nearly every attempt is a duplicate and chains get long.
        share("--retry-share", self.retry_share, 0.9)?;
        share("--pay-share", self.pay_share, 1.0)?;
        share("--cancel-share", self.cancel_share, 1.0)?;
        share(
            "--pay-share + --cancel-share",
            self.pay_share + self.cancel_share,
            1.0,
        )?;
        if let Some(id) = self.product_id {
            if id < 1 {
                return Err("--product-id must be positive".into());
            }
        }
        let strategy = self.strategy()?;
        if !(1..=ROUNDS_MAX).contains(&self.rounds) {
            return Err(format!("--rounds must be 1..={ROUNDS_MAX}"));
        }
        if self.compare || self.compare_galera {
            let flag = if self.compare {
                "--compare"
            } else {
                "--compare-galera"
            };
            if self.server_env.iter().any(|(k, _)| k == STRATEGY_ENV) {
                return Err(format!(
                    "{flag} sets {STRATEGY_ENV} for each run itself; leave it out of --server-env"
                ));
            }
            if self.scenario == Scenario::Mixed {
                return Err(format!(
                    "{flag} runs rush or sustained: the baselines serve only purchases (no pay, cancel or expiry), so mixed cannot be compared"
                ));
            }
        } else if strategy.is_baseline() && self.scenario == Scenario::Mixed && !self.ceiling {
            return Err(format!(
                "--server-env {STRATEGY_ENV}={}: the baselines serve only purchases (no pay, cancel or expiry); use rush or sustained",
                strategy.name()
            ));
        }
        if self.sql && self.scenario == Scenario::Mixed {
            return Err(
                "--sql runs rush or sustained: it sends purchases only (no pay, cancel or expiry)"
                    .into(),
            );
        }
        if let Some(n) = self.sql_clients {
            if !(1..=CONCURRENCY_MAX).contains(&n) {
                return Err(format!("--sql-clients must be 1..={CONCURRENCY_MAX}"));
            }
        }
        Ok(s)
    }

    /// How many servers the load is spread over: --instances with --spawn, else the
    /// --base-url count.
    pub fn targets(&self) -> usize {
        if self.spawn {
            usize::try_from(self.instances).unwrap_or(usize::MAX)
        } else {
            self.base_urls.len()
        }
    }

    /// --base-url and --instances: at least one server and at most `TARGETS_MAX`, no
    /// URL twice (its server would get a double share, and two rows of the report would
    /// count the same answers), and in the closed loop a connection for each.
    fn check_targets(&self) -> Result<(), String> {
        let flag = if self.spawn {
            "--instances"
        } else {
            "--base-url"
        };
        let targets = self.targets();
        if !(1..=TARGETS_MAX).contains(&targets) {
            return Err(format!(
                "{flag}: between 1 and {TARGETS_MAX} servers, got {targets}"
            ));
        }
        if !self.spawn {
            for (i, url) in self.base_urls.iter().enumerate() {
                if self.base_urls[..i].contains(url) {
                    return Err(format!("--base-url {url} is given twice"));
                }
            }
        }
        if self.rate.is_none() && self.connections < targets as u64 {
            return Err(format!(
                "--connections {} is fewer than the {targets} servers ({flag}): each needs a connection of its own",
                self.connections
            ));
        }
        Ok(())
    }

    /// The strategy of a spawned server, from `--server-env FLASHSALE_STRATEGY=…` (the
    /// last one wins, as for the server itself); flashsale when not given or when the
    /// server is not spawned by the bench (--server-env is ignored then).
    pub fn strategy(&self) -> Result<Strategy, String> {
        if !self.spawn {
            return Ok(Strategy::FLASHSALE);
        }
        match self
            .server_env
            .iter()
            .rev()
            .find(|(k, _)| k == STRATEGY_ENV)
        {
            None => Ok(Strategy::FLASHSALE),
            Some((_, v)) => Strategy::parse(v).ok_or_else(|| {
                let names: Vec<&str> = Strategy::ALL.iter().map(|s| s.name()).collect();
                format!(
                    "--server-env {STRATEGY_ENV}={v}: must be one of {}",
                    names.join(", ")
                )
            }),
        }
    }

    /// The runs to carry out: one, or with --compare one per row of `COMPARE_ROWS`, each
    /// with the user's --server-env plus its strategy and a log file of its own.
    pub fn runs(&self) -> Result<Vec<RunSpec>, String> {
        let mut runs = self.runs_as_given()?;
        if let Some(nodes) = &self.redis_cluster_nodes {
            // A spawned server runs on the cluster the bench probes and audits (last,
            // so that it wins over a --server-env naming another).
            for run in &mut runs {
                run.server_env
                    .push((crate::server::CLUSTER_NODES_ENV.to_owned(), nodes.clone()));
            }
        }
        if let Some(secret) = &self.buyer_jwt_secret {
            // A spawned server authenticates its buyers with the secret the bench signs with.
            for run in &mut runs {
                run.server_env.extend([
                    (BUYER_AUTH_ENV.to_owned(), "jwt".to_owned()),
                    (BUYER_SECRET_ENV.to_owned(), secret.clone()),
                ]);
            }
        }
        Ok(runs)
    }

    fn runs_as_given(&self) -> Result<Vec<RunSpec>, String> {
        let database = if self.galera {
            Database::Galera
        } else {
            Database::Given
        };
        if self.sql {
            return Ok(vec![RunSpec {
                label: SQL_LABEL.to_owned(),
                target: Target::Sql,
                strategy: Some(Strategy::DB_CONDITIONAL),
                server_env: self.server_env.clone(),
                server_log: self.server_log.clone(),
                database,
            }]);
        }
        if self.compare_galera {
            return Ok(GALERA_ROWS
                .iter()
                .map(|&(strategy, database)| {
                    let label = match database {
                        Database::Galera => format!("{}{GALERA_SUFFIX}", strategy.name()),
                        _ => strategy.name().to_owned(),
                    };
                    self.compare_run(&label, Target::Purchase, Some(strategy), database)
                })
                .collect());
        }
        if !self.compare {
            let strategy = self.strategy()?;
            return Ok(vec![RunSpec {
                label: if self.ceiling {
                    CEILING_LABEL.to_owned()
                } else {
                    strategy.name().to_owned()
                },
                target: if self.ceiling {
                    Target::Healthz
                } else {
                    Target::Purchase
                },
                strategy: (!self.ceiling).then_some(strategy),
                server_env: self.server_env.clone(),
                server_log: self.server_log.clone(),
                database,
            }]);
        }
        Ok(COMPARE_ROWS
            .iter()
            .enumerate()
            .map(|(i, row)| {
                let (label, target, strategy) = match *row {
                    Row::Ceiling if i == 0 => (CEILING_LABEL, Target::Healthz, None),
                    Row::Ceiling => (CEILING_AGAIN_LABEL, Target::Healthz, None),
                    Row::Purchase(s) => (s.name(), Target::Purchase, Some(s)),
                    // Its server only creates the product, as a db-conditional server.
                    Row::Sql => (SQL_LABEL, Target::Sql, Some(Strategy::DB_CONDITIONAL)),
                };
                self.compare_run(label, target, strategy, database)
            })
            .collect())
    }

    /// One row of a comparison: the user's --server-env plus the row's strategy, and a
    /// log of its own.
    fn compare_run(
        &self,
        label: &str,
        target: Target,
        strategy: Option<Strategy>,
        database: Database,
    ) -> RunSpec {
        let mut server_env = self.server_env.clone();
        if let Some(s) = strategy {
            server_env.push((STRATEGY_ENV.to_owned(), s.name().to_owned()));
        }
        RunSpec {
            label: label.to_owned(),
            target,
            strategy,
            server_env,
            // One file per run, or each spawn would overwrite the last one's log.
            server_log: self.server_log.as_ref().map(|p| {
                let mut name = p.as_os_str().to_owned();
                name.push(format!(".{label}"));
                PathBuf::from(name)
            }),
            database,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Args {
        Args::try_parse_from(std::iter::once("flashsale-bench").chain(args.iter().copied()))
            .expect("valid arguments")
    }

    // Checks the scenarios' sizes meet the definitions (rush: 1,000 stock,
    // ≥200,000 attempts, ≥50,000 users; sustained: stock above attempts; mixed: follow-ups
    // and a payment timeout with --spawn), and flags override them.
    #[test]
    fn scenario_sizes_and_overrides() {
        let rush = parse(&["rush"]).sizes().expect("ok");
        assert_eq!(rush.stock, 1000);
        assert!(rush.attempts >= 200_000 && rush.users >= 50_000);
        for quick in [false, true] {
            let s = defaults(Scenario::Sustained, quick);
            assert!(s.stock as u64 > s.attempts);
        }
        let mixed = parse(&["mixed", "--spawn", "--quick"]).sizes().expect("ok");
        assert!(mixed.follow_ups);
        assert_eq!(mixed.payment_timeout, Some(Duration::from_secs(2)));
        assert_eq!(parse(&["mixed"]).sizes().expect("ok").payment_timeout, None);
        let o = parse(&[
            "rush",
            "--stock",
            "5",
            "--attempts",
            "10",
            "--per-user-limit",
            "0",
        ])
        .sizes()
        .expect("ok");
        assert_eq!((o.stock, o.attempts, o.per_user_limit), (5, 10, None));
    }

    // Checks --ceiling: parsing it gives one run that sends GET /healthz with no
    // strategy, labelled http-ceiling, keeping the mode flags; without it the single run
    // is a purchase run of the strategy named by --server-env (flashsale by default,
    // and flashsale whatever --server-env says when the server is not spawned).
    #[test]
    fn ceiling_and_strategy_of_a_single_run() {
        let runs = parse(&["sustained", "--ceiling", "--connections", "8"])
            .runs()
            .expect("ok");
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].target, Target::Healthz);
        assert_eq!(runs[0].strategy, None);
        assert_eq!(runs[0].label, CEILING_LABEL);
        let default = parse(&["rush"]).runs().expect("ok");
        assert_eq!(default[0].target, Target::Purchase);
        assert_eq!(default[0].strategy, Some(Strategy::FLASHSALE));
        let baseline = parse(&[
            "rush",
            "--spawn",
            "--server-env",
            "FLASHSALE_STRATEGY=redis-lua",
        ]);
        assert_eq!(baseline.strategy(), Ok(Strategy::REDIS_LUA));
        assert_eq!(baseline.runs().expect("ok")[0].label, "redis-lua");
        let not_spawned = parse(&["rush", "--server-env", "FLASHSALE_STRATEGY=redis-lua"]);
        assert_eq!(not_spawned.strategy(), Ok(Strategy::FLASHSALE));
    }

    // Checks --redis-cluster-nodes: a spawned server gets it as its cluster setting,
    // after the user's --server-env so that it wins; without it no run names a cluster;
    // it cannot go with --outage (whose server has a private redis-server).
    #[test]
    fn a_redis_cluster_reaches_the_spawned_servers() {
        let nodes = "127.0.0.1:7000,127.0.0.1:7001";
        let args = parse(&[
            "rush",
            "--spawn",
            "--server-env",
            "FLASHSALE_REDIS_CLUSTER_NODES=127.0.0.1:9",
            "--redis-cluster-nodes",
            nodes,
        ]);
        assert_eq!(args.redis_cluster_nodes.as_deref(), Some(nodes));
        let env = &args.runs().expect("ok")[0].server_env;
        let last = env
            .iter()
            .rev()
            .find(|(k, _)| k == crate::server::CLUSTER_NODES_ENV);
        assert_eq!(last.map(|(_, v)| v.as_str()), Some(nodes));
        let plain = parse(&["rush", "--spawn"]).runs().expect("ok");
        assert!(plain[0]
            .server_env
            .iter()
            .all(|(k, _)| k != crate::server::CLUSTER_NODES_ENV));
        let outage = Args::try_parse_from([
            "flashsale-bench",
            "sustained",
            "--spawn",
            "--outage",
            "--redis-cluster-nodes",
            nodes,
        ]);
        assert!(outage.is_err());
    }

    // Checks --compare expands to the ten rows in order (ceiling, http-post-ceiling,
    // sql-conditional, db-pessimistic, db-conditional, db-optimistic, redis-lock,
    // redis-lua, flashsale, ceiling again): each strategy row adds its FLASHSALE_STRATEGY after the user's own
    // --server-env (kept for every row), the SQL row db-conditional's (its server creates
    // the product) and sends SQL, the ceiling rows add none, and --server-log becomes one
    // file per row, named by its label.
    #[test]
    fn compare_expands_to_ten_runs() {
        let args = parse(&[
            "sustained",
            "--spawn",
            "--quick",
            "--compare",
            "--server-env",
            "FLASHSALE_DATABASE_MAX_CONNECTIONS=32",
            "--server-log",
            "/tmp/s.log",
        ]);
        args.sizes().expect("valid");
        let runs = args.runs().expect("ok");
        let labels: Vec<&str> = runs.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                CEILING_LABEL,
                "http-post-ceiling",
                SQL_LABEL,
                "db-pessimistic",
                "db-conditional",
                "db-optimistic",
                "redis-lock",
                "redis-lua",
                "flashsale",
                CEILING_AGAIN_LABEL
            ]
        );
        let user = (
            "FLASHSALE_DATABASE_MAX_CONNECTIONS".to_owned(),
            "32".to_owned(),
        );
        for ceiling in [&runs[0], &runs[9]] {
            assert_eq!(ceiling.target, Target::Healthz);
            assert_eq!(ceiling.strategy, None);
            assert_eq!(ceiling.server_env, vec![user.clone()]);
        }
        for run in &runs[1..9] {
            let name = run.strategy.expect("a strategy").name();
            let sql = run.label == SQL_LABEL;
            assert_eq!(run.target, if sql { Target::Sql } else { Target::Purchase });
            assert_eq!(sql, name == "db-conditional" && run.label != name);
            assert_eq!(
                run.server_env,
                vec![user.clone(), (STRATEGY_ENV.to_owned(), name.to_owned())]
            );
            assert_eq!(
                run.server_log,
                Some(PathBuf::from(format!("/tmp/s.log.{}", run.label)))
            );
        }
        assert_eq!(
            runs[0].server_log,
            Some(PathBuf::from("/tmp/s.log.http-ceiling"))
        );
        assert_eq!(
            runs[9].server_log,
            Some(PathBuf::from("/tmp/s.log.http-ceiling-again"))
        );
    }

    // Checks the Galera flags: --galera puts a single run, and every row of --compare, on
    // the cluster; --compare-galera expands to flashsale and db-conditional, each on one
    // node and then on the cluster (labelled @galera), each with its strategy after the
    // user's --server-env and a log of its own, and takes --rounds; both need --spawn,
    // and neither goes with --outage or --keep, nor with each other; --compare-galera
    // refuses --compare, --ceiling, --sql and the mixed scenario.
    #[test]
    fn the_galera_runs() {
        let single = parse(&["sustained", "--spawn", "--galera"])
            .runs()
            .expect("ok");
        assert_eq!(single.len(), 1);
        assert_eq!(single[0].database, Database::Galera);
        let compare = parse(&["rush", "--spawn", "--galera", "--compare"]);
        assert!(compare
            .runs()
            .expect("ok")
            .iter()
            .all(|r| r.database == Database::Galera));
        assert_eq!(
            parse(&["rush", "--spawn"]).runs().expect("ok")[0].database,
            Database::Given
        );
        let args = parse(&[
            "sustained",
            "--spawn",
            "--compare-galera",
            "--rounds",
            "3",
            "--server-log",
            "/tmp/s.log",
        ]);
        args.sizes().expect("valid");
        let runs = args.runs().expect("ok");
        let rows: Vec<(&str, Database)> = runs
            .iter()
            .map(|r| (r.label.as_str(), r.database))
            .collect();
        assert_eq!(
            rows,
            [
                ("flashsale", Database::OneNode),
                ("flashsale@galera", Database::Galera),
                ("db-conditional", Database::OneNode),
                ("db-conditional@galera", Database::Galera),
            ]
        );
        for run in &runs {
            let strategy = run.strategy.expect("a strategy").name();
            assert_eq!(
                run.server_env,
                vec![(STRATEGY_ENV.to_owned(), strategy.to_owned())]
            );
            assert_eq!(run.target, Target::Purchase);
            assert_eq!(
                run.server_log,
                Some(PathBuf::from(format!("/tmp/s.log.{}", run.label)))
            );
        }
        let cli = |list: &[&str]| {
            Args::try_parse_from(std::iter::once("flashsale-bench").chain(list.iter().copied()))
        };
        for refused in [
            &["sustained", "--galera"][..],
            &["sustained", "--compare-galera"],
            &["sustained", "--spawn", "--galera", "--outage"],
            &["sustained", "--spawn", "--galera", "--keep"],
            &["sustained", "--spawn", "--galera", "--compare-galera"],
            &["sustained", "--spawn", "--compare-galera", "--compare"],
            &["sustained", "--spawn", "--compare-galera", "--ceiling"],
            &["sustained", "--spawn", "--compare-galera", "--sql"],
            &["sustained", "--spawn", "--compare-galera", "--keep"],
        ] {
            assert!(cli(refused).is_err(), "{refused:?}");
        }
        let err = parse(&["mixed", "--spawn", "--compare-galera"])
            .sizes()
            .expect_err("refused");
        assert!(err.contains("--compare-galera"), "{err}");
    }

    // Checks --sql: one run labelled sql-conditional that sends SQL for db-conditional's
    // transaction, keeping the user's --server-env; it needs --spawn, and it cannot be
    // combined with --compare, --ceiling or the open loop, nor run the mixed scenario;
    // --sql-clients is bounded like --connections.
    #[test]
    fn the_sql_run() {
        let runs = parse(&["sustained", "--spawn", "--sql", "--sql-clients", "8"])
            .runs()
            .expect("ok");
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].label, SQL_LABEL);
        assert_eq!(runs[0].target, Target::Sql);
        assert_eq!(runs[0].strategy, Some(Strategy::DB_CONDITIONAL));
        let cli = |list: &[&str]| {
            Args::try_parse_from(std::iter::once("flashsale-bench").chain(list.iter().copied()))
        };
        assert!(cli(&["sustained", "--sql"]).is_err());
        for other in ["--compare", "--ceiling"] {
            assert!(
                cli(&["sustained", "--spawn", "--sql", other]).is_err(),
                "{other}"
            );
        }
        assert!(cli(&["sustained", "--spawn", "--sql", "--rate", "100"]).is_err());
        assert!(parse(&["mixed", "--spawn", "--sql"]).sizes().is_err());
        assert!(parse(&["rush", "--spawn", "--sql", "--sql-clients", "0"])
            .sizes()
            .is_err());
    }

    // Checks the combinations that cannot work are refused, by parsing them: --compare
    // without --spawn, --compare with --ceiling and --rounds without --compare (clap
    // errors), --rounds outside 1..=9; --compare with mixed,
    // with FLASHSALE_STRATEGY in --server-env, and a baseline or an unknown strategy
    // for mixed (sizes() errors naming the flag).
    #[test]
    fn compare_and_strategy_misuse_is_refused() {
        let cli = |args: &[&str]| {
            Args::try_parse_from(std::iter::once("flashsale-bench").chain(args.iter().copied()))
        };
        assert!(cli(&["rush", "--compare"]).is_err(), "needs --spawn");
        assert!(cli(&["rush", "--spawn", "--compare", "--ceiling"]).is_err());
        assert!(
            cli(&["rush", "--spawn", "--rounds", "3"]).is_err(),
            "--rounds needs --compare"
        );
        let three = parse(&["rush", "--spawn", "--compare", "--rounds", "3"]);
        three.sizes().expect("valid");
        assert_eq!(three.rounds, 3);
        assert_eq!(three.runs().expect("ok").len(), COMPARE_ROWS.len());
        for (args, flag) in [
            (
                &["rush", "--spawn", "--compare", "--rounds", "0"][..],
                "--rounds",
            ),
            (
                &["rush", "--spawn", "--compare", "--rounds", "10"][..],
                "--rounds",
            ),
            (&["mixed", "--spawn", "--compare"][..], "--compare"),
            (
                &[
                    "rush",
                    "--spawn",
                    "--compare",
                    "--server-env",
                    "FLASHSALE_STRATEGY=flashsale",
                ],
                "--compare",
            ),
            (
                &[
                    "mixed",
                    "--spawn",
                    "--server-env",
                    "FLASHSALE_STRATEGY=db-conditional",
                ],
                "--server-env",
            ),
            (
                &["rush", "--spawn", "--server-env", "FLASHSALE_STRATEGY=nope"],
                "FLASHSALE_STRATEGY=nope",
            ),
        ] {
            let err = parse(args).sizes().expect_err("refused");
            assert!(err.contains(flag), "{args:?}: {err}");
        }
        // The ceiling of mixed sends no purchase: nothing to refuse.
        parse(&[
            "mixed",
            "--spawn",
            "--ceiling",
            "--server-env",
            "FLASHSALE_STRATEGY=db-conditional",
        ])
        .sizes()
        .expect("valid");
    }

    // Checks several servers on the command line: --base-url repeated gives the URLs in
    // the order given, each without a trailing slash, and the default when none is
    // given; --spawn --instances N counts N targets (ignoring --base-url).
    #[test]
    fn several_base_urls_in_order() {
        let args = parse(&[
            "rush",
            "--base-url",
            "http://127.0.0.1:8081/",
            "--base-url",
            "http://127.0.0.1:8082",
            "--base-url",
            "http://localhost:8083",
        ]);
        args.sizes().expect("valid");
        assert_eq!(
            args.base_urls,
            [
                "http://127.0.0.1:8081",
                "http://127.0.0.1:8082",
                "http://localhost:8083"
            ]
        );
        assert_eq!(args.targets(), 3);
        let default = parse(&["rush"]);
        assert_eq!(default.base_urls, ["http://127.0.0.1:8080"]);
        assert_eq!(default.targets(), 1);
        let spawned = parse(&["rush", "--spawn", "--instances", "3"]);
        spawned.sizes().expect("valid");
        assert_eq!(spawned.targets(), 3);
        assert_eq!(parse(&["rush", "--spawn"]).targets(), 1);
    }

    // Checks malformed servers are refused with a message that says what is wrong, by
    // parsing them: an empty URL, a comma-separated list (one URL per flag), no scheme,
    // https, a path, no host (clap errors carrying the parser's message); the same URL
    // twice, more servers than connections in the closed loop (fine in the open loop),
    // and --instances 0 or above the bound (sizes() errors naming the flag); --instances
    // without --spawn or with --compare (clap errors).
    #[test]
    fn malformed_or_clashing_base_urls_are_refused() {
        let cli = |args: &[&str]| {
            Args::try_parse_from(std::iter::once("flashsale-bench").chain(args.iter().copied()))
        };
        for (url, says) in [
            ("", "empty base URL"),
            (
                "http://127.0.0.1:8081,http://127.0.0.1:8082",
                "one URL per --base-url",
            ),
            ("127.0.0.1:8081", "plain http:// only"),
            ("https://127.0.0.1:8081", "plain http:// only"),
            ("http://127.0.0.1:8081/v1", "no path"),
            ("http://", "base URL"),
        ] {
            let err = cli(&[
                "rush",
                "--base-url",
                "http://127.0.0.1:8080",
                "--base-url",
                url,
            ])
            .expect_err(url)
            .to_string();
            assert!(err.contains(says), "{url:?}: {err}");
        }
        let too_many = (TARGETS_MAX + 1).to_string();
        for (args, says) in [
            (
                &[
                    "rush",
                    "--base-url",
                    "http://127.0.0.1:8081",
                    "--base-url",
                    "http://127.0.0.1:8081/",
                ][..],
                "given twice",
            ),
            (
                &[
                    "rush",
                    "--connections",
                    "1",
                    "--base-url",
                    "http://127.0.0.1:8081",
                    "--base-url",
                    "http://127.0.0.1:8082",
                ],
                "--connections 1 is fewer than the 2 servers",
            ),
            (&["rush", "--spawn", "--instances", "0"], "--instances"),
            (
                &["rush", "--spawn", "--instances", &too_many],
                "--instances",
            ),
        ] {
            let err = parse(args).sizes().expect_err("refused");
            assert!(err.contains(says), "{args:?}: {err}");
        }
        parse(&[
            "rush",
            "--rate",
            "100",
            "--connections",
            "1",
            "--base-url",
            "http://127.0.0.1:8081",
            "--base-url",
            "http://127.0.0.1:8082",
        ])
        .sizes()
        .expect("the open loop needs no connection per server");
        assert!(cli(&["rush", "--instances", "2"]).is_err(), "needs --spawn");
        assert!(cli(&["rush", "--spawn", "--compare", "--instances", "2"]).is_err());
    }

    // Checks bad values are refused with a message naming the flag.
    #[test]
    fn bad_values_are_refused() {
        for (args, flag) in [
            (&["rush", "--retry-share", "0.95"][..], "--retry-share"),
            (&["rush", "--rate", "0"], "--rate"),
            (&["rush", "--connections", "0"], "--connections"),
            (
                &["mixed", "--pay-share", "0.9", "--cancel-share", "0.2"],
                "--pay-share",
            ),
            (&["rush", "--duration", "2h"], "--duration"),
        ] {
            let err = parse(args).sizes().expect_err("refused");
            assert!(err.contains(flag), "{args:?}: {err}");
        }
    }
}
