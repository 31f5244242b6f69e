// Limits and stretch of the viewer against independent computations: numpy/astropy through Debian's
// /usr/bin/python3 (skipped when absent) and closed forms.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include <unistd.h>

#include "viewers/stretch.hpp"

namespace gpuphot::viewers {
namespace {

bool havePython(const char* module) {
    if (!std::filesystem::exists("/usr/bin/python3")) return false;
    const std::string cmd = std::string("/usr/bin/python3 -c 'import ") + module + "' >/dev/null 2>&1";
    return std::system(cmd.c_str()) == 0;
}

// Runs a Python snippet on the float32 array `values` (bound to v) and returns the numbers it prints.
std::vector<double> runPython(const std::vector<float>& values, const std::string& body) {
    const auto dir = std::filesystem::temp_directory_path();
    const std::string tag = std::to_string(::getpid()) + "_" + std::to_string(std::rand());
    const auto bin = dir / ("viewer_stretch_" + tag + ".f32");
    const auto py = dir / ("viewer_stretch_" + tag + ".py");
    {
        std::ofstream f(bin, std::ios::binary);
        f.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * 4));
    }
    {
        std::ofstream f(py);
        f.precision(17);
        f << "import numpy as np\nv = np.fromfile('" << bin.string() << "', dtype=np.float32)\n" << body << "\n";
    }
    std::vector<double> out;
    FILE* p = popen(("/usr/bin/python3 " + py.string()).c_str(), "r");
    if (p) {
        double x;
        while (std::fscanf(p, "%lf", &x) == 1) out.push_back(x);
        pclose(p);
    }
    std::filesystem::remove(bin);
    std::filesystem::remove(py);
    return out;
}

std::vector<float> skyWithStars(int n, unsigned seed, bool nans = false) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> noise(1000.f, 12.f);
    std::uniform_real_distribution<float> u(0.f, 1.f);
    std::vector<float> v(static_cast<std::size_t>(n));
    for (float& x : v) {
        x = noise(rng) + 0.002f * static_cast<float>(&x - v.data());
        if (u(rng) < 0.03f) x += 50000.f * u(rng) * u(rng);
        if (nans && u(rng) < 0.01f) x = std::numeric_limits<float>::quiet_NaN();
    }
    return v;
}

TEST(ViewerStretch, ZScaleMatchesAstropy) {
    if (!havePython("astropy.visualization")) GTEST_SKIP() << "/usr/bin/python3 with astropy not available";
    struct Case {
        int n;
        unsigned seed;
        bool nans;
        ZScaleParams params;
    };
    ZScaleParams contrast;
    contrast.contrast = 0.1;
    const Case cases[] = {{5000, 1, false, {}}, {999, 2, false, {}}, {20000, 3, true, {}},
                          {3000, 4, false, contrast}, {40, 5, false, {}}};
    // One Python run for all cases (importing astropy takes seconds).
    std::vector<float> all;
    std::ostringstream body;
    body << "from astropy.visualization import ZScaleInterval\no = 0\n";
    for (const Case& c : cases) {
        const auto v = skyWithStars(c.n, c.seed, c.nans);
        all.insert(all.end(), v.begin(), v.end());
        body << "lo, hi = ZScaleInterval(n_samples=" << c.params.nSamples << ", contrast=" << c.params.contrast
             << ").get_limits(v[o:o + " << c.n << "])\nprint(repr(float(lo)), repr(float(hi)))\no += " << c.n
             << "\n";
    }
    const auto ref = runPython(all, body.str());
    ASSERT_EQ(ref.size(), 2 * std::size(cases)) << "python failed";
    std::size_t i = 0;
    for (const Case& c : cases) {
        const auto v = skyWithStars(c.n, c.seed, c.nans);
        const auto [lo, hi] = zscale(v, c.params);
        const double rlo = ref[2 * i], rhi = ref[2 * i + 1];
        const double tol = 1e-6 * std::max(1.0, std::abs(rhi - rlo));
        EXPECT_NEAR(lo, rlo, tol) << "n=" << c.n;
        EXPECT_NEAR(hi, rhi, tol) << "n=" << c.n;
        EXPECT_LT(lo, hi);
        ++i;
    }
}

