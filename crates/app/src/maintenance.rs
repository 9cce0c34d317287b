//! The background workers and the operator's checks, each a reconciler: it takes no
//! input, looks at the stores and moves them one bounded step toward the desired state,
//! and is safe to run concurrently on several instances (every step is a conditional
//! UPDATE, a unique key, or an idempotent gate script). None reads the instance's clock:
//! holds age on Redis's clock, payment deadlines pass on MariaDB's, so one instance with
//! a wrong clock can release nothing early.
//!
//! - [`Maintenance::expire_once`]: unpaid orders past their deadline become CANCELLED
//!   (payment_timeout) and their units go back.
//! - [`Maintenance::recover_once`]: holds left without an order after the recovery window
//!   are fenced in the ledger and given back; released reservations whose units did not
//!   make it back are given back.
//! - [`Maintenance::audit`] and [`Maintenance::reconcile`]: compare the stores.
//! - [`Maintenance::scheduled_audits_once`] (`schedule.rs`): the audits `serve` runs by
//!   itself, once each over all instances.
//! - [`Maintenance::resolve_incident`] (`incidents.rs`): a person's decision on what
//!   recovery could not learn.

mod incidents;
mod reconcile;
mod schedule;

pub use incidents::{Decision, IncidentView, Resolved, Unresolved, OUTCOME_UNKNOWN};
pub use reconcile::{Reconciliation, Repair, REPAIR_SETTLE, REPAIR_UNITS_PER_PASS};
pub use schedule::{AuditScheduleSettings, ScheduledAudits, AUDIT_CLAIM_LEASE};

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use flashsale_core::{ProductId, ReleaseReason, RequestId, StockMode};
use tracing::{debug, error, info, warn};

use crate::audit::{self, AuditBounds, AuditReport};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::model::{PurchaseOutcome, PurchaseRecord};
use crate::ports::{
    Fence, GateFacts, GateMaintenance, IncidentKind, Ledger, LedgerError, LedgerMaintenance,
    NewIncident, Ports, Release, ReleaseOf, Restock, StaleHold, StockGate,
};
use crate::service::{give_back, GiveBack};

/// Tries recovery makes on one hold whose outcome it cannot learn (the ledger does not
/// answer) before it records an incident and tells an operator: a few passes ride out a
/// restart of the database, more would only hide a real problem.
pub const RECOVERY_TRIES_MAX: u32 = 5;
/// Most holds whose failed tries are remembered; past it the memory starts over (tries
/// then count again from zero, which only delays an incident).
const TRACKED_HOLDS_MAX: usize = 10_000;

#[derive(Debug, Clone)]
pub struct MaintenanceSettings {
    /// How old a hold without an order must be before recovery fences and releases it:
    /// well past the request deadline, so the attempt that took it has surely ended.
    pub recovery_after: Duration,
    /// Most items one pass of a worker handles (per product for holds).
    pub batch_size: usize,
    /// Most products read from the ledger at once while a pass walks them: keyset pages,
    /// so a pass reaches every loaded product however many there are, in bounded memory.
    pub products_page: usize,
    /// How long work in flight may take before the audit calls it stuck.
    pub audit_bounds: AuditBounds,
    /// An order's payment window: what a hold confirmed by a person's decision gets, as
    /// the purchase it stands for would have.
    pub payment_timeout: Duration,
}

/// Pause before the audit's second look at a product whose first look found a
/// cross-store difference: the cancels and restocks that fall between one look's reads
/// finish both their steps within milliseconds, so a difference they faked is gone a
/// second later, while a real one is still the same. Paid only by products whose first
/// look found such a difference.
pub const AUDIT_SECOND_LOOK_AFTER: Duration = Duration::from_secs(1);

/// Failures in a row, one item (a product, an order) after another, that end a pass: a
/// store that is down fails every item, and the pass stops instead of waiting out each
/// one's timeout; an item that fails alone (a damaged key, rows that disagree) is logged
/// and passed over, so it cannot keep the items after it from being looked after.
const FAILURES_IN_A_ROW_MAX: u32 = 3;

/// A pass's failures, item by item ([`FAILURES_IN_A_ROW_MAX`]): the products of the
/// maintenance walks and of the way back from ledger mode, the orders of an expiry pass.
#[derive(Default)]
pub(crate) struct Failures {
    /// The first failure passed over, reported when the pass ends.
    first: Option<Error>,
    in_a_row: u32,
}

