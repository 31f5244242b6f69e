#include "core/pipeline/pipeline.hpp"

#include "core/pipeline/param_table.hpp"
#include "core/pipeline/pointing.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <future>
#include <limits>
#include <numbers>
#include <optional>
#include <string>
#include <utility>

#include "core/catalog/reference_catalog.hpp"
#include "core/model/frame.hpp"
#include "core/pipeline/catalog_builder.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/crossmatch/crossmatch.hpp"
#include "core/util/errors.hpp"
#include "core/util/robust_stats.hpp"
#include "core/wcs/wcs.hpp"

namespace gpuphot {

const char* stageName(Stage s) {
    switch (s) {
    case Stage::Background:
        return "background";
    case Stage::Detection:
        return "detection";
    case Stage::Psf:
        return "psf";
    case Stage::Aperture:
        return "aperture";
    case Stage::Calibration:
        return "calibration";
    case Stage::Done:
        return "done";
    }
    return "?";
}

namespace {

// The local curve of growth: kept(r, f) is the fraction of a star's light that an aperture of radius r
// keeps after the local sky, itself raised by the wing light in the annulus [a1, a2], is subtracted, for
// the PSF model's profile at FWHM f (circular); relative to the reference radius R unless the correction
// goes to the total. fRef: the FWHM the field's curve refers to (the PSF model's median).
struct LocalCurve {
    PsfModelKind kind = PsfModelKind::Gaussian;
    double beta = 0.0, a1 = 0.0, a2 = 0.0, R = 0.0, fRef = 0.0;
    bool toTotal = false;
    // the profile at FWHM f: the annulus' wing light per pixel and the reference radius' kept light
    struct At {
        double f = 0.0, wing = 0.0, norm = 1.0;
    };
    double ee(double f, double r) const { return encircledEnergy(kind, f, beta, r); }
    At at(double f) const {
        At p{f, a2 > a1 ? (ee(f, a2) - ee(f, a1)) / (a2 * a2 - a1 * a1) : 0.0, 1.0};
        if (!toTotal) p.norm = ee(f, R) - R * R * p.wing;
        return p;
    }
    double kept(double r, const At& p) const { return (ee(p.f, r) - r * r * p.wing) / p.norm; }
    double kept(double r, double f) const { return kept(r, at(f)); }
};

// The local curve's profile: the PSF model's Moffat beta, else a Gaussian.
LocalCurve profileOf(const PsfResult& psf) {
    LocalCurve c;
    const bool moffat = psf.model == PsfModelKind::Moffat && psf.medianBeta > 1.0;
    c.kind = moffat ? PsfModelKind::Moffat : PsfModelKind::Gaussian;
    c.beta = moffat ? psf.medianBeta : 0.0;
    return c;
}

// The PSF model's curve for reference radius R and sky annulus [a1, a2], fRef its median FWHM.
LocalCurve curveFor(const PsfResult& psf, double R, double a1, double a2) {
    LocalCurve c = profileOf(psf);
    c.fRef = psf.medianFwhm;
    c.a1 = a1, c.a2 = a2, c.R = R;
    return c;
}

// fRef is the PSF model's median FWHM: a measured curve was brought there star by star (cogStarScale), and
// a model curve is the model's at that FWHM.
std::optional<LocalCurve> localCurveOf(const ApertureResult& ap, const PsfResult& psf) {
    LocalCurve c = curveFor(psf, ap.apCorrRefRadius, ap.skyAnnulusInner, ap.skyAnnulusOuter);
    c.toTotal = ap.refApertureFraction < 1.0;
    if (!(c.fRef > 0.0) || !(c.R > 0.0) || psf.fwhm.size() != ap.fluxOpt.size()) return std::nullopt;
    return c;
}

// ApertureParams::cogStarScale: kept(r; fRef) / kept(r; the star's FWHM), relative to the reference
// radius, fRef the PSF model's median FWHM (1 where a star has no FWHM). Not the curve stars' own median:
// they are the brightest by S/N in a 1-FWHM aperture, which favours where the PSF is sharp, and the fixed
// apertures' single correction must hold for the field's median star.
std::vector<double> cogStarScale(const PsfResult& psf, const std::vector<std::size_t>& stars,
                                 const std::vector<double>& radii, double R, double a1, double a2) {
    const std::size_t nr = radii.size();
    std::vector<double> out(stars.size() * nr, 1.0);
    const LocalCurve c = curveFor(psf, R, a1, a2);
    if (!(c.fRef > 0.0) || !(R > 0.0)) return out;
    const LocalCurve::At ref = c.at(c.fRef);
    std::vector<double> keptRef(nr);
    for (std::size_t g = 0; g < nr; ++g)
        keptRef[g] = c.kept(radii[g], ref);
    for (std::size_t s = 0; s < stars.size(); ++s) {
        const double f = stars[s] < psf.fwhm.size() ? psf.fwhm[stars[s]] : 0.0;
        if (!(f > 0.0)) continue;
        const LocalCurve::At star = c.at(f);
        for (std::size_t g = 0; g < nr; ++g) {
            const double v = keptRef[g] / c.kept(radii[g], star);
            if (v > 0.5 && v < 2.0) out[s * nr + g] = v;
        }
    }
    return out;
}

// The optimal apertures were corrected with one curve of growth, the field's at fRef. Where the PSF model
// is broader or sharper than fRef, the aperture keeps less or more of the light: each
// source's flux is scaled by kept(r; fRef) / kept(r; its FWHM), r its radius.
void applyLocalCurveOfGrowth(ApertureResult& ap, const PsfResult& psf) {
    const std::optional<LocalCurve> c = localCurveOf(ap, psf);
    if (!c) return;
    const std::ptrdiff_t n = static_cast<std::ptrdiff_t>(ap.fluxOpt.size());
    const LocalCurve::At ref = c->at(c->fRef);
#pragma omp parallel for schedule(static) if (n >= 4096)
    for (std::ptrdiff_t ii = 0; ii < n; ++ii) {
        const std::size_t i = static_cast<std::size_t>(ii);
        const double f = psf.fwhm[i], r = i < ap.radiusOpt.size() ? ap.radiusOpt[i] : std::nan("");
        if (!(f > 0.0) || !std::isfinite(r) || !(r > 0.0)) continue;
        const double scale = c->kept(r, ref) / c->kept(r, c->at(f));
        if (!(scale > 0.5 && scale < 2.0)) continue;
        ap.fluxOpt[i] *= scale;
        ap.fluxOptErr[i] *= scale;
    }
}

// What apertureCorrectionError finds.
struct SharedApCorrError {
    double err = 0.0;       // what every calibrated magnitude shares (mag)
    double curveSe = NAN;   // the measured curve's standard error at radius r (NaN: a model curve)
    double modelDiff = NAN; // |measured curve - PSF model's curve| at r (NaN: not computed)
    double radius = NAN;
};

// The error all calibrated aperture magnitudes share, the curve of growth's (mag): at the fixed radius
// nearest the median optimal radius of the matched sources of S/N >= minSnr, the standard error of the
// median of the curve stars' flux ratios, each first brought to fRef by the local curve (a varying PSF's
// spread is corrected for, so it is not counted as error), and the measured curve's difference from the
// PSF model's where that is significant; for a model curve, its apCorrMagErr.
SharedApCorrError apertureCorrectionError(const ApertureResult& ap, const PsfResult& psf,
                                          const std::vector<double>& magInstErr,
                                          const CrossmatchResult& matches, double minSnr, double modelErr) {
    SharedApCorrError out;
    if (ap.radii.empty() || ap.apCorrMagErr.size() != ap.radii.size()) return out;
    std::vector<double> radii;
    for (std::size_t i = 0; i < ap.radiusOpt.size() && i < matches.refIndex.size() && i < magInstErr.size();
         ++i)
        if (matches.refIndex[i] >= 0 && std::isfinite(ap.radiusOpt[i]) && magInstErr[i] > 0.0 &&
            1.0857 / magInstErr[i] >= minSnr)
            radii.push_back(ap.radiusOpt[i]);
    if (radii.empty()) return out;
    std::nth_element(radii.begin(), radii.begin() + radii.size() / 2, radii.end());
    const double r = radii[radii.size() / 2];
    std::size_t k = 0;
    for (std::size_t q = 1; q < ap.radii.size(); ++q)
        if (std::fabs(ap.radii[q] - r) < std::fabs(ap.radii[k] - r)) k = q;
    out.radius = ap.radii[k];
    const std::optional<LocalCurve> c = localCurveOf(ap, psf);
    if (ap.apCorrSource == "stars" && c && k < ap.apCorrStarRatio.size() &&
        ap.apCorrStarRatio[k].size() == ap.apCorrStarIndex.size() && ap.apCorrStarIndex.size() >= 2) {
        std::vector<double> ratio;
        LocalCurve rel = *c;
        rel.toTotal = false;
        for (std::size_t q = 0; q < ap.apCorrStarIndex.size(); ++q) {
            const double f = psf.fwhm[static_cast<std::size_t>(ap.apCorrStarIndex[q])];
            const double v = ap.apCorrStarRatio[k][q];
            if (!(f > 0.0) || !std::isfinite(v)) continue;
            // the ratio to the reference radius, brought from the star's FWHM to fRef
            ratio.push_back(v * rel.kept(ap.radii[k], c->fRef) / rel.kept(ap.radii[k], f));
        }
        if (ratio.size() < 2) return out;
        const auto [med, se] = medianWithError(ratio);
        if (!(med > 0.0)) return out;
        const double seMag = 2.5 / std::numbers::ln10 * se / med;
        out.err = out.curveSe = seMag;
        // The measured curve against the PSF model's (its pixels, brought to fRef): a difference beyond
        // 3 sigma of both (the curve's standard error, the model's modelErr) means one of them is wrong
        // (neighbours' light in the stars' apertures, too few stars, or a model that misses the wings),
        // and it is not known which: it is added as an error. Below that the measured curve stands: a
        // model good to modelErr is no evidence against it.
        const double rk = ap.radii[k], a1 = ap.skyAnnulusInner, a2 = ap.skyAnnulusOuter,
                     R = ap.apCorrRefRadius;
        const std::vector<double> g = psf.apertureFractions({rk, R, a1, a2});
        if (g.size() != 4 || !(g[1] > 0.0) || !std::isfinite(g[0])) return out;
        const double wing = a2 > a1 ? (g[3] - g[2]) / (a2 * a2 - a1 * a1) : 0.0;
        const double model = (g[0] - rk * rk * wing) / (g[1] - R * R * wing); // at medianFwhm = fRef
        if (!(model > 0.0) || !std::isfinite(model)) return out;
        out.modelDiff = std::fabs(2.5 * std::log10(med / model));
        if (out.modelDiff > 3.0 * std::hypot(seMag, modelErr)) out.err = std::hypot(seMag, out.modelDiff);
        return out;
    }
    const double err = ap.apCorrMagErr[k];
    out.err = err > 0.0 && std::isfinite(err) ? err : 0.0;
    return out;
}

// PSF-fit fluxes are tied to the aperture's total flux, as DAOPHOT's aperture correction of PSF magnitudes
// does: the median of flux_opt / flux_psf over the unflagged sources of aperture S/N >= 50 (at least 5),
// with its standard error (mag), which every PSF magnitude then shares with the aperture's curve.
struct PsfToTotal {
    bool ok = false;
    double factor = 1.0, errMag = 0.0;
    int stars = 0;
};

PsfToTotal psfToTotal(const PipelineResult& r, const std::vector<std::uint32_t>& flags,
                      std::uint32_t exclude) {
    PsfToTotal t;
    const ApertureResult& ap = r.aperture;
    const std::size_t n = ap.fluxOpt.size();
    if (r.psf.fluxPsf.size() != n || r.psf.fluxPsfErr.size() != n || flags.size() != n) return t;
    std::vector<double> ratio;
    for (std::size_t i = 0; i < n; ++i) {
        const double fo = ap.fluxOpt[i], eo = ap.fluxOptErr[i], fp = r.psf.fluxPsf[i];
        if (!(fo > 0.0) || !(eo > 0.0) || !(fp > 0.0) || fo / eo < 50.0 || (flags[i] & exclude)) continue;
        ratio.push_back(fo / fp);
    }
    const std::size_t m = ratio.size();
    if (m < 5) return t;
    const auto [med, se] = medianWithError(ratio);
    t.ok = med > 0.0 && std::isfinite(med);
    t.factor = med;
    t.errMag = 2.5 / std::numbers::ln10 * se / med;
    t.stars = static_cast<int>(m);
    return t;
}

// A context for work beside the run's own: its backend and cancel flag, `threads` threads (0: the run's
// resolved count).
RunContext fitContext(const RunContext& ctx, int threads) {
    RunContext c;
    c.backend = ctx.backend;
    c.threads = threads > 0 ? threads : ctx.threadCount();
    c.cancelFlag = ctx.cancelFlag;
    return c;
}

// Keeps the zero point that magSource names ("auto": the one of the smaller zpErr) and, for the PSF one,
// its magnitudes in r.magInst / r.magInstErr.
void keepBetterZeroPoint(PipelineResult& r, const std::string& src, ZeroPointResult& ap, ZeroPointResult& psf,
                         std::vector<double>& mPsf, std::vector<double>& ePsf) {
    const bool usePsf = src == "psf" || (src == "auto" && psf.ok && (!ap.ok || psf.zpErr < ap.zpErr));
    ZeroPointResult& kept = usePsf ? psf : ap;
    if (src == "auto" && ap.ok && psf.ok) {
        char buf[128];
        std::snprintf(buf, sizeof buf, "; magSource auto: aperture zpErr %.4f, psf zpErr %.4f", ap.zpErr,
                      psf.zpErr);
        kept.message += buf;
    }
    if (usePsf) {
        r.magInst = std::move(mPsf);
        r.magInstErr = std::move(ePsf);
    }
    r.zeropoint = std::move(kept);
}

// The zero point of the instrumental magnitudes that config.zeropoint.magSource names: with "auto" both
// the optimal aperture's and the PSF fit's are calibrated (at once, on two threads) and the one of the
// smaller zpErr is kept. The kept source's magnitudes are left in r.magInst / r.magInstErr (the catalog's
// mag_cal is made of them).
void fitCalibration(PipelineResult& r, const std::vector<std::uint32_t>& flags, const ReferenceCatalog& ref,
                    const PipelineConfig& config, double isolationArcsec, const std::vector<char>& crowded,
                    RunContext& ctx) {
    ZeroPointParams zpp = config.zeropoint;
    zpp.isolationArcsec = isolationArcsec;
    const std::string& src = zpp.magSource;
    if (src != "auto" && src != "aperture" && src != "psf")
        throw InvalidInput("zeropoint: magSource '" + src + "' (expected auto, aperture or psf)");
    ZeroPointResult ap, psf;
    const SharedApCorrError shared = apertureCorrectionError(r.aperture, r.psf, r.magInstErr, r.crossmatch,
                                                             zpp.minSnr, config.aperture.apCorrModelErr);
    const double apShared = shared.err;
    const std::size_t n = r.magInst.size();
    std::vector<double> mPsf(n, std::nan("")), ePsf(n, std::nan(""));
    const PsfToTotal scale = psfToTotal(r, flags, zpp.excludeFlags);
    const bool fitPsf = src != "aperture" && scale.ok;
    // The PSF magnitudes' fit on a thread of its own beside the aperture magnitudes' (a fit's result does
    // not depend on its thread count), with half the run's threads; after it on a run of one thread.
    RunContext psfCtx = fitContext(ctx, fitPsf && src != "psf" ? std::max(1, ctx.threadCount() / 2) : 0);
    std::future<ZeroPointResult> psfFit;
    if (fitPsf) {
        for (std::size_t i = 0; i < n; ++i) {
            mPsf[i] = instrumentalMag(r.psf.fluxPsf[i] * scale.factor);
            ePsf[i] = magError(r.psf.fluxPsf[i], r.psf.fluxPsfErr[i]);
        }
        const double psfShared = std::hypot(apShared, scale.errMag);
        const auto policy = ctx.threadCount() >= 2 ? std::launch::async : std::launch::deferred;
        psfFit = std::async(policy, [&, psfShared] {
            return fitZeroPoint(mPsf, ePsf, flags, r.crossmatch, ref, zpp, psfCtx, psfShared, &crowded);
        });
    }
    if (src != "psf") {
        RunContext apCtx = fitContext(ctx, fitPsf ? std::max(1, ctx.threadCount() - psfCtx.threads) : 0);
        apCtx.progress = ctx.progress;
        ap = fitZeroPoint(r.magInst, r.magInstErr, flags, r.crossmatch, ref, zpp, apCtx, apShared, &crowded);
        ap.magSource = "aperture";
        char buf[160];
        std::snprintf(buf, sizeof buf,
                      "; curve of growth at r = %.2f px: standard error %.4f mag, vs PSF model %.4f",
                      shared.radius, shared.curveSe, shared.modelDiff);
        if (std::isfinite(shared.curveSe)) ap.message += buf;
    }
    if (fitPsf) {
        psf = psfFit.get();
        psf.magSource = "psf";
        char buf[128];
        std::snprintf(buf, sizeof buf,
                      "; PSF fluxes scaled by %.5f +- %.5f mag to the aperture's total (%d stars)",
                      scale.factor, scale.errMag, scale.stars);
        psf.message += buf;
    } else if (src == "psf") {
        psf.magSource = "psf";
        psf.message =
            "no PSF-fit fluxes to calibrate (no PSF model, psfPhotometry off, or fewer than 5 bright "
            "stars to tie them to the aperture's total)";
    }
    keepBetterZeroPoint(r, src, ap, psf, mPsf, ePsf);
}

// The calibrators' isolation radius (arcsec): isolationArcsec when set, else isolationFwhm times the
// field's FWHM (px) at the WCS's scale (0 where either is unknown).
double calibratorIsolationArcsec(const ZeroPointParams& p, double fwhmPx, double pxScaleArcsec) {
    if (p.isolationArcsec > 0.0) return p.isolationArcsec;
    if (!(p.isolationFwhm > 0.0) || !(fwhmPx > 0.0) || !(pxScaleArcsec > 0.0) ||
        !std::isfinite(pxScaleArcsec))
        return 0.0;
    return p.isolationFwhm * fwhmPx * pxScaleArcsec;
}

// Stage inputs that come from the frame rather than from the user's parameters.
DetectionParams detectionParamsFor(const Frame& frame, DetectionParams p) {
    p.gain = frame.instrument.gain;
    if (std::isfinite(frame.instrument.saturation)) p.saturationLevel = frame.instrument.saturation;
    return p;
}

PsfParams psfParamsFor(const Frame& frame, PsfParams p) {
    if (std::isfinite(frame.instrument.saturation)) p.saturation = frame.instrument.saturation;
    return p;
}

ApertureParams apertureParamsFor(const Frame& frame, ApertureParams p) {
    if (std::isfinite(frame.instrument.saturation)) p.saturation = frame.instrument.saturation;
    return p;
}

// Object mask for the second background pass: the segmentation grown by `dilate` pixels (square).
Image<std::int32_t> dilatedObjectMask(const ImageViewT<std::int32_t>& seg, int dilate) {
    const int w = seg.width, h = seg.height;
    Image<std::int32_t> rows(w, h, 0), out(w, h, 0);
#pragma omp parallel for schedule(static)
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            int v = 0;
            for (int dx = std::max(0, x - dilate); dx <= std::min(w - 1, x + dilate) && !v; ++dx)
                v = seg(dx, y) != 0;
            rows(x, y) = v;
        }
#pragma omp parallel for schedule(static)
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            int v = 0;
            for (int dy = std::max(0, y - dilate); dy <= std::min(h - 1, y + dilate) && !v; ++dy)
                v = rows(x, dy);
            out(x, y) = v;
        }
    return out;
}

