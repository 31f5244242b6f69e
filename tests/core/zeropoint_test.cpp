// Stage 6 (zero point): synthetic calibrators with a known zero point, colour term, noise and outliers;
// the limiting magnitude on error curves with an analytic answer; end to end on a simulated field
// (pipeline + crossmatch + zero point against the simulator's SIMZP / SIMCT).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>

#include <nlohmann/json.hpp>

#include "core/catalog/reference_catalog.hpp"
#include "core/model/flags.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/sim_frame.hpp"
#include "core/sim/simulator.hpp"
#include "core/stages/crossmatch/crossmatch.hpp"
#include "core/stages/zeropoint/zeropoint.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/tan_sip.hpp"
#include "tests/core/test_fields.hpp"

using namespace gpuphot;

namespace {

// Synthetic photometry: every source matched to its own reference row.
struct Synthetic {
    std::vector<double> magInst, magInstErr;
    std::vector<std::uint32_t> flags;
    CrossmatchResult matches;
    ReferenceCatalog ref;
    std::vector<bool> outlier;
};

Synthetic makeSynthetic(int n, double zp, double ct, double outlierFraction, std::uint64_t seed,
                        double extraScatter = 0.0) {
    Synthetic s;
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> um(13.0, 19.0), u01(0.0, 1.0), uOff(0.2, 1.0);
    std::normal_distribution<double> gauss(0.0, 1.0);
    for (int i = 0; i < n; ++i) {
        const double mag = um(rng);
        const double colour = 0.7 + 0.4 * gauss(rng);
        const double instErr = std::hypot(0.002, 0.01 * std::pow(10.0, 0.4 * (mag - 17.0)));
        const double refErr = 0.01 + 0.01 * std::pow(10.0, 0.4 * (mag - 19.0));
        const double sigma = std::sqrt(instErr * instErr + refErr * refErr + extraScatter * extraScatter);
        double mInst = mag - zp - ct * colour + sigma * gauss(rng);
        const bool out = u01(rng) < outlierFraction;
        if (out) mInst -= uOff(rng); // blended: brighter than it should be
        s.magInst.push_back(mInst);
        s.magInstErr.push_back(instErr);
        s.flags.push_back(0);
        s.outlier.push_back(out);
        s.ref.ra.push_back(150.0 + 1e-3 * i);
        s.ref.dec.push_back(20.0);
        s.ref.mag.push_back(mag);
        s.ref.magErr.push_back(refErr);
        s.ref.color.push_back(colour);
        s.ref.pmRa.push_back(std::nan(""));
        s.ref.pmDec.push_back(std::nan(""));
        s.ref.id.push_back(i + 1);
        s.matches.refIndex.push_back(i);
        s.matches.separationArcsec.push_back(0.1);
    }
    s.matches.nMatched = static_cast<std::size_t>(n);
    return s;
}

ZeroPointResult fit(const Synthetic& s, const ZeroPointParams& p) {
    RunContext ctx;
    return fitZeroPoint(s.magInst, s.magInstErr, s.flags, s.matches, s.ref, p, ctx);
}

} // namespace

TEST(ZeroPoint, ClippedMeanRecoversZeroPointWithOutliers) {
    const Synthetic s = makeSynthetic(600, 25.432, 0.0, 0.1, 1);
    const ZeroPointResult r = fit(s, ZeroPointParams{});
    ASSERT_TRUE(r.ok) << r.message;
    std::printf("[zeropoint] clipped-mean: zp %.5f +- %.5f (truth 25.432), %d of %d used, scatter %.4f\n",
                r.zp, r.zpErr, r.nUsed, r.nCandidates, r.scatter);
    EXPECT_NEAR(r.zp, 25.432, 0.002);
    EXPECT_LT(std::fabs(r.zp - 25.432), 4.0 * r.zpErr);
    EXPECT_LT(r.zpErr, 0.002);
    EXPECT_FALSE(r.colourTermFitted);
    EXPECT_EQ(r.colourTerm, 0.0);
    // the big outliers (> 0.3 mag) must all be rejected
    for (std::size_t k = 0; k < r.sourceIndex.size(); ++k) {
        const int i = r.sourceIndex[k];
        EXPECT_NEAR(r.residual[k], s.ref.mag[i] - s.magInst[i] - r.zp, 1e-12);
        if (std::fabs(r.residual[k]) > 0.3) {
            EXPECT_FALSE(r.used[k]);
        }
    }
    // S/N cut: candidates only with an error <= 1.0857 / 20 at the flux the reference predicts (through
    // the median zero point of the sources of measured S/N >= 20), and every such source a candidate
    std::vector<double> first;
    for (std::size_t i = 0; i < s.magInst.size(); ++i)
        if (1.0857362 / s.magInstErr[i] >= 20.0) first.push_back(s.ref.mag[i] - s.magInst[i]);
    std::nth_element(first.begin(), first.begin() + first.size() / 2, first.end());
    double zp0 = first[first.size() / 2];
    if (first.size() % 2 == 0)
        zp0 = 0.5 * (zp0 + *std::max_element(first.begin(), first.begin() + first.size() / 2));
    int predictedBright = 0;
    for (std::size_t i = 0; i < s.magInst.size(); ++i) {
        const double ratio =
            std::clamp(std::pow(10.0, -0.4 * (s.magInst[i] - (s.ref.mag[i] - zp0))), 1.0 / 3, 3.0);
        const bool candidate =
            std::find(r.sourceIndex.begin(), r.sourceIndex.end(), static_cast<int>(i)) != r.sourceIndex.end();
        EXPECT_EQ(candidate, s.magInstErr[i] * ratio <= 1.0857362 / 20.0 + 1e-12) << i;
        predictedBright += candidate;
    }
    EXPECT_EQ(r.nCandidates, predictedBright);
    EXPECT_LT(r.nCandidates, 600);
}

