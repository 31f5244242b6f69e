#pragma once
// Stage 1: background and its RMS, as SExtractor/sep (mesh statistics, sigma clipping, mode
// estimator, median filter over meshes, bicubic spline to full resolution).
#include <nlohmann/json.hpp>

#include "core/model/image.hpp"

namespace gpuphot {

class RunContext;

struct BackgroundParams {
    int meshSize = 64;   // px, SExtractor BACK_SIZE / sep bw=bh
    int filterSize = 3;  // meshes, SExtractor BACK_FILTERSIZE / sep fw=fh
    // (the stage's author adds the remaining parameters here, each with units and the SExtractor/sep name)
};

struct BackgroundResult {
    Image<float> level;        // full-resolution background (ADU)
    Image<float> rms;          // full-resolution background RMS (ADU)
    Image<float> meshLevel;    // per-mesh values after filtering (nx x ny)
    Image<float> meshRms;
    double globalLevel = 0.0;  // sep's globalback
    double globalRms = 0.0;    // sep's globalrms
};

// mask: optional (empty view = none); pixels with any mask bit set are excluded.
BackgroundResult estimateBackground(const ImageView& image, const MaskView& mask, const BackgroundParams& params,
                                    RunContext& ctx);

} // namespace gpuphot
