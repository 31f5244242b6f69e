#!/usr/bin/env python3
"""Checks `gpuphot series` against the truth of `gpuphot simulate --series` (tests/series/series_e2e.sh).

  check_series.py targets SIMDIR NAME TARGETS.csv     the transit host, constant stars, an off-field target
  check_series.py check SIMDIR NAME OUTDIR RADIUS [--bars]

`check` prints the figures as JSON: the transit's depth and mid-time from a fit of the simulator's
trapezoid to the light curve, and for each constant target the RMS of its differential curve over the
noise the simulator put in. That noise comes from the simulator's truth alone: per exposure, each star's
true flux, the enclosed fraction of its true Moffat PSF in the aperture of RADIUS px, the sky, gain and
read noise of the simulation, the sky annulus' own noise, and the exposure's scintillation; the
differential noise adds the ensemble's (with the weights the series chose). With --bars it exits 1 when
a bar of issue 23 is missed: depth within 5 %, mid-time within 1 min, the constant stars' median RMS
ratio within 10 % (each within 20 %), no injected variable an active comparison star.
"""
import json
import math
import os
import sys

import numpy as np
from astropy.io import fits


def load_truth(simdir, name):
    with open(os.path.join(simdir, name + ".series.json")) as f:
        return json.load(f)


def truth_table(simdir, frame_file):
    return fits.getdata(os.path.join(simdir, frame_file.replace(".fits", ".truth.fits")), 1)


def cmd_targets(simdir, name, out):
    truth = load_truth(simdir, name)
    t = truth_table(simdir, truth["frames"][0]["file"])
    var_ids = {v["id"] for v in truth["variables"]}
    transit = [v for v in truth["variables"] if v["kind"] == "transit"]
    stars = (t["is_galaxy"] == 0) & (t["saturated"] == 0)
    x, y, flux = t["x"], t["y"], t["flux"]
    ok = []
    # Isolated (no source brighter than a tenth within 10 px) and away from the edges.
    w, h = truth["field"]["width"], truth["field"]["height"]
    for i in np.argsort(-flux):
        if not stars[i] or t["id"][i] in var_ids:
            continue
        if not (30 < x[i] < w - 30 and 30 < y[i] < h - 30):
            continue
        d = np.hypot(x - x[i], y - y[i])
        if np.any((d > 0) & (d < 10) & (flux > 0.1 * flux[i])):
            continue
        ok.append(i)
    # Constant stars: the brightest usable ones (the field's S/N ~ 50-1000 stars), up to eight.
    pick = ok[:8]
    with open(out, "w") as f:
        f.write("name,ra,dec\n")
        for v in transit:
            f.write("transit,%.9f,%.9f\n" % (v["ra"], v["dec"]))
        for k, i in enumerate(pick):
            f.write("const%d,%.9f,%.9f\n" % (k, t["ra"][i], t["dec"][i]))
        f.write("offfield,%.9f,%.9f\n" % (t["ra"][0] + 5.0, t["dec"][0]))


def moffat_ee(r, fwhm, beta):
    alpha = fwhm / (2.0 * math.sqrt(2.0 ** (1.0 / beta) - 1.0))
    return 1.0 - (1.0 + (r / alpha) ** 2) ** (1.0 - beta)


def nearest(ra, dec, ras, decs):
    d = np.hypot((ras - ra) * math.cos(math.radians(dec)), decs - dec) * 3600.0
    i = int(np.argmin(d))
    return i, d[i]


def trapezoid(t, mid, duration, depth):
    """The simulator's transit shape: ingress and egress 10 % of the duration each (fractional loss)."""
    half, ramp = duration / 2.0, 0.1 * duration
    a = np.abs(t - mid)
    s = np.clip((half - a) / ramp, 0.0, 1.0)
    return depth * s


def fit_transit(mjd, flux, err, duration, mid0):
    best = None
    for mid in mid0 + np.arange(-30.0, 30.0 + 1e-9, 1.0 / 12.0) / 1440.0:  # +-30 min, 5 s steps
        shape = trapezoid(mjd, mid, duration, 1.0)
        w = 1.0 / err ** 2
        a = np.vstack([np.ones_like(mjd), -shape]).T
        coef, *_ = np.linalg.lstsq(a * np.sqrt(w)[:, None], flux * np.sqrt(w), rcond=None)
        chi2 = float(np.sum(w * (flux - a @ coef) ** 2))
        if best is None or chi2 < best[0]:
            best = (chi2, mid, coef[1] / coef[0])
    return best[1], best[2]


