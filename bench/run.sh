#!/usr/bin/env bash
# Runs the benchmarks against the release build; prints Markdown rows for
# BENCHMARKS.md. Run it on an otherwise idle machine.
#
#   bench/run.sh                 every experiment, in the order below
#   bench/run.sh NAME...         the named experiments only
#   bench/run.sh --list          the experiments' names
#
# BASELINE=path/to/gleaner of another build runs it side by side where a
# benchmark compares builds; HQ=path/to/hq adds HyperQueue's rows.
set -euo pipefail
cd "$(dirname "$0")/.."
bench=target/release/gleaner-bench
export RUST_LOG=warn
# Each experiment's rows are kept here too, for the plots.
out=target/bench

# The dev grid as the tests use it: three test hosts of 4 slots.
default_grid() {
    deploy/sge/hosts.sh 3 4 >/dev/null
    deploy/slurm/setup.sh 3 4 >/dev/null
}

# Seed 000's Delft cluster: 68 slots, as four test hosts of 17 (Grid
# Engine's test queue has 17 slots on each; Slurm's nodes 17 CPUs).
delft_grid() {
    deploy/sge/hosts.sh 4 4 >/dev/null
    deploy/slurm/setup.sh 4 17 >/dev/null
}

exp_seed000_table_4_1() {
    echo "## seed 000, Table 4.1: 1000 × 30 s tasks on 68 slots"
    echo "| batch system | how | makespan (s) | of ideal | throughput (tasks/s) | of ideal | seed 000: makespan / throughput |"
    echo "|---|---|---|---|---|---|---|"
    delft_grid
    "$bench" table-4-1 --batch sge
    "$bench" table-4-1 --batch slurm
    default_grid
}

exp_seed000_table_4_2() {
    echo "## seed 000, Table 4.2: local jobs of 40 × 60 s in six chunkings on 68 slots, 5 runs each"
    echo "| batch system | job | makespan, empty: mean (min–max) s | makespan, full of launchers: mean (min–max) s | added (s) | seed 000: empty | seed 000: full | seed 000: added |"
    echo "|---|---|---|---|---|---|---|---|"
    delft_grid
    "$bench" table-4-2 --batch sge
    "$bench" table-4-2 --batch slurm
    default_grid
}

exp_handover() {
    echo "## the batch systems alone: a waiting job's start after all 68 slots free at the same second, 5 runs each"
    echo "| batch system | job's slots | runs | handover: mean (min–max) s |"
    echo "|---|---|---|---|"
    delft_grid
    "$bench" handover --batch sge
    "$bench" handover --batch slurm
    default_grid
}

exp_seed000_table_4_3() {
    echo "## seed 000, Table 4.3: grid jobs of 80 × 60 s over three 40-slot Grid Engine clusters, 5 runs each"
    echo "| job | makespan, empty: mean (min–max) s | makespan, full of launchers: mean (min–max) s | added (s) | seed 000: empty | seed 000: full | seed 000: added |"
    echo "|---|---|---|---|---|---|---|"
    "$bench" table-4-3
}

exp_seed004_figure_4_4() {
    echo "## seed 004, Figure 4.4: from a grant to every launcher connected, 3 runs each"
    echo "| batch system | launchers | grant → all connected (s) | submission → all connected (s) | grant → first connected (s) | seed 004 (s) |"
    echo "|---|---|---|---|---|---|"
    # 500 CPUs of Slurm: four test hosts of 125.
    deploy/slurm/setup.sh 4 125 >/dev/null
    for batch in local sge slurm; do
        "$bench" figure-4-4 --batch "$batch"
    done
    default_grid
}

exp_slurm_master_load() {
    echo "## what gleaner costs slurmctld, with 10,000 held jobs of the cluster's own users in the queue, a minute each"
    echo "| jobs in the queue | gleaner | slurmctld RPCs a minute | gleaner's | slurmctld CPU s a minute | more than without gleaner |"
    echo "|---|---|---|---|---|---|"
    default_grid
    "$bench" slurm-master-load
}

