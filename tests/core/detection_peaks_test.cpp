// The deblending's single-peak shortcut (detail::peakCount < 2: the region is returned whole without the
// multi-threshold search) never changes deblendObject's result; the CUDA backend relies on the same test
// (kernels/detection/detection_objects.cu) to deblend only the regions with two or more peaks. Checked region by
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
#include "core/stages/background/background.hpp"
#include "core/stages/detection/detection.hpp"
#include "core/stages/detection/detection_internal.hpp"
#include "core/stages/detection/detection_sums.hpp"
#include "tests/core/test_fields.hpp"

namespace gpuphot {
namespace {

bool sameRuns(const std::vector<detail::Run>& a, const std::vector<detail::Run>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
        if (a[i].y != b[i].y || a[i].x0 != b[i].x0 || a[i].x1 != b[i].x1) return false;
    return true;
}

// The same deblending of root k: split, overflow and every child's runs.
void expectSameDeblending(const detail::DeblendOutput& a, const detail::DeblendOutput& b, std::size_t k) {
    EXPECT_EQ(a.split, b.split) << "root " << k;
    EXPECT_EQ(a.overflow, b.overflow) << "root " << k;
    EXPECT_EQ(a.children.size(), b.children.size()) << "root " << k;
    if (a.children.size() != b.children.size()) return;
    for (std::size_t c = 0; c < a.children.size(); ++c)
        EXPECT_TRUE(sameRuns(a.children[c], b.children[c])) << "root " << k << " child " << c;
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
        expectSameDeblending(with, without, k);
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

// deblendObject freezes a branch that holds at most one local maximum of its region (it never splits) instead
// of examining it at every later level: the same children, flags and overflow as examining every branch, root
// by root, on crowded fields with several settings (64 levels, no contrast, no filter, few children allowed)
// and with invalid pixels. Returns the roots that were split.
std::size_t checkFreeze(const SimResult& sim, const DetectionParams& p, const std::string& what) {
    SCOPED_TRACE(what);
    RunContext ctx;
    ctx.threads = 2;
    const auto prepared = prepareField(sim, p, ctx);
    const detail::PreparedDetection& prep = prepared->prep;
    const detail::RootRuns rr = detail::labelRoots(prep.runs, p.minArea);
    std::size_t split = 0;
    for (std::size_t k = 0; k < rr.size(); ++k) {
        const std::vector<detail::Run> root(rr.runs.begin() + rr.start[k], rr.runs.begin() + rr.start[k + 1]);
        detail::DeblendOutput frozen, examined;
        detail::deblendObject(root, prep.im, p, frozen, false, true);
        detail::deblendObject(root, prep.im, p, examined, false, false);
        split += examined.split;
        expectSameDeblending(frozen, examined, k);
    }
    return split;
}

TEST(DetectionPeaks, FrozenSinglePeakBranchesNeverChangeTheDeblending) {
    std::size_t split = 0;
    for (std::uint64_t seed : {31u, 32u}) {
        const SimResult sim = test::clusteredField(300, 260, 1500, seed);
        DetectionParams p;
        split += checkFreeze(sim, p, "default");
        p.deblendLevels = 64;
        p.deblendContrast = 0.0005;
        split += checkFreeze(sim, p, "64 levels, contrast 0.0005");
        p = DetectionParams{};
        p.filter = false;
        p.minArea = 2;
        p.deblendContrast = 0.0;
        split += checkFreeze(sim, p, "no filter, minArea 2, contrast 0");
        p = DetectionParams{};
        p.deblendMaxChildren = 3;
        p.deblendContrast = 0.0;
        split += checkFreeze(sim, p, "at most 3 children");
    }
    SimResult sim = test::clusteredField(240, 200, 900, 33);
    for (int y = 90; y < 110; ++y)
        for (int x = 100; x < 104; ++x)
            sim.image(x, y) = std::numeric_limits<float>::quiet_NaN();
    for (int y = 0; y < sim.image.height(); ++y)
        sim.defects(60, y) |= MaskOutside;
    split += checkFreeze(sim, DetectionParams{}, "invalid pixels");
    EXPECT_GT(split, 200u);
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
    auto expectSameObjects = [&](const detail::DetectedObjects& got) {
        EXPECT_EQ(got.nCleaned, ref.nCleaned);
        EXPECT_EQ(got.objects.size(), ref.objects.size());
        EXPECT_EQ(got.iso.size(), ref.iso.size());
        if (got.objects.size() != ref.objects.size() || got.iso.size() != ref.iso.size()) return;
        for (std::size_t i = 0; i < ref.objects.size(); ++i) {
            EXPECT_EQ(got.objects[i].flags, ref.objects[i].flags) << "object " << i;
            EXPECT_TRUE(sameRuns(got.objects[i].runs, ref.objects[i].runs)) << "object " << i;
            EXPECT_EQ(std::memcmp(&got.iso[i], &ref.iso[i], sizeof(detail::IsoMeasure)), 0) << "object " << i;
        }
    };
    for (int threads : {1, 3, 8}) {
        SCOPED_TRACE("threads " + std::to_string(threads));
        detail::DetectedObjects got;
        detail::finishObjectsFromSums(objects, isoOf.data(), clean ? csOf.data() : nullptr, sim.image.width(),
                                      sim.image.height(), p, threads, got, threads == 3 ? nullptr : scratch);
        expectSameObjects(got);
    }
    // The overload on objects given by their runs: the odd ones copied from a pointer, the even ones taken
    // over; the result's storage started by the caller (4096 and more elements made: the helper thread runs),
    // with room to spare, and with too little room (made in take()).
    for (const std::size_t room : {std::size_t{8192}, std::size_t{0}}) {
        SCOPED_TRACE("storage room " + std::to_string(room));
        std::vector<detail::Object> copies = objects;
        std::vector<detail::ObjectRuns> given(copies.size());
        for (std::size_t i = 0; i < copies.size(); ++i)
            given[i] = detail::ObjectRuns{copies[i].runs.data(), copies[i].runs.size(),
                                          i % 2 == 0 ? &copies[i].runs : nullptr, copies[i].flags};
        detail::ObjectStorage storage;
        if (room > 0) storage.start(4096, room, 4);
        detail::DetectedObjects got;
        detail::finishObjectsFromSums(given.size(), given.data(), isoOf.data(), clean ? csOf.data() : nullptr,
                                      sim.image.width(), sim.image.height(), p, 4, got, scratch,
                                      room > 0 ? &storage : nullptr);
        expectSameObjects(got);
    }
    return ref.nCleaned;
}

// detail::ObjectPlan (the CUDA per-object half's numbering of the objects after deblending, and their runs
// and sums handed to finishObjectsFromSums) against core's detectObjects: the roots deblended only where they
// have two or more peaks (as the device's peak test decides), the largest first, their sums made here from
// the plan's children's runs; one plan kept through fields of different sizes.
void checkPlan(const SimResult& sim, const DetectionParams& p, const std::string& what,
               detail::ObjectPlan& plan, int threads) {
    SCOPED_TRACE(what);
    RunContext ctx;
    ctx.threads = 2;
    const auto prepared = prepareField(sim, p, ctx);
    const detail::PreparedDetection& prep = prepared->prep;
    const detail::DetectedObjects ref = detail::detectObjects(prep.runs, prep.im, p, ctx);

    const detail::RootRuns rr = detail::labelRoots(prep.runs, p.minArea);
    const bool cleanAny = p.clean && p.cleanParam > 0.0;
    std::vector<detail::IsoSums> rootIso(rr.size());
    std::vector<detail::CleanSums> rootClean(rr.size());
    std::vector<std::int32_t> multi;
    for (std::size_t k = 0; k < rr.size(); ++k) {
        const std::vector<detail::Run> root(rr.runs.begin() + rr.start[k], rr.runs.begin() + rr.start[k + 1]);
        rootIso[k] = detail::accumulateIsophotal(root, prep.im, p);
        if (cleanAny) rootClean[k] = detail::cleanSumsOf(root, prep.im, p);
        if (p.deblendLevels >= 2 && detail::runsArea(root) >= 2 * static_cast<std::int64_t>(p.minArea) &&
            detail::peakCount(root, prep.im) >= 2)
            multi.push_back(static_cast<std::int32_t>(k));
    }
    std::vector<detail::DeblendOutput> deblended(multi.size());
    for (std::size_t m = multi.size(); m-- > 0;) {
        const std::int32_t k = multi[m];
        const std::vector<detail::Run> root(rr.runs.begin() + rr.start[k], rr.runs.begin() + rr.start[k + 1]);
        detail::deblendObject(root, prep.im, p, deblended[m], false);
    }
    plan.plan(rr.size(), multi, deblended);
    std::vector<detail::IsoSums> childIso(plan.nChildren);
    std::vector<detail::CleanSums> childClean(plan.nChildren);
    plan.fill(rr.runs.data(), rr.start.data(), deblended, rootIso.data(),
              cleanAny ? rootClean.data() : nullptr, childIso.data(), cleanAny ? childClean.data() : nullptr,
              threads);
    EXPECT_EQ(plan.nObjects, ref.nDeblended);
    for (std::size_t q = 0; q < plan.nChildren; ++q) {
        const std::vector<detail::Run> child(plan.childRuns.begin() + plan.childStart[q],
                                             plan.childRuns.begin() + plan.childStart[q + 1]);
        childIso[q] = detail::accumulateIsophotal(child, prep.im, p);
        if (cleanAny) childClean[q] = detail::cleanSumsOf(child, prep.im, p);
    }
    const bool clean = cleanAny && plan.nObjects >= 2;
    detail::DetectedObjects got;
    detail::finishObjectsFromSums(plan.nObjects, plan.objects.data(), plan.isoOf.data(),
                                  clean ? plan.cleanOf.data() : nullptr, sim.image.width(),
                                  sim.image.height(), p, threads, got);
    EXPECT_EQ(got.nCleaned, ref.nCleaned);
    ASSERT_EQ(got.objects.size(), ref.objects.size());
    ASSERT_EQ(got.iso.size(), ref.iso.size());
    for (std::size_t i = 0; i < ref.objects.size(); ++i) {
        EXPECT_EQ(got.objects[i].flags, ref.objects[i].flags) << "object " << i;
        EXPECT_TRUE(sameRuns(got.objects[i].runs, ref.objects[i].runs)) << "object " << i;
        EXPECT_EQ(std::memcmp(&got.iso[i], &ref.iso[i], sizeof(detail::IsoMeasure)), 0) << "object " << i;
    }
}

TEST(DetectionPeaks, ObjectPlanMatchesDetectObjects) {
    detail::ObjectPlan plan;
    for (const auto& [w, h, stars, seed] :
         {std::tuple{300, 260, 1500, 41u}, std::tuple{180, 150, 500, 42u}, std::tuple{320, 300, 2200, 43u}}) {
        const SimResult sim = test::clusteredField(w, h, stars, seed);
        DetectionParams p;
        checkPlan(sim, p, "default", plan, 3);
        p.deblendContrast = 0.0005;
        p.deblendMaxChildren = 3; // overflowing blends
        checkPlan(sim, p, "low contrast, at most 3 children", plan, 1);
        p = DetectionParams{};
        p.clean = false;
        checkPlan(sim, p, "no CLEAN", plan, 2);
        p = DetectionParams{};
        p.deblendLevels = 1;
        checkPlan(sim, p, "no deblending", plan, 2);
    }
}

// detail::ObjectStorage: n value-initialised objects and measurements whether the helper thread made more,
// fewer within its room, or too little room, or was not started.
TEST(DetectionPeaks, ObjectStorageTakesAnyCount) {
    struct Case {
        std::size_t count, room, take;
        int threads;
    };
    for (const Case c : {Case{5000, 5000, 4100, 4}, Case{5000, 9000, 8000, 4}, Case{5000, 6000, 7000, 4},
                         Case{5000, 6000, 300, 1}, Case{100, 100, 200, 4}}) {
        SCOPED_TRACE(std::to_string(c.count) + " made, room " + std::to_string(c.room) + ", " +
                     std::to_string(c.take) + " taken");
        detail::ObjectStorage storage;
        storage.start(c.count, c.room, c.threads);
        std::vector<detail::Object> objects(3);
        objects[0].runs.push_back({1, 2, 3});
        std::vector<detail::IsoMeasure> iso(2);
        storage.take(c.take, 3, objects, iso);
        EXPECT_FALSE(storage.busy());
        ASSERT_EQ(objects.size(), c.take);
        ASSERT_EQ(iso.size(), c.take);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < c.take; ++i) {
            const detail::IsoMeasure& m = iso[i];
            bad += !objects[i].runs.empty() || objects[i].flags != 0 || m.flux != 0.0 || m.area != 0 ||
                   m.theta != 0.0 || m.thrAtPeak != 0.0 || m.yMax != 0 || m.flags != 0;
        }
        EXPECT_EQ(bad, 0u);
    }
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
