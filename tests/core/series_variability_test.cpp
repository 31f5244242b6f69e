// Variability and detrending of light curves (core/series/variability.hpp): Stetson J and the chi^2 of a
// constant on constant and variable synthetic curves, the generalised Lomb-Scargle periodogram against a
// direct evaluation of Zechmeister & Kuerster (2009) and against astropy, its speed, and the linear
// detrending (an injected airmass slope removed and its coefficient reported within its error).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>

#include "core/series/series.hpp"
#include "core/series/variability.hpp"
#include "core/util/errors.hpp"

using namespace gpuphot;

namespace {

constexpr double kPi = 3.14159265358979323846;

struct Curve {
    std::vector<double> t, v, e;
};

// n points at irregular times over `days`, errors `sigma`, a sine of `amplitude` and `period` (d).
Curve sineCurve(int n, double days, double sigma, double amplitude, double period, unsigned seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> when(0.0, days);
    std::normal_distribution<double> noise(0.0, sigma);
    Curve c;
    for (int i = 0; i < n; ++i) {
        const double t = 60000.0 + when(rng);
        c.t.push_back(t);
        c.v.push_back(1.0 + amplitude * std::sin(2.0 * kPi * t / period) + noise(rng));
        c.e.push_back(sigma);
    }
    return c;
}

// Zechmeister & Kuerster (2009) eq. 4-13 evaluated directly at one frequency.
double glsDirect(const Curve& c, double f) {
    double sw = 0.0;
    for (double e : c.e)
        sw += 1.0 / (e * e);
    double y = 0, cc = 0, s = 0, yy = 0, yc = 0, ys = 0, ccc = 0, sss = 0, cs = 0;
    for (std::size_t i = 0; i < c.t.size(); ++i) {
        const double w = 1.0 / (c.e[i] * c.e[i]) / sw, a = 2.0 * kPi * f * c.t[i];
        const double co = std::cos(a), si = std::sin(a);
        y += w * c.v[i];
        cc += w * co;
        s += w * si;
        yy += w * c.v[i] * c.v[i];
        yc += w * c.v[i] * co;
        ys += w * c.v[i] * si;
        ccc += w * co * co;
        sss += w * si * si;
        cs += w * co * si;
    }
    const double YY = yy - y * y, YC = yc - y * cc, YS = ys - y * s, CC = ccc - cc * cc, SS = sss - s * s,
                 CS = cs - cc * s, D = CC * SS - CS * CS;
    return (SS * YC * YC + CC * YS * YS - 2.0 * CS * YC * YS) / (YY * D);
}

} // namespace

TEST(Variability, StetsonJAndChi2SeparateConstantFromVariable) {
    const Curve flat = sineCurve(300, 0.2, 0.003, 0.0, 0.06, 4);
    const Curve sine = sineCurve(300, 0.2, 0.003, 0.02, 0.06, 2);
    const double jFlat = stetsonJ(flat.v, flat.e), cFlat = chi2Constant(flat.v, flat.e);
    const double jSine = stetsonJ(sine.v, sine.e), cSine = chi2Constant(sine.v, sine.e);
    // Gaussian noise: E[sign(d^2 - 1) sqrt|d^2 - 1|] = -0.21 for d ~ N(0, 1); chi^2 ~ 1 +- 0.08.
    EXPECT_NEAR(jFlat, -0.21, 0.1);
    EXPECT_NEAR(cFlat, 1.0, 0.25);
    EXPECT_GT(jSine, 3.0);
    EXPECT_GT(cSine, 20.0);
    const VariabilityParams p;
    EXPECT_FALSE(isVariable(jFlat, cFlat, p));
    EXPECT_TRUE(isVariable(jSine, cSine, p));
    EXPECT_TRUE(isVariable(NAN, 6.0, p));
    EXPECT_TRUE(std::isnan(stetsonJ({1.0, 1.1}, {0.1, 0.1})));
    EXPECT_TRUE(std::isnan(chi2Constant({1.0}, {0.1})));
    // Points without a usable error are left out: three left, each 1 sigma from the mean of 1.
    EXPECT_NEAR(chi2Constant({0.9, 1.1, 1.0, 5.0, 7.0}, {0.1, 0.1, 0.1, 0.0, NAN}), 1.0, 1e-12);
}

