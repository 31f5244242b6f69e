// The memory-lean pipeline (resource bounds): the background kept as its mesh grid with an exact
// on-demand sampler instead of full-resolution maps must give the same pixels and the same results bit
// for bit as the full maps.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

#include "core/io/fits_image.hpp"
#include "core/model/frame.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/sim_frame.hpp"
#include "core/sim/simulator.hpp"
#include "core/stages/background/background.hpp"

namespace gpuphot {
namespace {

bool sameBits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }
bool sameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

template <class V> ::testing::AssertionResult sameVector(const V& a, const V& b, const char* what) {
    if (a.size() != b.size()) return ::testing::AssertionFailure() << what << ": sizes differ";
    for (std::size_t i = 0; i < a.size(); ++i)
        if (!sameBits(static_cast<double>(a[i]), static_cast<double>(b[i])) &&
            !(std::isnan(static_cast<double>(a[i])) && std::isnan(static_cast<double>(b[i]))))
            return ::testing::AssertionFailure() << what << "[" << i << "]: " << a[i] << " vs " << b[i];
    return ::testing::AssertionSuccess();
}

Image<float> noisyFrame(int w, int h, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0.0f, 5.0f);
    Image<float> img(w, h, Image<float>::NoInit{});
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            img(x, y) = 100.0f + 0.03f * x - 0.02f * y + 8.0f * std::sin(x / 40.0f) * std::cos(y / 55.0f) + n(rng);
    return img;
}

// Every pixel of the sampler (per pixel and per row) equals the full maps', for regular and partial last
// meshes, rectangular meshes, one-mesh frames and both spline conventions.
TEST(BackgroundSampler, EqualsFullMapsBitwise) {
    struct Case {
        int w, h, mw, mh;
        bool sex;
    };
    for (const Case c : {Case{301, 257, 32, 0, false}, Case{301, 257, 32, 24, true}, Case{50, 40, 64, 0, false},
                         Case{130, 70, 64, 0, true}, Case{97, 300, 16, 40, false}}) {
        const Image<float> img = noisyFrame(c.w, c.h, 7u + static_cast<unsigned>(c.w));
        BackgroundParams p;
        p.meshSize = c.mw;
        p.meshHeight = c.mh;
        p.sextractorSpline = c.sex;
        RunContext ctx;
        ctx.threads = 2;
        const BackgroundResult full = estimateBackground(img.view(), MaskView{}, p, ctx);
        ASSERT_TRUE(full.hasFullMaps());
        const BackgroundSampler s(full, ctx);
        ASSERT_EQ(s.width(), c.w);
        ASSERT_EQ(s.height(), c.h);
        std::vector<float> lv(c.w), rm(c.w);
        int mismatches = 0;
        for (int y = 0; y < c.h; ++y) {
            s.row(y, lv.data(), rm.data());
            for (int x = 0; x < c.w; ++x) {
                mismatches += !sameBits(s.levelAt(x, y), full.level(x, y));
                mismatches += !sameBits(s.rmsAt(x, y), full.rms(x, y));
                mismatches += !sameBits(lv[x], full.level(x, y));
                mismatches += !sameBits(rm[x], full.rms(x, y));
            }
            // spans of the rms row starting and ending anywhere, across mesh nodes (the windowed positions')
            for (const auto& [x0, n] : {std::pair{0, c.w}, std::pair{c.w / 3, c.w / 2}, std::pair{c.w - 5, 5},
                                        std::pair{c.w / 2, 1}}) {
                std::fill(rm.begin(), rm.end(), -1.0f);
                s.rmsSpan(y, x0, n, rm.data());
                for (int i = 0; i < n; ++i)
                    mismatches += !sameBits(rm[i], full.rms(x0 + i, y));
            }
        }
        EXPECT_EQ(mismatches, 0) << c.w << "x" << c.h << " mesh " << c.mw << "x" << c.mh << " sex " << c.sex;
        // The mesh-only result with a sampler, and maps made from it, are the same maps again.
        p.fullMaps = false;
        BackgroundResult lean = estimateBackground(img.view(), MaskView{}, p, ctx);
        EXPECT_FALSE(lean.hasFullMaps());
        materializeBackgroundMaps(lean, ctx);
        ASSERT_TRUE(lean.hasFullMaps());
        EXPECT_EQ(std::memcmp(lean.level.data(), full.level.data(), full.level.pixelCount() * sizeof(float)), 0);
        EXPECT_EQ(std::memcmp(lean.rms.data(), full.rms.data(), full.rms.pixelCount() * sizeof(float)), 0);
    }
}

