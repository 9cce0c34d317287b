//! flashsale's use cases, written against small port traits.
//!
//! [`ports`] names what the use cases need from the outside world (a stock gate, a
//! ledger, a clock); adapter crates implement them for Redis and MariaDB, and in-memory
//! implementations can stand in for them without touching a use case. [`Flashsale`] holds
//! the use cases; the HTTP layer calls nothing else.

pub mod after_sale;
pub mod audit;
pub mod baseline;
mod catalog;
pub mod dashboard;
pub mod destock;
mod error;
pub mod fallback;
pub mod group;
pub mod limit;
pub mod listing;
pub mod maintenance;
pub mod metrics;
pub mod model;
pub mod modes;
pub mod outcome;
pub mod ports;
mod service;
pub mod sold_out;

pub use after_sale::{SaleRetirement, SaleRetirementGate, SaleRetirements};
pub use audit::AuditBounds;
pub use control::{Acted, Announcer, Controls, RefundAsk, Refunded, SaleControl, SaleSwitch};
pub use dashboard::Sampler;
pub use destock::{Destocking, Destocks};
pub use error::Error;
pub use fallback::{Fallback, FallbackSettings};
pub use listing::{Listing, Listings, Page};
pub use maintenance::{
    AuditScheduleSettings, Decision, IncidentView, Maintenance, MaintenanceSettings,
    Reconciliation, RecoveryReport, Repair, Resolved, ScheduledAudits, Unresolved,
    AUDIT_CLAIM_LEASE, OUTCOME_UNKNOWN, REPAIR_SETTLE, REPAIR_UNITS_PER_PASS,
};
pub use metrics::{Metrics, Monitor, ProductStock, StoreView};
pub use model::*;
pub use outcome::Outcome;
pub use ports::{Clock, GateError, Ledger, LedgerError, Ports, StockGate, SystemClock};
pub use service::{Flashsale, Settings};

pub mod consume;
pub mod control;
pub mod events;
pub mod relay;

pub use consume::{Consume, DeadReason, Settle, StatsDelta};
pub use events::{Event, EventType, OutboxMessage};
pub use ports::{Applied, BusError, EventBus, Outbox, ParkedRow, PublishFailure, StatsStore};
pub use relay::{Relay, RelayError};
