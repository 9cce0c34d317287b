//! The gate's Lua scripts called directly on the real Redis, with batches the adapter's
//! coalescer makes only by chance: the same request_id twice in one call, and several
//! purchases whose counters the script writes once for the whole batch.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test's failed expectation is its failure, with the expectation's message"
)]

mod common;

use common::REDIS_URL;
use flashsale_testkit::{delete_prefix, redis_prefix};
use redis::aio::MultiplexedConnection;
use redis::{AsyncCommands, Script, Value};
/// Hold records' lifetime in these calls.
const TTL_MS: u64 = 60_000;

struct Keys {
    prefix: String,
    inv: String,
    users: String,
    pending: String,
}

impl Keys {
    fn new() -> Self {
        let prefix = redis_prefix();
        Self {
            inv: format!("{prefix}p:1:inv"),
            users: format!("{prefix}p:1:users"),
            pending: format!("{prefix}p:1:pending"),
            prefix,
        }
    }

    fn record(&self, request_id: &str) -> String {
        format!("{}p:1:r:{request_id}", self.prefix)
    }

    /// Deletes every key under the prefix.
    async fn cleanup(&self) {
        delete_prefix(REDIS_URL, &self.prefix)
            .await
            .expect("cleanup");
    }
}

/// A connection, and new keys whose stock entry holds the fields `inv`.
async fn seeded(inv: &[(&str, i64)]) -> (MultiplexedConnection, Keys) {
    let mut conn = connect().await;
    let keys = Keys::new();
    let _: () = conn.hset_multiple(&keys.inv, inv).await.expect("seed");
    (conn, keys)
}

async fn connect() -> MultiplexedConnection {
    common::connect(REDIS_URL).await
}

/// One reserve.lua call for `purchases` (request_id, user, quantity, per-user limit):
/// each purchase's reply as its fields.
async fn reserve(
    conn: &mut MultiplexedConnection,
    keys: &Keys,
    purchases: &[(&str, i64, i64, i64)],
) -> Vec<Vec<String>> {
    let script = Script::new(flashsale_redis::calls::RESERVE.source);
    let mut call = script.prepare_invoke();
    call.key(&keys.inv).key(&keys.users).key(&keys.pending);
    for (rid, ..) in purchases {
        call.key(keys.record(rid));
    }
    call.arg(TTL_MS).arg(0).arg(0).arg(0);
    for (rid, user, q, limit) in purchases {
        call.arg(q).arg(user).arg(limit).arg(*rid);
    }
    let reply: Value = call.invoke_async(conn).await.expect("reserve.lua");
    replies(&reply)
}

async fn hmget(
    conn: &mut MultiplexedConnection,
    key: &str,
    fields: &[&str],
) -> Vec<Option<String>> {
    redis::cmd("HMGET")
        .arg(key)
        .arg(fields)
        .query_async(conn)
        .await
        .expect("HMGET")
}

/// The script's one string read as the adapter reads it: replies joined by ' ', each
/// reply's fields by ','.
fn replies(v: &Value) -> Vec<Vec<String>> {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b)
            .split(' ')
            .map(|reply| reply.split(',').map(str::to_owned).collect())
            .collect(),
        other => panic!("not one string: {other:?}"),
    }
}

// Checks one call holding the same request_id twice (a client retry queued beside its
// first attempt): the first copy gets hold 1, the second finds that very hold (reply 2
// with the first copy's user and quantity), and the counters, the per-user count and the
// pending index move once, not twice. Then a second call: a new purchase gets hold 2.
#[tokio::test]
async fn a_request_id_twice_in_one_call_holds_once() {
    let (mut conn, keys) = seeded(&[("avail", 10), ("gen", 1), ("seq", 0)]).await;
    let replies = reserve(&mut conn, &keys, &[("a", 7, 2, 3), ("a", 7, 2, 3)]).await;
    assert_eq!(replies[0], ["1", "1", "1"]);
    assert_eq!(replies[1], ["2", "1", "7", "2", "0", "1"]);
    let inv = hmget(&mut conn, &keys.inv, &["avail", "seq"]).await;
    assert_eq!(inv, [Some("8".into()), Some("1".into())]);
    let held: i64 = conn.hget(&keys.users, "7").await.expect("users");
    assert_eq!(held, 2);
    let pending: i64 = conn.zcard(&keys.pending).await.expect("pending");
    assert_eq!(pending, 1);

    let replies = reserve(&mut conn, &keys, &[("b", 8, 1, 0)]).await;
    assert_eq!(replies[0], ["1", "2", "1"]);
    keys.cleanup().await;
}

