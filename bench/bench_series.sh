#!/usr/bin/env bash
# Speed of `gpuphot series` on already-reduced catalogs: every star's light curve (--all-stars) over N
# catalogs of S stars, then appending one more catalog to the running series (targets only, the state
# kept in the output directory). Prints a Markdown table (for docs/BENCHMARKS.md).
#
#   bench/bench_series.sh [-n CATALOGS] [--stars S] [-g PATH/TO/gpuphot] [-w WORKDIR] [--appends K]
#
# Defaults: 1000 catalogs, build/app/gpuphot, /tmp/gpuphot-series-bench, 5 appends; S = 28000 simulated
# stars give 10,450 detections per catalog. Each append is a whole `gpuphot series` process with the
# default formats (five files per target) and the state written, every file flushed to disk.
# The catalogs are one real `gpuphot reduce` catalog of a simulated 3000x3000 frame (all its columns),
# copied N times by make_catalogs.py with new fluxes (photon noise, transparency, one transit, one
# sinusoid), positions (0.05" jitter) and MJD-MID; a series reads them as it reads any reduced night.
set -euo pipefail

n=1000 stars=28000 work=/tmp/gpuphot-series-bench appends=5
gpuphot=build/app/gpuphot
while [[ $# -gt 0 ]]; do
    case "$1" in
    -n) n=$2; shift 2 ;;
    --stars) stars=$2; shift 2 ;;
    -g) gpuphot=$2; shift 2 ;;
    -w) work=$2; shift 2 ;;
    --appends) appends=$2; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "bench_series: unknown argument $1" >&2; exit 2 ;;
    esac
done
[[ -x $gpuphot ]] || { echo "bench_series: $gpuphot is not an executable" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$work"

if [[ ! -f $work/seed/seed.cat.fits ]]; then
    "$gpuphot" simulate --size 3000x3000 --stars "$stars" --seed 7 -o "$work/seed" --name seed -q \
        --set writeSite=true
    "$gpuphot" reduce "$work/seed/seed.fits" --ref "$work/seed/seed.ref.fits" -o "$work/seed" -q --force --no-tycho2
fi
if [[ ! -f $work/cats/done.$n ]]; then
    rm -rf "$work/cats"
    /usr/bin/python3 "$here/make_catalogs.py" "$work/seed/seed.cat.fits" "$work/cats" "$n" "$((n + appends))"
    touch "$work/cats/done.$n"
fi
rows=$(/usr/bin/python3 -c "from astropy.io import fits; print(fits.getheader('$work/seed/seed.cat.fits', 1)['NAXIS2'])")

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
mapfile -t all < <(ls "$work"/cats/c_*.cat.fits | sort)
first=("${all[@]:0:n}")

out=$work/out-all
rm -rf "$out"
t0=$(now)
"$gpuphot" series "${first[@]}" --targets "$work/cats/targets.csv" -o "$out" --all-stars --formats fits -q --fresh || true
t1=$(now)
curves=$(/usr/bin/python3 -c "from astropy.io import fits; print(len(fits.getdata('$out/series.stars.fits')))")

out2=$work/out-append
rm -rf "$out2"
"$gpuphot" series "${first[@]}" --targets "$work/cats/targets.csv" -o "$out2" -q --fresh || true
times=() phases=()
for ((k = 0; k < appends; ++k)); do
    a0=$(now)
    line=$("$gpuphot" series "${all[$((n + k))]}" --targets "$work/cats/targets.csv" -o "$out2" 2>/dev/null | head -1) || true
    a1=$(now)
    times+=("$(elapsed "$a0" "$a1")")
    phases+=("$(sed 's/.*s (state/(state/' <<< "$line")")
done
grep -q '"appended": true' "$out2/series.json" || { echo "bench_series: the appends rebuilt the series" >&2; exit 1; }

# A running series: `series DIR --follow` holds the series in memory; each catalog moved into DIR is
# appended and every file rewritten (the line it prints gives the append and the files' seconds).
fin=$work/follow-in fout=$work/out-follow
rm -rf "$fin" "$fout"
mkdir -p "$fin"
ln -s "${first[@]}" "$fin"/
"$gpuphot" series "$fin" --targets "$work/cats/targets.csv" -o "$fout" --fresh --follow --settle 0 \
    --timeout 600 > "$work/follow.log" 2>/dev/null &
fpid=$!
until grep -q '^series: ' "$work/follow.log"; do sleep 0.2; done
follows=()
for ((k = 0; k < appends; ++k)); do
    c=${all[$((n + k))]}
    cp "$c" "$fin/.incoming" && mv "$fin/.incoming" "$fin/$(basename "$c")"
    until [[ $(grep -c '^series: +' "$work/follow.log") -gt $k ]]; do sleep 0.05; done
    follows+=("$(grep '^series: +' "$work/follow.log" | tail -1 | sed 's/.*frames, \([0-9.]*\) s.*/\1/')")
done
kill -TERM "$fpid"; wait "$fpid" || true

echo "| measure | catalogs | stars per catalog | seconds |"
echo "|---|---:|---:|---:|"
echo "| every star's light curve (--all-stars; $curves curves) | $n | $rows | $(elapsed "$t0" "$t1") |"
echo "| append one catalog, 5 targets (each of $appends runs, whole process) | $n + 1 | $rows | ${times[*]} |"
echo "| append one catalog to a running series (series --follow; each of $appends, files included) | $n + 1 | $rows | ${follows[*]} |"
printf 'phases of each append, inside the process (s): %s\n' "${phases[@]}"
grep '^series: +' "$work/follow.log" | sed 's/^/follow: /'
