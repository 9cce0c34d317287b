#!/usr/bin/env bash
# Runs the load generator, flashsale-bench (release build), with the arguments given:
# `scripts/bench.sh rush --spawn` (docs/benchmarking.md lists the scenarios and flags),
# after starting the services it needs if they are not running. --spawn starts the
# release server, so both binaries are built. The HTML report's path is printed at the
# end (by default in $TMPDIR/flashsale-bench/).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh
target=${CARGO_TARGET_DIR:-target}
# Cargo's progress stays on (no --quiet): silence through a first build looks like a hang.
# The figures, measured on a fresh clone at 1811a26, each build alone as below: the
# server 604 CPU seconds (about 6 minutes on two idle cores, as scripts/run.sh says), then
# the bench 89 (about a minute more: most of its crates are the server's).
if [ ! -x "$target/release/flashsale" ]; then
  echo "bench: first build of flashsale (release), as scripts/run.sh's: about 6 minutes on two idle cores" >&2
fi
if [ ! -x "$target/release/flashsale-bench" ]; then
  echo "bench: first build of flashsale-bench (release): about a minute more" >&2
fi
# One binary a build, as scripts/run.sh builds the server: selected together, the two
# would resolve their dependencies' features together and build the server's again.
cargo build --release --bin flashsale
cargo build --release --bin flashsale-bench
# The bench looks for target/release/flashsale unless told (a CARGO_TARGET_DIR elsewhere).
server=()
if [ "$target" != target ]; then server=(--server-bin "$target/release/flashsale"); fi
exec "$target/release/flashsale-bench" "${server[@]}" "$@"
