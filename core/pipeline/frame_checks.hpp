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

// Throws InvalidInput naming the file when the frame has no usable pixels: all NaN/masked, constant or
// all-zero (no variance), or saturated everywhere.
FrameStats validateForReduction(const Frame& frame);

} // namespace gpuphot
