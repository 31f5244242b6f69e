#include "core/stages/psf/psf.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numbers>
#include <numeric>
#include <omp.h>
#include <optional>
#include <string>

#include "core/model/sources.hpp"
#include "core/pipeline/cuda_stages.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/aperture/aperture_overlap.hpp"
#include "core/stages/background/background.hpp"
#include "core/stages/crossmatch/crossmatch.hpp"
#include "core/stages/psf/psf_epsf.hpp"
#include "core/stages/psf/psf_flux_math.hpp"
#include "core/util/errors.hpp"
#include "core/util/parallel.hpp"
#include "core/util/step_timer.hpp"

namespace gpuphot {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kSigmaToFwhm = 2.3548200450309493; // 2 sqrt(2 ln 2)
constexpr int kChunk = 256;                         // items between cancellation checks

double medianOf(std::vector<double> v) {
    if (v.empty()) return kNaN;
    const std::size_t n = v.size();
    std::sort(v.begin(), v.end());
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The same value by selection, for values that are all finite and positive (no NaN, no signed zeros: then
// the order statistics are the full sort's, bit for bit): the sizes of every source of a large frame.
double medianOfPositive(std::vector<double> v) {
    if (v.empty()) return kNaN;
    const std::size_t n = v.size();
    const auto mid = v.begin() + static_cast<std::ptrdiff_t>(n / 2);
    std::nth_element(v.begin(), mid, v.end());
    if (n % 2) return *mid;
    return 0.5 * (*std::max_element(v.begin(), mid) + *mid);
}

// Robust sigma: 1.4826 * median absolute deviation from the median.
double madSigma(const std::vector<double>& v) {
    const double med = medianOf(v);
    std::vector<double> d(v.size());
    for (std::size_t k = 0; k < v.size(); ++k)
        d[k] = std::abs(v[k] - med);
    return 1.4826 * medianOf(d);
}

int termCount(int order) {
    return (order + 1) * (order + 2) / 2;
}

// Monomials u^i v^j, i + j = degree, by degree then decreasing i: pow(u, i) * pow(v, j), the powers
// computed once per exponent (the same values as calling std::pow for every term, 2 * (order + 1) calls
// instead of (order + 1) * (order + 2)).
void monomials(int order, double u, double v, double* out) {
    constexpr int kMax = 3; // validate(): polyOrder 0..3
    if (order > kMax) {
        int k = 0;
        for (int deg = 0; deg <= order; ++deg)
            for (int i = deg; i >= 0; --i)
                out[k++] = std::pow(u, i) * std::pow(v, deg - i);
        return;
    }
    double pu[kMax + 1], pv[kMax + 1];
    for (int i = 0; i <= order; ++i) {
        pu[i] = std::pow(u, i);
        pv[i] = std::pow(v, i);
    }
    int k = 0;
    for (int deg = 0; deg <= order; ++deg)
        for (int i = deg; i >= 0; --i)
            out[k++] = pu[i] * pv[deg - i];
}

SpatialPoly fitPoly(int order, const std::vector<double>& u, const std::vector<double>& v,
                    const std::vector<double>& val) {
    SpatialPoly p;
    p.order = order;
    const int nt = termCount(order), n = static_cast<int>(val.size());
    Eigen::MatrixXd a(n, nt);
    Eigen::VectorXd b(n);
    std::vector<double> row(nt);
    for (int r = 0; r < n; ++r) {
        monomials(order, u[r], v[r], row.data());
        for (int c = 0; c < nt; ++c)
            a(r, c) = row[c];
        b(r) = val[r];
    }
    const Eigen::VectorXd x = a.colPivHouseholderQr().solve(b);
    p.coeffs.assign(x.data(), x.data() + nt);
    double ss = 0.0;
    for (int r = 0; r < n; ++r) {
        const double res = val[r] - p.eval(u[r], v[r]);
        ss += res * res;
    }
    p.rms = n > 0 ? std::sqrt(ss / n) : 0.0;
    return p;
}

// Upper 1 % point of chi-square with d degrees of freedom (Wilson-Hilferty; within 2 % for d >= 1).
double chiSquare99(int d) {
    const double k = 2.0 / (9.0 * d), c = 1.0 - k + 2.3263 * std::sqrt(k);
    return d * c * c * c;
}

// The polynomial of the lowest order up to `maxOrder` whose fit is not significantly worse (1 %) than
// the next higher order's, the noise from the highest order's residuals. A quantity that does not vary
// over the field gets a constant: the higher terms would only fit the stars' noise, largest where the
// fit extrapolates (the corners), and every use of the model's local value would inherit it.
SpatialPoly fitPolySignificant(int maxOrder, const std::vector<double>& u, const std::vector<double>& v,
                               const std::vector<double>& val) {
    SpatialPoly best = fitPoly(maxOrder, u, v, val);
    const int n = static_cast<int>(val.size());
    const double dofMax = n - termCount(maxOrder);
    if (maxOrder == 0 || dofMax < 1.0 || !(best.rms > 0.0)) return best;
    const double var = best.rms * best.rms * n / dofMax;
    for (int o = maxOrder - 1; o >= 0; --o) {
        SpatialPoly lower = fitPoly(o, u, v, val);
        const double dChi2 = n * (lower.rms * lower.rms - best.rms * best.rms) / var;
        if (dChi2 > chiSquare99(termCount(best.order) - termCount(o))) break;
        best = std::move(lower);
    }
    return best;
}

double normCoord(double p, int size) {
    return size > 1 ? 2.0 * p / (size - 1) - 1.0 : 0.0;
}

struct Candidate {
    int index;
    double flux, x, y;
};

} // namespace

void validate(const PsfParams& p) {
    auto bad = [](const std::string& what) { throw InvalidInput("PSF parameters: " + what); };
    if (p.moffatBeta <= 1.0 || !(p.betaMin > 0.0) || p.betaMin > p.betaMax)
        bad("moffatBeta must exceed 1 and betaMin <= betaMax");
    if (p.pixelIntegration < 1 || p.pixelIntegration > 5) bad("pixelIntegration must be 1..5");
    if (p.stampRadius < 0 || p.stampRadius > 200) bad("stampRadius must be 0 (auto) .. 200 px");
    if (p.maxStars < 1) bad("maxStars must be >= 1");
    if (p.maxStarsPerCell < 0) bad("maxStarsPerCell must be >= 0 (0: no cap)");
    if (p.polyOrder < 0 || p.polyOrder > 3) bad("polyOrder must be 0..3");
    if (p.epsfOversampling < 1 || p.epsfOversampling > 16) bad("epsfOversampling must be 1..16");
    if (p.gridNx < 1 || p.gridNy < 1 || p.gridNx > 32 || p.gridNy > 32) bad("gridNx, gridNy must be 1..32");
    if (!(p.clipSigma > 0.0)) bad("clipSigma must be positive");
    if (p.maxIterations < 1) bad("maxIterations must be >= 1");
    if (p.minStarsPerTerm < 1) bad("minStarsPerTerm must be >= 1");
    if (p.psfFitRadius < 0.0) bad("psfFitRadius must be >= 0");
}

double SpatialPoly::eval(double u, double v) const {
    if (coeffs.empty()) return kNaN;
    double t[10];
    monomials(order, u, v, t);
    return evalMonomials(t);
}

double SpatialPoly::evalMonomials(const double* t) const {
    if (coeffs.empty()) return kNaN;
    double s = 0.0;
    for (std::size_t k = 0; k < coeffs.size(); ++k)
        s += coeffs[k] * t[k];
    return s;
}

double PsfResult::fwhmAt(double x, double y) const {
    return fwhmPoly.eval(normCoord(x, width), normCoord(y, height));
}

double PsfResult::ellipticityAt(double x, double y) const {
    const double u = normCoord(x, width), v = normCoord(y, height);
    return std::hypot(e1Poly.eval(u, v), e2Poly.eval(u, v));
}

namespace {
double thetaOf(double e1, double e2) {
    double t = 0.5 * std::atan2(e2, e1) * 180.0 / std::numbers::pi;
    if (t <= -90.0) t += 180.0;
    return t;
}
} // namespace

double PsfResult::thetaAt(double x, double y) const {
    const double u = normCoord(x, width), v = normCoord(y, height);
    return thetaOf(e1Poly.eval(u, v), e2Poly.eval(u, v));
}

PsfResult::ShapeAt PsfResult::shapeAt(double x, double y) const {
    const double u = normCoord(x, width), v = normCoord(y, height);
    // The monomials once per distinct order (the three polynomials usually share one).
    double t[3][10];
    const SpatialPoly* polys[3] = {&fwhmPoly, &e1Poly, &e2Poly};
    double value[3];
    for (int p = 0; p < 3; ++p) {
        int same = -1;
        for (int q = 0; q < p && same < 0; ++q)
            if (polys[q]->order == polys[p]->order) same = q;
        if (same < 0) {
            monomials(polys[p]->order, u, v, t[p]);
            same = p;
        }
        value[p] = polys[p]->evalMonomials(t[same]);
    }
    return {value[0], std::hypot(value[1], value[2]), thetaOf(value[1], value[2])};
}

double encircledEnergy(PsfModelKind kind, double fwhm, double beta, double r) {
    if (!(fwhm > 0.0) || !(r >= 0.0)) return std::nan("");
    if (kind == PsfModelKind::Moffat && beta > 1.0) {
        const double alpha = fwhm / (2.0 * std::sqrt(std::pow(2.0, 1.0 / beta) - 1.0));
        return 1.0 - std::pow(1.0 + (r / alpha) * (r / alpha), 1.0 - beta);
    }
    const double sigma = fwhm / (2.0 * std::sqrt(2.0 * std::log(2.0)));
    return 1.0 - std::exp(-0.5 * (r / sigma) * (r / sigma));
}

double PsfResult::encircledEnergy(double r) const {
    if (!hasModel()) return std::nan("");
    return gpuphot::encircledEnergy(model, medianFwhm, medianBeta, r);
}

std::vector<double> PsfResult::apertureFractions(const std::vector<double>& radii) const {
    std::vector<double> out(radii.size(), std::nan(""));
    if (!hasModel() || !(medianFwhm > 0.0)) return out;
    const bool moffat = model == PsfModelKind::Moffat && medianBeta > 1.0;
    const PsfModelKind kind = moffat ? PsfModelKind::Moffat : PsfModelKind::Gaussian;
    ProfileParams prof;
    prof.amplitude = 1.0;
    prof.beta = moffat ? medianBeta : 3.0;
    setProfileShape(prof, kind, medianFwhm, 0.0, 0.0);
    const double total = profileFlux(prof, kind);
    double rMax = 0.0;
    for (double r : radii)
        if (std::isfinite(r)) rMax = std::max(rMax, r);
    if (!(total > 0.0) || !std::isfinite(total)) return out;
    // centre offsets on a 4 x 4 grid over the pixel's quarter [0, 0.5)^2 (the circular profile and the
    // pixel grid are symmetric under x -> -x, y -> -y and x <-> y, so a quarter covers all offsets)
    constexpr int kOff = 4;
    const int half = static_cast<int>(std::ceil(rMax)) + 1;
    const int side = 2 * half + 1;
    // one offset per task, its sums kept apart and added in the serial order after: bitwise one thread's
    const std::size_t nr = radii.size();
    std::vector<double> partial(static_cast<std::size_t>(kOff * kOff) * nr, 0.0);
    ParallelErrors errors;
#pragma omp parallel for schedule(static)                                                                    \
    num_threads(std::min(kOff* kOff, omp_get_max_threads())) if (rMax > 4.0)
    for (int o = 0; o < kOff * kOff; ++o)
        errors.run([&] {
            const int oy = o / kOff, ox = o % kOff;
            ProfileParams pr = prof;
            std::vector<double> pix(static_cast<std::size_t>(side) * side);
            const double cx = (ox + 0.5) / (2.0 * kOff), cy = (oy + 0.5) / (2.0 * kOff);
            pr.x0 = cx;
            pr.y0 = cy;
            for (int py = -half; py <= half; ++py)
                for (int px = -half; px <= half; ++px)
                    pix[static_cast<std::size_t>(py + half) * side + (px + half)] =
                        profileValue(pr, kind, px, py, 5);
            for (std::size_t k = 0; k < nr; ++k) {
                const double r = radii[k];
                if (!(r >= 0.0) || !std::isfinite(r)) continue;
                const int rr = static_cast<int>(std::ceil(r)) + 1;
                double f = 0.0;
                for (int py = -rr; py <= rr; ++py)
                    for (int px = -rr; px <= rr; ++px) {
                        const double w = circlePixelOverlap(cx, cy, r, px, py);
                        if (w > 0.0) f += w * pix[static_cast<std::size_t>(py + half) * side + (px + half)];
                    }
                partial[static_cast<std::size_t>(o) * nr + k] = f;
            }
        });
    errors.rethrow();
    std::vector<double> sum(nr, 0.0);
    for (int o = 0; o < kOff * kOff; ++o)
        for (std::size_t k = 0; k < nr; ++k)
            sum[k] += partial[static_cast<std::size_t>(o) * nr + k];
    for (std::size_t k = 0; k < radii.size(); ++k)
        if (radii[k] >= 0.0 && std::isfinite(radii[k])) out[k] = sum[k] / (kOff * kOff * total);
    return out;
}

namespace {
bool sameBits(double a, double b) {
    return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}
bool sameOptions(const LmOptions& a, const LmOptions& b) {
    return a.maxIterations == b.maxIterations && sameBits(a.relTolerance, b.relTolerance) &&
           sameBits(a.posTolerance, b.posTolerance) && a.fitBeta == b.fitBeta &&
           a.fitBackground == b.fitBackground && sameBits(a.betaMin, b.betaMin) &&
           sameBits(a.betaMax, b.betaMax) && sameBits(a.maxShift, b.maxShift) && a.nQuad == b.nQuad;
}
bool sameStart(const ProfileParams& a, const ProfileParams& b) {
    return sameBits(a.x0, b.x0) && sameBits(a.y0, b.y0) && sameBits(a.amplitude, b.amplitude) &&
           sameBits(a.background, b.background) && sameBits(a.c11, b.c11) && sameBits(a.c12, b.c12) &&
           sameBits(a.c22, b.c22) && sameBits(a.beta, b.beta);
}
static_assert(sizeof(FitSample) == 4 * sizeof(double), "FitSample is compared bytewise: no padding");
std::size_t entryBytes(const PsfFitCache::Entry& e) {
    return sizeof(PsfFitCache::Entry) + e.samples.size() * sizeof(FitSample) + 64;
}
} // namespace

std::uint64_t PsfFitCache::key(int ix, int iy) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(iy)) << 32) |
           static_cast<std::uint32_t>(ix);
}

