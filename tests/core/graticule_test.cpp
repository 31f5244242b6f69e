// makeGraticule: round steps, lines that lie on their RA / Dec through the WCS, labels to the step's
// precision, a pole inside the frame, RA across 0h.
#include <gtest/gtest.h>

#include <cmath>

#include "core/wcs/graticule.hpp"
#include "core/wcs/wcs.hpp"
#include "tests/wcs_support.hpp"

namespace gpuphot {
namespace {

// A TAN frame of `size` px at `scale` arcsec/px, rotated by `rotDeg`, centred on (ra, dec).
Wcs tanFrame(double ra, double dec, int size, double scale, double rotDeg) {
    return Wcs::fromHeader(test::tanHeader(ra, dec, 0.5 * size + 0.5, 0.5 * size + 0.5, scale, rotDeg));
}

TEST(Graticule, LinesLieOnTheirCoordinatesAtRoundSteps) {
    const Wcs wcs = tanFrame(150.0, 30.0, 2048, 0.5, 20.0); // 17' across, rotated
    const GraticuleRegion r{-0.5, -0.5, 2047.5, 2047.5};
    const Graticule g = makeGraticule(wcs, r, 5);
    // 17' of Dec with at most 5 lines: 5' steps; RA 17'/cos 30 = 1.3 min of time: 30 s steps
    EXPECT_NEAR(g.decStep * 60.0, 5.0, 1e-9);
    EXPECT_NEAR(g.raStep * 3600.0 / 15.0, 30.0, 1e-9);
    int meridians = 0, parallels = 0;
    for (const GraticuleLine& l : g.lines) {
        (l.meridian ? meridians : parallels)++;
        const double step = l.meridian ? g.raStep : g.decStep;
        EXPECT_NEAR(std::remainder(l.value, step), 0.0, 1e-9) << l.label;
        ASSERT_FALSE(l.pieces.empty());
        for (const auto& p : l.pieces)
            for (std::size_t k = 0; k + 1 < p.size(); k += 2) {
                EXPECT_GE(p[k], r.x0);
                EXPECT_LE(p[k], r.x1);
                const auto [ra, dec] = wcs.pixelToWorld(p[k], p[k + 1]);
                if (l.meridian)
                    EXPECT_NEAR(std::remainder(ra - l.value, 360.0), 0.0, 1e-7);
                else
                    EXPECT_NEAR(dec, l.value, 1e-7);
            }
        // The label sits on the line, at an edge of the region.
        const double edge = std::min({l.labelX - r.x0, r.x1 - l.labelX, l.labelY - r.y0, r.y1 - l.labelY});
        EXPECT_LT(edge, 20.0) << l.label;
    }
    EXPECT_GE(meridians, 2);
    EXPECT_GE(parallels, 2);
    EXPECT_LE(meridians, 6);
    EXPECT_LE(parallels, 6);
}

TEST(Graticule, LabelsCarryTheStepsPrecision) {
    EXPECT_EQ(raLabel(150.0, 15.0), "10h");
    EXPECT_EQ(raLabel(150.0 + 7.5, 0.25), "10h30m");
    EXPECT_EQ(raLabel(15.0 * (1 + 2.0 / 60 + 3.0 / 3600), 10.0 * 15 / 3600), "1h02m03s");
    EXPECT_EQ(raLabel(-15.0, 15.0), "23h");
    EXPECT_EQ(decLabel(-5.5, 0.5), "-5d30'");
    EXPECT_EQ(decLabel(45.0, 5.0), "+45d");
    EXPECT_EQ(decLabel(10.0 + 15.0 / 3600, 5.0 / 3600), "+10d00'15\"");
    EXPECT_EQ(decLabel(-(1.0 / 3600 * 2.5), 0.5 / 3600), "-0d00'02.5\"");
}

TEST(Graticule, RaAcrossZeroHoursAndAPoleInTheFrame) {
    const Wcs zero = tanFrame(0.05, 0.0, 1000, 2.0, 0.0); // 33' wide around RA 0
    const Graticule a = makeGraticule(zero, {-0.5, -0.5, 999.5, 999.5}, 4);
    bool sawZero = false;
    for (const auto& l : a.lines)
        if (l.meridian && std::fabs(std::remainder(l.value, 360.0)) < 1e-9) sawZero = l.label == "0h00m";
    EXPECT_TRUE(sawZero);
    const Wcs pole = tanFrame(0.0, 89.9, 1000, 2.0, 0.0); // the north pole 360" (180 px) above the centre
    const Graticule b = makeGraticule(pole, {-0.5, -0.5, 999.5, 999.5}, 5);
    int meridians = 0;
    for (const auto& l : b.lines)
        meridians += l.meridian ? 1 : 0;
    EXPECT_GE(meridians, 4); // every RA meets at the pole: 6h steps or finer
    EXPECT_GE(b.raStep, 60.0);
}

} // namespace
} // namespace gpuphot
