// FastMod (core/util/fast_mod.hpp) must give x % d exactly: random and extreme numerators against divisors
// from 1 to near 2^64, including powers of two and the calibrator counts the zero point's bootstrap uses.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/util/fast_mod.hpp"

using gpuphot::FastMod;

TEST(FastMod, EqualsTheRemainderForEveryKindOfDivisor) {
    std::mt19937_64 rng(5);
    const std::uint64_t top = std::numeric_limits<std::uint64_t>::max();
    std::vector<std::uint64_t> divisors = {1,          2,
                                           3,          7,
                                           10,         1000,
                                           57641,      65536,
                                           1u << 31,   (1ull << 32) - 1,
                                           1ull << 32, (1ull << 32) + 1,
                                           1ull << 63, top - 1,
                                           top};
    for (int i = 0; i < 200; ++i)
        divisors.push_back(rng() >> (rng() % 64) | 1u);
    for (std::uint64_t d : divisors) {
        const FastMod m(d);
        EXPECT_EQ(m.divisor(), d);
        for (std::uint64_t x : {std::uint64_t{0}, std::uint64_t{1}, d - 1, d, d + 1, 2 * d - 1, top - 1, top})
            ASSERT_EQ(m.of(x), x % d) << "x " << x << " d " << d;
        for (int k = 0; k < 2000; ++k) {
            const std::uint64_t x = rng();
            ASSERT_EQ(m.of(x), x % d) << "x " << x << " d " << d;
        }
    }
}
