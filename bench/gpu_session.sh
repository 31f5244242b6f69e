#!/usr/bin/env bash
# One GPU session on a machine that has only the CUDA driver, running binaries built elsewhere
# (bench/pack_device.sh puts gpuphot, kernels_tests, bench_sep and their shared libraries into .device/):
#   1. kernels_tests (CPU vs CUDA, determinism, memory budget), then the small-frame tests under
#      compute-sanitizer memcheck and racecheck (when the tool is there and accepts the device);
#   2. per frame: `gpuphot simulate` here, `gpuphot bench FRAME --backend cuda --repeat 3 --json` and the
#      same with --backend cpu, one cold `gpuphot reduce` per backend (151 MP: also under --gpu-mem-limit 4G,
#      2G and 1G, each catalog compared with the unlimited one), the CUDA and CPU CSV catalogs compared, then
#      sep's C core on the same file (bench_sep, single-threaded; source-extractor through peers.py only
#      where it is installed); the frame is deleted afterwards;
#   3. the summary: per frame our per-stage times (warm), total warm, cold reduce, peak GPU and host memory,
#      sep's background / extract / apertures / total and the ratios (sep_summary.md, sep_summary.json).
# Frames (the reference set): 4mp_300 15mp_16k 38mp_1k 151mp_20k 151mp_134k.
#   bench/gpu_session.sh [FRAME ...]        (default: all five; "none": tests only)
#   bench/gpu_session.sh --summary BENCH.jsonl [DIR]   (only re-render the summary, into DIR)
# Environment: OUT (default ./gpu-session-out) gets at most 8 files: session.log, nvidia-smi.txt,
# kernels_tests.xml, memcheck.log, racecheck.log, bench.jsonl (one JSON object per line:
# {"frame", "backend", "report"}: backend cuda / cpu (gpuphot bench), cuda-reduce (the report of a cold
# reduce, with cold_wall_s and gpu_mem_limit), cpu-reduce (cold_wall_s), sep (bench_sep, with size and
# stars), sex), sep_summary.md, sep_summary.json. WORK (default /tmp/gpuphot-gpu) holds the frames.
# SKIP_TESTS=1 skips step 1; SANITIZER_TIMEOUT (s, default 900) bounds each sanitizer run; SEP_REPEAT
# (default 3) and SEP_REPEAT_LARGE (default 1, frames over 100 MP: sep takes ~40 s there) are bench_sep's
# best-of counts. DEVICE_DIR (default: .device beside this script's repository, or this script's folder).
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"

