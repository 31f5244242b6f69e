// Stage 7 (astrometry): blind solving with no pointing at all against a catalog of Tycho-2's density
// (about 60 stars per square degree down to V = 12, roughly uniform over the sky), through an
// AstrometryIndex built once. The frames' stars are drawn from the catalog itself: every catalog star on
// the frame, its magnitude blurred by 0.15 mag (detections are not ordered exactly as the catalog), its
// position by 0.1 px, 10% of them lost and 5% spurious detections added.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <random>
#include <vector>

#include "core/catalog/reference_catalog.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/astrometry/astrometry.hpp"
#include "core/stages/astrometry/astrometry_internal.hpp"
#include "core/wcs/tan_sip.hpp"
#include "tests/core/test_fields.hpp"

using namespace gpuphot;

namespace {

constexpr double kDeg = std::numbers::pi / 180.0;

// Stars uniform over a spherical cap (capDeg = 180: the whole sky) around (ra0, dec0), magnitudes with
// N(< m) growing as 10^(0.45 m) up to V = 12 (Tycho-2's counts to its limit, roughly).
ReferenceCatalog skyCatalog(std::size_t n, double ra0, double dec0, double capDeg, std::uint64_t seed) {
    ReferenceCatalog c;
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    const double cosCap = std::cos(capDeg * kDeg);
    const auto centre = astrom::unitVector(ra0, dec0);
    // An orthonormal basis with the cap's centre as third axis.
    std::array<double, 3> e1 = {-centre[1], centre[0], 0.0};
    const double h = std::hypot(e1[0], e1[1]);
    e1 = h > 1e-9 ? std::array<double, 3>{e1[0] / h, e1[1] / h, 0.0} : std::array<double, 3>{1.0, 0.0, 0.0};
    const std::array<double, 3> e2 = {centre[1] * e1[2] - centre[2] * e1[1],
                                      centre[2] * e1[0] - centre[0] * e1[2],
                                      centre[0] * e1[1] - centre[1] * e1[0]};
    for (std::size_t i = 0; i < n; ++i) {
        const double z = cosCap + (1.0 - cosCap) * u(rng), phi = 2.0 * std::numbers::pi * u(rng);
        const double r = std::sqrt(std::max(0.0, 1.0 - z * z));
        std::array<double, 3> v;
        for (int k = 0; k < 3; ++k)
            v[k] = z * centre[k] + r * std::cos(phi) * e1[k] + r * std::sin(phi) * e2[k];
        double ra = std::atan2(v[1], v[0]) / kDeg;
        if (ra < 0) ra += 360.0;
        c.ra.push_back(ra);
        c.dec.push_back(std::asin(std::clamp(v[2], -1.0, 1.0)) / kDeg);
        c.mag.push_back(12.0 + std::log10(std::max(u(rng), 1e-300)) / 0.45);
        c.id.push_back(static_cast<std::int64_t>(i + 1));
    }
    c.magErr.assign(n, 0.02);
    c.color.assign(n, NAN);
    c.pmRa.assign(n, NAN);
    c.pmDec.assign(n, NAN);
    return c;
}

struct SkyFrame {
    TanSip truth;
    std::vector<double> x, y, flux;
};

// A frame of the catalog's sky: centre within centreCapDeg of (ra0, dec0), the given scale, a random
// rotation and parity, a mild SIP distortion.
SkyFrame skyFrame(const ReferenceCatalog& cat, int size, double scale, double ra0, double dec0,
                  double centreCapDeg, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::normal_distribution<double> g(0.0, 1.0);
    SkyFrame f;
    double ra = 0, dec = 0;
    offsetPosition(ra0, dec0, 60.0 * centreCapDeg * std::sqrt(u(rng)), 360.0 * u(rng), ra, dec);
    TanSip& t = f.truth;
    t = test::rotatedTanSip(0.5 * (size + 1), 0.5 * (size + 1), ra, dec, scale,
                            2.0 * std::numbers::pi * u(rng), 2);
    if (u(rng) < 0.5)
        for (int k = 0; k < 2; ++k)
            t.cd[k][0] = -t.cd[k][0];
    t.coeffA(2, 0) = 2e-6;
    t.coeffB(1, 1) = -1.5e-6;
    const double radiusDeg = size * std::sqrt(0.5) * scale / 3600.0 * 1.05;
    const auto c = astrom::unitVector(ra, dec);
    const double chordMax = astrom::chordFromDeg(radiusDeg);
    for (std::size_t i = 0; i < cat.size(); ++i) {
        if (std::abs(cat.dec[i] - dec) > radiusDeg) continue;
        const auto v = astrom::unitVector(cat.ra[i], cat.dec[i]);
        if (std::hypot(v[0] - c[0], v[1] - c[1], v[2] - c[2]) > chordMax) continue;
        double x = 0, y = 0;
        if (!t.worldToPixel(cat.ra[i], cat.dec[i], x, y) || x < 0 || y < 0 || x > size - 1 || y > size - 1)
            continue;
        if (u(rng) < 0.1) continue; // lost
        f.x.push_back(x + 0.1 * g(rng));
        f.y.push_back(y + 0.1 * g(rng));
        f.flux.push_back(std::pow(10.0, -0.4 * (cat.mag[i] + 0.15 * g(rng) - 20.0)));
    }
    const std::size_t nSpurious = f.x.size() / 20;
    for (std::size_t i = 0; i < nSpurious; ++i) {
        f.x.push_back((size - 1) * u(rng));
        f.y.push_back((size - 1) * u(rng));
        f.flux.push_back(std::pow(10.0, -0.4 * (11.0 + u(rng) - 20.0)));
    }
    return f;
}

double seconds(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Solves nFrames frames of the catalog's sky (no header, no pointing) through one index; every frame must
// solve to within 0.05 px of the truth. Returns the per-solve times.
std::vector<double> solveFrames(const ReferenceCatalog& cat, const AstrometryParams& ap, int size,
                                double capDeg, int nFrames, double centreCapDeg, double ra0, double dec0) {
    RunContext ctx;
    auto t0 = std::chrono::steady_clock::now();
    const auto index = buildAstrometryIndex(cat, size, size, ap, ctx);
    std::printf("catalog %zu stars (cap %.0f deg): index %zu quads built in %.2f s\n", cat.size(), capDeg,
                index->quads(), seconds(t0));
    std::vector<double> times;
    std::mt19937_64 rng(99);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (int i = 0; i < nFrames; ++i) {
        const double scale = ap.scaleLow * std::pow(ap.scaleHigh / ap.scaleLow, 0.1 + 0.8 * u(rng));
        const SkyFrame f = skyFrame(cat, size, scale, ra0, dec0, centreCapDeg, 4000 + i);
        t0 = std::chrono::steady_clock::now();
        const AstrometryResult r =
            solveAstrometry(f.x, f.y, f.flux, size, size, *index, nullptr, std::nullopt, ap, ctx);
        times.push_back(seconds(t0));
        EXPECT_TRUE(r.ok) << "frame " << i << ": " << r.message;
        if (!r.ok) continue;
        const double rms = wcsDifferencePx(f.truth, r.wcs, size, size);
        std::printf("frame %2d: scale %5.2f\"/px, %zu detections: %.3f s, truth RMS %.4f px, %d/%d used\n", i,
                    scale, f.x.size(), times.back(), rms, r.nUsed, r.nMatched);
        EXPECT_LT(rms, 0.05) << "frame " << i;
    }
    std::vector<double> sorted = times;
    std::sort(sorted.begin(), sorted.end());
    std::printf("%d solves: median %.3f s, slowest %.3f s\n", nFrames, sorted[sorted.size() / 2],
                sorted.back());
    return times;
}

AstrometryParams allSkyParams() {
    AstrometryParams ap;
    ap.scaleLow = 12.0; // arcsec/px: a scale range as astrometry.net's --scale-low/--scale-high, no pointing
    ap.scaleHigh = 24.0;
    return ap;
}

} // namespace

// A 20-degree cap of the sky at Tycho-2's density (about 75 000 stars): the index covers the whole cap and
// the solve has neither a WCS nor a pointing.
TEST(AstrometryAllSky, SolvesWithoutPointingOnASkyCap) {
    const double capDeg = 20.0;
    const double areaDeg2 = 2.0 * std::numbers::pi * (1.0 - std::cos(capDeg * kDeg)) / (kDeg * kDeg);
    const ReferenceCatalog cat =
        skyCatalog(static_cast<std::size_t>(60.0 * areaDeg2), 150.0, 40.0, capDeg, 11);
    const std::vector<double> times =
        solveFrames(cat, allSkyParams(), 1024, capDeg, 3, capDeg - 5.0, 150.0, 40.0);
    EXPECT_EQ(times.size(), 3u);
}

// The whole sky: 2.5 million stars (Tycho-2's count); prints the index cost and the per-solve times.
TEST(AstrometryAllSky, DISABLED_SolvesWithoutPointingOnTheWholeSky) {
    const ReferenceCatalog cat = skyCatalog(2'500'000, 0.0, 90.0, 180.0, 12);
    solveFrames(cat, allSkyParams(), 1024, 180.0, 10, 180.0, 0.0, 90.0);
}