exp_trace_slurm() {
    echo "## a production trace on Slurm: alone, with a sweep through gleaner, with the same sweep as a scavenger job array"
    echo "| run | trace jobs | idle core-s of the baseline | harvested core-s (of idle) | lost core-s | sweep tasks done | trace jobs' mean wait s (vs alone) | 95th percentile wait s (vs alone) | mean bounded slowdown (vs alone) | run s | slurmctld RPCs a minute (more than alone) | slurmctld CPU s |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
    default_grid
    "$bench" trace --batch slurm --out "$out"
}

exp_trace_sge() {
    echo "## a production trace on Grid Engine: alone, with a sweep through gleaner, with the same sweep as an array job in a subordinated queue"
    echo "| run | trace jobs | idle core-s of the baseline | harvested core-s (of idle) | lost core-s | sweep tasks done | trace jobs' mean wait s (vs alone) | 95th percentile wait s (vs alone) | mean bounded slowdown (vs alone) | run s | RPCs | sge_qmaster CPU s |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
    default_grid
    "$bench" trace --batch sge --out "$out"
}

exp_trace_simulated() {
    echo "## the simulator on a week of the production trace at its own size"
    echo "| run | trace jobs | idle core-s of the baseline | harvested core-s (of idle) | lost core-s | sweep tasks done | trace jobs' mean wait s (vs alone) | 95th percentile wait s (vs alone) |"
    echo "|---|---|---|---|---|---|---|---|"
    "$bench" trace-simulated
}

exp_simulator() {
    echo "## the simulator's other experiments: GPUs, checkpoints, seed 001 (KOALA), seed 003 (GRADS), seed 002 (reallocation)"
    for scenario in gpus checkpoints koala-low-load koala-high-load koala-no-priorities koala-incremental \
        grads-stop-restart grads-no-stopping seed002-dedicated seed002-non-dedicated; do
        echo '```'
        plot=()
        case $scenario in seed002-*) plot=(--plot bench/plots) ;; esac
        target/release/gleaner simulate "simulator/scenarios/$scenario.toml" "${plot[@]}"
        echo '```'
    done
}

exp_plots() {
    echo "## plots (bench/plots/): seed 000's Figure 4.2 from the simulator, the tables above as pictures"
    for scenario in das3-free das3-block das3-spike koala-free koala-block koala-spike; do
        target/release/gleaner simulate "simulator/scenarios/$scenario.toml" --plot bench/plots >/dev/null
    done
    for figure in seed004-figure-4-4:figure-4-4 seed000-table-4-2:table-4-2; do
        rows=$out/${figure%%:*}.md
        [ -s "$rows" ] && "$bench" plot "${figure#*:}" "$rows" "bench/plots/${figure%%:*}.png"
    done
    ls bench/plots
}

exp_makespan() {
    echo "## makespan"
    echo "| workload | slots | bundle | ideal (s) | makespan (s) | ratio |"
    echo "|---|---|---|---|---|---|"
    "$bench" makespan --tasks 400 --slots 8 --seconds 1
    "$bench" makespan --tasks 100000 --slots 8 --seconds 0.05 --bundle 1
    "$bench" makespan --tasks 100000 --slots 8 --seconds 0.05
    "$bench" makespan --tasks 100000 --slots 8 --seconds 0.05 --bundle 4
}

exp_makespan_million() {
    echo "## makespan of a million short tasks (about 1.75 hours)"
    echo "| workload | slots | bundle | ideal (s) | makespan (s) | ratio |"
    echo "|---|---|---|---|---|---|"
    "$bench" makespan --tasks 1000000 --slots 8 --seconds 0.05
}

exp_throughput() {
    echo "## throughput (HQ=/path/to/hq adds HyperQueue's rows)"
    echo "| launchers × slots | command | bundle | tasks | makespan (s) | tasks/s | broker CPU s/1000 | services CPU s/1000 | launchers + tasks CPU s/1000 |"
    echo "|---|---|---|---|---|---|---|---|---|"
    "$bench" throughput --tasks 20000 --launcher-slots 8
}

exp_hyperqueue() {
    echo "## beside HyperQueue (HQ=/path/to/hq; gleaner's rows alone without it), medians of 3 rounds"
    for slots in 8 4; do
        "$bench" throughput --tasks 20000 --launcher-slots "$slots" --launchers 1 --bundle 32 --rounds 3
    done
}

