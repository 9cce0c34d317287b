use std::ffi::{CString, OsString};
use std::fmt;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::{lchown, MetadataExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sqlx::{Connection, MySqlConnection, Row};
use tempfile::TempDir;
use tokio::sync::OnceCell;

use crate::cluster::QUORUM_NODE_COUNT as NODE_COUNT;
use crate::mariadb::{
    install, path_arg, DATA_DIR, INNODB_BUFFER_POOL_SIZE, INNODB_LOG_FILE_SIZE, MARIADBD, TMP_DIR,
};
use crate::port::{
    addr_list, galera_ports, GALERA_IST_OFFSET, GALERA_PORT_OFFSET, GALERA_SST_OFFSET,
};
use crate::process::{self, NotReady, POLL_INTERVAL};

/// The Galera 4 provider of Debian's `galera-4` package (a dependency of
/// `mariadb-server`).
const GALERA_PROVIDER: &str = "/usr/lib/galera/libgalera_smm.so";

/// How often a node tells the others it is alive when it has nothing else to send.
/// Galera's default (1 s) with its default suspect timeout (5 s) makes a dead node take
/// six seconds or more to leave the cluster; half a second lets the shorter
/// [`EVS_SUSPECT_TIMEOUT`] below work.
const EVS_KEEPALIVE_PERIOD: &str = "PT0.5S";
/// How long a node may be silent before the others suspect it and, once all agree, drop
/// it from the cluster: what a test waits for after a kill or a SIGSTOP. Four keepalive
/// periods, so one late keepalive on a machine busy compiling does not cost a healthy
/// node its membership; Galera's default (5 s) would make every fault test longer.
const EVS_SUSPECT_TIMEOUT: &str = "PT2S";
/// How long a node may be silent before it is dropped even without everybody's
/// agreement (Galera wants it above [`EVS_SUSPECT_TIMEOUT`]; its default is 15 s).
const EVS_INACTIVE_TIMEOUT: &str = "PT6S";
/// How often a node resends its join message while the members agree on a new view.
/// Galera's default (1 s) is made for real networks; on loopback every message arrives
/// at once, and the default only adds waits: three nodes formed a cluster in 2.3 s
/// here with the defaults, in 1.2-1.5 s with this, and in 0.5-1.2 s with
/// [`EVS_INACTIVE_CHECK_PERIOD`] too. Only membership changes send these messages, so
/// the shorter period costs nothing in between.
const EVS_JOIN_RETRANS_PERIOD: &str = "PT0.1S";
/// How often a node checks whether a peer went silent (Galera's default is 0.5 s):
/// with [`EVS_JOIN_RETRANS_PERIOD`], it took a cluster's formation here from 1.2-1.5 s
/// down to 0.5-1.2 s, and it lets a dead node leave closer to
/// [`EVS_SUSPECT_TIMEOUT`]. A check looks at two peers' last message times: nothing.
const EVS_INACTIVE_CHECK_PERIOD: &str = "PT0.1S";
/// Size of each node's write-set cache (a file the node creates at start): big enough
/// for every write a test makes while a node is down, so the node rejoins by IST (the
/// missing write-sets only); small, since three nodes each create it. Galera's default
/// is 128 MiB.
const GCACHE_SIZE: &str = "64M";

/// The OS user `mariadbd` runs as when this process is root: the rsync state transfer
/// refuses to run as root, and Debian's `mariadb-server` creates this user.
const SERVER_USER: &str = "mysql";

/// Longest wait for a restarted node to be Synced in a cluster of three again (3.0-3.4 s
/// here by IST, most of it the rsync script that prepares even an IST; a full SST, when
/// the others' write-set cache no longer holds what the node missed, takes about 4 s).
const REJOIN_TIMEOUT: Duration = Duration::from_secs(60);

/// Longest wait for a clean shutdown (SIGTERM) of a node (0.15 s here); past it the
/// node is killed.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// How often [`GaleraCluster::reap_on_exit`]'s watcher checks that the test process is
/// still alive: the nodes outlive a finished run by at most this.
const REAPER_POLL_SECS: u32 = 1;

/// `view_id` type of a primary view in `gvwstate.dat` (`V_PRIM` in Galera's
/// `gcomm/view.hpp`, what Galera itself writes there).
const PRIMARY_VIEW_TYPE: u8 = 3;
/// Sequence number of the view written to `gvwstate.dat`: any will do, the nodes agree
/// on a new view as soon as they meet.
const SAVED_VIEW_SEQ: u32 = 1;

/// Files of the template's data directory not copied to the nodes: the write-set cache
/// (64 MiB that each node creates for itself) and the saved view (each node gets its
/// own, see [`GaleraCluster::start`]).
const TEMPLATE_SKIP: [&str; 2] = ["galera.cache", "gvwstate.dat"];
/// Galera's saved state in a data directory: cluster UUID, last seqno, and whether the
/// node may bootstrap a cluster.
const GRASTATE: &str = "grastate.dat";
/// Galera's saved primary view in a data directory, read at start (`pc.recovery`).
const GVWSTATE: &str = "gvwstate.dat";
/// Output of the last `mariadbd --wsrep-recover` inside a node's directory.
const RECOVER_LOG: &str = "recover.log";
/// What `mariadbd --wsrep-recover` writes before the position it found.
const RECOVERED_MARK: &str = "Recovered position: ";

/// A 3-node MariaDB Galera cluster of the test's own: three `mariadbd` children on
/// 127.0.0.1, each with its own data directory, SQL port, Galera port `G`, IST port
/// `G+1` and rsync SST port, all under one temp dir; root logs in over TCP with an
/// empty password. Nodes are numbered 0, 1, 2 (`nodes_setting` order); a method given
/// another number panics, as an index out of bounds does.
///
/// Why: the ledger's Galera support (a writer that fails over between nodes, writes
/// that certification refuses, a node outside the Primary Component) must be tested
/// against a real cluster whose nodes a test may kill -9, pause and bring back, which
/// must never happen to the shared MariaDB on 3306. Dropping this value kills every
/// node and removes the directory, logs included (each node's log is `log_path(i)`
/// until then; errors quote its end).
///
/// Every node runs with `--no-defaults` (this machine's `my.cnf` sets a user, pid file
/// and log of the shared server), as the `mysql` user when this process is root (rsync
/// state transfer refuses root), with ROW binlog format, interleaved auto-increment
/// locks, InnoDB by default and `wsrep_mode=REQUIRED_PRIMARY_KEY,STRICT_REPLICATION`
/// (what a Galera application must live with), and with the same `evs.*` timeouts on
/// every node from the start (set at run time on some nodes only, they made a cluster
/// here lose its Primary Component for 13 s).
///
/// **Start time.** [`start`](Self::start) took 0.6-1.2 s here (one start at a time;
/// 1.5-2.1 s for two at once on the 2 cores) once the test process had its template:
/// the first call also runs `mariadb-install-db` and bootstraps a one-node cluster on
/// it, 0.9 s more, once per test process. The usual way (bootstrap one node, let the
/// others join) took 7.2 s, each joiner waiting for a state transfer.
#[derive(Debug)]
pub struct GaleraCluster {
    /// Declared before `dir`: dropped (killed) before the directory goes.
    nodes: Vec<Node>,
    dir: TempDir,
}

/// One `mariadbd` of the cluster.
#[derive(Debug)]
struct Node {
    /// 0, 1 or 2.
    index: usize,
    /// SQL port; the others follow it (see
    /// [`GALERA_PORTS_PER_NODE`](crate::port::GALERA_PORTS_PER_NODE)).
    port: u16,
    /// `<cluster dir>/node<index>`: data, tmp, socket, pid file, logs.
    dir: PathBuf,
    /// `mariadbd`'s command line but for the per-start options.
    args: Vec<OsString>,
    /// None when killed or shut down; a child that exited on its own is reaped by
    /// [`Node::running`].
    child: Mutex<Option<Child>>,
}

/// The OS user and group ids of [`SERVER_USER`].
#[derive(Debug, Clone, Copy)]
struct Owner {
    uid: u32,
    gid: u32,
}

/// What a node says of itself and its cluster (`SHOW GLOBAL STATUS LIKE 'wsrep_%'`).
///
/// Why: the four values a client checks before trusting a node (the ledger's writer
/// choice reads the same), and the last committed seqno, to tell whether a node has
/// caught up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    /// `wsrep_ready`: ON when the node accepts queries.
    pub ready: bool,
    /// `wsrep_cluster_status`: `Primary`, `non-Primary` or `Disconnected`.
    pub cluster_status: String,
    /// `wsrep_local_state_comment`: `Synced`, `Joining`, `Joined`, `Donor/Desynced`, …
    pub local_state_comment: String,
    /// `wsrep_cluster_size`: the members of this node's component.
    pub cluster_size: u32,
    /// `wsrep_last_committed`: the seqno of the last write-set committed here (Galera's
    /// -1, nothing yet, reads as 0).
    pub last_committed: u64,
}

