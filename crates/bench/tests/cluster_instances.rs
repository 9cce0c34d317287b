//! Three flashsale instances on one Redis Cluster, one killed mid-sale (issue 21).
//!
//! What it checks: that a sale served by three instances over a Redis Cluster sells
//! exactly its stock when one instance dies with `kill -9` in the middle of it — the
//! units the dead instance held without an order come back through the survivors'
//! recovery and are sold to other buyers; every order a buyer was told about (a 201)
//! exists; and `flashsale audit`, run against the cluster, finds nothing wrong.
//!
//! How: a private Redis Cluster (`flashsale_testkit::RedisCluster`, 3 primaries + 3
//! replicas on loopback); three debug-built `flashsale serve` processes
//! (`server::spawn`) on it (`FLASHSALE_REDIS_CLUSTER_NODES`), on one fresh database of
//! the shared MariaDB and one NATS stream, with a short recovery window
//! (`FLASHSALE_RECOVERY_AFTER`) and short worker intervals; one product per primary
//! (`RedisCluster::product_on`), each sold by a rush of its own driven through the bench
//! library (`flashsale_bench::drive`, open loop, so the load lasts the same whatever the
//! machine's speed) over the three base URLs. Once every rush has sold part of its
//! stock, the second instance is killed; the load goes on over the two others long
//! enough for recovery to give the dead instance's units back and for buyers to take
//! them. Then: each rush's own checks and audit (given the cluster), a bounded wait
//! until no unit is held without an order, the orders table (PENDING_PAYMENT + PAID =
//! the stock), and `flashsale audit` once more. The numbers (per target attempts / 201
//! / 503 / no answer, what recovery did, how long it took) are printed: run with
//! `--nocapture`.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{held, inventory, metrics, Recovery, RECOVERY_AFTER};
use flashsale_bench::probes::OrdersProbe;
use flashsale_bench::report::{BenchResult, Inventory};
use flashsale_bench::server::{self, Spawned, CLUSTER_NODES_ENV};
use flashsale_testkit::RedisCluster;

/// Servers of the sale: the three, so that two are left after the kill and the
/// load is still spread over more than one.
const INSTANCES: u32 = 3;
/// Units on sale per product: sold in a second or two at `RATE`, so the kill (at
/// `KILL_AT_ORDERS`) lands while every product still has stock.
const STOCK: i64 = 150;
/// Attempts per second per product (open loop). Three rushes at this rate keep a busy
/// 2-core machine (three debug servers, six redis-servers, MariaDB) answering in time.
const RATE: &str = "120";
/// Attempts per product: `ATTEMPTS / RATE` ≈ 12.5 s of load, of which ~11 s after the
/// kill — several recovery windows (`common::RECOVERY_AFTER` + `WORKER_INTERVAL`), so
/// the units recovery gives back find buyers before the load ends.
const ATTEMPTS: u64 = 1500;
/// Distinct buyers per product, one unit each (the rush's limit): many more than the
/// stock, so units given back late still find a buyer who has none.
const USERS: &str = "1000";
/// Orders every product must have before the kill: the rushes have all started, and the
/// kill is mid-sale (well below `STOCK`).
const KILL_AT_ORDERS: u64 = 25;
/// Longest wait for that: the servers are up, so orders flow within a second or two.
const KILL_WAIT_MAX: Duration = Duration::from_secs(30);
/// Longest wait, once the rushes are over, until no unit is held without an order: a
/// few recovery windows on a busy machine.
const RECOVERY_WAIT_MAX: Duration = Duration::from_secs(30);
/// WARN and ERROR lines of the servers' logs printed (the rest are counted).
const LOG_LINES_SHOWN: usize = 40;
/// Warn (not fail) past this: the machine may be shared with other test binaries.
const EXPECTED_MAX: Duration = Duration::from_secs(60);

/// What the run saw, checked once the servers are stopped and cleaned up.
struct Seen {
    /// Per product: its id, the primary its keys live on, the rush's result.
    rushes: Vec<(i64, u16, BenchResult)>,
    killed: String,
    /// Per product: answers and orders of its rush when the kill was sent.
    at_kill: Vec<(u64, u64)>,
    /// From the kill to the survivors' last release of an abandoned hold (None: none
    /// released — the dead instance held nothing without an order).
    last_release: Option<Duration>,
    /// From the kill until, the load over, no product had a unit held without an order.
    settled_after: Duration,
    /// Per product: the inventory and the units in live orders (PENDING_PAYMENT + PAID)
    /// once settled.
    settled: Vec<(Inventory, i64)>,
    /// Per surviving instance: what its recovery did since just before the kill.
    survivors: Vec<(String, Recovery)>,
    /// Per product: the last `flashsale audit` run (after recovery).
    audits: Vec<server::AuditRun>,
    /// Lines of the servers' logs at WARN or ERROR.
    log_problems: Vec<String>,
}

