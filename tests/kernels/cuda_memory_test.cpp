// The CUDA backend under a GPU memory budget: strips against the unsplit plan and the CPU
// stage (bitwise), the CPU fallback when not even one strip fits (reported), and an allocation failure
// injected at every allocation site of each stage in turn: each run ends in a re-planned success equal to
// the CPU result, and the pool's memory in use goes back to what the device caches hold (no leak).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/pipeline/cuda_stages.hpp"
#include "core/pipeline/device_registry.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/simulator.hpp"
#include "core/stages/aperture/aperture.hpp"
#include "core/stages/background/background.hpp"
#include "core/stages/detection/detection.hpp"
#include "kernels/cuda_stages_impl.hpp"
#include "kernels/device_context.hpp"
#include "tests/kernels/cuda_test_util.hpp"

using namespace gpuphot;

namespace {

using namespace gpuphot::cudatest;

const SimField& field() {
    static const SimField f = simulateDetectedField(420, 360, 250, 5);
    return f;
}

ApertureResult runApertures(const SimField& f, const ApertureParams& p, RunContext& ctx) {
    return cudatest::runApertures(f, f.det.sources, p, ctx);
}

// Memory in use beyond the device caches (must be 0 between stages: nothing leaked).
std::size_t uncached(cuda::DeviceContext& dc) {
    return dc.inUse() - dc.cachedFrameBytes() - dc.cachedBackgroundBytes();
}

} // namespace

TEST(CudaMemory, FailAfterHookAndEnvironment) {
    REQUIRE_DEVICE();
    cuda::DeviceContext dc(std::size_t(64) << 20);
    dc.setFailAfter(2);
    void* a = dc.allocate(1024);
    EXPECT_THROW(dc.allocate(1024), DeviceOutOfMemory);
    EXPECT_EQ(dc.inUse(), 1024u); // the failed allocation holds nothing
    void* b = dc.allocate(1024);  // one-shot
    dc.release(a, 1024);
    dc.release(b, 1024);
    EXPECT_EQ(dc.inUse(), 0u);
    EXPECT_EQ(dc.allocations(), 3u);
    RunContext hooked = testContext(Backend::Cuda);
    hooked.testHooks.cudaFailAfterAllocs = 7; // armed when the context's device state is created
    EXPECT_EQ(cuda::DeviceContext::of(hooked).failAfter(), 7u);
}

TEST(CudaMemory, BackgroundStripsMatchUnsplitAndCpu) {
    REQUIRE_DEVICE();
    const SimField& f = field();
    RunContext c = testContext(Backend::Cpu);
    const BackgroundResult ref = runBackground(f, c);
    RunContext w = testContext(Backend::Cuda);
    const BackgroundResult whole = runBackground(f, w);
    EXPECT_EQ(cuda::DeviceContext::of(w).planMode(), "whole");
    expectSameBackground(ref, whole);
    const int W = f.sim.image.width();
    const std::size_t perMeshRow = std::size_t(64) * W * 5; // default 64-pixel meshes, pixels + mask
    bool sawStrips = false;
    for (const double rowsOfMeshes : {2.0, 4.0}) {
        SCOPED_TRACE("budget of " + std::to_string(rowsOfMeshes) + " mesh rows");
        RunContext g = testContext(Backend::Cuda);
        g.gpuMemLimit = (std::size_t(64) << 10) + 8192 + static_cast<std::size_t>(rowsOfMeshes * perMeshRow);
        const BackgroundResult r = runBackground(f, g);
        auto& dc = cuda::DeviceContext::of(g);
        EXPECT_EQ(dc.planMode(), "strips");
        EXPECT_GE(dc.planStrips(), 2);
        EXPECT_LE(dc.planStrips(), 8);
        sawStrips = sawStrips || dc.planMode() == "strips";
        expectSameBackground(ref, r);
        EXPECT_LE(dc.highWater(), g.gpuMemLimit);
        EXPECT_EQ(dc.inUse(), 0u); // strips keep no cache
    }
    EXPECT_TRUE(sawStrips);
    // A source mask (second pass) in strips too.
    Image<std::int32_t> src(f.sim.image.width(), f.sim.image.height(), 0);
    for (int y = 100; y < 180; ++y)
        for (int x = 50; x < 300; ++x)
            src(x, y) = 1;
    const auto sv = src.view();
    RunContext g = testContext(Backend::Cuda);
    g.gpuMemLimit = (std::size_t(64) << 10) + 3 * std::size_t(64) * W * 9;
    expectSameBackground(cpu::estimateBackground(f.sim.image.view(), f.sim.defects.view(), BackgroundParams{}, c, &sv),
                         cuda::estimateBackground(f.sim.image.view(), f.sim.defects.view(), BackgroundParams{}, g, &sv));
    EXPECT_EQ(cuda::DeviceContext::of(g).planMode(), "strips");
}

