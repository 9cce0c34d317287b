//! The sales-statistics consumer: fetches from the durable consumer, applies each
//! delivered chunk's events once through [`Consume`], and acknowledges a message only
//! after all its events were applied (or found applied before), or after the broker
//! acknowledged its copy in the dead-letter stream.
//!
//! A chunk is applied in one store transaction. When the store refuses it (a statement
//! it rejects, not one it could not run), its messages are applied one by one, and a
//! message refused alone event by event: whatever the store takes is applied at once and
//! those messages acknowledged, so one refused event holds back no other message. A
//! message still refused is delivered again after [`NAK_DELAY`], and given up on at its
//! last allowed delivery ([`Consume::settle`]): moved to the dead-letter stream with its
//! deliveries and its last error ([`NatsBus::bury`]), then acknowledged. A message that
//! does not decode goes there at once (its decodable events applied first).

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer};
use flashsale_app::ports::EventBus;
use flashsale_app::{Consume, DeadReason, Event, LedgerError, Settle};
use futures::StreamExt;
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use crate::bus::NatsBus;
use crate::wire::decode_message;
use crate::{
    CONSUMER_BACKOFF_FIRST, CONSUMER_BACKOFF_MAX, CONSUMER_BATCH, CONSUMER_EVENTS_MAX,
    CONSUMER_LINGER, CONSUMER_NAME, FETCH_WAIT, NAK_DELAY,
};

/// What became of one delivered chunk.
enum Handled {
    Done,
    /// The store failed (not a refusal): the messages will come again; back off.
    Retry,
}

/// One delivered message and what of it decoded.
struct Delivered {
    message: jetstream::Message,
    /// Its events' place in the chunk's `events`.
    events: Range<usize>,
    /// What in it did not decode (the first error and how many events), if anything.
    undecodable: Option<String>,
}

impl Delivered {
    /// Its deliveries so far, as the broker counts them. A delivery without its metadata
    /// counts as the last allowed: a refusal then buries it rather than retry it without
    /// a bound.
    fn deliveries(&self) -> u64 {
        self.message
            .info()
            .map_or(u64::MAX, |i| u64::try_from(i.delivered).unwrap_or(0))
    }
}

/// Messages delivered together and the events in them, applied in one store transaction
/// where it can.
#[derive(Default)]
struct Chunk {
    delivered: Vec<Delivered>,
    events: Vec<Event>,
}

/// Delivers `message` again after [`NAK_DELAY`].
async fn retry(message: &jetstream::Message) {
    if let Err(e) = message
        .ack_with(jetstream::AckKind::Nak(Some(NAK_DELAY)))
        .await
    {
        debug!(error = %e, "nak failed; redelivered after the ack wait instead");
    }
}

/// Moves `message` to the dead-letter stream, then acknowledges it (terminated: never
/// delivered again). If the dead-letter stream did not take it, it is delivered again
/// instead, and buried then.
async fn bury(
    bus: &NatsBus,
    consume: &Consume,
    message: &jetstream::Message,
    reason: DeadReason,
    why: &str,
) {
    match bus.bury(message, reason, why).await {
        Ok(()) => {
            consume.dead_lettered(reason);
            warn!(subject = %message.subject, reason = reason.as_str(), error = why, "message moved to the dead-letter stream");
            if let Err(e) = message.ack_with(jetstream::AckKind::Term).await {
                // Delivered again, buried again: the dead-letter stream keeps it once.
                warn!(error = %e, "could not acknowledge a buried message");
            }
        }
        Err(e) => {
            error!(subject = %message.subject, error = %e, "could not move a message to the dead-letter stream; it comes again");
            retry(message).await;
        }
    }
}

