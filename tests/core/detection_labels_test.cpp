// Run labelling (8-connectivity): the banded, multi-threaded labelling gives the serial labelling's
// labels, and both match a flood fill of the pixels; labelRoots gives the same roots on any thread count.
// The fields lie near the percolation threshold (38-45 % of the pixels set): many small components and a
// few that cross many band seams, also by a corner only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <queue>
#include <vector>

#include "core/stages/detection/detection_internal.hpp"

namespace gpuphot {
namespace {
using detail::Run;

struct Field {
    int w = 0, h = 0;
    std::vector<std::uint8_t> on;
    std::vector<Run> runs;
};

// Pixels set with probability p (a fixed generator), and their runs in raster order.
Field makeField(int w, int h, double p, std::uint32_t seed) {
    Field f{w, h, std::vector<std::uint8_t>(static_cast<std::size_t>(w) * h, 0), {}};
    std::uint32_t s = seed;
    for (auto& v : f.on) {
        s = s * 1664525u + 1013904223u;
        v = (s >> 8) < p * (1u << 24);
    }
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            if (!f.on[static_cast<std::size_t>(y) * w + x]) continue;
            int x1 = x;
            while (x1 + 1 < w && f.on[static_cast<std::size_t>(y) * w + x1 + 1])
                ++x1;
            f.runs.push_back({y, x, x1});
            x = x1;
        }
    return f;
}

// Components by a breadth-first flood fill of the pixels, numbered in raster order of their first pixel.
std::vector<std::int32_t> floodLabels(const Field& f, std::int32_t& n) {
    std::vector<std::int32_t> comp(f.on.size(), -1);
    n = 0;
    for (std::size_t start = 0; start < f.on.size(); ++start) {
        if (!f.on[start] || comp[start] >= 0) continue;
        std::queue<std::size_t> q;
        q.push(start);
        comp[start] = n;
        while (!q.empty()) {
            const std::size_t i = q.front();
            q.pop();
            const int x = static_cast<int>(i % f.w), y = static_cast<int>(i / f.w);
            for (int dy = -1; dy <= 1; ++dy)
                for (int dx = -1; dx <= 1; ++dx) {
                    const int nx = x + dx, ny = y + dy;
                    if (nx < 0 || ny < 0 || nx >= f.w || ny >= f.h) continue;
                    const std::size_t j = static_cast<std::size_t>(ny) * f.w + nx;
                    if (f.on[j] && comp[j] < 0) {
                        comp[j] = n;
                        q.push(j);
                    }
                }
        }
        ++n;
    }
    return comp;
}

TEST(RunLabelling, BandsGiveTheSerialLabelsAndTheFloodFillsComponents) {
    for (const double p : {0.38, 0.45}) {
        const Field f = makeField(700, 1400, p, 7);
        ASSERT_GT(f.runs.size(), 3 * detail::kLabelBandRuns) << "enough runs for several bands";
        std::int32_t nFlood = 0;
        const std::vector<std::int32_t> flood = floodLabels(f, nFlood);
        std::int32_t nSerial = 0;
        const std::vector<std::int32_t> serial = detail::labelRuns(f.runs.data(), f.runs.size(), nSerial);
        ASSERT_EQ(nSerial, nFlood) << p;
        for (std::size_t r = 0; r < f.runs.size(); ++r)
            ASSERT_EQ(serial[r], flood[static_cast<std::size_t>(f.runs[r].y) * f.w + f.runs[r].x0])
                << "run " << r;
        for (const int threads : {1, 2, 3, 8}) {
            const detail::BandLabels bl = detail::labelRunsInBands(f.runs.data(), f.runs.size(), threads);
            EXPECT_EQ(bl.nComponents, nSerial) << threads;
            EXPECT_EQ(bl.label, serial) << threads << " threads, p " << p;
            const auto bands = std::min<std::size_t>(threads, f.runs.size() / detail::kLabelBandRuns);
            EXPECT_EQ(bl.start.size() - 1, bands) << "bands";
        }
    }
}

TEST(RunLabelling, RootsAreTheSameOnAnyThreadCount) {
    const Field f = makeField(900, 1200, 0.39, 11);
    for (const int minArea : {1, 5, 40}) {
        const detail::RootRuns one = detail::labelRoots(f.runs, minArea, 1);
        ASSERT_GT(one.size(), 100u);
        for (const int threads : {2, 5, 16}) {
            const detail::RootRuns many = detail::labelRoots(f.runs, minArea, threads);
            EXPECT_EQ(many.start, one.start) << threads << " threads, minArea " << minArea;
            ASSERT_EQ(many.runs.size(), one.runs.size());
            for (std::size_t i = 0; i < one.runs.size(); ++i) {
                const detail::Run &a = one.runs[i], &b = many.runs[i];
                ASSERT_TRUE(a.y == b.y && a.x0 == b.x0 && a.x1 == b.x1) << "run " << i << ", " << threads;
            }
        }
        // Each root's runs in raster order and at least minArea pixels.
        for (std::size_t k = 0; k < one.size(); ++k) {
            std::int64_t area = 0;
            for (auto i = one.start[k]; i < one.start[k + 1]; ++i) {
                area += one.runs[i].x1 - one.runs[i].x0 + 1;
                if (i > one.start[k]) {
                    const detail::Run &p = one.runs[i - 1], &c = one.runs[i];
                    ASSERT_TRUE(p.y < c.y || (p.y == c.y && p.x1 < c.x0)) << "root " << k;
                }
            }
            ASSERT_GE(area, minArea) << "root " << k;
        }
    }
}

} // namespace
} // namespace gpuphot
