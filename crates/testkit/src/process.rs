//! Child-process plumbing shared by the private servers.

use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io::{self, Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::port::free_port;

/// Pause between two readiness probes of a starting server.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

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
    let out = log_file(log)?;
    let err = out.try_clone()?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .spawn()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("could not run {:?}: {e}", cmd.get_program()),
            )
        })
}

/// Same as [`spawn_logged`] for a tokio command (used for one-shot tools
/// such as `mariadb-install-db` whose end we await).
pub(crate) fn spawn_logged_tokio(
    cmd: &mut tokio::process::Command,
    log: &Path,
) -> io::Result<tokio::process::Child> {
    let out = log_file(log)?;
    let err = out.try_clone()?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .spawn()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("could not run {:?}: {e}", cmd.as_std().get_program()),
            )
        })
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

/// Runs `attempt` until it starts its server(s), at most `attempts` times, and returns
/// what the first success returned.
///
/// Why: a private server takes ports that were free a moment before it bound them, so
/// another process may take one in between; the server then exits at start
/// ([`NotReady::Exited`]) and a new attempt, which picks new ports, is the cure. Any
/// other failure ([`NotReady::Failed`]: a timeout, a missing binary) would fail again,
/// and is returned at once. `what` names the server in the log and the final error.
pub(crate) async fn start_retrying<T, F, Fut>(
    what: &str,
    attempts: u32,
    mut attempt: F,
) -> io::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, NotReady>>,
{
    let mut last_err = None;
    for n in 1..=attempts {
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

/// A private server of one port: the port it serves on 127.0.0.1, the temp dir its
/// files live in, and its process while it runs. Dropping it kills the process, then
/// removes the dir.
///
/// Why: `mariadbd`, `redis-server` and `nats-server` start, stop and restart alike; only
/// how each launches and tells it is ready differs.
#[derive(Debug)]
pub(crate) struct Server {
    /// The server's name in logs and errors.
    what: &'static str,
    pub(crate) port: u16,
    pub(crate) dir: TempDir,
    pub(crate) child: Option<Child>,
}

impl Server {
    /// Starts `launch` (given `dir`'s path and a port from [`free_port`]) at most
    /// `attempts` times, on a new port each time, as [`start_retrying`] says.
    pub(crate) async fn start<F, Fut>(
        what: &'static str,
        attempts: u32,
        dir: TempDir,
        mut launch: F,
    ) -> io::Result<Server>
    where
        F: FnMut(PathBuf, u16) -> Fut,
        Fut: Future<Output = Result<Child, NotReady>>,
    {
        let (port, child) = start_retrying(what, attempts, || {
            let port = free_port();
            let started = launch(dir.path().to_owned(), port);
            async move { started.await.map(|child| (port, child)) }
        })
        .await?;
        Ok(Server {
            what,
            port,
            dir,
            child: Some(child),
        })
    }

    /// `127.0.0.1:N` for this server.
    pub(crate) fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// Kills the server with SIGKILL and waits until it is gone (its port is closed when
    /// this returns). Does nothing if it is not running.
    pub(crate) fn kill9(&mut self) -> io::Result<()> {
        match self.child.take() {
            Some(mut child) => kill9(&mut child),
            None => Ok(()),
        }
    }
}

impl Drop for Server {
    /// Kills the server so no test leaves one behind; the temp dir is removed right after.
    fn drop(&mut self) {
        if let Err(e) = self.kill9() {
            tracing::warn!(port = self.port, error = %e, "could not kill private {}", self.what);
        }
    }
}

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
