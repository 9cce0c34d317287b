//! `flashsale`: the one binary.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use flashsale::Config;
use tracing_subscriber::EnvFilter;

/// jemalloc, not glibc's malloc: with its background threads (`give_back_freed_memory`)
/// it returns the memory a wave of connections took once they close (19 MB resident 30 s
/// after 10,000 slow clients left, 16 MB at rest; glibc's kept 245 MB), and every request
/// costs fewer instructions (`scripts/instructions.sh`: 7–8 % fewer for `/healthz`, a
/// parsed POST or a refusal, 10 % fewer for a durable order).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Starts jemalloc's background threads, which hand memory left free for its decay time
/// (`dirty_decay_ms`, 10 s) back to the system even while the process is idle; without
/// them jemalloc purges only during its own allocations, so an idle server after an
/// attack would keep what the attack took.
fn give_back_freed_memory() {
    if let Err(e) = tikv_jemalloc_ctl::background_thread::write(true) {
        tracing::warn!(
            error = %e,
            "the allocator's background threads did not start: freed memory goes back to \
             the system only while the server allocates"
        );
    }
}

/// flashsale — a flash-sale inventory service: sells exactly the stock, one order per
/// purchase request, on Redis and MariaDB, and publishes its events to NATS JetStream.
// No bare `about`: it would take the package description from Cargo.toml (written for
// developers) instead of this doc comment.
#[derive(Parser)]
#[command(version)]
struct Cli {
    /// TOML configuration file; FLASHSALE_* environment variables override it.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

/// `serve --help`'s closing text: the settings a first run needs, and where the rest are.
const SERVE_SETTINGS: &str = "\
Settings: FLASHSALE_* environment variables, over a --config TOML file (keys in lower case
without the prefix). The main ones, with their defaults:
  FLASHSALE_LISTEN              HTTP address (127.0.0.1:8080)
  FLASHSALE_ADMIN_TOKEN         bearer token of the admin endpoints (unset: one is generated
                                and logged); FLASHSALE_ADMIN_TOKENS=name:token,… names more
  FLASHSALE_DATABASE_URL        MariaDB (mysql://root@127.0.0.1:3306/flashsale)
  FLASHSALE_REDIS_URL           Redis (redis://127.0.0.1:6379)
  FLASHSALE_NATS_URL            NATS JetStream (nats://127.0.0.1:4222)
  FLASHSALE_BUYER_AUTH          none (development only), header or jwt
  FLASHSALE_PAYMENT_TIMEOUT     how long an order may stay unpaid (15m)
  FLASHSALE_METRICS_LISTEN      serve /metrics and /dashboard on this address instead
  FLASHSALE_LOG_FORMAT          text or json; the level comes from RUST_LOG (info)
Every setting, its bounds and the rules between them: docs/configuration.md.";

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP JSON API (applies migrations first).
    #[command(after_help = SERVE_SETTINGS)]
    Serve,
    /// Apply the database schema migrations and exit.
    Migrate,
    /// Check the invariants (I1-I4, I6, I7) against MariaDB and Redis; exit 1 on any
    /// violation.
    ///
    /// Exact during a sale too: work in flight within its bound (a hold not committed
    /// yet, a cancel's units on their way back) is reported as pending, never as a
    /// violation. `serve` also runs it by itself, on each product once its sale has ended
    /// and settled and on every product once a day (FLASHSALE_AUDIT_EVERY); each verdict
    /// is recorded for the live sale page and the alert.
    Audit {
        /// Audit only this product (default: every product whose stock was loaded).
        #[arg(long, value_name = "ID")]
        product: Option<i64>,
    },
    /// Run a whole flash sale and check it: a product, a flood of buyers (double-clicks
    /// and retries included), payments, cancels and expiries, then sold == stock, one
    /// order per request and the product's audit.
    ///
    /// Against the service at the configured listen address (or --base-url) if one
    /// answers, with its admin token; else against a service it starts in this process on
    /// the configured stores, with a short payment timeout, and stops at the end; that
    /// service's log goes to a file (named at the start), not to the terminal. The
    /// flood's buyers arrive over 30 s (--flood-duration), time to open the live page.
    ///
    /// Exit codes: 0 every check passed; 1 a check failed; 2 error (no service, a refused
    /// token, a store down, Ctrl-C): nothing was judged.
    Demo(flashsale::demo::DemoArgs),
    /// What a person does with events no worker could deliver: the dead-letter stream's
    /// letters (listed, replayed into the event stream or dropped), and the outbox rows
    /// the broker refused for good (listed, retried).
    Events {
        #[command(subcommand)]
        action: flashsale::events::Action,
    },
    /// The recovery incidents a person must decide: list them, show one with what the
    /// stores know of it, and resolve one (release its units, or confirm its order).
    Incidents {
        #[command(subcommand)]
        action: flashsale::incidents::Action,
    },
    /// The form of the ledger's purchase keys, and the rewrite into the other form when
    /// buyer authentication is turned on or off (FLASHSALE_BUYER_AUTH).
    Ledger {
        #[command(subcommand)]
        action: flashsale::keys::Action,
    },
    /// Compare Redis's available counts with MariaDB's facts and report the drift; exit 1
    /// on drift left unrepaired, 2 on error.
    ///
    /// Exit codes, for alerting: 0 no drift (or all of it repaired with --repair); 1 drift
    /// found and not repaired (without --repair, or still moving between the two looks);
    /// 2 error (a store did not answer, an unknown product, a bad configuration): the
    /// check did not complete.
    Reconcile {
        /// Only this product (default: every product whose stock was loaded).
        #[arg(long, value_name = "ID")]
        product: Option<i64>,
        /// Repair drift that is the same in two looks two seconds apart (it outlived the
        /// work in flight), by adjusting Redis relatively; never overwrites it.
        #[arg(long)]
        repair: bool,
    },
}

/// How long reconcile --repair waits between its two looks at a product.
const RECONCILE_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// reconcile's exit code when drift is left unrepaired (its --help lists the codes).
const EXIT_DRIFT: u8 = 1;
/// The exit code of an error that stops a command before its check completes, as for a
/// configuration error: distinct from a finding, so alerting tells "drift" from "could
/// not look" (reconcile; the other commands exit 1 on any failure).
const EXIT_ERROR: u8 = 2;

/// Sets up the log: on stderr, or in `file` (the demo's, whose terminal shows its
/// progress bars instead).
fn init_logging(json: bool, file: Option<std::fs::File>) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Logs go to stderr: stdout carries the commands' output (audit's and reconcile's
    // reports), which a log line must neither interrupt nor end up in when piped.
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match (file, json) {
        (Some(file), true) => builder
            .with_writer(std::sync::Arc::new(file))
            .with_ansi(false)
            .json()
            .init(),
        (Some(file), false) => builder
            .with_writer(std::sync::Arc::new(file))
            .with_ansi(false)
            .init(),
        (None, json) => {
            let builder = builder.with_writer(std::io::stderr).with_ansi(colour_logs(
                std::io::stderr().is_terminal(),
                std::env::var_os("NO_COLOR").as_deref(),
            ));
            if json {
                builder.json().init();
            } else {
                builder.init();
            }
        }
    }
}

/// The demo's log file, in the temporary directory, named after this process.
fn demo_log() -> Result<(PathBuf, std::fs::File), String> {
    let path = std::env::temp_dir().join(format!("flashsale-demo-{}.log", std::process::id()));
    std::fs::File::create(&path)
        .map(|file| (path.clone(), file))
        .map_err(|e| format!("creating the demo's log {}: {e}", path.display()))
}

/// Whether log lines get ANSI colours: only on a terminal (in a file or a pipe they are
/// escape codes to strip), and not when NO_COLOR is set to anything (no-color.org).
fn colour_logs(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // Reads FAILPOINTS in builds with the `failpoints` feature; a no-op otherwise.
    let _failpoints = fail::FailScenario::setup();
    let config = match Config::load(cli.config.as_deref()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("flashsale: configuration error: {e}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let command = match cli.command {
        Command::Demo(args) => {
            let (path, file) = match demo_log() {
                Ok(log) => log,
                Err(e) => {
                    eprintln!("flashsale: {e}");
                    return ExitCode::from(EXIT_ERROR);
                }
            };
            init_logging(config.log_json, Some(file));
            return flashsale::demo::run(&config, args, Some(&path)).await;
        }
        command => command,
    };
    init_logging(config.log_json, None);
    give_back_freed_memory();
    let done = |r: Result<(), String>| r.map(|()| ExitCode::SUCCESS);
    let (result, on_error) = match command {
        Command::Serve => (done(flashsale::serve(&config).await), ExitCode::FAILURE),
        Command::Migrate => (done(migrate(&config).await), ExitCode::FAILURE),
        Command::Audit { product } => (done(audit(&config, product).await), ExitCode::FAILURE),
        // Dispatched above, with its own log.
        Command::Demo(_) => return ExitCode::from(EXIT_ERROR),
        Command::Incidents { action } => {
            (incidents(&config, action).await, ExitCode::from(EXIT_ERROR))
        }
        Command::Ledger { action } => (
            done(flashsale::keys::run(&config, action, &mut std::io::stdout()).await),
            ExitCode::from(EXIT_ERROR),
        ),
        Command::Events { action } => (
            flashsale::events::run(&config, action, &mut std::io::stdout()).await,
            ExitCode::from(EXIT_ERROR),
        ),
        Command::Reconcile { product, repair } => (
            reconcile(&config, product, repair).await,
            ExitCode::from(EXIT_ERROR),
        ),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            tracing::error!(error = %e, "flashsale failed");
            eprintln!("flashsale: {e}");
            on_error
        }
    }
}

async fn incidents(
    config: &Config,
    action: flashsale::incidents::Action,
) -> Result<ExitCode, String> {
    let maintenance = flashsale::connect_maintenance(config).await?;
    flashsale::incidents::run(&maintenance, action, &mut std::io::stdout()).await
}

async fn migrate(config: &Config) -> Result<(), String> {
    let ledger = flashsale::connect_ledger(config).await?;
    ledger.migrate().await.map_err(|e| e.to_string())?;
    tracing::info!("migrations applied");
    Ok(())
}

async fn products(
    maintenance: &flashsale_app::Maintenance,
    product: Option<i64>,
) -> Result<Vec<flashsale_core::ProductId>, String> {
    match product {
        Some(id) => flashsale_core::ProductId::parse(id)
            .map(|p| vec![p])
            .map_err(|e| e.to_string()),
        None => maintenance.products().await.map_err(|e| e.to_string()),
    }
}

async fn audit(config: &Config, product: Option<i64>) -> Result<(), String> {
    let maintenance = flashsale::connect_maintenance(config).await?;
    let ids = products(&maintenance, product).await?;
    let totals = flashsale::audit_products(
        &maintenance,
        &ids,
        ids_scope(product),
        &mut std::io::stdout(),
    )
    .await?;
    if totals.violations > 0 {
        return Err(format!("{} violation(s)", totals.violations));
    }
    println!("no violations");
    Ok(())
}

/// The audit's scope as recorded: one product (already checked to parse by `products`),
/// or every loaded product (None).
fn ids_scope(product: Option<i64>) -> Option<flashsale_core::ProductId> {
    product.and_then(|id| flashsale_core::ProductId::parse(id).ok())
}

/// Reports each product's drift; the exit code says whether drift was left unrepaired.
async fn reconcile(
    config: &Config,
    product: Option<i64>,
    repair: bool,
) -> Result<ExitCode, String> {
    let maintenance = flashsale::connect_maintenance(config).await?;
    let mut unrepaired = 0;
    for id in products(&maintenance, product).await? {
        let r = maintenance
            .reconcile(id, repair, RECONCILE_SETTLE)
            .await
            .map_err(|e| e.to_string())?;
        unrepaired += usize::from(drift_left(&r));
        println!(
            "product {}: redis available {}, expected {} (in flight {}), drift {}{}",
            r.product_id,
            r.redis_available
                .map_or_else(|| "missing".to_owned(), |a| a.to_string()),
            r.expected_available,
            r.in_flight_units,
            r.drift,
            if r.repaired { ", repaired" } else { "" }
        );
    }
    if unrepaired == 0 {
        return Ok(ExitCode::SUCCESS);
    }
    println!("{unrepaired} product(s) with drift not repaired");
    Ok(ExitCode::from(EXIT_DRIFT))
}

/// Whether reconciliation left drift behind: found and not repaired (no --repair, or it
/// was still moving between the two looks).
fn drift_left(r: &flashsale_app::Reconciliation) -> bool {
    r.drift != 0 && !r.repaired
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::*;

    // Checks which reconciliations leave drift behind: none without drift, none once
    // repaired, one found and not repaired (either sign).
    #[test]
    fn drift_left_only_when_found_and_not_repaired() {
        let r = |drift, repaired| flashsale_app::Reconciliation {
            product_id: flashsale_core::ProductId::parse(1).expect("product id"),
            redis_available: Some(10 + drift),
            redis_generation: flashsale_core::Generation::from_stored(1),
            last_hold_id: 0,
            expected_available: 10,
            drift,
            in_flight_units: 0,
            live_units: 0,
            total: 10,
            repaired,
        };
        assert!(!drift_left(&r(0, false)));
        assert!(!drift_left(&r(2, true)));
        assert!(drift_left(&r(2, false)));
        assert!(drift_left(&r(-3, false)));
    }

    // Checks colours only on a terminal, and never with NO_COLOR set to a value (an empty
    // NO_COLOR counts as unset, as no-color.org says).
    #[test]
    fn log_colours_only_on_a_terminal_without_no_color() {
        assert!(colour_logs(true, None));
        assert!(colour_logs(true, Some(OsStr::new(""))));
        assert!(!colour_logs(true, Some(OsStr::new("1"))));
        assert!(!colour_logs(false, None));
        assert!(!colour_logs(false, Some(OsStr::new("1"))));
    }
}