// Stage 4 into r.aperture, with the sources and segmentation map of `det` (r.detection, or the new
// detection of a provisional result). The map goes as the shared SegmentationMap: the CUDA stage reads a
// deferred map's device copy, nothing is downloaded.
// curveFrom: a result whose curve of growth is taken instead of measuring one (ApertureParams::givenCurve).
void apertureStage(const Frame& frame, const PipelineConfig& config, RunContext& ctx, PipelineResult& r,
                   const DetectionResult& det, const ApertureResult* curveFrom = nullptr) {
    const ImageView image = frame.view();
    const MaskView mask = frame.maskView();
    ApertureParams apParams = apertureParamsFor(frame, config.aperture);
    apParams.givenCurve = curveFrom;
    // The curves of growth when too few stars qualify to measure one, and the reference aperture's
    // fraction of the total: the PSF model's; without one, a Moffat of the PSF stage's starting beta at
    // the field FWHM (real stars have wings; a Gaussian, which has none, put 0.3 mag too little light
    // outside 2 px for FWHM 3 px).
    PsfResult defaultPsf;
    const PsfResult* cogPsf = r.psf.hasModel() ? &r.psf : nullptr;
    if (!cogPsf && r.fwhm > 0.0 && config.psf.model == PsfModelKind::Moffat && config.psf.moffatBeta > 1.0) {
        defaultPsf.model = PsfModelKind::Moffat;
        defaultPsf.fwhmPoly.coeffs = {r.fwhm};
        defaultPsf.medianFwhm = r.fwhm;
        defaultPsf.medianBeta = config.psf.moffatBeta;
        cogPsf = &defaultPsf;
        apParams.psfApertureFractionsSource = "default_moffat";
    }
    if (cogPsf)
        apParams.psfApertureFractions = [cogPsf](const std::vector<double>& radii) {
            return cogPsf->apertureFractions(radii);
        };
    if (r.psf.hasModel() && r.psf.fwhm.size() == det.sources.size())
        apParams.cogStarScale =
            [&psf = r.psf](const std::vector<std::size_t>& stars, const std::vector<double>& radii, double R,
                           double a1, double a2) { return cogStarScale(psf, stars, radii, R, a1, a2); };
    r.aperture = measureApertures(image, mask, r.background, det.segmentation, det.sources, r.fwhm,
                                  frame.instrument.gain, frame.instrument.readNoise, apParams, ctx);
    if (config.apertureToTotal && cogPsf && r.aperture.apCorrRefRadius > 0.0 &&
        !r.aperture.apCorrRatio.empty()) {
        const double R = r.aperture.apCorrRefRadius;
        double fraction = cogPsf->encircledEnergy(R);
        const double a1 = r.aperture.skyAnnulusInner, a2 = r.aperture.skyAnnulusOuter;
        if (a2 > a1) // wing light in the annulus raises the local sky and is subtracted over the aperture
            fraction -=
                R * R / (a2 * a2 - a1 * a1) * (cogPsf->encircledEnergy(a2) - cogPsf->encircledEnergy(a1));
        if (fraction > 0.5 && fraction <= 1.0)
            extendApertureCorrectionToTotal(r.aperture, fraction);
        else
            r.warnings.push_back("PSF model gives an implausible reference-aperture fraction: "
                                 "aperture corrections stop at the reference radius");
    }
    if (r.psf.hasModel()) applyLocalCurveOfGrowth(r.aperture, r.psf);
}

