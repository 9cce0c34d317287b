use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use flashsale_app::ports::{
    CancelAttempt, Commit, CreateProduct, ErrorKind, Fence, HeldPurchase, LedgerPurchase,
    PayAttempt, RecordRestock, ReleaseOf,
};
use flashsale_app::{AdminAction, Ledger, LedgerError, Order, Product, PurchaseRecord};
use flashsale_core::{
    AdminName, CancelReason, Generation, HoldRef, InventoryCounters, NewProduct, OrderId,
    OrderStatus, ProductId, PurchaseRequest, ReleaseReason, RequestId, StockMode, UserId,
    STOCK_MAX,
};
use sqlx::mysql::{MySqlConnectOptions, MySqlPool, MySqlRow};
use sqlx::ConnectOptions;
use sqlx::{Connection, Executor, MySqlConnection, Row};
use tracing::{debug, warn};

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use flashsale_batch::{BatchFn, Coalescer};

use crate::controls::{inventory_json, log_line, Line};
use crate::dedicated::Dedicated;
use crate::group::{Committer, Counters, Decided, Queued, Written};
use crate::writer::{ClusterConfig, PoolSettings, Route};

mod mode;
use flashsale_app::group;

use crate::rows::{self, corrupt, ORDER_COLUMNS};
use crate::sql::{db, is_duplicate, micros, retried, SLOW_OPERATION};

/// Attempts of one transaction that hit a deadlock (1213) or a lock wait timeout (1205)
/// before the caller hears "unavailable": enough to ride out the bursts of contention on
/// a hot product's inventory row, few enough to answer within the request deadline.
const TX_ATTEMPTS_MAX: u32 = 4;
/// First pause before retrying such a transaction; doubled on each further attempt.
const TX_RETRY_PAUSE: Duration = Duration::from_millis(5);

/// Most purchases one group commit writes: a batch this size commits in a few
/// milliseconds, and each of its two scripts stays far below MariaDB's
/// `max_allowed_packet` (16 MB by default): the rows' (the batch at most about 400 bytes
/// per purchase as hex, plus the statements: about 110 KB) and the events' (at most 389
/// bytes per event, twice that as hex: about 190 KB).
const GROUP_COMMIT_MAX: usize = 256;
/// Purchases waiting for a group commit; past it callers wait for room (the API's
/// in-flight limit bounds them first).
const GROUP_QUEUE_MAX: usize = 8_192;
/// Group commits in flight at once: one. Measured: two or three in parallel split the
/// queue into smaller batches that then wait on each other at the product row's lock, for
/// the same throughput at up to five times the commits per order. Each worker has a
/// connection of its own, outside the pool (`dedicated.rs`).
const GROUP_WORKERS: usize = 1;
/// Most request_ids one lookup query asks for (an IN list this long is still one
/// index range scan per id).
const LOOKUP_BATCH_MAX: usize = 256;
/// Lookups waiting for a batch.
const LOOKUP_QUEUE_MAX: usize = 16_384;
/// Lookup queries in flight at once, on as many connections of their own, outside the
/// pool (`dedicated.rs`).
const LOOKUP_WORKERS: usize = 2;
#[derive(Debug, Clone)]
pub struct LedgerConfig {
    pub url: String,
    /// Connections in the pool: a few well-used connections beat many idle ones.
    pub max_connections: u32,
    /// How long a caller waits for a free connection (or a new one) before 503.
    pub acquire_timeout: Duration,
    /// Deadline of one transaction, retries included; past it the outcome is unknown.
    pub transaction_timeout: Duration,
    /// A Galera cluster's nodes to write through, one at a time (`writer.rs`); None: the
    /// URL's host, alone. The URL still gives the user, password and database.
    pub cluster: Option<ClusterConfig>,
}

pub struct MysqlLedger {
    /// The writer in use and its pool (`writer.rs`): taken anew for every attempt.
    route: Arc<Route>,
    transaction_timeout: Duration,
    /// The group committer, started on the first purchase (inside the runtime).
    group: OnceLock<Committer>,
    /// The purchase-record lookups, batched likewise (a rush asks one per rejection).
    lookups: OnceLock<Coalescer<RequestId, Lookup>>,
    /// The ledger-mode purchases' group committer, started on the first of them.
    ledger_group: OnceLock<Coalescer<LedgerPurchase, Result<Commit, LedgerError>>>,
    /// Group commits in flight, which a retry of the same hold joins.
    in_flight: crate::group::InFlight,
    /// This handle's relay's lease on the outbox, as far as it knows (`outbox.rs`).
    outbox_lease: crate::outbox::KeptLease,
    /// The group committer's connection and the lookup workers', outside the pool.
    group_conn: Arc<Dedicated>,
    /// The ledger-mode group committer's connection: its transactions hold their
    /// products' rows from the first statement, so they do not queue behind the gate's.
    ledger_group_conn: Arc<Dedicated>,
    lookup_conns: Arc<Dedicated>,
    /// The baseline strategies' connections (benchmarks only; opened on first use), as
    /// many as the pool's: see `baseline.rs`.
    pub(crate) baseline_conns: Arc<Dedicated>,
}

type Lookup = Result<Option<PurchaseRecord>, LedgerError>;

/// A duplicate on `uk_reservation_hold`: the gate handed out a hold id it had handed
/// out before in this generation, so it lost writes.
/// Told by the key the error names, never by a search of its message, which quotes the
/// duplicated value first: a request_id spelling the key's name is a taken request_id.
fn is_reused_hold(e: &sqlx::Error) -> bool {
    crate::sql::duplicate_key(e) == Some("uk_reservation_hold")
}

/// An order after a transition attempt.
pub(crate) struct Transitioned {
    pub(crate) order: Order,
    /// Whether this attempt moved it.
    pub(crate) applied: bool,
    /// Whether its payment deadline has passed (database clock).
    pub(crate) expired: bool,
    /// Units released but not yet back in the gate, and how to give them back.
    pub(crate) pending_return: Option<ReleaseOf>,
}

impl From<Transitioned> for CancelAttempt {
    fn from(t: Transitioned) -> Self {
        CancelAttempt {
            order: t.order,
            applied: t.applied,
            pending_return: t.pending_return,
        }
    }
}

/// How a purchase transaction that got past the unique key ended.
enum Committed {
    Order(Order),
    InsufficientStock,
    LimitExceeded,
    StaleGeneration,
    /// The hold id was already recorded in this generation: the gate is behind.
    HoldReused,
    /// A purchase without a gate hold for a product in gate mode.
    GateMode,
    /// A purchase without a gate hold for a product that entered ledger mode less than
    /// `LEDGER_SALES_AFTER_SWITCH` ago.
    Settling,
}

/// What writing a purchase's rows did.
enum Rows {
    Written(Order),
    /// The request_id is taken (`Attempt::Taken`).
    Taken,
    /// The (product, generation, hold id) is recorded already (`Committed::HoldReused`).
    HoldReused,
}

