//! Events (I7): every order and reservation state change writes one outbox row in its own
//! transaction; the relay publishes them to NATS JetStream, packed by type into messages
//! (Nats-Msg-Id = the pack id of their events); the
//! sales-statistics consumer applies each once. Each test runs the event workers exactly
//! as `serve` does (`flashsale::start_events`), with a subject prefix and a stream of its
//! own, and deletes its stream at the end. The broker-down test stops a private
//! nats-server of its own, never the shared one.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use flashsale::Config;
use flashsale_app::{Event, EventType, Ledger};
use flashsale_core::{
    HoldRef, ProductId, PurchaseRequest, Quantity, ReleaseReason, RequestId, UserId,
};
use flashsale_testkit::{free_port, PrivateNats};
use futures::stream::{self, StreamExt};
use reqwest::StatusCode;
use sqlx::Row;

use crate::helpers::{order_id, wait_until, TestApp, TestEvents, NATS_URL};
use crate::invariants;

/// How long the outbox may take to drain and the statistics to catch up once the broker
/// is reachable: the relay polls every 200 ms and backs off to 5 s at most, the client
/// reconnects within a second; the rest is room for a machine busy with other tests.
pub(crate) const DRAIN_MAX: Duration = Duration::from_secs(30);
/// Slowest purchase accepted while the broker is down. A purchase that waited for NATS
/// would take at least the client's connect timeout (2 s) or ack timeout (5 s); a
/// purchase takes milliseconds, and this leaves room for a loaded machine.
const OUTAGE_PURCHASE_MAX: Duration = Duration::from_millis(1500);

/// One outbox row, as the checks need it.
#[derive(Debug, Clone)]
pub(crate) struct OutboxRow {
    pub(crate) event_id: String,
    pub(crate) event_type: String,
    pub(crate) request_id: String,
    pub(crate) order_id: Option<i64>,
    pub(crate) sequence: i32,
    pub(crate) payload: String,
    pub(crate) sent: bool,
}

/// The outbox one event per row (packs unpacked), in outbox order.
pub(crate) async fn outbox(app: &TestApp) -> Vec<OutboxRow> {
    let rows = sqlx::query(
        "SELECT CONVERT(event_id USING utf8mb4) AS event_id, \
         CONVERT(event_type USING utf8mb4) AS event_type, \
         CONVERT(request_id USING utf8mb4) AS request_id, order_id, sequence, \
         CONVERT(payload USING utf8mb4) AS payload, \
         NOT EXISTS (SELECT 1 FROM outbox_unsent u WHERE u.id = e.id) AS sent \
         FROM outbox_event e ORDER BY id, request_id",
    )
    .fetch_all(&app.pool)
    .await
    .expect("read outbox");
    rows.iter()
        .map(|r| OutboxRow {
            event_id: r.get("event_id"),
            event_type: r.get("event_type"),
            request_id: r.get("request_id"),
            order_id: r.get("order_id"),
            sequence: r.get("sequence"),
            payload: r.get("payload"),
            sent: r.get::<i64, _>("sent") == 1,
        })
        .collect()
}

async fn unsent(app: &TestApp) -> i64 {
    app.count(
        "SELECT CAST(COALESCE(SUM(o.events), 0) AS SIGNED) \
         FROM outbox_unsent u JOIN outbox o ON o.id = u.id",
    )
    .await
}

/// Fails unless exactly `consumed` events are applied (`why` says which copy must not
/// have been), and the sales statistics of `product` match its orders.
async fn applied_once(app: &TestApp, product: i64, consumed: i64, why: &str) {
    assert_eq!(
        app.count("SELECT COUNT(*) FROM consumed_event").await,
        consumed,
        "{why}"
    );
    assert_eq!(stats_mismatch(app, product).await, None);
}

/// The product's sales_stats row against what the ledger says happened; None when they
/// agree, else both, for the failure message.
pub(crate) async fn stats_mismatch(app: &TestApp, product_id: i64) -> Option<String> {
    let expected: (i64, i64, i64, i64, i64, i64) = app
        .row(
            "SELECT CAST(COUNT(*) AS SIGNED), CAST(COALESCE(SUM(quantity), 0) AS SIGNED), \
             CAST(COALESCE(SUM(status = 'PAID'), 0) AS SIGNED), \
             CAST(COALESCE(SUM(IF(status = 'PAID', quantity, 0)), 0) AS SIGNED), \
             CAST(COALESCE(SUM(status = 'CANCELLED'), 0) AS SIGNED), \
             CAST(COALESCE(SUM(IF(status = 'CANCELLED', quantity, 0)), 0) AS SIGNED) \
             FROM orders WHERE product_id = ?",
            product_id,
        )
        .await;
    let released: (i64, i64) = app
        .row(
            "SELECT CAST(COUNT(*) AS SIGNED), CAST(COALESCE(SUM(quantity), 0) AS SIGNED) \
             FROM inventory_reservation WHERE product_id = ? AND status = 'RELEASED'",
            product_id,
        )
        .await;
    let expected = [
        expected.0, expected.1, expected.2, expected.3, expected.4, expected.5, released.0,
        released.1,
    ];
    const COLUMNS: [&str; 8] = [
        "orders_created",
        "units_ordered",
        "orders_paid",
        "units_paid",
        "orders_cancelled",
        "units_cancelled",
        "reservations_released",
        "units_released",
    ];
    let row = sqlx::query(&format!(
        "SELECT {} FROM sales_stats WHERE product_id = ?",
        COLUMNS.join(", ")
    ))
    .bind(product_id)
    .fetch_optional(&app.pool)
    .await
    .expect("sales_stats");
    let actual = COLUMNS.map(|c| row.as_ref().map_or(0, |r| r.get::<i64, _>(c)));
    (actual != expected).then(|| {
        format!(
            "product {product_id}: sales_stats {actual:?} != ledger {expected:?} \
             (created, units, paid, units, cancelled, units, released, units)"
        )
    })
}

