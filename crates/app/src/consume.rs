//! The sales-statistics consumer: applies each event to per-product counters, exactly
//! once per event id. The broker delivers at least once (a redelivery after a lost ack, a
//! republish after the duplicate window); the store's record of consumed event ids, kept
//! in the same transaction as the counters, makes every extra delivery a no-op.
//!
//! A message the store keeps refusing is given up on after [`Consume::max_deliver`]
//! deliveries, and one that does not decode at once: the adapter moves it to a
//! dead-letter stream for a person ([`Consume::settle`] decides, [`DeadReason`] says
//! why), so that the messages behind it go on. A replayed dead letter comes back through
//! the same path, and the consumed event ids keep each event applied once.

use std::sync::Arc;

use crate::events::{Event, EventType};
use crate::metrics::Metrics;
use crate::ports::{Applied, LedgerError, PortError, StatsEvent, StatsStore};

/// What one event adds to its product's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsDelta {
    pub orders_created: i64,
    pub units_ordered: i64,
    pub orders_paid: i64,
    pub units_paid: i64,
    pub orders_cancelled: i64,
    pub units_cancelled: i64,
    /// Reservations released: those of cancelled orders and fences (no order).
    pub reservations_released: i64,
    pub units_released: i64,
    /// Paid orders the operator refunded.
    pub orders_refunded: i64,
    pub units_refunded: i64,
}

impl StatsDelta {
    /// What `event` adds: nothing for a product's own event (a stock repair, which moved
    /// the gate's count, or an operator's pause or resume), which sold nothing (it is
    /// still consumed once, by its id, like any other event).
    pub fn of(event: &Event) -> Self {
        debug_assert_eq!(
            event.units.is_none(),
            event.event_type.of_product(),
            "only a product's own event has no buyer and units"
        );
        let units = event.units.map_or(0, |(_, q)| i64::from(q.get()));
        let mut delta = Self::default();
        // The event's count and its units.
        let (count, counted_units) = match event.event_type {
            EventType::OrderCreated => (&mut delta.orders_created, &mut delta.units_ordered),
            EventType::OrderPaid => (&mut delta.orders_paid, &mut delta.units_paid),
            EventType::OrderCancelled => (&mut delta.orders_cancelled, &mut delta.units_cancelled),
            EventType::ReservationReleased => {
                (&mut delta.reservations_released, &mut delta.units_released)
            }
            EventType::OrderRefunded => (&mut delta.orders_refunded, &mut delta.units_refunded),
            EventType::StockRepaired
            | EventType::ProductPaused
            | EventType::ProductResumed
            | EventType::ProductChanged
            | EventType::ProductDestocked => return delta,
        };
        *count = 1;
        *counted_units = units;
        delta
    }
}

impl StatsEvent {
    /// `event` as the statistics store applies it: its id, type, product and delta.
    pub fn of(event: &Event) -> Self {
        Self {
            event_id: event.event_id.clone(),
            event_type: event.event_type,
            product_id: event.product_id,
            delta: StatsDelta::of(event),
        }
    }
}

impl std::ops::AddAssign<&StatsDelta> for StatsDelta {
    fn add_assign(&mut self, d: &StatsDelta) {
        self.orders_created += d.orders_created;
        self.units_ordered += d.units_ordered;
        self.orders_paid += d.orders_paid;
        self.units_paid += d.units_paid;
        self.orders_cancelled += d.orders_cancelled;
        self.units_cancelled += d.units_cancelled;
        self.reservations_released += d.reservations_released;
        self.units_released += d.units_released;
        self.orders_refunded += d.orders_refunded;
        self.units_refunded += d.units_refunded;
    }
}

/// Deliveries after which the consumer gives up on a message its store refuses
/// (`FLASHSALE_EVENTS_MAX_DELIVER`'s default): a refusal that outlives five tries, a
/// second or more apart, is the store's answer to that message rather than a passing
/// state, and the message has been retried for a few seconds, not minutes.
pub const MAX_DELIVER_DEFAULT: u32 = 5;

