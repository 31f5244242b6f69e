#!/bin/bash
# The results store against a real PostgreSQL 15 + Q3C server that this script starts (tests/db/pg_server.sh)
# and stops: the store's unit tests on PostgreSQL, `reduce --db` and `query`, the error exit codes (wrong
# password, no server, newer schema, a full disk), and four Redis workers writing 100 frames at once with
# one of them killed (SIGKILL) in the middle of a frame's write. Exit 77 (ctest: skipped) without
# PostgreSQL 15, Q3C or redis-server.
#   usage: tests/db/postgres_test.sh GPUPHOT GPUPHOT_TESTHOOKS CORE_TESTS
set -uo pipefail
bin=$(realpath "$1"); hooks=$(realpath "$2"); core_tests=$(realpath "$3")
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/db/pg_server.sh
. "$here/pg_server.sh"
command -v redis-server >/dev/null || { echo "SKIP: redis-server not installed"; exit 77; }
work=$(mktemp -d /tmp/gpdb.XXXXXX); chmod 755 "$work"
redis_pid=; full_mount=
cleanup() {
    local rc=$?
    pg_stop
    [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null
    [ -n "$full_mount" ] && umount "$full_mount" 2>/dev/null
    rm -rf "$work"
    exit $rc
}
trap cleanup EXIT
pg_start "$work/pg"; rc=$?; [ $rc = 0 ] || exit $rc
psql_() { PGOPTIONS="-c client_min_messages=warning" "$PG_BIN/psql" -X -q -t -A -h "$PG_SOCKET_DIR" -p "$PG_PORT" -U gpuphot -d gpuphot -c "$1"; }
fail() { echo "FAIL: $*"; exit 1; }
expect_exit() { # expect_exit CODE command...
    local want=$1; shift
    "$@" >"$work/stdout" 2>"$work/err"; local got=$?
    [ "$got" = "$want" ] || { cat "$work/err"; fail "exit $got, want $want: $*"; }
}
export GPUPHOT_NO_TYCHO2=1

echo "== the store's unit tests on PostgreSQL"
GPUPHOT_TEST_PG_URL=$PG_URL "$core_tests" --gtest_filter='Backends/ResultsStoreTest.*/postgresql' \
    --gtest_brief=1 || fail "ResultsStoreTest on PostgreSQL"

echo "== reduce --db, query"
mkdir -p "$work/sim" "$work/frames"
for i in 1 2 3; do
    "$bin" simulate --size 256x256 --stars 80 --seed $((40 + i)) -q -o "$work/sim" --name f$i || fail simulate
    cp "$work/sim/f$i.fits" "$work/frames/"
done
psql_ "DROP SCHEMA public CASCADE; CREATE SCHEMA public;" >/dev/null
expect_exit 0 "$bin" reduce "$work"/frames/f*.fits -o "$work/out" -j 2 -q --db "$PG_URL"
n=$("$bin" query --db "$PG_URL" --format csv frames | tail -n +2 | wc -l)
[ "$n" = 3 ] || fail "query frames: $n rows, want 3"
stored=$(psql_ "SELECT count(*) FROM sources")
want=$(/usr/bin/python3 -c "
from astropy.io import fits; import sys
print(sum(len(fits.getdata(f'$work/out/f{i}.cat.fits', 1)) for i in (1, 2, 3)))")
[ "$stored" = "$want" ] || fail "sources: $stored stored, catalogs hold $want"
# A cone at one stored source finds it (Q3C index).
read -r ra dec < <(psql_ "SELECT ra, dec FROM sources ORDER BY frame_id, id LIMIT 1" | tr '|' ' ')
hits=$("$bin" query --db "$PG_URL" --format json cone "$ra" "$dec" 1 | /usr/bin/python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
[ "$hits" -ge 1 ] || fail "cone at a stored source found nothing"
expect_exit 0 "$bin" reduce "$work"/frames/f*.fits -o "$work/out" -q --force --db "$PG_URL"
[ "$(psql_ 'SELECT count(*) FROM frames')" = 3 ] || fail "frames reduced again were added, not replaced"
[ "$(psql_ 'SELECT count(*) FROM sources')" = "$want" ] || fail "sources of replaced frames"

echo "== errors: wrong password 6, no server 5, newer schema 7, full 8"
bad_pw=${PG_URL/secret/wrong}
expect_exit 6 "$bin" reduce "$work/frames/f1.fits" -o "$work/e1" -q --db "$bad_pw"
[ -f "$work/e1/f1.cat.fits" ] || fail "the catalog was not written with a wrong password"
expect_exit 6 "$bin" query --db "$bad_pw" frames
dead_port=$(_pg_free_port)
expect_exit 5 "$bin" reduce "$work/frames/f1.fits" -o "$work/e2" -q --db "postgresql://gpuphot:secret@127.0.0.1:$dead_port/gpuphot"
[ -f "$work/e2/f1.cat.fits" ] || fail "the catalog was not written without a server"
psql_ "UPDATE gpuphot_meta SET value = '99' WHERE key = 'schema_version'" >/dev/null
expect_exit 7 "$bin" reduce "$work/frames/f1.fits" -o "$work/e3" -q --db "$PG_URL"
grep -q "newer" "$work/err" || fail "newer schema: message does not say so"
echo "== migration: a schema 1 database (sources keyed by (frame_id, id)) opens as schema 2"
psql_ "DROP INDEX sources_frame; ALTER TABLE sources ADD PRIMARY KEY (frame_id, id);
       UPDATE gpuphot_meta SET value = '1' WHERE key = 'schema_version'" >/dev/null || fail "making schema 1"
rows_v1=$(psql_ "SELECT count(*) FROM sources")
expect_exit 0 "$bin" query --db "$PG_URL" frames
[ "$(psql_ "SELECT value FROM gpuphot_meta WHERE key = 'schema_version'")" = 2 ] || fail "not migrated to 2"
[ "$(psql_ "SELECT count(*) FROM pg_constraint WHERE conname = 'sources_pkey'")" = 0 ] || fail "v2 keeps the key"
[ "$(psql_ "SELECT amname FROM pg_class c JOIN pg_am a ON a.oid = c.relam WHERE relname = 'sources_frame'")" = brin ] ||
    fail "v2 has no BRIN index on frame_id"
[ "$(psql_ "SELECT count(*) FROM sources")" = "$rows_v1" ] || fail "the migration lost sources"
# A full disk: the sources table moved to a tablespace on a 1 MB tmpfs (needs mount, as root); a large
# frame then cannot be stored, the earlier frames stay, and none of it is in the database.
full_mount=$work/small
mkdir -p "$full_mount"
if mount -t tmpfs -o size=1m tmpfs "$full_mount" 2>/dev/null; then
    chown postgres: "$full_mount" 2>/dev/null || true
    psql_ "CREATE TABLESPACE small LOCATION '$full_mount'" >/dev/null || fail "CREATE TABLESPACE"
    psql_ "ALTER TABLE sources SET TABLESPACE small; ALTER INDEX sources_q3c SET TABLESPACE small;
           ALTER INDEX sources_frame SET TABLESPACE small;" >/dev/null
    "$bin" simulate --size 2048x2048 --stars 30000 --seed 9 -q -o "$work/sim" --name big || fail simulate big
    before=$(psql_ "SELECT count(*) FROM sources")
    expect_exit 8 "$bin" reduce "$work/sim/big.fits" -o "$work/e4" -q --db "$PG_URL"
    [ -f "$work/e4/big.cat.fits" ] || fail "the catalog was not written with a full database"
    [ "$(psql_ 'SELECT count(*) FROM sources')" = "$before" ] || fail "a part of the frame is in the full database"
    [ "$(psql_ "SELECT count(*) FROM frames WHERE path LIKE '%big.fits'")" = 0 ] || fail "the full frame's row is there"
    psql_ "ALTER TABLE sources SET TABLESPACE pg_default; ALTER INDEX sources_q3c SET TABLESPACE pg_default;
           ALTER INDEX sources_frame SET TABLESPACE pg_default;" >/dev/null
    psql_ "DROP TABLESPACE small" >/dev/null
    # SQLite on the same small disk: a real ENOSPC, exit 8, and the file holds no part of the frame.
    rm -rf "${full_mount:?}"/*
    expect_exit 0 "$bin" reduce "$work/frames/f1.fits" -o "$work/e5" -q --db "$full_mount/night.sqlite"
    expect_exit 8 "$bin" reduce "$work/sim/big.fits" -o "$work/e5" -q --db "$full_mount/night.sqlite"
    [ -f "$work/e5/big.cat.fits" ] || fail "the catalog was not written with a full SQLite disk"
    n=$("$bin" query --db "$full_mount/night.sqlite" --format csv frames | tail -n +2 | wc -l)
    [ "$n" = 1 ] || fail "full SQLite disk: $n frames stored, want 1"
    umount "$full_mount"; full_mount=
else
    echo "note: no tmpfs mount here (not root?): the full-disk case is covered by the SQLite tests only"
    full_mount=
fi

echo "== four workers, 100 frames, one worker killed inside a frame's write"
psql_ "DROP SCHEMA public CASCADE; CREATE SCHEMA public;" >/dev/null
mkdir -p "$work/many"
for i in $(seq -w 1 100); do cp "$work/sim/f$(( (10#$i % 3) + 1 )).fits" "$work/many/m$i.fits"; done
port=$(_pg_free_port)
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no --dir "$work" \
    --loglevel warning >"$work/redis.log" 2>&1 &
redis_pid=$!
for _ in $(seq 100); do redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && break; sleep 0.05; done
"$bin" enqueue --redis "127.0.0.1:$port" -q -o "$work/wout" "$work"/many/m*.fits || fail enqueue
# The victim takes a job and is killed after 30 source rows of it went to PostgreSQL.
GPUPHOT_TEST_DB_KILL_AFTER_ROWS=30 "$hooks" worker --redis "127.0.0.1:$port" --db "$PG_URL" --backend cpu \
    --threads 1 --name victim --max-frames 1 -q >"$work/victim.log" 2>&1
victim_rc=$?
[ "$victim_rc" = 137 ] || fail "the victim worker was not killed in its write (exit $victim_rc)"
pids=()
for w in 1 2 3 4; do
    "$bin" worker --redis "127.0.0.1:$port" --db "$PG_URL" --backend cpu --threads 1 --name w$w \
        --claim-idle 2s --exit-when-idle 4 -q >"$work/w$w.log" 2>&1 &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || { cat "$work"/w*.log; fail "a worker failed"; }; done
frames=$(psql_ "SELECT count(*) FROM frames")
distinct=$(psql_ "SELECT count(DISTINCT path) FROM frames")
[ "$frames" = 100 ] && [ "$distinct" = 100 ] || fail "frames stored: $frames rows, $distinct distinct (want 100)"
bad=$(psql_ "SELECT count(*) FROM frames f WHERE f.sources <> (SELECT count(*) FROM sources s WHERE s.frame_id = f.id)")
[ "$bad" = 0 ] || fail "$bad frames whose stored sources differ from their source count"
echo "PASS"
