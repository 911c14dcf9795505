#!/usr/bin/env bash
# Installs (from Debian's gridengine-* packages) and configures a single-host
# Grid Engine cell for development and tests: K cluster queues c1.q … cK.q of
# S slots each, scheduling every second, submission by root allowed, daemons
# started without systemd. Idempotent: run it again to repair or resize.
#
#   deploy/sge/setup.sh [K] [S]      (defaults: 3 queues of 8 slots)
set -euo pipefail

queues=${1:-${SGE_QUEUES:-3}}
slots=${2:-${SGE_SLOTS:-8}}
export SGE_ROOT=/var/lib/gridengine SGE_CELL=default
host=$(hostname)
log() { printf 'sge-setup: %s\n' "$*" >&2; }
# shellcheck source=deploy/sge/common.sh
. "$(dirname "$0")/common.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# 1. Packages. The master's name and cell are preseeded so that the package
#    scripts create the cell themselves.
if ! command -v qconf >/dev/null 2>&1 || [ ! -x /usr/sbin/sge_qmaster ] || [ ! -x /usr/sbin/sge_execd ]; then
    log "installing gridengine-master, gridengine-exec, gridengine-client"
    as_root debconf-set-selections <<SEL
gridengine-common shared/gridenginemaster string $host
gridengine-common shared/gridenginecell string default
gridengine-common shared/gridengineconfig boolean true
gridengine-client shared/gridenginemaster string $host
SEL
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        gridengine-master gridengine-exec gridengine-client >/dev/null
fi

# 2. The master must resolve this host's name consistently. Where the name
#    maps to a loopback address (containers, VMs), SGE would otherwise see
#    "localhost" on one side and the host name on the other.
aliases=$SGE_ROOT/$SGE_CELL/common/host_aliases
if getent hosts "$host" | grep -q '^127\.' && ! grep -qs "^$host " "$aliases"; then
    echo "$host localhost" | as_root tee "$aliases" >/dev/null
fi
echo "$host" | as_root tee "$SGE_ROOT/$SGE_CELL/common/act_qmaster" >/dev/null

# 3. The master.
as_root install -d -o sgeadmin -g sgeadmin /var/run/gridengine
if ! pgrep -x sge_qmaster >/dev/null; then
    log "starting sge_qmaster"
    as_root env SGE_ROOT=$SGE_ROOT SGE_CELL=$SGE_CELL \
        SGE_MASTER_PIDFILE=/var/run/gridengine/qmaster.pid /usr/sbin/sge_qmaster
fi
for _ in $(seq 1 60); do qconf -sh >/dev/null 2>&1 && break; sleep 1; done
qconf -sh >/dev/null 2>&1 || { log "sge_qmaster does not answer"; exit 1; }
qconf -sh | grep -qx "$host" || as_root qconf -ah "$host" >/dev/null
qconf -ss 2>/dev/null | grep -qx "$host" || as_root qconf -as "$host" >/dev/null

# 4. Global configuration: root may submit (min_uid/min_gid 0).
restart_execd=false
qconf -sconf global > "$work/global"
if ! grep -Eq '^min_uid +0$' "$work/global" || ! grep -Eq '^min_gid +0$' "$work/global"; then
    log "allowing submission by root"
    sed -i -E 's/^(min_uid|min_gid) +[0-9]+/\1 0/' "$work/global"
    as_root qconf -Mconf "$work/global" >/dev/null
    restart_execd=true
fi
# Each running job takes a group id of gid_range for its processes: the
# default 101 would cap a host at 101 jobs (placeholders included), and
# the seeds' benchmarks run 500 on one host.
if ! grep -Eq '^gid_range +65400-66400$' "$work/global"; then
    log "a thousand group ids for running jobs"
    sed -i -E 's/^gid_range +.*/gid_range                    65400-66400/' "$work/global"
    as_root qconf -Mconf "$work/global" >/dev/null
fi

# 5. Scheduler: every second, right after submissions and job ends, and no
#    load adjustments (a benchmark loading the host must not close queues).
cat > "$work/sched" <<SCHED
$(qconf -ssconf | sed -E \
    -e 's/^schedule_interval .*/schedule_interval                 0:0:1/' \
    -e 's/^flush_submit_sec .*/flush_submit_sec                  1/' \
    -e 's/^flush_finish_sec .*/flush_finish_sec                  1/' \
    -e 's/^job_load_adjustments .*/job_load_adjustments              NONE/' \
    -e 's/^load_adjustment_decay_time .*/load_adjustment_decay_time        0:0:0/')
SCHED
if ! diff -q <(qconf -ssconf) "$work/sched" >/dev/null; then
    log "configuring the scheduler (1 s interval)"
    as_root qconf -Msconf "$work/sched" >/dev/null
fi

# 6. This host executes jobs.
add_exec_host "$host"
# This host's sge_execd is the one in this network namespace: those of the
# test hosts of deploy/sge/hosts.sh run in namespaces of their own.
own_execd() {
    local pid here
    here=$(readlink /proc/self/ns/net)
    for pid in $(pgrep -x sge_execd); do
        [ "$(as_root readlink "/proc/$pid/ns/net" 2>/dev/null)" = "$here" ] && echo "$pid"
    done
    return 0
}
if $restart_execd && [ -n "$(own_execd)" ]; then
    log "restarting sge_execd after the configuration change"
    as_root kill $(own_execd) || true
    for _ in $(seq 1 20); do [ -n "$(own_execd)" ] || break; sleep 0.5; done
fi
if [ -z "$(own_execd)" ]; then
    log "starting sge_execd"
    as_root install -d -o sgeadmin -g sgeadmin /var/spool/gridengine/execd
    as_root env SGE_ROOT=$SGE_ROOT SGE_CELL=$SGE_CELL /usr/sbin/sge_execd
fi

# 7. The cluster queues (queue.sh also makes the parallel environments
#    `make` and `smp` they offer).
"$(dirname "$0")/queue.sh" add $(seq -f 'c%g.q' 1 "$queues") "$slots"

# 8. Ready when the exec host reports and the queues take jobs.
for _ in $(seq 1 60); do
    if qstat -f -q c1.q 2>/dev/null | grep -q "c1.q@" && ! qstat -f -q c1.q | grep -Eq 'c1\.q@\S+\s+\S+\s+\S+\s+\S+\s+\S+\s+\S*[auE]'; then
        log "ready: $queues queues of $slots slots on $host"
        exit 0
    fi
    as_root qmod -cq '*' >/dev/null 2>&1 || true
    sleep 1
done
log "the queues did not become available:"
qstat -f >&2 || true
exit 1
