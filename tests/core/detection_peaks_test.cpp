// The deblending's single-peak shortcut (detail::peakCount < 2: the region is returned whole without the
// multi-threshold search) never changes deblendObject's result; the CUDA backend relies on the same test
// (kernels/detection_objects.cu) to deblend only the regions with two or more peaks. Checked region by
// region on crowded simulated fields (Plummer clusters), with and without the matched filter, with
// invalid (NaN, masked) pixels next to stars and a low deblending contrast.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/model/flags.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/simulator.hpp"
#include "core/stages/background.hpp"
#include "core/stages/detection.hpp"
#include "core/stages/detection_internal.hpp"
#include "core/stages/detection_sums.hpp"
#include "tests/core/test_fields.hpp"

namespace gpuphot {
namespace {

bool sameRuns(const std::vector<detail::Run>& a, const std::vector<detail::Run>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
        if (a[i].y != b[i].y || a[i].x0 != b[i].x0 || a[i].x1 != b[i].x1) return false;
    return true;
}

// The field's background and prepared detection (runs, images), kept together: prep's views point into bkg.
struct PreparedField {
    BackgroundResult bkg;
    detail::PreparedDetection prep;
};
std::unique_ptr<PreparedField> prepareField(const SimResult& sim, const DetectionParams& p, RunContext& ctx) {
    auto f = std::make_unique<PreparedField>();
    f->bkg = estimateBackground(sim.image.view(), sim.defects.view(), BackgroundParams{}, ctx);
    detail::prepareDetection(sim.image.view(), sim.defects.view(), f->bkg, p, 2, f->prep);
    return f;
}

// Every root of the field: deblendObject with and without the shortcut agree. Returns how many roots the
// shortcut decided (fewer than two peaks, large enough to be examined).
std::size_t checkField(const SimResult& sim, const DetectionParams& p, const std::string& what) {
    SCOPED_TRACE(what);
    RunContext ctx;
    ctx.threads = 2;
    const auto prepared = prepareField(sim, p, ctx);
    const detail::PreparedDetection& prep = prepared->prep;
    const detail::RootRuns rr = detail::labelRoots(prep.runs, p.minArea);
    std::size_t decided = 0;
    for (std::size_t k = 0; k < rr.size(); ++k) {
        const std::vector<detail::Run> root(rr.runs.begin() + rr.start[k], rr.runs.begin() + rr.start[k + 1]);
        if (detail::runsArea(root) < 2 * static_cast<std::int64_t>(p.minArea)) continue;
        if (detail::peakCount(root, prep.im) >= 2) continue;
        ++decided;
        detail::DeblendOutput with, without;
        detail::deblendObject(root, prep.im, p, with, true);
        detail::deblendObject(root, prep.im, p, without, false);
        EXPECT_EQ(with.split, without.split) << "root " << k;
        EXPECT_EQ(with.overflow, without.overflow) << "root " << k;
        EXPECT_EQ(with.children.size(), without.children.size()) << "root " << k;
        if (with.children.size() != without.children.size()) continue;
        for (std::size_t c = 0; c < with.children.size(); ++c)
            EXPECT_TRUE(sameRuns(with.children[c], without.children[c])) << "root " << k << " child " << c;
    }
    return decided;
}

TEST(DetectionPeaks, ShortcutNeverChangesTheDeblending) {
    std::size_t decided = 0;
    for (std::uint64_t seed : {21u, 22u}) {
        const SimResult sim = test::clusteredField(300, 260, 1500, seed);
        DetectionParams p;
        decided += checkField(sim, p, "default");
        p.filter = false;
        decided += checkField(sim, p, "no filter");
        p = DetectionParams{};
        p.deblendContrast = 0.0;
        p.minArea = 2;
        decided += checkField(sim, p, "contrast 0, minArea 2");
    }
    EXPECT_GT(decided, 100u);
}

TEST(DetectionPeaks, ShortcutWithInvalidPixelsNextToStars) {
    SimResult sim = test::clusteredField(240, 200, 900, 23);
    // NaN blocks and masked columns through the clusters: their filtered values are arbitrary.
    for (int y = 90; y < 110; ++y)
        for (int x = 100; x < 104; ++x)
            sim.image(x, y) = std::numeric_limits<float>::quiet_NaN();
    for (int y = 0; y < sim.image.height(); ++y) {
        sim.defects(60, y) |= MaskOutside;
        sim.defects(150, y) |= MaskNonFinite;
    }
    DetectionParams p;
    checkField(sim, p, "invalid pixels");
    p.filter = false;
    checkField(sim, p, "invalid pixels, no filter");
}

// detail::finishObjectsFromSums (the CUDA per-object half's end: CLEAN from the CLEAN sums, the kept objects'
// measurements with the CLEANed ones merged, built compacted in parallel) against core's detectObjects
// (per-object measurement, cleanTargets from the footprints, applyClean): the same objects, runs, flags and
// measurements bit for bit, for several thread counts, without and with CLEAN's working memory kept from call
// to call (one scratch through fields of different sizes). The objects are built as detectObjects builds
// them (labelRoots, deblendObject), their sums by core's accumulateIsophotal and cleanSumsOf.
std::size_t checkFromSums(const SimResult& sim, const DetectionParams& p, const std::string& what,
                          detail::CleanScratch* scratch) {
    SCOPED_TRACE(what);
    RunContext ctx;
    ctx.threads = 2;
    const auto prepared = prepareField(sim, p, ctx);
    const detail::PreparedDetection& prep = prepared->prep;
    const detail::DetectedObjects ref = detail::detectObjects(prep.runs, prep.im, p, ctx);

    const detail::RootRuns rr = detail::labelRoots(prep.runs, p.minArea);
    std::vector<detail::Object> objects;
    for (std::size_t k = 0; k < rr.size(); ++k) {
        const std::vector<detail::Run> root(rr.runs.begin() + rr.start[k], rr.runs.begin() + rr.start[k + 1]);
        detail::DeblendOutput d;
        detail::deblendObject(root, prep.im, p, d);
        const std::uint32_t fl = (d.split ? FlagBlended : 0u) | (d.overflow ? FlagDeblendOverflow : 0u);
        for (auto& c : d.children)
            objects.push_back({std::move(c), fl});
    }
    std::vector<detail::IsoSums> iso(objects.size());
    std::vector<detail::CleanSums> cs(objects.size());
    std::vector<const detail::IsoSums*> isoOf(objects.size());
    std::vector<const detail::CleanSums*> csOf(objects.size());
    // Stored in reverse, so the pointers (not the storage order) must carry the index.
    for (std::size_t i = 0; i < objects.size(); ++i) {
        const std::size_t at = objects.size() - 1 - i;
        iso[at] = detail::accumulateIsophotal(objects[i].runs, prep.im, p);
        cs[at] = detail::cleanSumsOf(objects[i].runs, prep.im, p);
        isoOf[i] = &iso[at];
        csOf[i] = &cs[at];
    }
    const bool clean = p.clean && p.cleanParam > 0.0 && objects.size() >= 2;
    for (int threads : {1, 3, 8}) {
        SCOPED_TRACE("threads " + std::to_string(threads));
        detail::DetectedObjects got;
        detail::finishObjectsFromSums(objects, isoOf.data(), clean ? csOf.data() : nullptr, sim.image.width(),
                                      sim.image.height(), p, threads, got, threads == 3 ? nullptr : scratch);
        EXPECT_EQ(got.nCleaned, ref.nCleaned);
        EXPECT_EQ(got.objects.size(), ref.objects.size());
        EXPECT_EQ(got.iso.size(), ref.iso.size());
        if (got.objects.size() != ref.objects.size() || got.iso.size() != ref.iso.size()) continue;
        for (std::size_t i = 0; i < ref.objects.size(); ++i) {
            EXPECT_EQ(got.objects[i].flags, ref.objects[i].flags) << "object " << i;
            EXPECT_TRUE(sameRuns(got.objects[i].runs, ref.objects[i].runs)) << "object " << i;
            EXPECT_EQ(std::memcmp(&got.iso[i], &ref.iso[i], sizeof(detail::IsoMeasure)), 0) << "object " << i;
        }
    }
    return ref.nCleaned;
}

TEST(DetectionPeaks, FinishFromSumsMatchesDetectObjects) {
    std::size_t cleaned = 0;
    const std::shared_ptr<detail::CleanScratch> scratch = detail::makeCleanScratch();
    for (const auto& [w, h, stars, seed] :
         {std::tuple{180, 150, 500, 31u}, std::tuple{300, 260, 1500, 32u}}) {
        const SimResult sim = test::clusteredField(w, h, stars, seed);
        DetectionParams p;
        cleaned += checkFromSums(sim, p, "default", scratch.get());
        p.filter = false;
        p.cleanParam = 0.5; // wider wings: more CLEANed objects
        cleaned += checkFromSums(sim, p, "no filter, cleanParam 0.5", scratch.get());
        p = DetectionParams{};
        p.clean = false;
        checkFromSums(sim, p, "no CLEAN", scratch.get());
        p = DetectionParams{};
        p.cleanParam = 0.0;
        checkFromSums(sim, p, "cleanParam 0", scratch.get());
    }
    EXPECT_GT(cleaned, 5u) << "the fields must exercise CLEAN's merge";
}

TEST(DetectionPeaks, FinishFromSumsWithOneObject) {
    SimParams sp;
    sp.width = 64;
    sp.height = 64;
    sp.stars = 1;
    sp.seed = 5;
    const SimResult sim = simulateField(sp);
    checkFromSums(sim, DetectionParams{}, "one star", nullptr);
}

} // namespace
} // namespace gpuphot
