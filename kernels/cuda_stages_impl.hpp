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
struct ApertureParams;
struct ApertureResult;
struct Sources;
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

// Aperture photometry: the per-source loops (local sky, circular sums for every radius, Kron) as kernels
// behind core's detail::ApertureEngine; the driver (flags, errors, curve of growth, aperture correction,
// optimal radius choice) runs on the host, shared with the CPU stage.
ApertureResult measureApertures(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                                const ImageViewT<std::int32_t>& segmentation, const Sources& sources, double fwhm,
                                double gain, double readNoise, const ApertureParams& params, RunContext& ctx);

} // namespace gpuphot::cuda
