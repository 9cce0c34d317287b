#!/usr/bin/env bash
# A local Redis Cluster (3 primaries + 3 replicas on 127.0.0.1) for manual runs and
# benches of flashsale on a cluster:
#
#   scripts/cluster.sh start [BASE_PORT]   nodes on BASE_PORT..BASE_PORT+5 (default 7000)
#   scripts/cluster.sh stop [BASE_PORT]    stops the nodes this script started there
#
# `start` prints the line to use, e.g.
#   FLASHSALE_REDIS_CLUSTER_NODES=127.0.0.1:7000,…,127.0.0.1:7005
# (`export` it for `flashsale serve`, `flashsale audit` and flashsale-bench).
#
# Each start gets its own data dir under /tmp (mktemp: never a predictable path other
# users could plant), holding each node's nodes.conf and log and the `pids` file that
# `stop` reads: stop kills only those pids, and only while they still are the
# redis-server of this cluster's port (a pid may have been reused since). Nothing else
# is touched: not the shared Redis on 6379, not another cluster's nodes.
set -euo pipefail

# Nodes of the cluster: three primaries, so that one can die and the two others are
# still a majority that votes its replica in, and a replica for each.
NODES=6
# Default first client port (the usual one for local clusters); the bus ports are the
# client ports + 10000.
DEFAULT_BASE_PORT=7000
# How long a node may be unreachable before the others mark it failed (ms). Redis's
# default (15 s) makes a failover take a quarter of a minute; much below 2 s a machine
# busy compiling delays heartbeats enough for healthy nodes to be marked failed.
NODE_TIMEOUT_MS=2000
# Seconds to wait for a node to answer, for the cluster to form, for a node to stop.
WAIT_SECS=30
# The shared Redis: never part of a cluster of this script, and never stopped by it.
SHARED_REDIS_PORT=6379
# The highest client port: its bus port (+10000) must be a valid port too.
BASE_PORT_MAX=$((65535 - 10000 - NODES + 1))
# Where the data dirs go, named after the base port so `stop` can find them.
DIR_PREFIX=/tmp/flashsale-cluster

say() { echo "cluster: $*" >&2; }
die() { say "$*"; exit 1; }

