//! Selling from the ledger while the gate (Redis) is down (数据库兜底), and the way back.
//!
//! Every instance probes the gate every [`FOLLOW_INTERVAL`](crate::modes::FOLLOW_INTERVAL)
//! and feeds [`GateHealth`], a pure state machine with hysteresis:
//! - the gate is *down* for this instance once `fallback_after` has passed since the
//!   first failure of a bad spell, and its last probe failed. A spell ends only after
//!   answers without a break for twice `fallback_after`, so a Redis that answers for a
//!   second and then not is down, as a dead one is, while one lost probe is forgotten;
//! - it is *back* once it has answered continuously for `recover_after` (tens of
//!   seconds), so a flapping Redis keeps the products in ledger mode instead of making
//!   them thrash.
//!
//! While the gate is down, the instance reports it to the ledger for every product being
//! bought (its purchases found the gate unreachable) and every product in ledger mode:
//! the ledger switches a product in gate mode (`LedgerMaintenance::enter_ledger_mode`),
//! and stamps the time of the report. The way back is taken by an instance for which the
//! gate is back, and only for a product no instance has reported within `recover_after`
//! (`leave_ledger_mode`): one instance that can reach Redis never gives a product back to
//! a gate another cannot reach. The way back is the advance-and-rebuild of the gate from
//! the ledger's facts. None of this decides a sale: every commit checks the generation
//! and mode in the ledger, whatever an instance believes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flashsale_core::{ProductId, StockMode};
use tracing::{error, info, warn};

use crate::error::Error;
use crate::maintenance::Failures;
use crate::metrics::Metrics;
use crate::modes::{ModeBoard, LEDGER_PRODUCTS_MAX};
use crate::ports::{Leave, ModeSwitch, Ports};

/// How often an instance that cannot reach the gate repeats its report for a product
/// already in ledger mode: often enough to hold the way back off (`recover_after` is tens
/// of seconds), rarely enough to cost the product's row nothing a sale would notice.
pub const REPORT_EVERY: Duration = Duration::from_secs(1);

/// Most switches (either way) one pass makes; the rest wait for the next pass, a
/// quarter of a second later. Each is one short transaction on the product's row.
pub const SWITCHES_PER_PASS_MAX: usize = 64;

/// The two durations of the hysteresis (`FLASHSALE_FALLBACK_AFTER`,
/// `FLASHSALE_FALLBACK_RECOVER_AFTER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FallbackSettings {
    /// How long the gate must stay down before products switch to ledger mode; None:
    /// this instance never switches a product (it still follows and undoes switches).
    pub after: Option<Duration>,
    /// How long the gate must answer, without a break and without any instance
    /// reporting it unreachable, before a product goes back to it.
    pub recover_after: Duration,
}

/// The gate's health as one instance sees it; a pure state machine fed with the probes'
/// results on the monotonic clock.
#[derive(Debug, Clone)]
pub struct GateHealth {
    settings: FallbackSettings,
    /// The first failure of the current bad spell (None: healthy).
    unhealthy_since: Option<Duration>,
    /// The start of the current run of answers (None: the last probe failed).
    answering_since: Option<Duration>,
}

impl GateHealth {
    pub fn new(settings: FallbackSettings) -> Self {
        Self {
            settings,
            unhealthy_since: None,
            answering_since: None,
        }
    }

    /// One probe's result at `now`.
    pub fn heard(&mut self, answered: bool, now: Duration) {
        if answered {
            let since = *self.answering_since.get_or_insert(now);
            // A bad spell ends after answers twice as long as the failures that would
            // have switched: a single lost probe is forgotten, a Redis that keeps
            // dropping out (even for as long as it stays up) is not.
            let spell = self.settings.after.unwrap_or(Duration::ZERO) * 2;
            if now.saturating_sub(since) >= spell {
                self.unhealthy_since = None;
            }
        } else {
            self.answering_since = None;
            self.unhealthy_since.get_or_insert(now);
        }
    }

