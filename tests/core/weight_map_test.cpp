// External weight maps (core/stages/prepare/weight_map.hpp, applyWeightVariance in the background stage) and
// the background's uniform RMS (SExtractor's WEIGHT_TYPE NONE).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/model/frame.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/pipeline_config.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/background/background.hpp"
#include "core/stages/prepare/prepare.hpp"
#include "core/stages/prepare/weight_map.hpp"
#include "core/util/errors.hpp"

using namespace gpuphot;

namespace {

constexpr int kStripe = 16;     // px; stripes of two noise levels, finer than the 64 px mesh
constexpr double kQuiet = 10.0; // ADU, the noise of even stripes
constexpr double kNoisy = 20.0; // ADU, of odd stripes

bool noisyColumn(int x) {
    return (x / kStripe) % 2 == 1;
}

// A 512 x 512 frame: sky 100 ADU with the stripes' noise, and 2 px Gaussian stars of 6000 ADU at the centres
// of the stripes, every 64 rows.
Frame stripedFrame(unsigned seed) {
    const int w = 512, h = 512;
    Frame f;
    f.pixels = Image<float>(w, h, 0.0f);
    f.mask = Image<std::uint8_t>(w, h, 0);
    std::mt19937 rng(seed);
    std::normal_distribution<double> g(0.0, 1.0);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            f.pixels(x, y) = static_cast<float>(100.0 + g(rng) * (noisyColumn(x) ? kNoisy : kQuiet));
    const double sigma = 2.0 / 2.35482;
    for (int yc = 32; yc < h; yc += 64)
        for (int xc = kStripe / 2; xc < w; xc += kStripe)
            for (int y = yc - 6; y <= yc + 6; ++y)
                for (int x = xc - 6; x <= xc + 6; ++x) {
                    const double r2 = (x - xc) * (x - xc) + (y - yc) * (y - yc);
                    f.pixels(x, y) += static_cast<float>(6000.0 / (2 * M_PI * sigma * sigma) *
                                                         std::exp(-0.5 * r2 / (sigma * sigma)));
                }
    f.instrument.gain = 1.0e9; // background noise only: the errors follow the map
    return f;
}

// Its weight map, unnormalised (what SWarp writes): 7 / sigma^2, with a block of zero weight.
Image<float> stripedWeights(int w, int h) {
    Image<float> wt(w, h);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            const double s = noisyColumn(x) ? kNoisy : kQuiet;
            wt(x, y) = static_cast<float>(7.0 / (s * s));
        }
    for (int y = 400; y < 450; ++y)
        for (int x = 400; x < 450; ++x)
            wt(x, y) = 0.0f;
    return wt;
}

struct Reduced {
    PipelineResult result;
    PrepareResult prepared;
};

Reduced reduce(Frame frame, const PrepareInputs* inputs, const PrepareParams& pp) {
    RunContext ctx;
    ctx.backend = Backend::Cpu;
    Reduced out;
    out.prepared = prepareFrame(frame, inputs, pp, ctx);
    PipelineConfig config;
    config.detection.threshold = 0.8;
    out.result = runPipeline(frame, config, ctx);
    return out;
}

} // namespace