impl Failures {
    /// Takes one item's result: its value, or None for a failure passed over (logged;
    /// the pass goes on and ends with the first failure), or the failure itself once
    /// [`FAILURES_IN_A_ROW_MAX`] items in a row failed (a store is down: the pass ends
    /// now).
    pub(crate) fn settle<T, E: Into<Error>>(
        &mut self,
        pass: &'static str,
        item: impl std::fmt::Display,
        result: Result<T, E>,
    ) -> Result<Option<T>, Error> {
        match result {
            Ok(value) => {
                self.in_a_row = 0;
                Ok(Some(value))
            }
            Err(e) => {
                let e = e.into();
                self.in_a_row += 1;
                if self.in_a_row >= FAILURES_IN_A_ROW_MAX {
                    return Err(e);
                }
                warn!(pass, %item, error = %e, "passed over this pass; tried again next pass");
                self.first.get_or_insert(e);
                Ok(None)
            }
        }
    }

    /// How the pass ended: with the first failure it passed over, if any.
    pub(crate) fn end(self) -> Result<(), Error> {
        self.first.map_or(Ok(()), Err)
    }
}

/// Where one pass's walk over the loaded products is.
#[derive(Default)]
struct Walk {
    /// The last product of the last page read (None: start from the first).
    after: Option<ProductId>,
    /// The last page was short: no product is left.
    done: bool,
    failures: Failures,
}

pub struct Maintenance {
    gate: Arc<dyn StockGate>,
    gate_m: Arc<dyn GateMaintenance>,
    ledger: Arc<dyn Ledger>,
    ledger_m: Arc<dyn LedgerMaintenance>,
    settings: MaintenanceSettings,
    tries: Mutex<HashMap<RequestId, u32>>,
    /// Where what the workers do is counted, as it happens (a pass that fails half-way
    /// still counts what it did).
    metrics: Option<Arc<Metrics>>,
}

/// What one recovery pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Stale index entries whose order exists: the index was trimmed.
    pub aligned: usize,
    /// Holds with no order: fenced in the ledger and given back.
    pub released: usize,
    /// Holds the ledger did not account for (a replaced or duplicate hold): given back.
    pub orphans_released: usize,
    /// Released reservations whose units were given back now.
    pub returns_completed: usize,
    /// Restocks whose units reached the gate now.
    pub restocks_completed: usize,
    /// Items left for a later pass (a store did not answer).
    pub deferred: usize,
    /// Incidents recorded for an operator.
    pub incidents: usize,
}

impl Maintenance {
    /// The maintenance over `ports` (it reads time from the ledger, not the clock).
    pub fn new(ports: Ports, settings: MaintenanceSettings) -> Self {
        let Ports {
            gate,
            gate_m,
            ledger,
            ledger_m,
            ..
        } = ports;
        Self {
            gate,
            gate_m,
            ledger,
            ledger_m,
            settings,
            tries: Mutex::new(HashMap::new()),
            metrics: None,
        }
    }

    /// Counts the orders expired, the recoveries and the gate rebuilds in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Cancels unpaid orders past their deadline (on the database's clock) and returns
    /// their units. Returns how many orders it cancelled; an order whose cancellation
    /// failed is passed over ([`Failures`]), so it cannot hold back the orders due after
    /// it (they come oldest first).
    pub async fn expire_once(&self) -> Result<usize, Error> {
        let mut expired = 0;
        let result = self.expire_into(&mut expired).await;
        if let Some(m) = &self.metrics {
            m.orders_expired(expired);
        }
        if expired > 0 {
            info!(orders = expired, "orders expired unpaid; cancelled");
        }
        result.map(|()| expired)
    }

    async fn expire_into(&self, expired: &mut usize) -> Result<(), Error> {
        let due = self
            .ledger_m
            .expired_orders(self.settings.batch_size)
            .await?;
        let mut failures = Failures::default();
        for order in &due {
            let result = self.ledger_m.expire(order).await;
            let Some(Some(attempt)) =
                failures.settle("expiry", format_args!("order {}", order.order_id), result)?
            else {
                continue;
            };
            if attempt.applied {
                *expired += 1;
                // Per order, debug detail: a sale expires thousands; the pass counts them.
                debug!(order_id = %order.order_id, request_id = %attempt.order.request_id, "order expired unpaid; cancelled");
            }
            if let Some(of) = attempt.pending_return {
                give_back(
                    self.gate.as_ref(),
                    self.ledger.as_ref(),
                    attempt.order.product_id,
                    &attempt.order.request_id,
                    &of,
                )
                .await;
            }
        }
        failures.end()
    }

