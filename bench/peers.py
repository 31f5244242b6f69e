#!/usr/bin/python3
"""Peer tools for the benchmark: sep and source-extractor on the same frame with the same settings as
gpuphot's defaults, and completeness against the simulator's truth.

Run with Debian's Python (/usr/bin/python3: astropy, numpy, scipy, python3-sep). Subcommands:

  peers.py sep FRAME [--repeat N] [--catalog OUT.npz] [--json]
      Times astropy's read, sep.Background (+ back/rms maps, subtraction), sep.extract and sum_circle at
      the same radii (with a local annulus, as gpuphot), each the best of N runs; prints JSON.
  peers.py sex FRAME [--threads N] [--repeat N] [--catalog OUT.fits] [--workdir DIR]
      Runs source-extractor (FITS_1.0 catalog) N times, prints the best wall time as JSON.
  peers.py complete TRUTH.fits CATALOG [--kind gpuphot|sep|sex] [--snr 10] [--radius 1]
      Completeness of a catalog against the truth for stars of true S/N >= snr (matched within radius px).

Settings mirror gpuphot's defaults (core/stages/*/*.hpp): background mesh 64 px, median filter 3x3 meshes;
detection 1.5 sigma of the local RMS, 5 px minimum area, 7x7 Gaussian filter of FWHM 3 px (the same
numbers as gaussianKernel1d(3.0)), 32 deblending levels, contrast 0.005, cleaning with parameter 1.0;
aperture radii 2, 3, 4, 6 px with a local sky annulus of 4..6 x FWHM.

The true S/N of a star is the S/N of an aperture of radius FWHM (the star's truth FWHM) holding the Moffat
fraction of its flux: S/N = F_ap / sqrt(F_ap / gain + pi r^2 (sky / gain + (rdnoise / gain)^2)), from the
truth flux and the frame's SIMSKY, GAIN, RDNOISE and SIMBETA keywords.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

# gpuphot defaults (keep in step with core/stages/*/*.hpp).
BACK_SIZE = 64
BACK_FILTERSIZE = 3
DETECT_THRESH = 1.5
MINAREA = 5
FILTER_FWHM = 3.0
DEBLEND_NTHRESH = 32
DEBLEND_MINCONT = 0.005
CLEAN_PARAM = 1.0
RADII = (2.0, 3.0, 4.0, 6.0)  # px
ANNULUS_FWHM = (4.0, 6.0)  # FWHM multiples


def gauss_kernel(fwhm=FILTER_FWHM):
    """7x7 (for FWHM 3) normalised Gaussian: the outer product of gpuphot's gaussianKernel1d."""
    r = max(1, int(math.ceil(fwhm)))
    sigma = fwhm / math.sqrt(8.0 * math.log(2.0))
    k = np.array([math.exp(-0.5 * i * i / (sigma * sigma)) for i in range(-r, r + 1)])
    k = (k / k.sum()).astype(np.float32)
    return np.outer(k, k).astype(np.float32)


def read_float32(path):
    from astropy.io import fits
    with fits.open(path, memmap=False) as hdul:
        hdu = next(h for h in hdul if h.data is not None and h.data.ndim == 2)
        data = np.ascontiguousarray(hdu.data, dtype=np.float32)
        header = hdu.header.copy()
    return data, header


CPU = {}  # part -> best CPU seconds (user + sys of this process), beside the wall times


def best_of(n, fn, part=None):
    best, cpu, out = float("inf"), float("inf"), None
    for _ in range(max(1, n)):
        c0, t0 = time.process_time(), time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
        cpu = min(cpu, time.process_time() - c0)
    if part:
        CPU[part] = cpu
    return best, out


def run_sep(path, repeat, catalog=None):
    import sep
    sep.set_sub_object_limit(4096)
    t = {}
    t["read"], (data, header) = best_of(repeat, lambda: read_float32(path), "read")
    gain = float(header.get("GAIN", 0.0))
    fwhm = float(header.get("SIMFWHM", FILTER_FWHM))
    kernel = gauss_kernel()

    def background():
        b = sep.Background(data, bw=BACK_SIZE, bh=BACK_SIZE, fw=BACK_FILTERSIZE, fh=BACK_FILTERSIZE)
        rms = b.rms()
        sub = data - b.back()
        return b, rms, sub

    t["background"], (bkg, rms, sub) = best_of(repeat, background, "background")

    def extract():
        return sep.extract(sub, DETECT_THRESH, err=rms, minarea=MINAREA, filter_kernel=kernel,
                           filter_type="conv", deblend_nthresh=DEBLEND_NTHRESH,
                           deblend_cont=DEBLEND_MINCONT, clean=True, clean_param=CLEAN_PARAM)

    # The pixel stack is allocated on every call (a large one costs time and memory): start at
    # SExtractor's default and double it until the frame fits (before timing).
    pixstack = 300_000
    while True:
        sep.set_extract_pixstack(pixstack)
        try:
            extract()
            break
        except Exception as e:  # "internal pixel buffer full"
            if "pixel buffer full" not in str(e) or pixstack > 1 << 30:
                raise
            pixstack *= 2

    t["extract"], objs = best_of(repeat, extract, "extract")
    x = np.ascontiguousarray(objs["x"], dtype=np.float64)
    y = np.ascontiguousarray(objs["y"], dtype=np.float64)
    ann = (ANNULUS_FWHM[0] * fwhm, ANNULUS_FWHM[1] * fwhm)

    def photometry():
        return [sep.sum_circle(sub, x, y, r, err=rms, gain=gain if gain > 0 else None, bkgann=ann)
                for r in RADII]

    t["sum_circle"], _ = best_of(repeat, photometry, "sum_circle")
    t["total"] = t["read"] + t["background"] + t["extract"] + t["sum_circle"]
    if catalog:
        np.savez(catalog, x=x + 1.0, y=y + 1.0)  # 1-based, as the other catalogs
    return {"tool": "sep " + sep.__version__, "frame": path, "repeat": repeat, "sources": int(len(objs)),
            "pixstack": pixstack,
            "globalrms": float(bkg.globalrms), "seconds": t,
            "cpu_seconds": dict(CPU, total=sum(CPU.values())),
            "annulus_px": list(ann)}


