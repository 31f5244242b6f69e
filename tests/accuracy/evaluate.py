#!/usr/bin/python3
"""Compare a gpuphot reduction of a make_field.py frame with the generator's truth.

usage: evaluate.py FIELD_DIR OUT_DIR [--stem FRAME] [--json FILE] [--quiet]

FIELD_DIR holds TRUTH.csv, FIELD.json (and MODEL.fits when made with --write-model); OUT_DIR holds
STEM.cat.fits and STEM.report.json from `gpuphot reduce FIELD_DIR/FRAME.fits --ref FIELD_DIR/REF.fits -o OUT_DIR`.

Definitions
  true instrumental mag  m_true = -2.5 log10(total true flux)  (TRUTH.csv flux; ZP_TRUE = FIELD.json zp)
  ZP - true              report zp - ZP_TRUE (the colour term, when fitted, is applied at colour 0, which is where
                         the generator puts ZP_TRUE); pull = (ZP - true) / zp_err
  ISOLATED star          a truth star whose every other star within 5 FWHM (its local FWHM) has less than 1% of
                         its flux, with no brighter star within 10 FWHM, fully inside the frame (frac_in_image
                         > 0.999) and >= 5 FWHM from the edges; matched to the nearest detection within 1 px.
  S/N                    flux_opt / fluxerr_opt of the matched detection
  cal - true             catalog mag_cal minus the truth in the reference system (TRUTH.csv mag_ref)
  calibrator             a detection with the `calibrator` flag (4096): used in the zero-point fit; its truth
                         star is its ref_id (the reference id is the truth id)
  neighbour light        (with MODEL.fits) model flux inside a circle of r = 2 FWHM about the truth position
                         minus the star's own light there, relative to the star's own flux
  sky error              catalog `sky` (local annulus estimate) minus the true sky at the star (ADU/px)
  apcorr check           for the fixed radii r: APCORk of the catalog header (mag_total = mag_aper + APCOR)
                         against the isolated stars' median -2.5 log10(F_true / flux_aper_r) (what the correction
                         should be for the local sky as measured) and against the true-sky value
                         2.5 log10(EE(r)) (EE: the star's own pixel-integrated encircled energy)
"""
import argparse
import csv
import json
import math
import os
import sys

import numpy as np
from astropy.io import fits

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_field  # noqa: E402  (the generator's own PSF, for encircled energies)

CALIBRATOR = 4096


def load_truth(field):
    with open(os.path.join(field, "TRUTH.csv")) as f:
        rows = list(csv.DictReader(f))
    t = {k: np.array([float(r[k]) for r in rows]) for k in rows[0]}
    t["id"] = t["id"].astype(np.int64)
    return t


def grid_index(x, y, cell):
    cells = {}
    gx = np.floor(x / cell).astype(np.int64)
    gy = np.floor(y / cell).astype(np.int64)
    for i in range(len(x)):
        cells.setdefault((gx[i], gy[i]), []).append(i)
    return cells, cell


def neighbours(index, x, y, px, py, r):
    cells, cell = index
    gx0, gx1 = int(math.floor((px - r) / cell)), int(math.floor((px + r) / cell))
    gy0, gy1 = int(math.floor((py - r) / cell)), int(math.floor((py + r) / cell))
    out = []
    for gx in range(gx0, gx1 + 1):
        for gy in range(gy0, gy1 + 1):
            out.extend(cells.get((gx, gy), ()))
    if not out:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    out = np.array(out)
    d = np.hypot(x[out] - px, y[out] - py)
    k = d <= r
    return out[k], d[k]


def circle_weights(cx, cy, r, half, sub=8):
    """Fractional overlap of pixels (centres at integer offsets -half..half about round(cx), round(cy)) with a
    circle of radius r about (cx, cy), by sub x sub sampling. Returns weights and the pixel offsets' origin."""
    ix, iy = int(round(cx)), int(round(cy))
    g = np.arange(-half, half + 1)
    s = (np.arange(sub) + 0.5) / sub - 0.5
    X = (g[None, :, None, None] + s[None, None, None, :] + ix - cx)
    Y = (g[:, None, None, None] + s[None, None, :, None] + iy - cy)
    inside = (X * X + Y * Y) <= r * r
    return inside.mean(axis=(2, 3)), ix, iy