usage() {
  sed -n 2,10p "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# Says what failed with the end of `log` (the data dir, logs included, is removed when
# a start fails), and fails.
fail_with_log() {
  local log=$1
  shift
  say "$*; end of $(basename "$(dirname "$log")")/$(basename "$log"):"
  tail -n 20 "$log" 2>/dev/null | sed 's/^/  /' >&2 || true
  false
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# The base port from the argument (or the default), checked: a number whose six client
# ports and six bus ports are valid and none of them is the shared Redis's.
base_port() {
  local base=${1:-$DEFAULT_BASE_PORT} p
  [[ $base =~ ^[0-9]+$ ]] || die "BASE_PORT must be a number, got '$base'"
  ((base >= 1024 && base <= BASE_PORT_MAX)) ||
    die "BASE_PORT must be between 1024 and $BASE_PORT_MAX (bus ports are +10000), got $base"
  for ((p = base; p < base + NODES; p++)); do
    if ((p == SHARED_REDIS_PORT || p + 10000 == SHARED_REDIS_PORT)); then
      die "ports $base..$((base + NODES - 1)) (or their bus ports) include $SHARED_REDIS_PORT, the shared Redis"
    fi
  done
  echo "$base"
}

# The data dirs of clusters this script started on `base`: ours (owned by this user),
# with a pids file.
data_dirs() {
  local base=$1 dir
  for dir in "$DIR_PREFIX-$base".*; do
    [[ -d $dir && -O $dir && -f $dir/pids ]] && echo "$dir"
  done
  return 0
}

# True if `pid` is still the redis-server serving `port` (its process title names the
# address it listens on), so a reused pid is never killed.
is_our_node() {
  local pid=$1 port=$2 args
  args=$(ps -o args= -p "$pid" 2>/dev/null) || return 1
  [[ $args == redis-server*":$port"* ]]
}

# Stops the nodes listed in `dir`/pids (SIGTERM, then SIGKILL past WAIT_SECS) and
# removes the dir.
stop_dir() {
  local dir=$1 pid port i left
  while read -r pid port; do
    if is_our_node "$pid" "$port"; then
      kill -TERM "$pid" 2>/dev/null || true
    fi
  done <"$dir/pids"
  for ((i = 0; i < WAIT_SECS * 10; i++)); do
    left=0
    while read -r pid port; do
      if is_our_node "$pid" "$port"; then left=1; fi
    done <"$dir/pids"
    ((left)) || break
    sleep 0.1
  done
  while read -r pid port; do
    if is_our_node "$pid" "$port"; then
      say "node :$port (pid $pid) did not stop on SIGTERM within ${WAIT_SECS}s; killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done <"$dir/pids"
  rm -rf -- "$dir"
}

# True if the node on `port` sees the cluster formed: cluster_state:ok, all the nodes
# known, half of them primaries and half replicas, none failed or still joining; and, if
# it is a replica, its link to its primary up. cluster_state:ok alone comes first: the
# replicas are still primaries without slots then, and could not take over yet.
node_formed() {
  local port=$1 info nodes roles
  info=$(redis-cli -h 127.0.0.1 -p "$port" cluster info 2>/dev/null) || return 1
  grep -q '^cluster_state:ok' <<<"$info" || return 1
  grep -q "^cluster_known_nodes:$NODES" <<<"$info" || return 1
  nodes=$(redis-cli -h 127.0.0.1 -p "$port" cluster nodes 2>/dev/null) || return 1
  roles=$(awk '
    $3 ~ /fail|handshake|noaddr/ { bad++ }
    $3 ~ /master/ { primaries++ }
    $3 ~ /slave/ { replicas++ }
    END { printf "%d %d %d", primaries, replicas, bad }' <<<"$nodes")
  [[ $roles == "$((NODES / 2)) $((NODES / 2)) 0" ]] || return 1
  info=$(redis-cli -h 127.0.0.1 -p "$port" info replication 2>/dev/null) || return 1
  if grep -q '^role:slave' <<<"$info"; then
    grep -q '^master_link_status:up' <<<"$info" || return 1
  fi
}

# Waits (bounded) until every node sees the cluster formed.
wait_formed() {
  local base=$1 i p ok
  for ((i = 0; i < WAIT_SECS * 10; i++)); do
    ok=1
    for ((p = base; p < base + NODES; p++)); do
      node_formed "$p" || { ok=0; break; }
    done
    ((ok)) && return 0
    sleep 0.1
  done
  return 1
}

# The data dir of a start in progress, stopped if the script exits before it is done.
STARTING_DIR=

on_exit() {
  local status=$1
  if ((status != 0)) && [[ -n $STARTING_DIR ]]; then
    say "start failed; stopping the nodes started"
    stop_dir "$STARTING_DIR"
  fi
}

start() {
  local base dir p i nodes=()
  base=$(base_port "${1:-}")
  command -v redis-server >/dev/null && command -v redis-cli >/dev/null ||
    die "redis-server and redis-cli are needed (apt-get install redis-server, or scripts/services.sh on a machine without Redis)"
  if [[ -n $(data_dirs "$base") ]]; then
    die "a cluster of this script already has data on $base ($(data_dirs "$base" | head -1)); run: $0 stop $base"
  fi
  for ((p = base; p < base + NODES; p++)); do
    if port_open "$p" || port_open $((p + 10000)); then
      die "port $p or its bus port $((p + 10000)) is taken; choose another BASE_PORT"
    fi
    nodes+=("127.0.0.1:$p")
  done

  dir=$(mktemp -d "$DIR_PREFIX-$base.XXXXXX")
  # A failure half-way (set -e exits, wherever it happens) stops the nodes already
  # started, so no half cluster stays behind.
  STARTING_DIR=$dir
  trap 'on_exit $?' EXIT
  : >"$dir/pids"
  # One node at a time, each waited for: when one fails, every node started before it
  # is in the pids file, which the trap stops.
  for ((p = base; p < base + NODES; p++)); do
    mkdir "$dir/$p"
    # --save "" and --appendonly no: nothing on disk but nodes.conf; a cluster for
    # tests and benches starts empty. Diskless sync without delay: a replica's first
    # sync is sent from memory at once, not after the default 5 s wait for others.
    redis-server --port "$p" --bind 127.0.0.1 \
      --cluster-enabled yes --cluster-config-file "$dir/$p/nodes.conf" \
      --cluster-node-timeout "$NODE_TIMEOUT_MS" \
      --save "" --appendonly no \
      --repl-diskless-sync yes --repl-diskless-sync-delay 0 \
      --dir "$dir/$p" --logfile "$dir/$p/redis.log" \
      --daemonize yes --pidfile "$dir/$p/redis.pid"
    # The pidfile is written once the daemon has bound its port.
    for ((i = 0; i < WAIT_SECS * 10; i++)); do
      [[ -s $dir/$p/redis.pid ]] && break
      sleep 0.1
    done
    [[ -s $dir/$p/redis.pid ]] || fail_with_log "$dir/$p/redis.log" "node :$p did not start"
    echo "$(cat "$dir/$p/redis.pid") $p" >>"$dir/pids"
    for ((i = 0; i < WAIT_SECS * 10; i++)); do
      redis-cli -h 127.0.0.1 -p "$p" ping >/dev/null 2>&1 && break
      sleep 0.1
    done
    redis-cli -h 127.0.0.1 -p "$p" ping >/dev/null 2>&1 ||
      fail_with_log "$dir/$p/redis.log" "node :$p does not answer"
  done
  say "creating the cluster over ${nodes[*]}"
  redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes \
    >"$dir/create.log" 2>&1 || fail_with_log "$dir/create.log" "redis-cli --cluster create failed"
  wait_formed "$base" ||
    { say "the cluster did not form (cluster_state:ok, replicas in sync on every node) within ${WAIT_SECS}s"; false; }
  trap - EXIT
  say "ready (data and logs in $dir; stop with: $0 stop $base)"
  local IFS=,
  echo "FLASHSALE_REDIS_CLUSTER_NODES=${nodes[*]}"
}

stop() {
  local base dirs dir
  base=$(base_port "${1:-}")
  dirs=$(data_dirs "$base")
  [[ -n $dirs ]] || { say "no cluster of this script on $base"; return 0; }
  for dir in $dirs; do
    stop_dir "$dir"
    say "stopped the cluster on $base (removed $dir)"
  done
}

case ${1:-} in
  start) start "${2:-}" ;;
  stop) stop "${2:-}" ;;
  *) usage ;;
esac
