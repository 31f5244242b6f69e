#pragma once
// Stage 1: background and its RMS, as SExtractor/sep (mesh statistics, sigma clipping, mode
// estimator, median filter over meshes, bicubic spline to full resolution).
//
// The CPU implementation is the reference that the CUDA one reproduces bit for bit, so the operation
// order of every floating-point step is fixed and documented here:
//  - Mesh statistics: a pixel is valid when it is finite, mask == 0 and sourceMask == 0. Sums of v and
//    v*v (double; v*v of a float is exact in double) are taken per mesh row from left to right, and the
//    row partials are added from the top row down. Clip 1: [mean - 2 sigma, mean + 2 sigma] (cuts rounded
//    to float); mean and sigma of the pixels within the cuts give qzero = mean - 5 sigma and
//    qscale = 10 sigma / nlevels (1 when sigma = 0), both rounded to float. Histogram: nlevels =
//    int(sqrt(2/pi) * 5/4 * n + 1) <= 4096 bins over mean +- 5 sigma; bin = int(v / qscale + (0.499999 -
//    qzero / qscale)) in float, counted when -1 < t < nlevels (integer counts: order independent). Mode:
//    iterative 3-sigma clipping of the histogram around its median until sigma changes by < 1e-4 (relative)
//    or drops below 0.1 bin (<= 100 rounds); mode = 2.5 median - 1.5 mean, or the median when |mean - median|
//    >= 0.3 sigma (SExtractor). Histogram moments are integer sums (exact), converted to double at the end.
//  - Meshes with fewer than minGoodFraction valid pixels are bad: they take the average of the nearest
//    good meshes (Euclidean distance in meshes; ties averaged in row-major order, in double).
//  - Median filter: window filterSize x filterHeight shrunk symmetrically at the edges (as SExtractor),
//    applied where |median - value| >= filterThreshold; the RMS mesh takes the median of its window where
//    the level does.
//  - Spline: natural cubic splines through the mesh nodes (node k at pixel (k + 0.5) * mesh - 0.5 on
//    both axes; sextractorSpline: as sep, see Params), extrapolated beyond the outer nodes (partial last
//    meshes keep the regular node spacing, as sep); the tensor-product coefficients are computed once
//    on the host in double (BackgroundSpline). Per row: node values and their x second derivatives in
//    double, ((wa * g[lo] + wb * g[lo+1]) + wa3 * h[lo]) + wb3 * h[lo+1] with the row weights and (g, h) =
//    (v, dyy) for n, (dxx, dxxyy) for d, rounded to float; per pixel, in float:
//        ((wa * n[k] + wb * n[k+1]) + wa3 * d[k]) + wb3 * d[k+1]
//    with the column weights of BackgroundSpline::columns.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/model/image.hpp"

namespace gpuphot {

class RunContext;
class BackgroundSampler;

struct BackgroundParams {
    int meshSize = 64;    // px, mesh width (and height when meshHeight = 0); SExtractor BACK_SIZE, sep bw
    int meshHeight = 0;   // px, 0: same as meshSize; second value of BACK_SIZE, sep bh
    int filterSize = 3;   // meshes, median-filter width (and height when filterHeight = 0);
                          // SExtractor BACK_FILTERSIZE, sep fw
    int filterHeight = 0; // meshes, 0: same as filterSize; sep fh
    double filterThreshold = 0.0;  // ADU, replace a mesh by its filtered value only when they differ by at
                                   // least this much; SExtractor BACK_FILTTHRESH, sep fthresh
    double minGoodFraction = 0.5;  // fraction of valid pixels a mesh needs; SExtractor's BACK_MINGOODFRAC
    bool fullMaps = true;          // fill level/rms at full resolution; false: mesh grids only (evaluate
                                   // strips with interpolateBackground)
    bool sextractorSpline = false; // reproduce SExtractor/sep's interpolation exactly (maps within float
                                   // rounding of sep_bkg_array): row nodes half a pixel low and their damped
                                   // spline back-substitution; false: exact natural splines, centred nodes
    bool uniformRms = false;       // one RMS for the frame, the median of the mesh RMS grid (SExtractor's
                                   // WEIGHT_TYPE NONE: thresholds and errors against its global RMS)
    std::optional<double> manualLevel; // ADU, a constant background level instead of the measured one (the
                                       // RMS is still measured); SExtractor's BACK_TYPE MANUAL, BACK_VALUE

