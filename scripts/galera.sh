#!/usr/bin/env bash
# A local MariaDB Galera cluster (3 nodes on 127.0.0.1) for manual runs and benches of
# flashsale on a cluster:
#
#   scripts/galera.sh start    starts the nodes that are not running (none if all are)
#   scripts/galera.sh stop     shuts the nodes down, one after the other; keeps the data
#   scripts/galera.sh status   each node's wsrep state; exit 0 if all three are Synced
#   scripts/galera.sh wipe     stops the nodes and removes the data
#
# `start` prints the lines to use, e.g.
#   FLASHSALE_DATABASE_NODES=127.0.0.1:14300,127.0.0.1:14310,127.0.0.1:14320
#   FLASHSALE_DATABASE_URL=mysql://root@127.0.0.1:14300/flashsale
# (`export` them for `flashsale serve` and flashsale-bench; root, empty password).
#
# Environment:
#   FLASHSALE_GALERA_BASE_PORT  default 14300. Node i (0, 1, 2) uses BASE+10*i for SQL,
#                               +1 for Galera, +2 for IST and +3 for rsync SST.
#   FLASHSALE_GALERA_DIR        where the data and logs go. Default: a directory made
#                               by mktemp under ${TMPDIR:-/tmp}, named after the base
#                               port (flashsale-galera-BASE.XXXXXX) so later calls find
#                               it; never a predictable path other users could plant.
#
# Each node has its data, log and socket in DIR/nodeI. When this script runs as root,
# mariadbd runs as the mysql user (rsync state transfer refuses root). Missing
# packages (mariadb-server, galera-4, rsync) are installed with apt, as
# scripts/services.sh does. `stop` and `wipe` stop only the mariadbd processes whose
# command line names this cluster's data directories: not the shared MariaDB on 3306,
# not another cluster's nodes.
#
# Restarting the whole cluster (`start` after `stop`, or after every node died): the
# cluster must start again from its most advanced node, the one that committed the
# most. `start` reads each node's seqno from its grastate.dat (for a node that did not
# shut down cleanly, seqno -1 there, from `mariadbd --wsrep-recover`), sets
# `safe_to_bootstrap: 1` on the node with the highest one (that node alone may found
# the new cluster), starts it with --wsrep-new-cluster, then the others, which catch
# up by IST (or a full rsync SST when the founder no longer has what they miss). `stop`
# shuts the nodes down one after the other (2, 1, then 0), so the last one, node 0,
# holds every commit and is marked safe to bootstrap by Galera itself.
set -euo pipefail

# Nodes of the cluster: the smallest count where one node can die and the two others
# are still a majority that keeps taking writes.
NODES=3
# Default SQL port of node 0: clear of cluster.sh's ports (7000-7005, 17000-17005), of
# the shared services, of the testkit's private servers (20000 and up) and below the
# ephemeral range (32768 and up), where outgoing connections take their source ports.
DEFAULT_BASE_PORT=14300
# Distance between two nodes' SQL ports; each node uses 4 ports from its own.
NODE_PORT_STEP=10
# The shared services' ports: never part of this cluster.
SHARED_PORTS="3306 4222 5432 5672 6379"
# The Galera 4 provider (Debian's galera-4).
GALERA_PROVIDER=/usr/lib/galera/libgalera_smm.so
# Seconds to wait for a node to be Synced (a full rsync SST takes about 4 s; the bound is
# for a busy machine) and for a node to shut down.
WAIT_SECS=60
# Heartbeat and failure detection, the same on every node from the start (set at run
# time on some nodes only, they made a cluster lose its Primary Component for 13 s): a
# dead node leaves after 2 s of silence, not Galera's default 5 s; 6 s drops it even
# without everybody's agreement (Galera's default is 15 s).
EVS_OPTIONS="evs.keepalive_period=PT0.5S;evs.suspect_timeout=PT2S;evs.inactive_timeout=PT6S"
# Each node's write-set cache: what a node that was away can catch up from by IST.
GCACHE_SIZE=64M
# Where the data dirs go by default, named after the base port so later calls find them.
DIR_PREFIX=${TMPDIR:-/tmp}/flashsale-galera
# The file that marks a data dir as this script's (its content: the base port).
MARKER=galera-cluster

