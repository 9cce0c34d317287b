//! Sold-out leases: once a product has no unit left, Redis grants no hold for a while
//! (the lease), and an instance that heard the lease answers `sold_out` itself to every
//! request_id that never held units of the product — without a Redis call — while
//! replays of real purchases still get their orders. Units that come back (a restock, a
//! cancel, a rebuild) revoke the lease on every instance at once rather than wait it out.

use std::time::{Duration, Instant};

use flashsale_testkit::PrivateRedis;
use reqwest::StatusCode;

use crate::helpers::{
    cleanup_all, code, order_id, redis_info, wait_until, Routes, TestApp, SOLD_OUT,
};
use crate::invariants;

/// The longest lease there is, for the tests of revocation: a purchase that succeeds
/// well inside it succeeded because the lease was revoked, not because it ran out.
pub(crate) const LONG_LEASE: &str = "5s";
/// Units that came back must be bought within this, on every instance: half the long
/// lease, of which an instance trusts 90 %. Revocation takes milliseconds (printed).
const REVOKED_WITHIN: Duration = Duration::from_millis(2_500);
/// Pause between a poller's purchases.
const POLL_PAUSE: Duration = Duration::from_millis(5);

/// Retries a fresh purchase (a new request_id each time) on `app` until it is sold, for
/// at most [`REVOKED_WITHIN`]; every other answer must be `sold_out`. Returns how long
/// it took, or None if nothing sold in that time.
pub(crate) async fn buy_within(app: &TestApp, product: i64, user: i64) -> Option<Duration> {
    let start = Instant::now();
    let mut i = 0;
    while start.elapsed() < REVOKED_WITHIN {
        i += 1;
        let (s, b) = app
            .purchase(&format!("REQ_after_{user}_{i}"), user, product, 1)
            .await;
        if s == StatusCode::CREATED {
            return Some(start.elapsed());
        }
        assert_eq!((s, code(&b)), (StatusCode::CONFLICT, "sold_out"), "{b}");
        tokio::time::sleep(POLL_PAUSE).await;
    }
    None
}

/// Waits until `n` instances listen for lease revocations on this test's prefix, so a
/// lease heard afterwards is trusted (the server subscribes before it serves, but the
/// check keeps the tests honest about it).
async fn wait_for_listeners(app: &TestApp, n: i64) {
    let channel = format!("{}lease:revoked", app.prefix);
    wait_until("instances subscribed", Duration::from_secs(10), || {
        let mut conn = app.redis.clone();
        let channel = channel.clone();
        async move {
            let (_, count): (String, i64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&channel)
                .query_async(&mut conn)
                .await
                .expect("PUBSUB NUMSUB");
            count == n
        }
    })
    .await;
}

/// Whether Redis holds a sold-out lease for the product (ending in the future).
async fn lease_in_redis(app: &TestApp, product: i64) -> bool {
    let lease: Option<i64> = app.entry_field(product, "lease").await;
    let mut conn = app.redis.clone();
    let (secs, micros): (i64, i64) = redis::cmd("TIME")
        .query_async(&mut conn)
        .await
        .expect("time");
    lease.is_some_and(|until| until > secs * 1000 + micros / 1000)
}

/// Scripts Redis has run (EVALSHA and EVAL calls), from its command statistics.
async fn scripts_run(app: &TestApp) -> i64 {
    let info = redis_info(&mut app.redis.clone(), &["commandstats"]).await;
    info.lines()
        .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<i64>()
                .ok()
        })
        .sum()
}

// Checks the local answer and its limits, on a private Redis whose command statistics
// count every script it runs: after the product sells out and one refusal heard the
// lease, 20 new request_ids are refused with 409 sold_out while Redis runs no script (so
// no Redis call was made for them), and a replay of a sold request_id is not answered
// locally: Redis is asked (a script runs) and the replay gets its original order (200).
// Audit clean.
#[tokio::test]
async fn sold_out_is_answered_here_while_the_lease_lasts() {
    let redis = PrivateRedis::start().await.expect("private redis");
    let app = TestApp::spawn_on_redis(redis.url(), &[("SOLD_OUT_LEASE", LONG_LEASE)]).await;
    wait_for_listeners(&app, 1).await;
    app.create_product(3700, 2, None).await;
    let mut orders = Vec::new();
    for (i, rid) in ["REQ_so_a", "REQ_so_b"].iter().enumerate() {
        let b = app.bought(rid, 1 + i as i64, 3700, 1).await;
        orders.push(order_id(&b));
    }
    app.refused(("REQ_so_first_refusal", 10, 3700, 1), SOLD_OUT)
        .await;
    // The early trim of the committed holds is the last script the sales cause.
    wait_until(
        "committed holds trimmed",
        Duration::from_secs(10),
        || async {
            let mut conn = app.redis.clone();
            let pending: i64 = redis::cmd("ZCARD")
                .arg(app.key(3700, "pending"))
                .query_async(&mut conn)
                .await
                .expect("zcard");
            pending == 0
        },
    )
    .await;

    let before = scripts_run(&app).await;
    for i in 0..20 {
        app.refused((&format!("REQ_so_local_{i}"), 100 + i, 3700, 1), SOLD_OUT)
            .await;
    }
    assert_eq!(scripts_run(&app).await, before, "refused without Redis");
    let (s, b) = app.purchase("REQ_so_a", 1, 3700, 1).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(order_id(&b), orders[0], "the replay's original order");
    assert!(
        scripts_run(&app).await > before,
        "a holder's replay must ask Redis, never hear sold_out"
    );

    assert_eq!(
        app.count("SELECT COUNT(*) FROM orders WHERE product_id = 3700")
            .await,
        2
    );
    invariants::assert_sound_and_clean_up(app, 3700).await;
}

