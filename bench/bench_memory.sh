#!/usr/bin/env bash
# Peak host memory of `gpuphot reduce` (CPU backend) on simulated frames: /usr/bin/time -v's maximum
# resident set and the report's per-stage peak_host_bytes (VmHWM after each stage), against the resource
# bound (peak <= 4 x the frame's float32 size). No ctest.
#   bench/bench_memory.sh [GPUPHOT] [WORK]
#   GPUPHOT: the gpuphot binary (default build-memory/app/gpuphot); WORK: frames and outputs
#   (default /tmp/mem151; frames are simulated once and reused). THREADS=2 by default.
set -euo pipefail
GP=${1:-build-memory/app/gpuphot}
WORK=${2:-/tmp/mem151}
THREADS=${THREADS:-2}
mkdir -p "$WORK"
# name width height stars
FRAMES=("f38 7168 5273 50000" "f151 14208 10640 20000")
for spec in "${FRAMES[@]}"; do
    read -r name w h stars <<< "$spec"
    if [ ! -f "$WORK/$name.fits" ]; then
        "$GP" simulate --size "${w}x${h}" --stars "$stars" --seed 1 --bitpix 16 -o "$WORK" --name "$name" -q
    fi
    out="$WORK/out_$name"
    rm -rf "$out"; mkdir -p "$out"
    /usr/bin/time -v "$GP" reduce "$WORK/$name.fits" --backend cpu --threads "$THREADS" -o "$out" \
        --formats ecsv --ref "$WORK/$name.ref.fits" -q 2> "$out/time.log"
    rss_kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$out/time.log")
    wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$out/time.log")
    /usr/bin/python3 - "$out/$name.report.json" "$w" "$h" "$rss_kb" "$wall" "$name" <<'PY'
import json, sys
rep, w, h, rss_kb, wall, name = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
r = json.load(open(rep))
px = w * h
bar = 4 * 4 * px
rss = rss_kb * 1024
print("%s: %dx%d (%.1f MP), wall %s, peak RSS %.3f GB = %.1f B/px; bar 4 x float = %.3f GB -> %s" % (
    name, w, h, px / 1e6, wall, rss / 1e9, rss / px, bar / 1e9, "MET" if rss <= bar else "NOT MET"))
print("| stage | seconds | peak_host_bytes (GB) | B/px |")
print("|---|---:|---:|---:|")
for s in r.get("stages", []):
    print("| %s | %.2f | %.3f | %.1f |" % (s["stage"], s["seconds"], s["peak_host_bytes"] / 1e9, s["peak_host_bytes"] / px))
PY
done
