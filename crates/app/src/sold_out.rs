//! Sold-out answers without a call to the gate.
//!
//! When the gate finds a product with no unit left it grants a *sold-out lease*
//! ([`SoldOutLease`]): for a while it grants no hold of the product to anyone, even for
//! units that come back meanwhile. An instance that hears the lease may, until the lease
//! ends by its own monotonic clock (measured from *before* it sent the call that heard
//! it, and shortened by [`TRUST_SHARE`] against clocks running at different rates),
//! refuse purchases of the product itself — with exactly the answer the gate would give,
//! because the gate can grant nothing in that time.
//!
//! Except to a replay: a request_id that holds (or held) units of the product must get
//! its own outcome, not `sold_out`. So the board also keeps the product's *holders*, a
//! snapshot of every request_id with a hold: the gate's pending index read first, then
//! the ledger's reservations (a hold leaves the index only after the ledger records its
//! request_id, so reading in that order misses none). The snapshot is taken after the
//! lease was heard and names the hold count it covers; it stays complete while the gate
//! keeps reporting that count in that generation (no hold granted since). A purchase
//! whose request_id is a holder goes to the gate as always.
//!
//! A lease ends early when units come back: every gate step that adds units to the
//! product (a restock, a release, a rebuild, a repair) ends its lease in the same atomic
//! step and publishes a *revocation*, which this instance hears through its subscription
//! ([`LeaseListener`]) and which drops the product from the board. A revocation can
//! cross the answer that carried a lease (they travel on different connections), so a
//! lease is kept only if no revocation that might concern its product arrived while its
//! call was out ([`Heard`]). A revocation can also be lost: while the subscription is not
//! live (not yet subscribed, or lost and not yet back) the board refuses nothing, and
//! when it goes, every lease heard before is forgotten. So a local `sold_out` outlives
//! units coming back by the revocation's delivery, or, if the subscription died silently,
//! until the subscriber notices (and never past the lease's end).
//!
//! Everything here is bounded: [`HOLDERS_MAX`] request_ids per product (more, and the
//! product is simply always asked of the gate), [`PRODUCTS_MAX`] products.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use flashsale_core::{Generation, ProductId, RequestId};

use crate::ports::{LeaseListener, SoldOutLease};

/// Most request_ids in one product's snapshot: about 10 MB at most. A product that had
/// more holds than this (a big promotion, sold out) is always asked of the gate.
pub const HOLDERS_MAX: usize = 100_000;
/// Most products on the board at once; past it, expired entries are dropped, and if all
/// are live a new product is not added (its purchases ask the gate, as before).
const PRODUCTS_MAX: usize = 10_000;
/// Share of a lease's remaining time an instance trusts (numerator, denominator): the
/// margin covers a gate whose clock runs faster than this instance's (slew is well below
/// 0.1 %; 10 % leaves room for far worse).
const TRUST_SHARE: (u32, u32) = (9, 10);
/// Revocation counters, one per product id modulo this: a revocation voids the leases in
/// flight of its bucket's products only, so one product's give-backs seldom cost another
/// product its lease (256 counters, 2 KB).
const BUCKETS: usize = 256;

#[derive(Default)]
pub struct SoldOutBoard {
    board: Mutex<Board>,
}

struct Board {
    products: HashMap<ProductId, Entry>,
    /// Whether the subscription to revocations is live: only then may a lease be trusted.
    live: bool,
    /// Bumped whenever the subscription goes or comes back, or a revocation of unknown
    /// products arrives: it voids every lease whose call was out meanwhile.
    era: u64,
    /// Revocations heard, per bucket of product ids.
    revoked: [u64; BUCKETS],
}

impl Default for Board {
    fn default() -> Self {
        Self {
            products: HashMap::new(),
            live: false,
            era: 0,
            revoked: [0; BUCKETS],
        }
    }
}

fn bucket(product_id: ProductId) -> usize {
    // Product ids are positive: the remainder is below BUCKETS.
    (product_id.get().unsigned_abs() % BUCKETS as u64) as usize
}

/// What the board had heard of revocations when a call to the gate was sent: a lease
/// its answer carries is kept only if nothing that could void it arrived since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heard {
    era: u64,
    revoked: u64,
}

/// The board's verdict on a purchase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Answer `sold_out` here: the gate's lease says so and nothing revoked it.
    Refuse,
    /// Ask the gate; a lease in its answer goes to [`SoldOutBoard::leased`] with this.
    Ask(Heard),
}

