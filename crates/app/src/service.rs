//! The use cases.
//!
//! The purchase path, in the order the seeds ask for:
//! 1. the stock gate (Redis) atomically checks stock and the per-user limit, takes the
//!    units and records a hold under the request_id — the trace that makes every
//!    decrement findable;
//! 2. the ledger (MariaDB) commits reservation + order + counters in one transaction, its
//!    unique key on request_id making the commit happen at most once per request;
//! 3. only then the client hears 201.
//!
//! Every path that gives a hold's units back first makes the ledger say so durably (a
//! cancelled order, or a fence row that takes the request_id), and only then returns the
//! units to the gate — so a late commit can never create an order whose units were given
//! back. When the ledger can't be reached the hold stays in place, findable, for a retry
//! to complete or for recovery to fence and release.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use flashsale_core::{
    parse_restock, AdminName, CancelReason, Generation, HoldRef, NewProduct, OrderId, OrderStatus,
    ProductId, PurchaseRequest, ReleaseReason, RequestId, StockMode, Transition, UserId,
};
use tracing::{debug, error, info, warn};

use crate::after_sale::SaleRetirements;
use crate::catalog::Catalog;
use crate::control::Hearing;
use crate::error::Error;
use crate::limit::{self, Limiter, Rate};
use crate::model::{
    AdminAction, InventoryView, Order, Product, ProductView, PurchaseOutcome, PurchaseRecord,
    Purchased,
};
use crate::modes::ModeBoard;
use crate::ports::{
    Clock, Commit, CreateProduct, ErrorKind, ExistingHold, Fence, GateMaintenance, HeldPurchase,
    LeaseListener, Ledger, LedgerError, LedgerPurchase, RecordRestock, Release, ReleaseOf, Reserve,
    Restock, SoldOutLease, StaleHold, StockChange, StockGate,
};
use crate::sold_out::{Check, Heard, SoldOutBoard, Taking, HOLDERS_MAX};

/// Settings the use cases need, parsed and validated by the binary.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long an order may stay unpaid.
    pub payment_timeout: Duration,
    /// Most units one purchase may take.
    pub max_quantity_per_order: u32,
}

pub struct Flashsale {
    gate: Arc<dyn StockGate>,
    ledger: Arc<dyn Ledger>,
    clock: Arc<dyn Clock>,
    settings: Settings,
    catalog: Arc<Catalog>,
    sold_out: Arc<SoldOutBoard>,
    /// Which products the ledger serves, as this instance knows (`modes.rs`).
    modes: Arc<ModeBoard>,
    /// Purchase attempts per user that reach the gate (None: no limit).
    user_rate: Option<Limiter<i64>>,
    /// The gate limits each user's attempts itself, for every instance at once
    /// (`Reserve::RateLimited`): `user_rate` then counts only purchases the ledger
    /// sells, while the gate is out of reach.
    user_rate_at_gate: bool,
    /// Wakes the gate watch when a purchase meets a gate that must be rebuilt, so the
    /// rebuild starts at once instead of at the watch's next period (None: no watch).
    gate_watch: Option<Arc<Notify>>,
    /// Loads a product whose earlier sale was retired from a rebuild's plan
    /// (`after_sale.rs`; None: a later generation is loaded as a first one).
    reload: Option<Reload>,
}

/// The ports a retired sale's way back uses: the ledger's plan, the gate's rebuild.
struct Reload {
    ledger: Arc<dyn SaleRetirements>,
    gate: Arc<dyn GateMaintenance>,
}

/// Whether the hold being committed was taken by this attempt or found from an earlier one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HoldOrigin {
    Fresh,
    Earlier,
}

impl Flashsale {
    pub fn new(
        gate: Arc<dyn StockGate>,
        ledger: Arc<dyn Ledger>,
        clock: Arc<dyn Clock>,
        settings: Settings,
    ) -> Self {
        Self {
            gate,
            ledger,
            clock,
            settings,
            catalog: Arc::new(Catalog::default()),
            sold_out: Arc::new(SoldOutBoard::default()),
            modes: Arc::new(ModeBoard::default()),
            user_rate: None,
            user_rate_at_gate: false,
            gate_watch: None,
            reload: None,
        }
    }

    /// A product whose gate is not loaded in a later generation than its first (its
    /// ended sale was retired, `after_sale.rs`) is loaded from the ledger's plan and
    /// rebuilt in the gate, not loaded from the counters as a first time.
    pub fn with_reload(
        mut self,
        ledger: Arc<dyn SaleRetirements>,
        gate: Arc<dyn GateMaintenance>,
    ) -> Self {
        self.reload = Some(Reload { ledger, gate });
        self
    }

    /// Purchases that meet a gate behind the ledger (an entry another Redis process
    /// wrote, a hold of a generation since advanced) wake the gate watch through
    /// `nudge`, besides answering 503.
    pub fn with_gate_watch(mut self, nudge: Arc<Notify>) -> Self {
        self.gate_watch = Some(nudge);
        self
    }