/// Whether the statistics consumer on `stream` has nothing pending and has acknowledged
/// every message up to stream sequence `last`.
async fn consumer_acked_through(
    js: &async_nats::jetstream::Context,
    stream: &str,
    last: u64,
) -> bool {
    let stream = js.get_stream(stream).await.expect("stream");
    let info = stream
        .consumer_info(flashsale_nats::CONSUMER_NAME)
        .await
        .expect("consumer info");
    info.num_pending == 0 && info.num_ack_pending == 0 && info.ack_floor.stream_sequence == last
}

/// Waits until every outbox row is sent and the statistics of `products` match the ledger.
pub(crate) async fn wait_drained(app: &TestApp, products: &[i64]) {
    wait_until(
        "outbox drained and sales_stats caught up",
        DRAIN_MAX,
        || async {
            if unsent(app).await > 0 {
                return false;
            }
            for &p in products {
                if stats_mismatch(app, p).await.is_some() {
                    return false;
                }
            }
            true
        },
    )
    .await;
}

/// Exactly one outbox event per state change in `rows` (the outbox): order_created per
/// order, order_paid per PAID order, order_cancelled per CANCELLED order,
/// reservation_released per RELEASED reservation (cancelled orders and fences),
/// stock_repaired per repair reconciliation made, and nothing else; and every one of
/// them sent.
pub(crate) async fn assert_one_event_per_change(app: &TestApp, rows: &[OutboxRow]) {
    let count = |t: &str| rows.iter().filter(|r| r.event_type == t).count() as i64;
    assert_eq!(
        count("order_created"),
        app.count("SELECT COUNT(*) FROM orders").await
    );
    assert_eq!(
        count("order_paid"),
        app.count("SELECT COUNT(*) FROM orders WHERE status = 'PAID'")
            .await
    );
    assert_eq!(
        count("order_cancelled"),
        app.count("SELECT COUNT(*) FROM orders WHERE status = 'CANCELLED'")
            .await
    );
    assert_eq!(
        count("reservation_released"),
        app.count("SELECT COUNT(*) FROM inventory_reservation WHERE status = 'RELEASED'")
            .await
    );
    assert_eq!(
        count("stock_repaired"),
        app.count("SELECT COUNT(*) FROM stock_repair").await
    );
    let kinds = [
        "order_created",
        "order_paid",
        "order_cancelled",
        "reservation_released",
        "stock_repaired",
    ];
    assert_eq!(kinds.map(count).iter().sum::<i64>(), rows.len() as i64);
    assert!(rows.iter().all(|r| r.sent), "every event is marked sent");
}

/// The I7 checks, once the outbox has drained:
/// - exactly one outbox row per state change, each sent ([`assert_one_event_per_change`]);
/// - the stream holds each event exactly once, in a message under
///   `<prefix>.events.<type>`: for `Format::Packed` a body that is a JSON array of the
///   outbox payloads of its events (at most EVENTS_PER_MESSAGE_MAX) with Nats-Msg-Id =
///   their pack_id, for `Format::Single` the one payload with Nats-Msg-Id = its event id;
/// - each request_id's events are in the stream in `sequence` order, numbered 1, 2, …;
/// - every body decodes, and its fields are those of its order (reason of a cancel too).
async fn check_events(app: &TestApp, events: &TestEvents, format: Format) {
    let rows = outbox(app).await;
    assert_one_event_per_change(app, &rows).await;

    let messages = events.stream_messages().await;
    let by_id: BTreeMap<&str, &OutboxRow> = rows.iter().map(|r| (r.event_id.as_str(), r)).collect();
    let mut in_stream = Vec::new();
    let mut last_seq: HashMap<String, i32> = HashMap::new();
    for (msg_id, subject, body) in &messages {
        let items: Vec<&str> = match format {
            Format::Packed => {
                let items: Vec<&serde_json::value::RawValue> =
                    serde_json::from_slice(body).expect("a message body is a JSON array");
                items.into_iter().map(|item| item.get()).collect()
            }
            Format::Single => vec![std::str::from_utf8(body).expect("UTF-8 body")],
        };
        assert!(
            (1..=flashsale_nats::EVENTS_PER_MESSAGE_MAX).contains(&items.len()),
            "{} events in one message",
            items.len()
        );
        let mut ids = Vec::new();
        for item in items {
            let event: Event =
                flashsale_nats::decode_event(item.as_bytes()).expect("decodable event");
            let row = by_id[event.event_id.as_str()];
            ids.push(row.event_id.as_str());
            check_event(app, events, &event, subject, item, row, &mut last_seq).await;
        }
        let expected_id = match format {
            Format::Packed => flashsale_nats::pack_id(ids.iter().copied()),
            Format::Single => ids[0].to_owned(),
        };
        assert_eq!(
            msg_id, &expected_id,
            "Nats-Msg-Id names the message's events"
        );
        in_stream.extend(ids);
    }
    let distinct: BTreeSet<&str> = in_stream.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        in_stream.len(),
        "an event is stored twice in the stream"
    );
    assert_eq!(
        distinct,
        by_id.keys().copied().collect::<BTreeSet<_>>(),
        "the stream holds exactly the outbox's events"
    );
}

