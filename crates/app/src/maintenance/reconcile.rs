//! Reconciliation: each product's available count in the gate against what the ledger's
//! facts and the holds in flight imply, and the repair of a drift, during a live sale too.
//!
//! A look reads the ledger's facts, then the gate's count (the count, its generation and
//! the last hold id in one atomic read) and its hold records. The look is not one atomic
//! read of both stores, so work between its reads can look like drift for a moment. A
//! drift is repaired only when a second look, [`REPAIR_SETTLE`] later, found exactly the
//! same: the same count, generation and last hold id in the gate (no hold taken, nothing
//! given back or added in between: every such step moves the count or the hold id), the
//! same units in flight and the same drift. The repair then moves the count relatively,
//! and only while the gate is still exactly as the second look read it (`adjust.lua`), so
//! nothing between the look and the repair can be overwritten or counted twice. Each
//! repair is recorded in the ledger with the facts it was computed from, and counted.

use std::time::Duration;

use flashsale_core::{Generation, ProductId, StockMode};
use tracing::{error, info, warn};

use super::{Maintenance, Walk};
use crate::error::Error;
use crate::ports::{GateCount, StockRepair};

/// The pause between the two looks of a repair: long enough for a purchase's hold to
/// reach the ledger or be given back (milliseconds), so that a difference that is only
/// work between one look's reads is gone, or has moved, at the second.
pub const REPAIR_SETTLE: Duration = Duration::from_millis(500);

/// Units one pass of the reconciliation worker repairs at most, over every product: a
/// drift larger than this is repaired over several passes, so a look gone wrong in a
/// way no check caught moves the counts by no more before a person sees the log and
/// the metric.
pub const REPAIR_UNITS_PER_PASS: i64 = 100;

/// How much a reconciliation pass may repair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repair {
    /// Report the drift only.
    Off,
    /// Repair at most this many units over the whole pass (a larger drift is repaired
    /// over several passes: a wrong look repairs little before a person sees it).
    UpTo(i64),
}

/// What reconciliation found for one product.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reconciliation {
    pub product_id: ProductId,
    pub redis_available: Option<i64>,
    /// The stock generation Redis's count was read in (None without an entry).
    pub redis_generation: Option<Generation>,
    /// The last hold id the gate had handed out when its count was read.
    pub last_hold_id: i64,
    /// What Redis's available count should be given the ledger's facts and the holds
    /// still in flight.
    pub expected_available: i64,
    /// `redis_available - expected_available` (0 when consistent).
    pub drift: i64,
    /// Units taken by holds the ledger does not (yet) account for.
    pub in_flight_units: i64,
    /// Units of live orders (pending payment or paid) in the ledger.
    pub live_units: i64,
    /// The stock, in the ledger.
    pub total: i64,
    /// Whether a repair was applied.
    pub repaired: bool,
}

impl Reconciliation {
    /// Whether `other`, a later look, found the gate and the drift exactly as this one.
    fn same_as(&self, other: &Reconciliation) -> bool {
        self.redis_available == other.redis_available
            && self.redis_generation == other.redis_generation
            && self.last_hold_id == other.last_hold_id
            && self.in_flight_units == other.in_flight_units
            && self.drift == other.drift
    }

    fn count(&self) -> Option<GateCount> {
        Some(GateCount {
            generation: self.redis_generation?,
            available: self.redis_available?,
            last_hold_id: self.last_hold_id,
        })
    }
}

impl Maintenance {
    /// Compares Redis's available count with what the ledger's facts imply, counting
    /// holds still in flight; with `repair`, repairs a drift as the module's doc says
    /// (two looks `settle` apart), however large.
    pub async fn reconcile(
        &self,
        product_id: ProductId,
        repair: bool,
        settle: Duration,
    ) -> Result<Reconciliation, Error> {
        let mut budget = if repair { i64::MAX } else { 0 };
        self.reconcile_within(product_id, &mut budget, settle).await
    }

    /// [`reconcile`](Self::reconcile), repairing at most `budget` units (what is repaired
    /// is taken from it).
    async fn reconcile_within(
        &self,
        product_id: ProductId,
        budget: &mut i64,
        settle: Duration,
    ) -> Result<Reconciliation, Error> {
        let first = self.measure(product_id).await?;
        if *budget <= 0 || first.drift == 0 {
            return Ok(first);
        }
        // None in the simulator, whose tasks interleave at every store call between the
        // two looks, and whose scheduler drives no wall-clock timer.
        if !settle.is_zero() {
            tokio::time::sleep(settle).await;
        }
        let second = self.measure(product_id).await?;
        if !first.same_as(&second) {
            info!(%product_id, first = first.drift, second = second.drift, "drift still moving; not repairing");
            return Ok(second);
        }
        let Some(count) = second.count() else {
            debug_assert!(false, "a drift is measured against a count the gate has");
            return Ok(second);
        };
        let delta = (-second.drift).clamp(-*budget, *budget);
        let repaired = self.gate_m.adjust(product_id, &count, delta).await?;
        if repaired {
            *budget -= delta.abs();
            self.record_repair(&second, &count, delta).await;
        }
        Ok(Reconciliation { repaired, ..second })
    }

