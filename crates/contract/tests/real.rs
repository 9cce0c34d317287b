//! The port contracts (crates/contract) run against the real adapters: `RedisGate` on
//! the shared Redis under a key prefix of its own per test, `MysqlLedger` (ledger and
//! outbox) on a database of its own per test on the shared MariaDB.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test's failed expectation is its failure, with the expectation's message"
)]

use std::time::Duration;

use async_trait::async_trait;
use flashsale_contract::gate::GateWorld;
use flashsale_redis::{GateConfig, RedisGate};
use flashsale_testkit::{delete_prefix, redis_prefix};

const REDIS_URL: &str = "redis://127.0.0.1:6379";
const MYSQL_SERVER: &str = "mysql://root@127.0.0.1:3306";

pub struct RealGate {
    gate: RedisGate,
    prefix: String,
}

#[async_trait(?Send)]
impl GateWorld for RealGate {
    type Gate = RedisGate;

    async fn open(lease: Duration, record_ttl: Duration) -> Self {
        let prefix = redis_prefix();
        let gate = RedisGate::new(&GateConfig {
            target: flashsale_redis::Target::Node(REDIS_URL.into()),
            prefix: prefix.clone(),
            record_ttl,
            response_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            sold_out_lease: lease,
            shared_user_rate: None,
        })
        .expect("gate");
        Self { gate, prefix }
    }

    fn gate(&self) -> &RedisGate {
        &self.gate
    }

    async fn pass(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }

    async fn close(self) {
        delete_prefix(REDIS_URL, &self.prefix)
            .await
            .expect("delete the test's keys");
    }
}

mod common;

/// The shared MariaDB, without a cluster.
pub struct SharedMariadb;

impl common::Server for SharedMariadb {
    fn locate() -> (String, Option<flashsale_mysql::ClusterConfig>) {
        (MYSQL_SERVER.to_owned(), None)
    }
}

pub type RealLedger = common::OwnLedger<SharedMariadb>;

flashsale_contract::contracts!(gate: RealGate, ledger: RealLedger);
