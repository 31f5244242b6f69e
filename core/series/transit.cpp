// The blind transit fitter of light curves (variability.hpp): a symmetric trapezoid dip whose baseline
// and depth are linear, searched on a grid of mid-time x duration x ingress and refined by Nelder-Mead.
// Each trial costs O(log n): the shape is 0, 1 or linear in time, so its sums come from prefix sums of
// w, w t, w t^2, w v and w t v over the points of the ingress, the flat bottom and the egress.
#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "core/series/variability.hpp"
#include "core/util/errors.hpp"

namespace gpuphot {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kMinIngress = 0.02, kMaxIngress = 0.5; // of the duration
constexpr std::array<double, 4> kGridIngress = {0.05, 0.15, 0.3, 0.45};
constexpr double kDurationRatio = 1.08; // the coarse grid's geometric step in duration
constexpr double kMaxTrials = 3.0e6;    // beyond this the mid-time step grows (never beyond duration / 20)
constexpr long kMinWindow = 3;          // points a trial needs inside its dip
constexpr int kMinFound = 5;            // points in transit for a detection
constexpr int kMinCovered = 2;          // points in or before the ingress, and in or after the egress
constexpr int kMinPoints = 10;          // fewer usable points: no fit

// The usable points in time order: times from the series' mean time, values less their weighted mean,
// weights 1/err^2, and prefix sums (long double: sums of t^2 over a long series lose no ramp).
struct Points {
    double t0 = 0.0, mean = 0.0;
    std::vector<double> t, u, w;
    std::vector<long double> pw, pwt, pwtt, pwu, pwtu;
    double sw = 0.0, su = 0.0, suu = 0.0; // totals (su ~ 0)
    double cadence = 0.0;                 // median spacing of the points (d)

    std::size_t index(double x) const { // first point at or after x
        return static_cast<std::size_t>(std::lower_bound(t.begin(), t.end(), x) - t.begin());
    }
};

void prefixSums(Points& p) {
    const std::size_t n = p.t.size();
    for (auto* v : {&p.pw, &p.pwt, &p.pwtt, &p.pwu, &p.pwtu})
        v->assign(n + 1, 0.0L);
    std::vector<double> gaps;
    for (std::size_t i = 0; i < n; ++i) {
        const long double w = p.w[i], t = p.t[i], u = p.u[i];
        p.pw[i + 1] = p.pw[i] + w;
        p.pwt[i + 1] = p.pwt[i] + w * t;
        p.pwtt[i + 1] = p.pwtt[i] + w * t * t;
        p.pwu[i + 1] = p.pwu[i] + w * u;
        p.pwtu[i + 1] = p.pwtu[i] + w * t * u;
        p.su += p.w[i] * p.u[i];
        p.suu += p.w[i] * p.u[i] * p.u[i];
        if (i > 0 && p.t[i] > p.t[i - 1]) gaps.push_back(p.t[i] - p.t[i - 1]);
    }
    p.sw = static_cast<double>(p.pw[n]);
    if (!gaps.empty()) {
        std::nth_element(gaps.begin(), gaps.begin() + gaps.size() / 2, gaps.end());
        p.cadence = gaps[gaps.size() / 2];
    }
}

Points usablePoints(const std::vector<double>& time, const std::vector<double>& value,
                    const std::vector<double>& err) {
    const std::size_t n = std::min({time.size(), value.size(), err.size()});
    std::vector<std::size_t> order;
    for (std::size_t i = 0; i < n; ++i)
        if (std::isfinite(time[i]) && std::isfinite(value[i]) && std::isfinite(err[i]) && err[i] > 0.0)
            order.push_back(i);
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return time[a] < time[b]; });
    Points p;
    if (order.empty()) return p;
    double sw = 0.0, swt = 0.0, swv = 0.0;
    for (std::size_t i : order) {
        const double w = 1.0 / (err[i] * err[i]);
        sw += w;
        swt += w * (time[i] - time[order[0]]);
        swv += w * value[i];
    }
    p.t0 = time[order[0]] + swt / sw;
    p.mean = swv / sw;
    for (std::size_t i : order) {
        p.t.push_back(time[i] - p.t0);
        p.u.push_back(value[i] - p.mean);
        p.w.push_back(1.0 / (err[i] * err[i]));
    }
    prefixSums(p);
    return p;
}

