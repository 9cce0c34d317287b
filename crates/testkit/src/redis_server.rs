use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::process::{private_server, NotReady, Startup};

/// How `redis-server` starts, as a private server or a cluster node: it answers within
/// a few milliseconds, and the 15 s bound is for a machine busy compiling; one probe
/// (connect, PING, reply) is bounded by 1 s.
pub(crate) const REDIS_SERVER: Startup = Startup {
    what: "redis-server",
    log: "redis.log",
    timeout: Duration::from_secs(15),
    probe_timeout: Duration::from_secs(1),
};

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
    PrivateRedis(REDIS_SERVER, "redis://127.0.0.1:{}/", launch)
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
    let mut child = REDIS_SERVER.spawn(&mut redis_server(dir, port), dir)?;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    REDIS_SERVER
        .wait_ready(&mut child, dir, || answers_ping(addr))
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
    REDIS_SERVER.probe(attempt).await
}
