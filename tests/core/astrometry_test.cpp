// Stage 7 (astrometry): refinement of a good header WCS, blind solving of wrong or missing ones, SIP
// order selection, failure on a reference catalog of another sky area, and accuracy against the
// simulator's true WCS. Detections are the simulator's truth positions plus Gaussian noise whose
// sigma grows towards faint stars (about 0.01 px bright, 0.1-0.15 px at the faint end).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "core/catalog/reference_catalog.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/simulator.hpp"
#include "core/stages/astrometry/astrometry.hpp"
#include "core/stages/astrometry/astrometry_internal.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/wcs.hpp"
#include "tests/core/test_fields.hpp"

using namespace gpuphot;

namespace {

struct Field {
    SimResult sim;
    ReferenceCatalog ref;
    std::vector<double> x, y, flux;
    std::vector<std::size_t> truthRow; // per detection
};

SimParams baseParams(int size = 1536, int stars = 2000) {
    SimParams p;
    p.width = size;
    p.height = size;
    p.stars = stars;
    p.refMagLimit = 19.0;
    p.refMargin = 0.05;
    p.sipOrder = 3;
    p.sipStrength = 1.5;
    return p;
}

ReferenceCatalog toCatalog(const Table& t) {
    ReferenceCatalog c;
    c.ra = t.doubles("ra");
    c.dec = t.doubles("dec");
    c.mag = t.doubles("mag");
    const std::size_t n = c.ra.size();
    c.magErr.assign(n, NAN);
    c.color.assign(n, NAN);
    c.pmRa.assign(n, NAN);
    c.pmDec.assign(n, NAN);
    for (double id : t.doubles("id"))
        c.id.push_back(static_cast<std::int64_t>(id));
    return c;
}

Field makeField(const SimParams& p, std::uint64_t noiseSeed = 7) {
    Field f;
    f.sim = simulateField(p);
    f.ref = toCatalog(f.sim.reference);
    const auto tx = f.sim.truth.doubles("x"), ty = f.sim.truth.doubles("y"), tf = f.sim.truth.doubles("flux");
    std::mt19937_64 rng(noiseSeed);
    std::normal_distribution<double> g(0.0, 1.0);
    for (std::size_t i = 0; i < tx.size(); ++i) {
        const double x = tx[i] - 1.0, y = ty[i] - 1.0; // truth is 1-based
        if (x < 0 || y < 0 || x > p.width - 1 || y > p.height - 1 || !(tf[i] > 0)) continue;
        const double sigma = std::min(0.5, 0.01 + 2.0 / std::sqrt(tf[i]));
        f.x.push_back(x + sigma * g(rng));
        f.y.push_back(y + sigma * g(rng));
        f.flux.push_back(tf[i]);
        f.truthRow.push_back(i);
    }
    return f;
}

AstrometryResult solve(const Field& f, const Wcs* wcs, std::optional<std::pair<double, double>> pointing,
                       const AstrometryParams& ap = {}) {
    RunContext ctx;
    return solveAstrometry(f.x, f.y, f.flux, f.sim.params.width, f.sim.params.height, f.ref, wcs, pointing,
                           ap, ctx);
}

double truthRms(const AstrometryResult& r, const Field& f) {
    return wcsDifferencePx(f.sim.trueWcs, r.wcs, f.sim.params.width, f.sim.params.height);
}

// Largest SIP displacement (px) of a solution over the frame border and centre lines.
double maxSipShift(const TanSip& w, int width, int height) {
    double m = 0.0;
    for (int i = 0; i <= 20; ++i)
        for (int j = 0; j <= 20; ++j) {
            const double u = (width - 1) * i / 20.0 + 1.0 - w.crpix[0],
                         v = (height - 1) * j / 20.0 + 1.0 - w.crpix[1];
            double du = 0, dv = 0;
            w.distort(u, v, du, dv);
            m = std::max(m, std::hypot(du, dv));
        }
    return m;
}

} // namespace

