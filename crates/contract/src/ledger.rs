//! The ledger's contract (`Ledger` + `LedgerMaintenance`): what the SQL's unique keys,
//! conditional UPDATEs, generation fence and group commit promise.

use std::collections::BTreeSet;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{TimeZone, Utc};
use flashsale_app::modes::LEDGER_SALES_AFTER_SWITCH;
use flashsale_app::ports::{
    AuditSchedule, AuditVerdict, Commit, CreateProduct, ExpiredOrder, Fence, HeldPurchase, Leave,
    LedgerMaintenance, LedgerPurchase, ModeSwitch, RecordRestock, ReleaseOf,
};
use flashsale_app::{Ledger, Order, PurchaseOutcome};
use flashsale_core::{
    AdminName, CancelReason, HoldRef, InventoryCounters, OrderStatus, ProductId, PurchaseRequest,
    ReleaseReason, StockMode, Terms,
};

use crate::{
    action, generation, hold, new_product, product, product_n, purchase, request_id, user,
};

/// A payment deadline no test reaches.
pub const PAYMENT_TIMEOUT: Duration = Duration::from_secs(900);

/// Terms with `per_user_limit` and a payment deadline no test reaches.
pub fn terms(per_user_limit: Option<u32>) -> Terms {
    Terms {
        per_user_limit,
        payment_timeout: PAYMENT_TIMEOUT,
    }
}

/// A fresh, empty ledger, and the clock its deadlines are decided on.
#[async_trait(?Send)]
pub trait LedgerWorld: Sized + 'static {
    type Ledger: Ledger + LedgerMaintenance;
    async fn open() -> Self;
    fn ledger(&self) -> &Self::Ledger;
    /// Lets `d` pass on the ledger's clock.
    async fn pass(&self, d: Duration);
    /// Removes what the test wrote.
    async fn close(self);
}

/// Creates [`product`] (or `product_id`) with `stock` units.
pub async fn create<L: Ledger>(l: &L, product_id: ProductId, stock: i64, limit: Option<i64>) {
    match l
        .create_product(
            &new_product(product_id, stock, limit),
            &AdminName::default(),
        )
        .await
        .expect("create")
    {
        CreateProduct::Created(p) => assert_eq!(p.product_id, product_id),
        other => panic!("expected a new product, got {other:?}"),
    }
}

async fn commit<L: Ledger>(l: &L, r: &PurchaseRequest, h: HoldRef, limit: Option<u32>) -> Commit {
    l.commit_purchase(&HeldPurchase::new(r, h, terms(limit)))
        .await
        .expect("commit")
}

fn committed(c: Commit) -> Order {
    match c {
        Commit::Committed(order) => order,
        other => panic!("expected an order, got {other:?}"),
    }
}

async fn counters<L: Ledger>(l: &L) -> InventoryCounters {
    l.inventory(product())
        .await
        .expect("inventory")
        .expect("a product")
}

/// A product is created once: a second create finds the stored one and its total.
pub async fn a_product_is_created_once<W: LedgerWorld>(w: &W) {
    let l = w.ledger();
    assert_eq!(l.product(product()).await.expect("product"), None);
    create(l, product(), 7, Some(2)).await;
    match l
        .create_product(&new_product(product(), 99, None), &AdminName::default())
        .await
        .expect("again")
    {
        CreateProduct::Exists(p, total) => {
            assert_eq!(p.per_user_limit, Some(2));
            assert_eq!(total, 7);
        }
        other => panic!("a second create found {other:?}"),
    }
    let p = l
        .product(product())
        .await
        .expect("product")
        .expect("stored");
    assert!(!p.stock_loaded);
    l.mark_stock_loaded(product()).await.expect("loaded");
    assert!(
        l.product(product())
            .await
            .expect("p")
            .expect("p")
            .stock_loaded
    );
    assert_eq!(
        l.generation(product()).await.expect("gen"),
        Some(generation(1))
    );
    let c = counters(l).await;
    assert_eq!((c.total, c.available, c.reserved, c.sold), (7, 7, 0, 0));
}

/// A purchase commits once per request_id: the order is pending payment, the counters
/// move, and a second commit — the same hold or another — is answered with the record.
pub async fn a_purchase_commits_once_per_request_id<W: LedgerWorld>(w: &W) {
    let l = w.ledger();
    create(l, product(), 5, None).await;
    let a = purchase("C_A", 1, 2);
    let order = committed(commit(l, &a, hold(1, 1), None).await);
    assert_eq!(order.request_id, a.request_id);
    assert_eq!(order.user_id, user(1));
    assert_eq!(order.quantity.get(), 2);
    assert_eq!(order.status, OrderStatus::PendingPayment);
    for h in [hold(1, 1), hold(1, 2)] {
        match commit(l, &a, h, None).await {
            Commit::Duplicate(record) => {
                assert_eq!(record.hold, hold(1, 1));
                assert_eq!(record.outcome, PurchaseOutcome::Order(order.clone()));
            }
            other => panic!("a second commit got {other:?}"),
        }
    }
    let found = l.find_purchase(&a.request_id).await.expect("find");
    let found = found.expect("a record");
    assert!(found.is_hold(product(), hold(1, 1)));
    assert_eq!(
        l.find_purchase(&request_id("C_NONE")).await.expect("f"),
        None
    );
    assert_eq!(l.order(order.order_id).await.expect("order"), Some(order));
    let c = counters(l).await;
    assert_eq!((c.total, c.available, c.reserved, c.sold), (5, 3, 2, 0));
}

