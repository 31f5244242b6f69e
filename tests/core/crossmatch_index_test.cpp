// Stage 5 (crossmatch), the spatial index of step 3 (CrossmatchParams::index): the uniform grid and the
// nanoflann k-d tree must give the identical CrossmatchResult (every pair, separations bitwise), and both
// must agree with a brute-force search over every (source, star) pair fed to the same assignment.
// Fields with duplicated stars and sources (exact ties), ties in pixel distance, pairs exactly at the match
// radius, empty inputs and 1e5 reference stars; the "index" configuration key.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/catalog/reference_catalog.hpp"
#include "core/pipeline/pipeline_config.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/crossmatch/crossmatch.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/tan_sip.hpp"
#include "core/wcs/wcs.hpp"

using namespace gpuphot;

namespace {

constexpr int kW = 600, kH = 500;

// 0.4 arcsec/px, rotated by 33 deg, with a SIP distortion (about 1 px at the corners).
TanSip makeTanSip() {
    TanSip t;
    t.crpix[0] = 280.5;
    t.crpix[1] = 260.5;
    t.crval[0] = 210.0;
    t.crval[1] = -35.0;
    const double s = 0.4 / 3600.0, a = 33.0 * M_PI / 180.0;
    t.cd[0][0] = -s * std::cos(a);
    t.cd[0][1] = s * std::sin(a);
    t.cd[1][0] = s * std::sin(a);
    t.cd[1][1] = s * std::cos(a);
    t.setSipOrder(2);
    t.coeffA(2, 0) = 3e-6;
    t.coeffB(1, 1) = -2e-6;
    return t;
}

void addRefAtPixel(ReferenceCatalog& c, const TanSip& t, double x, double y, double mag) {
    double ra, dec;
    t.pixelToWorld(x, y, ra, dec);
    c.ra.push_back(ra);
    c.dec.push_back(dec);
    c.mag.push_back(mag);
    c.magErr.push_back(0.01);
    c.color.push_back(0.3);
    c.pmRa.push_back(std::nan(""));
    c.pmDec.push_back(std::nan(""));
    c.id.push_back(static_cast<std::int64_t>(c.ra.size()));
}

void duplicateRef(ReferenceCatalog& c, std::size_t r) {
    c.ra.push_back(c.ra[r]);
    c.dec.push_back(c.dec[r]);
    c.mag.push_back(c.mag[r]);
    c.magErr.push_back(c.magErr[r]);
    c.color.push_back(c.color[r]);
    c.pmRa.push_back(c.pmRa[r]);
    c.pmDec.push_back(c.pmDec[r]);
    c.id.push_back(static_cast<std::int64_t>(c.ra.size()));
}

struct Field {
    ReferenceCatalog ref;
    std::vector<double> x, y;
};

// nRef stars over the frame plus 30 px (some outside it), some of them duplicated; sources: jittered copies
// of stars (some duplicated, some two to a star), random unmatched positions and a few NaN.
Field randomField(const TanSip& t, std::size_t nRef, std::size_t nSrc, std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> ux(-30.0, kW + 30.0), uy(-30.0, kH + 30.0), u(0.0, 1.0);
    std::normal_distribution<double> g(0.0, 1.0);
    Field f;
    std::vector<double> px, py;
    for (std::size_t i = 0; i < nRef; ++i) {
        px.push_back(ux(rng));
        py.push_back(uy(rng));
        addRefAtPixel(f.ref, t, px.back(), py.back(), 12.0 + 8.0 * u(rng));
        if (u(rng) < 0.03) { // a duplicated star: same position, the next row
            duplicateRef(f.ref, f.ref.size() - 1);
            px.push_back(px.back());
            py.push_back(py.back());
            ++i;
        }
    }
    while (f.x.size() < nSrc) {
        const double r = u(rng);
        if (r < 0.6) {
            const std::size_t k = static_cast<std::size_t>(u(rng) * px.size()) % px.size();
            f.x.push_back(px[k] + 1.5 * g(rng));
            f.y.push_back(py[k] + 1.5 * g(rng));
        } else if (r < 0.7 && !f.x.empty()) { // a duplicated source
            f.x.push_back(f.x.back());
            f.y.push_back(f.y.back());
        } else if (r < 0.98) {
            f.x.push_back((kW - 1.0) * u(rng));
            f.y.push_back((kH - 1.0) * u(rng));
        } else {
            f.x.push_back(u(rng) < 0.5 ? std::nan("") : 10.0);
            f.y.push_back(std::nan(""));
        }
    }
    return f;
}

CrossmatchResult runWith(const Field& f, const Wcs& wcs, CrossmatchParams p, const std::string& index,
                         int threads = 1) {
    RunContext ctx;
    ctx.threads = threads;
    p.index = index;
    return cpu::crossmatch(f.x, f.y, kW, kH, f.ref, wcs, p, ctx);
}

// Step 3 by brute force over every (source, selected star) pair with the documented tests, then the same
// assignment (detail::assignMatches): what either index must reproduce.
CrossmatchResult bruteForce(const Field& f, const Wcs& wcs, const CrossmatchParams& p) {
    CrossmatchResult res;
    const detail::CrossmatchSetup setup =
        detail::prepareCrossmatch(f.x, f.y, kW, kH, f.ref, wcs, p, 1, res);
    const double r2 = res.radiusPx * res.radiusPx;
    std::vector<detail::MatchCandidate> cands;
    std::vector<std::uint32_t> offsets{0};
    for (std::size_t i = 0; i < f.x.size(); ++i) {
        const std::size_t first = cands.size();
        if (setup.srcValid[i])
            for (std::size_t j = 0; j < res.refSelected.size(); ++j) {
                const double dx = f.x[i] - res.refX[j], dy = f.y[i] - res.refY[j];
                if (!(dx * dx + dy * dy < r2)) continue;
                const double sep = detail::separationArcsec(setup.srcUnit[i], setup.refUnit[j]);
                if (sep <= p.radiusArcsec) cands.push_back({sep, static_cast<std::int32_t>(i), res.refSelected[j]});
            }
        detail::sortCandidates(cands.data() + first, cands.data() + cands.size());
        offsets.push_back(static_cast<std::uint32_t>(cands.size()));
    }
    detail::assignMatches(cands, offsets, f.ref.size(), p.oneToOne, res);
    return res;
}

template <class T> std::vector<std::uint64_t> bits(const std::vector<T>& v) {
    std::vector<std::uint64_t> out;
    for (T d : v)
        out.push_back(std::bit_cast<std::uint64_t>(static_cast<double>(d)));
    return out;
}

// Every field of two results identical (doubles bitwise, NaN included).
void expectIdentical(const CrossmatchResult& a, const CrossmatchResult& b, const std::string& what) {
    SCOPED_TRACE(what);
    EXPECT_EQ(a.refIndex, b.refIndex);
    EXPECT_EQ(bits(a.separationArcsec), bits(b.separationArcsec));
    EXPECT_EQ(a.nMatched, b.nMatched);
    EXPECT_EQ(a.nRefInFrame, b.nRefInFrame);
    EXPECT_EQ(a.refSelected, b.refSelected);
    EXPECT_EQ(bits(a.refX), bits(b.refX));
    EXPECT_EQ(bits(a.refY), bits(b.refY));
    EXPECT_EQ(std::bit_cast<std::uint64_t>(a.radiusPx), std::bit_cast<std::uint64_t>(b.radiusPx));
}

} // namespace

