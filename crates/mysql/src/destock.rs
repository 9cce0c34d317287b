//! Destocks in the ledger (`destock_request`, migration 35): the intent recorded under
//! the admin's request_id, and its settle, each one transaction under the inventory row's
//! lock. A taken destock moves the counters (total and available, by the same units),
//! writes the stock log's `destock` row, the operator's log line and its event together;
//! a refused one changes nothing but its own row (app/src/destock.rs has the protocol).

use async_trait::async_trait;
use flashsale_app::control::AdminAction;
use flashsale_app::destock::{DestockState, Destocks, GateSaid, PendingDestock, Recorded};
use flashsale_app::{EventType, LedgerError};
use flashsale_core::{AdminName, Generation, ProductId, RequestId, StockMode};
use sqlx::mysql::MySqlRow;
use sqlx::{MySql, Row, Transaction};

use crate::controls::{log, Line};
use crate::ledger::MysqlLedger;
use crate::rows::{self, corrupt, undecodable};
use crate::sql::is_duplicate;

/// The inventory row of a destock, locked: its generation, mode and counters.
const INVENTORY_LOCKED: &str = "SELECT generation, stock_mode, total_stock, available_stock, \
     pre_deduct_stock, sold_count FROM product_inventory WHERE product_id = ? FOR UPDATE";

/// A destock's row (binds the request_id; `FOR UPDATE` appended under the inventory
/// row's lock).
const DESTOCK_ROW: &str = "SELECT product_id, quantity, CAST(admin AS CHAR) AS admin, \
     generation, CAST(state AS CHAR) AS state FROM destock_request WHERE request_id = ?";

/// The product's inventory as a destock reads it under the row's lock.
struct Inventory {
    generation: Generation,
    mode: StockMode,
    total: i64,
    available: i64,
    reserved: i64,
    sold: i64,
}

impl Inventory {
    fn of(row: &MySqlRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            generation: rows::generation(row.try_get("generation")?).map_err(undecodable)?,
            mode: rows::stock_mode(row, "stock_mode").map_err(undecodable)?,
            total: row.try_get("total_stock")?,
            available: row.try_get("available_stock")?,
            reserved: row.try_get("pre_deduct_stock")?,
            sold: row.try_get("sold_count")?,
        })
    }

    /// The counters as the operator's log shows them, less `taken` units.
    fn json(&self, taken: i64) -> String {
        serde_json::json!({
            "total": self.total - taken,
            "available": self.available - taken,
            "reserved": self.reserved,
            "sold": self.sold,
        })
        .to_string()
    }
}

/// A destock's row, as recorded.
struct DestockRow {
    product_id: i64,
    quantity: i64,
    admin: String,
    generation: Generation,
    state: String,
}

impl DestockRow {
    fn of(row: &MySqlRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            product_id: row.try_get("product_id")?,
            quantity: row.try_get("quantity")?,
            admin: row.try_get("admin")?,
            generation: rows::generation(row.try_get("generation")?).map_err(undecodable)?,
            state: row.try_get("state")?,
        })
    }

    fn state(&self) -> Result<DestockState, sqlx::Error> {
        match self.state.as_str() {
            "pending" => Ok(DestockState::Pending(self.generation)),
            "taken" => Ok(DestockState::Taken),
            "refused" => Ok(DestockState::Refused),
            other => Err(undecodable(corrupt(format!("destock state {other:?}")))),
        }
    }
}

#[async_trait]
impl Destocks for MysqlLedger {
    async fn record_destock(
        &self,
        action: &AdminAction,
        quantity: i64,
    ) -> Result<Recorded, LedgerError> {
        self.run("record destock", || self.record_once(action, quantity))
            .await
    }

    async fn settle_destock(
        &self,
        destock_id: &RequestId,
        generation: Generation,
        said: GateSaid,
    ) -> Result<DestockState, LedgerError> {
        self.run("settle destock", || {
            self.settle_once(destock_id, generation, said)
        })
        .await
    }

    async fn pending_destocks(&self, limit: usize) -> Result<Vec<PendingDestock>, LedgerError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let pool = &self.pool();
        let found = self
            .run("pending destocks", || {
                sqlx::query(
                    "SELECT request_id, product_id, quantity, generation FROM destock_request \
                     WHERE state = 'pending' ORDER BY created_at LIMIT ?",
                )
                .bind(limit)
                .fetch_all(pool)
            })
            .await?;
        found.iter().map(pending).collect()
    }
}

/// A pending destock's row as the workers take it.
fn pending(r: &MySqlRow) -> Result<PendingDestock, LedgerError> {
    let product_id: i64 = r.try_get("product_id").map_err(crate::sql::db)?;
    Ok(PendingDestock {
        destock_id: RequestId::stored("request_id", &rows::text(r, "request_id")?)
            .map_err(|e| corrupt(e.to_string()))?,
        product_id: ProductId::parse(product_id)
            .map_err(|_| corrupt(format!("destock_request.product_id {product_id}")))?,
        quantity: r.try_get("quantity").map_err(crate::sql::db)?,
        generation: rows::generation(r.try_get("generation").map_err(crate::sql::db)?)?,
    })
}

