//! The stock gate's contract (`StockGate` + `GateMaintenance`): what `reserve.lua`,
//! `release.lua`, `restock.lua`, `destock.lua`, `adjust.lua`, `rebuild.lua`, `state.lua`,
//! `holders.lua` and the adapter's plain commands promise.

use std::collections::BTreeSet;
use std::time::Duration;

use async_trait::async_trait;
use flashsale_app::ports::{
    Destock, GateCount, GateMaintenance, RebuildPlan, Release, ReleaseOf, Reserve, Restock,
    StaleHold, StockChange,
};
use flashsale_app::StockGate;
use flashsale_core::HoldRef;

use crate::{generation, hold, product, product_n, purchase, purchase_of, request_id, user};

/// How long the contract's gates keep a hold record: far beyond any test.
pub const RECORD_TTL: Duration = Duration::from_secs(1800);

/// The record retention of [`records_expire_after_their_retention`]: short enough to
/// wait out on a real Redis.
pub const SHORT_RECORD_TTL: Duration = Duration::from_millis(800);

/// A fresh gate, and the clock it ages holds on.
#[async_trait(?Send)]
pub trait GateWorld: Sized + 'static {
    type Gate: StockGate + GateMaintenance;
    /// A gate with nothing loaded, keeping hold records for `record_ttl` and granting a
    /// sold-out lease of `lease` (zero: none).
    async fn open(lease: Duration, record_ttl: Duration) -> Self;
    fn gate(&self) -> &Self::Gate;
    /// Lets `d` pass on the gate's clock.
    async fn pass(&self, d: Duration);
    /// Removes what the test wrote.
    async fn close(self);
}

fn reserved(r: Reserve) -> HoldRef {
    match r {
        Reserve::Reserved { hold } => hold,
        other => panic!("expected a hold, got {other:?}"),
    }
}

/// `load` sets a product's count once (warm-up never overwrites), in the generation
/// given; `available` and `state` read it back.
pub async fn load_sets_the_count_once<W: GateWorld>(w: &W) {
    let g = w.gate();
    assert_eq!(g.available(product()).await.expect("available"), None);
    assert_eq!(g.state(product()).await.expect("state"), None);
    assert!(g.load(product(), 5, generation(2)).await.expect("load"));
    assert!(!g.load(product(), 9, generation(3)).await.expect("load"));
    assert_eq!(g.available(product()).await.expect("available"), Some(5));
    let state = g.state(product()).await.expect("state").expect("an entry");
    assert_eq!(state.available, 5);
    assert_eq!(state.generation, generation(2));
    assert_eq!(state.last_hold_id, 0);
    assert!(!state.server_changed);
}

/// Without an entry nothing is answered and nothing is created: reserve, release and
/// restock report it, adjust refuses.
pub async fn nothing_is_answered_without_an_entry<W: GateWorld>(w: &W) {
    let g = w.gate();
    let a = purchase("NL_A", 1, 1);
    assert_eq!(
        g.reserve(&a, None).await.expect("reserve"),
        Reserve::NotLoaded
    );
    let of = ReleaseOf::Hold { hold: hold(1, 1) };
    let released = g.release(product(), &a.request_id, &of).await;
    assert_eq!(released.expect("release"), Release::NotLoaded);
    let restocked = g
        .restock(&StockChange::new(
            product(),
            request_id("NL_R"),
            3,
            generation(1),
        ))
        .await;
    assert_eq!(restocked.expect("restock"), Restock::NotLoaded);
    assert!(!g.adjust(product(), &at(1, 0), 3).await.expect("adjust"));
    assert_eq!(g.available(product()).await.expect("available"), None);
}

