#pragma once
// Stage 2: detection with multi-threshold deblending and cleaning, with SExtractor semantics.
//   background-subtracted image -> optional matched filter -> per-pixel threshold -> 8-connected
//   regions of at least minArea pixels -> deblending (DEBLEND_NTHRESH / DEBLEND_MINCONT) -> cleaning
//   (CLEAN / CLEAN_PARAM) -> isophotal and windowed measurements, segmentation map.
// Deterministic: the same input gives the same output bit for bit for any thread count (fixed
// operation orders, double accumulators over each object's pixels in raster order, no float atomics).
// Object order: by the object's first pixel in raster order (y, then x).
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/model/image.hpp"
#include "core/model/segmentation_map.hpp"
#include "core/model/sources.hpp"

namespace gpuphot {

class RunContext;
struct BackgroundResult;

struct DetectionParams {
    double threshold = 1.5; // DETECT_THRESH: in units of the local background RMS, or ADU when absolute
    bool thresholdIsAbsolute = false; // THRESH_TYPE ABSOLUTE
    int minArea = 5;                  // DETECT_MINAREA, px (also the minimum area of a deblended branch)
    bool filter = true;               // FILTER
    double filterFwhm = 3.0;          // px; Gaussian matched filter (FILTER_NAME gauss_<fwhm>_<n>x<n>.conv)
    // A supplied kernel instead of the Gaussian (FILTER_NAME with CONV NORM): row-major, odd sizes,
    // normalised to a sum of 1 when its sum is non-zero. Empty: the Gaussian above.
    std::vector<float> filterKernel;
    int filterKernelWidth = 0;      // px; height = filterKernel.size() / filterKernelWidth
    int deblendLevels = 32;         // DEBLEND_NTHRESH (1: no deblending)
    double deblendContrast = 0.005; // DEBLEND_MINCONT, fraction of the parent's (filtered) flux
    int deblendMaxChildren = 1024;  // more branches than this in one blend: stop, FlagDeblendOverflow
    bool clean = true;              // CLEAN
    double cleanParam =
        1.0;           // CLEAN_PARAM: Moffat beta of the wing model (smaller: wider wings, more cleaning)
    double gain = 0.0; // GAIN, e-/ADU for flux errors (0: background noise only, as SExtractor)
    double saturationLevel = std::numeric_limits<double>::infinity(); // SATUR_LEVEL, ADU (raw pixel value)
    // SExtractor's isophotal measurement: barycentre, second moments and ellipse (X_IMAGE, A_IMAGE, the Kron
    // ellipse) weighted by the filtered image, area_iso the pixels whose unfiltered value is above the
    // threshold (ISOAREA_IMAGE); false: weighted by the unfiltered image, area_iso the footprint.
    bool sextractorIso = false;
    // SExtractor's CLEAN order: objects in the order a scan completes them, each against the kept ones
    // before it, fluxes growing as objects merge; false: each against its brighter neighbours' original
    // wings, in order of brightness (independent of the scan).
    bool sextractorClean = false;
    // XWIN/YWIN window (SExtractor: Gaussian of sigma = d50 / 2.35, d50 = half-light diameter): here the
    // half-light radius comes from the isophotal pixels' growth curve around the barycentre.
    double windowSigmaFactor = 2.0 / 2.35482; // sigma = factor * half-light radius
    double windowMinSigma = 0.5;              // px, floor of the window sigma
    // px, ceiling of the window sigma (0: none). A streak or bleed object of the bundled demo frame had a
    // half-light radius of 298 px: a 1146 x 1867 px window, 16 times (0.5 s of the CPU detection); at 50 px
    // (a 400 px window) only objects with a half-light radius over ~59 px are affected.
    double windowMaxSigma = 50.0;
    int windowMaxIterations = 16;  // WINPOS_NITERMAX
    double windowTolerance = 2e-4; // px, the iteration stops when a step is shorter
};

void to_json(nlohmann::json& j, const DetectionParams& p);
void from_json(const nlohmann::json& j, DetectionParams& p); // missing keys keep their defaults

struct DetectionResult {
    Sources sources; // every column filled; segmentId = index + 1
    // 0 = no object, else segmentId of the owning object. Shared and immutable (copies are O(1)); the CUDA
    // detection leaves it on the device until a host consumer calls segmentation.host().
    SegmentationMap segmentation;
    std::size_t nBeforeDeblend = 0; // connected regions of >= minArea pixels
    std::size_t nDeblended = 0;     // objects after deblending
    std::size_t nCleaned = 0;       // objects merged into a brighter neighbour by cleaning
};

// image: the frame's pixels; mask: optional (empty view = none), MaskBits: MaskBad / MaskCosmicRay
// pixels count as background (value 0 after subtraction) but may lie inside an isophote (FlagBadPixels);
// MaskNonFinite / MaskOutside and non-finite pixels are never detected; MaskSaturated sets FlagSaturated.
// bkg: level and rms maps of the image's size. Throws InvalidInput for inconsistent sizes or parameters.
DetectionResult detectSources(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                              const DetectionParams& params, RunContext& ctx);
namespace cpu {
DetectionResult detectSources(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                              const DetectionParams& params, RunContext& ctx);

// The images a detection thresholds (background-subtracted pixels, pixel states, the filtered image: about
// 9 B/px), for a caller that detects again on the same frame and background with another threshold (the
// workbench's edits).
struct DetectionInputImages;
// The same result; `kept` holds the images: reused when they were made with the same filter and saturation
// level (any threshold), else made anew and kept there. The caller keeps `kept` with the image, mask and
// background it was made from and drops it when any of them changes.
DetectionResult detectSourcesKeeping(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                                     const DetectionParams& params, RunContext& ctx,
                                     std::shared_ptr<const DetectionInputImages>& kept);
} // namespace cpu

} // namespace gpuphot