/// The rows of a purchase for `hold`, in the open transaction `tx`, the counters aside:
/// the reservation (PROCESSING), the order (PENDING_PAYMENT, expiring `payment_timeout`
/// after the database's now), the reserve log row and the `order_created` event. A gate
/// purchase and a ledger-mode purchase write the same ones.
async fn write_purchase_rows(
    tx: &mut MySqlConnection,
    request: &PurchaseRequest,
    hold: HoldRef,
    payment_timeout: Duration,
) -> Result<Rows, sqlx::Error> {
    let inserted = sqlx::query(
        "INSERT INTO inventory_reservation \
         (request_id, product_id, user_id, quantity, hold_id, generation, status) \
         VALUES (?, ?, ?, ?, ?, ?, 'PROCESSING')",
    )
    .bind(request.request_id.as_str())
    .bind(request.product_id.get())
    .bind(request.user_id.get())
    .bind(request.quantity.get())
    .bind(hold.id.get())
    .bind(hold.generation.get())
    .execute(&mut *tx)
    .await;
    match inserted {
        Err(e) if is_reused_hold(&e) => return Ok(Rows::HoldReused),
        Err(e) if is_duplicate(&e) => return Ok(Rows::Taken),
        other => other?,
    };
    let order = match insert_order(&mut *tx, request, payment_timeout).await {
        Err(e) if is_duplicate(&e) => return Ok(Rows::Taken),
        other => other?,
    };
    let order_id = order.order_id.get();
    sqlx::query(
        "INSERT INTO inventory_log (request_id, product_id, order_id, quantity, type) \
         VALUES (?, ?, ?, ?, 'reserve')",
    )
    .bind(request.request_id.as_str())
    .bind(request.product_id.get())
    .bind(order_id)
    .bind(request.quantity.get())
    .execute(&mut *tx)
    .await?;
    crate::outbox::record(
        &mut *tx,
        crate::outbox::Change::Created { order_id, request },
    )
    .await?;
    Ok(Rows::Written(order))
}

/// The end of a purchase's transaction once its rows are written (a gate purchase's and
/// a ledger-mode one's alike): the ledger's own per-user check, rolled back over the
/// limit, then COMMIT.
async fn limit_then_commit(
    mut tx: sqlx::Transaction<'_, sqlx::MySql>,
    request: &PurchaseRequest,
    per_user_limit: Option<u32>,
    order: Order,
) -> Result<Attempt<Committed>, sqlx::Error> {
    if let Some(limit) = per_user_limit {
        if over_user_limit(&mut tx, request, limit).await? {
            tx.rollback().await?;
            return Ok(Attempt::Done(Committed::LimitExceeded));
        }
    }
    tx.commit().await?;
    Ok(Attempt::Done(Committed::Order(order)))
}

/// The ledger's own per-user check, as Redis's per-user counts can be lost: whether the
/// user's live orders of the product, this purchase's included, pass `limit`. The caller
/// holds the product row's lock (taken by its counter UPDATE), which orders the
/// purchases of the product, and the session reads READ COMMITTED: this read sees every
/// order of the product committed before, this one included. (A cancel committing
/// meanwhile only lowers the sum.)
async fn over_user_limit(
    tx: &mut MySqlConnection,
    request: &PurchaseRequest,
    limit: u32,
) -> Result<bool, sqlx::Error> {
    let live: i64 = sqlx::query_scalar(
        "SELECT CAST(COALESCE(SUM(quantity), 0) AS SIGNED) FROM orders \
         WHERE user_id = ? AND product_id = ? \
         AND status IN ('PENDING_PAYMENT', 'PAID')",
    )
    .bind(request.user_id.get())
    .bind(request.product_id.get())
    .fetch_one(&mut *tx)
    .await?;
    Ok(live > i64::from(limit))
}

/// What one purchase transaction did.
enum Attempt<T> {
    Done(T),
    /// The request_id is taken by a committed row (or one committing concurrently).
    Taken,
}

/// Inserts a PENDING_PAYMENT order expiring `payment_timeout` after the database's now,
/// and reads back its id and the database's timestamps (MariaDB's INSERT … RETURNING
/// yields no columns through the prepared-statement protocol sqlx uses). A duplicate
/// request_id is the caller's to recognise (`is_duplicate`).
pub(crate) async fn insert_order(
    conn: &mut MySqlConnection,
    request: &PurchaseRequest,
    payment_timeout: Duration,
) -> Result<Order, sqlx::Error> {
    let inserted = sqlx::query(
        "INSERT INTO orders (request_id, user_id, product_id, quantity, status, created_at, \
         expires_at) VALUES (?, ?, ?, ?, 'PENDING_PAYMENT', NOW(6), NOW(6) + INTERVAL ? MICROSECOND)",
    )
    .bind(request.request_id.as_str())
    .bind(request.user_id.get())
    .bind(request.product_id.get())
    .bind(request.quantity.get())
    .bind(micros(payment_timeout))
    .execute(&mut *conn)
    .await?;
    let id = i64::try_from(inserted.last_insert_id()).map_err(|e| sqlx::Error::Decode(e.into()))?;
    let row = sqlx::query("SELECT created_at, expires_at FROM orders WHERE id = ?")
        .bind(id)
        .fetch_one(&mut *conn)
        .await?;
    Ok(Order {
        order_id: OrderId::parse(id).map_err(|e| sqlx::Error::Decode(e.into()))?,
        request_id: request.request_id.clone(),
        user_id: request.user_id,
        product_id: request.product_id,
        quantity: request.quantity,
        status: OrderStatus::PendingPayment,
        created_at: row.try_get("created_at")?,
        expires_at: row.try_get("expires_at")?,
        paid_at: None,
        cancelled_at: None,
        cancel_reason: None,
        refunded_at: None,
    })
}

/// Creates the database `options` name, if they name one and it does not exist: on the
/// node `options` reach, bounded by `timeout`.
async fn create_database(
    options: &MySqlConnectOptions,
    timeout: Duration,
) -> Result<(), LedgerError> {
    let Some(name) = options.get_database() else {
        return Ok(());
    };
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(LedgerError::config(format!(
            "database name {name:?} must be letters, digits and _"
        )));
    }
    let server = options.clone().database("information_schema");
    let mut conn = tokio::time::timeout(timeout, MySqlConnection::connect_with(&server))
        .await
        .map_err(|_| LedgerError::timed_out("connecting to the database timed out"))?
        .map_err(db)?;
    conn.execute(format!("CREATE DATABASE IF NOT EXISTS `{name}`").as_str())
        .await
        .map_err(db)?;
    let _ = conn.close().await;
    Ok(())
}