TEST(CrossmatchIndex, ResolvesNames) {
    EXPECT_EQ(resolveCrossmatchIndex("grid"), CrossmatchIndex::Grid);
    EXPECT_EQ(resolveCrossmatchIndex("kdtree"), CrossmatchIndex::KdTree);
    EXPECT_EQ(resolveCrossmatchIndex("auto"), CrossmatchIndex::Grid);
    EXPECT_EQ(CrossmatchParams{}.index, "auto");
    for (const char* bad : {"", "KDTREE", "octree", "grid "}) {
        try {
            resolveCrossmatchIndex(bad);
            ADD_FAILURE() << "accepted '" << bad << "'";
        } catch (const InvalidInput& e) {
            const std::string msg = e.what();
            EXPECT_NE(msg.find("\"" + std::string(bad) + "\""), std::string::npos) << msg;
            EXPECT_NE(msg.find("kdtree"), std::string::npos) << msg;
        }
    }
}

TEST(CrossmatchIndex, GridAndKdTreeMatchBruteForceOnRandomFields) {
    const TanSip t = makeTanSip();
    const Wcs wcs = Wcs::fromTanSip(t);
    int cases = 0;
    for (std::uint64_t seed : {1u, 2u, 3u})
        for (double radius : {0.5, 1.0, 4.0}) // 4" = 10 px: many candidates per source
            for (bool oneToOne : {true, false}) {
                const Field f = randomField(t, 900 + 300 * seed, 1200, seed);
                CrossmatchParams p;
                p.radiusArcsec = radius;
                p.oneToOne = oneToOne;
                const std::string what = "seed " + std::to_string(seed) + " radius " + std::to_string(radius) +
                                         (oneToOne ? " one-to-one" : " nearest");
                const CrossmatchResult grid = runWith(f, wcs, p, "grid");
                const CrossmatchResult tree = runWith(f, wcs, p, "kdtree");
                const CrossmatchResult brute = bruteForce(f, wcs, p);
                expectIdentical(grid, tree, what + ": grid vs kdtree");
                expectIdentical(tree, brute, what + ": kdtree vs brute force");
                expectIdentical(runWith(f, wcs, p, "auto"), grid, what + ": auto vs grid");
                expectIdentical(runWith(f, wcs, p, "kdtree", 2), tree, what + ": kdtree on 2 threads");
                EXPECT_GT(grid.nMatched, 100u) << what;
                ++cases;
            }
    EXPECT_EQ(cases, 18);
}