/// The ledger checks for itself what the gate checked: too few units, a user over the
/// per-user limit (live orders count), and a hold of a generation that was advanced
/// past; each refusal writes nothing. A gate never loaded (or retired) has no entry for
/// the gate watch to rebuild: no plan until it is loaded.
pub async fn the_ledger_refuses_what_the_gate_wrongly_admits<W: LedgerWorld>(w: &W) {
    let l = w.ledger();
    create(l, product(), 3, Some(2)).await;
    let unloaded = l.advance_generation(product()).await.expect("advance");
    assert!(unloaded.is_none(), "no plan for a gate not loaded");
    l.mark_stock_loaded(product()).await.expect("loaded");
    committed(commit(l, &purchase("V_A", 1, 2), hold(1, 1), Some(2)).await);
    assert_eq!(
        commit(l, &purchase("V_B", 1, 1), hold(1, 2), Some(2)).await,
        Commit::LimitExceeded
    );
    assert_eq!(
        commit(l, &purchase("V_C", 2, 2), hold(1, 3), Some(2)).await,
        Commit::InsufficientStock
    );
    let plan = l
        .advance_generation(product())
        .await
        .expect("advance")
        .expect("a plan in gate mode");
    assert_eq!(plan.generation, generation(2));
    assert_eq!(plan.available, 1);
    assert!(plan.last_hold_id >= 1);
    assert_eq!(plan.user_units, vec![(user(1), 2)]);
    assert_eq!(
        commit(l, &purchase("V_D", 3, 1), hold(1, 4), Some(2)).await,
        Commit::StaleGeneration
    );
    let next = plan.last_hold_id + 1;
    committed(commit(l, &purchase("V_D", 3, 1), hold(2, next), Some(2)).await);
    for refused in ["V_B", "V_C"] {
        assert_eq!(
            l.find_purchase(&request_id(refused)).await.expect("f"),
            None
        );
    }
    let c = counters(l).await;
    assert_eq!((c.total, c.available, c.reserved, c.sold), (3, 0, 3, 0));
}

/// A fence takes the request_id with a released reservation and no order, so a late
/// commit of that request finds the fence; a fence of a committed request finds the
/// order and changes nothing.
pub async fn a_fence_blocks_a_late_commit<W: LedgerWorld>(w: &W) {
    let l = w.ledger();
    create(l, product(), 5, None).await;
    let a = purchase("F_A", 1, 1);
    assert_eq!(
        l.fence(&a, hold(1, 1), ReleaseReason::Abandoned)
            .await
            .expect("fence"),
        Fence::Fenced
    );
    assert_eq!(
        l.fence(&a, hold(1, 1), ReleaseReason::Abandoned)
            .await
            .expect("again"),
        Fence::Duplicate(flashsale_app::PurchaseRecord {
            request: a.clone(),
            hold: hold(1, 1),
            outcome: PurchaseOutcome::Released {
                reason: ReleaseReason::Abandoned
            },
        })
    );
    match commit(l, &a, hold(1, 1), None).await {
        Commit::Duplicate(record) => assert_eq!(
            record.outcome,
            PurchaseOutcome::Released {
                reason: ReleaseReason::Abandoned
            }
        ),
        other => panic!("a late commit got {other:?}"),
    }
    let b = purchase("F_B", 2, 1);
    let order = committed(commit(l, &b, hold(1, 2), None).await);
    match l
        .fence(&b, hold(1, 2), ReleaseReason::Abandoned)
        .await
        .expect("fence")
    {
        Fence::Duplicate(record) => assert_eq!(record.outcome, PurchaseOutcome::Order(order)),
        other => panic!("a fence of an order got {other:?}"),
    }
    let c = counters(l).await;
    assert_eq!((c.available, c.reserved), (4, 1), "a fence takes no stock");
    let ids = l
        .reservation_request_ids(product(), 10)
        .await
        .expect("ids")
        .expect("all");
    let ids: BTreeSet<_> = ids.iter().map(|r| r.as_str().to_owned()).collect();
    assert_eq!(ids, BTreeSet::from(["F_A".to_owned(), "F_B".to_owned()]));
    assert_eq!(
        l.reservation_request_ids(product(), 1).await.expect("ids"),
        None
    );
}

/// Payment moves an order to paid once; a cancel moves an unpaid one to cancelled once,
/// leaving its units to be returned to the gate (once marked returned, no longer
/// pending); neither applies to another user's order or a settled one.
pub async fn pay_and_cancel_resolve_an_order_once<W: LedgerWorld>(w: &W) {
    let l = w.ledger();
    create(l, product(), 5, Some(3)).await;
    // Holds are taken from a loaded gate, which a return goes back to.
    l.mark_stock_loaded(product()).await.expect("loaded");
    let paid = committed(commit(l, &purchase("P_A", 1, 1), hold(1, 1), Some(3)).await);
    let cancelled = committed(commit(l, &purchase("P_B", 2, 2), hold(1, 2), Some(3)).await);
    assert_eq!(l.pay(paid.order_id, user(9)).await.expect("pay"), None);
    let first = l
        .pay(paid.order_id, user(1))
        .await
        .expect("pay")
        .expect("o");
    assert!(first.applied && !first.expired);
    assert_eq!(first.order.status, OrderStatus::Paid);
    let again = l
        .pay(paid.order_id, user(1))
        .await
        .expect("pay")
        .expect("o");
    assert!(!again.applied);
    let cancel_paid = l
        .cancel(paid.order_id, user(1), CancelReason::UserCancelled)
        .await
        .expect("cancel")
        .expect("o");
    assert!(!cancel_paid.applied);
    assert_eq!(cancel_paid.order.status, OrderStatus::Paid);

    let attempt = l
        .cancel(cancelled.order_id, user(2), CancelReason::UserCancelled)
        .await
        .expect("cancel")
        .expect("o");
    assert!(attempt.applied);
    assert_eq!(attempt.order.status, OrderStatus::Cancelled);
    let expected = ReleaseOf::Reservation {
        generation: generation(1),
        hold: hold(1, 2),
        user_id: user(2),
        quantity: cancelled.quantity,
        limited: true,
        returns_units: true,
    };
    assert_eq!(attempt.pending_return, Some(expected));
    let twice = l
        .cancel(cancelled.order_id, user(2), CancelReason::UserCancelled)
        .await
        .expect("cancel")
        .expect("o");
    assert!(!twice.applied);
    let pay_cancelled = l.pay(cancelled.order_id, user(2)).await.expect("p");
    assert!(!pay_cancelled.expect("o").applied);
    let returns = l.pending_returns(10).await.expect("returns");
    assert_eq!(returns.len(), 1, "{returns:?}");
    assert_eq!(returns[0].request_id, request_id("P_B"));
    assert_eq!(returns[0].of, expected);
    l.mark_stock_returned(&request_id("P_B"))
        .await
        .expect("mark");
    assert!(l.pending_returns(10).await.expect("returns").is_empty());
    let c = counters(l).await;
    assert_eq!((c.total, c.available, c.reserved, c.sold), (5, 4, 0, 1));
}

