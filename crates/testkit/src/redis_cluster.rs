use std::io;
use std::ops::RangeInclusive;
use std::path::Path;
use std::process::Child;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, FromRedisValue};
use tempfile::TempDir;

use crate::cluster::poll_until;
use crate::port::{addr_list, cluster_port};
use crate::process::{self, NotReady};
use crate::redis_server::{redis_server, REDIS_SERVER};

/// Nodes of the cluster: three primaries, so that one can die and the other two are
/// still a majority that votes its replica in, and one replica for each.
const NODE_COUNT: usize = 6;

/// Primaries among [`NODE_COUNT`]: what `redis-cli --cluster create` makes of six nodes
/// with `--cluster-replicas 1`.
const PRIMARY_COUNT: usize = 3;

/// Hash slots of a Redis Cluster (fixed by Redis).
const SLOT_COUNT: u16 = 16_384;

/// Node timeout of [`RedisCluster::start`]: how long a node may be unreachable before
/// the others mark it failed. Redis's default (15 s) would put a failover test well
/// past its time budget; much below 2 s, a machine busy compiling (two cores, shared)
/// delays heartbeats enough for healthy nodes to be marked failed.
const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(2_000);

/// Bound on connecting to a node, for every query of this module.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Bound on one reply of a node. Longer than the `redis` crate's default (0.5 s): a
/// MIGRATE of a batch, or any reply on a machine busy compiling, may take longer, and
/// a slow answer is not a failure here. Longer than [`MIGRATE_TIMEOUT_MS`] so MIGRATE
/// reports its own timeout first.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// MIGRATE's own timeout (ms): the longest the source waits on the target while
/// handing over one batch.
const MIGRATE_TIMEOUT_MS: u64 = 5_000;

/// Longest wait for `redis-cli --cluster create` (it takes 1-3 s: it assigns slots,
/// meets the nodes and polls them once a second until they agree).
const CREATE_TIMEOUT: Duration = Duration::from_secs(60);

/// Longest wait, after `redis-cli` is done, until every node reports the cluster ok,
/// knows all six nodes with their roles, and every replica is in sync with its primary
/// (a second or two; the bound is for a busy machine).
const FORM_TIMEOUT: Duration = Duration::from_secs(30);

/// Bound on a failover, in node timeouts: detection takes one, the replica waits up
/// to another second to start its election, and a lost election is retried after four
/// more (Redis's failover auth timeout, twice the node timeout, times two); ten leave
/// room for a second election on a busy machine.
const FAILOVER_BOUND_NODE_TIMEOUTS: u32 = 10;

/// Longest wait, after a slot migration, until every node names the new owner (the
/// primaries are told directly; the replicas learn it from the next heartbeat).
const AGREE_TIMEOUT: Duration = Duration::from_secs(15);

/// The most product ids [`RedisCluster::product_on`] tries: a primary owns about a
/// third of the slots, so the first match is found within a few ids; more than this
/// means the primary owns (almost) nothing.
const PRODUCT_SEARCH_LIMIT: u64 = 100_000;

/// Cluster state file Redis keeps inside each node's directory.
const NODES_CONF: &str = "nodes.conf";
/// Log of `redis-cli --cluster create` inside the cluster's temp dir.
const CREATE_LOG: &str = "create.log";

/// A Redis Cluster of the test's own: three primaries and three replicas on free ports
/// of 127.0.0.1, each a child process with its files in one temp dir, keeping nothing
/// on disk but Redis's own `nodes.conf`.
///
/// Why: the service's cluster support must be tested against a real cluster, through
/// what only a cluster does (MOVED and ASK redirections, a slot moving while a sale
/// runs, a primary dying and its replica taking over), without touching the shared
/// Redis on 6379. Dropping this value kills every node and removes the directory.
///
/// Nodes are named by their client port everywhere (the bus port is that plus 10000).
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<Node>,
    node_timeout: Duration,
    dir: TempDir,
}

