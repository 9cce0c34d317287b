//! The sale on a real Redis Cluster: three primaries and three replicas on loopback
//! (`flashsale_testkit::RedisCluster`), the service configured with
//! `FLASHSALE_REDIS_CLUSTER_NODES`, its workers running. Each test sells products whose
//! keys live on different primaries, breaks or reshapes the cluster mid-sale as an
//! operator or a crash would, and ends with the invariant checks and the audit.

use std::time::{Duration, Instant};

use flashsale::workers::Workers;
use flashsale_testkit::RedisCluster;
use reqwest::StatusCode;

use crate::fallback::{acknowledged, assert_sold_exactly, buyers, metric, start_workers, Answer};
use crate::helpers::{cleanup_all, redis_conn, redis_info, wait_until, TestApp, SOLD_OUT};
use crate::invariants;

/// Units of each product on sale.
const STOCK: i64 = 60;
/// Buyers per product: three times the stock, so every unit sells and some are refused.
const BUYERS: i64 = 180;
/// Buyers per product when the sale must outlast a fault: arriving over 8 s, the stock
/// lasts about 5 s, so the fault at 2 s falls mid-sale.
const SLOW_BUYERS: i64 = 90;
/// Longest a product may take to sell out once the cluster has settled again: the
/// buyers' retries (0.1 s apart), the gate watch's period, a rebuild, with slack for a
/// loaded CI machine.
const SETTLE_BOUND: Duration = Duration::from_secs(30);

/// Most 503s one buyer may meet while its product's slot moves: 10 s of retries 0.1 s
/// apart, far more than the move itself and the gate watch's next adoption take.
const MIGRATION_RETRIES_MAX: u32 = 100;

/// Settings of the service in these tests. The fallback to ledger mode is off: these
/// tests are about the gate on a cluster, and a failover (about 4 s here) would
/// otherwise also switch the dead primary's products to ledger mode.
fn settings() -> Vec<(&'static str, &'static str)> {
    vec![
        ("FALLBACK_AFTER", "off"),
        // A hold a retry is finishing must not be taken for abandoned.
        ("RECOVERY_AFTER", "15s"),
    ]
}

/// A product whose keys live on each of the cluster's primaries (the port it was
/// chosen for, and its id), each created with [`STOCK`] units.
async fn products_on_every_primary(cluster: &RedisCluster, app: &TestApp) -> Vec<(u16, i64)> {
    let mut products = Vec::new();
    for port in cluster.primaries().await.expect("primaries") {
        let id = i64::try_from(cluster.product_on(port).await.expect("product")).expect("id");
        app.create_product(id, STOCK, None).await;
        products.push((port, id));
    }
    assert_eq!(products.len(), 3, "three primaries");
    products
}

/// A fresh cluster, a service on it (with [`settings`]) whose workers run, and
/// [`products_on_every_primary`].
async fn sale_on_a_cluster() -> (RedisCluster, TestApp, Workers, Vec<(u16, i64)>) {
    let cluster = RedisCluster::start().await.expect("cluster");
    let app = TestApp::spawn_on_cluster(&cluster.seed_nodes(), &settings()).await;
    let workers = start_workers(&app);
    let products = products_on_every_primary(&cluster, &app).await;
    (cluster, app, workers, products)
}

/// The product's stock generation in the ledger.
async fn generation(app: &TestApp, product: i64) -> i64 {
    app.count(&format!(
        "SELECT generation FROM product_inventory WHERE product_id = {product}"
    ))
    .await
}

/// Every answer of a product's buyers is an order or `sold_out`; exactly the stock sold,
/// every acknowledged order is in the ledger; the invariants and the audit hold.
async fn assert_sale_exact(app: &TestApp, product: i64, answers: &[Answer]) {
    let orders = acknowledged(answers);
    assert_sold_exactly(app, product, STOCK, &orders).await;
    invariants::assert_sound(app, product).await;
}

