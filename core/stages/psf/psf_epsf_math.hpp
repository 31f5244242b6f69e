#pragma once
// The arithmetic of one ePSF grid cell (core/stages/psf/psf_epsf.cpp buildEpsfCell; the steps are listed in
// core/stages/psf/psf_epsf.hpp) as inline GPUPHOT_HD pieces, so that the host's cells and the CUDA batch's
// (kernels/psf/psf_epsf.cu) run the same operations in the same order and agree bitwise
// (docs/ARCHITECTURE.md, Determinism). Only + - * /, sqrt, the exact floor/ceil/trunc/fabs and the shared
// profile of core/stages/psf/psf_fit_math.hpp (hdmath exp/log); no CUDA, Eigen or Qt includes.
//
// The cell, with n = 2 radius os + 1 nodes a side and the node of zero offset c = radius os:
//  - the base model at node (i, j): nodeModel;
//  - a star's stamp (starStamp: the shifted centre and its rounded pixel), per pixel (i, j) of the
//    (2 radius + 1)^2 stamp, rows j then columns i, that is inside the frame and unmasked: the node it
//    bins to (pixelNode, -1: off the node grid) and its residual against the base (residualValue). The
//    items in star order, then pixel order, are the order of a node's values;
//  - per node the clipped mean of its values in that order (clippedMean; the median and MAD are order
//    statistics and any correct sort gives them, see there), times the count;
//  - the normalised 3 x 3 binomial convolution (smoothNode), ePSF = model + smoothed residual;
//  - the re-centring (centroidSums over the box recentreBox, recentreShift);
//  - the unit sum at native sampling (nativeSum, nodeImage);
//  - the effective FWHM from the float image sampled at 1/16 px (fwhmHalfSteps, fwhmSampleOffset,
//    psfmath::cellValue, fwhmFromCount).
// Rounding helpers: roundHalfAway is std::lround for finite values (exactly); clampLikeStd is libstdc++'s
// std::clamp (min(max(v, lo), hi)); maxLikeStd std::max.
#include <cmath>

#include "core/stages/psf/psf_fit_math.hpp"
#include "core/util/hd.hpp"
#include "core/util/hd_math.hpp"