    /// The gate is down for this instance: products being bought go to ledger mode.
    pub fn down(&self, now: Duration) -> bool {
        match (
            self.settings.after,
            self.unhealthy_since,
            self.answering_since,
        ) {
            (Some(after), Some(since), None) => now.saturating_sub(since) >= after,
            _ => false,
        }
    }

    /// The gate is back for this instance: products may leave ledger mode.
    pub fn back(&self, now: Duration) -> bool {
        self.answering_since
            .is_some_and(|since| now.saturating_sub(since) >= self.settings.recover_after)
    }

    /// For the logs: how long the current bad spell has lasted.
    pub fn down_for(&self, now: Duration) -> Duration {
        self.unhealthy_since
            .map_or(Duration::ZERO, |since| now.saturating_sub(since))
    }

    /// For the logs: how long the gate has answered without a break.
    pub fn answering_for(&self, now: Duration) -> Duration {
        self.answering_since
            .map_or(Duration::ZERO, |since| now.saturating_sub(since))
    }
}

/// The fallback worker's use case: one [`Fallback::pass`] per period.
pub struct Fallback {
    ports: Ports,
    board: Arc<ModeBoard>,
    settings: FallbackSettings,
    state: Mutex<State>,
    metrics: Option<Arc<Metrics>>,
}

struct State {
    health: GateHealth,
    /// Product → when this instance last reported the gate unreachable for it.
    reported: HashMap<ProductId, Duration>,
    /// Products in ledger mode whose gate entry this instance retired (once is enough:
    /// only loading a product never loaded makes an entry vouch again, and a product
    /// in ledger mode counts as loaded).
    retired: std::collections::HashSet<ProductId>,
}

/// What one pass did, for the worker's log and the tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FallbackPass {
    pub gate_answered: bool,
    /// Products this pass switched to ledger mode.
    pub entered: Vec<ProductId>,
    /// Products this pass gave back to the gate (rebuilt, or left for the gate watch).
    pub left: Vec<ProductId>,
}

impl Fallback {
    pub fn new(ports: Ports, board: Arc<ModeBoard>, settings: FallbackSettings) -> Self {
        Self {
            ports,
            board,
            settings,
            state: Mutex::new(State {
                health: GateHealth::new(settings),
                reported: HashMap::new(),
                retired: std::collections::HashSet::new(),
            }),
            metrics: None,
        }
    }

    /// Counts the switches in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the ledger's list of products in ledger mode into the instance's board
    /// (which also tells the purchase path how far to trust the gate: `modes.rs`). The
    /// server runs it every [`FOLLOW_INTERVAL`](crate::modes::FOLLOW_INTERVAL) on its
    /// own, so a gate probe that waits for a hanging Redis never delays it.
    pub async fn follow(&self) -> Result<Vec<ProductId>, Error> {
        let asked_at = self.ports.clock.monotonic();
        let ledger = self
            .ports
            .ledger_m
            .ledger_mode_products(LEDGER_PRODUCTS_MAX)
            .await?;
        self.board.follow(ledger.iter().copied(), asked_at);
        Ok(ledger)
    }

    /// Follows the ledger's list of products in ledger mode, probes the gate, and
    /// switches what the gate's health calls for. A ledger that does not answer ends the
    /// pass (the switches wait for it; the board keeps its last view).
    pub async fn pass(&self) -> Result<FallbackPass, Error> {
        let ledger = self.follow().await?;
        // A set: up to LEDGER_PRODUCTS_MAX products, looked up once per remembered one.
        let in_ledger: std::collections::HashSet<ProductId> = ledger.iter().copied().collect();
        self.state().retired.retain(|p| in_ledger.contains(p));
        let answered = self.ports.gate.ping().await.is_ok();
        let now = self.ports.clock.monotonic();
        let (down, back) = {
            let mut s = self.state();
            s.health.heard(answered, now);
            (s.health.down(now), s.health.back(now))
        };
        let mut pass = FallbackPass {
            gate_answered: answered,
            ..FallbackPass::default()
        };
        if down {
            self.report_down(now, &ledger, &mut pass).await?;
        } else if back && !ledger.is_empty() {
            self.way_back(now, &ledger, &mut pass).await?;
        }
        Ok(pass)
    }

