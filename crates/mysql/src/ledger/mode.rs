//! Ledger mode's purchases (`flashsale_core::StockMode::Ledger`): the ledger decides and
//! records each purchase without a gate hold, handing out the hold ids itself
//! (`product_inventory.ledger_hold_seq`). Purchases that arrive together go through a
//! group commit of their own, with the gate batches' decision (`GroupCommit`) and rows
//! (`crate::group::insert`); anything but the plain case is committed one by one here.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use flashsale_app::group;
use flashsale_app::modes::LEDGER_SALES_AFTER_SWITCH;
use flashsale_app::ports::{Commit, HeldPurchase, LedgerError, LedgerPurchase};
use flashsale_batch::{BatchFn, Coalescer};
use flashsale_core::{Generation, HoldRef, ProductId, PurchaseRequest, StockMode};
use sqlx::{MySqlConnection, Row};
use tracing::debug;

use super::{
    limit_then_commit, write_purchase_rows, Attempt, Committed, MysqlLedger, Rows,
    GROUP_COMMIT_MAX, GROUP_QUEUE_MAX, GROUP_WORKERS,
};
use crate::group::{Counters, Decided, Written};
use crate::rows;

/// `LEDGER_SALES_AFTER_SWITCH` in microseconds, for the statements' intervals.
fn settling_us() -> i64 {
    crate::sql::micros(LEDGER_SALES_AFTER_SWITCH)
}

/// Takes `units` of `product_id` and hands out `holds` hold ids (`ledger_hold_seq`) in
/// the open transaction `tx`: one UPDATE that requires ledger mode, settled, and enough
/// units. The stored generation and the last hold id handed out, read back under the
/// row's lock; None when the product is not in ledger mode or has too few units.
async fn take_units(
    tx: &mut MySqlConnection,
    product_id: ProductId,
    units: i64,
    holds: i64,
) -> Result<Option<(i64, i64)>, sqlx::Error> {
    let updated = sqlx::query(
        "UPDATE product_inventory SET available_stock = available_stock - ?, \
         pre_deduct_stock = pre_deduct_stock + ?, ledger_hold_seq = ledger_hold_seq + ?, \
         version = version + 1 \
         WHERE product_id = ? AND available_stock >= ? AND stock_mode = 'LEDGER' \
         AND COALESCE(mode_changed_at, '1000-01-01') <= NOW(6) - INTERVAL ? MICROSECOND",
    )
    .bind(units)
    .bind(units)
    .bind(holds)
    .bind(product_id.get())
    .bind(units)
    .bind(settling_us())
    .execute(&mut *tx)
    .await?;
    if updated.rows_affected() != 1 {
        return Ok(None);
    }
    let row = sqlx::query(
        "SELECT generation, ledger_hold_seq FROM product_inventory WHERE product_id = ?",
    )
    .bind(product_id.get())
    .fetch_one(&mut *tx)
    .await?;
    Ok(Some((
        row.try_get("generation")?,
        row.try_get("ledger_hold_seq")?,
    )))
}

/// Takes the units of a batch of ledger-mode purchases in the open transaction `tx`: per
/// product, in product order (two batches never wait on each other in a cycle), one
/// UPDATE that requires ledger mode and enough units for the whole batch, and hands out
/// as many hold ids (`ledger_hold_seq`), read back under the row's lock. The holds, in
/// batch order; None when a product is not in ledger mode or has too few units (the
/// caller rolls back and commits the purchases one by one, where each has its answer).
async fn take_ledger_units(
    tx: &mut MySqlConnection,
    batch: &[LedgerPurchase],
) -> Result<Option<Vec<HoldRef>>, sqlx::Error> {
    let mut per_product: BTreeMap<ProductId, (i64, i64)> = BTreeMap::new();
    for p in batch {
        let entry = per_product.entry(p.request.product_id).or_default();
        entry.0 += i64::from(p.request.quantity.get());
        entry.1 += 1;
    }
    // Per product: the generation and the first hold id of the batch's.
    let mut next: HashMap<ProductId, (Generation, i64)> = HashMap::new();
    for (product_id, (units, count)) in &per_product {
        let Some((generation, last)) = take_units(tx, *product_id, *units, *count).await? else {
            return Ok(None);
        };
        let generation = crate::rows::generation(generation).map_err(crate::rows::undecodable)?;
        next.insert(*product_id, (generation, last - count + 1));
    }
    let mut holds = Vec::with_capacity(batch.len());
    for p in batch {
        let Some((generation, id)) = next.get_mut(&p.request.product_id) else {
            // The loop above took units for every product of the batch, or returned.
            debug_assert!(
                false,
                "product {} of the batch has no counter",
                p.request.product_id
            );
            return Err(sqlx::Error::Protocol(
                "a batch product without a counter".into(),
            ));
        };
        holds.push(crate::rows::hold(generation.get(), *id).map_err(crate::rows::undecodable)?);
        *id += 1;
    }
    Ok(Some(holds))
}

