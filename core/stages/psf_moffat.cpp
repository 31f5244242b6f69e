#include "core/stages/psf_moffat.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numbers>

namespace gpuphot {

namespace {

constexpr int kNumParams = 8; // x0, y0, amplitude, background, c11, c12, c22, beta
enum ParamIndex { PX0, PY0, PAMP, PBKG, PC11, PC12, PC22, PBETA };

struct Quadrature {
    int n = 1;
    std::array<double, 5> node{};
    std::array<double, 5> weight{};
};

// Gauss–Legendre nodes and weights on [-0.5, 0.5] (weights sum to 1).
Quadrature quadrature(int n) {
    Quadrature q;
    q.n = std::clamp(n, 1, 5);
    switch (q.n) {
    case 1:
        q.node = {0.0};
        q.weight = {1.0};
        break;
    case 2:
        q.node = {-0.28867513459481287, 0.28867513459481287};
        q.weight = {0.5, 0.5};
        break;
    case 3:
        q.node = {-0.3872983346207417, 0.0, 0.3872983346207417};
        q.weight = {5.0 / 18.0, 8.0 / 18.0, 5.0 / 18.0};
        break;
    case 4:
        q.node = {-0.4305681557970263, -0.16999052179242815, 0.16999052179242815, 0.4305681557970263};
        q.weight = {0.17392742256872692, 0.32607257743127307, 0.32607257743127307, 0.17392742256872692};
        break;
    default:
        q.node = {-0.453089922969332, -0.26923465505284155, 0.0, 0.26923465505284155, 0.453089922969332};
        q.weight = {0.11846344252809454, 0.23931433524968324, 0.28444444444444444, 0.23931433524968324,
                    0.11846344252809454};
        break;
    }
    return q;
}

// Model value at (x, y) integrated over the pixel; when d != nullptr also the 8 partial derivatives.
double evaluate(const double* p, PsfModelKind kind, double x, double y, const Quadrature& q, double* d) {
    double value = 0.0;
    double g0 = 0.0, gx0 = 0.0, gy0 = 0.0, g11 = 0.0, g12 = 0.0, g22 = 0.0, gbeta = 0.0;
    const double amp = p[PAMP], beta = p[PBETA];
    for (int j = 0; j < q.n; ++j) {
        const double dy = y + q.node[j] - p[PY0];
        for (int i = 0; i < q.n; ++i) {
            const double dx = x + q.node[i] - p[PX0];
            const double w = q.weight[i] * q.weight[j];
            const double quad = p[PC11] * dx * dx + 2.0 * p[PC12] * dx * dy + p[PC22] * dy * dy;
            double g, dgdq, dgdbeta = 0.0;
            if (kind == PsfModelKind::Moffat) {
                const double base = 1.0 + quad;
                const double lb = std::log(base);
                g = std::exp(-beta * lb);
                dgdq = -beta * g / base;
                dgdbeta = -g * lb;
            } else {
                g = std::exp(-0.5 * quad);
                dgdq = -0.5 * g;
            }
            value += w * g;
            if (d) {
                const double wq = w * dgdq;
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
        d[PBKG] = 1.0;
        d[PC11] = amp * g11;
        d[PC12] = amp * g12;
        d[PC22] = amp * g22;
        d[PBETA] = amp * gbeta;
    }
    return amp * value + p[PBKG];
}

std::array<double, kNumParams> toArray(const ProfileParams& s) {
    return {s.x0, s.y0, s.amplitude, s.background, s.c11, s.c12, s.c22, s.beta};
}

ProfileParams fromArray(const std::array<double, kNumParams>& a) {
    ProfileParams s;
    s.x0 = a[PX0];
    s.y0 = a[PY0];
    s.amplitude = a[PAMP];
    s.background = a[PBKG];
    s.c11 = a[PC11];
    s.c12 = a[PC12];
    s.c22 = a[PC22];
    s.beta = a[PBETA];
    return s;
}

double halfMaxFactor(PsfModelKind kind, double beta) {
    // Q at half maximum: (1 + Q)^-beta = 1/2 (Moffat), exp(-Q/2) = 1/2 (Gaussian).
    return kind == PsfModelKind::Moffat ? std::pow(2.0, 1.0 / beta) - 1.0 : 2.0 * std::numbers::ln2;
}

} // namespace

ProfileShape profileShape(const ProfileParams& p, PsfModelKind kind) {
    ProfileShape s;
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const double det = p.c11 * p.c22 - p.c12 * p.c12;
    if (!(p.c11 > 0.0) || !(det > 0.0) || (kind == PsfModelKind::Moffat && !(p.beta > 0.0))) {
        s.fwhmA = s.fwhmB = s.fwhm = s.ellipticity = s.theta = s.e1 = s.e2 = nan;
        return s;
    }
    const double mean = 0.5 * (p.c11 + p.c22);
    const double half = std::hypot(0.5 * (p.c11 - p.c22), p.c12);
    const double lmin = mean - half, lmax = mean + half; // lmin: major axis
    const double h = halfMaxFactor(kind, p.beta);
    s.fwhmA = 2.0 * std::sqrt(h / lmin);
    s.fwhmB = 2.0 * std::sqrt(h / lmax);
    s.fwhm = std::sqrt(s.fwhmA * s.fwhmB);
    s.ellipticity = 1.0 - std::sqrt(lmin / lmax);
    // Direction of the larger eigenvalue (minor axis); the major axis is perpendicular.
    double phi = 0.5 * std::atan2(2.0 * p.c12, p.c11 - p.c22) + 0.5 * std::numbers::pi;
    if (phi > 0.5 * std::numbers::pi) phi -= std::numbers::pi;
    s.theta = phi * 180.0 / std::numbers::pi;
    s.e1 = s.ellipticity * std::cos(2.0 * phi);
    s.e2 = s.ellipticity * std::sin(2.0 * phi);
    return s;
}

void setProfileShape(ProfileParams& p, PsfModelKind kind, double fwhm, double ellipticity, double thetaDeg) {
    const double e = std::clamp(ellipticity, 0.0, 0.95);
    const double fa = fwhm / std::sqrt(1.0 - e), fb = fwhm * std::sqrt(1.0 - e);
    const double h = halfMaxFactor(kind, p.beta);
    const double la = 4.0 * h / (fa * fa), lb = 4.0 * h / (fb * fb);
    const double t = thetaDeg * std::numbers::pi / 180.0;
    const double c = std::cos(t), s = std::sin(t);
    p.c11 = la * c * c + lb * s * s;
    p.c22 = la * s * s + lb * c * c;
    p.c12 = (la - lb) * s * c;
}

double profileFlux(const ProfileParams& p, PsfModelKind kind) {
    const double det = p.c11 * p.c22 - p.c12 * p.c12;
    if (!(det > 0.0)) return std::numeric_limits<double>::quiet_NaN();
    if (kind == PsfModelKind::Moffat) {
        if (!(p.beta > 1.0)) return std::numeric_limits<double>::infinity();
        return p.amplitude * std::numbers::pi / ((p.beta - 1.0) * std::sqrt(det));
    }
    return p.amplitude * 2.0 * std::numbers::pi / std::sqrt(det);
}

double profileValue(const ProfileParams& p, PsfModelKind kind, double x, double y, int nQuad) {
    const auto a = toArray(p);
    return evaluate(a.data(), kind, x, y, quadrature(nQuad), nullptr);
}

ProfileFitResult fitProfile(const std::vector<FitSample>& samples, PsfModelKind kind,
                            const ProfileParams& start, const LmOptions& opt) {
    ProfileFitResult res;
    res.params = start;
    const Quadrature q = quadrature(opt.nQuad);

    // Active parameters, in a fixed order.
    std::array<int, kNumParams> active{};
    int nAct = 0;
    for (int k = 0; k < kNumParams; ++k) {
        if (k == PBKG && !opt.fitBackground) continue;
        if (k == PBETA && (kind != PsfModelKind::Moffat || !opt.fitBeta)) continue;
        active[nAct++] = k;
    }
    const int nSamples = static_cast<int>(samples.size());
    if (nSamples <= nAct) return res;

    using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic>;
    using Vec = Eigen::Matrix<double, Eigen::Dynamic, 1>;
    Mat h(nAct, nAct);
    Vec g(nAct);

    // One pass over the samples at p: chi2, and the residuals and active partial derivatives cached for
    // the normal equations (so an accepted trial is not evaluated twice). The sum of non-negative terms
    // only grows, so a trial stops (+inf) as soon as it exceeds `limit`: it would be rejected anyway.
    std::vector<double> resid(static_cast<std::size_t>(nSamples));
    std::vector<double> deriv(static_cast<std::size_t>(nSamples) * nAct);
    auto evaluateAll = [&](const std::array<double, kNumParams>& p, double limit) {
        double c = 0.0;
        std::array<double, kNumParams> d{};
        for (int k = 0; k < nSamples; ++k) {
            const FitSample& s = samples[k];
            const double r = s.value - evaluate(p.data(), kind, s.x, s.y, q, d.data());
            c += s.weight * r * r;
            if (c > limit) return std::numeric_limits<double>::infinity();
            resid[k] = r;
            double* dk = deriv.data() + static_cast<std::size_t>(k) * nAct;
            for (int a = 0; a < nAct; ++a)
                dk[a] = d[active[a]];
        }
        return c;
    };
    // Normal equations from the cached residuals and derivatives (sample order, as one fused pass).
    auto accumulate = [&]() {
        h.setZero();
        g.setZero();
        for (int k = 0; k < nSamples; ++k) {
            const double w = samples[k].weight, r = resid[k];
            const double* dk = deriv.data() + static_cast<std::size_t>(k) * nAct;
            for (int a = 0; a < nAct; ++a) {
                const double wa = w * dk[a];
                g(a) += wa * r;
                for (int b = 0; b <= a; ++b)
                    h(a, b) += wa * dk[b];
            }
        }
        for (int a = 0; a < nAct; ++a)
            for (int b = 0; b < a; ++b)
                h(b, a) = h(a, b);
    };
    auto valid = [&](const std::array<double, kNumParams>& p) {
        const double det = p[PC11] * p[PC22] - p[PC12] * p[PC12];
        return std::isfinite(det) && p[PC11] > 0.0 && det > 0.0 && p[PAMP] > 0.0 &&
               std::abs(p[PX0] - start.x0) <= opt.maxShift && std::abs(p[PY0] - start.y0) <= opt.maxShift;
    };

    std::array<double, kNumParams> p = toArray(start);
    if (kind == PsfModelKind::Moffat) p[PBETA] = std::clamp(p[PBETA], opt.betaMin, opt.betaMax);
    if (!opt.fitBackground) p[PBKG] = start.background;
    if (!valid(p)) return res;

    double chi2 = evaluateAll(p, std::numeric_limits<double>::infinity());
    accumulate();
    double lambda = 1e-3;
    int it = 0;
    bool converged = false;
    while (it < opt.maxIterations && !converged) {
        ++it;
        Mat a = h;
        for (int k = 0; k < nAct; ++k)
            a(k, k) = h(k, k) * (1.0 + lambda) + 1e-300;
        const Vec delta = a.ldlt().solve(g);
        std::array<double, kNumParams> trial = p;
        for (int k = 0; k < nAct; ++k)
            trial[active[k]] += delta(k);
        if (kind == PsfModelKind::Moffat) trial[PBETA] = std::clamp(trial[PBETA], opt.betaMin, opt.betaMax);
        const bool finite = delta.allFinite();
        const double chi2Trial =
            finite && valid(trial) ? evaluateAll(trial, chi2) : std::numeric_limits<double>::infinity();
        if (chi2Trial <= chi2) {
            const double decrease = (chi2 - chi2Trial) / std::max(chi2, 1e-300);
            const double shift = std::max(std::abs(trial[PX0] - p[PX0]), std::abs(trial[PY0] - p[PY0]));
            p = trial;
            chi2 = chi2Trial;
            accumulate();
            lambda = std::max(lambda * 0.1, 1e-12);
            if (decrease < opt.relTolerance && shift < opt.posTolerance) converged = true;
        } else {
            lambda *= 10.0;
            // No step along the gradient lowers chi2 any more: at the minimum (to rounding).
            if (lambda > 1e12) converged = true;
        }
    }
    res.params = fromArray(p);
    res.iterations = it;
    res.converged = converged;
    res.chi2 = chi2 / static_cast<double>(nSamples - nAct);
    return res;
}

} // namespace gpuphot
