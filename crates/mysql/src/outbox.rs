//! Events in the ledger: the transactional outbox (written by the state-changing
//! transactions in `ledger.rs`, read by the relay through [`Outbox`]) and the sales
//! statistics consumer's store ([`StatsStore`]).
//!
//! An event row is built by the database in one `INSERT … SELECT`: its id is a `UUID()`,
//! its time the database's `NOW(6)`, its sequence one past the last of its request_id,
//! and its JSON payload (`JSON_OBJECT`, escaped by the server) carries the same values, so
//! writing an event costs one round trip inside the transaction and nothing else.
//!
//! A group commit's `order_created` events are written by the server as one *pack* per
//! product, with the transaction's COMMIT (`crate::group`): one row whose payload is the
//! array of the events, each with its own id (UUIDv7) (migration `…13_batch_facts.sql`).
//! The relay reads a pack as its events ([`unpack`]) and marks the row sent once every
//! one of them went out; the view `outbox_event` shows the outbox one event per row,
//! packs unpacked.
//!
//! An event is unsent while it has a row in the narrow `outbox_unsent` (with its row's
//! event count), which the database's trigger adds in the inserting statement; the relay
//! sizes a round from those marks and marks events sent by deleting them. The event row
//! is written once and never updated (a `sent_at` set later rewrote the whole row:
//! migration `…07_outbox_unsent.sql`).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use flashsale_app::ports::{
    apply_one_by_one, Applied, LedgerError, Outbox, ParkedRow, PublishFailure, StatsEvent,
    StatsStore,
};
use flashsale_app::{EventType, OutboxMessage, StatsDelta};
use flashsale_core::{CancelReason, OrderId, OrderStatus, PurchaseRequest, ReleaseReason, UserId};
use sqlx::{MySqlConnection, Row};

use crate::ledger::MysqlLedger;
use crate::rows::{corrupt, list, opt_text, text};
use crate::sql::db;

/// Attempts of one outbox or statistics statement that hit a deadlock (1213) or a lock
/// wait timeout (1205): concurrent relays' claims may deadlock on the outbox index; a
/// few quick retries resolve that, and the caller's own retry covers anything longer.
const ATTEMPTS_MAX: u32 = 3;
/// First pause before such a retry; doubled on each further attempt.
const RETRY_PAUSE: Duration = Duration::from_millis(10);
/// Deadline of one outbox or statistics operation, retries included. Past it the relay
/// round (or the consumer's message) fails and is retried later; a lost outcome is
/// harmless (leases end; consumption is idempotent).
const OPERATION_TIMEOUT: Duration = Duration::from_secs(5);
/// Most row ids in one `IN (…)` list: keeps statements short whatever the batch size.
const IDS_PER_STATEMENT: usize = 500;
/// Longest `last_error` kept (the column's width).
const LAST_ERROR_CHARS: usize = 255;

/// How long a relay with a backlog goes on under its outbox lease without renewing it.
/// A backlog drains in rounds of tens of milliseconds, each of which took and ended the
/// lease (two commits) besides its one mark; now only the first round of every this long
/// renews it. Short beside the lease, so that every round still starts with nearly all
/// of its lease left (at least the lease minus this, or half the lease if shorter).
const LEASE_RENEWED_WITHIN: Duration = Duration::from_secs(2);

/// The state change a ledger transaction is about to commit.
pub(crate) enum Change<'a> {
    /// `insert_purchase`: order PENDING_PAYMENT and reservation PROCESSING.
    Created {
        order_id: i64,
        request: &'a PurchaseRequest,
    },
    /// `transition`: the order left PENDING_PAYMENT for `to` (PAID or CANCELLED).
    Resolved {
        order: OrderRef<'a>,
        to: OrderStatus,
        cancel_reason: Option<CancelReason>,
    },
    /// `refund`: a PAID order REFUNDED, its units back on sale or out of stock
    /// (`reason`).
    Refunded {
        order: OrderRef<'a>,
        reason: ReleaseReason,
    },
    /// `insert_fence`: a reservation released without an order (no order_id).
    Fenced {
        request: &'a PurchaseRequest,
        reason: ReleaseReason,
    },
}

/// The order a change of an existing order is about, as its events name it.
pub(crate) struct OrderRef<'a> {
    pub(crate) order_id: OrderId,
    pub(crate) user_id: UserId,
    pub(crate) request_id: &'a str,
    pub(crate) product_id: i64,
    pub(crate) quantity: i32,
}

