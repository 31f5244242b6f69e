#pragma once
// The arithmetic of the PSF stage's profile fits (Levenberg–Marquardt, core/stages/psf/psf_moffat.cpp
// fitProfile) as GPUPHOT_HD pieces, so that the host's fits and the CUDA kernel's (kernels/psf/psf.cu, one
// block per star) run the same operations in the same order and agree bitwise (docs/ARCHITECTURE.md,
// Determinism). Only + - * / and the shared exp/log of core/util/hd_math.hpp; no CUDA, Eigen or Qt includes.
//
// The fixed order of the sums over a star's samples (chi2 and the normal equations): kLmLanes lanes,
// lane l sums the samples l, l + kLmLanes, l + 2 kLmLanes, ... in that order (accumulateSample), then
// the lanes are added as a tree, lane l += lane l + s for s = kLmLanes / 2, ..., 2, 1. The host runs
// the lanes two at a time (LaneSums in psf_moffat.cpp, SSE2 pairs); the device one lane a thread.
// The order does not depend on the number of host threads or on the launch configuration.
//
// lmFit is the whole iteration, templated on the evaluator that makes those sums at a parameter vector:
//   double Eval::operator()(const double p[kLmParams], double limit, double h[kLmNormal], double g[8])
// returns chi2 at p, or a value > limit (inf allowed) when chi2 > limit. It fills h (the lower triangle
// of J^T W J, row by row: (0,0), (1,0), (1,1), (2,0), ...) and g (J^T W r) over the active parameters
// whenever the result is <= limit, and always when limit is +inf. Every thread of a block runs lmFit with the
// same inputs and so the same steps (the 8 x 8 solve included); the evaluator is entered by all of them
// together.
#include "core/util/hd.hpp"
#include "core/util/hd_math.hpp"
#if !defined(__CUDACC__)
#include "core/util/hd_math_pair.hpp" // the host's two-sample overloads, visible to the templates below
#endif

