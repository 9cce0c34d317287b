use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use serde_json::Value;
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::cluster::{poll_until, QUORUM_NODE_COUNT as NODE_COUNT};
use crate::nats_server::{greets, CONFIG_FILE, NATS_SERVER, STORE_DIR};
use crate::port::free_port;
use crate::process::{self, NotReady};

/// The cluster's name (`cluster { name }`): routes only join servers of the same name.
const CLUSTER_NAME: &str = "fs-test";

/// Longest wait, once every server greets, until each is routed to the two others and
/// names the same JetStream metadata leader: half a second here from a cold start; the
/// bound is for a busy machine.
const FORM_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest wait for a stream to have a leader that every live server names: an election
/// after a kill takes 4–10 s (nats-server's election timeout, then a vote); three times
/// that is room for a busy machine and a second election.
const LEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// Bound on one request to a server's monitoring port (connect, send, read the answer).
const MONITOR_TIMEOUT: Duration = Duration::from_secs(2);

/// Largest monitoring answer read: `/jsz?streams=true` of a test's few streams is a few
/// kilobytes.
const MONITOR_BYTES_MAX: u64 = 1024 * 1024;

/// A NATS JetStream cluster of the test's own: three `nats-server` processes on free
/// ports of 127.0.0.1, routed to each other, each with JetStream, its store in a temp
/// dir, and its HTTP monitoring port.
///
/// Why: events on a replicated stream must be tested through what only a cluster does
/// (a stream's leader dying and another elected while the relay publishes, a server
/// coming back and catching up), without touching the shared nats-server on 4222.
/// Dropping this value kills every server and removes the directory.
///
/// Servers are named by their index, 0..3, everywhere (`n1`, `n2`, `n3` to NATS).
#[derive(Debug)]
pub struct NatsCluster {
    nodes: Vec<Node>,
    dir: TempDir,
}

/// One nats-server of the cluster.
#[derive(Debug)]
struct Node {
    /// `server_name`, as the monitoring port names leaders.
    name: String,
    client_port: u16,
    http_port: u16,
    dir: PathBuf,
    /// None once killed.
    child: Option<Child>,
}

/// What a server holds of a stream (its own copy, which may lag the leader's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamCopy {
    pub messages: u64,
    pub last_seq: u64,
}

impl NatsCluster {
    /// Starts three servers (all at once), and waits (bounded) until each greets
    /// clients, is routed to both others, and names the same JetStream metadata leader:
    /// from then on a replicated stream can be created. Takes about half a second.
    ///
    /// Why: a test gets a cluster ready for streams of three replicas when this returns.
    pub async fn start() -> io::Result<NatsCluster> {
        let cluster = process::start_retrying("the nats cluster", || async {
            let dir = tempfile::Builder::new()
                .prefix("fs-nats-cluster-")
                .tempdir()
                .map_err(NotReady::Failed)?;
            // Built before the servers start, so a failure half-way kills those already
            // running (Drop).
            let mut cluster = NatsCluster {
                nodes: Vec::with_capacity(NODE_COUNT),
                dir,
            };
            cluster.launch_all().await?;
            Ok(cluster)
        })
        .await?;
        cluster.wait_formed().await?;
        tracing::debug!(urls = %cluster.urls(), "nats cluster ready");
        Ok(cluster)
    }