TEST(Astrometry, RefinesExactHeaderToTruth) {
    const Field f = makeField(baseParams());
    const Wcs header = Wcs::fromHeader(f.sim.header);
    const AstrometryResult r = solve(f, &header, std::nullopt);
    ASSERT_TRUE(r.ok) << r.message;
    EXPECT_EQ(r.method, "refined");
    const double rms = truthRms(r, f);
    std::printf("exact header: truth RMS %.4f px, fit RMS %.4f arcsec (%.4f px), %d/%d used, SIP %d\n", rms,
                r.rmsArcsec, r.rmsPx, r.nUsed, r.nMatched, r.sipOrder);
    EXPECT_LT(rms, 0.02);
    EXPECT_GE(r.sipOrder, 3);
    EXPECT_GT(r.nUsed, 800);
    // Residuals are per match, indices valid, RMS consistent with them.
    ASSERT_EQ(r.sourceIndex.size(), static_cast<std::size_t>(r.nMatched));
    double ss = 0;
    int n = 0;
    for (std::size_t k = 0; k < r.sourceIndex.size(); ++k) {
        ASSERT_LT(static_cast<std::size_t>(r.sourceIndex[k]), f.x.size());
        ASSERT_LT(static_cast<std::size_t>(r.refIndex[k]), f.ref.size());
        if (r.used[k]) {
            ss += r.dxArcsec[k] * r.dxArcsec[k] + r.dyArcsec[k] * r.dyArcsec[k];
            ++n;
        }
    }
    EXPECT_NEAR(std::sqrt(ss / n), r.rmsArcsec, 1e-9);
    // The matched reference star is the detection's own star (the reference's truth_id links them).
    const auto truthId = f.sim.truth.doubles("id");
    const auto refTruthId = f.sim.reference.doubles("truth_id");
    int right = 0;
    for (std::size_t k = 0; k < r.sourceIndex.size(); ++k)
        right += truthId[f.truthRow[r.sourceIndex[k]]] == refTruthId[r.refIndex[k]];
    EXPECT_GT(right, 0.995 * r.nMatched);
}

TEST(Astrometry, RefinesSlightlyWrongHeader) {
    SimParams p = baseParams();
    p.wcsOffset = 0.25;  // arcmin (15 px)
    p.wcsRotation = 0.2; // deg (2.7 px at the corners)
    p.wcsScaleError = 0.002;
    p.headerSip = false;
    const Field f = makeField(p);
    const Wcs header = Wcs::fromHeader(f.sim.header);
    EXPECT_GT(wcsDifferencePx(f.sim.trueWcs, f.sim.headerWcs, p.width, p.height), 5.0);
    const AstrometryResult r = solve(f, &header, std::nullopt);
    ASSERT_TRUE(r.ok) << r.message;
    EXPECT_EQ(r.method, "refined");
    EXPECT_LT(truthRms(r, f), 0.02);
}

