//! Every gate script run twice, on the real Redis: a client that retries after a lost
//! reply (Redis Cluster's does, on its own, after a failover or a timeout) runs a script
//! a second time with the very same keys and arguments. Each test runs one script's call
//! through the adapter, takes a snapshot of every key under the test's prefix, runs the
//! identical call again, and requires the second run to change nothing and to answer
//! consistently with the first. The benchmark baseline's `seed_decrement.lua` (the
//! seeds' plain decrement, not flashsale's path) is left out: it is not idempotent by
//! design.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test's failed expectation is its failure, with the expectation's message"
)]

use std::collections::BTreeMap;
use std::time::Duration;

use flashsale_app::ports::{Destock, GateMaintenance, RebuildPlan, Release, ReleaseOf};
use flashsale_app::ports::{Reserve, Restock, StockChange, StockGate};
use flashsale_core::{HoldRef, RequestId, UserId};
use flashsale_redis::{GateConfig, RedisGate};
use flashsale_testkit::{delete_prefix, redis_prefix};
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

mod common;

use common::{generation, product, purchase, REDIS_URL};

/// The test's key prefix and a connection of its own that reads what is under it.
struct World {
    prefix: String,
    conn: MultiplexedConnection,
}

impl World {
    async fn new() -> Self {
        let conn = common::connect(REDIS_URL).await;
        Self {
            prefix: redis_prefix(),
            conn,
        }
    }

    /// A new world and its [`gate`](Self::gate), with the product loaded with `units`
    /// in generation 1.
    async fn loaded(lease: Duration, units: i64) -> (Self, RedisGate) {
        let w = Self::new().await;
        let g = w.gate(lease);
        g.load(product(), units, generation(1)).await.expect("load");
        (w, g)
    }

    /// The adapter on this world's prefix, with a sold-out lease of `lease` (zero:
    /// none).
    fn gate(&self, lease: Duration) -> RedisGate {
        common::gate(REDIS_URL, &self.prefix, lease)
    }

    /// Every key under the prefix with its whole value, and whether it has a lifetime.
    async fn snapshot(&mut self) -> BTreeMap<String, String> {
        let keys: Vec<String> = self
            .conn
            .keys(format!("{}*", self.prefix))
            .await
            .expect("KEYS");
        let mut out = BTreeMap::new();
        for key in keys {
            let kind: String = redis::cmd("TYPE")
                .arg(&key)
                .query_async(&mut self.conn)
                .await
                .expect("TYPE");
            let value = match kind.as_str() {
                "hash" => {
                    let h: BTreeMap<String, String> =
                        self.conn.hgetall(&key).await.expect("HGETALL");
                    format!("{h:?}")
                }
                "zset" => {
                    let z: Vec<(String, f64)> = self
                        .conn
                        .zrange_withscores(&key, 0, -1)
                        .await
                        .expect("ZRANGE");
                    format!("{z:?}")
                }
                "string" => {
                    let s: String = self.conn.get(&key).await.expect("GET");
                    s
                }
                other => format!("<{other}>"),
            };
            let ttl: i64 = self.conn.pttl(&key).await.expect("PTTL");
            out.insert(key, format!("{value} ttl:{}", ttl >= 0));
        }
        out
    }

    async fn cleanup(self) {
        let _ = delete_prefix(REDIS_URL, &self.prefix).await;
    }
}

/// A `consistent` check for [`twice`]: both answers match the pattern.
macro_rules! both {
    ($pattern:pat) => {
        |a, b| matches!(a, $pattern) && matches!(b, $pattern)
    };
}

/// Runs `call` twice: the keys after the second run are the keys after the first, and
/// `consistent` accepts the two answers.
async fn twice<T, F, Fut>(w: &mut World, call: F, consistent: impl Fn(&T, &T) -> bool)
where
    T: std::fmt::Debug,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let first = call().await;
    let after_first = w.snapshot().await;
    let second = call().await;
    let after_second = w.snapshot().await;
    assert_eq!(after_first, after_second, "the second run changed Redis");
    assert!(
        consistent(&first, &second),
        "answers {first:?} then {second:?}"
    );
}

