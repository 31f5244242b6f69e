#pragma once
// The per-pixel sums of an object's isophotal measurement (detection_measure.cpp's measureIsophotal) and
// of its CLEAN description (detection_clean.cpp), shared by the CPU stage and the CUDA per-object kernels
// (kernels/detection/detection_objects.cu) so that both give the same bits (docs/ARCHITECTURE.md,
// Determinism): the same operations in the same order (pixels in raster order), doubles, no fused
// multiply-adds. The sums are finished on the host (finishIsophotal, describeFromSums: sqrt, atan2, log and
// pow of the C library). Not a public API.
#include <cstdint>
#include <limits>

#include "core/stages/detection/detection_internal.hpp"
#include "core/util/hd.hpp"

namespace gpuphot::detail {

// One pixel as the isophotal sums read it.
struct IsoPixel {
    float sub, det, rms;
    std::uint8_t state;
    double thr; // the detection threshold at the pixel (DetectionImages::thresholdAt)
};

// Adds the pixels of run r (in order of x) to q; pix(x) gives the IsoPixel of (x, r.y). q.x0, q.y0 must be
// set (the object's first pixel).
template <class PixelOf>
GPUPHOT_HD inline void isoAddRun(IsoSums& q, const Run& r, double gain, PixelOf pix) {
    q.xMin = r.x0 < q.xMin ? r.x0 : q.xMin; // std::min(xMin, x0)
    q.xMax = q.xMax < r.x1 ? r.x1 : q.xMax; // std::max(xMax, x1)
    const double dy = r.y - q.y0;
    for (std::int32_t x = r.x0; x <= r.x1; ++x) {
        const IsoPixel px = pix(x);
        const double v = px.sub;
        const double dx = x - q.x0;
        q.s += v;
        q.sx += v * dx;
        q.sy += v * dy;
        q.sxx += v * dx * dx;
        q.syy += v * dy * dy;
        q.sxy += v * dx * dy;
        const double d = px.det;
        q.ds += d;
        q.dsx += d * dx;
        q.dsy += d * dy;
        q.dsxx += d * dx * dx;
        q.dsyy += d * dy * dy;
        q.dsxy += d * dx * dy;
        if (v > px.thr) q.nAbove += 1.0;
        q.n += 1.0;
        q.nx += dx;
        q.ny += dy;
        q.nxx += dx * dx;
        q.nyy += dy * dy;
        q.nxy += dx * dy;
        const double rms = px.rms;
        q.var += rms * rms;
        if (gain > 0.0 && v > 0.0) q.var += v / gain;
        if (v > q.peak) q.peak = v;
        if (static_cast<double>(px.det) > q.detPeak) {
            q.detPeak = px.det;
            q.detPeakX = x;
            q.detPeakY = r.y;
        }
        q.stateOr |= px.state;
    }
}

// The CLEAN description's sums over an object's pixels (raster order).
struct CleanSums {
    double x0 = 0.0, y0 = 0.0;
    double s = 0.0, sx = 0.0, sy = 0.0, sxx = 0.0, syy = 0.0, sxy = 0.0;
    double thresh = std::numeric_limits<double>::infinity();
    double peak = -std::numeric_limits<double>::infinity(); // unfiltered
    std::int64_t n = 0;
    float mthresh = 0.0f; // the minArea-th largest (filtered - threshold); valid when hasMthresh
    bool hasMthresh = false;
    std::int64_t nAbove = 0, nAbove2 = 0; // unfiltered > thresh, > (thresh + peak) / 2
};

// Pass 1 of one pixel: d filtered, v unfiltered, t the pixel's threshold.
GPUPHOT_HD inline void cleanAddPixel(CleanSums& c, std::int32_t x, std::int32_t y, double d, double v,
                                     double t) {
    const double dx = x - c.x0, dy = y - c.y0;
    c.s += d;
    c.sx += d * dx;
    c.sy += d * dy;
    c.sxx += d * dx * dx;
    c.syy += d * dy * dy;
    c.sxy += d * dx * dy;
    c.thresh = t < c.thresh ? t : c.thresh; // std::min(thresh, t)
    c.peak = c.peak < v ? v : c.peak;       // std::max(peak, v)
    ++c.n;
}

// Pass 2 of one pixel (after pass 1 over all of them): v unfiltered.
GPUPHOT_HD inline void cleanAddPixel2(CleanSums& c, double v) {
    const double thresh2 = 0.5 * (c.thresh + c.peak);
    c.nAbove += v > c.thresh;
    c.nAbove2 += v > thresh2;
}

// Keeps top[0..count) the `count` largest values seen so far in descending order, count <= k.
GPUPHOT_HD inline void topKInsert(float* top, int& count, int k, float v) {
    int i;
    if (count < k) {
        i = count++;
    } else {
        if (!(v > top[k - 1])) return;
        i = k - 1;
    }
    while (i > 0 && top[i - 1] < v) {
        top[i] = top[i - 1];
        --i;
    }
    top[i] = v;
}

} // namespace gpuphot::detail
