// tanSipFromHeaderExact (core/wcs/tan_sip.hpp): the closed-form TAN / TAN-SIP that crossmatch uses instead of
// WCSLIB must give WCSLIB's projections (within 1e-9 px) and must refuse every header it does not evaluate
// the same way.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <optional>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "core/model/header.hpp"
#include "core/wcs/tan_sip.hpp"
#include "core/wcs/wcs.hpp"

using namespace gpuphot;

namespace {

TanSip sampleWcs(int sipOrder) {
    TanSip t;
    t.crpix[0] = 1024.5;
    t.crpix[1] = 980.25;
    t.crval[0] = 359.9; // near RA wrap
    t.crval[1] = -62.0;
    const double s = 1.2 / 3600.0, rot = 33.0 * std::numbers::pi / 180.0;
    t.cd[0][0] = -s * std::cos(rot);
    t.cd[0][1] = s * std::sin(rot);
    t.cd[1][0] = s * std::sin(rot);
    t.cd[1][1] = s * std::cos(rot);
    if (sipOrder > 0) {
        t.setSipOrder(sipOrder);
        t.coeffA(2, 0) = 3e-7;
        t.coeffA(1, 1) = -2e-7;
        t.coeffB(0, 2) = 2.5e-7;
        t.coeffB(2, 0) = -1e-7;
        if (sipOrder >= 3) {
            t.coeffA(3, 0) = 2e-11;
            t.coeffB(1, 2) = -3e-11;
        }
    }
    return t;
}

// Largest pixel distance between WCSLIB's world -> pixel and the parsed TanSip's over points on and
// around a 2048 x 2048 frame.
double worstDifferencePx(const Wcs& wcs, const TanSip& t) {
    std::mt19937_64 rng(5);
    std::uniform_real_distribution<double> u(-200.0, 2248.0);
    double worst = 0.0;
    for (int i = 0; i < 3000; ++i) {
        const auto [ra, dec] = wcs.pixelToWorld(u(rng), u(rng));
        const auto [wx, wy] = wcs.worldToPixel(ra, dec);
        double tx = 0, ty = 0;
        EXPECT_TRUE(t.worldToPixel(ra, dec, tx, ty));
        worst = std::max(worst, std::hypot(tx - wx, ty - wy));
        // and the forward direction
        double tra = 0, tdec = 0;
        t.pixelToWorld(wx, wy, tra, tdec);
        const double sep = angularSeparationDeg(ra, dec, tra, tdec) * 3600.0 / 1.2; // in pixels
        worst = std::max(worst, sep);
    }
    return worst;
}

} // namespace

TEST(TanSipExact, WcslibHeadersOfTanAndTanSipAreReadExactly) {
    for (int order : {0, 2, 3}) {
        const TanSip t = sampleWcs(order);
        const Wcs wcs = Wcs::fromTanSip(t);
        const std::optional<TanSip> back = tanSipFromHeaderExact(wcs.toHeader());
        ASSERT_TRUE(back.has_value()) << "order " << order;
        EXPECT_EQ(back->sipOrder, order);
        EXPECT_DOUBLE_EQ(back->crpix[0], t.crpix[0]);
        EXPECT_DOUBLE_EQ(back->crval[1], t.crval[1]);
        EXPECT_DOUBLE_EQ(back->cd[0][1], t.cd[0][1]);
        const double worst = worstDifferencePx(wcs, *back);
        std::printf("[tansip] order %d: closed form vs WCSLIB max %.3g px\n", order, worst);
        EXPECT_LT(worst, 2e-9) << "order " << order;
    }
}

TEST(TanSipExact, PcCdeltHeaderIsReadAsCd) {
    Header h;
    h.set("CTYPE1", "RA---TAN");
    h.set("CTYPE2", "DEC--TAN");
    h.set("CRPIX1", 100.0);
    h.set("CRPIX2", 120.0);
    h.set("CRVAL1", 10.0);
    h.set("CRVAL2", 20.0);
    h.set("CDELT1", -2.0e-4);
    h.set("CDELT2", 2.0e-4);
    h.set("PC1_1", 0.8);
    h.set("PC1_2", 0.6);
    h.set("PC2_1", -0.6);
    h.set("PC2_2", 0.8);
    const auto t = tanSipFromHeaderExact(h);
    ASSERT_TRUE(t.has_value());
    EXPECT_DOUBLE_EQ(t->cd[0][0], -2.0e-4 * 0.8);
    EXPECT_DOUBLE_EQ(t->cd[0][1], -2.0e-4 * 0.6);
    EXPECT_DOUBLE_EQ(t->cd[1][0], 2.0e-4 * -0.6);
    const Wcs wcs = Wcs::fromHeader(h);
    EXPECT_LT(worstDifferencePx(wcs, *t), 1e-8);
}

