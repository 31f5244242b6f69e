#include "core/stages/zeropoint/zeropoint.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>
#include <string>
#include <utility>

#include <Eigen/Dense>
#include <nlohmann/json.hpp>

#include "core/catalog/reference_catalog.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/crossmatch/crossmatch.hpp"
#include "core/util/errors.hpp"
#include "core/util/fast_mod.hpp"
#include "core/util/parallel.hpp"
#include "core/util/robust_stats.hpp"
#include "core/wcs/tan_sip.hpp"

namespace gpuphot {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kMagPerSnr = 1.0857362047581294; // 2.5 / ln(10)
constexpr double kPi = std::numbers::pi;

// Calibrator data: y = ref.mag - mag_inst, var = σ², c = colour (0 when no colour term).
struct Calib {
    std::vector<double> y, var, c;
    std::size_t size() const { return y.size(); }
};

struct Model {
    double zp = kNaN, ct = 0.0, zpErr = kNaN, ctErr = kNaN;
    bool ok = false;
};

double residualOf(const Calib& d, const Model& m, std::size_t i) {
    return d.y[i] - (m.zp + m.ct * d.c[i]);
}

// Weighted least squares of y = zp (+ ct c) on the stars with keep[i]; weights 1/(var + sInt²), or 1 when
// !weighted. Serial sums in index order (deterministic).
Model fitModel(const Calib& d, const std::vector<char>& keep, bool colour, double sInt2, bool weighted) {
    Model m;
    const int p = colour ? 2 : 1;
    Eigen::Matrix2d ata = Eigen::Matrix2d::Zero();
    Eigen::Vector2d aty = Eigen::Vector2d::Zero();
    int n = 0;
    for (std::size_t i = 0; i < d.size(); ++i) {
        if (!keep[i]) continue;
        const double w = weighted ? 1.0 / (d.var[i] + sInt2) : 1.0;
        const double c = colour ? d.c[i] : 0.0;
        ata(0, 0) += w;
        ata(0, 1) += w * c;
        ata(1, 1) += w * c * c;
        aty(0) += w * d.y[i];
        aty(1) += w * c * d.y[i];
        ++n;
    }
    if (n < p) return m;
    ata(1, 0) = ata(0, 1);
    if (!colour) {
        if (!(ata(0, 0) > 0.0)) return m;
        m.zp = aty(0) / ata(0, 0);
        m.zpErr = std::sqrt(1.0 / ata(0, 0));
        m.ok = true;
        return m;
    }
    const Eigen::LDLT<Eigen::Matrix2d> ldlt(ata);
    if (ldlt.info() != Eigen::Success || !(std::fabs(ata.determinant()) > 1e-12 * ata(0, 0) * ata(1, 1)))
        return m;
    const Eigen::Vector2d sol = ldlt.solve(aty);
    const Eigen::Matrix2d cov = ldlt.solve(Eigen::Matrix2d::Identity());
    m.zp = sol(0);
    m.ct = sol(1);
    m.zpErr = std::sqrt(std::max(0.0, cov(0, 0)));
    m.ctErr = std::sqrt(std::max(0.0, cov(1, 1)));
    m.ok = std::isfinite(m.zp) && std::isfinite(m.ct);
    return m;
}

double chi2(const Calib& d, const std::vector<char>& keep, const Model& m, double sInt2) {
    double s = 0.0;
    for (std::size_t i = 0; i < d.size(); ++i)
        if (keep[i]) {
            const double r = residualOf(d, m, i);
            s += r * r / (d.var[i] + sInt2);
        }
    return s;
}

struct WeightedFit {
    Model model;
    double sInt = 0.0;
    double chi2dof = kNaN; // without σ_int
};

// Weighted fit with an intrinsic-scatter term solved so that chi²/dof = 1 when it exceeds 1.
WeightedFit fitWithIntrinsic(const Calib& d, const std::vector<char>& keep, bool colour) {
    WeightedFit f;
    const int p = colour ? 2 : 1;
    int n = 0;
    for (char k : keep)
        n += k != 0;
    f.model = fitModel(d, keep, colour, 0.0, true);
    if (!f.model.ok) return f;
    const int dof = n - p;
    if (dof <= 0) return f;
    f.chi2dof = chi2(d, keep, f.model, 0.0) / dof;
    if (!(f.chi2dof > 1.0)) return f;
    double s2 = 0.0;
    // The kept stars' squared residuals and variances, packed once per model.
    std::vector<double> r2, var;
    r2.reserve(n);
    var.reserve(n);
    for (int round = 0; round < 4; ++round) {
        r2.clear();
        var.clear();
        for (std::size_t i = 0; i < d.size(); ++i)
            if (keep[i]) {
                const double r = residualOf(d, f.model, i);
                r2.push_back(r * r);
                var.push_back(d.var[i]);
            }
        // chi2(s²) - dof is decreasing and convex in s²: Newton's method from s² = 0 (where it is > 0)
        // climbs monotonically to the root without overshooting; stop once a step no longer moves s².
        s2 = 0.0;
        for (int it = 0; it < 200; ++it) {
            double c = 0.0, dc = 0.0; // chi2 and -d chi2 / d s²
            for (std::size_t i = 0; i < r2.size(); ++i) {
                const double inv = 1.0 / (var[i] + s2);
                c += r2[i] * inv;
                dc += r2[i] * inv * inv;
            }
            if (!(c > dof) || !(dc > 0.0)) break;
            const double next = s2 + (c - dof) / dc;
            if (!(next > s2) || !std::isfinite(next)) break;
            s2 = next;
        }
        const Model m = fitModel(d, keep, colour, s2, true);
        if (!m.ok) break;
        f.model = m;
    }
    f.sInt = std::sqrt(s2);
    return f;
}

// SplitMix64: a tiny, fully specified generator (same sequence on every platform).
struct SplitMix64 {
    std::uint64_t state;
    std::uint64_t next() {
        std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    std::size_t below(std::size_t n) { return static_cast<std::size_t>(next() % n); }
    std::size_t below(const FastMod& n) { return static_cast<std::size_t>(n.of(next())); } // the same draw
};

std::vector<char> clippedMean(const Calib& d, bool colour, const ZeroPointParams& p) {
    const std::size_t n = d.size();
    // Robust start: unweighted fit on all, keep |r - median| <= clipSigma sqrt((1.4826 MAD)² + σ²).
    std::vector<char> keep(n, 1);
    const Model m0 = fitModel(d, keep, colour, 0.0, false);
    if (!m0.ok) return keep;
    std::vector<double> r(n);
    for (std::size_t i = 0; i < n; ++i)
        r[i] = residualOf(d, m0, i);
    const double med = robustMedian(r);
    std::vector<double> dev(n);
    for (std::size_t i = 0; i < n; ++i)
        dev[i] = std::fabs(r[i] - med);
    const double mad = 1.4826 * robustMedian(dev);
    for (std::size_t i = 0; i < n; ++i)
        keep[i] = dev[i] <= p.clipSigma * std::sqrt(mad * mad + d.var[i]);
    for (int it = 0; it < p.maxIterations; ++it) {
        const WeightedFit f = fitWithIntrinsic(d, keep, colour);
        if (!f.model.ok) break;
        std::vector<char> next(n);
        for (std::size_t i = 0; i < n; ++i)
            next[i] =
                std::fabs(residualOf(d, f.model, i)) <= p.clipSigma * std::sqrt(d.var[i] + f.sInt * f.sInt);
        if (next == keep) break;
        keep.swap(next);
    }
    return keep;
}

std::vector<char> ransac(const Calib& d, bool colour, const ZeroPointParams& p) {
    const std::size_t n = d.size();
    SplitMix64 rng{p.seed};
    const double thr = p.ransacThreshold;
    Model best;
    std::size_t bestCount = 0;
    double bestCost = std::numeric_limits<double>::infinity();
    for (int it = 0; it < p.ransacIterations; ++it) {
        Model m;
        const std::size_t i = rng.below(n);
        if (!colour) {
            m.zp = d.y[i];
        } else {
            std::size_t j = rng.below(n - 1);
            if (j >= i) ++j;
            const double dc = d.c[j] - d.c[i];
            if (!(std::fabs(dc) > 0.05)) continue; // degenerate sample: no leverage on the slope
            m.ct = (d.y[j] - d.y[i]) / dc;
            m.zp = d.y[i] - m.ct * d.c[i];
        }
        std::size_t count = 0;
        double cost = 0.0;
        for (std::size_t k = 0; k < n; ++k) {
            const double r = residualOf(d, m, k);
            if (std::fabs(r) <= thr) ++count;
            cost += std::min(r * r, thr * thr);
        }
        if (count > bestCount || (count == bestCount && cost < bestCost)) {
            best = m;
            bestCount = count;
            bestCost = cost;
            best.ok = true;
        }
    }
    std::vector<char> keep(n, 0);
    if (!best.ok) return keep;
    Model m = best;
    for (int round = 0; round < 2; ++round) {
        for (std::size_t k = 0; k < n; ++k)
            keep[k] = std::fabs(residualOf(d, m, k)) <= thr;
        const Model refit = fitModel(d, keep, colour, 0.0, true);
        if (!refit.ok) break;
        m = refit;
    }
    for (std::size_t k = 0; k < n; ++k)
        keep[k] = std::fabs(residualOf(d, m, k)) <= thr;
    return keep;
}

// The reference stars within `cone` degrees of (ra0, dec0) in tangent-plane arcsec about it, with their
// catalog rows, in catalog order (projected in parallel, compacted in order); at: per catalog row, its
// place here (-1: not in the cone).
struct ConeStars {
    std::vector<double> xi, eta;
    std::vector<std::int32_t> row;
    std::vector<std::int32_t> at;
};

// A point of the tangent plane (arcsec) as a unit vector in the tangent point's own basis (the point, east,
// north): (1, xi, eta) / |(1, xi, eta)|, xi and eta in radians. Distances between such vectors are the
// distances on the sky, whatever the tangent point.
detail::UnitVector planeUnit(double xiArcsec, double etaArcsec) {
    constexpr double kArcsec = kPi / (180.0 * 3600.0);
    const double xi = xiArcsec * kArcsec, eta = etaArcsec * kArcsec;
    const double inv = 1.0 / std::sqrt(1.0 + xi * xi + eta * eta);
    return {inv, xi * inv, eta * inv};
}

ConeStars projectCone(const ReferenceCatalog& ref, double ra0, double dec0, double cone, int threads) {
    const auto n = static_cast<std::ptrdiff_t>(ref.size());
    std::vector<double> xi(ref.size()), eta(ref.size());
    std::vector<char> in(ref.size(), 0);
#pragma omp parallel for num_threads(threads) schedule(static) if (n >= 20000)
    for (std::ptrdiff_t k = 0; k < n; ++k) {
        // A star beyond the cone lies more than 2 radii from every calibrator on the sky and, the gnomonic
        // projection stretching every length, in the plane: it can never be a neighbour, so only the
        // cheap declination test is made.
        if (std::fabs(ref.dec[k] - dec0) > cone) continue;
        double a, b;
        if (!tanProject(ra0, dec0, ref.ra[k], ref.dec[k], a, b)) continue;
        xi[k] = a * 3600.0;
        eta[k] = b * 3600.0;
        in[k] = 1;
    }
    ConeStars s;
    s.at.assign(ref.size(), -1);
    compactInOrder(
        ref.size(), threads, [&](std::size_t k) { return in[k] != 0; },
        [&](std::size_t m) {
            s.xi.resize(m);
            s.eta.resize(m);
            s.row.resize(m);
        },
        [&](std::size_t j, std::size_t k) {
            s.at[k] = static_cast<std::int32_t>(j);
            s.xi[j] = xi[k];
            s.eta[j] = eta[k];
            s.row[j] = static_cast<std::int32_t>(k);
        });
    return s;
}

// Per entry of `rows`: whether that reference star has another star brighter than (its mag + deltaMag)
// closer than radiusArcsec on the sky (the chord between their unit vectors, planeUnit). The neighbours are
// found on a grid in the tangent plane of the first row, searched with the radius stretched by the
// projection's largest scale over the cone (sec^2), so that the answer for a star does not depend on the
// other rows. In parallel.
std::vector<char> crowdedInReference(const ReferenceCatalog& ref, const std::vector<std::int32_t>& rows,
                                     double radiusArcsec, double deltaMag, int threads) {
    std::vector<char> crowded(rows.size(), 0);
    if (rows.empty() || !(radiusArcsec > 0.0)) return crowded;
    const double ra0 = ref.ra[rows[0]], dec0 = ref.dec[rows[0]];
    const auto nc = static_cast<std::ptrdiff_t>(rows.size());
    double cone = 0.0;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(max : cone) if (nc >= 20000)
    for (std::ptrdiff_t c = 0; c < nc; ++c)
        cone = std::max(cone, angularSeparationDeg(ra0, dec0, ref.ra[rows[c]], ref.dec[rows[c]]));
    cone += 2.0 * radiusArcsec / 3600.0;
    if (cone >= 80.0) return crowded; // not a single frame; skip rather than distort
    const ConeStars stars = projectCone(ref, ra0, dec0, cone, threads);
    if (stars.row.empty()) return crowded;
    const double cosCone = std::cos(cone * kPi / 180.0);
    const double planeRadius = radiusArcsec / (cosCone * cosCone) * (1.0 + 1e-6) + 1e-6;
    const double halfAngle = 0.5 * radiusArcsec / 3600.0 * kPi / 180.0;
    const double chord2Max = 4.0 * std::sin(halfAngle) * std::sin(halfAngle);
    const auto [x0, x1] = std::minmax_element(stars.xi.begin(), stars.xi.end());
    const auto [y0, y1] = std::minmax_element(stars.eta.begin(), stars.eta.end());
    const detail::PointGrid grid(stars.xi, stars.eta, stars.row.size(), *x0, *y0, *x1 - *x0, *y1 - *y0,
                                 planeRadius);
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1024) if (nc >= 20000)
    for (std::ptrdiff_t c = 0; c < nc; ++c) {
        // A calibrator lies within the cone (which reaches 2 radii beyond the farthest): its projection is
        // the cone's.
        const std::int32_t own = rows[c], p = stars.at[static_cast<std::size_t>(own)];
        if (p < 0) continue; // behind the tangent plane
        const double qx = stars.xi[static_cast<std::size_t>(p)], qy = stars.eta[static_cast<std::size_t>(p)];
        const double limit = ref.mag[own] + deltaMag;
        const detail::UnitVector u = planeUnit(qx, qy);
        grid.visit(qx, qy, planeRadius, [&](std::uint32_t j) {
            const std::int32_t k = stars.row[grid.index[j]];
            if (k == own || !(ref.mag[k] < limit)) return;
            const detail::UnitVector v = planeUnit(grid.sx[j], grid.sy[j]);
            const double dx = u[0] - v[0], dy = u[1] - v[1], dz = u[2] - v[2];
            if (dx * dx + dy * dy + dz * dz < chord2Max) crowded[c] = 1;
        });
    }
    return crowded;
}

void validate(const ZeroPointParams& p) {
    if (p.method != "clipped-mean" && p.method != "ransac")
        throw InvalidInput("zeropoint: method must be \"clipped-mean\" or \"ransac\" (got \"" + p.method +
                           "\")");
    if (!(p.clipSigma > 0.0)) throw InvalidInput("zeropoint: clipSigma must be positive");
    if (p.maxIterations < 0) throw InvalidInput("zeropoint: maxIterations must be >= 0");
    if (p.minStars < 1) throw InvalidInput("zeropoint: minStars must be >= 1");
    if (p.ransacIterations < 1) throw InvalidInput("zeropoint: ransacIterations must be >= 1");
    if (!(p.ransacThreshold > 0.0)) throw InvalidInput("zeropoint: ransacThreshold must be positive");
    if (!(p.colourTermMinSignificance >= 0.0) || !std::isfinite(p.colourTermMinSignificance))
        throw InvalidInput("zeropoint: colourTermMinSignificance must be >= 0");
    if (std::isnan(p.minSnr) || std::isnan(p.magBright) || std::isnan(p.magFaint))
        throw InvalidInput("zeropoint: minSnr, magBright and magFaint must not be NaN");
    if (p.isolationArcsec < 0.0 || !std::isfinite(p.isolationArcsec))
        throw InvalidInput("zeropoint: isolationArcsec must be >= 0");
    if (!(p.isolationFwhm >= 0.0) || !std::isfinite(p.isolationFwhm))
        throw InvalidInput("zeropoint: isolationFwhm must be >= 0");
    if (!(p.matchSigma >= 0.0) || !std::isfinite(p.matchSigma))
        throw InvalidInput("zeropoint: matchSigma must be >= 0");
    if (p.bootstrap < 0) throw InvalidInput("zeropoint: bootstrap must be >= 0");
    if (!(p.maxZpErr >= 0.0) || std::isnan(p.maxZpErr))
        throw InvalidInput("zeropoint: maxZpErr must be >= 0");
    if (p.magSource != "auto" && p.magSource != "aperture" && p.magSource != "psf")
        throw InvalidInput("zeropoint: magSource '" + p.magSource + "' (expected auto, aperture or psf)");
}

// Why the crossmatch's matches are no better than chance (empty: they are): fewer than the chance count
// plus matchSigma Poisson sigmas, the astrometric verification's test.
std::string chanceProblem(const CrossmatchResult& m, double sigma) {
    if (!(sigma > 0.0) || !(m.chanceMatches > 0.0)) return {};
    const double need = m.chanceMatches + sigma * std::sqrt(m.chanceMatches);
    if (static_cast<double>(m.nMatched) >= need) return {};
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "matches not significant: %zu matched where %.1f are expected by chance (need %.0f); "
                  "is the reference catalog of this field?",
                  m.nMatched, m.chanceMatches, std::ceil(need));
    return buf;
}

