//! flashsale's events on NATS JetStream.
//!
//! - [`NatsBus`] implements the [`EventBus`] port: it makes sure the stream exists (file
//!   storage, subjects `<prefix>.events.>`, a duplicate window), packs the events the relay
//!   hands it together into messages ([`packs`]: one subject, up to
//!   [`EVENTS_PER_MESSAGE_MAX`] events each), publishes each to
//!   `<prefix>.events.<event_type>` with `Nats-Msg-Id` = [`pack_id`] of its events (with
//!   one event per message configured: the bare event under its event id), and
//!   waits (bounded) for JetStream's acknowledgement. It connects lazily and reconnects by
//!   itself: nothing here ever waits for a broker that is down, it reports "not
//!   connected" instead.
//! - [`run_consumer`] drives one durable pull consumer: it fetches batches, hands their
//!   events to the [`Consume`] use case and acknowledges a message only after all its
//!   events were applied (or found applied before).
//! - [`EventWorkers`] runs the relay loop and the consumer loop as tasks and stops them.
//!
//! A message body is a JSON array of outbox payloads (or one bare payload);
//! `docs/events.md` describes it and [`decode_message`] reads it.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::connection::State;
use async_nats::jetstream::{self, consumer, context, stream};
use async_nats::ConnectErrorKind;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use flashsale_app::ports::{BusError, ErrorKind, EventBus, Outbox, StatsStore};
use flashsale_app::{Consume, Event, EventType, Metrics, OutboxMessage, Relay};
use flashsale_core::{OrderId, ProductId, Quantity, RequestId, UserId};
use futures::StreamExt;
use serde::Deserialize;
use tokio::sync::{watch, Mutex};
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

/// Longest wait for JetStream to acknowledge a publish or answer an API request (stream
/// and consumer creation). Locally an ack takes a millisecond; past this the broker is
/// stalled, the event stays in the outbox, and the relay retries. It also bounds a relay
/// round (one wait per wave), which `CLAIM_LEASE` (30 s) must exceed.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait for one TCP connection attempt to the broker.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Pause between reconnection attempts grows from this…
const RECONNECT_DELAY_FIRST: Duration = Duration::from_millis(50);
/// …to this at most: a returning broker is found within about a second, at the cost of
/// one refused connection a second while it is down.
const RECONNECT_DELAY_MAX: Duration = Duration::from_secs(1);
/// JetStream's deduplication window on `Nats-Msg-Id`: longer than a relay's lease (30 s)
/// plus its backoff, so the republication of a message whose "sent" marks were lost is
/// dropped by the broker; older copies, and events republished in another pack, are
/// dropped by the consumers' own deduplication.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// How long the stream keeps events: consumers that were down this long still catch
/// up, and the stream's disk use stays bounded. (The outbox keeps every event anyway.)
pub const STREAM_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// The durable consumer that keeps `sales_stats`.
pub const CONSUMER_NAME: &str = "sales_stats";
/// How long JetStream waits for the consumer's ack before delivering a message again. A
/// fetch ([`CONSUMER_BATCH`] messages, at most 4,096 events) is applied in chunks, each
/// one transaction bounded by 5 s in the store (or, after a race with another consumer,
/// one short transaction per event); a fetch that arrives at once makes at most four,
/// one that trickles in more but smaller ones: well within this either way.
const CONSUMER_ACK_WAIT: Duration = Duration::from_secs(30);
/// Messages the consumer fetches at once: bounds memory, the work redelivered after a
/// crash and the time the last of them waits for its ack (packed, up to 32 × 128
/// events), while a backlog still drains in large steps.
pub const CONSUMER_BATCH: usize = 32;
/// Events after which a chunk takes no more messages (so at most this plus one message's
/// [`EVENTS_PER_MESSAGE_MAX`] in one transaction): its INSERT binds 3 values per event,
/// far under MariaDB's 65,535, and a chunk that must fall back to one transaction per
/// event (a race with another consumer) stays short.
pub const CONSUMER_EVENTS_MAX: usize = 1024;
/// Most events packed into one message (the default of `events_per_message`). One NATS
/// message costs the broker about as much as one event's (storing it, acknowledging the
/// publish, delivering it, taking the consumer's ack), so packing divides its work per
/// event by the pack's size (BENCHMARKS.md, ablation row E4). A relay round reads 256 rows;
/// half of that keeps a busy round at two or three messages while a consumer's chunk
/// stays bounded.
pub const EVENTS_PER_MESSAGE_MAX: usize = 128;
/// Most body bytes of one message: an event is at most about 600 bytes, so a 128-event
/// pack is about 75 KiB; the broker's own `max_payload` (1 MiB unless a server lowers
/// it) caps it further ([`MESSAGE_HEADROOM`] below it). A single event larger than the cap
/// still goes alone (and a broker that refuses it keeps it in the outbox, as before).
pub const MESSAGE_BYTES_MAX: usize = 256 * 1024;
/// Room left under the broker's `max_payload` for the message's headers
/// (`Nats-Msg-Id`), which count against it too.
const MESSAGE_HEADROOM: usize = 1024;
/// How long one fetch waits for messages when there are none: the consumer's idle
/// latency, and one pull request per this period while idle.
const FETCH_WAIT: Duration = Duration::from_secs(1);
/// How long the consumer waits for more messages after the first of a chunk, so that a
/// steady stream is applied in chunks of up to [`CONSUMER_BATCH`] messages or
/// [`CONSUMER_EVENTS_MAX`] events (one transaction each)
/// instead of a transaction per few events: 20 ms of added delay on a statistic nobody
/// reads within that time, for several times fewer commits.
const CONSUMER_LINGER: Duration = Duration::from_millis(20);
/// After a failed apply (database down), the message is delivered again this much later.
const NAK_DELAY: Duration = Duration::from_secs(1);
/// The consumer's pause after a failure (broker or database) grows from this…
const CONSUMER_BACKOFF_FIRST: Duration = Duration::from_millis(100);
/// …to this at most.
const CONSUMER_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How long stopping waits for the loops to finish their current round (each is bounded
/// by the timeouts above) before it abandons them.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the relay and the consumer wait for the broker's first connection before
/// their first round: the client connects in the background (a few milliseconds when
/// NATS is up), and a round before it would only fail, warn and count a failure at every
/// start. Past it they start anyway and back off as usual (NATS is down).
const FIRST_CONNECT_GRACE: Duration = Duration::from_secs(2);
/// How often that wait looks at the connection.
const FIRST_CONNECT_POLL: Duration = Duration::from_millis(10);

/// Where and how events are published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsConfig {
    /// `nats://host:port`.
    pub url: String,
    /// Events go to `<subject_prefix>.events.<event_type>`.
    pub subject_prefix: String,
    /// The JetStream stream that captures `<subject_prefix>.events.>`; created if missing.
    pub stream: String,
    /// Most events in one message, 1..=[`EVENTS_PER_MESSAGE_MAX`]. 1 publishes every event
    /// alone as a bare JSON object with `Nats-Msg-Id` = its event id: the format before
    /// packing, which consumers of earlier versions read (docs/events.md, upgrading).
    pub events_per_message: usize,
}