TEST(CudaMemory, DetectionStripsMatchUnsplitAndCpu) {
    REQUIRE_DEVICE();
    const SimField& f = field();
    const int W = f.sim.image.width(), H = f.sim.image.height();
    std::vector<std::pair<std::string, DetectionParams>> cases = detectionFilterCases();
    DetectionParams wide;
    wide.filterFwhm = 5.0;
    cases.push_back({"wide filter", wide});
    for (const auto& [name, p] : cases) {
        SCOPED_TRACE(name);
        RunContext c = testContext(Backend::Cpu);
        const DetectionResult ref = runDetection(f, p, c);
        EXPECT_GT(ref.sources.size(), 20u);
        RunContext w = testContext(Backend::Cuda);
        expectSameDetection(ref, runDetection(f, p, w));
        EXPECT_EQ(cuda::DeviceContext::of(w).planMode(), "whole");
        for (const int strips : {2, 5, 8}) {
            SCOPED_TRACE(std::to_string(strips) + " strips wanted");
            const std::size_t perRow = std::size_t(W) * (15 + 13);
            const int rows = (H + strips - 1) / strips;
            RunContext g = testContext(Backend::Cuda);
            g.gpuMemLimit = (std::size_t(64) << 10) + std::size_t(2 * 8 + rows) * perRow + 4096;
            const DetectionResult r = runDetection(f, p, g);
            auto& dc = cuda::DeviceContext::of(g);
            EXPECT_EQ(dc.planMode(), "strips");
            EXPECT_GE(dc.planStrips(), 2);
            EXPECT_LE(dc.planStrips(), 10);
            expectSameDetection(ref, r);
            EXPECT_LE(dc.highWater(), g.gpuMemLimit);
            EXPECT_EQ(dc.inUse(), 0u);
        }
    }
}

TEST(CudaMemory, ApertureStripsMatchUnsplitAndCpu) {
    REQUIRE_DEVICE();
    const SimField& f = field();
    const int W = f.sim.image.width();
    ApertureParams mapSky;
    mapSky.useLocalSky = false;
    ApertureParams kron;
    kron.kronFactor = 2.0;
    kron.radii = {1, 2, 3, 4, 6, 8, 10, 12};
    for (const auto& [name, p] : std::vector<std::pair<std::string, ApertureParams>>{
             {"default", ApertureParams{}}, {"map sky", mapSky}, {"8 radii, Kron 2", kron}}) {
        SCOPED_TRACE(name);
        RunContext c = testContext(Backend::Cpu);
        const ApertureResult ref = runApertures(f, p, c);
        RunContext w = testContext(Backend::Cuda);
        expectSameApertures(ref, runApertures(f, p, w));
        EXPECT_EQ(cuda::DeviceContext::of(w).planMode(), "whole");
        for (const int rows : {60, 120}) {
            SCOPED_TRACE(std::to_string(rows) + "-row bands");
            RunContext g = testContext(Backend::Cuda);
            // Half the budget goes to the band (17 bytes per pixel), half to the per-source buffers.
            g.gpuMemLimit = 2 * (std::size_t(64 << 10) + std::size_t(rows) * W * 17);
            const ApertureResult r = runApertures(f, p, g);
            auto& dc = cuda::DeviceContext::of(g);
            EXPECT_EQ(dc.planMode(), "strips");
            EXPECT_GE(dc.planStrips(), 2);
            expectSameApertures(ref, r);
            EXPECT_LE(dc.highWater(), g.gpuMemLimit);
            EXPECT_EQ(dc.inUse(), 0u);
        }
    }
}

