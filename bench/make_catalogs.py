#!/usr/bin/env python3
"""A night of reduced catalogs from one: bench_series.sh's input.

  make_catalogs.py SEED.cat.fits OUTDIR N TOTAL

Writes OUTDIR/c_0001.cat.fits ... c_TOTAL.cat.fits, each the seed catalog (every column and header card)
with MJD-MID advanced 60 s per catalog, positions jittered by 0.05", and every flux_* column scaled by a
smooth transparency (10 %) and redrawn with its fluxerr_* as Gaussian noise; one star (the "transit"
target, S/N ~ 500) dims by 1 % for 2 h in the middle of the first N, another varies by 5 % (sine,
90 min). OUTDIR/targets.csv names those two and three constant stars.
"""
import os
import sys

import numpy as np
from astropy.io import fits


def main():
    seed, outdir, n, total = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    os.makedirs(outdir, exist_ok=True)
    with fits.open(seed) as h:
        hdu = h[1]
        data, header = hdu.data.copy(), hdu.header.copy()
    flux_cols = [c for c in data.columns.names if c.startswith("flux_") and ("fluxerr_" + c[5:]) in data.columns.names]
    f, e = data["flux_opt"], data["fluxerr_opt"]
    good = np.isfinite(f) & np.isfinite(e) & (f > 0) & (data["flags"] == 0)
    snr = np.where(good, f / np.where(e > 0, e, np.inf), 0)
    order = np.argsort(np.abs(snr - 500))
    transit, sine = int(order[0]), int(order[1])
    constant = [int(i) for i in order[10:40:10]]
    with open(os.path.join(outdir, "targets.csv"), "w") as t:
        t.write("name,ra,dec\n")
        for name, i in [("transit", transit), ("sine", sine)] + [("const%d" % k, i) for k, i in enumerate(constant)]:
            t.write("%s,%.8f,%.8f\n" % (name, data["ra"][i], data["dec"][i]))

    rng = np.random.default_rng(1)
    mjd0 = header.get("MJD-MID", 60000.0)
    for k in range(total):
        d = data.copy()
        mjd = mjd0 + k * 60.0 / 86400.0
        transparency = 1.0 - 0.05 * (1 + np.sin(k / 37.0))
        scale = np.full(len(d), transparency)
        hours = (k - n / 2) / 60.0
        if abs(hours) < 1.0:
            scale[transit] *= 0.99
        scale[sine] *= 10 ** (-0.4 * 0.05 * np.sin(2 * np.pi * k / 90.0))
        for c in flux_cols:
            err = d["fluxerr_" + c[5:]]
            d[c] = d[c] * scale + rng.normal(size=len(d)) * np.nan_to_num(err) * np.sqrt(scale)
        jitter = 0.05 / 3600.0
        d["ra"] = d["ra"] + rng.normal(size=len(d)) * jitter / np.cos(np.radians(d["dec"]))
        d["dec"] = d["dec"] + rng.normal(size=len(d)) * jitter
        hd = header.copy()
        hd["MJD-MID"] = mjd
        fits.BinTableHDU(d, hd).writeto(os.path.join(outdir, "c_%04d.cat.fits" % (k + 1)), overwrite=True)


if __name__ == "__main__":
    main()
