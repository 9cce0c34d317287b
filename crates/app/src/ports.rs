//! The ports: what the use cases need from the outside world, and nothing more.
//!
//! Every method is idempotent, so a caller that lost a reply may call again. An `Err`
//! means "could not be done, or the outcome is unknown" (its [`ErrorKind`] says what
//! happened); the use cases answer it with `unavailable` (503) and the client retries
//! with the same request_id.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use flashsale_core::{
    AdminName, CancelReason, Generation, HoldId, HoldRef, InventoryCounters, NewProduct, OrderId,
    ProductId, PurchaseRequest, Quantity, ReleaseReason, RequestId, StockMode, Terms, UserId,
};

use crate::model::{AdminAction, Order, Product, PurchaseRecord};

/// What went wrong in a call to a store, as far as the adapter can tell. To a client every
/// kind is the same answer (`unavailable`, 503: retry with the same request_id); logs and
/// metrics (`store_errors{store,kind}`) tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// Could not connect, or the connection failed (refused, reset, closed, not
    /// connected): a call sent before it broke may have run, so the outcome is unknown.
    Unreachable,
    /// No answer within the deadline: the call may have run (outcome unknown).
    TimedOut,
    /// The store answered with an error of its own — a script error, out of memory under
    /// `noeviction`, a read-only replica, a failed statement or migration, a message the
    /// broker refused. What was asked was not done (a Lua script keeps the writes it
    /// made before its error).
    Rejected,
    /// Lock conflicts outlasted the retries: deadlocks or lock waits past the bounded
    /// attempts, a request_id kept taken by transactions that rolled back. Nothing was
    /// committed.
    Contention,
    /// The store's state can't answer this now and is being repaired: the gate has no
    /// entry for the product, or one another Redis process wrote; a hold handed out twice
    /// (the gate lost writes; it is being rebuilt). Retry later.
    NotReady,
    /// A reply that does not parse, or a stored value no write of ours could have
    /// produced (out of range, a missing row, an unparsable id).
    Corrupt,
    /// An answer larger than the adapter's bound on it, or a request larger than the
    /// store takes (a message over the broker's `max_payload` or its stream's largest
    /// message): the same request is refused again.
    TooLarge,
    /// The adapter's own worker that carries the call (a batcher, the group committer)
    /// stopped or dropped it: the outcome is unknown.
    Stopped,
    /// The adapter's configuration is invalid (a URL, a database name).
    Config,
}

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [ErrorKind; 9] = [
        Self::Unreachable,
        Self::TimedOut,
        Self::Rejected,
        Self::Contention,
        Self::NotReady,
        Self::Corrupt,
        Self::TooLarge,
        Self::Stopped,
        Self::Config,
    ];

    /// The kind as logs and the metrics' `kind` label name it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Unreachable => "unreachable",
            Self::TimedOut => "timed_out",
            Self::Rejected => "rejected",
            Self::Contention => "contention",
            Self::NotReady => "not_ready",
            Self::Corrupt => "corrupt",
            Self::TooLarge => "too_large",
            Self::Stopped => "stopped",
            Self::Config => "config",
        }
    }

    /// Whether the store refused this very request, so that sending it again alike would
    /// be refused again: a statement it rejects (a CHECK, a value out of range), a value
    /// no write of ours makes, a request larger than it takes. The other kinds say the
    /// store was out of reach, slow, busy, being repaired or misconfigured: a later try
    /// may pass. The statistics consumer gives up on a message only after refusals
    /// (`crate::consume`).
    pub const fn is_refusal(self) -> bool {
        matches!(self, Self::Rejected | Self::Corrupt | Self::TooLarge)
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An underlying error a port error keeps as its [`cause`](LedgerError::cause), shared so
/// the port error stays `Clone` (a group commit answers every purchase of a batch with one
/// error).
pub type Source = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// What every port error is built from: a kind, a detail for the logs, the underlying
/// error if there is one. Generic code (the simulator's fault injector, timeouts around
/// any port) builds port errors through it.
pub trait PortError: std::error::Error + Clone + Send + Sync + 'static {
    /// The store this port's adapter talks to, as the metrics' `store` label names it.
    const STORE: &'static str;

    fn new(kind: ErrorKind, detail: impl Into<String>) -> Self;

    /// `detail`, followed by the underlying error's text. The underlying error itself is
    /// kept as the error's `cause`, not its `source`: its text is already in the message,
    /// and a report that walks the source chain would say it twice.
    fn caused(
        kind: ErrorKind,
        detail: impl std::fmt::Display,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self;

    fn kind(&self) -> ErrorKind;
}

/// Declares a port error: a kind, a detail, an optional cause; a constructor per kind
/// so call sites stay short.
macro_rules! port_error {
    ($(#[$doc:meta])* $name:ident, $prefix:literal, $store:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $name {
            kind: ErrorKind,
            detail: String,
            cause: Option<Source>,
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}: {}: {}", $prefix, self.kind, self.detail)
            }
        }

        // No `source`: a caused error's message already ends with its cause's text
        // (`cause` hands out the error itself).
        impl std::error::Error for $name {}

        impl PortError for $name {
            const STORE: &'static str = $store;

            fn new(kind: ErrorKind, detail: impl Into<String>) -> Self {
                Self {
                    kind,
                    detail: detail.into(),
                    cause: None,
                }
            }

            fn caused(
                kind: ErrorKind,
                detail: impl std::fmt::Display,
                source: impl std::error::Error + Send + Sync + 'static,
            ) -> Self {
                Self {
                    kind,
                    detail: format!("{detail}: {source}"),
                    cause: Some(std::sync::Arc::new(source)),
                }
            }

            fn kind(&self) -> ErrorKind {
                self.kind
            }
        }

        impl $name {
            pub fn new(kind: ErrorKind, detail: impl Into<String>) -> Self {
                <Self as PortError>::new(kind, detail)
            }

            /// See [`PortError::caused`].
            pub fn caused(
                kind: ErrorKind,
                detail: impl std::fmt::Display,
                source: impl std::error::Error + Send + Sync + 'static,
            ) -> Self {
                <Self as PortError>::caused(kind, detail, source)
            }

            pub fn kind(&self) -> ErrorKind {
                self.kind
            }

            /// What happened, without the store's name and the kind.
            pub fn detail(&self) -> &str {
                &self.detail
            }

            /// The underlying error of an error built by [`PortError::caused`], as it was
            /// (downcast it to its type).
            pub fn cause(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
                self.cause.as_deref()
            }

            /// [`ErrorKind::Unreachable`].
            pub fn unreachable(detail: impl Into<String>) -> Self {
                Self::new(ErrorKind::Unreachable, detail)
            }

            /// [`ErrorKind::TimedOut`].
            pub fn timed_out(detail: impl Into<String>) -> Self {
                Self::new(ErrorKind::TimedOut, detail)
            }

            /// [`ErrorKind::Rejected`].
            pub fn rejected(detail: impl Into<String>) -> Self {
                Self::new(ErrorKind::Rejected, detail)
            }

            /// [`ErrorKind::Contention`].
            pub fn contention(detail: impl Into<String>) -> Self {
                Self::new(ErrorKind::Contention, detail)
            }

            /// [`ErrorKind::NotReady`].
            pub fn not_ready(detail: impl Into<String>) -> Self {
                Self::new(ErrorKind::NotReady, detail)
            }

            /// [`ErrorKind::Corrupt`].
            pub fn corrupt(detail: impl Into<String>) -> Self {
                Self::new(ErrorKind::Corrupt, detail)
            }

            /// [`ErrorKind::TooLarge`].
            pub fn too_large(detail: impl Into<String>) -> Self {
                Self::new(ErrorKind::TooLarge, detail)
            }

            /// [`ErrorKind::Stopped`].
            pub fn stopped(detail: impl Into<String>) -> Self {
                Self::new(ErrorKind::Stopped, detail)
            }

            /// [`ErrorKind::Config`].
            pub fn config(detail: impl Into<String>) -> Self {
                Self::new(ErrorKind::Config, detail)
            }
        }
    };
}

