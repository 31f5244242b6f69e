// The CUDA aperture stage against the CPU one (docs/ARCHITECTURE.md, Determinism): every column of
// ApertureResult bitwise equal on simulated frames for several parameter sets (pixel and FWHM radii, local
// sky on/off and its estimators, many radii, Kron, curve of growth, optimal apertures), with extra sources at
// the edges, off the frame and at non-finite positions; repeated runs and launch configurations identical.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "core/model/sources.hpp"
#include "core/pipeline/cuda_stages.hpp"
#include "core/pipeline/device_registry.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/simulator.hpp"
#include "core/stages/aperture/aperture.hpp"
#include "core/stages/aperture/aperture_internal.hpp"
#include "core/stages/background/background.hpp"
#include "core/stages/detection/detection.hpp"
#include "kernels/cuda_stages_impl.hpp"
#include "kernels/device_context.hpp"
#include "tests/kernels/cuda_test_util.hpp"

using namespace gpuphot;

namespace gpuphot::cuda { // kernels/aperture/aperture.cu's test hook
void debugLocalSkies(const ImageView& image, const MaskView& mask, const ImageViewT<std::int32_t>& seg,
                     const double* cx, const double* cy, std::size_t n, double rin, double rout,
                     const detail::SkyParamsHD& p, double saturation, RunContext& ctx,
                     std::vector<int>& offsets, std::vector<int>& index, std::vector<float>& sorted,
                     std::vector<detail::SkyEstimate>& est);
void debugOptimalRadii(const detail::OptimalJob* jobs, std::size_t n, const detail::OptimalGrid& grid,
                       std::int32_t* index, RunContext& ctx);
} // namespace gpuphot::cuda

namespace {

using namespace gpuphot::cudatest;

// A simulated field plus extra sources: edge / off-frame / non-finite positions.
struct Field : SimField {
    Sources sources; // detections plus the extras
};

Field makeField(int w, int h, int stars, std::uint64_t seed) {
    Field f{simulateDetectedField(w, h, stars, seed), {}};
    f.sources = f.det.sources;
    // extras: only x and y (the other columns fall back), at the corners, half off the frame, outside it,
    // and NaN
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const double xs[] = {0.0, w - 1.0, 2.3, -3.0, w + 2.5, 40.7, nan, 17.0};
    const double ys[] = {0.0, h - 1.0, h - 2.6, 20.0, 30.0, -1.2, 12.0, nan};
    for (int k = 0; k < 8; ++k) {
        f.sources.x.push_back(xs[k]);
        f.sources.y.push_back(ys[k]);
    }
    return f;
}

ApertureResult run(const Field& f, const ApertureParams& p, RunContext& ctx, bool withMask = true,
                   bool withSeg = true) {
    return runApertures(f, f.sources, p, ctx, withMask, withSeg);
}

std::vector<std::pair<std::string, ApertureParams>> paramSets() {
    std::vector<std::pair<std::string, ApertureParams>> v;
    v.push_back({"default", ApertureParams{}});
    ApertureParams fw;
    fw.radiiInFwhm = true;
    fw.radii = {0.5, 1.0, 1.5, 2.0, 3.0};
    fw.skyEstimator = SkyEstimator::Mode;
    v.push_back({"FWHM radii, mode sky", fw});
    ApertureParams map;
    map.useLocalSky = false;
    map.optimal = false;
    v.push_back({"background map sky, no optimal", map});
    ApertureParams med;
    med.skyEstimator = SkyEstimator::Median;
    med.annulusInFwhm = false;
    med.annulusInner = 8.0;
    med.annulusOuter = 14.0;
    med.saturation = 20000.0;
    med.skyClipSigma = 2.5;
    v.push_back({"pixel annulus, median sky, saturation", med});
    ApertureParams many;
    many.radii = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12}; // > 8 radii: binary search path on the CPU
    many.apCorrMinStars = 100000;                     // Gaussian curve of growth
    many.kronFactor = 2.0;
    many.kronMinRadius = 2.5;
    v.push_back({"11 radii, Gaussian curve of growth, Kron 2.0", many});
    ApertureParams noclip;
    noclip.skyClipSigma = 0.0;
    noclip.apertureCorrection = false;
    noclip.minSkyPixels = 400; // many sky failures: map fallback
    v.push_back({"no clipping, no aperture correction, sky failures", noclip});
    for (const auto& [name, n] : {std::pair{"MASK_TYPE CORRECT", NeighbourPixels::Correct},
                                  std::pair{"MASK_TYPE BLANK", NeighbourPixels::Blank},
                                  std::pair{"MASK_TYPE NONE", NeighbourPixels::None}}) {
        ApertureParams m;
        m.neighbourPixels = n;
        m.radii = {1.5, 3.0, 6.0};
        v.push_back({name, m});
    }
    return v;
}

