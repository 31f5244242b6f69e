// Frame preparation in the workbench: the parameter schema's "prepare" group covers every key of
// PrepareParams' JSON, and the worker prepares the frame (prepareFrame with config.prepare) before the
// pipeline, re-preparing from the raw frame and re-running from stage 1 when a prepare.* key changes.
// Truth: the simulator's cosmic-ray pixels; the Bayer super-pixel sums computed here from the raw frame.
#include <gtest/gtest.h>

#include "tests/ui/queued_spy.hpp"
#include "tests/ui/ui_test_app.hpp"

#include <QElapsedTimer>
#include <QSignalSpy>
#include <QTest>

#include <cmath>
#include <string>

#include "core/pipeline/pipeline.hpp"
#include "core/sim/sim_frame.hpp"
#include "core/sim/simulator.hpp"
#include "ui/param_schema.hpp"
#include "ui/pipeline_worker.hpp"

using namespace gpuphot;
using namespace gpuphot::ui;
using gpuphot::test::QueuedSpy;

namespace {

bool waitFor(QSignalSpy& spy, int n, int ms) {
    QElapsedTimer t;
    t.start();
    while (spy.count() < n && t.elapsed() < ms) QTest::qWait(5);
    return spy.count() >= n;
}

SimParams params(int cosmicRays) {
    SimParams p;
    p.width = p.height = 192;
    p.stars = 60;
    p.seed = 11;
    p.magBright = 13.0;
    p.magFaint = 20.0;
    p.galaxies = 0;
    p.cosmicRays = cosmicRays;
    return p;
}

void setFrame(PipelineWorker* w, FramePtr f) {
    QueuedSpy loaded(w, &PipelineWorker::frameLoaded);
    QMetaObject::invokeMethod(w, "setFrame", Qt::QueuedConnection, Q_ARG(gpuphot::ui::FramePtr, f));
    ASSERT_TRUE(waitFor(loaded, 1, 10000));
}

SnapshotPtr run(PipelineWorker* w, const PipelineConfig& c, QSignalSpy& ready, QSignalSpy& failed) {
    const int n = ready.count();
    w->requestRun(c);
    const bool ok = waitFor(ready, n + 1, 60000);
    EXPECT_TRUE(ok) << (failed.isEmpty() ? "timeout" : failed.last().at(0).toString().toStdString());
    return ok ? ready.last().at(0).value<SnapshotPtr>() : nullptr;
}

std::size_t countBits(const Image<std::uint8_t>& m, std::uint8_t bit) {
    std::size_t n = 0;
    for (int y = 0; y < m.height(); ++y)
        for (int x = 0; x < m.width(); ++x) n += (m(x, y) & bit) ? 1 : 0;
    return n;
}

} // namespace

