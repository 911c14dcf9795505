#!/usr/bin/env bash
# Runs examples/sweep.toml on the embedded default (`gleaner up`, local
# backend) and shows the results. Sets up RabbitMQ first if needed.
set -euo pipefail
cd "$(dirname "$0")/.."

deploy/rabbitmq/setup.sh
cargo build --release --quiet --bin gleaner
gleaner=target/release/gleaner

log=$(mktemp -t gleaner-up.XXXXXX.log)
"$gleaner" up --slots "${SLOTS:-4}" >"$log" 2>&1 &
up=$!
trap 'kill -TERM $up 2>/dev/null; wait $up 2>/dev/null || true' EXIT

status=0
job=$("$gleaner" submit examples/sweep.toml --wait) || status=$?
echo
echo "job $job: results in results/$job/"
echo "--- results/$job/index.jsonl (first lines)"
head -n 4 "results/$job/index.jsonl"
echo "--- results/$job/tasks/5/stdout"
cat "results/$job/tasks/5/stdout"
echo "--- results/$job/tasks/5/sum.csv"
cat "results/$job/tasks/5/sum.csv"
echo "--- results/$job/job.json"
cat "results/$job/job.json"
echo "(gleaner up's log: $log)"
exit "$status"