exp_launcher_scale() {
    echo "## launchers at scale"
    echo "| launchers | runner CPU (% of a core) | per 1,000 launchers | scheduler + kcm CPU | per 1,000 launchers | broker CPU (% of a core) | per 1,000 launchers | runner RSS (MiB) | broker memory added (MiB) | broker KiB per launcher |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
    "$bench" launcher-scale --launchers 100,500,1000
}

exp_scale() {
    echo "## sweeps at scale: no-op tasks through gleaner up, peaks sampled every second (SCALE=20000,10000000 for the full comparison; LAUNCHER_SLOTS=8 for one launcher of eight slots)"
    echo "| tasks | launchers × slots | makespan (s) | tasks/s | task queue: most ready | most message bytes (MiB) | broker memory (MiB) | broker memory added (MiB) | broker data added (MiB) | gleaner up RSS (MiB) | files and directories made | slowest gleaner status JOB (s) |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
    "$bench" scale --tasks "${SCALE:-20000,1000000}" --slots 8 --launcher-slots "${LAUNCHER_SLOTS:-1}"
}

exp_executor() {
    echo "## Executor.map of 10,000 trivial Python calls beside Dask's and Parsl's local executors on 4 slots: seconds from making the executor to every value back, median of 3 rounds in rotated order"
    echo "| contender | calls | slots | seconds | calls/s | each round (s) |"
    echo "|---|---|---|---|---|---|"
    local venv=target/bench-venv
    if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import dask.distributed, parsl, cloudpickle' 2>/dev/null; then
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check cloudpickle 'dask[distributed]' parsl
    fi
    PATH="$PWD/$venv/bin:$PATH" GLEANER_BIN="$PWD/target/release/gleaner" "$venv/bin/python" bench/python/executor.py --calls 10000 --slots 4 --rounds 3
}

exp_follow() {
    echo "## gleaner logs --follow: a running task's lines (one every 0.1 s, 30 s) from its printing to the follower"
    echo "| lines | first line after the follower started (s) | median (ms) | p95 (ms) | p99 (ms) | slowest (ms) |"
    echo "|---|---|---|---|---|---|"
    "$bench" follow
}

exp_memory() {
    echo "## memory"
    echo "| process | RSS (KiB) | private (KiB) |"
    echo "|---|---|---|"
    "$bench" memory --tasks 10000
}

exp_sge_launchers() {
    echo "## grid engine: launchers versus direct submission"
    echo "| how | workload | slots | ideal (s) | makespan (s) | ratio |"
    echo "|---|---|---|---|---|---|"
    "$bench" sge-launchers --tasks 80 --slots 8 --seconds 2
}

exp_sge_local_delay() {
    echo "## grid engine: local-job delay"
    echo "| local jobs × slots | wait, empty queue (s) | wait, queue full of gleaner (s) | added, mean (s) | added, worst (s) |"
    echo "|---|---|---|---|---|"
    "$bench" sge-local-delay --slots 8
}

exp_sge_hosts_local_delay() {
    echo "## multi-host grid engine: local-job delay, jobs on one host"
    echo "| local jobs × slots | wait, empty grid (s) | wait, grid full of gleaner (s) | added, mean (s) | added, worst (s) |"
    echo "|---|---|---|---|---|"
    "$bench" sge-hosts-local-delay --host-slots 4
}

exp_sge_resource_delay() {
    echo "## multi-host grid engine: local jobs that wait for memory or a GPU"
    echo "| local job | wait, empty grid (s) | wait, grid full of gleaner (s) | added, mean (s) | added, worst (s) |"
    echo "|---|---|---|---|---|"
    "$bench" sge-resource-delay
}

exp_sge_gpu_utilisation() {
    echo "## multi-host grid engine: GPU utilisation of a GPU sweep"
    echo "| sweep | submission to end (s) | GPU-seconds busy |"
    echo "|---|---|---|"
    "$bench" sge-gpu-utilisation --tasks 60 --seconds 10
}

