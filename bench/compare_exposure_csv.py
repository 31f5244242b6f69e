#!/usr/bin/env python3
"""Compares an exposure's catalog (STEM.cat.csv, with ccd and extname first) with its CCDs' catalogs
reduced alone (STEM.EXTNAME.cat.csv): every CCD's rows, all columns but ccd and extname, as text.
Standard library only (runs on the GPU machine).

    compare_exposure_csv.py EXPOSURE.cat.csv DIR_OF_SINGLE_CCD_CSVS STEM
Prints one line per CCD that differs and a summary; exit status 1 when any differs or is missing."""
import csv, os, sys

exposure, single_dir, stem = sys.argv[1:4]
with open(exposure, newline="") as f:
    rows = list(csv.reader(f))
head, body = rows[0], rows[1:]
assert head[:2] == ["ccd", "extname"], head[:2]
by_ccd = {}
for r in body:
    by_ccd.setdefault(r[1], []).append(r[2:])
bad = 0
for extname, mine in sorted(by_ccd.items()):
    path = os.path.join(single_dir, "%s.%s.cat.csv" % (stem, extname))
    if not os.path.exists(path):
        print("missing", path)
        bad += 1
        continue
    with open(path, newline="") as f:
        alone = list(csv.reader(f))
    if alone[0] != head[2:] or alone[1:] != mine:
        print("differs", extname, len(mine), len(alone) - 1)
        bad += 1
print("%d CCDs, %d rows: %s" % (len(by_ccd), len(body), "identical" if bad == 0 else "%d differ" % bad))
sys.exit(1 if bad else 0)
