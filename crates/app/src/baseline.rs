//! The seeds' purchase strategies, kept as baselines for the benchmarks (issue 4): the
//! same purchase API, the simpler designs the seed documents discuss, measured side by
//! side with flashsale's own path. They are deliberately plain — one database
//! transaction or one unguarded Redis call per attempt — and make none of flashsale's
//! promises beyond "one order per request_id" (the orders table's unique key). Never for
//! production: `FLASHSALE_STRATEGY` defaults to `flashsale`.
//!
//! The two guarded ones (issue 42) are written as a seasoned engineer would write them,
//! and keep the per-user limit too: db-optimistic (a version column, retried on
//! conflict) and redis-lock (a per-product Redis lock around the database deduction,
//! Redisson's way). Both share one transaction (`BaselineLedger::purchase_guarded`) and
//! one first read (`BaselineLedger::read_stock`), and differ only in what guards it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use flashsale_core::{ProductId, PurchaseRequest, RequestId};

use crate::error::Error;
use crate::model::{Order, Purchased};
use crate::ports::{GateError, LedgerError};
use tracing::warn;

/// Which purchase path serves `POST /v1/purchases`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// flashsale's own path (Redis hold + durable reservation, every guarantee).
    Flashsale,
    /// `SELECT … FOR UPDATE` on the stock row, then `UPDATE`, then the order, per attempt.
    DbPessimistic,
    /// `UPDATE … WHERE available_stock >= q` checked by affected rows, then the order.
    DbConditional,
    /// The seeds' Lua check-and-decrement in Redis, then a plain order insert.
    RedisLua,
    /// Read the stock row's version, then `UPDATE … WHERE version = v AND
    /// available_stock >= q` with the order in one transaction; 0 rows: retry with the
    /// version read after the conflict, a bounded number of times.
    DbOptimistic,
    /// A per-product Redis lock (`SET NX PX`, released by token) around the database
    /// deduction and the order, Redisson's way.
    RedisLock,
    /// No strategy: every purchase answered `sold_out` right after it was parsed, with no
    /// store touched. The HTTP ceiling of the purchase endpoint itself — a POST with a
    /// JSON body to read and parse, and a JSON refusal — beside `GET /healthz`'s.
    HttpPostCeiling,
}

impl Strategy {
    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "flashsale" => Some(Self::Flashsale),
            "db-pessimistic" => Some(Self::DbPessimistic),
            "db-conditional" => Some(Self::DbConditional),
            "redis-lua" => Some(Self::RedisLua),
            "db-optimistic" => Some(Self::DbOptimistic),
            "redis-lock" => Some(Self::RedisLock),
            "http-post-ceiling" => Some(Self::HttpPostCeiling),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Flashsale => "flashsale",
            Self::DbPessimistic => "db-pessimistic",
            Self::DbConditional => "db-conditional",
            Self::RedisLua => "redis-lua",
            Self::DbOptimistic => "db-optimistic",
            Self::RedisLock => "redis-lock",
            Self::HttpPostCeiling => "http-post-ceiling",
        }
    }
}

/// What an order insertion of a baseline found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BaselineOutcome {
    Created(Order),
    /// The request_id already has this order (a replay).
    Existing(Order),
    SoldOut,
    /// The user's live orders of the product would pass its per-user limit (the guarded
    /// strategies only); nothing was written.
    LimitExceeded,
}

/// A product's stock row as the guarded strategies read it before deciding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StockRead {
    pub available: i64,
    /// `product_inventory.version`, moved by every change of the row's counters.
    pub version: i64,
}

/// What guards a guarded deduction against a concurrent one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// db-optimistic: the UPDATE matches only while the row is still at this version.
    Version(i64),
    /// redis-lock: the caller holds the product's lock; the UPDATE checks only the stock.
    Lock,
}

/// What one guarded transaction did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Guarded {
    Done(BaselineOutcome),
    /// Another purchase moved the row past the guard's version first (there was still
    /// stock): nothing was written; this is the row as read right after.
    Conflict(StockRead),
}

