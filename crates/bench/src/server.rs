//! The flashsale processes: started with `--spawn` (own database, Redis prefix and NATS
//! stream; `--instances N` starts N servers on them, each on its own port with its own
//! log), stopped and cleaned up at the end; and `flashsale audit` run with the same
//! configuration.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

use crate::probes::{split_database_url, MysqlProbe, RedisProbe};

/// How long a spawned server may take to answer /readyz: it creates its database and
/// runs the migrations first, which takes a few seconds on a busy machine.
const STARTUP_MAX: Duration = Duration::from_secs(60);
/// Pause between readiness polls.
const STARTUP_POLL: Duration = Duration::from_millis(100);
/// How long a SIGTERM'd server may take to drain and exit before it is killed: above
/// its own request deadline (10 s by default), so in-flight requests can finish.
const STOP_MAX: Duration = Duration::from_secs(20);
/// Bound on one `flashsale audit` run: it reads one product's rows and Redis keys; a
/// minute covers hundreds of thousands of orders on a slow machine.
const AUDIT_TIMEOUT: Duration = Duration::from_secs(120);
/// Lines of the server's log shown when it fails to start.
const LOG_TAIL_LINES: usize = 30;
/// Bound on talking to NATS while deleting the spawned server's stream.
const NATS_TIMEOUT: Duration = Duration::from_secs(10);
/// Most servers one spawn starts: as many as a run may spread its load over.
pub const INSTANCES_MAX: u32 = crate::cli::TARGETS_MAX as u32;

/// The server setting naming a Redis Cluster (`host:port` seed nodes, comma-separated);
/// when set, the server uses the cluster and does not read `FLASHSALE_REDIS_URL`.
pub const CLUSTER_NODES_ENV: &str = "FLASHSALE_REDIS_CLUSTER_NODES";
/// The server setting naming a Galera cluster's nodes (`host:port`, comma-separated): the
/// ledger writes through the first healthy one, with the user, password and database of
/// `FLASHSALE_DATABASE_URL`.
pub const DATABASE_NODES_ENV: &str = "FLASHSALE_DATABASE_NODES";

/// The configuration a flashsale process (server or audit) reads.
#[derive(Debug, Clone)]
pub struct ServerEnv {
    pub database_url: String,
    /// The one Redis, when `redis_cluster_nodes` is None.
    pub redis_url: String,
    /// The Redis Cluster's seed nodes (`CLUSTER_NODES_ENV`), used instead of `redis_url`.
    pub redis_cluster_nodes: Option<String>,
    pub redis_prefix: String,
    /// The Galera nodes the ledger writes through (`DATABASE_NODES_ENV`), None for the
    /// one MariaDB of `database_url`.
    pub database_nodes: Option<String>,
    /// Set when this bench owns the NATS stream (spawned server).
    pub nats: Option<(String, String)>,
}

impl ServerEnv {
    fn apply(&self, cmd: &mut Command) {
        cmd.env("FLASHSALE_DATABASE_URL", &self.database_url)
            .env("FLASHSALE_REDIS_URL", &self.redis_url)
            .env("FLASHSALE_REDIS_PREFIX", &self.redis_prefix);
        // Set, or removed: a cluster inherited from the bench's own environment would
        // send the process to other keys than the ones the bench probes and cleans.
        for (key, value) in [
            (CLUSTER_NODES_ENV, &self.redis_cluster_nodes),
            (DATABASE_NODES_ENV, &self.database_nodes),
        ] {
            match value {
                Some(nodes) => cmd.env(key, nodes),
                None => cmd.env_remove(key),
            };
        }
        if let Some((subject_prefix, stream)) = &self.nats {
            cmd.env("FLASHSALE_NATS_SUBJECT_PREFIX", subject_prefix)
                .env("FLASHSALE_NATS_STREAM", stream);
        }
    }

    /// A probe of the Redis the server uses: the cluster's primaries when it runs on
    /// one, else its one Redis.
    pub async fn redis_probe(&self) -> Result<RedisProbe, String> {
        match &self.redis_cluster_nodes {
            Some(nodes) => RedisProbe::connect_cluster(nodes).await,
            None => RedisProbe::connect(&self.redis_url).await,
        }
    }
}