    /// The gate is behind the ledger: the gate watch should look now.
    fn gate_behind(&self) {
        if let Some(nudge) = &self.gate_watch {
            nudge.notify_one();
        }
    }

    /// Limits each user's purchase attempts to `rate` (`limit.rs`). Counted are the
    /// attempts that would reach the gate: a refusal of a sold-out product from the
    /// sold-out board costs no store anything, and is answered as always.
    pub fn with_user_rate(mut self, rate: Rate) -> Self {
        self.user_rate = Some(Limiter::new(rate, limit::KEYS_MAX));
        self
    }

    /// Like [`Flashsale::with_user_rate`], but the gate keeps the limit for purchases
    /// it serves, shared by every instance (the gate was configured with `rate`); this
    /// instance's own limiter counts only purchases of products in ledger mode.
    pub fn with_user_rate_at_gate(mut self, rate: Rate) -> Self {
        self.user_rate_at_gate = true;
        self.with_user_rate(rate)
    }

    /// Where the gate's revocations of sold-out leases go: until something reports
    /// [`LeaseListener::listening`] here, no lease is trusted and every purchase asks
    /// the gate.
    pub fn lease_listener(&self) -> Arc<dyn LeaseListener> {
        Arc::new(Hearing {
            sold_out: self.sold_out.clone(),
            catalog: self.catalog.clone(),
        })
    }

    /// `product_id`'s definition changed in the ledger (an operator's action, this
    /// instance's or announced by another): the next attempt reads it anew.
    pub fn product_changed(&self, product_id: ProductId) {
        self.catalog.forget(product_id);
    }

