#!/usr/bin/env bash
# Starts the services flashsale needs if they are not running, then serves flashsale
# (release build) with the configuration from the environment or --config FILE.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh
exec cargo run --release --quiet --bin flashsale -- "${@:-serve}"
