//! Dead letters and parked rows. The messages the statistics consumer gives up on (its
//! store refuses them at their last allowed delivery, or they do not decode) go to the
//! dead-letter stream `<stream>_DEAD` and the messages behind them go on; a person
//! lists, replays (applied exactly once) or drops them. An outbox row the broker refuses
//! for good is parked after a bound instead of retried forever, and a person retries it.
//! Each test runs the event workers as `serve` does (`TestEvents`), with a stream of its
//! own (deleted at the end with its dead-letter stream), and the real MariaDB.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use flashsale::events::DeadAction;
use flashsale_nats::{DeadLetter, LetterState, NatsBus, NatsConfig};
use reqwest::StatusCode;

use crate::events::{cancel, outbox, pay, stats_mismatch, wait_drained, DRAIN_MAX};
use crate::helpers::{order_id, wait_until, TestApp, TestEvents, NATS_URL};

/// Longest another product's event may wait to be applied while a refused product's
/// messages come and go: the relay's poll (200 ms) and the consumer's linger (20 ms) with
/// room for a busy machine. A consumer that waited for the refused messages would take
/// their whole redelivery, about four seconds (four NAK delays of a second).
const OTHERS_WAIT_MAX: Duration = Duration::from_secs(2);

/// A bus of the test's own on its stream (the operator's commands use one like it).
pub(crate) async fn bus(events: &TestEvents) -> NatsBus {
    let bus = NatsBus::connect(NatsConfig {
        urls: vec![events.nats_url.clone()],
        subject_prefix: events.subject_prefix.clone(),
        stream: events.stream.clone(),
        events_per_message: flashsale_nats::EVENTS_PER_MESSAGE_MAX,
        replicas: 1,
        max_deliver: flashsale_app::consume::MAX_DELIVER_DEFAULT,
    })
    .await
    .expect("bus");
    bus.connected_within(Duration::from_secs(5))
        .await
        .expect("connected");
    bus
}

/// The event ids in each letter's body, by letter key, read from the dead-letter stream.
async fn letter_events(events: &TestEvents, letters: &[DeadLetter]) -> Vec<(String, Vec<String>)> {
    if letters.is_empty() {
        return Vec::new();
    }
    let js = events.jetstream().await;
    let stream = js
        .get_stream(format!("{}_DEAD", events.stream))
        .await
        .expect("dead-letter stream");
    let mut out = Vec::new();
    for l in letters {
        let m = stream.get_raw_message(l.sequence).await.expect("letter");
        let ids = flashsale_nats::decode_message(&m.payload)
            .expect("a pack")
            .into_iter()
            .filter_map(Result::ok)
            .map(|e| e.event_id)
            .collect();
        out.push((l.key.clone(), ids));
    }
    out
}

/// Runs an operator's `events dead` command on `bus`: its exit code's success and what
/// it printed.
async fn dead(bus: &NatsBus, action: DeadAction) -> (bool, String) {
    let mut out = Vec::new();
    let code = flashsale::events::dead(bus, action, &mut out)
        .await
        .expect("command");
    let text = String::from_utf8(out).expect("utf-8");
    (
        format!("{code:?}") == format!("{:?}", std::process::ExitCode::SUCCESS),
        text,
    )
}

/// The outbox's event ids of `product`.
async fn event_ids(app: &TestApp, product: i64) -> BTreeSet<String> {
    let payloads = outbox(app).await;
    payloads
        .into_iter()
        .filter(|r| {
            serde_json::from_str::<serde_json::Value>(&r.payload).expect("json")["product_id"]
                == product
        })
        .map(|r| r.event_id)
        .collect()
}

async fn orders_created(app: &TestApp, product: i64) -> i64 {
    app.count(&format!(
        "SELECT CAST(COALESCE(SUM(orders_created), 0) AS SIGNED) FROM sales_stats \
         WHERE product_id = {product}"
    ))
    .await
}