impl MysqlLedger {
    /// Creates the database named in the URL if it does not exist (through the writer,
    /// on a cluster), and the route and pools to it.
    pub async fn connect(config: &LedgerConfig) -> Result<Self, LedgerError> {
        let options = MySqlConnectOptions::from_str(&config.url)
            .map_err(|e| LedgerError::caused(ErrorKind::Config, "invalid database url", e))?
            // sqlx's own slow-statement warning prints the whole statement: for a group
            // commit that is its batch, up to about a hundred kilobytes of hex. Kept at
            // debug; `run` warns instead, naming the operation.
            .log_slow_statements(log::LevelFilter::Debug, SLOW_OPERATION)
            // Every time is UTC: the DATETIME columns, the events' `…Z` timestamps and the
            // text rows the group commit reads (`group::parse_datetime`). sqlx's default
            // too, but a `?timezone=` in the URL must not change it.
            .timezone(Some(String::from("+00:00")));
        let settings = PoolSettings {
            max_connections: config.max_connections,
            acquire_timeout: config.acquire_timeout,
        };
        let route = match &config.cluster {
            None => Route::single(options, settings),
            Some(cluster) => Route::cluster(&options, cluster, settings).await,
        };
        // Through the writer: on a cluster the URL's own host may be the node that is down.
        create_database(&route.current().options, config.acquire_timeout).await?;
        let dedicated =
            |slots| Arc::new(Dedicated::new(route.clone(), config.acquire_timeout, slots));
        Ok(Self {
            transaction_timeout: config.transaction_timeout,
            group: OnceLock::new(),
            lookups: OnceLock::new(),
            ledger_group: OnceLock::new(),
            in_flight: Default::default(),
            outbox_lease: Default::default(),
            group_conn: dedicated(GROUP_WORKERS),
            ledger_group_conn: dedicated(GROUP_WORKERS),
            lookup_conns: dedicated(LOOKUP_WORKERS),
            baseline_conns: dedicated(usize::try_from(config.max_connections).unwrap_or(1)),
            route,
        })
    }

    /// The node the ledger writes through now (`host:port`).
    pub(crate) fn writer_addr(&self) -> String {
        self.route.writer_addr()
    }

    pub(crate) fn outbox_lease(&self) -> &crate::outbox::KeptLease {
        &self.outbox_lease
    }

    /// A ledger on the same pool that commits every purchase on its own: what the group
    /// committer runs its fallbacks on.
    fn single(&self) -> Self {
        Self {
            route: self.route.clone(),
            transaction_timeout: self.transaction_timeout,
            group: OnceLock::new(),
            lookups: OnceLock::new(),
            ledger_group: OnceLock::new(),
            in_flight: Default::default(),
            outbox_lease: Default::default(),
            group_conn: self.group_conn.clone(),
            ledger_group_conn: self.ledger_group_conn.clone(),
            lookup_conns: self.lookup_conns.clone(),
            baseline_conns: self.baseline_conns.clone(),
        }
    }

    fn group(&self) -> &Committer {
        self.group.get_or_init(|| {
            let ledger = Arc::new(self.single());
            let run: BatchFn<Queued, Result<Commit, LedgerError>> =
                Arc::new(move |batch: Vec<Queued>| {
                    let ledger = ledger.clone();
                    Box::pin(async move {
                        let (batch, tickets): (Vec<HeldPurchase>, Vec<_>) =
                            batch.into_iter().unzip();
                        let answers = ledger.group_commit(batch).await;
                        // `Decided::answers` answers each member of the batch it ran.
                        debug_assert_eq!(answers.len(), tickets.len(), "a group commit's answers");
                        // A ticket without an answer (none is missing but by a bug) is
                        // dropped instead: its joiners hear "unknown", as its caller does.
                        for (ticket, answer) in tickets.into_iter().zip(&answers) {
                            if let Some(ticket) = ticket {
                                ticket.finish(answer);
                            }
                        }
                        answers
                    })
                });
            Coalescer::start(GROUP_QUEUE_MAX, GROUP_COMMIT_MAX, GROUP_WORKERS, run)
        })
    }

    fn lookups(&self) -> &Coalescer<RequestId, Lookup> {
        self.lookups.get_or_init(|| {
            let ledger = Arc::new(self.single());
            let run: BatchFn<RequestId, Lookup> = Arc::new(move |ids: Vec<RequestId>| {
                let ledger = ledger.clone();
                Box::pin(async move { ledger.find_purchases(ids).await })
            });
            Coalescer::start(LOOKUP_QUEUE_MAX, LOOKUP_BATCH_MAX, LOOKUP_WORKERS, run)
        })
    }

    /// What the ledger holds for each request_id, in one query for all of them (the ids
    /// as one JSON array: one statement text for every batch size).
    async fn find_purchases(&self, ids: Vec<RequestId>) -> Vec<Lookup> {
        let sql = format!(
            "SELECT r.request_id AS r_request_id, r.product_id AS r_product_id, \
             r.user_id AS r_user_id, r.quantity AS r_quantity, r.status AS r_status, \
             r.release_reason AS r_release_reason, r.hold_id AS r_hold_id, \
             r.generation AS r_generation, {ORDER_COLUMNS} \
             FROM JSON_TABLE(?, '$[*]' COLUMNS (request_id VARCHAR(84) CHARACTER SET utf8mb4 \
             COLLATE utf8mb4_bin PATH '$')) AS b \
             JOIN inventory_reservation r ON r.request_id = b.request_id \
             LEFT JOIN orders o ON o.request_id = r.request_id"
        );
        let document =
            serde_json::to_string(&ids.iter().map(RequestId::as_str).collect::<Vec<_>>())
                .unwrap_or_default();
        let found = self
            .run("find purchase", || async {
                let mut own = self.lookup_conns.take().await?;
                let rows = sqlx::query(&sql)
                    .bind(&document)
                    .fetch_all(own.conn())
                    .await;
                own.give_back(&rows).await;
                rows
            })
            .await;
        let rows = match found {
            Ok(rows) => rows,
            Err(e) => return ids.iter().map(|_| Err(e.clone())).collect(),
        };
        let mut records: HashMap<String, Lookup> = HashMap::with_capacity(rows.len());
        for row in &rows {
            let record = rows::purchase(row);
            let key = match &record {
                Ok(r) => r.request.request_id.as_str().to_owned(),
                Err(_) => match rows::text(row, "r_request_id") {
                    Ok(id) => id,
                    Err(e) => return ids.iter().map(|_| Err(e.clone())).collect(),
                },
            };
            records.insert(key, record.map(Some));
        }
        ids.iter()
            .map(|id| records.get(id.as_str()).cloned().unwrap_or(Ok(None)))
            .collect()
    }

    /// The group transaction on `conn`, ended: committed when it wrote the orders, rolled
    /// back otherwise.
    async fn group_transaction(
        &self,
        conn: &mut MySqlConnection,
        members: &[HeldPurchase],
    ) -> Result<Written, sqlx::Error> {
        // The script begins the transaction.
        let written = crate::group::insert(conn, members, Counters::Gate).await;
        crate::group::end(conn, written).await
    }

    /// Commits a batch of purchases in one transaction when they go the plain way: the
    /// decision of which go together, which are set aside and answered one by one, and
    /// which get the batch's result is `flashsale_app::group::GroupCommit`'s; this runs
    /// the SQL it asks for and feeds back what each transaction did. A batch of one goes
    /// the group way too: its script is fewer round trips than the one-purchase
    /// transaction, and under load about one batch in seven is that small (measured:
    /// +3 % sustained, +6 % rush).
    async fn group_commit(&self, batch: Vec<HeldPurchase>) -> Vec<Result<Commit, LedgerError>> {
        let started = std::time::Instant::now();
        let decided = Decided::run(batch.iter().map(|p| &p.request), |plain| {
            let members: Vec<HeldPurchase> = plain.iter().map(|&i| batch[i].clone()).collect();
            async move {
                self.run("group commit", || async {
                    let mut own = self.group_conn.take().await?;
                    let written = self.group_transaction(own.conn(), &members).await;
                    own.give_back(&written).await;
                    match written? {
                        Written::Orders(orders) => Ok((group::Written::Orders, orders)),
                        Written::OverLimit(over) => Ok((group::Written::OverLimit(over), vec![])),
                        Written::NotPlain => {
                            // Rare: the batch's document is written only for it.
                            let document = crate::group::document(&members);
                            let taken = crate::group::taken(&self.pool(), &document).await?;
                            Ok((group::Written::Taken(taken), vec![]))
                        }
                    }
                })
                .await
            }
        })
        .await;
        let aside = decided.aside();
        let one_by_one =
            futures::future::join_all(aside.iter().map(|&i| self.commit_one(&batch[i]))).await;
        debug!(size = batch.len(), one_by_one = aside.len(), elapsed = ?started.elapsed(), "group commit");
        decided.answers(one_by_one)
    }

