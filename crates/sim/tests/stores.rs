//! Spot checks of the in-memory stores, one rule per test: the gate (the adapter's own
//! Lua scripts and calls over the in-memory Redis) as the simulation batches and drives
//! it, and the ledger against the SQL semantics it copies, so a divergence shows up here
//! before it muddies a simulation run.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test's failed expectation is its failure, with the expectation's message"
)]

use std::sync::Arc;
use std::time::Duration;

use chrono::TimeDelta;
use flashsale_app::ports::{
    Commit, Fence, GateMaintenance, GateState, LedgerMaintenance, Release, ReleaseOf, Reserve,
};
use flashsale_app::{Ledger, PurchaseOutcome, StockGate};
use flashsale_core::{
    CancelReason, Generation, HoldRef, OrderStatus, ProductId, ReleaseReason, RequestId,
};
use flashsale_sim::ctx::Ctx;
use flashsale_sim::exec::block_on;
use flashsale_sim::gate::{GateDefects, MemGate};
use flashsale_sim::ledger::MemLedger;

use common::{held, request};

/// Polls a store call outside the scheduler needs at most (two per internal round trip).
const POLLS_MAX: usize = 100;

fn now<F: std::future::Future>(f: F) -> F::Output {
    block_on(f, POLLS_MAX).expect("the call finished")
}

mod common;

fn ctx() -> Arc<Ctx> {
    common::ctx(0)
}

fn gen(raw: i64) -> Generation {
    Generation::from_stored(raw).expect("generation")
}

fn hold(generation: i64, id: i64) -> HoldRef {
    HoldRef::from_stored(generation, id).expect("hold")
}

fn p1() -> ProductId {
    ProductId::parse(1).expect("product")
}

fn gate(ctx: &Arc<Ctx>) -> MemGate {
    MemGate::new(
        ctx.clone(),
        TimeDelta::minutes(30),
        TimeDelta::zero(),
        GateDefects::default(),
    )
}

/// [`gate`] with `stock` units of [`p1`] loaded in generation 1.
fn loaded(ctx: &Arc<Ctx>, stock: i64) -> MemGate {
    let g = gate(ctx);
    now(g.load(p1(), stock, gen(1))).expect("load");
    g
}

/// [`loaded`], then user 1's hold of one unit under request_id A.
fn holding_a(ctx: &Arc<Ctx>, stock: i64) -> MemGate {
    let g = loaded(ctx, stock);
    now(g.reserve(&request("A", 1, 1), None)).expect("reserve");
    g
}

/// The state of [`p1`]'s entry on `g`, which must be loaded.
fn loaded_state(g: &MemGate) -> GateState {
    now(g.state(p1())).expect("state").expect("loaded")
}

/// A rebuild into generation 2 with `available` units, holds numbered from
/// `last_hold_id`, and no buyer holding any.
fn plan_in_gen_2(available: i64, last_hold_id: i64) -> flashsale_app::ports::RebuildPlan {
    flashsale_app::ports::RebuildPlan {
        generation: gen(2),
        available,
        last_hold_id,
        user_units: vec![],
    }
}

/// [`plan_in_gen_2`] applied to [`p1`] on `g`: the rebuild must land.
fn rebuilt(g: &MemGate, available: i64, last_hold_id: i64) {
    let plan = plan_in_gen_2(available, last_hold_id);
    assert!(now(g.rebuild(p1(), &plan)).expect("rebuild"));
}

// Checks reserve.lua: idempotent on request_id (a second call reports the same hold and
// takes nothing), never below zero, and the per-user limit counts held units.
#[test]
fn reserve_is_idempotent_and_bounded() {
    let ctx = ctx();
    let g = gate(&ctx);
    assert!(now(g.load(p1(), 3, gen(1))).expect("load"));
    assert!(
        !now(g.load(p1(), 99, gen(1))).expect("load"),
        "load never overwrites"
    );
    let a = request("A", 1, 2);
    let first = now(g.reserve(&a, Some(2))).expect("reserve");
    assert!(matches!(
        first,
        Reserve::Reserved { hold: h } if h == hold(1, 1)
    ));
    match now(g.reserve(&a, Some(2))).expect("reserve") {
        Reserve::Existing(h) => assert_eq!((h.hold, h.released), (hold(1, 1), false)),
        other => panic!("{other:?}"),
    }
    assert_eq!(now(g.available(p1())).expect("available"), Some(1));
    assert_eq!(
        now(g.reserve(&request("B", 1, 1), Some(2))).expect("reserve"),
        Reserve::LimitExceeded { unseen: true }
    );
    assert_eq!(
        now(g.reserve(&request("C", 2, 2), None)).expect("reserve"),
        Reserve::SoldOut {
            unseen: true,
            lease: None
        }
    );
    assert_eq!(now(g.available(p1())).expect("available"), Some(1));
}

