// The calibration's first half (astrometry, then crossmatch and the isolation test once the PSF stage has
// given the FWHM) started on a host thread beside the PSF and aperture stages, as the CUDA backend runs
// it, here on the CPU backend (TestHooks::calibrationBeside): the same calibration as in series, each stage
// recorded once and in order, and no wait left behind when the PSF stage fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/catalog/reference_catalog.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/reduce.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/sim_frame.hpp"
#include "core/sim/simulator.hpp"
#include "tests/core/test_fields.hpp"
#include "tests/same_table.hpp"

using namespace gpuphot;

namespace {

struct Field {
    Frame frame;
    ReferenceCatalog ref;
};

Field field() {
    SimParams sp;
    sp.width = 1536;
    sp.height = 1536;
    sp.stars = 3000;
    sp.seed = 46;
    sp.wcsOffset = 0.1; // arcmin: the header WCS needs refining
    const SimResult sim = simulateField(sp);
    return {frameFromSimulation(sim), test::referenceOf(sim)};
}

std::vector<std::string> stagesOf(const RunContext& ctx) {
    std::vector<std::string> v;
    for (const StageRecord& r : ctx.records)
        v.push_back(r.stage);
    return v;
}

} // namespace

TEST(CalibrationBeside, GivesTheSeriesCalibration) {
    const Field f = field();
    PipelineConfig config;
    RunContext series, beside;
    series.threads = beside.threads = 2;
    beside.testHooks.calibrationBeside = true;
    const PipelineResult a = runPipeline(f.frame, config, series, &f.ref);
    const PipelineResult b = runPipeline(f.frame, config, beside, &f.ref);
    ASSERT_TRUE(a.astrometry.ok) << a.astrometry.message;
    ASSERT_TRUE(a.zeropoint.ok) << a.zeropoint.message;
    ASSERT_TRUE(b.zeropoint.ok) << b.zeropoint.message;
    EXPECT_EQ(a.astrometry.wcs.crval[0], b.astrometry.wcs.crval[0]);
    EXPECT_EQ(a.astrometry.wcs.crval[1], b.astrometry.wcs.crval[1]);
    EXPECT_EQ(a.astrometry.refIndex, b.astrometry.refIndex);
    EXPECT_EQ(a.crossmatch.refIndex, b.crossmatch.refIndex);
    EXPECT_EQ(a.crossmatch.refSelected, b.crossmatch.refSelected);
    ASSERT_EQ(a.crossmatch.separationArcsec.size(), b.crossmatch.separationArcsec.size());
    EXPECT_EQ(std::memcmp(a.crossmatch.separationArcsec.data(), b.crossmatch.separationArcsec.data(),
                          a.crossmatch.separationArcsec.size() * sizeof(double)),
              0); // bit for bit, NaN for the unmatched included
    EXPECT_EQ(a.zeropoint.sourceIndex, b.zeropoint.sourceIndex);
    EXPECT_EQ(a.zeropoint.zp, b.zeropoint.zp);
    EXPECT_EQ(a.zeropoint.zpErr, b.zeropoint.zpErr);
    EXPECT_EQ(a.zeropoint.isolationArcsec, b.zeropoint.isolationArcsec);
    EXPECT_GT(a.zeropoint.isolationArcsec, 0.0);
    const std::vector<std::string> sa = stagesOf(series), sb = stagesOf(beside);
    for (const char* stage : {"astrometry", "crossmatch", "zeropoint"}) {
        EXPECT_EQ(std::count(sa.begin(), sa.end(), stage), 1) << stage;
        EXPECT_EQ(std::count(sb.begin(), sb.end(), stage), 1) << stage;
    }
    const auto at = [&](const char* stage) { return std::find(sb.begin(), sb.end(), stage) - sb.begin(); };
    EXPECT_LT(at("aperture"), at("astrometry"));
    EXPECT_LT(at("astrometry"), at("crossmatch"));
    EXPECT_LT(at("crossmatch"), at("zeropoint"));
}

// The PSF stage throws while the thread beside it waits for the FWHM: the run ends with that error (it
// would hang if the thread were left waiting), and the same context reduces the frame afterwards.
TEST(CalibrationBeside, APsfStageThatFailsReleasesTheThreadBesideIt) {
    const Field f = field();
    PipelineConfig config;
    RunContext ctx;
    ctx.threads = 2;
    ctx.testHooks.calibrationBeside = true;
    ctx.progress = [](const std::string& stage, double) {
        if (stage == "psf") throw std::runtime_error("planted PSF failure");
    };
    EXPECT_THROW(runPipeline(f.frame, config, ctx, &f.ref), std::runtime_error);
    ctx.progress = nullptr;
    ctx.records.clear();
    const PipelineResult r = runPipeline(f.frame, config, ctx, &f.ref);
    EXPECT_TRUE(r.zeropoint.ok) << r.zeropoint.message;
}

namespace {

LoadedFrame loadedOf(const Frame& frame, const std::string& path) {
    LoadedFrame l;
    l.path = path;
    l.frame = frame;
    l.read.stage = "read";
    return l;
}

std::vector<std::string> reportStages(const ComputedFrame& c) {
    std::vector<std::string> v;
    for (const auto& s : c.summary.report.at("stages"))
        v.push_back(s.at("stage").get<std::string>());
    return v;
}

} // namespace

