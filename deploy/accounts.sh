#!/usr/bin/env bash
# Unix accounts for trying a gleaner of many users (idempotent): each NAME
# gets an account with a home directory, if it has none. The test hosts of
# deploy/grid/hosts.sh share this machine's /etc/passwd, so the accounts
# exist on all of them.
#   accounts.sh alice bob
set -euo pipefail
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
for name in "$@"; do
    if ! getent passwd "$name" >/dev/null; then
        as_root useradd --create-home --shell /bin/sh "$name"
        printf 'accounts: added %s\n' "$name" >&2
    fi
done
