#!/usr/bin/env bash
# Makes sure a RabbitMQ broker that gleaner can use runs on this machine.
# Idempotent: a broker that already answers is reused, not reinstalled.
#   - installs rabbitmq-server from Debian's packages if it is missing
#   - starts it if it is not running
#   - enables the management plugin (the UI and the HTTP API the tests use)
#     and the Prometheus plugin (queue metrics on :15692)
#   - raises consumer_timeout: gleaner holds task and manifest deliveries
#     for as long as a task or a job runs
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
fi

for _ in $(seq 1 60); do
    if curl -fsS -u guest:guest http://127.0.0.1:15672/api/overview >/dev/null 2>&1; then
        log "ready: amqp://127.0.0.1:5672, management UI http://127.0.0.1:15672/"
        exit 0
    fi
    sleep 1
done
log "the management API does not answer on 127.0.0.1:15672"
exit 1
