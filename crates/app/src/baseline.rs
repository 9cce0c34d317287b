//! The seeds' purchase strategies, kept as baselines for the benchmarks (issue 4): the
//! same purchase API, the simpler designs the seed documents discuss, measured side by
//! side with flashsale's own path. They are deliberately plain — one database
//! transaction or one unguarded Redis call per attempt — and make none of flashsale's
//! promises beyond "one order per request_id" (the orders table's unique key). Never for
//! production: `FLASHSALE_STRATEGY` defaults to `flashsale`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use flashsale_core::{ProductId, PurchaseRequest};

use crate::error::Error;
use crate::model::{Order, Purchased};
use crate::ports::{GateError, LedgerError};

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
}

/// The Redis side of the redis-lua baseline: the seeds' script.
#[async_trait]
pub trait BaselineGate: Send + Sync + 'static {
    /// 1 taken, 0 not enough stock, -1 no stock entry.
    async fn seed_decrement(&self, product_id: ProductId, quantity: u32) -> Result<i64, GateError>;
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
            // The answer flashsale gives an outsider while a product is sold out.
            Strategy::HttpPostCeiling => return Err(Error::SoldOut),
            Strategy::Flashsale => {
                return Err(Error::Unavailable(
                    "the flashsale strategy is not a baseline".into(),
                ))
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
        }
    }
}
