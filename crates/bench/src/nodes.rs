//! `--galera` and `--compare-galera`: the private databases a spawned server's ledger may
//! live on — a 3-node MariaDB Galera cluster, and one MariaDB with the nodes' own InnoDB
//! settings to measure it against —, both started by the bench (the testkit's, as
//! `--outage` starts its redis-server) and removed when it ends; where each run goes; and
//! what the nodes did over its load: each node's CPU time from `/proc`, and the `wsrep_`
//! status counters of every node of the cluster.
//!
//! Each run still gets a fresh database of its own, created by its server through node 0
//! (the writer while every node is healthy: the first listed). The one node is a
//! `PrivateMariadb` rather than the shared MariaDB on 3306 so that the two differ in
//! replication only: the same 64 MB buffer pool, 8 MB redo log and `--no-defaults` as
//! each Galera node (the shared one has 128 MB and 96 MB), and no other client's load.

use std::collections::BTreeMap;

use flashsale_testkit::{GaleraCluster, PrivateMariadb};
use sqlx::{Connection, MySqlConnection};

use crate::cli::{Args, Database};
use crate::probes::{bounded, PROBE_TIMEOUT};
use crate::report::GaleraFigures;
use crate::server::DATABASE_NODES_ENV;

/// The CPU names of the nodes that serve a run, in the cluster's order (the writer,
/// node 0, first; the one node of a one-node run is "node0" too).
pub const NODE_NAMES: [&str; 3] = ["node0", "node1", "node2"];
/// The CPU name of the private database's processes that do not serve the run (the
/// cluster during a one-node run and the reverse): idle, but kept out of "mariadb".
pub const IDLE_NAME: &str = "db-idle";

/// The private databases of a bench run: none, the cluster, or both.
#[derive(Default)]
pub struct Stores {
    galera: Option<GaleraCluster>,
    one_node: Option<PrivateMariadb>,
}

/// Where one run's server writes, and what to read of it around the load.
#[derive(Debug, Clone, Default)]
pub struct Placement {
    pub database: Database,
    /// The server (without a database) that hosts the run's fresh database; None: the
    /// server of --database-url.
    pub database_url: Option<String>,
    /// `FLASHSALE_DATABASE_NODES` for the server and the audit, on a cluster.
    pub nodes_setting: Option<String>,
    /// Processes read apart in the CPU figures, by name (`NODE_NAMES`, `IDLE_NAME`).
    pub cpu: Vec<(String, u32)>,
    /// Each node's URL on a cluster (node 0, the writer, first): its `wsrep_` counters
    /// are read before and after the load.
    pub galera_urls: Vec<String>,
}

/// The `wsrep_` status values of every node of a cluster at one moment (None for a node
/// that did not answer).
pub type WsrepSnapshot = Vec<Option<BTreeMap<String, String>>>;

impl Stores {
    /// Starts what `args` asks for: the cluster for --galera, the cluster and the one
    /// node for --compare-galera; nothing otherwise.
    pub async fn start(args: &Args) -> Result<Stores, String> {
        let mut stores = Stores::default();
        if args.galera || args.compare_galera {
            eprintln!("flashsale-bench: starting a private 3-node Galera cluster …");
            let cluster = GaleraCluster::start()
                .await
                .map_err(|e| format!("private Galera cluster: {e}"))?;
            eprintln!(
                "flashsale-bench: Galera cluster {} ready",
                cluster.nodes_setting()
            );
            stores.galera = Some(cluster);
        }
        if args.compare_galera {
            let one = PrivateMariadb::start()
                .await
                .map_err(|e| format!("private MariaDB: {e}"))?;
            eprintln!("flashsale-bench: one-node MariaDB {} ready", one.addr());
            stores.one_node = Some(one);
        }
        Ok(stores)
    }

    /// Where a run on `database` goes; an error when that store was not started.
    pub fn place(&self, database: Database) -> Result<Placement, String> {
        let missing = |what: &str| format!("no {what} was started for this run");
        let mut placed = Placement {
            database,
            ..Placement::default()
        };
        match database {
            Database::Given => {}
            Database::Galera => {
                let cluster = self
                    .galera
                    .as_ref()
                    .ok_or_else(|| missing("Galera cluster"))?;
                placed.database_url = Some(cluster.url(0));
                placed.nodes_setting = Some(cluster.nodes_setting());
                placed.galera_urls = (0..cluster.len()).map(|i| cluster.url(i)).collect();
                placed.cpu = cluster_pids(cluster, NODE_NAMES.iter().map(|n| (*n).to_owned()));
                if let Some(pid) = self.one_node.as_ref().and_then(one_node_pid) {
                    placed.cpu.push((IDLE_NAME.to_owned(), pid));
                }
            }
            Database::OneNode => {
                let one = self
                    .one_node
                    .as_ref()
                    .ok_or_else(|| missing("one-node MariaDB"))?;
                placed.database_url = Some(one.url());
                placed
                    .cpu
                    .extend(one_node_pid(one).map(|p| (NODE_NAMES[0].to_owned(), p)));
                if let Some(cluster) = &self.galera {
                    let idle = std::iter::repeat_with(|| IDLE_NAME.to_owned());
                    placed.cpu.extend(cluster_pids(cluster, idle));
                }
            }
        }
        Ok(placed)
    }
}

