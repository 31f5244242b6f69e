#pragma once
// SExtractor's windowed measurement (XWIN_IMAGE, YWIN_IMAGE, ERRAWIN_IMAGE, FLUX_WIN, SNR_WIN): a centroid
// iterated with a Gaussian window of sigma = FLUX_RADIUS(0.5) x 2 / 2.35 over 4 sigma, the window's edge
// pixels cut in 11 x 11 sub-pixels, each step twice the weighted offset, until a step is shorter than 1e-4 px
// (16 at most). Unusable pixels take the value of their mirror through the centre (with `mirror`: MASK_TYPE
// CORRECT), else 0. The flux is the window-weighted sum; its variance and the position's come from each
// pixel's variance (and photon noise with a gain) with the window's weights squared. Used by the SExtractor
// catalog (sextractor_catalog.cpp); gpuphot's own x, y are its detection stage's windowed centroid.
#include <functional>

namespace gpuphot {

struct SextractorWindow {
    double x = 0.0, y = 0.0; // 0-based
    double flux = 0.0, fluxErr = 0.0;
    double errA = 0.0, errB = 0.0; // px, the position's error ellipse
    double errTheta = 0.0;         // deg, counter-clockwise from x
    bool truncated = false;        // the window reached the frame's edge
};

// pixel(x, y, value, variance): false when the pixel is unusable (masked, NaN); x, y within the frame.
using WindowPixel = std::function<bool(int x, int y, double& value, double& variance)>;

// From the 0-based start (X_IMAGE - 1) with the half-light radius hlRadius (px, > 0); gain in e-/ADU (0:
// no photon noise).
SextractorWindow sextractorWindow(const WindowPixel& pixel, int width, int height, double x0, double y0,
                                  double hlRadius, double gain, bool mirror = true);

} // namespace gpuphot
