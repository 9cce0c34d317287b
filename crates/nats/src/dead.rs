//! The dead-letter stream `<stream>_DEAD`: the messages the statistics consumer gave up
//! on, each kept with why, how many deliveries it had and its last error, for a person to
//! list, replay or drop (`flashsale events dead`).
//!
//! Each letter has a subject of its own, `<prefix>.dead.<key>` (the key: the message's
//! sequence in the event stream), and the stream keeps one message per subject. Every
//! change of a letter is a publish on its subject that names the sequence it expects
//! there (`Nats-Expected-Last-Subject-Sequence`): burying expects none, so a message
//! buried twice (its ack lost, delivered again however much later) lands once; a replay
//! or a drop expects the letter as it was read, so of two people acting on one letter
//! at once the broker takes one. The new message replaces the old one: a replayed or
//! dropped letter stays as the record of who did it, when and why.
//!
//! A replay publishes the letter's body again to its subject in the event stream, where
//! the consumer applies it through the same path as any message; the consumed event ids
//! drop whatever of it was applied before.

use std::time::Duration;

use async_nats::header::HeaderMap;
use async_nats::jetstream::{self, context, stream};
use flashsale_app::ports::{BusError, ErrorKind, EventBus};
use flashsale_app::DeadReason;
use tracing::info;

use crate::bus::NatsBus;
use crate::wire::decode_message;
use crate::DEAD_STREAM_BYTES_MAX;

/// Longest last error a letter keeps (a header's value): the first lines of a
/// database's message say what refused it.
const ERROR_CHARS_MAX: usize = 500;
/// Longest note or name a person's drop or replay keeps.
const NOTE_CHARS_MAX: usize = 500;

const STATE: &str = "Flashsale-Dead-State";
const REASON: &str = "Flashsale-Dead-Reason";
const ERROR: &str = "Flashsale-Dead-Error";
const DELIVERIES: &str = "Flashsale-Dead-Deliveries";
const STREAM: &str = "Flashsale-Dead-Stream";
const SUBJECT: &str = "Flashsale-Dead-Subject";
const SEQUENCE: &str = "Flashsale-Dead-Sequence";
/// When the broker stored the original message (Unix nanoseconds): with the sequence,
/// what tells a message from another of the same sequence in a stream made anew.
const PUBLISHED: &str = "Flashsale-Dead-Published";
const MSG_ID: &str = "Flashsale-Dead-Msg-Id";
const AT: &str = "Flashsale-Dead-At";
const BY: &str = "Flashsale-Dead-By";
const NOTE: &str = "Flashsale-Dead-Note";
const SETTLED_AT: &str = "Flashsale-Dead-Settled-At";
const REPLAYED_AS: &str = "Flashsale-Dead-Replayed-As";

/// Where a letter stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LetterState {
    /// Given up on; waiting for a person.
    Dead,
    /// A replay began and may not have ended: replaying it again finishes it.
    Replaying,
    /// Put back into the event stream.
    Replayed,
    /// Discarded by a person (who and why kept).
    Dropped,
}

impl LetterState {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Dead => "dead",
            Self::Replaying => "replaying",
            Self::Replayed => "replayed",
            Self::Dropped => "dropped",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [Self::Dead, Self::Replaying, Self::Replayed, Self::Dropped]
            .into_iter()
            .find(|state| state.as_str() == s)
    }

    /// Whether a person still has to decide on it.
    pub const fn open(self) -> bool {
        matches!(self, Self::Dead | Self::Replaying)
    }
}

/// One letter as the dead-letter stream holds it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Its name for a person (`--id`): the message's sequence in the event stream.
    pub key: String,
    /// Its message in the dead-letter stream now.
    pub sequence: u64,
    pub state: LetterState,
    /// `refused` or `undecodable`.
    pub reason: String,
    pub error: String,
    /// Deliveries the consumer had of it.
    pub deliveries: u64,
    /// The event stream, subject and sequence it came from.
    pub stream: String,
    pub subject: String,
    pub stream_sequence: u64,
    /// When it was buried (RFC 3339).
    pub buried_at: String,
    /// Events in its body (0 when the body is no event array or object at all).
    pub events: usize,
    /// Who replayed or dropped it, why, and when.
    pub by: Option<String>,
    pub note: Option<String>,
    pub settled_at: Option<String>,
    /// Its copy's sequence in the event stream, once replayed.
    pub replayed_as: Option<u64>,
}