def write_sex_files(workdir, fwhm):
    conv = os.path.join(workdir, "gauss_3.0_7x7_gpuphot.conv")
    k = gauss_kernel()
    with open(conv, "w") as f:
        f.write("CONV NORM\n# 7x7 Gaussian of FWHM 3 px, same numbers as gpuphot's detection filter\n")
        for row in k:
            f.write(" ".join("%.9g" % v for v in row) + "\n")
    param = os.path.join(workdir, "bench.param")
    with open(param, "w") as f:
        f.write("\n".join(["NUMBER", "X_IMAGE", "Y_IMAGE", "XWIN_IMAGE", "YWIN_IMAGE", "A_IMAGE", "B_IMAGE",
                           "THETA_IMAGE", "FLUX_ISO", "ISOAREA_IMAGE", "FLUX_APER(4)", "FLUXERR_APER(4)",
                           "FLUX_AUTO", "FLUXERR_AUTO", "KRON_RADIUS", "FWHM_IMAGE", "BACKGROUND",
                           "FLUX_MAX", "FLAGS"]) + "\n")
    return conv, param


def sex_command(path, catalog, conv, param, threads, fwhm):
    # PHOT_APERTURES are diameters; BACKPHOTO_THICK is the width of SExtractor's (rectangular) annulus.
    diam = ",".join("%g" % (2 * r) for r in RADII)
    thick = max(1, int(round((ANNULUS_FWHM[1] - ANNULUS_FWHM[0]) * fwhm)))
    return ["source-extractor", path, "-c", "/dev/null",
            "-CATALOG_NAME", catalog, "-CATALOG_TYPE", "FITS_1.0", "-PARAMETERS_NAME", param,
            "-DETECT_THRESH", str(DETECT_THRESH), "-ANALYSIS_THRESH", str(DETECT_THRESH),
            "-DETECT_MINAREA", str(MINAREA), "-FILTER", "Y", "-FILTER_NAME", conv,
            "-DEBLEND_NTHRESH", str(DEBLEND_NTHRESH), "-DEBLEND_MINCONT", str(DEBLEND_MINCONT),
            "-CLEAN", "Y", "-CLEAN_PARAM", str(CLEAN_PARAM),
            "-BACK_SIZE", str(BACK_SIZE), "-BACK_FILTERSIZE", str(BACK_FILTERSIZE),
            "-BACKPHOTO_TYPE", "LOCAL", "-BACKPHOTO_THICK", str(thick),
            "-PHOT_APERTURES", diam, "-PHOT_AUTOPARAMS", "2.5,3.5",
            "-GAIN_KEY", "GAIN", "-SATUR_KEY", "SATURATE", "-MAG_ZEROPOINT", "0",
            "-CHECKIMAGE_TYPE", "NONE", "-WRITE_XML", "N", "-VERBOSE_TYPE", "QUIET",
            "-NTHREADS", str(threads),
            "-MEMORY_OBJSTACK", "20000", "-MEMORY_PIXSTACK", "3000000", "-MEMORY_BUFSIZE", "4096",
            "-STARNNW_NAME", "/usr/share/source-extractor/default.nnw"]


