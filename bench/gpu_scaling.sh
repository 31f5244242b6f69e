#!/usr/bin/env bash
# Scaling of a night's stream over the GPUs of one host: the same frames (copies of one simulated frame, read
# from the page cache) reduced by `reduce DIR -j N`, one worker child per GPU, for N = 1, 2, 4, 8 GPUs
# (CUDA_VISIBLE_DEVICES=0..N-1; counts above the visible GPUs are skipped and said so). Prints the scaling
# table: wall seconds, frames/s, speed-up and efficiency against N times the 1-GPU rate, and whether every
# catalog is byte for byte the 1-GPU run's. Then the page cache's and the disk's read rate of the frames, so
# that a bound by I/O shows. Last, a mosaic exposure (MOSAIC_CCDS CCDs of 2048 x 4096, default 60; 0: none)
# spread over G GPUs by one process (`reduce --ccd-gpus G`, bench/bench_mosaic.sh: warm seconds per
# exposure), its catalog compared byte for byte with G = 1's.
#   bench/gpu_scaling.sh [SIZE] [STARS] [FRAMES] [COUNTS]
#   (default 3912x3912 16000 100 "1 2 4 8": 15.3 MP frames; 151 MP: 14208x10656 134000 40)
# Runs binaries packed by bench/pack_device.sh. Environment: DEVICE_DIR (default .device), OUT (log),
# WORK (frames and catalogs, removed at the end), EXTRA (more reduce options, e.g. "--concurrent 4" for each
# worker), NOREF=1 (no --ref: no calibration stages).
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
DEVICE_DIR=${DEVICE_DIR:-$HERE/../.device}
[ -x "$DEVICE_DIR/bin/gpuphot" ] || DEVICE_DIR=$HERE
export LD_LIBRARY_PATH="$DEVICE_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GPUPHOT_NO_TYCHO2=1
GP="$DEVICE_DIR/bin/gpuphot"
SIZE=${1:-3912x3912}; STARS=${2:-16000}; N=${3:-100}; COUNTS=${4:-"1 2 4 8"}
OUT=${OUT:-$PWD/scaling-out}; WORK=${WORK:-/tmp/gpuphot-scaling}
[ -x "$GP" ] || { echo "gpu_scaling.sh: no gpuphot in $DEVICE_DIR/bin (bench/pack_device.sh)" >&2; exit 2; }
command -v nvidia-smi > /dev/null || { echo "gpu_scaling.sh: nvidia-smi not found: no GPU driver" >&2; exit 2; }
GPUS=$(nvidia-smi -L | grep -c '^GPU ')
[ "$GPUS" -ge 1 ] || { echo "gpu_scaling.sh: no GPU visible" >&2; exit 2; }
mkdir -p "$OUT" "$WORK/in"
LOG="$OUT/scaling.log"
now() { date +%s.%N; }
"$GP" simulate --size "$SIZE" --stars "$STARS" --seed 3 --bitpix 16 -o "$WORK" --name base -q || exit 1
for i in $(seq -w 1 "$N"); do cp "$WORK/base.fits" "$WORK/in/f$i.fits"; done
ref=(--ref "$WORK/base.ref.fits")
[ -n "${NOREF:-}" ] && ref=()
# shellcheck disable=SC2206 # EXTRA: options split on purpose
common=(--backend cuda "${ref[@]}" -q --force --formats csv ${EXTRA:-})
echo "== $(date -u '+%Y-%m-%d %H:%M UTC') $N frames of $SIZE ($STARS stars), $GPUS GPUs ($(nvidia-smi -L | head -1 |
    sed 's/ (UUID.*//')), $(nproc) cores, extra: ${EXTRA:-none}" | tee -a "$LOG"