// Checks the dead letters end to end on the shared NATS and MariaDB. The test adds a
// CHECK to sales_stats that refuses one product's row, then buys, pays and cancels that
// product and another, interleaved (their order_created events share packs). The refused
// product's messages land in the dead-letter stream after exactly 5 deliveries each, with
// their last error; meanwhile the other product's purchases, made one at a time, are each
// applied within OTHERS_WAIT_MAX (the wait is measured and printed), and its statistics
// match the ledger. Then the CHECK is dropped and `events dead replay` puts every letter
// back: the refused product's statistics match the ledger, every outbox event is in
// consumed_event once, the other product's events that shared a letter are not counted
// twice, the letters read `replayed` with who did it, and a second replay finds none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_product_is_dead_lettered_and_replayed_exactly_once() {
    let app = TestApp::spawn().await;
    let events = TestEvents::start(&app, NATS_URL).await;
    let (refused, other) = (3801_i64, 3802_i64);
    app.create_product(refused, 50, None).await;
    app.create_product(other, 100, None).await;
    sqlx::query(&format!(
        "ALTER TABLE sales_stats ADD CONSTRAINT refuse_one CHECK (product_id <> {refused})"
    ))
    .execute(&app.pool)
    .await
    .expect("add the CHECK");

    let started = Instant::now();
    let mut orders = Vec::new();
    for i in 0..6_i64 {
        for product in [refused, other] {
            let body = app
                .bought(&format!("REQ_dl_{product}_{i}"), 100 + i, product, 1)
                .await;
            orders.push((order_id(&body), 100 + i, product));
        }
    }
    for (n, &(order, user, _)) in orders.iter().enumerate().take(4) {
        let status = match n % 2 {
            0 => pay(&app, order, user).await,
            _ => cancel(&app, order, user).await,
        };
        assert_eq!(status, StatusCode::OK);
    }

    // While the refused messages come back and die, the other product's events flow.
    let mut waits = Vec::new();
    for i in 0..10_i64 {
        let before = orders_created(&app, other).await;
        app.bought(&format!("REQ_dl_more_{i}"), 500 + i, other, 1)
            .await;
        let bought = Instant::now();
        wait_until("the other product's event applied", DRAIN_MAX, || async {
            orders_created(&app, other).await > before
        })
        .await;
        waits.push(bought.elapsed());
    }
    let slowest = waits.iter().max().copied().unwrap_or_default();
    let mut sorted = waits.clone();
    sorted.sort();
    println!(
        "other product's events while the refused ones were redelivered: median wait {:?}, slowest {:?} ({} purchases)",
        sorted[sorted.len() / 2],
        slowest,
        waits.len()
    );
    assert!(slowest < OTHERS_WAIT_MAX, "an event waited {slowest:?}");

    let bus = bus(&events).await;
    let refused_ids = event_ids(&app, refused).await;
    wait_until("every refused event in a letter", DRAIN_MAX, || async {
        let letters = bus.dead_letters().await.expect("letters");
        let held: BTreeSet<String> = letter_events(&events, &letters)
            .await
            .into_iter()
            .flat_map(|(_, ids)| ids)
            .collect();
        refused_ids.is_subset(&held)
    })
    .await;
    let buried = started.elapsed();
    let letters = bus.dead_letters().await.expect("letters");
    for l in &letters {
        assert_eq!(l.state, LetterState::Dead, "{l:?}");
        assert_eq!(l.reason, "refused", "{l:?}");
        assert_eq!(l.deliveries, 5, "{l:?}");
        assert!(l.error.contains("CONSTRAINT"), "{l:?}");
        assert_eq!(l.stream, events.stream);
    }
    println!(
        "{} refused events in {} letter(s), each after {} deliveries; all buried {buried:?} after the first purchase",
        refused_ids.len(),
        letters.len(),
        letters[0].deliveries
    );
    wait_drained(&app, &[other]).await;
    assert_eq!(orders_created(&app, refused).await, 0);
    let (_, listed) = dead(&bus, DeadAction::List { all: false }).await;
    assert!(
        listed.contains(&format!("{} dead letter(s)", letters.len())),
        "{listed}"
    );
    let text = app.metrics.encode();
    assert!(
        text.contains(&format!(
            "flashsale_events_dead_lettered_total{{reason=\"refused\"}} {}",
            letters.len()
        )),
        "{text}"
    );

    // The store takes them again: a replay applies each once.
    sqlx::query("ALTER TABLE sales_stats DROP CONSTRAINT refuse_one")
        .execute(&app.pool)
        .await
        .expect("drop the CHECK");
    let replay = DeadAction::Replay {
        id: None,
        by: Some("tester".into()),
    };
    let (done, printed) = dead(&bus, replay).await;
    assert!(done, "{printed}");
    let replayed = Instant::now();
    wait_drained(&app, &[refused, other]).await;
    println!(
        "replayed {} letter(s): the refused product's statistics matched the ledger {:?} later",
        letters.len(),
        replayed.elapsed()
    );
    let all_events = outbox(&app).await.len() as i64;
    assert_eq!(
        app.count("SELECT COUNT(*) FROM consumed_event").await,
        all_events,
        "every event applied once"
    );
    assert_eq!(stats_mismatch(&app, other).await, None);
    let after = bus.dead_letters().await.expect("letters");
    assert_eq!(after.len(), letters.len());
    for l in &after {
        assert_eq!(l.state, LetterState::Replayed, "{l:?}");
        assert_eq!(l.by.as_deref(), Some("tester"));
        assert!(l.replayed_as.is_some(), "{l:?}");
    }
    let again = DeadAction::Replay { id: None, by: None };
    let (done, printed) = dead(&bus, again).await;
    assert!(
        done && printed.contains("0 letter(s) looked at"),
        "{printed}"
    );
    events.cleanup().await;
    app.cleanup().await;
}

