#!/usr/bin/env bash
# Broker accounts for a gleaner of many users, with exactly the permissions
# each needs (idempotent: an existing account gets a new password and the
# permissions again).
#
#   user.sh add NAME [--admin] [--vhost V] [--password-file F] [--url-host H]
#       A user: may publish to the gleaner.user exchange (submissions and
#       requests), make and read their own watch queues
#       (gleaner.watch.NAME.*), and follow their own jobs' events
#       (job.NAME.* on gleaner.events; every job's with --admin, who must
#       also be listed in [users] admins). Nothing else: not the default
#       exchange, not any job's queues.
#   user.sh service NAME [--vhost V] [--password-file F] [--url-host H]
#       The account gleaner's services run as: everything on the vhost, and
#       the administrator tag the runner needs to make (and delete) each
#       job's launcher account through the management API.
#   user.sh remove NAME
#
# The password is generated. It goes to --password-file (mode 0600), or, for
# `add` when NAME is also a Unix account, into that account's
# ~/.config/gleaner/gleaner.toml (mode 0600, theirs) as its broker_url.
set -euo pipefail

log() { printf 'broker-user: %s\n' "$*" >&2; }
die() { log "$*"; exit 2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
ctl() { as_root rabbitmqctl -q "$@" >/dev/null; }

[ $# -ge 2 ] || die "usage: $0 add|service|remove NAME [--admin] [--vhost V] [--password-file F] [--url-host H]"
action=$1 name=$2
shift 2
admin=false vhost=/ password_file= url_host=127.0.0.1
while [ $# -gt 0 ]; do
    case $1 in
        --admin) admin=true ;;
        --vhost) vhost=$2; shift ;;
        --password-file) password_file=$2; shift ;;
        --url-host) url_host=$2; shift ;;
        *) die "unknown option $1" ;;
    esac
    shift
done
# The same words gleaner accepts as owners: a name is part of regexes and
# routing keys, so nothing that means something there.
[[ $name =~ ^[A-Za-z0-9_@-]{1,64}$ ]] || die "$name: names are letters, digits, '_', '-' and '@'"

if [ "$action" = remove ]; then
    ctl delete_user "$name" 2>/dev/null || true
    log "removed $name"
    exit 0
fi

password=$(head -c 18 /dev/urandom | base64 | tr '+/' 'xy')
if as_root rabbitmqctl -q list_users | awk '{print $1}' | grep -qx -- "$name"; then
    ctl change_password "$name" "$password"
else
    ctl add_user "$name" "$password"
fi

case $action in
    service)
        ctl set_user_tags "$name" administrator
        ctl set_permissions -p "$vhost" "$name" '.*' '.*' '.*'
        ;;
    add)
        ctl set_user_tags "$name"
        own="gleaner\\.watch\\.${name}\\..*"
        ctl set_permissions -p "$vhost" "$name" \
            "^($own|amq\\.gen-.*)\$" \
            "^(gleaner\\.user|$own|amq\\.gen-.*)\$" \
            "^(gleaner\\.events|$own|amq\\.gen-.*)\$"
        if $admin; then jobs='job\..*'; else jobs='job\.{username}\..*'; fi
        # Topic permissions: publishing no events, binding to their own.
        ctl set_topic_permissions -p "$vhost" "$name" gleaner.events '^$' "^($jobs|cluster\\..*)\$"
        ;;
    *) die "unknown action $action (add, service or remove)" ;;
esac

encoded_vhost=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$vhost")
url="amqp://$name:$password@$url_host:5672/$encoded_vhost?heartbeat=10"
write_secret() { # FILE OWNER TEXT
    as_root install -m 0600 -o "$2" /dev/null "$1"
    printf '%s\n' "$3" | as_root tee "$1" >/dev/null
}
if [ -n "$password_file" ]; then
    write_secret "$password_file" "$(id -un)" "$password"
    log "$action $name on vhost $vhost; password in $password_file"
elif [ "$action" = add ] && home=$(getent passwd "$name" | cut -d: -f6) && [ -n "$home" ]; then
    as_root runuser -u "$name" -- mkdir -p -m 0700 "$home/.config/gleaner"
    write_secret "$home/.config/gleaner/gleaner.toml" "$name" "broker_url = \"$url\""
    log "added $name on vhost $vhost; their broker_url is in $home/.config/gleaner/gleaner.toml"
else
    log "$action $name on vhost $vhost; password: $password"
fi
