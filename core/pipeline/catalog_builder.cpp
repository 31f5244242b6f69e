#include "core/pipeline/catalog_builder.hpp"

#include <cmath>
#include <span>
#include <string>

#include <omp.h>

#include "core/catalog/reference_catalog.hpp"
#include "core/model/flags.hpp"
#include "core/model/frame.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/util/prefault.hpp"
#include "core/wcs/tan_sip.hpp"
#include "core/wcs/wcs.hpp"
#include "core/wcs/wcs_chunked.hpp"

namespace gpuphot {

double instrumentalMag(double flux) { return flux > 0 && std::isfinite(flux) ? -2.5 * std::log10(flux) : std::nan(""); }

double magError(double flux, double fluxErr) {
    return flux > 0 && std::isfinite(flux) && std::isfinite(fluxErr) ? 2.5 / std::log(10.0) * fluxErr / flux
                                                                       : std::nan("");
}

namespace {
// A column of n values f(i): its pages faulted in and its values filled by all threads (a 150k-source
// catalog is about 60 MB of fresh memory; built on one thread its page faults alone took tens of ms).
template <class T, class F> std::vector<T> column(std::size_t n, F f) {
    std::vector<T> out = prefaultedVector<T>(n, 0);
#pragma omp parallel for schedule(static) if (n > 16384)
    for (long long i = 0; i < static_cast<long long>(n); ++i)
        out[static_cast<std::size_t>(i)] = f(static_cast<std::size_t>(i));
    return out;
}
template <class T> std::vector<T> copyOf(const std::vector<T>& v) {
    return column<T>(v.size(), [&v](std::size_t i) { return v[i]; });
}
std::vector<double> plusOne(const std::vector<double>& v) {
    return column<double>(v.size(), [&v](std::size_t i) { return v[i] + 1.0; });
}
std::vector<double> orNan(const std::vector<double>& v, std::size_t n) {
    return v.size() == n ? copyOf(v) : column<double>(n, [](std::size_t) { return std::nan(""); });
}
} // namespace

void addApertureColumns(Table& t, const ApertureResult& ap, std::size_t n) {
    if (ap.count != n) return;
    for (std::size_t k = 0; k < ap.radii.size(); ++k) {
        const std::string suffix = std::to_string(k + 1);
        const std::vector<double>&flux = ap.flux[k], &err = ap.fluxErr[k];
        const std::string what = "circular aperture of radius APRAD" + suffix;
        t.add("flux_aper_" + suffix, copyOf(flux), "adu", "flux in the " + what);
        t.add("fluxerr_aper_" + suffix, copyOf(err), "adu", "error of flux_aper_" + suffix);
        t.add("mag_aper_" + suffix,
              column<double>(n, [&](std::size_t i) { return instrumentalMag(flux[i]); }), "mag",
              "-2.5 log10(flux_aper_" + suffix + "), no aperture correction");
        t.add("magerr_aper_" + suffix,
              column<double>(n, [&](std::size_t i) { return magError(flux[i], err[i]); }), "mag",
              "error of mag_aper_" + suffix);
    }
}

Table buildCatalog(const Frame& frame, const PipelineResult& r, const PipelineConfig& config,
                   const ReferenceCatalog* reference) {
    const Sources& s = r.detection.sources;
    const std::size_t n = s.size();
    const double nan = std::nan("");
    Table t;
    t.name = "CATALOG";

    t.add("id", column<std::int64_t>(n, [](std::size_t i) { return static_cast<std::int64_t>(i) + 1; }), "",
          "source number (1-based)");
    t.add("x", plusOne(s.x), "pix", "windowed centroid x (FITS 1-based)");
    t.add("y", plusOne(s.y), "pix", "windowed centroid y (FITS 1-based)");
    t.add("x_err", copyOf(s.xErr), "pix", "1-sigma error of x");
    t.add("y_err", copyOf(s.yErr), "pix", "1-sigma error of y");
    t.add("x_iso", plusOne(s.xIso), "pix", "isophotal barycentre x (1-based)");
    t.add("y_iso", plusOne(s.yIso), "pix", "isophotal barycentre y (1-based)");

    std::vector<double> ra = column<double>(n, [nan](std::size_t) { return nan; });
    std::vector<double> dec = column<double>(n, [nan](std::size_t) { return nan; });
    const Wcs* wcs = r.fittedWcs ? r.fittedWcs.get() : frame.wcs.get();
    const std::string wcsWhat = r.fittedWcs ? "the fitted WCS" : "the header WCS";
    if (wcs && n > 0)
        transformChunked(*wcs, n, omp_get_max_threads(), [&](const Wcs& w, std::size_t b, std::size_t len) {
            w.pixelToWorld(std::span(s.x).subspan(b, len), std::span(s.y).subspan(b, len),
                           std::span(ra).subspan(b, len), std::span(dec).subspan(b, len));
        });
    t.add("ra", std::move(ra), "deg", "right ascension (ICRS) from " + wcsWhat);
    t.add("dec", std::move(dec), "deg", "declination (ICRS) from " + wcsWhat);
    t.add("a", copyOf(s.a), "pix", "semi-major axis (second moments)");
    t.add("b", copyOf(s.b), "pix", "semi-minor axis (second moments)");
    t.add("theta", copyOf(s.theta), "deg", "position angle, counter-clockwise from +x");
    t.add("fwhm", orNan(r.psf.fwhm, n), "pix", "PSF model FWHM at the source");
    t.add("ellipticity", orNan(r.psf.ellipticity, n), "", "PSF model ellipticity 1 - b/a at the source");
    t.add("flux_iso", copyOf(s.fluxIso), "adu", "isophotal flux above background");
    t.add("area_iso", copyOf(s.areaIso), "pix2", "isophotal area");

    const ApertureResult& ap = r.aperture;
    const bool haveAp = ap.count == n;
    addApertureColumns(t, ap, n);
    std::vector<double> magAuto =
        column<double>(n, [&](std::size_t i) { return haveAp ? instrumentalMag(ap.fluxAuto[i]) : nan; });
    t.add("flux_auto", orNan(ap.fluxAuto, n), "adu", "flux in the Kron (AUTO) ellipse");
    t.add("fluxerr_auto", orNan(ap.fluxAutoErr, n), "adu", "error of flux_auto");
    t.add("mag_auto", std::move(magAuto), "mag", "-2.5 log10(flux_auto)");
    t.add("kron_radius", orNan(ap.kronRadius, n), "", "Kron radius in units of a, b");
    t.add("flux_opt", orNan(ap.fluxOpt, n), "adu", "S/N-optimal aperture flux, corrected to total");
    t.add("fluxerr_opt", orNan(ap.fluxOptErr, n), "adu", "error of flux_opt");
    t.add("flux_psf", orNan(r.psf.fluxPsf, n), "adu", "PSF-fit flux (ePSF)");
    t.add("fluxerr_psf", orNan(r.psf.fluxPsfErr, n), "adu", "error of flux_psf");
    t.add("sky", orNan(ap.sky, n), "adu", "local sky per pixel");
    t.add("peak", copyOf(s.peak), "adu", "highest pixel above background");

    const bool psfFlags = r.psf.flags.size() == n;
    std::vector<std::int32_t> flags = column<std::int32_t>(n, [&](std::size_t i) {
        return static_cast<std::int32_t>(s.flags[i] | (haveAp ? ap.flags[i] : 0u) |
                                         (psfFlags ? r.psf.flags[i] : 0u));
    });
    const ZeroPointResult& zp = r.zeropoint;
    for (std::size_t k = 0; k < r.astrometry.sourceIndex.size(); ++k)
        if (k < r.astrometry.used.size() && r.astrometry.used[k] && r.astrometry.sourceIndex[k] >= 0 &&
            static_cast<std::size_t>(r.astrometry.sourceIndex[k]) < n)
            flags[r.astrometry.sourceIndex[k]] |= static_cast<std::int32_t>(FlagAstromStar);
    for (std::size_t k = 0; k < zp.sourceIndex.size(); ++k)
        if (k < zp.used.size() && zp.used[k] && zp.sourceIndex[k] >= 0 && static_cast<std::size_t>(zp.sourceIndex[k]) < n)
            flags[zp.sourceIndex[k]] |= static_cast<std::int32_t>(FlagCalibrator);
    t.add("flags", std::move(flags), "", "flag bits (docs/FLAGS.md)");

    std::vector<std::int64_t> refId = column<std::int64_t>(n, [](std::size_t) { return std::int64_t{-1}; });
    std::vector<double> refSep = column<double>(n, [nan](std::size_t) { return nan; });
    std::vector<double> magCal = column<double>(n, [nan](std::size_t) { return nan; });
    std::vector<double> magErrCal = column<double>(n, [nan](std::size_t) { return nan; });
    const bool matched = reference && r.crossmatch.refIndex.size() == n;
#pragma omp parallel for schedule(static) if (n > 16384)
    for (long long ii = 0; ii < static_cast<long long>(n); ++ii) {
        const auto i = static_cast<std::size_t>(ii);
        double colour = nan;
        if (matched && r.crossmatch.refIndex[i] >= 0) {
            const std::size_t j = static_cast<std::size_t>(r.crossmatch.refIndex[i]);
            refId[i] = j < reference->id.size() ? reference->id[j] : static_cast<std::int64_t>(j);
            refSep[i] = r.crossmatch.separationArcsec[i];
            if (j < reference->color.size()) colour = reference->color[j];
        }
        if (zp.ok && i < r.magInst.size() && std::isfinite(r.magInst[i])) {
            // The colour term needs the star's colour: applied where the reference gives one, else the
            // magnitude is the zero point alone (colour 0) and says so in the column description.
            const double ct = zp.colourTermFitted && std::isfinite(colour) ? zp.colourTerm * colour : 0.0;
            magCal[i] = r.magInst[i] + zp.zp + ct;
            magErrCal[i] = std::hypot(r.magInstErr[i], zp.zpErr);
        }
    }
    t.add("ref_id", std::move(refId), "", "matched reference star id (-1: none)");
    t.add("ref_sep", std::move(refSep), "arcsec", "separation from the matched reference star");
    t.add("mag_cal", std::move(magCal), "mag",
          "-2.5 log10(flux_opt) + ZP (+ ZPCOLTRM x reference colour where the star is matched and has one)");
    t.add("magerr_cal", std::move(magErrCal), "mag", "error of mag_cal (photometric and zero-point errors)");

    Header& h = t.meta;
    for (std::size_t k = 0; k < ap.radii.size(); ++k) {
        const std::string suffix = std::to_string(k + 1);
        h.set("APRAD" + suffix, ap.radii[k], "[pix] radius of aperture " + suffix);
        if (k < ap.apCorrMag.size()) h.set("APCOR" + suffix, ap.apCorrMag[k], "[mag] aperture correction to total");
    }
    h.set("FWHM", r.fwhm, "[pix] median FWHM of the field (" + r.fwhmSource + ")");
    h.set("ELLIPTIC", r.psf.medianEllipticity, "median PSF ellipticity");
    h.set("NPSFSTAR", r.psf.nStars, "stars in the PSF model");
    h.set("APCSRC", ap.apCorrSource.empty() ? std::string_view("none") : std::string_view(ap.apCorrSource),
          "aperture correction from: stars, psf_model, gaussian");
    h.set("NAPCSTAR", ap.apCorrStars, "stars that measured the aperture correction");
    const double zpv = zp.ok ? zp.zp : nan;
    h.set("ZP", zpv, zp.ok ? "[mag] photometric zero point: mag_cal = mag + ZP" : "[mag] not calibrated");
    h.set("ZPERR", zp.ok ? zp.zpErr : nan, "[mag] error of ZP");
    h.set("ZPSRC", zp.magSource.empty() ? std::string_view("none") : std::string_view(zp.magSource),
          "magnitudes calibrated: aperture (flux_opt) or psf");
    h.set("ZPCOLTRM", zp.ok && zp.colourTermFitted ? zp.colourTerm : nan, "[mag/mag] colour term");
    h.set("ZPEXPT", zp.ok && std::isfinite(frame.instrument.exptime) && frame.instrument.exptime > 0
                        ? zpv + 2.5 * std::log10(frame.instrument.exptime) : nan, "[mag] ZP for fluxes in ADU/s");
    h.set("NCALIB", zp.nUsed, "stars used in the zero-point fit");
    h.set("NMATCH", static_cast<long long>(r.crossmatch.nMatched), "sources matched to the reference");
    h.set("MAGLIM", zp.ok ? zp.limitingMag : nan, "[mag] limiting magnitude (S/N = 5)");
    h.set("BKGLEVEL", r.background.globalLevel, "[adu] global background");
    h.set("BKGRMS", r.background.globalRms, "[adu] global background RMS");
    h.set("GAIN", frame.instrument.gain, "[e-/adu] (" + frame.instrument.gainSource + ")");
    h.set("RDNOISE", frame.instrument.readNoise, "[e-] (" + frame.instrument.readNoiseSource + ")");
    if (std::isfinite(frame.instrument.exptime)) h.set("EXPTIME", frame.instrument.exptime, "[s]");
    // Always present (NaN when the header gives no date / airmass or altitude), as ZP is.
    h.set("MJD-MID", frame.instrument.mjdMid, "mid-exposure MJD (start + EXPTIME / 2)");
    h.set("AIRMASS", frame.instrument.airmass, "airmass (header, else from its altitude)");
    if (!frame.instrument.filter.empty()) h.set("FILTER", frame.instrument.filter);
    if (!frame.instrument.object.empty()) h.set("OBJECT", frame.instrument.object);
    // The observatory, for barycentric times of light curves (gpuphot series): copied as the frame has it.
    for (const char* key : {"SITELAT", "SITELONG", "SITEELEV", "LAT-OBS", "LONG-OBS", "ALT-OBS", "OBSGEO-X",
                            "OBSGEO-Y", "OBSGEO-Z"})
        if (const auto* card = frame.header.find(key)) h.setRaw(key, card->value, card->comment);
    if (!frame.path.empty()) h.set("SRCFILE", frame.path, "reduced frame");
    h.set("SRCHDU", frame.hdu, "HDU of the frame (0-based)");
    h.set("SWVERSN", "gpuphot " GPUPHOT_VERSION, "software version");
    h.set("WCSSRC", r.fittedWcs ? std::string("fitted (") + r.astrometry.method + ")"
                                : (frame.wcs ? std::string("header") : std::string("none")), "origin of RA/Dec and WCS");
    h.set("ASTRMS", r.astrometry.ok ? r.astrometry.rmsArcsec : nan, "[arcsec] astrometric fit RMS");
    h.set("ASTNUSED", r.astrometry.ok ? r.astrometry.nUsed : 0, "stars used in the astrometric fit");
    if (r.fittedWcs) h.update(r.astrometry.wcs.toHeader());
    else if (frame.wcs) h.update(frame.wcs->toHeader());
    (void)config;
    return t;
}

} // namespace gpuphot
