//! Stock counters and the conservation rule that ties them together.

/// One product's counters as the ledger keeps them (`product_inventory`).
///
/// `available + reserved + sold == total`, every term ≥ 0. `reserved` counts units held
/// by PROCESSING reservations (unpaid orders), `sold` units of CONFIRMED ones (paid).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InventoryCounters {
    pub total: i64,
    pub available: i64,
    pub reserved: i64,
    pub sold: i64,
}

/// A broken counter rule, described for an operator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("inventory counters violate {rule}: {counters:?}")]
pub struct CounterViolation {
    pub rule: &'static str,
    pub counters: InventoryCounters,
}

impl InventoryCounters {
    /// Checks conservation and non-negativity (invariants I1 and I4 on the ledger side).
    pub fn check(&self) -> Result<(), CounterViolation> {
        let fail = |rule| {
            Err(CounterViolation {
                rule,
                counters: *self,
            })
        };
        if self.available < 0 || self.reserved < 0 || self.sold < 0 {
            return fail("non-negative counters");
        }
        if self.available + self.reserved + self.sold != self.total {
            return fail("available + reserved + sold == total");
        }
        Ok(())
    }

    /// Checks the counters against what the orders say: `reserved` must equal the units of
    /// PENDING_PAYMENT orders and `sold` the units of PAID orders.
    pub fn check_against_orders(
        &self,
        pending_units: i64,
        paid_units: i64,
    ) -> Result<(), CounterViolation> {
        self.check()?;
        if self.reserved != pending_units {
            return Err(CounterViolation {
                rule: "reserved == units of PENDING_PAYMENT orders",
                counters: *self,
            });
        }
        if self.sold != paid_units {
            return Err(CounterViolation {
                rule: "sold == units of PAID orders",
                counters: *self,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(total: i64, available: i64, reserved: i64, sold: i64) -> InventoryCounters {
        InventoryCounters {
            total,
            available,
            reserved,
            sold,
        }
    }

    // Checks conservation holds for a balanced set and is refused for each way to break
    // it: a lost unit, an extra unit, a negative counter.
    #[test]
    fn conservation() {
        assert!(c(10, 5, 3, 2).check().is_ok());
        assert!(c(10, 5, 3, 1).check().is_err());
        assert!(c(10, 6, 3, 2).check().is_err());
        assert!(c(10, 11, -1, 0).check().is_err());
    }

    // Checks the counters are compared with order facts, not just with each other.
    #[test]
    fn against_orders() {
        let k = c(10, 5, 3, 2);
        assert!(k.check_against_orders(3, 2).is_ok());
        assert!(k.check_against_orders(2, 2).is_err());
        assert!(k.check_against_orders(3, 3).is_err());
    }
}
