//! Taking units off sale (a destock): an admin removes available units from a product's
//! stock, never units held by a purchase or sold, exactly while purchases run.
//!
//! Who decides depends on who serves the stock:
//! - **Ledger mode.** The ledger alone: under the inventory row's lock, refused if fewer
//!   units are available, else the counters, the stock log, the operator's log line and
//!   its event, in one transaction.
//! - **Gate mode.** The gate (Redis) is the authority on available units: a unit the
//!   ledger counts available may be held by a purchase between Redis and its commit. So
//!   the ledger first records the intent, pending, in the product's stock generation,
//!   changing nothing; then `destock.lua` takes the units in Redis only if that many are
//!   available (a marker keeps the outcome, so a retry answers the same); then the
//!   ledger settles the intent: taken (the counters, log rows and event, in one
//!   transaction, only while the product is still in that generation) or refused
//!   (nothing else changes). A purchase can only get units the gate still had, so no
//!   purchase is told 201 for a unit taken back, and the ledger's counters stay exact.
//!
//! A crash between the gate and the ledger leaves the intent pending; the workers'
//! [`Destocking::settle_pending`] drives it on (the marker makes the gate's step answer
//! the same). If the gate was rebuilt since (a new generation), the rebuild counted from
//! the ledger's counters, which do not take the destock off yet: the ledger records the
//! intent in the new generation and the gate takes it again (nobody was answered yet).
//! If the product went to ledger mode meanwhile, the ledger settles it by its counters.

use std::sync::Arc;

use async_trait::async_trait;
use flashsale_core::{parse_restock, Generation, ProductId, RequestId};
use tracing::{info, warn};

use crate::control::AdminAction;
use crate::error::Error;
use crate::metrics::Metrics;
use crate::model::ProductView;
use crate::ports::{Destock, LedgerError, StockChange, StockGate};
use crate::service::Flashsale;

/// Rounds of gate-then-ledger one destock call makes. A round after the first follows a
/// rebuild of the product's gate between the record and the settle, which is rare; two
/// in one request rarer still. Past them the intent stays pending, the client hears 503
/// (retry with the same request_id) and the workers settle it.
pub const DESTOCK_ROUNDS_MAX: usize = 3;

/// Where a destock stands in the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DestockState {
    /// Recorded, not settled: the gate is to take it in this generation.
    Pending(Generation),
    /// The units are off sale, in the ledger's counters.
    Taken,
    /// Fewer units were available; nothing changed.
    Refused,
}

/// What the ledger answered a destock's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// Recorded now pending (gate mode), or before under the same request_id for the
    /// same product and quantity: where it stands.
    State(DestockState),
    /// Recorded and settled now by the ledger's counters (ledger mode).
    Settled(DestockState),
    /// The request_id names another destock, or another action of the operator's log.
    Conflict,
    /// No such product.
    NotFound,
}

/// What the gate said of a pending destock, for the ledger to settle it with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateSaid {
    Taken,
    Refused,
    /// The gate is in a newer generation than the destock's (a rebuild counted without
    /// it): record it in the product's generation now.
    Stale,
    /// The gate did not answer: whatever it took in the destock's generation no longer
    /// counts if the product went to ledger mode (settled by the counters) or its gate
    /// was rebuilt since (recorded anew); else the destock stays pending.
    Unreachable,
}

/// A destock recorded and not settled, for the workers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingDestock {
    pub destock_id: RequestId,
    pub product_id: ProductId,
    pub quantity: i64,
    pub generation: Generation,
}

/// The ledger's side of destocks (MariaDB's alone: the simulator's workers never meet a
/// destock).
#[async_trait]
pub trait Destocks: Send + Sync + 'static {
    /// Records a destock of `quantity` units under the admin's request_id, once: in
    /// ledger mode settled at once by the counters, in gate mode pending in the product's
    /// generation with no counter changed. A request_id recorded before answers its
    /// state.
    async fn record_destock(
        &self,
        action: &AdminAction,
        quantity: i64,
    ) -> Result<Recorded, LedgerError>;

    /// Settles a pending destock with what the gate said in `generation`, taken or
    /// refused, only while the product is still in that generation and in gate mode;
    /// else recorded in the product's generation now (pending again), or settled by the
    /// counters in ledger mode. A destock settled before answers its state.
    async fn settle_destock(
        &self,
        destock_id: &RequestId,
        generation: Generation,
        said: GateSaid,
    ) -> Result<DestockState, LedgerError>;

    /// Pending destocks, oldest first, at most `limit`.
    async fn pending_destocks(&self, limit: usize) -> Result<Vec<PendingDestock>, LedgerError>;
}

/// The destock use case.
pub struct Destocking {
    destocks: Arc<dyn Destocks>,
    gate: Arc<dyn StockGate>,
    service: Arc<Flashsale>,
    metrics: Option<Arc<Metrics>>,
}

impl std::fmt::Debug for Destocking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Destocking")
    }
}

impl Destocking {
    pub fn new(
        destocks: Arc<dyn Destocks>,
        gate: Arc<dyn StockGate>,
        service: Arc<Flashsale>,
        metrics: Option<Arc<Metrics>>,
    ) -> Self {
        Self {
            destocks,
            gate,
            service,
            metrics,
        }
    }

