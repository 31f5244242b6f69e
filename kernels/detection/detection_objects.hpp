#pragma once
// The CUDA detection's per-object half up to CLEAN (core's detail::detectObjects: labelling, minimum area,
// deblending, isophotal measurement, CLEAN) on the images resident on the device, bitwise the CPU's.
#include <vector>

#include "core/stages/detection/detection.hpp"
#include "core/stages/detection/detection_internal.hpp"

namespace gpuphot {
class RunContext;
namespace cuda {

class DeviceContext;
struct DeviceDetectionImages;

// Whether detectObjects below takes these parameters (minArea up to kMaxMinArea: CLEAN's mthresh is
// selected in a per-thread array); else the caller keeps core's host detectObjects on host images.
constexpr int kMaxMinArea = 64;
bool detectObjectsOnDevice(const DetectionParams& p);
// detectObjects calls whose result storage was the containers of the context's last detection, handed back by
// the finish step's release thread (process-wide; tests).
std::uint64_t recycledStorages();

// core's detail::detectObjects on device images: the same objects, runs, flags, IsoMeasure values (bit for
// bit) and order. `runs`: the above-threshold runs in raster order (consumed). Labelling and the minimum
// area on the device (union-find over the runs); the single-peak test of every region on the device; regions
// with two or more peaks deblended on the host (core's deblendObject) from compact copies of their boxes
// (filtered image and rms, with a one-pixel border) gathered on the device; the isophotal and CLEAN sums of
// every root on the device (one thread per root, the CPU's order) while the host deblends, then those of the
// deblended children; the measurements, CLEAN and the merge on the host from the sums (core's
// finishObjectsFromSums, CLEAN's and the host steps' working memory kept in the context between frames, the
// result's storage made on a helper thread from the labelling on). Deblending: the largest boxes first,
// per-thread working memory.
detail::DetectedObjects detectObjects(DeviceContext& dc, std::vector<detail::Run> runs,
                                      const DeviceDetectionImages& im, const DetectionParams& p, RunContext& ctx);

} // namespace cuda
} // namespace gpuphot
