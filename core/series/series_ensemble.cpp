// Comparison ensembles: normalisation, weighted combination, leave-one-out vetting, the field-wide
// pre-vetting, and the target's flux relative to its ensemble.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <string>

#include "core/series/series_internal.hpp"
#include "core/util/robust_stats.hpp"

namespace gpuphot::series_detail {

Normalised normalise(const std::vector<Meas>& perFrame) {
    std::vector<double> f;
    for (const Meas& m : perFrame)
        if (m.comparable()) f.push_back(m.flux);
    const double med = robustMedian(f);
    Normalised n;
    n.c.assign(perFrame.size(), NAN);
    n.e.assign(perFrame.size(), NAN);
    if (!(med > 0.0)) return n;
    for (std::size_t u = 0; u < perFrame.size(); ++u) {
        const Meas& m = perFrame[u];
        if (!m.comparable()) continue;
        n.c[u] = static_cast<float>(m.flux / med);
        n.e[u] = static_cast<float>(m.err / med);
    }
    return n;
}

double clippedRms(const std::vector<double>& v, double clip) {
    std::vector<double> f;
    for (double x : v)
        if (std::isfinite(x)) f.push_back(x);
    if (f.size() < 3) return kNan;
    const double med = robustMedian(f), sig = madSigma(f, med);
    double sum = 0.0;
    std::size_t n = 0;
    for (double x : f)
        if (sig <= 0.0 || std::fabs(x - med) <= clip * sig) {
            sum += (x - med) * (x - med);
            ++n;
        }
    return n > 1 ? std::sqrt(sum / double(n - 1)) : kNan;
}

namespace {

// Per-frame sums over the active stars; a star's leave-one-out ensemble subtracts its own terms.
struct Totals {
    std::vector<double> sw, swc, sw2e2, sw2;
    std::vector<int> n;
};

Totals totals(const std::vector<const Normalised*>& norm, const std::vector<EnsembleStar>& ens,
              std::size_t nf) {
    Totals t{std::vector<double>(nf, 0.0), std::vector<double>(nf, 0.0), std::vector<double>(nf, 0.0),
             std::vector<double>(nf, 0.0), std::vector<int>(nf, 0)};
    for (std::size_t k = 0; k < ens.size(); ++k) {
        if (ens[k].dropped || !(ens[k].weight > 0.0)) continue;
        const double w = ens[k].weight;
        for (std::size_t u = 0; u < nf; ++u) {
            const double c = norm[k]->c[u], e = norm[k]->e[u];
            if (!std::isfinite(c)) continue;
            t.sw[u] += w;
            t.swc[u] += w * c;
            t.sw2e2[u] += w * w * e * e;
            t.sw2[u] += w * w;
            ++t.n[u];
        }
    }
    return t;
}

// Flux and error of the ensemble in frame u, without star k's terms when `without` is set.
bool ensembleAt(const Totals& t, std::size_t u, const Normalised* without, double w, double scint,
                double& flux, double& err) {
    double sw = t.sw[u], swc = t.swc[u], sw2e2 = t.sw2e2[u], sw2 = t.sw2[u];
    int n = t.n[u];
    if (without && std::isfinite(without->c[u]) && w > 0.0) {
        sw -= w;
        swc -= w * without->c[u];
        sw2e2 -= w * w * without->e[u] * without->e[u];
        sw2 -= w * w;
        --n;
    }
    if (n <= 0 || !(sw > 0.0)) return false;
    flux = swc / sw;
    // Each comparison's scintillation is its own: it enters as sum (w sigma)^2 too.
    err = std::sqrt(std::max(0.0, sw2e2) + std::max(0.0, sw2) * scint * scint * flux * flux) / sw;
    return true;
}

void setWeights(std::vector<EnsembleStar>& ens) {
    double sum = 0.0;
    for (auto& e : ens) {
        const double s = std::isfinite(e.scatter) && e.scatter > 0.0 ? e.scatter : e.expected;
        e.weight = e.dropped || !(s > 0.0) ? 0.0 : 1.0 / (s * s);
        sum += e.weight;
    }
    for (auto& e : ens)
        e.weight = sum > 0.0 ? e.weight / sum : 0.0;
}

// Scatter of each active star's curve against the others, and the noise its errors predict.
void testAll(const std::vector<const Normalised*>& norm, std::vector<EnsembleStar>& ens,
             const std::vector<double>& scint, double clip) {
    const std::size_t nf = scint.size();
    const Totals t = totals(norm, ens, nf);
    std::vector<double> d(nf);
    for (std::size_t k = 0; k < ens.size(); ++k) {
        if (ens[k].dropped) continue;
        double sumVar = 0.0;
        std::size_t n = 0;
        for (std::size_t u = 0; u < nf; ++u) {
            d[u] = kNan;
            double f, e;
            const double c = norm[k]->c[u];
            if (!std::isfinite(c) || !ensembleAt(t, u, norm[k], ens[k].weight, scint[u], f, e)) continue;
            d[u] = c / f;
            const double rel = norm[k]->e[u] / c, relE = e / f;
            sumVar += rel * rel + relE * relE + scint[u] * scint[u];
            ++n;
        }
        ens[k].scatter = clippedRms(d, clip);
        ens[k].expected = n > 0 ? std::sqrt(sumVar / double(n)) : kNan;
    }
}

} // namespace

EnsembleFlux combine(const std::vector<const Normalised*>& norm, const std::vector<EnsembleStar>& ens,
                     const std::vector<double>& scint) {
    const std::size_t nf = scint.size();
    const Totals t = totals(norm, ens, nf);
    EnsembleFlux out{std::vector<double>(nf, kNan), std::vector<double>(nf, kNan), t.n};
    for (std::size_t u = 0; u < nf; ++u)
        ensembleAt(t, u, nullptr, 0.0, scint[u], out.flux[u], out.err[u]);
    return out;
}

// Drops comparison stars whose own differential curve scatters more than vetRatio times the ensemble's
// median scatter-to-expected ratio, worst first, one per round (pinned stars stay).
void vet(const std::vector<const Normalised*>& norm, std::vector<EnsembleStar>& ens,
         const std::vector<double>& scint, const SeriesParams& p) {
    for (std::size_t k = 0; k < ens.size(); ++k) { // first weights from the errors alone
        std::vector<double> rel;
        for (std::size_t u = 0; u < scint.size(); ++u)
            if (std::isfinite(norm[k]->c[u])) rel.push_back(norm[k]->e[u] / norm[k]->c[u]);
        ens[k].expected = robustMedian(rel);
        ens[k].scatter = kNan;
    }
    setWeights(ens);
    for (int round = 0; round <= p.vetIterations; ++round) {
        testAll(norm, ens, scint, p.clipSigma);
        setWeights(ens);
        std::vector<double> ratio;
        long worst = -1;
        double worstRatio = 0.0;
        for (std::size_t k = 0; k < ens.size(); ++k) {
            if (ens[k].dropped || !(ens[k].expected > 0.0) || !std::isfinite(ens[k].scatter)) continue;
            const double r = ens[k].scatter / ens[k].expected;
            ratio.push_back(r);
            if (ens[k].why != "pinned" && r > worstRatio) {
                worstRatio = r;
                worst = static_cast<long>(k);
            }
        }
        if (worst < 0 || ratio.size() <= static_cast<std::size_t>(p.minEnsemble) || round == p.vetIterations)
            break;
        if (!(worstRatio > p.vetRatio * robustMedian(ratio))) break;
        ens[worst].dropped = true;
        ens[worst].why = "variable: scatter " + std::to_string(worstRatio) + " x its expected noise";
    }
}

Relative relativeFlux(const std::vector<Meas>& target, const EnsembleFlux& ens,
                      const std::vector<double>& scint) {
    const std::size_t nf = scint.size();
    Relative r;
    r.ratio.assign(nf, kNan);
    r.err.assign(nf, kNan);
    std::vector<double> finite;
    for (std::size_t u = 0; u < nf; ++u) {
        const Meas& m = target[u];
        if (!m.good() || !std::isfinite(ens.flux[u])) continue;
        r.ratio[u] = m.flux / ens.flux[u];
        const double rf = m.err / m.flux, re = ens.err[u] / ens.flux[u];
        r.err[u] = std::sqrt(rf * rf + re * re + scint[u] * scint[u]);
        finite.push_back(r.ratio[u]);
    }
    const double med = robustMedian(finite);
    std::vector<double> errs;
    double dev = 0.0, chi = 0.0;
    for (std::size_t u = 0; u < nf; ++u) {
        r.ratio[u] /= med;
        r.err[u] *= r.ratio[u];
        if (!std::isfinite(r.ratio[u])) continue;
        dev += (r.ratio[u] - 1.0) * (r.ratio[u] - 1.0);
        chi += (r.ratio[u] - 1.0) * (r.ratio[u] - 1.0) / (r.err[u] * r.err[u]);
        errs.push_back(r.err[u]);
    }
    r.points = static_cast<int>(errs.size());
    if (r.points > 0) r.rms = std::sqrt(dev / r.points);
    if (r.points > 1) r.chi2 = chi / (r.points - 1);
    r.medianErr = robustMedian(errs);
    return r;
}

namespace {

// The field's median normalised flux per frame (its transparency) over the eligible sources.
std::vector<double> fieldCurve(const std::vector<Normalised>& norm, const std::vector<char>& eligible,
                               std::size_t nf) {
    std::vector<double> field(nf, kNan);
    std::vector<double> v;
    for (std::size_t u = 0; u < nf; ++u) {
        v.clear();
        for (std::size_t s = 0; s < norm.size(); ++s)
            if (eligible[s] && std::isfinite(norm[s].c[u])) v.push_back(norm[s].c[u]);
        if (v.size() >= 3) field[u] = robustMedian(v);
    }
    return field;
}

// A source's curve against the field (d) and its errors (e: its own and the scintillation); returns
// the points.
std::size_t againstField(const Normalised& n, const std::vector<double>& field,
                         const std::vector<double>& scint, std::vector<double>& d, std::vector<double>& e) {
    std::size_t points = 0;
    for (std::size_t u = 0; u < field.size(); ++u) {
        d[u] = e[u] = kNan;
        const double c = n.c[u];
        if (!std::isfinite(c) || !std::isfinite(field[u])) continue;
        d[u] = c / field[u];
        const double rel = n.e[u] / c;
        e[u] = d[u] * std::sqrt(rel * rel + scint[u] * scint[u]);
        ++points;
    }
    return points;
}

} // namespace

std::size_t prevet(const std::vector<Normalised>& norm, const std::vector<double>& magnitude,
                   std::vector<char>& eligible, const std::vector<double>& scint, const SeriesParams& p) {
    const std::size_t nf = scint.size(), ns = norm.size();
    const std::vector<double> field = fieldCurve(norm, eligible, nf);
    std::vector<double> ratio(ns, kNan), d(nf), e(nf);
    std::vector<char> flagged(ns, 0);
    std::map<long, std::vector<double>> byMag; // 1-mag bins
    for (std::size_t s = 0; s < ns; ++s) {
        if (!eligible[s]) continue;
        const std::size_t n = againstField(norm[s], field, scint, d, e);
        if (n < 3) continue;
        double var = 0.0;
        for (std::size_t u = 0; u < nf; ++u)
            if (std::isfinite(d[u])) var += (e[u] / d[u]) * (e[u] / d[u]);
        ratio[s] = clippedRms(d, p.clipSigma) / std::sqrt(var / double(n));
        if (std::isfinite(ratio[s])) byMag[std::lround(std::floor(magnitude[s]))].push_back(ratio[s]);
        // The variability flag on the same curve: a flagged star is no comparison either.
        if (p.findVariables) flagged[s] = isVariable(stetsonJ(d, e), chi2Constant(d, e), p.variability);
    }
    std::vector<double> all;
    for (const auto& [bin, r] : byMag)
        all.insert(all.end(), r.begin(), r.end());
    const double global = robustMedian(all);
    std::size_t cleared = 0;
    for (std::size_t s = 0; s < ns; ++s) {
        if (!eligible[s]) continue;
        const auto& bin = byMag[std::lround(std::floor(magnitude[s]))];
        const double ref = bin.size() >= 5 ? robustMedian(bin) : global;
        if (flagged[s] || (std::isfinite(ratio[s]) && ratio[s] > p.vetRatio * ref)) {
            eligible[s] = 0;
            ++cleared;
        }
    }
    return cleared;
}

} // namespace gpuphot::series_detail