void PsfFitCache::clear() {
    m_entries.clear();
    m_bytes = 0;
}

void PsfFitCache::beginRun() {
    ++m_run;
    m_hits = m_misses = 0;
}

const PsfFitCache::Entry* PsfFitCache::find(int ix, int iy, PsfModelKind kind, const ProfileParams& start,
                                            const LmOptions& options,
                                            const std::vector<FitSample>& samples) const {
    const auto [first, last] = m_entries.equal_range(key(ix, iy));
    for (auto it = first; it != last; ++it) {
        const Entry& e = it->second;
        if (e.ix != ix || e.iy != iy || e.kind != kind || !sameStart(e.start, start) ||
            !sameOptions(e.options, options) || e.samples.size() != samples.size())
            continue;
        if (!samples.empty() &&
            std::memcmp(e.samples.data(), samples.data(), samples.size() * sizeof(FitSample)) != 0)
            continue;
        return &e;
    }
    return nullptr;
}

void PsfFitCache::touch(const Entry* entry) {
    ++m_hits;
    const_cast<Entry*>(entry)->lastUsed = m_run; // entries are only handed out by find() on this cache
}

void PsfFitCache::insert(Entry entry) {
    ++m_misses;
    entry.lastUsed = m_run;
    m_bytes += entryBytes(entry);
    const std::uint64_t k = key(entry.ix, entry.iy);
    m_entries.emplace(k, std::move(entry));
    if (m_bytes > m_maxBytes) evict();
}