# Step 3 (also on its own: --summary): bench.jsonl -> sep_summary.md and sep_summary.json (Python 3, stdlib).
summarize() {
    python3 - "$1" "$2" <<'PY'
import json, os, sys
src, outdir = sys.argv[1], sys.argv[2]
frames, rows = [], {}
for line in open(src):
    line = line.strip()
    if not line:
        continue
    try:
        d = json.loads(line)
    except ValueError:
        continue
    name = d.get("frame")
    if name not in rows:
        frames.append(name)
        rows[name] = {}
    key = d.get("backend")
    if key == "cuda-reduce":
        key += ":" + (d.get("gpu_mem_limit") or "")
    rows[name][key] = d

def g(d, *path):
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d

def ratio(a, b):
    return a / b if a and b else None

STAGES = ["read", "prepare", "background", "detection", "psf", "aperture", "catalog"]
summary = []
for name in frames:
    r = rows[name]
    cu, cpu, sep = g(r, "cuda", "report"), g(r, "cpu", "report"), r.get("sep", {})
    red = r.get("cuda-reduce:", {})
    stages = g(red, "report", "stages") or []
    gpu_peak = max([s.get("device_high_water_bytes", 0) for s in stages] or [0]) or None
    sr = sep.get("report") or {}
    ss = sr.get("seconds") or {}
    e = {
        "frame": name, "size": sep.get("size") or (
            "%sx%s" % (g(red, "report", "frame", "width"), g(red, "report", "frame", "height"))),
        "stars": sep.get("stars"), "sources_gpuphot": g(cu, "sources") or g(cpu, "sources"),
        "sources_sep": sr.get("sources"),
        "cuda_stages_warm_s": {k: g(cu, "stages", k) for k in STAGES},
        "cuda_total_warm_s": g(cu, "total_seconds_best"),
        "cpu_stages_warm_s": {k: g(cpu, "stages", k) for k in STAGES},
        "cpu_total_warm_s": g(cpu, "total_seconds_best"), "cpu_threads": g(cpu, "threads"),
        "cuda_reduce_cold_s": red.get("cold_wall_s"), "cpu_reduce_cold_s": g(r, "cpu-reduce", "cold_wall_s"),
        "peak_gpu_bytes": gpu_peak,
        "peak_host_bytes_bench_cuda": g(cu, "peak_host_bytes"),
        "peak_host_bytes_reduce_cuda": g(red, "report", "peak_host_bytes"),
        "sep_seconds": ss, "sep_repeat": sr.get("repeat"), "sep_peak_rss_bytes": sr.get("peak_rss_bytes"),
        "sep_tool": sr.get("tool"),
    }
    det = e["cuda_stages_warm_s"]["detection"]
    e["sep_extract_over_our_detection"] = ratio(ss.get("extract"), det)
    e["sep_total_over_our_warm_total"] = ratio(ss.get("total"), e["cuda_total_warm_s"])
    rt = (ss.get("read") or 0) + (ss.get("total") or 0) if ss.get("total") else None
    e["sep_read_plus_total_over_our_cold_reduce"] = ratio(rt, e["cuda_reduce_cold_s"])
    if "sex" in r:
        e["source_extractor_seconds"] = g(r, "sex", "report", "seconds", "total")
    summary.append(e)

def f3(v):
    return "–" if v is None else "%.3f" % v

def gb(v):
    return "–" if not v else "%.2f GB" % (v / 1e9)

def x(v):
    return "–" if v is None else ("%.0f×" % v if v >= 10 else "%.1f×" % v)

md = []
for e in summary:
    w, h = (e["size"] or "0x0").split("x") if "x" in (e["size"] or "") else ("0", "0")
    try:
        mp = " (%.1f MP)" % (int(w) * int(h) / 1e6)
    except ValueError:
        mp = ""
    md.append("#### %s: %s%s, %s stars simulated; gpuphot %s sources, sep %s objects\n" % (
        e["frame"], e["size"], mp, e["stars"] if e["stars"] is not None else "?",
        "{:,}".format(e["sources_gpuphot"]) if e["sources_gpuphot"] is not None else "–",
        "{:,}".format(e["sources_sep"]) if e["sources_sep"] is not None else "–"))
    md.append("| s | read | prepare | background | detection | psf | aperture | catalog | total |")
    md.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    cs, ps, ss = e["cuda_stages_warm_s"], e["cpu_stages_warm_s"], e["sep_seconds"]
    md.append("| gpuphot cuda (warm, best of 3) | " + " | ".join(f3(cs[k]) for k in STAGES)
              + " | **%s** |" % f3(e["cuda_total_warm_s"]))
    md.append("| gpuphot cpu, %s threads (warm) | " % (e["cpu_threads"] or "?")
              + " | ".join(f3(ps[k]) for k in STAGES) + " | %s |" % f3(e["cpu_total_warm_s"]))
    md.append("| sep C core, 1 thread (best of %s) | %s | – | %s | %s (extract) | – | %s | – | **%s** |"
              % (
        e["sep_repeat"] or "?", f3(ss.get("read")), f3(ss.get("background")), f3(ss.get("extract")),
        f3(ss.get("apertures")), f3(ss.get("total"))))
    md.append("")
    md.append("- cold `gpuphot reduce` (process start, CUDA context, read, all stages, outputs): "
              "cuda **%s s**, "
              "cpu %s s; peak GPU memory (pool high water, cuda reduce) **%s**; peak host memory: bench "
              "cuda %s, cold reduce cuda %s, bench_sep %s." % (
                  f3(e["cuda_reduce_cold_s"]), f3(e["cpu_reduce_cold_s"]), gb(e["peak_gpu_bytes"]),
                  gb(e["peak_host_bytes_bench_cuda"]), gb(e["peak_host_bytes_reduce_cuda"]),
                  gb(e["sep_peak_rss_bytes"])))
    md.append("- ratios: sep extract / our detection stage **%s**; sep background+extract+apertures / "
              "our warm "
              "end-to-end **%s**; sep (read + the same) / our cold reduce %s." % (
                  x(e["sep_extract_over_our_detection"]), x(e["sep_total_over_our_warm_total"]),
                  x(e["sep_read_plus_total_over_our_cold_reduce"])))
    if e["frame"].startswith("151mp"):
        det = cs["detection"]
        r = e["sep_extract_over_our_detection"]
        md.append("- goal (detection on 151 MP ≤ 20 ms, ≥ 100× sep): detection %s s: %s; %s sep's extract: %s."
                  % (
            f3(det), "met" if det is not None and det <= 0.020 else "**not met**", x(r),
            "met" if r is not None and r >= 100 else "**not met**"))
    md.append("")
os.makedirs(outdir, exist_ok=True)
with open(os.path.join(outdir, "sep_summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
with open(os.path.join(outdir, "sep_summary.md"), "w") as f:
    f.write("\n".join(md))
print("\n".join(md))
PY
}
if [ "${1:-}" = --summary ]; then
    [ -f "${2:-}" ] || { echo "usage: $0 --summary BENCH.jsonl [DIR]" >&2; exit 2; }
    summarize "$2" "${3:-$(dirname "$2")}"
    exit $?
fi
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
SMALL='PsfCuda.NoMaskDispatchAndSwitch:CudaStages.BackgroundMatchesCpuOnRandomFrames:CudaStages.InvalidParameters*:CudaStages.TinyMemory*:CudaStages.FrameUploaded*:ApertureCuda.LocalSkyPieces*'
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
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b - a}'; }
SEP="$DEVICE_DIR/bin/bench_sep"
PEERS="$HERE/peers.py"
[ -f "$PEERS" ] || PEERS="$HERE/../bench/peers.py"
[ -x "$SEP" ] || log "no $SEP: sep's C core not run (bench/pack_device.sh packs it when libsep-dev is there)"
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
        log "simulated in $(elapsed "$t0") s"
    fi
    for backend in cuda cpu; do
        log "bench $name --backend $backend --repeat 3"
        t0=$(date +%s.%N)
        json=$("$GP" bench "$frame" --backend "$backend" --repeat 3 --json 2>> "$LOG")
        rc=$?
        log "bench $name $backend exit $rc, wall $(elapsed "$t0") s"
        if [ $rc -eq 0 ] && [ -n "$json" ]; then
            printf '{"frame": "%s", "backend": "%s", "report": %s}\n' "$name" "$backend" "$(echo "$json" | tr -d '\n')" >> "$OUT/bench.jsonl"
            echo "$json" | head -c 3000 >> "$LOG"
            echo >> "$LOG"
        fi
    done
    # One cold reduce per backend (the cuda report has the per-stage GPU memory checkpoints; each backend
    # writes into its own folder), and at 151 MP the budget behaviour.
    for limit in "" 4G 2G 1G; do
        case "$name:$limit" in 151mp*:*|*:) ;; *) continue ;; esac
        log "reduce $name --backend cuda ${limit:+--gpu-mem-limit $limit}"
        rm -rf "$WORK/out"
        mkdir -p "$WORK/out"
        t0=$(date +%s.%N)
        "$GP" reduce "$frame" --backend cuda ${limit:+--gpu-mem-limit "$limit"} -o "$WORK/out" --formats csv -q \
            >> "$LOG" 2>&1
        rc=$?
        wall=$(elapsed "$t0")
        log "reduce exit $rc, cold wall (process start, CUDA context, FITS read, all stages, outputs) $wall s"
        # The catalog under a memory limit (strips) is the unlimited one's, byte for byte.
        if [ -z "$limit" ]; then
            cp "$WORK/out/$name.cat.csv" "$WORK/$name.cuda.csv" 2>/dev/null
        elif cmp -s "$WORK/out/$name.cat.csv" "$WORK/$name.cuda.csv"; then
            log "catalog under --gpu-mem-limit $limit: byte-identical to the unlimited CUDA catalog"
        else
            log "catalog under --gpu-mem-limit $limit: DIFFERS from the unlimited CUDA catalog"
        fi
        rep=$(ls "$WORK"/out/*.report.json 2>/dev/null | head -1)
        if [ $rc -eq 0 ] && [ -n "$rep" ]; then
            printf '{"frame": "%s", "backend": "cuda-reduce", "gpu_mem_limit": "%s", "cold_wall_s": %s, ' \
                "$name" "$limit" "$wall" >> "$OUT/bench.jsonl"
            printf '"report": %s}\n' \
                "$(tr -d '\n' < "$rep")" >> "$OUT/bench.jsonl"
            grep -o '"device_high_water_bytes": *[0-9]*' "$rep" | tr '\n' ' ' >> "$LOG"
            echo >> "$LOG"
        fi
        if [ -z "$limit" ]; then
            rm -rf "$WORK/out-cpu"
            mkdir -p "$WORK/out-cpu"
            t0=$(date +%s.%N)
            "$GP" reduce "$frame" --backend cpu -o "$WORK/out-cpu" --formats csv -q >> "$LOG" 2>&1
            rc=$?
            wall=$(elapsed "$t0")
            log "reduce --backend cpu exit $rc, cold wall $wall s"
            # Determinism (docs/ARCHITECTURE.md): the CUDA catalog is the CPU backend's, byte for byte.
            if cmp -s "$WORK/out-cpu/$name.cat.csv" "$WORK/$name.cuda.csv"; then
                log "CUDA catalog = CPU catalog (CSV, byte-identical, $(wc -l < "$WORK/$name.cuda.csv") lines)"
            else
                log "CUDA catalog and CPU catalog DIFFER"
            fi
            [ $rc -eq 0 ] && printf '{"frame": "%s", "backend": "cpu-reduce", "cold_wall_s": %s}\n' \
                "$name" "$wall" >> "$OUT/bench.jsonl"
        fi
    done
    rm -rf "$WORK/out" "$WORK/out-cpu" "$WORK/$name.cuda.csv"
    # sep's C core on the same file (single-threaded; best of SEP_REPEAT, SEP_REPEAT_LARGE above 100 MP).
    if [ -x "$SEP" ]; then
        read -r w h <<< "${size/x/ }"
        rep_n=${SEP_REPEAT:-3}
        [ $((w * h)) -gt 100000000 ] && rep_n=${SEP_REPEAT_LARGE:-1}
        log "bench_sep $name --repeat $rep_n"
        t0=$(date +%s.%N)
        json=$("$SEP" "$frame" --repeat "$rep_n" 2>> "$LOG")
        rc=$?
        log "bench_sep $name exit $rc, wall $(elapsed "$t0") s"
        if [ $rc -eq 0 ] && [ -n "$json" ]; then
            printf '{"frame": "%s", "backend": "sep", "size": "%s", "stars": %s, "report": %s}\n' \
                "$name" "$size" "$stars" "$(echo "$json" | tr -d '\n')" >> "$OUT/bench.jsonl"
            echo "$json" >> "$LOG"
        fi
    fi
    if command -v source-extractor > /dev/null && [ -f "$PEERS" ] \
        && python3 -c 'import numpy, astropy' 2> /dev/null; then
        log "source-extractor $name (peers.py sex, 1 thread, 1 run)"
        json=$(python3 "$PEERS" sex "$frame" --threads 1 --repeat 1 2>> "$LOG")
        [ $? -eq 0 ] && [ -n "$json" ] && printf '{"frame": "%s", "backend": "sex", "report": %s}\n' \
            "$name" "$(echo "$json" | tr -d '\n')" >> "$OUT/bench.jsonl"
    else
        log "source-extractor (with python3, numpy, astropy for peers.py) not installed here: skipped"
    fi
    rm -f "$WORK/$name".*
done
# 3. The summary table (needs python3 here; else run `bench/gpu_session.sh --summary bench.jsonl` later).
if [ -s "$OUT/bench.jsonl" ]; then
    if command -v python3 > /dev/null; then
        summarize "$OUT/bench.jsonl" "$OUT" >> "$LOG" 2>&1 || log "summary failed"
    else
        log "python3 not found: summary not written (bench/gpu_session.sh --summary bench.jsonl)"
    fi
fi
log "done"