// Checks a mixed batch against what one-at-a-time calls would answer: hold ids count up
// in batch order, a user's second purchase past the limit is refused (reply -2) while
// the first counts, a purchase larger than what is left is refused as sold out, and the
// entry's `avail` and `seq`, the per-user counts and the records end as the granted
// purchases alone make them. A record from an older generation is replaced whole (a
// field the new record does not write is gone).
#[tokio::test]
async fn a_batch_writes_its_counters_once_as_if_one_at_a_time() {
    let (mut conn, keys) = seeded(&[("avail", 5), ("gen", 2), ("seq", 10)]).await;
    let _: () = conn
        .hset_multiple(
            keys.record("old"),
            &[
                ("u", "9"),
                ("q", "4"),
                ("s", "h"),
                ("h", "3"),
                ("g", "1"),
                ("z", "left over"),
            ],
        )
        .await
        .expect("old record");
    let replies = reserve(
        &mut conn,
        &keys,
        &[
            ("u1-a", 1, 2, 2),
            ("u1-b", 1, 1, 2),
            ("u2-a", 2, 1, 0),
            ("big", 3, 5, 0),
            ("old", 9, 2, 0),
        ],
    )
    .await;
    assert_eq!(replies[0], ["1", "11", "2"]);
    assert_eq!(replies[1][0], "-2");
    assert_eq!(replies[2], ["1", "12", "2"]);
    assert_eq!(replies[3][0], "0");
    assert_eq!(replies[4], ["1", "13", "2"]);
    let inv = hmget(&mut conn, &keys.inv, &["avail", "seq"]).await;
    assert_eq!(inv, [Some("0".into()), Some("13".into())]);
    let held: Option<i64> = conn.hget(&keys.users, "1").await.expect("users");
    assert_eq!(held, Some(2));
    let unlimited: Option<i64> = conn.hget(&keys.users, "2").await.expect("users");
    assert_eq!(unlimited, None, "purchases without a limit are not counted");
    let old = hmget(&mut conn, &keys.record("old"), &["u", "q", "h", "g"]).await;
    assert_eq!(
        old,
        [
            Some("9".into()),
            Some("2".into()),
            Some("13".into()),
            Some("2".into())
        ]
    );
    let kept: bool = conn
        .hexists(keys.record("old"), "z")
        .await
        .expect("hexists");
    assert!(!kept, "the older generation's record is replaced whole");
    let ttl: i64 = conn.pttl(keys.record("old")).await.expect("pttl");
    assert!(ttl > 0 && ttl <= TTL_MS as i64, "record lifetime {ttl}");
    let mut members: Vec<String> = conn.zrange(&keys.pending, 0, -1).await.expect("pending");
    members.sort();
    assert_eq!(members, ["old", "u1-a", "u2-a"]);
    keys.cleanup().await;
}

// Checks forget.lua's one ZREM: of three committed holds, the one whose record now holds
// a later hold keeps its pending entry; the one whose record is gone and the one whose
// record is still that hold leave the index; the count says two.
#[tokio::test]
async fn forget_removes_only_holds_still_recorded_as_themselves() {
    let mut conn = connect().await;
    let keys = Keys::new();
    let _: () = conn
        .zadd_multiple(&keys.pending, &[(1, "same"), (2, "later"), (3, "gone")])
        .await
        .expect("pending");
    let _: () = conn
        .hset_multiple(keys.record("same"), &[("h", "4"), ("g", "1")])
        .await
        .expect("record");
    let _: () = conn
        .hset_multiple(keys.record("later"), &[("h", "9"), ("g", "1")])
        .await
        .expect("record");
    let script = Script::new(flashsale_redis::calls::FORGET.source);
    let mut call = script.prepare_invoke();
    call.key(&keys.pending);
    for (rid, hold) in [("same", 4), ("later", 5), ("gone", 6)] {
        call.key(keys.record(rid)).arg(rid).arg(hold).arg(1);
    }
    let removed: i64 = call.invoke_async(&mut conn).await.expect("forget.lua");
    assert_eq!(removed, 2);
    let left: Vec<String> = conn.zrange(&keys.pending, 0, -1).await.expect("pending");
    assert_eq!(left, ["later"]);
    keys.cleanup().await;
}