void PsfFitCache::evict() {
    // Least recently used first (ties: by position, so eviction is deterministic); down to 3/4 of the cap.
    std::vector<std::pair<std::pair<std::uint64_t, std::uint64_t>, decltype(m_entries)::iterator>> order;
    order.reserve(m_entries.size());
    for (auto it = m_entries.begin(); it != m_entries.end(); ++it)
        order.push_back({{it->second.lastUsed, it->first}, it});
    std::stable_sort(order.begin(), order.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [when, it] : order) {
        if (m_bytes <= m_maxBytes / 4 * 3) break;
        m_bytes -= std::min(m_bytes, entryBytes(it->second));
        m_entries.erase(it);
    }
}

void measurePsfFluxes(PsfResult& res, const PsfFrame& frame, const Sources& sources, const PsfParams& params,
                      RunContext& ctx) {
    const int nThreads = ctx.threadCount();
    const int n = static_cast<int>(sources.size());
    for (int k0 = 0; k0 < n; k0 += 16 * kChunk) {
        const int k1 = std::min(n, k0 + 16 * kChunk);
        ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 16) num_threads(nThreads)
        for (int k = k0; k < k1; ++k)
            errors.run([&] {
                PsfFluxResult fr;
                if (res.hasModel() && std::isfinite(sources.x[k]) && std::isfinite(sources.y[k]))
                    fr = fitPsfFlux(frame, res, sources.x[k], sources.y[k],
                                    psfmath::fitRadius(params.psfFitRadius, res.fwhm[k]),
                                    params.psfFitBackground, params.maxMaskedPsfWeight);
                if (fr.ok) {
                    res.fluxPsf[k] = fr.flux;
                    res.fluxPsfErr[k] = fr.fluxErr;
                } else {
                    res.flags[k] |= FlagPsfFitFailed;
                }
            });
        errors.rethrow();
        ctx.checkCancelled();
        ctx.report("psf", 0.75 + 0.25 * k1 / std::max(n, 1));
    }
}

PsfResult cpu::buildPsfModel(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                             const Sources& sources, double gain, const PsfParams& params, RunContext& ctx) {
    return cpu::buildPsfModel(image, mask, bkg, sources, gain, params, ctx, nullptr);
}

namespace {

// The frame's maps must match the image: every step indexes them with the image's pixel coordinates.
void checkFrameSizes(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg) {
    if (image.empty()) throw InvalidInput("PSF stage: empty image");
    if (!mask.empty() && (mask.width != image.width || mask.height != image.height))
        throw InvalidInput("PSF stage: mask size differs from the image size");
    for (const Image<float>* m : {&bkg.level, &bkg.rms})
        if (!m->empty() && (m->width() != image.width || m->height() != image.height))
            throw InvalidInput("PSF stage: background map size differs from the image size");
}

// The result before any star is fitted: the frame's size and per-source columns of NaN (no flags).
void initResult(PsfResult& res, PsfModelKind kind, const ImageView& image, std::size_t nSrc) {
    res.model = kind;
    res.width = image.width;
    res.height = image.height;
    res.fwhm.assign(nSrc, kNaN);
    res.ellipticity.assign(nSrc, kNaN);
    res.theta.assign(nSrc, kNaN);
    res.fluxPsf.assign(nSrc, kNaN);
    res.fluxPsfErr.assign(nSrc, kNaN);
    res.flags.assign(nSrc, 0u);
}

// Per-source quantities of the catalogue that the selection and the fits test.
struct SourceTests {
    const Sources& sources;