TEST(Variability, LombScargleRecoversAPeriodOnIrregularSampling) {
    // Two nights' worth of 300 points (the frequency's statistical error: 0.015 % of it).
    const double period = 0.0625; // 1.5 h
    const Curve c = sineCurve(300, 2.0, 0.005, 0.046, period, 3);
    VariabilityParams p;
    const Periodogram pg = lombScargle(c.t, c.v, c.e, p);
    ASSERT_FALSE(pg.power.empty());
    EXPECT_LT(std::fabs(pg.bestPeriod / period - 1.0), 1e-3) << pg.bestPeriod;
    EXPECT_GT(pg.bestPower, 0.9);
    EXPECT_LT(pg.falseAlarm, 1e-10);
    // Every grid frequency as the direct formula gives it (the recurrences do not drift).
    double worst = 0.0;
    for (std::size_t k = 0; k < pg.frequency.size(); ++k)
        worst = std::max(worst, std::fabs(pg.power[k] - glsDirect(c, pg.frequency[k])));
    EXPECT_LT(worst, 1e-9);
    // Noise alone: a peak the false-alarm probability does not trust.
    const Curve noise = sineCurve(300, 2.0, 0.005, 0.0, period, 4);
    EXPECT_GT(lombScargle(noise.t, noise.v, noise.e, p).falseAlarm, 1e-3);
    p.maxPeriod = p.minPeriod;
    EXPECT_THROW(lombScargle(c.t, c.v, c.e, p), InvalidInput);
    p.maxPeriod = p.minPeriod * 1.001; // narrower than a frequency step
    EXPECT_THROW(lombScargle(c.t, c.v, c.e, p), InvalidInput);
}

// Reference: astropy 5.2.1 LombScargle(t, y, dy) (standard normalisation, floating mean) on the curve
// below, at grid frequencies k; the false-alarm probabilities from astropy.timeseries.periodograms.
// lombscargle._statistics.false_alarm_probability(z, fmax, t, y, dy, "standard", method="baluev") (the
// method of LombScargle rounds fmax to a grid of its own). Made with /usr/bin/python3 (numpy 1.24): t = i
// 0.05 + 0.02 sin(1.7 i), y = 0.3 sin(2 pi t / 0.7) + 0.1 cos(2.3 i), dy = 0.1 + 0.02 cos(0.9 i), i = 0..59;
// minPeriod 0.1, maxPeriod half the span, oversample 5: 138 frequencies up to 9.981592918861603.
TEST(Variability, LombScargleMatchesAstropy) {
    Curve c;
    for (int i = 0; i < 60; ++i) {
        c.t.push_back(i * 0.05 + 0.02 * std::sin(i * 1.7));
        c.v.push_back(0.3 * std::sin(2 * kPi * c.t.back() / 0.7) + 0.1 * std::cos(i * 2.3));
        c.e.push_back(0.1 + 0.02 * std::cos(i * 0.9));
    }
    VariabilityParams p;
    p.minPeriod = 0.1;
    p.oversample = 5;
    const Periodogram pg = lombScargle(c.t, c.v, c.e, p);
    ASSERT_EQ(pg.power.size(), 138u);
    EXPECT_NEAR(pg.frequency.back(), 9.981592918861603, 1e-12);
    const std::pair<int, double> power[] = {{0, 0.00883004621275196},
                                            {7, 0.0694509545478217},
                                            {11, 0.911596008402769},
                                            {69, 0.0037881355383575},
                                            {137, 0.000391427986369601}};
    for (const auto& [k, want] : power)
        EXPECT_NEAR(pg.power[k], want, 1e-9) << "frequency " << k;
    const std::pair<double, double> fap[] = {
        {0.05, 0.999874868176885}, {0.20, 0.133777281819512}, {0.50, 4.34686783616622e-07}};
    for (const auto& [z, want] : fap)
        EXPECT_NEAR(baluevFalseAlarm(z, pg.frequency.back(), c.t, c.e), want, 1e-9 + 1e-7 * want) << z;
}

TEST(Variability, LombScargleIsFast) {
    // 1000 points over 10 d, periods 0.01-5 d, 10 per 1/T: 10^4 frequencies.
    const Curve c = sineCurve(1000, 10.0, 0.01, 0.02, 0.37, 5);
    VariabilityParams p;
    p.maxPeriod = 5.0;
    double best = INFINITY;
    std::size_t nf = 0;
    for (int run = 0; run < 3; ++run) {
        const auto t0 = std::chrono::steady_clock::now();
        const Periodogram pg = lombScargle(c.t, c.v, c.e, p);
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        nf = pg.frequency.size();
        EXPECT_LT(std::fabs(pg.bestPeriod / 0.37 - 1.0), 1e-3);
    }
    EXPECT_GE(nf, 9900u);
    std::printf("[speed] Lomb-Scargle: 1000 points x %zu frequencies in %.3f s\n", nf, best);
    EXPECT_LT(best, 0.2);
}

