#!/usr/bin/env bash
# A real Slurm (Debian 12's packages, 22.05) on this machine, no systemd:
# munged and slurmctld here, one slurmd per test host of the multi-host dev
# grid (deploy/grid/hosts.sh: node1 … nodeN, each in its network namespace
# under its own host name), and one slurmd for this machine itself (the
# single-host variant, for quick runs). Idempotent: what runs is reused; a
# changed configuration restarts the daemons (PreemptType needs that).
#
#   deploy/slurm/setup.sh [N] [S]   N test hosts (default 3) of S CPUs (default 4)
#   deploy/slurm/setup.sh down      stops the daemons (the packages stay)
#
# Partitions: `gleaner` (the test hosts; where placeholders go), `local`
# (the same hosts; the cluster's own jobs) and `solo` (this machine only);
# and a site that preempts scavengers itself: `scavenger` (placeholders)
# under `batch` (its own jobs, a higher PriorityTier), the same hosts again.
# Nothing here depends on accounting (`sacct` is unusable without slurmdbd).
# Memory is a consumable (4000M per test host, or 500M per CPU on hosts of more than 8; 500M per CPU unless a job
# asks) and each test host has two stand-in GPUs (`--gres=gpu:N`): character
# devices like /dev/null under /var/lib/gleaner/gpus, which Slurm hands out
# as CUDA_VISIBLE_DEVICES the way it hands out real ones.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
grid=$here/../grid/hosts.sh
log() { printf 'slurm-setup: %s\n' "$*" >&2; }
[ "$(id -u)" = 0 ] || { log "run as root (packages, daemons)"; exit 1; }

conf=/etc/slurm/slurm.conf
master=$(hostname)

# Pids of a daemon (by command name) running in a test host's namespace, or
# outside every test host's namespace when HOST is empty.
daemon_in() {
    local comm=$1 host=${2:-} pid
    if [ -n "$host" ]; then
        for pid in $(ip netns pids "gleaner-$host" 2>/dev/null); do
            [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ] && echo "$pid"
        done
    else
        for pid in $(pgrep -x "$comm" || true); do
            [ -z "$(ip netns identify "$pid" 2>/dev/null)" ] && echo "$pid"
        done
    fi
    return 0
}

stop_all() {
    local pid
    for pid in $(pgrep -x slurmd || true) $(pgrep -x slurmctld || true); do
        kill "$pid" 2>/dev/null || true
    done
    for _ in $(seq 1 20); do
        pgrep -x slurmd >/dev/null || pgrep -x slurmctld >/dev/null || break
        sleep 0.5
    done
}

if [ "${1:-}" = down ]; then
    stop_all
    log "stopped"
    exit 0
fi
nodes=${1:-3}
cpus=${2:-4}
# A job's memory defaults to 500M a CPU (DefMemPerCPU): every CPU of a
# host must be usable by one-CPU jobs, so a host of more than 8 CPUs has
# 500M for each.
memory=$(( cpus * 500 > 4000 ? cpus * 500 : 4000 ))

# 1. Packages.
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
    || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
    log "installing slurmctld, slurmd, slurm-client and munge from Debian's packages"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
fi

# 2. munge: one key for every daemon and client (they share this machine's
#    file system, so the test hosts use the same socket).
if [ ! -s /etc/munge/munge.key ]; then
    log "making a munge key"
    mungekey --create --force >/dev/null 2>&1 || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
fi
if ! munge -n >/dev/null 2>&1; then
    log "starting munged"
    install -d -o munge -g munge -m 0755 /run/munge
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 1 20); do munge -n >/dev/null 2>&1 && break; sleep 0.25; done
    munge -n >/dev/null 2>&1 || { log "munged does not answer"; exit 1; }
fi

# 3. The test hosts, then the configuration naming them.
"$grid" up "$nodes"
install -d /etc/slurm /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /var/log/slurm /run/slurm
node_lines=""
for k in $(seq 1 "$nodes"); do
    node_lines+="NodeName=node$k NodeAddr=10.77.0.$((10 + k)) CPUs=$cpus RealMemory=$memory Gres=gpu:2 State=UNKNOWN"$'\n'
done
node_list="node[1-$nodes]"
[ "$nodes" = 1 ] && node_list=node1
gpus=/var/lib/gleaner/gpus
install -d "$gpus"
for k in 0 1; do
    [ -c "$gpus/gpu$k" ] || mknod -m 0666 "$gpus/gpu$k" c 1 3
