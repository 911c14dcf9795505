#!/usr/bin/env bash
# A clean Debian 12 root in DIR, as a fresh machine has it (minbase), for
# trying the package: made once with mmdebstrap into a tarball under
# /var/cache/gleaner, then unpacked from it.
#   deploy/deb/chroot.sh --prepare   make the tarball (and install mmdebstrap)
#   deploy/deb/chroot.sh DIR         unpack a clean root into DIR
set -euo pipefail
cache=/var/cache/gleaner/bookworm-minbase.tar
log() { echo "chroot: $*" >&2; }

prepare() {
    [ -f "$cache" ] && return
    if ! command -v mmdebstrap >/dev/null 2>&1; then
        log "installing mmdebstrap"
        apt-get install -y -qq mmdebstrap >/dev/null 2>&1 ||
            { apt-get update -qq && apt-get install -y -qq mmdebstrap >/dev/null; }
    fi
    log "making a clean Debian 12 root (minbase) into $cache"
    install -d "$(dirname "$cache")"
    mmdebstrap --quiet --variant=minbase --format=tar bookworm "$cache.new" http://deb.debian.org/debian
    mv "$cache.new" "$cache"
}

case ${1:-} in
--prepare) prepare ;;
"" | -*) echo "usage: $0 --prepare | DIR" >&2; exit 2 ;;
*)
    prepare
    install -d "$1"
    tar -C "$1" -xf "$cache"
    ;;
esac