/// Holds take units and are numbered from 1 in the entry's generation; a request_id
/// reserved again finds its hold (the stored user and quantity, whatever the replay
/// says) and takes nothing more; a purchase larger than what is left is refused, and
/// the count never goes below zero.
pub async fn reserve_takes_units_once_per_request_id<W: GateWorld>(w: &W) {
    let g = w.gate();
    assert!(g.load(product(), 5, generation(3)).await.expect("load"));
    let a = purchase("R_A", 1, 2);
    let b = purchase("R_B", 2, 2);
    assert_eq!(reserved(g.reserve(&a, None).await.expect("a")), hold(3, 1));
    assert_eq!(reserved(g.reserve(&b, None).await.expect("b")), hold(3, 2));
    let replay = purchase("R_A", 7, 1);
    match g.reserve(&replay, None).await.expect("replay") {
        Reserve::Existing(h) => {
            assert_eq!(h.hold, hold(3, 1));
            assert_eq!(h.user_id, user(1));
            assert_eq!(h.quantity.get(), 2);
            assert!(!h.released);
        }
        other => panic!("a replay found {other:?}"),
    }
    let c = purchase("R_C", 3, 2);
    assert!(matches!(
        g.reserve(&c, None).await.expect("c"),
        Reserve::SoldOut { lease: None, .. }
    ));
    let d = purchase("R_D", 4, 1);
    assert_eq!(reserved(g.reserve(&d, None).await.expect("d")), hold(3, 3));
    assert_eq!(g.available(product()).await.expect("available"), Some(0));
    let state = g.state(product()).await.expect("state").expect("entry");
    assert_eq!(state.last_hold_id, 3);
}

/// A refusal for a request_id the gate has never seen, on an entry loaded by this very
/// process within a record's lifetime, vouches for it (`unseen`); a refusal of a
/// request_id that holds units of an older generation does not find that hold.
pub async fn a_fresh_refusal_vouches_for_unseen_request_ids<W: GateWorld>(w: &W) {
    let g = w.gate();
    assert!(g.load(product(), 1, generation(1)).await.expect("load"));
    reserved(g.reserve(&purchase("U_A", 1, 1), None).await.expect("a"));
    match g.reserve(&purchase("U_B", 2, 1), None).await.expect("b") {
        Reserve::SoldOut { unseen, lease } => {
            assert!(
                unseen,
                "a fresh entry vouches for a request_id it never saw"
            );
            assert_eq!(lease, None);
        }
        other => panic!("expected sold out, got {other:?}"),
    }
    // After a rebuild the records of the lost state are gone: nothing is vouched for.
    let plan = RebuildPlan {
        generation: generation(2),
        available: 0,
        last_hold_id: 1,
        user_units: Vec::new(),
    };
    assert!(g.rebuild(product(), &plan).await.expect("rebuild"));
    match g.reserve(&purchase("U_C", 3, 1), None).await.expect("c") {
        Reserve::SoldOut { unseen, .. } => assert!(!unseen, "a rebuilt entry vouches for none"),
        other => panic!("expected sold out, got {other:?}"),
    }
}

/// The per-user limit counts the units a user holds; a release of a reservation of a
/// limited product gives the user's units back, so they may buy again.
pub async fn the_per_user_limit_counts_held_units<W: GateWorld>(w: &W) {
    let g = w.gate();
    assert!(g.load(product(), 10, generation(1)).await.expect("load"));
    let a = purchase("L_A", 1, 1);
    let first = reserved(g.reserve(&a, Some(2)).await.expect("a"));
    reserved(g.reserve(&purchase("L_B", 1, 1), Some(2)).await.expect("b"));
    assert!(matches!(
        g.reserve(&purchase("L_C", 1, 1), Some(2)).await.expect("c"),
        Reserve::LimitExceeded { .. }
    ));
    // Another user is not limited by the first one's units.
    reserved(g.reserve(&purchase("L_D", 2, 2), Some(2)).await.expect("d"));
    let of = ReleaseOf::Reservation {
        generation: generation(1),
        hold: first,
        user_id: user(1),
        quantity: a.quantity,
        limited: true,
        returns_units: true,
    };
    let released = g.release(product(), &a.request_id, &of).await;
    assert_eq!(released.expect("release"), Release::Released);
    reserved(g.reserve(&purchase("L_E", 1, 1), Some(2)).await.expect("e"));
    assert_eq!(g.available(product()).await.expect("available"), Some(6));
}