    int meshW() const { return meshSize; }
    int meshH() const { return meshHeight > 0 ? meshHeight : meshSize; }
    int filterW() const { return filterSize; }
    int filterH() const { return filterHeight > 0 ? filterHeight : filterSize; }
};

// JSON through the stage's parameter table (its _params.cpp: keys, ranges and meanings).
void to_json(nlohmann::json& j, const BackgroundParams& p);
void from_json(const nlohmann::json& j, BackgroundParams& p);

struct BackgroundResult {
    Image<float> level;     // full-resolution background (ADU); empty when !params.fullMaps
    Image<float> rms;       // full-resolution background RMS (ADU); empty when !params.fullMaps
    Image<float> meshLevel; // per-mesh values after filtering (nx x ny)
    Image<float> meshRms;
    double globalLevel = 0.0; // sep's globalback: median of meshLevel
    double globalRms = 0.0;   // sep's globalrms: median of meshRms (of its positive values when <= 0)

    int width = 0; // px, the frame the maps describe
    int height = 0;
    int meshWidth = 0;        // px
    int meshHeight = 0;       // px
    int badMeshes = 0;        // meshes with too few valid pixels, filled from their nearest good neighbours
    double weightScale = 0.0; // applyWeightVariance: the factor on the weight map's RMS (0: no weight map)
    bool sextractorSpline = false; // BackgroundParams::sextractorSpline used for the maps
    // The maps without storing them (set by the pipeline when it keeps no full maps, CPU backend): exact
    // per-pixel values, bit for bit those of level/rms. Null when none.
    std::shared_ptr<const BackgroundSampler> sampler;

    bool hasFullMaps() const { return !level.empty() && !rms.empty(); }
    // The level/rms map pixel from the full map when kept, else from the sampler (needs one of the two).
    float levelAt(int x, int y) const;
    float rmsAt(int x, int y) const;
};

// mask: optional (empty view = none); pixels with any mask bit set are excluded.
// sourceMask: optional (second pass), same size as image; pixels where it is != 0 are excluded (e.g. a
// dilated segmentation map).
// Throws InvalidInput for an empty image, bad parameters or masks of another size; Cancelled through ctx.
BackgroundResult estimateBackground(const ImageView& image, const MaskView& mask,
                                    const BackgroundParams& params, RunContext& ctx,
                                    const ImageViewT<std::int32_t>* sourceMask = nullptr);
namespace cpu {
BackgroundResult estimateBackground(const ImageView& image, const MaskView& mask,
                                    const BackgroundParams& params, RunContext& ctx,
                                    const ImageViewT<std::int32_t>* sourceMask = nullptr);
}

// Host-side bicubic-spline coefficients of a mesh grid (shared by the CPU and CUDA paths). For each node,
// row-major ny x nx: the value, its natural-spline second derivative along y divided by 6 (dyy), along x
// divided by 6 (dxx), and the x second derivative of dyy divided by 6 (dxxyy). One extra zero node at the
// end of each row and one extra zero row keep the two-node formula valid for a single mesh.
struct SplineGrid {
    int nx = 0;
    int ny = 0;
    std::vector<double> v, dyy, dxx, dxxyy; // (ny + 1) x (nx + 1), row stride nx + 1
};

struct SplineWeights {
    std::vector<std::int32_t> lo;         // lower node index per pixel (0 .. n-2, 0 when n == 1)
    std::vector<double> wa, wb, wa3, wb3; // 1-d, d, (1-d)^3-(1-d), d^3-d (zero but wa = 1 when n == 1)
};

struct BackgroundSpline {
    SplineGrid level, rms;
    SplineWeights rows;    // per image row (double)
    SplineWeights columns; // per image column (used as float in the per-pixel step)
};

namespace detail {
// One mesh's statistics before the grid steps (level, rms in ADU; bad: too few valid pixels).
struct MeshStat {
    float level = 0.0f;
    float rms = 0.0f;
    bool bad = false;
};
// Step 2 of the stage on the mesh grid (row-major, nx x ny), shared by the CPU and CUDA backends: fills
// bad meshes from their nearest good ones, applies the median filter, and sets res.meshLevel, meshRms,
// globalLevel, globalRms and badMeshes; the median filter on `threads` threads (the same result on any).
void finishMeshGrid(std::vector<MeshStat>& meshes, int nx, int ny, const BackgroundParams& params,
                    BackgroundResult& res, int threads);
// The stage's input checks, shared by both backends: throws InvalidInput for an empty image, bad
// parameters or masks of another size; returns the source mask to use (null when none or empty).
const ImageViewT<std::int32_t>* validateBackgroundInputs(const ImageView& image, const MaskView& mask,
                                                         const BackgroundParams& params,
                                                         const ImageViewT<std::int32_t>* sourceMask);
} // namespace detail

BackgroundSpline makeBackgroundSpline(const BackgroundResult& bkg);

// Evaluates level and/or rms (either may be null) for rows [y0, y0 + rows) into buffers whose row stride
// is `stride` floats (row y0 at the buffer start), exactly as estimateBackground fills its full maps.
void interpolateBackground(const BackgroundResult& bkg, const BackgroundSpline& spline, int y0, int rows,
                           float* level, float* rms, std::ptrdiff_t stride, RunContext& ctx);

// Exact on-demand values of the full-resolution maps from the mesh grid: the per-row node values
// (float, computed as interpolateBackground does) and the column weights, about 16 bytes per image row
// and mesh column (0.25 B/px at 64 px meshes) instead of 8 B/px for the two maps. levelAt/rmsAt and rows()
// give the maps' pixels bit for bit (the same float operations in the same order).
class BackgroundSampler {
public:
    BackgroundSampler() = default;
    // Throws InvalidInput when bkg has no mesh grid.
    BackgroundSampler(const BackgroundResult& bkg, RunContext& ctx);

