//! `flashsale`: the one binary.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use flashsale::Config;
use tracing_subscriber::EnvFilter;

/// flashsale — a flash-sale inventory service: sells exactly the stock, one order per
/// purchase request, on Redis and MariaDB.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// TOML configuration file; FLASHSALE_* environment variables override it.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP JSON API (applies migrations first).
    Serve,
    /// Apply the database schema migrations and exit.
    Migrate,
}

fn init_logging(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match Config::load(cli.config.as_deref()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("flashsale: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    init_logging(config.log_json);
    let result = match cli.command {
        Command::Serve => flashsale::serve(&config).await,
        Command::Migrate => migrate(&config).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "flashsale failed");
            eprintln!("flashsale: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn migrate(config: &Config) -> Result<(), String> {
    let ledger = flashsale::connect_ledger(config).await?;
    ledger.migrate().await.map_err(|e| e.to_string())?;
    tracing::info!("migrations applied");
    Ok(())
}
