//! A person's queue: the recovery incidents listed with what the stores know of each,
//! and resolved by a person's decision. Recovery never guesses an outcome it cannot learn;
//! after its tries it records an incident and leaves the hold where it is. A person who
//! has checked (the payment provider, the buyer) decides: **release** the hold's units,
//! or **confirm** its order. Each decision goes through the very steps the workers and a
//! client's retry take, so it is exact whatever raced it: a release is recovery's fence
//! (a RELEASED reservation taking the request_id) and then the return of the units; a
//! confirmation is the purchase's own commit of the hold, under the same unique key and
//! conditional UPDATE. The decision, who made it and why are then recorded on the
//! incident.

use std::time::Duration;

use flashsale_core::ReleaseReason;

use super::Maintenance;
use crate::error::Error;
use crate::model::{Order, PurchaseOutcome, PurchaseRecord};
use crate::ports::{
    Commit, Fence, HeldPurchase, Incident, IncidentClosing, IncidentKind, ReleaseOf, StaleHold,
};
use crate::service::{give_back, GiveBack};

/// The kind of incident a decision resolves: a hold whose order's existence recovery
/// could not learn. (`return_impossible`, units with no hold record left in the gate, is
/// reconciliation's to count, not a person's to decide.)
pub const OUTCOME_UNKNOWN: &str = IncidentKind::OutcomeUnknown.as_str();
/// Most pending holds of the incident's product read to find its hold: the gate lists
/// them oldest first, and an incident's hold is among the oldest (it waited out the
/// recovery window and every try).
const HOLDS_LOOKED_AT: usize = 10_000;

/// What a person decides for an incident.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The purchase did not happen: the hold's units go back on sale.
    Release,
    /// The purchase happened: the hold becomes its order.
    Confirm,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Release => "release",
            Decision::Confirm => "confirm",
        }
    }
}

/// What a decision did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// The hold is fenced; its units are back on sale (or will be by recovery's next
    /// pass over pending returns, if the gate did not answer just now).
    Released { returned: bool },
    /// The hold's order, made now or found made.
    Confirmed(Order),
}

/// Why a decision was not carried out: the incident stays as it was.
#[derive(Debug, thiserror::Error)]
pub enum Unresolved {
    #[error("no incident {0}")]
    NotFound(i64),
    #[error("incident {id} was decided already: {decision} by {by}")]
    Decided {
        id: i64,
        decision: String,
        by: String,
    },
    #[error("incident {id} is {kind}: only {OUTCOME_UNKNOWN} incidents take a decision")]
    Kind { id: i64, kind: String },
    #[error("the hold of incident {0} is no longer in the gate: its outcome was settled meanwhile (see `flashsale incidents show`)")]
    HoldGone(i64),
    #[error("the order of this hold exists (order {}): it cannot be released; confirm it", .0.order_id)]
    OrderExists(Order),
    #[error("the request was released already: its order can no longer be made; release it")]
    Released,
    #[error("the ledger refused the order: {0}; release the hold instead")]
    Refused(&'static str),
    #[error(transparent)]
    Store(#[from] Error),
}

impl From<crate::ports::LedgerError> for Unresolved {
    fn from(e: crate::ports::LedgerError) -> Self {
        Unresolved::Store(e.into())
    }
}

impl From<crate::ports::GateError> for Unresolved {
    fn from(e: crate::ports::GateError) -> Self {
        Unresolved::Store(e.into())
    }
}

/// An incident with what the stores know of it now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncidentView {
    pub incident: Incident,
    /// The hold, as the gate still lists it (None: no longer pending there).
    pub hold: Option<StaleHold>,
    /// What the ledger holds for the request_id (None: nothing, or it would not say).
    pub record: Option<PurchaseRecord>,
}

impl Maintenance {
    /// The recovery incidents, newest first, at most `limit`: the open ones, or all.
    pub async fn incidents(&self, open_only: bool, limit: usize) -> Result<Vec<Incident>, Error> {
        Ok(self.ledger_m.incidents(open_only, limit).await?)
    }

    /// One incident and what the gate and the ledger know of its request now.
    pub async fn incident_view(&self, id: i64) -> Result<Option<IncidentView>, Error> {
        let Some(incident) = self.ledger_m.incident(id).await? else {
            return Ok(None);
        };
        let hold = self.incident_hold(&incident).await?;
        // The very lookup that failed for recovery may fail again: then it is unknown.
        let record = self
            .ledger
            .find_purchase(&incident.request_id)
            .await
            .ok()
            .flatten();
        Ok(Some(IncidentView {
            incident,
            hold,
            record,
        }))
    }