/// Why a message was moved to the dead-letter stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadReason {
    /// The statistics store refused its events at its last allowed delivery.
    Refused,
    /// Its body, or an event in it, does not decode: no delivery could ever apply it.
    Undecodable,
}

impl DeadReason {
    pub const ALL: [DeadReason; 2] = [Self::Refused, Self::Undecodable];

    /// As the dead letter's header and the metrics' `reason` label name it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Refused => "refused",
            Self::Undecodable => "undecodable",
        }
    }
}

/// What becomes of a delivered message whose events the store did not all take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settle {
    /// Delivered again later (NAK): the store may take it then.
    Retry,
    /// Moved to the dead-letter stream, then acknowledged: given up on.
    DeadLetter,
}

/// The consumer use case.
pub struct Consume {
    stats: Arc<dyn StatsStore>,
    metrics: Option<Arc<Metrics>>,
    max_deliver: u32,
}

impl Consume {
    pub fn new(stats: Arc<dyn StatsStore>) -> Self {
        Self {
            stats,
            metrics: None,
            max_deliver: MAX_DELIVER_DEFAULT,
        }
    }

    /// Counts the events applied and the failures in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Gives up on a message the store refuses at its `n`th delivery (at least 1).
    pub fn with_max_deliver(mut self, n: u32) -> Self {
        self.max_deliver = n.max(1);
        self
    }

    /// Deliveries after which a refused message is given up on.
    pub fn max_deliver(&self) -> u32 {
        self.max_deliver
    }

    /// What becomes of a message whose events failed with `e` at its `deliveries`th
    /// delivery (as the broker counts them, every instance's together). A refusal at
    /// the last allowed delivery gives it up; anything else (a store out of reach, slow
    /// or busy) retries it, whatever the count: a database outage must not empty the
    /// stream into the dead letters, so past the count a message dies at its next
    /// refusal.
    pub fn settle(&self, e: &LedgerError, deliveries: u64) -> Settle {
        if e.kind().is_refusal() && deliveries >= u64::from(self.max_deliver) {
            Settle::DeadLetter
        } else {
            Settle::Retry
        }
    }

    /// Counts a message moved to the dead-letter stream.
    pub fn dead_lettered(&self, reason: DeadReason) {
        if let Some(m) = &self.metrics {
            m.event_dead_lettered(reason);
        }
    }

