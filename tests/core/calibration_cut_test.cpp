// Calibration speed-ups must not change results: the per-frame reference cut (cutReferenceToFrame), the
// prefiltered pixel matching of stage 7 (matchInPixels against brute force), the radix sort of (key, row)
// pairs (sortByKey against std::sort), the astrometric refinement on a catalog covering far more sky than the
// frame (full catalog vs cut catalog, 1 vs 2 threads) and its skip of the rounds left at a fixed point.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>
#include <random>

#include "core/catalog/reference_catalog.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/simulator.hpp"
#include "core/stages/astrometry/astrometry.hpp"
#include "core/stages/astrometry/astrometry_internal.hpp"
#include "core/stages/crossmatch/crossmatch.hpp"
#include "core/wcs/tan_sip.hpp"
#include "core/wcs/wcs.hpp"
#include "tests/core/test_fields.hpp"

using namespace gpuphot;

namespace {

constexpr int kSize = 1024;

TanSip frameWcs() {
    TanSip t = test::rotatedTanSip(512.5, 512.5, 40.0, -25.0, 1.0, 0.3, 2);
    t.coeffA(2, 0) = 2e-6;
    t.coeffB(0, 2) = -1.5e-6;
    return t;
}

// 100000 stars uniform over a 1-degree cap around the frame (a 17' field): most lie far off the frame.
// Detections: the on-frame stars (0.05 px noise) plus 300 random ones.
struct Field {
    ReferenceCatalog ref;
    std::vector<double> x, y, flux;
};

Field makeField(const TanSip& t) {
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    std::normal_distribution<double> g(0.0, 1.0);
    Field f;
    for (int i = 0; i < 100000; ++i) {
        double ra = 0, dec = 0;
        offsetPosition(t.crval[0], t.crval[1], 60.0 * std::sqrt(u(rng)), 360.0 * u(rng), ra, dec);
        f.ref.ra.push_back(ra);
        f.ref.dec.push_back(dec);
        f.ref.mag.push_back(12.0 + 7.0 * u(rng));
        f.ref.magErr.push_back(0.01);
        f.ref.color.push_back(NAN);
        f.ref.pmRa.push_back(NAN);
        f.ref.pmDec.push_back(NAN);
        f.ref.id.push_back(i + 1);
        double x = 0, y = 0;
        if (t.worldToPixel(ra, dec, x, y) && x >= 0 && y >= 0 && x <= kSize - 1 && y <= kSize - 1) {
            f.x.push_back(x + 0.05 * g(rng));
            f.y.push_back(y + 0.05 * g(rng));
            f.flux.push_back(std::pow(10.0, -0.4 * (f.ref.mag.back() - 25.0)));
        }
    }
    for (int i = 0; i < 300; ++i) {
        f.x.push_back((kSize - 1) * u(rng));
        f.y.push_back((kSize - 1) * u(rng));
        f.flux.push_back(100.0 * u(rng) + 1.0);
    }
    return f;
}

} // namespace

