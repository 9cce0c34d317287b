#!/usr/bin/env bash
# Work counted per durable order while a sustained load runs: MariaDB's own counters
# (rows written and read, temporary tables, statements, bytes) and, where `perf` can
# count tracepoints, the server's system calls. Counts, unlike CPU times, do not drift
# with a shared machine's speed (BENCHMARKS.md, "Ablation": command H).
#
# A sustained load of 200,000 attempts runs on a spawned server; after the first
# LOAD_COUNTERS_SETTLE seconds (5) the counters are read, again LOAD_COUNTERS_WINDOW
# seconds (10) later, and each difference is divided by the orders the server's database
# gained in between. MariaDB's counters are server-wide (SHOW GLOBAL STATUS): run it on
# a quiet box.
#
# Usage: scripts/load-counters.sh   (after cargo build --release --bin flashsale --bin flashsale-bench)
# SERVER and BENCH override the binaries (paths relative to the repository).
set -euo pipefail
cd "$(dirname "$0")/.."
server=$(realpath -m "${SERVER:-target/release/flashsale}")
bench=$(realpath -m "${BENCH:-target/release/flashsale-bench}")
settle=${LOAD_COUNTERS_SETTLE:-5}
window=${LOAD_COUNTERS_WINDOW:-10}
for bin in "$server" "$bench"; do
    [ -x "$bin" ] || { echo "load-counters: $bin not built: cargo build --release --bin flashsale --bin flashsale-bench" >&2; exit 2; }
done
command -v mysql >/dev/null || { echo "load-counters: needs the mysql client" >&2; exit 2; }
scripts/services.sh >/dev/null

work=$(mktemp -d)
bench_pid=
cleanup() {
    [ -n "$bench_pid" ] && kill "$bench_pid" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

status="SHOW GLOBAL STATUS WHERE Variable_name IN ('Bytes_received', 'Bytes_sent', \
'Com_commit', 'Com_stmt_execute', 'Created_tmp_tables', 'Handler_delete', \
'Handler_read_key', 'Handler_read_next', 'Handler_read_rnd_next', 'Handler_tmp_write', \
'Handler_update', 'Handler_write', 'Questions')"
databases_before=$(mysql -N -e "SHOW DATABASES LIKE 'fs_bench_%'")

"$bench" sustained --spawn --no-progress --no-audit --attempts 200000 --stock 220000 \
    --users 50000 --server-bin "$server" >"$work/bench.log" 2>&1 &
bench_pid=$!

# The spawned server's database: the one that appeared since the start.
db=
for _ in $(seq 1 100); do
    db=$(comm -13 <(echo "$databases_before") <(mysql -N -e "SHOW DATABASES LIKE 'fs_bench_%'") | head -1)
    [ -n "$db" ] && break
    sleep 0.1
done
[ -n "$db" ] || { echo "load-counters: the bench's database did not appear" >&2; tail -20 "$work/bench.log" >&2; exit 1; }
sleep "$settle"
orders() { mysql -N "$db" -e "SELECT COUNT(*) FROM orders"; }
server_pid=$(pgrep -n -f "^$server serve" || true)

perf_ok=
if [ -n "$server_pid" ] && command -v perf >/dev/null &&
    perf stat -e raw_syscalls:sys_enter true >/dev/null 2>&1; then
    perf_ok=1
fi
mysql -N -e "$status" >"$work/before"
before=$(orders)
if [ -n "$perf_ok" ]; then
    perf stat -x, -e raw_syscalls:sys_enter,syscalls:sys_enter_getrandom -p "$server_pid" \
        -o "$work/perf" -- sleep "$window" || perf_ok=
else
    sleep "$window"
fi
mysql -N -e "$status" >"$work/after"
after=$(orders)
wait "$bench_pid" || { echo "load-counters: the load failed:" >&2; tail -20 "$work/bench.log" >&2; exit 1; }
bench_pid=

n=$((after - before))
[ "$n" -gt 0 ] || { echo "load-counters: no orders in the window" >&2; exit 1; }
echo "orders in the window: $n ($(grep -m1 '^throughput' "$work/bench.log"))"
printf '%-36s %10s\n' "per order" "count"
join "$work/before" "$work/after" | awk -v n="$n" '{printf "%-36s %10.3f\n", $1, ($3 - $2) / n}'
if [ -n "$perf_ok" ]; then
    awk -F, -v n="$n" '$3 ~ /sys_enter/ {printf "%-36s %10.3f\n", "server " $3, $1 / n}' "$work/perf"
fi
