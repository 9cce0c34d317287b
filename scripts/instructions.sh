#!/usr/bin/env bash
# The server's CPU instructions per request, counted by valgrind's callgrind: a cost that
# does not drift with a shared machine's speed the way throughput does (BENCHMARKS.md,
# "Instructions per request").
#
# Each row drives a server started under callgrind with flashsale-bench twice, a short
# and a long load of the same kind, and divides the difference of the two instruction
# totals by the difference of the requests the server answered, so that startup,
# migrations and shutdown cancel out. Counted: the server process's user-space
# instructions (not the kernel's, not Redis's or MariaDB's, not the generator's). The
# background workers (gate watch, recovery, relay, …) add a little per second of run,
# and the long run lasts longer: idle, they run about 0.57 M instructions a second, under
# 0.4 % of any row's figure.
#
#   http-ceiling       GET /healthz
#   http-post-ceiling  POST /v1/purchases parsed and refused, no store touched
#   flashsale refusal  POST /v1/purchases refused by flashsale (a rush with 10 units)
#   flashsale order    POST /v1/purchases that become durable orders (sustained)
#
# With --generator it counts the load generator instead (flashsale-bench under callgrind,
# the server at full speed), the same rows: on a shared box the generator's cost per
# request is part of every throughput the bench reports (BENCHMARKS.md, "The generator").
#
# Usage: scripts/instructions.sh [--generator]
#        (after cargo build --release --bin flashsale --bin flashsale-bench)
# SERVER and BENCH override the binaries (paths relative to the repository). About a minute.
set -euo pipefail
counted=server
case "${1:-}" in
    --generator) counted=generator ;;
    "") ;;
    *) echo "usage: scripts/instructions.sh [--generator]" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
server=$(realpath -m "${SERVER:-target/release/flashsale}")
bench=$(realpath -m "${BENCH:-target/release/flashsale-bench}")
for bin in "$server" "$bench"; do
    [ -x "$bin" ] || { echo "instructions: $bin not built: cargo build --release --bin flashsale --bin flashsale-bench" >&2; exit 2; }
done
command -v valgrind >/dev/null || { echo "instructions: needs valgrind (Debian: apt-get install valgrind)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "instructions: needs python3 (to read the bench's JSON)" >&2; exit 2; }
scripts/services.sh >/dev/null

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The bench spawns `<server-bin> serve` (and, without --no-audit, `<server-bin> audit`):
# only `serve` runs under callgrind.
cat >"$work/flashsale" <<EOF
#!/bin/sh
if [ "\$1" = serve ] && [ "$counted" = server ]; then
    exec valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.out" "$server" "\$@"
fi
exec "$server" "\$@"
EOF
chmod +x "$work/flashsale"
# The generator, counted or not.
generator=()
if [ "$counted" = generator ]; then
    generator=(valgrind --tool=callgrind --callgrind-out-file="$work/callgrind.out")
fi

# The requests the server answered in a run (every status of the main request kind),
# or a failure if any had no answer or a 5xx: under callgrind's slowdown a deadline or
# the in-flight limit would otherwise count re-sends as work.
answered() {
    python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
op = next(o for o in r["ops"] if o["op"] == r["config"]["target"])
bad = {s: n for s, n in op["statuses"].items() if s == "0" or s.startswith("5")}
if bad:
    sys.exit(f"instructions: unanswered or 5xx requests {bad}: the count would include re-sends")
print(sum(op["statuses"].values()))
PY
}

# instructions <short> <long> <bench args...>: prints instructions per request.
instructions() {
    local short=$1 long=$2 n total requests
    shift 2
    local totals=() counts=()
    for n in "$short" "$long"; do
        rm -f "$work/callgrind.out" "$work/run.json"
        if ! "${generator[@]}" "$bench" "$@" --spawn --no-progress --no-audit --seed 7 --attempts "$n" \
            --server-bin "$work/flashsale" --json "$work/run.json" >"$work/bench.log" 2>&1; then
            echo "instructions: flashsale-bench $* --attempts $n failed:" >&2
            tail -20 "$work/bench.log" >&2
            exit 1
        fi
        total=$(awk '/^(summary|totals):/ {print $2; exit}' "$work/callgrind.out")
        [ -n "$total" ] || { echo "instructions: no callgrind total" >&2; exit 1; }
        requests=$(answered "$work/run.json")
        totals+=("$total")
        counts+=("$requests")
    done
    echo $(((totals[1] - totals[0]) / (counts[1] - counts[0])))
}

ceiling=$(instructions 20000 60000 rush --ceiling --users 10000)
post=$(instructions 20000 60000 rush --stock 10 --users 10000 \
    --server-env FLASHSALE_STRATEGY=http-post-ceiling)
refusal=$(instructions 20000 60000 rush --stock 10 --users 10000)
order=$(instructions 2000 6000 sustained --stock 20000 --users 5000 --retry-share 0)

row() { printf '%-20s %12s %12s\n' "$1" "$2" "$(awk -v a="$2" -v b="$ceiling" 'BEGIN {printf "%.2f", a / b}')"; }
printf '%-20s %12s %12s\n' "request ($counted)" "instr/req" "vs ceiling"
row "http-ceiling" "$ceiling"
row "http-post-ceiling" "$post"
row "flashsale refusal" "$refusal"
row "flashsale order" "$order"
