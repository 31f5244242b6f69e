#!/bin/bash
# ctest's accuracy checks against the independent generator (make_field.py: numpy + astropy, no code
# shared with core/sim), with the bars of docs/ACCURACY.md (check_bars.py).
#   ctest_accuracy.sh GPUPHOT densities   2048^2 fields from one star per 3000 to one per 300 px^2, FWHM
#                                         varying 30 % across the field and elliptical
#   ctest_accuracy.sh GPUPHOT pulls       20 fields: the zero point's pulls (ZP - true) / zp_err
#   ctest_accuracy.sh GPUPHOT pulls_varying   the same on 20 fields whose FWHM varies 30 % (elliptical)
#   ctest_accuracy.sh GPUPHOT own_sim     the project's own simulator (`gpuphot simulate` defaults, 2048^2):
#                                         4 fields at each of one star per 3000, 1000 and 300 px^2
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export GPUPHOT=$1
work=$(mktemp -d /tmp/gpuphot_accuracy.XXXXXX)
trap 'rm -rf "$work"' EXIT
export KEEP=0
check() { /usr/bin/python3 "$here/check_bars.py" "$@"; }
case "$2" in
densities)
    vary="--fwhm 3.0 --fwhm-grad-x 0.15 --ell 0.1"
    bash "$here/run_series.sh" "$work" "$work/sparse.jsonl" "11" "--size 2048x2048 --density 3000 $vary" >/dev/null
    bash "$here/run_series.sh" "$work" "$work/dense.jsonl" "12" "--size 2048x2048 --density 1000 $vary" >/dev/null
    bash "$here/run_series.sh" "$work" "$work/crowded.jsonl" "13" "--size 2048x2048 --density 300 $vary" >/dev/null
    /usr/bin/python3 "$here/summarize.py" "$work/sparse.jsonl"
    /usr/bin/python3 "$here/summarize.py" "$work/dense.jsonl"
    /usr/bin/python3 "$here/summarize.py" "$work/crowded.jsonl"
    status=0
    check "$work/sparse.jsonl" --zp 0.003 --iso 0.003 || status=1
    check "$work/dense.jsonl" --zp 0.003 --iso 0.003 || status=1
    check "$work/crowded.jsonl" --zp 0.01 --iso 0.003 || status=1
    exit $status
    ;;
pulls)
    bash "$here/run_series.sh" "$work" "$work/pulls.jsonl" "$(seq 101 120)" "--size 2048x2048 --density 3000" \
        >/dev/null
    /usr/bin/python3 "$here/summarize.py" "$work/pulls.jsonl"
    check "$work/pulls.jsonl" --zp 0.003 --pulls
    ;;
pulls_varying)
    bash "$here/run_series.sh" "$work" "$work/pulls.jsonl" "$(seq 201 220)" \
        "--size 2048x2048 --density 3000 --fwhm 3.0 --fwhm-grad-x 0.15 --ell 0.1" >/dev/null
    /usr/bin/python3 "$here/summarize.py" "$work/pulls.jsonl"
    check "$work/pulls.jsonl" --zp 0.003 --iso 0.003 --pulls
    ;;
own_sim)
    for stars in 1398 4194 13981; do
        for seed in 21 22 23 24; do
            d=$work/s$stars-$seed
            "$GPUPHOT" simulate --size 2048x2048 --stars "$stars" --seed "$seed" -o "$d" -q
            "$GPUPHOT" reduce "$d/sim.fits" --ref "$d/sim.ref.fits" -o "$d/out" --backend cpu -q ||
                echo "stars $stars seed $seed: gpuphot exit $?" >&2
            /usr/bin/python3 - "$d/out/sim.report.json" "$d/sim.fits" "$stars" >>"$work/own.txt" <<'PY'
import json, sys
from astropy.io import fits
r = json.load(open(sys.argv[1]))
true = fits.getheader(sys.argv[2])["SIMZP"]
zp, err = r["zp"], r["zp_err"]
print(sys.argv[3], "nan" if zp is None else zp - true, "nan" if err is None else err)
PY
            rm -rf "$d"
        done
    done
    /usr/bin/python3 - "$work/own.txt" <<'PY'
import math, sys
bars = {1398: 0.003, 4194: 0.003, 13981: 0.01}  # mean |ZP - true| per density (docs/ACCURACY.md)
rows = [l.split() for l in open(sys.argv[1])]
ok = True
for stars, bar in bars.items():
    d = [(float(a), float(b)) for s, a, b in rows if int(s) == stars]
    if len(d) != 4 or any(not math.isfinite(a) or not math.isfinite(b) for a, b in d):
        print(f"{stars} stars: a field did not calibrate: {d}"); ok = False; continue
    mean = sum(a for a, _ in d) / len(d)
    pulls = [a / b for a, b in d]
    print(f"one star per {2048 * 2048 // stars} px^2: ZP - true " + " ".join(f"{a:+.4f}" for a, _ in d) +
          f", mean {mean:+.4f} (bar {bar}); pulls " + " ".join(f"{p:+.2f}" for p in pulls))
    if abs(mean) > bar or max(abs(p) for p in pulls) > 3.0: ok = False
sys.exit(0 if ok else 1)
PY
    ;;
*) echo "usage: $0 GPUPHOT densities|pulls|pulls_varying|own_sim" >&2; exit 2 ;;
esac
