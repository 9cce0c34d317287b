//! Test-only helpers for flashsale's integration tests.
//!
//! The service talks to Redis, MariaDB and NATS; its tests must both share the
//! machine's long-running instances without stepping on each other and break
//! things (crash, pause, cut the network) without harming those shared
//! instances. This crate provides the pieces for both:
//!
//! * isolation on shared services: [`TestDb`] (one database per test) and
//!   [`redis_prefix`] / [`delete_prefix`] (one key prefix per test);
//! * fault injection: [`TcpProxy`] (cut or blackhole a connection),
//!   [`PrivateRedis`] and [`PrivateMariadb`] (own processes that a test may
//!   kill -9, restart or pause);
//! * real clusters: [`RedisCluster`] (three primaries, three replicas, own
//!   processes: kill a primary and wait for its failover, move a slot live) and
//!   [`NatsCluster`] (three JetStream servers: kill a stream's leader, see another
//!   elected, restart the dead one and see it catch up);
//! * a MariaDB Galera cluster: [`GaleraCluster`] (three nodes, own processes: kill -9,
//!   pause or shut down a node and bring it back by IST);
//! * [`free_port`] for anything else that needs a port.
//!
//! Nothing here is meant for production code: it is a dev-dependency only.

mod cluster;
mod db;
mod galera;
mod keys;
mod mariadb;
mod nats_cluster;
mod nats_server;
mod port;
mod process;
mod proxy;
mod redis_cluster;
mod redis_server;

pub use db::TestDb;
pub use galera::{GaleraCluster, NodeStatus};
pub use keys::{delete_prefix, escape_glob, redis_prefix};
pub use mariadb::PrivateMariadb;
pub use nats_cluster::{NatsCluster, StreamCopy};
pub use nats_server::PrivateNats;
pub use port::free_port;
pub use process::PrivateServer;
pub use proxy::TcpProxy;
pub use redis_cluster::RedisCluster;
pub use redis_server::PrivateRedis;
