//! How many holds one product's reserve script sustains on one Redis core, the script
//! alone (no HTTP, no ledger): the measurement behind the decision on hot-product
//! sharding (seed 004, 坑2).
//!
//! `cargo bench -p flashsale-redis --bench reserve_rate` starts a private redis-server
//! (single-threaded: one core), loads one product with more stock than the run sells,
//! and for each concurrency drives new purchases through `RedisGate::reserve` — the
//! adapter's own batching, as the server does — for a fixed time. Beside it, the same
//! concurrency sends a trivial `EVALSHA` (`return 1`): the ceiling of any script call on
//! that Redis. For each it reads the Redis process's CPU time (`INFO cpu`) and prints
//! holds (or calls) per second and per second of Redis CPU, which is what one core
//! sustains when the script is the only work. Each concurrency runs the script twice:
//! plain, and with the shared per-user rate on (`FLASHSALE_USER_PURCHASE_RATE_SCOPE=
//! shared`), whose cells it keeps in the same call.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark's failed setup ends it, with the expectation's message"
)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flashsale_app::ports::{Reserve, StockGate};
use flashsale_core::{Generation, ProductId, PurchaseRequest, Quantity, RequestId, UserId};
use flashsale_redis::{GateConfig, RedisGate};
use flashsale_testkit::PrivateRedis;

/// How long each row runs.
const RUN_FOR: Duration = Duration::from_secs(5);
/// The concurrencies tried: tasks with a purchase in flight each.
const CONCURRENCY: [u64; 3] = [16, 64, 256];
/// Units on sale: more than any row sells.
const STOCK: i64 = 100_000_000;

/// The Redis process's CPU seconds (user + system) so far.
async fn redis_cpu(conn: &mut redis::aio::MultiplexedConnection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(conn)
        .await
        .unwrap_or_default();
    ["used_cpu_user:", "used_cpu_sys:"]
        .iter()
        .filter_map(|field| {
            info.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .sum()
}

/// Runs `tasks` loops of `one` for [`RUN_FOR`]; how many succeeded, the wall time and
/// the Redis CPU seconds they took.
async fn run<F, Fut>(
    conn: &mut redis::aio::MultiplexedConnection,
    tasks: u64,
    one: F,
) -> (u64, f64, f64)
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let one = Arc::new(one);
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let cpu_before = redis_cpu(conn).await;
    let started = Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (one, stop, next, done) = (one.clone(), stop.clone(), next.clone(), done.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if one(n).await {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(RUN_FOR).await;
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        let _ = h.await;
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu = redis_cpu(conn).await - cpu_before;
    (done.load(Ordering::Relaxed), wall, cpu)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(bench());
}

async fn bench() {
    let redis = PrivateRedis::start().await.expect("private redis-server");
    let mut conn = redis::Client::open(redis.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let product = ProductId::parse(1).expect("id");
    println!(
        "one product's reserve script on one Redis core (private redis-server, {RUN_FOR:?} a row)"
    );
    println!(
        "{:<28} {:>6} {:>12} {:>14} {:>16}",
        "what", "tasks", "per second", "Redis CPU/s", "per Redis CPU s"
    );
    // Beside the plain script, the same with the shared per-user rate on, at a rate no
    // buyer here reaches (each user buys once): what keeping the cells costs.
    let shared = flashsale_app::limit::Rate {
        per_second: 1000,
        burst: 1000,
    };
    let rows = [
        ("reserve.lua, holds", None),
        ("+ shared rate, holds", Some(shared)),
    ];
    for (&tasks, (label, shared_user_rate)) in CONCURRENCY
        .iter()
        .flat_map(|t| rows.iter().map(move |r| (t, *r)))
    {
        // A fresh prefix, gate and product per row: no state carried over.
        let prefix = format!("rate{tasks}:");
        let gate = Arc::new(
            RedisGate::new(&GateConfig {
                target: flashsale_redis::Target::Node(redis.url()),
                prefix,
                record_ttl: Duration::from_secs(600),
                response_timeout: Duration::from_secs(5),
                connect_timeout: Duration::from_secs(5),
                sold_out_lease: Duration::ZERO,
                shared_user_rate,
            })
            .expect("gate"),
        );
        gate.load(product, STOCK, Generation::FIRST)
            .await
            .expect("load");
        let g = gate.clone();
        let (holds, wall, cpu) = run(&mut conn, tasks, move |n| {
            let g = g.clone();
            async move {
                let request = PurchaseRequest {
                    request_id: RequestId::parse("request_id", &format!("R{n}"))
                        .expect("request id"),
                    user_id: UserId::parse(1 + i64::try_from(n % 1_000_000).unwrap_or(0))
                        .expect("user"),
                    product_id: ProductId::parse(1).expect("id"),
                    quantity: Quantity::from_stored(1).expect("quantity"),
                };
                matches!(
                    g.reserve(&request, None).await,
                    Ok(Reserve::Reserved { .. })
                )
            }
        })
        .await;
        print_row(label, tasks, holds, wall, cpu);
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut conn)
            .await
            .expect("flush the private redis-server");
    }
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg("return 1")
        .query_async(&mut conn)
        .await
        .expect("script load");
    for &tasks in &CONCURRENCY {
        let client = conn.clone();
        let sha = sha.clone();
        let (calls, wall, cpu) = run(&mut conn, tasks, move |_| {
            let mut c = client.clone();
            let sha = sha.clone();
            async move {
                redis::cmd("EVALSHA")
                    .arg(&sha)
                    .arg(0)
                    .query_async::<i64>(&mut c)
                    .await
                    .is_ok()
            }
        })
        .await;
        print_row("EVALSHA `return 1`, calls", tasks, calls, wall, cpu);
    }
}

fn print_row(what: &str, tasks: u64, n: u64, wall: f64, cpu: f64) {
    let per_second = n as f64 / wall;
    let per_cpu = if cpu > 0.0 { n as f64 / cpu } else { 0.0 };
    println!(
        "{what:<28} {tasks:>6} {per_second:>12.0} {:>14.2} {per_cpu:>16.0}",
        cpu / wall
    );
}