def own_ee(t, i, meta, radii):
    """Pixel-integrated encircled energy of truth star i for the given radii (the generator's profile)."""
    x0, y0 = t["x"][i] - 1.0, t["y"][i] - 1.0
    S = int(math.ceil(meta["trunc"] * t["fwhm"][i] / math.sqrt(1 - t["ell"][i]))) + 1
    g = np.arange(-S, S + 1)
    GX, GY = np.meshgrid(g, g)
    ix, iy = int(round(x0)), int(round(y0))
    dx = (GX.ravel() - (x0 - ix))[None, :]
    dy = (GY.ravel() - (y0 - iy))[None, :]
    n, w = make_field.gauss_legendre(5)
    v = make_field.render_batch(dx, dy, t["fwhm"][i:i + 1], t["ell"][i:i + 1],
                                np.deg2rad(t["theta_deg"][i:i + 1]), meta["beta"], meta["trunc"], n, w)[0]
    v = (v / v.sum()).reshape(GX.shape)
    out = []
    for r in radii:
        wts, _, _ = circle_weights(x0, y0, r, S)
        out.append(float((wts * v).sum()))
    return np.array(out)


def model_sum(model, cx, cy, r):
    half = int(math.ceil(r)) + 1
    wts, ix, iy = circle_weights(cx, cy, r, half)
    H, W = model.shape
    ya, yb, xa, xb = iy - half, iy + half + 1, ix - half, ix + half + 1
    if ya < 0 or xa < 0 or yb > H or xb > W:
        return float("nan")
    return float((wts * model[ya:yb, xa:xb]).sum())


def robust_sigma(v):
    v = np.asarray(v)
    if len(v) < 2:
        return float("nan")
    return 1.4826 * float(np.median(np.abs(v - np.median(v))))