port_error!(
    /// A stock gate call failed, or its outcome is unknown ([`ErrorKind`] says which).
    GateError,
    "stock gate",
    "redis"
);

port_error!(
    /// A ledger call failed, or its outcome (a commit's) is unknown ([`ErrorKind`] says
    /// which).
    LedgerError,
    "ledger",
    "mariadb"
);

port_error!(
    /// The event broker could not be reached, refused a message, or did not confirm it
    /// in time ([`ErrorKind`] says which). The event stays unsent in the outbox and is
    /// published again later.
    BusError,
    "event bus",
    "nats"
);

/// The fast, shared counter of available stock (Redis). It admits or refuses each
/// purchase atomically and keeps a trace of every unit it hands out.
#[async_trait]
pub trait StockGate: Send + Sync + 'static {
    async fn ping(&self) -> Result<(), GateError>;

    /// Sets the product's available count (in the given stock generation) unless the
    /// gate already has one (warm-up); returns whether it set it.
    async fn load(
        &self,
        product_id: ProductId,
        available: i64,
        generation: Generation,
    ) -> Result<bool, GateError>;

    /// The ledger accounts for this hold now (its order committed): the gate may drop it
    /// from its index of pending holds early, rather than when recovery gets to it. Best
    /// effort and never waits; a hold left there is trimmed by recovery as before.
    fn committed(&self, _product_id: ProductId, _hold: StaleHold) {}

    /// Checks stock and the per-user limit and takes the units, atomically, recording a
    /// hold under (product, request_id). Idempotent on request_id: a second call finds
    /// the hold and reports it instead of taking stock again.
    async fn reserve(
        &self,
        request: &PurchaseRequest,
        per_user_limit: Option<u32>,
    ) -> Result<Reserve, GateError>;

    /// Gives a hold's units back, once: a repeated or concurrent call returns nothing more.
    async fn release(
        &self,
        product_id: ProductId,
        request_id: &RequestId,
        of: &ReleaseOf,
    ) -> Result<Release, GateError>;

    /// Adds units once per restock id, if the gate is still in the stock generation the
    /// restock was recorded in.
    async fn restock(&self, change: &StockChange) -> Result<Restock, GateError>;

    /// Takes `quantity` available units off sale once per destock id, only if that many
    /// are available and the gate is in the stock generation the destock was recorded
    /// in; a retry in that generation answers what the first call did.
    async fn destock(&self, change: &StockChange) -> Result<Destock, GateError>;

    /// The live available count; None when the gate holds nothing for the product.
    async fn available(&self, product_id: ProductId) -> Result<Option<i64>, GateError>;

    /// The request_ids of the product's holds the ledger may not account for yet (its
    /// index of pending holds) and the stock generation they belong to, at most `max`;
    /// None when there are more. A hold leaves the index only after the ledger records
    /// its request_id (an order or a fence). An error when the gate can't vouch that it
    /// lost none (another Redis process wrote the entry, or keys may be evicted).
    async fn pending_request_ids(
        &self,
        product_id: ProductId,
        max: usize,
    ) -> Result<Option<(Generation, Vec<RequestId>)>, GateError>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserve {
    /// Units taken, by this hold.
    Reserved { hold: HoldRef },
    /// Too few units. `unseen`: the gate vouches that this request_id never held units
    /// of the product (no record of it, and none can have been lost or expired), so it
    /// is not a replay of an accepted purchase and the ledger need not be asked.
    /// `lease`: the product is sold out and the gate promises to grant no hold of it for
    /// a while (see [`SoldOutLease`]).
    SoldOut {
        unseen: bool,
        lease: Option<SoldOutLease>,
    },
    /// The user's units would pass the per-user limit; `unseen` as for `SoldOut`.
    LimitExceeded { unseen: bool },
    /// The gate has no stock entry for the product.
    NotLoaded,
    /// The gate's entry was written by another Redis process (a restart from a snapshot,
    /// a promoted replica): it may be behind, so nothing is answered until the entry is
    /// rebuilt from the ledger.
    NotRebuilt,
    /// Over the user's rate, which the gate keeps for every instance at once: retry after
    /// `retry_after`. Nothing was taken.
    RateLimited { retry_after: Duration },
    /// A hold already exists for this request_id (a replay, or a concurrent duplicate).
    Existing(ExistingHold),
}

/// The gate's promise, made when it found a product with no unit left: it grants no
/// hold of the product for `remaining` from the moment it answered, unless units come
/// back first — then the gate ends the lease and publishes a revocation (see
/// [`LeaseListener`]). The product's holds, at the time of the answer, number
/// `holds` in stock generation `generation` (hold ids count up per generation), so
/// while a later answer reports the same pair no hold was granted in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SoldOutLease {
    pub remaining: Duration,
    pub generation: Generation,
    pub holds: i64,
}

/// What an instance hears of sold-out leases ended early. Every gate step that adds
/// units to a product ends the product's lease and publishes a revocation; the gate
/// adapter's subscriber reports here when it is listening (subscribed: every later
/// revocation will be heard), when it is deaf (not subscribed, or the subscription was
/// lost: revocations may be missed), and each revocation (`None` when its product can't
/// be read).
pub trait LeaseListener: Send + Sync + 'static {
    fn listening(&self);
    fn deaf(&self);
    fn revoked(&self, product_id: Option<ProductId>);
    /// A product's definition changed in the ledger (an operator's pause, say:
    /// `control.rs`), announced on the same subscription; `None` when the announcement's
    /// product can't be read.
    fn changed(&self, product_id: Option<ProductId>);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExistingHold {
    pub hold: HoldRef,
    pub user_id: UserId,
    pub quantity: Quantity,
    pub released: bool,
}

