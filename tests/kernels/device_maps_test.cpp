// Device-resident background maps (kernels/device_maps.hpp) and the pinned staging copies
// (DeviceContext::uploadStaged / downloadStaged): the lean CUDA background keeps its maps on the device,
// bitwise the CPU stage's full maps; detection and apertures on a lean result (maps on the device, the
// host half on the sampler) give the CPU stages' results bitwise, whole and in strips, also when the
// maps were dropped and are made again from the mesh grid; the whole pipeline on both backends gives the
// same catalog columns; staged copies round-trip any size.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/catalog/reference_catalog.hpp"
#include "core/model/frame.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/aperture/aperture.hpp"
#include "core/stages/background/background.hpp"
#include "core/sim/sim_frame.hpp"
#include "core/sim/simulator.hpp"
#include "core/stages/detection/detection.hpp"
#include "kernels/cuda_stages_impl.hpp"
#include "kernels/device_context.hpp"
#include "kernels/device_maps.hpp"
#include "tests/core/test_fields.hpp"
#include "tests/kernels/cuda_test_util.hpp"

using namespace gpuphot;
using namespace gpuphot::cudatest;

namespace {

constexpr int kW = 640, kH = 480;

// The CUDA background stage with lean maps, with the sampler the pipeline attaches.
BackgroundResult leanCudaBackground(const SimField& f, RunContext& g) {
    BackgroundParams p;
    p.fullMaps = false;
    BackgroundResult b = cuda::estimateBackground(f.sim.image.view(), f.sim.defects.view(), p, g, nullptr);
    b.sampler = std::make_shared<const BackgroundSampler>(b, g);
    return b;
}

std::vector<float> downloadMap(const float* d, std::size_t n) {
    std::vector<float> h(n);
    // The maps are written on the DeviceContext's non-blocking stream, which a legacy-stream cudaMemcpy
    // does not wait for (compute-sanitizer's slower kernels showed it): wait for the device first.
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
}

// A detection on a SimField with another background result.
DetectionResult detectWith(const SimField& f, const BackgroundResult& b, RunContext& ctx) {
    auto* stage = ctx.backend == Backend::Cuda ? &cuda::detectSources : &cpu::detectSources;
    return stage(f.sim.image.view(), f.sim.defects.view(), b, DetectionParams{}, ctx);
}

ApertureResult aperturesWith(const SimField& f, const BackgroundResult& b, const ApertureParams& p,
                             RunContext& ctx) {
    const cudatest::ApertureStageFn stage = cudatest::apertureStage(ctx);
    return stage(f.sim.image.view(), f.sim.defects.view(), b, f.det.segmentation.view(), f.det.sources, 3.0,
                 1.5, 6.0, p, ctx);
}

} // namespace

TEST(DeviceMaps, LeanBackgroundKeepsBitwiseMapsOnTheDevice) {
    REQUIRE_DEVICE();
    const SimField f = simulateDetectedField(kW, kH, 300, 41);
    RunContext g = cudaContext();
    const BackgroundResult b = leanCudaBackground(f, g);
    EXPECT_FALSE(b.hasFullMaps()); // nothing downloaded
    auto& dc = cuda::DeviceContext::of(g);
    const std::size_t npix = static_cast<std::size_t>(kW) * kH;
    EXPECT_EQ(dc.cachedBackgroundBytes(), npix * 8) << "the maps stay on the device";
    const std::size_t before = dc.cachedBackgroundBytes();
    const auto maps = cuda::deviceBackgroundMaps(dc, b);
    EXPECT_EQ(dc.cachedBackgroundBytes(), before);
    ASSERT_NE(maps.first, nullptr);
    // f.bkg: the CPU stage's full maps with the defaults.
    EXPECT_TRUE(sameVec(downloadMap(maps.first, npix),
                        std::vector<float>(f.bkg.level.data(), f.bkg.level.data() + npix), "level map"));
    EXPECT_TRUE(sameVec(downloadMap(maps.second, npix),
                        std::vector<float>(f.bkg.rms.data(), f.bkg.rms.data() + npix), "rms map"));
    EXPECT_TRUE(sameImage(f.bkg.meshLevel, b.meshLevel, "mesh level"));
    EXPECT_TRUE(sameImage(f.bkg.meshRms, b.meshRms, "mesh rms"));
    // Dropped and asked for again: made from the grid, the same bits.
    dc.dropBackground();
    const auto again = cuda::deviceBackgroundMaps(dc, b);
    EXPECT_TRUE(sameVec(downloadMap(again.first, npix),
                        std::vector<float>(f.bkg.level.data(), f.bkg.level.data() + npix),
                        "level map, remade"));
}

