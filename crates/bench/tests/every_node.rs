//! Kill one node of everything, in turn, in one sale (issue 40).
//!
//! What it checks: that one sale, served by three flashsale instances over a Redis
//! Cluster, a Galera cluster and a JetStream cluster, survives a `kill -9` of one node of
//! each, one after the other: a Redis primary (the one holding the first product's slot),
//! the Galera node every instance writes through (node 0, the first listed), the NATS
//! server leading the events' stream, and one flashsale instance. Afterwards every product
//! has sold exactly its stock (the units of its PENDING_PAYMENT and PAID orders are the
//! stock, none held without an order once recovery has run); every order a buyer was told
//! about (201 or 200) is on both surviving Galera nodes; every event in the outbox was
//! applied exactly once by the consumer (`consumed_event` holds exactly the outbox's event
//! ids, and `sales_stats` agrees with the ledger); and `flashsale audit` finds nothing
//! wrong, through the cluster and on each surviving node alone. It prints the timeline:
//! each kill (time since the sale's first attempt), the first 201 of a purchase sent after
//! it, and the 503s and unanswered attempts around it.
//!
//! How: private clusters of each store (`flashsale_testkit::RedisCluster`, 3 primaries + 3
//! replicas; `GaleraCluster`, 3 nodes; `NatsCluster`, 3 servers), started together; three
//! debug-built `flashsale serve` processes (`server::spawn`) on them
//! (`FLASHSALE_REDIS_CLUSTER_NODES`, `FLASHSALE_DATABASE_NODES`, all three NATS servers in
//! `FLASHSALE_NATS_URL` with `FLASHSALE_NATS_STREAM_REPLICAS=3`) with a short recovery
//! window and short worker intervals; one product per Redis primary, each sold by an
//! open-loop rush of its own driven through the bench library (`flashsale_bench::drive`)
//! over the three base URLs, its checks reading the ledger on Galera node 1, which is
//! never killed. Beside the rushes, one probe buyer per product sends one purchase at a
//! time (a new request_id each, round the instances) and records when each was sent and
//! how it was answered: the first 201 of a purchase sent after a kill says when the sale
//! was whole again. Each kill waits for the sale to be whole again after the one before
//! (every product's probe answered 201 after it, and for the NATS kill another leader
//! elected), then `SETTLE`. The instance is killed with a burst of purchases in flight to
//! it, so that it dies holding units no order accounts for. After the last kill the load
//! goes on until every product has sold its stock (the dead instance's holds given back
//! by the survivors' recovery and bought by others), then stops. Then: each rush's checks
//! and audit; the events drained; the survivors stopped; on each surviving Galera node,
//! read directly with `wsrep_sync_wait=1` once both have committed the same writesets,
//! the orders (the same on both; the probes' acknowledged ones present; the stock in live
//! orders), the events and the tables' checksums; `flashsale audit` per product through
//! the cluster (with the servers' settings, their URL on the dead node 0) and on each
//! surviving node alone. Run with `--nocapture` for the timeline.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{held, inventory, metrics, Recovery, Rush};
use flashsale_bench::probes::split_database_url;
use flashsale_bench::report::{BenchResult, Inventory};
use flashsale_bench::server::{
    self, AuditRun, ServerEnv, Spawned, CLUSTER_NODES_ENV, DATABASE_NODES_ENV,
};
use flashsale_testkit::{GaleraCluster, NatsCluster, RedisCluster};
use sqlx::{Connection, MySqlConnection};

/// Servers of the sale: three, so that two are left after the kill and the load is still
/// spread over more than one.
const INSTANCES: u32 = 3;
/// The Galera node every instance writes through until it is killed: the first listed.
const WRITER: usize = 0;
/// The Galera node the rushes' checks read, and the ledger's next writer: never killed.
const READER: usize = 1;
/// Units on sale per product. Every product must still have stock at the fourth kill,
/// which comes after the three recoveries before it: 13.9–18.2 s into the sale in three
/// runs here (the Redis failover 4.2–4.8 s, the Galera one 2.3–3.6 s, the NATS election
/// 4.4–5.9 s, `SETTLE` after each), the products whose primary lived then at 560–710
/// units sold (~43 a second, the rush and the probe, but for the Galera failover); an
/// election of 9 s and slower failovers on a busy machine bring the kill ~6 s later, ~260
/// units more. The product whose primary is killed sells ~5 s less and must still sell
/// out well before `LOAD_MAX`.
const STOCK: i64 = 1100;
/// Attempts per second per product (open loop): three rushes at this rate, with the
/// probes, keep a busy 2-core machine (three debug servers, six redis-servers, three
/// mariadbd, three nats-servers) answering in time.
const RATE: u64 = 40;
/// Longest load: the rushes are stopped as soon as every product has sold its stock after
/// the last kill (~31 s into the sale here); this bound only ends a sale that never sells
/// out.
const LOAD_MAX: Duration = Duration::from_secs(50);
/// Distinct buyers per product, one unit each (the rush's limit): more than the attempts
/// `LOAD_MAX` allows, so every attempt is a buyer without a unit yet.
const USERS: u64 = 2500;
/// Orders every rush must have before the first kill: the rushes have all started, and
/// the kill is mid-sale (far below `STOCK`).
const KILL_AT_ORDERS: u64 = 40;
/// Longest wait for that: the servers are up, so orders flow within a second or two.
const START_WAIT_MAX: Duration = Duration::from_secs(30);
/// How long the sale runs whole between one recovery and the next kill, so that each
/// kill meets a sale that has been selling on every product again, not the tail of the
/// last fault.
const SETTLE: Duration = Duration::from_millis(500);
/// Longest wait, after a kill, for the sale to be whole again: the Redis failover took
/// 4.2–4.9 s in `cluster.rs`, the Galera one ~2.2 s in `galera.rs`, a JetStream election
/// 4–9 s; the rest is room for a busy machine.
const RECOVERED_MAX: Duration = Duration::from_secs(30);
/// Longest wait, after the last kill, for every product to sell its stock: whatever was
/// left at the kill (~540 units in 17.5 s here, the buyers' attempts sent to the dead
/// instance a third of the load), the recovery window (`RECOVERY_AFTER`, 2 s) and a pass
/// for the dead instance's holds to come back, then buyers for them.
const SOLD_OUT_MAX: Duration = Duration::from_secs(40);
/// Pause between two purchases of a probe buyer: ~8 a second per product, fine enough
/// for a timeline in tenths of a second, few next to the rushes.
const PROBE_PAUSE: Duration = Duration::from_millis(100);
/// Bound on one probe purchase: above the servers' request deadline (1.5 s), so every
/// answer a server gives is seen.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// The probes' users: far above the rushes' (1..=`USERS`), one per purchase.
const PROBE_USERS_FROM: i64 = 1_000_000;
/// Purchases sent to the instance about to be killed, a third per product (each with a
/// request_id and a user of its own, from `BURST_USERS_FROM`), in waves of `BURST_WAVE`
/// `BURST_WAVE_GAP` apart: it is killed as the first of them is answered, so it dies with
/// later ones in flight, holding units that no order accounts for yet (at ~40 purchases
/// a second over three instances it would hold none most of the time), which the
/// survivors' recovery must give back. In waves, because the server answers the
/// purchases that arrive together together: one wave alone is often all answered at the
/// moment of its first answer.
const BURST: usize = 30;
const BURST_WAVE: usize = 10;
const BURST_WAVE_GAP: Duration = Duration::from_millis(10);
const BURST_USERS_FROM: i64 = 2_000_000;
/// Longest wait for the burst's first answer: the kill is made then anyway.
const BURST_WAIT: Duration = Duration::from_millis(500);
/// How often the rushes' live counters are sampled for the timeline.
const SAMPLE_EVERY: Duration = Duration::from_millis(20);
/// The window before a kill whose 503s and unanswered attempts are printed beside the
/// ones after it, for comparison.
const BEFORE_KILL: Duration = Duration::from_secs(1);
/// Longest wait for every event to be applied once the load is over. The dead instance
/// may have held the outbox's lease or fetched messages it never acknowledged: they come
/// back after `CLAIM_LEASE` and `CONSUMER_ACK_WAIT` (30 s each, from before its kill,
/// which comes 10–20 s before the load ends); the rest is room for a busy machine.
const DRAIN_MAX: Duration = Duration::from_secs(45);
/// Longest wait, the servers stopped, for the surviving Galera nodes to have committed
/// the same writesets (they apply each other's within milliseconds).
const NODES_EQUAL_MAX: Duration = Duration::from_secs(30);
/// The ledger's tables compared between the surviving nodes (`CHECKSUM TABLE`).
const TABLES: &str = "orders, inventory_reservation, product_inventory, inventory_log, \
                      outbox, consumed_event, sales_stats";