/// A hold's units come back once however often its release is called; the record then
/// says released, and a release naming another hold of the request_id, or one never
/// taken, gives nothing back.
pub async fn a_release_gives_units_back_once<W: GateWorld>(w: &W) {
    let g = w.gate();
    assert!(g.load(product(), 4, generation(1)).await.expect("load"));
    let a = purchase("X_A", 1, 3);
    let h = reserved(g.reserve(&a, None).await.expect("a"));
    let other = ReleaseOf::Hold { hold: hold(1, 9) };
    let not_mine = g.release(product(), &a.request_id, &other).await;
    assert_eq!(not_mine.expect("release"), Release::Missing);
    let of = ReleaseOf::Hold { hold: h };
    let first = g.release(product(), &a.request_id, &of).await;
    assert_eq!(first.expect("release"), Release::Released);
    let again = g.release(product(), &a.request_id, &of).await;
    assert_eq!(again.expect("release"), Release::AlreadyReleased);
    assert_eq!(g.available(product()).await.expect("available"), Some(4));
    match g.reserve(&a, None).await.expect("replay") {
        Reserve::Existing(e) => assert!(e.released && e.hold == h),
        other => panic!("a replay of a released hold found {other:?}"),
    }
    let never = request_id("X_NEVER");
    let missing = g.release(product(), &never, &of).await;
    assert_eq!(missing.expect("release"), Release::Missing);
    // A counted reservation's release is remembered by its own marker: twice is once.
    let b = purchase("X_B", 2, 1);
    let hb = reserved(g.reserve(&b, None).await.expect("b"));
    let counted = ReleaseOf::Reservation {
        generation: generation(1),
        hold: hb,
        user_id: user(2),
        quantity: b.quantity,
        limited: false,
        returns_units: true,
    };
    let first = g.release(product(), &b.request_id, &counted).await;
    assert_eq!(first.expect("release"), Release::Released);
    let again = g.release(product(), &b.request_id, &counted).await;
    assert_eq!(again.expect("release"), Release::AlreadyReleased);
    assert_eq!(g.available(product()).await.expect("available"), Some(4));
}

/// Releases respect generations: a hold of a generation the gate was rebuilt past gives
/// nothing back (the rebuild counted the stock without it); a release recorded in a
/// generation the gate has not reached waits (`NotLoaded`).
pub async fn releases_respect_generations<W: GateWorld>(w: &W) {
    let g = w.gate();
    assert!(g.load(product(), 3, generation(1)).await.expect("load"));
    let a = purchase("G_A", 1, 2);
    let old = reserved(g.reserve(&a, None).await.expect("a"));
    let plan = RebuildPlan {
        generation: generation(2),
        available: 3,
        last_hold_id: 5,
        user_units: Vec::new(),
    };
    assert!(g.rebuild(product(), &plan).await.expect("rebuild"));
    let stale = g
        .release(product(), &a.request_id, &ReleaseOf::Hold { hold: old })
        .await;
    assert_eq!(stale.expect("release"), Release::AlreadyReleased);
    assert_eq!(g.available(product()).await.expect("available"), Some(3));
    let ahead = ReleaseOf::Reservation {
        generation: generation(3),
        hold: old,
        user_id: user(1),
        quantity: a.quantity,
        limited: false,
        returns_units: true,
    };
    let waits = g.release(product(), &a.request_id, &ahead).await;
    assert_eq!(waits.expect("release"), Release::NotLoaded);
    // The request may reserve afresh in the new generation; ids continue past the plan.
    assert_eq!(
        reserved(g.reserve(&a, None).await.expect("again")),
        hold(2, 6)
    );
}