// Sets GPUPHOT_APERTURE_HEAPSORT (the annulus sort of the CUDA engines made meanwhile) and unsets it after.
struct AnnulusSortEnv {
    explicit AnnulusSortEnv(const char* value) { ::setenv("GPUPHOT_APERTURE_HEAPSORT", value, 1); }
    ~AnnulusSortEnv() { ::unsetenv("GPUPHOT_APERTURE_HEAPSORT"); }
};

// Sets an environment variable for a scope (unset after).
struct ScopedEnv {
    ScopedEnv(const char* name, const char* value) : m_name(name) { ::setenv(name, value, 1); }
    ~ScopedEnv() { ::unsetenv(m_name); }
    const char* m_name;
};

} // namespace

// The block-per-source local sky, warp-per-source Kron and warp-per-source circle parts and the earlier
// kernels (GPUPHOT_APERTURE_SKY=split|fused, GPUPHOT_APERTURE_KRON=thread|warp,
// GPUPHOT_APERTURE_CIRCLE=thread|warp) both give the CPU's numbers, bitwise, for every parameter set (sky failures, mode/median skies,
// many radii, no local sky, curve of growth from stars and Gaussian, optimal apertures).
TEST(ApertureCuda, NewAndEarlierKernelsMatchCpu) {
    REQUIRE_DEVICE();
    const Field f = makeField(700, 600, 2500, 19);
    RunContext c = testContext(Backend::Cpu);
    for (const auto& [name, p] : paramSets()) {
        const ApertureResult rc = run(f, p, c);
        for (const char* mode : {"new", "earlier"}) {
            const bool earlier = std::string(mode) == "earlier";
            SCOPED_TRACE(name + ", " + mode + " kernels");
            const ScopedEnv e1("GPUPHOT_APERTURE_SKY", earlier ? "split" : "fused");
            const ScopedEnv e2("GPUPHOT_APERTURE_KRON", earlier ? "thread" : "warp");
            const ScopedEnv e3("GPUPHOT_APERTURE_CIRCLE", earlier ? "thread" : "warp");
            const ScopedEnv e4("GPUPHOT_APERTURE_OPTIMAL", earlier ? "host" : "device");
            RunContext g = testContext(Backend::Cuda);
            expectSameApertures(rc, run(f, p, g));
        }
    }
}

