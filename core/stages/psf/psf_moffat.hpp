#pragma once
// Analytic PSF profiles (elliptical Moffat, elliptical Gaussian) and their Levenberg–Marquardt fit
// (analytic Jacobian, core/stages/psf/psf_fit_math.hpp). Used by the PSF stage (stage 3) for the PSF stars and to
// measure ePSFs.
//
// Profile, with dx = x - x0, dy = y - y0 and the quadratic form Q = c11 dx^2 + 2 c12 dx dy + c22 dy^2:
//   Moffat:   f = amplitude * (1 + Q)^(-beta) + background
//   Gaussian: f = amplitude * exp(-Q / 2)   + background
// The shape is carried by (c11, c12, c22), positive definite, which stays well defined for round stars
// (no angle degeneracy). A pixel's model value is the profile integrated over the pixel (Gauss–Legendre
// quadrature with n x n nodes), so the fitted FWHM is the intrinsic one, before pixelisation.
#include <atomic>
#include <cstdint>
#include <vector>

namespace gpuphot {

namespace psffit {
struct LmSetup;
struct LmOutcome;
} // namespace psffit

enum class PsfModelKind { Moffat, Gaussian };

struct ProfileParams {
    double x0 = 0.0, y0 = 0.0;              // px, centre
    double amplitude = 0.0;                 // ADU, peak of the (un-integrated) profile above the offset
    double background = 0.0;                // ADU, constant offset above the background map
    double c11 = 0.0, c12 = 0.0, c22 = 0.0; // px^-2, quadratic form
    double beta = 3.0;                      // Moffat exponent (ignored by the Gaussian)
};

struct ProfileShape {
    double fwhmA = 0.0, fwhmB = 0.0; // px, FWHM along the major / minor axis
    double fwhm = 0.0;               // px, sqrt(fwhmA * fwhmB)
    double ellipticity = 0.0;        // 1 - fwhmB / fwhmA
    double theta = 0.0;              // deg, major axis, counter-clockwise from +x, in (-90, 90]
    double e1 = 0.0, e2 = 0.0;       // ellipticity * (cos 2 theta, sin 2 theta)
};

// Shape of a profile from its quadratic form (NaN fields when it is not positive definite).
ProfileShape profileShape(const ProfileParams& p, PsfModelKind kind);
// Quadratic form of a profile of the given shape: geometric-mean FWHM, ellipticity 1 - b/a, theta (deg).
void setProfileShape(ProfileParams& p, PsfModelKind kind, double fwhm, double ellipticity, double thetaDeg);
// Total flux of the infinite profile (ADU): amplitude * integral of the unit profile.
double profileFlux(const ProfileParams& p, PsfModelKind kind);
// Profile value at (x, y), integrated over the unit pixel centred there with n x n Gauss–Legendre
// nodes (n = 1: value at the point). Includes the background offset.
double profileValue(const ProfileParams& p, PsfModelKind kind, double x, double y, int nQuad);

struct FitSample {
    double x, y;   // px, pixel centre (or node position)
    double value;  // ADU, background-subtracted data
    double weight; // 1 / variance
};

struct LmOptions {
    int maxIterations = 100;
    double relTolerance = 1e-10; // stop when the relative chi2 decrease is below this ...
    double posTolerance = 1e-6;  // ... and the centre moved less than this (px)
    bool fitBeta = true;
    bool fitBackground = true;
    double betaMin = 1.2, betaMax = 15.0;
    double maxShift = 3.0; // px, the centre may not move further than this from the start
    int nQuad = 3;         // Gauss–Legendre nodes per axis for the pixel integration (1..5)
};

struct ProfileFitResult {
    ProfileParams params;
    double chi2 = 0.0; // reduced chi2
    int iterations = 0;
    bool converged = false;
};

// Levenberg–Marquardt with Marquardt's diagonal damping (core/stages/psf/psf_fit_math.hpp psffit::lmFit):
// fixed operation order, independent of threads; a CUDA batch (kernels/psf/psf.cu) gives the same bits.
// Too few samples (<= the fitted parameters) or an invalid start: the start, 0 iterations, chi2 0.
// cancel (optional): once it is set, the fit throws Cancelled at its next evaluation (a fit of a large
// stamp takes a few ms; the workbench's next run waits for the fits in flight).
ProfileFitResult fitProfile(const std::vector<FitSample>& samples, PsfModelKind kind,
                            const ProfileParams& start, const LmOptions& opt,
                            const std::atomic<bool>* cancel = nullptr);

// fitProfile's pieces, for a batch that runs psffit::lmFit elsewhere (kernels/psf/psf.cu): the fit's setup,
// its start vector (8 values, psffit::ParamIndex order) and the result from lmFit's outcome.
psffit::LmSetup profileFitSetup(PsfModelKind kind, const ProfileParams& start, const LmOptions& opt);
void profileFitStart(const ProfileParams& start, const LmOptions& opt, double* p);
ProfileFitResult profileFitResult(const ProfileParams& start, const psffit::LmOutcome& outcome, int nSamples,
                                  int nActive);

} // namespace gpuphot