impl NatsConfig {
    pub fn subject(&self, event_type: EventType) -> String {
        format!("{}.events.{}", self.subject_prefix, event_type.as_str())
    }

    pub fn subjects(&self) -> String {
        format!("{}.events.>", self.subject_prefix)
    }
}

/// The [`EventBus`] on NATS JetStream.
pub struct NatsBus {
    client: async_nats::Client,
    js: jetstream::Context,
    config: NatsConfig,
    /// The stream was found or created on this connection; cleared when the broker says
    /// no stream captures the subject, so it is made again.
    stream_ready: AtomicBool,
    /// Serializes stream creation.
    ensuring: Mutex<()>,
}

fn bus_error(
    what: &str,
    kind: ErrorKind,
    e: impl std::error::Error + Send + Sync + 'static,
) -> BusError {
    BusError::caused(kind, what, e)
}

impl NatsBus {
    /// Creates the client without waiting for the broker: it connects in the background
    /// and reconnects forever. Fails only on an unusable URL.
    pub async fn connect(config: NatsConfig) -> Result<Self, BusError> {
        let client = async_nats::ConnectOptions::new()
            .name("flashsale")
            .retry_on_initial_connect()
            .connection_timeout(CONNECT_TIMEOUT)
            .max_reconnects(None)
            .reconnect_delay_callback(|attempts| {
                let exp = u32::try_from(attempts).unwrap_or(u32::MAX).min(16);
                RECONNECT_DELAY_FIRST
                    .saturating_mul(2u32.saturating_pow(exp))
                    .min(RECONNECT_DELAY_MAX)
            })
            .connect(config.url.as_str())
            .await
            .map_err(|e| {
                let kind = match e.kind() {
                    ConnectErrorKind::ServerParse => ErrorKind::Config,
                    ConnectErrorKind::TimedOut => ErrorKind::TimedOut,
                    _ => ErrorKind::Unreachable,
                };
                bus_error(&format!("nats url {}", config.url), kind, e)
            })?;
        let js = jetstream::ContextBuilder::new()
            .timeout(REQUEST_TIMEOUT)
            .build(client.clone());
        Ok(Self {
            client,
            js,
            config,
            stream_ready: AtomicBool::new(false),
            ensuring: Mutex::new(()),
        })
    }

    pub fn config(&self) -> &NatsConfig {
        &self.config
    }

