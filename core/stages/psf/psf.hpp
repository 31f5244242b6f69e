#pragma once
// Stage 3: the PSF model (CPU). Selects isolated, unsaturated, bright point sources, fits each with an
// elliptical Moffat (or Gaussian) integrated over the pixels (Levenberg–Marquardt, analytic Jacobian),
// models FWHM and ellipticity (e1, e2) across the field as low-order 2-D polynomials (iterative
// clipping), builds an empirical oversampled PSF (ePSF) per grid cell and, optionally, measures every
// source's PSF flux with the local ePSF (linear weighted least squares).
//
// Determinism: every star / source is processed independently in a parallel loop and written to its own
// slot; all reductions run afterwards on one thread in index order, so the result does not depend on the
// thread count.
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <vector>

#include "core/model/flags.hpp"
#include "core/model/image.hpp"
#include "core/stages/psf/psf_moffat.hpp"

namespace gpuphot {

class RunContext;
struct BackgroundResult;
struct Sources;

NLOHMANN_JSON_SERIALIZE_ENUM(PsfModelKind,
                             {{PsfModelKind::Moffat, "moffat"}, {PsfModelKind::Gaussian, "gaussian"}})

struct PsfParams {
    PsfModelKind model = PsfModelKind::Moffat; // analytic profile (PSFEx: none; DAOPHOT: ANALYTIC)
    double moffatBeta = 3.0;                   // initial Moffat beta; free in the fit unless fitBeta = false
    bool fitBeta = true;                       // beta is a free parameter, bounded to [betaMin, betaMax]
    double betaMin = 1.2, betaMax = 15.0;
    int pixelIntegration = 3; // Gauss–Legendre nodes per axis integrating the profile over a pixel (1..5;
                              // 1: value at the pixel centre, the fitted FWHM then includes the pixel)
    int stampRadius = 0;      // px, half-size of the fit stamp and of the ePSF; 0: auto, ceil(4 * FWHM guess)
                              // clamped to [5, 30], the guess from the median isophotal a, b of candidates

    // Selection of the PSF stars (PSFEx SAMPLE_*)
    double minSnr = 50.0;         // fluxIso / fluxIsoErr (PSFEx SAMPLE_MINSN)
    double saturation = 0.0;      // ADU, saturation level of the frame (Instrument); <= 0: unknown
    double maxPeakFraction = 0.8; // reject stars whose peak + background >= this * saturation
    // px, no other source centre within this distance; 0: auto, 1.5 * stampRadius
    double isolationRadius = 0.0;
    // sources with any of these flags are never PSF stars (PSFEx SAMPLE_FLAGMASK)
    std::uint32_t excludeFlags =
        FlagCrowded | FlagBlended | FlagSaturated | FlagEdge | FlagBadPixels | FlagDeblendOverflow;
    int maxStars = 2000; // brightest first (fluxIso desc., ties by y, x, index)
    // At most this many candidates per ePSF grid cell (gridNx x gridNy) are fitted, brightest first;
    // 0: no cap. The default (30 a cell, 270 with the 3 x 3 grid) is many times what the spatial
    // polynomial (minStarsPerTerm * terms: 18 at order 2, 30 at order 3) and the ePSF (epsfMinStars)
    // need, and bounds the cost of the profile fits on large, dense frames.
    int maxStarsPerCell = 30;
    double maxMaskedFraction = 0.1; // reject a star whose stamp has more masked pixels than this fraction

    // Fit and clipping
    int maxIterations = 40; // Levenberg–Marquardt iterations per star (well-measured stars need 8-15;
                            // a fit still crawling after 40 is a faint or resolved source, rejected)
    double clipSigma = 3.0; // clip outliers of FWHM (and jointly of e1, e2) at this many robust sigmas
    int clipIterations = 5;

    // Spatial model (PSFEx PSFVAR_DEGREES)
    int polyOrder = 2;       // 0..3, total degree of the polynomials in normalised x, y
    int minStarsPerTerm = 3; // the order is lowered until nStars >= minStarsPerTerm * nTerms

    // ePSF (PSFEx PSF_SAMPLING = 1 / oversampling)
    int epsfOversampling = 4;   // ePSF nodes per native pixel
    int gridNx = 3, gridNy = 3; // ePSF cells across the frame
    int epsfMinStars = 5;       // a cell with fewer stars borrows the nearest stars of the field

