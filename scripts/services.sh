#!/usr/bin/env bash
# Makes sure the services flashsale needs (Redis, MariaDB, NATS JetStream) are running on
# their standard local ports; starts whatever does not answer, installing it first (apt)
# only if it is not installed.
#
#   scripts/services.sh                  the services (scripts/run.sh)
#   scripts/services.sh --with-faketime  also libfaketime, which the clock-jump test
#                                        preloads (scripts/test.sh)
#   scripts/services.sh --with-browser   also headless Chromium and its WebDriver
#                                        (Debian's chromium, chromium-driver), which
#                                        the dashboard's browser test drives
#                                        (scripts/test.sh)
#
# Safe to run any number of times; never restarts or touches a service that answers, and
# runs no apt at all when everything needed is there.
set -euo pipefail

WITH_FAKETIME=false
WITH_BROWSER=false
for arg in "$@"; do
  case $arg in
    --with-faketime) WITH_FAKETIME=true ;;
    --with-browser) WITH_BROWSER=true ;;
    *)
      echo "usage: scripts/services.sh [--with-faketime] [--with-browser]" >&2
      exit 2
      ;;
  esac
done

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

# The library the clock-jump test preloads (crash.rs looks in the same places).
has_libfaketime() {
  compgen -G '/usr/lib/*/faketime/libfaketime.so.1' >/dev/null ||
    [ -e /usr/lib/faketime/libfaketime.so.1 ]
}

# Installs, in one apt run, the packages of the services that do not answer and are not
# installed, and faketime and the browser when asked for and missing. A service that answers needs
# nothing here, even if it runs from elsewhere (a container, another prefix).
install_missing() {
  local missing=()
  if ! port_open 6379; then
    command -v redis-server >/dev/null || missing+=(redis-server)
  fi
  if ! port_open 3306; then
    command -v mariadbd >/dev/null || [ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server)
  fi
  if ! port_open 4222; then
    command -v nats-server >/dev/null || [ -x /usr/sbin/nats-server ] || missing+=(nats-server)
  fi
  if $WITH_FAKETIME; then
    has_libfaketime || missing+=(faketime)
  fi
  if $WITH_BROWSER; then
    command -v chromium >/dev/null || missing+=(chromium)
    command -v chromedriver >/dev/null || missing+=(chromium-driver)
  fi
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