// Sky-limited faint calibrators (flux error independent of the flux): a cut on the measured S/N takes in
// the stars whose noise came out bright, and weights 1/σ² with σ relative to the measured flux favour
// them, so the zero point leans bright. With the S/N and weights at the flux the reference predicts (the
// default) the zero point is unbiased; with the measured ones it is not (the test of the test).
TEST(ZeroPoint, PredictedSnrRemovesTheBiasOfFaintCalibrators) {
    const double zpTrue = 25.0, skyNoise = 100.0; // ADU, each star's flux error
    double biasMeasured = 0.0, biasPredicted = 0.0, errPredicted = 0.0;
    const int trials = 20;
    for (int t = 0; t < trials; ++t) {
        std::mt19937_64 rng(100 + t);
        std::normal_distribution<double> gauss(0.0, 1.0);
        std::uniform_real_distribution<double> u01(0.0, 1.0);
        Synthetic s;
        for (int i = 0; i < 4000; ++i) {
            // counts rising towards faint magnitudes (d log N / dm = 0.3), S/N 5 to 500
            const double mag = 20.5 - std::log10(1.0 + u01(rng) * (std::pow(10.0, 0.3 * 5.0) - 1.0)) / 0.3;
            const double flux = std::pow(10.0, -0.4 * (mag - zpTrue));
            const double measured = flux + skyNoise * gauss(rng);
            if (!(measured > 0.0)) continue;
            const std::size_t k = s.magInst.size();
            s.magInst.push_back(-2.5 * std::log10(measured));
            s.magInstErr.push_back(1.0857362 * skyNoise / measured);
            s.flags.push_back(0);
            s.ref.ra.push_back(150.0 + 1e-3 * static_cast<double>(k));
            s.ref.dec.push_back(20.0);
            s.ref.mag.push_back(mag + 0.005 * gauss(rng));
            s.ref.magErr.push_back(0.005);
            s.ref.color.push_back(std::nan(""));
            s.ref.pmRa.push_back(std::nan(""));
            s.ref.pmDec.push_back(std::nan(""));
            s.ref.id.push_back(static_cast<std::int64_t>(k) + 1);
            s.matches.refIndex.push_back(static_cast<std::int32_t>(k));
            s.matches.separationArcsec.push_back(0.1);
        }
        s.matches.nMatched = s.magInst.size();
        ZeroPointParams p;
        p.matchSigma = 0.0;
        const ZeroPointResult pred = fit(s, p);
        p.predictedSnr = false;
        const ZeroPointResult meas = fit(s, p);
        ASSERT_TRUE(pred.ok && meas.ok) << pred.message << " / " << meas.message;
        biasPredicted += (pred.zp - zpTrue) / trials;
        biasMeasured += (meas.zp - zpTrue) / trials;
        errPredicted += pred.zpErr / trials;
    }
    std::printf(
        "[zeropoint] 20 trials: mean zp - true %+.5f (predicted S/N) %+.5f (measured S/N), zp_err %.5f\n",
        biasPredicted, biasMeasured, errPredicted);
    const double errOfMean = errPredicted / std::sqrt(static_cast<double>(trials));
    EXPECT_LT(std::fabs(biasPredicted), 3.0 * errOfMean);
    EXPECT_GT(biasMeasured, 5.0 * errOfMean) << "the measured S/N no longer biases: the test tests nothing";
}

TEST(ZeroPoint, ColourTermIsRecovered) {
    const Synthetic s = makeSynthetic(600, 26.0, 0.1, 0.1, 2);
    for (const std::string method : {"clipped-mean", "ransac"}) {
        ZeroPointParams p;
        p.fitColourTerm = true;
        p.method = method;
        const ZeroPointResult r = fit(s, p);
        ASSERT_TRUE(r.ok) << r.message;
        std::printf("[zeropoint] %s: zp %.5f +- %.5f, ct %.5f +- %.5f (truth 26, 0.1), %d used\n",
                    method.c_str(), r.zp, r.zpErr, r.colourTerm, r.colourTermErr, r.nUsed);
        EXPECT_TRUE(r.colourTermFitted);
        EXPECT_NEAR(r.zp, 26.0, 0.002) << method;
        EXPECT_NEAR(r.colourTerm, 0.1, 0.005) << method;
        EXPECT_LT(std::fabs(r.colourTerm - 0.1), 4.0 * r.colourTermErr) << method;
    }
}

