//! Which MariaDB node the ledger writes through: the URL's one node, or one node of a
//! Galera cluster (`FLASHSALE_DATABASE_NODES`).
//!
//! On a cluster every instance writes through one node at a time, and all instances
//! through the same one: **the first listed node that is healthy** (`wsrep_ready=ON`,
//! `wsrep_cluster_status=Primary`, `wsrep_local_state_comment=Synced`). Agreement is for
//! speed, not for correctness. A hot product's inventory row written through two nodes at
//! once loses about half its transactions at certification (1213 at COMMIT, retried like
//! any deadlock); nothing is oversold either way, because certification refuses the later
//! of two conflicting writesets whatever node each came through.
//!
//! [`Route`] holds the current writer: its node, an epoch that grows at each switch, and
//! the pool of connections to it. Callers take the pool anew for each attempt, and the
//! ledger's own connections (`dedicated.rs`) compare their epoch with the route's before
//! each use, so after a switch no new statement goes to the old node. A watch task probes
//! every node each [`PROBE_PERIOD`] on monitoring connections of its own (each probe
//! bounded by [`PROBE_TIMEOUT`]) and feeds the results to [`WriterChoice`], the rule as a
//! pure state machine. A statement that lost its connection or met a node outside the
//! Primary component wakes the watch at once ([`Route::suspect`]), so the switch comes
//! within one probe of the failure, [`PROBE_TIMEOUT`] at most.
//!
//! **Moving back.** A node that failed and rejoined is taken back once it has been healthy
//! without a break for the failback time (`FLASHSALE_DATABASE_FAILBACK_AFTER`). Without
//! moving back, an instance started after the failover would pick the first listed node
//! while the older ones stayed on the next: two writers for good. Moving back makes every
//! instance converge on the same node again; the price is one short disagreement (at most
//! a probe period between two instances' switches) per rejoin, and the wait keeps a node
//! that keeps crashing from taking the writes back each time it comes up.

use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant};

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions};
use sqlx::{Connection, Row};
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::dedicated::PING_WHEN_IDLE_FOR;
use crate::sql::{prepare_session, Session};

/// How often the watch probes every node: a writer that stops answering without breaking
/// a connection (a paused process, a partition) is found within this plus
/// [`PROBE_TIMEOUT`]. Each probe is one `SHOW GLOBAL STATUS` per node, on a connection
/// kept for it: four a second per node and instance cost the nodes nothing measurable.
pub const PROBE_PERIOD: Duration = Duration::from_millis(250);
/// Longest wait for one node's probe (connecting included) before the node counts as
/// unhealthy: a healthy node answers `SHOW STATUS` in well under a millisecond, and a
/// node busy enough to take a second is a poor writer anyway.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Shortest time between two probe rounds when failures keep waking the watch: the
/// statements in flight on a failed node all fail within a moment, and each would
/// otherwise start a round of its own.
const PROBE_GAP_MIN: Duration = Duration::from_millis(50);
/// Most nodes `FLASHSALE_DATABASE_NODES` may name: Galera clusters run 3, 5 or 7 nodes
/// (more slows every commit, which waits for all of them); the watch probes each one.
pub const NODES_MAX: usize = 9;
/// How long a pool of the old writer stays open after a switch: a caller that took it
/// just before the switch finishes its attempt there (a write through the old node is
/// refused or certified like any other); past every caller's deadline it is closed.
const OLD_POOL_GRACE: Duration = Duration::from_secs(30);
/// Longest wait for an old pool's connections to close: on a paused node a close never
/// hears back, and the connections are then simply dropped.
const OLD_POOL_CLOSE_MAX: Duration = Duration::from_secs(5);

/// One node of a cluster: `host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAddr {
    host: String,
    port: u16,
}

