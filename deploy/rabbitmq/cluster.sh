#!/usr/bin/env bash
# A replicated broker: a 3-node RabbitMQ cluster on the dev grid's test hosts
# (rabbit@node1 … rabbit@node3, one per host, each listening on its host's
# own address), so that losing a node — its process or its host's network —
# can be tried for real. gleaner's queues are quorum queues: on this cluster
# each has a replica on every node, and survives the loss of any one.
# Idempotent, no systemd; needs deploy/grid/hosts.sh (run by deploy/sge/hosts.sh).
#
#   deploy/rabbitmq/cluster.sh up           (start, cluster, make the user)
#   deploy/rabbitmq/cluster.sh down         (stop the nodes, delete their data)
#   deploy/rabbitmq/cluster.sh stop NODE    (kill -9 a node, as a crash would)
#   deploy/rabbitmq/cluster.sh start NODE   (start it again; it rejoins)
#   deploy/rabbitmq/cluster.sh urls         (one base URL per line)
#   deploy/rabbitmq/cluster.sh ctl NODE ARGS…  (rabbitmqctl on a node)
#
# The nodes speak TLS only (amqps on 5671, the management API and UI over
# HTTPS on 15671), with certificates of a CA that certs.sh makes and this
# machine trusts: plain AMQP and HTTP are not offered on the hosts'
# addresses at all. Clients log in as `gleaner` with a password made on
# first `up` and kept, with the base URLs, in /etc/gleaner-broker/urls (root
# only). `up` prints the `broker_urls` line for gleaner.toml.
#
# There is no `guest` on the cluster: a fresh node makes guest/guest, an
# administrator, so `up` deletes it (every time: a cluster started afresh
# has it again), and until then guest may log in from loopback only, where
# no node listens. The password never goes on a command line (where `ps`
# shows it to every local user): rabbitmqctl reads it from its stdin.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
grid=$here/../grid/hosts.sh
nodes="node1 node2 node3"
etc=/etc/gleaner-broker
data=/var/lib/gleaner-broker
logs=/var/log/gleaner-broker
user=gleaner
log() { printf 'broker-cluster: %s\n' "$*" >&2; }
[ "$(id -u)" = 0 ] || { log "run as root (network namespaces)"; exit 1; }

addr_of() { echo "10.77.0.$((10 + ${1#node}))"; }
answers() { timeout 3 bash -c "exec 3<>/dev/tcp/$(addr_of "$1")/5671" 2>/dev/null; }
# The environment a node's server and its CLI share: names, ports, files.
node_env() {
    local node=$1
    echo RABBITMQ_NODENAME="rabbit@$node" \
        RABBITMQ_CONF_ENV_FILE="$etc/$node/rabbitmq-env.conf" \
        RABBITMQ_CONFIG_FILE="$etc/$node/rabbitmq.conf" \
        RABBITMQ_CONFIG_FILES="$etc/$node/conf.d" \
        RABBITMQ_ENABLED_PLUGINS_FILE="$etc/enabled_plugins" \
        RABBITMQ_MNESIA_BASE="$data/$node" \
        RABBITMQ_LOG_BASE="$logs/$node" \
        RABBITMQ_PID_FILE="$data/$node.pid" \
        HOME=/var/lib/rabbitmq
}
# Runs a RabbitMQ command on a node's host, as the rabbitmq user.
on() {
    local node=$1; shift
    # shellcheck disable=SC2046
    "$grid" exec "$node" runuser -u rabbitmq -- env $(node_env "$node") "$@"
}
ctl() { local node=$1; shift; on "$node" rabbitmqctl -q -n "rabbit@$node" "$@"; }
pid_of() { cat "$data/$1.pid" 2>/dev/null || true; }
# A pid file outlives a lost machine, and its number may be reused since.
running() {
    local pid
    pid=$(pid_of "$1")
    [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = beam.smp ] &&
        ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null
}