/// Polls two calls in turn, first `a`, until both finish (as the scheduler would
/// interleave two requests).
fn together<A: std::future::Future, B: std::future::Future>(a: A, b: B) -> (A::Output, B::Output) {
    use std::task::{Context, Poll, Waker};
    let (mut a, mut b) = (std::pin::pin!(a), std::pin::pin!(b));
    let mut cx = Context::from_waker(Waker::noop());
    let (mut ra, mut rb) = (None, None);
    for _ in 0..POLLS_MAX {
        if ra.is_none() {
            if let Poll::Ready(v) = a.as_mut().poll(&mut cx) {
                ra = Some(v);
            }
        }
        if rb.is_none() {
            if let Poll::Ready(v) = b.as_mut().poll(&mut cx) {
                rb = Some(v);
            }
        }
        if ra.is_some() && rb.is_some() {
            break;
        }
    }
    (
        ra.expect("the first call finished"),
        rb.expect("the second call finished"),
    )
}

// Checks the batched reservation path: a purchase queued while another's reserve call
// is on its way goes in the same reserve.lua call. The same request_id twice in one
// batch holds once — the second copy finds the first's hold — and takes the units once;
// with the `batch_counts_twice` defect planted in the script it takes them twice.
#[test]
fn a_request_id_twice_in_one_batch_holds_once() {
    for (defects, left) in [
        (GateDefects::default(), 3),
        (
            GateDefects {
                batch_counts_twice: true,
                ..GateDefects::default()
            },
            1,
        ),
    ] {
        let ctx = ctx();
        let g = MemGate::new(
            ctx.clone(),
            TimeDelta::minutes(30),
            TimeDelta::zero(),
            defects,
        );
        assert!(now(g.load(p1(), 5, gen(1))).expect("load"));
        let a = request("A", 1, 2);
        let (first, second) = together(g.reserve(&a, None), g.reserve(&a, None));
        assert_eq!(
            first.expect("reserve"),
            Reserve::Reserved { hold: hold(1, 1) }
        );
        let second = second.expect("reserve");
        if left == 3 {
            match second {
                Reserve::Existing(h) => assert_eq!((h.hold, h.released), (hold(1, 1), false)),
                other => panic!("{other:?}"),
            }
        } else {
            assert_eq!(second, Reserve::Reserved { hold: hold(1, 2) });
        }
        assert_eq!(now(g.available(p1())).expect("available"), Some(left));
    }
}

// Checks release.lua: a hold's units come back once, whatever the retries, and the
// per-user count with them; a release naming another hold (another id, or the same id
// in another generation) leaves the request's record alone; a request without a record
// is Missing.
#[test]
fn release_returns_units_once() {
    let ctx = ctx();
    let g = loaded(&ctx, 3);
    let a = request("A", 1, 2);
    let Reserve::Reserved { hold: taken } = now(g.reserve(&a, Some(2))).expect("reserve") else {
        panic!("not reserved")
    };
    let rid = &a.request_id;
    let other_id = ReleaseOf::Hold {
        hold: hold(taken.generation.get(), taken.id.get() + 1),
    };
    assert_eq!(
        now(g.release(p1(), rid, &other_id)).expect("release"),
        Release::Missing
    );
    assert_eq!(now(g.available(p1())).expect("available"), Some(1));
    let hold = ReleaseOf::Hold { hold: taken };
    assert_eq!(
        now(g.release(p1(), rid, &hold)).expect("release"),
        Release::Released
    );
    assert_eq!(
        now(g.release(p1(), rid, &hold)).expect("release"),
        Release::AlreadyReleased
    );
    assert_eq!(now(g.available(p1())).expect("available"), Some(3));
    let missing = RequestId::parse("request_id", "nobody").expect("id");
    assert_eq!(
        now(g.release(p1(), &missing, &hold)).expect("release"),
        Release::Missing
    );
    // The user's units are free again.
    assert!(matches!(
        now(g.reserve(&request("B", 1, 2), Some(2))).expect("reserve"),
        Reserve::Reserved { .. }
    ));
}