impl NodeAddr {
    /// Parses `host:port` (a name, an IPv4 address, or an IPv6 one in brackets).
    pub fn parse(text: &str) -> Result<NodeAddr, String> {
        let bad = || format!("{text:?} is not a node like 127.0.0.1:3306 (host:port)");
        let (host, port) = text.trim().rsplit_once(':').ok_or_else(bad)?;
        let bracketed = host.starts_with('[') && host.ends_with(']');
        let host_ok = !host.is_empty()
            && host.chars().all(|c| {
                c.is_ascii_alphanumeric()
                    || matches!(c, '.' | '-' | '_')
                    || (bracketed && matches!(c, '[' | ']' | ':'))
            });
        match port.parse::<u16>() {
            Ok(port) if port > 0 && host_ok => Ok(NodeAddr {
                host: host.trim_matches(['[', ']']).to_owned(),
                port,
            }),
            _ => Err(bad()),
        }
    }

    /// A comma-separated list of nodes, at least one and at most [`NODES_MAX`], each
    /// named once.
    pub fn parse_list(text: &str) -> Result<Vec<NodeAddr>, String> {
        let nodes = text
            .split(',')
            .map(NodeAddr::parse)
            .collect::<Result<Vec<_>, _>>()?;
        if nodes.len() > NODES_MAX {
            return Err(format!("at most {NODES_MAX} nodes"));
        }
        for (i, node) in nodes.iter().enumerate() {
            if nodes[..i].contains(node) {
                return Err(format!("{node} is named twice"));
            }
        }
        Ok(nodes)
    }
}

impl std::fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// A Galera cluster the ledger writes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// The nodes in order of preference: the first healthy one is the writer.
    pub nodes: Vec<NodeAddr>,
    /// How long an earlier-listed node must stay healthy before the writes move back to it.
    pub failback_after: Duration,
}

/// The rule that picks the writer, as a pure state machine fed with probe rounds.
///
/// - A healthy writer is kept, unless an earlier-listed node has been healthy for the
///   failback time: the writes then move back to the first such node.
/// - A writer that is not healthy is left for the first healthy node in list order.
/// - With no node healthy the writer stays: there is nowhere better to go, and its
///   errors are answered 503 until something recovers.
#[derive(Debug)]
pub(crate) struct WriterChoice {
    failback_after: Duration,
    writer: usize,
    /// Since when each node has answered healthy without a break (None: its last probe
    /// did not).
    healthy_since: Vec<Option<Instant>>,
}

impl WriterChoice {
    pub(crate) fn new(nodes: usize, writer: usize, failback_after: Duration) -> Self {
        debug_assert!(writer < nodes, "the writer is one of the nodes");
        WriterChoice {
            failback_after,
            writer,
            healthy_since: vec![None; nodes],
        }
    }

    /// Records one probe round taken at `now` (`healthy[i]`: node i answered healthy)
    /// and returns the writer it leads to.
    pub(crate) fn observe(&mut self, now: Instant, healthy: &[bool]) -> usize {
        debug_assert_eq!(
            healthy.len(),
            self.healthy_since.len(),
            "one result per node"
        );
        for (since, &ok) in self.healthy_since.iter_mut().zip(healthy) {
            *since = if ok { Some(since.unwrap_or(now)) } else { None };
        }
        let writer_healthy = healthy.get(self.writer).copied().unwrap_or(false);
        let next = if writer_healthy {
            let settled = |i: &usize| {
                self.healthy_since[*i].is_some_and(|since| {
                    now.saturating_duration_since(since) >= self.failback_after
                })
            };
            (0..self.writer).find(settled)
        } else {
            healthy.iter().position(|&ok| ok)
        };
        if let Some(next) = next {
            self.writer = next;
        }
        self.writer
    }
}

/// What a pool of the ledger is made of.
#[derive(Debug, Clone)]
pub(crate) struct PoolSettings {
    pub(crate) max_connections: u32,
    pub(crate) acquire_timeout: Duration,
}

/// The writer in use: its node, and the pool of connections to it.
pub(crate) struct Current {
    /// Grows by one at each switch.
    pub(crate) epoch: u64,
    pub(crate) node: usize,
    pub(crate) options: MySqlConnectOptions,
    pub(crate) pool: MySqlPool,
}

/// Where the ledger's statements go: see the module's doc.
pub(crate) struct Route {
    /// Each node's connect options: the URL's user, password, database and session
    /// options with the node's host and port (one entry, the URL's own, without a cluster).
    nodes: Vec<(NodeAddr, MySqlConnectOptions)>,
    /// Whether the nodes are a Galera cluster (probed, and read with `wsrep_sync_wait`).
    cluster: bool,
    settings: PoolSettings,
    current: RwLock<Arc<Current>>,
    choice: Mutex<WriterChoice>,
    /// Wakes the watch before its period: a statement failed in a way a dead writer
    /// explains.
    wake: Arc<Notify>,
}

