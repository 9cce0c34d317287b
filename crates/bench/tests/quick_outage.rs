//! `flashsale-bench sustained --outage` end to end, against a debug-built flashsale on
//! the shared MariaDB and NATS and a private redis-server the bench starts, kills and
//! restarts itself.

mod common;

use std::process::Command;

const BENCH: &str = env!("CARGO_BIN_EXE_flashsale-bench");

/// The figure printed after `label` on its line of the report.
fn figure(stdout: &str, label: &str) -> f64 {
    stdout
        .lines()
        .find_map(|l| l.trim_start().strip_prefix(label))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no figure for {label:?} in:\n{stdout}"))
}

// Checks the outage run end to end with short phases (2 s, the server switching after
// 1 s and coming back after 2 s): it exits 0 and reports orders sold in all three
// phases (through Redis, from MariaDB while Redis is dead, through the rebuilt Redis),
// the time from Redis's death to MariaDB's first order (at least FALLBACK_AFTER: the
// switch waits for it) and from its restart to gate mode, every acknowledged order in
// MariaDB and the audit passed.
#[test]
fn an_outage_run_reports_both_modes_and_the_switch_times() {
    let stdout = common::bench_stdout(
        Command::new(BENCH)
            .args(["sustained", "--outage", "--spawn", "--no-progress"])
            .args(["--outage-phase", "2s", "--connections", "16"])
            .args(["--server-env", "FLASHSALE_FALLBACK_AFTER=1s"])
            .args(["--server-env", "FLASHSALE_FALLBACK_RECOVER_AFTER=2s"])
            .arg("--server-bin")
            .arg(common::server_bin()),
    );
    for phase in [
        "gate mode (Redis), before the outage",
        "ledger mode (MariaDB), Redis dead",
        "gate mode again, Redis rebuilt",
    ] {
        assert!(figure(&stdout, phase) > 0.0, "{phase}: no orders\n{stdout}");
    }
    let first = figure(&stdout, "Redis killed → first order from MariaDB:");
    assert!(
        first >= 1.0,
        "the switch waits FALLBACK_AFTER: {first}\n{stdout}"
    );
    let back = figure(&stdout, "Redis restarted → product in gate mode:");
    assert!(
        back >= 2.0,
        "the way back waits RECOVER_AFTER: {back}\n{stdout}"
    );
    assert!(stdout.contains("flashsale audit: passed"), "{stdout}");
    assert!(!stdout.contains("FAILED"), "{stdout}");
}