TEST(ZeroPoint, FlaggedAndOutOfRangeStarsAreNotCandidates) {
    Synthetic s = makeSynthetic(300, 25.0, 0.0, 0.0, 3);
    for (std::size_t i = 0; i < 300; i += 3) {
        s.flags[i] = FlagSaturated;
        s.magInst[i] -= 2.0; // would pull the zero point a lot
    }
    s.matches.refIndex[1] = -1; // unmatched
    ZeroPointParams p;
    p.magFaint = 18.0;
    const ZeroPointResult r = fit(s, p);
    ASSERT_TRUE(r.ok) << r.message;
    EXPECT_NEAR(r.zp, 25.0, 0.003);
    for (int i : r.sourceIndex) {
        EXPECT_NE(i % 3, 0);
        EXPECT_NE(i, 1);
        EXPECT_LE(s.ref.mag[i], 18.0);
    }
}

TEST(ZeroPoint, IsolationInTheReferenceCatalog) {
    Synthetic s = makeSynthetic(50, 25.0, 0.0, 0.0, 10); // stars 3.4" apart along RA
    auto addNeighbour = [&](int row, double mag) {       // an unmatched reference star 1" north of `row`
        s.ref.ra.push_back(s.ref.ra[row]);
        s.ref.dec.push_back(s.ref.dec[row] + 1.0 / 3600.0);
        s.ref.mag.push_back(mag);
        s.ref.magErr.push_back(0.01);
        s.ref.color.push_back(0.5);
        s.ref.pmRa.push_back(std::nan(""));
        s.ref.pmDec.push_back(std::nan(""));
        s.ref.id.push_back(static_cast<std::int64_t>(s.ref.ra.size()));
    };
    const ZeroPointResult all = fit(s, ZeroPointParams{});
    ASSERT_GT(all.nCandidates, 20);
    const int crowdedRow = all.sourceIndex[5], fineRow = all.sourceIndex[15];
    addNeighbour(crowdedRow, 12.0);                  // bright: not isolated
    addNeighbour(fineRow, s.ref.mag[fineRow] + 4.0); // 4 mag fainter: ignored with isolationDeltaMag = 3
    ZeroPointParams p;
    p.isolationArcsec = 2.0;
    const ZeroPointResult r = fit(s, p);
    ASSERT_TRUE(r.ok) << r.message;
    const auto has = [&](int i) {
        return std::find(r.sourceIndex.begin(), r.sourceIndex.end(), i) != r.sourceIndex.end();
    };
    EXPECT_EQ(r.nCandidates + 1, all.nCandidates);
    EXPECT_FALSE(has(crowdedRow));
    EXPECT_TRUE(has(fineRow));
    p.isolationArcsec = 4.0; // now the 3.4" neighbours along RA count too: nearly everything is crowded
    EXPECT_LT(fit(s, p).nCandidates, all.nCandidates / 2);
}