// Standard deviation of the zero point over `rounds` resamples (with replacement) of the kept calibrators,
// each fitted with the final fit's weights 1/(σ² + σ_int²) and colour term held (NaN: under 2 rounds).
// Round r draws from its own SplitMix64 stream (seed, r), so the result does not depend on `threads`.
double bootstrapZpSpread(const Calib& d, const std::vector<char>& keep, const Model& m, double sInt,
                         int rounds, std::uint64_t seed, int threads) {
    std::vector<std::pair<double, double>> wwy; // (w, w y) side by side: one cache line per draw
    for (std::size_t i = 0; i < d.size(); ++i)
        if (keep[i]) {
            const double w = 1.0 / (d.var[i] + sInt * sInt);
            wwy.emplace_back(w, w * (d.y[i] - m.ct * d.c[i]));
        }
    const std::size_t n = wwy.size();
    if (rounds < 2 || n < 2) return kNaN;
    std::vector<double> zp(static_cast<std::size_t>(rounds));
    const FastMod modN(n);
#pragma omp parallel for num_threads(threads)                                                                \
    schedule(static) if (n * static_cast <std::size_t>(rounds) >= 200000)
    for (int r = 0; r < rounds; ++r) {
        // a hashed start per round: the rounds' streams begin far apart in SplitMix64's one cycle
        SplitMix64 start{(seed ^ 0xB0075724Aull) + 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(r + 1)};
        SplitMix64 rng{start.next()};
        double sw = 0.0, swy = 0.0;
        for (std::size_t k = 0; k < n; ++k) {
            const auto& [w, wy] = wwy[rng.below(modN)];
            sw += w;
            swy += wy;
        }
        zp[static_cast<std::size_t>(r)] = swy / sw;
    }
    double s = 0.0, s2 = 0.0;
    for (double v : zp) {
        s += v;
        s2 += v * v;
    }
    const double mean = s / rounds;
    return std::sqrt(std::max(0.0, (s2 - rounds * mean * mean) / (rounds - 1)));
}

} // namespace