    // Isophotal signal-to-noise ratio (NaN without a usable error).
    double snr(std::size_t k) const {
        const double f = sources.fluxIso[k], e = sources.fluxIsoErr[k];
        return (e > 0.0 && std::isfinite(e)) ? f / e : kNaN;
    }
    bool finitePos(std::size_t k) const { return std::isfinite(sources.x[k]) && std::isfinite(sources.y[k]); }
    // The FWHM of a Gaussian with the source's moments (> 0, or NaN).
    double size(std::size_t k) const {
        const double a = sources.a[k], b = sources.b[k];
        return (a > 0.0 && b > 0.0 && std::isfinite(a * b)) ? kSigmaToFwhm * std::sqrt(a * b) : kNaN;
    }
};

// The FWHM guess (for the fits' starts and shift limit), the stamp radius and the isolation radius.
struct StampSetup {
    double fwhmGuess;
    int radius;
    double isoR;
};

// The guess is the median size of the selectable sources (of all sources when none is selectable).
StampSetup chooseStamp(const SourceTests& src, std::size_t nSrc, const PsfParams& params) {
    std::vector<double> sizes;
    for (std::size_t k = 0; k < nSrc; ++k)
        if (!(src.sources.flags[k] & params.excludeFlags) && src.snr(k) >= params.minSnr &&
            std::isfinite(src.size(k)))
            sizes.push_back(src.size(k));
    if (sizes.empty())
        for (std::size_t k = 0; k < nSrc; ++k)
            if (std::isfinite(src.size(k))) sizes.push_back(src.size(k));
    double fwhmGuess = sizes.empty() ? 3.0 : medianOfPositive(sizes); // size(): > 0 or NaN (not kept)
    fwhmGuess = std::clamp(fwhmGuess, 1.0, 20.0);
    const int radius = params.stampRadius > 0
                           ? params.stampRadius
                           : std::clamp(static_cast<int>(std::ceil(4.0 * fwhmGuess)), 5, 30);
    const double isoR = params.isolationRadius > 0.0 ? params.isolationRadius : 1.5 * radius;
    return {fwhmGuess, radius, isoR};
}

// Whether no other source centre lies within isoR of source k's (x, y), on a grid of all source centres
// whose cells are at least isoR wide.
bool isIsolated(const detail::PointGrid& g, std::size_t k, double x, double y, double isoR) {
    bool isolated = true;
    g.visit(x, y, isoR, [&](std::uint32_t j) {
        if (isolated && g.index[j] != k && std::hypot(g.sx[j] - x, g.sy[j] - y) < isoR) isolated = false;
    });
    return isolated;
}

// Each source's candidate test (position, flags, S/N, stamp inside the frame, not near saturation,
// isolated) in parallel, one byte each.
std::vector<std::uint8_t> markCandidates(const SourceTests& src, std::size_t nSrc, const PsfFrame& frame,
                                         const ImageView& image, const PsfParams& params,
                                         const StampSetup& stamp, int nThreads) {
    const Sources& sources = src.sources;
    const int radius = stamp.radius;
    const detail::PointGrid grid(sources.x, sources.y, nSrc, 0.0, 0.0, image.width, image.height,
                                 std::max(stamp.isoR, 1.0));
    std::vector<std::uint8_t> isCand(nSrc, 0);
#pragma omp parallel for schedule(static) num_threads(nThreads)
    for (std::ptrdiff_t kk = 0; kk < static_cast<std::ptrdiff_t>(nSrc); ++kk) {
        const std::size_t k = static_cast<std::size_t>(kk);
        if (!src.finitePos(k) || (sources.flags[k] & params.excludeFlags)) continue;
        if (!(src.snr(k) >= params.minSnr) || !(sources.fluxIso[k] > 0.0)) continue;
        const double x = sources.x[k], y = sources.y[k];
        const int ix = static_cast<int>(std::lround(x)), iy = static_cast<int>(std::lround(y));
        if (ix - radius < 0 || iy - radius < 0 || ix + radius >= image.width || iy + radius >= image.height)
            continue;
        if (params.saturation > 0.0 &&
            sources.peak[k] + frame.level(ix, iy) >= params.maxPeakFraction * params.saturation)
            continue;
        isCand[k] = isIsolated(grid, k, x, y, stamp.isoR) ? 1 : 0;
    }
    return isCand;
}

// At most maxStarsPerCell candidates in each ePSF cell, brightest first (the order of cands).
void capPerCell(std::vector<Candidate>& cands, const PsfParams& params, const ImageView& image) {
    std::vector<int> perCell(static_cast<std::size_t>(params.gridNx) * params.gridNy, 0);
    auto cellOf = [](double p, int size, int n) {
        return std::clamp(static_cast<int>(std::floor((p + 0.5) * n / size)), 0, n - 1);
    };
    std::vector<Candidate> kept;
    for (const Candidate& c : cands) {
        const int cell = cellOf(c.y, image.height, params.gridNy) * params.gridNx +
                         cellOf(c.x, image.width, params.gridNx);
        if (++perCell[static_cast<std::size_t>(cell)] <= params.maxStarsPerCell) kept.push_back(c);
    }
    cands.swap(kept);
}

// The PSF star candidates, gathered in source order, then brightest first (ties by position and index),
// capped per ePSF cell and in total.
std::vector<Candidate> selectCandidates(const SourceTests& src, std::size_t nSrc, const PsfFrame& frame,
                                        const ImageView& image, const PsfParams& params,
                                        const StampSetup& stamp, int nThreads) {
    const Sources& sources = src.sources;
    const std::vector<std::uint8_t> isCand = markCandidates(src, nSrc, frame, image, params, stamp, nThreads);
    std::vector<Candidate> cands;
    for (std::size_t k = 0; k < nSrc; ++k)
        if (isCand[k]) cands.push_back({static_cast<int>(k), sources.fluxIso[k], sources.x[k], sources.y[k]});
    std::sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& b) {
        if (a.flux != b.flux) return a.flux > b.flux;
        if (a.y != b.y) return a.y < b.y;
        if (a.x != b.x) return a.x < b.x;
        return a.index < b.index;
    });
    if (params.maxStarsPerCell > 0) capPerCell(cands, params, image);
    if (static_cast<int>(cands.size()) > params.maxStars) cands.resize(params.maxStars);
    return cands;
}

