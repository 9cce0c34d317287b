//! The ledger's schema and bookkeeping on a Galera cluster of three private nodes (the
//! testkit's `GaleraCluster`, run with `wsrep_mode=REQUIRED_PRIMARY_KEY,
//! STRICT_REPLICATION`): migrations started at once by two instances writing through
//! two different nodes, the tables Galera's rules accept, and the audit verdicts kept
//! when a node hands out ids with gaps.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test's failed expectation is its failure, with the expectation's message"
)]

use std::time::Duration;

use flashsale_app::ports::{AuditVerdict, LedgerMaintenance, AUDIT_RUNS_KEPT};
use flashsale_mysql::{ClusterConfig, LedgerConfig, MysqlLedger, NodeAddr};
use flashsale_testkit::{GaleraCluster, TestDb};
use sqlx::MySqlPool;

/// A ledger on `db`, writing through the cluster's nodes in `order`.
async fn ledger_on(cluster: &GaleraCluster, db: &TestDb, order: &[usize]) -> MysqlLedger {
    ledger_at(cluster, db.url(), order).await.expect("ledger")
}

/// A ledger on the database at `url`, writing through the cluster's nodes in `order`.
async fn ledger_at(
    cluster: &GaleraCluster,
    url: String,
    order: &[usize],
) -> Result<MysqlLedger, flashsale_app::LedgerError> {
    let nodes = order
        .iter()
        .map(|&i| NodeAddr::parse(&cluster.addr(i).to_string()).expect("node"))
        .collect();
    MysqlLedger::connect(&LedgerConfig {
        url,
        max_connections: 4,
        acquire_timeout: Duration::from_secs(10),
        transaction_timeout: Duration::from_secs(20),
        cluster: Some(ClusterConfig {
            nodes,
            failback_after: Duration::from_secs(10),
        }),
    })
    .await
}

// Checks that two instances starting at once, one writing through node 0 and the other
// through node 1, apply every migration exactly once: GET_LOCK is no lock on Galera
// (it answers NULL), so the ledger's own lock row serializes them across nodes. How:
// both migrate concurrently, both succeed, `_sqlx_migrations` holds each version once,
// applied; the lock row is gone; and on node 2 every table of the schema is InnoDB with
// a primary key, as the cluster's REQUIRED_PRIMARY_KEY and STRICT_REPLICATION demand
// (the DDL would have been refused otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_migrating_through_two_nodes_apply_each_migration_once() {
    let cluster = GaleraCluster::start().await.expect("galera cluster");
    let db = TestDb::create(&cluster.url(0)).await.expect("database");
    let a = ledger_on(&cluster, &db, &[0, 1, 2]).await;
    let b = ledger_on(&cluster, &db, &[1, 0, 2]).await;
    let (ma, mb) = tokio::join!(a.migrate(), b.migrate());
    ma.expect("instance A migrated");
    mb.expect("instance B migrated");

    let on_node2 = MySqlPool::connect(&format!("{}/{}", cluster.url(2), db.name()))
        .await
        .expect("node 2");
    sqlx::query("SET SESSION wsrep_sync_wait = 1")
        .execute(&on_node2)
        .await
        .expect("causal reads");
    let (versions, applied, distinct): (i64, i64, i64) = sqlx::query_as(
        "SELECT COUNT(*), CAST(SUM(success) AS SIGNED), COUNT(DISTINCT version) \
         FROM _sqlx_migrations",
    )
    .fetch_one(&on_node2)
    .await
    .expect("migrations");
    let expected =
        i64::try_from(std::fs::read_dir("migrations").expect("dir").count()).expect("count");
    assert_eq!(
        (versions, applied, distinct),
        (expected, expected, expected)
    );
    let locks: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM flashsale_migration_lock")
        .fetch_one(&on_node2)
        .await
        .expect("lock rows");
    assert_eq!(locks, 0, "the migration lock was released");
    let unfit: Vec<String> = sqlx::query_scalar(
        "SELECT t.TABLE_NAME FROM information_schema.TABLES t \
         WHERE t.TABLE_SCHEMA = DATABASE() AND t.TABLE_TYPE = 'BASE TABLE' \
         AND (t.ENGINE <> 'InnoDB' OR NOT EXISTS (SELECT 1 FROM information_schema.TABLE_CONSTRAINTS c \
           WHERE c.TABLE_SCHEMA = t.TABLE_SCHEMA AND c.TABLE_NAME = t.TABLE_NAME \
           AND c.CONSTRAINT_TYPE = 'PRIMARY KEY'))",
    )
    .fetch_all(&on_node2)
    .await
    .expect("tables");
    assert!(
        unfit.is_empty(),
        "tables Galera cannot replicate safely: {unfit:?}"
    );
    on_node2.close().await;
}

