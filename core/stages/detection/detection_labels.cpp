// Run-length connected-component labelling (8-connectivity) with union-find.
#include <cstddef>
#include <vector>

#include "core/stages/detection/detection_internal.hpp"

namespace gpuphot::detail {

namespace {
std::int32_t findRoot(std::vector<std::int32_t>& parent, std::int32_t i) {
    std::int32_t r = i;
    while (parent[r] != r)
        r = parent[r];
    while (parent[i] != r) { // path compression
        const std::int32_t next = parent[i];
        parent[i] = r;
        i = next;
    }
    return r;
}
} // namespace

std::vector<std::int32_t> labelRuns(const Run* runs, std::size_t n, std::int32_t& nComponents) {
    std::vector<std::int32_t> parent, label;
    labelRunsInto(runs, n, parent, label, nComponents);
    return label;
}

void labelRunsInto(const Run* runs, std::size_t n, std::vector<std::int32_t>& parent,
                   std::vector<std::int32_t>& label, std::int32_t& nComponents) {
    parent.resize(n);
    for (std::size_t i = 0; i < n; ++i)
        parent[i] = static_cast<std::int32_t>(i);

    // Rows: [prevBegin, prevEnd) are the runs of row y - 1 when it directly precedes the current row.
    std::size_t prevBegin = 0, prevEnd = 0, curBegin = 0;
    while (curBegin < n) {
        const std::int32_t y = runs[curBegin].y;
        std::size_t curEnd = curBegin;
        while (curEnd < n && runs[curEnd].y == y)
            ++curEnd;
        const bool adjacent = prevEnd > prevBegin && runs[prevBegin].y == y - 1;
        if (adjacent) {
            std::size_t j = prevBegin;
            for (std::size_t i = curBegin; i < curEnd; ++i) {
                const Run& r = runs[i];
                while (j < prevEnd && runs[j].x1 < r.x0 - 1)
                    ++j;
                for (std::size_t k = j; k < prevEnd && runs[k].x0 <= r.x1 + 1; ++k) {
                    // union: the smaller index (earlier in raster order) becomes the root
                    const std::int32_t a = findRoot(parent, static_cast<std::int32_t>(i));
                    const std::int32_t b = findRoot(parent, static_cast<std::int32_t>(k));
                    if (a < b)
                        parent[b] = a;
                    else if (b < a)
                        parent[a] = b;
                }
            }
        }
        prevBegin = curBegin;
        prevEnd = curEnd;
        curBegin = curEnd;
    }

    label.resize(n);
    std::int32_t next = 0;
    for (std::size_t i = 0; i < n; ++i) {
        const std::int32_t r = findRoot(parent, static_cast<std::int32_t>(i));
        label[i] = (r == static_cast<std::int32_t>(i)) ? next++ : label[r];
    }
    nComponents = next;
}

} // namespace gpuphot::detail