// The stars around the frame prepared ahead of the detections (as the pipeline does beside the device
// stages) give the answer of a solve that cuts them itself; a cut for another frame size is not used, and
// a cut that is used is the one prepared (the catalog moved afterwards does not change the answer).
TEST(Astrometry, StarsPreparedAheadGiveTheSameSolution) {
    SimParams p = baseParams();
    p.wcsOffset = 0.25;
    p.headerSip = false;
    Field f = makeField(p);
    const Wcs header = Wcs::fromHeader(f.sim.header);
    RunContext ctx;
    ctx.threads = 2;
    const AstrometryParams ap;
    const std::shared_ptr<const RefinementStars> ahead =
        prepareRefinementStars(f.ref, header, p.width, p.height, ap, 2);
    ASSERT_TRUE(ahead);
    const std::shared_ptr<const RefinementStars> otherSize =
        prepareRefinementStars(f.ref, header, p.width / 2, p.height, ap, 2);
    ASSERT_TRUE(otherSize);
    AstrometryParams blindOnly;
    blindOnly.blind = 1;
    EXPECT_FALSE(prepareRefinementStars(f.ref, header, p.width, p.height, blindOnly, 2));

    const AstrometryResult plain = solve(f, &header, std::nullopt, ap);
    ASSERT_TRUE(plain.ok) << plain.message;
    auto same = [&](const AstrometryResult& r) {
        ASSERT_TRUE(r.ok) << r.message;
        EXPECT_EQ(r.method, plain.method);
        for (int k = 0; k < 2; ++k) {
            EXPECT_EQ(r.wcs.crval[k], plain.wcs.crval[k]);
            EXPECT_EQ(r.wcs.crpix[k], plain.wcs.crpix[k]);
            EXPECT_EQ(r.wcs.cd[k][0], plain.wcs.cd[k][0]);
            EXPECT_EQ(r.wcs.cd[k][1], plain.wcs.cd[k][1]);
        }
        EXPECT_EQ(r.refIndex, plain.refIndex);
        EXPECT_EQ(r.sourceIndex, plain.sourceIndex);
        EXPECT_EQ(r.rmsArcsec, plain.rmsArcsec);
    };
    same(solveAstrometry(f.x, f.y, f.flux, p.width, p.height, f.ref, &header, std::nullopt, ap, ctx,
                         ahead.get()));
    same(solveAstrometry(f.x, f.y, f.flux, p.width, p.height, f.ref, &header, std::nullopt, ap, ctx,
                         otherSize.get()));
    // Every star moved by 2 arcmin after the cut: a solve that cuts the catalog itself now sees another
    // sky, the one handed the prepared cut does not.
    for (double& dec : f.ref.dec)
        dec += 2.0 / 60.0;
    const AstrometryResult moved = solve(f, &header, std::nullopt, ap);
    EXPECT_FALSE(moved.ok && moved.refIndex == plain.refIndex && moved.wcs.crval[1] == plain.wcs.crval[1]);
    same(solveAstrometry(f.x, f.y, f.flux, p.width, p.height, f.ref, &header, std::nullopt, ap, ctx,
                         ahead.get()));
}

TEST(Astrometry, BlindSolvesWrongHeader) {
    SimParams p = baseParams();
    p.seed = 101;
    p.pixelScale = 1.7;
    p.wcsOffset = 50.0;   // arcmin
    p.wcsRotation = -9.0; // deg
    p.wcsScaleError = 0.09;
    p.rotation = 33.0;
    const Field f = makeField(p);
    const Wcs header = Wcs::fromHeader(f.sim.header);
    const AstrometryResult r = solve(f, &header, std::nullopt);
    ASSERT_TRUE(r.ok) << r.message;
    EXPECT_EQ(r.method, "blind");
    std::printf("wrong header: blind solve %.3f s, truth RMS %.4f px\n", r.solveSeconds, truthRms(r, f));
    EXPECT_LT(truthRms(r, f), 0.02);
    // With blind solving switched off the wrong header is not refined into anything.
    AstrometryParams noBlind;
    noBlind.blind = 0;
    const AstrometryResult r0 = solve(f, &header, std::nullopt, noBlind);
    EXPECT_FALSE(r0.ok);
    EXPECT_NE(r0.message.find("refining the header WCS failed"), std::string::npos) << r0.message;
}

TEST(Astrometry, BlindSolvesWithoutWcsFromOffsetPointing) {
    SimParams p = baseParams();
    p.seed = 202;
    p.pixelScale = 6.5;
    p.rotation = 200.0;
    p.flipParity = true;
    p.writeWcs = false;
    const Field f = makeField(p);
    double pra = 0, pdec = 0;
    offsetPosition(p.ra, p.dec, 2.6 * 60.0, 110.0, pra, pdec);
    const AstrometryResult r = solve(f, nullptr, std::make_pair(pra, pdec));
    ASSERT_TRUE(r.ok) << r.message;
    EXPECT_EQ(r.method, "blind");
    std::printf("no WCS, pointing 2.6 deg off: blind solve %.3f s, truth RMS %.4f px\n", r.solveSeconds,
                truthRms(r, f));
    EXPECT_LT(truthRms(r, f), 0.02);
    EXPECT_NEAR(r.wcs.pixelScaleArcsec(), 6.5, 0.01);
}