/// How the test's server publishes events (`FLASHSALE_NATS_EVENTS_PER_MESSAGE`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    /// The default: a JSON array of events, `Nats-Msg-Id` = their pack id.
    Packed,
    /// One per message: the bare event object, `Nats-Msg-Id` = its event id.
    Single,
}

/// One event of the stream against its outbox row and its order: subject, body (the row's
/// payload), fields, and its place in its request_id's sequence (`last_seq`: the
/// sequence seen last of each request_id, in stream order).
async fn check_event(
    app: &TestApp,
    events: &TestEvents,
    event: &Event,
    subject: &str,
    body: &str,
    row: &OutboxRow,
    last_seq: &mut HashMap<String, i32>,
) {
    assert_eq!(body, row.payload);
    assert_eq!(
        subject,
        format!("{}.events.{}", events.subject_prefix, row.event_type)
    );
    assert_eq!(event.event_type.as_str(), row.event_type);
    assert_eq!(event.request_id.as_str(), row.request_id);
    assert_eq!(event.order_id.map(|o| o.get()), row.order_id);
    assert_eq!(event.sequence as i32, row.sequence);
    let previous = last_seq.insert(row.request_id.clone(), row.sequence);
    assert_eq!(
        row.sequence,
        previous.unwrap_or(0) + 1,
        "events of {} out of order in the stream",
        row.request_id
    );
    if let Some(order) = event.order_id {
        let o = sqlx::query(
            "SELECT CONVERT(request_id USING utf8mb4) AS request_id, user_id, product_id, \
             quantity, CONVERT(cancel_reason USING utf8mb4) AS cancel_reason \
             FROM orders WHERE id = ?",
        )
        .bind(order.get())
        .fetch_one(&app.pool)
        .await
        .expect("the event's order");
        assert_eq!(o.get::<String, _>("request_id"), event.request_id.as_str());
        let (user_id, quantity) = event.units.expect("an order's event has a buyer");
        assert_eq!(o.get::<i64, _>("user_id"), user_id.get());
        assert_eq!(o.get::<i64, _>("product_id"), event.product_id.get());
        assert_eq!(o.get::<i32, _>("quantity") as u32, quantity.get());
        if event.event_type == EventType::OrderCancelled {
            assert_eq!(o.get::<Option<String>, _>("cancel_reason"), event.reason);
        }
    }
}

/// Buys `buyers` times (user i+1, quantity 1 or 2) and returns (order id, user) of the
/// accepted purchases; the rest must be sold_out.
async fn buy(app: &TestApp, product_id: i64, tag: &str, buyers: i64) -> Vec<(i64, i64)> {
    let mut orders = Vec::new();
    for i in 0..buyers {
        let user = i + 1;
        let (status, body) = app
            .purchase(&format!("REQ_{tag}_{i}"), user, product_id, 1 + i % 2)
            .await;
        match status {
            StatusCode::CREATED => orders.push((order_id(&body), user)),
            StatusCode::CONFLICT => assert_eq!(body["error"], "sold_out", "{body}"),
            other => panic!("purchase {i}: {other} {body}"),
        }
    }
    orders
}

pub(crate) async fn pay(app: &TestApp, order: i64, user: i64) -> StatusCode {
    app.pay(order, user).await.0
}

pub(crate) async fn cancel(app: &TestApp, order: i64, user: i64) -> StatusCode {
    app.cancel(order, user).await.0
}

/// Config with the test's database, for reaching the ledger directly.
fn config_of(app: &TestApp) -> Config {
    let env = HashMap::from([(
        "FLASHSALE_DATABASE_URL".to_owned(),
        app.db.as_ref().expect("db").url(),
    )]);
    Config::from_parts(None, &env).expect("config")
}