    /// Records a repair in the ledger and the metrics. The repair is done whatever
    /// becomes of its record, so a record that fails is logged, not retried.
    async fn record_repair(&self, found: &Reconciliation, count: &GateCount, delta: i64) {
        warn!(product_id = %found.product_id, drift = found.drift, delta,
            "reconciliation repaired Redis's available count");
        if let Some(m) = &self.metrics {
            m.stock_repaired(delta);
        }
        let repair = StockRepair {
            product_id: found.product_id,
            generation: count.generation,
            redis_before: count.available,
            redis_after: count.available + delta,
            expected: found.expected_available,
            total: found.total,
            live_units: found.live_units,
            in_flight_units: found.in_flight_units,
            reason: if delta.abs() < found.drift.abs() {
                "drift seen twice, repaired in part (the pass's bound)"
            } else {
                "drift seen twice, unchanged in between"
            },
        };
        if let Err(e) = self.ledger_m.record_repair(&repair).await {
            error!(product_id = %found.product_id, error = %e, "a repair was made but its record failed");
        }
    }

    /// One reconciliation pass over every loaded product: reports every drift, and
    /// repairs what `repair` allows. Returns the drifts found.
    pub async fn reconcile_all(
        &self,
        repair: Repair,
        settle: Duration,
    ) -> Result<Vec<Reconciliation>, Error> {
        let mut budget = match repair {
            Repair::Off => 0,
            Repair::UpTo(units) => units.max(0),
        };
        let mut drifted = Vec::new();
        let mut walk = Walk::default();
        while let Some(page) = self.next_page(&mut walk).await? {
            for product_id in page {
                let result = self.reconcile_within(product_id, &mut budget, settle).await;
                let Some(r) = walk.settle(product_id, "reconciliation", result)? else {
                    continue;
                };
                if r.drift != 0 {
                    warn!(%product_id, drift = r.drift, repaired = r.repaired,
                        redis = ?r.redis_available, expected = r.expected_available,
                        "reconciliation found drift");
                    drifted.push(r);
                }
            }
        }
        walk.end().map(|()| drifted)
    }

    async fn measure(&self, product_id: ProductId) -> Result<Reconciliation, Error> {
        let ledger = self
            .ledger_m
            .facts(product_id)
            .await?
            .ok_or(Error::ProductNotFound)?;
        let live_units: i64 = ledger.live.values().map(|(_, units)| units).sum();
        if ledger.mode == StockMode::Ledger {
            // The ledger serves the stock; the gate is rebuilt from it on the way back.
            return Ok(Reconciliation {
                product_id,
                redis_available: None,
                redis_generation: None,
                last_hold_id: 0,
                expected_available: ledger.counters.available,
                drift: 0,
                in_flight_units: 0,
                live_units,
                total: ledger.counters.total,
                repaired: false,
            });
        }
        let gate = self.gate_m.facts(product_id).await?;
        // Units Redis counts as taken that no live reservation accounts for: attempts
        // between Redis and the commit, orphans and releases not yet returned — each is
        // resolved by the purchase path or recovery, so they are not drift.
        let in_flight_units: i64 = gate
            .held
            .iter()
            .filter(|(request_id, (hold, _))| {
                ledger.live.get(*request_id).map(|(h, _)| h) != Some(hold)
            })
            .map(|(_, (_, units))| units)
            .sum();
        let expected = ledger.counters.total - live_units - in_flight_units;
        // A pending destock the gate took is not in the ledger's counters yet: its units
        // look like drift, and repairing them would put them back on sale. Measured as
        // none until the destock settles (its request, or the workers' next pass).
        let drift = match gate.available {
            Some(a) if ledger.pending_destocks.is_empty() => a - expected,
            _ => 0,
        };
        Ok(Reconciliation {
            product_id,
            redis_available: gate.available,
            redis_generation: gate.generation,
            last_hold_id: gate.last_hold_id,
            expected_available: expected,
            drift,
            in_flight_units,
            live_units,
            total: ledger.counters.total,
            repaired: false,
        })
    }
}
