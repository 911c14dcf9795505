#!/usr/bin/env bash
# Certificates for a broker's TLS listeners: a certificate authority of the
# deployment's own, trusted by this machine's system store (which gleaner,
# curl and openssl all read), and a server certificate per broker node that
# it signs. Idempotent: what exists and is valid for another 30 days is kept.
#
#   certs.sh server DIR NAME SAN   (DIR/ca.crt, DIR/NAME.crt, DIR/NAME.key;
#                                    SAN like DNS:node1,IP:10.77.0.11)
#   certs.sh forget                (the system store no longer trusts the CA)
#
# The node's key is readable by the rabbitmq user only; the CA's key by root
# only. A client elsewhere trusts the broker once it has DIR/ca.crt in its
# own store (or in SSL_CERT_FILE).
set -euo pipefail

log() { printf 'broker-certs: %s\n' "$*" >&2; }
[ "$(id -u)" = 0 ] || { log "run as root (the system's trust store)"; exit 1; }
trusted=/usr/local/share/ca-certificates/gleaner-broker-ca.crt
month=2592000

valid() { [ -s "$1" ] && openssl x509 -in "$1" -noout -checkend "$month" >/dev/null 2>&1; }

# The deployment's CA, and the system store trusting it.
authority() {
    local dir=$1
    install -d -m 0755 "$dir"
    if ! valid "$dir/ca.crt" || [ ! -s "$dir/ca.key" ]; then
        log "making the broker's certificate authority in $dir"
        (umask 077; openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$dir/ca.key" 2>/dev/null)
        openssl req -x509 -new -key "$dir/ca.key" -sha256 -days 3650 \
            -subj "/CN=gleaner broker CA $(hostname)" \
            -addext basicConstraints=critical,CA:TRUE \
            -addext keyUsage=critical,keyCertSign,cRLSign \
            -out "$dir/ca.crt" 2>/dev/null
        chmod 0644 "$dir/ca.crt"
    fi
    if ! cmp -s "$dir/ca.crt" "$trusted"; then
        install -m 0644 "$dir/ca.crt" "$trusted"
        update-ca-certificates >/dev/null 2>&1
        log "the system trusts $trusted"
    fi
}

server() {
    local dir=$1 name=$2 san=$3
    authority "$dir"
    local crt=$dir/$name.crt key=$dir/$name.key
    # A certificate of an older CA, or for other names, is made again.
    if valid "$crt" && [ -s "$key" ] &&
        openssl verify -CAfile "$dir/ca.crt" "$crt" >/dev/null 2>&1 &&
        [ "$(openssl x509 -in "$crt" -noout -ext subjectAltName 2>/dev/null | tail -n +2 | tr -d ' ')" = \
            "$(echo "$san" | sed 's/IP:/IPAddress:/g')" ]; then
        return 0
    fi
    log "making the certificate of $name ($san)"
    local request
    request=$(mktemp)
    (umask 077; openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$key.new" 2>/dev/null)
    openssl req -new -key "$key.new" -subj "/CN=$name" -out "$request" 2>/dev/null
    openssl x509 -req -in "$request" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
        -days 825 -sha256 -out "$crt.new" \
        -extfile <(printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature\n' "$san") \
        2>/dev/null
    rm -f "$request"
    chown rabbitmq:rabbitmq "$key.new"
    chmod 0400 "$key.new"
    chmod 0644 "$crt.new"
    mv "$key.new" "$key"
    mv "$crt.new" "$crt"
}

forget() {
    if [ -e "$trusted" ]; then
        rm -f "$trusted"
        update-ca-certificates --fresh >/dev/null 2>&1
        log "the system no longer trusts the broker's CA"
    fi
}

case "${1:-}" in
server) [ $# = 4 ] || { log "usage: $0 server DIR NAME SAN"; exit 2; }; server "$2" "$3" "$4" ;;
forget) forget ;;
*) echo "usage: $0 server DIR NAME SAN | forget" >&2; exit 2 ;;
esac
