//! Group commit: many purchases in one transaction, with multi-row INSERTs and one
//! counter UPDATE per product — the same rows, counters and events as one purchase's
//! transaction (`MysqlLedger::insert_purchase`), written for a whole batch at once,
//! per-user limits included. A batch that meets anything but the plain case (a
//! request_id or hold id already taken, a user over a limit, too few units, a rebuilt
//! generation, a statement the database refuses) is rolled back whole. What happens
//! next — which purchases are set aside and committed one by one, where each such case
//! has its answer, and which go together again — is decided by
//! `flashsale_app::group::GroupCommit`, which `MysqlLedger::group_commit` feeds with what
//! each transaction did.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, NaiveDate, Utc};
use flashsale_app::group::{self, GroupCommit, Held, OverLimit};
use flashsale_app::ports::{Commit, HeldPurchase, LedgerError};
use flashsale_batch::Coalescer;
use flashsale_core::{
    Generation, OrderId, OrderStatus, ProductId, PurchaseRequest, RequestId, UserId,
};
use sqlx::{MySqlConnection, Row};
use tokio::sync::oneshot;

use flashsale_app::{Order, PurchaseOutcome, PurchaseRecord};

/// What a batch's group transactions came to, once `GroupCommit` had nothing more to
/// try: the gate's batches and the ledger mode's share it.
pub(crate) struct Decided {
    answers: Vec<group::Answer>,
    /// The committed transaction's orders, in its members' order (taken as answered).
    orders: Vec<Option<Order>>,
    /// The error of a transaction whose outcome is unknown.
    error: Option<LedgerError>,
}

impl Decided {
    /// Runs the group transactions `GroupCommit` asks for over the batch of `requests`:
    /// `attempt(members)` runs one over those members (indices into the batch, in batch
    /// order) and says what it wrote, with the orders it committed in members' order.
    pub(crate) async fn run<'a, F, Fut>(
        requests: impl IntoIterator<Item = &'a PurchaseRequest>,
        mut attempt: F,
    ) -> Self
    where
        F: FnMut(Vec<usize>) -> Fut,
        Fut: std::future::Future<Output = Result<(group::Written, Vec<Order>), LedgerError>>,
    {
        let mut decision = GroupCommit::new(requests);
        let mut orders = Vec::new();
        let mut error = None;
        while let Some(plain) = decision.next() {
            let members = plain.len();
            let written = attempt(plain.to_vec()).await;
            decision.written(match written {
                Ok((written, committed)) => {
                    // A transaction that wrote its orders returns one per member
                    // (`returned_orders`); any other wrote none.
                    debug_assert_eq!(
                        committed.len(),
                        if matches!(written, group::Written::Orders) {
                            members
                        } else {
                            0
                        },
                        "orders of a group transaction"
                    );
                    orders = committed.into_iter().map(Some).collect();
                    written
                }
                // Unknown whether it committed: each caller hears so and retries; the
                // unique keys make a retry find the order if it did.
                Err(e) => {
                    error = Some(e);
                    group::Written::Unknown
                }
            });
        }
        Self {
            answers: decision.answers(),
            orders,
            error,
        }
    }

    /// The members set aside, to be committed one by one (indices, in batch order).
    pub(crate) fn aside(&self) -> Vec<usize> {
        (0..self.answers.len())
            .filter(|&i| self.answers[i] == group::Answer::OneByOne)
            .collect()
    }

    /// Each member's answer: its order from the group transaction, that transaction's
    /// unknown outcome, or the next of `one_by_one` (the answers of [`Self::aside`]'s
    /// members, in that order).
    pub(crate) fn answers(
        mut self,
        one_by_one: impl IntoIterator<Item = Result<Commit, LedgerError>>,
    ) -> Vec<Result<Commit, LedgerError>> {
        let mut one_by_one = one_by_one.into_iter();
        let lost = || LedgerError::stopped("group commit: no answer");
        let answers = std::mem::take(&mut self.answers);
        answers
            .into_iter()
            .map(|answer| match answer {
                group::Answer::Committed(n) => {
                    let order = self.orders.get_mut(n).and_then(Option::take);
                    // The committed transaction's n-th member: its order, taken once.
                    debug_assert!(
                        order.is_some(),
                        "group member {n} committed without an order"
                    );
                    order.map(Commit::Committed).ok_or_else(lost)
                }
                group::Answer::Unknown => {
                    // Only a transaction that failed leaves its members unknown.
                    debug_assert!(
                        self.error.is_some(),
                        "a group's outcome unknown without its error"
                    );
                    Err(self.error.clone().unwrap_or_else(lost))
                }
                group::Answer::OneByOne => {
                    let answer = one_by_one.next();
                    // The caller committed each member `aside` named, in that order.
                    debug_assert!(answer.is_some(), "fewer one-by-one answers than set aside");
                    answer.unwrap_or_else(|| Err(lost()))
                }
            })
            .collect()
    }
}

/// Whose counters a batch's [`insert`] updates, and so where its transaction begins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counters {
    /// Gate holds: one UPDATE per product in the script, after the rows (the hot row's
    /// lock held only from there to COMMIT), each requiring gate mode and the holds'
    /// generation. Nothing comes before the script, so its first statement is the
    /// transaction's BEGIN: under load a round trip of its own took about 0.3 ms of a
    /// 1.7–2 ms group commit.
    Gate,
    /// Ledger purchases: [`take_ledger_units`] updated them first, as it hands out the
    /// hold ids the rows are written with, in the transaction [`begin`] opened.
    Taken,
}

/// What [`insert`] wrote.
pub(crate) enum Written {
    /// Every purchase, in batch order: the caller commits.
    Orders(Vec<Order>),
    /// These (user, product) pairs would hold more than the product's per-user limit:
    /// the caller rolls back (which of their purchases stay is the decision's,
    /// `flashsale_app::group`).
    OverLimit(OverLimit),
    /// Something else kept the batch from going the plain way: the caller rolls back.
    NotPlain,
}

/// A purchase queued for the group committer, with the [`Ticket`] of its entry in
/// [`InFlight`] when it is the first commit of its hold.
pub(crate) type Queued = (HeldPurchase, Option<Ticket>);

/// The group committer: queued purchases in, each one's answer out.
pub(crate) type Committer = Coalescer<Queued, Result<Commit, LedgerError>>;