// Checks the scenario (see the module comment): three instances on a Redis
// Cluster, each running its workers; three rushes, one product per primary; the second
// instance killed with kill -9 mid-sale; then each rush's checks and audit passed, no
// unit held without an order within RECOVERY_WAIT_MAX, exactly the stock in live
// orders per product, and the audit clean against the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_a_cluster_sell_exactly_the_stock_when_one_dies() {
    let bin = common::server_bin();
    let started = Instant::now();
    let cluster = RedisCluster::start()
        .await
        .expect("the Redis Cluster starts");
    let seeds = cluster.seed_nodes();
    let node_url = cluster.urls().first().cloned().expect("six nodes");
    let products = common::product_per_primary(&cluster).await;
    eprintln!(
        "cluster {seeds} up in {:.1}s; products (id → primary): {products:?}",
        started.elapsed().as_secs_f64()
    );

    // The stores' addresses as the command line has them (defaults or FLASHSALE_*).
    let defaults = common::args(&["rush"]);
    let env = common::short_workers_env(&[(CLUSTER_NODES_ENV, seeds.as_str())]);
    // The Redis URL is not read by the servers (the cluster setting wins): one of the
    // cluster's nodes, so that nothing points at the shared Redis.
    let stores = (
        defaults.database_url.as_str(),
        node_url.as_str(),
        defaults.nats_url.as_str(),
    );
    let spawned = common::spawn_sale(&bin, stores, &env, INSTANCES, started).await;

    let seen = run(&bin, &spawned, &products).await;
    let log_problems = common::log_problems(&spawned);
    spawned.shutdown(false).await;
    drop(cluster);
    let took = started.elapsed();
    let mut seen = seen.expect("the run was carried out");
    seen.log_problems = log_problems;
    print_seen(&seen, took);
    if took > EXPECTED_MAX {
        eprintln!("note: the test took {took:?} (busy machine?)");
    }

    for (product, _, r) in &seen.rushes {
        let problems = common::rush_problems(*product, r, INSTANCES, &seen.killed, STOCK);
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }
    for (i, (at_answers, at_orders)) in seen.at_kill.iter().enumerate() {
        assert!(
            *at_orders < STOCK as u64,
            "product {}: the kill came after the sale ({at_orders} orders, {at_answers} answers)",
            seen.rushes[i].0
        );
    }
    for (i, (inv, live_units)) in seen.settled.iter().enumerate() {
        let product = seen.rushes[i].0;
        assert_eq!(held(inv), 0, "product {product}: {inv:?}");
        assert_eq!(inv.total, STOCK, "product {product}: {inv:?}");
        assert_eq!(
            *live_units, STOCK,
            "product {product}: PENDING_PAYMENT + PAID orders hold {live_units} units, not the stock {STOCK} ({inv:?})"
        );
        assert_eq!(inv.available, 0, "product {product}: {inv:?}");
    }
    for (i, a) in seen.audits.iter().enumerate() {
        assert!(
            a.passed,
            "product {}: flashsale audit after recovery:\n{}",
            seen.rushes[i].0, a.output
        );
    }
    for (url, recovery) in &seen.survivors {
        assert!(
            recovery.passes > 0.0,
            "{url}: no recovery pass after the kill"
        );
        assert_eq!(
            recovery.incidents, 0.0,
            "{url}: recovery raised incidents: {recovery:?}"
        );
    }
}

