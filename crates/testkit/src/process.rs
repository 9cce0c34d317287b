//! Child-process plumbing shared by the private servers.

use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::{self, Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::port::free_port;

/// Pause between two readiness probes of a starting server, or two status probes of
/// Galera nodes waiting for a state: short next to the second or so a start takes, long
/// enough not to load the servers with probes.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// How many times a private server, a cluster node or a whole cluster is started on
/// newly picked ports (see [`start_retrying`]): a port that was free when it was picked
/// can be taken by another process before the server binds it; three such losses in a
/// row mean something else is wrong.
pub(crate) const START_ATTEMPTS: u32 = 3;

/// How much of the end of a server's log goes into an error message: enough
/// for the reason it failed, short enough to read in a test failure.
const LOG_TAIL_BYTES: u64 = 2_000;

/// Opens (appending) the log file a child's stdout and stderr go to.
fn log_file(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// Spawns `cmd` with stdin closed and stdout/stderr appended to `log`, so
/// servers stay quiet in test output but their reasons for failing are kept.
pub(crate) fn spawn_logged(cmd: &mut Command, log: &Path) -> io::Result<Child> {
    let (out, err) = logged_stdio(log)?;
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| could_not_run(cmd.get_program(), e))
}

/// Same as [`spawn_logged`] for a tokio command (used for one-shot tools
/// such as `mariadb-install-db` whose end we await).
pub(crate) fn spawn_logged_tokio(
    cmd: &mut tokio::process::Command,
    log: &Path,
) -> io::Result<tokio::process::Child> {
    let (out, err) = logged_stdio(log)?;
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| could_not_run(cmd.as_std().get_program(), e))
}

/// A child's stdout and stderr, both appending to `log`.
fn logged_stdio(log: &Path) -> io::Result<(Stdio, Stdio)> {
    let out = log_file(log)?;
    let err = out.try_clone()?;
    Ok((Stdio::from(out), Stdio::from(err)))
}

/// The error of a spawn that failed, naming the program.
fn could_not_run(program: &std::ffi::OsStr, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("could not run {program:?}: {e}"))
}

/// Spawns the one-shot tool `cmd` as [`spawn_logged_tokio`] does and waits for it to
/// succeed, at most `bound`. On a failure or a timeout the error names it `what` and
/// quotes the end of `log`; on a timeout the tool is killed, and with it its process
/// group when it leads one (`process_group(0)`), so helpers it forked die too.
pub(crate) async fn run_bounded(
    cmd: &mut tokio::process::Command,
    log: &Path,
    bound: Duration,
    what: &str,
) -> io::Result<()> {
    let mut child = spawn_logged_tokio(cmd, log)?;
    let pgid = child.id();
    match tokio::time::timeout(bound, child.wait()).await {
        Ok(Ok(status)) if status.success() => Ok(()),
        Ok(Ok(status)) => Err(with_log_tail(
            io::ErrorKind::Other,
            &format!("{what} failed ({status})"),
            log,
        )),
        Ok(Err(e)) => Err(e),
        Err(_) => {
            // Fails harmlessly (no such group) when the tool does not lead one.
            if let Some(pgid) = pgid {
                let _ = signal_group(pgid, libc::SIGKILL);
            }
            let _ = child.kill().await;
            Err(with_log_tail(
                io::ErrorKind::TimedOut,
                &format!("{what} did not finish within {bound:?}"),
                log,
            ))
        }
    }
}

/// An error of `kind` saying `what`, followed by the end of `log`.
pub(crate) fn with_log_tail(kind: io::ErrorKind, what: &str, log: &Path) -> io::Error {
    io::Error::new(
        kind,
        format!("{what}; end of {}:\n{}", log.display(), log_tail(log)),
    )
}

/// SIGKILLs the child and reaps it, so its port and files are free when this
/// returns. Works on a stopped (SIGSTOP) child too.
pub(crate) fn kill9(child: &mut Child) -> io::Result<()> {
    // `kill` fails only if the child was already reaped; `wait` then
    // returns the cached status, so both errors are worth reporting only
    // when the wait fails.
    let _ = child.kill();
    child.wait().map(|_| ())
}