/// Whose units a release gives back, which decides whether the gate's current
/// generation still counts them as taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOf {
    /// A hold the ledger never counted (an orphan, or a fenced hold): it took units in
    /// the generation it was taken in, so it gives them back only if the gate is still
    /// in that generation. A hold is named by that generation and its id: the record
    /// under its request_id may be another hold's by now, which this release leaves
    /// alone.
    Hold { hold: HoldRef },
    /// A reservation the ledger counted as live, released (cancelled, expired) in
    /// `generation`: a rebuild after that generation already counted the units as
    /// available; the gate gives them back only in that very generation.
    Reservation {
        generation: Generation,
        /// The gate hold the reservation accounts for (taken in its own generation).
        hold: HoldRef,
        user_id: UserId,
        quantity: Quantity,
        /// Whether the product has a per-user limit (the gate keeps per-user counts).
        limited: bool,
        /// Whether the units go back on sale: false for a refund that withdrew them from
        /// stock, whose release only forgets the hold and the buyer's count of it.
        returns_units: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    Released,
    AlreadyReleased,
    /// No hold is recorded (it outlived its retention, or the gate lost it): nothing was
    /// returned, and the caller must leave the return pending for reconciliation.
    Missing,
    /// The gate has no stock entry for the product, or is behind the release's
    /// generation (not rebuilt yet); nothing was changed, retry later.
    NotLoaded,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restock {
    Applied,
    AlreadyApplied,
    /// The gate has no stock entry for the product, or is still in an older generation
    /// than the restock's (the rebuild that counts it has not landed); retry later.
    NotLoaded,
    /// The gate was rebuilt since the restock was recorded; the rebuild counted it.
    Stale,
}

/// What the gate did with a destock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destock {
    /// The units are off sale in the gate.
    Taken,
    /// Fewer units were available: nothing was taken.
    Refused,
    /// The gate has no stock entry for the product, one another Redis process wrote, or
    /// one still in an older generation than the destock's; nothing changed, retry later.
    NotLoaded,
    /// The gate was rebuilt since the destock was recorded, from counters that do not
    /// take it off: the destock is to be recorded in the new generation and taken again.
    Stale,
}

/// The durable record of products, orders and reservations (MariaDB): the business facts
/// everything else is rebuilt from.
#[async_trait]
pub trait Ledger: Send + Sync + 'static {
    async fn ping(&self) -> Result<(), LedgerError>;

    /// Creates the product with its inventory, and the operator's log line naming `by`,
    /// in one transaction.
    async fn create_product(
        &self,
        product: &NewProduct,
        by: &AdminName,
    ) -> Result<CreateProduct, LedgerError>;

    async fn product(&self, product_id: ProductId) -> Result<Option<Product>, LedgerError>;

    async fn mark_stock_loaded(&self, product_id: ProductId) -> Result<(), LedgerError>;

    /// The product's current stock generation.
    async fn generation(&self, product_id: ProductId) -> Result<Option<Generation>, LedgerError>;

    async fn inventory(
        &self,
        product_id: ProductId,
    ) -> Result<Option<InventoryCounters>, LedgerError>;

    /// In one transaction: the reservation (PROCESSING), the order (PENDING_PAYMENT,
    /// expiring the terms' payment timeout after the database's now), the reserve log
    /// row, and the counters — unless the request_id is already taken, the ledger's own
    /// counters say there is not enough stock, or the hold's stock generation is no
    /// longer current.
    async fn commit_purchase(&self, purchase: &HeldPurchase) -> Result<Commit, LedgerError>;

    /// The answer of this very hold's commit when this process is committing it now (a
    /// concurrent duplicate of the purchase): what [`Ledger::commit_purchase`] would
    /// answer a second caller, which joins the commit in flight, so
    /// [`Commit::Duplicate`] with the record once it committed. None when no commit of
    /// the hold is in flight here (none began, it ended, or this ledger keeps none in
    /// flight): the caller then reads [`Ledger::find_purchase`]. A replay that finds its
    /// hold in the gate asks this first, and skips the read its first attempt's commit is
    /// about to answer anyway.
    async fn join_commit(&self, purchase: &HeldPurchase) -> Option<Result<Commit, LedgerError>> {
        let _ = purchase;
        None
    }

    /// A purchase with no gate hold, for a product in ledger mode, in one transaction:
    /// the counters' conditional UPDATE (enough units available, the product in ledger
    /// mode) hands out the hold id (one above the last the ledger handed out in the
    /// current generation), then the same rows as [`Ledger::commit_purchase`] writes for
    /// that (generation, hold id), the per-user limit checked as there. Idempotent on
    /// request_id: a replay is answered [`Commit::Duplicate`] with the record. A product
    /// in gate mode is answered [`Commit::GateMode`] (the caller goes to the gate), one
    /// that entered ledger mode less than [`crate::modes::LEDGER_SALES_AFTER_SWITCH`] ago
    /// (on the database's clock) [`Commit::Settling`].
    async fn commit_ledger_purchase(
        &self,
        purchase: &LedgerPurchase,
    ) -> Result<Commit, LedgerError>;

    /// Takes the request_id with a RELEASED reservation and no order, so no attempt can
    /// ever commit an order for it; afterwards its hold may be returned to the gate.
    async fn fence(
        &self,
        request: &PurchaseRequest,
        hold: HoldRef,
        reason: ReleaseReason,
    ) -> Result<Fence, LedgerError>;

    async fn find_purchase(
        &self,
        request_id: &RequestId,
    ) -> Result<Option<PurchaseRecord>, LedgerError>;

    async fn order(&self, order_id: OrderId) -> Result<Option<Order>, LedgerError>;

    /// PENDING_PAYMENT → PAID (and the reservation → CONFIRMED) if not expired on the
    /// database's clock. None when no such order belongs to this user.
    async fn pay(
        &self,
        order_id: OrderId,
        user_id: UserId,
    ) -> Result<Option<PayAttempt>, LedgerError>;

    /// PENDING_PAYMENT → CANCELLED (and the reservation → RELEASED with its stock return
    /// pending). None when no such order belongs to this user.
    async fn cancel(
        &self,
        order_id: OrderId,
        user_id: UserId,
        reason: CancelReason,
    ) -> Result<Option<CancelAttempt>, LedgerError>;

    /// Records that a released reservation's units are back in the gate.
    async fn mark_stock_returned(&self, request_id: &RequestId) -> Result<(), LedgerError>;

    /// Records a restock of `quantity` units (counters, stock log and the operator's log
    /// line naming the admin) once per the action's request_id; an id the operator's log
    /// holds for another action is a conflict.
    async fn record_restock(
        &self,
        action: &AdminAction,
        quantity: i64,
    ) -> Result<RecordRestock, LedgerError>;

    async fn mark_restock_applied(&self, restock_id: &RequestId) -> Result<(), LedgerError>;

    /// The request_ids of every reservation of the product (any state, any generation:
    /// orders and fences), at most `max`; None when there are more.
    async fn reservation_request_ids(
        &self,
        product_id: ProductId,
        max: usize,
    ) -> Result<Option<Vec<RequestId>>, LedgerError>;
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateProduct {
    Created(Product),
    /// The product id is taken; the stored product and its total stock.
    Exists(Product, i64),
}