// The background estimate of a run, with the object mask of the second pass or none. Lean (a sampler
// evaluating the maps on demand instead of full maps) unless the result keeps the full maps.
// With a weight map (Frame::weightVariance) the RMS comes from the map, at full resolution.
struct BackgroundEstimator {
    const ImageView& image;
    const MaskView& mask;
    const BackgroundParams& params;
    RunContext& ctx;
    bool lean;
    const Frame& frame;
    BackgroundResult operator()(const ImageViewT<std::int32_t>* objects) const {
        BackgroundResult b = estimateBackground(image, mask, params, ctx, objects);
        if (frame.weightVariance)
            applyWeightVariance(b, *frame.weightVariance, frame.weightRescale, mask, ctx);
        else if (lean)
            b.sampler = std::make_shared<const BackgroundSampler>(b, ctx);
        return b;
    }
};

// Stage 1: the background; a run from here starts with no warnings.
void backgroundStage(RunContext& ctx, PipelineResult& r, const BackgroundEstimator& estimate) {
    r.warnings.clear();
    ctx.checkCancelled();
    auto t = ctx.time("background");
    r.detectionImages.reset();         // made with the old background
    r.background = BackgroundResult{}; // the old maps go before the new ones are made
    r.background = estimate(nullptr);
    r.completed = Stage::Detection;
}

