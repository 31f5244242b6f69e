// CUDA stages against their CPU references (docs/ARCHITECTURE.md, Determinism): background maps and detection
// catalogs bitwise equal on random and simulated frames, repeatable, independent of the launch
// configuration, and a GPU memory budget that answers with DeviceOutOfMemory rather than a crash.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/pipeline/cuda_stages.hpp"
#include "core/pipeline/device_registry.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/simulator.hpp"
#include "core/stages/background/background.hpp"
#include "core/stages/detection/convolution.hpp"
#include "core/stages/detection/detection.hpp"
#include "kernels/device_context.hpp"
#include "tests/kernels/cuda_test_util.hpp"

using namespace gpuphot;

namespace {

using namespace gpuphot::cudatest;

// Gaussian noise on a sloped sky, a few bright blobs, NaNs, a masked block (bad meshes) and masked pixels.
struct RandomFrame {
    Image<float> image;
    Image<std::uint8_t> mask;
};
RandomFrame randomFrame(int w, int h, std::uint32_t seed) {
    RandomFrame f{Image<float>(w, h), Image<std::uint8_t>(w, h, 0)};
    std::mt19937 rng(seed);
    std::normal_distribution<float> noise(0.0f, 7.0f);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            f.image(x, y) = 1000.0f + 0.05f * x - 0.03f * y + noise(rng);
    for (int s = 0; s < 60; ++s) {
        const float cx = u(rng) * w, cy = u(rng) * h, amp = 20.0f + 2000.0f * u(rng) * u(rng);
        for (int y = std::max(0, int(cy) - 8); y < std::min(h, int(cy) + 9); ++y)
            for (int x = std::max(0, int(cx) - 8); x < std::min(w, int(cx) + 9); ++x)
                f.image(x, y) += amp * std::exp(-((x - cx) * (x - cx) + (y - cy) * (y - cy)) / 4.5f);
    }
    for (int i = 0; i < 200; ++i)
        f.image(static_cast<int>(u(rng) * w), static_cast<int>(u(rng) * h)) = std::numeric_limits<float>::quiet_NaN();
    for (int i = 0; i < 300; ++i)
        f.mask(static_cast<int>(u(rng) * w), static_cast<int>(u(rng) * h)) = MaskBad;
    for (int y = 40; y < 110; ++y) // a block of masked meshes
        for (int x = 60; x < 150; ++x)
            f.mask(x, y) = MaskOutside;
    return f;
}

} // namespace

TEST(CudaStages, RegisteredWithCore) {
    REQUIRE_DEVICE();
    EXPECT_NE(cudaStages().background, nullptr);
    EXPECT_NE(cudaStages().detection, nullptr);
}

TEST(CudaStages, BackgroundMatchesCpuOnRandomFrames) {
    REQUIRE_DEVICE();
    const RandomFrame f = randomFrame(517, 389, 7);
    for (const int mesh : {32, 48, 64})
        for (const bool sx : {false, true}) {
            SCOPED_TRACE("mesh " + std::to_string(mesh) + (sx ? " sextractorSpline" : ""));
            BackgroundParams p;
            p.meshSize = mesh;
            p.sextractorSpline = sx;
            RunContext c = cpuContext(), g = cudaContext();
            const BackgroundResult rc = estimateBackground(f.image.view(), f.mask.view(), p, c);
            const BackgroundResult rg = estimateBackground(f.image.view(), f.mask.view(), p, g);
            EXPECT_GT(rc.badMeshes, 0);
            expectSameBackground(rc, rg);
        }
    // Rectangular meshes, a larger filter with a threshold, no mask, a source mask.
    BackgroundParams p;
    p.meshSize = 40;
    p.meshHeight = 24;
    p.filterSize = 5;
    p.filterHeight = 3;
    p.filterThreshold = 0.5;
    Image<std::int32_t> src(517, 389, 0);
    for (int y = 100; y < 200; ++y)
        for (int x = 200; x < 260; ++x)
            src(x, y) = 3;
    RunContext c = cpuContext(), g = cudaContext();
    const auto sv = src.view();
    expectSameBackground(estimateBackground(f.image.view(), MaskView{}, p, c, &sv),
                         estimateBackground(f.image.view(), MaskView{}, p, g, &sv));
}

