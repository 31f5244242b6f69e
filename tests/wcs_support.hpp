#pragma once
// A TAN WCS header for tests: the sky position (ra, dec) (deg) at the 1-based pixel (crpix1, crpix2),
// `scaleArcsec` per pixel, north up and east left turned by `rotDeg` (CD matrix, no distortion).
#include <cmath>

#include "core/model/header.hpp"

namespace gpuphot::test {

inline Header tanHeader(double ra, double dec, double crpix1, double crpix2, double scaleArcsec,
                        double rotDeg = 0.0) {
    const double s = scaleArcsec / 3600.0, c = std::cos(rotDeg * M_PI / 180.0),
                 n = std::sin(rotDeg * M_PI / 180.0);
    Header h;
    h.set("CTYPE1", "RA---TAN");
    h.set("CTYPE2", "DEC--TAN");
    h.set("CRPIX1", crpix1);
    h.set("CRPIX2", crpix2);
    h.set("CRVAL1", ra);
    h.set("CRVAL2", dec);
    h.set("CD1_1", -s * c);
    h.set("CD1_2", s * n);
    h.set("CD2_1", s * n);
    h.set("CD2_2", s * c);
    return h;
}

} // namespace gpuphot::test