    /// The JetStream context (tests read the stream back through it).
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.js
    }

    /// Finds the stream, or creates it: file storage, `<prefix>.events.>`, the duplicate
    /// window and retention above. An existing stream is used as it is.
    pub async fn ensure_stream(&self) -> Result<stream::Stream, BusError> {
        self.ready()?;
        let _one = self.ensuring.lock().await;
        let config = stream::Config {
            name: self.config.stream.clone(),
            subjects: vec![self.config.subjects()],
            storage: stream::StorageType::File,
            retention: stream::RetentionPolicy::Limits,
            discard: stream::DiscardPolicy::Old,
            duplicate_window: DUPLICATE_WINDOW,
            max_age: STREAM_MAX_AGE,
            ..Default::default()
        };
        let stream = self.js.get_or_create_stream(config).await.map_err(|e| {
            use context::CreateStreamErrorKind as K;
            let kind = match e.kind() {
                K::TimedOut => ErrorKind::TimedOut,
                K::JetStreamUnavailable => ErrorKind::Unreachable,
                K::EmptyStreamName | K::InvalidStreamName | K::DomainAndExternalSet => {
                    ErrorKind::Config
                }
                K::ResponseParse => ErrorKind::Corrupt,
                _ => ErrorKind::Rejected,
            };
            bus_error(&format!("stream {}", self.config.stream), kind, e)
        })?;
        if !self.stream_ready.swap(true, Ordering::SeqCst) {
            info!(stream = %self.config.stream, subjects = %self.config.subjects(), "event stream ready");
        }
        Ok(stream)
    }

    /// The durable pull consumer of [`CONSUMER_NAME`], created if missing. It starts at
    /// the stream's first message and acknowledges explicitly; it never gives up on a
    /// message (the statistics must count every event).
    pub async fn ensure_consumer(&self) -> Result<consumer::PullConsumer, BusError> {
        let stream = self.ensure_stream().await?;
        stream
            .get_or_create_consumer(
                CONSUMER_NAME,
                consumer::pull::Config {
                    durable_name: Some(CONSUMER_NAME.to_owned()),
                    deliver_policy: consumer::DeliverPolicy::All,
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: CONSUMER_ACK_WAIT,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| {
                use stream::ConsumerErrorKind as K;
                let kind = match e.kind() {
                    K::TimedOut => ErrorKind::TimedOut,
                    K::InvalidName | K::InvalidConsumerType => ErrorKind::Config,
                    _ => ErrorKind::Rejected,
                };
                bus_error(&format!("consumer {CONSUMER_NAME}"), kind, e)
            })
    }

    /// Sends one pack, its body moved into the message (the pack keeps its members and
    /// id for the acknowledgement); the returned future waits for its acknowledgement.
    async fn send(&self, pack: &mut Pack) -> Result<context::PublishAckFuture, BusError> {
        let publish = jetstream::message::PublishMessage::build()
            .payload(bytes::Bytes::from(std::mem::take(&mut pack.body)))
            .message_id(pack.id.as_str());
        self.js
            .send_publish(self.config.subject(pack.event_type), publish)
            .await
            .map_err(|e| self.publish_error(e))
    }

    fn publish_error(&self, e: context::PublishError) -> BusError {
        if matches!(e.kind(), context::PublishErrorKind::StreamNotFound) {
            // Deleted behind our back, or never made on this server: make it again.
            self.stream_ready.store(false, Ordering::SeqCst);
        }
        use context::PublishErrorKind as K;
        let kind = match e.kind() {
            K::TimedOut => ErrorKind::TimedOut,
            K::BrokenPipe => ErrorKind::Unreachable,
            K::StreamNotFound => ErrorKind::NotReady,
            K::MaxPayloadExceeded => ErrorKind::TooLarge,
            _ => ErrorKind::Rejected,
        };
        bus_error("publish", kind, e)
    }

    async fn acked(&self, pack: &Pack, ack: context::PublishAckFuture) -> Result<(), BusError> {
        let ack = ack.await.map_err(|e| self.publish_error(e))?;
        if ack.duplicate {
            debug!(
                message_id = %pack.id,
                events = pack.members.len(),
                stream_seq = ack.sequence,
                "broker already had this message"
            );
        }
        Ok(())
    }

    /// How this bus packs events: the configured count, and a body that fits the broker.
    fn pack_limits(&self) -> PackLimits {
        // What the client itself enforces (the broker's announced limit); 0 is not
        // expected, and is read as "unknown": the default cap alone.
        let broker = match self.client.max_payload() {
            0 => MESSAGE_BYTES_MAX,
            n => n.saturating_sub(MESSAGE_HEADROOM),
        };
        PackLimits {
            events: self
                .config
                .events_per_message
                .clamp(1, EVENTS_PER_MESSAGE_MAX),
            bytes: MESSAGE_BYTES_MAX.min(broker).max(1),
        }
    }

    async fn prepared(&self) -> Result<(), BusError> {
        self.ready()?;
        if !self.stream_ready.load(Ordering::SeqCst) {
            self.ensure_stream().await?;
        }
        Ok(())
    }
}

#[async_trait]
impl EventBus for NatsBus {
    fn ready(&self) -> Result<(), BusError> {
        match self.client.connection_state() {
            State::Connected => Ok(()),
            other => Err(BusError::unreachable(format!(
                "not connected to {} ({other:?})",
                self.config.url
            ))),
        }
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<(), BusError> {
        let mut results = self.publish_all(std::slice::from_ref(message)).await;
        results
            .pop()
            .unwrap_or_else(|| Err(BusError::stopped("no result for the event")))
    }

    /// Packs the events into messages ([`packs`]), sends every message first, then waits
    /// for all the acknowledgements together: one broker round trip for the whole wave.
    /// Each event gets its message's result.
    async fn publish_all(&self, messages: &[OutboxMessage]) -> Vec<Result<(), BusError>> {
        if let Err(e) = self.prepared().await {
            return messages.iter().map(|_| Err(e.clone())).collect();
        }
        let mut packs = packs(messages, &self.pack_limits());
        let mut sent = Vec::with_capacity(packs.len());
        for pack in &mut packs {
            sent.push(self.send(pack).await);
        }
        let acks = sent.into_iter().zip(&packs).map(|(sent, pack)| async move {
            match sent {
                Ok(ack) => self.acked(pack, ack).await,
                Err(e) => Err(e),
            }
        });
        per_event(
            messages.len(),
            &packs,
            futures::future::join_all(acks).await,
        )
    }
}

/// Each event's result: its pack's. An event no pack holds (none, if `packs` came from
/// [`packs`]) is reported failed, never as published.
fn per_event(
    events: usize,
    packs: &[Pack],
    results: Vec<Result<(), BusError>>,
) -> Vec<Result<(), BusError>> {
    let mut out: Vec<Result<(), BusError>> = (0..events)
        .map(|_| Err(BusError::stopped("no message held the event")))
        .collect();
    for (pack, result) in packs.iter().zip(results) {
        for &member in &pack.members {
            if let Some(slot) = out.get_mut(member) {
                *slot = result.clone();
            }
        }
    }
    out
}

/// One message to publish: events of one type, packed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pack {
    pub event_type: EventType,
    /// Positions of its events in the slice given to [`packs`], in order.
    pub members: Vec<usize>,
    /// `[payload,payload,…]`: the events' outbox payloads as they are, in a JSON array
    /// (with one event per message: that event's payload alone).
    pub body: String,
    /// Its `Nats-Msg-Id`: [`pack_id`] of its events (with one event per message: the
    /// event id).
    pub id: String,
}

