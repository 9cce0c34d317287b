//! flashsale-bench: a load generator for flashsale (issue 4).
//!
//! A run: (optionally) start a server, create the product through the admin API, take
//! the stores' counters, drive the load (open or closed loop) while a progress bar runs,
//! take the counters again, let the system go quiet, check what the client saw (one
//! order per request_id, no more orders than stock, acknowledged orders exist, unpaid
//! orders expired), run `flashsale audit`, then print a summary and write the JSON and
//! HTML reports. Exit status 1 on any violation.

pub mod cli;
pub mod html;
pub mod load;
pub mod probes;
pub mod report;
pub mod schedule;
pub mod server;
pub mod stats;
pub mod workload;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use serde::Deserialize;

use cli::{Args, Sizes};
use load::{Live, LoadOutcome, LoadPlan, Mode, Watcher};
use probes::{CommitCounters, MysqlProbe, RedisProbe, RedisSnapshot};
use report::{
    AttemptCounts, AuditOutcome, BenchResult, Checks, Costs, Inventory, Memory, OpResult,
    OrderCounts, RunConfig, Throughput,
};
use server::{ServerEnv, Spawned};
use stats::{Op, Recorder};
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
/// Violations of one kind listed verbatim; the rest are counted.
const LISTED_MAX: usize = 10;
/// The note attached to the cost figures.
const COST_NOTE: &str = "Redis calls and MariaDB commits are server-wide counters \
    (INFO commandstats, SHOW GLOBAL STATUS): anything else using the same Redis or \
    MariaDB during the load (other tests, other services, the server's own background \
    workers) is counted too, so compare runs on a quiet box and read small runs with care. \
    commandstats also counts the commands a Lua script runs: \"script calls\" (EVAL, EVALSHA, \
    FCALL) are round trips, \"commands\" is all the work Redis did.";

/// Runs the benchmark; Ok(true) when no violation was found, Ok(false) when one was,
/// Err when the run could not be carried out.
pub async fn run(args: Args) -> Result<bool, String> {
    let sizes = args.sizes()?;
    let spawned = if args.spawn {
        eprintln!(
            "flashsale-bench: starting {} serve …",
            args.server_bin.display()
        );
        let s = server::spawn(server::SpawnOptions {
            bin: &args.server_bin,
            database_url: &args.database_url,
            redis_url: &args.redis_url,
            nats_url: &args.nats_url,
            payment_timeout: sizes.payment_timeout,
            extra_env: &args.server_env,
            log_level: &args.server_log_level,
            log_path: args.server_log.as_deref(),
        })
        .await?;
        eprintln!(
            "flashsale-bench: server pid {} on {} (database {}, Redis prefix {})",
            s.pid, s.base_url, s.env.database_url, s.env.redis_prefix
        );
        Some(s)
    } else {
        None
    };
    let result = run_against(&args, &sizes, spawned.as_ref()).await;
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
    status: String,
    cancel_reason: Option<String>,
}

