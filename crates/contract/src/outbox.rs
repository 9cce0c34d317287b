//! The outbox's contract (`Outbox`): every state change writes its events in its own
//! transaction; rows are leased to one relay at a time, published in order per
//! request_id, and marked sent once.

use std::time::Duration;

use flashsale_app::events::{EventType, OutboxMessage};
use flashsale_app::ports::{
    Commit, HeldPurchase, LedgerMaintenance, Outbox, PublishFailure, StockRepair,
};
use flashsale_app::Ledger;
use flashsale_core::{CancelReason, ReleaseReason};

use crate::ledger::{create, terms, LedgerWorld};
use crate::{generation, hold, product, purchase, user};

/// A lease no test outlives unless it lets time pass on purpose.
const LEASE: Duration = Duration::from_secs(60);
/// More rows than any test writes.
const ALL: usize = 100;

fn kinds(rows: &[OutboxMessage]) -> Vec<(String, u32, EventType)> {
    rows.iter()
        .map(|m| (m.request_id.clone(), m.sequence, m.event_type))
        .collect()
}

/// Writes the test's changes: an order paid (A), an order cancelled (B), a fence (C).
async fn changes<L: Ledger>(l: &L) {
    create(l, product(), 5, None).await;
    let mut orders = Vec::new();
    for (id, u, h) in [("O_A", 1, 1), ("O_B", 2, 2)] {
        match l
            .commit_purchase(&HeldPurchase::new(
                &purchase(id, u, 1),
                hold(1, h),
                terms(None),
            ))
            .await
            .expect("commit")
        {
            Commit::Committed(order) => orders.push(order),
            other => panic!("expected an order, got {other:?}"),
        }
    }
    l.pay(orders[0].order_id, user(1)).await.expect("pay");
    l.cancel(orders[1].order_id, user(2), CancelReason::UserCancelled)
        .await
        .expect("cancel");
    l.fence(&purchase("O_C", 3, 1), hold(1, 3), ReleaseReason::Abandoned)
        .await
        .expect("fence");
}

/// Each change wrote its events, numbered per request_id, claimed in (request_id,
/// sequence) order with their payloads' JSON; marked sent once, they are gone.
pub async fn every_change_writes_its_events_in_order<W: LedgerWorld>(w: &W)
where
    W::Ledger: Outbox,
{
    let l = w.ledger();
    changes(l).await;
    assert_eq!(l.unsent().await.expect("unsent"), 6);
    let rows = l.claim("relay-a", ALL, LEASE).await.expect("claim");
    let expected: Vec<(String, u32, EventType)> = vec![
        ("O_A".into(), 1, EventType::OrderCreated),
        ("O_A".into(), 2, EventType::OrderPaid),
        ("O_B".into(), 1, EventType::OrderCreated),
        ("O_B".into(), 2, EventType::OrderCancelled),
        ("O_B".into(), 3, EventType::ReservationReleased),
        ("O_C".into(), 1, EventType::ReservationReleased),
    ];
    assert_eq!(kinds(&rows), expected);
    for m in &rows {
        assert!(!m.blocked);
        assert_eq!(m.attempts, 0);
        let payload: serde_json::Value = serde_json::from_str(&m.payload).expect("json");
        assert_eq!(payload["event_id"].as_str(), Some(m.event_id.as_str()));
    }
    let ids: Vec<i64> = rows.iter().map(|m| m.id).collect();
    l.mark_sent(&ids).await.expect("sent");
    l.mark_sent(&ids).await.expect("sent twice");
    assert_eq!(l.unsent().await.expect("unsent"), 0);
    l.give_back("relay-a", &[]).await.expect("give back");
    assert!(l
        .claim("relay-a", ALL, LEASE)
        .await
        .expect("claim")
        .is_empty());
}