// Checks undecodable messages on the shared NATS: a body that is no event at all,
// published by the test straight to the stream's subject, lands in the dead-letter stream
// at its first delivery (reason undecodable, deliveries 1); a pack of one valid event and
// one that does not decode has its valid event applied (in consumed_event, counted in
// sales_stats) and the message in the dead letters too. Then `drop --id` discards the
// first with who and why, `list --all` shows that record, and neither replay nor drop
// touches it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_message_is_dead_lettered_at_once() {
    // A purchase first, so that the relay has made the stream.
    let (app, events) = TestEvents::selling(3811, 5).await;
    app.bought("REQ_undecodable_0", 1, 3811, 1).await;
    wait_drained(&app, &[3811]).await;
    let js = events.jetstream().await;
    let subject = format!("{}.events.order_created", events.subject_prefix);
    let publish = |body: String, id: &str| {
        async_nats::jetstream::message::PublishMessage::build()
            .payload(body.into_bytes().into())
            .message_id(id)
    };
    let garbage = js
        .send_publish(subject.clone(), publish("not an event".into(), "garbage"))
        .await
        .expect("publish")
        .await
        .expect("ack");
    let good_id = "0193a7c4-5d2e-7f00-8000-000000003812";
    let event = |id: &str, quantity: i64| {
        format!(
            r#"{{"event_id": "{id}", "event_type": "order_created", "sequence": 1, "order_id": 1, "request_id": "REQ_u_{quantity}", "product_id": 3812, "user_id": 1, "quantity": {quantity}, "reason": null, "occurred_at": "2026-12-06T10:00:00.000001Z"}}"#
        )
    };
    let half = format!("[{}, {}]", event(good_id, 1), event("bad-quantity", -1));
    let half = js
        .send_publish(subject, publish(half, "half"))
        .await
        .expect("publish")
        .await
        .expect("ack");

    let bus = bus(&events).await;
    let sent = Instant::now();
    wait_until("both messages in the dead letters", DRAIN_MAX, || async {
        bus.dead_letters().await.expect("letters").len() == 2
    })
    .await;
    println!(
        "two undecodable messages dead-lettered {:?} after publishing",
        sent.elapsed()
    );
    let letters = bus.dead_letters().await.expect("letters");
    for (l, sequence) in letters.iter().zip([garbage.sequence, half.sequence]) {
        assert_eq!(l.key, sequence.to_string());
        assert_eq!(l.reason, "undecodable", "{l:?}");
        assert_eq!(l.deliveries, 1, "{l:?}");
        assert_eq!(l.state, LetterState::Dead);
    }
    assert!(
        letters[1].error.contains("1 event(s) do not decode"),
        "{:?}",
        letters[1]
    );
    assert_eq!(
        app.count(&format!(
            "SELECT COUNT(*) FROM consumed_event WHERE event_id = '{good_id}'"
        ))
        .await,
        1,
        "the valid event of the half-readable message is applied"
    );
    assert_eq!(orders_created(&app, 3812).await, 1);

    let key = letters[0].key.clone();
    let drop = DeadAction::Drop {
        id: key.clone(),
        note: "garbage from a test".into(),
        by: Some("alice".into()),
    };
    let (done, printed) = dead(&bus, drop).await;
    assert!(done, "{printed}");
    let (_, listed) = dead(&bus, DeadAction::List { all: true }).await;
    assert!(
        listed.contains("dropped by alice at") && listed.contains(": garbage from a test"),
        "{listed}"
    );
    let (_, open) = dead(&bus, DeadAction::List { all: false }).await;
    assert!(open.contains("1 dead letter(s)"), "{open}");
    let replay = DeadAction::Replay {
        id: Some(key.clone()),
        by: None,
    };
    let (done, printed) = dead(&bus, replay).await;
    assert!(!done && printed.contains("it is dropped"), "{printed}");
    let dropped = bus.dead_letters().await.expect("letters");
    let dropped = dropped.iter().find(|l| l.key == key).expect("the record");
    assert_eq!(dropped.state, LetterState::Dropped);
    assert_eq!(dropped.by.as_deref(), Some("alice"));
    assert_eq!(dropped.note.as_deref(), Some("garbage from a test"));
    events.cleanup().await;
    app.cleanup().await;
}