async fn run_against(
    args: &Args,
    sizes: &Sizes,
    spawned: Option<&Spawned>,
) -> Result<bool, String> {
    let (base_url, token, env, pid) = match spawned {
        Some(s) => (
            s.base_url.clone(),
            s.admin_token.clone(),
            s.env.clone(),
            Some(s.pid),
        ),
        None => (
            args.base_url.trim_end_matches('/').to_owned(),
            args.admin_token.clone().ok_or(
                "the admin token is needed to create the product: --admin-token or FLASHSALE_ADMIN_TOKEN (or use --spawn)",
            )?,
            ServerEnv {
                database_url: args.database_url.clone(),
                redis_url: args.redis_url.clone(),
                redis_prefix: args.redis_prefix.clone(),
                nats: None,
            },
            args.server_pid,
        ),
    };
    let product_id = args.product_id.unwrap_or_else(|| {
        if spawned.is_some() {
            1
        } else {
            // A fresh id on a shared server: 10^9 ids, a collision is a 409 at creation.
            1_000_000_000 + rand::random_range(0..1_000_000_000i64)
        }
    });
    let seed = args.seed.unwrap_or_else(rand::random);
    let mode = match args.rate {
        Some(rate) => Mode::Open {
            rate,
            max_in_flight: args.max_in_flight,
        },
        None => Mode::Closed {
            connections: args.connections,
        },
    };
    let pool = match mode {
        Mode::Open { max_in_flight, .. } => max_in_flight,
        Mode::Closed { connections } => connections,
    };
    let http = load::http_client(usize::try_from(pool).unwrap_or(usize::MAX))?;

    create_product(&http, &base_url, &token, product_id, args, sizes).await?;

    let mut redis = match RedisProbe::connect(&env.redis_url).await {
        Ok(r) => Some(r),
        Err(e) => {
            eprintln!("flashsale-bench: Redis figures unavailable: {e}");
            None
        }
    };
    let mut mysql = match MysqlProbe::connect(&env.database_url).await {
        Ok(m) => Some(m),
        Err(e) => {
            eprintln!("flashsale-bench: MariaDB figures unavailable: {e}");
            None
        }
    };
    let keys_before = count_keys(&mut redis, &env.redis_prefix).await;
    let redis_before = redis_snapshot(&mut redis).await;
    let commits_before = commits(&mut mysql).await;

    let workload = Workload {
        tag: format!("B{:08x}", rand::random::<u32>()),
        seed,
        users: sizes.users,
        retry_share: args.retry_share,
        pay_share: if sizes.follow_ups {
            args.pay_share
        } else {
            0.0
        },
        cancel_share: if sizes.follow_ups {
            args.cancel_share
        } else {
            0.0
        },
    };
    let plan = LoadPlan {
        mode,
        attempts: sizes.attempts,
        duration: sizes.duration,
        workload: workload.clone(),
        product_id,
        base_url: base_url.clone(),
        follow_ups: sizes.follow_ups,
    };
    let live = Arc::new(Live::default());
    watch_ctrl_c(live.clone(), pid.filter(|_| spawned.is_some()));
    let bar = if args.no_progress {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(sizes.attempts)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30.cyan/blue} {pos}/{len} attempts · {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let watcher = Arc::new(Progress {
        bar: bar.clone(),
        total: sizes.attempts,
        pid,
    });
    let started_at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    eprintln!(
        "flashsale-bench: {} — product {product_id}, stock {}, {} attempts, {} users, {}",
        args.scenario.name(),
        sizes.stock,
        sizes.attempts,
        sizes.users,
        match mode {
            Mode::Open {
                rate,
                max_in_flight,
            } => format!("open loop at {rate}/s (in-flight cap {max_in_flight})"),
            Mode::Closed { connections } => format!("closed loop with {connections} connections"),
        }
    );
    let outcome = load::run(plan, http.clone(), live.clone(), watcher).await;
    bar.finish_and_clear();

    let redis_after = redis_snapshot(&mut redis).await;
    let commits_after = commits(&mut mysql).await;
    let keys_after = count_keys(&mut redis, &env.redis_prefix).await;
    let proc = pid.and_then(probes::proc_memory);

    let mut quiet = QUIET_WAIT;
    if let (true, Some(t)) = (sizes.follow_ups, sizes.payment_timeout) {
        quiet += t + EXPIRY_SLACK;
    }
    eprintln!(
        "flashsale-bench: load done in {:.2}s; waiting {:.0}s for the system to go quiet",
        outcome.elapsed.as_secs_f64(),
        quiet.as_secs_f64()
    );
    tokio::time::sleep(quiet).await;
    let redis_settled = redis_snapshot(&mut redis).await;
    let keys_settled = count_keys(&mut redis, &env.redis_prefix).await;
    if let Some(m) = mysql {
        m.close().await;
    }

    let rec = &outcome.recorder;
    let inventory = get_json::<ProductView>(&http, &format!("{base_url}/v1/products/{product_id}"))
        .await
        .map(|p| p.inventory);
    let mut checks = Checks::default();
    client_checks(&mut checks, rec, sizes, inventory.as_ref());
    check_acknowledged(&mut checks, &http, &base_url, &workload, rec).await;
    let (expiry_checked, expiry_confirmed) = if sizes.follow_ups && sizes.payment_timeout.is_some()
    {
        check_expired(&mut checks, &http, &base_url, rec).await
    } else {
        (0, 0)
    };
    checks.audit = if args.no_audit {
        AuditOutcome {
            status: "skipped".into(),
            runs: 0,
            output: "skipped with --no-audit".into(),
        }
    } else {
        run_audit(&args.server_bin, &env, product_id).await
    };
    let passed = checks.client_violations.is_empty()
        && matches!(checks.audit.status.as_str(), "passed" | "skipped");

    let result = build_result(Built {
        args,
        sizes,
        mode,
        product_id,
        seed,
        base_url: &base_url,
        spawned: spawned.is_some(),
        started_at,
        outcome: &outcome,
        redis: [&redis_before, &redis_after, &redis_settled],
        commits: [commits_before, commits_after],
        keys: [keys_before, keys_after, keys_settled],
        proc,
        inventory,
        expiry: (expiry_checked, expiry_confirmed),
        checks,
        passed,
    });
    print!("{}", report::summary_table(&result));
    if result.checks.audit.status != "passed" && result.checks.audit.status != "skipped" {
        eprintln!(
            "\n==== flashsale audit ({}) ====\n{}",
            result.checks.audit.status, result.checks.audit.output
        );
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&result).map_err(|e| format!("JSON: {e}"))?;
        std::fs::write(path, text).map_err(|e| format!("write {}: {e}", path.display()))?;
        eprintln!("flashsale-bench: wrote {}", path.display());
    }
    if let Some(path) = &args.html {
        std::fs::write(path, html::report(&result))
            .map_err(|e| format!("write {}: {e}", path.display()))?;
        eprintln!("flashsale-bench: wrote {}", path.display());
    }
    Ok(passed)
}

