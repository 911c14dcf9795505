#!/usr/bin/env bash
# Runs examples/sweep.toml on the embedded default (`gleaner up`, local
# backend) and shows the results. Sets up RabbitMQ first if needed.
# GLEANER_BIN names a gleaner binary to use instead of building one.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
step() { echo "demo: $* ($((SECONDS - started)) s)"; }

step "RabbitMQ: set up and started if it is not"
deploy/rabbitmq/setup.sh
if [ -n "${GLEANER_BIN:-}" ]; then
    gleaner=$GLEANER_BIN
else
    step "building gleaner (a first build takes a few minutes; cargo shows its progress)"
    cargo build --release --bin gleaner
    gleaner=target/release/gleaner
fi

log=$(mktemp -t gleaner-up.XXXXXX.log)
step "starting \`gleaner up --slots ${SLOTS:-4}\` (its log: $log)"
"$gleaner" up --slots "${SLOTS:-4}" >"$log" 2>&1 &
up=$!
trap 'kill -TERM $up 2>/dev/null; wait $up 2>/dev/null || true' EXIT

step "submitting examples/sweep.toml and following it to its end"
status=0
job=$("$gleaner" submit examples/sweep.toml --wait) || status=$?
if [ -z "$job" ]; then
    echo "demo: the job was not submitted; gleaner up's log:" >&2
    tail -n 20 "$log" >&2
    exit "$((status ? status : 1))"
fi
echo
echo "--- gleaner results $job"
"$gleaner" results "$job"
echo "--- gleaner logs $job 5   (task 5's stdout)"
"$gleaner" logs "$job" 5
echo "--- results/$job/tasks/5/sum.csv   (a declared output)"
cat "results/$job/tasks/5/sum.csv"
echo "--- results/$job/job.json"
cat "results/$job/job.json"
echo "(gleaner up's log: $log)"
step "done, exit $status; the results stay in results/$job (gleaner up stops now; start it again to ask gleaner about the job)"
exit "$status"