/// One `flashsale serve` process started by the bench.
pub struct Instance {
    child: Child,
    pub pid: u32,
    pub base_url: String,
    pub log_path: PathBuf,
    /// The log is the bench's own temporary file (removed at the end), not a path the
    /// user asked for with --server-log (kept).
    log_is_temporary: bool,
}

/// The servers started by the bench: one, or several (`SpawnOptions::instances`)
/// serving one sale from the same database, Redis prefix and NATS stream, which belong
/// to the group and are removed once all of them have stopped.
pub struct Spawned {
    /// The first started: it created the database; the product is created through it.
    pub first: Instance,
    /// The others, in the order they were started.
    pub others: Vec<Instance>,
    pub admin_token: String,
    pub env: ServerEnv,
    database_name: String,
    nats_url: String,
}

/// What `spawn` needs.
pub struct SpawnOptions<'a> {
    pub bin: &'a Path,
    /// The database URL whose server hosts the fresh database.
    pub database_url: &'a str,
    /// The Redis, unless `extra_env` names a Redis Cluster (`CLUSTER_NODES_ENV`).
    pub redis_url: &'a str,
    pub nats_url: &'a str,
    pub payment_timeout: Option<Duration>,
    /// Extra `KEY=VALUE` settings (the last of a key wins, as for the server). A Redis
    /// Cluster named here (`CLUSTER_NODES_ENV`) is also the one the bench probes, cleans
    /// and audits.
    pub extra_env: &'a [(String, String)],
    pub log_level: &'a str,
    /// The log's path (with several instances, instance i's is `<path>.i`); None: a
    /// temporary file each, removed at the end.
    pub log_path: Option<&'a Path>,
    /// How many servers to start (1..=`INSTANCES_MAX`).
    pub instances: u32,
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port on 127.0.0.1: {e}"))
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}

