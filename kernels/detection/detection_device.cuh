#pragma once
// Device views of the detection stage's images for its per-object kernels (labelling, deblending,
// measurement in kernels/detection/detection_objects.cu; order, segmentation and windowed positions in
// kernels/detection/detection_finish.cu). Every image is contiguous (row pitch = width elements) and lives on the
// device for the whole stage (the "whole" plan; the strips plan keeps the host path). The background-
// subtracted pixel is not stored: subAt recomputes it exactly as core's prepareRow and kernels/detection/detection.cu's
// prepareKernel do (0 for bad pixels, else frame - level in float).
#include <cstddef>
#include <cstdint>

#include "core/stages/detection/detection_internal.hpp"

namespace gpuphot::cuda {

struct DeviceDetectionImages {
    int width = 0, height = 0;
    const float* frame = nullptr;        // the frame's pixels
    const float* level = nullptr;        // background level map
    const float* rms = nullptr;          // background rms map
    const float* det = nullptr;          // the filtered image; null without a filter (det = sub)
    const std::uint8_t* state = nullptr; // detail::PixelState bits
    double threshold = 0.0;
    bool absolute = false;
    // The front's above-threshold runs on the device (the same array, in the same order, as the host vector
    // handed to detectObjects; null when not kept): valid until detectObjects returns.
    const detail::Run* runs = nullptr;
    std::size_t runCount = 0;

    __host__ __device__ std::size_t at(int x, int y) const {
        return static_cast<std::size_t>(y) * static_cast<std::size_t>(width) + static_cast<std::size_t>(x);
    }
    __device__ float subAt(int x, int y) const {
        const std::size_t i = at(x, y);
        return (state[i] & detail::StateBad) ? 0.0f : frame[i] - level[i];
    }
    __device__ float detAt(int x, int y) const { return det ? det[at(x, y)] : subAt(x, y); }
    __device__ float rmsAt(int x, int y) const { return rms[at(x, y)]; }
    __device__ std::uint8_t stateAt(int x, int y) const { return state[at(x, y)]; }
    __device__ double thresholdAt(int x, int y) const {
        return absolute ? threshold : threshold * static_cast<double>(rmsAt(x, y));
    }
    __device__ bool above(int x, int y) const {
        return !(stateAt(x, y) & detail::StateInvalid) && static_cast<double>(detAt(x, y)) > thresholdAt(x, y);
    }
};

} // namespace gpuphot::cuda