TEST(TanSipExact, OtherProjectionsAndConventionsAreRefused) {
    const Header base = sampleWcs(2).toHeader();
    auto with = [&](const char* key, const char* value) {
        Header h = base;
        h.set(key, value);
        return h;
    };
    EXPECT_TRUE(tanSipFromHeaderExact(base).has_value());
    EXPECT_FALSE(tanSipFromHeaderExact(with("CTYPE1", "RA---ZPN")).has_value());
    EXPECT_FALSE(tanSipFromHeaderExact(with("CTYPE1", "RA---TPV")).has_value());
    EXPECT_FALSE(tanSipFromHeaderExact(with("CTYPE1", "GLON-TAN-SIP")).has_value());
    {
        Header h = base; // axes swapped
        h.set("CTYPE1", "DEC--TAN-SIP");
        h.set("CTYPE2", "RA---TAN-SIP");
        EXPECT_FALSE(tanSipFromHeaderExact(h).has_value());
    }
    {
        Header h = base;
        h.set("LONPOLE", 170.0);
        EXPECT_FALSE(tanSipFromHeaderExact(h).has_value());
        h.set("LONPOLE", 180.0);
        EXPECT_TRUE(tanSipFromHeaderExact(h).has_value());
    }
    {
        Header h = base;
        h.set("PV2_1", 1.0);
        EXPECT_FALSE(tanSipFromHeaderExact(h).has_value());
    }
    {
        Header h = base;
        h.set("CUNIT1", "rad");
        EXPECT_FALSE(tanSipFromHeaderExact(h).has_value());
    }
    {
        Header h = base; // a linear SIP term: not TanSip's convention
        h.set("A_1_0", 1e-5);
        EXPECT_FALSE(tanSipFromHeaderExact(h).has_value());
    }
    {
        Header h = base;
        h.remove("CRVAL2");
        EXPECT_FALSE(tanSipFromHeaderExact(h).has_value());
    }
}

namespace {
// SIP's polynomial as the FITS convention writes it, summed term by term in the order p, then q.
double sipSum(const std::vector<double>& c, int order, double u, double v) {
    double sum = 0.0, up = 1.0;
    for (int p = 0; p <= order; ++p) {
        double vq = 1.0;
        for (int q = 0; q + p <= order; ++q) {
            sum += c[static_cast<std::size_t>(p * (order + 1) + q)] * up * vq;
            vq *= v;
        }
        up *= u;
    }
    return sum;
}
} // namespace

// distort() evaluates A and B in one pass, and standardToPixel's start the inverse AP and BP: each must be
// the polynomial summed term by term, bit for bit (catalogs and fitted WCS stay the same bytes).
TEST(TanSipExact, BothPolynomialsInOnePassAreEachSumBitForBit) {
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<double> coef(-1e-6, 1e-6), at(-2500.0, 2500.0);
    for (int order = 2; order <= 5; ++order) { // sampleWcs sets terms of order 2 and 3
        TanSip t = sampleWcs(order);
        t.sipInvOrder = order;
        t.ap.assign(t.a.size(), 0.0);
        t.bp.assign(t.b.size(), 0.0);
        for (std::size_t k = 0; k < t.a.size(); ++k) {
            t.a[k] = coef(rng) / (1.0 + k * k);
            t.b[k] = coef(rng) / (1.0 + k * k);
            t.ap[k] = -t.a[k];
            t.bp[k] = -t.b[k];
        }
        for (int i = 0; i < 2000; ++i) {
            const double u = at(rng), v = at(rng);
            double du = 0.0, dv = 0.0;
            t.distort(u, v, du, dv);
            ASSERT_EQ(du, sipSum(t.a, order, u, v)) << "order " << order;
            ASSERT_EQ(dv, sipSum(t.b, order, u, v)) << "order " << order;
        }
        // Without A and B there are no Newton iterations: the pixel is the inverse polynomials' value.
        TanSip inv = t;
        inv.setSipOrder(0);
        const double det = inv.cd[0][0] * inv.cd[1][1] - inv.cd[0][1] * inv.cd[1][0];
        for (int i = 0; i < 200; ++i) {
            const double xi = at(rng) * 3e-4, eta = at(rng) * 3e-4;
            double x = 0.0, y = 0.0;
            inv.standardToPixel(xi, eta, x, y);
            const double U = (inv.cd[1][1] * xi - inv.cd[0][1] * eta) / det;
            const double V = (-inv.cd[1][0] * xi + inv.cd[0][0] * eta) / det;
            ASSERT_EQ(x, U + sipSum(inv.ap, order, U, V) + inv.crpix[0] - 1.0) << "order " << order;
            ASSERT_EQ(y, V + sipSum(inv.bp, order, U, V) + inv.crpix[1] - 1.0) << "order " << order;
        }
    }
}
