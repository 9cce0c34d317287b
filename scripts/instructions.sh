#!/usr/bin/env bash
# The server's CPU instructions per request, counted by valgrind's callgrind: a cost that
# does not drift with a shared machine's speed the way throughput does (BENCHMARKS.md).
#
# Each row drives a server started under callgrind with flashsale-bench twice, a short
# and a long load of the same kind, and divides the difference of the two instruction
# totals by the difference of requests, so that startup, migrations and shutdown cancel
# out. Counted: the server process's user-space instructions (not the kernel's, not
# Redis's or MariaDB's, not the generator's).
#
#   http-ceiling       GET /healthz
#   http-post-ceiling  POST /v1/purchases parsed and refused, no store touched
#   flashsale refusal  POST /v1/purchases refused by flashsale (a rush with 10 units)
#   flashsale order    POST /v1/purchases that become durable orders (sustained)
#
# Usage: scripts/instructions.sh   (after cargo build --release --bin flashsale --bin flashsale-bench)
# SERVER and BENCH override the binaries. About three minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
server=$(realpath "${SERVER:-target/release/flashsale}")
bench=${BENCH:-target/release/flashsale-bench}
for bin in "$server" "$bench"; do
    [ -x "$bin" ] || { echo "instructions: $bin not built: cargo build --release --bin flashsale --bin flashsale-bench" >&2; exit 2; }
done
command -v valgrind >/dev/null || { echo "instructions: needs valgrind (Debian: apt-get install valgrind)" >&2; exit 2; }
"$root/scripts/services.sh" >/dev/null

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The bench spawns `<server-bin> serve` and runs `<server-bin> migrate` and the like
# itself: only `serve` runs under callgrind.
cat >"$work/flashsale" <<EOF
#!/bin/sh
if [ "\$1" = serve ]; then
    exec valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.out" "$server" "\$@"
fi
exec "$server" "\$@"
EOF
chmod +x "$work/flashsale"

# instructions <short> <long> <bench args...>: prints instructions per request.
instructions() {
    local short=$1 long=$2 total n
    shift 2
    local totals=()
    for n in "$short" "$long"; do
        rm -f "$work/callgrind.out"
        if ! "$bench" "$@" --spawn --no-progress --no-audit --seed 7 --attempts "$n" \
            --server-bin "$work/flashsale" >"$work/bench.log" 2>&1; then
            echo "instructions: flashsale-bench $* --attempts $n failed:" >&2
            tail -20 "$work/bench.log" >&2
            exit 1
        fi
        total=$(awk '/^(summary|totals):/ {print $2; exit}' "$work/callgrind.out")
        [ -n "$total" ] || { echo "instructions: no callgrind total" >&2; exit 1; }
        totals+=("$total")
    done
    echo $(((totals[1] - totals[0]) / (long - short)))
}

ceiling=$(instructions 20000 60000 rush --ceiling --users 10000)
post=$(instructions 20000 60000 rush --stock 10 --users 10000 \
    --server-env FLASHSALE_STRATEGY=http-post-ceiling)
refusal=$(instructions 20000 60000 rush --stock 10 --users 10000)
order=$(instructions 2000 6000 sustained --stock 20000 --users 5000 --retry-share 0)

row() { printf '%-20s %12s %8s\n' "$1" "$2" "$(awk -v a="$2" -v b="$ceiling" 'BEGIN {printf "%.2f×", a / b}')"; }
printf '%-20s %12s %8s\n' "request" "instr/req" "×ceiling"
row "http-ceiling" "$ceiling"
row "http-post-ceiling" "$post"
row "flashsale refusal" "$refusal"
row "flashsale order" "$order"