/// A restock adds its units once per restock id, only in the generation it was recorded
/// in: an older one is stale (the rebuild counted it), a newer one waits for the rebuild.
pub async fn a_restock_applies_once_in_its_generation<W: GateWorld>(w: &W) {
    let g = w.gate();
    assert!(g.load(product(), 1, generation(1)).await.expect("load"));
    let r = StockChange::new(product(), request_id("S_R1"), 4, generation(1));
    let first = g.restock(&r).await;
    assert_eq!(first.expect("restock"), Restock::Applied);
    let again = g.restock(&r).await;
    assert_eq!(again.expect("restock"), Restock::AlreadyApplied);
    assert_eq!(g.available(product()).await.expect("available"), Some(5));
    let ahead = g
        .restock(&StockChange::new(
            product(),
            request_id("S_R2"),
            2,
            generation(2),
        ))
        .await;
    assert_eq!(ahead.expect("restock"), Restock::NotLoaded);
    let plan = RebuildPlan {
        generation: generation(2),
        available: 7,
        last_hold_id: 0,
        user_units: Vec::new(),
    };
    assert!(g.rebuild(product(), &plan).await.expect("rebuild"));
    let stale = g
        .restock(&StockChange::new(
            product(),
            request_id("S_R3"),
            2,
            generation(1),
        ))
        .await;
    assert_eq!(stale.expect("restock"), Restock::Stale);
    assert_eq!(g.available(product()).await.expect("available"), Some(7));
}

/// A destock takes available units only, once per destock id in its generation: held
/// units are not available, more than is left is refused (and answered so again), a
/// destock of a generation the gate has not reached waits, and after a rebuild the same
/// destock of the older generation is stale while the newer one takes again.
pub async fn a_destock_takes_available_units_once_in_its_generation<W: GateWorld>(w: &W) {
    let g = w.gate();
    assert!(g.load(product(), 5, generation(1)).await.expect("load"));
    reserved(g.reserve(&purchase("D_A", 1, 2), None).await.expect("a"));
    let d = StockChange::new(product(), request_id("D_D1"), 2, generation(1));
    for _ in 0..2 {
        let taken = g.destock(&d).await;
        assert_eq!(taken.expect("destock"), Destock::Taken);
    }
    let more = StockChange::new(product(), request_id("D_D2"), 2, generation(1));
    for _ in 0..2 {
        let refused = g.destock(&more).await;
        assert_eq!(refused.expect("destock"), Destock::Refused);
    }
    assert_eq!(g.available(product()).await.expect("available"), Some(1));
    let ahead = g
        .destock(&StockChange::new(
            product(),
            request_id("D_D3"),
            1,
            generation(2),
        ))
        .await;
    assert_eq!(ahead.expect("destock"), Destock::NotLoaded);
    let plan = RebuildPlan {
        generation: generation(2),
        available: 3,
        last_hold_id: 1,
        user_units: Vec::new(),
    };
    assert!(g.rebuild(product(), &plan).await.expect("rebuild"));
    let stale = g.destock(&d).await;
    assert_eq!(stale.expect("destock"), Destock::Stale);
    let newer = StockChange {
        generation: generation(2),
        ..d
    };
    let again = g.destock(&newer).await;
    assert_eq!(again.expect("destock"), Destock::Taken);
    assert_eq!(g.available(product()).await.expect("available"), Some(1));
}

/// A rebuild replaces the entry with the ledger's plan in a newer generation only, with
/// its per-user counts; the holds of the old state are no longer held or pending.
pub async fn a_rebuild_replaces_the_entry_in_a_newer_generation<W: GateWorld>(w: &W) {
    let g = w.gate();
    assert!(g.load(product(), 5, generation(1)).await.expect("load"));
    reserved(g.reserve(&purchase("B_A", 1, 2), Some(3)).await.expect("a"));
    let plan = RebuildPlan {
        generation: generation(4),
        available: 6,
        last_hold_id: 10,
        user_units: vec![(user(1), 3)],
    };
    assert!(g.rebuild(product(), &plan).await.expect("rebuild"));
    assert!(!g.rebuild(product(), &plan).await.expect("same generation"));
    let older = RebuildPlan {
        generation: generation(3),
        ..plan.clone()
    };
    assert!(!g
        .rebuild(product(), &older)
        .await
        .expect("older generation"));
    let state = g.state(product()).await.expect("state").expect("entry");
    assert_eq!(state.available, 6);
    assert_eq!(state.generation, generation(4));
    assert_eq!(state.last_hold_id, 10);
    assert!(!state.server_changed);
    let facts = g.facts(product()).await.expect("facts");
    assert!(facts.held.is_empty(), "{facts:?}");
    assert!(facts.pending.is_empty(), "{facts:?}");
    // The plan's per-user count: user 1 already holds 3 of a limit of 3.
    assert!(matches!(
        g.reserve(&purchase("B_B", 1, 1), Some(3)).await.expect("b"),
        Reserve::LimitExceeded { .. }
    ));
    assert_eq!(
        reserved(g.reserve(&purchase("B_C", 2, 1), Some(3)).await.expect("c")),
        hold(4, 11)
    );
}