/// A commit in flight: its purchase, and the callers waiting for its answer besides the
/// one that queued it.
struct Entry {
    purchase: HeldPurchase,
    /// At most one per request in flight over HTTP (`FLASHSALE_IN_FLIGHT_MAX` bounds
    /// those): each is a client retry of this very hold.
    joiners: Vec<oneshot::Sender<Result<Commit, LedgerError>>>,
}

type Entries = Arc<Mutex<HashMap<RequestId, Entry>>>;

/// The group commits queued or running in this process, by request_id. A second commit
/// of the very same hold (a client retry that found the first attempt's hold in Redis
/// while that attempt is still committing) waits for the first one's answer instead of
/// queuing a second copy: the copy would only meet the taken request_id, cost a rolled
/// back group transaction and a one-by-one commit, and end with the same answer: the
/// order as `Duplicate` (this hold's record), or the same refusal or error.
///
/// An entry lives exactly as long as its purchase's [`Ticket`], which travels with the
/// purchase through the committer's queue: the committer answers the joiners and removes
/// the entry once the batch is decided ([`Ticket::finish`]), whether or not the caller
/// that queued it is still waiting (a client that hung up); a purchase dropped before the
/// batch ran (its caller gone while waiting for room in the queue, the committer stopped)
/// removes it as it goes, and its joiners hear "unknown". No task of its own: spawning
/// one per commit, with a shared future for the joiners, cost about 3,000 instructions
/// per order.
#[derive(Default)]
pub(crate) struct InFlight {
    commits: Entries,
}

impl InFlight {
    /// Commits `purchase` through `group`, or joins the commit of the same hold already
    /// in flight. A different hold under the same request_id is committed on its own:
    /// the ledger's unique key decides between the two.
    pub(crate) async fn commit(
        &self,
        group: &Committer,
        purchase: HeldPurchase,
    ) -> Result<Commit, LedgerError> {
        let turn = {
            let mut commits = self.commits.lock().unwrap_or_else(|e| e.into_inner());
            match commits.get_mut(&purchase.request.request_id) {
                Some(entry) if entry.purchase == purchase => Err(entry.joined()),
                // Another hold under this request_id: on its own.
                Some(_) => Ok(None),
                None => {
                    let request_id = purchase.request.request_id.clone();
                    let entry = Entry {
                        purchase: purchase.clone(),
                        joiners: Vec::new(),
                    };
                    commits.insert(request_id.clone(), entry);
                    Ok(Some(Ticket {
                        commits: self.commits.clone(),
                        request_id,
                        finished: false,
                    }))
                }
            }
        };
        match turn {
            Ok(ticket) => committed(group.call((purchase, ticket)).await),
            Err(joined) => Self::joined(purchase, joined).await,
        }
    }

    /// Joins the commit of `purchase` when this very hold is committing here now, for its
    /// answer as [`Self::commit`] gives a joiner; None when none is in flight (none began,
    /// or its batch was decided and its entry is gone: the ledger then has the outcome).
    pub(crate) async fn join(&self, purchase: HeldPurchase) -> Option<Result<Commit, LedgerError>> {
        let joined = {
            let mut commits = self.commits.lock().unwrap_or_else(|e| e.into_inner());
            match commits.get_mut(&purchase.request.request_id) {
                Some(entry) if entry.purchase == purchase => entry.joined(),
                _ => return None,
            }
        };
        Some(Self::joined(purchase, joined).await)
    }

    /// The first commit's answer; an order it created is, to this caller, the request_id
    /// already taken by this very hold.
    async fn joined(
        purchase: HeldPurchase,
        joined: oneshot::Receiver<Result<Commit, LedgerError>>,
    ) -> Result<Commit, LedgerError> {
        let answer = joined.await.map_err(|_| {
            LedgerError::stopped("commit purchase: the commit joined was dropped; outcome unknown")
        })?;
        answer.map(|answer| match answer {
            Commit::Committed(order) => Commit::Duplicate(PurchaseRecord {
                request: purchase.request,
                hold: purchase.hold,
                outcome: PurchaseOutcome::Order(order),
            }),
            other => other,
        })
    }
}

impl Entry {
    /// A new joiner's receiver of the commit's answer.
    fn joined(&mut self) -> oneshot::Receiver<Result<Commit, LedgerError>> {
        let (answer, joined) = oneshot::channel();
        self.joiners.push(answer);
        joined
    }
}

/// The first commit of a hold's entry in [`InFlight`]; the entry goes when this does.
pub(crate) struct Ticket {
    commits: Entries,
    request_id: RequestId,
    finished: bool,
}

impl Ticket {
    /// Hands `answer` to the commit's joiners and removes its entry: called by the
    /// committer once the purchase's answer is decided.
    pub(crate) fn finish(mut self, answer: &Result<Commit, LedgerError>) {
        self.finished = true;
        if let Some(entry) = self.remove() {
            for joiner in entry.joiners {
                // A joiner that went away needs no answer.
                let _ = joiner.send(answer.clone());
            }
        }
    }

    fn remove(&self) -> Option<Entry> {
        let removed = self
            .commits
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.request_id);
        // Only a ticket removes its entry, and an entry is inserted only where none is:
        // while the ticket lives, the entry under its request_id is its own.
        debug_assert!(
            removed.is_some(),
            "in-flight entry of {} gone",
            self.request_id
        );
        removed
    }
}

impl Drop for Ticket {
    /// A purchase dropped unanswered (never queued, or its batch gone): its entry goes,
    /// and its joiners, their senders dropped, hear "unknown".
    fn drop(&mut self) {
        if !self.finished {
            self.remove();
        }
    }
}

/// A group committer's answer, its loss (the committer stopped) an unknown outcome.
pub(crate) fn committed(
    answer: Result<Result<Commit, LedgerError>, flashsale_batch::Lost>,
) -> Result<Commit, LedgerError> {
    answer.map_err(|_| {
        LedgerError::stopped("commit purchase: the group committer stopped; outcome unknown")
    })?
}

