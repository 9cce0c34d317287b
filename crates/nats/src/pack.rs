//! Events packed into messages: by type, in the order the relay gives them, bounded in
//! events and bytes, each message named by the [`pack_id`] of its events.

use flashsale_app::ports::BusError;
use flashsale_app::{EventType, OutboxMessage};

/// Each event's result: its pack's. An event no pack holds (none, if `packs` came from
/// [`packs`]) is reported failed, never as published.
pub(crate) fn per_event(
    events: usize,
    packs: &[Pack],
    results: Vec<Result<(), BusError>>,
) -> Vec<Result<(), BusError>> {
    // The bus publishes each pack once and keeps one result per pack, in pack order.
    debug_assert_eq!(packs.len(), results.len(), "one result per pack");
    let mut out: Vec<Result<(), BusError>> = (0..events)
        .map(|_| Err(BusError::stopped("no message held the event")))
        .collect();
    for (pack, result) in packs.iter().zip(results) {
        for &member in &pack.members {
            debug_assert!(member < events, "pack member {member} of {events} events");
            if let Some(slot) = out.get_mut(member) {
                *slot = result.clone();
            }
        }
    }
    out
}

/// One message to publish: events of one type, packed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pack {
    pub event_type: EventType,
    /// Positions of its events in the slice given to [`packs`], in order.
    pub members: Vec<usize>,
    /// `[payload,payload,…]`: the events' outbox payloads as they are, in a JSON array
    /// (with one event per message: that event's payload alone).
    pub body: String,
    /// Its `Nats-Msg-Id`: [`pack_id`] of its events (with one event per message: the
    /// event id).
    pub id: String,
}

/// How events are packed into messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackLimits {
    /// Most events in one message; 1: each event alone, as a bare object (no array).
    pub events: usize,
    /// Most body bytes of one message (an event larger than that still goes alone).
    pub bytes: usize,
}

/// Groups events into messages: by type (each type has its own subject), in the order
/// given, at most `limits.events` events and `limits.bytes` body bytes each. The relay
/// hands over one wave at a time, which holds at most one event of each order, so packing
/// can't reorder an order's events. With `limits.events` 1 every event goes alone in the
/// format before packing: its payload as the body, its event id as the message id.
pub fn packs(messages: &[OutboxMessage], limits: &PackLimits) -> Vec<Pack> {
    if limits.events <= 1 {
        return messages
            .iter()
            .enumerate()
            .map(|(i, m)| Pack {
                event_type: m.event_type,
                members: vec![i],
                body: m.payload.clone(),
                id: m.event_id.clone(),
            })
            .collect();
    }
    let mut open: Vec<Pack> = Vec::new();
    let mut done = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let slot = match open.iter().position(|p| p.event_type == m.event_type) {
            Some(slot)
                if open[slot].members.len() < limits.events
                    && open[slot].body.len() + 1 + m.payload.len() < limits.bytes =>
            {
                slot
            }
            full => {
                if let Some(slot) = full {
                    done.push(open.swap_remove(slot));
                }
                open.push(Pack {
                    event_type: m.event_type,
                    members: Vec::new(),
                    body: String::from("["),
                    id: String::new(),
                });
                open.len() - 1
            }
        };
        let pack = &mut open[slot];
        if !pack.members.is_empty() {
            pack.body.push(',');
        }
        pack.body.push_str(&m.payload);
        pack.members.push(i);
    }
    done.extend(open);
    for pack in &mut done {
        pack.body.push(']');
        pack.id = pack_id(pack.members.iter().map(|&i| messages[i].event_id.as_str()));
    }
    done.sort_by_key(|p| p.members[0]);
    done
}

/// Namespace of the [`pack_id`]s (a random UUID, fixed forever: changing it would give
/// the same pack another id).
const PACK_NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x6c1f_2a58_93d4_4f0e_9b7a_3e51_c0d8_a246);