// The Levenberg-Marquardt options of the star fits (the shift limit from the FWHM guess).
LmOptions profileFitOptions(const PsfParams& params, double fwhmGuess) {
    LmOptions lm;
    lm.maxIterations = params.maxIterations;
    lm.fitBeta = params.fitBeta;
    lm.betaMin = params.betaMin;
    lm.betaMax = params.betaMax;
    lm.nQuad = params.pixelIntegration;
    lm.maxShift = std::max(1.0, 0.5 * fwhmGuess);
    return lm;
}

// What every step of the profile fits reads.
struct FitInputs {
    const ImageView& image;
    const PsfFrame& frame;
    const SourceTests& src;
    const PsfParams& params;
    const LmOptions& lm;
    PsfModelKind kind;
    int radius;
    double fwhmGuess;
    double gain;
    PsfFitCache* cache;
    int nThreads;
    const RunContext& ctx; // its cancel request stops a block's fits early
};

// Per star of a block of fits: its samples and start, its cache hit, and whether it is fitted (not
// skipped, not a hit); reused from block to block.
struct FitBlock {
    std::vector<std::vector<FitSample>> stamp;
    std::vector<ProfileParams> starts;
    std::vector<const PsfFitCache::Entry*> hits;
    std::vector<char> toFit;
    std::vector<ProfileFitResult> fits;

    explicit FitBlock(std::size_t n) : stamp(n), starts(n), hits(n, nullptr), toFit(n, 0), fits(n) {}
};

// One star's stamp (unmasked pixels within the radius, inverse-variance weights) and fit start; a
// saturated or too masked star is skipped, a cached identical fit taken as it is.
void prepareStar(const FitInputs& in, int k, PsfStar& st, FitBlock& blk, std::size_t slot) {
    const Sources& sources = in.src.sources;
    const PsfFrame& frame = in.frame;
    const int radius = in.radius;
    const double gain = in.gain;
    st.index = k;
    const double x = sources.x[k], y = sources.y[k];
    const int ix = static_cast<int>(std::lround(x)), iy = static_cast<int>(std::lround(y));
    std::vector<FitSample>& samples = blk.stamp[slot];
    samples.clear();
    samples.reserve(static_cast<std::size_t>(2 * radius + 1) * (2 * radius + 1));
    blk.hits[slot] = nullptr;
    blk.toFit[slot] = 0;
    int nMasked = 0, nAll = 0;
    bool saturated = false;
    double maxVal = 0.0;
    for (int j = iy - radius; j <= iy + radius; ++j)
        for (int i = ix - radius; i <= ix + radius; ++i) {
            if ((i - ix) * (i - ix) + (j - iy) * (j - iy) > radius * radius) continue;
            ++nAll;
            const std::uint8_t mb = frame.maskBits(i, j);
            if (mb & MaskSaturated) saturated = true;
            if (mb) {
                ++nMasked;
                continue;
            }
            const double v = in.image(i, j) - frame.level(i, j);
            const double r = frame.rms(i, j);
            double var = r * r + (gain > 0.0 ? std::max(v, 0.0) / gain : 0.0);
            if (!(var > 0.0)) var = 1.0;
            samples.push_back({static_cast<double>(i), static_cast<double>(j), v, 1.0 / var});
            maxVal = std::max(maxVal, v);
        }
    st.fit.x0 = x;
    st.fit.y0 = y;
    if (saturated || nMasked > in.params.maxMaskedFraction * nAll) return;
    ProfileParams& start = blk.starts[slot];
    start = ProfileParams{};
    start.x0 = x;
    start.y0 = y;
    start.amplitude = sources.peak[k] > 0.0 ? sources.peak[k] : maxVal;
    start.background = 0.0;
    start.beta = in.params.moffatBeta;
    double f0 = in.src.size(k);
    if (!(f0 > 0.5 && f0 < 4.0 * in.fwhmGuess)) f0 = in.fwhmGuess;
    setProfileShape(start, in.kind, f0, 0.0, 0.0);
    blk.hits[slot] = in.cache ? in.cache->find(ix, iy, in.kind, start, in.lm, samples) : nullptr;
    if (blk.hits[slot])
        blk.fits[slot] = blk.hits[slot]->result;
    else
        blk.toFit[slot] = 1;
}

// The stamps of stars c0 .. c1 - 1 (parallel, one slot per star).
void prepareStamps(const FitInputs& in, const std::vector<Candidate>& cands, PsfResult& res, FitBlock& blk,
                   int c0, int c1) {
    ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 1) num_threads(in.nThreads)
    for (int c = c0; c < c1; ++c)
        errors.run(
            [&] { prepareStar(in, cands[c].index, res.stars[c], blk, static_cast<std::size_t>(c - c0)); });
    errors.rethrow();
}

// The fits of the block's stars to fit: the batch (the CUDA backend's, one device block per star) or the
// host loop; the same bits either way (core/stages/psf/psf_fit_math.hpp).
void runFits(const FitInputs& in, FitBlock& blk, int c0, int c1, const ProfileFitBatch* fitBatch) {
    std::vector<int> todo;
    for (int c = c0; c < c1; ++c)
        if (blk.toFit[static_cast<std::size_t>(c - c0)]) todo.push_back(c - c0);
    if (fitBatch && !todo.empty()) {
        std::vector<ProfileFitJob> jobs(todo.size());
        for (std::size_t t = 0; t < todo.size(); ++t)
            jobs[t] = {&blk.stamp[static_cast<std::size_t>(todo[t])],
                       blk.starts[static_cast<std::size_t>(todo[t])]};
        std::vector<ProfileFitResult> out(todo.size());
        (*fitBatch)(jobs, in.kind, in.lm, out);
        for (std::size_t t = 0; t < todo.size(); ++t)
            blk.fits[static_cast<std::size_t>(todo[t])] = out[t];
    } else {
        const int nTodo = static_cast<int>(todo.size());
        ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 1) num_threads(in.nThreads)
        for (int t = 0; t < nTodo; ++t)
            errors.run([&] {
                if (in.ctx.cancelRequested()) return; // the block is discarded
                const std::size_t slot = static_cast<std::size_t>(todo[static_cast<std::size_t>(t)]);
                blk.fits[slot] =
                    fitProfile(blk.stamp[slot], in.kind, blk.starts[slot], in.lm, in.ctx.cancelFlag);
            });
        errors.rethrow();
    }
}