say() { echo "galera: $*" >&2; }
die() { say "$*"; exit 1; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

usage() {
  sed -n 2,13p "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Says what failed with the end of `log`, and fails.
fail_with_log() {
  local log=$1
  shift
  say "$*; end of $log:"
  tail -n 30 "$log" 2>/dev/null | sed 's/^/  /' >&2 || true
  false
}

# Installs, in one apt run, whatever the cluster needs and is missing.
install_missing() {
  local missing=()
  command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server)
  command -v mariadb >/dev/null || missing+=(mariadb-client)
  [ -e "$GALERA_PROVIDER" ] || missing+=(galera-4)
  command -v rsync >/dev/null || missing+=(rsync)
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

MARIADBD=$(command -v mariadbd || echo /usr/sbin/mariadbd)

# The base port from the environment (or the default), checked: a number whose nodes'
# ports are valid and none of them a shared service's.
base_port() {
  local base=${FLASHSALE_GALERA_BASE_PORT:-$DEFAULT_BASE_PORT} p shared
  [[ $base =~ ^[0-9]+$ ]] || die "FLASHSALE_GALERA_BASE_PORT must be a number, got '$base'"
  ((base >= 1024 && base + NODE_PORT_STEP * (NODES - 1) + 3 <= 65535)) ||
    die "FLASHSALE_GALERA_BASE_PORT must be between 1024 and $((65535 - NODE_PORT_STEP * (NODES - 1) - 3)), got $base"
  for shared in $SHARED_PORTS; do
    for ((p = base; p <= base + NODE_PORT_STEP * (NODES - 1) + 3; p++)); do
      ((p != shared)) ||
        die "the nodes' ports ($base and up) include $shared, a shared service's"
    done
  done
  echo "$base"
}

sql_port() { echo $((BASE + NODE_PORT_STEP * $1)); }
galera_port() { echo $((BASE + NODE_PORT_STEP * $1 + 1)); }

# The cluster's data dir: FLASHSALE_GALERA_DIR, or the one a previous start made for
# this base port (ours, with the marker), or none (empty).
find_dir() {
  local dir
  if [[ -n ${FLASHSALE_GALERA_DIR:-} ]]; then
    echo "$FLASHSALE_GALERA_DIR"
    return 0
  fi
  for dir in "$DIR_PREFIX-$BASE".*; do
    if [[ -d $dir && -O $dir && -f $dir/$MARKER ]]; then
      echo "$dir"
      return 0
    fi
  done
  return 0
}

# A new data dir for this base port, reachable by the user mariadbd runs as.
make_dir() {
  local dir
  if [[ -n ${FLASHSALE_GALERA_DIR:-} ]]; then
    dir=$FLASHSALE_GALERA_DIR
    mkdir -p "$dir"
  else
    dir=$(mktemp -d "$DIR_PREFIX-$BASE.XXXXXX")
    # mktemp's 0700 would keep mysql out; it needs to pass through, not to list.
    chmod 711 "$dir"
  fi
  echo "$BASE" >"$dir/$MARKER"
  if [ "$(id -u)" = 0 ]; then
    runuser -u mysql -- test -x "$dir" ||
      die "the mysql user cannot reach $dir (a parent directory is closed to it); set FLASHSALE_GALERA_DIR or TMPDIR to a directory it can reach"
  fi
  echo "$dir"
}

# mariadbd's command line for node `i` of the cluster in DIR, in the array ARGS.
node_args() {
  local i=$1 node=$DIR/node$1 sql g peers="" p
  sql=$(sql_port "$i")
  g=$(galera_port "$i")
  for ((p = 0; p < NODES; p++)); do
    peers+="${peers:+,}127.0.0.1:$(galera_port "$p")"
  done
  # --no-defaults first: this machine's my.cnf names the shared server's user, pid
  # file and log. (The commas below are inside option values, e.g. --wsrep-mode's.)
  # shellcheck disable=SC2054
  ARGS=(
    --no-defaults
    --datadir="$node/data" --tmpdir="$node/tmp"
    --port="$sql" --bind-address=127.0.0.1 --socket="$node/sock"
    --pid-file="$node/mariadbd.pid" --log-error="$node/mariadbd.log"
    --skip-name-resolve
    --character-set-server=utf8mb4 --collation-server=utf8mb4_general_ci
    # A small redo log and buffer pool: three nodes on one machine, little data.
    --innodb-log-file-size=8M --innodb-buffer-pool-size=128M
    --binlog-format=ROW --innodb-autoinc-lock-mode=2 --default-storage-engine=InnoDB
    --wsrep-on=ON --wsrep-provider="$GALERA_PROVIDER"
    --wsrep-cluster-name="flashsale-$BASE"
    --wsrep-cluster-address="gcomm://$peers"
    --wsrep-node-name="node$i" --wsrep-node-address="127.0.0.1:$g"
    --wsrep-provider-options="gmcast.listen_addr=tcp://127.0.0.1:$g;ist.recv_addr=127.0.0.1:$((g + 1));gcache.size=$GCACHE_SIZE;$EVS_OPTIONS"
    --wsrep-sst-method=rsync --wsrep-sst-receive-address="127.0.0.1:$((sql + 3))"
    --wsrep-mode=REQUIRED_PRIMARY_KEY,STRICT_REPLICATION
  )
  if [ "$(id -u)" = 0 ]; then ARGS+=(--user=mysql); fi
}

# The pid of node `i` if it runs: the mariadbd whose command line names its data dir
# (the pid recorded at its start may be stale, reused by another process since).
node_pid() {
  local pid args
  pid=$(cat "$DIR/node$1/pid" 2>/dev/null) || return 1
  args=$(ps -o args= -p "$pid" 2>/dev/null) || return 1
  [[ $args == *mariadbd*"--datadir=$DIR/node$1/data "* ]] && echo "$pid"
}

# One value of node `i`'s `SHOW GLOBAL STATUS` (empty if it does not answer).
status_value() {
  mariadb --protocol=tcp -h 127.0.0.1 -P "$(sql_port "$1")" -u root -N -B \
    --connect-timeout=2 -e "SHOW GLOBAL STATUS LIKE '$2'" 2>/dev/null | cut -f2
}

# Node `i`'s saved seqno (grastate.dat; -1 after a crash; empty if it has none).
saved_seqno() {
  awk '/^seqno:/ { print $2 }' "$DIR/node$1/data/grastate.dat" 2>/dev/null || true
}

# Runs `mariadbd --wsrep-recover` on node `i` and prints the position it found
# (uuid:seqno).
recover_position() {
  local i=$1 log=$DIR/node$1/recover.log position
  node_args "$i"
  : >"$log"
  "$MARIADBD" "${ARGS[@]}" --log-error="$log" --wsrep-recover >>"$log" 2>&1 ||
    fail_with_log "$log" "mariadbd --wsrep-recover failed on node $i"
  position=$(sed -n 's/.*Recovered position: \([^ ]*\).*/\1/p' "$log" | tail -n 1)
  [[ -n $position ]] || fail_with_log "$log" "node $i: --wsrep-recover found no position"
  echo "$position"
}

# Starts node `i` in the background with `extra` options, its pid recorded in
# DIR/nodeI/pid (mariadbd's own pid file comes only once it has joined).
launch() {
  local i=$1 node=$DIR/node$1 pid
  shift
  node_args "$i"
  if port_open "$(sql_port "$i")" || port_open "$(galera_port "$i")"; then
    die "node $i's port $(sql_port "$i") or $(galera_port "$i") is taken; choose another FLASHSALE_GALERA_BASE_PORT"
  fi
  mkdir -p "$node/data" "$node/tmp"
  if [ "$(id -u)" = 0 ]; then chown -R mysql:mysql "$node"; fi
  "$MARIADBD" "${ARGS[@]}" "$@" </dev/null >>"$node/mariadbd.log" 2>&1 &
  pid=$!
  echo "$pid" >"$node/pid"
  say "node $i starting (pid $pid, SQL port $(sql_port "$i"))"
}

# Waits (bounded) until node `i` is Synced, Primary and ready; fails if it exits.
wait_synced() {
  local i=$1 n
  for ((n = 0; n < WAIT_SECS * 5; n++)); do
    node_pid "$i" >/dev/null ||
      fail_with_log "$DIR/node$i/mariadbd.log" "node $i exited while starting"
    if [[ $(status_value "$i" wsrep_local_state_comment) == Synced &&
      $(status_value "$i" wsrep_cluster_status) == Primary &&
      $(status_value "$i" wsrep_ready) == ON ]]; then
      return 0
    fi
    sleep 0.2
  done
  fail_with_log "$DIR/node$i/mariadbd.log" "node $i was not Synced within ${WAIT_SECS}s"
}

# Starts the nodes of a cluster none of whose nodes runs: from scratch if there is no
# data, else from the most advanced node (see the header).
start_all() {
  local i seqno best=-1 best_seqno=-2 positions=() extra=()
  if [[ ! -f $DIR/node0/data/grastate.dat && ! -d $DIR/node0/data/mysql ]]; then
    say "creating the cluster in $DIR"
    mkdir -p "$DIR/node0/data" "$DIR/node0/tmp"
    local user=()
    if [ "$(id -u)" = 0 ]; then
      chown -R mysql:mysql "$DIR/node0"
      user=(--user=mysql)
    fi
    mariadb-install-db --no-defaults "${user[@]}" --datadir="$DIR/node0/data" \
      --tmpdir="$DIR/node0/tmp" --auth-root-authentication-method=normal \
      --skip-test-db --innodb-log-file-size=8M >"$DIR/node0/install.log" 2>&1 ||
      fail_with_log "$DIR/node0/install.log" "mariadb-install-db failed"
    launch 0 --wsrep-new-cluster
    wait_synced 0
    # The others start empty and get a copy of node 0 (rsync SST, one at a time).
    for ((i = 1; i < NODES; i++)); do launch "$i"; done
    for ((i = 1; i < NODES; i++)); do wait_synced "$i"; done
    return 0
  fi
  for ((i = 0; i < NODES; i++)); do
    positions[i]=""
    seqno=$(saved_seqno "$i")
    [[ -n $seqno ]] || continue
    if ((seqno == -1)); then
      positions[i]=$(recover_position "$i")
      seqno=${positions[i]##*:}
    fi
    say "node $i: seqno $seqno"
    if ((seqno > best_seqno)); then
      best=$i
      best_seqno=$seqno
    fi
  done
  ((best >= 0)) || die "no node of $DIR has a saved state to restart from; run: $0 wipe"
  say "restarting the cluster from node $best (seqno $best_seqno)"
  sed -i 's/^safe_to_bootstrap:.*/safe_to_bootstrap: 1/' "$DIR/node$best/data/grastate.dat"
  extra=(--wsrep-new-cluster)
  [[ -z ${positions[best]} ]] || extra+=(--wsrep-start-position="${positions[best]}")
  launch "$best" "${extra[@]}"
  wait_synced "$best"
  for ((i = 0; i < NODES; i++)); do
    ((i != best)) || continue
    extra=()
    [[ -z ${positions[i]} ]] || extra+=(--wsrep-start-position="${positions[i]}")
    launch "$i" "${extra[@]}"
  done
  for ((i = 0; i < NODES; i++)); do wait_synced "$i"; done
}

# Starts the nodes that are not running, each from its recovered position, and lets
# them join the ones that run.
start_missing() {
  local i position
  for ((i = 0; i < NODES; i++)); do
    node_pid "$i" >/dev/null && continue
    position=""
    if [[ -n $(saved_seqno "$i") ]]; then position=$(recover_position "$i"); fi
    if [[ -n $position ]]; then
      launch "$i" --wsrep-start-position="$position"
    else
      launch "$i"
    fi
  done
  for ((i = 0; i < NODES; i++)); do wait_synced "$i"; done
}

print_settings() {
  local i nodes=()
  for ((i = 0; i < NODES; i++)); do nodes+=("127.0.0.1:$(sql_port "$i")"); done
  local IFS=,
  echo "FLASHSALE_DATABASE_NODES=${nodes[*]}"
  echo "FLASHSALE_DATABASE_URL=mysql://root@127.0.0.1:$(sql_port 0)/flashsale"
}

# The number of nodes running.
running_count() {
  local i count=0
  for ((i = 0; i < NODES; i++)); do
    if node_pid "$i" >/dev/null; then count=$((count + 1)); fi
  done
  echo "$count"
}

start() {
  install_missing
  DIR=$(find_dir)
  [[ -n $DIR && -f $DIR/$MARKER ]] || DIR=$(make_dir)
  case $(running_count) in
    "$NODES") say "the cluster is running (data in $DIR)" ;;
    0) start_all ;;
    *) start_missing ;;
  esac
  say "ready (data and logs in $DIR; stop with: $0 stop)"
  print_settings
}