    /// `nats://127.0.0.1:N1,nats://127.0.0.1:N2,nats://127.0.0.1:N3`: every server,
    /// killed ones included.
    ///
    /// Why: the format of `FLASHSALE_NATS_URL` for a cluster.
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(|n| client_url(n.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Whether server `i` runs.
    pub fn is_running(&self, i: usize) -> bool {
        self.nodes.get(i).is_some_and(|n| n.child.is_some())
    }

    /// Kills server `i` with SIGKILL and reaps it; returns at once, without waiting for
    /// the cluster to notice. Does nothing if it was killed before.
    ///
    /// Why: a crashed server: no shutdown, no leadership handed over, its clients' and
    /// routes' connections reset.
    pub fn kill9(&mut self, i: usize) -> io::Result<()> {
        let node = self.node_mut(i)?;
        match node.child.take() {
            Some(mut child) => process::kill9(&mut child),
            None => Ok(()),
        }
    }

    /// Kills server `i` if it runs, starts it again with the same ports, name and store,
    /// and waits (bounded) until it greets clients, is routed to the two others and
    /// names the metadata leader they name. Its streams catch up by themselves after
    /// that ([`stream_copy`](Self::stream_copy) shows how far).
    ///
    /// Why: a crashed server coming back where the clients and the other servers look for
    /// it, with what it had stored.
    pub async fn restart(&mut self, i: usize) -> io::Result<()> {
        self.kill9(i)?;
        let node = self.node_mut(i)?;
        let mut child = spawn(&node.dir)?;
        wait_greets(&mut child, &node.dir, node.client_port).await?;
        node.child = Some(child);
        self.wait_formed().await
    }

    /// The server that leads `stream`, when every live server holding a copy of it names
    /// the same live server; None while they disagree or name none (an election), or none
    /// holds it.
    ///
    /// Why: a test must know which server to kill to take a stream's leader away, and
    /// when another has taken over.
    pub async fn stream_leader(&self, stream: &str) -> io::Result<Option<usize>> {
        let mut agreed: Option<usize> = None;
        for i in self.live() {
            let Some(detail) = self.stream_detail(i, stream).await? else {
                continue;
            };
            let named = detail["cluster"]["leader"].as_str().unwrap_or("");
            let Some(leader) = self.live().find(|&j| self.nodes[j].name == named) else {
                return Ok(None);
            };
            match agreed {
                Some(l) if l != leader => return Ok(None),
                _ => agreed = Some(leader),
            }
        }
        Ok(agreed)
    }

    /// Waits (bounded by 30 s) until `stream` has a leader other than `not` that every
    /// live server names ([`stream_leader`](Self::stream_leader)), and returns it.
    ///
    /// Why: after a kill, a test's next step must meet the cluster after the election.
    pub async fn wait_stream_leader(&self, stream: &str, not: Option<usize>) -> io::Result<usize> {
        let what = format!("a leader of stream {stream} other than {not:?}");
        poll_until(LEADER_TIMEOUT, &what, || async {
            match self.stream_leader(stream).await {
                Ok(Some(leader)) if Some(leader) != not => Ok(leader),
                Ok(leader) => Err(format!("the leader is {leader:?}")),
                Err(e) => Err(e.to_string()),
            }
        })
        .await
    }

    /// What server `i` holds of `stream` (its copy's message count and last sequence, as
    /// its monitoring port says); None if it holds no copy.
    ///
    /// Why: to see a restarted server catch up with the leader.
    pub async fn stream_copy(&self, i: usize, stream: &str) -> io::Result<Option<StreamCopy>> {
        let Some(detail) = self.stream_detail(i, stream).await? else {
            return Ok(None);
        };
        let state = &detail["state"];
        match (state["messages"].as_u64(), state["last_seq"].as_u64()) {
            (Some(messages), Some(last_seq)) => Ok(Some(StreamCopy { messages, last_seq })),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("server {i}: no state of stream {stream} in {detail}"),
            )),
        }
    }

    fn node(&self, i: usize) -> io::Result<&Node> {
        self.nodes.get(i).ok_or_else(|| not_ours(i))
    }

    fn node_mut(&mut self, i: usize) -> io::Result<&mut Node> {
        self.nodes.get_mut(i).ok_or_else(|| not_ours(i))
    }

