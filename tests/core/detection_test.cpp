// Detection stage: labelling, deblending, cleaning, measurements, flags, determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/model/flags.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/background/background.hpp"
#include "core/stages/detection/convolution.hpp"
#include "core/stages/detection/detection.hpp"
#include "core/stages/detection/detection_internal.hpp"
#include "core/util/errors.hpp"

namespace gpuphot {
namespace {

constexpr double kPi = 3.14159265358979323846;

BackgroundResult constantBackground(int w, int h, float level, float rms) {
    BackgroundResult b;
    b.level = Image<float>(w, h, level);
    b.rms = Image<float>(w, h, rms);
    b.globalLevel = level;
    b.globalRms = rms;
    return b;
}

// Point-sampled elliptical Gaussian of total flux `flux`, major-axis sigma sa, minor sb, angle thetaDeg.
void addGaussian(Image<float>& img, double x0, double y0, double flux, double sa, double sb = -1.0,
                 double thetaDeg = 0.0) {
    if (sb <= 0) sb = sa;
    const double c = std::cos(thetaDeg * kPi / 180.0), s = std::sin(thetaDeg * kPi / 180.0);
    const double amp = flux / (2.0 * kPi * sa * sb);
    const int r = static_cast<int>(std::ceil(10.0 * sa)); // exp(-50): nothing beyond
    const int xa = std::max(0, static_cast<int>(x0) - r),
              xb = std::min(img.width() - 1, static_cast<int>(x0) + r);
    const int ya = std::max(0, static_cast<int>(y0) - r),
              yb = std::min(img.height() - 1, static_cast<int>(y0) + r);
    for (int y = ya; y <= yb; ++y)
        for (int x = xa; x <= xb; ++x) {
            const double dx = x - x0, dy = y - y0;
            const double u = c * dx + s * dy, v = -s * dx + c * dy;
            img(x, y) += static_cast<float>(amp * std::exp(-0.5 * (u * u / (sa * sa) + v * v / (sb * sb))));
        }
}

void addMoffat(Image<float>& img, double x0, double y0, double amp, double alpha, double beta) {
    for (int y = 0; y < img.height(); ++y)
        for (int x = 0; x < img.width(); ++x) {
            const double r2 = (x - x0) * (x - x0) + (y - y0) * (y - y0);
            img(x, y) += static_cast<float>(amp * std::pow(1.0 + r2 / (alpha * alpha), -beta));
        }
}

// Deterministic Gaussian noise (own Box-Muller: identical on every standard library).
void addNoise(Image<float>& img, double sigma, std::uint32_t seed) {
    std::mt19937 rng(seed);
    auto uniform = [&] { return (static_cast<double>(rng()) + 0.5) / 4294967296.0; };
    for (std::size_t i = 0; i < img.pixelCount(); ++i) {
        const double u1 = uniform(), u2 = uniform();
        img.data()[i] +=
            static_cast<float>(sigma * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * kPi * u2));
    }
}

DetectionResult run(const Image<float>& img, const DetectionParams& p, int threads = 1,
                    const MaskView& mask = {}, float level = 0.0f, float rms = 1.0f) {
    RunContext ctx;
    ctx.threads = threads;
    const BackgroundResult bkg = constantBackground(img.width(), img.height(), level, rms);
    return detectSources(img.view(), mask, bkg, p, ctx);
}

DetectionParams plainParams() {
    DetectionParams p;
    p.filter = false;
    p.deblendLevels = 1;
    p.clean = false;
    p.threshold = 5.0;
    p.minArea = 1;
    return p;
}

Image<float> fromRows(const std::vector<const char*>& rows) {
    const int h = static_cast<int>(rows.size()), w = static_cast<int>(std::strlen(rows[0]));
    Image<float> img(w, h, 0.0f);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            img(x, y) = rows[y][x] == '#' ? 10.0f : 0.0f;
    return img;
}

// ---------------------------------------------------------------------------------------------------
TEST(DetectionLabels, EightConnectivityAndMinArea) {
    // y grows downward in these literals (row 0 first).
    const Image<float> img = fromRows({
        "#.........",
        ".#......##",
        "..#.....#.",
        "..........",
        "#.#.....##",
        "#.#......#",
        "###.......",
    });
    DetectionParams p = plainParams();
    const DetectionResult r = run(img, p);
    // Diagonal chain (3 px), the top-right hook (3 px), the U (7 px), the bottom-right pair (3 px).
    ASSERT_EQ(r.sources.size(), 4u);
    // Order: first pixel in raster order.
    EXPECT_EQ(r.sources.areaIso[0], 3); // diagonal, first pixel (0,0)
    EXPECT_EQ(r.sources.areaIso[1], 3); // hook, first pixel (8,1)
    EXPECT_EQ(r.sources.areaIso[2], 7); // U, first pixel (0,4): arms joined only through the bottom row
    EXPECT_EQ(r.sources.areaIso[3], 3); // (8,4)
    EXPECT_EQ(r.segmentation(2, 2), 1);
    EXPECT_EQ(r.segmentation(2, 4), 3);
    EXPECT_EQ(r.segmentation(9, 5), 4);
    EXPECT_EQ(r.segmentation(1, 4), 0);
    EXPECT_EQ(r.sources.xMin[2], 0);
    EXPECT_EQ(r.sources.xMax[2], 2);
    EXPECT_EQ(r.sources.yMin[2], 4);
    EXPECT_EQ(r.sources.yMax[2], 6);
    EXPECT_NEAR(r.sources.xIso[0], 1.0, 1e-12);
    EXPECT_NEAR(r.sources.yIso[0], 1.0, 1e-12);
    for (std::size_t i = 0; i < r.sources.size(); ++i)
        EXPECT_EQ(r.sources.segmentId[i], static_cast<int>(i) + 1);

    p.minArea = 4; // only the U survives
    const DetectionResult r4 = run(img, p);
    ASSERT_EQ(r4.sources.size(), 1u);
    EXPECT_EQ(r4.sources.areaIso[0], 7);
    EXPECT_EQ(r4.nBeforeDeblend, 1u);
    EXPECT_EQ(r4.segmentation(0, 0), 0);
    EXPECT_EQ(r4.segmentation(0, 6), 1);
}

TEST(DetectionLabels, FourConnectedPixelsAreNotRequired) {
    // A staircase and an anti-diagonal: 8-connected each, one object each.
    const Image<float> img = fromRows({
        "#......#",
        ".#....#.",
        "..#..#..",
        "...##...",
    });
    const DetectionResult r = run(img, plainParams());
    ASSERT_EQ(r.sources.size(), 1u); // both diagonals meet in the bottom row
    EXPECT_EQ(r.sources.areaIso[0], 8);
}

TEST(DetectionConvolution, GaussianKernelIsNormalisedAndSymmetric) {
    const std::vector<float> k = gaussianKernel1d(3.0);
    ASSERT_EQ(k.size(), 7u);
    double sum = 0;
    for (float v : k)
        sum += v;
    EXPECT_NEAR(sum, 1.0, 1e-6);
    for (int i = 0; i < 3; ++i)
        EXPECT_EQ(k[i], k[6 - i]);
    // Separable convolution equals the direct 2-D convolution with the outer-product kernel.
    Image<float> img(23, 17, 0.0f);
    addNoise(img, 1.0, 7);
    Image<float> a, b;
    convolveSeparable(img.view(), k, a, 2);
    convolve2d(img.view(), outerProductKernel(k), 7, 7, b, 2);
    for (int y = 0; y < img.height(); ++y)
        for (int x = 0; x < img.width(); ++x)
            EXPECT_NEAR(a(x, y), b(x, y), 1e-5);
    EXPECT_THROW(gaussianKernel1d(0.0), InvalidInput);
}

// ---------------------------------------------------------------------------------------------------
TEST(DetectionMeasure, TwoSeparatedGaussiansCentroidsAndFluxes) {
    Image<float> img(96, 80, 0.0f);
    const double xa = 30.3, ya = 50.7, fa = 5000.0;
    const double xb = 65.6, yb = 20.2, fb = 2000.0;
    addGaussian(img, xa, ya, fa, 1.5);
    addGaussian(img, xb, yb, fb, 1.5);
    DetectionParams p; // defaults: filter, deblending, cleaning
    const DetectionResult r = run(img, p);
    ASSERT_EQ(r.sources.size(), 2u);
    const Sources& s = r.sources;
    // b comes first (its first pixel is in an earlier row).
    EXPECT_NEAR(s.x[0], xb, 0.01);
    EXPECT_NEAR(s.y[0], yb, 0.01);
    EXPECT_NEAR(s.x[1], xa, 0.01);
    EXPECT_NEAR(s.y[1], ya, 0.01);
    EXPECT_NEAR(s.xIso[1], xa, 0.05);
    EXPECT_NEAR(s.yIso[1], ya, 0.05);
    // The isophote at 1.5 sigma holds all but ~1% of the flux.
    EXPECT_NEAR(s.fluxIso[0] / fb, 0.99, 0.012);
    EXPECT_NEAR(s.fluxIso[1] / fa, 0.995, 0.008);
    // Error of the isophotal flux: background term only (gain 0): sqrt(area) * rms.
    EXPECT_NEAR(s.fluxIsoErr[1], std::sqrt(static_cast<double>(s.areaIso[1])), 1e-9);
    EXPECT_NEAR(s.peak[1], fa / (2 * kPi * 2.25) * std::exp(-0.5 * (0.09 + 0.09) / 2.25), 1.0);
    for (std::size_t i = 0; i < 2; ++i) {
        EXPECT_EQ(s.flags[i], 0u);
        EXPECT_GT(s.xErr[i], 0.0);
        EXPECT_LT(s.xErr[i], 0.05);
        EXPECT_NEAR(s.a[i], 1.5, 0.1);
        EXPECT_NEAR(s.b[i], 1.5, 0.1);
    }
    EXPECT_EQ(r.nBeforeDeblend, 2u);
    EXPECT_EQ(r.nDeblended, 2u);
    EXPECT_EQ(r.nCleaned, 0u);
}

TEST(DetectionMeasure, WindowedPositionErrorMatchesScatter) {
    // Repeated noisy realisations of one star: the reported x error matches the scatter of x.
    const double x0 = 32.37, y0 = 31.81;
    std::vector<double> xs;
    double errSum = 0;
    const int n = 60;
    for (int k = 0; k < n; ++k) {
        Image<float> img(64, 64, 0.0f);
        addGaussian(img, x0, y0, 800.0, 1.6);
        addNoise(img, 1.0, 1000 + k);
        const DetectionResult r = run(img, DetectionParams{});
        ASSERT_GE(r.sources.size(), 1u);
        std::size_t best = 0;
        for (std::size_t i = 1; i < r.sources.size(); ++i)
            if (r.sources.fluxIso[i] > r.sources.fluxIso[best]) best = i;
        xs.push_back(r.sources.x[best]);
        errSum += r.sources.xErr[best];
    }
    double mean = 0, var = 0;
    for (double x : xs)
        mean += x / n;
    for (double x : xs)
        var += (x - mean) * (x - mean) / (n - 1);
    const double scatter = std::sqrt(var), reported = errSum / n;
    EXPECT_NEAR(mean, x0, 4 * scatter / std::sqrt(n) + 0.005);
    EXPECT_GT(reported / scatter, 0.6);
    EXPECT_LT(reported / scatter, 1.6);
}

TEST(DetectionMeasure, EllipseOfElongatedGaussian) {
    Image<float> img(80, 80, 0.0f);
    addGaussian(img, 40.2, 39.7, 1e6, 3.0, 1.5, 30.0);
    DetectionParams p;
    const DetectionResult r = run(img, p);
    ASSERT_EQ(r.sources.size(), 1u);
    const Sources& s = r.sources;
    EXPECT_NEAR(s.a[0], 3.0, 0.02);
    EXPECT_NEAR(s.b[0], 1.5, 0.02);
    EXPECT_NEAR(s.theta[0], 30.0, 0.2);
    // Second moments from the rotated covariance.
    const double c = std::cos(kPi / 6), sn = std::sin(kPi / 6);
    EXPECT_NEAR(s.x2[0], 9.0 * c * c + 2.25 * sn * sn, 0.1);
    EXPECT_NEAR(s.y2[0], 9.0 * sn * sn + 2.25 * c * c, 0.1);
    EXPECT_NEAR(s.xy[0], (9.0 - 2.25) * c * sn, 0.1);
    EXPECT_NEAR(s.x[0], 40.2, 0.01);
    EXPECT_NEAR(s.y[0], 39.7, 0.01);

    Image<float> img2(80, 80, 0.0f); // -60 degrees
    addGaussian(img2, 40.0, 40.0, 1e6, 4.0, 2.0, -60.0);
    const DetectionResult r2 = run(img2, p);
    ASSERT_EQ(r2.sources.size(), 1u);
    EXPECT_NEAR(r2.sources.theta[0], -60.0, 0.2);
}

// ---------------------------------------------------------------------------------------------------
// A 3:1 pair separated by 7 px with sigma 1.5 (3.6 sigma of the filtered profile; a closer 3:1 pair has
// a single maximum and no threshold deblender can split it).
Image<float> pairImage() {
    Image<float> img(64, 64, 0.0f);
    addGaussian(img, 28.0, 32.0, 30000.0, 1.5);
    addGaussian(img, 35.0, 32.0, 10000.0, 1.5);
    return img;
}

TEST(DetectionDeblend, OverlappingPairIsSplit) {
    const Image<float> img = pairImage();
    DetectionParams p;
    const DetectionResult r = run(img, p);
    ASSERT_EQ(r.sources.size(), 2u);
    EXPECT_EQ(r.nBeforeDeblend, 1u);
    EXPECT_EQ(r.nDeblended, 2u);
    const Sources& s = r.sources;
    const std::size_t bright = s.fluxIso[0] > s.fluxIso[1] ? 0 : 1, faint = 1 - bright;
    for (std::size_t i = 0; i < 2; ++i)
        EXPECT_TRUE(s.flags[i] & FlagBlended);
    EXPECT_NEAR(s.x[bright], 28.0, 0.15);
    EXPECT_NEAR(s.y[bright], 32.0, 0.05);
    EXPECT_NEAR(s.x[faint], 35.0, 0.3);
    EXPECT_NEAR(s.y[faint], 32.0, 0.05);
    EXPECT_NEAR(s.fluxIso[bright] / s.fluxIso[faint], 3.0, 0.5);
    EXPECT_NEAR(s.fluxIso[bright] + s.fluxIso[faint], 40000.0, 400.0);
    // Every pixel of the region went to one of the two.
    int n1 = 0, n2 = 0;
    for (int y = 0; y < 64; ++y)
        for (int x = 0; x < 64; ++x) {
            n1 += r.segmentation(x, y) == 1;
            n2 += r.segmentation(x, y) == 2;
        }
    EXPECT_EQ(n1, s.areaIso[0]);
    EXPECT_EQ(n2, s.areaIso[1]);

    p.deblendLevels = 1; // no deblending
    const DetectionResult one = run(img, p);
    ASSERT_EQ(one.sources.size(), 1u);
    EXPECT_EQ(one.sources.flags[0] & FlagBlended, 0u);
    EXPECT_EQ(one.sources.areaIso[0], s.areaIso[0] + s.areaIso[1]);
}

TEST(DetectionDeblend, ContrastParameterKeepsFaintBranchMerged) {
    const Image<float> img = pairImage();
    DetectionParams p;
    // The faint branch (its pixels above the saddle level) holds about 9% of the region's filtered flux
    // (the split stops between contrasts 0.08 and 0.1).
    p.deblendContrast = 0.2;
    const DetectionResult r = run(img, p);
    ASSERT_EQ(r.sources.size(), 1u);
    EXPECT_EQ(r.sources.flags[0] & FlagBlended, 0u);
    p.deblendContrast = 0.01;
    EXPECT_EQ(run(img, p).sources.size(), 2u);
}

TEST(DetectionDeblend, SmallBumpBelowMinAreaStaysMerged) {
    Image<float> img(64, 64, 0.0f);
    addGaussian(img, 30.0, 32.0, 30000.0, 1.5);
    addGaussian(img, 37.0, 32.0, 6000.0, 0.3); // a sharp secondary peak of 5 pixels above the saddle
    DetectionParams p;
    p.filter = false;
    p.minArea = 6;
    EXPECT_EQ(run(img, p).sources.size(), 1u);
    p.minArea = 2;
    EXPECT_EQ(run(img, p).sources.size(), 2u);
}

TEST(DetectionDeblend, ChainOfStarsInOneRegion) {
    Image<float> img(120, 40, 0.0f);
    for (int k = 0; k < 8; ++k)
        addGaussian(img, 12.0 + 13.0 * k, 20.0, 8000.0 + 1000.0 * k, 2.0);
    const DetectionResult r = run(img, DetectionParams{});
    ASSERT_EQ(r.nBeforeDeblend, 1u);
    ASSERT_EQ(r.sources.size(), 8u);
    for (int k = 0; k < 8; ++k) {
        EXPECT_NEAR(r.sources.x[k], 12.0 + 13.0 * k, 0.05); // order: raster order of the first pixel
        EXPECT_TRUE(r.sources.flags[k] & FlagBlended);
    }
}

// ---------------------------------------------------------------------------------------------------
TEST(DetectionClean, SpuriousDetectionInWingIsMerged) {
    // An extended bright object (Moffat, beta 1.5) whose wing is 0.8 rms at the position of a bump
    // that alone would stay below the threshold; a real star at the same distance on the other side.
    const int w = 256, h = 256;
    Image<float> img(w, h, 0.0f);
    addMoffat(img, 128.0, 128.0, 50.0, 20.0, 1.5);
    const double rBump = 20.0 * std::sqrt(std::pow(50.0 / 0.8, 2.0 / 3.0) - 1.0); // wing = 0.8 there
    addGaussian(img, 128.0 + rBump, 128.0, 3.0 * 2.0 * kPi, 1.0);                 // amplitude 3
    addGaussian(img, 128.0 - rBump, 128.0, 60.0 * 2.0 * kPi, 1.0);                // amplitude 60: real
    DetectionParams p;
    p.clean = false;
    const DetectionResult kept = run(img, p);
    ASSERT_EQ(kept.sources.size(), 3u);
    EXPECT_EQ(kept.nCleaned, 0u);
    p.clean = true;
    const DetectionResult cleaned = run(img, p);
    ASSERT_EQ(cleaned.sources.size(), 2u);
    EXPECT_EQ(cleaned.nCleaned, 1u);
    // The bump's pixels now belong to the bright object.
    const int bx = static_cast<int>(std::lround(128.0 + rBump));
    const std::int32_t id = cleaned.segmentation(bx, 128);
    ASSERT_GT(id, 0);
    EXPECT_EQ(id, cleaned.segmentation(128, 128));
    // The real star survives, with its position.
    bool found = false;
    for (std::size_t i = 0; i < cleaned.sources.size(); ++i)
        if (std::abs(cleaned.sources.x[i] - (128.0 - rBump)) < 0.1) found = true;
    EXPECT_TRUE(found);
    // The merged object's area is the sum.
    std::int32_t total = 0;
    for (std::size_t i = 0; i < 3; ++i)
        total += kept.sources.areaIso[i];
    EXPECT_EQ(cleaned.sources.areaIso[0] + cleaned.sources.areaIso[1], total);
}

// ---------------------------------------------------------------------------------------------------
TEST(DetectionFlags, EdgeSaturatedBadPixels) {
    Image<float> img(64, 64, 0.0f);
    addGaussian(img, 0.5, 30.0, 3000.0, 1.5);  // 0: touches x = 0
    addGaussian(img, 20.0, 10.0, 3000.0, 1.5); // mask-saturated centre
    addGaussian(img, 45.0, 20.0, 9000.0, 1.5); // above the saturation level
    addGaussian(img, 30.0, 45.0, 3000.0, 1.5); // a bad pixel inside
    addGaussian(img, 50.0, 50.0, 3000.0, 1.5); // clean
    Image<std::uint8_t> mask(64, 64, 0);
    mask(20, 10) = MaskSaturated;
    mask(31, 45) = MaskBad;
    DetectionParams p;
    p.saturationLevel = 500.0;
    const DetectionResult r = run(img, p, 1, mask.view());
    ASSERT_EQ(r.sources.size(), 5u);
    auto at = [&](double x, double y) -> std::uint32_t {
        for (std::size_t i = 0; i < r.sources.size(); ++i)
            if (std::abs(r.sources.xIso[i] - x) < 1.0 && std::abs(r.sources.yIso[i] - y) < 1.0)
                return r.sources.flags[i];
        ADD_FAILURE() << "no object at " << x << "," << y;
        return 0xffffffffu;
    };
    EXPECT_EQ(at(1.0, 30.0) & FlagEdge, FlagEdge);
    EXPECT_EQ(at(20.0, 10.0), FlagSaturated);
    EXPECT_EQ(at(45.0, 20.0), FlagSaturated);
    EXPECT_EQ(at(30.0, 45.0), FlagBadPixels);
    EXPECT_EQ(at(50.0, 50.0), 0u);
}

TEST(DetectionFlags, NonFinitePixelsAreNeverDetected) {
    Image<float> img(32, 32, 0.0f);
    for (int x = 5; x < 12; ++x)
        img(x, 5) = std::nanf("");
    img(20, 20) = std::numeric_limits<float>::infinity();
    Image<std::uint8_t> mask(32, 32, 0);
    for (int x = 0; x < 32; ++x)
        mask(x, 28) = MaskOutside;
    for (int x = 0; x < 32; ++x)
        img(x, 28) = 1000.0f;
    const DetectionResult r = run(img, DetectionParams{}, 1, mask.view());
    EXPECT_EQ(r.sources.size(), 0u);
}

// ---------------------------------------------------------------------------------------------------
TEST(DetectionNoise, PureNoiseGivesAlmostNoDetections) {
    Image<float> img(1024, 1024, 100.0f);
    addNoise(img, 4.0, 12345);
    DetectionParams p;
    p.threshold = 5.0;
    const DetectionResult r5 = run(img, p, 2, {}, 100.0f, 4.0f);
    EXPECT_LE(r5.sources.size(), 1u);
    p.threshold = 1.5; // the default, still far above the filtered noise (about 0.22 rms)
    const DetectionResult r15 = run(img, p, 2, {}, 100.0f, 4.0f);
    EXPECT_LE(r15.sources.size(), 1u);
    // Without the filter, 1.5 sigma is noise: many detections (the threshold really is applied).
    p.filter = false;
    p.minArea = 1;
    const DetectionResult raw = run(img, p, 2, {}, 100.0f, 4.0f);
    EXPECT_GT(raw.sources.size(), 10000u);
}

// ---------------------------------------------------------------------------------------------------
Image<float> crowdedScene(int w, int h, int nStars, std::uint32_t seed) {
    Image<float> img(w, h, 200.0f);
    std::mt19937 rng(seed);
    auto uni = [&](double a, double b) { return a + (b - a) * (static_cast<double>(rng()) / 4294967296.0); };
    for (int k = 0; k < nStars; ++k) {
        const double x = uni(-3, w + 3), y = uni(-3, h + 3);
        const double flux = std::exp(uni(std::log(50.0), std::log(2e5)));
        addGaussian(img, x, y, flux, uni(1.2, 2.2), uni(1.0, 1.2) * 1.2, uni(-90, 90));
    }
    addNoise(img, 5.0, seed + 1);
    return img;
}

void expectIdentical(const DetectionResult& a, const DetectionResult& b) {
    ASSERT_EQ(a.sources.size(), b.sources.size());
    auto same = [](const auto& u, const auto& v) {
        return u.size() == v.size() &&
               (u.empty() || std::memcmp(u.data(), v.data(), u.size() * sizeof(u[0])) == 0);
    };
    const Sources &s = a.sources, &t = b.sources;
    EXPECT_TRUE(same(s.x, t.x));
    EXPECT_TRUE(same(s.y, t.y));
    EXPECT_TRUE(same(s.xErr, t.xErr));
    EXPECT_TRUE(same(s.yErr, t.yErr));
    EXPECT_TRUE(same(s.xIso, t.xIso));
    EXPECT_TRUE(same(s.yIso, t.yIso));
    EXPECT_TRUE(same(s.x2, t.x2));
    EXPECT_TRUE(same(s.y2, t.y2));
    EXPECT_TRUE(same(s.xy, t.xy));
    EXPECT_TRUE(same(s.a, t.a));
    EXPECT_TRUE(same(s.b, t.b));
    EXPECT_TRUE(same(s.theta, t.theta));
    EXPECT_TRUE(same(s.fluxIso, t.fluxIso));
    EXPECT_TRUE(same(s.fluxIsoErr, t.fluxIsoErr));
    EXPECT_TRUE(same(s.areaIso, t.areaIso));
    EXPECT_TRUE(same(s.peak, t.peak));
    EXPECT_TRUE(same(s.xMin, t.xMin));
    EXPECT_TRUE(same(s.yMax, t.yMax));
    EXPECT_TRUE(same(s.flags, t.flags));
    EXPECT_TRUE(same(s.segmentId, t.segmentId));
    EXPECT_EQ(std::memcmp(a.segmentation.data(), b.segmentation.data(), a.segmentation.pixelCount() * 4), 0);
    EXPECT_EQ(a.nBeforeDeblend, b.nBeforeDeblend);
    EXPECT_EQ(a.nDeblended, b.nDeblended);
    EXPECT_EQ(a.nCleaned, b.nCleaned);
}

TEST(DetectionDeterminism, OneAndTwoThreadsBitwiseIdentical) {
    const Image<float> img = crowdedScene(400, 300, 500, 99);
    DetectionParams p;
    p.gain = 2.0;
    const DetectionResult r1 = run(img, p, 1, {}, 200.0f, 5.0f);
    const DetectionResult r2 = run(img, p, 2, {}, 200.0f, 5.0f);
    const DetectionResult r3 = run(img, p, 3, {}, 200.0f, 5.0f);
    EXPECT_GT(r1.sources.size(), 200u);
    EXPECT_GT(r1.nDeblended, r1.nBeforeDeblend); // the scene has blends
    expectIdentical(r1, r2);
    expectIdentical(r1, r3);
}

TEST(DetectionDeterminism, CleanGridAnyThreadCount) {
    // CLEAN's neighbour grid is built by shares of the objects and rows of cells in parallel: a crowded
    // scene over many rows and columns of cells gives the same catalog for any team size.
    const Image<float> img = crowdedScene(720, 530, 2600, 7);
    DetectionParams p;
    const DetectionResult r1 = run(img, p, 1, {}, 200.0f, 5.0f);
    EXPECT_GT(r1.sources.size(), 1000u);
    EXPECT_GT(r1.nCleaned, 0u); // CLEAN merged some: its search ran over the grid
    for (const int threads : {2, 5, 16}) {
        SCOPED_TRACE(threads);
        expectIdentical(r1, run(img, p, threads, {}, 200.0f, 5.0f));
    }
}

TEST(DetectionParamsJson, RoundTripAndDefaults) {
    DetectionParams p;
    p.threshold = 3.25;
    p.minArea = 9;
    p.filterKernel = {0.f, 1.f, 0.f, 1.f, 4.f, 1.f, 0.f, 1.f, 0.f};
    p.filterKernelWidth = 3;
    p.saturationLevel = 60000.0;
    p.clean = false;
    const nlohmann::json j = p;
    const DetectionParams q = j.get<DetectionParams>();
    EXPECT_EQ(q.threshold, 3.25);
    EXPECT_EQ(q.minArea, 9);
    EXPECT_EQ(q.filterKernel, p.filterKernel);
    EXPECT_EQ(q.filterKernelWidth, 3);
    EXPECT_EQ(q.saturationLevel, 60000.0);
    EXPECT_FALSE(q.clean);
    const DetectionParams d = nlohmann::json::object().get<DetectionParams>();
    EXPECT_EQ(d.deblendLevels, 32);
    EXPECT_TRUE(std::isinf(d.saturationLevel));
}

TEST(DetectionParamsJson, SuppliedKernelIsUsed) {
    // A 3x3 kernel (unnormalised: the stage normalises it) detects the same pair as the Gaussian.
    const Image<float> img = pairImage();
    DetectionParams p;
    p.filterKernel = {1.f, 2.f, 1.f, 2.f, 4.f, 2.f, 1.f, 2.f, 1.f};
    p.filterKernelWidth = 3;
    const DetectionResult r = run(img, p);
    EXPECT_EQ(r.sources.size(), 2u);
    p.filterKernelWidth = 2;
    EXPECT_THROW(run(img, p), InvalidInput);
}

TEST(DetectionErrors, InconsistentInputsThrow) {
    Image<float> img(16, 16, 0.0f);
    RunContext ctx;
    const BackgroundResult bkg = constantBackground(8, 16, 0.0f, 1.0f);
    EXPECT_THROW(detectSources(img.view(), {}, bkg, DetectionParams{}, ctx), InvalidInput);
    DetectionParams p;
    p.threshold = -1.0;
    EXPECT_THROW(run(img, p), InvalidInput);
    p = DetectionParams{};
    p.minArea = 0;
    EXPECT_THROW(run(img, p), InvalidInput);
    p = DetectionParams{};
    p.windowMaxSigma = 0.2; // below windowMinSigma (0.5)
    EXPECT_THROW(run(img, p), InvalidInput);
    p.windowMaxSigma = -1.0;
    EXPECT_THROW(run(img, p), InvalidInput);
    p.windowMaxSigma = 0.0; // no ceiling
    EXPECT_NO_THROW(run(img, p));
}

// The one input check both engines use (the CUDA engine hands what fails it to the CPU stage): empty for
// inputs the stage takes, else the message detectSources throws.
TEST(DetectionErrors, InputProblemIsTheMessageTheStageThrows) {
    Image<float> img(16, 16, 0.0f);
    const BackgroundResult bkg = constantBackground(16, 16, 0.0f, 1.0f);
    EXPECT_EQ(detail::inputProblem(img.view(), {}, bkg, DetectionParams{}), "");
    DetectionParams p;
    p.windowMaxSigma = 0.2; // below windowMinSigma
    const std::string why = detail::inputProblem(img.view(), {}, bkg, p);
    EXPECT_NE(why.find("windowMaxSigma"), std::string::npos) << why;
    RunContext ctx;
    try {
        detectSources(img.view(), {}, bkg, p, ctx);
        ADD_FAILURE() << "no exception";
    } catch (const InvalidInput& e) {
        EXPECT_EQ(std::string(e.what()), why);
    }
    const BackgroundResult narrow = constantBackground(8, 16, 0.0f, 1.0f);
    EXPECT_NE(
        detail::inputProblem(img.view(), {}, narrow, DetectionParams{}).find("background level map is 8x16"),
        std::string::npos);
}

} // namespace
} // namespace gpuphot