TEST(CalibrationCut, CutKeepsEveryStarNearTheFrameAndCrossmatchIsUnchanged) {
    const TanSip t = frameWcs();
    const Wcs wcs = Wcs::fromTanSip(t);
    const Field f = makeField(t);
    std::vector<std::int32_t> rows;
    const double margin = 60.0;
    const ReferenceCatalog cut = cutReferenceToFrame(f.ref, wcs, kSize, kSize, margin, &rows);
    ASSERT_EQ(rows.size(), cut.size());
    EXPECT_LT(cut.size(), f.ref.size() / 10); // the frame is a small part of the cap
    // Every star within `margin` arcsec (60 px) of the frame's edges is kept (checked by projection).
    std::vector<char> kept(f.ref.size(), 0);
    for (std::int32_t r : rows)
        kept[r] = 1;
    for (std::size_t i = 0; i < f.ref.size(); ++i) {
        double x = 0, y = 0;
        if (!t.worldToPixel(f.ref.ra[i], f.ref.dec[i], x, y)) continue;
        const double dx = std::max({0.0, -0.5 - x, x - (kSize - 0.5)});
        const double dy = std::max({0.0, -0.5 - y, y - (kSize - 0.5)});
        if (std::hypot(dx, dy) <= 59.0) EXPECT_TRUE(kept[i]) << i; // 1"/px (the SIP terms are tiny)
    }
    for (std::size_t k = 0; k < cut.size(); ++k) {
        EXPECT_EQ(cut.ra[k], f.ref.ra[rows[k]]);
        EXPECT_EQ(cut.id[k], f.ref.id[rows[k]]);
    }
    RunContext ctx;
    const CrossmatchParams p;
    const CrossmatchResult a = crossmatch(f.x, f.y, kSize, kSize, f.ref, wcs, p, ctx);
    const CrossmatchResult b = crossmatch(f.x, f.y, kSize, kSize, cut, wcs, p, ctx);
    ASSERT_EQ(a.refIndex.size(), b.refIndex.size());
    EXPECT_GT(a.nMatched, 1000u);
    EXPECT_EQ(a.nMatched, b.nMatched);
    EXPECT_EQ(a.nRefInFrame, b.nRefInFrame);
    for (std::size_t i = 0; i < a.refIndex.size(); ++i) {
        EXPECT_EQ(a.refIndex[i], b.refIndex[i] < 0 ? -1 : rows[b.refIndex[i]]) << i;
        if (a.refIndex[i] >= 0) EXPECT_EQ(a.separationArcsec[i], b.separationArcsec[i]);
    }
}

TEST(CalibrationCut, RefinementIsTheSameOnTheCutCatalogAndForAnyThreadCount) {
    const TanSip t = frameWcs();
    const Field f = makeField(t);
    TanSip off = t; // header 4 px and 0.05 deg off
    off.crpix[0] += 4.0;
    test::rotateCd(off, 0.05 * M_PI / 180.0);
    const Wcs header = Wcs::fromTanSip(off);
    std::vector<std::int32_t> rows;
    const ReferenceCatalog cut = cutReferenceToFrame(f.ref, header, kSize, kSize, 120.0, &rows);
    AstrometryParams p;
    p.blind = 0;
    RunContext c1, c2;
    c1.threads = 1;
    c2.threads = 2;
    const AstrometryResult a = solveAstrometry(f.x, f.y, f.flux, kSize, kSize, f.ref, &header, {}, p, c1);
    const AstrometryResult b = solveAstrometry(f.x, f.y, f.flux, kSize, kSize, cut, &header, {}, p, c2);
    ASSERT_TRUE(a.ok) << a.message;
    ASSERT_TRUE(b.ok) << b.message;
    EXPECT_LT(wcsDifferencePx(t, a.wcs, kSize, kSize), 0.02); // against the truth
    test::expectSameFit(a.wcs, b.wcs);
    EXPECT_EQ(a.nUsed, b.nUsed);
    ASSERT_EQ(a.refIndex.size(), b.refIndex.size());
    for (std::size_t k = 0; k < a.refIndex.size(); ++k) {
        EXPECT_EQ(a.sourceIndex[k], b.sourceIndex[k]);
        EXPECT_EQ(a.refIndex[k], rows[b.refIndex[k]]);
    }
}

namespace {

// The field's detections brightest first and its reference stars by magnitude, as the driver prepares them.
astrom::Detections detectionsOf(const Field& f) {
    std::vector<std::int32_t> order(f.x.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return f.flux[a] > f.flux[b]; });
    astrom::Detections d;
    d.width = d.height = kSize;
    for (std::int32_t i : order) {
        d.x.push_back(f.x[i]);
        d.y.push_back(f.y[i]);
        d.flux.push_back(f.flux[i]);
        d.index.push_back(i);
    }
    return d;
}