    /// Carries out a person's decision on an open `outcome_unknown` incident (see the
    /// module's doc), then records it with who made it and why.
    pub async fn resolve_incident(
        &self,
        id: i64,
        decision: Decision,
        by: &str,
        note: &str,
    ) -> Result<Resolved, Unresolved> {
        let incident = self.decidable(id).await?;
        let hold = self
            .incident_hold(&incident)
            .await?
            .ok_or(Unresolved::HoldGone(id))?;
        let resolved = match decision {
            Decision::Release => self.release_hold(&hold).await?,
            Decision::Confirm => self.confirm_hold(&hold).await?,
        };
        let closing = IncidentClosing {
            decision: decision.as_str().to_owned(),
            by: by.to_owned(),
            note: note.to_owned(),
        };
        if !self.ledger_m.close_incident(id, &closing).await? {
            // Decided by another person between the check and now: their step and this
            // one met the same fences, so the outcome stands either way.
            tracing::warn!(id, "incident decided by someone else meanwhile");
        }
        self.forget_tries(&incident.request_id).await;
        Ok(resolved)
    }

    /// The incident, if it is open to a decision.
    async fn decidable(&self, id: i64) -> Result<Incident, Unresolved> {
        let incident = self
            .ledger_m
            .incident(id)
            .await?
            .ok_or(Unresolved::NotFound(id))?;
        if let Some(closing) = incident.closed.as_ref().and_then(|c| c.closing.as_ref()) {
            return Err(Unresolved::Decided {
                id,
                decision: closing.decision.clone(),
                by: closing.by.clone(),
            });
        }
        if incident.kind != OUTCOME_UNKNOWN {
            return Err(Unresolved::Kind {
                id,
                kind: incident.kind.clone(),
            });
        }
        Ok(incident)
    }

    /// The incident's hold, as the gate still lists it.
    async fn incident_hold(&self, incident: &Incident) -> Result<Option<StaleHold>, Error> {
        let holds = self
            .gate_m
            .stale_holds(incident.product_id, Duration::ZERO, HOLDS_LOOKED_AT)
            .await?;
        Ok(holds
            .into_iter()
            .find(|h| h.request.request_id == incident.request_id && !h.released))
    }

    /// Recovery's release of an abandoned hold: the fence, then the units back.
    async fn release_hold(&self, hold: &StaleHold) -> Result<Resolved, Unresolved> {
        let fence = self
            .ledger
            .fence(&hold.request, hold.hold, ReleaseReason::Abandoned)
            .await?;
        if let Fence::Duplicate(record) = fence {
            let this = record.is_hold(hold.request.product_id, hold.hold);
            match record.outcome {
                PurchaseOutcome::Order(order) if this => {
                    return Err(Unresolved::OrderExists(order))
                }
                // Released already (by recovery meanwhile, or a person before): the
                // return below finishes it if it did not.
                PurchaseOutcome::Released { .. } if this => {}
                // The request_id went to another hold: this one never becomes an order.
                _ => {}
            }
        }
        let of = ReleaseOf::Hold { hold: hold.hold };
        let returned = matches!(
            give_back(
                self.gate.as_ref(),
                self.ledger.as_ref(),
                hold.request.product_id,
                &hold.request.request_id,
                &of,
            )
            .await,
            GiveBack::Done
        );
        Ok(Resolved::Released { returned })
    }

    /// The purchase's own commit of the hold.
    async fn confirm_hold(&self, hold: &StaleHold) -> Result<Resolved, Unresolved> {
        let product = self
            .ledger
            .product(hold.request.product_id)
            .await?
            .ok_or(Error::ProductNotFound)?;
        let terms = product.terms(self.settings.payment_timeout);
        let held = HeldPurchase::new(&hold.request, hold.hold, terms);
        let commit = self.ledger.commit_purchase(&held).await?;
        match commit {
            Commit::Committed(order) => Ok(Resolved::Confirmed(order)),
            Commit::Duplicate(record) => match record.outcome {
                PurchaseOutcome::Order(order)
                    if record.is_hold(hold.request.product_id, hold.hold) =>
                {
                    Ok(Resolved::Confirmed(order))
                }
                _ => Err(Unresolved::Released),
            },
            Commit::InsufficientStock => Err(Unresolved::Refused("not enough stock left")),
            Commit::LimitExceeded => Err(Unresolved::Refused("the buyer's per-user limit")),
            Commit::StaleGeneration => Err(Unresolved::Refused(
                "the hold belongs to gate state rebuilt since",
            )),
            refused @ (Commit::GateMode | Commit::Settling) => {
                // Only a purchase without a gate hold is answered so; this one has one.
                debug_assert!(false, "a gate hold's commit answered {refused:?}");
                Err(Unresolved::Refused(
                    "the hold belongs to gate state rebuilt since",
                ))
            }
        }
    }
}
