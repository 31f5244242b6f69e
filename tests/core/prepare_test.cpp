// Frame preparation against truth: raw frames simulated with a known detector (bias pattern, overscan,
// dark current with hot pixels, vignetted flat), masters built from simulated calibration frames, the
// prepared frame compared with a simulation of the same field without any detector effects; sections,
// WCS shift, bleed trails, mismatch errors, and the stages honouring the frame mask.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/catalog/reference_catalog.hpp"
#include "core/model/flags.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/pipeline_config.hpp"
#include "core/pipeline/reduce.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/sim_frame.hpp"
#include "core/sim/simulator.hpp"
#include "core/stages/background/background.hpp"
#include "core/stages/prepare/masters.hpp"
#include "core/stages/prepare/prepare.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/wcs.hpp"
#include "tests/test_support.hpp"

namespace gpuphot {
namespace {

TEST(PrepareSections, ParsesFitsSections) {
    int x0, y0, w, h;
    ASSERT_TRUE(parseFitsSection("[1:2048,1:4096]", x0, y0, w, h));
    EXPECT_EQ(x0, 0);
    EXPECT_EQ(y0, 0);
    EXPECT_EQ(w, 2048);
    EXPECT_EQ(h, 4096);
    ASSERT_TRUE(parseFitsSection(" [ 33:10, 5:5 ] ", x0, y0, w, h)); // reversed and blanks
    EXPECT_EQ(x0, 9);
    EXPECT_EQ(w, 24);
    EXPECT_EQ(y0, 4);
    EXPECT_EQ(h, 1);
    EXPECT_FALSE(parseFitsSection("[0:10,1:5]", x0, y0, w, h));
    EXPECT_FALSE(parseFitsSection("1:10,1:5", x0, y0, w, h));
    EXPECT_FALSE(parseFitsSection("[1:10]", x0, y0, w, h));
}

TEST(PrepareParamsJson, RoundTripsInsidePipelineConfig) {
    PipelineConfig c;
    c.prepare.overscanMethod = "row";
    c.prepare.cosmics = true;
    c.prepare.cosmic.sigclip = 6.0;
    c.prepare.bleedGrow = 5;
    const nlohmann::json j = c;
    ASSERT_TRUE(j.contains("prepare"));
    const PipelineConfig back = j.get<PipelineConfig>();
    EXPECT_EQ(back.prepare.overscanMethod, "row");
    EXPECT_TRUE(back.prepare.cosmics);
    EXPECT_DOUBLE_EQ(back.prepare.cosmic.sigclip, 6.0);
    EXPECT_EQ(back.prepare.bleedGrow, 5);
    PipelineConfig d;
    EXPECT_THROW(applyPipelineConfig(d, nlohmann::json{{"prepare", {{"overscanMetod", "row"}}}}, "test"), InvalidInput);
    EXPECT_THROW(applyPipelineConfig(d, nlohmann::json{{"prepare", {{"bayer", "cmy"}}}}, "test"), InvalidInput);
}

TEST(PrepareBleed, MasksTrailsContiguousWithSaturatedPixelsAndGrowsThem) {
    const int w = 9, h = 40;
    Image<float> px(w, h, 100.0f);
    Image<std::uint8_t> mask(w, h, 0);
    const double sat = 1000.0;
    for (int y = 18; y <= 20; ++y) {
        px(4, y) = 1000.0f;
        mask(4, y) = MaskSaturated;
    }
    for (int y = 10; y < 18; ++y) px(4, y) = 950.0f; // trail below (above 0.9 sat)
    for (int y = 21; y < 25; ++y) px(4, y) = 920.0f; // trail above
    px(4, 30) = 990.0f;                              // bright but not connected: stays
    px(6, 19) = 990.0f;                              // another column without saturation: stays
    const std::size_t added = maskBleedTrails(px.view(), mask, sat, 0.9, 2);
    for (int y = 0; y < h; ++y) {
        const bool expect = y >= 8 && y <= 26;
        EXPECT_EQ((mask(4, y) & MaskSaturated) != 0, expect) << "y=" << y;
    }
    EXPECT_EQ(added, static_cast<std::size_t>(19 - 3));
    EXPECT_EQ(mask(6, 19), 0);
    EXPECT_EQ(mask(3, 19), 0);
}

// A galaxy field without saturation (the workbench's galaxies frame had flat vertical bands at sky level):
// the default preparation's bleed-trail step changes nothing there, neither a pixel value nor the mask, with
// or without a saturation level in the header. Bleed trails only ever add MaskSaturated along columns of
// pixels at saturation; they never write pixel values.
TEST(PrepareBleed, LeaveAGalaxyFieldWithoutSaturationUntouched) {
    SimParams p;
    p.width = 256;
    p.height = 256;
    p.stars = 40;
    p.galaxies = 120;
    p.galaxyMagBright = 13.0; // bright cores, still below the clipping level
    p.seed = 41;
    for (const double saturation : {65535.0, 0.0}) { // SATURATE in the header; none
        p.saturation = saturation;
        const SimResult sim = simulateField(p);
        Frame f = frameFromSimulation(sim);
        ASSERT_LT(*std::max_element(f.pixels.data(), f.pixels.data() + f.pixels.pixelCount()), 0.9 * 65535.0)
            << "the field must stay below a trail's level";
        const Image<float> before = f.pixels;
        const Image<std::uint8_t> maskBefore = f.mask;
        RunContext ctx;
        PrepareParams prep; // bleed trails on, as the workbench's default
        ASSERT_TRUE(prep.bleedTrails);
        const PrepareResult r = prepareFrame(f, nullptr, prep, ctx);
        EXPECT_EQ(r.bleedPixels, 0u) << "SATURATE " << saturation;
        ASSERT_EQ(f.width(), before.width());
        EXPECT_EQ(std::memcmp(f.pixels.data(), before.data(), before.pixelCount() * sizeof(float)), 0);
        ASSERT_EQ(f.mask.pixelCount(), maskBefore.pixelCount());
        if (maskBefore.pixelCount() > 0) {
            EXPECT_EQ(std::memcmp(f.mask.data(), maskBefore.data(), maskBefore.pixelCount()), 0);
        }
    }
}

// maskBleedTrails against a direct reading of its definition, pixel by pixel: a pixel is in a trail when
// the maximal run of (value >= fraction * SATURATE or saturated) pixels of its column that holds it also
// holds a saturated pixel; the mask grows by `grow` rows around every trail pixel. Random fields with
// trails at the frame edges, several per column, NaNs, other mask bits; grow 0..3 and larger.
TEST(PrepareBleed, MatchesTheDefinitionOnRandomFields) {
    for (int grow : {0, 1, 2, 3, 17})
        for (unsigned seed : {1u, 2u, 3u}) {
            const int w = 23 + static_cast<int>(seed), h = 61;
            std::mt19937 rng(seed * 31u + static_cast<unsigned>(grow));
            std::uniform_real_distribution<float> u(0.0f, 1.0f);
            Image<float> px(w, h, 0.0f);
            Image<std::uint8_t> mask(w, h, 0);
            const double sat = 1000.0;
            for (int y = 0; y < h; ++y)
                for (int x = 0; x < w; ++x) {
                    const float r = u(rng);
                    px(x, y) = r < 0.25f ? 950.0f : (r < 0.27f ? NAN : 100.0f); // bright runs, NaNs
                    if (r > 0.97f) {
                        px(x, y) = 1000.0f;
                        mask(x, y) = MaskSaturated;
                    } else if (r > 0.95f) {
                        mask(x, y) = MaskBad; // must survive
                    }
                }
            for (int x = 0; x < w; x += 5) { // trails touching the first and the last row
                px(x, 0) = px(x, h - 1) = 1000.0f;
                mask(x, 0) = mask(x, h - 1) = MaskSaturated;
            }
            const float level = static_cast<float>(0.9 * sat);
            Image<std::uint8_t> expect = mask;
            std::size_t expectAdded = 0;
            for (int x = 0; x < w; ++x)
                for (int y = 0; y < h; ++y) {
                    bool inTrail = false;
                    for (int d = std::max(0, y - grow); d <= std::min(h - 1, y + grow) && !inTrail; ++d) {
                        auto cond = [&](int k) { return px(x, k) >= level || (mask(x, k) & MaskSaturated); };
                        if (!cond(d)) continue;
                        int a = d, b = d;
                        while (a > 0 && cond(a - 1)) --a;
                        while (b < h - 1 && cond(b + 1)) ++b;
                        for (int k = a; k <= b; ++k) inTrail = inTrail || (mask(x, k) & MaskSaturated);
                    }
                    if (inTrail && !(expect(x, y) & MaskSaturated)) {
                        expect(x, y) |= MaskSaturated;
                        ++expectAdded;
                    }
                }
            const std::size_t added = maskBleedTrails(px.view(), mask, sat, 0.9, grow);
            EXPECT_EQ(added, expectAdded) << "grow " << grow << " seed " << seed;
            EXPECT_GT(added, 0u);
            for (int y = 0; y < h; ++y)
                for (int x = 0; x < w; ++x) ASSERT_EQ(mask(x, y), expect(x, y)) << x << "," << y << " grow " << grow;
        }
}

SimParams rawCamera() {
    SimParams p;
    p.width = 192;
    p.height = 160;
    p.stars = 60;
    p.magBright = 15.0;
    p.magFaint = 19.0;
    p.seed = 21;
    p.detectorSeed = 77;
    p.bias = 1000.0;
    p.biasRowAmplitude = 2.0;
    p.biasColumnAmplitude = 3.0;
    p.prescan = 6;
    p.overscan = 20;
    p.darkCurrent = 0.5;
    p.darkHotPixels = 10;
    p.darkHotMax = 600.0;
    p.flatVignetting = 0.2;
    p.flatPixelSigma = 0.01;
    p.exptime = 60.0;
    p.refMargin = 0.0;
    return p;
}

// The same field without any detector effect (what a perfect preparation gives back).
SimParams cleanOf(const SimParams& raw) {
    SimParams q = raw;
    q.bias = 0.0;
    q.biasRowAmplitude = q.biasColumnAmplitude = 0.0;
    q.prescan = q.overscan = 0;
    q.darkCurrent = 0.0;
    q.darkHotPixels = 0;
    q.flatVignetting = q.flatPixelSigma = 0.0;
    return q;
}

std::vector<Frame> calibration(const SimParams& light, const std::string& type, int n) {
    std::vector<Frame> out;
    for (int i = 0; i < n; ++i) {
        Frame f = frameFromSimulation(simulateField(calibrationFrameParams(light, type, i)));
        f.path = type + std::to_string(i + 1) + ".fits";
        out.push_back(std::move(f));
    }
    return out;
}

CalibrationImage asCalibration(const Frame& f, const std::string& path) {
    CalibrationImage c;
    c.pixels = f.pixels;
    c.mask = Image<std::uint8_t>(f.width(), f.height(), 0);
    c.header = f.header;
    c.path = path;
    return c;
}

// Masters (bias, dark, flat) for the camera of `light`, as loadPrepareInputs would hold them.
PrepareInputs makeMasters(const SimParams& light, int n, const PrepareParams& prep, RunContext& ctx) {
    std::vector<Frame> b = calibration(light, "bias", n), d = calibration(light, "dark", n),
                       f = calibration(light, "flat", n);
    const MasterResult mb = buildMaster("bias", b, CombineParams{}, prep, nullptr, nullptr, ctx);
    const MasterResult md = buildMaster("dark", d, CombineParams{}, prep, &mb.master, nullptr, ctx);
    const MasterResult mf = buildMaster("flat", f, CombineParams{}, prep, &mb.master, &md.master, ctx);
    PrepareInputs in;
    in.bias = asCalibration(mb.master, "mbias.fits");
    in.dark = asCalibration(md.master, "mdark.fits");
    in.flat = asCalibration(mf.master, "mflat.fits");
    BadPixelParams bp;
    const BadPixelResult bad = detectBadPixels(md.master.view(), mf.master.view(), bp);
    in.badPixels = bad.mask;
    in.badPixelPath = "masters";
    return in;
}

TEST(PrepareOverscan, TrimsToTheDataSectionAndShiftsTheWcs) {
    SimParams p = rawCamera();
    p.noise = false;
    const SimResult sim = simulateField(p);
    Frame f = frameFromSimulation(sim);
    ASSERT_EQ(f.width(), p.width + p.prescan + p.overscan);
    RunContext ctx;
    const PrepareResult r = applyOverscanAndTrim(f, PrepareParams{}, ctx);
    ASSERT_TRUE(r.overscanApplied);
    ASSERT_TRUE(r.trimmed);
    EXPECT_EQ(f.width(), p.width);
    EXPECT_EQ(f.height(), p.height);
    EXPECT_EQ(r.trimX0, p.prescan);
    EXPECT_NEAR(r.overscanLevel, p.bias, 1.0);
    EXPECT_DOUBLE_EQ(f.header.getDouble("LTV1").value_or(0.0), -p.prescan);
    EXPECT_FALSE(f.header.has("BIASSEC"));
    ASSERT_TRUE(f.wcs);
    // Truth positions (1-based, data section) through the trimmed frame's WCS land on the true sky position.
    const std::vector<double> tx = sim.truth.doubles("x"), ty = sim.truth.doubles("y"), tra = sim.truth.doubles("ra"),
                              tdec = sim.truth.doubles("dec");
    for (std::size_t i = 0; i < tx.size(); i += 7) {
        const auto [ra, dec] = f.wcs->pixelToWorld(tx[i] - 1.0, ty[i] - 1.0);
        EXPECT_NEAR((ra - tra[i]) * std::cos(tdec[i] * M_PI / 180.0) * 3600.0, 0.0, 0.01);
        EXPECT_NEAR((dec - tdec[i]) * 3600.0, 0.0, 0.01);
    }
    // --no-overscan: nothing happens.
    Frame g = frameFromSimulation(sim);
    PrepareParams off;
    off.overscan = off.trim = false;
    const PrepareResult r2 = applyOverscanAndTrim(g, off, ctx);
    EXPECT_FALSE(r2.trimmed);
    EXPECT_EQ(g.width(), p.width + p.prescan + p.overscan);
}

TEST(PrepareChain, NoiselessPreparedFrameEqualsTheCleanSimulation) {
    SimParams raw = rawCamera();
    raw.noise = false;
    RunContext ctx;
    PrepareParams prep;
    const PrepareInputs in = makeMasters(raw, 3, prep, ctx);
    Frame f = frameFromSimulation(simulateField(raw));
    const PrepareResult r = prepareFrame(f, &in, prep, ctx);
    EXPECT_TRUE(r.biasApplied && r.darkApplied && r.flatApplied && r.trimmed);
    EXPECT_DOUBLE_EQ(r.darkScale, 1.0);
    const SimResult clean = simulateField(cleanOf(raw));
    ASSERT_EQ(f.width(), clean.image.width());
    ASSERT_EQ(f.height(), clean.image.height());
    double worst = 0.0;
    std::size_t masked = 0;
    for (int y = 0; y < f.height(); ++y)
        for (int x = 0; x < f.width(); ++x) {
            if (f.mask(x, y)) {
                ++masked;
                continue;
            }
            const double truth = clean.image(x, y);
            worst = std::max(worst, std::fabs(f.pixels(x, y) - truth) / std::max(1.0, std::fabs(truth)));
        }
    EXPECT_LT(worst, 2e-3);
    // The dark's hot pixels are found in the master dark and masked in the prepared frame.
    const Image<float> rate = simDarkMap(raw);
    std::size_t hot = 0;
    for (int y = 0; y < f.height(); ++y)
        for (int x = 0; x < f.width(); ++x)
            if (rate(x, y) > raw.darkHotMin * 0.99) {
                ++hot;
                EXPECT_TRUE(f.mask(x, y) & MaskBad) << x << "," << y;
            }
    EXPECT_EQ(hot, static_cast<std::size_t>(raw.darkHotPixels));
    EXPECT_LT(masked, static_cast<std::size_t>(raw.darkHotPixels + 50));
    // The saturation level moved to prepared ADU.
    EXPECT_NEAR(f.instrument.saturation, raw.saturation - raw.bias, 60.0);
}

// Median of box medians relative to the frame median: the largest deviation.
double worstBoxDeviation(const Frame& f, int box) {
    std::vector<float> all;
    for (int y = 0; y < f.height(); ++y)
        for (int x = 0; x < f.width(); ++x)
            if (!f.mask(x, y)) all.push_back(f.pixels(x, y));
    std::nth_element(all.begin(), all.begin() + all.size() / 2, all.end());
    const double med = all[all.size() / 2];
    double worst = 0.0;
    for (int by = 0; by + box <= f.height(); by += box)
        for (int bx = 0; bx + box <= f.width(); bx += box) {
            std::vector<float> v;
            for (int y = by; y < by + box; ++y)
                for (int x = bx; x < bx + box; ++x)
                    if (!f.mask(x, y)) v.push_back(f.pixels(x, y));
            std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
            worst = std::max(worst, std::fabs(v[v.size() / 2] / med - 1.0));
        }
    return worst;
}

TEST(PrepareChain, NoisyFlatFieldedSkyIsFlatToHalfAPercent) {
    SimParams raw = rawCamera();
    raw.stars = 0;
    raw.sky = 1000.0;
    raw.cosmicRays = 5;
    RunContext ctx;
    PrepareParams prep;
    const PrepareInputs in = makeMasters(raw, 5, prep, ctx);
    Frame f = frameFromSimulation(simulateField(raw));
    prepareFrame(f, &in, prep, ctx);
    const double flat = worstBoxDeviation(f, 32);
    EXPECT_LT(flat, 0.005);
    // Without the flat the vignetting shows (the measure can fail).
    PrepareInputs noFlat;
    noFlat.bias = in.bias;
    noFlat.dark = in.dark;
    Frame g = frameFromSimulation(simulateField(raw));
    prepareFrame(g, &noFlat, prep, ctx);
    EXPECT_GT(worstBoxDeviation(g, 32), 0.03);
    // The sky level is the truth's (bias, dark and overscan removed; flat median 1).
    std::vector<float> v(f.pixels.data(), f.pixels.data() + f.pixels.pixelCount());
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    EXPECT_NEAR(v[v.size() / 2], raw.sky, 0.005 * raw.sky);
}

TEST(PrepareChain, MismatchedMastersAreInvalidInputNamingBothFiles) {
    SimParams raw = rawCamera();
    raw.noise = false;
    raw.stars = 5;
    RunContext ctx;
    const SimResult sim = simulateField(raw);
    auto expectError = [&](const PrepareInputs& in, const std::vector<std::string>& words) {
        Frame f = frameFromSimulation(sim);
        f.path = "light.fits";
        try {
            prepareFrame(f, &in, PrepareParams{}, ctx);
            ADD_FAILURE() << "no exception";
        } catch (const InvalidInput& e) {
            for (const auto& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
        }
    };
    CalibrationImage small;
    small.pixels = Image<float>(raw.width - 2, raw.height, 0.0f);
    small.mask = Image<std::uint8_t>(raw.width - 2, raw.height, 0);
    small.path = "small_bias.fits";
    PrepareInputs a;
    a.bias = small;
    expectError(a, {"light.fits", "small_bias.fits"});

    CalibrationImage flat;
    flat.pixels = Image<float>(raw.width, raw.height, 1.0f);
    flat.mask = Image<std::uint8_t>(raw.width, raw.height, 0);
    flat.header.set("FILTER", "B");
    flat.path = "flat_B.fits";
    PrepareInputs b;
    b.flat = flat;
    expectError(b, {"light.fits", "flat_B.fits", "FILTER"});

    CalibrationImage binned = flat;
    binned.header = Header{};
    binned.header.set("CCDSUM", "2 2");
    binned.path = "bias_2x2.fits";
    PrepareInputs c;
    c.bias = binned;
    Frame f = frameFromSimulation(sim);
    f.path = "light.fits";
    f.header.set("XBINNING", 1);
    f.header.set("YBINNING", 1);
    try {
        prepareFrame(f, &c, PrepareParams{}, ctx);
        ADD_FAILURE() << "no exception";
    } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find("bias_2x2.fits"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("binning"), std::string::npos) << e.what();
    }

    CalibrationImage dark = flat;
    dark.header = Header{};
    dark.path = "dark_noexp.fits";
    PrepareInputs d;
    d.dark = dark;
    expectError(d, {"dark_noexp.fits", "EXPTIME"});

    // A master of the untrimmed (raw) size is cut with the frame's section.
    CalibrationImage rawSized;
    const int rw = raw.width + raw.prescan + raw.overscan;
    rawSized.pixels = Image<float>(rw, raw.height, 0.0f);
    rawSized.mask = Image<std::uint8_t>(rw, raw.height, 0);
    for (int y = 0; y < raw.height; ++y) rawSized.pixels(raw.prescan + 3, y) = 7.0f;
    rawSized.path = "raw_bias.fits";
    PrepareInputs e;
    e.bias = rawSized;
    Frame g = frameFromSimulation(sim), ref = frameFromSimulation(sim);
    prepareFrame(g, &e, PrepareParams{}, ctx);
    prepareFrame(ref, nullptr, PrepareParams{}, ctx);
    EXPECT_NEAR(ref.pixels(3, 10) - g.pixels(3, 10), 7.0, 1e-3);
    EXPECT_NEAR(ref.pixels(4, 10) - g.pixels(4, 10), 0.0, 1e-3);
}

TEST(PrepareMask, MaskedHotPixelFlagsTheApertureAndLeavesBackgroundAndFluxAlone) {
    SimParams p;
    p.width = p.height = 256;
    p.stars = 40;
    p.magBright = 14.0;
    p.magFaint = 17.0;
    p.seed = 5;
    p.refMargin = 0.0;
    const SimResult sim = simulateField(p);
    // The brightest star far from the edges.
    const std::vector<double> tx = sim.truth.doubles("x"), ty = sim.truth.doubles("y"), mag = sim.truth.doubles("mag");
    int best = -1;
    for (std::size_t i = 0; i < tx.size(); ++i)
        if (tx[i] > 30 && tx[i] < p.width - 30 && ty[i] > 30 && ty[i] < p.height - 30 && (best < 0 || mag[i] < mag[best]))
            best = static_cast<int>(i);
    ASSERT_GE(best, 0);
    const int hx = static_cast<int>(std::lround(tx[best] - 1.0)) + 2, hy = static_cast<int>(std::lround(ty[best] - 1.0));

    PrepareInputs in;
    in.badPixels = Image<std::uint8_t>(p.width, p.height, 0);
    in.badPixels(hx, hy) = 1;
    in.badPixelPath = "bpm.fits";
    RunContext ctx;
    Frame hot = frameFromSimulation(sim), plain = frameFromSimulation(sim);
    hot.pixels(hx, hy) += 20000.0f; // a hot pixel two pixels from the star's centre
    prepareFrame(hot, &in, PrepareParams{}, ctx);
    prepareFrame(plain, &in, PrepareParams{}, ctx);
    ASSERT_TRUE(hot.mask(hx, hy) & MaskBad);

    PipelineConfig cfg;
    cfg.fitAstrometry = false;
    const BackgroundResult b1 = estimateBackground(hot.view(), hot.maskView(), cfg.background, ctx);
    const BackgroundResult b2 = estimateBackground(plain.view(), plain.maskView(), cfg.background, ctx);
    ASSERT_EQ(b1.level.pixelCount(), b2.level.pixelCount());
    EXPECT_TRUE(std::equal(b1.level.data(), b1.level.data() + b1.level.pixelCount(), b2.level.data()));
    EXPECT_TRUE(std::equal(b1.rms.data(), b1.rms.data() + b1.rms.pixelCount(), b2.rms.data()));

    const PipelineResult r1 = runPipeline(hot, cfg, ctx), r2 = runPipeline(plain, cfg, ctx);
    auto nearest = [&](const PipelineResult& r) {
        int k = -1;
        double d2 = 1e30;
        for (std::size_t i = 0; i < r.detection.sources.x.size(); ++i) {
            const double dx = r.detection.sources.x[i] - (tx[best] - 1.0), dy = r.detection.sources.y[i] - (ty[best] - 1.0);
            if (dx * dx + dy * dy < d2) {
                d2 = dx * dx + dy * dy;
                k = static_cast<int>(i);
            }
        }
        EXPECT_LT(d2, 1.0);
        return k;
    };
    const int k1 = nearest(r1), k2 = nearest(r2);
    ASSERT_GE(k1, 0);
    ASSERT_GE(k2, 0);
    bool flagged = false;
    for (std::size_t a = 0; a < r1.aperture.radii.size(); ++a) {
        if (r1.aperture.radii[a] < 3.0) continue; // the aperture covers the pixel 2 px from the centre
        flagged = true;
        EXPECT_TRUE(r1.aperture.apertureFlags[a][k1] & FlagApertureMasked) << "radius " << r1.aperture.radii[a];
        // The masked pixel's value never enters the sum.
        EXPECT_NEAR(r1.aperture.flux[a][k1], r2.aperture.flux[a][k2], 1e-6 * std::fabs(r2.aperture.flux[a][k2]) + 1e-6);
    }
    EXPECT_TRUE(flagged);
}

TEST(PrepareChain, ReduceOfARawFrameWithMastersReachesTheTrueZeroPoint) {
    SimParams raw = rawCamera();
    raw.width = raw.height = 400;
    raw.stars = 300;
    raw.magBright = 13.0;
    raw.magFaint = 19.0;
    raw.refMagLimit = 18.0;
    raw.refMargin = 0.05;
    raw.flatVignetting = 0.25;
    RunContext ctx;
    PrepareParams prep;
    const PrepareInputs in = makeMasters(raw, 5, prep, ctx);
    test::TempDir dir("gpuphot_prepare_zp");
    writeSimulation(simulateField(raw), dir.str(), "raw", -32);
    ReduceOptions ro;
    ro.write = false;
    ro.prepare = &in;
    const ReferenceCatalog ref = readReferenceCatalog(dir / "raw.ref.fits");
    ro.reference = &ref;
    const ReduceSummary s = reduceFrame(dir / "raw.fits", ro, ctx);
    ASSERT_TRUE(s.report["zp"].is_number()) << s.report.dump();
    EXPECT_NEAR(s.report["zp"].get<double>(), raw.zeroPoint, 0.01) << s.report["calibration"].dump() << s.report["aperture"].dump();
    ASSERT_TRUE(s.report.contains("prepare"));
    EXPECT_TRUE(s.report["prepare"]["flat"].get<bool>());
    PrepareInputs noFlat;
    noFlat.bias = in.bias;
    noFlat.dark = in.dark;
    ro.prepare = &noFlat;
    const ReduceSummary s2 = reduceFrame(dir / "raw.fits", ro, ctx);
    ASSERT_TRUE(s2.report["zp"].is_number());
    // Without the flat the vignetting (25% at the corners) widens the calibrators' scatter.
    EXPECT_GT(s2.report["calibration"]["scatter"].get<double>(), 1.5 * s.report["calibration"]["scatter"].get<double>())
        << s.report["calibration"].dump() << "\n" << s2.report["calibration"].dump();
}

} // namespace
} // namespace gpuphot
