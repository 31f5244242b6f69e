#!/usr/bin/env python3
"""Checks `gpuphot series` against the truth of `gpuphot simulate --series` (tests/series/series_e2e.sh).

  check_series.py targets SIMDIR NAME TARGETS.csv     the transit host, constant stars, an off-field target
  check_series.py check SIMDIR NAME OUTDIR RADIUS [--bars]
  check_series.py variability SIMDIR NAME OUTDIR [--bars]
  check_series.py detrend SIMDIR NAME PLAIN_OUTDIR DETRENDED_OUTDIR RADIUS [--bars]

`check` prints the figures as JSON: the transit's depth and mid-time from a fit of the simulator's
trapezoid to the light curve, and for each constant target the RMS of its differential curve over the
noise the simulator put in. That noise comes from the simulator's truth alone: per exposure, each star's
true flux, the enclosed fraction of its true Moffat PSF in the aperture of RADIUS px, the sky, gain and
read noise of the simulation, the sky annulus' own noise, and the exposure's scintillation; the
differential noise adds the ensemble's (with the weights the series chose). With --bars it exits 1 when
a bar of issue 23 is missed: depth within 5 %, mid-time within 1 min, the constant stars' median RMS
ratio within 10 % (each within 20 %), no injected variable an active comparison star. With a series
run with --transit the blind fit of series.json (depth, BJD_TDB mid-time, compared with the truth's mid-time
made BJD_TDB by the curve's own bjd_tdb - jd_utc) is checked against the same depth and mid-time bars.

`variability` (a series with --all-stars --variability; issue 24's bars): the injected sinusoid among the
flagged stars of series.variables.csv with its period within 1 %, no constant target flagged, no
injected variable an active comparison star. `detrend` (a night simulated with colourExtinction, its
series without and with --detrend airmass): the constant stars' median RMS lowered, the fitted airmass
coefficient of each as the truth gives it (the colour of the star against its ensemble's, times the
colour extinction) within 3 sigma + 20 %, and the detrended RMS within 10 % of the truth noise (median).
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
    variables = truth.get("variables", [])  # none when the night was simulated without
    var_ids = {v["id"] for v in variables}
    transit = [v for v in variables if v["kind"] == "transit"]
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


def fitted_transit(fit, lc, truth):
    """series --transit's blind fit against the truth. The truth's mid-time is UTC MJD of mid-exposure;
    ours is BJD_TDB: the truth becomes BJD_TDB with the light curve's own bjd_tdb - jd_utc at the point
    nearest to it (that offset changes by well under a millisecond per hour)."""
    mid_mjd = truth["transit_mid_mjd"]
    i = int(np.argmin(np.abs(lc["mjd_mid"] - mid_mjd)))
    mid_bjd = mid_mjd + 2400000.5 + (float(lc["bjd_tdb"][i]) - float(lc["jd_utc"][i]))
    depth_true = truth["series"]["transitDepth"]
    out = {"found": fit["found"], "depth": fit["depth"], "depth_err": fit["depth_err"], "snr": fit["snr"],
           "duration_h": fit["duration_h"], "duration_true_h": truth["series"]["transitDuration"],
           "ingress": fit["ingress"], "mid_err_min": fit["mid_err_min"]}
    if fit["depth"] is not None and fit["mid_bjd_tdb"] is not None:
        out["depth_error_fraction"] = fit["depth"] / depth_true - 1.0
        out["mid_error_min"] = (fit["mid_bjd_tdb"] - mid_bjd) * 1440.0
    return out


def truth_variance(simdir, truth, frames, radius):
    """rel_var(ra, dec): per used frame, the variance of a star's relative flux from the truth alone."""
    field = truth["field"]
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

    return rel_var


def truth_noise(t, rel_var):
    """Per used frame, the variance of a target's relative flux that the simulator put in (its own and its
    ensemble's, with the weights the series chose), and the active comparison stars."""
    var = rel_var(t["ra"], t["dec"])
    ens = [c for c in t["ensemble"] if not c["dropped"]]
    wsum = sum(c["weight"] for c in ens)
    for c in ens:
        var = var + (c["weight"] / wsum) ** 2 * rel_var(c["ra"], c["dec"])
    return var, ens


