//! The sales-statistics consumer: applies each event to per-product counters, exactly
//! once per event id. The broker delivers at least once (a redelivery after a lost ack, a
//! republish after the duplicate window); the store's record of consumed event ids, kept
//! in the same transaction as the counters, makes every extra delivery a no-op.

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
}

impl StatsDelta {
    pub fn of(event: &Event) -> Self {
        let units = i64::from(event.quantity.get());
        let mut delta = Self::default();
        match event.event_type {
            EventType::OrderCreated => {
                delta.orders_created = 1;
                delta.units_ordered = units;
            }
            EventType::OrderPaid => {
                delta.orders_paid = 1;
                delta.units_paid = units;
            }
            EventType::OrderCancelled => {
                delta.orders_cancelled = 1;
                delta.units_cancelled = units;
            }
            EventType::ReservationReleased => {
                delta.reservations_released = 1;
                delta.units_released = units;
            }
        }
        delta
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
    }
}

/// The consumer use case.
pub struct Consume {
    stats: Arc<dyn StatsStore>,
    metrics: Option<Arc<Metrics>>,
}

impl Consume {
    pub fn new(stats: Arc<dyn StatsStore>) -> Self {
        Self {
            stats,
            metrics: None,
        }
    }

    /// Counts the events applied and the failures in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
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
        let applied = self
            .stats
            .apply_once(
                &event.event_id,
                event.event_type,
                event.product_id,
                &StatsDelta::of(event),
            )
            .await;
        self.count(applied.as_ref().map(std::iter::once));
        let applied = applied?;
        if applied == Applied::AlreadyApplied {
            tracing::debug!(event_id = %event.event_id, "event already applied; ignored");
        }
        Ok(applied)
    }

    /// Applies the events delivered together, in one step where the store can.
    pub async fn apply_all(&self, events: &[Event]) -> Result<Vec<Applied>, LedgerError> {
        let items: Vec<StatsEvent> = events
            .iter()
            .map(|e| StatsEvent {
                event_id: e.event_id.clone(),
                event_type: e.event_type,
                product_id: e.product_id,
                delta: StatsDelta::of(e),
            })
            .collect();
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
        async fn apply_once(
            &self,
            event_id: &str,
            _event_type: EventType,
            product_id: ProductId,
            d: &StatsDelta,
        ) -> Result<Applied, LedgerError> {
            if !self.consumed.lock().unwrap().insert(event_id.to_owned()) {
                return Ok(Applied::AlreadyApplied);
            }
            let mut totals = self.totals.lock().unwrap();
            let t = totals.entry(product_id.get()).or_default();
            *t += d;
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
            user_id: UserId::parse(3).unwrap(),
            quantity: Quantity::from_stored(quantity).unwrap(),
            reason: None,
            occurred_at: Utc::now(),
        }
    }

    // Checks each event type moves its own two counters, and that the same event id
    // delivered again is reported as already applied and changes nothing.
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
        ] {
            consume.apply(&event(id, t, 2)).await.unwrap();
            consume.apply(&event(id, t, 2)).await.unwrap();
        }
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
                ..StatsDelta::default()
            }
        );
    }
}
