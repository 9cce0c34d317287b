//! Which form the ledger's purchase keys take (`request_scope`, migration 31) and the
//! rewrite of every key from one form to the other (`flashsale ledger rescope`).
//!
//! A purchase's key is the client's request_id as sent ([`RequestScope::Global`]) or
//! `{user_id}/{request_id}` ([`RequestScope::Buyer`]). One ledger holds one form: an
//! instance writing the other would miss a retry's first attempt and make it a second
//! purchase, so `serve` refuses to start against a ledger of the other form.

use flashsale_app::LedgerError;
use flashsale_core::RequestScope;
use sqlx::{MySql, Row, Transaction};

use crate::ledger::MysqlLedger;
use crate::rows::{corrupt, text};
use crate::sql::{db, is_duplicate};

/// The events a purchase writes, keyed by its request_id. A `stock_repaired` event is
/// keyed by its repair's id, never scoped.
const PURCHASE_EVENTS: &str =
    "('order_created', 'order_paid', 'order_cancelled', 'reservation_released')";

/// Packs rewritten per statement: each is a batch's events (at most 256), so a chunk
/// stays a few MB of JSON however many packs the outbox holds.
const PACKS_PER_CHUNK: i64 = 500;

/// What a rescope changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rescoped {
    /// Purchases (reservations) whose key was rewritten.
    pub purchases: u64,
    /// Outbox rows rewritten: single events and packs.
    pub events: u64,
    /// Products whose stock generation moved on, so that their gate is rebuilt.
    pub products: u64,
}

/// One key's rewrite, as SQL over its column `col` and the buyer's `user`.
fn rewritten(to: RequestScope, col: &str, user: &str) -> String {
    match to {
        RequestScope::Buyer => format!("CONCAT({user}, '/', {col})"),
        RequestScope::Global => format!("SUBSTRING({col}, LOCATE('/', {col}) + 1)"),
    }
}

/// Keys that are not in `to`'s form yet.
fn pending(to: RequestScope, col: &str) -> String {
    match to {
        RequestScope::Buyer => format!("{col} NOT LIKE '%/%'"),
        RequestScope::Global => format!("{col} LIKE '%/%'"),
    }
}

impl MysqlLedger {
    /// The scope the ledger recorded, without recording one: None on a ledger no
    /// instance has served yet.
    pub async fn recorded_scope(&self) -> Result<Option<RequestScope>, LedgerError> {
        let raw: Option<String> = self
            .run("read the request scope", || async {
                sqlx::query_scalar(
                    "SELECT CONVERT(scope USING utf8mb4) FROM request_scope WHERE id = 1",
                )
                .fetch_optional(&self.pool())
                .await
            })
            .await?;
        raw.map(|raw| {
            RequestScope::from_stored(&raw).ok_or_else(|| corrupt(format!("request scope {raw:?}")))
        })
        .transpose()
    }

    /// The ledger's scope. A ledger that has none yet (created by this version, with no
    /// purchase before migration 31) takes `wanted`: the first instance to start decides.
    pub async fn request_scope(&self, wanted: RequestScope) -> Result<RequestScope, LedgerError> {
        self.run("record the request scope", || async {
            sqlx::query("INSERT IGNORE INTO request_scope (id, scope) VALUES (1, ?)")
                .bind(wanted.as_str())
                .execute(&self.pool())
                .await
        })
        .await?;
        self.recorded_scope()
            .await?
            .ok_or_else(|| corrupt("no request scope after recording one"))
    }

    /// Rewrites every purchase key into `to`'s form in one transaction, and moves every
    /// product's stock generation on: the gate's hold records carry the old keys, so it
    /// is rebuilt from the ledger when an instance next starts. Run with every instance
    /// stopped. Two buyers' keys that would become one (going back to `Global` after
    /// two buyers used the same request_id) refuse the whole rewrite, changing nothing.
    pub async fn rescope(&self, to: RequestScope) -> Result<Rescoped, LedgerError> {
        let mut tx = self.pool().begin().await.map_err(db)?;
        let mut done = Rescoped {
            events: rescope_events(&mut tx, to).await?,
            ..Rescoped::default()
        };
        done.purchases = rescope_purchases(&mut tx, to).await?;
        done.products = sqlx::query("UPDATE product_inventory SET generation = generation + 1")
            .execute(&mut *tx)
            .await
            .map_err(db)?
            .rows_affected();
        sqlx::query("REPLACE INTO request_scope (id, scope, changed_at) VALUES (1, ?, NOW(6))")
            .bind(to.as_str())
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        tx.commit().await.map_err(db)?;
        Ok(done)
    }
}

