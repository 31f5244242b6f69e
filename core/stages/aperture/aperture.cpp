#include "core/stages/aperture/aperture.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numbers>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <omp.h>

#include "core/model/flags.hpp"
#include "core/model/segmentation_map.hpp"
#include "core/model/sources.hpp"
#include "core/pipeline/cuda_stages.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/aperture/aperture_internal.hpp"
#include "core/stages/aperture/aperture_overlap.hpp"
#include "core/stages/background/background.hpp"
#include "core/util/errors.hpp"
#include "core/util/parallel.hpp"
#include "core/util/robust_stats.hpp"

namespace gpuphot {

namespace {

using detail::ApertureFlagDistances;
using detail::ApertureSky;
using detail::ApertureSums;
using detail::CircleJob;
using detail::KronJob;
using detail::KronOut;
using detail::SkyEstimate;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// A kept buffer (detail::ApertureScratch) sized to m. When it must grow, it gets half as much room again:
// the workbench's re-runs at a lower threshold find a few more sources each time, and a buffer that grows
// by reallocation copies and touches all of it again inside the re-run (measured: the first
// re-run at 66k sources after a run at 59k paid 8.6 ms in pass 1's sizing and 5 ms more in pass 3). The
// room is only reserved: pages are touched when the buffer is resized into it.
template <class V> void resizeKept(V& v, std::size_t m) {
    if (v.capacity() < m) v.reserve(m + m / 2);
    v.resize(m);
}
constexpr double kFwhmToSigma = 1.0 / 2.3548200450309493; // 1 / (2 sqrt(2 ln 2))
// The driver's light per-source loops run on several threads from this many sources (a parallel region
// costs more than such a loop below it, and much more on a loaded machine).
constexpr std::size_t kParallelSources = 8192;
// The optimal-radius search costs ~0.3 us a source (a predicted S/N at every grid radius): worth several
// threads from this many sources, so that smaller batches (a last one, a tuned size) are searched in
// parallel too.
constexpr std::size_t kParallelSearches = 1024;

struct Scratch {
    std::vector<ApertureSums> partial, full;
    std::vector<double> radii2;
    std::vector<float> skyValues;
    std::vector<std::uint32_t> keys, keysTmp;
    std::vector<double> prefix1, prefix2;
};

// Ascending sort of finite floats: LSD radix sort on order-preserving integer keys (4 passes of 8 bits,
// passes where all keys share the digit skipped). Several times faster than a comparison sort for the
// few hundred values of a sky annulus; the order of equal values is irrelevant (they are equal).
void sortFloats(std::vector<float>& v, Scratch& sc) {
    const std::size_t n = v.size();
    if (n == 0) return;
    sc.keys.resize(n);
    sc.keysTmp.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
        std::uint32_t u;
        std::memcpy(&u, &v[i], sizeof u);
        sc.keys[i] = detail::floatKey(u);
    }
    std::uint32_t* src = sc.keys.data();
    std::uint32_t* dst = sc.keysTmp.data();
    for (int shift = 0; shift < 32; shift += 8) {
        std::size_t count[257] = {};
        for (std::size_t i = 0; i < n; ++i)
            ++count[((src[i] >> shift) & 0xFFu) + 1];
        if (count[((src[0] >> shift) & 0xFFu) + 1] == n) continue;
        for (int d = 0; d < 256; ++d)
            count[d + 1] += count[d];
        for (std::size_t i = 0; i < n; ++i)
            dst[count[(src[i] >> shift) & 0xFFu]++] = src[i];
        std::swap(src, dst);
    }
    for (std::size_t i = 0; i < n; ++i) {
        const std::uint32_t u = detail::keyBits(src[i]);
        std::memcpy(&v[i], &u, sizeof u);
    }
}

// The CPU engine: OpenMP over the jobs of a batch, the loops of aperture_internal.hpp per job.
class CpuEngine final : public detail::ApertureEngine {
public:
    explicit CpuEngine(const RunContext& ctx) : m_threads(ctx.threadCount()) {
        // tuning aperture.batch (tests): other batch sizes, e.g. batches large enough for the driver's
        // parallel loops
        if (ctx.tuning.aperture.batch > 0) m_batch = ctx.tuning.aperture.batch;
        m_chainTest = ctx.testHooks.apertureCpuChain;
    }
    std::size_t batchSize() const override { return m_batch; }
    // testHooks.apertureCpuChain: the calls that the CUDA engine makes of its own made here the
    // same way (pass 1's circles and Kron with each job's sky from the last localSkies call's estimate by
    // skyOfEstimate; pass 3's index, optimalRadiusKernel's search, and circles in one call) and the sources'
    // own order, so that core's tests cover the driver's paths that only such an engine takes.
    bool spatialOrder() const override { return !m_chainTest; }
    bool chainPass1(int /*skyTicket*/, const detail::SkyJobRule& rule, const CircleJob* jobs, std::size_t n,
                    const double* radii, std::size_t nr, ApertureSums* out, ApertureFlagDistances* fd,
                    const KronJob* kronJobs, const detail::KronParamsHD& kp, KronOut* kronOut,
                    int& circleTicket, int& kronTicket) override {
        if (!m_chainTest || n != m_skyN) return false;
        std::vector<CircleJob> cj(jobs, jobs + n);
        std::vector<KronJob> kj(kronJobs, kronJobs + n);
        for (std::size_t k = 0; k < n; ++k)
            cj[k].sky = kj[k].sky = detail::skyOfEstimate(m_skies[k], rule);
        sumCircles(cj.data(), n, radii, nr, 0, out, fd);
        kron(kj.data(), n, kp, kronOut);
        circleTicket = 0;
        kronTicket = 1; // (done already; a ticket makes the driver defer its Kron columns, as with the GPU)
        return true;
    }
    bool optimalCircles(const detail::OptimalJob* jobs, std::size_t n, const detail::OptimalGrid& g,
                        const double* gridRadius, const std::size_t* slot, const CircleJob* circles,
                        std::size_t m, std::int32_t* index, ApertureSums* out,
                        ApertureFlagDistances* fd) override {
        if (!m_chainTest) return false;
        forEach(n, [&](std::size_t c, Scratch&) {
            const detail::OptimalJob& j = jobs[c];
            index[c] =
                static_cast<std::int32_t>(detail::optimalGridIndex(g.frac, g.num, g.n, [&](std::size_t k) {
                    return detail::optimalVariance(g.poisson, j.F, g.frac[k], g.gain, g.area[k], j.var,
                                                   g.kappaArea[k], j.nSky);
                }));
        });
        std::vector<double> r(m);
        for (std::size_t c = 0; c < n; ++c)
            if (slot[c + 1] > slot[c]) r[slot[c]] = gridRadius[index[c]];
        sumCircles(circles, m, r.data(), 1, 1, out, fd);
        return true;
    }
    void begin(const ImageView& image, const MaskView& mask, const ImageViewT<std::int32_t>& seg,
               const ImageView& level, const ImageView& rms, double saturation,
               NeighbourPixels neighbours) override {
        m_in = detail::AperturePlanes{};
        m_in.image = image.data;
        m_in.imageStride = image.stride;
        if (!mask.empty()) {
            m_in.mask = mask.data;
            m_in.maskStride = mask.stride;
        }
        if (!seg.empty()) {
            m_in.seg = seg.data;
            m_in.segStride = seg.stride;
        }
        if (!level.empty() && !rms.empty()) {
            m_in.level = level.data;
            m_in.rms = rms.data;
            m_in.mapStride = level.stride;
        }
        m_in.width = image.width;
        m_in.height = image.height;
        m_in.saturation = saturation;
        m_in.neighbours = neighbours;
    }
    bool setMapSampler(const BackgroundSampler* sampler) override {
        m_in.sampler = sampler;
        return true;
    }
    void localSkies(const double* cx, const double* cy, std::size_t n, double rin, double rout,
                    const detail::SkyParamsHD& p, SkyEstimate* out) override {
        forEach(n, [&](std::size_t i, Scratch& sc) {
            std::vector<float>& buf = sc.skyValues;
            buf.clear();
            detail::forAnnulus(m_in, cx[i], cy[i], rin, rout, [&](float v) { buf.push_back(v); });
            if (static_cast<int>(buf.size()) >= std::max(2, p.minPixels)) {
                sortFloats(buf, sc);
                sc.prefix1.resize(buf.size() + 1);
                sc.prefix2.resize(buf.size() + 1);
            }
            out[i] = detail::skyStatistics(buf.data(), buf.size(), p, sc.prefix1.data(), sc.prefix2.data());
        });
        m_skies = out;
        m_skyN = n;
    }
    void sumCircles(const CircleJob* jobs, std::size_t n, const double* radii, std::size_t nr,
                    std::size_t radiiStride, ApertureSums* out, ApertureFlagDistances* fd) override {
        forEach(n, [&](std::size_t i, Scratch& sc) {
            const double* r = radii + i * radiiStride;
            sc.partial.resize(nr);
            sc.full.resize(nr);
            sc.radii2.resize(nr);
            for (std::size_t k = 0; k < nr; ++k)
                sc.radii2[k] = r[k] * r[k];
            const CircleJob& j = jobs[i];
            detail::circleSumsAll(m_in, j.sky, j.cx, j.cy, j.ownId, r, sc.radii2.data(), nr,
                                  sc.partial.data(), sc.full.data(), out + i * nr, fd[i]);
        });
    }
    void kron(const KronJob* jobs, std::size_t n, const detail::KronParamsHD& p, KronOut* out) override {
        forEach(n, [&](std::size_t i, Scratch&) { out[i] = detail::kronAperture(m_in, jobs[i], p); });
    }

private:
    template <class F> void forEach(std::size_t n, F&& body) {
        const std::ptrdiff_t m = static_cast<std::ptrdiff_t>(n);
        ParallelErrors errors;
#pragma omp parallel num_threads(m_threads)
        {
            Scratch sc;
#pragma omp for schedule(dynamic, 16)
            for (std::ptrdiff_t i = 0; i < m; ++i)
                errors.run([&] { body(static_cast<std::size_t>(i), sc); });
        }
        errors.rethrow();
    }
    int m_threads = 1;
    // Batches of 16384 sources: the driver's light per-source loops (from 8192) run on every thread, and the
    // engine loops' ends (barriers) come a quarter as often as with 4096 (docs/BENCHMARKS.md).
    std::size_t m_batch = 16384;
    detail::AperturePlanes m_in;
    bool m_chainTest = false;             // testHooks.apertureCpuChain
    const SkyEstimate* m_skies = nullptr; // the last localSkies call's estimates (chainPass1)
    std::size_t m_skyN = 0;
};

// Variance of the truncated unit normal |z| <= k.
double truncatedVariance(double k) {
    const double phi = std::exp(-0.5 * k * k) / std::sqrt(2.0 * std::numbers::pi);
    const double mass = std::erf(k / std::numbers::sqrt2);
    return 1.0 - 2.0 * k * phi / mass;
}

// Iterated clipping at k times the clipped standard deviation converges to a fixed point where the
// kept standard deviation is s·σ with s = sqrt(truncatedVariance(k s)); dividing by s restores σ.
double clipRmsCorrection(double k) {
    if (!(k > 0.0)) return 1.0;
    double s = 1.0;
    for (int i = 0; i < 50; ++i)
        s = std::sqrt(std::max(1e-6, truncatedVariance(k * s)));
    return s;
}

double skyMeanFactor(SkyEstimator e) {
    switch (e) {
    case SkyEstimator::Mean:
        return 1.0;
    case SkyEstimator::Median:
        return std::numbers::pi / 2.0;
    case SkyEstimator::Mode:
        return 6.25 * std::numbers::pi / 2.0 + 2.25 - 7.5;
    }
    return 1.0;
}

double fluxVariance(const ApertureSums& s, double gain, double skyMeanVar) {
    double v = s.varSky + s.area * s.area * skyMeanVar;
    if (gain > 0.0) v += std::max(0.0, s.poisson) / gain;
    return v;
}

// Linear interpolation in an ascending table.
double interpolate(const std::vector<double>& xs, const std::vector<double>& ys, double x) {
    if (xs.empty()) return kNaN;
    if (x <= xs.front()) return ys.front();
    if (x >= xs.back()) return ys.back();
    const std::size_t k = static_cast<std::size_t>(std::upper_bound(xs.begin(), xs.end(), x) - xs.begin());
    const double t = (x - xs[k - 1]) / (xs[k] - xs[k - 1]);
    return ys[k - 1] + t * (ys[k] - ys[k - 1]);
}

template <class T> T columnOr(const std::vector<T>& v, std::size_t i, T fallback) {
    return i < v.size() ? v[i] : fallback;
}

// The order of pass 1: bands of 64 rows, then x, sources with a non-finite centre last, ties by index (the
// stable sort by (floor(y / 64), x)): a counting sort by band, then each band sorted by (x, index) on
// several threads; the stable sort itself when the bands span an unusual range.
std::vector<std::size_t> spatialOrder(const std::vector<double>& xs, const std::vector<double>& ys,
                                      int threads) {
    const std::size_t n = xs.size();
    std::vector<std::size_t> order(n);
    std::vector<double> band(n), kx(n);
    double lo = kInf, hi = -kInf;
    for (std::size_t i = 0; i < n; ++i) {
        const bool ok = std::isfinite(xs[i]) && std::isfinite(ys[i]);
        band[i] = ok ? std::floor(ys[i] / 64.0) : kInf;
        kx[i] = ok ? xs[i] : kInf;
        if (ok) {
            lo = std::min(lo, band[i]);
            hi = std::max(hi, band[i]);
        }
    }
    auto byX = [&](std::size_t a, std::size_t b) { return kx[a] < kx[b] || (!(kx[b] < kx[a]) && a < b); };
    if (lo > hi) { // no finite centre
        std::iota(order.begin(), order.end(), std::size_t{0});
        return order;
    }
    if (!(hi - lo <= 4.0 * static_cast<double>(n) + 65536.0)) {
        std::iota(order.begin(), order.end(), std::size_t{0});
        std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
            return band[a] < band[b] || (!(band[b] < band[a]) && kx[a] < kx[b]);
        });
        return order;
    }
    const std::size_t nb = static_cast<std::size_t>(hi - lo) + 2; // the last bucket: non-finite centres
    auto bucketOf = [&](std::size_t i) {
        return std::isfinite(band[i]) ? static_cast<std::size_t>(band[i] - lo) : nb - 1;
    };
    std::vector<std::size_t> start(nb + 1, 0);
    for (std::size_t i = 0; i < n; ++i)
        ++start[bucketOf(i) + 1];
    for (std::size_t b = 0; b < nb; ++b)
        start[b + 1] += start[b];
    std::vector<std::size_t> pos(start.begin(), start.end() - 1);
    for (std::size_t i = 0; i < n; ++i)
        order[pos[bucketOf(i)]++] = i;
    const std::ptrdiff_t nbands = static_cast<std::ptrdiff_t>(nb - 1);