// Pass 3's optimal radius search on the device (one thread per source) gives the host search's grid index
// for every source: random curves of growth (rising, falling, with zero, negative and NaN fractions), with
// and without the Poisson term, sky variances zero, NaN and positive, sky pixel counts finite and infinite,
// a flat curve (the smallest radius wins), and a grid where no radius qualifies (the last index).
TEST(ApertureCuda, OptimalRadiiMatchHostSearch) {
    REQUIRE_DEVICE();
    RunContext g = testContext(Backend::Cuda);
    const double kNaN = std::numeric_limits<double>::quiet_NaN();
    const double kInf = std::numeric_limits<double>::infinity();
    std::uint64_t state = 12345;
    auto uniform = [&] { // xorshift64*, [0, 1)
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        return static_cast<double>((state * 2685821657736338717ULL) >> 11) * 0x1.0p-53;
    };
    for (int gridCase = 0; gridCase < 6; ++gridCase) {
        SCOPED_TRACE("grid case " + std::to_string(gridCase));
        const std::size_t ng = gridCase == 5 ? 7 : 186;
        std::vector<double> r(ng), frac(ng), num(ng), area(ng), kappaArea(ng);
        const double kappa = 1.0 + 0.3 * gridCase;
        for (std::size_t k = 0; k < ng; ++k) {
            r[k] = 0.5 + 0.05 * static_cast<double>(k);
            const double rise = 1.0 - std::exp(-r[k] * r[k] / (2.0 * (1.0 + gridCase)));
            frac[k] = gridCase == 1 ? 0.5 : rise * (1.0 + 0.02 * (uniform() - 0.5)); // 1: flat
            if (gridCase == 2 && k % 17 == 3) frac[k] = -0.1;
            if (gridCase == 2 && k % 29 == 5) frac[k] = kNaN;
            if (gridCase == 3 && k < 20) frac[k] = 0.0;
            if (gridCase == 5) frac[k] = -1.0; // nothing qualifies
            num[k] = frac[k] * frac[k];
            area[k] = 3.141592653589793 * r[k] * r[k];
            kappaArea[k] = kappa * area[k];
        }
        for (const double gain : {0.0, 1.7}) {
            SCOPED_TRACE("gain " + std::to_string(gain));
            const detail::OptimalGrid grid{frac.data(), num.data(), area.data(), kappaArea.data(), ng, gain,
                                           gain > 0.0};
            const std::size_t n = 5000;
            std::vector<detail::OptimalJob> jobs(n);
            for (std::size_t i = 0; i < n; ++i) {
                const double F = (i % 7 == 0) ? 0.0 : std::pow(10.0, 1.0 + 5.0 * uniform());
                double var = std::pow(10.0, -1.0 + 4.0 * uniform());
                if (i % 11 == 0) var = 0.0;
                if (i % 13 == 0) var = kNaN;
                const double nSky = (i % 5 == 0) ? kInf : std::floor(20.0 + 2000.0 * uniform());
                jobs[i] = detail::OptimalJob{F, var, nSky};
            }
            std::vector<std::int32_t> dev(n, -7);
            cuda::debugOptimalRadii(jobs.data(), n, grid, dev.data(), g);
            std::vector<double> den(ng);
            std::size_t mismatches = 0;
            for (std::size_t i = 0; i < n; ++i) {
                for (std::size_t k = 0; k < ng; ++k)
                    den[k] = detail::optimalVariance(grid.poisson, jobs[i].F, frac[k], gain, area[k], jobs[i].var,
                                                     kappaArea[k], jobs[i].nSky);
                const std::size_t host =
                    detail::optimalGridIndex(frac.data(), num.data(), ng, [&](std::size_t k) { return den[k]; });
                if (static_cast<std::size_t>(dev[i]) != host && mismatches++ < 5)
                    ADD_FAILURE() << "source " << i << ": device " << dev[i] << ", host " << host;
            }
            EXPECT_EQ(mismatches, 0u);
            if (gridCase == 5) {
                EXPECT_EQ(dev[0], static_cast<std::int32_t>(ng - 1));
            }
            if (gridCase == 1) { // flat curve: the smallest radius has the best S/N
                EXPECT_EQ(dev[1], 0);
            }
        }
    }
    // GPUPHOT_APERTURE_OPTIMAL=host: the engine leaves the search to the driver
    const ScopedEnv e("GPUPHOT_APERTURE_OPTIMAL", "host");
    cudatest::useEnvironment(g);
    const double one = 1.0;
    const detail::OptimalGrid grid{&one, &one, &one, &one, 1, 0.0, false};
    const detail::OptimalJob job{1.0, 1.0, 100.0};
    std::int32_t index = 3;
    cuda::debugOptimalRadii(&job, 1, grid, &index, g);
    EXPECT_EQ(index, -1);
}

