//! After the sale: a product whose sale has ended and that holds no unconfirmed units has
//! its stock gate state (Redis's entry, per-user counts, pending index, hold records and
//! markers) retired once `FLASHSALE_SALE_RETIRE_AFTER` has passed since the end. The
//! ledger stays the truth: `GET /v1/products/{id}` and the audit read it alone.
//!
//! In that order, so that no step can lose or double a unit:
//! 1. The ledger, under the inventory row's lock, checks again that the product is in
//!    gate mode with its gate loaded, its sale ended past the grace, and nothing in
//!    flight: no unpaid order, no PROCESSING reservation, no release the gate has not
//!    had, no restock not applied, no pending destock. It then moves the product to the
//!    next stock generation (a hold of the retired one can never commit, invariant I8)
//!    and marks the gate not loaded, as a product never loaded.
//! 2. The gate deletes the entry only while it is still of the retired generation (a
//!    reload since is left alone), then the keys under the product's hash tag, sparing
//!    a reloaded entry's markers and its hold records of newer generations.
//!
//! A later restock, or a purchase in a window moved into the future, loads the entry
//! again as a rebuild does ([`SaleRetirements::reload_plan`], `Flashsale::with_reload`):
//! from the ledger's facts in the next generation, hold ids above every recorded one (the
//! audit tells holds apart by them), each user's units under a per-user limit, and no
//! vouching for earlier records. The ledger's step records the gate's step as owed
//! ([`SaleRetirements::unswept`]), and each pass does what is owed, so a crash or a Redis
//! failure between the two steps only delays the deletion. Until it is done no hold of
//! the old keys can commit (another generation), and a load that finds the old entry
//! keeps it, which the gate watch then finds a generation behind the ledger and
//! rebuilds, as after any lost write.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use flashsale_core::{Generation, ProductId};
use tracing::{info, warn};

use crate::error::Error;
use crate::metrics::Metrics;
use crate::ports::{GateError, LedgerError, RebuildPlan};

/// The ledger's side of retiring sales (MariaDB's alone: the simulator's workers never
/// retire a sale).
#[async_trait]
pub trait SaleRetirements: Send + Sync + 'static {
    /// Products that look retirable now, by the ledger's clock: gate mode, gate loaded,
    /// sale ended more than `grace` ago, nothing in flight; at most `limit`, those whose
    /// sale ended first first.
    async fn retirable_sales(
        &self,
        grace: Duration,
        limit: usize,
    ) -> Result<Vec<ProductId>, LedgerError>;

    /// Retires the product's sale in one transaction under the inventory row's lock,
    /// if every condition of [`Self::retirable_sales`] still holds: the next generation,
    /// the gate marked not loaded, and the gate's step recorded as owed. The generation
    /// retired, or None (not retirable any more, or no such product).
    async fn retire_sale(
        &self,
        product_id: ProductId,
        grace: Duration,
    ) -> Result<Option<Generation>, LedgerError>;

    /// The way back for a product whose gate is not loaded (retired, or never loaded in
    /// a later generation): in one transaction under the inventory row's lock, in gate
    /// mode and still not loaded, the next generation, a rebuild's plan from the ledger's
    /// facts (hold ids above every recorded one, each user's units for a per-user limit)
    /// and the gate marked loaded. None otherwise: loaded meanwhile, ledger mode, no such
    /// product. A gate not rebuilt with the plan (a crash, Redis down) is found missing by
    /// the gate watch, which rebuilds it.
    async fn reload_plan(&self, product_id: ProductId) -> Result<Option<RebuildPlan>, LedgerError>;

    /// Retired sales whose gate step is still owed, with the generation retired; at most
    /// `limit`.
    async fn unswept(&self, limit: usize) -> Result<Vec<(ProductId, Generation)>, LedgerError>;

    /// The gate's step of the retirement of `generation` is done (a later retirement,
    /// owed since, stays owed).
    async fn swept(&self, product_id: ProductId, generation: Generation)
        -> Result<(), LedgerError>;
}

/// What the gate deleted of a retired sale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateRetired {
    /// The entry went; false when it was loaded again in a newer generation and kept.
    pub entry_deleted: bool,
    /// Other keys deleted: hold records, markers, rate cells.
    pub keys_deleted: u64,
}

/// The gate's side of retiring sales (Redis's alone).
#[async_trait]
pub trait SaleRetirementGate: Send + Sync + 'static {
    /// Deletes the product's entry if it is still of `generation` or older, then its
    /// other keys (see the module's documentation).
    async fn retire_sale(
        &self,
        product_id: ProductId,
        generation: Generation,
    ) -> Result<GateRetired, GateError>;
}

/// The retirement use case, run by the workers.
pub struct SaleRetirement {
    ledger: Arc<dyn SaleRetirements>,
    gate: Arc<dyn SaleRetirementGate>,
    grace: Duration,
    metrics: Option<Arc<Metrics>>,
}

impl std::fmt::Debug for SaleRetirement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaleRetirement")
            .field("grace", &self.grace)
            .finish()
    }
}

impl SaleRetirement {
    /// `grace`: how long after its end a sale's gate state is kept.
    pub fn new(
        ledger: Arc<dyn SaleRetirements>,
        gate: Arc<dyn SaleRetirementGate>,
        grace: Duration,
        metrics: Option<Arc<Metrics>>,
    ) -> Self {
        Self {
            ledger,
            gate,
            grace,
            metrics,
        }
    }

    /// The workers' pass: retires at most `limit` ended sales in the ledger, then does
    /// the gate's step of at most `limit` retirements that owe it (these and any a crash
    /// or a Redis failure left); answers how many it looked at (a full batch asks for
    /// another pass at once). A gate step that fails stays owed for the next pass: its
    /// keys hold nothing any purchase can use meanwhile, only memory.
    pub async fn retire_pass(&self, limit: usize) -> Result<usize, Error> {
        let candidates = self.ledger.retirable_sales(self.grace, limit).await?;
        for &product_id in &candidates {
            self.ledger.retire_sale(product_id, self.grace).await?;
        }
        let owed = self.ledger.unswept(limit).await?;
        for &(product_id, generation) in &owed {
            self.sweep(product_id, generation).await?;
        }
        Ok(candidates.len().max(owed.len()))
    }

    /// The gate's step of one retirement, then the ledger told it is done; a gate that
    /// fails leaves it owed (logged).
    async fn sweep(&self, product_id: ProductId, generation: Generation) -> Result<(), Error> {
        match self.gate.retire_sale(product_id, generation).await {
            Ok(done) => {
                self.ledger.swept(product_id, generation).await?;
                info!(%product_id, %generation, entry_deleted = done.entry_deleted,
                    keys_deleted = done.keys_deleted, "ended sale retired from the stock gate");
                if let Some(m) = &self.metrics {
                    m.sale_retired();
                }
            }
            Err(e) => {
                warn!(%product_id, %generation, error = %e,
                    "ended sale retired in the ledger; its stock gate keys are deleted on a \
                     later pass");
            }
        }
        Ok(())
    }
}
