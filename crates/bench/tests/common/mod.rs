//! What the bench's end-to-end tests share.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flashsale_bench::load::Live;
use flashsale_bench::report::{BenchResult, Inventory};
use flashsale_bench::server::{self, SpawnOptions, Spawned};
use flashsale_testkit::RedisCluster;

/// The flashsale binary: `FLASHSALE_BIN`, else `<workspace>/target/debug/flashsale`.
pub fn server_bin() -> PathBuf {
    let path = std::env::var_os("FLASHSALE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/debug/flashsale")
        });
    assert!(
        path.is_file(),
        "flashsale server binary {} not found: run `cargo build --bin flashsale` first, or set FLASHSALE_BIN",
        path.display()
    );
    path
}

/// A path in the temporary directory no other test or process uses: `<what>-<pid>-<ns>`.
#[allow(dead_code)]
pub fn scratch_path(what: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "flashsale-bench-{what}-{}-{:x}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ))
}

/// Runs the bench as `command` says and returns its standard output; fails the test,
/// with both outputs, unless it exits 0.
#[allow(dead_code)]
pub fn bench_stdout(command: &mut std::process::Command) -> String {
    let out = command.output().expect("run flashsale-bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "flashsale-bench failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    stdout
}

/// Runs `flashsale-bench sustained --quick --no-html --spawn`, then the `mode` flags,
/// against the spawned [`server_bin`], with `--attempts`, `--users` and `--stock` from
/// `sizes`, 16 connections and the JSON result written to `json`; returns its stdout
/// (see [`bench_stdout`]).
#[allow(dead_code)]
pub fn quick_sustained(
    mode: &[&str],
    (attempts, users, stock): (&str, &str, &str),
    json: &std::path::Path,
) -> String {
    bench_stdout(
        std::process::Command::new(env!("CARGO_BIN_EXE_flashsale-bench"))
            .args(["sustained", "--quick", "--no-html", "--spawn"])
            .args(mode)
            .arg("--no-progress")
            .arg("--server-bin")
            .arg(server_bin())
            .args(["--attempts", attempts, "--users", users, "--stock", stock])
            .args(["--connections", "16"])
            .arg("--json")
            .arg(json),
    )
}

/// Whether one of the client-side checks that passed in `r` satisfies `line`; fails the
/// test, with every check, when none does.
#[allow(dead_code)]
pub fn assert_client_passed(r: &BenchResult, line: impl Fn(&str) -> bool) {
    assert!(
        r.checks.client_passed.iter().any(|l| line(l)),
        "{:?}",
        r.checks
    );
}

/// The bench's arguments, after the program name, parsed as the command line would be.
#[allow(dead_code)]
pub fn args(list: &[&str]) -> flashsale_bench::cli::Args {
    use clap::Parser;
    flashsale_bench::cli::Args::try_parse_from(
        std::iter::once("flashsale-bench").chain(list.iter().copied()),
    )
    .expect("valid arguments")
}

/// The arguments that point the bench at servers `server::spawn` started: every one as a
/// `--base-url`, their admin token, database, Redis (a cluster's seed nodes when they
/// run on one) and key prefix, and the binary for the audit.
#[allow(dead_code)]
pub fn against(spawned: &Spawned, bin: &std::path::Path) -> Vec<String> {
    against_ledger(spawned, bin, &spawned.env.database_url)
}

/// [`against`], the checks and the audit reading the ledger at `database_url` instead
/// (the same database on another node of a Galera cluster: one the test keeps alive).
#[allow(dead_code)]
pub fn against_ledger(spawned: &Spawned, bin: &std::path::Path, database_url: &str) -> Vec<String> {
    let mut list = Vec::new();
    for url in spawned.base_urls() {
        list.extend(["--base-url".to_owned(), url]);
    }
    let env = &spawned.env;
    list.extend(
        [
            ("--admin-token", spawned.admin_token.as_str()),
            ("--database-url", database_url),
            ("--redis-url", env.redis_url.as_str()),
            ("--redis-prefix", env.redis_prefix.as_str()),
            ("--server-bin", bin.to_str().expect("a UTF-8 path")),
        ]
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_owned(), value.to_owned()]),
    );
    if let Some(nodes) = &env.redis_cluster_nodes {
        list.extend(["--redis-cluster-nodes".to_owned(), nodes.clone()]);
    }
    list
}

