#!/bin/bash
# gpuphot's FITS_LDAC catalogs in SCAMP and PSFEx, against source-extractor's LDAC of the same frame with
# the same .sex and .param files (issue bars: SCAMP's astrometric RMS within 20 %, PSFEx's FWHM within
# 5 %), asserted on a simulated field and on the PANOPTES frame (against Tycho-2); the figures are in
# docs/SEXTRACTOR.md. Also reads the ASCII_HEAD catalog back with astropy's SExtractor reader.
#   ldac_peer_test.sh GPUPHOT     (exit 77: source-extractor, scamp or psfex is not installed)
set -uo pipefail
gp=$1
here=$(cd "$(dirname "$0")" && pwd)
share=/usr/share/source-extractor
for t in source-extractor scamp psfex; do command -v $t >/dev/null || { echo "no $t"; exit 77; }; done
[ -f "$share/default.sex" ] || { echo "no source-extractor configuration"; exit 77; }
work=$(mktemp -d /tmp/gpuphot_ldacpeer.XXXXXX)
[ -n "${KEEP:-}" ] && echo "work: $work" || trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
cp "$share/default.sex" "$share/default.conv" .
cp "$here/ldac.param" .
psfex -dd > default.psfex 2>/dev/null
"$gp" simulate --size 1024x1024 --stars 1500 --seed 3 -o . --name sim -q || exit 1
/usr/bin/python3 "$here/ldac_tools.py" prepare "$here/../data/real" . || exit 1
status=0
fail() { echo "FAIL: $*"; status=1; }

check() { # frame reference.ldac assert|report [extra SExtractor keys...]
    local frame=$1 ref=$2 mode=$3; shift 3
    source-extractor "$frame.fits" -c default.sex -PARAMETERS_NAME ldac.param -CATALOG_TYPE FITS_LDAC \
        -CATALOG_NAME "se_$frame.ldac" -VERBOSE_TYPE QUIET "$@" 2>/dev/null || { fail "source-extractor on $frame"; return; }
    rm -rf "gp_$frame"
    "$gp" reduce "$frame.fits" --sex default.sex --param ldac.param -CATALOG_TYPE FITS_LDAC \
        -CATALOG_NAME "gp_$frame.ldac" "$@" -o "gp_$frame" --no-tycho2 -q || { fail "gpuphot on $frame"; return; }
    for who in se gp; do
        local cat="se_$frame.ldac"
        [ $who = gp ] && cat="gp_$frame/gp_$frame.ldac"
        mkdir -p "psf_${who}_$frame"
        psfex "$cat" -c default.psfex -CHECKPLOT_TYPE NONE -CHECKIMAGE_TYPE NONE -WRITE_XML N \
            -PSF_DIR "psf_${who}_$frame" -VERBOSE_TYPE QUIET || fail "psfex on $who $frame"
        scamp "$cat" -ASTREF_CATALOG FILE -ASTREFCAT_NAME "$ref" -SOLVE_PHOTOM N -CHECKPLOT_TYPE NONE \
            -WRITE_XML Y -XML_NAME "scamp_${who}_$frame.xml" -VERBOSE_TYPE QUIET || fail "scamp on $who $frame"
    done
    /usr/bin/python3 "$here/ldac_tools.py" compare "$frame" --max-fwhm-dev 0.05 --max-rms-ratio 1.2 ||
        [ "$mode" = report ] || status=1
}
check sim sim_ref.ldac assert
check panoptes panoptes_ref.ldac assert

# ASCII_HEAD, SExtractor's default CATALOG_TYPE and CATALOG_NAME: read with astropy's SExtractor reader.
"$gp" reduce sim.fits --sex default.sex --param ldac.param -o ascii --no-tycho2 -q || fail "gpuphot ASCII_HEAD"
/usr/bin/python3 "$here/ldac_tools.py" ascii ascii/test.cat gp_sim/gp_sim.ldac || status=1
exit $status