double limitingMagnitudeInst(const std::vector<double>& magInst, const std::vector<double>& magInstErr,
                             double snr) {
    const std::size_t n = std::min(magInst.size(), magInstErr.size());
    const double target = std::log10(kMagPerSnr / snr);
    auto fitWindow = [&](double snrLo, double snrHi, double& out) {
        double s0 = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
        for (std::size_t i = 0; i < n; ++i) {
            const double m = magInst[i], e = magInstErr[i];
            if (!std::isfinite(m) || !std::isfinite(e) || !(e > 0.0)) continue;
            const double s = kMagPerSnr / e;
            if (s < snrLo || s > snrHi) continue;
            const double ly = std::log10(e);
            s0 += 1;
            sx += m;
            sy += ly;
            sxx += m * m;
            sxy += m * ly;
        }
        if (s0 < 5) return false;
        const double mx = sx / s0, my = sy / s0;
        const double vxx = sxx / s0 - mx * mx, vxy = sxy / s0 - mx * my;
        if (!(vxx > 0.0)) return false;
        const double slope = vxy / vxx;
        if (!(slope > 0.0)) return false;
        out = mx + (target - my) / slope;
        return std::isfinite(out);
    };
    // Count the stars in the narrow window first (a window with too few points falls back to the wide one).
    std::size_t narrow = 0;
    for (std::size_t i = 0; i < n; ++i) {
        const double e = magInstErr[i];
        if (std::isfinite(magInst[i]) && std::isfinite(e) && e > 0.0) {
            const double s = kMagPerSnr / e;
            narrow += s >= 3.0 && s <= 30.0;
        }
    }
    double out = kNaN;
    if (narrow >= 10 && fitWindow(3.0, 30.0, out)) return out;
    if (fitWindow(2.0, 100.0, out)) return out;
    return kNaN;
}

