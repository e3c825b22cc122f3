#!/bin/sh
# Starts a three-node floret cluster on this machine as three separate
# `floret serve` processes (so single nodes can be killed and restarted),
# or stops it again.
#
#   deploy/local-cluster.sh start      # build (release) and start nodes 1-3
#   deploy/local-cluster.sh stop       # SIGTERM every node this script started
#   deploy/local-cluster.sh kill N     # SIGKILL node N
#   deploy/local-cluster.sh restart N  # start node N again on its data dir
#
# Environment: FLORET (binary; default target/release/floret, built if
# missing), FLORET_DEV_DIR (data dirs, logs and pid files; default
# ./floret-local), FLORET_BASE_PORT (node N's client port is BASE_PORT + N - 1,
# default 7701; its peer port, which only the other nodes dial, is 100 above;
# its metrics and web console, http://127.0.0.1:<port>/, 2000 above).
#
# The nodes serve TLS and mutual TLS with certificates `floret certs` makes
# in $FLORET_DEV_DIR/certs on the first start; the floret commands trust
# them with FLORET_TLS_CA=$FLORET_DEV_DIR/certs/ca.pem (the script says so).
set -eu

dir=${FLORET_DEV_DIR:-floret-local}
base_port=${FLORET_BASE_PORT:-7701}
floret=${FLORET:-target/release/floret}
peer_port=$((base_port + 100))
peers="1=127.0.0.1:${peer_port},2=127.0.0.1:$((peer_port + 1)),3=127.0.0.1:$((peer_port + 2))"

certs="$dir/certs"

start_node() {
    id=$1
    port=$((base_port + id - 1))
    "$floret" serve --node-id "$id" --listen "127.0.0.1:$port" \
        --metrics-listen "127.0.0.1:$((port + 2000))" \
        --data-dir "$dir/node-$id" --peers "$peers" \
        --tls-cert "$certs/node-$id.pem" --tls-key "$certs/node-$id.key" \
        --tls-ca "$certs/ca.pem" --gossip-secret-file "$certs/gossip.key" \
        >"$dir/node-$id.out" 2>"$dir/node-$id.log" &
    echo $! >"$dir/node-$id.pid"
    echo "node $id: pid $!, 127.0.0.1:$port, console http://127.0.0.1:$((port + 2000))/, data $dir/node-$id, log $dir/node-$id.log"
}

signal_node() {
    pid_file="$dir/node-$2.pid"
    if [ -f "$pid_file" ]; then
        kill "-$1" "$(cat "$pid_file")" 2>/dev/null || true
        rm -f "$pid_file"
    fi
}

case "${1:-}" in
start)
    if [ ! -x "$floret" ]; then
        cargo build --release -p floret-cli
    fi
    mkdir -p "$dir"
    if [ ! -f "$certs/ca.pem" ]; then
        "$floret" certs --out "$certs" --nodes 3 >/dev/null
    fi
    for id in 1 2 3; do start_node "$id"; done
    echo "waiting for the nodes to elect shard leaders..."
    for id in 1 2 3; do
        tries=0
        until grep -q "serving on" "$dir/node-$id.out" 2>/dev/null; do
            tries=$((tries + 1))
            if [ "$tries" -gt 600 ]; then
                echo "node $id did not become ready; see $dir/node-$id.log" >&2
                exit 1
            fi
            sleep 0.1
        done
    done
    "$floret" status --addr "127.0.0.1:$base_port" --tls-ca "$certs/ca.pem"
    echo "the nodes serve TLS; let the floret commands trust them:"
    echo "  export FLORET_TLS_CA=$certs/ca.pem"
    ;;
stop)
    for id in 1 2 3; do signal_node TERM "$id"; done
    ;;
kill)
    signal_node KILL "${2:?node id}"
    ;;
restart)
    signal_node KILL "${2:?node id}"
    start_node "$2"
    ;;
*)
    echo "usage: $0 start | stop | kill N | restart N" >&2
    exit 2
    ;;
esac
