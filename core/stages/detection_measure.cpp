// Per-object measurements: isophotal (barycentre, second moments, ellipse, flux, peak, bounding box,
// flags) and windowed (SExtractor XWIN/YWIN). Sums in double over the pixels in raster order.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/model/flags.hpp"
#include "core/stages/detection_internal.hpp"

namespace gpuphot::detail {

namespace {
constexpr double kPi = 3.14159265358979323846;
constexpr double kRadToDeg = 180.0 / kPi;
} // namespace

IsoMeasure measureIsophotal(const std::vector<Run>& runs, const DetectionImages& im,
                            const DetectionParams& p) {
    IsoMeasure m;
    const double x0 = runs.front().x0, y0 = runs.front().y;  // reference point for the sums
    double s = 0, sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0; // value-weighted
    double n = 0, nx = 0, ny = 0, nxx = 0, nyy = 0, nxy = 0; // unweighted (fallback)
    double var = 0;
    double peak = -std::numeric_limits<double>::infinity();
    double detPeak = -std::numeric_limits<double>::infinity();
    std::uint8_t stateOr = 0;
    m.xMin = runs.front().x0;
    m.xMax = runs.front().x1;
    m.yMin = runs.front().y;
    m.yMax = runs.back().y;
    for (const Run& r : runs) {
        m.xMin = std::min(m.xMin, r.x0);
        m.xMax = std::max(m.xMax, r.x1);
        const float* vrow = im.sub.row(r.y);
        const float* drow = im.det.row(r.y);
        const float* rrow = im.rms.data ? im.rms.row(r.y) : nullptr;
        const std::uint8_t* srow = im.state.row(r.y);
        const double dy = r.y - y0;
        for (std::int32_t x = r.x0; x <= r.x1; ++x) {
            const double v = vrow[x];
            const double dx = x - x0;
            s += v;
            sx += v * dx;
            sy += v * dy;
            sxx += v * dx * dx;
            syy += v * dy * dy;
            sxy += v * dx * dy;
            n += 1.0;
            nx += dx;
            ny += dy;
            nxx += dx * dx;
            nyy += dy * dy;
            nxy += dx * dy;
            const double rms = rrow ? rrow[x] : im.rmsSampler->rmsAt(x, r.y);
            var += rms * rms;
            if (p.gain > 0.0 && v > 0.0) var += v / p.gain;
            if (v > peak) peak = v;
            if (static_cast<double>(drow[x]) > detPeak) {
                detPeak = drow[x];
                m.detPeakX = x;
                m.detPeakY = r.y;
            }
            stateOr |= srow[x];
        }
    }
    m.area = static_cast<std::int32_t>(n);
    m.flux = s;
    m.fluxVar = var;
    m.peak = peak;
    m.detPeak = detPeak;
    m.thrAtPeak = im.thresholdAt(m.detPeakX, m.detPeakY);

    double mx, my, vxx, vyy, vxy;
    if (s > 0.0) {
        mx = sx / s;
        my = sy / s;
        vxx = sxx / s - mx * mx;
        vyy = syy / s - my * my;
        vxy = sxy / s - mx * my;
    } else {
        mx = nx / n;
        my = ny / n;
        vxx = nxx / n - mx * mx;
        vyy = nyy / n - my * my;
        vxy = nxy / n - mx * my;
    }
    // Non-positive-definite moments (noise-dominated objects): fall back to the unweighted ones.
    if (!(vxx > 0.0) || !(vyy > 0.0)) {
        const double ux = nx / n, uy = ny / n;
        vxx = nxx / n - ux * ux;
        vyy = nyy / n - uy * uy;
        vxy = nxy / n - ux * uy;
    }
    if (vxx * vyy - vxy * vxy < 1.0 / 144.0) { // as SExtractor: avoid infinitely thin objects
        vxx += 1.0 / 12.0;
        vyy += 1.0 / 12.0;
    }
    m.xIso = x0 + mx;
    m.yIso = y0 + my;
    m.x2 = vxx;
    m.y2 = vyy;
    m.xy = vxy;
    const double half = 0.5 * (vxx + vyy);
    const double root = std::sqrt(0.25 * (vxx - vyy) * (vxx - vyy) + vxy * vxy);
    m.a = std::sqrt(half + root);
    m.b = std::sqrt(std::max(0.0, half - root));
    m.theta = 0.5 * std::atan2(2.0 * vxy, vxx - vyy) * kRadToDeg;
    const double det = vxx * vyy - vxy * vxy;
    m.cxx = vyy / det;
    m.cyy = vxx / det;
    m.cxy = -2.0 * vxy / det;

    if (stateOr & StateSaturated) m.flags |= FlagSaturated;
    if (stateOr & StateBad) m.flags |= FlagBadPixels;
    if (m.xMin == 0 || m.yMin == 0 || m.xMax == im.width - 1 || m.yMax == im.height - 1) m.flags |= FlagEdge;
    return m;
}

namespace {

// Half-light radius from the isophotal pixels: circular growth curve around the barycentre, the
// pixels taken in order of distance (ties: raster order), linear interpolation between pixels.
double halfLightRadius(const IsoMeasure& m, const std::vector<Run>& runs, const DetectionImages& im) {
    std::vector<std::pair<double, double>> rv; // (r^2, value)
    rv.reserve(m.area);
    for (const Run& r : runs) {
        const float* vrow = im.sub.row(r.y);
        for (std::int32_t x = r.x0; x <= r.x1; ++x) {
            const double dx = x - m.xIso, dy = r.y - m.yIso;
            rv.emplace_back(dx * dx + dy * dy, vrow[x]);
        }
    }
    std::stable_sort(rv.begin(), rv.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    const double target = 0.5 * m.flux;
    if (!(target > 0.0)) return std::sqrt(0.5 * (m.x2 + m.y2)) * 1.17741;
    double cum = 0.0, prevR = 0.0, prevCum = 0.0;
    for (const auto& [r2, v] : rv) {
        const double r = std::sqrt(r2);
        cum += v;
        if (cum >= target) {
            const double f = cum > prevCum ? (target - prevCum) / (cum - prevCum) : 1.0;
            return prevR + f * (r - prevR);
        }
        prevR = r;
        prevCum = cum;
    }
    return prevR;
}

} // namespace

WindowResult measureWindowed(const IsoMeasure& m, const std::vector<Run>& runs, std::int32_t segId,
                             const Image<std::int32_t>& seg, const DetectionImages& im,
                             const DetectionParams& p) {
    WindowResult w;
    w.x = m.xIso;
    w.y = m.yIso;
    const double sigma = std::max(p.windowMinSigma, p.windowSigmaFactor * halfLightRadius(m, runs, im));
    const double inv2s2 = 1.0 / (2.0 * sigma * sigma);
    const double rMax = 4.0 * sigma; // WINPOS_NSIG
    const double rMax2 = rMax * rMax;
    double x = m.xIso, y = m.yIso;
    double errx2 = 0.0, erry2 = 0.0;
    bool ok = false;
    for (int it = 0; it < std::max(1, p.windowMaxIterations); ++it) {
        const int xa = std::max(0, static_cast<int>(std::floor(x - rMax)));
        const int xb = std::min(im.width - 1, static_cast<int>(std::ceil(x + rMax)));
        const int ya = std::max(0, static_cast<int>(std::floor(y - rMax)));
        const int yb = std::min(im.height - 1, static_cast<int>(std::ceil(y + rMax)));
        double sw = 0.0, swx = 0.0, swy = 0.0, sex = 0.0, sey = 0.0;
        for (int yy = ya; yy <= yb; ++yy) {
            const float* vrow = im.sub.row(yy);
            const float* rrow = im.rms.data ? im.rms.row(yy) : nullptr;
            const std::uint8_t* srow = im.state.row(yy);
            const std::int32_t* grow = seg.row(yy);
            const double dy = yy - y;
            for (int xx = xa; xx <= xb; ++xx) {
                const double dx = xx - x;
                const double r2 = dx * dx + dy * dy;
                if (r2 >= rMax2) continue;
                if (srow[xx] & (StateBad | StateInvalid)) continue;
                if (grow[xx] != 0 && grow[xx] != segId) continue; // a neighbour's pixel
                const double v = vrow[xx];
                const double wt = std::exp(-r2 * inv2s2);
                const double wv = wt * v;
                sw += wv;
                swx += wv * dx;
                swy += wv * dy;
                const float rv = rrow ? rrow[xx] : im.rmsSampler->rmsAt(xx, yy);
                double var = static_cast<double>(rv) * rv;
                if (p.gain > 0.0 && v > 0.0) var += v / p.gain;
                sex += wt * wt * var * dx * dx;
                sey += wt * wt * var * dy * dy;
            }
        }
        if (!(sw > 0.0)) break;
        errx2 = 4.0 * sex / (sw * sw);
        erry2 = 4.0 * sey / (sw * sw);
        const double stepX = 2.0 * swx / sw, stepY = 2.0 * swy / sw; // SExtractor's accelerated step
        x += stepX;
        y += stepY;
        ok = true;
        if (stepX * stepX + stepY * stepY < p.windowTolerance * p.windowTolerance) break;
    }
    // A window that wandered off (noise, crowding) falls back to the isophotal barycentre.
    const double dx = x - m.xIso, dy = y - m.yIso;
    if (ok && std::isfinite(x) && std::isfinite(y) && dx * dx + dy * dy <= rMax2) {
        w.x = x;
        w.y = y;
        w.xErr = std::sqrt(errx2);
        w.yErr = std::sqrt(erry2);
    } else if (m.flux > 0.0) { // isophotal barycentre: its error, sqrt(var * x2) / flux
        w.xErr = std::sqrt(m.fluxVar * m.x2) / m.flux;
        w.yErr = std::sqrt(m.fluxVar * m.y2) / m.flux;
    } else {
        w.xErr = std::sqrt(m.x2);
        w.yErr = std::sqrt(m.y2);
    }
    return w;
}

} // namespace gpuphot::detail