// Checks I7 end to end on the shared nats-server: purchases (some sold out), payments,
// cancellations, repeated pays and cancels that change nothing, a pay of a cancelled order
// (refused), and a fence (a reservation released without an order, written through the
// ledger's fence as recovery does). Then: exactly one outbox row per state change and
// none for the no-ops, every row sent, the stream holds each event once, in packed
// messages whose Nats-Msg-Id is the pack id of their events, per-order in order, every
// body matches its order, and the consumer's
// sales_stats equal the ledger's totals for both products.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_state_change_reaches_jetstream_once_and_stats_match() {
    let product = 3101;
    let (app, events) = TestEvents::selling(product, 20).await;
    let orders = buy(&app, product, "ev", 25).await;
    assert!(orders.len() >= 10, "{} orders", orders.len());
    for (i, &(order, user)) in orders.iter().enumerate() {
        match i % 4 {
            0 => {
                assert_eq!(pay(&app, order, user).await, StatusCode::OK);
                assert_eq!(pay(&app, order, user).await, StatusCode::OK, "repeat pay");
            }
            1 => {
                assert_eq!(cancel(&app, order, user).await, StatusCode::OK);
                assert_eq!(cancel(&app, order, user).await, StatusCode::OK, "repeat");
                assert_eq!(pay(&app, order, user).await, StatusCode::CONFLICT);
            }
            _ => {}
        }
    }
    // A fence: the request_id taken by a RELEASED reservation with no order.
    let fenced = 3102;
    app.create_product(fenced, 5, None).await;
    let ledger = flashsale::connect_ledger(&config_of(&app))
        .await
        .expect("ledger");
    let request = PurchaseRequest {
        request_id: RequestId::parse("request_id", "REQ_ev_fenced").expect("id"),
        user_id: UserId::parse(99).expect("user"),
        product_id: ProductId::parse(fenced).expect("product"),
        quantity: Quantity::from_stored(1).expect("quantity"),
    };
    ledger
        .fence(
            &request,
            HoldRef::from_stored(1, 1).expect("hold"),
            ReleaseReason::Abandoned,
        )
        .await
        .expect("fence");

    wait_drained(&app, &[product, fenced]).await;
    check_events(&app, &events, Format::Packed).await;
    let fence_event = outbox(&app)
        .await
        .into_iter()
        .find(|r| r.request_id == "REQ_ev_fenced")
        .expect("the fence's event");
    assert_eq!(fence_event.event_type, "reservation_released");
    assert_eq!(fence_event.order_id, None);
    assert_eq!(fence_event.sequence, 1);
    let payload: serde_json::Value = serde_json::from_str(&fence_event.payload).expect("json");
    assert_eq!(payload["reason"], "abandoned");
    assert_eq!(payload["order_id"], serde_json::Value::Null);
    invariants::assert_ok(&app, product).await;
    events.cleanup().await;
    app.cleanup().await;
}

// Checks packing against a broker that takes smaller messages than NATS's default
// (max_payload 4 KiB, set in a private nats-server's config): 40 purchases wait in the
// outbox while no relay runs, then the relay drains them in one wave. Every event reaches
// the stream once (check_events), in messages that fit the broker (each body at most its
// max_payload less the header room) and that still pack several events each. With packs
// sized by the default cap alone the broker would refuse every one, and the outbox would
// never drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packs_fit_a_broker_with_a_smaller_max_payload() {
    const MAX_PAYLOAD: usize = 4096;
    let nats = PrivateNats::start_with_max_payload(Some(MAX_PAYLOAD))
        .await
        .expect("private nats-server");
    let app = TestApp::spawn().await;
    let product = 3171;
    app.create_product(product, 100, None).await;
    let orders = buy(&app, product, "small", 40).await;
    assert_eq!(orders.len(), 40);
    assert_eq!(unsent(&app).await, 40);
    let events = TestEvents::start(&app, &nats.url()).await;
    wait_drained(&app, &[product]).await;
    check_events(&app, &events, Format::Packed).await;
    let messages = events.stream_messages().await;
    for (_, _, body) in &messages {
        assert!(
            body.len() <= MAX_PAYLOAD - 1024,
            "a {}-byte message for a broker taking {MAX_PAYLOAD}",
            body.len()
        );
    }
    assert!(
        messages.len() < 40 / 2,
        "40 events in {} messages: not packed",
        messages.len()
    );
    events.cleanup().await;
    app.cleanup().await;
}

// Checks the format for consumers of earlier versions (FLASHSALE_NATS_EVENTS_PER_MESSAGE=1,
// for a rolling upgrade): purchases, a payment and a cancellation; then every message in
// the stream is one bare event object (no array) with Nats-Msg-Id = its event id, each
// event once and per-order in order, and the consumer's sales_stats match the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_event_per_message_keeps_the_format_before_packing() {
    let app = TestApp::spawn().await;
    let events = TestEvents::start_with(
        &app,
        NATS_URL,
        &[("FLASHSALE_NATS_EVENTS_PER_MESSAGE", "1")],
    )
    .await;
    let product = 3151;
    app.create_product(product, 10, None).await;
    let orders = buy(&app, product, "one", 6).await;
    assert_eq!(pay(&app, orders[0].0, orders[0].1).await, StatusCode::OK);
    assert_eq!(cancel(&app, orders[1].0, orders[1].1).await, StatusCode::OK);
    wait_drained(&app, &[product]).await;
    check_events(&app, &events, Format::Single).await;
    assert_eq!(
        events.stream_messages().await.len(),
        outbox(&app).await.len(),
        "one message per event"
    );
    events.cleanup().await;
    app.cleanup().await;
}