// Exact ties: stars duplicated, sources duplicated, and sources at the same pixel distance from several
// stars (stars on an integer lattice, sources at cell centres). The tie-breaks (separation, source, star)
// must pick the same pairs through either index.
TEST(CrossmatchIndex, TiesAndDuplicates) {
    const TanSip t = makeTanSip();
    const Wcs wcs = Wcs::fromTanSip(t);
    Field f;
    for (int iy = 0; iy < 12; ++iy)
        for (int ix = 0; ix < 12; ++ix) {
            addRefAtPixel(f.ref, t, 100.0 + 2.0 * ix, 100.0 + 2.0 * iy, 15.0);
            if ((ix + iy) % 5 == 0) duplicateRef(f.ref, f.ref.size() - 1);
        }
    for (int iy = 0; iy < 11; ++iy)
        for (int ix = 0; ix < 11; ++ix) {
            const double x = 101.0 + 2.0 * ix, y = 101.0 + 2.0 * iy; // equidistant from four stars
            for (int k = 0; k < 1 + (ix + 2 * iy) % 3; ++k) {     // up to three identical sources
                f.x.push_back(x);
                f.y.push_back(y);
            }
            f.x.push_back(x - 1.0); // exactly on a star
            f.y.push_back(y - 1.0);
        }
    for (bool oneToOne : {true, false})
        for (double radius : {0.3, 0.6, 1.5}) {
            CrossmatchParams p;
            p.radiusArcsec = radius;
            p.oneToOne = oneToOne;
            const std::string what = "radius " + std::to_string(radius) + (oneToOne ? " one-to-one" : "");
            const CrossmatchResult grid = runWith(f, wcs, p, "grid");
            expectIdentical(grid, runWith(f, wcs, p, "kdtree"), what + ": grid vs kdtree");
            expectIdentical(grid, bruteForce(f, wcs, p), what + ": grid vs brute force");
            EXPECT_GT(grid.nMatched, 0u) << what;
        }
}

// Pairs exactly at the match radius: the radius is set to the separation of given pairs (<= keeps them),
// and sources are put at the pixel search radius from a star (the pixel test is strict).
TEST(CrossmatchIndex, PairsExactlyAtTheRadius) {
    const TanSip t = makeTanSip();
    const Wcs wcs = Wcs::fromTanSip(t);
    Field f = randomField(t, 400, 500, 11);
    CrossmatchParams p;
    p.radiusArcsec = 1.0;
    const CrossmatchResult first = runWith(f, wcs, p, "grid");
    // sources on the pixel search radius (and a hair inside/outside) of the first selected stars
    const double rpx = first.radiusPx;
    for (std::size_t j = 0; j < 20 && j < first.refSelected.size(); ++j) {
        const double dx[3] = {rpx, std::nextafter(rpx, 0.0), std::nextafter(rpx, 1e9)};
        for (double d : dx) {
            f.x.push_back(first.refX[j] + d);
            f.y.push_back(first.refY[j]);
            f.x.push_back(first.refX[j]);
            f.y.push_back(first.refY[j] - d);
        }
    }
    for (bool oneToOne : {true, false}) {
        p.oneToOne = oneToOne;
        // the radius equal to separations the search finds: the largest one, and a middle one
        CrossmatchParams wide = p;
        wide.radiusArcsec = 3.0;
        wide.oneToOne = false;
        const CrossmatchResult w = runWith(f, wcs, wide, "grid");
        std::vector<double> seps;
        for (double s : w.separationArcsec)
            if (std::isfinite(s)) seps.push_back(s);
        ASSERT_GT(seps.size(), 10u);
        std::sort(seps.begin(), seps.end());
        for (double radius : {seps.back(), seps[seps.size() / 2], seps[seps.size() / 4]}) {
            p.radiusArcsec = radius;
            const std::string what = "radius " + std::to_string(radius) + (oneToOne ? " one-to-one" : "");
            const CrossmatchResult grid = runWith(f, wcs, p, "grid");
            const CrossmatchResult tree = runWith(f, wcs, p, "kdtree");
            expectIdentical(grid, tree, what + ": grid vs kdtree");
            expectIdentical(tree, bruteForce(f, wcs, p), what + ": kdtree vs brute force");
            if (!oneToOne) { // the pair whose separation is the radius is kept (nearest per source)
                std::size_t atRadius = 0;
                for (double s : tree.separationArcsec)
                    atRadius += s == radius;
                EXPECT_GE(atRadius, 1u) << what;
            }
        }
    }
}

