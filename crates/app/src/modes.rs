//! What this instance knows of its products' stock modes (`flashsale_core::StockMode`):
//! which ones the ledger serves, which ones buyers tried to buy while the gate did not
//! answer, and which ones the ledger last refused as sold out.
//!
//! The ledger decides the mode; this board only says where a purchase goes first. It is
//! refreshed from the ledger every [`FOLLOW_INTERVAL`] by the fallback worker and from
//! the ledger's own answers: a purchase sent the wrong way is answered so (a gate hold's
//! commit finds another generation, a ledger purchase finds gate mode), never sold, so a
//! stale board costs a retry, not a unit.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use flashsale_core::{ProductId, StockMode};

/// How often each instance asks the ledger which products it serves: the bound on how
/// long an instance keeps sending a product's purchases the old way after a switch made
/// elsewhere (one small indexed query per period per instance).
pub const FOLLOW_INTERVAL: Duration = Duration::from_millis(250);

/// How recently an instance must have read the ledger's list of products in ledger mode
/// (when the read was sent, on its monotonic clock) to trust the gate's word on a product
/// it believes in gate mode: a refusal vouched `unseen` (no ledger lookup), and a
/// sold-out lease. Older (the ledger not answering, an instance just started), the gate
/// may be a stale copy of a product the ledger sells (its entry from before the switch),
/// and every refusal asks the ledger whether the request is a replay. Four periods of
/// [`FOLLOW_INTERVAL`]: one slow read does not stop the trust.
pub const FOLLOW_FRESH_MAX: Duration = Duration::from_secs(1);

/// How long after a switch to ledger mode the ledger sells nothing (it answers
/// `Commit::Settling`, a 503): longer than [`FOLLOW_FRESH_MAX`], so by the time the
/// ledger sells a request, every instance that still trusts the gate's stale copy read
/// the list after the switch, knows the product is in ledger mode, and asks the ledger
/// instead. Without it, a request sold by the ledger just after the switch and retried
/// at once on an instance yet to hear of it could be refused by the gate's stale copy
/// ("never held units here") although it is an order. Half a second of margin covers
/// the read's own time and clocks that run at slightly different rates.
pub const LEDGER_SALES_AFTER_SWITCH: Duration = Duration::from_millis(1500);

/// Most products in ledger mode an instance follows: far more than run a sale at once;
/// past it the rest are sent to the gate first and redirected by the ledger's answer.
pub const LEDGER_PRODUCTS_MAX: usize = 10_000;

/// Most products remembered as bought while the gate did not answer; past it the oldest
/// is forgotten (it is switched with the next ones that fail, or when it fails again).
pub const UNREACHED_MAX: usize = 1_024;

/// How long a product counts as being bought after its last purchase found the gate
/// unreachable: long enough to span `FLASHSALE_FALLBACK_AFTER` (the switch waits for it),
/// short enough that a product nobody buys any more is not switched.
pub const UNREACHED_FOR: Duration = Duration::from_secs(60);

/// How long the ledger's "not enough stock" is believed without asking it again. Each
/// purchase under the mark costs one indexed read (is it a replay?) instead of a
/// transaction on the product's locked row; a unit given back on another instance meanwhile
/// is sold at most this much later. This instance's own cancels lift the mark at once.
pub const SOLD_OUT_MARK_FOR: Duration = Duration::from_millis(250);

/// Most sold-out marks kept; past it expired ones are dropped, and if none has expired
/// the new mark is not kept (the ledger is asked, as without a mark).
pub const SOLD_OUT_MARKS_MAX: usize = 10_000;

#[derive(Default)]
pub struct ModeBoard {
    /// Whether any product is in `ledger`: the purchase path reads only this while the
    /// gate serves everything.
    any_ledger: AtomicBool,
    /// When (monotonic, in microseconds, plus one: 0 before the first) the read behind
    /// the ledger set was sent. Every gate purchase reads it (`vouches`), so it is an
    /// atomic rather than behind the lock.
    followed_at_us: AtomicU64,
    inner: Mutex<Board>,
}

#[derive(Default)]
struct Board {
    ledger: HashSet<ProductId>,
    /// Product → when (monotonic) a purchase last found the gate unreachable.
    unreached: HashMap<ProductId, Duration>,
    /// Product → until when (monotonic) the ledger's sold-out answer is believed.
    sold_out: HashMap<ProductId, Duration>,
}

impl ModeBoard {
    fn lock(&self) -> MutexGuard<'_, Board> {
        // The board holds no invariant a panic half-way could break: go on with it.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where this instance sends the product's purchases first.
    pub fn mode(&self, product_id: ProductId) -> StockMode {
        if !self.any_ledger.load(Ordering::Acquire) {
            return StockMode::Gate;
        }
        if self.lock().ledger.contains(&product_id) {
            StockMode::Ledger
        } else {
            StockMode::Gate
        }
    }