/// An unpaid order past its deadline on the ledger's clock is listed and expired once;
/// one still within it is neither, and a paid one never.
pub async fn orders_expire_on_the_ledgers_clock<W: LedgerWorld>(w: &W) {
    let l = w.ledger();
    create(l, product(), 5, None).await;
    let short = l
        .commit_purchase(&HeldPurchase::new(
            &purchase("E_A", 1, 1),
            hold(1, 1),
            Terms {
                per_user_limit: None,
                payment_timeout: Duration::from_secs(1),
            },
        ))
        .await
        .expect("commit");
    let short = committed(short);
    let long = committed(commit(l, &purchase("E_B", 2, 1), hold(1, 2), None).await);
    assert!(l.expired_orders(10).await.expect("expired").is_empty());
    let early = ExpiredOrder {
        order_id: short.order_id,
        user_id: user(1),
    };
    let before = l.expire(&early).await.expect("expire").expect("o");
    assert!(!before.applied, "not past its deadline yet");
    w.pass(Duration::from_millis(1500)).await;
    let expired = l.expired_orders(10).await.expect("expired");
    assert_eq!(expired, vec![early.clone()]);
    let attempt = l.expire(&early).await.expect("expire").expect("o");
    assert!(attempt.applied);
    assert_eq!(attempt.order.status, OrderStatus::Cancelled);
    assert_eq!(
        attempt.order.cancel_reason,
        Some(CancelReason::PaymentTimeout)
    );
    assert!(attempt.pending_return.is_some());
    assert!(!l.expire(&early).await.expect("again").expect("o").applied);
    assert!(l.expired_orders(10).await.expect("expired").is_empty());
    let paid = l
        .pay(long.order_id, user(2))
        .await
        .expect("pay")
        .expect("o");
    assert!(paid.applied);
}

/// A restock is recorded once per restock id (in the current generation), refused when
/// the same id names another product or quantity, listed until marked applied, and
/// refused when the total would pass the largest stock a product may have.
pub async fn a_restock_is_recorded_once<W: LedgerWorld>(w: &W) {
    let l = w.ledger();
    create(l, product(), 5, None).await;
    create(l, product_n(2), 5, None).await;
    let r = request_id("S_R1");
    let first = l
        .record_restock(&action(product(), &r), 3)
        .await
        .expect("restock");
    assert_eq!(
        first,
        RecordRestock::Recorded {
            applied: false,
            generation: generation(1)
        }
    );
    assert_eq!(
        l.record_restock(&action(product(), &r), 3)
            .await
            .expect("again"),
        first
    );
    assert_eq!(
        l.record_restock(&action(product(), &r), 4)
            .await
            .expect("other quantity"),
        RecordRestock::Conflict
    );
    assert_eq!(
        l.record_restock(&action(product_n(2), &r), 3)
            .await
            .expect("other product"),
        RecordRestock::Conflict
    );
    let pending = l.pending_restocks(10).await.expect("pending");
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0].id, r);
    assert_eq!(pending[0].quantity, 3);
    l.mark_restock_applied(&r).await.expect("applied");
    assert!(l.pending_restocks(10).await.expect("pending").is_empty());
    assert_eq!(
        l.record_restock(&action(product(), &r), 3)
            .await
            .expect("after"),
        RecordRestock::Recorded {
            applied: true,
            generation: generation(1)
        }
    );
    assert_eq!(
        l.record_restock(&action(product(), &request_id("S_BIG")), i64::MAX / 2)
            .await
            .expect("too large"),
        RecordRestock::TooLarge
    );
    let c = counters(l).await;
    assert_eq!((c.total, c.available), (8, 8));
}

/// Advancing a generation plans the gate from committed facts: released units not yet
/// returned and restocks not yet applied count as done, hold ids continue above every
/// recorded one, and the watermark follows.
pub async fn advancing_a_generation_plans_from_the_facts<W: LedgerWorld>(w: &W) {
    let l = w.ledger();
    create(l, product(), 10, Some(5)).await;
    l.mark_stock_loaded(product()).await.expect("loaded");
    committed(commit(l, &purchase("A_A", 1, 2), hold(1, 4), Some(5)).await);
    let b = committed(commit(l, &purchase("A_B", 2, 3), hold(1, 9), Some(5)).await);
    l.cancel(b.order_id, user(2), CancelReason::UserCancelled)
        .await
        .expect("cancel")
        .expect("o");
    let r = request_id("A_R");
    l.record_restock(&action(product(), &r), 4)
        .await
        .expect("restock");
    let mark = l.watermark(product()).await.expect("w").expect("a product");
    assert_eq!(mark.generation, generation(1));
    assert_eq!(mark.last_hold_id, 9);
    assert!(mark.stock_loaded);
    let plan = l
        .advance_generation(product())
        .await
        .expect("advance")
        .expect("a plan in gate mode");
    assert_eq!(plan.generation, generation(2));
    assert_eq!(plan.available, 12);
    assert!(plan.last_hold_id >= 9);
    assert_eq!(plan.user_units, vec![(user(1), 2)]);
    assert!(l.pending_returns(10).await.expect("r").is_empty());
    assert!(l.pending_restocks(10).await.expect("r").is_empty());
    let mark = l.watermark(product()).await.expect("w").expect("a product");
    assert_eq!(mark.generation, generation(2));
    let facts = l.facts(product()).await.expect("facts").expect("a product");
    assert_eq!(facts.counters.available, 12);
    assert_eq!(facts.pending_units, 2);
    assert_eq!(facts.live.len(), 1);
    assert_eq!(
        facts.live.get("A_A").map(|(h, q)| (h.get(), *q)),
        Some((4, 2))
    );
    assert!(facts.orders_without_reservation.is_empty());
    assert!(facts.mismatched.is_empty());
    assert!(facts.unreturned.is_empty());
    assert!(facts.unapplied_restocks.is_empty());
    let ids: Vec<_> = facts.reserved_request_ids.into_iter().collect();
    assert_eq!(ids, vec!["A_A".to_owned(), "A_B".to_owned()]);
}