/// One redis-server of the cluster.
#[derive(Debug)]
struct Node {
    port: u16,
    /// None once [`RedisCluster::kill`] killed it.
    child: Option<Child>,
}

impl RedisCluster {
    /// Starts six nodes with a node timeout of 2 s, joins them into a cluster of three
    /// primaries and three replicas with `redis-cli --cluster create`, and waits
    /// (bounded) until every node agrees: each says `cluster_state:ok`, knows all six
    /// nodes, three of them primaries and three replicas, none failed; and each replica
    /// is in sync with its primary.
    ///
    /// Why: a test gets a cluster that is fully ready when this returns, including
    /// replicas able to take over (a replica that never synced cannot), and one whose
    /// failovers take seconds, not Redis's default 15 s node timeout.
    pub async fn start() -> io::Result<RedisCluster> {
        Self::start_with_node_timeout(DEFAULT_NODE_TIMEOUT).await
    }

    /// [`start`](Self::start) with another node timeout (`cluster-node-timeout`,
    /// whole milliseconds).
    ///
    /// Why: a test of what clients see while a primary is down but not yet replaced
    /// needs that window to last; a longer timeout makes it longer.
    pub async fn start_with_node_timeout(node_timeout: Duration) -> io::Result<RedisCluster> {
        let dir = tempfile::Builder::new()
            .prefix("fs-redis-cluster-")
            .tempdir()?;
        // Built before the nodes start, so a failure half-way kills those already
        // running (Drop).
        let mut cluster = RedisCluster {
            nodes: Vec::with_capacity(NODE_COUNT),
            node_timeout,
            dir,
        };
        for _ in 0..NODE_COUNT {
            let node = start_node(cluster.dir.path(), node_timeout).await?;
            cluster.nodes.push(node);
        }
        cluster.create().await?;
        cluster.wait_formed().await?;
        tracing::debug!(nodes = %cluster.seed_nodes(), "redis cluster ready");
        Ok(cluster)
    }

    /// `127.0.0.1:N1,127.0.0.1:N2,…`: all six nodes, killed ones included.
    ///
    /// Why: the format of `FLASHSALE_REDIS_CLUSTER_NODES`; a client seeded with every
    /// node still finds the cluster when some are dead.
    pub fn seed_nodes(&self) -> String {
        addr_list(self.ports())
    }