TEST(WeightMap, EachTypeBecomesAVarianceAndUnusablePixelsAreMasked) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    Image<float> map(5, 1);
    const float values[5] = {4.0f, 0.5f, 0.0f, -1.0f, nan};
    for (int x = 0; x < 5; ++x)
        map(x, 0) = values[x];
    auto convert = [&](WeightMapType t, double thr, std::size_t& unusable) {
        Image<std::uint8_t> mask(5, 1, 0);
        WeightVariance wv = weightToVariance(map.view(), t, thr, mask);
        unusable = wv.unusable;
        for (int x = 0; x < 5; ++x)
            EXPECT_EQ(std::isinf(wv.variance(x, 0)), (mask(x, 0) & MaskBad) != 0) << x;
        return wv;
    };
    std::size_t n = 0;
    WeightVariance w = convert(WeightMapType::Weight, 0.0, n);
    EXPECT_FLOAT_EQ(w.variance(0, 0), 0.25f);
    EXPECT_FLOAT_EQ(w.variance(1, 0), 2.0f);
    EXPECT_EQ(n, 3u) << "weight <= 0 and NaN are unusable";
    w = convert(WeightMapType::Weight, 1.0, n);
    EXPECT_TRUE(std::isinf(w.variance(1, 0))) << "at or below WEIGHT_THRESH";
    EXPECT_EQ(n, 4u);
    w = convert(WeightMapType::Rms, 0.0, n);
    EXPECT_FLOAT_EQ(w.variance(0, 0), 16.0f);
    EXPECT_FLOAT_EQ(w.variance(1, 0), 0.25f);
    EXPECT_EQ(n, 3u) << "an RMS of 0 is unusable, not a zero threshold";
    w = convert(WeightMapType::Rms, 3.0, n);
    EXPECT_TRUE(std::isinf(w.variance(0, 0))) << "at or above WEIGHT_THRESH";
    w = convert(WeightMapType::Variance, 0.0, n);
    EXPECT_FLOAT_EQ(w.variance(0, 0), 4.0f);
    EXPECT_THROW(convert(WeightMapType::None, 0.0, n), InvalidInput);
    EXPECT_EQ(parseWeightMapType("MAP_RMS"), WeightMapType::Rms);
    EXPECT_THROW(parseWeightMapType("map_sigma"), InvalidInput);
    Image<std::uint8_t> other(4, 1, 0);
    EXPECT_THROW(weightToVariance(map.view(), WeightMapType::Weight, 0.0, other), InvalidInput);
}

TEST(WeightMap, UniformRmsIsTheMedianOfTheMeshGrid) {
    const Frame f = stripedFrame(3);
    // Halves of different noise instead of stripes: the mesh grid sees them.
    Image<float> halves(f.width(), f.height());
    std::mt19937 rng(5);
    std::normal_distribution<double> g(0.0, 1.0);
    for (int y = 0; y < f.height(); ++y)
        for (int x = 0; x < f.width(); ++x)
            halves(x, y) = static_cast<float>(100.0 + g(rng) * (x < f.width() / 2 ? kQuiet : kNoisy));
    RunContext ctx;
    ctx.backend = Backend::Cpu;
    BackgroundParams p;
    const BackgroundResult mapped = cpu::estimateBackground(halves.view(), MaskView{}, p, ctx);
    EXPECT_NEAR(mapped.rms(10, 256), kQuiet, 1.0);
    EXPECT_NEAR(mapped.rms(500, 256), kNoisy, 3.0);
    p.uniformRms = true;
    const BackgroundResult uniform = cpu::estimateBackground(halves.view(), MaskView{}, p, ctx);
    EXPECT_DOUBLE_EQ(uniform.globalRms, mapped.globalRms);
    for (int y = 0; y < f.height(); y += 37)
        for (int x = 0; x < f.width(); x += 41)
            ASSERT_NEAR(uniform.rms(x, y), mapped.globalRms, 1e-4 * mapped.globalRms) << x << "," << y;
    EXPECT_EQ(uniform.level(7, 9), mapped.level(7, 9)) << "the level map is unchanged";
    p.uniformRms = false;
    p.manualLevel = 123.5; // SExtractor's BACK_TYPE MANUAL
    const BackgroundResult manual = cpu::estimateBackground(halves.view(), MaskView{}, p, ctx);
    EXPECT_FLOAT_EQ(manual.level(7, 9), 123.5f);
    EXPECT_FLOAT_EQ(manual.level(500, 300), 123.5f);
    EXPECT_DOUBLE_EQ(manual.globalLevel, 123.5);
    EXPECT_EQ(manual.rms(500, 256), mapped.rms(500, 256)) << "the RMS is still measured";
}

