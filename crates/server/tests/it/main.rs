//! Integration tests of flashsale against the real Redis and MariaDB on this machine.
//! One test binary (faster to link); each test gets its own database and Redis prefix,
//! and fault tests put a TCP proxy of their own between flashsale and a service, so the
//! shared services are never stopped, paused or flushed.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test's failed expectation is its failure, with the expectation's message"
)]

mod audit;
mod bad_input;
mod baselines;
mod binary;
mod buyers;
mod cluster;
#[cfg(feature = "failpoints")]
mod crash;
mod dashboard;
mod data_loss;
mod dead_letters;
mod demo;
mod destock;
mod events;
mod fallback;
mod faults;
mod galera;
mod grafana;
mod group_commit;
mod helpers;
#[cfg(feature = "failpoints")]
mod incidents;
mod invariants;
mod lists;
mod metrics;
mod nats_cluster;
mod openapi;
mod orders;
mod patch;
mod pause;
mod products;
mod purchase;
mod rate_limit;
mod recovery;
mod refund;
mod request_keys;
mod retire;
mod slow_clients;
mod sold_out;
