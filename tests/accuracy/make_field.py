#!/usr/bin/python3
"""Independent star-field generator for photometric-calibration accuracy tests.

Shares no code with core/sim: numpy + astropy only (Debian's /usr/bin/python3).

Writes, in OUTDIR:
  FRAME.fits   float32 image, header GAIN RDNOISE SATURATE EXPTIME and a TAN WCS (CRVAL, CRPIX, CD)
  REF.fits     binary table: id, ra, dec, mag (= -2.5 log10(true flux) + ZP_TRUE + CT * color), color
  TRUTH.csv    id, x, y (FITS 1-based pixel centres), flux (ADU, total), mag (= -2.5 log10 flux + ZP_TRUE),
               mag_ref, color, fwhm, ell, theta_deg, frac_in_image
  FIELD.json   the parameters, ZP_TRUE, colour term, sky, and the PSF truncation figures
  MODEL.fits   (--write-model) the stars alone, noiseless, without sky: neighbour light for evaluate.py
  CRMASK.fits  (--cosmics N) the pixels hit by the simulated tracks

Stars: uniform positions over the frame plus --margin px on each side (stars just outside the frame shine
into it), fluxes log-uniform in [--fmin, --fmax] (the default 1e2..3e5 ADU reaches well below the detection
limit), colours uniform in --colour-range; --extra-stars adds given stars (e.g. pairs for deblending tests).

PSF: an elliptical Moffat I ~ (1 + u^2)^-beta, u^2 = x'^2/alpha_a^2 + y'^2/alpha_b^2 (x', y' along the major and
minor axes), FWHM_a = FWHM / sqrt(1 - e), FWHM_b = FWHM * sqrt(1 - e) (so FWHM is the geometric mean and
e = 1 - b/a), alpha = FWHM / (2 sqrt(2^(1/beta) - 1)). The profile is TRUNCATED at u_t = trunc * FWHM_axis /
alpha_axis (default trunc = 8 FWHM along each axis) and normalised numerically so that the rendered stamp
sums to the star's flux exactly: the true total flux is all in the image (except for stars at the edge, whose
in-image fraction is in TRUTH.csv). FIELD.json reports the fraction of the UNtruncated Moffat beyond the
truncation ((1 + u_t^2)^(1 - beta)), i.e. how much a "total flux" extrapolated with an infinite Moffat would
differ.

Pixel integration: Gauss-Legendre quadrature over each pixel, --core-nodes^2 nodes within --core-radius FWHM of
the centre (default 5x5) and --wing-nodes^2 (default 3x3) beyond (the wings are smooth on the pixel scale).
Vectorised over batches of stars (numpy broadcasting).

FWHM varies linearly over the field: FWHM(x, y) = fwhm * (1 + gx * X + gy * Y), X, Y in [-1, 1] from edge to
edge (so --fwhm-grad-x 0.15 is +-15% across the field); ellipticity likewise (--ell, --ell-grad-x/y),
position angle --theta (deg, from +x towards +y) plus --theta-grad-x (deg across half the field).

Noise: Poisson in electrons (gain e-/ADU) on sky + stars, plus Gaussian read noise (e-), in ADU.
Optional defects: --cosmics N short tracks, --hot-column X (1-based column, +HOTVAL ADU).
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
from astropy.io import fits
from astropy.wcs import WCS


def gauss_legendre(n):
    x, w = np.polynomial.legendre.leggauss(n)
    return 0.5 * x, 0.5 * w  # on [-0.5, 0.5], weights summing to 1


def moffat_alpha(fwhm, beta):
    return fwhm / (2.0 * math.sqrt(2.0 ** (1.0 / beta) - 1.0))


def field_shape(args, x0, y0):
    """FWHM, ellipticity, theta (rad) at 0-based pixel positions."""
    W, H = args.width, args.height
    X = (x0 - 0.5 * (W - 1)) / (0.5 * W)
    Y = (y0 - 0.5 * (H - 1)) / (0.5 * H)
    fwhm = args.fwhm * (1.0 + args.fwhm_grad_x * X + args.fwhm_grad_y * Y)
    ell = np.clip(args.ell + args.ell_grad_x * X + args.ell_grad_y * Y, 0.0, 0.9)
    theta = np.deg2rad(args.theta + args.theta_grad_x * X)
    return fwhm, ell, theta


def render_batch(dx, dy, fwhm, ell, theta, beta, trunc, nodes, weights):
    """Pixel integrals of the unnormalised truncated Moffat for a batch.

    dx, dy: (B, P) offsets of pixel centres from the star centre (px); returns (B, P) integrals
    (in units where the peak value is 1, unnormalised)."""
    a = fwhm / np.sqrt(1.0 - ell)  # FWHM along the major axis
    b = fwhm * np.sqrt(1.0 - ell)
    aa = moffat_alpha(1.0, beta) * a
    ab = moffat_alpha(1.0, beta) * b
    c, s = np.cos(theta), np.sin(theta)
    # quadratic form u^2 = A x^2 + 2 B x y + C y^2
    A = (c * c / aa ** 2 + s * s / ab ** 2)[:, None, None]
    Bq = (c * s * (1.0 / aa ** 2 - 1.0 / ab ** 2))[:, None, None]
    C = (s * s / aa ** 2 + c * c / ab ** 2)[:, None, None]
    ut2 = (trunc * (a / aa)) ** 2  # same for both axes: trunc * FWHM_axis / alpha_axis
    ut2 = ut2[:, None, None] if np.ndim(ut2) else ut2
    qx = (nodes[:, None] * np.ones(len(nodes))[None, :]).ravel()
    qy = (np.ones(len(nodes))[:, None] * nodes[None, :]).ravel()
    qw = (weights[:, None] * weights[None, :]).ravel()
    X = dx[:, :, None] + qx[None, None, :]
    Y = dy[:, :, None] + qy[None, None, :]
    u2 = A * X * X + 2.0 * Bq * X * Y + C * Y * Y
    v = np.where(u2 <= ut2, (1.0 + u2) ** (-beta), 0.0)
    return v @ qw


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--outdir", required=True)
    ap.add_argument("--size", default="2048x2048", help="WxH")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--stars", type=int, help="number of stars")
    g.add_argument("--density", type=float, default=3000.0, help="px^2 per star (default 3000)")
    ap.add_argument("--fmin", type=float, default=1e2, help="ADU, faintest total flux (log-uniform)")
    ap.add_argument("--fmax", type=float, default=3e5, help="ADU, brightest total flux")
    ap.add_argument("--beta", type=float, default=3.0)
    ap.add_argument("--fwhm", type=float, default=3.0, help="px, at the field centre")
    ap.add_argument("--fwhm-grad-x", type=float, default=0.0, help="fractional change edge to centre along x")
    ap.add_argument("--fwhm-grad-y", type=float, default=0.0)
    ap.add_argument("--ell", type=float, default=0.0, help="1 - b/a at the centre")
    ap.add_argument("--ell-grad-x", type=float, default=0.0)
    ap.add_argument("--ell-grad-y", type=float, default=0.0)
    ap.add_argument("--theta", type=float, default=30.0, help="deg, major-axis angle")
    ap.add_argument("--theta-grad-x", type=float, default=0.0, help="deg change edge to centre along x")
    ap.add_argument("--trunc", type=float, default=8.0, help="truncation radius in FWHM (per axis)")
    ap.add_argument("--core-radius", type=float, default=2.5, help="FWHM: finer quadrature inside")
    ap.add_argument("--core-nodes", type=int, default=5)
    ap.add_argument("--wing-nodes", type=int, default=3)
    ap.add_argument("--sky", type=float, default=500.0, help="ADU per pixel")
    ap.add_argument("--sky-grad", type=float, default=0.0, help="ADU change edge to centre along x")
    ap.add_argument("--gain", type=float, default=2.0, help="e-/ADU")
    ap.add_argument("--rdnoise", type=float, default=5.0, help="e-")
    ap.add_argument("--saturate", type=float, default=65000.0, help="ADU; pixels are clipped to this")
    ap.add_argument("--exptime", type=float, default=60.0)
    ap.add_argument("--noiseless", action="store_true")
    ap.add_argument("--zp", type=float, default=25.0, help="ZP_TRUE")
    ap.add_argument("--colour-term", type=float, default=0.0,
                    help="reference mag = -2.5 log F + ZP + CT * color")
    ap.add_argument("--colour-range", default="0.0,1.5", help="uniform colour range")
    ap.add_argument("--ref-mag-faint", type=float, default=None, help="reference catalog only to this mag")
    ap.add_argument("--ref-mag-err", type=float, default=0.0, help="Gaussian noise on ref mags (+ e_mag column)")
    ap.add_argument("--margin", type=float, default=10.0, help="px: stars placed this far outside the frame too")
    ap.add_argument("--pixscale", type=float, default=0.5, help="arcsec/px")
    ap.add_argument("--rotation", type=float, default=0.0, help="deg, WCS rotation")
    ap.add_argument("--crval", default="150.0,2.0")
    ap.add_argument("--cosmics", type=int, default=0, help="number of cosmic-ray tracks")
    ap.add_argument("--hot-column", type=int, default=0, help="1-based column with a hot offset (0: none)")
    ap.add_argument("--hot-value", type=float, default=300.0)
    ap.add_argument("--extra-stars", help="CSV x,y,flux (1-based pixels, ADU): stars added to the random ones")
    ap.add_argument("--write-model", action="store_true", help="also MODEL.fits: the stars alone, noiseless")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args(argv)

    W, H = (int(v) for v in args.size.lower().split("x"))
    args.width, args.height = W, H
    rng = np.random.default_rng(args.seed)
    os.makedirs(args.outdir, exist_ok=True)
    t0 = time.time()

    # ---- stars ----
    m = args.margin
    area = (W + 2 * m) * (H + 2 * m)
    n = args.stars if args.stars is not None else int(round(area / args.density))
    x0 = rng.uniform(-0.5 - m, W - 0.5 + m, n)  # 0-based pixel coordinates (centres at integers)
    y0 = rng.uniform(-0.5 - m, H - 0.5 + m, n)
    flux = np.exp(rng.uniform(math.log(args.fmin), math.log(args.fmax), n))
    if args.extra_stars:
        ex = np.loadtxt(args.extra_stars, delimiter=",", ndmin=2)
        x0 = np.concatenate([x0, ex[:, 0] - 1.0])
        y0 = np.concatenate([y0, ex[:, 1] - 1.0])
        flux = np.concatenate([flux, ex[:, 2]])
        n = len(x0)
    clo, chi = (float(v) for v in args.colour_range.split(","))
    color = rng.uniform(clo, chi, n)
    fwhm, ell, theta = field_shape(args, x0, y0)

    # ---- render ----
    img = np.zeros((H, W), dtype=np.float64)
    fwhm_max = float(fwhm.max())
    S = int(math.ceil(args.trunc * fwhm_max / math.sqrt(1.0 - min(0.9, float(ell.max()))))) + 1  # stamp half size
    Cc = int(math.ceil(args.core_radius * fwhm_max / math.sqrt(1.0 - min(0.9, float(ell.max()))))) + 1
    gx = np.arange(-S, S + 1)
    GX, GY = np.meshgrid(gx, gx)
    GX = GX.ravel().astype(float)
    GY = GY.ravel().astype(float)
    core_sel = (np.abs(GX) <= Cc) & (np.abs(GY) <= Cc)
    cn, cw = gauss_legendre(args.core_nodes)
    wn, ww = gauss_legendre(args.wing_nodes)
    frac_in = np.zeros(n)
    norm_ratio = []  # numerical / analytic normalisation (quadrature check)
    order = np.arange(n)
    for b0 in range(0, n, args.batch):
        sel = order[b0:b0 + args.batch]
        ix = np.rint(x0[sel]).astype(int)
        iy = np.rint(y0[sel]).astype(int)
        fx = x0[sel] - ix
        fy = y0[sel] - iy
        dx = GX[None, :] - fx[:, None]
        dy = GY[None, :] - fy[:, None]
        wing = np.empty(dx.shape)
        wing[:, ~core_sel] = render_batch(dx[:, ~core_sel], dy[:, ~core_sel], fwhm[sel], ell[sel], theta[sel],
                                          args.beta, args.trunc, wn, ww)
        wing[:, core_sel] = render_batch(dx[:, core_sel], dy[:, core_sel], fwhm[sel], ell[sel], theta[sel],
                                         args.beta, args.trunc, cn, cw)
        tot = wing.sum(axis=1)
        # analytic integral of the truncated Moffat with unit peak: pi aa ab / (beta-1) * (1 - (1+ut^2)^(1-beta))
        a = fwhm[sel] / np.sqrt(1 - ell[sel])
        bb = fwhm[sel] * np.sqrt(1 - ell[sel])
        aa = moffat_alpha(1.0, args.beta) * a
        ab = moffat_alpha(1.0, args.beta) * bb
        ut2 = (args.trunc / moffat_alpha(1.0, args.beta)) ** 2
        analytic = math.pi * aa * ab / (args.beta - 1) * (1 - (1 + ut2) ** (1 - args.beta))
        norm_ratio.extend((tot / analytic).tolist())
        stamp = wing * (flux[sel] / tot)[:, None]
        stamp = stamp.reshape(len(sel), 2 * S + 1, 2 * S + 1)
        for k in range(len(sel)):
            xa, xb = ix[k] - S, ix[k] + S + 1
            ya, yb = iy[k] - S, iy[k] + S + 1
            cxa, cxb = max(0, xa), min(W, xb)
            cya, cyb = max(0, ya), min(H, yb)
            if cxa >= cxb or cya >= cyb:
                continue
            piece = stamp[k, cya - ya:cyb - ya, cxa - xa:cxb - xa]
            img[cya:cyb, cxa:cxb] += piece
            frac_in[sel[k]] = piece.sum() / flux[sel[k]]
    t_render = time.time() - t0

    # ---- sky, noise, defects ----
    xs = np.arange(W)
    sky = args.sky + args.sky_grad * (xs - 0.5 * (W - 1)) / (0.5 * W)
    model = img + sky[None, :]
    if args.noiseless:
        data = model.copy()
    else:
        e = rng.poisson(np.clip(model, 0, None) * args.gain).astype(np.float64)
        e += rng.normal(0.0, args.rdnoise, size=e.shape)
        data = e / args.gain
    crmask = np.zeros((H, W), dtype=np.uint8)
    for _ in range(args.cosmics):
        L = rng.integers(1, 12)
        ang = rng.uniform(0, math.pi)
        cx, cy = rng.uniform(0, W - 1), rng.uniform(0, H - 1)
        amp = rng.uniform(500, 5000) / args.gain
        for t in np.linspace(0, L, 2 * L + 1):
            px = int(round(cx + t * math.cos(ang)))
            py = int(round(cy + t * math.sin(ang)))
            if 0 <= px < W and 0 <= py < H and not crmask[py, px]:
                data[py, px] += amp
                crmask[py, px] = 1
    if args.hot_column > 0:
        data[:, args.hot_column - 1] += args.hot_value
    data = np.minimum(data, args.saturate)

    # ---- WCS and files ----
    crval = [float(v) for v in args.crval.split(",")]
    cd = args.pixscale / 3600.0
    r = math.radians(args.rotation)
    w = WCS(naxis=2)
    w.wcs.ctype = ["RA---TAN", "DEC--TAN"]
    w.wcs.crval = crval
    w.wcs.crpix = [0.5 * (W + 1), 0.5 * (H + 1)]
    w.wcs.cd = np.array([[-cd * math.cos(r), cd * math.sin(r)], [cd * math.sin(r), cd * math.cos(r)]])
    hdr = w.to_header()
    hdr["GAIN"] = (args.gain, "e-/ADU")
    hdr["RDNOISE"] = (args.rdnoise, "e-")
    hdr["SATURATE"] = (args.saturate, "ADU")
    hdr["EXPTIME"] = (args.exptime, "s")
    hdr["FILTER"] = "r"
    hdr["ZPTRUE"] = (args.zp, "true zero point (mag, colour 0)")
    hdr["GENERATR"] = "tests/accuracy/make_field.py"
    fits.PrimaryHDU(data.astype(np.float32), header=hdr).writeto(os.path.join(args.outdir, "FRAME.fits"),
                                                                  overwrite=True)
    if args.write_model:
        fits.PrimaryHDU(img.astype(np.float32)).writeto(os.path.join(args.outdir, "MODEL.fits"), overwrite=True)
    if args.cosmics:
        fits.PrimaryHDU(crmask).writeto(os.path.join(args.outdir, "CRMASK.fits"), overwrite=True)

    ra, dec = w.all_pix2world(x0 + 1.0, y0 + 1.0, 1)
    mag = -2.5 * np.log10(flux) + args.zp
    mag_ref = mag + args.colour_term * color
    ids = np.arange(1, n + 1)
    keep = np.ones(n, bool) if args.ref_mag_faint is None else mag_ref <= args.ref_mag_faint
    cols = [fits.Column(name="id", format="K", array=ids[keep]),
            fits.Column(name="ra", format="D", unit="deg", array=ra[keep]),
            fits.Column(name="dec", format="D", unit="deg", array=dec[keep])]
    if args.ref_mag_err > 0:
        noisy = mag_ref + rng.normal(0, args.ref_mag_err, n)
        cols.append(fits.Column(name="mag", format="D", array=noisy[keep]))
        cols.append(fits.Column(name="e_mag", format="D", array=np.full(keep.sum(), args.ref_mag_err)))
    else:
        cols.append(fits.Column(name="mag", format="D", array=mag_ref[keep]))
    cols.append(fits.Column(name="color", format="D", array=color[keep]))
    fits.BinTableHDU.from_columns(cols).writeto(os.path.join(args.outdir, "REF.fits"), overwrite=True)

    with open(os.path.join(args.outdir, "TRUTH.csv"), "w") as f:
        f.write("id,x,y,flux,mag,mag_ref,color,fwhm,ell,theta_deg,frac_in_image\n")
        for i in range(n):
            f.write("%d,%.5f,%.5f,%.6g,%.6f,%.6f,%.5f,%.5f,%.5f,%.3f,%.6f\n" % (
                ids[i], x0[i] + 1.0, y0[i] + 1.0, flux[i], mag[i], mag_ref[i], color[i], fwhm[i], ell[i],
                math.degrees(theta[i]), frac_in[i]))

    ut2 = (args.trunc / moffat_alpha(1.0, args.beta)) ** 2
    nr = np.array(norm_ratio)
    meta = dict(vars(args))
    meta.update({
        "n_stars": int(n), "zp_true": args.zp, "colour_term": args.colour_term,
        "px2_per_star": area / n,
        "untruncated_fraction_beyond_truncation": (1 + ut2) ** (1 - args.beta),
        "quadrature_over_analytic_norm_min": float(nr.min()), "quadrature_over_analytic_norm_max": float(nr.max()),
        "stamp_half_size_px": S, "render_seconds": t_render, "total_seconds": time.time() - t0,
    })
    with open(os.path.join(args.outdir, "FIELD.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print("%s: %dx%d, %d stars (1 per %.0f px^2), stamp +-%d px, untruncated Moffat beyond %.1f FWHM: %.2e, "
          "quadrature/analytic norm %.5f..%.5f, %.1f s" % (
              args.outdir, W, H, n, area / n, S, args.trunc, meta["untruncated_fraction_beyond_truncation"],
              nr.min(), nr.max(), time.time() - t0))


if __name__ == "__main__":
    sys.exit(main())
