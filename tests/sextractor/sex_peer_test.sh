#!/bin/bash
# `gpuphot reduce --sex` against Debian's source-extractor with the same .sex / .conv files (issue bars:
# >= 98 % of SExtractor's objects matched one to one, FLUX_AUTO and FLUX_APER within 1 % (median)). Asserted
# on a simulated field in four configurations, on a noisier copy of it with an RMS map and a weight map
# (with a hole of zero weight), and on the real PANOPTES and DECam frames of tests/data (docs/SEXTRACTOR.md).
#   sex_peer_test.sh GPUPHOT      (exit 77: source-extractor or its configuration files are not installed)
set -uo pipefail
gp=$1
here=$(cd "$(dirname "$0")" && pwd)
share=/usr/share/source-extractor
command -v source-extractor >/dev/null && [ -f "$share/default.sex" ] || { echo "no source-extractor"; exit 77; }
work=$(mktemp -d /tmp/gpuphot_sexpeer.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
cp "$share/default.sex" "$share/default.conv" "$share/gauss_4.0_7x7.conv" .
printf 'X_IMAGE\nY_IMAGE\nFLUX_AUTO\nFLUX_APER\n' > peer.param
"$gp" simulate --size 1024x1024 --stars 1500 --seed 3 -o . --name sim -q || exit 1
/usr/bin/python3 -c "
from astropy.io import fits
for src, dst in [('$here/../data/real/panoptes_solved.fits.fz', 'panoptes.fits'),
                 ('$here/../data/real/decam_ls9_N6_cutout.fits', 'decam.fits')]:
    h = fits.open(src)
    d = [x for x in h if x.data is not None][0]
    fits.PrimaryHDU(d.data.astype('float32'), d.header).writeto(dst, overwrite=True)
" || exit 1
# The simulated field with extra noise on its right half and a 100 px square of zero weight, its RMS map
# and an unnormalised weight map (what SWarp writes).
/usr/bin/python3 -c "
import numpy as np
from astropy.io import fits
h = fits.open('sim.fits')
d = h[0].data.astype('float32')
sky = float(np.std(d[:50, :50]))
extra = np.zeros_like(d)
extra[:, d.shape[1] // 2:] = 2.0 * sky
rng = np.random.default_rng(1)
fits.writeto('noisy.fits', d + rng.normal(0.0, 1.0, d.shape).astype('float32') * extra, h[0].header)
var = sky * sky + extra * extra
fits.writeto('noisy.rms.fits', np.sqrt(var).astype('float32'))
w = (3.7 / var).astype('float32')
w[100:200, 100:200] = 0.0
fits.writeto('noisy.weight.fits', w)
" || exit 1
status=0
run() { # frame filter minarea bars... -- extra keys
    local frame=$1 filter=$2 minarea=$3; shift 3
    local bars=() extra=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do bars+=("$1"); shift; done
    [ "${1:-}" = "--" ] && shift
    extra=("$@")
    source-extractor "$frame.fits" -c default.sex -PARAMETERS_NAME peer.param -FILTER_NAME "$filter" \
        -DETECT_MINAREA "$minarea" "${extra[@]}" -CATALOG_NAME se.cat -CATALOG_TYPE ASCII_HEAD \
        -VERBOSE_TYPE QUIET 2>/dev/null || { echo "source-extractor failed on $frame"; status=1; return; }
    rm -rf gp
    "$gp" reduce "$frame.fits" --sex default.sex -FILTER_NAME "$filter" -DETECT_MINAREA "$minarea" "${extra[@]}" \
        -o gp --formats csv --no-tycho2 -q || { echo "gpuphot failed on $frame"; status=1; return; }
    /usr/bin/python3 "$here/match.py" se.cat "gp/$frame.cat.csv" "$frame $filter MINAREA $minarea ${extra[*]}" \
        "${bars[@]}" || status=1
}
bars=(--min-matched 98 --max-aper-dev 0.01 --max-auto-dev 0.01)
run sim default.conv 3 "${bars[@]}"
run sim default.conv 2 "${bars[@]}"
run sim gauss_4.0_7x7.conv 5 "${bars[@]}"
run sim default.conv 5 "${bars[@]}" -- -WEIGHT_TYPE BACKGROUND
run noisy default.conv 3 "${bars[@]}" -- -WEIGHT_TYPE MAP_RMS -WEIGHT_IMAGE noisy.rms.fits
run noisy gauss_4.0_7x7.conv 5 "${bars[@]}" -- -WEIGHT_TYPE MAP_WEIGHT -WEIGHT_IMAGE noisy.weight.fits
for f in panoptes decam; do
    run $f default.conv 3 "${bars[@]}"
    run $f gauss_4.0_7x7.conv 5 "${bars[@]}"
    run $f default.conv 2 "${bars[@]}"
done
exit $status
