#pragma once
// Stage 4: aperture photometry on the CPU. Circular apertures of fixed radii with an exact pixel/circle
// overlap, a local sky from a circular annulus with sigma clipping, Kron (FLUX_AUTO) photometry in an
// exact elliptical aperture, a curve-of-growth aperture correction from bright isolated stars, and an
// S/N-optimal aperture per source.
//
// Units: pixels (0-based, centres at integers), ADU. Fluxes are sums of (data - sky) over the aperture.
//
// Error model (all in ADU^2), for the weighted sum F = Σ w_i (d_i - s) with exact overlaps w_i:
//   var = Σ w_i^2 σ_i^2                 pixel noise of the sky (σ_i: local annulus rms, or the rms map;
//                                        it already contains the read noise and the sky's Poisson noise)
//       + max(0, Σ w_i^2 (d_i - s)) / gain   Poisson noise of the source (gain e-/ADU; gain = 0: omitted)
//       + (Σ w_i)^2 κ σ^2 / nSky        error of the local sky estimate (κ = 1 for the clipped mean,
//                                        π/2 for the median, 4.57 for the mode 2.5 med - 1.5 mean)
// Σ w^2 rather than Σ w (SExtractor's area) because the partial-pixel weights multiply the noise; it equals
// the area for interior pixels. With the background map instead of a local sky (useLocalSky = false),
// the error of the map itself is neglected. The read noise argument is used only when no rms is known
// at all (local sky failed and no rms map): σ = readNoise / gain.
//
// Which columns are aperture corrected: flux/fluxErr (fixed radii), fluxAuto are RAW (not corrected);
// fluxOpt/fluxOptErr ARE corrected to the total (reference-radius) flux with the curve of growth.
// apertureCorrectedFlux / apertureCorrectedMag apply the per-radius correction to flux[r].
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/model/image.hpp"

namespace gpuphot {

class RunContext;
class SegmentationMap;
struct BackgroundResult;
struct Sources;

enum class SkyEstimator {
    Mean,   // sigma-clipped mean (default; unbiased for a symmetric sky distribution)
    Median, // sigma-clipped median
    Mode,   // SExtractor's 2.5 median - 1.5 mean (median when (mean - median) / sigma > 0.3)
};

// How other objects' pixels (the segmentation's) enter a source's aperture and Kron sums: SExtractor's
// MASK_TYPE, and gpuphot's own default. Unusable (masked, NaN) pixels add nothing, except with Correct.
enum class NeighbourPixels {
    Sum,     // summed (flagged crowded), left out of the Kron radius's first moment (gpuphot's default)
    None,    // MASK_TYPE NONE: summed, and counted in the first moment too
    Blank,   // MASK_TYPE BLANK: left out (they add nothing)
    Correct, // MASK_TYPE CORRECT: they, and unusable pixels, take the value of their mirror through the
             // centre where that pixel is usable, the source's own and touches the aperture; else nothing
};

struct ApertureResult;

struct ApertureParams {
    // Aperture RADII (SExtractor's PHOT_APERTURES are DIAMETERS: radius = PHOT_APERTURES / 2), in px, or in
    // multiples of the field FWHM when radiiInFwhm.
    std::vector<double> radii{2.0, 3.0, 4.0, 6.0};
    bool radiiInFwhm = false;

    // Local sky: a CIRCULAR annulus (SExtractor's BACKPHOTO_TYPE LOCAL uses a rectangular one of
    // BACKPHOTO_THICK px). Pixels whose centres lie in [inner, outer] are used, except those of any object
    // in the segmentation map, masked ones and non-finite ones.
    bool useLocalSky = true;   // false: the background map (BackgroundResult level and rms)
    double annulusInner = 4.0; // px, or FWHM multiples when annulusInFwhm
    double annulusOuter = 6.0;
    bool annulusInFwhm = true;
    SkyEstimator skyEstimator = SkyEstimator::Mean;
    double skyClipSigma = 3.0;  // sigma clipping about the median; <= 0: none
    int skyClipIterations = 10; // at most; stops when the kept set no longer changes
    int minSkyPixels = 20;      // fewer kept annulus pixels: FlagSkyFailed, fall back to the map

    // Kron / FLUX_AUTO (SExtractor PHOT_AUTOPARAMS = kronFactor, kronMinRadius). The first moment r1 is
    // computed within kronMaxRadius times the isophotal ellipse (a, b, theta); Kron radius =
    // max(kronFactor * r1, kronMinRadius) in units of a and b (SExtractor's KRON_RADIUS).
    double kronFactor = 2.5;
    double kronMinRadius = 3.5;
    double kronMaxRadius = 6.0;
    // The Kron ellipse's flux from the whole pixels whose centres lie in it (SExtractor's FLUX_AUTO), not
    // from each pixel's exact overlap. Small ellipses (faint objects) collect more that way: 3.5 % on the
    // faintest quarter of the PANOPTES frame's objects.
    bool kronPixelCentres = false;
    // Every aperture and the Kron ellipse centred on the isophotal barycentre (SExtractor's X_IMAGE,
    // Y_IMAGE) instead of the detection's windowed centroid.
    bool centreOnBarycentre = false;
    NeighbourPixels neighbourPixels = NeighbourPixels::Sum;