TEST(ViewerStretch, PercentileMatchesNumpy) {
    if (!havePython("numpy")) GTEST_SKIP() << "/usr/bin/python3 with numpy not available";
    const auto v = skyWithStars(12345, 7);
    const double ps[] = {0.0, 0.25, 1.0, 50.0, 99.5, 99.75, 100.0};
    const auto ref = runPython(v, "for p in (0.0, 0.25, 1.0, 50.0, 99.5, 99.75, 100.0):\n"
                                  "    print(repr(float(np.percentile(v.astype(np.float64), p))))");
    ASSERT_EQ(ref.size(), std::size(ps));
    for (std::size_t i = 0; i < std::size(ps); ++i) {
        std::vector<float> copy = v;
        EXPECT_NEAR(percentile(copy, ps[i]), ref[i], 1e-9 * std::abs(ref[i])) << "p=" << ps[i];
    }
}

TEST(ViewerStretch, SampleIsDeterministicCoversTheFrameAndSkipsNaN) {
    const int w = 1000, h = 700;
    Image<float> img(w, h);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) img(x, y) = static_cast<float>(y * w + x); // exact in float32
    img(0, 0) = std::numeric_limits<float>::quiet_NaN();
    // Small enough: every finite pixel, row-major.
    const auto all = samplePixels(img.view(), static_cast<std::size_t>(w) * h);
    ASSERT_EQ(all.size(), static_cast<std::size_t>(w) * h - 1);
    EXPECT_EQ(all[0], 1.0f);
    // Sub-sampled: at most maxSamples, nearly that many, deterministic, spread over the whole frame.
    const std::size_t maxS = 10000;
    const auto s = samplePixels(img.view(), maxS);
    EXPECT_LE(s.size(), maxS);
    EXPECT_GE(s.size(), maxS * 9 / 10);
    EXPECT_EQ(s, samplePixels(img.view(), maxS));
    int minX = w, maxX = 0, minY = h, maxY = 0;
    for (float v : s) {
        ASSERT_TRUE(std::isfinite(v));
        const int y = static_cast<int>(v) / w, x = static_cast<int>(v) % w;
        minX = std::min(minX, x), maxX = std::max(maxX, x), minY = std::min(minY, y), maxY = std::max(maxY, y);
    }
    EXPECT_LT(minX, 10);
    EXPECT_GT(maxX, w - 10);
    EXPECT_LT(minY, 10);
    EXPECT_GT(maxY, h - 10);
}

TEST(ViewerStretch, LimitModes) {
    std::vector<float> v = skyWithStars(5000, 11);
    LimitRequest req;
    req.mode = LimitMode::MinMax;
    auto [lo, hi] = computeLimits(v, req);
    EXPECT_EQ(lo, *std::min_element(v.begin(), v.end()));
    EXPECT_EQ(hi, *std::max_element(v.begin(), v.end()));
    req.mode = LimitMode::Percentile;
    req.lowPercent = 10;
    req.highPercent = 90;
    std::tie(lo, hi) = computeLimits(v, req);
    // Independent count: about 10% of the values lie below lo, 10% above hi.
    const auto below = std::count_if(v.begin(), v.end(), [&](float x) { return x < lo; });
    const auto above = std::count_if(v.begin(), v.end(), [&](float x) { return x > hi; });
    EXPECT_NEAR(static_cast<double>(below), 500.0, 2.0);
    EXPECT_NEAR(static_cast<double>(above), 500.0, 2.0);
    req.mode = LimitMode::Manual;
    req.manualLow = 5;
    req.manualHigh = 2;
    std::tie(lo, hi) = computeLimits(v, req);
    EXPECT_EQ(lo, 2);
    EXPECT_EQ(hi, 5);
    // Flat or empty samples still give lo < hi.
    const std::vector<float> flat(100, 3.0f);
    req.mode = LimitMode::ZScale;
    std::tie(lo, hi) = computeLimits(flat, req);
    EXPECT_LT(lo, 3.0);
    EXPECT_GT(hi, 3.0);
    std::tie(lo, hi) = computeLimits({}, req);
    EXPECT_LT(lo, hi);
}