impl MysqlLedger {
    pub(super) fn ledger_group(&self) -> &Coalescer<LedgerPurchase, Result<Commit, LedgerError>> {
        self.ledger_group.get_or_init(|| {
            let ledger = Arc::new(self.single());
            let run: BatchFn<LedgerPurchase, Result<Commit, LedgerError>> =
                Arc::new(move |batch: Vec<LedgerPurchase>| {
                    let ledger = ledger.clone();
                    Box::pin(async move { ledger.ledger_group_commit(batch).await })
                });
            Coalescer::start(GROUP_QUEUE_MAX, GROUP_COMMIT_MAX, GROUP_WORKERS, run)
        })
    }

    /// Commits a batch of ledger-mode purchases in one transaction when they go the plain
    /// way, with the same decision as the gate's batches (`GroupCommit`): a request_id's
    /// later copies, taken request_ids and users' excess over a per-user limit are set
    /// aside and the rest tried again; a product short of units or back in gate mode
    /// sends the whole batch one by one. Set-aside purchases are committed on their own,
    /// one after another (they wait on the same product rows anyway), where each gets
    /// its answer.
    async fn ledger_group_commit(
        &self,
        batch: Vec<LedgerPurchase>,
    ) -> Vec<Result<Commit, LedgerError>> {
        let started = std::time::Instant::now();
        let decided = Decided::run(batch.iter().map(|p| &p.request), |plain| {
            let members: Vec<LedgerPurchase> = plain.iter().map(|&i| batch[i].clone()).collect();
            async move {
                self.run("ledger group commit", || async {
                    let mut own = self.ledger_group_conn.take().await?;
                    let written = Self::ledger_group_transaction(own.conn(), &members).await;
                    own.give_back(&written).await;
                    match written? {
                        Some(Written::Orders(orders)) => Ok((group::Written::Orders, orders)),
                        Some(Written::OverLimit(over)) => {
                            Ok((group::Written::OverLimit(over), vec![]))
                        }
                        Some(Written::NotPlain) => {
                            let document = crate::group::request_ids_document(
                                members.iter().map(|p| &p.request.request_id),
                            );
                            let taken = crate::group::taken(&self.pool(), &document).await?;
                            Ok((group::Written::Taken(taken), vec![]))
                        }
                        // Short of units or not in ledger mode: one by one.
                        None => Ok((group::Written::Taken(Default::default()), vec![])),
                    }
                })
                .await
            }
        })
        .await;
        // One after another: they all wait on the same product rows anyway.
        let aside = decided.aside();
        let mut one_by_one = Vec::with_capacity(aside.len());
        for &i in &aside {
            one_by_one.push(self.commit_ledger_one(&batch[i]).await);
        }
        debug!(size = batch.len(), one_by_one = aside.len(), elapsed = ?started.elapsed(), "ledger group commit");
        decided.answers(one_by_one)
    }

    /// The ledger-mode group transaction on `conn`, ended: the units taken and the hold
    /// ids handed out first ([`take_ledger_units`]), then the rows as a gate
    /// batch's, by the same procedure; committed with the orders, or rolled back. None:
    /// a product was short of units or not in ledger mode.
    async fn ledger_group_transaction(
        conn: &mut MySqlConnection,
        members: &[LedgerPurchase],
    ) -> Result<Option<Written>, sqlx::Error> {
        crate::group::begin(conn).await?;
        let holds = match take_ledger_units(conn, members).await {
            Ok(Some(holds)) => holds,
            other => return crate::group::roll_back(conn, other.map(|_| None)).await,
        };
        let purchases: Vec<HeldPurchase> = members
            .iter()
            .zip(holds)
            .map(|(p, hold)| HeldPurchase::new(&p.request, hold, p.terms))
            .collect();
        let written = crate::group::insert(conn, &purchases, Counters::Taken).await;
        crate::group::end(conn, written).await.map(Some)
    }

