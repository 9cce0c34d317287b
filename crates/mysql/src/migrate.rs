//! The schema's migrations, one instance at a time, on one MariaDB or a Galera cluster.
//!
//! sqlx's migrator serializes concurrent instances with `GET_LOCK`, which a Galera node
//! answers with NULL: the lock is not supported there, and even where it is it would lock
//! one node only. On a cluster the migrator runs without it, under a lock of the ledger's
//! own: a row in `flashsale_migration_lock`, taken by an INSERT against its primary key.
//! An INSERT replicates like any write, so two instances taking it through two nodes meet
//! at certification (or at the key), and one of them waits. Migrations run through the
//! writer (`writer.rs`) like every other statement.
//!
//! A holder that died leaves its row: after [`LOCK_STALE`] it is taken over. Each
//! migration is recorded in `_sqlx_migrations` under its version (a primary key too)
//! before its DDL runs, so even a takeover from a holder that was only slow cannot apply
//! one migration twice: the second instance meets the key, and its next start finds the
//! migration applied.

use std::time::{Duration, Instant};

use flashsale_app::ports::ErrorKind;
use flashsale_app::LedgerError;
use sqlx::MySqlPool;
use tracing::{info, warn};

use crate::sql::{db, is_duplicate, is_retryable};

/// How long a lock row stands before another instance takes it over: ten times the
/// longest run of every migration here (a few seconds on an empty database); a holder
/// that has not finished by then has died.
const LOCK_STALE: Duration = Duration::from_secs(120);
/// Longest wait for another instance's migrations: past it the start fails (and the
/// server's start retries), naming the holder.
const LOCK_WAIT_MAX: Duration = Duration::from_secs(60);
/// Pause between two tries of a taken lock.
const LOCK_POLL: Duration = Duration::from_millis(250);

/// Runs the migrations that are not applied yet: under sqlx's `GET_LOCK` on one node,
/// under the lock row on a cluster.
pub(crate) async fn run(pool: &MySqlPool, cluster: bool) -> Result<(), LedgerError> {
    let mut migrator = sqlx::migrate!("./migrations");
    if !cluster {
        return migrator.run(pool).await.map_err(failed);
    }
    migrator.set_locking(false);
    let holder = uuid::Uuid::now_v7().to_string();
    take(pool, &holder).await?;
    let outcome = migrator.run(pool).await.map_err(failed);
    if let Err(e) = release(pool, &holder).await {
        // The row then stands until it is stale: another instance's start waits for it.
        warn!(error = %e, "could not release the migration lock");
    }
    outcome
}

fn failed(e: sqlx::migrate::MigrateError) -> LedgerError {
    LedgerError::caused(ErrorKind::Rejected, "migration failed", e)
}

/// Takes the lock row, waiting (bounded) while another instance holds it.
async fn take(pool: &MySqlPool, holder: &str) -> Result<(), LedgerError> {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS flashsale_migration_lock (\
         id TINYINT NOT NULL PRIMARY KEY, \
         holder VARCHAR(64) NOT NULL, \
         taken_at DATETIME(6) NOT NULL) ENGINE = InnoDB",
    )
    .execute(pool)
    .await
    .map_err(db)?;
    let started = Instant::now();
    loop {
        sqlx::query(
            "DELETE FROM flashsale_migration_lock \
             WHERE id = 1 AND taken_at < NOW(6) - INTERVAL ? MICROSECOND",
        )
        .bind(crate::sql::micros(LOCK_STALE))
        .execute(pool)
        .await
        .map_err(db)?;
        let taken = sqlx::query("INSERT INTO flashsale_migration_lock VALUES (1, ?, NOW(6))")
            .bind(holder)
            .execute(pool)
            .await;
        match taken {
            Ok(_) => {
                info!(holder, "migration lock taken");
                return Ok(());
            }
            // Held by another instance, or taken through another node at the same moment.
            Err(e) if is_duplicate(&e) || is_retryable(&e) => {}
            Err(e) => return Err(db(e)),
        }
        if started.elapsed() >= LOCK_WAIT_MAX {
            let other: Option<String> =
                sqlx::query_scalar("SELECT holder FROM flashsale_migration_lock WHERE id = 1")
                    .fetch_optional(pool)
                    .await
                    .map_err(db)?;
            return Err(LedgerError::timed_out(format!(
                "another instance ({}) has held the migration lock for over {LOCK_WAIT_MAX:?}",
                other.as_deref().unwrap_or("gone since")
            )));
        }
        tokio::time::sleep(LOCK_POLL).await;
    }
}

async fn release(pool: &MySqlPool, holder: &str) -> Result<(), LedgerError> {
    sqlx::query("DELETE FROM flashsale_migration_lock WHERE id = 1 AND holder = ?")
        .bind(holder)
        .execute(pool)
        .await
        .map_err(db)
        .map(drop)
}
