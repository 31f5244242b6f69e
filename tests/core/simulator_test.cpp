// The field simulator: flux conservation of the pixel-integrated profiles, determinism (seed, threads),
// WCS truth (checked against WCSLIB), PSF variation (measured from second moments), noise statistics,
// saturation, the deliberately wrong header WCS and the reference catalog.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/pipeline/run_context.hpp"
#include "core/sim/psf_profile.hpp"
#include "core/sim/simulator.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/wcs.hpp"

using namespace gpuphot;

namespace {

constexpr double kDeg = std::numbers::pi / 180.0;

SimParams quietParams(int w, int h) {
    SimParams p;
    p.width = w;
    p.height = h;
    p.noise = false;
    p.sky = 0.0;
    p.bias = 0.0;
    p.saturation = 0.0;
    p.refMargin = 0.0;
    return p;
}

bool sameImage(const Image<float>& a, const Image<float>& b) {
    return a.width() == b.width() && a.height() == b.height() &&
           std::memcmp(a.data(), b.data(), a.pixelCount() * sizeof(float)) == 0;
}

double imageSum(const Image<float>& im) {
    double s = 0.0;
    for (std::size_t i = 0; i < im.pixelCount(); ++i)
        s += im.data()[i];
    return s;
}

// One source per frame at a random sub-pixel position; frames whose source lies well inside are
// compared: the sum of all pixels (noise, sky and bias off) must equal the truth flux.
void checkStampFlux(SimParams p, bool galaxy) {
    int checked = 0;
    for (std::uint64_t seed = 1; seed <= 40 && checked < 6; ++seed) {
        p.seed = seed;
        const SimResult r = simulateField(p);
        ASSERT_EQ(r.truth.rows(), 1u);
        const double x = r.truth.doubles("x")[0] - 1.0, y = r.truth.doubles("y")[0] - 1.0;
        const double flux = r.truth.doubles("flux")[0];
        const double fwhm = r.truth.doubles("fwhm")[0], e = r.truth.doubles("ellipticity")[0];
        const double theta = r.truth.doubles("theta")[0];
        double radius;
        if (galaxy) {
            radius = sim::makeGalaxy(x, y, flux, r.truth.doubles("r_eff")[0], r.truth.doubles("sersic_n")[0],
                                     e, theta, sim::gaussianSigma(fwhm), p.renderThreshold, p.maxStampRadius)
                         .radius;
        } else {
            const auto kind = p.psf == "moffat" ? sim::ProfileKind::Moffat : sim::ProfileKind::Gaussian;
            radius = sim::makeStar(kind, x, y, flux, fwhm, e, theta, p.moffatBeta, p.renderThreshold,
                                   p.maxStampRadius)
                         .radius;
        }
        if (x - radius < 1 || y - radius < 1 || x + radius > p.width - 2 || y + radius > p.height - 2)
            continue;
        EXPECT_GT(x - std::floor(x), 0.0);
        EXPECT_NEAR(imageSum(r.image) / flux, 1.0, 1e-3) << "seed " << seed << " at " << x << "," << y;
        // The magnitudes follow the docs/ARCHITECTURE.md convention.
        EXPECT_NEAR(r.truth.doubles("mag_inst")[0], -2.5 * std::log10(flux), 1e-9);
        EXPECT_NEAR(
            r.truth.doubles("mag")[0],
            r.truth.doubles("mag_inst")[0] + p.zeroPoint + p.colourTerm * r.truth.doubles("colour")[0], 1e-9);
        ++checked;
    }
    EXPECT_GE(checked, 3) << "too few sources fell inside the frame";
}

// Flux-weighted second moments in a circular window (noise-free image, no sky).
struct Moments {
    double sum = 0, xx = 0, yy = 0, xy = 0;
};
Moments measure(const Image<float>& im, double x0, double y0, double rad) {
    Moments m;
    double sx = 0, sy = 0;
    const int xa = static_cast<int>(std::floor(x0 - rad)), xb = static_cast<int>(std::ceil(x0 + rad));
    const int ya = static_cast<int>(std::floor(y0 - rad)), yb = static_cast<int>(std::ceil(y0 + rad));
    for (int pass = 0; pass < 2; ++pass) {
        const double cx = pass == 0 ? x0 : sx, cy = pass == 0 ? y0 : sy;
        Moments a;
        double ax = 0, ay = 0;
        for (int y = ya; y <= yb; ++y)
            for (int x = xa; x <= xb; ++x) {
                if ((x - x0) * (x - x0) + (y - y0) * (y - y0) > rad * rad) continue;
                const double v = im(x, y);
                a.sum += v;
                ax += v * x;
                ay += v * y;
                a.xx += v * (x - cx) * (x - cx);
                a.yy += v * (y - cy) * (y - cy);
                a.xy += v * (x - cx) * (y - cy);
            }
        sx = ax / a.sum;
        sy = ay / a.sum;
        m = a;
    }
    m.xx /= m.sum;
    m.yy /= m.sum;
    m.xy /= m.sum;
    return m;
}

} // namespace