/// How events are packed into messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackLimits {
    /// Most events in one message; 1: each event alone, as a bare object (no array).
    pub events: usize,
    /// Most body bytes of one message (an event larger than that still goes alone).
    pub bytes: usize,
}

/// Groups events into messages: by type (each type has its own subject), in the order
/// given, at most `limits.events` events and `limits.bytes` body bytes each. The relay
/// hands over one wave at a time, which holds at most one event of each order, so packing
/// can't reorder an order's events. With `limits.events` 1 every event goes alone in the
/// format before packing: its payload as the body, its event id as the message id.
pub fn packs(messages: &[OutboxMessage], limits: &PackLimits) -> Vec<Pack> {
    if limits.events <= 1 {
        return messages
            .iter()
            .enumerate()
            .map(|(i, m)| Pack {
                event_type: m.event_type,
                members: vec![i],
                body: m.payload.clone(),
                id: m.event_id.clone(),
            })
            .collect();
    }
    let mut open: Vec<Pack> = Vec::new();
    let mut done = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let slot = match open.iter().position(|p| p.event_type == m.event_type) {
            Some(slot)
                if open[slot].members.len() < limits.events
                    && open[slot].body.len() + 1 + m.payload.len() < limits.bytes =>
            {
                slot
            }
            full => {
                if let Some(slot) = full {
                    done.push(open.swap_remove(slot));
                }
                open.push(Pack {
                    event_type: m.event_type,
                    members: Vec::new(),
                    body: String::from("["),
                    id: String::new(),
                });
                open.len() - 1
            }
        };
        let pack = &mut open[slot];
        if !pack.members.is_empty() {
            pack.body.push(',');
        }
        pack.body.push_str(&m.payload);
        pack.members.push(i);
    }
    done.extend(open);
    for pack in &mut done {
        pack.body.push(']');
        pack.id = pack_id(pack.members.iter().map(|&i| messages[i].event_id.as_str()));
    }
    done.sort_by_key(|p| p.members[0]);
    done
}

/// Namespace of the [`pack_id`]s (a random UUID, fixed forever: changing it would give
/// the same pack another id).
const PACK_NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x6c1f_2a58_93d4_4f0e_9b7a_3e51_c0d8_a246);

/// The `Nats-Msg-Id` of a message holding these events, in this order: a name-based UUID
/// (v5) of their ids. The same events packed the same way again (a republication after
/// lost "sent" marks) get the same id, which the broker drops inside its duplicate
/// window; any other pack gets another.
pub fn pack_id<'a>(event_ids: impl IntoIterator<Item = &'a str>) -> String {
    let mut name = String::new();
    for id in event_ids {
        name.push_str(id);
        name.push('\n');
    }
    uuid::Uuid::new_v5(&PACK_NAMESPACE, name.as_bytes()).to_string()
}

/// A message body that is not a valid event.
#[derive(Debug, thiserror::Error)]
#[error("invalid event: {0}")]
pub struct DecodeError(String);

/// The JSON body as it is on the wire (docs/events.md).
#[derive(Deserialize)]
struct WireEvent<'a> {
    event_id: String,
    // Borrowed from the body unless escaped: both are only read, then dropped.
    #[serde(borrow)]
    event_type: Cow<'a, str>,
    sequence: u32,
    order_id: Option<i64>,
    #[serde(borrow)]
    request_id: Cow<'a, str>,
    product_id: i64,
    user_id: i64,
    quantity: i64,
    reason: Option<String>,
    #[serde(deserialize_with = "rfc3339")]
    occurred_at: DateTime<Utc>,
}

/// `occurred_at` as docs/events.md specifies it, RFC 3339, read by chrono's RFC 3339
/// parser straight from the body (borrowed, or serde's copy when escaped): serde's
/// default for `DateTime` tries the laxer forms of `FromStr`, about a sixth of an event's
/// decoding (`cargo bench -p flashsale-nats --bench decode`).
fn rfc3339<'de, D: serde::Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
    struct Rfc3339;
    impl serde::de::Visitor<'_> for Rfc3339 {
        type Value = DateTime<Utc>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an RFC 3339 timestamp")
        }

        fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Self::Value, E> {
            DateTime::parse_from_rfc3339(text)
                .map(|t| t.with_timezone(&Utc))
                .map_err(E::custom)
        }
    }
    d.deserialize_str(Rfc3339)
}

/// Reads a message body: its events, each decoded on its own (one bad event doesn't take
/// the others with it). A body is a JSON array of events; a body that is not an array is
/// read as one event (flashsale published one event object per message before it packed
/// them). `Err`: the body begins as an array but isn't one.
pub fn decode_message(body: &[u8]) -> Result<Vec<Result<Event, DecodeError>>, DecodeError> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'[') {
        return Ok(vec![decode_event(body)]);
    }
    // The usual case in one pass: a UTF-8 body (checked once, not string by string as
    // `from_slice` does) whose elements are all events. Otherwise each element is read on
    // its own, so that one malformed event costs only itself (BENCHMARKS.md, ablation
    // row S12).
    if let Some(events) = std::str::from_utf8(body)
        .ok()
        .and_then(|text| serde_json::from_str::<Vec<WireEvent<'_>>>(text).ok())
    {
        return Ok(events.into_iter().map(checked).collect());
    }
    let items: Vec<&serde_json::value::RawValue> =
        serde_json::from_slice(body).map_err(|e| DecodeError(e.to_string()))?;
    Ok(items
        .into_iter()
        .map(|item| decode_event(item.get().as_bytes()))
        .collect())
}