impl Route {
    /// The URL's one node, as without a cluster.
    pub(crate) fn single(options: MySqlConnectOptions, settings: PoolSettings) -> Arc<Route> {
        let addr = NodeAddr {
            host: options.get_host().to_owned(),
            port: options.get_port(),
        };
        Route::build(vec![(addr, options)], false, 0, Duration::MAX, settings)
    }

    /// A Galera cluster: every node is probed once (bounded by [`PROBE_TIMEOUT`]) and the
    /// first healthy one becomes the writer (the first node when none is), then the watch
    /// starts. It runs until the route is dropped.
    pub(crate) async fn cluster(
        base: &MySqlConnectOptions,
        config: &ClusterConfig,
        settings: PoolSettings,
    ) -> Arc<Route> {
        let nodes: Vec<_> = config
            .nodes
            .iter()
            .map(|addr| {
                let options = base.clone().host(&addr.host).port(addr.port);
                (addr.clone(), options)
            })
            .collect();
        let mut monitors = Monitors::new(nodes.len());
        let healthy = monitors.probe_all(&nodes).await;
        let first = healthy.iter().position(|&ok| ok).unwrap_or(0);
        if !healthy.iter().any(|&ok| ok) {
            warn!(nodes = %list(&nodes), "no database node is healthy; writing through the first");
        }
        let route = Route::build(nodes, true, first, config.failback_after, settings);
        route.choice().observe(Instant::now(), &healthy);
        info!(writer = %route.nodes[first].0, nodes = %list(&route.nodes), "ledger writer chosen");
        tokio::spawn(watch(Arc::downgrade(&route), monitors));
        route
    }

    fn build(
        nodes: Vec<(NodeAddr, MySqlConnectOptions)>,
        cluster: bool,
        writer: usize,
        failback_after: Duration,
        settings: PoolSettings,
    ) -> Arc<Route> {
        let options = nodes[writer].1.clone();
        let pool = pool_for(&options, &settings, session(cluster));
        Arc::new(Route {
            choice: Mutex::new(WriterChoice::new(nodes.len(), writer, failback_after)),
            nodes,
            cluster,
            settings,
            current: RwLock::new(Arc::new(Current {
                epoch: 0,
                node: writer,
                options,
                pool,
            })),
            wake: Arc::new(Notify::new()),
        })
    }

    /// The writer in use now.
    pub(crate) fn current(&self) -> Arc<Current> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The pool of the writer in use now: take it anew for every attempt.
    pub(crate) fn pool(&self) -> MySqlPool {
        self.current().pool.clone()
    }

    /// Whether the nodes are a Galera cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// The session settings of a connection to the writer.
    pub(crate) fn session(&self) -> Session {
        session(self.cluster)
    }

    /// A statement failed as a dead or cut-off writer fails: probe now.
    pub(crate) fn suspect(&self) {
        if self.cluster {
            self.wake.notify_one();
        }
    }

    /// The writer's address, for logs and metrics.
    pub(crate) fn writer_addr(&self) -> String {
        self.nodes[self.current().node].0.to_string()
    }

    fn choice(&self) -> std::sync::MutexGuard<'_, WriterChoice> {
        self.choice.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Feeds one probe round to the rule, and switches when it names another node.
    fn observe(&self, now: Instant, healthy: &[bool]) {
        let next = self.choice().observe(now, healthy);
        let current = self.current();
        if next == current.node {
            return;
        }
        let options = self.nodes[next].1.clone();
        let pool = pool_for(&options, &self.settings, self.session());
        let old = std::mem::replace(
            &mut *self.current.write().unwrap_or_else(|e| e.into_inner()),
            Arc::new(Current {
                epoch: current.epoch + 1,
                node: next,
                options,
                pool,
            }),
        );
        warn!(
            from = %self.nodes[old.node].0,
            to = %self.nodes[next].0,
            from_healthy = healthy.get(old.node).copied().unwrap_or(false),
            "ledger writer switched"
        );
        tokio::spawn(async move {
            tokio::time::sleep(OLD_POOL_GRACE).await;
            let _ = tokio::time::timeout(OLD_POOL_CLOSE_MAX, old.pool.close()).await;
        });
    }
}