// Stage 2: detection; with backgroundSecondPass the background is estimated again with the detected
// objects (grown by secondPassDilate) masked, and the detection redone on it.
void detectionStage(const Frame& frame, const PipelineConfig& config, RunContext& ctx, PipelineResult& r,
                    const BackgroundEstimator& estimate) {
    const ImageView image = frame.view();
    const MaskView mask = frame.maskView();
    ctx.checkCancelled();
    const DetectionParams dp = detectionParamsFor(frame, config.detection);
    {
        auto t = ctx.time("detection");
        r.detection = DetectionResult{};
        if (r.keepDetectionImages && ctx.backend == Backend::Cpu && !config.backgroundSecondPass) {
            r.detection = cpu::detectSourcesKeeping(image, mask, r.background, dp, ctx, r.detectionImages);
        } else {
            r.detectionImages.reset();
            r.detection = detectSources(image, mask, r.background, dp, ctx);
        }
    }
    if (config.backgroundSecondPass) {
        ctx.checkCancelled();
        {
            auto t = ctx.time("background (second pass)");
            const Image<std::int32_t> objects =
                dilatedObjectMask(r.detection.segmentation.view(), config.secondPassDilate);
            const ImageViewT<std::int32_t> objectView = objects.view();
            r.background = BackgroundResult{};
            r.background = estimate(&objectView);
        }
        auto t = ctx.time("detection (second pass)");
        r.detection = DetectionResult{};
        r.detection = detectSources(image, mask, r.background, dp, ctx);
    }
    if (r.detection.sources.size() == 0)
        r.warnings.push_back("no sources detected above the threshold: the catalog is empty");
    r.completed = Stage::Psf;
}

// Stage 3: the PSF model, and the field FWHM the apertures scale with (the model's, else the default).
void psfStage(const Frame& frame, const PipelineConfig& config, RunContext& ctx, PipelineResult& r) {
    const ImageView image = frame.view();
    const MaskView mask = frame.maskView();
    ctx.checkCancelled();
    auto t = ctx.time("psf");
    if (r.psfFitCache && ctx.backend == Backend::Cpu) // reuses identical star fits (same result)
        r.psf = cpu::buildPsfModel(image, mask, r.background, r.detection.sources, frame.instrument.gain,
                                   psfParamsFor(frame, config.psf), ctx, r.psfFitCache.get());
    else
        r.psf = buildPsfModel(image, mask, r.background, r.detection.sources, frame.instrument.gain,
                              psfParamsFor(frame, config.psf), ctx);
    if (r.psf.hasModel() && r.psf.medianFwhm > 0) {
        r.fwhm = r.psf.medianFwhm;
        r.fwhmSource = "psf";
    } else {
        r.fwhm = config.defaultFwhm;
        r.fwhmSource = "default";
        if (r.detection.sources.size() > 0)
            r.warnings.push_back(
                "no PSF model (too few suitable stars): apertures scaled with the default FWHM");
    }
    r.completed = Stage::Aperture;
}

