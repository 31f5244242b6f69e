// Variability indices, the generalised Lomb-Scargle periodogram and the linear detrending of a light
// curve (variability.hpp).
#include "core/series/variability.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <Eigen/Dense>

#include "core/series/series.hpp"
#include "core/util/errors.hpp"
#include "core/util/robust_stats.hpp"

namespace gpuphot {
namespace {

constexpr double kTwoPi = 6.283185307179586476925;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr std::size_t kMaxFrequencies = 20'000'000; // beyond this a periodogram is a mistake, not a search

bool usable(double v, double e) {
    return std::isfinite(v) && std::isfinite(e) && e > 0.0;
}

// The points with a finite value and a positive finite error, and their error-weighted mean.
struct Weighted {
    std::vector<double> v, e;
    double mean = kNaN;
};

Weighted weighted(const std::vector<double>& value, const std::vector<double>& err) {
    Weighted w;
    double sw = 0.0, swv = 0.0;
    for (std::size_t i = 0; i < std::min(value.size(), err.size()); ++i) {
        if (!usable(value[i], err[i])) continue;
        w.v.push_back(value[i]);
        w.e.push_back(err[i]);
        sw += 1.0 / (err[i] * err[i]);
        swv += value[i] / (err[i] * err[i]);
    }
    if (sw > 0.0) w.mean = swv / sw;
    return w;
}

} // namespace

double stetsonJ(const std::vector<double>& value, const std::vector<double>& err) {
    const Weighted w = weighted(value, err);
    const std::size_t n = w.v.size();
    if (n < 3) return kNaN;
    // Stetson (1996) eq. 1-2 with each point its own pair (P = delta^2 - 1) and equal weights.
    const double scale = std::sqrt(double(n) / double(n - 1));
    double sum = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
        const double delta = scale * (w.v[i] - w.mean) / w.e[i];
        const double p = delta * delta - 1.0;
        sum += (p > 0.0 ? 1.0 : p < 0.0 ? -1.0 : 0.0) * std::sqrt(std::fabs(p));
    }
    return sum / double(n);
}

double chi2Constant(const std::vector<double>& value, const std::vector<double>& err) {
    const Weighted w = weighted(value, err);
    const std::size_t n = w.v.size();
    if (n < 2) return kNaN;
    double chi = 0.0;
    for (std::size_t i = 0; i < n; ++i)
        chi += (w.v[i] - w.mean) * (w.v[i] - w.mean) / (w.e[i] * w.e[i]);
    return chi / double(n - 1);
}

bool isVariable(double j, double chi2, const VariabilityParams& p) {
    return (std::isfinite(j) && j > p.stetsonJ) || (std::isfinite(chi2) && chi2 > p.chi2);
}

namespace {

// The usable points of a periodogram: times relative to the first, values, weights normalised to 1.
struct Series {
    std::vector<double> t, y, w;
    double span = 0.0;
};

Series periodogramPoints(const std::vector<double>& time, const std::vector<double>& value,
                         const std::vector<double>& err) {
    Series s;
    const std::size_t n = std::min({time.size(), value.size(), err.size()});
    double t0 = INFINITY, t1 = -INFINITY, sw = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
        if (!std::isfinite(time[i]) || !usable(value[i], err[i])) continue;
        s.t.push_back(time[i]);
        s.y.push_back(value[i]);
        s.w.push_back(1.0 / (err[i] * err[i]));
        sw += s.w.back();
        t0 = std::min(t0, time[i]);
        t1 = std::max(t1, time[i]);
    }
    for (std::size_t i = 0; i < s.t.size(); ++i) {
        s.t[i] -= t0;
        s.w[i] /= sw;
    }
    s.span = s.t.empty() ? 0.0 : t1 - t0;
    return s;
}

// Baluev (2008) eq. 6 (alias-free approximation) for the standard-normalised GLS power z of the peak,
// with `fmax` the grid's highest frequency: as astropy's LombScargle.false_alarm_probability(method=
// "baluev") with a floating mean (dH = 1, dK = 3).
double falseAlarmOf(double z, double fmax, const Series& s) {
    const double n = double(s.t.size()), nh = n - 1.0, nk = n - 3.0;
    if (!(nk > 1.0) || !(z >= 0.0) || z >= 1.0) return z >= 1.0 ? 0.0 : kNaN;
    double mt = 0.0, mt2 = 0.0;
    for (std::size_t i = 0; i < s.t.size(); ++i) {
        mt += s.w[i] * s.t[i];
        mt2 += s.w[i] * s.t[i] * s.t[i];
    }
    const double teff = std::sqrt(4.0 * M_PI * std::max(0.0, mt2 - mt * mt)), width = fmax * teff;
    const double gamma =
        std::sqrt(2.0 / nh) * std::exp(std::lgamma(nh / 2.0) - std::lgamma((nh - 1.0) / 2.0));
    const double single = std::pow(1.0 - z, 0.5 * nk);
    const double tau = gamma * width * std::pow(1.0 - z, 0.5 * (nk - 1.0)) * std::sqrt(0.5 * nh * z);
    return std::clamp(-std::expm1(-tau) + single * std::exp(-tau), 0.0, 1.0);
}

