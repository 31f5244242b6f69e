#!/usr/bin/python3
"""IMAFLAGS_ISO and NIMAFLAGS_ISO of SExtractor and gpuphot (ASCII_HEAD catalogs of X_IMAGE Y_IMAGE
IMAFLAGS_ISO NIMAFLAGS_ISO) over objects matched one to one within 1.5 px.

usage: match_flags.py SE.cat GPUPHOT.cat FLAG_TYPE MIN_PERCENT_EQUAL   (exit 1 below the bar)"""
import sys

import numpy as np


def main():
    se = np.atleast_2d(np.loadtxt(sys.argv[1]))
    gp = np.atleast_2d(np.loadtxt(sys.argv[2]))
    d2 = (se[:, 0, None] - gp[None, :, 0]) ** 2 + (se[:, 1, None] - gp[None, :, 1]) ** 2
    i, k = d2.argmin(1), d2.argmin(0)
    m = (k[i] == np.arange(len(se))) & (d2[np.arange(len(se)), i] < 1.5 ** 2)
    s, g = se[m], gp[i[m]]
    same = 100.0 * np.mean(s[:, 2] == g[:, 2])
    count = 100.0 * np.mean(s[:, 3] == g[:, 3])
    print("[sextractor] FLAG_TYPE %s: IMAFLAGS_ISO equal for %.2f%%, NIMAFLAGS_ISO for %.2f%% of %d matched "
          "objects" % (sys.argv[3], same, count, m.sum()))
    return 1 if same < float(sys.argv[4]) else 0


if __name__ == "__main__":
    sys.exit(main())