    /// The gate is down: products being bought switch to ledger mode, and products in
    /// it are reported again (at most every [`REPORT_EVERY`]) to hold the way back off.
    async fn report_down(
        &self,
        now: Duration,
        ledger: &[ProductId],
        pass: &mut FallbackPass,
    ) -> Result<(), Error> {
        let due: Vec<ProductId> = {
            let mut s = self.state();
            let in_ledger: std::collections::HashSet<&ProductId> = ledger.iter().collect();
            s.reported.retain(|p, _| in_ledger.contains(p));
            let reported = &s.reported;
            self.board
                .being_bought_unreached(now)
                .into_iter()
                .chain(ledger.iter().copied().filter(|p| {
                    reported
                        .get(p)
                        .is_none_or(|at| now.saturating_sub(*at) >= REPORT_EVERY)
                }))
                .take(SWITCHES_PER_PASS_MAX)
                .collect()
        };
        let down_for = self.state().health.down_for(now);
        for product_id in due {
            match self.ports.ledger_m.enter_ledger_mode(product_id).await? {
                ModeSwitch::Entered { generation } => {
                    warn!(%product_id, %generation, down_for = ?down_for,
                        reason = "Redis unreachable", "switched to ledger mode: the product is sold from MariaDB until Redis is back");
                    if let Some(m) = &self.metrics {
                        m.mode_switched(StockMode::Ledger);
                    }
                    pass.entered.push(product_id);
                }
                ModeSwitch::AlreadyLedger { .. } => {}
            }
            self.board.set(product_id, StockMode::Ledger);
            self.state().reported.insert(product_id, now);
        }
        Ok(())
    }

    /// The gate is back: each product in ledger mode that no instance reported within
    /// `recover_after` goes back to the gate, which is rebuilt from the ledger's facts. A
    /// product that fails is passed over ([`Failures`]), so that one whose key is damaged
    /// cannot keep the products after it in ledger mode.
    async fn way_back(
        &self,
        now: Duration,
        ledger: &[ProductId],
        pass: &mut FallbackPass,
    ) -> Result<(), Error> {
        let answering_for = self.state().health.answering_for(now);
        let mut failures = Failures::default();
        for &product_id in ledger.iter().take(SWITCHES_PER_PASS_MAX) {
            let result = self.come_back(product_id, answering_for, pass).await;
            failures.settle("way back", format_args!("product {product_id}"), result)?;
        }
        failures.end()
    }

