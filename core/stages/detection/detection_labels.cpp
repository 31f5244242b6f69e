// Run-length connected-component labelling (8-connectivity) with union-find.
#include <algorithm>
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

namespace {
// The end of the row that starts at `begin`.
std::size_t rowEnd(const Run* runs, std::size_t n, std::size_t begin) {
    std::size_t end = begin;
    while (end < n && runs[end].y == runs[begin].y)
        ++end;
    return end;
}

// Joins the runs of one row [curBegin, curEnd) to those of the row before it [prevBegin, prevEnd) when
// that row lies directly above: the smaller index (earlier in raster order) becomes the root.
void joinRows(const Run* runs, std::vector<std::int32_t>& parent, std::size_t prevBegin, std::size_t prevEnd,
              std::size_t curBegin, std::size_t curEnd) {
    if (prevEnd <= prevBegin || runs[prevBegin].y != runs[curBegin].y - 1) return;
    std::size_t j = prevBegin;
    for (std::size_t i = curBegin; i < curEnd; ++i) {
        const Run& r = runs[i];
        while (j < prevEnd && runs[j].x1 < r.x0 - 1)
            ++j;
        for (std::size_t k = j; k < prevEnd && runs[k].x0 <= r.x1 + 1; ++k) {
            const std::int32_t a = findRoot(parent, static_cast<std::int32_t>(i));
            const std::int32_t b = findRoot(parent, static_cast<std::int32_t>(k));
            if (a < b)
                parent[b] = a;
            else if (b < a)
                parent[a] = b;
        }
    }
}

// Union-find over the whole rows [begin, end); touches parent[begin, end) only.
void joinBand(const Run* runs, std::size_t begin, std::size_t end, std::vector<std::int32_t>& parent) {
    for (std::size_t i = begin; i < end; ++i)
        parent[i] = static_cast<std::int32_t>(i);
    std::size_t prevBegin = begin, prevEnd = begin;
    for (std::size_t cur = begin; cur < end;) {
        const std::size_t curEnd = rowEnd(runs, end, cur);
        joinRows(runs, parent, prevBegin, prevEnd, cur, curEnd);
        prevBegin = cur;
        prevEnd = curEnd;
        cur = curEnd;
    }
}

// Band starts at row starts, about n / bands runs apart; starts.back() == n.
std::vector<std::size_t> bandStarts(const Run* runs, std::size_t n, int bands) {
    std::vector<std::size_t> starts{0};
    for (int b = 1; b < bands; ++b) {
        std::size_t at =
            std::max(starts.back(), n * static_cast<std::size_t>(b) / static_cast<std::size_t>(bands));
        while (at > 0 && at < n && runs[at].y == runs[at - 1].y)
            ++at;
        starts.push_back(at);
    }
    starts.push_back(n);
    return starts;
}
} // namespace

void labelRunsInto(const Run* runs, std::size_t n, std::vector<std::int32_t>& parent,
                   std::vector<std::int32_t>& label, std::int32_t& nComponents) {
    parent.resize(n);
    joinBand(runs, 0, n, parent);
    label.resize(n);
    std::int32_t next = 0;
    for (std::size_t i = 0; i < n; ++i) {
        const std::int32_t r = findRoot(parent, static_cast<std::int32_t>(i));
        label[i] = (r == static_cast<std::int32_t>(i)) ? next++ : label[r];
    }
    nComponents = next;
}

BandLabels labelRunsInBands(const Run* runs, std::size_t n, int threads) {
    BandLabels out;
    const int bands = static_cast<int>(std::clamp<std::size_t>(n / kLabelBandRuns, 1, std::max(1, threads)));
    out.start = bandStarts(runs, n, bands);
    std::vector<std::int32_t> parent(n);
    out.label.resize(n);
    // Bands joined on their own threads, then their seams in order (few runs).
#pragma omp parallel for num_threads(bands) schedule(static, 1)
    for (int b = 0; b < bands; ++b)
        joinBand(runs, out.start[b], out.start[b + 1], parent);
    for (int b = 1; b < bands; ++b) {
        const std::size_t seam = out.start[b];
        if (seam == 0 || seam >= n) continue;
        std::size_t prevBegin = seam - 1;
        while (prevBegin > 0 && runs[prevBegin - 1].y == runs[seam - 1].y)
            --prevBegin;
        joinRows(runs, parent, prevBegin, seam, seam, rowEnd(runs, n, seam));
    }
    // Every run's root (parent only read), the roots numbered in index order (parent[root] := its number),
    // then every run given its root's number.
    out.firstLabel.assign(static_cast<std::size_t>(bands) + 1, 0);
#pragma omp parallel for num_threads(bands) schedule(static, 1)
    for (int b = 0; b < bands; ++b) {
        std::int32_t roots = 0;
        for (std::size_t i = out.start[b]; i < out.start[b + 1]; ++i) {
            std::int32_t r = static_cast<std::int32_t>(i);
            while (parent[r] != r)
                r = parent[r];
            out.label[i] = r;
            roots += r == static_cast<std::int32_t>(i);
        }
        out.firstLabel[b + 1] = roots;
    }
    for (int b = 0; b < bands; ++b)
        out.firstLabel[b + 1] += out.firstLabel[b];
#pragma omp parallel for num_threads(bands) schedule(static, 1)
    for (int b = 0; b < bands; ++b) {
        std::int32_t next = out.firstLabel[b];
        for (std::size_t i = out.start[b]; i < out.start[b + 1]; ++i)
            if (out.label[i] == static_cast<std::int32_t>(i)) parent[i] = next++;
    }
#pragma omp parallel for num_threads(bands) schedule(static, 1)
    for (int b = 0; b < bands; ++b)
        for (std::size_t i = out.start[b]; i < out.start[b + 1]; ++i)
            out.label[i] = parent[out.label[i]];
    out.nComponents = out.firstLabel[bands];
    return out;
}

} // namespace gpuphot::detail
