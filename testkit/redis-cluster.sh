#!/usr/bin/env bash
# Start or stop a local 3-master Redis Cluster for tests (no replicas, no persistence).
#
#   testkit/redis-cluster.sh start    # idempotent: does nothing if the cluster is up and ok
#   testkit/redis-cluster.sh stop     # shuts the nodes down and removes their work dir
#   testkit/redis-cluster.sh status   # exit 0 if every node answers and cluster_state:ok
#   testkit/redis-cluster.sh acquire ID   # start if down, and hold a lease for process ID
#   testkit/redis-cluster.sh release ID   # drop the lease; the last one out stops the
#                                         # cluster if `acquire` started it
#
# Leases let several test runs (vitest's globalSetup, one per run) share one cluster: a
# run never stops a cluster another live run still holds. `stop` while leases are held
# only asks the last holder to stop it. Leases of dead processes are ignored.
#
# Env: PERCOLATOR_REDIS_CLUSTER_PORTS (default "7001 7002 7003"),
#      PERCOLATOR_REDIS_CLUSTER_DIR (default $TMPDIR/percolator-redis-cluster-<ports>: the
#      ports are a machine-wide resource, so the nodes' work dirs, the leases and the lock
#      are keyed by ports, not by checkout, and runs from different checkouts share them).
set -euo pipefail

PORTS="${PERCOLATOR_REDIS_CLUSTER_PORTS:-7001 7002 7003}"
HOST=127.0.0.1
KEY="$(echo $PORTS | tr ' ' '-')"
DIR="${PERCOLATOR_REDIS_CLUSTER_DIR:-${TMPDIR:-/tmp}/percolator-redis-cluster-$KEY}"
LOCK="${TMPDIR:-/tmp}/percolator-redis-cluster-$KEY.lock"
LEASES="$DIR/leases-$KEY"
AUTOSTOP="$DIR/autostop-$KEY"

# Every probe has a deadline: something that accepts a connection and never answers must
# not hang the script.
cli() { timeout 3 redis-cli -h "$HOST" -p "$1" "${@:2}"; }
answers() { [ "$(cli "$1" ping 2>/dev/null)" = "PONG" ]; }
listening() { timeout 2 bash -c "exec 3<>/dev/tcp/$HOST/$1" 2>/dev/null; }
state_ok() { cli "$1" cluster info 2>/dev/null | grep -q '^cluster_state:ok'; }
known_nodes() { cli "$1" cluster info 2>/dev/null | sed -n 's/^cluster_known_nodes:\([0-9]*\).*/\1/p'; }

