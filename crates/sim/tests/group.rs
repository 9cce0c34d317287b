//! Spot checks of the simulated group commit (`MemLedger::commit_purchase` through
//! `coalesce.rs` and `flashsale_app::group`): calls queued while a group transaction
//! runs go together in the next one, and each member gets the answer it would have had
//! alone.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test's failed expectation is its failure, with the expectation's message"
)]

mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use flashsale_app::ports::{Commit, HeldPurchase};
use flashsale_app::{Ledger, LedgerError, PurchaseOutcome};
use flashsale_core::{HoldRef, ProductId, PurchaseRequest};
use flashsale_sim::ctx::Ctx;
use flashsale_sim::exec::block_on;
use flashsale_sim::ledger::MemLedger;

use common::{held, request};

/// Polls one batch of calls needs at most, all of them together (a few per round trip).
const POLLS_MAX: usize = 1_000;
/// Trace lines kept: every line of these short runs.
const TRACE_KEEP: usize = 1_000;

type Call<'a> = Pin<Box<dyn Future<Output = Result<Commit, LedgerError>> + 'a>>;

fn ctx() -> Arc<Ctx> {
    common::ctx(TRACE_KEEP)
}

fn ledger(ctx: &Arc<Ctx>, stock: i64) -> MemLedger {
    common::ledger(ctx, stock, POLLS_MAX)
}

fn hold(id: i64) -> HoldRef {
    HoldRef::from_stored(1, id).expect("hold")
}

/// Runs `first` until it has started its group transaction, then every call of `rest`
/// once (so they queue behind it), then all of them in turn to the end; the answers of
/// `rest` in order.
/// Commits a purchase "R0" of user 1 (hold 1) and, queued while its group transaction
/// runs, each of `queued` with its hold id and the per-user `limit`; the answers of the
/// queued ones, in their order.
fn queued_behind_another(
    l: &MemLedger,
    queued: &[(&PurchaseRequest, i64)],
    limit: Option<u32>,
) -> Vec<Result<Commit, LedgerError>> {
    let first = held(&request("R0", 1, 1), hold(1), None);
    let queued: Vec<HeldPurchase> = queued
        .iter()
        .map(|&(r, h)| held(r, hold(h), limit))
        .collect();
    let rest: Vec<Call<'_>> = queued
        .iter()
        .map(|p| Box::pin(l.commit_purchase(p)) as Call<'_>)
        .collect();
    together(Box::pin(l.commit_purchase(&first)), rest)
}

fn together<'a>(first: Call<'a>, rest: Vec<Call<'a>>) -> Vec<Result<Commit, LedgerError>> {
    let mut cx = Context::from_waker(Waker::noop());
    let mut calls: Vec<Option<Call<'a>>> = std::iter::once(first).chain(rest).map(Some).collect();
    let mut answers: Vec<Option<Result<Commit, LedgerError>>> =
        calls.iter().map(|_| None).collect();
    for _ in 0..POLLS_MAX {
        for (call, answer) in calls.iter_mut().zip(answers.iter_mut()) {
            if let Some(f) = call {
                if let Poll::Ready(a) = f.as_mut().poll(&mut cx) {
                    *answer = Some(a);
                    *call = None;
                }
            }
        }
        if calls.iter().all(Option::is_none) {
            return answers.into_iter().skip(1).flatten().collect();
        }
    }
    panic!("the calls did not finish within {POLLS_MAX} rounds");
}

fn group_lines(ctx: &Ctx) -> Vec<String> {
    ctx.lock()
        .trace
        .events
        .iter()
        .filter_map(|l| l.find("group commit of").map(|at| l[at..].to_owned()))
        .collect()
}

// Checks coalescing and the copies: three calls queued while another's group transaction
// runs go in one batch; the two distinct request_ids commit together, the later copy of
// one of them is set aside and answered one by one with the first copy's record.
#[test]
fn calls_queued_during_a_group_transaction_commit_together() {
    let ctx = ctx();
    let l = ledger(&ctx, 10);
    let (a, b) = (request("A", 2, 1), request("B", 3, 1));
    let answers = queued_behind_another(&l, &[(&a, 2), (&b, 3), (&a, 2)], None);
    assert_eq!(
        group_lines(&ctx),
        [
            "group commit of 1 in 1 transaction(s): [Committed(0)]",
            "group commit of 3 in 1 transaction(s): [Committed(0), Committed(1), OneByOne]",
        ]
    );
    let Ok(Commit::Committed(order_a)) = &answers[0] else {
        panic!("{:?}", answers[0])
    };
    assert!(matches!(&answers[1], Ok(Commit::Committed(o)) if o.request_id == b.request_id));
    match &answers[2] {
        Ok(Commit::Duplicate(record)) => {
            assert!(matches!(&record.outcome, PurchaseOutcome::Order(o) if o == order_a));
        }
        other => panic!("{other:?}"),
    }
}

// Checks all or nothing: a batch that needs more units than are left writes nothing and
// goes one by one, where the first purchase takes the units and the second hears it is
// out of stock; the counters are those of that one order.
#[test]
fn a_batch_short_of_units_goes_one_by_one() {
    let ctx = ctx();
    let l = ledger(&ctx, 3);
    let (a, b) = (request("A", 2, 2), request("B", 3, 1));
    let answers = queued_behind_another(&l, &[(&a, 2), (&b, 3)], None);
    assert!(matches!(&answers[0], Ok(Commit::Committed(_))));
    assert!(matches!(answers[1], Ok(Commit::InsufficientStock)));
    assert_eq!(
        group_lines(&ctx)[1],
        "group commit of 2 in 1 transaction(s): [OneByOne, OneByOne]"
    );
    let counters = block_on(
        l.inventory(ProductId::parse(1).expect("product")),
        POLLS_MAX,
    )
    .expect("finished")
    .expect("inventory")
    .expect("counters");
    assert_eq!((counters.available, counters.reserved), (0, 3));
}

// Checks the per-user split: user 2 (limit 2) sends 1, 2 and 1 units in one batch; the
// first and the third fit and commit together, the second goes one by one and is
// refused over the limit.
#[test]
fn the_excess_over_a_per_user_limit_goes_one_by_one() {
    let ctx = ctx();
    let l = ledger(&ctx, 10);
    let (a, b, c) = (request("A", 2, 1), request("B", 2, 2), request("C", 2, 1));
    let answers = queued_behind_another(&l, &[(&a, 2), (&b, 3), (&c, 4)], Some(2));
    assert_eq!(
        group_lines(&ctx)[1],
        "group commit of 3 in 2 transaction(s): [Committed(0), OneByOne, Committed(1)]"
    );
    assert!(matches!(&answers[0], Ok(Commit::Committed(_))));
    assert!(matches!(answers[1], Ok(Commit::LimitExceeded)));
    assert!(matches!(&answers[2], Ok(Commit::Committed(_))));
}