#pragma omp parallel for num_threads(threads) schedule(dynamic, 8) if (n >= kParallelSources)
    for (std::ptrdiff_t b = 0; b < nbands; ++b)
        std::sort(order.begin() + static_cast<std::ptrdiff_t>(start[b]),
                  order.begin() + static_cast<std::ptrdiff_t>(start[b + 1]), byX);
    return order;
}

void checkPositive(double v, const char* what) {
    if (!(v > 0.0) || !std::isfinite(v))
        throw InvalidInput(std::string("aperture photometry: ") + what +
                           " must be positive and finite (got " + std::to_string(v) + ")");
}

} // namespace

namespace {

constexpr int kRings = 10;       // NeighbourLight's rings: 0.5 FWHM wide, out to 5 FWHM
constexpr int kMinIsolated = 20; // fewer isolated curve-of-growth candidates: the isolation test is not made

// The PSF model's curve of growth at r1, ref, rin, rout, then at the ring edges k * 0.5 FWHM (k = 0 ..
// kRings), from one call (each call renders the model); empty without a usable model.
std::vector<double> modelFractions(const ApertureParams& p, double fwhm, double r1, double ref, double rin,
                                   double rout) {
    if (!p.psfApertureFractions) return {};
    std::vector<double> radii{r1, ref, rin, rout};
    for (int k = 0; k <= kRings; ++k)
        radii.push_back(0.5 * k * fwhm);
    std::vector<double> m = p.psfApertureFractions(radii);
    if (m.size() != radii.size()) return {};
    for (double v : m)
        if (!(v >= 0.0 && v <= 1.0 + 1e-9)) return {};
    return m;
}

// The concentration flux(r1) / flux(ref) that the PSF model predicts for a single star, with the local
// sky's share of the wing light in the annulus [rin, rout] subtracted as the measurement does; NaN
// without a usable model (m: modelFractions).
double modelConcentration(const std::vector<double>& m, double r1, double ref, double rin, double rout) {
    if (m.size() < 4) return kNaN;
    const double wing = rout > rin ? (m[3] - m[2]) / (rout * rout - rin * rin) : 0.0;
    const double g1 = m[0] - r1 * r1 * wing, gref = m[1] - ref * ref * wing;
    return gref > 0.0 ? g1 / gref : kNaN;
}

// The light of detected neighbours inside a source's reference aperture of radius `ref` (ADU): each
// neighbour's total flux (the larger of its isophotal flux and its 1-FWHM aperture's over the PSF's
// fraction there: a faint star's isophote holds only part of its light) times the share of a star of the
// field's PSF, centred at its distance, that falls within the aperture. The PSF is the model's curve of
// growth (psfApertureFractions) taken as rings of 0.5 FWHM out to 5 FWHM, else a Gaussian of the field FWHM;
// a ring of radius rho centred at distance d has acos((ref^2 - d^2 - rho^2) / (2 d rho)) / pi of its length
// inside. Tabulated over d every 0.25 px.
class NeighbourLight {
public:
    // model: modelFractions (its ring edges are used), or empty for a Gaussian of the field FWHM
    NeighbourLight(const Sources& s, const std::vector<double>& flux1, double fwhm, double ref,
                   const std::vector<double>& model)
        : m_s(s), m_reach(ref + 5.0 * fwhm) {
        std::vector<double> edges, ee;
        for (int k = 0; k <= kRings; ++k)
            edges.push_back(0.5 * k * fwhm);
        if (model.size() == 4 + edges.size()) {
            ee.assign(model.begin() + 4, model.end());
        } else {
            const double sigma = fwhm / (2.0 * std::sqrt(2.0 * std::log(2.0)));
            for (double r : edges)
                ee.push_back(1.0 - std::exp(-0.5 * r * r / (sigma * sigma)));
        }
        const double step = m_step;
        for (double d = 0.0; d <= m_reach + step; d += step) {
            double in = 0.0;
            for (std::size_t k = 0; k + 1 < edges.size(); ++k) {
                const double rho = 0.5 * (edges[k] + edges[k + 1]), w = ee[k + 1] - ee[k];
                const double c =
                    d > 0.0 ? (ref * ref - d * d - rho * rho) / (2.0 * d * rho) : (rho <= ref ? 1.0 : -1.0);
                in += w * (c >= 1.0 ? 1.0 : c <= -1.0 ? 0.0 : std::acos(c) / std::numbers::pi);
            }
            m_table.push_back(in);
        }
        const double ee1 = ee[2]; // the PSF's fraction within 1 FWHM
        m_total.resize(s.size());
        for (std::size_t i = 0; i < s.size(); ++i) {
            const double iso = i < s.fluxIso.size() ? s.fluxIso[i] : 0.0;
            const double ap = i < flux1.size() && ee1 > 0.0 ? flux1[i] / ee1 : 0.0;
            m_total[i] = std::max(iso > 0.0 ? iso : 0.0, ap > 0.0 ? ap : 0.0);
        }
        double x0 = kInf, y0 = kInf, x1 = -kInf, y1 = -kInf;
        for (std::size_t i = 0; i < s.size(); ++i)
            if (std::isfinite(s.x[i]) && std::isfinite(s.y[i])) {
                x0 = std::min(x0, s.x[i]), x1 = std::max(x1, s.x[i]);
                y0 = std::min(y0, s.y[i]), y1 = std::max(y1, s.y[i]);
            }
        if (!(x0 <= x1)) return;
        m_x0 = x0, m_y0 = y0;
        // cells of at least the reach, and not many more cells than sources (far-flung centres)
        const double cells = 4.0 * static_cast<double>(s.size()) + 16.0;
        m_cell = std::max(
            {m_reach, std::sqrt((x1 - x0) * (y1 - y0) / cells), (x1 - x0) / cells, (y1 - y0) / cells});
        m_nx = static_cast<int>((x1 - x0) / m_cell) + 1;
        m_ny = static_cast<int>((y1 - y0) / m_cell) + 1;
        m_start.assign(static_cast<std::size_t>(m_nx) * m_ny + 1, 0);
        for (std::size_t i = 0; i < s.size(); ++i)
            if (const long c = cellOf(i); c >= 0) ++m_start[static_cast<std::size_t>(c) + 1];
        for (std::size_t c = 1; c < m_start.size(); ++c)
            m_start[c] += m_start[c - 1];
        m_index.resize(m_start.back());
        std::vector<std::size_t> pos(m_start.begin(), m_start.end() - 1);
        for (std::size_t i = 0; i < s.size(); ++i)
            if (const long c = cellOf(i); c >= 0) m_index[pos[static_cast<std::size_t>(c)]++] = i;
    }

