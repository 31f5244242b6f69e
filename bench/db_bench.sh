#!/usr/bin/env bash
# The results-store benchmark of docs/BENCHMARKS.md: bench_db on a SQLite file and on a private, durable
# PostgreSQL 15 + Q3C server (fsync on, shared_buffers PG_SHARED_BUFFERS, default 1GB), each with the
# frames on 25 fields and on one field. JSON per run and a summary table in OUT (default
# bench-db-results/).
#   bash bench/db_bench.sh [BUILD_DIR] [OUT]      (BUILD_DIR default build; FRAMES=75 SOURCES=134000)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-bench-db-results}
bench=$build/bench/bench_db
[ -x "$bench" ] || { echo "db_bench: $bench not built (ninja -C $build bench_db)" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
frames=${FRAMES:-75}
sources=${SOURCES:-134000}
work=$(mktemp -d /tmp/gpuphot-dbb.XXXXXX)
chmod 755 "$work"
# shellcheck source=../tests/db/pg_server.sh
source tests/db/pg_server.sh
PG_SERVER_OPTIONS="-c shared_buffers=${PG_SHARED_BUFFERS:-1GB}"
cleanup() {
    pg_stop
    rm -rf "$work"
}
trap cleanup EXIT
pg_start "$work/pg" || { echo "db_bench: no PostgreSQL 15 with Q3C here" >&2; exit 77; }

run() { # run NAME URL FIELDS
    echo "== $1"
    "$bench" --db "$2" --fields "$3" --frames "$frames" --sources "$sources" --json "$out/$1.json" >/dev/null
}
for fields in 25 1; do
    rm -f "$work"/store.sqlite*
    run "sqlite_$fields" "$work/store.sqlite" "$fields"
    rm -f "$work"/store.sqlite*
    PGOPTIONS="-c client_min_messages=warning" "$PG_BIN/psql" -X -q -h "$PG_SOCKET_DIR" -p "$PG_PORT" \
        -U gpuphot -d gpuphot -c "DROP SCHEMA public CASCADE; CREATE SCHEMA public;"
    run "postgresql_$fields" "$PG_URL" "$fields"
done
/usr/bin/python3 - "$out" <<'PY' | tee "$out/summary.md"
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
print("| store | fields | store a frame: median | slowest | cone: median | p95 | max |")
print("|---|---:|---:|---:|---:|---:|---:|")
for name in ["sqlite_25", "sqlite_1", "postgresql_25", "postgresql_1"]:
    d = json.loads((out / f"{name}.json").read_text())
    print(f"| {d['backend']} | {d['fields']} | {d['put_median_s']:.2f} s | {d['put_max_s']:.2f} s | "
          f"{d['cone_median_ms']:.1f} ms | {d['cone_p95_ms']:.1f} ms | {d['cone_max_ms']:.1f} ms |")
PY
