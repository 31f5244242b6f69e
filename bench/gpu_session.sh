#!/usr/bin/env bash
# One GPU session on a machine that has only the CUDA driver, running binaries built elsewhere
# (bench/pack_device.sh puts gpuphot, kernels_tests and their shared libraries into .device/):
#   1. kernels_tests (CPU vs CUDA, determinism, memory budget), then the small-frame tests under
#      compute-sanitizer memcheck and racecheck (when the tool is there and accepts the device);
#   2. per frame: `gpuphot simulate` here, `gpuphot bench FRAME --backend cuda --repeat 3 --json` and the
#      same with --backend cpu; the frame is deleted afterwards.
# Frames (bench/run_benchmarks.py's orientation set): 4mp_300 15mp_16k 38mp_1k 151mp_20k 151mp_134k.
#   bench/gpu_session.sh [FRAME ...]        (default: all five; "none": tests only)
# Environment: OUT (default ./gpu-session-out) gets at most 6 files: session.log, nvidia-smi.txt,
# kernels_tests.xml, memcheck.log, racecheck.log, bench.jsonl (one JSON object per line:
# {"frame", "backend", "report"}). WORK (default /tmp/gpuphot-gpu) holds the simulated frames.
# SKIP_TESTS=1 skips step 1; SANITIZER_TIMEOUT (s, default 900) bounds each sanitizer run.
# DEVICE_DIR (default: .device beside this script's repository, or this script's folder).
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
if [ -z "${DEVICE_DIR:-}" ]; then
    if [ -x "$HERE/bin/gpuphot" ]; then DEVICE_DIR="$HERE"; else DEVICE_DIR="$HERE/../.device"; fi
fi
DEVICE_DIR="$(cd "$DEVICE_DIR" && pwd)"
OUT=${OUT:-$PWD/gpu-session-out}
WORK=${WORK:-/tmp/gpuphot-gpu}
mkdir -p "$OUT" "$WORK"
export LD_LIBRARY_PATH="$DEVICE_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
GP="$DEVICE_DIR/bin/gpuphot"
KT="$DEVICE_DIR/bin/kernels_tests"
LOG="$OUT/session.log"
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$LOG"; }

