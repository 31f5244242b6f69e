# shellcheck shell=bash
# A private PostgreSQL 15 server (with Q3C) for the results store's tests. Source this file, then:
#   pg_start DIR || exit $?   # 77 (ctest: skipped) without PostgreSQL 15 or Q3C; 1 when it fails to start
#   trap pg_stop EXIT         # pg_stop is idempotent and safe in an EXIT trap
# pg_start makes a cluster in DIR/data (superuser "gpuphot", password "secret"; trust on the Unix socket,
# scram-sha-256 over TCP), listens on 127.0.0.1 on a random free port with its socket in DIR, creates the
# database "gpuphot" and exports:
#   PG_PORT        the TCP port
#   PG_URL         postgresql://gpuphot:secret@127.0.0.1:$PG_PORT/gpuphot
#   PG_SOCKET_DIR  DIR (psql -h "$PG_SOCKET_DIR" -p "$PG_PORT" -U gpuphot gpuphot: no password)
#   PG_DATA        DIR/data
# PostgreSQL refuses to run as root: as root, initdb and pg_ctl run as the "postgres" system user and DIR
# is given to it (every directory above DIR must be searchable by it: chmod 755 a mktemp -d parent).
# DIR should be short: the socket path DIR/.s.PGSQL.PORT must fit in 107 bytes.

# PG_SERVER_OPTIONS: more postgres options; by default no fsync (a test needs no durability); set it to
# "" for a durable server (e.g. to time putFrame as on a production server).
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
PG_SERVER_OPTIONS=${PG_SERVER_OPTIONS--c fsync=off -c synchronous_commit=off -c full_page_writes=off}
PG_Q3C=${PG_Q3C:-/usr/lib/postgresql/15/lib/q3c.so}
_pg_data=
_pg_as=()

# A TCP port on 127.0.0.1 that nobody listens on now (picked by the kernel).
_pg_free_port() {
    if command -v python3 >/dev/null 2>&1; then
        python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
    else
        local p=$((20000 + RANDOM % 20000))
        while (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do p=$((p + 1)); done
        echo "$p"
    fi
}

# initdb with the users and authentication the tests expect.
_pg_initdb() {
    local dir=$1
    printf 'secret\n' >"$dir/pwfile"
    chmod 600 "$dir/pwfile"
    [ ${#_pg_as[@]} -gt 0 ] && chown postgres: "$dir/pwfile"
    "${_pg_as[@]}" "$PG_BIN/initdb" -D "$dir/data" -U gpuphot --pwfile="$dir/pwfile" -E UTF8 --locale=C \
        --auth-local=trust --auth-host=scram-sha-256 --no-sync >"$dir/initdb.log" 2>&1
    local rc=$?
    rm -f "$dir/pwfile"
    if [ $rc != 0 ]; then
        echo "pg_start: initdb failed:" >&2
        tail -n 20 "$dir/initdb.log" >&2
        return 1
    fi
}

# pg_ctl start on a free port (a few tries: another process may take the port between pick and bind).
_pg_listen() {
    local dir=$1 port
    for _ in 1 2 3 4 5; do
        port=$(_pg_free_port)
        if "${_pg_as[@]}" "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 -s \
            -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=50 $PG_SERVER_OPTIONS" \
            start >/dev/null 2>&1; then
            PG_PORT=$port
            return 0
        fi
    done
    echo "pg_start: the server did not start:" >&2
    tail -n 20 "$dir/server.log" >&2
    return 1
}

# pg_start DIR: see the top of this file.
pg_start() {
    local dir=${1:?usage: pg_start DIR}
    if [ ! -x "$PG_BIN/initdb" ]; then
        echo "SKIP: PostgreSQL 15 is not installed ($PG_BIN/initdb; Debian: postgresql-15)" >&2
        return 77
    fi
    if [ ! -f "$PG_Q3C" ]; then
        echo "SKIP: the Q3C extension is not installed ($PG_Q3C; Debian: postgresql-15-q3c)" >&2
        return 77
    fi
    mkdir -p "$dir" && dir=$(cd "$dir" && pwd -P) || return 1
    if [ $((${#dir} + 18)) -gt 107 ]; then
        echo "pg_start: $dir is too long for the server's Unix socket path (at most 89 bytes)" >&2
        return 1
    fi
    _pg_as=()
    if [ "$(id -u)" = 0 ]; then
        _pg_as=(runuser -u postgres --)
        chown postgres: "$dir" || return 1
        if ! runuser -u postgres -- test -w "$dir"; then
            echo "pg_start: user postgres cannot write $dir (a directory above it is not searchable:" \
                "chmod 755 it, e.g. a mktemp -d directory)" >&2
            return 1
        fi
    fi
    _pg_initdb "$dir" || return 1
    _pg_data=$dir/data
    _pg_listen "$dir" || { pg_stop; return 1; }
    if ! "$PG_BIN/psql" -X -q -h "$dir" -p "$PG_PORT" -U gpuphot -d postgres \
        -c 'CREATE DATABASE gpuphot' >"$dir/createdb.log" 2>&1; then
        echo "pg_start: CREATE DATABASE failed:" >&2
        cat "$dir/createdb.log" >&2
        pg_stop
        return 1
    fi
    export PG_PORT PG_SOCKET_DIR=$dir PG_DATA=$_pg_data
    export PG_URL="postgresql://gpuphot:secret@127.0.0.1:$PG_PORT/gpuphot"
}

# pg_stop: stops the server pg_start started (immediate: the tests need no clean shutdown); does nothing
# when none runs. Keeps the exit status of the caller (for EXIT traps).
pg_stop() {
    local rc=$?
    if [ -n "$_pg_data" ] && [ -f "$_pg_data/postmaster.pid" ]; then
        "${_pg_as[@]}" "$PG_BIN/pg_ctl" -D "$_pg_data" -m immediate -w -s stop >/dev/null 2>&1
    fi
    _pg_data=
    return $rc
}
