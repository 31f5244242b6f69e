#pragma once
// Checks that a frame can be reduced at all, before any stage runs or any output is written.

namespace gpuphot {

struct Frame;

// The first reason a frame's pixels cannot be reduced (in the order the checks report them).
enum class FrameDefect {
    None,
    AllSaturated,  // every pixel carries MaskSaturated
    NoValidPixels, // every pixel is NaN, infinite or masked
    Constant,      // every valid pixel has one value (`value`): no variance
};

struct FrameVerdict {
    FrameDefect defect = FrameDefect::None;
    float value = 0.0f; // Constant: the value
};

// Scans the pixels until two valid ones (finite and unmasked) differ, which a real frame shows in its first
// row; only a defective frame is scanned whole.
FrameVerdict frameVerdict(const Frame& frame);

// The smallest frame `reduce` accepts, per axis: the detection filter of a 3-px FWHM star is 7 x 7 px, so a
// smaller image cannot hold a measurable source (it is, in practice, a wrong HDU or a placeholder).
constexpr int kMinFrameAxis = 8;

// Throws InvalidInput naming the file when the frame has no usable pixels: smaller than kMinFrameAxis on
// an axis, all NaN/masked, constant or all-zero (no variance), or saturated everywhere.
void validateForReduction(const Frame& frame);

} // namespace gpuphot
