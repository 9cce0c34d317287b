//! An in-process cache of product definitions, so the purchase path does not read the
//! ledger for every attempt. Definitions never change after creation except the
//! `stock_loaded` flag, which only ever goes from false to true, and the `stock_mode`,
//! which a cached copy may show up to [`FOUND_TTL`] late: nothing may decide from it
//! (the ledger's own answers to a purchase decide the mode).
//!
//! Concurrent misses of one id share one read: the first reads the ledger, the others
//! wait for it and take its answer from the cache. A flood on an unknown id therefore
//! costs the ledger one read per [`MISSING_TTL`], however many attempts arrive at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use flashsale_core::ProductId;

use crate::model::Product;
use crate::ports::{Clock, Ledger, LedgerError};

/// How long a known product is served from memory before it is read again.
const FOUND_TTL: Duration = Duration::from_secs(60);
/// How long "no such product" is remembered: short, so a product created on another
/// instance becomes buyable within a second, yet a flood of attempts on an unknown id
/// costs the ledger at most one read per second per id.
const MISSING_TTL: Duration = Duration::from_secs(1);
/// Most entries kept; past it the cache starts over, which bounds memory under a flood of
/// random product ids.
const ENTRIES_MAX: usize = 100_000;

struct Entry {
    product: Option<Arc<Product>>,
    /// On the service's monotonic clock ([`crate::ports::Clock::monotonic`]), which the
    /// purchase reads anyway: no clock read of the cache's own.
    fetched_at: Duration,
}

#[derive(Default)]
pub(crate) struct Catalog {
    entries: RwLock<HashMap<ProductId, Entry>>,
    /// One turn per id being read: a miss takes its id's turn, and a miss that finds the
    /// turn taken waits for it, then finds the answer cached. An entry lives only while
    /// a read of its id is in flight or awaited, so the map is bounded by the requests in
    /// flight.
    reads: Mutex<HashMap<ProductId, Arc<tokio::sync::Mutex<()>>>>,
}

impl Catalog {
    pub(crate) async fn get(
        &self,
        ledger: &dyn Ledger,
        clock: &dyn Clock,
        product_id: ProductId,
        now: Duration,
    ) -> Result<Option<Arc<Product>>, LedgerError> {
        if let Some(hit) = self.cached(product_id, now) {
            return Ok(hit);
        }
        let turn = self.turn(product_id);
        let read = async {
            let _mine = turn.lock().await;
            // Another miss may have read it while this one waited for the turn.
            if let Some(hit) = self.cached(product_id, clock.monotonic()) {
                return Ok(hit);
            }
            let product = ledger.product(product_id).await?.map(Arc::new);
            // Stamped when the read came back, not when it was asked: a slow ledger must
            // not hand the cache entries that are stale already (a flood on an unknown id
            // would then read the ledger on every attempt, just when it is slow).
            self.put(product_id, product.clone(), clock.monotonic());
            Ok(product)
        };
        let outcome = read.await;
        self.turn_done(product_id, turn);
        outcome
    }

    /// The turn of `product_id`'s read, made when none is taken.
    fn turn(&self, product_id: ProductId) -> Arc<tokio::sync::Mutex<()>> {
        let mut reads = self.reads.lock().unwrap_or_else(|p| p.into_inner());
        reads.entry(product_id).or_default().clone()
    }

    /// Forgets `product_id`'s turn once no other miss holds or waits for it. (A miss that
    /// takes it right after is served by the cache, or reads on a new turn of its own:
    /// a second read at worst, never a wrong answer.)
    fn turn_done(&self, product_id: ProductId, turn: Arc<tokio::sync::Mutex<()>>) {
        let mut reads = self.reads.lock().unwrap_or_else(|p| p.into_inner());
        let same = reads
            .get(&product_id)
            .is_some_and(|t| Arc::ptr_eq(t, &turn));
        // The map's reference and this one: nobody else has the turn.
        if same && Arc::strong_count(&turn) <= 2 {
            reads.remove(&product_id);
        }
    }

    fn cached(&self, product_id: ProductId, now: Duration) -> Option<Option<Arc<Product>>> {
        let entries = self.entries.read().unwrap_or_else(|p| p.into_inner());
        let entry = entries.get(&product_id)?;
        let ttl = if entry.product.is_some() {
            FOUND_TTL
        } else {
            MISSING_TTL
        };
        (now.saturating_sub(entry.fetched_at) < ttl).then(|| entry.product.clone())
    }

    /// Remembers `product` as read at `now` (monotonic).
    pub(crate) fn put(&self, product_id: ProductId, product: Option<Arc<Product>>, now: Duration) {
        let mut entries = self.entries.write().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= ENTRIES_MAX && !entries.contains_key(&product_id) {
            entries.clear();
        }
        entries.insert(
            product_id,
            Entry {
                product,
                fetched_at: now,
            },
        );
    }
}
