//! The events on a NATS JetStream cluster: three servers on loopback
//! (`flashsale_testkit::NatsCluster`), the service's event workers configured with all
//! three in `FLASHSALE_NATS_URL` and `FLASHSALE_NATS_STREAM_REPLICAS=3`. One test kills
//! the stream's leader mid-sale and checks that every event still reaches the consumer
//! exactly once; the others check what becomes of a stream found with another replica
//! count than configured.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use flashsale_app::ports::{ErrorKind, EventBus};
use flashsale_app::{EventType, OutboxMessage};
use flashsale_nats::{NatsBus, NatsConfig};
use flashsale_testkit::{NatsCluster, PrivateNats, StreamCopy};
use reqwest::StatusCode;

use crate::events::{assert_one_event_per_change, cancel, outbox, pay, wait_drained, OutboxRow};
use crate::fallback::{acknowledged, buyers, metric};
use crate::helpers::{nats_connect, wait_until, TestApp, TestEvents};
use crate::invariants;

/// Units on sale: more than the buyers of the whole test, so that the sale never sells
/// out and every round of buyers produces events.
const STOCK: i64 = 100_000;
/// Buyers per round of the sale; each round's orders are then a third paid, a third
/// cancelled and a third left pending: events of every type throughout.
const ROUND_BUYERS: i64 = 12;
/// How long the sale goes on before the leader is killed, after it is back, and after
/// the killed server restarted: each long enough for several relay rounds (200 ms apart)
/// to publish on the cluster as it is then.
const SALE_PHASE: Duration = Duration::from_secs(2);
/// Longest the restarted server may take to hold the stream as the leader does: it
/// caught up in under a second here; the rest is room for a busy machine.
const CATCH_UP_MAX: Duration = Duration::from_secs(30);
/// Longest the stall of publishing after the leader's kill may be: the election (4–10 s:
/// nats-server's election timeout, then a vote), then at most one retry pause (250 ms)
/// of the relay's wave, or, past the wave's 9 s of retries, the relay's backoff (100 ms)
/// and a new round; the rest is room for a busy machine. A stall past it means the
/// relay did not carry on across the election.
const STALL_MAX: Duration = Duration::from_secs(20);

/// Nanoseconds since the Unix epoch: the clock JetStream stamps stored messages with.
fn unix_nanos(t: SystemTime) -> i128 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

/// The sale: rounds of [`ROUND_BUYERS`] buyers (each purchase retried through 503s with
/// its request_id), then a third of each round's orders paid and a third cancelled,
/// until `stop`; returns how many rounds ran.
async fn sale(app: &TestApp, product: i64, stop: &AtomicBool) -> i64 {
    let mut round = 0;
    while !stop.load(Ordering::SeqCst) {
        let from = round * ROUND_BUYERS;
        let answers = buyers(&[app], product, from, from + ROUND_BUYERS, Duration::ZERO).await;
        for (k, order) in acknowledged(&answers).into_values().enumerate() {
            let user: i64 = sqlx::query_scalar("SELECT user_id FROM orders WHERE id = ?")
                .bind(order)
                .fetch_one(&app.pool)
                .await
                .expect("the order's buyer");
            match k % 3 {
                0 => assert_eq!(pay(app, order, user).await, StatusCode::OK),
                1 => assert_eq!(cancel(app, order, user).await, StatusCode::OK),
                _ => {}
            }
        }
        round += 1;
    }
    round
}

/// What server `i` of `cluster` holds of `stream` (nothing yet: empty).
async fn copy_of(cluster: &NatsCluster, i: usize, stream: &str) -> StreamCopy {
    cluster
        .stream_copy(i, stream)
        .await
        .expect("a server's copy")
        .unwrap_or(StreamCopy {
            messages: 0,
            last_seq: 0,
        })
}

