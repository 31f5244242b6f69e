#include "core/pipeline/frame_checks.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/model/frame.hpp"
#include "core/util/errors.hpp"

namespace gpuphot {

FrameStats frameStats(const Frame& frame) {
    FrameStats s;
    s.pixels = frame.pixels.pixelCount();
    double lo = std::numeric_limits<double>::infinity(), hi = -lo;
    std::size_t valid = 0, saturated = 0;
    const bool haveMask = !frame.mask.empty();
#pragma omp parallel for schedule(static) reduction(+ : valid, saturated) reduction(min : lo) reduction(max : hi)
    for (int y = 0; y < frame.height(); ++y) {
        const float* row = frame.pixels.row(y);
        const std::uint8_t* m = haveMask ? frame.mask.row(y) : nullptr;
        for (int x = 0; x < frame.width(); ++x) {
            if (m && (m[x] & MaskSaturated)) ++saturated;
            if (!std::isfinite(row[x]) || (m && m[x])) continue;
            ++valid;
            lo = std::min<double>(lo, row[x]);
            hi = std::max<double>(hi, row[x]);
        }
    }
    s.valid = valid;
    s.saturated = saturated;
    s.min = valid ? lo : std::nan("");
    s.max = valid ? hi : std::nan("");
    return s;
}

FrameStats validateForReduction(const Frame& frame) {
    const std::string name = frame.path.empty() ? std::string("frame") : frame.path;
    if (frame.pixels.empty()) throw InvalidInput(name + ": empty image");
    if (frame.width() < kMinFrameAxis || frame.height() < kMinFrameAxis)
        throw InvalidInput(name + ": image too small to reduce (" + std::to_string(frame.width()) + " x " +
                           std::to_string(frame.height()) + " pixels; at least " + std::to_string(kMinFrameAxis) +
                           " x " + std::to_string(kMinFrameAxis) + " needed): a wrong HDU or a placeholder?");
    FrameStats s = frameStats(frame);
    if (s.saturated == s.pixels)
        throw InvalidInput(name + ": every pixel is saturated (at or above SATURATE " +
                           std::to_string(frame.instrument.saturation) + " ADU): nothing to measure");
    if (s.valid == 0)
        throw InvalidInput(name + ": no valid pixels (all NaN, blank or masked)");
    if (s.min == s.max)
        throw InvalidInput(name + ": the image is constant (every valid pixel is " + std::to_string(s.min) +
                           "): no variance, nothing to detect");
    return s;
}

} // namespace gpuphot
