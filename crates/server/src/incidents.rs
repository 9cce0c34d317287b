//! `flashsale incidents`: the recovery incidents a person must look at (`list`), one of
//! them with what the stores know of it now (`show`), and a person's decision on it
//! (`resolve`): release the hold's units, or confirm its order (`flashsale_app`'s
//! `Maintenance::resolve_incident` says how each is made exact).

use std::io::Write;
use std::process::ExitCode;

use clap::{Subcommand, ValueEnum};
use flashsale_app::ports::Incident;
use flashsale_app::{Decision, IncidentView, Maintenance, Resolved, Unresolved};

/// Most incidents `list` shows: the newest; an operator with more than this open has a
/// store to repair before a queue to work through.
const LISTED_MAX: usize = 200;
/// Most characters of an incident's detail `list` shows on its line (`show` has it all).
const DETAIL_SHOWN_MAX: usize = 60;
/// The exit code of a decision not carried out (the incident stays as it was).
const EXIT_NOT_DONE: u8 = 1;

#[derive(Debug, Subcommand)]
pub enum Action {
    /// The open incidents, newest first (with --all, the closed ones too).
    List {
        #[arg(long)]
        all: bool,
    },
    /// One incident, with what Redis and MariaDB know of its request now.
    Show {
        #[arg(long, value_name = "ID")]
        id: i64,
    },
    /// A person's decision on an open outcome_unknown incident: `release` gives the
    /// hold's units back (the purchase did not happen), `confirm` makes its order (it
    /// did). Exit 0 done, 1 not done (the reason is printed; nothing changed), 2 error.
    Resolve {
        #[arg(long, value_name = "ID")]
        id: i64,
        #[arg(long, value_enum)]
        decision: DecisionArg,
        /// Why: what was checked (the payment provider, the buyer), kept with the decision.
        #[arg(long)]
        note: String,
        /// Who decides (default: $USER).
        #[arg(long, value_name = "NAME")]
        by: Option<String>,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DecisionArg {
    Release,
    Confirm,
}

/// Runs `action` against `maintenance`'s stores, writing what it shows to `out`.
pub async fn run(
    maintenance: &Maintenance,
    action: Action,
    out: &mut (dyn Write + Send),
) -> Result<ExitCode, String> {
    match action {
        Action::List { all } => list(maintenance, !all, out).await,
        Action::Show { id } => show(maintenance, id, out).await,
        Action::Resolve {
            id,
            decision,
            note,
            by,
        } => {
            let by = by
                .or_else(|| std::env::var("USER").ok())
                .unwrap_or_else(|| "unknown".to_owned());
            let decision = match decision {
                DecisionArg::Release => Decision::Release,
                DecisionArg::Confirm => Decision::Confirm,
            };
            resolve(maintenance, id, decision, &by, &note, out).await
        }
    }
}

fn written(e: std::io::Error) -> String {
    format!("writing the output: {e}")
}

async fn list(
    maintenance: &Maintenance,
    open_only: bool,
    out: &mut (dyn Write + Send),
) -> Result<ExitCode, String> {
    let incidents = maintenance
        .incidents(open_only, LISTED_MAX)
        .await
        .map_err(|e| e.to_string())?;
    let what = if open_only { "open" } else { "all" };
    writeln!(
        out,
        "{} incident(s) ({what}, newest first)",
        incidents.len()
    )
    .map_err(written)?;
    for i in &incidents {
        let detail: String = i.detail.chars().take(DETAIL_SHOWN_MAX).collect();
        writeln!(
            out,
            "{:>6}  {:<6}  {}  product {:<8} {:<18} {:<32} {detail}",
            i.id,
            state(i),
            i.created_at.format("%Y-%m-%d %H:%M:%S"),
            i.product_id,
            i.kind,
            i.request_id,
        )
        .map_err(written)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn state(i: &Incident) -> &'static str {
    match &i.closed {
        None => "open",
        Some(c) if c.closing.is_some() => "decided",
        Some(_) => "closed",
    }
}

async fn show(
    maintenance: &Maintenance,
    id: i64,
    out: &mut (dyn Write + Send),
) -> Result<ExitCode, String> {
    let Some(view) = maintenance
        .incident_view(id)
        .await
        .map_err(|e| e.to_string())?
    else {
        return Err(format!("no incident {id}"));
    };
    write_view(&view, out).map_err(written)?;
    Ok(ExitCode::SUCCESS)
}

fn write_view(view: &IncidentView, out: &mut (dyn Write + Send)) -> std::io::Result<()> {
    let i = &view.incident;
    writeln!(out, "incident {} ({})", i.id, state(i))?;
    writeln!(out, "  request_id  {}", i.request_id)?;
    writeln!(out, "  product     {}", i.product_id)?;
    writeln!(out, "  kind        {}", i.kind)?;
    writeln!(out, "  raised      {}", i.created_at.to_rfc3339())?;
    writeln!(out, "  detail      {}", i.detail)?;
    if let Some(closed) = &i.closed {
        match &closed.closing {
            Some(c) => writeln!(
                out,
                "  decided     {} by {} at {}: {}",
                c.decision,
                c.by,
                closed.at.to_rfc3339(),
                c.note
            )?,
            None => writeln!(
                out,
                "  closed      by recovery at {}",
                closed.at.to_rfc3339()
            )?,
        }
    }
    match &view.hold {
        Some(h) => writeln!(
            out,
            "  Redis       holds {} unit(s) for user {} (hold {} of generation {})",
            h.request.quantity, h.request.user_id, h.hold.id, h.hold.generation
        )?,
        None => writeln!(out, "  Redis       no hold pending for it")?,
    }
    match &view.record {
        Some(r) => writeln!(out, "  MariaDB     {:?}", r.outcome)?,
        None => writeln!(out, "  MariaDB     no record (or it would not say)")?,
    }
    Ok(())
}

async fn resolve(
    maintenance: &Maintenance,
    id: i64,
    decision: Decision,
    by: &str,
    note: &str,
    out: &mut (dyn Write + Send),
) -> Result<ExitCode, String> {
    match maintenance.resolve_incident(id, decision, by, note).await {
        Ok(Resolved::Released { returned }) => {
            let how = if returned {
                "its units are back on sale"
            } else {
                "its units go back at recovery's next pass (the gate did not answer now)"
            };
            writeln!(out, "incident {id}: released by {by}; {how}").map_err(written)?;
            Ok(ExitCode::SUCCESS)
        }
        Ok(Resolved::Confirmed(order)) => {
            writeln!(
                out,
                "incident {id}: confirmed by {by}; order {} is {} ({} unit(s) for user {})",
                order.order_id,
                order.status.as_str(),
                order.quantity,
                order.user_id
            )
            .map_err(written)?;
            Ok(ExitCode::SUCCESS)
        }
        Err(Unresolved::Store(e)) => Err(e.to_string()),
        Err(not_done) => {
            writeln!(out, "incident {id}: not done: {not_done}").map_err(written)?;
            Ok(ExitCode::from(EXIT_NOT_DONE))
        }
    }
}
