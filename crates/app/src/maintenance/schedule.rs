//! The audit on a schedule, run by `serve` with no operator: each product's once its sale
//! has ended and settled, and every product's once per period (a day by default). One
//! instance runs each audit, whichever claims it first in the ledger; a claim whose
//! instance died is taken over once its lease ends, and a finished audit is never run
//! again. Each verdict is recorded (`audit_run`) as `flashsale audit`'s is, for the live
//! sale page and the alert on recent violations.

use std::time::Duration;

use flashsale_core::ProductId;
use tracing::{error, info, warn};

use super::Maintenance;
use crate::error::Error;
use crate::ports::{AuditSchedule, AuditVerdict};

/// How long a claim stands before another instance may take its audit over: far longer
/// than an audit takes (a product's is a few reads and at most a second look a second
/// later; every product's, a thousand products a minute), so that only a dead instance's
/// audit is taken over.
pub const AUDIT_CLAIM_LEASE: Duration = Duration::from_secs(30 * 60);
/// Ended sales audited in one pass: bounds a pass's time; the others wait for the next.
const ENDED_SALES_PER_PASS: usize = 100;

/// What `serve` audits by itself, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditScheduleSettings {
    /// How long after its sale's end a product is audited: by then every unpaid order has
    /// expired and every abandoned hold has been recovered, so the audit judges the sale
    /// as it stays.
    pub settled_for: Duration,
    /// Every product is audited once per this period (None: only the ended sales).
    pub every: Option<Duration>,
}

/// What one pass of the scheduled audits did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScheduledAudits {
    /// Products whose end-of-sale audit this pass ran.
    pub sales: usize,
    /// Whether it ran the audit of every product.
    pub every: bool,
    /// Violations those audits found.
    pub violations: usize,
}

impl Maintenance {
    /// One pass: the ended sales' audits this instance (`holder`) claims, then the
    /// period's audit of every product if it claims it. A product whose audit fails (a
    /// store did not answer) keeps its claim until the lease ends and is tried again then.
    pub async fn scheduled_audits_once(
        &self,
        holder: &str,
        settings: &AuditScheduleSettings,
    ) -> Result<ScheduledAudits, Error> {
        let mut done = ScheduledAudits::default();
        let ended = self
            .ledger_m
            .ended_sales(settings.settled_for, ENDED_SALES_PER_PASS)
            .await?;
        for product in ended {
            let which = AuditSchedule::SaleEnd(product);
            if let Some(verdict) = self.claimed(&which, holder, Some(product)).await? {
                done.sales += 1;
                done.violations += verdict.violations;
            }
        }
        if let Some(every) = settings.every {
            if let Some(verdict) = self
                .claimed(&AuditSchedule::Every(every), holder, None)
                .await?
            {
                done.every = true;
                done.violations += verdict.violations;
            }
        }
        Ok(done)
    }

    /// Runs `which` if `holder` claims it: audits `product` (None: every loaded product),
    /// records the verdict and marks the audit done. None when another holder has it.
    async fn claimed(
        &self,
        which: &AuditSchedule,
        holder: &str,
        product: Option<ProductId>,
    ) -> Result<Option<AuditVerdict>, Error> {
        let Some(claim) = self
            .ledger_m
            .claim_audit(which, holder, AUDIT_CLAIM_LEASE)
            .await?
        else {
            return Ok(None);
        };
        let products = match product {
            Some(product) => vec![product],
            None => self.products().await?,
        };
        let verdict = self.audit_and_record(&products, product).await?;
        self.ledger_m.finish_audit(&claim).await?;
        if verdict.clean() {
            info!(
                ?which,
                products = verdict.products,
                pending = verdict.pending,
                "scheduled audit: clean"
            );
        } else {
            error!(
                ?which,
                products = verdict.products,
                violations = verdict.violations,
                "scheduled audit found violations: run `flashsale audit` for the details"
            );
        }
        Ok(Some(verdict))
    }

    /// Audits each of `products` and records the verdict (`scope`: the one product, or
    /// every product). A product that vanished meanwhile is passed over.
    pub async fn audit_and_record(
        &self,
        products: &[ProductId],
        scope: Option<ProductId>,
    ) -> Result<AuditVerdict, Error> {
        let mut verdict = AuditVerdict {
            product: scope,
            products: products.len(),
            violations: 0,
            pending: 0,
        };
        for &product in products {
            match self.audit(product).await {
                Ok(report) => {
                    verdict.violations += report.violations.len();
                    verdict.pending += report.pending.len();
                }
                Err(Error::ProductNotFound) => {
                    warn!(%product, "product gone before its audit");
                }
                Err(e) => return Err(e),
            }
        }
        self.record_audit(&verdict).await?;
        Ok(verdict)
    }
}