// The GLS power at every frequency f0 + k df: each point's cos and sin rotated from one frequency to
// the next (exact every 128 steps, so that rounding does not build up).
void glsPowers(const Series& s, double f0, double df, std::vector<double>& power) {
    const std::size_t n = s.t.size(), nf = power.size();
    std::vector<double> c(n), sn(n), dc(n), ds(n), wy(n);
    double yMean = 0.0, yy = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
        yMean += s.w[i] * s.y[i];
        dc[i] = std::cos(kTwoPi * df * s.t[i]);
        ds[i] = std::sin(kTwoPi * df * s.t[i]);
    }
    for (std::size_t i = 0; i < n; ++i) {
        wy[i] = s.w[i] * (s.y[i] - yMean); // centred: Y = 0 below
        yy += wy[i] * (s.y[i] - yMean);
    }
    for (std::size_t k = 0; k < nf; ++k) {
        if (k % 128 == 0)
            for (std::size_t i = 0; i < n; ++i) {
                const double a = kTwoPi * (f0 + double(k) * df) * s.t[i];
                c[i] = std::cos(a);
                sn[i] = std::sin(a);
            }
        double sc = 0.0, ss = 0.0, syc = 0.0, sys = 0.0, scc = 0.0, scs = 0.0;
        for (std::size_t i = 0; i < n; ++i) {
            const double ci = c[i], si = sn[i], w = s.w[i];
            sc += w * ci;
            ss += w * si;
            syc += wy[i] * ci;
            sys += wy[i] * si;
            scc += w * ci * ci;
            scs += w * ci * si;
            c[i] = ci * dc[i] - si * ds[i];
            sn[i] = si * dc[i] + ci * ds[i];
        }
        // Zechmeister & Kuerster (2009) eq. 4-13 with sum w = 1 and the values centred (Y = 0).
        const double cc = scc - sc * sc, sss = (1.0 - scc) - ss * ss, cs = scs - sc * ss;
        const double d = cc * sss - cs * cs;
        power[k] =
            d > 0.0 && yy > 0.0 ? (sss * syc * syc + cc * sys * sys - 2.0 * cs * syc * sys) / (yy * d) : 0.0;
    }
}

} // namespace

Periodogram lombScargle(const std::vector<double>& time, const std::vector<double>& value,
                        const std::vector<double>& err, const VariabilityParams& p) {
    if (!(p.minPeriod > 0.0) || !(p.maxPeriod >= 0.0) || p.oversample < 1)
        throw InvalidInput("periodogram: minPeriod must be > 0 d, maxPeriod >= 0 d and oversample >= 1");
    Periodogram out;
    const Series s = periodogramPoints(time, value, err);
    if (s.t.size() < 4 || !(s.span > 0.0)) return out;
    const double maxPeriod = p.maxPeriod > 0.0 ? p.maxPeriod : 0.5 * s.span;
    if (!(maxPeriod > p.minPeriod))
        throw InvalidInput("periodogram: the period range " + std::to_string(p.minPeriod) + " - " +
                           std::to_string(maxPeriod) + " d is empty");
    const double f0 = 1.0 / maxPeriod, f1 = 1.0 / p.minPeriod, df = 1.0 / (p.oversample * s.span);
    const double count = std::floor((f1 - f0) / df) + 1.0;
    if (count < 3.0)
        throw InvalidInput("periodogram: the period range " + std::to_string(p.minPeriod) + " - " +
                           std::to_string(maxPeriod) + " d is finer than a series of " +
                           std::to_string(s.span) + " d can tell");
    if (count > double(kMaxFrequencies))
        throw InvalidInput("periodogram: " + std::to_string(count) +
                           " frequencies (raise minPeriod or lower maxPeriod)");
    const std::size_t nf = static_cast<std::size_t>(count);
    out.frequency.resize(nf);
    out.power.resize(nf);
    for (std::size_t k = 0; k < nf; ++k)
        out.frequency[k] = f0 + double(k) * df;
    glsPowers(s, f0, df, out.power);
    const std::size_t k =
        static_cast<std::size_t>(std::max_element(out.power.begin(), out.power.end()) - out.power.begin());
    double f = out.frequency[k], pk = out.power[k];
    if (k > 0 && k + 1 < nf) { // the parabola through the peak and its neighbours
        const double a = out.power[k - 1], b = out.power[k], c = out.power[k + 1], den = a - 2.0 * b + c;
        if (den < 0.0) {
            const double off = std::clamp(0.5 * (a - c) / den, -0.5, 0.5);
            f += off * df;
            pk = b - 0.25 * (a - c) * off;
        }
    }
    out.bestPeriod = 1.0 / f;
    out.bestPower = pk;
    out.falseAlarm = falseAlarmOf(std::min(pk, 1.0), out.frequency.back(), s);
    return out;
}

