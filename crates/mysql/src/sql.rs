//! What every part of the ledger adapter shares about talking to MariaDB: the session
//! settings of a connection, its errors by what happened (and the error numbers acted
//! on), and the retry of a statement or transaction that met a deadlock. A leaf: it
//! imports nothing of the adapter, so that `ledger.rs`, `group.rs`, `outbox.rs`,
//! `rows.rs` and `dedicated.rs` share it without importing each other for it.

use std::future::Future;
use std::time::Duration;

use flashsale_app::ports::ErrorKind;
use flashsale_app::LedgerError;
use sqlx::mysql::MySqlDatabaseError;
use sqlx::{Executor, MySqlConnection};
use tracing::warn;

/// How long a session waits for a row lock before InnoDB gives up (seconds): the default
/// 50 s would hold a purchase far past any client's patience.
const LOCK_WAIT_TIMEOUT_SECS: u32 = 5;

/// A ledger operation (retries included) slower than this is logged as a warning: far
/// above a healthy one (milliseconds), so it points at a database in trouble.
pub(crate) const SLOW_OPERATION: Duration = Duration::from_secs(1);

/// Runs `f` (one statement or one transaction) within `deadline`, retrying deadlocks and
/// lock wait timeouts up to `attempts` times in all, the first pause `pause` and each
/// further one twice the last; warns about an operation slower than
/// [`SLOW_OPERATION`]. The ledger's transactions and the outbox's statements both go
/// through it, with limits of their own.
pub(crate) async fn retried<T, F, Fut>(
    what: &'static str,
    deadline: Duration,
    attempts: u32,
    mut pause: Duration,
    mut f: F,
) -> Result<T, LedgerError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    let started = std::time::Instant::now();
    let all = async {
        let mut attempt = 1;
        loop {
            let outcome = f().await;
            let elapsed = started.elapsed();
            if elapsed >= SLOW_OPERATION {
                warn!(
                    what,
                    attempt,
                    ?elapsed,
                    ok = outcome.is_ok(),
                    "slow ledger operation"
                );
            }
            match outcome {
                Ok(value) => return Ok(value),
                Err(e) if is_retryable(&e) && attempt < attempts => {
                    warn!(what, attempt, error = %e, "retried");
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                    attempt += 1;
                }
                Err(e) => return Err(db(e)),
            }
        }
    };
    tokio::time::timeout(deadline, all)
        .await
        .map_err(|_| LedgerError::timed_out(format!("{what}: no answer within the deadline")))?
}

/// MariaDB's error numbers the adapter acts on: a unique key taken, the two lock
/// conflicts a transaction is retried after (on Galera a certification failure at
/// COMMIT is a deadlock too: the transaction was rolled back), and a Galera node that
/// takes no statements.
const ER_DUP_ENTRY: u16 = 1062;
const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;
const ER_LOCK_DEADLOCK: u16 = 1213;
/// A Galera node outside the Primary component, or not yet synced, refuses every
/// statement with this (`WSREP has not yet prepared node for application use`).
const ER_WSREP_NOT_READY: u16 = 1047;

/// The database's own error number of `e`, if the database answered it.
fn error_number(e: &sqlx::Error) -> Option<u16> {
    e.as_database_error()
        .and_then(|d| d.try_downcast_ref::<MySqlDatabaseError>())
        .map(MySqlDatabaseError::number)
}

/// What a connection's session needs beyond the ledger's usual settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Session {
    /// One MariaDB.
    Plain,
    /// A node of a Galera cluster: every read (and every transaction's BEGIN) first waits
    /// until the node has applied every writeset the cluster certified before it
    /// (`wsrep_sync_wait = 1`). A node applies others' writesets a moment after they
    /// commit, and right after a switch of writer the new one may not have applied the
    /// old one's last commits: a lookup by request_id, a fence's or recovery's read
    /// would otherwise miss an order that exists.
    CausalReads,
}