def cmd_check(simdir, name, outdir, radius, bars):
    truth = load_truth(simdir, name)
    field, series = truth["field"], truth["series"]
    report = json.load(open(os.path.join(outdir, "series.json")))
    frames = [f for f in report["frames"] if f["used"]]
    by_file = {os.path.basename(f["file"]).replace(".fits", ""): f for f in truth["frames"]}
    gain, rn, sky, beta = field["gain"], field["readNoise"], field["sky"], field.get("moffatBeta", 3.0)
    truths = {}
    for f in frames:
        stem = os.path.basename(f["path"]).replace(".cat.fits", "")
        truths[f["path"]] = (by_file[stem], truth_table(simdir, by_file[stem]["file"]))

    def rel_var(ra, dec):
        """Per used frame: the variance of a star's relative flux that the simulator put in."""
        out = []
        for f in frames:
            tf, tt = truths[f["path"]]
            i, d = nearest(ra, dec, tt["ra"], tt["dec"])
            ee = moffat_ee(radius, tt["fwhm"][i], beta)
            s = tt["flux"][i] * ee  # ADU in the aperture
            area = math.pi * radius ** 2
            n_sky = math.pi * (6.0 ** 2 - 4.0 ** 2) * tf["fwhm"] ** 2  # annulus 4-6 FWHM
            pix = sky / gain + (rn / gain) ** 2
            var = s / gain + area * pix * (1.0 + area / n_sky)
            out.append(var / s ** 2 + tf["scintillation"] ** 2)
        return np.array(out)

    result = {"frames_used": len(frames), "constant": []}
    variables = truth["variables"]
    active_variables = 0
    for t in report["targets"]:
        for c in t["ensemble"]:
            if c["dropped"]:
                continue
            for v in variables:
                if nearest(v["ra"], v["dec"], np.array([c["ra"]]), np.array([c["dec"]]))[1] < 1.0:
                    active_variables += 1
    result["variables_as_active_comparisons"] = active_variables
    for t in report["targets"]:
        if t.get("problem"):
            result.setdefault("problems", {})[t["name"]] = t["problem"]
            continue
        lc = fits.getdata(os.path.join(outdir, t["name"] + ".lc.fits"), 1)
        rel, err, mjd = lc["rel_flux"], lc["rel_flux_err"], lc["mjd_mid"]
        good = np.isfinite(rel) & np.isfinite(err)
        if t["name"] == "transit":
            dur = series["transitDuration"] / 24.0
            mid, depth = fit_transit(mjd[good], rel[good], err[good], dur, truth["transit_mid_mjd"])
            result["transit"] = {
                "depth": depth, "depth_true": series["transitDepth"],
                "depth_error_fraction": depth / series["transitDepth"] - 1.0,
                "mid_error_min": (mid - truth["transit_mid_mjd"]) * 1440.0,
                "comparisons": sum(1 for c in t["ensemble"] if not c["dropped"]),
                "median_err": t["median_err"]}
            continue
        var = rel_var(t["ra"], t["dec"])
        ens = [c for c in t["ensemble"] if not c["dropped"]]
        wsum = sum(c["weight"] for c in ens)
        for c in ens:
            var = var + (c["weight"] / wsum) ** 2 * rel_var(c["ra"], c["dec"])
        expected = float(np.sqrt(np.mean(var[good])))
        rms = float(np.sqrt(np.mean((rel[good] - np.median(rel[good])) ** 2)))
        result["constant"].append({"name": t["name"], "rms": rms, "truth_noise": expected, "ratio": rms / expected,
                                   "median_err": t["median_err"], "comparisons": len(ens)})
    ratios = [c["ratio"] for c in result["constant"]]
    result["constant_median_ratio"] = float(np.median(ratios)) if ratios else None
    print(json.dumps(result, indent=1))
    if not bars:
        return 0
    fails = []
    tr = result.get("transit")
    if tr is None:
        fails.append("no transit curve")
    else:
        if abs(tr["depth_error_fraction"]) > 0.05:
            fails.append("depth off by %.1f %%" % (100 * tr["depth_error_fraction"]))
        if abs(tr["mid_error_min"]) > 1.0:
            fails.append("mid-time off by %.2f min" % tr["mid_error_min"])
    if not ratios or abs(result["constant_median_ratio"] - 1.0) > 0.10:
        fails.append("constant stars' median RMS / truth noise = %s" % result["constant_median_ratio"])
    fails += ["%s: RMS / truth noise %.3f" % (c["name"], c["ratio"]) for c in result["constant"]
              if abs(c["ratio"] - 1.0) > 0.20]
    if active_variables:
        fails.append("%d injected variables are active comparison stars" % active_variables)
    for f in fails:
        print("check_series: FAIL " + f, file=sys.stderr)
    return 1 if fails else 0


def main():
    if len(sys.argv) >= 5 and sys.argv[1] == "targets":
        cmd_targets(sys.argv[2], sys.argv[3], sys.argv[4])
        return 0
    if len(sys.argv) >= 6 and sys.argv[1] == "check":
        return cmd_check(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]), "--bars" in sys.argv)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
