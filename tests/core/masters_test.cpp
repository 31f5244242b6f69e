// Master calibration frames: per-pixel combination against independent computations, bad-pixel
// detection against injected defects, and masters built from simulated raw frames against the
// simulator's detector truth (bias pattern, dark current, pixel response).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/model/instrument.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/sim_frame.hpp"
#include "core/sim/simulator.hpp"
#include "core/stages/prepare/masters.hpp"
#include "core/util/errors.hpp"

namespace gpuphot {
namespace {

Image<float> filled(int w, int h, float v) { return Image<float>(w, h, v); }

TEST(MastersCombine, MedianMatchesSortedMiddle) {
    RunContext ctx;
    std::mt19937 rng(7);
    std::normal_distribution<float> g(100.0f, 5.0f);
    for (int n : {1, 2, 3, 4, 5, 8}) {
        std::vector<Image<float>> ims;
        for (int i = 0; i < n; ++i) {
            Image<float> im(6, 4);
            for (int y = 0; y < 4; ++y)
                for (int x = 0; x < 6; ++x) im(x, y) = g(rng);
            ims.push_back(std::move(im));
        }
        std::vector<ImageView> views;
        for (const auto& im : ims) views.push_back(im.view());
        const Image<float> out = combineImages(views, CombineParams{}, ctx);
        for (int y = 0; y < 4; ++y)
            for (int x = 0; x < 6; ++x) {
                std::vector<double> v;
                for (const auto& im : ims) v.push_back(im(x, y));
                std::sort(v.begin(), v.end());
                const double med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
                EXPECT_NEAR(out(x, y), med, 1e-4) << "n=" << n;
            }
    }
}

TEST(MastersCombine, ClippedMeanRejectsOutlierAndHonoursScalesAndMasks) {
    RunContext ctx;
    const std::vector<float> values = {10.0f, 10.2f, 9.8f, 10.1f, 9.9f, 500.0f};
    std::vector<Image<float>> ims;
    for (float v : values) ims.push_back(filled(3, 2, v));
    std::vector<ImageView> views;
    for (const auto& im : ims) views.push_back(im.view());
    CombineParams p;
    p.method = CombineMethod::ClippedMean;
    Image<float> out = combineImages(views, p, ctx);
    EXPECT_NEAR(out(1, 1), (10.0 + 10.2 + 9.8 + 10.1 + 9.9) / 5.0, 1e-5);
    // A plain mean would be pulled far up by the outlier: the test can fail.
    EXPECT_LT(out(1, 1), 11.0f);

    // Scales multiply before combining; a masked image does not take part.
    std::vector<double> scales(values.size(), 2.0);
    Image<std::uint8_t> bad(3, 2, 1), good(3, 2, 0);
    std::vector<MaskView> masks(values.size(), good.view());
    masks[5] = bad.view();
    p.method = CombineMethod::Median;
    out = combineImages(views, p, ctx, scales, masks);
    EXPECT_NEAR(out(0, 0), 2.0 * 10.0, 1e-4); // median of {9.8, 9.9, 10.0, 10.1, 10.2} * 2

    // All masked -> NaN; mismatched sizes -> InvalidInput.
    std::vector<MaskView> allBad(values.size(), bad.view());
    out = combineImages(views, p, ctx, {}, allBad);
    EXPECT_TRUE(std::isnan(out(2, 1)));
    Image<float> other(4, 2, 1.0f);
    views.push_back(other.view());
    EXPECT_THROW(combineImages(views, p, ctx), InvalidInput);
}

TEST(MastersBadPixels, FindsInjectedHotAndDeadPixels) {
    const int w = 64, h = 48;
    std::mt19937 rng(3);
    std::normal_distribution<float> g(0.0f, 1.0f);
    Image<float> dark(w, h), flat(w, h);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            dark(x, y) = 20.0f + 2.0f * g(rng);
            flat(x, y) = 1.0f + 0.01f * g(rng);
        }
    const std::vector<std::pair<int, int>> hot = {{3, 4}, {50, 40}, {10, 33}};
    const std::vector<std::pair<int, int>> dead = {{7, 7}, {60, 2}};
    for (auto [x, y] : hot) dark(x, y) += 200.0f;
    for (auto [x, y] : dead) flat(x, y) = 0.1f;
    flat(20, 20) = 2.0f; // over-responsive
    const BadPixelResult r = detectBadPixels(dark.view(), flat.view(), BadPixelParams{});
    EXPECT_EQ(r.hot, hot.size());
    EXPECT_EQ(r.dead, dead.size() + 1);
    for (auto [x, y] : hot) EXPECT_EQ(r.mask(x, y), 1);
    for (auto [x, y] : dead) EXPECT_EQ(r.mask(x, y), 1);
    EXPECT_EQ(r.mask(20, 20), 1);
    EXPECT_NEAR(r.darkSigma, 2.0, 0.2);
    std::size_t total = 0;
    for (std::size_t i = 0; i < r.mask.pixelCount(); ++i) total += r.mask.data()[i];
    EXPECT_EQ(total, hot.size() + dead.size() + 1);
    Image<float> small(8, 8, 1.0f);
    EXPECT_THROW(detectBadPixels(dark.view(), small.view(), BadPixelParams{}), InvalidInput);
}

// A small raw camera: bias pattern, overscan and prescan, dark current with hot pixels, vignetted flat.
SimParams rawCamera() {
    SimParams p;
    p.width = 160;
    p.height = 120;
    p.stars = 40;
    p.magBright = 15.0;
    p.seed = 11;
    p.detectorSeed = 99;
    p.bias = 1000.0;
    p.biasRowAmplitude = 2.0;
    p.biasColumnAmplitude = 3.0;
    p.prescan = 4;
    p.overscan = 16;
    p.darkCurrent = 0.5;
    p.darkHotPixels = 12;
    p.flatVignetting = 0.2;
    p.flatPixelSigma = 0.01;
    p.exptime = 60.0;
    p.refMargin = 0.0;
    return p;
}

std::vector<Frame> calibrationFrames(const SimParams& light, const std::string& type, int n, double exptime = -1.0) {
    std::vector<Frame> out;
    for (int i = 0; i < n; ++i) {
        SimParams q = calibrationFrameParams(light, type, i);
        if (exptime >= 0.0) q.exptime = exptime;
        Frame f = frameFromSimulation(simulateField(q));
        f.path = type + std::to_string(i + 1) + ".fits";
        out.push_back(std::move(f));
    }
    return out;
}

double maxAbsDiff(const Image<float>& a, const Image<float>& b, double offset = 0.0) {
    double m = 0.0;
    for (int y = 0; y < a.height(); ++y)
        for (int x = 0; x < a.width(); ++x) m = std::max(m, std::fabs(a(x, y) - b(x, y) - offset));
    return m;
}

TEST(MastersBuild, NoiselessMastersReproduceTheDetectorTruth) {
    SimParams light = rawCamera();
    light.noise = false;
    RunContext ctx;
    PrepareParams prep;
    const double level = light.bias; // the overscan holds bias + row pattern; its median
    // Bias: overscan-subtracted and trimmed; equals the truth bias minus the overscan median.
    std::vector<Frame> biases = calibrationFrames(light, "bias", 3);
    const MasterResult mb = buildMaster("bias", biases, CombineParams{}, prep, nullptr, nullptr, ctx);
    ASSERT_EQ(mb.master.width(), light.width);
    ASSERT_EQ(mb.master.height(), light.height);
    const Image<float> biasTruth = simBiasMap(light);
    // The overscan level is the median of bias + row pattern over the overscan: estimate it independently.
    std::vector<double> rows;
    const Image<float> biasPattern = simBiasMap(light);
    {
        SimParams noCol = light;
        noCol.biasColumnAmplitude = 0.0;
        const Image<float> rowOnly = simBiasMap(noCol);
        for (int y = 0; y < light.height; ++y) rows.push_back(rowOnly(0, y));
        std::sort(rows.begin(), rows.end());
    }
    const double overscanMedian = 0.5 * (rows[rows.size() / 2 - 1] + rows[rows.size() / 2]);
    EXPECT_NEAR(overscanMedian, level, 1.0);
    EXPECT_LT(maxAbsDiff(mb.master.pixels, biasTruth, -overscanMedian), 2e-3);
    EXPECT_EQ(mb.master.header.getInt("NCOMBINE").value_or(0), 3);
    EXPECT_FALSE(mb.master.header.has("BIASSEC"));

    // Dark at two exposure times, scaled to the first one's: equals rate * t / gain.
    std::vector<Frame> darks = calibrationFrames(light, "dark", 2, 30.0);
    std::vector<Frame> longer = calibrationFrames(light, "dark", 1, 90.0);
    darks.push_back(std::move(longer.front()));
    const MasterResult md = buildMaster("dark", darks, CombineParams{}, prep, &mb.master, nullptr, ctx);
    EXPECT_DOUBLE_EQ(md.master.header.getDouble("EXPTIME").value_or(0.0), 30.0);
    const Image<float> rate = simDarkMap(light);
    double worst = 0.0;
    for (int y = 0; y < light.height; ++y)
        for (int x = 0; x < light.width; ++x)
            worst = std::max(worst, std::fabs(md.master.pixels(x, y) - rate(x, y) * 30.0 / light.gain) /
                                        std::max(1.0, rate(x, y) * 30.0 / light.gain));
    EXPECT_LT(worst, 2e-3);

    // Flat: the relative response, median 1.
    std::vector<Frame> flats = calibrationFrames(light, "flat", 3);
    const MasterResult mf = buildMaster("flat", flats, CombineParams{}, prep, &mb.master, &md.master, ctx);
    const Image<float> resp = simFlatMap(light);
    std::vector<float> r(resp.data(), resp.data() + resp.pixelCount());
    std::nth_element(r.begin(), r.begin() + r.size() / 2, r.end());
    const double respMedian = r[r.size() / 2];
    double worstRel = 0.0;
    for (int y = 0; y < light.height; ++y)
        for (int x = 0; x < light.width; ++x)
            worstRel = std::max(worstRel, std::fabs(mf.master.pixels(x, y) / (resp(x, y) / respMedian) - 1.0));
    EXPECT_LT(worstRel, 1e-3);
    EXPECT_NEAR(robustMedian(mf.master.view()), 1.0, 1e-6);
    EXPECT_NEAR(mf.median, light.flatLevel * respMedian, 0.01 * light.flatLevel);
    (void)biasPattern;
}

TEST(MastersBuild, NoisyMedianAndClippedBiasBeatASingleFrameAndDropCosmicRays) {
    SimParams light = rawCamera();
    light.cosmicRays = 8; // ~60 px per frame: a pixel hit in 4 of 7 frames is then very unlikely
    light.cosmicRayCharge = 20000.0;
    RunContext ctx;
    std::vector<Frame> biases = calibrationFrames(light, "bias", 7);
    const Image<float> truth = simBiasMap(light);
    const double rnAdu = light.readNoise / light.gain;
    for (CombineMethod m : {CombineMethod::Median, CombineMethod::ClippedMean}) {
        std::vector<Frame> copy = biases;
        CombineParams cp;
        cp.method = m;
        const MasterResult mb = buildMaster("bias", copy, cp, PrepareParams{}, nullptr, nullptr, ctx);
        // Residual after removing the overscan offset: the combined noise, no cosmic-ray spikes.
        std::vector<double> d;
        for (int y = 0; y < light.height; ++y)
            for (int x = 0; x < light.width; ++x) d.push_back(mb.master.pixels(x, y) - truth(x, y));
        std::vector<double> s = d;
        std::nth_element(s.begin(), s.begin() + s.size() / 2, s.end());
        const double off = s[s.size() / 2];
        double ss = 0.0, worst = 0.0;
        for (double v : d) {
            ss += (v - off) * (v - off);
            worst = std::max(worst, std::fabs(v - off));
        }
        const double rms = std::sqrt(ss / d.size());
        const double expected = (m == CombineMethod::Median ? 1.2533 : 1.0) * rnAdu / std::sqrt(7.0);
        EXPECT_NEAR(rms, expected, 0.25 * expected) << combineMethodName(m);
        EXPECT_LT(worst, 8.0 * expected) << combineMethodName(m); // cosmic rays (>= 4000 ADU) rejected
    }
}

TEST(MastersBuild, MismatchesAreInvalidInputNamingBothFiles) {
    SimParams light = rawCamera();
    light.noise = false;
    RunContext ctx;
    std::vector<Frame> biases = calibrationFrames(light, "bias", 2);
    SimParams big = light;
    big.width += 8;
    std::vector<Frame> other = calibrationFrames(big, "bias", 1);
    other.front().path = "wide.fits";
    biases.push_back(std::move(other.front()));
    try {
        buildMaster("bias", biases, CombineParams{}, PrepareParams{}, nullptr, nullptr, ctx);
        FAIL() << "no exception";
    } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find("wide.fits"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("bias1.fits"), std::string::npos) << e.what();
    }
    std::vector<Frame> flats = calibrationFrames(light, "flat", 2);
    flats[1].header.set("FILTER", "V");
    try {
        buildMaster("flat", flats, CombineParams{}, PrepareParams{}, nullptr, nullptr, ctx);
        FAIL() << "no exception";
    } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find("flat2.fits"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("FILTER"), std::string::npos) << e.what();
    }
    std::vector<Frame> binned = calibrationFrames(light, "bias", 2);
    binned[0].header.set("XBINNING", 1);
    binned[0].header.set("YBINNING", 1);
    binned[1].header.set("CCDSUM", "2 2");
    EXPECT_THROW(buildMaster("bias", binned, CombineParams{}, PrepareParams{}, nullptr, nullptr, ctx), InvalidInput);
}

} // namespace
} // namespace gpuphot
