#!/usr/bin/env bash
# The test command: starts the services the tests need if they are not running, checks
# formatting and lints, then runs every test of the workspace against the real services.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh --with-faketime
cargo fmt --all -- --check
# The failpoints feature compiles in the crash tests' stop points (kill -9 between two
# effects of a purchase); normal builds leave them out.
cargo clippy --workspace --all-targets --features flashsale/failpoints --quiet -- -D warnings
# The load generator's end-to-end test drives this binary (target/debug/flashsale).
cargo build --bin flashsale --features flashsale/failpoints --quiet
cargo test --workspace --features flashsale/failpoints -- "$@"