// Checks the broker going down mid-sale (a private nats-server, killed): purchases, pays
// and cancels keep answering at their usual speed (each under OUTAGE_PURCHASE_MAX, far
// below any NATS timeout), their events pile up unsent in the outbox, and after the
// server restarts on the same port with the same store, the relay drains the outbox:
// every row sent, each event in the stream exactly once (the ones published before the
// outage too), per-order order kept, and the consumer's sales_stats match the ledger.
// Ends with the stock invariants of the product.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_down_mid_sale_outbox_grows_then_drains() {
    let mut nats = PrivateNats::start().await.expect("private nats-server");
    let app = TestApp::spawn().await;
    let events = TestEvents::start(&app, &nats.url()).await;
    let product = 3201;
    app.create_product(product, 500, None).await;

    let before = buy(&app, product, "before", 20).await;
    assert_eq!(before.len(), 20);
    wait_drained(&app, &[product]).await;
    let published_before = outbox(&app).await.len();
    let messages_before = events.stream_messages().await.len();

    nats.stop().expect("stop nats-server");
    let outage = Instant::now();
    let timed = stream::iter(0..60i64)
        .map(|i| {
            let app = &app;
            async move {
                let started = Instant::now();
                let body = app
                    .bought(&format!("REQ_down_{i}"), 1000 + i, product, 1)
                    .await;
                (order_id(&body), 1000 + i, started.elapsed())
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    let mut slowest = timed.iter().map(|t| t.2).max().unwrap_or_default();
    for (i, &(order, user, _)) in timed.iter().enumerate().take(30) {
        let started = Instant::now();
        let status = if i % 3 == 0 {
            cancel(&app, order, user).await
        } else {
            pay(&app, order, user).await
        };
        assert_eq!(status, StatusCode::OK);
        slowest = slowest.max(started.elapsed());
    }
    assert!(
        slowest < OUTAGE_PURCHASE_MAX,
        "a request took {slowest:?} while the broker was down"
    );
    // Give the relay time to try (and fail) a few rounds: nothing may be lost or marked.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rows = outbox(&app).await;
    let during = rows.len() - published_before;
    assert_eq!(
        during,
        60 + 20 + 2 * 10,
        "one row per state change during the outage"
    );
    assert_eq!(
        unsent(&app).await,
        during as i64,
        "the outbox grows while the broker is down"
    );
    println!(
        "broker down {:?}: slowest request {slowest:?}, {during} events waiting",
        outage.elapsed()
    );

    nats.restart().await.expect("restart nats-server");
    let back = Instant::now();
    wait_drained(&app, &[product]).await;
    println!(
        "outbox drained {:?} after the broker returned",
        back.elapsed()
    );
    check_events(&app, &events, Format::Packed).await;
    // The backlog went out packed: its 100 events are 60 order_created, then 20 order_paid
    // and 10 order_cancelled, then 10 reservation_released: three waves of one relay
    // round, four messages (a pack per type and wave); a few more if a round failed while
    // the broker came up.
    let backlog_messages = events.stream_messages().await.len() - messages_before;
    assert!(
        (4..=10).contains(&backlog_messages),
        "the 100 waiting events went out in {backlog_messages} messages"
    );
    invariants::assert_ok(&app, product).await;
    events.cleanup().await;
    app.cleanup().await;
}

// Checks duplicate delivery on the shared nats-server. (1) The relay republishes rows
// whose "sent" marks were lost (their outbox_unsent rows put back, as after a crash between
// publish and mark): only the relay's mark after the broker's acknowledgement deletes such
// a row, so their going again shows the republish. The first time the events may be
// packed otherwise than when they first went out: those messages reach the consumer,
// which applies none of their events again. The second time the same rows are packed the
// same way again, and JetStream drops every message by its Nats-Msg-Id (the stream does
// not grow). (2) A message published directly under an existing message's id is
// acknowledged as a duplicate. (3) A copy of an event under another Nats-Msg-Id (as one
// arriving after the duplicate window) is stored and delivered, and the consumer applies
// it zero times: consumed_event and sales_stats do not move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_are_dropped_by_msg_id_and_applied_once() {
    let product = 3301;
    let (app, events) = TestEvents::selling(product, 10).await;
    let orders = buy(&app, product, "dup", 3).await;
    assert_eq!(pay(&app, orders[0].0, orders[0].1).await, StatusCode::OK);
    wait_drained(&app, &[product]).await;
    let rows = outbox(&app).await;
    assert_eq!(rows.len(), 4);
    let consumed = app.count("SELECT COUNT(*) FROM consumed_event").await;
    assert_eq!(consumed, rows.len() as i64);
    let js = events.jetstream().await;
    let consumer_done = |last: u64| consumer_acked_through(&js, &events.stream, last);
    let last_seq = || async {
        let stream = js.get_stream(&events.stream).await.expect("stream");
        stream
            .get_info()
            .await
            .expect("stream info")
            .state
            .last_sequence
    };

    // (1) Republished by the relay, twice.
    let mut sizes = Vec::new();
    for round in 0..2 {
        sqlx::query("INSERT INTO outbox_unsent (id) SELECT id FROM outbox")
            .execute(&app.pool)
            .await
            .expect("lose the sent marks");
        assert_eq!(unsent(&app).await, 4);
        wait_until("the relay republished the rows", DRAIN_MAX, || async {
            unsent(&app).await == 0
        })
        .await;
        assert!(outbox(&app).await.iter().all(|r| r.sent), "round {round}");
        let last = last_seq().await;
        wait_until("the consumer took the copies", DRAIN_MAX, || {
            consumer_done(last)
        })
        .await;
        applied_once(
            &app,
            product,
            consumed,
            "a republished event was applied again",
        )
        .await;
        sizes.push(events.stream_messages().await.len());
    }
    assert_eq!(
        sizes[1], sizes[0],
        "JetStream dropped the messages republished with the same events"
    );
    let in_stream = sizes[1];

    // (2) An existing message's id published directly.
    let messages = events.stream_messages().await;
    let (first_id, first_subject, first_body) = &messages[0];
    let publish = |id: &str, body: Vec<u8>| {
        async_nats::jetstream::message::PublishMessage::build()
            .payload(body.into())
            .message_id(id)
    };
    let ack = js
        .send_publish(first_subject.clone(), publish(first_id, first_body.clone()))
        .await
        .expect("publish")
        .await
        .expect("ack");
    assert!(
        ack.duplicate,
        "same Nats-Msg-Id inside the window is a duplicate"
    );

    // (3) A copy the broker can't recognize reaches the consumer, which ignores it.
    let first = &rows[0];
    let subject = format!("{}.events.{}", events.subject_prefix, first.event_type);
    let copy = format!("[{}]", first.payload).into_bytes();
    let ack = js
        .send_publish(subject, publish("copy-after-the-window", copy))
        .await
        .expect("publish")
        .await
        .expect("ack");
    assert!(!ack.duplicate);
    assert_eq!(events.stream_messages().await.len(), in_stream + 1);
    wait_until("the consumer took the copy", DRAIN_MAX, || {
        consumer_done(ack.sequence)
    })
    .await;
    applied_once(&app, product, consumed, "the copy was not applied again").await;
    events.cleanup().await;
    app.cleanup().await;
}

// Checks that a broker that can't be reached at all (nothing listens on its port) never
// delays startup or purchases: the event workers start at once, purchases answer 201
// quickly, their events wait in the outbox, and the workers stop promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_broker_blocks_neither_startup_nor_purchases() {
    let app = TestApp::spawn().await;
    let started = Instant::now();
    let mut events = TestEvents::start(&app, &format!("nats://127.0.0.1:{}", free_port())).await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "starting the event workers waited {:?}",
        started.elapsed()
    );
    let product = 3401;
    app.create_product(product, 10, None).await;
    let started = Instant::now();
    let orders = buy(&app, product, "nobroker", 5).await;
    assert_eq!(orders.len(), 5);
    assert!(started.elapsed() < OUTAGE_PURCHASE_MAX * 5);
    assert_eq!(unsent(&app).await, 5);
    let stopping = Instant::now();
    events.stop().await;
    assert!(
        stopping.elapsed() < Duration::from_secs(2),
        "stop took {:?}",
        stopping.elapsed()
    );
    app.cleanup().await;
}