/// The database side of the baselines.
#[async_trait]
pub trait BaselineLedger: Send + Sync + 'static {
    /// Lock the stock row, check, decrement, insert the order: one transaction.
    async fn purchase_pessimistic(
        &self,
        request: &PurchaseRequest,
        payment_timeout: Duration,
    ) -> Result<BaselineOutcome, LedgerError>;

    /// Conditional decrement checked by affected rows, insert the order: one transaction.
    async fn purchase_conditional(
        &self,
        request: &PurchaseRequest,
        payment_timeout: Duration,
    ) -> Result<BaselineOutcome, LedgerError>;

    /// Insert the order only (stock was taken elsewhere).
    async fn insert_order(
        &self,
        request: &PurchaseRequest,
        payment_timeout: Duration,
    ) -> Result<BaselineOutcome, LedgerError>;

    /// The product's stock row, and whether `request_id` already has an order (a replay
    /// is answered with it even once sold out); None: no such product. One read, no lock.
    async fn read_stock(
        &self,
        product_id: ProductId,
        request_id: &RequestId,
    ) -> Result<Option<(StockRead, bool)>, LedgerError>;

    /// One transaction: an existing order for the request_id answered as a replay; else
    /// the conditional deduction under `guard` (`available_stock >= q` always, and the
    /// version for [`Guard::Version`]), the per-user limit checked under the row's lock,
    /// and the order. Conflict only for [`Guard::Version`].
    async fn purchase_guarded(
        &self,
        request: &PurchaseRequest,
        guard: Guard,
        payment_timeout: Duration,
    ) -> Result<Guarded, LedgerError>;
}

/// A held per-product lock: the random token it was set with, which its release names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockToken(pub String);

/// The Redis side of the redis-lua baseline: the seeds' script.
#[async_trait]
pub trait BaselineGate: Send + Sync + 'static {
    /// 1 taken, 0 not enough stock, -1 no stock entry.
    async fn seed_decrement(&self, product_id: ProductId, quantity: u32) -> Result<i64, GateError>;

    /// redis-lock: one try at the product's lock (`SET <lock key> <random token> NX PX
    /// lease`); None: another holder has it.
    async fn try_lock(
        &self,
        product_id: ProductId,
        lease: Duration,
    ) -> Result<Option<LockToken>, GateError>;

    /// Deletes the product's lock only while it still holds `token` (a Lua
    /// compare-and-delete): false if the lease expired and another holder took it since.
    async fn unlock(&self, product_id: ProductId, token: &LockToken) -> Result<bool, GateError>;
}

pub struct Baseline {
    strategy: Strategy,
    ledger: Arc<dyn BaselineLedger>,
    gate: Arc<dyn BaselineGate>,
    payment_timeout: Duration,
}

impl std::fmt::Debug for Baseline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Baseline")
            .field("strategy", &self.strategy)
            .finish_non_exhaustive()
    }
}

impl Baseline {
    pub fn new(
        strategy: Strategy,
        ledger: Arc<dyn BaselineLedger>,
        gate: Arc<dyn BaselineGate>,
        payment_timeout: Duration,
    ) -> Self {
        Self {
            strategy,
            ledger,
            gate,
            payment_timeout,
        }
    }

    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    pub async fn purchase(&self, request: PurchaseRequest) -> Result<Purchased, Error> {
        let t = self.payment_timeout;
        let outcome = match self.strategy {
            Strategy::DbPessimistic => self.ledger.purchase_pessimistic(&request, t).await?,
            Strategy::DbConditional => self.ledger.purchase_conditional(&request, t).await?,
            Strategy::RedisLua => {
                match self
                    .gate
                    .seed_decrement(request.product_id, request.quantity.get())
                    .await?
                {
                    1 => self.ledger.insert_order(&request, t).await?,
                    0 => BaselineOutcome::SoldOut,
                    _ => return Err(Error::ProductNotFound),
                }
            }
            Strategy::DbOptimistic => self.purchase_optimistic(&request).await?,
            Strategy::RedisLock => self.purchase_locked(&request).await?,
            // The answer flashsale gives an outsider while a product is sold out.
            Strategy::HttpPostCeiling => return Err(Error::SoldOut),
            Strategy::Flashsale => {
                debug_assert!(
                    false,
                    "a Baseline runs a baseline strategy only: the server wires flashsale's \
                     own path for Strategy::Flashsale"
                );
                return Err(Error::Unavailable(
                    "the flashsale strategy is not a baseline".into(),
                ));
            }
        };
        match outcome {
            BaselineOutcome::Created(order) => Ok(Purchased {
                order,
                replay: false,
            }),
            BaselineOutcome::Existing(order) => Ok(Purchased {
                order,
                replay: true,
            }),
            BaselineOutcome::SoldOut => Err(Error::SoldOut),
            BaselineOutcome::LimitExceeded => Err(Error::LimitExceeded),
        }
    }

    /// The guarded strategies' first read: the row's stock and version, or the answer
    /// already known without a write — sold out (not enough stock, or no such product)
    /// unless the request_id has an order, whose replay the transaction answers.
    async fn first_read(&self, request: &PurchaseRequest) -> Result<Read, Error> {
        let read = self
            .ledger
            .read_stock(request.product_id, &request.request_id)
            .await?;
        Ok(match read {
            Some((row, true)) => Read::Replay(row),
            Some((row, false)) if row.available >= i64::from(request.quantity.get()) => {
                Read::Row(row)
            }
            _ => Read::SoldOut,
        })
    }

