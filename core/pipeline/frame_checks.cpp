#include "core/pipeline/frame_checks.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/model/frame.hpp"
#include "core/util/errors.hpp"

namespace gpuphot {

namespace {
// One row's counts and limits; branch-free so the compiler vectorises it (NaN and ±inf fail the
// magnitude test, masked pixels the mask test). Float limits are exact: every pixel is a float.
struct RowStats {
    std::size_t valid = 0, saturated = 0;
    float lo = std::numeric_limits<float>::infinity(), hi = -std::numeric_limits<float>::infinity();
};

RowStats rowStats(const float* row, const std::uint8_t* m, int width) {
    constexpr float kMax = std::numeric_limits<float>::max();
    constexpr float kInf = std::numeric_limits<float>::infinity();
    RowStats r;
    float lo = kInf, hi = -kInf;
    unsigned valid = 0, saturated = 0; // 32-bit lanes as the floats' (a row has < 2^32 pixels)
    if (m) {
#pragma omp simd reduction(+ : valid, saturated) reduction(min : lo) reduction(max : hi)
        for (int x = 0; x < width; ++x) {
            const float v = row[x];
            const unsigned mk = m[x];
            const bool ok = (std::fabs(v) <= kMax) & (mk == 0u);
            saturated += (mk & MaskSaturated) != 0u ? 1u : 0u;
            valid += ok ? 1u : 0u;
            lo = std::min(lo, ok ? v : kInf);
            hi = std::max(hi, ok ? v : -kInf);
        }
    } else {
#pragma omp simd reduction(+ : valid) reduction(min : lo) reduction(max : hi)
        for (int x = 0; x < width; ++x) {
            const float v = row[x];
            const bool ok = std::fabs(v) <= kMax;
            valid += ok ? 1u : 0u;
            lo = std::min(lo, ok ? v : kInf);
            hi = std::max(hi, ok ? v : -kInf);
        }
    }
    r.valid = valid;
    r.saturated = saturated;
    r.lo = lo;
    r.hi = hi;
    return r;
}
} // namespace

FrameStats frameStats(const Frame& frame) {
    FrameStats s;
    s.pixels = frame.pixels.pixelCount();
    float lo = std::numeric_limits<float>::infinity(), hi = -lo;
    std::size_t valid = 0, saturated = 0;
    const bool haveMask = !frame.mask.empty();
#pragma omp parallel for schedule(static) reduction(+ : valid, saturated) reduction(min : lo) reduction(max : hi)
    for (int y = 0; y < frame.height(); ++y) {
        const RowStats r =
            rowStats(frame.pixels.row(y), haveMask ? frame.mask.row(y) : nullptr, frame.width());
        valid += r.valid;
        saturated += r.saturated;
        lo = std::min(lo, r.lo);
        hi = std::max(hi, r.hi);
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
