#!/usr/bin/env bash
# Runs every benchmark against the release build; prints Markdown rows for
# BENCHMARKS.md. Run it on an otherwise idle machine. BASELINE=path/to/gleaner
# of another build runs it side by side where a benchmark compares builds.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/rabbitmq/setup.sh
deploy/sge/setup.sh
deploy/sge/hosts.sh
deploy/slurm/setup.sh
deploy/rabbitmq/cluster.sh up >/dev/null
cargo build --release --quiet -p gleaner -p gleaner-bench
bench=target/release/gleaner-bench
export RUST_LOG=warn

echo "## makespan"
echo "| workload | slots | bundle | ideal (s) | makespan (s) | ratio |"
echo "|---|---|---|---|---|---|"
"$bench" makespan --tasks 400 --slots 8 --seconds 1
"$bench" makespan --tasks 100000 --slots 8 --seconds 0.05
"$bench" makespan --tasks 100000 --slots 8 --seconds 0.05 --bundle 4

echo "## throughput (HQ=/path/to/hq adds HyperQueue's rows)"
echo "| launchers × slots | command | bundle | tasks | makespan (s) | tasks/s | broker CPU s/1000 | services CPU s/1000 | launchers + tasks CPU s/1000 |"
echo "|---|---|---|---|---|---|---|---|---|"
"$bench" throughput --tasks 20000 --launcher-slots 8

echo "## beside HyperQueue (HQ=/path/to/hq; gleaner's rows alone without it), medians of 3 rounds"
for slots in 8 4; do
    "$bench" throughput --tasks 20000 --launcher-slots "$slots" --launchers 1 --bundle 32 --rounds 3
done

echo "## launchers at scale"
echo "| launchers | runner CPU (% of a core) | per 1,000 launchers | scheduler + kcm CPU | per 1,000 launchers | broker CPU (% of a core) | per 1,000 launchers | runner RSS (MiB) | broker memory added (MiB) | broker KiB per launcher |"
echo "|---|---|---|---|---|---|---|---|---|---|"
"$bench" launcher-scale --launchers 100,500,1000

echo "## memory"
echo "| process | RSS (KiB) | private (KiB) |"
echo "|---|---|---|"
"$bench" memory --tasks 10000

echo "## grid engine: launchers versus direct submission"
echo "| how | workload | slots | ideal (s) | makespan (s) | ratio |"
echo "|---|---|---|---|---|---|"
"$bench" sge-launchers --tasks 80 --slots 8 --seconds 2

echo "## grid engine: local-job delay"
echo "| local jobs × slots | wait, empty queue (s) | wait, queue full of gleaner (s) | added, mean (s) | added, worst (s) |"
echo "|---|---|---|---|---|"
"$bench" sge-local-delay --slots 8

echo "## multi-host grid engine: local-job delay, jobs on one host"
echo "| local jobs × slots | wait, empty grid (s) | wait, grid full of gleaner (s) | added, mean (s) | added, worst (s) |"
echo "|---|---|---|---|---|"
"$bench" sge-hosts-local-delay --host-slots 4

echo "## multi-host grid engine: no-op throughput through placeholders"
echo "| launchers × slots | hosts × slots | tasks | makespan (s) | tasks/s |"
echo "|---|---|---|---|---|"
"$bench" sge-throughput --tasks 50000 --host-slots 4
"$bench" sge-throughput --tasks 50000 --host-slots 8

echo "## slurm: launchers versus direct submission"
echo "| how | workload | slots | ideal (s) | makespan (s) | ratio |"
echo "|---|---|---|---|---|---|"
"$bench" slurm-launchers --tasks 80 --seconds 2

echo "## slurm: local-job delay"
echo "| local jobs × CPUs | wait, empty partition (s) | wait, partition full of gleaner (s) | added, mean (s) | added, worst (s) |"
echo "|---|---|---|---|---|"
"$bench" slurm-local-delay

echo "## grid engine: grid job delay"
echo "| grid job | runs | wait, empty queue: mean (worst) s | wait, queue full of sweeps: mean (worst) s | added (s) |"
echo "|---|---|---|---|---|"
"$bench" sge-grid-delay --slots 8 --runs 3

echo "## scheduler: decision time"
echo "| policy | clusters | jobs | grid jobs | offers / shrinks / placements | best (ms) | median (ms) |"
echo "|---|---|---|---|---|---|---|"
"$bench" decide --clusters 1000 --jobs 10000 --grid 10

echo "## scheduler: inbox lag at grid scale"
echo "| build | clusters | jobs | messages/s | inbox lag p50 / p99 / worst (s) | most messages waiting | scheduler CPU |"
echo "|---|---|---|---|---|---|---|"
"$bench" inbox --clusters 1000 --jobs 10000 --seconds 60 ${BASELINE:+--baseline "$BASELINE"}

echo "## chaos: faults at random over one sweep, and recovery from each"
echo "| faults | tasks | makespan (s) | end | lost | duplicated | failed | most tasks at once / slots | processes left |"
echo "|---|---|---|---|---|---|---|---|---|"
"$bench" chaos --tasks 1500 --task-seconds 2

echo "## simulator: DAS-3 fairness (seed 000, section 4.4)"
echo "| workload | policy | throughput of the 3 jobs (tasks/s) | preemptions | spread | local jobs added wait, mean / worst (s) | grid jobs added wait, mean / worst (s) |"
echo "|---|---|---|---|---|---|---|"
"$bench" fairness --scenarios simulator/scenarios
