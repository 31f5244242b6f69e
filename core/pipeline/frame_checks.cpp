#include "core/pipeline/frame_checks.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/model/frame.hpp"
#include "core/model/pixel_stats.hpp"
#include "core/util/errors.hpp"

namespace gpuphot {

FrameStats frameStats(const Frame& frame) {
    const bool haveMask = !frame.mask.empty();
    const PixelStats* known = frame.readStats ? &*frame.readStats : nullptr;
    PixelStats all;
    if (known && known->pixelsSerial == frame.pixels.serial() && known->maskSerial == frame.mask.serial() &&
        known->pixels == frame.pixels.pixelCount()) {
        all = *known;
    } else {
        float lo = std::numeric_limits<float>::infinity(), hi = -lo;
        std::size_t valid = 0, saturated = 0;
#pragma omp parallel for schedule(static) reduction(+ : valid, saturated) reduction(min : lo) reduction(max : hi)
        for (int y = 0; y < frame.height(); ++y) {
            const PixelStats r = pixelStats(frame.pixels.row(y), haveMask ? frame.mask.row(y) : nullptr,
                                            static_cast<std::size_t>(frame.width()), MaskSaturated);
            valid += r.valid;
            saturated += r.saturated;
            lo = std::min(lo, r.lo);
            hi = std::max(hi, r.hi);
        }
        all.valid = valid;
        all.saturated = saturated;
        all.lo = lo;
        all.hi = hi;
    }
    FrameStats s;
    s.pixels = frame.pixels.pixelCount();
    s.valid = all.valid;
    s.saturated = all.saturated;
    s.min = all.valid ? all.lo : std::nan("");
    s.max = all.valid ? all.hi : std::nan("");
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