// One trial shape's linear fit u = b + c s: chi^2, coefficients and their covariance.
struct Linear {
    bool ok = false;
    double chi2 = kInf, b = kNaN, c = kNaN, vbb = kNaN, vcc = kNaN, vbc = kNaN;
    double rampWeight = 0.0; // sum of w over the ingress and egress points
    long inside = 0;         // points inside the dip (first to last contact)
};

// The sums of w s, w s^2 and w s u over points [i, j) on a ramp s = sign (t - edge) / r (sign +1: the
// ingress from `edge`, -1: the egress to `edge`).
void addRamp(const Points& p, std::size_t i, std::size_t j, double edge, double r, double sign, double& ss,
             double& sss, double& ssu, double& rampWeight) {
    if (j <= i) return;
    const long double w = p.pw[j] - p.pw[i], wt = p.pwt[j] - p.pwt[i], wtt = p.pwtt[j] - p.pwtt[i];
    const long double wu = p.pwu[j] - p.pwu[i], wtu = p.pwtu[j] - p.pwtu[i], e = edge;
    ss += static_cast<double>(sign * (wt - e * w) / r);
    sss += static_cast<double>((wtt - 2.0L * e * wt + e * e * w) / (static_cast<long double>(r) * r));
    ssu += static_cast<double>(sign * (wtu - e * wu) / r);
    rampWeight += static_cast<double>(w);
}

Linear fitShape(const Points& p, double mid, double duration, double ingress) {
    Linear f;
    const double r = ingress * duration, first = mid - 0.5 * duration, last = mid + 0.5 * duration;
    const std::size_t ia = p.index(first), ib = p.index(first + r), ic = p.index(last - r),
                      id = p.index(last);
    f.inside = static_cast<long>(id) - static_cast<long>(ia);
    if (f.inside < kMinWindow) return f;
    double ss = 0.0, sss = 0.0, ssu = 0.0;
    addRamp(p, ia, ib, first, r, 1.0, ss, sss, ssu, f.rampWeight);
    addRamp(p, ic, id, last, r, -1.0, ss, sss, ssu, f.rampWeight);
    if (ic > ib) {
        ss += static_cast<double>(p.pw[ic] - p.pw[ib]);
        sss += static_cast<double>(p.pw[ic] - p.pw[ib]);
        ssu += static_cast<double>(p.pwu[ic] - p.pwu[ib]);
    }
    const double det = p.sw * sss - ss * ss;
    if (!(det > 1e-12 * p.sw * sss)) return f;
    f.b = (sss * p.su - ss * ssu) / det;
    f.c = (p.sw * ssu - ss * p.su) / det;
    f.chi2 = p.suu - f.b * p.su - f.c * ssu;
    f.vbb = sss / det;
    f.vcc = p.sw / det;
    f.vbc = -ss / det;
    f.ok = true;
    return f;
}

struct Shape {
    double mid = kNaN, duration = kNaN, ingress = kNaN;
};

// The grid's mid-time step per duration: <= duration / 20 and <= the cadence, coarser (never beyond
// duration / 20) where the whole grid would pass kMaxTrials.
std::vector<double> midSteps(const Points& p, const std::vector<double>& durations) {
    const double span = p.t.back() - p.t.front();
    std::vector<double> step;
    double trials = 0.0;
    for (double d : durations) {
        step.push_back(p.cadence > 0.0 ? std::min(d / 20.0, p.cadence) : d / 20.0);
        trials += (span + d) / step.back() * static_cast<double>(kGridIngress.size());
    }
    if (trials > kMaxTrials)
        for (std::size_t k = 0; k < durations.size(); ++k)
            step[k] = std::min(durations[k] / 20.0, step[k] * trials / kMaxTrials);
    return step;
}