/// The pid of each running node of `cluster`, named in order by `names`.
fn cluster_pids(
    cluster: &GaleraCluster,
    names: impl Iterator<Item = String>,
) -> Vec<(String, u32)> {
    (0..cluster.len())
        .zip(names)
        .filter_map(|(i, name)| cluster.pid(i).map(|pid| (name, pid)))
        .collect()
}

/// The pid of the private MariaDB: the `mariadbd` started with its port.
fn one_node_pid(one: &PrivateMariadb) -> Option<u32> {
    crate::probes::mariadbd_on_port(one.addr().port())
}

impl Placement {
    /// A spawned server's settings: the run's own, then the cluster's nodes (last, so
    /// that they win over a `--server-env` naming others).
    pub fn server_env(&self, own: &[(String, String)]) -> Vec<(String, String)> {
        let mut env = own.to_vec();
        if let Some(nodes) = &self.nodes_setting {
            env.push((DATABASE_NODES_ENV.to_owned(), nodes.clone()));
        }
        env
    }

    /// Every node's `wsrep_` status values (None off a cluster). With `flush`, each node
    /// first resets its averages (`FLUSH STATUS`): sent just before the load, the ones
    /// read after it cover the load alone. A node that does not answer is reported and
    /// left out.
    pub async fn wsrep(&self, flush: bool) -> Option<WsrepSnapshot> {
        if self.galera_urls.is_empty() {
            return None;
        }
        let mut nodes = Vec::with_capacity(self.galera_urls.len());
        for url in &self.galera_urls {
            match wsrep_status(url, flush).await {
                Ok(values) => nodes.push(Some(values)),
                Err(e) => {
                    eprintln!("flashsale-bench: Galera figures of {url}: {e}");
                    nodes.push(None);
                }
            }
        }
        Some(nodes)
    }
}

/// One node's `SHOW GLOBAL STATUS LIKE 'wsrep_%'`, after a `FLUSH STATUS` when `flush`.
async fn wsrep_status(url: &str, flush: bool) -> Result<BTreeMap<String, String>, String> {
    let mut conn = bounded("connect", MySqlConnection::connect(url)).await?;
    if flush {
        bounded(
            "FLUSH STATUS",
            sqlx::query("FLUSH STATUS").execute(&mut conn),
        )
        .await?;
    }
    let rows: Vec<(String, String)> = bounded(
        "SHOW GLOBAL STATUS",
        sqlx::query_as("SHOW GLOBAL STATUS LIKE 'wsrep_%'").fetch_all(&mut conn),
    )
    .await?;
    let _ = tokio::time::timeout(PROBE_TIMEOUT, conn.close()).await;
    Ok(rows.into_iter().collect())
}