/// ERROR lines of the servers' logs printed whole (every WARN and ERROR line is counted
/// by its source).
const ERROR_LINES_SHOWN: usize = 20;
/// Warn (not fail) past this: the machine may be shared with other test binaries.
const EXPECTED_MAX: Duration = Duration::from_secs(60);

/// What the timeline says of each kill.
#[derive(Debug, Clone)]
struct Kill {
    /// What was killed, e.g. "Redis primary :20001 (product 5's slot)".
    what: String,
    at: Instant,
    /// Per product: units in its orders (reserved + sold, the ledger's) just before the
    /// kill, as the API answered; None if it did not.
    in_orders: Vec<Option<i64>>,
    /// What the stores did about it, e.g. the replica promoted, the leader elected.
    outcome: String,
}

/// One purchase of a probe buyer, or of the burst sent to the instance before its kill.
#[derive(Debug, Clone)]
struct Shot {
    /// Index of the product (in `products`).
    product: usize,
    /// One of the burst sent to the instance just before its kill, not a probe's.
    burst: bool,
    request_id: String,
    sent: Instant,
    answered: Instant,
    /// The HTTP status; 0 when no answer came.
    status: u16,
    /// The order of a 201 or 200.
    order: Option<i64>,
}

/// The rushes' live counters at one moment, per rush: [orders, 5xx answers, attempts
/// without an answer].
#[derive(Debug, Clone)]
struct Sample {
    at: Instant,
    counts: Vec<[u64; 3]>,
}

/// What one surviving Galera node holds, read directly with `wsrep_sync_wait=1`.
#[derive(Debug, Clone, Default, PartialEq)]
struct NodeFacts {
    /// request_id → (order id, product, status, quantity).
    orders: BTreeMap<String, (i64, i64, String, i64)>,
    /// Outbox rows not yet acknowledged by the broker.
    unsent: i64,
    /// The outbox's event ids (packs unpacked: `outbox_event`), and how many rows.
    outbox: BTreeSet<String>,
    outbox_events: usize,
    /// The event ids the consumer applied (`consumed_event`).
    consumed: BTreeSet<String>,
    /// Per product: (`sales_stats`' figures, the ledger's), as text; None: no row.
    stats: Vec<Option<(String, String)>>,
    /// `CHECKSUM TABLE` of `TABLES`.
    checksums: Vec<(String, Option<i64>)>,
}

impl NodeFacts {
    /// Units in the product's live orders (PENDING_PAYMENT and PAID).
    fn live_units(&self, product: i64) -> i64 {
        self.orders
            .values()
            .filter(|(_, p, status, _)| {
                *p == product && (status == "PENDING_PAYMENT" || status == "PAID")
            })
            .map(|(_, _, _, q)| q)
            .sum()
    }

    /// Every event applied once: the consumer's ids are the outbox's, each there once,
    /// and `sales_stats` agrees with the ledger for every product; None if so, else why
    /// not.
    fn events_problem(&self) -> Option<String> {
        if self.unsent > 0 {
            return Some(format!("{} outbox rows unsent", self.unsent));
        }
        if self.outbox.len() != self.outbox_events {
            return Some(format!(
                "{} outbox events but {} distinct ids",
                self.outbox_events,
                self.outbox.len()
            ));
        }
        if self.consumed != self.outbox {
            let missing = self.outbox.difference(&self.consumed).count();
            let extra = self.consumed.difference(&self.outbox).count();
            return Some(format!(
                "the consumer applied {} events, the outbox holds {}: {missing} not applied, {extra} not in the outbox",
                self.consumed.len(),
                self.outbox.len()
            ));
        }
        self.stats.iter().enumerate().find_map(|(i, s)| match s {
            None => Some(format!("product #{i}: no sales_stats row")),
            Some((stats, ledger)) if stats != ledger => Some(format!(
                "product #{i}: sales_stats {stats} != the ledger's {ledger} (created, units, paid, units, cancelled, units, released, units)"
            )),
            Some(_) => None,
        })
    }
}

/// The sale as it went: the kills, the probes' purchases, the rushes' counters.
#[derive(Debug, Clone)]
struct Timeline {
    /// When the sale's first attempt was taken: the timeline's zero.
    t0: Instant,
    kills: Vec<Kill>,
    /// When the load was stopped (every product sold out, or the run failed).
    load_over: Instant,
    shots: Vec<Shot>,
    samples: Vec<Sample>,
}

