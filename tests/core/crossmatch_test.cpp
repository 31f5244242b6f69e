// Stage 5 (crossmatch): synthetic sources and reference stars on a TAN-SIP field, compared with the
// truth and with a brute-force search through the closed-form TanSip (independent of WCSLIB).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include <nlohmann/json.hpp>

#include "core/catalog/reference_catalog.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/simulator.hpp"
#include "core/stages/crossmatch/crossmatch.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/tan_sip.hpp"
#include "core/wcs/wcs.hpp"

using namespace gpuphot;

namespace {

constexpr int kW = 1024, kH = 1024;

// 0.5 arcsec/px, rotated by 20 deg, mild SIP distortion (about 1.5 px at the corners).
TanSip makeTanSip() {
    TanSip t;
    t.crpix[0] = 500.5;
    t.crpix[1] = 530.5;
    t.crval[0] = 150.0;
    t.crval[1] = 20.0;
    const double s = 0.5 / 3600.0, a = 20.0 * M_PI / 180.0;
    t.cd[0][0] = -s * std::cos(a);
    t.cd[0][1] = s * std::sin(a);
    t.cd[1][0] = s * std::sin(a);
    t.cd[1][1] = s * std::cos(a);
    t.setSipOrder(2);
    t.coeffA(2, 0) = 2e-6;
    t.coeffA(1, 1) = -1e-6;
    t.coeffB(0, 2) = 1.5e-6;
    return t;
}

void addRef(ReferenceCatalog& c, double ra, double dec, double mag) {
    c.ra.push_back(ra);
    c.dec.push_back(dec);
    c.mag.push_back(mag);
    c.magErr.push_back(0.01);
    c.color.push_back(0.5);
    c.pmRa.push_back(std::nan(""));
    c.pmDec.push_back(std::nan(""));
    c.id.push_back(static_cast<std::int64_t>(c.ra.size()));
}

void addRefAtPixel(ReferenceCatalog& c, const TanSip& t, double x, double y, double mag = 15.0) {
    double ra, dec;
    t.pixelToWorld(x, y, ra, dec);
    addRef(c, ra, dec, mag);
}

// Pixel position of a point `arcsec` away from reference row r towards position angle pa.
void pixelNear(const ReferenceCatalog& c, const TanSip& t, std::size_t r, double arcsec, double pa, double& x,
               double& y) {
    double ra, dec;
    offsetPosition(c.ra[r], c.dec[r], arcsec / 60.0, pa, ra, dec);
    ASSERT_TRUE(t.worldToPixel(ra, dec, x, y));
}

RunContext context(int threads) {
    RunContext ctx;
    ctx.threads = threads;
    return ctx;
}

} // namespace

TEST(Crossmatch, ExactRecoveryOfShuffledSources) {
    const TanSip t = makeTanSip();
    const Wcs wcs = Wcs::fromTanSip(t);
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<double> ux(0.0, kW - 1.0), uy(0.0, kH - 1.0);
    std::normal_distribution<double> jitter(0.0, 0.05);
    ReferenceCatalog ref;
    std::vector<double> px, py;
    for (int i = 0; i < 400; ++i) {
        // keep the stars at least 8 px apart so that each one's own source is unambiguous
        const double x = ux(rng), y = uy(rng);
        bool close = false;
        for (std::size_t k = 0; k < px.size(); ++k)
            close |= std::hypot(px[k] - x, py[k] - y) < 8.0;
        if (close) continue;
        px.push_back(x);
        py.push_back(y);
        addRefAtPixel(ref, t, x, y, 12.0 + 0.01 * i);
    }
    // sources: the reference stars in reverse order, jittered by 0.05 px
    std::vector<double> sx, sy;
    for (std::size_t k = px.size(); k-- > 0;) {
        sx.push_back(px[k] + jitter(rng));
        sy.push_back(py[k] + jitter(rng));
    }
    RunContext ctx = context(2);
    const CrossmatchResult r = crossmatch(sx, sy, kW, kH, ref, wcs, CrossmatchParams{}, ctx);
    const std::size_t n = px.size();
    ASSERT_EQ(r.refIndex.size(), n);
    EXPECT_EQ(r.nMatched, n);
    EXPECT_EQ(r.nRefInFrame, n);
    for (std::size_t i = 0; i < n; ++i) {
        EXPECT_EQ(r.refIndex[i], static_cast<std::int32_t>(n - 1 - i)) << "source " << i;
        // independent separation: TanSip closed form + great circle
        double ra, dec;
        t.pixelToWorld(sx[i], sy[i], ra, dec);
        const double sep = angularSeparationDeg(ra, dec, ref.ra[n - 1 - i], ref.dec[n - 1 - i]) * 3600.0;
        EXPECT_NEAR(r.separationArcsec[i], sep, 1e-6);
        EXPECT_LT(r.separationArcsec[i], 0.3);
    }
}

