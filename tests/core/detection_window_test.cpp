// core/stages/detection/detection_window.hpp: the exp shared by the CPU and CUDA windowed positions against
// the C library's, the half-light radius walk and the window iteration against analytic truths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/stages/detection/detection_window.hpp"
#include "core/stages/detection/detection_window_rows.hpp"

namespace gpuphot::detail {
namespace {

long long ulpDiff(double a, double b) {
    std::int64_t ia, ib;
    std::memcpy(&ia, &a, 8);
    std::memcpy(&ib, &b, 8);
    return ia > ib ? ia - ib : ib - ia;
}

TEST(DetectionWindow, ExpWithinOneUlpOfLibm) {
    std::mt19937_64 rng(3);
    std::uniform_real_distribution<double> window(-8.0, 0.0), wide(-700.0, 700.0);
    long long worst = 0;
    for (int i = 0; i < 200000; ++i) {
        const double x = i % 2 ? window(rng) : wide(rng);
        worst = std::max(worst, ulpDiff(windowExp(x), std::exp(x)));
    }
    EXPECT_LE(worst, 1);
    EXPECT_EQ(windowExp(0.0), 1.0);
    EXPECT_EQ(windowExp(-800.0), 0.0);
    EXPECT_TRUE(std::isnan(windowExp(std::nan(""))));
    EXPECT_TRUE(std::isinf(windowExp(800.0)));
}

TEST(DetectionWindow, PowerOfTwoScalingIsLdexp) {
    // windowExp scales by 2^k as a product with windowPow2(k) for |k| <= 1000 (ldexp beyond): exact, the same
    // bits as ldexp for every mantissa its polynomial gives (about [0.7, 1.42]) and more.
    std::mt19937_64 rng(5);
    std::uniform_real_distribution<double> mant(0.5, 2.0);
    for (int k = -1000; k <= 1000; ++k) {
        const double p = windowPow2(k);
        ASSERT_EQ(p, std::ldexp(1.0, k)) << k;
        for (int j = 0; j < 20; ++j) {
            const double y = mant(rng);
            const double a = y * p, b = std::ldexp(y, k);
            ASSERT_EQ(std::memcmp(&a, &b, sizeof a), 0) << "y " << y << ", k " << k;
        }
    }
    // The ends of the range (ldexp there): still within an ulp of the library's exp.
    for (const double x : {-707.9, -700.0, -693.5, 693.5, 700.0, 708.9})
        EXPECT_LE(ulpDiff(windowExp(x), std::exp(x)), 1) << x;
}

TEST(DetectionWindow, HalfLightRadiusInterpolates) {
    // Four pixels of value 1 at r = 0, 1, 2, 3: half of the flux 4 is reached at the second pixel.
    const double r2[] = {0.0, 1.0, 4.0, 9.0};
    WindowObject m;
    m.flux = 4.0;
    const double r = halfLightRadiusSorted(m, 4, [&](std::int64_t i, double& a, double& v) {
        a = r2[i];
        v = 1.0;
    });
    EXPECT_DOUBLE_EQ(r, 1.0);
    m.flux = 3.0; // target 1.5: halfway between the first (cum 1, r 0) and second pixel (cum 2, r 1)
    const double r15 = halfLightRadiusSorted(m, 4, [&](std::int64_t i, double& a, double& v) {
        a = r2[i];
        v = 1.0;
    });
    EXPECT_DOUBLE_EQ(r15, 0.5);
}

// A symmetric Gaussian at a sub-pixel position: the window converges to it from an offset start.
struct BlobImage {
    int w, h;
    double cx, cy, s;
    std::vector<std::int32_t> seg;
    struct Row {
        const BlobImage* b;
        int y;
        float sub(int x) const {
            const double dx = x - b->cx, dy = y - b->cy;
            return static_cast<float>(1000.0 * std::exp(-0.5 * (dx * dx + dy * dy) / (b->s * b->s)));
        }
        float rms(int) const { return 1.0f; }
        std::uint8_t state(int) const { return 0; }
        std::int32_t seg(int x) const { return b->seg[static_cast<std::size_t>(y) * b->w + x]; }
    };
    Row row(int y) const { return {this, y}; }
};

TEST(DetectionWindow, ConvergesToGaussianCentre) {
    BlobImage img{41, 37, 20.3, 17.6, 1.8, std::vector<std::int32_t>(41 * 37, 0)};
    WindowObject m;
    m.xIso = 20.9;
    m.yIso = 17.1;
    m.flux = 2.0 * 3.14159265358979 * 1.8 * 1.8 * 1000.0;
    m.fluxVar = 100.0;
    m.x2 = m.y2 = 1.8 * 1.8;
    WindowConfig p = windowConfig(DetectionParams{}, img.w, img.h);
    p.maxIterations = 50;
    p.tolerance = 1e-9;
    const WindowResult r = windowedPosition(m, 1.8 * 1.17741, 1, img, p);
    EXPECT_NEAR(r.x, 20.3, 1e-4);
    EXPECT_NEAR(r.y, 17.6, 1e-4);
    EXPECT_GT(r.xErr, 0.0);
    // Every pixel owned by another object: no sums, the barycentre and its error.
    std::fill(img.seg.begin(), img.seg.end(), 2);
    const WindowResult f = windowedPosition(m, 1.8 * 1.17741, 1, img, p);
    EXPECT_EQ(f.x, m.xIso);
    EXPECT_EQ(f.y, m.yIso);
    EXPECT_DOUBLE_EQ(f.xErr, std::sqrt(m.fluxVar * m.x2) / m.flux);
}

// The host's row-at-a-time weights (windowExpRow) are windowExp's bits over the window's arguments and
// beyond, whatever the row's length (the vector loop's body and its remainder).
TEST(DetectionWindow, RowExpIsWindowExpBitForBit) {
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<double> window(-8.0, 0.0), wide(-690.0, 0.0);
    for (const int n : {1, 3, 4, 7, 64, 401}) {
        std::vector<double> x(static_cast<std::size_t>(n)), out(x.size());
        for (int trial = 0; trial < 200; ++trial) {
            for (std::size_t i = 0; i < x.size(); ++i)
                x[i] = i % 3 == 2 ? wide(rng) : window(rng);
            x[0] = trial == 0 ? 0.0 : x[0];
            windowExpRow(x.data(), out.data(), n);
            for (std::size_t i = 0; i < x.size(); ++i) {
                const double e = windowExp(x[i]);
                ASSERT_EQ(std::memcmp(&out[i], &e, sizeof e), 0) << "x " << x[i] << ", n " << n;
            }
        }
    }
}

// windowedPositionRows gives windowedPosition's bits: a blob with neighbours' pixels, bad pixels and an
// edge in its window, iterated to the end.
TEST(DetectionWindow, RowsGiveTheSameBitsAsThePixelLoop) {
    struct Field {
        int w = 97, h = 83;
        std::vector<float> sub, rms;
        std::vector<std::uint8_t> state;
        std::vector<std::int32_t> seg;
        struct Row {
            const Field* f;
            int y;
            std::size_t at(int x) const { return static_cast<std::size_t>(y) * f->w + x; }
            float sub(int x) const { return f->sub[at(x)]; }
            float rms(int x) const { return f->rms[at(x)]; }
            std::uint8_t state(int x) const { return f->state[at(x)]; }
            std::int32_t seg(int x) const { return f->seg[at(x)]; }
        };
        Row row(int y) const { return {this, y}; }
    } f;
    std::mt19937_64 rng(17);
    std::normal_distribution<double> noise(0.0, 3.0);
    const std::size_t n = static_cast<std::size_t>(f.w) * f.h;
    f.sub.resize(n);
    f.rms.assign(n, 3.0f);
    f.state.assign(n, 0);
    f.seg.assign(n, 0);
    for (int y = 0; y < f.h; ++y)
        for (int x = 0; x < f.w; ++x) {
            const double dx = x - 88.4, dy = y - 40.7; // near the right edge
            const std::size_t i = static_cast<std::size_t>(y) * f.w + x;
            f.sub[i] = static_cast<float>(800.0 * std::exp(-0.5 * (dx * dx + dy * dy) / 16.0) + noise(rng));
            f.rms[i] = static_cast<float>(3.0 + 0.01 * x);
            if ((x * 7 + y * 3) % 41 == 0) f.state[i] = StateBad;
            if (x < 80 && y > 45)
                f.seg[i] = 2; // a neighbour
            else if (std::hypot(dx, dy) < 6.0)
                f.seg[i] = 1;
        }
    WindowObject m;
    m.xIso = 88.0;
    m.yIso = 41.2;
    m.flux = 2.0 * 3.14159265358979 * 16.0 * 800.0;
    m.fluxVar = 400.0;
    m.x2 = m.y2 = 16.0;
    WindowRowScratch scratch;
    for (const double halfLight : {1.0, 4.7, 30.0}) {
        WindowConfig p = windowConfig(DetectionParams{}, f.w, f.h);
        p.gain = 2.5;
        const WindowResult a = windowedPosition(m, halfLight, 1, f, p);
        const WindowResult b = windowedPositionRows(m, halfLight, 1, f, p, scratch);
        EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0) << "half-light radius " << halfLight;
        EXPECT_NE(a.x, m.xIso) << "the window moved";
    }
    // A window wholly off the frame (an empty box): no pixel, the barycentre kept, as the pixel loop.
    WindowObject off = m;
    off.xIso = -60.0;
    const WindowConfig p = windowConfig(DetectionParams{}, f.w, f.h);
    const WindowResult a = windowedPosition(off, 2.0, 1, f, p);
    const WindowResult b = windowedPositionRows(off, 2.0, 1, f, p, scratch);
    EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0);
    EXPECT_EQ(b.x, off.xIso);
}

