#!/usr/bin/python3
"""Writes wcs_fixtures.json: WCS headers and pixel -> world pairs computed with astropy.wcs, the
independent reference for tests/core/wcs_test.cpp.

Run with Debian's Python (astropy, numpy):  /usr/bin/python3 tests/data/wcs/make_fixtures.py
Pixels are 0-based (astropy origin=0, as in gpuphot's API); world in degrees; astropy's all_pix2world
applies SIP with its own implementation (not WCSLIB's). TPV goes through astropy's bundled WCSLIB, so the
script also checks TPV and SIP against plain numpy evaluations below and refuses to write on disagreement.
"""
import json
import os
import sys

import numpy as np
from astropy.io import fits
from astropy.wcs import WCS

HERE = os.path.dirname(os.path.abspath(__file__))
REAL = os.path.join(HERE, "..", "..", "..", "..", "shared", "data", "real")
WCS_PREFIXES = ("NAXIS", "WCSAXES", "CTYPE", "CUNIT", "CRPIX", "CRVAL", "CD1_", "CD2_", "PC1_", "PC2_",
                "CDELT", "PV1_", "PV2_", "A_", "B_", "AP_", "BP_", "LONPOLE", "LATPOLE", "RADESYS", "EQUINOX")


def card_list(header):
    return [str(c) for c in header.cards if c.keyword.startswith(WCS_PREFIXES)]


def synthetic_tan():
    h = fits.Header()
    h["NAXIS"], h["NAXIS1"], h["NAXIS2"] = 2, 2048, 1536
    h["CTYPE1"], h["CTYPE2"] = "RA---TAN", "DEC--TAN"
    h["CRPIX1"], h["CRPIX2"] = 1024.5, 768.5
    h["CRVAL1"], h["CRVAL2"] = 10.684708, 41.268750
    s, t = 0.4 / 3600, np.radians(30.0)
    h["CD1_1"], h["CD1_2"] = -s * np.cos(t), s * np.sin(t)
    h["CD2_1"], h["CD2_2"] = s * np.sin(t), s * np.cos(t)
    return h


def synthetic_tan_sip():
    # Order-3 SIP of the size a wide-field refractor shows (a few px at the corners), straddling RA = 0.
    h = fits.Header()
    h["NAXIS"], h["NAXIS1"], h["NAXIS2"] = 2, 4000, 3000
    h["CTYPE1"], h["CTYPE2"] = "RA---TAN-SIP", "DEC--TAN-SIP"
    h["CRPIX1"], h["CRPIX2"] = 2010.3, 1495.8
    h["CRVAL1"], h["CRVAL2"] = 359.8, -30.5
    s, t = 1.8 / 3600, np.radians(-12.0)
    h["CD1_1"], h["CD1_2"] = -s * np.cos(t), -s * np.sin(t)
    h["CD2_1"], h["CD2_2"] = -s * np.sin(t), s * np.cos(t)
    h["A_ORDER"], h["B_ORDER"] = 3, 3
    coeffs = {"A_2_0": 2.1e-7, "A_1_1": -1.3e-7, "A_0_2": 4.0e-8, "A_3_0": -6.2e-11, "A_2_1": 1.1e-11,
              "A_1_2": -5.9e-11, "A_0_3": 3.0e-12,
              "B_2_0": -3.5e-8, "B_1_1": 1.9e-7, "B_0_2": -1.4e-7, "B_3_0": 2.0e-12, "B_2_1": -6.0e-11,
              "B_1_2": 8.0e-12, "B_0_3": -6.1e-11}
    for k, v in coeffs.items():
        h[k] = v
    return h


def synthetic_zpn():
    h = fits.Header()
    h["NAXIS"], h["NAXIS1"], h["NAXIS2"] = 2, 1000, 1000
    h["CTYPE1"], h["CTYPE2"] = "RA---ZPN", "DEC--ZPN"
    h["CRPIX1"], h["CRPIX2"] = 500.5, 500.5
    h["CRVAL1"], h["CRVAL2"] = 150.1, 2.2
    h["CD1_1"], h["CD1_2"], h["CD2_1"], h["CD2_2"] = -0.01, 0.0, 0.0, 0.01
    h["PV2_0"], h["PV2_1"], h["PV2_2"], h["PV2_3"] = 0.0, 1.0, 0.0, 0.33
    return h


def synthetic_tan_pole():
    h = fits.Header()
    h["NAXIS"], h["NAXIS1"], h["NAXIS2"] = 2, 1024, 1024
    h["CTYPE1"], h["CTYPE2"] = "RA---TAN", "DEC--TAN"
    h["CRPIX1"], h["CRPIX2"] = 512.5, 512.5
    h["CRVAL1"], h["CRVAL2"] = 45.0, 89.9
    h["CD1_1"], h["CD1_2"], h["CD2_1"], h["CD2_2"] = -2.0 / 3600, 0.0, 0.0, 2.0 / 3600
    return h


def real_panoptes():
    with fits.open(os.path.join(REAL, "panoptes_solved.fits.fz")) as f:
        return fits.Header.fromstring("".join(card_list(f[1].header)))


def real_decam():
    with fits.open(os.path.join(REAL, "decam_ls9_N6_cutout.fits")) as f:
        return fits.Header.fromstring("".join(card_list(f[1].header)))