TEST(Crossmatch, RadiusIsRespected) {
    const TanSip t = makeTanSip();
    const Wcs wcs = Wcs::fromTanSip(t);
    ReferenceCatalog ref;
    std::vector<double> sx, sy, offsets;
    // a grid of reference stars 60 px (30") apart; one source per star at a known angular offset
    for (int gy = 0; gy < 8; ++gy)
        for (int gx = 0; gx < 8; ++gx)
            addRefAtPixel(ref, t, 100.0 + 110.0 * gx, 90.0 + 115.0 * gy);
    for (std::size_t r = 0; r < ref.size(); ++r) {
        const double off = 0.25 + 0.05 * static_cast<double>(r); // 0.25 .. 3.4 arcsec
        double x, y;
        pixelNear(ref, t, r, off, 37.0 * static_cast<double>(r), x, y);
        sx.push_back(x);
        sy.push_back(y);
        offsets.push_back(off);
    }
    CrossmatchParams p;
    p.radiusArcsec = 2.0;
    RunContext ctx = context(1);
    const CrossmatchResult r = crossmatch(sx, sy, kW, kH, ref, wcs, p, ctx);
    std::size_t expected = 0;
    for (std::size_t i = 0; i < sx.size(); ++i) {
        if (std::fabs(offsets[i] - 2.0) < 1e-3) continue; // too close to the edge of the radius to call
        if (offsets[i] < 2.0) {
            ++expected;
            EXPECT_EQ(r.refIndex[i], static_cast<std::int32_t>(i));
            EXPECT_NEAR(r.separationArcsec[i], offsets[i], 1e-4);
        } else {
            EXPECT_EQ(r.refIndex[i], -1) << "offset " << offsets[i];
            EXPECT_TRUE(std::isnan(r.separationArcsec[i]));
        }
    }
    EXPECT_GE(r.nMatched, expected);
    EXPECT_LE(r.nMatched, expected + 1);
}

TEST(Crossmatch, OneToOneConflictsGoToTheClosest) {
    const TanSip t = makeTanSip();
    const Wcs wcs = Wcs::fromTanSip(t);
    ReferenceCatalog ref;
    addRefAtPixel(ref, t, 300.0, 300.0); // 0: claimed by sources 0 (1.0") and 1 (0.4")
    addRefAtPixel(ref, t, 300.0, 303.0); // 1: 1.5" from ref 0; source 0's second choice
    addRefAtPixel(ref, t, 700.0, 700.0); // 2: two identical sources (3, 4): the lower index wins
    std::vector<double> sx(5), sy(5);
    // source 0 between ref 0 and ref 1 but nearer ref 0
    sx[0] = 300.0;
    sy[0] = 301.2; // 0.6" from ref 0, 0.9" from ref 1
    sx[1] = 300.0;
    sy[1] = 299.6; // 0.2" from ref 0
    sx[2] = 900.0;
    sy[2] = 100.0; // nothing near
    sx[3] = sx[4] = 700.5;
    sy[3] = sy[4] = 700.0;
    RunContext ctx = context(2);
    CrossmatchResult r = crossmatch(sx, sy, kW, kH, ref, wcs, CrossmatchParams{}, ctx);
    EXPECT_EQ(r.refIndex[1], 0);
    EXPECT_EQ(r.refIndex[0], 1); // lost ref 0, took its next candidate
    EXPECT_NEAR(r.separationArcsec[0], 0.9, 0.02);
    EXPECT_EQ(r.refIndex[2], -1);
    EXPECT_EQ(r.refIndex[3], 2);
    EXPECT_EQ(r.refIndex[4], -1); // identical separation: lower source index keeps it
    EXPECT_EQ(r.nMatched, 3u);

    CrossmatchParams many;
    many.oneToOne = false;
    r = crossmatch(sx, sy, kW, kH, ref, wcs, many, ctx);
    EXPECT_EQ(r.refIndex[0], 0); // nearest, shared
    EXPECT_EQ(r.refIndex[1], 0);
    EXPECT_EQ(r.refIndex[3], 2);
    EXPECT_EQ(r.refIndex[4], 2);
    EXPECT_EQ(r.nMatched, 4u);

    // a source left without a second candidate gets none
    const std::vector<double> ox{300.0, 300.0}, oy{298.8, 299.6};
    r = crossmatch(ox, oy, kW, kH, ref, wcs, CrossmatchParams{}, ctx);
    EXPECT_EQ(r.refIndex[1], 0);
    EXPECT_EQ(r.refIndex[0], -1);
}

