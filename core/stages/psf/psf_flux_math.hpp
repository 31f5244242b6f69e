#pragma once
// The arithmetic of the PSF photometry (stage 3's last step: one weighted linear flux fit per source on
// the local ePSF) as inline GPUPHOT_HD pieces, so that the CPU loop (core/stages/psf/psf_epsf.cpp fitPsfFlux,
// EpsfCell::valueAt) and the CUDA kernel (kernels/psf/psf.cu) run the same operations in the same order and
// agree bitwise (docs/ARCHITECTURE.md, Determinism). Only + - * / and sqrt; no CUDA or Qt includes.
//
// One fit (fitPsfFlux): the pixels of the disc of `radius` around (x, y), rows j then columns i
// (forDiscPixels); a pixel off the frame fails the fit. Per pixel the ePSF p is the blend of up to four
// grid cells (blendCells, blendValue of the cells' bicubic valueAt); tallyPixel sums the positive PSF
// weight of all and of the masked pixels; the unmasked pixels enter the fit with d = data - level and
// rms^2. discAccepted checks the masked weight and the pixel count; three passes of addPixel (the Poisson
// term of pass > 0 from the previous pass's flux) and solveFlux give the flux, fluxVariance its variance.
// The CPU stores the pixels' (d, p, rms^2) after the first walk; the kernel (fitFluxRewalk) walks the disc
// again in every pass and recomputes them: the same values.
#include <algorithm>
#include <cmath>

#include "core/util/hd.hpp"
#include "core/util/hd_math.hpp"