/// Loaded products page in ascending id order, and the newest are listed highest first.
pub async fn loaded_products_page_in_id_order<W: LedgerWorld>(w: &W) {
    let l = w.ledger();
    for id in [3, 1, 7, 5] {
        create(l, product_n(id), 1, None).await;
    }
    for id in [1, 5, 7] {
        l.mark_stock_loaded(product_n(id)).await.expect("loaded");
    }
    let first = l.loaded_products(None, 2).await.expect("page");
    assert_eq!(first, vec![product_n(1), product_n(5)]);
    let next = l
        .loaded_products(Some(product_n(5)), 2)
        .await
        .expect("page");
    assert_eq!(next, vec![product_n(7)]);
    let newest = l.newest_products(2).await.expect("newest");
    assert_eq!(newest, vec![product_n(7), product_n(5)]);
}

/// Concurrent commits — distinct purchases and copies of the same request_id and hold,
/// as a flood with client retries sends them (group-committed where the adapter groups)
/// — each get the answer they would have had alone: exactly the stock is sold, the rest
/// refused for stock, every copy answered with its request's record.
pub async fn concurrent_commits_answer_as_alone<W: LedgerWorld>(w: &W) {
    const STOCK: i64 = 10;
    const BUYERS: i64 = 16;
    let l = w.ledger();
    create(l, product(), STOCK, Some(1)).await;
    // Buyer i (user 1000 + i) uses hold i + 1; the copies repeat the first half; the
    // last buyer is user 1000's second purchase (over the limit of 1).
    let calls: Vec<(PurchaseRequest, HoldRef)> = (0..BUYERS)
        .chain(0..BUYERS / 2)
        .map(|i| {
            let u = 1000 + if i == BUYERS - 1 { 0 } else { i };
            (purchase(&format!("G_{i}"), u, 1), hold(1, i + 1))
        })
        .collect();
    let answers =
        futures::future::join_all(calls.iter().map(|(r, h)| commit(l, r, *h, Some(1)))).await;
    let mut orders = std::collections::BTreeMap::new();
    // Request_ids refused: for stock, or one of user 1000's two purchases (whichever
    // commits second) for its limit, or for stock if the units ran out first. Every copy
    // of a refused request_id is refused too.
    let mut refused = BTreeSet::new();
    for ((r, _), answer) in calls.iter().zip(&answers) {
        let id = r.request_id.as_str().to_owned();
        match answer {
            Commit::Committed(order) => {
                assert!(
                    orders.insert(id, order.clone()).is_none(),
                    "{r:?} committed twice"
                );
            }
            Commit::Duplicate(_) => {}
            Commit::InsufficientStock => {
                refused.insert(id);
            }
            Commit::LimitExceeded => {
                assert_eq!(r.user_id, user(1000), "only user 1000 buys twice");
                refused.insert(id);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(orders.len() as i64, STOCK, "{answers:?}");
    assert_eq!(refused.len() as i64, BUYERS - STOCK, "{answers:?}");
    assert!(
        orders.keys().all(|id| !refused.contains(id)),
        "a request both committed and refused: {answers:?}"
    );
    for ((r, h), answer) in calls.iter().zip(&answers) {
        if let Commit::Duplicate(record) = answer {
            let order = orders
                .get(r.request_id.as_str())
                .expect("a copy of an order");
            assert_eq!(record.hold, *h);
            assert_eq!(record.outcome, PurchaseOutcome::Order(order.clone()));
        }
    }
    let c = counters(l).await;
    assert_eq!((c.available, c.reserved), (0, STOCK));
}

async fn ledger_commit<L: Ledger>(l: &L, r: &PurchaseRequest, limit: Option<u32>) -> Commit {
    l.commit_ledger_purchase(&LedgerPurchase {
        request: r.clone(),
        terms: terms(limit),
    })
    .await
    .expect("ledger commit")
}

async fn mode<L: Ledger>(l: &L) -> StockMode {
    l.product(product())
        .await
        .expect("product")
        .expect("stored")
        .stock_mode
}

/// The hold a request_id's record names.
async fn hold_of<L: Ledger>(l: &L, id: &str) -> HoldRef {
    l.find_purchase(&request_id(id))
        .await
        .expect("find")
        .expect("a record")
        .hold
}

/// Asserts that the orders of the request_ids `sold` hold the holds 1 to `stock` of
/// generation 2, one each, without a gap, and that all `stock` units are reserved.
async fn sold_out_with_holds_from_one<L: Ledger>(
    l: &L,
    sold: impl IntoIterator<Item = &String>,
    stock: i64,
) {
    let mut holds = Vec::new();
    for id in sold {
        holds.push(hold_of(l, id).await);
    }
    holds.sort();
    let expected: Vec<HoldRef> = (1..=stock).map(|i| hold(2, i)).collect();
    assert_eq!(holds, expected);
    let c = counters(l).await;
    assert_eq!((c.available, c.reserved), (0, stock));
}

/// A little past `LEDGER_SALES_AFTER_SWITCH`: the ledger sells after it.
const SETTLED: Duration = LEDGER_SALES_AFTER_SWITCH.saturating_add(Duration::from_millis(50));

/// Puts [`product`] in ledger mode and lets the switch settle, so the ledger sells.
async fn enter<W: LedgerWorld>(w: &W) {
    w.ledger()
        .enter_ledger_mode(product())
        .await
        .expect("enter");
    w.pass(SETTLED).await;
}

/// Entering ledger mode advances the generation in gate mode, so a hold the gate handed
/// out before can no longer commit (nor can a gate hold of the new generation: the
/// ledger serves the stock); a second call reports ledger mode and changes nothing, and
/// so does an advance (a gate watch that raced the switch must not rebuild into it).
pub async fn entering_ledger_mode_voids_the_gates_holds<W: LedgerWorld>(w: &W) {
    let l = w.ledger();
    create(l, product(), 5, None).await;
    assert_eq!(mode(l).await, StockMode::Gate);
    committed(commit(l, &purchase("M_A", 1, 1), hold(1, 1), None).await);
    assert_eq!(
        l.enter_ledger_mode(product()).await.expect("enter"),
        ModeSwitch::Entered {
            generation: generation(2)
        }
    );
    assert_eq!(
        l.enter_ledger_mode(product()).await.expect("again"),
        ModeSwitch::AlreadyLedger {
            generation: generation(2)
        }
    );
    assert_eq!(
        l.generation(product()).await.expect("gen"),
        Some(generation(2))
    );
    assert_eq!(mode(l).await, StockMode::Ledger);
    let mark = l.watermark(product()).await.expect("w").expect("a product");
    assert_eq!(
        (mark.generation, mark.mode),
        (generation(2), StockMode::Ledger)
    );
    assert_eq!(
        commit(l, &purchase("M_B", 2, 1), hold(1, 2), None).await,
        Commit::StaleGeneration,
        "a hold taken before the switch"
    );
    assert_eq!(
        commit(l, &purchase("M_C", 3, 1), hold(2, 1), None).await,
        Commit::StaleGeneration,
        "a gate hold in ledger mode"
    );
    for refused in ["M_B", "M_C"] {
        assert_eq!(
            l.find_purchase(&request_id(refused)).await.expect("f"),
            None
        );
    }
    assert_eq!(
        l.advance_generation(product()).await.expect("advance"),
        None,
        "no rebuild into the ledger mode's generation"
    );
    assert_eq!(
        l.generation(product()).await.expect("gen"),
        Some(generation(2))
    );
    let c = counters(l).await;
    assert_eq!((c.total, c.available, c.reserved, c.sold), (5, 4, 1, 0));
}

/// In ledger mode the ledger sells by itself, once the switch has settled (before that a
/// purchase is answered Settling and writes nothing): hold ids 1, 2, … in the mode's
/// generation, exactly the stock and then InsufficientStock (writing nothing), and a
/// replay — before or after the stock ran out — answered with its record.
pub async fn ledger_purchases_sell_exactly_the_stock<W: LedgerWorld>(w: &W) {
    let l = w.ledger();
    create(l, product(), 3, None).await;
    l.enter_ledger_mode(product()).await.expect("enter");
    assert_eq!(
        ledger_commit(l, &purchase("L_S", 9, 1), None).await,
        Commit::Settling,
        "no sale until every instance has surely heard of the switch"
    );
    assert_eq!(l.find_purchase(&request_id("L_S")).await.expect("f"), None);
    w.pass(SETTLED).await;
    let a = purchase("L_A", 1, 1);
    let order = committed(ledger_commit(l, &a, None).await);
    assert_eq!(order.request_id, a.request_id);
    assert_eq!(order.status, OrderStatus::PendingPayment);
    committed(ledger_commit(l, &purchase("L_B", 2, 2), None).await);
    assert_eq!(hold_of(l, "L_A").await, hold(2, 1));
    assert_eq!(hold_of(l, "L_B").await, hold(2, 2));
    let replay = |c: Commit| match c {
        Commit::Duplicate(record) => {
            assert_eq!(record.hold, hold(2, 1));
            assert_eq!(record.outcome, PurchaseOutcome::Order(order.clone()));
        }
        other => panic!("a replay got {other:?}"),
    };
    replay(ledger_commit(l, &a, None).await);
    assert_eq!(
        ledger_commit(l, &purchase("L_C", 3, 1), None).await,
        Commit::InsufficientStock
    );
    replay(ledger_commit(l, &a, None).await);
    assert_eq!(l.find_purchase(&request_id("L_C")).await.expect("f"), None);
    let mark = l.watermark(product()).await.expect("w").expect("a product");
    assert_eq!((mark.generation, mark.last_hold_id), (generation(2), 2));
    let c = counters(l).await;
    assert_eq!((c.total, c.available, c.reserved, c.sold), (3, 0, 3, 0));
}

/// A ledger purchase respects the per-user limit as a gate purchase's commit does: the
/// user's live orders (of either mode) count, and a refusal writes nothing.
pub async fn ledger_purchases_respect_the_per_user_limit<W: LedgerWorld>(w: &W) {
    let l = w.ledger();
    create(l, product(), 10, Some(2)).await;
    committed(commit(l, &purchase("U_G", 1, 1), hold(1, 1), Some(2)).await);
    enter(w).await;
    committed(ledger_commit(l, &purchase("U_A", 1, 1), Some(2)).await);
    assert_eq!(
        ledger_commit(l, &purchase("U_B", 1, 1), Some(2)).await,
        Commit::LimitExceeded
    );
    committed(ledger_commit(l, &purchase("U_C", 2, 2), Some(2)).await);
    assert_eq!(l.find_purchase(&request_id("U_B")).await.expect("f"), None);
    assert_eq!(
        hold_of(l, "U_C").await,
        hold(2, 2),
        "a refusal takes no hold id"
    );
    let c = counters(l).await;
    assert_eq!((c.available, c.reserved), (6, 4));
}

/// A purchase without a gate hold for a product in gate mode is answered GateMode and
/// writes nothing.
pub async fn a_ledger_purchase_in_gate_mode_goes_to_the_gate<W: LedgerWorld>(w: &W) {
    let l = w.ledger();
    create(l, product(), 5, None).await;
    assert_eq!(
        ledger_commit(l, &purchase("K_A", 1, 1), None).await,
        Commit::GateMode
    );
    assert_eq!(l.find_purchase(&request_id("K_A")).await.expect("f"), None);
    let c = counters(l).await;
    assert_eq!((c.available, c.reserved), (5, 0));
    assert_eq!(
        l.generation(product()).await.expect("gen"),
        Some(generation(1))
    );
}

/// Orders of ledger mode are paid, cancelled and expired like the gate's: a cancel
/// gives its units back to the ledger's counters only (no return is owed to the gate),
/// and expiry runs on the ledger's clock.
pub async fn ledger_mode_orders_resolve_like_gate_ones<W: LedgerWorld>(w: &W) {
    let l = w.ledger();
    create(l, product(), 5, Some(3)).await;
    enter(w).await;
    let paid = committed(ledger_commit(l, &purchase("R_A", 1, 1), Some(3)).await);
    let cancelled = committed(ledger_commit(l, &purchase("R_B", 2, 2), Some(3)).await);
    let short = l
        .commit_ledger_purchase(&LedgerPurchase {
            request: purchase("R_C", 3, 1),
            terms: Terms {
                per_user_limit: Some(3),
                payment_timeout: Duration::from_secs(1),
            },
        })
        .await
        .expect("commit");
    let short = committed(short);
    let first = l
        .pay(paid.order_id, user(1))
        .await
        .expect("pay")
        .expect("o");
    assert!(first.applied);
    assert_eq!(first.order.status, OrderStatus::Paid);
    let attempt = l
        .cancel(cancelled.order_id, user(2), CancelReason::UserCancelled)
        .await
        .expect("cancel")
        .expect("o");
    assert!(attempt.applied);
    // The units are back in the counters, where the stock is served: nothing is owed to
    // the gate, and recovery has nothing to give back.
    assert_eq!(attempt.pending_return, None);
    assert!(l.pending_returns(10).await.expect("returns").is_empty());
    w.pass(Duration::from_millis(1500)).await;
    let late = ExpiredOrder {
        order_id: short.order_id,
        user_id: user(3),
    };
    assert_eq!(
        l.expired_orders(10).await.expect("expired"),
        vec![late.clone()]
    );
    let expired = l.expire(&late).await.expect("expire").expect("o");
    assert!(expired.applied);
    assert_eq!(
        expired.order.cancel_reason,
        Some(CancelReason::PaymentTimeout)
    );
    let c = counters(l).await;
    assert_eq!((c.total, c.available, c.reserved, c.sold), (5, 4, 0, 1));
}

/// Leaving ledger mode is an advance and the mode back to gate, in one step: the plan's
/// generation is the next, its available count the ledger's (released units and
/// restocks of ledger mode included, all settled), its hold ids above every recorded
/// one (the ledger's own too), its per-user units from the live orders of both modes. A
/// second call finds gate mode and changes nothing; purchases go through the gate again.
pub async fn leaving_ledger_mode_plans_the_gate<W: LedgerWorld>(w: &W) {
    let l = w.ledger();
    create(l, product(), 10, Some(5)).await;
    l.mark_stock_loaded(product()).await.expect("loaded");
    committed(commit(l, &purchase("X_G", 1, 2), hold(1, 1), Some(5)).await);
    enter(w).await;
    committed(ledger_commit(l, &purchase("X_A", 2, 3), Some(5)).await);
    committed(ledger_commit(l, &purchase("X_B", 3, 1), Some(5)).await);
    committed(ledger_commit(l, &purchase("X_C", 3, 1), Some(5)).await);
    let b = l
        .find_purchase(&request_id("X_B"))
        .await
        .expect("f")
        .expect("a record");
    let PurchaseOutcome::Order(b) = b.outcome else {
        panic!("X_B is an order")
    };
    l.cancel(b.order_id, user(3), CancelReason::UserCancelled)
        .await
        .expect("cancel")
        .expect("o");
    l.record_restock(&action(product(), &request_id("X_R")), 4)
        .await
        .expect("restock");
    assert_eq!(
        l.leave_ledger_mode(product(), Duration::from_secs(3600))
            .await
            .expect("leave"),
        Leave::TooSoon,
        "the switch itself reported the gate unreachable"
    );
    let Leave::Left(plan) = l
        .leave_ledger_mode(product(), Duration::ZERO)
        .await
        .expect("leave")
    else {
        panic!("no plan")
    };
    assert_eq!(plan.generation, generation(3));
    assert_eq!(plan.available, 10 + 4 - 2 - 3 - 1);
    assert!(plan.last_hold_id >= 3, "{plan:?}");
    assert_eq!(
        plan.user_units,
        vec![(user(1), 2), (user(2), 3), (user(3), 1)]
    );
    assert!(l.pending_returns(10).await.expect("r").is_empty());
    assert!(l.pending_restocks(10).await.expect("r").is_empty());
    assert_eq!(mode(l).await, StockMode::Gate);
    let mark = l.watermark(product()).await.expect("w").expect("a product");
    assert_eq!(
        (mark.generation, mark.mode),
        (generation(3), StockMode::Gate)
    );
    assert_eq!(
        l.leave_ledger_mode(product(), Duration::ZERO)
            .await
            .expect("again"),
        Leave::NotLedger
    );
    assert_eq!(
        l.generation(product()).await.expect("gen"),
        Some(generation(3))
    );
    assert_eq!(
        ledger_commit(l, &purchase("X_D", 4, 1), Some(5)).await,
        Commit::GateMode
    );
    let next = plan.last_hold_id + 1;
    committed(commit(l, &purchase("X_E", 4, 1), hold(3, next), Some(5)).await);
    let c = counters(l).await;
    assert_eq!(
        (c.total, c.available, c.reserved),
        (14, plan.available - 1, 7)
    );
}

/// Concurrent ledger purchases — distinct ones and copies of the same request_id —
/// sell exactly the stock, each request once, the hold ids 1 to the stock without a
/// gap, every copy answered with its request's record.
pub async fn concurrent_ledger_purchases_sell_exactly_the_stock<W: LedgerWorld>(w: &W) {
    const STOCK: i64 = 10;
    const BUYERS: i64 = 16;
    let l = w.ledger();
    create(l, product(), STOCK, None).await;
    enter(w).await;
    let calls: Vec<PurchaseRequest> = (0..BUYERS)
        .chain(0..BUYERS / 2)
        .map(|i| purchase(&format!("Q_{i}"), 2000 + i, 1))
        .collect();
    let answers = futures::future::join_all(calls.iter().map(|r| ledger_commit(l, r, None))).await;
    let mut orders = std::collections::BTreeMap::new();
    let mut refused = BTreeSet::new();
    for (r, answer) in calls.iter().zip(&answers) {
        let id = r.request_id.as_str().to_owned();
        match answer {
            Commit::Committed(order) => {
                assert!(
                    orders.insert(id, order.clone()).is_none(),
                    "{r:?} committed twice"
                );
            }
            Commit::Duplicate(_) => {}
            Commit::InsufficientStock => {
                refused.insert(id);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(orders.len() as i64, STOCK, "{answers:?}");
    assert_eq!(refused.len() as i64, BUYERS - STOCK, "{answers:?}");
    assert!(orders.keys().all(|id| !refused.contains(id)), "{answers:?}");
    for (r, answer) in calls.iter().zip(&answers) {
        if let Commit::Duplicate(record) = answer {
            let order = orders
                .get(r.request_id.as_str())
                .expect("a copy of an order");
            assert_eq!(record.outcome, PurchaseOutcome::Order(order.clone()));
        }
    }
    sold_out_with_holds_from_one(l, orders.keys(), STOCK).await;
}

/// Concurrent ledger purchases under a per-user limit, with more demand than stock:
/// nobody holds more than the limit, exactly the stock sells when demand within the
/// limits exceeds it, each refusal is the ledger's (not enough units, or the limit),
/// and the hold ids run from 1 to the units sold without a gap — however the ledger
/// batches them.
pub async fn concurrent_ledger_purchases_respect_limits_and_stock<W: LedgerWorld>(w: &W) {
    const STOCK: i64 = 12;
    const USERS: i64 = 8;
    const LIMIT: u32 = 2;
    let l = w.ledger();
    create(l, product(), STOCK, Some(i64::from(LIMIT))).await;
    enter(w).await;
    let calls: Vec<PurchaseRequest> = (0..USERS * 3)
        .map(|i| purchase(&format!("U_{i}"), 3000 + i % USERS, 1))
        .collect();
    let answers =
        futures::future::join_all(calls.iter().map(|r| ledger_commit(l, r, Some(LIMIT)))).await;
    let mut per_user = std::collections::BTreeMap::new();
    let mut sold = Vec::new();
    for (r, answer) in calls.iter().zip(&answers) {
        match answer {
            Commit::Committed(order) => {
                *per_user.entry(r.user_id).or_insert(0) += 1;
                sold.push(order.request_id.as_str().to_owned());
            }
            Commit::InsufficientStock | Commit::LimitExceeded => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(per_user.values().all(|&n| n <= LIMIT), "{per_user:?}");
    assert_eq!(sold.len() as i64, STOCK, "{answers:?}");
    sold_out_with_holds_from_one(l, &sold, STOCK).await;
}

/// Entering ledger mode settles what the gate is owed, as a rebuild does: a release not
/// yet returned and a restock not yet applied are done (the counters have their units),
/// so recovery gives nothing back to a gate that is not used. A restock in ledger mode
/// is applied at once, and the product is listed among those in ledger mode. A product
/// never loaded is loaded from then on (its gate is only ever rebuilt from a plan).
pub async fn entering_ledger_mode_settles_what_the_gate_is_owed<W: LedgerWorld>(w: &W) {
    let l = w.ledger();
    create(l, product(), 5, None).await;
    l.mark_stock_loaded(product()).await.expect("loaded");
    assert!(l.ledger_mode_products(10).await.expect("list").is_empty());
    let order = committed(commit(l, &purchase("S_A", 1, 2), hold(1, 1), None).await);
    let attempt = l
        .cancel(order.order_id, user(1), CancelReason::UserCancelled)
        .await
        .expect("cancel")
        .expect("o");
    assert!(attempt.pending_return.is_some(), "gate mode owes the gate");
    l.record_restock(&action(product(), &request_id("S_R")), 3)
        .await
        .expect("restock");
    assert_eq!(l.pending_returns(10).await.expect("r").len(), 1);
    assert_eq!(l.pending_restocks(10).await.expect("r").len(), 1);
    l.enter_ledger_mode(product()).await.expect("enter");
    assert!(l.pending_returns(10).await.expect("r").is_empty());
    assert!(l.pending_restocks(10).await.expect("r").is_empty());
    let stored = l.product(product()).await.expect("p").expect("a product");
    assert!(stored.stock_loaded);
    assert_eq!(stored.stock_mode, StockMode::Ledger);
    assert_eq!(
        l.record_restock(&action(product(), &request_id("S_S")), 2)
            .await
            .expect("restock"),
        RecordRestock::Recorded {
            applied: true,
            generation: generation(2)
        }
    );
    assert!(l.pending_restocks(10).await.expect("r").is_empty());
    assert_eq!(
        l.ledger_mode_products(10).await.expect("list"),
        vec![product()]
    );
    let c = counters(l).await;
    assert_eq!((c.total, c.available, c.reserved), (10, 10, 0));
    create(l, product_n(2), 1, None).await;
    l.enter_ledger_mode(product_n(2)).await.expect("enter");
    let never = l
        .product(product_n(2))
        .await
        .expect("p")
        .expect("a product");
    assert!(
        never.stock_loaded,
        "a product never loaded is loaded from then on"
    );
}

/// The way back waits until no instance has reported the gate unreachable for the quiet
/// time: each report (a call on a product in ledger mode already) starts it again, and
/// only a product quiet for that long is given back.
pub async fn the_way_back_waits_for_quiet<W: LedgerWorld>(w: &W) {
    const QUIET: Duration = Duration::from_millis(1000);
    let l = w.ledger();
    create(l, product(), 5, None).await;
    l.enter_ledger_mode(product()).await.expect("enter");
    w.pass(Duration::from_millis(700)).await;
    assert!(matches!(
        l.enter_ledger_mode(product()).await.expect("report"),
        ModeSwitch::AlreadyLedger { .. }
    ));
    w.pass(Duration::from_millis(700)).await;
    assert_eq!(
        l.leave_ledger_mode(product(), QUIET).await.expect("leave"),
        Leave::TooSoon,
        "reported 0.7 s ago"
    );
    assert_eq!(mode(l).await, StockMode::Ledger);
    w.pass(Duration::from_millis(600)).await;
    assert!(matches!(
        l.leave_ledger_mode(product(), QUIET).await.expect("leave"),
        Leave::Left(_)
    ));
    assert_eq!(mode(l).await, StockMode::Gate);
    assert!(l.ledger_mode_products(10).await.expect("list").is_empty());
}

/// A product whose sale window ended long ago, its stock loaded.
async fn ended_sale<W: LedgerWorld>(w: &W, product_id: ProductId) {
    let l = w.ledger();
    let window = flashsale_core::SaleWindow::new(
        Utc.with_ymd_and_hms(2020, 1, 1, 0, 0, 0).single(),
        Utc.with_ymd_and_hms(2021, 1, 1, 0, 0, 0).single(),
    )
    .expect("window");
    let ended = flashsale_core::NewProduct::parse(product_id.get(), "ended", 5, None, window)
        .expect("product");
    l.create_product(&ended, &AdminName::default())
        .await
        .expect("create");
    l.mark_stock_loaded(product_id).await.expect("loaded");
}

/// The scheduled audits are claimed once over every instance: an ended sale is listed
/// until its audit is done; its claim goes to the first holder, never to a second while
/// the first's lease stands, to a second once it lapsed unfinished, and to nobody once
/// done; the period's audit of every product likewise goes to one holder. A product on
/// sale, or not loaded, is not listed. The violations recorded within a window are
/// summed.
pub async fn scheduled_audits_are_claimed_once<W: LedgerWorld>(w: &W) {
    const LEASE: Duration = Duration::from_secs(3600);
    let l = w.ledger();
    create(l, product(), 5, None).await;
    l.mark_stock_loaded(product()).await.expect("loaded");
    ended_sale(w, product_n(2)).await;
    ended_sale(w, product_n(3)).await;
    let ended = l.ended_sales(Duration::ZERO, 10).await.expect("ended");
    assert_eq!(
        ended,
        vec![product_n(2), product_n(3)],
        "the ended ones only"
    );

    let sale = AuditSchedule::SaleEnd(product_n(2));
    let claim = l.claim_audit(&sale, "a", LEASE).await.expect("claim");
    let claim = claim.expect("the first holder gets it");
    assert_eq!(claim.holder, "a");
    assert_eq!(l.claim_audit(&sale, "b", LEASE).await.expect("claim"), None);
    l.finish_audit(&claim).await.expect("finish");
    assert_eq!(
        l.claim_audit(&sale, "b", Duration::ZERO)
            .await
            .expect("claim"),
        None
    );
    let ended = l.ended_sales(Duration::ZERO, 10).await.expect("ended");
    assert_eq!(ended, vec![product_n(3)], "a done audit is not listed");

    let lapsing = AuditSchedule::SaleEnd(product_n(3));
    assert!(l
        .claim_audit(&lapsing, "a", LEASE)
        .await
        .expect("claim")
        .is_some());
    w.pass(Duration::from_millis(1_100)).await;
    let taken = l.claim_audit(&lapsing, "b", Duration::from_secs(1)).await;
    assert_eq!(
        taken.expect("claim").map(|c| c.holder),
        Some("b".to_owned())
    );

    let every = AuditSchedule::Every(Duration::from_secs(24 * 3600));
    assert!(l
        .claim_audit(&every, "a", LEASE)
        .await
        .expect("claim")
        .is_some());
    assert_eq!(
        l.claim_audit(&every, "b", LEASE).await.expect("claim"),
        None
    );

    for violations in [2, 3] {
        let verdict = AuditVerdict {
            product: None,
            products: 1,
            violations,
            pending: 0,
        };
        l.record_audit(&verdict).await.expect("record");
    }
    let found = l.audit_violations_within(Duration::from_secs(3600)).await;
    assert_eq!(found.expect("sum"), 5);
}

/// Expands to one `#[tokio::test]` per body of the ledger's contract, over world `$w`.
#[macro_export]
macro_rules! ledger_contract {
    ($w:ty) => {
        $crate::ledger_world_tests!(ledger, $w;
            a_product_is_created_once,
            a_purchase_commits_once_per_request_id,
            the_ledger_refuses_what_the_gate_wrongly_admits,
            a_fence_blocks_a_late_commit,
            pay_and_cancel_resolve_an_order_once,
            orders_expire_on_the_ledgers_clock,
            a_restock_is_recorded_once,
            advancing_a_generation_plans_from_the_facts,
            loaded_products_page_in_id_order,
            concurrent_commits_answer_as_alone,
            entering_ledger_mode_voids_the_gates_holds,
            ledger_purchases_sell_exactly_the_stock,
            ledger_purchases_respect_the_per_user_limit,
            a_ledger_purchase_in_gate_mode_goes_to_the_gate,
            ledger_mode_orders_resolve_like_gate_ones,
            leaving_ledger_mode_plans_the_gate,
            concurrent_ledger_purchases_sell_exactly_the_stock,
            concurrent_ledger_purchases_respect_limits_and_stock,
            entering_ledger_mode_settles_what_the_gate_is_owed,
            the_way_back_waits_for_quiet,
            scheduled_audits_are_claimed_once,
        );
    };
}

/// Expands to one `#[tokio::test]` per body `$name` of the contract in module
/// `$module`, over the [`LedgerWorld`] `$w`: what [`ledger_contract!`] and
/// [`outbox_contract!`](crate::outbox_contract) expand to.
#[doc(hidden)]
#[macro_export]
macro_rules! ledger_world_tests {
    ($module:ident, $w:ty; $($name:ident),* $(,)?) => {
        $(
            // The contract's body of the same name (in crates/contract/src/, the
            // module named by the macro's first argument).
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let world = <$w as $crate::ledger::LedgerWorld>::open().await;
                $crate::$module::$name(&world).await;
                $crate::ledger::LedgerWorld::close(world).await;
            }
        )*
    };
}