    double operator()(std::size_t i) const {
        if (m_nx == 0 || cellOf(i) < 0) return 0.0;
        const int cx = static_cast<int>((m_s.x[i] - m_x0) / m_cell),
                  cy = static_cast<int>((m_s.y[i] - m_y0) / m_cell);
        double sum = 0.0;
        for (int y = std::max(0, cy - 1); y <= std::min(m_ny - 1, cy + 1); ++y)
            for (int x = std::max(0, cx - 1); x <= std::min(m_nx - 1, cx + 1); ++x) {
                const std::size_t c = static_cast<std::size_t>(y) * m_nx + x;
                for (std::size_t k = m_start[c]; k < m_start[c + 1]; ++k) {
                    const std::size_t j = m_index[k];
                    const double f = m_total[j];
                    if (j == i || !(f > 0.0)) continue;
                    const double d = std::hypot(m_s.x[j] - m_s.x[i], m_s.y[j] - m_s.y[i]) / m_step;
                    const std::size_t t = static_cast<std::size_t>(d);
                    if (t + 1 >= m_table.size()) continue;
                    sum += f * (m_table[t] + (d - t) * (m_table[t + 1] - m_table[t]));
                }
            }
        return sum;
    }

private:
    long cellOf(std::size_t i) const {
        if (i >= m_s.fluxIso.size() || !std::isfinite(m_s.x[i]) || !std::isfinite(m_s.y[i])) return -1;
        return static_cast<long>((m_s.y[i] - m_y0) / m_cell) * m_nx +
               static_cast<long>((m_s.x[i] - m_x0) / m_cell);
    }
    const Sources& m_s;
    double m_reach, m_cell = 0.0, m_step = 0.25, m_x0 = 0.0, m_y0 = 0.0;
    int m_nx = 0, m_ny = 0;
    std::vector<double> m_table, m_total;
    std::vector<std::size_t> m_start, m_index;
};

// S/N by which curve-of-growth stars are ranked: of z = f1 + k (fRef - f1), k chosen so that
// z's noise is uncorrelated with the concentration f1 / fRef. Ranking by fRef's S/N would prefer, among
// stars of one brightness, those whose wing noise came out high, and bias the measured fractions low
// (by 0.2-0.3 % at 1 FWHM on sky-limited fields); ranking by f1's would bias them high. The core f1 and
// the wing fRef - f1 have independent noise (e1^2 and eRef^2 - e1^2).
// Variances of a star's core flux(r1) (e1^2) and of its wing flux(ref) - flux(r1) (eRef^2 - e1^2): the two
// have independent noise.
struct CoreWingVariance {
    double core, wing;
};
CoreWingVariance coreWingVariance(double e1, double eRef) {
    const double v1 = e1 * e1;
    return {v1, std::max(0.0, eRef * eRef - v1)};
}

double concentrationNeutralSnr(double f1, double e1, double fRef, double eRef) {
    const auto [v1, vw] = coreWingVariance(e1, eRef);
    const double w = fRef - f1;
    const double k = (f1 > 0.0 && vw > 0.0 && w > 0.0) ? std::min(1.0, w * v1 / (f1 * vw)) : 0.0;
    const double z = f1 + k * w, vz = v1 + k * k * vw;
    return vz > 0.0 ? z / std::sqrt(vz) : 0.0;
}

// The stars whose curve of growth corrects the apertures: unflagged, S/N >= apCorrMinSnr in the reference
// aperture, isolated (neighbours' light in the reference aperture at most apCorrIsolation of the star's),
// and single. A blend of two stars closer than the deblending resolves is the brightest object
// of a crowded field and is less concentrated than one star, so with a PSF model each candidate's
// concentration must agree with the model's within apCorrClip times its own noise (plus 1 % for the
// model): that test runs over the whole pool before the brightest apCorrMaxStars are kept. Without a
// model, or when fewer than apCorrMinStars agree with it (a model that does not fit the stars), the
// brightest apCorrMaxStars are clipped about their median concentration. With fewer than kMinIsolated
// (or apCorrMinStars) isolated candidates (a small field) all candidates go on. Ascending indices.
std::vector<std::size_t> curveOfGrowthStars(const std::vector<std::size_t>& pre,
                                            const std::vector<double>& flux1, const std::vector<double>& err1,
                                            const std::vector<double>& fluxRef,
                                            const std::vector<double>& errRef,
                                            const std::vector<std::uint32_t>& flagsRef, std::uint32_t reject,
                                            double r1, double ref, double rin, double rout,
                                            const Sources& sources, double fwhm, const ApertureParams& p) {
    std::vector<std::pair<double, std::size_t>> cand; // (-S/N, index)
    for (std::size_t i : pre) {
        if ((flagsRef[i] & reject) || !(fluxRef[i] > 0.0) || !(errRef[i] > 0.0)) continue;
        if (fluxRef[i] / errRef[i] < p.apCorrMinSnr) continue;
        cand.emplace_back(-concentrationNeutralSnr(flux1[i], err1[i], fluxRef[i], errRef[i]), i);
    }
    const std::vector<double> fractions = modelFractions(p, fwhm, r1, ref, rin, rout);
    if (p.apCorrIsolation > 0.0 && !cand.empty()) {
        const NeighbourLight light(sources, flux1, fwhm, ref, fractions);
        auto isolated = cand;
        std::erase_if(isolated,
                      [&](const auto& c) { return light(c.second) > p.apCorrIsolation * fluxRef[c.second]; });
        // a handful of isolated stars would leave the concentration test nothing to reject with
        if (static_cast<int>(isolated.size()) >= std::max(kMinIsolated, p.apCorrMinStars))
            cand = std::move(isolated);
    }
    std::sort(cand.begin(), cand.end());
    const double model = modelConcentration(fractions, r1, ref, rin, rout);
    std::vector<std::size_t> stars;
    const std::size_t maxStars = static_cast<std::size_t>(std::max(0, p.apCorrMaxStars));
    if (std::isfinite(model)) {
        for (const auto& [negSnr, i] : cand) {
            if (stars.size() >= maxStars) break;
            const double f1 = flux1[i], fr = fluxRef[i], fw = fr - f1; // flux(ref) = flux(r1) + wing
            const auto [v1, vw] = coreWingVariance(err1[i], errRef[i]);
            const double sigma = std::sqrt((fw * fw * v1 + f1 * f1 * vw) / (fr * fr * fr * fr) +
                                           (0.01 * model) * (0.01 * model));
            if (std::abs(f1 / fr - model) <= p.apCorrClip * sigma) stars.push_back(i);
        }
        if (static_cast<int>(stars.size()) < std::max(1, p.apCorrMinStars)) stars.clear();
    }
    if (stars.empty()) {
        if (cand.size() > maxStars) cand.resize(maxStars);
        std::vector<double> conc;
        for (const auto& c : cand)
            conc.push_back(flux1[c.second] / fluxRef[c.second]);
        const double med = robustMedian(conc);
        const double sig = conc.empty() ? 0.0 : madSigma(conc, med);
        for (std::size_t k = 0; k < cand.size(); ++k)
            if (!(sig > 0.0) || std::abs(conc[k] - med) <= p.apCorrClip * sig)
                stars.push_back(cand[k].second);
    }
    std::sort(stars.begin(), stars.end());
    return stars;
}

// tuning aperture.timing: the driver's sections on stderr (host clocks; the engine's own calls are
// inside them), to see where a stage's host time goes.
struct SectionClock {
    bool on = false;
    std::chrono::steady_clock::time_point t = std::chrono::steady_clock::now();
    std::vector<std::pair<std::string, double>> laps; // summed by name, in first-seen order
    void lap(const char* name) {
        if (!on) return;
        const auto now = std::chrono::steady_clock::now();
        const double ms = std::chrono::duration<double, std::milli>(now - t).count();
        t = now;
        for (auto& l : laps)
            if (l.first == name) {
                l.second += ms;
                return;
            }
        laps.emplace_back(name, ms);
    }
    ~SectionClock() {
        if (!on) return;
        std::string line;
        for (const auto& l : laps)
            line += " " + l.first + " " + std::to_string(l.second).substr(0, 6);
        std::fprintf(stderr, "aperture driver (ms):%s\n", line.c_str());
    }
};

// The background map: full-resolution images, or (CPU engine) the same pixels evaluated on demand by
// bkg.sampler.
bool hasFullMap(const BackgroundResult& bkg) {
    return !bkg.level.empty() && !bkg.rms.empty();
}
bool hasMap(const BackgroundResult& bkg) {
    return hasFullMap(bkg) || bkg.sampler != nullptr;
}
// The curve of growth is measured for the aperture correction and for the optimal aperture.
bool wantsCurveOfGrowth(const ApertureParams& p) {
    return p.apertureCorrection || p.optimal;
}

// The sources with their centres moved to their isophotal barycentres where those are finite.
Sources atBarycentres(const Sources& s) {
    Sources c = s;
    for (std::size_t i = 0; i < c.x.size() && i < c.xIso.size() && i < c.yIso.size(); ++i)
        if (std::isfinite(c.xIso[i]) && std::isfinite(c.yIso[i])) {
            c.x[i] = c.xIso[i];
            c.y[i] = c.yIso[i];
        }
    return c;
}

// The mask, the segmentation map and the background map must have the image's size.
void checkCompanionSizes(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                         const ImageViewT<std::int32_t>& segmentation) {
    auto sameSize = [&](int w, int h, const char* what) {
        if (w != image.width || h != image.height)
            throw InvalidInput(std::string("aperture photometry: ") + what + " is " + std::to_string(w) +
                               "x" + std::to_string(h) + ", the image " + std::to_string(image.width) + "x" +
                               std::to_string(image.height));
    };
    if (!mask.empty()) sameSize(mask.width, mask.height, "the mask");
    if (!segmentation.empty()) sameSize(segmentation.width, segmentation.height, "the segmentation map");
    const bool fullMap = hasFullMap(bkg);
    const bool haveMap = hasMap(bkg);
    if (fullMap) {
        sameSize(bkg.level.width(), bkg.level.height(), "the background map");
        sameSize(bkg.rms.width(), bkg.rms.height(), "the background rms map");
    } else if (haveMap) {
        sameSize(bkg.sampler->width(), bkg.sampler->height(), "the background map");
    }
}

// The sizes in the parameters (radii, annulus, Kron, curve of growth): positive and consistent.
void checkApertureSizes(const ApertureParams& p, double fwhm) {
    const bool wantCog = wantsCurveOfGrowth(p);
    const bool needFwhm = p.radiiInFwhm || (p.useLocalSky && p.annulusInFwhm) || wantCog;
    if (needFwhm)
        checkPositive(fwhm, "the FWHM (needed for FWHM-relative sizes, aperture correction, optimal)");
    for (double r : p.radii)
        checkPositive(r, "every aperture radius");
    if (p.useLocalSky) {
        checkPositive(p.annulusOuter, "the sky annulus outer radius");
        if (!(p.annulusInner >= 0.0) || !(p.annulusInner < p.annulusOuter))
            throw InvalidInput("aperture photometry: the sky annulus needs 0 <= inner < outer");
    }
    checkPositive(p.kronFactor, "kronFactor");
    checkPositive(p.kronMaxRadius, "kronMaxRadius");
    if (wantCog) {
        checkPositive(p.apCorrRefRadius, "apCorrRefRadius");
        if (!(p.apCorrIsolation >= 0.0) || !(p.apCorrModelErr >= 0.0) || !std::isfinite(p.apCorrModelErr))
            throw InvalidInput("aperture photometry: apCorrIsolation and apCorrModelErr must be >= 0");
        checkPositive(p.cogStep, "cogStep");
        checkPositive(p.optimalMinRadius, "optimalMinRadius");
        if (p.optimalMinRadius >= p.apCorrRefRadius)
            throw InvalidInput("aperture photometry: optimalMinRadius must be below apCorrRefRadius");
    }
}

// The stage's inputs checked before anything is measured (InvalidInput, in this order).
void validateApertureInputs(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                            const ImageViewT<std::int32_t>& segmentation, const Sources& sources, double fwhm,
                            double gain, double readNoise, const ApertureParams& p) {
    if (image.empty()) throw InvalidInput("aperture photometry: empty image");
    checkCompanionSizes(image, mask, bkg, segmentation);
    if (!p.useLocalSky && !hasMap(bkg))
        throw InvalidInput("aperture photometry: useLocalSky is off but no background map was given");
    if (sources.y.size() != sources.x.size())
        throw InvalidInput("aperture photometry: Sources x and y differ in length");
    if (!(gain >= 0.0) || !std::isfinite(gain)) throw InvalidInput("aperture photometry: gain must be >= 0");
    if (!(readNoise >= 0.0) || !std::isfinite(readNoise))
        throw InvalidInput("aperture photometry: read noise must be >= 0");
    if (p.radii.empty()) throw InvalidInput("aperture photometry: no aperture radii");
    checkApertureSizes(p, fwhm);
}

// The local sky's parameters for the engine (the clipped rms corrected to the unclipped sigma).
detail::SkyParamsHD skyParamsOf(const ApertureParams& p) {
    const double rmsCorrection = clipRmsCorrection(p.skyClipSigma);
    return detail::SkyParamsHD{p.skyClipSigma, p.skyClipIterations, p.minSkyPixels,
                               static_cast<int>(p.skyEstimator), rmsCorrection};
}

// The flags that keep a source out of the curve-of-growth stars.
constexpr std::uint32_t kRejectSource = FlagCrowded | FlagBlended | FlagSaturated | FlagEdge |
                                        FlagApertureIncomplete | FlagBadPixels | FlagApertureMasked |
                                        FlagSkyFailed | FlagDeblendOverflow;

// The reference aperture's flux, error and flags per source (NaN, NaN, 0 where not measured).
struct ReferenceFluxes {
    std::vector<double> flux, err;
    std::vector<std::uint32_t> flags;
};

// Pass 3's curve of growth per grid radius: radius, fraction, area and kappa * area (products hoisted out
// of the search's loop, same values), the fraction at 1 FWHM (g1), and the noise model (grid). Not
// copied: grid points into the vectors.
struct OptimalCurve {
    OptimalCurve(const ApertureResult& res, double kappa, double gain, double oneFwhm)
        : nGrid(res.cogRadius.size()), g1(interpolate(res.cogRadius, res.cogFraction, oneFwhm)),
          cogR(res.cogRadius.data()), cogF(res.cogFraction.data()), cogArea(nGrid), cogKappaArea(nGrid),
          cogNum(nGrid) {
        for (std::size_t g = 0; g < nGrid; ++g) {
            cogArea[g] = std::numbers::pi * cogR[g] * cogR[g];
            cogKappaArea[g] = kappa * cogArea[g];
            cogNum[g] = cogF[g] * cogF[g];
        }
        grid = detail::OptimalGrid{cogF,  cogNum.data(), cogArea.data(), cogKappaArea.data(),
                                   nGrid, gain,          gain > 0.0};
    }
    OptimalCurve(const OptimalCurve&) = delete;
    OptimalCurve& operator=(const OptimalCurve&) = delete;
    const std::size_t nGrid;
    const double g1;
    const double* cogR;
    const double* cogF;
    std::vector<double> cogArea, cogKappaArea, cogNum;
    detail::OptimalGrid grid;
};

// One run of the stage (detail::measureAperturesWith) on an engine: the inputs, the resolved radii and
// sky parameters, the per-source columns that the later passes read and the batch buffers, shared by
// the steps. Pass 1 measures the sky, the fixed apertures and Kron; pass 2 the curve of growth and the
// aperture correction; pass 3 the S/N-optimal aperture.
class ApertureRun {
public:
    // The inputs must have passed validateApertureInputs.
    ApertureRun(detail::ApertureEngine& engine, const ImageView& image, const MaskView& mask,
                const BackgroundResult& bkg, const ImageViewT<std::int32_t>& segmentation,
                const Sources& sources, double fwhm, double gain, double readNoise,
                const ApertureParams& params, RunContext& ctx, SectionClock& clock)
        : engine(engine), image(image), mask(mask), bkg(bkg), segmentation(segmentation), sources(sources),
          fwhm(fwhm), gain(gain), readNoise(readNoise), p(params), ctx(ctx), clock(clock),
          fullMap(hasFullMap(bkg)), haveMap(hasMap(bkg)), wantCog(wantsCurveOfGrowth(params)),
          n(sources.size()), nFixed(params.radii.size()),
          rin(params.annulusInFwhm ? params.annulusInner * fwhm : params.annulusInner),
          rout(params.annulusInFwhm ? params.annulusOuter * fwhm : params.annulusOuter),
          refRadius(wantCog ? params.apCorrRefRadius * fwhm : kNaN), oneFwhm(wantCog ? fwhm : kNaN),
          saturation((params.saturation > 0.0) ? params.saturation : kInf),
          kappa(skyMeanFactor(params.skyEstimator)),
          skyParams(skyParamsOf(params)), kronParams{params.kronFactor, params.kronMinRadius,
                                                     params.kronMaxRadius, params.kronPixelCentres ? 1 : 0},
          threads(ctx.threadCount()) {
        resolveRadii();
    }

