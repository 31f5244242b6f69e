#pragma once
#include <nlohmann/json.hpp>
// Stage 7: astrometric calibration (CPU). Refines a header WCS that is close to right, or solves the
// frame blindly against the reference catalog by asterism (quad) matching when the header WCS is
// wrong or absent, as astrometry.net does with its index files; then fits TAN + SIP (order chosen by
// the data) by weighted least squares with iterative outlier rejection.
//
// Deterministic: serial, seeded, stable sorts with index tie-breaks; independent of the thread count.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/wcs/tan_sip.hpp"

namespace gpuphot {

class RunContext;
class Wcs;
struct ReferenceCatalog;

struct AstrometryParams {
    // --- fit -------------------------------------------------------------------------------------
    int maxSipOrder = 4;          // highest SIP order tried (<= 9)
    int minSipOrder = 2;          // lowest SIP order tried; <= 1 also tries pure TAN (no SIP)
    double minMatchesPerTerm = 5; // an order is tried only with at least this many matches per term
    double matchRadiusPx = 3.0;   // px: final match radius (detection <-> projected reference star)
    double refineRadiusPx = 30.0; // px: first match radius when refining a header WCS
    double clipSigma = 3.0;       // outlier rejection threshold, in robust sigmas per axis
    int iterations = 5;           // match + fit + clip rounds of the final refinement
    // --- blind solving ---------------------------------------------------------------------------
    // -1: automatic (blind when the header WCS is missing or fails verification); 0: never; 1: always.
    int blind = -1;
    double scaleLow = 0.5;              // arcsec/px: lowest pixel scale searched (no header scale)
    double scaleHigh = 20.0;            // arcsec/px: highest pixel scale searched
    double headerScaleTolerance = 0.15; // relative: scale range around a header WCS's scale
    double searchRadiusDeg = 3.0;       // deg: field centre searched within this of the pointing
    int nBrightest = 60;                // brightest detections used to build quads
    int refPerCell = 6;                 // reference stars kept per uniformisation cell (16 cells per field)
    int maxQuadsPerStar = 8;            // reference quads with a star as their first star (A), at most
    double codeTolerance = 0.025;       // quad code distance accepted as a hit
    int maxFullVerifications = 200;     // candidate solutions refined and verified before giving up
    std::uint64_t seed = 1;             // reserved for randomised steps (none yet; the solver is exhaustive)
    // --- verification ----------------------------------------------------------------------------
    int verifyMinMatches = 12;       // matches within matchRadiusPx a solution needs at least
    double verifyMinFraction = 0.15; // ... and this fraction of min(detections, reference stars on frame)
    double verifySigma = 10.0;       // ... and this many Poisson sigmas above the chance-match count
};

// JSON through the stage's parameter table (its _params.cpp: keys, ranges and meanings).
void to_json(nlohmann::json& j, const AstrometryParams& p);
void from_json(const nlohmann::json& j, AstrometryParams& p);

struct AstrometryResult {
    bool ok = false;
    std::string message;
    std::string method;         // "refined" | "blind"
    TanSip wcs;                 // the fitted TAN+SIP (valid when ok)
    double rmsArcsec = 0.0;     // sqrt(mean(dx^2 + dy^2)) over the stars used, arcsec
    double rmsPx = 0.0;         // the same in pixels (through the fitted WCS)
    int nUsed = 0;              // matches that survived the clipping
    int nMatched = 0;           // matches within matchRadiusPx
    int sipOrder = 0;           // chosen SIP order (0: pure TAN)
    double chanceMatches = 0.0; // matches expected by chance at matchRadiusPx (verification)
    // One entry per match: detection index, reference index (into the ReferenceCatalog), residual
    // (fitted minus reference; dx = dRA cos(Dec), dy = dDec, arcsec), whether the fit used it.
    std::vector<std::int32_t> sourceIndex, refIndex;
    std::vector<double> dxArcsec, dyArcsec;
    std::vector<bool> used;
    double solveSeconds = 0.0; // wall time of the blind search (0 when refined)
};

// x, y: 0-based pixel positions of the detections; flux: any positive brightness measure (orders the
// detections and weights the fit); width, height: the frame. headerWcs: the WCS from the header (may
// be null); pointingRaDec: a pointing (deg) used when there is no usable header WCS (may be empty).
// Throws InvalidInput for inconsistent inputs (array lengths, frame size); returns ok = false with a
// message when no solution passes verification.
// prepared (optional): the stars around the frame from prepareRefinementStars for the same catalog, header
// WCS, frame size and params; used when they are the cut this refinement would make (else ignored), so
// the answer is the same with or without them.
struct RefinementStars;
AstrometryResult solveAstrometry(const std::vector<double>& x, const std::vector<double>& y,
                                 const std::vector<double>& flux, int width, int height,
                                 const ReferenceCatalog& ref, const Wcs* headerWcs,
                                 std::optional<std::pair<double, double>> pointingRaDec,
                                 const AstrometryParams& params, RunContext& ctx,
                                 const RefinementStars* prepared = nullptr);

// The reference stars a refinement of headerWcs can reach (a cone around the frame, sorted, with unit
// vectors): the part of solveAstrometry that needs no detections, to be done ahead of them (the pipeline
// does it beside the device stages). Null when the refinement would not cut a cone (params.blind == 1,
// no TAN+SIP start from the header WCS, a cone of 30 deg or more). `ref` must outlive the result.
std::shared_ptr<const RefinementStars> prepareRefinementStars(const ReferenceCatalog& ref,
                                                              const Wcs& headerWcs, int width, int height,
                                                              const AstrometryParams& params, int threads);

// A reference catalog prepared once for many blind solves of frames of one size: its stars sorted, their
// sky tree, and the reference quads of every scale level between params.scaleLow and params.scaleHigh over
// the whole catalog (no search area: any pointing, or none). Solving with it skips that work per frame; a
// search with narrower scales uses the levels that overlap them. Memory: about 100 bytes per star and per
// quad (quads: about maxQuadsPerStar per thinned star per level).
class AstrometryIndex {
public:
    struct Impl; // astrometry_internal.hpp
    explicit AstrometryIndex(std::unique_ptr<Impl> impl);
    ~AstrometryIndex();
    AstrometryIndex(const AstrometryIndex&) = delete;
    AstrometryIndex& operator=(const AstrometryIndex&) = delete;
    std::size_t stars() const;
    std::size_t quads() const;
    int width() const;
    int height() const;
    double buildSeconds() const; // wall time of buildAstrometryIndex
    const Impl& impl() const { return *m_impl; }

private:
    std::unique_ptr<Impl> m_impl;
};

// Builds the index of `ref` for frames of width x height with params (scaleLow, scaleHigh, refPerCell,
// maxQuadsPerStar); throws InvalidInput as solveAstrometry does.
std::shared_ptr<const AstrometryIndex> buildAstrometryIndex(const ReferenceCatalog& ref, int width,
                                                            int height, const AstrometryParams& params,
                                                            RunContext& ctx);

// solveAstrometry against a prepared index (frames of the index's size, else InvalidInput); refIndex of
// the result refers to the catalog the index was built from. The same answer as with the catalog itself
// whenever both find the same first verified candidate.
AstrometryResult solveAstrometry(const std::vector<double>& x, const std::vector<double>& y,
                                 const std::vector<double>& flux, int width, int height,
                                 const AstrometryIndex& index, const Wcs* headerWcs,
                                 std::optional<std::pair<double, double>> pointingRaDec,
                                 const AstrometryParams& params, RunContext& ctx);

// Any WCS as TAN+SIP over a frame: fits a TAN+SIP (reference pixel at the frame centre, SIP order up
// to maxSipOrder, the lowest that reproduces the grid to 1e-4 px) to a grid of pixel <-> world pairs.
TanSip tanSipFromWcs(const Wcs& wcs, int width, int height, int maxSipOrder = 4);

// RMS (px) of the difference between two WCSs over a grid of pixels of the frame: pixel -> world
// through `a`, world -> pixel through `b`.
double wcsDifferencePx(const TanSip& a, const TanSip& b, int width, int height, int grid = 33);

} // namespace gpuphot
