use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::process::{self, private_server, NotReady};

/// Longest wait for a fresh `redis-server` to answer PING. It normally takes
/// a few milliseconds; the bound is for a machine busy compiling.
const REDIS_START_TIMEOUT: Duration = Duration::from_secs(15);

/// How many free ports [`PrivateRedis::start`] tries: the port from
/// [`free_port`](crate::free_port) can be taken by someone else before redis binds it.
const START_ATTEMPTS: u32 = 3;

/// Bound on one readiness probe (connect + PING + reply).
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Name of the log file (redis-server's stdout) inside the temp dir.
const LOG_FILE: &str = "redis.log";

private_server! {
    /// A `redis-server` of the test's own, on a free port of 127.0.0.1, keeping
    /// nothing on disk. Its URL (`redis://127.0.0.1:N/`, what the service's config and
    /// the `redis` crate take), address, kill9 (a crash: no shutdown, clients see their
    /// connections reset) are [`PrivateServer`](crate::PrivateServer)'s.
    ///
    /// Why: crash tests must kill Redis (and see what the service does while it
    /// is gone and after it comes back empty) without touching the shared Redis
    /// on 6379 that every other test uses. The process is a child of the test;
    /// dropping this value kills it and removes its directory.
    PrivateRedis("redis-server", "redis://127.0.0.1:{}/", launch)
}

impl PrivateRedis {
    /// Starts `redis-server --port N --bind 127.0.0.1 --save "" --appendonly no
    /// --dir <tempdir>` on a free port and waits (bounded) until it answers
    /// PING.
    ///
    /// Why: a test gets a server that is ready for use when this returns,
    /// and one that persists nothing, so [`restart`](Self::restart) gives an
    /// empty server like a real crash without persistence would.
    pub async fn start() -> io::Result<PrivateRedis> {
        let dir = tempfile::Builder::new().prefix("fs-redis-").tempdir()?;
        Self::start_in(dir).await
    }

    /// Kills the server if it runs, then starts it again on the same port,
    /// empty, and waits (bounded) until it answers PING.
    ///
    /// Why: tests of recovery after a Redis crash need the server back at
    /// the address the service already knows, and without its data.
    pub async fn restart(&mut self) -> io::Result<()> {
        self.server.kill9()?;
        // Nothing should be there (no RDB, no AOF), but an empty restart is
        // the contract: make sure.
        for leftover in ["dump.rdb", "appendonlydir"] {
            let path = self.server.dir.path().join(leftover);
            if path.is_dir() {
                std::fs::remove_dir_all(&path)?;
            } else if path.exists() {
                std::fs::remove_file(&path)?;
            }
        }
        self.server.restart().await
    }

    /// Kills the server with SIGKILL and starts it again on the same port from the last
    /// snapshot a `SAVE` wrote (empty if there is none), as a new process (a new
    /// `run_id`), and waits (bounded) until it answers PING.
    ///
    /// Why: a Redis restarted from an RDB file, or a replica promoted after a failover,
    /// comes back with an older copy of the data: every write after the copy is lost,
    /// releases and restocks as much as reservations.
    pub async fn restart_from_snapshot(&mut self) -> io::Result<()> {
        self.server.restart().await
    }
}

/// Spawns redis-server on `port` with its files in `dir` and waits until it
/// answers PING.
async fn launch(dir: &Path, port: u16) -> Result<Child, NotReady> {
    let log = dir.join(LOG_FILE);
    let mut child =
        process::spawn_logged(&mut redis_server(dir, port), &log).map_err(NotReady::Failed)?;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    process::wait_ready(
        &mut child,
        REDIS_START_TIMEOUT,
        "redis-server",
        &log,
        || answers_ping(addr),
    )
    .await?;
    Ok(child)
}

/// `redis-server` on `port` of 127.0.0.1, in the foreground, persisting nothing, its
/// files in `dir`; what the private server runs, and a cluster node with more.
pub(crate) fn redis_server(dir: &Path, port: u16) -> Command {
    let mut cmd = Command::new("redis-server");
    cmd.arg("--port")
        .arg(port.to_string())
        .args(["--bind", "127.0.0.1"])
        .args(["--save", ""])
        .args(["--appendonly", "no"])
        .args(["--daemonize", "no"])
        .arg("--dir")
        .arg(dir);
    cmd
}

/// True if a server at `addr` answers a plain-text PING with PONG.
async fn answers_ping(addr: SocketAddr) -> bool {
    let attempt = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(b"PING\r\n").await?;
        let mut reply = [0u8; 7];
        stream.read_exact(&mut reply).await?;
        Ok::<bool, io::Error>(&reply == b"+PONG\r\n")
    };
    process::probe(PROBE_TIMEOUT, attempt).await
}
