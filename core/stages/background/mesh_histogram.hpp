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

// Iterative kClipSigmas clipping of histo[0 .. nlevels - 1] (histo[nlevels] is 0) around its median:
// the median fills from both ends, the lighter side taking the next bin (ties to the top side); the
// moments are summed as integers (exact, order independent).
template <class Count> GPUPHOT_HD inline MeshMode clipHistogram(const Count* histo, const HistoScale& q) {
    const int top = q.nlevels - 1;
    int lo = 0, hi = top;
    double sig = 10.0 * top, sig1 = 1.0, mea = 0.0, med = 0.0;
    for (int round = 0; round < kMaxClipRounds; ++round) {
        if (round > 0 && !(sig >= 0.1 && hdmath::fabsOf(sig / sig1 - 1.0) > kClipConvergence)) break;
        sig1 = sig;
        long long lowSum = 0, highSum = 0, total = 0, m1 = 0, m2 = 0;
        int a = lo, b = hi;
        for (int i = lo; i <= hi; ++i) {
            if (lowSum < highSum)
                lowSum += histo[a++];
            else
                highSum += histo[b--];
            const long long c = histo[i];
            total += c;
            m1 += c * i;
            m2 += c * i * i;
        }
        if (b >= 0) {
            // The low side holds bins lo..b, the high side b+1..hi: the median lies near the edge b + 0.5.
            const long long denom = histo[a] < histo[b] ? histo[b] : histo[a];
            med = b + 0.5 + (denom > 0 ? static_cast<double>(highSum - lowSum) / (2.0 * denom) : 0.0);
        } else {
            med = 0.0;
        }
        mea = 0.0;
        sig = 0.0;
        if (total > 0) {
            mea = static_cast<double>(m1) / static_cast<double>(total);
            sig = static_cast<double>(m2) / static_cast<double>(total) - mea * mea;
        }
        sig = sig > 0.0 ? hdmath::sqrtOf(sig) : 0.0;
        const double l = med - kClipSigmas * sig;
        const double u = med + kClipSigmas * sig;
        lo = l > 0.0 ? static_cast<int>(l + 0.5) : 0;
        hi = u < top ? (u > 0.0 ? static_cast<int>(u + 0.5) : static_cast<int>(u - 0.5)) : top;
        if (hi < -1) hi = -1;
    }
    double mode;
    if (sig > 0.0) {
        if (hdmath::fabsOf((mea - med) / sig) < kModeFallback)
            mode = q.qzero + (2.5 * med - 1.5 * mea) * q.qscale;
        else
            mode = q.qzero + med * q.qscale;
    } else {
        mode = q.qzero + mea * q.qscale;
    }
    return {static_cast<float>(mode), static_cast<float>(sig * q.qscale)};
}

} // namespace gpuphot::bkgmath
