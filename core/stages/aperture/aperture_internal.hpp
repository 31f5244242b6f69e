#pragma once
// Internals of stage 4 (aperture photometry) shared by the CPU stage (core/stages/aperture/aperture.cpp) and the
// CUDA one (kernels/aperture/aperture.cu). The per-source heavy loops are GPUPHOT_HD functions over raw pixel
// planes, so both backends run the same arithmetic in the same order (docs/ARCHITECTURE.md, Determinism); the
// stage's driver (detail::measureAperturesWith) is written once against an ApertureEngine that runs those
// loops in batches: the CPU engine with OpenMP, the CUDA engine with kernels. Everything around the loops
// (validation, sky fallbacks, flags, errors, the curve of growth and the aperture correction, the choice
// of the optimal radius) is the driver's, on the host, for both backends.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/model/flags.hpp"
#include "core/model/image.hpp"
#include "core/stages/aperture/aperture.hpp"
#include "core/stages/aperture/aperture_overlap.hpp"
#include "core/util/hd.hpp"

namespace gpuphot {

class RunContext;
struct ApertureParams;
struct ApertureResult;
struct BackgroundResult;
struct Sources;

namespace detail {

// Mask bits that exclude a pixel from the sums (MaskSaturated pixels are kept and flagged).
inline constexpr std::uint8_t kApertureExcludeBits = static_cast<std::uint8_t>(~4u); // ~MaskSaturated

} // namespace detail
class BackgroundSampler;
// BackgroundSampler::levelAt / rmsAt (host only; core/stages/background/background.cpp).
float sampledLevel(const BackgroundSampler* sampler, int x, int y);
float sampledRms(const BackgroundSampler* sampler, int x, int y);
namespace detail {

// The frame as raw planes: host pointers on the CPU, device pointers in the kernels. Empty planes are null.
struct AperturePlanes {
    const float* image = nullptr;
    std::ptrdiff_t imageStride = 0;
    const std::uint8_t* mask = nullptr;
    std::ptrdiff_t maskStride = 0;
    const std::int32_t* seg = nullptr;
    std::ptrdiff_t segStride = 0;
    const float* level = nullptr; // background map (null when none)
    const float* rms = nullptr;
    std::ptrdiff_t mapStride = 0;
    const BackgroundSampler* sampler = nullptr; // CPU engine only: the maps on demand when level/rms are null
    int width = 0, height = 0;
    double saturation = std::numeric_limits<double>::infinity();
    NeighbourPixels neighbours = NeighbourPixels::Sum;

