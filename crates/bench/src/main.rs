//! `flashsale-bench`: see the crate documentation and `flashsale-bench --help`.

use std::process::ExitCode;

use clap::Parser;
use flashsale_bench::cli::Args;

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match flashsale_bench::run(args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("flashsale-bench: FAILED — invariant violations (see above)");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("flashsale-bench: error: {e}");
            ExitCode::from(2)
        }
    }
}