TEST(CudaStages, BackgroundMatchesCpuOnSimulatedFrame) {
    REQUIRE_DEVICE();
    const SimResult sim = simulateSmall(700, 700, 400, 11);
    BackgroundParams p;
    RunContext c = cpuContext(), g = cudaContext();
    expectSameBackground(estimateBackground(sim.image.view(), sim.defects.view(), p, c),
                         estimateBackground(sim.image.view(), sim.defects.view(), p, g));
    p.fullMaps = false; // mesh grids only
    const BackgroundResult rc = estimateBackground(sim.image.view(), sim.defects.view(), p, c);
    const BackgroundResult rg = estimateBackground(sim.image.view(), sim.defects.view(), p, g);
    EXPECT_TRUE(rg.level.empty());
    expectSameBackground(rc, rg);
}

TEST(CudaStages, DetectionMatchesCpu) {
    REQUIRE_DEVICE();
    const SimResult sim = simulateSmall(640, 640, 500, 21);
    const RandomFrame rf = randomFrame(517, 389, 3);
    std::vector<std::pair<std::string, DetectionParams>> cases = detectionFilterCases();
    DetectionParams wide;
    wide.filterFwhm = 4.5;
    wide.threshold = 3.0;
    wide.saturationLevel = 20000.0;
    cases.push_back({"wide filter, saturation", wide});
    DetectionParams absolute;
    absolute.thresholdIsAbsolute = true;
    absolute.threshold = 40.0;
    absolute.clean = false;
    cases.push_back({"absolute threshold", absolute});

    for (int frame = 0; frame < 2; ++frame) {
        const ImageView img = frame == 0 ? sim.image.view() : rf.image.view();
        const MaskView mask = frame == 0 ? sim.defects.view() : rf.mask.view();
        RunContext c = cpuContext(), g = cudaContext();
        const BackgroundResult bc = estimateBackground(img, mask, BackgroundParams{}, c);
        const BackgroundResult bg = estimateBackground(img, mask, BackgroundParams{}, g);
        expectSameBackground(bc, bg);
        for (const auto& [name, p] : cases) {
            SCOPED_TRACE(std::string(frame == 0 ? "simulated, " : "random, ") + name);
            const DetectionResult dc = detectSources(img, mask, bc, p, c);
            const DetectionResult dg = detectSources(img, mask, bg, p, g);
            EXPECT_GT(dc.sources.size(), 5u);
            expectSameDetection(dc, dg);
            // The device maps of bg were reused; a CPU-made background (other host maps) is uploaded.
            expectSameDetection(dc, detectSources(img, mask, bc, p, g));
        }
    }
}

TEST(CudaStages, InvalidParametersThrowAsOnCpu) {
    REQUIRE_DEVICE();
    const RandomFrame f = randomFrame(200, 150, 5);
    RunContext g = cudaContext();
    const BackgroundResult b = estimateBackground(f.image.view(), f.mask.view(), BackgroundParams{}, g);
    DetectionParams p;
    p.threshold = -1.0;
    EXPECT_THROW(detectSources(f.image.view(), f.mask.view(), b, p, g), InvalidInput);
    BackgroundParams bp;
    bp.meshSize = 0;
    EXPECT_THROW(estimateBackground(f.image.view(), f.mask.view(), bp, g), InvalidInput);
}

TEST(CudaStages, RepeatedRunsAreIdentical) {
    REQUIRE_DEVICE();
    const SimResult sim = simulateSmall(600, 600, 600, 33);
    RunContext g0 = cudaContext();
    const BackgroundResult b0 = estimateBackground(sim.image.view(), sim.defects.view(), BackgroundParams{}, g0);
    const DetectionResult d0 = detectSources(sim.image.view(), sim.defects.view(), b0, DetectionParams{}, g0);
    RunContext shared = cudaContext(); // warm context: frame and pool reused
    for (int run = 0; run < 5; ++run) {
        SCOPED_TRACE("run " + std::to_string(run));
        RunContext fresh = cudaContext();
        RunContext& g = run % 2 ? fresh : shared;
        const BackgroundResult b = estimateBackground(sim.image.view(), sim.defects.view(), BackgroundParams{}, g);
        expectSameBackground(b0, b);
        expectSameDetection(d0, detectSources(sim.image.view(), sim.defects.view(), b, DetectionParams{}, g));
    }
}

