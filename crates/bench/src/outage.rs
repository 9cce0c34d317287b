//! `--outage`: a sale through a Redis outage, measured. The server runs on a private
//! redis-server that the bench kills with SIGKILL after a phase of sales through Redis,
//! and restarts (empty) after a phase in ledger mode; buyers keep buying throughout, each
//! retrying its request_id after a 503 as a client should. What it reports, each from
//! the same closed-loop client on the same server in the same run:
//! - durable orders/s through Redis, in ledger mode (from MariaDB's first order after
//!   the kill to Redis's restart), and through Redis again after the way back, and the
//!   ratio of ledger mode to gate mode;
//! - the time from Redis's death to the first order from MariaDB, and from Redis's
//!   restart to the product back in gate mode;
//! - then the checks: one order per acknowledged request_id, no other order, and
//!   `flashsale audit`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flashsale_testkit::PrivateRedis;
use serde_json::json;

use crate::cli::Args;
use crate::probes::OrdersProbe;
use crate::server::{self, SpawnOptions};

/// How long each phase runs unless `--outage-phase` says.
const PHASE_DEFAULT: Duration = Duration::from_secs(10);
const PHASE_QUICK: Duration = Duration::from_secs(5);
/// The server's fallback settings unless `--server-env` sets them: the default switch
/// delay, and a way back shorter than the default 30 s so that a run takes a minute.
const FALLBACK_AFTER_DEFAULT: &str = "3s";
const RECOVER_AFTER_DEFAULT: &str = "10s";
/// Units on sale: more than any run sells, so every purchase becomes an order.
const STOCK: i64 = 10_000_000;
/// Distinct buyers (ids cycle): the server's per-user rate limit is turned off for the
/// run unless `--server-env` sets it, as one buyer is one connection here.
const USERS: u64 = 1_000_000;
/// Pause before a buyer retries after a 503 or a failed connection.
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// Longest one purchase may stay unknown (retried) before the run gives up on it.
const UNKNOWN_MAX: Duration = Duration::from_secs(60);
/// Longest wait for MariaDB's first order after the kill, and for the way back beyond
/// the server's `FLASHSALE_FALLBACK_RECOVER_AFTER`.
const SWITCH_WAIT_MAX: Duration = Duration::from_secs(60);
/// How often the product's mode is read while waiting for the way back.
const MODE_POLL: Duration = Duration::from_millis(100);
/// The product the run sells.
const PRODUCT: i64 = 1;

/// One acknowledged purchase: its request_id, order id, when (since the load began) it
/// was first sent and when the buyer heard it.
struct Acknowledged {
    request_id: String,
    order_id: i64,
    sent: Duration,
    at: Duration,
}

/// What the buyers saw, shared by their tasks.
#[derive(Default)]
struct Seen {
    orders: Vec<Acknowledged>,
    /// 503s and failed connections, each retried.
    unknowns: u64,
    /// Final answers that were neither an order nor retried (must be none).
    refused: BTreeMap<u16, u64>,
}

/// The moments of the run, since the load began.
struct Timeline {
    killed: Duration,
    restarted: Duration,
    back: Duration,
    end: Duration,
}

pub async fn run(args: &Args) -> Result<bool, String> {
    if args.scenario != crate::cli::Scenario::Sustained {
        return Err("--outage runs the sustained scenario".into());
    }
    let phase = args.outage_phase.unwrap_or(if args.quick {
        PHASE_QUICK
    } else {
        PHASE_DEFAULT
    });
    let mut redis = PrivateRedis::start()
        .await
        .map_err(|e| format!("private redis-server: {e}"))?;
    let mut env = args.server_env.clone();
    for (key, value) in [
        ("FLASHSALE_FALLBACK_AFTER", FALLBACK_AFTER_DEFAULT),
        ("FLASHSALE_FALLBACK_RECOVER_AFTER", RECOVER_AFTER_DEFAULT),
        ("FLASHSALE_USER_PURCHASE_RATE", "0"),
    ] {
        if env.iter().all(|(k, _)| k != key) {
            env.push((key.to_owned(), value.to_owned()));
        }
    }
    let spawned = server::spawn(SpawnOptions {
        bin: &args.server_bin,
        database_url: &args.database_url,
        redis_url: &redis.url(),
        nats_url: &args.nats_url,
        payment_timeout: None,
        extra_env: &env,
        log_level: &args.server_log_level,
        log_path: args.server_log.as_deref(),
        instances: 1,
    })
    .await?;
    let control = crate::load::control_client()?;
    let result = sale(args, &spawned, &control, &mut redis, phase).await;
    let passed = match result {
        Ok((seen, timeline)) => {
            let printed = report(&seen, &timeline, &env);
            let checked = check(&spawned, &seen, args).await;
            printed && checked?
        }
        Err(e) => {
            spawned.shutdown(args.keep).await;
            return Err(e);
        }
    };
    spawned.shutdown(args.keep).await;
    Ok(passed)
}

