// GPU crossmatch (kernels/crossmatch/crossmatch.cu) against cpu::crossmatch: refIndex, separations, the selected
// reference stars and their positions bitwise equal on random, crowded, tied and simulated fields, for
// one-to-one and nearest matching; the automatic choice by size. GPUPHOT_BENCH_XMATCH=1 adds the
// crossover benchmark (prints CPU and GPU times, checks equality at every size; no timing assertion).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "core/catalog/reference_catalog.hpp"
#include "core/pipeline/cuda_stages.hpp"
#include "core/pipeline/device_registry.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/crossmatch/crossmatch.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/tan_sip.hpp"
#include "core/wcs/wcs.hpp"
#include "kernels/cuda_stages_impl.hpp"
#include "kernels/device_context.hpp"
#include "tests/core/test_fields.hpp"
#include "tests/kernels/cuda_test_util.hpp"

using namespace gpuphot;

namespace {

using namespace gpuphot::cudatest;

// scale arcsec/px, rotated, mild SIP distortion.
TanSip makeTanSip(int w, int h, double scale) {
    TanSip t = test::rotatedTanSip(0.49 * w, 0.52 * h, 150.0, 20.0, scale, 20.0 * M_PI / 180.0, 2);
    const double k = 1024.0 / std::max(w, h);
    t.coeffA(2, 0) = 2e-6 * k;
    t.coeffA(1, 1) = -1e-6 * k;
    t.coeffB(0, 2) = 1.5e-6 * k;
    return t;
}

void addRef(ReferenceCatalog& c, double ra, double dec, double mag) {
    c.ra.push_back(ra);
    c.dec.push_back(dec);
    c.mag.push_back(mag);
    c.magErr.push_back(0.01);
    c.color.push_back(0.5);
    c.pmRa.push_back(std::nan(""));
    c.pmDec.push_back(std::nan(""));
    c.id.push_back(static_cast<std::int64_t>(c.ra.size()));
}

bool sameDouble(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

::testing::AssertionResult sameResult(const CrossmatchResult& a, const CrossmatchResult& b) {
    if (a.refIndex != b.refIndex) {
        std::size_t d = 0, first = a.refIndex.size();
        for (std::size_t i = 0; i < std::min(a.refIndex.size(), b.refIndex.size()); ++i)
            if (a.refIndex[i] != b.refIndex[i]) {
                ++d;
                first = std::min(first, i);
            }
        return ::testing::AssertionFailure() << "refIndex differs at " << d << " sources, first " << first;
    }
    if (a.separationArcsec.size() != b.separationArcsec.size()) return ::testing::AssertionFailure() << "sizes";
    for (std::size_t i = 0; i < a.separationArcsec.size(); ++i)
        if (!sameDouble(a.separationArcsec[i], b.separationArcsec[i]))
            return ::testing::AssertionFailure() << "separation differs at source " << i << ": "
                                                 << a.separationArcsec[i] << " vs " << b.separationArcsec[i];
    if (a.nMatched != b.nMatched) return ::testing::AssertionFailure() << "nMatched";
    if (a.nRefInFrame != b.nRefInFrame) return ::testing::AssertionFailure() << "nRefInFrame";
    if (a.refSelected != b.refSelected) return ::testing::AssertionFailure() << "refSelected";
    if (a.refX.size() != b.refX.size() || a.refY.size() != b.refY.size())
        return ::testing::AssertionFailure() << "refX/refY sizes";
    for (std::size_t k = 0; k < a.refX.size(); ++k)
        if (!sameDouble(a.refX[k], b.refX[k]) || !sameDouble(a.refY[k], b.refY[k]))
            return ::testing::AssertionFailure() << "refX/refY differ at " << k;
    if (!sameDouble(a.radiusPx, b.radiusPx)) return ::testing::AssertionFailure() << "radiusPx";
    return ::testing::AssertionSuccess();
}

struct Field {
    int w = 1024, h = 1024;
    TanSip t;
    Wcs wcs;
    ReferenceCatalog ref;
    std::vector<double> sx, sy;
};

// nRef stars uniform over the frame plus `pad` px; sources: a fraction `matched` of the stars (jittered
// by `jitter` px) plus nSpurious random positions.
Field makeField(int w, int h, double scale, std::size_t nRef, double matched, double jitter, std::size_t nSpurious,
                unsigned seed, double pad = 20.0) {
    Field f{w, h, makeTanSip(w, h, scale), Wcs::fromTanSip(makeTanSip(w, h, scale)), {}, {}, {}};
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> ux(-pad, w + pad), uy(-pad, h + pad), u01(0.0, 1.0);
    std::normal_distribution<double> jit(0.0, jitter);
    for (std::size_t i = 0; i < nRef; ++i) {
        const double x = ux(rng), y = uy(rng);
        double ra, dec;
        f.t.pixelToWorld(x, y, ra, dec);
        addRef(f.ref, ra, dec, 12.0 + 8.0 * u01(rng));
        if (u01(rng) < matched) {
            f.sx.push_back(x + jit(rng));
            f.sy.push_back(y + jit(rng));
        }
    }
    std::uniform_real_distribution<double> fx(0.0, w - 1.0), fy(0.0, h - 1.0);
    for (std::size_t i = 0; i < nSpurious; ++i) {
        f.sx.push_back(fx(rng));
        f.sy.push_back(fy(rng));
    }
    // shuffle the sources
    std::vector<std::size_t> order(f.sx.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<double> x2, y2;
    for (auto i : order) {
        x2.push_back(f.sx[i]);
        y2.push_back(f.sy[i]);
    }
    f.sx = std::move(x2);
    f.sy = std::move(y2);
    return f;
}

void compareBoth(const Field& f, CrossmatchParams p, const char* what) {
    for (bool oneToOne : {true, false}) {
        p.oneToOne = oneToOne;
        RunContext cc = testContext(Backend::Cpu), gc = testContext(Backend::Cuda);
        const CrossmatchResult a = cpu::crossmatch(f.sx, f.sy, f.w, f.h, f.ref, f.wcs, p, cc);
        const CrossmatchResult b = cuda::crossmatchGpu(f.sx, f.sy, f.w, f.h, f.ref, f.wcs, p, gc);
        EXPECT_TRUE(sameResult(a, b)) << what << " oneToOne=" << oneToOne;
        EXPECT_GT(a.nMatched, 0u) << what;
        std::printf("[xmatch-cuda] %s oneToOne=%d: %zu/%zu matched, %zu candidates, %zu device separations "
                    "differing from the CPU formula\n",
                    what, int(oneToOne), b.nMatched, f.sx.size(), cuda::crossmatchLastCandidates(),
                    cuda::crossmatchLastSeparationMismatches());
    }
}

} // namespace

TEST(CrossmatchCuda, RandomFieldsMatchCpuBitwise) {
    REQUIRE_DEVICE();
    for (unsigned seed : {1u, 2u, 3u}) {
        const Field f = makeField(1024, 768, 0.5, 3000, 0.7, 1.0, 300, seed);
        CrossmatchParams p;
        p.radiusArcsec = 1.0 + 0.5 * seed;
        compareBoth(f, p, "random");
    }
}

TEST(CrossmatchCuda, CrowdedFieldWithConflicts) {
    REQUIRE_DEVICE();
    // 20000 stars on 0.8 Mpx, 2 px jitter, 3" (6 px) radius: many stars per source, many conflicts.
    const Field f = makeField(1024, 768, 0.5, 20000, 0.8, 2.0, 2000, 7);
    CrossmatchParams p;
    p.radiusArcsec = 3.0;
    compareBoth(f, p, "crowded");
    p.marginPx = 0.0;
    p.refMagBright = 13.0;
    p.refMagFaint = 18.5;
    compareBoth(f, p, "crowded, magnitude cut, no margin");
}

TEST(CrossmatchCuda, TiesDuplicatesAndNonFinite) {
    REQUIRE_DEVICE();
    Field f = makeField(512, 512, 0.5, 800, 0.9, 0.5, 0, 11);
    // Duplicate stars (exact separation ties between references) and duplicate sources (ties between
    // sources), sources exactly on stars (separation 0) and non-finite sources.
    const std::size_t n = f.ref.size();
    for (std::size_t k = 0; k < n; k += 5) addRef(f.ref, f.ref.ra[k], f.ref.dec[k], f.ref.mag[k]);
    const std::size_t ns = f.sx.size();
    for (std::size_t i = 0; i < ns; i += 4) {
        f.sx.push_back(f.sx[i]);
        f.sy.push_back(f.sy[i]);
    }
    for (std::size_t k = 0; k < n; k += 9) {
        double x, y;
        ASSERT_TRUE(f.t.worldToPixel(f.ref.ra[k], f.ref.dec[k], x, y));
        f.sx.push_back(x);
        f.sy.push_back(y);
    }
    f.sx.push_back(std::nan(""));
    f.sy.push_back(10.0);
    f.sx.push_back(INFINITY);
    f.sy.push_back(INFINITY);
    f.sx.push_back(-1e6); // far outside the grid
    f.sy.push_back(1e6);
    f.sx.push_back(3e200); // absurd but finite
    f.sy.push_back(-3e200);
    CrossmatchParams p;
    p.radiusArcsec = 2.0;
    compareBoth(f, p, "ties");
}

TEST(CrossmatchCuda, SimulatedLargeFieldAndEmptyCases) {
    REQUIRE_DEVICE();
    // A 16 Mpx frame at 0.4"/px with 200k stars (the cell grid is coarsened) and 30k sources.
    const Field f = makeField(4096, 4096, 0.4, 200000, 0.12, 0.7, 6000, 21, 40.0);
    CrossmatchParams p;
    compareBoth(f, p, "simulated 16 Mpx");
    // No sources; no stars on the frame.
    RunContext cc = testContext(Backend::Cpu), gc = testContext(Backend::Cuda);
    const std::vector<double> none;
    EXPECT_TRUE(sameResult(cpu::crossmatch(none, none, f.w, f.h, f.ref, f.wcs, p, cc),
                           cuda::crossmatchGpu(none, none, f.w, f.h, f.ref, f.wcs, p, gc)));
    ReferenceCatalog far;
    addRef(far, 10.0, -40.0, 15.0);
    EXPECT_TRUE(sameResult(cpu::crossmatch(f.sx, f.sy, f.w, f.h, far, f.wcs, p, cc),
                           cuda::crossmatchGpu(f.sx, f.sy, f.w, f.h, far, f.wcs, p, gc)));
    // Invalid input is refused like the CPU does.
    CrossmatchParams bad;
    bad.radiusArcsec = 0.0;
    EXPECT_THROW(cuda::crossmatchGpu(f.sx, f.sy, f.w, f.h, f.ref, f.wcs, bad, gc), InvalidInput);
}

TEST(CrossmatchCuda, AutomaticChoiceThroughTheStageTable) {
    REQUIRE_DEVICE();
    ASSERT_NE(cudaStages().crossmatch, nullptr);
    const Field f = makeField(1024, 1024, 0.5, 4000, 0.8, 1.0, 100, 5);
    CrossmatchParams p;
    RunContext cc = testContext(Backend::Cpu);
    const CrossmatchResult ref = cpu::crossmatch(f.sx, f.sy, f.w, f.h, f.ref, f.wcs, p, cc);
    const cuda::CrossmatchCrossover saved = cuda::crossmatchCrossover();
    // the default rule: small problems on the CPU, a large catalog on the device
    EXPECT_FALSE(cuda::crossmatchUsesDevice(300, 1000));
    EXPECT_TRUE(cuda::crossmatchUsesDevice(130000, 1000000));
    for (bool device : {true, false}) {
        cuda::CrossmatchCrossover c;
        if (device) {
            c.minRefsAlone = 0;
        } else {
            c.minSources = c.minRefs = c.minRefsAlone = std::numeric_limits<std::size_t>::max();
        }
        cuda::setCrossmatchCrossover(c);
        RunContext gc = testContext(Backend::Cuda);
        const CrossmatchResult b = crossmatch(f.sx, f.sy, f.w, f.h, f.ref, f.wcs, p, gc);
        EXPECT_TRUE(sameResult(ref, b)) << "device " << device;
        // the device plan is noted only when the device ran
        EXPECT_EQ(cuda::DeviceContext::of(gc).planMode(), device ? "whole" : "") << device;
    }
    cuda::setCrossmatchCrossover(saved);
}

// The crossover benchmark: 300 -> 130k sources vs 1e4 -> 1e6 reference stars on a 151 Mpx
// frame. Prints one line per size; the results must be equal at every size.
TEST(CrossmatchCuda, CrossoverBenchmark) {
    REQUIRE_DEVICE();
    if (!std::getenv("GPUPHOT_BENCH_XMATCH")) GTEST_SKIP() << "set GPUPHOT_BENCH_XMATCH=1";
    const int threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    const int w = 14208, h = 10656;
    for (std::size_t nRef : {std::size_t(1000), std::size_t(10000), std::size_t(100000), std::size_t(1000000)}) {
        // all stars, then pick sources among them
        Field base = makeField(w, h, 0.3, nRef, 0.0, 0.0, 0, 99, 10.0);
        std::mt19937_64 rng(5);
        std::normal_distribution<double> jit(0.0, 0.7);
        std::uniform_real_distribution<double> fx(0.0, w - 1.0), fy(0.0, h - 1.0), u01(0.0, 1.0);
        for (std::size_t nSrc : {std::size_t(30), std::size_t(100), std::size_t(300), std::size_t(1000), std::size_t(3000), std::size_t(10000),
                                 std::size_t(30000), std::size_t(130000)}) {
            std::vector<double> sx, sy;
            for (std::size_t i = 0; i < nSrc; ++i) {
                if (u01(rng) < 0.7) { // near a star
                    const std::size_t k = static_cast<std::size_t>(u01(rng) * nRef) % nRef;
                    double x, y;
                    base.t.worldToPixel(base.ref.ra[k], base.ref.dec[k], x, y);
                    sx.push_back(x + jit(rng));
                    sy.push_back(y + jit(rng));
                } else {
                    sx.push_back(fx(rng));
                    sy.push_back(fy(rng));
                }
            }
            CrossmatchParams p;
            double best[2] = {1e30, 1e30};
            CrossmatchResult res[2];
            for (int rep = 0; rep < 3; ++rep)
                for (int gpu = 0; gpu < 2; ++gpu) {
                    RunContext c = testContext(gpu ? Backend::Cuda : Backend::Cpu, threads);
                    if (gpu) cuda::DeviceContext::of(c); // context creation outside the timing
                    const auto t0 = std::chrono::steady_clock::now();
                    res[gpu] = gpu ? cuda::crossmatchGpu(sx, sy, w, h, base.ref, base.wcs, p, c)
                                   : cpu::crossmatch(sx, sy, w, h, base.ref, base.wcs, p, c);
                    const double ms =
                        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
                    best[gpu] = std::min(best[gpu], ms);
                }
            EXPECT_TRUE(sameResult(res[0], res[1])) << nSrc << " x " << nRef;
            std::printf("XOVER nSrc=%zu nRef=%zu threads=%d cpu_ms=%.3f gpu_ms=%.3f speedup=%.2f matched=%zu "
                        "cand=%zu sepdiff=%zu\n",
                        nSrc, nRef, threads, best[0], best[1], best[0] / best[1], res[1].nMatched,
                        cuda::crossmatchLastCandidates(), cuda::crossmatchLastSeparationMismatches());
            std::fflush(stdout);
        }
    }
}