// What the tests of several spawned instances over clustered stores share
// (`cluster_instances.rs`, `every_node.rs`).

/// How old a hold without an order must be before recovery fences and releases it (the
/// server's default, 30 s, is beyond these tests' time).
#[allow(dead_code)]
pub const RECOVERY_AFTER: &str = "2s";
/// The servers' request deadline (10 s by default): recovery may only fence holds older
/// than it (the server refuses a `RECOVERY_AFTER` not above it), so it is shortened with
/// the window; a debug server under these tests' load answers well within it.
#[allow(dead_code)]
pub const REQUEST_TIMEOUT: &str = "1500ms";
/// The recovery, expiry and gate-watch workers' period: several passes per recovery
/// window.
#[allow(dead_code)]
pub const WORKER_INTERVAL: &str = "500ms";
/// The reconcile worker's period (60 s by default): it runs during the tests too.
#[allow(dead_code)]
pub const RECONCILE_INTERVAL: &str = "5s";
/// Pause between looks at the servers (metrics, inventories) while waiting for a state.
#[allow(dead_code)]
pub const POLL: Duration = Duration::from_millis(100);
/// Longest wait for every instance's workers to have made their first passes (they
/// make one at startup).
#[allow(dead_code)]
pub const WORKERS_WAIT_MAX: Duration = Duration::from_secs(20);
/// The workers `serve` runs, as `flashsale_worker_passes_total` names them.
#[allow(dead_code)]
pub const WORKERS: [&str; 5] = ["expiry", "gate-watch", "reconcile", "recovery", "fallback"];
/// What recovery counts (`flashsale_recovery_actions_total`), printed per survivor.
#[allow(dead_code)]
pub const RECOVERY_ACTIONS: [&str; 6] = [
    "aligned",
    "released",
    "orphans_released",
    "returns_completed",
    "restocks_completed",
    "deferred",
];

/// The settings that make a spawned server's recovery act within a test's time: the
/// recovery window and the request deadline it must exceed, and the workers' periods
/// (`RECOVERY_AFTER`, `REQUEST_TIMEOUT`, `WORKER_INTERVAL`, `RECONCILE_INTERVAL`), as
/// `SpawnOptions::extra_env` takes them, after `first` (the stores' settings).
#[allow(dead_code)]
pub fn short_workers_env(first: &[(&str, &str)]) -> Vec<(String, String)> {
    first
        .iter()
        .chain(&[
            ("FLASHSALE_RECOVERY_AFTER", RECOVERY_AFTER),
            ("FLASHSALE_REQUEST_TIMEOUT", REQUEST_TIMEOUT),
            ("FLASHSALE_RECOVERY_INTERVAL", WORKER_INTERVAL),
            ("FLASHSALE_EXPIRY_INTERVAL", WORKER_INTERVAL),
            ("FLASHSALE_GATE_WATCH_INTERVAL", WORKER_INTERVAL),
            ("FLASHSALE_RECONCILE_INTERVAL", RECONCILE_INTERVAL),
        ])
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// A rush of the bench running in a task of its own: its live counters, to act on (or
/// stop it) mid-run, and its result once done.
#[allow(dead_code)]
pub struct Rush {
    pub live: Arc<Live>,
    pub handle: tokio::task::JoinHandle<Result<BenchResult, String>>,
}

/// Starts `rush --quick --no-progress` with `target` (the servers and stores, as
/// [`against`] gives them) and `flags` (flag, value), driven through the bench library
/// (`flashsale_bench::drive`) in a task of its own.
#[allow(dead_code)]
pub fn start_rush(target: &[String], flags: &[(&str, &str)]) -> Rush {
    let mut list = vec!["rush".to_owned(), "--quick".into(), "--no-progress".into()];
    list.extend(target.iter().cloned());
    for (flag, value) in flags {
        list.extend([(*flag).to_owned(), (*value).to_owned()]);
    }
    let run = args(&list.iter().map(String::as_str).collect::<Vec<_>>());
    let live = Arc::new(Live::default());
    let watched = live.clone();
    let handle = tokio::spawn(async move { flashsale_bench::drive(&run, watched).await });
    Rush { live, handle }
}

/// The value of the series `series` (`name{labels}` exactly as the server writes it) in
/// a Prometheus text answer; 0 when absent (a counter not yet moved).
#[allow(dead_code)]
pub fn series(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| {
            let value = line.strip_prefix(series)?.strip_prefix(' ')?;
            value.trim().parse().ok()
        })
        .unwrap_or(0.0)
}