/// Everything between the servers' start and their stop: the workers' first passes, the
/// three rushes with the kill, the wait for recovery and the final reads.
async fn run(
    bin: &std::path::Path,
    spawned: &Spawned,
    products: &[(i64, u16)],
) -> Result<Seen, String> {
    let urls = spawned.base_urls();
    let http = common::client_once_working(&urls).await?;

    let attempts = ATTEMPTS.to_string();
    let stock = STOCK.to_string();
    let mut rushes = Vec::new();
    for &(product, _) in products {
        let product = product.to_string();
        if spawned.env.redis_cluster_nodes.is_none() {
            return Err("the spawn did not take the cluster setting".into());
        }
        rushes.push(common::start_rush(
            &common::against(spawned, bin),
            &[
                ("--product-id", product.as_str()),
                ("--attempts", attempts.as_str()),
                ("--users", USERS),
                ("--stock", stock.as_str()),
                ("--rate", RATE),
            ],
        ));
    }

    // The kill: once every rush has sold KILL_AT_ORDERS units.
    let victim = spawned.others.first().ok_or("no second instance to kill")?;
    let waited = Instant::now();
    while rushes
        .iter()
        .any(|r| r.live.orders.load(Ordering::Relaxed) < KILL_AT_ORDERS)
    {
        if waited.elapsed() > KILL_WAIT_MAX || rushes.iter().any(|r| r.handle.is_finished()) {
            let orders: Vec<u64> = rushes
                .iter()
                .map(|r| r.live.orders.load(Ordering::Relaxed))
                .collect();
            return Err(format!(
                "the rushes did not all reach {KILL_AT_ORDERS} orders (orders: {orders:?})"
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let survivors: Vec<String> = urls
        .iter()
        .filter(|u| **u != victim.base_url)
        .cloned()
        .collect();
    let mut before = Vec::new();
    for url in &survivors {
        before.push(metrics(&http, url).await?);
    }
    let at_kill: Vec<(u64, u64)> = rushes
        .iter()
        .map(|r| {
            (
                r.live.answers.load(Ordering::Relaxed),
                r.live.orders.load(Ordering::Relaxed),
            )
        })
        .collect();
    common::kill9(victim)?;
    let killed_at = Instant::now();
    eprintln!(
        "killed {} (pid {}) at {at_kill:?} (answers, orders) per product",
        victim.base_url, victim.pid
    );

    // Until the load is over and no product has a unit held without an order: when the
    // survivors' recovery last released a hold.
    let reads = &survivors[0];
    let released =
        |texts: &[String]| -> f64 { texts.iter().map(|t| Recovery::of(t).released()).sum() };
    let mut released_now = released(&before);
    let mut last_release = None;
    let mut settled_since: Option<Instant> = None;
    let settled_invs = loop {
        let mut texts = Vec::new();
        for url in &survivors {
            texts.push(metrics(&http, url).await?);
        }
        let now = released(&texts);
        if now != released_now {
            released_now = now;
            last_release = Some(killed_at.elapsed());
        }
        if rushes.iter().all(|r| r.handle.is_finished()) {
            let since = *settled_since.get_or_insert_with(Instant::now);
            let mut invs = Vec::new();
            for &(product, _) in products {
                invs.push(inventory(&http, reads, product).await?);
            }
            if invs.iter().all(|i| held(i) == 0) {
                break invs;
            }
            if since.elapsed() > RECOVERY_WAIT_MAX {
                return Err(format!(
                    "units still held without an order {RECOVERY_WAIT_MAX:?} after the load: {invs:?}"
                ));
            }
        }
        tokio::time::sleep(common::POLL).await;
    };
    let settled_after = killed_at.elapsed();
    let mut results = Vec::new();
    for (i, common::Rush { handle, .. }) in rushes.into_iter().enumerate() {
        let r = handle
            .await
            .map_err(|e| format!("rush {i} panicked: {e}"))??;
        results.push((products[i].0, products[i].1, r));
    }

    let mut orders = OrdersProbe::connect(&spawned.env.database_url).await?;
    let mut settled = Vec::new();
    for (i, &(product, _)) in products.iter().enumerate() {
        let facts = orders.facts(product).await?;
        settled.push((settled_invs[i].clone(), facts.live_units));
    }
    orders.close().await;
    let mut audits = Vec::new();
    for &(product, _) in products {
        audits.push(server::audit(bin, &spawned.env, product).await?);
    }
    let mut after = Vec::new();
    for (url, before) in survivors.iter().zip(&before) {
        let now = metrics(&http, url).await?;
        after.push((url.clone(), Recovery::of(&now).since(&Recovery::of(before))));
    }
    Ok(Seen {
        rushes: results,
        killed: victim.base_url.clone(),
        at_kill,
        last_release,
        settled_after,
        settled,
        survivors: after,
        audits,
        log_problems: Vec::new(),
    })
}

fn print_seen(seen: &Seen, took: Duration) {
    println!(
        "\n=== three instances on a Redis Cluster, {} killed mid-sale ===",
        seen.killed
    );
    for (i, (product, port, r)) in seen.rushes.iter().enumerate() {
        let (answers, orders) = seen.at_kill[i];
        println!(
            "product {product} (primary :{port}): {} attempts in {:.1}s, {} orders acknowledged; killed at {answers} answers / {orders} orders",
            r.attempts.sent, r.elapsed_s, r.orders.acknowledged,
        );
        common::print_targets(r);
        let (inv, live) = &seen.settled[i];
        println!(
            "  settled: {inv:?}; units in PENDING_PAYMENT + PAID orders: {live}; audit: the bench's {} ({} run{}), after recovery {}",
            r.checks.audit.status,
            r.checks.audit.runs,
            if r.checks.audit.runs == 1 { "" } else { "s" },
            if seen.audits[i].passed { "passed" } else { "FAILED" },
        );
    }
    for (url, r) in &seen.survivors {
        println!(
            "survivor {url}, since the kill: {} recovery passes, actions {:?}, incidents {}",
            r.passes, r.actions, r.incidents
        );
    }
    println!(
        "recovery: last abandoned hold released {} after the kill (RECOVERY_AFTER {RECOVERY_AFTER}); nothing held without an order {:.1}s after it (load over); test took {:.1}s",
        seen.last_release
            .map_or("- (none)".to_owned(), |d| format!("{:.1}s", d.as_secs_f64())),
        seen.settled_after.as_secs_f64(),
        took.as_secs_f64()
    );
    common::print_log_problems(&seen.log_problems, LOG_LINES_SHOWN);
}
