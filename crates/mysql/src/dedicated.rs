//! Connections of the ledger's own batch workers (the group committer, the lookups),
//! kept outside the pool.
//!
//! sqlx pings every pooled connection when it goes back to the pool: a round trip after
//! every use, on both the server's and MariaDB's CPU. A worker that runs one statement or
//! one transaction at a time, all day long, gains nothing from sharing: it keeps a
//! connection of its own and skips that round trip (measured: 5–7 % more orders a
//! second). What the pool gave it is kept: the same session settings, a ping before a use
//! after an idle spell, a transaction left behind by a failed statement rolled back at
//! once, a fresh connection after any other failure, and a lifetime limit. A connection
//! to a node that is no longer the writer (`writer.rs`: the route's epoch has moved on)
//! is dropped at its next use, and the slot connects to the writer in use.

use std::time::{Duration, Instant};

use std::sync::Arc;

use sqlx::mysql::MySqlConnection;
use sqlx::Connection;
use tokio::sync::{Mutex, MutexGuard, Semaphore, SemaphorePermit};

use crate::writer::Route;

/// A connection idle at least this long is pinged before use (as the pool does); a
/// younger one was just used successfully.
pub(crate) const PING_WHEN_IDLE_FOR: Duration = Duration::from_secs(1);
/// A connection this old is closed and replaced before its next use, as the pool does
/// with its (default) maximum lifetime: whatever a long-lived session accumulated on the
/// server, or a setting changed since it connected, lasts no longer.
const LIFETIME_MAX: Duration = Duration::from_secs(30 * 60);

/// Connections for `slots` workers, each taken by one call at a time. Bounded: at most
/// `slots` connections, opened on first use.
pub(crate) struct Dedicated {
    route: Arc<Route>,
    acquire_timeout: Duration,
    slots: Vec<Mutex<Option<Idle>>>,
    /// One permit per slot, held with it: a caller waits for whichever slot frees first.
    free: Semaphore,
}

struct Idle {
    conn: MySqlConnection,
    /// When it connected.
    opened: Instant,
    /// When it was last given back.
    since: Instant,
    /// The route's epoch it was opened in: the writer it talks to.
    epoch: u64,
}

impl Dedicated {
    pub(crate) fn new(route: Arc<Route>, acquire_timeout: Duration, slots: usize) -> Self {
        let slots = slots.max(1);
        Self {
            route,
            acquire_timeout,
            slots: (0..slots).map(|_| Mutex::new(None)).collect(),
            free: Semaphore::new(slots),
        }
    }

    /// A connection of its own for one call: a free slot's, waiting for whichever frees
    /// first when all are taken, for as long as the caller's own deadline lets it (every
    /// caller runs under one: `MysqlLedger::run`'s). Give it back with
    /// [`Taken::give_back`]; dropped without that (the caller's future dropped halfway,
    /// say), it is closed, and the slot connects again on its next use.
    pub(crate) async fn take(&self) -> Result<Taken<'_>, sqlx::Error> {
        let permit = self
            .free
            .acquire()
            .await
            .map_err(|_| sqlx::Error::PoolClosed)?;
        // A permit means a slot is unlocked: a slot's lock is released before its permit.
        let mut slot = self
            .slots
            .iter()
            .find_map(|s| s.try_lock().ok())
            .ok_or(sqlx::Error::PoolClosed)?;
        let epoch = self.route.current().epoch;
        let (conn, opened) = match slot.take() {
            // Opened to a node that is no longer the writer: dropped, not closed (a
            // paused node would never answer the goodbye).
            Some(idle) if idle.epoch != epoch => (self.connect().await?, Instant::now()),
            Some(idle) if idle.opened.elapsed() >= LIFETIME_MAX => {
                let _ = idle.conn.close().await;
                (self.connect().await?, Instant::now())
            }
            Some(idle) if idle.since.elapsed() < PING_WHEN_IDLE_FOR => (idle.conn, idle.opened),
            Some(mut idle) => match idle.conn.ping().await {
                Ok(()) => (idle.conn, idle.opened),
                // Cut while idle (a restarted server, a proxy's timeout): a new one.
                Err(_) => (self.connect().await?, Instant::now()),
            },
            None => (self.connect().await?, Instant::now()),
        };
        Ok(Taken {
            slot,
            conn,
            opened,
            epoch,
            route: &self.route,
            permit,
        })
    }

    /// A new connection to the writer in use. The epoch was read before: a switch in
    /// between makes this connection one of the new writer's filed under the old epoch,
    /// dropped at its next use, never the reverse.
    async fn connect(&self) -> Result<MySqlConnection, sqlx::Error> {
        let current = self.route.current();
        let mut conn = tokio::time::timeout(
            self.acquire_timeout,
            MySqlConnection::connect_with(&current.options),
        )
        .await
        .map_err(|_| sqlx::Error::PoolTimedOut)??;
        crate::sql::prepare_session(&mut conn, self.route.session()).await?;
        Ok(conn)
    }
}