// Checks adjust.lua (reconciliation's repair) against the revocation rule every script
// that adds units follows: with a subscriber on the test's channel and a lease in the
// entry, a negative delta leaves the lease and publishes nothing; a positive one deletes
// the lease and publishes `<product>:<generation>`; a second positive one, with no lease
// left, publishes nothing more.
#[tokio::test]
async fn adding_units_ends_the_lease_and_publishes_a_revocation() {
    use futures::StreamExt;
    let mut conn = connect().await;
    let keys = Keys::new();
    let channel = format!("{}lease:revoked", keys.prefix);
    let mut pubsub = redis::Client::open(REDIS_URL)
        .expect("redis url")
        .get_async_pubsub()
        .await
        .expect("pubsub");
    pubsub.subscribe(&channel).await.expect("subscribe");
    let _: () = conn
        .hset_multiple(&keys.inv, &[("avail", "1"), ("gen", "3"), ("lease", "1")])
        .await
        .expect("entry");
    let script = Script::new(flashsale_redis::calls::ADJUST.source);
    let adjust = |from: i64, delta: i64| {
        let mut call = script.prepare_invoke();
        call.key(&keys.inv)
            .arg(delta)
            .arg(&channel)
            .arg(7)
            .arg(from)
            .arg(3)
            .arg(0);
        call
    };
    let code: i64 = adjust(1, -1).invoke_async(&mut conn).await.expect("adjust");
    assert_eq!(code, 1);
    assert_eq!(
        hmget(&mut conn, &keys.inv, &["lease"]).await,
        [Some("1".into())]
    );
    for from in [0, 2] {
        let code: i64 = adjust(from, 2)
            .invoke_async(&mut conn)
            .await
            .expect("adjust");
        assert_eq!(code, 1);
    }
    assert_eq!(
        hmget(&mut conn, &keys.inv, &["avail", "lease"]).await,
        [Some("4".into()), None]
    );
    // A marker after the revocation: had either other call published, it would come first.
    let _: i64 = conn.publish(&channel, "marker").await.expect("publish");
    let mut messages = pubsub.on_message();
    let payloads: Vec<String> = [
        messages.next().await.expect("message"),
        messages.next().await.expect("message"),
    ]
    .iter()
    .map(|m| m.get_payload::<String>().expect("payload"))
    .collect();
    assert_eq!(payloads, ["7:3", "marker"]);
    drop(messages);
    keys.cleanup().await;
}