    /// db-optimistic: read the version, then the versioned transaction; on a conflict,
    /// back off and try again with the version read right after it, at most
    /// `OPTIMISTIC_ATTEMPTS_MAX` transactions. Sold out only when a read shows too little
    /// stock; conflicts to the end are a busy answer (503: retry), not a refusal.
    async fn purchase_optimistic(
        &self,
        request: &PurchaseRequest,
    ) -> Result<BaselineOutcome, Error> {
        let mut row = match self.first_read(request).await? {
            Read::SoldOut => return Ok(BaselineOutcome::SoldOut),
            // A replay's transaction answers with the order before looking at the version.
            Read::Replay(row) | Read::Row(row) => row,
        };
        let quantity = i64::from(request.quantity.get());
        for attempt in 0..OPTIMISTIC_ATTEMPTS_MAX {
            let guard = Guard::Version(row.version);
            match self
                .ledger
                .purchase_guarded(request, guard, self.payment_timeout)
                .await?
            {
                Guarded::Done(outcome) => return Ok(outcome),
                Guarded::Conflict(now) if now.available < quantity => {
                    return Ok(BaselineOutcome::SoldOut)
                }
                Guarded::Conflict(now) => row = now,
            }
            tokio::time::sleep(backoff(&request.request_id, attempt, OPTIMISTIC_BACKOFF)).await;
        }
        Err(Error::Unavailable(
            format!(
                "db-optimistic: the product's row moved under {OPTIMISTIC_ATTEMPTS_MAX} \
                 attempts in a row; nothing was written"
            )
            .into(),
        ))
    }

    /// redis-lock: the product's lock, the transaction under it, the release. A lock
    /// not obtained within `LOCK_WAIT_MAX` is a busy answer (503: retry), not a refusal.
    async fn purchase_locked(&self, request: &PurchaseRequest) -> Result<BaselineOutcome, Error> {
        // Sold out is read without the lock: after the sell-out, queuing every buyer on
        // the lock only to tell them so would serialise the refusals too.
        if let Read::SoldOut = self.first_read(request).await? {
            return Ok(BaselineOutcome::SoldOut);
        }
        let product_id = request.product_id;
        let token = self.lock(request).await?;
        // The lease may run out while the transaction runs (a stalled commit, a paused
        // process): another buyer's transaction may then run beside this one. Nothing
        // oversells even so: the UPDATE still requires `available_stock >= q`, the row's
        // lock orders the two, and the per-user check reads under that lock.
        let guarded = self
            .ledger
            .purchase_guarded(request, Guard::Lock, self.payment_timeout)
            .await;
        if let Err(e) = self.gate.unlock(product_id, &token).await {
            // The purchase's outcome stands; the lease frees the lock at the latest.
            warn!(product_id = product_id.get(), error = %e, "redis-lock: release failed");
        }
        match guarded? {
            Guarded::Done(outcome) => Ok(outcome),
            // The procedure compares no version without one: a conflict here is a bug.
            Guarded::Conflict(row) => {
                debug_assert!(
                    false,
                    "redis-lock: a version conflict under the lock: {row:?}"
                );
                Err(Error::Unavailable(
                    "redis-lock: a version conflict on a deduction the lock guards".into(),
                ))
            }
        }
    }

    /// Tries the product's lock until it is free or `LOCK_WAIT_MAX` has passed, with a
    /// jittered backoff between tries.
    async fn lock(&self, request: &PurchaseRequest) -> Result<LockToken, Error> {
        let started = tokio::time::Instant::now();
        for attempt in 0.. {
            if let Some(token) = self.gate.try_lock(request.product_id, LOCK_LEASE).await? {
                return Ok(token);
            }
            if started.elapsed() >= LOCK_WAIT_MAX {
                break;
            }
            tokio::time::sleep(backoff(&request.request_id, attempt, LOCK_BACKOFF)).await;
        }
        Err(Error::Unavailable(
            format!(
                "redis-lock: the product's lock stayed taken for {} ms; nothing was written",
                LOCK_WAIT_MAX.as_millis()
            )
            .into(),
        ))
    }
}

/// What the guarded strategies' first read found.
enum Read {
    SoldOut,
    /// The request_id has an order: the transaction answers it as a replay.
    Replay(StockRead),
    Row(StockRead),
}