impl MysqlLedger {
    /// One attempt at recording a destock: a request_id recorded before answers its
    /// state; else, under the inventory row's lock, the intent pending in the product's
    /// generation (gate mode) or settled by the counters (ledger mode).
    async fn record_once(
        &self,
        action: &AdminAction,
        quantity: i64,
    ) -> Result<Recorded, sqlx::Error> {
        if let Some(recorded) = self.destock_recorded(action, quantity).await? {
            return Ok(recorded);
        }
        let mut tx = self.pool().begin().await?;
        let row = sqlx::query(INVENTORY_LOCKED)
            .bind(action.product_id.get())
            .fetch_optional(&mut *tx)
            .await?;
        let Some(row) = row else {
            return Ok(Recorded::NotFound);
        };
        let inventory = Inventory::of(&row)?;
        let inserted = sqlx::query(
            "INSERT INTO destock_request (request_id, product_id, quantity, admin, generation, \
             state) VALUES (?, ?, ?, ?, ?, 'pending')",
        )
        .bind(action.request_id.as_str())
        .bind(action.product_id.get())
        .bind(quantity)
        .bind(action.admin.as_str())
        .bind(inventory.generation.get())
        .execute(&mut *tx)
        .await;
        match inserted {
            Err(e) if is_duplicate(&e) => {
                // A concurrent retry recorded it first.
                tx.rollback().await?;
                let recorded = self.destock_recorded(action, quantity).await?;
                debug_assert!(recorded.is_some(), "a duplicate request_id is recorded");
                return Ok(recorded.unwrap_or(Recorded::Conflict));
            }
            other => other?,
        };
        if inventory.mode == StockMode::Ledger {
            let state = by_counters(&mut tx, action, quantity, &inventory).await?;
            tx.commit().await?;
            return Ok(Recorded::Settled(state));
        }
        tx.commit().await?;
        Ok(Recorded::State(DestockState::Pending(inventory.generation)))
    }

    /// What the ledger has under the destock's request_id: None if nothing; its state if
    /// it is this destock (product and quantity); a conflict if it is another destock or
    /// another action of the operator's log (whose request_ids share one namespace).
    async fn destock_recorded(
        &self,
        action: &AdminAction,
        quantity: i64,
    ) -> Result<Option<Recorded>, sqlx::Error> {
        let row = sqlx::query(DESTOCK_ROW)
            .bind(action.request_id.as_str())
            .fetch_optional(&self.pool())
            .await?;
        if let Some(row) = row {
            let d = DestockRow::of(&row)?;
            let same = d.product_id == action.product_id.get() && d.quantity == quantity;
            return Ok(Some(if same {
                Recorded::State(d.state()?)
            } else {
                Recorded::Conflict
            }));
        }
        // A destock writes its log line only with its own row, so a line without one
        // is another action's.
        let logged: Option<i64> =
            sqlx::query_scalar("SELECT id FROM admin_action WHERE request_id = ?")
                .bind(action.request_id.as_str())
                .fetch_optional(&self.pool())
                .await?;
        Ok(logged.map(|_| Recorded::Conflict))
    }

    /// One attempt at settling a pending destock with what the gate said in
    /// `generation`, under the inventory row's lock, then the destock row's.
    async fn settle_once(
        &self,
        destock_id: &RequestId,
        generation: Generation,
        said: GateSaid,
    ) -> Result<DestockState, sqlx::Error> {
        let product_id: Option<i64> =
            sqlx::query_scalar("SELECT product_id FROM destock_request WHERE request_id = ?")
                .bind(destock_id.as_str())
                .fetch_optional(&self.pool())
                .await?;
        let Some(product_id) = product_id else {
            debug_assert!(false, "only a recorded destock is settled");
            return Err(undecodable(corrupt(format!(
                "destock {destock_id} settled but never recorded"
            ))));
        };
        let mut tx = self.pool().begin().await?;
        let row = sqlx::query(INVENTORY_LOCKED)
            .bind(product_id)
            .fetch_one(&mut *tx)
            .await?;
        let inventory = Inventory::of(&row)?;
        let row = sqlx::query(&format!("{DESTOCK_ROW} FOR UPDATE"))
            .bind(destock_id.as_str())
            .fetch_one(&mut *tx)
            .await?;
        let d = DestockRow::of(&row)?;
        let state = d.state()?;
        if state != DestockState::Pending(generation) {
            // Settled before, or recorded anew in a later generation by another settle:
            // the caller goes on from where it stands.
            return Ok(state);
        }
        let action = AdminAction {
            request_id: destock_id.clone(),
            product_id: ProductId::parse(product_id)
                .map_err(|e| undecodable(corrupt(e.to_string())))?,
            admin: AdminName::parse("admin", &d.admin)
                .map_err(|e| undecodable(corrupt(e.to_string())))?,
        };
        let state = settle_in(&mut tx, &action, &d, &inventory, said).await?;
        tx.commit().await?;
        Ok(state)
    }
}