    int width() const { return m_width; }
    int height() const { return m_height; }
    float levelAt(int x, int y) const { return eval(m_levelN, m_levelD, x, y); }
    float rmsAt(int x, int y) const { return eval(m_rmsN, m_rmsD, x, y); }
    // Row y of the level and/or rms map (either may be null) into buffers of width() floats.
    void row(int y, float* level, float* rms) const;
    // Pixels x0 .. x0 + n - 1 of row y of the rms map (inside the image) into out[0 .. n).
    void rmsSpan(int y, int x0, int n, float* out) const;

private:
    // The node tables are written in full by the parallel fill: allocated without zeroing, so that their
    // pages are first touched there, by all threads (tens of MB at 151 MP).
    template <class T> struct UninitAllocator : std::allocator<T> {
        template <class U> struct rebind { using other = UninitAllocator<U>; };
        template <class U> void construct(U* p) { ::new (static_cast<void*>(p)) U; }
    };
    using Nodes = std::vector<float, UninitAllocator<float>>;

    float eval(const Nodes& n, const Nodes& d, int x, int y) const {
        const std::size_t o = static_cast<std::size_t>(y) * m_stride + static_cast<std::size_t>(m_lo[x]);
        return ((m_ca[x] * n[o] + m_cb[x] * n[o + 1]) + m_ca3[x] * d[o]) + m_cb3[x] * d[o + 1];
    }
    void rowOf(const Nodes& n, const Nodes& d, int y, float* out) const { spanOf(n, d, y, 0, m_width, out); }
    void spanOf(const Nodes& n, const Nodes& d, int y, int x0, int x1,
                float* out) const; // out[x - x0] for x0 <= x < x1

    int m_width = 0, m_height = 0;
    std::size_t m_stride = 0; // nodes per row: nx + 1
    // height x stride node values and their x second derivatives / 6, per map
    Nodes m_levelN, m_levelD, m_rmsN, m_rmsD;
    std::vector<std::int32_t> m_lo;              // per column: lower node
    std::vector<float> m_ca, m_cb, m_ca3, m_cb3; // per column weights (float)
    std::vector<int> m_runStart, m_runNode;      // runs of columns sharing one node interval
};

inline float BackgroundResult::levelAt(int x, int y) const {
    return !level.empty() ? level(x, y) : sampler->levelAt(x, y);
}
inline float BackgroundResult::rmsAt(int x, int y) const {
    return !rms.empty() ? rms(x, y) : sampler->rmsAt(x, y);
}

// Fills bkg.level and bkg.rms from its mesh grid (the same pixels as estimateBackground's full maps).
void materializeBackgroundMaps(BackgroundResult& bkg, RunContext& ctx);

// An external weight map's RMS in place of the background's (Frame::weightVariance, frame preparation):
// bkg gets full maps (the level from its mesh grid, no sampler) and rms = scale * sqrt(variance), where
// the variance is finite; unusable pixels (+infinity, masked) keep the background's RMS. With rescale, the
// scale is the median over meshes of the background's mesh RMS over the square root of the mesh's mean
// usable variance (`mask` applied), as SExtractor's RESCALE_WEIGHTS; else 1. Sets bkg.weightScale. Throws
// InvalidInput for a variance of another size.
void applyWeightVariance(BackgroundResult& bkg, const Image<float>& variance, bool rescale,
                         const MaskView& mask, RunContext& ctx);

} // namespace gpuphot
