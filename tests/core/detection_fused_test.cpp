// Detection's fused per-pixel pass (background subtraction, matched filter and thresholding done in
// blocks of rows with halos) against an independent reference built from the public pieces: the
// subtracted image by its definition, convolveSeparable over the whole frame, a per-pixel threshold and
// a flood fill of 8-connected regions. Frame sizes cross the row-block boundaries and include frames
// narrower and shorter than the filter; the background maps vary per pixel, with masked and non-finite
// pixels.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/model/image.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/background/background.hpp"
#include "core/stages/detection/convolution.hpp"
#include "core/stages/detection/detection.hpp"

namespace gpuphot {
namespace {

struct Scene {
    Image<float> image;
    Image<std::uint8_t> mask;
    BackgroundResult bkg;
};

Scene makeScene(int w, int h, std::uint32_t seed) {
    Scene s;
    s.image = Image<float>(w, h, 0.0f);
    s.mask = Image<std::uint8_t>(w, h, 0);
    s.bkg.level = Image<float>(w, h, 0.0f);
    s.bkg.rms = Image<float>(w, h, 0.0f);
    s.bkg.width = w;
    s.bkg.height = h;
    std::mt19937 rng(seed);
    std::normal_distribution<float> noise(0.0f, 3.0f);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            s.bkg.level(x, y) = 100.0f + 0.05f * x - 0.03f * y;
            s.bkg.rms(x, y) = 3.0f + 0.002f * (x + y);
            s.image(x, y) = s.bkg.level(x, y) + noise(rng);
        }
    // Stars, some of them across the image edges.
    const int nStars = std::max(3, w * h / 400);
    for (int i = 0; i < nStars; ++i) {
        const double x0 = u(rng) * (w + 4) - 2, y0 = u(rng) * (h + 4) - 2, amp = 20.0 + 200.0 * u(rng);
        for (int y = 0; y < h; ++y)
            for (int x = 0; x < w; ++x) {
                const double r2 = (x - x0) * (x - x0) + (y - y0) * (y - y0);
                if (r2 < 64.0) s.image(x, y) += static_cast<float>(amp * std::exp(-r2 / (2.0 * 1.5 * 1.5)));
            }
    }
    // Masked, non-finite and saturated pixels.
    for (int i = 0; i < w * h / 50 + 1; ++i) {
        const int x = static_cast<int>(u(rng) * w) % w, y = static_cast<int>(u(rng) * h) % h;
        switch (i % 4) {
        case 0: s.mask(x, y) = MaskBad; break;
        case 1: s.image(x, y) = std::numeric_limits<float>::quiet_NaN(); break;
        case 2: s.mask(x, y) = MaskOutside; break;
        default: s.bkg.rms(x, y) = std::numeric_limits<float>::infinity(); break;
        }
    }
    return s;
}

// Above-threshold pixels of the reference (1 = above).
std::vector<std::uint8_t> referenceAbove(const Scene& s, const DetectionParams& p) {
    const int w = s.image.width(), h = s.image.height();
    Image<float> sub(w, h, 0.0f);
    std::vector<std::uint8_t> invalid(static_cast<std::size_t>(w) * h, 0);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            const float v = s.image(x, y), l = s.bkg.level(x, y), r = s.bkg.rms(x, y);
            const std::uint8_t m = s.mask(x, y);
            const bool inv = !std::isfinite(v) || !std::isfinite(l) || !std::isfinite(r) ||
                             (m & (MaskNonFinite | MaskOutside));
            const bool bad = inv || (m & (MaskBad | MaskCosmicRay));
            invalid[static_cast<std::size_t>(y) * w + x] = inv;
            sub(x, y) = bad ? 0.0f : v - l;
        }
    Image<float> det;
    if (p.filter)
        convolveSeparable(sub.view(), gaussianKernel1d(p.filterFwhm), det, 1);
    else
        det = sub;
    std::vector<std::uint8_t> above(static_cast<std::size_t>(w) * h, 0);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            const std::size_t i = static_cast<std::size_t>(y) * w + x;
            above[i] = !invalid[i] && static_cast<double>(det(x, y)) >
                                          p.threshold * static_cast<double>(s.bkg.rms(x, y));
        }
    return above;
}

// Keeps the 8-connected regions of at least minArea pixels; returns how many there are.
std::size_t keepLargeRegions(std::vector<std::uint8_t>& above, int w, int h, int minArea) {
    std::vector<std::uint8_t> seen(above.size(), 0), keep(above.size(), 0);
    std::size_t regions = 0;
    std::vector<std::size_t> stack, members;
    for (std::size_t start = 0; start < above.size(); ++start) {
        if (!above[start] || seen[start]) continue;
        members.clear();
        stack.assign(1, start);
        seen[start] = 1;
        while (!stack.empty()) {
            const std::size_t i = stack.back();
            stack.pop_back();
            members.push_back(i);
            const int x = static_cast<int>(i % w), y = static_cast<int>(i / w);
            for (int dy = -1; dy <= 1; ++dy)
                for (int dx = -1; dx <= 1; ++dx) {
                    const int xx = x + dx, yy = y + dy;
                    if (xx < 0 || yy < 0 || xx >= w || yy >= h) continue;
                    const std::size_t j = static_cast<std::size_t>(yy) * w + xx;
                    if (above[j] && !seen[j]) {
                        seen[j] = 1;
                        stack.push_back(j);
                    }
                }
        }
        if (static_cast<int>(members.size()) >= minArea) {
            ++regions;
            for (const std::size_t i : members)
                keep[i] = 1;
        }
    }
    above.swap(keep);
    return regions;
}

void checkAgainstReference(int w, int h, bool filter, int threads, std::uint32_t seed) {
    SCOPED_TRACE(::testing::Message() << w << "x" << h << (filter ? " filtered" : " unfiltered") << ", "
                                      << threads << " threads");
    const Scene s = makeScene(w, h, seed);
    DetectionParams p;
    p.filter = filter;
    p.threshold = 1.5;
    p.minArea = 3;
    p.deblendLevels = 1; // every region is one object: the segmentation is exactly the regions' pixels
    p.clean = false;
    RunContext ctx;
    ctx.threads = threads;
    const DetectionResult r = detectSources(s.image.view(), s.mask.view(), s.bkg, p, ctx);

    std::vector<std::uint8_t> ref = referenceAbove(s, p);
    const std::size_t regions = keepLargeRegions(ref, w, h, p.minArea);
    EXPECT_EQ(r.nBeforeDeblend, regions);
    EXPECT_EQ(r.sources.size(), regions);
    std::size_t mismatches = 0, objectPixels = 0;
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            const bool inRef = ref[static_cast<std::size_t>(y) * w + x] != 0;
            objectPixels += inRef;
            mismatches += inRef != (r.segmentation(x, y) != 0);
        }
    EXPECT_EQ(mismatches, 0u);
    EXPECT_GT(objectPixels, 0u);
}

TEST(DetectionFusedPass, MatchesWholeFrameReferenceAcrossBlocks) {
    for (const int threads : {1, 2, 3}) {
        checkAgainstReference(150, 131, true, threads, 11); // 3 row blocks, the last one partial
        checkAgainstReference(97, 64, true, threads, 12);   // exactly one block
        checkAgainstReference(150, 131, false, threads, 13);
    }
}

TEST(DetectionFusedPass, FramesSmallerThanTheFilter) {
    checkAgainstReference(5, 200, true, 2, 21); // narrower than the 7-tap filter
    checkAgainstReference(300, 4, true, 2, 22); // shorter than the filter
    checkAgainstReference(6, 6, true, 1, 23);
}

} // namespace
} // namespace gpuphot