/// Reads one event (an element of a message body) into an [`Event`], checking every field
/// as the domain does.
pub fn decode_event(body: &[u8]) -> Result<Event, DecodeError> {
    checked(serde_json::from_slice(body).map_err(|e| DecodeError(e.to_string()))?)
}

/// The longest `event_id` an event may carry: the width of the consumers' key column
/// (`consumed_event.event_id`, and the outbox's). flashsale's own ids are UUIDs, 36.
pub const EVENT_ID_CHARS_MAX: usize = 64;

/// An event as read, its fields checked as the domain does.
fn checked(w: WireEvent<'_>) -> Result<Event, DecodeError> {
    let bad = |e: &dyn std::fmt::Display| DecodeError(e.to_string());
    // The consumers' deduplication key, stored as at most 64 characters: a longer one
    // would be cut, and two ids cut alike would count as one event.
    if w.event_id.is_empty() || w.event_id.chars().count() > EVENT_ID_CHARS_MAX {
        return Err(DecodeError(format!(
            "event_id: 1 to {EVENT_ID_CHARS_MAX} characters, not {}",
            w.event_id.chars().count()
        )));
    }
    Ok(Event {
        event_type: w.event_type.parse().map_err(|e| bad(&e))?,
        event_id: w.event_id,
        sequence: w.sequence,
        order_id: w
            .order_id
            .map(OrderId::parse)
            .transpose()
            .map_err(|e| bad(&e))?,
        request_id: RequestId::parse("request_id", &w.request_id).map_err(|e| bad(&e))?,
        product_id: ProductId::parse(w.product_id).map_err(|e| bad(&e))?,
        user_id: UserId::parse(w.user_id).map_err(|e| bad(&e))?,
        quantity: Quantity::from_stored(w.quantity)
            .ok_or_else(|| DecodeError(format!("quantity {}", w.quantity)))?,
        reason: w.reason,
        occurred_at: w.occurred_at,
    })
}

/// What became of one delivered chunk.
enum Handled {
    Done,
    /// The store failed: the messages will come again; back off.
    Retry,
}

/// Messages delivered together and the events in them, applied in one store transaction
/// where it can.
#[derive(Default)]
struct Chunk {
    messages: Vec<jetstream::Message>,
    events: Vec<Event>,
}

impl Chunk {
    /// Adds a delivered message's events. Undecodable events are logged and left out:
    /// redelivering them would never help. A message with no event to apply (not ours, or
    /// corrupt) is terminated, so that it never comes again.
    async fn take(&mut self, message: jetstream::Message) {
        let decoded = match decode_message(&message.payload) {
            Ok(decoded) => decoded,
            Err(e) => vec![Err(e)],
        };
        let before = self.events.len();
        for event in decoded {
            match event {
                Ok(event) => self.events.push(event),
                Err(e) => {
                    error!(subject = %message.subject, error = %e, "undecodable event dropped");
                }
            }
        }
        if self.events.len() > before {
            self.messages.push(message);
        } else if let Err(e) = message.ack_with(jetstream::AckKind::Term).await {
            warn!(error = %e, "could not terminate an undecodable message");
        }
    }

    /// Whether it takes no more messages.
    fn full(&self) -> bool {
        self.messages.len() >= CONSUMER_BATCH || self.events.len() >= CONSUMER_EVENTS_MAX
    }

    /// Applies the events, then acknowledges their messages; on a store failure the
    /// messages are all NAKed to come again.
    async fn handle(self, consume: &Consume) -> Handled {
        if self.events.is_empty() {
            return Handled::Done;
        }
        match consume.apply_all(&self.events).await {
            Ok(_) => {
                for message in &self.messages {
                    // A lost ack means one more delivery, which the store ignores.
                    if let Err(e) = message.ack().await {
                        warn!(subject = %message.subject, error = %e, "ack failed; the message will be delivered again");
                    }
                }
                Handled::Done
            }
            Err(e) => {
                warn!(events = self.events.len(), error = %e, "events not applied; they will be delivered again");
                for message in &self.messages {
                    if let Err(e) = message
                        .ack_with(jetstream::AckKind::Nak(Some(NAK_DELAY)))
                        .await
                    {
                        debug!(error = %e, "nak failed; redelivered after the ack wait instead");
                    }
                }
                Handled::Retry
            }
        }
    }
}

/// Sleeps `pause` unless `stop` turns true first; returns whether to go on.
async fn pause_or_stop(pause: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        () = tokio::time::sleep(pause) => !*stop.borrow(),
        _ = stop.changed() => false,
    }
}

