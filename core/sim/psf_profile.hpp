#pragma once
// Pixel-integrated source profiles of the simulator: elliptical Moffat and Gaussian stars and softened
// Sersic galaxies. Each profile g(rho) is truncated continuously at rho_max (g - g(rho_max) inside,
// 0 outside), and its amplitude is set so that the integral of the truncated profile over the plane
// equals the source's flux exactly (analytically for stars, by 1-D quadrature for galaxies); a
// pixel's value is the integral of the profile over its area (Gauss-Legendre product rules, with the
// pixels near the core subdivided), so the sum over a stamp equals the flux to ~1e-6.
#include <cstdint>

namespace gpuphot::sim {

enum class ProfileKind : std::uint8_t { Moffat, Gaussian, Sersic };

struct Profile {
    ProfileKind kind = ProfileKind::Gaussian;
    double xc = 0.0, yc = 0.0;       // centre, 0-based pixel coordinates (pixel centres at integers)
    double invSa = 1.0, invSb = 1.0; // 1/scale along the major and minor axes (1/px)
    double cosT = 1.0, sinT = 0.0;   // major-axis direction
    double beta = 3.0;               // Moffat beta; Sersic: 1/(2n)
    int betaInt = -1;                // Moffat: floor(beta) when 2 beta is an integer (fast path), else -1
    bool betaHalf = false;           // Moffat fast path: beta = betaInt + 1/2
    double bn = 0.0;                 // Sersic b_n
    double soft2 = 0.0;              // Sersic: softening added to rho^2
    double rhoMax2 = 1.0;            // truncation in rho^2
    double edge = 0.0;               // g at the truncation radius
    double amplitude = 0.0;          // flux / integral of (g - edge)
    double radius = 1.0;             // px: bounding radius of the rendered stamp (centre to farthest point)
    double coreRadius = 0.0;         // px: pixels whose centres lie within are subdivided ...
    int coreSub = 1;                 // ... into coreSub x coreSub cells of 4x4 Gauss-Legendre points
    double midRadius = 0.0;          // px: 3x3 points within, 2x2 beyond

    // Surface brightness (ADU/px^2) at offset (dx, dy) from the centre.
    double value(double dx, double dy) const;
    // Integral over pixel (ix, iy), i.e. over [ix - 0.5, ix + 0.5] x [iy - 0.5, iy + 0.5] (ADU).
    double pixel(int ix, int iy) const;
};

// A star of total flux `flux` (ADU) at (x, y) (0-based): FWHM geometric mean of the major and minor
// axes (px), ellipticity 1 - b/a, major axis at angleDeg counter-clockwise from +x. The profile is cut
// where its surface brightness falls to `threshold` (ADU/px^2), but not inside 2.5 major FWHM, nor
// where the cut would fold more than 1e-4 of the flux into the profile (so that faint and bright
// stars share one shape), nor beyond maxRadius px.
Profile makeStar(ProfileKind kind, double x, double y, double flux, double fwhm, double ellipticity,
                 double angleDeg, double beta, double threshold, double maxRadius);

// A galaxy: Sersic index n, half-light radius re (px, major axis), softened at the centre by a
// Gaussian-like core of `softening` px (the PSF's sigma), cut at the threshold or 8 re.
Profile makeGalaxy(double x, double y, double flux, double re, double n, double ellipticity, double angleDeg,
                   double softening, double threshold, double maxRadius);

// Moffat alpha (px) of a profile with this FWHM and beta; Gaussian sigma of this FWHM.
double moffatAlpha(double fwhm, double beta);
double gaussianSigma(double fwhm);

} // namespace gpuphot::sim
