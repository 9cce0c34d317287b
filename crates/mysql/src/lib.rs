//! The ledger on MariaDB.
//!
//! Every state change is a conditional UPDATE (`… WHERE status = 'PENDING_PAYMENT'`)
//! checked by its affected rows, or an INSERT against a unique key, inside one
//! transaction with the rows that must change with it; nothing is decided by reading
//! first and writing later. Deadlocks and lock wait timeouts are retried a bounded number
//! of times; any other failure is reported as unavailable (the outcome may be unknown)
//! and the caller answers 503.
//!
//! Purchases that arrive together are committed together (`group.rs`): one transaction
//! and one counter UPDATE per product for a whole batch, with the same rows and answers
//! as one transaction each.

mod after_sale;
mod baseline;
mod controls;
mod dedicated;
mod destock;
mod group;
mod incidents;
mod ledger;
pub mod lists;
mod maintenance;
mod migrate;
mod outbox;
mod refunds;
mod rows;
mod schedule;
mod scope;
mod sql;
mod writer;

pub use ledger::{LedgerConfig, MysqlLedger};
pub use scope::Rescoped;
pub use writer::{ClusterConfig, NodeAddr, NODES_MAX, PROBE_PERIOD, PROBE_TIMEOUT};