/// The settle's decision, in `tx` holding both rows' locks: the gate's answer stands
/// while the product is still in the destock's generation and in gate mode (a refusal
/// from an entry a rebuild has since replaced may have been read from lost state); else
/// the counters decide (ledger mode), or the destock waits for a gate that did not
/// answer in its generation, or it is recorded in the product's generation, pending
/// again (the gate was rebuilt without it).
async fn settle_in(
    tx: &mut Transaction<'_, MySql>,
    action: &AdminAction,
    d: &DestockRow,
    inventory: &Inventory,
    said: GateSaid,
) -> Result<DestockState, sqlx::Error> {
    let current = inventory.generation == d.generation && inventory.mode == StockMode::Gate;
    match said {
        GateSaid::Refused if current => {
            mark(tx, &action.request_id, "refused", d.generation).await?;
            Ok(DestockState::Refused)
        }
        GateSaid::Taken if current => {
            // The gate took the units from its count, which never exceeds the ledger's
            // available units in the same generation (holds in flight, releases and
            // restocks not yet in the gate are counted available here).
            let taken = take(tx, action, d.quantity, inventory).await?;
            debug_assert!(taken, "the ledger has the units the gate took");
            if !taken {
                return Err(undecodable(corrupt(format!(
                    "destock {}: the gate took {} units the ledger does not have available",
                    action.request_id, d.quantity
                ))));
            }
            Ok(DestockState::Taken)
        }
        _ if inventory.mode == StockMode::Ledger => {
            by_counters(tx, action, d.quantity, inventory).await
        }
        GateSaid::Unreachable if inventory.generation == d.generation => {
            Ok(DestockState::Pending(d.generation))
        }
        _ => {
            debug_assert!(
                inventory.generation != d.generation,
                "the gate is never in a newer generation than the ledger"
            );
            mark(tx, &action.request_id, "pending", inventory.generation).await?;
            Ok(DestockState::Pending(inventory.generation))
        }
    }
}

/// Settles a destock by the ledger's counters alone (ledger mode): taken if that many
/// units are available, else refused.
async fn by_counters(
    tx: &mut Transaction<'_, MySql>,
    action: &AdminAction,
    quantity: i64,
    inventory: &Inventory,
) -> Result<DestockState, sqlx::Error> {
    if take(tx, action, quantity, inventory).await? {
        Ok(DestockState::Taken)
    } else {
        mark(tx, &action.request_id, "refused", inventory.generation).await?;
        Ok(DestockState::Refused)
    }
}

/// Takes the units off the counters if that many are available (false: nothing was
/// written), with the destock's state, its stock-log row, the operator's log line and
/// its event.
async fn take(
    tx: &mut Transaction<'_, MySql>,
    action: &AdminAction,
    quantity: i64,
    inventory: &Inventory,
) -> Result<bool, sqlx::Error> {
    let updated = sqlx::query(
        "UPDATE product_inventory SET total_stock = total_stock - ?, \
         available_stock = available_stock - ?, version = version + 1 \
         WHERE product_id = ? AND available_stock >= ?",
    )
    .bind(quantity)
    .bind(quantity)
    .bind(action.product_id.get())
    .bind(quantity)
    .execute(&mut **tx)
    .await?;
    if updated.rows_affected() != 1 {
        return Ok(false);
    }
    mark(tx, &action.request_id, "taken", inventory.generation).await?;
    sqlx::query(
        "INSERT INTO inventory_log (request_id, product_id, quantity, type) \
         VALUES (?, ?, ?, 'destock')",
    )
    .bind(action.request_id.as_str())
    .bind(action.product_id.get())
    .bind(quantity)
    .execute(&mut **tx)
    .await?;
    let line = Line {
        action: "destock",
        asked: Some(serde_json::json!({ "quantity": quantity }).to_string()),
        event: Some(EventType::ProductDestocked),
        before: inventory.json(0),
        after: inventory.json(quantity),
    };
    log(tx, action, &line).await?;
    Ok(true)
}

/// Sets a destock's state and generation (settled: its settle time too).
async fn mark(
    tx: &mut Transaction<'_, MySql>,
    destock_id: &RequestId,
    state: &str,
    generation: Generation,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE destock_request SET state = ?, generation = ?, \
         settled_at = IF(? = 'pending', NULL, NOW(6)) WHERE request_id = ?",
    )
    .bind(state)
    .bind(generation.get())
    .bind(state)
    .bind(destock_id.as_str())
    .execute(&mut **tx)
    .await?;
    Ok(())
}