/// What a replay or a drop of one letter did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// Replayed: its copy's sequence in the event stream.
    Replayed(u64),
    Dropped,
    /// Nothing: no letter of that key.
    NotFound,
    /// Nothing: it is not open (already replayed or dropped), or a drop of one a replay
    /// has begun.
    Not(LetterState),
    /// Nothing: someone else changed it between its reading and this change.
    Raced,
}

/// A letter's text value: one line, at most `max` characters (a header's value may hold
/// no line break).
fn header_text(text: &str, max: usize) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(max)
        .collect()
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers.get(name).map_or("", |v| v.as_str())
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Whether a publish was refused because the subject's last message is not the one
/// expected (`Nats-Expected-Last-Subject-Sequence`).
fn wrong_last(e: &context::PublishError) -> bool {
    matches!(e.kind(), context::PublishErrorKind::WrongLastSequence)
}

fn dead_error(what: &str, e: impl std::error::Error + Send + Sync + 'static) -> BusError {
    BusError::caused(ErrorKind::Rejected, what, e)
}

impl NatsBus {
    /// Finds the dead-letter stream or creates it: `<prefix>.dead.>`, one message per
    /// subject, kept until a person settles it (no age limit; at most
    /// [`DEAD_STREAM_BYTES_MAX`], past which it refuses new letters and their messages
    /// stay in the event stream, delivered again), with the event stream's replica count.
    pub async fn ensure_dead_stream(&self) -> Result<stream::Stream, BusError> {
        let config = stream::Config {
            name: self.config().dead_stream(),
            subjects: vec![self.config().dead_subject(">")],
            storage: stream::StorageType::File,
            retention: stream::RetentionPolicy::Limits,
            discard: stream::DiscardPolicy::New,
            max_messages_per_subject: 1,
            max_bytes: DEAD_STREAM_BYTES_MAX,
            num_replicas: self.config().replicas,
            ..Default::default()
        };
        let stream = self.ensure_replicated(config).await?;
        self.dead_ready
            .store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(stream)
    }

    /// Publishes `body` with `headers` on `subject`, expecting the subject's last
    /// message at `expected` (0: none), and waits for the acknowledgement. `Ok(None)`:
    /// the subject's last message is another (someone else's change, or this message
    /// buried before).
    async fn publish_expecting(
        &self,
        subject: String,
        headers: HeaderMap,
        body: bytes::Bytes,
        expected: u64,
    ) -> Result<Option<u64>, BusError> {
        let publish = jetstream::message::PublishMessage::build()
            .payload(body)
            .headers(headers)
            .expected_last_subject_sequence(expected);
        let sent = self.jetstream().send_publish(subject, publish).await;
        let acked = match sent {
            Ok(ack) => std::future::IntoFuture::into_future(ack).await,
            Err(e) => Err(e),
        };
        match acked {
            Ok(ack) => Ok(Some(ack.sequence)),
            Err(e) if wrong_last(&e) => Ok(None),
            Err(e) => {
                if matches!(e.kind(), context::PublishErrorKind::StreamNotFound) {
                    self.dead_ready
                        .store(false, std::sync::atomic::Ordering::SeqCst);
                }
                Err(dead_error("dead-letter publish", e))
            }
        }
    }

