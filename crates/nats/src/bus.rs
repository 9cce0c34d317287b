//! The [`EventBus`] on NATS JetStream: the connection, the stream and the durable
//! consumer made sure of, and a wave of events published as packed messages, each
//! waited for (bounded) until JetStream acknowledged it.

use std::sync::atomic::{AtomicBool, Ordering};

use async_nats::connection::State;
use async_nats::jetstream::{self, consumer, context, stream};
use async_nats::ConnectErrorKind;
use async_trait::async_trait;
use flashsale_app::ports::{BusError, ErrorKind, EventBus};
use flashsale_app::{EventType, OutboxMessage};
use tokio::sync::Mutex;
use tracing::{debug, info};

use crate::pack::{packs, per_event, Pack, PackLimits};
use crate::{
    CONNECT_TIMEOUT, CONSUMER_ACK_WAIT, CONSUMER_NAME, DUPLICATE_WINDOW, EVENTS_PER_MESSAGE_MAX,
    MESSAGE_BYTES_MAX, MESSAGE_HEADROOM, RECONNECT_DELAY_FIRST, RECONNECT_DELAY_MAX,
    REQUEST_TIMEOUT, STREAM_MAX_AGE,
};

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

#[cfg(test)]
mod tests {
    use super::*;

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