    /// One recovery pass: pending returns and restocks, then the stale holds of every
    /// loaded product.
    pub async fn recover_once(&self) -> Result<RecoveryReport, Error> {
        let mut report = RecoveryReport::default();
        let result = self.recover_into(&mut report).await;
        if let Some(m) = &self.metrics {
            m.recovered(&report);
        }
        if report != RecoveryReport::default() {
            info!(?report, "recovery pass");
        }
        result.map(|()| report)
    }

    async fn recover_into(&self, report: &mut RecoveryReport) -> Result<(), Error> {
        self.finish_returns(report).await?;
        self.finish_restocks(report).await?;
        let mut walk = Walk::default();
        while let Some(page) = self.next_page(&mut walk).await? {
            for product_id in page {
                let result = self.recover_product(product_id, report).await;
                walk.settle(product_id, "recovery", result)?;
            }
        }
        walk.end()
    }

    /// Recovery, released reservations whose units did not make it back to the gate.
    async fn finish_returns(&self, report: &mut RecoveryReport) -> Result<(), Error> {
        // Released reservations whose units did not make it back.
        for pending in self
            .ledger_m
            .pending_returns(self.settings.batch_size)
            .await?
        {
            match give_back(
                self.gate.as_ref(),
                self.ledger.as_ref(),
                pending.product_id,
                &pending.request_id,
                &pending.of,
            )
            .await
            {
                GiveBack::Done => {
                    report.returns_completed += 1;
                    self.forget_tries(&pending.request_id).await;
                }
                GiveBack::Later => report.deferred += 1,
                // No record of the hold: Redis lost it, and the gate watch is about to
                // rebuild (after which the release finds nothing to add), or it truly is
                // gone. Tried again; raised to an operator only if it stays so.
                GiveBack::Impossible => {
                    let unknown = NewIncident {
                        request_id: pending.request_id.clone(),
                        product_id: pending.product_id,
                        kind: IncidentKind::ReturnImpossible,
                        detail: "reservation released but Redis has no hold record to \
                                 release; reconciliation must account for its units"
                            .into(),
                    };
                    self.unknown(unknown, report).await
                }
            }
        }
        Ok(())
    }

    /// Recovery, restocks recorded in the ledger whose gate step failed.
    async fn finish_restocks(&self, report: &mut RecoveryReport) -> Result<(), Error> {
        // Restocks recorded in the ledger whose gate step failed: the admin may never
        // retry, so recovery finishes them (the gate's marker makes it once).
        for pending in self
            .ledger_m
            .pending_restocks(self.settings.batch_size)
            .await?
        {
            let applied = self.gate.restock(&pending).await;
            match applied {
                // Stale: a rebuild since the restock was recorded counted it already.
                Ok(Restock::Applied | Restock::AlreadyApplied | Restock::Stale) => {
                    match self.ledger.mark_restock_applied(&pending.id).await {
                        Ok(()) => report.restocks_completed += 1,
                        Err(_) => report.deferred += 1,
                    }
                }
                Ok(Restock::NotLoaded) | Err(_) => report.deferred += 1,
            }
        }
        Ok(())
    }

    async fn recover_product(
        &self,
        product_id: ProductId,
        report: &mut RecoveryReport,
    ) -> Result<(), Error> {
        let stale = self
            .gate_m
            .stale_holds(
                product_id,
                self.settings.recovery_after,
                self.settings.batch_size,
            )
            .await?;
        let mut aligned = Vec::new();
        for hold in stale {
            self.recover_hold(product_id, hold, &mut aligned, report)
                .await;
        }
        if !aligned.is_empty() {
            self.gate_m.forget_pending(product_id, &aligned).await?;
        }
        // Counted once trimmed: a failed trim is tried (and counted) again next pass.
        report.aligned += aligned.len();

        Ok(())
    }

