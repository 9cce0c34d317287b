//! Group commit's decision, without I/O: which purchases of a batch go together in the
//! next group transaction, which are set aside and committed one by one, when the whole
//! batch falls back to one by one, and which members get the batch's own result.
//!
//! The MariaDB adapter (`MysqlLedger::group_commit`) and the simulator's ledger
//! (`MemLedger`) both run the same loop: ask [`GroupCommit::next`] for the members of the
//! next group transaction, run it, feed what it did back with [`GroupCommit::written`],
//! and when `next` says there is nothing more to try, answer each member as
//! [`GroupCommit::answers`] says. The rules:
//!
//! - a request_id's first copy in the batch may go in a group transaction; a later copy
//!   is set aside (its request_id will be taken by the first one, or by the one-by-one
//!   path, where it learns its answer);
//! - a transaction that met taken request_ids sets those aside and tries the rest again;
//! - one that would take users over a per-user limit keeps, per (user, product), the
//!   purchases that fit in batch order, and sets the rest aside;
//! - one that met anything else (too few units, a rebuilt generation, a hold id taken)
//!   sends the whole batch one by one, where each such case has its answer;
//! - one whose outcome is unknown (an error, a lost reply) gives that error to each of
//!   its members; the set-aside ones still go one by one;
//! - at most [`GROUP_ATTEMPTS_MAX`] group transactions; past that the rest go one by one.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use flashsale_core::{ProductId, PurchaseRequest, RequestId, UserId};

/// Group transactions tried per batch: after one that met taken request_ids and set them
/// aside, and one that met users over a per-user limit and set their excess aside, one
/// more for the rest; past that the batch goes one by one.
pub const GROUP_ATTEMPTS_MAX: usize = 3;

/// A user's live units of a product before the batch, and the product's per-user limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub before: i64,
    pub limit: i64,
}

/// The (user, product) pairs a group transaction would take over their per-user limit.
pub type OverLimit = BTreeMap<(UserId, ProductId), Held>;

/// What one group transaction did, as the ledger reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Written {
    /// Committed: one order per member, in the members' order.
    Orders,
    /// Rolled back; these request_ids are taken in the ledger. Empty: something else
    /// kept the batch from going the plain way.
    Taken(BTreeSet<RequestId>),
    /// Rolled back; these pairs would go over their per-user limit.
    OverLimit(OverLimit),
    /// Unknown whether it committed (an error, a lost reply).
    Unknown,
}

/// How one member of the batch is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Committed by the group transaction: the `n`th of its orders.
    Committed(usize),
    /// The group transaction's outcome is unknown: its error.
    Unknown,
    /// Set aside: committed on its own, where it learns its answer.
    OneByOne,
}

/// The decision for one batch, fed with what each group transaction did.
#[derive(Debug)]
pub struct GroupCommit<'a> {
    batch: Vec<&'a PurchaseRequest>,
    /// The members of the next group transaction, in batch order; the others are set
    /// aside.
    plain: Vec<usize>,
    /// The transaction that committed (its members, in order), or whose outcome is
    /// unknown.
    ended: Option<(Vec<usize>, bool)>,
    /// The whole rest goes one by one.
    one_by_one: bool,
    attempts: usize,
}

impl<'a> GroupCommit<'a> {
    /// The decision for `batch`: the first copy of each request_id may go together; the
    /// later copies are set aside.
    pub fn new(batch: impl IntoIterator<Item = &'a PurchaseRequest>) -> Self {
        let batch: Vec<&PurchaseRequest> = batch.into_iter().collect();
        let mut seen = HashSet::with_capacity(batch.len());
        let plain = (0..batch.len())
            .filter(|&i| seen.insert(&batch[i].request_id))
            .collect();
        Self {
            batch,
            plain,
            ended: None,
            one_by_one: false,
            attempts: 0,
        }
    }

    /// The members (indices into the batch, in batch order) of the next group
    /// transaction, or `None` when there is none to try.
    pub fn next(&self) -> Option<&[usize]> {
        let done = self.ended.is_some()
            || self.one_by_one
            || self.plain.is_empty()
            || self.attempts >= GROUP_ATTEMPTS_MAX;
        (!done).then_some(self.plain.as_slice())
    }