double baluevFalseAlarm(double power, double maxFrequency, const std::vector<double>& time,
                        const std::vector<double>& err) {
    const Series s = periodogramPoints(time, std::vector<double>(time.size(), 0.0), err);
    return falseAlarmOf(power, maxFrequency, s);
}

const std::vector<std::string>& detrendTerms() {
    static const std::vector<std::string> terms{"airmass", "fwhm", "sky", "x", "y", "time"};
    return terms;
}

namespace {

const std::vector<double>& termColumn(const LightCurve& lc, const std::string& term) {
    if (term == "airmass") return lc.airmass;
    if (term == "fwhm") return lc.fwhm;
    if (term == "sky") return lc.sky;
    if (term == "x") return lc.x;
    if (term == "y") return lc.y;
    if (term == "time") return lc.bjdTdb;
    std::string known;
    for (const auto& t : detrendTerms())
        known += (known.empty() ? "" : ", ") + t;
    throw InvalidInput("detrend: unknown term '" + term + "' (" + known + ")");
}

// The design: per point, each term minus its median (NaN where the term is not finite).
struct Design {
    std::vector<std::vector<double>> x; // [term][point]
    std::vector<char> fit;              // the point enters the fit
};

Design design(const LightCurve& lc, const std::vector<std::string>& terms) {
    const std::size_t n = lc.relFlux.size();
    Design d{std::vector<std::vector<double>>(terms.size()), std::vector<char>(n, 0)};
    for (std::size_t i = 0; i < n; ++i)
        d.fit[i] = usable(lc.relFlux[i], lc.relFluxErr[i]) ? 1 : 0;
    for (std::size_t k = 0; k < terms.size(); ++k) {
        const std::vector<double>& col = termColumn(lc, terms[k]);
        std::vector<double> finite;
        for (std::size_t i = 0; i < n; ++i)
            if (i < col.size() && std::isfinite(col[i])) finite.push_back(col[i]);
        const double med = robustMedian(finite);
        d.x[k].assign(n, kNaN);
        for (std::size_t i = 0; i < n; ++i) {
            if (i < col.size() && std::isfinite(col[i])) d.x[k][i] = col[i] - med;
            if (!std::isfinite(d.x[k][i])) d.fit[i] = 0;
        }
    }
    return d;
}

// Weighted least squares of rel_flux = a + sum_k c_k x_k over the points marked in `use`: the
// parameters (a first) and their covariance scaled by the reduced chi^2.
struct Fit {
    Eigen::VectorXd beta;
    Eigen::MatrixXd cov;
    int points = 0;
};

Fit solve(const LightCurve& lc, const Design& d, const std::vector<char>& use) {
    const std::size_t m = d.x.size() + 1;
    Eigen::MatrixXd ata = Eigen::MatrixXd::Zero(m, m);
    Eigen::VectorXd aty = Eigen::VectorXd::Zero(m), row(m);
    Fit f;
    for (std::size_t i = 0; i < use.size(); ++i) {
        if (!use[i]) continue;
        const double w = 1.0 / (lc.relFluxErr[i] * lc.relFluxErr[i]);
        row[0] = 1.0;
        for (std::size_t k = 0; k + 1 < m; ++k)
            row[k + 1] = d.x[k][i];
        ata.noalias() += w * row * row.transpose();
        aty += w * lc.relFlux[i] * row;
        ++f.points;
    }
    const Eigen::LDLT<Eigen::MatrixXd> ldlt(ata);
    f.beta = ldlt.solve(aty);
    f.cov = ldlt.solve(Eigen::MatrixXd::Identity(m, m));
    double chi = 0.0;
    for (std::size_t i = 0; i < use.size(); ++i) {
        if (!use[i]) continue;
        double model = f.beta[0];
        for (std::size_t k = 0; k + 1 < m; ++k)
            model += f.beta[k + 1] * d.x[k][i];
        const double r = (lc.relFlux[i] - model) / lc.relFluxErr[i];
        chi += r * r;
    }
    if (f.points > int(m)) f.cov *= chi / double(f.points - int(m));
    return f;
}

// The trend relative to its value at the terms' medians; a term that is not finite counts as its median.
double trendAt(const Fit& f, const Design& d, std::size_t i) {
    double t = 1.0;
    for (std::size_t k = 0; k < d.x.size(); ++k)
        if (std::isfinite(d.x[k][i])) t += f.beta[k + 1] / f.beta[0] * d.x[k][i];
    return t;
}

double rmsAboutOne(const std::vector<double>& v) {
    double sum = 0.0;
    int n = 0;
    for (double x : v)
        if (std::isfinite(x)) {
            sum += (x - 1.0) * (x - 1.0);
            ++n;
        }
    return n > 0 ? std::sqrt(sum / n) : kNaN;
}

// Divides the trend out of the curve, normalises rel_flux to a median of 1 again and recomputes the
// columns derived from it as the series makes them.
void applyTrend(LightCurve& lc, const Fit& f, const Design& d) {
    const std::size_t n = lc.relFlux.size();
    std::vector<double> finite;
    for (std::size_t i = 0; i < n; ++i) {
        const double t = trendAt(f, d, i);
        lc.relFlux[i] /= t;
        lc.relFluxErr[i] /= t;
        if (std::isfinite(lc.relFlux[i])) finite.push_back(lc.relFlux[i]);
    }
    const double med = robustMedian(finite);
    std::vector<double> errs;
    for (std::size_t i = 0; i < n; ++i) {
        lc.relFlux[i] /= med;
        lc.relFluxErr[i] /= med;
        const double r = lc.relFlux[i], e = lc.relFluxErr[i];
        const double magCal = i < lc.mag.size() ? lc.mag[i] - lc.diffMag[i] : kNaN;
        lc.diffMag[i] = -2.5 * std::log10(r);
        lc.diffMagErr[i] = 1.0857362047581294 * e / r;
        if (i < lc.mag.size()) lc.mag[i] = magCal + lc.diffMag[i];
        if (i < lc.magErr.size()) lc.magErr[i] = lc.diffMagErr[i];
        if (std::isfinite(r)) errs.push_back(e);
    }
    lc.rms = rmsAboutOne(lc.relFlux);
    lc.medianErr = robustMedian(errs);
}

} // namespace