    /// The indexes of the running servers.
    fn live(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.nodes.len()).filter(|&i| self.is_running(i))
    }

    /// Picks ports for three servers, writes their configurations and starts them all,
    /// then waits until each greets clients.
    async fn launch_all(&mut self) -> Result<(), NotReady> {
        let ports: Vec<(u16, u16, u16)> = (0..NODE_COUNT)
            .map(|_| (free_port(), free_port(), free_port()))
            .collect();
        let routes = ports
            .iter()
            .map(|(_, route, _)| format!("nats-route://127.0.0.1:{route}"))
            .collect::<Vec<_>>()
            .join(", ");
        for (i, &(client_port, route_port, http_port)) in ports.iter().enumerate() {
            let name = format!("n{}", i + 1);
            let dir = self.dir.path().join(&name);
            std::fs::create_dir(&dir).map_err(NotReady::Failed)?;
            let config = format!(
                "server_name: {name}\n\
                 listen: 127.0.0.1:{client_port}\n\
                 http: 127.0.0.1:{http_port}\n\
                 jetstream {{ store_dir: {store:?}, max_memory_store: 64MB, max_file_store: 1GB }}\n\
                 cluster {{ name: {CLUSTER_NAME}, listen: 127.0.0.1:{route_port}, routes: [{routes}] }}\n",
                store = dir.join(STORE_DIR).display().to_string(),
            );
            std::fs::write(dir.join(CONFIG_FILE), config).map_err(NotReady::Failed)?;
            let child = spawn(&dir).map_err(NotReady::Failed)?;
            // Pushed before the next starts, so that a failure kills it too (Drop).
            self.nodes.push(Node {
                name,
                client_port,
                http_port,
                dir,
                child: Some(child),
            });
        }
        for node in &mut self.nodes {
            if let Some(child) = node.child.as_mut() {
                wait_greets(child, &node.dir, node.client_port).await?;
            }
        }
        Ok(())
    }

    /// Waits (bounded by [`FORM_TIMEOUT`]) until every live server is routed to every
    /// other live one and all name one same metadata leader among them.
    async fn wait_formed(&self) -> io::Result<()> {
        poll_until(FORM_TIMEOUT, "the nats cluster to form", || self.formed()).await
    }

    /// Ok when the cluster is formed (see [`wait_formed`](Self::wait_formed)); else what
    /// is missing.
    async fn formed(&self) -> Result<(), String> {
        let live: Vec<usize> = self.live().collect();
        let mut leader: Option<String> = None;
        for &i in &live {
            let routez = self
                .monitor(i, "/routez")
                .await
                .map_err(|e| e.to_string())?;
            let routes = routez["num_routes"].as_u64().unwrap_or(0);
            if routes < (live.len() - 1) as u64 {
                return Err(format!("server {i} has {routes} routes"));
            }
            let jsz = self.monitor(i, "/jsz").await.map_err(|e| e.to_string())?;
            let named = jsz["meta_cluster"]["leader"].as_str().unwrap_or("");
            if !live.iter().any(|&j| self.nodes[j].name == named) {
                return Err(format!(
                    "server {i} names no live metadata leader ({named:?})"
                ));
            }
            match &leader {
                Some(l) if l != named => {
                    return Err(format!("servers name {l} and {named} as metadata leader"))
                }
                _ => leader = Some(named.to_owned()),
            }
        }
        Ok(())
    }

    /// The `stream_detail` entry of `stream` on server `i`'s `/jsz?streams=true`, if it
    /// holds a copy.
    async fn stream_detail(&self, i: usize, stream: &str) -> io::Result<Option<Value>> {
        let jsz = self.monitor(i, "/jsz?streams=true").await?;
        let accounts = jsz["account_details"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        Ok(accounts.into_iter().find_map(|account| {
            account["stream_detail"]
                .as_array()?
                .iter()
                .find(|s| s["name"] == stream)
                .cloned()
        }))
    }

    /// `GET path` on server `i`'s monitoring port, its JSON answer.
    async fn monitor(&self, i: usize, path: &str) -> io::Result<Value> {
        let port = self.node(i)?.http_port;
        let request = async {
            let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await?;
            // HTTP/1.0: the server closes the connection after its answer.
            let head = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
            stream.write_all(head.as_bytes()).await?;
            let mut answer = Vec::new();
            stream
                .take(MONITOR_BYTES_MAX)
                .read_to_end(&mut answer)
                .await?;
            Ok::<Vec<u8>, io::Error>(answer)
        };
        let answer = tokio::time::timeout(MONITOR_TIMEOUT, request)
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("server {i}: GET {path} took over {MONITOR_TIMEOUT:?}"),
                )
            })??;
        let text = String::from_utf8_lossy(&answer);
        let bad = |what: &str| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("server {i}: GET {path}: {what}: {text:.200}"),
            )
        };
        let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| bad("no body"))?;
        if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
            return Err(bad("not 200"));
        }
        serde_json::from_str(body).map_err(|_| bad("not JSON"))
    }
}

impl Drop for NatsCluster {
    /// Kills every server still running so no test leaves a nats-server behind; the temp
    /// dir is removed right after.
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                if let Err(e) = process::kill9(&mut child) {
                    tracing::warn!(server = %node.name, error = %e, "could not kill cluster nats-server");
                }
            }
        }
    }
}

/// Starts the server of `dir`'s configuration, its output in `dir`'s log.
fn spawn(dir: &Path) -> io::Result<Child> {
    process::spawn_logged(
        Command::new("nats-server")
            .arg("-c")
            .arg(dir.join(CONFIG_FILE)),
        &NATS_SERVER.log_in(dir),
    )
}

/// Waits (bounded as [`NATS_SERVER`] says) until the server `child` of `dir` greets
/// clients on `client_port`.
async fn wait_greets(child: &mut Child, dir: &Path, client_port: u16) -> Result<(), NotReady> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, client_port));
    NATS_SERVER.wait_ready(child, dir, || greets(addr)).await
}

/// `nats://127.0.0.1:<port>`.
fn client_url(port: u16) -> String {
    format!("nats://127.0.0.1:{port}")
}

/// The error for an index past the cluster's servers.
fn not_ours(i: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("the cluster has no server {i} (0..{NODE_COUNT})"),
    )
}