/// Sends `signal` to the process `pid`.
pub(crate) fn send_signal(pid: u32, signal: libc::c_int) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    // SAFETY: kill(2) has no memory-safety preconditions; `pid` is a child
    // we spawned and have not reaped, so it cannot name another process.
    let rc = unsafe { libc::kill(pid, signal) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sends `signal` to the whole process group `pgid` (used to end a tool
/// together with the helpers it forked).
pub(crate) fn signal_group(pgid: u32, signal: libc::c_int) -> io::Result<()> {
    let pgid = libc::pid_t::try_from(pgid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "pgid out of range"))?;
    // SAFETY: as in `send_signal`; a negative pid addresses the group.
    let rc = unsafe { libc::kill(-pgid, signal) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The last [`LOG_TAIL_BYTES`] of a log file, for error messages.
pub(crate) fn log_tail(path: &Path) -> String {
    let read = || -> io::Result<String> {
        let mut f = File::open(path)?;
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL_BYTES)))?;
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match read() {
        Ok(s) => s,
        Err(e) => format!("(could not read {}: {e})", path.display()),
    }
}

/// How a readiness wait ended badly.
pub(crate) enum NotReady {
    /// The process exited before it answered (typically: port taken).
    Exited(io::Error),
    /// Anything else: timed out, or could not even check the child.
    Failed(io::Error),
}

impl From<NotReady> for io::Error {
    fn from(e: NotReady) -> io::Error {
        match e {
            NotReady::Exited(e) | NotReady::Failed(e) => e,
        }
    }
}

/// True if `attempt` answers true within `bound`: one readiness probe of a server.
pub(crate) async fn probe<E>(
    bound: Duration,
    attempt: impl Future<Output = Result<bool, E>>,
) -> bool {
    matches!(tokio::time::timeout(bound, attempt).await, Ok(Ok(true)))
}

/// How one kind of server starts, the same whether it runs alone (a private server) or
/// as a cluster node: [`REDIS_SERVER`](crate::redis_server::REDIS_SERVER),
/// [`NATS_SERVER`](crate::nats_server::NATS_SERVER) and
/// [`MARIADBD`](crate::mariadb::MARIADBD).
///
/// Why: a kind's private server and its cluster nodes run the same program, log to the
/// same file name and are as quick to start; said once, the bounds cannot drift apart.
#[derive(Debug)]
pub(crate) struct Startup {
    /// The program, as logs and errors name it.
    pub(crate) what: &'static str,
    /// Its log (stdout and stderr) inside the server's directory.
    pub(crate) log: &'static str,
    /// Longest wait, from the spawn, until the server answers its readiness probe.
    pub(crate) timeout: Duration,
    /// Bound on one readiness probe.
    pub(crate) probe_timeout: Duration,
}

impl Startup {
    /// The server's log in its directory `dir`.
    pub(crate) fn log_in(&self, dir: &Path) -> PathBuf {
        dir.join(self.log)
    }

    /// Spawns `cmd`, the server of `dir`, as [`spawn_logged`] does, into its log.
    pub(crate) fn spawn(&self, cmd: &mut Command, dir: &Path) -> Result<Child, NotReady> {
        spawn_logged(cmd, &self.log_in(dir)).map_err(NotReady::Failed)
    }

    /// [`wait_ready`] for the server `child` of `dir`, bounded by [`timeout`](Self::timeout).
    pub(crate) async fn wait_ready<F, Fut>(
        &self,
        child: &mut Child,
        dir: &Path,
        probe: F,
    ) -> Result<(), NotReady>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        wait_ready(child, self.timeout, self.what, &self.log_in(dir), probe).await
    }

    /// [`probe`], bounded by [`probe_timeout`](Self::probe_timeout).
    pub(crate) async fn probe<E>(&self, attempt: impl Future<Output = Result<bool, E>>) -> bool {
        probe(self.probe_timeout, attempt).await
    }
}