TEST(Crossmatch, ReferencesOutsideTheFrameOrMagnitudeRangeAreIgnored) {
    const TanSip t = makeTanSip();
    const Wcs wcs = Wcs::fromTanSip(t);
    ReferenceCatalog ref;
    addRefAtPixel(ref, t, -2.0, 100.0);        // 0: inside the 10 px margin, outside the frame
    addRefAtPixel(ref, t, -30.0, 200.0);       // 1: beyond the margin
    addRefAtPixel(ref, t, 500.0, 500.0, 9.0);  // 2: too bright for the cut below
    addRefAtPixel(ref, t, 600.0, 600.0, 21.0); // 3: too faint
    addRefAtPixel(ref, t, 400.0, 400.0, 15.0); // 4: fine
    addRef(ref, 330.0, -20.0, 15.0);           // 5: other side of the sky
    addRef(ref, 150.0, 20.5, 15.0);            // 6: half a degree away
    const std::vector<double> sx{-0.4, -29.6, 500.0, 600.0, 400.2}, sy{100.0, 200.0, 500.0, 600.0, 400.0};
    CrossmatchParams p;
    p.refMagBright = 10.0;
    p.refMagFaint = 20.0;
    RunContext ctx = context(1);
    const CrossmatchResult r = crossmatch(sx, sy, kW, kH, ref, wcs, p, ctx);
    EXPECT_EQ(r.refIndex, (std::vector<std::int32_t>{0, -1, -1, -1, 4}));
    EXPECT_EQ(r.refSelected, (std::vector<std::int32_t>{0, 4}));
    EXPECT_EQ(r.nRefInFrame, 1u);
    ASSERT_EQ(r.refX.size(), 2u);
    EXPECT_NEAR(r.refX[0], -2.0, 1e-6);
    EXPECT_NEAR(r.refY[1], 400.0, 1e-6);

    EXPECT_THROW(crossmatch({1.0}, {}, kW, kH, ref, wcs, p, ctx), InvalidInput);
    p.radiusArcsec = 0.0;
    EXPECT_THROW(crossmatch(sx, sy, kW, kH, ref, wcs, p, ctx), InvalidInput);
}

TEST(Crossmatch, ThreadCountDoesNotChangeTheResultAndMatchesBruteForce) {
    const TanSip t = makeTanSip();
    const Wcs wcs = Wcs::fromTanSip(t);
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<double> ux(-20.0, kW + 20.0), uy(-20.0, kH + 20.0);
    std::normal_distribution<double> jitter(0.0, 2.0);
    ReferenceCatalog ref;
    std::vector<double> sx, sy;
    // dense: 6000 stars on 1 Mpx with 2 px jitter and a 2" (4 px) radius: many conflicts
    for (int i = 0; i < 6000; ++i) {
        const double x = ux(rng), y = uy(rng);
        addRefAtPixel(ref, t, x, y, 14.0 + 1e-4 * i);
        const double jx = x + jitter(rng), jy = y + jitter(rng);
        // sources inside the frame only (references out to 20 px beyond it: > 5" from any of them)
        if (i % 5 != 0 && jx >= 0.0 && jy >= 0.0 && jx <= kW - 1.0 && jy <= kH - 1.0) {
            sx.push_back(jx);
            sy.push_back(jy);
        }
    }
    for (bool oneToOne : {true, false}) {
        CrossmatchParams p;
        p.oneToOne = oneToOne;
        RunContext c1 = context(1), c2 = context(2);
        const CrossmatchResult a = crossmatch(sx, sy, kW, kH, ref, wcs, p, c1);
        const CrossmatchResult b = crossmatch(sx, sy, kW, kH, ref, wcs, p, c2);
        EXPECT_EQ(a.refIndex, b.refIndex);
        ASSERT_EQ(a.separationArcsec.size(), b.separationArcsec.size());
        for (std::size_t i = 0; i < a.separationArcsec.size(); ++i)
            if (!(std::isnan(a.separationArcsec[i]) && std::isnan(b.separationArcsec[i]))) {
                ASSERT_EQ(a.separationArcsec[i], b.separationArcsec[i]);
            }
        EXPECT_EQ(a.nMatched, b.nMatched);
        EXPECT_EQ(a.refSelected, b.refSelected);
        std::printf("[crossmatch] oneToOne=%d: %zu of %zu sources matched, %zu refs in frame\n",
                    int(oneToOne), a.nMatched, sx.size(), a.nRefInFrame);
        if (oneToOne) {
            std::vector<int> seen(ref.size(), 0);
            for (auto k : a.refIndex) {
                if (k >= 0) {
                    EXPECT_EQ(seen[k]++, 0) << "reference " << k << " matched twice";
                }
            }
            continue;
        }
        // brute force nearest neighbour through the closed-form TanSip
        std::size_t checked = 0;
        for (std::size_t i = 0; i < sx.size(); i += 7) {
            double ra, dec;
            t.pixelToWorld(sx[i], sy[i], ra, dec);
            double best = p.radiusArcsec;
            std::int32_t bestK = -1;
            for (std::size_t k = 0; k < ref.size(); ++k) {
                const double s = angularSeparationDeg(ra, dec, ref.ra[k], ref.dec[k]) * 3600.0;
                if (s <= best) {
                    best = s;
                    bestK = static_cast<std::int32_t>(k);
                }
            }
            if (bestK >= 0 && std::fabs(best - p.radiusArcsec) < 1e-6) continue;
            EXPECT_EQ(a.refIndex[i], bestK) << "source " << i;
            ++checked;
        }
        EXPECT_GT(checked, 600u);
    }
}