// The fraction of a star's light within a few pixels must not depend on its flux: the cut at the
// surface-brightness threshold lies closer in for faint stars, and what it removes is folded back into
// the profile; an aperture correction measured on bright stars would then make faint ones too bright.
TEST(SimProfile, ShapeDoesNotDependOnFlux) {
    const SimParams p;
    for (auto kind : {sim::ProfileKind::Moffat, sim::ProfileKind::Gaussian}) {
        std::vector<double> within;
        for (double flux : {1000.0, 3000.0, 3e5}) {
            const sim::Profile pr = sim::makeStar(kind, 0.3, -0.2, flux, 3.0, 0.05, 30.0, p.moffatBeta,
                                                  p.renderThreshold, p.maxStampRadius);
            double in = 0.0;
            for (int y = -4; y <= 4; ++y)
                for (int x = -4; x <= 4; ++x)
                    if (x * x + y * y <= 9) in += pr.pixel(x, y);
            within.push_back(in / flux);
        }
        EXPECT_NEAR(within[0], within[2], 1e-4) << "kind " << int(kind);
        EXPECT_NEAR(within[1], within[2], 1e-4) << "kind " << int(kind);
    }
}

TEST(Simulator, StampFluxEqualsTruthMoffat) {
    SimParams p = quietParams(200, 200);
    p.stars = 1;
    p.magBright = 15.0;
    p.magFaint = 15.5;
    p.fwhm = 2.2;
    p.ellipticity = 0.2;
    p.psf = "moffat";
    p.moffatBeta = 2.5;
    checkStampFlux(p, false);
}

TEST(Simulator, StampFluxEqualsTruthGaussianUndersampled) {
    SimParams p = quietParams(48, 48);
    p.stars = 1;
    p.psf = "gaussian";
    p.fwhm = 1.2; // undersampled: the sub-pixel integration matters most here
    p.ellipticity = 0.3;
    p.colourTerm = 0.1;
    checkStampFlux(p, false);
}

TEST(Simulator, StampFluxEqualsTruthGalaxy) {
    SimParams p = quietParams(96, 96);
    p.stars = 0;
    p.galaxies = 1;
    p.galaxyMagBright = 15.0;
    p.galaxyMagFaint = 15.0;
    p.galaxyReMin = 2.0;
    p.galaxyReMax = 4.0;
    checkStampFlux(p, true);
}

TEST(Simulator, PixelIntegralMatchesBruteForce) {
    for (auto kind : {sim::ProfileKind::Moffat, sim::ProfileKind::Gaussian}) {
        const sim::Profile pr = sim::makeStar(kind, 10.37, 9.81, 1000.0, 1.8, 0.25, 33.0, 3.0, 1e-3, 50.0);
        const double peak = pr.pixel(10, 10);
        for (int iy = 7; iy <= 13; ++iy)
            for (int ix = 7; ix <= 13; ++ix) {
                const int n = 200; // midpoint rule on a fine grid
                double s = 0.0;
                for (int b = 0; b < n; ++b)
                    for (int a = 0; a < n; ++a)
                        s += pr.value(ix - 0.5 + (a + 0.5) / n - pr.xc, iy - 0.5 + (b + 0.5) / n - pr.yc);
                s /= double(n) * n;
                EXPECT_NEAR(pr.pixel(ix, iy), s, 2e-5 * peak) << ix << "," << iy;
            }
        // The FWHM is what was asked for: half maximum at FWHM_major / 2 along the major axis.
        const double q = 0.75, fwhmA = 1.8 / std::sqrt(q), fwhmB = 1.8 * std::sqrt(q);
        const double c = std::cos(33.0 * kDeg), s = std::sin(33.0 * kDeg);
        const double v0 = pr.value(0, 0);
        EXPECT_NEAR(pr.value(0.5 * fwhmA * c, 0.5 * fwhmA * s) / v0, 0.5, 2e-3);
        EXPECT_NEAR(pr.value(-0.5 * fwhmB * s, 0.5 * fwhmB * c) / v0, 0.5, 2e-3);
    }
}

