//! The invariant checks of `flashsale audit`: a pure function of what the two stores hold
//! for one product, so the same rules run in tests, in the CLI and in the simulator.

use crate::ports::{GateFacts, LedgerFacts};

/// One broken invariant, with the request_ids involved (at most [`IDS_SHOWN_MAX`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub invariant: &'static str,
    pub message: String,
    pub request_ids: Vec<String>,
}

/// Most request_ids listed per violation: enough to start an investigation, few enough to
/// keep a report readable when thousands are affected.
pub const IDS_SHOWN_MAX: usize = 20;

/// The result of auditing one product.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditReport {
    pub product_id: i64,
    /// What was measured, as (name, value), in the order checked.
    pub figures: Vec<(&'static str, String)>,
    pub violations: Vec<Violation>,
}

fn ids<'a>(it: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    it.into_iter().take(IDS_SHOWN_MAX).cloned().collect()
}

/// Checks a *quiet* product (no request in flight, recovery done, outbox drained) against
/// I1–I4, I6 and I7 (its outbox side: one event per state change, all delivered; the
/// consumer's side is checked by the event tests). I5 needs the clients' own record of
/// acknowledged orders; the fault tests check it.
pub fn check(product_id: i64, gate: &GateFacts, ledger: &LedgerFacts) -> AuditReport {
    let mut v = Vec::new();
    let mut push = |invariant, message: String, request_ids: Vec<String>| {
        v.push(Violation {
            invariant,
            message,
            request_ids,
        })
    };
    let c = &ledger.counters;
    let live_units = ledger.pending_units + ledger.paid_units;

    // I1: no oversell.
    if live_units > c.total {
        push(
            "I1",
            format!(
                "{live_units} units in live orders exceed the total stock {}",
                c.total
            ),
            vec![],
        );
    }
    match gate.available {
        None => push(
            "I1",
            "Redis has no available count for the product".into(),
            vec![],
        ),
        Some(a) if a < 0 => push("I1", format!("Redis available count is {a} < 0"), vec![]),
        Some(_) => {}
    }

    // I2: one order and one reservation per request.
    if !ledger.orders_without_reservation.is_empty() {
        push(
            "I2",
            format!(
                "{} orders have no reservation",
                ledger.orders_without_reservation.len()
            ),
            ids(&ledger.orders_without_reservation),
        );
    }

    // I3: each reservation resolved consistently with its order, units returned once.
    if !ledger.mismatched.is_empty() {
        push(
            "I3",
            format!(
                "{} reservations disagree with their order's state",
                ledger.mismatched.len()
            ),
            ids(&ledger.mismatched),
        );
    }
    if !ledger.unreturned.is_empty() {
        push(
            "I3",
            format!(
                "{} released reservations have not had their units returned to Redis",
                ledger.unreturned.len()
            ),
            ids(ledger.unreturned.keys()),
        );
    }

    // I4: conservation.
    if let Err(e) = c.check_against_orders(ledger.pending_units, ledger.paid_units) {
        push("I4", e.to_string(), vec![]);
    }
    if let Some(a) = gate.available {
        let expected = c.total - live_units;
        if a != expected {
            push(
                "I4",
                format!(
                    "Redis available {a} != total {} - units in live orders {live_units} = {expected}",
                    c.total
                ),
                vec![],
            );
        }
    }
    let untraced: Vec<&String> = gate
        .held
        .iter()
        .filter(|(request_id, (hold, _))| {
            ledger.live.get(*request_id).map(|(h, _)| h) != Some(hold)
        })
        .map(|(request_id, _)| request_id)
        .collect();
    if !untraced.is_empty() {
        push(
            "I4",
            format!(
                "{} Redis holds take units no live reservation accounts for",
                untraced.len()
            ),
            ids(untraced),
        );
    }

    // I6: no stock limbo once recovery has run.
    let stuck: Vec<&String> = gate
        .pending
        .iter()
        .filter(|r| !ledger.reserved_request_ids.contains(*r))
        .collect();
    if !stuck.is_empty() {
        push(
            "I6",
            format!(
                "{} holds in Redis were never resolved by the ledger",
                stuck.len()
            ),
            ids(stuck),
        );
    }
    if ledger.overdue_unpaid > 0 {
        push(
            "I6",
            format!(
                "{} unpaid orders are past their payment deadline and still hold stock",
                ledger.overdue_unpaid
            ),
            vec![],
        );
    }
    if ledger.open_incidents > 0 {
        push(
            "I6",
            format!("{} recovery incidents are open", ledger.open_incidents),
            vec![],
        );
    }

    // I7: one outbox event per state change, all delivered.
    if !ledger.event_mismatches.is_empty() {
        push(
            "I7",
            format!(
                "{} requests' outbox events do not match their state changes one to one",
                ledger.event_mismatches.len()
            ),
            ids(&ledger.event_mismatches),
        );
    }
    if ledger.unsent_events > 0 {
        push(
            "I7",
            format!(
                "{} outbox events not yet acknowledged by the broker",
                ledger.unsent_events
            ),
            vec![],
        );
    }

    let figures = vec![
        ("total stock", c.total.to_string()),
        (
            "ledger counters available/reserved/sold",
            format!("{}/{}/{}", c.available, c.reserved, c.sold),
        ),
        (
            "units in PENDING_PAYMENT orders",
            ledger.pending_units.to_string(),
        ),
        ("units in PAID orders", ledger.paid_units.to_string()),
        (
            "Redis available",
            gate.available
                .map_or_else(|| "missing".to_owned(), |a| a.to_string()),
        ),
        ("live reservations", ledger.live.len().to_string()),
        ("Redis holds taking units", gate.held.len().to_string()),
        (
            "Redis pending index entries",
            gate.pending.len().to_string(),
        ),
    ];
    AuditReport {
        product_id,
        figures,
        violations: v,
    }
}