namespace {

// The fitter's arguments must describe the same sources: one magnitude, error and (optional) flag per match.
void checkInputSizes(const std::vector<double>& magInst, const std::vector<double>& magInstErr,
                     const std::vector<std::uint32_t>& flags, const CrossmatchResult& matches,
                     double sharedMagErr) {
    if (!(sharedMagErr >= 0.0) || !std::isfinite(sharedMagErr))
        throw InvalidInput("zeropoint: the shared magnitude error must be finite and >= 0");
    const std::size_t n = matches.refIndex.size();
    if (magInst.size() != n || magInstErr.size() != n || (!flags.empty() && flags.size() != n))
        throw InvalidInput("zeropoint: " + std::to_string(n) + " matches but " +
                           std::to_string(magInst.size()) + " magnitudes, " +
                           std::to_string(magInstErr.size()) + " errors and " + std::to_string(flags.size()) +
                           " flags");
}

// A source's flags (0 when the caller passed none).
std::uint32_t flagOf(const std::vector<std::uint32_t>& flags, std::size_t i) {
    return flags.empty() ? 0u : flags[i];
}

// The matched sources that pass the S/N, flag, magnitude-range and colour cuts: their source indices go to
// sourceIndex, their reference rows are returned (same order). Throws for a row outside the catalog.
std::vector<std::int32_t> selectCandidates(const std::vector<double>& magInst,
                                           const std::vector<double>& magInstErr,
                                           const std::vector<std::uint32_t>& flags,
                                           const CrossmatchResult& matches, const ReferenceCatalog& ref,
                                           const ZeroPointParams& params, bool colour,
                                           std::vector<std::int32_t>& sourceIndex) {
    std::vector<std::int32_t> rows;
    rows.reserve(std::min(matches.nMatched, matches.refIndex.size()));
    sourceIndex.reserve(sourceIndex.size() + rows.capacity());
    for (std::size_t i = 0; i < matches.refIndex.size(); ++i) {
        const std::int32_t r = matches.refIndex[i];
        if (r < 0) continue;
        if (static_cast<std::size_t>(r) >= ref.size())
            throw InvalidInput("zeropoint: reference index " + std::to_string(r) + " outside the catalog " +
                               ref.path + " (" + std::to_string(ref.size()) + " rows)");
        const double m = magInst[i], e = magInstErr[i], rm = ref.mag[r];
        if (!std::isfinite(m) || !std::isfinite(e) || !(e > 0.0) || !std::isfinite(rm)) continue;
        if (kMagPerSnr / e < params.minSnr) continue;
        if (flagOf(flags, i) & params.excludeFlags) continue;
        if (rm < params.magBright || rm > params.magFaint) continue;
        if (colour && !(r < static_cast<std::int32_t>(ref.color.size()) && std::isfinite(ref.color[r])))
            continue;
        sourceIndex.push_back(static_cast<std::int32_t>(i));
        rows.push_back(r);
    }
    return rows;
}

// Each source's magnitude error as it would be at the flux its reference magnitude predicts (the flux's
// error over the predicted flux; ZeroPointParams::predictedSnr says why), through the median of ref.mag -
// magInst over the matched sources of measured S/N >= minSnr (over all matched ones when none has it).
// Unmatched sources keep their measured error.
std::vector<double> predictedMagErrors(const std::vector<double>& magInst,
                                       const std::vector<double>& magInstErr, const CrossmatchResult& matches,
                                       const ReferenceCatalog& ref, double minSnr, int threads) {
    // (source, reference row) of the matched sources with a finite reference magnitude and a usable error
    std::vector<std::pair<std::size_t, std::int32_t>> usable;
    std::vector<double> bright, all; // ref.mag - magInst of those (bright: measured S/N >= minSnr)
    const std::size_t nm = std::min(matches.nMatched, matches.refIndex.size());
    usable.reserve(nm);
    all.reserve(nm);
    bright.reserve(nm);
    for (std::size_t i = 0; i < matches.refIndex.size(); ++i) {
        const std::int32_t r = matches.refIndex[i];
        if (r < 0 || static_cast<std::size_t>(r) >= ref.size() || !std::isfinite(ref.mag[r]) ||
            !std::isfinite(magInst[i]) || !std::isfinite(magInstErr[i]) || !(magInstErr[i] > 0.0))
            continue;
        usable.emplace_back(i, r);
        all.push_back(ref.mag[r] - magInst[i]);
        if (kMagPerSnr / magInstErr[i] >= minSnr) bright.push_back(all.back());
    }
    std::vector<double> err = magInstErr;
    if (all.empty()) return err;
    const double zp0 = robustMedian(bright.empty() ? all : bright);
    const auto nu = static_cast<std::ptrdiff_t>(usable.size());
#pragma omp parallel for num_threads(threads) schedule(static) if (nu >= 20000)
    for (std::ptrdiff_t u = 0; u < nu; ++u) {
        const auto [i, r] = usable[static_cast<std::size_t>(u)];
        // measured flux / predicted flux, bounded: a mismatch or a variable must not get a huge weight
        const double ratio =
            std::clamp(std::pow(10.0, -0.4 * (magInst[i] - (ref.mag[r] - zp0))), 1.0 / 3, 3.0);
        err[i] = magInstErr[i] * ratio;
    }
    return err;
}

// Drops the candidates whose source is crowded (crowdedMatches, per source), compacting rows and
// sourceIndex in place.
void dropCrowded(const std::vector<char>& crowded, std::vector<std::int32_t>& rows,
                 std::vector<std::int32_t>& sourceIndex) {
    std::size_t k = 0;
    for (std::size_t c = 0; c < rows.size(); ++c)
        if (!crowded[static_cast<std::size_t>(sourceIndex[c])]) {
            rows[k] = rows[c];
            sourceIndex[k] = sourceIndex[c];
            ++k;
        }
    rows.resize(k);
    sourceIndex.resize(k);
}

// The fit's data per candidate: y = ref.mag - mag_inst, its variance (both errors) and colour (0 without a
// colour term).
Calib calibratorData(const std::vector<double>& magInst, const std::vector<double>& magInstErr,
                     const ReferenceCatalog& ref, const std::vector<std::int32_t>& rows,
                     const std::vector<std::int32_t>& sourceIndex, bool colour) {
    const std::size_t nc = rows.size();
    Calib d;
    d.y.resize(nc);
    d.var.resize(nc);
    d.c.assign(nc, 0.0);
    for (std::size_t k = 0; k < nc; ++k) {
        const std::size_t i = static_cast<std::size_t>(sourceIndex[k]);
        const std::int32_t r = rows[k];
        const double re = r < static_cast<std::int32_t>(ref.magErr.size()) && std::isfinite(ref.magErr[r])
                              ? ref.magErr[r]
                              : 0.0;
        d.y[k] = ref.mag[r] - magInst[i];
        d.var[k] = magInstErr[i] * magInstErr[i] + re * re;
        if (colour) d.c[k] = ref.color[r];
    }
    return d;
}

// Limiting magnitude (instrumental) from all unflagged sources, else all sources.
double limitingMagInstOf(const std::vector<double>& magInst, const std::vector<double>& magInstErr,
                         const std::vector<std::uint32_t>& flags, std::uint32_t excludeFlags) {
    std::vector<double> m, e;
    for (std::size_t i = 0; i < magInst.size(); ++i)
        if (!(flagOf(flags, i) & excludeFlags)) {
            m.push_back(magInst[i]);
            e.push_back(magInstErr[i]);
        }
    double lim = limitingMagnitudeInst(m, e);
    if (!std::isfinite(lim)) lim = limitingMagnitudeInst(magInst, magInstErr);
    return lim;
}

// Marks res as a refusal with the reason (plus the colour note) and no calibrator in use; returns it.
ZeroPointResult& refuse(ZeroPointResult& res, const std::string& why, const std::string& note,
                        std::size_t nc) {
    res.ok = false;
    res.message = why + note;
    res.residual.assign(nc, kNaN);
    res.used.assign(nc, false);
    return res;
}

// The calibrators kept by outlier rejection and the weighted fit on them.
struct KeptFit {
    std::vector<char> keep;
    int nKeep = 0;
    WeightedFit f;
};

// Rejects outliers with the configured method, then fits the kept calibrators; returns why that failed
// (empty: it did not).
std::string rejectAndFit(const Calib& d, bool colour, const ZeroPointParams& params, KeptFit& kept) {
    kept.keep = params.method == "ransac" ? ransac(d, colour, params) : clippedMean(d, colour, params);
    kept.nKeep = 0;
    for (char k : kept.keep)
        kept.nKeep += k != 0;
    if (kept.nKeep < params.minStars)
        return "too few calibrators after outlier rejection: " + std::to_string(kept.nKeep) + " of " +
               std::to_string(d.size()) + " kept, minStars = " + std::to_string(params.minStars);
    kept.f = fitWithIntrinsic(d, kept.keep, colour);
    if (!kept.f.model.ok) return "zero-point fit failed (singular normal equations)";
    return {};
}

// Whether a fitted colour term is below the required significance (then it is dropped).
bool colourTermInsignificant(const Model& m, const ZeroPointParams& params) {
    return params.colourTermMinSignificance > 0.0 &&
           !(std::fabs(m.ct) >= params.colourTermMinSignificance * m.ctErr);
}

// The zero point and its errors: the formal one, the bootstrap spread, their max, and the shared error
// added in quadrature.
void setZeroPointErrors(ZeroPointResult& res, const Calib& d, const KeptFit& kept,
                        const ZeroPointParams& params, double sharedMagErr, int threads) {
    const WeightedFit& f = kept.f;
    res.zp = f.model.zp;
    res.zpErrFormal = f.model.zpErr;
    res.zpErrBootstrap =
        bootstrapZpSpread(d, kept.keep, f.model, f.sInt, params.bootstrap, params.seed, threads);
    res.zpErr =
        std::isfinite(res.zpErrBootstrap) ? std::max(res.zpErrFormal, res.zpErrBootstrap) : res.zpErrFormal;
    res.zpErrShared = sharedMagErr;
    res.zpErr = std::hypot(res.zpErr, sharedMagErr);
}

// The refusal text for a zero point whose error exceeds maxZpErr.
std::string zpErrTooLarge(const ZeroPointResult& res, int nKeep, double sharedMagErr, double maxZpErr) {
    char why[200];
    std::snprintf(
        why, sizeof why,
        "zero point %.4f +- %.4f from %d calibrators (shared error %.4f): error above maxZpErr %.4g", res.zp,
        res.zpErr, nKeep, sharedMagErr, maxZpErr);
    return why;
}

// The accepted fit's outputs: colour term, scatter terms, per-candidate residuals and use, the weighted RMS
// of the used residuals and the calibrated limiting magnitude (at the used calibrators' median colour).
void fillFitResult(ZeroPointResult& res, const Calib& d, const KeptFit& kept, bool colour) {
    const WeightedFit& f = kept.f;
    const std::size_t nc = d.size();
    res.colourTermFitted = colour;
    res.colourTerm = colour ? f.model.ct : 0.0;
    res.colourTermErr = colour ? f.model.ctErr : kNaN;
    res.intrinsicScatter = f.sInt;
    res.chi2dof = f.chi2dof;
    res.nUsed = kept.nKeep;
    res.residual.resize(nc);
    res.used.resize(nc);
    double sw = 0.0, swr2 = 0.0;
    std::vector<double> usedColours;
    for (std::size_t k = 0; k < nc; ++k) {
        res.residual[k] = residualOf(d, f.model, k);
        res.used[k] = kept.keep[k] != 0;
        if (!kept.keep[k]) continue;
        const double w = 1.0 / (d.var[k] + f.sInt * f.sInt);
        sw += w;
        swr2 += w * res.residual[k] * res.residual[k];
        usedColours.push_back(d.c[k]);
    }
    res.scatter = std::sqrt(swr2 / sw);
    res.limitingMag =
        res.limitingMagInst + res.zp + (colour ? res.colourTerm * robustMedian(usedColours) : 0.0);
}

} // namespace