/// Starts `bin serve` on a free port of 127.0.0.1 with a fresh database
/// (`fs_bench_<hex>`), Redis prefix and NATS stream, and waits until it is ready; with
/// `instances` above one, then starts the others on the same database, prefix and
/// stream (once the first has created the database and run the migrations, so that
/// they do not race for them) and waits until every one is ready.
pub async fn spawn(opts: SpawnOptions<'_>) -> Result<Spawned, String> {
    if !opts.bin.is_file() {
        return Err(format!(
            "server binary {} not found: build it first (cargo build --release --bin flashsale), or pass --server-bin",
            opts.bin.display()
        ));
    }
    if !(1..=INSTANCES_MAX).contains(&opts.instances) {
        return Err(format!(
            "instances: between 1 and {INSTANCES_MAX} servers, got {}",
            opts.instances
        ));
    }
    let tag = format!("{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff);
    let database_name = format!("fs_bench_{tag}");
    let (server, _, query) = split_database_url(opts.database_url)?;
    let env = ServerEnv {
        database_url: format!("{server}/{database_name}{query}"),
        redis_url: opts.redis_url.to_owned(),
        redis_cluster_nodes: last_setting(opts.extra_env, CLUSTER_NODES_ENV),
        database_nodes: last_setting(opts.extra_env, DATABASE_NODES_ENV),
        redis_prefix: format!("fs_bench_{tag}:"),
        nats: Some((
            format!("fs_bench_{tag}"),
            format!("FS_BENCH_{}", tag.to_uppercase()),
        )),
    };
    let admin_token = format!("bench-{:016x}", rand::random::<u64>());
    let start = |number: u32| start_instance(&opts, &env, &admin_token, &tag, number);
    let mut first = start(1)?;
    if let Err(e) = first.wait_ready().await {
        // Its log is kept: the error names it.
        let sent = first.terminate();
        first.wait_stopped(sent).await;
        return Err(e);
    }
    let mut spawned = Spawned {
        first,
        others: Vec::new(),
        admin_token: admin_token.clone(),
        env: env.clone(),
        database_name,
        nats_url: opts.nats_url.to_owned(),
    };
    // Started together, then waited for: their startups overlap.
    for number in 2..=opts.instances {
        match start(number) {
            Ok(instance) => spawned.others.push(instance),
            Err(e) => {
                spawned.finish(false, true).await;
                return Err(e);
            }
        }
    }
    let mut failed = None;
    for instance in &mut spawned.others {
        if let Err(e) = instance.wait_ready().await {
            failed = Some(e);
            break;
        }
    }
    if let Some(e) = failed {
        // The logs are kept: the error names the failed one's.
        spawned.finish(false, true).await;
        return Err(e);
    }
    Ok(spawned)
}

/// The value of `key` in `settings`, the last one when it is given several times (as
/// for the server itself).
fn last_setting(settings: &[(String, String)], key: &str) -> Option<String> {
    settings
        .iter()
        .rev()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
}

/// Where instance `number` (from 1) of `instances` logs: the path asked for (with
/// several instances, `<path>.<number>`, so that none overwrites another's), else a
/// temporary file named after the spawn's `tag`.
fn log_path(asked: Option<&Path>, instances: u32, tag: &str, number: u32) -> PathBuf {
    match (asked, instances) {
        (Some(path), 1) => path.to_path_buf(),
        (Some(path), _) => {
            let mut name = path.as_os_str().to_owned();
            name.push(format!(".{number}"));
            PathBuf::from(name)
        }
        (None, 1) => std::env::temp_dir().join(format!("flashsale-bench-{tag}.log")),
        (None, _) => std::env::temp_dir().join(format!("flashsale-bench-{tag}-{number}.log")),
    }
}

/// Starts instance `number` (from 1) of a spawn on a free port, without waiting for it.
fn start_instance(
    opts: &SpawnOptions<'_>,
    env: &ServerEnv,
    admin_token: &str,
    tag: &str,
    number: u32,
) -> Result<Instance, String> {
    let port = free_port()?;
    let log_is_temporary = opts.log_path.is_none();
    let log_path = log_path(opts.log_path, opts.instances, tag, number);
    let log = std::fs::File::create(&log_path)
        .map_err(|e| format!("server log {}: {e}", log_path.display()))?;
    let log_err = log
        .try_clone()
        .map_err(|e| format!("server log {}: {e}", log_path.display()))?;
    let mut cmd = Command::new(opts.bin);
    cmd.arg("serve")
        .env("FLASHSALE_LISTEN", format!("127.0.0.1:{port}"))
        // Its metrics on the API's own address, where the bench reads them (a variable
        // exported for a production server must not move them elsewhere).
        .env_remove("FLASHSALE_METRICS_LISTEN")
        .env("FLASHSALE_ADMIN_TOKEN", admin_token)
        .env("FLASHSALE_NATS_URL", opts.nats_url)
        .env("RUST_LOG", opts.log_level)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log_err))
        // Its own process group: a Ctrl-C in the terminal reaches only the bench, which
        // then finishes the run and stops the server itself (SIGTERM, drain).
        .process_group(0)
        // Last resort if the bench itself panics: the server does not outlive it. (A
        // bench killed with SIGKILL leaves it running.)
        .kill_on_drop(true);
    env.apply(&mut cmd);
    if let Some(t) = opts.payment_timeout {
        cmd.env("FLASHSALE_PAYMENT_TIMEOUT", format!("{}ms", t.as_millis()));
    }
    for (k, v) in opts.extra_env {
        cmd.env(k, v);
    }
    let child = cmd
        .spawn()
        .map_err(|e| format!("start {}: {e}", opts.bin.display()))?;
    let pid = child
        .id()
        .ok_or_else(|| "the server exited at once".to_owned())?;
    Ok(Instance {
        child,
        pid,
        base_url: format!("http://127.0.0.1:{port}"),
        log_path,
        log_is_temporary,
    })
}

