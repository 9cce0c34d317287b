//! The sales-statistics consumer: fetches from the durable consumer, applies each
//! delivered chunk's events once through [`Consume`], and acknowledges a message only
//! after all its events were applied (or found applied before).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use flashsale_app::ports::EventBus;
use flashsale_app::{Consume, Event};
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
    info!(consumer = CONSUMER_NAME, stream = %bus.config().stream, "event consumer started");
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