/// The batch as one JSON document: `[request_id, product_id, user_id, quantity,
/// hold_id, generation, payment timeout in µs, per-user limit or null]` per purchase.
/// A group transaction through the procedure reads the batch from it (set once per
/// transaction, [`insert`]; the stored procedure of migration `…13_batch_facts.sql` reads
/// the same positions: change both together; a listed batch needs none), and [`taken`]
/// binds it as its single
/// parameter: one statement text for every batch size (an `IN (?, ?, …)` list of each
/// new length was a new statement to prepare, about one in five executions).
pub(crate) fn document(batch: &[HeldPurchase]) -> String {
    let rows: Vec<_> = batch
        .iter()
        .map(|p| {
            (
                p.request.request_id.as_str(),
                p.request.product_id.get(),
                p.request.user_id.get(),
                p.request.quantity.get(),
                p.hold.id.get(),
                p.hold.generation.get(),
                crate::sql::micros(p.terms.payment_timeout),
                p.terms.per_user_limit,
            )
        })
        .collect();
    // Strings, integers and tuples: serializing cannot fail.
    serde_json::to_string(&rows).unwrap_or_default()
}

/// [`document`] as a table `b`, read from `$doc` (a placeholder, or [`batch_variable`],
/// which the group transaction's script sets). request_id compares as the tables' binary
/// collation does, so the joins use the unique keys. The statements read it in no
/// particular order: nothing depends on the order rows are written in (orders are matched
/// back by request_id), and an `ORDER BY` over `JSON_TABLE` costs a sort through a
/// temporary table, about a third of each INSERT's time.
macro_rules! batch_table {
    ($($doc:tt)+) => {
        concat!(
            "JSON_TABLE(",
            $($doc)+,
            ", '$[*]' COLUMNS (\
         request_id VARCHAR(84) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[0]', \
         product_id BIGINT PATH '$[1]', user_id BIGINT PATH '$[2]', quantity INT PATH '$[3]', \
         hold_id BIGINT PATH '$[4]', generation BIGINT PATH '$[5]', \
         timeout_us BIGINT PATH '$[6]', user_limit BIGINT PATH '$[7]')) AS b"
        )
    };
}

/// The user variable that holds the batch's [`document`] for the statements of one
/// group transaction's script (`batch_table!(batch_variable!())`), cleared at its end.
macro_rules! batch_variable {
    () => {
        "@fs_batch"
    };
}

/// A batch document of request_ids alone (`[[request_id], …]`), for [`taken`] when the
/// batch's holds are not known (a ledger batch rolled back before it handed them out):
/// the other columns read as NULL.
pub(crate) fn request_ids_document<'a>(ids: impl Iterator<Item = &'a RequestId>) -> String {
    let rows: Vec<[&str; 1]> = ids.map(|id| [id.as_str()]).collect();
    // Strings only: serializing cannot fail.
    serde_json::to_string(&rows).unwrap_or_default()
}

/// The request_ids of `batch` already taken in the ledger (committed by now).
pub(crate) async fn taken(
    pool: &sqlx::MySqlPool,
    document: &str,
) -> Result<BTreeSet<RequestId>, sqlx::Error> {
    sqlx::query(concat!(
        "SELECT CONVERT(r.request_id USING utf8mb4) AS request_id FROM ",
        batch_table!("?"),
        " JOIN inventory_reservation r ON r.request_id = b.request_id"
    ))
    .bind(document)
    .fetch_all(pool)
    .await?
    .iter()
    .map(|row| {
        let raw: String = row.try_get_unchecked("request_id")?;
        RequestId::stored("request_id", &raw).map_err(|e| sqlx::Error::Decode(e.into()))
    })
    .collect()
}

/// The rows of the batch in `@fs_batch` ([`batch_variable`]): its reservations and
/// orders, by the stored procedure of migration `…13_batch_facts.sql` (a procedure is
/// parsed once per connection; sent as text, its statements were parsed on every
/// commit). Its one result set is the new orders' ids and times (`INSERT … RETURNING`).
const ROWS: &str = "CALL group_commit_insert()";
/// Most purchases of a batch written as `VALUES` lists in the script rather than through
/// [`ROWS`] (a batch without a per-user limit). The procedure's two `JSON_TABLE`s cost
/// MariaDB about 90 µs a group transaction more than lists, and lists about 2 µs a
/// purchase more to parse, so lists are cheaper below about 45 purchases; 32 keeps a
/// margin.
const LISTED_BATCH_MAX: usize = 32;
/// Of the batch's (user, product) pairs under a per-user limit, those whose live orders,
/// the batch's own included, add up to more than it: the ledger's own per-user check, as
/// Redis's per-user counts can be lost. Runs after the batch's products' rows were
/// locked (the counter UPDATEs), which orders the purchases of each product; the session
/// reads READ COMMITTED, so this sees every order of them committed before.
const OVER_LIMIT: &str = concat!(
    "SELECT u.user_id, u.product_id, u.user_limit, \
     (SELECT CAST(COALESCE(SUM(o.quantity), 0) AS SIGNED) FROM orders o \
     WHERE o.user_id = u.user_id AND o.product_id = u.product_id \
     AND o.status IN ('PENDING_PAYMENT', 'PAID')) AS units \
     FROM (SELECT b.user_id, b.product_id, MIN(b.user_limit) AS user_limit FROM ",
    batch_table!(batch_variable!()),
    " WHERE b.user_limit IS NOT NULL GROUP BY b.user_id, b.product_id) u \
     HAVING units > u.user_limit"
);

