// core/util/hd_math.hpp: the shared exp/log (host and device run the same operations) against long double,
// its special values, and its tables.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "core/util/hd_math.hpp"
#include "core/util/hd_math_pair.hpp"

using namespace gpuphot;

namespace {

// |got - ref| in units of the last place of the double nearest ref.
double ulps(double got, long double ref) {
    const double r = static_cast<double>(ref);
    if (std::isinf(r)) return std::isinf(got) && (got > 0) == (r > 0) ? 0.0 : 1e30;
    const double a = std::abs(r);
    const double ulp = a < std::numeric_limits<double>::min() ? std::numeric_limits<double>::denorm_min()
                                                              : std::nextafter(a, INFINITY) - a;
    return static_cast<double>(std::abs(static_cast<long double>(got) - ref) / ulp);
}

} // namespace

TEST(HdMath, ExpWithinOneUlpOverTheRange) {
    std::mt19937_64 rng(7);
    std::uniform_real_distribution<double> wide(-745.0, 709.7), narrow(-1.0, 1.0), tiny(-1e-6, 1e-6);
    double worst = 0.0;
    for (int i = 0; i < 600000; ++i) {
        const double x = i % 3 == 0 ? wide(rng) : (i % 3 == 1 ? narrow(rng) : tiny(rng));
        worst = std::max(worst, ulps(hdmath::exp(x), std::exp(static_cast<long double>(x))));
    }
    EXPECT_LE(worst, 1.0);
    EXPECT_GT(worst, 0.0); // it is an approximation, and the measure can see it
}

TEST(HdMath, LogWithinTwoAndAHalfUlpsOverTheRange) {
    std::mt19937_64 rng(8);
    double worst = 0.0, worstNearOne = 0.0;
    for (int i = 0; i < 600000; ++i) {
        // Any mantissa at any exponent, subnormals included.
        const double m = 1.0 + static_cast<double>(rng() >> 11) * 0x1p-53;
        const double x = std::ldexp(m, static_cast<int>(rng() % 2098) - 1074);
        worst = std::max(worst, ulps(hdmath::log(x), std::log(static_cast<long double>(x))));
        const double y = 1.0 + (static_cast<double>(rng() >> 11) * 0x1p-53 - 0.5) * 1e-3;
        worstNearOne = std::max(worstNearOne, ulps(hdmath::log(y), std::log(static_cast<long double>(y))));
    }
    // Measured: 1.5 over the range, 2.0 near 1 (where the result is 2 atanh(s) alone and the rounding of s
    // shows); the bound from the operations is 2.5.
    EXPECT_LE(worst, 2.5);
    EXPECT_LE(worstNearOne, 2.5);
}

TEST(HdMath, SpecialValuesAsTheCLibrary) {
    const double inf = std::numeric_limits<double>::infinity();
    const double nan = std::numeric_limits<double>::quiet_NaN();
    EXPECT_EQ(hdmath::exp(0.0), 1.0);
    EXPECT_EQ(hdmath::log(1.0), 0.0);
    EXPECT_EQ(hdmath::log(2.0), std::log(2.0));
    EXPECT_TRUE(std::isnan(hdmath::exp(nan)));
    EXPECT_TRUE(std::isnan(hdmath::log(nan)));
    EXPECT_TRUE(std::isnan(hdmath::log(-1.0)));
    EXPECT_EQ(hdmath::exp(inf), inf);
    EXPECT_EQ(hdmath::exp(-inf), 0.0);
    EXPECT_EQ(hdmath::exp(710.0), inf);
    EXPECT_EQ(hdmath::exp(-746.0), 0.0);
    EXPECT_EQ(hdmath::log(0.0), -inf);
    EXPECT_EQ(hdmath::log(inf), inf);
    // Near the ends of the range: the largest finite result and the subnormals.
    EXPECT_TRUE(std::isfinite(hdmath::exp(709.78)));
    EXPECT_LE(ulps(hdmath::exp(709.78), std::exp(static_cast<long double>(709.78))), 1.0);
    EXPECT_EQ(hdmath::exp(-745.0), std::numeric_limits<double>::denorm_min());
    EXPECT_LE(ulps(hdmath::exp(-720.0), std::exp(-720.0L)), 1.0);
    EXPECT_LE(ulps(hdmath::log(std::numeric_limits<double>::denorm_min()),
                   std::log(static_cast<long double>(std::numeric_limits<double>::denorm_min()))),
              1.0);
    EXPECT_LE(ulps(hdmath::log(std::numeric_limits<double>::max()),
                   std::log(static_cast<long double>(std::numeric_limits<double>::max()))),
              1.0);
}

