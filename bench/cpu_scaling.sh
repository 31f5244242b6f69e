#!/usr/bin/env bash
# The CPU backend's parallel efficiency on one frame: `gpuphot bench --backend cpu --threads N` (read to
# catalog, best of REPEAT) for each N, then speed-up and efficiency against one thread, stage by stage.
#   bench/cpu_scaling.sh [SIZE] [STARS] [THREADS] [REPEAT]   (default 14208x10656 400000 "1 8 16" 2)
# Environment: OUT (log), WORK (frame), DEVICE_DIR (default .device), SEED (default 7). Runs binaries packed
# by bench/pack_device.sh when DEVICE_DIR holds them, else the gpuphot on PATH.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
DEVICE_DIR=${DEVICE_DIR:-$HERE/../.device}
GP=gpuphot
if [ -x "$DEVICE_DIR/bin/gpuphot" ]; then
    export LD_LIBRARY_PATH="$DEVICE_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    GP="$DEVICE_DIR/bin/gpuphot"
fi
SIZE=${1:-14208x10656}; STARS=${2:-400000}; THREADS=${3:-1 8 16}; REPEAT=${4:-2}
OUT=${OUT:-$PWD/scaling-out}; WORK=${WORK:-/tmp/gpuphot-cold}; SEED=${SEED:-7}
mkdir -p "$OUT" "$WORK"
name="cold_${STARS}"
[ -f "$WORK/$name.fits" ] ||
    "$GP" simulate --size "$SIZE" --stars "$STARS" --seed "$SEED" --bitpix 16 -o "$WORK" --name "$name" -q ||
    exit 1
cat "$WORK/$name.fits" > /dev/null
echo "== $(date -u '+%Y-%m-%d %H:%M UTC') $SIZE, $STARS stars, $(nproc) cores, threads: $THREADS" |
    tee -a "$OUT/scaling.log"
for n in $THREADS; do
    "$GP" bench "$WORK/$name.fits" --backend cpu --threads "$n" --repeat "$REPEAT" --json > "$OUT/threads$n.json" ||
        { echo "threads $n failed"; exit 1; }
done
python3 - "$OUT" $THREADS <<'PY' | tee -a "$OUT/scaling.log"
import json, sys
out, ns = sys.argv[1], [int(n) for n in sys.argv[2:]]
runs = {n: json.load(open("%s/threads%d.json" % (out, n))) for n in ns}
base = runs[ns[0]]
def total(r): return r["total_seconds_best"]
for n in ns:
    r = runs[n]
    sp = total(base) / total(r)
    stages = ", ".join("%s %.1fx" % (k, base["stages"][k] / v) for k, v in r["stages"].items()
                       if v > 0 and k in base["stages"])
    print("threads %2d: %.3f s, speed-up %.2f, efficiency %.0f %% (against %d); %s" % (
        n, total(r), sp, 100.0 * sp * ns[0] / n, ns[0], stages))
PY
# LAPS=1: the detection stage's host steps at the largest thread count (GPUPHOT_DETECTION_TIMING).
if [ "${LAPS:-0}" = 1 ]; then
    n=${THREADS##* }
    GPUPHOT_DETECTION_TIMING=1 "$GP" bench "$WORK/$name.fits" --backend cpu --threads "$n" --repeat 1 2>&1 >/dev/null |
        tee -a "$OUT/scaling.log" | tail -40
fi
