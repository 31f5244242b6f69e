#!/usr/bin/env bash
# `gpuphot reduce --sex` on the GPU machine: the CUDA backend's SExtractor catalogs (ASCII_HEAD and
# FITS_LDAC, every column gpuphot writes) and its own CSV against the CPU backend's, byte for byte, over the
# configurations of tests/sextractor/sex_peer_test.sh (filters, MINAREA, WEIGHT_TYPE NONE, BACKGROUND,
# MAP_RMS, MAP_WEIGHT, BACK_TYPE MANUAL, a flag image) on a simulated field, a noisier copy with its maps,
# the PANOPTES and DECam frames of tests/data and a crowded 4096 x 4096 field simulated there.
#   bench/sex_identity_session.sh prepare DIR   here (python3 with astropy): the configuration and the noisy
#                                               field's maps into DIR (tar them as DIR/sex-inputs.tar.xz to
#                                               carry them)
#   bench/sex_identity_session.sh run DIR       there: DEVICE_DIR/bin/gpuphot (bench/pack_device.sh)
# OUT (default ./sex-identity-out): sex_identity.log. Exit 1 when any pair differs.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
mode=${1:?prepare or run}
dir=$(mkdir -p "${2:?DIR}" && cd "$2" && pwd)

prepare() {
    local share=/usr/share/source-extractor gp=${GPUPHOT:-$HERE/../build/app/gpuphot}
    cp "$share/default.sex" "$share/default.conv" "$share/gauss_4.0_7x7.conv" "$dir"/
    cp "$HERE/sex_identity.param" "$dir/full.param"
    grep -v IMAFLAGS "$HERE/sex_identity.param" > "$dir/full.noflag.param"
    "$gp" simulate --size 1024x1024 --stars 1500 --seed 3 -o "$dir" --name sim -q || exit 1
    /usr/bin/python3 - "$dir" <<'PY' || exit 1
import sys
import numpy as np
from astropy.io import fits
d = sys.argv[1]
h = fits.open(f'{d}/sim.fits')
img = h[0].data.astype('float32')
sky = float(np.std(img[:50, :50]))
extra = np.zeros_like(img)
extra[:, img.shape[1] // 2:] = 2.0 * sky
rng = np.random.default_rng(1)
fits.writeto(f'{d}/noisy.fits', img + rng.normal(0.0, 1.0, img.shape).astype('float32') * extra,
             h[0].header, overwrite=True)
var = sky * sky + extra * extra
fits.writeto(f'{d}/noisy.rms.fits', np.sqrt(var).astype('float32'), overwrite=True)
w = (3.7 / var).astype('float32')
w[100:200, 100:200] = 0.0
fits.writeto(f'{d}/noisy.weight.fits', w, overwrite=True)
f = np.zeros(img.shape, np.int16)
f[200:400, 100:600] |= 1
f[300:700, 500:900] |= 4
f[::7, :] |= 2
fits.writeto(f'{d}/flag.fits', f, overwrite=True)
PY
    rm -f "$dir"/sim.*
    du -sh "$dir"
}

run_all() {
    local gp="${DEVICE_DIR:-$HERE/../.device}/bin/gpuphot" out=${OUT:-./sex-identity-out} status=0 n=0
    export LD_LIBRARY_PATH="${DEVICE_DIR:-$HERE/../.device}/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    mkdir -p "$out"
    local log="$out/sex_identity.log"
    : > "$log"
    cd "$dir" || exit 1
    [ -f sex-inputs.tar.xz ] && tar xJf sex-inputs.tar.xz
    "$gp" simulate --size 1024x1024 --stars 1500 --seed 3 -o . --name sim -q >> "$log" 2>&1
    "$gp" simulate --size 4096x4096 --stars 40000 --seed 5 -o . --name crowded -q >> "$log" 2>&1
    ln -sf "$HERE/../tests/data/real/panoptes_solved.fits.fz" panoptes.fits.fz
    ln -sf "$HERE/../tests/data/real/decam_ls9_N6_cutout.fits" decam.fits
    one() { # frame tag keys...   (FRAME.fits, else FRAME.fits.fz)
        local frame=$1 tag=$2 file=$1.fits; shift 2
        [ -f "$file" ] || file=$frame.fits.fz
        for backend in cpu cuda; do
            for type in ASCII_HEAD FITS_LDAC; do
                rm -rf "o.$backend.$type"
                "$gp" reduce "$file" --sex default.sex -PARAMETERS_NAME full.param -FLAG_IMAGE flag.fits \
                    -PHOT_APERTURES 5,10,15 -PHOT_FLUXFRAC 0.3,0.5,0.9 -CATALOG_TYPE "$type" -CATALOG_NAME s.cat \
                    "$@" --backend "$backend" --formats csv --no-tycho2 -o "o.$backend.$type" -q >> "$log" 2>&1 ||
                    { echo "$tag $backend $type: exit $?" | tee -a "$log"; status=1; }
            done
        done
        for f in ASCII_HEAD/s.cat FITS_LDAC/s.cat ASCII_HEAD/$frame.cat.csv; do
            n=$((n + 1))
            if cmp -s "o.cpu.${f%%/*}/${f#*/}" "o.cuda.${f%%/*}/${f#*/}"; then
                echo "$tag ${f}: CUDA = CPU ($(wc -c < "o.cpu.${f%%/*}/${f#*/}") bytes)" | tee -a "$log"
            else
                echo "$tag ${f}: CUDA DIFFERS from CPU" | tee -a "$log"; status=1
            fi
        done
    }
    one sim default3 -FILTER_NAME default.conv -DETECT_MINAREA 3
    one sim default2 -FILTER_NAME default.conv -DETECT_MINAREA 2
    one sim gauss5 -FILTER_NAME gauss_4.0_7x7.conv -DETECT_MINAREA 5
    one sim background -WEIGHT_TYPE BACKGROUND -DETECT_MINAREA 5
    one sim manual -BACK_TYPE MANUAL -BACK_VALUE 300
    one sim noclean -CLEAN N -BACKPHOTO_TYPE LOCAL
    one noisy map_rms -WEIGHT_TYPE MAP_RMS -WEIGHT_IMAGE noisy.rms.fits
    one noisy map_weight -FILTER_NAME gauss_4.0_7x7.conv -DETECT_MINAREA 5 -WEIGHT_TYPE MAP_WEIGHT \
        -WEIGHT_IMAGE noisy.weight.fits
    one panoptes panoptes -PARAMETERS_NAME full.noflag.param
    one decam decam -PARAMETERS_NAME full.noflag.param
    one crowded crowded -PARAMETERS_NAME full.noflag.param
    echo "$n comparisons, status $status" | tee -a "$log"
    exit $status
}

case "$mode" in
prepare) prepare ;;
run) run_all ;;
*) echo "mode: prepare or run" >&2; exit 2 ;;
esac
