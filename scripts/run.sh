#!/usr/bin/env bash
# Starts the services flashsale needs if they are not running, then runs flashsale
# (release build) with the configuration from the environment or --config FILE: `serve`,
# or the command given (`scripts/run.sh demo`, `scripts/run.sh audit`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh
# Cargo's progress stays on (no --quiet): a first release build compiles a few hundred
# crates, about a quarter of an hour on two cores, and silence that long looks like a hang.
if [ ! -x "${CARGO_TARGET_DIR:-target}/release/flashsale" ]; then
  echo "run: first build of flashsale (release): about 15 minutes on two cores" >&2
fi
exec cargo run --release --bin flashsale -- "${@:-serve}"
