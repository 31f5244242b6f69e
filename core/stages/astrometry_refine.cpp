// Stage 7 internals: iterative refinement of a starting WCS (matching, clipping, SIP order selection,
// verification).
#include <algorithm>
#include <cmath>
#include <numbers>

#include <Eigen/Dense>

#include "core/stages/astrometry_internal.hpp"

namespace gpuphot::astrom {
namespace {
constexpr double kPi = std::numbers::pi;

struct Projected {
    std::vector<double> x, y;
    std::vector<std::int32_t> ids; // into RefStars, brightest first
    std::size_t onFrame = 0;       // of them inside the frame proper
};

// nanoflann's L2_Simple metric between a query and a point, in its order of operations, so that a linear
// scan selects exactly what SkyTree::cone (radiusSearch: dist < c * c) selects.
inline double chord2(const std::array<double, 3>& q, const std::array<double, 3>& p) {
    double r = 0.0;
    for (int k = 0; k < 3; ++k) {
        const double d = q[k] - p[k];
        r += d * d;
    }
    return r;
}

// The reference stars a refinement can ever project, cut ONCE from the whole catalog: a cone around the
// starting WCS's frame centre, twice as wide as the first projection cone (which covers the frame with
// 20% to spare). Later cones (the WCS moves by pixels, not by half a field) are answered from this cut
// when they lie inside it (centre distance + radius <= cut radius, with a rounding allowance), else from
// the whole catalog, so the selection is always the same as a cone search of the whole catalog.
// Rows stay in ascending order (brightest first).
class RefPool {
public:
    RefPool(const RefStars& refs, const SkyTree* tree, const TanSip& start, int width, int height,
            double marginPx)
        : m_refs(refs), m_tree(tree) {
        double ra0 = 0, dec0 = 0;
        start.pixelToWorld(0.5 * (width - 1), 0.5 * (height - 1), ra0, dec0);
        const double scaleDeg = start.pixelScaleArcsec() / 3600.0;
        m_radius = 2.0 * (0.5 * std::hypot(width, height) * 1.2 + marginPx) * scaleDeg;
        m_centre = unitVector(ra0, dec0);
        if (!(m_radius < 60.0) || !std::isfinite(ra0) || !std::isfinite(dec0)) return; // no useful cut
        m_rows = select(m_centre, m_radius, nullptr);
        m_cut = true;
    }

    // Rows within radiusDeg of `centre`, ascending.
    std::vector<std::uint32_t> cone(double ra, double dec, double radiusDeg) const {
        const std::array<double, 3> c = unitVector(ra, dec);
        if (m_cut) {
            const double sep = degFromChord(std::sqrt(chord2(c, m_centre)));
            if (sep + radiusDeg + 1e-6 <= m_radius) return select(c, radiusDeg, &m_rows);
        }
        return select(c, radiusDeg, nullptr);
    }

private:
    std::vector<std::uint32_t> select(const std::array<double, 3>& c, double radiusDeg,
                                      const std::vector<std::uint32_t>* from) const {
        if (!from && m_tree) {
            std::vector<std::uint32_t> ids = m_tree->cone(c, radiusDeg);
            std::sort(ids.begin(), ids.end());
            return ids;
        }
        const double ch = chordFromDeg(radiusDeg), c2 = ch * ch;
        std::vector<std::uint32_t> out;
        if (from) {
            for (std::uint32_t id : *from)
                if (chord2(c, m_refs.xyz[id]) < c2) out.push_back(id);
        } else {
            for (std::size_t id = 0; id < m_refs.size(); ++id)
                if (chord2(c, m_refs.xyz[id]) < c2) out.push_back(static_cast<std::uint32_t>(id));
        }
        return out;
    }