impl NodeStatus {
    /// True when the node is a Synced member of the Primary Component and ready.
    ///
    /// Why: what "healthy" means for a client of a Galera node.
    pub fn is_synced(&self) -> bool {
        self.ready && self.cluster_status == "Primary" && self.local_state_comment == "Synced"
    }

    /// Reads the values of `SHOW GLOBAL STATUS LIKE 'wsrep_%'` (name, value pairs).
    fn from_rows<'a>(rows: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<Self, String> {
        let (mut ready, mut status, mut state, mut size, mut committed) =
            (None, None, None, None, None);
        for (name, value) in rows {
            match name {
                "wsrep_ready" => ready = Some(value == "ON"),
                "wsrep_cluster_status" => status = Some(value.to_owned()),
                "wsrep_local_state_comment" => state = Some(value.to_owned()),
                "wsrep_cluster_size" => {
                    size =
                        Some(value.parse().map_err(|_| {
                            format!("wsrep_cluster_size is {value:?}, not a number")
                        })?)
                }
                "wsrep_last_committed" => {
                    let seqno: i64 = value
                        .parse()
                        .map_err(|_| format!("wsrep_last_committed is {value:?}, not a number"))?;
                    committed = Some(u64::try_from(seqno).unwrap_or(0));
                }
                _ => {}
            }
        }
        let missing = |name: &str| format!("no {name} among the status values: is wsrep on?");
        Ok(NodeStatus {
            ready: ready.ok_or_else(|| missing("wsrep_ready"))?,
            cluster_status: status.ok_or_else(|| missing("wsrep_cluster_status"))?,
            local_state_comment: state.ok_or_else(|| missing("wsrep_local_state_comment"))?,
            cluster_size: size.ok_or_else(|| missing("wsrep_cluster_size"))?,
            last_committed: committed.ok_or_else(|| missing("wsrep_last_committed"))?,
        })
    }
}

impl fmt::Display for NodeStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "ready={} status={} state={} size={} last_committed={}",
            if self.ready { "ON" } else { "OFF" },
            self.cluster_status,
            self.local_state_comment,
            self.cluster_size,
            self.last_committed
        )
    }
}

impl GaleraCluster {
    /// Starts the three nodes and waits (bounded) until each is Synced, Primary, ready,
    /// sees a cluster of three, and lets root log in over TCP.
    ///
    /// Why: a test gets a cluster fully formed when this returns, quickly enough that
    /// several tests may each start their own (see the type's "Start time").
    ///
    /// How it is fast: each node gets a copy of one data directory, made once per test
    /// process (`mariadb-install-db`, then a one-node cluster bootstrapped on it and
    /// shut down cleanly: InnoDB and `grastate.dat` agree on one cluster UUID and
    /// seqno), and a `gvwstate.dat` naming the three nodes as the last primary view.
    /// Started together, the nodes restore that view once they all meet (Galera's
    /// `pc.recovery`, what it does after a whole cluster lost power) at one seqno, so
    /// none needs a state transfer. Bootstrapping one node and letting the two others
    /// join made them wait about 3 s each for one, since every membership change takes
    /// a seqno.
    pub async fn start() -> io::Result<GaleraCluster> {
        let started = Instant::now();
        let template = template().await?;
        let owner = server_owner()?;
        let dir = private_dir("fs-galera-", owner)?;
        let name = format!("fs-galera-{:016x}", rand::random::<u64>());
        let base = dir.path();
        let nodes =
            process::start_retrying("galera cluster", || form(base, &name, template, owner))
                .await?;
        let cluster = GaleraCluster { nodes, dir };
        tracing::debug!(
            nodes = %cluster.nodes_setting(),
            elapsed = ?started.elapsed(),
            "galera cluster ready"
        );
        Ok(cluster)
    }

