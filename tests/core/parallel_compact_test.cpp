// compactInOrder and concatChunks (core/util/parallel.hpp) must give what a serial loop of push_backs gives,
// for any thread count, at sizes around its chunk boundaries.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "core/util/parallel.hpp"

using namespace gpuphot;

TEST(ParallelCompact, KeepsThePositionsInOrderForAnyThreadCount) {
    std::mt19937_64 rng(11);
    for (std::size_t n : {0u, 1u, 16383u, 16384u, 16385u, 100000u}) {
        for (double p : {0.0, 0.3, 1.0}) {
            std::bernoulli_distribution keepIt(p);
            std::vector<std::uint8_t> flag(n);
            for (auto& f : flag)
                f = keepIt(rng) ? 1 : 0;
            std::vector<std::size_t> expect;
            for (std::size_t i = 0; i < n; ++i)
                if (flag[i]) expect.push_back(i);
            for (int threads : {1, 2, 3, 0}) {
                std::vector<std::size_t> got;
                std::size_t resized = 0;
                compactInOrder(
                    n, threads, [&](std::size_t i) { return flag[i] != 0; },
                    [&](std::size_t m) {
                        ++resized;
                        got.assign(m, n + 1);
                    },
                    [&](std::size_t k, std::size_t i) { got[k] = i; });
                EXPECT_EQ(resized, 1u);
                EXPECT_EQ(got, expect) << "n " << n << ", p " << p << ", threads " << threads;
            }
        }
    }
}

TEST(ParallelCompact, ConcatenatesChunksInOrderAndFreesThem) {
    for (int threads : {1, 2, 3}) {
        std::vector<std::vector<int>> chunks = {{1, 2}, {}, {3}, {4, 5, 6}, {}};
        std::vector<int> out = {99};
        concatChunks(chunks, out, threads);
        EXPECT_EQ(out, (std::vector<int>{1, 2, 3, 4, 5, 6})) << "threads " << threads;
        for (const auto& c : chunks)
            EXPECT_EQ(c.capacity(), 0u);
    }
}