/// The session settings of every connection of the ledger, pooled or dedicated.
pub(crate) async fn prepare_session(
    conn: &mut MySqlConnection,
    session: Session,
) -> Result<(), sqlx::Error> {
    // READ COMMITTED: no gap locks, so concurrent inserts of distinct request_ids don't
    // deadlock; every decision is a conditional UPDATE or a unique key anyway, never a
    // snapshot read.
    let causal = match session {
        Session::Plain => "",
        Session::CausalReads => ", SESSION wsrep_sync_wait = 1",
    };
    conn.execute(
        format!(
            "SET SESSION tx_isolation = 'READ-COMMITTED', \
             SESSION innodb_lock_wait_timeout = {LOCK_WAIT_TIMEOUT_SECS}{causal}"
        )
        .as_str(),
    )
    .await?;
    Ok(())
}

/// A unique key already taken (a request_id, a hold id, an event id).
pub(crate) fn is_duplicate(e: &sqlx::Error) -> bool {
    error_number(e) == Some(ER_DUP_ENTRY)
}

/// The unique key a duplicate-entry error names: the last quoted name of MariaDB's
/// `Duplicate entry '<value>' for key '<key>'` (MySQL 8 writes `<table>.<key>`), read from
/// the message's end. Not a search of the whole message: the value comes first, and a
/// request_id may spell a key's name (`uk_reservation_hold` is a valid one); it cannot
/// hold the quote and the space that end it, so the tail is always the key's.
pub(crate) fn duplicate_key(e: &sqlx::Error) -> Option<&str> {
    if !is_duplicate(e) {
        return None;
    }
    let message = e.as_database_error()?.message();
    let (_, key) = message.rsplit_once(" for key '")?;
    let key = key.strip_suffix('\'')?;
    Some(key.rsplit_once('.').map_or(key, |(_, name)| name))
}

/// A deadlock or a lock wait timeout: the transaction was rolled back and may be tried
/// again.
pub(crate) fn is_retryable(e: &sqlx::Error) -> bool {
    matches!(
        error_number(e),
        Some(ER_LOCK_DEADLOCK | ER_LOCK_WAIT_TIMEOUT)
    )
}

/// `d` in whole microseconds for an `INTERVAL … MICROSECOND`, at most `i64::MAX`.
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// An sqlx error by what happened: no connection (the database unreachable, or none
/// free in time), lock conflicts (deadlocks, lock waits: what retries are for), an
/// error the database answered, a row or value that does not decode, a bad setting.
pub(crate) fn db(e: sqlx::Error) -> LedgerError {
    use sqlx::Error as E;
    let kind = match &e {
        E::Io(_) | E::Tls(_) | E::PoolTimedOut => ErrorKind::Unreachable,
        E::PoolClosed | E::WorkerCrashed => ErrorKind::Stopped,
        E::Database(_) if is_retryable(&e) => ErrorKind::Contention,
        // The node cannot take statements: to the caller it is a writer out of reach,
        // and a refused COMMIT's outcome is unknown as a lost connection's is.
        E::Database(_) if error_number(&e) == Some(ER_WSREP_NOT_READY) => ErrorKind::Unreachable,
        E::Protocol(_)
        | E::RowNotFound
        | E::TypeNotFound { .. }
        | E::ColumnIndexOutOfBounds { .. }
        | E::ColumnNotFound(_)
        | E::ColumnDecode { .. }
        | E::Decode(_) => ErrorKind::Corrupt,
        E::Configuration(_) => ErrorKind::Config,
        _ => ErrorKind::Rejected,
    };
    LedgerError::caused(kind, "MariaDB", e)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks how sqlx's errors are classified, by building each and reading the kind:
    // no connection (I/O, none free in time) is unreachable, a closed pool stopped, a
    // row or value that does not decode corrupt, a bad setting config; the text keeps
    // sqlx's own.
    #[test]
    fn sqlx_errors_are_typed_by_what_happened() {
        let io = || std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        for (e, kind) in [
            (sqlx::Error::Io(io()), ErrorKind::Unreachable),
            (sqlx::Error::PoolTimedOut, ErrorKind::Unreachable),
            (sqlx::Error::PoolClosed, ErrorKind::Stopped),
            (sqlx::Error::RowNotFound, ErrorKind::Corrupt),
            (sqlx::Error::Decode("bad".into()), ErrorKind::Corrupt),
            (sqlx::Error::Configuration("bad".into()), ErrorKind::Config),
        ] {
            let text = e.to_string();
            let typed = db(e);
            assert_eq!(typed.kind(), kind, "{text}");
            assert!(typed.to_string().ends_with(&text), "{typed}");
        }
    }
}
