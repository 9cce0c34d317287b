//! `flashsale-bench sustained --quick --spawn --galera` end to end: a debug-built
//! flashsale whose ledger is on a private 3-node Galera cluster the bench starts and
//! removes itself, on the shared Redis and NATS.

mod common;

use flashsale_bench::nodes::NODE_NAMES;
use flashsale_bench::report::BenchResult;

/// A small sustained load: the cluster's start (about 2 s with the template), the debug
/// server's migrations through three nodes, the load, the quiet wait and the audit stay
/// well under a minute.
const ATTEMPTS: &str = "400";
const USERS: &str = "300";
const STOCK: &str = "1000";

// Checks a run on a Galera cluster end to end: the bench starts the cluster, spawns the
// server on it (FLASHSALE_DATABASE_NODES and a database on node 0), and exits 0 with a
// JSON result that passed — every acknowledged order in the orders table, the server's
// own answer counts equal to the generator's, the audit (against the cluster) passed —,
// says the ledger was on the cluster, counts the writesets node 0 replicated (at least
// one per group commit, so some for 400 purchases) and reads each node's CPU time apart
// from the other MariaDB processes; the summary prints the cluster's line.
#[test]
fn quick_sustained_on_a_galera_cluster() {
    let json = common::scratch_path("galera.json");
    let stdout = common::quick_sustained(&["--galera"], (ATTEMPTS, USERS, STOCK), &json);
    assert!(stdout.contains("RESULT: PASS"), "{stdout}");
    assert!(stdout.contains("galera: "), "{stdout}");
    let text = std::fs::read_to_string(&json).expect("JSON result written");
    let _ = std::fs::remove_file(&json);
    let r: BenchResult = serde_json::from_str(&text).expect("JSON result parses");
    assert!(r.passed);
    assert_eq!(r.config.database.as_deref(), Some("galera"));
    assert_eq!(r.checks.audit.status, "passed", "{}", r.checks.audit.output);
    assert!(r.orders.created > 0, "{stdout}");
    common::assert_client_passed(&r, |l| {
        l.contains("acknowledged orders present under their request_id")
    });
    let galera = r.galera.as_ref().expect("the cluster's figures");
    assert!(galera.writesets.unwrap_or(0) > 0, "{galera:?}");
    assert!(
        galera.writesets_per_order.unwrap_or(0.0) > 0.0,
        "{galera:?}"
    );
    for node in NODE_NAMES {
        assert!(r.cpu.seconds.contains_key(node), "{node}: {:?}", r.cpu);
    }
}