/// Event id → the stream sequences of the messages that hold it, and the time (Unix
/// nanoseconds) each message was stored, in stream order.
async fn events_in_stream(events: &TestEvents) -> (BTreeMap<String, Vec<u64>>, Vec<(u64, i128)>) {
    let mut held: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut stored = Vec::new();
    for m in events.stream_stored().await {
        stored.push((m.sequence, m.time.unix_timestamp_nanos()));
        for event in flashsale_nats::decode_message(&m.payload).expect("a message body") {
            let event = event.expect("a decodable event");
            held.entry(event.event_id).or_default().push(m.sequence);
        }
    }
    (held, stored)
}

/// Each request_id's events, at their first place in the stream, come in `sequence`
/// order (a copy may come later, docs/events.md); None if so, else the first that does
/// not.
fn out_of_order(rows: &[OutboxRow], held: &BTreeMap<String, Vec<u64>>) -> Option<String> {
    let mut by_request: HashMap<&str, Vec<(i32, u64)>> = HashMap::new();
    for row in rows {
        let first = held.get(&row.event_id).and_then(|seqs| seqs.first())?;
        by_request
            .entry(row.request_id.as_str())
            .or_default()
            .push((row.sequence, *first));
    }
    by_request.into_iter().find_map(|(request, mut events)| {
        events.sort_unstable();
        (!events.windows(2).all(|w| w[0].1 < w[1].1))
            .then(|| format!("{request}: (sequence, stream sequence) {events:?}"))
    })
}