TEST(Simulator, SameSeedSameImageDifferentSeedDifferent) {
    SimParams p;
    p.width = 150;
    p.height = 101;
    p.stars = 60;
    p.galaxies = 5;
    p.hotPixels = 10;
    p.cosmicRays = 5;
    p.badColumns = 2;
    p.clusters = 1;
    const SimResult a = simulateField(p), b = simulateField(p);
    EXPECT_TRUE(sameImage(a.image, b.image));
    EXPECT_EQ(a.truth.doubles("x"), b.truth.doubles("x"));
    EXPECT_EQ(a.reference.doubles("ra"), b.reference.doubles("ra"));
    p.seed = 43;
    const SimResult c = simulateField(p);
    EXPECT_FALSE(sameImage(a.image, c.image));
    EXPECT_NE(a.truth.doubles("x"), c.truth.doubles("x"));
}

TEST(Simulator, IdenticalForOneAndTwoThreads) {
    SimParams p;
    p.width = 173;
    p.height = 139; // not a multiple of the band height
    p.stars = 150;
    p.magBright = 9.0; // some bright stars spanning several bands
    p.galaxies = 10;
    p.hotPixels = 20;
    p.cosmicRays = 10;
    p.badColumns = 3;
    RunContext one, two;
    one.threads = 1;
    two.threads = 2;
    const SimResult a = simulateField(p, &one), b = simulateField(p, &two);
    EXPECT_TRUE(sameImage(a.image, b.image));
    EXPECT_EQ(std::memcmp(a.defects.data(), b.defects.data(), a.defects.pixelCount()), 0);
    EXPECT_EQ(a.truth.doubles("saturated"), b.truth.doubles("saturated"));
}

TEST(Simulator, WcsTruthMatchesWcslibReadingTheHeader) {
    SimParams p = quietParams(300, 200);
    p.stars = 200;
    p.rotation = 37.0;
    p.pixelScale = 0.6;
    p.ra = 359.95; // across RA = 0
    p.dec = -42.0;
    p.sipOrder = 3;
    p.sipStrength = 2.0;
    const SimResult r = simulateField(p);
    const Wcs wcs = Wcs::fromHeader(r.header); // WCSLIB: independent of TanSip's closed form
    const auto x = r.truth.doubles("x"), y = r.truth.doubles("y");
    const auto ra = r.truth.doubles("ra"), dec = r.truth.doubles("dec");
    for (std::size_t i = 0; i < x.size(); ++i) {
        const auto [wra, wdec] = wcs.pixelToWorld(x[i] - 1.0, y[i] - 1.0);
        EXPECT_LT(angularSeparationDeg(ra[i], dec[i], wra, wdec) * 3.6e6, 0.1) << "mas, star " << i;
        double px, py;
        ASSERT_TRUE(r.trueWcs.worldToPixel(ra[i], dec[i], px, py));
        EXPECT_NEAR(px, x[i] - 1.0, 1e-6);
        EXPECT_NEAR(py, y[i] - 1.0, 1e-6);
    }
    // The scale, the rotation and the SIP strength are as asked.
    EXPECT_NEAR(r.trueWcs.pixelScaleArcsec(), 0.6, 1e-12);
    double ra0, dec0, ra1, dec1;
    r.trueWcs.pixelToWorld(149.5, 99.5, ra0, dec0);
    r.trueWcs.pixelToWorld(149.5, 100.5, ra1, dec1); // +y: position angle 37 deg east of north
    const double pa =
        std::atan2(std::sin((ra1 - ra0) * kDeg) * std::cos(dec1 * kDeg),
                   std::cos(dec0 * kDeg) * std::sin(dec1 * kDeg) -
                       std::sin(dec0 * kDeg) * std::cos(dec1 * kDeg) * std::cos((ra1 - ra0) * kDeg));
    EXPECT_NEAR(pa / kDeg, 37.0, 0.05);
    double maxShift = 0.0;
    for (double u : {-150.0, 0.0, 150.0})
        for (double v : {-100.0, 100.0}) {
            double du, dv;
            r.trueWcs.distort(u, v, du, dv);
            maxShift = std::max(maxShift, std::hypot(du, dv));
        }
    EXPECT_NEAR(maxShift, 2.0, 0.3);
    EXPECT_DOUBLE_EQ(*r.header.getDouble("SIMZP"), p.zeroPoint);
}