TEST(Astrometry, BlindSolvesWithoutAnyPointing) {
    SimParams p = baseParams(1024, 1200);
    p.seed = 303;
    p.pixelScale = 0.6;
    p.rotation = 71.0;
    p.writeWcs = false;
    p.ra = 300.0;
    p.dec = -65.0;
    const Field f = makeField(p);
    const AstrometryResult r = solve(f, nullptr, std::nullopt);
    ASSERT_TRUE(r.ok) << r.message;
    EXPECT_LT(truthRms(r, f), 0.03);
}

TEST(Astrometry, FailsOnReferenceCatalogOfAnotherField) {
    SimParams p = baseParams(1024, 1200);
    const Field f = makeField(p);
    SimParams q = p;
    q.ra = 30.0;
    q.dec = -40.0;
    q.seed = 999;
    const Field other = makeField(q);
    Field mixed = f;
    mixed.ref = other.ref;
    const Wcs header = Wcs::fromHeader(f.sim.header);
    AstrometryResult r = solve(mixed, &header, std::nullopt);
    EXPECT_FALSE(r.ok);
    EXPECT_FALSE(r.message.empty());
    // Blind, with the pointing of the other catalogue, scale unknown: still no (wrong) solution.
    r = solve(mixed, nullptr, std::make_pair(q.ra, q.dec));
    EXPECT_FALSE(r.ok) << "wrong WCS accepted: " << r.message;
}

TEST(Astrometry, PicksLowSipOrderWithoutDistortion) {
    SimParams p = baseParams();
    p.sipOrder = 0;
    p.sipStrength = 0.0;
    const Field f = makeField(p);
    const Wcs header = Wcs::fromHeader(f.sim.header);
    const AstrometryResult r = solve(f, &header, std::nullopt);
    ASSERT_TRUE(r.ok) << r.message;
    EXPECT_EQ(r.sipOrder, 2);
    EXPECT_LT(maxSipShift(r.wcs, p.width, p.height), 0.03);
    EXPECT_LT(truthRms(r, f), 0.02);
}

TEST(Astrometry, DeterministicAcrossRunsAndThreads) {
    SimParams p = baseParams(1024, 1200);
    p.writeWcs = false;
    const Field f = makeField(p);
    AstrometryParams ap;
    RunContext c1, c2;
    c1.threads = 1;
    c2.threads = 2;
    const auto a = solveAstrometry(f.x, f.y, f.flux, p.width, p.height, f.ref, nullptr,
                                   std::make_pair(p.ra, p.dec), ap, c1);
    const auto b = solveAstrometry(f.x, f.y, f.flux, p.width, p.height, f.ref, nullptr,
                                   std::make_pair(p.ra, p.dec), ap, c2);
    ASSERT_TRUE(a.ok) << a.message;
    ASSERT_TRUE(b.ok);
    EXPECT_EQ(a.wcs.crval[0], b.wcs.crval[0]);
    EXPECT_EQ(a.wcs.crval[1], b.wcs.crval[1]);
    EXPECT_EQ(a.wcs.cd[0][0], b.wcs.cd[0][0]);
    EXPECT_EQ(a.wcs.a, b.wcs.a);
    EXPECT_EQ(a.wcs.b, b.wcs.b);
    EXPECT_EQ(a.sourceIndex, b.sourceIndex);
    EXPECT_EQ(a.dxArcsec, b.dxArcsec);
}

TEST(Astrometry, RejectsInconsistentInput) {
    ReferenceCatalog ref;
    RunContext ctx;
    EXPECT_THROW(
        solveAstrometry({1.0, 2.0}, {1.0}, {1.0, 1.0}, 100, 100, ref, nullptr, std::nullopt, {}, ctx),
        InvalidInput);
    EXPECT_THROW(solveAstrometry({}, {}, {}, 0, 100, ref, nullptr, std::nullopt, {}, ctx), InvalidInput);
    const auto r = solveAstrometry({}, {}, {}, 100, 100, ref, nullptr, std::nullopt, {}, ctx);
    EXPECT_FALSE(r.ok);
}

