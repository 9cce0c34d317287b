//! What the bench's end-to-end tests share.

use std::path::PathBuf;

/// The flashsale binary: `FLASHSALE_BIN`, else `<workspace>/target/debug/flashsale`.
pub fn server_bin() -> PathBuf {
    let path = std::env::var_os("FLASHSALE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/debug/flashsale")
        });
    assert!(
        path.is_file(),
        "flashsale server binary {} not found: run `cargo build --bin flashsale` first, or set FLASHSALE_BIN",
        path.display()
    );
    path
}

/// A path in the temporary directory no other test or process uses: `<what>-<pid>-<ns>`.
#[allow(dead_code)]
pub fn scratch_path(what: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "flashsale-bench-{what}-{}-{:x}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ))
}

/// Runs the bench as `command` says and returns its standard output; fails the test,
/// with both outputs, unless it exits 0.
#[allow(dead_code)]
pub fn bench_stdout(command: &mut std::process::Command) -> String {
    let out = command.output().expect("run flashsale-bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "flashsale-bench failed ({:?})\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    stdout
}
