//! A message body as it is on the wire (docs/events.md): a JSON array of events, or one
//! bare event, each read and checked as the domain checks it.

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use flashsale_app::{Event, EventType};
use flashsale_core::{OrderId, ProductId, Quantity, RequestId, UserId};
use serde::Deserialize;

/// Why a message body, or one event of it, is not a valid event.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Not JSON, or not an event's JSON (a field missing or of the wrong type).
    #[error("invalid event: {0}")]
    Json(#[from] serde_json::Error),
    /// A field's value the domain refuses (an id out of range, an unknown event type).
    #[error("invalid event: {0}")]
    Field(String),
    /// An `event_id` empty or longer than the consumers' key column.
    #[error("invalid event: event_id: 1 to {EVENT_ID_CHARS_MAX} characters, not {0}")]
    EventIdLength(usize),
    /// A product's own event (a repair, a pause, …) with a buyer or units.
    #[error("invalid event: {0}: no user_id or quantity (it has no buyer)")]
    UnitsOnProductEvent(EventType),
    /// An order's or a reservation's event without its buyer or units.
    #[error("invalid event: {}: user_id and quantity are required", .0.as_str())]
    UnitsMissing(EventType),
    /// A quantity no order holds.
    #[error("invalid event: quantity {0}")]
    Quantity(i64),
}

impl DecodeError {
    /// A field's value refused as the domain's parser says.
    fn field(e: impl std::fmt::Display) -> Self {
        Self::Field(e.to_string())
    }
}

/// The JSON body as it is on the wire (docs/events.md).
#[derive(Deserialize)]
struct WireEvent<'a> {
    event_id: String,
    // Borrowed from the body unless escaped: both are only read, then dropped.
    #[serde(borrow)]
    event_type: Cow<'a, str>,
    sequence: u32,
    order_id: Option<i64>,
    #[serde(borrow)]
    request_id: Cow<'a, str>,
    product_id: i64,
    // Absent from a stock repair's event (no buyer, no order's units).
    user_id: Option<i64>,
    quantity: Option<i64>,
    reason: Option<String>,
    #[serde(deserialize_with = "rfc3339")]
    occurred_at: DateTime<Utc>,
}

/// `occurred_at` as docs/events.md specifies it, RFC 3339, read by chrono's RFC 3339
/// parser straight from the body (borrowed, or serde's copy when escaped): serde's
/// default for `DateTime` tries the laxer forms of `FromStr`, about a sixth of an event's
/// decoding (`cargo bench -p flashsale-nats --bench decode`).
fn rfc3339<'de, D: serde::Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
    struct Rfc3339;
    impl serde::de::Visitor<'_> for Rfc3339 {
        type Value = DateTime<Utc>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an RFC 3339 timestamp")
        }

        fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Self::Value, E> {
            DateTime::parse_from_rfc3339(text)
                .map(|t| t.with_timezone(&Utc))
                .map_err(E::custom)
        }
    }
    d.deserialize_str(Rfc3339)
}

/// Reads a message body: its events, each decoded on its own (one bad event doesn't take
/// the others with it). A body is a JSON array of events; a body that is not an array is
/// read as one event (flashsale published one event object per message before it packed
/// them). `Err`: the body begins as an array but isn't one.
pub fn decode_message(body: &[u8]) -> Result<Vec<Result<Event, DecodeError>>, DecodeError> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'[') {
        return Ok(vec![decode_event(body)]);
    }
    // The usual case in one pass: a UTF-8 body (checked once, not string by string as
    // `from_slice` does) whose elements are all events; read as raw values and then each
    // again, every event was parsed twice, about 4,000 instructions an order. Otherwise
    // each element is read on its own, so that one malformed event costs only itself.
    if let Some(events) = std::str::from_utf8(body)
        .ok()
        .and_then(|text| serde_json::from_str::<Vec<WireEvent<'_>>>(text).ok())
    {
        return Ok(events.into_iter().map(checked).collect());
    }
    let items: Vec<&serde_json::value::RawValue> = serde_json::from_slice(body)?;
    Ok(items
        .into_iter()
        .map(|item| decode_event(item.get().as_bytes()))
        .collect())
}

/// Reads one event (an element of a message body) into an [`Event`], checking every field
/// as the domain does.
pub fn decode_event(body: &[u8]) -> Result<Event, DecodeError> {
    checked(serde_json::from_slice(body)?)
}

/// The longest `event_id` an event may carry: the width of the consumers' key column
/// (`consumed_event.event_id`, and the outbox's). flashsale's own ids are UUIDs, 36.
pub const EVENT_ID_CHARS_MAX: usize = 64;