// Checks that an entry another Redis process wrote (its `srv` stamp is not this
// process's: a restart, a failover, a migrated slot) changes only once adopted or
// rebuilt: reserve answers "not rebuilt", release, restock and the repair answer "not
// loaded" and leave every key as it was; adopt.lua refuses a stamp that is not the
// entry's; after the adoption a release goes through. Drives the adapter on the shared
// Redis, plus direct script calls for the stamp.
#[tokio::test]
async fn a_foreign_entry_changes_only_once_adopted() {
    use flashsale_app::ports::{
        GateMaintenance, Release, ReleaseOf, Reserve, Restock, StockChange, StockGate,
    };
    use flashsale_core::RequestId;
    let (prefix, gate) = common::shared_gate();
    let product = common::product();
    let g1 = common::generation(1);
    let buy = |id: &str| common::purchase(id, 7);
    gate.load(product, 5, g1).await.expect("load");
    let Reserve::Reserved { hold } = gate.reserve(&buy("F1"), None).await.expect("reserve") else {
        panic!("a loaded product grants a hold");
    };
    let mut conn = connect().await;
    let inv = format!("{prefix}{{p:1}}:inv");
    let mine: String = conn.hget(&inv, "srv").await.expect("HGET");
    let _: () = conn.hset(&inv, "srv", "feed:beef").await.expect("HSET");
    let before: Vec<(String, String)> = conn.hgetall(&inv).await.expect("HGETALL");

    assert_eq!(
        gate.reserve(&buy("F2"), None).await.expect("reserve"),
        Reserve::NotRebuilt
    );
    let release = gate
        .release(product, &buy("F1").request_id, &ReleaseOf::Hold { hold })
        .await
        .expect("release");
    assert_eq!(release, Release::NotLoaded);
    let restock = gate
        .restock(&StockChange::new(
            product,
            RequestId::parse("restock", "R1").expect("id"),
            3,
            g1,
        ))
        .await
        .expect("restock");
    assert_eq!(restock, Restock::NotLoaded);
    let at = flashsale_app::ports::GateCount {
        generation: g1,
        available: 4,
        last_hold_id: 0,
    };
    assert!(!gate.adjust(product, &at, 1).await.expect("adjust"));
    let after: Vec<(String, String)> = conn.hgetall(&inv).await.expect("HGETALL");
    assert_eq!(before, after, "nothing changed the foreign entry");
    assert!(
        gate.state(product)
            .await
            .expect("state")
            .expect("entry")
            .server_changed
    );

    let adopt = Script::new(flashsale_redis::calls::ADOPT.source);
    for (stamp, answer, why) in [
        (
            "another:writer",
            0,
            "a stamp that is not the entry's is not adopted",
        ),
        ("feed:beef", 1, "the entry's own stamp is adopted"),
    ] {
        let got: i64 = adopt
            .key(&inv)
            .arg(stamp)
            .invoke_async(&mut conn)
            .await
            .expect("adopt");
        assert_eq!(got, answer, "{why}");
    }
    let now: String = conn.hget(&inv, "srv").await.expect("HGET");
    assert_eq!(
        now, mine,
        "the stamp is the serving process's, run_id:replid"
    );
    assert!(mine.contains(':'), "{mine}");
    assert_eq!(
        gate.release(product, &buy("F1").request_id, &ReleaseOf::Hold { hold })
            .await
            .expect("release"),
        Release::Released
    );
    let _ = delete_prefix(REDIS_URL, &prefix).await;
}

// Checks that a hold record's lifetime is checked before anything is written: reserve.lua
// given a lifetime that is not whole milliseconds (1.5) or past its bound (10^17 ms,
// which would reach PEXPIRE in exponent form) answers an error and leaves the count, the
// per-user counts, the pending index and the record as they were; release.lua refuses
// the same lifetimes for its marker with the hold's units still out; load.lua refuses
// them and loads nothing. The bound itself (10^13 ms) is accepted.
#[tokio::test]
async fn a_record_lifetime_is_checked_before_any_write() {
    let (mut conn, keys) = seeded(&[("avail", 5), ("gen", 1), ("seq", 0)]).await;
    let script = Script::new(flashsale_redis::calls::RESERVE.source);
    let reserve_for = |ttl: &'static str| {
        let mut call = script.prepare_invoke();
        call.key(&keys.inv)
            .key(&keys.users)
            .key(&keys.pending)
            .key(keys.record("R_ttl"));
        call.arg(ttl).arg(0).arg(0).arg(0);
        call.arg(1).arg(7).arg(0).arg("R_ttl");
        call
    };
    for ttl in ["1.5", "100000000000000000"] {
        let refused: redis::RedisResult<Value> = reserve_for(ttl).invoke_async(&mut conn).await;
        let e = refused.expect_err("refused");
        assert!(format!("{e}").contains("invalid arguments"), "{ttl}: {e}");
    }
    assert_eq!(
        hmget(&mut conn, &keys.inv, &["avail", "seq"]).await,
        [Some("5".into()), Some("0".into())]
    );
    let untouched: (bool, bool, i64) = redis::pipe()
        .exists(&keys.users)
        .exists(keys.record("R_ttl"))
        .zcard(&keys.pending)
        .query_async(&mut conn)
        .await
        .expect("read");
    assert_eq!(untouched, (false, false, 0), "nothing written");
    let held: Value = reserve_for("10000000000000")
        .invoke_async(&mut conn)
        .await
        .expect("the bound itself is accepted");
    assert_eq!(replies(&held)[0][0], "1", "a hold");

    let release = Script::new(flashsale_redis::calls::RELEASE.source);
    for ttl in ["1.5", "100000000000000000"] {
        let mut call = release.prepare_invoke();
        call.key(&keys.inv)
            .key(&keys.users)
            .key(keys.record("R_ttl"))
            .key(&keys.pending)
            .key(format!("{}p:1:released:R_ttl", keys.prefix));
        call.arg("R_ttl")
            .arg(1)
            .arg(7)
            .arg(1)
            .arg(0)
            .arg(ttl)
            .arg(1)
            .arg(1)
            .arg("ch")
            .arg(0)
            .arg(1);
        let refused: redis::RedisResult<Value> = call.invoke_async(&mut conn).await;
        let e = refused.expect_err("refused");
        assert!(format!("{e}").contains("invalid arguments"), "{ttl}: {e}");
    }
    assert_eq!(
        hmget(&mut conn, &keys.inv, &["avail"]).await,
        [Some("4".into())],
        "the unit still out"
    );

    let load = Script::new(flashsale_redis::calls::LOAD.source);
    let fresh = format!("{}p:2:inv", keys.prefix);
    for ttl in ["1.5", "100000000000000000"] {
        let refused: redis::RedisResult<Value> = load
            .key(&fresh)
            .arg(5)
            .arg(1)
            .arg(ttl)
            .arg(1)
            .invoke_async(&mut conn)
            .await;
        assert!(refused.is_err(), "{ttl}");
    }
    let loaded: bool = conn.exists(&fresh).await.expect("EXISTS");
    assert!(!loaded, "nothing loaded");
    let _ = delete_prefix(REDIS_URL, &keys.prefix).await;
}