    // The frame and its companions handed to the engine (the background map, or its sampler).
    void beginEngine() {
        engine.begin(image, mask, segmentation, fullMap ? bkg.level.view() : ImageView{},
                     fullMap ? bkg.rms.view() : ImageView{}, saturation, p.neighbourPixels);
        if (haveMap && !fullMap && !engine.setMapSampler(bkg.sampler.get()))
            throw InvalidInput("aperture photometry: this backend needs the full-resolution background maps");
    }

    // The result's per-source columns and the later passes' (NaN or 0), filled by several threads at once
    // (their first touch, page faults included).
    void allocateColumns() {
        res.flux.resize(nFixed);
        res.fluxErr.resize(nFixed);
        res.apertureFlags.resize(nFixed);
        std::vector<std::function<void()>> fills;
        const std::size_t count = n;
        auto fill = [&](auto& v, auto value) {
            fills.emplace_back([&v, value, count] { v.assign(count, value); });
        };
        for (std::size_t k = 0; k < nFixed; ++k) {
            fill(res.flux[k], kNaN);
            fill(res.fluxErr[k], kNaN);
            fill(res.apertureFlags[k], std::uint32_t{0});
        }
        for (auto* v : {&res.sky, &res.skyRms, &res.kronRadius, &res.fluxAuto, &res.fluxAutoErr,
                        &res.radiusOpt, &res.fluxOpt, &res.fluxOptErr, &flux1, &err1})
            fill(*v, kNaN);
        fill(skyMeanVar, 0.0);
        fill(res.skyArea, 0);
        fill(res.flags, std::uint32_t{0});
        fill(flags1, std::uint32_t{0});
        fill(ownIds, std::int32_t{0});
        fill(skyPerPixel, std::uint8_t{0});
        runFirstTouches(fills);
    }

    // Allocations and fills, one per thread (their first touch: page faults, initialisation), with many
    // sources; in turn on this thread with few.
    void runFirstTouches(const std::vector<std::function<void()>>& tasks) const {
        const std::ptrdiff_t nt = static_cast<std::ptrdiff_t>(tasks.size());
        ParallelErrors errors;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) if (n >= kParallelSources)
        for (std::ptrdiff_t t = 0; t < nt; ++t)
            errors.run([&] { tasks[static_cast<std::size_t>(t)](); });
        errors.rethrow();
    }

    // The order of pass 1: a spatial one (bands of 64 rows, then x) so that neighbouring apertures share
    // cached pixels; every result is per source, so the order changes no number. (An engine may take the
    // sources' own order: the detection's is already raster-like.)
    void chooseOrder() {
        if (engine.spatialOrder()) {
            order = spatialOrder(sources.x, sources.y, threads);
        } else {
            order.resize(n);
            std::iota(order.begin(), order.end(), std::size_t{0});
        }
    }

    // The batch buffers (the engine's, kept across calls, or this call's) sized for pass 1, each by its own
    // thread (their first touch: page faults and initialisation, several MB at 32k sources; nothing when
    // kept from a call of this size).
    void allocateBatchBuffers() {
        batch = std::max<std::size_t>(1, engine.batchSize());
        scratch = engine.scratch() ? engine.scratch() : &ownScratch;
        detail::ApertureScratch& sc = *scratch;
        const std::size_t m = std::min(n, batch);
        std::vector<std::function<void()>> sizes{
            [&] { resizeKept(sc.idx, m); },     [&] { resizeKept(sc.cxs, m); },
            [&] { resizeKept(sc.cys, m); },     [&] { resizeKept(sc.skies, m); },
            [&] { resizeKept(sc.jobs, m); },    [&] { resizeKept(sc.sums, m * nr); },
            [&] { resizeKept(sc.fds, m); },     [&] { resizeKept(sc.kronJobs, m); },
            [&] { resizeKept(sc.kronOut, m); }, [&] { resizeKept(sc.bflags, m); }};
        runFirstTouches(sizes);
    }

    // Pass 1: sky, fixed apertures, Kron, batch by batch (the last batch's Kron columns may be left to
    // pass 2: runKron).
    void measureSkyAndApertures() {
        forBatches(n, 0.0, 0.7, [&](std::size_t c0, std::size_t c1) { pass1Batch(c0, c1); });
        if (!deferredKron) engine.finish();
    }

