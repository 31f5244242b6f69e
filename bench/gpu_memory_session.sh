#!/usr/bin/env bash
# GPU memory budget session, on a GPU machine with binaries packed by
# bench/pack_device.sh into .device/: the kernels tests, compute-sanitizer memcheck on the strip and
# fault-injection tests, then one simulated frame reduced with --backend cuda unsplit and under
# --gpu-mem-limit budgets (catalogs compared with cmp, per-stage plans / peak GPU memory / times from the
# JSON reports), and GPUPHOT_TEST_CUDA_FAIL_ALLOC through gpuphot-testhooks on a small frame.
#   bench/gpu_memory_session.sh [SIZE] [STARS] [LIMIT ...]   (default 14208x10656 20000 4G 1G)
# Order: kernels tests, CLI fault injection, the large frame, memcheck last (until DEADLINE s, default 280).
# OUT (default ./gpu-memory-out) gets session.log, kernels_tests.log, memcheck.log, reports.jsonl.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
DEVICE_DIR=${DEVICE_DIR:-$HERE/../.device}
OUT=${OUT:-$PWD/gpu-memory-out}
WORK=${WORK:-/tmp/gpuphot-mem}
mkdir -p "$OUT" "$WORK"
export LD_LIBRARY_PATH="$DEVICE_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
GP="$DEVICE_DIR/bin/gpuphot"
GPH="$DEVICE_DIR/bin/gpuphot-testhooks" # the test build's CLI: fault injection from the environment
KT="$DEVICE_DIR/bin/kernels_tests"
LOG="$OUT/session.log"
SIZE=${1:-14208x10656}
STARS=${2:-20000}
shift 2 2>/dev/null
LIMITS=("$@")
[ ${#LIMITS[@]} -eq 0 ] && LIMITS=(4G 1G)
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$LOG"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.2f", b - a}'; }
# Per stage: plan, strips, GPU high water (MB) and seconds, from a report.
stages() {
    /usr/bin/env python3 - "$1" <<'EOF' 2>/dev/null || grep -o '"stage"[^}]*' "$1"
import json, sys
r = json.load(open(sys.argv[1]))
for s in r["stages"]:
    print("  %-26s %-7s strips=%-3s hw=%8.1f MB  %.3f s %s" % (s["stage"], s.get("gpu_plan", "-"), s.get("gpu_strips", "-"),
          s.get("device_high_water_bytes", 0) / 2**20, s["seconds"], s.get("gpu_note", "")))
print("  total %.3f s, sources %d, warnings %s" % (r["total_seconds"], r["counts"]["sources"], r["warnings"]))
EOF
}

nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv | tee -a "$LOG"
log "kernels_tests"
timeout "${KT_TIMEOUT:-100}" "$KT" > "$OUT/kernels_tests.log" 2>&1
log "kernels_tests exit $? ($(grep -c '^\[       OK' "$OUT/kernels_tests.log") ok, $(grep -c '^\[  FAILED' "$OUT/kernels_tests.log") failed lines)"
grep -E '^\[  FAILED|^\[  PASSED|Failure|error' "$OUT/kernels_tests.log" | head -40 | tee -a "$LOG"
# CLI fault injection on a small frame: catalogs equal to the clean run.
"$GP" simulate --size 1024x1024 --stars 800 --seed 3 --bitpix 16 -o "$WORK" --name small -q >> "$LOG" 2>&1
for n in 0 1 4 9 25; do
    rm -rf "$WORK/s$n"; mkdir -p "$WORK/s$n"
    GPUPHOT_TEST_CUDA_FAIL_ALLOC=$n "$GPH" reduce "$WORK/small.fits" --backend cuda --no-tycho2 --formats ecsv \
        -o "$WORK/s$n" -q >> "$LOG" 2>&1
    rc=$?
    same=$(cmp -s "$WORK/s0/small.cat.ecsv" "$WORK/s$n/small.cat.ecsv" && echo identical || echo DIFFERENT)
    log "GPUPHOT_TEST_CUDA_FAIL_ALLOC=$n reduce exit $rc, catalog $same"
    [ "$n" != 0 ] && stages "$WORK/s$n/small.report.json" | grep -v ' - ' | tee -a "$LOG"
done

log "simulate $SIZE, $STARS stars"
t0=$(now)
"$GP" simulate --size "$SIZE" --stars "$STARS" --seed 1 --bitpix 16 -o "$WORK" --name big -q >> "$LOG" 2>&1 ||
    log "simulate failed"
log "simulated in $(since "$t0") s"
for limit in "" "${LIMITS[@]}"; do
    d="$WORK/out${limit:-none}"
    rm -rf "$d"; mkdir -p "$d"
    t0=$(now)
    "$GP" reduce "$WORK/big.fits" --backend cuda ${limit:+--gpu-mem-limit "$limit"} --no-tycho2 --formats ecsv \
        -o "$d" -q >> "$LOG" 2>&1
    rc=$?
    log "reduce --gpu-mem-limit ${limit:-none}: exit $rc, cold wall $(since "$t0") s"
    [ -f "$d/big.report.json" ] && { stages "$d/big.report.json" | tee -a "$LOG";
        tr -d '\n' < "$d/big.report.json" >> "$OUT/reports.jsonl"; echo >> "$OUT/reports.jsonl"; }
    if [ -n "$limit" ]; then
        cmp "$WORK/outnone/big.cat.ecsv" "$d/big.cat.ecsv" && log "catalog identical to unsplit" || log "catalog DIFFERS from unsplit"
    fi
done
if command -v compute-sanitizer > /dev/null; then
    log "memcheck on the strip / fallback / fault-injection tests"
    timeout "$(( ${DEADLINE:-280} - SECONDS > 15 ? ${DEADLINE:-280} - SECONDS : 15 ))" compute-sanitizer --tool memcheck --error-exitcode 3 "$KT" \
        --gtest_filter='CudaMemory.*Strips*:CudaMemory.TooSmall*:CudaMemory.StagesUnderBudget*:CudaMemory.FailAfter*' \
        > "$OUT/memcheck.log" 2>&1
    log "memcheck exit $?"
    tail -n 4 "$OUT/memcheck.log" | tee -a "$LOG"
else
    log "compute-sanitizer not found"
fi

log "done"
