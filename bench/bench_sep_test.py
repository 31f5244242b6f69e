#!/usr/bin/python3
"""ctest bench_sep_agrees_with_python_sep: bench_sep (sep's C core through its C API) against python3-sep
(bench/peers.py sep) on a small simulated frame. Both must find the same objects (counts within 0.5%,
positions within 1e-6 px) and, at the same positions, bench_sep's aperture fluxes and errors must be those
of sep.sum_circle with peers.py's radii and annulus.

  bench_sep_test.py --bench-sep PATH --gpuphot PATH [--keep DIR]

Exit 77 (ctest: skipped) when Debian's Python lacks sep, numpy or astropy.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

try:
    import numpy as np
    import sep
    import astropy  # noqa: F401  (peers.py reads the frame with it)
except ImportError as e:
    print("skipped: %s" % e)
    sys.exit(77)

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, HERE)
import peers  # noqa: E402


def read_bench_catalog(path):
    rows = np.loadtxt(path, comments="#", ndmin=2)
    nr = len(peers.RADII)
    return {"x": rows[:, 0], "y": rows[:, 1], "flux": rows[:, 2:2 + 3 * nr:3],
            "fluxerr": rows[:, 3:3 + 3 * nr:3], "flag": rows[:, 4:4 + 3 * nr:3].astype(int)}


def python_sep_fluxes(frame, x0, y0):
    """sep.sum_circle at peers.py's radii and annulus on peers.py's background-subtracted image (0-based
    positions); returns (flux, fluxerr) of shape (n, len(RADII))."""
    data, header = peers.read_float32(frame)
    gain = float(header.get("GAIN", 0.0))
    fwhm = float(header.get("SIMFWHM", peers.FILTER_FWHM))
    bkg = sep.Background(data, bw=peers.BACK_SIZE, bh=peers.BACK_SIZE, fw=peers.BACK_FILTERSIZE,
                         fh=peers.BACK_FILTERSIZE)
    rms = bkg.rms()
    sub = data - bkg.back()
    ann = (peers.ANNULUS_FWHM[0] * fwhm, peers.ANNULUS_FWHM[1] * fwhm)
    cols = [sep.sum_circle(sub, x0, y0, r, err=rms, gain=gain if gain > 0 else None, bkgann=ann)
            for r in peers.RADII]
    return np.column_stack([c[0] for c in cols]), np.column_stack([c[1] for c in cols])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench-sep", required=True)
    ap.add_argument("--gpuphot", required=True)
    ap.add_argument("--keep")
    a = ap.parse_args()
    work = a.keep or tempfile.mkdtemp(prefix="bench-sep-test-")
    os.makedirs(work, exist_ok=True)
    failures = []
    try:
        subprocess.run([a.gpuphot, "simulate", "--size", "1024x768", "--stars", "600", "--galaxies", "20",
                        "--seed", "11", "--bitpix", "16", "-o", work, "--name", "sepagree", "-q"], check=True)
        frame = os.path.join(work, "sepagree.fits")
        cat = os.path.join(work, "bench_sep.tsv")
        ours = json.loads(subprocess.run([a.bench_sep, frame, "--repeat", "1", "--catalog", cat], check=True,
                                         stdout=subprocess.PIPE, text=True).stdout)
        npz = os.path.join(work, "python_sep.npz")
        theirs = json.loads(subprocess.run(["/usr/bin/python3", os.path.join(HERE, "peers.py"), "sep", frame,
                                            "--repeat", "1", "--catalog", npz], check=True,
                                           stdout=subprocess.PIPE, text=True).stdout)
        n_c, n_p = int(ours["sources"]), int(theirs["sources"])
        print("objects: bench_sep %d, python3-sep %d (pixstack %d / %d)" % (n_c, n_p, ours["pixstack"],
                                                                           theirs["pixstack"]))
        for part in ("read", "background", "extract", "apertures", "total"):
            if part not in ours["seconds"]:
                failures.append("bench_sep JSON lacks seconds.%s" % part)
        if ours.get("peak_rss_bytes", 0) <= 0:
            failures.append("bench_sep JSON lacks peak_rss_bytes")
        if n_p < 100:
            failures.append("too few objects on the test frame (%d) for the comparison to mean much" % n_p)
        if abs(n_c - n_p) > 0.005 * n_p:
            failures.append("object counts differ by more than 0.5%%: %d vs %d" % (n_c, n_p))

        b = read_bench_catalog(cat)
        p = np.load(npz)
        px, py = np.asarray(p["x"], float), np.asarray(p["y"], float)  # 1-based, as bench_sep's
        # Match every python3-sep object to bench_sep's nearest (brute force: a few hundred objects).
        d2 = (px[:, None] - b["x"][None, :]) ** 2 + (py[:, None] - b["y"][None, :]) ** 2
        j = np.argmin(d2, axis=1)
        dist = np.sqrt(d2[np.arange(len(px)), j])
        matched = dist <= 1e-6
        print("positions: %d of %d matched within 1e-6 px (largest offset %.3g px)"
              % (matched.sum(), len(px), dist.max() if len(dist) else 0.0))
        if matched.sum() < 0.995 * len(px):
            failures.append("only %d of %d python3-sep objects at bench_sep's positions"
                            % (matched.sum(), len(px)))

        flux, fluxerr = python_sep_fluxes(frame, b["x"][j[matched]] - 1.0, b["y"][j[matched]] - 1.0)
        ours_f = b["flux"][j[matched]]
        ours_e = b["fluxerr"][j[matched]]
        rel_f = np.abs(ours_f - flux) / np.maximum(np.abs(flux), 1.0)
        rel_e = np.abs(ours_e - fluxerr) / np.maximum(np.abs(fluxerr), 1e-12)
        print("fluxes at r = %s px: largest relative difference %.3g (flux), %.3g (error)"
              % (peers.RADII, rel_f.max() if rel_f.size else 0.0, rel_e.max() if rel_e.size else 0.0))
        if not np.all(np.isfinite(ours_f)) or rel_f.max() > 1e-9:
            failures.append("aperture fluxes differ from sep.sum_circle's (largest relative %.3g)"
                            % rel_f.max())
        if rel_e.max() > 1e-9:
            failures.append("aperture errors differ from sep.sum_circle's (largest relative %.3g)"
                            % rel_e.max())
    finally:
        if not a.keep:
            subprocess.run(["rm", "-rf", work])
    for f in failures:
        print("FAIL: " + f)
    print("PASS" if not failures else "FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
