#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/pipeline/run_context.hpp"
#include "core/stages/background/background.hpp"
#include "core/stages/background/mesh_histogram.hpp"
#include "core/util/errors.hpp"

#ifdef GPUPHOT_HAVE_SEP
extern "C" {
#include <sep.h>
}
#endif

using namespace gpuphot;

namespace {

RunContext contextWith(int threads) {
    RunContext ctx;
    ctx.threads = threads;
    return ctx;
}

Image<float> noiseImage(int w, int h, double level, double sigma, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<double> n(0.0, sigma);
    Image<float> img(w, h);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            img(x, y) = static_cast<float>(level + n(rng));
    return img;
}

// Sky gradient + Gaussian noise + a few hundred Gaussian stars (fixed seed): a simulated-like frame.
Image<float> simulatedFrame(int w, int h, unsigned seed) {
    std::mt19937 rng(seed);
    Image<float> img(w, h);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            img(x, y) =
                static_cast<float>(1000.0 + 0.12 * x - 0.08 * y + 2e-5 * (x - w / 2.0) * (y - h / 3.0));
    std::uniform_real_distribution<double> ux(0.0, w), uy(0.0, h), uu(0.0, 1.0);
    const int nStars = 400;
    const double sigmaPsf = 1.5;
    for (int s = 0; s < nStars; ++s) {
        const double cx = ux(rng), cy = uy(rng);
        const double flux = 2e3 * std::pow(uu(rng) + 1e-3, -1.2); // many faint, a few bright
        const double peak = flux / (2.0 * M_PI * sigmaPsf * sigmaPsf);
        const int r = 12;
        for (int y = std::max(0, int(cy) - r); y <= std::min(h - 1, int(cy) + r); ++y)
            for (int x = std::max(0, int(cx) - r); x <= std::min(w - 1, int(cx) + r); ++x) {
                const double d2 = (x - cx) * (x - cx) + (y - cy) * (y - cy);
                img(x, y) += static_cast<float>(peak * std::exp(-0.5 * d2 / (sigmaPsf * sigmaPsf)));
            }
    }
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            const double v = img(x, y);
            std::normal_distribution<double> n(0.0, std::sqrt(std::max(v, 1.0))); // Poisson-like, gain 1
            img(x, y) = static_cast<float>(v + n(rng));
        }
    return img;
}

bool bitwiseEqual(const Image<float>& a, const Image<float>& b) {
    return a.width() == b.width() && a.height() == b.height() &&
           std::memcmp(a.data(), b.data(), a.pixelCount() * sizeof(float)) == 0;
}

void expectSameResult(const BackgroundResult& a, const BackgroundResult& b) {
    EXPECT_TRUE(bitwiseEqual(a.meshLevel, b.meshLevel));
    EXPECT_TRUE(bitwiseEqual(a.meshRms, b.meshRms));
    EXPECT_TRUE(bitwiseEqual(a.level, b.level));
    EXPECT_TRUE(bitwiseEqual(a.rms, b.rms));
    EXPECT_EQ(a.globalLevel, b.globalLevel);
    EXPECT_EQ(a.globalRms, b.globalRms);
    EXPECT_EQ(a.badMeshes, b.badMeshes);
}

} // namespace

TEST(Background, ConstantPlusNoiseRecoversLevelAndRms) {
    const Image<float> img = noiseImage(512, 448, 1000.0, 10.0, 1);
    RunContext ctx = contextWith(1);
    const BackgroundResult r = estimateBackground(img.view(), {}, BackgroundParams{}, ctx);
    ASSERT_EQ(r.level.width(), 512);
    ASSERT_EQ(r.level.height(), 448);
    EXPECT_EQ(r.meshLevel.width(), 8);
    EXPECT_EQ(r.meshLevel.height(), 7);
    EXPECT_EQ(r.badMeshes, 0);
    EXPECT_NEAR(r.globalLevel, 1000.0, 0.3);
    // A 3-sigma clipped Gaussian has a sigma 1.3% low (SExtractor does not correct it).
    EXPECT_NEAR(r.globalRms, 10.0, 0.3);
    float lmin = 1e30f, lmax = -1e30f, rmin = 1e30f, rmax = -1e30f;
    for (std::size_t i = 0; i < r.level.pixelCount(); ++i) {
        lmin = std::min(lmin, r.level.data()[i]);
        lmax = std::max(lmax, r.level.data()[i]);
        rmin = std::min(rmin, r.rms.data()[i]);
        rmax = std::max(rmax, r.rms.data()[i]);
    }
    // Mode estimates scatter by ~0.05 sigma per mesh; unfiltered corner meshes and the spline's
    // extrapolation to the frame edge widen that.
    EXPECT_GT(lmin, 997.5f);
    EXPECT_LT(lmax, 1002.5f);
    EXPECT_GT(rmin, 9.5f);
    EXPECT_LT(rmax, 10.3f);
}