/// The ports of both stores and the clock, as the maintenance and fallback use cases
/// take them: the binary fills it with its Redis and MariaDB adapters, the simulator
/// with its in-memory stores behind fault injection.
#[derive(Clone)]
pub struct Ports {
    pub gate: Arc<dyn StockGate>,
    pub gate_m: Arc<dyn GateMaintenance>,
    pub ledger: Arc<dyn Ledger>,
    pub ledger_m: Arc<dyn LedgerMaintenance>,
    pub clock: Arc<dyn Clock>,
}

/// A purchase to commit for the hold the gate gave it, on the terms it is sold under:
/// what [`Ledger::commit_purchase`] writes, and what a group commit queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldPurchase {
    pub request: PurchaseRequest,
    pub hold: HoldRef,
    pub terms: Terms,
}

impl HeldPurchase {
    /// `request` (its own copy) with `hold`, on `terms`.
    pub fn new(request: &PurchaseRequest, hold: HoldRef, terms: Terms) -> Self {
        Self {
            request: request.clone(),
            hold,
            terms,
        }
    }
}

/// A purchase of a product in ledger mode, which has no gate hold: the ledger hands out
/// the hold id in the commit ([`Ledger::commit_ledger_purchase`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerPurchase {
    pub request: PurchaseRequest,
    pub terms: Terms,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Commit {
    Committed(Order),
    /// The request_id was already taken; what the ledger holds for it.
    Duplicate(PurchaseRecord),
    /// The ledger's counters have fewer units available than requested.
    InsufficientStock,
    /// The order would take the user's live units of the product past its per-user
    /// limit (checked in the ledger too, as Redis's per-user counts can be lost).
    LimitExceeded,
    /// The hold was taken in a stock generation that has since been rebuilt (or the
    /// product is in ledger mode now): it belongs to lost gate state and can never
    /// become an order.
    StaleGeneration,
    /// A purchase without a gate hold ([`Ledger::commit_ledger_purchase`]) for a product
    /// the gate serves: nothing was written; the purchase goes through the gate.
    GateMode,
    /// A purchase without a gate hold for a product that entered ledger mode less than
    /// [`crate::modes::LEDGER_SALES_AFTER_SWITCH`] ago: nothing was written; retry.
    Settling,
}

/// What [`LedgerMaintenance::enter_ledger_mode`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeSwitch {
    /// The product was in gate mode and is in ledger mode now, from `generation` on (the
    /// one the switch advanced to): no hold of an earlier generation can commit.
    Entered { generation: Generation },
    /// The product was in ledger mode already (in `generation`); nothing changed.
    AlreadyLedger { generation: Generation },
}

impl ModeSwitch {
    /// The generation the product is in, in ledger mode, after the call.
    pub fn generation(self) -> Generation {
        match self {
            Self::Entered { generation } | Self::AlreadyLedger { generation } => generation,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fence {
    Fenced,
    Duplicate(PurchaseRecord),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayAttempt {
    /// The order after the attempt.
    pub order: Order,
    /// Whether this call moved it to PAID.
    pub applied: bool,
    /// Whether its payment deadline has passed on the database's clock.
    pub expired: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelAttempt {
    pub order: Order,
    pub applied: bool,
    /// The reservation is RELEASED but its units are not yet recorded as back in the gate:
    /// how to give them back.
    pub pending_return: Option<ReleaseOf>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordRestock {
    /// Recorded now or before (in stock generation `generation`); `applied` says
    /// whether the gate already has the units.
    Recorded {
        applied: bool,
        generation: Generation,
    },
    /// The restock id was used for another product or quantity.
    Conflict,
    /// The total would exceed the largest stock a product may have.
    TooLarge,
}

/// Where the use cases read the time for sale windows. Payment deadlines are decided on
/// the ledger's clock instead, so one instance with a wrong clock can't expire early.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> DateTime<Utc>;
    /// Time since an arbitrary fixed start, never going back (unlike `now`, which an
    /// operator or NTP may step): for measuring how long a promise has left.
    fn monotonic(&self) -> Duration;
}

#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }

    fn monotonic(&self) -> Duration {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        START.get_or_init(std::time::Instant::now).elapsed()
    }
}

// ---- maintenance: what the background workers and the audit need ---------------------

/// A hold the gate has kept longer than the recovery window without anyone clearing it
/// from its pending index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleHold {
    pub request: PurchaseRequest,
    pub hold: HoldRef,
    /// Whether its units were already given back (then only the index entry remains).
    pub released: bool,
}

/// The gate's side of recovery, reconciliation and audit.
#[async_trait]
pub trait GateMaintenance: Send + Sync + 'static {
    /// Holds of a product taken more than `older_than` ago (on the gate's own clock, the
    /// one that stamped them) still listed as pending, oldest first, at most `limit`.
    /// Index entries whose record expired are dropped on the way.
    async fn stale_holds(
        &self,
        product_id: ProductId,
        older_than: Duration,
        limit: usize,
    ) -> Result<Vec<StaleHold>, GateError>;

    /// Removes holds from the pending index once the ledger accounts for them, each only
    /// while its request_id's record is still that hold: a later attempt of the same
    /// request_id may have taken another hold since, which recovery must still see.
    async fn forget_pending(
        &self,
        product_id: ProductId,
        holds: &[StaleHold],
    ) -> Result<(), GateError>;

    /// Everything the gate holds for a product, for reconciliation and audit.
    async fn facts(&self, product_id: ProductId) -> Result<GateFacts, GateError>;

    /// Adds `delta` (may be negative) to the available count if the entry is still as
    /// `from` counted it (the count, its generation and the last hold id handed out: no
    /// hold taken, nothing given back or added since), refusing to go below zero;
    /// reconciliation's only repair. Safe to run twice: the second run finds the count
    /// moved and changes nothing. An entry rebuilt or reloaded since is another
    /// generation, refused whatever its count.
    async fn adjust(
        &self,
        product_id: ProductId,
        from: &GateCount,
        delta: i64,
    ) -> Result<bool, GateError>;

    /// The gate's stock entry for a product: None when it has none (lost, or never
    /// loaded).
    async fn state(&self, product_id: ProductId) -> Result<Option<GateState>, GateError>;

    /// Replaces the product's gate state with one computed from the ledger's facts;
    /// refused (false) if the gate is already at that generation or newer.
    async fn rebuild(&self, product_id: ProductId, plan: &RebuildPlan) -> Result<bool, GateError>;

    /// Before the way back from ledger mode: the product's entry (maybe the one from
    /// before the switch, which the ledger has sold past) stops vouching that a request
    /// never held units and stops granting sold-out leases, and the leases granted are
    /// revoked. Idempotent. Whether there was an entry.
    async fn retire(&self, product_id: ProductId) -> Result<bool, GateError>;

    /// Takes over a product's entry that another Redis process wrote
    /// ([`GateState::server_changed`]) if the gate can prove it arrived whole — a slot
    /// migrated live from a primary that still serves with the same identity — rather
    /// than lost with a restart or a failover. Whether the entry is trusted now; when
    /// not, only a rebuild from the ledger is safe. Idempotent.
    async fn adopt(&self, product_id: ProductId) -> Result<bool, GateError>;
}

/// A product's stock entry in the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateState {
    pub available: i64,
    pub generation: Generation,
    /// The last hold id handed out.
    pub last_hold_id: i64,
    /// Whether the entry was written by another Redis process than the one serving it
    /// now: Redis restarted from a snapshot or failed over to a replica since the last
    /// load or rebuild, so writes acknowledged after the copy was taken (holds, releases,
    /// restocks alike) may be lost, and only a rebuild from the ledger is safe.
    pub server_changed: bool,
}

/// The gate state a rebuild writes, computed by the ledger in the transaction that
/// advanced the product's generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebuildPlan {
    pub generation: Generation,
    pub available: i64,
    /// Hold ids of the new generation start after this (above every recorded hold id).
    pub last_hold_id: i64,
    /// Units each user holds in live orders (for products with a per-user limit).
    pub user_units: Vec<(UserId, i64)>,
}