// Checks adjust.lua (never below zero, never on a missing count) and that a wipe makes
// every script answer NotLoaded until a rebuild, which refuses an older generation.
#[test]
fn adjust_wipe_and_rebuild() {
    let ctx = ctx();
    let g = gate(&ctx);
    let at = |available| flashsale_app::ports::GateCount {
        generation: gen(1),
        available,
        last_hold_id: 0,
    };
    assert!(
        !now(g.adjust(p1(), &at(0), 1)).expect("adjust"),
        "no count to adjust"
    );
    now(g.load(p1(), 2, gen(1))).expect("load");
    assert!(!now(g.adjust(p1(), &at(2), -3)).expect("adjust"));
    assert!(now(g.adjust(p1(), &at(2), -2)).expect("adjust"));
    g.wipe();
    assert_eq!(
        now(g.reserve(&request("A", 1, 1), None)).expect("reserve"),
        Reserve::NotLoaded
    );
    rebuilt(&g, 5, 7);
    assert!(
        !now(g.rebuild(p1(), &plan_in_gen_2(5, 7))).expect("rebuild"),
        "same generation refused"
    );
    assert!(matches!(
        now(g.reserve(&request("A", 1, 1), None)).expect("reserve"),
        Reserve::Reserved { hold: h } if h == hold(2, 8)
    ));
}

// Checks state.lua's `changed`: an entry loaded or rebuilt by the Redis process serving
// it is unchanged; after a failover to an older copy (a new process with the old data)
// it reads as changed until a rebuild writes it again.
#[test]
fn failover_marks_entries_as_written_by_another_server() {
    let ctx = ctx();
    let g = loaded(&ctx, 2);
    let copy = g.snapshot();
    let state = loaded_state(&g);
    assert!(!state.server_changed);
    now(g.reserve(&request("A", 1, 1), None)).expect("reserve");
    g.restore(copy);
    let state = loaded_state(&g);
    assert!(state.server_changed, "{state:?}");
    assert_eq!(state.available, 2, "the copy is older than the last write");
    rebuilt(&g, 1, 1);
    let state = loaded_state(&g);
    assert!(!state.server_changed);
}

// Checks the recovery scan ages holds on Redis's clock: a hold is stale only once it is
// older than the window.
#[test]
fn stale_holds_age_on_the_gate_clock() {
    let ctx = ctx();
    let g = holding_a(&ctx, 3);
    let window = Duration::from_secs(5);
    assert!(now(g.stale_holds(p1(), window, 10))
        .expect("scan")
        .is_empty());
    ctx.lock().base += TimeDelta::seconds(6);
    let stale = now(g.stale_holds(p1(), window, 10)).expect("scan");
    assert_eq!(stale.len(), 1);
    assert_eq!(stale[0].request.request_id.as_str(), "A");
}

fn ledger(ctx: &Arc<Ctx>, stock: i64) -> MemLedger {
    common::ledger(ctx, stock, POLLS_MAX)
}

