//! Lists: the products (for an operator) and a buyer's orders, a page at a time. Each
//! page is one indexed query (the ledger's primary key, or its per-buyer order index)
//! read a row past the page, so the next page's cursor is known without a count.
//! Cursors are the last id of the page, so a page stays stable while orders are added:
//! products come in id order, orders newest first, and an id is never reused.

use std::sync::Arc;

use async_trait::async_trait;
use flashsale_core::{InventoryCounters, OrderId, OrderStatus, ProductId, UserId};

use crate::error::Error;
use crate::model::{LoggedAction, Order, Product};
use crate::ports::LedgerError;

/// Items on a page when the client names no limit.
pub const PAGE_DEFAULT: usize = 20;
/// Most items on a page: a page is one query and one answer held whole in memory, so
/// this bounds both (100 orders are about 40 KB of JSON).
pub const PAGE_MAX: usize = 100;

/// The ledger's reads behind the lists.
#[async_trait]
pub trait Listings: Send + Sync + 'static {
    /// Products by id, after `after`, at most `limit`, each with its ledger counters.
    async fn products_after(
        &self,
        after: Option<ProductId>,
        limit: usize,
    ) -> Result<Vec<(Product, InventoryCounters)>, LedgerError>;

    /// `user`'s orders, newest first, older than `before`, in `status` if given, at most
    /// `limit`.
    async fn orders_of(
        &self,
        user: UserId,
        status: Option<OrderStatus>,
        before: Option<OrderId>,
        limit: usize,
    ) -> Result<Vec<Order>, LedgerError>;

    /// The operator's log, newest first, of `product` if given, older than the line
    /// `before`, at most `limit`.
    async fn actions(
        &self,
        product: Option<ProductId>,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<LoggedAction>, LedgerError>;
}

/// One page: its items, and the cursor of the next page (None on the last).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next: Option<i64>,
}

impl<T> Page<T> {
    /// The page of `limit` from rows read with one more than `limit`: the extra row only
    /// says that a next page exists, after the page's last item `id`.
    fn of(mut rows: Vec<T>, limit: usize, id: impl Fn(&T) -> i64) -> Self {
        debug_assert!(
            rows.len() <= limit + 1,
            "a page reads one row past its limit"
        );
        let more = rows.len() > limit;
        rows.truncate(limit);
        let next = if more { rows.last().map(&id) } else { None };
        Self { items: rows, next }
    }
}

/// A page size as the client asked for it: 1 to [`PAGE_MAX`], [`PAGE_DEFAULT`] unnamed.
pub fn page_size(asked: Option<u64>) -> Result<usize, Error> {
    match asked {
        None => Ok(PAGE_DEFAULT),
        Some(n) if (1..=PAGE_MAX as u64).contains(&n) => Ok(n as usize),
        Some(_) => Err(Error::Invalid(flashsale_core::ParseError::new(
            "limit",
            format!("must be between 1 and {PAGE_MAX}"),
        ))),
    }
}

/// The lists use case.
pub struct Listing {
    lists: Arc<dyn Listings>,
}

impl std::fmt::Debug for Listing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Listing")
    }
}

impl Listing {
    pub fn new(lists: Arc<dyn Listings>) -> Self {
        Self { lists }
    }

    /// The products after the cursor, with their counters as the ledger has them.
    pub async fn products(
        &self,
        after: Option<ProductId>,
        limit: usize,
    ) -> Result<Page<(Product, InventoryCounters)>, Error> {
        let rows = self.lists.products_after(after, limit + 1).await?;
        // The cursor is the page's last id only if the page is in id order.
        debug_assert!(
            rows.windows(2)
                .all(|w| w[0].0.product_id.get() < w[1].0.product_id.get()),
            "products come in id order"
        );
        Ok(Page::of(rows, limit, |(p, _)| p.product_id.get()))
    }

    /// A buyer's orders before the cursor, newest first.
    pub async fn orders(
        &self,
        user: UserId,
        status: Option<OrderStatus>,
        before: Option<OrderId>,
        limit: usize,
    ) -> Result<Page<Order>, Error> {
        let rows = self
            .lists
            .orders_of(user, status, before, limit + 1)
            .await?;
        debug_assert!(
            rows.windows(2)
                .all(|w| w[0].order_id.get() > w[1].order_id.get()),
            "a buyer's orders come newest first"
        );
        Ok(Page::of(rows, limit, |o| o.order_id.get()))
    }

    /// The operator's log before the cursor, newest first, of one product or of all.
    pub async fn actions(
        &self,
        product: Option<ProductId>,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Page<LoggedAction>, Error> {
        let rows = self.lists.actions(product, before, limit + 1).await?;
        debug_assert!(
            rows.windows(2).all(|w| w[0].id > w[1].id),
            "the operator's log comes newest first"
        );
        Ok(Page::of(rows, limit, |a| a.id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks a page's cut: a full read (limit + 1 rows) gives `limit` items and the last
    // one's id as the cursor; a short read is the last page, without a cursor; and page
    // sizes outside 1..=PAGE_MAX are refused under `limit`.
    #[test]
    fn pages_and_sizes() {
        let page = Page::of(vec![5, 4, 3], 2, |&n| n);
        assert_eq!((page.items, page.next), (vec![5, 4], Some(4)));
        let last = Page::of(vec![2, 1], 2, |&n| n);
        assert_eq!((last.items, last.next), (vec![2, 1], None));
        assert_eq!(page_size(None).ok(), Some(PAGE_DEFAULT));
        assert_eq!(page_size(Some(100)).ok(), Some(100));
        for bad in [0, 101, u64::MAX] {
            assert!(matches!(page_size(Some(bad)), Err(Error::Invalid(e)) if e.field == "limit"));
        }
    }
}