// The instrumental magnitudes and errors of the optimal fluxes (NaN when the aperture stage has none).
void setInstrumentalMagnitudes(PipelineResult& r) {
    const std::size_t n = r.detection.sources.size();
    r.magInst.assign(n, std::nan(""));
    r.magInstErr.assign(n, std::nan(""));
    for (std::size_t i = 0; i < n && r.aperture.fluxOpt.size() == n; ++i) {
        r.magInst[i] = instrumentalMag(r.aperture.fluxOpt[i]);
        r.magInstErr[i] = magError(r.aperture.fluxOpt[i], r.aperture.fluxOptErr[i]);
    }
}

// Clears the previous calibration's results.
void resetCalibration(PipelineResult& r) {
    r.crossmatch = CrossmatchResult{};
    r.zeropoint = ZeroPointResult{};
    r.astrometry = AstrometryResult{};
    r.fittedWcs.reset();
    r.calibrationRan = false;
    r.calibrationProblem.clear();
}

// The astrometric solution of the detections against the reference catalog.
AstrometryResult solveFrameAstrometry(const Frame& frame, const PipelineConfig& config, RunContext& ctx,
                                      const Sources& s, const ReferenceCatalog& reference,
                                      const RefinementStars* prepared = nullptr) {
    auto t = ctx.time("astrometry");
    std::optional<std::pair<double, double>> pointing;
    if (const auto p = framePointing(frame.header)) pointing = {{p->ra, p->dec}};
    return solveAstrometry(s.x, s.y, s.fluxIso, frame.width(), frame.height(), reference, frame.wcs.get(),
                           pointing, config.astrometry, ctx, prepared);
}

using StarsAhead = std::shared_future<std::shared_ptr<const RefinementStars>>;

// The reference stars a refinement of the header WCS reaches, cut on a thread of its own while the
// background and detection run (none without a header WCS; a failure leaves the cut to the astrometry).
StarsAhead cutStarsAhead(const Frame& frame, const PipelineConfig& config, const RunContext& ctx,
                         const ReferenceCatalog& reference) {
    if (!frame.wcs) return {};
    return std::async(std::launch::async,
                      [&frame, &config, &reference, threads = ctx.threadCount()] {
                          try {
                              return prepareRefinementStars(reference, *frame.wcs, frame.width(),
                                                            frame.height(), config.astrometry, threads);
                          } catch (const std::exception&) {
                              return std::shared_ptr<const RefinementStars>();
                          }
                      })
        .share();
}

// The frame's match to the reference catalog with the final WCS: the catalog cut once to the frame's cone
// (so that one covering far more sky costs little; the margin covers crossmatch's own cone and the zero
// point's isolation radius), the crossmatch against the cut, and the calibrators' isolation test. It needs
// the detections, the WCS and the FWHM, not the photometry.
struct ReferenceMatch {
    ReferenceCatalog refCut;
    std::vector<std::int32_t> cutRows; // per row of refCut: its row in the whole catalog
    bool cut = false;
    double isolationArcsec = 0.0;
    CrossmatchResult crossmatch; // rows of refCut when cut
    std::vector<char> crowded;   // per source (crowdedMatches)
    const ReferenceCatalog& catalog(const ReferenceCatalog& whole) const { return cut ? refCut : whole; }
};

ReferenceMatch matchReference(const Frame& frame, const PipelineConfig& config, RunContext& ctx,
                              const Sources& s, double fwhm, const ReferenceCatalog& reference,
                              const Wcs& wcs) {
    ReferenceMatch m;
    const double pxScale = wcs.pixelScaleArcsec(0.5 * (frame.width() - 1), 0.5 * (frame.height() - 1));
    m.isolationArcsec = calibratorIsolationArcsec(config.zeropoint, fwhm, pxScale);
    const double cutMargin =
        1.5 * (2.0 * config.crossmatch.marginPx + 20.0) * (std::isfinite(pxScale) ? pxScale : 0.0) +
        m.isolationArcsec + config.crossmatch.radiusArcsec;
    m.cut = std::isfinite(pxScale) && pxScale > 0.0;
    if (m.cut)
        m.refCut = cutReferenceToFrame(reference, wcs, frame.width(), frame.height(), cutMargin, &m.cutRows);
    const ReferenceCatalog& refUse = m.catalog(reference);
    auto t = ctx.time("crossmatch");
    m.crossmatch = crossmatch(s.x, s.y, frame.width(), frame.height(), refUse, wcs, config.crossmatch, ctx);
    if (m.isolationArcsec > 0.0)
        m.crowded = crowdedMatches(m.crossmatch, refUse, m.isolationArcsec,
                                   config.zeropoint.isolationDeltaMag, ctx.threadCount());
    return m;
}

// The calibration's first half needs only the detections and the FWHM: on the CUDA backend it is started
// on a host thread once the detections exist and runs while the PSF and aperture stages keep the device
// busy: the astrometric solution, then (once the PSF stage has given the FWHM: setFwhm) the match to the
// reference catalog with the final WCS, on the CPU engines (whose results are the CUDA engines', byte for
// byte). Its stage records join the run's when it is taken. Destroying an unfinished one abandons the FWHM
// and waits for it (the sources it reads outlive it).
class EarlyCalibration {
public:
    struct Taken {
        AstrometryResult astrometry;
        std::optional<ReferenceMatch> match; // when the FWHM came and a WCS was there
    };
    EarlyCalibration() = default;
    EarlyCalibration(const EarlyCalibration&) = delete;
    EarlyCalibration& operator=(const EarlyCalibration&) = delete;
    ~EarlyCalibration() {
        if (!m_result.valid()) return;
        if (!m_fwhmSet) m_fwhm = std::promise<double>(); // abandons the FWHM: the task stops waiting
        m_result.wait();
    }