    /// Takes `quantity` available units of the product off sale, once per request_id:
    /// the product as it is now, or `InsufficientStock` when fewer are available (and
    /// nothing changed). A 503 leaves the destock recorded: a retry with the same
    /// request_id, or the workers, settle it.
    pub async fn destock(&self, action: AdminAction, quantity: i64) -> Result<ProductView, Error> {
        let quantity = parse_restock(quantity)?;
        let product_id = action.product_id;
        // Record destocks only against a loaded gate, as restocks: warm-up copies the
        // ledger's counters, which do not take a pending destock off.
        self.service.stock_ready(product_id).await?;
        let state = match self.destocks.record_destock(&action, quantity).await? {
            Recorded::State(state) => state,
            Recorded::Settled(state) => {
                self.count(state, quantity);
                state
            }
            Recorded::Conflict => return Err(Error::RequestIdConflict),
            Recorded::NotFound => return Err(Error::ProductNotFound),
        };
        match self
            .drive(product_id, &action.request_id, quantity, state)
            .await?
        {
            DestockState::Taken => {
                info!(%product_id, admin = %action.admin, request_id = %action.request_id,
                    quantity, "destocked");
                self.service.product_view(product_id).await
            }
            DestockState::Refused => Err(Error::InsufficientStock),
            DestockState::Pending(generation) => Err(Error::Unavailable(
                format!(
                    "the destock is recorded in generation {generation}, but product \
                     {product_id}'s stock is missing from the stock gate or being rebuilt; \
                     retry with the same request_id"
                )
                .into(),
            )),
        }
    }

    /// Drives a destock to taken or refused: the gate's step in its generation, then the
    /// ledger's settle, again in the newer generation the ledger recorded it in (a
    /// rebuild between them), at most [`DESTOCK_ROUNDS_MAX`] rounds. Pending when the
    /// gate has no entry to take it from yet. Counts each settle it makes.
    async fn drive(
        &self,
        product_id: ProductId,
        destock_id: &RequestId,
        quantity: i64,
        mut state: DestockState,
    ) -> Result<DestockState, Error> {
        for _ in 0..DESTOCK_ROUNDS_MAX {
            let DestockState::Pending(generation) = state else {
                return Ok(state);
            };
            let change = StockChange {
                product_id,
                id: destock_id.clone(),
                quantity,
                generation,
            };
            let said = match self.gate.destock(&change).await {
                Ok(Destock::Taken) => GateSaid::Taken,
                Ok(Destock::Refused) => GateSaid::Refused,
                Ok(Destock::Stale) => GateSaid::Stale,
                Ok(Destock::NotLoaded) => return Ok(state),
                // Redis down: the product may be in ledger mode, where the ledger
                // settles it alone.
                Err(e) => {
                    let said = GateSaid::Unreachable;
                    state = self
                        .destocks
                        .settle_destock(destock_id, generation, said)
                        .await?;
                    if state == DestockState::Pending(generation) {
                        return Err(e.into());
                    }
                    self.count(state, quantity);
                    continue;
                }
            };
            // A crash between the gate's step and the ledger's, for the destocks whose
            // request_id starts with the failpoint's argument
            // (`destock-after-gate=return(PREFIX)`): the tests' way to leave one pending.
            #[cfg(feature = "failpoints")]
            if let Some(Some(prefix)) = fail::eval("destock-after-gate", |arg| arg) {
                if destock_id.as_str().starts_with(&prefix) {
                    return Err(Error::Unavailable("failpoint destock-after-gate".into()));
                }
            }
            state = self
                .destocks
                .settle_destock(destock_id, generation, said)
                .await?;
            self.count(state, quantity);
        }
        Ok(state)
    }

    /// Counts a settle's outcome in the metrics.
    fn count(&self, state: DestockState, quantity: i64) {
        if let Some(m) = &self.metrics {
            match state {
                DestockState::Taken => m.destocked(true, quantity),
                DestockState::Refused => m.destocked(false, 0),
                DestockState::Pending(_) => {}
            }
        }
    }

    /// The workers' pass: drives every pending destock (at most `limit`) on, as a retry
    /// of its request would; answers how many it settled. A destock whose gate step or
    /// settle fails is left for the next pass.
    pub async fn settle_pending(&self, limit: usize) -> Result<usize, Error> {
        let mut settled = 0;
        for p in self.destocks.pending_destocks(limit).await? {
            let state = DestockState::Pending(p.generation);
            match self
                .drive(p.product_id, &p.destock_id, p.quantity, state)
                .await
            {
                Ok(DestockState::Pending(_)) => {}
                Ok(state) => {
                    settled += 1;
                    info!(product_id = %p.product_id, destock_id = %p.destock_id,
                        ?state, "pending destock settled");
                }
                Err(e) => {
                    warn!(product_id = %p.product_id, destock_id = %p.destock_id,
                        error = %e, "pending destock not settled; next pass");
                }
            }
        }
        Ok(settled)
    }
}