TEST(Astrometry, TanSipFromWcsReproducesHeader) {
    const Field f = makeField(baseParams(1024, 300));
    const Wcs header = Wcs::fromHeader(f.sim.header);
    const TanSip t = tanSipFromWcs(header, 1024, 1024);
    EXPECT_LT(wcsDifferencePx(f.sim.headerWcs, t, 1024, 1024), 1e-4);
}

namespace {

// Field i of the blind-solving benchmark: pixel scale log-uniform in 0.5..20 arcsec/px, any rotation
// and parity; even i: a header WCS off by up to 60 arcmin, 10 deg and 10 %; odd i: no WCS, a pointing
// up to 3 deg off (every fourth field: no pointing at all). The solver searches 0.5..20 arcsec/px.
struct BenchCase {
    Field field;
    bool header;
    std::optional<std::pair<double, double>> pointing;
};

BenchCase benchField(int i, int size, int stars, double refMarginDeg) {
    std::mt19937_64 rng(1000 + i);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    SimParams p = baseParams(size, stars);
    p.seed = 5000 + i;
    p.pixelScale = 0.5 * std::pow(40.0, u(rng));
    p.rotation = 360.0 * u(rng);
    p.flipParity = u(rng) < 0.5;
    p.ra = 360.0 * u(rng);
    p.dec = -80.0 + 160.0 * u(rng);
    p.refMargin = refMarginDeg > 0 ? refMarginDeg : 0.02 * p.pixelScale; // default: ~70 px around the frame
    BenchCase c;
    c.header = i % 2 == 0;
    const double offset = u(rng), angle = 360.0 * u(rng), rot = 20.0 * u(rng) - 10.0, sc = 0.2 * u(rng) - 0.1;
    if (c.header) {
        p.wcsOffset = 60.0 * offset;
        p.wcsOffsetAngle = angle;
        p.wcsRotation = rot;
        p.wcsScaleError = sc;
    } else {
        p.writeWcs = false;
    }
    c.field = makeField(p, 77 + i);
    if (!c.header && i % 4 != 3) {
        double pra = 0, pdec = 0;
        offsetPosition(p.ra, p.dec, 180.0 * offset, angle, pra, pdec);
        c.pointing = std::make_pair(pra, pdec);
    }
    return c;
}

void runBench(int n, int size, int stars, double refMarginDeg = 0.0) {
    double worst = 0.0, worstRms = 0.0;
    for (int i = 0; i < n; ++i) {
        const BenchCase c = benchField(i, size, stars, refMarginDeg);
        const auto& p = c.field.sim.params;
        std::optional<Wcs> header;
        if (c.header) header = Wcs::fromHeader(c.field.sim.header);
        const auto t0 = std::chrono::steady_clock::now();
        const AstrometryResult r = solve(c.field, header ? &*header : nullptr, c.pointing);
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ASSERT_TRUE(r.ok) << "field " << i << ": " << r.message;
        const double rms = truthRms(r, c.field);
        std::printf("field %2d: %-7s scale %6.3f\"/px rot %6.1f parity %d %s: %s %.3f s (search %.3f s), "
                    "truth RMS %.4f px, fit %.3f\" SIP %d, %d/%d used\n",
                    i, c.header ? "header" : (c.pointing ? "pointing" : "none"), p.pixelScale, p.rotation,
                    p.flipParity ? 1 : 0, c.header ? "(b)" : "(c)", r.method.c_str(), sec, r.solveSeconds,
                    rms, r.rmsArcsec, r.sipOrder, r.nUsed, r.nMatched);
        EXPECT_EQ(r.method, "blind") << "field " << i;
        EXPECT_LT(rms, 0.02) << "field " << i;
        worst = std::max(worst, sec);
        worstRms = std::max(worstRms, rms);
    }
    std::printf("%d fields (reference margin %.2f deg): slowest %.3f s, worst truth RMS %.4f px\n", n,
                refMarginDeg, worst, worstRms);
}

} // namespace