    /// `mysql://root@127.0.0.1:N`, node `i`'s SQL port, without a database name.
    ///
    /// Why: the form [`TestDb::create`](crate::TestDb::create) and `sqlx` take.
    pub fn url(&self, i: usize) -> String {
        format!("mysql://root@127.0.0.1:{}", self.node(i).port)
    }

    /// `127.0.0.1:N`, node `i`'s SQL address.
    ///
    /// Why: to put a [`TcpProxy`](crate::TcpProxy) in front of a node.
    pub fn addr(&self, i: usize) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.node(i).port))
    }

    /// Node `i`'s SQL port.
    ///
    /// Why: to tell the nodes apart in what a client reports, e.g. which node the
    /// ledger writes through.
    pub fn port(&self, i: usize) -> u16 {
        self.node(i).port
    }

    /// `127.0.0.1:N0,127.0.0.1:N1,127.0.0.1:N2`: the SQL addresses in node order.
    ///
    /// Why: the format of `FLASHSALE_DATABASE_NODES`.
    pub fn nodes_setting(&self) -> String {
        addr_list(self.nodes.iter().map(|n| n.port))
    }

    /// The number of nodes: 3.
    ///
    /// Why: to loop over the nodes without writing the 3 down.
    #[allow(clippy::len_without_is_empty)] // a cluster is never empty
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Makes sure the nodes die and their directory goes when this test process ends,
    /// even if this value is never dropped: a small shell watches the process and, once
    /// it is gone, kills every process whose command line names the cluster's
    /// directory (each node's `--datadir` does) and removes the directory.
    ///
    /// Why: a cluster shared by every test of a binary lives in a `static`, which Rust
    /// never drops; without this, each run would leave three `mariadbd` behind.
    pub fn reap_on_exit(&self) -> io::Result<()> {
        let dir = self.dir.path().to_string_lossy().into_owned();
        let watcher = format!(
            "while kill -0 {parent} 2>/dev/null; do sleep {REAPER_POLL_SECS}; done; \
             pkill -9 -f \"$0\"; rm -rf \"$0\"",
            parent = std::process::id()
        );
        Command::new("sh")
            .arg("-c")
            .arg(watcher)
            .arg(dir)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            // Its own process group: a ^C to the test run must not take it first.
            .process_group(0)
            .spawn()
            .map(drop)
    }

    /// Node `i`'s process id while it runs (a paused one too); None once it was killed,
    /// shut down, or exited on its own.
    ///
    /// Why: a benchmark reads each node's CPU time from `/proc/<pid>`, to say what a
    /// write costs the node that takes it and the nodes that apply it.
    pub fn pid(&self, i: usize) -> Option<u32> {
        let node = self.node(i);
        if node.running() {
            node.pid().ok()
        } else {
            None
        }
    }

    /// Node `i`'s log (mariadbd's output, state transfers included).
    ///
    /// Why: to read what a node did while the cluster lives (it goes with the temp dir
    /// on drop).
    pub fn log_path(&self, i: usize) -> PathBuf {
        self.node(i).log()
    }

    /// Kills node `i` with SIGKILL and reaps it; returns at once, without waiting for
    /// the others to notice. Does nothing if it is not running.
    ///
    /// Why: a crashed node: its clients see their connections reset, and the others
    /// drop it from the cluster after the suspect timeout (2 s).
    pub fn kill9(&self, i: usize) -> io::Result<()> {
        self.node(i).kill9()
    }

    /// Shuts node `i` down cleanly (SIGTERM) and waits until it has exited (bounded; a
    /// node still running then is killed, and an error returned). Does nothing if it
    /// is not running.
    ///
    /// Why: a node taken out for maintenance: it leaves the cluster at once, without
    /// the others waiting for a timeout; [`rejoin`](Self::rejoin) brings it back.
    pub async fn shutdown(&self, i: usize) -> io::Result<()> {
        self.node(i).shutdown().await
    }

    /// Pauses node `i` with SIGSTOP (and waits until it is stopped): its connections
    /// stay open but nothing answers, neither its clients nor the other nodes.
    ///
    /// Why: a node that hangs rather than dies. The others drop it after the suspect
    /// timeout and go on without it; [`sigcont`](Self::sigcont) resumes it. Dropping
    /// the cluster with a paused node is fine (SIGKILL works on stopped processes).
    pub fn sigstop(&self, i: usize) -> io::Result<()> {
        let pid = self.node(i).pid()?;
        process::send_signal(pid, libc::SIGSTOP)?;
        process::wait_stopped(pid)
    }

    /// Resumes node `i` after [`sigstop`](Self::sigstop). It finds itself out of the
    /// cluster and rejoins on its own; [`wait_synced`](Self::wait_synced) waits for it.
    ///
    /// Why: tests check that the cluster and its clients recover once it answers again.
    pub fn sigcont(&self, i: usize) -> io::Result<()> {
        process::send_signal(self.node(i).pid()?, libc::SIGCONT)
    }

    /// True while node `i`'s process runs (a paused one too); false once it was
    /// killed, shut down, or exited on its own.
    ///
    /// Why: a test can check that a fault it caused did not take a node down with it
    /// (Galera aborts a node it finds inconsistent).
    pub fn is_running(&self, i: usize) -> bool {
        self.node(i).running()
    }

    /// Starts node `i` again after [`kill9`](Self::kill9) or
    /// [`shutdown`](Self::shutdown), on the same ports and data directory, and waits
    /// (bounded) until it is Synced in a cluster of three. First `mariadbd
    /// --wsrep-recover` finds the last position InnoDB committed, then the node starts
    /// from it (`--wsrep-start-position`), so it gets only the write-sets it missed
    /// (IST, 3.0-3.4 s here) rather than a copy of every file (SST).
    ///
    /// Why: recovery tests need the node back where clients already look for it, with
    /// what it had committed and what the others committed meanwhile. An error if the
    /// node is running (pause and resume it with [`sigstop`](Self::sigstop) and
    /// [`sigcont`](Self::sigcont) instead); on a timeout the node is killed again.
    pub async fn rejoin(&self, i: usize) -> io::Result<()> {
        let node = self.node(i);
        if node.running() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("galera node {i} is running: kill9 or shut it down before rejoin"),
            ));
        }
        let position = node.recover().await?;
        let mut start_position = OsString::from("--wsrep-start-position=");
        start_position.push(&position);
        node.spawn(&[start_position])?;
        wait_nodes(
            &[node],
            REJOIN_TIMEOUT,
            "the node to rejoin",
            synced_in_full,
        )
        .await
        .map_err(|e| {
            // Do not leave a half-joined node behind (a timeout; an exit is gone).
            let _ = node.kill9();
            io::Error::from(e)
        })
    }

    /// What node `i` says of itself (`SHOW GLOBAL STATUS LIKE 'wsrep_%'`), asked on a
    /// new connection as root, bounded by 2 s (an error past it, e.g. when the node is
    /// paused).
    ///
    /// Why: tests check the cluster's state as a client sees it.
    pub async fn status(&self, i: usize) -> io::Result<NodeStatus> {
        self.node(i).probe().await
    }

    /// Asks node `i` its [`status`](Self::status) every 50 ms until `done` accepts one,
    /// and returns that one; an error when `timeout` passes first (naming the last
    /// status or error, with the end of the node's log), or at once when the node is
    /// not running.
    ///
    /// Why: after a fault, a test must wait for the state it expects next, and fail,
    /// not hang, when it never comes.
    pub async fn wait_until<P>(
        &self,
        i: usize,
        timeout: Duration,
        mut done: P,
    ) -> io::Result<NodeStatus>
    where
        P: FnMut(&NodeStatus) -> bool,
    {
        let node = self.node(i);
        let deadline = Instant::now() + timeout;
        loop {
            if !node.running() {
                return Err(node.not_running());
            }
            let last = match node.probe().await {
                Ok(status) if done(&status) => return Ok(status),
                Ok(status) => status.to_string(),
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(node.timed_out(timeout, "the awaited state", &last));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// [`wait_until`](Self::wait_until) node `i` is Synced, Primary and ready
    /// ([`NodeStatus::is_synced`]).
    ///
    /// Why: the state in which a node may take writes again after a fault.
    pub async fn wait_synced(&self, i: usize, timeout: Duration) -> io::Result<NodeStatus> {
        self.wait_until(i, timeout, NodeStatus::is_synced).await
    }

    /// [`wait_until`](Self::wait_until) node `i` sees a component of `size` nodes
    /// (Primary or not: check [`NodeStatus::cluster_status`] on the result).
    ///
    /// Why: after a node is killed or paused, the others are known to have dropped it
    /// once they see a component one node smaller.
    pub async fn wait_cluster_size(
        &self,
        i: usize,
        size: u32,
        timeout: Duration,
    ) -> io::Result<NodeStatus> {
        self.wait_until(i, timeout, |s| s.cluster_size == size)
            .await
    }

    /// Node `i`; panics past the last node, like an index out of bounds.
    fn node(&self, i: usize) -> &Node {
        match self.nodes.get(i) {
            Some(node) => node,
            None => panic!(
                "galera node {i} does not exist: the cluster has nodes 0-{}",
                self.nodes.len().saturating_sub(1)
            ),
        }
    }
}

impl Drop for GaleraCluster {
    /// Kills every node so no test leaves a mariadbd behind (a paused one too); the
    /// temp dir, data and logs included, is removed right after.
    fn drop(&mut self) {
        for node in &self.nodes {
            if let Err(e) = node.kill9() {
                tracing::warn!(node = node.index, port = node.port, error = %e, "could not kill galera node");
            }
        }
        tracing::trace!(dir = %self.dir.path().display(), "galera cluster removed");
    }
}

impl Node {
    /// Plans node `index` of the cluster `name` whose nodes have the SQL ports `ports`,
    /// its files in `dir`.
    fn new(index: usize, dir: PathBuf, name: &str, ports: &[u16], owner: Option<Owner>) -> Node {
        let port = ports[index];
        let galera = port + GALERA_PORT_OFFSET;
        let peers = addr_list(ports.iter().map(|p| p + GALERA_PORT_OFFSET));
        let provider_options = [
            format!("gmcast.listen_addr=tcp://127.0.0.1:{galera}"),
            format!("ist.recv_addr=127.0.0.1:{}", port + GALERA_IST_OFFSET),
            format!("gcache.size={GCACHE_SIZE}"),
            format!("evs.keepalive_period={EVS_KEEPALIVE_PERIOD}"),
            format!("evs.suspect_timeout={EVS_SUSPECT_TIMEOUT}"),
            format!("evs.inactive_timeout={EVS_INACTIVE_TIMEOUT}"),
            format!("evs.join_retrans_period={EVS_JOIN_RETRANS_PERIOD}"),
            format!("evs.inactive_check_period={EVS_INACTIVE_CHECK_PERIOD}"),
        ]
        .join(";");
        // --no-defaults must come first; see GaleraCluster's docs for why.
        let mut args: Vec<OsString> = vec![
            "--no-defaults".into(),
            path_arg("--datadir=", &dir.join(DATA_DIR)),
            path_arg("--tmpdir=", &dir.join(TMP_DIR)),
            format!("--port={port}").into(),
            path_arg("--socket=", &dir.join("sock")),
            path_arg("--pid-file=", &dir.join("mariadbd.pid")),
            "--bind-address=127.0.0.1".into(),
            "--skip-name-resolve".into(),
            "--character-set-server=utf8mb4".into(),
            "--collation-server=utf8mb4_general_ci".into(),
            INNODB_LOG_FILE_SIZE.into(),
            INNODB_BUFFER_POOL_SIZE.into(),
            "--binlog-format=ROW".into(),
            "--innodb-autoinc-lock-mode=2".into(),
            "--default-storage-engine=InnoDB".into(),
            "--wsrep-on=ON".into(),
            format!("--wsrep-provider={GALERA_PROVIDER}").into(),
            format!("--wsrep-cluster-name={name}").into(),
            format!("--wsrep-cluster-address=gcomm://{peers}").into(),
            format!("--wsrep-node-name=node{index}").into(),
            format!("--wsrep-node-address=127.0.0.1:{galera}").into(),
            format!("--wsrep-provider-options={provider_options}").into(),
            "--wsrep-sst-method=rsync".into(),
            format!(
                "--wsrep-sst-receive-address=127.0.0.1:{}",
                port + GALERA_SST_OFFSET
            )
            .into(),
            "--wsrep-mode=REQUIRED_PRIMARY_KEY,STRICT_REPLICATION".into(),
        ];
        if owner.is_some() {
            args.push(format!("--user={SERVER_USER}").into());
        }
        Node {
            index,
            port,
            dir,
            args,
            child: Mutex::new(None),
        }
    }

    fn log(&self) -> PathBuf {
        MARIADBD.log_in(&self.dir)
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("sock")
    }

    fn lock(&self) -> MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts mariadbd with the node's options and `extra`, its output appended to the
    /// node's log; does not wait for it.
    fn spawn(&self, extra: &[OsString]) -> io::Result<()> {
        let mut cmd = Command::new("mariadbd");
        cmd.args(&self.args).args(extra);
        let child = process::spawn_logged(&mut cmd, &self.log())?;
        *self.lock() = Some(child);
        Ok(())
    }

    /// True while the process runs; reaps it (and forgets it) once it has exited.
    fn running(&self) -> bool {
        let mut child = self.lock();
        let exited = match child.as_mut().map(Child::try_wait) {
            None => return false,
            Some(Ok(None)) => false,
            Some(Ok(Some(status))) => {
                tracing::debug!(node = self.index, %status, "galera node exited");
                true
            }
            Some(Err(e)) => {
                tracing::warn!(node = self.index, error = %e, "could not check galera node");
                true
            }
        };
        if exited {
            *child = None;
        }
        !exited
    }

    fn pid(&self) -> io::Result<u32> {
        self.lock()
            .as_ref()
            .map(Child::id)
            .ok_or_else(|| self.not_running())
    }

    fn kill9(&self) -> io::Result<()> {
        match self.lock().take() {
            Some(mut child) => process::kill9(&mut child),
            None => Ok(()),
        }
    }

    async fn shutdown(&self) -> io::Result<()> {
        let Ok(pid) = self.pid() else {
            return Ok(());
        };
        process::send_signal(pid, libc::SIGTERM)?;
        let deadline = Instant::now() + SHUTDOWN_TIMEOUT;
        while self.running() {
            if Instant::now() >= deadline {
                self.kill9()?;
                return Err(self.error(
                    io::ErrorKind::TimedOut,
                    &format!("did not shut down within {SHUTDOWN_TIMEOUT:?}, killed it"),
                ));
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        Ok(())
    }

    /// Runs `mariadbd --wsrep-recover` (bounded) and returns the position it found,
    /// `uuid:seqno`.
    async fn recover(&self) -> io::Result<OsString> {
        let log = self.dir.join(RECOVER_LOG);
        // A fresh file: the position read below must be this run's.
        std::fs::File::create(&log)?;
        let mut cmd = Command::new("mariadbd");
        cmd.args(&self.args).arg("--wsrep-recover");
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.kill_on_drop(true);
        let what = format!("mariadbd --wsrep-recover of galera node {}", self.index);
        // 0.2 s here; InnoDB's crash recovery on a busy machine is the slow part, as in
        // any start.
        process::run_bounded(&mut cmd, &log, MARIADBD.timeout, &what).await?;
        let text = std::fs::read_to_string(&log)?;
        match recovered_position(&text) {
            Some(position) => Ok(position.into()),
            None => Err(process::with_log_tail(
                io::ErrorKind::Other,
                &format!("{what} found no position"),
                &log,
            )),
        }
    }

    /// The node's status, asked as root over TCP, bounded by [`MARIADBD`]'s probe
    /// timeout; an error also when the server on the port is not this node (its socket
    /// differs: another process's server took the port first).
    async fn probe(&self) -> io::Result<NodeStatus> {
        let url = format!("mysql://root@127.0.0.1:{}", self.port);
        let socket = self.socket().to_string_lossy().into_owned();
        let ask = async {
            let mut conn = MySqlConnection::connect(&url).await?;
            let theirs: String = sqlx::query_scalar("SELECT CAST(@@socket AS CHAR)")
                .fetch_one(&mut conn)
                .await?;
            let rows = sqlx::query("SHOW GLOBAL STATUS LIKE 'wsrep_%'")
                .fetch_all(&mut conn)
                .await?;
            conn.close().await?;
            let mut pairs = Vec::with_capacity(rows.len());
            for row in &rows {
                pairs.push((row.try_get::<String, _>(0)?, row.try_get::<String, _>(1)?));
            }
            Ok::<_, sqlx::Error>((theirs, pairs))
        };
        let (theirs, pairs) = match tokio::time::timeout(MARIADBD.probe_timeout, ask).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => {
                return Err(io::Error::other(format!(
                    "galera node {} (port {}): {e}",
                    self.index, self.port
                )))
            }
            Err(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "galera node {} (port {}) did not answer within {:?}",
                        self.index, self.port, MARIADBD.probe_timeout
                    ),
                ))
            }
        };
        if theirs != socket {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "port {} is served by another server (socket {theirs})",
                    self.port
                ),
            ));
        }
        NodeStatus::from_rows(pairs.iter().map(|(n, v)| (n.as_str(), v.as_str())))
            .map_err(|e| io::Error::other(format!("galera node {}: {e}", self.index)))
    }

    fn not_running(&self) -> io::Error {
        self.error(io::ErrorKind::NotConnected, "is not running")
    }

    fn timed_out(&self, bound: Duration, what: &str, last: &str) -> io::Error {
        self.error(
            io::ErrorKind::TimedOut,
            &format!("did not reach {what} within {bound:?}; last: {last}"),
        )
    }

    /// An error of `kind`: this node `what`, with the end of its log.
    fn error(&self, kind: io::ErrorKind, what: &str) -> io::Error {
        process::with_log_tail(
            kind,
            &format!("galera node {} {what}", self.index),
            &self.log(),
        )
    }
}

