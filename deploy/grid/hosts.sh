#!/usr/bin/env bash
# Test hosts node1 … nodeN on this one machine, for a multi-host dev grid:
# each is a network namespace gleaner-nodeK with its own address on a bridge,
# and commands run in it with their own UTS host name. Only loopback and the
# bridge's 10.77.0.0/24 carry their traffic (there is no default route).
# Idempotent, no systemd: run `up` again to repair or resize.
#
#   deploy/grid/hosts.sh up [N]          (default 3 hosts)
#   deploy/grid/hosts.sh down            (removes everything `up` made)
#   deploy/grid/hosts.sh exec HOST CMD…  (runs CMD on HOST, e.g. node1)
#   deploy/grid/hosts.sh list
#   deploy/grid/hosts.sh cut HOST        (drops HOST's broker traffic, AMQP ports,
#                                          both ways: a network fault)
#   deploy/grid/hosts.sh mend HOST       (lets it through again)
#   deploy/grid/hosts.sh island NAME     (a host for a test of its own to cut:
#                                          loopback, the broker forwarders and
#                                          an address on the bridge)
#   deploy/grid/hosts.sh remove HOST     (removes a host or an island)
#
# Addresses: the bridge gleaner0 has 10.77.0.1 (this machine, known to the
# nodes by its own host name), nodeK has 10.77.0.(10+K). RabbitMQ listens on
# this machine's 127.0.0.1 only (and guest logs in only from loopback), so
# socat forwarders make 127.0.0.1:5672 (and :15672) inside each node reach
# the broker through unix sockets in /run/gleaner-grid. The nodes share this
# machine's file system, /tmp included; /var/tmp/gleaner-grid/nodeK is a
# scratch directory of each node's own (deploy/sge/queue.sh makes it the
# node's job tmpdir).
set -euo pipefail

bridge=gleaner0
prefix=10.77.0
run=/run/gleaner-grid
begin='# gleaner dev grid begin'
end='# gleaner dev grid end'
# Forwarded broker ports: name of the unix socket in $run, port.
forwards="amqp:5672 mgmt:15672"
master=$(hostname)
log() { printf 'grid-hosts: %s\n' "$*" >&2; }
[ "$(id -u)" = 0 ] || { log "run as root (network namespaces, /etc/hosts)"; exit 1; }

ns_of() { echo "gleaner-$1"; }
addr_of() { echo "$prefix.$((10 + ${1#node}))"; }
# The nodes that exist now, as node1 node2 …, in order.
nodes() {
    local f
    for f in /run/netns/gleaner-node*; do
        if [ -e "$f" ]; then echo "${f##*/gleaner-}"; fi
    done | sort -V
}

# Rewrites the marked block of a hosts file in place (a bind-mounted
# /etc/hosts cannot be replaced by a rename). Empty content removes it.
set_block() {
    local file=$1 content=$2 tmp
    tmp=$(mktemp)
    [ -e "$file" ] && sed "/^$begin\$/,/^$end\$/d" "$file" > "$tmp"
    [ -n "$content" ] && printf '%s\n%s\n%s\n' "$begin" "$content" "$end" >> "$tmp"
    if ! cmp -s "$tmp" "$file"; then cat "$tmp" > "$file"; fi
    rm -f "$tmp"
}

# Is the process of this pid file alive and socat?
alive() { [ -s "$1" ] && [ "$(cat "/proc/$(cat "$1")/comm" 2>/dev/null)" = socat ]; }
# Starts a detached socat (optionally in a netns) that records its own pid.
start_socat() {
    local pidfile=$1 ns=$2; shift 2
    local cmd=(setsid sh -c 'echo $$ > "$0"; exec socat "$@"' "$pidfile" "$@")
    [ -n "$ns" ] && cmd=(ip netns exec "$ns" "${cmd[@]}")
    "${cmd[@]}" </dev/null >>"$run/socat.log" 2>&1 &
    for _ in $(seq 1 20); do alive "$pidfile" && return 0; sleep 0.1; done
    log "socat $* did not start (see $run/socat.log)"; return 1
}

# Kills every process in a namespace, politely first.
kill_ns() {
    local ns=$1 pids
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] || return 0
    kill $pids 2>/dev/null || true
    for _ in $(seq 1 20); do
        [ -n "$(ip netns pids "$ns" 2>/dev/null)" ] || return 0
        sleep 0.25
    done
    kill -9 $(ip netns pids "$ns" 2>/dev/null) 2>/dev/null || true
}

