#!/usr/bin/env bash
# Builds gleaner's Debian package (cargo-deb, installed if missing): the
# binary, its man pages, the systemd units, /etc/gleaner/gleaner.toml and
# the scripts that make the service account.
#   deploy/deb/build.sh                  release build, package in target/debian/
#   deploy/deb/build.sh --binary PATH --out DIR
#                                        package an already built binary
set -euo pipefail
cd "$(dirname "$0")/../.."
log() { echo "deb: $*" >&2; }

binary=
out=target/debian
while [ $# -gt 0 ]; do
    case $1 in
    --binary) binary=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--binary PATH] [--out DIR]" >&2; exit 2 ;;
    esac
done

if ! cargo deb --version >/dev/null 2>&1; then
    log "installing cargo-deb"
    cargo install --quiet --locked --no-default-features cargo-deb
fi

# cargo-deb takes the binary from <target dir>/release: a binary built
# elsewhere is staged in a target directory of its own.
if [ -n "$binary" ]; then
    target=$(mktemp -d)
    trap 'rm -rf "$target"' EXIT
    install -D -m 0755 "$binary" "$target/release/gleaner"
    export CARGO_TARGET_DIR=$target
else
    target=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
    cargo build --quiet --release -p gleaner
fi
rm -rf "$target/release/man"
"$target/release/gleaner" manpages "$target/release/man"
mkdir -p "$out"
cargo deb --quiet -p gleaner --no-build --strip --fast --output "$out"
ls "$out"/gleaner_*.deb