def active_variables(report, variables):
    """Injected variables among the active comparison stars of the targets' ensembles."""
    n = 0
    for t in report["targets"]:
        for c in t["ensemble"]:
            if c["dropped"]:
                continue
            for v in variables:
                if nearest(v["ra"], v["dec"], np.array([c["ra"]]), np.array([c["dec"]]))[1] < 1.0:
                    n += 1
    return n


def cmd_check(simdir, name, outdir, radius, bars):
    truth = load_truth(simdir, name)
    series = truth["series"]
    report = json.load(open(os.path.join(outdir, "series.json")))
    frames = [f for f in report["frames"] if f["used"]]
    rel_var = truth_variance(simdir, truth, frames, radius)
    result = {"frames_used": len(frames), "constant": []}
    variables = truth.get("variables", [])
    active = active_variables(report, variables)
    result["variables_as_active_comparisons"] = active
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
            if "transit" in t:
                result["fitted_transit"] = fitted_transit(t["transit"], lc, truth)
            continue
        var, ens = truth_noise(t, rel_var)
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
    ft = result.get("fitted_transit")
    if ft is not None:  # series --transit: the blind fit's figures have the same bars
        if not ft["found"] or "depth_error_fraction" not in ft:
            fails.append("the blind transit fit found no transit")
        else:
            if abs(ft["depth_error_fraction"]) > 0.05:
                fails.append("fitted depth off by %.1f %%" % (100 * ft["depth_error_fraction"]))
            if abs(ft["mid_error_min"]) > 1.0:
                fails.append("fitted mid-time off by %.2f min" % ft["mid_error_min"])
    if not ratios or abs(result["constant_median_ratio"] - 1.0) > 0.10:
        fails.append("constant stars' median RMS / truth noise = %s" % result["constant_median_ratio"])
    fails += ["%s: RMS / truth noise %.3f" % (c["name"], c["ratio"]) for c in result["constant"]
              if abs(c["ratio"] - 1.0) > 0.20]
    if active:
        fails.append("%d injected variables are active comparison stars" % active)
    for f in fails:
        print("check_series: FAIL " + f, file=sys.stderr)
    return 1 if fails else 0


def read_csv(path):
    import csv
    with open(path) as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def cmd_variability(simdir, name, outdir, bars):
    truth = load_truth(simdir, name)
    report = json.load(open(os.path.join(outdir, "series.json")))
    flagged = read_csv(os.path.join(outdir, "series.variables.csv"))
    stars = fits.getdata(os.path.join(outdir, "series.stars.fits"), 1)
    fra = np.array([float(r["ra"]) for r in flagged])
    fdec = np.array([float(r["dec"]) for r in flagged])
    result = {"flagged": len(flagged), "stars": len(stars), "variables": {}}
    injected = 0
    for v in truth["variables"]:
        i, d = nearest(v["ra"], v["dec"], stars["ra"], stars["dec"])
        entry = {"stetson_j": float(stars["stetson_j"][i]), "chi2": float(stars["chi2"][i]),
                 "flagged": False}
        if len(flagged):
            k, dk = nearest(v["ra"], v["dec"], fra, fdec)
            if dk < 1.0:
                injected += 1
                entry["flagged"] = True
                entry["best_period_h"] = float(flagged[k]["best_period"]) * 24.0
                if v["kind"] == "sine":
                    entry["period_error"] = entry["best_period_h"] / truth["series"]["sinePeriod"] - 1.0
        result["variables"][v["kind"]] = entry
    result["flagged_not_injected"] = len(flagged) - injected
    consts = [t for t in report["targets"] if t["name"].startswith("const") and not t.get("problem")]
    result["constant_targets_stetson_j"] = [t["variability"]["stetson_j"] for t in consts]
    result["constant_targets_flagged"] = sum(1 for t in consts if t["variability"]["variable"])
    result["variables_as_active_comparisons"] = active_variables(report, truth["variables"])
    print(json.dumps(result, indent=1))
    if not bars:
        return 0
    fails = []
    sine = result["variables"].get("sine")
    if sine is None or not sine["flagged"]:
        fails.append("the sinusoidal variable is not flagged")
    elif abs(sine["period_error"]) > 0.01:
        fails.append("its period is off by %.2f %%" % (100 * sine["period_error"]))
    if result["constant_targets_flagged"]:
        fails.append("%d constant targets flagged" % result["constant_targets_flagged"])
    if result["variables_as_active_comparisons"]:
        fails.append("%d injected variables are active comparison stars" % result["variables_as_active_comparisons"])
    for f in fails:
        print("check_series: FAIL " + f, file=sys.stderr)
    return 1 if fails else 0


