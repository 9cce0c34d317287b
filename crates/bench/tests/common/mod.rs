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

/// The bench's arguments, after the program name, parsed as the command line would be.
#[allow(dead_code)]
pub fn args(list: &[&str]) -> flashsale_bench::cli::Args {
    use clap::Parser;
    flashsale_bench::cli::Args::try_parse_from(
        std::iter::once("flashsale-bench").chain(list.iter().copied()),
    )
    .expect("valid arguments")
}

/// The arguments that point the bench at servers `server::spawn` started: every one as a
/// `--base-url`, their admin token, database, Redis (a cluster's seed nodes when they
/// run on one) and key prefix, and the binary for the audit.
#[allow(dead_code)]
pub fn against(spawned: &flashsale_bench::server::Spawned, bin: &std::path::Path) -> Vec<String> {
    let mut list = Vec::new();
    for url in spawned.base_urls() {
        list.extend(["--base-url".to_owned(), url]);
    }
    let env = &spawned.env;
    list.extend(
        [
            ("--admin-token", spawned.admin_token.as_str()),
            ("--database-url", env.database_url.as_str()),
            ("--redis-url", env.redis_url.as_str()),
            ("--redis-prefix", env.redis_prefix.as_str()),
            ("--server-bin", bin.to_str().expect("a UTF-8 path")),
        ]
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_owned(), value.to_owned()]),
    );
    if let Some(nodes) = &env.redis_cluster_nodes {
        list.extend(["--redis-cluster-nodes".to_owned(), nodes.clone()]);
    }
    list
}