impl Drop for Node {
    /// Kills the process, so a cluster whose start failed half-way leaves nothing
    /// behind.
    fn drop(&mut self) {
        if let Err(e) = self.kill9() {
            tracing::warn!(node = self.index, error = %e, "could not kill galera node");
        }
    }
}

/// One attempt at starting the cluster in `base`: picks ports, writes each node's data
/// directory (the template plus its own `gvwstate.dat`), starts the three nodes at once
/// and waits until they have formed the cluster. A node that exits meanwhile (a port
/// taken) ends the attempt with [`NotReady::Exited`]; the nodes started are killed
/// when the returned error drops them.
async fn form(
    base: &Path,
    name: &str,
    template: &Template,
    owner: Option<Owner>,
) -> Result<Vec<Node>, NotReady> {
    let mut ports = Vec::with_capacity(NODE_COUNT);
    for _ in 0..NODE_COUNT {
        ports.push(galera_ports().map_err(NotReady::Failed)?);
    }
    let uuids: Vec<String> = (0..NODE_COUNT).map(|_| random_uuid()).collect();
    let mut nodes = Vec::with_capacity(NODE_COUNT);
    for index in 0..NODE_COUNT {
        let dir = base.join(format!("node{index}"));
        let write = || -> io::Result<()> {
            if dir.exists() {
                std::fs::remove_dir_all(&dir)?;
            }
            std::fs::create_dir(&dir)?;
            std::fs::create_dir(dir.join(TMP_DIR))?;
            template.write_to(&dir.join(DATA_DIR))?;
            std::fs::write(
                dir.join(DATA_DIR).join(GVWSTATE),
                saved_view(&uuids[index], &uuids),
            )?;
            chown_tree(&dir, owner)
        };
        write().map_err(NotReady::Failed)?;
        nodes.push(Node::new(index, dir, name, &ports, owner));
    }
    for node in &nodes {
        node.spawn(&[]).map_err(NotReady::Failed)?;
    }
    let all: Vec<&Node> = nodes.iter().collect();
    // 0.6-1.2 s here: the nodes' start, then their meeting.
    wait_nodes(
        &all,
        MARIADBD.timeout,
        "the cluster to form",
        synced_in_full,
    )
    .await?;
    Ok(nodes)
}