    /// `redis://127.0.0.1:N/` for each of the six nodes, killed ones included.
    ///
    /// Why: what `redis::cluster::ClusterClient::new` and the service's config take.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| node_url(n.port)).collect()
    }

    /// The client ports of the six nodes, in start order, killed ones included.
    ///
    /// Why: to tell a node of this cluster from anything else, e.g. that a failover
    /// promoted one of the original replicas.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(|n| n.port).collect()
    }

    /// The hash slot of `key`: CRC16 (XMODEM) of its hash tag (the part between the
    /// first `{` and the next `}`, if not empty) or of the whole key, mod 16384.
    ///
    /// Why: to find keys on a given slot or primary. Computed here, not asked of the
    /// cluster (`CLUSTER KEYSLOT`), so it cannot fail and needs no `await`, hence no
    /// `self` and no `io::Result` (the `redis` crate computes it too, but does not
    /// expose the number).
    pub fn slot_of(key: &str) -> u16 {
        let key = key.as_bytes();
        let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        });
        crc16_xmodem(tagged.unwrap_or(key)) % SLOT_COUNT
    }

    /// The port of the primary that owns `slot`, as the first live node sees it.
    ///
    /// Why: tests must know which node to kill or migrate from, and check where a
    /// slot went. Right after a failover or migration, nodes may disagree for a moment;
    /// [`wait_failover`](Self::wait_failover) and [`migrate_slot`](Self::migrate_slot)
    /// return only once they all agree.
    pub async fn primary_of(&self, slot: u16) -> io::Result<u16> {
        check_slot(slot)?;
        let view = self.view().await?;
        owner(&view, slot).map(|n| n.port).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no primary owns slot {slot}"),
            )
        })
    }

    /// The ports of the live primaries (three, or fewer right after a primary was
    /// killed and before its replica took over), in ascending order, as the first live
    /// node sees them.
    ///
    /// Why: the nodes a test writes through, kills, or migrates between.
    pub async fn primaries(&self) -> io::Result<Vec<u16>> {
        let live = self.live_ports();
        let view = self.view().await?;
        let mut ports: Vec<u16> = view
            .iter()
            .filter(|n| n.is_primary() && live.contains(&n.port))
            .map(|n| n.port)
            .collect();
        ports.sort_unstable();
        Ok(ports)
    }

    /// Kills the node on `port` with SIGKILL and reaps it; returns at once, without
    /// waiting for the cluster to notice. Does nothing if it was killed before.
    ///
    /// Why: simulates a crashed node: no shutdown, clients see their connections
    /// reset, and the cluster fails it over after the node timeout.
    pub fn kill(&mut self, port: u16) -> io::Result<()> {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.port == port)
            .ok_or_else(|| not_ours(port))?;
        match node.child.take() {
            Some(mut child) => process::kill9(&mut child),
            None => Ok(()),
        }
    }

    /// Waits (bounded: ten node timeouts) until every live node says `slot` is served
    /// by one same live primary other than `old_port`, and `cluster_state:ok`; returns
    /// that primary's port.
    ///
    /// Why: after [`kill`](Self::kill)ing a primary, a test must know when its replica
    /// has taken over everywhere, so what it checks next is the state after the
    /// failover, not a moment in between.
    pub async fn wait_failover(&self, slot: u16, old_port: u16) -> io::Result<u16> {
        check_slot(slot)?;
        let bound = self.node_timeout * FAILOVER_BOUND_NODE_TIMEOUTS;
        let live = &self.live_ports();
        let check = move || async move {
            let mut agreed = None;
            for &port in live {
                let (mut conn, _) = connect_if_ok(port).await?;
                let view = cluster_nodes(&mut conn, port)
                    .await
                    .map_err(|e| e.to_string())?;
                let Some(now) = owner(&view, slot).map(|n| n.port) else {
                    return Err(format!("node {port} sees no owner of slot {slot}"));
                };
                if now == old_port || !live.contains(&now) {
                    return Err(format!("node {port} says slot {slot} is on {now}"));
                }
                match agreed {
                    Some(p) if p != now => {
                        return Err(format!("nodes disagree on slot {slot}: {p} and {now}"))
                    }
                    _ => agreed = Some(now),
                }
            }
            agreed.ok_or_else(|| "no live node".to_owned())
        };
        poll_until(bound, "the failover", check).await
    }

    /// Moves `slot` live to the primary on `to_port`: marks it importing on the target
    /// and migrating on the source, then moves its keys with `MIGRATE` (`batch` keys a
    /// call, waiting `pause` between calls), then assigns the slot to the target on the
    /// target, the source and every other primary, and waits (bounded) until every live
    /// node names the target. Returns how many keys MIGRATE moved (every key of each
    /// batch it accepted; one deleted meanwhile still counts). Moving a slot to the
    /// primary that owns it does nothing and returns 0. On an error the slot is left
    /// half-moved: the cluster is the test's own and dies with it.
    ///
    /// Why: a slot migration is what a cluster does while the service runs, and the
    /// moment it answers ASK for some keys of a product and not others; the pause lets
    /// a test run a sale in the middle. Keys a client creates meanwhile go to the
    /// target (ASK), so the source only empties and the loop ends.
    pub async fn migrate_slot(
        &self,
        slot: u16,
        to_port: u16,
        batch: usize,
        pause: Duration,
    ) -> io::Result<usize> {
        check_slot(slot)?;
        if batch == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "migrate_slot needs a batch of at least one key",
            ));
        }
        let from_port = self.primary_of(slot).await?;
        if from_port == to_port {
            return Ok(0);
        }
        let primaries = self.primaries().await?;
        if !primaries.contains(&to_port) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{to_port} is not a live primary (primaries: {primaries:?})"),
            ));
        }
        let mut from = connect(from_port).await?;
        let mut to = connect(to_port).await?;
        let from_id: String =
            query(&mut from, from_port, redis::cmd("CLUSTER").arg("MYID")).await?;
        let to_id: String = query(&mut to, to_port, redis::cmd("CLUSTER").arg("MYID")).await?;

        let mut setslot = redis::cmd("CLUSTER");
        setslot
            .arg("SETSLOT")
            .arg(slot)
            .arg("IMPORTING")
            .arg(&from_id);
        query::<()>(&mut to, to_port, &setslot).await?;
        let mut setslot = redis::cmd("CLUSTER");
        setslot
            .arg("SETSLOT")
            .arg(slot)
            .arg("MIGRATING")
            .arg(&to_id);
        query::<()>(&mut from, from_port, &setslot).await?;

        let mut moved = 0;
        // Ends: every round moves at least one key off the source and no key is
        // created there meanwhile (see the doc comment).
        loop {
            let mut ask = redis::cmd("CLUSTER");
            ask.arg("GETKEYSINSLOT").arg(slot).arg(batch);
            let keys: Vec<Vec<u8>> = query(&mut from, from_port, &ask).await?;
            if keys.is_empty() {
                break;
            }
            if moved > 0 && !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
            let mut migrate = redis::cmd("MIGRATE");
            migrate
                .arg("127.0.0.1")
                .arg(to_port)
                .arg("")
                .arg(0)
                .arg(MIGRATE_TIMEOUT_MS)
                .arg("KEYS")
                .arg(&keys);
            // OK, or NOKEY when every key was deleted since GETKEYSINSLOT.
            let reply: String = query(&mut from, from_port, &migrate).await?;
            if reply == "OK" {
                moved += keys.len();
            }
        }

        let mut setslot = redis::cmd("CLUSTER");
        setslot.arg("SETSLOT").arg(slot).arg("NODE").arg(&to_id);
        // The target first: once it owns the slot, the source's redirections land.
        query::<()>(&mut to, to_port, &setslot).await?;
        query::<()>(&mut from, from_port, &setslot).await?;
        for &port in primaries
            .iter()
            .filter(|&&p| p != from_port && p != to_port)
        {
            let mut conn = connect(port).await?;
            query::<()>(&mut conn, port, &setslot).await?;
        }

        let live = &self.live_ports();
        let check = move || async move {
            for &port in live {
                let mut conn = connect(port).await.map_err(|e| e.to_string())?;
                let view = cluster_nodes(&mut conn, port)
                    .await
                    .map_err(|e| e.to_string())?;
                match owner(&view, slot).map(|n| n.port) {
                    Some(p) if p == to_port => {}
                    other => return Err(format!("node {port} says slot {slot} is on {other:?}")),
                }
            }
            Ok(())
        };
        poll_until(AGREE_TIMEOUT, "the slot's new owner", check).await?;
        Ok(moved)
    }

    /// The smallest product id ≥ 1 whose keys (`{p:<id>}…`, the service's hash tag)
    /// land on a slot owned by the primary on `port`, as the first live node sees it.
    ///
    /// Why: a test needs one product on each primary (to kill that primary, or migrate
    /// that product's slot), and the smallest id makes the choice repeatable.
    pub async fn product_on(&self, port: u16) -> io::Result<u64> {
        let view = self.view().await?;
        let node = view
            .iter()
            .find(|n| n.port == port && n.is_primary())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{port} is not a primary of the cluster"),
                )
            })?;
        (1..=PRODUCT_SEARCH_LIMIT)
            .find(|id| node.owns(Self::slot_of(&format!("{{p:{id}}}"))))
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no product id up to {PRODUCT_SEARCH_LIMIT} lands on {port}"),
                )
            })
    }

    /// Ports of the nodes not killed, in start order.
    fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.port)
            .collect()
    }

    /// `CLUSTER NODES` of the first live node.
    async fn view(&self) -> io::Result<Vec<NodeLine>> {
        let port = *self
            .live_ports()
            .first()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "every node is dead"))?;
        let mut conn = connect(port).await?;
        cluster_nodes(&mut conn, port).await
    }

    /// Runs `redis-cli --cluster create` over the six nodes (bounded by
    /// [`CREATE_TIMEOUT`]), its output in `create.log`.
    async fn create(&self) -> io::Result<()> {
        let log = self.dir.path().join(CREATE_LOG);
        let mut cmd = tokio::process::Command::new("redis-cli");
        cmd.args(["--cluster", "create"])
            .args(self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)))
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .kill_on_drop(true);
        process::run_bounded(&mut cmd, &log, CREATE_TIMEOUT, "redis-cli --cluster create").await
    }

    /// Waits (bounded by [`FORM_TIMEOUT`]) until every node agrees the cluster is
    /// formed (see [`start`](Self::start)).
    async fn wait_formed(&self) -> io::Result<()> {
        let ports = &self.live_ports();
        let check = move || async move {
            for &port in ports {
                node_formed(port).await?;
            }
            Ok(())
        };
        poll_until(FORM_TIMEOUT, "the cluster to form", check).await
    }
}