TEST(ViewerStretch, StretchFunctionsClosedForms) {
    StretchParams p;
    p.lo = 10;
    p.hi = 110;
    const float vals[] = {0.f, 10.f, 35.f, 60.f, 85.f, 110.f, 500.f};
    for (float v : vals) {
        const double t = std::clamp((v - 10.0) / 100.0, 0.0, 1.0);
        p.stretch = Stretch::Linear;
        EXPECT_NEAR(stretchValue(v, p), t, 1e-6);
        p.stretch = Stretch::Sqrt;
        EXPECT_NEAR(stretchValue(v, p), std::sqrt(t), 1e-6);
        p.stretch = Stretch::Log;
        EXPECT_NEAR(stretchValue(v, p), std::log10(1 + 1000 * t) / std::log10(1001.0), 1e-5);
        p.stretch = Stretch::Asinh;
        EXPECT_NEAR(stretchValue(v, p), std::log(10 * t + std::sqrt(100 * t * t + 1)) / std::log(10 + std::sqrt(101.0)),
                    1e-5);
    }
}

TEST(ViewerStretch, HistogramEqualisationFlattensTheSample) {
    // A strongly skewed sample: after equalisation the stretched values are ~uniform on [0, 1].
    std::mt19937 rng(3);
    std::exponential_distribution<float> ex(1.0f);
    std::vector<float> s(200000);
    for (float& x : s) x = ex(rng);
    StretchParams p;
    p.stretch = Stretch::HistEq;
    p.lo = 0;
    p.hi = 8;
    const auto lut = histEqLut(s, p.lo, p.hi);
    ASSERT_EQ(lut.size(), static_cast<std::size_t>(kHistEqLutSize));
    EXPECT_TRUE(std::is_sorted(lut.begin(), lut.end()));
    EXPECT_FLOAT_EQ(lut.back(), 1.0f);
    std::vector<int> bins(10, 0);
    int inRange = 0;
    for (float x : s) {
        if (x > p.hi) continue;
        ++inRange;
        bins[static_cast<std::size_t>(std::min(9, static_cast<int>(stretchValue(x, p, lut) * 10)))]++;
    }
    for (int b : bins) EXPECT_NEAR(static_cast<double>(b) / inRange, 0.1, 0.01);
}

TEST(ViewerStretch, Colormaps) {
    const auto grey = colormapTable(Colormap::Grey);
    const auto inv = colormapTable(Colormap::Inverted);
    for (int i : {0, 77, 128, 255}) {
        const std::uint32_t g = static_cast<std::uint32_t>(i);
        EXPECT_EQ(grey[static_cast<std::size_t>(i)], g | g << 8 | g << 16 | 0xFF000000u);
        const std::uint32_t n = 255u - g;
        EXPECT_EQ(inv[static_cast<std::size_t>(i)], n | n << 8 | n << 16 | 0xFF000000u);
    }
    const auto vir = colormapTable(Colormap::Viridis);
    EXPECT_EQ(vir[0] & 0xFFFFFFu, 68u | 1u << 8 | 84u << 16);    // #440154
    EXPECT_EQ(vir[255] & 0xFFFFFFu, 253u | 231u << 8 | 37u << 16); // #fde725
    const auto heat = colormapTable(Colormap::Heat);
    EXPECT_EQ(heat[0] & 0xFFFFFFu, 0u);
    EXPECT_EQ(heat[255] & 0xFFFFFFu, 0xFFFFFFu);
    EXPECT_EQ(colormapIndex(0.5f), 128);
    EXPECT_EQ(colormapIndex(-1.f), 0);
    EXPECT_EQ(colormapIndex(2.f), 255);
}

} // namespace
} // namespace gpuphot::viewers
