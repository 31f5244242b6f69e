#pragma once
// Stage 6: photometric zero point (and optional colour term) from crossmatched reference stars (CPU).
//
// Convention (docs/ARCHITECTURE.md): mag_cal = mag_inst + zp (+ colourTerm * colour),
// mag_inst = -2.5 log10(flux ADU).
//
// Calibrators: sources with a match, finite mag_inst / error, S/N = 1.0857 / magInstErr >= minSnr,
// none of `excludeFlags`, a reference magnitude in [magBright, magFaint], optionally no other reference
// star within isolationArcsec on the sky brighter than (own mag + isolationDeltaMag), and a finite colour
// when the colour term is fitted. Per calibrator y = ref.mag - mag_inst, σ² = magInstErr² + ref.magErr²
// (NaN reference errors count as 0), model y = zp (+ ct * colour).
//
// Methods:
//   "clipped-mean": a robust start (median, 1.4826 MAD clipping of the unweighted fit), then iterations of a
//     weighted fit (weights 1/(σ² + σ_int²)) and clipping of |r| > clipSigma sqrt(σ² + σ_int²) over ALL
//     calibrators (a star may come back), until the kept set stops changing or maxIterations.
//   "ransac": ransacIterations minimal samples (1 star; 2 stars of different colour with the colour term)
//     drawn with a SplitMix64 generator seeded by `seed`; the model with the most stars within
//     ransacThreshold (ties: smaller truncated squared-residual sum, then earlier iteration) wins; then a
//     weighted refit on its inliers, inliers re-selected with the refit model, a last refit.
// Colour term significance: when |ct| < colourTermMinSignificance * ctErr the colour term is dropped and
// the calibrators are fitted again (clipping included) for a zero point alone; the message says so.
// σ_int (intrinsic scatter): 0 when chi²/dof <= 1, else solved so that chi²/dof = 1 (Newton from 0).
// zpErr and colourTermErr: sqrt of the diagonal of (AᵀWA)⁻¹ with those weights (Eigen, LDLT on the 1x1/2x2
// normal matrix). scatter: weighted RMS of the used residuals.
//
// Limiting magnitude (S/N = 5, i.e. magInstErr = 1.0857 / 5 = 0.2171): over all sources with finite
// mag_inst and error (none of excludeFlags), log10(magInstErr) is fitted as a straight line in mag_inst
// by least squares over the stars with 3 <= S/N <= 30 (widened to 2..100 when fewer than 10 are there);
// the line is solved for S/N = 5 and calibrated with zp (+ colourTerm * median calibrator colour). For
// sky-limited faint stars log σ is linear in m with slope 0.4, so this is an interpolation near the limit.
// NaN when fewer than 5 points or a non-positive slope.
//
// Too few calibrators (< minStars): ok = false, zp = NaN and a message saying why; no exception (the
// pipeline still writes the uncalibrated catalog). Deterministic: serial sums in index order.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/model/flags.hpp"