impl Drop for RedisCluster {
    /// Kills every node still running so no test leaves a redis-server behind; the
    /// temp dir is removed right after.
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                if let Err(e) = process::kill9(&mut child) {
                    tracing::warn!(port = node.port, error = %e, "could not kill cluster node");
                }
            }
        }
    }
}

/// Starts one cluster node in its own directory under `dir`, trying up to
/// [`START_ATTEMPTS`](process::START_ATTEMPTS) ports.
async fn start_node(dir: &Path, node_timeout: Duration) -> io::Result<Node> {
    process::start_retrying("cluster node", || async move {
        let port = cluster_port().map_err(NotReady::Failed)?;
        let node_dir = dir.join(port.to_string());
        std::fs::create_dir(&node_dir).map_err(NotReady::Failed)?;
        let child = launch(&node_dir, port, node_timeout).await?;
        Ok(Node {
            port,
            child: Some(child),
        })
    })
    .await
}

/// Spawns a cluster-enabled redis-server on `port` (bus port `port + 10000`) with its
/// files in `dir`, and waits until it answers as itself.
async fn launch(dir: &Path, port: u16, node_timeout: Duration) -> Result<Child, NotReady> {
    let mut cmd = redis_server(dir, port);
    cmd.args(["--cluster-enabled", "yes"])
        .arg("--cluster-config-file")
        .arg(dir.join(NODES_CONF))
        .arg("--cluster-node-timeout")
        .arg(node_timeout.as_millis().to_string())
        // A replica's first sync is sent straight from memory, and at once: the
        // default waits 5 s for more replicas to share it, which would make every
        // start 5 s longer.
        .args(["--repl-diskless-sync", "yes"])
        .args(["--repl-diskless-sync-delay", "0"]);
    let mut child = REDIS_SERVER.spawn(&mut cmd, dir)?;
    let pid = child.id();
    REDIS_SERVER
        .wait_ready(&mut child, dir, || answers_as(port, pid))
        .await?;
    Ok(child)
}

