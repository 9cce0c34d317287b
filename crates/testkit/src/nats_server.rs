use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::process::{private_server, NotReady, Startup};

/// How `nats-server` starts, as a private server or a cluster node: it greets clients
/// within tens of milliseconds (JetStream recovers its store first), and the 15 s bound
/// is for a machine busy compiling; one probe (connect, read the INFO greeting) is
/// bounded by 1 s.
pub(crate) const NATS_SERVER: Startup = Startup {
    what: "nats-server",
    log: "nats.log",
    timeout: Duration::from_secs(15),
    probe_timeout: Duration::from_secs(1),
};

/// JetStream's store directory inside a server's directory; kept across restarts.
pub(crate) const STORE_DIR: &str = "jetstream";
/// Name of the configuration file (settings without a command-line flag, all of a
/// cluster node's) in a server's directory.
pub(crate) const CONFIG_FILE: &str = "nats.conf";

private_server! {
    /// A `nats-server` with JetStream of the test's own, on a free port of 127.0.0.1, its
    /// store in a temp dir. Its URL (`nats://127.0.0.1:N`), address, and restart (on the
    /// same port with the same store, and so the streams and their deduplication state
    /// it had: the broker coming back where the service already looks for it) are
    /// [`PrivateServer`](crate::PrivateServer)'s.
    ///
    /// Why: the "broker down" tests must stop the broker mid-sale and bring it back with its
    /// streams, without touching the shared nats-server on 4222. Dropping this value kills
    /// the process and removes its directory.
    PrivateNats(NATS_SERVER, "nats://127.0.0.1:{}", launch)
}

impl PrivateNats {
    /// Starts `nats-server -a 127.0.0.1 -p N -js -sd <tempdir>/jetstream` on a free port
    /// and waits (bounded) until it greets clients.
    pub async fn start() -> io::Result<PrivateNats> {
        Self::start_with_max_payload(None).await
    }

    /// [`start`](Self::start), with the largest message the server accepts
    /// (`max_payload`, 1 MiB by default) set to `max_payload` bytes.
    ///
    /// Why: a broker configured to take smaller messages than the default, which the
    /// publisher must learn from its greeting rather than assume.
    pub async fn start_with_max_payload(max_payload: Option<usize>) -> io::Result<PrivateNats> {
        let dir = tempfile::Builder::new().prefix("fs-nats-").tempdir()?;
        if let Some(bytes) = max_payload {
            std::fs::write(
                dir.path().join(CONFIG_FILE),
                format!("max_payload: {bytes}\n"),
            )?;
        }
        Self::start_in(dir).await
    }

    /// Where JetStream keeps its streams (survives [`restart`](crate::PrivateServer::restart)).
    pub fn store_dir(&self) -> PathBuf {
        self.server.dir.path().join(STORE_DIR)
    }

    /// Kills the server with SIGKILL and waits until it is gone (its port is closed when
    /// this returns). Does nothing if it is not running.
    ///
    /// Why: the broker going away without notice, as in a crash or a network cut.
    pub fn stop(&mut self) -> io::Result<()> {
        self.server.kill9()
    }
}

/// Spawns nats-server on `port` with its store and log in `dir` and waits until it
/// greets clients.
async fn launch(dir: &Path, port: u16) -> Result<Child, NotReady> {
    let mut cmd = Command::new("nats-server");
    cmd.args(["-a", "127.0.0.1"])
        .arg("-p")
        .arg(port.to_string())
        .arg("-js")
        .arg("-sd")
        .arg(dir.join(STORE_DIR));
    let config = dir.join(CONFIG_FILE);
    if config.exists() {
        cmd.arg("-c").arg(config);
    }
    let mut child = NATS_SERVER.spawn(&mut cmd, dir)?;
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    NATS_SERVER
        .wait_ready(&mut child, dir, || greets(addr))
        .await?;
    Ok(child)
}

/// True if a server at `addr` sends the NATS greeting (`INFO {…}`) on connect.
pub(crate) async fn greets(addr: SocketAddr) -> bool {
    let attempt = async {
        let mut stream = TcpStream::connect(addr).await?;
        let mut greeting = [0u8; 5];
        stream.read_exact(&mut greeting).await?;
        Ok::<bool, io::Error>(&greeting == b"INFO ")
    };
    NATS_SERVER.probe(attempt).await
}