TEST(Background, PlaneGradientRecovered) {
    const int w = 640, h = 384;
    Image<float> img = noiseImage(w, h, 0.0, 5.0, 2);
    auto truth = [](int x, int y) { return 500.0 + 0.25 * x - 0.15 * y; };
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            img(x, y) += static_cast<float>(truth(x, y));
    RunContext ctx = contextWith(2);
    BackgroundParams p;
    p.meshSize = 64;
    p.filterSize = 3;
    const BackgroundResult r = estimateBackground(img.view(), {}, p, ctx);
    double maxErr = 0.0, sumErr = 0.0;
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            const double e = std::fabs(r.level(x, y) - truth(x, y));
            maxErr = std::max(maxErr, e);
            sumErr += e;
        }
    // The plane spans 200 ADU; a mesh's spread is sqrt(5^2 + (16^2 + 9.6^2) / 12) = 7.4 ADU (noise and
    // the plane within the mesh), its mode scatters by a few percent of that.
    EXPECT_LT(maxErr, 2.0);
    EXPECT_LT(sumErr / (double(w) * h), 0.3);
    // A plane's median over a whole mesh is its value at the mesh centre: the node convention
    // (node k at pixel (k + 0.5) * mesh - 0.5) must put it there.
    EXPECT_NEAR(r.meshLevel(4, 2), truth(4 * 64 + 31.5, 2 * 64 + 31.5) + 0.0, 0.6);
    EXPECT_NEAR(r.globalRms, std::sqrt(25.0 + (16.0 * 16.0 + 9.6 * 9.6) / 12.0), 0.3);
}

TEST(Background, MaskedPixelsAreIgnored) {
    const int w = 480, h = 400;
    const Image<float> clean = noiseImage(w, h, 200.0, 8.0, 3);
    Image<float> dirty = clean;
    Image<std::uint8_t> mask(w, h, 0);
    Image<std::int32_t> seg(w, h, 0);
    for (int y = 100; y < 260; ++y)
        for (int x = 150; x < 330; ++x) {
            dirty(x, y) = 1e6f;
            mask(x, y) = MaskSaturated;
            seg(x, y) = 17;
        }
    RunContext ctx = contextWith(1);
    const BackgroundParams p;
    const BackgroundResult ref = estimateBackground(clean.view(), mask.view(), p, ctx);
    const BackgroundResult masked = estimateBackground(dirty.view(), mask.view(), p, ctx);
    expectSameResult(ref, masked);  // masked pixel values play no part at all
    EXPECT_GT(masked.badMeshes, 0); // some meshes lie wholly inside the block and get interpolated
    for (std::size_t i = 0; i < masked.level.pixelCount(); ++i)
        ASSERT_NEAR(masked.level.data()[i], 200.0f, 1.0f);

    // The same through the source mask (second pass with detected sources masked).
    const ImageViewT<std::int32_t> segView = seg.view();
    const BackgroundResult viaSeg = estimateBackground(dirty.view(), {}, p, ctx, &segView);
    expectSameResult(masked, viaSeg);

    // Without the mask the block dominates: the test can fail.
    const BackgroundResult unmasked = estimateBackground(dirty.view(), {}, p, ctx);
    EXPECT_GT(unmasked.level(240, 180), 1000.0f);
}