/// What the cluster did between two snapshots of a load that lasted `elapsed_s` and
/// created `orders` orders; None off a cluster or when the writer was not read.
pub fn figures(
    before: Option<&WsrepSnapshot>,
    after: Option<&WsrepSnapshot>,
    elapsed_s: f64,
    orders: u64,
) -> Option<GaleraFigures> {
    let (before, after) = (before?, after?);
    let (b0, a0) = (before.first()?.as_ref()?, after.first()?.as_ref()?);
    let delta = |b: &BTreeMap<String, String>, a: &BTreeMap<String, String>, name: &str| {
        let value = |m: &BTreeMap<String, String>| m.get(name)?.parse::<u64>().ok();
        Some(value(a)?.saturating_sub(value(b)?))
    };
    // A counter summed over the nodes read both times.
    let summed = |names: &[&str]| {
        let pairs = before
            .iter()
            .zip(after)
            .filter_map(|(b, a)| b.as_ref().zip(a.as_ref()));
        pairs
            .flat_map(|(b, a)| names.iter().map(move |n| delta(b, a, n)))
            .sum::<Option<u64>>()
    };
    let float = |m: &BTreeMap<String, String>, name: &str| m.get(name)?.parse::<f64>().ok();
    let per_order = |n: Option<u64>| n.filter(|_| orders > 0).map(|n| n as f64 / orders as f64);
    let writesets = delta(b0, a0, "wsrep_replicated");
    let replicated_bytes = delta(b0, a0, "wsrep_replicated_bytes");
    let paused_ns = delta(b0, a0, "wsrep_flow_control_paused_ns");
    Some(GaleraFigures {
        writesets,
        replicated_bytes,
        writesets_per_order: per_order(writesets),
        bytes_per_order: per_order(replicated_bytes),
        flow_control_paused: paused_ns
            .filter(|_| elapsed_s > 0.0)
            .map(|ns| ns as f64 / 1e9 / elapsed_s),
        flow_control_sent: summed(&["wsrep_flow_control_sent"]),
        send_queue_avg: float(a0, "wsrep_local_send_queue_avg"),
        recv_queue_avg: after
            .iter()
            .skip(1)
            .flatten()
            .filter_map(|m| float(m, "wsrep_local_recv_queue_avg"))
            .reduce(f64::max),
        conflicts: summed(&["wsrep_local_cert_failures", "wsrep_local_bf_aborts"]),
        sync_waits_per_order: per_order(delta(b0, a0, "wsrep_causal_reads")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        )
    }

    // Checks the figures of a load of 2 s and 100 orders on three nodes: the writer's
    // writesets, bytes and causality waits as deltas and per order, flow control's pause
    // as a share of the load, the pauses asked and the conflicts summed over the nodes (a
    // node not read afterwards left out), the writer's send queue and the longest apply
    // queue of the others as read after the load; nothing off a cluster or without the
    // writer.
    #[test]
    fn galera_figures_from_two_snapshots() {
        let before = vec![
            node(&[
                ("wsrep_replicated", "10"),
                ("wsrep_replicated_bytes", "1000"),
                ("wsrep_causal_reads", "5"),
                ("wsrep_flow_control_paused_ns", "0"),
                ("wsrep_flow_control_sent", "0"),
                ("wsrep_local_cert_failures", "1"),
                ("wsrep_local_bf_aborts", "0"),
            ]),
            node(&[
                ("wsrep_flow_control_sent", "3"),
                ("wsrep_local_cert_failures", "0"),
                ("wsrep_local_bf_aborts", "0"),
            ]),
            node(&[("wsrep_flow_control_sent", "0")]),
        ];
        let after = vec![
            node(&[
                ("wsrep_replicated", "60"),
                ("wsrep_replicated_bytes", "51000"),
                ("wsrep_causal_reads", "205"),
                ("wsrep_flow_control_paused_ns", "500000000"),
                ("wsrep_flow_control_sent", "0"),
                ("wsrep_local_cert_failures", "2"),
                ("wsrep_local_bf_aborts", "1"),
                ("wsrep_local_send_queue_avg", "0.25"),
            ]),
            node(&[
                ("wsrep_flow_control_sent", "5"),
                ("wsrep_local_cert_failures", "0"),
                ("wsrep_local_bf_aborts", "0"),
                ("wsrep_local_recv_queue_avg", "1.5"),
            ]),
            None,
        ];
        let g = figures(Some(&before), Some(&after), 2.0, 100).expect("figures");
        assert_eq!(g.writesets, Some(50));
        assert_eq!(g.writesets_per_order, Some(0.5));
        assert_eq!(g.bytes_per_order, Some(500.0));
        assert_eq!(g.sync_waits_per_order, Some(2.0));
        assert_eq!(g.flow_control_paused, Some(0.25));
        assert_eq!(g.flow_control_sent, Some(2));
        assert_eq!(g.conflicts, Some(2));
        assert_eq!(g.send_queue_avg, Some(0.25));
        assert_eq!(g.recv_queue_avg, Some(1.5));
        assert_eq!(figures(None, Some(&after), 2.0, 100), None);
        let unread = vec![None, before[1].clone(), before[2].clone()];
        assert_eq!(figures(Some(&unread), Some(&after), 2.0, 100), None);
        let none = figures(Some(&before), Some(&after), 2.0, 0).expect("figures");
        assert_eq!(none.writesets_per_order, None);
    }

    // Checks where a run goes without a private store: the server of --database-url, no
    // setting, nothing read apart; a run asked on a store that was not started is an
    // error; the cluster's nodes are appended after the run's own settings.
    #[test]
    fn placements_without_private_stores() {
        let stores = Stores::default();
        let given = stores.place(Database::Given).expect("given");
        assert_eq!(given.database_url, None);
        assert!(given.cpu.is_empty() && given.galera_urls.is_empty());
        assert!(stores.place(Database::Galera).is_err());
        assert!(stores.place(Database::OneNode).is_err());
        let placed = Placement {
            nodes_setting: Some("127.0.0.1:1,127.0.0.1:2".into()),
            ..Placement::default()
        };
        let own = vec![(DATABASE_NODES_ENV.to_owned(), "other:1".to_owned())];
        let env = placed.server_env(&own);
        assert_eq!(
            env.last().map(|(_, v)| v.as_str()),
            Some("127.0.0.1:1,127.0.0.1:2")
        );
        assert_eq!(env.len(), 2);
    }
}