/// Creates the product, runs the buyers and the outage, and returns what they saw.
async fn sale(
    args: &Args,
    spawned: &server::Spawned,
    control: &reqwest::Client,
    redis: &mut PrivateRedis,
    phase: Duration,
) -> Result<(Seen, Timeline), String> {
    let created = control
        .post(format!("{}/v1/products", spawned.first.base_url))
        .bearer_auth(&spawned.admin_token)
        .json(&json!({"product_id": PRODUCT, "name": "outage", "stock": STOCK}))
        .send()
        .await
        .map_err(|e| format!("create product: {e}"))?;
    if created.status() != reqwest::StatusCode::CREATED {
        return Err(format!("create product: {}", created.status()));
    }
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(usize::try_from(args.connections).unwrap_or(64))
        .timeout(Duration::from_secs(15))
        .build()
        .map_err(|e| format!("http client: {e}"))?;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let buyers: Vec<_> = (0..args.connections)
        .map(|_| {
            let (client, seen, stop, next) =
                (client.clone(), seen.clone(), stop.clone(), next.clone());
            let url = format!("{}/v1/purchases", spawned.first.base_url);
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    buy(&client, &url, n, started, &seen).await;
                }
            })
        })
        .collect();
    let outage = async {
        tokio::time::sleep(phase).await;
        redis
            .kill9()
            .map_err(|e| format!("kill redis-server: {e}"))?;
        let killed = started.elapsed();
        eprintln!("flashsale-bench: redis-server killed at {killed:?}");
        let first = first_order_after(&seen, killed, started).await?;
        tokio::time::sleep_until((started + first + phase).into()).await;
        redis
            .restart()
            .await
            .map_err(|e| format!("restart redis-server: {e}"))?;
        let restarted = started.elapsed();
        eprintln!("flashsale-bench: redis-server restarted at {restarted:?}");
        let back = back_in_gate_mode(control, &spawned.first.base_url, started).await?;
        tokio::time::sleep(phase).await;
        Ok::<_, String>(Timeline {
            killed,
            restarted,
            back,
            end: started.elapsed(),
        })
    }
    .await;
    stop.store(true, Ordering::Relaxed);
    for b in buyers {
        let _ = b.await;
    }
    let timeline = outage?;
    let seen = std::mem::take(&mut *seen.lock().unwrap_or_else(|e| e.into_inner()));
    Ok((seen, timeline))
}