/// The gate's count as a look in generation `generation` read it, before any hold.
fn at(generation: i64, available: i64) -> GateCount {
    GateCount {
        generation: crate::generation(generation),
        available,
        last_hold_id: 0,
    }
}

/// Reconciliation's adjustment moves the count by a delta from the count it measured in
/// the generation it measured, never below zero; run a second time (a retry after a
/// lost reply), from a count that moved since, in another generation (a rebuild since,
/// even one that left the same count), or after a hold was taken since (even one given
/// back, which leaves the same count), it changes nothing.
pub async fn adjust_never_goes_below_zero<W: GateWorld>(w: &W) {
    let g = w.gate();
    let g1 = generation(1);
    assert!(g.load(product(), 2, g1).await.expect("load"));
    assert!(g.adjust(product(), &at(1, 2), 3).await.expect("up"));
    assert!(
        !g.adjust(product(), &at(1, 2), 3).await.expect("again"),
        "a second run finds the count it left"
    );
    assert!(g.adjust(product(), &at(1, 5), -4).await.expect("down"));
    assert!(!g
        .adjust(product(), &at(1, 1), -2)
        .await
        .expect("below zero"));
    assert!(!g.adjust(product(), &at(1, 7), 1).await.expect("moved"));
    assert!(
        !g.adjust(product(), &at(2, 1), 1).await.expect("newer"),
        "the count was not read in generation 2"
    );
    let looked = g
        .facts(product())
        .await
        .expect("facts")
        .count()
        .expect("a count");
    let a = purchase("AD_A", 1, 1);
    let Reserve::Reserved { hold } = g.reserve(&a, None).await.expect("reserve") else {
        panic!("a hold");
    };
    let of = ReleaseOf::Hold { hold };
    let released = g
        .release(product(), &a.request_id, &of)
        .await
        .expect("release");
    assert_eq!(released, Release::Released);
    assert_eq!(g.available(product()).await.expect("available"), Some(1));
    assert!(
        !g.adjust(product(), &looked, 1).await.expect("a hold since"),
        "a hold was taken and given back since the look: the same count, not the same state"
    );
    assert_eq!(g.available(product()).await.expect("available"), Some(1));
    let plan = RebuildPlan {
        generation: generation(2),
        available: 1,
        last_hold_id: 0,
        user_units: Vec::new(),
    };
    assert!(g.rebuild(product(), &plan).await.expect("rebuild"));
    assert!(
        !g.adjust(product(), &looked, 1).await.expect("stale"),
        "measured before the rebuild, whose count happens to be the same"
    );
    assert_eq!(g.available(product()).await.expect("available"), Some(1));
    assert!(g.adjust(product(), &at(2, 1), 1).await.expect("rebuilt"));
    assert_eq!(g.available(product()).await.expect("available"), Some(2));
}

