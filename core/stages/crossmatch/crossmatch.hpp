#pragma once
// Stage 5: crossmatch of detected sources with a reference catalog (CPU).
//
// 1. Preselection on the sky: the world position of the frame centre and the largest angular distance
//    from it to the frame's corners and edge midpoints (plus the margin, plus 1%) define a cone; reference
//    stars outside it (and outside the magnitude cut) are dropped with a dot product per row, so
//    catalogs of millions of rows cost milliseconds.
// 2. The survivors are projected with the WCS and kept when they fall within the frame plus `marginPx`
//    (0-based pixels, frame = [-0.5, size - 0.5]). A WCS that is exactly TAN or TAN-SIP
//    (tanSipFromHeaderExact) is evaluated in closed form from the unit vectors of step 1 (TanSip; within
//    1e-9 px of WCSLIB); any other through WCSLIB (per-thread copies of the Wcs, fixed chunks).
// 3. For each source, every reference star within a pixel radius that safely covers `radiusArcsec` at the
//    smallest local pixel scale (squared pixel distance < radius^2, as a k-d tree's radius search), found
//    through the spatial index that `CrossmatchParams::index` names: "grid" (the stars binned into a
//    uniform grid of cells; the sources visit the cells their radius touches, in cell order) or "kdtree"
//    (a nanoflann k-d tree over the stars, one radius search per source); "auto" is the grid, measured
//    faster (docs/BENCHMARKS.md "Crossmatch index: grid vs k-d tree"). Both indices only propose a superset
//    of the stars; the same test keeps the candidates, which are sorted the same way, so the result is
//    identical whichever index found them. The separation is the exact great-circle distance between the
//    source's world position (through the same WCS) and the reference position, in arcsec; candidates
//    beyond `radiusArcsec` are dropped. (The CUDA backend, kernels/crossmatch/crossmatch.cu, always searches its own
//    grid on the device: same candidates, same result.)
// 4. Without one-to-one: each source takes its nearest candidate. With one-to-one: all candidate pairs
//    sorted by (separation, source index, reference index) are assigned greedily when both are still
//    free: the closest claimant keeps a reference star, the others fall back to their next candidate
//    or to none. The result does not depend on the thread count.
//
// No proper-motion correction here: the caller moves the catalog to the frame's epoch first
// (applyProperMotion).
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/catalog/reference_catalog.hpp"