/// An outbox row whose event is larger than `bytes`: a real event's fields and a note
/// that pads it (consumers ignore fields they don't know), as a writer of larger events
/// would put there.
async fn insert_large_event(app: &TestApp, product: i64, bytes: usize) {
    let payload = serde_json::json!({
        "event_id": "0193a7c4-5d2e-7f00-8000-000000003821", "event_type": "order_paid",
        "sequence": 1, "order_id": 1, "request_id": "REQ_large", "product_id": product,
        "user_id": 1, "quantity": 1, "reason": null,
        "occurred_at": "2026-12-06T10:00:00.000001Z", "note": "x".repeat(bytes),
    });
    sqlx::query(
        "INSERT INTO outbox (event_id, event_type, request_id, order_id, product_id, sequence, \
         payload, created_at) VALUES ('0193a7c4-5d2e-7f00-8000-000000003821', 'order_paid', \
         'REQ_large', 1, ?, 1, ?, NOW(6))",
    )
    .bind(product)
    .bind(payload.to_string())
    .execute(&app.pool)
    .await
    .expect("insert the large event");
}

// Checks a row the broker refuses for good is parked, on a private nats-server that takes
// messages of at most 4 KiB (max_payload): an outbox row whose event is 6 KB is refused
// (too_large) at each round and parked after PARK_AFTER_REFUSALS refusals (attempts 5,
// its reason kept), while the purchases' events around it are published at once. The
// relay counts it (flashsale_outbox_parked_total), the scrape and the live page show its
// events (flashsale_outbox_parked_events, outbox_parked), the audit reports it as an I7
// violation, and `events parked list` shows it. Then `events parked retry` puts it back
// and a relay on the shared NATS (1 MiB) publishes it: nothing parked or unsent is left,
// and the audit's parked finding is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_the_broker_refuses_for_good_is_parked_then_retried() {
    use flashsale::events::ParkedAction;
    const MAX_PAYLOAD: usize = 4096;
    let nats = flashsale_testkit::PrivateNats::start_with_max_payload(Some(MAX_PAYLOAD))
        .await
        .expect("private nats-server");
    let app = TestApp::spawn().await;
    let product = 3821;
    app.create_product(product, 10, None).await;
    insert_large_event(&app, product, 6_000).await;
    for i in 0..3 {
        app.bought(&format!("REQ_park_{i}"), 10 + i, product, 1)
            .await;
    }
    let events = TestEvents::start(&app, &nats.url()).await;
    let started = Instant::now();
    let parked = || app.count("SELECT COUNT(*) FROM outbox_parked");
    wait_until("the large row parked", DRAIN_MAX, || async {
        parked().await == 1
    })
    .await;
    println!(
        "a 6 KB event for a broker taking 4 KiB: parked {:?} after the relay started",
        started.elapsed()
    );
    let unsent = "SELECT COUNT(*) FROM outbox_unsent";
    wait_until("the other events published", DRAIN_MAX, || async {
        app.count(unsent).await == 0
    })
    .await;
    let row = sqlx::query_as::<_, (i32, String)>(
        "SELECT attempts, CONVERT(reason USING utf8mb4) FROM outbox_parked",
    )
    .fetch_one(&app.pool)
    .await
    .expect("the parked row");
    assert_eq!(row.0, 5, "{row:?}");
    assert!(row.1.contains("too_large"), "{row:?}");
    let counted = app.metrics.encode();
    assert!(
        counted.contains("flashsale_outbox_parked_total 1"),
        "{counted}"
    );
    let (scraped, _) = app.scrape_metrics().await;
    assert!(
        scraped.contains("flashsale_outbox_parked_events 1"),
        "{scraped}"
    );
    let (status, page) = app.get("/dashboard/data").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["outbox_parked"], 1, "{page}");
    let id = flashsale_core::ProductId::parse(product).expect("id");
    let mut report = Vec::new();
    let totals = flashsale::audit_products(&app.maintenance, &[id], Some(id), &mut report)
        .await
        .expect("audit");
    let report = String::from_utf8(report).expect("utf-8");
    assert!(totals.violations >= 1, "{report}");
    assert!(
        report.contains("I7") && report.contains("1 outbox events are parked"),
        "{report}"
    );

    let ledger = flashsale::connect_ledger(&config_of(&app))
        .await
        .expect("ledger");
    let mut out = Vec::new();
    flashsale::events::parked(&ledger, ParkedAction::List, &mut out)
        .await
        .expect("list");
    let listed = String::from_utf8(out).expect("utf-8");
    assert!(
        listed.contains("1 parked outbox row(s)") && listed.contains("REQ_large"),
        "{listed}"
    );

    let mut events = events;
    events.stop().await;
    let mut out = Vec::new();
    flashsale::events::parked(&ledger, ParkedAction::Retry { id: None }, &mut out)
        .await
        .expect("retry");
    assert_eq!(parked().await, 0);
    let roomy = TestEvents::start(&app, NATS_URL).await;
    wait_until("the large row published", DRAIN_MAX, || async {
        app.count(unsent).await == 0
    })
    .await;
    assert_eq!(parked().await, 0);
    let mut report = Vec::new();
    flashsale::audit_products(&app.maintenance, &[id], Some(id), &mut report)
        .await
        .expect("audit");
    let report = String::from_utf8(report).expect("utf-8");
    assert!(!report.contains("parked"), "{report}");
    roomy.cleanup().await;
    events.cleanup().await;
    app.cleanup().await;
}

/// Config with the test's database, for reaching the ledger directly.
fn config_of(app: &TestApp) -> flashsale::Config {
    let env = std::collections::HashMap::from([(
        "FLASHSALE_DATABASE_URL".to_owned(),
        app.db.as_ref().expect("db").url(),
    )]);
    flashsale::Config::from_parts(None, &env).expect("config")
}
