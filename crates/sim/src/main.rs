//! `flashsale-sim`: runs seeds of the deterministic simulation and prints a summary; a
//! failing seed prints the one command that reproduces it, its violations and the end
//! of its trace.

use std::process::ExitCode;

use clap::Parser;
use flashsale_sim::{
    default_threads, failure_report, run_seeds, runtime, Defects, Features, Options, DEFECTS,
    REPORT_TRACE_LINES,
};

#[derive(Parser, Debug)]
#[command(
    name = "flashsale-sim",
    about = "Deterministic simulation of flashsale's workflows"
)]
struct Args {
    /// How many seeds to run (from --start).
    #[arg(long, default_value_t = 1000)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    start: u64,
    /// Run exactly this seed, with its trace.
    #[arg(long)]
    seed: Option<u64>,
    /// Run against a deliberately broken store (oversell, no-fence, aside-from-batch,
    /// late-group-write, batch-twice, enter-same-generation, ledger-sells-in-gate-mode).
    #[arg(long)]
    defect: Option<String>,
    /// Leave parts of the world out, comma-separated (wipe, rollback, reconcile,
    /// late-replays, misuse, restock, crash, fallback, redis-down).
    #[arg(long)]
    without: Option<String>,
    /// Trace lines to print for a failing seed.
    #[arg(long, default_value_t = REPORT_TRACE_LINES)]
    trace: usize,
    /// Threads (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// Stop after this many failing seeds.
    #[arg(long, default_value_t = 5)]
    max_failures: usize,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let defects = match args.defect.as_deref() {
        None => Defects::default(),
        Some(name) => match Defects::named(name) {
            Some(d) => d,
            None => {
                eprintln!("unknown defect {name:?}; known: {}", DEFECTS.join(", "));
                return ExitCode::from(2);
            }
        },
    };
    let features = match Features::without(args.without.as_deref().unwrap_or("")) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let opts = Options {
        seed: 0,
        trace: 0,
        defects,
        features,
    };
    if let Some(seed) = args.seed {
        let rt = match runtime() {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("cannot start a runtime: {e}");
                return ExitCode::from(2);
            }
        };
        let outcome = flashsale_sim::run_seed(
            &Options {
                seed,
                trace: args.trace,
                ..opts.clone()
            },
            &rt,
        );
        println!("seed {seed}: {}", outcome.scenario);
        println!("stats: {:?}", outcome.stats);
        if outcome.ok() {
            for line in &outcome.trace {
                println!("  {line}");
            }
            println!("seed {seed}: all invariants hold");
            return ExitCode::SUCCESS;
        }
        println!("{}", failure_report(&outcome, &opts, args.trace));
        return ExitCode::FAILURE;
    }
    let summary = run_seeds(
        args.start..args.start.saturating_add(args.seeds),
        &opts,
        args.threads.unwrap_or_else(default_threads),
        args.max_failures.max(1),
    );
    println!(
        "{} seeds from {} in {:.1?}: {} failed",
        summary.runs,
        args.start,
        summary.elapsed,
        summary.failures.len()
    );
    println!("totals: {:?}", summary.stats);
    let st = &summary.stats;
    println!(
        "stock modes: {} of {} seeds switched both ways; {} switches to ledger mode, {} back to \
         gate mode ({} during the sale, {} in the wind-down); {} purchases sold by the ledger",
        st.runs_switched_both_ways,
        summary.runs,
        st.to_ledger,
        st.to_gate,
        st.to_gate_in_sale,
        st.to_gate.saturating_sub(st.to_gate_in_sale),
        st.ledger_sales
    );
    for failure in &summary.failures {
        println!("{}", failure_report(failure, &opts, args.trace));
    }
    if summary.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