/// The sales-statistics consumer: fetches batches from the durable consumer and applies
/// each event once, until `stop` turns true. Broker or database failures are retried
/// with exponential backoff ([`CONSUMER_BACKOFF_FIRST`] to [`CONSUMER_BACKOFF_MAX`]).
pub async fn run_consumer(
    bus: Arc<NatsBus>,
    consume: Arc<Consume>,
    mut stop: watch::Receiver<bool>,
) {
    info!(consumer = CONSUMER_NAME, stream = %bus.config.stream, "event consumer started");
    let mut backoff = CONSUMER_BACKOFF_FIRST;
    let mut consumer = None;
    let mut failing = false;
    'rounds: while !*stop.borrow() {
        let failure = 'round: {
            if let Err(e) = bus.ready() {
                break 'round Some(e.to_string());
            }
            let pull = match &consumer {
                Some(c) => c,
                None => match bus.ensure_consumer().await {
                    Ok(c) => consumer.insert(c),
                    Err(e) => break 'round Some(e.to_string()),
                },
            };
            let mut messages = match pull
                .batch()
                .max_messages(CONSUMER_BATCH)
                .expires(FETCH_WAIT)
                .messages()
                .await
            {
                Ok(messages) => messages,
                Err(e) => {
                    consumer = None;
                    break 'round Some(format!("fetch: {e}"));
                }
            };
            // Events are applied in chunks: the first message, and whatever else arrives
            // within CONSUMER_LINGER (up to CONSUMER_BATCH messages or CONSUMER_EVENTS_MAX
            // events), so that a steady stream is applied in a few large transactions
            // rather than many small ones.
            loop {
                let first = tokio::select! {
                    first = messages.next() => first,
                    _ = stop.changed() => break 'rounds,
                };
                let Some(first) = first else {
                    break 'round None;
                };
                let first = match first {
                    Ok(first) => first,
                    Err(e) => {
                        consumer = None;
                        break 'round Some(format!("fetch: {e}"));
                    }
                };
                let mut chunk = Chunk::default();
                chunk.take(first).await;
                let linger = tokio::time::Instant::now() + CONSUMER_LINGER;
                let mut ended = false;
                let mut broken = None;
                while !chunk.full() {
                    match tokio::time::timeout_at(linger, messages.next()).await {
                        Ok(Some(Ok(message))) => chunk.take(message).await,
                        Ok(Some(Err(e))) => {
                            broken = Some(e);
                            break;
                        }
                        Ok(None) => {
                            ended = true;
                            break;
                        }
                        Err(_) => break,
                    }
                }
                if let Handled::Retry = chunk.handle(&consume).await {
                    break 'round Some("the statistics store failed".to_owned());
                }
                if let Some(e) = broken {
                    consumer = None;
                    break 'round Some(format!("fetch: {e}"));
                }
                if ended {
                    break 'round None;
                }
            }
        };
        match failure {
            None => {
                if failing {
                    info!(consumer = CONSUMER_NAME, "event consumer working again");
                    failing = false;
                }
                backoff = CONSUMER_BACKOFF_FIRST;
            }
            Some(e) => {
                if !failing {
                    warn!(consumer = CONSUMER_NAME, error = %e, "event consumer can't proceed; retrying with backoff");
                    failing = true;
                } else {
                    debug!(consumer = CONSUMER_NAME, error = %e, "event consumer round failed");
                }
                if !pause_or_stop(backoff, &mut stop).await {
                    break;
                }
                backoff = (backoff * 2).min(CONSUMER_BACKOFF_MAX);
            }
        }
    }
    info!(consumer = CONSUMER_NAME, "event consumer stopped");
}

/// Waits until `bus` is connected, at most [`FIRST_CONNECT_GRACE`].
async fn first_connection(bus: &NatsBus) {
    let deadline = tokio::time::Instant::now() + FIRST_CONNECT_GRACE;
    while bus.ready().is_err() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(FIRST_CONNECT_POLL).await;
    }
}

/// The relay and consumer loops of one instance.
pub struct EventWorkers {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    bus: Arc<NatsBus>,
}

impl EventWorkers {
    /// Starts the relay (publishing `outbox` as `relay_id`) and the sales-statistics
    /// consumer (applying to `stats`). Returns at once: the broker is connected to in the
    /// background, and both loops wait for it with backoff.
    pub async fn start(
        config: NatsConfig,
        outbox: Arc<dyn Outbox>,
        stats: Arc<dyn StatsStore>,
        relay_id: String,
        metrics: Arc<Metrics>,
    ) -> Result<Self, BusError> {
        let bus = Arc::new(NatsBus::connect(config).await?);
        let (stop, stopped) = watch::channel(false);
        let relay = Relay::new(outbox, bus.clone(), relay_id).with_metrics(metrics.clone());
        let relay_stopped = stopped.clone();
        let relay_bus = bus.clone();
        let relay_task = tokio::spawn(async move {
            first_connection(&relay_bus).await;
            relay.run(relay_stopped).await
        });
        let consumer_bus = bus.clone();
        let consume = Arc::new(Consume::new(stats).with_metrics(metrics));
        let consumer_task = tokio::spawn(async move {
            first_connection(&consumer_bus).await;
            run_consumer(consumer_bus, consume, stopped).await
        });
        Ok(Self {
            stop,
            tasks: vec![relay_task, consumer_task],
            bus,
        })
    }

    pub fn bus(&self) -> &Arc<NatsBus> {
        &self.bus
    }

