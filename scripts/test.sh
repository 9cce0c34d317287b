#!/usr/bin/env bash
# The test command: starts the services the tests need if they are not running, checks
# formatting and lints, then runs every test of the workspace against the real services.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo test --workspace -- "$@"