/// A slot's connection, in use.
pub(crate) struct Taken<'a> {
    slot: MutexGuard<'a, Option<Idle>>,
    conn: MySqlConnection,
    opened: Instant,
    epoch: u64,
    route: &'a Route,
    /// Dropped after `slot` (fields drop in order), so a free permit means a free slot.
    permit: SemaphorePermit<'a>,
}

impl Taken<'_> {
    pub(crate) fn conn(&mut self) -> &mut MySqlConnection {
        &mut self.conn
    }

    /// Puts the connection back in its slot when the work on it succeeded or the database
    /// refused a statement (the connection is fine then), and the writer has not changed
    /// meanwhile; after any other error it is closed. After a refused statement, a transaction dropped on the way out has its
    /// ROLLBACK only queued (sqlx sends it with the connection's next command, which for
    /// a pooled connection is the pool's release ping): it is sent now, so that no lock
    /// of the failed transaction outlives it; if that fails, the connection is closed.
    pub(crate) async fn give_back<T>(self, outcome: &Result<T, sqlx::Error>) {
        let Taken {
            mut slot,
            mut conn,
            opened,
            epoch,
            route,
            permit,
        } = self;
        let fine = match outcome {
            _ if route.current().epoch != epoch => false,
            Ok(_) => true,
            Err(sqlx::Error::Database(_)) => conn.ping().await.is_ok(),
            Err(_) => false,
        };
        if fine {
            *slot = Some(Idle {
                conn,
                opened,
                since: Instant::now(),
                epoch,
            });
        }
        // The slot first, then its permit.
        drop(slot);
        drop(permit);
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use flashsale_testkit::TestDb;
    use sqlx::mysql::MySqlConnectOptions;
    use sqlx::{Executor, Row};

    use super::*;

    const SERVER_URL: &str = "mysql://root@127.0.0.1:3306";

    /// The one node of `options`, as the ledger routes to it without a cluster.
    fn route(options: &MySqlConnectOptions) -> Arc<Route> {
        let settings = crate::writer::PoolSettings {
            max_connections: 1,
            acquire_timeout: Duration::from_secs(5),
        };
        Route::single(options.clone(), settings)
    }

    async fn connection_id(taken: &mut Taken<'_>) -> Result<u64, sqlx::Error> {
        sqlx::query_scalar("SELECT CONNECTION_ID()")
            .fetch_one(taken.conn())
            .await
    }

    // Checks a dedicated connection's life on the real MariaDB, by its CONNECTION_ID():
    // it has the ledger's session settings; it is reused from one use to the next (no
    // new connection, so no release round trip either), also after the database refused a
    // statement; one dropped without being given back (a caller's future dropped halfway)
    // is closed on the server and replaced; one cut while idle is found out by the ping
    // before its next use and replaced, so the use succeeds.
    #[tokio::test]
    async fn a_dedicated_connection_is_reused_until_it_fails() {
        let db = TestDb::create(SERVER_URL).await.expect("test database");
        let options = MySqlConnectOptions::from_str(&db.url()).expect("url");
        let dedicated = Dedicated::new(route(&options), Duration::from_secs(5), 1);

        let mut taken = dedicated.take().await.expect("take");
        let first = connection_id(&mut taken).await;
        let isolation: String = sqlx::query("SELECT @@tx_isolation AS i")
            .fetch_one(taken.conn())
            .await
            .expect("isolation")
            .get("i");
        assert_eq!(isolation, "READ-COMMITTED");
        taken.give_back(&first).await;
        let first = first.expect("connection id");

        let mut taken = dedicated.take().await.expect("take");
        assert_eq!(
            connection_id(&mut taken).await.expect("id"),
            first,
            "reused"
        );
        let refused = taken.conn().execute("SELECT * FROM no_such_table").await;
        assert!(matches!(refused, Err(sqlx::Error::Database(_))));
        taken.give_back(&refused).await;
        let mut taken = dedicated.take().await.expect("take");
        assert_eq!(
            connection_id(&mut taken).await.expect("id"),
            first,
            "kept after the database refused a statement"
        );

        // Dropped halfway: closed, and the next use connects anew.
        drop(taken);
        let mut admin = MySqlConnection::connect_with(&options)
            .await
            .expect("admin connection");
        let mut gone = false;
        for _ in 0..50 {
            let n: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?",
            )
            .bind(first)
            .fetch_one(&mut admin)
            .await
            .expect("processlist");
            if n == 0 {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(gone, "a connection dropped without give_back is closed");
        let mut taken = dedicated.take().await.expect("take");
        let second = connection_id(&mut taken).await;
        taken.give_back(&second).await;
        let second = second.expect("id");
        assert_ne!(second, first);

        // Cut while idle: the ping before the next use finds it, and a new one serves.
        sqlx::query(&format!("KILL CONNECTION {second}"))
            .execute(&mut admin)
            .await
            .expect("kill");
        tokio::time::sleep(PING_WHEN_IDLE_FOR + Duration::from_millis(100)).await;
        let mut taken = dedicated.take().await.expect("take after the cut");
        let third = connection_id(&mut taken).await.expect("id after the cut");
        assert_ne!(third, second);
        taken.give_back(&Ok::<(), sqlx::Error>(())).await;

        let _ = admin.close().await;
        drop(dedicated);
        db.drop_db().await.expect("drop test database");
    }

    // Checks that a transaction a failed statement left behind ends when its connection
    // is given back (real MariaDB): a transaction that wrote a row, then ran a statement
    // the database refused, is dropped (its ROLLBACK only queued by sqlx); once the
    // connection is back in its slot, InnoDB has no transaction for it and another
    // connection can take the row's lock at once. Without sending the queued ROLLBACK
    // the transaction, and its lock, would last until the slot's next use.
    #[tokio::test]
    async fn a_failed_transaction_is_rolled_back_when_given_back() {
        let db = TestDb::create(SERVER_URL).await.expect("test database");
        let options = MySqlConnectOptions::from_str(&db.url()).expect("url");
        let mut admin = MySqlConnection::connect_with(&options)
            .await
            .expect("admin connection");
        admin
            .execute("CREATE TABLE locked (id INT PRIMARY KEY, n INT NOT NULL)")
            .await
            .expect("table");
        admin
            .execute("INSERT INTO locked VALUES (1, 0)")
            .await
            .expect("row");
        let dedicated = Dedicated::new(route(&options), Duration::from_secs(5), 1);

        let mut taken = dedicated.take().await.expect("take");
        let id = connection_id(&mut taken).await.expect("id");
        let outcome: Result<(), sqlx::Error> = async {
            let mut tx = taken.conn().begin().await?;
            sqlx::query("UPDATE locked SET n = n + 1 WHERE id = 1")
                .execute(&mut *tx)
                .await?;
            sqlx::query("SELECT * FROM no_such_table")
                .execute(&mut *tx)
                .await?;
            tx.commit().await
        }
        .await;
        assert!(matches!(outcome, Err(sqlx::Error::Database(_))));
        taken.give_back(&outcome).await;

        let open: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id = ?",
        )
        .bind(id)
        .fetch_one(&mut admin)
        .await
        .expect("innodb_trx");
        assert_eq!(open, 0, "the failed transaction is over");
        admin
            .execute("SET SESSION innodb_lock_wait_timeout = 1")
            .await
            .expect("timeout");
        admin
            .execute("UPDATE locked SET n = n + 10 WHERE id = 1")
            .await
            .expect("the row's lock is free");
        let n: i32 = sqlx::query_scalar("SELECT n FROM locked WHERE id = 1")
            .fetch_one(&mut admin)
            .await
            .expect("row");
        assert_eq!(n, 10, "the failed transaction's write was rolled back");

        let mut taken = dedicated.take().await.expect("take again");
        assert_eq!(connection_id(&mut taken).await.expect("id"), id, "kept");
        taken.give_back(&Ok::<(), sqlx::Error>(())).await;
        let _ = admin.close().await;
        drop(dedicated);
        db.drop_db().await.expect("drop test database");
    }

    // Checks that a caller finding every slot taken waits (still waiting after 300 ms)
    // for whichever slot frees first (here the second, while the first stays taken),
    // and gets that slot's own connection (the same CONNECTION_ID()).
    #[tokio::test]
    async fn a_caller_waits_for_whichever_slot_frees_first() {
        let db = TestDb::create(SERVER_URL).await.expect("test database");
        let options = MySqlConnectOptions::from_str(&db.url()).expect("url");
        let dedicated = Dedicated::new(route(&options), Duration::from_secs(5), 2);
        let mut first = dedicated.take().await.expect("take");
        let mut second = dedicated.take().await.expect("take");
        let first_id = connection_id(&mut first).await;
        let second_id = connection_id(&mut second).await;

        let waited = tokio::time::timeout(Duration::from_millis(300), dedicated.take()).await;
        assert!(waited.is_err(), "every slot taken: the caller waits");
        drop(waited);

        let waiting = async {
            let mut third = dedicated.take().await.expect("take");
            connection_id(&mut third).await.expect("id")
        };
        let releasing = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            second.give_back(&second_id).await;
        };
        let (third_id, ()) = tokio::join!(waiting, releasing);
        assert_eq!(
            third_id,
            second_id.expect("id"),
            "the freed slot's connection"
        );
        first.give_back(&first_id).await;
        drop(dedicated);
        db.drop_db().await.expect("drop test database");
    }
}
