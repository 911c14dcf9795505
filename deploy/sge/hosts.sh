#!/usr/bin/env bash
# Turns the single-host Grid Engine cell of setup.sh into a multi-host dev
# grid on this one machine: N test hosts node1 … nodeN (network namespaces of
# deploy/grid/hosts.sh) each run an sge_execd of their own, in the host group
# @nodes, served by the queue g1.q of S slots per host. Parallel jobs ask for
# `-pe smp K` (K slots on one host) or `-pe make K` (spread round robin).
# Beside it, scavenger.q on the same hosts and slots is subordinated to
# g1.q (suspended where g1.q is full): a Grid Engine user's way of
# scavenging idle slots.
# Each test host has 4000M of memory (`mem_free`, consumable per slot) and two
# stand-in GPUs (`gpu`, consumable per job), as a real cell counts them.
# The cell's own queues c1.q … on this host are left as they are.
# Idempotent, no systemd: run it again to repair or resize.
#
#   deploy/sge/hosts.sh [N] [S]    (defaults: 3 hosts of 4 slots)
#   deploy/sge/hosts.sh down       (removes the hosts, their queue and group)
set -euo pipefail

export SGE_ROOT=/var/lib/gridengine SGE_CELL=default
dir=$(cd "$(dirname "$0")" && pwd)
grid=$dir/../grid/hosts.sh
queue=g1.q
scavenger=scavenger.q
group=@nodes
log() { printf 'sge-hosts: %s\n' "$*" >&2; }
# shellcheck source=deploy/sge/common.sh
. "$dir/common.sh"
[ "$(id -u)" = 0 ] || { log "run as root (network namespaces, daemons)"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

master_up() { qconf -sh >/dev/null 2>&1; }
# The test hosts the cell knows, as node1 node2 ….
known_nodes() { qconf -sel 2>/dev/null | grep -Ex 'node[0-9]+' | sort -V || true; }
# The pid of the sge_execd running in a test host's namespace, if any.
node_execd() {
    local pid
    for pid in $(ip netns pids "gleaner-$1" 2>/dev/null); do
        [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = sge_execd ] && echo "$pid"
    done
    return 0
}

# Takes test hosts out of the cell: their jobs, their execds, their entries.
# The host group and the queues that name it must already be rid of them.
forget_nodes() {
    local node jobs
    for node in "$@"; do
        jobs=$(qstat -u '*' -q "*@$node" 2>/dev/null | awk 'NR > 2 { print $1 }' | sort -u || true)
        [ -z "$jobs" ] || qdel -f $jobs >/dev/null 2>&1 || true
        if [ -n "$(node_execd "$node")" ]; then
            qconf -ke "$node" >/dev/null 2>&1 || true
            for _ in $(seq 1 20); do [ -n "$(node_execd "$node")" ] || break; sleep 0.5; done
        fi
        qconf -de "$node" >/dev/null 2>&1 || true
        qconf -dh "$node" >/dev/null 2>&1 || true
        # A stale pid file would be a later execd's to puzzle over.
        rm -f "/var/spool/gridengine/execd/$node/execd.pid"
    done
}

down() {
    if master_up; then
        local q jobs
        jobs=$(qstat -u '*' -q "$queue" 2>/dev/null | awk 'NR > 2 { print $1 }' | sort -u || true)
        [ -z "$jobs" ] || qdel -f $jobs >/dev/null 2>&1 || true
        qconf -mattr queue subordinate_list NONE "$queue" >/dev/null 2>&1 || true
        "$dir/queue.sh" delete "$scavenger" "$queue"
        # Other queues (tests' own) spanning the group let go of it.
        for q in $(qconf -sql 2>/dev/null); do
            if qconf -sq "$q" | grep -Eq "^hostlist .*$group( |,|$)"; then
                qconf -dattr queue hostlist "$group" "$q" >/dev/null 2>&1 || true
            fi
        done
        qconf -dhgrp "$group" >/dev/null 2>&1 || true
        forget_nodes $(known_nodes)
    fi
    "$grid" down
    log "down"
}

up() {
    local count=${1:-3} slots=${2:-4} k node members
    [[ $count =~ ^[1-9][0-9]*$ ]] || { log "bad host count: $count"; exit 2; }
    [[ $slots =~ ^[1-9][0-9]*$ ]] || { log "bad slot count: $slots"; exit 2; }

    # 1. The single-host cell (its qmaster serves the test hosts too).
    master_up || "$dir/setup.sh"

    # 2. The hosts: namespaces, addresses, names, broker forwarders.
    "$grid" up "$count"
    members=$(seq -f 'node%g' 1 "$count")

    # 3. Each host is an admin host (an execd must be one to register) and
    #    an exec host, and runs its sge_execd in its namespace under its own
    #    host name; the execd spools in /var/spool/gridengine/execd/nodeK.
    for node in $members; do
        qconf -sh | grep -qx "$node" || qconf -ah "$node" >/dev/null
        add_exec_host "$node"
        if [ -z "$(node_execd "$node")" ]; then
            log "starting sge_execd on $node"
            "$grid" exec "$node" env SGE_ROOT=$SGE_ROOT SGE_CELL=$SGE_CELL /usr/sbin/sge_execd
        fi
    done

    # 3b. Memory and GPUs, counted per host as consumables.
    resources "$members"

    # 4. The host group, exactly these hosts (a smaller N drops the rest).
    printf 'group_name %s\nhostlist %s\n' "$group" "$(echo $members)" > "$work/hgrp"
    if ! qconf -shgrp "$group" >/dev/null 2>&1; then
        qconf -Ahgrp "$work/hgrp" >/dev/null
    elif [ "$(qconf -shgrp "$group" | tr -s ' ' | tr -d '\\\n')" != "$(tr -s ' ' < "$work/hgrp" | tr -d '\\\n')" ]; then
        qconf -Mhgrp "$work/hgrp" >/dev/null
    fi
    forget_nodes $(known_nodes | grep -vxF "$members" || true)

    # 5. The queue over the group (queue.sh also makes the `smp` and `make`
    #    parallel environments every queue offers).
    "$dir/queue.sh" add --hosts "$group" "$queue" "$slots"

    # 5b. The queue a Grid Engine user scavenges in: the same hosts and
    #     slots, subordinated to the normal queue (on a host where the
    #     normal queue's slots are all taken, its jobs are suspended until
    #     some leave). Slot-wise subordination (`slots=N(...)`) would
    #     suspend one task for a parallel job of any width.
    "$dir/queue.sh" add --hosts "$group" "$scavenger" "$slots"
    local subordinate="$scavenger=$slots"
    if [ "$(qconf -sq "$queue" | awk '$1 == "subordinate_list" { print $2 }')" != "$subordinate" ]; then
        qconf -mattr queue subordinate_list "$subordinate" "$queue" >/dev/null
    fi

    # 6. Ready when every host's queue instance takes jobs (not a, u or E).
    for _ in $(seq 1 60); do
        local ready=0
        for node in $members; do
            qstat -f -q "$queue@$node" 2>/dev/null | grep -E "^$queue@$node " \
                | grep -Evq "^\S+\s+\S+\s+\S+\s+\S+\s+\S+\s+\S*[auE]" && ready=$((ready + 1))
        done
        if [ "$ready" = "$count" ]; then
            log "ready: $queue on $count hosts ($(echo $members)) of $slots slots"
            return 0
        fi
        qmod -cq "$queue" >/dev/null 2>&1 || true
        sleep 1
    done
    log "the queue instances did not become available:"
    qstat -f -q "$queue" >&2 || true
    exit 1
}

# Makes mem_free a consumable (per slot) and adds gpu (an integer consumable
# per job), then gives each test host its memory and GPUs; what is already
# so stays.
resources() {
    local members=$1 node
    qconf -sc > "$work/complexes"
    awk '$1 == "mem_free" { $6 = "YES" } { print }' "$work/complexes" > "$work/wanted"
    grep -q '^gpu ' "$work/wanted" || echo 'gpu gpu INT <= YES JOB 0 0' >> "$work/wanted"
    if ! diff -q <(tr -s ' ' < "$work/complexes") <(tr -s ' ' < "$work/wanted") >/dev/null; then
        as_root qconf -Mc "$work/wanted" >/dev/null
    fi
    for node in $members; do
        if ! qconf -se "$node" | grep -Eq '^complex_values +gpu=2,mem_free=4000M$'; then
            as_root qconf -mattr exechost complex_values gpu=2,mem_free=4000M "$node" >/dev/null
        fi
    done
}

case "${1:-}" in
down) down ;;
-h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
*) up "$@" ;;
esac
