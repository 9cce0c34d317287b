//! The [`EventBus`] on NATS JetStream: the connection (to one server or several of a
//! cluster), the stream and the durable consumer made sure of (with their replica
//! count), and a wave of events published as packed messages, each waited for (bounded)
//! until JetStream acknowledged it, and tried again while a replicated stream elects a
//! leader.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use async_nats::connection::State;
use async_nats::jetstream::{self, consumer, context, stream};
use async_nats::{ConnectErrorKind, ServerAddr};
use async_trait::async_trait;
use flashsale_app::ports::{BusError, ErrorKind, EventBus};
use flashsale_app::{EventType, OutboxMessage};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::pack::{packs, per_event, Pack, PackLimits};
use crate::{
    CONNECT_TIMEOUT, CONSUMER_ACK_WAIT, CONSUMER_NAME, DUPLICATE_WINDOW, ELECTION_RETRY_PAUSE,
    ELECTION_WAIT, EVENTS_PER_MESSAGE_MAX, MESSAGE_BYTES_MAX, MESSAGE_HEADROOM,
    RECONNECT_DELAY_FIRST, RECONNECT_DELAY_MAX, REQUEST_TIMEOUT, SERVERS_MAX, STREAM_MAX_AGE,
    STREAM_REPLICAS_MAX,
};

/// The servers of a `FLASHSALE_NATS_URL` value: one `nats://host:port` URL, or several
/// of one cluster separated by commas, at most [`SERVERS_MAX`]. `Err` says which entry is
/// wrong and why, for the configuration's error message.
///
/// Why here: the client (async-nats) takes a list of servers, not a comma-separated
/// string, and its own parser decides what a server URL is.
pub fn server_urls(value: &str) -> Result<Vec<String>, String> {
    let urls: Vec<&str> = value.split(',').map(str::trim).collect();
    if urls.len() > SERVERS_MAX {
        return Err(format!(
            "names {} servers; at most {SERVERS_MAX}",
            urls.len()
        ));
    }
    urls.into_iter()
        .map(|url| {
            let bad = |why: &str| {
                format!(
                    "{url:?} is not a server URL like nats://127.0.0.1:4222 ({why}); \
                     several are separated by commas"
                )
            };
            if !url.starts_with("nats://") {
                return Err(bad("it must start with nats://"));
            }
            let addr: ServerAddr = url
                .parse()
                .map_err(|e: std::io::Error| bad(&e.to_string()))?;
            if addr.host().is_empty() {
                return Err(bad("no host"));
            }
            let inner = addr.into_inner();
            if !matches!(inner.path(), "" | "/") || inner.query().is_some() {
                return Err(bad("a server URL has no path or query"));
            }
            Ok(url.to_owned())
        })
        .collect()
}

/// Where and how events are published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsConfig {
    /// `nats://host:port` of one server, or of several of one cluster ([`server_urls`]):
    /// the client connects to any of them and learns the cluster's others from it.
    pub urls: Vec<String>,
    /// Events go to `<subject_prefix>.events.<event_type>`.
    pub subject_prefix: String,
    /// The JetStream stream that captures `<subject_prefix>.events.>`; created if missing.
    pub stream: String,
    /// Most events in one message, 1..=[`EVENTS_PER_MESSAGE_MAX`]. 1 publishes every event
    /// alone as a bare JSON object with `Nats-Msg-Id` = its event id: the format before
    /// packing, which consumers of earlier versions read (docs/events.md, upgrading).
    pub events_per_message: usize,
    /// Copies of the stream and of the durable consumer the cluster keeps,
    /// 1..=[`STREAM_REPLICAS_MAX`]: with 3, a server of the cluster may die and every
    /// acknowledged event is still on two. A stream or consumer found with another count
    /// is changed to this one, or, if the broker refuses, not used at all. The
    /// dead-letter stream keeps as many.
    pub replicas: usize,
    /// Deliveries of a message the statistics store refuses before the consumer moves it
    /// to the dead-letter stream (`FLASHSALE_EVENTS_MAX_DELIVER`, at least 1).
    pub max_deliver: u32,
}