/// Two instances on the same stores, both with a long sold-out lease and both listening
/// for revocations, selling `product` (1 unit).
async fn two_instances_selling_one(product: i64) -> (TestApp, TestApp) {
    let a = TestApp::spawn_with(Routes::default(), &[("SOLD_OUT_LEASE", LONG_LEASE)]).await;
    let b = a.spawn_beside(&[("SOLD_OUT_LEASE", LONG_LEASE)]).await;
    wait_for_listeners(&a, 2).await;
    a.create_product(product, 1, None).await;
    (a, b)
}

// Checks that a restock revokes the lease on every instance: two instances on the same
// stores (a long lease), the product sold out and refused on both (each heard the lease,
// Redis holds it), a restock of 2 through the first (its answer shows them available),
// then a buyer polling on each instance: both buy within REVOKED_WITHIN of the restock's
// 200 — without revocation neither could before the lease's end. Prints the times.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restock_is_bought_at_once_on_every_instance() {
    let (a, b) = two_instances_selling_one(3730).await;
    a.bought("REQ_rs_first", 1, 3730, 1).await;
    for (app, rid) in [(&a, "REQ_rs_refused_a"), (&b, "REQ_rs_refused_b")] {
        app.refused((rid, 2, 3730, 1), SOLD_OUT).await;
    }
    assert!(lease_in_redis(&a, 3730).await);

    let body = a.restocked(3730, "RS_revoke", 2).await;
    assert_eq!(body["inventory"]["available"], 2, "{body}");
    let (on_a, on_b) = tokio::join!(buy_within(&a, 3730, 10), buy_within(&b, 3730, 20));
    println!("restock to first 201: instance a {on_a:?}, instance b {on_b:?}");
    assert!(on_a.is_some() && on_b.is_some(), "{on_a:?} {on_b:?}");
    assert!(!lease_in_redis(&a, 3730).await, "no unit left: a new lease");
    invariants::assert_sound(&a, 3730).await;
    cleanup_all([a, b]).await;
}

// Checks that a unit given back on one instance (an order cancelled there) is bought at
// once on another that heard the lease: two instances on the same stores (a long lease),
// the only unit sold on the first, a refusal on the second, the order cancelled on the
// first; a buyer polling on the second buys it within REVOKED_WITHIN of the cancel's 200.
// Prints the time. Redis's count and the ledger agree at the end (audit clean).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_on_one_instance_is_bought_at_once_on_another() {
    let (a, b) = two_instances_selling_one(3710).await;
    let body = a.bought("REQ_gb_a", 1, 3710, 1).await;
    let order = order_id(&body);
    b.refused(("REQ_gb_refused", 2, 3710, 1), SOLD_OUT).await;
    assert!(lease_in_redis(&a, 3710).await);
    let (s, body) = a.cancel(order, 1).await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let waited = buy_within(&b, 3710, 3).await;
    println!("cancel to first 201 on the other instance: {waited:?}");
    assert!(
        waited.is_some(),
        "the unit given back was not bought in time"
    );
    assert_eq!(a.redis_available(3710).await, Some(0));
    invariants::assert_sound(&a, 3710).await;
    cleanup_all([a, b]).await;
}

// Checks that a rebuild revokes the leases of the state it replaces instead of waiting
// them out: the product sells out and a refusal hears the lease (a long one); its Redis
// entry is then lost (the test deletes its keys), an order is cancelled meanwhile (the
// unit is owed to Redis), and one gate-watch pass rebuilds the entry with that unit
// available and no lease; a buyer on the instance that trusted the old lease buys it
// within REVOKED_WITHIN. After a recovery pass (which records the return), audit clean.
#[tokio::test]
async fn a_rebuild_revokes_the_leases_of_the_lost_state() {
    let app = TestApp::spawn_with(Routes::default(), &[("SOLD_OUT_LEASE", LONG_LEASE)]).await;
    wait_for_listeners(&app, 1).await;
    app.create_product(3720, 2, None).await;
    let b = app.bought("REQ_rb_a", 1, 3720, 1).await;
    let order = order_id(&b);
    app.bought("REQ_rb_b", 2, 3720, 1).await;
    app.refused(("REQ_rb_refused", 3, 3720, 1), SOLD_OUT).await;
    assert!(lease_in_redis(&app, 3720).await);
    app.delete_keys(3720, &["inv", "pending"], "del").await;
    let (s, b) = app.cancel(order, 1).await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let rebuilt = app.maintenance.watch_once().await.expect("watch");
    assert_eq!(rebuilt, 1);
    assert_eq!(app.redis_available(3720).await, Some(1));
    assert!(
        !lease_in_redis(&app, 3720).await,
        "no lease on a rebuilt entry"
    );
    let started = Instant::now();
    let waited = buy_within(&app, 3720, 4).await;
    println!("rebuild to first 201: {waited:?}");
    assert!(
        waited.is_some(),
        "not bought within {REVOKED_WITHIN:?} of the rebuild"
    );
    assert!(started.elapsed() < REVOKED_WITHIN);
    app.maintenance.recover_once().await.expect("recovery pass");
    invariants::assert_sound_and_clean_up(app, 3720).await;
}