namespace {
// Detection and apertures (local and map sky) on a lean CUDA background against the CPU stages on full
// maps; strips: under a budget below the whole plans (rows of the maps interpolated per strip / band).
void checkLeanStages(std::uint64_t seed, bool strips) {
    const SimField f = simulateDetectedField(kW, kH, 400, seed);
    RunContext c = cpuContext();
    RunContext g = cudaContext();
    const BackgroundResult b = leanCudaBackground(f, g);
    auto& dc = cuda::DeviceContext::of(g);
    if (strips) g.gpuMemLimit = dc.inUse() + (std::size_t(600) << 10);
    expectSameDetection(f.det, detectWith(f, b, g));
    EXPECT_EQ(dc.planMode(), strips ? "strips" : "whole");
    for (const bool localSky : {true, false}) {
        ApertureParams p;
        p.useLocalSky = localSky; // false: the sky from the maps on the device
        SCOPED_TRACE(localSky ? "local sky" : "map sky");
        expectSameApertures(aperturesWith(f, f.bkg, p, c), aperturesWith(f, b, p, g));
        EXPECT_EQ(dc.planMode(), strips ? "strips" : "whole");
    }
    // The maps gone (another run's): made again from the grid.
    dc.dropBackground();
    expectSameDetection(f.det, detectWith(f, b, g));
}
} // namespace

TEST(DeviceMaps, DetectionAndAperturesOnLeanMapsMatchCpu) {
    REQUIRE_DEVICE();
    checkLeanStages(42, false);
}

TEST(DeviceMaps, StripsOnLeanMapsMatchCpu) {
    REQUIRE_DEVICE();
    checkLeanStages(43, true);
}

TEST(DeviceMaps, PipelineOnBothBackendsGivesTheSameColumns) {
    REQUIRE_DEVICE();
    const SimResult sim = simulateSmall(kW, kH, 500, 44);
    Frame frame;
    frame.pixels = sim.image;
    frame.mask = sim.defects;
    frame.instrument.gain = 3.0;
    frame.instrument.readNoise = 6.0;
    PipelineConfig config;
    RunContext c = cpuContext();
    RunContext g = cudaContext();
    const PipelineResult rc = runPipeline(frame, config, c);
    const PipelineResult rg = runPipeline(frame, config, g);
    EXPECT_FALSE(rg.background.hasFullMaps()); // lean on the CUDA backend too
    ASSERT_TRUE(rg.background.sampler);
    expectSameDetection(rc.detection, rg.detection);
    expectSameApertures(rc.aperture, rg.aperture);
    EXPECT_TRUE(sameVec(rc.magInst, rg.magInst, "mag_inst"));
    EXPECT_EQ(rc.fwhm, rg.fwhm);
}

