//! The flashsale process: started with `--spawn` (own port, database, Redis prefix and
//! NATS stream), stopped and cleaned up at the end; and `flashsale audit` run with the
//! same configuration.

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

/// The configuration a flashsale process (server or audit) reads.
#[derive(Debug, Clone)]
pub struct ServerEnv {
    pub database_url: String,
    pub redis_url: String,
    pub redis_prefix: String,
    /// Set when this bench owns the NATS stream (spawned server).
    pub nats: Option<(String, String)>,
}

impl ServerEnv {
    fn apply(&self, cmd: &mut Command) {
        cmd.env("FLASHSALE_DATABASE_URL", &self.database_url)
            .env("FLASHSALE_REDIS_URL", &self.redis_url)
            .env("FLASHSALE_REDIS_PREFIX", &self.redis_prefix);
        if let Some((subject_prefix, stream)) = &self.nats {
            cmd.env("FLASHSALE_NATS_SUBJECT_PREFIX", subject_prefix)
                .env("FLASHSALE_NATS_STREAM", stream);
        }
    }
}

/// A server started by the bench.
pub struct Spawned {
    child: Child,
    pub pid: u32,
    pub base_url: String,
    pub admin_token: String,
    pub env: ServerEnv,
    pub log_path: PathBuf,
    /// The log is the bench's own temporary file (removed at the end), not a path the
    /// user asked for with --server-log (kept).
    log_is_temporary: bool,
    database_name: String,
    nats_url: String,
}

/// What `spawn` needs.
pub struct SpawnOptions<'a> {
    pub bin: &'a Path,
    /// The database URL whose server hosts the fresh database.
    pub database_url: &'a str,
    pub redis_url: &'a str,
    pub nats_url: &'a str,
    pub payment_timeout: Option<Duration>,
    /// Extra `KEY=VALUE` settings.
    pub extra_env: &'a [(String, String)],
    pub log_level: &'a str,
    pub log_path: Option<&'a Path>,
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
/// (`fs_bench_<hex>`), Redis prefix and NATS stream, and waits until it is ready.
pub async fn spawn(opts: SpawnOptions<'_>) -> Result<Spawned, String> {
    if !opts.bin.is_file() {
        return Err(format!(
            "server binary {} not found: build it first (cargo build --release --bin flashsale), or pass --server-bin",
            opts.bin.display()
        ));
    }
    let tag = format!("{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff);
    let database_name = format!("fs_bench_{tag}");
    let (server, _, query) = split_database_url(opts.database_url)?;
    let env = ServerEnv {
        database_url: format!("{server}/{database_name}{query}"),
        redis_url: opts.redis_url.to_owned(),
        redis_prefix: format!("fs_bench_{tag}:"),
        nats: Some((
            format!("fs_bench_{tag}"),
            format!("FS_BENCH_{}", tag.to_uppercase()),
        )),
    };
    let port = free_port()?;
    let admin_token = format!("bench-{:016x}", rand::random::<u64>());
    let log_is_temporary = opts.log_path.is_none();
    let log_path = opts
        .log_path
        .map(Path::to_path_buf)
        .unwrap_or_else(|| std::env::temp_dir().join(format!("flashsale-bench-{tag}.log")));
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
        .env("FLASHSALE_ADMIN_TOKEN", &admin_token)
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
    let base_url = format!("http://127.0.0.1:{port}");
    let mut spawned = Spawned {
        child,
        pid,
        base_url,
        admin_token,
        env,
        log_path,
        log_is_temporary,
        database_name,
        nats_url: opts.nats_url.to_owned(),
    };
    if let Err(e) = spawned.wait_ready().await {
        spawned.shutdown(false).await;
        return Err(e);
    }
    Ok(spawned)
}

impl Spawned {
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

    /// Stops the server (SIGTERM, then SIGKILL after `STOP_MAX`) and, unless `keep`,
    /// drops its database, deletes its Redis keys and its NATS stream. Problems are
    /// printed, not returned: cleanup goes as far as it can.
    pub async fn shutdown(mut self, keep: bool) {
        // SAFETY: kill(2) with a pid we spawned and still own (not yet reaped, so the
        // pid cannot have been reused) and a valid signal number.
        let sent = unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGTERM) } == 0;
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
        if keep {
            eprintln!(
                "flashsale-bench: kept database {}, Redis prefix {}, NATS stream {}",
                self.database_name,
                self.env.redis_prefix,
                self.env.nats.as_ref().map_or("-", |n| n.1.as_str())
            );
            return;
        }
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
        match RedisProbe::connect(&self.env.redis_url).await {
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
                let client = async_nats::connect(&self.nats_url)
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
        if self.log_is_temporary {
            let _ = std::fs::remove_file(&self.log_path);
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
}