/// Polls `probe` until it returns true, the child exits, or `bound` passes.
///
/// `what` names the server and `log` its log file, both for the error
/// message.
pub(crate) async fn wait_ready<F, Fut>(
    child: &mut Child,
    bound: Duration,
    what: &str,
    log: &Path,
    mut probe: F,
) -> Result<(), NotReady>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + bound;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                return Err(NotReady::Exited(io::Error::other(format!(
                    "{what} exited before it was ready ({status}); end of {}:\n{}",
                    log.display(),
                    log_tail(log)
                ))));
            }
            Ok(None) => {}
            Err(e) => {
                let _ = kill9(child);
                return Err(NotReady::Failed(e));
            }
        }
        if probe().await {
            return Ok(());
        }
        if Instant::now() >= deadline {
            // Do not leave a half-started server behind.
            let _ = kill9(child);
            return Err(NotReady::Failed(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "{what} was not ready after {bound:?}; end of {}:\n{}",
                    log.display(),
                    log_tail(log)
                ),
            )));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Runs `attempt` until it starts its server(s), at most [`START_ATTEMPTS`] times, and
/// returns what the first success returned.
///
/// Why: a private server takes ports that were free a moment before it bound them, so
/// another process may take one in between; the server then exits at start
/// ([`NotReady::Exited`]) and a new attempt, which picks new ports, is the cure. Any
/// other failure ([`NotReady::Failed`]: a timeout, a missing binary) would fail again,
/// and is returned at once. `what` names the server in the log and the final error.
pub(crate) async fn start_retrying<T, F, Fut>(what: &str, mut attempt: F) -> io::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, NotReady>>,
{
    let mut last_err = None;
    for n in 1..=START_ATTEMPTS {
        match attempt().await {
            Ok(started) => return Ok(started),
            Err(NotReady::Exited(e)) => {
                tracing::warn!(attempt = n, error = %e, "{what} did not start; trying other ports");
                last_err = Some(e);
            }
            Err(NotReady::Failed(e)) => return Err(e),
        }
    }
    Err(last_err.unwrap_or_else(|| io::Error::other(format!("{what} did not start"))))
}

/// What a private server's process is started with: `dir`, its temp dir's path, and
/// `port`. The future spawns it and waits until it is ready.
pub(crate) type Launch = fn(PathBuf, u16) -> Pin<Box<dyn Future<Output = LaunchResult> + Send>>;
type LaunchResult = Result<Child, NotReady>;

/// What tells one kind of private server from another: how it starts (its name in logs
/// and errors among that), its URL on a port, and how it launches.
#[derive(Debug)]
pub(crate) struct Kind {
    pub(crate) startup: &'static Startup,
    pub(crate) url: fn(u16) -> String,
    pub(crate) launch: Launch,
}

/// A private server of one port: the port it serves on 127.0.0.1, the temp dir its
/// files live in, and its process while it runs. Dropping it kills the process, then
/// removes the dir. [`PrivateRedis`](crate::PrivateRedis),
/// [`PrivateMariadb`](crate::PrivateMariadb) and [`PrivateNats`](crate::PrivateNats)
/// are one each, and have its methods.
///
/// Why: `mariadbd`, `redis-server` and `nats-server` start, stop and restart alike; only
/// how each launches and tells it is ready differs.
#[derive(Debug)]
pub struct PrivateServer {
    kind: &'static Kind,
    pub(crate) port: u16,
    pub(crate) dir: TempDir,
    pub(crate) child: Option<Child>,
}

impl PrivateServer {
    /// Starts `kind` (given `dir`'s path and a port from [`free_port`]) at most
    /// [`START_ATTEMPTS`] times, on a new port each time, as [`start_retrying`] says.
    pub(crate) async fn start(kind: &'static Kind, dir: TempDir) -> io::Result<PrivateServer> {
        let (port, child) = start_retrying(kind.startup.what, || {
            let port = free_port();
            let started = (kind.launch)(dir.path().to_owned(), port);
            async move { started.await.map(|child| (port, child)) }
        })
        .await?;
        Ok(PrivateServer {
            kind,
            port,
            dir,
            child: Some(child),
        })
    }