// Large apertures: annuli near and beyond the block-per-source sky's shared-memory bound (outer radius 40
// px: 6,561-pixel box, fused; 50 px: 10,201, the split path), large Kron ellipses (factor 4, up to 12
// isophotal radii), masked pixels, sources on and beyond the edges, no local sky with optimal apertures
// and the aperture correction; with and without mask and segmentation.
TEST(ApertureCuda, LargeAperturesEdgesAndMasksMatchCpu) {
    REQUIRE_DEVICE();
    Field f = makeField(300, 260, 220, 41);
    // a masked block and masked lines through some sources
    for (int y = 100; y < 130; ++y)
        for (int x = 60; x < 95; ++x)
            f.sim.defects(x, y) = 1;
    for (int y = 0; y < f.sim.defects.height(); ++y)
        f.sim.defects(150, y) = 2;
    std::vector<std::pair<std::string, ApertureParams>> sets;
    ApertureParams big;
    big.annulusInFwhm = false;
    big.annulusInner = 30.0;
    big.annulusOuter = 40.0;
    big.kronFactor = 4.0;
    big.kronMaxRadius = 12.0;
    big.radii = {1.5, 6.0, 15.0};
    sets.push_back({"annulus 30-40 px, Kron 4 / 12", big});
    ApertureParams huge = big;
    huge.annulusInner = 44.0;
    huge.annulusOuter = 50.0;
    huge.minSkyPixels = 5;
    sets.push_back({"annulus 44-50 px (beyond the block bound)", huge});
    ApertureParams map;
    map.useLocalSky = false;
    map.kronFactor = 3.5;
    map.kronMaxRadius = 9.0;
    sets.push_back({"background map sky, optimal, aperture correction", map});
    RunContext c = testContext(Backend::Cpu);
    for (const auto& [name, p] : sets)
        for (const bool masks : {true, false}) {
            SCOPED_TRACE(name + (masks ? ", mask and segmentation" : ", neither"));
            RunContext g = testContext(Backend::Cuda);
            const ApertureResult rc = run(f, p, c, masks, masks);
            expectSameApertures(rc, run(f, p, g, masks, masks));
            std::size_t kronDone = 0;
            for (double v : rc.fluxAuto)
                kronDone += std::isfinite(v) ? 1 : 0;
            EXPECT_GT(kronDone, f.det.sources.size() / 2);
        }
}

// The aperture engine: queued sky, circle and Kron calls, the batch buffers kept in the DeviceContext, the
// block-per-source sky with checkpointed running sums, pair-wise bitonic steps and warp-aggregated slots
// against the earlier block kernel (GPUPHOT_APERTURE_SKY=block0), other block sizes, the circle kernel chosen
// by size (GPUPHOT_APERTURE_WARP_ITEMS 0: one thread per source and radius always; huge: one warp each
// always), and batches of 300 sources (GPUPHOT_APERTURE_BATCH): every variant gives the CPU's numbers,
// bitwise, on one shared context whose kept buffers change size between calls (a large and a small field
// alternate).
TEST(ApertureCuda, QueuedBatchesKeptBuffersAndSkyVariantsMatchCpu) {
    REQUIRE_DEVICE();
    const Field large = makeField(700, 600, 2500, 19);
    const Field small = makeField(300, 260, 220, 41);
    RunContext c = testContext(Backend::Cpu);
    RunContext shared = testContext(Backend::Cuda);
    struct Variant {
        const char* name;
        const char* value;
    };
    const Variant variants[] = {{"GPUPHOT_APERTURE_SKY", "block0"},
                                {"GPUPHOT_APERTURE_SKY", "fused"},
                                {"GPUPHOT_APERTURE_SKY_THREADS", "32"},
                                {"GPUPHOT_APERTURE_SKY_THREADS", "256"},
                                {"GPUPHOT_APERTURE_WARP_ITEMS", "0"},
                                {"GPUPHOT_APERTURE_WARP_ITEMS", "100000000"},
                                {"GPUPHOT_APERTURE_BATCH", "300"},
                                {"GPUPHOT_APERTURE_SYNC", "1"},
                                {"GPUPHOT_APERTURE_KEEP", "0"}};
    std::vector<std::pair<std::string, ApertureParams>> sets = paramSets();
    sets.resize(4); // default, FWHM radii + mode sky, map sky, pixel annulus + median + saturation
    ApertureParams failures = paramSets()[5].second; // no clipping, sky failures
    sets.push_back({"sky failures", failures});
    std::size_t skyFailures = 0;
    for (const auto& [name, p] : sets) {
        const ApertureResult refLarge = run(large, p, c), refSmall = run(small, p, c);
        for (const std::uint32_t f : refLarge.flags)
            skyFailures += (f & FlagSkyFailed) ? 1 : 0;
        for (const Variant& v : variants) {
            SCOPED_TRACE(name + ", " + v.name + "=" + v.value);
            const ScopedEnv e(v.name, v.value);
            expectSameApertures(refLarge, run(large, p, shared));
            expectSameApertures(refSmall, run(small, p, shared));
            RunContext fresh = testContext(Backend::Cuda);
            expectSameApertures(refSmall, run(small, p, fresh));
            expectSameApertures(refLarge, run(large, p, fresh));
        }
    }
    EXPECT_GT(skyFailures, 0u); // the map fallback is exercised
}