    void start(const Frame& frame, const PipelineConfig& config, const RunContext& ctx, const Sources& s,
               const ReferenceCatalog& reference, StarsAhead stars) {
        m_ctx = fitContext(ctx, 0);
        const bool match = ctx.tuning.calibrationBeside || ctx.backend != Backend::Cuda;
        m_match = match;
        m_result =
            std::async(std::launch::async, [this, &frame, &config, &s, &reference, match,
                                            stars = std::move(stars), fwhm = m_fwhm.get_future()]() mutable {
                Taken t;
                const std::shared_ptr<const RefinementStars> cut = stars.valid() ? stars.get() : nullptr;
                t.astrometry = solveFrameAstrometry(frame, config, m_ctx, s, reference, cut.get());
                if (!match) return t;
                std::shared_ptr<const Wcs> wcs = frame.wcs;
                if (t.astrometry.ok) wcs = std::make_shared<const Wcs>(Wcs::fromTanSip(t.astrometry.wcs));
                double px = 0.0;
                try {
                    px = fwhm.get();
                } catch (const std::future_error&) {
                    return t; // abandoned: the run ends without a calibration
                }
                if (!wcs) return t;
                RunContext cpu = fitContext(m_ctx, 0);
                cpu.backend = Backend::Cpu;
                t.match = matchReference(frame, config, cpu, s, px, reference, *wcs);
                m_ctx.records.insert(m_ctx.records.end(), cpu.records.begin(), cpu.records.end());
                return t;
            });
    }
    bool started() const { return m_result.valid(); }
    // Started, and the reference match comes with it: what is left of the calibration is a host fit.
    bool hostOnly() const { return started() && m_match; }
    void setFwhm(double fwhm) {
        if (!m_result.valid() || m_fwhmSet) return;
        m_fwhm.set_value(fwhm);
        m_fwhmSet = true;
    }
    Taken take(RunContext& ctx) {
        Taken t = m_result.get();
        ctx.records.insert(ctx.records.end(), m_ctx.records.begin(), m_ctx.records.end());
        return t;
    }

private:
    RunContext m_ctx;
    std::promise<double> m_fwhm;
    bool m_fwhmSet = false;
    bool m_match = false;
    std::future<Taken> m_result;
};

// The astrometric solution `solved` into r; on success its WCS replaces `wcs`, else a warning says the
// header WCS (if any) is used as it is.
void refineAstrometry(const Frame& frame, PipelineResult& r, std::shared_ptr<const Wcs>& wcs,
                      AstrometryResult solved) {
    r.astrometry = std::move(solved);
    if (r.astrometry.ok) {
        r.fittedWcs = std::make_shared<const Wcs>(Wcs::fromTanSip(r.astrometry.wcs));
        wcs = r.fittedWcs;
    } else {
        r.warnings.push_back("astrometry failed: " + r.astrometry.message +
                             (frame.wcs ? " (the header WCS is used as it is)" : ""));
    }
}

// The zero point from the frame's match to the reference catalog; a failed zero point sets
// r.calibrationProblem. The match's rows are mapped back to `reference` in r.crossmatch.
void zeroPointOfMatch(const Frame& frame, const PipelineConfig& config, RunContext& ctx, PipelineResult& r,
                      const ReferenceCatalog& reference, ReferenceMatch m) {
    const Sources& s = r.detection.sources;
    const std::size_t n = s.size();
    r.calibrationRan = true;
    r.crossmatch = std::move(m.crossmatch);
    auto t = ctx.time("zeropoint");
    std::vector<std::uint32_t> flags(n);
    for (std::size_t i = 0; i < n; ++i)
        flags[i] = s.flags[i] | (r.aperture.flags.size() == n ? r.aperture.flags[i] : 0u);
    fitCalibration(r, flags, m.catalog(reference), config, m.isolationArcsec, m.crowded, ctx);
    if (r.zeropoint.ok) fitZeroPointMap(r.zeropoint, s.x, s.y, frame.width(), frame.height());
    if (m.cut) {
        for (std::int32_t& row : r.crossmatch.refIndex)
            if (row >= 0) row = m.cutRows[static_cast<std::size_t>(row)];
        for (std::int32_t& row : r.crossmatch.refSelected)
            row = m.cutRows[static_cast<std::size_t>(row)];
    }
    if (!r.zeropoint.ok) r.calibrationProblem = "zero point: " + r.zeropoint.message;
}

// Crossmatch and zero point with the final WCS.
void crossmatchAndZeroPoint(const Frame& frame, const PipelineConfig& config, RunContext& ctx,
                            PipelineResult& r, const ReferenceCatalog& reference, const Wcs& wcs) {
    zeroPointOfMatch(frame, config, ctx, r, reference,
                     matchReference(frame, config, ctx, r.detection.sources, r.fwhm, reference, wcs));
}

// Stage 5: instrumental magnitudes, then with a reference catalog the astrometry (optional), crossmatch
// and zero point; a calibration that cannot run or fails is a warning, not an error.
void calibrationStage(const Frame& frame, const PipelineConfig& config, RunContext& ctx, PipelineResult& r,
                      const ReferenceCatalog* reference, EarlyCalibration& early) {
    ctx.checkCancelled();
    const std::size_t n = r.detection.sources.size();
    setInstrumentalMagnitudes(r);
    resetCalibration(r);
    std::shared_ptr<const Wcs> wcs = frame.wcs;
    std::optional<ReferenceMatch> match;
    if (reference && config.fitAstrometry && n > 0) {
        if (early.started()) {
            EarlyCalibration::Taken t = early.take(ctx);
            match = std::move(t.match);
            refineAstrometry(frame, r, wcs, std::move(t.astrometry));
        } else {
            refineAstrometry(frame, r, wcs,
                             solveFrameAstrometry(frame, config, ctx, r.detection.sources, *reference));
        }
    }
    if (reference) {
        if (!wcs) {
            r.calibrationProblem =
                "the frame has no usable WCS (" +
                (frame.wcsProblem.empty() ? std::string("none in the header") : frame.wcsProblem) +
                "): no crossmatch, no zero point";
        } else if (match) {
            zeroPointOfMatch(frame, config, ctx, r, *reference, std::move(*match));
        } else {
            crossmatchAndZeroPoint(frame, config, ctx, r, *reference, *wcs);
        }
        if (!r.calibrationProblem.empty())
            r.warnings.push_back("calibration failed: " + r.calibrationProblem);
    }
    r.completed = Stage::Done;
}

} // namespace

void runPipeline(const Frame& frame, const PipelineConfig& config, RunContext& ctx, PipelineResult& r,
                 Stage first, const ReferenceCatalog* reference) {
    runPipelineUntil(frame, config, ctx, r, first, Stage::Done, reference);
}

namespace {
// runPipelineUntil's stages before the calibration, the calibration started beside them in `early` when the
// run goes on to it.
void stagesBeforeCalibration(const Frame& frame, const PipelineConfig& config, RunContext& ctx,
                             PipelineResult& r, Stage first, Stage stop, const ReferenceCatalog* reference,
                             EarlyCalibration& early) {
    const ImageView image = frame.view();
    const MaskView mask = frame.maskView();
    // Lean maps (both backends): the background stage keeps the mesh grid only and the host stages
    // evaluate the maps on demand, bit for bit the full maps' pixels; the CUDA backend keeps the full maps
    // on the device for its detection and aperture kernels (kernels/device_maps.hpp) instead of
    // downloading them. The full maps are built where a stage or an output needs them.
    const bool lean = !r.keepFullMaps;
    BackgroundParams bkgParams = config.background;
    if (lean) bkgParams.fullMaps = false;
    const BackgroundEstimator estimate{image, mask, bkgParams, ctx, lean, frame};
    // The calibration beside the device stages (EarlyCalibration), its reference stars cut beside the
    // background and detection.
    const bool beside = (ctx.backend == Backend::Cuda || ctx.testHooks.calibrationBeside) &&
                        first <= Stage::Psf && stop == Stage::Done && reference && config.fitAstrometry;
    const StarsAhead stars = beside ? cutStarsAhead(frame, config, ctx, *reference) : StarsAhead{};

    if (first <= Stage::Background && Stage::Background < stop) backgroundStage(ctx, r, estimate);
    if (first <= Stage::Detection && Stage::Detection < stop) detectionStage(frame, config, ctx, r, estimate);
    if (beside && r.detection.sources.size() > 0)
        early.start(frame, config, ctx, r.detection.sources, *reference, stars);
    if (first <= Stage::Psf && Stage::Psf < stop) psfStage(frame, config, ctx, r);
    early.setFwhm(r.fwhm);
    if (first <= Stage::Aperture && Stage::Aperture < stop) {
        ctx.checkCancelled();
        auto t = ctx.time("aperture");
        apertureStage(frame, config, ctx, r, r.detection);
        r.completed = Stage::Calibration;
    }
}
} // namespace

