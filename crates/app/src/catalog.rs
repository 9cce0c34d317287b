//! An in-process cache of product definitions, so the purchase path does not read the
//! ledger for every attempt. Definitions never change after creation except the
//! `stock_loaded` flag, which only ever goes from false to true, and the `stock_mode`,
//! which a cached copy may show up to [`FOUND_TTL`] late: nothing may decide from it
//! (the ledger's own answers to a purchase decide the mode).
//!
//! Concurrent misses of one id share one read: the first starts it, the others await the
//! same read (a shared future: whichever of them is polled drives it, so no miss waits
//! on another task's progress, and the read goes on while any of them still awaits it).
//! A flood on an unknown id therefore costs the ledger one read per [`MISSING_TTL`],
//! however many attempts arrive at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use flashsale_core::ProductId;
use futures::future::{BoxFuture, FutureExt, Shared, WeakShared};

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
    /// The read in flight of each id being read, held weakly: it lives as long as a miss
    /// awaits it, and the map only lets a later miss join it, so the map is bounded by
    /// the requests in flight.
    reads: Mutex<HashMap<ProductId, WeakShared<Read>>>,
}

/// One read of a product from the ledger, shared by the misses that await it.
type Read = BoxFuture<'static, Result<Option<Arc<Product>>, LedgerError>>;

/// A miss awaiting its id's read; dropped (the read answered, or the request gone), the
/// last one forgets the read.
struct Awaiting<'a> {
    catalog: &'a Catalog,
    product_id: ProductId,
    read: Shared<Read>,
}

impl Drop for Awaiting<'_> {
    fn drop(&mut self) {
        let mut reads = self.catalog.reads.lock().unwrap_or_else(|p| p.into_inner());
        let ours = reads
            .get(&self.product_id)
            .and_then(WeakShared::upgrade)
            .is_none_or(|r| r.ptr_eq(&self.read));
        // This miss alone still awaits it: a later miss reads anew (or finds the cache).
        if ours && self.read.strong_count() == Some(1) {
            reads.remove(&self.product_id);
        }
    }
}

impl Catalog {
    pub(crate) async fn get(
        &self,
        ledger: &Arc<dyn Ledger>,
        clock: &dyn Clock,
        product_id: ProductId,
        now: Duration,
    ) -> Result<Option<Arc<Product>>, LedgerError> {
        if let Some(hit) = self.cached(product_id, now) {
            return Ok(hit);
        }
        let awaiting = Awaiting {
            catalog: self,
            product_id,
            read: self.read_of(ledger, product_id),
        };
        let outcome = awaiting.read.clone().await;
        if let Ok(product) = &outcome {
            // Stamped when the read came back, not when it was asked: a slow ledger must
            // not hand the cache entries that are stale already (a flood on an unknown id
            // would then read the ledger on every attempt, just when it is slow).
            self.put(product_id, product.clone(), clock.monotonic());
        }
        drop(awaiting);
        outcome
    }

    /// The read of `product_id` in flight, or a new one.
    fn read_of(&self, ledger: &Arc<dyn Ledger>, product_id: ProductId) -> Shared<Read> {
        let mut reads = self.reads.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(read) = reads.get(&product_id).and_then(WeakShared::upgrade) {
            return read;
        }
        let ledger = ledger.clone();
        let read = async move { Ok(ledger.product(product_id).await?.map(Arc::new)) }
            .boxed()
            .shared();
        match read.downgrade() {
            Some(weak) => {
                reads.insert(product_id, weak);
            }
            None => debug_assert!(false, "a shared future not polled yet can be downgraded"),
        }
        read
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
