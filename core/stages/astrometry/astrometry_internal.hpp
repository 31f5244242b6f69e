#pragma once
// Internals of stage 7 (astrometry): shared between astrometry.cpp (driver), astrometry_fit.cpp
// (matching, TAN+SIP least squares, refinement) and astrometry_blind.cpp (quad matching).
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/stages/astrometry/astrometry.hpp"

namespace gpuphot::astrom {

// Detections in the order the solver uses them (brightest first, ties by index).
struct Detections {
    std::vector<double> x, y, flux;  // 0-based px
    std::vector<std::int32_t> index; // into the caller's arrays
    int width = 0, height = 0;
    std::size_t size() const { return x.size(); }
};

// Reference stars of the search area, brightest first (ties by index).
struct RefStars {
    std::vector<double> ra, dec, mag;
    std::vector<std::array<double, 3>> xyz; // unit vectors
    std::vector<std::int32_t> index;        // into the ReferenceCatalog
    std::size_t size() const { return ra.size(); }
};

std::array<double, 3> unitVector(double raDeg, double decDeg);
// Chord length between unit vectors at an angular separation (deg), and back.
double chordFromDeg(double deg);
double degFromChord(double chord);

// A 3-D k-d tree over unit vectors (nanoflann), for cone searches and nearest neighbours on the sky.
class SkyTree {
public:
    explicit SkyTree(const std::vector<std::array<double, 3>>& points);
    ~SkyTree();
    SkyTree(const SkyTree&) = delete;
    SkyTree& operator=(const SkyTree&) = delete;
    // Indices within radiusDeg of p, sorted by distance then index.
    std::vector<std::uint32_t> cone(const std::array<double, 3>& p, double radiusDeg) const;
    // The same indices in ascending order.
    std::vector<std::uint32_t> coneByIndex(const std::array<double, 3>& p, double radiusDeg) const;
    // The same into `out`, with `hits` as scratch (buffers reused across calls).
    void coneByIndex(const std::array<double, 3>& p, double radiusDeg, std::vector<std::uint32_t>& out,
                     std::vector<std::pair<std::uint32_t, double>>& hits) const;
    // Nearest point: index and chord distance; index -1 when empty.
    std::pair<std::int64_t, double> nearest(const std::array<double, 3>& p) const;

private:
    struct Impl;
    std::unique_ptr<Impl> m_impl;
};

struct Match {
    std::int32_t det = -1; // into Detections
    std::int32_t ref = -1; // into RefStars
    double dist = 0.0;     // px
};

// Sorts (key, row) pairs given in ascending row order into (key, row) order: exactly what std::sort of the
// pairs gives (keys finite; -0 and +0 compare equal and come back as +0), by a stable LSD radix sort on the
// key's bits (6 passes of 11 bits; passes where every key has the same digit are skipped), several times
// faster than a comparison sort on a million rows.
void sortByKey(std::vector<std::pair<double, std::int32_t>>& v);

// Bounding box {x0, y0, x1, y1} of the first n points; false when it is not finite (no points, NaN, inf).
bool boundingBox(const std::vector<double>& x, const std::vector<double>& y, std::size_t n,
                 std::array<double, 4>& box);

// One-to-one nearest-neighbour matching in pixel space: every detection (first nDet of them) takes its
// nearest projected reference star (first nRef of refsOnFrame) within radius; a reference star claimed
// by several detections keeps the closest (ties: lower detection index).
std::vector<Match> matchInPixels(const Detections& det, std::size_t nDet, const std::vector<double>& refX,
                                 const std::vector<double>& refY, const std::vector<std::int32_t>& refIds,
                                 std::size_t nRef, double radius, int threads = 1);

// Rows per block of the fit's sums (see fitTanSip).
constexpr std::size_t kFitBlock = 2048;

// Weighted least-squares TAN+SIP fit of pixel (x, y; 0-based) -> sky (ra, dec) with the reference pixel
// fixed at crpix (1-based); the tangent point starts at crval0 and is moved until the polynomial has no
// constant term. order 1: pure TAN (affine CD). Returns false when the normal equations are singular.
// The normal equations are accumulated per fixed block of kFitBlock rows (blocks on `threads` threads) and
// the block sums added in block order: the result is bit for bit the same for any thread count.
bool fitTanSip(const std::vector<double>& x, const std::vector<double>& y, const std::vector<double>& ra,
               const std::vector<double>& dec, const std::vector<double>& w, const double crpix[2],
               const double crval0[2], int order, TanSip& out, double* chi2 = nullptr, int threads = 1);

constexpr std::size_t kRefineDetCap = 16000; // detections matched in the intermediate rounds
constexpr std::size_t kRefineFitCap = 4000;  // matches fitted in the intermediate rounds
constexpr std::size_t kFinalFitCap = 20000;  // matches fitted in the final round

struct RefineOutcome {
    bool ok = false;
    TanSip wcs;
    std::vector<Match> matches; // final matches at matchRadiusPx
    std::vector<bool> used;
    int nUsed = 0;
    int sipOrder = 0;
    double chance = 0.0; // expected chance matches at matchRadiusPx
    std::size_t refsOnFrame = 0;
    int rounds = 0; // TAN+SIP rounds run (intermediate rounds skipped at a fixed point are not counted)
    std::string why;
};

// A spatially stratified, deterministic subset of at most `cap` items: the frame is cut into a grid of
// cells; within a cell items keep their order (callers pass them brightest first), and items are taken by
// their rank within their cell (all first-of-cell items, then all second-of-cell, ...; ties by position in
// the input). Returns positions into x/y in ascending order; all of them when x.size() <= cap.
std::vector<std::size_t> stratifiedSubset(const std::vector<double>& x, const std::vector<double>& y,
                                          int width, int height, std::size_t cap);

// Iterative refinement from a starting WCS: offset vote, affine fits with the bright stars at shrinking
// radii, then the full TAN+SIP fit with order selection, re-matching and clipping; finally verification.
// The intermediate TAN+SIP rounds match a stratified subset of the detections (kRefineDetCap, brightest per
// cell) and fit a stratified subset of those matches (kRefineFitCap); the final round matches every
// detection and fits a stratified subset of at most kFinalFitCap matches; every final match is then
// judged ("used") by the final fit's clipping rule. Only reference stars that can lie within the match
// radius of a detection are projected exactly (a cheap closed-form pre-selection in undistorted pixel
// coordinates with a bound on the SIP Jacobian). The reference stars around the frame are cut from `refs`
// once per call (through `tree` when given, else by a linear scan); projections, matching and the fits'
// sums run on `threads` threads; the result is the same for any thread count. skipAtFixedPoint: skip the
// intermediate rounds left once one returns its starting WCS bit for bit (the same result; false runs
// them all, for tests).
RefineOutcome refine(const Detections& det, const RefStars& refs, const SkyTree* tree, const TanSip& start,
                     double startRadiusPx, bool vote, const AstrometryParams& p, int threads = 1,
                     bool skipAtFixedPoint = true);

// Blind search: returns the refined, verified solution (ok = false with a reason otherwise).
struct BlindSearch {
    double centre[2] = {0.0, 0.0};           // deg: search centre
    double radiusDeg = 180.0;                // deg: field centre within this of `centre`
    double scaleLow = 0.5, scaleHigh = 20.0; // arcsec/px
};
// The thinned reference stars and the reference quads of every scale level (opaque; astrometry_blind.cpp).
struct QuadLevels;
// The quads of the whole of `refs` at the levels between p.scaleLow and p.scaleHigh, for frames of
// width x height: what solveBlind builds per call over its search area, built once (AstrometryIndex).
std::shared_ptr<const QuadLevels> buildQuadLevels(const RefStars& refs, int width, int height,
                                                  const AstrometryParams& p, int threads);
std::size_t quadCount(const QuadLevels& q);
// With `prebuilt` (from buildQuadLevels over the same refs and frame size) the levels that overlap the
// searched scales are searched as they are; otherwise they are built over the search area level by level.
// tree: a sky tree over refs (may be null: linear scans instead).
RefineOutcome solveBlind(const Detections& det, const RefStars& refs, const SkyTree* tree,
                         const BlindSearch& search, const AstrometryParams& p, RunContext& ctx,
                         const QuadLevels* prebuilt = nullptr);

} // namespace gpuphot::astrom

namespace gpuphot {
struct AstrometryIndex::Impl {
    astrom::RefStars refs; // the whole catalog, brightest first
    std::unique_ptr<astrom::SkyTree> tree;
    std::shared_ptr<const astrom::QuadLevels> levels;
    int width = 0, height = 0;
    double seconds = 0.0;
};
} // namespace gpuphot