// Checks that the ledger keeps exactly the newest AUDIT_RUNS_KEPT audit verdicts when
// ids are not dense: a Galera node steps auto-increment ids by the cluster's size (the
// ids recorded here are 3 apart, checked), so "below the newest id minus the count"
// would keep a third of them. How: record that many and five more through the cluster,
// count the rows, and read the last one back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_newest_audits_are_kept_on_stepped_ids() {
    let cluster = GaleraCluster::start().await.expect("galera cluster");
    let db = TestDb::create(&cluster.url(0)).await.expect("database");
    let ledger = ledger_on(&cluster, &db, &[0, 1, 2]).await;
    ledger.migrate().await.expect("migrate");
    let more = AUDIT_RUNS_KEPT + 5;
    for n in 0..more {
        let verdict = AuditVerdict {
            product: None,
            products: n,
            violations: 0,
            pending: 0,
        };
        ledger.record_audit(&verdict).await.expect("record");
    }
    let pool = ledger.pool();
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM audit_run ORDER BY id")
        .fetch_all(&pool)
        .await
        .expect("ids");
    assert_eq!(ids.len(), AUDIT_RUNS_KEPT, "{ids:?}");
    assert!(
        ids.windows(2).all(|w| w[1] - w[0] == 3),
        "stepped ids: {ids:?}"
    );
    let last = ledger.last_audit().await.expect("read").expect("an audit");
    assert_eq!(last.verdict.products, more - 1);
}

// Checks that a ledger starts while the node its URL names is down: with a nodes
// setting the URL gives only the user, password and database, so the database is made,
// migrated and written through the first healthy node. How: kill node 0, connect with
// the URL on node 0 and the nodes 0, 1, 2 to a database that does not exist yet, migrate,
// record a verdict, and find the database, the schema and the row on node 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_starts_while_its_urls_node_is_down() {
    let cluster = GaleraCluster::start().await.expect("galera cluster");
    let db = TestDb::create(&cluster.url(0)).await.expect("database");
    // A database that does not exist yet, named like the test's own.
    let name = format!("{}_new", db.name());
    cluster.kill9(0).expect("kill -9 node 0");
    cluster
        .wait_cluster_size(1, 2, Duration::from_secs(60))
        .await
        .expect("the others leave node 0 out");
    let ledger = ledger_at(&cluster, format!("{}/{name}", cluster.url(0)), &[0, 1, 2])
        .await
        .expect("connected through the first healthy node");
    ledger.migrate().await.expect("migrated");
    let verdict = AuditVerdict {
        product: None,
        products: 7,
        violations: 0,
        pending: 0,
    };
    ledger.record_audit(&verdict).await.expect("written");
    assert_eq!(ledger.writer(), Some(cluster.addr(1).to_string()));
    let on_node1 = MySqlPool::connect(&format!("{}/{name}", cluster.url(1)))
        .await
        .expect("the database exists on node 1");
    let products: i64 = sqlx::query_scalar("SELECT products FROM audit_run")
        .fetch_one(&on_node1)
        .await
        .expect("the verdict");
    assert_eq!(products, 7);
    on_node1.close().await;
}
