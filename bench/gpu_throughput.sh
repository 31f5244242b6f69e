#!/usr/bin/env bash
# Throughput of a stream of frames on one GPU (issue 7): N copies of a simulated frame reduced
#   (a) by one long-lived batch worker (`gpuphot reduce FRAMES -j 1 --backend cuda`: one child process
#       keeps its CUDA context and pool warm), and
#   (b) by one `gpuphot reduce FRAME` process per image (cold each time),
# I/O included (FITS read, catalog and report written). Runs binaries packed by bench/pack_device.sh.
#   bench/gpu_throughput.sh [SIZE] [STARS] [N]      (default 3912x3912 16000 20: the 15.3 MP frame)
# Environment: OUT (log and JSON lines), WORK (frames), DEVICE_DIR (default .device), EXTRA (more reduce
# options, e.g. "--ref ..."), BACKEND (default cuda).
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
DEVICE_DIR=${DEVICE_DIR:-$HERE/../.device}
[ -x "$DEVICE_DIR/bin/gpuphot" ] || DEVICE_DIR=$HERE
export LD_LIBRARY_PATH="$DEVICE_DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
GP="$DEVICE_DIR/bin/gpuphot"
SIZE=${1:-3912x3912}; STARS=${2:-16000}; N=${3:-20}
OUT=${OUT:-$PWD/throughput-out}; WORK=${WORK:-/tmp/gpuphot-thr}
BACKEND=${BACKEND:-cuda}
mkdir -p "$OUT" "$WORK/in"
LOG="$OUT/throughput.log"
now() { date +%s.%N; }
"$GP" simulate --size "$SIZE" --stars "$STARS" --seed 3 --bitpix 16 -o "$WORK" --name base -q
for i in $(seq -w 1 "$N"); do cp "$WORK/base.fits" "$WORK/in/f$i.fits"; done
ref=(--ref "$WORK/base.ref.fits")
rm -rf "$WORK/o1" "$WORK/o2"; mkdir -p "$WORK/o1" "$WORK/o2"
t0=$(now)
"$GP" reduce "$WORK"/in/f*.fits -j 1 --backend "$BACKEND" "${ref[@]}" -o "$WORK/o1" -q --jsonl "$OUT/warm.jsonl" ${EXTRA:-} >> "$LOG" 2>&1
rc=$?
t1=$(now)
for f in "$WORK"/in/f*.fits; do
    "$GP" reduce "$f" --backend "$BACKEND" "${ref[@]}" -o "$WORK/o2" -q ${EXTRA:-} >> "$LOG" 2>&1
done
t2=$(now)
warm=$(awk -v a="$t0" -v b="$t1" -v n="$N" 'BEGIN{printf "%.3f", n/(b-a)}')
cold=$(awk -v a="$t1" -v b="$t2" -v n="$N" 'BEGIN{printf "%.3f", n/(b-a)}')
same=$(cmp -s "$WORK/o1/f01.cat.fits" "$WORK/o2/f01.cat.fits" && echo identical || echo different)
echo "frames $N of $SIZE ($STARS stars), backend $BACKEND: warm batch worker $warm frames/s (exit $rc, $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b-a}') s); one process per image $cold frames/s ($(awk -v a="$t1" -v b="$t2" 'BEGIN{printf "%.2f", b-a}') s); first catalog $same" | tee -a "$LOG"
grep -h '"seconds"' "$OUT/warm.jsonl" | head -3 | cut -c1-400 >> "$LOG"
rm -rf "$WORK"
