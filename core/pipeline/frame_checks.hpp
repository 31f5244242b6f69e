#pragma once
// Checks that a frame can be reduced at all, before any stage runs or any output is written.
#include <cstddef>

namespace gpuphot {

struct Frame;

struct FrameStats {
    std::size_t pixels = 0;
    std::size_t valid = 0;      // finite and unmasked
    std::size_t saturated = 0;  // MaskSaturated
    double min = 0.0, max = 0.0;
};

FrameStats frameStats(const Frame& frame);

// The smallest frame `reduce` accepts, per axis: the detection filter of a 3-px FWHM star is 7 x 7 px, so a
// smaller image cannot hold a measurable source (it is, in practice, a wrong HDU or a placeholder).
constexpr int kMinFrameAxis = 8;

// Throws InvalidInput naming the file when the frame has no usable pixels: smaller than kMinFrameAxis on
// an axis, all NaN/masked, constant or all-zero (no variance), or saturated everywhere.
FrameStats validateForReduction(const Frame& frame);

} // namespace gpuphot