struct Entry {
    /// Until when (monotonic) this instance may refuse on its own.
    until: Duration,
    generation: Generation,
    holds: i64,
    holders: Holders,
}

enum Holders {
    /// Not taken yet for this (generation, holds).
    Unknown,
    /// One purchase is taking it.
    Taking,
    Known(Arc<HashSet<RequestId>>),
    /// More than [`HOLDERS_MAX`]: never refuse locally for this (generation, holds).
    TooMany,
}

/// The snapshot a caller must take for the board, for one (generation, holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    pub product_id: ProductId,
    pub generation: Generation,
    pub holds: i64,
}

impl SoldOutBoard {
    fn lock(&self) -> MutexGuard<'_, Board> {
        // The board stays consistent whatever panicked while holding it: every update is
        // a single assignment.
        self.board.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether this instance can answer `sold_out` to the purchase itself, at monotonic
    /// time `now`; if not, what it had heard of revocations before asking the gate.
    pub fn check(&self, product_id: ProductId, request_id: &RequestId, now: Duration) -> Check {
        let board = self.lock();
        let refuse = board.products.get(&product_id).is_some_and(|entry| {
            now < entry.until
                && matches!(&entry.holders, Holders::Known(holders) if !holders.contains(request_id))
        });
        if refuse {
            Check::Refuse
        } else {
            Check::Ask(Heard {
                era: board.era,
                revoked: board.revoked[bucket(product_id)],
            })
        }
    }

    /// What the board has heard of revocations concerning `product_id`, now (for a call
    /// to the gate made without [`Self::check`]).
    pub fn heard(&self, product_id: ProductId) -> Heard {
        let board = self.lock();
        Heard {
            era: board.era,
            revoked: board.revoked[bucket(product_id)],
        }
    }

    /// Whether this instance can answer `sold_out` to the purchase itself at `now`.
    pub fn refuses(&self, product_id: ProductId, request_id: &RequestId, now: Duration) -> bool {
        self.check(product_id, request_id, now) == Check::Refuse
    }

    /// The gate answered a call sent at monotonic time `sent`, when the board had
    /// `heard` what it had, with a lease. Returns the snapshot the caller should take
    /// now, if one is needed and nobody is taking it.
    pub fn leased(
        &self,
        product_id: ProductId,
        sent: Duration,
        heard: Heard,
        lease: SoldOutLease,
    ) -> Option<Snapshot> {
        let until = sent + lease.remaining * TRUST_SHARE.0 / TRUST_SHARE.1;
        let mut board = self.lock();
        // Not subscribed, or a revocation arrived while the call was out: it may have
        // ended this very lease before the answer came in.
        if !board.live
            || board.era != heard.era
            || board.revoked[bucket(product_id)] != heard.revoked
        {
            return None;
        }
        let products = &mut board.products;
        if !products.contains_key(&product_id) && products.len() >= PRODUCTS_MAX {
            products.retain(|_, e| e.until > sent);
            if products.len() >= PRODUCTS_MAX {
                return None;
            }
        }
        let fresh = || Entry {
            until,
            generation: lease.generation,
            holds: lease.holds,
            holders: Holders::Unknown,
        };
        let entry = products.entry(product_id).or_insert_with(fresh);
        if (entry.generation, entry.holds) != (lease.generation, lease.holds) {
            // Holds were granted (or the gate was rebuilt) since: the snapshot is stale.
            *entry = fresh();
        } else {
            // Every lease answer is a promise of its own; the later end stands.
            entry.until = entry.until.max(until);
        }
        if !matches!(entry.holders, Holders::Unknown) {
            return None;
        }
        entry.holders = Holders::Taking;
        Some(Snapshot {
            product_id,
            generation: lease.generation,
            holds: lease.holds,
        })
    }

    /// The outcome of taking `snapshot`: the holders, `Ok(None)` when there were too
    /// many, `Err(())` when a store could not be read (someone takes it again later).
    pub fn took(&self, snapshot: Snapshot, holders: Result<Option<HashSet<RequestId>>, ()>) {
        let mut board = self.lock();
        let Some(entry) = board.products.get_mut(&snapshot.product_id) else {
            return;
        };
        if (entry.generation, entry.holds) != (snapshot.generation, snapshot.holds)
            || !matches!(entry.holders, Holders::Taking)
        {
            return;
        }
        entry.holders = match holders {
            Ok(Some(holders)) => Holders::Known(Arc::new(holders)),
            Ok(None) => Holders::TooMany,
            Err(()) => Holders::Unknown,
        };
    }
}