// The coarse grid: the trial dip of least chi^2 (mid-times from the first point less half the duration to
// the last point plus half; stretches with fewer than kMinWindow points in the dip skipped).
Shape coarseSearch(const Points& p, const std::vector<double>& durations) {
    const std::vector<double> steps = midSteps(p, durations);
    Shape best;
    double bestChi2 = kInf;
    for (std::size_t k = 0; k < durations.size(); ++k) {
        const double d = durations[k], step = steps[k], start = p.t.front() - 0.5 * d;
        const double end = p.t.back() + 0.5 * d;
        for (double ing : kGridIngress) {
            for (double m = start; m <= end; m += step) {
                const Linear f = fitShape(p, m, d, ing);
                if (f.ok && f.c < 0.0 && f.chi2 < bestChi2) {
                    bestChi2 = f.chi2;
                    best = {m, d, ing};
                }
                if (f.inside >= kMinWindow) continue;
                // Too few points in the dip: on to where the next point enters it.
                const std::size_t next = p.index(m + 0.5 * d + 1e-12);
                if (next >= p.t.size()) break;
                const double jump = std::floor((p.t[next] - 0.5 * d - m) / step) * step;
                if (jump > step) m += jump - step;
            }
        }
    }
    return best;
}

using Vec3 = std::array<double, 3>;

// Nelder-Mead minimisation of f in N dimensions from x0 with initial steps `step`, at most maxEval
// evaluations; the best vertex, its value in `best`.
template <std::size_t N>
std::array<double, N> nelderMead(const std::function<double(const std::array<double, N>&)>& f,
                                 const std::array<double, N>& x0, const std::array<double, N>& step,
                                 int maxEval, double& best) {
    using V = std::array<double, N>;
    std::array<V, N + 1> x;
    std::array<double, N + 1> fx;
    for (std::size_t i = 0; i <= N; ++i) {
        x[i] = x0;
        if (i > 0) x[i][i - 1] += step[i - 1];
        fx[i] = f(x[i]);
    }
    auto along = [](const V& centre, const V& from, double t) {
        V y;
        for (std::size_t k = 0; k < N; ++k)
            y[k] = centre[k] + t * (from[k] - centre[k]);
        return y;
    };
    std::array<std::size_t, N + 1> o;
    for (int eval = static_cast<int>(N) + 1; eval < maxEval;) {
        std::iota(o.begin(), o.end(), std::size_t(0));
        std::sort(o.begin(), o.end(), [&](std::size_t a, std::size_t b) { return fx[a] < fx[b]; });
        const std::size_t w = o[N];
        if (std::fabs(fx[w] - fx[o[0]]) <= 1e-9 * (1.0 + std::fabs(fx[o[0]]))) break;
        V centre{};
        for (std::size_t i = 0; i < N; ++i)
            for (std::size_t k = 0; k < N; ++k)
                centre[k] += x[o[i]][k] / static_cast<double>(N);
        const V xr = along(centre, x[w], -1.0);
        const double fr = f(xr);
        ++eval;
        V next = xr;
        double fn = fr;
        if (fr < fx[o[0]]) { // expand
            const V xe = along(centre, x[w], -2.0);
            const double fe = f(xe);
            ++eval;
            if (fe < fr) next = xe, fn = fe;
        } else if (!(fr < fx[o[N - 1]])) { // contract, outside or inside
            next = along(centre, x[w], fr < fx[w] ? -0.5 : 0.5);
            fn = f(next);
            ++eval;
            if (!(fn < std::min(fr, fx[w]))) { // shrink towards the best
                for (std::size_t i = 1; i <= N; ++i)
                    x[o[i]] = along(x[o[0]], x[o[i]], 0.5), fx[o[i]] = f(x[o[i]]);
                eval += static_cast<int>(N);
                continue;
            }
        }
        x[w] = next;
        fx[w] = fn;
    }
    const std::size_t i = static_cast<std::size_t>(std::min_element(fx.begin(), fx.end()) - fx.begin());
    best = fx[i];
    return x[i];
}