/// Synced, Primary, ready, in a cluster of all [`NODE_COUNT`] nodes.
fn synced_in_full(status: &NodeStatus) -> bool {
    status.is_synced() && usize::try_from(status.cluster_size) == Ok(NODE_COUNT)
}

/// Waits (bounded) until every one of `nodes` answers as itself with a status `done`
/// accepts. A node that exits meanwhile ends the wait at once ([`NotReady::Exited`],
/// with the end of its log).
async fn wait_nodes(
    nodes: &[&Node],
    bound: Duration,
    what: &str,
    done: fn(&NodeStatus) -> bool,
) -> Result<(), NotReady> {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(gone) = nodes.iter().find(|n| !n.running()) {
            return Err(NotReady::Exited(gone.error(
                io::ErrorKind::Other,
                &format!("exited while waiting for {what}"),
            )));
        }
        let mut pending = None;
        for node in nodes {
            match node.probe().await {
                Ok(status) if done(&status) => {}
                Ok(status) => pending = Some((node, status.to_string())),
                Err(e) => pending = Some((node, e.to_string())),
            }
            if pending.is_some() {
                break;
            }
        }
        let Some((node, last)) = pending else {
            return Ok(());
        };
        if Instant::now() >= deadline {
            return Err(NotReady::Failed(node.timed_out(bound, what, &last)));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// The files of a data directory that holds a one-node cluster's clean shutdown, kept
/// in memory (about 26 MB) so each cluster writes its nodes' copies without a
/// directory left behind when the test process ends.
#[derive(Debug)]
struct Template {
    /// Paths relative to the data directory, parents before children; `None` for a
    /// directory.
    entries: Vec<(PathBuf, Option<Vec<u8>>)>,
}

impl Template {
    /// Writes the template's files into `data`, which must not exist.
    fn write_to(&self, data: &Path) -> io::Result<()> {
        std::fs::create_dir(data)?;
        for (path, contents) in &self.entries {
            let target = data.join(path);
            match contents {
                None => std::fs::create_dir(&target)?,
                Some(bytes) => std::fs::write(&target, bytes)?,
            }
        }
        Ok(())
    }
}

/// The template of this test process, made on first use (see [`make_template`]).
async fn template() -> io::Result<&'static Template> {
    static TEMPLATE: OnceCell<Template> = OnceCell::const_new();
    TEMPLATE.get_or_try_init(make_template).await
}

/// Runs `mariadb-install-db`, bootstraps a one-node cluster on it (0.9 s together here),
/// shuts it down cleanly and reads its data directory.
///
/// A clean shutdown leaves `grastate.dat` with the cluster's UUID and last seqno, which
/// InnoDB holds too: nodes started from copies agree on where they are, and need no
/// state transfer (see [`GaleraCluster::start`]).
async fn make_template() -> io::Result<Template> {
    let started = Instant::now();
    let owner = server_owner()?;
    let dir = private_dir("fs-galera-template-", owner)?;
    std::fs::create_dir(dir.path().join(TMP_DIR))?;
    install(dir.path()).await?;
    chown_tree(dir.path(), owner)?;
    let name = format!("fs-galera-template-{:016x}", rand::random::<u64>());
    let (base, name) = (dir.path(), &name);
    let node = process::start_retrying("galera template node", || async move {
        let port = galera_ports().map_err(NotReady::Failed)?;
        let node = Node::new(0, base.to_owned(), name, &[port], owner);
        node.spawn(&["--wsrep-new-cluster".into()])
            .map_err(NotReady::Failed)?;
        wait_nodes(
            &[&node],
            // 0.6 s here.
            MARIADBD.timeout,
            "the bootstrap",
            NodeStatus::is_synced,
        )
        .await?;
        Ok(node)
    })
    .await?;
    node.shutdown().await?;
    let data = dir.path().join(DATA_DIR);
    let grastate = std::fs::read_to_string(data.join(GRASTATE))?;
    let field = |name: &str| {
        grastate.lines().find_map(|l| {
            let (key, value) = l.split_once(':')?;
            (key.trim() == name).then(|| value.trim())
        })
    };
    if field("safe_to_bootstrap") != Some("1") || field("seqno").is_none_or(|s| s == "-1") {
        return Err(node.error(
            io::ErrorKind::Other,
            &format!("(the template) did not save a clean state; {GRASTATE}:\n{grastate}\n"),
        ));
    }
    let mut entries = Vec::new();
    read_tree(&data, Path::new(""), &mut entries)?;
    tracing::debug!(elapsed = ?started.elapsed(), files = entries.len(), "galera template ready");
    Ok(Template { entries })
}

/// Appends what `root/rel` holds to `entries` (see [`Template::entries`]), but the
/// files of [`TEMPLATE_SKIP`].
fn read_tree(
    root: &Path,
    rel: &Path,
    entries: &mut Vec<(PathBuf, Option<Vec<u8>>)>,
) -> io::Result<()> {
    for entry in std::fs::read_dir(root.join(rel))? {
        let entry = entry?;
        let name = entry.file_name();
        if TEMPLATE_SKIP.iter().any(|skip| name == *skip) {
            continue;
        }
        let path = rel.join(&name);
        if entry.file_type()?.is_dir() {
            entries.push((path.clone(), None));
            read_tree(root, &path, entries)?;
        } else {
            let bytes = std::fs::read(root.join(&path))?;
            entries.push((path, Some(bytes)));
        }
    }
    Ok(())
}

/// `gvwstate.dat` for the node `me` of a cluster of `members`: the view Galera would
/// have saved had the three been a primary component before (see
/// [`GaleraCluster::start`]).
fn saved_view(me: &str, members: &[String]) -> String {
    let mut view = format!(
        "my_uuid: {me}\n#vwbeg\nview_id: {PRIMARY_VIEW_TYPE} {} {SAVED_VIEW_SEQ}\nbootstrap: 0\n",
        members[0]
    );
    for member in members {
        view.push_str(&format!("member: {member} 0\n"));
    }
    view.push_str("#vwend\n");
    view
}

/// A random (version 4) UUID, as Galera writes them.
fn random_uuid() -> String {
    let bits = rand::random::<u128>() & !(0xf000 << 64) & !(0xc000 << 48);
    let bits = bits | (0x4000 << 64) | (0x8000 << 48);
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        bits >> 96,
        (bits >> 80) & 0xffff,
        (bits >> 64) & 0xffff,
        (bits >> 48) & 0xffff,
        bits & 0xffff_ffff_ffff
    )
}