/// The rows of `batch` as two INSERTs of `VALUES` lists, as [`ROWS`] writes them from the
/// batch's document: per purchase its reservation (PROCESSING) and its order
/// (PENDING_PAYMENT, created at the statement's `NOW(6)`, expiring its payment timeout
/// later), the orders' ids and times returned. Integers, and request_ids as literals
/// ([`push_sql_literal`]).
fn push_listed_rows(script: &mut String, batch: &[HeldPurchase]) {
    let mut digits = itoa::Buffer::new();
    // One row: `(request_id, the integers…, tail)`, after a comma but for the first.
    let mut row = |script: &mut String, first: bool, p: &HeldPurchase, ints: &[i64], tail: &str| {
        script.push_str(if first { "(" } else { ", (" });
        push_sql_literal(script, p.request.request_id.as_str());
        for &n in ints {
            script.push_str(", ");
            script.push_str(digits.format(n));
        }
        script.push_str(tail);
    };
    script.push_str(
        "INSERT INTO inventory_reservation \
         (request_id, product_id, user_id, quantity, hold_id, generation, status) VALUES ",
    );
    for (i, p) in batch.iter().enumerate() {
        let (product, user) = (p.request.product_id.get(), p.request.user_id.get());
        let quantity = i64::from(p.request.quantity.get());
        let hold = [p.hold.id.get(), p.hold.generation.get()];
        row(
            script,
            i == 0,
            p,
            &[product, user, quantity, hold[0], hold[1]],
            ", 'PROCESSING')",
        );
    }
    script.push_str(
        ";\nINSERT INTO orders \
         (request_id, user_id, product_id, quantity, status, created_at, expires_at) VALUES ",
    );
    for (i, p) in batch.iter().enumerate() {
        let (product, user) = (p.request.product_id.get(), p.request.user_id.get());
        let quantity = i64::from(p.request.quantity.get());
        let timeout = crate::sql::micros(p.terms.payment_timeout);
        row(
            script,
            i == 0,
            p,
            &[user, product, quantity],
            ", 'PENDING_PAYMENT', NOW(6)",
        );
        script.push_str(", NOW(6) + INTERVAL ");
        script.push_str(itoa::Buffer::new().format(timeout));
        script.push_str(" MICROSECOND)");
    }
    script.push_str(
        " RETURNING id, CONVERT(request_id USING utf8mb4) AS request_id, created_at, \
         expires_at;\n",
    );
}

/// Appends `text` as a MariaDB string literal that means the same in every `sql_mode`:
/// quoted as it is when it is printable ASCII without a quote or a backslash (what a
/// batch of request_ids, ids and numbers is; nothing in it can end the literal or
/// escape), else [`hex_literal`]. Half the bytes of hex, and no digit pair per byte to
/// write: the hex form of the batch and its events cost the server about 3,800
/// instructions per order. Written into the script
/// itself, so the text is copied once.
fn push_sql_literal(out: &mut String, text: &str) {
    if printable_without(text, [b'\'', b'\\']) {
        out.reserve(text.len() + 2);
        out.push('\'');
        out.push_str(text);
        out.push('\'');
    } else {
        out.push_str(&hex_literal(text));
    }
}

/// Whether `text` is printable ASCII (space to `~`) holding neither of `excluded`. Every
/// byte is looked at, with no early exit, so that the loop runs on vectors: with one, a
/// batch's texts cost a group commit about 9 instructions a byte.
fn printable_without(text: &str, excluded: [u8; 2]) -> bool {
    text.bytes().fold(true, |plain, b| {
        plain & (b' '..=b'~').contains(&b) & (b != excluded[0]) & (b != excluded[1])
    })
}

/// `text` as a MariaDB hexadecimal literal, `X'…'`: only hex digits reach the SQL text,
/// whatever the text holds. Written as bytes: a `String::push` per digit cost a
/// group commit about 2,000 instructions per purchase.
fn hex_literal(text: &str) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = vec![b'\''; text.len() * 2 + 3];
    out[0] = b'X';
    // Two digits a byte, between the opening quote and the closing one.
    for (pair, b) in out[2..].chunks_exact_mut(2).zip(text.bytes()) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 0x0f)];
    }
    // Hex digits and quotes only, always UTF-8; were it not, an empty text would fail
    // the statement, never reach the database as anything else.
    String::from_utf8(out).unwrap_or_default()
}

/// A `DATETIME(6)` column of a text-protocol result (a script's), read field by field.
/// sqlx reads it with chrono's format-string parser, which cost a group commit about 2,700
/// instructions per value, about 4 % of the server's work per order
/// (`scripts/instructions.sh`).
fn text_datetime(row: &sqlx::mysql::MySqlRow, column: &str) -> Result<DateTime<Utc>, sqlx::Error> {
    let raw: &str = row.try_get_unchecked(column)?;
    parse_datetime(raw)
        .ok_or_else(|| sqlx::Error::Decode(format!("{column}: {raw:?} is not a DATETIME").into()))
}

/// `YYYY-MM-DD hh:mm:ss` with an optional fraction of one to six digits, as MariaDB writes
/// a `DATETIME` in text, as UTC (the connections' time zone); `None` for anything else.
fn parse_datetime(raw: &str) -> Option<DateTime<Utc>> {
    let digits = |from: usize, to: usize| -> Option<u32> {
        let field = raw.get(from..to)?;
        if field.is_empty() || !field.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        field.parse().ok()
    };
    let bytes = raw.as_bytes();
    let separators = [(4, b'-'), (7, b'-'), (10, b' '), (13, b':'), (16, b':')];
    if bytes.len() < 19 || separators.iter().any(|&(at, c)| bytes[at] != c) {
        return None;
    }
    let micros = match bytes.len() {
        19 => 0,
        len if (21..=26).contains(&len) && bytes[19] == b'.' => {
            digits(20, len)? * 10u32.pow(u32::try_from(26 - len).ok()?)
        }
        _ => return None,
    };
    let date = NaiveDate::from_ymd_opt(
        i32::try_from(digits(0, 4)?).ok()?,
        digits(5, 7)?,
        digits(8, 10)?,
    )?;
    let time = date.and_hms_micro_opt(digits(11, 13)?, digits(14, 16)?, digits(17, 19)?, micros)?;
    Some(time.and_utc())
}

/// The results of one statement of a script: its rows, and the rows it changed.
#[derive(Default)]
struct Outcome {
    rows: Vec<sqlx::mysql::MySqlRow>,
    affected: u64,
}

/// Runs `script`, statements separated by `;`, in one round trip (the text protocol's
/// multi-statement query), and returns each statement's [`Outcome`] in order. On an
/// error, the server stops at the failing statement: `Err` says which one (its index)
/// and why; the statements before it took effect (the caller's transaction rolls back).
async fn run_script(
    tx: &mut MySqlConnection,
    script: &str,
) -> Result<Vec<Outcome>, (usize, sqlx::Error)> {
    use futures::TryStreamExt;
    let mut outcomes = Vec::new();
    let mut current = Outcome::default();
    let mut results = sqlx::raw_sql(script).fetch_many(&mut *tx);
    loop {
        match results.try_next().await {
            Ok(Some(sqlx::Either::Right(row))) => current.rows.push(row),
            Ok(Some(sqlx::Either::Left(done))) => {
                current.affected = done.rows_affected();
                outcomes.push(std::mem::take(&mut current));
            }
            Ok(None) => return Ok(outcomes),
            Err(e) => return Err((outcomes.len(), e)),
        }
    }
}

