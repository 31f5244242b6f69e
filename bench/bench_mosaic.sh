#!/usr/bin/env bash
# Mosaic exposures: a simulated exposure of N CCDs (default 60 of 2048 x 4096, about 500 MP) reduced
#   1. as one exposure, warm: one `gpuphot reduce` process with a warm-up frame first (CCD 1 alone), then
#      the exposure under R names (hard links); the process's wall time less that of the warm-up alone,
#      divided by R, is the exposure's warm end-to-end time (read, every CCD, calibration, every output);
#      each exposure's own seconds (its report) are listed too: the first also starts the extra contexts;
#   2. as N separate warm reductions: the warm-up frame, then FILE[1] ... FILE[N] as N frames in one
#      process (the batch pipeline reads ahead and writes behind); wall time less the warm-up's;
#   3. accuracy: the exposure's zero point and each CCD's offset against NAME.mosaic.json (the truth), and
#      the bad CCD flagged.
# Prints a Markdown table and writes OUT/mosaic_bench.json.
#
#   bench/bench_mosaic.sh [-g GPUPHOT] [-n CCDS] [--size WxH] [--stars S] [--repeat R] [--backend B]
#                         [-w WORK] [-o OUT] [--ccds-at-once K] [--ccd-gpus G] [--no-separate]
# Defaults: build/app/gpuphot, 60 CCDs, 2048x4096, 2000 stars per CCD, R = 3, backend cuda, WORK
# /tmp/gpuphot-mosaic, OUT ./mosaic-bench-out. --ccd-gpus G spreads the CCDs over G GPUs (reduce's
# option; the exposure's catalog is kept as OUT/exp1.cat.fits); --no-separate skips step 2. Needs python3
# (standard library only).
set -euo pipefail

gpuphot=build/app/gpuphot ccds=60 size=2048x4096 stars=2000 repeat=3 backend=cuda
work=/tmp/gpuphot-mosaic out=./mosaic-bench-out atonce=0 gpus=-1 separate=1
while [[ $# -gt 0 ]]; do
    case "$1" in
    -g) gpuphot=$2; shift 2 ;;
    -n) ccds=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --stars) stars=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    --ccds-at-once) atonce=$2; shift 2 ;;
    --ccd-gpus) gpus=$2; shift 2 ;;
    --no-separate) separate=0; shift ;;
    -w) work=$2; shift 2 ;;
    -o) out=$2; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "bench_mosaic: unknown argument $1" >&2; exit 2 ;;
    esac
done
[[ -x $gpuphot ]] || { echo "bench_mosaic: $gpuphot is not an executable" >&2; exit 2; }
mkdir -p "$work" "$out"
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }

tag="${ccds}x${size}_${stars}"
if [[ ! -f $work/$tag/mos.mosaic.json ]]; then
    t=$(now)
    "$gpuphot" simulate --mosaic "$ccds" --size "$size" --stars "$stars" --seed 26 -o "$work/$tag" --name mos -q \
        --mosaic-set badCcd=7
    echo "simulated $tag in $(since "$t") s"
fi
sim=$work/$tag
names=()
for ((k = 1; k <= repeat; k++)); do
    ln -f "$sim/mos.fits" "$sim/exp$k.fits"
    names+=("$sim/exp$k.fits")
done
common=(--ref "$sim/mos.ref.fits" --no-tycho2 --backend "$backend" -q --force)
[[ $atonce -gt 0 ]] && common+=(--ccds-at-once "$atonce")
[[ $gpus -ge 0 ]] && common+=(--ccd-gpus "$gpus")
run() { # wall seconds of one reduce process over the given frames
    local t
    t=$(now)
    "$gpuphot" reduce "$@" "${common[@]}" >/dev/null 2>>"$work/reduce.log"
    since "$t"
}
# Page cache: read the exposure once before timing.
cat "$sim/mos.fits" >/dev/null
rm -rf "$work/o-warm" "$work/o-exp" "$work/o-sep"
warmup="$sim/mos.fits[1]" # one CCD reduced alone: the process, its CUDA context and pools warm
warm=$(run "$warmup" -o "$work/o-warm")
exp=$(run "$warmup" "${names[@]}" -o "$work/o-exp")
cp "$work/o-exp/exp1.cat.fits" "$out/exp1.cat.fits"
sep=nan
if [[ $separate = 1 ]]; then
    frames=()
    for ((k = 1; k <= ccds; k++)); do frames+=("$sim/mos.fits[$k]"); done
    sep=$(run "$warmup" "${frames[@]}" -o "$work/o-sep")
fi

python3 - "$sim/mos.mosaic.json" "$work/o-exp/exp1.report.json" "$warm" "$exp" "$sep" "$repeat" "$ccds" \
    "$size" "$stars" "$backend" "$out/mosaic_bench.json" <<'PY'
import json, os, sys
truth_path, report_path, warm, exp, sep, repeat, ccds, size, stars, backend, out = sys.argv[1:]
# Each exposure's own end-to-end seconds (its report): the first one also brings up the extra contexts.
own = [json.load(open(report_path.replace("exp1.", "exp%d." % k)))["seconds"] for k in range(1, int(repeat) + 1)]
warm, exp, sep, repeat, ccds = float(warm), float(exp), float(sep), int(repeat), int(ccds)
truth = json.load(open(truth_path))
report = json.load(open(report_path))
e = report["exposure"]
zp_true = truth["exposure"]["zero_point"]
tccds = truth["ccds"]
by_name = {c["extname"]: c for c in tccds}
zp = e["zp"]
errs, flagged, bad = [], [], []
for x in e["extensions"]:
    t = by_name.get(x["extname"])
    if t is None or x.get("zp_offset") is None:
        continue
    if t.get("bad"):
        bad.append(x["extname"])
    if x.get("zp_outlier"):
        flagged.append(x["extname"])
    if not t.get("bad"):
        errs.append(abs(x["zp_offset"] - (t["zp_offset"] - (zp - zp_true))))
per_exposure = (exp - warm) / repeat
separate = sep - warm
mp = ccds * eval(size.replace("x", "*")) / 1e6
res = {"ccds": ccds, "size": size, "stars_per_ccd": int(stars), "megapixels": round(mp, 1), "backend": backend,
       "sources": report["sources"], "exposure_warm_s": round(per_exposure, 3),
       "exposure_reports_s": [round(x, 3) for x in own],
       "separate_warm_s": round(separate, 3) if separate == separate else None, "warmup_process_s": round(warm, 3),
       "zp": zp, "zp_true": zp_true, "zp_error": abs(zp - zp_true) if zp is not None else None,
       "offset_error_max": max(errs) if errs else None,
       "offset_error_median": sorted(errs)[len(errs) // 2] if errs else None,
       "bad_ccds": bad, "flagged": flagged, "ccds_at_once": e["params"]["concurrent"],
       "gpus": e["params"].get("gpus")}
json.dump(res, open(out, "w"), indent=2)
print("| what | value |\n|---|---:|")
for k, v in res.items():
    print(f"| {k} | {v} |")
PY