namespace {

// A differential curve with an airmass slope: rel_flux = 1 + slope (X - median X) + noise.
LightCurve slopedCurve(double slope, double sigma, int n, unsigned seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> noise(0.0, sigma);
    LightCurve lc;
    for (int i = 0; i < n; ++i) {
        const double x = 1.0 + double(i) / (n - 1);
        lc.airmass.push_back(x);
        lc.bjdTdb.push_back(2460000.5 + i / 1440.0);
        lc.fwhm.push_back(3.0 + 0.3 * std::sin(i * 0.1));
        lc.sky.push_back(300.0);
        lc.x.push_back(100.0);
        lc.y.push_back(100.0 + i * 0.01);
        const double r = 1.0 + slope * (x - 1.5) + noise(rng);
        lc.relFlux.push_back(r);
        lc.relFluxErr.push_back(sigma);
        lc.diffMag.push_back(-2.5 * std::log10(r));
        lc.diffMagErr.push_back(1.0857362047581294 * sigma / r);
        lc.mag.push_back(12.0 + lc.diffMag.back());
        lc.magErr.push_back(lc.diffMagErr.back());
    }
    return lc;
}

} // namespace

TEST(Detrend, RemovesAnAirmassSlopeAndReportsIt) {
    const double slope = 0.02, sigma = 0.002;
    LightCurve lc = slopedCurve(slope, sigma, 300, 6);
    lc.relFlux[100] += 0.1; // an outlier: clipped
    const Detrend d = detrend(lc, {"airmass", "fwhm"});
    ASSERT_EQ(d.coef.size(), 2u);
    EXPECT_EQ(d.points, 299);
    EXPECT_NEAR(d.coef[0], slope, 3.0 * d.coefErr[0]);
    EXPECT_GT(d.coefErr[0], 0.2 * sigma / std::sqrt(300.0) / 0.29);
    EXPECT_LT(d.coefErr[0], 3.0 * sigma / std::sqrt(300.0) / 0.29); // sigma / (sqrt(n) RMS of X)
    EXPECT_NEAR(d.coef[1], 0.0, 3.0 * d.coefErr[1]);
    EXPECT_GT(d.rmsBefore, 0.005);
    EXPECT_LT(d.rmsAfter, 0.0075); // the noise and the outlier's share: 0.1 / sqrt(300)
    EXPECT_NEAR(lc.rms, d.rmsAfter, 1e-15);
    // The derived columns follow rel_flux; the calibrated magnitude keeps its zero point.
    for (std::size_t i = 0; i < lc.relFlux.size(); ++i) {
        EXPECT_NEAR(lc.diffMag[i], -2.5 * std::log10(lc.relFlux[i]), 1e-12);
        EXPECT_NEAR(lc.mag[i] - lc.diffMag[i], 12.0, 1e-9);
        EXPECT_NEAR(lc.diffMagErr[i], 1.0857362047581294 * lc.relFluxErr[i] / lc.relFlux[i], 1e-12);
    }
    std::vector<double> sorted = lc.relFlux;
    std::nth_element(sorted.begin(), sorted.begin() + 150, sorted.end());
    EXPECT_NEAR(sorted[150], 1.0, 2e-3); // normalised to a median of 1 again
}

TEST(Detrend, UnknownTermsThrowAndShortCurvesStayAsTheyWere) {
    LightCurve lc = slopedCurve(0.01, 0.002, 50, 7);
    const std::vector<double> before = lc.relFlux;
    try {
        detrend(lc, {"airmass", "humidity"});
        FAIL() << "an unknown term must throw";
    } catch (const InvalidInput& e) {
        EXPECT_NE(std::string(e.what()).find("humidity"), std::string::npos) << e.what();
    }
    EXPECT_EQ(lc.relFlux, before);
    LightCurve shortCurve = slopedCurve(0.01, 0.002, 3, 8);
    const std::vector<double> shortBefore = shortCurve.relFlux;
    EXPECT_EQ(detrend(shortCurve, {"airmass", "time"}).points, 0);
    EXPECT_EQ(shortCurve.relFlux, shortBefore);
    SeriesParams p;
    p.detrend = {"airmass", "moon"};
    EXPECT_THROW(validate(p), InvalidInput);
    p.detrend = {"airmass", "time", "x", "y", "sky", "fwhm"};
    EXPECT_NO_THROW(validate(p));
    p.variability.maxPeriod = 0.005; // below minPeriod
    EXPECT_THROW(validate(p), InvalidInput);
}