    const RefStars& m_refs;
    const SkyTree* m_tree;
    std::array<double, 3> m_centre{};
    double m_radius = 0.0;
    bool m_cut = false;
    std::vector<std::uint32_t> m_rows;
};

// Projects the reference stars of the frame's cone with w (per-star closed form, in parallel: each star's
// result is independent of the thread count) and keeps those within the frame + marginPx, brightest
// first. limit > 0: stop once at least `limit` stars are kept (the first `limit` are the same as without
// a limit; onFrame then counts only the kept ones).
Projected projectRefs(const RefStars& refs, const RefPool& pool, const TanSip& w, int width, int height,
                      double marginPx, int threads, std::size_t limit = 0) {
    Projected out;
    double ra0 = 0, dec0 = 0;
    w.pixelToWorld(0.5 * (width - 1), 0.5 * (height - 1), ra0, dec0);
    const double scaleDeg = w.pixelScaleArcsec() / 3600.0;
    const double radius = (0.5 * std::hypot(width, height) * 1.2 + marginPx) * scaleDeg;
    const std::vector<std::uint32_t> ids = pool.cone(ra0, dec0, std::min(radius, 89.0));
    const std::size_t n = ids.size();
    // Blocks: all at once without a limit, else growing blocks so that few stars are projected in vain.
    std::size_t block = limit > 0 ? std::max<std::size_t>(4096, 2 * limit) : n;
    std::vector<double> px, py;
    std::vector<char> ok;
    for (std::size_t begin = 0; begin < n; begin += block, block *= 2) {
        const std::size_t m = std::min(block, n - begin);
        px.resize(m);
        py.resize(m);
        ok.resize(m);
#pragma omp parallel for schedule(static) num_threads(std::max(1, threads)) if (m > 4096)
        for (long long k = 0; k < static_cast<long long>(m); ++k) {
            const std::uint32_t id = ids[begin + k];
            double x = 0, y = 0;
            ok[k] = w.worldToPixel(refs.ra[id], refs.dec[id], x, y) && std::isfinite(x) && std::isfinite(y);
            px[k] = x;
            py[k] = y;
        }
        for (std::size_t k = 0; k < m; ++k) {
            if (!ok[k]) continue;
            const double x = px[k], y = py[k];
            if (x < -marginPx || y < -marginPx || x > width - 1 + marginPx || y > height - 1 + marginPx)
                continue;
            out.x.push_back(x);
            out.y.push_back(y);
            out.ids.push_back(static_cast<std::int32_t>(ids[begin + k]));
            if (x >= -0.5 && y >= -0.5 && x <= width - 0.5 && y <= height - 0.5) ++out.onFrame;
        }
        if (limit > 0 && out.x.size() >= limit) break;
    }
    return out;
}

// The most common detection -> reference offset (2-px bins, 3x3 peak); false without a clear peak.
bool voteShift(const Detections& det, std::size_t nDet, const Projected& pr, std::size_t nRef, double radius,
               double& sx, double& sy) {
    const double bin = 2.0;
    const int nb = static_cast<int>(std::ceil(radius / bin));
    const int side = 2 * nb + 1;
    std::vector<int> counts(static_cast<std::size_t>(side) * side, 0);
    nDet = std::min(nDet, det.size());
    nRef = std::min(nRef, pr.x.size());
    for (std::size_t i = 0; i < nDet; ++i)
        for (std::size_t j = 0; j < nRef; ++j) {
            const double dx = pr.x[j] - det.x[i], dy = pr.y[j] - det.y[i];
            if (dx * dx + dy * dy > radius * radius) continue;
            const int bx = static_cast<int>(std::floor(dx / bin + 0.5)) + nb;
            const int by = static_cast<int>(std::floor(dy / bin + 0.5)) + nb;
            if (bx < 0 || by < 0 || bx >= side || by >= side) continue;
            ++counts[static_cast<std::size_t>(by) * side + bx];
        }
    int best = 0, bestX = 0, bestY = 0;
    for (int by = 0; by < side; ++by)
        for (int bx = 0; bx < side; ++bx) {
            int s = 0;
            for (int yy = std::max(0, by - 1); yy <= std::min(side - 1, by + 1); ++yy)
                for (int xx = std::max(0, bx - 1); xx <= std::min(side - 1, bx + 1); ++xx)
                    s += counts[static_cast<std::size_t>(yy) * side + xx];
            if (s > best) {
                best = s;
                bestX = bx;
                bestY = by;
            }
        }
    if (best < 4) return false;
    double sumX = 0, sumY = 0;
    int n = 0;
    const double cx = (bestX - nb) * bin, cy = (bestY - nb) * bin;
    for (std::size_t i = 0; i < nDet; ++i)
        for (std::size_t j = 0; j < nRef; ++j) {
            const double dx = pr.x[j] - det.x[i], dy = pr.y[j] - det.y[i];
            if (std::fabs(dx - cx) <= 1.5 * bin && std::fabs(dy - cy) <= 1.5 * bin) {
                sumX += dx;
                sumY += dy;
                ++n;
            }
        }
    if (n == 0) return false;
    sx = sumX / n;
    sy = sumY / n;
    return true;
}

struct FitSet {
    std::vector<double> x, y, ra, dec, flux, w;
};

int termsOf(int order) {
    return order <= 1 ? 3 : (order + 1) * (order + 2) / 2;
}

// Residuals (fit minus reference) in intermediate pixel units along x and y.
void residuals(const FitSet& s, const TanSip& w, std::vector<double>& rx, std::vector<double>& ry,
               int threads) {
    const std::size_t n = s.x.size();
    rx.assign(n, 0.0);
    ry.assign(n, 0.0);
    const double det = w.cd[0][0] * w.cd[1][1] - w.cd[0][1] * w.cd[1][0];
#pragma omp parallel for schedule(static) num_threads(std::max(1, threads)) if (n > 8192)
    for (long long i = 0; i < static_cast<long long>(n); ++i) {
        double ra = 0, dec = 0, xf = 0, yf = 0, xr = 0, yr = 0;
        w.pixelToWorld(s.x[i], s.y[i], ra, dec);
        tanProject(w.crval[0], w.crval[1], ra, dec, xf, yf);
        tanProject(w.crval[0], w.crval[1], s.ra[i], s.dec[i], xr, yr);
        const double dxi = xf - xr, deta = yf - yr;
        rx[i] = (w.cd[1][1] * dxi - w.cd[0][1] * deta) / det;
        ry[i] = (-w.cd[1][0] * dxi + w.cd[0][0] * deta) / det;
    }
}

bool fitSubset(const FitSet& s, const std::vector<char>& used, const double crpix[2], const double crval[2],
               int order, TanSip& out, double* chi2, int threads) {
    FitSet u;
    for (std::size_t i = 0; i < s.x.size(); ++i)
        if (used[i]) {
            u.x.push_back(s.x[i]);
            u.y.push_back(s.y[i]);
            u.ra.push_back(s.ra[i]);
            u.dec.push_back(s.dec[i]);
            u.w.push_back(s.w[i]);
        }
    return fitTanSip(u.x, u.y, u.ra, u.dec, u.w, crpix, crval, order, out, chi2, threads);
}

// Fit with iterative clipping (a point may come back); `used` in: candidates, out: kept.
bool fitClip(const FitSet& s, const double crpix[2], const double crval[2], int order, double clipSigma,
             std::vector<char>& used, TanSip& out, std::vector<double>& rx, std::vector<double>& ry,
             int threads) {
    const std::size_t n = s.x.size();
    const std::vector<char> candidates = used;
    for (int loop = 0; loop < 6; ++loop) {
        const auto nUsed = static_cast<std::size_t>(std::count(used.begin(), used.end(), 1));
        if (nUsed < static_cast<std::size_t>(termsOf(order)) + 2) return false;
        if (!fitSubset(s, used, crpix, crval, order, out, nullptr, threads)) return false;
        residuals(s, out, rx, ry, threads);
        std::vector<double> z;
        for (std::size_t i = 0; i < n; ++i)
            if (used[i]) {
                const double sw = std::sqrt(s.w[i]);
                z.push_back(std::fabs(rx[i]) * sw);
                z.push_back(std::fabs(ry[i]) * sw);
            }
        std::nth_element(z.begin(), z.begin() + z.size() / 2, z.end());
        const double sigma = 1.4826 * z[z.size() / 2];
        if (!(sigma > 0.0)) break;
        std::vector<char> next(n, 0);
        for (std::size_t i = 0; i < n; ++i) {
            if (!candidates[i]) continue;
            const double sw = std::sqrt(s.w[i]);
            next[i] = std::max(std::fabs(rx[i]), std::fabs(ry[i])) * sw <= clipSigma * sigma;
        }
        if (next == used) break;
        used = next;
    }
    return true;
}

// Positional noise model sigma^2 = a + b / flux + c / flux^2 (floor, photon-limited, sky-limited) from
// the squared residuals of the used stars: non-negative coefficients (best subset), iteratively
// reweighted by 1 / model^2 (the variance of a squared residual); sets s.w.
void updateWeights(FitSet& s, const std::vector<char>& used, const std::vector<double>& rx,
                   const std::vector<double>& ry) {
    double fscale = 0.0; // flux normalisation for conditioning
    int n = 0;
    double meanVar = 0.0;
    for (std::size_t i = 0; i < s.x.size(); ++i)
        if (used[i]) {
            fscale = std::max(fscale, 1.0 / s.flux[i]);
            meanVar += 0.5 * (rx[i] * rx[i] + ry[i] * ry[i]);
            ++n;
        }
    if (n < 6 || !(fscale > 0.0) || !(meanVar > 0.0)) return;
    meanVar /= n;
    const double floorVar = std::max(1e-4 * meanVar, 1e-12);
    Eigen::Vector3d model(meanVar, 0.0, 0.0);
    auto varOf = [&](double g) { return std::max(model(0) + model(1) * g + model(2) * g * g, floorVar); };
    for (int irls = 0; irls < 4; ++irls) {
        Eigen::Matrix3d m = Eigen::Matrix3d::Zero();
        Eigen::Vector3d t = Eigen::Vector3d::Zero();
        double tt = 0.0;
        for (std::size_t i = 0; i < s.x.size(); ++i) {
            if (!used[i]) continue;
            const double g = 1.0 / s.flux[i] / fscale, r2 = 0.5 * (rx[i] * rx[i] + ry[i] * ry[i]);
            const double v = varOf(g), wt = 1.0 / (v * v);
            const Eigen::Vector3d b(1.0, g, g * g);
            m += wt * b * b.transpose();
            t += wt * b * r2;
            tt += wt * r2 * r2;
        }
        Eigen::Vector3d best = model;
        double bestCost = INFINITY;
        for (int mask = 1; mask < 8; ++mask) {
            std::vector<int> idx;
            for (int k = 0; k < 3; ++k)
                if (mask & (1 << k)) idx.push_back(k);
            Eigen::MatrixXd mm(idx.size(), idx.size());
            Eigen::VectorXd tv(idx.size());
            for (std::size_t a = 0; a < idx.size(); ++a) {
                tv(a) = t(idx[a]);
                for (std::size_t b = 0; b < idx.size(); ++b)
                    mm(a, b) = m(idx[a], idx[b]);
            }
            const Eigen::VectorXd c = mm.ldlt().solve(tv);
            if (!c.allFinite() || (c.array() < 0.0).any()) continue;
            Eigen::Vector3d full = Eigen::Vector3d::Zero();
            for (std::size_t a = 0; a < idx.size(); ++a)
                full(idx[a]) = c(a);
            const double cost = tt - 2.0 * full.dot(t) + full.dot(m * full);
            if (cost < bestCost) {
                bestCost = cost;
                best = full;
            }
        }
        model = best;
    }
    for (std::size_t i = 0; i < s.x.size(); ++i)
        s.w[i] = 1.0 / varOf(1.0 / s.flux[i] / fscale);
}

FitSet makeFitSet(const Detections& det, const RefStars& refs, const std::vector<Match>& m) {
    FitSet s;
    for (const Match& mm : m) {
        s.x.push_back(det.x[mm.det]);
        s.y.push_back(det.y[mm.det]);
        s.ra.push_back(refs.ra[mm.ref]);
        s.dec.push_back(refs.dec[mm.ref]);
        s.flux.push_back(det.flux[mm.det]);
        s.w.push_back(1.0);
    }
    return s;
}
} // namespace

RefineOutcome refine(const Detections& det, const RefStars& refs, const SkyTree* tree, const TanSip& start,
                     double startRadiusPx, bool vote, const AstrometryParams& p, int threads) {
    RefineOutcome out;
    const int width = det.width, height = det.height;
    // The fits stay serial: their many short parallel loops cost more than they save on a busy 2-core
    // machine (threads wait at barriers); the projections and the pixel matching run on `threads`.
    const int fitThreads = 1;
    const double crpix[2] = {0.5 * (width + 1), 0.5 * (height + 1)};
    TanSip w = start;
    const double matchR = std::max(p.matchRadiusPx, 0.1);

    // Stage A: bright stars, affine (pure TAN) fits at shrinking radii.
    const std::size_t nB = std::min<std::size_t>(det.size(), std::max(200, 4 * p.nBrightest));
    double r = std::max(startRadiusPx, matchR);
    const RefPool pool(refs, tree, start, width, height, r);
    // Stage A uses only the 2 nB brightest projected stars: projection stops there.
    Projected pr = projectRefs(refs, pool, w, width, height, r, threads, 2 * nB);
    if (vote) {
        double sx = 0, sy = 0;
        if (voteShift(det, nB, pr, 2 * nB, r, sx, sy)) {
            w.crpix[0] -= sx;
            w.crpix[1] -= sy;
            r = std::max(3.0 * matchR, r / 3.0);
        }
    }
    for (int round = 0; round < 5; ++round) {
        pr = projectRefs(refs, pool, w, width, height, r, threads, 2 * nB);
        const auto m = matchInPixels(det, nB, pr.x, pr.y, pr.ids, 2 * nB, r, threads);
        if (m.size() < 6) {
            out.why = "too few matches (" + std::to_string(m.size()) + ") with the starting WCS";
            return out;
        }
        FitSet s = makeFitSet(det, refs, m);
        std::vector<char> used(s.x.size(), 1);
        std::vector<double> rx, ry;
        TanSip fit;
        if (!fitClip(s, crpix, w.crval, 1, p.clipSigma, used, fit, rx, ry, fitThreads)) {
            out.why = "the affine fit failed";
            return out;
        }
        w = fit;
        double ss = 0;
        int n = 0;
        for (std::size_t i = 0; i < used.size(); ++i)
            if (used[i]) {
                ss += rx[i] * rx[i] + ry[i] * ry[i];
                ++n;
            }
        const double rms = std::sqrt(ss / std::max(n, 1));
        const double next = std::max(1.5 * matchR, std::min(r / 1.5, 5.0 * rms));
        if (round >= 1 && next >= r) break;
        r = next;
    }

    // Stage B: every star, TAN+SIP with the order chosen by BIC, re-matched each iteration.
    std::vector<Match> matches;
    std::vector<char> usedFinal;
    FitSet s;
    int chosen = 1;
    const int iterations = std::max(1, p.iterations);
    for (int it = 0; it < iterations; ++it) {
        const double radius = it == 0 ? std::max(matchR, std::min(r, 2.0 * matchR)) : matchR;
        pr = projectRefs(refs, pool, w, width, height, radius, threads);
        matches = matchInPixels(det, det.size(), pr.x, pr.y, pr.ids, pr.x.size(), radius, threads);
        out.refsOnFrame = pr.onFrame;
        s = makeFitSet(det, refs, matches);
        const std::size_t n = s.x.size();
        if (n < 6) {
            out.why = "too few matches (" + std::to_string(n) + ")";
            return out;
        }
        std::vector<char> used(n, 1);
        std::vector<double> rx, ry;
        int maxOrder = 1;
        for (int o = std::max(2, p.minSipOrder); o <= std::min(p.maxSipOrder, 9); ++o)
            if (termsOf(o) * p.minMatchesPerTerm <= static_cast<double>(n)) maxOrder = o;
        TanSip fit;
        if (!fitClip(s, crpix, w.crval, maxOrder, p.clipSigma, used, fit, rx, ry, fitThreads)) {
            out.why = "the TAN+SIP fit failed";
            return out;
        }
        updateWeights(s, used, rx, ry);
        used.assign(n, 1); // every match is a candidate again under the new weights
        if (!fitClip(s, crpix, w.crval, maxOrder, p.clipSigma, used, fit, rx, ry, fitThreads)) {
            out.why = "the weighted TAN+SIP fit failed";
            return out;
        }
        // Order selection on the kept stars: BIC = chi2 + (number of parameters) ln(observations).
        const auto nUsed = static_cast<double>(std::count(used.begin(), used.end(), 1));
        const int lo = p.minSipOrder <= 1 ? 1 : std::min(maxOrder, p.minSipOrder);
        double bestBic = INFINITY;
        TanSip best = fit;
        chosen = maxOrder;
        for (int o = lo; o <= maxOrder; ++o) {
            TanSip f;
            double chi2 = 0.0;
            if (!fitSubset(s, used, crpix, w.crval, o, f, &chi2, fitThreads)) continue;
            const double bic = chi2 + 2.0 * termsOf(o) * std::log(2.0 * nUsed);
            if (bic < bestBic) {
                bestBic = bic;
                best = f;
                chosen = o;
            }
        }
        w = best;
        usedFinal = used;
    }
    out.wcs = w;
    out.sipOrder = chosen >= 2 ? chosen : 0;
    out.matches = matches;
    out.used.assign(usedFinal.begin(), usedFinal.end());
    out.nUsed = static_cast<int>(std::count(usedFinal.begin(), usedFinal.end(), 1));
    const double nDet = static_cast<double>(det.size());
    out.chance = nDet * out.refsOnFrame / (double(width) * height) * kPi * matchR * matchR;
    const double nMatched = static_cast<double>(matches.size());
    const double needFraction = p.verifyMinFraction * std::min(nDet, static_cast<double>(out.refsOnFrame));
    const double needChance = out.chance + p.verifySigma * std::sqrt(out.chance);
    if (nMatched < p.verifyMinMatches || nMatched < needFraction || nMatched < needChance) {
        out.why = "verification failed: " + std::to_string(matches.size()) + " matches (need " +
                  std::to_string(static_cast<int>(std::ceil(
                      std::max({static_cast<double>(p.verifyMinMatches), needFraction, needChance})))) +
                  "; " + std::to_string(out.chance) + " expected by chance)";
        return out;
    }
    out.ok = true;
    return out;
}

} // namespace gpuphot::astrom
