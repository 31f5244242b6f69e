// The deblending's single-peak shortcut (detail::peakCount < 2: the region is returned whole without the
// multi-threshold search) never changes deblendObject's result; the CUDA backend relies on the same test
// (kernels/detection_objects.cu) to deblend only the regions with two or more peaks. Checked region by
// region on crowded simulated fields (Plummer clusters), with and without the matched filter, with
// invalid (NaN, masked) pixels next to stars and a low deblending contrast.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/model/flags.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/simulator.hpp"
#include "core/stages/background.hpp"
#include "core/stages/detection.hpp"
#include "core/stages/detection_internal.hpp"
#include "tests/core/test_fields.hpp"

namespace gpuphot {
namespace {

bool sameRuns(const std::vector<detail::Run>& a, const std::vector<detail::Run>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
        if (a[i].y != b[i].y || a[i].x0 != b[i].x0 || a[i].x1 != b[i].x1) return false;
    return true;
}

// Every root of the field: deblendObject with and without the shortcut agree. Returns how many roots the
// shortcut decided (fewer than two peaks, large enough to be examined).
std::size_t checkField(const SimResult& sim, const DetectionParams& p, const std::string& what) {
    SCOPED_TRACE(what);
    RunContext ctx;
    ctx.threads = 2;
    const BackgroundResult bkg =
        estimateBackground(sim.image.view(), sim.defects.view(), BackgroundParams{}, ctx);
    detail::PreparedDetection prep;
    detail::prepareDetection(sim.image.view(), sim.defects.view(), bkg, p, 2, prep);
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

} // namespace
} // namespace gpuphot
