//! An in-process cache of product definitions, so the purchase path does not read the
//! ledger for every attempt. An operator's change to a definition (a pause, say:
//! `control.rs`) is announced to every instance, and each forgets its copy when it hears
//! it ([`Catalog::forget`]), so the next attempt reads the change; an announcement lost
//! (the subscription down) is made good by [`FOUND_TTL`]. The `stock_mode` a cached copy
//! shows may be up to [`FOUND_TTL`] late: nothing may decide from it (the ledger's own
//! answers to a purchase decide the mode).
//!
//! Concurrent misses of one id share one read: the first starts it, the others await the
//! same read (a shared future: whichever of them is polled drives it, so no miss waits
//! on another task's progress, and the read goes on while any of them still awaits it).
//! A flood on an unknown id therefore costs the ledger one read per [`MISSING_TTL`],
//! however many attempts arrive at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use flashsale_core::ProductId;
use futures::future::{BoxFuture, FutureExt, Shared, WeakShared};

use crate::model::Product;
use crate::ports::{Clock, Ledger, LedgerError};

/// How long a known product is served from memory before it is read again: the bound
/// on how late an instance that missed a change's announcement (its subscription lost)
/// acts on the change. One read a second per product per instance costs the ledger
/// nothing, against a flood of thousands of attempts a second served from memory.
pub(crate) const FOUND_TTL: Duration = Duration::from_secs(1);
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
    /// Counts the changes forgotten: a read that began before one may still answer its
    /// callers, but is not kept (it may predate the change).
    changes: AtomicU64,
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
        // Read before joining a read: a change forgotten after this point makes the
        // result unkept; one forgotten before it also dropped the read it may join
        // (`forget`), so the read joined began after the change.
        let seen = self.changes.load(Ordering::Acquire);
        let awaiting = Awaiting {
            catalog: self,
            product_id,
            read: self.read_of(ledger, product_id),
        };
        let outcome = awaiting.read.clone().await;
        if let Ok(product) = &outcome {
            // A product is stamped when it was asked for (`now`, no later than the read
            // began), so a copy is never served past FOUND_TTL after the ledger's state
            // it shows: the bound a change that was not announced is read within. "No
            // such product" is stamped when the read came back: a slow ledger must not
            // hand the cache entries that are stale already (a flood on an unknown id
            // would then read the ledger on every attempt, just when it is slow).
            let stamp = match product {
                Some(_) => now,
                None => clock.monotonic(),
            };
            self.keep(product_id, product.clone(), stamp, seen);
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

    /// Forgets `product_id`'s copy and any read of it in flight, after its definition
    /// changed in the ledger: the next attempt reads it anew.
    pub(crate) fn forget(&self, product_id: ProductId) {
        // The read in flight first: a miss that reads `changes` after the bump below
        // must not join a read that began before the change.
        self.reads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&product_id);
        let mut entries = self.entries.write().unwrap_or_else(|p| p.into_inner());
        self.changes.fetch_add(1, Ordering::AcqRel);
        entries.remove(&product_id);
    }

    /// Forgets every copy: a change was announced whose product could not be read.
    pub(crate) fn forget_all(&self) {
        self.reads.lock().unwrap_or_else(|p| p.into_inner()).clear();
        let mut entries = self.entries.write().unwrap_or_else(|p| p.into_inner());
        self.changes.fetch_add(1, Ordering::AcqRel);
        entries.clear();
    }

    /// Remembers `product` as read at `now` (monotonic), unless a change was forgotten
    /// since the read began (`seen`, the count of changes then).
    fn keep(&self, product_id: ProductId, product: Option<Arc<Product>>, now: Duration, seen: u64) {
        let mut entries = self.entries.write().unwrap_or_else(|p| p.into_inner());
        if self.changes.load(Ordering::Acquire) != seen {
            return;
        }
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