/// `GET <base_url>/metrics`, or why not.
#[allow(dead_code)]
pub async fn metrics(http: &reqwest::Client, base_url: &str) -> Result<String, String> {
    let r = http
        .get(format!("{base_url}/metrics"))
        .send()
        .await
        .map_err(|e| format!("{base_url}/metrics: {e}"))?;
    if !r.status().is_success() {
        return Err(format!("{base_url}/metrics: {}", r.status()));
    }
    r.text()
        .await
        .map_err(|e| format!("{base_url}/metrics: {e}"))
}

/// Passes that ended well, of `worker`, in a /metrics answer.
#[allow(dead_code)]
pub fn passes(text: &str, worker: &str) -> f64 {
    series(
        text,
        &format!("flashsale_worker_passes_total{{worker=\"{worker}\",result=\"ok\"}}"),
    )
}

/// The product's inventory as the API has it (available from Redis, reserved and sold
/// from MariaDB).
#[allow(dead_code)]
pub async fn inventory(
    http: &reqwest::Client,
    base_url: &str,
    product: i64,
) -> Result<Inventory, String> {
    #[derive(serde::Deserialize)]
    struct View {
        inventory: Inventory,
    }
    let url = format!("{base_url}/v1/products/{product}");
    let r = http
        .get(&url)
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    if !r.status().is_success() {
        return Err(format!("{url}: {}", r.status()));
    }
    r.json::<View>()
        .await
        .map(|v| v.inventory)
        .map_err(|e| format!("{url}: {e}"))
}

/// Units taken from Redis that no order (reserved or sold) accounts for: holds in
/// flight, or left by a dead instance until recovery settles them.
#[allow(dead_code)]
pub fn held(i: &Inventory) -> i64 {
    i.total - (i.available + i.reserved + i.sold)
}

/// What recovery did on one server, from its /metrics: passes and actions by name.
#[allow(dead_code)]
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recovery {
    pub passes: f64,
    pub actions: BTreeMap<&'static str, f64>,
    pub incidents: f64,
}

#[allow(dead_code)]
impl Recovery {
    pub fn of(text: &str) -> Self {
        Recovery {
            passes: passes(text, "recovery"),
            actions: RECOVERY_ACTIONS
                .iter()
                .map(|a| {
                    let name = format!("flashsale_recovery_actions_total{{action=\"{a}\"}}");
                    (*a, series(text, &name))
                })
                .collect(),
            incidents: series(text, "flashsale_recovery_incidents_total"),
        }
    }

    /// What it did between `before` and this.
    pub fn since(&self, before: &Recovery) -> Self {
        Recovery {
            passes: self.passes - before.passes,
            actions: self
                .actions
                .iter()
                .map(|(a, n)| (*a, n - before.actions.get(a).copied().unwrap_or(0.0)))
                .collect(),
            incidents: self.incidents - before.incidents,
        }
    }

    pub fn released(&self) -> f64 {
        self.actions.get("released").copied().unwrap_or(0.0)
    }
}