    /// Which products this instance sends to the ledger: the fallback worker keeps it
    /// (`fallback.rs`), purchases read it and correct it from the ledger's answers.
    pub fn mode_board(&self) -> Arc<ModeBoard> {
        self.modes.clone()
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Both dependencies answer.
    pub async fn ready(&self) -> Result<(), Error> {
        self.gate.ping().await?;
        self.ledger.ping().await?;
        Ok(())
    }

    // ---- products -------------------------------------------------------------------

    /// Creates a product and loads its stock into the gate before answering. Only the
    /// call whose insert created the product succeeds (the ledger's primary key picks
    /// it); every other gets `ProductExists`. One with the same definition, such as a
    /// retry of a creation whose warm-up failed, finishes the warm-up first.
    pub async fn create_product(
        &self,
        new: NewProduct,
        by: &AdminName,
    ) -> Result<ProductView, Error> {
        match self.ledger.create_product(&new, by).await? {
            // Read back after the insert committed: a concurrent duplicate (below) or a
            // purchase may have loaded the stock since, and then the gate's count stands.
            CreateProduct::Created(product) if product.stock_loaded => {}
            CreateProduct::Created(product) => self.load_stock(&product).await?,
            CreateProduct::Exists(existing, total) => {
                let same = existing.name == new.name
                    && existing.per_user_limit == new.per_user_limit
                    && existing.window == new.window
                    && total == new.stock;
                // Loading is idempotent (the gate keeps a count it has), so this is
                // harmless while the creator is still loading too.
                if same && !existing.stock_loaded {
                    self.load_stock(&existing).await?;
                }
                return Err(Error::ProductExists);
            }
        }
        info!(product_id = %new.product_id, stock = new.stock, "product created and stock loaded");
        self.product_view(new.product_id).await
    }

    /// Product definition with live inventory.
    pub async fn product_view(&self, product_id: ProductId) -> Result<ProductView, Error> {
        let product = self
            .ledger
            .product(product_id)
            .await?
            .ok_or(Error::ProductNotFound)?;
        let counters = self
            .ledger
            .inventory(product_id)
            .await?
            .ok_or(Error::ProductNotFound)?;
        let available = match product.stock_mode {
            // The ledger serves the stock, and its counters are exact: the gate is
            // behind (or unreachable) until it is rebuilt on the way back.
            StockMode::Ledger => counters.available,
            StockMode::Gate => match self.gate.available(product_id).await? {
                Some(available) => available,
                // Never loaded: nothing was sold through the gate yet, the ledger is exact.
                None if !product.stock_loaded => counters.available,
                None => {
                    return Err(Error::Unavailable(
                        format!("stock of product {product_id} is missing from the stock gate")
                            .into(),
                    ))
                }
            },
        };
        Ok(ProductView {
            product,
            inventory: InventoryView {
                total: counters.total,
                available,
                reserved: counters.reserved,
                sold: counters.sold,
            },
        })
    }

    /// Adds `quantity` units, once per the action's request_id, while purchases run; the
    /// operator's log names the action's admin.
    pub async fn restock(&self, action: AdminAction, quantity: i64) -> Result<ProductView, Error> {
        let quantity = parse_restock(quantity)?;
        let (product_id, restock_id) = (action.product_id, &action.request_id);
        // Record restocks only against a loaded gate, so warm-up (which copies the
        // ledger's counters) never meets a restock that is also still to be applied. In
        // ledger mode the ledger records it as applied: the gate is not used.
        self.stock_ready(product_id).await?;
        let (applied, generation) = match self.ledger.record_restock(&action, quantity).await? {
            RecordRestock::Recorded {
                applied,
                generation,
            } => {
                self.modes.lift_sold_out(product_id);
                (applied, generation)
            }
            RecordRestock::Conflict => return Err(Error::RequestIdConflict),
            RecordRestock::TooLarge => {
                return Err(Error::Invalid(flashsale_core::ParseError::new(
                    "quantity",
                    format!(
                        "would take the total past {} units",
                        flashsale_core::STOCK_MAX
                    ),
                )))
            }
        };
        if !applied {
            let change = StockChange {
                product_id,
                id: restock_id.clone(),
                quantity,
                generation,
            };
            match self.gate.restock(&change).await? {
                // Stale: a rebuild since the restock was recorded counted it already.
                Restock::Applied | Restock::AlreadyApplied | Restock::Stale => {
                    self.ledger.mark_restock_applied(restock_id).await?;
                    info!(%product_id, %restock_id, quantity, "restocked");
                }
                Restock::NotLoaded => {
                    return Err(Error::Unavailable(
                        format!(
                            "stock of product {product_id} is missing from the stock gate or \
                         being rebuilt; the restock is recorded and will apply on retry"
                        )
                        .into(),
                    ))
                }
            }
        }
        self.product_view(product_id).await
    }

    /// The product exists and, in gate mode, its stock is loaded in the gate: what an
    /// admin's change of the stock (a restock, a destock) needs before the ledger records
    /// it.
    pub(crate) async fn stock_ready(&self, product_id: ProductId) -> Result<(), Error> {
        let product = self.product(product_id).await?;
        if !product.stock_loaded && self.modes.mode(product_id) == StockMode::Gate {
            self.load_stock(&product).await?;
        }
        Ok(())
    }

    async fn product(&self, product_id: ProductId) -> Result<Arc<Product>, Error> {
        self.product_at(product_id, self.clock.monotonic()).await
    }

    /// [`Self::product`] with the monotonic time already read.
    async fn product_at(
        &self,
        product_id: ProductId,
        now: Duration,
    ) -> Result<Arc<Product>, Error> {
        self.catalog
            .get(&self.ledger, self.clock.as_ref(), product_id, now)
            .await?
            .ok_or(Error::ProductNotFound)
    }

    /// First load of a product's stock into the gate. Only a product whose gate is not
    /// loaded may be loaded from the ledger's counters: one never loaded, or one whose
    /// ended sale was retired (its holds were of the retired generation, and nothing was
    /// in flight). A loaded product missing from the gate lost its state there and needs
    /// a rebuild from the facts.
    async fn load_stock(&self, product: &Product) -> Result<(), Error> {
        let reread;
        let product = if product.stock_loaded {
            // This instance's copy may be from before the ended sale was retired
            // (`after_sale.rs`), which marks the gate not loaded: the ledger decides.
            self.catalog.forget(product.product_id);
            reread = self.product(product.product_id).await?;
            &*reread
        } else {
            product
        };
        if product.stock_loaded {
            error!(product_id = %product.product_id, "stock missing from the stock gate after it was loaded");
            return Err(Error::Unavailable(
                format!(
                    "stock of product {} is missing from the stock gate",
                    product.product_id
                )
                .into(),
            ));
        }
        let counters = self
            .ledger
            .inventory(product.product_id)
            .await?
            .ok_or(Error::ProductNotFound)?;
        let generation = self
            .ledger
            .generation(product.product_id)
            .await?
            .ok_or(Error::ProductNotFound)?;
        match &self.reload {
            Some(reload) if generation != Generation::FIRST => {
                // Loaded by another attempt meanwhile when there is no plan: the retry
                // finds the entry (or the gate watch rebuilds it).
                if let Some(plan) = reload.ledger.reload_plan(product.product_id).await? {
                    reload.gate.rebuild(product.product_id, &plan).await?;
                    info!(product_id = %product.product_id, generation = %plan.generation,
                        "retired sale's stock loaded again");
                }
            }
            _ => {
                self.gate
                    .load(product.product_id, counters.available, generation)
                    .await?;
                self.ledger.mark_stock_loaded(product.product_id).await?;
            }
        }
        // The next attempt reads the product anew, `stock_loaded` now set (a copy made
        // here from the one read before could undo a change made since).
        self.catalog.forget(product.product_id);
        Ok(())
    }

    // ---- purchase -------------------------------------------------------------------

    pub async fn purchase(&self, request: PurchaseRequest) -> Result<Purchased, Error> {
        // Before the call: a lease is measured from a moment no later than the gate's answer
        // (read before the catalog, which may have to ask the ledger: earlier still, so
        // the lease is trusted a little less, never more). The same read tells the
        // catalog whether its entry is fresh.
        let sent = self.clock.monotonic();
        let product = self.product_at(request.product_id, sent).await?;
        if !product.window.is_open_at(self.clock.now()) {
            return Box::pin(self.replay_or(&request, Error::SaleNotActive)).await;
        }
        if product.paused {
            return Box::pin(self.replay_or(&request, Error::SalePaused)).await;
        }
        if self.modes.mode(request.product_id) == StockMode::Ledger {
            self.rate_limit(&request, sent)?;
            return Box::pin(self.sell_from_ledger(request, product, sent)).await;
        }
        self.through_gate(request, product, sent).await
    }

    /// Counts the attempt against its user's rate (when one is set).
    fn rate_limit(&self, request: &PurchaseRequest, now: Duration) -> Result<(), Error> {
        if let Some(limiter) = &self.user_rate {
            limiter
                .check(request.user_id.get(), now)
                .map_err(|l| Error::RateLimited {
                    retry_after: l.retry_after,
                })?;
        }
        Ok(())
    }

    /// A purchase of a product the gate serves: the sold-out board, the rate limit, then
    /// the gate's reservation and the ledger's commit.
    async fn through_gate(
        &self,
        request: PurchaseRequest,
        product: Arc<Product>,
        sent: Duration,
    ) -> Result<Purchased, Error> {
        // The gate's word on a refusal is trusted only while this instance knows the
        // modes well enough that the gate cannot be a stale copy of a product the
        // ledger sells (`modes.rs`, FOLLOW_FRESH_MAX).
        let vouched = self.modes.vouches(sent);
        let heard = match self
            .sold_out
            .check(request.product_id, &request.request_id, sent)
        {
            // The gate promised to grant no hold now, nothing revoked it, and this
            // request_id never held one: its answer, without asking (`sold_out.rs`).
            Check::Refuse if vouched => return Err(Error::SoldOut),
            Check::Refuse => self.sold_out.heard(request.product_id),
            Check::Ask(heard) => heard,
        };
        if !self.user_rate_at_gate {
            self.rate_limit(&request, sent)?;
        }
        // The rest on the heap: a flood is mostly the refusal above, and its future (and
        // the request's, which holds it) stays small without the reservation's and the
        // commit's state: 224 bytes instead of 1,224, and about 2 % less CPU.
        Box::pin(self.reserve_and_commit(request, product, sent, heard, vouched)).await
    }

    /// A purchase of a product in ledger mode: the ledger's conditional UPDATE decides
    /// and records it in one transaction. While the ledger's last "not enough stock" is
    /// fresh (`modes.rs`), a purchase is only looked up (a replay is answered with its
    /// record) instead of taking the product's row lock to be refused again.
    async fn sell_from_ledger(
        &self,
        request: PurchaseRequest,
        product: Arc<Product>,
        sent: Duration,
    ) -> Result<Purchased, Error> {
        let product_id = request.product_id;
        if self.modes.marked_sold_out(product_id, sent) {
            return self.replay_or(&request, Error::SoldOut).await;
        }
        let purchase = LedgerPurchase {
            request,
            terms: product.terms(self.settings.payment_timeout),
        };
        let committed = self.ledger.commit_ledger_purchase(&purchase).await;
        let request = purchase.request;
        match committed {
            Ok(Commit::Committed(order)) => {
                debug_assert_own(&request, &order);
                fail::fail_point!("purchase-after-commit");
                Ok(Purchased {
                    order,
                    replay: false,
                })
            }
            Ok(Commit::Duplicate(record)) => answer(&request, record),
            Ok(Commit::InsufficientStock) => {
                self.modes.mark_sold_out(product_id, sent);
                Err(Error::SoldOut)
            }
            Ok(Commit::LimitExceeded) => Err(Error::LimitExceeded),
            Ok(Commit::GateMode) => {
                // Given back to the gate since this instance last looked: go there.
                self.modes.set(product_id, StockMode::Gate);
                self.through_gate(request, product, self.clock.monotonic())
                    .await
            }
            Ok(Commit::Settling) => Err(Error::Unavailable(
                "the product is switching to ledger mode; retry".into(),
            )),
            Ok(Commit::StaleGeneration) => {
                // A stale generation is a gate hold's refusal; the ledger's own holds are
                // of its current generation, handed out in the same transaction.
                debug_assert!(false, "a ledger-mode purchase answered StaleGeneration");
                error!(request_id = %request.request_id, "the ledger answered a purchase without a gate hold as a stale hold");
                Err(Error::Unavailable(
                    "the ledger answered the purchase as a stale hold; retry".into(),
                ))
            }
            Err(e) => {
                warn!(request_id = %request.request_id, error = %e, "ledger purchase failed; outcome unknown until a retry");
                Err(e.into())
            }
        }
    }

    /// The purchase past the sold-out board: the gate's reservation, then the ledger.
    async fn reserve_and_commit(
        &self,
        request: PurchaseRequest,
        product: Arc<Product>,
        sent: Duration,
        heard: Heard,
        vouched: bool,
    ) -> Result<Purchased, Error> {
        let mut outcome = self.reserve(&request, &product, sent).await?;
        if outcome == Reserve::NotLoaded {
            self.load_stock(&product).await?;
            outcome = self.reserve(&request, &product, sent).await?;
        }
        match outcome {
            Reserve::Reserved { hold } => {
                // Crash tests stop here: units taken in Redis, nothing in MariaDB yet.
                fail::fail_point!("purchase-after-reserve");
                let held = self.held(request, hold, &product);
                self.commit(held, HoldOrigin::Fresh).await
            }
            Reserve::Existing(hold) => self.existing_hold(&request, &product, hold).await,
            Reserve::SoldOut { unseen, lease } => {
                if let Some(lease) = lease {
                    self.heard_lease(request.product_id, sent, heard, lease)
                        .await;
                }
                if unseen && vouched {
                    // The gate vouches the request_id never held units here: no replay
                    // to find.
                    Err(Error::SoldOut)
                } else {
                    self.replay_or(&request, Error::SoldOut).await
                }
            }
            Reserve::LimitExceeded { unseen } if unseen && vouched => Err(Error::LimitExceeded),
            Reserve::LimitExceeded { .. } => self.replay_or(&request, Error::LimitExceeded).await,
            Reserve::NotLoaded => Err(Error::Unavailable(
                format!("stock of product {} is not loaded", request.product_id).into(),
            )),
            Reserve::RateLimited { retry_after } => Err(Error::RateLimited { retry_after }),
            // The gate watch notices the new Redis process and rebuilds the entry.
            Reserve::NotRebuilt => {
                self.gate_behind();
                Err(Error::Unavailable(
                    format!(
                        "stock of product {} is being rebuilt after Redis changed; retry",
                        request.product_id
                    )
                    .into(),
                ))
            }
        }
    }

    /// The gate already holds this request_id: a retry, a concurrent duplicate, or another
    /// payload under the same id. Joins a commit in flight, answers a finished purchase,
    /// or completes the first attempt.
    async fn existing_hold(
        &self,
        request: &PurchaseRequest,
        product: &Product,
        hold: ExistingHold,
    ) -> Result<Purchased, Error> {
        if hold.user_id != request.user_id || hold.quantity != request.quantity {
            // Another payload holds this request_id in Redis. The ledger decides:
            // after a lost or expired record a misused request_id can take a hold
            // first, while the ledger still holds this request's order.
            return match self.ledger.find_purchase(&request.request_id).await? {
                Some(record) => answer(request, record),
                None => Err(Error::RequestIdConflict),
            };
        }
        // A concurrent duplicate whose first attempt is committing here joins that
        // commit: the ledger read below would find nothing yet, and the commit that
        // follows it would join the same commit anyway. At 64 buyers in flight those
        // reads were about a third of MariaDB's prepared statements.
        if !hold.released {
            let joined = self
                .ledger
                .join_commit(&self.held(request.clone(), hold.hold, product))
                .await;
            if let Some(committed) = joined {
                return self
                    .committed(request, hold.hold, HoldOrigin::Earlier, committed)
                    .await;
            }
        }
        // Most other replays are of finished purchases: one read answers them.
        if let Some(record) = self.ledger.find_purchase(&request.request_id).await? {
            if !hold.released && !record.is_hold(request.product_id, hold.hold) {
                // An orphan left by an earlier attempt whose release failed.
                self.release_orphan(request, hold.hold).await;
            }
            return answer(request, record);
        }
        if hold.released {
            error!(request_id = %request.request_id, "hold released but the ledger has no record of the request");
            return Err(Error::Unavailable(
                "the outcome of this request is not known yet".into(),
            ));
        }
        // The first attempt is still in flight, or died before its commit:
        // complete it. The ledger's unique key lets exactly one commit win.
        let held = self.held(request.clone(), hold.hold, product);
        self.commit(held, HoldOrigin::Earlier).await
    }

    /// The gate's reservation. A gate that does not answer marks the product as bought
    /// while the gate is unreachable: the fallback worker switches it to ledger mode if
    /// that lasts (`fallback.rs`).
    async fn reserve(
        &self,
        request: &PurchaseRequest,
        product: &Product,
        sent: Duration,
    ) -> Result<Reserve, Error> {
        match self.gate.reserve(request, product.per_user_limit).await {
            Ok(outcome) => Ok(outcome),
            Err(e) => {
                if matches!(e.kind(), ErrorKind::Unreachable | ErrorKind::TimedOut) {
                    self.modes.unreached(request.product_id, sent);
                }
                Err(e.into())
            }
        }
    }

    /// The gate granted a sold-out lease: note it, and take the product's holders if
    /// this instance has no complete list of them yet. Pending index first, then the
    /// ledger (`sold_out.rs` says why that order misses no holder). Failures only leave
    /// this instance asking the gate, as without a lease.
    async fn heard_lease(
        &self,
        product_id: ProductId,
        sent: Duration,
        heard: Heard,
        lease: SoldOutLease,
    ) {
        let Some(snapshot) = self.sold_out.leased(product_id, sent, heard, lease) else {
            return;
        };
        let taking = Taking::new(&self.sold_out, snapshot);
        let pending = match self.gate.pending_request_ids(product_id, HOLDERS_MAX).await {
            // Holds of another generation than the lease's: not the state it promised on.
            Ok(Some((generation, _))) if generation != lease.generation => {
                return taking.done(Err(()));
            }
            Ok(pending) => pending.map(|(_, ids)| ids),
            Err(e) => {
                warn!(%product_id, error = %e, "pending holds unreadable; sold-out answers keep asking the gate");
                return taking.done(Err(()));
            }
        };
        let recorded = match self
            .ledger
            .reservation_request_ids(product_id, HOLDERS_MAX)
            .await
        {
            Ok(recorded) => recorded,
            Err(e) => {
                warn!(%product_id, error = %e, "reservations unreadable; sold-out answers keep asking the gate");
                return taking.done(Err(()));
            }
        };
        let holders = match (pending, recorded) {
            (Some(pending), Some(recorded)) if pending.len() + recorded.len() <= HOLDERS_MAX => {
                Some(pending.into_iter().chain(recorded).collect())
            }
            _ => None,
        };
        // Debug detail: a sale whose cancelled units sell again takes a lease per unit.
        debug!(%product_id, holders = holders.as_ref().map(std::collections::HashSet::len),
            "sold out: this instance answers outsiders itself while the gate's lease lasts");
        taking.done(Ok(holders));
    }

    /// The gate refused without taking anything. A request accepted long ago (its hold
    /// record outlived) may be replayed now: the ledger's record answers it; otherwise
    /// the refusal stands. Never a false refusal: if the ledger can't be asked, 503.
    async fn replay_or(
        &self,
        request: &PurchaseRequest,
        refusal: Error,
    ) -> Result<Purchased, Error> {
        match self.ledger.find_purchase(&request.request_id).await? {
            Some(record) => answer(request, record),
            None => Err(refusal),
        }
    }

    /// `request` with the hold the gate gave it, to commit on `product`'s terms.
    fn held(&self, request: PurchaseRequest, hold: HoldRef, product: &Product) -> HeldPurchase {
        HeldPurchase {
            request,
            hold,
            terms: product.terms(self.settings.payment_timeout),
        }
    }

    /// Writes the order for a hold.
    async fn commit(&self, held: HeldPurchase, origin: HoldOrigin) -> Result<Purchased, Error> {
        let committed = self.ledger.commit_purchase(&held).await;
        self.committed(&held.request, held.hold, origin, committed)
            .await
    }

    /// The answer to a purchase from its hold's commit, `committed`: the order, or the
    /// refusal with the hold given back where the ledger will never count it.
    async fn committed(
        &self,
        request: &PurchaseRequest,
        hold: HoldRef,
        origin: HoldOrigin,
        committed: Result<Commit, LedgerError>,
    ) -> Result<Purchased, Error> {
        match committed {
            Ok(Commit::Committed(order)) => {
                debug_assert_own(request, &order);
                self.accounted_for(request, hold);
                // Crash tests stop here: committed, the client not answered yet.
                fail::fail_point!("purchase-after-commit");
                Ok(Purchased {
                    order,
                    replay: origin == HoldOrigin::Earlier,
                })
            }
            Ok(Commit::Duplicate(record)) => {
                if record.is_hold(request.product_id, hold) {
                    // A concurrent replay completed this very hold first: it is this
                    // attempt's order.
                    self.accounted_for(request, hold);
                    return answer_as(request, record, origin == HoldOrigin::Earlier);
                }
                if origin == HoldOrigin::Fresh {
                    // The request_id was taken in the ledger by another hold (this
                    // request's earlier hold record expired, or the id was used on
                    // another product): this hold can never become an order. Give it
                    // back.
                    self.release_orphan(request, hold).await;
                }
                answer(request, record)
            }
            Ok(Commit::InsufficientStock) => self.refused_by_ledger(request, hold, false).await,
            Ok(Commit::LimitExceeded) => self.refused_by_ledger(request, hold, true).await,
            Ok(Commit::StaleGeneration) => {
                // The gate lost the state this hold was taken in and is being (or was)
                // rebuilt from the ledger's facts without it: the hold is void. A retry
                // reserves afresh in the current generation.
                warn!(request_id = %request.request_id, generation = %hold.generation, "hold from a lost stock generation refused");
                self.gate_behind();
                Err(Error::Unavailable(
                    "stock state is being rebuilt; retry".into(),
                ))
            }
            Ok(refused @ (Commit::GateMode | Commit::Settling)) => {
                // Only a purchase without a gate hold is answered so; a gate hold's commit
                // never is. Nothing was written: the hold stays for a retry or recovery.
                debug_assert!(false, "a gate hold's commit answered {refused:?}");
                error!(request_id = %request.request_id, "the ledger answered a gate hold's commit as one without a hold");
                Err(Error::Unavailable(
                    "the ledger answered the purchase as one without a gate hold; retry".into(),
                ))
            }
            Err(e) => {
                // Outcome unknown or not committed: leave the hold where it is. A retry
                // completes it; recovery fences and releases it if nobody does.
                warn!(request_id = %request.request_id, error = %e, "purchase commit failed; hold kept for retry or recovery");
                Err(e.into())
            }
        }
    }

    /// The ledger refused a hold the gate granted (the stock, or the per-user limit when
    /// `limit`): the stores disagree. The hold is fenced and its units go back, unless
    /// the request_id has a record meanwhile, which is then the answer.
    async fn refused_by_ledger(
        &self,
        request: &PurchaseRequest,
        hold: HoldRef,
        limit: bool,
    ) -> Result<Purchased, Error> {
        let (reason, error) = if limit {
            (ReleaseReason::LimitExceeded, Error::LimitExceeded)
        } else {
            (ReleaseReason::SoldOut, Error::SoldOut)
        };
        warn!(request_id = %request.request_id, product_id = %request.product_id,
            %reason, "ledger refused a hold the gate granted: gate and ledger disagree");
        match self.ledger.fence(request, hold, reason).await? {
            Fence::Fenced => {
                // The ledger never counted a fenced hold: its own generation decides.
                let of = ReleaseOf::Hold { hold };
                self.return_stock(request.product_id, &request.request_id, &of)
                    .await;
                Err(error)
            }
            Fence::Duplicate(record) => answer(request, record),
        }
    }

    /// The ledger holds the order of this hold: recovery need not look at it again.
    fn accounted_for(&self, request: &PurchaseRequest, hold: HoldRef) {
        self.gate.committed(
            request.product_id,
            StaleHold {
                request: request.clone(),
                hold,
                released: false,
            },
        );
    }

    /// Returns the units of a hold that can never become an order; no ledger write is
    /// needed because the request_id is already taken there by another record.
    async fn release_orphan(&self, request: &PurchaseRequest, hold: HoldRef) {
        let of = ReleaseOf::Hold { hold };
        match self
            .gate
            .release(request.product_id, &request.request_id, &of)
            .await
        {
            Ok(Release::Released | Release::AlreadyReleased) => {}
            Ok(outcome) => {
                error!(request_id = %request.request_id, ?outcome, "could not release an orphan hold")
            }
            Err(e) => {
                warn!(request_id = %request.request_id, error = %e, "orphan hold left for recovery")
            }
        }
    }

    /// After the ledger recorded a reservation as RELEASED: gives its units back to the
    /// gate (once, whatever retries happen) and records that. A failure leaves the return
    /// pending in the ledger, where a retry of the same call or recovery finds it.
    async fn return_stock(&self, product_id: ProductId, request_id: &RequestId, of: &ReleaseOf) {
        give_back(
            self.gate.as_ref(),
            self.ledger.as_ref(),
            product_id,
            request_id,
            of,
        )
        .await;
    }

    // ---- orders ---------------------------------------------------------------------

    pub async fn order(&self, order_id: OrderId) -> Result<Order, Error> {
        self.ledger
            .order(order_id)
            .await?
            .ok_or(Error::OrderNotFound)
    }

    pub async fn purchase_record(&self, request_id: &RequestId) -> Result<Order, Error> {
        match self.ledger.find_purchase(request_id).await? {
            Some(PurchaseRecord {
                outcome: PurchaseOutcome::Order(order),
                ..
            }) => Ok(order),
            _ => Err(Error::OrderNotFound),
        }
    }

    pub async fn pay(&self, order_id: OrderId, user_id: UserId) -> Result<Order, Error> {
        let attempt = self
            .ledger
            .pay(order_id, user_id)
            .await?
            .ok_or(Error::OrderNotFound)?;
        if attempt.applied {
            // The ledger moved it PENDING_PAYMENT → PAID in this very call.
            debug_assert_eq!(
                attempt.order.status,
                OrderStatus::Paid,
                "an applied payment"
            );
            debug!(%order_id, "order paid");
            return Ok(attempt.order);
        }
        match attempt.order.status.pay() {
            Ok(Transition::Unchanged) => Ok(attempt.order),
            Ok(Transition::To(_)) if attempt.expired => Err(Error::OrderExpired),
            Ok(Transition::To(_)) => Err(Error::Unavailable(
                "order changed concurrently; retry".into(),
            )),
            // Cancelled by the expiry worker: the payment came too late.
            Err(_) if attempt.order.cancel_reason == Some(CancelReason::PaymentTimeout) => {
                Err(Error::OrderExpired)
            }
            Err(_) => Err(Error::OrderNotPayable),
        }
    }

    pub async fn cancel(&self, order_id: OrderId, user_id: UserId) -> Result<Order, Error> {
        let attempt = self
            .ledger
            .cancel(order_id, user_id, CancelReason::UserCancelled)
            .await?
            .ok_or(Error::OrderNotFound)?;
        if !attempt.applied {
            match attempt.order.status.cancel() {
                Ok(Transition::Unchanged) => {}
                Ok(Transition::To(_)) => {
                    return Err(Error::Unavailable(
                        "order changed concurrently; retry".into(),
                    ))
                }
                Err(_) => return Err(Error::OrderNotCancellable),
            }
        } else {
            debug!(%order_id, "order cancelled");
            self.modes.lift_sold_out(attempt.order.product_id);
        }
        debug_assert_eq!(attempt.order.status, OrderStatus::Cancelled);
        if let Some(of) = attempt.pending_return {
            self.return_stock(attempt.order.product_id, &attempt.order.request_id, &of)
                .await;
        }
        Ok(attempt.order)
    }

    /// After the ledger refunded `order`: the units put back on sale (`restocked`) end
    /// this instance's sold-out mark, and the gate's part still owed is done now (or by
    /// the workers, which find it pending in the ledger).
    pub(crate) async fn refunded(
        &self,
        order: &Order,
        restocked: bool,
        pending_return: Option<ReleaseOf>,
    ) {
        if restocked {
            self.modes.lift_sold_out(order.product_id);
        }
        if let Some(of) = pending_return {
            self.return_stock(order.product_id, &order.request_id, &of)
                .await;
        }
    }
}

/// What became of an attempt to give a released reservation's units back to the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GiveBack {
    /// The units are back (now or before) and the ledger knows.
    Done,
    /// Could not be done now (gate or ledger unreachable); the ledger still lists it.
    Later,
    /// The gate has no hold record (or no stock entry) to release: nothing was returned
    /// and no retry can do it; reconciliation must account for the units.
    Impossible,
}

