//! flashsale-bench: a load generator for flashsale (issue 4).
//!
//! A run: (optionally) start a server, create the product through the admin API, take
//! the stores' counters, drive the load (open or closed loop) while a progress bar runs,
//! take the counters again, let the system go quiet, check what the client saw (one
//! order per request_id, no more orders than stock, acknowledged orders exist, unpaid
//! orders expired), run `flashsale audit`, then print a summary and write the JSON and
//! HTML reports. Exit status 1 on any violation.
//!
//! Several servers of one sale (`--base-url` repeated, or `--spawn --instances N`) share
//! the load round-robin — by connection in the closed loop, by attempt in the open loop —
//! and the report counts each one's attempts and how they ended; a server that stops
//! answering mid-run does not stop the run, its attempts end with no answer (unknown).
//! The product is created through the first one; the reads after the load go to the
//! first one still answering. [`drive`] is the same run as a library call.
//!
//! `--ceiling` sends `GET /healthz` instead of purchases with the same driver (the HTTP
//! ceiling: no product, no checks, no cost per order). `--compare` runs the ceiling and
//! every purchase strategy (`FLASHSALE_STRATEGY`: http-post-ceiling — the purchase
//! endpoint refusing everything, no store touched —, db-pessimistic, db-conditional,
//! redis-lua, flashsale) one after the other on freshly spawned servers and prints them
//! side by side (`compare.rs`). The baselines write no reservation rows and no Redis
//! holds: the checks built on those (the inventory view, the by-request_id lookup,
//! `flashsale audit`) are skipped for them and listed as skipped; the orders-table
//! checks (no oversell, one order per request_id, acknowledged orders exist) run for
//! every strategy.
//!
//! `--galera` puts a spawned server's ledger on a private 3-node Galera cluster, and
//! `--compare-galera` runs flashsale and db-conditional on one private MariaDB and on the
//! cluster side by side (`nodes.rs`: the stores, each node's CPU, the `wsrep_` counters).

pub mod cli;
pub mod compare;
pub mod html;
pub mod http;
pub mod load;
pub mod nodes;
pub mod outage;
pub mod probes;
pub mod report;
pub mod schedule;
pub mod server;
pub mod sql;
pub mod stats;
pub mod tokens;
pub mod workload;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use serde::Deserialize;

use cli::{Args, RunSpec, Sizes, Target};
use load::{Live, LoadOutcome, LoadPlan, Mode, Targets, Watcher};
use probes::{CommitCounters, MysqlProbe, OrdersProbe, RedisProbe, RedisSnapshot};
use report::{
    AttemptCounts, AuditOutcome, BenchResult, Checks, Costs, Cpu, Inventory, Memory, OpResult,
    OrderCounts, RunConfig, Throughput,
};
use server::{ServerEnv, Spawned};
use stats::{Op, Recorder};
use tokens::BuyerTokens;
use workload::Workload;

/// Wait after the load before checking: the outbox relay publishes the last events,
/// recovery and the gate watch take a pass (their intervals are 1–5 s by default; the
/// audit is repeated below if they need longer).
const QUIET_WAIT: Duration = Duration::from_secs(2);
/// Extra wait past the payment timeout for the expiry worker (1 s interval by default)
/// to cancel the last unpaid orders.
const EXPIRY_SLACK: Duration = Duration::from_secs(2);
/// Re-checks of sampled orders not yet expired, `EXPIRY_SLACK` apart: a lagging worker
/// gets a few more passes before an unexpired order counts as a violation.
const EXPIRY_RECHECKS_MAX: u32 = 3;
/// Audit runs: the audit wants a quiet system; violations caused by work still in
/// flight (events not yet published, an expiry pass pending) disappear on a later run,
/// real ones stay. Only the last run's verdict counts.
const AUDIT_RUNS_MAX: u32 = 5;
/// Pause between audit runs.
const AUDIT_PAUSE: Duration = Duration::from_secs(3);
/// Acknowledged orders looked up again by request_id (GET /v1/purchases/{id}) to check
/// they exist with the same order id (I5 from the client's side): a sample, so the
/// check takes a second whatever the run's size.
const ACK_SAMPLE_MAX: usize = 200;
/// Rows of the orders table read per query when matching every acknowledged order
/// against it: one round trip per page, pages small enough to stay quick.
const LEDGER_PAGE: u64 = 10_000;
/// Violations of one kind listed verbatim; the rest are counted.
const LISTED_MAX: usize = 10;
/// The note attached to the cost figures.
const COST_NOTE: &str = "Redis calls and MariaDB commits are server-wide counters \
    (INFO commandstats, SHOW GLOBAL STATUS): anything else using the same Redis or \
    MariaDB during the load (other tests, other services, the server's own background \
    workers) is counted too, so compare runs on a quiet box and read small runs with care. \
    commandstats also counts the commands a Lua script runs: \"script calls\" (EVAL, EVALSHA, \
    FCALL) are round trips, \"commands\" is all the work Redis did.";

/// Set by the first Ctrl-C: a `--compare` starts no further run.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// How a run is driven: from the command line (Ctrl-C handled by the bench) or by a
/// library caller ([`drive`]: its own signals, and its own view of the live counters).
struct Driver {
    live: Arc<Live>,
    /// Watch Ctrl-C: the first stops the load, the second exits.
    ctrl_c: bool,
}

impl Driver {
    fn command_line() -> Self {
        Driver {
            live: Arc::default(),
            ctrl_c: true,
        }
    }
}

/// Runs the benchmark; Ok(true) when no violation was found, Ok(false) when one was,
/// Err when the run could not be carried out. With --compare: Ok(false) only when the
/// flashsale run found a violation (the baselines' results are reported, not judged),
/// Err when a run could not be carried out (after the table of the others).
pub async fn run(args: Args) -> Result<bool, String> {
    let sizes = args.sizes()?;
    let runs = args.runs()?;
    // One seed for every run of a comparison: the same requests in the same order.
    let seed = args.seed.unwrap_or_else(rand::random);
    if args.outage {
        return outage::run(&args).await;
    }
    let html_path = args.html_path(chrono::Utc::now());
    // Dropped (its databases killed and removed) once every run has stopped its servers.
    let stores = nodes::Stores::start(&args).await?;
    if args.compare || args.compare_galera {
        return run_compare(&args, &sizes, &runs, seed, &stores, html_path.as_deref()).await;
    }
    let result = run_single(&args, &sizes, runs, seed, Driver::command_line(), &stores).await?;
    print!("{}", report::summary_table(&result));
    print_failed_audit(&result, &mut std::io::stderr());
    if let Some(path) = &args.json {
        write_file(path, &to_json(&result)?)?;
    }
    if let Some(path) = &html_path {
        write_file(path, &html::report(&result))?;
    }
    Ok(result.passed)
}

/// One run as a library call, for a test that drives flashsale servers of its own: the
/// run the command line makes of `args` (without --compare or --outage), e.g. a rush over
/// three instances given as three `--base-url` (with `--admin-token`, and the
/// `--database-url` and `--redis-prefix` they serve, which the checks and the audit
/// read), the result returned instead of printed or written to files.
///
/// `live` holds the load's counters while it runs: the caller may watch them to act
/// mid-run (kill an instance once answers flow: its attempts then end with no answer,
/// counted against it in `BenchResult::targets`), and set `live.stop` to end the load
/// early. Ctrl-C is left to the caller. Ok whatever the checks found (`passed` says);
/// Err when the run could not be carried out.
pub async fn drive(args: &Args, live: Arc<Live>) -> Result<BenchResult, String> {
    if args.compare || args.compare_galera || args.outage {
        return Err(
            "drive makes one run: --compare, --compare-galera and --outage are the command line's own"
                .into(),
        );
    }
    let sizes = args.sizes()?;
    let runs = args.runs()?;
    let seed = args.seed.unwrap_or_else(rand::random);
    let driver = Driver {
        live,
        ctrl_c: false,
    };
    let stores = nodes::Stores::start(args).await?;
    run_single(args, &sizes, runs, seed, driver, &stores).await
}

/// The one run of `runs` (a single run, not a comparison).
async fn run_single(
    args: &Args,
    sizes: &Sizes,
    runs: Vec<RunSpec>,
    seed: u64,
    driver: Driver,
    stores: &nodes::Stores,
) -> Result<BenchResult, String> {
    let [spec] = <[RunSpec; 1]>::try_from(runs)
        .map_err(|r| format!("expected one run without --compare, got {}", r.len()))?;
    run_one(args, sizes, &spec, seed, driver, stores).await
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<String, String> {
    serde_json::to_string_pretty(v).map_err(|e| format!("JSON: {e}"))
}

fn write_file(path: &std::path::Path, text: &str) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    }
    std::fs::write(path, text).map_err(|e| format!("write {}: {e}", path.display()))?;
    eprintln!("flashsale-bench: wrote {}", path.display());
    Ok(())
}

