#include "core/pipeline/sextractor_window.hpp"

#include <algorithm>
#include <cmath>

namespace gpuphot {

namespace {

constexpr int kMaxSteps = 16;       // WINPOS_NITERMAX
constexpr double kNSigma = 4.0;     // WINPOS_NSIG
constexpr int kOversample = 11;     // WINPOS_OVERSAMP
constexpr double kMinStep = 1e-4;   // WINPOS_STEPMIN, px
constexpr double kStepFactor = 2.0; // WINPOS_FAC: twice the weighted offset (exact for a Gaussian)
constexpr double kPi = 3.14159265358979323846;

struct Sums {
    double tv = 0, dx = 0, dy = 0, esum = 0, ex2 = 0, ey2 = 0, exy = 0;
};

// The window's weight of pixel offset (dx, dy): its area inside the 4-sigma circle (sub-sampled near the
// edge) times the Gaussian.
double windowWeight(double dx, double dy, double raper, double invTwoSig2) {
    const double r2 = dx * dx + dy * dy;
    const double rin = raper - 0.75, rin2 = rin > 0.0 ? rin * rin : 0.0;
    double area = 1.0;
    if (r2 > rin2) {
        const double s = 1.0 / kOversample, off = 0.5 * (s - 1.0);
        area = 0.0;
        double sy = dy + off;
        for (int j = 0; j < kOversample; ++j, sy += s) {
            double sx = dx + off;
            for (int i = 0; i < kOversample; ++i, sx += s)
                if (sx * sx + sy * sy < raper * raper) area += s * s;
        }
    }
    return area * std::exp(-r2 * invTwoSig2);
}

// One pass over the window about (mx, my).
Sums windowSums(const WindowPixel& pixel, int width, int height, double mx, double my, double raper,
                double invTwoSig2, double invGain, bool mirror, bool& truncated) {
    const int x0 = static_cast<int>(mx - raper + 0.499999), x1 = static_cast<int>(mx + raper + 1.499999);
    const int y0 = static_cast<int>(my - raper + 0.499999), y1 = static_cast<int>(my + raper + 1.499999);
    truncated = truncated || x0 < 0 || y0 < 0 || x1 > width || y1 > height;
    const double mirrorX = mx * 2.0 + 0.49999, mirrorY = my * 2.0 + 0.49999;
    const double rext2 = (raper + 0.75) * (raper + 0.75);
    Sums s;
    for (int y = std::max(0, y0); y < std::min(height, y1); ++y)
        for (int x = std::max(0, x0); x < std::min(width, x1); ++x) {
            const double dx = x - mx, dy = y - my;
            if (dx * dx + dy * dy >= rext2) continue;
            const double w = windowWeight(dx, dy, raper, invTwoSig2);
            double pix = 0.0, var = 0.0;
            if (!pixel(x, y, pix, var)) {
                const int xm = static_cast<int>(mirrorX - x), ym = static_cast<int>(mirrorY - y);
                if (!mirror || xm < 0 || ym < 0 || xm >= width || ym >= height || !pixel(xm, ym, pix, var))
                    pix = var = 0.0;
            }
            const double wp = w * pix;
            s.tv += wp;
            s.dx += wp * dx;
            s.dy += wp * dy;
            double err = var;
            if (invGain > 0.0 && pix > 0.0) err += pix * invGain;
            const double e2 = w * w * err;
            s.esum += e2;
            s.ex2 += e2 * (dx * dx + 0.0833); // finite pixel size
            s.ey2 += e2 * (dy * dy + 0.0833);
            s.exy += e2 * dx * dy;
        }
    return s;
}

} // namespace

SextractorWindow sextractorWindow(const WindowPixel& pixel, int width, int height, double x0, double y0,
                                  double hlRadius, double gain, bool mirror) {
    SextractorWindow out;
    const double sig = hlRadius * 2.0 / 2.35, invTwoSig2 = 1.0 / (2.0 * sig * sig), raper = kNSigma * sig;
    const double invGain = gain > 0.0 ? 1.0 / gain : 0.0;
    double mx = x0, my = y0;
    Sums s;
    for (int i = 0; i < kMaxSteps; ++i) {
        s = windowSums(pixel, width, height, mx, my, raper, invTwoSig2, invGain, mirror, out.truncated);
        if (!(s.tv > 0.0)) break;
        const double ddx = s.dx / s.tv, ddy = s.dy / s.tv;
        mx += ddx * kStepFactor;
        my += ddy * kStepFactor;
        if (ddx * ddx + ddy * ddy < kMinStep * kMinStep) break;
    }
    out.x = mx;
    out.y = my;
    out.flux = s.tv;
    out.fluxErr = std::sqrt(s.esum);
    if (s.tv > 0.0) {
        const double norm = kStepFactor * kStepFactor / (s.tv * s.tv);
        const double ex2 = s.ex2 * norm, ey2 = s.ey2 * norm, exy = s.exy * norm;
        const double d = ex2 - ey2;
        const double theta = std::fabs(d) > 0.0 ? 0.5 * std::atan2(2.0 * exy, d) : kPi / 4.0;
        const double t = std::sqrt(0.25 * d * d + exy * exy), mean = 0.5 * (ex2 + ey2);
        out.errA = std::sqrt(mean + t);
        out.errB = std::sqrt(std::max(0.0, mean - t));
        out.errTheta = theta * 180.0 / kPi;
    }
    return out;
}

} // namespace gpuphot