def tpv_numpy(h, px, py):
    """TPV straight from its definition (0-based pixels in, degrees out), independent of WCSLIB."""
    cd = np.array([[h["CD1_1"], h["CD1_2"]], [h["CD2_1"], h["CD2_2"]]])
    u, v = px + 1.0 - h["CRPIX1"], py + 1.0 - h["CRPIX2"]
    x, y = cd[0, 0] * u + cd[0, 1] * v, cd[1, 0] * u + cd[1, 1] * v
    r = np.hypot(x, y)

    def terms(a, b):  # TPV term order up to degree 3 (0..11); b plays x's part for axis 2
        return [np.ones_like(a), a, b, r, a * a, a * b, b * b, a ** 3, a * a * b, a * b * b, b ** 3, r ** 3]

    xi = sum(h.get("PV1_%d" % k, 1.0 if k == 1 else 0.0) * t for k, t in enumerate(terms(x, y)))
    eta = sum(h.get("PV2_%d" % k, 1.0 if k == 1 else 0.0) * t for k, t in enumerate(terms(y, x)))
    xi, eta, d0 = np.radians(xi), np.radians(eta), np.radians(h["CRVAL2"])
    den = np.cos(d0) - eta * np.sin(d0)
    ra = np.degrees(np.arctan2(xi, den)) + h["CRVAL1"]
    dec = np.degrees(np.arctan2(np.sin(d0) + eta * np.cos(d0), np.hypot(xi, den)))
    return np.mod(ra, 360.0), dec


def tan_sip_numpy(h, px, py):
    """TAN + SIP straight from the SIP convention (0-based pixels in, degrees out)."""
    u, v = px + 1.0 - h["CRPIX1"], py + 1.0 - h["CRPIX2"]
    fu, fv = u.copy(), v.copy()
    for p in range(h["A_ORDER"] + 1):
        for q in range(h["A_ORDER"] + 1 - p):
            fu += h.get("A_%d_%d" % (p, q), 0.0) * u ** p * v ** q
            fv += h.get("B_%d_%d" % (p, q), 0.0) * u ** p * v ** q
    xi = np.radians(h["CD1_1"] * fu + h["CD1_2"] * fv)
    eta = np.radians(h["CD2_1"] * fu + h["CD2_2"] * fv)
    d0 = np.radians(h["CRVAL2"])
    den = np.cos(d0) - eta * np.sin(d0)
    ra = np.degrees(np.arctan2(xi, den)) + h["CRVAL1"]
    dec = np.degrees(np.arctan2(np.sin(d0) + eta * np.cos(d0), np.hypot(xi, den)))
    return np.mod(ra, 360.0), dec


def sample_pixels(w, h, rng):
    pts = [(0.0, 0.0), (w - 1.0, 0.0), (0.0, h - 1.0), (w - 1.0, h - 1.0), ((w - 1) / 2, (h - 1) / 2)]
    xs, ys = rng.uniform(-0.5, w - 0.5, 5), rng.uniform(-0.5, h - 0.5, 5)
    pts += [(float(a), float(b)) for a, b in zip(xs, ys)]
    return np.array(pts)


def main():
    rng = np.random.default_rng(20240601)
    cases = [("tan", synthetic_tan()), ("tan_sip_order3", synthetic_tan_sip()), ("zpn", synthetic_zpn()),
             ("tan_near_pole", synthetic_tan_pole()), ("panoptes_tan_sip", real_panoptes()),
             ("decam_tpv", real_decam())]
    out = []
    for name, h in cases:
        w = WCS(h)
        pix = sample_pixels(h["NAXIS1"], h["NAXIS2"], rng)
        world = w.all_pix2world(pix, 0)
        world[:, 0] = np.mod(world[:, 0], 360.0)
        check = {"decam_tpv": tpv_numpy, "tan_sip_order3": tan_sip_numpy, "panoptes_tan_sip": tan_sip_numpy}
        if name in check:
            ra, dec = check[name](h, pix[:, 0], pix[:, 1])
            dra = (ra - world[:, 0] + 180.0) % 360.0 - 180.0
            err = max(np.max(np.abs(dra)), np.max(np.abs(dec - world[:, 1])))
            print("%s: astropy vs numpy: max diff %.3g deg" % (name, err))
            if err > 1e-10:
                sys.exit("astropy and the numpy evaluation disagree for " + name)
        cards = [str(c) for c in h.cards]
        out.append({"name": name, "projection": h["CTYPE1"][5:].strip("-"), "width": int(h["NAXIS1"]),
                    "height": int(h["NAXIS2"]), "cards": cards, "pixels": pix.tolist(),
                    "world": world.tolist()})
    doc = {"generator": "tests/data/wcs/make_fixtures.py", "astropy": __import__("astropy").__version__,
           "origin": 0, "cases": out}
    # One case per line: readable diffs without one number per line.
    head = json.dumps({k: v for k, v in doc.items() if k != "cases"})[:-1]
    with open(os.path.join(HERE, "wcs_fixtures.json"), "w") as f:
        f.write(head + ', "cases": [\n' + ",\n".join(json.dumps(c) for c in out) + "\n]}\n")


if __name__ == "__main__":
    main()