namespace gpuphot::epsfmath {

// std::lround for a finite v with |v| < 2^62: to the nearest integer, halves away from zero. v - trunc(v)
// is exact (|v| < 1: trunc is 0; else trunc(v) lies in [v / 2, v], Sterbenz), so the halves are seen
// exactly.
GPUPHOT_HD inline long long roundHalfAway(double v) {
    double t = hdmath::truncOf(v);
    const double f = v - t;
    if (f >= 0.5)
        t += 1.0;
    else if (f <= -0.5)
        t -= 1.0;
    return static_cast<long long>(t);
}

// std::max(a, b) and libstdc++'s std::clamp(v, lo, hi) = std::min(std::max(v, lo), hi), NaN included.
GPUPHOT_HD inline double maxLikeStd(double a, double b) {
    return a < b ? b : a;
}
GPUPHOT_HD inline double clampLikeStd(double v, double lo, double hi) {
    const double t = v < lo ? lo : v;
    return hi < t ? hi : t;
}

// Nodes a side and the node of zero offset.
GPUPHOT_HD inline int nodesPerSide(int radius, int os) {
    return 2 * radius * os + 1;
}
GPUPHOT_HD inline int centreNode(int radius, int os) {
    return radius * os;
}

// Offset of node i (native px).
GPUPHOT_HD inline double nodeOffset(int i, int c, int os) {
    return static_cast<double>(i - c) / os;
}

// The analytic base (psffit parameter vector, centre 0, unit flux) at node (i, j): profileValue.
GPUPHOT_HD inline double nodeModel(const double* base, bool moffat, const psffit::Quadrature& q, int i, int j,
                                   int c, int os) {
    return psffit::evaluate(base, moffat, nodeOffset(i, c, os), nodeOffset(j, c, os), q, nullptr);
}

// A star's stamp: its centre shifted by (sx, sy) and the nearest pixel.
struct StarStamp {
    double xc, yc;
    int ix, iy;
};
GPUPHOT_HD inline StarStamp starStamp(double x0, double y0, double sx, double sy) {
    StarStamp s;
    s.xc = x0 + sx;
    s.yc = y0 + sy;
    s.ix = static_cast<int>(roundHalfAway(s.xc));
    s.iy = static_cast<int>(roundHalfAway(s.yc));
    return s;
}

// Pixel p of a stamp (p in [0, (2 radius + 1)^2), rows then columns).
GPUPHOT_HD inline void stampPixel(const StarStamp& s, int radius, int p, int& i, int& j) {
    const int side = 2 * radius + 1;
    j = s.iy - radius + p / side;
    i = s.ix - radius + p % side;
}

// The node a stamp pixel bins to (kj * n + ki), -1 off the grid; dx, dy: the pixel's offset from the
// centre.
GPUPHOT_HD inline int pixelNode(int i, int j, const StarStamp& s, int os, int c, int n, double& dx,
                                double& dy) {
    dx = i - s.xc;
    dy = j - s.yc;
    const long long ki = roundHalfAway(dx * os) + c, kj = roundHalfAway(dy * os) + c;
    if (ki < 0 || kj < 0 || ki >= n || kj >= n) return -1;
    return static_cast<int>(kj) * n + static_cast<int>(ki);
}

// The residual of a pixel: (data - level - fitted offset) / fitted flux - base at the pixel's offset.
// pixel: the frame's float value.
GPUPHOT_HD inline double residualValue(float pixel, double level, double starBackground, double starFlux,
                                       const double* base, bool moffat, const psffit::Quadrature& q,
                                       double dx, double dy) {
    const double v = (static_cast<double>(pixel) - level - starBackground) / starFlux;
    return v - psffit::evaluate(base, moffat, dx, dy, q, nullptr);
}

// Ascending sort of n values (T: double or int), insertion sort for short runs, heapsort above. For doubles
// without NaN (the host's clippedMean uses std::sort; any correct sort of values without NaN gives the same
// sequence of values, up to the order of +0 and -0, which clippedMean's result does not depend on: see
// there); for a node's item indices (distinct, gathered out of order).
template <class T> GPUPHOT_HD inline void sortAscendingT(T* v, int n) {
    if (n <= 24) {
        for (int k = 1; k < n; ++k) {
            const T x = v[k];
            int q = k;
            for (; q > 0 && x < v[q - 1]; --q)
                v[q] = v[q - 1];
            v[q] = x;
        }
        return;
    }
    auto sift = [v](int root, int end) { // max-heap on [0, end)
        for (;;) {
            int child = 2 * root + 1;
            if (child >= end) return;
            if (child + 1 < end && v[child] < v[child + 1]) ++child;
            if (!(v[root] < v[child])) return;
            const T t = v[root];
            v[root] = v[child];
            v[child] = t;
            root = child;
        }
    };
    for (int k = n / 2 - 1; k >= 0; --k)
        sift(k, n);
    for (int end = n - 1; end > 0; --end) {
        const T t = v[0];
        v[0] = v[end];
        v[end] = t;
        sift(0, end);
    }
}

GPUPHOT_HD inline void sortAscending(double* v, int n) {
    sortAscendingT(v, n);
}

GPUPHOT_HD inline void sortIndices(int* v, int n) {
    sortAscendingT(v, n);
}

// Median of n >= 1 sorted values.
GPUPHOT_HD inline double sortedMedian(const double* v, int n) {
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Mean after one 3-sigma clip around the median (MAD scale); plain mean for fewer than 4 values. v: the
// n >= 1 values in item order; work: n doubles; sort(double*, int): an ascending sort.
// With finite values the result does not depend on the sort's order of equal values: the only equal
// values that differ are +0 and -0; a median of them, m, enters as x - m and |x - m| (the same for m =
// +0 and -0 after fabs), and as the result only when no value passes the clip, which cannot happen (at
// least half the values lie within the MAD < 3 sigma; sigma <= 0 keeps all).
template <class Sort>
GPUPHOT_HD inline double clippedMean(const double* v, int n, double* work, const Sort& sort) {
    if (n < 4) {
        double s = 0.0;
        for (int k = 0; k < n; ++k)
            s += v[k];
        return s / static_cast<double>(n);
    }
    for (int k = 0; k < n; ++k)
        work[k] = v[k];
    sort(work, n);
    const double med = sortedMedian(work, n);
    for (int k = 0; k < n; ++k)
        work[k] = hdmath::fabsOf(work[k] - med);
    sort(work, n);
    const double sigma = 1.4826 * sortedMedian(work, n);
    double s = 0.0;
    int kept = 0;
    for (int q = 0; q < n; ++q) {
        const double x = v[q];
        if (sigma <= 0.0 || hdmath::fabsOf(x - med) <= 3.0 * sigma) {
            s += x;
            ++kept;
        }
    }
    return kept > 0 ? s / kept : med;
}

// sortAscending as clippedMean's sort (the CUDA batch's and its host emulation's; the host stage uses
// std::sort).
struct SortAscending {
    GPUPHOT_HD void operator()(double* v, int n) const { sortAscending(v, n); }
};

// A node's clipped mean times its count from its m >= 1 items gathered in any order (the CUDA batch's
// way: item indices scattered by atomics): idx (the item indices, sorted here into item order), the items'
// values; vals and work: m doubles each.
GPUPHOT_HD inline double nodeMeanOfItems(int* idx, int m, const double* itemValue, double* vals,
                                         double* work) {
    sortIndices(idx, m);
    for (int t = 0; t < m; ++t)
        vals[t] = itemValue[idx[t]];
    return clippedMean(vals, m, work, SortAscending{}) * static_cast<double>(m);
}

// Normalised convolution of the count-weighted node means (mean: clipped mean * count) with the 3 x 3
// binomial kernel at node (i, j); 0 where no neighbour has a value.
GPUPHOT_HD inline double smoothNode(const double* mean, const double* count, int n, int i, int j) {
    const double kern[3] = {1.0, 2.0, 1.0};
    double s = 0.0, w = 0.0;
    for (int b = -1; b <= 1; ++b)
        for (int a = -1; a <= 1; ++a) {
            const int ii = i + a, jj = j + b;
            if (ii < 0 || jj < 0 || ii >= n || jj >= n) continue;
            const double k = kern[a + 1] * kern[b + 1];
            const long long q = static_cast<long long>(jj) * n + ii;
            s += k * mean[q];
            w += k * count[q];
        }
    return w > 0.0 ? s / w : 0.0;
}

// Radius (native px) of the re-centring disc: max(1, FWHM of the base), 2 when that is not finite.
GPUPHOT_HD inline double recentreRadius(double baseFwhm) {
    return maxLikeStd(1.0, hdmath::isFinite(baseFwhm) ? baseFwhm : 2.0);
}

// Half-size (nodes, around c, at most c) of a box holding every node of the disc of radius rc: the box is
// smaller than the grid only when rc < radius (<= 200), and then a node with |i - c| >= ceil(rc os) + 2
// has |dx| >= rc + 2 / os (less a few ulps; os <= 16), whose rounded square exceeds rc^2 rounded by far,
// as does dx^2 + dy^2, so it never passes the disc test; skipping such nodes leaves the sums of the
// others, in their order: bitwise the sums over the whole grid.
GPUPHOT_HD inline int recentreBox(double rc, int os, int c) {
    const double h = hdmath::ceilOf(rc * os) + 1.0;
    return h >= c ? c : static_cast<int>(h);
}

// Centroid sums of the positive ePSF e within the disc of radius rc, nodes in rows j then columns i.
struct CentroidSums {
    double s = 0.0, sx = 0.0, sy = 0.0;
};
GPUPHOT_HD inline CentroidSums centroidSums(const double* e, int n, int c, int os, double rc) {
    CentroidSums r;
    const int h = recentreBox(rc, os, c);
    for (int j = c - h; j <= c + h; ++j)
        for (int i = c - h; i <= c + h; ++i) {
            const double dx = nodeOffset(i, c, os), dy = nodeOffset(j, c, os);
            const double v = e[static_cast<long long>(j) * n + i];
            if (v <= 0.0 || dx * dx + dy * dy > rc * rc) continue;
            r.s += v;
            r.sx += v * dx;
            r.sy += v * dy;
        }
    return r;
}

// The shift of the re-centring pass; false: none (no positive sum, or the centroid within 1e-4 px).
GPUPHOT_HD inline bool recentreShift(const CentroidSums& r, double& cx, double& cy) {
    if (!(r.s > 0.0)) return false;
    cx = r.sx / r.s;
    cy = r.sy / r.s;
    return hdmath::fabsOf(cx) > 1e-4 || hdmath::fabsOf(cy) > 1e-4;
}

// Sum of the nodes of zero sub-pixel phase (rows j then columns i).
GPUPHOT_HD inline double nativeSum(const double* e, int n, int os) {
    double sum = 0.0;
    for (int j = 0; j < n; j += os)
        for (int i = 0; i < n; i += os)
            sum += e[static_cast<long long>(j) * n + i];
    return sum;
}

// A node of the float image: e / sum (0 without a positive sum), rounded to float.
GPUPHOT_HD inline float nodeImage(double e, double sum) {
    return static_cast<float>(sum > 0.0 ? e / sum : 0.0);
}

// The effective FWHM's sampling: 1/16 px over [-m, m]^2 steps, m = ceil(half * 16), half = 2 FWHM of the
// base clamped to [2, radius] (6 when that is not finite).
inline constexpr int kFwhmSteps = 16;
GPUPHOT_HD inline int fwhmHalfSteps(double baseFwhm, int radius) {
    const double half =
        clampLikeStd(hdmath::isFinite(baseFwhm) ? 2.0 * baseFwhm : 6.0, 2.0, static_cast<double>(radius));
    return static_cast<int>(hdmath::ceilOf(half * kFwhmSteps));
}
GPUPHOT_HD inline double fwhmSampleOffset(int k) {
    return static_cast<double>(k) / kFwhmSteps;
}
// Diameter of the disc with the area of the samples at or above half the peak; NaN without a positive peak.
GPUPHOT_HD inline double fwhmFromCount(unsigned long long above, double peak) {
    const double area = static_cast<double>(above) / (kFwhmSteps * kFwhmSteps);
    const double pi = 3.141592653589793; // std::numbers::pi
    return peak > 0.0 ? 2.0 * hdmath::sqrtOf(area / pi) : hdmath::quietNan();
}

} // namespace gpuphot::epsfmath