TEST(Background, NanPixelsAreIgnored) {
    const int w = 300, h = 260;
    const Image<float> clean = noiseImage(w, h, 50.0, 3.0, 4);
    Image<float> holes = clean;
    Image<std::uint8_t> mask(w, h, 0);
    std::mt19937 rng(5);
    std::uniform_int_distribution<int> ux(0, w - 1), uy(0, h - 1);
    for (int i = 0; i < 4000; ++i) {
        const int x = ux(rng), y = uy(rng);
        holes(x, y) = (i % 3 == 0) ? std::numeric_limits<float>::infinity() : std::nanf("");
        mask(x, y) = MaskNonFinite;
    }
    for (int y = 0; y < 70; ++y)
        for (int x = 0; x < 70; ++x) {
            holes(x, y) = std::nanf("");
            mask(x, y) = MaskNonFinite;
        }
    RunContext ctx = contextWith(1);
    BackgroundParams p;
    p.meshSize = 32;
    const BackgroundResult a = estimateBackground(holes.view(), {}, p, ctx);
    const BackgroundResult b = estimateBackground(clean.view(), mask.view(), p, ctx);
    expectSameResult(a, b);
    EXPECT_GT(a.badMeshes, 0);
    for (std::size_t i = 0; i < a.level.pixelCount(); ++i) {
        ASSERT_TRUE(std::isfinite(a.level.data()[i]));
        ASSERT_NEAR(a.level.data()[i], 50.0f, 2.5f); // small meshes, extrapolated corner (sep: +-1 clean)
        ASSERT_TRUE(std::isfinite(a.rms.data()[i]));
    }
}