TEST(PrepareSchema, GroupFirstAndEveryPrepareKeyListed) {
    ASSERT_FALSE(paramGroups().empty());
    EXPECT_EQ(paramGroups().front().id, "prepare");
    const nlohmann::json j = PrepareParams{};
    std::size_t leaves = 0;
    for (auto it = j.begin(); it != j.end(); ++it) {
        const std::string key = "prepare." + it.key();
        const ParamSpec* s = findParamSpec(key);
        ASSERT_NE(s, nullptr) << key << " has no schema entry";
        EXPECT_EQ(s->group, "prepare") << key;
        EXPECT_EQ(groupOfKey(key), "prepare") << key;
        if (it.value().is_object()) {
            EXPECT_EQ(s->kind, ParamKind::Hidden) << key << ": an object has no editor of its own";
            for (auto jt = it.value().begin(); jt != it.value().end(); ++jt) {
                const std::string sub = key + "." + jt.key();
                EXPECT_NE(findParamSpec(sub), nullptr) << sub << " has no schema entry";
                ++leaves;
            }
        } else {
            ++leaves;
            // The editor kind suits the JSON value.
            if (it.value().is_boolean()) EXPECT_TRUE(s->kind == ParamKind::Bool || s->kind == ParamKind::Hidden) << key;
            if (it.value().is_number_float())
                EXPECT_TRUE(s->kind == ParamKind::Double || s->kind == ParamKind::Hidden) << key;
        }
    }
    EXPECT_GT(leaves, 20u);
    // The asked-for controls are visible; bayer offers the documented outputs, each a valid from_json value.
    for (const char* key : {"prepare.overscan", "prepare.trim", "prepare.bleedTrails", "prepare.bleedFraction",
                            "prepare.bleedGrow", "prepare.minFlat", "prepare.saltPepper", "prepare.cosmics",
                            "prepare.cosmic.sigclip", "prepare.cosmic.sigfrac", "prepare.cosmic.objlim",
                            "prepare.cosmic.niter", "prepare.bayer"}) {
        const ParamSpec* s = findParamSpec(key);
        ASSERT_NE(s, nullptr) << key;
        EXPECT_NE(s->kind, ParamKind::Hidden) << key;
        EXPECT_FALSE(s->tooltip.empty()) << key;
        if (s->kind == ParamKind::Double || s->kind == ParamKind::Int) {
            // The default lies inside the editor's range.
            const nlohmann::json cfg = PipelineConfig{};
            const std::string rest = std::string(key).substr(8);
            const auto dot = rest.find('.');
            const double def = dot == std::string::npos ? cfg["prepare"][rest].get<double>()
                                                        : cfg["prepare"][rest.substr(0, dot)][rest.substr(dot + 1)].get<double>();
            EXPECT_GE(def, s->min) << key;
            EXPECT_LE(def, s->max) << key;
        }
    }
    const ParamSpec* bayer = findParamSpec("prepare.bayer");
    ASSERT_EQ(bayer->kind, ParamKind::Choice);
    ASSERT_EQ(bayer->choices.size(), 5u);
    for (const auto& [text, value] : bayer->choices) {
        nlohmann::json pj = PrepareParams{};
        pj["bayer"] = value;
        EXPECT_NO_THROW((void)pj.get<PrepareParams>()) << text;
    }
}

TEST(PrepareWorker, CosmicsToggleMasksTheSimulatedHitsAndRestartsAtStageOne) {
    gpuphot::test::uiTestApp();
    const SimResult sim = simulateField(params(25));
    auto raw = std::make_shared<const Frame>(frameFromSimulation(sim)); // defects not masked
    std::size_t truthCr = 0;
    for (int y = 0; y < sim.defects.height(); ++y)
        for (int x = 0; x < sim.defects.width(); ++x) truthCr += (sim.defects(x, y) & MaskCosmicRay) ? 1 : 0;
    ASSERT_GT(truthCr, 20u);

    PipelineWorkerThread host;
    PipelineWorker* w = host.worker();
    setFrame(w, raw);
    QueuedSpy ready(w, &PipelineWorker::resultReady);
    QueuedSpy failed(w, &PipelineWorker::runFailed);

    PipelineConfig off;
    off.fitAstrometry = false;
    const SnapshotPtr s0 = run(w, off, ready, failed);
    ASSERT_TRUE(s0);
    EXPECT_EQ(countBits(s0->frame->mask, MaskCosmicRay), 0u);

    PipelineConfig on = off;
    on.prepare.cosmics = true;
    const SnapshotPtr s1 = run(w, on, ready, failed);
    ASSERT_TRUE(s1);
    EXPECT_EQ(s1->firstStage, Stage::Background) << "a prepare.* change re-runs from stage 1";
    EXPECT_NE(s1->frame, s0->frame) << "a new prepared frame";
    const Image<std::uint8_t>& m = s1->frame->mask;
    ASSERT_EQ(m.width(), raw->width());
    std::size_t hit = 0, found = countBits(m, MaskCosmicRay);
    for (int y = 0; y < m.height(); ++y)
        for (int x = 0; x < m.width(); ++x)
            if ((sim.defects(x, y) & MaskCosmicRay) && (m(x, y) & MaskCosmicRay)) ++hit;
    RecordProperty("truthCr", std::to_string(truthCr));
    RecordProperty("hit", std::to_string(hit));
    RecordProperty("found", std::to_string(found));
    EXPECT_GE(hit * 2, truthCr) << "at least half of the simulated cosmic-ray pixels are masked";
    EXPECT_LE(found, 4 * truthCr) << "few masked pixels beyond the hits and their edges";
    // Masked pixels keep their values: the pixels are those of the raw frame.
    EXPECT_EQ(s1->frame->pixels(10, 10), raw->pixels(10, 10));

    // A cosmic-ray parameter alone also re-prepares; a stricter limit masks no more pixels.
    PipelineConfig strict = on;
    strict.prepare.cosmic.sigclip = 50.0;
    const SnapshotPtr s2 = run(w, strict, ready, failed);
    ASSERT_TRUE(s2);
    EXPECT_EQ(s2->firstStage, Stage::Background);
    EXPECT_LT(countBits(s2->frame->mask, MaskCosmicRay), found);

    // Back off: no cosmic-ray mask; a detection change after it reuses the prepared frame.
    const SnapshotPtr s3 = run(w, off, ready, failed);
    ASSERT_TRUE(s3);
    EXPECT_EQ(countBits(s3->frame->mask, MaskCosmicRay), 0u);
    PipelineConfig det = off;
    det.detection.threshold = off.detection.threshold + 1.0;
    const SnapshotPtr s4 = run(w, det, ready, failed);
    ASSERT_TRUE(s4);
    EXPECT_EQ(s4->frame, s3->frame);
    EXPECT_EQ(s4->firstStage, Stage::Detection);
}