/// True if the server on `port` answers and is the process `pid` (`INFO server`), not
/// another process's server that took the port first.
async fn answers_as(port: u16, pid: u32) -> bool {
    let attempt = async {
        let mut conn = connect(port).await?;
        let info: String = query(&mut conn, port, redis::cmd("INFO").arg("server")).await?;
        Ok::<bool, io::Error>(info_field(&info, "process_id") == Some(&pid.to_string()))
    };
    matches!(attempt.await, Ok(true))
}

/// A connection to the node on `port`, and its `CLUSTER INFO`, when it says
/// `cluster_state:ok`; otherwise why not, as a reason for [`poll_until`].
///
/// Why: the first check of every wait on the cluster's state (formed, failed over).
async fn connect_if_ok(port: u16) -> Result<(MultiplexedConnection, String), String> {
    let mut conn = connect(port).await.map_err(|e| e.to_string())?;
    let info: String = query(&mut conn, port, redis::cmd("CLUSTER").arg("INFO"))
        .await
        .map_err(|e| e.to_string())?;
    if info_field(&info, "cluster_state") != Some("ok") {
        return Err(format!("node {port}: cluster_state is not ok"));
    }
    Ok((conn, info))
}

/// Ok when the node on `port` says the cluster is formed: `cluster_state:ok`, six known
/// nodes, three primaries and three replicas, none failed or still in handshake, and,
/// if it is a replica, its link to its primary up. Otherwise what is missing.
async fn node_formed(port: u16) -> Result<(), String> {
    let (mut conn, info) = connect_if_ok(port).await?;
    if info_field(&info, "cluster_known_nodes") != Some(&NODE_COUNT.to_string()) {
        return Err(format!("node {port}: does not know {NODE_COUNT} nodes yet"));
    }
    let view = cluster_nodes(&mut conn, port)
        .await
        .map_err(|e| e.to_string())?;
    let primaries = view.iter().filter(|n| n.is_primary()).count();
    let replicas = view.iter().filter(|n| n.has_flag("slave")).count();
    if primaries != PRIMARY_COUNT || replicas != NODE_COUNT - PRIMARY_COUNT {
        return Err(format!(
            "node {port}: sees {primaries} primaries and {replicas} replicas"
        ));
    }
    if let Some(bad) = view.iter().find(|n| !n.is_healthy()) {
        return Err(format!("node {port}: sees {} as {:?}", bad.port, bad.flags));
    }
    let replication: String = query(&mut conn, port, redis::cmd("INFO").arg("replication"))
        .await
        .map_err(|e| e.to_string())?;
    if info_field(&replication, "role") == Some("slave")
        && info_field(&replication, "master_link_status") != Some("up")
    {
        return Err(format!("node {port}: replica not in sync yet"));
    }
    Ok(())
}