impl LeaseListener for SoldOutBoard {
    fn listening(&self) {
        let mut board = self.lock();
        board.live = true;
        board.era += 1;
    }

    fn deaf(&self) {
        let mut board = self.lock();
        board.live = false;
        board.era += 1;
        board.products.clear();
    }

    fn revoked(&self, product_id: Option<ProductId>) {
        let mut board = self.lock();
        match product_id {
            Some(product_id) => {
                board.revoked[bucket(product_id)] += 1;
                board.products.remove(&product_id);
            }
            // A revocation whose product can't be read may concern any of them.
            None => {
                board.era += 1;
                board.products.clear();
            }
        }
    }

    /// Definitions are the catalog's (`control.rs`): a lease is about units, which a
    /// changed definition does not move.
    fn changed(&self, _product_id: Option<ProductId>) {}
}

/// Gives a snapshot back as not taken if the purchase taking it stops before it is done
/// (its client went away and the future was dropped), so another purchase takes it.
pub struct Taking<'a> {
    board: &'a SoldOutBoard,
    snapshot: Option<Snapshot>,
}

impl<'a> Taking<'a> {
    pub fn new(board: &'a SoldOutBoard, snapshot: Snapshot) -> Self {
        Self {
            board,
            snapshot: Some(snapshot),
        }
    }

    pub fn done(mut self, holders: Result<Option<HashSet<RequestId>>, ()>) {
        if let Some(snapshot) = self.snapshot.take() {
            self.board.took(snapshot, holders);
        }
    }
}

impl Drop for Taking<'_> {
    fn drop(&mut self) {
        if let Some(snapshot) = self.snapshot.take() {
            self.board.took(snapshot, Err(()));
        }
    }
}

#[cfg(test)]
mod tests {
    // Checks the board's rules with plain values: refusals only inside the trusted share
    // of a lease and only for request_ids outside a complete snapshot; a new hold count
    // or generation makes the snapshot stale; one taker at a time; a dropped taker lets
    // the next one take it.
    use super::*;