    // Pass 2: the curve of growth from bright isolated stars (else a model's), and the aperture correction.
    void curveOfGrowth() {
        if (wantCog && p.givenCurve && takeGivenCurve(*p.givenCurve)) {
            runKron(); // (left to the reference apertures otherwise)
        } else if (wantCog) {
            res.apCorrRefRadius = refRadius;
            for (double f = p.optimalMinRadius; f < p.apCorrRefRadius - 0.5 * p.cogStep; f += p.cogStep)
                res.cogRadius.push_back(f * fwhm);
            res.cogRadius.push_back(refRadius);
            const std::vector<std::size_t> pre = preselectStars();
            clock.lap("p2.pre");
            const ReferenceFluxes ref = referenceApertures(pre);
            clock.lap("p2.REF");
            const std::vector<std::size_t> stars = curveOfGrowthStars(
                pre, flux1, err1, ref.flux, ref.err, ref.flags, kRejectSource, oneFwhm, refRadius,
                p.useLocalSky ? rin : 0.0, p.useLocalSky ? rout : 0.0, sources, fwhm, p);
            if (static_cast<int>(stars.size()) >= std::max(1, p.apCorrMinStars))
                measuredCurve(stars, ref.flux);
            else
                modelCurve();
        }
        if (!p.apertureCorrection) {
            res.apCorrRatio.assign(nFixed, kNaN);
            res.apCorrMag.assign(nFixed, kNaN);
            res.apCorrMagErr.assign(nFixed, kNaN);
        }
    }

    // The curve of a result measured before at the same FWHM (ApertureParams::givenCurve): false when it has
    // none or another grid.
    bool takeGivenCurve(const ApertureResult& g) {
        if (g.cogRadius.empty() || g.cogRadius.size() != g.cogFraction.size() || !(g.apCorrRefRadius == refRadius) ||
            g.apCorrRatio.size() != nFixed || g.apCorrMagErr.size() != nFixed || !(g.refApertureFraction > 0.0))
            return false;
        res.apCorrRefRadius = g.apCorrRefRadius;
        res.cogRadius = g.cogRadius;
        res.cogFraction = g.cogFraction;
        res.apCorrStars = g.apCorrStars;
        res.apCorrSource = g.apCorrSource;
        if (!p.apertureCorrection) return true;
        for (std::size_t k = 0; k < nFixed; ++k) {
            const double ratio = g.apCorrRatio[k] / g.refApertureFraction; // to the reference radius
            res.apCorrRatio.push_back(ratio);
            res.apCorrMag.push_back(2.5 * std::log10(ratio));
            res.apCorrMagErr.push_back(g.apCorrMagErr[k]);
        }
        return true;
    }

    // Pass 1's last Kron columns when they were left to pass 2 (at most once).
    void runKron() {
        if (!deferredKron) return;
        const std::function<void()> f = std::move(deferredKron);
        deferredKron = nullptr;
        f();
    }

    // Pass 3: per source, the S/N-optimal radius on the curve of growth's grid and the flux there,
    // corrected to the total.
    void optimalApertures() {
        if (!p.optimal) return;
        const OptimalCurve curve(res, kappa, gain, oneFwhm);
        detail::ApertureScratch& sc = *scratch;
        resizeKept(sc.optJobs, std::min(n, batch));
        resizeKept(sc.optIndex, sc.optJobs.size());
        resizeKept(sc.measured, sc.optJobs.size());
        resizeKept(sc.slot, sc.optJobs.size() + 1);
        forBatches(n, 0.8, 1.0, [&](std::size_t c0, std::size_t c1) { optimalBatch(curve, c0, c1); });
    }

    ApertureResult takeResult() {
        return std::move(res);
    }

private:
    // The fixed radii resolved (px), the sky annulus, and the internal ascending radius list: the fixed
    // radii and 1 FWHM (flux estimate, star preselection).
    void resolveRadii() {
        res.count = n;
        for (double r : p.radii)
            res.radii.push_back(p.radiiInFwhm ? r * fwhm : r);
        if (p.useLocalSky) {
            res.skyAnnulusInner = rin;
            res.skyAnnulusOuter = rout;
        }
        radii = res.radii;
        if (wantCog) radii.push_back(oneFwhm);
        std::sort(radii.begin(), radii.end());
        radii.erase(std::unique(radii.begin(), radii.end()), radii.end());
        auto indexOf = [&](double r) {
            return static_cast<std::size_t>(std::lower_bound(radii.begin(), radii.end(), r) - radii.begin());
        };
        fixedIndex.resize(nFixed);
        for (std::size_t k = 0; k < nFixed; ++k)
            fixedIndex[k] = indexOf(res.radii[k]);
        fwhmIndex = wantCog ? indexOf(oneFwhm) : 0;
        nr = radii.size();
    }

    // Runs body(c0, c1) over [0, count) in batches, checking for cancellation and reporting progress.
    template <class Body> void forBatches(std::size_t count, double f0, double f1, Body&& body) {
        for (std::size_t c0 = 0; c0 < count; c0 += batch) {
            ctx.checkCancelled();
            const std::size_t c1 = std::min(count, c0 + batch);
            body(c0, c1);
            ctx.report("aperture", f0 + (f1 - f0) * static_cast<double>(c1) / static_cast<double>(count));
        }
    }

    // The segmentation's pixels are read here only for sources without segmentId: the CUDA stage may pass a
    // view of the detection's device buffer when every source has one (cuda::measureApertures with a
    // SegmentationMap); the engine alone reads its pixels then.
    std::int32_t ownIdOf(std::size_t i, double cx, double cy) const {
        if (i < sources.segmentId.size()) return sources.segmentId[i];
        if (segmentation.empty()) return 0;
        const int px = static_cast<int>(std::lround(cx)), py = static_cast<int>(std::lround(cy));
        if (px < 0 || py < 0 || px >= image.width || py >= image.height) return 0;
        return segmentation(px, py);
    }
    // Source i's sky as pass 1 settled it: the map per pixel, or a constant level and variance.
    ApertureSky skyModelOf(std::size_t i) const {
        ApertureSky s;
        s.perPixel = skyPerPixel[i] != 0;
        s.level = res.sky[i];
        s.var = res.skyRms[i] * res.skyRms[i];
        return s;
    }
    // The circles of source i about its centre with its settled sky (passes 2 and 3, pass 1's after its
    // sky).
    CircleJob circleJobOf(std::size_t i) const {
        return CircleJob{sources.x[i], sources.y[i], skyModelOf(i), ownIds[i]};
    }

    // ---- pass 1 ----

    // One batch of pass 1: the engine measures the skies, then the circles and Kron (chained behind the
    // skies, or launched after the host has set each job's sky); the host fills the columns.
    void pass1Batch(std::size_t c0, std::size_t c1) {
        const std::size_t m = finiteCentres(c0, c1);
        clock.lap("p1.idx");
        if (m == 0) return;
        detail::ApertureScratch& sc = *scratch;
        sc.bflags.assign(m, 0);
        // sky (the engine may return at once: the Kron ellipses below are computed meanwhile)
        const int skyTicket = launchLocalSkies(m);
        prepareJobs(m);
        clock.lap("p1.kronprep");
        // circular apertures and Kron radius and FLUX_AUTO queued behind the skies (the engine turns each
        // estimate into the job's sky as applySkies does), or after applySkies
        int circleTicket = -1, kronTicket = -1;
        const detail::SkyJobRule skyRule{haveMap ? 1 : 0, gain > 0.0 ? readNoise / gain : readNoise};
        // With a weight map the noise comes from the map at the centre (applySkies), so the host sets it.
        const bool chained = p.useLocalSky && !(bkg.weightScale > 0.0) &&
                             engine.chainPass1(skyTicket, skyRule, sc.jobs.data(), m, radii.data(), nr,
                                               sc.sums.data(), sc.fds.data(), sc.kronJobs.data(), kronParams,
                                               sc.kronOut.data(), circleTicket, kronTicket);
        clock.lap("p1.chain");
        if (p.useLocalSky) engine.finish(skyTicket);
        clock.lap("p1.SKY");
        applySkies(m, skyRule);
        clock.lap("p1.skyhost");
        // (not chained: queued together now; the circles' columns are filled while the engine may still
        // measure the ellipses)
        if (!chained) {
            circleTicket =
                engine.sumCirclesAsync(sc.jobs.data(), m, radii.data(), nr, 0, sc.sums.data(), sc.fds.data());
            kronTicket = engine.kronAsync(sc.kronJobs.data(), m, kronParams, sc.kronOut.data());
        }
        clock.lap("p1.launch");
        engine.finish(circleTicket);
        clock.lap("p1.CIRC");
        fixedApertureColumns(m);
        clock.lap("p1.circhost");
        // Kron's results into the columns; the last batch's wait on the engine, when it queues, is left to
        // pass 2 (runKron), whose host work then runs while the ellipses are measured.
        if (c1 == n && kronTicket > 0)
            deferredKron = [this, m, kronTicket] { kronColumns(m, kronTicket); };
        else
            kronColumns(m, kronTicket);
    }

    // The sources of the batch with finite centres in order, and those centres, into idx, cxs, cys (each
    // thread a contiguous share, counted first, then written from its offset); the others are flagged.
    // Returns their count.
    std::size_t finiteCentres(std::size_t c0, std::size_t c1) {
        detail::ApertureScratch& sc = *scratch;
        const std::size_t cnt = c1 - c0;
        sc.idx.resize(cnt);
        sc.cxs.resize(cnt);
        sc.cys.resize(cnt);
        const int nt = cnt >= kParallelSources ? threads : 1;
        std::vector<std::size_t> offsets(static_cast<std::size_t>(nt) + 1, 0);
        std::size_t m = 0;
#pragma omp parallel num_threads(nt)
        {
            const std::size_t t = static_cast<std::size_t>(omp_get_thread_num());
            const std::size_t tn = static_cast<std::size_t>(omp_get_num_threads());
            const std::size_t a = c0 + cnt * t / tn, b = c0 + cnt * (t + 1) / tn;
            std::size_t finite = 0;
            for (std::size_t c = a; c < b; ++c)
                finite += std::isfinite(sources.x[order[c]]) && std::isfinite(sources.y[order[c]]) ? 1 : 0;
            offsets[t + 1] = finite;
#pragma omp barrier
#pragma omp single
            {
                for (std::size_t q = 0; q < tn; ++q)
                    offsets[q + 1] += offsets[q];
                m = offsets[tn];
            }
            std::size_t w = offsets[t];
            for (std::size_t c = a; c < b; ++c) {
                const std::size_t i = order[c];
                const double cx = sources.x[i], cy = sources.y[i];
                if (!std::isfinite(cx) || !std::isfinite(cy)) {
                    res.flags[i] = FlagApertureIncomplete | FlagSkyFailed | FlagKronFailed;
                    continue;
                }
                ownIds[i] = ownIdOf(i, cx, cy);
                sc.idx[w] = i;
                sc.cxs[w] = cx;
                sc.cys[w] = cy;
                ++w;
            }
        }
        sc.idx.resize(m);
        sc.cxs.resize(m);
        sc.cys.resize(m);
        return m;
    }

