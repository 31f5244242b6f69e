#pragma once
// Small helpers shared by tests that build synthetic astrometric fields.
#include <gtest/gtest.h>

#include <cmath>

#include "core/catalog/reference_catalog.hpp"
#include "core/sim/simulator.hpp"
#include "core/wcs/tan_sip.hpp"

namespace gpuphot::test {

// A TAN(-SIP) projection with reference pixel (crpix1, crpix2) (FITS, 1-based), reference point
// (crval1, crval2) in degrees, pixel scale in arcsec/px and rotation in radians:
// CD = scale / 3600 * [[-cos, sin], [sin, cos]] (east to the left, north up at rotation 0). With
// sipOrder > 0 the SIP polynomials of that order are there, zeroed, for the caller to fill.
inline TanSip rotatedTanSip(double crpix1, double crpix2, double crval1, double crval2, double scaleArcsec,
                            double rotation, int sipOrder = 0) {
    TanSip t;
    t.crpix[0] = crpix1;
    t.crpix[1] = crpix2;
    t.crval[0] = crval1;
    t.crval[1] = crval2;
    const double s = scaleArcsec / 3600.0;
    t.cd[0][0] = -s * std::cos(rotation);
    t.cd[0][1] = s * std::sin(rotation);
    t.cd[1][0] = s * std::sin(rotation);
    t.cd[1][1] = s * std::cos(rotation);
    if (sipOrder > 0) t.setSipOrder(sipOrder);
    return t;
}

// Turns the CD matrix of `t` by `radians` (a header WCS with a rotation error).
inline void rotateCd(TanSip& t, double radians) {
    for (int k = 0; k < 2; ++k) {
        const double a = t.cd[k][0], b = t.cd[k][1];
        t.cd[k][0] = a * std::cos(radians) - b * std::sin(radians);
        t.cd[k][1] = a * std::sin(radians) + b * std::cos(radians);
    }
}

// Two fitted projections equal to the bit: CRVAL, CD and the SIP polynomials (e.g. one fit run twice).
inline void expectSameFit(const TanSip& a, const TanSip& b) {
    for (int k = 0; k < 2; ++k) {
        EXPECT_EQ(a.crval[k], b.crval[k]);
        EXPECT_EQ(a.cd[k][0], b.cd[k][0]);
        EXPECT_EQ(a.cd[k][1], b.cd[k][1]);
    }
    EXPECT_EQ(a.a, b.a);
    EXPECT_EQ(a.b, b.b);
}

// The simulator's reference catalog (ra, dec, mag, mag_err, colour, id; no proper motions) as the
// pipeline takes it.
inline ReferenceCatalog referenceOf(const SimResult& sim) {
    ReferenceCatalog ref;
    ref.ra = sim.reference.doubles("ra");
    ref.dec = sim.reference.doubles("dec");
    ref.mag = sim.reference.doubles("mag");
    ref.magErr = sim.reference.doubles("mag_err");
    ref.color = sim.reference.doubles("colour");
    ref.pmRa.assign(ref.ra.size(), std::nan(""));
    ref.pmDec.assign(ref.ra.size(), std::nan(""));
    for (double v : sim.reference.doubles("id"))
        ref.id.push_back(static_cast<std::int64_t>(v));
    return ref;
}

// The cosmic-ray test field (CPU tests and GPU comparisons): 512x448, 700 stars (a few saturated),
// sky 300 ADU, gain 1.5, read noise 6, FWHM 3 px, `cosmicRays` tracks up to 12 px long.
// A crowded field: `stars` stars of which 60% in two Plummer clusters of 18 px (deblending tests).
inline SimResult clusteredField(int w, int h, int stars, std::uint64_t seed) {
    SimParams sp;
    sp.width = w;
    sp.height = h;
    sp.stars = stars;
    sp.seed = seed;
    sp.clusters = 2;
    sp.clusterRadius = 18.0;
    sp.clusterFraction = 0.6;
    return simulateField(sp);
}

inline SimParams cosmicRayFieldParams(int cosmicRays, std::uint64_t seed = 7) {
    SimParams p;
    p.width = 512;
    p.height = 448;
    p.stars = 700;
    p.seed = seed;
    p.magBright = 10.5; // a few saturated stars
    p.magFaint = 20.0;
    p.sky = 300.0;
    p.gain = 1.5;
    p.readNoise = 6.0;
    p.fwhm = 3.0;
    p.cosmicRays = cosmicRays;
    p.cosmicRayLengthMax = 12.0;
    p.cosmicRayCharge = 3000.0;
    return p;
}

} // namespace gpuphot::test