fn print_failed_audit(r: &BenchResult, out: &mut impl std::io::Write) {
    let a = &r.checks.audit;
    if a.status != "passed" && a.status != "skipped" {
        let _ = writeln!(
            out,
            "\n==== flashsale audit ({}) ====\n{}",
            a.status, a.output
        );
    }
}

/// `--compare` (`--compare-galera`): every row of `COMPARE_ROWS` (`GALERA_ROWS`) in turn,
/// each on its own spawned server; each run's summary goes to stderr, the comparison
/// table to stdout.
async fn run_compare(
    args: &Args,
    sizes: &Sizes,
    runs: &[RunSpec],
    seed: u64,
    stores: &nodes::Stores,
    html_path: Option<&std::path::Path>,
) -> Result<bool, String> {
    let started_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let rounds = args.rounds;
    let total = runs.len() * rounds as usize;
    let mut outcomes = Vec::with_capacity(rounds as usize);
    for round in 1..=rounds {
        let mut this_round = Vec::with_capacity(runs.len());
        for (i, spec) in runs.iter().enumerate() {
            if INTERRUPTED.load(Ordering::Relaxed) {
                this_round.push(compare::RunOutcome {
                    spec: spec.clone(),
                    result: Err("not run: interrupted".into()),
                });
                continue;
            }
            let of_rounds = if rounds > 1 {
                format!(" (round {round} of {rounds})")
            } else {
                String::new()
            };
            eprintln!(
                "\nflashsale-bench: ===== compare run {}/{total}: {}{of_rounds} =====",
                (round as usize - 1) * runs.len() + i + 1,
                spec.label
            );
            let result = run_one(args, sizes, spec, seed, Driver::command_line(), stores).await;
            match &result {
                Ok(r) => {
                    eprint!("{}", report::summary_table(r));
                    print_failed_audit(r, &mut std::io::stderr());
                }
                Err(e) => eprintln!("flashsale-bench: the {} run failed: {e}", spec.label),
            }
            this_round.push(compare::RunOutcome {
                spec: spec.clone(),
                result,
            });
        }
        outcomes.push(this_round);
    }
    let meta = compare::Meta {
        scenario: args.scenario.name().into(),
        started_at,
        seed,
        load: match args.rate {
            Some(rate) => format!("open loop {rate}/s, in-flight cap {}", args.max_in_flight),
            None => format!("closed loop, {} connections", args.connections),
        },
        attempts_max: sizes.attempts,
        stock: sizes.stock,
        users: sizes.users,
        quick: args.quick,
        rounds,
    };
    let report = compare::build_rounds(meta, outcomes);
    println!();
    print!("{}", compare::table(&report));
    if let Some(path) = &args.json {
        write_file(path, &to_json(&report)?)?;
    }
    if let Some(path) = html_path {
        write_file(path, &html::compare_report(&report))?;
    }
    let errors: Vec<String> = report
        .rows
        .iter()
        .filter_map(|r| r.error.as_ref().map(|e| format!("{}: {e}", r.label)))
        .collect();
    if !report.passed {
        Ok(false)
    } else if !errors.is_empty() {
        Err(format!(
            "the comparison is incomplete: {}",
            errors.join("; ")
        ))
    } else {
        Ok(true)
    }
}

/// One run: start the servers (with --spawn; on the database `spec` names, one of
/// `stores`'), drive the load, check, stop the servers.
async fn run_one(
    args: &Args,
    sizes: &Sizes,
    spec: &RunSpec,
    seed: u64,
    driver: Driver,
    stores: &nodes::Stores,
) -> Result<BenchResult, String> {
    let placed = stores.place(spec.database)?;
    let mut spawned = if args.spawn {
        eprintln!(
            "flashsale-bench: starting {} serve{} ({}) …",
            args.server_bin.display(),
            if args.instances > 1 {
                format!(" × {}", args.instances)
            } else {
                String::new()
            },
            match (spec.target, spec.strategy) {
                (Target::Sql, _) => "to create the product of the SQL run".to_owned(),
                (_, Some(s)) => format!("strategy {}", s.name()),
                (_, None) => "for the HTTP ceiling".to_owned(),
            }
        );
        let s = server::spawn(server::SpawnOptions {
            bin: &args.server_bin,
            database_url: placed.database_url.as_deref().unwrap_or(&args.database_url),
            redis_url: &args.redis_url,
            nats_url: &args.nats_url,
            payment_timeout: sizes.payment_timeout,
            extra_env: &placed.server_env(&spec.server_env),
            log_level: &args.server_log_level,
            log_path: spec.server_log.as_deref(),
            instances: args.instances,
        })
        .await?;
        for i in s.instances() {
            eprintln!(
                "flashsale-bench: server pid {} on {} (database {}, Redis prefix {})",
                i.pid, i.base_url, s.env.database_url, s.env.redis_prefix
            );
        }
        Some(s)
    } else {
        None
    };
    let result = run_against(args, sizes, spec, seed, spawned.as_mut(), driver, &placed).await;
    if let Some(s) = spawned {
        s.shutdown(args.keep).await;
    }
    result
}

/// The product's view as the API returns it.
#[derive(Debug, Deserialize)]
struct ProductView {
    inventory: Inventory,
}

#[derive(Debug, Deserialize)]
struct OrderView {
    order_id: i64,
    #[serde(default)]
    request_id: Option<String>,
    status: String,
    cancel_reason: Option<String>,
}

/// Aborts the Ctrl-C watcher of a run when the run ends, so a later Ctrl-C cannot signal
/// a server that has already exited (whose pid may have been reused).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One run against its servers (or, for the SQL run, its database), phase by phase:
/// prepare (targets, product, probes), the counters before, the load, the counters
/// after, the checks, the result.
async fn run_against(
    args: &Args,
    sizes: &Sizes,
    spec: &RunSpec,
    seed: u64,
    spawned: Option<&mut Spawned>,
    driver: Driver,
    placed: &nodes::Placement,
) -> Result<BenchResult, String> {
    let (mut run, targets) = Run::prepare(args, sizes, spec, spawned).await?;
    // First: its FLUSH STATUS must not fall between the commit counters' two reads.
    let wsrep_before = placed.wsrep(true).await;
    let before = run.counters_before().await;
    let workload = run.workload(seed);
    // Minted before the load: signing is not part of what is measured.
    let tokens = run.buyer_tokens(&workload)?;
    let plan = run.plan(&workload, tokens.clone());
    let live = driver.live;
    // Held to the end of the run, the checks included (`AbortOnDrop`).
    let _watch = driver.ctrl_c.then(|| {
        AbortOnDrop(watch_ctrl_c(
            live.clone(),
            if run.spawned {
                run.pids.clone()
            } else {
                Vec::new()
            },
        ))
    });
    let (bar, watcher) = progress_bar(args.no_progress, sizes.attempts, &run.pids);
    let started_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    run.announce(&targets);
    let loaded = run.load(plan, targets, live, watcher, &bar, placed).await;
    let after = run.counters_after().await;
    let proc = probes::servers_memory(&run.pids);
    let verdict = run
        .check(&loaded.outcome, &workload, tokens.as_deref())
        .await;
    if let Some(m) = run.mysql.take() {
        m.close().await;
    }
    let passed = verdict.checks.client_violations.is_empty()
        && matches!(verdict.checks.audit.status.as_str(), "passed" | "skipped");

    Ok(build_result(Built {
        args,
        spec,
        sizes,
        mode: run.mode,
        product_id: run.product_id,
        seed,
        base_urls: &run.base_urls,
        spawned: run.spawned,
        started_at,
        outcome: &loaded.outcome,
        redis: [&before.redis, &after.redis, &verdict.redis_settled],
        commits: [before.commits, after.commits],
        keys: [before.keys, after.keys, verdict.keys_settled],
        proc,
        cpu: loaded.cpu,
        wsrep: [wsrep_before, loaded.wsrep_after],
        database: placed.database.name(),
        inventory: verdict.inventory,
        expiry: verdict.expiry,
        checks: verdict.checks,
        passed,
    }))
}

