//! The bare SQL run (`--sql`, and `--compare`'s `sql-conditional` row): db-conditional's
//! purchase transaction with no HTTP and no server, the floor under every database
//! strategy. The bench itself holds connections to the spawned server's database (the
//! server created the product and was stopped) and sends each attempt as one `CALL
//! baseline_conditional(…)` — the stored procedure the db-conditional server calls
//! (migration `…12_baseline_procedures.sql`): the conditional UPDATE of the product's
//! row, the order's INSERT and the COMMIT, in one round trip. The load around it is
//! `load.rs`'s, unchanged: the same attempts, users and request_ids, client retries
//! included, and the same re-sends after a failure; the answers are recorded as the
//! server would have answered (201 a new order, 200 a replay, 409 sold_out, 503 a
//! database error, no answer a lost connection).

use std::str::FromStr;
use std::sync::Mutex;
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::{ConnectOptions, Connection, Executor, Row};
use tokio::sync::Semaphore;

/// Concurrent clients of the SQL run by default: `--connections` (the HTTP rows'), but at
/// most this many. Measured on the 2-core box (commit 60906e0, `flashsale-bench sustained
/// --spawn --sql --attempts 40000 --stock 50000 --users 20000 --sql-clients N`, three
/// alternating pairs): 16 clients 6,488 / 4,938 / 4,341 transactions/s at a p50 of
/// 2.4–3.4 ms, 64 clients 4,267 / 4,099 / 3,362 at 15–18 ms, MariaDB's CPU per
/// transaction 205–267 against 307–321 µs. Past about 16 the extra clients only queue on
/// the product row's lock, each a MariaDB thread to switch to and wake; 16 is also a
/// server's pool by default (`FLASHSALE_DATABASE_MAX_CONNECTIONS`).
pub const CLIENTS_MAX: u64 = 16;
/// The payment timeout of the orders the SQL run creates when the bench does not set the
/// server's: the server's own default (`FLASHSALE_PAYMENT_TIMEOUT`, docs/configuration.md).
pub const SERVER_PAYMENT_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// db-conditional's transaction, as its server sends it (`crates/mysql/src/baseline.rs`):
/// prepared once per connection (sqlx's statement cache), then one round trip each.
const CALL: &str = "CALL baseline_conditional(?, ?, ?, ?, ?)";
/// How long a session waits for a row lock before InnoDB gives up (seconds): the server's
/// ledger sessions' setting, so the floor's transactions wait as the server's do.
const LOCK_WAIT_TIMEOUT_SECS: u32 = 5;
/// Bound on opening one connection (127.0.0.1: a slow connect is a stuck server).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on one CALL: far above a healthy one (milliseconds), below the HTTP client's
/// deadline for an exchange (`load::CLIENT_TIMEOUT`), so the two loads give up alike.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// How many clients the SQL run uses for `args`.
pub fn clients(args: &crate::cli::Args) -> u64 {
    args.sql_clients
        .unwrap_or_else(|| args.connections.min(CLIENTS_MAX))
}

/// One purchase attempt, as the body of a `POST /v1/purchases` would carry it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Purchase {
    pub request_id: String,
    pub user_id: i64,
    pub product_id: i64,
    pub quantity: u32,
}

/// What one CALL came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A new order, its id.
    Created(i64),
    /// The request_id's existing order (a replay).
    Replay(i64),
    SoldOut,
    /// MariaDB answered with an error (a lock wait timeout, a deadlock, …).
    Refused(String),
    /// No answer: the connection failed, or the CALL outlived `CALL_TIMEOUT`.
    Lost(String),
}

/// The SQL run's connections to the server's database: one per client, each used by one
/// CALL at a time. Not sqlx's pool: it pings every connection it takes back (a second
/// round trip per transaction, and MariaDB's CPU), which the floor must not pay.
pub struct SqlTarget {
    options: MySqlConnectOptions,
    idle: Mutex<Vec<MySqlConnection>>,
    /// One permit per connection: a CALL waits for a free one.
    free: Semaphore,
    timeout_us: i64,
    name: String,
}

impl SqlTarget {
    /// Opens `clients` connections to `database_url` (before the load: connecting is not
    /// measured), their sessions set as the server's are, for orders that expire after
    /// `payment_timeout`.
    pub async fn connect(
        database_url: &str,
        clients: u64,
        payment_timeout: Duration,
    ) -> Result<Self, String> {
        let options = MySqlConnectOptions::from_str(database_url)
            .map_err(|e| format!("database URL: {e}"))?
            .disable_statement_logging()
            // The server's sessions are UTC too (`MysqlLedger::connect`).
            .timezone(Some(String::from("+00:00")));
        let clients = usize::try_from(clients).map_err(|_| "too many SQL clients".to_owned())?;
        let mut idle = Vec::with_capacity(clients);
        for _ in 0..clients {
            idle.push(open(&options).await?);
        }
        let (server, database, _) = crate::probes::split_database_url(database_url)?;
        Ok(SqlTarget {
            options,
            idle: Mutex::new(idle),
            free: Semaphore::new(clients.max(1)),
            timeout_us: i64::try_from(payment_timeout.as_micros()).unwrap_or(i64::MAX),
            name: format!(
                "{}/{database} (CALL baseline_conditional)",
                without_password(&server)
            ),
        })
    }