    /// One purchase in its own transaction.
    async fn commit_one(&self, purchase: &HeldPurchase) -> Result<Commit, LedgerError> {
        let HeldPurchase { request, hold, .. } = purchase;
        let outcome = self
            .purchase_or_taken("commit purchase", &request.request_id, || {
                self.run("commit purchase", move || self.insert_purchase(purchase))
            })
            .await?;
        Ok(match outcome {
            Ok(Committed::Order(order)) => Commit::Committed(order),
            Ok(Committed::InsufficientStock) => Commit::InsufficientStock,
            Ok(Committed::LimitExceeded) => Commit::LimitExceeded,
            Ok(Committed::StaleGeneration) => Commit::StaleGeneration,
            Ok(Committed::HoldReused) => {
                self.gate_behind(request.product_id, *hold).await?;
                Commit::StaleGeneration
            }
            Ok(Committed::GateMode | Committed::Settling) => {
                // `insert_purchase` (a gate hold's) never answers a ledger-mode refusal.
                debug_assert!(
                    false,
                    "a gate hold's purchase answered as one without a hold"
                );
                return Err(LedgerError::corrupt(
                    "a gate purchase was answered as one without a hold",
                ));
            }
            Err(record) => Commit::Duplicate(record),
        })
    }

    /// Applies the schema migrations through the writer (idempotent; concurrent
    /// instances wait for each other: `migrate.rs`).
    pub async fn migrate(&self) -> Result<(), LedgerError> {
        crate::migrate::run(&self.pool(), self.route.is_cluster()).await
    }

    /// The pool of the writer in use: take it anew for every attempt (after a switch of
    /// writer, an old one still works until its grace ends, through the old node).
    pub fn pool(&self) -> MySqlPool {
        self.route.pool()
    }

    /// The rows `sql` reads with `binds` bound in order, run as [`Self::run`] runs it.
    pub(crate) async fn rows_of(
        &self,
        what: &'static str,
        sql: &'static str,
        binds: &[i64],
    ) -> Result<Vec<MySqlRow>, LedgerError> {
        self.run(what, || async {
            let query = binds
                .iter()
                .fold(sqlx::query(sql), |query, value| query.bind(*value));
            query.fetch_all(&self.pool()).await
        })
        .await
    }

    /// The row `sql` reads for `product_id`, its one parameter (None: no such product).
    pub(crate) async fn product_row(
        &self,
        what: &'static str,
        sql: &'static str,
        product_id: ProductId,
    ) -> Result<Option<MySqlRow>, LedgerError> {
        let rows = self.rows_of(what, sql, &[product_id.get()]).await?;
        Ok(rows.into_iter().next())
    }

    /// Runs `f` (one transaction) under the transaction deadline, retrying deadlocks and
    /// lock wait timeouts (and, on Galera, certification failures) a bounded number of
    /// times. A failure a dead or cut-off writer explains wakes the writer's watch.
    pub(crate) async fn run<T, F, Fut>(&self, what: &'static str, f: F) -> Result<T, LedgerError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, sqlx::Error>>,
    {
        let outcome = retried(
            what,
            self.transaction_timeout,
            TX_ATTEMPTS_MAX,
            TX_RETRY_PAUSE,
            f,
        )
        .await;
        if let Err(e) = &outcome {
            if matches!(e.kind(), ErrorKind::Unreachable | ErrorKind::TimedOut) {
                self.route.suspect();
            }
        }
        outcome
    }

    async fn insert_purchase(
        &self,
        purchase: &HeldPurchase,
    ) -> Result<Attempt<Committed>, sqlx::Error> {
        let HeldPurchase {
            request,
            hold,
            terms,
        } = purchase;
        let (hold, timeout) = (*hold, terms.payment_timeout);
        let mut tx = self.pool().begin().await?;
        let order = match write_purchase_rows(&mut tx, request, hold, timeout).await? {
            Rows::Written(order) => order,
            Rows::Taken => return Ok(Attempt::Taken),
            Rows::HoldReused => return Ok(Attempt::Done(Committed::HoldReused)),
        };
        // The hot row last, so its lock is held only from here to COMMIT. Its conditions
        // are the ledger's own no-oversell check, independent of the gate, and the fence
        // against holds taken in a gate state that was lost and rebuilt since, or before
        // the product went to ledger mode.
        let updated = sqlx::query(
            "UPDATE product_inventory SET available_stock = available_stock - ?, \
             pre_deduct_stock = pre_deduct_stock + ?, version = version + 1 \
             WHERE product_id = ? AND available_stock >= ? AND generation = ? \
             AND stock_mode = 'GATE'",
        )
        .bind(request.quantity.get())
        .bind(request.quantity.get())
        .bind(request.product_id.get())
        .bind(request.quantity.get())
        .bind(hold.generation.get())
        .execute(&mut *tx)
        .await?;
        if updated.rows_affected() != 1 {
            let current = sqlx::query(
                "SELECT generation, stock_mode FROM product_inventory WHERE product_id = ?",
            )
            .bind(request.product_id.get())
            .fetch_optional(&mut *tx)
            .await?;
            let in_hold_generation = match &current {
                Some(row) => {
                    let mode = rows::stock_mode(row, "stock_mode").map_err(rows::undecodable)?;
                    row.try_get::<i64, _>("generation")? == hold.generation.get()
                        && mode == StockMode::Gate
                }
                None => false,
            };
            tx.rollback().await?;
            return Ok(Attempt::Done(if in_hold_generation {
                Committed::InsufficientStock
            } else {
                Committed::StaleGeneration
            }));
        }
        limit_then_commit(tx, request, terms.per_user_limit, order).await
    }

    async fn insert_fence(
        &self,
        request: &PurchaseRequest,
        hold: HoldRef,
        reason: ReleaseReason,
    ) -> Result<Attempt<bool>, sqlx::Error> {
        let mut tx = self.pool().begin().await?;
        let inserted = sqlx::query(
            "INSERT INTO inventory_reservation (request_id, product_id, user_id, quantity, \
             hold_id, generation, status, release_reason, resolved_at) \
             VALUES (?, ?, ?, ?, ?, ?, 'RELEASED', ?, NOW(6))",
        )
        .bind(request.request_id.as_str())
        .bind(request.product_id.get())
        .bind(request.user_id.get())
        .bind(request.quantity.get())
        .bind(hold.id.get())
        .bind(hold.generation.get())
        .bind(reason.as_str())
        .execute(&mut *tx)
        .await;
        match inserted {
            // Done(false): the hold id was recorded before in this generation.
            Err(e) if is_reused_hold(&e) => return Ok(Attempt::Done(false)),
            Err(e) if is_duplicate(&e) => return Ok(Attempt::Taken),
            other => other?,
        };
        sqlx::query(
            "INSERT INTO inventory_log (request_id, product_id, quantity, type, remark) \
             VALUES (?, ?, ?, 'release', ?)",
        )
        .bind(request.request_id.as_str())
        .bind(request.product_id.get())
        .bind(request.quantity.get())
        .bind(format!("fence: {}", reason.as_str()))
        .execute(&mut *tx)
        .await?;
        crate::outbox::record(&mut tx, crate::outbox::Change::Fenced { request, reason }).await?;
        // The fence settles whether the request's hold committed (it never will): an
        // incident raised while that was unknown is answered, whichever instance raised
        // it and whatever becomes of the instance fencing it now.
        sqlx::query(
            "UPDATE recovery_incident SET resolved_at = NOW(6) \
             WHERE request_id = ? AND kind = 'outcome_unknown' AND resolved_at IS NULL",
        )
        .bind(request.request_id.as_str())
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Attempt::Done(true))
    }