/// What the ledger knows about the gate's expected state: the current generation and the
/// highest hold id recorded in it. A gate whose generation or last hold id is lower has
/// lost writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermark {
    pub generation: Generation,
    pub last_hold_id: i64,
    pub stock_loaded: bool,
    /// Who serves the stock: in ledger mode the gate is expected to stay behind (its
    /// generation older) until the ledger gives the product back with a rebuild.
    pub mode: StockMode,
}

/// A product's state in the gate. `available`, `generation`, `last_hold_id` and
/// `pending` are one atomic look; `held` is read after it, so it may hold holds taken
/// since (their ids are above `last_hold_id`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GateFacts {
    /// None when the gate has no stock entry for the product.
    pub available: Option<i64>,
    /// The entry's stock generation (None without an entry).
    pub generation: Option<Generation>,
    /// The last hold id handed out when `available` was read: hold ids only grow, across
    /// generations too, so a hold with a higher id was taken after the look.
    pub last_hold_id: i64,
    /// Holds whose units are still taken: request_id → (hold id, units).
    pub held: std::collections::BTreeMap<String, (HoldId, i64)>,
    /// Request_ids in the pending index, each with its hold's age on the gate's clock.
    pub pending: std::collections::BTreeMap<String, Duration>,
}

/// A repair reconciliation made to a product's count in the gate, and what it was
/// computed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StockRepair {
    pub product_id: ProductId,
    /// The stock generation the count was read and repaired in.
    pub generation: Generation,
    /// The gate's available count before and after.
    pub redis_before: i64,
    pub redis_after: i64,
    /// What the ledger's facts made the count: the stock less the live orders' units and
    /// the holds in flight.
    pub expected: i64,
    pub total: i64,
    pub live_units: i64,
    pub in_flight_units: i64,
    /// Why it was repaired, in a few words.
    pub reason: &'static str,
}

/// A product's count in the gate as one atomic look read it ([`GateFacts`]): what a
/// repair is computed from and applied against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateCount {
    pub generation: Generation,
    pub available: i64,
    /// The last hold id handed out: it moves with every hold taken, so an equal one means
    /// no purchase took units in between.
    pub last_hold_id: i64,
}

impl GateFacts {
    /// The count this look read, if the gate has an entry.
    pub fn count(&self) -> Option<GateCount> {
        Some(GateCount {
            generation: self.generation?,
            available: self.available?,
            last_hold_id: self.last_hold_id,
        })
    }
}

/// An order the expiry worker found past its deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredOrder {
    pub order_id: OrderId,
    pub user_id: UserId,
}

/// An admin's change of a product's stock as the ledger recorded it, for the gate to
/// apply: `quantity` units added (a restock) or taken off sale (a destock), once per
/// `id` (the admin's request_id), and only in the stock `generation` it was recorded in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StockChange {
    pub product_id: ProductId,
    pub id: RequestId,
    pub quantity: i64,
    pub generation: Generation,
}

impl StockChange {
    pub fn new(
        product_id: ProductId,
        id: RequestId,
        quantity: i64,
        generation: Generation,
    ) -> Self {
        Self {
            product_id,
            id,
            quantity,
            generation,
        }
    }
}

/// A reservation released in the ledger whose units are not yet back in the gate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingReturn {
    pub product_id: ProductId,
    pub request_id: RequestId,
    pub of: ReleaseOf,
}

