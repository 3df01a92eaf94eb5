#!/usr/bin/env bash
# Start or stop a local 3-master Redis Cluster for tests (no replicas, no persistence).
#
#   scripts/redis-cluster.sh start    # idempotent: does nothing if the cluster is up and ok
#   scripts/redis-cluster.sh stop     # shuts the nodes down and removes their work dir
#   scripts/redis-cluster.sh status   # exit 0 if every node answers and cluster_state:ok
#
# Env: PERCOLATOR_REDIS_CLUSTER_PORTS (default "7001 7002 7003"),
#      PERCOLATOR_REDIS_CLUSTER_DIR (default <repo>/.redis-cluster, gitignored).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PORTS="${PERCOLATOR_REDIS_CLUSTER_PORTS:-7001 7002 7003}"
DIR="${PERCOLATOR_REDIS_CLUSTER_DIR:-$ROOT/.redis-cluster}"
HOST=127.0.0.1

cli() { redis-cli -h "$HOST" -p "$1" "${@:2}"; }
answers() { [ "$(cli "$1" ping 2>/dev/null)" = "PONG" ]; }
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
    --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
  for _ in $(seq 1 100); do answers "$port" && return 0; sleep 0.05; done
  echo "redis node on port $port did not start; see $dir/redis.log" >&2
  return 1
}

# A node we started: its pid file is in our work dir.
ours() { [ "$(cli "$1" config get pidfile 2>/dev/null | sed -n 2p)" = "$DIR/$1/redis.pid" ]; }

stop_nodes() {
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
  rm -f "$DIR/create.log"
  rmdir "$DIR" 2>/dev/null || true
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
    fi
  done
  if [ "$any" = 1 ] || [ -d "$DIR" ]; then stop_nodes; fi
  for port in $PORTS; do start_node "$port"; done
  local addrs=()
  for port in $PORTS; do addrs+=("$HOST:$port"); done
  redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes >"$DIR/create.log" 2>&1 || {
    cat "$DIR/create.log" >&2
    return 1
  }
  wait_ok
  echo "redis cluster running on ports $PORTS"
}

case "${1:-}" in
  start) start ;;
  stop) stop_nodes; echo "redis cluster stopped" ;;
  status) all_ok ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