// Four fields of the benchmark below (CI keeps this fast: 1024x1024 frames).
TEST(Astrometry, BlindSolvesBenchmarkFields) {
    runBench(4, 1024, 1200);
}

// All 20 fields at 2048x2048 with 3000 stars; prints the times (run with --gtest_also_run_disabled_tests).
TEST(Astrometry, DISABLED_BlindSolves20Fields) {
    runBench(20, 2048, 3000);
}

// The same with a reference catalogue reaching 3 deg beyond the frame (the whole search area).
TEST(Astrometry, DISABLED_BlindSolves20FieldsWideReference) {
    runBench(20, 2048, 3000, 3.0);
}

namespace {

// A large synthetic field for the capped/stratified refinement: a 4096^2 frame at 0.8"/px with an order-3
// SIP distortion (up to ~6 px in the corners), `nStars` reference stars uniform over the frame's
// circumscribed circle; detections: every on-frame star (truth + noise growing to 0.1 px for faint ones)
// plus 2% random sources.
struct BigField {
    TanSip truth;
    ReferenceCatalog ref;
    std::vector<double> x, y, flux;
    std::vector<std::int32_t> row; // per detection: its reference row (-1: random source)
};

BigField makeBigField(int nStars, std::uint64_t seed) {
    BigField f;
    const int size = 4096;
    TanSip& t = f.truth;
    t = test::rotatedTanSip(0.5 * (size + 1), 0.5 * (size + 1), 210.0, 54.0, 0.8, 0.4, 3);
    t.coeffA(2, 0) = 3e-7;
    t.coeffA(0, 2) = -2e-7;
    t.coeffB(1, 1) = 2.5e-7;
    t.coeffA(3, 0) = 4e-11;
    t.coeffB(0, 3) = -3e-11;
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::normal_distribution<double> g(0.0, 1.0);
    const double radiusArcmin = 0.8 * size * std::sqrt(0.5) / 60.0 * 1.05;
    for (int i = 0; i < nStars; ++i) {
        double ra = 0, dec = 0;
        offsetPosition(t.crval[0], t.crval[1], radiusArcmin * std::sqrt(u(rng)), 360.0 * u(rng), ra, dec);
        const double mag = 12.0 + 8.0 * std::pow(u(rng), 0.4);
        f.ref.ra.push_back(ra);
        f.ref.dec.push_back(dec);
        f.ref.mag.push_back(mag);
        f.ref.id.push_back(i + 1);
        double x = 0, y = 0;
        if (t.worldToPixel(ra, dec, x, y) && x >= 0 && y >= 0 && x <= size - 1 && y <= size - 1) {
            const double flux = std::pow(10.0, -0.4 * (mag - 25.0));
            const double sigma = std::min(0.1, 0.01 + 30.0 / std::sqrt(flux));
            f.x.push_back(x + sigma * g(rng));
            f.y.push_back(y + sigma * g(rng));
            f.flux.push_back(flux);
            f.row.push_back(i);
        }
    }
    const std::size_t nRandom = f.x.size() / 50;
    for (std::size_t i = 0; i < nRandom; ++i) {
        f.x.push_back((size - 1) * u(rng));
        f.y.push_back((size - 1) * u(rng));
        f.flux.push_back(std::pow(10.0, -0.4 * (20.0 - 25.0)) * (0.5 + u(rng)));
        f.row.push_back(-1);
    }
    const std::size_t n = f.ref.ra.size();
    f.ref.magErr.assign(n, 0.01);
    f.ref.color.assign(n, NAN);
    f.ref.pmRa.assign(n, NAN);
    f.ref.pmDec.assign(n, NAN);
    return f;
}

} // namespace