// With a reference catalog the CUDA backend solves the astrometry on a host thread beside the PSF and
// aperture stages: the calibration must be the CPU backend's, bit for bit, and the report must list the
// astrometry once, after the apertures, as the CPU backend does.
TEST(DeviceMaps, CalibrationBesideTheDeviceStagesMatchesCpu) {
    REQUIRE_DEVICE();
    SimParams sp;
    sp.width = 2048;
    sp.height = 2048;
    sp.stars = 4000;
    sp.seed = 45;
    sp.wcsOffset = 0.1; // arcmin: the header WCS needs refining
    const SimResult sim = simulateField(sp);
    const Frame frame = frameFromSimulation(sim);
    const ReferenceCatalog ref = test::referenceOf(sim);
    PipelineConfig config;
    RunContext c = cpuContext();
    RunContext g = cudaContext();
    const PipelineResult rc = runPipeline(frame, config, c, &ref);
    const PipelineResult rg = runPipeline(frame, config, g, &ref);
    ASSERT_TRUE(rc.astrometry.ok) << rc.astrometry.message;
    ASSERT_TRUE(rg.astrometry.ok) << rg.astrometry.message;
    EXPECT_EQ(rc.astrometry.wcs.crval[0], rg.astrometry.wcs.crval[0]);
    EXPECT_EQ(rc.astrometry.wcs.crval[1], rg.astrometry.wcs.crval[1]);
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j)
            EXPECT_EQ(rc.astrometry.wcs.cd[i][j], rg.astrometry.wcs.cd[i][j]);
    EXPECT_EQ(rc.astrometry.refIndex, rg.astrometry.refIndex);
    EXPECT_EQ(rc.astrometry.dxArcsec, rg.astrometry.dxArcsec);
    EXPECT_EQ(rc.astrometry.rmsArcsec, rg.astrometry.rmsArcsec);
    ASSERT_TRUE(rc.zeropoint.ok) << rc.zeropoint.message;
    EXPECT_EQ(rc.zeropoint.zp, rg.zeropoint.zp);
    EXPECT_EQ(rc.zeropoint.zpErr, rg.zeropoint.zpErr);
    EXPECT_EQ(rc.crossmatch.refIndex, rg.crossmatch.refIndex);
    auto stages = [](const RunContext& ctx) {
        std::vector<std::string> v;
        for (const StageRecord& r : ctx.records)
            v.push_back(r.stage);
        return v;
    };
    const std::vector<std::string> sc = stages(c), sg = stages(g);
    EXPECT_EQ(std::count(sg.begin(), sg.end(), "astrometry"), 1);
    const auto after = [](const std::vector<std::string>& v, const char* a, const char* b) {
        const auto ia = std::find(v.begin(), v.end(), a), ib = std::find(v.begin(), v.end(), b);
        return ia != v.end() && ib != v.end() && ia > ib;
    };
    EXPECT_TRUE(after(sc, "astrometry", "aperture"));
    EXPECT_TRUE(after(sg, "astrometry", "aperture"));
}

TEST(DeviceMaps, StagedCopiesRoundTripAnySize) {
    REQUIRE_DEVICE();
    RunContext g = cudaContext();
    auto& dc = cuda::DeviceContext::of(g);
    dc.setStagingChunk(8192);
    std::mt19937 rng(7);
    for (const std::size_t bytes :
         {std::size_t(100), std::size_t(8192), std::size_t(8193), std::size_t(70001), std::size_t(3) << 20}) {
        std::vector<unsigned char> src(bytes), back(bytes, 0);
        for (auto& b : src)
            b = static_cast<unsigned char>(rng());
        cuda::DeviceBuffer<unsigned char> d(dc, bytes);
        const std::uint64_t staged = dc.stagedBytes();
        dc.uploadStaged(d.get(), src.data(), bytes);
        dc.downloadStaged(back.data(), d.get(), bytes);
        EXPECT_EQ(std::memcmp(src.data(), back.data(), bytes), 0) << bytes << " bytes";
        EXPECT_EQ(dc.stagedBytes() - staged, bytes >= 8192 ? 2 * bytes : 0) << bytes << " bytes";
    }
    // Row uploads of a contiguous view use the staging as well, any stride does not.
    Image<float> img(300, 41);
    for (int y = 0; y < 41; ++y)
        for (int x = 0; x < 300; ++x)
            img(x, y) = static_cast<float>(x * 1000 + y);
    cuda::DeviceBuffer<float> d(dc, 300 * 41);
    cuda::uploadRows(dc, d.get(), img.view(), 0, 41);
    std::vector<float> back(300 * 41);
    dc.downloadStaged(back.data(), d.get(), back.size() * sizeof(float));
    EXPECT_EQ(std::memcmp(back.data(), img.data(), back.size() * sizeof(float)), 0);
}
