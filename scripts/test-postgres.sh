# Sourced by scripts/test: when no MAKA_TEST_POSTGRES_URL is given and PostgreSQL's server
# binaries are on this machine, start a throwaway cluster on a free loopback port so the store's
# contract suite also runs against Postgres. Without the binaries the Postgres cases skip.
# max_connections: the PostgreSQL drills run several sandboxes at once, each with worker processes
# holding their own pools.
start_test_postgres() {
  [ -z "${MAKA_TEST_POSTGRES_URL:-}" ] || return 0
  command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1 || return 0
  local dir port
  dir=$(mktemp -d /tmp/maka-pg.XXXXXX)
  port=$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  local -a as_owner=()
  if [ "$(id -u)" = 0 ]; then
    # The server refuses to run as root: run it as the postgres user when there is one.
    id postgres >/dev/null 2>&1 && command -v runuser >/dev/null 2>&1 || { rm -rf "$dir"; return 0; }
    chown postgres "$dir"
    as_owner=(runuser -u postgres --)
  fi
  if ! "${as_owner[@]}" initdb -D "$dir/data" -A trust -U maka >"$dir/initdb.log" 2>&1 \
    || ! "${as_owner[@]}" pg_ctl -D "$dir/data" -l "$dir/server.log" -w -t 30 \
      -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=800" start >/dev/null 2>&1; then
    echo "scripts/test: could not start a test PostgreSQL; its cases will skip" >&2
    rm -rf "$dir"
    return 0
  fi
  export MAKA_TEST_POSTGRES_URL="postgresql+psycopg://maka@127.0.0.1:$port/postgres"
  MAKA_TEST_PG_DIR=$dir
  MAKA_TEST_PG_OWNER="${as_owner[*]}"
  trap stop_test_postgres EXIT
  echo "scripts/test: PostgreSQL for the store suite at 127.0.0.1:$port" >&2
}

stop_test_postgres() {
  if [ -n "${MAKA_TEST_PG_DIR:-}" ]; then
    $MAKA_TEST_PG_OWNER pg_ctl -D "$MAKA_TEST_PG_DIR/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$MAKA_TEST_PG_DIR"
  fi
}
