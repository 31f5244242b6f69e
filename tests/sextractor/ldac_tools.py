"""Helpers of ldac_peer_test.sh (Debian's python3-astropy and numpy).

  prepare DATA_DIR WORK   the PANOPTES frame as a plain float FITS file; SCAMP reference catalogs (LDAC)
                          of the simulated field (its sim.ref.fits) and of PANOPTES (Tycho-2)
  compare FRAME [--max-fwhm-dev F] [--max-rms-ratio R]
                          PSFEx's FWHM and SCAMP's astrometric RMS against the reference catalog, from
                          gpuphot's LDAC and from source-extractor's; exit 1 past a bar
  ascii CAT LDAC          gpuphot's ASCII_HEAD catalog read with astropy's SExtractor reader holds the
                          LDAC's objects and values
"""
import argparse
import sys
import warnings

import numpy as np
from astropy.io import ascii as asc
from astropy.io import fits
from astropy.io.votable import parse

warnings.filterwarnings("ignore")


def write_ref(ra, dec, mag, path):
    n = len(ra)
    cols = [fits.Column("X_WORLD", "1D", array=ra, unit="deg"),
            fits.Column("Y_WORLD", "1D", array=dec, unit="deg"),
            fits.Column("ERRA_WORLD", "1E", array=np.full(n, 1e-5), unit="deg"),
            fits.Column("ERRB_WORLD", "1E", array=np.full(n, 1e-5), unit="deg"),
            fits.Column("ERRTHETA_WORLD", "1E", array=np.zeros(n), unit="deg"),
            fits.Column("MAG", "1E", array=mag, unit="mag"),
            fits.Column("MAGERR", "1E", array=np.full(n, 0.02), unit="mag"),
            fits.Column("OBSDATE", "1D", array=np.full(n, 2000.0), unit="yr")]
    hdr = fits.Header()
    hdr["SIMPLE"] = True
    hdr["BITPIX"] = 8
    hdr["NAXIS"] = 0
    text = hdr.tostring(sep="", endcard=True, padding=False)
    imhead = fits.BinTableHDU.from_columns(
        [fits.Column("Field Header Card", "%dA" % len(text), array=np.array([text]))])
    imhead.name = "LDAC_IMHEAD"
    objects = fits.BinTableHDU.from_columns(cols)
    objects.name = "LDAC_OBJECTS"
    fits.HDUList([fits.PrimaryHDU(), imhead, objects]).writeto(path, overwrite=True)


def prepare(data, work):
    h = fits.open(data + "/panoptes_solved.fits.fz")
    d = [x for x in h if x.data is not None][0]
    fits.PrimaryHDU(d.data.astype("float32"), d.header).writeto(work + "/panoptes.fits", overwrite=True)
    s = fits.open(work + "/sim.ref.fits")[1].data
    write_ref(s["ra"], s["dec"], s["mag"], work + "/sim_ref.ldac")
    t = fits.open(data + "/tycho2_panoptes_field.fits")[1].data
    write_ref(t["ra"], t["dec"], t["mag"], work + "/panoptes_ref.ldac")


def scamp_rms(xml):
    for t in parse(xml).iter_tables():
        if t.name == "FGroups":
            a = t.array
            return float(np.hypot(*a["AstromSigma_Reference"][0])), int(a["AstromNDets_Reference"][0])
    raise SystemExit(xml + ": no FGroups table")


def compare(frame, max_fwhm_dev, max_rms_ratio):
    fwhm = {w: fits.open("psf_%s_%s/%s_%s.psf" % (w, frame, w, frame))[1].header["PSF_FWHM"] for w in ("se", "gp")}
    rms = {w: scamp_rms("scamp_%s_%s.xml" % (w, frame)) for w in ("se", "gp")}
    dev = fwhm["gp"] / fwhm["se"] - 1
    ratio = rms["gp"][0] / rms["se"][0]
    print("%-9s PSFEx FWHM gp %.3f se %.3f (%+.1f %%) | SCAMP RMS vs reference gp %.3f\" (%d) se %.3f\" (%d), "
          "ratio %.2f" % (frame, fwhm["gp"], fwhm["se"], 100 * dev, rms["gp"][0], rms["gp"][1], rms["se"][0],
                          rms["se"][1], ratio))
    ok = abs(dev) <= max_fwhm_dev and ratio <= max_rms_ratio and rms["gp"][1] >= 0.5 * rms["se"][1]
    if not ok:
        print("past a bar: %s (FWHM within %.0f %%, RMS ratio <= %.2f, half of SExtractor's matches)"
              % (frame, 100 * max_fwhm_dev, max_rms_ratio))
    return ok


def ascii_check(cat, ldac):
    t = asc.read(cat, format="sextractor")
    o = fits.open(ldac)["LDAC_OBJECTS"].data
    ok = len(t) == len(o)
    for name in ("X_IMAGE", "XWIN_IMAGE", "FLUX_AUTO", "FLAGS", "FLUX_RADIUS"):
        ok = ok and name in t.colnames and np.allclose(t[name], o[name], rtol=1e-6, atol=1e-6, equal_nan=True)
    # a vector is named once: astropy's reader calls its elements VIGNET, VIGNET_1, ..., VIGNET_1224
    ok = ok and str(t["X_IMAGE"].unit) == "pix" and "VIGNET_1224" in t.colnames and "VIGNET_1225" not in t.colnames
    print("ASCII_HEAD %s: %d objects, %d columns, %s" % (cat, len(t), len(t.colnames), "ok" if ok else "FAIL"))
    return ok


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode")
    p.add_argument("args", nargs="*")
    p.add_argument("--max-fwhm-dev", type=float, default=0.05)
    p.add_argument("--max-rms-ratio", type=float, default=1.2)
    a = p.parse_args()
    if a.mode == "prepare":
        prepare(*a.args)
        return 0
    if a.mode == "compare":
        return 0 if compare(a.args[0], a.max_fwhm_dev, a.max_rms_ratio) else 1
    if a.mode == "ascii":
        return 0 if ascii_check(*a.args) else 1
    return 2


if __name__ == "__main__":
    sys.exit(main())