    // PSF photometry
    bool psfPhotometry = true;
    double psfFitRadius = 0.0;       // px, radius of the fitted disc; 0: auto, max(2, 1.5 * local FWHM)
    bool psfFitBackground = false;   // also fit a constant background offset
    double maxMaskedPsfWeight = 0.2; // fail when masked pixels carry more than this fraction of the PSF
};
// JSON through the stage's parameter table (its _params.cpp: keys, ranges and meanings).
void to_json(nlohmann::json& j, const PsfParams& p);
void from_json(const nlohmann::json& j, PsfParams& p);

// Throws InvalidInput naming the bad parameter.
void validate(const PsfParams& p);

struct PsfStar {
    int index = -1;     // into Sources
    ProfileParams fit;  // x0, y0 (px, 0-based), amplitude (ADU), background offset (ADU), shape, beta
    ProfileShape shape; // fwhmA, fwhmB, fwhm, ellipticity, theta, e1, e2
    double flux = 0.0;  // ADU, total flux of the fitted profile
    double chi2 = 0.0;  // reduced chi2 of the fit
    int iterations = 0;
    bool converged = false;
    bool used = false; // survived the clipping: part of the spatial model and of the ePSF
};

// Polynomial of total degree `order` in normalised coordinates u = 2x/(W-1) - 1, v = 2y/(H-1) - 1;
// terms ordered u^i v^j by total degree, then by decreasing i (1, u, v, u^2, uv, v^2, ...).
struct SpatialPoly {
    int order = 0;
    std::vector<double> coeffs;
    double rms = 0.0; // of the residuals of the used stars
    double eval(double u, double v) const;
    // The same sum over monomials computed beforehand (the terms of `order` at (u, v), as eval makes them).
    double evalMonomials(const double* t) const;
};

struct EpsfCell {
    Image<float> image; // oversampled ePSF: node (i, j) is the pixel-integrated PSF at offset
                        // ((i - centreX) / oversampling, (j - centreY) / oversampling) native px
    double centreX = 0.0, centreY = 0.0; // node of zero offset
    int oversampling = 4;
    double x0 = 0, x1 = 0, y0 = 0, y1 = 0; // px, the cell's region of the frame
    double cx = 0, cy = 0;                 // px, cell centre
    int nStars = 0;                        // stars stacked
    double fwhm = 0.0; // px, effective FWHM (pixel included) measured on the ePSF by a profile fit
    // Value at an offset in native px (bicubic, Keys a = -0.5, on the oversampled nodes; 0 outside).
    double valueAt(double dx, double dy) const;
};

// The fraction of a circular Moffat (beta > 1) or, otherwise, Gaussian star of this FWHM within radius r
// (analytic, no pixels).
double encircledEnergy(PsfModelKind kind, double fwhm, double beta, double r);

struct PsfResult {
    PsfModelKind model = PsfModelKind::Moffat;
    int width = 0, height = 0;  // frame size, for the normalised coordinates
    int stampRadius = 0;        // px, as used
    std::vector<PsfStar> stars; // fitted candidates, in selection order (brightest first)

    // Spatial model (empty coeffs: no model)
    SpatialPoly fwhmPoly, e1Poly, e2Poly;
    // Fraction of a star's flux within radius r (px) for the field's median model (circular, FWHM
    // medianFwhm, beta medianBeta for Moffat); NaN without a model.
    double encircledEnergy(double r) const;
    // Fraction of a star's total flux that a circular aperture of radius r (px) collects from the PIXELS
    // of the field's median model (circular, medianFwhm, medianBeta): the profile integrated over each
    // pixel times the pixel's exact overlap with the disc, averaged over sub-pixel centre offsets. This is
    // what aperture photometry of a model star measures; it is below encircledEnergy(r) at small r (the
    // pixels blur the core). One value per radius; NaN without a model. Used as the aperture-correction
    // curve of growth when too few stars qualify to measure one.
    std::vector<double> apertureFractions(const std::vector<double>& radii) const;
    double medianBeta = 0.0;                        // over the used stars (Moffat)
    double fwhmAt(double x, double y) const;        // px
    double ellipticityAt(double x, double y) const; // 1 - b/a
    double thetaAt(double x, double y) const;       // deg, counter-clockwise from +x, (-90, 90]
    // The three above at once, bitwise the same values (the monomials computed once).
    struct ShapeAt {
        double fwhm, ellipticity, theta;
    };
    ShapeAt shapeAt(double x, double y) const;
    bool hasModel() const { return !fwhmPoly.coeffs.empty(); }

    // Per source (index as Sources)
    std::vector<double> fwhm, ellipticity, theta; // model evaluated at the source position
    std::vector<double> fluxPsf, fluxPsfErr;      // ADU; NaN where the PSF fit failed / was not run
    std::vector<std::uint32_t> flags;             // FlagPsfStar, FlagPsfFitFailed

    // Field summary (used stars)
    double medianFwhm = 0.0, medianEllipticity = 0.0;
    int nStars = 0;

