//! The ledger's and the outbox's port contracts (crates/contract) against `MysqlLedger`
//! on a Galera cluster: three private nodes (the testkit's `GaleraCluster`), started
//! once for this test binary and shared by its tests, each test on a database of its own
//! and writing through the cluster's nodes as `FLASHSALE_DATABASE_NODES` names them.
//! The same bodies run on one MariaDB in `real.rs` and on the simulator in `sim.rs`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test's failed expectation is its failure, with the expectation's message"
)]

use std::sync::OnceLock;
use std::time::Duration;

use flashsale_mysql::{ClusterConfig, NodeAddr};
use flashsale_testkit::GaleraCluster;

/// The cluster every test of this binary shares: started by the first test that needs
/// it, on a thread of its own (a test's runtime ends with the test), and reaped when the
/// binary exits.
fn cluster() -> &'static GaleraCluster {
    static CLUSTER: OnceLock<GaleraCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        std::thread::spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let cluster = runtime
                .block_on(GaleraCluster::start())
                .expect("galera cluster");
            cluster.reap_on_exit().expect("reaper");
            cluster
        })
        .join()
        .expect("cluster thread")
    })
}

mod common;

/// The shared cluster: databases made through node 0, written through the first
/// healthy node of the three.
pub struct Galera;

impl common::Server for Galera {
    fn locate() -> (String, Option<ClusterConfig>) {
        let cluster = cluster();
        let nodes = NodeAddr::parse_list(&cluster.nodes_setting()).expect("nodes");
        let config = ClusterConfig {
            nodes,
            failback_after: Duration::from_secs(10),
        };
        (cluster.url(0), Some(config))
    }
}

pub type GaleraLedger = common::OwnLedger<Galera>;

flashsale_contract::contracts!(ledger: GaleraLedger);
