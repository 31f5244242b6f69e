// Per-object measurements: isophotal (barycentre, second moments, ellipse, flux, peak, bounding box,
// flags) and windowed (SExtractor XWIN/YWIN). Sums in double over the pixels in raster order.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/model/flags.hpp"
#include "core/stages/detection/detection_internal.hpp"
#include "core/stages/detection/detection_sums.hpp"
#include "core/stages/detection/detection_window.hpp"
#include "core/stages/detection/detection_window_rows.hpp"

namespace gpuphot::detail {

namespace {
constexpr double kPi = 3.14159265358979323846;
constexpr double kRadToDeg = 180.0 / kPi;
} // namespace

IsoSums accumulateIsophotal(const std::vector<Run>& runs, const DetectionImages& im,
                            const DetectionParams& p) {
    IsoSums q;
    q.x0 = runs.front().x0;
    q.y0 = runs.front().y;
    q.xMin = runs.front().x0;
    q.xMax = runs.front().x1;
    q.yMin = runs.front().y;
    q.yMax = runs.back().y;
    for (const Run& r : runs) {
        const float* vrow = im.sub.row(r.y);
        const float* drow = im.det.row(r.y);
        const float* rrow = im.rms.data ? im.rms.row(r.y) : nullptr;
        const std::uint8_t* srow = im.state.row(r.y);
        isoAddRun(q, r, p.gain, [&](std::int32_t x) {
            const float rms = rrow ? rrow[x] : im.rmsSampler->rmsAt(x, r.y);
            return IsoPixel{vrow[x], drow[x], rms, srow[x], im.absolute ? im.threshold : im.threshold * rms};
        });
    }
    q.thrAtPeak = im.thresholdAt(q.detPeakX, q.detPeakY);
    return q;
}

IsoMeasure measureIsophotal(const std::vector<Run>& runs, const DetectionImages& im,
                            const DetectionParams& p) {
    return finishIsophotal(accumulateIsophotal(runs, im, p), im.width, im.height, p.sextractorIso);
}

IsoMeasure finishIsophotal(const IsoSums& q, int width, int height, bool sextractorIso) {
    IsoMeasure m;
    const double x0 = q.x0, y0 = q.y0;
    const bool d = sextractorIso;
    const double s = d ? q.ds : q.s, sx = d ? q.dsx : q.sx, sy = d ? q.dsy : q.sy;
    const double sxx = d ? q.dsxx : q.sxx, syy = d ? q.dsyy : q.syy, sxy = d ? q.dsxy : q.sxy;
    const double n = q.n, nx = q.nx, ny = q.ny, nxx = q.nxx, nyy = q.nyy, nxy = q.nxy;
    const std::uint8_t stateOr = q.stateOr;
    m.xMin = q.xMin;
    m.xMax = q.xMax;
    m.yMin = q.yMin;
    m.yMax = q.yMax;
    m.detPeakX = q.detPeakX;
    m.detPeakY = q.detPeakY;
    m.area = static_cast<std::int32_t>(n);
    m.isoArea = static_cast<std::int32_t>(d ? q.nAbove : n);
    m.flux = q.s;
    m.fluxVar = q.var;
    m.peak = q.peak;
    m.detPeak = q.detPeak;
    m.thrAtPeak = q.thrAtPeak;

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
    if (m.xMin == 0 || m.yMin == 0 || m.xMax == width - 1 || m.yMax == height - 1) m.flags |= FlagEdge;
    return m;
}

namespace {

// Row access of the host images for windowedPositionRows: a span of the row copied into its buffers.
struct HostWindowRow {
    const float* vrow;
    const float* rrow; // null: the sampler
    const std::uint8_t* srow;
    const std::int32_t* grow;
    const BackgroundSampler* sampler;
    int y;
    void span(int x0, int n, float* sub, float* rms, std::uint8_t* state, std::int32_t* seg) const {
        const auto un = static_cast<std::size_t>(n);
        std::memcpy(sub, vrow + x0, un * sizeof(float));
        if (rrow)
            std::memcpy(rms, rrow + x0, un * sizeof(float));
        else
            sampler->rmsSpan(y, x0, n, rms);
        std::memcpy(state, srow + x0, un);
        std::memcpy(seg, grow + x0, un * sizeof(std::int32_t));
    }
};
struct HostWindowImage {
    const DetectionImages& im;
    const Image<std::int32_t>& seg;
    HostWindowRow row(int y) const {
        return {im.sub.row(y),   im.rms.data ? im.rms.row(y) : nullptr,
                im.state.row(y), seg.row(y),
                im.rmsSampler,   y};
    }
};

// Half-light radius from the isophotal pixels: circular growth curve around the barycentre, the
// pixels taken in order of distance (ties: raster order), linear interpolation between pixels.
double halfLightRadius(const WindowObject& m, const std::vector<Run>& runs, const DetectionImages& im) {
    // (r^2, raster index, value): sorted by r^2, then index (the stable order), in place in a buffer
    // kept per thread (a merge sort allocated its buffer for every object).
    struct Pixel {
        double r2;
        std::int32_t at;
        float v;
    };
    thread_local std::vector<Pixel> rv;
    rv.clear();
    for (const Run& r : runs) {
        const float* vrow = im.sub.row(r.y);
        for (std::int32_t x = r.x0; x <= r.x1; ++x)
            rv.push_back({windowR2(m, x, r.y), static_cast<std::int32_t>(rv.size()), vrow[x]});
    }
    std::sort(rv.begin(), rv.end(),
              [](const Pixel& a, const Pixel& b) { return a.r2 < b.r2 || (a.r2 == b.r2 && a.at < b.at); });
    return halfLightRadiusSorted(m, static_cast<std::int64_t>(rv.size()),
                                 [&](std::int64_t i, double& r2, double& v) {
                                     r2 = rv[i].r2;
                                     v = rv[i].v;
                                 });
}

} // namespace

WindowResult measureWindowed(const IsoMeasure& m, const std::vector<Run>& runs, std::int32_t segId,
                             const Image<std::int32_t>& seg, const DetectionImages& im,
                             const DetectionParams& p) {
    const WindowObject o = windowObject(m);
    thread_local WindowRowScratch scratch;
    return windowedPositionRows(o, halfLightRadius(o, runs, im), segId, HostWindowImage{im, seg},
                                windowConfig(p, im.width, im.height), scratch);
}

} // namespace gpuphot::detail
