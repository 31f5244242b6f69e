#pragma once
// A gnomonic (TAN) projection with optional SIP polynomial distortion, in closed form. This is what the
// simulator draws fields with and what the astrometric fit produces; Wcs::fromTanSip hands it to
// WCSLIB for everything else. Pixel coordinates are 0-based here; crpix is stored as FITS CRPIX
// (1-based), as written to headers.
#include <optional>
#include <vector>

namespace gpuphot {

class Header;

struct TanSip {
    double crpix[2] = {0.0, 0.0};                              // FITS CRPIX1/2 (1-based pixel)
    double crval[2] = {0.0, 0.0};                              // deg (RA, Dec) of the reference point
    double cd[2][2] = {{-1.0 / 3600, 0.0}, {0.0, 1.0 / 3600}}; // deg/px, CDi_j
    int sipOrder = 0;    // 0: pure TAN; 2..9: A/B polynomials of that order
    int sipInvOrder = 0; // 0: invert numerically; else AP/BP of that order
    // Coefficient of u^p v^q is at [p * (order + 1) + q]; terms with p + q < 2 are zero (SIP convention).
    std::vector<double> a, b, ap, bp;

    // Forward SIP distortion of intermediate pixel offsets (u, v) = pixel - CRPIX (1-based pixel).
    void distort(double u, double v, double& du, double& dv) const;
    void pixelToWorld(double x, double y, double& ra, double& dec) const; // x, y 0-based; degrees
    bool worldToPixel(double ra, double dec, double& x, double& y) const; // false behind the tangent plane
    // The second half of worldToPixel: pixel (0-based) from standard coordinates (xi, eta; degrees) about
    // crval: CD^-1, then the SIP inverse (AP/BP as the start, Newton on A/B). worldToPixel(ra, dec) is
    // tanProject + this, bit for bit.
    void standardToPixel(double xi, double eta, double& x, double& y) const;

    double pixelScaleArcsec() const; // sqrt(|det CD|) in arcsec/px
    double& coeffA(int p, int q) { return a[p * (sipOrder + 1) + q]; }
    double& coeffB(int p, int q) { return b[p * (sipOrder + 1) + q]; }
    void setSipOrder(int order); // resizes a, b (zeroed) to the order

    // The standard keywords: CTYPEi = RA---TAN(-SIP), CRPIXi, CRVALi, CDi_j, A_ORDER, A_p_q, B_..., AP_/BP_.
    Header toHeader() const;
};

// The header's WCS as a TanSip when it is exactly a TAN or TAN-SIP that TanSip evaluates the same way as
// WCSLIB: CTYPE1/2 = RA---TAN(-SIP) / DEC--TAN(-SIP), CDi_j (or PCi_j with CDELTi), CUNIT deg or absent,
// LONPOLE 180 or absent, no PVi_m (and no other distortion keywords), SIP A_/B_ (AP_/BP_ when present).
// nullopt for anything else (other projections, TPV, swapped or galactic axes, missing keywords): callers
// then use WCSLIB. Meant for Wcs::toHeader()'s output (wcshdo), so that hot loops can project in closed form.
std::optional<TanSip> tanSipFromHeaderExact(const Header& header);

// Gnomonic projection helpers (degrees in, degrees out): standard coordinates (xi, eta) of (ra, dec)
// about the tangent point (ra0, dec0). Returns false when the point is on the far hemisphere.
bool tanProject(double ra0, double dec0, double ra, double dec, double& xi, double& eta);
// The same with the sines and cosines of the declinations given (sin/cos of dec * pi / 180): bit for bit
// tanProject, for loops that project the same stars about several tangent points.
bool tanProjectSinCos(double ra0, double sinDec0, double cosDec0, double ra, double sinDec, double cosDec,
                      double& xi, double& eta);
// sin and cos of an angle in degrees, as tanProject computes them.
void sinCosDeg(double deg, double& s, double& c);
void tanDeproject(double ra0, double dec0, double xi, double eta, double& ra, double& dec);
// Great-circle separation in degrees.
double angularSeparationDeg(double ra1, double dec1, double ra2, double dec2);

} // namespace gpuphot