/// The `Nats-Msg-Id` of a message holding these events, in this order: a name-based UUID
/// (v5) of their ids. The same events packed the same way again (a republication after
/// lost "sent" marks) get the same id, which the broker drops inside its duplicate
/// window; any other pack gets another.
pub fn pack_id<'a>(event_ids: impl IntoIterator<Item = &'a str>) -> String {
    let mut name = String::new();
    for id in event_ids {
        name.push_str(id);
        name.push('\n');
    }
    uuid::Uuid::new_v5(&PACK_NAMESPACE, name.as_bytes()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EVENTS_PER_MESSAGE_MAX, MESSAGE_BYTES_MAX};

    fn event(n: usize, event_type: EventType, payload_len: usize) -> OutboxMessage {
        let event_id = format!("00000000-0000-7000-8000-{n:012}");
        let pad = "x".repeat(payload_len.saturating_sub(30));
        OutboxMessage {
            id: n as i64,
            payload: format!(r#"{{"event_id": "{event_id}", "p": "{pad}"}}"#),
            event_id,
            event_type,
            request_id: format!("REQ_{n}"),
            sequence: 1,
            attempts: 0,
            refusals: 0,
            blocked: false,
        }
    }

    /// `len` events of 100 bytes, every `paid_every`-th (from the first) an order_paid,
    /// the others order_created.
    fn mixed_wave(len: usize, paid_every: usize) -> Vec<OutboxMessage> {
        (0..len)
            .map(|n| {
                let t = if n % paid_every == 0 {
                    EventType::OrderPaid
                } else {
                    EventType::OrderCreated
                };
                event(n, t, 100)
            })
            .collect()
    }

    // Checks packing: events are grouped by type in the order given, a pack holds at most
    // EVENTS_PER_MESSAGE_MAX events and MESSAGE_BYTES_MAX bytes (an event larger than
    // that goes alone), every event lands in exactly one pack, a body is the JSON array of
    // its members' payloads, and its id is pack_id of its members' event ids.
    #[test]
    fn packs_group_by_type_within_bounds() {
        let mut wave = mixed_wave(300, 3);
        wave.push(event(
            300,
            EventType::OrderCancelled,
            MESSAGE_BYTES_MAX + 10,
        ));
        wave.push(event(301, EventType::OrderCancelled, 100));
        let packs = packs(&wave, &DEFAULT_LIMITS);
        let mut seen = vec![0; wave.len()];
        for p in &packs {
            assert!(!p.members.is_empty());
            assert!(p.members.len() <= EVENTS_PER_MESSAGE_MAX);
            assert!(p.body.len() <= MESSAGE_BYTES_MAX || p.members.len() == 1);
            assert!(p.members.windows(2).all(|w| w[0] < w[1]), "in order");
            let mut body = String::from("[");
            for (k, &m) in p.members.iter().enumerate() {
                seen[m] += 1;
                assert_eq!(wave[m].event_type, p.event_type);
                if k > 0 {
                    body.push(',');
                }
                body.push_str(&wave[m].payload);
            }
            body.push(']');
            assert_eq!(p.body, body);
            let ids: Vec<&str> = p
                .members
                .iter()
                .map(|&m| wave[m].event_id.as_str())
                .collect();
            assert_eq!(p.id, pack_id(ids));
            let items: Vec<serde_json::Value> = serde_json::from_str(&p.body).expect("json");
            assert_eq!(items.len(), p.members.len());
        }
        assert!(seen.iter().all(|&n| n == 1), "each event in one pack");
        let of = |t| packs.iter().filter(|p| p.event_type == t).count();
        // 100 paid: one pack; 200 created: 128 + 72; the oversized cancel alone, then 301.
        assert_eq!(of(EventType::OrderPaid), 1);
        assert_eq!(of(EventType::OrderCreated), 2);
        assert_eq!(of(EventType::OrderCancelled), 2);
        assert_eq!(packs.len(), 5);
        assert!(super::packs(&[], &DEFAULT_LIMITS).is_empty());
    }

    const DEFAULT_LIMITS: PackLimits = PackLimits {
        events: EVENTS_PER_MESSAGE_MAX,
        bytes: MESSAGE_BYTES_MAX,
    };

    // Checks the two other limits: a byte cap below the default (a broker with a smaller
    // max_payload) splits packs by size, and one event per message gives the format
    // before packing: each payload as it is (no array) under its own event id.
    #[test]
    fn packs_follow_the_byte_cap_and_the_single_event_format() {
        let wave: Vec<OutboxMessage> = (0..10)
            .map(|n| event(n, EventType::OrderCreated, 100))
            .collect();
        // Room for "[", four payloads, their three commas and "]", and one byte more.
        let cap = 4 * wave[0].payload.len() + 6;
        let capped = packs(
            &wave,
            &PackLimits {
                events: 128,
                bytes: cap,
            },
        );
        let sizes: Vec<usize> = capped.iter().map(|p| p.members.len()).collect();
        assert_eq!(sizes, [4, 4, 2]);
        assert!(capped.iter().all(|p| p.body.len() <= cap));
        let single = packs(
            &wave,
            &PackLimits {
                events: 1,
                bytes: MESSAGE_BYTES_MAX,
            },
        );
        assert_eq!(single.len(), wave.len());
        for (p, m) in single.iter().zip(&wave) {
            assert_eq!(p.body, m.payload);
            assert_eq!(p.id, m.event_id);
            assert_eq!(p.members.len(), 1);
        }
    }

    // Checks that each event gets its own pack's result: with one pack of a wave failed
    // and the others published, exactly the failed pack's events report the failure (the
    // relay then holds back only those orders' later events), and an event no pack held
    // is reported failed, never published.
    #[test]
    fn each_event_gets_its_packs_result() {
        let wave = mixed_wave(6, 2);
        let packs = packs(&wave, &DEFAULT_LIMITS);
        assert_eq!(packs.len(), 2);
        let failed = packs
            .iter()
            .position(|p| p.event_type == EventType::OrderPaid)
            .expect("a paid pack");
        let results: Vec<Result<(), BusError>> = (0..packs.len())
            .map(|i| {
                if i == failed {
                    Err(BusError::timed_out("timed out"))
                } else {
                    Ok(())
                }
            })
            .collect();
        let per = per_event(wave.len(), &packs, results);
        for (m, r) in wave.iter().zip(&per) {
            assert_eq!(r.is_err(), m.event_type == EventType::OrderPaid, "{}", m.id);
        }
        let short = per_event(wave.len() + 1, &packs, vec![Ok(()), Ok(())]);
        assert!(short[wave.len()].is_err());
    }

    // Checks pack ids: the same events in the same order give the same id (so the broker
    // drops a republished pack), and another set or order, or ids that only concatenate
    // alike, give another.
    #[test]
    fn pack_ids_name_their_events() {
        let a = pack_id(["e1", "e2"]);
        assert_eq!(a, pack_id(["e1", "e2"]));
        assert_ne!(a, pack_id(["e2", "e1"]));
        assert_ne!(a, pack_id(["e1"]));
        assert_ne!(a, pack_id(["e1e2"]));
        assert_ne!(pack_id(["e1", "e2", "e3"]), a);
        assert_eq!(a.len(), 36);
    }
}
