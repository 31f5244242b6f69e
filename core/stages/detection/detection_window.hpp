#pragma once
// The arithmetic of the windowed positions (XWIN/YWIN, core/stages/detection/detection_measure.cpp's
// measureWindowed), shared by the CPU stage and the CUDA finish step (kernels/detection/detection_finish.cu)
// so that both give the same bits (docs/ARCHITECTURE.md, Determinism): the same operations in the same order,
// doubles, no fused multiply-adds (-ffp-contract=off / -fmad=false), and an exp of our own (the C library's
// exp and CUDA's differ in the last bit for some arguments). Not a public API.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/model/sources.hpp"
#include "core/stages/detection/detection_internal.hpp"
#include "core/util/hd.hpp"

namespace gpuphot::detail {

// 2^k as a double for -1022 <= k <= 1023 (its exponent bits).
GPUPHOT_HD inline double windowPow2(int k) {
    const std::uint64_t bits = static_cast<std::uint64_t>(k + 1023) << 52;
#if defined(__CUDA_ARCH__)
    return __longlong_as_double(static_cast<long long>(bits));
#else
    double d;
    std::memcpy(&d, &bits, sizeof d);
    return d;
#endif
}

// windowExp's pieces (windowExpRow, detection_window_rows.cpp, uses them too): exp(x) = 2^k exp(r) with
// k = floor(x / ln2 + 1/2) and r = x - k ln2, ln2 in two parts.
constexpr double kWindowInvLn2 = 1.4426950408889634074;
constexpr double kWindowLn2Hi = 6.93147180369123816490e-01;
constexpr double kWindowLn2Lo = 1.90821492927058770002e-10;
GPUPHOT_HD inline double windowExpK(double x) {
    return std::floor(x * kWindowInvLn2 + 0.5);
}
GPUPHOT_HD inline double windowExpR(double x, double k) {
    return (x - k * kWindowLn2Hi) - k * kWindowLn2Lo;
}
// exp(r) for |r| <= ln2 / 2: the Taylor polynomial to degree 13 in Horner form, the leading 1 added last.
GPUPHOT_HD inline double windowExpReduced(double r) {
    double p = 1.0 / 6227020800.0; // 1/13!
    p = p * r + 1.0 / 479001600.0; // 1/12!
    p = p * r + 1.0 / 39916800.0;  // 1/11!
    p = p * r + 1.0 / 3628800.0;   // 1/10!
    p = p * r + 1.0 / 362880.0;    // 1/9!
    p = p * r + 1.0 / 40320.0;     // 1/8!
    p = p * r + 1.0 / 5040.0;      // 1/7!
    p = p * r + 1.0 / 720.0;       // 1/6!
    p = p * r + 1.0 / 120.0;       // 1/5!
    p = p * r + 1.0 / 24.0;        // 1/4!
    p = p * r + 1.0 / 6.0;         // 1/3!
    p = p * r + 0.5;               // 1/2!
    p = p * r + 1.0;
    return 1.0 + r * p;
}
// exp(x), the same bits on the host and the device: x = k ln2 + r (|r| <= ln2 / 2, Cody-Waite with a
// two-part ln2 whose high part has 11 trailing zero bits, so k * hi is exact for |k| < 2^11), exp(r) by
// its Taylor polynomial to degree 13 in Horner form (truncation < 4e-18 relative), times 2^k (exact).
// Within 1 ulp of exp(x) (glibc's result in 90% of the window's arguments, one ulp off in the others);
// 0 below -708 (the window's arguments lie in (-8, 0]).
GPUPHOT_HD inline double windowExp(double x) {
    if (!(x > -708.0)) return x != x ? x : 0.0;
    if (x > 709.0) return HUGE_VAL;
    const double k = windowExpK(x);
    const double y = windowExpReduced(windowExpR(x, k));
    const int ki = static_cast<int>(k);
    // Times 2^k: for |k| <= 1000 a product by the exact power of two, whose result (about 2^k) is a normal
    // double, so it is exact: the same bits as ldexp (a library call on the host, a dozen instructions with
    // branches on the device); ldexp itself near the ends of the range.
    return ki >= -1000 && ki <= 1000 ? y * windowPow2(ki) : std::ldexp(y, ki);
}

// What the window iteration needs of an object's isophotal measurement.
struct WindowObject {
    double xIso = 0.0, yIso = 0.0, flux = 0.0, fluxVar = 0.0, x2 = 0.0, y2 = 0.0;
};
GPUPHOT_HD inline WindowObject windowObject(const IsoMeasure& m) {
    return {m.xIso, m.yIso, m.flux, m.fluxVar, m.x2, m.y2};
}

// The parameters of the iteration (DetectionParams' window fields, the gain and the image size).
struct WindowConfig {
    double sigmaFactor = 0.0, minSigma = 0.0, tolerance = 0.0, gain = 0.0;
    int maxIterations = 0, width = 0, height = 0;
    double maxSigma = 0.0; // 0: no ceiling
};
inline WindowConfig windowConfig(const DetectionParams& p, int width, int height) {
    return {p.windowSigmaFactor,
            p.windowMinSigma,
            p.windowTolerance,
            p.gain,
            p.windowMaxIterations,
            width,
            height,
            p.windowMaxSigma};
}

// Squared distance of pixel (x, y) from the barycentre: the growth curve's sort key.
GPUPHOT_HD inline double windowR2(const WindowObject& m, std::int32_t x, std::int32_t y) {
    const double dx = x - m.xIso, dy = y - m.yIso;
    return dx * dx + dy * dy;
}

// Half-light radius from the isophotal pixels' circular growth curve: pixel(i, r2, v) gives the i-th
// pixel (i = 0..count-1) in order of r2 (ties: raster order) and its value; linear interpolation between
// pixels. The radii (square roots) are taken only where the walk stops: the previous pixel's radius is
// sqrt of its r2, 0 before the first pixel.
template <class Pixel>
GPUPHOT_HD double halfLightRadiusSorted(const WindowObject& m, std::int64_t count, const Pixel& pixel) {
    const double target = 0.5 * m.flux;
    if (!(target > 0.0)) return std::sqrt(0.5 * (m.x2 + m.y2)) * 1.17741;
    double cum = 0.0, prevR2 = 0.0, prevCum = 0.0;
    for (std::int64_t i = 0; i < count; ++i) {
        double r2 = 0.0, v = 0.0;
        pixel(i, r2, v);
        cum += v;
        if (cum >= target) {
            const double r = std::sqrt(r2);
            const double prevR = i > 0 ? std::sqrt(prevR2) : 0.0;
            const double f = cum > prevCum ? (target - prevCum) / (cum - prevCum) : 1.0;
            return prevR + f * (r - prevR);
        }
        prevR2 = r2;
        prevCum = cum;
    }
    return count > 0 ? std::sqrt(prevR2) : 0.0;
}

// The window iteration (SExtractor's accelerated XWIN/YWIN step) in pieces, so that the CPU (one object
// at a time, windowedPosition) and the GPU (one warp per object: the per-pixel terms by the lanes, the
// sums in raster order by one lane) run the same operations in the same order.
struct WindowState {
    double sigma = 0.0, inv2s2 = 0.0, rMax = 0.0, rMax2 = 0.0;
    double x = 0.0, y = 0.0, errx2 = 0.0, erry2 = 0.0;
    bool ok = false;
};
// Gaussian window of sigma = max(minSigma, sigmaFactor * halfLight) at the barycentre, at most maxSigma (>
// 0).
GPUPHOT_HD inline WindowState windowStart(const WindowObject& m, double halfLight, const WindowConfig& p) {
    WindowState s;
    const double fromLight = p.sigmaFactor * halfLight;
    s.sigma = p.minSigma < fromLight ? fromLight : p.minSigma; // std::max(minSigma, fromLight)
    if (p.maxSigma > 0.0 && s.sigma > p.maxSigma) s.sigma = p.maxSigma;
    s.inv2s2 = 1.0 / (2.0 * s.sigma * s.sigma);
    s.rMax = 4.0 * s.sigma; // WINPOS_NSIG
    s.rMax2 = s.rMax * s.rMax;
    s.x = m.xIso;
    s.y = m.yIso;
    return s;
}
GPUPHOT_HD inline int windowIterations(const WindowConfig& p) {
    return p.maxIterations > 1 ? p.maxIterations : 1;
}
// The pixel box of the window at the current position (clipped to the image; empty: xa > xb or ya > yb).
// False when the position is far off the frame or not finite (the box would be empty: said explicitly,
// since converting such values to int differs between the host and the device).
GPUPHOT_HD inline bool windowBox(const WindowState& s, const WindowConfig& p, int& xa, int& xb, int& ya,
                                 int& yb) {
    if (!(std::fabs(s.x) < 1e9) || !(std::fabs(s.y) < 1e9)) return false;
    const int fxa = static_cast<int>(std::floor(s.x - s.rMax));
    const int fxb = static_cast<int>(std::ceil(s.x + s.rMax));
    const int fya = static_cast<int>(std::floor(s.y - s.rMax));
    const int fyb = static_cast<int>(std::ceil(s.y + s.rMax));
    xa = fxa > 0 ? fxa : 0;
    xb = fxb < p.width - 1 ? fxb : p.width - 1;
    ya = fya > 0 ? fya : 0;
    yb = fyb < p.height - 1 ? fyb : p.height - 1;
    return true;
}
// The sums of one iteration, and one pixel's terms of them.
struct WindowSums {
    double sw = 0.0, swx = 0.0, swy = 0.0, sex = 0.0, sey = 0.0;
};
// The window's weight at squared distance r2 from its centre.
struct WindowWeight {
    double inv2s2;
    GPUPHOT_HD double operator()(double r2, int) const { return windowExp(-r2 * inv2s2); }
};
// Pixel (xx, yy) of row `row`: false when it does not count (outside the circle, bad, a neighbour's).
// weight(r2, xx) is the window's weight there (WindowWeight). The host computes a row's terms with
// windowTermsRow (detection_window_rows.hpp), the same operations.
template <class Row, class Weight>
GPUPHOT_HD bool windowTerms(const WindowState& s, const WindowConfig& p, std::int32_t segId, const Row& row,
                            int xx, int yy, const Weight& weight, WindowSums& t) {
    const double dy = yy - s.y;
    const double dx = xx - s.x;
    const double r2 = dx * dx + dy * dy;
    if (r2 >= s.rMax2) return false;
    if (row.state(xx) & (StateBad | StateInvalid)) return false;
    const std::int32_t g = row.seg(xx);
    if (g != 0 && g != segId) return false; // a neighbour's pixel
    const double v = row.sub(xx);
    const double wt = weight(r2, xx);
    const double wv = wt * v;
    t.sw = wv;
    t.swx = wv * dx;
    t.swy = wv * dy;
    const float rv = row.rms(xx);
    double var = static_cast<double>(rv) * rv;
    if (p.gain > 0.0 && v > 0.0) var += v / p.gain;
    t.sex = wt * wt * var * dx * dx;
    t.sey = wt * wt * var * dy * dy;
    return true;
}
GPUPHOT_HD inline void windowAdd(WindowSums& s, const WindowSums& t) {
    s.sw += t.sw;
    s.swx += t.swx;
    s.swy += t.swy;
    s.sex += t.sex;
    s.sey += t.sey;
}
// The step after an iteration's sums; false when the iteration stops.
GPUPHOT_HD inline bool windowStep(WindowState& s, const WindowSums& q, const WindowConfig& p) {
    if (!(q.sw > 0.0)) return false;
    s.errx2 = 4.0 * q.sex / (q.sw * q.sw);
    s.erry2 = 4.0 * q.sey / (q.sw * q.sw);
    const double stepX = 2.0 * q.swx / q.sw, stepY = 2.0 * q.swy / q.sw; // SExtractor's accelerated step
    s.x += stepX;
    s.y += stepY;
    s.ok = true;
    return !(stepX * stepX + stepY * stepY < p.tolerance * p.tolerance);
}
// The result; a window that wandered off (noise, crowding) falls back to the isophotal barycentre.
GPUPHOT_HD inline WindowResult windowFinish(const WindowObject& m, const WindowState& s) {
    WindowResult w;
    w.x = m.xIso;
    w.y = m.yIso;
    const double dx = s.x - m.xIso, dy = s.y - m.yIso;
    if (s.ok && std::isfinite(s.x) && std::isfinite(s.y) && dx * dx + dy * dy <= s.rMax2) {
        w.x = s.x;
        w.y = s.y;
        w.xErr = std::sqrt(s.errx2);
        w.yErr = std::sqrt(s.erry2);
    } else if (m.flux > 0.0) { // isophotal barycentre: its error, sqrt(var * x2) / flux
        w.xErr = std::sqrt(m.fluxVar * m.x2) / m.flux;
        w.yErr = std::sqrt(m.fluxVar * m.y2) / m.flux;
    } else {
        w.xErr = std::sqrt(m.x2);
        w.yErr = std::sqrt(m.y2);
    }
    return w;
}

// The whole iteration for one object, serially: the definition that the host's row-at-a-time version
// (detection_window_rows.hpp, what the CPU stage runs) and the CUDA finish step follow, kept as the tests'
// reference. img.row(y) gives an object with sub(x) (float, background-subtracted), rms(x) (float),
// state(x) (PixelState bits) and seg(x) (the segmentation map).
template <class Img>
GPUPHOT_HD WindowResult windowedPosition(const WindowObject& m, double halfLight, std::int32_t segId,
                                         const Img& img, const WindowConfig& p) {
    WindowState s = windowStart(m, halfLight, p);
    const int iterations = windowIterations(p);
    for (int it = 0; it < iterations; ++it) {
        int xa = 0, xb = -1, ya = 0, yb = -1;
        if (!windowBox(s, p, xa, xb, ya, yb)) break;
        WindowSums q;
        for (int yy = ya; yy <= yb; ++yy) {
            const auto row = img.row(yy);
            for (int xx = xa; xx <= xb; ++xx) {
                WindowSums t;
                if (windowTerms(s, p, segId, row, xx, yy, WindowWeight{s.inv2s2}, t)) windowAdd(q, t);
            }
        }
        if (!windowStep(s, q, p)) break;
    }
    return windowFinish(m, s);
}

// Row k of the detection's Sources (sized already): object with measurement m, the object's own flags
// (blended, deblend overflow), its windowed position and id k + 1. Host only.
inline void setSourceRow(Sources& s, std::size_t k, const IsoMeasure& m, std::uint32_t objectFlags,
                         const WindowResult& win) {
    s.x[k] = win.x;
    s.y[k] = win.y;
    s.xErr[k] = win.xErr;
    s.yErr[k] = win.yErr;
    s.xIso[k] = m.xIso;
    s.yIso[k] = m.yIso;
    s.x2[k] = m.x2;
    s.y2[k] = m.y2;
    s.xy[k] = m.xy;
    s.a[k] = m.a;
    s.b[k] = m.b;
    s.theta[k] = m.theta;
    s.fluxIso[k] = m.flux;
    s.fluxIsoErr[k] = std::sqrt(m.fluxVar);
    s.areaIso[k] = m.isoArea;
    s.peak[k] = m.peak;
    s.xMin[k] = m.xMin;
    s.xMax[k] = m.xMax;
    s.yMin[k] = m.yMin;
    s.yMax[k] = m.yMax;
    s.flags[k] = m.flags | objectFlags;
    s.segmentId[k] = static_cast<std::int32_t>(k + 1);
}

} // namespace gpuphot::detail