    // The local skies of the batch's m sources queued on the engine: its ticket (-1: no local sky).
    int launchLocalSkies(std::size_t m) {
        if (!p.useLocalSky) return -1;
        detail::ApertureScratch& sc = *scratch;
        resizeKept(sc.skies, m); // every entry written by the engine
        clock.lap("p1.skyprep");
        const int skyTicket =
            engine.localSkiesAsync(sc.cxs.data(), sc.cys.data(), m, rin, rout, skyParams, sc.skies.data());
        clock.lap("p1.skylaunch");
        return skyTicket;
    }

    // The isophotal ellipses for Kron and the circles' jobs (their skies are set by applySkies, or by the
    // engine).
    void prepareJobs(std::size_t m) {
        detail::ApertureScratch& sc = *scratch;
        resizeKept(sc.kronJobs, m);
        resizeKept(sc.jobs, m);
        resizeKept(sc.sums, m * nr);
        resizeKept(sc.fds, m);
        resizeKept(sc.kronOut, m);
        const std::ptrdiff_t mm = static_cast<std::ptrdiff_t>(m);
#pragma omp parallel for num_threads(threads) schedule(static) if (m >= kParallelSources)
        for (std::ptrdiff_t kk = 0; kk < mm; ++kk) {
            const std::size_t k = static_cast<std::size_t>(kk);
            const std::size_t i = sc.idx[k];
            double a = columnOr(sources.a, i, kNaN), b = columnOr(sources.b, i, kNaN);
            double th = columnOr(sources.theta, i, 0.0) * std::numbers::pi / 180.0;
            if (!(a > 0.0) || !(b > 0.0) || !std::isfinite(a) || !std::isfinite(b) || !std::isfinite(th)) {
                // no usable isophotal ellipse: a circle of the field's Gaussian sigma (or 1 px)
                a = b = (fwhm > 0.0 && std::isfinite(fwhm)) ? fwhm * kFwhmToSigma : 1.0;
                th = 0.0;
            }
            sc.kronJobs[k] = KronJob{sources.x[i], sources.y[i],  a,        b, std::cos(th),
                                     std::sin(th), ApertureSky{}, ownIds[i]};
            sc.jobs[k] = CircleJob{sources.x[i], sources.y[i], ApertureSky{}, ownIds[i]};
        }
    }

    // Each source's sky from its local estimate (failed: the map, else no level and the read noise), or
    // the map at its centre; the jobs get it.
    void applySkies(std::size_t m, const detail::SkyJobRule& skyRule) {
        detail::ApertureScratch& sc = *scratch;
        const std::ptrdiff_t mm = static_cast<std::ptrdiff_t>(m);
#pragma omp parallel for num_threads(threads) schedule(static) if (m >= kParallelSources)
        for (std::ptrdiff_t kk = 0; kk < mm; ++kk) {
            const std::size_t k = static_cast<std::size_t>(kk);
            const std::size_t i = sc.idx[k];
            const double cx = sources.x[i], cy = sources.y[i];
            const int pxc = std::clamp(static_cast<int>(std::lround(cx)), 0, image.width - 1);
            const int pyc = std::clamp(static_cast<int>(std::lround(cy)), 0, image.height - 1);
            bool skyFromMap = !p.useLocalSky;
            if (p.useLocalSky) {
                const SkyEstimate& est = sc.skies[k];
                if (est.ok) {
                    // a weight map's RMS (background.hpp, applyWeightVariance) at the centre, else the
                    // annulus'
                    const double rms =
                        bkg.weightScale > 0.0 ? static_cast<double>(bkg.rmsAt(pxc, pyc)) : est.rms;
                    res.sky[i] = est.level;
                    res.skyRms[i] = rms;
                    res.skyArea[i] = est.n;
                    skyMeanVar[i] = kappa * rms * rms / est.n;
                } else {
                    sc.bflags[k] |= FlagSkyFailed;
                    skyFromMap = haveMap;
                    if (!haveMap) {
                        res.sky[i] = kNaN;
                        res.skyRms[i] = skyRule.fallbackRms;
                    }
                }
            }
            if (skyFromMap) {
                res.sky[i] = bkg.levelAt(pxc, pyc);
                res.skyRms[i] = bkg.rmsAt(pxc, pyc);
                skyPerPixel[i] = 1;
            }
            sc.jobs[k] = circleJobOf(i);
            sc.kronJobs[k].sky = sc.jobs[k].sky;
        }
    }

    // The fixed apertures' fluxes, errors and flags, and the 1-FWHM aperture's for pass 2.
    void fixedApertureColumns(std::size_t m) {
        detail::ApertureScratch& sc = *scratch;
        const std::ptrdiff_t mm = static_cast<std::ptrdiff_t>(m);
#pragma omp parallel for num_threads(threads) schedule(static) if (m >= kParallelSources)
        for (std::ptrdiff_t kk = 0; kk < mm; ++kk) {
            const std::size_t k = static_cast<std::size_t>(kk);
            const std::size_t i = sc.idx[k];
            const ApertureSums* s = sc.sums.data() + k * nr;
            const ApertureFlagDistances& fd = sc.fds[k];
            std::uint32_t& flags = sc.bflags[k];
            for (std::size_t q = 0; q < nFixed; ++q) {
                const ApertureSums& sq = s[fixedIndex[q]];
                res.flux[q][i] = sq.flux;
                res.fluxErr[q][i] = std::sqrt(fluxVariance(sq, gain, skyMeanVar[i]));
                const std::uint32_t f = fd.flagsFor(res.radii[q]);
                res.apertureFlags[q][i] = f | (flags & FlagSkyFailed);
                flags |= f;
            }
            if (wantCog) {
                flux1[i] = s[fwhmIndex].flux;
                err1[i] = std::sqrt(fluxVariance(s[fwhmIndex], gain, skyMeanVar[i]));
                flags1[i] = fd.flagsFor(oneFwhm);
            }
            res.flags[i] = flags; // (pass 2 reads FlagSkyFailed; Kron's flags are added by kronColumns)
        }
    }

    // Kron's results of the batch's m sources into the columns, once the engine has them (kronTicket).
    void kronColumns(std::size_t m, int kronTicket) {
        engine.finish(kronTicket);
        clock.lap("p1.KRON");
        detail::ApertureScratch& sc = *scratch;
        const std::ptrdiff_t mk = static_cast<std::ptrdiff_t>(m);
#pragma omp parallel for num_threads(threads) schedule(static) if (m >= kParallelSources)
        for (std::ptrdiff_t kk = 0; kk < mk; ++kk) {
            const std::size_t k = static_cast<std::size_t>(kk);
            const std::size_t i = sc.idx[k];
            const KronOut& ko = sc.kronOut[k];
            res.kronRadius[i] = ko.kronRadius;
            if (ko.measured) {
                res.fluxAuto[i] = ko.sums.flux;
                res.fluxAutoErr[i] = std::sqrt(fluxVariance(ko.sums, gain, skyMeanVar[i]));
            }
            res.flags[i] = sc.bflags[k] | ko.flags;
        }
        clock.lap("p1.kronhost");
    }

    // ---- pass 2 ----

    // The curve-of-growth candidates, ascending: preselected on the 1-FWHM aperture (its S/N exceeds the
    // reference aperture's for all but sky-free sources), only the 10 x apCorrMaxStars best by that S/N
    // (ties by index) go on to the reference aperture.
    std::vector<std::size_t> preselectStars() const {
        std::vector<std::size_t> pre;
        {
            std::vector<std::uint8_t> qualifies(n);
            const std::ptrdiff_t nn = static_cast<std::ptrdiff_t>(n);
#pragma omp parallel for num_threads(threads) schedule(static) if (n >= kParallelSources)
            for (std::ptrdiff_t ii = 0; ii < nn; ++ii) {
                const std::size_t i = static_cast<std::size_t>(ii);
                const std::uint32_t sf = columnOr(sources.flags, i, 0u);
                qualifies[i] = !((sf & kRejectSource) || (flags1[i] & kRejectSource) ||
                                 (res.flags[i] & FlagSkyFailed)) &&
                               flux1[i] > 0.0 && err1[i] > 0.0 && flux1[i] / err1[i] >= p.apCorrMinSnr;
            }
            for (std::size_t i = 0; i < n; ++i)
                if (qualifies[i]) pre.push_back(i);
        }
        const std::size_t preMax = 10 * static_cast<std::size_t>(std::max(1, p.apCorrMaxStars));
        if (pre.size() > preMax) {
            // (pre ascends by index: the stable sort by S/N's first preMax, as a selection)
            std::nth_element(pre.begin(), pre.begin() + static_cast<std::ptrdiff_t>(preMax), pre.end(),
                             [&](std::size_t a, std::size_t b) {
                                 const double sa = flux1[a] / err1[a], sb = flux1[b] / err1[b];
                                 return sa > sb || (!(sb > sa) && a < b);
                             });
            pre.resize(preMax);
            std::sort(pre.begin(), pre.end());
        }
        return pre;
    }

    // The circles of sources list[c0 .. c0 + m) into jobs2.
    void jobs2Of(const std::vector<std::size_t>& list, std::size_t c0, std::size_t m) {
        detail::ApertureScratch& sc = *scratch;
        resizeKept(sc.jobs2, m);
        for (std::size_t k = 0; k < m; ++k) {
            const std::size_t i = list[c0 + k];
            sc.jobs2[k] = circleJobOf(i);
        }
    }

    // The reference aperture of the candidates (pass 1's last Kron columns filled meanwhile).
    ReferenceFluxes referenceApertures(const std::vector<std::size_t>& pre) {
        ReferenceFluxes ref{std::vector<double>(n, kNaN), std::vector<double>(n, kNaN),
                            std::vector<std::uint32_t>(n, 0)};
        detail::ApertureScratch& sc = *scratch;
        forBatches(pre.size(), 0.7, 0.75, [&](std::size_t c0, std::size_t c1) {
            const std::size_t m = c1 - c0;
            jobs2Of(pre, c0, m);
            resizeKept(sc.sums2, m);
            resizeKept(sc.fds2, m);
            const int refTicket =
                engine.sumCirclesAsync(sc.jobs2.data(), m, &refRadius, 1, 0, sc.sums2.data(), sc.fds2.data());
            runKron(); // (while the engine measures the reference apertures)
            engine.finish(refTicket);
            for (std::size_t k = 0; k < m; ++k) {
                const std::size_t i = pre[c0 + k];
                ref.flux[i] = sc.sums2[k].flux;
                ref.err[i] = std::sqrt(fluxVariance(sc.sums2[k], gain, skyMeanVar[i]));
                ref.flags[i] = sc.fds2[k].flagsFor(refRadius);
            }
        });
        runKron(); // (no reference apertures)
        return ref;
    }

