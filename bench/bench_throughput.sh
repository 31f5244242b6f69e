#!/usr/bin/env bash
# Throughput of `gpuphot reduce` on a stream of frames: frames/s of one batch process (-j 1, -j 2, and the
# default single warm process, each pipelined (--prefetch 1, the default) and sequential (--prefetch 0))
# against one `gpuphot reduce` process per image (run one at a time and two at a time), on the same
# simulated frames. Prints a Markdown table (for docs/BENCHMARKS.md).
#
#   bench/bench_throughput.sh [-n FRAMES] [-s WxH] [--stars N] [-g PATH/TO/gpuphot] [-w WORKDIR] [--keep]
#                             [--backend cpu|cuda|auto] [--only "pp1 pp2 inproc inproc0 j1 j2 j2p0"]
#
# Defaults: 12 frames of 2048x2048 with 2000 stars (uint16), build-bench/app/gpuphot, /tmp/gpuphot-tput.
# The frames are simulated with seeds 1..N (deterministic); every run uses --force and --no-tycho2 so all
# runs do the same work. Each configuration writes into its own output directory.
set -euo pipefail

n=12 size=2048x2048 stars=2000 work=/tmp/gpuphot-tput keep=0 backend=auto
only="pp1 pp2 inproc inproc0 j1 j2 j2p0"
gpuphot=build-bench/app/gpuphot
while [[ $# -gt 0 ]]; do
    case "$1" in
    -n) n=$2; shift 2 ;;
    -s) size=$2; shift 2 ;;
    --stars) stars=$2; shift 2 ;;
    -g) gpuphot=$2; shift 2 ;;
    -w) work=$2; shift 2 ;;
    --backend) backend=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --only) only=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "bench_throughput: unknown argument $1" >&2; exit 2 ;;
    esac
done
[[ -x $gpuphot ]] || { echo "bench_throughput: $gpuphot is not an executable (build target gpuphot)" >&2; exit 2; }

mkdir -p "$work/frames"
for ((i = 1; i <= n; ++i)); do
    [[ -f $work/frames/t$i.fits ]] && continue
    "$gpuphot" simulate --size "$size" --stars "$stars" --seed "$i" --bitpix 16 -o "$work/sim" --name "t$i" -q
    mv "$work/sim/t$i.fits" "$work/frames/"
done
frames=("$work"/frames/t*.fits)
common=(--no-tycho2 --force -q --backend "$backend")

now() { date +%s.%N; }
rows=()
measure() { # label, command...
    local label=$1; shift
    local t0 t1
    t0=$(now)
    "$@" || { echo "bench_throughput: '$label' failed" >&2; exit 1; }
    t1=$(now)
    rows+=("$(awk -v l="$label" -v t0="$t0" -v t1="$t1" -v n="$n" \
        'BEGIN { s = t1 - t0; printf "| %s | %.1f | %.3f | %.2f |", l, s, n / s, s / n }')")
}
out() { rm -rf "$work/out-$1"; mkdir -p "$work/out-$1"; echo "$work/out-$1"; }

per_image() { # one process per image, P at a time
    local dir=$1 p=$2
    printf '%s\n' "${frames[@]}" | xargs -P "$p" -I{} "$gpuphot" reduce {} "${common[@]}" -o "$dir"
}

want() { [[ " $only " == *" $1 "* ]]; }
want pp1 && measure "one process per image, 1 at a time" per_image "$(out pp1)" 1
want pp2 && measure "one process per image, 2 at a time (xargs -P 2)" per_image "$(out pp2)" 2
want inproc0 && measure "one batch process, in-process, sequential (--prefetch 0)" "$gpuphot" reduce "${frames[@]}" "${common[@]}" --prefetch 0 -o "$(out inproc0)"
want inproc && measure "one batch process, in-process, pipelined (--prefetch 1, default)" "$gpuphot" reduce "${frames[@]}" "${common[@]}" -o "$(out inproc)"
want j1 && measure "one batch process, -j 1 (1 worker, all threads, pipelined)" "$gpuphot" reduce "${frames[@]}" "${common[@]}" -j 1 -o "$(out j1)"
want j2p0 && measure "one batch process, -j 2, sequential workers (--prefetch 0)" "$gpuphot" reduce "${frames[@]}" "${common[@]}" -j 2 --prefetch 0 -o "$(out j2p0)"
want j2 && measure "one batch process, -j 2 (2 workers, cores/2 threads each, pipelined)" "$gpuphot" reduce "${frames[@]}" "${common[@]}" -j 2 -o "$(out j2)"

# The catalogs must not depend on how the frames were scheduled.
tablebytes() { /usr/bin/python3 -c "from astropy.io import fits; import sys, hashlib; print(hashlib.sha256(fits.open(sys.argv[1])[1].data.tobytes()).hexdigest())" "$1" 2>/dev/null; }
same=0
a_dir=$(ls -d "$work"/out-* | head -1) b_dir=$(ls -d "$work"/out-* | tail -1)
for f in "${frames[@]}"; do
    s=$(basename "$f" .fits)
    a=$(tablebytes "$a_dir/$s.cat.fits") b=$(tablebytes "$b_dir/$s.cat.fits")
    if [[ -n $a && $a == "$b" ]]; then ((++same)); else echo "bench_throughput: warning: $s.cat.fits differs between $(basename "$a_dir") and $(basename "$b_dir")" >&2; fi
done
echo "catalog tables identical ($(basename "$a_dir") vs $(basename "$b_dir")): $same of $n"

echo
echo "$n frames of $size ($stars stars, uint16), backend $backend, $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| configuration | wall s | frames/s | s/frame |"
echo "|---|---:|---:|---:|"
printf '%s\n' "${rows[@]}"
[[ $keep == 1 ]] || rm -rf "$work"/out-* "$work/sim"