# Shuts node `i` down (SIGTERM, then SIGKILL past WAIT_SECS).
stop_node() {
  local i=$1 pid n
  pid=$(node_pid "$i") || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for ((n = 0; n < WAIT_SECS * 10; n++)); do
    node_pid "$i" >/dev/null || { say "node $i stopped"; return 0; }
    sleep 0.1
  done
  say "node $i (pid $pid) did not stop on SIGTERM within ${WAIT_SECS}s; killing it"
  kill -KILL "$pid" 2>/dev/null || true
}

# Shuts every node down, one after the other, node 0 last: it then holds every commit
# (see the header). False if there is no cluster of this script.
stop_nodes() {
  local i
  DIR=$(find_dir)
  [[ -n $DIR && -f $DIR/$MARKER ]] || { say "no cluster of this script on $BASE"; return 1; }
  for ((i = NODES - 1; i >= 0; i--)); do stop_node "$i"; done
}

stop() {
  stop_nodes || return 0
  say "stopped (data kept in $DIR: start brings the cluster back; wipe removes it)"
}

wipe() {
  stop_nodes || return 0
  rm -rf -- "$DIR"
  say "removed $DIR"
}

status() {
  local i pid synced=0
  DIR=$(find_dir)
  [[ -n $DIR && -f $DIR/$MARKER ]] || { say "no cluster of this script on $BASE"; return 1; }
  for ((i = 0; i < NODES; i++)); do
    if pid=$(node_pid "$i"); then
      local state cluster size ready committed
      state=$(status_value "$i" wsrep_local_state_comment)
      cluster=$(status_value "$i" wsrep_cluster_status)
      size=$(status_value "$i" wsrep_cluster_size)
      ready=$(status_value "$i" wsrep_ready)
      committed=$(status_value "$i" wsrep_last_committed)
      echo "node $i 127.0.0.1:$(sql_port "$i") pid $pid: state=${state:-?} status=${cluster:-?} size=${size:-?} ready=${ready:-?} last_committed=${committed:-?}"
      if [[ $state == Synced && $cluster == Primary && $size == "$NODES" ]]; then
        synced=$((synced + 1))
      fi
    else
      local seqno
      seqno=$(saved_seqno "$i")
      echo "node $i 127.0.0.1:$(sql_port "$i"): not running (saved seqno ${seqno:-none})"
    fi
  done
  echo "data and logs in $DIR"
  ((synced == NODES))
}

case ${1:-} in
  start | stop | status | wipe) ;;
  *) usage ;;
esac
BASE=$(base_port)
DIR=
"$1"