// The block's fit results (hits and new fits) into its stars, with their shape, flux and whether the fit
// counts as converged.
void storeFits(const FitInputs& in, const FitBlock& blk, PsfResult& res, int c0, int c1) {
    for (int c = c0; c < c1; ++c) {
        const std::size_t slot = static_cast<std::size_t>(c - c0);
        if (!blk.hits[slot] && !blk.toFit[slot]) continue; // skipped: saturated or masked
        PsfStar& st = res.stars[c];
        const ProfileFitResult& fr = blk.fits[slot];
        st.fit = fr.params;
        st.chi2 = fr.chi2;
        st.iterations = fr.iterations;
        st.shape = profileShape(fr.params, in.kind);
        st.flux = profileFlux(fr.params, in.kind);
        st.converged = fr.converged && std::isfinite(st.shape.fwhm) && st.shape.fwhm > 0.5 &&
                       st.shape.fwhm < 2.0 * in.radius && std::isfinite(st.flux) && st.flux > 0.0;
    }
}

// The block's hits and new fits merged into the cache, serially in star order; hits first, as an insert
// may evict entries. The new fits' stamps are moved into the cache.
void updateFitCache(const FitInputs& in, FitBlock& blk, const PsfResult& res, int c0, int c1) {
    PsfFitCache* cache = in.cache;
    const Sources& sources = in.src.sources;
    for (int c = c0; c < c1; ++c)
        if (blk.hits[static_cast<std::size_t>(c - c0)])
            cache->touch(blk.hits[static_cast<std::size_t>(c - c0)]);
    for (int c = c0; c < c1; ++c) {
        const std::size_t slot = static_cast<std::size_t>(c - c0);
        if (!blk.toFit[slot]) continue;
        const PsfStar& st = res.stars[c];
        const int ix = static_cast<int>(std::lround(sources.x[st.index]));
        const int iy = static_cast<int>(std::lround(sources.y[st.index]));
        cache->insert(PsfFitCache::Entry{ix, iy, in.kind, blk.starts[slot], in.lm, std::move(blk.stamp[slot]),
                                         blk.fits[slot], 0});
    }
}

// The profile fits of all candidates into res.stars, in blocks between cancellation checks.
void fitProfiles(const FitInputs& in, const std::vector<Candidate>& cands, PsfResult& res,
                 const ProfileFitBatch* fitBatch, RunContext& ctx) {
    const int nCand = static_cast<int>(cands.size());
    // Blocks of at least 64 fits a thread between cancellation checks (a fit takes ~1-3 ms): with 256 a
    // block, a 3 x 3 grid's 270 stars ran as 256 + 14 on 16 threads, the second block on 7 of them.
    // A batch (the device's) takes up to 4096 stars at a time: one launch for a usual frame's stars.
    const int fitChunk = fitBatch ? std::max(kChunk, 4096) : std::max(kChunk, 64 * in.nThreads);
    FitBlock blk(static_cast<std::size_t>(std::min(nCand, fitChunk)));
    for (int c0 = 0; c0 < nCand; c0 += fitChunk) {
        const int c1 = std::min(nCand, c0 + fitChunk);
        prepareStamps(in, cands, res, blk, c0, c1);
        runFits(in, blk, c0, c1, fitBatch);
        ctx.checkCancelled(); // before a cancelled block's missing fits reach the result or the cache
        storeFits(in, blk, res, c0, c1);
        if (in.cache) updateFitCache(in, blk, res, c0, c1);
        ctx.report("psf", 0.05 + 0.45 * c1 / std::max(nCand, 1));
    }
}

// The converged stars, then the gross outliers (galaxies, blends) removed: 2 * clipSigma on the FWHM.
std::vector<int> grossClippedStars(const PsfResult& res, int nCand, const PsfParams& params) {
    std::vector<int> used;
    for (int c = 0; c < nCand; ++c)
        if (res.stars[c].converged) used.push_back(c);
    if (used.size() >= 3) {
        std::vector<double> f;
        for (int c : used)
            f.push_back(res.stars[c].shape.fwhm);
        const double med = medianOf(f), sig = std::max(madSigma(f), 0.002 * med);
        std::erase_if(used, [&](int c) {
            return std::abs(res.stars[c].shape.fwhm - med) > 2.0 * params.clipSigma * sig;
        });
    }
    return used;
}

// The polynomial order for n stars: polyOrder, lowered until minStarsPerTerm stars per term remain.
int chooseOrder(const PsfParams& params, std::size_t n) {
    int o = params.polyOrder;
    while (o > 0 && n < static_cast<std::size_t>(params.minStarsPerTerm * termCount(o)))
        --o;
    return o;
}

// Stars' normalised coordinates and shapes, one entry per star.
struct ShapeSamples {
    std::vector<double> u, v, fw, e1, e2;
};

// The iterative clipping's state: the stars passing the gross clip (indices into res.stars) and their
// samples, which of them are kept, and the kept ones' samples (those of `keep` on every exit of the loop).
struct ClipState {
    std::vector<int> pool;
    ShapeSamples all;
    std::vector<char> keep;
    ShapeSamples kept;
};

ClipState makeClipState(const std::vector<int>& used, const PsfResult& res, const ImageView& image) {
    ClipState cs;
    cs.pool = used;
    for (int c : cs.pool) {
        const PsfStar& s = res.stars[c];
        cs.all.u.push_back(normCoord(s.fit.x0, image.width));
        cs.all.v.push_back(normCoord(s.fit.y0, image.height));
        cs.all.fw.push_back(s.shape.fwhm);
        cs.all.e1.push_back(s.shape.e1);
        cs.all.e2.push_back(s.shape.e2);
    }
    cs.keep.assign(cs.pool.size(), 1);
    return cs;
}

// The kept stars' samples, in pool order.
void gatherKept(ClipState& cs) {
    ShapeSamples& k = cs.kept;
    for (auto* w : {&k.u, &k.v, &k.fw, &k.e1, &k.e2})
        w->clear();
    for (std::size_t i = 0; i < cs.pool.size(); ++i)
        if (cs.keep[i]) {
            k.u.push_back(cs.all.u[i]);
            k.v.push_back(cs.all.v[i]);
            k.fw.push_back(cs.all.fw[i]);
            k.e1.push_back(cs.all.e1[i]);
            k.e2.push_back(cs.all.e2[i]);
        }
}