TEST(DetectionWindow, SigmaCeilingBoundsTheWindowOfHugeObjects) {
    WindowObject m;
    m.xIso = 500.0;
    m.yIso = 400.0;
    DetectionParams d;
    const WindowConfig p = windowConfig(d, 2048, 2048);
    ASSERT_EQ(p.maxSigma, d.windowMaxSigma);
    // Below the ceiling: sigma = factor x half-light radius, as without one.
    WindowConfig none = p;
    none.maxSigma = 0.0;
    EXPECT_EQ(windowStart(m, 10.0, p).sigma, windowStart(m, 10.0, none).sigma);
    EXPECT_DOUBLE_EQ(windowStart(m, 10.0, p).sigma, d.windowSigmaFactor * 10.0);
    // A streak's half-light radius of 298 px: the window stops at the ceiling, and so does its box.
    const WindowState huge = windowStart(m, 298.0, p), free = windowStart(m, 298.0, none);
    EXPECT_EQ(huge.sigma, d.windowMaxSigma);
    EXPECT_GT(free.sigma, 250.0);
    int xa = 0, xb = 0, ya = 0, yb = 0;
    ASSERT_TRUE(windowBox(huge, p, xa, xb, ya, yb));
    EXPECT_LE(xb - xa + 1, static_cast<int>(8 * d.windowMaxSigma) + 2);
    // A ceiling below the floor is refused by the stage's parameter check (detection.cpp); 0 means none.
    EXPECT_GE(d.windowMaxSigma, d.windowMinSigma);
}

} // namespace
} // namespace gpuphot::detail
