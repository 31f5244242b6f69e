#!/usr/bin/env bash
# Throughput of a stream of frames on one GPU, I/O included (FITS read, catalog and report
# written): N copies of a simulated frame reduced by
#   seq     one long-lived worker, one frame at a time (`reduce FRAMES --prefetch 0`, in-process)
#   pipe1   the pipelined worker (`--prefetch 1`, the default: frame N+1 read and frame N-1 written while
#           frame N is in its stages)
#   pipe2   the same with --prefetch 2
#   child1  a `-j 1` batch child, pipelined (--prefetch 1; the parent sends frames ahead)
#   j2      two pipelined children sharing the GPU (-j 2: two RunContexts, two streams/pools)
#   conc2 conc3 conc4
#           one pipelined worker with K = 2, 3, 4 frames in their stages at once (`--prefetch 2
#           --concurrent K`, in-process: K compute threads, each with its own RunContext, stream and pool)
#   cold    one `gpuphot reduce FRAME` process per image
# Runs binaries packed by bench/pack_device.sh.
#   bench/gpu_throughput.sh [SIZE] [STARS] [N] [CONFIGS]
#   (default 3912x3912 16000 20 "seq pipe1 pipe2 child1 j2 conc2 conc3 conc4 cold": the 15.3 MP frame;
#   e.g. CONFIGS "seq pipe2 conc2 conc3 conc4" for the --concurrent rows alone)
# Environment: OUT (log and JSON lines), WORK (frames), DEVICE_DIR (default .device), EXTRA (more reduce
# options), BACKEND (default cuda), NOREF=1 (no --ref: no calibration stages).
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
DEVICE_DIR=${DEVICE_DIR:-$HERE/../.device}
[ -x "$DEVICE_DIR/bin/gpuphot" ] || DEVICE_DIR=$HERE
export LD_LIBRARY_PATH="$DEVICE_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GPUPHOT_NO_TYCHO2=1
GP="$DEVICE_DIR/bin/gpuphot"
SIZE=${1:-3912x3912}; STARS=${2:-16000}; N=${3:-20}
CONFIGS=${4:-"seq pipe1 pipe2 child1 j2 conc2 conc3 conc4 cold"}
OUT=${OUT:-$PWD/throughput-out}; WORK=${WORK:-/tmp/gpuphot-thr}
BACKEND=${BACKEND:-cuda}
mkdir -p "$OUT" "$WORK/in"
LOG="$OUT/throughput.log"
now() { date +%s.%N; }
"$GP" simulate --size "$SIZE" --stars "$STARS" --seed 3 --bitpix 16 -o "$WORK" --name base -q
for i in $(seq -w 1 "$N"); do cp "$WORK/base.fits" "$WORK/in/f$i.fits"; done
ref=(--ref "$WORK/base.ref.fits")
[ -n "${NOREF:-}" ] && ref=()
common=(--backend "$BACKEND" "${ref[@]}" -q --force ${EXTRA:-})
echo "== $(date -u '+%Y-%m-%d %H:%M UTC') $N frames of $SIZE ($STARS stars), backend $BACKEND, $(nproc) cores, $("$GP" --version 2>/dev/null | head -1)" | tee -a "$LOG"

run_config() { # name -> frames/s line
    local name=$1 dir="$WORK/o-$1" t0 t1 rc
    rm -rf "$dir"; mkdir -p "$dir"
    t0=$(now)
    case "$name" in
    seq) "$GP" reduce "$WORK"/in/f*.fits --prefetch 0 "${common[@]}" -o "$dir" --jsonl "$OUT/$name.jsonl" >> "$LOG" 2>&1 ;;
    pipe1) "$GP" reduce "$WORK"/in/f*.fits --prefetch 1 "${common[@]}" -o "$dir" --jsonl "$OUT/$name.jsonl" >> "$LOG" 2>&1 ;;
    pipe2) "$GP" reduce "$WORK"/in/f*.fits --prefetch 2 "${common[@]}" -o "$dir" --jsonl "$OUT/$name.jsonl" >> "$LOG" 2>&1 ;;
    child1) "$GP" reduce "$WORK"/in/f*.fits -j 1 --prefetch 1 "${common[@]}" -o "$dir" --jsonl "$OUT/$name.jsonl" >> "$LOG" 2>&1 ;;
    j2) "$GP" reduce "$WORK"/in/f*.fits -j 2 --prefetch 1 "${common[@]}" -o "$dir" --jsonl "$OUT/$name.jsonl" >> "$LOG" 2>&1 ;;
    conc[0-9]*) "$GP" reduce "$WORK"/in/f*.fits --prefetch 2 --concurrent "${name#conc}" "${common[@]}" -o "$dir" \
                    --jsonl "$OUT/$name.jsonl" >> "$LOG" 2>&1 ;;
    cold) for f in "$WORK"/in/f*.fits; do "$GP" reduce "$f" "${common[@]}" -o "$dir" >> "$LOG" 2>&1 || exit 1; done ;;
    esac
    rc=$?
    t1=$(now)
    local same="-"
    [ "$name" != seq ] && [ -d "$WORK/o-seq" ] && {
        same=identical
        for f in "$WORK"/o-seq/*.cat.fits; do cmp -s "$f" "$dir/$(basename "$f")" || same=DIFFERENT; done
    }
    awk -v n="$N" -v a="$t0" -v b="$t1" -v c="$name" -v rc="$rc" -v s="$same" \
        'BEGIN{printf "| %s | %.2f | %.3f | %.3f | %s | %s |\n", c, b-a, n/(b-a), (b-a)/n, rc, s}' | tee -a "$LOG"
}
echo "| config | wall s | frames/s | s/frame | exit | catalogs vs seq |" | tee -a "$LOG"
echo "|---|---:|---:|---:|---:|---|" | tee -a "$LOG"
for c in $CONFIGS; do run_config "$c"; done
# Per-stage seconds of the last frame of the sequential, pipelined and concurrent runs (from its report).
for c in seq pipe1 conc3 conc4 conc6; do
    r="$WORK/o-$c/f$(seq -w 1 "$N" | tail -1).report.json"
    [ -f "$r" ] && python3 -c "
import json,sys
j=json.load(open(sys.argv[1]))
print(sys.argv[2], '%s sources:' % j.get('counts', {}).get('sources', '?'),
      ' '.join('%s=%.3f'%(s['stage'],s['seconds']) for s in j.get('stages',[])))" "$r" "$c" 2>/dev/null | tee -a "$LOG"
done
for c in seq pipe1 conc2 conc3 conc4 conc6; do
    [ -f "$OUT/$c.jsonl" ] && awk -v c="$c" -F'"seconds": ?' 'NF>1{split($2,a,/[,}]/); s+=a[1]; n++} END{if(n) printf "%s: mean per-frame seconds (read+compute+write of one frame) %.3f over %d\n", c, s/n, n}' "$OUT/$c.jsonl" | tee -a "$LOG"
done
rm -rf "$WORK"
