#!/usr/bin/env bash
# Sets up what the tests need (idempotently: RabbitMQ, a single-host Grid
# Engine cell, beside it the multi-host dev grid of test hosts in network
# namespaces, Slurm, a 3-node replicated RabbitMQ on those hosts, the
# Unix accounts alice and bob, tmux, cargo-deb, mdBook and a clean Debian root)
# and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
step() { echo "test.sh: $* ($((SECONDS - started)) s)"; }

step "RabbitMQ"
deploy/rabbitmq/setup.sh
step "Grid Engine, single host"
deploy/sge/setup.sh
step "the dev grid's test hosts (network namespaces) and their Grid Engine"
deploy/sge/hosts.sh
step "Slurm"
deploy/slurm/setup.sh
step "the 3-node replicated RabbitMQ on the test hosts"
deploy/rabbitmq/cluster.sh up >/dev/null
step "the Unix accounts alice and bob"
deploy/accounts.sh alice bob
# `gleaner top` is tried in a real terminal.
if ! command -v tmux >/dev/null 2>&1; then
    step "tmux"
    apt-get install -y -qq tmux >/dev/null 2>&1 ||
        { apt-get update -qq && apt-get install -y -qq tmux >/dev/null; }
fi
# The Debian package is built with cargo-deb and tried in a clean Debian 12
# root, made once.
if ! cargo deb --version >/dev/null 2>&1; then
    step "cargo-deb"
    cargo install --quiet --locked --no-default-features cargo-deb
fi
# The book under docs/ is built with mdBook (its links are checked by
# tests/docs.rs).
if ! mdbook --version >/dev/null 2>&1; then
    step "mdBook"
    cargo install --quiet --locked --no-default-features mdbook
fi
step "a clean Debian 12 root for the package's test"
deploy/deb/chroot.sh --prepare
# The Python package's tests run in a virtualenv of their own, with the
# debug build of gleaner that the Rust tests built.
python_tests() {
    local venv=target/python-venv
    if ! "$venv/bin/python" -c 'import pytest, cloudpickle, pandas' 2>/dev/null || [ ! -x "$venv/bin/maturin" ]; then
        python3 -m venv "$venv"
        "$venv/bin/pip" install --quiet --disable-pip-version-check pytest cloudpickle maturin pandas
    fi
    # The binary the Rust tests built; built alone (`-p gleaner`) it would
    # be built again, with fewer features unified.
    local bin="${CARGO_TARGET_DIR:-$PWD/target}/debug/gleaner"
    [ -x "$bin" ] || cargo build --quiet -p gleaner
    GLEANER_BIN="$bin" PYTHONPATH="$PWD/python/src" \
        "$venv/bin/python" -m pytest -q -p no:cacheprovider python/tests
}
step "the book (mdbook build docs)"
status=0
if ! built=$(mdbook build docs --dest-dir "${CARGO_TARGET_DIR:-$PWD/target}/book" 2>&1); then
    echo "$built" >&2
    status=1
fi
step "building and running every test (cargo shows its progress)"
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --no-fail-fast "$@" || status=$?
else
    cargo test --workspace --no-fail-fast "$@" || status=$?
fi
step "the Python package's tests (pytest, against the same broker)"
python_tests || status=$?
step "finished, exit $status"
exit "$status"