/// The pending index lists the holds the ledger may not account for yet, with their
/// generation, and says when there are more than asked; recovery finds the ones older
/// than an age on the gate's clock, oldest first, and `forget_pending` drops them from
/// the index (only while the record is still that hold).
pub async fn pending_holds_are_listed_aged_and_forgotten<W: GateWorld>(w: &W) {
    let g = w.gate();
    assert!(g.load(product(), 10, generation(1)).await.expect("load"));
    let a = purchase("P_A", 1, 1);
    let ha = reserved(g.reserve(&a, None).await.expect("a"));
    w.pass(Duration::from_millis(50)).await;
    let b = purchase("P_B", 2, 2);
    let hb = reserved(g.reserve(&b, None).await.expect("b"));
    w.pass(Duration::from_millis(50)).await;
    let (gen, ids) = g
        .pending_request_ids(product(), 10)
        .await
        .expect("pending")
        .expect("all of them");
    assert_eq!(gen, generation(1));
    let ids: BTreeSet<_> = ids.iter().map(|r| r.as_str().to_owned()).collect();
    assert_eq!(ids, BTreeSet::from(["P_A".to_owned(), "P_B".to_owned()]));
    assert_eq!(
        g.pending_request_ids(product(), 1).await.expect("pending"),
        None
    );

    let stale = g
        .stale_holds(product(), Duration::from_millis(20), 10)
        .await
        .expect("stale");
    let expected = vec![
        StaleHold {
            request: a.clone(),
            hold: ha,
            released: false,
        },
        StaleHold {
            request: b.clone(),
            hold: hb,
            released: false,
        },
    ];
    assert_eq!(stale, expected, "oldest first");
    let oldest = g
        .stale_holds(product(), Duration::from_millis(20), 1)
        .await
        .expect("stale");
    assert_eq!(oldest, expected[..1]);
    assert!(g
        .stale_holds(product(), Duration::from_secs(3600), 10)
        .await
        .expect("none that old")
        .is_empty());

    // A forget naming another hold of the request_id leaves the entry alone.
    let wrong = StaleHold {
        hold: hold(1, 7),
        ..expected[0].clone()
    };
    g.forget_pending(product(), &[wrong]).await.expect("forget");
    g.forget_pending(product(), &expected[..1])
        .await
        .expect("forget");
    let (_, left) = g
        .pending_request_ids(product(), 10)
        .await
        .expect("pending")
        .expect("all");
    assert_eq!(left, vec![b.request_id.clone()]);
}

/// The audit's facts: the count, generation and last hold id, the holds whose units are
/// still taken (a released one is not), and the pending index with ages.
pub async fn facts_tell_what_is_held<W: GateWorld>(w: &W) {
    let g = w.gate();
    assert!(g.load(product(), 10, generation(2)).await.expect("load"));
    let a = purchase("F_A", 1, 2);
    let b = purchase("F_B", 2, 3);
    let ha = reserved(g.reserve(&a, None).await.expect("a"));
    let hb = reserved(g.reserve(&b, None).await.expect("b"));
    let released = g
        .release(product(), &b.request_id, &ReleaseOf::Hold { hold: hb })
        .await;
    assert_eq!(released.expect("release"), Release::Released);
    // Another product's holds are not this one's facts.
    assert!(g.load(product_n(2), 5, generation(1)).await.expect("load"));
    reserved(
        g.reserve(&purchase_of(product_n(2), "F_C", 3, 1), None)
            .await
            .expect("c"),
    );
    w.pass(Duration::from_millis(30)).await;
    let facts = g.facts(product()).await.expect("facts");
    assert_eq!(facts.available, Some(8));
    assert_eq!(facts.generation, Some(generation(2)));
    assert_eq!(facts.last_hold_id, 2);
    assert_eq!(facts.held.len(), 1, "{facts:?}");
    assert_eq!(facts.held.get("F_A"), Some(&(ha.id, 2)));
    let pending: Vec<_> = facts.pending.keys().cloned().collect();
    assert_eq!(
        pending,
        vec!["F_A".to_owned()],
        "a release leaves the index"
    );
    assert!(facts.pending["F_A"] >= Duration::from_millis(20));
    let none = g.facts(product_n(3)).await.expect("facts");
    assert_eq!(none.available, None);
    assert_eq!(none.generation, None);
    assert!(none.held.is_empty());
}