TEST(CudaMemory, TooSmallBudgetFallsBackToCpuAndSaysSo) {
    REQUIRE_DEVICE();
    const SimField& f = field();
    RunContext c = testContext(Backend::Cpu);
    RunContext g = testContext(Backend::Cuda);
    g.gpuMemLimit = 4096;
    BackgroundResult b;
    {
        auto t = g.time("background");
        b = runBackground(f, g);
    }
    expectSameBackground(runBackground(f, c), b);
    ASSERT_EQ(g.records.size(), 1u);
    EXPECT_EQ(g.records[0].devicePlan, "cpu");
    EXPECT_NE(g.records[0].deviceNote.find("gpu: stage background ran on the CPU: budget"), std::string::npos)
        << g.records[0].deviceNote;
    expectSameDetection(runDetection(f, DetectionParams{}, c), runDetection(f, DetectionParams{}, g));
    EXPECT_EQ(cuda::DeviceContext::of(g).planMode(), "cpu");
    expectSameApertures(runApertures(f, ApertureParams{}, c), runApertures(f, ApertureParams{}, g));
    EXPECT_EQ(cuda::DeviceContext::of(g).planMode(), "cpu");
    EXPECT_EQ(cuda::DeviceContext::of(g).inUse(), 0u);
}

// For each stage: count the allocations of a clean run (fresh context, as each injected run has), then
// fail the n-th for n = 1..count: every run succeeds (re-planned) with the CPU stage's result, the failure
// was consumed, and only the device caches hold memory afterwards.
TEST(CudaMemory, InjectedAllocationFailureAtEverySite) {
    REQUIRE_DEVICE();
    const SimField f = simulateDetectedField(200, 170, 60, 9);
    RunContext c = testContext(Backend::Cpu);
    const BackgroundResult refB = runBackground(f, c);
    const DetectionResult refD = runDetection(f, DetectionParams{}, c);
    const ApertureResult refA = runApertures(f, ApertureParams{}, c);

    struct StageCase {
        const char* name;
        std::function<void(RunContext&)> run;
    };
    const std::vector<StageCase> stages = {
        {"background", [&](RunContext& g) { expectSameBackground(refB, runBackground(f, g)); }},
        {"detection", [&](RunContext& g) { expectSameDetection(refD, runDetection(f, DetectionParams{}, g)); }},
        {"aperture", [&](RunContext& g) { expectSameApertures(refA, runApertures(f, ApertureParams{}, g)); }},
    };
    for (const StageCase& s : stages) {
        SCOPED_TRACE(s.name);
        std::size_t count = 0;
        {
            RunContext g = testContext(Backend::Cuda);
            auto& dc = cuda::DeviceContext::of(g);
            s.run(g);
            count = dc.allocations();
            EXPECT_EQ(dc.planMode(), "whole");
        }
        ASSERT_GT(count, 3u);
        for (std::size_t n = 1; n <= count; ++n) {
            SCOPED_TRACE("allocation " + std::to_string(n) + " of " + std::to_string(count) + " fails");
            RunContext g = testContext(Backend::Cuda);
            auto& dc = cuda::DeviceContext::of(g);
            dc.setFailAfter(n);
            ASSERT_NO_THROW(s.run(g));
            EXPECT_EQ(dc.failAfter(), 0u); // the failure happened
            EXPECT_NE(dc.planMode(), "cpu"); // one failure is answered by strips, not by the CPU
            EXPECT_EQ(uncached(dc), 0u);
            if (::testing::Test::HasFailure()) break; // one report per stage is enough
        }
    }
}

