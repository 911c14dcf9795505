#!/usr/bin/env bash
# Shared by setup.sh and hosts.sh (sourced, not run).

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo --preserve-env=SGE_ROOT,SGE_CELL "$@"; fi; }

# Registers HOST as an execution host of the cell, unless it is one.
add_exec_host() {
    local host=$1 file
    qconf -sel 2>/dev/null | grep -qx "$host" && return 0
    file=$(mktemp)
    cat > "$file" <<HOST
hostname              $host
load_scaling          NONE
complex_values        NONE
user_lists            NONE
xuser_lists           NONE
projects              NONE
xprojects             NONE
usage_scaling         NONE
report_variables      NONE
HOST
    as_root qconf -Ae "$file" >/dev/null
    rm -f "$file"
}
