#!/usr/bin/python3
"""Builds the small seed corpora of the libFuzzer targets from the project's own test files.

Run with Debian's python3 (astropy, numpy) from the repository root:
    /usr/bin/python3 tests/fuzz/make_corpus.py [path/to/gpuphot]
Sources: tests/data/fits (astropy's Rice-compressed u16 frame), tests/data/wcs/wcs_fixtures.json (the
WCS test headers: TAN, SIP, TPV, ZPN, ...), frames/truth/reference tables written by `gpuphot simulate`
(the project's own writers), and `gpuphot reduce --dump-config`. Every seed is small (< 16 KiB but one) so that
the corpus can live in the repository (the results database: 19 KiB).
"""
import gzip
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile

import numpy as np
from astropy.io import fits

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")


def out(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def fits_bytes(hdul):
    with tempfile.NamedTemporaryFile(suffix=".fits") as t:
        hdul.writeto(t.name, overwrite=True)
        return open(t.name, "rb").read()


def header_text(cards):
    return "".join(c.ljust(80)[:80] for c in cards) + "END".ljust(80)


def main():
    gpuphot = sys.argv[1] if len(sys.argv) > 1 else None
    shutil.rmtree(CORPUS, ignore_errors=True)
    rng = np.random.default_rng(1)

    # --- fuzz_fits_reader: every BITPIX, BSCALE/BZERO, BLANK, compressed, MEF, INHERIT ------------
    img = (1000 + 30 * rng.standard_normal((12, 16))).astype(np.float32)
    for bitpix, dtype in [(8, np.uint8), (16, np.int16), (32, np.int32), (64, np.int64), (-32, np.float32),
                          (-64, np.float64)]:
        out("fits_reader", f"bitpix{bitpix}.fits", fits_bytes(fits.HDUList([fits.PrimaryHDU(img.astype(dtype))])))
    u16 = fits.PrimaryHDU(img.astype(np.uint16))  # BITPIX 16 + BZERO 32768
    u16.header["GAIN"] = 1.5
    u16.header["SATURATE"] = 60000
    out("fits_reader", "u16_bzero.fits", fits_bytes(fits.HDUList([u16])))
    blank = fits.PrimaryHDU(img.astype(np.int16))
    blank.header["BLANK"] = -32768
    blank.header["BSCALE"] = 2.0
    blank.header["BZERO"] = 10.0
    out("fits_reader", "blank_bscale.fits", fits_bytes(fits.HDUList([blank])))
    mef = fits.HDUList([fits.PrimaryHDU(), fits.ImageHDU(img, name="SCI"),
                        fits.BinTableHDU.from_columns([fits.Column(name="a", format="E", array=[1, 2])])])
    mef[0].header["GAIN"] = 2.0
    mef[1].header["INHERIT"] = True
    out("fits_reader", "mef_inherit.fits", fits_bytes(mef))
    comp = fits.HDUList([fits.PrimaryHDU(), fits.CompImageHDU(img.astype(np.int32), compression_type="RICE_1")])
    out("fits_reader", "rice_i32.fits.fz", fits_bytes(comp))
    compf = fits.HDUList([fits.PrimaryHDU(), fits.CompImageHDU(img, compression_type="GZIP_2", quantize_level=0)])
    out("fits_reader", "gzip2_f32.fits.fz", fits_bytes(compf))
    cube = fits.PrimaryHDU(np.zeros((2, 3, 4), dtype=np.int16))
    out("fits_reader", "cube.fits", fits_bytes(fits.HDUList([cube])))
    shutil.copy(os.path.join(ROOT, "tests", "data", "fits", "astropy_rice_u16.fits.fz"),
                os.path.join(CORPUS, "fits_reader", "astropy_rice_u16.fits.fz"))

    # --- fuzz_header_wcs: the WCS test headers ----------------------------------------------------
    fixtures = json.load(open(os.path.join(ROOT, "tests", "data", "wcs", "wcs_fixtures.json")))
    for case in fixtures["cases"]:
        out("header_wcs", case["name"] + ".hdr", header_text(case["cards"]))
    out("header_wcs", "longstr_hierarch.hdr", header_text([
        "SIMPLE  =                    T", "OBJECT  = 'a very long string value that goes on and on and &'",
        "CONTINUE  'and continues here'", "HIERARCH ESO DET CHIP GAIN = 1.25 / e-/ADU",
        "COMMENT just a comment", "DATE-OBS= '2024-01-02T03:04:05'", "EXPTIME =                 30.0",
        "GAIN    =               1.5D0", "RDNOISE =                  5.0", "SATURATE=                65535"]))

    # --- fuzz_refcat: CSV variants and FITS tables -------------------------------------------------
    # First byte = mode: bits 0-1 suffix (.fits .csv .ecsv .txt), bit 2 = a column map on the first line.
    csv = "ra,dec,mag,mag_err,bp_rp\n10.1,41.2,12.5,0.01,0.8\n10.2,41.3,nan,0.02,0.9\n10.3,41.25,13.0,,1.0\n"
    out("refcat", "plain.csv", b"\x01" + csv.encode())
    out("refcat", "sexagesimal.csv", b"\x01" + b"# comment\nRA,DEC,Vmag\n00:40:44.3,+41:16:07,11.2\n00:40:50,+41:17:00,12.0\n")
    out("refcat", "tabs.txt", b"\x03" + b"RAJ2000\tDEJ2000\tGmag\tsource_id\n10.0\t41.0\t14.1\t123\n10.01\t41.01\t14.2\t124\n")
    out("refcat", "mapped.csv", b"\x05" + b"ra=alpha,dec=delta,mag=m,epoch=2015.5\nalpha,delta,m,pmra,pmdec\n1,2,3,4,5\n")
    ecsv = ("# %ECSV 1.0\n# ---\n# datatype:\n# - {name: ra, datatype: float64}\n# - {name: dec, datatype: float64}\n"
            "# - {name: mag, datatype: float64}\nra dec mag\n10.0 41.0 12.0\n10.1 41.1 12.5\n")
    out("refcat", "table.ecsv", b"\x02" + ecsv.encode())
    t = fits.BinTableHDU.from_columns([
        fits.Column(name="source_id", format="K", array=[1, 2, 3]),
        fits.Column(name="ra", format="D", array=[10.0, 10.1, np.nan]),
        fits.Column(name="dec", format="D", array=[41.0, 41.1, 41.2]),
        fits.Column(name="phot_g_mean_mag", format="E", array=[12.0, 13.0, 14.0]),
        fits.Column(name="phot_g_mean_flux_over_error", format="E", array=[100.0, 50.0, 10.0]),
        fits.Column(name="bp_rp", format="E", array=[0.5, 0.7, 1.0]),
        fits.Column(name="pmra", format="D", array=[1.0, -2.0, 0.0]),
        fits.Column(name="pmdec", format="D", array=[0.5, 0.1, 0.0]),
        fits.Column(name="ref_epoch", format="D", array=[2015.5] * 3)])
    out("refcat", "gaia_like.fits", b"\x00" + fits_bytes(fits.HDUList([fits.PrimaryHDU(), t])))

    # --- fuzz_config -------------------------------------------------------------------------------
    out("config", "empty.json", "{}")
    out("config", "typo.json", '{"detection": {"treshold": 3}}')
    out("config", "some.json", '{"detection": {"threshold": 2.5, "minArea": 4}, "aperture": {"radii": [3, 5]},'
        ' "background": {"meshSize": 32}}')

    tile_corpus(rng)
    text_corpora()

    # --- from the project's own writers (gpuphot simulate, reduce --dump-config) -------------------
    if gpuphot:
        writer_corpora(gpuphot)


def writer_corpora(gpuphot):
    """Seeds from gpuphot's own writers: a simulated frame, its header, the dumped configuration, a gzip'd
    frame and a results database."""
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([gpuphot, "simulate", "--size", "24x20", "--stars", "3", "--seed", "1", "-q",
                        "-o", d, "--name", "sim"], check=True, env={**os.environ, "GPUPHOT_NO_TYCHO2": "1"})
        out("fits_reader", "sim.fits", open(os.path.join(d, "sim.fits"), "rb").read())
        # (sim.ref.fits covers more sky than the frame: ~90 KiB, too big for a seed; gaia_like.fits stands in)
        with fits.open(os.path.join(d, "sim.fits")) as h:
            out("header_wcs", "sim.hdr", h[0].header.tostring())
        cfg = subprocess.run([gpuphot, "reduce", "--dump-config"], check=True, capture_output=True).stdout
        out("config", "dump_config.json", cfg)
        sim = open(os.path.join(d, "sim.fits"), "rb").read()
        out("gzip_fits", "sim_wrapped.fits", b"\x01" + sim)
        out("gzip_fits", "sim.fits.gz", b"\x00" + gzip.compress(sim, 9))
        # A results store holding one small reduced frame, its pages shrunk to 512 bytes.
        subprocess.run([gpuphot, "simulate", "--size", "128x128", "--stars", "40", "--seed", "2", "-q",
                        "-o", d, "--name", "db"], check=True, env={**os.environ, "GPUPHOT_NO_TYCHO2": "1"})
        db = os.path.join(d, "night.sqlite")
        subprocess.run([gpuphot, "reduce", os.path.join(d, "db.fits"), "--ref", os.path.join(d, "db.ref.fits"),
                        "-o", os.path.join(d, "out"), "-q", "--db", db], check=False,
                       env={**os.environ, "GPUPHOT_NO_TYCHO2": "1"})
        assert os.path.exists(db), "reduce --db wrote no database"  # (exit 4, not calibrated, is fine)
        con = sqlite3.connect(db)
        con.execute("PRAGMA journal_mode=DELETE")
        con.execute("PRAGMA page_size=512")
        con.execute("VACUUM")
        con.close()
        out("results_db", "one_frame.sqlite", open(db, "rb").read())


# --- fuzz_tile_image: real compressed tiles, in the harness's layout (tests/fuzz/fuzz_tile_image.cpp) ---
TILE_ALGORITHMS = ["RICE_1", "GZIP_1", "GZIP_2", "PLIO_1", "HCOMPRESS_1"]
TILE_BITPIX = [8, 16, 32, -32, -64]


def tile_seed(data, algorithm, tile, **kw):
    """8 parameter bytes, one 16-bit length per tile, the tiles' bytes: as fuzz_tile_image reads them."""
    rows, cols = data.shape
    hdu = fits.CompImageHDU(data, compression_type=algorithm, tile_shape=tile, **kw)
    raw = fits_bytes(fits.HDUList([fits.PrimaryHDU(), hdu]))
    with tempfile.NamedTemporaryFile(suffix=".fits") as t:
        open(t.name, "wb").write(raw)
        with fits.open(t.name, disable_image_compression=True) as h:
            table = h[1]
            bitpix = table.header["ZBITPIX"]
            tiles = [np.asarray(v) for v in table.data["COMPRESSED_DATA"]]
    blobs = [v.astype(">i2").tobytes() if algorithm == "PLIO_1" else v.astype(np.uint8).tobytes() for v in tiles]
    params = bytes([TILE_ALGORITHMS.index(algorithm), TILE_BITPIX.index(bitpix), cols - 1, rows - 1,
                    tile[1] - 1, tile[0] - 1, 0, 0])
    return params + b"".join(len(b).to_bytes(2, "little") for b in blobs) + b"".join(blobs)


def tile_corpus(rng):
    ramp = np.add.outer(np.arange(16), np.arange(20))
    i16 = (1000 + 30 * rng.standard_normal((16, 20)) + 5 * ramp).astype(np.int16)
    i32 = i16.astype(np.int32) * 300
    u8 = (i16 % 200).astype(np.uint8)
    f32 = (i16.astype(np.float32) * 0.37)
    out("tile_image", "rice_i16.bin", tile_seed(i16, "RICE_1", (8, 10)))
    out("tile_image", "rice_i32_edge.bin", tile_seed(i32, "RICE_1", (6, 7)))
    out("tile_image", "rice_u8.bin", tile_seed(u8, "RICE_1", (16, 20)))
    out("tile_image", "gzip1_i16.bin", tile_seed(i16, "GZIP_1", (8, 10)))
    out("tile_image", "gzip2_i32.bin", tile_seed(i32, "GZIP_2", (8, 20)))
    out("tile_image", "gzip2_f32_lossless.bin", tile_seed(f32, "GZIP_2", (8, 10), quantize_level=0))
    out("tile_image", "plio_i16.bin", tile_seed((i16 % 7).astype(np.int16), "PLIO_1", (1, 20)))
    out("tile_image", "plio_mask_runs.bin", tile_seed((ramp > 15).astype(np.int32), "PLIO_1", (4, 20)))
    out("tile_image", "hcompress_i16.bin", tile_seed(i16, "HCOMPRESS_1", (8, 10)))
    out("tile_image", "hcompress_i32_edge.bin", tile_seed(i32, "HCOMPRESS_1", (6, 7)))
    out("tile_image", "hcompress_i16_lossy.bin", tile_seed(i16, "HCOMPRESS_1", (16, 20), hcomp_scale=2.5))


# --- fuzz_targets, fuzz_sextractor: text inputs ---------------------------------------------------------
def text_corpora():
    # fuzz_targets: first byte = suffix (.csv .txt .ecsv .fits .tsv .dat)
    out("targets", "names.csv", b"\x00name,ra,dec\nWASP-12,97.6366,29.6723\nHAT-P-7,292.2472,47.9695\n")
    out("targets", "sexagesimal.txt", b"\x01# target list\nOBJECT RA DEC\nT1 06:30:32.79 +29:40:20.3\n"
        b"T2 19h28m59.35s +47d58m10.2s\n")
    out("targets", "coord.csv", b"\x00id,coord\n1,\"12:34:56.7 -05:06:07\"\n2,\"00:00:01 +89:59:59\"\n")
    out("targets", "table.ecsv", b"\x02# %ECSV 1.0\n# ---\n# datatype:\n# - {name: target, datatype: string}\n"
        b"# - {name: ra, datatype: float64}\n# - {name: dec, datatype: float64}\ntarget ra dec\nA 10.5 -20.25\n")
    t = fits.BinTableHDU.from_columns([fits.Column(name="NAME", format="8A", array=["a", "b"]),
                                       fits.Column(name="RA", format="D", array=[1.5, 359.9]),
                                       fits.Column(name="DEC", format="D", array=[-89.9, 45.0])])
    out("targets", "table.fits", b"\x03" + fits_bytes(fits.HDUList([fits.PrimaryHDU(), t])))
    # fuzz_sextractor: first byte = kind (0 .sex, 1 .param, 2 .conv)
    sex_dir = "/usr/share/source-extractor"  # Debian's source-extractor package (GPL-3; small config files)
    out("sextractor", "default.sex", b"\x00" + open(os.path.join(sex_dir, "default.sex"), "rb").read())
    out("sextractor", "overrides.sex", b"\x00DETECT_THRESH 2.5\nDETECT_MINAREA 4\nPHOT_APERTURES 3,5,8\n"
        b"BACK_SIZE 32\nBACK_FILTERSIZE 3\nFILTER N\nCATALOG_TYPE FITS_LDAC\nSATUR_LEVEL 60000 # ADU\n")
    out("sextractor", "params.param", b"\x01NUMBER\nX_IMAGE\nY_IMAGE\nFLUX_APER(3)\nFLUX_RADIUS(2)\n"
        b"MAG_AUTO\nVIGNET(5,5)\n#FLAGS\n")
    for name in ("default.conv", "gauss_2.0_5x5.conv", "block_3x3.conv"):
        out("sextractor", name, b"\x02" + open(os.path.join(sex_dir, name), "rb").read())


if __name__ == "__main__":
    main()
