//! The ledger's connections on the real MariaDB.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test's failed expectation is its failure, with the expectation's message"
)]

use std::time::Duration;

use flashsale_mysql::{LedgerConfig, MysqlLedger};
use flashsale_testkit::TestDb;

const SERVER_URL: &str = "mysql://root@127.0.0.1:3306";

// Checks every ledger session runs in UTC even when the database URL asks for another
// time zone (`?timezone=+05:00`, which sqlx would otherwise apply): the group commit reads
// the DATETIMEs of its text rows as UTC and the events' timestamps end in `Z`. Asks
// MariaDB itself for the session's time zone and for NOW() against UTC_TIMESTAMP().
#[tokio::test]
async fn sessions_are_utc_whatever_the_url_says() {
    let db = TestDb::create(SERVER_URL).await.expect("test database");
    let url = db.url();
    let separator = if url.contains('?') { '&' } else { '?' };
    let ledger = MysqlLedger::connect(&LedgerConfig {
        url: format!("{url}{separator}timezone=%2B05%3A00"),
        max_connections: 2,
        acquire_timeout: Duration::from_secs(10),
        transaction_timeout: Duration::from_secs(10),
        cluster: None,
    })
    .await
    .expect("ledger");
    let (zone, skew): (String, i64) =
        sqlx::query_as("SELECT @@session.time_zone, TIMESTAMPDIFF(MINUTE, UTC_TIMESTAMP(), NOW())")
            .fetch_one(&ledger.pool())
            .await
            .expect("session time zone");
    assert_eq!((zone.as_str(), skew), ("+00:00", 0));
    ledger.pool().close().await;
    db.drop_db().await.expect("drop the test database");
}
