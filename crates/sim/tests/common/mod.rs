//! What the store tests share: a clock context, a ledger selling product 1, and
//! purchases of it. Each test binary uses some of it.

use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeDelta, TimeZone, Utc};
use flashsale_app::ports::HeldPurchase;
use flashsale_app::Ledger;
use flashsale_core::{
    HoldRef, NewProduct, ProductId, PurchaseRequest, Quantity, RequestId, SaleWindow, Terms, UserId,
};
use flashsale_sim::ctx::Ctx;
use flashsale_sim::exec::block_on;
use flashsale_sim::ledger::{LedgerDefects, MemLedger};

/// A context whose clock starts at 2026-11-29 10:00 UTC, keeping the last `trace_keep`
/// trace lines.
pub fn ctx(trace_keep: usize) -> Arc<Ctx> {
    let start = Utc
        .with_ymd_and_hms(2026, 11, 29, 10, 0, 0)
        .single()
        .expect("date");
    Ctx::new(1, start, 1, TimeDelta::seconds(2), trace_keep)
}

/// An in-memory ledger on `ctx` selling product 1 with `stock` units, created within
/// `polls_max` polls.
pub fn ledger(ctx: &Arc<Ctx>, stock: i64, polls_max: usize) -> MemLedger {
    let l = MemLedger::new(ctx.clone(), LedgerDefects::default());
    let new = NewProduct::parse(1, "P", stock, None, SaleWindow::default()).expect("product");
    block_on(
        l.create_product(&new, &flashsale_core::AdminName::default()),
        polls_max,
    )
    .expect("the call finished")
    .expect("create");
    l
}

/// A purchase `id` of `quantity` units of product 1 by `user`.
pub fn request(id: &str, user: i64, quantity: i64) -> PurchaseRequest {
    PurchaseRequest {
        request_id: RequestId::parse("request_id", id).expect("id"),
        user_id: UserId::parse(user).expect("user"),
        product_id: ProductId::parse(1).expect("product"),
        quantity: Quantity::from_stored(quantity).expect("quantity"),
    }
}

/// `request` with `hold`, its order waiting ten seconds for payment under the per-user
/// `limit`.
pub fn held(request: &PurchaseRequest, hold: HoldRef, limit: Option<u32>) -> HeldPurchase {
    let terms = Terms {
        per_user_limit: limit,
        payment_timeout: Duration::from_secs(10),
    };
    HeldPurchase::new(request, hold, terms)
}