/// What the run saw, checked once the servers are stopped.
struct Seen {
    /// Per product: its id, the Redis primary its keys lived on, the rush's result.
    rushes: Vec<(i64, u16, BenchResult)>,
    timeline: Timeline,
    /// The instance killed.
    killed: String,
    /// Per product: the inventory once the rushes were over.
    settled: Vec<Inventory>,
    /// Per surviving instance: what its recovery did since just before the instance's
    /// kill, and the Galera node it wrote through at the end.
    survivors: Vec<(String, Recovery, String)>,
    /// When every event had been applied (from the load's end); Err: not within
    /// `DRAIN_MAX`, with the last problem.
    drained: Result<Duration, String>,
    /// Per surviving Galera node: its index and what it holds.
    nodes: Vec<(usize, NodeFacts)>,
    /// Per product: the audit through the cluster, then on each surviving node alone.
    audits: Vec<Vec<Audited>>,
    log_problems: Vec<String>,
}

// Checks the scenario (see the module comment): one sale over three instances on
// a Redis Cluster, a Galera cluster and a JetStream cluster; a Redis primary, the Galera
// writer, the stream's leader and an instance killed with kill -9 in turn, each once the
// sale was whole again after the one before, every product with stock left at each; the
// load on until every product sold out. Then: each rush's checks and audit passed (every
// acknowledged order in the orders table of node 1); the stock exactly in live orders,
// nothing held; both surviving nodes hold the same orders (so every acknowledged order
// is on both), the probes' acknowledged orders, every event applied exactly once, and
// the same tables; the audit clean through the cluster and on each node alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_of_everything_killed_in_turn_in_one_sale() {
    let bin = common::server_bin();
    let started = Instant::now();
    let (redis, galera, nats) = tokio::join!(
        RedisCluster::start(),
        GaleraCluster::start(),
        NatsCluster::start()
    );
    let mut redis = redis.expect("the Redis Cluster starts");
    let galera = galera.expect("the Galera cluster starts");
    let mut nats = nats.expect("the NATS cluster starts");
    let products = common::product_per_primary(&redis).await;
    eprintln!(
        "clusters up in {:.1}s: Redis {}, Galera {}, NATS {}; products (id → primary): {products:?}",
        started.elapsed().as_secs_f64(),
        redis.seed_nodes(),
        galera.nodes_setting(),
        nats.urls()
    );

    let seeds = redis.seed_nodes();
    let nodes = galera.nodes_setting();
    let env = common::short_workers_env(&[
        (CLUSTER_NODES_ENV, seeds.as_str()),
        (DATABASE_NODES_ENV, nodes.as_str()),
        ("FLASHSALE_NATS_STREAM_REPLICAS", "3"),
    ]);
    let redis_url = redis.urls().first().cloned().expect("six nodes");
    // The database server hosts the fresh database (the nodes setting decides where the
    // ledger writes); the Redis URL is not read by the servers (the cluster setting
    // wins): one of the cluster's nodes, so that nothing points at the shared Redis.
    let (database_url, nats_url) = (galera.url(WRITER), nats.urls());
    let stores = (database_url.as_str(), redis_url.as_str(), nats_url.as_str());
    let mut spawned = common::spawn_sale(&bin, stores, &env, INSTANCES, started).await;

    let seen = run(
        &bin,
        &mut spawned,
        &mut redis,
        &mut nats,
        &galera,
        &products,
    )
    .await;
    let problems = match &seen {
        Ok(seen) => {
            print_seen(seen, &products);
            problems(seen)
        }
        Err(e) => vec![format!("the run was not carried out: {e}")],
    };
    // The database is dropped through a node that lives.
    let (_, database, _) = split_database_url(&spawned.env.database_url).expect("a URL");
    spawned.env.database_url = format!("{}/{database}", galera.url(READER));
    let keep = !problems.is_empty();
    if keep {
        for i in spawned.instances() {
            eprintln!("kept server log {} ({})", i.log_path.display(), i.base_url);
        }
    }
    spawned.shutdown(keep).await;
    drop((redis, galera, nats));
    let took = started.elapsed();
    println!("test took {:.1}s", took.as_secs_f64());
    if took > EXPECTED_MAX {
        eprintln!("note: the test took {took:?} (busy machine?)");
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Everything between the servers' start and the checks: the sale with its four kills,
/// the wait for the events, the servers' stop, the nodes' reads and the audits.
async fn run(
    bin: &Path,
    spawned: &mut Spawned,
    redis: &mut RedisCluster,
    nats: &mut NatsCluster,
    galera: &GaleraCluster,
    products: &[(i64, u16)],
) -> Result<Seen, String> {
    let urls = spawned.base_urls();
    let http = common::client_once_working(&urls).await?;
    let (_, database, _) = split_database_url(&spawned.env.database_url)?;
    let reader_url = format!("{}/{database}", galera.url(READER));
    let stream = spawned
        .env
        .nats
        .as_ref()
        .map(|(_, stream)| stream.clone())
        .ok_or("the spawn owns no NATS stream")?;
    let killed = spawned
        .others
        .first()
        .map(|i| i.base_url.clone())
        .ok_or("no second instance to kill")?;
    // Never killed: every read during the sale goes there.
    let reads = spawned.first.base_url.clone();

    // The rushes, and the sale's first attempt.
    let target = common::against_ledger(spawned, bin, &reader_url);
    let (stock, rate) = (STOCK.to_string(), RATE.to_string());
    let attempts = (RATE * LOAD_MAX.as_secs()).to_string();
    let (users, duration) = (USERS.to_string(), format!("{}s", LOAD_MAX.as_secs()));
    let rushes: Vec<Rush> = products
        .iter()
        .map(|(product, _)| {
            let product = product.to_string();
            common::start_rush(
                &target,
                &[
                    ("--product-id", product.as_str()),
                    ("--attempts", attempts.as_str()),
                    ("--duration", duration.as_str()),
                    ("--users", users.as_str()),
                    ("--stock", stock.as_str()),
                    ("--rate", rate.as_str()),
                ],
            )
        })
        .collect();
    let waited = Instant::now();
    let mut t0 = None;
    while rushes
        .iter()
        .any(|r| r.live.taken.load(Ordering::Relaxed) == 0)
    {
        if t0.is_none()
            && rushes
                .iter()
                .any(|r| r.live.taken.load(Ordering::Relaxed) > 0)
        {
            t0 = Some(Instant::now());
        }
        if waited.elapsed() > START_WAIT_MAX || rushes.iter().any(|r| r.handle.is_finished()) {
            return Err(stop_rushes(rushes, "the rushes did not all start").await);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let t0 = t0.unwrap_or_else(Instant::now);

    // The probes and the sampler, until `stop`.
    let stop = Arc::new(AtomicBool::new(false));
    let shots = Arc::new(Mutex::new(Vec::<Shot>::new()));
    let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
    let mut watchers = Vec::new();
    for (i, &(product, _)) in products.iter().enumerate() {
        watchers.push(tokio::spawn(probe(
            urls.clone(),
            i,
            product,
            stop.clone(),
            shots.clone(),
        )));
    }
    let lives: Vec<_> = rushes.iter().map(|r| r.live.clone()).collect();
    watchers.push(tokio::spawn({
        let (stop, samples) = (stop.clone(), samples.clone());
        async move {
            while !stop.load(Ordering::Relaxed) {
                let counts = lives
                    .iter()
                    .map(|l| {
                        [
                            l.orders.load(Ordering::Relaxed),
                            l.unavailable.load(Ordering::Relaxed),
                            l.transport.load(Ordering::Relaxed),
                        ]
                    })
                    .collect();
                let at = Instant::now();
                lock(&samples).push(Sample { at, counts });
                tokio::time::sleep(SAMPLE_EVERY).await;
            }
        }
    }));

    let mut kills = Vec::new();
    let sale = sale(
        &mut kills,
        &http,
        &rushes,
        &shots,
        spawned,
        (redis, galera, nats),
        products,
        &reads,
        &stream,
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    for r in &rushes {
        r.live.stop.store(true, Ordering::Relaxed);
    }
    let load_over = Instant::now();
    for w in watchers {
        let _ = w.await;
    }
    let timeline = Timeline {
        t0,
        kills,
        load_over,
        shots: lock(&shots).clone(),
        samples: lock(&samples).clone(),
    };
    let before_last = match sale {
        Ok(before) => before,
        Err(e) => {
            print_timeline(&timeline, products);
            return Err(stop_rushes(rushes, &e).await);
        }
    };
    // A failure from here on still prints the timeline.
    let seen = async {
        let mut results = Vec::new();
        for (i, rush) in rushes.into_iter().enumerate() {
            let r = rush
                .handle
                .await
                .map_err(|e| format!("rush {i} panicked: {e}"))??;
            results.push((products[i].0, products[i].1, r));
        }
        let mut settled = Vec::new();
        for &(product, _) in products {
            settled.push(inventory(&http, &reads, product).await?);
        }

        // Every event applied, read where the ledger now writes.
        let drained = drained(galera, &database, products, load_over).await;
        let survivors: Vec<&String> = urls.iter().filter(|u| **u != killed).collect();
        let mut after = Vec::new();
        for (url, before) in survivors.iter().zip(&before_last) {
            let now = metrics(&http, url).await?;
            let writer = ledger_writer(&now);
            after.push((
                (*url).clone(),
                Recovery::of(&now).since(&Recovery::of(before)),
                writer,
            ));
        }
        let log_problems = common::log_problems(spawned);

        // The nodes, nothing writing any more.
        spawned.stop_servers().await;
        let survivors_of_galera: Vec<usize> = (0..galera.len()).filter(|&i| i != WRITER).collect();
        nodes_equal(galera, &survivors_of_galera).await?;
        let mut nodes = Vec::new();
        for &i in &survivors_of_galera {
            nodes.push((i, node_facts(galera, i, &database, products).await?));
        }
        let audits = audits(bin, &spawned.env, galera, &database, products).await?;
        Ok(Seen {
            rushes: results,
            timeline: timeline.clone(),
            killed: killed.clone(),
            settled,
            survivors: after,
            drained,
            nodes,
            audits,
            log_problems,
        })
    }
    .await;
    if seen.is_err() {
        print_timeline(&timeline, products);
    }
    seen
}

/// The sale's four kills, each once the sale is whole again after the one before, then
/// the load until every product has sold its stock; each kill is added to `kills` as it
/// is made, its outcome once the sale is whole again. Returns the survivors' /metrics
/// just before the instance's kill.
#[allow(clippy::too_many_arguments)]
async fn sale(
    kills: &mut Vec<Kill>,
    http: &reqwest::Client,
    rushes: &[Rush],
    shots: &Mutex<Vec<Shot>>,
    spawned: &Spawned,
    (redis, galera, nats): (&mut RedisCluster, &GaleraCluster, &mut NatsCluster),
    products: &[(i64, u16)],
    reads: &str,
    stream: &str,
) -> Result<Vec<String>, String> {
    let in_orders = || async {
        let mut units = Vec::new();
        for &(product, _) in products {
            let inv = inventory(http, reads, product).await.ok();
            units.push(inv.map(|i| i.reserved + i.sold));
        }
        units
    };

    // 1. The Redis primary of the first product, once every rush has sold a little.
    let waited = Instant::now();
    while rushes
        .iter()
        .any(|r| r.live.orders.load(Ordering::Relaxed) < KILL_AT_ORDERS)
    {
        if waited.elapsed() > START_WAIT_MAX || rushes.iter().any(|r| r.handle.is_finished()) {
            return Err(format!(
                "the rushes did not all reach {KILL_AT_ORDERS} orders within {START_WAIT_MAX:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (product, port) = products[0];
    let slot = RedisCluster::slot_of(&format!("{{p:{product}}}"));
    let units = in_orders().await;
    redis
        .kill(port)
        .map_err(|e| format!("kill -9 the Redis primary :{port}: {e}"))?;
    let at = Instant::now();
    let what = format!("Redis primary :{port} (product {product}'s slot {slot})");
    let k = record(kills, what, at, units);
    recovered(shots, products.len(), at).await?;
    let promoted = redis
        .wait_failover(slot, port)
        .await
        .map_err(|e| format!("the failover of :{port}: {e}"))?;
    kills[k].outcome = format!("replica :{promoted} promoted");
    tokio::time::sleep(SETTLE).await;

    // 2. The Galera node every instance writes through.
    let writer = galera.addr(WRITER).to_string();
    let shown = ledger_writer(&metrics(http, reads).await?);
    if shown != writer {
        return Err(format!(
            "the instances write through {shown}, not node {WRITER} ({writer})"
        ));
    }
    let units = in_orders().await;
    galera
        .kill9(WRITER)
        .map_err(|e| format!("kill -9 Galera node {WRITER}: {e}"))?;
    let at = Instant::now();
    let k = record(
        kills,
        format!("Galera node {WRITER} ({writer}), the writer"),
        at,
        units,
    );
    recovered(shots, products.len(), at).await?;
    let writer = ledger_writer(&metrics(http, reads).await?);
    kills[k].outcome = format!("the instances write through {writer}");
    tokio::time::sleep(SETTLE).await;

    // 3. The NATS server that leads the events' stream.
    let leader = nats
        .wait_stream_leader(stream, None)
        .await
        .map_err(|e| format!("the stream's leader: {e}"))?;
    let units = in_orders().await;
    nats.kill9(leader)
        .map_err(|e| format!("kill -9 NATS server {leader}: {e}"))?;
    let at = Instant::now();
    let k = record(
        kills,
        format!("NATS server {leader}, the stream's leader"),
        at,
        units,
    );
    let elected = nats
        .wait_stream_leader(stream, Some(leader))
        .await
        .map_err(|e| format!("another leader of {stream}: {e}"))?;
    let election = at.elapsed();
    recovered(shots, products.len(), at).await?;
    kills[k].outcome = format!(
        "server {elected} elected after {:.1}s",
        election.as_secs_f64()
    );
    tokio::time::sleep(SETTLE).await;

    // 4. One flashsale instance, then the load until every product has sold its stock.
    let victim = spawned.others.first().ok_or("no second instance to kill")?;
    let survivors: Vec<String> = spawned
        .base_urls()
        .into_iter()
        .filter(|u| *u != victim.base_url)
        .collect();
    let mut before = Vec::new();
    for url in &survivors {
        before.push(metrics(http, url).await?);
    }
    let units = in_orders().await;
    // The burst, in waves; the first of its purchases to be answered kills the instance
    // at once, from its own task (a wake-up of this one would come too late: the server
    // answers a batch of purchases all together), and no wave is sent after that.
    let killed_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let pid = victim.pid;
    let mut burst = Vec::new();
    for b in 0..BURST {
        if b > 0 && b % BURST_WAVE == 0 {
            tokio::time::sleep(BURST_WAVE_GAP).await;
        }
        if lock(&killed_at).is_some() {
            break;
        }
        let (http, url) = (http.clone(), victim.base_url.clone());
        let (index, product) = (b % products.len(), products[b % products.len()].0);
        let user = BURST_USERS_FROM + i64::try_from(b).unwrap_or(0);
        let request_id = format!("BURST_{product}_{b}");
        let killed_at = killed_at.clone();
        burst.push(tokio::spawn(async move {
            let shot = purchase(&http, &url, (index, product), request_id, user, true).await;
            if shot.status != 0 {
                sigkill_once(pid, &killed_at);
            }
            shot
        }));
    }
    let waited = Instant::now();
    while lock(&killed_at).is_none() && waited.elapsed() < BURST_WAIT {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    sigkill_once(pid, &killed_at);
    let at = lock(&killed_at).unwrap_or_else(Instant::now);
    let (mut sent, mut cut) = (0, 0);
    for shot in burst {
        let shot = shot
            .await
            .map_err(|e| format!("a purchase of the burst: {e}"))?;
        sent += 1;
        cut += usize::from(shot.status == 0 && shot.sent < at);
        lock(shots).push(shot);
    }
    let what = format!(
        "flashsale instance {} (pid {}), with {cut} of a burst of {sent} purchases in flight",
        victim.base_url, victim.pid
    );
    let k = record(kills, what, at, units);
    let released =
        |texts: &[String]| -> f64 { texts.iter().map(|t| Recovery::of(t).released()).sum() };
    let mut released_now = released(&before);
    let mut last_release = None;
    loop {
        let mut texts = Vec::new();
        for url in &survivors {
            texts.push(metrics(http, url).await?);
        }
        let now = released(&texts);
        if now != released_now {
            released_now = now;
            last_release = Some(at.elapsed());
        }
        let mut invs = Vec::new();
        for &(product, _) in products {
            invs.push(inventory(http, reads, product).await);
        }
        if invs
            .iter()
            .all(|i| i.as_ref().is_ok_and(|i| i.reserved + i.sold == i.total))
        {
            break;
        }
        if at.elapsed() > SOLD_OUT_MAX || rushes.iter().any(|r| r.handle.is_finished()) {
            return Err(format!(
                "not every product sold out within {SOLD_OUT_MAX:?} of the instance's kill (or the load ended first): {invs:?}"
            ));
        }
        tokio::time::sleep(common::POLL).await;
    }
    kills[k].outcome = format!(
        "{}; every product sold out {:.1}s after the kill",
        last_release.map_or("no abandoned hold for recovery to release".to_owned(), |d| {
            format!(
                "the survivors' recovery released its abandoned holds, the last {:.1}s after the kill",
                d.as_secs_f64()
            )
        }),
        at.elapsed().as_secs_f64()
    );
    Ok(before)
}

/// Sends SIGKILL to the spawned server `pid` unless `killed_at` says it was sent, and
/// records when.
fn sigkill_once(pid: u32, killed_at: &Mutex<Option<Instant>>) {
    let mut at = lock(killed_at);
    if at.is_none() {
        // SAFETY: kill(2) with a valid signal, on a server this test spawned and that is
        // not reaped before `Spawned::shutdown` (so its pid cannot have been reused).
        unsafe {
            libc::kill(pid as libc::pid_t, libc::SIGKILL);
        }
        *at = Some(Instant::now());
    }
}

/// Adds a kill to `kills` as soon as it is made (a run that fails afterwards still
/// prints it), its outcome to be told; returns its index.
fn record(kills: &mut Vec<Kill>, what: String, at: Instant, in_orders: Vec<Option<i64>>) -> usize {
    kills.push(Kill {
        what,
        at,
        in_orders,
        outcome: "the sale never whole again".into(),
    });
    kills.len() - 1
}

/// Waits (bounded by `RECOVERED_MAX`) until every product's probe has had a purchase sent
/// after `kill` answered 201: the sale is whole again.
async fn recovered(shots: &Mutex<Vec<Shot>>, products: usize, kill: Instant) -> Result<(), String> {
    let waited = Instant::now();
    loop {
        let missing: Vec<usize> = (0..products)
            .filter(|&p| first_201(&lock(shots), p, kill).is_none())
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        if waited.elapsed() > RECOVERED_MAX {
            return Err(format!(
                "products #{missing:?} sold nothing to their probe within {RECOVERED_MAX:?} of a kill"
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The first purchase of product `p`'s probe sent at or after `after` and answered 201.
fn first_201(shots: &[Shot], p: usize, after: Instant) -> Option<Shot> {
    shots
        .iter()
        .filter(|s| !s.burst && s.product == p && s.sent >= after && s.status == 201)
        .min_by_key(|s| s.sent)
        .cloned()
}

/// One probe buyer of product `product` (index `index`): one purchase at a time, each with
/// a request_id and a user of its own, round the instances, until `stop`.
async fn probe(
    urls: Vec<String>,
    index: usize,
    product: i64,
    stop: Arc<AtomicBool>,
    shots: Arc<Mutex<Vec<Shot>>>,
) {
    let Ok(http) = reqwest::Client::builder().timeout(PROBE_TIMEOUT).build() else {
        return;
    };
    let mut n: usize = 0;
    while !stop.load(Ordering::Relaxed) {
        let url = &urls[(n + index) % urls.len()];
        let user = PROBE_USERS_FROM + i64::try_from(n).unwrap_or(0);
        let request_id = format!("PROBE_{product}_{n}");
        let shot = purchase(&http, url, (index, product), request_id, user, false).await;
        lock(&shots).push(shot);
        n += 1;
        tokio::time::sleep(PROBE_PAUSE).await;
    }
}

/// One purchase of one unit of `product` (its index, its id) at the server `url`, and
/// how it was answered.
async fn purchase(
    http: &reqwest::Client,
    url: &str,
    (index, product): (usize, i64),
    request_id: String,
    user: i64,
    burst: bool,
) -> Shot {
    let sent = Instant::now();
    let answer = http
        .post(format!("{url}/v1/purchases"))
        .json(&serde_json::json!({
            "request_id": request_id,
            "user_id": user,
            "product_id": product,
            "quantity": 1,
        }))
        .send()
        .await;
    let (status, order) = match answer {
        Ok(r) => {
            let status = r.status().as_u16();
            let order = if status == 200 || status == 201 {
                r.json::<serde_json::Value>()
                    .await
                    .ok()
                    .and_then(|v| v["order_id"].as_i64())
            } else {
                None
            };
            (status, order)
        }
        Err(_) => (0, None),
    };
    Shot {
        product: index,
        burst,
        request_id,
        sent,
        answered: Instant::now(),
        status,
        order,
    }
}

/// The guarded value, even if a thread panicked while holding it.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Stops the rushes and waits for them; returns `why` with what they said.
async fn stop_rushes(rushes: Vec<Rush>, why: &str) -> String {
    for r in &rushes {
        r.live.stop.store(true, Ordering::Relaxed);
    }
    let mut said = Vec::new();
    for r in rushes {
        match r.handle.await {
            Ok(Ok(result)) => said.push(format!("passed: {}", result.passed)),
            Ok(Err(e)) => said.push(e),
            Err(e) => said.push(format!("panicked: {e}")),
        }
    }
    format!("{why} (the rushes: {said:?})")
}

/// The Galera node (`host:port`) a server's /metrics says it writes through; "-" if none.
fn ledger_writer(metrics: &str) -> String {
    metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("flashsale_ledger_writer{node=\"")?
                .strip_suffix("\"} 1")
        })
        .unwrap_or("-")
        .to_owned()
}

/// Waits (bounded by `DRAIN_MAX` from `load_over`) until node `READER`, where the ledger
/// writes once node `WRITER` is dead, shows every event applied once
/// ([`NodeFacts::events_problem`]); how long after the load that was, or the last
/// problem.
async fn drained(
    galera: &GaleraCluster,
    database: &str,
    products: &[(i64, u16)],
    load_over: Instant,
) -> Result<Duration, String> {
    loop {
        let problem = match node_facts(galera, READER, database, products).await {
            Ok(facts) => facts.events_problem(),
            Err(e) => Some(e),
        };
        match problem {
            None => return Ok(load_over.elapsed()),
            Some(p) if load_over.elapsed() > DRAIN_MAX => return Err(p),
            Some(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// Waits (bounded by `NODES_EQUAL_MAX`) until `nodes` are Synced and have committed the
/// same writesets (`wsrep_last_committed`), and returns that seqno.
async fn nodes_equal(galera: &GaleraCluster, nodes: &[usize]) -> Result<u64, String> {
    let waited = Instant::now();
    loop {
        let mut last = Vec::new();
        for &i in nodes {
            let status = galera
                .status(i)
                .await
                .map_err(|e| format!("node {i}'s status: {e}"))?;
            last.push((status.is_synced(), status.last_committed));
        }
        if last
            .iter()
            .all(|&(synced, seqno)| synced && seqno == last[0].1)
        {
            return Ok(last[0].1);
        }
        if waited.elapsed() > NODES_EQUAL_MAX {
            return Err(format!(
                "nodes {nodes:?} not synced at one seqno within {NODES_EQUAL_MAX:?}: (synced, last committed) {last:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `sales_stats`' columns, each with the ledger's figure it must equal once every event
/// is applied: (column, aggregate, the product's rows it aggregates).
const STATS: [(&str, &str, &str); 8] = [
    ("orders_created", "COUNT(*)", "orders x WHERE TRUE"),
    ("units_ordered", "SUM(x.quantity)", "orders x WHERE TRUE"),
    (
        "orders_paid",
        "COUNT(*)",
        "orders x WHERE x.status = 'PAID'",
    ),
    (
        "units_paid",
        "SUM(x.quantity)",
        "orders x WHERE x.status = 'PAID'",
    ),
    (
        "orders_cancelled",
        "COUNT(*)",
        "orders x WHERE x.status = 'CANCELLED'",
    ),
    (
        "units_cancelled",
        "SUM(x.quantity)",
        "orders x WHERE x.status = 'CANCELLED'",
    ),
    (
        "reservations_released",
        "COUNT(*)",
        "inventory_reservation x WHERE x.status = 'RELEASED'",
    ),
    (
        "units_released",
        "SUM(x.quantity)",
        "inventory_reservation x WHERE x.status = 'RELEASED'",
    ),
];

/// One product's `sales_stats` row and the ledger's figures for it, each as one text of
/// `STATS`' numbers.
fn stats_sql() -> String {
    let columns: Vec<String> = STATS.iter().map(|(c, _, _)| format!("s.{c}")).collect();
    let ledger: Vec<String> = STATS
        .iter()
        .map(|(_, aggregate, rows)| {
            format!("(SELECT COALESCE({aggregate}, 0) FROM {rows} AND x.product_id = s.product_id)")
        })
        .collect();
    format!(
        "SELECT CONVERT(CONCAT_WS(' ', {}) USING utf8mb4), CONVERT(CONCAT_WS(' ', {}) USING utf8mb4) \
         FROM sales_stats s WHERE s.product_id = ?",
        columns.join(", "),
        ledger.join(", ")
    )
}

/// What node `i` holds of the sale's database, read on a connection of its own with
/// `wsrep_sync_wait=1` (every read waits for the writesets certified before it).
async fn node_facts(
    galera: &GaleraCluster,
    i: usize,
    database: &str,
    products: &[(i64, u16)],
) -> Result<NodeFacts, String> {
    let on = |e: sqlx::Error| format!("node {i}: {e}");
    let mut conn = MySqlConnection::connect(&format!("{}/{database}", galera.url(i)))
        .await
        .map_err(on)?;
    sqlx::query("SET SESSION wsrep_sync_wait = 1")
        .execute(&mut conn)
        .await
        .map_err(on)?;
    let orders: Vec<(String, i64, i64, String, i64)> = sqlx::query_as(
        "SELECT CONVERT(request_id USING utf8mb4), id, product_id, \
         CONVERT(status USING utf8mb4), CAST(quantity AS SIGNED) FROM orders",
    )
    .fetch_all(&mut conn)
    .await
    .map_err(on)?;
    let unsent: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM outbox_unsent")
        .fetch_one(&mut conn)
        .await
        .map_err(on)?;
    let outbox: Vec<String> =
        sqlx::query_scalar("SELECT CONVERT(event_id USING utf8mb4) FROM outbox_event")
            .fetch_all(&mut conn)
            .await
            .map_err(on)?;
    let consumed: Vec<String> =
        sqlx::query_scalar("SELECT CONVERT(event_id USING utf8mb4) FROM consumed_event")
            .fetch_all(&mut conn)
            .await
            .map_err(on)?;
    let mut stats = Vec::new();
    let sql = stats_sql();
    for &(product, _) in products {
        stats.push(
            sqlx::query_as::<_, (String, String)>(&sql)
                .bind(product)
                .fetch_optional(&mut conn)
                .await
                .map_err(on)?,
        );
    }
    let checksums: Vec<(String, Option<i64>)> = sqlx::query_as(&format!("CHECKSUM TABLE {TABLES}"))
        .fetch_all(&mut conn)
        .await
        .map_err(on)?;
    let _ = conn.close().await;
    Ok(NodeFacts {
        orders: orders
            .into_iter()
            .map(|(request, id, product, status, quantity)| {
                (request, (id, product, status, quantity))
            })
            .collect(),
        unsent,
        outbox_events: outbox.len(),
        outbox: outbox.into_iter().collect(),
        consumed: consumed.into_iter().collect(),
        stats,
        checksums,
    })
}

/// One `flashsale audit` run after the sale.
#[derive(Debug, Clone)]
struct Audited {
    /// Where it read the ledger.
    place: String,
    run: AuditRun,
}

/// `flashsale audit` of every product, all at once: through the cluster with the
/// servers' very settings (`FLASHSALE_DATABASE_NODES`, the dead node first, and
/// `FLASHSALE_DATABASE_URL` on that dead node: with a nodes setting only its user,
/// password and database matter, and the audit's ledger must find the first healthy
/// node), and on each surviving node alone (its URL, no nodes setting).
async fn audits(
    bin: &Path,
    env: &ServerEnv,
    galera: &GaleraCluster,
    database: &str,
    products: &[(i64, u16)],
) -> Result<Vec<Vec<Audited>>, String> {
    let on = |i: usize| format!("{}/{database}", galera.url(i));
    let mut wheres = vec![(
        format!("the cluster (URL on the dead node {WRITER}, as the servers had it)"),
        env.clone(),
    )];
    for i in (0..galera.len()).filter(|&i| i != WRITER) {
        wheres.push((
            format!("node {i} alone"),
            ServerEnv {
                database_url: on(i),
                database_nodes: None,
                ..env.clone()
            },
        ));
    }
    let mut runs = Vec::new();
    for &(product, _) in products {
        for (place, env) in &wheres {
            let (bin, env, place) = (bin.to_path_buf(), env.clone(), place.clone());
            runs.push(tokio::spawn(async move {
                let run = server::audit(&bin, &env, product).await;
                run.map(|run| Audited { place, run })
            }));
        }
    }
    let mut audits: Vec<Vec<Audited>> = vec![Vec::new(); products.len()];
    for (k, run) in runs.into_iter().enumerate() {
        let audited = run.await.map_err(|e| format!("an audit panicked: {e}"))??;
        audits[k / wheres.len()].push(audited);
    }
    Ok(audits)
}

/// The rushes' counters at `t` (the last sample at or before it), summed: [orders, 5xx,
/// no answer].
fn counts_at(samples: &[Sample], t: Instant) -> [u64; 3] {
    samples
        .iter()
        .take_while(|s| s.at <= t)
        .last()
        .map_or([0; 3], |s| {
            s.counts.iter().fold([0; 3], |mut sum, c| {
                for (a, b) in sum.iter_mut().zip(c) {
                    *a += b;
                }
                sum
            })
        })
}

/// The rushes' 5xx answers and attempts without an answer from `from` to `to`.
fn failures(samples: &[Sample], from: Instant, to: Instant) -> (u64, u64) {
    let (a, b) = (counts_at(samples, from), counts_at(samples, to));
    (b[1].saturating_sub(a[1]), b[2].saturating_sub(a[2]))
}

/// Seconds from `from` to `to` (negative when `to` is earlier).
fn secs(from: Instant, to: Instant) -> f64 {
    if to >= from {
        (to - from).as_secs_f64()
    } else {
        -(from - to).as_secs_f64()
    }
}

/// When the sale was whole again after kill `k`: the latest of the products' first 201
/// to a purchase sent after it (answered); None if a product got none.
fn whole_again(seen: &Timeline, products: usize, k: usize) -> Option<Instant> {
    let at = seen.kills[k].at;
    (0..products)
        .map(|p| first_201(&seen.shots, p, at).map(|s| s.answered))
        .collect::<Option<Vec<_>>>()?
        .into_iter()
        .max()
}

/// Prints the timeline: each kill, the first 201 after it, and the 503s and unanswered
/// attempts around it.
fn print_timeline(seen: &Timeline, products: &[(i64, u16)]) {
    let t0 = seen.t0;
    println!(
        "\n=== one node of everything killed in turn, in one sale (t = the sale's first attempt) ==="
    );
    println!(
        "products {}: {STOCK} units each, {RATE} attempts/s each and a probe buyer (one purchase at a time)",
        products
            .iter()
            .map(|(p, port)| format!("{p} (Redis primary :{port})"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    for (k, kill) in seen.kills.iter().enumerate() {
        let next = seen.kills.get(k + 1).map_or(seen.load_over, |n| n.at);
        let whole = whole_again(seen, products.len(), k);
        println!(
            "kill {} at t={:.2}s: {} — {}",
            k + 1,
            secs(t0, kill.at),
            kill.what,
            kill.outcome
        );
        let units: Vec<String> = products
            .iter()
            .zip(&kill.in_orders)
            .map(|((p, _), u)| format!("{p}: {}", u.map_or("?".into(), |u| u.to_string())))
            .collect();
        println!(
            "  units in orders at the kill: {} (of {STOCK})",
            units.join(", ")
        );
        let firsts: Vec<String> = products
            .iter()
            .enumerate()
            .map(|(i, (p, _))| match first_201(&seen.shots, i, kill.at) {
                Some(s) => format!(
                    "{p} sent +{:.2}s, answered +{:.2}s",
                    secs(kill.at, s.sent),
                    secs(kill.at, s.answered)
                ),
                None => format!("{p} none"),
            })
            .collect();
        println!(
            "  first 201 to a purchase sent after it: {}",
            firsts.join("; ")
        );
        let (b5, bn) = failures(&seen.samples, kill.at - BEFORE_KILL, kill.at);
        let (n5, nn) = failures(&seen.samples, kill.at, next);
        let until = whole.map_or("-".to_owned(), |w| {
            let (w5, wn) = failures(&seen.samples, kill.at, w);
            format!("{w5} / {wn}")
        });
        println!(
            "  rushes' 503 / no answer: {:.0}s before {b5} / {bn}; kill → whole again {until}; kill → {} {n5} / {nn}",
            BEFORE_KILL.as_secs_f64(),
            if k + 1 < seen.kills.len() {
                "next kill"
            } else {
                "load over"
            }
        );
        let probed: Vec<&Shot> = seen
            .shots
            .iter()
            .filter(|s| !s.burst && s.sent >= kill.at && whole.is_some_and(|w| s.answered <= w))
            .collect();
        println!(
            "  probes until whole again: {} sent, 201 {}, 503 {}, no answer {}, other {}",
            probed.len(),
            probed.iter().filter(|s| s.status == 201).count(),
            probed.iter().filter(|s| s.status == 503).count(),
            probed.iter().filter(|s| s.status == 0).count(),
            probed
                .iter()
                .filter(|s| ![0, 201, 503].contains(&s.status))
                .count(),
        );
    }
    println!("load stopped at t={:.2}s", secs(t0, seen.load_over));
}

fn print_seen(seen: &Seen, products: &[(i64, u16)]) {
    print_timeline(&seen.timeline, products);
    println!(
        "every event applied once: {}",
        match &seen.drained {
            Ok(d) => format!("seen {:.1}s after the load's end", d.as_secs_f64()),
            Err(e) => format!("NOT within {DRAIN_MAX:?}: {e}"),
        }
    );
    for (i, (product, port, r)) in seen.rushes.iter().enumerate() {
        println!(
            "product {product} (primary :{port}): {} attempts in {:.1}s, {} orders acknowledged to the rush; settled {:?}",
            r.attempts.sent, r.elapsed_s, r.orders.acknowledged, seen.settled[i]
        );
        common::print_targets(r);
        println!(
            "  audit: the bench's (node {READER} alone) {} ({} runs); after the sale:",
            r.checks.audit.status, r.checks.audit.runs,
        );
        for a in &seen.audits[i] {
            let verdict = if a.run.passed { "passed" } else { "FAILED" };
            println!("    on {}: {verdict}", a.place);
        }
    }
    let probes = seen
        .timeline
        .shots
        .iter()
        .filter(|s| s.order.is_some())
        .count();
    for (i, facts) in &seen.nodes {
        let live: Vec<String> = products
            .iter()
            .map(|(p, _)| format!("{p}: {}", facts.live_units(*p)))
            .collect();
        println!(
            "Galera node {i}: {} orders (units in live orders {}), the {} acknowledged to the probes and the burst among them, {} events, {} applied",
            facts.orders.len(),
            live.join(", "),
            probes,
            facts.outbox_events,
            facts.consumed.len()
        );
    }
    for (url, r, writer) in &seen.survivors {
        println!(
            "survivor {url}: writes through {writer}; since the instance's kill {} recovery passes, actions {:?}, incidents {}",
            r.passes, r.actions, r.incidents
        );
    }
    common::print_log_summary(&seen.log_problems, ERROR_LINES_SHOWN);
}

/// Everything the run found wrong (see the test's comment), one line each.
fn problems(seen: &Seen) -> Vec<String> {
    let mut found = Vec::new();
    for (product, _, r) in &seen.rushes {
        found.extend(common::rush_problems(
            *product,
            r,
            INSTANCES,
            &seen.killed,
            STOCK,
        ));
    }
    let mut check = |ok: bool, what: String| {
        if !ok {
            found.push(what);
        }
    };
    let kills = &seen.timeline.kills;
    check(kills.len() == 4, format!("{} kills", kills.len()));
    for (k, kill) in kills.iter().enumerate() {
        for (i, units) in kill.in_orders.iter().enumerate() {
            check(
                units.is_some_and(|u| u < STOCK),
                format!(
                    "kill {}: product #{i} had {units:?} units in orders: no stock left, the kill was not mid-sale",
                    k + 1
                ),
            );
        }
    }
    for (i, inv) in seen.settled.iter().enumerate() {
        let product = seen.rushes[i].0;
        check(
            held(inv) == 0 && inv.available == 0 && inv.total == STOCK,
            format!("product {product}: settled {inv:?}: units held or left"),
        );
    }
    for (url, recovery, writer) in &seen.survivors {
        check(
            recovery.passes > 0.0,
            format!("{url}: no recovery pass after the kill"),
        );
        check(
            recovery.incidents == 0.0,
            format!("{url}: recovery raised incidents: {recovery:?}"),
        );
        check(writer != "-", format!("{url}: no ledger writer shown"));
    }
    if let Err(e) = &seen.drained {
        found.push(format!(
            "the events: not every one applied once within {DRAIN_MAX:?}: {e}"
        ));
    }
    for (i, facts) in &seen.nodes {
        for (product, _, _) in &seen.rushes {
            let live = facts.live_units(*product);
            if live != STOCK {
                found.push(format!(
                    "node {i}: product {product}: {live} units in PENDING_PAYMENT + PAID orders, not the stock {STOCK}"
                ));
            }
        }
        if let Some(e) = facts.events_problem() {
            found.push(format!("node {i}: events: {e}"));
        }
        let acknowledged = seen.timeline.shots.iter();
        for shot in acknowledged.filter(|s| s.status == 200 || s.status == 201) {
            let on_node = facts.orders.get(&shot.request_id).map(|o| o.0);
            if shot.order.is_none() || on_node != shot.order {
                found.push(format!(
                    "node {i}: the probe's {} acknowledged with order {:?}, the node has {on_node:?}",
                    shot.request_id, shot.order
                ));
            }
        }
    }
    if let [(a, first), (b, second)] = seen.nodes.as_slice() {
        if first.orders != second.orders {
            found.push(format!(
                "nodes {a} and {b} hold different orders ({} and {} rows): an acknowledged order may be missing from one",
                first.orders.len(),
                second.orders.len()
            ));
        }
        if first.checksums != second.checksums {
            found.push(format!(
                "nodes {a} and {b}: the tables differ: {:?} / {:?}",
                first.checksums, second.checksums
            ));
        }
    } else {
        found.push(format!("{} surviving nodes read, not 2", seen.nodes.len()));
    }
    for (i, audits) in seen.audits.iter().enumerate() {
        for a in audits.iter().filter(|a| !a.run.passed) {
            found.push(format!(
                "product {}: flashsale audit on {}:\n{}",
                seen.rushes[i].0, a.place, a.run.output
            ));
        }
    }
    found
}
