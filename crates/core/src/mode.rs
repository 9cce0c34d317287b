//! Who serves a product's stock: the gate (Redis) or the ledger (MariaDB).
//!
//! The ledger decides the mode and keeps it beside the stock generation. In gate mode a
//! purchase takes a hold in the gate and the ledger commits it; in ledger mode the ledger
//! alone decides and records the purchase, handing out the hold ids itself. Entering
//! ledger mode advances the generation, so no hold the gate handed out before can
//! commit; leaving it advances the generation again and plans the gate's rebuild from the
//! ledger's facts.

use std::fmt;

use crate::state::UnknownStatus;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum StockMode {
    /// Purchases go through the gate's hold, then the ledger's commit.
    #[default]
    Gate,
    /// Purchases are decided and recorded by the ledger alone.
    Ledger,
}

impl StockMode {
    /// The mode as the API and the logs name it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Gate => "gate",
            Self::Ledger => "ledger",
        }
    }

    /// The mode as the ledger stores it (`product_inventory.stock_mode`).
    pub const fn as_stored(self) -> &'static str {
        match self {
            Self::Gate => "GATE",
            Self::Ledger => "LEDGER",
        }
    }

    /// A stored value (`GATE` / `LEDGER`); anything else is none of ours.
    pub fn from_stored(s: &str) -> Result<Self, UnknownStatus> {
        match s {
            "GATE" => Ok(Self::Gate),
            "LEDGER" => Ok(Self::Ledger),
            _ => Err(UnknownStatus {
                kind: "stock mode",
                value: s.to_owned(),
            }),
        }
    }
}

impl fmt::Display for StockMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the two names of each mode: the stored value parses back to the mode, the
    // API's name is the lower-case word, and a value none of ours (another case, an
    // empty string, the API's name) is refused.
    #[test]
    fn a_mode_round_trips_through_its_stored_value() {
        for mode in [StockMode::Gate, StockMode::Ledger] {
            assert_eq!(StockMode::from_stored(mode.as_stored()), Ok(mode));
            assert_eq!(mode.to_string(), mode.as_str());
        }
        assert_eq!(StockMode::Gate.as_str(), "gate");
        assert_eq!(StockMode::Ledger.as_str(), "ledger");
        for bad in ["", "gate", "Ledger", "REDIS"] {
            assert!(StockMode::from_stored(bad).is_err(), "{bad:?}");
        }
    }
}