// The refinement with more detections than kRefineDetCap and more matches than kFinalFitCap (stratified
// subsets in every round, the final fit capped, the fits' sums on blocks in parallel, projections and
// matching in parallel): bit for bit the same with 1 and 2 threads, and within the accuracy bar.
TEST(Astrometry, RefineIsBitwiseTheSameWithOneAndTwoThreads) {
    const BigField f = makeBigField(60000, 31);
    const int size = 4096;
    ASSERT_GT(f.x.size(), astrom::kFinalFitCap + 5000);
    TanSip off = f.truth; // header: 3 px and 0.05 deg off, no SIP
    off.setSipOrder(0);
    off.crpix[0] += 3.0;
    test::rotateCd(off, 0.05 * M_PI / 180.0);
    const Wcs header = Wcs::fromTanSip(off);
    AstrometryParams p;
    p.blind = 0;
    RunContext c1, c2;
    c1.threads = 1;
    c2.threads = 2;
    const AstrometryResult a = solveAstrometry(f.x, f.y, f.flux, size, size, f.ref, &header, {}, p, c1);
    const AstrometryResult b = solveAstrometry(f.x, f.y, f.flux, size, size, f.ref, &header, {}, p, c2);
    ASSERT_TRUE(a.ok) << a.message;
    ASSERT_TRUE(b.ok) << b.message;
    const double truthPx = wcsDifferencePx(f.truth, a.wcs, size, size);
    std::printf(
        "[astrometry] capped refinement: %zu detections, %d matched, %d used, SIP %d, truth RMS %.5f px, "
        "fit RMS %.4f px\n",
        f.x.size(), a.nMatched, a.nUsed, a.sipOrder, truthPx, a.rmsPx);
    EXPECT_LT(truthPx, 0.02);
    EXPECT_GT(a.nMatched, static_cast<int>(astrom::kFinalFitCap)); // every detection was matched in the end
    EXPECT_GT(a.nUsed, static_cast<int>(0.97 * a.nMatched));       // judged beyond the fitted subset too
    test::expectSameFit(a.wcs, b.wcs);
    EXPECT_EQ(a.sipOrder, b.sipOrder);
    EXPECT_EQ(a.sourceIndex, b.sourceIndex);
    EXPECT_EQ(a.refIndex, b.refIndex);
    EXPECT_EQ(a.dxArcsec, b.dxArcsec);
    EXPECT_EQ(a.dyArcsec, b.dyArcsec);
    EXPECT_EQ(a.used, b.used);
    EXPECT_EQ(a.rmsArcsec, b.rmsArcsec);
    EXPECT_EQ(a.chanceMatches, b.chanceMatches);
    // Every match pairs a detection with its own star.
    int right = 0;
    for (std::size_t k = 0; k < a.sourceIndex.size(); ++k)
        right += f.row[a.sourceIndex[k]] == a.refIndex[k];
    EXPECT_GT(right, 0.995 * a.nMatched);
}

