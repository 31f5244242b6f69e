#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "viewers/overlay_geometry.hpp"
#include "viewers/view_transform.hpp"

namespace gpuphot::viewers {
namespace {

TEST(ViewerOverlay, EllipseOutlineLiesOnTheRotatedEllipse) {
    const EllipseInstance e{100.f, 50.f, 8.f, 3.f, 0.6f, 0};
    const double c = std::cos(0.6), s = std::sin(0.6);
    for (int k = 0; k < 32; ++k) {
        const auto p = ellipseOutlinePoint(e, k, 32);
        const double dx = p[0] - 100.0, dy = p[1] - 50.0;
        const double u = c * dx + s * dy, v = -s * dx + c * dy; // back into the ellipse frame
        EXPECT_NEAR(u * u / 64.0 + v * v / 9.0, 1.0, 1e-4);
    }
}

TEST(ViewerOverlay, SourceEllipsesScaleRotateAndColourByFlags) {
    OverlayStyle style;
    style.sourceScale = 2.0f;
    const Marker m[] = {{10.f, 20.f, 4.f, 2.f, 90.f, 0u}, {1.f, 2.f, 0.1f, 0.1f, 0.f, 8u},
                        {NAN, 3.f, 1.f, 1.f, 0.f, 0u}};
    const auto e = buildSourceEllipses(m, style);
    ASSERT_EQ(e.size(), 3u); // one slot per marker: the index is the source index
    EXPECT_FLOAT_EQ(e[0].a, 8.f);
    EXPECT_FLOAT_EQ(e[0].b, 4.f);
    EXPECT_EQ(e[0].rgba, style.sourceColour);
    EXPECT_EQ(e[1].rgba, style.flaggedColour);
    EXPECT_FLOAT_EQ(e[1].a, style.minSemiAxis);
    // theta 90 deg counter-clockwise: the major axis points along +y.
    const auto tip = ellipseOutlinePoint(e[0], 0, 16);
    EXPECT_NEAR(tip[0], 10.f, 1e-4);
    EXPECT_NEAR(tip[1], 28.f, 1e-4);
    EXPECT_LT(e[2].x, -1e8f); // non-finite positions are moved far away
}

TEST(ViewerOverlay, AperturesAndAnnuli) {
    OverlayStyle style;
    const Marker m[] = {{10.f, 20.f, 1.f, 1.f, 0.f, 0u}, {30.f, 40.f, 1.f, 1.f, 0.f, 0u}};
    const float radii[] = {2.f, 4.f, 8.f};
    auto c = buildApertureCircles(m, radii, 12.f, 20.f, style);
    ASSERT_EQ(c.size(), 10u);
    EXPECT_FLOAT_EQ(c[2].a, 8.f);
    EXPECT_FLOAT_EQ(c[3].a, 12.f);
    EXPECT_EQ(c[3].rgba, style.annulusColour);
    EXPECT_FLOAT_EQ(c[5].x, 30.f);
    c = buildApertureCircles(m, radii, 0.f, 0.f, style);
    EXPECT_EQ(c.size(), 6u);
}

TEST(ViewerOverlay, WhiskersAreCentredAndResidualsExaggerated) {
    OverlayStyle style;
    style.whiskerScale = 10.f;
    const Vector2 w[] = {{100.f, 100.f, 0.2f, -0.1f}};
    const auto s = buildWhiskers(w, style);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_FLOAT_EQ(s[0].x + 0.5f * s[0].dx, 100.f);
    EXPECT_FLOAT_EQ(s[0].y + 0.5f * s[0].dy, 100.f);
    EXPECT_FLOAT_EQ(s[0].dx, 2.f);
    const auto r = buildResidualArrows(w, 500.f, style);
    EXPECT_FLOAT_EQ(r[0].x, 100.f);
    EXPECT_FLOAT_EQ(r[0].dx, 100.f);
    EXPECT_FLOAT_EQ(r[0].dy, -50.f);
    const auto ref = buildReferenceCircles(w, style);
    EXPECT_FLOAT_EQ(ref[0].a, style.referenceRadius);
}

TEST(ViewerOverlay, SegmentCountGrowsWithSize) {
    EXPECT_EQ(ellipseSegments(0.5f), 8);
    EXPECT_LE(ellipseSegments(20.f), ellipseSegments(200.f));
    EXPECT_EQ(ellipseSegments(1e6f), 128);
    EXPECT_EQ(ellipseSegments(100.f) % 4, 0);
}

TEST(ViewerTransform, RoundTripAndOrientation) {
    const ViewTransform t{123.25, 456.5, 2.5, 800, 600, {}};
    for (double x : {-3.0, 0.0, 17.5, 1234.0})
        for (double y : {-1.0, 0.0, 99.25, 4000.0}) {
            const auto w = t.imageToWidget(x, y);
            const auto i = t.widgetToImage(w[0], w[1]);
            EXPECT_NEAR(i[0], x, 1e-9);
            EXPECT_NEAR(i[1], y, 1e-9);
        }
    const auto c = t.imageToWidget(123.25, 456.5);
    EXPECT_DOUBLE_EQ(c[0], 400.0);
    EXPECT_DOUBLE_EQ(c[1], 300.0);
    const auto up = t.imageToWidget(123.25, 457.5); // y up in the image is up on screen
    EXPECT_DOUBLE_EQ(up[1], 300.0 - 2.5);
    const double z = ViewTransform::fitZoom(2000, 1000, 800, 600);
    EXPECT_LE(2000 * z, 800.0);
    EXPECT_GT(2000 * z, 700.0);
    const ViewTransform f{999.5, 499.5, z, 800, 600, {}};
    const auto r = f.visibleImageRect();
    EXPECT_LT(r[0], -0.5);
    EXPECT_GT(r[2], 1999.5);
}

} // namespace
} // namespace gpuphot::viewers