// A small field for the sanitizers (racecheck on the block-per-source sky's shared memory and the warp
// kernels' sum rows): the default kernels (pass 1 chained, pass 3 in one call), the earlier block
// sky, 32 and 256 threads per sky block, batches of 7 sources, warp circles for every call, the circles on a
// side stream and the sky sort pair by pair match the CPU.
TEST(ApertureCuda, SmallFieldKernelVariantsMatchCpu) {
    REQUIRE_DEVICE();
    const Field f = makeField(200, 160, 60, 3);
    RunContext c = testContext(Backend::Cpu), g = testContext(Backend::Cuda);
    const ApertureResult ref = run(f, ApertureParams{}, c);
    expectSameApertures(ref, run(f, ApertureParams{}, g));
    for (const auto& [name, value] :
         std::vector<std::pair<const char*, const char*>>{{"GPUPHOT_APERTURE_SKY", "block0"},
                                                          {"GPUPHOT_APERTURE_SKY_THREADS", "32"},
                                                          {"GPUPHOT_APERTURE_SKY_THREADS", "256"},
                                                          {"GPUPHOT_APERTURE_BATCH", "7"},
                                                          {"GPUPHOT_APERTURE_CIRCLE", "warp"},
                                                          {"GPUPHOT_APERTURE_STREAMS", "2"},
                                                          {"GPUPHOT_APERTURE_SKY_SORT", "pairs"}}) {
        SCOPED_TRACE(std::string(name) + "=" + value);
        const ScopedEnv e(name, value);
        expectSameApertures(ref, run(f, ApertureParams{}, g));
    }
}