/// Concurrent purchases of one product — distinct ones and copies of the same
/// request_id, as a flood with client retries sends them (batched into one script call
/// where the adapter batches) — sell exactly the stock: each request_id gets one hold,
/// every copy of it finds that hold, and hold ids are 1..=stock.
pub async fn concurrent_reserves_sell_exactly_the_stock<W: GateWorld>(w: &W) {
    const STOCK: i64 = 12;
    const BUYERS: i64 = 30;
    let g = w.gate();
    assert!(g.load(product(), STOCK, generation(1)).await.expect("load"));
    let requests: Vec<_> = (0..BUYERS)
        .chain(0..BUYERS / 2)
        .map(|i| purchase(&format!("C_{i}"), 100 + i, 1))
        .collect();
    let answers = futures::future::join_all(requests.iter().map(|r| g.reserve(r, None))).await;
    let mut holds = std::collections::BTreeMap::new();
    let mut refused = BTreeSet::new();
    for (r, answer) in requests.iter().zip(answers) {
        let id = r.request_id.as_str().to_owned();
        match answer.expect("reserve") {
            Reserve::Reserved { hold } => {
                assert!(holds.insert(id, hold).is_none(), "{r:?} reserved twice")
            }
            Reserve::Existing(e) => {
                // The copy that got the hold may come later in the list; checked below.
                assert!(!e.released);
                assert_eq!(e.user_id, r.user_id);
            }
            Reserve::SoldOut { .. } => {
                refused.insert(id);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(holds.len() as i64, STOCK, "{holds:?}");
    let ids: BTreeSet<i64> = holds.values().map(|h| h.id.get()).collect();
    assert_eq!(ids, (1..=STOCK).collect());
    assert!(holds.keys().all(|id| !refused.contains(id)));
    // Every copy of a held request_id now finds that very hold.
    for r in &requests {
        if let Some(&h) = holds.get(r.request_id.as_str()) {
            match g.reserve(r, None).await.expect("replay") {
                Reserve::Existing(e) => assert_eq!(e.hold, h),
                other => panic!("replay of {r:?} found {other:?}"),
            }
        }
    }
    assert_eq!(g.available(product()).await.expect("available"), Some(0));
}

/// A purchase that finds no unit left grants a sold-out lease (no hold until it ends,
/// reported with the holds granted so far); units that come back end it at once.
pub async fn a_sold_out_lease_ends_when_units_come_back<W: GateWorld>(w: &W) {
    let g = w.gate();
    assert!(g.load(product(), 1, generation(1)).await.expect("load"));
    let a = purchase("Z_A", 1, 1);
    let h = reserved(g.reserve(&a, None).await.expect("a"));
    let lease = match g.reserve(&purchase("Z_B", 2, 1), None).await.expect("b") {
        Reserve::SoldOut {
            lease: Some(lease), ..
        } => lease,
        other => panic!("expected a lease, got {other:?}"),
    };
    assert!(lease.remaining <= Duration::from_secs(60));
    assert_eq!(lease.generation, generation(1));
    assert_eq!(lease.holds, 1);
    let released = g
        .release(product(), &a.request_id, &ReleaseOf::Hold { hold: h })
        .await;
    assert_eq!(released.expect("release"), Release::Released);
    assert_eq!(
        reserved(g.reserve(&purchase("Z_C", 3, 1), None).await.expect("c")),
        hold(1, 2)
    );
}

/// Retiring an entry (before the way back from ledger mode) stops it vouching for
/// unseen request_ids and granting sold-out leases, and ends the lease granted: a
/// refusal afterwards vouches for none and carries no lease. Nothing else changes (the
/// count, the holds); retiring again, or a product with no entry, is harmless.
pub async fn a_retired_entry_vouches_for_none_and_grants_no_lease<W: GateWorld>(w: &W) {
    let g = w.gate();
    assert!(!g.retire(product()).await.expect("no entry"));
    assert!(g.load(product(), 1, generation(1)).await.expect("load"));
    reserved(g.reserve(&purchase("T_A", 1, 1), None).await.expect("a"));
    match g.reserve(&purchase("T_B", 2, 1), None).await.expect("b") {
        Reserve::SoldOut { unseen, lease } => {
            assert!(unseen, "fresh before it is retired");
            assert!(lease.is_some(), "a lease before it is retired");
        }
        other => panic!("expected sold out, got {other:?}"),
    }
    for _ in 0..2 {
        assert!(g.retire(product()).await.expect("retire"));
    }
    match g.reserve(&purchase("T_C", 3, 1), None).await.expect("c") {
        Reserve::SoldOut { unseen, lease } => {
            assert!(!unseen, "a retired entry vouches for none");
            assert_eq!(lease, None, "a retired entry grants no lease");
        }
        other => panic!("expected sold out, got {other:?}"),
    }
    let state = g.state(product()).await.expect("state").expect("entry");
    assert_eq!((state.available, state.last_hold_id), (0, 1));
}

/// Hold records expire after their retention on the gate's clock: recovery then drops
/// their index entries and reports nothing for them, a replay of the request_id takes
/// a new hold, and a refusal no longer vouches that a request_id was never seen (its
/// record may be gone).
pub async fn records_expire_after_their_retention<W: GateWorld>(w: &W) {
    let g = w.gate();
    assert!(g.load(product(), 3, generation(1)).await.expect("load"));
    let a = purchase("T_A", 1, 1);
    assert_eq!(reserved(g.reserve(&a, None).await.expect("a")), hold(1, 1));
    w.pass(SHORT_RECORD_TTL + Duration::from_millis(400)).await;
    let stale = g
        .stale_holds(product(), Duration::from_millis(100), 10)
        .await
        .expect("stale");
    assert!(
        stale.is_empty(),
        "an expired record recovers nothing: {stale:?}"
    );
    let (_, ids) = g
        .pending_request_ids(product(), 10)
        .await
        .expect("pending")
        .expect("all");
    assert!(
        ids.is_empty(),
        "the expired record's index entry was dropped: {ids:?}"
    );
    assert_eq!(
        reserved(g.reserve(&a, None).await.expect("again")),
        hold(1, 2)
    );
    reserved(g.reserve(&purchase("T_B", 2, 1), None).await.expect("b"));
    match g.reserve(&purchase("T_C", 3, 1), None).await.expect("c") {
        Reserve::SoldOut { unseen, .. } => {
            assert!(!unseen, "past a record's lifetime nothing is vouched for")
        }
        other => panic!("expected sold out, got {other:?}"),
    }
}

/// Expands to one `#[tokio::test]` per body of the gate's contract, over world `$w`.
#[macro_export]
macro_rules! gate_contract {
    ($w:ty) => {
        $crate::gate_contract!(@tests $w, ::std::time::Duration::ZERO, $crate::gate::RECORD_TTL;
            load_sets_the_count_once,
            nothing_is_answered_without_an_entry,
            reserve_takes_units_once_per_request_id,
            a_fresh_refusal_vouches_for_unseen_request_ids,
            the_per_user_limit_counts_held_units,
            a_release_gives_units_back_once,
            releases_respect_generations,
            a_restock_applies_once_in_its_generation,
            a_destock_takes_available_units_once_in_its_generation,
            a_rebuild_replaces_the_entry_in_a_newer_generation,
            adjust_never_goes_below_zero,
            pending_holds_are_listed_aged_and_forgotten,
            facts_tell_what_is_held,
            concurrent_reserves_sell_exactly_the_stock,
        );
        $crate::gate_contract!(@tests $w, ::std::time::Duration::from_secs(30), $crate::gate::RECORD_TTL;
            a_sold_out_lease_ends_when_units_come_back,
            a_retired_entry_vouches_for_none_and_grants_no_lease,
        );
        $crate::gate_contract!(@tests $w, ::std::time::Duration::ZERO, $crate::gate::SHORT_RECORD_TTL;
            records_expire_after_their_retention,
        );
    };
    (@tests $w:ty, $lease:expr, $ttl:expr; $($name:ident),* $(,)?) => {
        $(
            // The gate contract's body of the same name (crates/contract/src/gate.rs).
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let world = <$w as $crate::gate::GateWorld>::open($lease, $ttl).await;
                $crate::gate::$name(&world).await;
                $crate::gate::GateWorld::close(world).await;
            }
        )*
    };
}