// Checks a sale over products spread across all three primaries: each sells exactly its
// stock, with the invariants and the audit clean. Midway, every node's script cache is
// flushed (as after a node's restart): the gate answers NOSCRIPT by loading its scripts
// again, so the buyers never see it.
#[tokio::test]
async fn a_sale_over_three_primaries_sells_exactly_the_stock() {
    let (cluster, app, workers, products) = sale_on_a_cluster().await;

    let half = |(_, product): (u16, i64)| {
        let app = &app;
        async move { buyers(&[app], product, 0, BUYERS / 2, Duration::ZERO).await }
    };
    let first: Vec<Vec<Answer>> =
        futures::future::join_all(products.iter().copied().map(half)).await;
    for url in cluster.urls() {
        let mut node = redis_conn(&url).await;
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut node)
            .await
            .expect("SCRIPT FLUSH");
    }
    let rest = |(_, product): (u16, i64)| {
        let app = &app;
        async move { buyers(&[app], product, BUYERS / 2, BUYERS, Duration::ZERO).await }
    };
    let second: Vec<Vec<Answer>> =
        futures::future::join_all(products.iter().copied().map(rest)).await;

    for (((port, product), mut answers), more) in products.iter().zip(first).zip(second) {
        answers.extend(more);
        let retried: u32 = answers.iter().map(|a| a.retries).sum();
        println!("product {product} on :{port}: {retried} 503s retried");
        assert_sale_exact(&app, *product, &answers).await;
        assert_eq!(generation(&app, *product).await, 1, "no rebuild");
    }
    workers.stop().await;
    app.cleanup().await;
}

// Checks a primary killed with SIGKILL mid-sale while its replica takes over: the
// promoted replica serves the entry under another stamp, so the gate watch rebuilds the
// product from the ledger in a new generation (holds the dead primary granted and the
// replica may have missed are fenced), and the sale resumes. Buyers retry every 503
// with the same request_id. Every product sells exactly its stock, no acknowledged
// order is lost, and the invariants and the audit hold. Prints the time from the kill to
// the first order of the dead primary's product, the 503s its buyers retried through,
// and the generations.
#[tokio::test]
async fn a_primary_killed_mid_sale_loses_no_order_and_oversells_nothing() {
    let (mut cluster, app, workers, products) = sale_on_a_cluster().await;
    let (victim_port, victim) = products[0];

    let sale = futures::future::join_all(products.iter().map(|&(_, product)| {
        let app = &app;
        async move { buyers(&[app], product, 0, SLOW_BUYERS, Duration::from_secs(8)).await }
    }));
    let killer = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let killed = Instant::now();
        cluster.kill(victim_port).expect("kill -9");
        killed
    };
    let (results, killed) = tokio::join!(sale, killer);
    let slot = RedisCluster::slot_of(&app.key(victim, "inv"));
    let promoted = cluster
        .wait_failover(slot, victim_port)
        .await
        .expect("a replica took over");
    wait_until("the product rebuilt", SETTLE_BOUND, || async {
        generation(&app, victim).await > 1
    })
    .await;

    for ((port, product), answers) in products.iter().zip(&results) {
        let retried: u32 = answers.iter().map(|a| a.retries).sum();
        let first_after = answers
            .iter()
            .filter(|a| a.status == StatusCode::CREATED && a.at > killed)
            .map(|a| a.at.duration_since(killed))
            .min();
        let statuses: std::collections::BTreeMap<u16, usize> =
            answers.iter().fold(Default::default(), |mut m, a| {
                *m.entry(a.status.as_u16()).or_default() += 1;
                m
            });
        println!(
            "product {product} on :{port}: final answers {statuses:?}, {retried} 503s retried, \
             first order after the kill {first_after:?}, generation {}",
            generation(&app, *product).await
        );
        assert_sale_exact(&app, *product, answers).await;
    }
    let by_generation: Vec<(i64, i64)> = app
        .rows(
            "SELECT generation, COUNT(*) FROM inventory_reservation WHERE product_id = ? \
             GROUP BY generation ORDER BY generation",
            victim,
        )
        .await;
    println!(
        "primary :{victim_port} killed, :{promoted} promoted; rebuilds {}; the victim's \
         reservations by generation {by_generation:?}",
        metric(&app, "flashsale_gate_rebuilds_total").await
    );
    workers.stop().await;
    app.cleanup().await;
}

