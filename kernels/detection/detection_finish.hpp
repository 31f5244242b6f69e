#pragma once
// Steps 5-6 of the detection stage on the GPU (core's detail::finishDetection, bitwise): the objects' final
// order (first pixel in raster order), the segmentation map, the windowed positions (XWIN/YWIN, the
// arithmetic of core/stages/detection/detection_window.hpp) and the Sources columns.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/model/image.hpp"
#include "core/model/segmentation_map.hpp"
#include "core/stages/detection/detection_internal.hpp"

namespace gpuphot {
class RunContext;
}

namespace gpuphot::cuda {

class DeviceContext;
struct DeviceDetectionImages;

// The same result as detail::finishDetection(found, host images of im, p, ctx, result), bit for bit. The
// objects' runs go up once as CSR (in found's order; the final order is a device radix sort of the first
// pixels), the segmentation map is made on the device and stays there: result.segmentation is a deferred
// SegmentationMap (core/model/segmentation_map.hpp) whose source owns the device buffer and downloads it
// only when a host consumer calls host(). When the budget does not leave the map's size again free after
// the step, the map is downloaded at once and the device copy freed (a host-backed map).
// Synchronises dc's stream before it returns.
void finishDetection(DeviceContext& dc, detail::DetectedObjects found, const DeviceDetectionImages& im,
                     const DetectionParams& p, RunContext& ctx, DetectionResult& result);

// The containers of dc's last finished detection once its release thread has freed their objects' runs
// (DeferredRelease::takeRecycled: not waited for), for the next detectObjects' result storage; false when
// there are none (GPUPHOT_DETECTION_RECYCLE=0: never).
bool takeRecycledObjects(DeviceContext& dc, std::vector<detail::Object>& objects,
                         std::vector<detail::IsoMeasure>& iso);

// ---- deferred segmentation maps on the device ---------------------------------------------------------
// Lifetime: the device buffer is counted in dc's budget (inUse) while the map holds it. A map outliving
// its DeviceContext (the RunContext destroyed first) is downloaded into host memory held by its source
// when the context dies, and its device buffer freed then: host() stays valid. A map dropped on a thread
// other than the one that made it gives its buffer back at the context's next finishDetection or aperture
// stage (the pool is not thread-safe); on the same thread at once.
// Downloads: on the thread that made the map, through dc's pinned staging (downloadStaged: the thread runs
// dc's stages, so nothing else uses the stream then); on any other thread (the workbench), on a stream and
// through pinned staging of the map's pool (not dc's), serialised with the other maps' downloads and
// evictions by a mutex (a pageable copy of 605 MB took 420-500 ms, staged ~36 ms).

// The device pixels of map when it is a deferred map of dc whose buffer is still on the device (row
// stride = width), else null.
const std::int32_t* deviceSegmentation(DeviceContext& dc, const SegmentationMap& map);
// Downloads the deferred maps of dc still on the device (except `keep`'s, when given) into host memory
// held by their sources and frees their device buffers; frees the buffers of maps dropped on other
// threads. Returns the bytes freed. The stage thread calls it when a plan does not fit.
std::size_t evictSegmentations(DeviceContext& dc, const SegmentationMap* keep = nullptr);
// The device pointer of a view made from deviceSegmentation's pointer (the aperture engine's input) when
// it still is a live deferred map of dc of the view's size, else null.
const std::int32_t* residentSegmentation(DeviceContext& dc, const ImageViewT<std::int32_t>& view);
// Frees the device copy of a deferred map of dc that is materialised already (its host() pixels stay);
// no-op otherwise. Memory pressure: the aperture stage's strips and CPU plans.
void releaseSegmentationDevice(DeviceContext& dc, const SegmentationMap& map);
// Device bytes held by dc's deferred maps (live ones and those waiting to be freed).
std::size_t segmentationBytes(DeviceContext& dc);
// Downloads (host() calls that copied from the device or from an evicted copy) of deferred maps so far,
// process-wide, and by the pageable path (another thread). Tests count them.
std::uint64_t segmentationDownloads();
std::uint64_t segmentationForeignDownloads();

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
