#!/usr/bin/env python3
"""Where a mosaic exposure's time goes: the per-CCD stage seconds of a `reduce` report, summed over the
CCDs, with each stage's median and slowest CCD. Run with --threads 1 --ccds-at-once 1, the sums are the
host CPU seconds each stage costs the exposure (what the CCDs in flight share); with K CCDs in flight
they include the waiting for cores.

    bench/exposure_stages.py STEM.report.json [more reports: summed together]
"""
import json
import sys
from collections import defaultdict


def main(paths):
    per = defaultdict(list)
    total = 0.0
    for path in paths:
        report = json.load(open(path))
        total += report.get("seconds", 0.0)
        for ccd in report["exposure"]["extensions"]:
            for s in ccd.get("report", {}).get("stages", []):
                per[s["stage"]].append(s["seconds"])
    print(f"{len(paths)} report(s), exposure seconds {total:.3f}")
    print("| stage | sum s | median ms | slowest ms | CCDs |\n|---|---:|---:|---:|---:|")
    for stage, v in sorted(per.items(), key=lambda kv: -sum(kv[1])):
        v = sorted(v)
        print(f"| {stage} | {sum(v):.3f} | {1e3 * v[len(v) // 2]:.1f} | {1e3 * v[-1]:.1f} | {len(v)} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
