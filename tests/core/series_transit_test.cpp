// The blind transit fitter (core/series/variability.hpp fitTransit): a noisy trapezoid on an irregular
// grid recovered (depth within 3 %, mid-time within 1 min, duration, errors that match the scatter of the
// recovered values over many noise draws), pure noise not found, a transit the series only half covers
// not found, bad points left out, impossible duration ranges rejected, the speed on 1000 points, and the
// series pipeline's fit and report (SeriesParams::fitTransits).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <random>

#include "core/series/series.hpp"
#include "core/series/variability.hpp"
#include "core/util/errors.hpp"

using namespace gpuphot;

namespace {

struct Truth {
    double depth = 0.01, mid = 2460000.60, duration = 2.0 / 24.0, ingress = 0.1;
};

double trapezoid(const Truth& tr, double t) {
    const double half = 0.5 * tr.duration, a = std::fabs(t - tr.mid);
    if (a >= half) return 0.0;
    return std::min(1.0, (half - a) / (tr.ingress * tr.duration));
}

struct Curve {
    std::vector<double> t, v, e;
};

// n points from `start` over `days` at a jittered cadence (irregular: each step 0.5-1.5 of the mean, a
// few gaps), baseline 1.3, noise sigma, and the truth's dip.
Curve transitCurve(const Truth& tr, int n, double start, double days, double sigma, unsigned seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> step(0.5, 1.5);
    std::normal_distribution<double> noise(0.0, sigma);
    Curve c;
    double t = start;
    for (int i = 0; i < n; ++i) {
        c.t.push_back(t);
        c.v.push_back(1.3 * (1.0 - tr.depth * trapezoid(tr, t)) * (1.0 + noise(rng)));
        c.e.push_back(sigma * 1.3);
        t += days / n * step(rng) * (i % 97 == 50 ? 6.0 : 1.0);
    }
    return c;
}

TEST(Transit, RecoversATrapezoidOnAnIrregularGrid) {
    const Truth tr;
    // 300 points over ~5 h around the transit (as the simulated night), S/N 1000 per point: the depth's
    // error is ~1.2 % of it, the mid-time's ~0.25 min.
    const Curve c = transitCurve(tr, 300, tr.mid - 0.11, 0.21, 0.001, 7);
    const auto t0 = std::chrono::steady_clock::now();
    const TransitFit f = fitTransit(c.t, c.v, c.e);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(f.found) << "snr " << f.snr;
    EXPECT_TRUE(f.covered);
    EXPECT_NEAR(f.depth / tr.depth, 1.0, 0.03) << f.depth;
    EXPECT_NEAR((f.mid - tr.mid) * 1440.0, 0.0, 1.0);
    EXPECT_NEAR(f.duration / tr.duration, 1.0, 0.05) << f.duration * 24.0 << " h";
    EXPECT_NEAR(f.baseline, 1.3, 0.001);
    EXPECT_GT(f.snr, 50.0);
    EXPECT_NEAR(f.chi2, 1.0, 0.25);
    EXPECT_EQ(f.points, 300);
    EXPECT_GT(f.inTransit, 80);
    EXPECT_NEAR(transitModel(f, f.mid), f.baseline * (1.0 - f.depth), 1e-12);
    EXPECT_NEAR(transitModel(f, f.mid + 0.5 * f.duration * (1.0 - f.ingress)),
                f.baseline * (1.0 - 0.5 * f.depth),
                1e-9); // t ~ 2.46e6 d: the time itself is good to ~5e-10 d
    EXPECT_NEAR(transitModel(f, tr.mid + 0.2), f.baseline, 1e-12);
    std::printf("depth %+.2f %% (err %.2f %%), mid %+.3f min (err %.3f), duration %.3f h, ingress %.3f, "
                "S/N %.1f, %.1f ms\n",
                100.0 * (f.depth / tr.depth - 1.0), 100.0 * f.depthErr / tr.depth, (f.mid - tr.mid) * 1440.0,
                f.midErr * 1440.0, f.duration * 24.0, f.ingress, f.snr, secs * 1e3);
}

// Over many noise draws at S/N 500 per point the errors the fit reports are those of the recovered values:
// the depth's within 30 %; the mid-time's (where chi^2 minimised over duration and ingress rises by 1)
// about 10 % below the scatter (the kinks of the trapezoid's chi^2 in mid-time; more at lower S/N).
TEST(Transit, ErrorsMatchTheScatterOverNoiseDraws) {
    const Truth tr;
    std::vector<double> depth, mid;
    double depthErr = 0.0, midErr = 0.0;
    const int draws = 40;
    for (int k = 0; k < draws; ++k) {
        const Curve c = transitCurve(tr, 300, tr.mid - 0.11, 0.21, 0.002, 100 + k);
        const TransitFit f = fitTransit(c.t, c.v, c.e);
        ASSERT_TRUE(f.found) << k;
        depth.push_back(f.depth);
        mid.push_back(f.mid);
        depthErr += f.depthErr / draws;
        midErr += f.midErr / draws;
    }
    auto rms = [](const std::vector<double>& x, double truth) {
        double s = 0.0;
        for (double v : x)
            s += (v - truth) * (v - truth);
        return std::sqrt(s / x.size());
    };
    std::printf("depth: rms %.5f, mean error %.5f; mid: rms %.3f min, mean error %.3f min\n",
                rms(depth, tr.depth), depthErr, rms(mid, tr.mid) * 1440.0, midErr * 1440.0);
    EXPECT_NEAR(rms(depth, tr.depth) / depthErr, 1.0, 0.3);
    EXPECT_GT(rms(mid, tr.mid) / midErr, 0.75);
    EXPECT_LT(rms(mid, tr.mid) / midErr, 1.35);
}

TEST(Transit, PureNoiseIsNotFound) {
    Truth flat;
    flat.depth = 0.0;
    int found = 0;
    for (unsigned seed = 1; seed <= 10; ++seed) {
        const Curve c = transitCurve(flat, 300, flat.mid - 0.11, 0.21, 0.002, seed);
        const TransitFit f = fitTransit(c.t, c.v, c.e);
        found += f.found ? 1 : 0;
        EXPECT_LT(f.snr, 7.0) << seed;
        EXPECT_NEAR(f.baseline, 1.3, 0.001);
    }
    EXPECT_EQ(found, 0);
}

// A series that starts after mid-transit sees the egress only: the mid-time trades against the duration,
// so the fit reports the dip (its depth from the bottom points) but not as found; with the ingress seen
// as well the same transit is found.
TEST(Transit, AHalfCoveredTransitIsNotFound) {
    const Truth tr;
    const Curve egress = transitCurve(tr, 200, tr.mid + 0.1 * tr.duration, 0.15, 0.002, 11);
    const TransitFit f = fitTransit(egress.t, egress.v, egress.e);
    EXPECT_FALSE(f.found);
    EXPECT_FALSE(f.covered);
    EXPECT_GT(f.snr, 7.0); // a clear dip, left out for its coverage
    EXPECT_NEAR(f.depth / tr.depth, 1.0, 0.2);
    // The series starting in the flat bottom before mid-transit: still no ingress, still not found.
    const Curve bottom = transitCurve(tr, 200, tr.mid - 0.2 * tr.duration, 0.15, 0.002, 12);
    EXPECT_FALSE(fitTransit(bottom.t, bottom.v, bottom.e).found);
    // Starting a little before the first contact: found.
    const Curve whole = transitCurve(tr, 200, tr.mid - 0.6 * tr.duration, 0.2, 0.001, 13);
    const TransitFit w = fitTransit(whole.t, whole.v, whole.e);
    EXPECT_TRUE(w.found);
    EXPECT_NEAR((w.mid - tr.mid) * 1440.0, 0.0, 1.0);
}

TEST(Transit, BadPointsAreLeftOut) {
    const Truth tr;
    Curve c = transitCurve(tr, 300, tr.mid - 0.11, 0.21, 0.002, 21);
    const TransitFit clean = fitTransit(c.t, c.v, c.e);
    c.t.push_back(NAN), c.v.push_back(1.0), c.e.push_back(0.002);
    c.t.push_back(tr.mid), c.v.push_back(NAN), c.e.push_back(0.002);
    c.t.push_back(tr.mid), c.v.push_back(0.0), c.e.push_back(0.0);
    c.t.push_back(tr.mid), c.v.push_back(0.0), c.e.push_back(-1.0);
    c.t.push_back(tr.mid), c.v.push_back(0.0), c.e.push_back(INFINITY);
    const TransitFit f = fitTransit(c.t, c.v, c.e);
    EXPECT_EQ(f.points, 300);
    EXPECT_DOUBLE_EQ(f.depth, clean.depth);
    EXPECT_DOUBLE_EQ(f.mid, clean.mid);
    // Too few usable points: nothing fitted, no error.
    const TransitFit few = fitTransit({1.0, 1.1, 1.2}, {1.0, 0.9, 1.0}, {0.01, 0.01, 0.01});
    EXPECT_FALSE(few.found);
    EXPECT_EQ(few.points, 3);
    EXPECT_TRUE(std::isnan(few.depth));
}

TEST(Transit, ImpossibleDurationRangesThrow) {
    const Truth tr;
    const Curve c = transitCurve(tr, 300, tr.mid - 0.11, 0.21, 0.002, 31);
    TransitSearch s;
    s.minDuration = 0.0;
    EXPECT_THROW(fitTransit(c.t, c.v, c.e, s), InvalidInput);
    s.minDuration = 0.1;
    s.maxDuration = 0.05;
    EXPECT_THROW(fitTransit(c.t, c.v, c.e, s), InvalidInput);
    s.minDuration = 1.0; // longer than the ~0.21 d series
    s.maxDuration = 2.0;
    EXPECT_THROW(fitTransit(c.t, c.v, c.e, s), InvalidInput);
    s.minDuration = 0.15; // longer than half the series, the default longest
    s.maxDuration = 0.0;
    EXPECT_THROW(fitTransit(c.t, c.v, c.e, s), InvalidInput);
    s.minDuration = NAN;
    EXPECT_THROW(fitTransit({}, {}, {}, s), InvalidInput);
    s.minDuration = 0.06; // a range that holds the truth: fine
    s.maxDuration = 0.1;
    EXPECT_TRUE(fitTransit(c.t, c.v, c.e, s).found);
}

// 1000 points over 3 nights (gaps of a day) with the default search: well under 0.2 s.
TEST(Transit, ThousandPointsInUnderAFifthOfASecond) {
    const Truth tr;
    Curve c;
    for (int night = 0; night < 3; ++night) {
        const Curve part = transitCurve(tr, 334, tr.mid - 0.15 + night - 1.0, 0.3, 0.002, 40 + night);
        c.t.insert(c.t.end(), part.t.begin(), part.t.end());
        c.v.insert(c.v.end(), part.v.begin(), part.v.end());
        c.e.insert(c.e.end(), part.e.begin(), part.e.end());
    }
    const auto t0 = std::chrono::steady_clock::now();
    const TransitFit f = fitTransit(c.t, c.v, c.e);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("1002 points over 2.3 d: %.1f ms, depth %.5f, mid %+.3f min\n", secs * 1e3, f.depth,
                (f.mid - tr.mid) * 1440.0);
    EXPECT_LT(secs, 0.2);
    EXPECT_TRUE(f.found);
    EXPECT_NEAR((f.mid - tr.mid) * 1440.0, 0.0, 1.0);
    // One night of 1000 points at 18 s cadence.
    const Curve night = transitCurve(tr, 1000, tr.mid - 0.11, 0.21, 0.002, 50);
    const auto t1 = std::chrono::steady_clock::now();
    const TransitFit g = fitTransit(night.t, night.v, night.e);
    const double secs1 = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    std::printf("1000 points over 5 h: %.1f ms\n", secs1 * 1e3);
    EXPECT_LT(secs1, 0.2);
    EXPECT_TRUE(g.found);
}

TEST(Transit, SeriesParamsValidateAndRecordTheSearch) {
    SeriesParams p;
    EXPECT_NO_THROW(validate(p));
    EXPECT_FALSE(toJson(p)["fitTransits"].get<bool>());
    p.fitTransits = true;
    p.transit.minDuration = 0.05;
    const nlohmann::json j = toJson(p);
    EXPECT_TRUE(j["fitTransits"].get<bool>());
    EXPECT_DOUBLE_EQ(j["transit"]["minDuration"].get<double>(), 0.05);
    EXPECT_NE(toJson(p).dump(), toJson(SeriesParams{}).dump()); // an append with other options rebuilds
    p.transit.minDuration = -1.0;
    EXPECT_THROW(validate(p), InvalidInput);
    p.transit.minDuration = 0.05;
    p.transit.maxDuration = 0.01;
    EXPECT_THROW(validate(p), InvalidInput);
    p.transit.maxDuration = 0.0;
    p.transit.minSnr = NAN;
    EXPECT_THROW(validate(p), InvalidInput);
}

} // namespace
