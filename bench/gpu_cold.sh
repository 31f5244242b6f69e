#!/usr/bin/env bash
# A 151 MP frame reduced from the shell with its reference catalog, one cold `gpuphot reduce` process per
# run: the wall time, the sum of the report's stages, what lies outside them, and the largest stages.
#   bench/gpu_cold.sh [SIZE] [STARS] [RUNS]      (default 14208x10656 400000 3: about 154k sources)
# Environment: OUT (log, reports), WORK (frame), DEVICE_DIR (default .device), BACKEND (default cuda),
# SEED (default 7), EXTRA (more reduce options), TIMELINE=1 (the process's laps, `reduce -v`: start-up,
# reference catalog, read, reduction, outputs, teardown). Runs binaries packed by bench/pack_device.sh.
# "wall": until the shell gets the exit status; "device released": until the last gpuphot process of the
# run ended (later with the detached exit, app/cli/detached_exit.hpp).
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
DEVICE_DIR=${DEVICE_DIR:-$HERE/../.device}
[ -x "$DEVICE_DIR/bin/gpuphot" ] || DEVICE_DIR=$HERE
export LD_LIBRARY_PATH="$DEVICE_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
GP="$DEVICE_DIR/bin/gpuphot"
SIZE=${1:-14208x10656}; STARS=${2:-400000}; RUNS=${3:-3}
OUT=${OUT:-$PWD/cold-out}; WORK=${WORK:-/tmp/gpuphot-cold}
BACKEND=${BACKEND:-cuda}; SEED=${SEED:-7}
mkdir -p "$OUT" "$WORK"
LOG="$OUT/cold.log"
name="cold_${STARS}"
[ -f "$WORK/$name.fits" ] ||
    "$GP" simulate --size "$SIZE" --stars "$STARS" --seed "$SEED" --bitpix 16 -o "$WORK" --name "$name" -q ||
    exit 1
cat "$WORK/$name.fits" "$WORK/$name.ref.fits" > /dev/null # into the page cache
echo "== $(date -u '+%Y-%m-%d %H:%M UTC') $SIZE, $STARS stars, backend $BACKEND, $(nproc) cores" | tee -a "$LOG"
for run in $(seq 1 "$RUNS"); do
    dir="$OUT/run$run"
    rm -rf "$dir"
    t0=$(date +%s.%N)
    verbose=-q
    [ "${TIMELINE:-0}" = 1 ] && verbose=-v
    "$GP" reduce "$WORK/$name.fits" --ref "$WORK/$name.ref.fits" --no-tycho2 --backend "$BACKEND" $verbose --force \
        -o "$dir" ${EXTRA:-} > "$OUT/run$run.txt" 2>&1 || { cat "$OUT/run$run.txt" >> "$LOG"; echo "run $run failed (see $LOG)"; exit 1; }
    t1=$(date +%s.%N)
    # With the detached exit (GPUPHOT_DETACHED_EXIT) the process that still releases the device ends later.
    while pgrep -f -- "-o $dir" > /dev/null; do sleep 0.005; done
    t2=$(date +%s.%N)
    cat "$OUT/run$run.txt" >> "$LOG"
    if [ "${TIMELINE:-0}" = 1 ]; then
        marks=$(sed -n 's/^timeline: +\([0-9.]*\) s \(.*\)$/\1 \2/p' "$OUT/run$run.txt" | tr '\n' ';')
        echo "run $run timeline (s since the process started): $marks exit $(python3 -c "print('%.3f' % ($t1 - $t0))")" |
            tee -a "$LOG"
    fi
    rm -f "$OUT/run$run.txt"
    python3 - "$dir/$name.report.json" "$t0" "$t1" "$run" "$t2" <<'PY' | tee -a "$LOG"
import json, sys
r = json.load(open(sys.argv[1]))
wall = float(sys.argv[3]) - float(sys.argv[2])
st = [(s["stage"], s["seconds"]) for s in r["stages"]]
tot = sum(s for _, s in st)
top = ", ".join("%s %.0f" % (k, v * 1e3) for k, v in sorted(st, key=lambda x: -x[1])[:5])
end = float(sys.argv[5]) - float(sys.argv[2])
print("run %s: %d sources, wall %.3f s (device released %.3f s), stages %.3f s, outside %.3f s; largest (ms): %s" % (
    sys.argv[4], r["counts"]["sources"] if isinstance(r.get("counts"), dict) and "sources" in r["counts"]
    else -1, wall, end, tot, wall - tot, top))
PY
done