    GPUPHOT_HD float value(int x, int y) const { return image[static_cast<std::ptrdiff_t>(y) * imageStride + x]; }
    GPUPHOT_HD std::uint8_t maskAt(int x, int y) const {
        return mask ? mask[static_cast<std::ptrdiff_t>(y) * maskStride + x] : std::uint8_t{0};
    }
    GPUPHOT_HD std::int32_t segAt(int x, int y) const {
        return seg ? seg[static_cast<std::ptrdiff_t>(y) * segStride + x] : 0;
    }
    GPUPHOT_HD float levelAt(int x, int y) const {
#if !defined(__CUDA_ARCH__)
        if (!level) return sampledLevel(sampler, x, y);
#endif
        return level[static_cast<std::ptrdiff_t>(y) * mapStride + x];
    }
    GPUPHOT_HD float rmsAt(int x, int y) const {
#if !defined(__CUDA_ARCH__)
        if (!rms) return sampledRms(sampler, x, y);
#endif
        return rms[static_cast<std::ptrdiff_t>(y) * mapStride + x];
    }
};

// The sky under one source: a constant (local annulus) or the per-pixel map.
struct ApertureSky {
    int perPixel = 0;
    double level = 0.0;
    double var = 0.0;
};

// Sums of one aperture: Σ w (d - s), Σ w, Σ w² σ², Σ w² (d - s).
struct ApertureSums {
    double flux = 0.0, area = 0.0, varSky = 0.0, poisson = 0.0;
    GPUPHOT_HD void add(double w, double v, double var) {
        flux += w * v;
        area += w;
        varSky += w * w * var;
        poisson += w * w * v;
    }
    GPUPHOT_HD void addFull(double v, double var) {
        flux += v;
        area += 1.0;
        varSky += var;
        poisson += v;
    }
    GPUPHOT_HD void addSums(const ApertureSums& o) {
        flux += o.flux;
        area += o.area;
        varSky += o.varSky;
        poisson += o.poisson;
    }
};

// Nearest distance from the aperture centre of the pixels of each kind: an aperture of radius r holds
// such a pixel when r exceeds that distance.
struct ApertureFlagDistances {
    double masked = std::numeric_limits<double>::infinity(), crowded = std::numeric_limits<double>::infinity(),
           saturated = std::numeric_limits<double>::infinity(), edge = std::numeric_limits<double>::infinity();
    GPUPHOT_HD std::uint32_t flagsFor(double r) const {
        std::uint32_t f = 0;
        if (r > masked) f |= FlagApertureMasked;
        if (r > crowded) f |= FlagCrowded;
        if (r > saturated) f |= FlagSaturated;
        if (r > edge) f |= FlagApertureIncomplete;
        return f;
    }
};

// Classifies pixel (x, y) for the aperture sums of the source with segment ownId: false when excluded.
GPUPHOT_HD inline bool usePixel(const AperturePlanes& in, int x, int y, std::int32_t ownId, float& value,
                                bool& saturated, bool& foreign) {
    value = in.value(x, y);
    const std::uint8_t m = in.maskAt(x, y);
    if ((m & kApertureExcludeBits) != 0 || !std::isfinite(value)) return false;
    saturated = (m & 4u) != 0 || value >= in.saturation;
    if (in.seg) {
        const std::int32_t s = in.segAt(x, y);
        foreign = s != 0 && s != ownId;
    } else {
        foreign = false;
    }
    return true;
}

// The mirror of pixel (x, y) through the centre (cx, cy), SExtractor's rounding; false when it is off the
// frame, does not touch the aperture (touches(mx, my): so that it lies in the aperture's pixel box) or is
// not usable for the source ownId (masked, NaN, another object's).
template <class Touches>
GPUPHOT_HD inline bool mirrorPixel(const AperturePlanes& in, double cx, double cy, std::int32_t ownId,
                                   const Touches& touches, int x, int y, float& value, int& mx, int& my) {
    mx = static_cast<int>(2.0 * cx + 0.49999 - x);
    my = static_cast<int>(2.0 * cy + 0.49999 - y);
    if (mx < 0 || mx >= in.width || my < 0 || my >= in.height || !touches(mx, my)) return false;
    bool saturated = false, foreign = false;
    return usePixel(in, mx, my, ownId, value, saturated, foreign) && !foreign;
}

// Pixel (x, y) in the sums of the source ownId centred on (cx, cy), under in.neighbours: usable, saturated
// and foreign describe the pixel itself (usePixel, for the flags); true when it adds a value, its own or
// (NeighbourPixels::Correct) its mirror's, and then (sx, sy) is the pixel that value and its sky are from.
template <class Touches>
GPUPHOT_HD inline bool sumPixel(const AperturePlanes& in, double cx, double cy, std::int32_t ownId,
                                const Touches& touches, int x, int y, float& value, int& sx, int& sy,
                                bool& usable, bool& saturated, bool& foreign) {
    sx = x;
    sy = y;
    usable = usePixel(in, x, y, ownId, value, saturated, foreign);
    if (usable &&
        (!foreign || in.neighbours == NeighbourPixels::Sum || in.neighbours == NeighbourPixels::None))
        return true;
    return in.neighbours == NeighbourPixels::Correct &&
           mirrorPixel(in, cx, cy, ownId, touches, x, y, value, sx, sy);
}

// sumPixel's touches for an ellipse (CircleTouch below, for circles).
struct EllipseTouch {
    const EllipseAperture& e;
    GPUPHOT_HD bool operator()(int x, int y) const { // within ellipseBox's box, and overlapping
        const double cx = e.centreX(), cy = e.centreY(), hx = e.halfWidthX(), hy = e.halfWidthY();
        return x >= std::floor(cx - hx + 0.5) && x <= std::ceil(cx + hx - 0.5) &&
               y >= std::floor(cy - hy + 0.5) && y <= std::ceil(cy + hy - 0.5) && e.pixelOverlap(x, y) > 0.0;
    }
};

GPUPHOT_HD inline void pixelSky(const AperturePlanes& in, const ApertureSky& sky, int x, int y, double& level,
                                double& var) {
    if (sky.perPixel) {
        level = in.levelAt(x, y);
        const double r = in.rmsAt(x, y);
        var = r * r;
    } else {
        level = sky.level;
        var = sky.var;
    }
}

// ---- circles --------------------------------------------------------------------------------------

// The pixel box of a circle of radius rmax about (cx, cy), clipped to the frame.
GPUPHOT_HD inline void circleBox(const AperturePlanes& in, double cx, double cy, double rmax, int& x0, int& x1,
                                 int& y0, int& y1) {
    x0 = std::max(0, static_cast<int>(std::floor(cx - rmax + 0.5)));
    x1 = std::min(in.width - 1, static_cast<int>(std::ceil(cx + rmax - 0.5)));
    y0 = std::max(0, static_cast<int>(std::floor(cy - rmax + 0.5)));
    y1 = std::min(in.height - 1, static_cast<int>(std::ceil(cy + rmax - 0.5)));
}

GPUPHOT_HD inline double edgeDistance(const AperturePlanes& in, double cx, double cy) {
    return std::min(std::min(cx + 0.5, in.width - 0.5 - cx), std::min(cy + 0.5, in.height - 0.5 - cy));
}

// For a pixel whose nearest/farthest squared distances from the centre are dmin2/dmax2 and ascending
// squared radii r2[0..nr): k0 = the first radius that reaches into the pixel (r2 > dmin2), kf = the first
// radius that holds the whole pixel (r2 >= dmax2). k0 == nr: no radius touches the pixel.
GPUPHOT_HD inline void radiusRange(const double* r2, std::size_t nr, double dmin2, double dmax2, std::size_t& k0,
                                   std::size_t& kf) {
    std::size_t lo = 0, hi = nr; // upper_bound(dmin2)
    while (lo < hi) {
        const std::size_t mid = lo + (hi - lo) / 2;
        if (dmin2 < r2[mid]) hi = mid; else lo = mid + 1;
    }
    k0 = lo;
    if (k0 == nr) {
        kf = nr;
        return;
    }
    hi = nr; // lower_bound(dmax2) in [k0, nr)
    while (lo < hi) {
        const std::size_t mid = lo + (hi - lo) / 2;
        if (r2[mid] < dmax2) lo = mid + 1; else hi = mid;
    }
    kf = lo;
}

// The geometry of pixel (x, y) relative to (cx, cy): its offsets and nearest/farthest squared distances.
struct PixelGeometry {
    double dx0, dy0, dx1, dy1, dmin2, dmax2;
};
GPUPHOT_HD inline PixelGeometry pixelGeometry(int x, int y, double cx, double cy) {
    PixelGeometry g;
    g.dy0 = y - 0.5 - cy;
    g.dy1 = g.dy0 + 1.0;
    const double ny = g.dy0 > 0.0 ? g.dy0 : (g.dy1 < 0.0 ? g.dy1 : 0.0);
    const double fy = std::max(g.dy0 * g.dy0, g.dy1 * g.dy1);
    g.dx0 = x - 0.5 - cx;
    g.dx1 = g.dx0 + 1.0;
    const double nx = g.dx0 > 0.0 ? g.dx0 : (g.dx1 < 0.0 ? g.dx1 : 0.0);
    g.dmin2 = nx * nx + ny * ny;
    g.dmax2 = std::max(g.dx0 * g.dx0, g.dx1 * g.dx1) + fy;
    return g;
}

// sumPixel's touches for concentric circles about (cx, cy) of largest radius r (r2max = r * r).
struct CircleTouch {
    double cx, cy, r, r2max;
    GPUPHOT_HD bool operator()(int x, int y) const { // within circleBox's box, and touching
        return x >= std::floor(cx - r + 0.5) && x <= std::ceil(cx + r - 0.5) &&
               y >= std::floor(cy - r + 0.5) && y <= std::ceil(cy + r - 0.5) &&
               pixelGeometry(x, y, cx, cy).dmin2 < r2max;
    }
};

// Pixel (x, y)'s part in radius j's sums of circleRadiusParts: 1, a partial term (exact overlap weight);
// 2, a whole pixel; 0, nothing. fd, when not null, gets the pixel's flag distances (not the edge's).
GPUPHOT_HD inline int circleRadiusPixel(const AperturePlanes& in, const ApertureSky& sky, double cx,
                                        double cy, std::int32_t ownId, const double* r, const double* r2,
                                        std::size_t nr, std::size_t j, int x, int y, ApertureSums& term,
                                        ApertureFlagDistances* fd) {
    const PixelGeometry g = pixelGeometry(x, y, cx, cy);
    std::size_t k0, kf;
    radiusRange(r2, nr, g.dmin2, g.dmax2, k0, kf);
    if (k0 == nr) return 0;
    const bool mine = (k0 <= j && j < kf) || kf == j;
    if (!mine && !fd) return 0;
    float value;
    int sx, sy;
    bool usable = false, saturated = false, foreign = false;
    const double dmin = std::sqrt(g.dmin2);
    const bool adds = sumPixel(in, cx, cy, ownId, CircleTouch{cx, cy, r[nr - 1], r2[nr - 1]}, x, y, value, sx,
                               sy, usable, saturated, foreign);
    if (fd) {
        if (!usable) fd->masked = std::min(fd->masked, dmin);
        if (usable && saturated) fd->saturated = std::min(fd->saturated, dmin);
        if (usable && foreign) fd->crowded = std::min(fd->crowded, dmin);
    }
    if (!mine || !adds) return 0;
    double level, var;
    pixelSky(in, sky, sx, sy, level, var);
    const double v = static_cast<double>(value) - level;
    if (kf == j) { // what ApertureSums::addFull adds
        term.flux = v;
        term.area = 1.0;
        term.varSky = var;
        term.poisson = v;
        return 2;
    }
    const double w = circleRectOverlap(g.dx0, g.dy0, g.dx1, g.dy1, r[j]); // what ApertureSums::add adds
    term.flux = w * v;
    term.area = w;
    term.varSky = w * w * var;
    term.poisson = w * w * v;
    return 1;
}

// Sums in concentric circles of ascending radii r[0..nr) around (cx, cy), decomposed: for each radius k,
// partial[k] holds the pixels that radius k cuts (exact overlap weights), full[k] the pixels that radius k
// is the first to hold wholly; out[k] = (full[0] + ... + full[k]) + partial[k] (circleCombine). Pixels
// are visited in raster order (rows, then columns) whichever radius is summed. This computes the parts of
// radius j alone (one GPU thread per source and radius); fd, when not null, gets the flag distances.
GPUPHOT_HD inline void circleRadiusParts(const AperturePlanes& in, const ApertureSky& sky, double cx, double cy,
                                         std::int32_t ownId, const double* r, const double* r2, std::size_t nr,
                                         std::size_t j, ApertureSums& partial, ApertureSums& full,
                                         ApertureFlagDistances* fd) {
    partial = ApertureSums{};
    full = ApertureSums{};
    int x0, x1, y0, y1;
    circleBox(in, cx, cy, r[nr - 1], x0, x1, y0, y1);
    for (int y = y0; y <= y1; ++y) {
        for (int x = x0; x <= x1; ++x) {
            ApertureSums term;
            const int kind = circleRadiusPixel(in, sky, cx, cy, ownId, r, r2, nr, j, x, y, term, fd);
            if (kind == 2)
                full.addSums(term);
            else if (kind == 1)
                partial.addSums(term);
        }
    }
    if (fd) fd->edge = edgeDistance(in, cx, cy);
}

// out[k] from the parts of all radii (see circleRadiusParts).
GPUPHOT_HD inline void circleCombine(const ApertureSums* partial, const ApertureSums* full, std::size_t nr,
                                     ApertureSums* out) {
    ApertureSums running;
    for (std::size_t k = 0; k < nr; ++k) {
        running.addSums(full[k]);
        out[k] = running;
        out[k].addSums(partial[k]);
    }
}

// All radii in one pass (the CPU engine): the same sums as circleRadiusParts + circleCombine, bitwise.
// partial and full are scratch arrays of nr entries.
inline void circleSumsAll(const AperturePlanes& in, const ApertureSky& sky, double cx, double cy,
                          std::int32_t ownId, const double* r, const double* r2, std::size_t nr,
                          ApertureSums* partial, ApertureSums* full, ApertureSums* out,
                          ApertureFlagDistances& fd) {
    fd = ApertureFlagDistances{};
    fd.edge = edgeDistance(in, cx, cy);
    if (nr == 0) return;
    for (std::size_t k = 0; k < nr; ++k)
        partial[k] = full[k] = ApertureSums{};
    int x0, x1, y0, y1;
    circleBox(in, cx, cy, r[nr - 1], x0, x1, y0, y1);
    for (int y = y0; y <= y1; ++y) {
        for (int x = x0; x <= x1; ++x) {
            const PixelGeometry g = pixelGeometry(x, y, cx, cy);
            std::size_t k0, kf;
            if (nr <= 8) { // linear search: the same indices as radiusRange
                k0 = 0;
                while (k0 < nr && r2[k0] <= g.dmin2)
                    ++k0;
                if (k0 == nr) continue;
                kf = k0;
                while (kf < nr && r2[kf] < g.dmax2)
                    ++kf;
            } else {
                radiusRange(r2, nr, g.dmin2, g.dmax2, k0, kf);
                if (k0 == nr) continue;
            }
            float value;
            int sx, sy;
            bool usable = false, saturated = false, foreign = false;
            const double dmin = std::sqrt(g.dmin2);
            const bool adds = sumPixel(in, cx, cy, ownId, CircleTouch{cx, cy, r[nr - 1], r2[nr - 1]}, x, y,
                                       value, sx, sy, usable, saturated, foreign);
            if (!usable) fd.masked = std::min(fd.masked, dmin);
            if (usable && saturated) fd.saturated = std::min(fd.saturated, dmin);
            if (usable && foreign) fd.crowded = std::min(fd.crowded, dmin);
            if (!adds) continue;
            double level, var;
            pixelSky(in, sky, sx, sy, level, var);
            const double v = static_cast<double>(value) - level;
            for (std::size_t k = k0; k < kf; ++k)
                partial[k].add(circleRectOverlap(g.dx0, g.dy0, g.dx1, g.dy1, r[k]), v, var);
            if (kf < nr) full[kf].addFull(v, var);
        }
    }
    circleCombine(partial, full, nr, out);
}

// ---- ellipses and Kron ----------------------------------------------------------------------------

// The pixel box of ellipse e about (cx, cy), clipped to the frame; flags gets FlagApertureIncomplete when
// the ellipse reaches beyond the frame.
GPUPHOT_HD inline void ellipseBox(const AperturePlanes& in, const EllipseAperture& e, double cx, double cy,
                                  int& x0, int& x1, int& y0, int& y1, std::uint32_t& flags) {
    const int w = in.width, h = in.height;
    const double hx = e.halfWidthX(), hy = e.halfWidthY();
    if (cx - hx < -0.5 || cx + hx > w - 0.5 || cy - hy < -0.5 || cy + hy > h - 0.5)
        flags |= FlagApertureIncomplete;
    x0 = std::max(0, static_cast<int>(std::floor(cx - hx + 0.5)));
    x1 = std::min(w - 1, static_cast<int>(std::ceil(cx + hx - 0.5)));
    y0 = std::max(0, static_cast<int>(std::floor(cy - hy + 0.5)));
    y1 = std::min(h - 1, static_cast<int>(std::ceil(cy + hy - 0.5)));
}

// Pixel (x, y)'s term of an ellipse's sums (what ApertureSums::add / addFull would add): false when it adds
// nothing; flags collects its aperture flags. Its weight is its exact overlap with the ellipse, or with
// pixelCentres 1 or 0 as its centre lies in the ellipse or not.
GPUPHOT_HD inline bool ellipsePixel(const AperturePlanes& in, const ApertureSky& sky,
                                    const EllipseAperture& e, std::int32_t ownId, int x, int y,
                                    bool pixelCentres, ApertureSums& term, std::uint32_t& flags) {
    const double wgt = pixelCentres ? (e.normRadius2(x - e.centreX(), y - e.centreY()) <= 1.0 ? 1.0 : 0.0)
                                    : e.pixelOverlap(x, y);
    if (wgt <= 0.0) return false;
    float value;
    int sx, sy;
    bool usable = false, saturated = false, foreign = false;
    const bool adds = sumPixel(in, e.centreX(), e.centreY(), ownId, EllipseTouch{e}, x, y, value, sx, sy,
                               usable, saturated, foreign);
    if (!usable) flags |= FlagApertureMasked;
    if (usable && saturated) flags |= FlagSaturated;
    if (usable && foreign) flags |= FlagCrowded;
    if (!adds) return false;
    double level, var;
    pixelSky(in, sky, sx, sy, level, var);
    const double v = static_cast<double>(value) - level;
    if (wgt >= 1.0) {
        term.flux = v;
        term.area = 1.0;
        term.varSky = var;
        term.poisson = v;
    } else {
        term.flux = wgt * v;
        term.area = wgt;
        term.varSky = wgt * wgt * var;
        term.poisson = wgt * wgt * v;
    }
    return true;
}

// Sums in one ellipse (exact overlap), raster order; returns the aperture's flags.
GPUPHOT_HD inline std::uint32_t sumEllipse(const AperturePlanes& in, const ApertureSky& sky,
                                           const EllipseAperture& e, double cx, double cy, std::int32_t ownId,
                                           bool pixelCentres, ApertureSums& out) {
    out = ApertureSums{};
    std::uint32_t flags = 0;
    int x0, x1, y0, y1;
    ellipseBox(in, e, cx, cy, x0, x1, y0, y1, flags);
    for (int y = y0; y <= y1; ++y) {
        for (int x = x0; x <= x1; ++x) {
            ApertureSums term;
            if (ellipsePixel(in, sky, e, ownId, x, y, pixelCentres, term, flags)) out.addSums(term);
        }
    }
    return flags;
}

// The pixel box of kronFirstMoment (centres within rmax times ellipse e), clipped to the frame.
GPUPHOT_HD inline void kronMomentBox(const AperturePlanes& in, const EllipseAperture& e, double cx, double cy,
                                     double rmax, int& x0, int& x1, int& y0, int& y1) {
    const double hx = rmax * e.halfWidthX(), hy = rmax * e.halfWidthY();
    x0 = std::max(0, static_cast<int>(std::ceil(cx - hx)));
    x1 = std::min(in.width - 1, static_cast<int>(std::floor(cx + hx)));
    y0 = std::max(0, static_cast<int>(std::ceil(cy - hy)));
    y1 = std::min(in.height - 1, static_cast<int>(std::floor(cy + hy)));
}

// Pixel (x, y)'s terms of kronFirstMoment's sums (ρ I and I): false when it adds nothing.
GPUPHOT_HD inline bool kronMomentPixel(const AperturePlanes& in, const ApertureSky& sky,
                                       const EllipseAperture& e, double cx, double cy, double rmax2,
                                       std::int32_t ownId, int x, int y, double& ri, double& v) {
    const double rho2 = e.normRadius2(x - cx, y - cy);
    if (rho2 > rmax2) return false;
    float value;
    bool saturated = false, foreign = false;
    if (!usePixel(in, x, y, ownId, value, saturated, foreign)) return false;
    if (foreign && in.neighbours != NeighbourPixels::None) return false;
    double level, var;
    pixelSky(in, sky, x, y, level, var);
    v = static_cast<double>(value) - level;
    ri = std::sqrt(rho2) * v;
    return true;
}

// r1 from the sums; NaN when undefined (non-positive sums).
GPUPHOT_HD inline double kronMomentOf(double sumRI, double sumI) {
    if (!(sumI > 0.0) || !(sumRI > 0.0)) return std::numeric_limits<double>::quiet_NaN();
    return sumRI / sumI;
}

// SExtractor's first moment r1 = Σ ρ I / Σ I over the pixels (centres) with ρ < rmax, ρ the normalised
// elliptical radius in units of the isophotal ellipse e. Masked pixels and other objects' pixels excluded.
// NaN when undefined (non-positive sums).
GPUPHOT_HD inline double kronFirstMoment(const AperturePlanes& in, const ApertureSky& sky,
                                         const EllipseAperture& e, double cx, double cy, double rmax,
                                         std::int32_t ownId) {
    int x0, x1, y0, y1;
    kronMomentBox(in, e, cx, cy, rmax, x0, x1, y0, y1);
    const double rmax2 = rmax * rmax;
    double sumRI = 0.0, sumI = 0.0;
    for (int y = y0; y <= y1; ++y) {
        for (int x = x0; x <= x1; ++x) {
            double ri, v;
            if (!kronMomentPixel(in, sky, e, cx, cy, rmax2, ownId, x, y, ri, v)) continue;
            sumRI += ri;
            sumI += v;
        }
    }
    return kronMomentOf(sumRI, sumI);
}

// One source's Kron measurement: the isophotal ellipse (a, b, and cos/sin of theta, computed on the host).
struct KronJob {
    double cx, cy, a, b, cosT, sinT;
    ApertureSky sky;
    std::int32_t ownId;
};
struct KronParamsHD {
    double factor, minRadius, maxRadius;
    int pixelCentres; // 1: the ellipse holds the whole pixels whose centres lie in it (SExtractor's sum)
};
struct KronOut {
    double kronRadius = 0.0;
    ApertureSums sums;
    std::uint32_t flags = 0; // FlagKronFailed and the ellipse's aperture flags
    int measured = 0;        // 1: sums hold the ellipse's sums
};
// The Kron radius from r1 (FlagKronFailed into flags when r1 is undefined).
GPUPHOT_HD inline double kronRadiusOf(double r1, const KronParamsHD& p, std::uint32_t& flags) {
    double kron = p.factor * r1;
    if (!std::isfinite(r1)) {
        flags |= FlagKronFailed;
        kron = p.minRadius;
    }
    return std::max(kron, p.minRadius);
}
GPUPHOT_HD inline KronOut kronAperture(const AperturePlanes& in, const KronJob& j, const KronParamsHD& p) {
    KronOut o;
    const EllipseAperture iso(j.cx, j.cy, j.a, j.b, j.cosT, j.sinT);
    const double r1 = kronFirstMoment(in, j.sky, iso, j.cx, j.cy, p.maxRadius, j.ownId);
    const double kron = kronRadiusOf(r1, p, o.flags);
    o.kronRadius = kron;
    if (kron > 0.0) {
        const EllipseAperture e(j.cx, j.cy, j.a * kron, j.b * kron, j.cosT, j.sinT);
        o.flags |= sumEllipse(in, j.sky, e, j.cx, j.cy, j.ownId, p.pixelCentres != 0, o.sums);
        o.measured = 1;
    }
    return o;
}

// ---- local sky ------------------------------------------------------------------------------------

// Calls take(x, y, value) for the annulus pixels rin <= d <= rout (centres) about (cx, cy) that are usable
// sky: unmasked, in no object, finite, below saturation. Row by row in ascending x, each pixel once.
// The pieces of forAnnulusAt (also used by the GPU's block-per-source sky): the rows [y0, y1]; row y's
// span [xa, xb] (false: the row misses the outer circle); whether pixel (x, y) is usable sky, and its value.
GPUPHOT_HD inline void annulusRows(const AperturePlanes& in, double cy, double rout, int& y0, int& y1) {
    y0 = std::max(0, static_cast<int>(std::ceil(cy - rout)));
    y1 = std::min(in.height - 1, static_cast<int>(std::floor(cy + rout)));
}
GPUPHOT_HD inline bool annulusRowSpan(const AperturePlanes& in, double cx, double cy, double rout2, int y,
                                      double& dy2, int& xa, int& xb) {
    dy2 = (y - cy) * (y - cy);
    if (dy2 > rout2) return false;
    // the row's span of the outer circle (margins of 1e-9 px; the exact distance test in annulusPixel()
    // decides, also for the inner hole: one loop, so that no pixel is visited twice whatever the rounding)
    const double wo = std::sqrt(rout2 - dy2) + 1e-9;
    xa = std::max(0, static_cast<int>(std::ceil(cx - wo)));
    xb = std::min(in.width - 1, static_cast<int>(std::floor(cx + wo)));
    return true;
}
GPUPHOT_HD inline bool annulusPixel(const AperturePlanes& in, double cx, double rin2, double rout2, int x,
                                    int y, double dy2, float& v) {
    const double d2 = (x - cx) * (x - cx) + dy2;
    if (d2 < rin2 || d2 > rout2) return false;
    if (in.maskAt(x, y) != 0) return false;
    if (in.segAt(x, y) != 0) return false;
    v = in.value(x, y);
    return std::isfinite(v) && v < in.saturation;
}
// At most this many pixels per row and rows (so at most its square pixels) in an annulus of outer radius
// rout: floor(2 rout + 2e-9) + 1, with room to spare.
GPUPHOT_HD inline int annulusSideBound(double rout) {
    return static_cast<int>(std::floor(2.0 * rout + 1e-6)) + 2;
}

template <class Take>
GPUPHOT_HD inline void forAnnulusAt(const AperturePlanes& in, double cx, double cy, double rin, double rout,
                                    Take&& take) {
    int y0, y1;
    annulusRows(in, cy, rout, y0, y1);
    const double rin2 = rin * rin, rout2 = rout * rout;
    for (int y = y0; y <= y1; ++y) {
        double dy2;
        int xa, xb;
        if (!annulusRowSpan(in, cx, cy, rout2, y, dy2, xa, xb)) continue;
        for (int x = xa; x <= xb; ++x) {
            float v;
            if (annulusPixel(in, cx, rin2, rout2, x, y, dy2, v)) take(x, y, v);
        }
    }
}

// forAnnulusAt calling take(value) alone.
template <class Take>
GPUPHOT_HD inline void forAnnulus(const AperturePlanes& in, double cx, double cy, double rin, double rout,
                                  Take&& take) {
    forAnnulusAt(in, cx, cy, rin, rout, [&](int, int, float v) { take(v); });
}

// Order-preserving map of finite floats to unsigned keys (ascending keys = ascending values; -0 < +0).
GPUPHOT_HD inline std::uint32_t floatKey(std::uint32_t bits) {
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}
GPUPHOT_HD inline std::uint32_t keyBits(std::uint32_t k) {
    return (k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k;
}

// Ascending in-place heap sort of n keys (the GPU's per-source sort of its annulus keys; any correct sort
// gives the same array, the keys being totally ordered integers).
GPUPHOT_HD inline void heapSortKeys(std::uint32_t* a, std::size_t n) {
    if (n < 2) return;
    auto siftDown = [a](std::size_t root, std::size_t end) {
        for (;;) {
            std::size_t child = 2 * root + 1;
            if (child >= end) return;
            if (child + 1 < end && a[child] < a[child + 1]) ++child;
            if (!(a[root] < a[child])) return;
            const std::uint32_t t = a[root];
            a[root] = a[child];
            a[child] = t;
            root = child;
        }
    };
    for (std::size_t i = n / 2; i-- > 0;)
        siftDown(i, n);
    for (std::size_t end = n - 1; end > 0; --end) {
        const std::uint32_t t = a[0];
        a[0] = a[end];
        a[end] = t;
        siftDown(0, end);
    }
}

struct SkyEstimate {
    double level = std::numeric_limits<double>::quiet_NaN(), rms = std::numeric_limits<double>::quiet_NaN();
    int n = 0;
    int ok = 0;
};

struct SkyParamsHD {
    double clipSigma;
    int clipIterations;
    int minPixels;
    int estimator; // SkyEstimator as int: 0 mean, 1 median, 2 mode
    double rmsCorrection;
};

// Clipped statistics of the ascending annulus values buf[0..n). The mean and standard deviation of any
// clipped range come from prefix sums of the deviations from buf[n/2]: read from s1/s2 (n + 1 entries,
// filled here) when given; else, with c1/c2 (n / kSkyCheckpoint + 1 entries, filled here), the running sums
// restarted from the checkpoint at or below the index (c1[k] = s1[k * kSkyCheckpoint]: the same additions in
// the same order, so the same numbers); else recomputed from 0 by the same running sums (no scratch). Buf: a
// const float* or anything whose buf[i] is that float (the GPU's sorted keys read as values).
inline constexpr std::size_t kSkyCheckpoint = 32;
template <class Buf>
GPUPHOT_HD inline SkyEstimate skyStatistics(const Buf& buf, std::size_t nAll, const SkyParamsHD& p, double* s1,
                                            double* s2, double* c1 = nullptr, double* c2 = nullptr) {
    SkyEstimate est;
    if (static_cast<long long>(nAll) < static_cast<long long>(std::max(2, p.minPixels))) {
        est.n = static_cast<int>(nAll);
        return est;
    }
    const double ref = buf[nAll / 2];
    if (s1) {
        s1[0] = s2[0] = 0.0;
        for (std::size_t i = 0; i < nAll; ++i) {
            const double d = static_cast<double>(buf[i]) - ref;
            s1[i + 1] = s1[i] + d;
            s2[i + 1] = s2[i] + d * d;
        }
    } else if (c1) {
        double p1 = 0.0, p2 = 0.0;
        for (std::size_t base = 0; base < nAll; base += kSkyCheckpoint) {
            c1[base / kSkyCheckpoint] = p1;
            c2[base / kSkyCheckpoint] = p2;
            const std::size_t end = base + kSkyCheckpoint < nAll ? base + kSkyCheckpoint : nAll;
            for (std::size_t i = base; i < end; ++i) {
                const double d = static_cast<double>(buf[i]) - ref;
                p1 = p1 + d;
                p2 = p2 + d * d;
            }
        }
        if (nAll % kSkyCheckpoint == 0) {
            c1[nAll / kSkyCheckpoint] = p1;
            c2[nAll / kSkyCheckpoint] = p2;
        }
    }
    // the prefix sums before index k from checkpoint k / kSkyCheckpoint
    auto fromCheckpoint = [&](std::size_t k, double& a1, double& a2) {
        double p1 = c1[k / kSkyCheckpoint], p2 = c2[k / kSkyCheckpoint];
        for (std::size_t i = k - k % kSkyCheckpoint; i < k; ++i) {
            const double d = static_cast<double>(buf[i]) - ref;
            p1 = p1 + d;
            p2 = p2 + d * d;
        }
        a1 = p1;
        a2 = p2;
    };
    // prefix sums at lo and hi (lo <= hi)
    auto prefixes = [&](std::size_t lo, std::size_t hi, double& a1, double& a2, double& b1, double& b2) {
        if (s1) {
            a1 = s1[lo];
            a2 = s2[lo];
            b1 = s1[hi];
            b2 = s2[hi];
            return;
        }
        if (c1) {
            fromCheckpoint(lo, a1, a2);
            fromCheckpoint(hi, b1, b2);
            return;
        }
        double p1 = 0.0, p2 = 0.0;
        a1 = a2 = 0.0;
        for (std::size_t i = 0; i < hi; ++i) {
            if (i == lo) {
                a1 = p1;
                a2 = p2;
            }
            const double d = static_cast<double>(buf[i]) - ref;
            p1 = p1 + d;
            p2 = p2 + d * d;
        }
        if (lo == hi) {
            a1 = p1;
            a2 = p2;
        }
        b1 = p1;
        b2 = p2;
    };
    std::size_t lo = 0, hi = nAll;
    double median = 0.0, mean = 0.0, sd = 0.0;
    auto stats = [&]() {
        const std::size_t n = hi - lo;
        const double m = static_cast<double>(n);
        const std::size_t mid = lo + n / 2;
        median = (n % 2) ? static_cast<double>(buf[mid])
                         : 0.5 * (static_cast<double>(buf[mid - 1]) + static_cast<double>(buf[mid]));
        double a1, a2, b1, b2;
        prefixes(lo, hi, a1, a2, b1, b2);
        const double dm = (b1 - a1) / m;
        mean = ref + dm;
        const double ss = (b2 - a2) - m * dm * dm;
        sd = n > 1 ? std::sqrt(std::max(0.0, ss) / (m - 1.0)) : 0.0;
    };
    stats();
    const bool clip = p.clipSigma > 0.0;
    for (int it = 0; clip && it < p.clipIterations; ++it) {
        const double lim = p.clipSigma * sd;
        const double vlo = median - lim, vhi = median + lim;
        std::size_t a = 0, b = nAll; // first value >= vlo
        while (a < b) {
            const std::size_t mid = a + (b - a) / 2;
            if (static_cast<double>(buf[mid]) < vlo) a = mid + 1; else b = mid;
        }
        const std::size_t nlo = a;
        a = 0;
        b = nAll; // first value > vhi
        while (a < b) {
            const std::size_t mid = a + (b - a) / 2;
            if (vhi < static_cast<double>(buf[mid])) b = mid; else a = mid + 1;
        }
        const std::size_t nhi = a;
        if ((nlo == lo && nhi == hi) || nhi - nlo < 2) break;
        lo = nlo;
        hi = nhi;
        stats();
    }
    est.n = static_cast<int>(hi - lo);
    if (est.n < p.minPixels) return est;
    switch (p.estimator) {
    case 0:
        est.level = mean;
        break;
    case 1:
        est.level = median;
        break;
    default:
        est.level = (sd > 0.0 && (mean - median) / sd > 0.3) ? median : 2.5 * median - 1.5 * mean;
        break;
    }
    est.rms = clip ? sd / p.rmsCorrection : sd;
    est.ok = 1;
    return est;
}

// ---- S/N-optimal aperture (pass 3) ----------------------------------------------------------------------

// The curve-of-growth grid of pass 3 (per grid radius: fraction, fraction^2, area pi r^2, kappa * area) and
// the noise model; the pointers address host or device arrays of n values.
struct OptimalGrid {
    const double* frac = nullptr;
    const double* num = nullptr;
    const double* area = nullptr;
    const double* kappaArea = nullptr;
    std::size_t n = 0;
    double gain = 0.0;
    bool poisson = false; // gain > 0
};

// One source of pass 3: predicted total flux F, sky variance per pixel, sky pixels (infinity: none counted).
struct OptimalJob {
    double F, var, nSky;
};

// The predicted variance of the flux inside a grid radius: F frac / gain + area var (1 + kappa area / nSky)
// (no Poisson term: 0 + ...).
GPUPHOT_HD inline double optimalVariance(bool poisson, double F, double frac, double gain, double area, double var,
                                         double kappaArea, double nSky) {
    if (poisson) return F * frac / gain + area * var * (1.0 + kappaArea / nSky);
    return 0.0 + area * var * (1.0 + kappaArea / nSky);
}

// The grid index maximising frac / sqrt(den(g)) by comparing frac^2 * denBest with fracBest^2 * den (no
// division), first of equals; grid radii with frac <= 0 or den <= 0 (or NaN) are skipped; n - 1 when none
// qualifies. den(g) gives optimalVariance at grid index g (an array on the host, computed in place on the
// device: the same numbers).
template <class Den>
GPUPHOT_HD inline std::size_t optimalGridIndex(const double* frac, const double* num, std::size_t n, Den&& den) {
    std::size_t bestG = n - 1;
    double bestNum = -1.0, bestDen = 1.0;
    for (std::size_t g = 0; g < n; ++g) {
        const double d = den(g);
        if (!(frac[g] > 0.0) || !(d > 0.0)) continue;
        if (bestNum < 0.0 || num[g] * bestDen > bestNum * d) {
            bestNum = num[g];
            bestDen = d;
            bestG = g;
        }
    }
    return bestG;
}

// ---- the engine the driver runs the loops on --------------------------------------------------------

struct CircleJob {
    double cx, cy;
    ApertureSky sky;
    std::int32_t ownId;
};

// Pass 1's sky of a source from its local sky estimate (the driver's rule, measureAperturesWith): ok: the
// annulus' level and rms^2; failed: the map's per-pixel sky when there is a map (level and var are not
// read then), else no level (NaN) and the variance fallbackRms^2 (readNoise / gain, or readNoise).
struct SkyJobRule {
    int haveMap = 0;
    double fallbackRms = 0.0;
};
GPUPHOT_HD inline ApertureSky skyOfEstimate(const SkyEstimate& est, const SkyJobRule& rule) {
    ApertureSky s;
    if (est.ok) {
        s.level = est.level;
        s.var = est.rms * est.rms;
    } else if (rule.haveMap) {
        s.perPixel = 1;
    } else {
        s.level = std::numeric_limits<double>::quiet_NaN();
        s.var = rule.fallbackRms * rule.fallbackRms;
    }
    return s;
}

// The driver's per-batch buffers; an engine may keep them for its next call (ApertureEngine::scratch(): the
// CUDA engine keeps them in its DeviceContext, so that a re-run of similar size finds them sized and
// touched). Every entry the driver reads in a batch is written in that batch first.
struct ApertureScratch {
    std::vector<std::size_t> idx;
    std::vector<double> cxs, cys;
    std::vector<SkyEstimate> skies;
    std::vector<CircleJob> jobs;
    std::vector<ApertureSums> sums;
    std::vector<ApertureFlagDistances> fds;
    std::vector<KronJob> kronJobs;
    std::vector<KronOut> kronOut;
    std::vector<std::uint32_t> bflags;
    // pass 3
    std::vector<OptimalJob> optJobs;
    std::vector<std::int32_t> optIndex;
    std::vector<std::uint8_t> measured;
    std::vector<std::size_t> slot;
    std::vector<double> fracs;
    // pass 2's and pass 3's jobs and results (pass 1's buffers keep their sizes for the next call: a re-run
    // then finds them sized and touched)
    std::vector<std::size_t> idx3;
    std::vector<double> radii3;
    std::vector<CircleJob> jobs2, jobs3;
    std::vector<ApertureSums> sums2, sums3;
    std::vector<ApertureFlagDistances> fds2, fds3;
};

class ApertureEngine {
public:
    virtual ~ApertureEngine() = default;
    // Sources per batch (the driver checks for cancellation and reports progress between batches).
    virtual std::size_t batchSize() const = 0;
    // Called once after validation, before any batch: the frame and its companions (views may be empty;
    // level/rms empty when there is no background map).
    virtual void begin(const ImageView& image, const MaskView& mask, const ImageViewT<std::int32_t>& seg,
                       const ImageView& level, const ImageView& rms, double saturation,
                       NeighbourPixels neighbours) = 0;
    // After begin, when the background has no full maps but an on-demand sampler: false when the engine
    // cannot use one (then the stage needs full maps).
    virtual bool setMapSampler(const BackgroundSampler* /*sampler*/) { return false; }
    // Local sky of n sources (centres finite).
    virtual void localSkies(const double* cx, const double* cy, std::size_t n, double rin, double rout,
                            const SkyParamsHD& p, SkyEstimate* out) = 0;
    // Sums in ascending radii for n jobs: job i uses radii + i * radiiStride (radiiStride 0: one list for
    // all), nr radii each; out[i * nr + k], fd[i].
    virtual void sumCircles(const CircleJob* jobs, std::size_t n, const double* radii, std::size_t nr,
                            std::size_t radiiStride, ApertureSums* out, ApertureFlagDistances* fd) = 0;
    virtual void kron(const KronJob* jobs, std::size_t n, const KronParamsHD& p, KronOut* out) = 0;
    // Asynchronous forms of localSkies, sumCircles and kron: the engine may return before the results are in
    // `out` (and fd); they are there after finish(ticket), which completes every call up to that ticket
    // (-1: all). The inputs may be reused at once; the outputs must stay valid until then. Defaults: the
    // synchronous calls (ticket 0).
    virtual int localSkiesAsync(const double* cx, const double* cy, std::size_t n, double rin, double rout,
                                const SkyParamsHD& p, SkyEstimate* out) {
        localSkies(cx, cy, n, rin, rout, p, out);
        return 0;
    }
    virtual int sumCirclesAsync(const CircleJob* jobs, std::size_t n, const double* radii, std::size_t nr,
                                std::size_t radiiStride, ApertureSums* out, ApertureFlagDistances* fd) {
        sumCircles(jobs, n, radii, nr, radiiStride, out, fd);
        return 0;
    }
    virtual int kronAsync(const KronJob* jobs, std::size_t n, const KronParamsHD& p, KronOut* out) {
        kron(jobs, n, p, out);
        return 0;
    }
    virtual void finish(int /*ticket*/ = -1) {}
    // The driver's batch buffers kept across calls, or null (the driver's own for this call).
    virtual ApertureScratch* scratch() { return nullptr; }
    // Pass 3's grid index (optimalGridIndex) of n jobs into index: false when the engine leaves it to the
    // driver's host loop (the CPU engine).
    virtual bool optimalRadii(const OptimalJob* /*jobs*/, std::size_t /*n*/, const OptimalGrid& /*grid*/,
                              std::int32_t* /*index*/) {
        return false;
    }
    // Pass 1's circles (one radius list for all) and Kron queued behind the local skies of skyTicket (the
    // localSkiesAsync call of these n sources), each job's sky set by the engine from its estimate
    // (skyOfEstimate; the sky fields of jobs and kronJobs are not read), so that the engine need not wait for
    // the host: tickets as sumCirclesAsync's and kronAsync's. false: not chained, nothing queued (the driver
    // sets the skies and calls those two).
    virtual bool chainPass1(int /*skyTicket*/, const SkyJobRule& /*rule*/, const CircleJob* /*jobs*/,
                            std::size_t /*n*/, const double* /*radii*/, std::size_t /*nr*/,
                            ApertureSums* /*out*/, ApertureFlagDistances* /*fd*/, const KronJob* /*kronJobs*/,
                            const KronParamsHD& /*kp*/, KronOut* /*kronOut*/, int& /*circleTicket*/,
                            int& /*kronTicket*/) {
        return false;
    }
    // Pass 3 in one call: optimalRadii's index of the n jobs into index, and for each measured job c
    // (slot[c] < slot[c + 1], slot: n + 1 entries) circle slot[c] = circles[slot[c]] with the radius
    // gridRadius[index[c]] (sumCircles with one radius per job): out and fd, m = slot[n] entries. false: not
    // supported, nothing done (the driver calls optimalRadii, then sumCircles).
    virtual bool optimalCircles(const OptimalJob* /*jobs*/, std::size_t /*n*/, const OptimalGrid& /*grid*/,
                                const double* /*gridRadius*/, const std::size_t* /*slot*/,
                                const CircleJob* /*circles*/, std::size_t /*m*/, std::int32_t* /*index*/,
                                ApertureSums* /*out*/, ApertureFlagDistances* /*fd*/) {
        return false;
    }
    // Whether the driver visits the sources in a spatial order (bands of rows, then x: neighbouring apertures
    // share the CPU's caches); false: in their own order. Every result is per source: no number changes.
    virtual bool spatialOrder() const { return true; }
};

// The stage (validation, passes, flags, curve of growth) on the given engine; cpu::measureApertures is
// this with the CPU engine.
ApertureResult measureAperturesWith(ApertureEngine& engine, const ImageView& image, const MaskView& mask,
                                    const BackgroundResult& bkg, const ImageViewT<std::int32_t>& segmentation,
                                    const Sources& sources, double fwhm, double gain, double readNoise,
                                    const ApertureParams& params, RunContext& ctx);

} // namespace detail
} // namespace gpuphot