    fn p(id: i64) -> ProductId {
        ProductId::parse(id).expect("product id")
    }
    fn r(s: &str) -> RequestId {
        RequestId::parse("request_id", s).expect("request id")
    }
    fn lease(ms: u64, generation: i64, holds: i64) -> SoldOutLease {
        SoldOutLease {
            remaining: Duration::from_millis(ms),
            generation: Generation::from_stored(generation).expect("generation"),
            holds,
        }
    }
    /// A board whose subscription to revocations is live.
    fn live() -> SoldOutBoard {
        let board = SoldOutBoard::default();
        board.listening();
        board
    }
    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }
    fn holders(ids: &[&str]) -> Result<Option<HashSet<RequestId>>, ()> {
        Ok(Some(ids.iter().map(|s| r(s)).collect()))
    }

    #[test]
    fn refuses_outsiders_only_inside_the_trusted_share_with_a_snapshot() {
        let board = live();
        let snapshot = board
            .leased(p(1), ms(1_000), board.heard(p(1)), lease(100, 1, 5))
            .expect("take");
        assert!(
            !board.refuses(p(1), &r("NEW"), ms(1_001)),
            "no snapshot yet"
        );
        board.took(snapshot, holders(&["HELD"]));
        assert!(board.refuses(p(1), &r("NEW"), ms(1_001)));
        assert!(
            !board.refuses(p(1), &r("HELD"), ms(1_001)),
            "a holder asks the gate"
        );
        assert!(board.refuses(p(1), &r("NEW"), ms(1_089)));
        assert!(
            !board.refuses(p(1), &r("NEW"), ms(1_090)),
            "only 90 % of the lease"
        );
        assert!(!board.refuses(p(2), &r("NEW"), ms(1_001)), "other products");
    }

    #[test]
    fn a_new_hold_count_or_generation_makes_the_snapshot_stale() {
        let board = live();
        let snapshot = board
            .leased(p(1), ms(0), board.heard(p(1)), lease(1_000, 1, 5))
            .expect("take");
        board.took(snapshot, holders(&[]));
        assert!(
            board
                .leased(p(1), ms(10), board.heard(p(1)), lease(1_000, 1, 5))
                .is_none(),
            "still complete"
        );
        assert!(
            board.refuses(p(1), &r("NEW"), ms(905)),
            "the later lease extends"
        );
        let snapshot = board
            .leased(p(1), ms(20), board.heard(p(1)), lease(1_000, 1, 6))
            .expect("stale");
        assert!(!board.refuses(p(1), &r("NEW"), ms(21)));
        board.took(snapshot, holders(&["NEW"]));
        assert!(
            !board.refuses(p(1), &r("NEW"), ms(21)),
            "NEW took the sixth hold"
        );
        assert!(
            board
                .leased(p(1), ms(30), board.heard(p(1)), lease(1_000, 2, 6))
                .is_some(),
            "rebuilt"
        );
        assert!(!board.refuses(p(1), &r("OTHER"), ms(31)));
    }

    #[test]
    fn one_taker_at_a_time_and_a_dropped_taker_gives_it_back() {
        let board = live();
        let snapshot = board
            .leased(p(1), ms(0), board.heard(p(1)), lease(1_000, 1, 1))
            .expect("take");
        assert!(
            board
                .leased(p(1), ms(1), board.heard(p(1)), lease(1_000, 1, 1))
                .is_none(),
            "being taken"
        );
        drop(Taking::new(&board, snapshot));
        let snapshot = board
            .leased(p(1), ms(2), board.heard(p(1)), lease(1_000, 1, 1))
            .expect("again");
        Taking::new(&board, snapshot).done(Ok(None));
        assert!(
            !board.refuses(p(1), &r("NEW"), ms(3)),
            "too many holders: ask the gate"
        );
        assert!(board
            .leased(p(1), ms(4), board.heard(p(1)), lease(1_000, 1, 1))
            .is_none());
    }

    #[test]
    fn a_snapshot_for_an_older_hold_count_is_not_kept() {
        let board = live();
        let old = board
            .leased(p(1), ms(0), board.heard(p(1)), lease(1_000, 1, 1))
            .expect("take");
        let _new = board
            .leased(p(1), ms(1), board.heard(p(1)), lease(1_000, 1, 2))
            .expect("stale");
        board.took(old, holders(&[]));
        assert!(!board.refuses(p(1), &r("NEW"), ms(2)));
    }

    // Checks revocations: one drops its product's entry at once (other products keep
    // theirs); a lease whose call was out when a revocation of its product (or of an
    // unreadable one) arrived is not kept; nothing is trusted while the subscription is
    // not live, and leases heard before it went are forgotten, also once it is back.
    #[test]
    fn revocations_and_a_lost_subscription_end_trust() {
        let board = live();
        for id in [1, 2] {
            let snapshot = board
                .leased(p(id), ms(0), board.heard(p(id)), lease(5_000, 1, 1))
                .expect("take");
            board.took(snapshot, holders(&[]));
        }
        board.revoked(Some(p(1)));
        assert!(!board.refuses(p(1), &r("NEW"), ms(1)), "revoked");
        assert!(board.refuses(p(2), &r("NEW"), ms(1)), "another product");

        let before = board.heard(p(1));
        board.revoked(Some(p(1)));
        assert!(
            board
                .leased(p(1), ms(2), before, lease(5_000, 1, 1))
                .is_none(),
            "the revocation may have ended this very lease"
        );
        assert!(!board.refuses(p(1), &r("NEW"), ms(3)));
        let before = board.heard(p(1));
        board.revoked(None);
        assert!(board
            .leased(p(1), ms(4), before, lease(5_000, 1, 1))
            .is_none());
        assert!(!board.refuses(p(2), &r("NEW"), ms(4)), "unreadable: all");

        let snapshot = board
            .leased(p(1), ms(5), board.heard(p(1)), lease(5_000, 1, 1))
            .expect("after the revocation");
        board.took(snapshot, holders(&[]));
        assert!(board.refuses(p(1), &r("NEW"), ms(6)));
        let before = board.heard(p(1));
        board.deaf();
        assert!(!board.refuses(p(1), &r("NEW"), ms(7)), "forgotten");
        assert!(
            board
                .leased(p(1), ms(8), board.heard(p(1)), lease(5_000, 1, 1))
                .is_none(),
            "not trusted while deaf"
        );
        board.listening();
        assert!(
            board
                .leased(p(1), ms(9), before, lease(5_000, 1, 1))
                .is_none(),
            "heard before the gap"
        );
        assert!(board
            .leased(p(1), ms(10), board.heard(p(1)), lease(5_000, 1, 1))
            .is_some());
        assert!(
            SoldOutBoard::default()
                .leased(
                    p(1),
                    ms(0),
                    SoldOutBoard::default().heard(p(1)),
                    lease(5_000, 1, 1)
                )
                .is_none(),
            "never subscribed"
        );
    }
}
