#pragma once
// Internals of stage 3 shared by psf.cpp and psf_epsf.cpp: pixel access with the background maps, the
// ePSF construction of one grid cell, and PSF photometry of one source.
//
// ePSF of a cell (what is done, in the spirit of Anderson & King 2000 / photutils' EPSFBuilder):
//  1. An analytic base: the pixel-integrated profile with the spatial model's shape at the cell centre
//     and the field's median beta, normalised to unit total flux, sampled on the oversampled nodes.
//  2. Every PSF star of the cell contributes its stamp: (data - background - fitted offset) / fitted
//     flux, registered by its fitted sub-pixel centre; each pixel gives a residual against the base at
//     its exact offset, binned to the nearest oversampled node.
//  3. Per node a sigma-clipped mean (3 sigma around the median, MAD scale) of the residuals; the node
//     means are smoothed by normalised convolution with a 3 x 3 binomial kernel (count-weighted), which
//     fills the nodes no star sampled; ePSF = base + smoothed residual.
//  4. One re-centring iteration: the ePSF's centroid within a disc of radius FWHM is measured and the
//     stars are re-registered by it (steps 2-3 again).
//  5. Normalised to unit sum at native sampling (the nodes of zero sub-pixel phase).
#include <cstdint>
#include <vector>

#include "core/model/image.hpp"
#include "core/stages/psf/psf.hpp"

namespace gpuphot {

struct BackgroundResult;
class RunContext;
struct Sources;

struct PsfFrame {
    ImageView image;
    MaskView mask;
    const BackgroundResult* bkg = nullptr;
    double gain = 0.0;

    double level(int x, int y) const;
    double rms(int x, int y) const;
    bool masked(int x, int y) const { return !mask.empty() && mask(x, y) != 0; }
    std::uint8_t maskBits(int x, int y) const { return mask.empty() ? 0 : mask(x, y); }
    bool inside(int x, int y) const { return x >= 0 && y >= 0 && x < image.width && y < image.height; }
};

// base: the analytic profile (centre 0, unit flux) of the cell; radius: native px half-size. The
// arithmetic is core/stages/psf/psf_epsf_math.hpp's, shared with the CUDA batch (kernels/psf/psf_epsf.cu).
void buildEpsfCell(EpsfCell& cell, const PsfFrame& frame, const std::vector<const PsfStar*>& stars,
                   const ProfileParams& base, PsfModelKind kind, int radius, int oversampling, int nQuad);

// buildEpsfCell's ePSF on the nodes in double precision, before the unit-sum normalisation (steps 1-4;
// tests compare the CUDA batch's with it).
std::vector<double> epsfCellNodes(const PsfFrame& frame, const std::vector<const PsfStar*>& stars,
                                  const ProfileParams& base, PsfModelKind kind, int radius, int oversampling,
                                  int nQuad);

// The psffit parameter vector of a profile (psffit::kLmParams = 8 values: x0, y0, amplitude, background,
// c11, c12, c22, beta), as profileValue evaluates it.
void profileVector(const ProfileParams& p, double out[8]);

struct PsfFluxResult {
    double flux = 0.0, fluxErr = 0.0;
    bool ok = false;
};
PsfFluxResult fitPsfFlux(const PsfFrame& frame, const PsfResult& model, double x, double y, double radius,
                         bool fitBackground, double maxMaskedWeight);

// The stage's PSF photometry on the host (cpu::buildPsfModel's last step, params.psfPhotometry): per
// source with a finite position and a model, fitPsfFlux with the radius psfmath::fitRadius; fills
// res.fluxPsf / fluxPsfErr, or sets FlagPsfFitFailed (parallel over sources, one slot each). The CUDA
// stage (kernels/psf/psf.cu) runs the same fits on the device and falls back to this.
void measurePsfFluxes(PsfResult& res, const PsfFrame& frame, const Sources& sources, const PsfParams& params,
                      RunContext& ctx);

} // namespace gpuphot
