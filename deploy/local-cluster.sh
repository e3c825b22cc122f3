#!/bin/sh
# Starts a three-node floret cluster on this machine as three separate
# `floret serve` processes (so single nodes can be killed and restarted),
# or stops it again.
#
#   deploy/local-cluster.sh start      # build (release) and start nodes 1-3
#   deploy/local-cluster.sh stop       # SIGTERM every node this script started
#   deploy/local-cluster.sh kill N     # SIGKILL node N
#   deploy/local-cluster.sh restart N  # start node N again on its data dir
#   deploy/local-cluster.sh add N      # make node N (> 3) a member and start it
#   deploy/local-cluster.sh remove N   # remove node N; stop it once it has left
#   deploy/local-cluster.sh replace N --with M
#                                      # start node M (> 3, new) in node N's seat;
#                                      # stop node N once it has left
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

# Node N's client and peer addresses.
address() { echo "127.0.0.1:$((base_port + $1 - 1))"; }
peer_address() { echo "127.0.0.1:$((peer_port + $1 - 1))"; }

# A running node other than node $1, for the floret commands.
other_node() {
    for pid_file in "$dir"/node-*.pid; do
        other=$(basename "$pid_file" .pid)
        other=${other#node-}
        if [ "$other" != "$1" ]; then
            address "$other"
            return
        fi
    done
    echo "no other node runs" >&2
    exit 1
}

start_node() {
    id=$1
    port=$((base_port + id - 1))
    if [ "$id" -le 3 ]; then
        membership="--peers $peers"
    else
        membership="--join $peers --peer-listen $(peer_address "$id")"
    fi
    # shellcheck disable=SC2086 # $membership is two flags and their values
    "$floret" serve --node-id "$id" --listen "127.0.0.1:$port" \
        --metrics-listen "127.0.0.1:$((port + 2000))" \
        --data-dir "$dir/node-$id" $membership \
        --tls-cert "$certs/node-$id.pem" --tls-key "$certs/node-$id.key" \
        --tls-ca "$certs/ca.pem" --gossip-secret-file "$certs/gossip.key" \
        >"$dir/node-$id.out" 2>"$dir/node-$id.log" &
    echo $! >"$dir/node-$id.pid"
    echo "node $id: pid $!, 127.0.0.1:$port, console http://127.0.0.1:$((port + 2000))/, data $dir/node-$id, log $dir/node-$id.log"
}

# Waits (a minute at most) until node $1 says it serves.
wait_serving() {
    tries=0
    until grep -q "serving on" "$dir/node-$1.out" 2>/dev/null; do
        tries=$((tries + 1))
        if [ "$tries" -gt 600 ]; then
            echo "node $1 did not become ready; see $dir/node-$1.log" >&2
            exit 1
        fi
        sleep 0.1
    done
}

# Waits (5 minutes at most) until node $1 is no member by what node $2
# says, then stops node $1 if it still runs.
wait_left_then_stop() {
    echo "waiting for node $1 to leave (its shards move to the others)..."
    tries=0
    while "$floret" --tls-ca "$certs/ca.pem" status --addr "$2" |
        grep '^members at' | grep -q " $(peer_address "$1")"; do
        tries=$((tries + 1))
        if [ "$tries" -gt 300 ]; then
            echo "node $1 has not left after 5 minutes; see floret status" >&2
            exit 1
        fi
        sleep 1
    done
    signal_node TERM "$1"
    echo "node $1 left the cluster and was stopped"
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
    for id in 1 2 3; do wait_serving "$id"; done
    "$floret" status --addr "127.0.0.1:$base_port" --tls-ca "$certs/ca.pem"
    echo "the nodes serve TLS; let the floret commands trust them:"
    echo "  export FLORET_TLS_CA=$certs/ca.pem"
    ;;
stop)
    for pid_file in "$dir"/node-*.pid; do
        [ -f "$pid_file" ] || continue
        id=$(basename "$pid_file" .pid)
        signal_node TERM "${id#node-}"
    done
    ;;
add)
    id=${2:?node id}
    if [ "$id" -le 3 ]; then
        echo "nodes 1-3 found the cluster; add nodes 4 and up" >&2
        exit 2
    fi
    "$floret" certs --out "$certs" --nodes "$id" >/dev/null
    "$floret" --tls-ca "$certs/ca.pem" cluster add-node --id "$id" \
        --peer-addr "$(peer_address "$id")" --addr "$(other_node "$id")"
    start_node "$id"
    wait_serving "$id"
    echo "node $id joined; its shards move to it (floret status shows them)"
    ;;
remove)
    id=${2:?node id}
    asked=$(other_node "$id")
    "$floret" --tls-ca "$certs/ca.pem" cluster remove-node "$id" --addr "$asked"
    wait_left_then_stop "$id" "$asked"
    ;;
replace)
    old=${2:?node id}
    [ "${3:-}" = "--with" ] || { echo "usage: $0 replace N --with M" >&2; exit 2; }
    new=${4:?new node id}
    if [ "$new" -le 3 ]; then
        echo "nodes 1-3 found the cluster; a replacement is node 4 or up" >&2
        exit 2
    fi
    asked=$(other_node "$old")
    "$floret" certs --out "$certs" --nodes "$new" >/dev/null
    "$floret" --tls-ca "$certs/ca.pem" cluster replace-node "$old" --with "$new" \
        --peer-addr "$(peer_address "$new")" --addr "$asked"
    # start_node sets $id: $old and $new stay as they were.
    start_node "$new"
    wait_serving "$new"
    echo "node $new joined in node $old's seat; node $old's shards move to it"
    wait_left_then_stop "$old" "$asked"
    ;;
kill)
    signal_node KILL "${2:?node id}"
    ;;
restart)
    signal_node KILL "${2:?node id}"
    start_node "$2"
    ;;
*)
    echo "usage: $0 start | stop | kill N | restart N | add N | remove N | replace N --with M" >&2
    exit 2
    ;;
esac
