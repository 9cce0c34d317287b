//! Upgrading a live ledger on the real MariaDB: the outbox's "sent" mark moved from a
//! column of the event row to a narrow table (migration 7), and events that were waiting
//! for the broker when the upgrade ran must still be published afterwards.

use std::borrow::Cow;

use flashsale_testkit::TestDb;
use sqlx::migrate::Migrator;
use sqlx::{Connection, MySqlConnection, Row};

const SERVER_URL: &str = "mysql://root@127.0.0.1:3306";
/// The migration that replaced `outbox.sent_at` with `outbox_unsent`.
const UNSENT_TABLE: i64 = 20261129000007;

/// The project's migrations, all of them or only those before `below`.
fn migrator(below: Option<i64>) -> Migrator {
    let mut m = sqlx::migrate!("./migrations");
    if let Some(below) = below {
        let kept: Vec<_> = m
            .migrations
            .iter()
            .filter(|x| x.version < below)
            .cloned()
            .collect();
        m.migrations = Cow::Owned(kept);
    }
    m
}

/// One event row in the schema before migration 7.
async fn old_outbox_row(
    conn: &mut MySqlConnection,
    n: i64,
    sent: bool,
    attempts: i32,
    error: Option<&str>,
) {
    sqlx::query(
        "INSERT INTO outbox (event_id, event_type, request_id, order_id, product_id, sequence, \
         payload, created_at, sent_at, attempts, last_error) \
         VALUES (?, 'order_created', ?, ?, 7, 1, '{}', NOW(6), IF(?, NOW(6), NULL), ?, ?)",
    )
    .bind(format!("event-{n}"))
    .bind(format!("REQ_{n}"))
    .bind(n)
    .bind(sent)
    .bind(attempts)
    .bind(error)
    .execute(&mut *conn)
    .await
    .expect("insert an outbox row of the old schema");
}

async fn count(conn: &mut MySqlConnection, sql: &str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(&mut *conn)
        .await
        .expect("count")
}

// Checks migration 7 on a database that holds events: the schema before it (migrations
// 1-6) gets two sent events and two unsent ones (one with failed attempts and an error);
// after the remaining migrations exactly the two unsent ones are in outbox_unsent, with
// their attempts and error, and the old columns are gone; an event inserted afterwards
// starts unsent through the trigger, and deleting the marks keeps the events.
#[tokio::test]
async fn unsent_events_survive_the_upgrade() {
    let db = TestDb::create(SERVER_URL).await.expect("test database");
    let mut conn = MySqlConnection::connect(&db.url()).await.expect("connect");
    migrator(Some(UNSENT_TABLE))
        .run(&mut conn)
        .await
        .expect("migrations before the unsent table");
    old_outbox_row(&mut conn, 1, true, 1, None).await;
    old_outbox_row(&mut conn, 2, false, 3, Some("broker down")).await;
    old_outbox_row(&mut conn, 3, true, 2, None).await;
    old_outbox_row(&mut conn, 4, false, 0, None).await;

    migrator(None).run(&mut conn).await.expect("the rest");

    let unsent: Vec<(String, i32, Option<String>)> = sqlx::query(
        "SELECT CONVERT(o.event_id USING utf8mb4) AS event_id, u.attempts, \
         CONVERT(u.last_error USING utf8mb4) AS last_error \
         FROM outbox_unsent u JOIN outbox o ON o.id = u.id ORDER BY u.id",
    )
    .fetch_all(&mut conn)
    .await
    .expect("read outbox_unsent")
    .iter()
    .map(|r| (r.get("event_id"), r.get("attempts"), r.get("last_error")))
    .collect();
    assert_eq!(
        unsent,
        vec![
            ("event-2".to_owned(), 3, Some("broker down".to_owned())),
            ("event-4".to_owned(), 0, None),
        ]
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT COUNT(*) FROM information_schema.columns \
             WHERE table_schema = DATABASE() AND table_name = 'outbox' \
             AND column_name IN ('sent_at', 'attempts', 'last_error')"
        )
        .await,
        0,
        "the event row no longer carries a sent mark"
    );

    sqlx::query(
        "INSERT INTO outbox (event_id, event_type, request_id, order_id, product_id, sequence, \
         payload, created_at) VALUES ('event-5', 'order_created', 'REQ_5', 5, 7, 1, '{}', NOW(6))",
    )
    .execute(&mut conn)
    .await
    .expect("insert an event");
    assert_eq!(
        count(
            &mut conn,
            "SELECT COUNT(*) FROM outbox_unsent u JOIN outbox o ON o.id = u.id \
             WHERE o.event_id = 'event-5' AND u.attempts = 0"
        )
        .await,
        1,
        "a new event starts unsent"
    );
    sqlx::query("DELETE FROM outbox_unsent")
        .execute(&mut conn)
        .await
        .expect("mark all sent");
    assert_eq!(
        count(&mut conn, "SELECT COUNT(*) FROM outbox").await,
        5,
        "sent events are kept"
    );
    conn.close().await.expect("close");
    db.drop_db().await.expect("drop the test database");
}