TEST(WeightMap, RescaledMapSetsEachPixelsNoiseInDetectionAndErrors) {
    const Frame frame = stripedFrame(11);
    PrepareInputs inputs;
    inputs.weight = stripedWeights(frame.width(), frame.height());
    inputs.weightPath = "stripes.weight.fits";
    PrepareParams pp;
    pp.weightType = "map_weight";

    const Reduced plain = reduce(frame, nullptr, pp);
    const Reduced weighted = reduce(frame, &inputs, pp);
    EXPECT_EQ(weighted.prepared.weightUnusablePixels, 2500u);
    const BackgroundResult& b = weighted.result.background;
    // Within the 10 % by which the clipped mesh RMS of a mixture of two noise levels falls short.
    EXPECT_NEAR(b.weightScale, std::sqrt(7.0), 0.1 * std::sqrt(7.0)) << "rescaled to the measured noise";
    EXPECT_NEAR(b.rmsAt(kStripe / 2, 100), kQuiet, 0.1 * kQuiet);
    EXPECT_NEAR(b.rmsAt(kStripe + kStripe / 2, 100), kNoisy, 0.1 * kNoisy);
    EXPECT_NEAR(plain.result.background.rmsAt(kStripe / 2, 100), 0.5 * (kQuiet + kNoisy), 0.5 * kQuiet)
        << "the mesh grid cannot see the stripes";

    // Detections that are not the injected stars, per stripe kind.
    auto falseDetections = [](const PipelineResult& r, bool noisy) {
        int n = 0;
        const Sources& s = r.detection.sources;
        for (std::size_t i = 0; i < s.size(); ++i) {
            const int x = static_cast<int>(std::lround(s.xIso[i])),
                      y = static_cast<int>(std::lround(s.yIso[i]));
            const bool star = std::abs((y - 32) % 64) <= 3 && std::abs(x % kStripe - kStripe / 2) <= 3;
            if (!star && noisyColumn(x) == noisy) ++n;
        }
        return n;
    };
    EXPECT_GT(falseDetections(plain.result, true), 10) << "without the map the noisy stripes are detected";
    EXPECT_LE(falseDetections(weighted.result, true), 3);
    EXPECT_LE(falseDetections(weighted.result, false), 3);

    // The stars' FLUX_AUTO errors follow the stripe they sit in.
    std::vector<double> quietErr, noisyErr;
    const Sources& s = weighted.result.detection.sources;
    const ApertureResult& a = weighted.result.aperture;
    for (std::size_t i = 0; i < s.size(); ++i) {
        if (!(a.flux.size() > 0 && a.fluxAuto[i] > 3000.0)) continue;
        (noisyColumn(static_cast<int>(std::lround(s.x[i]))) ? noisyErr : quietErr)
            .push_back(a.fluxAutoErr[i]);
    }
    ASSERT_GT(quietErr.size(), 50u);
    ASSERT_GT(noisyErr.size(), 50u);
    auto median = [](std::vector<double> v) {
        std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
        return v[v.size() / 2];
    };
    EXPECT_NEAR(median(noisyErr) / median(quietErr), kNoisy / kQuiet, 0.15 * kNoisy / kQuiet);
}

TEST(WeightMap, AMapOfAnotherSizeOrWithoutATypeIsRefused) {
    Frame frame = stripedFrame(2);
    PrepareInputs inputs;
    inputs.weight = Image<float>(100, 100, 1.0f);
    inputs.weightPath = "small.fits";
    PrepareParams pp;
    pp.weightType = "map_weight";
    RunContext ctx;
    ctx.backend = Backend::Cpu;
    try {
        prepareFrame(frame, &inputs, pp, ctx);
        FAIL() << "a 100x100 map for a 512x512 frame";
    } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find("small.fits is 100x100 px"), std::string::npos) << e.what();
    }
    inputs.weight = stripedWeights(frame.width(), frame.height());
    pp.weightType = "none";
    EXPECT_THROW(prepareFrame(frame, &inputs, pp, ctx), InvalidInput);
}