    /// The gate handed out a hold id twice in one generation: it lost writes. Advancing
    /// the generation makes every hold of that state void and makes the gate watch
    /// rebuild the gate from the facts.
    async fn gate_behind(&self, product_id: ProductId, hold: HoldRef) -> Result<(), LedgerError> {
        warn!(%product_id, hold_id = %hold.id, generation = %hold.generation, "gate reused a hold id: it lost writes; advancing the generation");
        let current = self.generation(product_id).await?;
        if current == Some(hold.generation) {
            flashsale_app::ports::LedgerMaintenance::advance_generation(self, product_id).await?;
        }
        Ok(())
    }

    /// Resolves a purchase transaction that found its request_id taken: the committed
    /// record answers it. If the row that collided was rolled back meanwhile, there is
    /// nothing to answer from and the transaction is tried again (bounded).
    async fn purchase_or_taken<T, F, Fut>(
        &self,
        what: &'static str,
        request_id: &RequestId,
        mut attempt: F,
    ) -> Result<Result<T, PurchaseRecord>, LedgerError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Attempt<T>, LedgerError>>,
    {
        for _ in 0..TX_ATTEMPTS_MAX {
            match attempt().await? {
                Attempt::Done(value) => return Ok(Ok(value)),
                Attempt::Taken => {
                    if let Some(record) = self.find_purchase(request_id).await? {
                        return Ok(Err(record));
                    }
                }
            }
        }
        Err(LedgerError::contention(format!(
            "{what}: request_id {request_id} kept colliding with transactions that rolled back"
        )))
    }

    pub(crate) async fn order_with_flags(
        conn: &mut MySqlConnection,
        order_id: OrderId,
        user_id: UserId,
    ) -> Result<Option<(Order, bool, Option<ReleaseOf>)>, sqlx::Error> {
        let row = sqlx::query(&format!(
            "SELECT {ORDER_COLUMNS}, o.expires_at <= NOW(6) AS expired, \
             COALESCE(r.status = 'RELEASED' AND r.stock_returned = 0, 0) AS return_pending, \
             COALESCE(r.released_generation, 1) AS released_generation, \
             COALESCE(r.hold_id, 0) AS hold_id, COALESCE(r.generation, 1) AS hold_generation, \
             p.per_user_limit IS NOT NULL AS limited, \
             COALESCE(r.release_reason <> 'refund_withdrawn', 1) AS returns_units \
             FROM orders o LEFT JOIN inventory_reservation r ON r.request_id = o.request_id \
             LEFT JOIN products p ON p.product_id = o.product_id \
             WHERE o.id = ? AND o.user_id = ?"
        ))
        .bind(order_id.get())
        .bind(user_id.get())
        .fetch_optional(&mut *conn)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let order = rows::order(&row).map_err(rows::undecodable)?;
        let expired: bool = row.try_get("expired")?;
        let return_pending: bool = row.try_get("return_pending")?;
        let pending_return = if return_pending {
            Some(ReleaseOf::Reservation {
                generation: rows::generation(row.try_get("released_generation")?)
                    .map_err(rows::undecodable)?,
                hold: rows::hold(row.try_get("hold_generation")?, row.try_get("hold_id")?)
                    .map_err(rows::undecodable)?,
                user_id: order.user_id,
                quantity: order.quantity,
                limited: row.try_get::<bool, _>("limited")?,
                returns_units: row.try_get::<bool, _>("returns_units")?,
            })
        } else {
            None
        };
        Ok(Some((order, expired, pending_return)))
    }

    /// Runs one transition and reads the order back: None when no such order belongs
    /// to the user.
    pub(crate) async fn apply(
        &self,
        order_id: OrderId,
        user_id: UserId,
        to: OrderStatus,
        cancel_reason: Option<CancelReason>,
    ) -> Result<Option<Transitioned>, LedgerError> {
        let applied = self
            .run("order transition", || {
                self.transition(order_id, user_id, to, cancel_reason)
            })
            .await?;
        let found = self
            .run("read order", || async {
                let mut conn = self.pool().acquire().await?;
                Self::order_with_flags(&mut conn, order_id, user_id).await
            })
            .await?;
        Ok(found.map(|(order, expired, pending_return)| Transitioned {
            order,
            applied,
            expired,
            pending_return,
        }))
    }

