#!/usr/bin/env bash
# Broker accounts for a gleaner of many users, with exactly the permissions
# each needs (idempotent: an existing account gets a new password and the
# permissions again).
#
#   user.sh add NAME [--admin] [--vhost V] [--password-file F] [--url-host H] [--tls]
#       A user: may publish to the gleaner.user exchange (submissions and
#       requests), make and read their own watch queues
#       (gleaner.watch.NAME.*), and follow their own jobs' events
#       (job.NAME.* on gleaner.events; every job's with --admin, who must
#       also be listed in [users] admins). Nothing else: not the default
#       exchange, not any job's queues.
#   user.sh service NAME [--vhost V] [--password-file F] [--url-host H] [--tls]
#       The account gleaner's services run as: everything on the vhost, and
#       the administrator tag the runner needs to make (and delete) each
#       job's launcher account through the management API.
#   user.sh remove NAME
#
# The password is generated. It goes to --password-file (mode 0600), or, for
# `add` when NAME is also a Unix account, into that account's
# ~/.config/gleaner/gleaner.toml (mode 0600, theirs) as its broker_url:
# amqp://H:5672, or amqps://H:5671 with --tls (H must then be a name the
# broker's certificate carries). It never goes on a command line, where
# `ps` shows it to every local user: rabbitmqctl reads it from its stdin.
#
# Limits: each `add` account may hold at most GLEANER_USER_MAX_CONNECTIONS
# connections (default 64: each gleaner command a user runs holds one) and
# GLEANER_USER_MAX_CHANNELS channels (default 256) at once, on every vhost
# together, so that no user can exhaust the broker's descriptors or memory
# for everyone (a negative value lifts the limit; `service` accounts have
# none). RabbitMQ has no per-user limit on queues: the number of queues (and
# connections) is limited per vhost, with
# `rabbitmqctl set_vhost_limits -p V '{"max-queues": N}'`, for all its users.
set -euo pipefail

log() { printf 'broker-user: %s\n' "$*" >&2; }
die() { log "$*"; exit 2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
ctl() { as_root rabbitmqctl -q "$@" >/dev/null; }

[ $# -ge 2 ] || die "usage: $0 add|service|remove NAME [--admin] [--vhost V] [--password-file F] [--url-host H] [--tls]"
action=$1 name=$2
shift 2
admin=false vhost=/ password_file= url_host=127.0.0.1 scheme=amqp port=5672
while [ $# -gt 0 ]; do
    case $1 in
        --admin) admin=true ;;
        --vhost) vhost=$2; shift ;;
        --password-file) password_file=$2; shift ;;
        --url-host) url_host=$2; shift ;;
        --tls) scheme=amqps port=5671 ;;
        *) die "unknown option $1" ;;
    esac
    shift
done
# The same words gleaner accepts as owners: a name is part of regexes and
# routing keys, so nothing that means something there.
[[ $name =~ ^[A-Za-z0-9_@-]{1,64}$ ]] || die "$name: names are letters, digits, '_', '-' and '@'"
max_connections=${GLEANER_USER_MAX_CONNECTIONS:-64}
max_channels=${GLEANER_USER_MAX_CHANNELS:-256}
for limit in "$max_connections" "$max_channels"; do
    [[ $limit =~ ^-?[0-9]{1,9}$ ]] || die "$limit: a limit is a whole number (negative: none)"
done

if [ "$action" = remove ]; then
    ctl delete_user "$name" 2>/dev/null || true
    log "removed $name"
    exit 0
fi

password=$(head -c 18 /dev/urandom | base64 | tr '+/' 'xy')
if as_root rabbitmqctl -q list_users | awk '{print $1}' | grep -qx -- "$name"; then
    set_password=change_password
else
    set_password=add_user
fi
# Without a password argument rabbitmqctl reads it from stdin (-q: no
# prompt); printf is the shell's own, no process of its own either.
printf '%s\n' "$password" | ctl "$set_password" "$name" ||
    die "cannot set the password of $name"

case $action in
    service)
        ctl set_user_tags "$name" administrator
        ctl set_permissions -p "$vhost" "$name" '.*' '.*' '.*'
        # The services hold a connection per component and launcher account.
        ctl clear_user_limits "$name" all
        ;;
    add)
        ctl set_user_tags "$name"
        own="gleaner\\.watch\\.${name}\\..*"
        ctl set_permissions -p "$vhost" "$name" \
            "^($own|amq\\.gen-.*)\$" \
            "^(gleaner\\.user|$own|amq\\.gen-.*)\$" \
            "^(gleaner\\.events|$own|amq\\.gen-.*)\$"
        if $admin; then jobs='job\..*|cluster\..*'; else jobs='job\.{username}\..*'; fi
        # Topic permissions: publishing no events, binding to their own
        # jobs' (cluster events name every job: admins only).
        ctl set_topic_permissions -p "$vhost" "$name" gleaner.events '^$' "^($jobs)\$"
        ctl set_user_limits "$name" \
            "{\"max-connections\": $max_connections, \"max-channels\": $max_channels}"
        ;;
    *) die "unknown action $action (add, service or remove)" ;;
esac

encoded_vhost=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$vhost")
url="$scheme://$name:$password@$url_host:$port/$encoded_vhost?heartbeat=10"
if [ -n "$password_file" ]; then
    (umask 077; printf '%s\n' "$password" >"$password_file")
    log "$action $name on vhost $vhost; password in $password_file"
elif [ "$action" = add ] && home=$(getent passwd "$name" | cut -d: -f6) && [ -n "$home" ]; then
    # Written by the user, not by root: whatever they made of their home
    # (a link to /etc, say) leads nowhere they could not write anyway.
    printf 'broker_url = "%s"\n' "$url" | as_root runuser -u "$name" -- sh -c \
        'umask 077; mkdir -p "$1" && cat >"$1/gleaner.toml.new" && mv "$1/gleaner.toml.new" "$1/gleaner.toml"' \
        sh "$home/.config/gleaner"
    log "added $name on vhost $vhost; their broker_url is in $home/.config/gleaner/gleaner.toml"
else
    log "$action $name on vhost $vhost; password: $password"
fi