/// A run once prepared: what it sends to, the product, and the probes of the stores'
/// counters, with the command line's choices that the phases after it read.
struct Run<'a> {
    args: &'a Args,
    sizes: &'a Sizes,
    spec: &'a RunSpec,
    /// The HTTP ceiling (`GET /healthz`): no product, no probes, no checks.
    ceiling: bool,
    /// The SQL run: no server during the load, its database called directly.
    sql: bool,
    baseline: bool,
    /// The bench started the servers (their counters start with the run).
    spawned: bool,
    /// The load's targets, the first one (product, admin calls) first.
    base_urls: Vec<String>,
    env: ServerEnv,
    /// The servers whose CPU and memory are measured (none once the SQL run stopped them).
    pids: Vec<u32>,
    product_id: i64,
    mode: Mode,
    http: reqwest::Client,
    redis: Option<RedisProbe>,
    mysql: Option<MysqlProbe>,
    /// The SQL run's database and how many clients call it.
    sql_target: Option<(Arc<sql::SqlTarget>, u64)>,
}

/// The stores' counters at one moment of the run; each None when its probe is missing.
struct Counters {
    keys: Option<u64>,
    redis: Option<RedisSnapshot>,
    commits: Option<CommitCounters>,
}

/// What the load left: its outcome, and the CPU and Galera figures read around it.
struct Loaded {
    outcome: LoadOutcome,
    /// CPU seconds over the load by process name (`probes::cpu_seconds`).
    cpu: BTreeMap<String, f64>,
    wsrep_after: Option<nodes::WsrepSnapshot>,
}

/// What the checks after the load found, with the figures read for them.
#[derive(Default)]
struct Verdict {
    checks: Checks,
    inventory: Option<Inventory>,
    /// Sampled unpaid orders checked for expiry, and those confirmed expired.
    expiry: (u64, u64),
    /// Redis once the system went quiet (a run with a server only).
    redis_settled: Option<RedisSnapshot>,
    keys_settled: Option<u64>,
}

/// The addresses, admin token, stores and pids of the servers a run goes to: the ones
/// the bench spawned, or those the command line names.
fn servers_of(
    args: &Args,
    spawned: Option<&Spawned>,
) -> (Vec<String>, Option<String>, ServerEnv, Vec<u32>) {
    match spawned {
        Some(s) => (
            s.base_urls(),
            Some(s.admin_token.clone()),
            s.env.clone(),
            s.pids(),
        ),
        None => (
            args.base_urls.clone(),
            args.admin_token.clone(),
            ServerEnv {
                database_url: args.database_url.clone(),
                redis_url: args.redis_url.clone(),
                redis_cluster_nodes: args.redis_cluster_nodes.clone(),
                redis_prefix: args.redis_prefix.clone(),
                // The audit reads the ledger as the server does.
                database_nodes: std::env::var(server::DATABASE_NODES_ENV).ok(),
                nats: None,
            },
            args.server_pid.into_iter().collect(),
        ),
    }
}

/// The load's mode: open loop with --rate, else closed.
fn load_mode(args: &Args, sql: bool) -> Mode {
    match args.rate {
        Some(rate) => Mode::Open {
            rate,
            max_in_flight: args.max_in_flight,
        },
        // The SQL run's closed loop: one client per connection of its own.
        None if sql => Mode::Closed {
            connections: sql::clients(args),
        },
        None => Mode::Closed {
            connections: args.connections,
        },
    }
}

/// The probes of Redis's and MariaDB's counters; a store that cannot be probed leaves
/// its figures out of the report, not the run.
async fn store_probes(env: &ServerEnv) -> (Option<RedisProbe>, Option<MysqlProbe>) {
    let redis = match env.redis_probe().await {
        Ok(r) => Some(r),
        Err(e) => {
            eprintln!("flashsale-bench: Redis figures unavailable: {e}");
            None
        }
    };
    let mysql = match MysqlProbe::connect(&env.database_url).await {
        Ok(m) => Some(m),
        Err(e) => {
            eprintln!("flashsale-bench: MariaDB figures unavailable: {e}");
            None
        }
    };
    (redis, mysql)
}

impl<'a> Run<'a> {
    /// Resolves the targets, creates the product and connects the probes (none for the
    /// ceiling); for the SQL run, then stops the servers and points the load at their
    /// database.
    async fn prepare(
        args: &'a Args,
        sizes: &'a Sizes,
        spec: &'a RunSpec,
        spawned: Option<&mut Spawned>,
    ) -> Result<(Run<'a>, Targets), String> {
        let ceiling = spec.target == Target::Healthz;
        let sql = spec.target == Target::Sql;
        let (base_urls, token, env, pids) = servers_of(args, spawned.as_deref());
        let product_id = args.product_id.unwrap_or_else(|| {
            if spawned.is_some() {
                1
            } else {
                // A fresh id on a shared server: 10^9 ids, a collision is a 409 at creation.
                1_000_000_000 + rand::random_range(0..1_000_000_000i64)
            }
        });
        let mode = load_mode(args, sql);
        let pool = match mode {
            Mode::Open { max_in_flight, .. } => max_in_flight,
            Mode::Closed { connections } => connections,
        };
        let targets = Targets::new(&base_urls, usize::try_from(pool).unwrap_or(usize::MAX))?;
        let mut run = Run {
            args,
            sizes,
            spec,
            ceiling,
            sql,
            baseline: spec.strategy.is_some_and(|s| s.is_baseline()),
            spawned: spawned.is_some(),
            // As the targets have them: each a root without a trailing slash.
            base_urls: targets.base_urls().to_vec(),
            env,
            pids,
            product_id,
            mode,
            http: load::control_client()?,
            redis: None,
            mysql: None,
            sql_target: None,
        };
        // The ceiling creates nothing and measures no cost per order: no probes either.
        if !ceiling {
            let token = token.ok_or(
                "the admin token is needed to create the product: --admin-token or FLASHSALE_ADMIN_TOKEN (or use --spawn)",
            )?;
            // The product and every admin call go through the first target.
            let base_url = targets.first();
            create_product(&run.http, base_url, &token, product_id, args, sizes).await?;
            (run.redis, run.mysql) = store_probes(&run.env).await;
        }
        if !sql {
            return Ok((run, targets));
        }
        // The SQL run: the server made the product; the load goes to its database alone.
        if let Some(s) = spawned {
            s.stop_servers().await;
            run.pids.clear();
        }
        let payment_timeout = sizes.payment_timeout.unwrap_or(sql::SERVER_PAYMENT_TIMEOUT);
        let clients = sql::clients(args);
        let target = Arc::new(
            sql::SqlTarget::connect(&run.env.database_url, clients, payment_timeout).await?,
        );
        let targets = Targets::sql(target.clone());
        run.base_urls = targets.base_urls().to_vec();
        run.sql_target = Some((target, clients));
        Ok((run, targets))
    }

    /// The counters before the load. The key count (a walk of the keyspace) comes before
    /// the Redis snapshot, and after it in `counters_after`, so that its own commands
    /// stay out of the calls counted.
    async fn counters_before(&mut self) -> Counters {
        let keys = count_keys(&mut self.redis, &self.env.redis_prefix).await;
        let redis = redis_snapshot(&mut self.redis).await;
        let commits = commits(&mut self.mysql).await;
        Counters {
            keys,
            redis,
            commits,
        }
    }

    /// The counters after the load, read in the reverse order of `counters_before`.
    async fn counters_after(&mut self) -> Counters {
        let redis = redis_snapshot(&mut self.redis).await;
        let commits = commits(&mut self.mysql).await;
        let keys = count_keys(&mut self.redis, &self.env.redis_prefix).await;
        Counters {
            keys,
            redis,
            commits,
        }
    }

    /// The buyers' requests: `seed` fixes them, a fresh tag keeps their request_ids apart
    /// from earlier runs'.
    fn workload(&self, seed: u64) -> Workload {
        let (args, follow_ups) = (self.args, self.sizes.follow_ups);
        Workload {
            tag: format!("B{:08x}", rand::random::<u32>()),
            seed,
            users: self.sizes.users,
            retry_share: args.retry_share,
            pay_share: if follow_ups { args.pay_share } else { 0.0 },
            cancel_share: if follow_ups { args.cancel_share } else { 0.0 },
        }
    }

    /// The buyers' signed tokens, when the servers want them (purchases only).
    fn buyer_tokens(&self, workload: &Workload) -> Result<Option<Arc<BuyerTokens>>, String> {
        Ok(match (&self.args.buyer_jwt_secret, self.spec.target) {
            (Some(secret), Target::Purchase) => Some(Arc::new(BuyerTokens::mint(
                secret.as_bytes(),
                workload.users,
            )?)),
            _ => None,
        })
    }

    fn plan(&self, workload: &Workload, tokens: Option<Arc<BuyerTokens>>) -> LoadPlan {
        LoadPlan {
            mode: self.mode,
            attempts: self.sizes.attempts,
            duration: self.sizes.duration,
            workload: workload.clone(),
            product_id: self.product_id,
            follow_ups: self.sizes.follow_ups && !self.ceiling,
            target: self.spec.target,
            tokens,
        }
    }