// Whole pipeline of stages in one context under a budget that forces strips everywhere, with the plan in
// each stage's record.
TEST(CudaMemory, StagesUnderBudgetRecordTheirPlans) {
    REQUIRE_DEVICE();
    const SimField& f = field();
    RunContext c = testContext(Backend::Cpu);
    RunContext g = testContext(Backend::Cuda);
    BackgroundResult b;
    DetectionResult d;
    ApertureResult a;
    const std::size_t W = f.sim.image.width(), H = f.sim.image.height();
    const std::size_t limits[3] = {(64 << 10) + 5 * 64 * W * 5 / 2,             // 2.5 mesh rows
                                   (64 << 10) + (16 + H / 3) * 28 * W + 4096,   // a third of the rows
                                   2 * ((64 << 10) + H / 3 * 17 * W)};          // a third of the rows
    {
        g.gpuMemLimit = limits[0];
        auto t = g.time("background");
        b = cuda::estimateBackground(f.sim.image.view(), f.sim.defects.view(), BackgroundParams{}, g, nullptr);
    }
    {
        g.gpuMemLimit = limits[1];
        auto t = g.time("detection");
        d = cuda::detectSources(f.sim.image.view(), f.sim.defects.view(), b, DetectionParams{}, g);
    }
    {
        g.gpuMemLimit = limits[2];
        auto t = g.time("aperture");
        a = cuda::measureApertures(f.sim.image.view(), f.sim.defects.view(), b, d.segmentation.view(), d.sources,
                                   3.0, 1.5, 6.0, ApertureParams{}, g);
    }
    expectSameBackground(f.bkg, b);
    expectSameDetection(f.det, d);
    ASSERT_EQ(g.records.size(), 3u);
    for (int k = 0; k < 3; ++k) {
        const StageRecord& r = g.records[k];
        SCOPED_TRACE(r.stage);
        EXPECT_EQ(r.devicePlan, "strips");
        EXPECT_GE(r.deviceStrips, 2);
        EXPECT_TRUE(r.deviceNote.empty()) << r.deviceNote;
        EXPECT_LE(r.deviceHighWater, limits[k]);
    }
    RunContext c2 = testContext(Backend::Cpu);
    expectSameApertures(cpu::measureApertures(f.sim.image.view(), f.sim.defects.view(), f.bkg,
                                              f.det.segmentation.view(), f.det.sources, 3.0, 1.5, 6.0,
                                              ApertureParams{}, c2),
                        a);
}

// The device caches' key tells two images apart by their allocation serial even where address, size
// and every sampled pixel agree (a new mask at a freed one's address differing in a few pixels); the
// same image (and a moved one) keeps its key. Host code: runs without a device.
TEST(CudaMemory, ViewKeyTellsReallocatedImagesApart) {
    Image<std::uint8_t> a(300, 200, 0);
    Image<std::uint8_t> b(300, 200, 0);
    // Same content, and a view of b faked at a's address: only the serial differs.
    MaskView bv = b.view();
    bv.data = a.data();
    EXPECT_EQ(cuda::viewKey(a.view()).print, cuda::viewKey(bv).print);
    EXPECT_NE(a.serial(), b.serial());
    EXPECT_FALSE(cuda::viewKey(a.view()) == cuda::viewKey(bv));
    EXPECT_TRUE(cuda::viewKey(a.view()) == cuda::viewKey(a.view()));
    const cuda::ViewKey before = cuda::viewKey(a.view());
    Image<std::uint8_t> moved(std::move(a));
    EXPECT_TRUE(cuda::viewKey(moved.view()) == before);
    const Image<std::uint8_t> copied(moved);
    EXPECT_NE(copied.serial(), moved.serial());
    // A strip keeps the serial; a view of foreign memory has none.
    EXPECT_EQ(moved.view().strip(10, 20).serial, moved.serial());
    const std::vector<std::uint8_t> foreign(100, 0);
    EXPECT_EQ((MaskView{foreign.data(), 10, 10, 10}).serial, 0u);
}
