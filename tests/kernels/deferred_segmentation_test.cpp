// The CUDA detection's deferred segmentation map (kernels/detection/detection_finish.hpp): it stays on the device
// (no download) and is bitwise the CPU stage's map when read; the aperture stage reads it there without
// a download and gives the CPU stage's columns bitwise; it outlives its RunContext; it can be read from
// another thread; a map dropped on another thread gives its memory back at the next stage; under a tight
// --gpu-mem-limit the aperture stage moves other maps (and then this one) to the host and still agrees.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>

#include "core/model/segmentation_map.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/aperture/aperture.hpp"
#include "core/stages/detection/detection.hpp"
#include "kernels/cuda_stages_impl.hpp"
#include "kernels/detection/detection_finish.hpp"
#include "kernels/device_context.hpp"
#include "tests/kernels/cuda_test_util.hpp"

namespace gpuphot {
namespace {

using cudatest::expectSameApertures;
using cudatest::expectSameDetection;
using cudatest::SimField;

constexpr int kW = 333, kH = 287;

const SimField& field() {
    static const SimField f = cudatest::simulateDetectedField(kW, kH, 400, 77);
    return f;
}

ApertureParams apertureParams() {
    ApertureParams p;
    p.radii = {2.0, 4.0, 6.0};
    return p;
}

// The CPU stage's apertures on the CPU detection (the reference of every CUDA run here).
const ApertureResult& cpuApertures() {
    static const ApertureResult a = [] {
        RunContext c = cudatest::cpuContext();
        const SimField& f = field();
        return cpu::measureApertures(f.sim.image.view(), f.sim.defects.view(), f.bkg,
                                     f.det.segmentation.view(), f.det.sources, 3.0, 1.5, 6.0,
                                     apertureParams(), c);
    }();
    return a;
}

// Core's dispatch (the pipeline's call) with the shared map.
ApertureResult aperturesWithMap(const DetectionResult& d, RunContext& ctx) {
    const SimField& f = field();
    return measureApertures(f.sim.image.view(), f.sim.defects.view(), f.bkg, d.segmentation, d.sources, 3.0,
                            1.5, 6.0, apertureParams(), ctx);
}

TEST(DeferredSegmentation, CudaDetectionKeepsTheMapOnTheDeviceBitwiseTheCpuMap) {
    REQUIRE_DEVICE();
    const SimField& f = field();
    RunContext g = cudatest::cudaContext();
    const std::uint64_t before = cuda::segmentationDownloads();
    const DetectionResult d = cudatest::runDetection(f, DetectionParams{}, g);
    cuda::DeviceContext& dc = cuda::DeviceContext::of(g);
    ASSERT_GT(d.sources.size(), 50u);
    EXPECT_FALSE(d.segmentation.isMaterialised());
    EXPECT_NE(d.segmentation.source(), nullptr);
    EXPECT_NE(cuda::deviceSegmentation(dc, d.segmentation), nullptr);
    EXPECT_EQ(cuda::segmentationBytes(dc), static_cast<std::size_t>(kW) * kH * 4);
    EXPECT_EQ(cuda::segmentationDownloads(), before); // the detection downloaded nothing
    const DetectionResult copy = d;                   // O(1): shares the map
    EXPECT_TRUE(copy.segmentation.sharesStateWith(d.segmentation));
    expectSameDetection(f.det, d); // reads the map: one download
    EXPECT_EQ(cuda::segmentationDownloads(), before + 1);
    EXPECT_TRUE(copy.segmentation.isMaterialised());
    EXPECT_EQ(copy.segmentation.data(), d.segmentation.data());
    (void)d.segmentation.host();
    EXPECT_EQ(cuda::segmentationDownloads(), before + 1);
}

TEST(DeferredSegmentation, ApertureStageReadsTheDeviceMapWithoutADownload) {
    REQUIRE_DEVICE();
    const SimField& f = field();
    RunContext g = cudatest::cudaContext();
    const DetectionResult d = cudatest::runDetection(f, DetectionParams{}, g);
    ASSERT_FALSE(d.segmentation.isMaterialised());
    const std::uint64_t before = cuda::segmentationDownloads();
    const ApertureResult a = aperturesWithMap(d, g);
    EXPECT_EQ(cuda::segmentationDownloads(), before);
    EXPECT_FALSE(d.segmentation.isMaterialised());
    EXPECT_EQ(cuda::DeviceContext::of(g).planMode(), "whole");
    expectSameApertures(cpuApertures(), a);
    // Sources without segmentId: the driver reads the map on the host (materialised), still the same.
    Sources noIds = d.sources;
    noIds.segmentId.clear();
    RunContext c = cudatest::cpuContext();
    const ApertureResult cpuNoIds =
        cpu::measureApertures(f.sim.image.view(), f.sim.defects.view(), f.bkg, f.det.segmentation.view(),
                              noIds, 3.0, 1.5, 6.0, apertureParams(), c);
    const ApertureResult gpuNoIds =
        measureApertures(f.sim.image.view(), f.sim.defects.view(), f.bkg, d.segmentation, noIds, 3.0, 1.5,
                         6.0, apertureParams(), g);
    EXPECT_TRUE(d.segmentation.isMaterialised());
    expectSameApertures(cpuNoIds, gpuNoIds);
}

TEST(DeferredSegmentation, MapOutlivesItsRunContext) {
    REQUIRE_DEVICE();
    const SimField& f = field();
    std::optional<DetectionResult> d;
    std::uint64_t before = 0;
    {
        RunContext g = cudatest::cudaContext();
        d = cudatest::runDetection(f, DetectionParams{}, g);
        ASSERT_FALSE(d->segmentation.isMaterialised());
        before = cuda::segmentationDownloads();
    } // the DeviceContext ends: the map is downloaded into its source, the device buffer freed
    EXPECT_FALSE(d->segmentation.isMaterialised());
    const DetectionResult copy = *d;
    d.reset();
    expectSameDetection(f.det, copy);
    EXPECT_EQ(cuda::segmentationDownloads(), before + 1); // the host() copy from the evicted pixels
}

TEST(DeferredSegmentation, ReadOnAnotherThreadAndDroppedThere) {
    REQUIRE_DEVICE();
    const SimField& f = field();
    RunContext g = cudatest::cudaContext();
    cuda::DeviceContext& dc = cuda::DeviceContext::of(g);
    std::optional<DetectionResult> d = cudatest::runDetection(f, DetectionParams{}, g);
    const std::size_t mapBytes = static_cast<std::size_t>(kW) * kH * 4;
    const std::uint64_t foreign = cuda::segmentationForeignDownloads();
    std::thread reader([&] { (void)d->segmentation.host(); }); // the workbench worker's way: its own stream
    reader.join();
    EXPECT_EQ(cuda::segmentationForeignDownloads(), foreign + 1);
    EXPECT_TRUE(d->segmentation.isMaterialised());
    expectSameDetection(f.det, *d);
    // Dropped on another thread: the buffer waits for the stage thread (still counted), then is freed.
    std::thread dropper([&] { d.reset(); });
    dropper.join();
    EXPECT_EQ(cuda::segmentationBytes(dc), mapBytes);
    EXPECT_EQ(cuda::evictSegmentations(dc), mapBytes);
    EXPECT_EQ(cuda::segmentationBytes(dc), 0u);
}

TEST(DeferredSegmentation, TightBudgetMovesOtherMapsThenThisOneToTheHost) {
    REQUIRE_DEVICE();
    const SimField& f = field();
    RunContext g = cudatest::cudaContext();
    const DetectionResult d1 = cudatest::runDetection(f, DetectionParams{}, g);
    const DetectionResult d2 = cudatest::runDetection(f, DetectionParams{}, g);
    cuda::DeviceContext& dc = cuda::DeviceContext::of(g);
    const std::size_t mapBytes = static_cast<std::size_t>(kW) * kH * 4;
    ASSERT_EQ(cuda::segmentationBytes(dc), 2 * mapBytes);
    ASSERT_FALSE(d1.segmentation.isMaterialised());
    ASSERT_FALSE(d2.segmentation.isMaterialised());
    // The aperture stage's whole plan with the map resident: frame, mask, both background maps, 256 MB.
    const std::size_t npix = static_cast<std::size_t>(kW) * kH;
    const std::size_t need = npix * (4 + 1 + 8) + (std::size_t(256) << 20);
    // Warm the frame and background caches (they count as free in the plan), then measure what else is held.
    expectSameApertures(cpuApertures(), aperturesWithMap(d2, g));
    auto others = [&] { return dc.inUse() - dc.cachedFrameBytes() - dc.cachedBackgroundBytes(); };

    // Fits once d1's map is on the host: d1 evicted, d2 still read on the device.
    g.gpuMemLimit = others() + need - mapBytes / 2; // DeviceContext::of takes it as the budget
    std::uint64_t before = cuda::segmentationDownloads();
    expectSameApertures(cpuApertures(), aperturesWithMap(d2, g));
    EXPECT_EQ(dc.planMode(), "whole");
    EXPECT_EQ(cuda::deviceSegmentation(dc, d1.segmentation), nullptr);
    EXPECT_NE(cuda::deviceSegmentation(dc, d2.segmentation), nullptr);
    EXPECT_FALSE(d2.segmentation.isMaterialised());
    EXPECT_FALSE(d1.segmentation.isMaterialised()); // its pixels wait in its source
    EXPECT_EQ(cuda::segmentationDownloads(), before);
    EXPECT_EQ(cuda::segmentationBytes(dc), mapBytes);
    expectSameDetection(f.det, d1);

    // Does not fit even then: d2 comes to the host, its device copy is freed, the result is the same.
    g.gpuMemLimit = others() + need - mapBytes - 1;
    before = cuda::segmentationDownloads();
    expectSameApertures(cpuApertures(), aperturesWithMap(d2, g));
    EXPECT_TRUE(d2.segmentation.isMaterialised());
    EXPECT_EQ(cuda::deviceSegmentation(dc, d2.segmentation), nullptr);
    EXPECT_EQ(cuda::segmentationBytes(dc), 0u);
    EXPECT_EQ(cuda::segmentationDownloads(), before + 1);
    expectSameDetection(f.det, d2);
}

// Budgets from the smallest one with which the detection runs its whole plan (found by bisection) up by
// quarters of the map's size: whatever each gives (the map kept on the device, or downloaded at once when
// its size is not free again after the finish step, or another plan), the map is the CPU's and a kept map
// is on the device; with room enough the map is kept. The counts of each kind are printed.
TEST(DeferredSegmentation, BudgetsAboveTheSmallestWholePlan) {
    REQUIRE_DEVICE();
    const SimField& f = field();
    RunContext g = cudatest::cudaContext();
    cuda::DeviceContext& dc = cuda::DeviceContext::of(g);
    (void)cudatest::runDetection(f, DetectionParams{}, g); // caches warm, the map dropped again
    const std::size_t mapBytes = static_cast<std::size_t>(kW) * kH * 4;
    auto whole = [&](std::size_t budget) {
        g.gpuMemLimit = budget;
        const DetectionResult d = cudatest::runDetection(f, DetectionParams{}, g);
        return dc.planMode() == "whole";
    };
    std::size_t lo = std::size_t(1) << 20, hi = std::size_t(1) << 34; // not whole / whole
    ASSERT_FALSE(whole(lo));
    ASSERT_TRUE(whole(hi));
    while (hi - lo > 4096) {
        const std::size_t mid = lo + (hi - lo) / 2;
        (whole(mid) ? hi : lo) = mid;
    }
    int kept = 0, hostWhole = 0, other = 0;
    for (int k = 0; k <= 12; ++k) {
        g.gpuMemLimit = hi + static_cast<std::size_t>(k) * (mapBytes / 4);
        const DetectionResult d = cudatest::runDetection(f, DetectionParams{}, g);
        const std::string plan = dc.planMode();
        SCOPED_TRACE("budget " + std::to_string(g.gpuMemLimit) + ", plan " + plan);
        if (d.segmentation.source()) {
            EXPECT_FALSE(d.segmentation.isMaterialised());
            EXPECT_NE(cuda::deviceSegmentation(dc, d.segmentation), nullptr);
            ++kept;
        } else {
            EXPECT_TRUE(d.segmentation.isMaterialised());
            ++(plan == "whole" ? hostWhole : other);
        }
        expectSameDetection(f.det, d);
    }
    std::printf(
        "smallest whole-plan budget %zu B; map kept %d, whole plan with a host map %d, other plans %d\n", hi,
        kept, hostWhole, other);
    EXPECT_GT(kept, 0);
}

} // namespace
} // namespace gpuphot