namespace gpuphot {

class RunContext;
struct CrossmatchResult;
struct ReferenceCatalog;

struct ZeroPointParams {
    double magBright = -std::numeric_limits<double>::infinity(); // reference mag range of calibrators
    double magFaint = std::numeric_limits<double>::infinity();
    double minSnr = 20.0; // S/N of the instrumental magnitude (1.0857 / magInstErr)
    // The minSnr cut and the fit's weights use the S/N the calibrator would have at the flux its reference
    // magnitude predicts (through a first, median zero point), not at the flux measured: a cut on the
    // measured S/N takes in the faint stars whose noise came out bright, and weights 1/σ² with σ relative
    // to the measured flux favour them (+0.0006 mag on average on large sparse fields of the project's
    // simulator, docs/ACCURACY.md). The flux's own error is kept; the ratio is bounded to [1/3, 3].
    bool predictedSnr = true;
    std::uint32_t excludeFlags = FlagSaturated | FlagBlended | FlagEdge | FlagBadPixels |
                                 FlagApertureIncomplete | FlagApertureMasked | FlagCrowded |
                                 FlagDeblendOverflow | FlagSkyFailed;
    // Calibrators with another reference star this close that is brighter than own mag +
    // isolationDeltaMag are dropped: an unresolved companion adds its light to the calibrator's aperture
    // (one star per 300 px^2 of the project's simulator: +0.002 mag, pulls of 2-3, without the test).
    double isolationArcsec = 0.0;   // > 0: the radius (arcsec); 0: isolationFwhm decides
    double isolationFwhm = 2.0;     // with isolationArcsec 0: the radius in the field's FWHM, resolved by
                                    // the pipeline from the PSF model and the WCS (0: no isolation test)
    double isolationDeltaMag = 3.0; // mag: fainter neighbours are ignored
    std::string method = "clipped-mean"; // or "ransac"
    double clipSigma = 3.0;
    int maxIterations = 10;
    bool fitColourTerm = false; // needs ref.color; otherwise zp only and a note in the message
    // A fitted colour term is kept only when |ct| >= this many of its standard errors; otherwise the fit is
    // redone without it (a zero point at colour 0 extrapolated with an insignificant slope carries the
    // slope's noise times the calibrators' mean colour). 0: always keep it.
    double colourTermMinSignificance = 3.0;
    std::uint64_t seed = 1; // RANSAC
    int ransacIterations = 500;
    double ransacThreshold = 0.05; // mag: inlier residual for RANSAC
    int minStars = 5;              // fewer calibrators (after clipping): ok = false
    // --- refusing what is not a calibration ---
    // The crossmatch's matches must exceed those expected by chance (CrossmatchResult::chanceMatches) by
    // this many Poisson sigmas, as the astrometric verification asks; else ok = false (0: no test).
    double matchSigma = 10.0;
    // Bootstrap resamples of the calibrators (seeded by `seed`); zpErr is the larger of the fit's formal
    // error and the bootstrap's standard deviation of the zero point (0: the formal error alone).
    int bootstrap = 200;
    // A zero point whose zpErr exceeds this (mag) is not one: ok = false (0: no limit).
    double maxZpErr = 0.1;
    // Which instrumental magnitude is calibrated (the pipeline's choice; fitZeroPoint takes what it is
    // given): "aperture" (the optimal aperture, corrected to total), "psf" (the PSF fit's flux), or "auto":
    // both are fitted and the one with the smaller zpErr is kept (ZeroPointResult::magSource says which).
    std::string magSource = "auto";
};

void to_json(nlohmann::json& j, const ZeroPointParams& p);
void from_json(const nlohmann::json& j, ZeroPointParams& p);

struct ZeroPointResult {
    double zp = std::numeric_limits<double>::quiet_NaN(); // mag
    double zpErr = std::numeric_limits<double>::quiet_NaN();
    double colourTerm = 0.0; // 0 unless fitted
    double colourTermErr = std::numeric_limits<double>::quiet_NaN();
    bool colourTermFitted = false;
    double zpErrFormal = std::numeric_limits<double>::quiet_NaN();    // the weighted fit's own error
    double zpErrBootstrap = std::numeric_limits<double>::quiet_NaN(); // spread over resampled calibrators
    double chanceMatches = std::numeric_limits<double>::quiet_NaN();  // the matches expected by chance
    // The error every calibrator shares (the curve of growth's, or the PSF model's normalisation): it does
    // not average down, so zpErr = max(formal, bootstrap) (+) this, in quadrature.
    double zpErrShared = 0.0;
    std::string
        magSource; // "aperture" or "psf": the instrumental magnitudes calibrated (set by the pipeline)
    // The calibrators' residuals over the frame (fitZeroPointMap): a plane's slopes in mag per 1000 px
    // (positive: the zero point grows along +x / +y) with their errors, and the median residual in a
    // mapNx x mapNy grid of equal cells (row-major from the bottom-left; NaN with < 5 calibrators in a cell).
    double gradientX = std::numeric_limits<double>::quiet_NaN(), gradientY = gradientX;
    double gradientXErr = gradientX, gradientYErr = gradientX;
    int mapNx = 0, mapNy = 0;
    std::vector<double> map;
    double isolationArcsec = 0.0;          // the isolation radius applied (0: none)
    int nUsed = 0;                         // calibrators in the final fit
    int nCandidates = 0;                   // calibrators that passed the cuts
    std::vector<std::int32_t> sourceIndex; // per candidate: source index (ascending)
    std::vector<double> residual;          // per candidate: ref.mag - (mag_inst + zp + ct * colour)
    std::vector<bool> used;                // per candidate: in the final fit
    double scatter = std::numeric_limits<double>::quiet_NaN();         // weighted RMS of used residuals
    double intrinsicScatter = 0.0;                                     // σ_int (mag)
    double chi2dof = std::numeric_limits<double>::quiet_NaN();         // before σ_int
    double limitingMag = std::numeric_limits<double>::quiet_NaN();     // calibrated, S/N = 5
    double limitingMagInst = std::numeric_limits<double>::quiet_NaN(); // instrumental, S/N = 5
    bool ok = false;
    std::string message;
};

// magInst, magInstErr, flags: per source (same length as matches.refIndex). sharedMagErr: the error all
// instrumental magnitudes share (see zpErrShared; 0: none). crowded: crowdedMatches of these matches with
// params' isolation radius and delta (null or another size: computed here). Throws InvalidInput for
// inconsistent sizes, a reference index outside the catalog, or unusable parameters (unknown method,
// clipSigma <= 0, ...).
ZeroPointResult fitZeroPoint(const std::vector<double>& magInst, const std::vector<double>& magInstErr,
                             const std::vector<std::uint32_t>& flags, const CrossmatchResult& matches,
                             const ReferenceCatalog& ref, const ZeroPointParams& params, RunContext& ctx,
                             double sharedMagErr = 0.0, const std::vector<char>* crowded = nullptr);

// The calibrators' isolation test, per source: 1 where its matched reference star (matches.refIndex) has
// another reference star brighter than (its mag + deltaMag) closer than radiusArcsec on the sky; 0 for
// unmatched sources and with radiusArcsec <= 0. It needs no magnitudes, so a frame's fits (aperture and
// PSF magnitudes) share one, computed as soon as the matches exist.
std::vector<char> crowdedMatches(const CrossmatchResult& matches, const ReferenceCatalog& ref,
                                 double radiusArcsec, double deltaMag, int threads);

// The gradient and map of an ok zero point's used calibrators' residuals; x, y: per source (px, 0-based),
// indexed by zp.sourceIndex. The plane is fitted with at least 20 calibrators, the map (cells x cells)
// with at least 25 per cell on average. Leaves zp as it is otherwise.
void fitZeroPointMap(ZeroPointResult& zp, const std::vector<double>& x, const std::vector<double>& y,
                     int width, int height, int cells = 4);

// The limiting-magnitude estimator on its own (instrumental; see above). NaN when not determinable.
double limitingMagnitudeInst(const std::vector<double>& magInst, const std::vector<double>& magInstErr,
                             double snr = 5.0);

} // namespace gpuphot