    /// What the report names the target: the database, without any password.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// One attempt: one CALL on a free connection.
    pub async fn purchase(&self, p: &Purchase) -> Answer {
        let Ok(_permit) = self.free.acquire().await else {
            return Answer::Lost("the SQL target was closed".into());
        };
        let taken = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut conn = match taken {
            Some(conn) => conn,
            // Its connection was lost on an earlier attempt: a new one.
            None => match open(&self.options).await {
                Ok(conn) => conn,
                Err(e) => return Answer::Lost(e),
            },
        };
        let called = tokio::time::timeout(CALL_TIMEOUT, async {
            sqlx::query(CALL)
                .bind(p.request_id.as_str())
                .bind(p.user_id)
                .bind(p.product_id)
                .bind(p.quantity)
                .bind(self.timeout_us)
                .fetch_all(&mut conn)
                .await
        })
        .await;
        let answer = match called {
            Err(_) => return Answer::Lost(format!("no answer within {CALL_TIMEOUT:?}")),
            Ok(Ok(rows)) => match rows.as_slice() {
                [row] => decode(row),
                _ => Answer::Refused(format!("{} rows instead of one", rows.len())),
            },
            Ok(Err(sqlx::Error::Database(e))) => Answer::Refused(e.to_string()),
            // The connection is in no known state: dropped, a new one next time.
            Ok(Err(e)) => return Answer::Lost(e.to_string()),
        };
        self.idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(conn);
        answer
    }

    /// Closes every idle connection (each with a goodbye to the server).
    pub async fn close(&self) {
        self.free.close();
        let idle = std::mem::take(&mut *self.idle.lock().unwrap_or_else(|e| e.into_inner()));
        for conn in idle {
            let _ = tokio::time::timeout(CONNECT_TIMEOUT, conn.close()).await;
        }
    }
}

/// The procedure's one row, by position (a prepared CALL's result set has no column
/// names in sqlx): the outcome, then for an order its id.
fn decode(row: &sqlx::mysql::MySqlRow) -> Answer {
    let outcome: Result<String, _> = row.try_get_unchecked(0);
    match outcome.as_deref() {
        Ok("created") => row
            .try_get::<i64, _>(1)
            .map_or_else(|e| Answer::Refused(e.to_string()), Answer::Created),
        Ok("replay") => row
            .try_get::<i64, _>(1)
            .map_or_else(|e| Answer::Refused(e.to_string()), Answer::Replay),
        Ok("sold_out") => Answer::SoldOut,
        Ok(other) => Answer::Refused(format!("unknown outcome {other:?}")),
        Err(e) => Answer::Refused(e.to_string()),
    }
}

/// One connection, its session as the server's ledger sets its own
/// (`flashsale_mysql::ledger::prepare_session`): READ COMMITTED, and the same lock wait.
async fn open(options: &MySqlConnectOptions) -> Result<MySqlConnection, String> {
    let mut conn = tokio::time::timeout(CONNECT_TIMEOUT, MySqlConnection::connect_with(options))
        .await
        .map_err(|_| format!("connecting to MariaDB: no answer within {CONNECT_TIMEOUT:?}"))?
        .map_err(|e| format!("connecting to MariaDB: {e}"))?;
    conn.execute(
        format!(
            "SET SESSION tx_isolation = 'READ-COMMITTED', \
             SESSION innodb_lock_wait_timeout = {LOCK_WAIT_TIMEOUT_SECS}"
        )
        .as_str(),
    )
    .await
    .map_err(|e| format!("setting up the MariaDB session: {e}"))?;
    Ok(conn)
}

/// `mysql://user:secret@host` as `mysql://user@host`.
fn without_password(server: &str) -> String {
    let Some((scheme, rest)) = server.split_once("://") else {
        return server.to_owned();
    };
    match rest.rsplit_once('@') {
        Some((user, host)) => {
            let user = user.split_once(':').map_or(user, |(name, _)| name);
            format!("{scheme}://{user}@{host}")
        }
        None => server.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the target's name leaves a password out of the report and keeps the rest.
    #[test]
    fn names_without_the_password() {
        assert_eq!(
            without_password("mysql://bench:s3cret@127.0.0.1:3306"),
            "mysql://bench@127.0.0.1:3306"
        );
        assert_eq!(
            without_password("mysql://root@127.0.0.1:3306"),
            "mysql://root@127.0.0.1:3306"
        );
        assert_eq!(without_password("mysql://h:1"), "mysql://h:1");
    }

    // Checks the default number of clients: the HTTP rows' connections, at most
    // CLIENTS_MAX; --sql-clients wins.
    #[test]
    fn clients_follow_the_connections_up_to_the_bound() {
        use clap::Parser;
        let args = |list: &[&str]| {
            crate::cli::Args::try_parse_from(
                std::iter::once("flashsale-bench").chain(list.iter().copied()),
            )
            .expect("valid arguments")
        };
        assert_eq!(clients(&args(&["sustained", "--connections", "8"])), 8);
        assert_eq!(clients(&args(&["sustained"])), CLIENTS_MAX.min(64));
        assert_eq!(clients(&args(&["sustained", "--sql-clients", "64"])), 64);
    }
}
