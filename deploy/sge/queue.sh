#!/usr/bin/env bash
# Adds (or resizes) and deletes cluster queues on this host's Grid Engine cell.
#   deploy/sge/queue.sh add QUEUE... SLOTS
#   deploy/sge/queue.sh delete QUEUE...
set -euo pipefail
export SGE_ROOT=${SGE_ROOT:-/var/lib/gridengine} SGE_CELL=${SGE_CELL:-default}
host=$(hostname)
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo --preserve-env=SGE_ROOT,SGE_CELL "$@"; fi; }

case "${1:-}" in
add)
    shift
    slots=${!#}
    set -- "${@:1:$(($# - 1))}"
    for queue in "$@"; do
        file=$(mktemp)
        cat > "$file" <<QUEUE
qname                 $queue
hostlist              $host
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
pe_list               make
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
            qconf -sq "$queue" | grep -Eq "^slots +$slots$" || as_root qconf -Mq "$file" >/dev/null
        else
            as_root qconf -Aq "$file" >/dev/null
        fi
        rm -f "$file"
    done
    ;;
delete)
    shift
    for queue in "$@"; do
        as_root qdel -f -q "$queue" >/dev/null 2>&1 || true
        as_root qconf -dq "$queue" >/dev/null 2>&1 || true
    done
    ;;
*)
    echo "usage: $0 add QUEUE... SLOTS | delete QUEUE..." >&2
    exit 2
    ;;
esac
