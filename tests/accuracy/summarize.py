#!/usr/bin/python3
"""Summarise evaluate.py JSON lines: one row per field and the pull statistics.

usage: summarize.py RESULTS.jsonl [--by px2_per_star]
"""
import json
import math
import sys

import numpy as np


def main():
    path = sys.argv[1]
    rows = [json.loads(l) for l in open(path) if l.strip()]
    print("%-28s %7s %6s %8s %7s %7s %6s %9s %9s %7s" % (
        "field", "px2/st", "FWHM", "ZP-true", "zp_err", "pull", "ncal", "iso S/N>100", "cal-true", "scatter"))
    pulls, dz = [], []
    for r in rows:
        iso = r["isolated_snr100"]
        z = r["zp_minus_true"]
        p = r["pull"]
        if z is not None:
            dz.append(z)
        if p is not None:
            pulls.append(p)
        print("%-28s %7.0f %6.2f %+8.4f %7.4f %+7.2f %6s %9s %+9.4f %7.4f" % (
            r["field"][-28:], r["px2_per_star"], r["fwhm"], z if z is not None else float("nan"),
            r["zp_err"] or float("nan"), p if p is not None else float("nan"), r.get("n_calibrators"),
            "%d" % iso["n"], iso["median_cal_minus_true"] if iso["median_cal_minus_true"] is not None else float("nan"),
            r["scatter"] or float("nan")))
    if pulls:
        pulls = np.array(pulls)
        dz = np.array(dz)
        print("fields %d: ZP-true mean %+.4f rms %.4f max|.| %.4f; pulls mean %+.2f RMS %.2f (bar 0.7-1.5)" % (
            len(dz), dz.mean(), math.sqrt((dz ** 2).mean()), np.abs(dz).max(), pulls.mean(),
            math.sqrt((pulls ** 2).mean())))


if __name__ == "__main__":
    main()