impl Instance {
    async fn wait_ready(&mut self) -> Result<(), String> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .map_err(|e| format!("http client: {e}"))?;
        let url = format!("{}/readyz", self.base_url);
        let started = Instant::now();
        loop {
            if let Ok(r) = http.get(&url).send().await {
                if r.status().is_success() {
                    return Ok(());
                }
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "the server exited during startup ({status}); its log ({}) ends with:\n{}",
                    self.log_path.display(),
                    tail(&self.log_path)
                ));
            }
            if started.elapsed() > STARTUP_MAX {
                return Err(format!(
                    "the server was not ready within {STARTUP_MAX:?}; its log ({}) ends with:\n{}",
                    self.log_path.display(),
                    tail(&self.log_path)
                ));
            }
            tokio::time::sleep(STARTUP_POLL).await;
        }
    }

    /// Sends SIGTERM, unless the server has already exited (killed by a test, say: it is
    /// reaped then); true when a signal was sent or none was needed.
    fn terminate(&mut self) -> bool {
        if let Ok(Some(_)) = self.child.try_wait() {
            return true;
        }
        // SAFETY: kill(2) with a pid we spawned and still own (not yet reaped, so the
        // pid cannot have been reused) and a valid signal number.
        unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGTERM) == 0 }
    }

    /// Waits for the server to exit after [`Instance::terminate`] (`sent`: its result),
    /// and kills it if it has not within `STOP_MAX`.
    async fn wait_stopped(&mut self, sent: bool) {
        let exited = sent
            && matches!(
                tokio::time::timeout(STOP_MAX, self.child.wait()).await,
                Ok(Ok(_))
            );
        if !exited {
            eprintln!(
                "flashsale-bench: server {} did not stop on SIGTERM within {STOP_MAX:?}; killing it",
                self.pid
            );
            if let Err(e) = self.child.kill().await {
                eprintln!("flashsale-bench: kill server {}: {e}", self.pid);
            }
        }
    }

    /// Removes the log if it is the bench's own temporary file.
    fn remove_temporary_log(&self) {
        if self.log_is_temporary {
            let _ = std::fs::remove_file(&self.log_path);
        }
    }
}

impl Spawned {
    /// Every server, the first one first.
    pub fn instances(&self) -> impl Iterator<Item = &Instance> {
        std::iter::once(&self.first).chain(&self.others)
    }

    /// Every server's base URL, the first one first: the load's targets.
    pub fn base_urls(&self) -> Vec<String> {
        self.instances().map(|i| i.base_url.clone()).collect()
    }

    /// Every server's pid, the first one first.
    pub fn pids(&self) -> Vec<u32> {
        self.instances().map(|i| i.pid).collect()
    }

    /// Stops every server (as [`Spawned::shutdown`] does) and keeps their database, Redis
    /// keys and NATS stream for a load that needs no server (the SQL run); `shutdown`
    /// still cleans them up afterwards.
    pub async fn stop_servers(&mut self) {
        let first_sent = self.first.terminate();
        let others_sent: Vec<bool> = self.others.iter_mut().map(Instance::terminate).collect();
        self.first.wait_stopped(first_sent).await;
        for (instance, sent) in self.others.iter_mut().zip(others_sent) {
            instance.wait_stopped(sent).await;
        }
    }

    /// Stops every server (SIGTERM, then SIGKILL after `STOP_MAX`; all at once, so the
    /// drains overlap) and, unless `keep`, drops their database, deletes their Redis keys
    /// and their NATS stream. Problems are printed, not returned: cleanup goes as far as
    /// it can.
    pub async fn shutdown(self, keep: bool) {
        self.finish(keep, keep).await;
    }

    /// [`Spawned::shutdown`], the temporary logs kept when `keep_logs`.
    async fn finish(mut self, keep: bool, keep_logs: bool) {
        self.stop_servers().await;
        if !keep_logs {
            for instance in self.instances() {
                instance.remove_temporary_log();
            }
        }
        if keep {
            eprintln!(
                "flashsale-bench: kept database {}, Redis prefix {}, NATS stream {}",
                self.database_name,
                self.env.redis_prefix,
                self.env.nats.as_ref().map_or("-", |n| n.1.as_str())
            );
            return;
        }
        self.clean_up().await;
    }