count() { set -- $PORTS; echo $#; }

all_ok() {
  local n
  n="$(count)"
  for port in $PORTS; do
    answers "$port" && state_ok "$port" && [ "$(known_nodes "$port")" = "$n" ] || return 1
  done
}

start_node() {
  local port="$1" dir="$DIR/$1"
  mkdir -p "$dir"
  redis-server --port "$port" --bind "$HOST" --cluster-enabled yes \
    --cluster-config-file "$dir/nodes.conf" --cluster-node-timeout 5000 \
    --save "" --appendonly no --dir "$dir" \
    --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" 9>&-
  for _ in $(seq 1 100); do
    answers "$port" && return 0
    if grep -q 'Address already in use' "$dir/redis.log" 2>/dev/null; then
      echo "port $port is already in use by another process (see $dir/redis.log); free it or set PERCOLATOR_REDIS_CLUSTER_PORTS" >&2
      return 1
    fi
    sleep 0.05
  done
  echo "redis node on port $port did not start; see $dir/redis.log" >&2
  return 1
}

# A node we started: its pid file is in our work dir.
ours() { [ "$(cli "$1" config get pidfile 2>/dev/null | sed -n 2p)" = "$DIR/$1/redis.pid" ]; }

# Sets FOREIGN to the ports still served afterwards: by a redis-server this script did not
# start (left running: never ours to stop). Found after the kills, not before: a node of
# ours too busy to answer "config get pidfile" in time is still killed through its pidfile.
stop_nodes() {
  FOREIGN=""
  for port in $PORTS; do
    if answers "$port" && ours "$port"; then cli "$port" shutdown nosave >/dev/null 2>&1 || true; fi
    local pidfile="$DIR/$port/redis.pid"
    if [ -f "$pidfile" ]; then
      local pid
      pid="$(cat "$pidfile")"
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -rf "${DIR:?}/$port"
  done
  for port in $PORTS; do
    if answers "$port"; then FOREIGN="$FOREIGN $port"; fi
  done
  rm -f "$DIR/create-$KEY.log"
  rmdir "$DIR" 2>/dev/null || true
}

# Stops the nodes and drops the lease state (callers checked that no live run holds one).
stop_all() {
  rm -rf "$LEASES" "$AUTOSTOP"
  stop_nodes
  if [ -n "$FOREIGN" ]; then
    # It said "stopped" while those nodes went on serving (found by a new user).
    echo "redis cluster stopped, except port(s)$FOREIGN: served by a redis-server this script did not start, left running" >&2
    return 1
  fi
  echo "redis cluster stopped"
}

wait_ok() {
  for _ in $(seq 1 300); do all_ok && return 0; sleep 0.1; done
  echo "cluster did not reach cluster_state:ok on ports $PORTS" >&2
  return 1
}

start() {
  if all_ok; then echo "redis cluster already running on ports $PORTS"; return 0; fi
  # Half-started or stale state (e.g. a node restarted with an old nodes.conf): rebuild
  # from scratch. The test cluster keeps no data worth saving.
  local any=0
  for port in $PORTS; do
    if answers "$port"; then
      if ! ours "$port"; then
        echo "port $port is served by a redis-server this script did not start; stop it or set PERCOLATOR_REDIS_CLUSTER_PORTS" >&2
        return 1
      fi
      any=1
    elif listening "$port"; then
      echo "port $port is in use by a process that is not Redis; free it or set PERCOLATOR_REDIS_CLUSTER_PORTS" >&2
      return 1
    fi
  done
  if [ "$any" = 1 ] || [ -d "$DIR" ]; then stop_nodes; fi
  for port in $PORTS; do
    # Do not leave the nodes already started running when a later one fails.
    start_node "$port" || { stop_nodes; return 1; }
  done
  local addrs=()
  for port in $PORTS; do addrs+=("$HOST:$port"); done
  timeout 60 redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes \
    >"$DIR/create-$KEY.log" 2>&1 || {
    cat "$DIR/create-$KEY.log" >&2
    stop_nodes
    return 1
  }
  wait_ok
  echo "redis cluster running on ports $PORTS"
}

# Lease ids of live processes (dead ones are removed).
live_leases() {
  [ -d "$LEASES" ] || return 0
  for lease in "$LEASES"/*; do
    [ -e "$lease" ] || continue
    local id="${lease##*/}"
    if [ -d "/proc/$id" ]; then echo "$id"; else rm -f "$lease"; fi
  done
}

lease_id() {
  [[ "${1:-}" =~ ^[0-9]+$ ]] || { echo "usage: $0 acquire|release PID" >&2; exit 2; }
}

acquire() {
  lease_id "${1:-}"
  if ! all_ok; then
    start
    touch "$AUTOSTOP"
  elif ! ours "${PORTS%% *}"; then
    echo "using the redis cluster already running on ports $PORTS (not started by this script)"
    return 0
  fi
  mkdir -p "$LEASES"
  touch "$LEASES/$1"
}

release() {
  lease_id "${1:-}"
  rm -f "$LEASES/$1"
  if [ -z "$(live_leases)" ] && [ -e "$AUTOSTOP" ]; then stop_all; fi
}

stop() {
  local holders
  holders="$(live_leases | tr '\n' ' ')"
  if [ -n "$holders" ]; then
    mkdir -p "$DIR"
    touch "$AUTOSTOP"
    echo "redis cluster in use by process(es) $holders; the last one stops it"
    return 0
  fi
  stop_all
}

# start/stop/acquire/release change shared state: one at a time per port set.
locked() {
  exec 9>"$LOCK"
  flock -w 180 9 || { echo "timed out waiting for $LOCK" >&2; exit 1; }
  "$@"
}

case "${1:-}" in
  start) locked start ;;
  stop) locked stop ;;
  status) all_ok ;;
  acquire) locked acquire "${2:-}" ;;
  release) locked release "${2:-}" ;;
  *) echo "usage: $0 start|stop|status|acquire PID|release PID" >&2; exit 2 ;;
esac