/// The buyer and units of an event: both present and valid on an order's or a
/// reservation's event, both absent (or null) on a stock repair's.
fn units(
    event_type: EventType,
    user_id: Option<i64>,
    quantity: Option<i64>,
) -> Result<Option<(UserId, Quantity)>, DecodeError> {
    match (event_type, user_id, quantity) {
        (t, None, None) if t.of_product() => Ok(None),
        (t, _, _) if t.of_product() => Err(DecodeError::UnitsOnProductEvent(t)),
        (_, Some(user_id), Some(quantity)) => Ok(Some((
            UserId::parse(user_id).map_err(DecodeError::field)?,
            Quantity::from_stored(quantity).ok_or(DecodeError::Quantity(quantity))?,
        ))),
        (t, _, _) => Err(DecodeError::UnitsMissing(t)),
    }
}

/// An event as read, its fields checked as the domain does.
fn checked(w: WireEvent<'_>) -> Result<Event, DecodeError> {
    // The consumers' deduplication key, stored as at most 64 characters: a longer one
    // would be cut, and two ids cut alike would count as one event.
    let id_chars = w.event_id.chars().count();
    if id_chars == 0 || id_chars > EVENT_ID_CHARS_MAX {
        return Err(DecodeError::EventIdLength(id_chars));
    }
    let event_type: EventType = w.event_type.parse().map_err(DecodeError::field)?;
    Ok(Event {
        units: units(event_type, w.user_id, w.quantity)?,
        event_type,
        event_id: w.event_id,
        sequence: w.sequence,
        order_id: w
            .order_id
            .map(OrderId::parse)
            .transpose()
            .map_err(DecodeError::field)?,
        request_id: RequestId::stored("request_id", &w.request_id).map_err(DecodeError::field)?,
        product_id: ProductId::parse(w.product_id).map_err(DecodeError::field)?,
        reason: w.reason,
        occurred_at: w.occurred_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the documented JSON form (as MariaDB's JSON_OBJECT writes it) decodes into
    // the event, null order_id included, an escaped request_id too (the borrowed fields
    // fall back to a copy), and that a bad field is refused, each by its `DecodeError`
    // case: a quantity of 0, a product id of 0, an `occurred_at` that is not RFC 3339 (no
    // offset, or no timestamp at all), and an `event_id` empty or longer than the
    // consumers' key column.
    #[test]
    fn decodes_the_documented_payload() {
        let body = r#"{"event_id": "5f0c6a4e-ebf5-11f1-b3b2-02fc00000001", "event_type": "reservation_released", "sequence": 1, "order_id": null, "request_id": "REQ_1", "product_id": 1001, "user_id": 42, "quantity": 2, "reason": "sold_out", "occurred_at": "2026-11-29T10:00:00.123456Z"}"#;
        let event = decode_event(body.as_bytes()).expect("valid");
        assert_eq!(event.event_type, EventType::ReservationReleased);
        assert_eq!(event.order_id, None);
        assert_eq!(event.units.map(|(u, q)| (u.get(), q.get())), Some((42, 2)));
        assert_eq!(event.reason.as_deref(), Some("sold_out"));
        assert_eq!(
            event.occurred_at.to_rfc3339(),
            "2026-11-29T10:00:00.123456+00:00"
        );
        let escaped = body.replace("\"REQ_1\"", "\"REQ\\u005f1\"");
        assert_eq!(
            decode_event(escaped.as_bytes()).expect("valid").request_id,
            event.request_id
        );
        let bad = body.replace("\"quantity\": 2", "\"quantity\": 0");
        assert!(matches!(
            decode_event(bad.as_bytes()),
            Err(DecodeError::Quantity(0))
        ));
        let bad = body.replace("\"product_id\": 1001", "\"product_id\": 0");
        assert!(matches!(
            decode_event(bad.as_bytes()),
            Err(DecodeError::Field(_))
        ));
        for at in [
            "2026-11-29T10:00:00.123456",
            "2026-11-29 10:00:00.123456",
            "yesterday",
        ] {
            let bad = body.replace("2026-11-29T10:00:00.123456Z", at);
            let refused = decode_event(bad.as_bytes());
            assert!(matches!(refused, Err(DecodeError::Json(_))), "{at}");
        }
        assert!(matches!(decode_event(b"{}"), Err(DecodeError::Json(_))));
        // An event_id of 64 characters (multi-byte ones count as one each) is the longest.
        let id = "5f0c6a4e-ebf5-11f1-b3b2-02fc00000001";
        let longest = "é".repeat(EVENT_ID_CHARS_MAX);
        assert!(decode_event(body.replace(id, &longest).as_bytes()).is_ok());
        for bad in [String::new(), "x".repeat(EVENT_ID_CHARS_MAX + 1)] {
            let refused = decode_event(body.replace(id, &bad).as_bytes());
            assert!(
                matches!(refused, Err(DecodeError::EventIdLength(n)) if n == bad.len()),
                "{bad}"
            );
        }
    }

    // Checks a stock repair's event as MariaDB writes it (docs/events.md): no buyer and
    // no units, its facts in fields a consumer may ignore; and that a repair carrying a
    // buyer, or an order's event without one, is refused, each by its own case.
    #[test]
    fn decodes_a_stock_repair() {
        let body = r#"{"event_id": "5f0c6a4e-ebf5-11f1-b3b2-02fc00000009", "event_type": "stock_repaired", "sequence": 1, "order_id": null, "request_id": "REPAIR_3", "product_id": 1001, "repair_id": 3, "generation": 2, "redis_before": 15, "redis_after": 10, "delta": -5, "expected": 10, "reason": "drift seen twice, unchanged in between", "occurred_at": "2026-11-29T10:00:00.123456Z"}"#;
        let event = decode_event(body.as_bytes()).expect("valid");
        assert_eq!(event.event_type, EventType::StockRepaired);
        assert_eq!(event.units, None);
        assert_eq!(event.request_id.as_str(), "REPAIR_3");
        let with_buyer = body.replace("\"repair_id\"", "\"user_id\": 4, \"quantity\": 1, \"x\"");
        let refused = decode_event(with_buyer.as_bytes());
        assert!(matches!(
            refused,
            Err(DecodeError::UnitsOnProductEvent(EventType::StockRepaired))
        ));
        assert_eq!(
            refused.expect_err("refused").to_string(),
            "invalid event: stock_repaired: no user_id or quantity (it has no buyer)"
        );
        let order = body.replace("stock_repaired", "order_paid");
        assert!(matches!(
            decode_event(order.as_bytes()),
            Err(DecodeError::UnitsMissing(EventType::OrderPaid))
        ));
    }

    // Checks message bodies: an array of events decodes element by element (a bad one,
    // or one that is no event at all, is an error of its own, the rest still decode, and
    // each decodes as it would alone), a bare event object (the format before
    // packing) reads as one event, and a broken array is an error.
    #[test]
    fn decodes_packed_and_single_messages() {
        let one = r#"{"event_id": "5f0c6a4e-ebf5-11f1-b3b2-02fc00000001", "event_type": "order_created", "sequence": 1, "order_id": 7, "request_id": "REQ_1", "product_id": 1001, "user_id": 42, "quantity": 2, "reason": null, "occurred_at": "2026-11-29T10:00:00.123456Z"}"#;
        let two = one.replace("REQ_1", "REQ_2").replace("0001\"", "0002\"");
        let bad = one.replace("\"quantity\": 2", "\"quantity\": -1");
        let body = format!(" [{one},{bad}, {two}]");
        let events = decode_message(body.as_bytes()).expect("an array");
        assert_eq!(events.len(), 3);
        assert_eq!(
            events[0].as_ref().expect("first").request_id.as_str(),
            "REQ_1"
        );
        assert!(events[1].is_err());
        let second = events[2].as_ref().expect("third");
        assert_eq!(second.request_id.as_str(), "REQ_2");
        assert!(second.event_id.ends_with("0002"));
        let single = decode_message(one.as_bytes()).expect("an object");
        assert_eq!(single.len(), 1);
        assert_eq!(
            single[0].as_ref().expect("event").order_id.map(|o| o.get()),
            Some(7)
        );
        // An element that is no event at all (a field of the wrong type) costs only
        // itself too: the body is then read element by element.
        let broken = one.replace("\"quantity\": 2", "\"quantity\": \"two\"");
        let body = format!("[{one},{broken},{two}]");
        let events = decode_message(body.as_bytes()).expect("an array");
        assert_eq!(events.len(), 3);
        assert!(events[1].is_err());
        assert_eq!(
            events[2].as_ref().expect("third").request_id.as_str(),
            "REQ_2"
        );
        // Read in one pass, a pack gives what each of its events gives alone.
        let body = format!("[{one},{two}]");
        let packed = decode_message(body.as_bytes()).expect("an array");
        for (event, alone) in packed.iter().zip([one, two.as_str()]) {
            assert_eq!(
                format!("{:?}", event.as_ref().expect("packed")),
                format!("{:?}", decode_event(alone.as_bytes()).expect("alone"))
            );
        }
        assert!(decode_message(format!("[{one}").as_bytes()).is_err());
        assert!(decode_message(b"[]").expect("empty").is_empty());
        let garbage = decode_message(b"nonsense").expect("read as one event");
        assert!(garbage[0].is_err());
    }
}
