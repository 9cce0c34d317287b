//! The port contracts (crates/contract) run against the simulator's stores: `MemGate`
//! and `MemLedger` (ledger and outbox), without faults, on a simulated clock that only
//! the test moves.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test's failed expectation is its failure, with the expectation's message"
)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{TimeDelta, TimeZone, Utc};
use flashsale_contract::gate::{GateWorld, RECORD_TTL};
use flashsale_contract::ledger::LedgerWorld;
use flashsale_sim::ctx::Ctx;
use flashsale_sim::gate::{GateDefects, MemGate};
use flashsale_sim::ledger::{LedgerDefects, MemLedger};

fn ctx() -> Arc<Ctx> {
    let start = Utc
        .with_ymd_and_hms(2026, 12, 1, 10, 0, 0)
        .single()
        .expect("date");
    Ctx::new(1, start, 1, TimeDelta::seconds(2), 0)
}

fn delta(d: Duration) -> TimeDelta {
    TimeDelta::from_std(d).expect("a test's duration")
}

pub struct SimGate {
    ctx: Arc<Ctx>,
    gate: MemGate,
}

impl SimGate {
    fn with(lease: Duration, record_ttl: Duration, defects: GateDefects) -> Self {
        let ctx = ctx();
        let gate = MemGate::new(ctx.clone(), delta(record_ttl), delta(lease), defects);
        Self { ctx, gate }
    }
}

#[async_trait(?Send)]
impl GateWorld for SimGate {
    type Gate = MemGate;

    async fn open(lease: Duration, record_ttl: Duration) -> Self {
        SimGate::with(lease, record_ttl, GateDefects::default())
    }

    fn gate(&self) -> &MemGate {
        &self.gate
    }

    async fn pass(&self, d: Duration) {
        self.ctx.lock().base += delta(d);
    }

    async fn close(self) {}
}

pub struct SimLedger {
    ctx: Arc<Ctx>,
    ledger: MemLedger,
}

impl SimLedger {
    fn with(defects: LedgerDefects) -> Self {
        let ctx = ctx();
        let ledger = MemLedger::new(ctx.clone(), defects);
        Self { ctx, ledger }
    }
}

#[async_trait(?Send)]
impl LedgerWorld for SimLedger {
    type Ledger = MemLedger;

    async fn open() -> Self {
        SimLedger::with(LedgerDefects::default())
    }

    fn ledger(&self) -> &MemLedger {
        &self.ledger
    }

    async fn pass(&self, d: Duration) {
        self.ctx.lock().base += delta(d);
    }

    async fn close(self) {}
}

flashsale_contract::contracts!(gate: SimGate, ledger: SimLedger);

/// Whether a contract body breaks (panics) on a world.
async fn breaks(body: impl std::future::Future<Output = ()>) -> bool {
    use futures::FutureExt;
    std::panic::AssertUnwindSafe(body)
        .catch_unwind()
        .await
        .is_err()
}

// Checks that the contracts can fail: with a defect planted in a simulated store (the
// sim's own switches: reserve.lua's stock check skipped; the ledger's stock guard
// skipped; a fence that writes nothing), the contract body that covers the behaviour
// panics, while it passes on the same store without the defect (the tests above).
#[tokio::test]
async fn the_contracts_catch_planted_defects() {
    let below_zero = GateDefects {
        reserve_below_zero: true,
        ..GateDefects::default()
    };
    let gate = SimGate::with(Duration::ZERO, RECORD_TTL, below_zero);
    assert!(breaks(flashsale_contract::gate::reserve_takes_units_once_per_request_id(&gate)).await);

    let no_guard = SimLedger::with(LedgerDefects {
        no_stock_guard: true,
        ..LedgerDefects::default()
    });
    assert!(
        breaks(
            flashsale_contract::ledger::the_ledger_refuses_what_the_gate_wrongly_admits(&no_guard)
        )
        .await
    );

    let hollow_fence = SimLedger::with(LedgerDefects {
        fence_writes_nothing: true,
        ..LedgerDefects::default()
    });
    assert!(
        breaks(flashsale_contract::ledger::a_fence_blocks_a_late_commit(
            &hollow_fence
        ))
        .await
    );
}