// Pass 1's circles and Kron queued behind the local skies, each job's sky set on the device from
// its estimate (ok; failed with the map: its per-pixel sky; failed without a map: no level and the read
// noise's variance), the sources' own order, and the warp kernels' lane sums through shared memory
// (GPUPHOT_APERTURE_CIRCLE=warp: pass 1 and 3 on circleWarpKernel too); also with GPUPHOT_APERTURE_CHAIN=0
// (the host sets the skies; pass 3 in two calls), GPUPHOT_APERTURE_STREAMS=2 (the circles on a side stream),
// GPUPHOT_APERTURE_ORDER=spatial, and the sky's sort pair by pair (GPUPHOT_APERTURE_SKY_SORT=pairs; the
// default sorts the short strides in registers: 16 keys per thread here, 4 to 32 in the 32/256-thread and
// pixel-annulus variants of the other tests): every variant the CPU's numbers, bitwise.
TEST(ApertureCuda, ChainedPassOneOrderAndWarpSumsMatchCpu) {
    REQUIRE_DEVICE();
    const Field f = makeField(420, 360, 350, 11);
    RunContext c = testContext(Backend::Cpu), g = testContext(Backend::Cuda);
    const BackgroundResult none;
    auto noMap = [&](const ApertureParams& p, RunContext& ctx) {
        return apertureStage(ctx)(f.sim.image.view(), f.sim.defects.view(), none, f.det.segmentation.view(),
                                  f.sources, 3.0, 1.5, 6.0, p, ctx);
    };
    ApertureParams failures = paramSets()[5].second; // minSkyPixels 400: many failed skies
    std::vector<std::pair<std::string, ApertureParams>> sets{{"default", ApertureParams{}},
                                                             {"sky failures", failures}};
    std::size_t failedWithMap = 0, failedWithoutMap = 0;
    for (const auto& [name, p] : sets) {
        const ApertureResult ref = run(f, p, c), refNoMap = noMap(p, c);
        for (std::size_t i = 0; i < ref.count; ++i) {
            failedWithMap += (ref.flags[i] & FlagSkyFailed) && std::isfinite(ref.sky[i]) ? 1 : 0;
            const bool inside = std::isfinite(f.sources.x[i]) && std::isfinite(f.sources.y[i]);
            failedWithoutMap +=
                inside && (refNoMap.flags[i] & FlagSkyFailed) && std::isnan(refNoMap.sky[i]) ? 1 : 0;
        }
        for (const auto& [var, value] :
             std::vector<std::pair<const char*, const char*>>{{"GPUPHOT_APERTURE_CHAIN", "1"},
                                                              {"GPUPHOT_APERTURE_CHAIN", "0"},
                                                              {"GPUPHOT_APERTURE_STREAMS", "2"},
                                                              {"GPUPHOT_APERTURE_ORDER", "spatial"},
                                                              {"GPUPHOT_APERTURE_SKY_SORT", "pairs"},
                                                              {"GPUPHOT_APERTURE_CIRCLE", "warp"}}) {
            SCOPED_TRACE(name + ", " + var + "=" + value);
            const ScopedEnv e(var, value);
            expectSameApertures(ref, run(f, p, g));
            expectSameApertures(refNoMap, noMap(p, g));
        }
    }
    EXPECT_GT(failedWithMap, 0u);
    EXPECT_GT(failedWithoutMap, 0u);
}

TEST(ApertureCuda, RegisteredWithCore) {
    REQUIRE_DEVICE();
    EXPECT_NE(cudaStages().aperture, nullptr);
}

TEST(ApertureCuda, MatchesCpuBitwiseOnSimulatedFrames) {
    REQUIRE_DEVICE();
    const Field f = makeField(420, 360, 350, 7);
    ASSERT_GT(f.det.sources.size(), 50u);
    RunContext c = testContext(Backend::Cpu), g = testContext(Backend::Cuda);
    for (const auto& [name, p] : paramSets()) {
        SCOPED_TRACE(name);
        const ApertureResult rc = run(f, p, c);
        const ApertureResult rg = run(f, p, g);
        expectSameApertures(rc, rg);
        // sanity: the comparison has something to compare
        std::size_t finite = 0;
        for (double v : rc.flux[0])
            finite += std::isfinite(v) ? 1 : 0;
        EXPECT_GT(finite, f.det.sources.size() / 2);
    }
    SCOPED_TRACE("no mask, no segmentation");
    expectSameApertures(run(f, ApertureParams{}, c, false, false), run(f, ApertureParams{}, g, false, false));
}

TEST(ApertureCuda, MatchesCpuOnACrowdedFrameWithManyStars) {
    REQUIRE_DEVICE();
    const Field f = makeField(700, 600, 2500, 19);
    RunContext c = testContext(Backend::Cpu), g = testContext(Backend::Cuda);
    ApertureParams p;
    const ApertureResult rc = run(f, p, c);
    EXPECT_GE(rc.apCorrStars, p.apCorrMinStars); // the measured curve of growth is exercised
    expectSameApertures(rc, run(f, p, g));
}

