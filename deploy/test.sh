#!/usr/bin/env bash
# Sets up what the tests need (idempotently: RabbitMQ, a single-host Grid
# Engine cell, beside it the multi-host dev grid of test hosts in network
# namespaces, Slurm, a 3-node replicated RabbitMQ on those hosts, and the
# Unix accounts alice and bob, and tmux) and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

deploy/rabbitmq/setup.sh
deploy/sge/setup.sh
deploy/sge/hosts.sh
deploy/slurm/setup.sh
deploy/rabbitmq/cluster.sh up >/dev/null
deploy/accounts.sh alice bob
# `gleaner top` is tried in a real terminal.
if ! command -v tmux >/dev/null 2>&1; then
    apt-get install -y -qq tmux >/dev/null 2>&1 ||
        { apt-get update -qq && apt-get install -y -qq tmux >/dev/null; }
fi
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --no-fail-fast "$@"
else
    cargo test --workspace --no-fail-fast "$@"
fi