impl NatsConfig {
    pub fn subject(&self, event_type: EventType) -> String {
        format!("{}.events.{}", self.subject_prefix, event_type.as_str())
    }

    pub fn subjects(&self) -> String {
        format!("{}.events.>", self.subject_prefix)
    }

    /// The dead-letter stream: `<stream>_DEAD`.
    pub fn dead_stream(&self) -> String {
        format!("{}_DEAD", self.stream)
    }

    /// The subject of the dead letter named `key`: `<prefix>.dead.<key>`.
    pub fn dead_subject(&self, key: &str) -> String {
        format!("{}.dead.{key}", self.subject_prefix)
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
    /// The dead-letter stream was found or created on this connection.
    pub(crate) dead_ready: AtomicBool,
    /// The stream's own largest message (headers and body), as last read; 0: no limit.
    stream_message_max: AtomicUsize,
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
            .connect(config.urls.clone())
            .await
            .map_err(|e| {
                let kind = match e.kind() {
                    ConnectErrorKind::ServerParse => ErrorKind::Config,
                    ConnectErrorKind::TimedOut => ErrorKind::TimedOut,
                    _ => ErrorKind::Unreachable,
                };
                bus_error(&format!("nats url {}", config.urls.join(",")), kind, e)
            })?;
        let js = jetstream::ContextBuilder::new()
            .timeout(REQUEST_TIMEOUT)
            .build(client.clone());
        Ok(Self {
            client,
            js,
            config,
            stream_ready: AtomicBool::new(false),
            dead_ready: AtomicBool::new(false),
            stream_message_max: AtomicUsize::new(0),
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

    /// The configured replica count, within JetStream's bounds.
    fn replicas(&self) -> usize {
        self.config.replicas.clamp(1, STREAM_REPLICAS_MAX)
    }

    /// Finds the stream, or creates it: file storage, `<prefix>.events.>`, the duplicate
    /// window, retention and replica count above. An existing stream is used as it is,
    /// but for its replica count: one with another count is updated to the configured
    /// one (JetStream moves the copies while the stream goes on), and if the broker
    /// refuses (a cluster too small for the count), or is a single server (which keeps
    /// one copy) while more are configured, the stream is not used: every publish fails
    /// with that reason, and the events wait in the outbox until the setting or the
    /// cluster is fixed. Quietly using fewer copies than configured would lose
    /// acknowledged events when a server dies.
    pub async fn ensure_stream(&self) -> Result<stream::Stream, BusError> {
        let config = stream::Config {
            name: self.config.stream.clone(),
            subjects: vec![self.config.subjects()],
            storage: stream::StorageType::File,
            retention: stream::RetentionPolicy::Limits,
            discard: stream::DiscardPolicy::Old,
            duplicate_window: DUPLICATE_WINDOW,
            max_age: STREAM_MAX_AGE,
            num_replicas: self.replicas(),
            ..Default::default()
        };
        let stream = self.ensure_replicated(config).await?;
        // What the stream itself takes (an operator may have capped it): packs stay
        // under it, so that only an event alone larger than that is refused for size.
        let largest = stream.cached_info().config.max_message_size;
        self.stream_message_max
            .store(usize::try_from(largest).unwrap_or(0), Ordering::SeqCst);
        if !self.stream_ready.swap(true, Ordering::SeqCst) {
            info!(stream = %self.config.stream, subjects = %self.config.subjects(), replicas = self.replicas(), "event stream ready");
        }
        Ok(stream)
    }

    /// Finds the stream of `config`, or creates it; one found with another replica count
    /// than configured is changed to it, or, refused, not used (see [`ensure_stream`]).
    ///
    /// [`ensure_stream`]: Self::ensure_stream
    pub(crate) async fn ensure_replicated(
        &self,
        config: stream::Config,
    ) -> Result<stream::Stream, BusError> {
        self.ready()?;
        let _one = self.ensuring.lock().await;
        let name = config.name.clone();
        let what = || format!("stream {name}");
        let stream_error = |e: context::CreateStreamError| {
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
            bus_error(&what(), kind, e)
        };
        let mut stream = self
            .js
            .get_or_create_stream(config.clone())
            .await
            .map_err(stream_error)?;
        if self.replicas() > 1 && stream.cached_info().cluster.is_none() {
            // A server outside any cluster keeps one copy, whatever the stream's
            // configuration says (NATS 2.9 takes an update to more without complaint).
            return Err(BusError::config(format!(
                "{} is on a single NATS server, which keeps one copy of it, and \
                 FLASHSALE_NATS_STREAM_REPLICAS asks for {}",
                what(),
                self.replicas()
            )));
        }
        // JetStream reports a single copy as 1 (0 only from servers that predate it).
        let found = stream.cached_info().config.num_replicas.max(1);
        if found != self.replicas() {
            let mut changed = stream.cached_info().config.clone();
            changed.num_replicas = self.replicas();
            self.js.update_stream(&changed).await.map_err(|e| {
                BusError::caused(
                    ErrorKind::Config,
                    format!(
                        "{} has {found} replicas and FLASHSALE_NATS_STREAM_REPLICAS asks for \
                         {}; the broker refused to change it",
                        what(),
                        self.replicas()
                    ),
                    e,
                )
            })?;
            warn!(stream = %name, from = found, to = self.replicas(), "event stream's replica count changed");
            // Read again, so that its consumer is made with the new count in view.
            stream = self
                .js
                .get_or_create_stream(config)
                .await
                .map_err(stream_error)?;
        }
        Ok(stream)
    }

    /// The durable pull consumer of [`CONSUMER_NAME`], created if missing, with the
    /// stream's replica count (one found with another count is updated, or, refused, not
    /// used: as for the stream). It starts at the stream's first message and
    /// acknowledges explicitly. JetStream's own `max_deliver` is left unlimited: the
    /// consumer counts a message's deliveries itself (each message's delivery count, the
    /// broker's, shared by every instance) and moves one it gives up on to the
    /// dead-letter stream with its last error in hand (`crate::dead`). With
    /// `max_deliver` the broker would only stop delivering it and announce that on a
    /// core NATS subject, which an instance not listening at that moment never hears,
    /// and the error would be lost.
    pub async fn ensure_consumer(&self) -> Result<consumer::PullConsumer, BusError> {
        let stream = self.ensure_stream().await?;
        let config = consumer::pull::Config {
            durable_name: Some(CONSUMER_NAME.to_owned()),
            deliver_policy: consumer::DeliverPolicy::All,
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: CONSUMER_ACK_WAIT,
            num_replicas: self.replicas(),
            ..Default::default()
        };
        let consumer_error = |e: stream::ConsumerError| {
            use stream::ConsumerErrorKind as K;
            let kind = match e.kind() {
                K::TimedOut => ErrorKind::TimedOut,
                K::InvalidName | K::InvalidConsumerType => ErrorKind::Config,
                _ => ErrorKind::Rejected,
            };
            bus_error(&format!("consumer {CONSUMER_NAME}"), kind, e)
        };
        let consumer = stream
            .get_or_create_consumer(CONSUMER_NAME, config.clone())
            .await
            .map_err(consumer_error)?;
        // 0: the consumer takes the stream's count (a consumer made before this setting).
        let found = match consumer.cached_info().config.num_replicas {
            0 => stream.cached_info().config.num_replicas.max(1),
            n => n,
        };
        if found == self.replicas() {
            return Ok(consumer);
        }
        // On NATS 2.9 creating a durable consumer that exists updates it.
        let consumer = stream.create_consumer(config).await.map_err(|e| {
            BusError::caused(
                ErrorKind::Config,
                format!(
                    "consumer {CONSUMER_NAME} has {found} replicas and \
                     FLASHSALE_NATS_STREAM_REPLICAS asks for {}; the broker refused to change it",
                    self.replicas()
                ),
                e,
            )
        })?;
        warn!(
            consumer = CONSUMER_NAME,
            from = found,
            to = self.replicas(),
            "event consumer's replica count changed"
        );
        Ok(consumer)
    }

    /// Sends one pack's `body` under its id; the returned future waits for its
    /// acknowledgement.
    async fn send(
        &self,
        pack: &Pack,
        body: bytes::Bytes,
    ) -> Result<context::PublishAckFuture, BusError> {
        let publish = jetstream::message::PublishMessage::build()
            .payload(body)
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
            _ if stream_refused_size(&e) => {
                // The stream's own limit, changed since it was read: read it again.
                self.stream_ready.store(false, Ordering::SeqCst);
                ErrorKind::TooLarge
            }
            _ => ErrorKind::Rejected,
        };
        bus_error("publish", kind, e)
    }

    /// Waits for a pack's acknowledgement, at most until `until` (and at most
    /// [`REQUEST_TIMEOUT`], the client's own bound).
    async fn acked(
        &self,
        pack: &Pack,
        ack: context::PublishAckFuture,
        until: Instant,
    ) -> Result<(), BusError> {
        let ack =
            match tokio::time::timeout_at(until, std::future::IntoFuture::into_future(ack)).await {
                Ok(ack) => ack.map_err(|e| self.publish_error(e))?,
                Err(_) => return Err(BusError::timed_out("publish: no acknowledgement in time")),
            };
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
        let stream = match self.stream_message_max.load(Ordering::SeqCst) {
            0 => MESSAGE_BYTES_MAX,
            n => n.saturating_sub(MESSAGE_HEADROOM),
        };
        PackLimits {
            events: self
                .config
                .events_per_message
                .clamp(1, EVENTS_PER_MESSAGE_MAX),
            bytes: MESSAGE_BYTES_MAX.min(broker).min(stream).max(1),
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
                self.config.urls.join(",")
            ))),
        }
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<(), BusError> {
        let mut results = self.publish_all(std::slice::from_ref(message)).await;
        // `publish_all` answers each event it was given: one here.
        debug_assert_eq!(results.len(), 1, "results of a one-event wave");
        results
            .pop()
            .unwrap_or_else(|| Err(BusError::stopped("no result for the event")))
    }

