#pragma once
// SExtractor's mesh estimator after its two sigma-clipping passes, as inline GPUPHOT_HD pieces that the
// CPU stage (core/stages/background/background.cpp, meshStatistics) and the CUDA kernel
// (kernels/background/background.cu, meshStatsKernel) both run, so that the two agree bitwise
// (docs/ARCHITECTURE.md, Determinism): the histogram's quantisation from the clipped mean and sigma, then
// the iterative clipping of the histogram around its median and the mode (2.5 median - 1.5 mean, or the
// median when the distribution is skewed). Each engine fills the histogram itself (integer counts, so
// the order does not matter). Only + - * / and sqrt; no CUDA or Qt includes.
#include <cmath>

#include "core/util/hd.hpp"
#include "core/util/hd_math.hpp"

namespace gpuphot::bkgmath {

constexpr int kMaxLevels = 4096;      // SExtractor QUANTIF_NMAXLEVELS
constexpr double kHistoSigmas = 5.0;  // SExtractor QUANTIF_NSIGMA: the histogram spans mean +- 5 sigma
constexpr double kModePixels = 4.0;   // SExtractor QUANTIF_AMIN: pixels per bin at the mode
constexpr double kClipSigmas = 3.0;   // clipping of the histogram around its median
constexpr double kModeFallback = 0.3; // |mean - median| / sigma beyond which the median replaces the mode
constexpr int kMaxClipRounds = 100;
constexpr double kClipConvergence = 1e-4;
constexpr double kPi = 3.14159265358979323846; // M_PI

// The histogram of n clipped pixels of this mean and sigma: nlevels bins over mean +- kHistoSigmas sigma,
// about kModePixels pixels per bin at the peak of a Gaussian. A value v falls in bin
// int(v / qscale + cste) when v / qscale + cste lies in (-1, nlevels).
struct HistoScale {
    int nlevels;
    float qscale;
    float qzero;
    float cste;
};

GPUPHOT_HD inline HistoScale histoScale(double mean, double sigma, long long n) {
    const double step = hdmath::sqrtOf(2.0 / kPi) * kHistoSigmas / kModePixels;
    const double levels = step * static_cast<double>(n) + 1.0;
    HistoScale q;
    q.nlevels = static_cast<int>(double(kMaxLevels) < levels ? double(kMaxLevels) : levels);
    q.qscale = sigma > 0.0 ? static_cast<float>(2.0 * kHistoSigmas * sigma / q.nlevels) : 1.0f;
    q.qzero = static_cast<float>(mean - kHistoSigmas * sigma);
    q.cste = static_cast<float>(0.499999 - static_cast<double>(q.qzero / q.qscale));
    return q;
}

struct MeshMode {
    float level; // ADU, the mode
    float rms;   // ADU, the clipped histogram's sigma
};

// The median fill of one clipHistogram round over bins lo..hi, from the histogram's exclusive prefix sums
// (G[k] = histo[0] + ... + histo[k - 1]) instead of bin by bin. The fill merges the low side's sums
// L(i) = G[lo + i] - G[lo] and the high side's R(j) = G[hi + 1] - G[hi + 1 - j] (the smaller side takes
// the next bin, ties to the high side) for n = hi - lo + 1 bins; L(i) takes place i + #{j : R(j) <= L(i)}
// in that merge, so the low side ends with the bins whose L(i) has a place below n. Both sequences never
// decrease: two bisections, O(log^2 n) instead of n steps. The same integers as clipHistogram's fill
// (a: first bin of the high side, b = a - 1, the two sums).
struct MedianSplit {
    int a, b;
    long long lowSum, highSum;
};

template <class Prefix> GPUPHOT_HD inline MedianSplit medianSplit(const Prefix* G, int lo, int hi) {
    const int n = hi - lo + 1;
    if (n <= 0) return {lo, hi, 0, 0};
    const long long base = G[lo], top = G[hi + 1];
    // #{j in [0, n] : R(j) <= v}: the first j with R(j) > v.
    const auto highAtMost = [&](long long v) {
        int l = 0, h = n + 1;
        while (l < h) {
            const int m = (l + h) / 2;
            if (top - static_cast<long long>(G[hi + 1 - m]) <= v)
                l = m + 1;
            else
                h = m;
        }
        return l;
    };
    int l = 0, h = n; // the first i with place(i) >= n (place(n) >= n)
    while (l < h) {
        const int m = (l + h) / 2;
        if (m + highAtMost(static_cast<long long>(G[lo + m]) - base) >= n)
            h = m;
        else
            l = m + 1;
    }
    const long long low = static_cast<long long>(G[lo + l]) - base;
    return {lo + l, lo + l - 1, low, top - base - low};
}

// The state of clipHistogram's rounds: the bin range, the clipped sigma (sig1: the previous round's), mean
// and median, in bins.
struct ClipState {
    int lo, hi;
    double sig, sig1, mea, med;
};

GPUPHOT_HD inline ClipState clipStart(const HistoScale& q) {
    return {0, q.nlevels - 1, 10.0 * (q.nlevels - 1), 1.0, 0.0, 0.0};
}

// Whether round `round` runs (the first always; then while sigma is above 0.1 bin and still moving).
GPUPHOT_HD inline bool clipGoesOn(const ClipState& s, int round) {
    return round == 0 || (s.sig >= 0.1 && hdmath::fabsOf(s.sig / s.sig1 - 1.0) > kClipConvergence);
}

// One round's results from its median fill (f, with denom = max(histo[f.a], histo[f.b])) and the moments of
// bins lo..hi (total = sum c, m1 = sum c i, m2 = sum c i^2: integers): median, mean, sigma, next range.
GPUPHOT_HD inline void clipRound(ClipState& s, int top, const MedianSplit& f, long long denom,
                                 long long total, long long m1, long long m2) {
    s.sig1 = s.sig;
    // The low side holds bins lo..b, the high side b+1..hi: the median lies near the edge b + 0.5.
    s.med = f.b >= 0
                ? f.b + 0.5 + (denom > 0 ? static_cast<double>(f.highSum - f.lowSum) / (2.0 * denom) : 0.0)
                : 0.0;
    s.mea = 0.0;
    double sig = 0.0;
    if (total > 0) {
        s.mea = static_cast<double>(m1) / static_cast<double>(total);
        sig = static_cast<double>(m2) / static_cast<double>(total) - s.mea * s.mea;
    }
    s.sig = sig > 0.0 ? hdmath::sqrtOf(sig) : 0.0;
    const double l = s.med - kClipSigmas * s.sig;
    const double u = s.med + kClipSigmas * s.sig;
    s.lo = l > 0.0 ? static_cast<int>(l + 0.5) : 0;
    s.hi = u < top ? (u > 0.0 ? static_cast<int>(u + 0.5) : static_cast<int>(u - 0.5)) : top;
    if (s.hi < -1) s.hi = -1;
}

// The mode (2.5 median - 1.5 mean, or the median when the distribution is skewed) and sigma in ADU.
GPUPHOT_HD inline MeshMode clipMode(const ClipState& s, const HistoScale& q) {
    double mode;
    if (s.sig > 0.0) {
        if (hdmath::fabsOf((s.mea - s.med) / s.sig) < kModeFallback)
            mode = q.qzero + (2.5 * s.med - 1.5 * s.mea) * q.qscale;
        else
            mode = q.qzero + s.med * q.qscale;
    } else {
        mode = q.qzero + s.mea * q.qscale;
    }
    return {static_cast<float>(mode), static_cast<float>(s.sig * q.qscale)};
}

// Iterative kClipSigmas clipping of histo[0 .. nlevels - 1] (histo[nlevels] is 0) around its median:
// the median fills from both ends, the lighter side taking the next bin (ties to the top side); the
// moments are summed as integers (exact, order independent).
template <class Count> GPUPHOT_HD inline MeshMode clipHistogram(const Count* histo, const HistoScale& q) {
    const int top = q.nlevels - 1;
    ClipState s = clipStart(q);
    for (int round = 0; round < kMaxClipRounds && clipGoesOn(s, round); ++round) {
        long long lowSum = 0, highSum = 0, total = 0, m1 = 0, m2 = 0;
        int a = s.lo, b = s.hi;
        for (int i = s.lo; i <= s.hi; ++i) {
            if (lowSum < highSum)
                lowSum += histo[a++];
            else
                highSum += histo[b--];
            const long long c = histo[i];
            total += c;
            m1 += c * i;
            m2 += c * i * i;
        }
        const long long denom = b >= 0 ? (histo[a] < histo[b] ? histo[b] : histo[a]) : 0;
        clipRound(s, top, MedianSplit{a, b, lowSum, highSum}, denom, total, m1, m2);
    }
    return clipMode(s, q);
}

} // namespace gpuphot::bkgmath
