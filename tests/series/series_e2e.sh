#!/usr/bin/env bash
# End to end: a simulated night (gpuphot simulate --series) reduced frame by frame, then `gpuphot series`
# on the catalogs, checked against the simulator's truth by check_series.py (issue 23's bars: the
# transit's depth within 5 % and mid-time within 1 min, both from a fit of the simulator's shape and from
# series --transit's blind fit, constant stars' RMS within 10 % of the noise the
# simulator put in, no injected variable as a comparison star), with frames that do not belong (another
# field, another filter, no WCS) and a target off the field reported, and an append of the last frames;
# then the same catalogs with --all-stars --variability (issue 24's bars: the sinusoid flagged and its
# period within 1 %, no constant target flagged, no injected variable an active comparison star).
#
#   series_e2e.sh GPUPHOT [FRAMES] [WxH] [STARS] [WORKDIR]
#
# Defaults: the acceptance series of docs/ACCURACY.md: 300 frames at 60 s cadence, airmass 1.0-2.0,
# 10 % transparency, 2 px jitter, a 1 % 2 h transit on a S/N 500 star, 1024x1024 with 1500 stars.
set -euo pipefail
gpuphot=$1 frames=${2:-300} size=${3:-1024x1024} stars=${4:-1500}
work=${5:-$(mktemp -d /tmp/gpuphot-series-e2e.XXXXXX)}
here=$(cd "$(dirname "$0")" && pwd)
py=/usr/bin/python3
[[ -x $py ]] && $py -c "import astropy, numpy" 2>/dev/null || { echo "skipped: needs python3-astropy"; exit 77; }
[[ -n ${5:-} ]] || trap 'rm -rf "$work"' EXIT
radius=4
aper=3 # --aper 2,3,4,6: the 4 px aperture (1.3 FWHM)
sim=$work/sim red=$work/red out=$work/out

echo "== simulate $frames frames"
"$gpuphot" simulate --series "$frames" --size "$size" --stars "$stars" --seed 23 -o "$sim" --name night -q \
    --set writeSite=true
"$gpuphot" simulate --size "$size" --stars "$stars" --seed 5 --set ra=151.0 -o "$sim/other" --name elsewhere -q

echo "== reduce"
mapfile -t fits < <(ls "$sim"/night_*.fits | grep -v -e truth -e ref | sort)
"$gpuphot" reduce "${fits[@]}" --ref "$sim/night_0001.ref.fits" --no-tycho2 --aper 2,3,4,6 -o "$red" -q
"$gpuphot" reduce "$sim/other/elsewhere.fits" --ref "$sim/other/elsewhere.ref.fits" --no-tycho2 --aper 2,3,4,6 \
    -o "$red" -q
# Two copies of the first catalog that do not belong: another filter, no WCS.
$py - "$red" <<'EOF'
import sys
from astropy.io import fits
d = sys.argv[1]
for name, key, value in (("zfilter", "FILTER", "i"), ("zwcs", "WCSSRC", "none")):
    with fits.open(d + "/night_0001.cat.fits") as h:
        h[1].header[key] = value
        h[1].header["MJD-MID"] = h[1].header["MJD-MID"] + 1e-4
        h.writeto(d + "/" + name + ".cat.fits", overwrite=True)
EOF
$py "$here/check_series.py" targets "$sim" night "$work/targets.csv"

echo "== series"
mapfile -t cats < <(ls "$red"/*.cat.fits | sort)
last=$((${#cats[@]} - 6)) # the last 3 night frames (and the 3 bad ones after them in name order) appended
set +e
"$gpuphot" series "${cats[@]:0:last}" --targets "$work/targets.csv" -o "$out" --flux "aper_$aper" \
    --telescope-diameter 0.5 --transit -q
rc1=$?
"$gpuphot" series "${cats[@]:last}" --targets "$work/targets.csv" -o "$out" --flux "aper_$aper" \
    --telescope-diameter 0.5 --transit -q
rc2=$?
set -e
[[ $rc1 == 1 && $rc2 == 1 ]] || { echo "FAIL: exit $rc1 / $rc2, expected 1 (frames left out, a target off the field)"; exit 1; }
$py - "$out/series.json" "$frames" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
n = int(sys.argv[2])
assert r["appended"], "the second call appended to the state"
problems = {f["path"].split("/")[-1]: f.get("problem", "") for f in r["frames"]}
assert "another field" in problems["elsewhere.cat.fits"], problems["elsewhere.cat.fits"]
assert "filter" in problems["zfilter.cat.fits"], problems["zfilter.cat.fits"]
assert "no WCS" in problems["zwcs.cat.fits"], problems["zwcs.cat.fits"]
assert r["frames_used"] == n, r["frames_used"]
off = [t for t in r["targets"] if t["name"] == "offfield"][0]
assert "not detected" in off.get("problem", ""), off
print("bad input reported: another field, another filter, no WCS, a target off the field")
EOF
$py "$here/check_series.py" check "$sim" night "$out" "$radius" --bars | tee "$work/figures.json"

echo "== series --all-stars --variability (issue 24: the sinusoid flagged, its period)"
var=$work/var
set +e
"$gpuphot" series "${cats[@]}" --targets "$work/targets.csv" -o "$var" --flux "aper_$aper" \
    --telescope-diameter 0.5 --all-stars --variability -q
rc=$?
set -e
[[ $rc == 1 ]] || { echo "FAIL: exit $rc, expected 1 (frames left out, a target off the field)"; exit 1; }
$py "$here/check_series.py" variability "$sim" night "$var" --bars | tee "$work/variability.json"

echo "== series on raw frames (reduced first into DIR/catalogs), then one more appended"
raw=$work/raw
"$gpuphot" series "${fits[@]:0:6}" --ref "$sim/night_0001.ref.fits" --targets "$work/targets.csv" -o "$raw" \
    --aper 2,3,4,6 --no-tycho2 --flux "aper_$aper" -q --db "$raw/night.sqlite" || true
"$gpuphot" series "${fits[6]}" --ref "$sim/night_0001.ref.fits" --targets "$work/targets.csv" -o "$raw" \
    --aper 2,3,4,6 --no-tycho2 --flux "aper_$aper" -q --db "$raw/night.sqlite" || true
# --db: the seven frames and the transit's seven points (replaced, not added, by the append's rewrite).
"$gpuphot" query --db "$raw/night.sqlite" --format json frames >"$work/db_frames.json"
"$gpuphot" query --db "$raw/night.sqlite" --format json series transit >"$work/db_transit.json"
$py - "$raw" <<'EOF2'
import json, os, sys
d = sys.argv[1]
r = json.load(open(d + "/series.json"))
assert r["appended"] and r["frames_used"] == 7, (r["appended"], r["frames_used"])
cats = sorted(f for f in os.listdir(d + "/catalogs") if f.endswith(".cat.fits"))
assert len(cats) == 7 and os.path.exists(d + "/catalogs/night_0001.targets.fits"), cats
assert os.path.exists(d + "/transit.lc.ecsv")
w = os.path.dirname(d)
frames = json.load(open(w + "/db_frames.json"))
transit = json.load(open(w + "/db_transit.json"))
assert len(frames) == 7, len(frames)
assert len(transit) == 7 and all(p["rel_flux"] is not None for p in transit), transit
assert [p["bjd_tdb"] for p in transit] == sorted(p["bjd_tdb"] for p in transit)
print("raw frames: reduced into catalogs/ (with forced photometry), series built and appended; "
      "frames and the transit's points in the database")
EOF2