// Checks load.lua and reserve.lua twice: a second load of a loaded product changes
// nothing (false); a second reserve of the same request_id finds its hold (the same
// generation and id) and takes no unit; a second sold-out refusal under a lease keeps
// the lease as it was; a second refusal over a per-user limit writes nothing.
#[tokio::test]
async fn load_and_reserve_twice_change_nothing() {
    let mut w = World::new().await;
    let g = w.gate(Duration::from_secs(30));
    twice(
        &mut w,
        || g.load(product(), 2, generation(1)),
        |a, b| matches!((a, b), (Ok(true), Ok(false))),
    )
    .await;
    let a = purchase("TW_A", 1);
    twice(
        &mut w,
        || g.reserve(&a, Some(1)),
        |first, second| match (first, second) {
            (Ok(Reserve::Reserved { hold }), Ok(Reserve::Existing(existing))) => {
                existing.hold == *hold && !existing.released
            }
            _ => false,
        },
    )
    .await;
    let over = purchase("TW_O", 1);
    twice(
        &mut w,
        || g.reserve(&over, Some(1)),
        both!(Ok(Reserve::LimitExceeded { .. })),
    )
    .await;
    g.reserve(&purchase("TW_B", 2), None)
        .await
        .expect("the last unit");
    let late = purchase("TW_C", 3);
    twice(
        &mut w,
        || g.reserve(&late, None),
        both!(Ok(Reserve::SoldOut { .. })),
    )
    .await;
    w.cleanup().await;
}

// Checks release.lua, restock.lua, adjust.lua and forget.lua twice: a second release of
// a hold answers AlreadyReleased and gives no unit back again; a second restock with
// its id answers AlreadyApplied and adds nothing; a second adjustment from the same
// measured count is refused; a second forget of a committed hold removes nothing more.
#[tokio::test]
async fn release_restock_adjust_and_forget_twice_change_nothing() {
    let (mut w, g) = World::loaded(Duration::ZERO, 5).await;
    let a = purchase("TW_R", 1);
    let Reserve::Reserved { hold } = g.reserve(&a, None).await.expect("reserve") else {
        panic!("a hold")
    };
    let of = ReleaseOf::Hold { hold };
    twice(
        &mut w,
        || g.release(product(), &a.request_id, &of),
        |x, y| {
            matches!(
                (x, y),
                (Ok(Release::Released), Ok(Release::AlreadyReleased))
            )
        },
    )
    .await;
    let restock_id = RequestId::parse("request_id", "TW_RS").expect("id");
    let restock = StockChange::new(product(), restock_id, 3, generation(1));
    twice(
        &mut w,
        || g.restock(&restock),
        |x, y| matches!((x, y), (Ok(Restock::Applied), Ok(Restock::AlreadyApplied))),
    )
    .await;
    let looked = g
        .facts(product())
        .await
        .expect("facts")
        .count()
        .expect("a count");
    twice(
        &mut w,
        || g.adjust(product(), &looked, -1),
        |x, y| matches!((x, y), (Ok(true), Ok(false))),
    )
    .await;
    let b = purchase("TW_F", 2);
    g.reserve(&b, None).await.expect("reserve");
    // Aged on Redis's clock, in whole milliseconds.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let stale = g
        .stale_holds(product(), Duration::from_millis(1), 10)
        .await
        .expect("stale holds");
    assert!(!stale.is_empty());
    twice(
        &mut w,
        || g.forget_pending(product(), &stale),
        |x, y| x.is_ok() && y.is_ok(),
    )
    .await;
    w.cleanup().await;
}

// Checks rebuild.lua and retire.lua twice, and the reading scripts (state.lua,
// holders.lua, the facts): a second rebuild to the same generation is refused and
// changes nothing; a second retire finds the entry retired already; reading twice
// answers the same and writes nothing.
#[tokio::test]
async fn rebuild_retire_and_the_reads_twice_change_nothing() {
    let (mut w, g) = World::loaded(Duration::from_secs(30), 2).await;
    g.reserve(&purchase("TW_H", 1), None)
        .await
        .expect("reserve");
    let plan = RebuildPlan {
        generation: generation(2),
        available: 4,
        last_hold_id: 3,
        user_units: vec![(UserId::parse(1).expect("user"), 1)],
    };
    twice(
        &mut w,
        || g.rebuild(product(), &plan),
        |x, y| matches!((x, y), (Ok(true), Ok(false))),
    )
    .await;
    twice(
        &mut w,
        || g.retire(product()),
        |x, y| matches!((x, y), (Ok(true), Ok(true))),
    )
    .await;
    g.reserve(&purchase("TW_S", 2), None)
        .await
        .expect("reserve");
    twice(
        &mut w,
        || g.state(product()),
        |x, y| format!("{x:?}") == format!("{y:?}"),
    )
    .await;
    twice(
        &mut w,
        || g.pending_request_ids(product(), 10),
        |x, y| format!("{x:?}") == format!("{y:?}"),
    )
    .await;
    twice(
        &mut w,
        || g.facts(product()),
        |x, y| match (x, y) {
            (Ok(a), Ok(b)) => a.available == b.available && a.held == b.held,
            _ => false,
        },
    )
    .await;
    let hold = HoldRef::from_stored(2, 4).expect("hold");
    assert_eq!(
        g.state(product())
            .await
            .expect("state")
            .map(|s| (s.generation, s.last_hold_id)),
        Some((hold.generation, hold.id.get()))
    );
    w.cleanup().await;
}