TEST(Simulator, FwhmAndEllipticityVaryAsConfigured) {
    SimParams p = quietParams(400, 300);
    p.stars = 60;
    p.psf = "gaussian";
    p.fwhm = 2.5;
    p.fwhmCornerFactor = 1.3;
    p.ellipticity = 0.0;
    p.ellipticityCorner = 0.2;
    p.psfAngle = 25.0;
    p.magBright = 14.0;
    p.magFaint = 15.0;
    p.seed = 7;
    const SimResult r = simulateField(p);
    const auto x = r.truth.doubles("x"), y = r.truth.doubles("y"), fwhmTruth = r.truth.doubles("fwhm");
    int measured = 0;
    double minF = 1e9, maxF = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        const double xi = x[i] - 1.0, yi = y[i] - 1.0, rad = 10.0;
        if (xi < rad + 1 || yi < rad + 1 || xi > p.width - rad - 2 || yi > p.height - rad - 2) continue;
        bool isolated = true;
        for (std::size_t j = 0; j < x.size(); ++j)
            if (j != i && std::hypot(x[j] - x[i], y[j] - y[i]) < 2.5 * rad) isolated = false;
        if (!isolated) continue;
        // Expected from the configuration, written out independently of the simulator.
        const double xn = (xi - 199.5) / 200.0, yn = (yi - 149.5) / 150.0, r2 = 0.5 * (xn * xn + yn * yn);
        const double fwhm = 2.5 * (1.0 + 0.3 * r2), e = 0.2 * r2;
        EXPECT_NEAR(fwhmTruth[i], fwhm, 1e-9);
        const Moments m = measure(r.image, xi, yi, rad);
        // Pixel integration adds 1/12 px^2 to each variance.
        const double sxx = m.xx - 1.0 / 12, syy = m.yy - 1.0 / 12, sxy = m.xy;
        const double tr = sxx + syy, det = sxx * syy - sxy * sxy;
        const double l1 = 0.5 * tr + std::sqrt(0.25 * tr * tr - det),
                     l2 = 0.5 * tr - std::sqrt(0.25 * tr * tr - det);
        const double fwhmMeasured = 2.0 * std::sqrt(2.0 * std::log(2.0)) * std::pow(l1 * l2, 0.25);
        EXPECT_NEAR(fwhmMeasured / fwhm, 1.0, 0.01) << "star at " << xi << "," << yi;
        EXPECT_NEAR(1.0 - std::sqrt(l2 / l1), e, 0.01);
        if (e > 0.05) {
            const double angle = 0.5 * std::atan2(2.0 * sxy, sxx - syy) / kDeg;
            EXPECT_NEAR(angle, 25.0, 2.0);
        }
        minF = std::min(minF, fwhmMeasured);
        maxF = std::max(maxF, fwhmMeasured);
        ++measured;
    }
    EXPECT_GE(measured, 8);
    EXPECT_GT(maxF / minF, 1.1) << "the stars measured should span the FWHM variation";
}

TEST(Simulator, NoiseStatisticsMatchSkyGainAndReadNoise) {
    struct Case {
        double sky, gain, readNoise, bias;
    };
    for (const Case c :
         {Case{500.0, 2.0, 5.0, 100.0}, Case{3.0, 1.0, 0.0, 0.0}, Case{20000.0, 0.8, 10.0, 50.0}}) {
        SimParams p;
        p.width = 256;
        p.height = 256;
        p.stars = 0;
        p.sky = c.sky;
        p.gain = c.gain;
        p.readNoise = c.readNoise;
        p.bias = c.bias;
        p.saturation = 0.0;
        const SimResult r = simulateField(p);
        const std::size_t n = r.image.pixelCount();
        double sum = 0, sum2 = 0, lag = 0;
        for (std::size_t i = 0; i < n; ++i)
            sum += r.image.data()[i];
        const double mean = sum / n;
        for (std::size_t i = 0; i < n; ++i) {
            const double d = r.image.data()[i] - mean;
            sum2 += d * d;
            if (i + 1 < n) lag += d * (r.image.data()[i + 1] - mean);
        }
        const double var = sum2 / (n - 1);
        const double expectVar = c.sky / c.gain + (c.readNoise / c.gain) * (c.readNoise / c.gain);
        EXPECT_NEAR(mean, c.sky + c.bias, 5.0 * std::sqrt(expectVar / n) + 1e-9) << "sky " << c.sky;
        EXPECT_NEAR(var / expectVar, 1.0, 0.03) << "sky " << c.sky;
        EXPECT_LT(std::fabs(lag / sum2), 0.02) << "neighbouring pixels are correlated";
    }
}