// Enough calibrators for the parallel grid search, scattered over a square degree with as many unmatched
// reference stars among them: the kept candidates are exactly those a brute-force pair test on the sky
// (haversine separations) keeps, on 1 and 4 threads; the isolation test computed once beforehand
// (crowdedMatches, as the pipeline shares it between its fits) gives the same fit; and a star's answer does
// not depend on which other stars are matched.
TEST(ZeroPoint, IsolationOfManyCalibratorsMatchesABruteForceTest) {
    constexpr int kCal = 30000;
    Synthetic s = makeSynthetic(kCal, 25.0, 0.0, 0.0, 21);
    std::mt19937_64 rng(22);
    std::uniform_real_distribution<double> ura(149.5, 150.5), udec(19.5, 20.5), umag(12.0, 21.0);
    for (int i = 0; i < kCal; ++i) {
        s.ref.ra[i] = ura(rng);
        s.ref.dec[i] = udec(rng);
    }
    for (int i = 0; i < kCal; ++i) { // unmatched stars
        s.ref.ra.push_back(ura(rng));
        s.ref.dec.push_back(udec(rng));
        s.ref.mag.push_back(umag(rng));
        s.ref.magErr.push_back(0.01);
        s.ref.color.push_back(0.5);
        s.ref.pmRa.push_back(std::nan(""));
        s.ref.pmDec.push_back(std::nan(""));
        s.ref.id.push_back(kCal + i + 1);
    }
    ZeroPointParams p;
    p.isolationArcsec = 6.0;
    p.minSnr = 0.0; // every source a candidate: the first calibrator is row 0
    p.bootstrap = 0;
    // Brute force over cells of 0.01 deg: every pair closer than the radius in the tangent plane at row 0.
    const std::size_t nRef = s.ref.size();
    std::vector<double> xi(nRef), eta(nRef);
    for (std::size_t k = 0; k < nRef; ++k) {
        ASSERT_TRUE(tanProject(s.ref.ra[0], s.ref.dec[0], s.ref.ra[k], s.ref.dec[k], xi[k], eta[k]));
        xi[k] *= 3600.0;
        eta[k] *= 3600.0;
    }
    std::map<std::pair<int, int>, std::vector<int>> cells;
    auto cellOf = [](double x, double y) {
        return std::pair<int, int>{static_cast<int>(std::floor(x / 36.0)),
                                   static_cast<int>(std::floor(y / 36.0))};
    };
    for (std::size_t k = 0; k < nRef; ++k)
        cells[cellOf(xi[k], eta[k])].push_back(static_cast<int>(k));
    const auto separationArcsec = [&](int i, int k) {
        constexpr double kRad = 3.14159265358979323846 / 180.0;
        const double d1 = s.ref.dec[i] * kRad, d2 = s.ref.dec[k] * kRad;
        const double sd = std::sin(0.5 * (d2 - d1)), sa = std::sin(0.5 * (s.ref.ra[k] - s.ref.ra[i]) * kRad);
        return 2.0 * std::asin(std::sqrt(sd * sd + std::cos(d1) * std::cos(d2) * sa * sa)) / kRad * 3600.0;
    };
    std::vector<int> expectKept;
    int nearTheRadius = 0; // pairs within 0.1 % of it: where a plane test and a sky test could differ
    for (int i = 0; i < kCal; ++i) {
        const auto [cx, cy] = cellOf(xi[i], eta[i]);
        bool crowded = false;
        for (int dx = -1; dx <= 1; ++dx)
            for (int dy = -1; dy <= 1; ++dy)
                for (int k : cells[{cx + dx, cy + dy}]) {
                    if (k == i || !(s.ref.mag[k] < s.ref.mag[i] + p.isolationDeltaMag)) continue;
                    const double sep = separationArcsec(i, k);
                    crowded |= sep < p.isolationArcsec;
                    nearTheRadius += std::fabs(sep / p.isolationArcsec - 1.0) < 1e-3;
                }
        if (!crowded) expectKept.push_back(i);
    }
    EXPECT_GT(nearTheRadius, 0);
    ASSERT_GT(expectKept.size(), kCal * 0.6);
    ASSERT_LT(expectKept.size(), kCal * 0.9);
    for (int threads : {1, 4}) {
        RunContext ctx;
        ctx.threads = threads;
        const ZeroPointResult r = fitZeroPoint(s.magInst, s.magInstErr, s.flags, s.matches, s.ref, p, ctx);
        ASSERT_TRUE(r.ok) << r.message;
        const std::vector<int> kept(r.sourceIndex.begin(), r.sourceIndex.end());
        EXPECT_EQ(kept, expectKept) << threads << " threads";
        const std::vector<char> crowded =
            crowdedMatches(s.matches, s.ref, p.isolationArcsec, p.isolationDeltaMag, threads);
        const ZeroPointResult shared =
            fitZeroPoint(s.magInst, s.magInstErr, s.flags, s.matches, s.ref, p, ctx, 0.0, &crowded);
        EXPECT_EQ(shared.sourceIndex, r.sourceIndex);
        EXPECT_EQ(shared.zp, r.zp);
    }
    // Every other star unmatched, the first one included (another tangent point): the same answers.
    CrossmatchResult half = s.matches;
    for (int i = 0; i < kCal; i += 2)
        half.refIndex[i] = -1;
    const std::vector<char> all = crowdedMatches(s.matches, s.ref, p.isolationArcsec, p.isolationDeltaMag, 2);
    const std::vector<char> some = crowdedMatches(half, s.ref, p.isolationArcsec, p.isolationDeltaMag, 2);
    for (int i = 0; i < kCal; ++i)
        ASSERT_EQ(some[i], i % 2 == 0 ? 0 : all[i]) << i;
}

TEST(ZeroPoint, RansacIsReproducibleBySeed) {
    const Synthetic s = makeSynthetic(300, 24.7, 0.05, 0.25, 4);
    ZeroPointParams p;
    p.method = "ransac";
    p.fitColourTerm = true;
    p.seed = 99;
    const ZeroPointResult a = fit(s, p), b = fit(s, p);
    EXPECT_EQ(a.zp, b.zp);
    EXPECT_EQ(a.colourTerm, b.colourTerm);
    EXPECT_EQ(a.used, b.used);
    EXPECT_NEAR(a.zp, 24.7, 0.004);
    p.seed = 12345;
    const ZeroPointResult c = fit(s, p);
    ASSERT_TRUE(c.ok);
    EXPECT_NEAR(c.zp, 24.7, 0.004);
    EXPECT_NEAR(c.colourTerm, 0.05, 0.01);
}

TEST(ZeroPoint, IntrinsicScatterInflatesTheError) {
    const Synthetic s = makeSynthetic(600, 25.0, 0.0, 0.0, 5, 0.03);
    const ZeroPointResult r = fit(s, ZeroPointParams{});
    ASSERT_TRUE(r.ok);
    std::printf("[zeropoint] extra 0.03 scatter: chi2/dof %.2f, sigma_int %.4f, zp %.5f +- %.5f\n", r.chi2dof,
                r.intrinsicScatter, r.zp, r.zpErr);
    EXPECT_GT(r.chi2dof, 1.5);
    EXPECT_NEAR(r.intrinsicScatter, 0.03, 0.006);
    EXPECT_NEAR(r.zp, 25.0, 4.0 * r.zpErr);
    // the error must reflect the scatter: at least sigma_int / sqrt(N)
    EXPECT_GT(r.zpErr, 0.9 * 0.03 / std::sqrt(static_cast<double>(r.nUsed)));
}

