#include "core/pipeline/frame_checks.hpp"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/model/frame.hpp"
#include "core/util/errors.hpp"

namespace gpuphot {

namespace {

// What one row shows: whether it has an unsaturated pixel, its first valid value, and whether a later
// valid pixel differs from that one (the scan of the row stops there).
struct RowScan {
    bool unsaturated = false;
    std::optional<float> first;
    bool differs = false;
};

RowScan scanRow(const float* px, const std::uint8_t* mask, int n) {
    RowScan s;
    for (int x = 0; x < n; ++x) {
        const std::uint8_t m = mask ? mask[x] : std::uint8_t{0};
        s.unsaturated = s.unsaturated || (m & MaskSaturated) == 0;
        if (m != 0 || !std::isfinite(px[x])) continue;
        if (!s.first) {
            s.first = px[x];
        } else if (px[x] != *s.first) {
            s.differs = true;
            return s;
        }
    }
    return s;
}

} // namespace

FrameVerdict frameVerdict(const Frame& frame) {
    const int h = frame.height(), w = frame.width();
    const bool haveMask = !frame.mask.empty();
    std::vector<RowScan> rows(static_cast<std::size_t>(h));
    std::atomic<bool> differs{false};
#pragma omp parallel for schedule(dynamic, 8)
    for (int y = 0; y < h; ++y) {
        if (differs.load(std::memory_order_relaxed)) continue;
        rows[static_cast<std::size_t>(y)] =
            scanRow(frame.pixels.row(y), haveMask ? frame.mask.row(y) : nullptr, w);
        if (rows[static_cast<std::size_t>(y)].differs) differs.store(true, std::memory_order_relaxed);
    }
    if (differs.load()) return {};
    bool unsaturated = false;
    std::optional<float> first;
    for (const RowScan& r : rows) {
        unsaturated = unsaturated || r.unsaturated;
        if (!r.first) continue;
        if (first && *r.first != *first) return {};
        first = first ? first : r.first;
    }
    if (!unsaturated) return {FrameDefect::AllSaturated, 0.0f};
    if (!first) return {FrameDefect::NoValidPixels, 0.0f};
    return {FrameDefect::Constant, *first};
}

void validateForReduction(const Frame& frame) {
    const std::string name = frame.path.empty() ? std::string("frame") : frame.path;
    if (frame.pixels.empty()) throw InvalidInput(name + ": empty image");
    if (frame.width() < kMinFrameAxis || frame.height() < kMinFrameAxis)
        throw InvalidInput(name + ": image too small to reduce (" + std::to_string(frame.width()) + " x " +
                           std::to_string(frame.height()) + " pixels; at least " + std::to_string(kMinFrameAxis) +
                           " x " + std::to_string(kMinFrameAxis) + " needed): a wrong HDU or a placeholder?");
    const FrameVerdict v = frameVerdict(frame);
    switch (v.defect) {
    case FrameDefect::AllSaturated:
        throw InvalidInput(name + ": every pixel is saturated (at or above SATURATE " +
                           std::to_string(frame.instrument.saturation) + " ADU): nothing to measure");
    case FrameDefect::NoValidPixels:
        throw InvalidInput(name + ": no valid pixels (all NaN, blank or masked)");
    case FrameDefect::Constant:
        throw InvalidInput(name + ": the image is constant (every valid pixel is " + std::to_string(v.value) +
                           "): no variance, nothing to detect");
    case FrameDefect::None:
        break;
    }
}

} // namespace gpuphot