/// The `uuid:seqno` after the last [`RECOVERED_MARK`] of a `--wsrep-recover` log.
fn recovered_position(log: &str) -> Option<&str> {
    let (_, rest) = log.rsplit_once(RECOVERED_MARK)?;
    let position = rest.split_whitespace().next()?;
    let (uuid, seqno) = position.split_once(':')?;
    (uuid.len() == 36 && seqno.parse::<i64>().is_ok()).then_some(position)
}

/// The user and group mariadbd must run as: [`SERVER_USER`]'s when this process is
/// root, None (this process's own) otherwise.
fn server_owner() -> io::Result<Option<Owner>> {
    if !process::running_as_root() {
        return Ok(None);
    }
    let name = CString::new(SERVER_USER).map_err(io::Error::other)?;
    /// Room for the strings of one passwd entry (getpwnam_r's buffer): a few hundred
    /// bytes in practice; ERANGE past it is reported.
    const PASSWD_BUF_LEN: usize = 4096;
    let mut buf = vec![0 as libc::c_char; PASSWD_BUF_LEN];
    // SAFETY: all-zero bytes are a valid `passwd` (null pointers and zero ids); it is
    // only read after getpwnam_r filled it.
    let mut entry: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call and `buf.len()` is the buffer's size;
    // getpwnam_r writes only into `entry`, `buf` and `found`.
    let rc = unsafe {
        libc::getpwnam_r(
            name.as_ptr(),
            &mut entry,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        )
    };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    if found.is_null() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "no user {SERVER_USER:?}, which mariadbd must run as when the tests run as \
                 root (rsync state transfer refuses root): is mariadb-server installed?"
            ),
        ));
    }
    Ok(Some(Owner {
        uid: entry.pw_uid,
        gid: entry.pw_gid,
    }))
}