namespace gpuphot {

class RunContext;
class Wcs;
struct ReferenceCatalog;

struct CrossmatchParams {
    double radiusArcsec = 2.0; // match radius (arcsec); SExtractor/astromatic: CROSSID_RADIUS
    bool oneToOne = true;      // each reference star matches at most one source (closest wins)
    // Reference magnitude range used for matching (NaN = no cut on that side). Bright = smallest mag.
    double refMagBright = std::numeric_limits<double>::quiet_NaN();
    double refMagFaint = std::numeric_limits<double>::quiet_NaN();
    double marginPx = 10.0; // reference stars projected up to this far outside the frame are kept (px)
    // Spatial index of step 3 on the CPU: "grid", "kdtree" (nanoflann) or "auto" (= "grid"). Same result.
    std::string index = "auto";
};

enum class CrossmatchIndex { Grid, KdTree };
// The index that a CrossmatchParams::index value names ("auto" -> Grid). Throws InvalidInput for any other
// value, naming it and the accepted ones.
CrossmatchIndex resolveCrossmatchIndex(const std::string& index);

void to_json(nlohmann::json& j, const CrossmatchParams& p);
void from_json(const nlohmann::json& j, CrossmatchParams& p);

struct CrossmatchResult {
    std::vector<std::int32_t> refIndex;   // per source: row in the ReferenceCatalog, -1 = none
    std::vector<double> separationArcsec; // per source: arcsec, NaN when unmatched
    std::size_t nMatched = 0;             // sources with a match
    std::size_t nRefInFrame = 0;          // reference stars (after the magnitude cut) inside the frame
    // The reference stars kept after projection (inside frame + margin), ascending row order, with their
    // 0-based pixel positions: for overlays, diagnostics and the astrometric fit.
    std::vector<std::int32_t> refSelected;
    std::vector<double> refX, refY;
    double radiusPx = 0.0; // pixel search radius used in the grid / k-d tree
    // Matches expected by chance: sources with a position x reference stars in the frame x the match
    // circle's area / the frame's area (at the scale of the frame's centre), as the astrometric
    // verification counts them. The zero point refuses matches that are not well above it.
    double chanceMatches = 0.0;
};

// x, y: source positions, 0-based pixels (NaN entries never match). width, height: frame size (px).
// Throws InvalidInput for mismatched x/y sizes, a non-positive frame size or radius, an unknown index, or a
// catalog larger than INT32_MAX rows.
CrossmatchResult crossmatch(const std::vector<double>& x, const std::vector<double>& y, int width, int height,
                            const ReferenceCatalog& ref, const Wcs& wcs, const CrossmatchParams& params,
                            RunContext& ctx);
// The reference stars that can matter for one frame, cut from a catalog that may cover far more sky:
// those within a cone around the frame centre reaching the farthest of 25 points on the frame's edges and
// inside (x 1.01) plus marginArcsec, by one dot product per row (no projection). Meant to be done once per
// frame before crossmatch, zero point and astrometry; a star outside the cone lies more than marginArcsec
// beyond the frame and can never be matched on it. `rows` (optional) receives each kept star's row in
// `ref`, ascending, to map refIndex results back. All columns and the metadata are copied.
// Throws InvalidInput when the frame centre does not transform or marginArcsec is negative.
ReferenceCatalog cutReferenceToFrame(const ReferenceCatalog& ref, const Wcs& wcs, int width, int height,
                                     double marginArcsec, std::vector<std::int32_t>* rows = nullptr);

namespace detail {
// What cpu::crossmatch and the CUDA crossmatch (kernels/crossmatch/crossmatch.cu) share, so that they cannot drift
// apart: input checks, steps 1-2, the sources' world positions (step 3's input) and step 4.
using UnitVector = std::array<double, 3>;
struct CrossmatchSetup {
    std::vector<UnitVector> refUnit;       // per selected star (res.refSelected order)
    std::vector<UnitVector> srcUnit;       // per source; zeros where !srcValid
    std::vector<std::uint8_t> srcValid;    // pixel and world position finite
    double lo = 0.0, hiX = 0.0, hiY = 0.0; // the frame + margin (0-based px): selected stars lie inside
};
// Checks the inputs (throws InvalidInput as crossmatch documents), then fills res.refIndex (-1),
// res.separationArcsec (NaN), res.refSelected/refX/refY, res.nRefInFrame and res.radiusPx.
CrossmatchSetup prepareCrossmatch(const std::vector<double>& x, const std::vector<double>& y, int width,
                                  int height, const ReferenceCatalog& ref, const Wcs& wcs,
                                  const CrossmatchParams& params, int threads, CrossmatchResult& res);
// Great-circle separation (arcsec) of two unit vectors: atan2(|a x b|, a.b).
double separationArcsec(const UnitVector& a, const UnitVector& b);
struct MatchCandidate {
    double sep;
    std::int32_t src, ref; // ref: row in the ReferenceCatalog
};
// Step 4. cands: grouped by source (source i: [offsets[i], offsets[i + 1]), each group sorted by (sep, ref)).
// Fills res.refIndex, res.separationArcsec and res.nMatched.
void assignMatches(const std::vector<MatchCandidate>& cands, const std::vector<std::uint32_t>& offsets,
                   std::size_t nRef, bool oneToOne, CrossmatchResult& res);
// Sorts one source's candidates by (sep, ref).
void sortCandidates(MatchCandidate* begin, MatchCandidate* end);

// A uniform grid of square cells over points in [x0, x0 + spanX] x [y0, y0 + spanY] (points outside go to
// the nearest edge cell): the points sorted by cell (row-major, stable: ascending index within a cell),
// for "every point within r of q" and "nearest point" queries without a tree. Cells are at least
// `minCell` wide and hold about `perCell` points on average (at most ~4M cells).
class PointGrid {
public:
    PointGrid(const std::vector<double>& x, const std::vector<double>& y, std::size_t n, double x0, double y0,
              double spanX, double spanY, double minCell, double perCell = 2.0);
    // Sorted positions and the original index of each sorted point.
    std::vector<double> sx, sy;
    std::vector<std::uint32_t> index;
    // fn(j) for every sorted point j in the cells that the square [qx - reach, qx + reach] x [qy - reach,
    // qy + reach] touches (a superset of the points within reach of q), row by row.
    template <class Fn> void visit(double qx, double qy, double reach, Fn&& fn) const {
        const double fx0 = std::floor((qx - reach - m_x0) / m_cell),
                     fx1 = std::floor((qx + reach - m_x0) / m_cell);
        const double fy0 = std::floor((qy - reach - m_y0) / m_cell),
                     fy1 = std::floor((qy + reach - m_y0) / m_cell);
        if (!(fx1 >= 0.0 && fy1 >= 0.0 && fx0 <= double(m_nx - 1) && fy0 <= double(m_ny - 1))) return;
        const long long cx0 = clampCell(fx0, m_nx), cx1 = clampCell(fx1, m_nx);
        const long long cy0 = clampCell(fy0, m_ny), cy1 = clampCell(fy1, m_ny);
        for (long long cy = cy0; cy <= cy1; ++cy) {
            const std::size_t row = static_cast<std::size_t>(cy * m_nx);
            const std::uint32_t end = m_start[row + cx1 + 1];
            for (std::uint32_t j = m_start[row + cx0]; j < end; ++j)
                fn(j);
        }
    }
    // The indices of the finite query points (valid[i] != 0 when valid is given) in cell order: queries
    // visited in this order touch memory in order.
    std::vector<std::uint32_t> cellOrder(const std::vector<double>& qx, const std::vector<double>& qy,
                                         std::size_t n,
                                         const std::vector<std::uint8_t>* valid = nullptr) const;

private:
    static long long clampCell(double f, long long n) {
        return static_cast<long long>(!(f >= 0.0) ? 0.0 : (f > double(n - 1) ? double(n - 1) : f));
    }
    std::size_t cellOf(double px, double py) const {
        return static_cast<std::size_t>(clampCell(std::floor((py - m_y0) / m_cell), m_ny) * m_nx +
                                        clampCell(std::floor((px - m_x0) / m_cell), m_nx));
    }
    double m_x0 = 0.0, m_y0 = 0.0, m_cell = 1.0;
    long long m_nx = 1, m_ny = 1;
    std::vector<std::uint32_t> m_start; // per cell: first sorted point; size cells + 1
};
} // namespace detail

namespace cpu {
CrossmatchResult crossmatch(const std::vector<double>& x, const std::vector<double>& y, int width, int height,
                            const ReferenceCatalog& ref, const Wcs& wcs, const CrossmatchParams& params,
                            RunContext& ctx);
}

} // namespace gpuphot
