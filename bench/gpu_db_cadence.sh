#!/usr/bin/env bash
# The cadence of a GPU night with and without --db (the results store written by reduce's writer thread
# beside the reduction of the next frame): N copies of a simulated frame reduced by one pipelined
# process, first without a database, then with --db FILE.sqlite, alternately, twice each. Runs the
# binaries packed by bench/pack_device.sh.
#   bench/gpu_db_cadence.sh [SIZE] [STARS] [N] [EXTRA reduce options]
#   (default 3912x3912 16000 20 "--prefetch 2 --concurrent 3": the 15.3 MP stream of BENCHMARKS.md)
# Environment: OUT (log), WORK (frames, default /tmp/gpuphot-dbc), DEVICE_DIR (default .device).
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
DEVICE_DIR=${DEVICE_DIR:-$HERE/../.device}
export LD_LIBRARY_PATH="$DEVICE_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GPUPHOT_NO_TYCHO2=1
GP="$DEVICE_DIR/bin/gpuphot"
SIZE=${1:-3912x3912}; STARS=${2:-16000}; N=${3:-20}; EXTRA=${4:---prefetch 2 --concurrent 3}
WORK=${WORK:-/tmp/gpuphot-dbc}; OUT=${OUT:-$PWD}
rm -rf "$WORK"; mkdir -p "$WORK/in" "$OUT"
LOG="$OUT/db_cadence_${SIZE}.log"
"$GP" simulate --size "$SIZE" --stars "$STARS" --seed 3 --bitpix 16 -o "$WORK" --name base -q
for i in $(seq -w 1 "$N"); do cp "$WORK/base.fits" "$WORK/in/f$i.fits"; done
echo "== $(date -u '+%Y-%m-%d %H:%M UTC') $N frames of $SIZE ($STARS stars), $(nproc) cores, reduce $EXTRA" | tee -a "$LOG"
run() { # run LABEL [--db FILE]
    local label=$1; shift
    local t0 t1
    t0=$(date +%s%N)
    # shellcheck disable=SC2086
    "$GP" reduce "$WORK"/in/f*.fits -o "$WORK/out_$label" --backend cuda --ref "$WORK/base.ref.fits" -q --force \
        $EXTRA "$@" >>"$LOG" 2>&1
    local rc=$?
    t1=$(date +%s%N)
    awk -v l="$label" -v n="$N" -v ns=$((t1 - t0)) -v rc=$rc \
        'BEGIN { s = ns / 1e9; printf "%-8s rc %d  %7.2f s  %6.3f frames/s\n", l, rc, s, n / s }' | tee -a "$LOG"
}
run nodb1
run db1 --db "$WORK/night1.sqlite"
run nodb2
run db2 --db "$WORK/night2.sqlite"
for db in "$WORK"/night1.sqlite "$WORK"/night2.sqlite; do
    "$GP" query --db "$db" --format csv frames | tail -n +2 | wc -l | sed "s|^|frames in $(basename "$db"): |" | tee -a "$LOG"
done