def run_timed(cmd):
    """Runs cmd; returns (wall seconds, CPU seconds, peak RSS bytes of that child, returncode, stderr)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    return wall, cpu, usage.ru_maxrss * 1024, p.returncode, err.decode(errors="replace")


def run_sex(path, threads, repeat, catalog=None, workdir=None):
    from astropy.io import fits
    fwhm = float(fits.getheader(path).get("SIMFWHM", FILTER_FWHM))
    own = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="gpuphot-sex-")
    try:
        conv, param = write_sex_files(workdir, fwhm)
        out = catalog or os.path.join(workdir, "sex.cat.fits")
        cmd = sex_command(path, out, conv, param, threads, fwhm)
        best, bestcpu, peak = float("inf"), float("inf"), 0
        for _ in range(max(1, repeat)):
            wall, cpu, rss, rc, err = run_timed(cmd)
            if rc != 0:
                raise SystemExit("source-extractor failed (%d): %s" % (rc, err.strip()))
            best, bestcpu, peak = min(best, wall), min(bestcpu, cpu), max(peak, rss)
        with fits.open(out) as h:
            n = len(h[2].data) if len(h) > 2 else len(h[1].data)
        return {"tool": "source-extractor", "frame": path, "threads": threads, "repeat": repeat,
                "sources": int(n), "seconds": {"total": best}, "cpu_seconds": {"total": bestcpu},
                "peak_rss_bytes": peak,
                "command": " ".join(cmd)}
    finally:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)


def load_positions(path, kind):
    """1-based (x, y) of a catalog."""
    if kind == "sep":
        d = np.load(path)
        return d["x"], d["y"]
    from astropy.io import fits
    with fits.open(path) as h:
        tab = next(hd.data for hd in h if isinstance(hd, fits.BinTableHDU))
        names = [n.lower() for n in tab.columns.names]
        if kind == "sex":
            return np.asarray(tab["XWIN_IMAGE"], float), np.asarray(tab["YWIN_IMAGE"], float)
        x = np.asarray(tab[tab.columns.names[names.index("x")]], float)
        y = np.asarray(tab[tab.columns.names[names.index("y")]], float)
        return x, y


def true_snr(truth_path, frame_path):
    from astropy.io import fits
    t = fits.getdata(truth_path, 1)
    h = fits.getheader(frame_path)
    gain = float(h.get("GAIN", 1.0))
    rdn = float(h.get("RDNOISE", 0.0))
    sky = float(h.get("SIMSKY", 0.0))
    beta = float(h.get("SIMBETA", 3.0))
    fwhm = np.asarray(t["fwhm"], float)
    flux = np.asarray(t["flux"], float)
    if str(h.get("SIMPSF", "MOFFAT")).upper().startswith("MOFFAT"):
        alpha = fwhm / (2.0 * math.sqrt(2.0 ** (1.0 / beta) - 1.0))
        frac = 1.0 - (1.0 + (fwhm / alpha) ** 2) ** (1.0 - beta)
    else:
        sigma = fwhm / math.sqrt(8.0 * math.log(2.0))
        frac = 1.0 - np.exp(-0.5 * (fwhm / sigma) ** 2)
    fap = frac * flux
    var_pix = sky / gain + (rdn / gain) ** 2
    snr = fap / np.sqrt(fap / gain + math.pi * fwhm ** 2 * var_pix)
    return t, snr, int(h["NAXIS1"]), int(h["NAXIS2"])


def completeness(truth_path, frame_path, catalog, kind, snr_min=10.0, radius=1.0):
    from scipy.spatial import cKDTree
    t, snr, w, h = true_snr(truth_path, frame_path)
    tx, ty = np.asarray(t["x"], float), np.asarray(t["y"], float)
    sel = (snr >= snr_min) & (np.asarray(t["is_galaxy"]) == 0) & (tx >= 0.5) & (tx <= w + 0.5) \
        & (ty >= 0.5) & (ty <= h + 0.5)
    x, y = load_positions(catalog, kind)
    ok = np.isfinite(x) & np.isfinite(y)
    tree = cKDTree(np.column_stack([x[ok], y[ok]]))
    d, _ = tree.query(np.column_stack([tx[sel], ty[sel]]), distance_upper_bound=radius)
    found = int(np.count_nonzero(np.isfinite(d)))
    n = int(np.count_nonzero(sel))
    # Detections with no truth star (of any S/N) within the radius.
    tt = cKDTree(np.column_stack([tx, ty]))
    dd, _ = tt.query(np.column_stack([x[ok], y[ok]]), distance_upper_bound=radius)
    return {"catalog": catalog, "kind": kind, "snr_min": snr_min, "radius_px": radius, "truth_selected": n,
            "found": found, "completeness": found / n if n else float("nan"), "detections": int(len(x)),
            "detections_unmatched": int(np.count_nonzero(~np.isfinite(dd)))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sep")
    s.add_argument("frame")
    s.add_argument("--repeat", type=int, default=3)
    s.add_argument("--catalog")
    x = sub.add_parser("sex")
    x.add_argument("frame")
    x.add_argument("--threads", type=int, default=1)
    x.add_argument("--repeat", type=int, default=3)
    x.add_argument("--catalog")
    x.add_argument("--workdir")
    c = sub.add_parser("complete")
    c.add_argument("truth")
    c.add_argument("frame")
    c.add_argument("catalog")
    c.add_argument("--kind", choices=["gpuphot", "sep", "sex"], default="gpuphot")
    c.add_argument("--snr", type=float, default=10.0)
    c.add_argument("--radius", type=float, default=1.0)
    a = ap.parse_args(argv)
    if a.cmd == "sep":
        out = run_sep(a.frame, a.repeat, a.catalog)
        import resource
        out["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    elif a.cmd == "sex":
        out = run_sex(a.frame, a.threads, a.repeat, a.catalog, a.workdir)
    else:
        out = completeness(a.truth, a.frame, a.catalog, a.kind, a.snr, a.radius)
    json.dump(out, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