    /// The URL clients take: `redis://127.0.0.1:N/`, `mysql://root@127.0.0.1:N` (without
    /// a database name: the form [`TestDb::create`](crate::TestDb::create) takes) or
    /// `nats://127.0.0.1:N`.
    pub fn url(&self) -> String {
        (self.kind.url)(self.port)
    }

    /// `127.0.0.1:N` for this server.
    ///
    /// Why: to put a [`TcpProxy`](crate::TcpProxy) in front of it.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// Whether the server process is running.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Kills the server with SIGKILL and waits until it is gone (its port is closed when
    /// this returns). Does nothing if it is not running.
    ///
    /// Why: simulates a crash or power loss: no clean shutdown, clients see their
    /// connections reset, only what the server made durable survives.
    pub fn kill9(&mut self) -> io::Result<()> {
        match self.child.take() {
            Some(mut child) => kill9(&mut child),
            None => Ok(()),
        }
    }

    /// Kills the server if it runs, then starts it again on the same port with what its
    /// dir holds, and waits (bounded, a database's crash recovery included) until it is
    /// ready. ([`PrivateRedis::restart`](crate::PrivateRedis::restart) empties it first.)
    ///
    /// Why: recovery tests need the server back at the address the service already
    /// knows, with whatever it had made durable before the crash.
    pub async fn restart(&mut self) -> io::Result<()> {
        self.kill9()?;
        let child = (self.kind.launch)(self.dir.path().to_owned(), self.port).await?;
        self.child = Some(child);
        Ok(())
    }
}

impl Drop for PrivateServer {
    /// Kills the server so no test leaves one behind; the temp dir is removed right after.
    fn drop(&mut self) {
        if let Err(e) = self.kill9() {
            tracing::warn!(port = self.port, error = %e, "could not kill private {}", self.kind.startup.what);
        }
    }
}

/// Declares a private server type: the struct around a [`PrivateServer`], which it
/// derefs to for the methods every kind has, and its `start_in(dir)`, which starts it
/// (as `startup` says, its URL `url` with the port for `{}`, `launch`ed at most
/// [`START_ATTEMPTS`] times) with its files in `dir`.
macro_rules! private_server {
    ($(#[$doc:meta])* $name:ident($startup:ident, $url:literal, $launch:ident)) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub struct $name {
            server: $crate::process::PrivateServer,
        }

        impl $name {
            async fn start_in(dir: tempfile::TempDir) -> std::io::Result<$name> {
                static KIND: $crate::process::Kind = $crate::process::Kind {
                    startup: &$startup,
                    url: |port| format!($url, port),
                    launch: |dir, port| Box::pin(async move { $launch(&dir, port).await }),
                };
                let server = $crate::process::PrivateServer::start(&KIND, dir).await?;
                Ok($name { server })
            }
        }

        impl std::ops::Deref for $name {
            type Target = $crate::process::PrivateServer;
            fn deref(&self) -> &Self::Target {
                &self.server
            }
        }

        impl std::ops::DerefMut for $name {
            fn deref_mut(&mut self) -> &mut Self::Target {
                &mut self.server
            }
        }
    };
}
pub(crate) use private_server;

/// True when this process runs as root, where `mariadbd` and
/// `mariadb-install-db` need `--user=root` to agree to run.
pub(crate) fn running_as_root() -> bool {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// How long [`wait_stopped`] waits for a SIGSTOP to take hold: far above the few
/// microseconds it takes on an idle box, enough for a CI box under full load.
const STOP_SETTLE_MAX: std::time::Duration = std::time::Duration::from_secs(2);

/// Waits until `pid` is shown stopped in /proc (state `T`): kill(2) only queues a
/// SIGSTOP, and a thread already running on another core may answer one more request
/// before it takes hold. Returns an error when it has not stopped within
/// `STOP_SETTLE_MAX`.
pub(crate) fn wait_stopped(pid: u32) -> io::Result<()> {
    let started = std::time::Instant::now();
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        // The state follows the command name, which is in parentheses and may hold spaces.
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        if state == Some('T') {
            return Ok(());
        }
        if started.elapsed() > STOP_SETTLE_MAX {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("process {pid} not stopped after SIGSTOP (state {state:?})"),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}