// Checks a kill -9 of the stream's leader mid-sale on a 3-server JetStream cluster
// (FLASHSALE_NATS_STREAM_REPLICAS=3, all three servers in FLASHSALE_NATS_URL): a sale of
// purchases, payments and cancellations runs throughout; the leader is killed, another
// is elected, the killed server restarts and the sale goes on. Afterwards: one outbox
// event per state change, all sent; the consumer applied exactly the outbox's event ids,
// each once (consumed_event against the outbox, the applied-events counter, sales_stats
// against the ledger); the stream holds every outbox event and nothing else, each
// order's events first stored in sequence order; the restarted server holds the stream
// as the leader does; the invariants and the audit hold. Prints the cluster's start time,
// the election, the publish stall (from the kill to the next message the stream stored,
// by the messages' stored times) and the catch-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_leader_killed_mid_sale_loses_no_event_and_applies_each_once() {
    let starting = Instant::now();
    let mut cluster = NatsCluster::start().await.expect("nats cluster");
    let start_time = starting.elapsed();
    let app = TestApp::spawn().await;
    let events = TestEvents::start_with(
        &app,
        &cluster.urls(),
        &[("FLASHSALE_NATS_STREAM_REPLICAS", "3")],
    )
    .await;
    let product = 3701;
    app.create_product(product, STOCK, None).await;
    let stop = AtomicBool::new(false);

    let fault = async {
        cluster
            .wait_stream_leader(&events.stream, None)
            .await
            .expect("the stream made, with a leader");
        tokio::time::sleep(SALE_PHASE).await;
        // Read again just before the kill: a busy cluster may have moved the leadership.
        let leader = cluster
            .wait_stream_leader(&events.stream, None)
            .await
            .expect("the stream's leader");
        let killed_at = SystemTime::now();
        let killed = Instant::now();
        cluster.kill9(leader).expect("kill -9 the leader");
        let next = cluster
            .wait_stream_leader(&events.stream, Some(leader))
            .await
            .expect("another leader elected");
        let election = killed.elapsed();
        tokio::time::sleep(SALE_PHASE).await;
        let restarting = Instant::now();
        let behind = copy_of(&cluster, next, &events.stream).await;
        cluster.restart(leader).await.expect("restart the server");
        let restart_time = restarting.elapsed();
        // Caught up: it holds at least what the leader held when it came back.
        wait_until("the restarted server caught up", CATCH_UP_MAX, || async {
            copy_of(&cluster, leader, &events.stream).await.last_seq >= behind.last_seq
        })
        .await;
        let caught_up = restarting.elapsed() - restart_time;
        tokio::time::sleep(SALE_PHASE).await;
        stop.store(true, Ordering::SeqCst);
        (leader, next, killed_at, election, restart_time, caught_up)
    };
    // `killed`: the server that led the stream and was killed; `leader`: the one elected.
    let (rounds, (killed, leader, killed_at, election, restart_time, caught_up)) =
        tokio::join!(sale(&app, product, &stop), fault);

    wait_drained(&app, &[product]).await;
    let rows = outbox(&app).await;
    assert_one_event_per_change(&app, &rows).await;
    let in_outbox: BTreeSet<&str> = rows.iter().map(|r| r.event_id.as_str()).collect();
    assert_eq!(
        in_outbox.len(),
        rows.len(),
        "an event id twice in the outbox"
    );

    // Applied exactly once each: the consumer's record of applied ids is the outbox's,
    // and it applied as many events as the outbox holds, no copy counted again.
    let consumed: Vec<String> =
        sqlx::query_scalar("SELECT CONVERT(event_id USING utf8mb4) FROM consumed_event")
            .fetch_all(&app.pool)
            .await
            .expect("consumed ids");
    let consumed: BTreeSet<&str> = consumed.iter().map(String::as_str).collect();
    assert_eq!(
        consumed, in_outbox,
        "the consumer applied the outbox's events"
    );
    let applied = metric(&app, "flashsale_events_applied_total").await;
    assert_eq!(applied as usize, rows.len(), "an event applied twice");

    // The stream: every outbox event, nothing else; copies (an event stored in two
    // messages: a wave packed anew after its retries ran out) are allowed and counted.
    let (held, stored) = events_in_stream(&events).await;
    assert_eq!(
        held.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        in_outbox,
        "the stream holds exactly the outbox's events"
    );
    let copies: usize = held.values().map(|seqs| seqs.len() - 1).sum();
    assert_eq!(
        out_of_order(&rows, &held),
        None,
        "an order's events out of order"
    );

    // The stall: from the kill to the first message stored after it.
    let kill_nanos = unix_nanos(killed_at);
    let before = stored
        .iter()
        .filter(|(_, t)| *t <= kill_nanos)
        .map(|(_, t)| *t)
        .max();
    let after = stored
        .iter()
        .filter(|(_, t)| *t > kill_nanos)
        .map(|(_, t)| *t)
        .min();
    let stall = Duration::from_nanos(
        u64::try_from(after.expect("a message stored after the kill") - kill_nanos)
            .expect("positive"),
    );
    let quiet_before = before.map(|t| Duration::from_nanos((kill_nanos - t) as u64));
    assert!(
        stall < STALL_MAX,
        "publishing stalled {stall:?} after the kill"
    );

    // Once quiet, the restarted server's copy is the leader's.
    wait_until(
        "the restarted server holds the leader's copy",
        CATCH_UP_MAX,
        || async {
            copy_of(&cluster, killed, &events.stream).await
                == copy_of(&cluster, leader, &events.stream).await
        },
    )
    .await;

    println!(
        "cluster started in {start_time:?}; server {killed} (leader) killed, server \
         {leader} elected after {election:?}; publish stall {stall:?} (last message stored \
         {quiet_before:?} before the kill); restart took {restart_time:?}, then caught up \
         with the stream as it was in {caught_up:?}; {rounds} rounds, {} events, {} \
         messages, {copies} events stored twice",
        rows.len(),
        stored.len()
    );
    invariants::assert_sound(&app, product).await;
    events.cleanup().await;
    app.cleanup().await;
}