/// A ledger handle of its own on the test's database, standing for another instance's
/// (its relay, its consumer) beside the test's service.
/// Fails unless `relay`'s claim of up to 10 rows through `ledger`, for `lease`, gets
/// nothing; `why` says why it must not.
async fn claims_nothing(
    ledger: &flashsale_mysql::MysqlLedger,
    relay: &str,
    lease: Duration,
    why: &str,
) {
    use flashsale_app::ports::Outbox;
    let rows = ledger.claim(relay, 10, lease).await.expect("claim");
    assert!(rows.is_empty(), "{why}: {rows:?}");
}

async fn ledger_handle(app: &TestApp) -> flashsale_mysql::MysqlLedger {
    flashsale_mysql::MysqlLedger::connect(&flashsale_mysql::LedgerConfig {
        url: app.db.as_ref().expect("test database").url(),
        max_connections: 2,
        acquire_timeout: Duration::from_secs(5),
        transaction_timeout: Duration::from_secs(10),
        cluster: None,
    })
    .await
    .expect("ledger")
}

// Checks the MySQL adapter's outbox lease on the real MariaDB, through the `Outbox` port
// of two ledger handles standing for two instances' relays (no relay runs in this
// test's service): while relay A holds the outbox, relay B's claim gets nothing and A's
// own claim still gets the row; A's give_back records A's failed publish on the row (attempts,
// last_error) and ends the lease, and B then gets the same rows; a claim that
// finds nothing unsent leaves the lease free; a lease that ran out passes to the other
// relay without any give_back.
#[tokio::test]
async fn one_relay_at_a_time_holds_the_outbox() {
    use flashsale_app::ports::Outbox;
    let app = TestApp::selling(3600, 10, None).await;
    let (a, b) = (ledger_handle(&app).await, ledger_handle(&app).await);
    let lease = Duration::from_secs(30);
    app.bought("REQ_lease_1", 1, 3600, 1).await;

    let held = a.claim("relay-a", 10, lease).await.expect("claim");
    assert_eq!(held.len(), 1, "A leases the outbox and gets the unsent row");
    assert!(held.iter().all(|m| !m.blocked));
    claims_nothing(&b, "relay-b", lease, "B waits").await;
    assert_eq!(a.claim("relay-a", 10, lease).await.expect("renew").len(), 1);
    assert_eq!(held[0].attempts, 0);
    let failure = flashsale_app::PublishFailure {
        id: held[0].id,
        error: "broker said no".into(),
        refused: false,
    };
    a.give_back("relay-a", &[failure]).await.expect("give back");
    let taken = b.claim("relay-b", 10, lease).await.expect("claim");
    assert_eq!(
        taken.iter().map(|m| m.id).collect::<Vec<_>>(),
        held.iter().map(|m| m.id).collect::<Vec<_>>(),
        "B gets the same row once A let go"
    );
    assert_eq!(taken[0].attempts, 1, "A's failed attempt is counted");
    assert_eq!(
        app.count(
            "SELECT COUNT(*) FROM outbox_unsent \
             WHERE attempts = 1 AND last_error = 'broker said no'"
        )
        .await,
        1,
        "and its error kept"
    );
    claims_nothing(&a, "relay-a", lease, "A waits").await;
    b.mark_sent(&[taken[0].id]).await.expect("mark sent");
    b.mark_sent(&[taken[0].id])
        .await
        .expect("marking again changes nothing");
    b.give_back("relay-b", &[]).await.expect("give back");

    claims_nothing(&a, "relay-a", lease, "all sent").await;
    assert_eq!(
        app.count("SELECT COUNT(*) FROM outbox_lease WHERE holder IS NULL")
            .await,
        1,
        "an idle claim leaves the lease free"
    );

    app.bought("REQ_lease_2", 2, 3600, 1).await;
    let short = a
        .claim("relay-a", 10, Duration::from_millis(1))
        .await
        .expect("claim");
    assert_eq!(short.len(), 1);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let after = b.claim("relay-b", 10, lease).await.expect("claim");
    assert_eq!(after.len(), 1, "A's lease ran out: B relays");
    app.cleanup().await;
}