TEST(ZeroPoint, TooFewStarsIsNotAnException) {
    const Synthetic s = makeSynthetic(4, 25.0, 0.0, 0.0, 6);
    ZeroPointResult r;
    ASSERT_NO_THROW(r = fit(s, ZeroPointParams{}));
    EXPECT_FALSE(r.ok);
    EXPECT_TRUE(std::isnan(r.zp));
    EXPECT_NE(r.message.find("too few calibrators"), std::string::npos) << r.message;
    EXPECT_EQ(r.residual.size(), static_cast<std::size_t>(r.nCandidates));

    Synthetic none = makeSynthetic(50, 25.0, 0.0, 0.0, 7);
    for (auto& k : none.matches.refIndex)
        k = -1;
    none.matches.nMatched = 0;
    r = fit(none, ZeroPointParams{});
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.nCandidates, 0);

    ZeroPointParams bad;
    bad.method = "median";
    EXPECT_THROW(fit(s, bad), InvalidInput);
    Synthetic wrong = s;
    wrong.magInst.pop_back();
    EXPECT_THROW(fit(wrong, ZeroPointParams{}), InvalidInput);
}

TEST(ZeroPoint, LimitingMagnitudeOnSyntheticErrorCurves) {
    // Pure sky-limited: err = 1.0857 N / F with constant N -> log err linear in m; exact answer.
    {
        const double noise = 60.0; // ADU in the aperture
        std::vector<double> m, e;
        for (double mag = -12.0; mag <= -4.0; mag += 0.01) {
            m.push_back(mag);
            e.push_back(1.0857362047581294 * noise / std::pow(10.0, -0.4 * mag));
        }
        const double truth = -2.5 * std::log10(5.0 * noise);
        EXPECT_NEAR(limitingMagnitudeInst(m, e), truth, 1e-9);
    }
    // Sky + source Poisson noise with 5% scatter of the errors: S/N = 5 solves F^2 = 25 (F/g + A s^2).
    {
        const double g = 1.5, a = M_PI * 9.0, s2 = 200.0;
        std::mt19937_64 rng(8);
        std::normal_distribution<double> gauss(0.0, 0.05);
        std::vector<double> m, e;
        for (double mag = -12.0; mag <= -4.5; mag += 0.005) {
            const double f = std::pow(10.0, -0.4 * mag);
            m.push_back(mag);
            e.push_back(1.0857362047581294 * std::sqrt(f / g + a * s2) / f * std::exp(gauss(rng)));
        }
        const double b = 25.0 / g, c = 25.0 * a * s2;
        const double f5 = 0.5 * (b + std::sqrt(b * b + 4.0 * c));
        const double truth = -2.5 * std::log10(f5);
        const double got = limitingMagnitudeInst(m, e);
        std::printf("[zeropoint] limiting mag (sky + Poisson): %.4f, truth %.4f\n", got, truth);
        EXPECT_NEAR(got, truth, 0.03);
    }
    // Too few points: NaN.
    EXPECT_TRUE(std::isnan(limitingMagnitudeInst({-10.0, -9.0}, {0.01, 0.02})));
    // Through fitZeroPoint: calibrated with the zero point.
    const Synthetic s = makeSynthetic(800, 25.0, 0.0, 0.0, 9);
    const ZeroPointResult r = fit(s, ZeroPointParams{});
    ASSERT_TRUE(r.ok);
    EXPECT_NEAR(r.limitingMag, r.limitingMagInst + r.zp, 1e-12);
    // the synthetic error law reaches S/N 5 (err 0.2171) at m = 17 + 2.5 log10(21.71) = 20.34 (calibrated);
    // the data stop at 19 (S/N 17), so this is a 1.3 mag extrapolation on noisy magnitudes
    EXPECT_NEAR(r.limitingMag, 17.0 + 2.5 * std::log10(std::sqrt(0.2171 * 0.2171 - 0.002 * 0.002) / 0.01),
                0.2);
}

TEST(ZeroPoint, ParamsJsonRoundTrip) {
    ZeroPointParams p;
    p.magBright = 12.0;
    p.method = "ransac";
    p.fitColourTerm = true;
    p.seed = 77;
    p.excludeFlags = FlagSaturated;
    nlohmann::json j = p;
    EXPECT_EQ(j["magFaint"], "inf");
    const ZeroPointParams q = j.get<ZeroPointParams>();
    EXPECT_EQ(q.magBright, 12.0);
    EXPECT_TRUE(std::isinf(q.magFaint) && q.magFaint > 0);
    EXPECT_EQ(q.method, "ransac");
    EXPECT_TRUE(q.fitColourTerm);
    EXPECT_EQ(q.seed, 77u);
    EXPECT_EQ(q.excludeFlags, static_cast<std::uint32_t>(FlagSaturated));
}