// A frame whose stages are done leaves the rest of its reduction (the end of the calibration, the catalog,
// the report) to a host context: here finished on another thread after the same context has run the next
// frame's stages. Both catalogs are the bytes of the frames reduced one after the other, with the same
// stage records in the same order.
TEST(CalibrationBeside, AFrameFinishedOnAnotherThreadGivesTheSequentialCatalog) {
    const Field f = field();
    SimParams sp;
    sp.width = sp.height = 1024;
    sp.stars = 1500;
    sp.seed = 47;
    sp.wcsOffset = 0.1;
    const Frame second = frameFromSimulation(simulateField(sp));
    ReduceOptions options;
    options.write = false;
    options.reference = &f.ref;
    RunContext ctx;
    ctx.threads = 2;
    ctx.testHooks.calibrationBeside = true;
    const ComputedFrame a = computeFramePhase(loadedOf(f.frame, "a.fits"), options, ctx);
    const ComputedFrame b = computeFramePhase(loadedOf(second, "b.fits"), options, ctx);
    ASSERT_TRUE(a.result.zeropoint.ok) << a.result.zeropoint.message;

    std::unique_ptr<FrameInFlight> startedA = startFramePhase(loadedOf(f.frame, "a.fits"), options, ctx);
    ASSERT_FALSE(startedA->finished); // the calibration runs beside: the rest is left to the host
    std::unique_ptr<FrameInFlight> startedB = startFramePhase(loadedOf(second, "b.fits"), options, ctx);
    std::optional<ComputedFrame> a2;
    std::thread finisher([&] { a2 = finishFramePhase(std::move(startedA), options); });
    const ComputedFrame b2 = finishFramePhase(std::move(startedB), options);
    finisher.join();
    ASSERT_TRUE(a2.has_value());
    test::expectSameTable(a.catalog, a2->catalog);
    test::expectSameTable(b.catalog, b2.catalog);
    EXPECT_EQ(a.result.zeropoint.zp, a2->result.zeropoint.zp);
    EXPECT_EQ(reportStages(a), reportStages(*a2));
    EXPECT_EQ(reportStages(b), reportStages(b2));
    EXPECT_EQ(a2->summary.frame, "a.fits");
}

// Without the calibration beside (the CPU backend's default) or with targets to measure on the run's
// context, the start does everything and the finish only hands the frame on.
TEST(CalibrationBeside, TheStartFinishesWhatNeedsTheRunsContext) {
    const Field f = field();
    ReduceOptions options;
    options.write = false;
    options.reference = &f.ref;
    RunContext ctx;
    ctx.threads = 2;
    EXPECT_TRUE(startFramePhase(loadedOf(f.frame, "a.fits"), options, ctx)->finished);
    ctx.testHooks.calibrationBeside = true;
    TargetList targets;
    targets.path = "targets.csv";
    options.targets = &targets;
    std::unique_ptr<FrameInFlight> started = startFramePhase(loadedOf(f.frame, "a.fits"), options, ctx);
    EXPECT_TRUE(started->finished);
    const ComputedFrame c = finishFramePhase(std::move(started), options);
    EXPECT_TRUE(c.targets.has_value());
}

// Once the stages have run, nothing of the reduction reads the frame's pixels unless an output does (the
// LDAC catalog here): they are freed at the end of the start, the size kept, and the catalog and report are
// those of the run that kept them. On a finishing thread too.
TEST(CalibrationBeside, ThePixelsGoAfterTheStagesUnlessAnOutputReadsThem) {
    const Field f = field();
    ReduceOptions dropped, kept;
    dropped.write = kept.write = false;
    dropped.reference = kept.reference = &f.ref;
    kept.output.formats = {"ldac"};
    RunContext ctx;
    ctx.threads = 2;
    ctx.testHooks.calibrationBeside = true;
    const ComputedFrame a = computeFramePhase(loadedOf(f.frame, "a.fits"), kept, ctx);
    ASSERT_TRUE(a.frame.hasPixels());
    EXPECT_EQ(std::memcmp(a.frame.pixels.data(), f.frame.pixels.data(), f.frame.pixels.pixelCount() * 4), 0);
    std::unique_ptr<FrameInFlight> started = startFramePhase(loadedOf(f.frame, "a.fits"), dropped, ctx);
    ASSERT_FALSE(started->finished);
    EXPECT_FALSE(started->out.frame.hasPixels());
    std::optional<ComputedFrame> b;
    std::thread finisher([&] { b = finishFramePhase(std::move(started), dropped); });
    finisher.join();
    ASSERT_TRUE(b.has_value());
    EXPECT_FALSE(b->frame.hasPixels());
    EXPECT_EQ(b->frame.mask.data(), nullptr);
    EXPECT_EQ(b->frame.width(), f.frame.width());
    EXPECT_EQ(b->frame.height(), f.frame.height());
    ASSERT_TRUE(b->result.zeropoint.ok) << b->result.zeropoint.message;
    test::expectSameTable(a.catalog, b->catalog);
    EXPECT_EQ(a.result.zeropoint.zp, b->result.zeropoint.zp);
    EXPECT_EQ(reportStages(a), reportStages(*b));
    EXPECT_EQ(a.summary.report.at("frame"), b->summary.report.at("frame"));
}