    // The curve of growth (and the aperture correction) measured on the stars.
    void measuredCurve(const std::vector<std::size_t>& stars, const std::vector<double>& fluxRef) {
        res.apCorrStars = static_cast<int>(stars.size());
        res.apCorrSource = "stars";
        res.apCorrStarIndex.assign(stars.begin(), stars.end());
        std::vector<std::vector<double>> frac = starFractions(stars);
        clock.lap("p2.COG");
        const std::vector<double> scale = scaleToOneFwhm(stars, frac);
        medianCurve(frac, stars.size());
        if (p.apertureCorrection) starApertureCorrections(stars, fluxRef, scale);
    }

    // fractions[star][grid]: each star's flux at the grid radii over its flux at the reference radius.
    std::vector<std::vector<double>> starFractions(const std::vector<std::size_t>& stars) {
        const std::size_t nGrid = res.cogRadius.size();
        std::vector<std::vector<double>> frac(stars.size());
        detail::ApertureScratch& sc = *scratch;
        forBatches(stars.size(), 0.75, 0.8, [&](std::size_t c0, std::size_t c1) {
            const std::size_t m = c1 - c0;
            jobs2Of(stars, c0, m);
            resizeKept(sc.sums2, m * nGrid);
            resizeKept(sc.fds2, m);
            engine.sumCircles(sc.jobs2.data(), m, res.cogRadius.data(), nGrid, 0, sc.sums2.data(),
                              sc.fds2.data());
            for (std::size_t k = 0; k < m; ++k) {
                const ApertureSums* s = sc.sums2.data() + k * nGrid;
                std::vector<double>& f = frac[c0 + k];
                f.resize(nGrid);
                const double ref = s[nGrid - 1].flux;
                for (std::size_t g = 0; g < nGrid; ++g)
                    f[g] = s[g].flux / ref;
            }
        });
        return frac;
    }

    // The fractions brought to one FWHM (a varying PSF: cogStarScale) at the grid radii; the factors,
    // [star][grid radii, then fixed radii], are returned for the fixed radii's ratios.
    std::vector<double> scaleToOneFwhm(const std::vector<std::size_t>& stars,
                                       std::vector<std::vector<double>>& frac) const {
        const std::size_t nGrid = res.cogRadius.size();
        std::vector<double> scaleRadii = res.cogRadius;
        scaleRadii.insert(scaleRadii.end(), res.radii.begin(), res.radii.end());
        const std::size_t nScale = scaleRadii.size();
        std::vector<double> scale;
        if (p.cogStarScale)
            scale = p.cogStarScale(stars, scaleRadii, refRadius, p.useLocalSky ? rin : 0.0,
                                   p.useLocalSky ? rout : 0.0);
        if (scale.size() != stars.size() * nScale) scale.assign(stars.size() * nScale, 1.0);
        for (std::size_t s = 0; s < stars.size(); ++s)
            for (std::size_t g = 0; g < nGrid; ++g)
                frac[s][g] *= scale[s * nScale + g];
        return scale;
    }

    // The curve of growth: the median of the stars' fractions at each grid radius.
    void medianCurve(const std::vector<std::vector<double>>& frac, std::size_t nStars) {
        const std::size_t nGrid = res.cogRadius.size();
        res.cogFraction.resize(nGrid);
        const std::ptrdiff_t ng = static_cast<std::ptrdiff_t>(nGrid);
        ParallelErrors errors;
#pragma omp parallel num_threads(threads) if (nGrid * nStars >= 4096)
        {
            std::vector<double> column;
            errors.run([&] { column.resize(nStars); });
#pragma omp for schedule(static)
            for (std::ptrdiff_t gg = 0; gg < ng; ++gg)
                errors.run([&] {
                    const std::size_t g = static_cast<std::size_t>(gg);
                    for (std::size_t s = 0; s < nStars; ++s)
                        column[s] = frac[s][g];
                    res.cogFraction[g] = robustMedian(column);
                });
        }
        errors.rethrow();
    }

    // Each fixed radius' correction: the median (and its error) of the stars' flux(r) / flux(reference),
    // brought to one FWHM (scale: scaleToOneFwhm's).
    void starApertureCorrections(const std::vector<std::size_t>& stars, const std::vector<double>& fluxRef,
                                 const std::vector<double>& scale) {
        const std::size_t nGrid = res.cogRadius.size();
        const std::size_t nScale = nGrid + res.radii.size();
        std::vector<double> col(stars.size());
        for (std::size_t k = 0; k < nFixed; ++k) {
            for (std::size_t s = 0; s < stars.size(); ++s)
                col[s] = res.flux[k][stars[s]] / fluxRef[stars[s]];
            res.apCorrStarRatio.push_back(col);
            for (std::size_t s = 0; s < stars.size(); ++s)
                col[s] *= scale[s * nScale + nGrid + k];
            const auto [ratio, err] = medianWithError(col);
            res.apCorrRatio.push_back(ratio);
            res.apCorrMag.push_back(2.5 * std::log10(ratio));
            res.apCorrMagErr.push_back(2.5 / std::numbers::ln10 * err / ratio);
        }
    }

    // Too few stars: the curve of growth of the PSF model, else of a Gaussian of the field FWHM.
    void modelCurve() {
        // cogRadius, then the fixed radii, then the reference radius and the sky annulus' radii.
        std::vector<double> want = res.cogRadius;
        want.insert(want.end(), res.radii.begin(), res.radii.end());
        want.push_back(refRadius);
        want.push_back(p.useLocalSky ? rin : 0.0);
        want.push_back(p.useLocalSky ? rout : 0.0);
        const std::vector<double> model = modelEnclosedFractions(want);
        // The measured ratios are of fluxes with the local sky subtracted, and the wing light in the
        // annulus raises that sky by W / A per pixel (W: the annulus' flux fraction, A: its area):
        // an aperture of radius r keeps model(r) - pi r^2 W / A. The model ratios do the same.
        const std::size_t nw = want.size();
        const double wing =
            (p.useLocalSky && rout > rin) ? (model[nw - 1] - model[nw - 2]) / (rout * rout - rin * rin) : 0.0;
        auto g = [&](std::size_t k) { return model[k] - want[k] * want[k] * wing; };
        const double gref = g(nw - 3);
        for (std::size_t k = 0; k < res.cogRadius.size(); ++k)
            res.cogFraction.push_back(g(k) / gref);
        if (p.apertureCorrection) {
            for (std::size_t k = 0; k < nFixed; ++k) {
                const double ratio = g(res.cogRadius.size() + k) / gref;
                res.apCorrRatio.push_back(ratio);
                res.apCorrMag.push_back(2.5 * std::log10(ratio));
                res.apCorrMagErr.push_back(p.apCorrModelErr);
            }
        }
    }

    // The model's enclosed fractions at the radii `want`: the PSF model's when it gives usable ones, else a
    // Gaussian's of the field FWHM (res.apCorrSource says which).
    std::vector<double> modelEnclosedFractions(const std::vector<double>& want) {
        std::vector<double> model;
        if (p.psfApertureFractions) model = p.psfApertureFractions(want);
        bool useModel = model.size() == want.size();
        for (std::size_t k = 0; k < model.size() && useModel; ++k)
            useModel = model[k] >= 0.0 && model[k] <= 1.0 + 1e-9;
        if (useModel) {
            res.apCorrSource = p.psfApertureFractionsSource;
        } else {
            res.apCorrSource = "gaussian";
            const double sigma = fwhm * kFwhmToSigma;
            model.clear();
            for (double r : want)
                model.push_back(1.0 - std::exp(-0.5 * r * r / (sigma * sigma)));
        }
        return model;
    }

    // ---- pass 3 ----

    // One batch of pass 3: the radius of the best predicted S/N per source (engine, or host), then one
    // circle each (engine), and the columns.
    void optimalBatch(const OptimalCurve& curve, std::size_t c0, std::size_t c1) {
        optimalJobs(curve, c0, c1);
        const std::size_t m = compactMeasured(c0, c1);
        detail::ApertureScratch& sc = *scratch;
        const std::size_t m0 = c1 - c0;
        // the index and the circles in one engine call; else the index (engine, or host), then the
        // circles
        const bool together =
            m > 0 &&
            engine.optimalCircles(sc.optJobs.data(), m0, curve.grid, curve.cogR, sc.slot.data(),
                                  sc.jobs3.data(), m, sc.optIndex.data(), sc.sums3.data(), sc.fds3.data());
        if (!together && !engine.optimalRadii(sc.optJobs.data(), m0, curve.grid, sc.optIndex.data()))
            hostOptimalIndices(curve, c0, c1);
        optimalRadiiOfIndices(curve, c0, c1);
        clock.lap("p3.host");
        if (m == 0) return;
        if (!together)
            engine.sumCircles(sc.jobs3.data(), m, sc.radii3.data(), 1, 1, sc.sums3.data(), sc.fds3.data());
        clock.lap("p3.CIRC");
        optimalColumns(m);
    }

    // Each source's predicted total flux (from its 1-FWHM aperture), sky variance and sky pixels
    // (optJobs), and whether it is measured (a finite centre and sky).
    void optimalJobs(const OptimalCurve& curve, std::size_t c0, std::size_t c1) {
        detail::ApertureScratch& sc = *scratch;
        const std::ptrdiff_t m0 = static_cast<std::ptrdiff_t>(c1 - c0);
#pragma omp parallel for num_threads(threads) schedule(static) if (c1 - c0 >= kParallelSources)
        for (std::ptrdiff_t c = 0; c < m0; ++c) {
            const std::size_t i = order[c0 + static_cast<std::size_t>(c)];
            const double cx = sources.x[i], cy = sources.y[i];
            sc.measured[c] = std::isfinite(cx) && std::isfinite(cy) && std::isfinite(res.sky[i]);
            const double F = (curve.g1 > 0.0 && flux1[i] > 0.0) ? flux1[i] / curve.g1 : 0.0;
            const double nSky = res.skyArea[i] > 0 ? static_cast<double>(res.skyArea[i]) : kInf;
            sc.optJobs[c] = detail::OptimalJob{F, res.skyRms[i] * res.skyRms[i], nSky};
        }
    }