// Which pool stars pass the clip against res's polynomials (fitted at `order` to the kept stars): the
// scale from the kept stars' residuals (MAD, corrected for the fitted terms); nNext counts them.
std::vector<char> clipAgainstPolys(const ClipState& cs, const PsfResult& res, int order,
                                   const PsfParams& params, std::size_t& nNext) {
    const ShapeSamples& kept = cs.kept;
    const ShapeSamples& all = cs.all;
    const std::size_t n = kept.fw.size();
    std::vector<double> rf(n), r1(n), r2(n);
    for (std::size_t k = 0; k < n; ++k) {
        rf[k] = kept.fw[k] - res.fwhmPoly.eval(kept.u[k], kept.v[k]);
        r1[k] = kept.e1[k] - res.e1Poly.eval(kept.u[k], kept.v[k]);
        r2[k] = kept.e2[k] - res.e2Poly.eval(kept.u[k], kept.v[k]);
    }
    const int nt = termCount(order);
    const double dof = n > static_cast<std::size_t>(nt) ? std::sqrt(double(n) / double(n - nt)) : 1.0;
    // Floors keep noiseless data from clipping on rounding: 0.2% of the FWHM, 0.002 in e1/e2.
    const double sf = std::max(dof * madSigma(rf), 0.002 * medianOf(kept.fw));
    const double s1 = std::max(dof * madSigma(r1), 0.002), s2 = std::max(dof * madSigma(r2), 0.002);
    const double medF = medianOf(rf), med1 = medianOf(r1), med2 = medianOf(r2);
    // (e1, e2) is clipped as one 2-D quantity at the radius with the same tail probability as
    // clipSigma in 1-D: P(chi2_2 > r^2) = exp(-r^2 / 2) = erfc(clipSigma / sqrt 2).
    const double clip2d = std::sqrt(-2.0 * std::log(std::erfc(params.clipSigma / std::numbers::sqrt2)));
    std::vector<char> next(cs.pool.size(), 0);
    nNext = 0;
    for (std::size_t k = 0; k < cs.pool.size(); ++k) {
        const double df = all.fw[k] - res.fwhmPoly.eval(all.u[k], all.v[k]) - medF;
        const double d1 = all.e1[k] - res.e1Poly.eval(all.u[k], all.v[k]) - med1;
        const double d2 = all.e2[k] - res.e2Poly.eval(all.u[k], all.v[k]) - med2;
        next[k] = std::abs(df) <= params.clipSigma * sf && std::hypot(d1 / s1, d2 / s2) <= clip2d;
        nNext += next[k];
    }
    return next;
}

// Iterative clipping against the polynomial fits: every star passing the gross clip is tested at each
// pass (a star clipped early may come back), until the kept set no longer changes; res's FWHM and
// e1 / e2 polynomials are those fitted to the final kept set.
void clipIteratively(ClipState& cs, PsfResult& res, const PsfParams& params) {
    for (int iter = 0; !cs.pool.empty(); ++iter) {
        gatherKept(cs);
        const ShapeSamples& kept = cs.kept;
        const int order = chooseOrder(params, kept.fw.size());
        res.fwhmPoly = fitPoly(order, kept.u, kept.v, kept.fw);
        res.e1Poly = fitPoly(order, kept.u, kept.v, kept.e1);
        res.e2Poly = fitPoly(order, kept.u, kept.v, kept.e2);
        if (iter >= params.clipIterations || kept.fw.size() < 3) break;
        std::size_t nNext = 0;
        std::vector<char> next = clipAgainstPolys(cs, res, order, params, nNext);
        if (next == cs.keep || nNext < 3) break;
        cs.keep.swap(next);
    }
}

// The clipped star set (indices into res.stars) and res's spatial polynomials fitted to it.
std::vector<int> clipStars(PsfResult& res, int nCand, const PsfParams& params, const ImageView& image) {
    ClipState cs = makeClipState(grossClippedStars(res, nCand, params), res, image);
    clipIteratively(cs, res, params);
    std::vector<int> used;
    for (std::size_t k = 0; k < cs.pool.size(); ++k)
        if (cs.keep[k]) used.push_back(cs.pool[k]);
    // The stars clipped, the FWHM is fitted again at the lowest order the kept stars support (the
    // clipping itself ran at the full order, so that a real variation is not clipped away as outliers).
    if (used.size() >= 3)
        res.fwhmPoly = fitPolySignificant(res.fwhmPoly.order, cs.kept.u, cs.kept.v, cs.kept.fw);
    return used;
}

// The used stars marked, the field medians, and every source's FWHM, ellipticity and angle from the model.
void applySpatialModel(PsfResult& res, const std::vector<int>& used, const SourceTests& src, std::size_t nSrc,
                       PsfModelKind kind) {
    const Sources& sources = src.sources;
    std::vector<double> fw, el, be;
    for (int c : used) {
        PsfStar& s = res.stars[c];
        s.used = true;
        res.flags[s.index] |= FlagPsfStar;
        fw.push_back(s.shape.fwhm);
        el.push_back(s.shape.ellipticity);
        be.push_back(s.fit.beta);
    }
    res.nStars = static_cast<int>(used.size());
    res.medianFwhm = medianOf(fw);
    res.medianEllipticity = medianOf(el);
    res.medianBeta = kind == PsfModelKind::Moffat ? medianOf(be) : 0.0;
    // One source per iteration, each writing its own elements: the same numbers for any thread count.
#pragma omp parallel for schedule(static)
    for (std::ptrdiff_t kk = 0; kk < static_cast<std::ptrdiff_t>(nSrc); ++kk) {
        const std::size_t k = static_cast<std::size_t>(kk);
        if (!src.finitePos(k)) continue;
        const PsfResult::ShapeAt at = res.shapeAt(sources.x[k], sources.y[k]);
        res.fwhm[k] = at.fwhm;
        res.ellipticity[k] = at.ellipticity;
        res.theta[k] = at.theta;
    }
}

// ePSF cell (cx, cy)'s region and its stars: the used stars inside it (the last row / column takes its
// far edge), or, when fewer than epsfMinStars, the nearest used stars (ties by index).
void setupEpsfCell(EpsfCell& e, std::vector<const PsfStar*>& members, int cx, int cy, const PsfResult& res,
                   const std::vector<int>& used, const PsfParams& params, const ImageView& image) {
    e.x0 = static_cast<double>(cx) * image.width / res.gridNx - 0.5;
    e.x1 = static_cast<double>(cx + 1) * image.width / res.gridNx - 0.5;
    e.y0 = static_cast<double>(cy) * image.height / res.gridNy - 0.5;
    e.y1 = static_cast<double>(cy + 1) * image.height / res.gridNy - 0.5;
    e.cx = 0.5 * (e.x0 + e.x1);
    e.cy = 0.5 * (e.y0 + e.y1);
    for (int c : used) {
        const PsfStar& s = res.stars[c];
        const bool lastX = cx == res.gridNx - 1, lastY = cy == res.gridNy - 1;
        if (s.fit.x0 >= e.x0 && (s.fit.x0 < e.x1 || lastX) && s.fit.y0 >= e.y0 && (s.fit.y0 < e.y1 || lastY))
            members.push_back(&s);
    }
    const std::size_t want = std::min<std::size_t>(params.epsfMinStars, used.size());
    if (members.size() < want) { // borrow the nearest stars (ties by index)
        std::vector<std::pair<double, int>> d;
        for (int c : used)
            d.push_back({std::hypot(res.stars[c].fit.x0 - e.cx, res.stars[c].fit.y0 - e.cy), c});
        std::sort(d.begin(), d.end());
        members.clear();
        for (std::size_t k = 0; k < want; ++k)
            members.push_back(&res.stars[d[k].second]);
    }
}