    // Curve-of-growth aperture correction, measured on bright, isolated, unflagged stars.
    bool apertureCorrection = true;
    double apCorrRefRadius = 4.0; // FWHM multiples: the "total" flux is the flux within this radius
    int apCorrMaxStars = 100;     // the brightest qualifying stars (by S/N in the reference aperture)
    // Fewer qualifying stars: the curve of growth of the PSF model (psfApertureFractions), else of a
    // Gaussian of the field FWHM. 3, not more: on simulated 512^2 fields (Moffat beta 3, FWHM 3 px) the
    // correction at r = 2 px measured on only 2-3 stars of S/N >= 50 was within 0.005 mag rms (0.012 max)
    // of the truth, the PSF model's (fitted to 2-13 stars, its beta off by up to 0.17) within 0.010 rms
    // (0.022 max); 3 is the fewest whose median and clipping still reject one deviant star.
    int apCorrMinStars = 3;
    double apCorrMinSnr = 50.0;   // S/N in the reference aperture
    double apCorrClip = 3.0;      // stars whose concentration deviates by > clip robust sigma are dropped
    // Curve-of-growth stars must be isolated: the light of detected neighbours (their isophotal flux spread
    // with the field's PSF) inside the star's reference aperture at most this fraction of the star's
    // reference flux (0: no test). Neighbours raise the reference flux more than the small radii's, which
    // makes the correction too large in crowded fields (docs/ACCURACY.md).
    double apCorrIsolation = 0.002;
    // The error (mag, every radius) of a curve of growth that is a model (PSF model, Gaussian, default
    // Moffat) and so has no measured spread; it enters the zero point's error.
    double apCorrModelErr = 0.002;

    // S/N-optimal aperture: per source, the radius on a grid of cogStep FWHM between optimalMinRadius
    // and the reference radius that maximises the predicted S/N (curve of growth g(r), source flux F
    // estimated from a 1-FWHM aperture, its sky rms): S/N(r) = F g / sqrt(F g / gain + π r^2 σ^2 (1 + κ π r^2
    // / nSky)). Faint sources: ≈ 0.67 FWHM for a Gaussian; brighter ones: larger. The flux measured in
    // that radius is divided by g(r) (aperture corrected to the total).
    bool optimal = true;
    double optimalMinRadius = 0.3; // FWHM multiples
    double cogStep = 0.02;         // FWHM multiples, grid step of the curve of growth

    double saturation = std::numeric_limits<double>::infinity(); // ADU; pixels >= raise FlagSaturated

    // Curve of growth of the frame's PSF model (not serialised; set by the pipeline from
    // PsfResult::apertureFractions): the fraction of a star's total flux that a circular aperture of each
    // radius (px) collects. Used when fewer than apCorrMinStars stars qualify to measure the correction;
    // empty: a Gaussian of the field FWHM is used instead (which has no wings: too small a correction
    // for Moffat-like stars, ~0.3 mag at 2 px for FWHM 3 px, beta 3).
    std::function<std::vector<double>(const std::vector<double>&)> psfApertureFractions;
    // A curve of growth measured before at the same FWHM, taken instead of measuring one (not serialised; the
    // workbench's provisional result takes the previous result's): its grid, fractions and corrections
    // (brought back from the total by its refApertureFraction); its stars' lists are not taken (they index
    // the earlier sources). Null: measured here.
    const ApertureResult* givenCurve = nullptr;
    std::string psfApertureFractionsSource = "psf_model"; // ApertureResult::apCorrSource when it is used
    // Where the PSF varies over the field (not serialised; set by the pipeline from the PSF model): the
    // factors that bring each curve-of-growth star's fractions flux(r) / flux(reference radius) to one
    // FWHM, the model's median; result[s * radii.size() + g] for stars[s] at radii[g] (px),
    // given the reference radius and the sky annulus (px; 0, 0 when the map is the sky). The curve is
    // then the median of the brought fractions, an average over all stars rather than the one star at the
    // median FWHM; unset, or a result of another size: the fractions as measured.
    std::function<std::vector<double>(const std::vector<std::size_t>& stars, const std::vector<double>& radii,
                                      double refRadius, double annulusInner, double annulusOuter)>
        cogStarScale;
};

void to_json(nlohmann::json& j, const ApertureParams& p);
void from_json(const nlohmann::json& j, ApertureParams& p);

struct ApertureResult {
    std::size_t count = 0;     // number of sources
    std::vector<double> radii; // px, resolved, in the order of ApertureParams::radii
    // [radius][source], ADU, RAW (not aperture corrected); masked pixels excluded, off-image part absent
    std::vector<std::vector<double>> flux, fluxErr;
    std::vector<std::vector<std::uint32_t>> apertureFlags; // [radius][source]: flags of that aperture