impl<'a> OrderRef<'a> {
    /// An event of this order, after its `order_created`.
    fn draft(&self, event_type: EventType, reason: Option<&'static str>) -> Draft<'a> {
        Draft {
            after: 1,
            event_type,
            order_id: Some(self.order_id.get()),
            request_id: self.request_id,
            product_id: self.product_id,
            user_id: self.user_id.get(),
            quantity: i64::from(self.quantity),
            reason,
        }
    }
}

/// One event row to write.
struct Draft<'a> {
    /// The sequence of the request_id's last event at least: 1 for a change of an order,
    /// whose `order_created` (sequence 1) may be in a pack, which has no row under the
    /// request_id; 0 otherwise.
    after: i32,
    event_type: EventType,
    order_id: Option<i64>,
    request_id: &'a str,
    product_id: i64,
    user_id: i64,
    quantity: i64,
    reason: Option<&'static str>,
}

/// Record, decide: the events of `change`, in the order they are written.
fn drafts(change: Change<'_>) -> Result<Vec<Draft<'_>>, sqlx::Error> {
    let drafts = match change {
        Change::Created { order_id, request } => vec![Draft {
            after: 0,
            event_type: EventType::OrderCreated,
            order_id: Some(order_id),
            request_id: request.request_id.as_str(),
            product_id: request.product_id.get(),
            user_id: request.user_id.get(),
            quantity: i64::from(request.quantity.get()),
            reason: None,
        }],
        Change::Fenced { request, reason } => vec![Draft {
            after: 0,
            event_type: EventType::ReservationReleased,
            order_id: None,
            request_id: request.request_id.as_str(),
            product_id: request.product_id.get(),
            user_id: request.user_id.get(),
            quantity: i64::from(request.quantity.get()),
            reason: Some(reason.as_str()),
        }],
        Change::Refunded { order, reason } => {
            vec![order.draft(EventType::OrderRefunded, Some(reason.as_str()))]
        }
        Change::Resolved {
            order,
            to,
            cancel_reason,
        } => resolved(&order, to, cancel_reason)?,
    };
    Ok(drafts)
}

/// Record, decide: the events of a buyer's transition of `order` to `to`.
fn resolved<'a>(
    order: &OrderRef<'a>,
    to: OrderStatus,
    cancel_reason: Option<CancelReason>,
) -> Result<Vec<Draft<'a>>, sqlx::Error> {
    match to {
        OrderStatus::Paid => Ok(vec![order.draft(EventType::OrderPaid, None)]),
        OrderStatus::Cancelled => {
            // The same default as the transition's own reservation update.
            let reason = cancel_reason.unwrap_or(CancelReason::UserCancelled);
            let released = ReleaseReason::for_cancel(reason);
            Ok(vec![
                order.draft(EventType::OrderCancelled, Some(reason.as_str())),
                order.draft(EventType::ReservationReleased, Some(released.as_str())),
            ])
        }
        OrderStatus::PendingPayment | OrderStatus::Refunded => {
            // A buyer's transition moves an order out of PENDING_PAYMENT, never into
            // it; a refund is `Change::Refunded`.
            debug_assert!(false, "no resolution to {to}");
            Err(sqlx::Error::Protocol(format!("no resolution to {to}")))
        }
    }
}

