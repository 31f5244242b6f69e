// cuda::finishDetection (kernels/detection/detection_finish.cu) against core's detail::finishDetection on the same
// objects: every Sources column bitwise and the segmentation map exactly, on sparse, crowded and masked
// simulated fields, odd sizes, no objects and objects on the edges; the map stays on the device (a deferred
// SegmentationMap) and is compared after its RunContext died (downloaded when the context ended).
// GPUPHOT_FINISH_BENCH=WxH:STARS (e.g. 14208x10656:134000) adds a timed comparison on a simulated frame of
// that size (both finish steps, host wall times, warm; see docs/BENCHMARKS.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/model/image.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/simulator.hpp"
#include "core/stages/background/background.hpp"
#include "core/stages/detection/detection.hpp"
#include "core/stages/detection/detection_internal.hpp"
#include "core/stages/detection/detection_window.hpp"
#include "kernels/detection/detection_finish.hpp"
#include "kernels/detection/detection_finish_pack.hpp"
#include "kernels/device_context.hpp"
#include "tests/kernels/cuda_test_util.hpp"

namespace gpuphot {
namespace {

using cudatest::expectSameDetection;

struct Inputs {
    Image<float> image;
    Image<std::uint8_t> mask;
    BackgroundResult bkg;
};

Inputs fromSim(SimResult sim, RunContext& ctx) {
    Inputs in{std::move(sim.image), std::move(sim.defects), {}};
    in.bkg = cpu::estimateBackground(in.image.view(), in.mask.view(), BackgroundParams{}, ctx, nullptr);
    return in;
}

// Both finish steps on the objects core's detectObjects finds; CPU vs CUDA compared bitwise.
struct Finished {
    DetectionResult cpu, gpu;
    double cpuMs = 0.0, gpuMs = 0.0;
};

// shared: the CUDA run's context (its DeviceContext, pinned buffers and pool reused across calls), else a
// fresh one.
Finished finishBoth(const Inputs& in, const DetectionParams& p, int threads = 2, int gpuRepeats = 1,
                    RunContext* shared = nullptr) {
    RunContext ctx = cudatest::testContext(Backend::Cpu, threads);
    RunContext own = cudatest::testContext(Backend::Cuda, threads);
    RunContext& gctx = shared ? *shared : own;
    cudatest::useEnvironment(gctx); // the scope's GPUPHOT_DETECTION_... switches
    detail::PreparedDetection prep;
    detail::prepareDetection(in.image.view(), in.mask.view(), in.bkg, p, threads, prep);
    prep.im.releasableDet = nullptr; // the filtered image goes up first
    detail::DetectedObjects found = detail::detectObjects(std::move(prep.runs), prep.im, p, ctx);

    cuda::DeviceContext& dc = cuda::DeviceContext::of(gctx);
    Finished f;
    {
        cuda::DeviceDetectionUpload up(dc, in.image.view(), in.bkg.level.view(), in.bkg.rms.view(),
                                       p.filter ? prep.filtered.view() : ImageView{}, prep.state.view(),
                                       p.threshold, p.thresholdIsAbsolute);
        using Clock = std::chrono::steady_clock;
        for (int r = 0; r < gpuRepeats; ++r) {
            f.gpu = DetectionResult{};
            detail::DetectedObjects copy = found;
            const auto t0 = Clock::now();
            cuda::finishDetection(dc, std::move(copy), up.images(), p, gctx, f.gpu);
            f.gpuMs = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        }
        const auto t0 = Clock::now();
        detail::finishDetection(std::move(found), prep.im, p, ctx, f.cpu);
        f.cpuMs = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        // The map stays on the device (a deferred map of this context) until a host consumer reads it.
        if (f.gpu.segmentation.pixelCount() > 0) {
            EXPECT_FALSE(f.gpu.segmentation.isMaterialised());
            EXPECT_NE(cuda::deviceSegmentation(dc, f.gpu.segmentation), nullptr);
        }
        EXPECT_EQ(cuda::deviceSegmentation(dc, f.cpu.segmentation), nullptr);
    }
    return f;
}

DetectionParams gainParams() {
    DetectionParams p;
    p.gain = 2.5; // the Poisson term of the window variance
    return p;
}

TEST(CudaDetectionFinish, SparseFieldBitwise) {
    REQUIRE_DEVICE();
    RunContext ctx = cudatest::cpuContext();
    const Inputs in = fromSim(cudatest::simulateSmall(301, 257, 60, 11), ctx);
    for (const auto& [name, p] : cudatest::detectionFilterCases()) {
        SCOPED_TRACE(name);
        const Finished f = finishBoth(in, p);
        EXPECT_GT(f.cpu.sources.size(), 20u);
        expectSameDetection(f.cpu, f.gpu);
    }
}

TEST(CudaDetectionFinish, CrowdedFieldBitwise) {
    REQUIRE_DEVICE();
    RunContext ctx = cudatest::cpuContext();
    const Inputs in = fromSim(cudatest::simulateSmall(397, 311, 1800, 12), ctx);
    for (DetectionParams p : {DetectionParams{}, gainParams()}) {
        const Finished f = finishBoth(in, p);
        EXPECT_GT(f.cpu.sources.size(), 300u);
        EXPECT_GT(f.cpu.nDeblended, f.cpu.nBeforeDeblend); // blends were split
        expectSameDetection(f.cpu, f.gpu);
    }
}

TEST(CudaDetectionFinish, RankAndSegmentedSortsGiveTheSameCurves) {
    REQUIRE_DEVICE();
    // The growth curves' sort: by rank for objects of at most testHooks.detectionRankMax pixels (1024 by
    // default: all of these), cub's segmented sort for larger ones; 0: cub for all; 6 and 40: both in one
    // step. Each bitwise the CPU's (its stable sort, ties in raster order).
    RunContext ctx = cudatest::cpuContext();
    const Inputs in = fromSim(cudatest::simulateSmall(280, 230, 500, 14), ctx);
    for (const char* rankMax : {"", "0", "6", "40"}) {
        SCOPED_TRACE(std::string("rank max ") + rankMax);
        std::unique_ptr<cudatest::EnvOverride> env;
        if (*rankMax) env = std::make_unique<cudatest::EnvOverride>("GPUPHOT_TEST_DETECTION_RANK_MAX", rankMax);
        for (DetectionParams p : {DetectionParams{}, gainParams()}) {
            const Finished f = finishBoth(in, p);
            EXPECT_GT(f.cpu.sources.size(), 100u);
            expectSameDetection(f.cpu, f.gpu);
        }
    }
}

TEST(CudaDetectionFinish, WindowSizesAndIterationsBitwise) {
    REQUIRE_DEVICE();
    // The window kernel takes each box 32 pixels at a time (the next 32 loaded while these are summed) and
    // reads the growth curves 32 entries at a time: boxes narrower and wider than a warp (window sigma floors
    // of 0.5 and 5 px), one iteration and up to 40 (tolerance 0), with the Poisson term; curves longer than
    // 32 pixels; the objects taken by decreasing size (default) or in final order. Each bitwise the CPU's.
    RunContext ctx = cudatest::cpuContext();
    const Inputs in = fromSim(cudatest::simulateSmall(333, 271, 700, 16), ctx);
    for (const char* order : {"", "raster"}) {
        std::unique_ptr<cudatest::EnvOverride> env;
        if (*order) env = std::make_unique<cudatest::EnvOverride>("GPUPHOT_DETECTION_WINDOW_ORDER", order);
        for (const double minSigma : {0.5, 5.0}) {
            for (const int iterations : {1, 40}) {
                SCOPED_TRACE(std::string("order ") + order + ", window sigma floor " +
                             std::to_string(minSigma) + ", iterations " + std::to_string(iterations));
                DetectionParams p = gainParams();
                p.windowMinSigma = minSigma;
                p.windowMaxIterations = iterations;
                if (iterations > 1) p.windowTolerance = 0.0;
                const Finished f = finishBoth(in, p);
                ASSERT_GT(f.cpu.sources.size(), 100u);
                EXPECT_GT(*std::max_element(f.cpu.sources.areaIso.begin(), f.cpu.sources.areaIso.end()), 64);
                expectSameDetection(f.cpu, f.gpu);
            }
        }
    }
}

TEST(CudaDetectionFinish, EveryReleaseModeGivesTheSameResult) {
    REQUIRE_DEVICE();
    // The objects freed by the context's release thread at idle priority (default), at normal priority, or
    // by the step's threads while the device works: the same catalog and map, over repeated frames.
    RunContext ctx = cudatest::cpuContext();
    const Inputs in = fromSim(cudatest::simulateSmall(240, 200, 300, 15), ctx);
    RunContext shared = cudatest::testContext(Backend::Cuda, 4);
    for (const char* mode : {"", "thread", "now", ""}) {
        SCOPED_TRACE(std::string("release ") + mode);
        std::unique_ptr<cudatest::EnvOverride> env;
        if (*mode) env = std::make_unique<cudatest::EnvOverride>("GPUPHOT_DETECTION_RELEASE", mode);
        const Finished f = finishBoth(in, DetectionParams{}, 4, 2, &shared);
        EXPECT_GT(f.cpu.sources.size(), 50u);
        expectSameDetection(f.cpu, f.gpu);
    }
}

TEST(CudaDetectionFinish, MaskedFieldBitwise) {
    REQUIRE_DEVICE();
    RunContext ctx = cudatest::cpuContext();
    SimResult sim = cudatest::simulateSmall(263, 199, 400, 13);
    // Blocks of every mask kind, NaN pixels, and a saturation level inside the stars' range.
    const std::uint8_t kinds[] = {MaskBad, MaskCosmicRay, MaskSaturated, MaskNonFinite, MaskOutside};
    for (int b = 0; b < 25; ++b) {
        const int x0 = (b * 37) % 240, y0 = (b * 53) % 180;
        for (int y = y0; y < y0 + 4 + b % 5; ++y)
            for (int x = x0; x < x0 + 3 + b % 7; ++x)
                sim.defects(x, y) |= kinds[b % 5];
    }
    for (int k = 0; k < 40; ++k)
        sim.image((k * 71) % 263, (k * 29) % 199) = std::numeric_limits<float>::quiet_NaN();
    Inputs in{std::move(sim.image), std::move(sim.defects), {}};
    for (int y = 0; y < in.image.height(); ++y)
        for (int x = 0; x < in.image.width(); ++x)
            if (!std::isfinite(in.image(x, y))) in.mask(x, y) |= MaskNonFinite;
    in.bkg = cpu::estimateBackground(in.image.view(), in.mask.view(), BackgroundParams{}, ctx, nullptr);
    DetectionParams p = gainParams();
    p.saturationLevel = 3000.0;
    const Finished f = finishBoth(in, p);
    EXPECT_GT(f.cpu.sources.size(), 100u);
    expectSameDetection(f.cpu, f.gpu);
}

// Bright blobs in the corners and on the edges of an odd-sized frame: windows clipped by the edges.
TEST(CudaDetectionFinish, EdgeObjectsOddSize) {
    REQUIRE_DEVICE();
    RunContext ctx = cudatest::cpuContext();
    const int w = 67, h = 45;
    Inputs in{Image<float>(w, h, 100.0f), Image<std::uint8_t>(w, h, 0), {}};
    cudatest::SplitMix64 rng(5);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            in.image(x, y) += rng.normal(0.0f, 3.0f);
    const double blobs[][3] = {{0, 0, 1.5}, {66, 0, 2.0}, {0, 44, 1.2}, {66, 44, 2.5}, {33, 0, 1.8},
                               {0, 22, 1.0}, {66, 20, 3.0}, {30, 44, 1.6}, {33, 22, 2.2}, {36, 24, 1.4}};
    for (const auto& b : blobs)
        for (int y = 0; y < h; ++y)
            for (int x = 0; x < w; ++x) {
                const double r2 = (x - b[0]) * (x - b[0]) + (y - b[1]) * (y - b[1]);
                in.image(x, y) += static_cast<float>(800.0 * std::exp(-0.5 * r2 / (b[2] * b[2])));
            }
    BackgroundParams bp;
    bp.meshSize = 16;
    in.bkg = cpu::estimateBackground(in.image.view(), in.mask.view(), bp, ctx, nullptr);
    for (const auto& [name, p] : cudatest::detectionFilterCases()) {
        SCOPED_TRACE(name);
        const Finished f = finishBoth(in, p);
        EXPECT_GE(f.cpu.sources.size(), 8u);
        bool edge = false;
        for (std::size_t k = 0; k < f.cpu.sources.size(); ++k)
            edge |= f.cpu.sources.xMin[k] == 0 || f.cpu.sources.yMin[k] == 0 ||
                    f.cpu.sources.xMax[k] == w - 1 || f.cpu.sources.yMax[k] == h - 1;
        EXPECT_TRUE(edge);
        expectSameDetection(f.cpu, f.gpu);
    }
}

// One context for frames of different sizes and object counts, larger and smaller in turn: the step's
// reused pinned buffers (packed objects, order, windowed positions) grown and reused, each result bitwise.
TEST(CudaDetectionFinish, ContextReusedAcrossFrames) {
    REQUIRE_DEVICE();
    RunContext ctx = cudatest::cpuContext();
    const Inputs crowded = fromSim(cudatest::simulateSmall(397, 311, 1800, 12), ctx);
    const Inputs sparse = fromSim(cudatest::simulateSmall(301, 257, 60, 11), ctx);
    RunContext gctx = cudatest::testContext(Backend::Cuda, 2);
    std::size_t counts[3] = {};
    int k = 0;
    for (const Inputs* in : {&sparse, &crowded, &sparse}) {
        SCOPED_TRACE(k);
        const Finished f = finishBoth(*in, gainParams(), 2, 2, &gctx);
        counts[k++] = f.cpu.sources.size();
        expectSameDetection(f.cpu, f.gpu);
    }
    EXPECT_GT(counts[1], 5 * counts[0]);
    EXPECT_EQ(counts[0], counts[2]);
}

// The host halves of the columns (kernels/detection/detection_finish_pack.hpp): fillFinishColumns then
// fillFinishWindow give the rows detail::setSourceRow gives, bitwise.
TEST(CudaDetectionFinish, ColumnsInTwoHalvesAsSetSourceRow) {
    cudatest::SplitMix64 rng(21);
    const int n = 5000;
    detail::DetectedObjects found;
    found.objects.resize(n);
    found.iso.resize(n);
    std::vector<detail::WindowResult> win(n);
    std::vector<std::int32_t> order(n);
    for (int i = 0; i < n; ++i) {
        detail::IsoMeasure& m = found.iso[i];
        m.flux = rng.normal(1000.0f, 300.0f);
        m.fluxVar = std::abs(rng.normal(50.0f, 10.0f));
        m.area = i % 97 + 1;
        m.xIso = rng.normal(500.0f, 200.0f);
        m.yIso = rng.normal(400.0f, 150.0f);
        m.x2 = rng.normal(3.0f, 1.0f);
        m.y2 = rng.normal(3.0f, 1.0f);
        m.xy = rng.normal(0.0f, 0.5f);
        m.a = rng.normal(2.0f, 0.3f);
        m.b = rng.normal(1.5f, 0.3f);
        m.theta = rng.normal(0.0f, 1.0f);
        m.peak = rng.normal(200.0f, 50.0f);
        m.xMin = i;
        m.xMax = i + 3;
        m.yMin = 2 * i;
        m.yMax = 2 * i + 5;
        m.flags = static_cast<std::uint32_t>(i % 7);
        found.objects[i].flags = static_cast<std::uint32_t>((i % 3) << 8);
        found.objects[i].runs = {{i, 0, i % 5}};
        win[i] = {rng.normal(500.0f, 200.0f), rng.normal(400.0f, 150.0f), rng.normal(0.1f, 0.01f),
                  rng.normal(0.1f, 0.01f)};
        order[i] = (i * 7919) % n; // a permutation (7919 is prime, n = 5000 has no factor 7919)
    }
    DetectionResult ref, got;
    ref.sources.resize(n);
    for (int k = 0; k < n; ++k)
        detail::setSourceRow(ref.sources, static_cast<std::size_t>(k), found.iso[order[k]],
                             found.objects[order[k]].flags, win[k]);
    cuda::fillFinishColumns(found, order.data(), got, 3);
    cuda::fillFinishWindow(win.data(), got.sources, 3);
    expectSameDetection(ref, got);
}

// n objects of 1-4 runs each, with their measurements.
detail::DetectedObjects manyObjects(int n) {
    detail::DetectedObjects f;
    f.objects.resize(n);
    f.iso.resize(n);
    for (int i = 0; i < n; ++i)
        f.objects[i].runs.assign(1 + i % 4, detail::Run{i, 0, 3});
    f.nDeblended = static_cast<std::size_t>(n);
    return f;
}

// DeferredRelease: the objects go (found left empty), freed on a helper thread with several threads, at once
// with one; a second release joins the first; wait() and the destructor join.
TEST(CudaDetectionFinish, DeferredReleaseFreesOnAHelperThread) {
    const auto objects = manyObjects;
    {
        cuda::DeferredRelease r;
        detail::DetectedObjects f = objects(20000);
        r.release(std::move(f), 1);
        EXPECT_TRUE(f.objects.empty() && f.iso.empty());
        EXPECT_EQ(r.threadsStarted(), 0u);
        for (int k = 0; k < 3; ++k) {
            detail::DetectedObjects g = objects(20000 + k);
            r.release(std::move(g), 4);
            EXPECT_TRUE(g.objects.empty() && g.iso.empty());
            EXPECT_EQ(g.nDeblended, 0u);
        }
        EXPECT_EQ(r.threadsStarted(), 3u);
        r.wait();
        r.wait(); // nothing in progress: no-op
        detail::DetectedObjects g = objects(100);
        r.release(std::move(g), 2);
        EXPECT_EQ(r.threadsStarted(), 4u);
    } // the destructor joins the last one
}

// releaseNow (GPUPHOT_DETECTION_RELEASE=now): the objects go at once, by several threads above 4096 objects,
// serially below or with one thread; found is left empty.
TEST(CudaDetectionFinish, ReleaseNowFreesAtOnce) {
    for (const int n : {0, 100, 20000})
        for (const int threads : {1, 4}) {
            SCOPED_TRACE(std::to_string(n) + " objects, " + std::to_string(threads) + " threads");
            detail::DetectedObjects f = manyObjects(n);
            cuda::releaseNow(std::move(f), threads);
            EXPECT_TRUE(f.objects.empty() && f.iso.empty());
            EXPECT_EQ(f.nDeblended, 0u);
        }
}

TEST(CudaDetectionFinish, NoObjects) {
    REQUIRE_DEVICE();
    RunContext ctx = cudatest::cpuContext();
    const int w = 33, h = 17;
    Inputs in{Image<float>(w, h, 50.0f), Image<std::uint8_t>(w, h, 0), {}};
    cudatest::SplitMix64 rng(9);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            in.image(x, y) += rng.normal(0.0f, 2.0f);
    BackgroundParams bp;
    bp.meshSize = 16;
    in.bkg = cpu::estimateBackground(in.image.view(), in.mask.view(), bp, ctx, nullptr);
    DetectionParams p;
    p.threshold = 100.0;
    const Finished f = finishBoth(in, p);
    EXPECT_EQ(f.cpu.sources.size(), 0u);
    expectSameDetection(f.cpu, f.gpu);
}

// GPUPHOT_FINISH_BENCH=WxH:STARS: the two finish steps on a simulated frame of that size, timed (warm GPU
// run of three) and compared bitwise.
TEST(CudaDetectionFinish, Benchmark) {
    REQUIRE_DEVICE();
    const char* spec = std::getenv("GPUPHOT_FINISH_BENCH");
    if (!spec) GTEST_SKIP() << "GPUPHOT_FINISH_BENCH not set";
    int w = 0, h = 0, stars = 0;
    ASSERT_EQ(std::sscanf(spec, "%dx%d:%d", &w, &h, &stars), 3) << spec;
    const int threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    RunContext ctx = cudatest::testContext(Backend::Cpu, threads);
    SimParams sp;
    sp.width = w;
    sp.height = h;
    sp.stars = stars;
    sp.seed = 1;
    const auto t0 = std::chrono::steady_clock::now();
    const Inputs in = fromSim(simulateField(sp, &ctx), ctx);
    std::fprintf(stderr, "finish bench: simulated + background in %.1f s\n",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    const Finished f = finishBoth(in, DetectionParams{}, threads, 3);
    std::fprintf(stderr, "finish bench %dx%d, %zu sources, %d threads: cpu finishDetection %.1f ms, "
                 "cuda finishDetection %.1f ms (warm, host wall)\n",
                 w, h, f.cpu.sources.size(), threads, f.cpuMs, f.gpuMs);
    expectSameDetection(f.cpu, f.gpu);
}

} // namespace
} // namespace gpuphot
