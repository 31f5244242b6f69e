// The CUDA detection front (kernels/detection/detection.cu: subtraction fused with the row filter, column filter fused
// with the threshold into a bit image, per-row run counts, a scan and the run extraction) against core's
// detail::prepareDetection: the same runs (order and content), filtered image and pixel states bit for bit,
// in each plan (whole with the images kept on the device, whole with host images, strips), on odd sizes,
// with and without the filter, with a 2-D kernel and a filter wider than the fused row pass's segment,
// masked / NaN / saturated pixels and NaN background, a field without objects, runs touching both edges and
// chunk / strip boundaries inside objects.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/model/image.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/background/background.hpp"
#include "core/stages/detection/detection.hpp"
#include "core/stages/detection/detection_internal.hpp"
#include "kernels/detection/detection_front.hpp"
#include "kernels/device_context.hpp"
#include "tests/kernels/cuda_test_util.hpp"

namespace gpuphot {
namespace {

using cudatest::cpuContext;
using cudatest::cudaContext;
using cudatest::sameBits;
using cudatest::sameImage;

struct Field {
    Image<float> image;
    Image<std::uint8_t> mask;
    BackgroundResult bkg;
};

// A noisy frame with Gaussian stars (some across the left and right edges and the top and bottom rows),
// full background maps (a gradient; NaN in a few map pixels), NaN pixels and every mask bit.
Field makeField(int w, int h, int stars, std::uint32_t seed, bool defects = true) {
    Field f{Image<float>(w, h), Image<std::uint8_t>(w, h, 0), {}};
    f.bkg.level = Image<float>(w, h);
    f.bkg.rms = Image<float>(w, h);
    std::mt19937 rng(seed);
    std::normal_distribution<float> noise(0.0f, 5.0f);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            f.bkg.level(x, y) = 200.0f + 0.01f * x + 0.02f * y;
            f.bkg.rms(x, y) = 5.0f + 0.001f * (x + y);
            f.image(x, y) = f.bkg.level(x, y) + noise(rng);
        }
    auto star = [&](float cx, float cy, float amp) {
        for (int y = std::max(0, int(cy) - 7); y < std::min(h, int(cy) + 8); ++y)
            for (int x = std::max(0, int(cx) - 7); x < std::min(w, int(cx) + 8); ++x)
                f.image(x, y) += amp * std::exp(-((x - cx) * (x - cx) + (y - cy) * (y - cy)) / 5.0f);
    };
    for (int s = 0; s < stars; ++s)
        star(u(rng) * w, u(rng) * h, 30.0f + 3000.0f * u(rng) * u(rng));
    if (stars > 0) { // runs touching the right and left edges, the first and last rows
        star(w - 1.0f, h * 0.5f, 800.0f);
        star(0.0f, h * 0.3f, 800.0f);
        star(w * 0.5f, 0.0f, 800.0f);
        star(w * 0.4f, h - 1.0f, 800.0f);
    }
    if (defects) {
        for (int i = 0; i < w * h / 400 + 1; ++i)
            f.image(static_cast<int>(u(rng) * w), static_cast<int>(u(rng) * h)) =
                std::numeric_limits<float>::quiet_NaN();
        const std::uint8_t bits[] = {MaskBad, MaskNonFinite, MaskSaturated, MaskCosmicRay, MaskOutside};
        for (int i = 0; i < w * h / 100 + 5; ++i)
            f.mask(static_cast<int>(u(rng) * w), static_cast<int>(u(rng) * h)) = bits[i % 5];
        f.bkg.level(w / 3, h / 2) = std::numeric_limits<float>::quiet_NaN();
        f.bkg.rms(w / 2, h / 3) = std::numeric_limits<float>::quiet_NaN();
    }
    return f;
}

::testing::AssertionResult sameRuns(const std::vector<detail::Run>& a, const std::vector<detail::Run>& b) {
    if (a.size() != b.size())
        return ::testing::AssertionFailure() << "runs: " << a.size() << " vs " << b.size();
    for (std::size_t i = 0; i < a.size(); ++i)
        if (a[i].y != b[i].y || a[i].x0 != b[i].x0 || a[i].x1 != b[i].x1)
            return ::testing::AssertionFailure()
                   << "run " << i << ": (" << a[i].y << ", " << a[i].x0 << ", " << a[i].x1 << ") vs ("
                   << b[i].y << ", " << b[i].x0 << ", " << b[i].x1 << ")";
    return ::testing::AssertionSuccess();
}

// The front in `plan` (rows per chunk or strip; 0: the stage's) against core's, every output.
void expectSameFront(const Field& f, const DetectionParams& p, cuda::FrontPlan plan, int rows,
                     const std::string& what, bool withMask = true) {
    SCOPED_TRACE(what + ", plan " + std::to_string(static_cast<int>(plan)) + ", rows " +
                 std::to_string(rows));
    const MaskView mask = withMask ? f.mask.view() : MaskView{};
    detail::PreparedDetection ref;
    detail::prepareDetection(f.image.view(), mask, f.bkg, p, 2, ref);
    RunContext g = cudaContext();
    const cuda::DetectionFrontResult r = cuda::detectionFront(f.image.view(), mask, f.bkg, p, g, plan, rows);
    EXPECT_TRUE(sameRuns(ref.runs, r.runs));
    EXPECT_TRUE(sameImage(ref.state, r.state, "state"));
    if (p.filter)
        EXPECT_TRUE(sameImage(ref.filtered, r.det, "filtered"));
    else
        EXPECT_TRUE(r.det.empty());
    if (plan == cuda::FrontPlan::WholeDevice)
        EXPECT_TRUE(r.deviceRuns);
    else
        EXPECT_TRUE(sameImage(ref.sub, r.sub, "sub"));
}

std::vector<std::pair<std::string, DetectionParams>> filterCases() {
    std::vector<std::pair<std::string, DetectionParams>> cases = cudatest::detectionFilterCases();
    DetectionParams wide; // r = 10: a halo wider than the chunks and strips below
    wide.filterFwhm = 9.5;
    cases.emplace_back("gaussian fwhm 9.5", wide);
    DetectionParams absolute;
    absolute.thresholdIsAbsolute = true;
    absolute.threshold = 12.0;
    absolute.saturationLevel = 2500.0;
    cases.emplace_back("absolute threshold, saturation level", absolute);
    return cases;
}

TEST(DetectionFrontCuda, MatchesCpuInEveryPlanAndFilterPath) {
    REQUIRE_DEVICE();
    // 157: not a multiple of 32 (a partial last bit word); 203 rows: chunks of 64 end inside objects.
    const Field f = makeField(157, 203, 40, 1);
    for (const auto& [name, p] : filterCases()) {
        expectSameFront(f, p, cuda::FrontPlan::WholeDevice, 0, name);
        expectSameFront(f, p, cuda::FrontPlan::WholeDevice, 7, name);
        expectSameFront(f, p, cuda::FrontPlan::WholeHost, 13, name);
        expectSameFront(f, p, cuda::FrontPlan::Strips, 5, name);
        expectSameFront(f, p, cuda::FrontPlan::Strips, 1, name);
    }
}

TEST(DetectionFrontCuda, OddSizesAndNoMask) {
    REQUIRE_DEVICE();
    const DetectionParams p;
    for (const auto& [w, h] :
         std::vector<std::pair<int, int>>{{1, 1}, {1, 37}, {31, 2}, {32, 33}, {33, 17}, {65, 9}, {300, 71}}) {
        const Field f = makeField(w, h, std::max(1, w * h / 400), static_cast<std::uint32_t>(w * 131 + h));
        const std::string what = std::to_string(w) + "x" + std::to_string(h);
        expectSameFront(f, p, cuda::FrontPlan::WholeDevice, 0, what);
        expectSameFront(f, p, cuda::FrontPlan::WholeDevice, 3, what, false);
        expectSameFront(f, p, cuda::FrontPlan::Strips, 4, what);
        DetectionParams noFilter;
        noFilter.filter = false;
        expectSameFront(f, noFilter, cuda::FrontPlan::WholeDevice, 2, what + " no filter");
    }
}

TEST(DetectionFrontCuda, WideFilterUsesTheUnfusedRowPass) {
    REQUIRE_DEVICE();
    // r = 64 at block 32: 32 + 128 floats fit; r = 6200: the segment exceeds 48 kB, the unfused row pass.
    const Field f = makeField(97, 40, 10, 3);
    DetectionParams p;
    p.filterFwhm = 64.0;
    expectSameFront(f, p, cuda::FrontPlan::WholeDevice, 0, "fwhm 64");
    p.filterFwhm = 6200.0;
    expectSameFront(f, p, cuda::FrontPlan::WholeDevice, 0, "fwhm 6200");
    expectSameFront(f, p, cuda::FrontPlan::Strips, 9, "fwhm 6200");
}

TEST(DetectionFrontCuda, FieldWithoutObjectsGivesNoRuns) {
    REQUIRE_DEVICE();
    Field f = makeField(150, 90, 0, 5, false);
    DetectionParams p;
    p.threshold = 1000.0; // nothing reaches it
    RunContext g = cudaContext();
    const cuda::DetectionFrontResult r =
        cuda::detectionFront(f.image.view(), f.mask.view(), f.bkg, p, g, cuda::FrontPlan::WholeDevice);
    EXPECT_TRUE(r.runs.empty());
    EXPECT_TRUE(r.deviceRuns);
    expectSameFront(f, p, cuda::FrontPlan::WholeDevice, 0, "no objects");
    expectSameFront(f, p, cuda::FrontPlan::Strips, 8, "no objects");
}

TEST(DetectionFrontCuda, FullRowsAndAlternatingPixels) {
    REQUIRE_DEVICE();
    // Without a filter: whole rows above threshold (one run from 0 to w - 1) and every other pixel (a run
    // per pixel: the densest run pattern, starts and ends in every bit word).
    Field f = makeField(131, 20, 0, 6, false);
    for (int x = 0; x < f.image.width(); ++x) {
        f.image(x, 3) = 1e4f;
        f.image(x, 11) = (x % 2) ? 1e4f : 0.0f;
        f.image(x, 12) = (x % 3) ? 1e4f : 0.0f;
    }
    DetectionParams p;
    p.filter = false;
    expectSameFront(f, p, cuda::FrontPlan::WholeDevice, 0, "patterns");
    expectSameFront(f, p, cuda::FrontPlan::WholeHost, 6, "patterns");
    std::vector<detail::Run> runs;
    RunContext g = cudaContext();
    runs = cuda::detectionFront(f.image.view(), f.mask.view(), f.bkg, p, g, cuda::FrontPlan::Strips, 4).runs;
    std::size_t row3 = 0, row11 = 0;
    for (const detail::Run& r : runs) {
        if (r.y == 3) {
            ++row3;
            EXPECT_EQ(r.x0, 0);
            EXPECT_EQ(r.x1, f.image.width() - 1);
        }
        if (r.y == 11) {
            ++row11;
            EXPECT_EQ(r.x0, r.x1);
            EXPECT_EQ(r.x0 % 2, 1);
        }
    }
    EXPECT_EQ(row3, 1u);
    EXPECT_EQ(row11, static_cast<std::size_t>(f.image.width() / 2));
}

TEST(DetectionFrontCuda, EveryTapCountOfTheColumnRegisterWindow) {
    REQUIRE_DEVICE();
    // FWHM 1..6: 3, 5, 7, 9, 11 taps (the column pass's register-window kernels) and 13 (the generic one);
    // 37-row chunks: blocks of 16 rows with every tap inside the image, blocks touching the top and bottom
    // rows and partial blocks at the chunks' ends.
    const Field f = makeField(301, 180, 40, 11);
    for (const double fwhm : {1.0, 2.0, 3.0, 4.0, 5.0, 6.0}) {
        DetectionParams p;
        p.filterFwhm = fwhm;
        const std::string what = "fwhm " + std::to_string(fwhm);
        expectSameFront(f, p, cuda::FrontPlan::WholeDevice, 0, what);
        expectSameFront(f, p, cuda::FrontPlan::WholeDevice, 37, what);
        expectSameFront(f, p, cuda::FrontPlan::WholeHost, 64, what);
    }
}

TEST(DetectionFrontCuda, LaunchConfigurationDoesNotMatter) {
    REQUIRE_DEVICE();
    const Field f = makeField(203, 77, 25, 8);
    const DetectionParams p;
    detail::PreparedDetection ref;
    detail::prepareDetection(f.image.view(), f.mask.view(), f.bkg, p, 2, ref);
    for (const int threads : {32, 48, 96, 128, 1024}) { // 48, 96: rounded up to whole warps
        SCOPED_TRACE("block " + std::to_string(threads));
        RunContext g = cudaContext();
        cuda::DeviceContext::of(g).setBlockSize(threads);
        const cuda::DetectionFrontResult r = cuda::detectionFront(f.image.view(), f.mask.view(), f.bkg, p, g,
                                                                  cuda::FrontPlan::WholeDevice, 11);
        EXPECT_TRUE(sameRuns(ref.runs, r.runs));
        EXPECT_TRUE(sameImage(ref.filtered, r.det, "filtered"));
        EXPECT_TRUE(sameImage(ref.state, r.state, "state"));
    }
}

TEST(DetectionFrontCuda, LeanBackgroundMaps) {
    REQUIRE_DEVICE();
    // Maps not kept at full resolution: the device interpolates them from the mesh grid (whole) or per
    // strip; the CPU evaluates the sampler.
    const Field f = makeField(260, 190, 30, 9);
    RunContext c = cpuContext();
    BackgroundParams bp;
    bp.fullMaps = false;
    Field lean{f.image, f.mask, estimateBackground(f.image.view(), f.mask.view(), bp, c)};
    lean.bkg.sampler = std::make_shared<const BackgroundSampler>(lean.bkg, c); // as the pipeline attaches it
    ASSERT_FALSE(lean.bkg.hasFullMaps());
    const DetectionParams p;
    expectSameFront(lean, p, cuda::FrontPlan::WholeDevice, 0, "lean maps");
    expectSameFront(lean, p, cuda::FrontPlan::Strips, 17, "lean maps");
}

TEST(DetectionFrontCuda, RepeatedOnOneContextWithOtherThresholds) {
    REQUIRE_DEVICE();
    // The host vector is grown from the previous count on the context while the device works: fewer runs,
    // more runs and none after a first call must still come out exactly.
    const Field f = makeField(190, 150, 60, 10);
    RunContext g = cudaContext();
    for (const double threshold : {1.5, 4.0, 0.8, 1e6, 1.2}) {
        SCOPED_TRACE("threshold " + std::to_string(threshold));
        DetectionParams p;
        p.threshold = threshold;
        detail::PreparedDetection ref;
        detail::prepareDetection(f.image.view(), f.mask.view(), f.bkg, p, 2, ref);
        const cuda::DetectionFrontResult r =
            cuda::detectionFront(f.image.view(), f.mask.view(), f.bkg, p, g, cuda::FrontPlan::WholeDevice);
        EXPECT_TRUE(sameRuns(ref.runs, r.runs));
        EXPECT_TRUE(r.deviceRuns);
    }
}

TEST(DetectionFrontCuda, FusedTilesAndTwoKernelFrontBothMatchCpu) {
    REQUIRE_DEVICE();
    // The fused tile kernel (the default for 3-11 taps) against the two-kernel front it replaced
    // (GPUPHOT_DETECTION_FRONT_UNFUSED=1) and its 32-row tiles (GPUPHOT_DETECTION_TILE_ROWS=32, 7 taps): each
    // bitwise core's. Heights that are no multiple of the tile, chunks cutting tiles, blocks narrower than
    // the halo's preload (32 threads) and wider than the tile kernel's 256.
    const Field f = makeField(333, 121, 45, 12);
    for (const char* variant : {"tiles", "unfused", "tiles32"}) {
        const std::string v = variant;
        std::unique_ptr<cudatest::EnvOverride> env;
        if (v == "unfused")
            env = std::make_unique<cudatest::EnvOverride>("GPUPHOT_DETECTION_FRONT_UNFUSED", "1");
        if (v == "tiles32")
            env = std::make_unique<cudatest::EnvOverride>("GPUPHOT_DETECTION_TILE_ROWS", "32");
        for (const double fwhm : {1.0, 3.0, 5.0}) {
            DetectionParams p;
            p.filterFwhm = fwhm;
            const std::string what = v + ", fwhm " + std::to_string(fwhm);
            expectSameFront(f, p, cuda::FrontPlan::WholeDevice, 0, what);
            expectSameFront(f, p, cuda::FrontPlan::WholeDevice, 23, what);
            expectSameFront(f, p, cuda::FrontPlan::Strips, 9, what, false);
        }
        DetectionParams p;
        detail::PreparedDetection ref;
        detail::prepareDetection(f.image.view(), f.mask.view(), f.bkg, p, 2, ref);
        for (const int threads : {32, 512}) {
            SCOPED_TRACE(v + ", block " + std::to_string(threads));
            RunContext g = cudaContext();
            cuda::DeviceContext::of(g).setBlockSize(threads);
            const cuda::DetectionFrontResult r = cuda::detectionFront(f.image.view(), f.mask.view(), f.bkg, p,
                                                                      g, cuda::FrontPlan::WholeHost, 40);
            EXPECT_TRUE(sameRuns(ref.runs, r.runs));
            EXPECT_TRUE(sameImage(ref.filtered, r.det, "filtered"));
            EXPECT_TRUE(sameImage(ref.sub, r.sub, "sub"));
            EXPECT_TRUE(sameImage(ref.state, r.state, "state"));
        }
    }
}

} // namespace
} // namespace gpuphot
