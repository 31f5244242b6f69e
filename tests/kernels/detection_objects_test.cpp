// The CUDA per-object half of detection (kernels/detection/detection_objects.cu) against core's detail::detectObjects:
// the same objects, runs, flags and isophotal measurements bit for bit, and the same order, on sparse,
// crowded (Plummer clusters), saturated and masked fields, with each filter path, odd sizes and a field
// without objects; and the whole CUDA detection against the CPU one on a crowded field.
#include <cuda_runtime.h> // __host__ / __device__ for detection_device.cuh
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "core/model/flags.hpp"
#include "core/sim/simulator.hpp"
#include "core/stages/background/background.hpp"
#include "core/stages/detection/detection.hpp"
#include "core/stages/detection/detection_internal.hpp"
#include "kernels/cuda_stages_impl.hpp"
#include "kernels/detection/detection_device.cuh"
#include "kernels/detection/detection_objects.hpp"
#include "kernels/device_context.hpp"
#include "tests/core/test_fields.hpp"
#include "tests/kernels/cuda_test_util.hpp"

namespace gpuphot {
namespace {

using cudatest::cpuContext;
using cudatest::cudaContext;

template <class T> bool sameField(const T& a, const T& b) { return std::memcmp(&a, &b, sizeof(T)) == 0; }

::testing::AssertionResult sameIso(const detail::IsoMeasure& a, const detail::IsoMeasure& b) {
#define GPUPHOT_ISO_FIELD(f)                                                                                      \
    if (!sameField(a.f, b.f)) return ::testing::AssertionFailure() << #f << ": " << a.f << " vs " << b.f;
    GPUPHOT_ISO_FIELD(flux)
    GPUPHOT_ISO_FIELD(fluxVar)
    GPUPHOT_ISO_FIELD(area)
    GPUPHOT_ISO_FIELD(xIso)
    GPUPHOT_ISO_FIELD(yIso)
    GPUPHOT_ISO_FIELD(x2)
    GPUPHOT_ISO_FIELD(y2)
    GPUPHOT_ISO_FIELD(xy)
    GPUPHOT_ISO_FIELD(a)
    GPUPHOT_ISO_FIELD(b)
    GPUPHOT_ISO_FIELD(theta)
    GPUPHOT_ISO_FIELD(cxx)
    GPUPHOT_ISO_FIELD(cyy)
    GPUPHOT_ISO_FIELD(cxy)
    GPUPHOT_ISO_FIELD(peak)
    GPUPHOT_ISO_FIELD(detPeak)
    GPUPHOT_ISO_FIELD(detPeakX)
    GPUPHOT_ISO_FIELD(detPeakY)
    GPUPHOT_ISO_FIELD(thrAtPeak)
    GPUPHOT_ISO_FIELD(xMin)
    GPUPHOT_ISO_FIELD(xMax)
    GPUPHOT_ISO_FIELD(yMin)
    GPUPHOT_ISO_FIELD(yMax)
    GPUPHOT_ISO_FIELD(flags)
#undef GPUPHOT_ISO_FIELD
    return ::testing::AssertionSuccess();
}

void expectSameObjects(const detail::DetectedObjects& c, const detail::DetectedObjects& g) {
    EXPECT_EQ(c.nBeforeDeblend, g.nBeforeDeblend);
    EXPECT_EQ(c.nDeblended, g.nDeblended);
    EXPECT_EQ(c.nCleaned, g.nCleaned);
    ASSERT_EQ(c.objects.size(), g.objects.size());
    ASSERT_EQ(c.iso.size(), g.iso.size());
    ASSERT_EQ(c.objects.size(), c.iso.size());
    for (std::size_t i = 0; i < c.objects.size(); ++i) {
        const auto& a = c.objects[i];
        const auto& b = g.objects[i];
        EXPECT_EQ(a.flags, b.flags) << "object " << i;
        ASSERT_EQ(a.runs.size(), b.runs.size()) << "object " << i;
        for (std::size_t r = 0; r < a.runs.size(); ++r) {
            ASSERT_EQ(a.runs[r].y, b.runs[r].y) << "object " << i << " run " << r;
            ASSERT_EQ(a.runs[r].x0, b.runs[r].x0) << "object " << i << " run " << r;
            ASSERT_EQ(a.runs[r].x1, b.runs[r].x1) << "object " << i << " run " << r;
        }
        ASSERT_TRUE(sameIso(c.iso[i], g.iso[i])) << "object " << i;
    }
}

// Both detectObjects on one frame: the CPU's on core's images, the device's on the frame, the maps and
// the CPU's filtered image and states uploaded. Returns the CPU's result.
detail::DetectedObjects compareObjects(const ImageView& image, const MaskView& mask, const DetectionParams& p,
                                       const std::string& what, int gpuHostThreads = 2) {
    SCOPED_TRACE(what);
    RunContext c = cpuContext();
    const BackgroundResult bkg = estimateBackground(image, mask, BackgroundParams{}, c);
    detail::PreparedDetection prep;
    detail::prepareDetection(image, mask, bkg, p, 2, prep);
    const detail::DetectedObjects cpu = detail::detectObjects(prep.runs, prep.im, p, c);

    RunContext g = cudatest::testContext(Backend::Cuda, gpuHostThreads);
    cuda::DeviceContext& dc = cuda::DeviceContext::of(g);
    const int w = image.width, h = image.height;
    const std::size_t n = static_cast<std::size_t>(w) * h;
    cuda::DeviceBuffer<float> frame(dc, n), level(dc, n), rms(dc, n), det(dc, p.filter ? n : 0);
    cuda::DeviceBuffer<std::uint8_t> state(dc, n);
    std::vector<float> px(n);
    for (int y = 0; y < h; ++y)
        std::memcpy(px.data() + static_cast<std::size_t>(y) * w, image.row(y), sizeof(float) * w);
    frame.upload(px.data(), n);
    level.upload(bkg.level.data(), n);
    rms.upload(bkg.rms.data(), n);
    state.upload(prep.state.data(), n);
    if (p.filter) det.upload(prep.filtered.data(), n);
    cuda::DeviceDetectionImages dim;
    dim.width = w;
    dim.height = h;
    dim.frame = frame.get();
    dim.level = level.get();
    dim.rms = rms.get();
    dim.det = p.filter ? det.get() : nullptr;
    dim.state = state.get();
    dim.threshold = p.threshold;
    dim.absolute = p.thresholdIsAbsolute;
    dc.synchronize();
    {
        SCOPED_TRACE("runs uploaded from the host");
        expectSameObjects(cpu, cuda::detectObjects(dc, prep.runs, dim, p, g));
    }
    // The runs already on the device (the front's, DeviceDetectionImages::runs): labelled there.
    cuda::DeviceBuffer<detail::Run> runs(dc, prep.runs.size());
    if (!prep.runs.empty()) runs.upload(prep.runs.data(), prep.runs.size());
    dim.runs = runs.get();
    dim.runCount = prep.runs.size();
    {
        SCOPED_TRACE("runs on the device");
        expectSameObjects(cpu, cuda::detectObjects(dc, prep.runs, dim, p, g));
    }
    return cpu;
}

TEST(DetectionObjectsCuda, SparseFieldEachFilter) {
    REQUIRE_DEVICE();
    const SimResult sim = cudatest::simulateSmall(256, 200, 150, 11);
    for (const auto& [name, p] : cudatest::detectionFilterCases())
        compareObjects(sim.image.view(), sim.defects.view(), p, "sparse, " + name);
}

TEST(DetectionObjectsCuda, CrowdedFieldsDeblend) {
    REQUIRE_DEVICE();
    std::size_t split = 0;
    for (std::uint64_t seed : {3u, 4u}) {
        const SimResult sim = test::clusteredField(301, 257, 1500, seed);
        for (const auto& [name, p] : cudatest::detectionFilterCases()) {
            const auto cpu = compareObjects(sim.image.view(), sim.defects.view(), p, "crowded, " + name);
            split += cpu.nDeblended - cpu.nBeforeDeblend;
        }
        DetectionParams p;
        p.deblendContrast = 0.0; // every significant branch splits
        p.deblendMaxChildren = 3; // overflows
        compareObjects(sim.image.view(), sim.defects.view(), p, "crowded, contrast 0, 3 children");
        p = DetectionParams{};
        p.clean = false;
        p.minArea = 3;
        compareObjects(sim.image.view(), sim.defects.view(), p, "crowded, no CLEAN, minArea 3");
        p = DetectionParams{};
        p.deblendLevels = 1;
        p.thresholdIsAbsolute = true;
        p.threshold = 40.0;
        compareObjects(sim.image.view(), sim.defects.view(), p, "crowded, no deblending, absolute threshold");
    }
    EXPECT_GT(split, 10u) << "the crowded fields must exercise the deblending";
}

// The host parts run in parallel (deblending of the multi-peak regions, the objects, the measurements and
// CLEAN's descriptions, the merge): the same result with more host threads than multi-peak regions and with
// far fewer, and with many CLEANed objects (wide wings).
TEST(DetectionObjectsCuda, HostThreadCounts) {
    REQUIRE_DEVICE();
    std::size_t split = 0, cleaned = 0;
    const SimResult few = test::clusteredField(96, 80, 40, 12);
    DetectionParams p;
    p.cleanParam = 0.5;
    for (int threads : {1, 16}) {
        const auto cpu = compareObjects(few.image.view(), few.defects.view(), p,
                                        "few regions, " + std::to_string(threads) + " threads", threads);
        split += cpu.nDeblended - cpu.nBeforeDeblend;
        cleaned += cpu.nCleaned;
    }
    const SimResult many = test::clusteredField(400, 300, 3000, 13);
    for (int threads : {1, 3, 16}) {
        const auto cpu = compareObjects(many.image.view(), many.defects.view(), p,
                                        "many regions, " + std::to_string(threads) + " threads", threads);
        split += cpu.nDeblended - cpu.nBeforeDeblend;
        cleaned += cpu.nCleaned;
    }
    EXPECT_GT(split, 30u) << "the fields must exercise the deblending";
    EXPECT_GT(cleaned, 5u) << "the fields must exercise CLEAN's merge";
}

TEST(DetectionObjectsCuda, SaturatedAndMaskedOddSize) {
    REQUIRE_DEVICE();
    SimResult sim = test::clusteredField(197, 131, 600, 7);
    // Invalid pixels: a NaN block and a masked-outside strip; bad pixels: a masked column.
    for (int y = 40; y < 46; ++y)
        for (int x = 60; x < 70; ++x)
            sim.image(x, y) = std::numeric_limits<float>::quiet_NaN();
    for (int y = 0; y < sim.image.height(); ++y) {
        sim.defects(3, y) |= MaskOutside;
        sim.defects(120, y) |= MaskBad;
    }
    for (int x = 0; x < sim.image.width(); ++x)
        sim.defects(x, 100) |= MaskNonFinite;
    DetectionParams p;
    float mx = 0.0f;
    for (int y = 0; y < sim.image.height(); ++y)
        for (int x = 0; x < sim.image.width(); ++x)
            if (std::isfinite(sim.image(x, y))) mx = std::max(mx, sim.image(x, y));
    p.saturationLevel = 0.3 * mx; // the bright cores saturated
    const auto cpu = compareObjects(sim.image.view(), sim.defects.view(), p, "saturated and masked");
    bool saturated = false, bad = false, edge = false;
    for (const auto& m : cpu.iso) {
        saturated |= (m.flags & FlagSaturated) != 0;
        bad |= (m.flags & FlagBadPixels) != 0;
        edge |= (m.flags & FlagEdge) != 0;
    }
    EXPECT_TRUE(saturated && bad && edge) << "the field must exercise every flag";
    p.filter = false;
    compareObjects(sim.image.view(), sim.defects.view(), p, "saturated and masked, no filter");
}

TEST(DetectionObjectsCuda, NoObjects) {
    REQUIRE_DEVICE();
    Image<float> flat(64, 48, 100.0f);
    for (int y = 0; y < 48; ++y)
        for (int x = 0; x < 64; ++x)
            flat(x, y) += 0.01f * static_cast<float>((x * 7 + y * 13) % 5);
    DetectionParams p;
    p.threshold = 1e6;
    const auto cpu = compareObjects(flat.view(), MaskView{}, p, "no objects");
    EXPECT_EQ(cpu.objects.size(), 0u);
}

// Enough regions (4,401) for the result's storage to be made on a helper thread beside the deblending, and a
// context kept through both calls of compareObjects (the host working memory reused).
TEST(DetectionObjectsCuda, ResultStorageOnAHelperThread) {
    REQUIRE_DEVICE();
    SimParams sp;
    sp.width = 1500;
    sp.height = 1500;
    sp.stars = 15000;
    sp.seed = 1;
    const SimResult sim = simulateField(sp);
    const auto cpu = compareObjects(sim.image.view(), sim.defects.view(), DetectionParams{}, "15k stars", 16);
    EXPECT_GE(cpu.nBeforeDeblend, 4096u);
    EXPECT_GT(cpu.nDeblended, cpu.nBeforeDeblend);
}

// The whole CUDA stage (device per-object half and finish) against the CPU stage.
TEST(DetectionObjectsCuda, WholeStageMatchesCpuOnCrowdedField) {
    REQUIRE_DEVICE();
    const SimResult sim = test::clusteredField(333, 301, 2000, 9);
    RunContext c = cpuContext();
    const BackgroundResult bkg = estimateBackground(sim.image.view(), sim.defects.view(), BackgroundParams{}, c);
    for (const auto& [name, p] : cudatest::detectionFilterCases()) {
        SCOPED_TRACE(name);
        RunContext g = cudaContext();
        const DetectionResult dc = cpu::detectSources(sim.image.view(), sim.defects.view(), bkg, p, c);
        const DetectionResult dg = cuda::detectSources(sim.image.view(), sim.defects.view(), bkg, p, g);
        EXPECT_EQ(cuda::DeviceContext::of(g).planMode(), "whole");
        cudatest::expectSameDetection(dc, dg);
    }
}

// Frames of different sizes on one context: the result storage of each frame after the first is the
// containers of the one before (stale values, a larger or smaller count than needed) when the release thread
// handed them back, else made afresh; every frame bitwise the CPU's.
TEST(DetectionObjectsCuda, WholeStageRecyclesStorageAcrossFrames) {
    REQUIRE_DEVICE();
    RunContext c = cpuContext();
    RunContext g = cudaContext();
    const std::uint64_t before = cuda::recycledStorages();
    const SimResult fields[] = {
        test::clusteredField(333, 301, 2000, 9), test::clusteredField(200, 180, 400, 3),
        test::clusteredField(420, 380, 3200, 5), test::clusteredField(333, 301, 2000, 9)};
    for (const SimResult& sim : fields) {
        const BackgroundResult bkg =
            estimateBackground(sim.image.view(), sim.defects.view(), BackgroundParams{}, c);
        const DetectionResult dc =
            cpu::detectSources(sim.image.view(), sim.defects.view(), bkg, DetectionParams{}, c);
        const DetectionResult dg =
            cuda::detectSources(sim.image.view(), sim.defects.view(), bkg, DetectionParams{}, g);
        EXPECT_GT(dc.sources.size(), 50u);
        cudatest::expectSameDetection(dc, dg);
        std::this_thread::sleep_for(std::chrono::milliseconds(200)); // the release thread frees meanwhile
    }
    EXPECT_GE(cuda::recycledStorages() - before, 2u);
}

} // namespace
} // namespace gpuphot