    /// Drops the database, deletes the Redis keys and the NATS stream.
    async fn clean_up(&self) {
        match MysqlProbe::connect(&self.env.database_url).await {
            Ok(mut db) => {
                if let Err(e) = db
                    .execute(&format!("DROP DATABASE IF EXISTS `{}`", self.database_name))
                    .await
                {
                    eprintln!("flashsale-bench: drop database {}: {e}", self.database_name);
                }
                db.close().await;
            }
            Err(e) => eprintln!("flashsale-bench: drop database {}: {e}", self.database_name),
        }
        match self.env.redis_probe().await {
            Ok(mut r) => {
                if let Err(e) = r.delete_prefix(&self.env.redis_prefix).await {
                    eprintln!(
                        "flashsale-bench: delete Redis keys {}*: {e}",
                        self.env.redis_prefix
                    );
                }
            }
            Err(e) => eprintln!("flashsale-bench: delete Redis keys: {e}"),
        }
        if let Some((_, stream)) = &self.env.nats {
            let deleted = tokio::time::timeout(NATS_TIMEOUT, async {
                // Every server of a cluster's list (`nats://a,nats://b`, as the servers
                // take it): the client parses one URL alone, and tries each in turn.
                let servers: Vec<&str> = self.nats_url.split(',').map(str::trim).collect();
                let client = async_nats::connect(servers)
                    .await
                    .map_err(|e| e.to_string())?;
                let js = async_nats::jetstream::new(client);
                js.delete_stream(stream).await.map_err(|e| e.to_string())?;
                Ok::<_, String>(())
            })
            .await;
            match deleted {
                Ok(Ok(())) => {}
                // A stream never created (NATS down all along) is nothing to clean.
                Ok(Err(e)) if e.contains("not found") => {}
                Ok(Err(e)) => eprintln!("flashsale-bench: delete NATS stream {stream}: {e}"),
                Err(_) => eprintln!(
                    "flashsale-bench: delete NATS stream {stream}: no answer within {NATS_TIMEOUT:?}"
                ),
            }
        }
    }
}

/// The outcome of one `flashsale audit` run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRun {
    /// Exited 0 (no violation).
    pub passed: bool,
    /// Found violations (exit 1 with a report), as opposed to failing to run.
    pub violations: bool,
    pub output: String,
}

/// Runs `bin audit --product <id>` with `env`.
pub async fn audit(bin: &Path, env: &ServerEnv, product_id: i64) -> Result<AuditRun, String> {
    if !bin.is_file() {
        return Err(format!(
            "audit: server binary {} not found (cargo build --release --bin flashsale, or pass --server-bin; --no-audit skips it)",
            bin.display()
        ));
    }
    let mut cmd = Command::new(bin);
    cmd.args(["audit", "--product", &product_id.to_string()])
        .env("RUST_LOG", "warn")
        // Plain text: the output goes into the reports.
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    env.apply(&mut cmd);
    let out = tokio::time::timeout(AUDIT_TIMEOUT, cmd.output())
        .await
        .map_err(|_| format!("audit: no result within {AUDIT_TIMEOUT:?}"))?
        .map_err(|e| format!("audit: run {}: {e}", bin.display()))?;
    let mut output = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !stderr.trim().is_empty() {
        output.push_str(&stderr);
    }
    let output = strip_ansi(&output);
    Ok(AuditRun {
        passed: out.status.success(),
        violations: output.contains("VIOLATION"),
        output,
    })
}

/// Removes ANSI colour sequences (`ESC [ … letter`), in case the audit's log lines are
/// coloured anyway.
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // Skip '[' and the parameters up to the final letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks colour codes are removed from captured output and plain text is kept, on a
    // line as tracing-subscriber colours it.
    #[test]
    fn strips_colour_codes() {
        let line =
            "\u{1b}[2m2026-11-29T13:48:34Z\u{1b}[0m \u{1b}[31mERROR\u{1b}[0m flashsale failed";
        assert_eq!(
            strip_ansi(line),
            "2026-11-29T13:48:34Z ERROR flashsale failed"
        );
        assert_eq!(strip_ansi("no violations\n"), "no violations\n");
    }

    // Checks each instance of a spawn gets a log of its own: the path asked for as given
    // for one server, with the instance's number appended for several; temporary files
    // named after the spawn's tag otherwise, numbered likewise.
    #[test]
    fn one_log_per_instance() {
        let asked = Path::new("/tmp/s.log");
        assert_eq!(log_path(Some(asked), 1, "ab", 1), asked);
        assert_eq!(log_path(Some(asked), 3, "ab", 2), Path::new("/tmp/s.log.2"));
        let temp = std::env::temp_dir();
        assert_eq!(
            log_path(None, 1, "ab", 1),
            temp.join("flashsale-bench-ab.log")
        );
        assert_eq!(
            log_path(None, 2, "ab", 2),
            temp.join("flashsale-bench-ab-2.log")
        );
    }
}
