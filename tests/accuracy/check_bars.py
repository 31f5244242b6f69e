#!/usr/bin/python3
"""Fails (exit 1) unless evaluate.py's results meet the accuracy bars of docs/ACCURACY.md.

usage: check_bars.py RESULTS.jsonl [--zp BAR] [--iso BAR] [--pulls]
  --zp BAR   every field's |ZP - true| <= BAR (mag)
  --iso BAR  every field's median calibrated - true of isolated S/N > 100 stars within BAR (mag)
  --pulls    over all fields the pulls (ZP - true) / zp_err have an RMS in [0.7, 1.5] and none beyond 3
"""
import argparse
import json
import math
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--zp", type=float)
    ap.add_argument("--iso", type=float)
    ap.add_argument("--pulls", action="store_true")
    a = ap.parse_args()
    rows = [json.loads(l) for l in open(a.results) if l.strip()]
    bad = []
    if not rows:
        bad.append("no results")
    for r in rows:
        z, iso = r["zp_minus_true"], r["isolated_snr100"]["median_cal_minus_true"]
        if a.zp is not None and (z is None or abs(z) > a.zp):
            bad.append("%s: ZP - true %s beyond %g" % (r["field"], z, a.zp))
        if a.iso is not None and (iso is None or abs(iso) > a.iso):
            bad.append("%s: isolated S/N>100 calibrated - true %s beyond %g" % (r["field"], iso, a.iso))
    if a.pulls:
        pulls = [r["pull"] for r in rows if r["pull"] is not None]
        if len(pulls) < len(rows):
            bad.append("%d fields without a pull" % (len(rows) - len(pulls)))
        rms = math.sqrt(sum(p * p for p in pulls) / max(1, len(pulls)))
        print("pulls over %d fields: RMS %.2f, max |pull| %.2f" % (len(pulls), rms, max(abs(p) for p in pulls)))
        if not 0.7 <= rms <= 1.5:
            bad.append("pull RMS %.2f outside [0.7, 1.5]" % rms)
        if any(abs(p) > 3 for p in pulls):
            bad.append("a pull beyond 3: %s" % ", ".join("%.2f" % p for p in pulls if abs(p) > 3))
    for b in bad:
        print("FAIL:", b)
    print("%d fields, %s" % (len(rows), "bars met" if not bad else "%d failures" % len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