# Writes a node's configuration; fails if it differs from what the node has
# (a running node then needs a restart to take it).
configure() {
    local node=$1 addr
    addr=$(addr_of "$node")
    install -d -o rabbitmq -g rabbitmq "$data" "$logs" "$logs/$node"
    install -d "$etc/$node" "$etc/$node/conf.d"
    : > "$etc/$node/rabbitmq-env.conf"
    "$here/certs.sh" server "$etc/tls" "$node" "DNS:$node,IP:$addr"
    local tls="cacertfile = $etc/tls/ca.crt
certfile = $etc/tls/$node.crt
keyfile = $etc/tls/$node.key"
    {
        # Which certificate: one made again needs a restart too.
        echo "# $(openssl x509 -in "$etc/tls/$node.crt" -noout -fingerprint -sha256)"
        # TLS only, on the host's own address (its loopback 5672/15672 are
        # the grid's forwarders to the development broker).
        echo "listeners.tcp = none"
        echo "listeners.ssl.1 = $addr:5671"
        echo "$tls" | sed 's/^/ssl_options./'
        echo "ssl_options.versions.1 = tlsv1.3"
        echo "ssl_options.versions.2 = tlsv1.2"
        # Clients prove who they are by password, not by certificate.
        echo "ssl_options.verify = verify_none"
        echo "ssl_options.fail_if_no_peer_cert = false"
        echo "management.ssl.ip = $addr"
        echo "management.ssl.port = 15671"
        echo "$tls" | sed 's/^/management.ssl./'
        # guest (which a fresh node makes, until `up` deletes it) may log
        # in from loopback only, and no node listens there.
        echo "loopback_users.guest = true"
        # Keep a node that lost its peers from serving stale state.
        echo "cluster_partition_handling = pause_minority"
        cat "$here/50-gleaner.conf"
    } > "$etc/$node/rabbitmq.conf.new"
    [ -e "$etc/enabled_plugins" ] || echo '[rabbitmq_management].' > "$etc/enabled_plugins"
    if cmp -s "$etc/$node/rabbitmq.conf.new" "$etc/$node/rabbitmq.conf"; then
        rm "$etc/$node/rabbitmq.conf.new"
    else
        mv "$etc/$node/rabbitmq.conf.new" "$etc/$node/rabbitmq.conf"
        return 1
    fi
}

# Starts a node in the background; `await_nodes` waits for it.
launch_node() {
    local node=$1
    running "$node" && return 0
    configure "$node" || true
    rm -f "$data/$node.pid"
    log "starting rabbit@$node at $(addr_of "$node")"
    # Erlang's schedulers must not spin on a 2-core machine shared by 4 brokers.
    # Each client connection is a descriptor: as systemd's unit does, the
    # broker gets 65536 (or the most it may) rather than a shell's 1024.
    on "$node" env RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+sbwt none +sbwtdcpu none +sbwtdio none" \
        sh -c 'ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"; exec rabbitmq-server -detached'
}

# Waits until every given node answers; fails at once if one dies. A node
# whose data remembers a cluster waits for its peers before it listens, so
# the nodes of a cluster must boot together (one at a time they never do).
await_nodes() {
    local waiting="$*" node left
    for _ in $(seq 1 180); do
        left=
        for node in $waiting; do
            answers "$node" && continue
            # Its pid file appears once it started; it may die after that.
            if [ -n "$(pid_of "$node")" ] && ! running "$node"; then
                log "rabbit@$node stopped while starting; see $logs/$node"
                return 1
            fi
            left="$left $node"
        done
        [ -z "$left" ] && return 0
        waiting=$left
        sleep 1
    done
    log "rabbit@${waiting# } did not start in time; see $logs/${waiting# }"
    return 1
}

start_nodes() {
    local node
    for node in "$@"; do launch_node "$node"; done
    await_nodes "$@"
}

clustered_with() { ctl "$1" cluster_status --formatter json 2>/dev/null | grep -o "rabbit@node[0-9]*" | sort -u; }