TEST(Simulator, SaturationClipsAndFlags) {
    SimParams p;
    p.width = 120;
    p.height = 120;
    p.stars = 30;
    p.magBright = 8.0;
    p.magFaint = 16.0;
    p.lfSlope = 0.0; // flat: several stars far above the saturation level
    p.bias = 500.0;
    p.saturation = 20000.0;
    const SimResult r = simulateField(p);
    float maxV = -1e30f;
    int atSat = 0;
    for (std::size_t i = 0; i < r.image.pixelCount(); ++i) {
        maxV = std::max(maxV, r.image.data()[i]);
        atSat += r.image.data()[i] == 20000.0f;
    }
    EXPECT_EQ(maxV, 20000.0f);
    EXPECT_GT(atSat, 0);
    const auto mag = r.truth.doubles("mag"), sat = r.truth.doubles("saturated"),
               flux = r.truth.doubles("flux");
    const auto fwhm = r.truth.doubles("fwhm");
    for (std::size_t i = 0; i < mag.size(); ++i) {
        // Peak of a Moffat beta 3 star ~ flux * 0.55 / fwhm^2: far above or far below the level.
        const double peak = flux[i] * 0.55 / (fwhm[i] * fwhm[i]);
        if (peak > 3 * 20000.0) {
            EXPECT_EQ(sat[i], 1.0) << "star " << i;
        }
        if (peak < 0.3 * (20000.0 - 500.0 - p.sky)) {
            EXPECT_EQ(sat[i], 0.0) << "star " << i;
        }
    }
    EXPECT_DOUBLE_EQ(*r.header.getDouble("SATURATE"), 20000.0);
}

TEST(Simulator, WrongHeaderWcsMovesByTheRequestedAmount) {
    SimParams p = quietParams(200, 200);
    p.stars = 10;
    p.rotation = 10.0;
    p.wcsOffset = 7.5;
    p.wcsOffsetAngle = 120.0;
    p.wcsRotation = 2.0;
    p.wcsScaleError = 0.01;
    const SimResult r = simulateField(p);
    const Header& h = r.header;
    const double sep = angularSeparationDeg(*h.getDouble("CRVAL1"), *h.getDouble("CRVAL2"),
                                            r.trueWcs.crval[0], r.trueWcs.crval[1]);
    EXPECT_NEAR(sep * 60.0, 7.5, 1e-6);
    // Rotation and scale of the header CD relative to the truth (both columns).
    const double cd[2][2] = {{*h.getDouble("CD1_1"), *h.getDouble("CD1_2")},
                             {*h.getDouble("CD2_1"), *h.getDouble("CD2_2")}};
    for (int j = 0; j < 2; ++j) {
        const double at = std::atan2(r.trueWcs.cd[0][j], r.trueWcs.cd[1][j]),
                     ah = std::atan2(cd[0][j], cd[1][j]);
        EXPECT_NEAR(std::remainder(ah - at, 2 * std::numbers::pi) / kDeg, 2.0, 1e-9);
        EXPECT_NEAR(std::hypot(cd[0][j], cd[1][j]) / std::hypot(r.trueWcs.cd[0][j], r.trueWcs.cd[1][j]), 1.01,
                    1e-12);
    }
    // The truth keeps the true WCS.
    EXPECT_DOUBLE_EQ(r.trueWcs.crval[0], p.ra);
    EXPECT_DOUBLE_EQ(*r.truth.meta.getDouble("CRVAL1"), p.ra);
    // The pointing keywords carry the same offset.
    EXPECT_NEAR(angularSeparationDeg(*h.getDouble("RA"), *h.getDouble("DEC"), p.ra, p.dec) * 60.0, 7.5, 1e-6);

    p.writeWcs = false;
    const SimResult n = simulateField(p);
    EXPECT_FALSE(n.header.has("CTYPE1"));
    EXPECT_FALSE(n.header.has("CD1_1"));
    EXPECT_TRUE(n.header.has("RA"));
    EXPECT_TRUE(n.header.has("OBJCTRA"));
    EXPECT_FALSE(Wcs::tryFromHeader(n.header).has_value());
}