    /// Packs the events into messages ([`packs`]), sends every message first, then waits
    /// for all the acknowledgements together: one broker round trip for the whole wave.
    /// Each event gets its message's result: published only once JetStream acknowledged
    /// its message, which a replicated stream's leader does once a majority of the
    /// copies stored it.
    ///
    /// On a replicated stream, messages that got no answer, or "no responders" (the
    /// stream has no leader: an election), or that were cut off with the connection, are
    /// sent again, alike and under the same `Nats-Msg-Id`, every [`ELECTION_RETRY_PAUSE`]
    /// while connected, until [`ELECTION_WAIT`] after the first try: the wave outlasts a
    /// leader election instead of failing the round, and a message the old leader stored
    /// without acknowledging it is dropped by the new one as a duplicate. A stream of
    /// one copy has no election to wait for: its wave fails at once, as the broker
    /// answers.
    async fn publish_all(&self, messages: &[OutboxMessage]) -> Vec<Result<(), BusError>> {
        if let Err(e) = self.prepared().await {
            return messages.iter().map(|_| Err(e.clone())).collect();
        }
        let mut packs = packs(messages, &self.pack_limits());
        // Each body moved out of its pack once; a try sends a reference to it.
        let bodies: Vec<bytes::Bytes> = packs
            .iter_mut()
            .map(|p| bytes::Bytes::from(std::mem::take(&mut p.body)))
            .collect();
        let started = Instant::now();
        let until = started
            + if self.replicas() > 1 {
                ELECTION_WAIT
            } else {
                REQUEST_TIMEOUT
            };
        let mut results: Vec<Result<(), BusError>> = packs
            .iter()
            .map(|_| Err(BusError::stopped("not sent")))
            .collect();
        let mut pending: Vec<usize> = (0..packs.len()).collect();
        let mut tries = 0u32;
        loop {
            tries += 1;
            if let Err(e) = self.ready() {
                for &i in &pending {
                    results[i] = Err(e.clone());
                }
            } else {
                let mut sent = Vec::with_capacity(pending.len());
                for &i in &pending {
                    sent.push(self.send(&packs[i], bodies[i].clone()).await);
                }
                let acks = sent.into_iter().zip(&pending).map(|(sent, &i)| {
                    let pack = &packs[i];
                    async move {
                        match sent {
                            Ok(ack) => self.acked(pack, ack, until).await,
                            Err(e) => Err(e),
                        }
                    }
                });
                for (result, &i) in futures::future::join_all(acks)
                    .await
                    .into_iter()
                    .zip(&pending)
                {
                    results[i] = result;
                }
            }
            pending.retain(|&i| results[i].as_ref().is_err_and(leaderless));
            if pending.is_empty()
                || self.replicas() == 1
                || Instant::now() + ELECTION_RETRY_PAUSE >= until
            {
                break;
            }
            tokio::time::sleep(ELECTION_RETRY_PAUSE).await;
        }
        if tries > 1 {
            info!(
                tries,
                waited_ms = started.elapsed().as_millis() as u64,
                unpublished = pending.len(),
                "a wave was published again while the stream had no leader"
            );
        }
        // `packs` put every event of the wave in exactly one pack.
        debug_assert_eq!(
            packs.iter().map(|p| p.members.len()).sum::<usize>(),
            messages.len(),
            "events of the wave's packs"
        );
        per_event(messages.len(), &packs, results)
    }
}