    /// Moves an order out of PENDING_PAYMENT and its reservation out of PROCESSING, and
    /// the counters with them, in one transaction; `Ok(false)` when the conditional
    /// UPDATE matched nothing (another transition won, or the order is not this user's).
    pub(crate) async fn transition(
        &self,
        order_id: OrderId,
        user_id: UserId,
        to: OrderStatus,
        cancel_reason: Option<CancelReason>,
    ) -> Result<bool, sqlx::Error> {
        let mut tx = self.pool().begin().await?;
        if !move_order(&mut tx, order_id, user_id, to, cancel_reason).await? {
            tx.rollback().await?;
            return Ok(false);
        }
        let moved = MovedOrder::read(&mut tx, order_id).await?;
        if !moved
            .resolve_reservation(&mut tx, to, cancel_reason)
            .await?
        {
            // An order in PENDING_PAYMENT always has a PROCESSING reservation; anything
            // else is corruption, and nothing is changed.
            tx.rollback().await?;
            return Err(sqlx::Error::Protocol(format!(
                "order {order_id} is PENDING_PAYMENT but its reservation is not PROCESSING"
            )));
        }
        // Its events, in this transaction (before the hot row, to keep its lock short).
        let change = crate::outbox::Change::Resolved {
            order: crate::outbox::OrderRef {
                order_id,
                user_id,
                request_id: &moved.request_id,
                product_id: moved.product_id,
                quantity: moved.quantity,
            },
            to,
            cancel_reason,
        };
        crate::outbox::record(&mut tx, change).await?;
        moved.move_stock(&mut tx, order_id, to).await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn insert_restock(
        &self,
        action: &AdminAction,
        quantity: i64,
    ) -> Result<RecordRestock, sqlx::Error> {
        let (product_id, restock_id) = (action.product_id, &action.request_id);
        let mut tx = self.pool().begin().await?;
        let inserted = sqlx::query(
            "INSERT INTO restock_request (request_id, product_id, quantity) VALUES (?, ?, ?)",
        )
        .bind(restock_id.as_str())
        .bind(product_id.get())
        .bind(quantity)
        .execute(&mut *tx)
        .await;
        match inserted {
            Err(e) if is_duplicate(&e) => {
                tx.rollback().await?;
                return self
                    .recorded_restock(product_id, restock_id, quantity)
                    .await;
            }
            other => other?,
        };
        let updated = sqlx::query(
            "UPDATE product_inventory SET total_stock = total_stock + ?, \
             available_stock = available_stock + ?, version = version + 1 \
             WHERE product_id = ? AND total_stock + ? <= ?",
        )
        .bind(quantity)
        .bind(quantity)
        .bind(product_id.get())
        .bind(quantity)
        .bind(STOCK_MAX)
        .execute(&mut *tx)
        .await?;
        if updated.rows_affected() != 1 {
            tx.rollback().await?;
            return Ok(RecordRestock::TooLarge);
        }
        let (generation, applied) = land_restock(&mut tx, product_id, restock_id, quantity).await?;
        match log_restock(&mut tx, product_id, restock_id, quantity, &action.admin).await {
            // The request_id names another admin action in the operator's log.
            Err(e) if is_duplicate(&e) => {
                tx.rollback().await?;
                return Ok(RecordRestock::Conflict);
            }
            other => other?,
        }
        tx.commit().await?;
        Ok(RecordRestock::Recorded {
            applied,
            generation,
        })
    }

    /// Restock, replayed: the restock recorded before under `restock_id`, as recorded
    /// when it is this one, else a conflict.
    async fn recorded_restock(
        &self,
        product_id: ProductId,
        restock_id: &RequestId,
        quantity: i64,
    ) -> Result<RecordRestock, sqlx::Error> {
        let row = sqlx::query(
            "SELECT product_id, quantity, gate_applied, generation FROM restock_request \
             WHERE request_id = ?",
        )
        .bind(restock_id.as_str())
        .fetch_one(&self.pool())
        .await?;
        let same = row.try_get::<i64, _>("product_id")? == product_id.get()
            && row.try_get::<i64, _>("quantity")? == quantity;
        Ok(if same {
            RecordRestock::Recorded {
                applied: row.try_get("gate_applied")?,
                generation: rows::generation(row.try_get("generation")?)
                    .map_err(rows::undecodable)?,
            }
        } else {
            RecordRestock::Conflict
        })
    }

    async fn insert_product(&self, new: &NewProduct, by: &AdminName) -> Result<bool, sqlx::Error> {
        let mut tx = self.pool().begin().await?;
        let inserted = sqlx::query(
            "INSERT INTO products (product_id, name, per_user_limit, sale_starts_at, \
             sale_ends_at) VALUES (?, ?, ?, ?, ?)",
        )
        .bind(new.product_id.get())
        .bind(&new.name)
        .bind(new.per_user_limit)
        // As DATETIME parameters (NaiveDateTime, UTC like every session): sqlx sends a
        // DateTime<Utc> as a TIMESTAMP parameter, which MariaDB stores as NULL, silently,
        // outside TIMESTAMP's 1970–2038, so the window would vanish and the product sell
        // at once and forever. A DATETIME parameter holds the whole range the domain
        // accepts (`SALE_TIME_MIN`..=`SALE_TIME_MAX`) exactly.
        .bind(new.window.starts_at.map(|at| at.naive_utc()))
        .bind(new.window.ends_at.map(|at| at.naive_utc()))
        .execute(&mut *tx)
        .await;
        match inserted {
            Err(e) if is_duplicate(&e) => return Ok(false),
            other => other?,
        };
        sqlx::query(
            "INSERT INTO product_inventory (product_id, total_stock, available_stock) \
             VALUES (?, ?, ?)",
        )
        .bind(new.product_id.get())
        .bind(new.stock)
        .bind(new.stock)
        .execute(&mut *tx)
        .await?;
        log_creation(&mut tx, new, by).await?;
        tx.commit().await?;
        Ok(true)
    }
}

/// A creation's line in the operator's log: no request_id (the product id is its key),
/// nothing before, the definition and the stock after.
async fn log_creation(
    tx: &mut MySqlConnection,
    new: &NewProduct,
    by: &AdminName,
) -> Result<(), sqlx::Error> {
    let after = serde_json::json!({
        "name": new.name,
        "per_user_limit": new.per_user_limit,
        "sale_starts_at": new.window.starts_at,
        "sale_ends_at": new.window.ends_at,
        "stock": new.stock,
    });
    let line = Line {
        action: "create",
        asked: None,
        event: None,
        before: "null".to_owned(),
        after: after.to_string(),
    };
    log_line(tx, None, new.product_id, by, &line).await
}

/// A restock's line in the operator's log, in its transaction after the counters moved:
/// the counters before (read back less the units) and after, and the units asked for.
async fn log_restock(
    tx: &mut MySqlConnection,
    product_id: ProductId,
    restock_id: &RequestId,
    quantity: i64,
    by: &AdminName,
) -> Result<(), sqlx::Error> {
    let after = inventory_json(tx, product_id).await?;
    let mut before = after.clone();
    for counter in ["total", "available"] {
        let now = after[counter].as_i64();
        debug_assert!(now.is_some(), "counters are read as integers");
        before[counter] = (now.unwrap_or_default() - quantity).into();
    }
    let line = Line {
        action: "restock",
        asked: Some(serde_json::json!({ "quantity": quantity }).to_string()),
        event: None,
        before: before.to_string(),
        after: after.to_string(),
    };
    log_line(tx, Some(restock_id.as_str()), product_id, by, &line).await
}

/// Restock, land: under the inventory row's lock, the generation and the mode the restock
/// lands in, recorded on its request with its stock-log row; answers (generation, whether
/// the gate is owed nothing).
async fn land_restock(
    tx: &mut MySqlConnection,
    product_id: ProductId,
    restock_id: &RequestId,
    quantity: i64,
) -> Result<(Generation, bool), sqlx::Error> {
    // Holding the inventory row's lock, the generation and the mode are the ones the
    // restock lands in. In ledger mode the counters are where the stock is served, so
    // nothing is owed to the gate (its way back is a rebuild from the counters).
    let row =
        sqlx::query("SELECT generation, stock_mode FROM product_inventory WHERE product_id = ?")
            .bind(product_id.get())
            .fetch_one(&mut *tx)
            .await?;
    let generation = rows::generation(row.try_get("generation")?).map_err(rows::undecodable)?;
    let applied =
        rows::stock_mode(&row, "stock_mode").map_err(rows::undecodable)? == StockMode::Ledger;
    sqlx::query("UPDATE restock_request SET generation = ?, gate_applied = ? WHERE request_id = ?")
        .bind(generation.get())
        .bind(applied)
        .bind(restock_id.as_str())
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "INSERT INTO inventory_log (request_id, product_id, quantity, type) \
         VALUES (?, ?, ?, 'restock')",
    )
    .bind(restock_id.as_str())
    .bind(product_id.get())
    .bind(quantity)
    .execute(&mut *tx)
    .await?;
    Ok((generation, applied))
}