// Checks that the MySQL adapter keeps its outbox lease across rounds while a relay drains
// a backlog, and only then (real MariaDB, two ledger handles standing for two instances'
// relays): a claim that takes a full batch leaves the lease with A after its give_back,
// so B gets nothing; A's next claim within the renewal interval runs no lease statement
// (the row's lease_until does not move); the claim that finds the outbox drained ends
// the lease; and `let_go` (the relay stopping) ends a lease that was kept. Without the
// keeping, B would get the second event; without the skipped renewal, lease_until would
// move.
#[tokio::test]
async fn a_relay_keeps_the_outbox_while_it_drains_a_backlog() {
    use flashsale_app::ports::Outbox;
    let app = TestApp::selling(3610, 10, None).await;
    let (a, b) = (ledger_handle(&app).await, ledger_handle(&app).await);
    let lease = Duration::from_secs(30);
    for (i, user) in [(1, 1), (2, 2), (3, 3)] {
        app.bought(&format!("REQ_keep_{i}"), user, 3610, 1).await;
    }
    let lease_until = || async {
        sqlx::query_scalar::<_, Option<chrono::NaiveDateTime>>(
            "SELECT lease_until FROM outbox_lease WHERE id = 1",
        )
        .fetch_one(&app.pool)
        .await
        .expect("lease row")
    };

    // A full batch (1 of 1): A goes on at once and keeps the outbox.
    let first = a.claim("relay-a", 1, lease).await.expect("claim");
    assert_eq!(first.len(), 1);
    let until = lease_until().await;
    assert!(until.is_some(), "A took the lease");
    a.mark_sent(&[first[0].id]).await.expect("mark");
    a.give_back("relay-a", &[]).await.expect("give back");
    claims_nothing(&b, "relay-b", lease, "B waits while A drains the backlog").await;
    let second = a.claim("relay-a", 1, lease).await.expect("claim");
    assert_eq!(second.len(), 1, "A's next round");
    assert_ne!(second[0].id, first[0].id);
    assert_eq!(
        lease_until().await,
        until,
        "a round right after the last one renews nothing"
    );
    a.mark_sent(&[second[0].id]).await.expect("mark");
    a.give_back("relay-a", &[]).await.expect("give back");

    // Stopping ends a kept lease: B takes over at once.
    a.let_go("relay-a").await.expect("let go");
    let third = b.claim("relay-b", 10, lease).await.expect("claim");
    assert_eq!(third.len(), 1, "B relays once A let go");
    b.mark_sent(&[third[0].id]).await.expect("mark");
    // Fewer than its batch: B's round drained the outbox, so it does not keep the lease.
    b.give_back("relay-b", &[]).await.expect("give back");
    assert_eq!(
        app.count("SELECT COUNT(*) FROM outbox_lease WHERE holder IS NULL")
            .await,
        1,
        "a round that drained the outbox ends the lease"
    );
    assert_eq!(unsent(&app).await, 0);
    app.cleanup().await;
}