// chi^2 of a dip at (mid, log duration, ingress); out of bounds, or no dip: worse than no dip at all.
struct Objective {
    const Points& p;
    double lo, hi, minDuration, maxDuration;
    double operator()(double mid, double logDuration, double ingress) const {
        const double d = std::exp(logDuration), worst = p.suu + 1.0;
        if (mid < lo || mid > hi || d < minDuration * (1 - 1e-12) || d > maxDuration * (1 + 1e-12) ||
            ingress < kMinIngress || ingress > kMaxIngress)
            return worst + 1.0;
        const Linear f = fitShape(p, mid, d, ingress);
        return f.ok && f.c < 0.0 ? f.chi2 : worst;
    }
};

// The coarse shape refined: mid-time, log duration and ingress free within their bounds (two Nelder-Mead
// runs, the second restarted from the first's best).
Shape refine(const Objective& chi2, const Shape& s, double midStep) {
    const std::function<double(const Vec3&)> f = [&](const Vec3& x) { return chi2(x[0], x[1], x[2]); };
    Vec3 x = {s.mid, std::log(s.duration), s.ingress};
    double best = kInf;
    for (int run = 0; run < 2; ++run)
        x = nelderMead<3>(f, x, {midStep, std::log(kDurationRatio), 0.05}, 400, best);
    return {x[0], std::exp(x[1]), x[2]};
}

// chi^2 at mid-time `mid`, minimised over duration and ingress from those of `s`.
double profileChi2(const Objective& chi2, double mid, const Shape& s) {
    using V2 = std::array<double, 2>;
    const std::function<double(const V2&)> f = [&](const V2& x) { return chi2(mid, x[0], x[1]); };
    double best = kInf;
    nelderMead<2>(f, {std::log(s.duration), s.ingress}, {0.02, 0.02}, 200, best);
    return best;
}

// The mid-time's 1-sigma error: where chi^2, minimised over duration and ingress, has risen by `rise` (1,
// or the reduced chi^2 when above 1) on either side of the best mid-time (the half-width of that interval;
// bisection from the Gauss-Newton estimate `guess`). NaN where chi^2 does not rise enough within 100 times
// the guess.
double midError(const Objective& chi2, const Shape& s, double rise, double guess) {
    const double floor = chi2(s.mid, std::log(s.duration), s.ingress);
    double width = 0.0;
    for (double side : {-1.0, 1.0}) {
        double in = 0.0, out = guess;
        while (profileChi2(chi2, s.mid + side * out, s) - floor < rise) {
            in = out;
            out *= 2.0;
            if (out > 100.0 * guess) return kNaN;
        }
        for (int k = 0; k < 12; ++k) {
            const double h = 0.5 * (in + out);
            (profileChi2(chi2, s.mid + side * h, s) - floor < rise ? in : out) = h;
        }
        width += 0.25 * (in + out);
    }
    return width;
}

// Throws InvalidInput for an empty duration range.
void checkRange(const TransitSearch& s) {
    if (!(std::isfinite(s.minDuration) && s.minDuration > 0.0) ||
        !(std::isfinite(s.maxDuration) && s.maxDuration >= 0.0) ||
        (s.maxDuration > 0.0 && s.maxDuration < s.minDuration))
        throw InvalidInput("transit search: the duration range must have 0 < minDuration <= maxDuration (or "
                           "maxDuration 0: half the series' span)");
    if (!std::isfinite(s.minSnr)) throw InvalidInput("transit search: minSnr must be finite");
}

// The durations of the coarse grid, geometric from the shortest to the longest searched (maxDuration, at
// most the series' span; 0: half the span). Throws InvalidInput when the series is shorter than that.
std::vector<double> durationGrid(const Points& p, const TransitSearch& s) {
    const double span = p.t.back() - p.t.front();
    const double maxDuration = s.maxDuration > 0.0 ? std::min(s.maxDuration, span) : 0.5 * span;
    if (maxDuration < s.minDuration)
        throw InvalidInput("transit search: the series spans " + std::to_string(span * 24.0) +
                           " h, too short for transits of at least " + std::to_string(s.minDuration * 24.0) +
                           " h");
    std::vector<double> d = {s.minDuration};
    while (d.back() * kDurationRatio < maxDuration)
        d.push_back(d.back() * kDurationRatio);
    if (d.back() < maxDuration) d.push_back(maxDuration);
    return d;
}

