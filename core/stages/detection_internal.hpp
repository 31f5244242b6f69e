#pragma once
// Internals of the detection stage shared by detection*.cpp (not a public API).
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/model/image.hpp"
#include "core/stages/background.hpp"
#include "core/stages/detection.hpp"

namespace gpuphot {
class RunContext;
}

namespace gpuphot::detail {

// A horizontal run of object pixels [x0, x1] (inclusive) in row y.
struct Run {
    std::int32_t y, x0, x1;
};

// 8-connected components of runs sorted in raster order (y, then x0), non-overlapping. Returns the
// component of each run; components are numbered 0.. in order of their first run (raster order of
// their first pixel). Independent of any thread count.
std::vector<std::int32_t> labelRuns(const Run* runs, std::size_t n, std::int32_t& nComponents);

inline std::int64_t runsArea(const std::vector<Run>& runs) {
    std::int64_t a = 0;
    for (const Run& r : runs)
        a += r.x1 - r.x0 + 1;
    return a;
}

// Per-pixel state bits.
enum PixelState : std::uint8_t {
    StateBad = 1,       // value replaced by 0 (background), may belong to an object
    StateInvalid = 2,   // never detected
    StateSaturated = 4, // MaskSaturated or raw value >= saturation level
};

struct DetectionImages {
    int width = 0, height = 0;
    ImageView sub; // background-subtracted, bad pixels 0
    ImageView det; // filtered sub (== sub without filter)
    ImageView rms; // empty when rmsSampler gives the rms map
    const BackgroundSampler* rmsSampler = nullptr;
    ImageViewT<std::uint8_t> state;
    double threshold = 0.0;
    bool absolute = false;
    // Owner of det's pixels when detectFromRuns may free them once no step reads them (null: kept).
    Image<float>* releasableDet = nullptr;

    float rmsAt(int x, int y) const { return rms.data ? rms(x, y) : rmsSampler->rmsAt(x, y); }
    double thresholdAt(int x, int y) const {
        return absolute ? threshold : threshold * static_cast<double>(rmsAt(x, y));
    }
    bool above(int x, int y) const {
        return !(state(x, y) & StateInvalid) && static_cast<double>(det(x, y)) > thresholdAt(x, y);
    }
};

// Deblending of one connected region.
struct DeblendOutput {
    std::vector<std::vector<Run>> children; // one entry (the root itself) when not split
    bool split = false;
    bool overflow = false;
};
void deblendObject(const std::vector<Run>& root, const DetectionImages& im, const DetectionParams& p,
                   DeblendOutput& out);

// Isophotal measurements of one object (all pixels of its footprint, raster order, double sums).
struct IsoMeasure {
    double flux = 0.0, fluxVar = 0.0;
    std::int32_t area = 0;
    double xIso = 0.0, yIso = 0.0, x2 = 0.0, y2 = 0.0, xy = 0.0, a = 0.0, b = 0.0, theta = 0.0;
    double cxx = 0.0, cyy = 0.0, cxy = 0.0; // r^2 = cxx dx^2 + cyy dy^2 + cxy dx dy, in units of sigma
    double peak = 0.0;                      // unfiltered
    double detPeak = 0.0;                   // filtered
    std::int32_t detPeakX = 0, detPeakY = 0;
    double thrAtPeak = 0.0;
    std::int32_t xMin = 0, xMax = 0, yMin = 0, yMax = 0;
    std::uint32_t flags = 0; // saturated, edge, bad pixels
};
IsoMeasure measureIsophotal(const std::vector<Run>& runs, const DetectionImages& im,
                            const DetectionParams& p);

// Windowed centroid (XWIN/YWIN) and its error.
struct WindowResult {
    double x = 0.0, y = 0.0, xErr = 0.0, yErr = 0.0;
};
WindowResult measureWindowed(const IsoMeasure& m, const std::vector<Run>& runs, std::int32_t segId,
                             const Image<std::int32_t>& seg, const DetectionImages& im,
                             const DetectionParams& p);

// CLEAN: for each object the index of the brighter object it is merged into, or -1.
std::vector<std::int32_t> cleanTargets(const std::vector<IsoMeasure>& m, const DetectionImages& im,
                                       const DetectionParams& p, int threads);
// The same with the objects' footprints given (index as m), so they need not be rebuilt from the images.
std::vector<std::int32_t> cleanTargets(const std::vector<IsoMeasure>& m,
                                       const std::vector<const std::vector<Run>*>& footprints,
                                       const DetectionImages& im, const DetectionParams& p, int threads);

// One object (a deblended branch, or a region that was not split): its pixels as runs in raster order.
struct Object {
    std::vector<Run> runs;
    std::uint32_t flags = 0; // FlagBlended, FlagDeblendOverflow
};

// Steps 2b-4 of the per-object half: the objects after labelling, minimum area, deblending and CLEAN,
// with their isophotal measurements (any order; finishDetection sorts them).
struct DetectedObjects {
    std::vector<Object> objects;
    std::vector<IsoMeasure> iso; // index as objects
    std::size_t nBeforeDeblend = 0, nDeblended = 0, nCleaned = 0;
};
DetectedObjects detectObjects(std::vector<Run> runs, const DetectionImages& im, const DetectionParams& p,
                              RunContext& ctx);
// Steps 5-6: final order (first pixel in raster order), segmentation map, windowed positions, the Sources
// columns. Frees im.releasableDet first.
void finishDetection(DetectedObjects found, const DetectionImages& im, const DetectionParams& p, RunContext& ctx,
                     DetectionResult& result);

// The per-object half of detection, shared by the CPU and CUDA backends: labels the above-threshold runs
// (raster order), applies the minimum area, deblends, measures, cleans and fills the result. `im` must
// stay valid for the call; `runs` is consumed.
DetectionResult detectFromRuns(std::vector<Run> runs, const DetectionImages& im, const DetectionParams& p,
                               RunContext& ctx);

} // namespace gpuphot::detail