/// `redis://127.0.0.1:<port>/`.
fn node_url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}/")
}

/// A plain (not cluster-aware) connection to the node on `port`, with this module's
/// timeouts.
async fn connect(port: u16) -> io::Result<MultiplexedConnection> {
    let client = redis::Client::open(node_url(port)).map_err(|e| redis_error(port, e))?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(REPLY_TIMEOUT));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| redis_error(port, e))
}

/// Runs `cmd` on `conn` (a connection to the node on `port`, named in errors).
async fn query<T: FromRedisValue>(
    conn: &mut MultiplexedConnection,
    port: u16,
    cmd: &redis::Cmd,
) -> io::Result<T> {
    cmd.query_async(conn)
        .await
        .map_err(|e| redis_error(port, e))
}

/// A redis error as an `io::Error` naming the node.
fn redis_error(port: u16, e: redis::RedisError) -> io::Error {
    io::Error::other(format!("node 127.0.0.1:{port}: {e}"))
}

/// The error for a port that is not one of this cluster's nodes.
fn not_ours(port: u16) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("no node of this cluster listens on {port}"),
    )
}

/// Refuses a slot number past 16383.
fn check_slot(slot: u16) -> io::Result<()> {
    if slot < SLOT_COUNT {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("slot {slot} is not below {SLOT_COUNT}"),
        ))
    }
}

/// The value of `field` in an `INFO` or `CLUSTER INFO` reply (`field:value` lines).
fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key == field).then(|| value.trim())
    })
}

/// One node as a `CLUSTER NODES` line describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeLine {
    /// Client port (0 for a node whose address is not known yet).
    port: u16,
    /// `myself`, `master`, `slave`, `fail?`, `fail`, `handshake`, `noaddr`, …
    flags: Vec<String>,
    /// Slots served, as ranges; migration markers (`[slot->-id]`) left out.
    slots: Vec<RangeInclusive<u16>>,
}