// Checks destock.lua twice: a second destock with its id answers Taken again and takes
// nothing more; a second refused one (more than is left) answers Refused again; neither
// run changes Redis after the first.
#[tokio::test]
async fn destock_twice_changes_nothing() {
    let (mut w, g) = World::loaded(Duration::ZERO, 5).await;
    let taken = RequestId::parse("request_id", "TW_DS").expect("id");
    let taken = StockChange::new(product(), taken, 3, generation(1));
    twice(&mut w, || g.destock(&taken), both!(Ok(Destock::Taken))).await;
    let refused = RequestId::parse("request_id", "TW_DS_2").expect("id");
    let refused = StockChange::new(product(), refused, 3, generation(1));
    twice(&mut w, || g.destock(&refused), both!(Ok(Destock::Refused))).await;
    assert_eq!(g.available(product()).await.expect("available"), Some(2));
    w.cleanup().await;
}

// Checks adopt.lua twice: an entry stamped by another Redis process is taken over once
// (its stamp becomes this process's), and the same call again answers "adopted" and
// changes nothing. The script is called directly: on one Redis the adapter never calls
// it, as no other primary can vouch for the writer.
#[tokio::test]
async fn adopt_twice_changes_nothing() {
    let (mut w, g) = World::loaded(Duration::ZERO, 2).await;
    let inv = format!("{}{{p:1}}:inv", w.prefix);
    let _: () = w.conn.hset(&inv, "srv", "feed:beef").await.expect("HSET");
    let adopt = redis::Script::new(flashsale_redis::calls::ADOPT.source);
    let conn = w.conn.clone();
    twice(
        &mut w,
        || {
            let mut conn = conn.clone();
            let adopt = &adopt;
            let inv = inv.clone();
            async move {
                adopt
                    .key(&inv)
                    .arg("feed:beef")
                    .invoke_async::<i64>(&mut conn)
                    .await
                    .expect("adopt.lua")
            }
        },
        |x, y| (*x, *y) == (1, 1),
    )
    .await;
    let state = g.state(product()).await.expect("state").expect("entry");
    assert!(!state.server_changed, "the entry is this process's now");
    w.cleanup().await;
}

// Checks reserve.lua twice with the shared per-user rate on (1 a second, a burst of 1):
// the same granted purchase again finds its hold and is not charged a second time; the
// same refused purchase again (over the rate) is refused again and writes nothing; each
// run of either leaves Redis as the first left it.
#[tokio::test]
async fn reserve_with_the_shared_rate_twice_changes_nothing() {
    let mut w = World::new().await;
    let g = RedisGate::new(&GateConfig {
        shared_user_rate: Some(flashsale_app::limit::Rate {
            per_second: 1,
            burst: 1,
        }),
        ..common::config(REDIS_URL, &w.prefix, Duration::ZERO)
    })
    .expect("gate");
    g.load(product(), 5, generation(1)).await.expect("load");
    let (a, b) = (purchase("TW_RATE_A", 9), purchase("TW_RATE_B", 9));
    twice(
        &mut w,
        || g.reserve(&a, None),
        |x, y| {
            matches!((x, y), (Ok(Reserve::Reserved { hold }), Ok(Reserve::Existing(e))) if e.hold == *hold)
        },
    )
    .await;
    twice(
        &mut w,
        || g.reserve(&b, None),
        both!(Ok(Reserve::RateLimited { .. })),
    )
    .await;
    w.cleanup().await;
}