    /// Moves a delivered message to the dead-letter stream, with why, its deliveries and
    /// its last error, and returns once the broker acknowledged it there: only then may
    /// the caller acknowledge it in the event stream. Burying a message buried before
    /// (whose acknowledgement was lost) changes nothing.
    pub async fn bury(
        &self,
        message: &jetstream::Message,
        reason: DeadReason,
        error: &str,
    ) -> Result<(), BusError> {
        let info = message
            .info()
            .map_err(|e| BusError::corrupt(format!("a delivery without its metadata: {e}")))?;
        if !self.dead_ready.load(std::sync::atomic::Ordering::SeqCst) {
            self.ensure_dead_stream().await?;
        }
        let published = info.published.unix_timestamp_nanos().to_string();
        let mut headers = HeaderMap::new();
        headers.insert(STATE, LetterState::Dead.as_str());
        headers.insert(REASON, reason.as_str());
        headers.insert(ERROR, header_text(error, ERROR_CHARS_MAX));
        headers.insert(DELIVERIES, info.delivered.to_string());
        headers.insert(STREAM, info.stream);
        headers.insert(SUBJECT, message.subject.as_str());
        headers.insert(SEQUENCE, info.stream_sequence.to_string());
        headers.insert(PUBLISHED, published.as_str());
        if let Some(id) = message.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id")) {
            headers.insert(MSG_ID, id.as_str());
        }
        headers.insert(AT, now());
        let key = info.stream_sequence.to_string();
        let subject = self.config().dead_subject(&key);
        let body = message.payload.clone();
        if self
            .publish_expecting(subject.clone(), headers.clone(), body.clone(), 0)
            .await?
            .is_some()
        {
            return Ok(());
        }
        // The key is taken: by this very message (buried before, its ack lost), or by
        // one of the same sequence in an event stream since deleted and made anew.
        let stream = self.ensure_dead_stream().await?;
        let there = stream
            .get_last_raw_message_by_subject(&subject)
            .await
            .map_err(|e| dead_error("reading a dead letter", e))?;
        let same = header(&there.headers, PUBLISHED) == published
            && header(&there.headers, STREAM) == info.stream;
        if same {
            return Ok(());
        }
        let subject = self.config().dead_subject(&format!("{key}-{published}"));
        self.publish_expecting(subject, headers, body, 0).await?;
        Ok(())
    }

    /// The dead-letter stream, or None when there is none yet.
    async fn dead_stream(&self) -> Result<Option<stream::Stream>, BusError> {
        self.ready()?;
        match self
            .jetstream()
            .get_stream(self.config().dead_stream())
            .await
        {
            Ok(stream) => Ok(Some(stream)),
            Err(e)
                if matches!(
                    e.kind(),
                    context::GetStreamErrorKind::JetStream(ref j)
                        if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(dead_error("the dead-letter stream", e)),
        }
    }

    /// Every letter, open and settled, oldest first: one read per message of the
    /// dead-letter stream (an operator's command, not a hot path).
    pub async fn dead_letters(&self) -> Result<Vec<DeadLetter>, BusError> {
        let Some(stream) = self.dead_stream().await? else {
            return Ok(Vec::new());
        };
        let state = stream
            .get_info()
            .await
            .map_err(|e| dead_error("the dead-letter stream's state", e))?
            .state;
        let mut letters = Vec::new();
        if state.messages == 0 {
            return Ok(letters);
        }
        for sequence in state.first_sequence..=state.last_sequence {
            // A letter replaced by its record leaves a gap: no message there.
            if let Ok(m) = stream.get_raw_message(sequence).await {
                letters.push(self.letter(&m));
            }
        }
        Ok(letters)
    }

    /// The letter a stored message is.
    fn letter(&self, m: &jetstream::message::StreamMessage) -> DeadLetter {
        let h = &m.headers;
        let number = |name| header(h, name).parse::<u64>().unwrap_or(0);
        let optional = |name| h.get(name).map(|v| v.as_str().to_owned());
        let prefix = self.config().dead_subject("");
        DeadLetter {
            key: m
                .subject
                .as_str()
                .strip_prefix(prefix.as_str())
                .unwrap_or(m.subject.as_str())
                .to_owned(),
            sequence: m.sequence,
            state: LetterState::parse(header(h, STATE)).unwrap_or(LetterState::Dead),
            reason: header(h, REASON).to_owned(),
            error: header(h, ERROR).to_owned(),
            deliveries: number(DELIVERIES),
            stream: header(h, STREAM).to_owned(),
            subject: header(h, SUBJECT).to_owned(),
            stream_sequence: number(SEQUENCE),
            buried_at: header(h, AT).to_owned(),
            events: decode_message(&m.payload).map_or(0, |events| events.len()),
            by: optional(BY),
            note: optional(NOTE),
            settled_at: optional(SETTLED_AT),
            replayed_as: h.get(REPLAYED_AS).and_then(|v| v.as_str().parse().ok()),
        }
    }

    /// The message of the letter named `key`, if there is one.
    async fn letter_message(
        &self,
        key: &str,
    ) -> Result<Option<jetstream::message::StreamMessage>, BusError> {
        let Some(stream) = self.dead_stream().await? else {
            return Ok(None);
        };
        match stream
            .get_last_raw_message_by_subject(&self.config().dead_subject(key))
            .await
        {
            Ok(m) => Ok(Some(m)),
            Err(e) if matches!(e.kind(), stream::LastRawMessageErrorKind::NoMessageFound) => {
                Ok(None)
            }
            Err(e) if matches!(e.kind(), stream::LastRawMessageErrorKind::InvalidSubject) => {
                Ok(None)
            }
            Err(e) => Err(dead_error("reading a dead letter", e)),
        }
    }

    /// Replaces a letter's message by one in `state` with `extra` headers, if it is
    /// still the message read: the new message's sequence, or None (someone else's
    /// change came first).
    async fn mark(
        &self,
        letter: &jetstream::message::StreamMessage,
        state: LetterState,
        extra: &[(&str, String)],
    ) -> Result<Option<u64>, BusError> {
        let mut headers = HeaderMap::new();
        for (name, values) in letter.headers.iter() {
            if let Some(value) = values.last() {
                headers.insert(name.clone(), value.clone());
            }
        }
        headers.insert(STATE, state.as_str());
        for (name, value) in extra {
            headers.insert(*name, value.as_str());
        }
        self.publish_expecting(
            letter.subject.to_string(),
            headers,
            letter.payload.clone(),
            letter.sequence,
        )
        .await
    }

    /// Puts the letter named `key` back into the event stream, `by` a person: it is
    /// marked replaying (so that nobody drops it meanwhile), its body published again
    /// to its subject, then it is marked replayed with its copy's sequence.
    pub async fn replay(&self, key: &str, by: &str) -> Result<Settled, BusError> {
        let Some(mut letter) = self.letter_message(key).await? else {
            return Ok(Settled::NotFound);
        };
        let by = header_text(by, NOTE_CHARS_MAX);
        match LetterState::parse(header(&letter.headers, STATE)) {
            Some(LetterState::Dead) | None => {
                let extra = [(BY, by.clone()), (SETTLED_AT, now())];
                let Some(sequence) = self.mark(&letter, LetterState::Replaying, &extra).await?
                else {
                    return Ok(Settled::Raced);
                };
                letter.sequence = sequence;
            }
            Some(LetterState::Replaying) => {}
            Some(state) => return Ok(Settled::Not(state)),
        }
        // Under an id of its own: within the duplicate window a replay finished again
        // after a crash is dropped by the broker (and by the consumer after it).
        let publish = jetstream::message::PublishMessage::build()
            .payload(letter.payload.clone())
            .message_id(format!("replay-{}-{key}", self.config().dead_stream()));
        let copy = self
            .jetstream()
            .send_publish(header(&letter.headers, SUBJECT).to_owned(), publish)
            .await
            .map_err(|e| dead_error("replaying a dead letter", e))?;
        let copy = std::future::IntoFuture::into_future(copy)
            .await
            .map_err(|e| dead_error("replaying a dead letter", e))?;
        let extra = [
            (BY, by),
            (SETTLED_AT, now()),
            (REPLAYED_AS, copy.sequence.to_string()),
        ];
        if self
            .mark(&letter, LetterState::Replayed, &extra)
            .await?
            .is_none()
        {
            return Ok(Settled::Raced);
        }
        info!(key, stream_sequence = copy.sequence, "dead letter replayed");
        Ok(Settled::Replayed(copy.sequence))
    }

    /// Discards the letter named `key`, `by` a person, for the reason in `note`: its
    /// message is replaced by a record of the drop (the body kept), which nothing
    /// consumes.
    pub async fn drop_letter(&self, key: &str, by: &str, note: &str) -> Result<Settled, BusError> {
        let Some(letter) = self.letter_message(key).await? else {
            return Ok(Settled::NotFound);
        };
        match LetterState::parse(header(&letter.headers, STATE)) {
            Some(LetterState::Dead) | None => {}
            Some(state) => return Ok(Settled::Not(state)),
        }
        let extra = [
            (BY, header_text(by, NOTE_CHARS_MAX)),
            (NOTE, header_text(note, NOTE_CHARS_MAX)),
            (SETTLED_AT, now()),
        ];
        Ok(
            match self.mark(&letter, LetterState::Dropped, &extra).await? {
                Some(_) => {
                    info!(key, by, "dead letter dropped");
                    Settled::Dropped
                }
                None => Settled::Raced,
            },
        )
    }

    /// Waits until connected, at most `bound`: an operator's command starts with this.
    pub async fn connected_within(&self, bound: Duration) -> Result<(), BusError> {
        let deadline = tokio::time::Instant::now() + bound;
        while self.ready().is_err() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.ready()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks a letter's text values are one line of at most their bound (a header value
    // can hold no line break), and states read back as written.
    #[test]
    fn header_values_are_one_bounded_line() {
        assert_eq!(
            header_text("CHECK\r\nconstraint\tfailed", 100),
            "CHECK  constraint failed"
        );
        assert_eq!(header_text(&"é".repeat(600), 500).chars().count(), 500);
        for state in [
            LetterState::Dead,
            LetterState::Replaying,
            LetterState::Replayed,
            LetterState::Dropped,
        ] {
            assert_eq!(LetterState::parse(state.as_str()), Some(state));
        }
        assert_eq!(LetterState::parse("other"), None);
        assert!(LetterState::Replaying.open() && !LetterState::Dropped.open());
    }
}
