#include "tests/kernels/cuda_test_util.hpp"

#include <cuda_runtime.h>

#include "core/pipeline/device_registry.hpp"
#include "kernels/cuda_stages_impl.hpp"

namespace gpuphot::cudatest {

bool haveDevice() {
    cuda::linkKernels();
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return n > 0;
}

RunContext testContext(Backend backend, int threads) {
    RunContext c;
    c.backend = backend;
    c.threads = threads;
    useEnvironment(c);
    return c;
}

void useEnvironment(RunContext& ctx) {
    ctx.tuning = BackendTuning::fromEnvironment();
    const char* rank = std::getenv("GPUPHOT_TEST_DETECTION_RANK_MAX");
    ctx.testHooks.detectionRankMax = rank && *rank ? std::atoi(rank) : -1;
}

void expectSameBackground(const BackgroundResult& c, const BackgroundResult& g) {
    EXPECT_TRUE(sameImage(c.meshLevel, g.meshLevel, "meshLevel"));
    EXPECT_TRUE(sameImage(c.meshRms, g.meshRms, "meshRms"));
    EXPECT_TRUE(sameImage(c.level, g.level, "level"));
    EXPECT_TRUE(sameImage(c.rms, g.rms, "rms"));
    EXPECT_EQ(std::memcmp(&c.globalLevel, &g.globalLevel, sizeof(double)), 0);
    EXPECT_EQ(std::memcmp(&c.globalRms, &g.globalRms, sizeof(double)), 0);
    EXPECT_EQ(c.badMeshes, g.badMeshes);
}

void expectSameDetection(const DetectionResult& c, const DetectionResult& g) {
    ASSERT_EQ(c.sources.size(), g.sources.size());
    EXPECT_EQ(c.nBeforeDeblend, g.nBeforeDeblend);
    EXPECT_EQ(c.nDeblended, g.nDeblended);
    EXPECT_EQ(c.nCleaned, g.nCleaned);
    const Sources& a = c.sources;
    const Sources& b = g.sources;
    EXPECT_TRUE(sameVec(a.x, b.x, "x"));
    EXPECT_TRUE(sameVec(a.y, b.y, "y"));
    EXPECT_TRUE(sameVec(a.xErr, b.xErr, "xErr"));
    EXPECT_TRUE(sameVec(a.yErr, b.yErr, "yErr"));
    EXPECT_TRUE(sameVec(a.xIso, b.xIso, "xIso"));
    EXPECT_TRUE(sameVec(a.yIso, b.yIso, "yIso"));
    EXPECT_TRUE(sameVec(a.x2, b.x2, "x2"));
    EXPECT_TRUE(sameVec(a.y2, b.y2, "y2"));
    EXPECT_TRUE(sameVec(a.xy, b.xy, "xy"));
    EXPECT_TRUE(sameVec(a.a, b.a, "a"));
    EXPECT_TRUE(sameVec(a.b, b.b, "b"));
    EXPECT_TRUE(sameVec(a.theta, b.theta, "theta"));
    EXPECT_TRUE(sameVec(a.fluxIso, b.fluxIso, "fluxIso"));
    EXPECT_TRUE(sameVec(a.fluxIsoErr, b.fluxIsoErr, "fluxIsoErr"));
    EXPECT_TRUE(sameVec(a.areaIso, b.areaIso, "areaIso"));
    EXPECT_TRUE(sameVec(a.peak, b.peak, "peak"));
    EXPECT_TRUE(sameVec(a.xMin, b.xMin, "xMin"));
    EXPECT_TRUE(sameVec(a.xMax, b.xMax, "xMax"));
    EXPECT_TRUE(sameVec(a.yMin, b.yMin, "yMin"));
    EXPECT_TRUE(sameVec(a.yMax, b.yMax, "yMax"));
    EXPECT_TRUE(sameVec(a.flags, b.flags, "flags"));
    EXPECT_TRUE(sameVec(a.segmentId, b.segmentId, "segmentId"));
    EXPECT_TRUE(sameImage(c.segmentation.host(), g.segmentation.host(), "segmentation"));
}

void expectSameApertures(const ApertureResult& c, const ApertureResult& g) {
    ASSERT_EQ(c.count, g.count);
    EXPECT_TRUE(sameVec(c.radii, g.radii, "radii"));
    ASSERT_EQ(c.flux.size(), g.flux.size());
    for (std::size_t r = 0; r < c.flux.size(); ++r) {
        const std::string k = "[" + std::to_string(r) + "]";
        EXPECT_TRUE(sameVec(c.flux[r], g.flux[r], "flux" + k));
        EXPECT_TRUE(sameVec(c.fluxErr[r], g.fluxErr[r], "fluxErr" + k));
        EXPECT_TRUE(sameVec(c.apertureFlags[r], g.apertureFlags[r], "apertureFlags" + k));
    }
    EXPECT_TRUE(sameVec(c.sky, g.sky, "sky"));
    EXPECT_TRUE(sameVec(c.skyRms, g.skyRms, "skyRms"));
    EXPECT_TRUE(sameVec(c.skyArea, g.skyArea, "skyArea"));
    EXPECT_TRUE(sameVec(c.kronRadius, g.kronRadius, "kronRadius"));
    EXPECT_TRUE(sameVec(c.fluxAuto, g.fluxAuto, "fluxAuto"));
    EXPECT_TRUE(sameVec(c.fluxAutoErr, g.fluxAutoErr, "fluxAutoErr"));
    EXPECT_TRUE(sameVec(c.radiusOpt, g.radiusOpt, "radiusOpt"));
    EXPECT_TRUE(sameVec(c.fluxOpt, g.fluxOpt, "fluxOpt"));
    EXPECT_TRUE(sameVec(c.fluxOptErr, g.fluxOptErr, "fluxOptErr"));
    EXPECT_TRUE(sameVec(c.apCorrMag, g.apCorrMag, "apCorrMag"));
    EXPECT_TRUE(sameVec(c.apCorrMagErr, g.apCorrMagErr, "apCorrMagErr"));
    EXPECT_TRUE(sameVec(c.apCorrRatio, g.apCorrRatio, "apCorrRatio"));
    EXPECT_TRUE(sameVec(c.apCorrStarIndex, g.apCorrStarIndex, "apCorrStarIndex"));
    EXPECT_TRUE(sameVec(c.cogRadius, g.cogRadius, "cogRadius"));
    EXPECT_TRUE(sameVec(c.cogFraction, g.cogFraction, "cogFraction"));
    EXPECT_TRUE(sameVec(c.flags, g.flags, "flags"));
    EXPECT_EQ(c.apCorrStars, g.apCorrStars);
}

std::vector<std::pair<std::string, DetectionParams>> detectionFilterCases() {
    std::vector<std::pair<std::string, DetectionParams>> cases;
    cases.push_back({"default", DetectionParams{}});
    DetectionParams none;
    none.filter = false;
    cases.push_back({"no filter", none});
    DetectionParams k2d;
    k2d.filterKernel = {1, 2, 1, 2, 4, 2, 1, 2, 1, 2, 4, 2, 1, 2, 1};
    k2d.filterKernelWidth = 3;
    cases.push_back({"2-D kernel 3x5", k2d});
    return cases;
}

SimResult simulateSmall(int width, int height, int stars, std::uint64_t seed) {
    SimParams p;
    p.width = width;
    p.height = height;
    p.stars = stars;
    p.seed = seed;
    return simulateField(p);
}

SimField simulateDetectedField(int width, int height, int stars, std::uint64_t seed) {
    SimField f{simulateSmall(width, height, stars, seed), {}, {}};
    RunContext c = cpuContext();
    f.bkg = estimateBackground(f.sim.image.view(), f.sim.defects.view(), BackgroundParams{}, c);
    f.det = detectSources(f.sim.image.view(), f.sim.defects.view(), f.bkg, DetectionParams{}, c);
    return f;
}

BackgroundResult runBackground(const SimField& f, RunContext& ctx) {
    auto* stage = ctx.backend == Backend::Cuda ? &cuda::estimateBackground : &cpu::estimateBackground;
    return stage(f.sim.image.view(), f.sim.defects.view(), BackgroundParams{}, ctx, nullptr);
}

DetectionResult runDetection(const SimField& f, const DetectionParams& p, RunContext& ctx) {
    auto* stage = ctx.backend == Backend::Cuda ? &cuda::detectSources : &cpu::detectSources;
    return stage(f.sim.image.view(), f.sim.defects.view(), f.bkg, p, ctx);
}

ApertureStageFn apertureStage(const RunContext& ctx) {
    return ctx.backend == Backend::Cuda ? ApertureStageFn(&cuda::measureApertures)
                                        : ApertureStageFn(&cpu::measureApertures);
}

ApertureResult runApertures(const SimField& f, const Sources& sources, const ApertureParams& p,
                            RunContext& ctx, bool withMask, bool withSeg) {
    useEnvironment(ctx); // the scope's GPUPHOT_APERTURE_... switches
    return apertureStage(ctx)(f.sim.image.view(), withMask ? f.sim.defects.view() : MaskView{}, f.bkg,
                 withSeg ? f.det.segmentation.view() : ImageViewT<std::int32_t>{}, sources, 3.0, 1.5, 6.0, p,
                 ctx);
}

} // namespace gpuphot::cudatest
