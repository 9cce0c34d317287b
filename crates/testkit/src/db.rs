use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use sqlx::{Connection, MySqlConnection};

/// Bound on creating or dropping the database (connect + one statement), so a
/// test against a stopped or blackholed server fails instead of hanging.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Bound on the best-effort cleanup when a [`TestDb`] is dropped without
/// [`TestDb::drop_db`] (e.g. the test panicked): Drop blocks this long at
/// most.
const DROP_TIMEOUT: Duration = Duration::from_secs(10);

/// Prefix of every database name this crate creates, so leftovers of crashed
/// test runs are easy to find and remove (`fs_test_%`).
const DB_NAME_PREFIX: &str = "fs_test_";

/// A database of the test's own on a MySQL-protocol server, named
/// `fs_test_<random hex>`.
///
/// Why: tests run in parallel against the shared MariaDB; giving each its
/// own database lets each run migrations and assert on row counts without
/// seeing the others' rows, and dropping it at the end leaves the server as
/// it was.
///
/// Call [`drop_db`](Self::drop_db) at the end of a test. If the value is
/// dropped without it (a test panicked), Drop drops the database anyway, on
/// a helper thread, waiting at most 10 s (`DROP_TIMEOUT`).
#[derive(Debug)]
pub struct TestDb {
    server_url: String,
    parts: UrlParts,
    name: String,
    dropped: bool,
}

impl TestDb {
    /// Creates a new database `fs_test_<random hex>` (utf8mb4) on the server
    /// at `server_url`, a URL without a database name such as
    /// `mysql://root@127.0.0.1:3306`.
    ///
    /// Why: one call gives a test an empty, private database on any server,
    /// shared or private (see [`PrivateMariadb::url`](crate::PrivateMariadb::url)).
    pub async fn create(server_url: &str) -> Result<TestDb, sqlx::Error> {
        let parts = UrlParts::parse(server_url)?;
        let name = format!("{DB_NAME_PREFIX}{:016x}", rand::random::<u64>());
        admin(
            server_url,
            &format!("CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci"),
        )
        .await?;
        Ok(TestDb {
            server_url: server_url.to_owned(),
            parts,
            name,
            dropped: false,
        })
    }

    /// The URL of this database, e.g. `mysql://root@127.0.0.1:3306/fs_test_…`
    /// (with the server URL's query string, if it had one).
    ///
    /// Why: what the service's config and `sqlx` pools take.
    pub fn url(&self) -> String {
        self.parts.with_host(&self.parts.host_port, &self.name)
    }

    /// The same URL as [`url`](Self::url) with host and port replaced by
    /// `addr`.
    ///
    /// Why: to reach this database through a [`TcpProxy`](crate::TcpProxy)
    /// in front of its server.
    pub fn url_via(&self, addr: SocketAddr) -> String {
        self.parts.with_host(&addr.to_string(), &self.name)
    }

    /// The database's name.
    ///
    /// Why: for queries that name it, such as `information_schema` lookups.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Drops the database.
    ///
    /// Why: tests must leave the shared server as they found it; this is the
    /// normal, awaited way to clean up, and it reports errors.
    pub async fn drop_db(mut self) -> Result<(), sqlx::Error> {
        let result = drop_database(&self.server_url, &self.name).await;
        // Even on error: Drop must not try again (it would most likely fail
        // the same way, only slower and silently).
        self.dropped = true;
        result
    }
}

impl Drop for TestDb {
    /// Drops the database if [`TestDb::drop_db`] was not called, so a
    /// panicking test does not leave it behind. Best effort and bounded: it
    /// runs on its own thread and runtime (Drop cannot await), and gives up
    /// after `DROP_TIMEOUT` (10 s) with a warning.
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        let server_url = self.server_url.clone();
        let name = self.name.clone();
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                match tokio::time::timeout(DROP_TIMEOUT, drop_database(&server_url, &name)).await {
                    Ok(result) => result.map_err(io::Error::other),
                    Err(_) => Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no answer within {DROP_TIMEOUT:?}"),
                    )),
                }
            })
        });
        match cleanup.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(db = %self.name, error = %e, "could not drop test database");
            }
            Err(_) => tracing::warn!(db = %self.name, "test database cleanup thread panicked"),
        }
    }
}