    /// Counts what one application did: the events applied now (not those applied
    /// before), or a failure.
    fn count<'a>(&self, result: Result<impl IntoIterator<Item = &'a Applied>, &LedgerError>) {
        let Some(m) = &self.metrics else { return };
        match result {
            Ok(applied) => m.events_applied(
                applied
                    .into_iter()
                    .filter(|a| **a == Applied::Applied)
                    .count(),
            ),
            Err(e) => {
                m.consumer_failed();
                m.store_failed(LedgerError::STORE, e.kind());
            }
        }
    }

    /// Applies the event unless its id was applied before. An `Err` means the outcome is
    /// unknown: the caller must not acknowledge the message, so it is delivered again.
    pub async fn apply(&self, event: &Event) -> Result<Applied, LedgerError> {
        let applied = self.stats.apply_once(&StatsEvent::of(event)).await;
        self.count(applied.as_ref().map(std::iter::once));
        let applied = applied?;
        if applied == Applied::AlreadyApplied {
            tracing::debug!(event_id = %event.event_id, "event already applied; ignored");
        }
        Ok(applied)
    }

    /// Applies the events delivered together, in one step where the store can.
    pub async fn apply_all(&self, events: &[Event]) -> Result<Vec<Applied>, LedgerError> {
        let items: Vec<StatsEvent> = events.iter().map(StatsEvent::of).collect();
        let applied = self.stats.apply_all(&items).await;
        self.count(applied.as_ref());
        applied
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::Mutex;

    use async_trait::async_trait;
    use chrono::Utc;
    use flashsale_core::{OrderId, ProductId, Quantity, RequestId, UserId};

    use super::*;

    #[derive(Default)]
    struct MemStats {
        consumed: Mutex<BTreeSet<String>>,
        totals: Mutex<BTreeMap<i64, StatsDelta>>,
    }

    #[async_trait]
    impl StatsStore for MemStats {
        async fn apply_once(&self, event: &StatsEvent) -> Result<Applied, LedgerError> {
            if !self.consumed.lock().unwrap().insert(event.event_id.clone()) {
                return Ok(Applied::AlreadyApplied);
            }
            let mut totals = self.totals.lock().unwrap();
            let t = totals.entry(event.product_id.get()).or_default();
            *t += &event.delta;
            Ok(Applied::Applied)
        }
    }

    fn event(id: &str, event_type: EventType, quantity: i64) -> Event {
        Event {
            event_id: id.to_owned(),
            event_type,
            sequence: 1,
            order_id: Some(OrderId::parse(1).unwrap()),
            request_id: RequestId::parse("request_id", "R1").unwrap(),
            product_id: ProductId::parse(7).unwrap(),
            units: Some((
                UserId::parse(3).unwrap(),
                Quantity::from_stored(quantity).unwrap(),
            )),
            reason: None,
            occurred_at: Utc::now(),
        }
    }

    // Checks when a message is given up on: a refusal (rejected, corrupt, too large) at
    // or past the allowed deliveries, never before them, and never for a store out of
    // reach, slow, busy or misconfigured, however many deliveries it had.
    #[test]
    fn gives_up_only_on_refusals_at_the_last_delivery() {
        let consume = Consume::new(Arc::new(MemStats::default())).with_max_deliver(5);
        let refused = LedgerError::rejected("CHECK constraint failed");
        assert_eq!(consume.settle(&refused, 1), Settle::Retry);
        assert_eq!(consume.settle(&refused, 4), Settle::Retry);
        assert_eq!(consume.settle(&refused, 5), Settle::DeadLetter);
        assert_eq!(consume.settle(&refused, 9), Settle::DeadLetter);
        for kind in crate::ports::ErrorKind::ALL {
            let e = LedgerError::new(kind, "x");
            let expected = match kind.is_refusal() {
                true => Settle::DeadLetter,
                false => Settle::Retry,
            };
            assert_eq!(consume.settle(&e, 100), expected, "{kind}");
        }
        assert_eq!(Consume::new(Arc::new(MemStats::default())).max_deliver(), 5);
        assert_eq!(
            Consume::new(Arc::new(MemStats::default()))
                .with_max_deliver(0)
                .max_deliver(),
            1
        );
    }

    // Checks each event type moves its own two counters (a stock repair's none: it is
    // recorded as applied and counts no sale), and that the same event id delivered
    // again is reported as already applied and changes nothing.
    #[tokio::test]
    async fn applies_each_event_id_once() {
        let store = Arc::new(MemStats::default());
        let consume = Consume::new(store.clone());
        let created = event("e1", EventType::OrderCreated, 2);
        assert_eq!(consume.apply(&created).await.unwrap(), Applied::Applied);
        assert_eq!(
            consume.apply(&created).await.unwrap(),
            Applied::AlreadyApplied
        );
        for (id, t) in [
            ("e2", EventType::OrderCancelled),
            ("e3", EventType::ReservationReleased),
            ("e5", EventType::OrderRefunded),
        ] {
            consume.apply(&event(id, t, 2)).await.unwrap();
            consume.apply(&event(id, t, 2)).await.unwrap();
        }
        let repaired = Event {
            event_type: EventType::StockRepaired,
            order_id: None,
            units: None,
            reason: Some("drift seen twice, unchanged in between".into()),
            ..event("e4", EventType::StockRepaired, 1)
        };
        assert_eq!(consume.apply(&repaired).await.unwrap(), Applied::Applied);
        assert_eq!(
            consume.apply(&repaired).await.unwrap(),
            Applied::AlreadyApplied
        );
        let totals = store.totals.lock().unwrap()[&7];
        assert_eq!(
            totals,
            StatsDelta {
                orders_created: 1,
                units_ordered: 2,
                orders_cancelled: 1,
                units_cancelled: 2,
                reservations_released: 1,
                units_released: 2,
                orders_refunded: 1,
                units_refunded: 2,
                ..StatsDelta::default()
            }
        );
    }
}
