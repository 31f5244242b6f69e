#pragma once
// Stage 5: crossmatch of detected sources with a reference catalog (CPU).
//
// 1. Preselection on the sky: the world position of the frame centre and the largest angular distance
//    from it to the frame's corners and edge midpoints (plus the margin, plus 1%) define a cone; reference
//    stars outside it (and outside the magnitude cut) are dropped with a dot product per row, so
//    catalogs of millions of rows cost milliseconds.
// 2. The survivors are projected with the WCS (per-thread copies of the Wcs, fixed chunks) and kept
//    when they fall within the frame plus `marginPx` (0-based pixels, frame = [-0.5, size - 0.5]).
// 3. A k-d tree (nanoflann) over the projected reference positions; for each source, every reference
//    within a pixel radius that safely covers `radiusArcsec` at the smallest local pixel scale. The
//    separation is the exact great-circle distance between the source's world position (through the
//    same WCS) and the reference position, in arcsec; candidates beyond `radiusArcsec` are dropped.
// 4. Without one-to-one: each source takes its nearest candidate. With one-to-one: all candidate pairs
//    sorted by (separation, source index, reference index) are assigned greedily when both are still
//    free: the closest claimant keeps a reference star, the others fall back to their next candidate
//    or to none. The result does not depend on the thread count.
//
// No proper-motion correction here: the caller moves the catalog to the frame's epoch first
// (applyProperMotion).
#include <cstddef>
#include <cstdint>
#include <limits>
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
};

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
    double radiusPx = 0.0; // pixel search radius used in the k-d tree
};

// x, y: source positions, 0-based pixels (NaN entries never match). width, height: frame size (px).
// Throws InvalidInput for mismatched x/y sizes, a non-positive frame size or radius, or a catalog
// larger than INT32_MAX rows.
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

namespace cpu {
CrossmatchResult crossmatch(const std::vector<double>& x, const std::vector<double>& y, int width, int height,
                            const ReferenceCatalog& ref, const Wcs& wcs, const CrossmatchParams& params,
                            RunContext& ctx);
}

} // namespace gpuphot