impl std::fmt::Display for AuditReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "product {}", self.product_id)?;
        for (name, value) in &self.figures {
            writeln!(f, "  {name:<42} {value}")?;
        }
        if self.violations.is_empty() {
            writeln!(f, "  OK: I1 I2 I3 I4 I6 I7 hold")?;
        }
        for v in &self.violations {
            writeln!(f, "  VIOLATION {}: {}", v.invariant, v.message)?;
            if !v.request_ids.is_empty() {
                writeln!(f, "    request_ids: {}", v.request_ids.join(", "))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashsale_core::InventoryCounters;
    use std::collections::{BTreeMap, BTreeSet};

    fn quiet() -> (GateFacts, LedgerFacts) {
        let live: BTreeMap<String, (i64, i64)> =
            [("A".to_owned(), (1, 2)), ("B".to_owned(), (2, 1))].into();
        let gate = GateFacts {
            available: Some(7),
            held: live.clone(),
            pending: BTreeSet::from(["A".to_owned()]),
        };
        let ledger = LedgerFacts {
            counters: InventoryCounters {
                total: 10,
                available: 7,
                reserved: 2,
                sold: 1,
            },
            pending_units: 2,
            paid_units: 1,
            orders_without_reservation: vec![],
            mismatched: vec![],
            reserved_request_ids: live.keys().cloned().collect(),
            live,
            unreturned: BTreeMap::new(),
            overdue_unpaid: 0,
            open_incidents: 0,
            event_mismatches: vec![],
            unsent_events: 0,
        };
        (gate, ledger)
    }

    fn broken(gate: &GateFacts, ledger: &LedgerFacts) -> Vec<&'static str> {
        check(1, gate, ledger)
            .violations
            .iter()
            .map(|v| v.invariant)
            .collect()
    }

    // Checks a consistent product passes, then breaks one fact at a time and expects the
    // invariant it belongs to (and only that kind) to be reported.
    #[test]
    fn each_broken_fact_names_its_invariant() {
        let (gate, ledger) = quiet();
        assert!(broken(&gate, &ledger).is_empty());

        let (mut g, l) = quiet();
        g.available = Some(-1);
        assert!(broken(&g, &l).contains(&"I1"));

        let (g, mut l) = quiet();
        l.orders_without_reservation = vec!["X".into()];
        assert_eq!(broken(&g, &l), vec!["I2"]);

        let (g, mut l) = quiet();
        l.mismatched = vec!["A".into()];
        assert_eq!(broken(&g, &l), vec!["I3"]);

        let (mut g, l) = quiet();
        g.available = Some(8);
        assert_eq!(broken(&g, &l), vec!["I4"]);

        let (mut g, l) = quiet();
        g.held.insert("ghost".into(), (9, 1));
        assert_eq!(broken(&g, &l), vec!["I4"]);

        let (mut g, l) = quiet();
        g.held.insert("B".into(), (99, 1));
        assert_eq!(
            broken(&g, &l),
            vec!["I4"],
            "a hold id that differs is untraced"
        );

        let (mut g, l) = quiet();
        g.pending.insert("lost".into());
        assert_eq!(broken(&g, &l), vec!["I6"]);

        let (g, mut l) = quiet();
        l.overdue_unpaid = 1;
        assert_eq!(broken(&g, &l), vec!["I6"]);

        let (g, mut l) = quiet();
        l.event_mismatches = vec!["A".into()];
        assert_eq!(broken(&g, &l), vec!["I7"]);

        let (g, mut l) = quiet();
        l.unsent_events = 3;
        assert_eq!(broken(&g, &l), vec!["I7"]);

        let (g, mut l) = quiet();
        l.pending_units = 20;
        l.counters.reserved = 20;
        l.counters.available = -11;
        let found = broken(&g, &l);
        assert!(found.contains(&"I1") && found.contains(&"I4"), "{found:?}");
    }

    // Checks a live reservation whose Redis record expired (retention passed) is not
    // reported: its units are still counted, only the record is gone.
    #[test]
    fn expired_records_are_not_violations() {
        let (mut g, l) = quiet();
        g.held.remove("B");
        assert!(broken(&g, &l).is_empty());
    }
}