    /// One stale hold, step by step: the ledger's record of its request_id (or, with none,
    /// a fence of the hold), then what that record says of the hold. A step that cannot
    /// learn the outcome leaves it unknown, tried again next pass: never a guess.
    async fn recover_hold(
        &self,
        product_id: ProductId,
        hold: StaleHold,
        aligned: &mut Vec<StaleHold>,
        report: &mut RecoveryReport,
    ) {
        if hold.released {
            aligned.push(hold);
            return;
        }
        let request_id = hold.request.request_id.clone();
        let record = match self.record_or_fence(&hold).await {
            Ok(Some(record)) => record,
            Ok(None) => {
                warn!(%request_id, %product_id, hold_id = %hold.hold.id, "abandoned hold fenced; returning its units");
                self.return_fenced(product_id, &hold, report).await;
                self.forget_tries(&request_id).await;
                return;
            }
            Err(e) => {
                let unknown = NewIncident {
                    request_id,
                    product_id,
                    kind: IncidentKind::OutcomeUnknown,
                    detail: e.to_string(),
                };
                return self.unknown(unknown, report).await;
            }
        };
        self.forget_tries(&request_id).await;
        if record.is_hold(product_id, hold.hold) {
            match record.outcome {
                // The order accounts for this hold: only the index entry was left.
                PurchaseOutcome::Order(_) => aligned.push(hold),
                // A fence of this very hold: its return is pending_returns' job.
                PurchaseOutcome::Released { .. } => report.deferred += 1,
            }
            return;
        }
        // The ledger holds the request_id for another hold: this one can never become an
        // order.
        self.release_orphan(product_id, &hold, report).await;
    }

    /// The ledger's record of the hold's request_id. With none, the hold is fenced so
    /// that a late commit of it can no longer create an order: None once fenced, or the
    /// record such a commit wrote meanwhile.
    async fn record_or_fence(
        &self,
        hold: &StaleHold,
    ) -> Result<Option<PurchaseRecord>, LedgerError> {
        // A ledger that will not tell, for the holds whose request_id starts with the
        // failpoint's argument (`recovery-lookup=return(PREFIX)`): the tests' way to keep
        // one hold's outcome unknown past every try without stopping the ledger.
        #[cfg(feature = "failpoints")]
        if let Some(Some(prefix)) = fail::eval("recovery-lookup", |arg| arg) {
            if hold.request.request_id.as_str().starts_with(&prefix) {
                return Err(LedgerError::unreachable("failpoint recovery-lookup"));
            }
        }
        if let Some(record) = self.ledger.find_purchase(&hold.request.request_id).await? {
            return Ok(Some(record));
        }
        let fence = self
            .ledger
            .fence(&hold.request, hold.hold, ReleaseReason::Abandoned)
            .await?;
        Ok(match fence {
            Fence::Fenced => None,
            Fence::Duplicate(record) => Some(record),
        })
    }

    /// Gives a freshly fenced hold's units back; where that cannot finish now, the fence
    /// is durable and `pending_returns` finishes it.
    async fn return_fenced(
        &self,
        product_id: ProductId,
        hold: &StaleHold,
        report: &mut RecoveryReport,
    ) {
        let of = ReleaseOf::Hold { hold: hold.hold };
        let request_id = &hold.request.request_id;
        match give_back(
            self.gate.as_ref(),
            self.ledger.as_ref(),
            product_id,
            request_id,
            &of,
        )
        .await
        {
            GiveBack::Done => report.released += 1,
            GiveBack::Later | GiveBack::Impossible => report.deferred += 1,
        }
    }

    /// Releases a hold whose request_id the ledger holds for another hold.
    async fn release_orphan(
        &self,
        product_id: ProductId,
        hold: &StaleHold,
        report: &mut RecoveryReport,
    ) {
        let request_id = &hold.request.request_id;
        let of = ReleaseOf::Hold { hold: hold.hold };
        match self.gate.release(product_id, request_id, &of).await {
            Ok(Release::Released | Release::AlreadyReleased) => {
                warn!(%request_id, %product_id, hold_id = %hold.hold.id, "orphan hold released");
                report.orphans_released += 1;
            }
            Ok(outcome) => {
                error!(%request_id, ?outcome, "orphan hold could not be released");
                report.deferred += 1;
            }
            Err(e) => {
                warn!(%request_id, error = %e, "orphan hold release deferred");
                report.deferred += 1;
            }
        }
    }

    /// The outcome of a hold can't be learned now: try again next pass; after
    /// [`RECOVERY_TRIES_MAX`] passes, raise it to an operator. Never guess.
    async fn unknown(&self, unknown: NewIncident, report: &mut RecoveryReport) {
        let request_id = &unknown.request_id;
        let tries = {
            let mut tries = lock(&self.tries);
            if tries.len() >= TRACKED_HOLDS_MAX && !tries.contains_key(request_id) {
                tries.clear();
            }
            let n = tries.entry(request_id.clone()).or_insert(0);
            *n += 1;
            *n
        };
        report.deferred += 1;
        if tries >= RECOVERY_TRIES_MAX {
            let detail = format!("still so after {tries} tries: {}", unknown.detail);
            self.incident(NewIncident { detail, ..unknown }, report)
                .await;
        } else {
            let cause = &unknown.detail;
            warn!(%request_id, tries, cause, "hold outcome unknown; retrying next pass");
        }
    }