void runPipelineUntil(const Frame& frame, const PipelineConfig& config, RunContext& ctx, PipelineResult& r,
                      Stage first, Stage stop, const ReferenceCatalog* reference) {
    if (static_cast<int>(first) > static_cast<int>(r.completed)) first = r.completed;
    EarlyCalibration early;
    stagesBeforeCalibration(frame, config, ctx, r, first, stop, reference, early);
    if (first <= Stage::Calibration && Stage::Calibration < stop)
        calibrationStage(frame, config, ctx, r, reference, early);
}

struct PendingCalibration::Impl {
    EarlyCalibration early;
};
PendingCalibration::PendingCalibration() = default;
PendingCalibration::~PendingCalibration() = default;
PendingCalibration::PendingCalibration(PendingCalibration&&) noexcept = default;
PendingCalibration& PendingCalibration::operator=(PendingCalibration&&) noexcept = default;
bool PendingCalibration::hostOnly() const {
    return m && m->early.hostOnly();
}

PendingCalibration runPipelineToCalibration(const Frame& frame, const PipelineConfig& config, RunContext& ctx,
                                            PipelineResult& r, const ReferenceCatalog* reference) {
    PendingCalibration pending;
    pending.m = std::make_unique<PendingCalibration::Impl>();
    stagesBeforeCalibration(frame, config, ctx, r, Stage::Background, Stage::Done, reference,
                            pending.m->early);
    return pending;
}

void finishCalibration(const Frame& frame, const PipelineConfig& config, RunContext& ctx, PipelineResult& r,
                       const ReferenceCatalog* reference, PendingCalibration pending) {
    if (!pending.m) pending.m = std::make_unique<PendingCalibration::Impl>();
    calibrationStage(frame, config, ctx, r, reference, pending.m->early);
}

PipelineResult runPipeline(const Frame& frame, const PipelineConfig& config, RunContext& ctx,
                           const ReferenceCatalog* reference) {
    PipelineResult r;
    runPipeline(frame, config, ctx, r, Stage::Background, reference);
    return r;
}

PsfResult psfModelForSources(const PsfResult& old, const Sources& sources) {
    // The model, stars and ePSF grid of `old`; its per-source columns (another source list) are not copied.
#if defined(__x86_64__) && defined(__GLIBCXX__) && !defined(_GLIBCXX_DEBUG)
    static_assert(sizeof(PsfResult) == 368, "PsfResult changed: copy its new model members here, then update "
                                            "this size");
#endif
    PsfResult p;
    p.model = old.model;
    p.width = old.width;
    p.height = old.height;
    p.stampRadius = old.stampRadius;
    p.stars = old.stars;
    p.fwhmPoly = old.fwhmPoly;
    p.e1Poly = old.e1Poly;
    p.e2Poly = old.e2Poly;
    p.medianBeta = old.medianBeta;
    p.medianFwhm = old.medianFwhm;
    p.medianEllipticity = old.medianEllipticity;
    p.nStars = old.nStars;
    p.gridNx = old.gridNx;
    p.gridNy = old.gridNy;
    p.epsf = old.epsf;
    const std::size_t n = sources.size();
    const double nan = std::nan("");
    p.fwhm.assign(n, nan);
    p.ellipticity.assign(n, nan);
    p.theta.assign(n, nan);
    p.fluxPsf.assign(n, nan);
    p.fluxPsfErr.assign(n, nan);
    p.flags.assign(n, 0u);
    for (PsfStar& s : p.stars)
        s.index = -1;
    // One source per iteration, each writing its own elements: the same numbers for any thread count.
    if (p.hasModel()) {
#pragma omp parallel for schedule(static)
        for (std::ptrdiff_t kk = 0; kk < static_cast<std::ptrdiff_t>(n); ++kk) {
            const std::size_t k = static_cast<std::size_t>(kk);
            const double x = sources.x[k], y = sources.y[k];
            if (!std::isfinite(x) || !std::isfinite(y)) continue;
            const PsfResult::ShapeAt at = p.shapeAt(x, y);
            p.fwhm[k] = at.fwhm;
            p.ellipticity[k] = at.ellipticity;
            p.theta[k] = at.theta;
        }
    }
    return p;
}

namespace {
// The calibration stage of a provisional result: previous's astrometric solution (a detection edit does
// not move the frame on the sky) instead of a new fit, then the crossmatch and zero point of the new
// sources. The solution's per-match lists name previous's sources: left empty. Without a solution in
// previous, the stage as a complete run does it.
void provisionalCalibration(const Frame& frame, const PipelineConfig& config, RunContext& ctx,
                            PipelineResult& p, const PipelineResult& previous,
                            const ReferenceCatalog* reference) {
    const bool reuse = reference && config.fitAstrometry && previous.fittedWcs && previous.astrometry.ok &&
                       p.detection.sources.size() > 0;
    if (!reuse) {
        runPipelineUntil(frame, config, ctx, p, Stage::Calibration, Stage::Done, reference);
        return;
    }
    ctx.checkCancelled();
    setInstrumentalMagnitudes(p);
    resetCalibration(p);
    p.astrometry = previous.astrometry;
    p.astrometry.sourceIndex.clear();
    p.astrometry.refIndex.clear();
    p.astrometry.dxArcsec.clear();
    p.astrometry.dyArcsec.clear();
    p.astrometry.used.clear();
    p.fittedWcs = previous.fittedWcs;
    crossmatchAndZeroPoint(frame, config, ctx, p, *reference, *p.fittedWcs);
    if (!p.calibrationProblem.empty()) p.warnings.push_back("calibration failed: " + p.calibrationProblem);
    p.completed = Stage::Done;
}

// provisionalResult; `owned` (null or &detected): its background and detection are moved, not copied.
PipelineResult provisional(const Frame& frame, const PipelineConfig& config, RunContext& ctx,
                           const PipelineResult& detected, PipelineResult* owned,
                           const PipelineResult& previous, const ReferenceCatalog* reference) {
    if (static_cast<int>(detected.completed) < static_cast<int>(Stage::Psf))
        throw InvalidInput("provisional result: the new detection has not run (completed stage: " +
                           std::string(stageName(detected.completed)) + ")");
    PipelineResult p;
    {
        auto t = ctx.time("provisional psf");
        if (owned)
            p.background = std::move(owned->background);
        else
            p.background = detected.background; // lean: the mesh grid and a shared sampler
        p.warnings = detected.warnings;
        p.keepFullMaps = detected.keepFullMaps;
        p.psf = psfModelForSources(previous.psf, detected.detection.sources);
        p.fwhm = previous.fwhm;
        p.fwhmSource = previous.fwhmSource;
    }
    {
        ctx.checkCancelled();
        auto t = ctx.time("aperture");
        apertureStage(frame, config, ctx, p, detected.detection, &previous.aperture);
    }
    {
        auto t = ctx.time("provisional copy");
        if (owned)
            p.detection = std::move(owned->detection);
        else
            p.detection = detected.detection;
    }
    p.completed = Stage::Calibration;
    provisionalCalibration(frame, config, ctx, p, previous, reference);
    return p;
}
} // namespace