/// The ledger's side of the background work and the audit.
#[async_trait]
pub trait LedgerMaintenance: Send + Sync + 'static {
    /// Products whose stock was loaded into the gate (the ones with holds to look after),
    /// in ascending id order: up to `limit` of those whose id is above `after` (from the
    /// first when None). Callers page through them, so no product is ever out of reach.
    async fn loaded_products(
        &self,
        after: Option<ProductId>,
        limit: usize,
    ) -> Result<Vec<ProductId>, LedgerError>;

    /// The `limit` loaded products with the highest ids (the newest sales), highest first.
    async fn newest_products(&self, limit: usize) -> Result<Vec<ProductId>, LedgerError>;

    /// Unpaid orders whose deadline passed on the database's clock, oldest first.
    async fn expired_orders(&self, limit: usize) -> Result<Vec<ExpiredOrder>, LedgerError>;

    /// PENDING_PAYMENT → CANCELLED (payment_timeout), only if past its deadline on the
    /// database's clock; None when no such order exists.
    async fn expire(&self, order: &ExpiredOrder) -> Result<Option<CancelAttempt>, LedgerError>;

    async fn pending_returns(&self, limit: usize) -> Result<Vec<PendingReturn>, LedgerError>;

    /// Restocks recorded in the ledger whose units are not yet in the gate, oldest first.
    async fn pending_restocks(&self, limit: usize) -> Result<Vec<StockChange>, LedgerError>;

    /// Records a problem recovery could not resolve by itself, for an operator.
    async fn record_incident(&self, incident: &NewIncident) -> Result<(), LedgerError>;

    /// Closes the open incidents of a request once recovery resolved it after all.
    async fn resolve_incidents(&self, request_id: &RequestId) -> Result<(), LedgerError>;

    /// Recovery incidents still open, over every product.
    async fn open_incidents(&self) -> Result<i64, LedgerError>;

    /// Recovery incidents, the newest first, at most `limit`: the open ones only, or all.
    async fn incidents(&self, open_only: bool, limit: usize) -> Result<Vec<Incident>, LedgerError>;

    /// One recovery incident by its id.
    async fn incident(&self, id: i64) -> Result<Option<Incident>, LedgerError>;

    /// Records a person's decision on an incident, who made it and why, closing it if
    /// still open (the decision's own step may have closed it already: a fence closes its
    /// request's `outcome_unknown` incident): false when a person decided it before.
    async fn close_incident(&self, id: i64, closing: &IncidentClosing)
        -> Result<bool, LedgerError>;

    /// Records an audit's verdict, keeping the newest [`AUDIT_RUNS_KEPT`] (older ones are
    /// deleted in the same transaction).
    async fn record_audit(&self, verdict: &AuditVerdict) -> Result<(), LedgerError>;

    /// The verdict last recorded, with when (the database's clock); None: no audit yet.
    async fn last_audit(&self) -> Result<Option<AuditRun>, LedgerError>;

    /// Everything the ledger holds for a product, for reconciliation and audit.
    async fn facts(&self, product_id: ProductId) -> Result<Option<LedgerFacts>, LedgerError>;

    async fn watermark(&self, product_id: ProductId) -> Result<Option<Watermark>, LedgerError>;

    /// Starts a new stock generation for the product, in one transaction that waits for
    /// commits in flight: every hold of older generations can no longer commit, releases
    /// not yet returned and restocks not yet applied count as done (the plan includes
    /// them), and the plan for the gate is computed from the committed facts. None, and
    /// nothing changed, when the product is in ledger mode (checked in that transaction):
    /// its gate is rebuilt on the way back, and a rebuild into the mode's generation would
    /// hand out the ledger's own hold ids again; None too when its gate is not loaded
    /// (never, or its ended sale retired): it has no entry by design.
    async fn advance_generation(
        &self,
        product_id: ProductId,
    ) -> Result<Option<RebuildPlan>, LedgerError>;

    /// Reports that an instance cannot reach the gate while the product is being bought.
    /// In gate mode: puts the product in ledger mode, in one transaction that waits for
    /// commits in flight; the generation advances (so no hold the gate handed out before
    /// can ever commit), the ledger starts handing out hold ids from 1 in it, and what
    /// was owed to the gate (releases not yet returned, restocks not yet applied) is
    /// settled, as a rebuild settles it: the way back rebuilds the gate from the counters.
    /// In ledger mode already: nothing changes but the time of the last report, which
    /// holds off the way back ([`leave_ledger_mode`](Self::leave_ledger_mode)).
    async fn enter_ledger_mode(&self, product_id: ProductId) -> Result<ModeSwitch, LedgerError>;

    /// Gives the product back to the gate, in one transaction, if it is in ledger mode
    /// and no instance reported the gate unreachable for it within `quiet` (on the
    /// database's clock): exactly what [`advance_generation`](Self::advance_generation)
    /// does (the plan's hold ids start above every recorded one, the ledger's own
    /// included) and the mode back to gate; the caller rebuilds the gate with the plan.
    async fn leave_ledger_mode(
        &self,
        product_id: ProductId,
        quiet: Duration,
    ) -> Result<Leave, LedgerError>;

    /// The products in ledger mode, in ascending id order, at most `limit`.
    async fn ledger_mode_products(&self, limit: usize) -> Result<Vec<ProductId>, LedgerError>;

    /// Products whose sale ended (`sale_ends_at`, on the database's clock) at least
    /// `settled_for` ago and whose end-of-sale audit is not done, lowest id first, at most
    /// `limit`.
    async fn ended_sales(
        &self,
        settled_for: Duration,
        limit: usize,
    ) -> Result<Vec<ProductId>, LedgerError>;

    /// Claims a scheduled audit for `holder`: Some when this holder is to run it now
    /// (nobody claimed it, or a claim older than `lease` was never finished), None when
    /// another holder runs it or it is done. The claim names the audit exactly (for
    /// [`AuditSchedule::Every`], the period it fell in on the database's clock), for
    /// [`finish_audit`](Self::finish_audit).
    async fn claim_audit(
        &self,
        which: &AuditSchedule,
        holder: &str,
        lease: Duration,
    ) -> Result<Option<AuditClaim>, LedgerError>;

    /// Marks a claimed audit done: it is never claimed again.
    async fn finish_audit(&self, claim: &AuditClaim) -> Result<(), LedgerError>;

    /// Records a repair reconciliation made to the gate's count, with the facts it was
    /// computed from, for a person to trace.
    async fn record_repair(&self, repair: &StockRepair) -> Result<(), LedgerError>;

    /// The violations the audits recorded within `window` (on the database's clock)
    /// found, summed: what the alert on the audit watches.
    async fn audit_violations_within(&self, window: Duration) -> Result<i64, LedgerError>;

    /// The database node the ledger writes through now (`host:port`), as the adapter last
    /// chose it among a cluster's nodes; None when it has no such notion. No I/O.
    fn writer(&self) -> Option<String> {
        None
    }
}

/// A problem recovery could not resolve by itself (`recovery_incident`), for a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incident {
    pub id: i64,
    pub request_id: RequestId,
    pub product_id: ProductId,
    /// What recovery could not learn or do: `outcome_unknown` (the ledger would not tell
    /// whether a hold's order exists), `return_impossible` (a release's units have no
    /// hold record left in the gate).
    pub kind: String,
    /// The last error and the tries behind it.
    pub detail: String,
    /// When it was first raised (the database's clock).
    pub created_at: DateTime<Utc>,
    /// How it ended; None while open.
    pub closed: Option<IncidentClosed>,
}

/// What recovery could not learn or do about a request, stored as [`Self::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncidentKind {
    /// The ledger would not tell whether a hold's order exists.
    OutcomeUnknown,
    /// A released reservation's units have no hold record left in the gate to go back to.
    ReturnImpossible,
}

impl IncidentKind {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::OutcomeUnknown => "outcome_unknown",
            Self::ReturnImpossible => "return_impossible",
        }
    }
}

/// A problem recovery raises to an operator: one open incident per request and kind, a
/// repeated one refreshing its `detail` (the last error and the tries behind it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewIncident {
    pub request_id: RequestId,
    pub product_id: ProductId,
    pub kind: IncidentKind,
    pub detail: String,
}

/// How an incident ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncidentClosed {
    pub at: DateTime<Utc>,
    /// Who closed it and what was decided; None for an incident recovery closed itself
    /// once the outcome was learned after all.
    pub closing: Option<IncidentClosing>,
}