def colour_of(ra, dec, t0):
    return float(t0["colour"][nearest(ra, dec, t0["ra"], t0["dec"])[0]])


def cmd_detrend(simdir, name, plain, detrended, radius, bars):
    truth = load_truth(simdir, name)
    k2 = truth["series"]["colourExtinction"]
    t0 = truth_table(simdir, truth["frames"][0]["file"])
    before = {t["name"]: t for t in json.load(open(os.path.join(plain, "series.json")))["targets"]}
    report = json.load(open(os.path.join(detrended, "series.json")))
    rel_var = truth_variance(simdir, truth, [f for f in report["frames"] if f["used"]], radius)
    rows = []
    for t in report["targets"]:
        if not t["name"].startswith("const") or t.get("problem"):
            continue
        var, ens = truth_noise(t, rel_var)
        wsum = sum(c["weight"] for c in ens)
        dcol = colour_of(t["ra"], t["dec"], t0) - sum(c["weight"] / wsum * colour_of(c["ra"], c["dec"], t0)
                                                      for c in ens)
        d = t["detrend"]
        rows.append({"name": t["name"], "colour_vs_ensemble": dcol,
                     "coef": d["coef"][0], "coef_err": d["coef_err"][0],
                     "coef_truth": -0.4 * math.log(10.0) * k2 * dcol,  # d rel_flux / d airmass
                     "rms_before": before[t["name"]]["rms"], "rms_after": t["rms"],
                     "truth_noise": float(np.sqrt(np.mean(var)))})
    result = {"colour_extinction": k2, "constant": rows}
    if rows:
        result["median_rms_before"] = float(np.median([r["rms_before"] for r in rows]))
        result["median_rms_after"] = float(np.median([r["rms_after"] for r in rows]))
        result["median_after_over_truth"] = float(np.median([r["rms_after"] / r["truth_noise"] for r in rows]))
        result["median_before_over_truth"] = float(np.median([r["rms_before"] / r["truth_noise"] for r in rows]))
    print(json.dumps(result, indent=1))
    if not bars:
        return 0
    fails = []
    if not rows:
        fails.append("no constant target")
    else:
        if not result["median_rms_after"] < result["median_rms_before"]:
            fails.append("detrending did not lower the median RMS")
        if abs(result["median_after_over_truth"] - 1.0) > 0.10:
            fails.append("detrended median RMS / truth noise %.3f" % result["median_after_over_truth"])
    for r in rows:
        if abs(r["coef"] - r["coef_truth"]) > 3.0 * r["coef_err"] + 0.2 * abs(r["coef_truth"]):
            fails.append("%s: airmass coefficient %.5f +- %.5f, truth %.5f" % (r["name"], r["coef"], r["coef_err"],
                                                                              r["coef_truth"]))
    for f in fails:
        print("check_series: FAIL " + f, file=sys.stderr)
    return 1 if fails else 0


def main():
    if len(sys.argv) >= 5 and sys.argv[1] == "targets":
        cmd_targets(sys.argv[2], sys.argv[3], sys.argv[4])
        return 0
    if len(sys.argv) >= 6 and sys.argv[1] == "check":
        return cmd_check(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]), "--bars" in sys.argv)
    if len(sys.argv) >= 5 and sys.argv[1] == "variability":
        return cmd_variability(sys.argv[2], sys.argv[3], sys.argv[4], "--bars" in sys.argv)
    if len(sys.argv) >= 7 and sys.argv[1] == "detrend":
        return cmd_detrend(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], float(sys.argv[6]),
                           "--bars" in sys.argv)
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