    /// One ledger-mode purchase in its own transaction.
    async fn commit_ledger_one(&self, purchase: &LedgerPurchase) -> Result<Commit, LedgerError> {
        const WHAT: &str = "commit ledger purchase";
        let request = &purchase.request;
        let outcome = self
            .purchase_or_taken(WHAT, &request.request_id, || {
                self.run(WHAT, move || self.insert_ledger_purchase(purchase))
            })
            .await?;
        match outcome {
            Ok(Committed::Order(order)) => Ok(Commit::Committed(order)),
            Ok(Committed::InsufficientStock) => Ok(Commit::InsufficientStock),
            Ok(Committed::LimitExceeded) => Ok(Commit::LimitExceeded),
            Ok(Committed::GateMode) => Ok(Commit::GateMode),
            Ok(Committed::Settling) => Ok(Commit::Settling),
            // The ledger's own counter handed out a hold id recorded before in this
            // generation: only a write outside the ledger's paths does that.
            Ok(Committed::HoldReused | Committed::StaleGeneration) => {
                Err(LedgerError::corrupt(format!(
                    "{WHAT}: product {}: the ledger's hold id was recorded already",
                    request.product_id
                )))
            }
            Err(record) => Ok(Commit::Duplicate(record)),
        }
    }

    /// A ledger-mode purchase in one transaction: the counter UPDATE first, as it hands
    /// out the hold id (so the product row's lock is held to COMMIT; one purchase at a
    /// time per product, as in the seeds), then the purchase's rows for that hold and the
    /// per-user check. A taken request_id rolls it all back, the hold id with it.
    async fn insert_ledger_purchase(
        &self,
        purchase: &LedgerPurchase,
    ) -> Result<Attempt<Committed>, sqlx::Error> {
        let LedgerPurchase { request, terms } = purchase;
        let mut tx = self.pool().begin().await?;
        // The ledger's own stock check, and the mode: a product the gate serves is sold
        // through the gate's holds only. The generation is the current one by
        // construction: it is read under this row lock.
        let units = i64::from(request.quantity.get());
        let Some((generation, last)) = take_units(&mut tx, request.product_id, units, 1).await?
        else {
            return refused(tx, request).await;
        };
        let hold = rows::hold(generation, last).map_err(rows::undecodable)?;
        let timeout = terms.payment_timeout;
        let order = match write_purchase_rows(&mut tx, request, hold, timeout).await? {
            Rows::Written(order) => order,
            Rows::Taken => return Ok(Attempt::Taken),
            Rows::HoldReused => return Ok(Attempt::Done(Committed::HoldReused)),
        };
        limit_then_commit(tx, request, terms.per_user_limit, order).await
    }
}

/// A ledger-mode purchase refused by its counter UPDATE: why, read again in its
/// transaction, which is then rolled back.
///
/// The mode, and whether the units are there. In ledger mode with the units there, the
/// switch was still settling when the UPDATE ran (by now it may not be: a second
/// statement sees a later NOW(6)), so the answer is Settling, a retry, never a false sold
/// out.
async fn refused(
    mut tx: sqlx::Transaction<'_, sqlx::MySql>,
    request: &PurchaseRequest,
) -> Result<Attempt<Committed>, sqlx::Error> {
    let mode: Option<(String, bool)> = sqlx::query_as(
        "SELECT CAST(stock_mode AS CHAR), available_stock >= ? \
         FROM product_inventory WHERE product_id = ?",
    )
    .bind(request.quantity.get())
    .bind(request.product_id.get())
    .fetch_optional(&mut *tx)
    .await?;
    // A replay of a purchase recorded before (in either mode) is answered with its
    // record, not with the refusal a new purchase would get.
    let taken: Option<i64> =
        sqlx::query_scalar("SELECT id FROM inventory_reservation WHERE request_id = ?")
            .bind(request.request_id.as_str())
            .fetch_optional(&mut *tx)
            .await?;
    tx.rollback().await?;
    if taken.is_some() {
        return Ok(Attempt::Taken);
    }
    let Some((mode, enough)) = mode else {
        return Err(sqlx::Error::RowNotFound);
    };
    Ok(Attempt::Done(
        match StockMode::from_stored(&mode).map_err(|e| sqlx::Error::Decode(e.into()))? {
            StockMode::Gate => Committed::GateMode,
            StockMode::Ledger if enough => Committed::Settling,
            StockMode::Ledger => Committed::InsufficientStock,
        },
    ))
}
