#!/usr/bin/env bash
# A private PostgreSQL server for trainguard's tests and for trying `serve --database`.
#
#   scripts/postgres-local.sh up   [DIR]   start (installing Debian's postgresql when missing);
#                                          prints the connection URL on stdout
#   scripts/postgres-local.sh url  [DIR]   print the URL of the running server (exit 1 if none)
#   scripts/postgres-local.sh down [DIR]   stop it (the data stays in DIR)
#
# DIR defaults to $TRAINGUARD_PG_DIR or .trainguard/postgres. The server listens on
# 127.0.0.1 only, on a free port chosen at first start (kept in DIR/port), with its
# Unix socket in DIR; authentication is `trust` for user postgres, so never point it
# at a shared directory. Idempotent: `up` on a running server only prints its URL.
# As root the server runs as the `postgres` user (PostgreSQL refuses to run as root).
set -euo pipefail

cmd="${1:-up}"
dir="${2:-${TRAINGUARD_PG_DIR:-.trainguard/postgres}}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
data="$dir/data"
log="$dir/server.log"

find_bin() {
    local d
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$d/pg_ctl" ] && [ -x "$d/initdb" ]; then
            echo "$d"
            return 0
        fi
    done
    return 1
}

bin="$(find_bin || true)"
if [ -z "$bin" ]; then
    if [ "$cmd" != "up" ]; then
        echo "postgres-local: PostgreSQL is not installed" >&2
        exit 1
    fi
    echo "postgres-local: installing Debian's postgresql ..." >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends postgresql >&2 \
        || { apt-get update >&2 && apt-get install -y --no-install-recommends postgresql >&2; }
    bin="$(find_bin)"
fi

# PostgreSQL will not run as root: use the postgres account the package creates.
as_owner() {
    if [ "$(id -u)" = "0" ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

url_of() {
    echo "postgresql://postgres@127.0.0.1:$(cat "$dir/port")/postgres"
}

running() {
    [ -f "$data/postmaster.pid" ] && as_owner "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1
}

case "$cmd" in
up)
    if [ "$(id -u)" = "0" ]; then
        chown postgres: "$dir"
        if ! runuser -u postgres -- test -w "$dir"; then
            echo "postgres-local: the postgres user cannot reach $dir (a parent directory" \
                "is private); use a directory under /tmp or set TRAINGUARD_PG_DIR" >&2
            exit 1
        fi
    fi
    if [ ! -f "$data/PG_VERSION" ]; then
        rm -rf "$data"
        as_owner "$bin/initdb" -D "$data" -A trust -U postgres -E UTF8 --no-locale --no-sync >"$dir/initdb.log" 2>&1 \
            || { cat "$dir/initdb.log" >&2; exit 1; }
    fi
    if running; then
        url_of
        exit 0
    fi
    # A free port, kept for the life of DIR so that the URL stays the same.
    if [ ! -s "$dir/port" ]; then
        python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' >"$dir/port"
    fi
    port="$(cat "$dir/port")"
    # fsync stays on: the store's durability claims are tested against this server.
    if ! as_owner "$bin/pg_ctl" -D "$data" -l "$log" -w -t 60 \
        -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=200" start >&2; then
        # The port may have been taken since: pick another once.
        python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' >"$dir/port"
        port="$(cat "$dir/port")"
        as_owner "$bin/pg_ctl" -D "$data" -l "$log" -w -t 60 \
            -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=200" start >&2 \
            || { tail -20 "$log" >&2; exit 1; }
    fi
    url_of
    ;;
url)
    running || { echo "postgres-local: no server running in $dir" >&2; exit 1; }
    url_of
    ;;
down)
    if running; then
        as_owner "$bin/pg_ctl" -D "$data" -m fast -w stop >&2
    fi
    ;;
*)
    echo "usage: $0 up|url|down [DIR]" >&2
    exit 2
    ;;
esac