def evaluate(field, out, stem="FRAME", quiet=False, n_ee=150):
    meta = json.load(open(os.path.join(field, "FIELD.json")))
    rep = json.load(open(os.path.join(out, stem + ".report.json")))
    hdul = fits.open(os.path.join(out, stem + ".cat.fits"))
    cat_hdu = next(h for h in hdul if isinstance(h, fits.BinTableHDU))
    cat = cat_hdu.data
    hdr = cat_hdu.header
    t = load_truth(field)
    zp_true = meta["zp"]
    W, H = meta["width"], meta["height"]
    res = {"field": field, "n_stars": int(meta["n_stars"]), "px2_per_star": meta["px2_per_star"],
           "fwhm": meta["fwhm"], "fwhm_grad_x": meta["fwhm_grad_x"], "ell": meta["ell"],
           "detections": int(len(cat)), "seed": meta["seed"]}
    zp, zperr = rep.get("zp"), rep.get("zp_err")
    cal = rep.get("calibration", {})
    res.update({"zp": zp, "zp_err": zperr, "zp_minus_true": (zp - zp_true) if zp is not None else None,
                "pull": ((zp - zp_true) / zperr) if zp is not None and zperr else None,
                "n_calibrators": cal.get("calibrators"), "candidates": cal.get("candidates"),
                "scatter": cal.get("scatter"), "colour_term": cal.get("colour_term"),
                "zp_err_formal": cal.get("zp_err_formal"), "zp_err_bootstrap": cal.get("zp_err_bootstrap"),
                "zp_err_shared": cal.get("zp_err_shared"), "zp_message": cal.get("message"),
                "apcorr_source": rep["aperture"]["apcorr_source"], "apcorr_stars": rep["aperture"]["apcorr_stars"],
                "reference_fraction": rep["aperture"]["reference_fraction"], "fwhm_fit": rep.get("fwhm")})

    x1, y1 = t["x"], t["y"]
    tid = {int(v): i for i, v in enumerate(t["id"])}
    flux = t["flux"]
    mtrue = -2.5 * np.log10(flux)
    sky_true = meta["sky"] + meta.get("sky_grad", 0.0) * ((x1 - 1.0) - 0.5 * (W - 1)) / (0.5 * W)

    # ---- isolation from the truth ----
    tix = grid_index(x1, y1, 16.0)
    iso = np.zeros(len(x1), bool)
    fw = t["fwhm"]
    for i in range(len(x1)):
        if t["frac_in_image"][i] < 0.999:
            continue
        e = 5 * fw[i]
        if x1[i] < e or y1[i] < e or x1[i] > W + 1 - e or y1[i] > H + 1 - e:
            continue
        nb, d = neighbours(tix, x1, y1, x1[i], y1[i], 10 * fw[i])
        ok = True
        for j, dj in zip(nb, d):
            if j == i:
                continue
            if (dj <= 5 * fw[i] and flux[j] > 0.01 * flux[i]) or flux[j] > flux[i]:
                ok = False
                break
        iso[i] = ok

    cx, cy = np.asarray(cat["x"], float), np.asarray(cat["y"], float)
    dix = grid_index(cx, cy, 4.0)
    det_of = np.full(len(x1), -1)
    for i in np.nonzero(iso)[0]:
        nb, d = neighbours(dix, cx, cy, x1[i], y1[i], 1.0)
        if len(nb):
            det_of[i] = nb[np.argmin(d)]
    fo = np.asarray(cat["flux_opt"], float)
    foe = np.asarray(cat["fluxerr_opt"], float)
    flags = np.asarray(cat["flags"], np.int64)
    snr = np.where(foe > 0, fo / foe, np.nan)
    sky = np.asarray(cat["sky"], float)

    def stats(name, det, tru):
        det, tru = np.asarray(det, int), np.asarray(tru, int)
        ok = fo[det] > 0
        det, tru = det[ok], tru[ok]
        dm_inst = -2.5 * np.log10(fo[det]) - mtrue[tru]
        # calibrated: the catalog's mag_cal (zero point and, when fitted, the colour term) against the truth in
        # the reference system (mag_ref = mag + CT * colour)
        dm_cal = np.asarray(cat["mag_cal"], float)[det] - t["mag_ref"][tru]
        dsky = sky[det] - sky_true[tru]
        res[name] = {"n": int(len(det)),
                     "median_inst_minus_true": float(np.median(dm_inst)) if len(det) else None,
                     "median_cal_minus_true": float(np.median(dm_cal)) if len(det) else None,
                     "robust_sigma": robust_sigma(dm_inst),
                     "median_sky_err_adu": float(np.median(dsky)) if len(det) else None}
        return det, tru

    sel = np.nonzero((det_of >= 0))[0]
    sel = sel[snr[det_of[sel]] > 100]
    iso_det, iso_tru = stats("isolated_snr100", det_of[sel], sel)
    calm = (flags & CALIBRATOR) != 0
    cdet = np.nonzero(calm & (np.asarray(cat["ref_id"]) >= 0))[0]
    ctru = np.array([tid.get(int(v), -1) for v in np.asarray(cat["ref_id"])[cdet]], dtype=int)
    keep = ctru >= 0
    cdet, ctru = cdet[keep], ctru[keep]
    cal_det, cal_tru = stats("calibrators", cdet, ctru)
    if len(cal_det):
        w = 1.0 / (np.asarray(cat["fluxerr_opt"], float)[cal_det] / fo[cal_det]) ** 2
        dm = -2.5 * np.log10(fo[cal_det]) - mtrue[cal_tru]
        res["calibrators"]["weighted_mean_inst_minus_true"] = float((w * dm).sum() / w.sum())
        res["calibrators"]["isolated_fraction"] = float(iso[cal_tru].mean())

    # ---- aperture corrections and sky, isolated stars (the brightest n_ee) ----
    radii = []
    k = 0
    while ("APRAD%d" % k) in hdr or ("APRAD%d" % (k + 1)) in hdr:
        k += 1
    names = [c for c in cat.columns.names if c.startswith("flux_aper_")]
    rad = []
    for nm in names:
        idx = nm[len("flux_aper_"):]
        key = "APRAD" + idx
        rad.append(hdr.get(key, float("nan")))
    apc = [hdr.get("APCOR" + nm[len("flux_aper_"):], float("nan")) for nm in names]
    res["apertures"] = []
    if len(iso_det):
        order = np.argsort(-snr[iso_det])[:n_ee]
        d_, t_ = iso_det[order], iso_tru[order]
        ee = np.array([own_ee(t, i, meta, rad) for i in t_])
        dsky = sky[d_] - sky_true[t_]
        for k, nm in enumerate(names):
            fa = np.asarray(cat[nm], float)[d_]
            area = math.pi * rad[k] ** 2
            emp = float(np.median(-2.5 * np.log10(fa / flux[t_])))  # the correction the local sky needs
            ideal = float(np.median(2.5 * np.log10(ee[:, k])))
            truesky_ratio = float(np.median((fa + dsky * area) / (flux[t_] * ee[:, k])))
            res["apertures"].append({"name": nm, "radius": rad[k], "APCOR": apc[k],
                                     "needed_with_local_sky": -emp, "ideal_true_sky": ideal,
                                     "apcor_error_mag": apc[k] - (-emp),
                                     "sky_part_mag": -emp - ideal,
                                     "flux_true_sky_over_model": truesky_ratio})
        res["isolated_sky_err_adu_bright"] = float(np.median(dsky))

    # ---- neighbour light (MODEL.fits) ----
    mpath = os.path.join(field, "MODEL.fits")
    if os.path.exists(mpath) and len(cal_det):
        model = fits.getdata(mpath).astype(np.float64)
        sample = cal_tru[np.argsort(-snr[cal_det])[:n_ee]]
        nl = []
        for i in sample:
            r = 2.0 * fw[i]
            own = own_ee(t, i, meta, [r])[0] * flux[i]
            tot = model_sum(model, x1[i] - 1.0, y1[i] - 1.0, r)
            nl.append((tot - own) / flux[i])
        nl = np.array(nl)
        nl = nl[np.isfinite(nl)]
        res["calibrators"]["neighbour_light_2fwhm_median"] = float(np.median(nl))
        res["calibrators"]["neighbour_light_2fwhm_mean"] = float(np.mean(nl))
        res["calibrators"]["neighbour_light_gt1pct"] = float(np.mean(nl > 0.01))

    if not quiet:
        print_report(res)
    return res


