#!/usr/bin/python3
"""One-to-one match of a SExtractor ASCII_HEAD catalog (X_IMAGE Y_IMAGE FLUX_AUTO FLUX_APER) with a gpuphot
CSV catalog: mutual nearest isophotal barycentres (both 1-based) within 1.5 px.

usage: match.py SE.cat GPUPHOT.cat.csv LABEL [--min-matched PCT] [--max-aper-dev FRAC] [--max-auto-dev FRAC]
Prints one line; exit 1 when a given bar is not met."""
import argparse
import csv
import sys

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("se")
    ap.add_argument("gp")
    ap.add_argument("label")
    ap.add_argument("--min-matched", type=float)
    ap.add_argument("--max-aper-dev", type=float)
    ap.add_argument("--max-auto-dev", type=float)
    a = ap.parse_args()
    se = np.atleast_2d(np.loadtxt(a.se, comments="#"))
    rows = list(csv.DictReader(open(a.gp)))
    x = np.array([float(r["x_iso"]) for r in rows])
    y = np.array([float(r["y_iso"]) for r in rows])
    fauto = np.array([float(r["flux_auto"]) for r in rows])
    faper = np.array([float(r["flux_aper_1"]) for r in rows])
    d2 = (se[:, 0, None] - x[None, :]) ** 2 + (se[:, 1, None] - y[None, :]) ** 2
    i = d2.argmin(1)
    k = d2.argmin(0)
    mutual = (k[i] == np.arange(len(se))) & (d2[np.arange(len(se)), i] < 1.5 ** 2)
    j = i[mutual]
    pct = 100.0 * mutual.sum() / max(1, len(se))
    auto = float(np.median(fauto[j] / se[mutual, 2]))
    aper = float(np.median(faper[j] / se[mutual, 3]))
    print("[sextractor] %s: SExtractor %d, gpuphot %d, matched %d = %.2f%% of SExtractor's; "
          "FLUX_AUTO ratio %.4f, FLUX_APER ratio %.4f" % (a.label, len(se), len(x), mutual.sum(), pct, auto, aper))
    bad = []
    if a.min_matched is not None and pct < a.min_matched:
        bad.append("matched %.1f%% < %.1f%%" % (pct, a.min_matched))
    if a.max_aper_dev is not None and abs(aper - 1) > a.max_aper_dev:
        bad.append("FLUX_APER off by %.4f" % (aper - 1))
    if a.max_auto_dev is not None and abs(auto - 1) > a.max_auto_dev:
        bad.append("FLUX_AUTO off by %.4f" % (auto - 1))
    for b in bad:
        print("FAIL: %s: %s" % (a.label, b))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