TEST(CudaStages, LaunchConfigurationDoesNotMatter) {
    REQUIRE_DEVICE();
    const SimResult sim = simulateSmall(600, 600, 500, 44);
    RunContext g0 = cudaContext();
    const BackgroundResult b0 = estimateBackground(sim.image.view(), sim.defects.view(), BackgroundParams{}, g0);
    const DetectionResult d0 = detectSources(sim.image.view(), sim.defects.view(), b0, DetectionParams{}, g0);
    for (const int threads : {32, 64, 128, 512, 1024}) {
        SCOPED_TRACE("block " + std::to_string(threads));
        RunContext g = cudaContext();
        cuda::DeviceContext::of(g).setBlockSize(threads);
        const BackgroundResult b = estimateBackground(sim.image.view(), sim.defects.view(), BackgroundParams{}, g);
        expectSameBackground(b0, b);
        expectSameDetection(d0, detectSources(sim.image.view(), sim.defects.view(), b, DetectionParams{}, g));
    }
}

TEST(CudaStages, TinyMemoryBudgetIsAnsweredByReplanning) {
    REQUIRE_DEVICE();
    const RandomFrame f = randomFrame(300, 200, 9);
    RunContext c = cpuContext();
    const BackgroundResult ref = estimateBackground(f.image.view(), f.mask.view(), BackgroundParams{}, c);
    // Not even one strip fits: the CPU stage runs (same numbers) and the context says so.
    RunContext g = cudaContext();
    g.gpuMemLimit = 4096;
    expectSameBackground(ref, estimateBackground(f.image.view(), f.mask.view(), BackgroundParams{}, g));
    EXPECT_EQ(cuda::DeviceContext::of(g).planMode(), "cpu");
    EXPECT_NE(cuda::DeviceContext::of(g).planNote().find("ran on the CPU"), std::string::npos);
    // The context stays usable: a larger budget runs on the device, whole, and matches the CPU.
    g.gpuMemLimit = std::size_t(64) << 20;
    expectSameBackground(ref, estimateBackground(f.image.view(), f.mask.view(), BackgroundParams{}, g));
    EXPECT_EQ(cuda::DeviceContext::of(g).planMode(), "whole");
    // A budget just big enough for the frame but not for detection's whole plan: strips, same catalog.
    RunContext g2 = cudaContext();
    const BackgroundResult b = estimateBackground(f.image.view(), f.mask.view(), BackgroundParams{}, g2);
    auto& dc = cuda::DeviceContext::of(g2);
    g2.gpuMemLimit = dc.inUse() + 1000;
    expectSameDetection(detectSources(f.image.view(), f.mask.view(), ref, DetectionParams{}, c),
                        detectSources(f.image.view(), f.mask.view(), b, DetectionParams{}, g2));
    EXPECT_EQ(dc.planMode(), "strips");
}

TEST(CudaStages, FrameUploadedOnceAndCheckpointsRecorded) {
    REQUIRE_DEVICE();
    const RandomFrame f = randomFrame(300, 200, 13);
    RunContext g = cudaContext();
    {
        auto t = g.time("background");
        (void)estimateBackground(f.image.view(), f.mask.view(), BackgroundParams{}, g);
    }
    auto& dc = cuda::DeviceContext::of(g);
    BackgroundParams p;
    p.meshSize = 32; // a parameter change: same frame, no new upload
    const BackgroundResult b = estimateBackground(f.image.view(), f.mask.view(), p, g);
    (void)detectSources(f.image.view(), f.mask.view(), b, DetectionParams{}, g);
    EXPECT_EQ(dc.uploads(), 1u);
    const RandomFrame f2 = randomFrame(300, 200, 14); // another frame
    (void)estimateBackground(f2.image.view(), f2.mask.view(), p, g);
    EXPECT_EQ(dc.uploads(), 2u);
    dc.bumpGeneration(); // in-place change announced: uploaded again
    (void)estimateBackground(f2.image.view(), f2.mask.view(), p, g);
    EXPECT_EQ(dc.uploads(), 3u);
    ASSERT_EQ(g.records.size(), 1u);
    // Frame + mask + mesh scratch at least; free memory reported.
    EXPECT_GE(g.records[0].deviceHighWater, std::size_t(300) * 200 * 5);
    EXPECT_GT(g.records[0].deviceFree, 0u);
}
