//! `flashsale ledger`: which form the ledger's purchase keys take (`scope`), and the
//! rewrite of every key into the other form (`rescope`), for turning buyer
//! authentication on or off on a ledger that already holds purchases. `serve` refuses to
//! start against a ledger of the other form ([`check`]).

use std::io::Write;

use clap::{Subcommand, ValueEnum};
use flashsale_core::RequestScope;
use flashsale_mysql::MysqlLedger;

use crate::Config;

#[derive(Debug, Subcommand)]
pub enum Action {
    /// The form of the ledger's purchase keys: `global` (the request_id as sent) or
    /// `buyer` (scoped by the authenticated buyer).
    Scope,
    /// Rewrite every purchase key into another form, in one transaction, and move every
    /// product's stock generation on so that the gate is rebuilt from the ledger at the
    /// next start. Stop every instance first. `--to global` is refused, changing
    /// nothing, when two buyers used the same request_id.
    Rescope {
        #[arg(long, value_enum)]
        to: ScopeArg,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ScopeArg {
    Global,
    Buyer,
}

impl From<ScopeArg> for RequestScope {
    fn from(arg: ScopeArg) -> Self {
        match arg {
            ScopeArg::Global => Self::Global,
            ScopeArg::Buyer => Self::Buyer,
        }
    }
}

/// Runs `action` against the configured ledger (migrated first), writing to `out`.
pub async fn run(
    config: &Config,
    action: Action,
    out: &mut (dyn Write + Send),
) -> Result<(), String> {
    let ledger = crate::connect_ledger(config).await?;
    ledger.migrate().await.map_err(|e| e.to_string())?;
    let wanted = config.buyer_auth.request_scope();
    let line = match action {
        Action::Scope => match ledger.recorded_scope().await.map_err(|e| e.to_string())? {
            Some(held) => format!("request scope: {}", held.as_str()),
            None => format!(
                "request scope: none recorded yet (the first instance to serve records its \
                 own; this configuration's is {})",
                wanted.as_str()
            ),
        },
        Action::Rescope { to } => {
            let to = RequestScope::from(to);
            let done = ledger.rescope(to).await.map_err(|e| e.to_string())?;
            format!(
                "request scope: {}; keys rewritten: purchases {}, outbox rows {}; products \
                 whose gate is rebuilt from the ledger at the next start: {}",
                to.as_str(),
                done.purchases,
                done.events,
                done.products
            )
        }
    };
    writeln!(out, "{line}").map_err(|e| e.to_string())
}

/// Refuses to serve a ledger whose purchase keys take the other form than this
/// instance's buyer authentication writes: a retry would miss its first attempt's key
/// and be bought again.
pub async fn check(config: &Config, ledger: &MysqlLedger) -> Result<(), String> {
    let wanted = config.buyer_auth.request_scope();
    let held = ledger
        .request_scope(wanted)
        .await
        .map_err(|e| e.to_string())?;
    if held == wanted {
        return Ok(());
    }
    let (held_how, wanted_how) = match held {
        RequestScope::Global => (
            "by request_id alone (written without buyer authentication, or by a version \
             before buyer-scoped keys)",
            "authenticates buyers and keys each purchase by its buyer",
        ),
        RequestScope::Buyer => (
            "by buyer (written with buyer authentication on)",
            "has no buyer authentication (FLASHSALE_BUYER_AUTH=none) and keys purchases by \
             request_id alone",
        ),
    };
    Err(format!(
        "the ledger keys its purchases {held_how}, but this instance {wanted_how}: a retry \
         of an earlier purchase would be taken as a new one. Stop every instance, run \
         `flashsale ledger rescope --to {}` once, and start them again",
        wanted.as_str()
    ))
}