// Checks destock.lua through the adapter on the shared Redis: on 5 available with one
// hold of 1 (4 left), 3 are taken (1 left, the hold untouched); the same destock again
// answers taken and takes nothing more; 2 more are refused and the count stays; the
// refusal, too, answers the same again. A destock of another generation: an older one
// is stale, a newer one "not loaded" (the rebuild has not landed). After a rebuild into
// generation 2 (which counts from the ledger, without the destock), the same destock id
// in generation 2 takes again: the marker of generation 1 no longer answers. An entry
// another Redis process wrote is refused ("not loaded") and left as it was; bad
// arguments are an error before any write.
#[tokio::test]
async fn a_destock_takes_only_available_units_once_per_generation() {
    use flashsale_app::ports::{Destock, StockChange, StockGate};
    use flashsale_core::RequestId;
    let (prefix, gate) = common::shared_gate();
    let product = common::product();
    let (g1, g2) = (common::generation(1), common::generation(2));
    let id = |s: &str| RequestId::parse("destock", s).expect("id");
    gate.load(product, 5, g1).await.expect("load");
    gate.reserve(&common::purchase("H1", 7), None)
        .await
        .expect("reserve");
    // (destock, units, generation, its answer, the units left after it where checked):
    // each again answers the same; D3's generation is newer, its rebuild not landed.
    let steps = [
        ("D1", 3, g1, Destock::Taken, None),
        ("D1", 3, g1, Destock::Taken, Some(1)),
        ("D2", 2, g1, Destock::Refused, None),
        ("D2", 2, g1, Destock::Refused, Some(1)),
        ("D3", 1, g2, Destock::NotLoaded, None),
    ];
    for (step, (destock, units, generation, answer, left)) in steps.into_iter().enumerate() {
        let got = gate
            .destock(&StockChange::new(product, id(destock), units, generation))
            .await
            .expect("destock");
        assert_eq!(got, answer, "step {step}: {destock}");
        if let Some(left) = left {
            assert_eq!(gate.available(product).await.expect("avail"), Some(left));
        }
    }

    let mut conn = connect().await;
    let inv = format!("{prefix}{{p:1}}:inv");
    let _: () = conn.hset(&inv, "gen", 2).await.expect("HSET");
    let _: () = conn.hset(&inv, "avail", 4).await.expect("HSET");
    let stale = gate
        .destock(&StockChange::new(product, id("D1"), 3, g1))
        .await
        .expect("stale");
    assert_eq!(stale, Destock::Stale, "a rebuild since counted without it");
    let retaken = gate
        .destock(&StockChange::new(product, id("D1"), 3, g2))
        .await
        .expect("g2");
    assert_eq!(retaken, Destock::Taken, "taken again in the new generation");
    assert_eq!(gate.available(product).await.expect("avail"), Some(1));

    let _: () = conn.hset(&inv, "srv", "feed:beef").await.expect("HSET");
    let before: Vec<(String, String)> = conn.hgetall(&inv).await.expect("HGETALL");
    let foreign = gate
        .destock(&StockChange::new(product, id("D4"), 1, g2))
        .await
        .expect("foreign");
    assert_eq!(foreign, Destock::NotLoaded);
    let after: Vec<(String, String)> = conn.hgetall(&inv).await.expect("HGETALL");
    assert_eq!(before, after, "nothing changed the foreign entry");
    let script = Script::new(flashsale_redis::calls::DESTOCK.source);
    let marker = format!("{prefix}{{p:1}}:destock:D5");
    for (quantity, generation) in [("0", "2"), ("1.5", "2"), ("1", "x")] {
        let bad: Result<i64, _> = script
            .key(&inv)
            .key(&marker)
            .arg(quantity)
            .arg(generation)
            .invoke_async(&mut conn)
            .await;
        assert!(bad.is_err(), "{quantity} {generation}");
    }
    let marked: bool = conn.exists(&marker).await.expect("EXISTS");
    assert!(!marked, "nothing written");
    let _ = delete_prefix(REDIS_URL, &prefix).await;
}