/// A bus on `urls` with a stream and subjects of `tag`'s own, keeping `replicas` copies.
async fn bus(urls: &str, tag: &str, replicas: usize) -> NatsBus {
    NatsBus::connect(NatsConfig {
        urls: flashsale_nats::server_urls(urls).expect("urls"),
        subject_prefix: format!("fs_test_{tag}"),
        stream: format!("FS_TEST_{tag}"),
        events_per_message: flashsale_nats::EVENTS_PER_MESSAGE_MAX,
        replicas,
        max_deliver: flashsale_app::consume::MAX_DELIVER_DEFAULT,
    })
    .await
    .expect("bus")
}

/// Longest a bus may take to connect, and to make sure of its stream and consumer while
/// the cluster moves their copies (a request may time out meanwhile, as the consumer
/// loop's would, which then tries again).
const ENSURE_MAX: Duration = Duration::from_secs(30);

/// Runs `step` until it succeeds, 100 ms apart, as the relay and the consumer loop try
/// again after a failure; fails the test with `what` and the last error after
/// [`ENSURE_MAX`].
async fn retried<T, F, Fut>(what: &str, mut step: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, flashsale_app::BusError>>,
{
    let started = Instant::now();
    loop {
        match step().await {
            Ok(done) => return done,
            Err(e) => assert!(started.elapsed() < ENSURE_MAX, "{what}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `bus` connected, its stream and consumer made sure of (with their replica count).
async fn ensured(bus: &NatsBus, what: &str) {
    connected(bus).await;
    retried(what, || bus.ensure_consumer()).await;
}

/// Waits (bounded by [`ENSURE_MAX`]) until `bus` is connected.
async fn connected(bus: &NatsBus) {
    wait_until("connected to nats", ENSURE_MAX, || async {
        bus.ready().is_ok()
    })
    .await;
}

/// Waits (bounded by [`ENSURE_MAX`]) until the broker reports `want` of
/// [`replicas_of`], and returns what it reported last. A change of replica count is
/// accepted at once but carried out by the cluster afterwards: the copies move, and the
/// stream or its consumer may be briefly unknown to the server asked.
async fn replicas_reach(urls: &str, tag: &str, want: (usize, usize, usize)) -> String {
    let started = Instant::now();
    loop {
        let seen = replicas_of(urls, tag).await;
        if seen.as_ref() == Ok(&want) || started.elapsed() >= ENSURE_MAX {
            return format!("{seen:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// (the stream's configured replicas, the servers that hold it, the consumer's
/// configured replicas), as the broker at `urls` reports them.
async fn replicas_of(urls: &str, tag: &str) -> Result<(usize, usize, usize), String> {
    let js = async_nats::jetstream::new(nats_connect(urls).await.map_err(|e| e.to_string())?);
    let stream = js
        .get_stream(format!("FS_TEST_{tag}"))
        .await
        .map_err(|e| format!("stream: {e}"))?;
    // Fetching a stream or a consumer brings its info: no second request for it.
    let info = stream.cached_info().clone();
    // The leader and the others, by name: while the copies move, the others' list may
    // name the leader too.
    let holders = info.cluster.map_or(1, |c| {
        c.leader
            .into_iter()
            .chain(c.replicas.into_iter().map(|r| r.name))
            .collect::<BTreeSet<String>>()
            .len()
            .max(1)
    });
    let consumer: async_nats::jetstream::consumer::PullConsumer = stream
        .get_consumer(flashsale_nats::CONSUMER_NAME)
        .await
        .map_err(|e| format!("consumer: {e}"))?;
    Ok((
        info.config.num_replicas,
        holders,
        consumer.cached_info().config.num_replicas,
    ))
}

/// One event (an order_created) for `publish`, of a made-up order.
fn an_event(n: u32) -> OutboxMessage {
    let event_id = format!("0193a7c4-5d2e-7f00-8000-{n:012}");
    OutboxMessage {
        id: i64::from(n),
        payload: format!(
            r#"{{"event_id": "{event_id}", "event_type": "order_created", "sequence": 1, "order_id": {n}, "request_id": "REQ_replicas_{n}", "product_id": 3790, "user_id": 1, "quantity": 1, "reason": null, "occurred_at": "2026-12-06T10:00:00.000001Z"}}"#
        ),
        event_id,
        event_type: EventType::OrderCreated,
        request_id: format!("REQ_replicas_{n}"),
        sequence: 1,
        attempts: 0,
        refusals: 0,
        blocked: false,
    }
}

// Checks what becomes of a stream and consumer found with another replica count on a
// cluster: made with 1 copy (as with FLASHSALE_NATS_STREAM_REPLICAS=1), a bus
// configured with 3 changes both to 3 (the stream then held by three servers, once the
// cluster has moved the copies, within ENSURE_MAX) and publishes; one configured with 1
// again changes them back to one copy, and publishes.
// No event is lost on the way: the stream holds the three published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_with_another_replica_count_is_changed_to_the_setting() {
    let cluster = NatsCluster::start().await.expect("nats cluster");
    let urls = cluster.urls();
    let tag = format!("replicas_{}", std::process::id());
    let steps = [
        (
            1,
            "a stream and consumer of one copy",
            "published on one copy",
        ),
        (3, "changed to three copies", "published on three copies"),
        (1, "changed back to one copy", "published on one copy again"),
    ];
    for (n, (copies, ensuring, publishing)) in (1..).zip(steps) {
        let configured = bus(&urls, &tag, copies).await;
        ensured(&configured, ensuring).await;
        let seen = replicas_reach(&urls, &tag, (copies, copies, copies)).await;
        assert_eq!(
            seen,
            format!("Ok(({copies}, {copies}, {copies}))"),
            "{ensuring}: every server holds the stream's copies"
        );
        let event = an_event(n);
        retried(publishing, || configured.publish(&event)).await;
    }

    let js = async_nats::jetstream::new(nats_connect(&urls).await.expect("connect"));
    let mut stream = js
        .get_stream(format!("FS_TEST_{tag}"))
        .await
        .expect("stream");
    assert_eq!(stream.info().await.expect("info").state.messages, 3);
}

// Checks a broker that cannot keep the configured copies (a single server, which holds
// one): a stream made there with one copy is left as it is by a bus configured with 3,
// which refuses to use it instead (NATS 2.9 would take the update and still keep one
// copy): ensure_stream fails as a configuration error naming the setting, and so does
// every publish, which leaves its event unpublished (in the outbox, for the relay). A
// stream that does not exist yet is not made with fewer copies either: the server
// refuses to make it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_server_refuses_more_replicas_and_nothing_is_published() {
    let nats = PrivateNats::start().await.expect("private nats-server");
    let tag = format!("single_{}", std::process::id());
    let three = bus(&nats.url(), &format!("{tag}_new"), 3).await;
    connected(&three).await;
    let err = three
        .ensure_stream()
        .await
        .expect_err("no stream of 3 copies");
    assert_eq!(err.kind(), ErrorKind::Rejected, "{err}");

    let one = bus(&nats.url(), &tag, 1).await;
    ensured(&one, "a stream of one copy").await;
    let three = bus(&nats.url(), &tag, 3).await;
    connected(&three).await;
    let err = three.ensure_stream().await.expect_err("refused");
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let message = err.to_string();
    assert!(
        message.contains("single NATS server")
            && message.contains("FLASHSALE_NATS_STREAM_REPLICAS asks for 3"),
        "{message}"
    );
    let published = three.publish(&an_event(1)).await;
    assert_eq!(
        published.map_err(|e| e.kind()),
        Err(ErrorKind::Config),
        "a publish on the refused stream"
    );
    assert_eq!(replicas_of(&nats.url(), &tag).await, Ok((1, 1, 1)));
    let js = async_nats::jetstream::new(nats_connect(&nats.url()).await.expect("connect"));
    let mut stream = js
        .get_stream(format!("FS_TEST_{tag}"))
        .await
        .expect("stream");
    assert_eq!(stream.info().await.expect("info").state.messages, 0);
}