impl Chunk {
    /// Adds a delivered message's events. A message none of whose events decode is
    /// buried at once: no delivery would ever apply it.
    async fn take(&mut self, message: jetstream::Message, bus: &NatsBus, consume: &Consume) {
        let decoded = match decode_message(&message.payload) {
            Ok(decoded) => decoded,
            Err(e) => vec![Err(e)],
        };
        let before = self.events.len();
        let mut bad = 0;
        let mut first_error = None;
        for event in decoded {
            match event {
                Ok(event) => self.events.push(event),
                Err(e) => {
                    bad += 1;
                    first_error.get_or_insert(e.to_string());
                }
            }
        }
        let undecodable = first_error.map(|e| format!("{bad} event(s) do not decode: {e}"));
        if self.events.len() == before {
            let why = undecodable.unwrap_or_else(|| "no event in it".to_owned());
            bury(bus, consume, &message, DeadReason::Undecodable, &why).await;
            return;
        }
        self.delivered.push(Delivered {
            message,
            events: before..self.events.len(),
            undecodable,
        });
    }

    /// Whether it takes no more messages.
    fn full(&self) -> bool {
        self.delivered.len() >= CONSUMER_BATCH || self.events.len() >= CONSUMER_EVENTS_MAX
    }

    /// Applies the events, then acknowledges their messages. A store that failed sends
    /// them all back to come again; one that refused them has them applied one message
    /// at a time.
    async fn handle(self, bus: &NatsBus, consume: &Consume) -> Handled {
        if self.events.is_empty() {
            return Handled::Done;
        }
        match consume.apply_all(&self.events).await {
            Ok(_) => {
                for d in &self.delivered {
                    applied(bus, consume, d).await;
                }
                Handled::Done
            }
            Err(e) if e.kind().is_refusal() => self.one_by_one(bus, consume).await,
            Err(e) => {
                warn!(events = self.events.len(), error = %e, "events not applied; they will be delivered again");
                for d in &self.delivered {
                    retry(&d.message).await;
                }
                Handled::Retry
            }
        }
    }

    /// Applies each message alone, and a message refused alone event by event; settles
    /// each by what the store did with it.
    async fn one_by_one(self, bus: &NatsBus, consume: &Consume) -> Handled {
        for (i, d) in self.delivered.iter().enumerate() {
            let events = &self.events[d.events.clone()];
            let refused = match consume.apply_all(events).await {
                Ok(_) => None,
                Err(e) if e.kind().is_refusal() => match each(consume, events).await {
                    Ok(refused) => refused,
                    Err(e) => Some(e),
                },
                Err(e) => Some(e),
            };
            let Some(e) = refused else {
                applied(bus, consume, d).await;
                continue;
            };
            if !e.kind().is_refusal() {
                warn!(error = %e, "events not applied; they will be delivered again");
                for rest in &self.delivered[i..] {
                    retry(&rest.message).await;
                }
                return Handled::Retry;
            }
            match consume.settle(&e, d.deliveries()) {
                Settle::DeadLetter => {
                    bury(
                        bus,
                        consume,
                        &d.message,
                        DeadReason::Refused,
                        &e.to_string(),
                    )
                    .await
                }
                Settle::Retry => {
                    debug!(subject = %d.message.subject, deliveries = d.deliveries(), error = %e, "the store refused a message; it comes again");
                    retry(&d.message).await;
                }
            }
        }
        Handled::Done
    }
}

