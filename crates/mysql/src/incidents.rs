//! The ledger's side of a person's queue: the recovery incidents listed, one read, and
//! one closed with a decision (`recovery_incident`, migrations 2 and 19).

use flashsale_app::ports::{Incident, IncidentClosed, IncidentClosing};
use flashsale_app::LedgerError;
use flashsale_core::{ProductId, RequestId};
use sqlx::mysql::MySqlRow;
use sqlx::Row;

use crate::ledger::MysqlLedger;
use crate::rows::{corrupt, opt_text, text};
use crate::sql::db;

/// The columns an [`Incident`] is read from.
const COLUMNS: &str = "id, request_id, product_id, kind, detail, created_at, resolved_at, \
                       decision, resolved_by, note";
/// Longest note or name stored: the columns' widths.
const NOTE_MAX: usize = 1000;
const BY_MAX: usize = 64;

fn incident(row: &MySqlRow) -> Result<Incident, LedgerError> {
    let request_id = text(row, "request_id")?;
    let closed = match row.try_get("resolved_at").map_err(db)? {
        None => None,
        Some(at) => {
            let closing = match opt_text(row, "decision")? {
                None => None,
                Some(decision) => Some(IncidentClosing {
                    decision,
                    by: opt_text(row, "resolved_by")?.unwrap_or_default(),
                    note: opt_text(row, "note")?.unwrap_or_default(),
                }),
            };
            Some(IncidentClosed { at, closing })
        }
    };
    Ok(Incident {
        id: row.try_get("id").map_err(db)?,
        request_id: RequestId::stored("request_id", &request_id).map_err(corrupt)?,
        product_id: ProductId::parse(row.try_get("product_id").map_err(db)?).map_err(corrupt)?,
        kind: text(row, "kind")?,
        detail: text(row, "detail")?,
        created_at: row.try_get("created_at").map_err(db)?,
        closed,
    })
}

impl MysqlLedger {
    pub(crate) async fn incidents_at(
        &self,
        open_only: bool,
        limit: usize,
    ) -> Result<Vec<Incident>, LedgerError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM recovery_incident \
             WHERE (? = 0 OR resolved_at IS NULL) ORDER BY id DESC LIMIT ?"
        );
        let rows = self
            .run("list incidents", || async {
                sqlx::query(&sql)
                    .bind(i32::from(open_only))
                    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                    .fetch_all(&self.pool())
                    .await
            })
            .await?;
        rows.iter().map(incident).collect()
    }

    pub(crate) async fn incident_at(&self, id: i64) -> Result<Option<Incident>, LedgerError> {
        let sql = format!("SELECT {COLUMNS} FROM recovery_incident WHERE id = ?");
        let row = self
            .run("read an incident", || async {
                sqlx::query(&sql)
                    .bind(id)
                    .fetch_optional(&self.pool())
                    .await
            })
            .await?;
        row.as_ref().map(incident).transpose()
    }

    pub(crate) async fn close_incident_at(
        &self,
        id: i64,
        closing: &IncidentClosing,
    ) -> Result<bool, LedgerError> {
        let note: String = closing.note.chars().take(NOTE_MAX).collect();
        let by: String = closing.by.chars().take(BY_MAX).collect();
        let done = self
            .run("close an incident", || async {
                sqlx::query(
                    "UPDATE recovery_incident SET resolved_at = COALESCE(resolved_at, NOW(6)), \
                     decision = ?, resolved_by = ?, note = ? WHERE id = ? AND decision IS NULL",
                )
                .bind(&closing.decision)
                .bind(&by)
                .bind(&note)
                .bind(id)
                .execute(&self.pool())
                .await
            })
            .await?;
        Ok(done.rows_affected() == 1)
    }
}