TEST(Simulator, ReferenceCatalogLimitMarginAndNoise) {
    SimParams p = quietParams(400, 400);
    p.stars = 3000;
    p.pixelScale = 2.0;
    p.refMagLimit = 18.0;
    p.refMargin = 0.15;
    p.properMotions = true;
    p.refPosErr = 0.0;
    p.mjd = 60000.0;
    const SimResult r = simulateField(p);
    const Table& ref = r.reference;
    const auto tid = ref.doubles("truth_id"), rra = ref.doubles("ra"), rdec = ref.doubles("dec");
    const auto rmag = ref.doubles("mag"), rerr = ref.doubles("mag_err");
    const auto tmag = r.truth.doubles("mag"), tra = r.truth.doubles("ra"), tdec = r.truth.doubles("dec");
    const auto pmra = ref.doubles("pmra"), pmdec = ref.doubles("pmdec"), refId = r.truth.doubles("ref_id");
    std::size_t inFrameBright = 0;
    for (double m : tmag)
        inFrameBright += m < 18.0;
    std::size_t linked = 0, outside = 0;
    double chi2 = 0.0;
    const double dt = (2000.0 + (60000.0 + 30.0 / 86400 - 51544.5) / 365.25) - 2016.0;
    const double radius = *ref.meta.getDouble("RADIUS");
    const double halfDiag = 0.5 * std::hypot(400.0, 400.0) * 2.0 / 3600.0;
    EXPECT_NEAR(radius, halfDiag + 0.15, 0.01);
    for (std::size_t k = 0; k < tid.size(); ++k) {
        if (tid[k] > 0) {
            const std::size_t t = static_cast<std::size_t>(tid[k]) - 1;
            ++linked;
            EXPECT_LT(tmag[t], 18.0);
            EXPECT_EQ(refId[t], static_cast<double>(k + 1));
            chi2 += (rmag[k] - tmag[t]) * (rmag[k] - tmag[t]) / (rerr[k] * rerr[k]);
            // Positions at the reference epoch: moved back by the proper motion.
            const double dra = (rra[k] - tra[t]) * std::cos(tdec[t] * kDeg) * 3.6e6,
                         ddec = (rdec[k] - tdec[t]) * 3.6e6;
            EXPECT_NEAR(dra, -pmra[k] * dt, 0.05);
            EXPECT_NEAR(ddec, -pmdec[k] * dt, 0.05);
        } else {
            ++outside;
            double x, y;
            const bool on = r.trueWcs.worldToPixel(rra[k], rdec[k], x, y);
            EXPECT_FALSE(on && x >= -0.5 && x < 399.5 && y >= -0.5 && y < 399.5)
                << "distractor inside the frame";
            EXPECT_LE(angularSeparationDeg(rra[k], rdec[k], p.ra, p.dec), radius + 1e-9);
        }
    }
    EXPECT_EQ(linked, inFrameBright);
    EXPECT_NEAR(chi2 / linked, 1.0, 0.2);
    // Distractor density equals the frame's density of reference stars (Poisson, 5 sigma).
    const double frameDeg2 = std::pow(400 * 2.0 / 3600.0, 2);
    const double capDeg2 = 2 * std::numbers::pi * (1 - std::cos(radius * kDeg)) / (kDeg * kDeg);
    const double expected = inFrameBright / frameDeg2 * (capDeg2 - frameDeg2);
    EXPECT_NEAR(static_cast<double>(outside), expected, 5.0 * std::sqrt(expected) + 5.0);
    for (std::size_t k = 1; k < rmag.size(); ++k)
        EXPECT_LE(rmag[k - 1], rmag[k]) << "sorted by magnitude";
}

TEST(Simulator, ParamsJsonRoundTripAndUnknownKey) {
    SimParams p;
    p.width = 1234;
    p.psf = "gaussian";
    p.fwhmCornerFactor = 1.3;
    p.noise = false;
    p.seed = 9876543210ull;
    const nlohmann::json j = p;
    const SimParams q = j.get<SimParams>();
    EXPECT_EQ(q.width, 1234);
    EXPECT_EQ(q.psf, "gaussian");
    EXPECT_DOUBLE_EQ(q.fwhmCornerFactor, 1.3);
    EXPECT_FALSE(q.noise);
    EXPECT_EQ(q.seed, 9876543210ull);
    EXPECT_EQ(nlohmann::json(q), j);
    EXPECT_THROW(nlohmann::json({{"fwhmm", 3.0}}).get<SimParams>(), InvalidInput);
    EXPECT_THROW(nlohmann::json({{"width", "big"}}).get<SimParams>(), InvalidInput);
    SimParams bad;
    bad.psf = "airy";
    EXPECT_THROW(validate(bad), InvalidInput);
    EXPECT_THROW(simulateField(bad), InvalidInput);
}