/// Gives a RELEASED reservation's units back to the gate, at most once (the gate's hold
/// record flips state in the same script that adds the units), then records it.
pub(crate) async fn give_back(
    gate: &dyn StockGate,
    ledger: &dyn Ledger,
    product_id: ProductId,
    request_id: &RequestId,
    of: &ReleaseOf,
) -> GiveBack {
    match gate.release(product_id, request_id, of).await {
        Ok(Release::Released | Release::AlreadyReleased) => {
            match ledger.mark_stock_returned(request_id).await {
                Ok(()) => GiveBack::Done,
                Err(e) => {
                    warn!(%request_id, error = %e, "stock returned; recording it failed (retried later, harmless)");
                    GiveBack::Later
                }
            }
        }
        Ok(Release::NotLoaded) => {
            // No stock entry, or not yet rebuilt to the release's generation.
            warn!(%request_id, %product_id, "stock return pending: gate not (re)built yet");
            GiveBack::Later
        }
        Ok(Release::Missing) => {
            error!(%request_id, %product_id, "stock return impossible: the gate has no hold to release");
            GiveBack::Impossible
        }
        Err(e) => {
            warn!(%request_id, error = %e, "stock return pending: gate unavailable");
            GiveBack::Later
        }
    }
}

/// Answers a request from what the ledger holds for its request_id.
fn answer(request: &PurchaseRequest, record: PurchaseRecord) -> Result<Purchased, Error> {
    answer_as(request, record, true)
}

fn answer_as(
    request: &PurchaseRequest,
    record: PurchaseRecord,
    replay: bool,
) -> Result<Purchased, Error> {
    if !record.request.same_payload(request) {
        return Err(Error::RequestIdConflict);
    }
    match record.outcome {
        PurchaseOutcome::Order(order) => Ok(Purchased { order, replay }),
        PurchaseOutcome::Released {
            reason: ReleaseReason::SoldOut,
        } => Err(Error::SoldOut),
        PurchaseOutcome::Released {
            reason: ReleaseReason::LimitExceeded,
        } => Err(Error::LimitExceeded),
        PurchaseOutcome::Released { .. } => Err(Error::RequestReleased),
    }
}

/// A ledger answers a commit with the order it wrote for this very request: the same
/// key and buyer. Checked in debug builds only (the simulator's planted
/// `aside-from-batch` defect trips it).
fn debug_assert_own(request: &PurchaseRequest, order: &Order) {
    debug_assert!(
        order.request_id == request.request_id && order.user_id == request.user_id,
        "the ledger answers a commit with the order it wrote for this request"
    );
}
