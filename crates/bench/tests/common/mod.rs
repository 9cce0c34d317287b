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