// The fit's figures from the refined shape: depth, baseline and their errors (scaled by the square root
// of the reduced chi^2 when above 1), the mid-time's error (midError), the coverage.
TransitFit describe(const Objective& chi2, const Shape& s, const TransitSearch& search) {
    const Points& p = chi2.p;
    TransitFit fit;
    fit.points = static_cast<int>(p.t.size());
    const Linear f = fitShape(p, s.mid, s.duration, s.ingress);
    if (!f.ok || !(f.c < 0.0)) return fit;
    const double baseline = p.mean + f.b, depth = -f.c / baseline;
    const double dof = std::max(1.0, static_cast<double>(p.t.size()) - 5.0);
    fit.chi2 = std::max(0.0, f.chi2) / dof;
    const double scale = std::max(1.0, fit.chi2);
    // depth = -c / b: its variance from the covariance of (b, c), propagated linearly.
    const double gc = -1.0 / baseline, gb = f.c / (baseline * baseline);
    const double var = gc * gc * f.vcc + gb * gb * f.vbb + 2.0 * gc * gb * f.vbc;
    const double r = s.ingress * s.duration;
    fit.depth = depth;
    fit.depthErr = std::sqrt(std::max(0.0, var) * scale);
    fit.baseline = baseline;
    fit.mid = s.mid + p.t0;
    // Gauss-Newton: 1 / sum of w (dmodel/dmid)^2 over the ramps, where |dmodel/dmid| = |c| / r.
    const double guess = f.rampWeight > 0.0 ? r / std::fabs(f.c) / std::sqrt(f.rampWeight) : 0.25 * r;
    fit.midErr = midError(chi2, s, scale, std::max(guess, 1e-7));
    fit.duration = s.duration;
    fit.ingress = s.ingress;
    fit.snr = depth / fit.depthErr;
    fit.inTransit = static_cast<int>(f.inside);
    const std::size_t before = p.index(s.mid - 0.5 * s.duration + r);
    const std::size_t after = p.t.size() - p.index(s.mid + 0.5 * s.duration - r);
    const bool covered = static_cast<int>(before) >= kMinCovered && static_cast<int>(after) >= kMinCovered;
    fit.covered = covered && s.mid >= p.t.front() && s.mid <= p.t.back();
    fit.found = fit.covered && fit.snr >= search.minSnr && fit.inTransit >= kMinFound;
    return fit;
}

} // namespace

TransitFit fitTransit(const std::vector<double>& time, const std::vector<double>& value,
                      const std::vector<double>& err, const TransitSearch& search) {
    checkRange(search);
    const Points p = usablePoints(time, value, err);
    TransitFit none;
    none.points = static_cast<int>(p.t.size());
    none.baseline = p.t.empty() ? kNaN : p.mean;
    if (p.t.size() < static_cast<std::size_t>(kMinPoints)) return none;
    const std::vector<double> durations = durationGrid(p, search);
    const Shape coarse = coarseSearch(p, durations);
    if (!std::isfinite(coarse.mid)) return none;
    const double midStep = std::max(midSteps(p, {coarse.duration})[0], 1e-6);
    const double lo = p.t.front() - 0.5 * durations.back(), hi = p.t.back() + 0.5 * durations.back();
    const Objective chi2{p, lo, hi, durations.front(), durations.back()};
    const TransitFit fit = describe(chi2, refine(chi2, coarse, midStep), search);
    return std::isfinite(fit.depth) ? fit : none;
}

double transitModel(const TransitFit& fit, double t) {
    if (!std::isfinite(fit.depth) || !std::isfinite(fit.mid)) return fit.baseline;
    const double half = 0.5 * fit.duration, ramp = fit.ingress * fit.duration;
    const double a = std::fabs(t - fit.mid);
    const double shape = a >= half ? 0.0 : std::min(1.0, (half - a) / ramp);
    return fit.baseline * (1.0 - fit.depth * shape);
}

} // namespace gpuphot