TEST(Background, OneAndTwoThreadsBitwiseIdentical) {
    const Image<float> img = simulatedFrame(700, 530, 11);
    Image<std::uint8_t> mask(700, 530, 0);
    for (int y = 300; y < 420; ++y)
        for (int x = 40; x < 200; ++x)
            mask(x, y) = MaskBad;
    BackgroundParams p;
    p.meshSize = 48;
    p.meshHeight = 40;
    RunContext c1 = contextWith(1), c2 = contextWith(2);
    const BackgroundResult a = estimateBackground(img.view(), mask.view(), p, c1);
    const BackgroundResult b = estimateBackground(img.view(), mask.view(), p, c2);
    expectSameResult(a, b);
    // Strips evaluated separately give the same pixels as the full map.
    const BackgroundSpline sp = makeBackgroundSpline(a);
    std::vector<float> lv(700 * 37), rv(700 * 37);
    interpolateBackground(a, sp, 250, 37, lv.data(), rv.data(), 700, c2);
    EXPECT_EQ(std::memcmp(lv.data(), a.level.row(250), lv.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(rv.data(), a.rms.row(250), rv.size() * sizeof(float)), 0);
}

TEST(Background, SizesNotMultiplesOfTheMesh) {
    const Image<float> img = noiseImage(203, 131, 300.0, 4.0, 6);
    RunContext ctx = contextWith(2);
    BackgroundParams p;
    p.meshSize = 64;
    const BackgroundResult r = estimateBackground(img.view(), {}, p, ctx);
    EXPECT_EQ(r.meshLevel.width(), 4);  // 64 + 64 + 64 + 11
    EXPECT_EQ(r.meshLevel.height(), 3); // 64 + 64 + 3
    ASSERT_EQ(r.level.width(), 203);
    ASSERT_EQ(r.level.height(), 131);
    for (std::size_t i = 0; i < r.level.pixelCount(); ++i)
        ASSERT_NEAR(r.level.data()[i], 300.0f, 1.5f);
}

TEST(Background, TinyImagesDoNotCrash) {
    RunContext ctx = contextWith(2);
    const BackgroundParams p;
    for (const auto& [w, h] : std::vector<std::pair<int, int>>{{1, 1}, {1, 300}, {300, 1}, {5, 3}, {65, 2}}) {
        const Image<float> img = noiseImage(w, h, 10.0, 1.0, 7);
        const BackgroundResult r = estimateBackground(img.view(), {}, p, ctx);
        ASSERT_EQ(r.level.width(), w);
        ASSERT_EQ(r.level.height(), h);
        for (std::size_t i = 0; i < r.level.pixelCount(); ++i) {
            ASSERT_TRUE(std::isfinite(r.level.data()[i])) << w << "x" << h;
            ASSERT_NEAR(r.level.data()[i], 10.0f, 5.0f) << w << "x" << h;
        }
    }
    // A wholly masked frame: no valid mesh, sep's fallback (0, 1).
    const Image<float> img = noiseImage(100, 100, 10.0, 1.0, 8);
    const Image<std::uint8_t> all(100, 100, 1);
    const BackgroundResult r = estimateBackground(img.view(), all.view(), p, ctx);
    EXPECT_EQ(r.badMeshes, 4);
    EXPECT_EQ(r.level(50, 50), 0.0f);
    EXPECT_EQ(r.globalRms, 1.0);
}

TEST(Background, InvalidInputsThrow) {
    RunContext ctx = contextWith(1);
    const Image<float> empty;
    EXPECT_THROW(estimateBackground(empty.view(), {}, BackgroundParams{}, ctx), InvalidInput);
    const Image<float> img(10, 10, 1.0f);
    BackgroundParams bad;
    bad.meshSize = 0;
    EXPECT_THROW(estimateBackground(img.view(), {}, bad, ctx), InvalidInput);
    const Image<std::uint8_t> wrongMask(9, 10, 0);
    EXPECT_THROW(estimateBackground(img.view(), wrongMask.view(), BackgroundParams{}, ctx), InvalidInput);
}

TEST(Background, CancelFlagStopsTheStage) {
    const Image<float> img = noiseImage(256, 256, 1.0, 1.0, 9);
    std::atomic<bool> cancel{true};
    RunContext ctx = contextWith(1);
    ctx.cancelFlag = &cancel;
    EXPECT_THROW(estimateBackground(img.view(), {}, BackgroundParams{}, ctx), Cancelled);
    // Progress is reported and ends at 1.
    cancel = false;
    double last = -1.0;
    bool monotonic = true;
    ctx.progress = [&](const std::string& stage, double f) {
        EXPECT_EQ(stage, "background");
        monotonic = monotonic && f >= last;
        last = f;
    };
    estimateBackground(img.view(), {}, BackgroundParams{}, ctx);
    EXPECT_TRUE(monotonic);
    EXPECT_DOUBLE_EQ(last, 1.0);
}

TEST(Background, FilterThresholdKeepsSmallDeviations) {
    // One mesh raised by 20 ADU: the median filter removes it unless the threshold is above 20.
    Image<float> img = noiseImage(320, 320, 100.0, 2.0, 10);
    for (int y = 128; y < 192; ++y)
        for (int x = 128; x < 192; ++x)
            img(x, y) += 20.0f;
    RunContext ctx = contextWith(1);
    BackgroundParams p;
    const BackgroundResult filtered = estimateBackground(img.view(), {}, p, ctx);
    EXPECT_NEAR(filtered.meshLevel(2, 2), 100.0f, 0.5f);
    p.filterThreshold = 50.0;
    const BackgroundResult kept = estimateBackground(img.view(), {}, p, ctx);
    EXPECT_NEAR(kept.meshLevel(2, 2), 120.0f, 0.5f);
    p.filterThreshold = 0.0;
    p.filterSize = 1;
    const BackgroundResult unfiltered = estimateBackground(img.view(), {}, p, ctx);
    EXPECT_NEAR(unfiltered.meshLevel(2, 2), 120.0f, 0.5f);
}

TEST(Background, ParamsJsonRoundTrip) {
    BackgroundParams p;
    p.meshSize = 128;
    p.meshHeight = 96;
    p.filterSize = 5;
    p.filterThreshold = 2.5;
    p.fullMaps = false;
    const nlohmann::json j = p;
    const BackgroundParams q = j.get<BackgroundParams>();
    EXPECT_EQ(q.meshSize, 128);
    EXPECT_EQ(q.meshH(), 96);
    EXPECT_EQ(q.filterH(), 5);
    EXPECT_EQ(q.filterThreshold, 2.5);
    EXPECT_FALSE(q.fullMaps);
    // Missing keys keep their defaults.
    const BackgroundParams d = nlohmann::json::parse(R"({"meshSize": 32})").get<BackgroundParams>();
    EXPECT_EQ(d.meshSize, 32);
    EXPECT_EQ(d.filterSize, 3);
    EXPECT_TRUE(d.fullMaps);
}

#ifdef GPUPHOT_HAVE_SEP
namespace {

struct SepMaps {
    std::vector<float> level, rms, meshLevel, meshRms;
    double global = 0.0, globalRms = 0.0;
};

SepMaps runSep(const Image<float>& img, const Image<std::uint8_t>* mask, int bw, int bh, int fw, int fh) {
    sep_image im{};
    im.data = img.data();
    im.dtype = SEP_TFLOAT;
    im.w = img.width();
    im.h = img.height();
    if (mask) {
        im.mask = mask->data();
        im.mdtype = SEP_TBYTE;
        im.maskthresh = 0.0;
    }
    sep_bkg* bkg = nullptr;
    EXPECT_EQ(sep_background(&im, bw, bh, fw, fh, 0.0, &bkg), 0);
    SepMaps m;
    if (!bkg) return m;
    m.level.resize(img.pixelCount());
    m.rms.resize(img.pixelCount());
    EXPECT_EQ(sep_bkg_array(bkg, m.level.data(), SEP_TFLOAT), 0);
    EXPECT_EQ(sep_bkg_rmsarray(bkg, m.rms.data(), SEP_TFLOAT), 0);
    m.meshLevel.assign(bkg->back, bkg->back + bkg->n);
    m.meshRms.assign(bkg->sigma, bkg->sigma + bkg->n);
    m.global = sep_bkg_global(bkg);
    m.globalRms = sep_bkg_globalrms(bkg);
    sep_bkg_free(bkg);
    return m;
}

// levelTol: max |ours - sep| over pixels relative to sep's global level; rmsTol: relative to sep's rms.
void compareWithSep(const Image<float>& img, const Image<std::uint8_t>* mask, int bw, int bh, int fw, int fh,
                    bool sextractorSpline, double levelTol, double rmsTol) {
    RunContext ctx = contextWith(2);
    BackgroundParams p;
    p.sextractorSpline = sextractorSpline;
    p.meshSize = bw;
    p.meshHeight = bh;
    p.filterSize = fw;
    p.filterHeight = fh;
    const BackgroundResult r = estimateBackground(img.view(), mask ? mask->view() : MaskView{}, p, ctx);
    const SepMaps s = runSep(img, mask, bw, bh, fw, fh);
    ASSERT_EQ(s.level.size(), r.level.pixelCount());
    ASSERT_EQ(s.meshLevel.size(), r.meshLevel.pixelCount());

    double meshMax = 0.0, meshRmsMax = 0.0;
    for (std::size_t i = 0; i < s.meshLevel.size(); ++i) {
        meshMax = std::max(meshMax, std::fabs(double(r.meshLevel.data()[i]) - s.meshLevel[i]));
        meshRmsMax =
            std::max(meshRmsMax, std::fabs(double(r.meshRms.data()[i]) - s.meshRms[i]) / s.meshRms[i]);
    }
    double levelMax = 0.0, rmsMax = 0.0;
    for (std::size_t i = 0; i < s.level.size(); ++i) {
        levelMax = std::max(levelMax, std::fabs(double(r.level.data()[i]) - s.level[i]));
        rmsMax = std::max(rmsMax, std::fabs(double(r.rms.data()[i]) - s.rms[i]) / s.rms[i]);
    }
    const double levelRel = levelMax / s.global;
    std::printf(
        "[ sep      ] %dx%d mesh %dx%d filter %dx%d%s%s: level max |diff| %.4g ADU = %.3g of %.1f; rms max "
        "rel %.3g; meshes: level %.4g ADU, rms rel %.3g; global %.4f vs %.4f, rms %.4f vs %.4f\n",
        img.width(), img.height(), bw, bh, fw, fh, mask ? " masked" : "",
        sextractorSpline ? " sextractorSpline" : "", levelMax, levelRel, s.global, rmsMax, meshMax,
        meshRmsMax, r.globalLevel, s.global, r.globalRms, s.globalRms);
    ::testing::Test::RecordProperty("level_max_rel", std::to_string(levelRel));
    ::testing::Test::RecordProperty("rms_max_rel", std::to_string(rmsMax));
    EXPECT_LT(levelRel, levelTol);
    EXPECT_LT(rmsMax, rmsTol);
    // The mesh statistics follow SExtractor's arithmetic: the same float values up to rounding.
    EXPECT_LT(meshMax, 1e-6 * s.global);
    EXPECT_LT(meshRmsMax, 1e-5);
    EXPECT_NEAR(r.globalLevel, s.global, 1e-3 * s.global);
    EXPECT_NEAR(r.globalRms, s.globalRms, 1e-2 * s.globalRms);
}

} // namespace

TEST(BackgroundSep, SimulatedFrameAgreesWithSep) {
    const Image<float> img = simulatedFrame(1024, 1024, 42);
    compareWithSep(img, nullptr, 64, 64, 3, 3, false, 1e-3, 1e-2);
    compareWithSep(img, nullptr, 64, 64, 3, 3, true, 1e-5, 1e-5);
}

TEST(BackgroundSep, PartialMeshesAndRectangularFilter) {
    const Image<float> img = simulatedFrame(1000, 777, 43);
    compareWithSep(img, nullptr, 50, 70, 5, 3, false, 1e-3, 1e-2);
    compareWithSep(img, nullptr, 50, 70, 5, 3, true, 1e-5, 1e-5);
}

TEST(BackgroundSep, MaskedFrameAgreesWithSep) {
    Image<float> img = simulatedFrame(800, 640, 44);
    Image<std::uint8_t> mask(800, 640, 0);
    for (int y = 200; y < 390; ++y)
        for (int x = 300; x < 520; ++x) {
            img(x, y) = 5e4f; // a saturated blob, masked
            mask(x, y) = MaskSaturated;
        }
    compareWithSep(img, &mask, 64, 64, 3, 3, false, 1e-3, 1e-2);
    compareWithSep(img, &mask, 64, 64, 3, 3, true, 1e-5, 1e-5);
}
#endif

// The median fill of clipHistogram's rounds, bin by bin, against medianSplit's bisections over prefix
// sums (the CUDA mesh kernel's way): the same split and sums on random histograms with empty bins, ties
// and every range, the empty range included.
TEST(Background, MedianSplitEqualsTheBinByBinFill) {
    std::mt19937 rng(5);
    for (int trial = 0; trial < 4000; ++trial) {
        const int nlevels = 1 + static_cast<int>(rng() % 300);
        std::vector<int> histo(nlevels + 1, 0);
        const int style = trial % 4;
        for (int k = 0; k < nlevels; ++k)
            histo[k] = style == 0   ? static_cast<int>(rng() % 3)
                       : style == 1 ? (rng() % 4 == 0 ? static_cast<int>(rng() % 50) : 0)
                       : style == 2 ? 7
                                    : static_cast<int>(rng() % 1000);
        std::vector<long long> g(nlevels + 2, 0);
        for (int k = 0; k <= nlevels; ++k)
            g[k + 1] = g[k] + histo[k];
        const int lo = static_cast<int>(rng() % nlevels);
        const int hi = static_cast<int>(rng() % (nlevels + 1)) - 1; // -1 .. nlevels - 1: may lie below lo
        long long lowSum = 0, highSum = 0;
        int a = lo, b = hi;
        for (int i = lo; i <= hi; ++i) {
            if (lowSum < highSum)
                lowSum += histo[a++];
            else
                highSum += histo[b--];
        }
        const bkgmath::MedianSplit s = bkgmath::medianSplit(g.data(), lo, hi);
        ASSERT_EQ(s.a, a) << trial;
        ASSERT_EQ(s.b, b) << trial;
        ASSERT_EQ(s.lowSum, lowSum) << trial;
        ASSERT_EQ(s.highSum, highSum) << trial;
    }
}