// The whole pipeline without full maps (CPU default) and with them (workbench) gives the same sources,
// PSF fluxes, apertures and segmentation bit for bit; the lean result keeps no full maps.
TEST(PipelineLeanMaps, SameResultsAsFullMaps) {
    SimParams sp;
    sp.width = 700;
    sp.height = 520;
    sp.stars = 900;
    sp.seed = 11;
    const SimResult sim = simulateField(sp);
    const Frame frame = frameFromSimulation(sim, true);
    PipelineConfig config;
    for (const bool secondPass : {false, true}) {
        config.backgroundSecondPass = secondPass;
        RunContext ctx;
        ctx.threads = 2;
        PipelineResult lean, full;
        full.keepFullMaps = true;
        runPipeline(frame, config, ctx, lean);
        runPipeline(frame, config, ctx, full);
        EXPECT_FALSE(lean.background.hasFullMaps());
        ASSERT_TRUE(lean.background.sampler);
        EXPECT_TRUE(full.background.hasFullMaps());
        const Sources& a = lean.detection.sources;
        const Sources& b = full.detection.sources;
        ASSERT_GT(a.size(), 100u);
        ASSERT_EQ(a.size(), b.size());
        EXPECT_TRUE(sameVector(a.x, b.x, "x"));
        EXPECT_TRUE(sameVector(a.y, b.y, "y"));
        EXPECT_TRUE(sameVector(a.xErr, b.xErr, "xErr"));
        EXPECT_TRUE(sameVector(a.fluxIso, b.fluxIso, "fluxIso"));
        EXPECT_TRUE(sameVector(a.fluxIsoErr, b.fluxIsoErr, "fluxIsoErr"));
        EXPECT_TRUE(sameVector(a.flags, b.flags, "flags"));
        EXPECT_EQ(std::memcmp(lean.detection.segmentation.data(), full.detection.segmentation.data(),
                              full.detection.segmentation.pixelCount() * sizeof(std::int32_t)),
                  0);
        EXPECT_TRUE(sameVector(lean.psf.fluxPsf, full.psf.fluxPsf, "fluxPsf"));
        EXPECT_TRUE(sameVector(lean.psf.fwhm, full.psf.fwhm, "psf fwhm"));
        ASSERT_EQ(lean.aperture.flux.size(), full.aperture.flux.size());
        for (std::size_t k = 0; k < full.aperture.flux.size(); ++k) {
            EXPECT_TRUE(sameVector(lean.aperture.flux[k], full.aperture.flux[k], "aperture flux"));
            EXPECT_TRUE(sameVector(lean.aperture.fluxErr[k], full.aperture.fluxErr[k], "aperture fluxErr"));
        }
        EXPECT_TRUE(sameVector(lean.aperture.sky, full.aperture.sky, "sky"));
        EXPECT_TRUE(sameVector(lean.aperture.fluxOpt, full.aperture.fluxOpt, "fluxOpt"));
        EXPECT_TRUE(sameVector(lean.aperture.flags, full.aperture.flags, "aperture flags"));
    }
}