    async fn incident(&self, incident: NewIncident, report: &mut RecoveryReport) {
        let NewIncident {
            request_id,
            product_id,
            kind,
            detail,
        } = &incident;
        let kind = kind.as_str();
        error!(%request_id, %product_id, kind, detail, "RECOVERY INCIDENT: needs an operator");
        report.incidents += 1;
        if let Err(e) = self.ledger_m.record_incident(&incident).await {
            error!(%request_id, error = %e, "could not record the incident in the ledger");
        }
    }

    /// The hold's outcome is known now: forget its failed tries and close any incident
    /// raised about it while it was not — by any instance, so whether this one counted
    /// tries does not matter (another instance, or this one before a restart, may have
    /// raised it). Resolutions are rare (abandoned holds, returns that failed), so the
    /// UPDATE costs little.
    async fn forget_tries(&self, request_id: &RequestId) {
        lock(&self.tries).remove(request_id);
        if let Err(e) = self.ledger_m.resolve_incidents(request_id).await {
            warn!(%request_id, error = %e, "could not close the request's incidents");
        }
    }

    /// Looks for products whose gate state was lost — Redis came back empty, or from a
    /// copy (it restarted from a snapshot or failed over to a replica: the entry was
    /// written by another Redis process, so any write acknowledged after the copy may be
    /// gone, a release as much as a hold), or behind (its last hold id is below one the
    /// ledger recorded) — and rebuilds them from the ledger's facts. Returns how many it
    /// rebuilt.
    pub async fn watch_once(&self) -> Result<usize, Error> {
        let mut rebuilt = 0;
        let mut walk = Walk::default();
        while let Some(page) = self.next_page(&mut walk).await? {
            for product_id in page {
                let result = self.watch_product(product_id).await;
                if walk.settle(product_id, "gate watch", result)? == Some(true) {
                    rebuilt += 1;
                }
            }
        }
        walk.end().map(|()| rebuilt)
    }

    /// Rebuilds one product's gate state if it was lost; whether it rebuilt.
    async fn watch_product(&self, product_id: ProductId) -> Result<bool, Error> {
        let Some(mark) = self.ledger_m.watermark(product_id).await? else {
            return Ok(false);
        };
        if mark.mode == StockMode::Ledger {
            // The ledger serves the stock and the gate is behind on purpose: it is
            // rebuilt when the product leaves ledger mode, from that plan. A rebuild now
            // would put the gate in the mode's generation, where its hold ids could meet
            // the ledger's own.
            return Ok(false);
        }
        let state = self.gate_m.state(product_id).await?;
        // An entry another Redis process wrote is adopted when the gate proves it was
        // migrated whole (a cluster's slot moved live); then it is checked as any other.
        let adopted = match state {
            Some(s) if s.server_changed => self.gate_m.adopt(product_id).await?,
            _ => false,
        };
        if adopted {
            info!(%product_id, "stock entry migrated whole to another Redis primary: adopted, not rebuilt");
        }
        let lost = match state {
            None => Some("stock entry missing"),
            Some(s) if s.server_changed && !adopted => {
                Some("Redis restarted or failed over since the entry was written")
            }
            Some(s) if s.generation < mark.generation => Some("older generation"),
            Some(s) if s.generation == mark.generation && s.last_hold_id < mark.last_hold_id => {
                Some("behind the ledger's last hold")
            }
            Some(s) if s.generation > mark.generation => {
                error!(%product_id, gate = %s.generation, ledger = %mark.generation,
                    "gate is at a newer generation than the ledger; was the database restored?");
                None
            }
            Some(_) => None,
        };
        let Some(why) = lost else {
            return Ok(false);
        };
        warn!(%product_id, why, "gate lost state; sales of the product pause until it is rebuilt");
        self.rebuild(product_id).await
    }

    /// Rebuilds one product's gate state from the ledger in a new generation: holds of
    /// older generations can no longer commit, so nothing taken against the lost state
    /// becomes an order.
    pub async fn rebuild(&self, product_id: ProductId) -> Result<bool, Error> {
        let Some(plan) = self.ledger_m.advance_generation(product_id).await? else {
            info!(%product_id, "not rebuilt: the product went to ledger mode, or its ended sale was retired, meanwhile");
            return Ok(false);
        };
        let applied = self.gate_m.rebuild(product_id, &plan).await?;
        if let (true, Some(m)) = (applied, &self.metrics) {
            m.gates_rebuilt(1);
        }
        warn!(%product_id, generation = %plan.generation, available = plan.available, applied,
            "gate rebuilt from the ledger's facts; sales resume");
        Ok(applied)
    }

