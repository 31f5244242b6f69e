#!/usr/bin/env bash
# End to end: second-order (colour) extinction and detrending (issue 24). A short simulated night whose
# stars dim with airmass by colourExtinction * colour * (X - 1) mag more than the grey extinction, each
# frame reduced, then `gpuphot series` on constant stars without and with --detrend airmass;
# check_series.py detrend compares the fitted coefficients with the truth (the colour of each star against
# its ensemble's) and the RMS before and after with the noise the simulator put in.
#
#   detrend_e2e.sh GPUPHOT [FRAMES] [WxH] [STARS] [COLOUR_EXTINCTION] [WORKDIR]
#
# Defaults (docs/ACCURACY.md): 80 frames at 60 s cadence, airmass 1.0-2.0, 0.05 mag per airmass per mag
# of colour, 512x512 with 500 stars (colours 0.7 +- 0.3), no injected variable.
set -euo pipefail
gpuphot=$1 frames=${2:-80} size=${3:-512x512} stars=${4:-500} k2=${5:-0.05}
work=${6:-$(mktemp -d /tmp/gpuphot-detrend-e2e.XXXXXX)}
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
[[ -x $py ]] && $py -c "import astropy, numpy" 2>/dev/null || { echo "skipped: needs python3-astropy"; exit 77; }
[[ -n ${6:-} ]] || trap 'rm -rf "$work"' EXIT
radius=4
aper=3 # --aper 2,3,4,6: the 4 px aperture
sim=$work/sim red=$work/red

echo "== simulate $frames frames with colour extinction $k2"
"$gpuphot" simulate --series "$frames" --size "$size" --stars "$stars" --seed 24 -o "$sim" --name night -q \
    --set writeSite=true --series-set colourExtinction="$k2" --series-set transitDepth=0 \
    --series-set sineAmplitude=0
echo "== reduce"
mapfile -t fits < <(ls "$sim"/night_*.fits | grep -v -e truth -e ref | sort)
"$gpuphot" reduce "${fits[@]}" --ref "$sim/night_0001.ref.fits" --no-tycho2 --aper 2,3,4,6 -o "$red" -q
$py "$here/check_series.py" targets "$sim" night "$work/targets.csv"
grep -v offfield "$work/targets.csv" >"$work/constants.csv"

echo "== series without and with --detrend airmass"
for mode in plain detrended; do
    extra=()
    [[ $mode == detrended ]] && extra=(--detrend airmass)
    "$gpuphot" series "$red" --targets "$work/constants.csv" -o "$work/$mode" --flux "aper_$aper" \
        --telescope-diameter 0.5 -q "${extra[@]}"
done
$py "$here/check_series.py" detrend "$sim" night "$work/plain" "$work/detrended" "$radius" --bars |
    tee "$work/detrend.json"
