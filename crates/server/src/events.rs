//! `flashsale events`: what a person does with the events no worker could deliver. `dead`
//! works through the dead-letter stream (the messages the statistics consumer gave up
//! on): `list` them, `replay` them into the event stream (applied once: the consumer
//! drops what it applied before), or `drop` one with who and why. The letters and their
//! records live in the dead-letter stream itself (`flashsale_nats`'s `dead` module says
//! why). `parked` lists the outbox rows the relay parked (the broker refused them for
//! good) and puts them back to be published, once the broker takes them.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use flashsale_app::ports::Outbox;
use flashsale_nats::{DeadLetter, NatsBus, Settled};

use crate::Config;

/// How long a command waits for NATS to answer before it gives up: the client connects
/// in milliseconds when the broker is up.
const CONNECT_WAIT: Duration = Duration::from_secs(5);
/// Most characters of a letter's last error `list` shows on its line.
const ERROR_SHOWN_MAX: usize = 80;
/// The exit code of a replay or drop not carried out (the reason is printed).
const EXIT_NOT_DONE: u8 = 1;
/// Most parked rows `parked list` shows and `parked retry` puts back at once: a broker
/// that refuses more than this for good is misconfigured, a matter for its settings
/// before a queue of rows.
const PARKED_MAX: usize = 1_000;

#[derive(Debug, Subcommand)]
pub enum Action {
    /// The dead-letter stream `<stream>_DEAD`: messages the statistics consumer gave up
    /// on (refused by the store at their last allowed delivery, or undecodable).
    Dead {
        #[command(subcommand)]
        action: DeadAction,
    },
    /// Outbox rows the relay parked: the broker refused them for good (a message larger
    /// than it takes) five times in a row. The audit reports their events under I7.
    Parked {
        #[command(subcommand)]
        action: ParkedAction,
    },
}

#[derive(Debug, Subcommand)]
pub enum ParkedAction {
    /// The parked rows, oldest first, with the broker's last refusal.
    List,
    /// Put parked rows back to be published (every one, or the row of --id): once the
    /// broker takes them (its max_payload raised, say). Exit 0 some put back, 1 none.
    Retry {
        /// The outbox row (its id in `list`).
        #[arg(long, value_name = "ID")]
        id: Option<i64>,
    },
}

#[derive(Debug, Subcommand)]
pub enum DeadAction {
    /// The open letters, oldest first (with --all, the replayed and dropped ones too,
    /// with who settled them and why).
    List {
        #[arg(long)]
        all: bool,
    },
    /// Put letters back into the event stream, to be applied exactly once: every open
    /// one, or the one of --id. Exit 0 all replayed, 1 some not (printed), 2 error.
    Replay {
        /// The letter (its ID in `list`).
        #[arg(long, value_name = "ID")]
        id: Option<String>,
        /// Who replays (default: $USER).
        #[arg(long, value_name = "NAME")]
        by: Option<String>,
    },
    /// Discard one letter: it is never applied, and who dropped it, when and why stay
    /// with it. Exit 0 dropped, 1 not (printed), 2 error.
    Drop {
        #[arg(long, value_name = "ID")]
        id: String,
        /// Why: what was checked, kept with the record.
        #[arg(long)]
        note: String,
        /// Who drops it (default: $USER).
        #[arg(long, value_name = "NAME")]
        by: Option<String>,
    },
}

/// Runs `action` against the configured broker, writing what it shows to `out`.
pub async fn run(
    config: &Config,
    action: Action,
    out: &mut (dyn Write + Send),
) -> Result<ExitCode, String> {
    let action = match action {
        Action::Dead { action } => action,
        Action::Parked { action } => {
            let ledger = crate::connect_ledger(config).await?;
            return parked(&ledger, action, out).await;
        }
    };
    let bus = NatsBus::connect(crate::nats_config(config))
        .await
        .map_err(|e| e.to_string())?;
    bus.connected_within(CONNECT_WAIT)
        .await
        .map_err(|e| format!("{e} (FLASHSALE_NATS_URL)"))?;
    dead(&bus, action, out).await
}

fn person(by: Option<String>) -> String {
    by.or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "unknown".to_owned())
}

fn written(e: std::io::Error) -> String {
    format!("writing the output: {e}")
}

/// Runs a `dead` action on `bus`'s dead-letter stream.
pub async fn dead(
    bus: &NatsBus,
    action: DeadAction,
    out: &mut (dyn Write + Send),
) -> Result<ExitCode, String> {
    match action {
        DeadAction::List { all } => list(bus, all, out).await,
        DeadAction::Replay { id, by } => replay(bus, id, &person(by), out).await,
        DeadAction::Drop { id, note, by } => {
            let by = person(by);
            let settled = bus
                .drop_letter(&id, &by, &note)
                .await
                .map_err(|e| e.to_string())?;
            Ok(exit(report(&id, &settled, out)?))
        }
    }
}