astrom::RefStars refStarsOf(const ReferenceCatalog& ref) {
    std::vector<std::int32_t> order(ref.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return ref.mag[a] < ref.mag[b]; });
    astrom::RefStars r;
    for (std::int32_t i : order) {
        r.ra.push_back(ref.ra[i]);
        r.dec.push_back(ref.dec[i]);
        r.mag.push_back(ref.mag[i]);
        r.xyz.push_back(astrom::unitVector(ref.ra[i], ref.dec[i]));
        r.index.push_back(i);
    }
    return r;
}

} // namespace

// Once an intermediate round returns the WCS it started from bit for bit, the refinement goes straight to
// the final round: the outcome must be what running every round gives, and the skip must have happened.
TEST(CalibrationCut, RefinementSkipsRoundsAtAFixedPointWithTheSameOutcome) {
    const TanSip t = frameWcs();
    const Field f = makeField(t);
    TanSip off = t;
    off.crpix[0] += 4.0;
    test::rotateCd(off, 0.05 * M_PI / 180.0);
    const astrom::Detections det = detectionsOf(f);
    const astrom::RefStars refs = refStarsOf(f.ref);
    AstrometryParams p;
    p.iterations = 7;
    const astrom::RefineOutcome a = astrom::refine(det, refs, nullptr, off, 30.0, true, p, 2, true);
    const astrom::RefineOutcome b = astrom::refine(det, refs, nullptr, off, 30.0, true, p, 2, false);
    ASSERT_TRUE(a.ok) << a.why;
    ASSERT_TRUE(b.ok) << b.why;
    EXPECT_EQ(b.rounds, 7);
    EXPECT_LT(a.rounds, 7); // the fixed point was reached and rounds were skipped
    EXPECT_LT(wcsDifferencePx(t, a.wcs, kSize, kSize), 0.02);
    test::expectSameFit(a.wcs, b.wcs);
    EXPECT_EQ(a.wcs.crpix[0], b.wcs.crpix[0]);
    EXPECT_EQ(a.wcs.crpix[1], b.wcs.crpix[1]);
    EXPECT_EQ(a.sipOrder, b.sipOrder);
    EXPECT_EQ(a.nUsed, b.nUsed);
    EXPECT_EQ(a.used, b.used);
    ASSERT_EQ(a.matches.size(), b.matches.size());
    for (std::size_t k = 0; k < a.matches.size(); ++k) {
        EXPECT_EQ(a.matches[k].det, b.matches[k].det);
        EXPECT_EQ(a.matches[k].ref, b.matches[k].ref);
        EXPECT_EQ(a.matches[k].dist, b.matches[k].dist);
    }
}