// End to end: simulate, reduce, crossmatch with the frame's WCS, zero point vs the simulator's truth.
// The field is 2048 x 2048 with 6000 stars and colours centred on 0 (spread 0.5): on the suggested
// 1024 x 1024 / 1500-star field with colours 0.7 +- 0.3 only ~250 calibrators pass S/N >= 20 and the
// simulator's reference errors (>= 0.01 mag) leave a statistical zp error of ~0.0036 mag at colour 0,
// so the 0.002 bar could not be tested there (see the stage report).
TEST(ZeroPoint, EndToEndOnSimulatedField) {
    SimParams sp;
    sp.width = 2048;
    sp.height = 2048;
    sp.stars = 6000;
    sp.colourTerm = 0.1;
    sp.colourMean = 0.0;
    sp.colourSigma = 0.5;
    sp.seed = 42;
    const SimResult sim = simulateField(sp);
    const Frame frame = frameFromSimulation(sim);
    ASSERT_TRUE(frame.wcs);
    RunContext ctx;
    const PipelineResult pr = runPipeline(frame, PipelineConfig{}, ctx);
    const Sources& src = pr.detection.sources;

    const ReferenceCatalog ref = test::referenceOf(sim);

    const CrossmatchResult m =
        crossmatch(src.x, src.y, frame.width(), frame.height(), ref, *frame.wcs, CrossmatchParams{}, ctx);
    // Crossmatch against the truth: the star nearest to a matched source (within 1 px) must be the
    // reference star it was matched to.
    {
        const std::vector<double> tx = sim.truth.doubles("x"), ty = sim.truth.doubles("y"),
                                  tRef = sim.truth.doubles("ref_id");
        std::size_t checked = 0, right = 0;
        for (std::size_t i = 0; i < src.size(); ++i) {
            if (m.refIndex[i] < 0) continue;
            double best = 1.0;
            long bestT = -1;
            for (std::size_t t = 0; t < tx.size(); ++t) {
                const double d = std::hypot(tx[t] - 1.0 - src.x[i], ty[t] - 1.0 - src.y[i]);
                if (d < best) {
                    best = d;
                    bestT = static_cast<long>(t);
                }
            }
            if (bestT < 0 || tRef[bestT] < 0) continue;
            ++checked;
            right += static_cast<std::int64_t>(tRef[bestT]) == ref.id[m.refIndex[i]];
        }
        std::printf(
            "[zeropoint] e2e: %zu sources, %zu refs in frame, %zu matched; %zu of %zu checked matches "
            "agree with the truth\n",
            src.size(), m.nRefInFrame, m.nMatched, right, checked);
        EXPECT_GT(checked, 1000u);
        EXPECT_GE(right, checked - checked / 200);
    }
    const double zpTrue = *sim.header.getDouble("SIMZP");
    const double ctTrue = sim.header.getDouble("SIMCT").value_or(sp.colourTerm);

    const ApertureResult& ap = pr.aperture;
    std::vector<std::uint32_t> flags(src.size());
    for (std::size_t i = 0; i < src.size(); ++i)
        flags[i] = src.flags[i] | ap.flags[i];
    ZeroPointParams p;
    p.fitColourTerm = true;

    // (a) S/N-optimal aperture, corrected to total
    std::vector<double> mOpt(src.size()), eOpt(src.size());
    for (std::size_t i = 0; i < src.size(); ++i) {
        const double f = ap.fluxOpt[i], e = ap.fluxOptErr[i];
        mOpt[i] = f > 0 ? -2.5 * std::log10(f) : std::nan("");
        eOpt[i] = f > 0 ? 1.0857362047581294 * e / f : std::nan("");
    }
    const ZeroPointResult zOpt = fitZeroPoint(mOpt, eOpt, flags, m, ref, p, ctx);
    // (b) the largest fixed aperture, aperture corrected
    const std::size_t rLast = ap.radii.size() - 1;
    std::vector<double> mAp(src.size()), eAp(src.size());
    for (std::size_t i = 0; i < src.size(); ++i) {
        mAp[i] = apertureCorrectedMag(ap, rLast, i);
        const double f = ap.flux[rLast][i];
        eAp[i] = f > 0 ? 1.0857362047581294 * ap.fluxErr[rLast][i] / f : std::nan("");
    }
    const ZeroPointResult zAp = fitZeroPoint(mAp, eAp, flags, m, ref, p, ctx);
    for (const auto& [name, z] :
         {std::pair<const char*, const ZeroPointResult*>{"flux_opt", &zOpt}, {"aper r_max", &zAp}})
        std::printf(
            "[zeropoint] e2e %-10s: zp %.5f +- %.5f (truth %.5f, diff %+.5f), ct %.5f +- %.5f (truth %.3f, "
            "diff %+.5f), %d of %d used, chi2/dof %.2f, sigma_int %.4f, limiting mag %.2f; %s\n",
            name, z->zp, z->zpErr, zpTrue, z->zp - zpTrue, z->colourTerm, z->colourTermErr, ctTrue,
            z->colourTerm - ctTrue, z->nUsed, z->nCandidates, z->chi2dof, z->intrinsicScatter, z->limitingMag,
            z->message.c_str());
    ASSERT_TRUE(zOpt.ok) << zOpt.message;
    ASSERT_TRUE(zAp.ok) << zAp.message;
    EXPECT_NEAR(zOpt.zp, zpTrue, 0.002);
    EXPECT_NEAR(zOpt.colourTerm, ctTrue, 0.005);
    EXPECT_NEAR(zAp.zp, zpTrue, 0.002);
    EXPECT_NEAR(zAp.colourTerm, ctTrue, 0.005);
    EXPECT_LT(zOpt.chi2dof, 1.5); // the error model of stage 4 + the reference errors explain the scatter
    // the limiting magnitude lies beyond the faintest calibrators and short of the simulation's faint end
    EXPECT_GT(zOpt.limitingMag, 18.5);
    EXPECT_LT(zOpt.limitingMag, sp.magFaint);
    // Detection stops near S/N 6 here, so the limit is a short extrapolation. Independent local estimate:
    // each faint source (5.5 <= S/N <= 8) scaled to S/N 5 as a sky-limited star (S/N ∝ flux), median.
    std::vector<double> lim;
    for (std::size_t i = 0; i < src.size(); ++i) {
        if (!(eOpt[i] > 0) || !std::isfinite(mOpt[i])) continue;
        const double s = 1.0857362047581294 / eOpt[i];
        if (s >= 5.5 && s <= 8.0) lim.push_back(mOpt[i] + zOpt.zp + 2.5 * std::log10(s / 5.0));
    }
    ASSERT_GT(lim.size(), 20u);
    std::sort(lim.begin(), lim.end());
    std::printf("[zeropoint] e2e: limiting mag %.3f; local estimate from %zu faint sources %.3f\n",
                zOpt.limitingMag, lim.size(), lim[lim.size() / 2]);
    EXPECT_NEAR(zOpt.limitingMag, lim[lim.size() / 2], 0.1);
}

