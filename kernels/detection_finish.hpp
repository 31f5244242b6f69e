#pragma once
// Steps 5-6 of the detection stage on the GPU (core's detail::finishDetection, bitwise): the objects' final
// order (first pixel in raster order), the segmentation map, the windowed positions (XWIN/YWIN, the
// arithmetic of core/stages/detection_window.hpp) and the Sources columns.
#include <cstdint>
#include <memory>

#include "core/model/image.hpp"
#include "core/stages/detection_internal.hpp"

namespace gpuphot {
class RunContext;
}

namespace gpuphot::cuda {

class DeviceContext;
struct DeviceDetectionImages;

// The same result as detail::finishDetection(found, host images of im, p, ctx, result), bit for bit. The
// objects' runs go up once as CSR (in found's order; the final order is a device radix sort of the first
// pixels), the segmentation map is made on the device and kept there (cachedSegmentation) besides being
// downloaded into result.segmentation. Synchronises dc's stream before it returns.
void finishDetection(DeviceContext& dc, detail::DetectedObjects found, const DeviceDetectionImages& im,
                     const DetectionParams& p, RunContext& ctx, DetectionResult& result);

// The device copy of the segmentation map that the last finishDetection on dc made, when `host` is still
// its download (same buffer, size and sampled contents), else null. Row stride = width.
const std::int32_t* cachedSegmentation(DeviceContext& dc, const ImageViewT<std::int32_t>& host);
// Frees the device copy (memory pressure).
void dropCachedSegmentation(DeviceContext& dc);

// Device copies of host detection images with their DeviceDetectionImages view (tests and benchmarks):
// frame, level and rms maps, the filtered image (det: empty view = no filter, det = sub) and the states.
class DeviceDetectionUpload {
public:
    DeviceDetectionUpload(DeviceContext& dc, const ImageView& frame, const ImageView& level, const ImageView& rms,
                          const ImageView& det, const ImageViewT<std::uint8_t>& state, double threshold,
                          bool absolute);
    ~DeviceDetectionUpload();
    DeviceDetectionUpload(const DeviceDetectionUpload&) = delete;
    DeviceDetectionUpload& operator=(const DeviceDetectionUpload&) = delete;
    const DeviceDetectionImages& images() const;

private:
    struct Impl;
    std::unique_ptr<Impl> m_impl;
};

} // namespace gpuphot::cuda
