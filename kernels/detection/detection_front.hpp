#pragma once
// The CUDA detection stage's per-pixel front on its own (kernels/detection/detection.cu), for tests that compare it
// with core's detail::prepareDetection: background subtraction, pixel states, the matched filter, the
// threshold and the above-threshold runs, in each of the stage's plans.
#include <string>
#include <vector>

#include "core/model/image.hpp"
#include "core/stages/detection/detection.hpp"
#include "core/stages/detection/detection_internal.hpp"

namespace gpuphot {
class RunContext;
struct BackgroundResult;
namespace cuda {

enum class FrontPlan {
    WholeDevice, // frame and maps resident, det and state kept on the device (the device per-object half)
    WholeHost, // frame and maps resident, sub, det and state downloaded per chunk (the host per-object half)
    Strips,    // rows uploaded strip by strip, sub, det and state downloaded
};

struct DetectionFrontResult {
    std::vector<detail::Run> runs; // raster order
    Image<float> sub;              // host plans only
    Image<float> det;              // the filtered image; empty without a filter
    Image<std::uint8_t> state;     // detail::PixelState bits
    bool deviceRuns = false;       // WholeDevice: the device copy of the runs equals `runs`
};

// rows: rows per chunk (whole plans) or per strip (strips); 0: the stage's chunking (whole) or the budget's
// (strips). Throws what the stage's kernels throw (no re-planning, no CPU fallback); the parameters must be
// ones the stage takes (a rejected set throws InvalidInput).
DetectionFrontResult detectionFront(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                                    const DetectionParams& p, RunContext& ctx, FrontPlan plan, int rows = 0);

} // namespace cuda
} // namespace gpuphot
