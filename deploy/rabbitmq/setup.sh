#!/usr/bin/env bash
# Makes sure a RabbitMQ broker that gleaner can use runs on this machine.
# Idempotent: a broker that already answers is reused, not reinstalled.
#   - installs rabbitmq-server from Debian's packages if it is missing
#   - starts it if it is not running
#   - enables the management plugin (the UI and the HTTP API the tests use)
#     and the Prometheus plugin (queue metrics on :15692)
#   - raises consumer_timeout: gleaner holds task and manifest deliveries
#     for as long as a task or a job runs
#   - keeps it on loopback: the tests log in as guest/guest, which RabbitMQ
#     lets in from loopback only; a broker it starts listens on 127.0.0.1
#     only (AMQP, the management API, Prometheus), and one it reuses that
#     listens elsewhere is reported. A broker reachable from elsewhere needs
#     accounts of its own (user.sh) and no guest (see cluster.sh).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
log() { printf 'rabbitmq-setup: %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

answers() { timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/5672' 2>/dev/null; }

if ! command -v rabbitmq-server >/dev/null 2>&1 && ! answers; then
    log "installing rabbitmq-server from Debian's packages"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null
fi

if ! answers; then
    log "starting RabbitMQ"
    as_root install -d -m 0755 /etc/rabbitmq/conf.d
    as_root cp "$here/50-gleaner.conf" /etc/rabbitmq/conf.d/50-gleaner.conf
    {
        echo "# The development broker: guest/guest, from loopback only, and"
        echo "# nothing offered beyond loopback (deploy/rabbitmq/setup.sh)."
        echo "loopback_users.guest = true"
        # Unless this machine's configuration names its AMQP listeners.
        grep -qs '^[[:space:]]*listeners\.tcp' /etc/rabbitmq/rabbitmq.conf ||
            echo "listeners.tcp.default = 127.0.0.1:5672"
        echo "management.tcp.ip = 127.0.0.1"
        echo "prometheus.tcp.ip = 127.0.0.1"
    } | as_root tee /etc/rabbitmq/conf.d/40-gleaner-loopback.conf >/dev/null
    if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
        as_root systemctl start rabbitmq-server
    else
        # Each client connection is a descriptor: 65536 (or the most it
        # may), as systemd's unit gives it, rather than a shell's 1024.
        # Debian's wrapper switches to the rabbitmq user through su, whose
        # PAM session resets that limit: switch first, then raise it.
        raise='ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"'
        if id rabbitmq >/dev/null 2>&1 && [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
            as_root runuser -u rabbitmq -- sh -c "$raise; cd /var/lib/rabbitmq && HOME=/var/lib/rabbitmq exec /usr/lib/rabbitmq/bin/rabbitmq-server -detached"
        else
            as_root sh -c "$raise; exec rabbitmq-server -detached"
        fi
    fi
    for _ in $(seq 1 120); do answers && break; sleep 1; done
    answers || { log "RabbitMQ did not start; see /var/log/rabbitmq/"; exit 1; }
else
    log "reusing the RabbitMQ that answers on 127.0.0.1:5672"
fi

if command -v rabbitmqctl >/dev/null 2>&1; then
    as_root rabbitmqctl -q await_startup >/dev/null 2>&1 || true
    if ! as_root rabbitmq-plugins -q is_enabled rabbitmq_management >/dev/null 2>&1; then
        log "enabling the management plugin"
        as_root rabbitmq-plugins -q enable rabbitmq_management >/dev/null
    fi
    # Queue depths and rates for Prometheus, beside gleaner's own metrics.
    if ! as_root rabbitmq-plugins -q is_enabled rabbitmq_prometheus >/dev/null 2>&1; then
        log "enabling the Prometheus plugin (metrics on :15692)"
        as_root rabbitmq-plugins -q enable rabbitmq_prometheus >/dev/null
    fi
    # At runtime too, for a broker that was already running with the default (30 min).
    as_root rabbitmqctl -q eval 'application:set_env(rabbit, consumer_timeout, 604800000).' >/dev/null
    # Likewise the largest message (channels opened from now on).
    as_root rabbitmqctl -q eval 'application:set_env(rabbit, max_message_size, 16777216).' >/dev/null
    # The quorum queues' write-ahead log is sized when the RabbitMQ
    # application starts, from its configuration files: a broker found
    # running with RabbitMQ's default (512 MiB, held in memory) gets
    # gleaner's bound and its application restarted (the node stays up)
    # while no client is connected; with clients it is not called ready.
    wal() { as_root rabbitmqctl -q eval 'maps:get(wal_max_size_bytes, ra_system:fetch(quorum_queues)).' 2>/dev/null || true; }
    if [ "$(wal)" != 33554432 ]; then
        as_root install -d -m 0755 /etc/rabbitmq/conf.d
        as_root cp "$here/50-gleaner.conf" /etc/rabbitmq/conf.d/50-gleaner.conf
        clients=$(as_root rabbitmqctl -q list_connections pid 2>/dev/null | grep -c . || true)
        if [ "$clients" = 0 ]; then
            log "bounding the quorum-queue log at 32 MiB (it was $(wal) bytes): restarting the RabbitMQ application"
            as_root rabbitmqctl -q stop_app >/dev/null
            as_root rabbitmqctl -q start_app >/dev/null
            as_root rabbitmqctl -q await_startup >/dev/null 2>&1 || true
        fi
        if [ "$(wal)" != 33554432 ]; then
            log "not ready: this broker keeps up to $(wal) bytes of quorum-queue log in memory, and gleaner's sweeps would fill it;" \
                "/etc/rabbitmq/conf.d/50-gleaner.conf bounds it at 32 MiB once the application restarts" \
                "(rabbitmqctl stop_app && rabbitmqctl start_app, which drops its $clients client connections)"
            exit 1
        fi
    fi
    # The broker's own sockets, as the kernel has them ("127.0.0.1:15672"):
    # rabbitmq-diagnostics names the HTTP listeners [::] whatever they
    # are bound to.
    exposed=$(as_root ss -Hltnp 2>/dev/null |
        awk '/"beam.smp"/ { print $4 }' |
        awk '$1 !~ /^(127\.0\.0\.1|\[::1\]):/ { printf " %s", $1 }' || true)
    if [ -n "$exposed" ]; then
        log "warning: RabbitMQ listens beyond loopback (${exposed# }), where guest is refused;" \
            "to keep it on loopback, set listeners.tcp.default = 127.0.0.1:5672," \
            "management.tcp.ip = 127.0.0.1 and prometheus.tcp.ip = 127.0.0.1 and restart it"
    fi
fi

# The password on curl's stdin (-K -), not its command line.
for _ in $(seq 1 60); do
    if printf 'user = "guest:guest"\n' |
        curl -fsS -K - http://127.0.0.1:15672/api/overview >/dev/null 2>&1; then
        log "ready: amqp://127.0.0.1:5672, management UI http://127.0.0.1:15672/"
        exit 0
    fi
    sleep 1
done
log "the management API does not answer on 127.0.0.1:15672"
exit 1