/// A person's closing of an incident.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncidentClosing {
    /// What was done: `release` (the units given back) or `confirm` (the order made).
    pub decision: String,
    pub by: String,
    pub note: String,
}

/// An audit that `serve` runs by itself, once per instance of it over all instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditSchedule {
    /// The audit of a product whose sale has ended and settled.
    SaleEnd(ProductId),
    /// The audit of every product, once per period of this length (periods counted on
    /// the database's clock from the Unix epoch).
    Every(Duration),
}

/// A scheduled audit one holder claimed: which one (`kind` and `scope`, e.g.
/// `sale_end` and a product id, or `every` and a period's number), and by whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditClaim {
    pub kind: &'static str,
    pub scope: String,
    pub holder: String,
}

/// Audit verdicts the ledger keeps: the page shows the last, and an operator looking back
/// over a sale's checks wants a few days of hourly audits, not every audit ever run.
pub const AUDIT_RUNS_KEPT: usize = 100;

/// What one run of the audit found, over its scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditVerdict {
    /// One product, or (None) every product whose stock was loaded.
    pub product: Option<ProductId>,
    /// Products audited.
    pub products: usize,
    /// Invariant violations found (0: clean).
    pub violations: usize,
    /// Findings of work in flight within its bound.
    pub pending: usize,
}

impl AuditVerdict {
    pub fn clean(&self) -> bool {
        self.violations == 0
    }
}

/// An audit's verdict as recorded, with the time it was recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRun {
    pub verdict: AuditVerdict,
    pub recorded_at: DateTime<Utc>,
}

/// What [`LedgerMaintenance::leave_ledger_mode`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leave {
    /// The product is in gate mode now; the gate is to be rebuilt with the plan.
    Left(RebuildPlan),
    /// The product was in gate mode already: nothing changed.
    NotLedger,
    /// An instance reported the gate unreachable within the quiet time: nothing changed.
    TooSoon,
}

/// A product's business facts in the ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerFacts {
    pub counters: InventoryCounters,
    /// Who serves the stock: in ledger mode the gate is behind on purpose and is not
    /// compared with the ledger (the way back rebuilds it from these facts).
    pub mode: StockMode,
    /// The gate was loaded (`products.stock_loaded`). A product never loaded, or whose
    /// ended sale was retired (`after_sale.rs`), has no entry in the gate by design: the
    /// gate is not compared with the ledger.
    pub gate_loaded: bool,
    /// Units of PENDING_PAYMENT and of PAID orders.
    pub pending_units: i64,
    pub paid_units: i64,
    /// Request_ids of orders with no reservation row (must be none).
    pub orders_without_reservation: Vec<String>,
    /// Request_ids whose reservation state does not match their order's (must be none).
    pub mismatched: Vec<String>,
    /// Live (PROCESSING or CONFIRMED) reservations: request_id → (hold id, units).
    pub live: std::collections::BTreeMap<String, (HoldId, i64)>,
    /// RELEASED reservations whose release the gate has not done yet: request_id →
    /// (units owed back on sale, none for a refund that withdrew them from stock; time
    /// since the release, on the database's clock).
    pub unreturned: std::collections::BTreeMap<String, (i64, Duration)>,
    /// Restocks recorded whose units the gate does not have yet: restock request_id →
    /// (stock generation, units, age on the database's clock).
    pub unapplied_restocks: std::collections::BTreeMap<String, (Generation, i64, Duration)>,
    /// Destocks recorded and not settled (`destock.rs`): destock request_id → (stock
    /// generation, units, age on the database's clock). The gate may have taken those of
    /// its generation already: the ledger's counters do not take them off yet.
    pub pending_destocks: std::collections::BTreeMap<String, (Generation, i64, Duration)>,
    /// Every request_id with a reservation row (live or released).
    pub reserved_request_ids: std::collections::BTreeSet<String>,
    /// PENDING_PAYMENT orders already past their deadline (database clock), and how long
    /// past it the oldest is.
    pub overdue_unpaid: i64,
    pub overdue_oldest: Duration,
    /// Request_ids whose outbox events do not match their state changes one to one.
    pub event_mismatches: Vec<String>,
    /// The stock log (库存流水): units it records moving from available to reserved (a
    /// group commit's row per product, a purchase committed alone its own row), and the
    /// units of every order of the product, whatever its state: equal when each order's
    /// units were logged once.
    pub reserve_logged: i64,
    pub ordered_units: i64,
    /// Request_ids whose stock-log rows do not match their reservation's state: a
    /// `confirm` row for each CONFIRMED one, a `release` row for each RELEASED one, and
    /// no other (must be none).
    pub log_mismatches: Vec<String>,
    /// Outbox events of the product not yet acknowledged by the broker, and the age of
    /// the oldest (database clock).
    pub unsent_events: i64,
    pub unsent_oldest: Duration,
    /// Events of the product's parked outbox rows: the broker refused them for good, and
    /// no consumer has them.
    pub parked_events: i64,
    /// Open recovery incidents.
    pub open_incidents: i64,
}

// ---- events: the transactional outbox, the broker, and the consumer's store -----------

use crate::consume::StatsDelta;
use crate::events::{EventType, OutboxMessage};

/// The outbox: the events of state changes, written by the ledger in the transaction of
/// the change, waiting to be published. A row holds one event, or several that one
/// transaction wrote (a pack: the MySQL adapter's group commit writes one per product),
/// each returned as its own message under the row's id. Rows are leased to one relay at
/// a time (row by row, or the whole outbox at once as the MySQL adapter does), so several
/// instances can run relays without publishing one order's events out of order.
#[async_trait]
pub trait Outbox: Send + Sync + 'static {
    /// Leases the oldest unsent rows that no live lease holds, to `relay` until `lease`
    /// from now, while their events number under `limit` (so at most `limit` − 1 plus
    /// one row's events); returns the events of every unsent row `relay` holds, ordered
    /// by (request_id, sequence), each flagged `blocked` when an earlier event of its
    /// request_id is unsent and held elsewhere. An adapter that leases the whole outbox
    /// returns nothing while another relay holds it, and never `blocked`.
    async fn claim(
        &self,
        relay: &str,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<OutboxMessage>, LedgerError>;

    /// Marks rows as published (the broker stored every event of them). Idempotent.
    async fn mark_sent(&self, ids: &[i64]) -> Result<(), LedgerError>;

    /// Records failed publish attempts (each row's error, and whether the broker refused
    /// the message itself: its refusals in a row, which any other failure sets back to
    /// none) and ends `relay`'s leases on all the unsent rows it holds (or on the
    /// outbox), so they can be claimed again at once. The relay calls it at the end of
    /// every round that held rows. An adapter that leases the whole outbox may keep that
    /// lease when the round had no failure and its claim took a full batch (the relay
    /// goes on at once, so the lease would only change hands between its rounds);
    /// [`Outbox::let_go`] ends it.
    async fn give_back(&self, relay: &str, failed: &[PublishFailure]) -> Result<(), LedgerError>;

    /// Parks rows the broker refused for good (row id, its last refusal): each leaves the
    /// unsent events (no claim returns it again, the rows behind it go on) and is kept
    /// with the reason for an operator. A row not unsent (sent, or parked before) is left
    /// as it is.
    async fn park(&self, rows: &[(i64, String)]) -> Result<(), LedgerError>;

    /// The parked rows, oldest first, at most `limit`.
    async fn parked(&self, limit: usize) -> Result<Vec<ParkedRow>, LedgerError>;

    /// How many events the parked rows hold.
    async fn parked_events(&self) -> Result<u64, LedgerError>;

    /// Puts parked rows back among the unsent, with no refusal counted, to be published by
    /// the next rounds; returns how many were parked. Ids not parked are passed over.
    async fn unpark(&self, ids: &[i64]) -> Result<usize, LedgerError>;

    /// Ends any lease `relay` still holds: the relay calls it when it stops, so that
    /// another instance's relay takes over at once rather than when the lease runs out.
    async fn let_go(&self, relay: &str) -> Result<(), LedgerError>;

    /// How many events are not yet published.
    async fn unsent(&self) -> Result<u64, LedgerError>;
}