/// Writes every purchase of `batch` in a group
/// transaction on `tx` (begun by the script for [`Counters::Gate`], by [`begin`] before
/// for [`Counters::Taken`]), but for their events: [`end`] writes those with the COMMIT
/// for [`Written::Orders`], and rolls back any other answer, whatever this returned.
///
/// The whole write is one script, sent in one round trip: the batch into a user
/// variable, the stored procedure that inserts the reservations and the orders
/// (returning their ids, [`ROWS`]) or, for a small batch without a per-user limit, the
/// same rows as lists ([`push_listed_rows`]), per product and generation the stock-log
/// row of the units the batch moves, one counter UPDATE per product, and the per-user
/// check when a product has a limit. Measured against one round trip per statement
/// (eight with the BEGIN, the read-back and the COMMIT): +8 % orders/s; the procedure
/// instead of the four INSERTs as text: +1–8 %; lists for small batches: MariaDB −4 %
/// per order at 64 connections.
pub(crate) async fn insert(
    tx: &mut MySqlConnection,
    batch: &[HeldPurchase],
    counters: Counters,
) -> Result<Written, sqlx::Error> {
    let plan = Plan::of(batch, counters);
    let script = plan.script(batch);
    let outcomes = match run_script(tx, &script).await {
        Ok(outcomes) => outcomes,
        // A request_id or a hold id taken: the one-by-one path tells which and answers.
        Err((at, e))
            if (plan.rows_at..=plan.orders_at).contains(&at) && crate::sql::is_duplicate(&e) =>
        {
            return Ok(Written::NotPlain)
        }
        // Refused by the database for any other reason (a value too long, a constraint, a
        // read-only server) before COMMIT: the transaction commits nothing, so the
        // outcome is known. Each purchase goes on its own, where a refusal is that
        // purchase's alone, instead of the whole batch answering "unknown". A deadlock or
        // a lock wait timeout goes back to the caller, which tries the batch again.
        Err((at, e @ sqlx::Error::Database(_))) if !crate::sql::is_retryable(&e) => {
            tracing::warn!(
                statement = at,
                size = batch.len(),
                error = %e,
                "group transaction refused; its purchases go one by one"
            );
            return Ok(Written::NotPlain);
        }
        Err((_, e)) => return Err(e),
    };
    plan.answered_all(&outcomes)?;
    let counters_end = plan.counters_at + plan.units.len();
    if outcomes[plan.counters_at..counters_end]
        .iter()
        .any(|o| o.affected != 1)
    {
        return Ok(Written::NotPlain);
    }
    let orders = returned_orders(batch, &outcomes[plan.orders_at].rows)?;
    if plan.limited {
        let over = over_limit(batch, &outcomes[counters_end].rows)?;
        if !over.is_empty() {
            return Ok(Written::OverLimit(over));
        }
    }
    Ok(Written::Orders(orders))
}

/// What [`insert`]'s script for one batch holds, and where each statement's results
/// fall among the script's results.
struct Plan {
    /// Per product and generation, the purchases and units of the batch: the stock log's
    /// rows.
    moved: BTreeMap<(ProductId, Generation), (u32, i64)>,
    /// Per product and generation, the units of a gate batch's counter UPDATE (a ledger
    /// batch's moved already: none).
    units: Vec<((ProductId, Generation), i64)>,
    /// A product of the batch has a per-user limit: the script ends with its check.
    limited: bool,
    /// The script begins the transaction ([`Counters::Gate`]).
    begins: bool,
    /// The rows go as `VALUES` lists ([`push_listed_rows`]), not through [`ROWS`].
    listed: bool,
    /// The result of the first statement that inserts the rows.
    rows_at: usize,
    /// The result that holds the new orders' rows.
    orders_at: usize,
    /// The result of the first counter UPDATE.
    counters_at: usize,
}

impl Plan {
    /// Plans the script of `batch`: what it moves per product and generation, and how
    /// its rows are written.
    fn of(batch: &[HeldPurchase], counters: Counters) -> Plan {
        // The hot rows last, in product order (two batches never wait on each other in a
        // cycle), each once for all its units; the conditions as in the one-purchase path.
        let mut moved: BTreeMap<(ProductId, Generation), (u32, i64)> = BTreeMap::new();
        for p in batch {
            let entry = moved
                .entry((p.request.product_id, p.hold.generation))
                .or_default();
            entry.0 += 1;
            entry.1 += i64::from(p.request.quantity.get());
        }
        let units: Vec<((ProductId, Generation), i64)> = match counters {
            Counters::Gate => moved.iter().map(|(&key, &(_, q))| (key, q)).collect(),
            Counters::Taken => Vec::new(),
        };
        let limited = batch.iter().any(|p| p.terms.per_user_limit.is_some());
        let begins = counters == Counters::Gate;
        // A small batch without a per-user limit (whose check reads the batch's variable)
        // writes its rows as lists; any other through the procedure.
        let listed = !limited && batch.len() <= LISTED_BATCH_MAX;
        // Results in the script, after the BEGIN's where it has one. Listed: the
        // reservations' INSERT, then the orders' with their rows. Through the procedure:
        // the batch's SET, then the procedure's result set, the orders, and the
        // procedure's own (an error while it inserts the reservations or the orders comes
        // before its result set ends). The stock-log rows and the counters follow.
        let rows_at = usize::from(begins) + usize::from(!listed);
        let orders_at = usize::from(begins) + 1;
        let counters_at = orders_at + if listed { 1 } else { 2 } + moved.len();
        Plan {
            moved,
            units,
            limited,
            begins,
            listed,
            rows_at,
            orders_at,
            counters_at,
        }
    }