async fn list(bus: &NatsBus, all: bool, out: &mut (dyn Write + Send)) -> Result<ExitCode, String> {
    let letters: Vec<DeadLetter> = bus
        .dead_letters()
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter(|l| all || l.state.open())
        .collect();
    let what = if all { "all" } else { "open" };
    let stream = bus.config().dead_stream();
    writeln!(
        out,
        "{} dead letter(s) in {stream} ({what}, oldest first)",
        letters.len()
    )
    .map_err(written)?;
    if !letters.is_empty() {
        writeln!(
            out,
            "{:>10}  {:<9}  {:<24}  {:<11}  {:>10}  {:>6}  {:<32}  last error",
            "ID", "state", "buried", "reason", "deliveries", "events", "subject"
        )
        .map_err(written)?;
    }
    for l in &letters {
        let error: String = l.error.chars().take(ERROR_SHOWN_MAX).collect();
        writeln!(
            out,
            "{:>10}  {:<9}  {:<24}  {:<11}  {:>10}  {:>6}  {:<32}  {error}",
            l.key,
            l.state.as_str(),
            l.buried_at,
            l.reason,
            l.deliveries,
            l.events,
            l.subject
        )
        .map_err(written)?;
        if let (Some(by), Some(at)) = (&l.by, &l.settled_at) {
            let copy = l
                .replayed_as
                .map(|s| format!(", copy at sequence {s} of {}", l.stream))
                .unwrap_or_default();
            let note = l
                .note
                .as_deref()
                .map(|n| format!(": {n}"))
                .unwrap_or_default();
            writeln!(
                out,
                "{:>10}  {} by {by} at {at}{copy}{note}",
                "",
                l.state.as_str()
            )
            .map_err(written)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn replay(
    bus: &NatsBus,
    id: Option<String>,
    by: &str,
    out: &mut (dyn Write + Send),
) -> Result<ExitCode, String> {
    let keys = match id {
        Some(id) => vec![id],
        None => bus
            .dead_letters()
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|l| l.state.open())
            .map(|l| l.key)
            .collect(),
    };
    let mut code = ExitCode::SUCCESS;
    for key in &keys {
        let settled = bus.replay(key, by).await.map_err(|e| e.to_string())?;
        if !report(key, &settled, out)? {
            code = ExitCode::from(EXIT_NOT_DONE);
        }
    }
    writeln!(out, "{} letter(s) looked at", keys.len()).map_err(written)?;
    Ok(code)
}

/// The exit code of a command that did (`true`) or did not do what was asked.
fn exit(done: bool) -> ExitCode {
    match done {
        true => ExitCode::SUCCESS,
        false => ExitCode::from(EXIT_NOT_DONE),
    }
}

/// Prints what became of one letter; whether it was done.
fn report(key: &str, settled: &Settled, out: &mut (dyn Write + Send)) -> Result<bool, String> {
    let (line, done) = match settled {
        Settled::Replayed(sequence) => (
            format!("replayed: back in the event stream at sequence {sequence}"),
            true,
        ),
        Settled::Dropped => ("dropped".to_owned(), true),
        Settled::NotFound => ("not done: no such letter".to_owned(), false),
        Settled::Not(state) => (format!("not done: it is {}", state.as_str()), false),
        Settled::Raced => (
            "not done: someone changed it meanwhile (list it again)".to_owned(),
            false,
        ),
    };
    writeln!(out, "letter {key}: {line}").map_err(written)?;
    Ok(done)
}

/// Runs a `parked` action on `outbox`.
pub async fn parked(
    outbox: &dyn Outbox,
    action: ParkedAction,
    out: &mut (dyn Write + Send),
) -> Result<ExitCode, String> {
    let rows = outbox.parked(PARKED_MAX).await.map_err(|e| e.to_string())?;
    match action {
        ParkedAction::List => {
            writeln!(out, "{} parked outbox row(s), oldest first", rows.len()).map_err(written)?;
            for r in &rows {
                let reason: String = r.reason.chars().take(ERROR_SHOWN_MAX).collect();
                writeln!(
                    out,
                    "{:>10}  {}  {:<20}  product {:<8} {:>4} event(s)  {:>3} attempt(s)  {:<32}  {reason}",
                    r.id,
                    r.parked_at.format("%Y-%m-%d %H:%M:%S"),
                    r.event_type.as_str(),
                    r.product_id,
                    r.events,
                    r.attempts,
                    r.request_id.as_deref().unwrap_or("(a pack)"),
                )
                .map_err(written)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        ParkedAction::Retry { id } => {
            let ids: Vec<i64> = match id {
                Some(id) => vec![id],
                None => rows.iter().map(|r| r.id).collect(),
            };
            let back = outbox.unpark(&ids).await.map_err(|e| e.to_string())?;
            writeln!(out, "{back} parked row(s) put back to be published").map_err(written)?;
            Ok(exit(back > 0))
        }
    }
}