// Checks the purchase transaction: one order per request_id (a second commit answers
// the record), and the ledger's own `available_stock >= q` guard.
#[test]
fn commit_is_unique_and_guarded() {
    let ctx = ctx();
    let l = ledger(&ctx, 2);
    let a = request("A", 1, 2);
    let order = match now(l.commit_purchase(&held(&a, hold(1, 1), None))).expect("commit") {
        Commit::Committed(o) => o,
        other => panic!("{other:?}"),
    };
    match now(l.commit_purchase(&held(&a, hold(1, 9), None))).expect("commit") {
        Commit::Duplicate(r) => {
            assert_eq!(r.hold.id.get(), 1);
            assert!(matches!(r.outcome, PurchaseOutcome::Order(o) if o.order_id == order.order_id));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        now(l.commit_purchase(&held(&request("B", 2, 1), hold(1, 2), None))).expect("commit"),
        Commit::InsufficientStock
    );
    assert_eq!(
        now(l.commit_purchase(&held(&request("B", 2, 1), hold(7, 2), None))).expect("commit"),
        Commit::StaleGeneration
    );
}

// Checks a fence takes the request_id so a late commit of it fails on the unique key.
#[test]
fn fence_blocks_a_late_commit() {
    let ctx = ctx();
    let l = ledger(&ctx, 2);
    let a = request("A", 1, 1);
    assert_eq!(
        now(l.fence(&a, hold(1, 1), ReleaseReason::Abandoned)).expect("fence"),
        Fence::Fenced
    );
    match now(l.commit_purchase(&held(&a, hold(1, 1), None))).expect("commit") {
        Commit::Duplicate(r) => assert!(matches!(
            r.outcome,
            PurchaseOutcome::Released {
                reason: ReleaseReason::Abandoned
            }
        )),
        other => panic!("{other:?}"),
    }
}

// Checks payment deadlines on the database's clock: pay applies only before expiry,
// expiry only after, and a cancelled order can't be paid.
#[test]
fn pay_and_expire_decide_on_the_ledger_clock() {
    let ctx = ctx();
    let l = ledger(&ctx, 3);
    // Each hold id commits once per generation (uk_reservation_hold).
    let commit = |id: &str, hold_id: i64| match now(l.commit_purchase(&held(
        &request(id, 1, 1),
        hold(1, hold_id),
        None,
    ))) {
        Ok(Commit::Committed(o)) => o,
        other => panic!("{other:?}"),
    };
    let a = commit("A", 1);
    let b = commit("B", 2);
    let expired = flashsale_app::ports::ExpiredOrder {
        order_id: b.order_id,
        user_id: b.user_id,
    };
    let early = now(l.expire(&expired)).expect("expire").expect("order");
    assert!(!early.applied, "not expired yet on the database's clock");
    // The instance's clock jumping does not matter; the database's does.
    ctx.lock().instance_skew[0] = TimeDelta::hours(1);
    assert!(now(l.expired_orders(10)).expect("due").is_empty());
    ctx.lock().ledger_skew = TimeDelta::seconds(11);
    let paid = now(l.pay(a.order_id, a.user_id))
        .expect("pay")
        .expect("order");
    assert!(!paid.applied && paid.expired);
    let late = now(l.expire(&expired)).expect("expire").expect("order");
    assert!(late.applied && late.pending_return.is_some());
    assert_eq!(late.order.cancel_reason, Some(CancelReason::PaymentTimeout));
    let again = now(l.pay(b.order_id, b.user_id))
        .expect("pay")
        .expect("order");
    assert_eq!(again.order.status, OrderStatus::Cancelled);
    assert!(!again.applied);
}

// Checks reserve.lua's `unseen` on a refusal: true for a request_id the product never
// saw while the entry vouches (loaded by this Redis process, never rebuilt, younger than
// a record's lifetime); after a failover to an older copy no answer at all until the
// entry is rebuilt, and false after the rebuild. (The
// lifetime bound is proven against real Redis by
// `purchase::replay_after_record_expiry_is_answered_by_the_ledger`.)
#[test]
fn refusals_vouch_only_while_no_record_can_be_lost() {
    let ctx = ctx();
    let g = holding_a(&ctx, 1);
    assert_eq!(
        now(g.reserve(&request("B", 2, 1), None)).expect("reserve"),
        Reserve::SoldOut {
            unseen: true,
            lease: None
        }
    );
    // A has a record (another payload: not its hold, but seen).
    assert!(matches!(
        now(g.reserve(&request("A", 1, 1), None)).expect("reserve"),
        Reserve::Existing(_)
    ));
    let copy = g.snapshot();
    g.restore(copy);
    assert_eq!(
        now(g.reserve(&request("C", 3, 1), None)).expect("reserve"),
        Reserve::NotRebuilt,
        "another Redis process: records may be lost, it answers nothing until rebuilt"
    );
    rebuilt(&g, 0, 1);
    assert_eq!(
        now(g.reserve(&request("D", 4, 1), None)).expect("reserve"),
        Reserve::SoldOut {
            unseen: false,
            lease: None
        },
        "rebuilt: the records of the lost state are gone"
    );
}