TEST(PrepareWorker, BayerLuminanceHalvesTheFrameIntoSuperPixelSums) {
    gpuphot::test::uiTestApp();
    auto raw = std::make_shared<const Frame>(frameFromSimulation(simulateField(params(0))));
    PipelineWorkerThread host;
    PipelineWorker* w = host.worker();
    setFrame(w, raw);
    QueuedSpy ready(w, &PipelineWorker::resultReady);
    QueuedSpy failed(w, &PipelineWorker::runFailed);

    PipelineConfig none;
    none.fitAstrometry = false;
    const SnapshotPtr s0 = run(w, none, ready, failed);
    ASSERT_TRUE(s0);
    EXPECT_EQ(s0->frame->width(), raw->width());

    PipelineConfig lum = none;
    lum.prepare.bayer = "lum";
    lum.prepare.bayerParams.pattern = "RGGB"; // the simulated header names no CFA pattern
    const SnapshotPtr s1 = run(w, lum, ready, failed);
    ASSERT_TRUE(s1);
    EXPECT_EQ(s1->firstStage, Stage::Background);
    ASSERT_EQ(s1->frame->width(), raw->width() / 2);
    ASSERT_EQ(s1->frame->height(), raw->height() / 2);
    ASSERT_EQ(s1->frame->mask.width(), raw->width() / 2);
    for (int y = 0; y < s1->frame->height(); y += 17)
        for (int x = 0; x < s1->frame->width(); x += 13) {
            const double sum = double(raw->pixels(2 * x, 2 * y)) + raw->pixels(2 * x + 1, 2 * y) +
                               raw->pixels(2 * x, 2 * y + 1) + raw->pixels(2 * x + 1, 2 * y + 1);
            EXPECT_NEAR(s1->frame->pixels(x, y), sum, 1e-5 * std::abs(sum) + 1e-3) << x << "," << y;
        }
    // Sources were found on the binned frame, inside it.
    ASSERT_FALSE(s1->result.detection.sources.x.empty());
    for (double x : s1->result.detection.sources.x) EXPECT_LT(x, s1->frame->width());

    const SnapshotPtr s2 = run(w, none, ready, failed);
    ASSERT_TRUE(s2);
    EXPECT_EQ(s2->frame->width(), raw->width()) << "switching back re-prepares from the raw frame";
}