    std::vector<double> sky;           // ADU per pixel: local sky, or the map at the centre
    std::vector<double> skyRms;        // ADU per pixel
    std::vector<std::int32_t> skyArea; // annulus pixels kept after clipping (0: map used)

    std::vector<double> kronRadius;            // units of a, b (SExtractor KRON_RADIUS)
    std::vector<double> fluxAuto, fluxAutoErr; // ADU, RAW, in the ellipse (kronRadius a, kronRadius b, theta)

    std::vector<double> radiusOpt;           // px
    std::vector<double> fluxOpt, fluxOptErr; // ADU, CORRECTED to total (divided by the curve of growth);
                                             // the error excludes the (common) curve-of-growth error

    // Aperture correction per fixed radius: mag_total = mag_aper + apCorrMag[r] (apCorrMag <= 0 normally)
    std::vector<double> apCorrMag, apCorrMagErr;
    std::vector<double> apCorrRatio;            // median flux(r) / flux(reference radius) (cogStarScale'd)
    double apCorrRefRadius = 0.0;               // px
    double skyAnnulusInner = 0.0, skyAnnulusOuter = 0.0; // px, resolved (0 when the map is the sky)
    // Fraction of a star's total flux that the reference aperture measures (encircled energy minus the
    // wing light the local sky annulus removes), from the PSF model; 1 until extendToTotal() is applied.
    double refApertureFraction = 1.0;
    int apCorrStars = 0;                        // stars used (0: a model curve of growth, no error)
    // Where the curve of growth (apCorrMag, cogFraction) came from: "stars" (measured on apCorrStars
    // stars), "psf_model" (ApertureParams::psfApertureFractions), "gaussian" (Gaussian of the field
    // FWHM), "default_moffat" (no PSF model: a Moffat of the default beta at the field FWHM, set by the
    // pipeline), "" (none computed).
    std::string apCorrSource;
    std::vector<std::int32_t> apCorrStarIndex;  // indices of the stars used, ascending
    std::vector<std::vector<double>> apCorrStarRatio; // [radius][k]: flux(r) / flux(reference radius) of
                                                      // star apCorrStarIndex[k] as measured (not brought
                                                      // by cogStarScale; a measured curve only)
    std::vector<double> cogRadius, cogFraction; // curve of growth used by the optimal aperture (px, 0..1)

    std::vector<std::uint32_t> flags; // SourceFlags: OR over all apertures of the source
};

// flux[r][i] corrected to the total flux (flux / apCorrRatio[r]); NaN when not available.
// Extends the curve-of-growth correction from the reference radius to the total flux: apCorrRatio,
// apCorrMag, fluxOpt and fluxOptErr are rescaled by `refFraction` (see refApertureFraction).
void extendApertureCorrectionToTotal(ApertureResult& res, double refFraction);

double apertureCorrectedFlux(const ApertureResult& res, std::size_t r, std::size_t i);
// -2.5 log10(flux[r][i]) + apCorrMag[r]; NaN for non-positive flux.
double apertureCorrectedMag(const ApertureResult& res, std::size_t r, std::size_t i);

// image: data in ADU (not background subtracted). mask: optional (empty = none); MaskSaturated pixels
// are kept in the sums (FlagSaturated), any other mask bit excludes the pixel (FlagApertureMasked).
// bkg: the background map, required when !params.useLocalSky, otherwise the fallback for failed local
// skies (may be empty). segmentation: optional (empty = none); 0 = sky, else the segmentId of a source.
// fwhm: field FWHM (px), required when anything is in FWHM units or for the aperture correction and
// the optimal aperture. gain e-/ADU (0: no Poisson term), readNoise e-.
// Throws InvalidInput for inconsistent sizes or parameters.
ApertureResult measureApertures(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                                const ImageViewT<std::int32_t>& segmentation, const Sources& sources,
                                double fwhm, double gain, double readNoise, const ApertureParams& params,
                                RunContext& ctx);
// The same with the detection's shared segmentation map (core/model/segmentation_map.hpp): the CUDA
// backend reads a deferred map's device copy without downloading it; the CPU backend materialises it.
ApertureResult measureApertures(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                                const SegmentationMap& segmentation, const Sources& sources, double fwhm,
                                double gain, double readNoise, const ApertureParams& params, RunContext& ctx);
namespace cpu {
ApertureResult measureApertures(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                                const ImageViewT<std::int32_t>& segmentation, const Sources& sources,
                                double fwhm, double gain, double readNoise, const ApertureParams& params,
                                RunContext& ctx);
}

} // namespace gpuphot