// A 1024 x 1024 / 1500-star field (colours 0.7 +- 0.3, no colour term in the truth). With a
// colour term forced into the fit, the zero point is the value at colour 0: ȳ - ct c̄, an extrapolation
// 0.7 mag (2.3 colour sigmas) beyond the calibrators' mean colour, whose error is sqrt(1 + c̄²/σ_c²) = 2.5
// times that of the mean and which inherits ct's noise times c̄. The significance test drops the
// insignificant colour term and the zero point is the weighted mean: within the 0.003 bar.
TEST(ZeroPoint, SmallFieldInsignificantColourTermIsDropped) {
    SimParams sp;
    sp.width = 1024;
    sp.height = 1024;
    sp.stars = 1500;
    sp.seed = 11;
    ASSERT_EQ(sp.colourTerm, 0.0);
    const SimResult sim = simulateField(sp);
    const Frame frame = frameFromSimulation(sim);
    ASSERT_TRUE(frame.wcs);
    RunContext ctx;
    const PipelineResult pr = runPipeline(frame, PipelineConfig{}, ctx);
    const Sources& src = pr.detection.sources;
    const ReferenceCatalog ref = test::referenceOf(sim);
    const CrossmatchResult m =
        crossmatch(src.x, src.y, frame.width(), frame.height(), ref, *frame.wcs, CrossmatchParams{}, ctx);
    const double zpTrue = *sim.header.getDouble("SIMZP");
    const ApertureResult& ap = pr.aperture;
    std::vector<std::uint32_t> flags(src.size());
    std::vector<double> mOpt(src.size()), eOpt(src.size());
    for (std::size_t i = 0; i < src.size(); ++i) {
        flags[i] = src.flags[i] | ap.flags[i];
        const double f = ap.fluxOpt[i], e = ap.fluxOptErr[i];
        mOpt[i] = f > 0 ? -2.5 * std::log10(f) : std::nan("");
        eOpt[i] = f > 0 ? 1.0857362047581294 * e / f : std::nan("");
    }
    ZeroPointParams p;
    p.fitColourTerm = true;
    const ZeroPointResult z = fitZeroPoint(mOpt, eOpt, flags, m, ref, p, ctx);
    p.colourTermMinSignificance = 0.0; // forced: no significance test
    const ZeroPointResult forced = fitZeroPoint(mOpt, eOpt, flags, m, ref, p, ctx);
    p.fitColourTerm = false;
    const ZeroPointResult plain = fitZeroPoint(mOpt, eOpt, flags, m, ref, p, ctx);
    for (const auto& [name, r] : {std::pair<const char*, const ZeroPointResult*>{"tested", &z},
                                  {"forced ct", &forced},
                                  {"no ct", &plain}})
        std::printf(
            "[zeropoint] 1024^2 %-9s: zp %.5f +- %.5f (diff %+.5f), ct %.5f +- %.5f, %d of %d used; %s\n",
            name, r->zp, r->zpErr, r->zp - zpTrue, r->colourTerm, r->colourTermErr, r->nUsed, r->nCandidates,
            r->message.c_str());
    ASSERT_TRUE(z.ok && forced.ok && plain.ok);
    ASSERT_TRUE(forced.colourTermFitted);
    // The forced fit's zero point moves with its colour term by -c̄ per unit of ct (the extrapolation):
    // the difference to the plain zero point is explained by ct * (weighted mean colour) to 20%.
    double sw = 0.0, swc = 0.0;
    for (std::size_t k = 0; k < forced.sourceIndex.size(); ++k)
        if (forced.used[k]) {
            const double e = eOpt[forced.sourceIndex[k]];
            const std::int32_t row = m.refIndex[forced.sourceIndex[k]];
            const double re = std::isfinite(ref.magErr[row]) ? ref.magErr[row] : 0.0;
            const double w = 1.0 / (e * e + re * re + forced.intrinsicScatter * forced.intrinsicScatter);
            sw += w;
            swc += w * ref.color[row];
        }
    const double meanColour = swc / sw;
    std::printf(
        "[zeropoint] 1024^2: weighted mean calibrator colour %.3f; forced - plain %.5f, -ct * mean %.5f\n",
        meanColour, forced.zp - plain.zp, -forced.colourTerm * meanColour);
    EXPECT_NEAR(forced.zp - plain.zp, -forced.colourTerm * meanColour,
                0.2 * std::fabs(forced.colourTerm * meanColour) + 0.0005);
    EXPECT_FALSE(z.colourTermFitted) << z.message;
    EXPECT_EQ(z.colourTerm, 0.0);
    EXPECT_NE(z.message.find("not significant"), std::string::npos) << z.message;
    EXPECT_EQ(z.zp, plain.zp);
    // docs/ACCURACY.md's bars are 0.003 up to one star per 1,000 px^2 and 0.01 at one per 300; this field
    // has one per 700. The formal error alone (no curve-of-growth term in this direct call) is 0.0015.
    EXPECT_NEAR(z.zp, zpTrue, 0.003);
    EXPECT_LT(std::fabs(z.zp - zpTrue), 3.0 * z.zpErr + 0.0005);
}

