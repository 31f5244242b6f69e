#!/bin/bash
# Generate fields with make_field.py, reduce each with gpuphot (CPU backend, one process at a time) and
# append evaluate.py's result to a JSON-lines file.
#
# usage: run_series.sh WORKDIR RESULTS.jsonl "SEEDS" "MAKE_FIELD OPTIONS" ["GPUPHOT REDUCE OPTIONS"]
#   e.g. run_series.sh /tmp/acc/pulls pulls.jsonl "$(seq 101 120)" "--size 2048x2048 --density 3000" \
#                      "--config my.json"
# Fields are kept in WORKDIR/fSEED (delete them afterwards: 16 MB per 2048^2 frame, 64 MB per 4096^2).
# GPUPHOT (default: the build tree's binary) and KEEP=0 (delete each field after evaluation) are honoured.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
gpuphot=${GPUPHOT:-$here/../../build/app/gpuphot}
work=$1
results=$2
seeds=$3
makeopts=$4
reduceopts=${5:-}
mkdir -p "$work"
for s in $seeds; do
    f=$work/f$s
    /usr/bin/python3 "$here/make_field.py" -o "$f" --seed "$s" $makeopts >/dev/null
    # shellcheck disable=SC2086
    "$gpuphot" reduce "$f/FRAME.fits" --ref "$f/REF.fits" --ref-columns color=color -o "$f/out" --backend cpu \
        -q $reduceopts || echo "seed $s: gpuphot exit $?" >&2
    /usr/bin/python3 "$here/evaluate.py" "$f" "$f/out" --quiet --json "$results"
    if [ "${KEEP:-1}" = 0 ]; then rm -rf "$f"; fi
done
/usr/bin/python3 "$here/summarize.py" "$results"
