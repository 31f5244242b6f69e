#!/usr/bin/env bash
# A refactoring's acceptance on the GPU machine: this tree's catalogs against a reference build's, byte for
# byte, CPU and CUDA, and `gpuphot bench` of both binaries in the same call (alternating, best of each).
#   bench/identity_session.sh [FRAME ...]   (default: demo 2048 15mp_16k 151mp_134k)
# Binaries (bench/pack_device.sh, then copied in by hand): DEVICE_DIR/bin/gpuphot (this tree),
# DEVICE_DIR/bin/gpuphot-ref (the reference, CUDA build) and/or gpuphot-ref-cpu (a CPU-only build).
# CONFIG_NEW: a config for this tree's runs that turns off intended catalog changes (empty: none).
# OUT (default ./identity-out): identity.log and bench.jsonl. WORK (default /tmp/gpuphot-identity): frames.
# SKIP_TESTS=1 skips kernels_tests; BENCH_REPEATS (default 3) alternating bench rounds on the largest frame.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
DEVICE_DIR=${DEVICE_DIR:-$HERE/../.device}
OUT=${OUT:-./identity-out}
WORK=${WORK:-/tmp/gpuphot-identity}
mkdir -p "$OUT" "$WORK"
export LD_LIBRARY_PATH="$DEVICE_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
LOG="$OUT/identity.log"
: > "$LOG"
log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$LOG"; }
GP="$DEVICE_DIR/bin/gpuphot"
REF="$DEVICE_DIR/bin/gpuphot-ref"
REFCPU="$DEVICE_DIR/bin/gpuphot-ref-cpu"
[ -x "$REFCPU" ] || REFCPU="$REF"
declare -A SIZE=([demo]="" [2048]="2048x2048 3000" [15mp_16k]="3912x3912 16000" [151mp_134k]="14208x10656 134000")
FRAMES=("$@")
[ ${#FRAMES[@]} -eq 0 ] && FRAMES=(demo 2048 15mp_16k 151mp_134k)
newcfg=()
[ -n "${CONFIG_NEW:-}" ] && newcfg=(--config "$CONFIG_NEW")

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee -a "$LOG"
if [ -z "${SKIP_TESTS:-}" ]; then
    log "kernels_tests"
    timeout 400 "$DEVICE_DIR/bin/kernels_tests" > "$OUT/kernels_tests.log" 2>&1
    log "kernels_tests exit $? ($(grep -c '^\[       OK' "$OUT/kernels_tests.log") ok, $(grep -c '^\[  FAILED' "$OUT/kernels_tests.log") failed)"
    grep -E '^\[  FAILED|^\[  PASSED' "$OUT/kernels_tests.log" | head -20 | tee -a "$LOG"
fi

status=0
for f in "${FRAMES[@]}"; do
    if [ "$f" = demo ]; then
        "$GP" simulate --config "$HERE/../resources/demo/simulate.json" -o "$WORK" --name demo -q >> "$LOG" 2>&1
    else
        read -r size stars <<< "${SIZE[$f]}"
        "$GP" simulate --size "$size" --stars "$stars" --seed 1 --bitpix 16 -o "$WORK" --name "$f" -q >> "$LOG" 2>&1
    fi
    ref=()
    [ -f "$WORK/$f.ref.fits" ] && ref=(--ref "$WORK/$f.ref.fits")
    run() { # binary backend dir [config...]
        local bin=$1 backend=$2 dir=$3; shift 3
        rm -rf "$dir"; mkdir -p "$dir"
        local t0=$(date +%s%N)
        "$bin" reduce "$WORK/$f.fits" "${ref[@]}" --no-tycho2 --backend "$backend" --formats csv -o "$dir" -q "$@" \
            >> "$LOG" 2>&1
        local rc=$?
        log "$f $(basename "$bin") $backend: exit $rc, $(( ($(date +%s%N) - t0) / 1000000 )) ms"
    }
    run "$REFCPU" cpu "$WORK/$f.refcpu"
    run "$GP" cpu "$WORK/$f.newcpu" "${newcfg[@]}"
    run "$GP" cuda "$WORK/$f.newcuda" "${newcfg[@]}"
    [ -x "$REF" ] && run "$REF" cuda "$WORK/$f.refcuda"
    if cmp -s "$WORK/$f.newcpu/$f.cat.csv" "$WORK/$f.newcuda/$f.cat.csv"; then
        log "$f: this tree's CUDA = its CPU, byte for byte"
    else
        log "$f: this tree's CUDA DIFFERS from its CPU"; status=1
    fi
    for d in newcpu newcuda refcuda; do
        [ -f "$WORK/$f.$d/$f.cat.csv" ] || continue
        if cmp -s "$WORK/$f.refcpu/$f.cat.csv" "$WORK/$f.$d/$f.cat.csv"; then
            log "$f: $d = reference CPU, byte for byte ($(wc -l < "$WORK/$f.$d/$f.cat.csv") lines)"
        else
            log "$f: $d DIFFERS from the reference CPU catalog"; status=1
        fi
    done
    last=$f
done

# The bench of both binaries, alternating, on the last frame (read included, warm, best of --repeat 5).
if [ -x "$REF" ]; then
    for r in $(seq "${BENCH_REPEATS:-3}"); do
        order=("$GP" "$REF")
        [ $((r % 2)) = 0 ] && order=("$REF" "$GP") # alternate which binary runs first
        for b in "${order[@]}"; do
            "$b" bench "$WORK/$last.fits" --backend cuda --repeat 5 --json -o "$WORK" 2>> "$LOG" |
                python3 -c "import json,sys; d=json.load(sys.stdin); print(json.dumps({'binary': '$(basename "$b")', 'round': $r, 'report': d}))" \
                >> "$OUT/bench.jsonl"
        done
    done
    python3 - "$OUT/bench.jsonl" <<'PY' | tee -a "$LOG"
import json, sys
best = {}
for line in open(sys.argv[1]):
    d = json.loads(line)
    r = d["report"]
    t = r["total_seconds_best"]
    best.setdefault(d["binary"], []).append(t)
for b, ts in best.items():
    print("bench %s: totals %s, best %.4f s" % (b, " ".join("%.4f" % t for t in ts), min(ts)))
if len(best) == 2:
    a, b = (min(v) for v in best.values())
    print("ratio %s / %s: %.3f" % (tuple(best)[0], tuple(best)[1], a / b))
PY
fi
exit $status