impl NodeLine {
    fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    /// A primary not marked failed.
    fn is_primary(&self) -> bool {
        self.has_flag("master") && !self.has_flag("fail")
    }

    /// Not failed, suspected, in handshake or without an address.
    fn is_healthy(&self) -> bool {
        !["fail", "fail?", "handshake", "noaddr"]
            .iter()
            .any(|f| self.has_flag(f))
    }

    fn owns(&self, slot: u16) -> bool {
        self.slots.iter().any(|r| r.contains(&slot))
    }
}

/// The primary (not failed) that owns `slot` in `view`.
fn owner(view: &[NodeLine], slot: u16) -> Option<&NodeLine> {
    view.iter().find(|n| n.is_primary() && n.owns(slot))
}

/// `CLUSTER NODES` of the node on `port`, parsed.
async fn cluster_nodes(conn: &mut MultiplexedConnection, port: u16) -> io::Result<Vec<NodeLine>> {
    let text: String = query(conn, port, redis::cmd("CLUSTER").arg("NODES")).await?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            parse_node_line(l).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("node {port}: unexpected CLUSTER NODES line {l:?}"),
                )
            })
        })
        .collect()
}

/// Parses `<id> <ip:port@cport[,hostname]> <flags> <primary> <ping> <pong> <epoch>
/// <link> <slot>…`.
fn parse_node_line(line: &str) -> Option<NodeLine> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() < 8 {
        return None;
    }
    let addr = fields[1].split([',', '@']).next()?;
    let port = addr.rsplit_once(':')?.1.parse().ok()?;
    let flags = fields[2].split(',').map(str::to_owned).collect();
    let mut slots = Vec::new();
    for slot in &fields[8..] {
        if slot.starts_with('[') {
            continue;
        }
        let range = match slot.split_once('-') {
            Some((a, b)) => a.parse().ok()?..=b.parse().ok()?,
            None => {
                let s = slot.parse().ok()?;
                s..=s
            }
        };
        slots.push(range);
    }
    Some(NodeLine { port, flags, slots })
}

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), the checksum Redis
/// Cluster hashes keys with.
fn crc16_xmodem(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_of_follows_the_cluster_spec() {
        // Check value of CRC16/XMODEM, and examples of the Redis Cluster specification.
        assert_eq!(crc16_xmodem(b"123456789"), 0x31C3);
        assert_eq!(RedisCluster::slot_of("foo"), 12182);
        let slot = RedisCluster::slot_of;
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
        assert_eq!(slot("foo{bar}{zap}"), slot("bar"));
        assert_eq!(slot("foo{{bar}}zap"), slot("{bar"));
        // An empty tag does not count: the whole key is hashed.
        assert_eq!(slot("foo{}{bar}"), crc16_xmodem(b"foo{}{bar}") % SLOT_COUNT);
        assert_eq!(slot("{p:17}:inv"), slot("{p:17}:users"));
    }

    #[test]
    fn parses_cluster_nodes_lines() {
        let primary = parse_node_line(
            "07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@40004,host \
             myself,master - 0 1426238317239 4 connected 0-5460 5462 [5461->-e7d1eecce]",
        )
        .unwrap();
        assert_eq!(primary.port, 30004);
        assert!(primary.is_primary() && primary.is_healthy());
        assert!(primary.owns(0) && primary.owns(5460) && primary.owns(5462));
        assert!(!primary.owns(5461));

        let failed = parse_node_line(
            "e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@40001 master,fail - \
             1426238316232 1426238315000 1 disconnected",
        )
        .unwrap();
        assert!(!failed.is_primary() && !failed.is_healthy());
        assert!(failed.slots.is_empty());

        assert_eq!(parse_node_line("garbage"), None);
    }

    #[test]
    fn reads_info_fields() {
        let info = "# Replication\r\nrole:slave\r\nmaster_link_status:up\r\n";
        assert_eq!(info_field(info, "role"), Some("slave"));
        assert_eq!(info_field(info, "master_link_status"), Some("up"));
        assert_eq!(info_field(info, "missing"), None);
    }
}