// The final fit's cap: an order-3 TAN+SIP fitted to a stratified 20,000 of ~45,000 matches agrees with
// the fit to all of them far below the 0.02 px bar (30 coefficients per axis at most are pinned by
// 20,000 well-spread stars), and both agree with the truth.
TEST(Astrometry, CappedStratifiedFitAgreesWithTheFullFit) {
    const BigField f = makeBigField(80000, 32);
    const int size = 4096;
    std::vector<double> x, y, ra, dec, w;
    for (std::size_t i = 0; i < f.x.size(); ++i)
        if (f.row[i] >= 0) {
            x.push_back(f.x[i]);
            y.push_back(f.y[i]);
            ra.push_back(f.ref.ra[f.row[i]]);
            dec.push_back(f.ref.dec[f.row[i]]);
            const double sigma = std::min(0.1, 0.01 + 30.0 / std::sqrt(f.flux[i]));
            w.push_back(1.0 / (sigma * sigma));
        }
    ASSERT_GT(x.size(), 2 * astrom::kFinalFitCap);
    const std::vector<std::size_t> pick = astrom::stratifiedSubset(x, y, size, size, astrom::kFinalFitCap);
    ASSERT_EQ(pick.size(), astrom::kFinalFitCap);
    std::vector<double> sx, sy, sra, sdec, sw;
    for (std::size_t i : pick) {
        sx.push_back(x[i]);
        sy.push_back(y[i]);
        sra.push_back(ra[i]);
        sdec.push_back(dec[i]);
        sw.push_back(w[i]);
    }
    const double crpix[2] = {0.5 * (size + 1), 0.5 * (size + 1)};
    TanSip all, capped;
    for (int order : {3, 4}) {
        ASSERT_TRUE(astrom::fitTanSip(x, y, ra, dec, w, crpix, f.truth.crval, order, all, nullptr, 2));
        ASSERT_TRUE(
            astrom::fitTanSip(sx, sy, sra, sdec, sw, crpix, f.truth.crval, order, capped, nullptr, 2));
        const double diff = wcsDifferencePx(all, capped, size, size);
        const double tAll = wcsDifferencePx(f.truth, all, size, size);
        const double tCap = wcsDifferencePx(f.truth, capped, size, size);
        std::printf(
            "[astrometry] order %d: %zu matches vs stratified %zu: fits differ by %.5f px RMS; truth RMS "
            "%.5f (all) %.5f (capped) px\n",
            order, x.size(), sx.size(), diff, tAll, tCap);
        EXPECT_LT(diff, 0.004);
        EXPECT_LT(tAll, 0.004);
        EXPECT_LT(tCap, 0.005);
    }
}

TEST(Astrometry, StratifiedSubsetIsSpreadBrightestFirstAndDeterministic) {
    std::mt19937_64 rng(5);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    const int size = 1000;
    std::vector<double> x, y;
    for (int i = 0; i < 30000; ++i) { // three quarters of the items crowd into one quadrant
        const bool crowd = i % 4 != 0;
        x.push_back((crowd ? 0.5 : 1.0) * (size - 1) * u(rng));
        y.push_back((crowd ? 0.5 : 1.0) * (size - 1) * u(rng));
    }
    const std::size_t cap = 4000;
    const std::vector<std::size_t> a = astrom::stratifiedSubset(x, y, size, size, cap);
    EXPECT_EQ(a, astrom::stratifiedSubset(x, y, size, size, cap));
    ASSERT_EQ(a.size(), cap);
    EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
    EXPECT_TRUE(std::adjacent_find(a.begin(), a.end()) == a.end());
    // Quadrants: evenly spread (the crowded one holds 75% of the input but about 25% of the subset).
    int quad[4] = {0, 0, 0, 0};
    for (std::size_t i : a)
        ++quad[(x[i] >= 0.5 * size ? 1 : 0) + (y[i] >= 0.5 * size ? 2 : 0)];
    for (int q = 0; q < 4; ++q)
        EXPECT_NEAR(quad[q], cap / 4.0, cap * 0.03) << q;
    // Within a cell the first (brightest) items are taken: an item is only taken when every earlier item
    // of its cell is (16x16 cells at this cap).
    const int g = 16;
    std::vector<char> taken(x.size(), 0);
    for (std::size_t i : a)
        taken[i] = 1;
    std::vector<char> cellSkipped(g * g, 0);
    for (std::size_t i = 0; i < x.size(); ++i) {
        const int c = std::min(g - 1, static_cast<int>((y[i] + 0.5) / size * g)) * g +
                      std::min(g - 1, static_cast<int>((x[i] + 0.5) / size * g));
        if (!taken[i])
            cellSkipped[c] = 1;
        else
            EXPECT_FALSE(cellSkipped[c]) << i;
    }
    // Fewer items than the cap: all of them.
    const std::vector<double> sx(x.begin(), x.begin() + 100), sy(y.begin(), y.begin() + 100);
    EXPECT_EQ(astrom::stratifiedSubset(sx, sy, size, size, cap).size(), 100u);
}
