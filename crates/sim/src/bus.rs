//! `MemBus`: the broker (NATS JetStream) in memory — one stream, deduplication on the
//! event id within the duplicate window, and one durable consumer position — behind the
//! fault injector (a publish fails, or is stored but its acknowledgement is lost).
//! It takes one event per message, as the NATS adapter does with
//! `FLASHSALE_NATS_EVENTS_PER_MESSAGE=1`; packing several into one message (the
//! adapter's default) is the adapter's own concern, tested against a real nats-server
//! (`crates/server/tests/it/events.rs`). With packs the broker drops fewer copies (a
//! republished event in another pack is new to it) and the consumer's own
//! deduplication, which the simulator checks, drops the rest.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, Utc};
use flashsale_app::{BusError, EventBus, OutboxMessage};

use crate::ctx::{Ctx, Port};
use crate::faulty::through;

/// JetStream's duplicate window on `Nats-Msg-Id` (`DUPLICATE_WINDOW` in
/// `crates/nats`): a copy published within it is dropped, a later one is stored again.
const DUPLICATE_WINDOW: TimeDelta = TimeDelta::seconds(120);

#[derive(Default)]
struct Stream {
    messages: Vec<OutboxMessage>,
    /// Event id → when the broker first stored it (its own clock: true time).
    seen: BTreeMap<String, DateTime<Utc>>,
    /// The durable consumer's acknowledged floor: messages below it were acked.
    acked: usize,
}

pub struct MemBus {
    ctx: Arc<Ctx>,
    stream: Mutex<Stream>,
}

impl MemBus {
    pub fn new(ctx: Arc<Ctx>) -> Self {
        Self {
            ctx,
            stream: Mutex::new(Stream::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Stream> {
        self.stream.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn store(&self, message: &OutboxMessage) -> Result<(), BusError> {
        let now = self.ctx.gate_now();
        let mut s = self.lock();
        let fresh = s
            .seen
            .get(&message.event_id)
            .is_none_or(|at| *at + DUPLICATE_WINDOW <= now);
        if fresh {
            s.seen.insert(message.event_id.clone(), now);
            s.messages.push(message.clone());
        }
        Ok(())
    }

    /// The next message for the consumer (the first one not acknowledged), with its
    /// position.
    pub fn next_delivery(&self) -> Option<(usize, OutboxMessage)> {
        let s = self.lock();
        s.messages.get(s.acked).map(|m| (s.acked, m.clone()))
    }

    pub fn ack(&self, position: usize) {
        let mut s = self.lock();
        s.acked = s.acked.max(position + 1);
    }

    pub fn caught_up(&self) -> bool {
        let s = self.lock();
        s.acked >= s.messages.len()
    }

    /// Everything the broker stored, in order (copies after the window included).
    pub fn messages(&self) -> Vec<OutboxMessage> {
        self.lock().messages.clone()
    }
}

#[async_trait]
impl EventBus for MemBus {
    fn ready(&self) -> Result<(), BusError> {
        let s = self.ctx.lock();
        if s.step < s.bus_down_until {
            return Err(BusError::unreachable("not connected (injected outage)"));
        }
        Ok(())
    }

    async fn publish(&self, message: &OutboxMessage) -> Result<(), BusError> {
        through(
            &self.ctx,
            Port::Bus,
            "bus.publish",
            || {
                format!(
                    "{} {} #{}",
                    message.event_id, message.request_id, message.sequence
                )
            },
            || self.store(message),
        )
        .await
    }
}