    /// Group transactions tried so far.
    pub fn attempts(&self) -> usize {
        self.attempts
    }

    /// What the transaction of the members [`next`](Self::next) named did. Ignored when
    /// there was none to try.
    pub fn written(&mut self, written: Written) {
        if self.next().is_none() {
            return;
        }
        self.attempts += 1;
        match written {
            Written::Orders => self.ended = Some((std::mem::take(&mut self.plain), true)),
            Written::Unknown => self.ended = Some((std::mem::take(&mut self.plain), false)),
            Written::Taken(taken) if taken.is_empty() => self.one_by_one = true,
            Written::Taken(taken) => {
                let batch = &self.batch;
                self.plain
                    .retain(|&i| !taken.contains(&batch[i].request_id));
            }
            Written::OverLimit(mut over) => {
                let batch = &self.batch;
                self.plain.retain(|&i| {
                    let r = batch[i];
                    let Some(held) = over.get_mut(&(r.user_id, r.product_id)) else {
                        return true;
                    };
                    let q = i64::from(r.quantity.get());
                    let fits = held.before + q <= held.limit;
                    if fits {
                        held.before += q;
                    }
                    fits
                });
            }
        }
    }

    /// Each member's answer, in batch order. What was never tried or never ended goes
    /// one by one.
    pub fn answers(self) -> Vec<Answer> {
        let mut answers = vec![Answer::OneByOne; self.batch.len()];
        if let Some((members, committed)) = &self.ended {
            for (n, &i) in members.iter().enumerate() {
                answers[i] = if *committed {
                    Answer::Committed(n)
                } else {
                    Answer::Unknown
                };
            }
        }
        answers
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flashsale_core::Quantity;
    use proptest::prelude::*;

    fn purchase(request_id: &str, user: i64, product: i64, quantity: i64) -> PurchaseRequest {
        PurchaseRequest {
            request_id: RequestId::parse("request_id", request_id).expect("valid id"),
            user_id: UserId::parse(user).expect("valid user"),
            product_id: ProductId::parse(product).expect("valid product"),
            quantity: Quantity::parse(quantity, 100).expect("valid quantity"),
        }
    }

    fn ids(names: &[&str]) -> BTreeSet<RequestId> {
        names
            .iter()
            .map(|n| RequestId::parse("request_id", n).expect("valid id"))
            .collect()
    }

    fn pair(user: i64, product: i64) -> (UserId, ProductId) {
        (
            UserId::parse(user).expect("valid user"),
            ProductId::parse(product).expect("valid product"),
        )
    }

    // Checks the plain case: a request_id's later copy is set aside from the start, the
    // first copies go together, and a commit answers each of them with its own order
    // (by position in the transaction) and nothing else from the batch.
    #[test]
    fn later_copies_go_one_by_one_and_the_rest_commit_together() {
        let batch = [
            purchase("a", 1, 1, 1),
            purchase("b", 2, 1, 1),
            purchase("a", 1, 1, 1),
            purchase("c", 3, 1, 1),
        ];
        let mut decision = GroupCommit::new(&batch);
        assert_eq!(decision.next(), Some(&[0, 1, 3][..]));
        decision.written(Written::Orders);
        assert_eq!(decision.next(), None);
        assert_eq!(
            decision.answers(),
            [
                Answer::Committed(0),
                Answer::Committed(1),
                Answer::OneByOne,
                Answer::Committed(2)
            ]
        );
    }

    // Checks that taken request_ids are set aside and the rest tried again, and that a
    // rollback with nothing taken sends every member one by one.
    #[test]
    fn taken_request_ids_are_set_aside_and_anything_else_goes_one_by_one() {
        let batch = [
            purchase("a", 1, 1, 1),
            purchase("b", 2, 1, 1),
            purchase("c", 3, 1, 1),
        ];
        let mut decision = GroupCommit::new(&batch);
        decision.written(Written::Taken(ids(&["b"])));
        assert_eq!(decision.next(), Some(&[0, 2][..]));
        decision.written(Written::Orders);
        assert_eq!(
            decision.answers(),
            [Answer::Committed(0), Answer::OneByOne, Answer::Committed(1)]
        );

        let mut decision = GroupCommit::new(&batch);
        decision.written(Written::Taken(BTreeSet::new()));
        assert_eq!(decision.next(), None);
        assert_eq!(decision.attempts(), 1);
        assert_eq!(decision.answers(), [Answer::OneByOne; 3]);
    }

    // Checks the per-user split: of a user over the limit (1 unit held, limit 3), the
    // purchases that fit in batch order stay (1, then 1: the 2 in between would make 4),
    // the others and other users' purchases are untouched.
    #[test]
    fn over_a_limit_the_purchases_that_fit_in_batch_order_stay() {
        let batch = [
            purchase("a", 1, 1, 1),
            purchase("b", 1, 1, 2),
            purchase("c", 1, 1, 1),
            purchase("d", 2, 1, 5),
            purchase("e", 1, 2, 4),
        ];
        let mut decision = GroupCommit::new(&batch);
        let over = OverLimit::from([(
            pair(1, 1),
            Held {
                before: 1,
                limit: 3,
            },
        )]);
        decision.written(Written::OverLimit(over));
        assert_eq!(decision.next(), Some(&[0, 2, 3, 4][..]));
        decision.written(Written::Orders);
        assert_eq!(
            decision.answers(),
            [
                Answer::Committed(0),
                Answer::OneByOne,
                Answer::Committed(1),
                Answer::Committed(2),
                Answer::Committed(3)
            ]
        );
    }

    // Checks an unknown outcome: its members get the batch's error, the set-aside ones
    // still go one by one, and nothing more is tried.
    #[test]
    fn an_unknown_outcome_is_every_member_s_and_only_theirs() {
        let batch = [purchase("a", 1, 1, 1), purchase("a", 1, 1, 1)];
        let mut decision = GroupCommit::new(&batch);
        decision.written(Written::Unknown);
        assert_eq!(decision.next(), None);
        assert_eq!(decision.answers(), [Answer::Unknown, Answer::OneByOne]);
    }

    // Checks the bound: after GROUP_ATTEMPTS_MAX rollbacks that each set one member
    // aside, nothing more is tried, a further report is ignored, and the rest go one
    // by one.
    #[test]
    fn attempts_are_bounded() {
        let batch = [
            purchase("a", 1, 1, 1),
            purchase("b", 1, 1, 1),
            purchase("c", 1, 1, 1),
            purchase("d", 1, 1, 1),
            purchase("e", 1, 1, 1),
        ];
        let mut decision = GroupCommit::new(&batch);
        for name in ["a", "b", "c"] {
            assert!(decision.next().is_some());
            decision.written(Written::Taken(ids(&[name])));
        }
        assert_eq!(decision.attempts(), GROUP_ATTEMPTS_MAX);
        assert_eq!(decision.next(), None);
        decision.written(Written::Orders);
        assert_eq!(decision.answers(), [Answer::OneByOne; 5]);
    }

    /// A batch: request_ids from a small pool (so copies occur), a few users and
    /// products, quantities 1–3.
    fn batches() -> impl Strategy<Value = Vec<PurchaseRequest>> {
        prop::collection::vec((0..6u8, 1..4i64, 1..3i64, 1..4i64), 0..12).prop_map(|rows| {
            rows.into_iter()
                .map(|(id, user, product, q)| purchase(&format!("r{id}"), user, product, q))
                .collect()
        })
    }

    /// What a transaction reports, as raw draws: the kind, which members' request_ids are
    /// taken, and per-pair units held before and limits.
    type Report = (u8, Vec<bool>, Vec<(i64, i64)>);

    fn reports() -> impl Strategy<Value = Vec<Report>> {
        prop::collection::vec(
            (
                0..4u8,
                prop::collection::vec(any::<bool>(), 12),
                prop::collection::vec((0..4i64, 0..6i64), 12),
            ),
            0..6,
        )
    }

    proptest! {
        // Drives the decision with random batches and random reports (taken sets drawn
        // from the members, limits and held units drawn per pair) and checks its
        // invariants: every member gets exactly one answer; a member answered from the
        // batch's result was in the transaction that ended, at that position, and that
        // transaction was the last one tried; a member set aside (a later copy, a taken
        // request_id, an excess over a limit) is never answered from the batch; the
        // members kept after an over-limit report stay within each limit given the units
        // held; the attempts never exceed GROUP_ATTEMPTS_MAX.
        #[test]
        fn the_decision_keeps_its_invariants(batch in batches(), reports in reports()) {
            let mut decision = GroupCommit::new(&batch);
            let mut set_aside: BTreeSet<usize> = BTreeSet::new();
            let mut seen = BTreeSet::new();
            for (i, p) in batch.iter().enumerate() {
                if !seen.insert(p.request_id.clone()) {
                    set_aside.insert(i);
                }
            }
            let mut last: Option<(Vec<usize>, bool)> = None;
            let mut loops = 0;
            let mut reports = reports.into_iter();
            while let Some(members) = decision.next().map(<[usize]>::to_vec) {
                loops += 1;
                prop_assert!(loops <= GROUP_ATTEMPTS_MAX);
                prop_assert!(members.iter().all(|i| !set_aside.contains(i)));
                let distinct: BTreeSet<_> = members.iter().map(|&i| &batch[i].request_id).collect();
                prop_assert_eq!(distinct.len(), members.len());
                let (kind, taken, held) = reports.next().unwrap_or((0, Vec::new(), Vec::new()));
                let written = match kind {
                    0 => Written::Orders,
                    1 => Written::Unknown,
                    2 => Written::Taken(
                        members
                            .iter()
                            .zip(&taken)
                            .filter(|(_, t)| **t)
                            .map(|(&i, _)| batch[i].request_id.clone())
                            .collect(),
                    ),
                    _ => Written::OverLimit(
                        members
                            .iter()
                            .zip(&held)
                            .map(|(&i, &(before, extra))| {
                                ((batch[i].user_id, batch[i].product_id), Held { before, limit: before + extra })
                            })
                            .collect(),
                    ),
                };
                match &written {
                    Written::Orders => last = Some((members.clone(), true)),
                    Written::Unknown => last = Some((members.clone(), false)),
                    Written::Taken(t) if t.is_empty() => {
                        set_aside.extend(members.iter().copied());
                    }
                    Written::Taken(t) => set_aside.extend(
                        members.iter().copied().filter(|&i| t.contains(&batch[i].request_id)),
                    ),
                    Written::OverLimit(_) => {}
                }
                decision.written(written.clone());
                if let Written::OverLimit(over) = &written {
                    let kept = decision.next().map(<[usize]>::to_vec).unwrap_or_default();
                    let mut units: BTreeMap<(UserId, ProductId), i64> = BTreeMap::new();
                    for &i in &kept {
                        *units.entry((batch[i].user_id, batch[i].product_id)).or_default() +=
                            i64::from(batch[i].quantity.get());
                    }
                    for (pair, held) in over {
                        prop_assert!(held.before + units.get(pair).copied().unwrap_or(0) <= held.limit);
                    }
                    set_aside.extend(members.iter().copied().filter(|i| !kept.contains(i)));
                }
            }
            prop_assert!(decision.attempts() <= GROUP_ATTEMPTS_MAX);
            let answers = decision.answers();
            prop_assert_eq!(answers.len(), batch.len());
            let mut positions = BTreeSet::new();
            for (i, answer) in answers.iter().enumerate() {
                match answer {
                    Answer::OneByOne => {}
                    Answer::Committed(_) | Answer::Unknown => {
                        prop_assert!(!set_aside.contains(&i), "set-aside member {} answered from the batch", i);
                        let Some((members, committed)) = &last else {
                            return Err(TestCaseError::fail("answered from a batch that never ended"));
                        };
                        let at = members.iter().position(|&m| m == i);
                        prop_assert!(at.is_some());
                        match answer {
                            Answer::Committed(n) => {
                                prop_assert!(*committed);
                                prop_assert_eq!(at, Some(*n));
                                prop_assert!(positions.insert(*n));
                            }
                            _ => prop_assert!(!*committed),
                        }
                    }
                }
            }
            if let Some((members, committed)) = &last {
                // Every member of the transaction that ended has its answer from it.
                for &m in members {
                    prop_assert_eq!(answers[m] == Answer::OneByOne, false);
                }
                if *committed {
                    prop_assert_eq!(positions.len(), members.len());
                }
            }
        }
    }
}
