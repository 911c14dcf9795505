#!/usr/bin/env bash
# Runs examples/sweep.toml on the embedded default (`gleaner up`, local
# backend) and shows the results. Sets up RabbitMQ first if needed.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
step() { echo "demo: $* ($((SECONDS - started)) s)"; }

step "RabbitMQ: set up and started if it is not"
deploy/rabbitmq/setup.sh
step "building gleaner (a first build takes a few minutes; cargo shows its progress)"
cargo build --release --bin gleaner
gleaner=target/release/gleaner

log=$(mktemp -t gleaner-up.XXXXXX.log)
step "starting \`gleaner up --slots ${SLOTS:-4}\` (its log: $log)"
"$gleaner" up --slots "${SLOTS:-4}" >"$log" 2>&1 &
up=$!
trap 'kill -TERM $up 2>/dev/null; wait $up 2>/dev/null || true' EXIT

step "submitting examples/sweep.toml and following it to its end"
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
step "done, exit $status; the results stay in results/$job (gleaner up stops now; start it again to ask gleaner about the job)"
exit "$status"