/// A release's generation and whether the gate is owed its part, written after the
/// counters moved. This transaction holds the inventory row's lock then, so the
/// generation read is the one the counters' change lands in: a rebuild either counted
/// this release already (it committed first) or comes after it. In ledger mode the units
/// are where the stock is served, in the counters: nothing is owed to the gate, whose way
/// back is a rebuild from them.
pub(crate) async fn stamp_release(
    tx: &mut MySqlConnection,
    product_id: i64,
    request_id: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE inventory_reservation r, product_inventory i \
         SET r.released_generation = i.generation, \
         r.stock_returned = (i.stock_mode = 'LEDGER') \
         WHERE i.product_id = ? AND r.request_id = ?",
    )
    .bind(product_id)
    .bind(request_id)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Transition, decide: the conditional UPDATE that moves the order out of
/// PENDING_PAYMENT; false when it matched nothing.
async fn move_order(
    tx: &mut MySqlConnection,
    order_id: OrderId,
    user_id: UserId,
    to: OrderStatus,
    cancel_reason: Option<CancelReason>,
) -> Result<bool, sqlx::Error> {
    let updated = match to {
        OrderStatus::Paid => {
            sqlx::query(
                "UPDATE orders SET status = 'PAID', paid_at = NOW(6) \
                 WHERE id = ? AND user_id = ? AND status = 'PENDING_PAYMENT' \
                 AND expires_at > NOW(6)",
            )
            .bind(order_id.get())
            .bind(user_id.get())
            .execute(&mut *tx)
            .await?
        }
        OrderStatus::Cancelled => {
            // Expiry is decided on the database's clock, in the same statement that
            // moves the order: no instance's clock can expire an order early, and pay
            // (which requires expires_at > NOW) and expiry can never both apply.
            let sql = if cancel_reason == Some(CancelReason::PaymentTimeout) {
                "UPDATE orders SET status = 'CANCELLED', cancelled_at = NOW(6), \
                 cancel_reason = ? \
                 WHERE id = ? AND user_id = ? AND status = 'PENDING_PAYMENT' \
                 AND expires_at <= NOW(6)"
            } else {
                "UPDATE orders SET status = 'CANCELLED', cancelled_at = NOW(6), \
                 cancel_reason = ? \
                 WHERE id = ? AND user_id = ? AND status = 'PENDING_PAYMENT'"
            };
            sqlx::query(sql)
                .bind(cancel_reason.map(CancelReason::as_str))
                .bind(order_id.get())
                .bind(user_id.get())
                .execute(&mut *tx)
                .await?
        }
        OrderStatus::PendingPayment | OrderStatus::Refunded => {
            // Pay and cancel are the buyer's transitions; a refund is the operator's
            // (`refunds.rs`), from PAID.
            debug_assert!(false, "no buyer's transition to {to}");
            return Err(sqlx::Error::Protocol(format!(
                "no buyer's transition to {to}"
            )));
        }
    };
    Ok(updated.rows_affected() == 1)
}

/// The order a transition moved, as its reservation, events and counters need it.
struct MovedOrder {
    request_id: String,
    product_id: i64,
    quantity: i32,
}

impl MovedOrder {
    /// Transition, read: the moved order's request_id, product and units.
    async fn read(tx: &mut MySqlConnection, order_id: OrderId) -> Result<Self, sqlx::Error> {
        let row = sqlx::query("SELECT request_id, product_id, quantity FROM orders WHERE id = ?")
            .bind(order_id.get())
            .fetch_one(&mut *tx)
            .await?;
        Ok(MovedOrder {
            request_id: row.try_get_unchecked("request_id")?,
            product_id: row.try_get("product_id")?,
            quantity: row.try_get("quantity")?,
        })
    }

    /// Transition, write the reservation: CONFIRMED for a payment, RELEASED for a
    /// cancellation; false when it was not PROCESSING.
    async fn resolve_reservation(
        &self,
        tx: &mut MySqlConnection,
        to: OrderStatus,
        cancel_reason: Option<CancelReason>,
    ) -> Result<bool, sqlx::Error> {
        let reservation_sql = match to {
            OrderStatus::Paid => {
                "UPDATE inventory_reservation SET status = 'CONFIRMED', resolved_at = NOW(6) \
                 WHERE request_id = ? AND status = 'PROCESSING'"
            }
            _ => {
                "UPDATE inventory_reservation SET status = 'RELEASED', resolved_at = NOW(6), \
                 release_reason = ?, stock_returned = 0 \
                 WHERE request_id = ? AND status = 'PROCESSING'"
            }
        };
        let mut reservation = sqlx::query(reservation_sql);
        if to == OrderStatus::Cancelled {
            let reason = cancel_reason.unwrap_or(CancelReason::UserCancelled);
            reservation = reservation.bind(ReleaseReason::for_cancel(reason).as_str());
        }
        let reserved = reservation.bind(&self.request_id).execute(&mut *tx).await?;
        Ok(reserved.rows_affected() == 1)
    }

    /// Transition, write the stock: the counters, where a release's units went, and the
    /// stock log's row.
    async fn move_stock(
        &self,
        tx: &mut MySqlConnection,
        order_id: OrderId,
        to: OrderStatus,
    ) -> Result<(), sqlx::Error> {
        let (inventory_sql, log_type) = match to {
            OrderStatus::Paid => (
                "UPDATE product_inventory SET pre_deduct_stock = pre_deduct_stock - ?, \
                 sold_count = sold_count + ?, version = version + 1 WHERE product_id = ?",
                "confirm",
            ),
            _ => (
                "UPDATE product_inventory SET pre_deduct_stock = pre_deduct_stock - ?, \
                 available_stock = available_stock + ?, version = version + 1 \
                 WHERE product_id = ?",
                "release",
            ),
        };
        sqlx::query(inventory_sql)
            .bind(self.quantity)
            .bind(self.quantity)
            .bind(self.product_id)
            .execute(&mut *tx)
            .await?;
        if to == OrderStatus::Cancelled {
            stamp_release(tx, self.product_id, &self.request_id).await?;
        }
        sqlx::query(
            "INSERT INTO inventory_log (request_id, product_id, order_id, quantity, type) \
             VALUES (?, ?, ?, ?, ?)",
        )
        .bind(&self.request_id)
        .bind(self.product_id)
        .bind(order_id.get())
        .bind(self.quantity)
        .bind(log_type)
        .execute(&mut *tx)
        .await?;
        Ok(())
    }
}

#[async_trait]
impl Ledger for MysqlLedger {
    async fn ping(&self) -> Result<(), LedgerError> {
        self.run("ping", || async {
            sqlx::query("SELECT 1")
                .execute(&self.pool())
                .await
                .map(drop)
        })
        .await
    }

    async fn create_product(
        &self,
        new: &NewProduct,
        by: &AdminName,
    ) -> Result<CreateProduct, LedgerError> {
        let created = self
            .run("create product", || self.insert_product(new, by))
            .await?;
        let product = self
            .product(new.product_id)
            .await?
            .ok_or_else(|| corrupt("product vanished after insert"))?;
        if created {
            return Ok(CreateProduct::Created(product));
        }
        let counters = self
            .inventory(new.product_id)
            .await?
            .ok_or_else(|| corrupt("product without inventory"))?;
        Ok(CreateProduct::Exists(product, counters.total))
    }