namespace gpuphot::psffit {

inline constexpr int kLmParams = 8;                               // x0, y0, amp, bkg, c11, c12, c22, beta
inline constexpr int kLmNormal = kLmParams * (kLmParams + 1) / 2; // lower triangle incl. diagonal
inline constexpr int kLmLanes = 128;                              // lanes of the fixed sum order
inline constexpr int kLmSums = 1 + kLmNormal + kLmParams;         // chi2, h, g: the per-lane partials
enum ParamIndex { PX0, PY0, PAMP, PBKG, PC11, PC12, PC22, PBETA };

// Gauss–Legendre nodes and weights on [-0.5, 0.5] (weights sum to 1), n = 1..5 (clamped).
struct Quadrature {
    int n = 1;
    double node[5] = {};
    double weight[5] = {};
};

GPUPHOT_HD inline Quadrature quadrature(int n) {
    Quadrature q;
    q.n = n < 1 ? 1 : (n > 5 ? 5 : n);
    switch (q.n) {
    case 1:
        q.node[0] = 0.0;
        q.weight[0] = 1.0;
        break;
    case 2:
        q.node[0] = -0.28867513459481287, q.node[1] = 0.28867513459481287;
        q.weight[0] = 0.5, q.weight[1] = 0.5;
        break;
    case 3:
        q.node[0] = -0.3872983346207417, q.node[1] = 0.0, q.node[2] = 0.3872983346207417;
        q.weight[0] = 5.0 / 18.0, q.weight[1] = 8.0 / 18.0, q.weight[2] = 5.0 / 18.0;
        break;
    case 4:
        q.node[0] = -0.4305681557970263, q.node[1] = -0.16999052179242815;
        q.node[2] = 0.16999052179242815, q.node[3] = 0.4305681557970263;
        q.weight[0] = 0.17392742256872692, q.weight[1] = 0.32607257743127307;
        q.weight[2] = 0.32607257743127307, q.weight[3] = 0.17392742256872692;
        break;
    default:
        q.node[0] = -0.453089922969332, q.node[1] = -0.26923465505284155, q.node[2] = 0.0;
        q.node[3] = 0.26923465505284155, q.node[4] = 0.453089922969332;
        q.weight[0] = 0.11846344252809454, q.weight[1] = 0.23931433524968324;
        q.weight[2] = 0.28444444444444444, q.weight[3] = 0.23931433524968324;
        q.weight[4] = 0.11846344252809454;
        break;
    }
    return q;
}

// Model value at (x, y) integrated over the pixel; when d != nullptr also the 8 partial derivatives.
// moffat: (1 + Q)^-beta, else the Gaussian exp(-Q / 2). T: double, or on the host hdmath::D2 (two samples
// at once, core/util/hd_math_pair.hpp: each element bitwise the double version).
template <class T>
GPUPHOT_HD inline T evaluateT(const double* p, bool moffat, T x, T y, const Quadrature& q, T* d) {
    T value{};
    T g0{}, gx0{}, gy0{}, g11{}, g12{}, g22{}, gbeta{};
    const double amp = p[PAMP], beta = p[PBETA];
    for (int j = 0; j < q.n; ++j) {
        const T dy = y + q.node[j] - p[PY0];
        for (int i = 0; i < q.n; ++i) {
            const T dx = x + q.node[i] - p[PX0];
            const double w = q.weight[i] * q.weight[j];
            const T quad = p[PC11] * dx * dx + 2.0 * p[PC12] * dx * dy + p[PC22] * dy * dy;
            T g, dgdq, dgdbeta{};
            if (moffat) {
                const T base = 1.0 + quad;
                const T lb = hdmath::log(base);
                g = hdmath::exp(-beta * lb);
                dgdq = -beta * g / base;
                dgdbeta = -g * lb;
            } else {
                g = hdmath::exp(-0.5 * quad);
                dgdq = -0.5 * g;
            }
            value += w * g;
            if (d) {
                const T wq = w * dgdq;
                g0 += w * g;
                gx0 += wq * (-2.0) * (p[PC11] * dx + p[PC12] * dy);
                gy0 += wq * (-2.0) * (p[PC12] * dx + p[PC22] * dy);
                g11 += wq * dx * dx;
                g12 += wq * 2.0 * dx * dy;
                g22 += wq * dy * dy;
                gbeta += w * dgdbeta;
            }
        }
    }
    if (d) {
        d[PX0] = amp * gx0;
        d[PY0] = amp * gy0;
        d[PAMP] = g0;
        d[PBKG] = T{} + 1.0;
        d[PC11] = amp * g11;
        d[PC12] = amp * g12;
        d[PC22] = amp * g22;
        d[PBETA] = amp * gbeta;
    }
    return amp * value + p[PBKG];
}

GPUPHOT_HD inline double evaluate(const double* p, bool moffat, double x, double y, const Quadrature& q,
                                  double* d) {
    return evaluateT<double>(p, moffat, x, y, q, d);
}

// What a fit needs besides its samples (the fitted parameters: active[0 .. nActive)).
struct LmSetup {
    bool moffat = true;
    Quadrature quad;
    int nActive = 0;
    int active[kLmParams] = {};
    int maxIterations = 100;
    double relTolerance = 1e-10, posTolerance = 1e-6;
    double betaMin = 1.2, betaMax = 15.0;
    double maxShift = 3.0;
    double startX = 0.0, startY = 0.0; // the centre the shift limit is measured from
};

struct LmOutcome {
    double p[kLmParams] = {};
    double chi2 = 0.0; // total, not reduced
    int iterations = 0;
    bool converged = false;
    bool started = false; // false: the start was not valid, p is the start as given
};

// One sample's terms added to a lane's partials: sums[0] += w r^2, then h (kLmNormal), then g (nActive).
// A NaN residual propagates into the sums (and so rejects the trial). T as for evaluateT (with D2: two
// lanes, one in each element).
template <class T>
GPUPHOT_HD inline void accumulateSampleT(const LmSetup& s, const double* p, T x, T y, T value, T weight,
                                         T* sums) {
    T d[kLmParams];
    const T r = value - evaluateT<T>(p, s.moffat, x, y, s.quad, d);
    sums[0] += weight * r * r;
    T* h = sums + 1;
    T* g = sums + 1 + kLmNormal;
    int t = 0;
    for (int a = 0; a < s.nActive; ++a) {
        const T da = d[s.active[a]];
        const T wa = weight * da;
        g[a] += wa * r;
        for (int b = 0; b <= a; ++b)
            h[t++] += wa * d[s.active[b]];
    }
}

GPUPHOT_HD inline void accumulateSample(const LmSetup& s, const double* p, double x, double y, double value,
                                        double weight, double* sums) {
    accumulateSampleT<double>(s, p, x, y, value, weight, sums);
}

// Index of (a, b), b <= a, in the packed lower triangle.
GPUPHOT_HD inline int packed(int a, int b) {
    return a * (a + 1) / 2 + b;
}

// Solves (h with its diagonal times (1 + lambda), plus 1e-300) x = g by LDL^T without pivoting (the
// damped normal matrix is symmetric positive definite). A singular h gives a huge or non-finite step,
// which lmFit rejects (validParams, isFinite). n <= kLmParams.
GPUPHOT_HD inline void solveDamped(const double* h, const double* g, int n, double lambda, double* x) {
    double l[kLmParams][kLmParams];
    double dg[kLmParams];
    for (int j = 0; j < n; ++j) {
        double dj = h[packed(j, j)] * (1.0 + lambda) + 1e-300;
        for (int k = 0; k < j; ++k)
            dj -= l[j][k] * l[j][k] * dg[k];
        dg[j] = dj;
        for (int i = j + 1; i < n; ++i) {
            double v = h[packed(i, j)];
            for (int k = 0; k < j; ++k)
                v -= l[i][k] * l[j][k] * dg[k];
            l[i][j] = v / dj;
        }
    }
    for (int i = 0; i < n; ++i) { // forward: L y = g
        double v = g[i];
        for (int k = 0; k < i; ++k)
            v -= l[i][k] * x[k];
        x[i] = v;
    }
    for (int i = 0; i < n; ++i)
        x[i] /= dg[i];
    for (int i = n - 1; i >= 0; --i) { // back: L^T x = y / d
        double v = x[i];
        for (int k = i + 1; k < n; ++k)
            v -= l[k][i] * x[k];
        x[i] = v;
    }
}

GPUPHOT_HD inline double clampBeta(double b, const LmSetup& s) {
    return b < s.betaMin ? s.betaMin : (b > s.betaMax ? s.betaMax : b);
}

GPUPHOT_HD inline bool validParams(const double* p, const LmSetup& s) {
    const double det = p[PC11] * p[PC22] - p[PC12] * p[PC12];
    return hdmath::isFinite(det) && p[PC11] > 0.0 && det > 0.0 && p[PAMP] > 0.0 &&
           hdmath::absOf(p[PX0] - s.startX) <= s.maxShift && hdmath::absOf(p[PY0] - s.startY) <= s.maxShift;
}

// Levenberg–Marquardt with Marquardt's diagonal damping from p (in: the start, out: the fit). Requires
// more samples than active parameters (the caller's check). A start that is not valid returns at once
// (iterations 0, chi2 0, not converged, p as given).
template <class Eval> GPUPHOT_HD LmOutcome lmFit(const LmSetup& s, const double* start, Eval& eval) {
    LmOutcome out;
    for (int k = 0; k < kLmParams; ++k)
        out.p[k] = start[k];
    double p[kLmParams];
    for (int k = 0; k < kLmParams; ++k)
        p[k] = start[k];
    if (s.moffat) p[PBETA] = clampBeta(p[PBETA], s);
    if (!validParams(p, s)) return out;
    out.started = true;

    const double inf = hdmath::infinity();
    double h[kLmNormal], g[kLmParams], ht[kLmNormal], gt[kLmParams];
    double chi2 = eval(p, inf, h, g);
    double lambda = 1e-3;
    int it = 0;
    bool converged = false;
    const int n = s.nActive;
    while (it < s.maxIterations && !converged) {
        ++it;
        double delta[kLmParams];
        solveDamped(h, g, n, lambda, delta);
        double trial[kLmParams];
        for (int k = 0; k < kLmParams; ++k)
            trial[k] = p[k];
        bool finite = true;
        for (int k = 0; k < n; ++k) {
            trial[s.active[k]] += delta[k];
            finite = finite && hdmath::isFinite(delta[k]);
        }
        if (s.moffat) trial[PBETA] = clampBeta(trial[PBETA], s);
        const double chi2Trial = finite && validParams(trial, s) ? eval(trial, chi2, ht, gt) : inf;
        if (chi2Trial <= chi2) {
            const double decrease = (chi2 - chi2Trial) / (chi2 > 1e-300 ? chi2 : 1e-300);
            const double sx = hdmath::absOf(trial[PX0] - p[PX0]), sy = hdmath::absOf(trial[PY0] - p[PY0]);
            const double shift = sx > sy ? sx : sy;
            for (int k = 0; k < kLmParams; ++k)
                p[k] = trial[k];
            chi2 = chi2Trial;
            for (int k = 0; k < kLmNormal; ++k)
                h[k] = ht[k];
            for (int k = 0; k < kLmParams; ++k)
                g[k] = gt[k];
            lambda = lambda * 0.1 > 1e-12 ? lambda * 0.1 : 1e-12;
            if (decrease < s.relTolerance && shift < s.posTolerance) converged = true;
        } else {
            lambda *= 10.0;
            // No step along the gradient lowers chi2 any more: at the minimum (to rounding).
            if (lambda > 1e12) converged = true;
        }
    }
    for (int k = 0; k < kLmParams; ++k)
        out.p[k] = p[k];
    out.chi2 = chi2;
    out.iterations = it;
    out.converged = converged;
    return out;
}

} // namespace gpuphot::psffit
