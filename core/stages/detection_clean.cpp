// CLEAN: merge detections that are explained by the wing of a brighter neighbour.
//
// Each object j with a filtered peak A above its local threshold t models its wing as an elliptical
// Moffat profile P(r) = A (1 + r^2 / alpha^2)^-beta, where r is the elliptical radius from its
// isophotal barycentre in units of its second-moment sigma, beta = 1 / cleanParam, and alpha is such
// that P reaches t at the isophotal limit R (pi a b R^2 = isophotal area). A fainter object i (filtered
// peak below A; ties: the later index) within r < 10 R is merged into j when its filtered peak minus
// P_j at that peak is below its own threshold: without j's wing it would not have been detected.
// Each object merges into the neighbour with the largest wing there (ties: the lower index); chains
// resolve to the brightest. Candidate pairs are found in parallel and combined in a fixed order.
#include <algorithm>
#include <cmath>
#include <tuple>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/stages/detection_internal.hpp"

namespace gpuphot::detail {

namespace {
constexpr double kPi = 3.14159265358979323846;
constexpr double kCleanZone = 10.0; // in units of the isophotal limit R
constexpr int kCell = 32;           // px, grid cell for the neighbour search

bool brighter(const std::vector<IsoMeasure>& m, std::int32_t j, std::int32_t i) {
    return m[j].detPeak > m[i].detPeak || (m[j].detPeak == m[i].detPeak && j < i);
}

struct Candidate {
    std::int32_t i, j;
    double wing;
};
} // namespace

std::vector<std::int32_t> cleanTargets(const std::vector<IsoMeasure>& m, const DetectionImages& im,
                                       const DetectionParams& p, int threads) {
    const auto n = static_cast<std::int32_t>(m.size());
    std::vector<std::int32_t> target(n, -1);
    if (n < 2 || !(p.cleanParam > 0.0)) return target;
    const double beta = 1.0 / p.cleanParam;

    // Grid of objects by their filtered-peak pixel; each cell lists its objects in index order.
    const int gw = (im.width + kCell - 1) / kCell, gh = (im.height + kCell - 1) / kCell;
    std::vector<std::int32_t> cellStart(static_cast<std::size_t>(gw) * gh + 1, 0), items(n);
    auto cellOf = [&](std::int32_t i) {
        return static_cast<std::size_t>(m[i].detPeakY / kCell) * gw + m[i].detPeakX / kCell;
    };
    for (std::int32_t i = 0; i < n; ++i)
        ++cellStart[cellOf(i) + 1];
    for (std::size_t c = 0; c + 1 < cellStart.size(); ++c)
        cellStart[c + 1] += cellStart[c];
    {
        std::vector<std::int32_t> fill(cellStart.begin(), cellStart.end() - 1);
        for (std::int32_t i = 0; i < n; ++i)
            items[fill[cellOf(i)]++] = i;
    }

    std::vector<std::vector<Candidate>> perThread(std::max(1, threads));
#pragma omp parallel for num_threads(threads) schedule(dynamic, 64)
    for (std::int32_t j = 0; j < n; ++j) {
        const IsoMeasure& mj = m[j];
        if (!(mj.thrAtPeak > 0.0) || !(mj.detPeak > mj.thrAtPeak)) continue;
        const double det = mj.x2 * mj.y2 - mj.xy * mj.xy;
        const double r2Iso = mj.area / (kPi * std::sqrt(det));
        const double ratio = mj.detPeak / mj.thrAtPeak;
        const double alpha2 = r2Iso / (std::pow(ratio, 1.0 / beta) - 1.0);
        if (!(alpha2 > 0.0) || !std::isfinite(alpha2)) continue;
        const double zone2 = kCleanZone * kCleanZone * r2Iso;
        const double rPx = std::sqrt(zone2) * mj.a; // the zone's extent in pixels along the major axis
        const int cx0 = std::max(0, static_cast<int>(std::floor((mj.xIso - rPx) / kCell)));
        const int cx1 = std::min(gw - 1, static_cast<int>(std::floor((mj.xIso + rPx) / kCell)));
        const int cy0 = std::max(0, static_cast<int>(std::floor((mj.yIso - rPx) / kCell)));
        const int cy1 = std::min(gh - 1, static_cast<int>(std::floor((mj.yIso + rPx) / kCell)));
#ifdef _OPENMP
        auto& out = perThread[omp_get_thread_num()];
#else
        auto& out = perThread[0];
#endif
        for (int cy = cy0; cy <= cy1; ++cy) {
            for (int cx = cx0; cx <= cx1; ++cx) {
                const std::size_t c = static_cast<std::size_t>(cy) * gw + cx;
                for (std::int32_t q = cellStart[c]; q < cellStart[c + 1]; ++q) {
                    const std::int32_t i = items[q];
                    if (i == j || !brighter(m, j, i)) continue;
                    const double dx = m[i].detPeakX - mj.xIso, dy = m[i].detPeakY - mj.yIso;
                    const double r2 = mj.cxx * dx * dx + mj.cyy * dy * dy + mj.cxy * dx * dy;
                    if (r2 > zone2) continue;
                    const double wing = mj.detPeak * std::pow(1.0 + r2 / alpha2, -beta);
                    if (m[i].detPeak - wing < m[i].thrAtPeak) out.push_back({i, j, wing});
                }
            }
        }
    }

    // Combine: per object the largest wing, ties to the lower j (independent of the thread split).
    std::vector<double> bestWing(n, -1.0);
    for (const auto& v : perThread) {
        for (const Candidate& c : v) {
            if (c.wing > bestWing[c.i] || (c.wing == bestWing[c.i] && c.j < target[c.i])) {
                bestWing[c.i] = c.wing;
                target[c.i] = c.j;
            }
        }
    }
    // Resolve chains (targets are strictly brighter, so they end).
    std::vector<std::int32_t> final(n, -1);
    for (std::int32_t i = 0; i < n; ++i) {
        std::int32_t t = target[i];
        if (t < 0) continue;
        while (target[t] >= 0)
            t = target[t];
        final[i] = t;
    }
    return final;
}

} // namespace gpuphot::detail
