#include "core/stages/aperture.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <numeric>
#include <string>

#include <nlohmann/json.hpp>
#include <omp.h>

#include "core/model/flags.hpp"
#include "core/model/sources.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/stages/aperture_overlap.hpp"
#include "core/stages/background.hpp"
#include "core/util/errors.hpp"

namespace gpuphot {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kFwhmToSigma = 1.0 / 2.3548200450309493; // 1 / (2 sqrt(2 ln 2))
constexpr std::uint8_t kExcludeBits = static_cast<std::uint8_t>(~static_cast<unsigned>(MaskSaturated));

// ---- inputs shared by all sources ----------------------------------------------------------------

struct Inputs {
    ImageView image;
    MaskView mask;                // may be empty
    ImageViewT<std::int32_t> seg; // may be empty
    ImageView level, rms;         // background map (may be empty)
    double saturation = kInf;
    double gain = 0.0;
    double readNoise = 0.0;
};

// The sky under one source: a constant (local annulus) or the per-pixel map.
struct SkyModel {
    bool perPixel = false;
    double level = 0.0;
    double var = 0.0;
};

enum class PixelUse { Use, Exclude };

// Classifies pixel (x, y) for the aperture sums of the source with segment ownId.
inline PixelUse classify(const Inputs& in, int x, int y, std::int32_t ownId, float& value, bool& saturated,
                         bool& foreign) {
    value = in.image(x, y);
    const std::uint8_t m = in.mask.empty() ? 0 : in.mask(x, y);
    if ((m & kExcludeBits) != 0 || !std::isfinite(value)) return PixelUse::Exclude;
    saturated = (m & MaskSaturated) != 0 || value >= in.saturation;
    if (!in.seg.empty()) {
        const std::int32_t s = in.seg(x, y);
        foreign = s != 0 && s != ownId;
    } else {
        foreign = false;
    }
    return PixelUse::Use;
}

inline void pixelSky(const Inputs& in, const SkyModel& sky, int x, int y, double& level, double& var) {
    if (sky.perPixel) {
        level = in.level(x, y);
        const double r = in.rms(x, y);
        var = r * r;
    } else {
        level = sky.level;
        var = sky.var;
    }
}

// Sums of one aperture: Σ w (d - s), Σ w, Σ w² σ², Σ w² (d - s).
struct Sums {
    double flux = 0.0, area = 0.0, varSky = 0.0, poisson = 0.0;
    void add(double w, double v, double var) {
        flux += w * v;
        area += w;
        varSky += w * w * var;
        poisson += w * w * v;
    }
    void addFull(double v, double var) {
        flux += v;
        area += 1.0;
        varSky += var;
        poisson += v;
    }
    void addSums(const Sums& o) {
        flux += o.flux;
        area += o.area;
        varSky += o.varSky;
        poisson += o.poisson;
    }
};

// Nearest distance from the aperture centre of the pixels of each kind: an aperture of radius r holds
// such a pixel when r exceeds that distance.
struct FlagDistances {
    double masked = kInf, crowded = kInf, saturated = kInf, edge = kInf;
    std::uint32_t flagsFor(double r) const {
        std::uint32_t f = 0;
        if (r > masked) f |= FlagApertureMasked;
        if (r > crowded) f |= FlagCrowded;
        if (r > saturated) f |= FlagSaturated;
        if (r > edge) f |= FlagApertureIncomplete;
        return f;
    }
};

struct Scratch {
    std::vector<Sums> sums, partial, full;
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
    sc.keys.resize(n);
    sc.keysTmp.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
        std::uint32_t u;
        std::memcpy(&u, &v[i], sizeof u);
        sc.keys[i] = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
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
        const std::uint32_t k = src[i];
        const std::uint32_t u = (k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k;
        std::memcpy(&v[i], &u, sizeof u);
    }
}

// Sums in concentric circles of ascending radii r[0..n) around (cx, cy). Pixels wholly inside a radius
// are added once to a running "from radius k on" total; only the radii that cut a pixel call the exact
// overlap. Pixel order is fixed (rows, then columns), so the result does not depend on threads.
void sumCircles(const Inputs& in, const SkyModel& sky, double cx, double cy, const std::vector<double>& r,
                std::int32_t ownId, Scratch& sc, std::vector<Sums>& out, FlagDistances& fd) {
    const std::size_t nr = r.size();
    out.assign(nr, Sums{});
    fd = FlagDistances{};
    const int w = in.image.width, h = in.image.height;
    fd.edge = std::min({cx + 0.5, w - 0.5 - cx, cy + 0.5, h - 0.5 - cy});
    if (nr == 0) return;
    sc.partial.assign(nr, Sums{});
    sc.full.assign(nr, Sums{});
    sc.radii2.resize(nr);
    for (std::size_t k = 0; k < nr; ++k)
        sc.radii2[k] = r[k] * r[k];
    const double rmax = r[nr - 1];
    const int x0 = std::max(0, static_cast<int>(std::floor(cx - rmax + 0.5)));
    const int x1 = std::min(w - 1, static_cast<int>(std::ceil(cx + rmax - 0.5)));
    const int y0 = std::max(0, static_cast<int>(std::floor(cy - rmax + 0.5)));
    const int y1 = std::min(h - 1, static_cast<int>(std::ceil(cy + rmax - 0.5)));
    const auto r2begin = sc.radii2.begin(), r2end = sc.radii2.end();
    const double* r2 = sc.radii2.data();
    for (int y = y0; y <= y1; ++y) {
        const double dy0 = y - 0.5 - cy, dy1 = dy0 + 1.0;
        const double ny = dy0 > 0.0 ? dy0 : (dy1 < 0.0 ? dy1 : 0.0);
        const double fy = std::max(dy0 * dy0, dy1 * dy1);
        for (int x = x0; x <= x1; ++x) {
            const double dx0 = x - 0.5 - cx, dx1 = dx0 + 1.0;
            const double nx = dx0 > 0.0 ? dx0 : (dx1 < 0.0 ? dx1 : 0.0);
            const double dmin2 = nx * nx + ny * ny;
            // first radius that reaches into the pixel, first radius that holds the whole pixel
            const double dmax2 = std::max(dx0 * dx0, dx1 * dx1) + fy;
            std::size_t k0, kf;
            if (nr <= 8) {
                k0 = 0;
                while (k0 < nr && r2[k0] <= dmin2)
                    ++k0;
                if (k0 == nr) continue;
                kf = k0;
                while (kf < nr && r2[kf] < dmax2)
                    ++kf;
            } else {
                k0 = static_cast<std::size_t>(std::upper_bound(r2begin, r2end, dmin2) - r2begin);
                if (k0 == nr) continue;
                kf = static_cast<std::size_t>(std::lower_bound(r2begin + k0, r2end, dmax2) - r2begin);
            }
            float value;
            bool saturated = false, foreign = false;
            const double dmin = std::sqrt(dmin2);
            if (classify(in, x, y, ownId, value, saturated, foreign) == PixelUse::Exclude) {
                fd.masked = std::min(fd.masked, dmin);
                continue;
            }
            if (saturated) fd.saturated = std::min(fd.saturated, dmin);
            if (foreign) fd.crowded = std::min(fd.crowded, dmin);
            double level, var;
            pixelSky(in, sky, x, y, level, var);
            const double v = static_cast<double>(value) - level;
            for (std::size_t k = k0; k < kf; ++k) {
                const double wgt = circleRectOverlap(dx0, dy0, dx1, dy1, r[k]);
                sc.partial[k].add(wgt, v, var);
            }
            if (kf < nr) sc.full[kf].addFull(v, var);
        }
    }
    Sums running;
    for (std::size_t k = 0; k < nr; ++k) {
        running.addSums(sc.full[k]);
        out[k] = running;
        out[k].addSums(sc.partial[k]);
    }
}

// Sums in one ellipse (exact overlap); returns the aperture's flags.
std::uint32_t sumEllipse(const Inputs& in, const SkyModel& sky, const EllipseAperture& e, double cx,
                         double cy, std::int32_t ownId, Sums& out) {
    out = Sums{};
    std::uint32_t flags = 0;
    const int w = in.image.width, h = in.image.height;
    const double hx = e.halfWidthX(), hy = e.halfWidthY();
    if (cx - hx < -0.5 || cx + hx > w - 0.5 || cy - hy < -0.5 || cy + hy > h - 0.5)
        flags |= FlagApertureIncomplete;
    const int x0 = std::max(0, static_cast<int>(std::floor(cx - hx + 0.5)));
    const int x1 = std::min(w - 1, static_cast<int>(std::ceil(cx + hx - 0.5)));
    const int y0 = std::max(0, static_cast<int>(std::floor(cy - hy + 0.5)));
    const int y1 = std::min(h - 1, static_cast<int>(std::ceil(cy + hy - 0.5)));
    for (int y = y0; y <= y1; ++y) {
        for (int x = x0; x <= x1; ++x) {
            const double wgt = e.pixelOverlap(x, y);
            if (wgt <= 0.0) continue;
            float value;
            bool saturated = false, foreign = false;
            if (classify(in, x, y, ownId, value, saturated, foreign) == PixelUse::Exclude) {
                flags |= FlagApertureMasked;
                continue;
            }
            if (saturated) flags |= FlagSaturated;
            if (foreign) flags |= FlagCrowded;
            double level, var;
            pixelSky(in, sky, x, y, level, var);
            const double v = static_cast<double>(value) - level;
            if (wgt >= 1.0)
                out.addFull(v, var);
            else
                out.add(wgt, v, var);
        }
    }
    return flags;
}

// SExtractor's first moment r1 = Σ ρ I / Σ I over the pixels (centres) with ρ < rmax, ρ the normalised
// elliptical radius in units of the isophotal ellipse. Masked pixels and other objects' pixels excluded.
// NaN when undefined (non-positive sums).
double kronFirstMoment(const Inputs& in, const SkyModel& sky, double cx, double cy, double a, double b,
                       double thetaRad, double rmax, std::int32_t ownId) {
    const EllipseAperture e(cx, cy, a, b, thetaRad);
    const double hx = rmax * e.halfWidthX(), hy = rmax * e.halfWidthY();
    const int x0 = std::max(0, static_cast<int>(std::ceil(cx - hx)));
    const int x1 = std::min(in.image.width - 1, static_cast<int>(std::floor(cx + hx)));
    const int y0 = std::max(0, static_cast<int>(std::ceil(cy - hy)));
    const int y1 = std::min(in.image.height - 1, static_cast<int>(std::floor(cy + hy)));
    const double rmax2 = rmax * rmax;
    double sumRI = 0.0, sumI = 0.0;
    for (int y = y0; y <= y1; ++y) {
        for (int x = x0; x <= x1; ++x) {
            const double rho2 = e.normRadius2(x - cx, y - cy);
            if (rho2 > rmax2) continue;
            float value;
            bool saturated = false, foreign = false;
            if (classify(in, x, y, ownId, value, saturated, foreign) == PixelUse::Exclude || foreign)
                continue;
            double level, var;
            pixelSky(in, sky, x, y, level, var);
            const double v = static_cast<double>(value) - level;
            sumRI += std::sqrt(rho2) * v;
            sumI += v;
        }
    }
    if (!(sumI > 0.0) || !(sumRI > 0.0)) return kNaN;
    return sumRI / sumI;
}

// ---- local sky ----------------------------------------------------------------------------------

struct SkyEstimate {
    double level = kNaN, rms = kNaN;
    int n = 0;
    bool ok = false;
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

double sortedMedian(const float* a, std::size_t n) {
    const std::size_t m = n / 2;
    return (n % 2) ? a[m] : 0.5 * (static_cast<double>(a[m - 1]) + a[m]);
}

SkyEstimate localSky(const Inputs& in, double cx, double cy, double rin, double rout, const ApertureParams& p,
                     double rmsCorrection, Scratch& sc) {
    std::vector<float>& buf = sc.skyValues;
    buf.clear();
    const int y0 = std::max(0, static_cast<int>(std::ceil(cy - rout)));
    const int y1 = std::min(in.image.height - 1, static_cast<int>(std::floor(cy + rout)));
    const double rin2 = rin * rin, rout2 = rout * rout;
    auto take = [&](int x, int y, double dy2) {
        const double d2 = (x - cx) * (x - cx) + dy2;
        if (d2 < rin2 || d2 > rout2) return;
        if (!in.mask.empty() && in.mask(x, y) != 0) return;
        if (!in.seg.empty() && in.seg(x, y) != 0) return;
        const float v = in.image(x, y);
        if (!std::isfinite(v) || v >= in.saturation) return;
        buf.push_back(v);
    };
    for (int y = y0; y <= y1; ++y) {
        const double dy2 = (y - cy) * (y - cy);
        if (dy2 > rout2) continue;
        // the row's span of the outer circle, less the inner hole (margins of 1e-9 px; the exact
        // distance test in take() decides)
        const double wo = std::sqrt(rout2 - dy2) + 1e-9;
        const int xa = std::max(0, static_cast<int>(std::ceil(cx - wo)));
        const int xb = std::min(in.image.width - 1, static_cast<int>(std::floor(cx + wo)));
        int ha = xb + 1, hb = xb; // hole [ha, hb] skipped
        if (dy2 < rin2) {
            const double wi = std::sqrt(rin2 - dy2) - 1e-9;
            ha = static_cast<int>(std::floor(cx - wi)) + 1;
            hb = static_cast<int>(std::ceil(cx + wi)) - 1;
        }
        for (int x = xa; x <= std::min(xb, ha - 1); ++x)
            take(x, y, dy2);
        for (int x = std::max(xa, hb + 1); x <= xb; ++x)
            take(x, y, dy2);
    }
    SkyEstimate est;
    if (static_cast<int>(buf.size()) < std::max(2, p.minSkyPixels)) {
        est.n = static_cast<int>(buf.size());
        return est;
    }
    sortFloats(buf, sc);
    // prefix sums of deviations from a reference value: the mean and standard deviation of any clipped
    // range [lo, hi) of the sorted values in O(1)
    const std::size_t nAll = buf.size();
    const double ref = buf[nAll / 2];
    std::vector<double>& s1 = sc.prefix1;
    std::vector<double>& s2 = sc.prefix2;
    s1.resize(nAll + 1);
    s2.resize(nAll + 1);
    s1[0] = s2[0] = 0.0;
    for (std::size_t i = 0; i < nAll; ++i) {
        const double d = static_cast<double>(buf[i]) - ref;
        s1[i + 1] = s1[i] + d;
        s2[i + 1] = s2[i] + d * d;
    }
    std::size_t lo = 0, hi = nAll;
    double median = 0.0, mean = 0.0, sd = 0.0;
    auto stats = [&]() {
        const std::size_t n = hi - lo;
        const double m = static_cast<double>(n);
        median = sortedMedian(buf.data() + lo, n);
        const double dm = (s1[hi] - s1[lo]) / m;
        mean = ref + dm;
        const double ss = (s2[hi] - s2[lo]) - m * dm * dm;
        sd = n > 1 ? std::sqrt(std::max(0.0, ss) / (m - 1.0)) : 0.0;
    };
    stats();
    const bool clip = p.skyClipSigma > 0.0;
    for (int it = 0; clip && it < p.skyClipIterations; ++it) {
        const double lim = p.skyClipSigma * sd;
        const std::size_t nlo = static_cast<std::size_t>(
            std::lower_bound(buf.begin(), buf.end(), median - lim, [](float a, double b) { return a < b; }) -
            buf.begin());
        const std::size_t nhi = static_cast<std::size_t>(
            std::upper_bound(buf.begin(), buf.end(), median + lim, [](double a, float b) { return a < b; }) -
            buf.begin());
        if ((nlo == lo && nhi == hi) || nhi - nlo < 2) break;
        lo = nlo;
        hi = nhi;
        stats();
    }
    est.n = static_cast<int>(hi - lo);
    if (est.n < p.minSkyPixels) return est;
    switch (p.skyEstimator) {
    case SkyEstimator::Mean:
        est.level = mean;
        break;
    case SkyEstimator::Median:
        est.level = median;
        break;
    case SkyEstimator::Mode:
        est.level = (sd > 0.0 && (mean - median) / sd > 0.3) ? median : 2.5 * median - 1.5 * mean;
        break;
    }
    est.rms = clip ? sd / rmsCorrection : sd;
    est.ok = true;
    return est;
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

double fluxVariance(const Sums& s, double gain, double skyMeanVar) {
    double v = s.varSky + s.area * s.area * skyMeanVar;
    if (gain > 0.0) v += std::max(0.0, s.poisson) / gain;
    return v;
}

double robustMedian(std::vector<double> v) {
    if (v.empty()) return kNaN;
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size(), m = n / 2;
    return (n % 2) ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

double madSigma(const std::vector<double>& v, double median) {
    std::vector<double> d(v.size());
    for (std::size_t i = 0; i < v.size(); ++i)
        d[i] = std::abs(v[i] - median);
    return 1.482602218505602 * robustMedian(std::move(d));
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

template <class F>
void forEachChunked(std::size_t n, int threads, RunContext& ctx, double f0, double f1, F&& body) {
    constexpr std::size_t kChunk = 4096;
    for (std::size_t c0 = 0; c0 < n; c0 += kChunk) {
        ctx.checkCancelled();
        const std::ptrdiff_t c1 = static_cast<std::ptrdiff_t>(std::min(n, c0 + kChunk));
#pragma omp parallel num_threads(threads)
        {
            Scratch sc;
#pragma omp for schedule(dynamic, 16)
            for (std::ptrdiff_t i = static_cast<std::ptrdiff_t>(c0); i < c1; ++i)
                body(static_cast<std::size_t>(i), sc);
        }
        ctx.report("aperture", f0 + (f1 - f0) * static_cast<double>(c1) / static_cast<double>(n));
    }
}

template <class T> T columnOr(const std::vector<T>& v, std::size_t i, T fallback) {
    return i < v.size() ? v[i] : fallback;
}

void checkPositive(double v, const char* what) {
    if (!(v > 0.0) || !std::isfinite(v))
        throw InvalidInput(std::string("aperture photometry: ") + what +
                           " must be positive and finite (got " + std::to_string(v) + ")");
}

} // namespace

ApertureResult cpu::measureApertures(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                                const ImageViewT<std::int32_t>& segmentation, const Sources& sources,
                                double fwhm, double gain, double readNoise, const ApertureParams& params,
                                RunContext& ctx) {
    const ApertureParams& p = params;
    // ---- validation ----
    if (image.empty()) throw InvalidInput("aperture photometry: empty image");
    auto sameSize = [&](int w, int h, const char* what) {
        if (w != image.width || h != image.height)
            throw InvalidInput(std::string("aperture photometry: ") + what + " is " + std::to_string(w) +
                               "x" + std::to_string(h) + ", the image " + std::to_string(image.width) + "x" +
                               std::to_string(image.height));
    };
    if (!mask.empty()) sameSize(mask.width, mask.height, "the mask");
    if (!segmentation.empty()) sameSize(segmentation.width, segmentation.height, "the segmentation map");
    const bool haveMap = !bkg.level.empty() && !bkg.rms.empty();
    if (haveMap) {
        sameSize(bkg.level.width(), bkg.level.height(), "the background map");
        sameSize(bkg.rms.width(), bkg.rms.height(), "the background rms map");
    }
    if (!p.useLocalSky && !haveMap)
        throw InvalidInput("aperture photometry: useLocalSky is off but no background map was given");
    if (sources.y.size() != sources.x.size())
        throw InvalidInput("aperture photometry: Sources x and y differ in length");
    if (!(gain >= 0.0) || !std::isfinite(gain)) throw InvalidInput("aperture photometry: gain must be >= 0");
    if (!(readNoise >= 0.0) || !std::isfinite(readNoise))
        throw InvalidInput("aperture photometry: read noise must be >= 0");
    if (p.radii.empty()) throw InvalidInput("aperture photometry: no aperture radii");
    const bool wantCog = p.apertureCorrection || p.optimal;
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
        checkPositive(p.cogStep, "cogStep");
        checkPositive(p.optimalMinRadius, "optimalMinRadius");
        if (p.optimalMinRadius >= p.apCorrRefRadius)
            throw InvalidInput("aperture photometry: optimalMinRadius must be below apCorrRefRadius");
    }

    const std::size_t n = sources.size();
    ApertureResult res;
    res.count = n;
    const std::size_t nFixed = p.radii.size();
    for (double r : p.radii)
        res.radii.push_back(p.radiiInFwhm ? r * fwhm : r);
    const double rin = p.annulusInFwhm ? p.annulusInner * fwhm : p.annulusInner;
    const double rout = p.annulusInFwhm ? p.annulusOuter * fwhm : p.annulusOuter;
    const double refRadius = wantCog ? p.apCorrRefRadius * fwhm : kNaN;
    const double oneFwhm = wantCog ? fwhm : kNaN;
    if (p.useLocalSky) {
        res.skyAnnulusInner = rin;
        res.skyAnnulusOuter = rout;
    }

    // internal ascending radius list: the fixed radii and 1 FWHM (flux estimate, star preselection)
    std::vector<double> radii = res.radii;
    if (wantCog) radii.push_back(oneFwhm);
    std::sort(radii.begin(), radii.end());
    radii.erase(std::unique(radii.begin(), radii.end()), radii.end());
    auto indexOf = [&](double r) {
        return static_cast<std::size_t>(std::lower_bound(radii.begin(), radii.end(), r) - radii.begin());
    };
    std::vector<std::size_t> fixedIndex(nFixed);
    for (std::size_t k = 0; k < nFixed; ++k)
        fixedIndex[k] = indexOf(res.radii[k]);
    const std::size_t fwhmIndex = wantCog ? indexOf(oneFwhm) : 0;

    Inputs in;
    in.image = image;
    in.mask = mask;
    in.seg = segmentation;
    if (haveMap) {
        in.level = bkg.level.view();
        in.rms = bkg.rms.view();
    }
    in.saturation = (p.saturation > 0.0) ? p.saturation : kInf;
    in.gain = gain;
    in.readNoise = readNoise;
    const double rmsCorrection = clipRmsCorrection(p.skyClipSigma);
    const double kappa = skyMeanFactor(p.skyEstimator);

    res.flux.assign(nFixed, std::vector<double>(n, kNaN));
    res.fluxErr.assign(nFixed, std::vector<double>(n, kNaN));
    res.apertureFlags.assign(nFixed, std::vector<std::uint32_t>(n, 0));
    res.sky.assign(n, kNaN);
    res.skyRms.assign(n, kNaN);
    res.skyArea.assign(n, 0);
    res.kronRadius.assign(n, kNaN);
    res.fluxAuto.assign(n, kNaN);
    res.fluxAutoErr.assign(n, kNaN);
    res.radiusOpt.assign(n, kNaN);
    res.fluxOpt.assign(n, kNaN);
    res.fluxOptErr.assign(n, kNaN);
    res.flags.assign(n, 0);
    // per-source values needed by the later passes
    std::vector<double> skyMeanVar(n, 0.0), flux1(n, kNaN), err1(n, kNaN);
    std::vector<std::uint32_t> flags1(n, 0);
    std::vector<std::int32_t> ownIds(n, 0);

    auto ownIdOf = [&](std::size_t i, double cx, double cy) -> std::int32_t {
        if (i < sources.segmentId.size()) return sources.segmentId[i];
        if (segmentation.empty()) return 0;
        const int px = static_cast<int>(std::lround(cx)), py = static_cast<int>(std::lround(cy));
        if (px < 0 || py < 0 || px >= image.width || py >= image.height) return 0;
        return segmentation(px, py);
    };
    std::vector<std::uint8_t> skyPerPixel(n, 0); // 1: the sky of source i is the background map
    auto skyModelOf = [&](std::size_t i) {
        SkyModel s;
        s.perPixel = skyPerPixel[i] != 0;
        s.level = res.sky[i];
        s.var = res.skyRms[i] * res.skyRms[i];
        return s;
    };
    const int threads = ctx.threadCount();

    // ---- pass 1: sky, fixed apertures, Kron ----
    // Sources are processed in a spatial order (bands of 64 rows, then x) so that neighbouring apertures
    // share cached pixels; every result is per source, so the order changes no number.
    std::vector<std::size_t> order(n);
    {
        std::vector<std::pair<double, double>> key(n);
        for (std::size_t i = 0; i < n; ++i) {
            const double x = sources.x[i], y = sources.y[i];
            const bool ok = std::isfinite(x) && std::isfinite(y);
            key[i] = {ok ? std::floor(y / 64.0) : kInf, ok ? x : kInf};
        }
        std::iota(order.begin(), order.end(), std::size_t{0});
        std::stable_sort(order.begin(), order.end(),
                         [&](std::size_t a, std::size_t b) { return key[a] < key[b]; });
    }

    forEachChunked(n, threads, ctx, 0.0, 0.7, [&](std::size_t c, Scratch& sc) {
        const std::size_t i = order[c];
        const double cx = sources.x[i], cy = sources.y[i];
        if (!std::isfinite(cx) || !std::isfinite(cy)) {
            res.flags[i] = FlagApertureIncomplete | FlagSkyFailed | FlagKronFailed;
            return;
        }
        const std::int32_t ownId = ownIdOf(i, cx, cy);
        ownIds[i] = ownId;
        std::uint32_t flags = 0;
        // sky
        const int pxc = std::clamp(static_cast<int>(std::lround(cx)), 0, image.width - 1);
        const int pyc = std::clamp(static_cast<int>(std::lround(cy)), 0, image.height - 1);
        bool skyFromMap = !p.useLocalSky;
        if (p.useLocalSky) {
            const SkyEstimate est = localSky(in, cx, cy, rin, rout, p, rmsCorrection, sc);
            if (est.ok) {
                res.sky[i] = est.level;
                res.skyRms[i] = est.rms;
                res.skyArea[i] = est.n;
                skyMeanVar[i] = kappa * est.rms * est.rms / est.n;
            } else {
                flags |= FlagSkyFailed;
                skyFromMap = haveMap;
                if (!haveMap) {
                    res.sky[i] = kNaN;
                    res.skyRms[i] = gain > 0.0 ? readNoise / gain : readNoise;
                }
            }
        }
        if (skyFromMap) {
            res.sky[i] = in.level(pxc, pyc);
            res.skyRms[i] = in.rms(pxc, pyc);
            skyPerPixel[i] = 1;
        }
        const SkyModel sky = skyModelOf(i);
        // circular apertures
        std::vector<Sums>& sums = sc.sums;
        FlagDistances fd;
        sumCircles(in, sky, cx, cy, radii, ownId, sc, sums, fd);
        for (std::size_t k = 0; k < nFixed; ++k) {
            const Sums& s = sums[fixedIndex[k]];
            res.flux[k][i] = s.flux;
            res.fluxErr[k][i] = std::sqrt(fluxVariance(s, gain, skyMeanVar[i]));
            const std::uint32_t f = fd.flagsFor(res.radii[k]);
            res.apertureFlags[k][i] = f | (flags & FlagSkyFailed);
            flags |= f;
        }
        if (wantCog) {
            flux1[i] = sums[fwhmIndex].flux;
            err1[i] = std::sqrt(fluxVariance(sums[fwhmIndex], gain, skyMeanVar[i]));
            flags1[i] = fd.flagsFor(oneFwhm);
        }
        // Kron radius and FLUX_AUTO
        double a = columnOr(sources.a, i, kNaN), b = columnOr(sources.b, i, kNaN);
        double th = columnOr(sources.theta, i, 0.0) * std::numbers::pi / 180.0;
        if (!(a > 0.0) || !(b > 0.0) || !std::isfinite(a) || !std::isfinite(b) || !std::isfinite(th)) {
            // no usable isophotal ellipse: a circle of the field's Gaussian sigma (or 1 px)
            a = b = (fwhm > 0.0 && std::isfinite(fwhm)) ? fwhm * kFwhmToSigma : 1.0;
            th = 0.0;
        }
        const double r1 = kronFirstMoment(in, sky, cx, cy, a, b, th, p.kronMaxRadius, ownId);
        double kron = p.kronFactor * r1;
        if (!std::isfinite(r1)) {
            flags |= FlagKronFailed;
            kron = p.kronMinRadius;
        }
        kron = std::max(kron, p.kronMinRadius);
        res.kronRadius[i] = kron;
        if (kron > 0.0) {
            const EllipseAperture e(cx, cy, a * kron, b * kron, th);
            Sums s;
            flags |= sumEllipse(in, sky, e, cx, cy, ownId, s);
            res.fluxAuto[i] = s.flux;
            res.fluxAutoErr[i] = std::sqrt(fluxVariance(s, gain, skyMeanVar[i]));
        }
        res.flags[i] = flags;
    });

    // ---- pass 2: curve of growth from bright isolated stars ----
    if (wantCog) {
        res.apCorrRefRadius = refRadius;
        for (double f = p.optimalMinRadius; f < p.apCorrRefRadius - 0.5 * p.cogStep; f += p.cogStep)
            res.cogRadius.push_back(f * fwhm);
        res.cogRadius.push_back(refRadius);
        constexpr std::uint32_t kRejectSource = FlagCrowded | FlagBlended | FlagSaturated | FlagEdge |
                                                FlagApertureIncomplete | FlagBadPixels | FlagApertureMasked |
                                                FlagSkyFailed | FlagDeblendOverflow;
        // preselection on the 1-FWHM aperture (its S/N exceeds the reference aperture's for all but
        // sky-free sources), then the reference aperture for those only
        std::vector<std::size_t> pre;
        for (std::size_t i = 0; i < n; ++i) {
            const std::uint32_t sf = columnOr(sources.flags, i, 0u);
            if ((sf & kRejectSource) || (flags1[i] & kRejectSource) || (res.flags[i] & FlagSkyFailed))
                continue;
            if (!(flux1[i] > 0.0) || !(err1[i] > 0.0)) continue;
            if (flux1[i] / err1[i] >= p.apCorrMinSnr) pre.push_back(i);
        }
        // only the 10 x apCorrMaxStars best by that S/N (ties by index) go on to the reference aperture
        const std::size_t preMax = 10 * static_cast<std::size_t>(std::max(1, p.apCorrMaxStars));
        if (pre.size() > preMax) {
            std::stable_sort(pre.begin(), pre.end(), [&](std::size_t a, std::size_t b) {
                return flux1[a] / err1[a] > flux1[b] / err1[b];
            });
            pre.resize(preMax);
            std::sort(pre.begin(), pre.end());
        }
        std::vector<double> fluxRef(n, kNaN), errRef(n, kNaN);
        std::vector<std::uint32_t> flagsRef(n, 0);
        forEachChunked(pre.size(), threads, ctx, 0.7, 0.75, [&](std::size_t c, Scratch& sc) {
            const std::size_t i = pre[c];
            FlagDistances fd;
            sumCircles(in, skyModelOf(i), sources.x[i], sources.y[i], std::vector<double>{refRadius},
                       ownIds[i], sc, sc.sums, fd);
            fluxRef[i] = sc.sums[0].flux;
            errRef[i] = std::sqrt(fluxVariance(sc.sums[0], gain, skyMeanVar[i]));
            flagsRef[i] = fd.flagsFor(refRadius);
        });
        std::vector<std::pair<double, std::size_t>> cand; // (-S/N, index)
        for (std::size_t i : pre) {
            if ((flagsRef[i] & kRejectSource) || !(fluxRef[i] > 0.0) || !(errRef[i] > 0.0)) continue;
            const double snr = fluxRef[i] / errRef[i];
            if (snr >= p.apCorrMinSnr) cand.emplace_back(-snr, i);
        }
        std::sort(cand.begin(), cand.end());
        if (cand.size() > static_cast<std::size_t>(std::max(0, p.apCorrMaxStars)))
            cand.resize(p.apCorrMaxStars);
        std::vector<std::size_t> stars;
        {
            std::vector<double> conc;
            for (const auto& c : cand)
                conc.push_back(flux1[c.second] / fluxRef[c.second]);
            const double med = robustMedian(conc);
            const double sig = conc.empty() ? 0.0 : madSigma(conc, med);
            for (std::size_t k = 0; k < cand.size(); ++k)
                if (!(sig > 0.0) || std::abs(conc[k] - med) <= p.apCorrClip * sig)
                    stars.push_back(cand[k].second);
            std::sort(stars.begin(), stars.end());
        }
        const std::size_t nGrid = res.cogRadius.size();
        if (static_cast<int>(stars.size()) >= std::max(1, p.apCorrMinStars)) {
            res.apCorrStars = static_cast<int>(stars.size());
            res.apCorrStarIndex.assign(stars.begin(), stars.end());
            // fractions[star][grid]
            std::vector<std::vector<double>> frac(stars.size());
            forEachChunked(stars.size(), threads, ctx, 0.75, 0.8, [&](std::size_t s, Scratch& sc) {
                const std::size_t i = stars[s];
                std::vector<Sums> sums;
                FlagDistances fd;
                sumCircles(in, skyModelOf(i), sources.x[i], sources.y[i], res.cogRadius, ownIds[i], sc, sums,
                           fd);
                frac[s].resize(nGrid);
                const double ref = sums[nGrid - 1].flux;
                for (std::size_t g = 0; g < nGrid; ++g)
                    frac[s][g] = sums[g].flux / ref;
            });
            res.cogFraction.resize(nGrid);
            std::vector<double> col(stars.size());
            for (std::size_t g = 0; g < nGrid; ++g) {
                for (std::size_t s = 0; s < stars.size(); ++s)
                    col[s] = frac[s][g];
                res.cogFraction[g] = robustMedian(col);
            }
            if (p.apertureCorrection) {
                for (std::size_t k = 0; k < nFixed; ++k) {
                    for (std::size_t s = 0; s < stars.size(); ++s)
                        col[s] = res.flux[k][stars[s]] / fluxRef[stars[s]];
                    const double ratio = robustMedian(col);
                    // standard error of a median: sqrt(pi/2) sigma / sqrt(n), sigma from the MAD
                    const double err = std::sqrt(std::numbers::pi / 2.0) * madSigma(col, ratio) /
                                       std::sqrt(static_cast<double>(stars.size()));
                    res.apCorrRatio.push_back(ratio);
                    res.apCorrMag.push_back(2.5 * std::log10(ratio));
                    res.apCorrMagErr.push_back(2.5 / std::numbers::ln10 * err / ratio);
                }
            }
        } else {
            // Gaussian of the field FWHM
            const double sigma = fwhm * kFwhmToSigma;
            auto g = [&](double r) { return 1.0 - std::exp(-0.5 * r * r / (sigma * sigma)); };
            const double gref = g(refRadius);
            for (double r : res.cogRadius)
                res.cogFraction.push_back(g(r) / gref);
            if (p.apertureCorrection) {
                for (std::size_t k = 0; k < nFixed; ++k) {
                    const double ratio = g(res.radii[k]) / gref;
                    res.apCorrRatio.push_back(ratio);
                    res.apCorrMag.push_back(2.5 * std::log10(ratio));
                    res.apCorrMagErr.push_back(kNaN);
                }
            }
        }
    }
    if (!p.apertureCorrection) {
        res.apCorrRatio.assign(nFixed, kNaN);
        res.apCorrMag.assign(nFixed, kNaN);
        res.apCorrMagErr.assign(nFixed, kNaN);
    }

    // ---- pass 3: S/N-optimal aperture ----
    if (p.optimal) {
        const std::size_t nGrid = res.cogRadius.size();
        const double g1 = interpolate(res.cogRadius, res.cogFraction, oneFwhm);
        forEachChunked(n, threads, ctx, 0.8, 1.0, [&](std::size_t c, Scratch& sc) {
            const std::size_t i = order[c];
            const double cx = sources.x[i], cy = sources.y[i];
            if (!std::isfinite(cx) || !std::isfinite(cy) || !std::isfinite(res.sky[i])) return;
            const double F = (g1 > 0.0 && flux1[i] > 0.0) ? flux1[i] / g1 : 0.0;
            const double var = res.skyRms[i] * res.skyRms[i];
            const double nSky = res.skyArea[i] > 0 ? static_cast<double>(res.skyArea[i]) : kInf;
            // maximise frac / sqrt(den) by comparing frac^2 * denBest with fracBest^2 * den (no division)
            std::size_t best = nGrid - 1;
            double bestNum = -1.0, bestDen = 1.0;
            for (std::size_t g = 0; g < nGrid; ++g) {
                const double frac = res.cogFraction[g];
                if (!(frac > 0.0)) continue;
                const double area = std::numbers::pi * res.cogRadius[g] * res.cogRadius[g];
                const double den =
                    (gain > 0.0 ? F * frac / gain : 0.0) + area * var * (1.0 + kappa * area / nSky);
                if (!(den > 0.0)) continue;
                const double num = frac * frac;
                if (bestNum < 0.0 || num * bestDen > bestNum * den) {
                    bestNum = num;
                    bestDen = den;
                    best = g;
                }
            }
            const double r = res.cogRadius[best];
            const double frac = res.cogFraction[best];
            const SkyModel sky = skyModelOf(i);
            std::vector<Sums>& sums = sc.sums;
            FlagDistances fd;
            sumCircles(in, sky, cx, cy, std::vector<double>{r}, ownIds[i], sc, sums, fd);
            res.radiusOpt[i] = r;
            res.fluxOpt[i] = sums[0].flux / frac;
            res.fluxOptErr[i] = std::sqrt(fluxVariance(sums[0], gain, skyMeanVar[i])) / frac;
            res.flags[i] |= fd.flagsFor(r);
        });
    }
    return res;
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

NLOHMANN_JSON_SERIALIZE_ENUM(SkyEstimator, {{SkyEstimator::Mean, "mean"},
                                            {SkyEstimator::Median, "median"},
                                            {SkyEstimator::Mode, "mode"}})

void to_json(nlohmann::json& j, const ApertureParams& p) {
    j = nlohmann::json{{"radii", p.radii},
                       {"radiiInFwhm", p.radiiInFwhm},
                       {"useLocalSky", p.useLocalSky},
                       {"annulusInner", p.annulusInner},
                       {"annulusOuter", p.annulusOuter},
                       {"annulusInFwhm", p.annulusInFwhm},
                       {"skyEstimator", p.skyEstimator},
                       {"skyClipSigma", p.skyClipSigma},
                       {"skyClipIterations", p.skyClipIterations},
                       {"minSkyPixels", p.minSkyPixels},
                       {"kronFactor", p.kronFactor},
                       {"kronMinRadius", p.kronMinRadius},
                       {"kronMaxRadius", p.kronMaxRadius},
                       {"apertureCorrection", p.apertureCorrection},
                       {"apCorrRefRadius", p.apCorrRefRadius},
                       {"apCorrMaxStars", p.apCorrMaxStars},
                       {"apCorrMinStars", p.apCorrMinStars},
                       {"apCorrMinSnr", p.apCorrMinSnr},
                       {"apCorrClip", p.apCorrClip},
                       {"optimal", p.optimal},
                       {"optimalMinRadius", p.optimalMinRadius},
                       {"cogStep", p.cogStep}};
    // JSON has no infinity: null means "no saturation level"
    if (std::isfinite(p.saturation))
        j["saturation"] = p.saturation;
    else
        j["saturation"] = nullptr;
}

void from_json(const nlohmann::json& j, ApertureParams& p) {
    if (!j.is_object()) throw InvalidInput("aperture parameters: expected a JSON object");
    auto get = [&](const char* key, auto& v) {
        if (j.contains(key)) j.at(key).get_to(v);
    };
    get("radii", p.radii);
    get("radiiInFwhm", p.radiiInFwhm);
    get("useLocalSky", p.useLocalSky);
    get("annulusInner", p.annulusInner);
    get("annulusOuter", p.annulusOuter);
    get("annulusInFwhm", p.annulusInFwhm);
    if (j.contains("skyEstimator")) {
        const std::string s = j.at("skyEstimator").get<std::string>();
        if (s != "mean" && s != "median" && s != "mode")
            throw InvalidInput("aperture parameters: skyEstimator '" + s +
                               "' (expected mean, median or mode)");
        j.at("skyEstimator").get_to(p.skyEstimator);
    }
    get("skyClipSigma", p.skyClipSigma);
    get("skyClipIterations", p.skyClipIterations);
    get("minSkyPixels", p.minSkyPixels);
    get("kronFactor", p.kronFactor);
    get("kronMinRadius", p.kronMinRadius);
    get("kronMaxRadius", p.kronMaxRadius);
    get("apertureCorrection", p.apertureCorrection);
    get("apCorrRefRadius", p.apCorrRefRadius);
    get("apCorrMaxStars", p.apCorrMaxStars);
    get("apCorrMinStars", p.apCorrMinStars);
    get("apCorrMinSnr", p.apCorrMinSnr);
    get("apCorrClip", p.apCorrClip);
    get("optimal", p.optimal);
    get("optimalMinRadius", p.optimalMinRadius);
    get("cogStep", p.cogStep);
    if (j.contains("saturation"))
        p.saturation = j.at("saturation").is_null() ? kInf : j.at("saturation").get<double>();
}

} // namespace gpuphot