/// Every key under `prefix`, sorted.
async fn keys_under(conn: &mut MultiplexedConnection, prefix: &str) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(conn)
        .await
        .expect("KEYS");
    keys.sort();
    keys
}

// Checks retire_sale.lua and retire_keys.lua through the adapter: a product sold in
// generation 1 (a hold H1, a restock marker R1) and then rebuilt in generation 3 (as a
// reload after a retirement of generation 1 whose gate step came late), with a hold H2 of
// generation 3. Retiring generation 1 keeps the newer entry, its hold H2 and the marker
// (it may be the new life's) and deletes only H1's record; retiring generation 3 then
// deletes every key of the product. How: KEYS under the test's prefix after each step.
#[tokio::test]
async fn a_retirement_spares_a_newer_entry_and_then_deletes_everything() {
    use flashsale_app::ports::{GateMaintenance, RebuildPlan, StockChange, StockGate};
    use flashsale_app::SaleRetirementGate;
    use flashsale_core::RequestId;
    let (prefix, gate) = common::shared_gate();
    let product = common::product();
    let (g1, g3) = (common::generation(1), common::generation(3));
    gate.load(product, 5, g1).await.expect("load");
    gate.reserve(&common::purchase("H1", 7), None)
        .await
        .expect("reserve");
    let restock = RequestId::parse("restock", "R1").expect("id");
    gate.restock(&StockChange::new(product, restock, 1, g1))
        .await
        .expect("restock");
    let plan = RebuildPlan {
        generation: g3,
        available: 5,
        last_hold_id: 1,
        user_units: vec![],
    };
    assert!(gate.rebuild(product, &plan).await.expect("rebuild"));
    gate.reserve(&common::purchase("H2", 8), None)
        .await
        .expect("reserve");
    let mut conn = connect().await;
    let key = |suffix: &str| format!("{prefix}{{p:1}}:{suffix}");

    let done = gate.retire_sale(product, g1).await.expect("retire g1");
    assert!(!done.entry_deleted, "the entry of generation 3 is kept");
    assert_eq!(done.keys_deleted, 1, "H1's record only");
    let left = keys_under(&mut conn, &prefix).await;
    assert!(!left.contains(&key("r:H1")), "{left:?}");
    for kept in ["inv", "pending", "r:H2", "restock:R1"] {
        assert!(left.contains(&key(kept)), "{kept} in {left:?}");
    }

    let done = gate.retire_sale(product, g3).await.expect("retire g3");
    assert!(done.entry_deleted);
    assert_eq!(keys_under(&mut conn, &prefix).await, Vec::<String>::new());
    let _ = delete_prefix(REDIS_URL, &prefix).await;
}