ZeroPointResult fitZeroPoint(const std::vector<double>& magInst, const std::vector<double>& magInstErr,
                             const std::vector<std::uint32_t>& flags, const CrossmatchResult& matches,
                             const ReferenceCatalog& ref, const ZeroPointParams& params, RunContext& ctx,
                             double sharedMagErr, const std::vector<char>* crowded) {
    validate(params);
    checkInputSizes(magInst, magInstErr, flags, matches, sharedMagErr);
    ZeroPointResult res;
    res.chanceMatches = matches.chanceMatches;

    // --- candidates ----------------------------------------------------------------------------------
    const bool haveColour =
        std::any_of(ref.color.begin(), ref.color.end(), [](double c) { return std::isfinite(c); });
    bool colour = params.fitColourTerm && haveColour;
    const std::vector<double> fitErr =
        params.predictedSnr
            ? predictedMagErrors(magInst, magInstErr, matches, ref, params.minSnr, ctx.threadCount())
            : magInstErr;
    std::vector<std::int32_t> rows =
        selectCandidates(magInst, fitErr, flags, matches, ref, params, colour, res.sourceIndex);
    if (params.isolationArcsec > 0.0) res.isolationArcsec = params.isolationArcsec;
    if (params.isolationArcsec > 0.0 && !rows.empty()) {
        if (crowded && crowded->size() == magInst.size()) {
            dropCrowded(*crowded, rows, res.sourceIndex);
        } else {
            dropCrowded(crowdedMatches(matches, ref, params.isolationArcsec, params.isolationDeltaMag,
                                       ctx.threadCount()),
                        rows, res.sourceIndex);
        }
    }
    ctx.checkCancelled();

    const std::size_t nc = rows.size();
    res.nCandidates = static_cast<int>(nc);
    std::string note;
    if (params.fitColourTerm && !haveColour) note = "; no reference colours: colour term not fitted";
    if (colour && static_cast<int>(nc) < std::max(params.minStars, 3)) colour = false;
    const Calib d = calibratorData(magInst, fitErr, ref, rows, res.sourceIndex, colour);
    res.limitingMagInst = limitingMagInstOf(magInst, magInstErr, flags, params.excludeFlags);

    // --- refusals and the fit ------------------------------------------------------------------------
    if (const std::string why = chanceProblem(matches, params.matchSigma); !why.empty())
        return refuse(res, why, note, nc);
    if (static_cast<int>(nc) < params.minStars)
        return refuse(res,
                      "too few calibrators: " + std::to_string(nc) + " passed the cuts (of " +
                          std::to_string(matches.nMatched) +
                          " matched sources), minStars = " + std::to_string(params.minStars),
                      note, nc);
    KeptFit kept;
    if (const std::string why = rejectAndFit(d, colour, params, kept); !why.empty())
        return refuse(res, why, note, nc);
    std::string colourNote;
    if (colour && colourTermInsignificant(kept.f.model, params)) {
        // Not significant: the zero point alone, from the same candidates (outlier rejection redone).
        char buf[160];
        std::snprintf(buf, sizeof buf, "; colour term %.4f +- %.4f not significant (< %g sigma): not applied",
                      kept.f.model.ct, kept.f.model.ctErr, params.colourTermMinSignificance);
        colourNote = buf;
        colour = false;
        if (const std::string why = rejectAndFit(d, false, params, kept); !why.empty())
            return refuse(res, why, note, nc);
    }

    setZeroPointErrors(res, d, kept, params, sharedMagErr, ctx.threadCount());
    if (params.maxZpErr > 0.0 && !(res.zpErr <= params.maxZpErr)) {
        refuse(res, zpErrTooLarge(res, kept.nKeep, sharedMagErr, params.maxZpErr), note, nc);
        res.zp = kNaN;
        return res;
    }
    fillFitResult(res, d, kept, colour);
    res.ok = true;
    char buf[160];
    std::snprintf(buf, sizeof buf, "%d of %d calibrators (%s), scatter %.4f mag", kept.nKeep,
                  static_cast<int>(nc), params.method.c_str(), res.scatter);
    res.message = buf + note + colourNote;
    if (params.fitColourTerm && haveColour && !colour && colourNote.empty())
        res.message += "; too few coloured calibrators: no colour term";
    ctx.report("zeropoint", 1.0);
    return res;
}

