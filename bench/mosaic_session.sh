#!/usr/bin/env bash
# Mosaic exposures on a GPU machine that has only the driver (binaries from bench/pack_device.sh in
# DEVICE_DIR, default .device):
#   1. bench_mosaic.sh on a simulated exposure of CCDS CCDs of 2048 x 4096 (STARS stars each) with
#      --ccds-at-once K for K in KS (default "4 8 12 16"): the exposure warm against its CCDs as separate warm reductions, the
#      zero point and per-CCD offsets against the truth;
#   2. CUDA = CPU: the exposure's catalog (CSV) from both backends, compared byte for byte; and its rows
#      against its CCDs reduced alone as 60 frames (compare_exposure_csv.py);
#   3. the exposure's report (per-CCD numbers) and nvidia-smi.
# OUT (default ./mosaic-session-out) gets: session.log, mosaic_bench.jsonl (one line per K),
# identity.txt, exposure.report.json, nvidia-smi.txt. WORK (default /tmp/gpuphot-mosaic) holds the frames.
#   bench/mosaic_session.sh [CCDS] [STARS]     (defaults 60 and 4000)
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
DEVICE_DIR=${DEVICE_DIR:-$HERE/../.device}
export LD_LIBRARY_PATH="$DEVICE_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
G="$DEVICE_DIR/bin/gpuphot"
OUT=${OUT:-./mosaic-session-out}
WORK=${WORK:-/tmp/gpuphot-mosaic}
CCDS=${1:-60} STARS=${2:-4000}
mkdir -p "$OUT" "$WORK"
exec > >(tee -a "$OUT/session.log") 2>&1
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
echo "== mosaic session: $CCDS CCDs of 2048x4096, $STARS stars each; $(date -u)"
for k in ${KS:-4 8 12 16}; do
    echo "== --ccds-at-once $k"
    "$HERE/bench_mosaic.sh" -g "$G" -n "$CCDS" --stars "$STARS" -w "$WORK" -o "$WORK/out-k$k" --ccds-at-once "$k" --repeat "${REPEAT:-3}"
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d))" \
        "$WORK/out-k$k/mosaic_bench.json" >> "$OUT/mosaic_bench.jsonl"
done
sim="$WORK/${CCDS}x2048x4096_${STARS}"
cp "$(ls "$WORK"/o-exp/exp*.report.json | sort -V | tail -1)" "$OUT/exposure.report.json"
echo "== CUDA = CPU"
for b in cuda cpu; do
    /usr/bin/time -f "$b reduce wall %e s, max RSS %M KB" "$G" reduce "$sim/mos.fits" --ref "$sim/mos.ref.fits" \
        --no-tycho2 --backend "$b" -o "$WORK/id-$b" --formats csv -q --force
done
if cmp "$WORK/id-cuda/mos.cat.csv" "$WORK/id-cpu/mos.cat.csv"; then
    echo "identical: $(wc -l < "$WORK/id-cuda/mos.cat.csv") lines" | tee "$OUT/identity.txt"
else
    echo "DIFFERENT" | tee "$OUT/identity.txt"
fi
echo "== the exposure's rows against its CCDs reduced alone (CUDA)"
singles=()
for ((k = 1; k <= CCDS; k++)); do singles+=("$sim/mos.fits[$k]"); done
"$G" reduce "${singles[@]}" --ref "$sim/mos.ref.fits" --no-tycho2 --backend cuda -o "$WORK/id-alone" --formats csv -q \
    --force 2>/dev/null
python3 "$HERE/compare_exposure_csv.py" "$WORK/id-cuda/mos.cat.csv" "$WORK/id-alone" mos | tee -a "$OUT/identity.txt"
echo "== done $(date -u)"