TEST(HdMath, TablesAreTheNearestDoublesWithTheirRests) {
    for (int j = 0; j < 64; ++j) {
        const long double v = std::exp2(static_cast<long double>(j) / 64.0L);
        const double hi = hdmath::kExp2Table[2 * j], lo = hdmath::kExp2Table[2 * j + 1];
        EXPECT_EQ(hi, static_cast<double>(v)) << j;
        EXPECT_LE(std::abs(static_cast<long double>(hi) + lo - v), 4e-19L * v) << j;
    }
    for (int j = 48; j <= 96; ++j) {
        const long double v = std::log(static_cast<long double>(j) / 64.0L);
        const double hi = hdmath::kLogTable[2 * (j - 48)], lo = hdmath::kLogTable[2 * (j - 48) + 1];
        EXPECT_EQ(hi, static_cast<double>(v)) << j;
        EXPECT_LE(std::abs(static_cast<long double>(hi) + lo - v), 4e-19L) << j;
    }
}

TEST(HdMath, RoundToIntTiesToEven) {
    EXPECT_EQ(hdmath::roundToInt(2.4), 2);
    EXPECT_EQ(hdmath::roundToInt(2.6), 3);
    EXPECT_EQ(hdmath::roundToInt(-2.6), -3);
    EXPECT_EQ(hdmath::roundToInt(2.5), 2);
    EXPECT_EQ(hdmath::roundToInt(3.5), 4);
    EXPECT_EQ(hdmath::roundToInt(-1100.4), -1100);
}

// The host's two-element versions (core/util/hd_math_pair.hpp, used by the profile fits' lane pairs) give
// each element bitwise the scalar result, in their common domain and outside it (the scalar fallback).
TEST(HdMath, PairVersionsAreBitwiseTheScalarOnes) {
    std::mt19937_64 rng(9);
    std::uniform_real_distribution<double> wide(-800.0, 800.0), fit(-60.0, 0.0);
    const double specials[] = {0.0,
                               -0.0,
                               1.0,
                               -1.0,
                               5e-324,
                               1e-310,
                               1e308,
                               710.0,
                               -746.0,
                               679.9,
                               -679.9,
                               std::numeric_limits<double>::infinity(),
                               -std::numeric_limits<double>::infinity(),
                               std::numeric_limits<double>::quiet_NaN()};
    long checked = 0, differ = 0;
    auto check = [&](double a, double b) {
        const hdmath::D2 x = {a, b};
        const hdmath::D2 e = hdmath::exp(x), l = hdmath::log(x);
        const double se[2] = {hdmath::exp(a), hdmath::exp(b)}, sl[2] = {hdmath::log(a), hdmath::log(b)};
        for (int k = 0; k < 2; ++k) {
            const double ek = e[k], lk = l[k];
            differ += std::memcmp(&ek, &se[k], sizeof(double)) != 0;
            differ += std::memcmp(&lk, &sl[k], sizeof(double)) != 0;
            checked += 2;
        }
    };
    for (double a : specials)
        for (double b : specials)
            check(a, b);
    for (int i = 0; i < 300000; ++i) {
        check(wide(rng), fit(rng));
        const double m = 1.0 + static_cast<double>(rng() >> 11) * 0x1p-53;
        check(std::ldexp(m, static_cast<int>(rng() % 2098) - 1074), 1.0 + 40.0 * (m - 1.0));
    }
    EXPECT_EQ(differ, 0) << "of " << checked;
}