    // ePSF grid, row-major (gridNy rows of gridNx cells)
    int gridNx = 0, gridNy = 0;
    std::vector<EpsfCell> epsf;
    // ePSF at a frame position: bilinear blend of the cells around (x, y) (by cell centres), at an
    // offset (dx, dy) in native px from the star's centre.
    double epsfValue(double x, double y, double dx, double dy) const;
};

// Per-star profile fits kept between runs (the workbench re-runs the PSF stage on every edit). A fit is
// reused only when every input of it is bitwise the same as when it was made: the stamp's samples (pixel
// minus background, weight: from the image, mask, background maps and gain), the start parameters (from
// the source's x, y, peak, a, b and the frame-wide FWHM guess), the model and the fit options. A run with
// a cache therefore gives bitwise the result of a run without one; only new or changed stars are fitted.
// Set RunContext::psfFitCache to use one. Entries are looked up by the stamp's integer centre; the least
// recently used go when the stored samples exceed maxBytes. Not thread-safe across runs: one run at a
// time (inside a run, the parallel fit loop only reads it; new fits are added after each block, serially).
class PsfFitCache {
public:
    struct Entry {
        int ix = 0, iy = 0; // stamp centre, px
        PsfModelKind kind = PsfModelKind::Moffat;
        ProfileParams start;
        LmOptions options;
        std::vector<FitSample> samples;
        ProfileFitResult result;
        std::uint64_t lastUsed = 0; // run counter
    };

    explicit PsfFitCache(std::size_t maxBytes = std::size_t(64) << 20) : m_maxBytes(maxBytes) {}
    void clear();
    std::size_t size() const { return m_entries.size(); }
    std::size_t bytes() const { return m_bytes; }
    // Of the last run that used the cache: fits reused, fits made.
    int lastHits() const { return m_hits; }
    int lastMisses() const { return m_misses; }

    // Used by the PSF stage.
    void beginRun();
    // The entry whose inputs all equal these, bit for bit; nullptr when none. Safe to call concurrently
    // with other find() calls (no insert() meanwhile).
    const Entry* find(int ix, int iy, PsfModelKind kind, const ProfileParams& start, const LmOptions& options,
                      const std::vector<FitSample>& samples) const;
    void touch(const Entry* entry); // a hit: counts it and marks it used in this run (serial)
    void insert(Entry entry);       // a new fit (serial); evicts above maxBytes

private:
    static std::uint64_t key(int ix, int iy);
    void evict();
    std::unordered_multimap<std::uint64_t, Entry> m_entries;
    std::size_t m_maxBytes = 0, m_bytes = 0;
    std::uint64_t m_run = 0;
    int m_hits = 0, m_misses = 0;
};

// One profile fit of a batch: fitProfile(*samples, kind, start, options).
struct ProfileFitJob {
    const std::vector<FitSample>* samples = nullptr;
    ProfileParams start;
};
// Runs a batch of profile fits, results[i] bitwise fitProfile(*jobs[i].samples, kind, jobs[i].start,
// options) (results has jobs.size() slots). The CUDA backend's runs them on the device (kernels/psf/psf.cu).
using ProfileFitBatch = std::function<void(const std::vector<ProfileFitJob>& jobs, PsfModelKind kind,
                                           const LmOptions& options, std::vector<ProfileFitResult>& results)>;

// One ePSF grid cell of a batch: buildEpsfCell(*cell, frame, *stars, base, kind, radius, oversampling,
// nQuad) (core/stages/psf/psf_epsf.hpp) fills the cell's image, fwhm, centreX / centreY, oversampling and
// nStars (its region x0 .. cy is already set).
struct EpsfCellJob {
    EpsfCell* cell = nullptr;
    const std::vector<const PsfStar*>* stars = nullptr; // the cell's stars, in stacking order
    ProfileParams base;                                 // the analytic base: centre 0, unit flux
};
// Builds a batch of ePSF cells (all cells of the grid at once) on the frame the batch was made for; each
// cell it builds is bitwise buildEpsfCell's, and it sets done[k] = 1 for it (done has jobs.size() slots,
// 0 on entry); the caller builds the cells left at 0 on the host. The CUDA backend's runs them on the
// device (kernels/psf/psf_epsf.cu).
using EpsfCellBatch = std::function<void(const std::vector<EpsfCellJob>& jobs, PsfModelKind kind, int radius,
                                         int oversampling, int nQuad, std::vector<char>& done)>;

// image: the frame; mask: optional (empty = none), pixels with any bit set are excluded;
// bkg: level and rms maps at full resolution (or empty maps: globalLevel / globalRms are used);
// gain: e-/ADU for the Poisson term of the pixel variance (<= 0: none).
PsfResult buildPsfModel(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                        const Sources& sources, double gain, const PsfParams& params, RunContext& ctx);
namespace cpu {
PsfResult buildPsfModel(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                        const Sources& sources, double gain, const PsfParams& params, RunContext& ctx);
// The same, reusing identical per-star fits from `cache` and adding the new ones to it (null: none),
// running the profile fits that remain through `fitBatch` and the ePSF cells through `epsfBatch` (null:
// the host loops). The result is bitwise the one without any of them.
PsfResult buildPsfModel(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                        const Sources& sources, double gain, const PsfParams& params, RunContext& ctx,
                        PsfFitCache* cache, const ProfileFitBatch* fitBatch = nullptr,
                        const EpsfCellBatch* epsfBatch = nullptr);
} // namespace cpu

} // namespace gpuphot