/// One buyer's purchase `n`, retried after each 503 or failed connection until its
/// answer is known (bounded by [`UNKNOWN_MAX`]).
async fn buy(client: &reqwest::Client, url: &str, n: u64, started: Instant, seen: &Mutex<Seen>) {
    let request_id = format!("OUT_{n}");
    let body = json!({"request_id": request_id, "user_id": n % USERS + 1, "product_id": PRODUCT, "quantity": 1});
    let first = Instant::now();
    let sent = started.elapsed();
    loop {
        let answer = client.post(url).json(&body).send().await;
        let status = answer.as_ref().map(reqwest::Response::status).ok();
        match (status, answer) {
            (Some(s), Ok(resp))
                if s == reqwest::StatusCode::CREATED || s == reqwest::StatusCode::OK =>
            {
                let at = started.elapsed();
                let order_id = resp
                    .json::<serde_json::Value>()
                    .await
                    .ok()
                    .and_then(|v| v["order_id"].as_i64())
                    .unwrap_or(0);
                lock(seen).orders.push(Acknowledged {
                    request_id,
                    order_id,
                    sent,
                    at,
                });
                return;
            }
            (Some(s), _) if s != reqwest::StatusCode::SERVICE_UNAVAILABLE => {
                *lock(seen).refused.entry(s.as_u16()).or_default() += 1;
                return;
            }
            _ => {
                lock(seen).unknowns += 1;
                if first.elapsed() > UNKNOWN_MAX {
                    *lock(seen).refused.entry(503).or_default() += 1;
                    return;
                }
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }
}

fn lock(seen: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    seen.lock().unwrap_or_else(|e| e.into_inner())
}

/// When (since the load began) the first order from MariaDB was heard: the first of a
/// purchase first sent after Redis died, which no Redis can have held. (Purchases that
/// took their hold before the kill are acknowledged just after it, by the commit in
/// flight: not a sale from MariaDB.)
fn first_from_ledger(seen: &Seen, killed: Duration) -> Option<Duration> {
    seen.orders
        .iter()
        .filter(|o| o.sent > killed)
        .map(|o| o.at)
        .min()
}

/// [`first_from_ledger`], waited for (bounded).
async fn first_order_after(
    seen: &Mutex<Seen>,
    killed: Duration,
    started: Instant,
) -> Result<Duration, String> {
    loop {
        if let Some(at) = first_from_ledger(&lock(seen), killed) {
            return Ok(at);
        }
        if started.elapsed() > killed + SWITCH_WAIT_MAX {
            return Err(format!("no order within {SWITCH_WAIT_MAX:?} of Redis's death: is FLASHSALE_FALLBACK_AFTER off?"));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// When (since the load began) the product was seen back in gate mode.
async fn back_in_gate_mode(
    control: &reqwest::Client,
    base_url: &str,
    started: Instant,
) -> Result<Duration, String> {
    let waited = Instant::now();
    loop {
        let mode = control
            .get(format!("{base_url}/v1/products/{PRODUCT}"))
            .send()
            .await
            .ok();
        if let Some(resp) = mode {
            if let Ok(v) = resp.json::<serde_json::Value>().await {
                if v["stock_mode"] == "gate" {
                    return Ok(started.elapsed());
                }
            }
        }
        if waited.elapsed() > SWITCH_WAIT_MAX {
            return Err(format!("the product did not return to gate mode within {SWITCH_WAIT_MAX:?} of Redis's restart"));
        }
        tokio::time::sleep(MODE_POLL).await;
    }
}

/// Orders per second acknowledged within `[from, to)`.
fn rate(seen: &Seen, from: Duration, to: Duration) -> f64 {
    let n = seen
        .orders
        .iter()
        .filter(|o| o.at >= from && o.at < to)
        .count();
    let secs = to.saturating_sub(from).as_secs_f64();
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

/// Prints the table; false when a buyer got an answer that is neither an order nor a
/// 503 (none is expected: there is more stock than the run sells).
fn report(seen: &Seen, t: &Timeline, env: &[(String, String)]) -> bool {
    let setting = |key: &str| {
        env.iter()
            .find(|(k, _)| k == key)
            .map_or("?", |(_, v)| v.as_str())
    };
    let first = first_from_ledger(seen, t.killed).unwrap_or(t.restarted);
    // The first second warms connections and caches up; it is left out.
    let warm = Duration::from_secs(1).min(t.killed);
    let gate = rate(seen, warm, t.killed);
    let ledger = rate(seen, first, t.restarted);
    let again = rate(seen, t.back, t.end);
    println!(
        "\nflashsale through a Redis outage (FLASHSALE_FALLBACK_AFTER={}, FLASHSALE_FALLBACK_RECOVER_AFTER={})",
        setting("FLASHSALE_FALLBACK_AFTER"),
        setting("FLASHSALE_FALLBACK_RECOVER_AFTER")
    );
    println!("  {:<44} {:>12}", "phase", "orders/s");
    println!(
        "  {:<44} {:>12.0}",
        "gate mode (Redis), before the outage", gate
    );
    println!(
        "  {:<44} {:>12.0}",
        "ledger mode (MariaDB), Redis dead", ledger
    );
    println!("  {:<44} {:>12.0}", "gate mode again, Redis rebuilt", again);
    if gate > 0.0 {
        println!("  ledger mode / gate mode: {:.2}", ledger / gate);
    }
    println!(
        "  Redis killed → first order from MariaDB: {:.2} s",
        (first - t.killed).as_secs_f64()
    );
    println!(
        "  Redis restarted → product in gate mode: {:.2} s",
        (t.back - t.restarted).as_secs_f64()
    );
    println!(
        "  orders acknowledged: {}; 503s retried: {}",
        seen.orders.len(),
        seen.unknowns
    );
    if seen.refused.is_empty() {
        true
    } else {
        println!(
            "  FAILED: final answers other than an order: {:?}",
            seen.refused
        );
        false
    }
}

/// Every acknowledged request_id has its order, and there is no other order; then
/// `flashsale audit`.
async fn check(spawned: &server::Spawned, seen: &Seen, args: &Args) -> Result<bool, String> {
    /// Orders read from MariaDB per query.
    const PAGE: u64 = 10_000;
    let mut db = OrdersProbe::connect(&spawned.env.database_url).await?;
    let mut orders: BTreeMap<String, i64> = BTreeMap::new();
    let mut after = 0;
    loop {
        let page = db.orders_after(PRODUCT, after, PAGE).await?;
        let Some(&(last, _)) = page.last() else { break };
        after = last;
        orders.extend(page.into_iter().map(|(id, request_id)| (request_id, id)));
    }
    db.close().await;
    let mut passed = orders.len() == seen.orders.len();
    if !passed {
        println!(
            "  FAILED: {} orders in MariaDB, {} acknowledged",
            orders.len(),
            seen.orders.len()
        );
    }
    for o in &seen.orders {
        if orders.get(&o.request_id) != Some(&o.order_id) {
            println!(
                "  FAILED: acknowledged {} (order {}) is not in MariaDB",
                o.request_id, o.order_id
            );
            passed = false;
        }
    }
    if args.no_audit {
        return Ok(passed);
    }
    let audit = server::audit(&args.server_bin, &spawned.env, PRODUCT).await?;
    println!(
        "  flashsale audit: {}",
        if audit.passed { "passed" } else { "FAILED" }
    );
    if !audit.passed {
        println!("{}", audit.output);
    }
    Ok(passed && audit.passed)
}