    /// The ledger said the product is in `mode` (a switch, or an answer).
    pub fn set(&self, product_id: ProductId, mode: StockMode) {
        let mut b = self.lock();
        match mode {
            StockMode::Ledger => {
                if b.ledger.len() < LEDGER_PRODUCTS_MAX {
                    b.ledger.insert(product_id);
                }
                b.unreached.remove(&product_id);
            }
            StockMode::Gate => {
                b.ledger.remove(&product_id);
                b.sold_out.remove(&product_id);
            }
        }
        self.any_ledger
            .store(!b.ledger.is_empty(), Ordering::Release);
    }

    /// The ledger's list of the products in ledger mode (at most
    /// [`LEDGER_PRODUCTS_MAX`]), read by a query sent at `asked_at` (monotonic): it
    /// replaces this instance's view, unless a read sent later was applied already. Two
    /// tasks follow the ledger (the fallback worker's pass and the mode follower); a late
    /// answer of an older read would otherwise put back a list from before a switch under
    /// the newer read's time, and `vouches` would trust the gate's stale copy of a
    /// product the ledger already sells.
    pub fn follow(&self, ledger: impl IntoIterator<Item = ProductId>, asked_at: Duration) {
        let mut b = self.lock();
        let asked_us = u64::try_from(asked_at.as_micros())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1);
        // Written only here, under the lock: no newer read can be applied meanwhile.
        if asked_us < self.followed_at_us.load(Ordering::Acquire) {
            return;
        }
        b.ledger = ledger.into_iter().take(LEDGER_PRODUCTS_MAX).collect();
        self.followed_at_us.store(asked_us, Ordering::Release);
        let Board {
            ledger, sold_out, ..
        } = &mut *b;
        sold_out.retain(|p, _| ledger.contains(p));
        self.any_ledger
            .store(!b.ledger.is_empty(), Ordering::Release);
    }

    /// Whether this instance read the list of products in ledger mode recently enough,
    /// at `now`, to trust the gate's refusals and leases ([`FOLLOW_FRESH_MAX`]).
    pub fn vouches(&self, now: Duration) -> bool {
        match self.followed_at_us.load(Ordering::Acquire) {
            0 => false,
            plus_one => now.saturating_sub(Duration::from_micros(plus_one - 1)) <= FOLLOW_FRESH_MAX,
        }
    }

    /// The products in ledger mode, as this instance knows them.
    pub fn ledger_products(&self) -> Vec<ProductId> {
        let mut products: Vec<_> = self.lock().ledger.iter().copied().collect();
        products.sort_unstable();
        products
    }

    /// A purchase of the product found the gate unreachable at `now`.
    pub fn unreached(&self, product_id: ProductId, now: Duration) {
        let mut b = self.lock();
        if b.unreached.len() >= UNREACHED_MAX && !b.unreached.contains_key(&product_id) {
            if let Some(oldest) = b
                .unreached
                .iter()
                .min_by_key(|(_, at)| **at)
                .map(|(p, _)| *p)
            {
                b.unreached.remove(&oldest);
            }
        }
        b.unreached.insert(product_id, now);
    }

    /// The products in gate mode bought while the gate did not answer, within
    /// [`UNREACHED_FOR`] before `now`; older ones are forgotten.
    pub fn being_bought_unreached(&self, now: Duration) -> Vec<ProductId> {
        let mut b = self.lock();
        b.unreached
            .retain(|_, at| now.saturating_sub(*at) < UNREACHED_FOR);
        let Board {
            ledger, unreached, ..
        } = &*b;
        let mut products: Vec<_> = unreached
            .keys()
            .filter(|p| !ledger.contains(p))
            .copied()
            .collect();
        products.sort_unstable();
        products
    }

    /// The ledger refused a purchase of the product for want of stock at `now`.
    pub fn mark_sold_out(&self, product_id: ProductId, now: Duration) {
        let mut b = self.lock();
        if b.sold_out.len() >= SOLD_OUT_MARKS_MAX {
            b.sold_out.retain(|_, until| *until > now);
            if b.sold_out.len() >= SOLD_OUT_MARKS_MAX {
                return;
            }
        }
        b.sold_out.insert(product_id, now + SOLD_OUT_MARK_FOR);
    }

    /// Whether the ledger's sold-out answer for the product still stands at `now`.
    pub fn marked_sold_out(&self, product_id: ProductId, now: Duration) -> bool {
        self.lock()
            .sold_out
            .get(&product_id)
            .is_some_and(|until| *until > now)
    }

    /// Units of the product came back (a cancel here): the next purchase asks the ledger.
    pub fn lift_sold_out(&self, product_id: ProductId) {
        if self.any_ledger.load(Ordering::Acquire) {
            self.lock().sold_out.remove(&product_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(id: i64) -> ProductId {
        ProductId::parse(id).expect("product id")
    }

    const T0: Duration = Duration::from_secs(100);

    // Checks the board's mode follows the ledger's list and single answers, and that a
    // product switched back to the gate loses its sold-out mark.
    #[test]
    fn the_mode_follows_the_ledger() {
        let board = ModeBoard::default();
        assert_eq!(board.mode(p(1)), StockMode::Gate);
        board.follow([p(1), p(2)], T0);
        assert_eq!(board.mode(p(1)), StockMode::Ledger);
        assert_eq!(board.ledger_products(), vec![p(1), p(2)]);
        board.mark_sold_out(p(2), T0);
        assert!(board.marked_sold_out(p(2), T0));
        board.set(p(2), StockMode::Gate);
        assert_eq!(board.mode(p(2)), StockMode::Gate);
        assert!(!board.marked_sold_out(p(2), T0));
        board.follow([], T0);
        assert_eq!(board.mode(p(1)), StockMode::Gate);
        board.set(p(3), StockMode::Ledger);
        assert_eq!(board.ledger_products(), vec![p(3)]);
    }

    // Checks the trust in the gate: none before the first read of the list, then for
    // FOLLOW_FRESH_MAX after the latest read's sending (a late answer of an older read
    // does not make the view younger, nor replace the newer read's list), and none after
    // that.
    #[test]
    fn the_gate_is_trusted_only_after_a_recent_read() {
        let board = ModeBoard::default();
        assert!(!board.vouches(T0));
        board.follow([], T0);
        assert!(board.vouches(T0 + FOLLOW_FRESH_MAX));
        assert!(!board.vouches(T0 + FOLLOW_FRESH_MAX + Duration::from_millis(1)));
        board.follow([p(1)], T0);
        board.follow([], T0 - Duration::from_secs(5));
        assert!(board.vouches(T0 + FOLLOW_FRESH_MAX));
        assert_eq!(
            board.mode(p(1)),
            StockMode::Ledger,
            "the older read's list, from before the switch, is not applied"
        );
        board.follow([], T0 + Duration::from_secs(2));
        assert!(board.vouches(T0 + Duration::from_secs(3)));
        assert!(LEDGER_SALES_AFTER_SWITCH > FOLLOW_FRESH_MAX);
    }

    // Checks the products bought while the gate was unreachable: listed within
    // UNREACHED_FOR, not once in ledger mode, forgotten after it, and bounded in number.
    #[test]
    fn unreached_products_are_recent_and_bounded() {
        let board = ModeBoard::default();
        board.unreached(p(1), T0);
        board.unreached(p(2), T0 + Duration::from_secs(30));
        assert_eq!(
            board.being_bought_unreached(T0 + Duration::from_secs(1)),
            vec![p(1), p(2)]
        );
        board.set(p(2), StockMode::Ledger);
        assert_eq!(
            board.being_bought_unreached(T0 + Duration::from_secs(1)),
            vec![p(1)]
        );
        assert!(board.being_bought_unreached(T0 + UNREACHED_FOR).is_empty());
        for id in 1..=i64::try_from(UNREACHED_MAX).expect("fits") + 10 {
            board.unreached(
                p(id),
                T0 + Duration::from_millis(u64::try_from(id).expect("fits")),
            );
        }
        let listed = board.being_bought_unreached(T0 + Duration::from_secs(2));
        assert_eq!(listed.len(), UNREACHED_MAX);
        assert!(!listed.contains(&p(1)), "the oldest was forgotten");
    }

    // Checks a sold-out mark lasts SOLD_OUT_MARK_FOR, is lifted by a cancel here, and
    // that a full table keeps no new mark until old ones expire.
    #[test]
    fn a_sold_out_mark_is_short_and_bounded() {
        let board = ModeBoard::default();
        board.set(p(1), StockMode::Ledger);
        board.mark_sold_out(p(1), T0);
        assert!(board.marked_sold_out(p(1), T0 + SOLD_OUT_MARK_FOR - Duration::from_millis(1)));
        assert!(!board.marked_sold_out(p(1), T0 + SOLD_OUT_MARK_FOR));
        board.mark_sold_out(p(1), T0);
        board.lift_sold_out(p(1));
        assert!(!board.marked_sold_out(p(1), T0));
        for id in 1..=i64::try_from(SOLD_OUT_MARKS_MAX).expect("fits") {
            board.mark_sold_out(p(id), T0);
        }
        let extra = p(i64::try_from(SOLD_OUT_MARKS_MAX).expect("fits") + 1);
        board.mark_sold_out(extra, T0);
        assert!(!board.marked_sold_out(extra, T0), "full: not kept");
        board.mark_sold_out(extra, T0 + SOLD_OUT_MARK_FOR);
        assert!(board.marked_sold_out(extra, T0 + SOLD_OUT_MARK_FOR));
    }
}