// Checks the MySQL adapter's sales-statistics store with a delivery that holds an event
// consumed before and one event twice (real MariaDB). However the store finds them out
// (it first takes a delivery's events for new, and a duplicate key sends it back to look
// them up), each event is applied once: the first delivery applies both its events, the
// second applies only its new one, and sales_stats and consumed_event count each event
// once.
#[tokio::test]
async fn a_delivery_with_events_consumed_before_applies_only_the_new_ones() {
    use flashsale_app::{Applied, StatsDelta, StatsStore};
    let app = TestApp::spawn().await;
    let ledger = ledger_handle(&app).await;
    let product = ProductId::parse(3620).expect("product id");
    let created = |id: &str, units: i64| flashsale_app::ports::StatsEvent {
        event_id: id.to_owned(),
        event_type: EventType::OrderCreated,
        product_id: product,
        delta: StatsDelta {
            orders_created: 1,
            units_ordered: units,
            ..StatsDelta::default()
        },
    };
    let first = ledger
        .apply_all(&[created("ev-1", 1), created("ev-2", 2)])
        .await
        .expect("apply");
    assert_eq!(first, vec![Applied::Applied, Applied::Applied]);
    let again = ledger
        .apply_all(&[created("ev-2", 2), created("ev-3", 4), created("ev-3", 4)])
        .await
        .expect("apply");
    assert_eq!(
        again,
        vec![
            Applied::AlreadyApplied,
            Applied::Applied,
            Applied::AlreadyApplied
        ]
    );
    let row = sqlx::query(
        "SELECT orders_created, units_ordered FROM sales_stats WHERE product_id = 3620",
    )
    .fetch_one(&app.pool)
    .await
    .expect("stats row");
    assert_eq!(
        row.get::<i64, _>("orders_created"),
        3,
        "each event counted once"
    );
    assert_eq!(row.get::<i64, _>("units_ordered"), 7);
    assert_eq!(app.count("SELECT COUNT(*) FROM consumed_event").await, 3);
    app.cleanup().await;
}

// Checks that an event whose id is longer than the consumers' key column (65
// characters) is refused by the decoder instead of poisoning its message: published
// directly in one message with a valid event of another product (after a purchase,
// whose events make the relay create the stream), the valid one is
// applied (its id in consumed_event, sales_stats counting one order) and the message is
// moved to the dead-letter stream (undecodable, at its first delivery) and acknowledged,
// not redelivered; the long id is recorded nowhere, cut or whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_id_too_long_is_skipped_and_its_message_applied() {
    // A purchase first, so that the relay has made the stream.
    let (app, events) = TestEvents::selling(3392, 1).await;
    buy(&app, 3392, "long", 1).await;
    wait_drained(&app, &[3392]).await;
    let js = events.jetstream().await;
    let event = |event_id: &str, product: i64| {
        format!(
            r#"{{"event_id": "{event_id}", "event_type": "order_created", "sequence": 1, "order_id": 1, "request_id": "REQ_long_{product}", "product_id": {product}, "user_id": 1, "quantity": 1, "reason": null, "occurred_at": "2026-12-04T10:00:00.000001Z"}}"#
        )
    };
    let long_id = "x".repeat(65);
    let good_id = "0193a7c4-5d2e-7f00-8000-000000000065";
    let body = format!("[{}, {}]", event(&long_id, 3390), event(good_id, 3391));
    let ack = js
        .send_publish(
            format!("{}.events.order_created", events.subject_prefix),
            async_nats::jetstream::message::PublishMessage::build()
                .payload(body.into_bytes().into())
                .message_id("long-event-id"),
        )
        .await
        .expect("publish")
        .await
        .expect("ack");
    wait_until("the consumer acknowledged the message", DRAIN_MAX, || {
        consumer_acked_through(&js, &events.stream, ack.sequence)
    })
    .await;
    assert_eq!(
        app.count(&format!(
            "SELECT COUNT(*) FROM consumed_event WHERE event_id = '{good_id}'"
        ))
        .await,
        1
    );
    assert_eq!(
        app.count("SELECT COUNT(*) FROM consumed_event WHERE product_id <> 3392")
            .await,
        1
    );
    assert_eq!(
        app.count(
            "SELECT CAST(COALESCE(SUM(orders_created), 0) AS SIGNED) FROM sales_stats \
             WHERE product_id = 3391"
        )
        .await,
        1
    );
    assert_eq!(
        app.count("SELECT COUNT(*) FROM sales_stats WHERE product_id = 3390")
            .await,
        0
    );
    let letters = crate::dead_letters::bus(&events)
        .await
        .dead_letters()
        .await
        .expect("dead letters");
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].key, ack.sequence.to_string());
    assert_eq!(
        (letters[0].reason.as_str(), letters[0].deliveries),
        ("undecodable", 1)
    );
    events.cleanup().await;
    app.cleanup().await;
}
