#!/usr/bin/env bash
# Makes sure the services flashsale needs (Redis, MariaDB, NATS JetStream) are installed
# and running on their standard local ports; starts (or installs) whatever is missing.
# Also installs faketime, which one test uses.
# Safe to run any number of times; never restarts or touches a service that answers.
set -euo pipefail

# Seconds to wait for a service to answer after starting it.
WAIT_SECS=30

say() { echo "services: $*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() {
  local name=$1 port=$2 i
  for ((i = 0; i < WAIT_SECS * 10; i++)); do
    if port_open "$port"; then return 0; fi
    sleep 0.1
  done
  say "$name did not come up on port $port within ${WAIT_SECS}s"
  return 1
}

install_missing() {
  local missing=()
  # faketime: the clock-jump test runs one flashsale process hours in the future.
  command -v faketime >/dev/null || missing+=(faketime)
  command -v redis-server >/dev/null || missing+=(redis-server)
  command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server)
  command -v nats-server >/dev/null || [ -x /usr/sbin/nats-server ] || missing+=(nats-server)
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

install_missing

if ! port_open 6379; then
  say "starting redis-server"
  as_root mkdir -p /var/lib/redis /var/log/redis
  as_root redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" \
    --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log
  wait_port redis 6379
fi

if ! port_open 3306; then
  say "starting mariadbd"
  as_root mkdir -p /run/mysqld
  as_root chown mysql:mysql /run/mysqld 2>/dev/null || true
  as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
  wait_port mariadb 3306
fi

if ! port_open 4222; then
  say "starting nats-server"
  as_root mkdir -p /var/lib/nats-server
  as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
  wait_port nats 4222
fi

say "redis :6379, mariadb :3306, nats :4222 are up"