up() {
    "$grid" up 3 >/dev/null
    install -d -m 0755 "$etc"
    local node
    for node in $nodes; do
        if ! configure "$node" && running "$node"; then
            log "restarting rabbit@$node with its new configuration"
            ctl "$node" stop >/dev/null 2>&1 || stop_node "$node"
        fi
    done
    # shellcheck disable=SC2086
    if ! start_nodes $nodes; then
        # The test cluster's state is disposable: what a crash or a lost
        # machine left half-made is not worth a failed setup.
        log "starting the cluster afresh"
        down
        install -d -m 0755 "$etc"
        # shellcheck disable=SC2086
        start_nodes $nodes
    fi
    # A node listens before it has finished booting; its cluster status
    # is only true once it has.
    for node in $nodes; do ctl "$node" await_startup; done
    # node2 and node3 join node1's cluster (once).
    for node in node2 node3; do
        if ! clustered_with node1 | grep -qx "rabbit@$node"; then
            log "rabbit@$node joins rabbit@node1"
            # The CLI's warnings about a fresh node's feature flags are noise.
            { ctl "$node" stop_app && ctl "$node" reset &&
                ctl "$node" join_cluster rabbit@node1 && ctl "$node" start_app; } 2>/dev/null ||
                { log "rabbit@$node could not join; see $logs/$node"; exit 1; }
        fi
    done
    if [ ! -s "$etc/password" ]; then
        (umask 077; head -c 18 /dev/urandom | base64 | tr -d '/+=' > "$etc/password")
    fi
    local password users
    password=$(cat "$etc/password")
    users=$(ctl node1 list_users --formatter json)
    # Given no password argument, rabbitmqctl reads it from stdin (-q: no
    # prompt): not on any command line.
    if grep -q "\"user\":\"$user\"" <<<"$users"; then
        ctl node1 change_password "$user" <"$etc/password" >/dev/null
    else
        ctl node1 add_user "$user" <"$etc/password" >/dev/null
    fi
    ctl node1 set_user_tags "$user" administrator >/dev/null
    ctl node1 set_permissions -p / "$user" '.*' '.*' '.*' >/dev/null
    # The default administrator guest/guest, which a fresh node makes.
    if grep -q '"user":"guest"' <<<"$users"; then
        log "deleting the default user guest"
        ctl node1 delete_user guest >/dev/null
    fi
    (umask 077; for node in $nodes; do echo "amqps://$user:$password@$(addr_of "$node"):5671"; done > "$etc/urls")
    log "up: $(clustered_with node1 | tr '\n' ' ')"
    printf 'broker_urls = [%s]\n' "$(sed 's|.*|"&/%2f?heartbeat=10"|' "$etc/urls" | paste -sd, -)"
}

stop_node() {
    local node=$1 pid
    pid=$(pid_of "$node")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        log "killing rabbit@$node (pid $pid)"
        kill -9 "$pid"
        while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
    fi
}

down() {
    for node in $nodes; do
        if running "$node"; then ctl "$node" stop >/dev/null 2>&1 || stop_node "$node"; fi
        # What else the node's host still runs of the broker (epmd).
        for pid in $(ip netns pids "gleaner-$node" 2>/dev/null); do
            case $(cat "/proc/$pid/comm" 2>/dev/null) in
            epmd | beam.smp | erl_child_setup | inet_gethost) kill "$pid" 2>/dev/null || true ;;
            esac
        done
        rm -rf "${data:?}/$node" "$data/$node.pid" "${etc:?}/$node"
    done
    rm -rf "$etc" "$data" "$logs"
    "$here/certs.sh" forget
    log "down"
}

known() { case " $nodes " in *" $1 "*) ;; *) log "no such broker node: $1 ($nodes)"; exit 2 ;; esac; }

case "${1:-}" in
up) up ;;
down) down ;;
stop) [ $# = 2 ] || { log "usage: $0 stop NODE"; exit 2; }; known "$2"; stop_node "$2" ;;
start) [ $# = 2 ] || { log "usage: $0 start NODE"; exit 2; }; known "$2"; start_nodes "$2"; ctl "$2" await_startup ;;
urls) cat "$etc/urls" ;;
ctl) [ $# -ge 3 ] || { log "usage: $0 ctl NODE ARGS..."; exit 2; }; known "$2"; node=$2; shift 2; ctl "$node" "$@" ;;
*) echo "usage: $0 up | down | stop NODE | start NODE | urls | ctl NODE ARGS..." >&2; exit 2 ;;
esac