# The broker's ports on 127.0.0.1 inside a host, through this machine's
# unix-socket listeners.
forward_into() {
    local host=$1 fwd name port
    for fwd in $forwards; do
        name=${fwd%%:*} port=${fwd##*:}
        alive "$run/$host.$name.pid" || start_socat "$run/$host.$name.pid" "$(ns_of "$host")" \
            "TCP-LISTEN:$port,bind=127.0.0.1,reuseaddr,fork" "UNIX-CONNECT:$run/$name.sock"
    done
}

# A network fault: the host's AMQP traffic (to and from ports 5671 and 5672, over
# loopback to the forwarder or over the bridge) is dropped, not refused, so
# both ends learn of it only by their heartbeats.
cut() {
    ip netns exec "$(ns_of "$1")" nft -f - <<'EOF'
table inet gleaner_cut {
    chain out {
        type filter hook output priority 0; policy accept;
        tcp dport { 5671, 5672 } drop
        tcp sport { 5671, 5672 } drop
    }
}
EOF
}
mend() { ip netns exec "$(ns_of "$1")" nft delete table inet gleaner_cut 2>/dev/null || true; }

# A host of a test's own: loopback and the broker forwarders, and a place on
# the bridge (to reach the replicated broker on the test hosts) at the first
# free address of 10.77.0.100-199; the veth's name (gl-iK) is the lock that
# keeps two islands made at once off the same address.
island() {
    local host=$1 ns k
    ns=$(ns_of "$host")
    alive "$run/amqp.pid" || { log "no broker forwarder: run \`$0 up\` first"; exit 1; }
    [ -e "/run/netns/$ns" ] || ip netns add "$ns"
    ip -n "$ns" link set lo up
    forward_into "$host"
    if ! ip -n "$ns" link show eth0 >/dev/null 2>&1; then
        for k in $(seq 100 199); do
            if ip link add "gl-i$k" type veth peer name eth0 netns "$ns" 2>/dev/null; then
                ip link set "gl-i$k" master "$bridge" up
                ip -n "$ns" addr add "$prefix.$k/24" dev eth0
                ip -n "$ns" link set eth0 up
                return 0
            fi
        done
        log "no free island address in $prefix.100-199"; exit 1
    fi
}

remove_node() {
    local node=$1 ns
    ns=$(ns_of "$node")
    log "removing $node"
    kill_ns "$ns"
    rm -f "$run/$node".*.pid
    # Deleting the namespace deletes its veth end, and with it the bridge end.
    ip netns del "$ns" 2>/dev/null || true
    ip link del "gl-$node" 2>/dev/null || true
    rm -rf "/etc/netns/$ns" "/var/tmp/gleaner-grid/$node"
}

up() {
    local count=${1:-3} k node ns addr hosts name port
    [[ $count =~ ^[1-9][0-9]*$ ]] && [ "$count" -le 200 ] || { log "bad host count: $count"; exit 2; }
    for tool in socat:socat nft:nftables; do
        command -v "${tool%%:*}" >/dev/null || {
            log "installing ${tool##*:}"
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${tool##*:}" >/dev/null
        }
    done
    install -d "$run"

    # Nodes beyond the count go (a smaller `up` shrinks the grid).
    for node in $(nodes); do
        [ "${node#node}" -le "$count" ] || remove_node "$node"
    done

    # The bridge, this machine's address on it.
    ip link show "$bridge" >/dev/null 2>&1 || ip link add "$bridge" type bridge
    ip -4 addr show dev "$bridge" | grep -q " $prefix.1/24 " || ip addr add "$prefix.1/24" dev "$bridge"
    ip link set "$bridge" up

    # Names: the master (qmaster) resolves the nodes forwards and backwards
    # through the root /etc/hosts; each node gets its own hosts file (which
    # `ip netns exec` bind-mounts over /etc/hosts) where this machine's name
    # is its bridge address, not the loopback one of the root /etc/hosts.
    hosts=$(for k in $(seq 1 "$count"); do echo "$(addr_of node$k) node$k"; done)
    set_block /etc/hosts "$hosts"

    for k in $(seq 1 "$count"); do
        node=node$k ns=$(ns_of node$k) addr=$(addr_of node$k)
        [ -e "/run/netns/$ns" ] || ip netns add "$ns"
        if ! ip -n "$ns" link show eth0 >/dev/null 2>&1; then
            ip link del "gl-$node" 2>/dev/null || true
            ip link add "gl-$node" type veth peer name eth0 netns "$ns"
        fi
        ip link set "gl-$node" master "$bridge"
        ip link set "gl-$node" up
        ip -n "$ns" link set lo up
        ip -n "$ns" -4 addr show dev eth0 | grep -q " $addr/24 " || ip -n "$ns" addr add "$addr/24" dev eth0
        ip -n "$ns" link set eth0 up
        install -d -m 1777 "/var/tmp/gleaner-grid/$node"
        install -d "/etc/netns/$ns"
        printf '127.0.0.1 localhost\n%s.1 %s\n%s\n' "$prefix" "$master" "$hosts" > "$run/hosts.tmp"
        cmp -s "$run/hosts.tmp" "/etc/netns/$ns/hosts" || cp "$run/hosts.tmp" "/etc/netns/$ns/hosts"
        rm -f "$run/hosts.tmp"
    done

    # The broker forwarders: one listener on a unix socket here (reaching the
    # broker on loopback, so guest may log in), one on 127.0.0.1 per node.
    for fwd in $forwards; do
        name=${fwd%%:*} port=${fwd##*:}
        alive "$run/$name.pid" || start_socat "$run/$name.pid" "" \
            "UNIX-LISTEN:$run/$name.sock,fork,unlink-early" "TCP:127.0.0.1:$port"
    done
    for k in $(seq 1 "$count"); do forward_into "node$k"; done

    # Check: the broker's port answers in each node.
    for k in $(seq 1 "$count"); do
        if ! ip netns exec "$(ns_of node$k)" timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/5672' 2>/dev/null; then
            log "node$k: 127.0.0.1:5672 does not connect (is RabbitMQ running here?)"
        fi
    done
    log "up: $count hosts (node1 … node$count at $(addr_of node1) …), bridge $bridge $prefix.1"
}

down() {
    local node fwd f
    for node in $(nodes); do remove_node "$node"; done
    # Islands that a test left behind.
    for f in /run/netns/gleaner-*; do
        if [ -e "$f" ]; then remove_node "${f##*/gleaner-}"; fi
    done
    # Veths whose namespace went some other way.
    for node in $(ip -o link show 2>/dev/null | sed -nE 's/^[0-9]+: (gl-(node|i)[0-9]+)[@:].*/\1/p'); do
        ip link del "$node" 2>/dev/null || true
    done
    for fwd in $forwards; do
        if alive "$run/${fwd%%:*}.pid"; then kill "$(cat "$run/${fwd%%:*}.pid")" 2>/dev/null || true; fi
    done
    ip link del "$bridge" 2>/dev/null || true
    set_block /etc/hosts ""
    rm -rf "$run" /etc/netns/gleaner-node* /var/tmp/gleaner-grid
    log "down"
}

case "${1:-}" in
up) shift; up "$@" ;;
down) down ;;
exec)
    [ $# -ge 3 ] || { log "usage: $0 exec HOST CMD..."; exit 2; }
    node=$2; shift 2
    [ -e "/run/netns/$(ns_of "$node")" ] || { log "no such host: $node (deploy/grid/hosts.sh up)"; exit 1; }
    # A UTS namespace of its own, so that `hostname` (and daemons started
    # here, for as long as they live) see the node's name.
    exec ip netns exec "$(ns_of "$node")" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$node" "$@"
    ;;
cut | mend | island | remove)
    [ $# = 2 ] && [[ $2 =~ ^[A-Za-z0-9_-]+$ ]] || { log "usage: $0 $1 HOST"; exit 2; }
    if [ "$1" != island ] && [ ! -e "/run/netns/$(ns_of "$2")" ]; then log "no such host: $2"; exit 1; fi
    case $1 in
    cut) cut "$2" ;;
    mend) mend "$2" ;;
    island) island "$2" ;;
    remove) remove_node "$2" ;;
    esac
    ;;
list)
    for node in $(nodes); do
        ns=$(ns_of "$node")
        procs=$(for p in $(ip netns pids "$ns" 2>/dev/null); do cat "/proc/$p/comm" 2>/dev/null; done | sort | uniq -c | awk '{printf "%s%s(%s)", sep, $2, $1; sep=" "}')
        printf '%s\t%s\t%s\t%s\n' "$node" "$(addr_of "$node")" "$ns" "${procs:-no processes}"
    done
    ;;
*)
    echo "usage: $0 up [N] | down | exec HOST CMD... | list | cut HOST | mend HOST | island NAME | remove HOST" >&2
    exit 2
    ;;
esac
