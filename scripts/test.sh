#!/usr/bin/env bash
# The test command: starts the services the tests need if they are not running, checks
# formatting and lints, then runs every test of the workspace against the real services.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh --with-faketime --with-browser
# Cargo's progress stays on (no --quiet): a first run compiles the workspace and its few
# hundred dependencies, about a quarter of an hour on two cores, and silence that long
# looks like a hang.
if [ ! -d "${CARGO_TARGET_DIR:-target}/debug" ]; then
  echo "test: first build (clippy, then the tests): about 15 minutes on two cores" >&2
fi
cargo fmt --all -- --check
# The failpoints feature compiles in the crash tests' stop points (kill -9 between two
# effects of a purchase); normal builds leave them out.
cargo clippy --workspace --all-targets --features flashsale/failpoints -- -D warnings
# app compiled alone, with only the tokio features it names (no net, fs, process,
# signal): features unify within one build, so the workspace's build above cannot see a
# socket opened in app (ARCHITECTURE.md, "Rules the compiler keeps"). A few seconds; its
# first run builds tokio once more with those features, about fifteen.
cargo check -p flashsale-app
# This one build also makes target/debug/flashsale, the binary the load generator's
# end-to-end test and the fuzzer below drive: a separate `cargo build --bin` would resolve
# the dependencies' features for that package alone and compile a score of crates again.
cargo test --workspace --features flashsale/failpoints -- "$@"
# The API fuzzed from its OpenAPI document by schemathesis (pinned, fixed seed, bounded
# examples: well under two minutes), against the binary just built and tested.
scripts/fuzz.sh target/debug/flashsale