PipelineResult provisionalResult(const Frame& frame, const PipelineConfig& config, RunContext& ctx,
                                 const PipelineResult& detected, const PipelineResult& previous,
                                 const ReferenceCatalog* reference) {
    return provisional(frame, config, ctx, detected, nullptr, previous, reference);
}

PipelineResult provisionalResult(const Frame& frame, const PipelineConfig& config, RunContext& ctx,
                                 PipelineResult&& detected, const PipelineResult& previous,
                                 const ReferenceCatalog* reference) {
    return provisional(frame, config, ctx, detected, &detected, previous, reference);
}

namespace {
template <class T> bool sameBits(const T& a, const T& b) {
    return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <class T>
bool firstDifference(const std::vector<T>& a, const std::vector<T>& b, const char* name, std::string& where) {
    if (!where.empty()) return true;
    if (a.size() != b.size()) {
        where = std::string(name) + ": sizes differ (" + std::to_string(a.size()) + " vs " +
                std::to_string(b.size()) + ")";
        return true;
    }
    for (std::size_t i = 0; i < a.size(); ++i)
        if (!sameBits(a[i], b[i])) {
            where = std::string(name) + "[" + std::to_string(i) + "]";
            return true;
        }
    return false;
}
} // namespace

std::string firstPhotometryDifference(const PipelineResult& ra, const PipelineResult& rb) {
    std::string w;
#define GPUPHOT_COLUMN(obj, col) firstDifference(obj##a.col, obj##b.col, #col, w)
    const Sources &sa = ra.detection.sources, &sb = rb.detection.sources;
    GPUPHOT_COLUMN(s, x);
    GPUPHOT_COLUMN(s, y);
    GPUPHOT_COLUMN(s, xErr);
    GPUPHOT_COLUMN(s, yErr);
    GPUPHOT_COLUMN(s, xIso);
    GPUPHOT_COLUMN(s, yIso);
    GPUPHOT_COLUMN(s, x2);
    GPUPHOT_COLUMN(s, y2);
    GPUPHOT_COLUMN(s, xy);
    GPUPHOT_COLUMN(s, a);
    GPUPHOT_COLUMN(s, b);
    GPUPHOT_COLUMN(s, theta);
    GPUPHOT_COLUMN(s, fluxIso);
    GPUPHOT_COLUMN(s, fluxIsoErr);
    GPUPHOT_COLUMN(s, areaIso);
    GPUPHOT_COLUMN(s, peak);
    GPUPHOT_COLUMN(s, xMin);
    GPUPHOT_COLUMN(s, xMax);
    GPUPHOT_COLUMN(s, yMin);
    GPUPHOT_COLUMN(s, yMax);
    GPUPHOT_COLUMN(s, flags);
    GPUPHOT_COLUMN(s, segmentId);
    const ApertureResult &pa = ra.aperture, &pb = rb.aperture;
    GPUPHOT_COLUMN(p, radii);
    if (pa.flux.size() != pb.flux.size() || pa.fluxErr.size() != pb.fluxErr.size() ||
        pa.apertureFlags.size() != pb.apertureFlags.size())
        return w.empty() ? "aperture: numbers of radii differ" : w;
    for (std::size_t r = 0; r < pa.flux.size(); ++r) {
        firstDifference(pa.flux[r], pb.flux[r], "flux", w);
        firstDifference(pa.fluxErr[r], pb.fluxErr[r], "fluxErr", w);
        firstDifference(pa.apertureFlags[r], pb.apertureFlags[r], "apertureFlags", w);
    }
    GPUPHOT_COLUMN(p, sky);
    GPUPHOT_COLUMN(p, skyRms);
    GPUPHOT_COLUMN(p, skyArea);
    GPUPHOT_COLUMN(p, kronRadius);
    GPUPHOT_COLUMN(p, fluxAuto);
    GPUPHOT_COLUMN(p, fluxAutoErr);
    GPUPHOT_COLUMN(p, radiusOpt);
    GPUPHOT_COLUMN(p, fluxOpt);
    GPUPHOT_COLUMN(p, fluxOptErr);
    GPUPHOT_COLUMN(p, apCorrMag);
    GPUPHOT_COLUMN(p, apCorrMagErr);
    GPUPHOT_COLUMN(p, apCorrRatio);
    GPUPHOT_COLUMN(p, apCorrStarIndex);
    GPUPHOT_COLUMN(p, cogRadius);
    GPUPHOT_COLUMN(p, cogFraction);
    GPUPHOT_COLUMN(p, flags);
#undef GPUPHOT_COLUMN
    firstDifference(ra.magInst, rb.magInst, "magInst", w);
    firstDifference(ra.magInstErr, rb.magInstErr, "magInstErr", w);
    return w;
}

Stage firstAffectedStage(const PipelineConfig& a, const PipelineConfig& b) {
    // Every serialised parameter names the first stage it changes (its table); the frame's preparation is
    // redone with the background.
    Stage first = Stage::Done;
    for (const ParamDef& d : paramTable()) {
        if (d.access == ParamAccess::Internal || encodedParam(d, a) == encodedParam(d, b)) continue;
        Stage s = Stage::Background;
        switch (d.stage) {
        case ParamStage::Prepare:
        case ParamStage::Background:
            s = Stage::Background;
            break;
        case ParamStage::Detection:
            s = Stage::Detection;
            break;
        case ParamStage::Psf:
            s = Stage::Psf;
            break;
        case ParamStage::Aperture:
            s = Stage::Aperture;
            break;
        case ParamStage::Calibration:
            s = Stage::Calibration;
            break;
        }
        first = std::min(first, s);
    }
    return first;
}

} // namespace gpuphot