/// Rows claimed by one relay are not handed to another while its lease lasts; given
/// back (with the failures counted as attempts), let go, or once the lease ran out on
/// the ledger's clock, they are claimable again.
pub async fn a_claim_leases_rows_to_one_relay<W: LedgerWorld>(w: &W)
where
    W::Ledger: Outbox,
{
    let l = w.ledger();
    changes(l).await;
    let rows = l.claim("relay-a", ALL, LEASE).await.expect("claim");
    assert_eq!(rows.len(), 6);
    assert!(l
        .claim("relay-b", ALL, LEASE)
        .await
        .expect("claim")
        .is_empty());
    let failed: Vec<PublishFailure> = rows
        .iter()
        .map(|m| PublishFailure {
            id: m.id,
            error: "broker down".into(),
            refused: false,
        })
        .collect();
    l.give_back("relay-a", &failed).await.expect("give back");
    let again = l.claim("relay-b", ALL, LEASE).await.expect("claim");
    assert_eq!(kinds(&again), kinds(&rows));
    assert!(again.iter().all(|m| m.attempts == 1), "{again:?}");
    assert!(l
        .claim("relay-a", ALL, LEASE)
        .await
        .expect("claim")
        .is_empty());
    l.let_go("relay-b").await.expect("let go");

    let short = l
        .claim("relay-a", ALL, Duration::from_secs(1))
        .await
        .expect("claim");
    assert_eq!(short.len(), 6);
    w.pass(Duration::from_millis(1500)).await;
    let taken_over = l.claim("relay-b", ALL, LEASE).await.expect("claim");
    assert_eq!(kinds(&taken_over), kinds(&rows));
    let ids: Vec<i64> = taken_over.iter().map(|m| m.id).collect();
    l.mark_sent(&ids).await.expect("sent");
    assert_eq!(l.unsent().await.expect("unsent"), 0);
}

/// A claim returns at most `limit` rows, the oldest first, and what is left comes in
/// the next rounds.
pub async fn claims_are_bounded_and_oldest_first<W: LedgerWorld>(w: &W)
where
    W::Ledger: Outbox,
{
    let l = w.ledger();
    changes(l).await;
    let mut seen = Vec::new();
    for _ in 0..6 {
        let rows = l.claim("relay-a", 2, LEASE).await.expect("claim");
        assert!(rows.len() <= 2, "{rows:?}");
        if rows.is_empty() {
            break;
        }
        let ids: Vec<i64> = rows.iter().map(|m| m.id).collect();
        l.mark_sent(&ids).await.expect("sent");
        l.give_back("relay-a", &[]).await.expect("give back");
        seen.extend(kinds(&rows));
    }
    assert_eq!(seen.len(), 6, "{seen:?}");
    // Per request_id, the events came out in sequence order.
    for id in ["O_A", "O_B", "O_C"] {
        let seqs: Vec<u32> = seen.iter().filter(|k| k.0 == id).map(|k| k.1).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{id}: {seqs:?}");
    }
    assert_eq!(l.unsent().await.expect("unsent"), 0);
}

/// A row refused for good is counted (its refusals in a row, which another failure sets
/// back to none); parked, it leaves the unsent events (no claim returns it, the count
/// drops by its events, the other rows still come), is listed with its reason, and its
/// events counted; put back, it is unsent again with no refusal counted, and claimed.
/// Parking or putting back what is not there changes nothing.
pub async fn a_refused_row_is_parked_and_put_back<W: LedgerWorld>(w: &W)
where
    W::Ledger: Outbox,
{
    let l = w.ledger();
    changes(l).await;
    let rows = l.claim("relay-a", ALL, LEASE).await.expect("claim");
    let fence = rows
        .iter()
        .find(|m| m.request_id == "O_C")
        .expect("the fence's event")
        .id;
    let failure = |refused| PublishFailure {
        id: fence,
        error: "publish: too_large: 2 MB".into(),
        refused,
    };
    l.give_back("relay-a", &[failure(true)])
        .await
        .expect("give back");
    l.give_back("relay-a", &[failure(true)])
        .await
        .expect("give back");
    let refusals = |rows: &[OutboxMessage]| rows.iter().find(|m| m.id == fence).map(|m| m.refusals);
    let again = l.claim("relay-a", ALL, LEASE).await.expect("claim");
    assert_eq!(refusals(&again), Some(2));
    l.give_back("relay-a", &[failure(false)])
        .await
        .expect("give back");
    let again = l.claim("relay-a", ALL, LEASE).await.expect("claim");
    assert_eq!(
        refusals(&again),
        Some(0),
        "another failure sets the count back"
    );
    assert_eq!(
        again.iter().find(|m| m.id == fence).map(|m| m.attempts),
        Some(3)
    );

    l.park(&[(fence, "publish: too_large: 2 MB".into())])
        .await
        .expect("park");
    l.park(&[(fence, "again".into())])
        .await
        .expect("park twice");
    l.give_back("relay-a", &[]).await.expect("give back");
    assert_eq!(l.unsent().await.expect("unsent"), 5);
    let left = l.claim("relay-b", ALL, LEASE).await.expect("claim");
    assert_eq!(left.len(), 5, "{left:?}");
    assert!(left.iter().all(|m| m.id != fence));
    l.give_back("relay-b", &[]).await.expect("give back");
    let parked = l.parked(ALL).await.expect("parked");
    assert_eq!(parked.len(), 1, "{parked:?}");
    assert_eq!(parked[0].id, fence);
    assert_eq!(parked[0].event_type, EventType::ReservationReleased);
    assert_eq!(parked[0].reason, "publish: too_large: 2 MB");
    assert_eq!(parked[0].attempts, 4);
    assert_eq!(l.parked_events().await.expect("parked events"), 1);

    assert_eq!(l.unpark(&[fence, fence + 1_000]).await.expect("unpark"), 1);
    assert_eq!(l.unpark(&[fence]).await.expect("unpark twice"), 0);
    assert!(l.parked(ALL).await.expect("parked").is_empty());
    assert_eq!(l.parked_events().await.expect("parked events"), 0);
    assert_eq!(l.unsent().await.expect("unsent"), 6);
    let back = l.claim("relay-a", ALL, LEASE).await.expect("claim");
    assert_eq!(refusals(&back), Some(0));
    assert_eq!(back.len(), 6);
}