cat "$WORK"/in/*.fits > /dev/null # into the page cache

base_rate=""
echo "| GPUs | wall s | frames/s | speed-up | efficiency | catalogs vs 1 GPU |" | tee -a "$LOG"
echo "|---:|---:|---:|---:|---:|---|" | tee -a "$LOG"
for g in $COUNTS; do
    if [ "$g" -gt "$GPUS" ]; then
        echo "| $g | - | - | - | - | not run: $GPUS GPUs visible |" | tee -a "$LOG"
        continue
    fi
    dir="$WORK/o-$g"
    rm -rf "$dir"; mkdir -p "$dir"
    visible=$(seq -s, 0 $((g - 1)))
    t0=$(now)
    CUDA_VISIBLE_DEVICES=$visible "$GP" reduce "$WORK/in" -j "$g" "${common[@]}" -o "$dir" >> "$LOG" 2>&1
    rc=$?
    t1=$(now)
    same="-"
    if [ "$rc" -ne 0 ]; then
        same="exit $rc"
    elif [ -d "$WORK/o-1" ] && [ "$g" != 1 ]; then
        total=0; equal=0
        for f in "$WORK"/o-1/*.cat.csv; do
            total=$((total + 1))
            cmp -s "$f" "$dir/$(basename "$f")" && equal=$((equal + 1))
        done
        same="$equal of $total identical"
    fi
    rate=$(awk -v n="$N" -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", n/(b-a)}')
    [ "$g" = 1 ] && base_rate=$rate
    awk -v g="$g" -v a="$t0" -v b="$t1" -v r="$rate" -v r1="$base_rate" -v s="$same" 'BEGIN{
        if (r1 != "") printf "| %d | %.2f | %.2f | %.2f | %.0f %% | %s |\n", g, b-a, r, r/r1, 100*r/(g*r1), s;
        else printf "| %d | %.2f | %.2f | - | - | %s |\n", g, b-a, r, s }' | tee -a "$LOG"
done

# What reading the frames costs: from the page cache, then (where the caches can be dropped) from the disk.
bytes=$(cat "$WORK"/in/*.fits | wc -c)
t0=$(now); cat "$WORK"/in/*.fits > /dev/null; t1=$(now)
awk -v b="$bytes" -v a="$t0" -v c="$t1" -v n="$N" \
    'BEGIN{printf "page cache: %.0f MB/s (%.0f frames/s)\n", b/(c-a)/1e6, n/(c-a)}' | tee -a "$LOG"
if sync && echo 3 > /proc/sys/vm/drop_caches 2> /dev/null; then
    t0=$(now); cat "$WORK"/in/*.fits > /dev/null; t1=$(now)
    awk -v b="$bytes" -v a="$t0" -v c="$t1" -v n="$N" \
        'BEGIN{printf "disk: %.0f MB/s (%.0f frames/s)\n", b/(c-a)/1e6, n/(c-a)}' | tee -a "$LOG"
else
    echo "disk: not measured (the page cache cannot be dropped here)" | tee -a "$LOG"
fi
MOSAIC_CCDS=${MOSAIC_CCDS:-60}
if [ "$MOSAIC_CCDS" -gt 0 ]; then
    echo "mosaic exposure: $MOSAIC_CCDS CCDs of 2048x4096, one process, --ccd-gpus G" | tee -a "$LOG"
    echo "| GPUs | warm s per exposure | speed-up | efficiency | catalog vs 1 GPU |" | tee -a "$LOG"
    echo "|---:|---:|---:|---:|---|" | tee -a "$LOG"
    base=""
    for g in $COUNTS; do
        [ "$g" -gt "$GPUS" ] && { echo "| $g | - | - | - | not run: $GPUS GPUs visible |" | tee -a "$LOG"; continue; }
        mo="$OUT/mosaic-$g"
        bash "$HERE/bench_mosaic.sh" -g "$GP" -n "$MOSAIC_CCDS" --stars 2000 --repeat 3 --ccd-gpus "$g" \
            --no-separate -w "$WORK/mosaic" -o "$mo" >> "$LOG" 2>&1 || { echo "| $g | failed |" | tee -a "$LOG"; continue; }
        s=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["exposure_warm_s"])' "$mo/mosaic_bench.json")
        [ "$g" = 1 ] && base=$s
        same="-"
        [ "$g" != 1 ] && [ -f "$OUT/mosaic-1/exp1.cat.fits" ] &&
            { cmp -s "$OUT/mosaic-1/exp1.cat.fits" "$mo/exp1.cat.fits" && same=identical || same=DIFFERENT; }
        awk -v g="$g" -v s="$s" -v b="$base" -v same="$same" 'BEGIN{
            if (b != "") printf "| %d | %.3f | %.2f | %.0f %% | %s |\n", g, s, b/s, 100*b/(g*s), same;
            else printf "| %d | %.3f | - | - | %s |\n", g, s, same }' | tee -a "$LOG"
    done
fi
rm -rf "$WORK"
