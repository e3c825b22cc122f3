#!/bin/sh
# Starts the floret node of a pod of the StatefulSet in deploy/k8s/floret.yaml
# (the image runs it as `floret-k8s-start`). Pod floret-N is node N+1, with
# the member certificate node-<N+1> from the Secret floret-tls.
#
# The first FOUNDING_NODES pods (3) found the cluster with FLORET_PEERS. A pod
# past them (the StatefulSet scaled up) joins the running cluster: it makes
# its node a member through the client Service (`floret cluster add-node`,
# which changes nothing when the node is a member already, so a restart does
# the same) with the admin token in ADMIN_TOKEN_FILE, retrying every
# JOIN_RETRY_SECONDS until a member answers, then starts with --join, asking
# the founding members. Scaling down is two steps: `floret cluster
# remove-node` for each node that goes (the highest ids first), then
# `kubectl scale` once it has left (deploy/README.md).
set -eu

founding=${FOUNDING_NODES:-3}
ordinal=${HOSTNAME##*-}
id=$((ordinal + 1))
tls_dir=${TLS_DIR:-/etc/floret/tls}
export FLORET_NODE_ID="$id"
export FLORET_TLS_CERT="$tls_dir/node-$id.pem"
export FLORET_TLS_KEY="$tls_dir/node-$id.key"

if [ "$id" -gt "$founding" ]; then
    token_file=${ADMIN_TOKEN_FILE:-/etc/floret/admin/token}
    if [ ! -r "$token_file" ]; then
        echo "node $id joins a running cluster and needs an admin token in $token_file (the Secret floret-admin, see deploy/k8s/floret.yaml)" >&2
        exit 1
    fi
    peer_address="$HOSTNAME.${PEER_DOMAIN:-floret-peers}:7801"
    until FLORET_TOKEN=$(cat "$token_file") floret cluster add-node --id "$id" \
        --peer-addr "$peer_address" --addr "${CLIENT_SERVICE:-floret:7701}"; do
        echo "node $id is not a member yet; asking again in ${JOIN_RETRY_SECONDS:-5} s" >&2
        sleep "${JOIN_RETRY_SECONDS:-5}"
    done
    export FLORET_JOIN="$FLORET_PEERS"
    unset FLORET_PEERS
fi
exec floret serve