namespace gpuphot::psfmath {

// Radius of the fitted disc: the parameter when > 0, else max(2, 1.5 * local FWHM) (NaN FWHM: 2).
GPUPHOT_HD inline double fitRadius(double psfFitRadius, double fwhm) {
    return psfFitRadius > 0.0 ? psfFitRadius : std::max(2.0, 1.5 * fwhm);
}

// Keys cubic convolution weights (a = -0.5) for the nodes -1, 0, 1, 2 around a fraction t in [0, 1).
GPUPHOT_HD inline void keysWeights(double t, double w[4]) {
    w[0] = ((-0.5 * t + 1.0) * t - 0.5) * t;
    w[1] = (1.5 * t - 2.5) * t * t + 1.0;
    w[2] = ((-1.5 * t + 2.0) * t + 0.5) * t;
    w[3] = (0.5 * t - 0.5) * t * t;
}

// One ePSF cell's oversampled image (row-major, row stride = width) and its node of zero offset.
struct EpsfCellView {
    const float* image = nullptr;
    int width = 0, height = 0;
    double centreX = 0.0, centreY = 0.0;
    int oversampling = 1;
};

// EpsfCell::valueAt: bicubic (Keys) at an offset in native px; 0 outside and for an empty cell.
GPUPHOT_HD inline double cellValue(const EpsfCellView& c, double dx, double dy) {
    if (c.width <= 0 || c.height <= 0) return 0.0;
    const double u = c.centreX + dx * c.oversampling, v = c.centreY + dy * c.oversampling;
    const double fu = std::floor(u), fv = std::floor(v);
    const int iu = static_cast<int>(fu), iv = static_cast<int>(fv);
    if (iu < -1 || iv < -1 || iu > c.width || iv > c.height) return 0.0;
    double wu[4], wv[4];
    keysWeights(u - fu, wu);
    keysWeights(v - fv, wv);
    double s = 0.0;
    for (int b = 0; b < 4; ++b) {
        const int jj = iv - 1 + b;
        if (jj < 0 || jj >= c.height) continue;
        const float* row = c.image + static_cast<long long>(jj) * c.width;
        double r = 0.0;
        for (int a = 0; a < 4; ++a) {
            const int ii = iu - 1 + a;
            if (ii < 0 || ii >= c.width) continue;
            r += wu[a] * row[ii];
        }
        s += wv[b] * r;
    }
    return s;
}

// Cells and weights blending the ePSF at a frame position (bilinear in the cell centres, clamped) on a
// grid of gridNx x gridNy cells over a width x height frame; the number of cells (0: no grid).
GPUPHOT_HD inline void blendAxis(double p, int size, int n, int& k0, double& f) {
    const double cell = static_cast<double>(size) / n;
    double t = (p + 0.5) / cell - 0.5; // fractional index of the cell centres
    t = std::clamp(t, 0.0, static_cast<double>(n - 1));
    k0 = std::min(static_cast<int>(std::floor(t)), std::max(n - 2, 0));
    f = n > 1 ? t - k0 : 0.0;
}

GPUPHOT_HD inline int blendCells(int width, int height, int gridNx, int gridNy, double x, double y,
                                 int idx[4], double w[4]) {
    if (gridNx <= 0 || gridNy <= 0) return 0;
    int kx, ky;
    double fx, fy;
    blendAxis(x, width, gridNx, kx, fx);
    blendAxis(y, height, gridNy, ky, fy);
    int n = 0;
    for (int j = 0; j < 2; ++j)
        for (int i = 0; i < 2; ++i) {
            const double wi = (i ? fx : 1.0 - fx) * (j ? fy : 1.0 - fy);
            if (wi <= 0.0) continue;
            const int cx = std::min(kx + i, gridNx - 1), cy = std::min(ky + j, gridNy - 1);
            idx[n] = cy * gridNx + cx;
            w[n] = wi;
            ++n;
        }
    return n;
}

// The blended ePSF at offset (dx, dy): sum over the cells of weight * cellValue(cell, dx, dy).
template <class CellValue>
GPUPHOT_HD inline double blendValue(const CellValue& cellValueOf, int nCells, const int idx[4],
                                    const double w[4], double dx, double dy) {
    double p = 0.0;
    for (int k = 0; k < nCells; ++k)
        p += w[k] * cellValueOf(idx[k], dx, dy);
    return p;
}

// Visits the pixels of the disc of `radius` around (x, y) in rows j, then columns i, as
// visit(i, j, dx, dy) with dx = i - x, dy = j - y; stops (returns false) when visit returns false.
template <class Visit>
GPUPHOT_HD inline bool forDiscPixels(double x, double y, double radius, const Visit& visit) {
    const int i0 = static_cast<int>(std::floor(x - radius)), i1 = static_cast<int>(std::ceil(x + radius));
    const int j0 = static_cast<int>(std::floor(y - radius)), j1 = static_cast<int>(std::ceil(y + radius));
    for (int j = j0; j <= j1; ++j)
        for (int i = i0; i <= i1; ++i) {
            const double dx = i - x, dy = j - y;
            if (dx * dx + dy * dy > radius * radius) continue;
            if (!visit(i, j, dx, dy)) return false;
        }
    return true;
}

// Inputs of a fit the walk can refuse before any pixel: non-finite centre, radius <= 0.
GPUPHOT_HD inline bool fitInputsOk(double x, double y, double radius) {
    return hdmath::isFinite(x) && hdmath::isFinite(y) && radius > 0.0;
}

// First walk, per pixel inside the frame: the PSF weight sums; true when the pixel enters the fit.
GPUPHOT_HD inline bool tallyPixel(double p, bool masked, double& psfAll, double& psfMasked) {
    psfAll += std::max(p, 0.0);
    if (masked) {
        psfMasked += std::max(p, 0.0);
        return false;
    }
    return true;
}

// After the first walk: enough unmasked PSF weight and pixels for the fit.
GPUPHOT_HD inline bool discAccepted(double psfAll, double psfMasked, double maxMaskedWeight, int nPixels,
                                    bool fitBackground) {
    const int npar = fitBackground ? 2 : 1;
    return psfAll > 0.0 && !(psfMasked > maxMaskedWeight * psfAll) && nPixels >= npar + 3;
}

// The normal equations of one pass.
struct FluxSums {
    double hff = 0.0, hfb = 0.0, hbb = 0.0, gf = 0.0, gb = 0.0;
};

// One pixel of a pass: d = data - level, p = ePSF, rms2 = rms^2; the Poisson term of pass > 0 from the
// previous pass's flux (gain > 0).
GPUPHOT_HD inline void addPixel(FluxSums& s, double d, double p, double rms2, int pass, double flux,
                                double gain) {
    double var = rms2;
    if (pass > 0 && gain > 0.0) var += std::max(flux * p, 0.0) / gain;
    if (!(var > 0.0)) var = 1.0; // no noise model: unweighted
    const double w = 1.0 / var;
    s.hff += w * p * p;
    s.hfb += w * p;
    s.hbb += w;
    s.gf += w * p * d;
    s.gb += w * d;
}

// The flux of a pass's sums; false when the system is singular.
GPUPHOT_HD inline bool solveFlux(const FluxSums& s, bool fitBackground, double& flux) {
    if (fitBackground) {
        const double det = s.hff * s.hbb - s.hfb * s.hfb;
        if (!(det > 1e-12 * s.hff * s.hbb)) return false;
        flux = (s.gf * s.hbb - s.gb * s.hfb) / det;
    } else {
        if (!(s.hff > 0.0)) return false;
        flux = s.gf / s.hff;
    }
    return true;
}

inline constexpr int kFluxPasses = 3;

// The result of the last pass: flux and its error; false when not finite / negative variance.
GPUPHOT_HD inline bool finishFlux(const FluxSums& s, bool fitBackground, double flux, double& outFlux,
                                  double& outErr) {
    const double varF = fitBackground ? s.hbb / (s.hff * s.hbb - s.hfb * s.hfb) : 1.0 / s.hff;
    if (!hdmath::isFinite(flux) || !(varF >= 0.0)) return false;
    outFlux = flux;
    outErr = std::sqrt(varF);
    return true;
}

// The whole fit with the disc walked again in every pass instead of storing the pixel terms (the CUDA
// kernel's way; bitwise fitPsfFlux, which stores them). Frame: inside(i, j), masked(i, j) (bool) and
// data(i, j), level(i, j), rms(i, j) (double); cellValueOf(cell, dx, dy): the ePSF cell `cell` at an offset.
template <class Frame, class CellValue>
GPUPHOT_HD inline bool fitFluxRewalk(const Frame& f, const CellValue& cellValueOf, int width, int height,
                                     int gridNx, int gridNy, double x, double y, double radius,
                                     bool fitBackground, double maxMaskedWeight, double gain, double& outFlux,
                                     double& outErr) {
    if (!fitInputsOk(x, y, radius)) return false;
    int idx[4] = {0, 0, 0, 0};
    double bw[4] = {0.0, 0.0, 0.0, 0.0};
    const int nCells = blendCells(width, height, gridNx, gridNy, x, y, idx, bw);
    if (nCells == 0) return false;
    double psfAll = 0.0, psfMasked = 0.0;
    int nPixels = 0;
    const bool inFrame = forDiscPixels(x, y, radius, [&](int i, int j, double dx, double dy) {
        if (!f.inside(i, j)) return false; // too close to the edge
        const double p = blendValue(cellValueOf, nCells, idx, bw, dx, dy);
        if (tallyPixel(p, f.masked(i, j), psfAll, psfMasked)) ++nPixels;
        return true;
    });
    if (!inFrame || !discAccepted(psfAll, psfMasked, maxMaskedWeight, nPixels, fitBackground)) return false;
    double flux = 0.0;
    FluxSums sums;
    for (int pass = 0; pass < kFluxPasses; ++pass) {
        sums = FluxSums{};
        forDiscPixels(x, y, radius, [&](int i, int j, double dx, double dy) {
            if (f.masked(i, j)) return true;
            const double p = blendValue(cellValueOf, nCells, idx, bw, dx, dy);
            const double r = f.rms(i, j);
            addPixel(sums, f.data(i, j) - f.level(i, j), p, r * r, pass, flux, gain);
            return true;
        });
        if (!solveFlux(sums, fitBackground, flux)) return false;
    }
    return finishFlux(sums, fitBackground, flux, outFlux, outErr);
}

} // namespace gpuphot::psfmath