/// The stock log, the incidents, the orders and last the reservations, whose old keys
/// the others are matched by. Returns the reservations rewritten.
async fn rescope_purchases(
    tx: &mut Transaction<'_, MySql>,
    to: RequestScope,
) -> Result<u64, LedgerError> {
    let by_reservation = |table: &str, alias: &str, filter: &str| {
        format!(
            "UPDATE {table} {alias} JOIN inventory_reservation r \
             ON r.request_id = {alias}.request_id{filter} \
             SET {alias}.request_id = {} WHERE {}",
            rewritten(to, &format!("{alias}.request_id"), "r.user_id"),
            pending(to, &format!("{alias}.request_id")),
        )
    };
    // A restock's log row is keyed by an admin's request_id, never scoped.
    let statements = [
        by_reservation(
            "inventory_log",
            "l",
            " AND l.type IN ('reserve', 'confirm', 'release')",
        ),
        by_reservation("recovery_incident", "i", ""),
        format!(
            "UPDATE orders SET request_id = {} WHERE {}",
            rewritten(to, "request_id", "user_id"),
            pending(to, "request_id")
        ),
    ];
    for sql in statements {
        execute(tx, &sql).await?;
    }
    execute(
        tx,
        &format!(
            "UPDATE inventory_reservation SET request_id = {} WHERE {}",
            rewritten(to, "request_id", "user_id"),
            pending(to, "request_id")
        ),
    )
    .await
}

/// One statement of the rewrite. A duplicate key is two buyers' keys becoming one.
async fn execute(tx: &mut Transaction<'_, MySql>, sql: &str) -> Result<u64, LedgerError> {
    match sqlx::query(sql).execute(&mut **tx).await {
        Ok(done) => Ok(done.rows_affected()),
        Err(e) if is_duplicate(&e) => Err(LedgerError::rejected(format!(
            "two buyers used the same request_id, and one namespace cannot hold both: {e}"
        ))),
        Err(e) => Err(db(e)),
    }
}

/// The outbox: a single event's key column and payload, and each event inside a pack.
async fn rescope_events(
    tx: &mut Transaction<'_, MySql>,
    to: RequestScope,
) -> Result<u64, LedgerError> {
    let new = rewritten(to, "o.request_id", "r.user_id");
    let single = format!(
        "UPDATE outbox o JOIN inventory_reservation r ON r.request_id = o.request_id \
         AND o.event_type IN {PURCHASE_EVENTS} \
         SET o.payload = JSON_SET(o.payload, '$.request_id', {new}), o.request_id = {new} \
         WHERE {}",
        pending(to, "o.request_id")
    );
    let mut rows = execute(tx, &single).await?;
    let mut after = 0_i64;
    loop {
        let packs = sqlx::query(
            "SELECT id, payload FROM outbox WHERE request_id IS NULL AND id > ? \
             ORDER BY id LIMIT ?",
        )
        .bind(after)
        .bind(PACKS_PER_CHUNK)
        .fetch_all(&mut **tx)
        .await
        .map_err(db)?;
        let Some(last) = packs.last() else {
            return Ok(rows);
        };
        after = last.try_get("id").map_err(db)?;
        for pack in &packs {
            rows += rescope_pack(tx, to, pack).await?;
        }
    }
}

/// One pack: each event's `request_id` rewritten by its own `user_id`.
async fn rescope_pack(
    tx: &mut Transaction<'_, MySql>,
    to: RequestScope,
    pack: &sqlx::mysql::MySqlRow,
) -> Result<u64, LedgerError> {
    let id: i64 = pack.try_get("id").map_err(db)?;
    let payload = text(pack, "payload")?;
    let mut events: Vec<serde_json::Value> =
        serde_json::from_str(&payload).map_err(|e| corrupt(format!("pack {id}: {e}")))?;
    let mut changed = false;
    for event in &mut events {
        let user = event.get("user_id").and_then(serde_json::Value::as_i64);
        let key = event.get("request_id").and_then(serde_json::Value::as_str);
        let (Some(user), Some(key)) = (user, key) else {
            return Err(corrupt(format!("pack {id}: an event without its keys")));
        };
        let new = match (to, key.split_once('/')) {
            (RequestScope::Buyer, None) => format!("{user}/{key}"),
            (RequestScope::Global, Some((_, client))) => client.to_owned(),
            _ => continue,
        };
        event["request_id"] = serde_json::Value::String(new);
        changed = true;
    }
    if !changed {
        return Ok(0);
    }
    let payload = serde_json::to_string(&events).map_err(|e| corrupt(format!("pack {id}: {e}")))?;
    sqlx::query("UPDATE outbox SET payload = ? WHERE id = ?")
        .bind(payload)
        .bind(id)
        .execute(&mut **tx)
        .await
        .map_err(db)?;
    Ok(1)
}