// The analytic base of each ePSF cell: the model's shape at the cell centre, centred at 0, unit flux.
std::vector<ProfileParams> epsfBases(const PsfResult& res, PsfModelKind kind) {
    const int nCells = res.gridNx * res.gridNy;
    std::vector<ProfileParams> bases(nCells);
    for (int cell = 0; cell < nCells; ++cell) {
        const EpsfCell& e = res.epsf[cell];
        ProfileParams& base = bases[cell];
        base.beta = kind == PsfModelKind::Moffat ? res.medianBeta : 3.0;
        const double f = std::max(res.fwhmAt(e.cx, e.cy), 0.5);
        setProfileShape(base, kind, f, res.ellipticityAt(e.cx, e.cy), res.thetaAt(e.cx, e.cy));
        base.amplitude = 1.0;
        base.amplitude = 1.0 / profileFlux(base, kind);
    }
    return bases;
}

// The ePSF grid: each cell's region and stars, its analytic base, then the cells: the batch (the CUDA
// backend's, all cells at once on the device) and the host loop for those it left, in parallel, one thread
// each (one cell after another, each on all threads, measured slower: docs/BENCHMARKS.md).
void buildEpsfGrid(PsfResult& res, const std::vector<int>& used, const PsfFrame& frame,
                   const ImageView& image, const PsfParams& params, PsfModelKind kind, int radius,
                   const EpsfCellBatch* epsfBatch, int nThreads, const RunContext& ctx) {
    res.gridNx = params.gridNx;
    res.gridNy = params.gridNy;
    const int nCells = res.gridNx * res.gridNy;
    res.epsf.resize(nCells);
    std::vector<std::vector<const PsfStar*>> members(nCells);
    for (int cell = 0; cell < nCells; ++cell)
        setupEpsfCell(res.epsf[cell], members[cell], cell % res.gridNx, cell / res.gridNx, res, used, params,
                      image);
    const std::vector<ProfileParams> bases = epsfBases(res, kind);
    std::vector<char> done(nCells, 0);
    if (epsfBatch && nCells > 0) {
        std::vector<EpsfCellJob> jobs(nCells);
        for (int cell = 0; cell < nCells; ++cell)
            jobs[cell] = {&res.epsf[cell], &members[cell], bases[cell]};
        (*epsfBatch)(jobs, kind, radius, params.epsfOversampling, params.pixelIntegration, done);
    }
    ParallelErrors errors;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nThreads)
    for (int cell = 0; cell < nCells; ++cell)
        errors.run([&] {
            if (!done[cell] && !ctx.cancelRequested()) // a cancelled grid is discarded
                buildEpsfCell(res.epsf[cell], frame, members[cell], bases[cell], kind, radius,
                              params.epsfOversampling, params.pixelIntegration);
        });
    errors.rethrow();
}

} // namespace

PsfResult cpu::buildPsfModel(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                             const Sources& sources, double gain, const PsfParams& params, RunContext& ctx,
                             PsfFitCache* cache, const ProfileFitBatch* fitBatch,
                             const EpsfCellBatch* epsfBatch) {
    validate(params);
    checkFrameSizes(image, mask, bkg);

    const PsfFrame frame{image, mask, &bkg, gain};
    StepLaps laps(StepTiming::Psf, "psf"); // host laps of the steps below on stderr
    const int nThreads = ctx.threadCount();
    const PsfModelKind kind = params.model;
    const std::size_t nSrc = sources.size();
    const SourceTests src{sources};

    PsfResult res;
    initResult(res, kind, image, nSrc);

    // --- FWHM guess, stamp size, selection ------------------------------------------------------------
    const StampSetup stamp = chooseStamp(src, nSrc, params);
    res.stampRadius = stamp.radius;
    const std::vector<Candidate> cands = selectCandidates(src, nSrc, frame, image, params, stamp, nThreads);
    laps.lap("selection");
    ctx.checkCancelled();
    ctx.report("psf", 0.05);

    // --- profile fits (parallel, one slot per star) ------------------------------------------------
    const LmOptions lm = profileFitOptions(params, stamp.fwhmGuess);
    res.stars.resize(cands.size());
    const int nCand = static_cast<int>(cands.size());
    // Reuse of identical fits (RunContext::psfFitCache): per star, the hit or the new entry; merged into
    // the cache serially after each block, in star order.
    if (cache) cache->beginRun();
    const FitInputs fitIn{image,        frame,           src,  params, lm,       kind,
                          stamp.radius, stamp.fwhmGuess, gain, cache,  nThreads, ctx};
    fitProfiles(fitIn, cands, res, fitBatch, ctx);

    // --- clipping and spatial model (serial, index order) ------------------------------------------
    laps.lap("profile fits");
    const std::vector<int> used = clipStars(res, nCand, params, image);
    if (!used.empty())
        applySpatialModel(res, used, src, nSrc, kind);
    else
        res.fwhmPoly = res.e1Poly = res.e2Poly = SpatialPoly{};
    ctx.checkCancelled();
    ctx.report("psf", 0.6);
    laps.lap("clipping, spatial model, per-source shape");

    // --- ePSF per grid cell -------------------------------------------------------------------------
    if (res.hasModel())
        buildEpsfGrid(res, used, frame, image, params, kind, stamp.radius, epsfBatch, nThreads, ctx);
    ctx.checkCancelled();
    ctx.report("psf", 0.75);
    laps.lap("ePSF cells");

    // --- PSF photometry (parallel, one slot per source) --------------------------------------------
    if (params.psfPhotometry) measurePsfFluxes(res, frame, sources, params, ctx);
    laps.lap("PSF photometry");
    ctx.report("psf", 1.0);
    return res;
}

// The stage's public entry point: the CUDA engine when the backend is CUDA and the kernels are linked
// (core/pipeline/cuda_stages.hpp), else the CPU engine.
PsfResult buildPsfModel(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                        const Sources& sources, double gain, const PsfParams& params, RunContext& ctx) {
    if (ctx.backend == Backend::Cuda && cudaStages().psf)
        return cudaStages().psf(image, mask, bkg, sources, gain, params, ctx);
    return cpu::buildPsfModel(image, mask, bkg, sources, gain, params, ctx);
}

} // namespace gpuphot