fn list(nodes: &[(NodeAddr, MySqlConnectOptions)]) -> String {
    nodes
        .iter()
        .map(|(addr, _)| addr.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn session(cluster: bool) -> Session {
    if cluster {
        Session::CausalReads
    } else {
        Session::Plain
    }
}

/// A pool of connections to one node, each with the ledger's session settings.
fn pool_for(options: &MySqlConnectOptions, settings: &PoolSettings, session: Session) -> MySqlPool {
    MySqlPoolOptions::new()
        .max_connections(settings.max_connections)
        .min_connections(0)
        .acquire_timeout(settings.acquire_timeout)
        // A ping on every acquire was one round trip per statement or transaction
        // (the most frequent command in a sustained run). Only a connection idle long
        // enough to have been cut (a restarted server, a proxy's timeout) is pinged;
        // a busy one that breaks fails its statement, which answers "unknown" (503)
        // like any lost connection, and the pool drops it.
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= PING_WHEN_IDLE_FOR {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
        .after_connect(move |conn, _meta| Box::pin(prepare_session(conn, session)))
        .connect_lazy_with(options.clone())
}

/// The watch: probes every node each [`PROBE_PERIOD`], or at once when woken, and
/// switches the writer as [`WriterChoice`] says, until the route is dropped.
async fn watch(route: Weak<Route>, mut monitors: Monitors) {
    loop {
        let Some(strong) = route.upgrade() else {
            return;
        };
        let wake = strong.wake.clone();
        let nodes = strong.nodes.clone();
        drop(strong);
        tokio::select! {
            () = tokio::time::sleep(PROBE_PERIOD) => {}
            () = wake.notified() => {}
        }
        let started = Instant::now();
        let healthy = monitors.probe_all(&nodes).await;
        let Some(strong) = route.upgrade() else {
            return;
        };
        strong.observe(started, &healthy);
        drop(strong);
        tokio::time::sleep(PROBE_GAP_MIN.saturating_sub(started.elapsed())).await;
    }
}

/// One monitoring connection per node, kept between probes.
struct Monitors(Vec<Option<MySqlConnection>>);

impl Monitors {
    fn new(nodes: usize) -> Self {
        Monitors((0..nodes).map(|_| None).collect())
    }

    /// Every node's health, probed at once, each within [`PROBE_TIMEOUT`].
    async fn probe_all(&mut self, nodes: &[(NodeAddr, MySqlConnectOptions)]) -> Vec<bool> {
        let probes = self
            .0
            .iter_mut()
            .zip(nodes)
            .map(|(conn, (addr, options))| async move {
                let outcome = tokio::time::timeout(PROBE_TIMEOUT, probe(conn, options)).await;
                match outcome {
                    Ok(Ok(health)) => health.writable(),
                    Ok(Err(e)) => {
                        tracing::debug!(node = %addr, error = %e, "database node probe failed");
                        *conn = None;
                        false
                    }
                    Err(_) => {
                        tracing::debug!(node = %addr, "database node probe timed out");
                        *conn = None;
                        false
                    }
                }
            });
        futures::future::join_all(probes).await
    }
}

/// What a probe read of a node's Galera status.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Health {
    pub(crate) ready: bool,
    pub(crate) primary: bool,
    pub(crate) synced: bool,
}

impl Health {
    /// Whether the node may take the writes: ready, in the Primary component, and synced
    /// (not joining, nor a donor busy sending a state transfer).
    pub(crate) fn writable(&self) -> bool {
        self.ready && self.primary && self.synced
    }
}

/// One node's Galera status, on its monitoring connection (opened when there is none).
async fn probe(
    conn: &mut Option<MySqlConnection>,
    options: &MySqlConnectOptions,
) -> Result<Health, sqlx::Error> {
    let mut own = match conn.take() {
        Some(own) => own,
        None => {
            MySqlConnection::connect_with(&options.clone().database("information_schema")).await?
        }
    };
    let rows = sqlx::query(
        "SHOW GLOBAL STATUS WHERE Variable_name IN \
         ('wsrep_ready', 'wsrep_cluster_status', 'wsrep_local_state_comment')",
    )
    .fetch_all(&mut own)
    .await?;
    // Kept only after a good answer: a failed or abandoned probe leaves none, and the
    // next one connects anew.
    *conn = Some(own);
    let mut health = Health::default();
    for row in rows {
        let name: String = row.try_get(0)?;
        let value: String = row.try_get(1)?;
        match name.to_ascii_lowercase().as_str() {
            "wsrep_ready" => health.ready = value == "ON",
            "wsrep_cluster_status" => health.primary = value == "Primary",
            "wsrep_local_state_comment" => health.synced = value == "Synced",
            _ => {}
        }
    }
    Ok(health)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAILBACK: Duration = Duration::from_secs(10);

    // Checks the writer rule on probe rounds: a healthy writer is kept; a failed one is
    // left for the first healthy node in list order; with none healthy it stays; a node
    // listed earlier takes the writes back only after the failback time of unbroken
    // health (a break restarts its clock), and then the first such node wins.
    #[test]
    fn the_writer_is_the_first_healthy_node_and_moves_back_only_when_settled() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut choice = WriterChoice::new(3, 0, FAILBACK);
        assert_eq!(choice.observe(at(0), &[true, true, true]), 0);
        assert_eq!(choice.observe(at(1), &[false, true, true]), 1, "failover");
        assert_eq!(choice.observe(at(2), &[false, false, true]), 2, "and again");
        assert_eq!(
            choice.observe(at(3), &[false, false, false]),
            2,
            "nowhere to go"
        );
        assert_eq!(
            choice.observe(at(4), &[true, false, true]),
            2,
            "node 0 back"
        );
        assert_eq!(
            choice.observe(at(13), &[true, true, true]),
            2,
            "not settled yet"
        );
        assert_eq!(
            choice.observe(at(14), &[true, true, true]),
            0,
            "settled: back"
        );
        assert_eq!(choice.observe(at(15), &[false, true, true]), 1);
        assert_eq!(choice.observe(at(16), &[true, true, true]), 1);
        assert_eq!(choice.observe(at(20), &[false, true, true]), 1, "a break");
        assert_eq!(choice.observe(at(21), &[true, true, true]), 1);
        assert_eq!(
            choice.observe(at(30), &[true, true, true]),
            1,
            "clock restarted"
        );
        assert_eq!(choice.observe(at(31), &[true, true, true]), 0);
    }

    // Checks that a failed writer goes to the first healthy node even when an earlier
    // one is healthy but not yet settled: leaving a dead writer never waits.
    #[test]
    fn a_failed_writer_never_waits_for_the_failback_time() {
        let t0 = Instant::now();
        let mut choice = WriterChoice::new(3, 2, FAILBACK);
        assert_eq!(choice.observe(t0, &[false, false, true]), 2);
        assert_eq!(
            choice.observe(t0 + Duration::from_secs(1), &[true, true, false]),
            0
        );
    }

    // Checks the parsing of FLASHSALE_DATABASE_NODES: names, IPv4 and bracketed IPv6
    // addresses with a port; no port, port 0, a bad character, an unbracketed IPv6
    // address, a node named twice and too many nodes are refused.
    #[test]
    fn nodes_parse_as_host_and_port() {
        let nodes =
            NodeAddr::parse_list("db-1.local:3306, 10.0.0.2:3307,[::1]:3308").expect("three nodes");
        let shown: Vec<String> = nodes.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["db-1.local:3306", "10.0.0.2:3307", "[::1]:3308"]);
        for bad in [
            "db", "db:0", "db:x", "d b:1", "::1:3306", ":3306", "a:1,a:1", "a:1,,b:2",
        ] {
            assert!(NodeAddr::parse_list(bad).is_err(), "{bad}");
        }
        let many = (1..=NODES_MAX + 1)
            .map(|i| format!("n{i}:3306"))
            .collect::<Vec<_>>()
            .join(",");
        assert!(NodeAddr::parse_list(&many).is_err());
    }
}
