//! flashsale's events on NATS JetStream.
//!
//! - [`NatsBus`] implements the [`EventBus`] port: it makes sure the stream exists (file
//!   storage, subjects `<prefix>.events.>`, a duplicate window), publishes each event to
//!   `<prefix>.events.<event_type>` with `Nats-Msg-Id` = event id, and waits (bounded) for
//!   JetStream's acknowledgement. It connects lazily and reconnects by itself: nothing
//!   here ever waits for a broker that is down, it reports "not connected" instead.
//! - [`run_consumer`] drives one durable pull consumer: it fetches batches, hands each
//!   event to the [`Consume`] use case and acknowledges a message only after the event
//!   was applied (or found applied before).
//! - [`EventWorkers`] runs the relay loop and the consumer loop as tasks and stops them.
//!
//! The message body is the outbox payload, JSON; `docs/events.md` describes it and
//! [`decode_event`] reads it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::connection::State;
use async_nats::jetstream::{self, consumer, context, stream};
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use flashsale_app::ports::{BusError, EventBus, Outbox, StatsStore};
use flashsale_app::{Consume, Event, EventType, OutboxMessage, Relay};
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
/// plus its backoff, so the republication of a row whose "sent" mark was lost is dropped
/// by the broker; older copies are dropped by the consumers' own deduplication.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// How long the stream keeps events: consumers that were down this long still catch
/// up, and the stream's disk use stays bounded. (The outbox keeps every event anyway.)
pub const STREAM_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// The durable consumer that keeps `sales_stats`.
pub const CONSUMER_NAME: &str = "sales_stats";
/// How long JetStream waits for the consumer's ack before delivering a message again: a
/// message is applied in one short transaction, bounded by 5 s in the store.
const CONSUMER_ACK_WAIT: Duration = Duration::from_secs(30);
/// Messages the consumer fetches at once: bounds memory and the work redelivered after a
/// crash, while a backlog still drains in large steps.
pub const CONSUMER_BATCH: usize = 100;
/// How long one fetch waits for messages when there are none: the consumer's idle
/// latency, and one pull request per this period while idle.
const FETCH_WAIT: Duration = Duration::from_secs(1);
/// How long the consumer waits for more messages after the first of a chunk, so that a
/// steady stream is applied in chunks of up to [`CONSUMER_BATCH`] (one transaction each)
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

/// Where and how events are published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsConfig {
    /// `nats://host:port`.
    pub url: String,
    /// Events go to `<subject_prefix>.events.<event_type>`.
    pub subject_prefix: String,
    /// The JetStream stream that captures `<subject_prefix>.events.>`; created if missing.
    pub stream: String,
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

fn bus_error(what: &str, e: impl std::fmt::Display) -> BusError {
    BusError(format!("{what}: {e}"))
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
            .map_err(|e| bus_error(&format!("nats url {}", config.url), e))?;
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
        let stream = self
            .js
            .get_or_create_stream(config)
            .await
            .map_err(|e| bus_error(&format!("stream {}", self.config.stream), e))?;
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
            .map_err(|e| bus_error(&format!("consumer {CONSUMER_NAME}"), e))
    }

    /// Sends one message; the returned future waits for its acknowledgement.
    async fn send(&self, message: &OutboxMessage) -> Result<context::PublishAckFuture, BusError> {
        let publish = jetstream::message::PublishMessage::build()
            .payload(bytes::Bytes::from(message.payload.clone()))
            .message_id(message.event_id.as_str());
        self.js
            .send_publish(self.config.subject(message.event_type), publish)
            .await
            .map_err(|e| self.publish_error(e))
    }

    fn publish_error(&self, e: context::PublishError) -> BusError {
        if matches!(e.kind(), context::PublishErrorKind::StreamNotFound) {
            // Deleted behind our back, or never made on this server: make it again.
            self.stream_ready.store(false, Ordering::SeqCst);
        }
        bus_error("publish", e)
    }

    async fn acked(&self, event_id: &str, ack: context::PublishAckFuture) -> Result<(), BusError> {
        let ack = ack.await.map_err(|e| self.publish_error(e))?;
        if ack.duplicate {
            debug!(
                event_id,
                stream_seq = ack.sequence,
                "broker already had this event"
            );
        }
        Ok(())
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
            other => Err(BusError(format!(
                "not connected to {} ({other:?})",
                self.config.url
            ))),
        }
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<(), BusError> {
        self.prepared().await?;
        let ack = self.send(message).await?;
        self.acked(&message.event_id, ack).await
    }

    /// Sends every message first, then waits for all the acknowledgements together: one
    /// broker round trip for the whole wave.
    async fn publish_all(&self, messages: &[OutboxMessage]) -> Vec<Result<(), BusError>> {
        if let Err(e) = self.prepared().await {
            return messages.iter().map(|_| Err(e.clone())).collect();
        }
        let mut sent = Vec::with_capacity(messages.len());
        for message in messages {
            sent.push(self.send(message).await);
        }
        let acks = sent
            .into_iter()
            .zip(messages)
            .map(|(sent, message)| async move {
                match sent {
                    Ok(ack) => self.acked(&message.event_id, ack).await,
                    Err(e) => Err(e),
                }
            });
        futures::future::join_all(acks).await
    }
}