    /// Writes the script of `batch`, its statements in the order the results are read.
    fn script(&self, batch: &[HeldPurchase]) -> String {
        let mut script = String::from(if self.begins { "BEGIN;\n" } else { "" });
        if self.listed {
            push_listed_rows(&mut script, batch);
        } else {
            script.push_str(concat!("SET ", batch_variable!(), " = CONVERT("));
            push_sql_literal(&mut script, &document(batch));
            script.push_str(" USING utf8mb4);\n");
            script.push_str(ROWS);
            script.push_str(";\n");
        }
        // Integers only: nothing of the batch's text enters the SQL here. Before the
        // counters, so that the hot rows' locks are held only from their UPDATE to COMMIT.
        for ((product_id, generation), (orders, q)) in &self.moved {
            let (product_id, generation) = (product_id.get(), generation.get());
            script.push_str(&format!(
                "INSERT INTO inventory_batch_log (product_id, generation, orders, quantity) \
                 VALUES ({product_id}, {generation}, {orders}, {q});\n"
            ));
        }
        for ((product_id, generation), q) in &self.units {
            let (product_id, generation) = (product_id.get(), generation.get());
            script.push_str(&format!(
                "UPDATE product_inventory SET available_stock = available_stock - {q}, \
                 pre_deduct_stock = pre_deduct_stock + {q}, version = version + 1 \
                 WHERE product_id = {product_id} AND available_stock >= {q} \
                 AND generation = {generation} AND stock_mode = 'GATE';\n"
            ));
        }
        if self.limited {
            script.push_str(OVER_LIMIT);
            script.push_str(";\n");
        }
        if !self.listed {
            script.push_str(concat!("SET ", batch_variable!(), " = NULL;\n"));
        }
        script
    }

    /// Checks that a script that ran to its end answered every statement: another count
    /// is a bug here or in the driver. Outside tests the batch answers "unknown" (503,
    /// and nothing is committed: `end` rolls back), and the log says why.
    fn answered_all(&self, outcomes: &[Outcome]) -> Result<(), sqlx::Error> {
        let expected = self.counters_at
            + self.units.len()
            + usize::from(self.limited)
            + usize::from(!self.listed);
        debug_assert_eq!(outcomes.len(), expected, "group transaction's results");
        if outcomes.len() != expected {
            tracing::error!(
                results = outcomes.len(),
                expected,
                "group transaction: results do not match its statements"
            );
            return Err(sqlx::Error::Protocol(format!(
                "group transaction: {} results for {expected} statements",
                outcomes.len()
            )));
        }
        Ok(())
    }
}

/// Reads the orders the group transaction's INSERT returned back into `batch`'s order,
/// each with its id and times.
fn returned_orders(
    batch: &[HeldPurchase],
    rows: &[sqlx::mysql::MySqlRow],
) -> Result<Vec<Order>, sqlx::Error> {
    let mut written: HashMap<String, (i64, _, _)> = HashMap::with_capacity(batch.len());
    for row in rows {
        let request_id: String = row.try_get_unchecked("request_id")?;
        written.insert(
            request_id,
            (
                row.try_get::<i64, _>("id")?,
                text_datetime(row, "created_at")?,
                text_datetime(row, "expires_at")?,
            ),
        );
    }
    let mut orders = Vec::with_capacity(batch.len());
    for p in batch {
        let Some(&(id, created_at, expires_at)) = written.get(p.request.request_id.as_str()) else {
            // The procedure inserts an order for every purchase of the batch or fails:
            // a missing one is a bug, loud in tests, "unknown" (nothing committed) outside.
            debug_assert!(false, "order of {} not returned", p.request.request_id);
            tracing::error!(
                request_id = %p.request.request_id,
                "group transaction: an order was not returned by its insert"
            );
            return Err(sqlx::Error::Protocol(format!(
                "order of {} not returned by its insert",
                p.request.request_id
            )));
        };
        orders.push(Order {
            order_id: OrderId::parse(id).map_err(|e| sqlx::Error::Decode(e.into()))?,
            request_id: p.request.request_id.clone(),
            user_id: p.request.user_id,
            product_id: p.request.product_id,
            quantity: p.request.quantity,
            status: OrderStatus::PendingPayment,
            created_at,
            expires_at,
            paid_at: None,
            cancelled_at: None,
            cancel_reason: None,
            refunded_at: None,
        });
    }
    Ok(orders)
}

/// Begins a group transaction on `conn` whose work comes before [`insert`]'s (the ledger
/// mode's units; a gate batch's script begins its own). Begun and ended by hand, not as
/// sqlx's `Transaction`, so that the BEGIN can go with the script and [`end`] can send
/// the events' INSERT with the COMMIT (sqlx sends each alone). Whatever [`insert`]
/// answers goes to [`end`], which ends the transaction on every path; a caller dropped
/// halfway drops its dedicated connection with it (`Taken` closes a connection not given
/// back), and the server rolls back.
pub(crate) async fn begin(conn: &mut MySqlConnection) -> Result<(), sqlx::Error> {
    sqlx::Executor::execute(&mut *conn, "BEGIN").await.map(drop)
}

/// Ends the group transaction that [`insert`] wrote on `conn`: for [`Written::Orders`],
/// one round trip with the pack of each product's `order_created` events ([`packs`])
/// and the COMMIT; for anything else a ROLLBACK, passing `written` on.
///
/// The server builds the packs from the orders the procedure returned: built in
/// MariaDB (the batch read again, joined to the orders, a `JSON_OBJECT` per event,
/// `GROUP_CONCAT`), they were about a fifth of its CPU per order (48.2 µs per order
/// against 38.8 with the packs built here).
pub(crate) async fn end(
    conn: &mut MySqlConnection,
    written: Result<Written, sqlx::Error>,
) -> Result<Written, sqlx::Error> {
    let orders = match written {
        Ok(Written::Orders(orders)) => orders,
        other => return roll_back(conn, other).await,
    };
    let mut script = packs(&orders);
    script.push_str(";\nCOMMIT");
    match run_script(conn, &script).await {
        Ok(_) => Ok(Written::Orders(orders)),
        // The events refused (the outbox's checks): nothing committed, as in `insert`.
        Err((0, e @ sqlx::Error::Database(_))) if !crate::sql::is_retryable(&e) => {
            tracing::warn!(
                size = orders.len(),
                error = %e,
                "group transaction's events refused; its purchases go one by one"
            );
            roll_back(conn, Ok(Written::NotPlain)).await
        }
        Err((_, e)) => roll_back(conn, Err(e)).await,
    }
}

