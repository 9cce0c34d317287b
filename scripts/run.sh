#!/usr/bin/env bash
# Starts the services flashsale needs if they are not running, then runs flashsale
# (release build) with the configuration from the environment or --config FILE: `serve`,
# or the command given (`scripts/run.sh demo`, `scripts/run.sh audit`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh
# Cargo's progress stays on (no --quiet): a first release build compiles a few hundred
# crates, and silence that long looks like a hang. Measured on a fresh clone at 1811a26:
# 555 s of user CPU and 49 s of system on two cores, about 6 minutes when they are idle
# (17 on a machine building two other things at once).
if [ ! -x "${CARGO_TARGET_DIR:-target}/release/flashsale" ]; then
  echo "run: first build of flashsale (release): about 6 minutes on two idle cores" >&2
fi
exec cargo run --release --bin flashsale -- "${@:-serve}"