namespace {

// nDet detections against nStars stars over 2000 x 2000 px: two of every three near a star (so that stars
// are claimed twice), the rest anywhere. matchInPixels must give the brute-force one-to-one matches.
void expectPixelMatchingEqualsBruteForce(int nStars, int nDet, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> u(0.0, 2000.0), j(-2.5, 2.5);
    astrom::Detections det;
    std::vector<double> rx, ry;
    std::vector<std::int32_t> ids;
    for (int i = 0; i < nStars; ++i) {
        rx.push_back(u(rng));
        ry.push_back(u(rng));
        ids.push_back(1000 + i);
    }
    for (int i = 0; i < nDet; ++i) {
        const int k = static_cast<int>((static_cast<long long>(i) * 241) % nStars);
        det.x.push_back(i % 3 ? rx[k] + j(rng) : u(rng));
        det.y.push_back(i % 3 ? ry[k] + j(rng) : u(rng));
        det.flux.push_back(1.0);
        det.index.push_back(i);
    }
    const double radius = 3.0;
    const std::vector<astrom::Match> m =
        astrom::matchInPixels(det, det.size(), rx, ry, ids, rx.size(), radius, 2);
    // Brute force: nearest star per detection within the radius; a star claimed twice goes to the closest.
    std::vector<astrom::Match> cand;
    std::map<int, std::vector<std::size_t>> claims; // star -> its candidates
    for (std::size_t i = 0; i < det.size(); ++i) {
        double best = INFINITY;
        int bj = -1;
        for (std::size_t k = 0; k < rx.size(); ++k) {
            const double d = std::hypot(rx[k] - det.x[i], ry[k] - det.y[i]);
            if (d < best) {
                best = d;
                bj = static_cast<int>(k);
            }
        }
        if (best > radius) continue;
        claims[bj].push_back(cand.size());
        cand.push_back({static_cast<std::int32_t>(i), bj, best});
    }
    std::vector<astrom::Match> expect;
    std::size_t contested = 0;
    for (const auto& c : cand) {
        bool win = true;
        for (std::size_t o : claims[c.ref])
            if (cand[o].dist < c.dist || (cand[o].dist == c.dist && cand[o].det < c.det)) win = false;
        contested += claims[c.ref].size() > 1;
        if (win) expect.push_back({c.det, ids[c.ref], c.dist});
    }
    ASSERT_EQ(m.size(), expect.size());
    EXPECT_GT(m.size(), static_cast<std::size_t>(nDet) / 2);
    if (nDet > 1000) EXPECT_GT(contested, 10u);
    for (std::size_t k = 0; k < m.size(); ++k) {
        EXPECT_EQ(m[k].det, expect[k].det);
        EXPECT_EQ(m[k].ref, expect[k].ref);
        EXPECT_NEAR(m[k].dist, expect[k].dist, 1e-12);
    }
}

} // namespace

TEST(CalibrationCut, PrefilteredPixelMatchingEqualsBruteForce) {
    // 200 detections against 50000 stars: the grid prefilter is active (stars >> detections).
    expectPixelMatchingEqualsBruteForce(50000, 200, 3);
    // 6000 detections against 8000 stars: many stars claimed twice.
    expectPixelMatchingEqualsBruteForce(8000, 6000, 4);
}

// sortByKey must give exactly what std::sort gives for (key, row) pairs in ascending row order: keys with
// ties and both zeros, in random, ascending (the early return) and descending order, below and above the
// size where the radix sort takes over.
TEST(CalibrationCut, SortByKeyEqualsStdSort) {
    std::mt19937_64 rng(11);
    std::uniform_int_distribution<int> pick(0, 300);
    for (std::size_t n : {std::size_t{100}, std::size_t{5000}, std::size_t{70000}}) {
        std::vector<double> keys(n);
        for (double& k : keys) {
            const int v = pick(rng);
            k = v == 0 ? -0.0 : (v == 1 ? 0.0 : (v - 150) * 0.37 + (v % 7 ? 1e-9 * v : 0.0));
        }
        for (int order = 0; order < 3; ++order) {
            std::vector<double> k = keys;
            if (order == 1) std::sort(k.begin(), k.end());
            if (order == 2) std::sort(k.begin(), k.end(), std::greater<>());
            std::vector<std::pair<double, std::int32_t>> v(n);
            for (std::size_t i = 0; i < n; ++i)
                v[i] = {k[i], static_cast<std::int32_t>(i)};
            std::vector<std::pair<double, std::int32_t>> expect = v;
            std::sort(expect.begin(), expect.end());
            astrom::sortByKey(v);
            ASSERT_EQ(v.size(), expect.size());
            for (std::size_t i = 0; i < n; ++i) {
                ASSERT_EQ(v[i].second, expect[i].second) << "n " << n << " order " << order << " at " << i;
                ASSERT_EQ(v[i].first, expect[i].first);
                ASSERT_FALSE(std::signbit(v[i].first) && v[i].first == 0.0) << "-0 must come back as +0";
            }
        }
    }
}