/// db-optimistic's transactions per purchase. On one hot row each commit leaves every
/// other buyer that read the same version with a conflict, so with 64 buyers in flight
/// (the bench's default) a buyer meets several in a row; 16, with the backoff below,
/// keep trying for about 100 ms, far inside the request deadline (10 s), after which the
/// buyer is better told to retry than kept spinning on the row.
pub const OPTIMISTIC_ATTEMPTS_MAX: u32 = 16;
/// db-optimistic's backoff between attempts: from 1 ms (about one commit of the winner)
/// doubling to 8 ms, jittered, so that the losers of a conflict do not all come back at
/// the same instant and conflict again.
const OPTIMISTIC_BACKOFF: Backoff = Backoff {
    first: Duration::from_millis(1),
    most: Duration::from_millis(8),
};
/// redis-lock's lease. A holder keeps the lock for one transaction, milliseconds even
/// under load, so 2 s is never reached by a live holder; a holder that died (or whose
/// request was cut at its deadline before the release) stops the product's sale for at
/// most this long. Redisson renews a 30 s lease from a watchdog instead; without one, a
/// short lease is what bounds the stall.
pub const LOCK_LEASE: Duration = Duration::from_secs(2);
/// How long a buyer waits for the product's lock before a busy answer (Redisson's
/// `tryLock` wait time): a queue longer than a second on one product's lock will not
/// drain in time for the buyers behind it, and the client retries.
pub const LOCK_WAIT_MAX: Duration = Duration::from_secs(1);
/// redis-lock's backoff between tries. Polling, not Redisson's unlock pub/sub: the lock
/// is held for one transaction (about a millisecond), so a poll from 0.5 ms doubling to
/// 4 ms finds it soon after it is free, and a subscription would add a connection and a
/// waiter registry per product for little gain. Jittered, so the waiters spread out.
const LOCK_BACKOFF: Backoff = Backoff {
    first: Duration::from_micros(500),
    most: Duration::from_millis(4),
};

/// An exponential backoff: `first`, doubling per attempt up to `most`.
#[derive(Debug, Clone, Copy)]
struct Backoff {
    first: Duration,
    most: Duration,
}

/// The pause before try `attempt + 1`: a "full jitter" draw in (0, ceiling], where the
/// ceiling is `first` doubled `attempt` times, at most `most`. The draw is a hash of the
/// request_id and the attempt: buyers that conflicted together pause differently, with
/// no random source to carry, and a test's pauses repeat.
fn backoff(request_id: &RequestId, attempt: u32, b: Backoff) -> Duration {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let ceiling = b
        .first
        .saturating_mul(1u32 << attempt.min(BACKOFF_DOUBLINGS_MAX))
        .min(b.most);
    let mut h = DefaultHasher::new();
    (request_id.as_str(), attempt).hash(&mut h);
    let share = (h.finish() % JITTER_STEPS) + 1;
    ceiling.mul_f64(share as f64 / JITTER_STEPS as f64)
}

/// Doublings after which the ceiling is past any `most` here (1 ms × 2^16 is a minute),
/// so the shift never overflows.
const BACKOFF_DOUBLINGS_MAX: u32 = 16;
/// The jitter's resolution: a pause is one of this many shares of its ceiling.
const JITTER_STEPS: u64 = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the backoff: every pause lies in (0, ceiling], the ceilings double from
    // `first` and stop at `most` (a late attempt never pauses longer), two buyers
    // pause differently at the same attempt (the jitter), and the same buyer's pauses
    // repeat.
    #[test]
    fn backoff_doubles_to_its_ceiling_and_spreads_buyers() {
        let b = OPTIMISTIC_BACKOFF;
        let a = RequestId::parse("request_id", "REQ_a").expect("valid");
        let z = RequestId::parse("request_id", "REQ_z").expect("valid");
        for attempt in 0..40 {
            let ceiling = (b.first * 2u32.pow(attempt.min(10))).min(b.most);
            let pause = backoff(&a, attempt, b);
            assert!(
                pause > Duration::ZERO && pause <= ceiling,
                "{attempt}: {pause:?}"
            );
            assert_eq!(pause, backoff(&a, attempt, b));
        }
        let differ = (0..16)
            .filter(|&n| backoff(&a, n, b) != backoff(&z, n, b))
            .count();
        assert!(differ >= 15, "{differ} of 16 attempts differ");
        assert_eq!(
            Strategy::parse("db-optimistic"),
            Some(Strategy::DbOptimistic)
        );
        assert_eq!(Strategy::parse("redis-lock"), Some(Strategy::RedisLock));
        for s in [Strategy::DbOptimistic, Strategy::RedisLock] {
            assert_eq!(Strategy::parse(s.as_str()), Some(s));
        }
    }
}
