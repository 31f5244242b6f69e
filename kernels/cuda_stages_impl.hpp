#pragma once
// The cuda:: stage implementations registered in core's CudaStageTable (kernels/register.cu). Each has
// the exact signature of its cpu:: counterpart and gives the same answer (tests/kernels).
#include <cstdint>

#include "core/model/image.hpp"

namespace gpuphot {
class RunContext;
struct BackgroundParams;
struct BackgroundResult;
struct DetectionParams;
struct DetectionResult;
} // namespace gpuphot

namespace gpuphot::cuda {

// Mesh statistics and full-resolution maps on the device (bad-mesh fill, median filter and spline
// coefficients on the host); the maps stay on the device for detectSources.
BackgroundResult estimateBackground(const ImageView& image, const MaskView& mask, const BackgroundParams& params,
                                    RunContext& ctx, const ImageViewT<std::int32_t>* sourceMask);

// Per-pixel front on the device (subtraction, pixel states, matched filter, threshold runs); the
// per-object half (labelling, deblending, cleaning, measurement) is core's detail::detectFromRuns on the
// host.
DetectionResult detectSources(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                              const DetectionParams& params, RunContext& ctx);

} // namespace gpuphot::cuda