std::vector<char> crowdedMatches(const CrossmatchResult& matches, const ReferenceCatalog& ref,
                                 double radiusArcsec, double deltaMag, int threads) {
    const std::size_t n = matches.refIndex.size();
    std::vector<std::int32_t> rows, sources;
    rows.reserve(std::min(matches.nMatched, n));
    sources.reserve(std::min(matches.nMatched, n));
    for (std::size_t i = 0; i < n; ++i) {
        const std::int32_t r = matches.refIndex[i];
        if (r < 0 || static_cast<std::size_t>(r) >= ref.size()) continue;
        rows.push_back(r);
        sources.push_back(static_cast<std::int32_t>(i));
    }
    std::vector<char> bySource(n, 0);
    const std::vector<char> crowded = crowdedInReference(ref, rows, radiusArcsec, deltaMag, threads);
    for (std::size_t k = 0; k < rows.size(); ++k)
        bySource[static_cast<std::size_t>(sources[k])] = crowded[k];
    return bySource;
}

void fitZeroPointMap(ZeroPointResult& zp, const std::vector<double>& x, const std::vector<double>& y,
                     int width, int height, int cells) {
    if (!zp.ok || width <= 0 || height <= 0 || cells < 1) return;
    std::vector<double> px, py, pr;
    for (std::size_t k = 0; k < zp.sourceIndex.size() && k < zp.used.size() && k < zp.residual.size(); ++k) {
        const auto i = static_cast<std::size_t>(zp.sourceIndex[k]);
        if (!zp.used[k] || i >= x.size() || i >= y.size() || !std::isfinite(x[i]) || !std::isfinite(y[i]) ||
            !std::isfinite(zp.residual[k]))
            continue;
        px.push_back((x[i] - 0.5 * (width - 1)) / 1000.0);
        py.push_back((y[i] - 0.5 * (height - 1)) / 1000.0);
        pr.push_back(zp.residual[k]);
    }
    const std::size_t m = pr.size();
    if (m >= 20) {
        // residual = a + b x + c y by least squares; errors from the residuals' own scatter
        Eigen::Matrix3d A = Eigen::Matrix3d::Zero();
        Eigen::Vector3d rhs = Eigen::Vector3d::Zero();
        for (std::size_t k = 0; k < m; ++k) {
            const Eigen::Vector3d v(1.0, px[k], py[k]);
            A += v * v.transpose();
            rhs += v * pr[k];
        }
        const Eigen::FullPivLU<Eigen::Matrix3d> lu(A);
        if (lu.isInvertible()) {
            const Eigen::Vector3d c = lu.solve(rhs);
            double ss = 0.0;
            for (std::size_t k = 0; k < m; ++k) {
                const double e = pr[k] - (c[0] + c[1] * px[k] + c[2] * py[k]);
                ss += e * e;
            }
            const Eigen::Matrix3d cov = lu.inverse() * (ss / static_cast<double>(m - 3));
            zp.gradientX = c[1];
            zp.gradientY = c[2];
            zp.gradientXErr = std::sqrt(cov(1, 1));
            zp.gradientYErr = std::sqrt(cov(2, 2));
        }
    }
    if (m < 25u * static_cast<std::size_t>(cells) * static_cast<std::size_t>(cells)) return;
    std::vector<std::vector<double>> cell(static_cast<std::size_t>(cells) * cells);
    for (std::size_t k = 0; k < m; ++k) {
        const double fx = (px[k] * 1000.0 + 0.5 * (width - 1)) / width;
        const double fy = (py[k] * 1000.0 + 0.5 * (height - 1)) / height;
        const int cx = std::clamp(static_cast<int>(fx * cells), 0, cells - 1);
        const int cy = std::clamp(static_cast<int>(fy * cells), 0, cells - 1);
        cell[static_cast<std::size_t>(cy) * cells + cx].push_back(pr[k]);
    }
    zp.mapNx = zp.mapNy = cells;
    zp.map.clear();
    for (auto& c : cell)
        zp.map.push_back(c.size() >= 5 ? robustMedian(c) : kNaN);
}

} // namespace gpuphot