/// Whether JetStream refused a publish for its size: the stream's largest message
/// (`max_msg_size`) is smaller (error 10054).
fn stream_refused_size(e: &context::PublishError) -> bool {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<jetstream::Error>())
        .is_some_and(|e| e.error_code() == jetstream::ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM)
}

/// Whether a message's failure may be the stream's leader election, which another try
/// of the same message outlasts: no acknowledgement in time, "no responders" (no
/// leader answers the stream's subjects), or the connection lost under it.
fn leaderless(e: &BusError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::TimedOut | ErrorKind::NotReady | ErrorKind::Unreachable
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks subjects are <prefix>.events.<type> and the stream captures all of them.
    #[test]
    fn subjects() {
        let c = NatsConfig {
            urls: vec!["nats://127.0.0.1:4222".into()],
            subject_prefix: "flashsale".into(),
            stream: "FLASHSALE_EVENTS".into(),
            events_per_message: EVENTS_PER_MESSAGE_MAX,
            replicas: 1,
            max_deliver: 5,
        };
        assert_eq!(
            c.subject(EventType::OrderPaid),
            "flashsale.events.order_paid"
        );
        assert_eq!(c.subjects(), "flashsale.events.>");
    }

    // Checks the servers of FLASHSALE_NATS_URL: one URL or several separated by commas
    // (spaces around them trimmed, the port optional as in the client), and that an entry
    // that is empty, of another scheme, without a host, with a path or query, or with a
    // port out of range is refused naming that entry, as is a list longer than
    // SERVERS_MAX.
    #[test]
    fn server_urls_take_one_or_several_servers() {
        assert_eq!(
            server_urls("nats://127.0.0.1:4222").unwrap(),
            ["nats://127.0.0.1:4222"]
        );
        assert_eq!(
            server_urls("nats://a:1, nats://b:2,nats://c").unwrap(),
            ["nats://a:1", "nats://b:2", "nats://c"]
        );
        for bad in [
            "",
            "nats://a:1,,nats://b:2",
            "http://a:1",
            "a:4222",
            "nats://",
            "nats://a:1/x",
            "nats://a:1?x=1",
            "nats://a:70000",
            "nats://a:1,tls://b:2",
        ] {
            let err = server_urls(bad).unwrap_err();
            assert!(err.contains("is not a server URL"), "{bad}: {err}");
        }
        let err = server_urls("nats://a:1/x").unwrap_err();
        assert!(err.starts_with("\"nats://a:1/x\""), "{err}");
        let many = vec!["nats://a:1"; SERVERS_MAX];
        assert_eq!(server_urls(&many.join(",")).unwrap().len(), SERVERS_MAX);
        let too_many = vec!["nats://a:1"; SERVERS_MAX + 1];
        let err = server_urls(&too_many.join(",")).unwrap_err();
        assert!(err.contains(&format!("at most {SERVERS_MAX}")), "{err}");
    }
}