    /// One product's way back to the gate: the gate's copy retired, the ledger left
    /// (when no instance reported the product within `recover_after`), the gate rebuilt.
    async fn come_back(
        &self,
        product_id: ProductId,
        answering_for: Duration,
        pass: &mut FallbackPass,
    ) -> Result<(), Error> {
        // First the gate's copy stops vouching for refusals and granting leases: it may be
        // from before the switch, and between the leave below and the rebuild an instance
        // that hears of gate mode would trust it.
        if !self.state().retired.contains(&product_id) {
            self.ports.gate_m.retire(product_id).await?;
            self.state().retired.insert(product_id);
        }
        let plan = match self
            .ports
            .ledger_m
            .leave_ledger_mode(product_id, self.settings.recover_after)
            .await?
        {
            Leave::Left(plan) => plan,
            Leave::NotLedger => {
                self.board.set(product_id, StockMode::Gate);
                return Ok(());
            }
            Leave::TooSoon => return Ok(()),
        };
        self.board.set(product_id, StockMode::Gate);
        if let Some(m) = &self.metrics {
            m.mode_switched(StockMode::Gate);
        }
        pass.left.push(product_id);
        // Crash tests stop here: back in gate mode in the ledger, Redis not rebuilt.
        fail::fail_point!("fallback-after-leave");
        // The product is the gate's again, in a generation the gate does not have yet:
        // its purchases answer 503 until this rebuild (or the gate watch's, if this one
        // fails) puts the plan in place.
        match self.ports.gate_m.rebuild(product_id, &plan).await {
            Ok(applied) => {
                if let (true, Some(m)) = (applied, &self.metrics) {
                    m.gates_rebuilt(1);
                }
                info!(%product_id, generation = %plan.generation, available = plan.available,
                    answering_for = ?answering_for, reason = "Redis answering again",
                    "switched back to gate mode: Redis rebuilt from the ledger's facts");
                Ok(())
            }
            Err(e) => {
                error!(%product_id, generation = %plan.generation, error = %e,
                    "switched back to gate mode but the rebuild failed; the gate watch retries it");
                Err(e.into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AFTER: Duration = Duration::from_secs(3);
    const RECOVER: Duration = Duration::from_secs(30);

    fn health() -> GateHealth {
        GateHealth::new(FallbackSettings {
            after: Some(AFTER),
            recover_after: RECOVER,
        })
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Feeds one probe every 250 ms from `from` to `to` (exclusive), answered or not.
    fn feed(h: &mut GateHealth, from: u64, to: u64, answered: impl Fn(u64) -> bool) {
        let mut t = from;
        while t < to {
            h.heard(answered(t), ms(t));
            t += 250;
        }
    }

    // Checks a dead gate: down exactly FALLBACK_AFTER after the first failure, not before;
    // back only after RECOVER_AFTER of answers without a break.
    #[test]
    fn a_dead_gate_is_down_after_the_delay_and_back_after_the_long_one() {
        let mut h = health();
        feed(&mut h, 0, 10_000, |_| true);
        assert!(!h.down(ms(10_000)));
        feed(&mut h, 10_000, 12_750, |_| false);
        assert!(!h.down(ms(12_750)), "2.75 s of failures");
        h.heard(false, ms(13_000));
        assert!(h.down(ms(13_000)));
        assert!(!h.back(ms(13_000)));
        feed(&mut h, 20_000, 49_999, |_| true);
        assert!(!h.down(ms(49_999)));
        assert!(!h.back(ms(49_750)), "29.75 s of answers");
        h.heard(true, ms(50_000));
        assert!(h.back(ms(50_000)));
    }

    // Checks a gate that answers one second and not the next: down after FALLBACK_AFTER
    // (its short answers do not end the bad spell), never back while it flaps, and back
    // RECOVER_AFTER after it settles.
    #[test]
    fn a_flapping_gate_is_down_and_never_back_while_it_flaps() {
        let mut h = health();
        let flap = |t: u64| (t / 1000).is_multiple_of(2);
        let mut was_down = false;
        let mut t = 0;
        while t < 20_000 {
            h.heard(flap(t), ms(t));
            was_down |= h.down(ms(t));
            assert!(!h.back(ms(t)), "back at {t} ms");
            t += 250;
        }
        assert!(was_down);
        feed(&mut h, 20_000, 50_000, |_| true);
        assert!(!h.back(ms(49_750)));
        h.heard(true, ms(50_000));
        assert!(h.back(ms(50_000)));
    }

    // Checks a single lost probe is forgotten: no switch however long the gate answers
    // afterwards, and a second blip later starts a new spell.
    #[test]
    fn one_lost_probe_is_forgotten() {
        let mut h = health();
        h.heard(false, ms(0));
        feed(&mut h, 250, 10_000, |_| true);
        assert!(!h.down(ms(10_000)));
        h.heard(false, ms(10_000));
        assert!(!h.down(ms(10_000)));
        assert_eq!(h.down_for(ms(10_000)), Duration::ZERO);
    }

    // Checks `off`: never down, however long the gate fails; back still works, so a
    // product another instance switched is given back.
    #[test]
    fn off_never_switches_but_comes_back() {
        let mut h = GateHealth::new(FallbackSettings {
            after: None,
            recover_after: RECOVER,
        });
        feed(&mut h, 0, 60_000, |_| false);
        assert!(!h.down(ms(60_000)));
        feed(&mut h, 60_000, 90_001, |_| true);
        assert!(h.back(ms(90_000)));
    }
}