    /// Asks both loops to stop after their current round and waits for them (bounded by
    /// [`STOP_TIMEOUT`], after which they are aborted).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for mut task in self.tasks {
            if tokio::time::timeout(STOP_TIMEOUT, &mut task).await.is_err() {
                warn!("event worker did not stop in time; aborted");
                task.abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the documented JSON form (as MariaDB's JSON_OBJECT writes it) decodes into
    // the event, null order_id included, an escaped request_id too (the borrowed fields
    // fall back to a copy), and that a bad field is refused — an `occurred_at` that is not
    // RFC 3339 (no offset, or no timestamp at all) among them, and an `event_id` empty or
    // longer than the consumers' key column.
    #[test]
    fn decodes_the_documented_payload() {
        let body = r#"{"event_id": "5f0c6a4e-ebf5-11f1-b3b2-02fc00000001", "event_type": "reservation_released", "sequence": 1, "order_id": null, "request_id": "REQ_1", "product_id": 1001, "user_id": 42, "quantity": 2, "reason": "sold_out", "occurred_at": "2026-11-29T10:00:00.123456Z"}"#;
        let event = decode_event(body.as_bytes()).expect("valid");
        assert_eq!(event.event_type, EventType::ReservationReleased);
        assert_eq!(event.order_id, None);
        assert_eq!(event.quantity.get(), 2);
        assert_eq!(event.reason.as_deref(), Some("sold_out"));
        assert_eq!(
            event.occurred_at.to_rfc3339(),
            "2026-11-29T10:00:00.123456+00:00"
        );
        let escaped = body.replace("\"REQ_1\"", "\"REQ\\u005f1\"");
        assert_eq!(
            decode_event(escaped.as_bytes()).expect("valid").request_id,
            event.request_id
        );
        let bad = body.replace("\"quantity\": 2", "\"quantity\": 0");
        assert!(decode_event(bad.as_bytes()).is_err());
        for at in [
            "2026-11-29T10:00:00.123456",
            "2026-11-29 10:00:00.123456",
            "yesterday",
        ] {
            let bad = body.replace("2026-11-29T10:00:00.123456Z", at);
            assert!(decode_event(bad.as_bytes()).is_err(), "{at}");
        }
        assert!(decode_event(b"{}").is_err());
        // An event_id of 64 characters (multi-byte ones count as one each) is the longest.
        let id = "5f0c6a4e-ebf5-11f1-b3b2-02fc00000001";
        let longest = "é".repeat(EVENT_ID_CHARS_MAX);
        assert!(decode_event(body.replace(id, &longest).as_bytes()).is_ok());
        for bad in [String::new(), "x".repeat(EVENT_ID_CHARS_MAX + 1)] {
            assert!(
                decode_event(body.replace(id, &bad).as_bytes()).is_err(),
                "{bad}"
            );
        }
    }

    fn event(n: usize, event_type: EventType, payload_len: usize) -> OutboxMessage {
        let event_id = format!("00000000-0000-7000-8000-{n:012}");
        let pad = "x".repeat(payload_len.saturating_sub(30));
        OutboxMessage {
            id: n as i64,
            payload: format!(r#"{{"event_id": "{event_id}", "p": "{pad}"}}"#),
            event_id,
            event_type,
            request_id: format!("REQ_{n}"),
            sequence: 1,
            attempts: 0,
            blocked: false,
        }
    }

    /// `len` events of 100 bytes, every `paid_every`-th (from the first) an order_paid,
    /// the others order_created.
    fn mixed_wave(len: usize, paid_every: usize) -> Vec<OutboxMessage> {
        (0..len)
            .map(|n| {
                let t = if n % paid_every == 0 {
                    EventType::OrderPaid
                } else {
                    EventType::OrderCreated
                };
                event(n, t, 100)
            })
            .collect()
    }

    // Checks packing: events are grouped by type in the order given, a pack holds at most
    // EVENTS_PER_MESSAGE_MAX events and MESSAGE_BYTES_MAX bytes (an event larger than
    // that goes alone), every event lands in exactly one pack, a body is the JSON array of
    // its members' payloads, and its id is pack_id of its members' event ids.
    #[test]
    fn packs_group_by_type_within_bounds() {
        let mut wave = mixed_wave(300, 3);
        wave.push(event(
            300,
            EventType::OrderCancelled,
            MESSAGE_BYTES_MAX + 10,
        ));
        wave.push(event(301, EventType::OrderCancelled, 100));
        let packs = packs(&wave, &DEFAULT_LIMITS);
        let mut seen = vec![0; wave.len()];
        for p in &packs {
            assert!(!p.members.is_empty());
            assert!(p.members.len() <= EVENTS_PER_MESSAGE_MAX);
            assert!(p.body.len() <= MESSAGE_BYTES_MAX || p.members.len() == 1);
            assert!(p.members.windows(2).all(|w| w[0] < w[1]), "in order");
            let mut body = String::from("[");
            for (k, &m) in p.members.iter().enumerate() {
                seen[m] += 1;
                assert_eq!(wave[m].event_type, p.event_type);
                if k > 0 {
                    body.push(',');
                }
                body.push_str(&wave[m].payload);
            }
            body.push(']');
            assert_eq!(p.body, body);
            let ids: Vec<&str> = p
                .members
                .iter()
                .map(|&m| wave[m].event_id.as_str())
                .collect();
            assert_eq!(p.id, pack_id(ids));
            let items: Vec<serde_json::Value> = serde_json::from_str(&p.body).expect("json");
            assert_eq!(items.len(), p.members.len());
        }
        assert!(seen.iter().all(|&n| n == 1), "each event in one pack");
        let of = |t| packs.iter().filter(|p| p.event_type == t).count();
        // 100 paid: one pack; 200 created: 128 + 72; the oversized cancel alone, then 301.
        assert_eq!(of(EventType::OrderPaid), 1);
        assert_eq!(of(EventType::OrderCreated), 2);
        assert_eq!(of(EventType::OrderCancelled), 2);
        assert_eq!(packs.len(), 5);
        assert!(super::packs(&[], &DEFAULT_LIMITS).is_empty());
    }

    const DEFAULT_LIMITS: PackLimits = PackLimits {
        events: EVENTS_PER_MESSAGE_MAX,
        bytes: MESSAGE_BYTES_MAX,
    };

    // Checks the two other limits: a byte cap below the default (a broker with a smaller
    // max_payload) splits packs by size, and one event per message gives the format
    // before packing: each payload as it is (no array) under its own event id.
    #[test]
    fn packs_follow_the_byte_cap_and_the_single_event_format() {
        let wave: Vec<OutboxMessage> = (0..10)
            .map(|n| event(n, EventType::OrderCreated, 100))
            .collect();
        // Room for "[", four payloads, their three commas and "]", and one byte more.
        let cap = 4 * wave[0].payload.len() + 6;
        let capped = packs(
            &wave,
            &PackLimits {
                events: 128,
                bytes: cap,
            },
        );
        let sizes: Vec<usize> = capped.iter().map(|p| p.members.len()).collect();
        assert_eq!(sizes, [4, 4, 2]);
        assert!(capped.iter().all(|p| p.body.len() <= cap));
        let single = packs(
            &wave,
            &PackLimits {
                events: 1,
                bytes: MESSAGE_BYTES_MAX,
            },
        );
        assert_eq!(single.len(), wave.len());
        for (p, m) in single.iter().zip(&wave) {
            assert_eq!(p.body, m.payload);
            assert_eq!(p.id, m.event_id);
            assert_eq!(p.members.len(), 1);
        }
    }

    // Checks that each event gets its own pack's result: with one pack of a wave failed
    // and the others published, exactly the failed pack's events report the failure (the
    // relay then holds back only those orders' later events), and an event no pack held
    // is reported failed, never published.
    #[test]
    fn each_event_gets_its_packs_result() {
        let wave = mixed_wave(6, 2);
        let packs = packs(&wave, &DEFAULT_LIMITS);
        assert_eq!(packs.len(), 2);
        let failed = packs
            .iter()
            .position(|p| p.event_type == EventType::OrderPaid)
            .expect("a paid pack");
        let results: Vec<Result<(), BusError>> = (0..packs.len())
            .map(|i| {
                if i == failed {
                    Err(BusError::timed_out("timed out"))
                } else {
                    Ok(())
                }
            })
            .collect();
        let per = per_event(wave.len(), &packs, results);
        for (m, r) in wave.iter().zip(&per) {
            assert_eq!(r.is_err(), m.event_type == EventType::OrderPaid, "{}", m.id);
        }
        let short = per_event(wave.len() + 1, &packs, vec![Ok(()), Ok(())]);
        assert!(short[wave.len()].is_err());
    }

    // Checks pack ids: the same events in the same order give the same id (so the broker
    // drops a republished pack), and another set or order, or ids that only concatenate
    // alike, give another.
    #[test]
    fn pack_ids_name_their_events() {
        let a = pack_id(["e1", "e2"]);
        assert_eq!(a, pack_id(["e1", "e2"]));
        assert_ne!(a, pack_id(["e2", "e1"]));
        assert_ne!(a, pack_id(["e1"]));
        assert_ne!(a, pack_id(["e1e2"]));
        assert_ne!(pack_id(["e1", "e2", "e3"]), a);
        assert_eq!(a.len(), 36);
    }

    // Checks message bodies: an array of events decodes element by element (a bad one,
    // or one that is no event at all, is an error of its own, the rest still decode, and
    // each decodes as it would alone), a bare event object (the format before
    // packing) reads as one event, and a broken array is an error.
    #[test]
    fn decodes_packed_and_single_messages() {
        let one = r#"{"event_id": "5f0c6a4e-ebf5-11f1-b3b2-02fc00000001", "event_type": "order_created", "sequence": 1, "order_id": 7, "request_id": "REQ_1", "product_id": 1001, "user_id": 42, "quantity": 2, "reason": null, "occurred_at": "2026-11-29T10:00:00.123456Z"}"#;
        let two = one.replace("REQ_1", "REQ_2").replace("0001\"", "0002\"");
        let bad = one.replace("\"quantity\": 2", "\"quantity\": -1");
        let body = format!(" [{one},{bad}, {two}]");
        let events = decode_message(body.as_bytes()).expect("an array");
        assert_eq!(events.len(), 3);
        assert_eq!(
            events[0].as_ref().expect("first").request_id.as_str(),
            "REQ_1"
        );
        assert!(events[1].is_err());
        let second = events[2].as_ref().expect("third");
        assert_eq!(second.request_id.as_str(), "REQ_2");
        assert!(second.event_id.ends_with("0002"));
        let single = decode_message(one.as_bytes()).expect("an object");
        assert_eq!(single.len(), 1);
        assert_eq!(
            single[0].as_ref().expect("event").order_id.map(|o| o.get()),
            Some(7)
        );
        // An element that is no event at all (a field of the wrong type) costs only
        // itself too: the body is then read element by element.
        let broken = one.replace("\"quantity\": 2", "\"quantity\": \"two\"");
        let body = format!("[{one},{broken},{two}]");
        let events = decode_message(body.as_bytes()).expect("an array");
        assert_eq!(events.len(), 3);
        assert!(events[1].is_err());
        assert_eq!(
            events[2].as_ref().expect("third").request_id.as_str(),
            "REQ_2"
        );
        // Read in one pass, a pack gives what each of its events gives alone.
        let body = format!("[{one},{two}]");
        let packed = decode_message(body.as_bytes()).expect("an array");
        for (event, alone) in packed.iter().zip([one, two.as_str()]) {
            assert_eq!(
                format!("{:?}", event.as_ref().expect("packed")),
                format!("{:?}", decode_event(alone.as_bytes()).expect("alone"))
            );
        }
        assert!(decode_message(format!("[{one}").as_bytes()).is_err());
        assert!(decode_message(b"[]").expect("empty").is_empty());
        let garbage = decode_message(b"nonsense").expect("read as one event");
        assert!(garbage[0].is_err());
    }

    // Checks subjects are <prefix>.events.<type> and the stream captures all of them.
    #[test]
    fn subjects() {
        let c = NatsConfig {
            url: "nats://127.0.0.1:4222".into(),
            subject_prefix: "flashsale".into(),
            stream: "FLASHSALE_EVENTS".into(),
            events_per_message: EVENTS_PER_MESSAGE_MAX,
        };
        assert_eq!(
            c.subject(EventType::OrderPaid),
            "flashsale.events.order_paid"
        );
        assert_eq!(c.subjects(), "flashsale.events.>");
    }
}