/// An HTTP client for the servers at `urls` (10 s a request), once each has made the
/// first passes of its workers ([`workers_ran`]).
#[allow(dead_code)]
pub async fn client_once_working(urls: &[String]) -> Result<reqwest::Client, String> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| format!("http client: {e}"))?;
    workers_ran(&http, urls).await?;
    Ok(http)
}

/// Waits (bounded) until every instance's /metrics shows a good pass of each of its
/// workers: `serve` runs them on every instance, each makes a pass at startup.
#[allow(dead_code)]
pub async fn workers_ran(http: &reqwest::Client, urls: &[String]) -> Result<(), String> {
    let waited = Instant::now();
    for url in urls {
        loop {
            let text = metrics(http, url).await?;
            let missing: Vec<&str> = WORKERS
                .iter()
                .copied()
                .filter(|w| passes(&text, w) < 1.0)
                .collect();
            if missing.is_empty() {
                let counts: BTreeMap<&str, f64> =
                    WORKERS.iter().map(|w| (*w, passes(&text, w))).collect();
                eprintln!("{url}: worker passes {counts:?}");
                break;
            }
            if waited.elapsed() > WORKERS_WAIT_MAX {
                return Err(format!(
                    "{url}: no good pass of {missing:?} within {WORKERS_WAIT_MAX:?}"
                ));
            }
            tokio::time::sleep(POLL).await;
        }
    }
    Ok(())
}