/// A repair reconciliation made is recorded with its event: one `stock_repaired` row,
/// sequence 1 of request_id `REPAIR_<n>`, unsent until marked, its payload (JSON as the
/// consumers read it) carrying the product, the generation, the counts before and after
/// and their difference. Two repairs are two events of two request_ids.
pub async fn a_repair_writes_its_event<W: LedgerWorld>(w: &W)
where
    W::Ledger: Outbox,
{
    let l = w.ledger();
    create(l, product(), 20, None).await;
    let repair = StockRepair {
        product_id: product(),
        generation: generation(1),
        redis_before: 25,
        redis_after: 20,
        expected: 20,
        total: 20,
        live_units: 0,
        in_flight_units: 0,
        reason: "drift seen twice, unchanged in between",
    };
    l.record_repair(&repair).await.expect("record");
    l.record_repair(&StockRepair {
        redis_before: 18,
        ..repair.clone()
    })
    .await
    .expect("record again");
    assert_eq!(l.unsent().await.expect("unsent"), 2);
    let rows = l.claim("relay-a", ALL, LEASE).await.expect("claim");
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_ne!(rows[0].request_id, rows[1].request_id);
    let mut deltas = Vec::new();
    for m in &rows {
        assert_eq!(m.event_type, EventType::StockRepaired);
        assert_eq!(m.sequence, 1);
        assert!(m.request_id.starts_with("REPAIR_"), "{m:?}");
        let payload: serde_json::Value = serde_json::from_str(&m.payload).expect("JSON");
        assert_eq!(payload["event_type"], "stock_repaired");
        assert_eq!(payload["event_id"].as_str(), Some(m.event_id.as_str()));
        assert_eq!(payload["request_id"].as_str(), Some(m.request_id.as_str()));
        assert_eq!(payload["product_id"], product().get());
        assert_eq!(payload["generation"], 1);
        assert_eq!(payload["redis_after"], 20);
        assert!(payload["order_id"].is_null() && payload.get("user_id").is_none());
        deltas.push(payload["delta"].as_i64().expect("delta"));
    }
    deltas.sort();
    assert_eq!(deltas, vec![-5, 2]);
    let ids: Vec<i64> = rows.iter().map(|m| m.id).collect();
    l.mark_sent(&ids).await.expect("mark");
    assert_eq!(l.unsent().await.expect("unsent"), 0);
}

/// Expands to one `#[tokio::test]` per body of the outbox's contract, over world `$w`
/// (a [`LedgerWorld`] whose ledger is also the outbox).
#[macro_export]
macro_rules! outbox_contract {
    ($w:ty) => {
        $crate::ledger_world_tests!(outbox, $w;
            every_change_writes_its_events_in_order,
            a_claim_leases_rows_to_one_relay,
            claims_are_bounded_and_oldest_first,
            a_refused_row_is_parked_and_put_back,
            a_repair_writes_its_event,
        );
    };
}