TEST(CrossmatchIndex, EmptyInputs) {
    const TanSip t = makeTanSip();
    const Wcs wcs = Wcs::fromTanSip(t);
    const Field full = randomField(t, 200, 100, 5);
    CrossmatchParams p;
    Field noSources = full;
    noSources.x.clear();
    noSources.y.clear();
    Field noRefs = full;
    noRefs.ref = ReferenceCatalog{};
    Field offFrame = full; // every star far outside the frame
    offFrame.ref = ReferenceCatalog{};
    for (int k = 0; k < 50; ++k)
        addRefAtPixel(offFrame.ref, t, -5000.0 - 10.0 * k, 300.0, 14.0);
    Field nanSources = full;
    for (double& v : nanSources.x)
        v = std::nan("");
    for (const auto* f : {&noSources, &noRefs, &offFrame, &nanSources}) {
        const CrossmatchResult grid = runWith(*f, wcs, p, "grid");
        const CrossmatchResult tree = runWith(*f, wcs, p, "kdtree");
        expectIdentical(grid, tree, "empty case");
        EXPECT_EQ(tree.nMatched, 0u);
        EXPECT_EQ(tree.refIndex.size(), f->x.size());
    }
    Field both = noSources;
    both.ref = ReferenceCatalog{};
    expectIdentical(runWith(both, wcs, p, "grid"), runWith(both, wcs, p, "kdtree"), "nothing at all");
}

TEST(CrossmatchIndex, HundredThousandReferences) {
    const TanSip t = makeTanSip();
    const Wcs wcs = Wcs::fromTanSip(t);
    const Field f = randomField(t, 100000, 20000, 21); // about 0.3 stars per square pixel
    for (bool oneToOne : {true, false}) {
        CrossmatchParams p;
        p.radiusArcsec = 1.0;
        p.oneToOne = oneToOne;
        const CrossmatchResult grid = runWith(f, wcs, p, "grid", 2);
        const CrossmatchResult tree = runWith(f, wcs, p, "kdtree", 2);
        expectIdentical(grid, tree, oneToOne ? "1e5 one-to-one" : "1e5 nearest");
        EXPECT_GT(grid.nMatched, 10000u);
    }
}

TEST(CrossmatchIndex, ConfigurationKey) {
    CrossmatchParams p;
    p.index = "kdtree";
    p.radiusArcsec = 1.25;
    const nlohmann::json j = p;
    EXPECT_EQ(j.at("index"), "kdtree");
    const CrossmatchParams back = j.get<CrossmatchParams>();
    EXPECT_EQ(back.index, "kdtree");
    EXPECT_EQ(back.radiusArcsec, 1.25);
    EXPECT_EQ(nlohmann::json::object().get<CrossmatchParams>().index, "auto"); // absent: the default
    EXPECT_EQ(nlohmann::json(CrossmatchParams{}).at("index"), "auto");

    // through the pipeline configuration (what --config reads)
    PipelineConfig config;
    applyPipelineConfig(config, nlohmann::json::parse(R"({"crossmatch": {"index": "grid"}})"), "test.json");
    EXPECT_EQ(config.crossmatch.index, "grid");
    EXPECT_EQ(nlohmann::json(config).get<PipelineConfig>().crossmatch.index, "grid");
    for (const char* bad : {R"({"crossmatch": {"index": "quadtree"}})", R"({"crossmatch": {"index": 3}})"}) {
        PipelineConfig c;
        try {
            applyPipelineConfig(c, nlohmann::json::parse(bad), "bad.json");
            ADD_FAILURE() << "accepted " << bad;
        } catch (const InvalidInput& e) {
            const std::string msg = e.what();
            EXPECT_NE(msg.find("bad.json"), std::string::npos) << msg;
            EXPECT_NE(msg.find("index"), std::string::npos) << msg;
        }
    }
    EXPECT_THROW(nlohmann::json::parse(R"({"index": "tree"})").get<CrossmatchParams>(), InvalidInput);

    // the stage itself rejects a bad value set in code
    const TanSip t = makeTanSip();
    const Field f = randomField(t, 50, 20, 3);
    CrossmatchParams bad;
    bad.index = "bruteforce";
    RunContext ctx;
    EXPECT_THROW(crossmatch(f.x, f.y, kW, kH, f.ref, Wcs::fromTanSip(t), bad, ctx), InvalidInput);
}