// The per-thread heap sort of the annulus (GPUPHOT_APERTURE_HEAPSORT=1, the earlier way) and the default
// (the block-per-source sort; CUB's segmented sort with GPUPHOT_APERTURE_SKY=split is compared in
// NewAndEarlierKernelsMatchCpu) give the CPU's numbers alike, with the aperture-correction stars and sky
// failures exercised.
TEST(ApertureCuda, BothAnnulusSortsMatchCpu) {
    REQUIRE_DEVICE();
    const Field f = makeField(700, 600, 2500, 19);
    RunContext c = testContext(Backend::Cpu);
    for (const auto& [name, p] : paramSets()) {
        const ApertureResult rc = run(f, p, c);
        for (const char* heap : {"1", "0"}) {
            SCOPED_TRACE(name + ", GPUPHOT_APERTURE_HEAPSORT=" + heap);
            const AnnulusSortEnv sortEnv(heap);
            RunContext g = testContext(Backend::Cuda);
            expectSameApertures(rc, run(f, p, g));
        }
    }
}

TEST(ApertureCuda, RepeatedRunsAndLaunchConfigurationsIdentical) {
    REQUIRE_DEVICE();
    const Field f = makeField(400, 400, 400, 23);
    RunContext c = testContext(Backend::Cpu);
    const ApertureResult ref = run(f, ApertureParams{}, c);
    RunContext shared = testContext(Backend::Cuda);
    for (int k = 0; k < 5; ++k) {
        SCOPED_TRACE("run " + std::to_string(k));
        RunContext fresh = testContext(Backend::Cuda);
        expectSameApertures(ref, run(f, ApertureParams{}, k % 2 ? fresh : shared));
    }
    for (const int threads : {32, 64, 256, 1024}) {
        SCOPED_TRACE("block " + std::to_string(threads));
        RunContext g = testContext(Backend::Cuda);
        cuda::DeviceContext::of(g).setBlockSize(threads);
        expectSameApertures(ref, run(f, ApertureParams{}, g));
    }
}

TEST(ApertureCuda, InvalidParametersThrowAsOnCpu) {
    REQUIRE_DEVICE();
    const Field f = makeField(200, 160, 60, 3);
    RunContext g = testContext(Backend::Cuda);
    ApertureParams p;
    p.radii = {};
    EXPECT_THROW(run(f, p, g), InvalidInput);
    p = ApertureParams{};
    p.annulusInner = 7.0;
    p.annulusOuter = 6.0;
    EXPECT_THROW(run(f, p, g), InvalidInput);
}