    async fn product(&self, product_id: ProductId) -> Result<Option<Product>, LedgerError> {
        let sql = "SELECT p.product_id, p.name, p.per_user_limit, p.sale_starts_at, \
                   p.sale_ends_at, p.stock_loaded, p.paused, p.created_at, i.stock_mode \
                   FROM products p LEFT JOIN product_inventory i ON i.product_id = p.product_id \
                   WHERE p.product_id = ?";
        let row = self.product_row("read product", sql, product_id).await?;
        row.as_ref().map(rows::product).transpose()
    }

    async fn generation(&self, product_id: ProductId) -> Result<Option<Generation>, LedgerError> {
        let generation: Option<i64> = self
            .run("read generation", || async {
                sqlx::query_scalar("SELECT generation FROM product_inventory WHERE product_id = ?")
                    .bind(product_id.get())
                    .fetch_optional(&self.pool())
                    .await
            })
            .await?;
        generation.map(rows::generation).transpose()
    }

    async fn mark_stock_loaded(&self, product_id: ProductId) -> Result<(), LedgerError> {
        self.run("mark stock loaded", || async {
            sqlx::query("UPDATE products SET stock_loaded = 1 WHERE product_id = ?")
                .bind(product_id.get())
                .execute(&self.pool())
                .await
        })
        .await
        .map(drop)
    }

    async fn inventory(
        &self,
        product_id: ProductId,
    ) -> Result<Option<InventoryCounters>, LedgerError> {
        let sql = "SELECT total_stock, available_stock, pre_deduct_stock, sold_count \
                   FROM product_inventory WHERE product_id = ?";
        let row = self.product_row("read inventory", sql, product_id).await?;
        let Some(row) = row else { return Ok(None) };
        Ok(Some(InventoryCounters {
            total: row.try_get("total_stock").map_err(db)?,
            available: row.try_get("available_stock").map_err(db)?,
            reserved: row.try_get("pre_deduct_stock").map_err(db)?,
            sold: row.try_get("sold_count").map_err(db)?,
        }))
    }

    async fn commit_purchase(&self, purchase: &HeldPurchase) -> Result<Commit, LedgerError> {
        self.in_flight.commit(self.group(), purchase.clone()).await
    }

    async fn join_commit(&self, purchase: &HeldPurchase) -> Option<Result<Commit, LedgerError>> {
        self.in_flight.join(purchase.clone()).await
    }

    async fn commit_ledger_purchase(
        &self,
        purchase: &LedgerPurchase,
    ) -> Result<Commit, LedgerError> {
        crate::group::committed(self.ledger_group().call(purchase.clone()).await)
    }

    async fn fence(
        &self,
        request: &PurchaseRequest,
        hold: HoldRef,
        reason: ReleaseReason,
    ) -> Result<Fence, LedgerError> {
        let outcome = self
            .purchase_or_taken("fence", &request.request_id, || {
                self.run("fence", move || self.insert_fence(request, hold, reason))
            })
            .await?;
        match outcome {
            Ok(true) => Ok(Fence::Fenced),
            Ok(false) => {
                self.gate_behind(request.product_id, hold).await?;
                Err(LedgerError::not_ready(format!(
                    "hold {} of generation {} was handed out twice; \
                     the gate lost writes and is being rebuilt",
                    hold.id, hold.generation
                )))
            }
            Err(record) => Ok(Fence::Duplicate(record)),
        }
    }

    async fn find_purchase(
        &self,
        request_id: &RequestId,
    ) -> Result<Option<PurchaseRecord>, LedgerError> {
        self.lookups()
            .call(request_id.clone())
            .await
            .map_err(|_| LedgerError::stopped("find purchase: the lookup batcher stopped"))?
    }

    async fn order(&self, order_id: OrderId) -> Result<Option<Order>, LedgerError> {
        let sql = format!("SELECT {ORDER_COLUMNS} FROM orders o WHERE o.id = ?");
        let row = self
            .run("read order", || async {
                sqlx::query(&sql)
                    .bind(order_id.get())
                    .fetch_optional(&self.pool())
                    .await
            })
            .await?;
        row.as_ref().map(rows::order).transpose()
    }

    async fn pay(
        &self,
        order_id: OrderId,
        user_id: UserId,
    ) -> Result<Option<PayAttempt>, LedgerError> {
        let found = self
            .apply(order_id, user_id, OrderStatus::Paid, None)
            .await?;
        Ok(found.map(|t| PayAttempt {
            order: t.order,
            applied: t.applied,
            expired: t.expired,
        }))
    }

    async fn cancel(
        &self,
        order_id: OrderId,
        user_id: UserId,
        reason: CancelReason,
    ) -> Result<Option<CancelAttempt>, LedgerError> {
        let found = self
            .apply(order_id, user_id, OrderStatus::Cancelled, Some(reason))
            .await?;
        Ok(found.map(CancelAttempt::from))
    }

    async fn mark_stock_returned(&self, request_id: &RequestId) -> Result<(), LedgerError> {
        self.run("mark stock returned", || async {
            sqlx::query(
                "UPDATE inventory_reservation SET stock_returned = 1 \
                 WHERE request_id = ? AND status = 'RELEASED'",
            )
            .bind(request_id.as_str())
            .execute(&self.pool())
            .await
        })
        .await
        .map(drop)
    }

    async fn record_restock(
        &self,
        action: &AdminAction,
        quantity: i64,
    ) -> Result<RecordRestock, LedgerError> {
        self.run("record restock", || self.insert_restock(action, quantity))
            .await
    }

    async fn mark_restock_applied(&self, restock_id: &RequestId) -> Result<(), LedgerError> {
        self.run("mark restock applied", || async {
            sqlx::query("UPDATE restock_request SET gate_applied = 1 WHERE request_id = ?")
                .bind(restock_id.as_str())
                .execute(&self.pool())
                .await
        })
        .await
        .map(drop)
    }

    async fn reservation_request_ids(
        &self,
        product_id: ProductId,
        max: usize,
    ) -> Result<Option<Vec<RequestId>>, LedgerError> {
        // One more than asked tells "more than max" from "exactly max"; the unique key
        // (product_id, generation, hold_id) serves the product's rows.
        let limit = i64::try_from(max).unwrap_or(i64::MAX - 1) + 1;
        let rows = self
            .run("reservation request ids", || async {
                sqlx::query(
                    "SELECT request_id FROM inventory_reservation WHERE product_id = ? LIMIT ?",
                )
                .bind(product_id.get())
                .bind(limit)
                .fetch_all(&self.pool())
                .await
            })
            .await?;
        if rows.len() > max {
            return Ok(None);
        }
        rows.iter()
            .map(|row| {
                let raw = rows::text(row, "request_id")?;
                RequestId::stored("request_id", &raw).map_err(|e| {
                    LedgerError::corrupt(format!("reservation holds a bad request_id: {e}"))
                })
            })
            .collect::<Result<_, _>>()
            .map(Some)
    }
}