def fmt(v, f="%+.4f"):
    return "   n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f % v


def print_report(r):
    print("field %s: %d stars (1 per %.0f px^2), FWHM %.2f (grad %.2f, ell %.2f), %d detections" % (
        r["field"], r["n_stars"], r["px2_per_star"], r["fwhm"], r["fwhm_grad_x"], r["ell"], r["detections"]))
    print("  ZP-true %s  zp_err %s  pull %s  calibrators %s/%s  scatter %s  apcorr %s (%s stars), ref fraction %.5f" % (
        fmt(r["zp_minus_true"]), fmt(r["zp_err"], "%.4f"), fmt(r["pull"], "%+.2f"), r["n_calibrators"],
        r["candidates"], fmt(r["scatter"], "%.4f"), r["apcorr_source"], r["apcorr_stars"], r["reference_fraction"]))
    for name in ("isolated_snr100", "calibrators"):
        s = r[name]
        extra = ""
        if "weighted_mean_inst_minus_true" in s:
            extra = "  wmean inst-true %s  isolated %.2f" % (fmt(s["weighted_mean_inst_minus_true"]),
                                                             s["isolated_fraction"])
        if "neighbour_light_2fwhm_median" in s:
            extra += "  neighbour light(2FWHM) med %.4f mean %.4f >1%%: %.2f" % (
                s["neighbour_light_2fwhm_median"], s["neighbour_light_2fwhm_mean"], s["neighbour_light_gt1pct"])
        print("  %-16s n %5d  inst-true %s  cal-true %s  rsig %s  sky err %s ADU%s" % (
            name, s["n"], fmt(s["median_inst_minus_true"]), fmt(s["median_cal_minus_true"]),
            fmt(s["robust_sigma"], "%.4f"), fmt(s["median_sky_err_adu"], "%+.3f"), extra))
    for a in r["apertures"]:
        print("  %-12s r=%5.2f  APCOR %s  needed(local sky) %s  ideal(true sky) %s  apcor err %s  sky part %s  "
              "true-sky flux/model %.5f" % (a["name"], a["radius"], fmt(a["APCOR"]), fmt(a["needed_with_local_sky"]),
                                            fmt(a["ideal_true_sky"]), fmt(a["apcor_error_mag"]),
                                            fmt(a["sky_part_mag"]), a["flux_true_sky_over_model"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("field")
    ap.add_argument("out")
    ap.add_argument("--stem", default="FRAME")
    ap.add_argument("--json", help="append the result as one JSON line")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()
    r = evaluate(a.field, a.out, a.stem, a.quiet)
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
