// The PSF model's evaluation at source positions: shapeAt gives bitwise fwhmAt / ellipticityAt / thetaAt,
// the polynomials give bitwise the term-by-term std::pow sum, and psfModelForSources keeps the model and
// evaluates it at the new sources.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numbers>
#include <random>

#include "core/model/sources.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/stages/psf/psf.hpp"

namespace gpuphot {
namespace {

bool sameBits(double a, double b) {
    return std::memcmp(&a, &b, sizeof a) == 0;
}

SpatialPoly poly(int order, std::mt19937& g) {
    std::uniform_real_distribution<double> c(-0.3, 0.3);
    SpatialPoly p;
    p.order = order;
    p.coeffs.resize(static_cast<std::size_t>((order + 1) * (order + 2) / 2));
    for (double& x : p.coeffs)
        x = c(g);
    return p;
}

// The polynomial as its definition says (psf.hpp): terms u^i v^j by degree, then decreasing i.
double byDefinition(const SpatialPoly& p, double u, double v) {
    double s = 0.0;
    std::size_t k = 0;
    for (int deg = 0; deg <= p.order; ++deg)
        for (int i = deg; i >= 0; --i)
            s += p.coeffs[k++] * (std::pow(u, i) * std::pow(v, deg - i));
    return s;
}

PsfResult model(int of, int o1, int o2, std::mt19937& g) {
    PsfResult r;
    r.width = 1201;
    r.height = 803;
    r.fwhmPoly = poly(of, g);
    r.fwhmPoly.coeffs[0] += 3.0;
    r.e1Poly = poly(o1, g);
    r.e2Poly = poly(o2, g);
    r.medianFwhm = 3.1;
    r.medianBeta = 2.7;
    r.nStars = 2;
    r.stars.resize(2);
    r.stars[0].index = 4;
    r.stars[1].index = 9;
    r.gridNx = 1;
    r.gridNy = 1;
    r.epsf.resize(1);
    r.epsf[0].fwhm = 3.3;
    return r;
}

TEST(PsfShape, ShapeAtIsBitwiseTheSingleEvaluationsForEveryOrderMix) {
    std::mt19937 g(7);
    std::uniform_real_distribution<double> px(-20.0, 1220.0);
    int checked = 0;
    for (int of = 0; of <= 3; ++of)
        for (int o1 = 0; o1 <= 3; ++o1)
            for (int o2 : {o1, 3 - o1}) {
                const PsfResult r = model(of, o1, o2, g);
                for (int k = 0; k < 200; ++k) {
                    const double x = px(g), y = px(g) * 0.66;
                    const PsfResult::ShapeAt at = r.shapeAt(x, y);
                    ASSERT_TRUE(sameBits(at.fwhm, r.fwhmAt(x, y))) << of << o1 << o2;
                    ASSERT_TRUE(sameBits(at.ellipticity, r.ellipticityAt(x, y))) << of << o1 << o2;
                    ASSERT_TRUE(sameBits(at.theta, r.thetaAt(x, y))) << of << o1 << o2;
                    const double u = 2.0 * x / (r.width - 1) - 1.0, v = 2.0 * y / (r.height - 1) - 1.0;
                    ASSERT_TRUE(sameBits(at.fwhm, byDefinition(r.fwhmPoly, u, v)));
                    const double e1 = byDefinition(r.e1Poly, u, v), e2 = byDefinition(r.e2Poly, u, v);
                    ASSERT_TRUE(sameBits(at.ellipticity, std::hypot(e1, e2)));
                    ++checked;
                }
            }
    EXPECT_EQ(checked, 32 * 200);
    // Without a model: NaN, as the single evaluations.
    const PsfResult none;
    EXPECT_TRUE(std::isnan(none.shapeAt(3.0, 4.0).fwhm));
    EXPECT_TRUE(std::isnan(none.fwhmAt(3.0, 4.0)));
}

TEST(PsfShape, ModelForNewSourcesKeepsTheModelAndEvaluatesItAtEachSource) {
    std::mt19937 g(11);
    PsfResult old = model(2, 1, 1, g);
    old.fwhm.assign(10, 1.0); // the earlier source list's columns: not carried over
    old.fluxPsf.assign(10, 5.0);
    old.flags.assign(10, FlagPsfStar);
    Sources s;
    s.resize(5);
    const double xs[5] = {0.0, 100.5, std::nan(""), 1200.0, 640.25}, ys[5] = {0.0, 7.0, 3.0, 802.0, 401.0};
    for (int k = 0; k < 5; ++k) {
        s.x[k] = xs[k];
        s.y[k] = ys[k];
    }
    const PsfResult p = psfModelForSources(old, s);
    ASSERT_EQ(p.fwhm.size(), 5u);
    ASSERT_EQ(p.flags.size(), 5u);
    EXPECT_EQ(p.fwhmPoly.coeffs, old.fwhmPoly.coeffs);
    EXPECT_EQ(p.e2Poly.coeffs, old.e2Poly.coeffs);
    EXPECT_EQ(p.width, old.width);
    EXPECT_EQ(p.medianFwhm, old.medianFwhm);
    EXPECT_EQ(p.medianBeta, old.medianBeta);
    EXPECT_EQ(p.nStars, old.nStars);
    ASSERT_EQ(p.stars.size(), 2u);
    EXPECT_EQ(p.stars[0].index, -1); // the stars refer to the old list
    ASSERT_EQ(p.epsf.size(), 1u);
    EXPECT_EQ(p.epsf[0].fwhm, 3.3);
    for (int k = 0; k < 5; ++k) {
        EXPECT_TRUE(std::isnan(p.fluxPsf[k]));
        EXPECT_EQ(p.flags[k], 0u);
        if (k == 2) {
            EXPECT_TRUE(std::isnan(p.fwhm[k]));
            continue;
        }
        EXPECT_TRUE(sameBits(p.fwhm[k], old.fwhmAt(xs[k], ys[k])));
        EXPECT_TRUE(sameBits(p.ellipticity[k], old.ellipticityAt(xs[k], ys[k])));
        EXPECT_TRUE(sameBits(p.theta[k], old.thetaAt(xs[k], ys[k])));
    }
}

} // namespace
} // namespace gpuphot