    /// Records an audit run's verdict in the ledger, where the live sale page reads the
    /// last one (`flashsale audit` calls it once its products are all checked).
    pub async fn record_audit(&self, verdict: &crate::ports::AuditVerdict) -> Result<(), Error> {
        Ok(self.ledger_m.record_audit(verdict).await?)
    }

    /// Checks a product's stores against the invariants, during a sale too: work in
    /// flight within its bound is reported as pending ([`audit::check`]). A finding that
    /// compares reads made at different moments (`cross_store`) is kept only if a second
    /// look [`AUDIT_SECOND_LOOK_AFTER`] later finds it again, identical (the same counts,
    /// the same holds): a cancel or a restock between one look's reads fakes one that is
    /// gone by the next look, a real one stays. One not found again is reported as
    /// pending. The price: while purchases keep changing the counts, a real drift is
    /// pending too, until a quiet moment (the reconciliation worker logs it meanwhile).
    pub async fn audit(&self, product_id: ProductId) -> Result<AuditReport, Error> {
        let first = self.look(product_id).await?;
        if !first.violations.iter().any(|v| v.cross_store) {
            return Ok(first);
        }
        tokio::time::sleep(AUDIT_SECOND_LOOK_AFTER).await;
        let mut second = self.look(product_id).await?;
        let (kept, moved): (Vec<_>, Vec<_>) = std::mem::take(&mut second.violations)
            .into_iter()
            .partition(|v| !v.cross_store || first.violations.contains(v));
        second.violations = kept;
        second.pending.extend(moved.into_iter().map(|mut v| {
            v.message
                .push_str(" (not in the look before: work in flight)");
            v
        }));
        Ok(second)
    }

    /// One look at both stores. Redis first, then the ledger: a hold Redis's look saw in
    /// flight that committed since is in the ledger's facts, and one taken since is told
    /// apart by its hold id (`GateFacts::last_hold_id`).
    /// In ledger mode the gate is not compared, so a gate that does not answer (Redis is
    /// down: why the product is in ledger mode) does not stop the audit.
    async fn look(&self, product_id: ProductId) -> Result<AuditReport, Error> {
        let (gate, ledger) = match self.gate_m.facts(product_id).await {
            Ok(gate) => (gate, self.ledger_m.facts(product_id).await?),
            Err(e) => match self.ledger_m.facts(product_id).await? {
                Some(ledger) if ledger.mode == StockMode::Ledger => {
                    (GateFacts::default(), Some(ledger))
                }
                _ => return Err(e.into()),
            },
        };
        let ledger = ledger.ok_or(Error::ProductNotFound)?;
        Ok(audit::check(
            product_id.get(),
            &gate,
            &ledger,
            &self.settings.audit_bounds,
        ))
    }

    /// Products the workers and audit look after: every product whose stock was loaded.
    pub async fn products(&self) -> Result<Vec<ProductId>, Error> {
        let mut walk = Walk::default();
        let mut all = Vec::new();
        while let Some(page) = self.next_page(&mut walk).await? {
            all.extend(page);
        }
        Ok(all)
    }

    /// The walk's next page of loaded products (ascending ids), None past the last one.
    async fn next_page(&self, walk: &mut Walk) -> Result<Option<Vec<ProductId>>, Error> {
        if walk.done {
            return Ok(None);
        }
        let want = self.settings.products_page.max(1);
        let page = self.ledger_m.loaded_products(walk.after, want).await?;
        walk.done = page.len() < want;
        // Ids only grow from page to page, so the walk ends.
        walk.after = page.last().copied().or(walk.after);
        Ok((!page.is_empty()).then_some(page))
    }
}

impl Walk {
    /// One product's result ([`Failures::settle`]).
    fn settle<T>(
        &mut self,
        product_id: ProductId,
        pass: &'static str,
        result: Result<T, Error>,
    ) -> Result<Option<T>, Error> {
        self.failures
            .settle(pass, format_args!("product {product_id}"), result)
    }

    /// How the pass ended ([`Failures::end`]).
    fn end(self) -> Result<(), Error> {
        self.failures.end()
    }
}

/// The mutex's value, even if a thread panicked holding it (every value it guards is
/// valid at every step).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