/// Applies `events` one at a time, each in its own transaction: whatever the store
/// takes is applied. `Ok(Some)`: the first refusal; `Err`: the store failed otherwise.
async fn each(consume: &Consume, events: &[Event]) -> Result<Option<LedgerError>, LedgerError> {
    let mut refused = None;
    for event in events {
        match consume.apply_all(std::slice::from_ref(event)).await {
            Ok(_) => {}
            Err(e) if e.kind().is_refusal() => {
                refused.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(refused)
}

/// Settles a message whose decodable events were all applied: acknowledged, or buried
/// when some of it did not decode.
async fn applied(bus: &NatsBus, consume: &Consume, d: &Delivered) {
    match &d.undecodable {
        Some(why) => bury(bus, consume, &d.message, DeadReason::Undecodable, why).await,
        None => {
            // A lost ack means one more delivery, which the store ignores.
            if let Err(e) = d.message.ack().await {
                warn!(subject = %d.message.subject, error = %e, "ack failed; the message will be delivered again");
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
    info!(consumer = CONSUMER_NAME, stream = %bus.config().stream, "event consumer started");
    let mut backoff = CONSUMER_BACKOFF_FIRST;
    let mut consumer = None;
    let mut failing = false;
    while !*stop.borrow() {
        match round(&bus, &consume, &mut consumer, &mut stop).await {
            RoundEnd::Stopped => break,
            RoundEnd::Done => {
                if failing {
                    info!(consumer = CONSUMER_NAME, "event consumer working again");
                    failing = false;
                }
                backoff = CONSUMER_BACKOFF_FIRST;
            }
            RoundEnd::Failed(e) => {
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

/// How a round of the consumer ended.
enum RoundEnd {
    /// Its batch was fetched and applied (or the fetch found nothing before it expired).
    Done,
    /// The broker or the store failed: back off, then go on.
    Failed(String),
    /// `stop` turned true.
    Stopped,
}

/// One round: a fetch of up to [`CONSUMER_BATCH`] messages, applied in chunks as they
/// arrive. A fetch that broke forgets the durable consumer's handle, to be made again.
async fn round(
    bus: &NatsBus,
    consume: &Consume,
    consumer: &mut Option<consumer::PullConsumer>,
    stop: &mut watch::Receiver<bool>,
) -> RoundEnd {
    if let Err(e) = bus.ready() {
        return RoundEnd::Failed(e.to_string());
    }
    let pull = match consumer {
        Some(c) => c,
        None => match bus.ensure_consumer().await {
            Ok(c) => consumer.insert(c),
            Err(e) => return RoundEnd::Failed(e.to_string()),
        },
    };
    let fetched = pull
        .batch()
        .max_messages(CONSUMER_BATCH)
        .expires(FETCH_WAIT)
        .messages()
        .await;
    let mut messages = match fetched {
        Ok(messages) => messages,
        Err(e) => {
            *consumer = None;
            return RoundEnd::Failed(format!("fetch: {e}"));
        }
    };
    loop {
        let first = tokio::select! {
            first = messages.next() => first,
            _ = stop.changed() => return RoundEnd::Stopped,
        };
        let first = match first {
            None => return RoundEnd::Done,
            Some(Ok(first)) => first,
            Some(Err(e)) => {
                *consumer = None;
                return RoundEnd::Failed(format!("fetch: {e}"));
            }
        };
        let (chunk, tail) = gather(first, &mut messages, bus, consume).await;
        if let Handled::Retry = chunk.handle(bus, consume).await {
            return RoundEnd::Failed("the statistics store failed".to_owned());
        }
        match tail {
            Tail::More => {}
            Tail::Ended => return RoundEnd::Done,
            Tail::Broken(e) => {
                *consumer = None;
                return RoundEnd::Failed(format!("fetch: {e}"));
            }
        }
    }
}

/// What followed a chunk in its batch.
enum Tail {
    /// Nothing within the linger, or the chunk is full: the batch may hold more.
    More,
    /// The batch ended.
    Ended,
    /// The fetch broke.
    Broken(String),
}

/// A chunk: `first`, and whatever else arrives within [`CONSUMER_LINGER`] (up to
/// [`CONSUMER_BATCH`] messages or [`CONSUMER_EVENTS_MAX`] events), so that a steady
/// stream is applied in a few large transactions rather than many small ones.
async fn gather<S, E>(
    first: jetstream::Message,
    messages: &mut S,
    bus: &NatsBus,
    consume: &Consume,
) -> (Chunk, Tail)
where
    S: futures::Stream<Item = Result<jetstream::Message, E>> + Unpin,
    E: std::fmt::Display,
{
    let mut chunk = Chunk::default();
    chunk.take(first, bus, consume).await;
    let linger = tokio::time::Instant::now() + CONSUMER_LINGER;
    while !chunk.full() {
        match tokio::time::timeout_at(linger, messages.next()).await {
            Ok(Some(Ok(message))) => chunk.take(message, bus, consume).await,
            Ok(Some(Err(e))) => return (chunk, Tail::Broken(e.to_string())),
            Ok(None) => return (chunk, Tail::Ended),
            Err(_) => break,
        }
    }
    (chunk, Tail::More)
}
