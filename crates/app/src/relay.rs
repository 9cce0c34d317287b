//! The relay: publishes the outbox to the broker.
//!
//! A round leases a bounded batch of unsent rows ([`Outbox::claim`]), publishes them,
//! marks the published ones sent and gives the rest back. Order per purchase (per order)
//! is kept: a request_id's events go out strictly one after the other, in `sequence`
//! order, each only after the broker confirmed the previous one; at the first failure the
//! rest of that request_id's events wait for a later round. Events of different orders
//! are independent and are published together, a "wave" at a time (the first unsent event
//! of every order in the batch, then the second, …).
//!
//! The purchase path never waits for any of this: it only inserts the outbox row in its
//! own transaction. When the broker is down the relay backs off (bounded) and the outbox
//! grows; when it returns, the backlog drains in batches. A crash between publishing and
//! marking sent publishes the row again after its lease ends; the broker drops the copy
//! when it goes out in a message like the first (by its `Nats-Msg-Id`), and consumers
//! deduplicate by event id anyway.
//!
//! A row the broker refuses for good (a message larger than it takes: the error's kind,
//! `too_large`, tells it from the broker being out of reach or electing a leader) is
//! offered again at the next rounds, and after [`PARK_AFTER_REFUSALS`] refusals in a row
//! parked: it leaves the unsent rows, kept with its reason for an operator
//! ([`Outbox::park`]), instead of being retried forever. Its order's later events then
//! go out without it (the consumers count each event on its own), and the audit reports
//! the parked events under I7.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::events::OutboxMessage;
use crate::metrics::Metrics;
use crate::ports::{BusError, ErrorKind, EventBus, LedgerError, Outbox, PortError, PublishFailure};

/// Rows one round leases and publishes: large enough that a backlog of a big sale drains
/// at thousands of events a second (a round costs three statements plus one broker
/// round trip per wave), small enough that a round's memory and its lease stay small.
pub const RELAY_BATCH: usize = 256;

/// How long a relay's lease on claimed rows lasts. It must cover a whole round: at most
/// one wave per event of an order (3) times the adapter's bounded publish wait (seconds),
/// with room to spare; after it, another relay (or this one restarted) may publish the
/// rows again, which the broker and consumers deduplicate.
pub const CLAIM_LEASE: Duration = Duration::from_secs(30);

/// Pause between rounds when the outbox had nothing more: bounds how long a fresh event
/// waits before it is published, at the cost of one indexed query per pause per instance.
pub const RELAY_POLL_INTERVAL: Duration = Duration::from_millis(200);

/// First pause after a failed round (broker or database unreachable): a blip is retried
/// almost at once.
pub const RELAY_BACKOFF_FIRST: Duration = Duration::from_millis(100);

/// Longest pause between failed rounds: a down broker costs a cheap check every few
/// seconds, and a returning one starts draining the outbox at most this late.
pub const RELAY_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// While failing, a warning (with the outbox size) every this many failed rounds — about
/// once a minute at the longest backoff — instead of one per round.
const WARN_EVERY_FAILURES: u32 = 12;