/// The WARN and ERROR lines of every instance's log (read before the logs are removed).
#[allow(dead_code)]
pub fn log_problems(spawned: &Spawned) -> Vec<String> {
    spawned
        .instances()
        .flat_map(|i| {
            let text =
                server::strip_ansi(&std::fs::read_to_string(&i.log_path).unwrap_or_default());
            text.lines()
                .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
                .map(|l| format!("{}: {l}", i.base_url))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Prints the first `shown` of `lines` (the servers' WARN and ERROR lines), and how many
/// there were.
#[allow(dead_code)]
pub fn print_log_problems(lines: &[String], shown: usize) {
    if lines.is_empty() {
        return;
    }
    println!("WARN/ERROR lines in the servers' logs ({}):", lines.len());
    for line in lines.iter().take(shown) {
        println!("  {line}");
    }
}

/// Prints how many of `lines` (the servers' WARN and ERROR lines, as [`log_problems`]
/// gives them) each level and target wrote, most first, then the first `errors_shown`
/// ERROR lines whole: a sale through faults logs its retries by the thousand, and the
/// count per source says more than their first lines.
#[allow(dead_code)]
pub fn print_log_summary(lines: &[String], errors_shown: usize) {
    if lines.is_empty() {
        return;
    }
    let mut by_source: BTreeMap<String, usize> = BTreeMap::new();
    for line in lines {
        // `<base url>: <time> <LEVEL> <target>: <message>`
        let mut words = line.split_whitespace().skip(2);
        let level = words.next().unwrap_or("?");
        let target = words.next().unwrap_or("?").trim_end_matches(':');
        *by_source.entry(format!("{level} {target}")).or_default() += 1;
    }
    let mut counts: Vec<(String, usize)> = by_source.into_iter().collect();
    counts.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    println!(
        "WARN/ERROR lines in the servers' logs ({}), by source:",
        lines.len()
    );
    for (source, n) in counts {
        println!("  {n:>6}  {source}");
    }
    let errors: Vec<&String> = lines.iter().filter(|l| l.contains(" ERROR ")).collect();
    for line in errors.iter().take(errors_shown) {
        println!("  {line}");
    }
    if errors.len() > errors_shown {
        println!("  … {} ERROR lines more", errors.len() - errors_shown);
    }
}

/// Prints one line per server of a rush: its attempts and how they ended.
#[allow(dead_code)]
pub fn print_targets(r: &BenchResult) {
    for t in &r.targets {
        let of = |s: &str| t.outcomes.get(s).copied().unwrap_or(0);
        let other: BTreeMap<&str, u64> = t
            .outcomes
            .iter()
            .filter(|(s, _)| !["201", "409", "503", "0"].contains(&s.as_str()))
            .map(|(s, n)| (s.as_str(), *n))
            .collect();
        println!(
            "  {:<24} attempts {:>4}  201 {:>3}  409 {:>4}  503 {:>3}  no answer {:>3}  other {other:?}; errors {:?}",
            t.base_url,
            t.attempts,
            of("201"),
            of("409"),
            of("503"),
            of("0"),
            t.errors,
        );
    }
}

/// One product on each primary of `cluster`, by port: (the smallest id whose keys land on
/// it, the primary's port).
#[allow(dead_code)]
pub async fn product_per_primary(cluster: &RedisCluster) -> Vec<(i64, u16)> {
    let primaries = cluster.primaries().await.expect("the primaries");
    assert_eq!(primaries.len(), 3, "{primaries:?}");
    let mut products = Vec::new();
    for port in primaries {
        let id = cluster.product_on(port).await.expect("a product on it");
        products.push((i64::try_from(id).expect("a small id"), port));
    }
    products
}

/// Starts `instances` servers of one sale (`server::spawn`: info logs in temporary files,
/// the default payment timeout) on the stores given, `env` their extra settings, and says
/// where they are and when (from `started`).
#[allow(dead_code)]
pub async fn spawn_sale(
    bin: &std::path::Path,
    (database_url, redis_url, nats_url): (&str, &str, &str),
    env: &[(String, String)],
    instances: u32,
    started: Instant,
) -> Spawned {
    let spawned = server::spawn(SpawnOptions {
        bin,
        database_url,
        redis_url,
        nats_url,
        payment_timeout: None,
        extra_env: env,
        log_level: "info",
        log_path: None,
        instances,
    })
    .await
    .expect("the servers start");
    eprintln!(
        "{instances} servers up at {:.1}s: {:?}",
        started.elapsed().as_secs_f64(),
        spawned.base_urls()
    );
    spawned
}

/// What a rush of `product` over `instances` spawned servers, one of them (`killed`) killed
/// mid-run, must have found, one line per failure: its checks and its audit passed, every
/// order it was told about found in the orders table under its request_id, at most the
/// `stock` acknowledged, attempts sent to every server, and the killed one's later
/// attempts unanswered.
#[allow(dead_code)]
pub fn rush_problems(
    product: i64,
    r: &BenchResult,
    instances: u32,
    killed: &str,
    stock: i64,
) -> Vec<String> {
    let summary = flashsale_bench::report::summary_table(r);
    let present = r.checks.client_passed.iter().any(|l| {
        l.starts_with("orders table: all ") && l.ends_with("present under their request_id")
    });
    let checks = [
        (r.passed, "the rush's checks failed"),
        (r.checks.audit.status == "passed", "the rush's audit failed"),
        (present, "acknowledged orders not all found"),
        (
            r.orders.acknowledged <= u64::try_from(stock).unwrap_or(0),
            "more orders acknowledged than the stock",
        ),
        (
            r.targets.len() == instances as usize && r.targets.iter().all(|t| t.attempts > 0),
            "not every server got attempts",
        ),
        (
            r.targets
                .iter()
                .any(|t| t.base_url == killed && t.unanswered() > 0),
            "the killed server's later attempts got answers",
        ),
    ];
    checks
        .iter()
        .filter(|(ok, _)| !ok)
        .map(|(_, what)| {
            format!(
                "product {product}: {what}:\n{summary}\n{:?}\naudit: {}",
                r.checks, r.checks.audit.output
            )
        })
        .collect()
}

/// Kills the spawned server `victim` with SIGKILL (`kill -9`), at once.
#[allow(dead_code)]
pub fn kill9(victim: &server::Instance) -> Result<(), String> {
    let status = std::process::Command::new("kill")
        .args(["-9", &victim.pid.to_string()])
        .status()
        .map_err(|e| format!("kill -9 {}: {e}", victim.pid))?;
    if !status.success() {
        return Err(format!("kill -9 {}: {status}", victim.pid));
    }
    Ok(())
}
