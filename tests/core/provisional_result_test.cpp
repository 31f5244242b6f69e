// The workbench's re-run after a detection edit through core's API (core/pipeline/pipeline.hpp
// runPipelineUntil, provisionalResult; ui/pipeline_worker.cpp and bench/bench_rerun.cpp use them): the
// provisional result's detection and aperture columns against full runs of the pipeline.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/model/frame.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/sim_frame.hpp"
#include "core/sim/simulator.hpp"
#include "core/util/errors.hpp"
#include "tests/core/test_fields.hpp"

namespace gpuphot {
namespace {

Frame testFrame() {
    SimParams sp;
    sp.width = 420;
    sp.height = 380;
    sp.stars = 450;
    sp.seed = 29;
    return frameFromSimulation(simulateField(sp), true);
}

RunContext cpuContext() {
    RunContext ctx;
    ctx.threads = 2;
    return ctx;
}

// The stages before the PSF of `config`, from scratch.
PipelineResult detectOnly(const Frame& frame, const PipelineConfig& config, RunContext& ctx) {
    PipelineResult r;
    runPipelineUntil(frame, config, ctx, r, Stage::Background, Stage::Psf);
    return r;
}

TEST(ProvisionalResult, UnchangedThresholdGivesTheFullRunsColumns) {
    const Frame frame = testFrame();
    const PipelineConfig config;
    RunContext ctx = cpuContext();
    const PipelineResult full = runPipeline(frame, config, ctx);
    ASSERT_GT(full.detection.sources.size(), 100u);
    ASSERT_TRUE(full.psf.hasModel());
    // The worker's way: the earlier background reused, detection to the PSF stage, then the provisional
    // stages; the PSF model is the one the full run measured apertures with, so every column is the same.
    PipelineResult detected;
    detected.background = full.background;
    detected.completed = Stage::Detection;
    runPipelineUntil(frame, config, ctx, detected, Stage::Detection, Stage::Psf);
    EXPECT_EQ(detected.completed, Stage::Psf);
    const PipelineResult prov = provisionalResult(frame, config, ctx, detected, full);
    EXPECT_EQ(prov.completed, Stage::Done);
    // The curve of growth is the full run's, without its stars' list (it indexes the earlier sources).
    EXPECT_EQ(full.aperture.apCorrSource, "stars");
    EXPECT_FALSE(full.aperture.apCorrStarIndex.empty());
    EXPECT_TRUE(prov.aperture.apCorrStarIndex.empty());
    EXPECT_TRUE(prov.aperture.apCorrStarRatio.empty());
    PipelineResult withStars = prov;
    withStars.aperture.apCorrStarIndex = full.aperture.apCorrStarIndex;
    EXPECT_EQ(firstPhotometryDifference(withStars, full), "");
    ASSERT_EQ(prov.psf.fluxPsf.size(), full.detection.sources.size());
    for (std::size_t i = 0; i < prov.psf.fluxPsf.size(); ++i) {
        EXPECT_TRUE(std::isnan(prov.psf.fluxPsf[i])) << i; // not measured in a provisional result
        const double x = prov.detection.sources.x[i], y = prov.detection.sources.y[i];
        if (std::isfinite(x) && std::isfinite(y)) {
            EXPECT_EQ(prov.psf.fwhm[i], full.psf.fwhmAt(x, y)) << i;
        }
    }
    // The comparison can fail: one bit of one flux.
    PipelineResult changed = prov;
    std::uint64_t bits;
    std::memcpy(&bits, &changed.aperture.flux[1][7], sizeof bits);
    bits ^= 1u;
    std::memcpy(&changed.aperture.flux[1][7], &bits, sizeof bits);
    EXPECT_EQ(firstPhotometryDifference(changed, full), "flux[7]");
    changed = prov;
    changed.detection.sources.segmentId.pop_back();
    EXPECT_NE(firstPhotometryDifference(changed, full), "");
}

TEST(ProvisionalResult, NewThresholdEqualsAFreshRunsDetectionAndApertures) {
    const Frame frame = testFrame();
    PipelineConfig before;
    RunContext ctx = cpuContext();
    const PipelineResult previous = runPipeline(frame, before, ctx);
    PipelineConfig after = before;
    after.detection.threshold = 3.0;

    // Re-run on the earlier background (the resident frame's path).
    PipelineResult detected;
    detected.background = previous.background;
    detected.completed = Stage::Detection;
    runPipelineUntil(frame, after, ctx, detected, Stage::Detection, Stage::Psf);
    const PipelineResult prov = provisionalResult(frame, after, ctx, detected, previous);
    ASSERT_GT(prov.detection.sources.size(), 50u);
    EXPECT_LT(prov.detection.sources.size(), previous.detection.sources.size());

    // Independently: a fresh context runs every stage of `after`; its detection must be the provisional
    // one, and its aperture stage re-run from its own detection with the previous PSF model and FWHM must
    // give the provisional apertures.
    RunContext fresh = cpuContext();
    PipelineResult expect = runPipeline(frame, after, fresh);
    expect.psf = psfModelForSources(previous.psf, expect.detection.sources);
    expect.fwhm = previous.fwhm;
    expect.fwhmSource = previous.fwhmSource;
    runPipeline(frame, after, fresh, expect, Stage::Aperture);
    // The provisional curve of growth is previous's (not measured again), and so are the columns read
    // from it: the S/N-optimal apertures and the instrumental magnitudes made from them.
    const ApertureResult &pa = prov.aperture, &was = previous.aperture;
    EXPECT_EQ(pa.cogRadius, was.cogRadius);
    EXPECT_EQ(pa.cogFraction, was.cogFraction);
    ASSERT_EQ(pa.apCorrMag.size(), was.apCorrMag.size());
    for (std::size_t k = 0; k < was.apCorrMag.size(); ++k)
        EXPECT_NEAR(pa.apCorrMag[k], was.apCorrMag[k], 1e-12) << k;
    EXPECT_NE(expect.aperture.cogFraction, was.cogFraction) << "the test needs a curve that changes";
    for (ApertureResult* a : {&expect.aperture}) {
        a->apCorrMag = pa.apCorrMag;
        a->apCorrMagErr = pa.apCorrMagErr;
        a->apCorrRatio = pa.apCorrRatio;
        a->apCorrStarIndex = pa.apCorrStarIndex;
        a->cogFraction = pa.cogFraction;
        a->radiusOpt = pa.radiusOpt;
        a->fluxOpt = pa.fluxOpt;
        a->fluxOptErr = pa.fluxOptErr;
    }
    expect.magInst = prov.magInst;
    expect.magInstErr = prov.magInstErr;
    // Every other column (detection, fixed apertures, sky, Kron, flags) is the fresh run's.
    EXPECT_EQ(firstPhotometryDifference(prov, expect), "");
    EXPECT_EQ(std::memcmp(prov.detection.segmentation.data(), expect.detection.segmentation.data(),
                          expect.detection.segmentation.pixelCount() * sizeof(std::int32_t)),
              0);
    // ...and a provisional result built on the fresh detection is the same again.
    EXPECT_EQ(firstPhotometryDifference(
                  provisionalResult(frame, after, fresh, detectOnly(frame, after, fresh), previous), prov),
              "");
}

TEST(ProvisionalResult, KeepsTheEarlierAstrometryAndMatchesTheNewSources) {
    SimParams sp;
    sp.width = 420;
    sp.height = 380;
    sp.stars = 450;
    sp.seed = 29;
    const SimResult sim = simulateField(sp);
    const Frame frame = frameFromSimulation(sim, true);
    const ReferenceCatalog ref = test::referenceOf(sim);
    PipelineConfig before;
    RunContext ctx = cpuContext();
    const PipelineResult previous = runPipeline(frame, before, ctx, &ref);
    ASSERT_TRUE(previous.astrometry.ok) << previous.astrometry.message;
    ASSERT_TRUE(previous.zeropoint.ok) << previous.calibrationProblem;
    PipelineConfig after = before;
    after.detection.threshold = 3.0;
    ctx.records.clear();
    PipelineResult detected = detectOnly(frame, after, ctx);
    const PipelineResult prov = provisionalResult(frame, after, ctx, detected, previous, &ref);
    const std::size_t n = prov.detection.sources.size();
    ASSERT_LT(n, previous.detection.sources.size());
    for (const auto& r : ctx.records)
        EXPECT_NE(r.stage, "astrometry") << "the solution was fitted again";
    EXPECT_EQ(prov.fittedWcs, previous.fittedWcs);
    EXPECT_TRUE(prov.astrometry.ok);
    EXPECT_EQ(prov.astrometry.rmsArcsec, previous.astrometry.rmsArcsec);
    EXPECT_TRUE(prov.astrometry.sourceIndex.empty()) << "per-match lists would name the earlier sources";
    // The crossmatch and zero point are those of the new sources: as a complete run of `after` on the
    // same solution gives them.
    ASSERT_EQ(prov.crossmatch.refIndex.size(), n);
    RunContext fresh = cpuContext();
    const PipelineResult full = runPipeline(frame, after, fresh, &ref);
    ASSERT_TRUE(full.zeropoint.ok);
    ASSERT_TRUE(prov.zeropoint.ok) << prov.calibrationProblem;
    EXPECT_NEAR(prov.zeropoint.zp, full.zeropoint.zp, 0.01);
    std::size_t matched = 0;
    for (std::int32_t r : prov.crossmatch.refIndex)
        matched += r >= 0;
    EXPECT_GT(matched, n / 2);
    // Without an earlier solution the provisional result fits one, as a complete run.
    PipelineResult noSolution = previous;
    noSolution.fittedWcs.reset();
    noSolution.astrometry = AstrometryResult{};
    ctx.records.clear();
    const PipelineResult fitted =
        provisionalResult(frame, after, ctx, detectOnly(frame, after, ctx), noSolution, &ref);
    EXPECT_TRUE(fitted.astrometry.ok);
    EXPECT_FALSE(fitted.astrometry.sourceIndex.empty());
    EXPECT_NE(fitted.fittedWcs, previous.fittedWcs);
}

TEST(ProvisionalResult, PausedRunContinuesToTheUninterruptedResult) {
    const Frame frame = testFrame();
    PipelineConfig config;
    config.detection.threshold = 2.0;
    RunContext ctx = cpuContext();
    const PipelineResult whole = runPipeline(frame, config, ctx);
    PipelineResult paused = detectOnly(frame, config, ctx);
    EXPECT_EQ(paused.completed, Stage::Psf);
    EXPECT_TRUE(paused.aperture.flux.empty()); // the stages from the PSF on did not run
    runPipeline(frame, config, ctx, paused, Stage::Psf);
    EXPECT_EQ(firstPhotometryDifference(paused, whole), "");
    ASSERT_EQ(paused.psf.fluxPsf.size(), whole.psf.fluxPsf.size());
    EXPECT_EQ(std::memcmp(paused.psf.fluxPsf.data(), whole.psf.fluxPsf.data(), 8 * whole.psf.fluxPsf.size()),
              0);
}

TEST(ProvisionalResult, NeedsTheNewDetection) {
    const Frame frame = testFrame();
    const PipelineConfig config;
    RunContext ctx = cpuContext();
    PipelineResult onlyBackground;
    runPipelineUntil(frame, config, ctx, onlyBackground, Stage::Background, Stage::Detection);
    EXPECT_EQ(onlyBackground.completed, Stage::Detection);
    EXPECT_THROW(provisionalResult(frame, config, ctx, onlyBackground, onlyBackground), InvalidInput);
}

} // namespace
} // namespace gpuphot