// The error every calibrator shares (the curve of growth's) does not average down: it is added to zpErr in
// quadrature, reported, and a shared error above maxZpErr refuses the zero point.
TEST(ZeroPoint, SharedErrorIsAddedInQuadratureAndCanRefuse) {
    const Synthetic s = makeSynthetic(400, 25.0, 0.0, 0.0, 21);
    RunContext ctx;
    const ZeroPointParams p;
    const ZeroPointResult alone = fitZeroPoint(s.magInst, s.magInstErr, s.flags, s.matches, s.ref, p, ctx);
    const ZeroPointResult shared =
        fitZeroPoint(s.magInst, s.magInstErr, s.flags, s.matches, s.ref, p, ctx, 0.004);
    ASSERT_TRUE(alone.ok && shared.ok);
    EXPECT_EQ(alone.zpErrShared, 0.0);
    EXPECT_EQ(shared.zpErrShared, 0.004);
    EXPECT_EQ(shared.zp, alone.zp);
    EXPECT_NEAR(shared.zpErr, std::hypot(alone.zpErr, 0.004), 1e-12);
    const ZeroPointResult refused =
        fitZeroPoint(s.magInst, s.magInstErr, s.flags, s.matches, s.ref, p, ctx, 0.2);
    EXPECT_FALSE(refused.ok);
    EXPECT_TRUE(std::isnan(refused.zp));
    EXPECT_NE(refused.message.find("shared error 0.2000"), std::string::npos) << refused.message;
    EXPECT_THROW(fitZeroPoint(s.magInst, s.magInstErr, s.flags, s.matches, s.ref, p, ctx, -1.0),
                 InvalidInput);
    ZeroPointParams bad;
    bad.magSource = "kron";
    EXPECT_THROW(fitZeroPoint(s.magInst, s.magInstErr, s.flags, s.matches, s.ref, bad, ctx), InvalidInput);
    nlohmann::json j = ZeroPointParams{};
    EXPECT_EQ(j["magSource"], "auto");
    j["magSource"] = "psf";
    EXPECT_EQ(j.get<ZeroPointParams>().magSource, "psf");
}

// The zero point's map: a plane injected into the calibrators' residuals is recovered within its errors,
// and a flat field's gradient is consistent with zero.
TEST(ZeroPoint, MapRecoversAnInjectedGradient) {
    std::mt19937_64 rng(5);
    std::uniform_real_distribution<double> ux(0.0, 4095.0);
    std::normal_distribution<double> noise(0.0, 0.01);
    for (const double gx : {0.0, 0.004}) {
        ZeroPointResult zp;
        zp.ok = true;
        std::vector<double> x, y;
        for (int k = 0; k < 2000; ++k) {
            x.push_back(ux(rng));
            y.push_back(ux(rng));
            zp.sourceIndex.push_back(k);
            zp.used.push_back(k % 10 != 0);
            // residual = ref - (inst + zp): a zero point growing along +x by gx per 1000 px
            zp.residual.push_back(gx * (x.back() - 2047.5) / 1000.0 - 0.002 * (y.back() - 2047.5) / 1000.0 +
                                  noise(rng));
        }
        fitZeroPointMap(zp, x, y, 4096, 4096);
        ASSERT_TRUE(std::isfinite(zp.gradientX) && zp.gradientXErr > 0.0);
        EXPECT_NEAR(zp.gradientX, gx, 4.0 * zp.gradientXErr);
        EXPECT_NEAR(zp.gradientY, -0.002, 4.0 * zp.gradientYErr);
        EXPECT_LT(zp.gradientXErr, 0.0005); // 1800 calibrators of 0.01 mag over 4 kpx
        ASSERT_EQ(zp.mapNx, 4);
        ASSERT_EQ(zp.map.size(), 16u);
        // the left and right columns of cells differ by the plane: 3 cells of 1024 px apart
        const double left = zp.map[4], right = zp.map[7];
        EXPECT_NEAR(right - left, (gx * 3072.0) / 1000.0, 0.004);
    }
    ZeroPointResult few;
    few.ok = true;
    fitZeroPointMap(few, {}, {}, 100, 100);
    EXPECT_TRUE(std::isnan(few.gradientX));
    EXPECT_EQ(few.mapNx, 0);
}