/// Refusals in a row after which the relay parks an outbox row instead of offering it
/// again: the broker refusing the message itself (too large for it) the same way five
/// rounds running is its verdict on that message, not a passing state; a refusal after a
/// limit changed under a publish (the adapter reads the limits again) passes at the next
/// round and sets the count back.
pub const PARK_AFTER_REFUSALS: u32 = 5;

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Outbox(#[from] LedgerError),
    #[error(transparent)]
    Bus(#[from] BusError),
}

/// Whether the broker refused the message itself, so that offering it again alike is
/// refused again: a message larger than it takes. Its other answers (out of reach, no
/// acknowledgement in time, no leader, a stream missing or misconfigured, its own limits
/// on resources) concern the broker, not the message, and a later try may pass.
fn refused(e: &BusError) -> bool {
    e.kind() == ErrorKind::TooLarge
}

/// One round's claimed events, ordered per request_id, and what became of them.
struct Round {
    /// One queue per request_id, in sequence order, cut at the first event whose
    /// predecessor another relay holds.
    queues: Vec<VecDeque<OutboxMessage>>,
    /// A row may carry several events (the MySQL adapter's packs, one per product of a
    /// group commit): it is sent once every one of its events claimed here went out.
    unpublished: HashMap<i64, usize>,
    /// Each row's refusals in a row before this round.
    refusals: HashMap<i64, u32>,
    sent: Vec<i64>,
    failed: Vec<PublishFailure>,
    published: usize,
}

impl Round {
    fn new(claimed: Vec<OutboxMessage>) -> Self {
        let mut unpublished: HashMap<i64, usize> = HashMap::new();
        let mut refusals = HashMap::new();
        for message in &claimed {
            *unpublished.entry(message.id).or_default() += 1;
            refusals.insert(message.id, message.refusals);
        }
        // Rows come ordered by (request_id, sequence).
        let mut queues: Vec<VecDeque<OutboxMessage>> = Vec::new();
        for message in claimed {
            match queues.last_mut() {
                Some(q) if q.back().is_some_and(|m| m.request_id == message.request_id) => {
                    q.push_back(message)
                }
                _ => queues.push(VecDeque::from([message])),
            }
        }
        for q in &mut queues {
            if let Some(at) = q.iter().position(|m| m.blocked) {
                q.truncate(at);
            }
        }
        Self {
            queues,
            unpublished,
            refusals,
            sent: Vec::new(),
            failed: Vec::new(),
            published: 0,
        }
    }

    /// The next wave: the first unpublished event of every order, with its queue.
    fn wave(&mut self) -> (Vec<usize>, Vec<OutboxMessage>) {
        self.queues
            .iter_mut()
            .enumerate()
            .filter_map(|(i, q)| q.pop_front().map(|m| (i, m)))
            .unzip()
    }

    fn published(&mut self, message: &OutboxMessage) {
        self.published += 1;
        let left = self.unpublished.get_mut(&message.id);
        // A wave's messages are this round's claimed ones, each popped from its queue once.
        debug_assert!(
            left.as_deref().is_some_and(|n| *n > 0),
            "row {} published more often than it was claimed this round",
            message.id
        );
        if let Some(left) = left {
            *left -= 1;
            if *left == 0 {
                self.sent.push(message.id);
            }
        }
    }

    fn failed(&mut self, owner: usize, message: &OutboxMessage, e: &BusError) {
        // The rest of this order's events wait: publishing them now would put them ahead
        // of this one.
        self.queues[owner].clear();
        let refused = refused(e);
        match self.failed.iter_mut().find(|f| f.id == message.id) {
            // A pack's events fail together or not; one refused marks the row refused.
            Some(f) => f.refused |= refused,
            None => self.failed.push(PublishFailure {
                id: message.id,
                error: e.to_string(),
                refused,
            }),
        }
    }

    /// The failed rows to park (refused for the [`PARK_AFTER_REFUSALS`]th time in a
    /// row), taken out of those to give back.
    fn take_parked(&mut self) -> Vec<(i64, String)> {
        let (park, keep): (Vec<PublishFailure>, Vec<PublishFailure>) =
            std::mem::take(&mut self.failed).into_iter().partition(|f| {
                f.refused
                    && self.refusals.get(&f.id).copied().unwrap_or(0) + 1 >= PARK_AFTER_REFUSALS
            });
        self.failed = keep;
        park.into_iter().map(|f| (f.id, f.error)).collect()
    }
}

/// The relay use case.
pub struct Relay {
    outbox: Arc<dyn Outbox>,
    bus: Arc<dyn EventBus>,
    /// Names this relay's leases; unique per running instance.
    relay_id: String,
    /// Where `run` counts the events published and the rounds that failed.
    metrics: Option<Arc<Metrics>>,
}

impl Relay {
    pub fn new(outbox: Arc<dyn Outbox>, bus: Arc<dyn EventBus>, relay_id: String) -> Self {
        Self {
            outbox,
            bus,
            relay_id,
            metrics: None,
        }
    }

    /// Counts the events published, the rows parked and the failed rounds of `run` in
    /// `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// One round: leases up to `limit` unsent rows and publishes them, keeping order per
    /// request_id; parks the rows the broker refused for good [`PARK_AFTER_REFUSALS`]
    /// times in a row. Returns how many events were published (and marked sent). Fails
    /// when the broker is unreachable (nothing leased) or failed every message it was
    /// offered for a reason of its own, or when the outbox can't be read or updated.
    pub async fn relay_once(&self, limit: usize) -> Result<usize, RelayError> {
        self.bus.ready()?;
        let claimed = self
            .outbox
            .claim(&self.relay_id, limit, CLAIM_LEASE)
            .await?;
        if claimed.is_empty() {
            return Ok(0);
        }
        let mut round = Round::new(claimed);
        let bus_down = self.publish(&mut round).await;
        let published = round.published;
        self.settle(round).await?;
        match bus_down {
            Some(e) if published == 0 => Err(e.into()),
            _ => Ok(published),
        }
    }

    /// Publishes the round's events a wave at a time; the error that failed a whole wave
    /// for a reason of the broker's (not a refusal of the messages), which ends it.
    async fn publish(&self, round: &mut Round) -> Option<BusError> {
        loop {
            let (owners, wave) = round.wave();
            if wave.is_empty() {
                return None;
            }
            let mut results = self.bus.publish_all(&wave).await.into_iter();
            let mut broker_failures = 0;
            let mut first_error = None;
            for (owner, message) in owners.into_iter().zip(&wave) {
                let result = results.next().unwrap_or_else(|| {
                    debug_assert!(
                        false,
                        "publish_all answers each message of the wave, in order"
                    );
                    Err(BusError::stopped("the bus gave no result"))
                });
                match result {
                    Ok(()) => round.published(message),
                    Err(e) => {
                        round.failed(owner, message, &e);
                        if !refused(&e) {
                            broker_failures += 1;
                            first_error.get_or_insert(e);
                        }
                    }
                }
            }
            if broker_failures == wave.len() {
                // Nothing got through: the broker is down or failing; don't offer it the
                // rest of the batch.
                return first_error;
            }
        }
    }

    /// Parks the rows refused for good, marks the published ones sent and gives the rest
    /// back, ending the round's lease.
    async fn settle(&self, mut round: Round) -> Result<(), RelayError> {
        // A row is sent once every message of it was published, and a failed message
        // stops the rest of its queue: no row is both.
        debug_assert!(
            round.failed.iter().all(|f| !round.sent.contains(&f.id)),
            "a row both sent and failed in one round"
        );
        let park = round.take_parked();
        let parked = match park.is_empty() {
            true => Ok(()),
            false => self.outbox.park(&park).await,
        };
        let marked = match round.sent.is_empty() {
            true => Ok(()),
            false => self.outbox.mark_sent(&round.sent).await,
        };
        // Always, so that leases end with the round: what failed is claimed again at
        // once, and an outbox-wide lease (the MySQL adapter's) passes to another
        // instance's relay if this one stops.
        let given_back = self.outbox.give_back(&self.relay_id, &round.failed).await;
        // A mark that failed leaves published rows unsent: the lease ends (an adapter
        // that kept it for a backlog lets go too) and they are published again, and
        // dropped as duplicates.
        if marked.is_err() {
            // If this fails as well, the lease runs out by itself (CLAIM_LEASE).
            let _ = self.outbox.let_go(&self.relay_id).await;
        }
        marked?;
        given_back?;
        parked?;
        for (id, reason) in &park {
            warn!(
                row = id,
                refusals = PARK_AFTER_REFUSALS,
                reason = %reason,
                "an outbox row the broker refuses for good is parked for an operator (flashsale events parked)"
            );
        }
        if let (Some(m), false) = (&self.metrics, park.is_empty()) {
            m.outbox_parked(park.len());
        }
        if let Some(first) = round.failed.first() {
            warn!(
                published = round.published,
                failed = round.failed.len(),
                first_error = %first.error,
                "some events could not be published; they wait in the outbox"
            );
        }
        Ok(())
    }

    /// Runs rounds until `stop` turns true (or its sender is gone): at once after a full
    /// batch, every [`RELAY_POLL_INTERVAL`] when idle, and with exponential backoff from
    /// [`RELAY_BACKOFF_FIRST`] to [`RELAY_BACKOFF_MAX`] while rounds fail. A round in
    /// progress finishes first (it is bounded by the adapters' timeouts).
    pub async fn run(&self, mut stop: watch::Receiver<bool>) {
        info!(relay = %self.relay_id, "event relay started");
        let mut backoff = RELAY_BACKOFF_FIRST;
        let mut failures: u32 = 0;
        loop {
            if *stop.borrow() {
                break;
            }
            let pause = match self.relay_once(RELAY_BATCH).await {
                Ok(published) => {
                    if let Some(m) = &self.metrics {
                        m.events_published(published);
                    }
                    if failures > 0 {
                        info!(failed_rounds = failures, "event relay publishing again");
                        failures = 0;
                        backoff = RELAY_BACKOFF_FIRST;
                    }
                    if published > 0 {
                        debug!(published, "events published");
                    }
                    if published >= RELAY_BATCH {
                        Duration::ZERO
                    } else {
                        RELAY_POLL_INTERVAL
                    }
                }
                Err(e) => {
                    if let Some(m) = &self.metrics {
                        m.relay_failed();
                        match &e {
                            RelayError::Outbox(e) => m.store_failed(LedgerError::STORE, e.kind()),
                            RelayError::Bus(e) => m.store_failed(BusError::STORE, e.kind()),
                        }
                    }
                    failures += 1;
                    if failures % WARN_EVERY_FAILURES == 1 {
                        let unsent = self.outbox.unsent().await.ok();
                        warn!(
                            error = %e,
                            failed_rounds = failures,
                            unsent,
                            next_try_in = ?backoff,
                            "event relay can't publish; events wait in the outbox"
                        );
                    } else {
                        debug!(error = %e, failed_rounds = failures, "event relay round failed");
                    }
                    let pause = backoff;
                    backoff = (backoff * 2).min(RELAY_BACKOFF_MAX);
                    pause
                }
            };
            if pause.is_zero() {
                // A backlog: go on, but let other tasks run between batches.
                tokio::task::yield_now().await;
                continue;
            }
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                _ = stop.changed() => {}
            }
        }
        if let Err(e) = self.outbox.let_go(&self.relay_id).await {
            // Its lease then runs out by itself (CLAIM_LEASE).
            warn!(error = %e, "event relay could not end its outbox lease");
        }
        info!(relay = %self.relay_id, "event relay stopped");
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Mutex;

    use async_trait::async_trait;

    use super::*;
    use crate::events::EventType;

    /// An outbox in memory: rows (id, request_id, sequence), the sent ones, and rows that
    /// "another relay" holds.
    #[derive(Default)]
    struct MemOutbox {
        rows: Vec<OutboxMessage>,
        sent: Mutex<BTreeSet<i64>>,
        held_elsewhere: BTreeSet<i64>,
        given_back: Mutex<Vec<(i64, String)>>,
        /// Each row's refusals in a row, as give_back counts them.
        refusals: Mutex<BTreeMap<i64, u32>>,
        /// Parked rows and their reasons.
        parked: Mutex<BTreeMap<i64, String>>,
        /// mark_sent fails (the database is unreachable).
        mark_fails: bool,
        /// Relays that called let_go.
        let_go: Mutex<Vec<String>>,
    }

    fn row(id: i64, request_id: &str, sequence: u32) -> OutboxMessage {
        OutboxMessage {
            id,
            event_id: format!("e{id}"),
            event_type: EventType::OrderCreated,
            request_id: request_id.to_owned(),
            sequence,
            payload: "{}".into(),
            attempts: 0,
            refusals: 0,
            blocked: false,
        }
    }

    #[async_trait]
    impl Outbox for MemOutbox {
        async fn claim(
            &self,
            _relay: &str,
            limit: usize,
            _lease: Duration,
        ) -> Result<Vec<OutboxMessage>, LedgerError> {
            let sent = self.sent.lock().unwrap();
            let parked = self.parked.lock().unwrap();
            let refusals = self.refusals.lock().unwrap();
            let unsent = |m: &&OutboxMessage| !sent.contains(&m.id) && !parked.contains_key(&m.id);
            let mut mine: Vec<OutboxMessage> = self
                .rows
                .iter()
                .filter(unsent)
                .filter(|m| !self.held_elsewhere.contains(&m.id))
                .take(limit)
                .cloned()
                .collect();
            for m in &mut mine {
                m.refusals = refusals.get(&m.id).copied().unwrap_or(0);
                m.blocked = self.rows.iter().filter(unsent).any(|e| {
                    e.request_id == m.request_id
                        && e.sequence < m.sequence
                        && self.held_elsewhere.contains(&e.id)
                });
            }
            mine.sort_by(|a, b| (&a.request_id, a.sequence).cmp(&(&b.request_id, b.sequence)));
            Ok(mine)
        }

        async fn mark_sent(&self, ids: &[i64]) -> Result<(), LedgerError> {
            if self.mark_fails {
                return Err(LedgerError::unreachable("database unreachable"));
            }
            self.sent.lock().unwrap().extend(ids);
            Ok(())
        }

        async fn give_back(
            &self,
            _relay: &str,
            failed: &[PublishFailure],
        ) -> Result<(), LedgerError> {
            let mut refusals = self.refusals.lock().unwrap();
            for f in failed {
                let n = refusals.entry(f.id).or_default();
                *n = if f.refused { *n + 1 } else { 0 };
                self.given_back
                    .lock()
                    .unwrap()
                    .push((f.id, f.error.clone()));
            }
            Ok(())
        }

        async fn park(&self, rows: &[(i64, String)]) -> Result<(), LedgerError> {
            self.parked.lock().unwrap().extend(rows.iter().cloned());
            Ok(())
        }

        async fn parked(&self, _limit: usize) -> Result<Vec<crate::ParkedRow>, LedgerError> {
            Ok(Vec::new())
        }

        async fn parked_events(&self) -> Result<u64, LedgerError> {
            Ok(self.parked.lock().unwrap().len() as u64)
        }

        async fn unpark(&self, ids: &[i64]) -> Result<usize, LedgerError> {
            let mut parked = self.parked.lock().unwrap();
            Ok(ids.iter().filter(|id| parked.remove(id).is_some()).count())
        }

        async fn let_go(&self, relay: &str) -> Result<(), LedgerError> {
            self.let_go.lock().unwrap().push(relay.to_owned());
            Ok(())
        }

        async fn unsent(&self) -> Result<u64, LedgerError> {
            Ok((self.rows.len() - self.sent.lock().unwrap().len()) as u64)
        }
    }

    /// A bus that records what it published, in order, and refuses some row ids.
    #[derive(Default)]
    struct MemBus {
        down: bool,
        refuse: BTreeSet<i64>,
        /// Events refused by event id (one event of a pack).
        refuse_events: BTreeSet<String>,
        /// Rows refused for good: larger than the broker takes.
        too_large: BTreeSet<i64>,
        published: Mutex<Vec<i64>>,
    }

    #[async_trait]
    impl EventBus for MemBus {
        fn ready(&self) -> Result<(), BusError> {
            if self.down {
                Err(BusError::unreachable("not connected"))
            } else {
                Ok(())
            }
        }

        async fn publish(&self, message: &OutboxMessage) -> Result<(), BusError> {
            if self.refuse.contains(&message.id) || self.refuse_events.contains(&message.event_id) {
                return Err(BusError::rejected(format!("refused {}", message.id)));
            }
            if self.too_large.contains(&message.id) {
                return Err(BusError::too_large(format!("{} is too large", message.id)));
            }
            self.published.lock().unwrap().push(message.id);
            Ok(())
        }
    }

    fn relay(outbox: &Arc<MemOutbox>, bus: &Arc<MemBus>) -> Relay {
        Relay::new(outbox.clone(), bus.clone(), "test".into())
    }

    // Checks a round publishes each order's events in sequence order (whatever the row
    // ids), and that a failure stops only that order: its later events are not published,
    // the other orders' are, and the failure is recorded.
    #[tokio::test]
    async fn keeps_order_per_request_and_stops_an_order_at_its_first_failure() {
        let outbox = Arc::new(MemOutbox {
            rows: vec![
                row(1, "A", 1),
                row(2, "B", 1),
                row(3, "A", 2),
                row(4, "B", 2),
                row(5, "A", 3),
            ],
            ..MemOutbox::default()
        });
        let bus = Arc::new(MemBus {
            refuse: BTreeSet::from([4]),
            ..MemBus::default()
        });
        let published = relay(&outbox, &bus).relay_once(100).await.unwrap();
        assert_eq!(published, 4);
        let order = bus.published.lock().unwrap().clone();
        let pos = |id| order.iter().position(|&x| x == id).unwrap();
        assert!(pos(1) < pos(3) && pos(3) < pos(5), "{order:?}");
        assert!(order.contains(&2) && !order.contains(&4), "{order:?}");
        assert_eq!(outbox.given_back.lock().unwrap()[0].0, 4);
    }

    // Checks a row that packs several events (the MySQL adapter's group commit packs):
    // with one of its events refused it is given back once and not marked sent, while
    // its other events and a single-event row go out; a later round publishes the pack
    // again, whole, and marks the row sent once.
    #[tokio::test]
    async fn a_pack_is_sent_once_every_event_of_it_went_out() {
        let pack = |request_id: &str| OutboxMessage {
            event_id: format!("e-{request_id}"),
            ..row(1, request_id, 1)
        };
        let outbox = Arc::new(MemOutbox {
            rows: vec![pack("P1"), pack("P2"), pack("P3"), row(2, "S", 1)],
            ..MemOutbox::default()
        });
        let refusing = Arc::new(MemBus {
            refuse_events: BTreeSet::from(["e-P2".to_owned()]),
            ..MemBus::default()
        });
        assert_eq!(relay(&outbox, &refusing).relay_once(100).await.unwrap(), 3);
        assert_eq!(*outbox.sent.lock().unwrap(), BTreeSet::from([2]));
        let given_back = outbox.given_back.lock().unwrap().clone();
        assert_eq!(given_back.len(), 1, "{given_back:?}");
        assert_eq!(given_back[0].0, 1);

        let bus = Arc::new(MemBus::default());
        assert_eq!(relay(&outbox, &bus).relay_once(100).await.unwrap(), 3);
        assert_eq!(*bus.published.lock().unwrap(), vec![1, 1, 1]);
        assert_eq!(*outbox.sent.lock().unwrap(), BTreeSet::from([1, 2]));
    }

    // Checks an order whose earlier event another relay holds is not published at all,
    // and that a failed predecessor holds back its successors in later rounds too.
    #[tokio::test]
    async fn waits_for_an_earlier_event_held_elsewhere() {
        let outbox = Arc::new(MemOutbox {
            rows: vec![row(1, "A", 1), row(2, "A", 2), row(3, "B", 1)],
            held_elsewhere: BTreeSet::from([1]),
            ..MemOutbox::default()
        });
        let bus = Arc::new(MemBus::default());
        assert_eq!(relay(&outbox, &bus).relay_once(100).await.unwrap(), 1);
        assert_eq!(*bus.published.lock().unwrap(), vec![3]);
    }

    // Checks a broker that is down leases nothing and reports the error (so the loop backs
    // off), and one that refuses every message fails the round and publishes nothing.
    #[tokio::test]
    async fn broker_down_fails_the_round() {
        let outbox = Arc::new(MemOutbox {
            rows: vec![row(1, "A", 1), row(2, "A", 2)],
            ..MemOutbox::default()
        });
        let down = Arc::new(MemBus {
            down: true,
            ..MemBus::default()
        });
        assert!(relay(&outbox, &down).relay_once(100).await.is_err());
        assert!(outbox.given_back.lock().unwrap().is_empty());
        let refusing = Arc::new(MemBus {
            refuse: BTreeSet::from([1, 2]),
            ..MemBus::default()
        });
        assert!(relay(&outbox, &refusing).relay_once(100).await.is_err());
        assert!(refusing.published.lock().unwrap().is_empty());
        assert_eq!(outbox.unsent().await.unwrap(), 2);
    }

    // Checks a round whose "sent" mark fails: the round reports the error (the loop backs
    // off), the events stay unsent to be published again, and the relay lets go of its
    // lease, which an adapter may have kept for a backlog.
    #[tokio::test]
    async fn a_failed_mark_fails_the_round_and_lets_go_of_the_lease() {
        let outbox = Arc::new(MemOutbox {
            rows: vec![row(1, "A", 1), row(2, "B", 1)],
            mark_fails: true,
            ..MemOutbox::default()
        });
        let bus = Arc::new(MemBus::default());
        assert!(relay(&outbox, &bus).relay_once(2).await.is_err());
        assert_eq!(*bus.published.lock().unwrap(), vec![1, 2]);
        assert_eq!(outbox.unsent().await.unwrap(), 2);
        assert_eq!(*outbox.let_go.lock().unwrap(), vec!["test".to_owned()]);
    }

    // Checks a row the broker refuses for good (too large): offered again at each round,
    // it is parked at its PARK_AFTER_REFUSALS-th refusal in a row, not before, and a
    // round of nothing but refusals is no broker failure (it returns Ok). Meanwhile its
    // order's later event waits; once it is parked, the later event goes out, other
    // orders go out from the first round, and the parked row is never offered again.
    // A failure of another kind (the broker out of reach) sets the count back.
    #[tokio::test]
    async fn a_row_refused_for_good_is_parked_after_the_bound() {
        let outbox = Arc::new(MemOutbox {
            rows: vec![row(1, "A", 1), row(2, "A", 2), row(3, "B", 1)],
            ..MemOutbox::default()
        });
        let bus = Arc::new(MemBus {
            too_large: BTreeSet::from([1]),
            ..MemBus::default()
        });
        let r = relay(&outbox, &bus);
        assert_eq!(r.relay_once(100).await.unwrap(), 1, "B goes out");
        for _ in 2..PARK_AFTER_REFUSALS {
            assert_eq!(
                r.relay_once(100).await.unwrap(),
                0,
                "refused alone: no failure"
            );
            assert!(outbox.parked.lock().unwrap().is_empty());
        }
        assert_eq!(*bus.published.lock().unwrap(), vec![3]);
        assert_eq!(r.relay_once(100).await.unwrap(), 0);
        let parked = outbox.parked.lock().unwrap().clone();
        assert_eq!(parked.keys().copied().collect::<Vec<_>>(), vec![1]);
        assert!(parked[&1].contains("too_large"), "{parked:?}");
        assert_eq!(r.relay_once(100).await.unwrap(), 1, "A's next event");
        assert_eq!(r.relay_once(100).await.unwrap(), 0);
        assert_eq!(*bus.published.lock().unwrap(), vec![3, 2]);

        // Four refusals, a failure of another kind, then refusals again: five in a row
        // are needed from there.
        let outbox = Arc::new(MemOutbox {
            rows: vec![row(7, "C", 1)],
            ..MemOutbox::default()
        });
        let r = relay(&outbox, &bus_refusing(7));
        for _ in 1..PARK_AFTER_REFUSALS {
            r.relay_once(100).await.unwrap();
        }
        let down = Arc::new(MemBus {
            refuse: BTreeSet::from([7]),
            ..MemBus::default()
        });
        assert!(relay(&outbox, &down).relay_once(100).await.is_err());
        for _ in 1..PARK_AFTER_REFUSALS {
            r.relay_once(100).await.unwrap();
        }
        assert!(outbox.parked.lock().unwrap().is_empty());
        r.relay_once(100).await.unwrap();
        assert_eq!(outbox.parked.lock().unwrap().len(), 1);
    }

    fn bus_refusing(id: i64) -> Arc<MemBus> {
        Arc::new(MemBus {
            too_large: BTreeSet::from([id]),
            ..MemBus::default()
        })
    }

    // Checks the loop drains a backlog larger than one batch and stops when told to.
    #[tokio::test]
    async fn run_drains_a_backlog_and_stops() {
        let rows = (1..=(RELAY_BATCH as i64 * 2 + 10))
            .map(|id| row(id, &format!("R{id}"), 1))
            .collect();
        let outbox = Arc::new(MemOutbox {
            rows,
            ..MemOutbox::default()
        });
        let bus = Arc::new(MemBus::default());
        let relay = Arc::new(relay(&outbox, &bus));
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn({
            let relay = relay.clone();
            async move { relay.run(stopped).await }
        });
        for _ in 0..100 {
            if outbox.unsent().await.unwrap() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(outbox.unsent().await.unwrap(), 0);
        stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("relay stops")
            .unwrap();
    }
}