/// Rolls back the transaction open on `conn` and passes `outcome` on. When the ROLLBACK
/// fails, the connection's state is unknown: the answer is then an error that is not the
/// database's (the caller's original one, or a protocol error), so that the dedicated
/// pool closes the connection rather than reusing it (`Taken::give_back`); closing it
/// rolls the transaction back on the server.
pub(crate) async fn roll_back<T>(
    conn: &mut MySqlConnection,
    outcome: Result<T, sqlx::Error>,
) -> Result<T, sqlx::Error> {
    match (
        sqlx::Executor::execute(&mut *conn, "ROLLBACK").await,
        outcome,
    ) {
        (Ok(_), outcome) => outcome,
        (Err(_), Err(e)) if !matches!(e, sqlx::Error::Database(_)) => Err(e),
        (Err(e), _) => Err(sqlx::Error::Protocol(format!(
            "group transaction: ROLLBACK failed: {e}"
        ))),
    }
}

/// The INSERT of the outbox rows of `orders`' `order_created` events: one row per
/// product, a pack (docs/events.md), each event as a single event's row holds it, with
/// the spacing of MariaDB's `JSON_OBJECT`. Each event's id is a UUIDv7, time-ordered,
/// so the consumer's unique key on it grows at its right edge; `occurred_at` is the
/// order's `created_at`, the database's clock. The payloads reach the SQL as literals
/// ([`push_sql_literal`]).
fn packs(orders: &[Order]) -> String {
    let mut sql = String::from(
        "INSERT INTO outbox (event_type, product_id, events, payload, created_at) VALUES ",
    );
    for (i, (product_id, (events, payload))) in pack_payloads(orders).iter().enumerate() {
        if i > 0 {
            sql.push_str(", ");
        }
        sql.push_str(&format!(
            "('order_created', {}, {events}, CONVERT(",
            product_id.get()
        ));
        push_sql_literal(&mut sql, payload);
        sql.push_str(" USING utf8mb4), NOW(6))");
    }
    sql
}

/// Per product of `orders`, its events' count and pack: the JSON array of their
/// `order_created` events.
///
/// Written by pushes rather than through serde: every value is an integer, a UUID, a
/// time or a request_id, whose type admits only characters JSON takes as they are.
/// Serialized by serde_json, with its escaping writer called for every key and string,
/// the packs cost the server about 9,000 instructions per order.
fn pack_payloads(orders: &[Order]) -> BTreeMap<ProductId, (usize, String)> {
    // The orders of one INSERT share its NOW(6): each distinct time written once. Each
    // pack's room is taken once, for its own product's orders.
    let mut times: BTreeMap<DateTime<Utc>, String> = BTreeMap::new();
    let mut per_product: BTreeMap<ProductId, usize> = BTreeMap::new();
    for order in orders {
        times.entry(order.created_at).or_insert_with(|| {
            order
                .created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
        });
        *per_product.entry(order.product_id).or_default() += 1;
    }
    let mut packs: BTreeMap<ProductId, (usize, String)> = per_product
        .into_iter()
        .map(|(product_id, n)| (product_id, (0, String::with_capacity(EVENT_BYTES * n + 2))))
        .collect();
    for order in orders {
        let (events, payload) = packs.entry(order.product_id).or_default();
        payload.push_str(if *events == 0 { "[" } else { ", " });
        *events += 1;
        // Every order's time is in `times`, written just above.
        let occurred_at = times.get(&order.created_at).map_or("", String::as_str);
        write_order_created(payload, order, occurred_at);
    }
    for (_, payload) in packs.values_mut() {
        payload.push(']');
    }
    packs
}

/// About the length of one `order_created` event's JSON (at most 389 characters).
const EVENT_BYTES: usize = 320;

/// Appends `order`'s `order_created` event, its fields in the order docs/events.md
/// gives, `occurred_at` its `created_at` as RFC 3339 in microseconds.
fn write_order_created(out: &mut String, order: &Order, occurred_at: &str) {
    let mut id = uuid::Uuid::encode_buffer();
    out.push_str("{\"event_id\": \"");
    out.push_str(uuid::Uuid::now_v7().hyphenated().encode_lower(&mut id));
    out.push_str("\", \"event_type\": \"order_created\", \"sequence\": 1, \"order_id\": ");
    let mut digits = itoa::Buffer::new();
    out.push_str(digits.format(order.order_id.get()));
    out.push_str(", \"request_id\": ");
    push_json_string(out, order.request_id.as_str());
    out.push_str(", \"product_id\": ");
    out.push_str(digits.format(order.product_id.get()));
    out.push_str(", \"user_id\": ");
    out.push_str(digits.format(order.user_id.get()));
    out.push_str(", \"quantity\": ");
    out.push_str(digits.format(order.quantity.get()));
    out.push_str(", \"reason\": null, \"occurred_at\": ");
    push_json_string(out, occurred_at);
    out.push('}');
}

/// Appends `text` as a JSON string: as it is between quotes when no character of it
/// needs escaping (a request_id's characters never do), else as serde_json escapes it.
fn push_json_string(out: &mut String, text: &str) {
    if printable_without(text, [b'"', b'\\']) {
        out.push('"');
        out.push_str(text);
        out.push('"');
    } else {
        // A string serializes into JSON text without fail.
        out.push_str(&serde_json::to_string(text).unwrap_or_default());
    }
}

