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
run sim default.conv 3 "${bars[@]}" -- -BACK_TYPE MANUAL -BACK_VALUE 300
run noisy default.conv 3 "${bars[@]}" -- -WEIGHT_TYPE MAP_RMS -WEIGHT_IMAGE noisy.rms.fits
run noisy gauss_4.0_7x7.conv 5 "${bars[@]}" -- -WEIGHT_TYPE MAP_WEIGHT -WEIGHT_IMAGE noisy.weight.fits
# FLAG_IMAGE: IMAFLAGS_ISO and NIMAFLAGS_ISO of a flag map of overlapping bit regions, every seventh row
# flagged and a corner of random values; the same composite for >= 95 % of the matched objects.
/usr/bin/python3 -c "
import numpy as np
from astropy.io import fits
f = np.zeros((1024, 1024), np.int16)
f[200:400, 100:600] |= 1
f[300:700, 500:900] |= 4
f[::7, :] |= 2
f[800:1000, 0:300] = np.random.default_rng(4).integers(0, 9, (200, 300)).astype(np.int16)
fits.writeto('sim.flag.fits', f)
" || exit 1
printf 'X_IMAGE\nY_IMAGE\nIMAFLAGS_ISO\nNIMAFLAGS_ISO\n' > flag.param
for t in OR AND MIN MAX MOST; do
    source-extractor sim.fits -c default.sex -PARAMETERS_NAME flag.param -FLAG_IMAGE sim.flag.fits -FLAG_TYPE $t \
        -CATALOG_NAME se_flag.cat -VERBOSE_TYPE QUIET 2>/dev/null || { echo "source-extractor failed (flags)"; status=1; continue; }
    rm -rf gpf
    "$gp" reduce sim.fits --sex default.sex -PARAMETERS_NAME flag.param -FLAG_IMAGE sim.flag.fits -FLAG_TYPE $t \
        -CATALOG_NAME gp_flag.cat -o gpf --no-tycho2 -q || { echo "gpuphot failed (flags)"; status=1; continue; }
    min=95
    [ $t = AND ] && min=0 # SExtractor's AND starts from 0 and always gives 0; gpuphot ANDs the non-zero flags
    /usr/bin/python3 "$here/match_flags.py" se_flag.cat gpf/gp_flag.cat "$t" "$min" || status=1
done
for f in panoptes decam; do
    run $f default.conv 3 "${bars[@]}"
    run $f gauss_4.0_7x7.conv 5 "${bars[@]}"
    run $f default.conv 2 "${bars[@]}"
done
exit $status