// The local sky's pieces against the same GPUPHOT_HD code run on the host: each source's annulus pixels
// (which and in which order), the device-sorted values against std::sort, and the clipped statistics.
// With GPUPHOT_DUMP=DIR set, the differences are written to DIR/annulus_*.txt.
TEST(ApertureCuda, LocalSkyPiecesMatchHost) {
    REQUIRE_DEVICE();
    const Field f = makeField(420, 360, 350, 7);
    const ImageView image = f.sim.image.view();
    const MaskView mask = f.sim.defects.view();
    const ImageViewT<std::int32_t> seg = f.det.segmentation.view();
    detail::AperturePlanes in;
    in.image = image.data;
    in.imageStride = image.stride;
    in.mask = mask.data;
    in.maskStride = mask.stride;
    in.seg = seg.data;
    in.segStride = seg.stride;
    in.width = image.width;
    in.height = image.height;
    std::vector<double> cx, cy;
    for (std::size_t i = 0; i < f.sources.size(); ++i)
        if (std::isfinite(f.sources.x[i]) && std::isfinite(f.sources.y[i])) {
            cx.push_back(f.sources.x[i]);
            cy.push_back(f.sources.y[i]);
        }
    const char* dumpDir = std::getenv("GPUPHOT_DUMP");
    struct Case {
        const char* name;
        double rin, rout, saturation, clip;
        int estimator;
    };
    const Case cases[] = {{"fwhm", 12.0, 18.0, std::numeric_limits<double>::infinity(), 3.0, 2},
                          {"pixel", 8.0, 14.0, 20000.0, 2.5, 1}};
    RunContext g = testContext(Backend::Cuda);
    // Both annulus sorts: CUB's segmented sort (default) and one thread per source (HEAPSORT=1).
    for (const char* heap : {"0", "1"})
        for (const Case& cs : cases) {
            const AnnulusSortEnv sortEnv(heap);
            SCOPED_TRACE(std::string(cs.name) + ", GPUPHOT_APERTURE_HEAPSORT=" + heap);
            in.saturation = cs.saturation;
            const detail::SkyParamsHD p{cs.clip, 5, 10, cs.estimator, 1.0};
            std::vector<int> off, index;
            std::vector<float> sorted;
            std::vector<detail::SkyEstimate> est;
            cuda::debugLocalSkies(image, mask, seg, cx.data(), cy.data(), cx.size(), cs.rin, cs.rout, p,
                                  cs.saturation, g, off, index, sorted, est);
            ASSERT_EQ(off.size(), cx.size() + 1);
            std::ofstream dump;
            if (dumpDir) dump.open(std::string(dumpDir) + "/annulus_" + cs.name + ".txt");
            std::size_t badIndex = 0, badSort = 0, badEst = 0;
            for (std::size_t i = 0; i < cx.size(); ++i) {
                std::vector<int> hi;
                std::vector<float> hv;
                detail::forAnnulusAt(in, cx[i], cy[i], cs.rin, cs.rout, [&](int x, int y, float v) {
                    hi.push_back(y * in.width + x);
                    hv.push_back(v);
                });
                const std::vector<int> gi(index.begin() + off[i], index.begin() + off[i + 1]);
                std::sort(hv.begin(), hv.end());
                std::vector<double> s1(hv.size() + 1), s2(hv.size() + 1);
                const detail::SkyEstimate he =
                    detail::skyStatistics(hv.data(), hv.size(), p, s1.data(), s2.data());
                // each pixel once, in raster order
                EXPECT_TRUE(std::adjacent_find(gi.begin(), gi.end(), std::greater_equal<int>()) == gi.end())
                    << i;
                const bool idxOk = hi == gi;
                const bool sortOk =
                    hv.size() < 10 || (gi.size() == hv.size() &&
                                       std::memcmp(hv.data(), sorted.data() + off[i], 4 * hv.size()) == 0);
                const bool estOk = std::memcmp(&he, &est[i], sizeof he) == 0;
                badIndex += idxOk ? 0 : 1;
                badSort += sortOk ? 0 : 1;
                badEst += estOk ? 0 : 1;
                if (dump.is_open() && (!idxOk || !sortOk || !estOk)) {
                    dump.precision(17);
                    dump << "src " << i << " cx " << cx[i] << " cy " << cy[i] << " host n " << hi.size()
                         << " gpu n " << gi.size() << " idxOk " << idxOk << " sortOk " << sortOk << " estOk "
                         << estOk << " host est " << he.level << " " << he.rms << " " << he.n << " " << he.ok
                         << " gpu est " << est[i].level << " " << est[i].rms << " " << est[i].n << " "
                         << est[i].ok << "\n";
                    std::vector<int> onlyH, onlyG;
                    std::set_difference(hi.begin(), hi.end(), gi.begin(), gi.end(),
                                        std::back_inserter(onlyH));
                    std::set_difference(gi.begin(), gi.end(), hi.begin(), hi.end(),
                                        std::back_inserter(onlyG));
                    for (int k : onlyH)
                        dump << "  host only x " << k % in.width << " y " << k / in.width << " v "
                             << image.data[k / in.width * image.stride + k % in.width] << "\n";
                    for (int k : onlyG)
                        dump << "  gpu only x " << k % in.width << " y " << k / in.width << "\n";
                    if (!sortOk && gi.size() == hv.size())
                        for (std::size_t q = 0; q < hv.size(); ++q)
                            if (std::memcmp(&hv[q], sorted.data() + off[i] + q, 4) != 0) {
                                dump << "  sorted differs at " << q << ": " << hv[q] << " vs "
                                     << sorted[off[i] + q] << "\n";
                                break;
                            }
                }
            }
            EXPECT_EQ(badIndex, 0u);
            EXPECT_EQ(badSort, 0u);
            EXPECT_EQ(badEst, 0u);
        }
}