/// A new temp dir named `prefix…`, given to `owner` if any, after checking that
/// `owner` can reach it (every parent directory searchable by it).
fn private_dir(prefix: &str, owner: Option<Owner>) -> io::Result<TempDir> {
    let dir = tempfile::Builder::new().prefix(prefix).tempdir()?;
    if let Some(owner) = owner {
        for parent in dir.path().ancestors().skip(1) {
            let meta = std::fs::metadata(parent)?;
            let mode = meta.mode();
            let searchable = mode & 0o001 != 0
                || (meta.gid() == owner.gid && mode & 0o010 != 0)
                || (meta.uid() == owner.uid && mode & 0o100 != 0);
            if !searchable {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "{SERVER_USER} cannot reach {}: {} is not searchable by it; point \
                         TMPDIR at a directory it can reach, such as /tmp",
                        dir.path().display(),
                        parent.display()
                    ),
                ));
            }
        }
        lchown(dir.path(), Some(owner.uid), Some(owner.gid))?;
    }
    Ok(dir)
}

/// Gives `path` and everything under it to `owner`; does nothing without one.
fn chown_tree(path: &Path, owner: Option<Owner>) -> io::Result<()> {
    let Some(owner) = owner else {
        return Ok(());
    };
    lchown(path, Some(owner.uid), Some(owner.gid))?;
    if std::fs::symlink_metadata(path)?.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_tree(&entry?.path(), Some(owner))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bound on a node's drop from the others' view after a kill or a SIGSTOP: the
    /// suspect timeout (2 s) and a view change; measured 2.1-2.2 s here.
    const LEAVE_TIMEOUT: Duration = Duration::from_secs(20);

    /// Bound on a cleanly shut down node's leaving the others' view: it says goodbye,
    /// so no timeout is involved (measured well under 0.1 s here).
    const CLEAN_LEAVE_TIMEOUT: Duration = Duration::from_secs(5);

    /// Bound on a resumed node's return to Synced: measured 4.2-4.8 s here, most of it
    /// the others waiting before they take back a node they had dropped.
    const RETURN_TIMEOUT: Duration = Duration::from_secs(30);

    /// Runs `sql` (one statement) on node `i` with `wsrep_sync_wait=1`, so a read sees
    /// every write the cluster committed before it.
    async fn query_strings(cluster: &GaleraCluster, i: usize, sql: &str) -> Vec<String> {
        let mut conn = MySqlConnection::connect(&cluster.url(i))
            .await
            .expect("connect");
        sqlx::query("SET SESSION wsrep_sync_wait=1")
            .execute(&mut conn)
            .await
            .expect("wsrep_sync_wait");
        let rows: Vec<String> = sqlx::query_scalar(sql)
            .fetch_all(&mut conn)
            .await
            .expect("query");
        conn.close().await.expect("close");
        rows
    }

    async fn execute(cluster: &GaleraCluster, i: usize, sql: &str) {
        let mut conn = MySqlConnection::connect(&cluster.url(i))
            .await
            .expect("connect");
        sqlx::raw_sql(sql).execute(&mut conn).await.expect(sql);
        conn.close().await.expect("close");
    }

    /// Waits until each of `nodes` sees a component of two, and checks it is a Synced
    /// Primary one: the third node was dropped and the two go on.
    async fn expect_primary_of_two(cluster: &GaleraCluster, nodes: [usize; 2]) {
        for i in nodes {
            let status = cluster
                .wait_cluster_size(i, 2, LEAVE_TIMEOUT)
                .await
                .expect("the third node dropped");
            assert!(status.is_synced(), "node {i}: {status}");
        }
    }

    // Checks that a started cluster replicates: a database, an InnoDB table with a
    // primary key and a row written on node 0 are read back on nodes 1 and 2 (with
    // wsrep_sync_wait=1, so the read waits for the write to be applied there), and
    // that every node reports Synced, Primary, ready, size 3. Then that a node shut
    // down cleanly leaves at once (the others see size 2 within a poll, not after the
    // suspect timeout) and rejoins by IST (3.0-3.4 s here) with the row written
    // meanwhile.
    #[tokio::test]
    async fn writes_on_one_node_are_read_on_the_others() {
        let cluster = GaleraCluster::start().await.expect("start the cluster");
        assert_eq!(cluster.len(), 3);
        for i in 0..cluster.len() {
            let status = cluster.status(i).await.expect("status");
            assert!(status.is_synced() && status.cluster_size == 3, "{status}");
        }
        execute(
            &cluster,
            0,
            "CREATE DATABASE fs_galera; \
             CREATE TABLE fs_galera.t (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=InnoDB; \
             INSERT INTO fs_galera.t VALUES (1, 'from node 0')",
        )
        .await;
        for i in 1..cluster.len() {
            let rows = query_strings(&cluster, i, "SELECT v FROM fs_galera.t WHERE id = 1").await;
            assert_eq!(rows, ["from node 0"], "node {i}");
        }
        let expected = (0..3)
            .map(|i| format!("127.0.0.1:{}", cluster.port(i)))
            .collect::<Vec<_>>()
            .join(",");
        assert_eq!(cluster.nodes_setting(), expected);
        assert_eq!(cluster.addr(2).port(), cluster.port(2));

        cluster.shutdown(1).await.expect("shut node 1 down");
        assert!(!cluster.is_running(1));
        let status = cluster
            .wait_cluster_size(0, 2, CLEAN_LEAVE_TIMEOUT)
            .await
            .expect("node 1 left");
        assert!(status.is_synced(), "{status}");
        execute(
            &cluster,
            0,
            "INSERT INTO fs_galera.t VALUES (2, 'while 1 was off')",
        )
        .await;
        cluster.rejoin(1).await.expect("rejoin node 1");
        let rows = query_strings(&cluster, 1, "SELECT v FROM fs_galera.t WHERE id = 2").await;
        assert_eq!(rows, ["while 1 was off"]);
    }

    // Checks the faults a test can cause, on one cluster: (1) after kill9 of node 0,
    // nodes 1 and 2 see a Primary component of 2 (2.1 s here: the suspect timeout, a
    // closed connection does not hasten it) and take a write; node 0 rejoined
    // (--wsrep-recover, then IST: 3.0-3.4 s here) is Synced in a cluster of 3 and has the
    // row written while it was down. (2) After SIGSTOP of node 2, nodes 0 and 1 see a
    // Primary component of 2 (2.1 s here); after SIGCONT node 2 finds itself alone, comes
    // back by itself and, after an IST of what it missed, is Synced in a cluster of 3
    // again (4.2-4.8 s here), with the write made meanwhile.
    #[tokio::test]
    async fn a_killed_node_rejoins_and_a_paused_one_returns() {
        let cluster = GaleraCluster::start().await.expect("start the cluster");
        execute(
            &cluster,
            0,
            "CREATE DATABASE fs_galera; \
             CREATE TABLE fs_galera.t (id INT PRIMARY KEY, v VARCHAR(20)) ENGINE=InnoDB",
        )
        .await;

        // (1) kill -9 and rejoin.
        cluster.kill9(0).expect("kill node 0");
        assert!(!cluster.is_running(0));
        expect_primary_of_two(&cluster, [1, 2]).await;
        execute(
            &cluster,
            1,
            "INSERT INTO fs_galera.t VALUES (1, 'while 0 was down')",
        )
        .await;
        cluster.rejoin(0).await.expect("rejoin node 0");
        let status = cluster.status(0).await.expect("status of node 0");
        assert!(status.is_synced() && status.cluster_size == 3, "{status}");
        let rows = query_strings(&cluster, 0, "SELECT v FROM fs_galera.t WHERE id = 1").await;
        assert_eq!(rows, ["while 0 was down"]);

        // (2) SIGSTOP and SIGCONT.
        cluster.sigstop(2).expect("pause node 2");
        expect_primary_of_two(&cluster, [0, 1]).await;
        execute(
            &cluster,
            0,
            "INSERT INTO fs_galera.t VALUES (2, 'while 2 slept')",
        )
        .await;
        cluster.sigcont(2).expect("resume node 2");
        let status = cluster
            .wait_until(2, RETURN_TIMEOUT, |s| s.is_synced() && s.cluster_size == 3)
            .await
            .expect("node 2 back");
        assert!(cluster.is_running(2), "{status}");
        let rows = query_strings(&cluster, 2, "SELECT v FROM fs_galera.t WHERE id = 2").await;
        assert_eq!(rows, ["while 2 slept"]);
    }

    #[test]
    fn reads_status_rows() {
        let rows = [
            ("wsrep_ready", "ON"),
            ("wsrep_cluster_status", "Primary"),
            ("wsrep_local_state_comment", "Synced"),
            ("wsrep_cluster_size", "3"),
            ("wsrep_last_committed", "-1"),
            ("wsrep_other", "x"),
        ];
        let status = NodeStatus::from_rows(rows).expect("parsed");
        assert!(status.is_synced());
        assert_eq!(status.cluster_size, 3);
        assert_eq!(status.last_committed, 0);
        assert!(NodeStatus::from_rows(rows[..4].iter().copied()).is_err());
    }

    #[test]
    fn finds_the_recovered_position() {
        let log = "2026-12-06 21:11:48 0 [Note] WSREP: Recovered position: \
                   d56244a3-f1b8-11f1-8dfa-bbfe6ffd6692:2\n2026-12-06 [Note] bye\n";
        assert_eq!(
            recovered_position(log),
            Some("d56244a3-f1b8-11f1-8dfa-bbfe6ffd6692:2")
        );
        assert_eq!(recovered_position("no position here"), None);
    }

    #[test]
    fn makes_version_4_uuids() {
        let uuid = random_uuid();
        assert_eq!(uuid.len(), 36);
        assert_eq!(&uuid[14..15], "4");
        assert!(matches!(&uuid[19..20], "8" | "9" | "a" | "b"));
    }
}