// Checks a live slot migration (resharding) mid-sale: the slot of a product on sale
// moves to another primary, key batch by key batch, while its buyers keep buying. The
// entry lands under another stamp, and the gate watch adopts it (its writer is still a
// healthy primary with that stamp) instead of rebuilding it: the generation stays 1, no
// rebuild is counted, and the entry carries the new primary's stamp. Purchases that hit
// the slot mid-move (TRYAGAIN, then "not rebuilt" until the adoption) answer 503 and
// are retried; their count is printed. The sale ends exact, the invariants and the
// audit hold.
#[tokio::test]
async fn a_slot_migrated_mid_sale_is_adopted_not_rebuilt() {
    let (cluster, app, workers, products) = sale_on_a_cluster().await;
    let (from_port, moved) = products[0];
    let (to_port, _) = products[1];
    let slot = RedisCluster::slot_of(&app.key(moved, "inv"));

    let apps = [&app];
    let sale = buyers(&apps, moved, 0, SLOW_BUYERS, Duration::from_secs(8));
    let migration = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let started = Instant::now();
        let keys = cluster
            .migrate_slot(slot, to_port, 5, Duration::from_millis(50))
            .await
            .expect("slot migrated");
        (keys, started.elapsed())
    };
    let (answers, (keys, took)) = tokio::join!(sale, migration);
    assert_eq!(cluster.primary_of(slot).await.expect("owner"), to_port);

    let retried: u32 = answers.iter().map(|a| a.retries).sum();
    println!(
        "slot {slot} of product {moved}: {keys} keys moved :{from_port} -> :{to_port} in \
         {took:?}; {retried} 503s retried"
    );
    assert_sale_exact(&app, moved, &answers).await;
    assert_eq!(generation(&app, moved).await, 1, "adopted, not rebuilt");
    assert_eq!(metric(&app, "flashsale_gate_rebuilds_total").await, 0.0);
    let stamp: String = app.entry_field(moved, "srv").await.expect("HGET srv");
    let mut owner = redis_conn(&format!("redis://127.0.0.1:{to_port}/")).await;
    let info = redis_info(&mut owner, &["server", "replication"]).await;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.trim_end().strip_prefix(name))
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(
        stamp,
        format!("{}:{}", field("run_id:"), field("master_replid:")),
        "the entry carries the new primary's stamp"
    );
    // Bounded: no buyer retried for more than MIGRATION_RETRIES_MAX 503s (0.1 s apart).
    let most = answers.iter().map(|a| a.retries).max().unwrap_or(0);
    assert!(
        most <= MIGRATION_RETRIES_MAX,
        "a buyer retried {most} times"
    );
    workers.stop().await;
    app.cleanup().await;
}

// Checks that a sold-out lease is revoked on a cluster: two instances subscribe to
// revocations on the first seed node, while the product's keys live on another primary.
// The product sells out and both instances hear the lease (a long one); a restock
// through the first publishes the revocation on the product's primary, which the
// cluster passes to every node; a buyer polling on each instance buys within
// REVOKED_WITHIN — without the revocation neither could before the lease's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_revocation_published_on_one_primary_reaches_every_instance() {
    use crate::sold_out::{buy_within, LONG_LEASE};
    let cluster = RedisCluster::start().await.expect("cluster");
    let seeds = cluster.seed_nodes();
    let settings = [("SOLD_OUT_LEASE", LONG_LEASE)];
    let a = TestApp::spawn_on_cluster(&seeds, &settings).await;
    let b = a.spawn_beside(&settings).await;
    let first_seed: u16 = seeds
        .split(',')
        .next()
        .and_then(|s| s.rsplit_once(':'))
        .and_then(|(_, p)| p.parse().ok())
        .expect("a seed port");
    let port = cluster
        .primaries()
        .await
        .expect("primaries")
        .into_iter()
        .find(|&p| p != first_seed)
        .expect("a primary other than the first seed");
    let product = i64::try_from(cluster.product_on(port).await.expect("product")).expect("id");
    a.create_product(product, 1, None).await;
    a.bought("REQ_cl_first", 1, product, 1).await;
    for (app, rid) in [(&a, "REQ_cl_refused_a"), (&b, "REQ_cl_refused_b")] {
        app.refused((rid, 2, product, 1), SOLD_OUT).await;
    }
    a.restocked(product, "RS_cluster", 2).await;
    let (on_a, on_b) = tokio::join!(buy_within(&a, product, 10), buy_within(&b, product, 20));
    println!("product on :{port}, subscribers on :{first_seed}; restock to first 201: {on_a:?}, {on_b:?}");
    assert!(on_a.is_some() && on_b.is_some(), "{on_a:?} {on_b:?}");
    invariants::assert_sound(&a, product).await;
    cleanup_all([a, b]).await;
}