/// First Ctrl-C: stop dispatching, finish and report. Second: exit at once (killing a
/// spawned server, whose database and keys are then left behind).
fn watch_ctrl_c(live: Arc<Live>, spawned_pid: Option<u32>) {
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_err() {
            return;
        }
        eprintln!("\nflashsale-bench: interrupted; finishing the requests in flight (Ctrl-C again to quit at once)");
        live.stop.store(true, Ordering::Relaxed);
        if tokio::signal::ctrl_c().await.is_err() {
            return;
        }
        if let Some(pid) = spawned_pid {
            // SAFETY: kill(2) on the server we spawned, with a valid signal number.
            unsafe {
                libc::kill(pid as libc::pid_t, libc::SIGKILL);
            }
            eprintln!("flashsale-bench: killed server {pid}; its database and Redis keys (fs_bench_*) are left behind");
        }
        std::process::exit(130);
    });
}

struct Progress {
    bar: ProgressBar,
    total: u64,
    pid: Option<u32>,
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
        self.pid
            .and_then(probes::proc_memory)
            .and_then(|m| m.vm_rss_kb)
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

async fn get_json<T: serde::de::DeserializeOwned>(http: &reqwest::Client, url: &str) -> Option<T> {
    let response = http.get(url).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.json().await.ok()
}

async fn redis_snapshot(redis: &mut Option<RedisProbe>) -> Option<RedisSnapshot> {
    let r = redis.as_mut()?;
    match r.snapshot().await {
        Ok(s) => Some(s),
        Err(e) => {
            eprintln!("flashsale-bench: {e}");
            None
        }
    }
}

async fn count_keys(redis: &mut Option<RedisProbe>, prefix: &str) -> Option<u64> {
    let r = redis.as_mut()?;
    match r.count_keys(prefix).await {
        Ok(n) => n,
        Err(e) => {
            eprintln!("flashsale-bench: {e}");
            None
        }
    }
}

async fn commits(mysql: &mut Option<MysqlProbe>) -> Option<CommitCounters> {
    let m = mysql.as_mut()?;
    match m.commits().await {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!("flashsale-bench: {e}");
            None
        }
    }
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

/// The checks that need only what the client saw and the product's inventory.
fn client_checks(
    checks: &mut Checks,
    rec: &Recorder,
    sizes: &Sizes,
    inventory: Option<&Inventory>,
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
    match inventory {
        Some(i) => {
            ok(
                checks,
                i.total == sizes.stock && i.available >= 0 && i.available + i.reserved + i.sold == i.total,
                format!(
                    "inventory consistent: available {} + reserved {} + sold {} = total {}",
                    i.available, i.reserved, i.sold, i.total
                ),
                format!(
                    "inventory inconsistent: available {} + reserved {} + sold {} vs total {} (stock {})",
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

/// Looks up a sample of acknowledged orders by request_id: each must exist with the
/// order id it was acknowledged with.
async fn check_acknowledged(
    checks: &mut Checks,
    http: &reqwest::Client,
    base_url: &str,
    workload: &Workload,
    rec: &Recorder,
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
        let found = get_json::<OrderView>(http, &format!("{base_url}/v1/purchases/{rid}")).await;
        match found {
            Some(o) if o.order_id == *order_id => {}
            Some(o) => bad.push(format!(
                "{rid}: acknowledged order {order_id}, now {}",
                o.order_id
            )),
            None => bad.push(format!("{rid}: acknowledged order {order_id} not found")),
        }
    }
    if bad.is_empty() {
        checks.client_passed.push(format!(
            "{} sampled acknowledged orders found again by request_id with the same order id",
            sample.len()
        ));
    } else {
        checks.client_violations.push(format!(
            "{} of {} sampled acknowledged orders missing or changed: {}",
            bad.len(),
            sample.len(),
            listed(&bad)
        ));
    }
}

/// Checks the sampled orders left unpaid were cancelled by the payment timeout.
async fn check_expired(
    checks: &mut Checks,
    http: &reqwest::Client,
    base_url: &str,
    rec: &Recorder,
) -> (u64, u64) {
    let mut pending: Vec<i64> = rec.expire_sample.iter().map(|(o, _)| *o).collect();
    let checked = pending.len() as u64;
    let mut wrong: BTreeMap<i64, String> = BTreeMap::new();
    for round in 0..=EXPIRY_RECHECKS_MAX {
        if round > 0 {
            tokio::time::sleep(EXPIRY_SLACK).await;
        }
        let mut still = Vec::new();
        for order_id in pending {
            match get_json::<OrderView>(http, &format!("{base_url}/v1/orders/{order_id}")).await {
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
    sizes: &'a Sizes,
    mode: Mode,
    product_id: i64,
    seed: u64,
    base_url: &'a str,
    spawned: bool,
    started_at: String,
    outcome: &'a LoadOutcome,
    redis: [&'a Option<RedisSnapshot>; 3],
    commits: [Option<CommitCounters>; 2],
    keys: [Option<u64>; 3],
    proc: Option<probes::ProcMemory>,
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
    let ops = Op::ALL
        .iter()
        .filter(|&&op| op == Op::Purchase || !rec.op(op).latency.is_empty())
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
    let (connections, rate, max_in_flight, mode) = match b.mode {
        Mode::Closed { connections } => (Some(connections), None, None, "closed"),
        Mode::Open {
            rate,
            max_in_flight,
        } => (None, Some(rate), Some(max_in_flight), "open"),
    };
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
        config: RunConfig {
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
            base_url: b.base_url.into(),
            product_id: b.product_id,
            seed: b.seed,
        },
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
        timeline: rec.timeline.clone(),
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
        inventory: b.inventory,
        checks: b.checks,
        passed: b.passed,
    }
}
