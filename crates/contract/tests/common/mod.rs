//! The ledger world the real-adapter contract binaries share: `MysqlLedger` (ledger and
//! outbox) on a database of its own per test, on the server a [`Server`] names.

use std::marker::PhantomData;
use std::time::Duration;

use async_trait::async_trait;
use flashsale_contract::ledger::LedgerWorld;
use flashsale_mysql::{ClusterConfig, LedgerConfig, MysqlLedger};
use flashsale_testkit::TestDb;

/// Where a test's database is made (a server URL without a database), and the Galera
/// cluster the ledger writes through, if any.
pub trait Server: 'static {
    fn locate() -> (String, Option<ClusterConfig>);
}

/// A migrated `MysqlLedger` on a database of its own, on `S`'s server.
pub struct OwnLedger<S> {
    ledger: MysqlLedger,
    db: TestDb,
    server: PhantomData<S>,
}

#[async_trait(?Send)]
impl<S: Server> LedgerWorld for OwnLedger<S> {
    type Ledger = MysqlLedger;

    async fn open() -> Self {
        let (server, cluster) = S::locate();
        let db = TestDb::create(&server).await.expect("test database");
        let ledger = MysqlLedger::connect(&LedgerConfig {
            url: db.url(),
            max_connections: 8,
            acquire_timeout: Duration::from_secs(10),
            transaction_timeout: Duration::from_secs(20),
            cluster,
        })
        .await
        .expect("ledger");
        ledger.migrate().await.expect("migrate");
        Self {
            ledger,
            db,
            server: PhantomData,
        }
    }

    fn ledger(&self) -> &MysqlLedger {
        &self.ledger
    }

    async fn pass(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }

    async fn close(self) {
        self.ledger.pool().close().await;
        self.db.drop_db().await.expect("drop the test database");
    }
}