/// The (user, product) pairs of the batch over their per-user limit, from the rows of
/// [`OVER_LIMIT`], each with the live units the user held before the batch.
fn over_limit(
    batch: &[HeldPurchase],
    rows: &[sqlx::mysql::MySqlRow],
) -> Result<OverLimit, sqlx::Error> {
    let decode = |e: flashsale_core::ParseError| sqlx::Error::Decode(e.into());
    let mut own: HashMap<(UserId, ProductId), i64> = HashMap::new();
    for p in batch {
        let r = &p.request;
        *own.entry((r.user_id, r.product_id)).or_default() += i64::from(r.quantity.get());
    }
    let mut over = OverLimit::new();
    for row in rows {
        let pair = (
            UserId::parse(row.try_get("user_id")?).map_err(decode)?,
            ProductId::parse(row.try_get("product_id")?).map_err(decode)?,
        );
        let units: i64 = row.try_get("units")?;
        let before = units - own.get(&pair).copied().unwrap_or(0);
        over.insert(
            pair,
            Held {
                before,
                limit: row.try_get("user_limit")?,
            },
        );
    }
    Ok(over)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the text DATETIME reader against chrono's own parser on the forms MariaDB
    // writes (no fraction, one to six digits of it), and that anything else — another
    // separator, a sign, a seventh digit, a day that does not exist — is refused.
    #[test]
    fn reads_text_datetimes_as_chrono_does() {
        for raw in [
            "2026-12-01 00:22:59.123456",
            "2026-12-01 00:22:59",
            "2026-12-01 00:22:59.5",
            "2026-02-28 23:59:59.000001",
            "2024-02-29 12:00:00.000000",
            "1999-12-31 00:00:00.120",
        ] {
            let chrono = chrono::NaiveDateTime::parse_from_str(raw, "%Y-%m-%d %H:%M:%S%.f")
                .expect("valid")
                .and_utc();
            assert_eq!(parse_datetime(raw), Some(chrono), "{raw}");
        }
        for raw in [
            "2026-12-01T00:22:59.123456",
            "2026-12-01 00:22:59.",
            "2026-12-01 00:22:59.1234567",
            "2026-12-01 +0:22:59",
            "2026-02-30 00:00:00",
            "2026-12-01 24:00:00",
            "2026-12-01",
            "",
        ] {
            assert_eq!(parse_datetime(raw), None, "{raw}");
        }
    }

    // Checks the server-built packs against what docs/events.md specifies for an
    // `order_created` event, on three orders of two products: one pack per product
    // holding its orders' events in order, each with every field of its order, a fresh
    // UUIDv7 as its id, `occurred_at` the order's `created_at` in microseconds, and the
    // spacing of MariaDB's JSON_OBJECT.
    #[test]
    fn packs_hold_one_event_per_order_as_the_events_contract_says() {
        let created_at = parse_datetime("2026-12-04 10:00:00.000123").expect("time");
        let order = |id: i64, request_id: &str, product: i64| Order {
            order_id: OrderId::parse(id).expect("id"),
            request_id: RequestId::parse("request_id", request_id).expect("request_id"),
            user_id: UserId::parse(40 + id).expect("user"),
            product_id: ProductId::parse(product).expect("product"),
            quantity: flashsale_core::Quantity::from_stored(i64::from(id == 2) + 1)
                .expect("quantity"),
            status: OrderStatus::PendingPayment,
            created_at,
            expires_at: created_at,
            paid_at: None,
            cancelled_at: None,
            cancel_reason: None,
            refunded_at: None,
        };
        let orders = [
            order(1, "REQ_a", 7),
            order(2, "REQ_b", 9),
            order(3, "REQ_c", 7),
        ];
        let packs = pack_payloads(&orders);
        assert_eq!(packs.len(), 2);
        let (count, text) = &packs[&ProductId::parse(7).expect("product")];
        assert_eq!(*count, 2);
        assert!(text.starts_with(r#"[{"event_id": ""#), "{text}");
        let events: Vec<serde_json::Value> = serde_json::from_str(text).expect("JSON array");
        for (event, order) in events.iter().zip([&orders[0], &orders[2]]) {
            let id = event["event_id"].as_str().expect("event_id");
            assert_eq!(
                uuid::Uuid::parse_str(id).expect("uuid").get_version_num(),
                7
            );
            assert_eq!(
                event,
                &serde_json::json!({
                    "event_id": id, "event_type": "order_created", "sequence": 1,
                    "order_id": order.order_id.get(), "request_id": order.request_id.as_str(),
                    "product_id": 7, "user_id": order.user_id.get(),
                    "quantity": order.quantity.get(), "reason": null,
                    "occurred_at": "2026-12-04T10:00:00.000123Z",
                })
            );
        }
        assert_ne!(events[0]["event_id"], events[1]["event_id"]);
        let (_, other) = &packs[&ProductId::parse(9).expect("product")];
        let other: serde_json::Value = serde_json::from_str(other).expect("JSON");
        assert_eq!(other[0]["quantity"], 2);
        assert!(super::packs(&orders).starts_with("INSERT INTO outbox"));
    }

    // Checks which literal carries a text into the SQL: printable ASCII without a quote
    // or a backslash goes quoted as it is (a batch document does); a quote, a backslash,
    // a control character or a multi-byte character sends the whole text as hex, so
    // nothing of it can end the literal or escape in any sql_mode.
    fn sql_literal(text: &str) -> String {
        let mut out = String::new();
        push_sql_literal(&mut out, text);
        out
    }

    #[test]
    fn sql_literals_quote_plain_text_and_hex_the_rest() {
        let plain = r#"[["REQ_a-1.b:c",7,42,1,3,1,900000000,null]]"#;
        assert_eq!(sql_literal(plain), format!("'{plain}'"));
        assert_eq!(sql_literal(""), "''");
        for text in [
            "it's",
            "a\\b",
            "tab\there",
            "é",
            "'); DROP TABLE orders; --",
        ] {
            assert_eq!(sql_literal(text), hex_literal(text), "{text}");
        }
    }

    // Checks the event writer's strings: plain text between quotes as it is, and text
    // that needs escaping (a quote, a backslash, a control or non-ASCII character) as
    // serde_json escapes it, so that the JSON always reads back as the same string.
    #[test]
    fn json_strings_read_back_as_written() {
        for text in [
            "REQ_a-1.b:c",
            "2026-12-04T10:00:00.000123Z",
            "",
            "a\"b",
            "a\\b",
            "x\ny",
            "é",
        ] {
            let mut out = String::new();
            push_json_string(&mut out, text);
            assert_eq!(
                serde_json::from_str::<String>(&out).expect("JSON string"),
                text
            );
        }
        let mut plain = String::new();
        push_json_string(&mut plain, "REQ_1");
        assert_eq!(plain, "\"REQ_1\"");
    }

    // Checks the hexadecimal literal: every byte as two lowercase hex digits between
    // X' and ', so a quote, a backslash or a multi-byte character in the text never
    // reaches the SQL as itself.
    #[test]
    fn hex_literal_carries_any_text_as_digits() {
        assert_eq!(hex_literal(""), "X''");
        assert_eq!(hex_literal("[\"a'\\\"]"), "X'5b2261275c225d'");
        assert_eq!(hex_literal("é"), "X'c3a9'");
        let literal = hex_literal("'); DROP TABLE orders; --");
        let digits = &literal[2..literal.len() - 1];
        assert!(digits.bytes().all(|b| b.is_ascii_hexdigit()));
    }
}