/// A publish of an outbox row that failed, as the relay gives the row back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishFailure {
    /// The outbox row.
    pub id: i64,
    /// Why, as the broker or the adapter said it.
    pub error: String,
    /// The broker refused the message itself (`too_large`): it counts toward parking the
    /// row. Any other failure (the broker out of reach, slow, electing a leader) sets the
    /// row's count back to none.
    pub refused: bool,
}

/// A parked outbox row, for an operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkedRow {
    pub id: i64,
    pub event_type: EventType,
    pub product_id: i64,
    /// The row's request_id; None for a pack (the events of several orders).
    pub request_id: Option<String>,
    pub events: u32,
    /// Failed publish attempts, the last included.
    pub attempts: u32,
    /// The broker's last refusal.
    pub reason: String,
    pub parked_at: DateTime<Utc>,
}

/// The broker (NATS JetStream).
#[async_trait]
pub trait EventBus: Send + Sync + 'static {
    /// Whether the broker is reachable now, answered without waiting (a relay skips a
    /// round instead of leasing rows it can't publish).
    fn ready(&self) -> Result<(), BusError>;

    /// Publishes one event (the broker drops a copy of a message it already has) and
    /// waits, for a bounded time, until the broker confirms it stored it (or already had
    /// it).
    async fn publish(&self, message: &OutboxMessage) -> Result<(), BusError>;

    /// Publishes independent events (no two of one request_id), one result per event in
    /// order. The default publishes one after the other; an adapter may overlap them or
    /// pack several into one message.
    async fn publish_all(&self, messages: &[OutboxMessage]) -> Vec<Result<(), BusError>> {
        let mut results = Vec::with_capacity(messages.len());
        for message in messages {
            results.push(self.publish(message).await);
        }
        results
    }
}

/// Whether an event changed the consumer's store now or had been applied before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    Applied,
    AlreadyApplied,
}

/// The sales-statistics consumer's store.
#[async_trait]
pub trait StatsStore: Send + Sync + 'static {
    /// Adds `delta` to the product's counters and records `event_id` as consumed, in one
    /// transaction, unless `event_id` was consumed before (then nothing changes).
    async fn apply_once(&self, event: &StatsEvent) -> Result<Applied, LedgerError>;

    /// [`apply_once`](Self::apply_once) for several events, one result each in order;
    /// a store may apply them in one transaction. By default, one by one.
    async fn apply_all(&self, events: &[StatsEvent]) -> Result<Vec<Applied>, LedgerError> {
        apply_one_by_one(self, events).await
    }
}

/// [`StatsStore::apply_all`] one event at a time: the default, and a store's way when it
/// cannot apply a delivery in one step.
pub async fn apply_one_by_one<S: StatsStore + ?Sized>(
    store: &S,
    events: &[StatsEvent],
) -> Result<Vec<Applied>, LedgerError> {
    let mut applied = Vec::with_capacity(events.len());
    for event in events {
        applied.push(store.apply_once(event).await?);
    }
    Ok(applied)
}

/// One event as the statistics store sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsEvent {
    pub event_id: String,
    pub event_type: EventType,
    pub product_id: ProductId,
    pub delta: StatsDelta,
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks what a port error says and keeps: each kind's constructor gives that kind;
    // the text names the store, the kind and the detail; an error built with a cause
    // appends its text, keeps it as its `cause` (found again by downcasting) but not as
    // its `source` (a walk of the chain would repeat the text), and a clone shares it.
    // How: one error of each kind per port, and one caused by an I/O error.
    #[test]
    fn a_port_error_keeps_its_kind_detail_and_cause() {
        let built: [(GateError, ErrorKind); 9] = [
            (GateError::unreachable("d"), ErrorKind::Unreachable),
            (GateError::timed_out("d"), ErrorKind::TimedOut),
            (GateError::rejected("d"), ErrorKind::Rejected),
            (GateError::contention("d"), ErrorKind::Contention),
            (GateError::not_ready("d"), ErrorKind::NotReady),
            (GateError::corrupt("d"), ErrorKind::Corrupt),
            (GateError::too_large("d"), ErrorKind::TooLarge),
            (GateError::stopped("d"), ErrorKind::Stopped),
            (GateError::config("d"), ErrorKind::Config),
        ];
        for (e, kind) in &built {
            assert_eq!(e.kind(), *kind);
            assert_eq!(e.to_string(), format!("stock gate: {kind}: d"));
            assert!(std::error::Error::source(e).is_none());
        }
        let kinds: std::collections::BTreeSet<_> = built.iter().map(|(_, k)| k.as_str()).collect();
        assert_eq!(
            kinds.len(),
            ErrorKind::ALL.len(),
            "every kind, each its own name"
        );

        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = LedgerError::caused(ErrorKind::Unreachable, "MariaDB", refused);
        assert_eq!(e.to_string(), "ledger: unreachable: MariaDB: refused");
        assert_eq!(e.detail(), "MariaDB: refused");
        let copy = e.clone();
        assert!(
            std::error::Error::source(&copy).is_none(),
            "said once, in the text"
        );
        let io = copy
            .cause()
            .expect("the cause is kept")
            .downcast_ref::<std::io::Error>()
            .expect("as the error it was");
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);

        let e = BusError::timed_out("publish");
        assert_eq!(e.to_string(), "event bus: timed_out: publish");
        assert_eq!(
            (GateError::STORE, LedgerError::STORE, BusError::STORE),
            ("redis", "mariadb", "nats")
        );
    }
}