done
gres=$(mktemp)
echo "NodeName=$node_list Name=gpu File=$gpus/gpu[0-1]" > "$gres"
tmp=$(mktemp)
cat > "$tmp" <<CONF
# Written by deploy/slurm/setup.sh: the dev grid's Slurm.
ClusterName=gleaner
SlurmctldHost=$master
SlurmUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd/%n
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
# No cgroups without systemd: processes are tracked by their parents.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
# Test hosts advertise the CPUs of this file, not the machine's.
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerType=sched/backfill
# The benchmarks replay production traces 20 times faster than they ran:
# a backfill pass every 2 s with a 10 s grid is a site's default (30 s,
# 60 s) at that pace.
SchedulerParameters=bf_interval=2,bf_resolution=10
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
DefMemPerCPU=500
GresTypes=gpu
MinJobAge=60
# Room for a busy site's queue (the benchmarks hold 10,000 jobs in it)
# and for a sweep as one job array.
MaxJobCount=50000
MaxArraySize=100001
KillWait=5
InactiveLimit=0
# Jobs of a higher PriorityTier preempt those of partitions that allow it
# (only scavenger), signalling their batch shell first.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
$node_lines
NodeName=$master NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=gleaner Nodes=$node_list Default=YES MaxTime=INFINITE PreemptMode=OFF State=UP
PartitionName=local Nodes=$node_list MaxTime=INFINITE PreemptMode=OFF State=UP
PartitionName=scavenger Nodes=$node_list MaxTime=INFINITE PriorityTier=1 PreemptMode=REQUEUE GraceTime=5 State=UP
PartitionName=batch Nodes=$node_list MaxTime=INFINITE PriorityTier=10 PreemptMode=OFF State=UP
PartitionName=solo Nodes=$master MaxTime=INFINITE PreemptMode=OFF State=UP
CONF
changed=false
if ! cmp -s "$tmp" "$conf"; then
    install -m 0644 "$tmp" "$conf"
    changed=true
fi
if ! cmp -s "$gres" /etc/slurm/gres.conf; then
    install -m 0644 "$gres" /etc/slurm/gres.conf
    changed=true
fi
rm -f "$tmp" "$gres"

# 4. slurmctld here, slurmd for this machine and for each test host.
if $changed && [ -n "$(daemon_in slurmctld)" ]; then
    log "configuration changed: restarting the daemons"
    stop_all
fi
if [ -z "$(daemon_in slurmctld)" ]; then
    log "starting slurmctld"
    setsid slurmctld -D -i </dev/null >/dev/null 2>&1 &
    for _ in $(seq 1 40); do scontrol ping >/dev/null 2>&1 && break; sleep 0.25; done
fi
scontrol ping >/dev/null 2>&1 || { log "slurmctld does not answer; see /var/log/slurm/slurmctld.log"; exit 1; }
if [ -z "$(daemon_in slurmd)" ]; then
    log "starting slurmd for $master"
    setsid slurmd -D -N "$master" </dev/null >/dev/null 2>&1 &
fi
# `ip netns exec` gives a test host a sysfs of its own, without the cgroup
# file systems slurmd needs: the host's are mounted again there, as they
# are here (cgroup v1 hierarchies by their options, or one cgroup2).
cgroups=$(awk '
    $3 == "cgroup2" && $2 == "/sys/fs/cgroup" { print "mount -t cgroup2 none /sys/fs/cgroup"; next }
    $2 == "/sys/fs/cgroup" { print "mount -t tmpfs cgroup_root /sys/fs/cgroup"; next }
    $3 == "cgroup2" { printf "mkdir -p %s && mount -t cgroup2 none %s\n", $2, $2; next }
    $3 == "cgroup" {
        n = split($4, o, ","); opts = ""
        for (i = 1; i <= n; i++) if (o[i] != "rw" && o[i] != "relatime") opts = opts (opts ? "," : "") o[i]
        printf "mkdir -p %s && mount -t cgroup -o %s cgroup %s\n", $2, opts, $2
    }' /proc/mounts | awk '/cgroup_root|none \/sys\/fs\/cgroup$/ { print; next } { rest = rest $0 "\n" } END { printf "%s", rest }')
for k in $(seq 1 "$nodes"); do
    if [ -z "$(daemon_in slurmd "node$k")" ]; then
        log "starting slurmd on node$k"
        install -d "/var/lib/slurm/slurmd/node$k"
        setsid "$grid" exec "node$k" sh -c "$cgroups
exec slurmd -D -N node$k" </dev/null >/dev/null 2>&1 &
    fi
done

# 5. Every node up and idle (a node left down by an earlier run is resumed).
for _ in $(seq 1 60); do
    states=$(sinfo -h -N -o '%N %T' | sort -u)
    if ! grep -qvE ' (idle|mixed|allocated)$' <<<"$states"; then
        log "ready: partitions gleaner, local, scavenger and batch on $node_list ($cpus CPUs each), solo on $master"
        exit 0
    fi
    for node in $(awk '$2 ~ /down|drain/ { print $1 }' <<<"$states"); do
        scontrol update NodeName="$node" State=RESUME >/dev/null 2>&1 || true
    done
    sleep 0.5
done
log "nodes not ready:"
sinfo -N >&2
exit 1
