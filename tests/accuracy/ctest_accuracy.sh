#!/bin/bash
# ctest's accuracy checks against the independent generator (make_field.py: numpy + astropy, no code
# shared with core/sim), with the bars of docs/ACCURACY.md (check_bars.py).
#   ctest_accuracy.sh GPUPHOT densities   2048^2 fields from one star per 3000 to one per 300 px^2, FWHM
#                                         varying 30 % across the field and elliptical
#   ctest_accuracy.sh GPUPHOT pulls       20 fields: the zero point's pulls (ZP - true) / zp_err
#   ctest_accuracy.sh GPUPHOT pulls_varying   the same on 20 fields whose FWHM varies 30 % (elliptical)
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
*) echo "usage: $0 GPUPHOT densities|pulls|pulls_varying" >&2; exit 2 ;;
esac