declare -A FRAMES=(
    [4mp_300]="2048x2048 300"
    [15mp_16k]="3912x3912 16000"
    [38mp_1k]="7168x5273 1000"
    [151mp_20k]="14208x10656 20000"
    [151mp_134k]="14208x10656 134000"
)
ORDER=(4mp_300 15mp_16k 38mp_1k 151mp_20k 151mp_134k)
if [ $# -gt 0 ]; then ORDER=("$@"); fi
[ "${ORDER[0]}" = none ] && ORDER=()

log "device dir $DEVICE_DIR, out $OUT"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || log "nvidia-smi failed"
ldd "$GP" >> "$LOG" 2>&1
"$GP" info --help > /dev/null 2>&1 || log "gpuphot does not start (see ldd above)"

# 1. Tests (SKIP_TESTS=1: benchmarks only).
if [ -z "${SKIP_TESTS:-}" ]; then
log "kernels_tests"
"$KT" --gtest_output="xml:$OUT/kernels_tests.xml" 2>&1 | tee -a "$LOG" | tail -n 30
log "kernels_tests exit ${PIPESTATUS[0]}"
SMALL='CudaStages.BackgroundMatchesCpuOnRandomFrames:CudaStages.InvalidParameters*:CudaStages.TinyMemory*:CudaStages.FrameUploaded*:ApertureCuda.LocalSkyPieces*'
if command -v compute-sanitizer > /dev/null; then
    for tool in memcheck racecheck; do
        log "compute-sanitizer --tool $tool ($SMALL)"
        timeout "${SANITIZER_TIMEOUT:-900}" compute-sanitizer --tool "$tool" --error-exitcode 3 "$KT" --gtest_filter="$SMALL" \
            > "$OUT/$tool.log" 2>&1
        log "compute-sanitizer $tool exit $? ($(grep -c 'ERROR SUMMARY\|========= Error\|Race reported' "$OUT/$tool.log") summary/error lines)"
        tail -n 5 "$OUT/$tool.log" | tee -a "$LOG"
    done
else
    log "compute-sanitizer not found: sanitizer runs skipped"
fi
fi

# 2. Benchmarks.
for name in "${ORDER[@]}"; do
    spec=${FRAMES[$name]:-}
    if [ -z "$spec" ]; then log "unknown frame $name"; continue; fi
    read -r size stars <<< "$spec"
    frame="$WORK/$name.fits"
    if [ ! -f "$frame" ]; then
        log "simulate $name: $size, $stars stars"
        t0=$(date +%s.%N)
        "$GP" simulate --size "$size" --stars "$stars" --seed 1 --bitpix 16 -o "$WORK" --name "$name" -q \
            >> "$LOG" 2>&1 || { log "simulate $name failed"; continue; }
        log "simulated in $(awk -v a="$t0" -v b="$(date +%s.%N)" "BEGIN{printf \"%.2f\", b - a}") s"
    fi
    for backend in cuda cpu; do
        log "bench $name --backend $backend --repeat 3"
        t0=$(date +%s.%N)
        json=$("$GP" bench "$frame" --backend "$backend" --repeat 3 --json 2>> "$LOG")
        rc=$?
        log "bench $name $backend exit $rc, wall $(awk -v a="$t0" -v b="$(date +%s.%N)" "BEGIN{printf \"%.2f\", b - a}") s"
        if [ $rc -eq 0 ] && [ -n "$json" ]; then
            printf '{"frame": "%s", "backend": "%s", "report": %s}\n' "$name" "$backend" "$(echo "$json" | tr -d '\n')" >> "$OUT/bench.jsonl"
            echo "$json" | head -c 3000 >> "$LOG"
            echo >> "$LOG"
        fi
    done
    # One reduce per frame for the report's per-stage GPU memory checkpoints, and the budget behaviour.
    for limit in "" 4G 2G; do
        case "$name:$limit" in 151mp*:*|*:) ;; *) continue ;; esac
        log "reduce $name --backend cuda ${limit:+--gpu-mem-limit $limit}"
        rm -rf "$WORK/out"
        mkdir -p "$WORK/out"
        t0=$(date +%s.%N)
        "$GP" reduce "$frame" --backend cuda ${limit:+--gpu-mem-limit "$limit"} -o "$WORK/out" -q >> "$LOG" 2>&1
        rc=$?
        log "reduce exit $rc, cold wall (process start, CUDA context, FITS read, all stages, outputs) $(awk -v a="$t0" -v b="$(date +%s.%N)" "BEGIN{printf \"%.2f\", b - a}") s"
        if [ -z "$limit" ]; then
            t0=$(date +%s.%N)
            "$GP" reduce "$frame" --backend cpu -o "$WORK/out" -q >> "$LOG" 2>&1
            log "reduce --backend cpu exit $?, cold wall $(awk -v a="$t0" -v b="$(date +%s.%N)" "BEGIN{printf \"%.2f\", b - a}") s"
        fi
        rep=$(ls "$WORK"/out/*.report.json 2>/dev/null | head -1)
        if [ -n "$rep" ]; then
            printf '{"frame": "%s", "backend": "cuda-reduce", "gpu_mem_limit": "%s", "report": %s}\n' \
                "$name" "$limit" "$(tr -d '\n' < "$rep")" >> "$OUT/bench.jsonl"
            grep -o '"device_high_water_bytes": *[0-9]*' "$rep" | tr '\n' ' ' >> "$LOG"
            echo >> "$LOG"
        fi
    done
    rm -rf "$WORK/out"
    rm -f "$WORK/$name".*
done
log "done"