    // The measured sources compacted in order (slot: their places) and their circles (the radius comes
    // with the index). Returns their count.
    std::size_t compactMeasured(std::size_t c0, std::size_t c1) {
        detail::ApertureScratch& sc = *scratch;
        const std::ptrdiff_t m0 = static_cast<std::ptrdiff_t>(c1 - c0);
        sc.slot[0] = 0;
        for (std::ptrdiff_t c = 0; c < m0; ++c)
            sc.slot[c + 1] = sc.slot[c] + sc.measured[c];
        const std::size_t m = sc.slot[m0];
        resizeKept(sc.idx3, m);
        resizeKept(sc.radii3, m); // radii of the jobs
        resizeKept(sc.fracs, m);
        resizeKept(sc.jobs3, m);
        resizeKept(sc.sums3, m);
        resizeKept(sc.fds3, m);
#pragma omp parallel for num_threads(threads) schedule(static) if (c1 - c0 >= kParallelSources)
        for (std::ptrdiff_t c = 0; c < m0; ++c) {
            if (sc.slot[c + 1] == sc.slot[c]) continue;
            const std::size_t k = sc.slot[c], i = order[c0 + static_cast<std::size_t>(c)];
            sc.idx3[k] = i;
            sc.jobs3[k] = circleJobOf(i);
        }
        return m;
    }

    // The grid index of the best predicted S/N of each measured source on the host (optIndex).
    void hostOptimalIndices(const OptimalCurve& curve, std::size_t c0, std::size_t c1) {
        detail::ApertureScratch& sc = *scratch;
        const std::ptrdiff_t m0 = static_cast<std::ptrdiff_t>(c1 - c0);
        const std::size_t nGrid = curve.nGrid;
        const double* cogF = curve.cogF;
        const double* cogArea = curve.cogArea.data();
        const double* cogKappaArea = curve.cogKappaArea.data();
        ParallelErrors errors;
#pragma omp parallel num_threads(threads) if (c1 - c0 >= kParallelSearches)
        {
            std::vector<double> dens;
            errors.run([&] { dens.resize(nGrid); });
            double* den = dens.data();
#pragma omp for schedule(static)
            for (std::ptrdiff_t c = 0; c < m0; ++c) {
                if (!sc.measured[c] || errors.failed()) continue;
                const double F = sc.optJobs[c].F, var = sc.optJobs[c].var, nSky = sc.optJobs[c].nSky;
                // the predicted variance at every grid radius in a loop of its own so that it
                // vectorises (the same numbers as optimalVariance inside the search)
                if (curve.grid.poisson) {
#pragma omp simd
                    for (std::size_t g = 0; g < nGrid; ++g)
                        den[g] = detail::optimalVariance(true, F, cogF[g], gain, cogArea[g], var,
                                                         cogKappaArea[g], nSky);
                } else {
#pragma omp simd
                    for (std::size_t g = 0; g < nGrid; ++g)
                        den[g] = detail::optimalVariance(false, F, cogF[g], gain, cogArea[g], var,
                                                         cogKappaArea[g], nSky);
                }
                sc.optIndex[c] = static_cast<std::int32_t>(detail::optimalGridIndex(
                    cogF, curve.cogNum.data(), nGrid, [den](std::size_t g) { return den[g]; }));
            }
        }
        errors.rethrow();
    }

    // The radius and fraction at each measured source's grid index, into its slot.
    void optimalRadiiOfIndices(const OptimalCurve& curve, std::size_t c0, std::size_t c1) {
        detail::ApertureScratch& sc = *scratch;
        const std::ptrdiff_t m0 = static_cast<std::ptrdiff_t>(c1 - c0);
#pragma omp parallel for num_threads(threads) schedule(static) if (c1 - c0 >= kParallelSources)
        for (std::ptrdiff_t c = 0; c < m0; ++c) {
            if (sc.slot[c + 1] == sc.slot[c]) continue;
            const std::size_t k = sc.slot[c], g = static_cast<std::size_t>(sc.optIndex[c]);
            sc.radii3[k] = curve.cogR[g];
            sc.fracs[k] = curve.cogF[g];
        }
    }

    // The optimal radius, the flux there corrected to the total, its error and the aperture's flags.
    void optimalColumns(std::size_t m) {
        detail::ApertureScratch& sc = *scratch;
#pragma omp parallel for num_threads(threads) schedule(static) if (m >= kParallelSources)
        for (std::ptrdiff_t kk = 0; kk < static_cast<std::ptrdiff_t>(m); ++kk) {
            const std::size_t k = static_cast<std::size_t>(kk);
            const std::size_t i = sc.idx3[k];
            const double r = sc.radii3[k], frac = sc.fracs[k];
            res.radiusOpt[i] = r;
            res.fluxOpt[i] = sc.sums3[k].flux / frac;
            res.fluxOptErr[i] = std::sqrt(fluxVariance(sc.sums3[k], gain, skyMeanVar[i])) / frac;
            res.flags[i] |= sc.fds3[k].flagsFor(r);
        }
    }

    // inputs
    detail::ApertureEngine& engine;
    const ImageView& image;
    const MaskView& mask;
    const BackgroundResult& bkg;
    const ImageViewT<std::int32_t>& segmentation;
    const Sources& sources;
    const double fwhm, gain, readNoise;
    const ApertureParams& p;
    RunContext& ctx;
    SectionClock& clock;
    // resolved sizes and parameters
    const bool fullMap, haveMap, wantCog;
    const std::size_t n, nFixed;
    const double rin, rout, refRadius, oneFwhm, saturation, kappa;
    const detail::SkyParamsHD skyParams;
    const detail::KronParamsHD kronParams;
    const int threads;
    ApertureResult res;
    std::vector<double> radii;           // pass 1's ascending radii: the fixed ones and 1 FWHM
    std::vector<std::size_t> fixedIndex; // fixed radius k in radii
    std::size_t fwhmIndex = 0, nr = 0;   // 1 FWHM in radii; radii.size()
    // per-source values needed by the later passes
    std::vector<double> skyMeanVar, flux1, err1;
    std::vector<std::uint32_t> flags1;
    std::vector<std::int32_t> ownIds;
    std::vector<std::uint8_t> skyPerPixel; // 1: the sky of source i is the background map
    // the passes' order, batch size and batch buffers (the engine's, kept across calls, or ownScratch)
    std::vector<std::size_t> order;
    std::size_t batch = 1;
    detail::ApertureScratch ownScratch;
    detail::ApertureScratch* scratch = nullptr;
    std::function<void()> deferredKron; // the last batch's Kron results, when the engine queued them
};

} // namespace

ApertureResult detail::measureAperturesWith(ApertureEngine& engine, const ImageView& image,
                                            const MaskView& mask, const BackgroundResult& bkg,
                                            const ImageViewT<std::int32_t>& segmentation,
                                            const Sources& sources, double fwhm, double gain,
                                            double readNoise, const ApertureParams& params, RunContext& ctx) {
    SectionClock clock;
    clock.on = ctx.tuning.aperture.timing;
    validateApertureInputs(image, mask, bkg, segmentation, sources, fwhm, gain, readNoise, params);
    const Sources centred = params.centreOnBarycentre ? atBarycentres(sources) : Sources{};
    ApertureRun run(engine, image, mask, bkg, segmentation, params.centreOnBarycentre ? centred : sources,
                    fwhm, gain, readNoise, params, ctx, clock);
    clock.lap("validation");
    run.beginEngine();
    run.allocateColumns();
    clock.lap("begin+allocation");
    run.chooseOrder();
    clock.lap("order");
    run.allocateBatchBuffers();
    clock.lap("p1.alloc");
    run.measureSkyAndApertures();
    clock.lap("pass1");
    run.curveOfGrowth();
    run.runKron(); // (no pass 2)
    clock.lap("pass2");
    run.optimalApertures();
    clock.lap("pass3");
    return run.takeResult();
}

ApertureResult cpu::measureApertures(const ImageView& image, const MaskView& mask,
                                     const BackgroundResult& bkg,
                                     const ImageViewT<std::int32_t>& segmentation, const Sources& sources,
                                     double fwhm, double gain, double readNoise, const ApertureParams& params,
                                     RunContext& ctx) {
    CpuEngine engine(ctx);
    return detail::measureAperturesWith(engine, image, mask, bkg, segmentation, sources, fwhm, gain,
                                        readNoise, params, ctx);
}

double apertureCorrectedFlux(const ApertureResult& res, std::size_t r, std::size_t i) {
    if (r >= res.flux.size() || i >= res.count || r >= res.apCorrRatio.size()) return kNaN;
    return res.flux[r][i] / res.apCorrRatio[r];
}

void extendApertureCorrectionToTotal(ApertureResult& res, double refFraction) {
    if (!(refFraction > 0.0 && refFraction <= 1.0))
        throw InvalidInput("aperture correction: the reference aperture fraction must be in (0, 1]");
    for (std::size_t r = 0; r < res.apCorrRatio.size(); ++r) {
        res.apCorrRatio[r] *= refFraction;
        res.apCorrMag[r] = 2.5 * std::log10(res.apCorrRatio[r]);
    }
    for (std::size_t i = 0; i < res.fluxOpt.size(); ++i) {
        res.fluxOpt[i] /= refFraction;
        res.fluxOptErr[i] /= refFraction;
    }
    res.refApertureFraction *= refFraction;
}

double apertureCorrectedMag(const ApertureResult& res, std::size_t r, std::size_t i) {
    if (r >= res.flux.size() || i >= res.count || r >= res.apCorrMag.size()) return kNaN;
    const double f = res.flux[r][i];
    if (!(f > 0.0)) return kNaN;
    return -2.5 * std::log10(f) + res.apCorrMag[r];
}

// The stage's public entry point: the CUDA engine when the backend is CUDA and the kernels are linked
// (core/pipeline/cuda_stages.hpp), else the CPU engine.
ApertureResult measureApertures(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                                const ImageViewT<std::int32_t>& segmentation, const Sources& sources,
                                double fwhm, double gain, double readNoise, const ApertureParams& params,
                                RunContext& ctx) {
    if (ctx.backend == Backend::Cuda && cudaStages().aperture)
        return cudaStages().aperture(image, mask, bkg, segmentation, sources, fwhm, gain, readNoise, params,
                                     ctx);
    return cpu::measureApertures(image, mask, bkg, segmentation, sources, fwhm, gain, readNoise, params, ctx);
}

ApertureResult measureApertures(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                                const SegmentationMap& segmentation, const Sources& sources, double fwhm,
                                double gain, double readNoise, const ApertureParams& params,
                                RunContext& ctx) {
    if (ctx.backend == Backend::Cuda && cudaStages().apertureMap)
        return cudaStages().apertureMap(image, mask, bkg, segmentation, sources, fwhm, gain, readNoise,
                                        params, ctx);
    const ImageViewT<std::int32_t> seg =
        segmentation.empty() ? ImageViewT<std::int32_t>{} : segmentation.view();
    return cpu::measureApertures(image, mask, bkg, seg, sources, fwhm, gain, readNoise, params, ctx);
}

} // namespace gpuphot