exp_sge_throughput() {
    echo "## multi-host grid engine: no-op throughput through placeholders"
    echo "| launchers × slots | hosts × slots | tasks | makespan (s) | tasks/s |"
    echo "|---|---|---|---|---|"
    "$bench" sge-throughput --tasks 50000 --host-slots 4
    "$bench" sge-throughput --tasks 50000 --host-slots 8
}

exp_slurm_launchers() {
    echo "## slurm: launchers versus direct submission"
    echo "| how | workload | slots | ideal (s) | makespan (s) | ratio |"
    echo "|---|---|---|---|---|---|"
    "$bench" slurm-launchers --tasks 80 --seconds 2
}

exp_slurm_local_delay() {
    echo "## slurm: local-job delay"
    echo "| local jobs × CPUs | wait, empty partition (s) | wait, partition full of gleaner (s) | added, mean (s) | added, worst (s) |"
    echo "|---|---|---|---|---|"
    "$bench" slurm-local-delay
}

exp_sge_grid_delay() {
    echo "## grid engine: grid job delay"
    echo "| grid job | runs | wait, empty queue: mean (worst) s | wait, queue full of sweeps: mean (worst) s | added (s) |"
    echo "|---|---|---|---|---|"
    "$bench" sge-grid-delay --slots 8 --runs 3
}

exp_decide() {
    echo "## scheduler: decision time"
    echo "| policy | clusters | jobs | grid jobs | offers / shrinks / placements | best (ms) | median (ms) |"
    echo "|---|---|---|---|---|---|---|"
    "$bench" decide --clusters 1000 --jobs 10000 --grid 10
}

exp_inbox() {
    echo "## scheduler: inbox lag at grid scale"
    echo "| build | clusters | jobs | messages/s | inbox lag p50 / p99 / worst (s) | most messages waiting | scheduler CPU |"
    echo "|---|---|---|---|---|---|---|"
    "$bench" inbox --clusters 1000 --jobs 10000 --seconds 60 ${BASELINE:+--baseline "$BASELINE"}
}

exp_chaos() {
    echo "## chaos: faults at random over one sweep, and recovery from each"
    echo "| faults | tasks | makespan (s) | end | lost | duplicated | failed | most tasks at once / slots | processes left |"
    echo "|---|---|---|---|---|---|---|---|---|"
    "$bench" chaos --tasks 1500 --task-seconds 2
}

exp_fairness() {
    echo "## seed 000, Tables 4.4 and 4.5: fairness on DAS-3, the thesis's runs beside the simulator's"
    echo "| workload | who, policy | throughput of the 3 jobs (tasks/s) | launcher time-outs | preemptions | spread | local jobs added wait, mean / worst (s) | grid jobs added wait, mean / worst (s) |"
    echo "|---|---|---|---|---|---|---|---|"
    "$bench" fairness --scenarios simulator/scenarios
}

experiments=(seed000_table_4_1 seed000_table_4_2 handover seed000_table_4_3 seed004_figure_4_4
    makespan makespan_million throughput hyperqueue scale follow executor launcher_scale memory sge_launchers sge_local_delay sge_hosts_local_delay sge_resource_delay sge_gpu_utilisation sge_throughput slurm_launchers slurm_local_delay slurm_master_load trace_slurm trace_sge trace_simulated sge_grid_delay decide inbox chaos fairness simulator plots)

if [ "${1:-}" = --list ]; then
    printf '%s\n' "${experiments[@]//_/-}"
    exit 0
fi
chosen=("$@")
[ ${#chosen[@]} -gt 0 ] || chosen=("${experiments[@]//_/-}")
for name in "${chosen[@]}"; do
    declare -F "exp_${name//-/_}" >/dev/null || { echo "no experiment $name (bench/run.sh --list)" >&2; exit 2; }
done

deploy/rabbitmq/setup.sh
deploy/sge/setup.sh
deploy/sge/hosts.sh
deploy/slurm/setup.sh
deploy/rabbitmq/cluster.sh up >/dev/null
cargo build --release --quiet -p gleaner -p gleaner-bench
echo "build: $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')"
mkdir -p "$out"
for name in "${chosen[@]}"; do
    "exp_${name//-/_}" | tee "$out/$name.md"
done