/// `DROP DATABASE IF EXISTS` for `name` on the server at `server_url`.
async fn drop_database(server_url: &str, name: &str) -> Result<(), sqlx::Error> {
    admin(server_url, &format!("DROP DATABASE IF EXISTS `{name}`")).await
}

/// Connects to `server_url`, runs `sql` (text protocol, no parameters) and
/// disconnects, all within [`ADMIN_TIMEOUT`].
async fn admin(server_url: &str, sql: &str) -> Result<(), sqlx::Error> {
    let work = async {
        let mut conn = MySqlConnection::connect(server_url).await?;
        sqlx::raw_sql(sql).execute(&mut conn).await?;
        conn.close().await
    };
    match tokio::time::timeout(ADMIN_TIMEOUT, work).await {
        Ok(result) => result,
        Err(_) => Err(sqlx::Error::Io(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("database server did not answer within {ADMIN_TIMEOUT:?}"),
        ))),
    }
}

/// A server URL cut around its `host:port`, so the database name and another
/// address can be put in.
#[derive(Debug, Clone, PartialEq, Eq)]
struct UrlParts {
    /// `scheme://` plus `userinfo@` if any.
    prefix: String,
    /// `host:port` as written (`[::1]:3306` for IPv6).
    host_port: String,
    /// `?…` or empty.
    query: String,
}

impl UrlParts {
    /// Splits `mysql://user[:pass]@host[:port][/][?query]`. A database name
    /// in the path is refused: the caller asked for a fresh database.
    fn parse(url: &str) -> Result<UrlParts, sqlx::Error> {
        let bad =
            |why: &str| sqlx::Error::Configuration(format!("bad server URL {url:?}: {why}").into());
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let (before_query, query) = match rest.find('?') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        let (authority, path) = match before_query.find('/') {
            Some(i) => before_query.split_at(i),
            None => (before_query, ""),
        };
        if !(path.is_empty() || path == "/") {
            return Err(bad("must not name a database"));
        }
        let (userinfo, host_port) = match authority.rfind('@') {
            Some(i) => authority.split_at(i + 1),
            None => ("", authority),
        };
        if host_port.is_empty() {
            return Err(bad("no host"));
        }
        Ok(UrlParts {
            prefix: format!("{scheme}://{userinfo}"),
            host_port: host_port.to_owned(),
            query: query.to_owned(),
        })
    }

    /// The URL with `host_port` and the database `db`.
    fn with_host(&self, host_port: &str, db: &str) -> String {
        format!("{}{host_port}/{db}{}", self.prefix, self.query)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_server_url() {
        let p = UrlParts::parse("mysql://root@127.0.0.1:3306").unwrap();
        assert_eq!(
            p.with_host(&p.host_port, "db"),
            "mysql://root@127.0.0.1:3306/db"
        );
        assert_eq!(
            p.with_host("127.0.0.1:9", "db"),
            "mysql://root@127.0.0.1:9/db"
        );
    }

    #[test]
    fn keeps_password_and_query_and_handles_ipv6() {
        let p = UrlParts::parse("mysql://u:p%40ss@[::1]:3306/?ssl-mode=disabled").unwrap();
        assert_eq!(p.host_port, "[::1]:3306");
        assert_eq!(
            p.with_host("127.0.0.1:9", "db"),
            "mysql://u:p%40ss@127.0.0.1:9/db?ssl-mode=disabled"
        );
    }

    #[test]
    fn refuses_database_in_server_url() {
        assert!(UrlParts::parse("mysql://root@127.0.0.1:3306/test").is_err());
        assert!(UrlParts::parse("127.0.0.1:3306").is_err());
    }
}