Detrend detrend(LightCurve& curve, const std::vector<std::string>& terms) {
    Detrend out;
    out.terms = terms;
    for (const auto& t : terms)
        (void)termColumn(curve, t); // unknown terms throw before anything changes
    out.rmsBefore = rmsAboutOne(curve.relFlux);
    out.coef.assign(terms.size(), kNaN);
    out.coefErr.assign(terms.size(), kNaN);
    if (terms.empty()) return out;
    const Design d = design(curve, terms);
    std::vector<char> use = d.fit;
    const auto enough = [&](const std::vector<char>& u) {
        return std::count(u.begin(), u.end(), 1) >= static_cast<long>(terms.size() + 2);
    };
    if (!enough(use)) return out;
    Fit f = solve(curve, d, use);
    std::vector<double> r; // one clip at 5 sigma of the normalised residuals (MAD)
    std::vector<std::size_t> at;
    for (std::size_t i = 0; i < use.size(); ++i) {
        if (!use[i]) continue;
        double model = f.beta[0];
        for (std::size_t k = 0; k < terms.size(); ++k)
            model += f.beta[k + 1] * d.x[k][i];
        r.push_back((curve.relFlux[i] - model) / curve.relFluxErr[i]);
        at.push_back(i);
    }
    const double med = robustMedian(r), sig = madSigma(r, med);
    for (std::size_t j = 0; j < r.size(); ++j)
        if (sig > 0.0 && std::fabs(r[j] - med) > 5.0 * sig) use[at[j]] = 0;
    if (!enough(use)) return out;
    f = solve(curve, d, use);
    if (!(f.beta[0] > 0.0) || !f.beta.allFinite()) return out;
    for (std::size_t k = 0; k < terms.size(); ++k) {
        out.coef[k] = f.beta[k + 1] / f.beta[0];
        out.coefErr[k] = std::sqrt(std::max(0.0, f.cov(k + 1, k + 1))) / f.beta[0];
    }
    out.points = f.points;
    applyTrend(curve, f, d);
    out.rmsAfter = curve.rms;
    return out;
}

} // namespace gpuphot