// Apertures with the map sky (useLocalSky off) read the map at every aperture pixel: the sampler gives
// the same sums as the full maps.
TEST(PipelineLeanMaps, MapSkyApertures) {
    SimParams sp;
    sp.width = 400;
    sp.height = 300;
    sp.stars = 300;
    sp.seed = 5;
    const SimResult sim = simulateField(sp);
    const Frame frame = frameFromSimulation(sim);
    PipelineConfig config;
    config.aperture.useLocalSky = false;
    RunContext ctx;
    ctx.threads = 2;
    PipelineResult lean, full;
    full.keepFullMaps = true;
    runPipeline(frame, config, ctx, lean);
    runPipeline(frame, config, ctx, full);
    ASSERT_GT(full.detection.sources.size(), 50u);
    for (std::size_t k = 0; k < full.aperture.flux.size(); ++k)
        EXPECT_TRUE(sameVector(lean.aperture.flux[k], full.aperture.flux[k], "aperture flux"));
    EXPECT_TRUE(sameVector(lean.aperture.sky, full.aperture.sky, "sky"));
    EXPECT_TRUE(sameVector(lean.aperture.skyRms, full.aperture.skyRms, "skyRms"));
}

// A real frame by hand (skipped unless GPUPHOT_LEAN_FRAME names a FITS file): lean vs full maps.
TEST(PipelineLeanMaps, FrameFromEnvironment) {
    const char* path = std::getenv("GPUPHOT_LEAN_FRAME");
    if (!path) GTEST_SKIP() << "GPUPHOT_LEAN_FRAME not set";
    const Frame frame = readFrame(path, FrameReadOptions{});
    PipelineConfig config;
    RunContext ctx;
    ctx.threads = 2;
    PipelineResult lean, full;
    full.keepFullMaps = true;
    runPipeline(frame, config, ctx, lean);
    runPipeline(frame, config, ctx, full);
    EXPECT_TRUE(sameVector(lean.detection.sources.x, full.detection.sources.x, "x"));
    EXPECT_TRUE(sameVector(lean.psf.fluxPsf, full.psf.fluxPsf, "fluxPsf"));
    EXPECT_TRUE(sameVector(lean.aperture.fluxOpt, full.aperture.fluxOpt, "fluxOpt"));
    EXPECT_TRUE(sameVector(lean.aperture.flags, full.aperture.flags, "aperture flags"));
}

// Kept detection images (the workbench's threshold edits): a run from the detection with another threshold
// thresholds the kept images again and gives the fresh run's result bit for bit; a new filter or a new
// background makes them anew.
TEST(PipelineKeptDetectionImages, ThresholdEditsGiveTheFreshRunsResults) {
    SimParams sp;
    sp.width = 600;
    sp.height = 450;
    sp.stars = 700;
    sp.galaxies = 40;
    sp.seed = 23;
    const SimResult sim = simulateField(sp);
    const Frame frame = frameFromSimulation(sim, true);
    PipelineConfig config;
    RunContext ctx;
    ctx.threads = 2;
    PipelineResult kept;
    kept.keepDetectionImages = true;
    runPipeline(frame, config, ctx, kept);
    ASSERT_TRUE(kept.detectionImages);
    const auto images = kept.detectionImages;
    for (const double threshold : {2.5, 1.1, 1.8}) {
        config.detection.threshold = threshold;
        runPipeline(frame, config, ctx, kept, Stage::Detection);
        EXPECT_EQ(kept.detectionImages, images) << "made anew at threshold " << threshold;
        PipelineResult fresh;
        runPipeline(frame, config, ctx, fresh);
        EXPECT_FALSE(fresh.detectionImages);
        ASSERT_GT(fresh.detection.sources.size(), 50u);
        EXPECT_EQ(firstPhotometryDifference(kept, fresh), "") << "threshold " << threshold;
        EXPECT_EQ(std::memcmp(kept.detection.segmentation.data(), fresh.detection.segmentation.data(),
                              fresh.detection.segmentation.pixelCount() * sizeof(std::int32_t)),
                  0);
    }
    config.detection.filterFwhm = 4.0; // another filter: other images
    runPipeline(frame, config, ctx, kept, Stage::Detection);
    EXPECT_NE(kept.detectionImages, images);
    PipelineResult fresh;
    runPipeline(frame, config, ctx, fresh);
    EXPECT_EQ(firstPhotometryDifference(kept, fresh), "");
    const auto filtered = kept.detectionImages;
    runPipeline(frame, config, ctx, kept, Stage::Background); // a new background: other images
    EXPECT_NE(kept.detectionImages, filtered);
}

} // namespace
} // namespace gpuphot
