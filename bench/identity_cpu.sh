#!/usr/bin/env bash
# A refactoring's acceptance on the CPU backend: two gpuphot binaries (a reference build and this tree's)
# simulate and reduce the same frames, and every output must be the same byte for byte: the simulated
# frames and reference catalogs, the catalogs (CSV, and the FITS table's data), the SExtractor-configured
# run's effective configuration, and the reports less their timings and software fields.
#   bench/identity_cpu.sh REF_GPUPHOT NEW_GPUPHOT [WORK]     (WORK default /tmp/gpuphot-identity-cpu)
# The frames cover each stage's branches: the demo field; a crowded (one star per 300 px²), elliptical
# field whose FWHM varies by 30 % with cosmic rays and hot pixels, reduced with --cosmics; a frame without a
# WCS (blind solve); a frame whose header WCS is off (refinement); the bundled PANOPTES and DECam frames
# with their real reference catalogs. GPU frames: bench/identity_session.sh on the device.
# Exit status 0 when everything is identical, 1 otherwise.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
REF=$(realpath "$1") NEW=$(realpath "$2")
WORK=${3:-/tmp/gpuphot-identity-cpu}
rm -rf "$WORK" && mkdir -p "$WORK"
status=0
say() { echo "$*"; }
same() { # what fileA fileB
    if cmp -s "$2" "$3"; then say "  same: $1"; else say "  DIFFERS: $1 ($2 vs $3)"; status=1; fi
}
# simulate NAME ARGS...: both binaries, frames and reference catalogs compared, the reference's kept.
simulate() {
    local name=$1; shift
    for b in ref new; do
        local bin=$REF; [ $b = new ] && bin=$NEW
        "$bin" simulate -o "$WORK/sim-$b" --name "$name" -q "$@" || { say "  simulate $name ($b) failed"; status=1; }
    done
    same "simulated $name.fits" "$WORK/sim-ref/$name.fits" "$WORK/sim-new/$name.fits"
    [ -f "$WORK/sim-ref/$name.ref.fits" ] && same "simulated $name.ref.fits" "$WORK/sim-ref/$name.ref.fits" "$WORK/sim-new/$name.ref.fits"
}
# strip the parts of a report that differ between runs of one binary (times, paths, software)
normalise() {
    /usr/bin/python3 - "$1" <<'PY'
import json, sys
def clean(o):
    if isinstance(o, dict):
        return {k: clean(v) for k, v in o.items()
                if not any(t in k for t in ("time", "_ms", "seconds", "software", "version", "host", "date", "path", "output", "peak", "memory", "threads"))}
    if isinstance(o, list):
        return [clean(v) for v in o]
    return o
print(json.dumps(clean(json.load(open(sys.argv[1]))), indent=1, sort_keys=True))
PY
}
# reduce NAME FRAME ARGS...: both binaries on the CPU backend
reduce() {
    local name=$1 frame=$2; shift 2
    say "== $name"
    for b in ref new; do
        local bin=$REF; [ $b = new ] && bin=$NEW
        mkdir -p "$WORK/$b-$name"
        "$bin" reduce "$frame" --backend cpu --no-tycho2 --formats csv -o "$WORK/$b-$name" -q "$@" \
            >"$WORK/$b-$name/stdout.txt" 2>&1
        echo $? >"$WORK/$b-$name/exit"
    done
    same "$name exit status" "$WORK/ref-$name/exit" "$WORK/new-$name/exit"
    local stem; stem=$(basename "$frame"); stem=${stem%%.fits*}
    same "$name catalog CSV" "$WORK/ref-$name/$stem.cat.csv" "$WORK/new-$name/$stem.cat.csv"
    if [ -f "$WORK/ref-$name/$stem.cat.fits" ]; then
        if /usr/bin/python3 -c "
import sys; from astropy.io import fits; import numpy as np
a = fits.open(sys.argv[1]); b = fits.open(sys.argv[2])
ok = len(a) == len(b) and all((x.data is None and y.data is None) or (x.data.tobytes() == y.data.tobytes()) for x, y in zip(a[1:], b[1:]))
sys.exit(0 if ok else 1)" "$WORK/ref-$name/$stem.cat.fits" "$WORK/new-$name/$stem.cat.fits"; then
            say "  same: $name FITS table data"
        else say "  DIFFERS: $name FITS table data"; status=1; fi
    fi
    normalise "$WORK/ref-$name/$stem.report.json" >"$WORK/ref-$name/report.norm" 2>/dev/null
    normalise "$WORK/new-$name/$stem.report.json" >"$WORK/new-$name/report.norm" 2>/dev/null
    same "$name report (less times)" "$WORK/ref-$name/report.norm" "$WORK/new-$name/report.norm"
    say "  rows: $(wc -l <"$WORK/new-$name/$stem.cat.csv" 2>/dev/null), exit $(cat "$WORK/new-$name/exit")"
}

say "== simulate"
simulate demo --config "$here/resources/demo/simulate.json"
simulate crowded --size 1024x1024 --stars 3500 --seed 7 --fwhm 3.0 --fwhm-corner 1.3 --set ellipticity=0.15 \
    --set ellipticityCorner=0.25 --set cosmicRays=60 --set hotPixels=30
simulate noWcs --size 1024x1024 --stars 800 --seed 3 --no-wcs
simulate offWcs --size 1536x1536 --stars 1500 --seed 4 --wcs-offset 2 --wcs-rotation 0.5 --bitpix 16
S=$WORK/sim-ref
reduce demo "$S/demo.fits" --ref "$S/demo.ref.fits" --formats csv,fits
reduce crowded "$S/crowded.fits" --ref "$S/crowded.ref.fits" --cosmics --formats csv,fits
reduce noWcs "$S/noWcs.fits" --ref "$S/noWcs.ref.fits"
reduce offWcs "$S/offWcs.fits" --ref "$S/offWcs.ref.fits"
D=$here/tests/data/real
reduce panoptes "$D/panoptes_solved.fits.fz" --ref "$D/tycho2_panoptes_field.fits"
reduce decam "$D/decam_ls9_N6_cutout.fits" --ref "$D/gaia_dr2_chunk_for_decam_cutout.fits"
# A SExtractor configuration: the keys' mapping onto the parameters.
cat >"$WORK/field.sex" <<'SEX'
DETECT_MINAREA   7
DETECT_THRESH    2.0
ANALYSIS_THRESH  2.0
FILTER           Y
DEBLEND_NTHRESH  24
DEBLEND_MINCONT  0.01
CLEAN            Y
CLEAN_PARAM      1.2
PHOT_APERTURES   4,8,12
PHOT_AUTOPARAMS  2.5,3.5
SATUR_LEVEL      60000
GAIN             1.5
PIXEL_SCALE      0
SEEING_FWHM      1.1
BACK_SIZE        128
BACK_FILTERSIZE  5
BACKPHOTO_TYPE   LOCAL
BACKPHOTO_THICK  20
MAG_ZEROPOINT    25.0
SEX
for b in ref new; do
    bin=$REF; [ $b = new ] && bin=$NEW
    "$bin" reduce "$S/demo.fits" --sex "$WORK/field.sex" --dump-config >"$WORK/$b-sex-config.json" 2>&1
done
same "SExtractor configuration applied" "$WORK/ref-sex-config.json" "$WORK/new-sex-config.json"
reduce demoSex "$S/demo.fits" --ref "$S/demo.ref.fits" --sex "$WORK/field.sex"
if [ $status = 0 ]; then say "IDENTICAL"; else say "DIFFERENCES FOUND"; fi
exit $status
