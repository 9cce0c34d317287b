//! The identity of a hold: the units the stock gate took for one purchase attempt.
//!
//! A hold is named by the stock generation it was taken in and its id within the product
//! (ids count up per generation, and a rebuild may hand an id out again in the next one).
//! Both are integers in the stores; here they are distinct types, so passing one for the
//! other, or the pair in the wrong order, does not compile. They are obtained only from
//! values the gate or the ledger stored, never from client input.

use std::fmt;

/// A product's stock generation: it goes up each time the gate's state for the product is
/// rebuilt from the ledger, and every hold and restock carries the one it belongs to.
/// Generations start at 1 (the ledger's column default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Generation(i64);

impl Generation {
    /// The generation of a product whose gate state was never rebuilt.
    pub const FIRST: Generation = Generation(1);

    /// For values read back from our own stores, which only ever hold generations ≥ 1.
    pub fn from_stored(raw: i64) -> Option<Self> {
        (raw >= 1).then_some(Self(raw))
    }

    /// The generation a rebuild moves to.
    pub fn next(self) -> Self {
        debug_assert!(
            self.0 < i64::MAX,
            "a generation moves on once per rebuild: i64::MAX rebuilds cannot happen"
        );
        Self(self.0 + 1)
    }

    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A hold's id among the product's holds of one generation, handed out by the gate
/// counting up from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HoldId(i64);

impl HoldId {
    /// For values read back from our own stores, which only ever hold ids ≥ 1.
    pub fn from_stored(raw: i64) -> Option<Self> {
        (raw >= 1).then_some(Self(raw))
    }

    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for HoldId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One hold, fully named: its id alone is ambiguous across generations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HoldRef {
    pub generation: Generation,
    pub id: HoldId,
}

impl HoldRef {
    /// For a (generation, hold id) pair read back from our own stores.
    pub fn from_stored(generation: i64, id: i64) -> Option<Self> {
        Some(Self {
            generation: Generation::from_stored(generation)?,
            id: HoldId::from_stored(id)?,
        })
    }
}

impl fmt::Display for HoldRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.generation, self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that stored generations and hold ids are accepted exactly from 1 up, that
    // both round-trip through get(), and that `next` moves a generation up by one.
    #[test]
    fn stored_values_start_at_one() {
        assert_eq!(Generation::from_stored(0), None);
        assert_eq!(Generation::from_stored(-1), None);
        assert_eq!(Generation::from_stored(1), Some(Generation::FIRST));
        assert_eq!(
            Generation::from_stored(i64::MAX).map(Generation::get),
            Some(i64::MAX)
        );
        assert_eq!(Generation::FIRST.next().get(), 2);
        assert_eq!(HoldId::from_stored(0), None);
        assert_eq!(HoldId::from_stored(-7), None);
        assert_eq!(HoldId::from_stored(7).map(HoldId::get), Some(7));
    }

    // Checks that a hold is named by both parts in their own places: the pair (3, 7)
    // and the swapped pair (7, 3) are different holds, and either part out of range
    // names none.
    #[test]
    fn hold_ref_keeps_its_parts_apart() {
        let hold = HoldRef::from_stored(3, 7).expect("valid");
        assert_eq!((hold.generation.get(), hold.id.get()), (3, 7));
        assert_ne!(Some(hold), HoldRef::from_stored(7, 3));
        assert_eq!(HoldRef::from_stored(0, 7), None);
        assert_eq!(HoldRef::from_stored(3, 0), None);
        assert_eq!(hold.to_string(), "3/7");
    }
}