TEST(Crossmatch, MillionRowCatalogIsFast) {
    const TanSip t = makeTanSip();
    const Wcs wcs = Wcs::fromTanSip(t);
    // 1e6 stars uniform on a cap of 4 deg radius around the frame centre (~20,000 per square degree)
    std::mt19937_64 rng(3);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    ReferenceCatalog ref;
    const std::size_t n = 1000000;
    for (auto* v : {&ref.ra, &ref.dec, &ref.mag, &ref.magErr, &ref.color, &ref.pmRa, &ref.pmDec})
        v->reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
        double ra, dec;
        offsetPosition(150.0, 20.0, 240.0 * std::sqrt(u(rng)), 360.0 * u(rng), ra, dec);
        addRef(ref, ra, dec, 12.0 + 8.0 * u(rng));
    }
    // sources: every reference star that projects into the frame, jittered
    std::vector<double> sx, sy;
    std::vector<std::int32_t> truth;
    for (std::size_t i = 0; i < n; ++i) {
        double x, y;
        if (!t.worldToPixel(ref.ra[i], ref.dec[i], x, y)) continue;
        if (x < 0 || y < 0 || x > kW - 1 || y > kH - 1) continue;
        sx.push_back(x + 0.1);
        sy.push_back(y - 0.1);
        truth.push_back(static_cast<std::int32_t>(i));
    }
    RunContext ctx = context(0);
    const auto t0 = std::chrono::steady_clock::now();
    const CrossmatchResult r = crossmatch(sx, sy, kW, kH, ref, wcs, CrossmatchParams{}, ctx);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[crossmatch] 1e6-row catalog, %zu sources, %zu refs in frame: %.3f s (%d threads)\n",
                sx.size(), r.nRefInFrame, sec, ctx.threadCount());
    ASSERT_GT(sx.size(), 300u);
    std::size_t right = 0;
    for (std::size_t i = 0; i < sx.size(); ++i)
        right += r.refIndex[i] == truth[i];
    // a handful of stars may lie within 2" of another one and swap; nearly all must be right
    EXPECT_GE(right, sx.size() - sx.size() / 100);
    EXPECT_GE(r.nRefInFrame, sx.size());
}

TEST(Crossmatch, ParamsJsonRoundTrip) {
    CrossmatchParams p;
    p.radiusArcsec = 1.5;
    p.oneToOne = false;
    p.refMagFaint = 18.5;
    p.marginPx = 3.0;
    nlohmann::json j = p;
    EXPECT_FALSE(j.contains("refMagBright"));
    const CrossmatchParams q = j.get<CrossmatchParams>();
    EXPECT_EQ(q.radiusArcsec, 1.5);
    EXPECT_FALSE(q.oneToOne);
    EXPECT_TRUE(std::isnan(q.refMagBright));
    EXPECT_EQ(q.refMagFaint, 18.5);
    EXPECT_EQ(q.marginPx, 3.0);
}
