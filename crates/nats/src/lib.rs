//! flashsale's events on NATS JetStream.
//!
//! - [`NatsBus`] implements the [`EventBus`] port: it connects to one server or to several
//!   of a cluster ([`server_urls`]), makes sure the stream exists (file storage, subjects
//!   `<prefix>.events.>`, a duplicate window, the configured replica count), packs the
//!   events the relay hands it together into messages ([`packs`]: one subject, up to
//!   [`EVENTS_PER_MESSAGE_MAX`] events each), publishes each to
//!   `<prefix>.events.<event_type>` with `Nats-Msg-Id` = [`pack_id`] of its events (with
//!   one event per message configured: the bare event under its event id), and
//!   waits (bounded) for JetStream's acknowledgement, sending the unacknowledged ones
//!   again alike while a replicated stream elects a leader ([`ELECTION_WAIT`]). It
//!   connects lazily and reconnects by itself: nothing here ever waits for a broker that
//!   is down, it reports "not connected" instead.
//! - [`run_consumer`] drives one durable pull consumer: it fetches batches, hands their
//!   events to the [`Consume`] use case and acknowledges a message only after all its
//!   events were applied (or found applied before), or after it moved the message to the
//!   dead-letter stream `<stream>_DEAD` (one the store refused at its last allowed
//!   delivery, or one that does not decode), whose letters a person lists, replays or
//!   drops ([`NatsBus::dead_letters`], [`NatsBus::replay`], [`NatsBus::drop_letter`]).
//! - [`EventWorkers`] runs the relay loop and the consumer loop as tasks and stops them.
//!
//! A message body is a JSON array of outbox payloads (or one bare payload);
//! `docs/events.md` describes it and [`decode_message`] reads it.

use std::sync::Arc;
use std::time::Duration;

use flashsale_app::ports::{BusError, EventBus, Outbox, StatsStore};
use flashsale_app::{Consume, Metrics, Relay};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::warn;

/// Longest wait for JetStream to acknowledge a publish or answer an API request (stream
/// and consumer creation). Locally an ack takes a millisecond; past this the broker is
/// stalled, the event stays in the outbox, and the relay retries. On a stream of one
/// replica it also bounds a wave of a relay round (a round has at most
/// [`WAVES_PER_ROUND_MAX`]), which `CLAIM_LEASE` (30 s) must exceed. A replicated
/// stream's leader election takes about as long or longer (below): a publish the dying
/// leader never answered times out before or about when the next leader takes over,
/// and is tried again ([`ELECTION_WAIT`]).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Most servers `FLASHSALE_NATS_URL` may name: seeds of one cluster, of which JetStream
/// keeps at most [`STREAM_REPLICAS_MAX`] copies of a stream. The client learns the
/// cluster's other servers from the one it reaches, and while reconnecting tries the
/// seeds in turn, each try a little later than the last, so a longer list only slows a
/// reconnection down.
pub const SERVERS_MAX: usize = 16;
/// Most replicas of the stream and of the durable consumer
/// (`FLASHSALE_NATS_STREAM_REPLICAS`): JetStream's own limit, which it refuses to exceed.
pub const STREAM_REPLICAS_MAX: usize = 5;
/// How long a wave keeps trying its messages while a replicated stream has no leader
/// (no answer, or "no responders"): a follower of a dead leader waits 4–9 s (nats-server's
/// election timeout) before it campaigns, and elections after a `kill -9` took 4.3–7.8 s
/// here. Every try sends the same message with the same `Nats-Msg-Id`, so one that the
/// old leader stored but never acknowledged is dropped as a duplicate. Past this the wave
/// fails, the relay tries the round again after its backoff (100 ms), and may pack the
/// events otherwise (the consumer drops a copy by event id). [`WAVES_PER_ROUND_MAX`]
/// waves of this fit in `CLAIM_LEASE` (30 s) with room for the round's statements.
pub const ELECTION_WAIT: Duration = Duration::from_secs(9);
/// Pause between two tries of a wave's unacknowledged messages during
/// [`ELECTION_WAIT`]: publishing resumes at most this late after the election, for a
/// few hundred small requests to the cluster during one.
const ELECTION_RETRY_PAUSE: Duration = Duration::from_millis(250);
/// Most waves of one relay round: an order has at most three events (created, then paid
/// or cancelled, then released), and a wave takes one event of each order.
const WAVES_PER_ROUND_MAX: u128 = 3;
// A relay round's publishing must end within its lease, even if every wave waits out an
// election.
const _: () = assert!(
    ELECTION_WAIT.as_millis() * WAVES_PER_ROUND_MAX < flashsale_app::relay::CLAIM_LEASE.as_millis()
);
const _: () = assert!(
    REQUEST_TIMEOUT.as_millis() * WAVES_PER_ROUND_MAX
        < flashsale_app::relay::CLAIM_LEASE.as_millis()
);
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
/// [`EVENTS_PER_MESSAGE_MAX`] in one transaction): its INSERT's one bound document stays
/// about 100 KB, and a chunk that must fall back to one transaction per event (a race
/// with another consumer) stays short.
pub const CONSUMER_EVENTS_MAX: usize = 1024;
/// Most events packed into one message (the default of `events_per_message`). One NATS
/// message costs the broker about as much as one event's (storing it, acknowledging the
/// publish, delivering it, taking the consumer's ack), so packing divides its work per
/// event by the pack's size (NATS's CPU per order 15–18 µs unpacked, 3–4 µs packed). A
/// relay round reads 256 rows; half of that keeps a busy round at two or three messages
/// while a consumer's chunk stays bounded.
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
/// After a failed apply (database down, or the store refused it), the message is
/// delivered again this much later: a refused message comes back
/// `FLASHSALE_EVENTS_MAX_DELIVER` − 1 times before it is given up on, these many seconds
/// apart, while the messages behind it go on.
const NAK_DELAY: Duration = Duration::from_secs(1);
/// Most bytes the dead-letter stream keeps: letters wait there for a person, so they have
/// no age limit, but a flood of them is a broken consumer rather than data to keep: past
/// this the stream refuses new letters (discard new), and their messages stay in the
/// event stream, delivered again, until a person makes room.
pub const DEAD_STREAM_BYTES_MAX: i64 = 1 << 30;
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

mod bus;
mod consumer;
mod dead;
mod pack;
mod wire;

pub use bus::{server_urls, NatsBus, NatsConfig};
pub use consumer::run_consumer;
pub use dead::{DeadLetter, LetterState, Settled};
pub use pack::{pack_id, packs, Pack, PackLimits};
pub use wire::{decode_event, decode_message, DecodeError, EVENT_ID_CHARS_MAX};

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
        let consume = Arc::new(
            Consume::new(stats)
                .with_metrics(metrics)
                .with_max_deliver(bus.config().max_deliver),
        );
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