    /// Says what the load is about to send, and how.
    fn announce(&self, targets: &Targets) {
        let (args, sizes, product_id) = (self.args, self.sizes, self.product_id);
        let mode_text = match self.mode {
            Mode::Open {
                rate,
                max_in_flight,
            } => format!("open loop at {rate}/s (in-flight cap {max_in_flight})"),
            Mode::Closed { connections } => format!("closed loop with {connections} connections"),
        };
        let mode_text = match targets.count() {
            1 => mode_text,
            n => format!("{mode_text}, round-robin over {n} servers"),
        };
        if self.ceiling {
            eprintln!(
                "flashsale-bench: {} — HTTP ceiling: {} × GET /healthz, {mode_text}",
                args.scenario.name(),
                sizes.attempts,
            );
        } else if self.sql {
            eprintln!(
                "flashsale-bench: {} — {}: {}, no server — product {product_id}, stock {}, {} attempts, {} users, {mode_text}",
                args.scenario.name(),
                self.spec.label,
                targets.first(),
                sizes.stock,
                sizes.attempts,
                sizes.users,
            );
        } else {
            eprintln!(
                "flashsale-bench: {} — strategy {} — product {product_id}, stock {}, {} attempts, {} users, {mode_text}",
                args.scenario.name(),
                self.spec.label,
                sizes.stock,
                sizes.attempts,
                sizes.users,
            );
        }
    }

    /// The load itself, with the CPU and Galera counters read right around it.
    async fn load(
        &self,
        plan: LoadPlan,
        targets: Targets,
        live: Arc<Live>,
        watcher: Arc<Progress>,
        bar: &ProgressBar,
        placed: &nodes::Placement,
    ) -> Loaded {
        let hz = probes::clock_ticks_per_s();
        let cpu_before = probes::cpu_snapshot(&self.pids, &placed.cpu);
        let outcome = load::run(plan, targets, live, watcher).await;
        let cpu_after = probes::cpu_snapshot(&self.pids, &placed.cpu);
        let wsrep_after = placed.wsrep(false).await;
        bar.finish_and_clear();
        if let Some((target, _)) = &self.sql_target {
            target.close().await;
        }
        Loaded {
            outcome,
            cpu: probes::cpu_seconds(&cpu_before, &cpu_after, hz),
            wsrep_after,
        }
    }

    /// The checks after the load, as the run's kind allows.
    async fn check(
        &mut self,
        outcome: &LoadOutcome,
        workload: &Workload,
        tokens: Option<&BuyerTokens>,
    ) -> Verdict {
        if self.ceiling {
            ceiling_verdict(outcome)
        } else if let Some((_, clients)) = &self.sql_target {
            self.sql_verdict(outcome, workload, *clients).await
        } else {
            self.served_verdict(outcome, workload, tokens).await
        }
    }

    /// The SQL run's checks. No server ran the load: nothing of one is left to settle
    /// or to ask. What the client saw and the orders table are checked as for the
    /// baselines.
    async fn sql_verdict(
        &self,
        outcome: &LoadOutcome,
        workload: &Workload,
        clients: u64,
    ) -> Verdict {
        eprintln!(
            "flashsale-bench: load done in {:.2}s ({clients} MariaDB clients)",
            outcome.elapsed.as_secs_f64()
        );
        let mut checks = Checks::default();
        let rec = &outcome.recorder;
        client_checks(&mut checks, rec, self.sizes, None, true);
        checks.skipped.push(
            "the server's own count of its answers and the acknowledged orders read back through the API: the SQL run has no server (the orders table's check below finds every acknowledged order by its request_id)"
                .into(),
        );
        self.check_ledger(&mut checks, workload, rec).await;
        checks.skipped.push(
            "flashsale audit: the SQL run is db-conditional's transaction, a baseline's (no reservation rows, no Redis holds)"
                .into(),
        );
        checks.audit = skipped_audit(format!(
            "skipped: {} is a baseline's transaction",
            self.spec.label
        ));
        Verdict {
            checks,
            ..Verdict::default()
        }
    }

    /// A run with servers: wait for them to go quiet, then check what the client saw
    /// against what they answer now, the orders table, the expiries and the audit.
    async fn served_verdict(
        &mut self,
        outcome: &LoadOutcome,
        workload: &Workload,
        tokens: Option<&BuyerTokens>,
    ) -> Verdict {
        let sizes = self.sizes;
        let mut v = Verdict::default();
        self.settle(outcome, &mut v).await;
        let rec = &outcome.recorder;
        let checks = &mut v.checks;
        // The reads below are no admin calls: any server of the sale answers them, and
        // the first may be the one a test killed.
        let reads_url = first_answering(&self.http, &self.base_urls, checks).await;
        let product_url = format!("{reads_url}/v1/products/{}", self.product_id);
        v.inventory = get_json::<ProductView>(&self.http, &product_url, None)
            .await
            .map(|p| p.inventory);
        client_checks(checks, rec, sizes, v.inventory.as_ref(), self.baseline);
        let comparable = self.spawned && outcome.abandoned == 0;
        check_server_counts(checks, &self.http, &self.base_urls, rec, comparable).await;
        let (http, baseline) = (&self.http, self.baseline);
        check_acknowledged(checks, http, &reads_url, workload, rec, baseline, tokens).await;
        self.check_ledger(checks, workload, rec).await;
        if sizes.follow_ups && sizes.payment_timeout.is_some() {
            v.expiry = check_expired(checks, http, &reads_url, rec, tokens).await;
        }
        checks.audit = self.audit(checks).await;
        v
    }

    /// Waits for the system to go quiet (the unpaid orders' expiry too, when the run
    /// leaves some), then reads Redis as it settled.
    async fn settle(&mut self, outcome: &LoadOutcome, v: &mut Verdict) {
        let mut quiet = QUIET_WAIT;
        if let (true, Some(t)) = (self.sizes.follow_ups, self.sizes.payment_timeout) {
            quiet += t + EXPIRY_SLACK;
        }
        eprintln!(
            "flashsale-bench: load done in {:.2}s; waiting {:.0}s for the system to go quiet",
            outcome.elapsed.as_secs_f64(),
            quiet.as_secs_f64()
        );
        tokio::time::sleep(quiet).await;
        v.redis_settled = redis_snapshot(&mut self.redis).await;
        v.keys_settled = count_keys(&mut self.redis, &self.env.redis_prefix).await;
    }

    /// `check_ledger` on this run's database and product.
    async fn check_ledger(&self, checks: &mut Checks, workload: &Workload, rec: &Recorder) {
        let url = &self.env.database_url;
        check_ledger(checks, url, self.product_id, self.sizes, workload, rec).await;
    }

    /// `flashsale audit` of the product, unless it does not apply (a baseline) or was
    /// turned off.
    async fn audit(&self, checks: &mut Checks) -> AuditOutcome {
        if self.baseline {
            checks.skipped.push(
                "flashsale audit: it checks flashsale's reservation rows, Redis holds, per-user limits and outbox, which the baselines do not write or enforce; the checks of it that apply run instead (orders table: units in live orders ≤ stock, one order per request_id, every acknowledged order present)"
                    .into(),
            );
            skipped_audit(format!(
                "skipped: {} is a baseline strategy (no reservation rows, no Redis holds)",
                self.spec.label
            ))
        } else if self.args.no_audit {
            skipped_audit("skipped with --no-audit".into())
        } else {
            run_audit(&self.args.server_bin, &self.env, self.product_id).await
        }
    }
}

/// The ceiling's checks: none; it sends no purchase.
fn ceiling_verdict(outcome: &LoadOutcome) -> Verdict {
    eprintln!(
        "flashsale-bench: load done in {:.2}s",
        outcome.elapsed.as_secs_f64()
    );
    let mut checks = Checks::default();
    checks.skipped.push(
        "order checks and audit: the HTTP ceiling sends no purchase, so there is nothing to check"
            .into(),
    );
    checks.audit = skipped_audit("HTTP ceiling run: no orders to audit".into());
    Verdict {
        checks,
        ..Verdict::default()
    }
}

/// An audit not run, and why.
fn skipped_audit(output: String) -> AuditOutcome {
    AuditOutcome {
        status: "skipped".into(),
        runs: 0,
        output,
    }
}

