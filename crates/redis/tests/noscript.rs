//! The gate on a Redis that does not know its scripts: a fresh private Redis (its script
//! cache empty), then the same Redis after `SCRIPT FLUSH` (as after a restart, or a
//! failover to a node that never ran them). Every call must answer as on a Redis that
//! had them: the gate loads a script when Redis answers NOSCRIPT and sends the call
//! again. The test counts Redis's own `SCRIPT LOAD` calls (`INFO commandstats`), so it
//! fails if the calls never met NOSCRIPT as well as if a load went missing.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test's failed expectation is its failure, with the expectation's message"
)]

mod common;

use std::time::Duration;

use flashsale_app::ports::{Reserve, StockGate};
use flashsale_redis::RedisGate;
use flashsale_testkit::{redis_prefix, PrivateRedis};
use redis::aio::MultiplexedConnection;

use common::{generation, product, purchase};

/// How many times Redis ran `SCRIPT LOAD`.
async fn script_loads(conn: &mut MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO");
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_script|load:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a count"))
}

async fn reserved(gate: &RedisGate, id: &str, user: i64) {
    let answer = gate.reserve(&purchase(id, user), None).await;
    assert!(
        matches!(answer, Ok(Reserve::Reserved { .. })),
        "{id}: {answer:?}"
    );
}

#[tokio::test]
async fn scripts_unknown_to_redis_are_loaded_and_the_call_sent_again() {
    let redis = PrivateRedis::start().await.expect("a private redis-server");
    let mut conn = common::connect(&redis.url()).await;
    let gate = common::gate(&redis.url(), &redis_prefix(), Duration::ZERO);
    assert_eq!(script_loads(&mut conn).await, 0, "a fresh Redis");

    // A fresh Redis: each script's first call meets NOSCRIPT once.
    let loaded = gate.load(product(), 10, generation(1)).await;
    assert!(matches!(loaded, Ok(true)), "{loaded:?}");
    reserved(&gate, "NS_A", 1).await;
    reserved(&gate, "NS_B", 2).await;
    assert_eq!(script_loads(&mut conn).await, 2, "load.lua and reserve.lua");

    // The cache flushed: the next call loads its script again and goes through.
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .expect("SCRIPT FLUSH");
    reserved(&gate, "NS_C", 3).await;
    assert_eq!(script_loads(&mut conn).await, 3, "reserve.lua again");
    assert_eq!(
        gate.available(product()).await.expect("available"),
        Some(7),
        "three units taken, each once"
    );
}