/// Writes the events of `change` to the outbox, on the connection of the transaction that
/// makes the change, so they commit or roll back with it. A cancellation writes two:
/// order_cancelled, then reservation_released.
pub(crate) async fn record(
    conn: &mut MySqlConnection,
    change: Change<'_>,
) -> Result<(), sqlx::Error> {
    let drafts = drafts(change)?;
    for d in drafts {
        // The derived table has an aggregate, so MariaDB materializes it: UUID() and
        // NOW(6) are evaluated once and the columns and the payload agree.
        sqlx::query(
            "INSERT INTO outbox (event_id, event_type, request_id, order_id, product_id, \
             sequence, payload, created_at) \
             SELECT e.event_id, ?, ?, ?, ?, e.seq, \
             JSON_OBJECT('event_id', e.event_id, 'event_type', ?, 'sequence', e.seq, \
             'order_id', ?, 'request_id', ?, 'product_id', ?, 'user_id', ?, \
             'quantity', ?, 'reason', ?, \
             'occurred_at', DATE_FORMAT(e.at, '%Y-%m-%dT%H:%i:%s.%fZ')), e.at \
             FROM (SELECT UUID() AS event_id, NOW(6) AS at, \
             GREATEST(COALESCE(MAX(sequence), 0), ?) + 1 AS seq \
             FROM outbox WHERE request_id = ?) e",
        )
        .bind(d.event_type.as_str())
        .bind(d.request_id)
        .bind(d.order_id)
        .bind(d.product_id)
        .bind(d.event_type.as_str())
        .bind(d.order_id)
        .bind(d.request_id)
        .bind(d.product_id)
        .bind(d.user_id)
        .bind(d.quantity)
        .bind(d.reason)
        .bind(d.after)
        .bind(d.request_id)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

/// Runs `f` under [`OPERATION_TIMEOUT`], retrying deadlocks and lock wait timeouts.
async fn bounded<T, F, Fut>(what: &'static str, f: F) -> Result<T, LedgerError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, sqlx::Error>>,
{
    crate::sql::retried(what, OPERATION_TIMEOUT, ATTEMPTS_MAX, RETRY_PAUSE, f).await
}

/// What one ledger handle knows of its relay's lease on the outbox: when it was last
/// taken or renewed, and whether the relay is draining a backlog (its last claim took a
/// full batch), in which case the round's `give_back` keeps the lease for the next round
/// instead of ending it. The database's `outbox_lease` row stays the authority: a lease
/// is used unrenewed only for [`LEASE_RENEWED_WITHIN`] after this handle itself took or
/// renewed it, which it did before that row could name another holder.
#[derive(Debug, Default)]
pub(crate) struct KeptLease(Mutex<Option<Held>>);

#[derive(Debug)]
struct Held {
    relay: String,
    /// Taken before the renewing statement was sent, so the database's lease ends no
    /// earlier than this plus `lease`.
    renewed: Instant,
    lease: Duration,
    backlog: bool,
}

impl KeptLease {
    fn with<T>(&self, f: impl FnOnce(&mut Option<Held>) -> T) -> T {
        // A panic while holding this lock left at worst a stale record, which the
        // checks below treat like any other.
        let mut held = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        f(&mut held)
    }

    /// Whether `relay` renewed the lease recently enough to use it without a statement.
    fn fresh(&self, relay: &str) -> bool {
        self.with(|held| {
            held.as_ref().is_some_and(|h| {
                h.relay == relay && h.renewed.elapsed() < LEASE_RENEWED_WITHIN.min(h.lease / 2)
            })
        })
    }

    fn renewed(&self, relay: &str, renewed: Instant, lease: Duration) {
        self.with(|held| {
            *held = Some(Held {
                relay: relay.to_owned(),
                renewed,
                lease,
                backlog: false,
            })
        });
    }

    fn set_backlog(&self, relay: &str, backlog: bool) {
        self.with(|held| {
            if let Some(h) = held.as_mut().filter(|h| h.relay == relay) {
                h.backlog = backlog;
            }
        });
    }

    /// Whether `relay`'s round ends with its lease kept: it is draining a backlog.
    fn keep(&self, relay: &str) -> bool {
        self.with(|held| held.as_ref().is_some_and(|h| h.relay == relay && h.backlog))
    }

    fn forget(&self) {
        self.with(|held| *held = None);
    }
}

/// The head of an event object: what the relay orders and names it by.
#[derive(Debug, PartialEq, serde::Deserialize)]
struct Head {
    event_id: String,
    request_id: String,
    sequence: u32,
}

/// The events of a pack's payload (a JSON array of event objects), each as its head and
/// its own text, in one pass: each object is read once, for its head, and its text is
/// the slice the reader went over. (Reading the array as raw values first, then each
/// value again for its head, went over every event twice.) `None` for anything but an
/// array of objects with a head each.
fn pack_events(payload: &str) -> Option<Vec<(Head, &str)>> {
    let skip_space = |at: usize| {
        payload[at..]
            .find(|c: char| !c.is_ascii_whitespace())
            .map_or(payload.len(), |n| at + n)
    };
    let mut at = skip_space(0);
    if payload.as_bytes().get(at) != Some(&b'[') {
        return None;
    }
    at = skip_space(at + 1);
    let mut events = Vec::new();
    if payload.as_bytes().get(at) == Some(&b']') {
        return (skip_space(at + 1) == payload.len()).then_some(events);
    }
    loop {
        let rest = payload.get(at..)?;
        if !rest.starts_with('{') {
            return None;
        }
        // An object ends itself: the stream reader stops at its closing brace.
        let mut stream = serde_json::Deserializer::from_str(rest).into_iter::<Head>();
        let head = stream.next()?.ok()?;
        let end = at + stream.byte_offset();
        events.push((head, &payload[at..end]));
        at = skip_space(end);
        match payload.as_bytes().get(at) {
            Some(b',') => at = skip_space(at + 1),
            Some(b']') => return (skip_space(at + 1) == payload.len()).then_some(events),
            _ => return None,
        }
    }
}

/// How many of a round's oldest unsent rows, given their event counts in order, the round
/// takes: each row while fewer than `limit` events came before it. A count below 1 (no
/// row has one) counts as 1, so that every row taken counts.
fn round_rows(events: impl IntoIterator<Item = i32>, limit: u64) -> usize {
    let mut before = 0u64;
    let mut rows = 0;
    for n in events {
        if before >= limit {
            break;
        }
        before = before.saturating_add(u64::try_from(n.max(1)).unwrap_or(1));
        rows += 1;
    }
    rows
}

/// The events of one outbox row, appended to `out`: the row's own, or each of a pack's
/// (migration `…13_batch_facts.sql`), all under the row's id, which is what is marked
/// sent.
fn unpack(
    row: &sqlx::mysql::MySqlRow,
    id: i64,
    (attempts, refusals): (u32, u32),
    out: &mut Vec<OutboxMessage>,
) -> Result<(), LedgerError> {
    let event_type: EventType = text(row, "event_type")?.parse().map_err(corrupt)?;
    let payload = text(row, "payload")?;
    let request_id = opt_text(row, "request_id")?;
    let Some(request_id) = request_id else {
        let pack = pack_events(&payload).ok_or_else(|| {
            corrupt(format!(
                "outbox pack {id}: not an array of events with an event_id, a request_id \
                 and a sequence each"
            ))
        })?;
        for (head, event) in pack {
            out.push(OutboxMessage {
                id,
                event_id: head.event_id,
                event_type,
                request_id: head.request_id,
                sequence: head.sequence,
                payload: event.to_owned(),
                attempts,
                refusals,
                blocked: false,
            });
        }
        return Ok(());
    };
    let sequence: i32 = row.try_get("sequence").map_err(db)?;
    out.push(OutboxMessage {
        id,
        event_id: text(row, "event_id")?,
        event_type,
        request_id,
        sequence: u32::try_from(sequence).map_err(|_| corrupt(format!("sequence {sequence}")))?,
        payload,
        attempts,
        refusals,
        // Nothing is held elsewhere while this relay holds the outbox's lease.
        blocked: false,
    });
    Ok(())
}

#[async_trait]
impl Outbox for MysqlLedger {
    async fn claim(
        &self,
        relay: &str,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<OutboxMessage>, LedgerError> {
        let limit = u64::try_from(limit).unwrap_or(u64::MAX);
        if !self.lease_outbox(relay, lease).await? {
            return Ok(Vec::new());
        }
        // The oldest unsent rows, at most `limit`, cut after the one that brings the
        // events to `limit` (a pack holds many): a round publishes at most `limit` − 1 +
        // a pack's events. The narrow marks are read in their key's order and cut here,
        // and only the rows kept are read whole: one query with a window function over
        // the unsent rows joined to the outbox made MariaDB write every unsent row into
        // temporary tables on every round, backlog included: about 0.6 temporary-table
        // writes per order, none this way.
        let marks: Vec<(i64, i32, i32, i32)> = bounded("read unsent outbox marks", || async {
            sqlx::query_as(
                "SELECT id, attempts, events, refusals FROM outbox_unsent ORDER BY id LIMIT ?",
            )
            .bind(limit)
            .fetch_all(&self.pool())
            .await
        })
        .await?;
        let marks = &marks[..round_rows(marks.iter().map(|&(_, _, events, _)| events), limit)];
        if marks.is_empty() {
            // Idle: let another instance's relay take over at once if this one stops.
            self.end_lease(relay).await?;
            return Ok(Vec::new());
        }
        let mut messages = self.unsent_messages(marks).await?;
        // A full batch: more may wait, and the relay goes on at once under the same lease.
        self.outbox_lease().set_backlog(
            relay,
            u64::try_from(messages.len()).unwrap_or(u64::MAX) >= limit,
        );
        // Sorted here rather than by the server, which read them in its index's order.
        messages.sort_by(|a, b| (&a.request_id, a.sequence).cmp(&(&b.request_id, b.sequence)));
        Ok(messages)
    }

    async fn mark_sent(&self, ids: &[i64]) -> Result<(), LedgerError> {
        for chunk in ids.chunks(IDS_PER_STATEMENT) {
            // The ids as one JSON array: one statement text for every chunk size.
            let document = serde_json::to_string(chunk).unwrap_or_default();
            // Sent is the absence of the unsent mark: the event row itself is not written.
            bounded("mark outbox rows sent", || async {
                sqlx::query(
                    "DELETE u FROM outbox_unsent u \
                     JOIN JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$')) AS j ON u.id = j.id",
                )
                .bind(&document)
                .execute(&self.pool())
                .await
            })
            .await?;
        }
        Ok(())
    }

    async fn give_back(&self, relay: &str, failed: &[PublishFailure]) -> Result<(), LedgerError> {
        // One statement per distinct error (a broker outage gives them all the same one).
        let mut by_error: BTreeMap<(String, bool), Vec<i64>> = BTreeMap::new();
        for f in failed {
            let error: String = f.error.chars().take(LAST_ERROR_CHARS).collect();
            by_error.entry((error, f.refused)).or_default().push(f.id);
        }
        for ((error, refused), ids) in &by_error {
            for chunk in ids.chunks(IDS_PER_STATEMENT) {
                let sql = format!(
                    "UPDATE outbox_unsent SET attempts = attempts + 1, last_error = ?, \
                     refusals = IF(?, refusals + 1, 0) WHERE id IN ({})",
                    list(chunk.len(), "?")
                );
                bounded("record failed publishes", || async {
                    let mut q = sqlx::query(&sql).bind(error).bind(refused);
                    for id in chunk {
                        q = q.bind(id);
                    }
                    q.execute(&self.pool()).await
                })
                .await?;
            }
        }
        if failed.is_empty() && self.outbox_lease().keep(relay) {
            // Draining a backlog: the next round follows at once.
            return Ok(());
        }
        self.end_lease(relay).await
    }

    async fn let_go(&self, relay: &str) -> Result<(), LedgerError> {
        self.end_lease(relay).await
    }

    async fn park(&self, rows: &[(i64, String)]) -> Result<(), LedgerError> {
        for (id, reason) in rows {
            let reason: String = reason.chars().take(LAST_ERROR_CHARS).collect();
            bounded("park an outbox row", || self.park_row(*id, &reason)).await?;
        }
        Ok(())
    }

    async fn parked(&self, limit: usize) -> Result<Vec<ParkedRow>, LedgerError> {
        let rows = bounded("read parked outbox rows", || async {
            sqlx::query(
                "SELECT p.id, CONVERT(o.event_type USING utf8mb4) AS event_type, o.product_id, \
                 CONVERT(o.request_id USING utf8mb4) AS request_id, p.events, p.attempts, \
                 CONVERT(p.reason USING utf8mb4) AS reason, p.parked_at \
                 FROM outbox_parked p JOIN outbox o ON o.id = p.id ORDER BY p.id LIMIT ?",
            )
            .bind(u64::try_from(limit).unwrap_or(u64::MAX))
            .fetch_all(&self.pool())
            .await
        })
        .await?;
        rows.iter().map(parked_row).collect()
    }

    async fn parked_events(&self) -> Result<u64, LedgerError> {
        let n: i64 = bounded("count parked events", || async {
            sqlx::query_scalar("SELECT CAST(COALESCE(SUM(events), 0) AS SIGNED) FROM outbox_parked")
                .fetch_one(&self.pool())
                .await
        })
        .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn unpark(&self, ids: &[i64]) -> Result<usize, LedgerError> {
        let mut unparked = 0;
        for &id in ids {
            if bounded("put a parked row back", || self.unpark_row(id)).await? {
                unparked += 1;
            }
        }
        Ok(unparked)
    }

    async fn unsent(&self) -> Result<u64, LedgerError> {
        let n: i64 = bounded("count unsent events", || async {
            sqlx::query_scalar("SELECT CAST(COALESCE(SUM(events), 0) AS SIGNED) FROM outbox_unsent")
                .fetch_one(&self.pool())
                .await
        })
        .await?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

/// A parked row as `Outbox::parked` reads it.
fn parked_row(row: &sqlx::mysql::MySqlRow) -> Result<ParkedRow, LedgerError> {
    let count = |name: &str| -> Result<u32, LedgerError> {
        let n: i32 = row.try_get(name).map_err(db)?;
        u32::try_from(n).map_err(|_| corrupt(format!("{name} {n}")))
    };
    let parked_at: chrono::NaiveDateTime = row.try_get("parked_at").map_err(db)?;
    Ok(ParkedRow {
        id: row.try_get("id").map_err(db)?,
        event_type: text(row, "event_type")?.parse().map_err(corrupt)?,
        product_id: row.try_get("product_id").map_err(db)?,
        request_id: opt_text(row, "request_id")?,
        events: count("events")?,
        attempts: count("attempts")?,
        reason: text(row, "reason")?,
        parked_at: parked_at.and_utc(),
    })
}

impl MysqlLedger {
    /// Moves one unsent row's mark to `outbox_parked`, in one transaction; a row not
    /// unsent (sent, or parked before) changes nothing.
    async fn park_row(&self, id: i64, reason: &str) -> Result<(), sqlx::Error> {
        let mut tx = self.pool().begin().await?;
        let moved = sqlx::query(
            "INSERT INTO outbox_parked (id, events, attempts, reason) \
             SELECT id, events, attempts + 1, ? FROM outbox_unsent WHERE id = ? FOR UPDATE",
        )
        .bind(reason)
        .bind(id)
        .execute(&mut *tx)
        .await?;
        if moved.rows_affected() > 0 {
            sqlx::query("DELETE FROM outbox_unsent WHERE id = ?")
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await
    }

    /// Moves one parked row back among the unsent (no attempt or refusal counted), in one
    /// transaction; whether it was parked.
    async fn unpark_row(&self, id: i64) -> Result<bool, sqlx::Error> {
        let mut tx = self.pool().begin().await?;
        let back = sqlx::query(
            "INSERT INTO outbox_unsent (id, events) \
             SELECT id, events FROM outbox_parked WHERE id = ? FOR UPDATE",
        )
        .bind(id)
        .execute(&mut *tx)
        .await?;
        if back.rows_affected() > 0 {
            sqlx::query("DELETE FROM outbox_parked WHERE id = ?")
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(back.rows_affected() > 0)
    }

    /// Claim, lease: takes the lease on the whole outbox when free or ended, or renews it
    /// for its holder (at most every LEASE_RENEWED_WITHIN while it drains a backlog);
    /// false when another instance's relay holds it.
    async fn lease_outbox(&self, relay: &str, lease: Duration) -> Result<bool, LedgerError> {
        if self.outbox_lease().fresh(relay) {
            return Ok(true);
        }
        let lease_micros = i64::try_from(lease.as_micros()).unwrap_or(i64::MAX);
        let renewed = Instant::now();
        let held = bounded("lease the outbox", || async {
            sqlx::query(
                "UPDATE outbox_lease SET holder = ?, \
                 lease_until = NOW(6) + INTERVAL ? MICROSECOND \
                 WHERE id = 1 AND (holder = ? OR holder IS NULL OR lease_until < NOW(6))",
            )
            .bind(relay)
            .bind(lease_micros)
            .bind(relay)
            .execute(&self.pool())
            .await
        })
        .await?;
        if held.rows_affected() == 0 {
            // Another instance's relay holds it.
            self.outbox_lease().forget();
            return Ok(false);
        }
        self.outbox_lease().renewed(relay, renewed, lease);
        Ok(true)
    }

    /// Claim, read: the rows of `marks` (unsent, in id order) read whole and unpacked,
    /// each message with its row's attempts and refusals.
    async fn unsent_messages(
        &self,
        marks: &[(i64, i32, i32, i32)],
    ) -> Result<Vec<OutboxMessage>, LedgerError> {
        // The ids as one JSON array: one statement text for every round size.
        let ids: Vec<i64> = marks.iter().map(|&(id, _, _, _)| id).collect();
        let document = serde_json::to_string(&ids).unwrap_or_default();
        let rows = bounded("read unsent outbox rows", || async {
            sqlx::query(
                "SELECT o.id, o.event_id, o.event_type, o.request_id, o.sequence, o.payload \
                 FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$')) AS j \
                 JOIN outbox o ON o.id = j.id",
            )
            .bind(&document)
            .fetch_all(&self.pool())
            .await
        })
        .await?;
        let mut messages = Vec::new();
        for row in &rows {
            let id: i64 = row.try_get("id").map_err(db)?;
            // The marks are in id order.
            let mark = marks.binary_search_by_key(&id, |&(id, _, _, _)| id);
            // The rows were read by the marks' ids: each has its mark.
            debug_assert!(mark.is_ok(), "outbox row {id} read without its unsent mark");
            let (attempts, refusals) = mark.map_or((0, 0), |at| (marks[at].1, marks[at].3));
            // Counts of attempts and refusals only ever grow from 0.
            debug_assert!(
                attempts >= 0 && refusals >= 0,
                "outbox row {id}: a count below 0"
            );
            let counts = (
                u32::try_from(attempts).unwrap_or(0),
                u32::try_from(refusals).unwrap_or(0),
            );
            unpack(row, id, counts, &mut messages)?;
        }
        Ok(messages)
    }

    /// Ends `relay`'s lease on the outbox, if it holds it.
    async fn end_lease(&self, relay: &str) -> Result<(), LedgerError> {
        self.outbox_lease().forget();
        bounded("end the outbox lease", || async {
            sqlx::query(
                "UPDATE outbox_lease SET holder = NULL, lease_until = NULL \
                 WHERE id = 1 AND holder = ?",
            )
            .bind(relay)
            .execute(&self.pool())
            .await
        })
        .await?;
        Ok(())
    }

    async fn apply_stats(&self, event: &StatsEvent) -> Result<Applied, sqlx::Error> {
        let mut tx = self.pool().begin().await?;
        let inserted = sqlx::query(
            "INSERT INTO consumed_event (event_id, event_type, product_id) VALUES (?, ?, ?)",
        )
        .bind(&event.event_id)
        .bind(event.event_type.as_str())
        .bind(event.product_id.get())
        .execute(&mut *tx)
        .await;
        match inserted {
            Err(e) if crate::sql::is_duplicate(&e) => {
                tx.rollback().await?;
                return Ok(Applied::AlreadyApplied);
            }
            other => other?,
        };
        add_stats(&mut tx, event.product_id.get(), &event.delta).await?;
        tx.commit().await?;
        Ok(Applied::Applied)
    }

    /// Applies a delivery's events in one transaction: the ones not consumed before are
    /// recorded with one multi-row INSERT and their deltas summed into one upsert per
    /// product. Without `look_first` it takes them all for new (the usual case: a
    /// redelivery is rare) and skips the query for those consumed before; the INSERT's
    /// duplicate key then says whether that was wrong. `Ok(None)`: one of them was
    /// consumed before, or another consumer recorded one meanwhile (the caller looks
    /// first, then falls back to one transaction per event).
    async fn apply_stats_all(
        &self,
        events: &[StatsEvent],
        look_first: bool,
    ) -> Result<Option<Vec<Applied>>, sqlx::Error> {
        let mut tx = self.pool().begin().await?;
        // The ids consumed before (only looked up with `look_first`).
        let mut before: Vec<String> = Vec::new();
        if look_first {
            let sql = format!(
                "SELECT CONVERT(event_id USING utf8mb4) AS event_id FROM consumed_event \
                 WHERE event_id IN ({})",
                list(events.len(), "?")
            );
            let mut q = sqlx::query(&sql);
            for e in events {
                q = q.bind(e.event_id.as_str());
            }
            for row in q.fetch_all(&mut *tx).await? {
                before.push(row.try_get_unchecked::<String, _>("event_id")?);
            }
        }
        // Borrowed ids, sized for them all: a delivery's ids were cloned into a set grown
        // from empty, about 1,100 instructions an event.
        let mut seen: std::collections::HashSet<&str> =
            std::collections::HashSet::with_capacity(before.len() + events.len());
        seen.extend(before.iter().map(String::as_str));
        let mut applied = Vec::with_capacity(events.len());
        let mut fresh = Vec::with_capacity(events.len());
        for e in events {
            // `insert` is false for one consumed before, or twice in this delivery.
            if seen.insert(e.event_id.as_str()) {
                fresh.push(e);
                applied.push(Applied::Applied);
            } else {
                applied.push(Applied::AlreadyApplied);
            }
        }
        if !fresh.is_empty() {
            let rows: Vec<(&str, &str, i64)> = fresh
                .iter()
                .map(|e| {
                    (
                        e.event_id.as_str(),
                        e.event_type.as_str(),
                        e.product_id.get(),
                    )
                })
                .collect();
            // Strings and integers: serializing cannot fail.
            let document = serde_json::to_string(&rows).unwrap_or_default();
            match sqlx::query(CONSUMED).bind(document).execute(&mut *tx).await {
                Err(e) if crate::sql::is_duplicate(&e) => {
                    tx.rollback().await?;
                    return Ok(None);
                }
                other => other?,
            };
            let mut sums: BTreeMap<i64, StatsDelta> = BTreeMap::new();
            for e in &fresh {
                *sums.entry(e.product_id.get()).or_default() += &e.delta;
            }
            for (product_id, d) in &sums {
                add_stats(&mut tx, *product_id, d).await?;
            }
        }
        tx.commit().await?;
        Ok(Some(applied))
    }
}

/// Records a chunk's events as consumed, read from one bound JSON document
/// `[[event_id, event_type, product_id], …]`: one statement text whatever the chunk's
/// size, prepared once per connection, as the ledger's other batch statements. A
/// `VALUES` list of three placeholders per event was a statement text per chunk size, up
/// to 1,024 of them, each prepared on first use and crowding sqlx's cache of 100; in a
/// steady sale few sizes recur, so this measured no faster. An event id is at most 64
/// characters, checked when its message is decoded, so the column never cuts one.
const CONSUMED: &str = "INSERT INTO consumed_event (event_id, event_type, product_id) \
     SELECT j.event_id, j.event_type, j.product_id FROM JSON_TABLE(?, '$[*]' COLUMNS (\
     event_id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[0]', \
     event_type VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$[1]', \
     product_id BIGINT PATH '$[2]')) AS j";

/// Adds `d` to a product's statistics row (creating it), in the caller's transaction.
async fn add_stats(
    conn: &mut MySqlConnection,
    product_id: i64,
    d: &StatsDelta,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO sales_stats (product_id, orders_created, units_ordered, orders_paid, \
         units_paid, orders_cancelled, units_cancelled, reservations_released, \
         units_released, orders_refunded, units_refunded) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
         ON DUPLICATE KEY UPDATE orders_created = orders_created + VALUES(orders_created), \
         units_ordered = units_ordered + VALUES(units_ordered), \
         orders_paid = orders_paid + VALUES(orders_paid), \
         units_paid = units_paid + VALUES(units_paid), \
         orders_cancelled = orders_cancelled + VALUES(orders_cancelled), \
         units_cancelled = units_cancelled + VALUES(units_cancelled), \
         reservations_released = reservations_released + VALUES(reservations_released), \
         units_released = units_released + VALUES(units_released), \
         orders_refunded = orders_refunded + VALUES(orders_refunded), \
         units_refunded = units_refunded + VALUES(units_refunded)",
    )
    .bind(product_id)
    .bind(d.orders_created)
    .bind(d.units_ordered)
    .bind(d.orders_paid)
    .bind(d.units_paid)
    .bind(d.orders_cancelled)
    .bind(d.units_cancelled)
    .bind(d.reservations_released)
    .bind(d.units_released)
    .bind(d.orders_refunded)
    .bind(d.units_refunded)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

#[async_trait]
impl StatsStore for MysqlLedger {
    async fn apply_once(&self, event: &StatsEvent) -> Result<Applied, LedgerError> {
        bounded("apply event to sales stats", || self.apply_stats(event)).await
    }

    async fn apply_all(&self, events: &[StatsEvent]) -> Result<Vec<Applied>, LedgerError> {
        if events.len() > 1 {
            for look_first in [false, true] {
                if let Some(applied) = bounded("apply events to sales stats", || {
                    self.apply_stats_all(events, look_first)
                })
                .await?
                {
                    return Ok(applied);
                }
            }
        }
        apply_one_by_one(self, events).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(event_id: &str, request_id: &str, sequence: u32) -> Head {
        Head {
            event_id: event_id.to_owned(),
            request_id: request_id.to_owned(),
            sequence,
        }
    }

    // Checks the one-pass pack reader against what it replaces (the array read as raw
    // values, then each value for its head): the same heads and the same texts for packs
    // with spaces, escapes, braces and commas inside strings, nested values and keys in
    // any order; an empty array; and refusals (None) for anything else: not an array, a
    // non-object element, a head missing or of the wrong type, a missing or trailing
    // comma, an unclosed array, text after it.
    #[test]
    fn reads_a_pack_as_the_two_pass_reader_did() {
        let packs = [
            r#"[{"event_id":"e1","request_id":"REQ_1","sequence":1,"order_id":7}]"#,
            r#" [ {"sequence":1, "x":{"a":[1,{"b":"}"}]}, "request_id":"R,]}", "event_id":"e\"2"} ,
               {"event_id":"e3","request_id":"REQ_\u00e9","sequence":1,"reason":null} ] "#,
            "[]",
            " [ ] ",
        ];
        for pack in packs {
            let two_pass: Vec<&serde_json::value::RawValue> =
                serde_json::from_str(pack).expect("valid pack");
            let expected: Vec<(Head, &str)> = two_pass
                .iter()
                .map(|raw| (serde_json::from_str(raw.get()).expect("head"), raw.get()))
                .collect();
            assert_eq!(pack_events(pack), Some(expected), "{pack}");
        }
        assert_eq!(
            pack_events(r#"[{"event_id":"e\"2","request_id":"R,]}","sequence":3}]"#),
            Some(vec![(
                head("e\"2", "R,]}", 3),
                r#"{"event_id":"e\"2","request_id":"R,]}","sequence":3}"#
            )])
        );
        for bad in [
            "",
            "{}",
            r#"{"event_id":"e","request_id":"R","sequence":1}"#,
            "[1]",
            r#"["x"]"#,
            r#"[{"event_id":"e","request_id":"R"}]"#,
            r#"[{"event_id":"e","request_id":"R","sequence":-1}]"#,
            r#"[{"event_id":"e","request_id":"R","sequence":1} {"event_id":"f","request_id":"R","sequence":1}]"#,
            r#"[{"event_id":"e","request_id":"R","sequence":1},]"#,
            r#"[{"event_id":"e","request_id":"R","sequence":1}"#,
            r#"[{"event_id":"e","request_id":"R","sequence":1}] x"#,
            r#"[{"event_id":"e","request_id":"R","sequence":1"#,
        ] {
            assert_eq!(pack_events(bad), None, "{bad}");
        }
    }

    // Checks a round's cut, as the window query it replaces made it: each row is taken
    // while fewer than `limit` events came before it, so a round ends with the row that
    // reaches the limit (a pack may overshoot it, a single event never); no rows, or a
    // limit of 0, take nothing; a count below 1 counts as 1.
    #[test]
    fn a_round_takes_rows_until_they_hold_its_limit() {
        assert_eq!(round_rows([1, 1, 1], 2), 2);
        assert_eq!(round_rows([1, 1, 1], 3), 3);
        assert_eq!(round_rows([1, 1, 1], 10), 3);
        assert_eq!(round_rows([25, 25, 25], 30), 2);
        assert_eq!(round_rows([25, 25, 25], 25), 1);
        assert_eq!(round_rows([25, 1, 1], 26), 2);
        assert_eq!(round_rows([300, 1], 256), 1);
        assert_eq!(round_rows([0, -4, 1], 2), 2);
        assert_eq!(round_rows([], 1024), 0);
        assert_eq!(round_rows([1], 0), 0);
    }
}
