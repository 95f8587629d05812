#!/usr/bin/env bash
# A real PostgreSQL server on loopback for the worker tests; prints its URL (and nothing else on
# stdout):   export PLANNER_TEST_POSTGRES=$(bash .ci/postgres.sh)
#
# - Installs Debian's `postgresql` package with apt-get if no server binaries are found.
# - As root: starts the Debian cluster (pg_ctlcluster; creates it if there is none). As another
#   user: initdb + pg_ctl into $PLANNER_PG_DIR (default: a folder under /tmp) on port
#   $PLANNER_PG_PORT (default 54329), listening on 127.0.0.1 only.
# - Creates the role and database `planner` (password `planner`) if missing. Idempotent: run it
#   again and it reuses the running server.
set -euo pipefail

USER_NAME=planner
PASSWORD=planner
DB=planner

log() { echo "postgres.sh: $*" >&2; }

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo -n "$@"; else
        log "need root (or sudo) to run: $*"; return 1; fi
}

pg_bin() {  # the newest installed server's bin folder
    local v
    v=$(ls /usr/lib/postgresql 2>/dev/null | sort -V | tail -n 1)
    if [ -n "$v" ] && [ -x "/usr/lib/postgresql/$v/bin/initdb" ]; then
        echo "/usr/lib/postgresql/$v/bin"
    fi
}

install_server() {
    if [ -n "$(pg_bin)" ]; then return; fi
    log "installing the postgresql package"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
}

# As root: the Debian cluster, run by the postgres user; connect on 127.0.0.1:5432 (or its port).
start_cluster() {
    local bin version port
    bin=$(pg_bin)
    version=$(basename "$(dirname "$bin")")
    if ! pg_lsclusters -h 2>/dev/null | awk '{print $1, $2}' | grep -q "^$version main$"; then
        log "creating cluster $version main"
        pg_createcluster "$version" main >&2
    fi
    if ! pg_lsclusters -h | awk -v v="$version" '$1 == v && $2 == "main" {print $4}' \
            | grep -q online; then
        log "starting cluster $version main"
        pg_ctlcluster "$version" main start >&2
    fi
    port=$(pg_lsclusters -h | awk -v v="$version" '$1 == v && $2 == "main" {print $3}')
    PSQL=(runuser -u postgres -- psql -X -q -v ON_ERROR_STOP=1 -p "$port" -d postgres)
    PORT=$port
}

# Not root: a private server in a folder of our own.
start_private() {
    local bin dir
    bin=$(pg_bin)
    dir=${PLANNER_PG_DIR:-/tmp/planner-pg-$(id -u)}
    PORT=${PLANNER_PG_PORT:-54329}
    if [ ! -f "$dir/data/PG_VERSION" ]; then
        log "initdb into $dir/data"
        mkdir -p "$dir"
        "$bin/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 >&2
    fi
    if ! "$bin/pg_ctl" -D "$dir/data" status >/dev/null 2>&1; then
        log "starting the server on 127.0.0.1:$PORT"
        "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
            -o "-c listen_addresses=127.0.0.1 -p $PORT -k $dir" start >&2
    fi
    PSQL=(psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U postgres -d postgres)
}

wait_ready() {
    local i
    for i in $(seq 1 50); do
        if "${PSQL[@]}" -c 'select 1' >/dev/null 2>&1; then return; fi
        sleep 0.2
    done
    log "the server does not answer"; return 1
}

create_db() {
    "${PSQL[@]}" <<SQL >&2
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$USER_NAME') THEN
    CREATE ROLE $USER_NAME LOGIN PASSWORD '$PASSWORD';
  END IF;
END \$\$;
SQL
    if ! "${PSQL[@]}" -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB'" | grep -q 1; then
        "${PSQL[@]}" -c "CREATE DATABASE $DB OWNER $USER_NAME" >&2
    fi
}

install_server
if [ "$(id -u)" = 0 ]; then start_cluster; else start_private; fi
wait_ready
create_db
URL="postgresql+psycopg://$USER_NAME:$PASSWORD@127.0.0.1:$PORT/$DB"
# Check the URL itself works (password authentication over TCP on loopback).
PGPASSWORD=$PASSWORD psql -X -q -h 127.0.0.1 -p "$PORT" -U "$USER_NAME" -d "$DB" \
    -c 'select 1' >/dev/null
log "ready: $URL"
echo "$URL"
