#!/usr/bin/env bash
# Adds (or resizes, or moves) and deletes cluster queues on this host's Grid
# Engine cell. A queue spans this host unless --hosts names others (host
# names or host groups, e.g. @nodes of deploy/sge/hosts.sh, comma-separated).
# Every queue offers the parallel environments `make` (slots spread round
# robin over hosts) and `smp` (all slots on one host), made here if missing.
#   deploy/sge/queue.sh add [--hosts HOST[,HOST…]] QUEUE... SLOTS
#   deploy/sge/queue.sh delete QUEUE...
set -euo pipefail
export SGE_ROOT=${SGE_ROOT:-/var/lib/gridengine} SGE_CELL=${SGE_CELL:-default}
host=$(hostname)
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo --preserve-env=SGE_ROOT,SGE_CELL "$@"; fi; }

# Jobs running in QUEUE or asking for it (waiting ones too).
jobs_of() {
    local id
    for id in $(qstat -u '*' 2>/dev/null | awk 'NR > 2 { print $1 }' | sort -u); do
        if qstat -j "$id" 2>/dev/null | grep -q "^hard_queue_list: *\(.*,\)\?$1\(@[^,]*\)\?\(,.*\)\?$" \
            || qstat -u '*' -s r 2>/dev/null | awk -v id="$id" -v q="$1" '$1 == id && index($8, q "@") == 1 { found = 1 } END { exit !found }'; then
            echo "$id"
        fi
    done
}

# The parallel environments every queue names: PE NAME, allocation rule,
# whether the job script counts as one of the slots' tasks.
ensure_pes() {
    local existing name rule first file
    existing=$(qconf -spl 2>/dev/null || true)
    while read -r name rule first; do
        grep -qx "$name" <<<"$existing" && continue
        file=$(mktemp)
        cat > "$file" <<PE
pe_name            $name
slots              999
user_lists         NONE
xuser_lists        NONE
start_proc_args    NONE
stop_proc_args     NONE
allocation_rule    $rule
control_slaves     TRUE
job_is_first_task  $first
urgency_slots      min
accounting_summary TRUE
qsort_args         NONE
PE
        as_root qconf -Ap "$file" >/dev/null
        rm -f "$file"
    done <<'PES'
make $round_robin FALSE
smp $pe_slots TRUE
PES
}

# The settings of a queue file that this script decides, one line each,
# lists space-separated: what tells whether an existing queue needs -Mq.
decided() { grep -E '^(hostlist|pe_list|slots) ' | tr ',' ' ' | tr -s ' '; }

# The test hosts of deploy/grid/hosts.sh share this machine's /tmp, so a job
# spanning several would have one tmpdir (TMPDIR/JOB.TASK.QUEUE) that each
# host removes when its part ends: on each of them, a queue takes the host's
# own scratch directory, /var/tmp/gleaner-grid/HOST, as tmpdir.
grid_tmpdirs() {
    local queue=$1 h dir
    for h in $(for h in ${2//,/ }; do
                   case $h in @*) qconf -shgrp_resolved "$h" 2>/dev/null || true ;; *) echo "$h" ;; esac
               done); do
        dir=/var/tmp/gleaner-grid/$h
        [ -d "$dir" ] || continue
        if [ "$(qconf -sq "$queue@$h" | awk '$1 == "tmpdir" { print $2 }')" != "$dir" ]; then
            as_root qconf -mattr queue tmpdir "$dir" "$queue@$h" >/dev/null
        fi
    done
}

case "${1:-}" in
add)
    shift
    hosts=$host
    if [ "${1:-}" = --hosts ]; then
        hosts=${2:?--hosts needs a host list}
        shift 2
    fi
    [ $# -ge 2 ] || { echo "usage: $0 add [--hosts HOST[,HOST…]] QUEUE... SLOTS" >&2; exit 2; }
    slots=${!#}
    set -- "${@:1:$(($# - 1))}"
    ensure_pes
    for queue in "$@"; do
        file=$(mktemp)
        cat > "$file" <<QUEUE
qname                 $queue
hostlist              $hosts
seq_no                0
load_thresholds       NONE
suspend_thresholds    NONE
nsuspend              1
suspend_interval      00:05:00
priority              0
min_cpu_interval      00:05:00
processors            UNDEFINED
qtype                 BATCH INTERACTIVE
ckpt_list             NONE
pe_list               make smp
rerun                 FALSE
slots                 $slots
tmpdir                /tmp
shell                 /bin/sh
prolog                NONE
epilog                NONE
shell_start_mode      posix_compliant
starter_method        NONE
suspend_method        NONE
resume_method         NONE
terminate_method      NONE
notify                00:00:05
owner_list            NONE
user_lists            NONE
xuser_lists           NONE
subordinate_list      NONE
complex_values        NONE
projects              NONE
xprojects             NONE
calendar              NONE
initial_state         default
s_rt                  INFINITY
h_rt                  INFINITY
s_cpu                 INFINITY
h_cpu                 INFINITY
s_fsize               INFINITY
h_fsize               INFINITY
s_data                INFINITY
h_data                INFINITY
s_stack               INFINITY
h_stack               INFINITY
s_core                INFINITY
h_core                INFINITY
s_rss                 INFINITY
h_rss                 INFINITY
s_vmem                INFINITY
h_vmem                INFINITY
QUEUE
        if qconf -sq "$queue" >/dev/null 2>&1; then
            if [ "$(qconf -sq "$queue" | decided)" != "$(decided < "$file")" ]; then
                as_root qconf -Mq "$file" >/dev/null
            fi
        else
            as_root qconf -Aq "$file" >/dev/null
        fi
        rm -f "$file"
        grid_tmpdirs "$queue" "$hosts"
    done
    ;;
delete)
    shift
    for queue in "$@"; do
        # A queue with jobs cannot be deleted: they go first, which takes
        # the execds a moment.
        qconf -sq "$queue" >/dev/null 2>&1 || continue
        jobs=$(jobs_of "$queue")
        [ -z "$jobs" ] || as_root qdel -f $jobs >/dev/null 2>&1 || true
        for _ in $(seq 1 40); do
            as_root qconf -dq "$queue" >/dev/null 2>&1 && break
            sleep 0.5
        done
        if qconf -sq "$queue" >/dev/null 2>&1; then
            echo "queue.sh: cannot delete $queue" >&2
        fi
    done
    ;;
*)
    echo "usage: $0 add [--hosts HOST[,HOST…]] QUEUE... SLOTS | delete QUEUE..." >&2
    exit 2
    ;;
esac