/// A message body that is not a valid event.
#[derive(Debug, thiserror::Error)]
#[error("invalid event: {0}")]
pub struct DecodeError(String);

/// The JSON body as it is on the wire (docs/events.md).
#[derive(Deserialize)]
struct WireEvent {
    event_id: String,
    event_type: String,
    sequence: u32,
    order_id: Option<i64>,
    request_id: String,
    product_id: i64,
    user_id: i64,
    quantity: i64,
    reason: Option<String>,
    occurred_at: DateTime<Utc>,
}

/// Reads a message body into an [`Event`], checking every field as the domain does.
pub fn decode_event(body: &[u8]) -> Result<Event, DecodeError> {
    let w: WireEvent = serde_json::from_slice(body).map_err(|e| DecodeError(e.to_string()))?;
    let bad = |e: &dyn std::fmt::Display| DecodeError(e.to_string());
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

/// What became of one delivered message.
enum Handled {
    Done,
    /// The store failed: the message will come again; back off.
    Retry,
}

/// Applies the messages delivered together (in one store transaction where it can),
/// then acknowledges them; on a store failure they are all NAKed to come again.
async fn handle(consume: &Consume, messages: &[jetstream::Message]) -> Handled {
    let mut events = Vec::with_capacity(messages.len());
    let mut decoded = Vec::with_capacity(messages.len());
    for message in messages {
        match decode_event(&message.payload) {
            Ok(event) => {
                events.push(event);
                decoded.push(message);
            }
            Err(e) => {
                // Not ours or corrupt: redelivering it would never help.
                error!(subject = %message.subject, error = %e, "undecodable event dropped");
                if let Err(e) = message.ack_with(jetstream::AckKind::Term).await {
                    warn!(error = %e, "could not terminate an undecodable message");
                }
            }
        }
    }
    if events.is_empty() {
        return Handled::Done;
    }
    match consume.apply_all(&events).await {
        Ok(_) => {
            for (message, event) in decoded.iter().zip(&events) {
                // A lost ack means one more delivery, which the store ignores.
                if let Err(e) = message.ack().await {
                    warn!(event_id = %event.event_id, error = %e, "ack failed; the event will be delivered again");
                }
            }
            Handled::Done
        }
        Err(e) => {
            warn!(events = events.len(), error = %e, "events not applied; they will be delivered again");
            for message in decoded {
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
            // within CONSUMER_LINGER (up to CONSUMER_BATCH), so that a steady stream is
            // applied in a few large transactions rather than many small ones.
            loop {
                let first = tokio::select! {
                    first = messages.next() => first,
                    _ = stop.changed() => break 'rounds,
                };
                let Some(first) = first else {
                    break 'round None;
                };
                let mut chunk = Vec::with_capacity(CONSUMER_BATCH);
                chunk.push(first);
                let linger = tokio::time::Instant::now() + CONSUMER_LINGER;
                let mut ended = false;
                while chunk.len() < CONSUMER_BATCH {
                    match tokio::time::timeout_at(linger, messages.next()).await {
                        Ok(Some(item)) => chunk.push(item),
                        Ok(None) => {
                            ended = true;
                            break;
                        }
                        Err(_) => break,
                    }
                }
                let mut delivered = Vec::with_capacity(chunk.len());
                let mut broken = None;
                for item in chunk {
                    match item {
                        Ok(message) => delivered.push(message),
                        Err(e) => broken = Some(e),
                    }
                }
                if let Handled::Retry = handle(&consume, &delivered).await {
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
    ) -> Result<Self, BusError> {
        let bus = Arc::new(NatsBus::connect(config).await?);
        let (stop, stopped) = watch::channel(false);
        let relay = Relay::new(outbox, bus.clone(), relay_id);
        let relay_stopped = stopped.clone();
        let relay_task = tokio::spawn(async move { relay.run(relay_stopped).await });
        let consumer_task = tokio::spawn(run_consumer(
            bus.clone(),
            Arc::new(Consume::new(stats)),
            stopped,
        ));
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
    // the event, null order_id included, and that a bad field is refused.
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
        let bad = body.replace("\"quantity\": 2", "\"quantity\": 0");
        assert!(decode_event(bad.as_bytes()).is_err());
        assert!(decode_event(b"{}").is_err());
    }

    // Checks subjects are <prefix>.events.<type> and the stream captures all of them.
    #[test]
    fn subjects() {
        let c = NatsConfig {
            url: "nats://127.0.0.1:4222".into(),
            subject_prefix: "flashsale".into(),
            stream: "FLASHSALE_EVENTS".into(),
        };
        assert_eq!(
            c.subject(EventType::OrderPaid),
            "flashsale.events.order_paid"
        );
        assert_eq!(c.subjects(), "flashsale.events.>");
    }
}
