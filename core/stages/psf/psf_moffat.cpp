#include "core/stages/psf/psf_moffat.hpp"

#include "core/stages/psf/psf_fit_math.hpp"
#include "core/util/errors.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numbers>

namespace gpuphot {

namespace {

constexpr int kNumParams = psffit::kLmParams; // x0, y0, amplitude, background, c11, c12, c22, beta
using psffit::PAMP, psffit::PBETA, psffit::PBKG, psffit::PC11, psffit::PC12, psffit::PC22, psffit::PX0,
    psffit::PY0;

// The fixed-order sums of psffit::lmFit on the host: the lanes in pairs (two samples at once in SSE2
// registers, core/util/hd_math_pair.hpp), each lane over its samples in order, then the tree
// (core/stages/psf/psf_fit_math.hpp). The pass stops early, as a rejected trial,
// once the lanes' chi2 so far is certainly above the limit: the terms are non-negative and rounding is
// monotone, so the tree's total T and the lanes' running sum R (of the finished lanes and the current
// partials) satisfy T >= R (1 - 2^-53)^7 / (1 + 2^-53)^128 > R (1 - 1e-13) = R kBelowTree.
// The decision is the one a full pass would make; only the time differs.
class LaneSums {
public:
    LaneSums(const std::vector<FitSample>& samples, const psffit::LmSetup& setup,
             const std::atomic<bool>* cancel = nullptr)
        : m_samples(samples), m_setup(setup), m_lanes(static_cast<std::size_t>(psffit::kLmLanes) * kStride),
          m_cancel(cancel) {}

    double operator()(const double* p, double limit, double* h, double* g) {
        using hdmath::D2;
        if (m_cancel && m_cancel->load(std::memory_order_relaxed)) throw Cancelled();
        const int n = static_cast<int>(m_samples.size());
        double done = 0.0; // the finished lanes' chi2, summed in lane order
        // Two lanes at a time (l, l + 1), one in each element of a D2: the same operations per lane.
        for (int l = 0; l < psffit::kLmLanes; l += 2) {
            D2 sums[kStride];
            for (D2& v : sums)
                v = D2{0.0, 0.0};
            int k = l;
            for (; k + 1 < n; k += psffit::kLmLanes) {
                const FitSample& a = m_samples[static_cast<std::size_t>(k)];
                const FitSample& b = m_samples[static_cast<std::size_t>(k + 1)];
                psffit::accumulateSampleT<D2>(m_setup, p, D2{a.x, b.x}, D2{a.y, b.y}, D2{a.value, b.value},
                                              D2{a.weight, b.weight}, sums);
                if (((done + sums[0][0]) + sums[0][1]) * kBelowTree > limit)
                    return std::numeric_limits<double>::infinity();
            }
            double* laneA = m_lanes.data() + static_cast<std::size_t>(l) * kStride;
            double* laneB = laneA + kStride;
            for (int v = 0; v < kStride; ++v) {
                laneA[v] = sums[v][0];
                laneB[v] = sums[v][1];
            }
            if (k < n) { // lane l has one sample more than lane l + 1
                const FitSample& a = m_samples[static_cast<std::size_t>(k)];
                psffit::accumulateSample(m_setup, p, a.x, a.y, a.value, a.weight, laneA);
                if (((done + laneA[0]) + laneB[0]) * kBelowTree > limit)
                    return std::numeric_limits<double>::infinity();
            }
            done += laneA[0];
            done += laneB[0];
        }
        const int nSums = 1 + psffit::kLmNormal + m_setup.nActive;
        for (int step = psffit::kLmLanes / 2; step > 0; step /= 2)
            for (int l = 0; l < step; ++l) {
                double* a = m_lanes.data() + static_cast<std::size_t>(l) * kStride;
                const double* b = a + static_cast<std::size_t>(step) * kStride;
                for (int v = 0; v < nSums; ++v)
                    a[v] += b[v];
            }
        const double* total = m_lanes.data();
        for (int k = 0; k < psffit::kLmNormal; ++k)
            h[k] = total[1 + k];
        for (int k = 0; k < m_setup.nActive; ++k)
            g[k] = total[1 + psffit::kLmNormal + k];
        return total[0];
    }

private:
    static constexpr int kStride = psffit::kLmSums;
    static constexpr double kBelowTree = 1.0 - 1e-13;
    static_assert(psffit::kLmLanes % 2 == 0, "lanes run in pairs");
    const std::vector<FitSample>& m_samples;
    const psffit::LmSetup& m_setup;
    std::vector<double> m_lanes;
    const std::atomic<bool>* m_cancel;
};

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
    return psffit::evaluate(a.data(), kind == PsfModelKind::Moffat, x, y, psffit::quadrature(nQuad), nullptr);
}

psffit::LmSetup profileFitSetup(PsfModelKind kind, const ProfileParams& start, const LmOptions& opt) {
    psffit::LmSetup s;
    s.moffat = kind == PsfModelKind::Moffat;
    s.quad = psffit::quadrature(opt.nQuad);
    for (int k = 0; k < kNumParams; ++k) {
        if (k == PBKG && !opt.fitBackground) continue;
        if (k == PBETA && (kind != PsfModelKind::Moffat || !opt.fitBeta)) continue;
        s.active[s.nActive++] = k;
    }
    s.maxIterations = opt.maxIterations;
    s.relTolerance = opt.relTolerance;
    s.posTolerance = opt.posTolerance;
    s.betaMin = opt.betaMin;
    s.betaMax = opt.betaMax;
    s.maxShift = opt.maxShift;
    s.startX = start.x0;
    s.startY = start.y0;
    return s;
}

void profileFitStart(const ProfileParams& start, const LmOptions& opt, double* p) {
    const auto a = toArray(start);
    std::copy(a.begin(), a.end(), p);
    if (!opt.fitBackground) p[PBKG] = start.background;
}

ProfileFitResult profileFitResult(const ProfileParams& start, const psffit::LmOutcome& o, int nSamples,
                                  int nActive) {
    ProfileFitResult res;
    res.params = start;
    if (!o.started) return res;
    std::array<double, kNumParams> fitted;
    std::copy(o.p, o.p + kNumParams, fitted.begin());
    res.params = fromArray(fitted);
    res.iterations = o.iterations;
    res.converged = o.converged;
    res.chi2 = o.chi2 / static_cast<double>(nSamples - nActive);
    return res;
}

ProfileFitResult fitProfile(const std::vector<FitSample>& samples, PsfModelKind kind,
                            const ProfileParams& start, const LmOptions& opt, const std::atomic<bool>* cancel) {
    const psffit::LmSetup setup = profileFitSetup(kind, start, opt);
    const int nSamples = static_cast<int>(samples.size());
    if (nSamples <= setup.nActive) {
        ProfileFitResult res;
        res.params = start;
        return res;
    }
    double p[kNumParams];
    profileFitStart(start, opt, p);
    LaneSums eval(samples, setup, cancel);
    return profileFitResult(start, psffit::lmFit(setup, p, eval), nSamples, setup.nActive);
}

} // namespace gpuphot