/// First Ctrl-C: stop dispatching, finish and report (a `--compare` starts no further
/// run). Second: exit at once (killing the spawned servers, whose database and keys are
/// then left behind).
fn watch_ctrl_c(live: Arc<Live>, spawned_pids: Vec<u32>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_err() {
            return;
        }
        eprintln!("\nflashsale-bench: interrupted; finishing the requests in flight (Ctrl-C again to quit at once)");
        live.stop.store(true, Ordering::Relaxed);
        INTERRUPTED.store(true, Ordering::Relaxed);
        if tokio::signal::ctrl_c().await.is_err() {
            return;
        }
        for pid in spawned_pids {
            // SAFETY: kill(2) on a server we spawned, with a valid signal number; this
            // task is aborted when its run ends, before the servers are reaped.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
            eprintln!("flashsale-bench: killed server {pid}; its database and Redis keys (fs_bench_*) are left behind");
        }
        std::process::exit(130);
    })
}

/// The run's progress bar (hidden with --no-progress) and what updates it, sampling the
/// servers' memory as it goes.
fn progress_bar(hidden: bool, attempts: u64, pids: &[u32]) -> (ProgressBar, Arc<Progress>) {
    let bar = if hidden {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(attempts)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30.cyan/blue} {pos}/{len} attempts · {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let watcher = Arc::new(Progress {
        bar: bar.clone(),
        total: attempts,
        pids: pids.to_vec(),
    });
    (bar, watcher)
}

struct Progress {
    bar: ProgressBar,
    total: u64,
    /// The servers whose memory is sampled (summed).
    pids: Vec<u32>,
}

impl Watcher for Progress {
    fn tick(&self, live: &Live, elapsed: Duration) {
        let taken = live.taken.load(Ordering::Relaxed).min(self.total);
        let answers = live.answers.load(Ordering::Relaxed);
        let rate = answers as f64 / elapsed.as_secs_f64().max(1e-3);
        self.bar.set_position(taken);
        self.bar.set_message(format!(
            "{rate:.0} answers/s · 201: {} · 4xx: {} · 5xx: {} · no answer: {} · dropped: {}",
            live.orders.load(Ordering::Relaxed),
            live.rejected.load(Ordering::Relaxed),
            live.unavailable.load(Ordering::Relaxed),
            live.transport.load(Ordering::Relaxed),
            live.dropped.load(Ordering::Relaxed),
        ));
    }

    fn rss_kb(&self) -> Option<u64> {
        probes::servers_memory(&self.pids).and_then(|m| m.vm_rss_kb)
    }
}

async fn create_product(
    http: &reqwest::Client,
    base_url: &str,
    token: &str,
    product_id: i64,
    args: &Args,
    sizes: &Sizes,
) -> Result<(), String> {
    let mut body = serde_json::json!({
        "product_id": product_id,
        "name": format!("flashsale-bench {}", args.scenario.name()),
        "stock": sizes.stock,
    });
    if let Some(limit) = sizes.per_user_limit {
        body["per_user_limit"] = limit.into();
    }
    let response = http
        .post(format!("{base_url}/v1/products"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .map_err(|e| format!("create product at {base_url}: {e}"))?;
    let status = response.status();
    if status.as_u16() != 201 {
        let text = response.text().await.unwrap_or_default();
        return Err(format!("create product {product_id}: {status} {text}"));
    }
    Ok(())
}

/// The JSON answer of a GET, sent with `authorization` (a buyer's token) when given.
async fn get_json<T: serde::de::DeserializeOwned>(
    http: &reqwest::Client,
    url: &str,
    authorization: Option<&hyper::header::HeaderValue>,
) -> Option<T> {
    let mut request = http.get(url);
    if let Some(value) = authorization {
        request = request.header(reqwest::header::AUTHORIZATION, value.as_bytes());
    }
    let response = request.send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.json().await.ok()
}

/// A probe's reading; a failed one is printed and the report goes without it.
fn reported<T>(reading: Result<T, String>) -> Option<T> {
    reading.map_err(|e| eprintln!("flashsale-bench: {e}")).ok()
}

async fn redis_snapshot(redis: &mut Option<RedisProbe>) -> Option<RedisSnapshot> {
    reported(redis.as_mut()?.snapshot().await)
}

async fn count_keys(redis: &mut Option<RedisProbe>, prefix: &str) -> Option<u64> {
    reported(redis.as_mut()?.count_keys(prefix).await).flatten()
}

async fn commits(mysql: &mut Option<MysqlProbe>) -> Option<CommitCounters> {
    reported(mysql.as_mut()?.commits().await)
}

fn listed<T: std::fmt::Debug>(items: &[T]) -> String {
    let shown: Vec<String> = items
        .iter()
        .take(LISTED_MAX)
        .map(|i| format!("{i:?}"))
        .collect();
    if items.len() > LISTED_MAX {
        format!("{} …", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

/// Why the inventory checks are skipped for a baseline.
const BASELINE_INVENTORY_NOTE: &str = "the baselines keep no reservation rows and no Redis \
    holds: db-pessimistic and db-conditional move only MariaDB's counters, redis-lua only \
    Redis's (http-post-ceiling moves nothing), so the API's inventory view (available from \
    Redis, reserved and sold from MariaDB) does not add up by design";

/// The first of `base_urls` that answers `GET /healthz` now, for the reads after the
/// load (the first one unless it stopped answering, which is noted in `checks`); the
/// first one when none does (the reads then fail and say so).
async fn first_answering(
    http: &reqwest::Client,
    base_urls: &[String],
    checks: &mut Checks,
) -> String {
    for (i, url) in base_urls.iter().enumerate() {
        let answered = http
            .get(format!("{url}/healthz"))
            .timeout(load::CONNECT_TIMEOUT)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if answered {
            if i > 0 {
                let skipped = base_urls[..i].join(", ");
                eprintln!(
                    "flashsale-bench: {skipped} no longer answering; the checks read from {url}"
                );
                checks.skipped.push(format!(
                    "reads after the load from {skipped}: no answer to GET /healthz after the load; the product, the acknowledged orders and the expiries were read from {url}"
                ));
            }
            return url.clone();
        }
    }
    base_urls.first().cloned().unwrap_or_default()
}

/// Each server's own count of its purchase answers (`GET /metrics`) against what the
/// generator received from it, outcome by outcome: `created` = the 201s, `replayed` =
/// the 200s, each error code = the answers carrying it. Only on servers the bench
/// spawned (their counters start with the run) when no attempt was abandoned at the
/// drain bound (`comparable`), and only for a server whose every exchange was answered
/// (one lost in transit may have been answered and counted).
async fn check_server_counts(
    checks: &mut Checks,
    http: &reqwest::Client,
    base_urls: &[String],
    rec: &Recorder,
    comparable: bool,
) {
    let what = "the server's own count of its purchase answers (GET /metrics)";
    if !comparable {
        checks.skipped.push(format!(
            "{what}: the server was not started by the bench (its counters hold other clients' answers too), or some attempts were abandoned unanswered"
        ));
        return;
    }
    let nothing = stats::TargetStats::default();
    for (i, base_url) in base_urls.iter().enumerate() {
        let at = if base_urls.len() > 1 {
            format!(" at {base_url}")
        } else {
            String::new()
        };
        let sent = rec.targets.get(i).unwrap_or(&nothing);
        if sent.statuses.get(&0).copied().unwrap_or(0) > 0 {
            checks.skipped.push(format!(
                "{what}{at}: some attempts got no answer, which the server may still have counted"
            ));
            continue;
        }
        let text = match http.get(format!("{base_url}/metrics")).send().await {
            Ok(r) if r.status().is_success() => r.text().await.ok(),
            _ => None,
        };
        let Some(text) = text else {
            checks
                .client_violations
                .push(format!("{what}{at}: GET /metrics did not answer"));
            continue;
        };
        let server = probes::responses_by_outcome(&text, "purchase");
        match compare_counts(&sent.statuses, &sent.errors, &server) {
            Ok(answered) => checks.client_passed.push(format!(
                "{what}{at} agrees with the generator's, outcome by outcome ({answered} answers)"
            )),
            Err(client) => checks.client_violations.push(format!(
                "{what}{at} differs from the generator's: server {server:?}, generator {client:?}"
            )),
        }
    }
}

/// The generator's purchase answers from one server (`statuses`, `errors`) by the
/// server's outcome names (`created` for 201, `replayed` for 200, else the error code)
/// against the server's: Ok(answers) when they are equal, Err(the generator's) when not.
fn compare_counts(
    statuses: &BTreeMap<u16, u64>,
    errors: &BTreeMap<String, u64>,
    server: &BTreeMap<String, u64>,
) -> Result<u64, BTreeMap<String, u64>> {
    let mut client: BTreeMap<String, u64> = errors.clone();
    for (status, outcome) in [(201, "created"), (200, "replayed")] {
        if let Some(&n) = statuses.get(&status) {
            client.insert(outcome.to_owned(), n);
        }
    }
    if &client == server {
        Ok(statuses.values().sum())
    } else {
        Err(client)
    }
}

/// The checks that need only what the client saw and the product's inventory. For a
/// baseline (`baseline`), the inventory checks are skipped (and listed as such).
fn client_checks(
    checks: &mut Checks,
    rec: &Recorder,
    sizes: &Sizes,
    inventory: Option<&Inventory>,
    baseline: bool,
) {
    let ok = |c: &mut Checks, good: bool, pass: String, fail: String| {
        if good {
            c.client_passed.push(pass);
        } else {
            c.client_violations.push(fail);
        }
    };
    ok(
        checks,
        rec.conflicts_total == 0,
        format!(
            "every request_id answered with one order id ({} acknowledged)",
            rec.acks.len()
        ),
        format!(
            "{} answers gave a request_id another order id than before: {}",
            rec.conflicts_total,
            listed(&rec.conflicts)
        ),
    );
    let shared = rec.shared_orders();
    ok(
        checks,
        shared.is_empty(),
        "no order id acknowledged for two request_ids".into(),
        format!(
            "{} order ids were acknowledged for several request_ids (order, intents): {}",
            shared.len(),
            listed(&shared)
        ),
    );
    let acked = rec.acks.len() as u64;
    let stock = sizes.stock.max(0) as u64;
    if sizes.follow_ups {
        ok(
            checks,
            rec.paid <= stock,
            format!("orders paid {} ≤ stock {stock}", rec.paid),
            format!("orders paid {} exceed the stock {stock}", rec.paid),
        );
        let bound = stock + rec.cancelled + rec.left_to_expire;
        ok(
            checks,
            acked <= bound,
            format!("orders acknowledged {acked} ≤ stock + cancelled + left to expire = {bound}"),
            format!(
                "orders acknowledged {acked} exceed stock + cancelled + left to expire = {bound}"
            ),
        );
    } else {
        ok(
            checks,
            acked <= stock,
            format!("orders acknowledged {acked} ≤ stock {stock}"),
            format!("orders acknowledged {acked} exceed the stock {stock} (oversell)"),
        );
    }
    if baseline {
        checks.skipped.push(format!(
            "inventory consistent (available + reserved + sold = total) and acknowledged orders hold stock (≤ reserved + sold): {BASELINE_INVENTORY_NOTE}"
        ));
        return;
    }
    // Attempts that got no definite answer (a server killed mid-run): each may hold a
    // unit in Redis that no order accounts for yet, until the server's recovery settles
    // it (FLASHSALE_RECOVERY_AFTER, 30 s by default).
    let unknown: u64 = rec.targets.iter().map(stats::TargetStats::unknown).sum();
    match inventory {
        Some(i) => {
            let held = i.total - (i.available + i.reserved + i.sold);
            ok(
                checks,
                i.total == sizes.stock
                    && i.available >= 0
                    && held >= 0
                    && held.unsigned_abs() <= unknown,
                if held == 0 {
                    format!(
                        "inventory consistent: available {} + reserved {} + sold {} = total {}",
                        i.available, i.reserved, i.sold, i.total
                    )
                } else {
                    format!(
                        "inventory consistent but for {held} unit{} held by attempts of unknown outcome ({unknown} got no answer or a 5xx), which the server's recovery settles after FLASHSALE_RECOVERY_AFTER: available {} + reserved {} + sold {} = total {} − {held}",
                        if held == 1 { "" } else { "s" },
                        i.available, i.reserved, i.sold, i.total
                    )
                },
                format!(
                    "inventory inconsistent: available {} + reserved {} + sold {} vs total {} (stock {}; {unknown} attempts of unknown outcome)",
                    i.available, i.reserved, i.sold, i.total, sizes.stock
                ),
            );
            if sizes.follow_ups {
                ok(
                    checks,
                    rec.paid <= i.sold.max(0) as u64,
                    format!(
                        "every acknowledged payment is sold ({} ≤ {})",
                        rec.paid, i.sold
                    ),
                    format!(
                        "{} payments acknowledged but only {} units sold",
                        rec.paid, i.sold
                    ),
                );
            } else {
                let held = (i.reserved + i.sold).max(0) as u64;
                ok(
                    checks,
                    acked <= held,
                    format!("every acknowledged order holds stock ({acked} ≤ reserved + sold {held})"),
                    format!(
                        "{acked} orders acknowledged but only {held} units reserved or sold (acknowledged loss)"
                    ),
                );
            }
        }
        None => checks
            .client_violations
            .push("could not read the product's inventory after the run".into()),
    }
}

/// Looks up a sample of acknowledged orders: each must exist with the order id and the
/// request_id it was acknowledged with. flashsale's orders are looked up by request_id
/// (`GET /v1/purchases/{request_id}`, I5 from the client's side); that lookup reads the
/// reservation rows, which a baseline does not write, so a baseline's are looked up by
/// order id (`GET /v1/orders/{id}`) instead, and the by-request_id lookup is listed as
/// skipped.
async fn check_acknowledged(
    checks: &mut Checks,
    http: &reqwest::Client,
    base_url: &str,
    workload: &Workload,
    rec: &Recorder,
    baseline: bool,
    tokens: Option<&BuyerTokens>,
) {
    let mut intents: Vec<(&u64, &i64)> = rec.acks.iter().collect();
    intents.sort_unstable();
    // Spread the sample over the whole run.
    let step = (intents.len() / ACK_SAMPLE_MAX).max(1);
    let sample: Vec<(u64, i64)> = intents
        .iter()
        .step_by(step)
        .take(ACK_SAMPLE_MAX)
        .map(|(i, o)| (**i, **o))
        .collect();
    let mut bad = Vec::new();
    for (intent, order_id) in &sample {
        let rid = workload.request_id(*intent);
        let url = if baseline {
            format!("{base_url}/v1/orders/{order_id}")
        } else {
            format!("{base_url}/v1/purchases/{rid}")
        };
        let authorization = tokens.and_then(|t| t.of(workload.user_of(*intent)));
        match get_json::<OrderView>(http, &url, authorization).await {
            Some(o) if o.order_id == *order_id && o.request_id.as_deref() == Some(&rid) => {}
            Some(o) => bad.push(format!(
                "{rid}: acknowledged order {order_id}, now order {} of request_id {}",
                o.order_id,
                o.request_id.as_deref().unwrap_or("?")
            )),
            None => bad.push(format!("{rid}: acknowledged order {order_id} not found")),
        }
    }
    let how = if baseline {
        checks.skipped.push(
            "acknowledged orders looked up by request_id (GET /v1/purchases/{request_id}): that lookup reads flashsale's reservation rows, which the baselines do not write; looked up by order id (GET /v1/orders/{id}) instead"
                .into(),
        );
        "by order id"
    } else {
        "by request_id"
    };
    if bad.is_empty() {
        checks.client_passed.push(format!(
            "{} sampled acknowledged orders found again {how} with the same order id and request_id",
            sample.len()
        ));
    } else {
        checks.client_violations.push(format!(
            "{} of {} sampled acknowledged orders missing or changed (looked up {how}): {}",
            bad.len(),
            sample.len(),
            listed(&bad)
        ));
    }
}

/// Checks the server's orders table itself — the part of `flashsale audit` that holds
/// for every strategy, the baselines included: units in live orders ≤ stock, no
/// request_id with two orders, and every acknowledged order present under the
/// request_id it was acknowledged for.
async fn check_ledger(
    checks: &mut Checks,
    database_url: &str,
    product_id: i64,
    sizes: &Sizes,
    workload: &Workload,
    rec: &Recorder,
) {
    let mut probe = match OrdersProbe::connect(database_url).await {
        Ok(p) => p,
        Err(e) => {
            checks
                .client_violations
                .push(format!("could not read the orders table: {e}"));
            return;
        }
    };
    let found = ledger_checks(checks, &mut probe, product_id, sizes, workload, rec).await;
    probe.close().await;
    if let Err(e) = found {
        checks
            .client_violations
            .push(format!("could not read the orders table: {e}"));
    }
}

async fn ledger_checks(
    checks: &mut Checks,
    probe: &mut OrdersProbe,
    product_id: i64,
    sizes: &Sizes,
    workload: &Workload,
    rec: &Recorder,
) -> Result<(), String> {
    let facts = probe.facts(product_id).await?;
    let stock = sizes.stock;
    if facts.live_units <= stock {
        checks.client_passed.push(format!(
            "orders table: {} units in live orders ≤ stock {stock} ({} order rows)",
            facts.live_units, facts.orders
        ));
    } else {
        checks.client_violations.push(format!(
            "orders table: {} units in live orders exceed the stock {stock} (oversell)",
            facts.live_units
        ));
    }
    if facts.duplicates.is_empty() {
        checks
            .client_passed
            .push("orders table: no request_id has two orders".into());
    } else {
        checks.client_violations.push(format!(
            "orders table: request_ids with several orders: {}",
            listed(&facts.duplicates)
        ));
    }
    // Every acknowledged order, by id → the intent it was acknowledged for; the table is
    // read in pages by id and each acknowledged order crossed off when found.
    let mut expected: HashMap<i64, u64> = rec
        .acks
        .iter()
        .map(|(&intent, &order)| (order, intent))
        .collect();
    let acknowledged = expected.len();
    let mut wrong = Vec::new();
    let mut after = 0i64;
    // Bounded by the rows counted above (plus one page for rows added meanwhile).
    for _ in 0..=facts.orders / LEDGER_PAGE + 1 {
        let page = probe.orders_after(product_id, after, LEDGER_PAGE).await?;
        for (id, request_id) in &page {
            if let Some(intent) = expected.remove(id) {
                let want = workload.request_id(intent);
                if *request_id != want {
                    wrong.push(format!(
                        "order {id} has request_id {request_id}, acknowledged for {want}"
                    ));
                }
            }
        }
        match page.last() {
            Some((id, _)) if page.len() as u64 == LEDGER_PAGE => after = *id,
            _ => break,
        }
    }
    let mut missing: Vec<String> = expected
        .iter()
        .map(|(order, intent)| format!("{} → order {order}", workload.request_id(*intent)))
        .collect();
    missing.sort_unstable();
    if missing.is_empty() && wrong.is_empty() {
        checks.client_passed.push(format!(
            "orders table: all {acknowledged} acknowledged orders present under their request_id"
        ));
    }
    if !missing.is_empty() {
        checks.client_violations.push(format!(
            "orders table: {} of {acknowledged} acknowledged orders missing: {}",
            missing.len(),
            listed(&missing)
        ));
    }
    if !wrong.is_empty() {
        checks.client_violations.push(format!(
            "orders table: {} acknowledged orders under another request_id: {}",
            wrong.len(),
            listed(&wrong)
        ));
    }
    Ok(())
}

/// Checks the sampled orders left unpaid were cancelled by the payment timeout.
async fn check_expired(
    checks: &mut Checks,
    http: &reqwest::Client,
    base_url: &str,
    rec: &Recorder,
    tokens: Option<&BuyerTokens>,
) -> (u64, u64) {
    let mut pending: Vec<i64> = rec.expire_sample.iter().map(|(o, _)| *o).collect();
    let buyers: BTreeMap<i64, i64> = rec.expire_sample.iter().copied().collect();
    let checked = pending.len() as u64;
    let mut wrong: BTreeMap<i64, String> = BTreeMap::new();
    for round in 0..=EXPIRY_RECHECKS_MAX {
        if round > 0 {
            tokio::time::sleep(EXPIRY_SLACK).await;
        }
        let mut still = Vec::new();
        for order_id in pending {
            let authorization = tokens
                .zip(buyers.get(&order_id))
                .and_then(|(t, user)| t.of(*user));
            let url = format!("{base_url}/v1/orders/{order_id}");
            match get_json::<OrderView>(http, &url, authorization).await {
                Some(o)
                    if o.status == "CANCELLED"
                        && o.cancel_reason.as_deref() == Some("payment_timeout") =>
                {
                    wrong.remove(&order_id);
                }
                Some(o) => {
                    wrong.insert(
                        order_id,
                        format!("{} {}", o.status, o.cancel_reason.unwrap_or_default()),
                    );
                    // Only a still-unpaid order can yet expire.
                    if o.status == "PENDING_PAYMENT" {
                        still.push(order_id);
                    }
                }
                None => {
                    wrong.insert(order_id, "not found".into());
                    still.push(order_id);
                }
            }
        }
        pending = still;
        if pending.is_empty() {
            break;
        }
    }
    let confirmed = checked - wrong.len() as u64;
    if wrong.is_empty() {
        checks.client_passed.push(format!(
            "{checked} sampled unpaid orders were cancelled by the payment timeout"
        ));
    } else {
        let shown: Vec<String> = wrong.iter().map(|(o, s)| format!("{o}: {s}")).collect();
        checks.client_violations.push(format!(
            "{} of {checked} sampled unpaid orders did not expire: {}",
            wrong.len(),
            listed(&shown)
        ));
    }
    (checked, confirmed)
}

async fn run_audit(bin: &std::path::Path, env: &ServerEnv, product_id: i64) -> AuditOutcome {
    let mut last = AuditOutcome::default();
    for run in 1..=AUDIT_RUNS_MAX {
        if run > 1 {
            tokio::time::sleep(AUDIT_PAUSE).await;
        }
        last.runs = run;
        match server::audit(bin, env, product_id).await {
            Ok(a) if a.passed => {
                last.status = "passed".into();
                last.output = a.output;
                return last;
            }
            Ok(a) if a.violations => {
                last.status = "failed".into();
                last.output = a.output;
                if run < AUDIT_RUNS_MAX {
                    eprintln!(
                        "flashsale-bench: audit run {run} found violations; the system may still be settling, running it again in {:.0}s",
                        AUDIT_PAUSE.as_secs_f64()
                    );
                }
            }
            // It failed without a report (wrong binary, unreachable store): running it
            // again won't help.
            Ok(a) => {
                last.status = "error".into();
                last.output = a.output;
                return last;
            }
            // It could not run at all (binary missing, timeout): retrying won't help.
            Err(e) => {
                last.status = "error".into();
                last.output = e;
                return last;
            }
        }
    }
    last
}

struct Built<'a> {
    args: &'a Args,
    spec: &'a RunSpec,
    sizes: &'a Sizes,
    mode: Mode,
    product_id: i64,
    seed: u64,
    /// The load's targets, the first one (product, admin calls) first.
    base_urls: &'a [String],
    spawned: bool,
    started_at: String,
    outcome: &'a LoadOutcome,
    redis: [&'a Option<RedisSnapshot>; 3],
    commits: [Option<CommitCounters>; 2],
    keys: [Option<u64>; 3],
    proc: Option<probes::ProcMemory>,
    /// CPU seconds over the load by process name (`probes::cpu_seconds`).
    cpu: BTreeMap<String, f64>,
    /// A Galera cluster's `wsrep_` values before and after the load.
    wsrep: [Option<nodes::WsrepSnapshot>; 2],
    /// `Database::name` of where the ledger lived.
    database: Option<&'static str>,
    inventory: Option<Inventory>,
    expiry: (u64, u64),
    checks: Checks,
    passed: bool,
}

fn per(n: Option<u64>, d: u64) -> Option<f64> {
    n.filter(|_| d > 0).map(|n| n as f64 / d as f64)
}

fn build_result(b: Built<'_>) -> BenchResult {
    let o = b.outcome;
    let rec = &o.recorder;
    let secs = o.elapsed.as_secs_f64().max(1e-9);
    let answers: u64 = Op::ALL.iter().map(|&op| rec.op(op).latency.len()).sum();
    let main_op = match b.spec.target {
        Target::Purchase | Target::Sql => Op::Purchase,
        Target::Healthz => Op::Healthz,
    };
    let ops = Op::ALL
        .iter()
        .filter(|&&op| op == main_op || !rec.op(op).latency.is_empty())
        .map(|&op| {
            let s = rec.op(op);
            OpResult {
                op: op.name().into(),
                latency: stats::summarize(&s.latency),
                curve: stats::percentile_curve(&s.latency),
                statuses: s
                    .statuses
                    .iter()
                    .map(|(k, v)| (k.to_string(), *v))
                    .collect(),
                errors: s.errors.clone(),
            }
        })
        .collect();

    let [redis_before, redis_after, redis_settled] = b.redis;
    let calls = match (redis_before, redis_after) {
        (Some(x), Some(y)) => Some(probes::calls_delta(x, y)),
        _ => None,
    };
    let redis_commands = calls.as_ref().map(|c| c.values().sum::<u64>());
    let redis_script_calls = calls.as_ref().map(probes::script_calls);
    let (com_commit, handler_commit) = match b.commits {
        [Some(x), Some(y)] => (
            Some(y.com_commit.saturating_sub(x.com_commit)),
            Some(y.handler_commit.saturating_sub(x.handler_commit)),
        ),
        _ => (None, None),
    };
    let orders = rec.created;
    let sent = o.taken.saturating_sub(rec.dropped);
    let used = |s: &Option<RedisSnapshot>| s.as_ref().and_then(|s| s.used_memory);
    let (mem_before, mem_after) = (used(redis_before), used(redis_after));
    let redis_bytes_per_order = match (mem_before, mem_after) {
        (Some(x), Some(y)) if orders > 0 => Some((y as f64 - x as f64) / orders as f64),
        _ => None,
    };
    let config = run_config(&b);
    let mut stopped_early = o.stopped_early.clone();
    if o.abandoned > 0 {
        let note = format!(
            "{} requests abandoned in flight at the drain bound",
            o.abandoned
        );
        stopped_early = Some(match stopped_early {
            Some(s) => format!("{s}; {note}"),
            None => note,
        });
    }
    BenchResult {
        schema: report::SCHEMA.into(),
        scenario: b.args.scenario.name().into(),
        started_at: b.started_at,
        config,
        elapsed_s: o.elapsed.as_secs_f64(),
        attempts: AttemptCounts {
            sent,
            new_intents: o.new_intents,
            client_retries: o.client_retries,
            retries_503: rec.retries_503,
            gave_up: rec.gave_up,
            dropped: rec.dropped,
            stopped_early,
        },
        throughput: Throughput {
            answers_per_s: answers as f64 / secs,
            orders_per_s: orders as f64 / secs,
        },
        ops,
        targets: target_results(b.base_urls, &rec.targets),
        orders: OrderCounts {
            acknowledged: rec.acks.len() as u64,
            created: rec.created,
            replayed: rec.replayed,
            paid: rec.paid,
            cancelled: rec.cancelled,
            left_to_expire: rec.left_to_expire,
            expiry_checked: b.expiry.0,
            expiry_confirmed: b.expiry.1,
        },
        timeline: rec.timeline.buckets().to_vec(),
        timeline_step_ms: rec.timeline.step_ms(),
        costs: Costs {
            redis_script_calls,
            redis_commands,
            redis_commands_by_command: calls.unwrap_or_default(),
            com_commit,
            handler_commit,
            redis_script_calls_per_order: per(redis_script_calls, orders),
            redis_commands_per_order: per(redis_commands, orders),
            com_commit_per_order: per(com_commit, orders),
            handler_commit_per_order: per(handler_commit, orders),
            redis_script_calls_per_attempt: per(redis_script_calls, sent),
            redis_commands_per_attempt: per(redis_commands, sent),
            note: COST_NOTE.into(),
        },
        memory: Memory {
            server_vm_hwm_kb: b.proc.and_then(|p| p.vm_hwm_kb),
            server_vm_rss_kb: b.proc.and_then(|p| p.vm_rss_kb),
            redis_used_memory_before: mem_before,
            redis_used_memory_after: mem_after,
            redis_used_memory_settled: used(redis_settled),
            redis_bytes_per_order,
            keys_before: b.keys[0],
            keys_after: b.keys[1],
            keys_settled: b.keys[2],
        },
        cpu: Cpu {
            us_per_attempt: per_unit(&b.cpu, sent),
            us_per_order: per_unit(&b.cpu, orders),
            seconds: b.cpu,
        },
        galera: nodes::figures(b.wsrep[0].as_ref(), b.wsrep[1].as_ref(), secs, orders),
        inventory: b.inventory,
        checks: b.checks,
        passed: b.passed,
    }
}

/// How the run was configured, for the report.
fn run_config(b: &Built<'_>) -> RunConfig {
    let (connections, rate, max_in_flight, mode) = match b.mode {
        Mode::Closed { connections } => (Some(connections), None, None, "closed"),
        Mode::Open {
            rate,
            max_in_flight,
        } => (None, Some(rate), Some(max_in_flight), "open"),
    };
    RunConfig {
        mode: mode.into(),
        connections,
        rate_per_s: rate,
        max_in_flight,
        attempts_max: b.sizes.attempts,
        duration_max_s: b.sizes.duration.as_secs_f64(),
        users: b.sizes.users,
        stock: b.sizes.stock,
        per_user_limit: b.sizes.per_user_limit,
        retry_share: b.args.retry_share,
        pay_share: if b.sizes.follow_ups {
            b.args.pay_share
        } else {
            0.0
        },
        cancel_share: if b.sizes.follow_ups {
            b.args.cancel_share
        } else {
            0.0
        },
        payment_timeout_ms: b
            .sizes
            .payment_timeout
            .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
        quick: b.args.quick,
        spawned: b.spawned,
        base_url: b.base_urls.first().cloned().unwrap_or_default(),
        product_id: b.product_id,
        seed: b.seed,
        target: b.spec.target.name().into(),
        strategy: b.spec.strategy.map(|s| s.name().to_owned()),
        database: b.database.map(str::to_owned),
    }
}

/// Each target's figures for the report, in the order of `base_urls` (a target that got
/// nothing has zeros).
fn target_results(base_urls: &[String], stats: &[stats::TargetStats]) -> Vec<report::TargetResult> {
    let named = |m: &BTreeMap<u16, u64>| -> BTreeMap<String, u64> {
        m.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    };
    let nothing = stats::TargetStats::default();
    base_urls
        .iter()
        .enumerate()
        .map(|(i, url)| {
            let t = stats.get(i).unwrap_or(&nothing);
            report::TargetResult {
                base_url: url.clone(),
                attempts: t.attempts,
                outcomes: named(&t.outcomes),
                statuses: named(&t.statuses),
                errors: t.errors.clone(),
            }
        })
        .collect()
}

/// CPU seconds by name as µs per one of `n` things; empty when `n` is 0.
fn per_unit(seconds: &BTreeMap<String, f64>, n: u64) -> BTreeMap<String, f64> {
    if n == 0 {
        return BTreeMap::new();
    }
    seconds
        .iter()
        .map(|(name, s)| (name.clone(), s * 1e6 / n as f64))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the inventory check after a server stopped answering mid-run: units missing
    // from available + reserved + sold pass as held in flight when no more than the
    // attempts of unknown outcome (no answer, or a 5xx after the last re-send) could
    // hold, and are a violation otherwise — also when every attempt was answered.
    #[test]
    fn units_held_by_unanswered_attempts_are_not_a_loss() {
        let sizes = cli::defaults(cli::Scenario::Rush, true);
        let stock = sizes.stock;
        let inventory = |held: i64| Inventory {
            total: stock,
            available: 0,
            reserved: stock - held,
            sold: 0,
        };
        let recorder = |unanswered: u64, unavailable: u64| {
            let mut rec = Recorder::default();
            for _ in 0..unanswered {
                rec.record_target_attempt(1, 0);
            }
            for _ in 0..unavailable {
                rec.record_target_attempt(0, 503);
            }
            rec
        };
        let verdict = |rec: &Recorder, held: i64| {
            let mut checks = Checks::default();
            client_checks(&mut checks, rec, &sizes, Some(&inventory(held)), false);
            checks
        };
        let fine = verdict(&recorder(0, 0), 0);
        assert!(fine.client_violations.is_empty(), "{fine:?}");
        let after_a_kill = verdict(&recorder(4, 2), 6);
        assert!(
            after_a_kill.client_violations.is_empty(),
            "{after_a_kill:?}"
        );
        assert!(
            after_a_kill
                .client_passed
                .iter()
                .any(|l| l.contains("but for 6 units held by attempts of unknown outcome")),
            "{after_a_kill:?}"
        );
        for (rec, held) in [
            (recorder(0, 0), 1),
            (recorder(4, 2), 7),
            (recorder(4, 0), -1),
        ] {
            let checks = verdict(&rec, held);
            assert!(
                checks
                    .client_violations
                    .iter()
                    .any(|l| l.starts_with("inventory inconsistent")),
                "{held}: {checks:?}"
            );
        }
    }

    // Checks the comparison of the server's answer counts with the generator's: equal
    // maps (201s as created, 200s as replayed, error codes as themselves) agree and give
    // the number of answers; one answer more on either side, or an outcome named
    // differently, disagrees.
    #[test]
    fn server_counts_must_match_the_generators() {
        let purchases = stats::OpStats {
            statuses: BTreeMap::from([(201, 3), (200, 1), (409, 5)]),
            errors: BTreeMap::from([("sold_out".to_owned(), 5)]),
            ..Default::default()
        };
        let server = |pairs: &[(&str, u64)]| -> BTreeMap<String, u64> {
            pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
        };
        let compare = |server: &BTreeMap<String, u64>| {
            compare_counts(&purchases.statuses, &purchases.errors, server)
        };
        assert_eq!(
            compare(&server(&[("created", 3), ("replayed", 1), ("sold_out", 5)])),
            Ok(9)
        );
        for wrong in [
            server(&[("created", 4), ("replayed", 1), ("sold_out", 5)]),
            server(&[("created", 3), ("sold_out", 5)]),
            server(&[("created", 3), ("replayed", 1), ("limit_exceeded", 5)]),
        ] {
            assert!(compare(&wrong).is_err(), "{wrong:?}");
        }
    }
}
