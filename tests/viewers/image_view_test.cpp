// The image viewer on a real GL context (run under xvfb-run; skipped without one): pixel colours against the
// CPU reference of the shader, tiling, overlays where the markers are, no pixel re-upload when the display
// changes, and the widget's coordinate transforms and input handling.
#include <gtest/gtest.h>

#include <algorithm>

#include <QApplication>
#include <QElapsedTimer>
#include <QMouseEvent>
#include <QWheelEvent>

#include <cmath>
#include <cstdlib>
#include <limits>

#include "tests/viewers/gl_test_util.hpp"
#include "viewers/image_lod.hpp"
#include "viewers/image_renderer.hpp"
#include "viewers/image_view.hpp"

namespace gpuphot::viewers {
namespace {

using test::ensureApp;
using test::grab;
using test::showAndCheckGl;

std::shared_ptr<Image<float>> squares() {
    auto img = std::make_shared<Image<float>>(64, 64, 0.0f);
    for (int y = 10; y < 20; ++y)
        for (int x = 10; x < 20; ++x)
            (*img)(x, y) = 100.0f;
    for (int y = 40; y < 50; ++y)
        for (int x = 40; x < 50; ++x)
            (*img)(x, y) = 50.0f;
    return img;
}

QRgb expected(float v, const StretchParams& p, Colormap cm, std::span<const float> lut = {}) {
    const std::uint32_t c =
        colormapTable(cm)[static_cast<std::size_t>(colormapIndex(stretchValue(v, p, lut)))];
    return qRgb(static_cast<int>(c & 255), static_cast<int>(c >> 8 & 255), static_cast<int>(c >> 16 & 255));
}

bool near(QRgb a, QRgb b, int tol = 1) {
    return std::abs(qRed(a) - qRed(b)) <= tol && std::abs(qGreen(a) - qGreen(b)) <= tol &&
           std::abs(qBlue(a) - qBlue(b)) <= tol;
}

QRgb at(const QImage& img, QPointF p) {
    return img.pixel(static_cast<int>(p.x()), static_cast<int>(p.y()));
}

TEST(ViewerImageView, TransformsRoundTripAndWheelZoomKeepsTheCursorPoint) {
    ensureApp();
    ImageView view;
    view.resize(400, 300);
    view.setImage(squares());
    EXPECT_NEAR(view.zoom(), 0.98 * 300 / 64, 1e-9); // fitted
    const QPointF c = view.imageToWidget({31.5, 31.5});
    EXPECT_NEAR(c.x(), 200, 1e-9);
    EXPECT_NEAR(c.y(), 150, 1e-9);
    for (QPointF p : {QPointF(0, 0), QPointF(12.25, 50.5), QPointF(63, 1)}) {
        const QPointF q = view.widgetToImage(view.imageToWidget(p));
        EXPECT_NEAR(q.x(), p.x(), 1e-9);
        EXPECT_NEAR(q.y(), p.y(), 1e-9);
    }
    int changed = 0;
    QObject::connect(&view, &ImageView::viewChanged, [&] { ++changed; });
    const QPointF cursor(90, 70);
    const QPointF before = view.widgetToImage(cursor);
    QWheelEvent wheel(cursor, view.mapToGlobal(cursor), {}, {0, 240}, Qt::NoButton, Qt::NoModifier,
                      Qt::NoScrollPhase, false);
    QCoreApplication::sendEvent(&view, &wheel);
    EXPECT_NEAR(view.zoom(), 0.98 * 300 / 64 * 1.5625, 1e-9);
    const QPointF after = view.widgetToImage(cursor);
    EXPECT_NEAR(after.x(), before.x(), 1e-9);
    EXPECT_NEAR(after.y(), before.y(), 1e-9);
    EXPECT_GE(changed, 1);
    view.zoomOneToOne();
    EXPECT_DOUBLE_EQ(view.zoom(), 1.0);
    view.centerOn(10, 20);
    EXPECT_NEAR(view.imageToWidget({10, 20}).x(), 200, 1e-9);
    EXPECT_NEAR(view.imageToWidget({11, 21}).y(), 149, 1e-9);
}

TEST(ViewerImageView, RendersStretchWithoutReuploadAndDrawsMarkers) {
    ensureApp();
    ImageView view;
    view.setOverviewVisible(false);
    view.setImage(squares());
    view.setManualLimits(0, 100);
    const std::string why = showAndCheckGl(view, 128, 128);
    if (!why.empty()) GTEST_SKIP() << why;
    ASSERT_EQ(view.pixelUploadCount(), 1);
    StretchParams p;
    p.lo = 0;
    p.hi = 100;

    QImage img = grab(view);
    img.save("/tmp/viewer_linear.png");
    const QPointF bright = view.imageToWidget({15, 15}), mid = view.imageToWidget({45, 45}),
                  dark = view.imageToWidget({30, 30});
    EXPECT_TRUE(near(at(img, bright), expected(100, p, Colormap::Grey))) << std::hex << at(img, bright);
    EXPECT_TRUE(near(at(img, mid), expected(50, p, Colormap::Grey))) << std::hex << at(img, mid);
    EXPECT_TRUE(near(at(img, dark), qRgb(0, 0, 0)));
    EXPECT_TRUE(near(at(img, {0, 0}), qRgb(20, 20, 26), 2))
        << std::hex << at(img, {0, 0}); // background outside the image

    view.setStretch(Stretch::Sqrt);
    p.stretch = Stretch::Sqrt;
    img = grab(view);
    EXPECT_TRUE(near(at(img, mid), expected(50, p, Colormap::Grey))) << std::hex << at(img, mid);
    EXPECT_GT(qRed(at(img, mid)), 170);
    view.setColormap(Colormap::Inverted);
    img = grab(view);
    EXPECT_TRUE(near(at(img, bright), qRgb(0, 0, 0)));
    EXPECT_TRUE(near(at(img, mid), expected(50, p, Colormap::Inverted)));
    view.setLimitMode(LimitMode::MinMax);
    view.setStretch(Stretch::HistEq);
    img = grab(view);
    EXPECT_EQ(view.pixelUploadCount(), 1); // stretch, colormap and limits never re-upload pixels
    view.setColormap(Colormap::Grey);
    view.setStretch(Stretch::Linear);
    view.setManualLimits(0, 100);

    // Markers: a flagged and an unflagged circle on the black background; the first one selected later.
    view.setSources({{45.f, 15.f, 5.f, 5.f, 0.f, 0u}, {15.f, 45.f, 6.f, 3.f, 90.f, 4u}});
    view.setSourceScale(1.0f);
    img = grab(view);
    img.save("/tmp/viewer_markers.png");
    auto hasColour = [&](const QImage& im, QPointF w, QRgb c) {
        for (int dy = -1; dy <= 1; ++dy)
            for (int dx = -1; dx <= 1; ++dx)
                if (near(im.pixel(static_cast<int>(w.x()) + dx, static_cast<int>(w.y()) + dy), c, 40))
                    return true;
        return false;
    };
    EXPECT_TRUE(hasColour(img, view.imageToWidget({50, 15}), qRgb(0, 230, 0)));
    EXPECT_TRUE(hasColour(img, view.imageToWidget({45, 20}), qRgb(0, 230, 0)));
    EXPECT_TRUE(near(at(img, view.imageToWidget({45, 15})), qRgb(0, 0, 0))); // inside: untouched
    // theta 90: the 6-px semi-major axis along +y, flagged colour.
    EXPECT_TRUE(hasColour(img, view.imageToWidget({15, 51}), qRgb(255, 140, 0)));
    EXPECT_TRUE(hasColour(img, view.imageToWidget({18, 45}), qRgb(255, 140, 0)));
    view.setSelectedSource(0);
    img = grab(view);
    EXPECT_TRUE(hasColour(img, view.imageToWidget({40, 15}), qRgb(255, 255, 0)));
    view.setLayerVisible(Layer::Sources, false);
    img = grab(view);
    EXPECT_FALSE(hasColour(img, view.imageToWidget({18, 45}), qRgb(255, 140, 0)));
    view.setLayerVisible(Layer::Sources, true);

    // A marker over the white square keeps a dark halo around its line (visible on any colormap): next to
    // the green ring, inside the square, a pixel far darker than the white around it.
    view.setSelectedSource(-1);
    view.setSources({{15.f, 15.f, 3.f, 3.f, 0.f, 0u}});
    img = grab(view);
    img.save("/tmp/viewer_halo.png");
    const QPointF ring = view.imageToWidget({18, 15});
    int darkest = 255; // the brightest channel of the darkest pixel: the green line itself is not dark
    for (int dx = -2; dx <= 2; ++dx) { // within the square (the view shows ~2 px per image px)
        const QRgb c = img.pixel(static_cast<int>(ring.x()) + dx, static_cast<int>(ring.y()));
        darkest = std::min(darkest, std::max({qRed(c), qGreen(c), qBlue(c)}));
    }
    EXPECT_TRUE(hasColour(img, ring, qRgb(0, 230, 0)));
    EXPECT_LT(darkest, 140) << "no halo beside the marker's line on a white image";
    EXPECT_GT(qGray(at(img, view.imageToWidget({11, 11}))), 240) << "the square is not white there";
    view.setSources({{45.f, 15.f, 5.f, 5.f, 0.f, 0u}, {15.f, 45.f, 6.f, 3.f, 90.f, 4u}});

    // Clicking near the second marker selects it.
    int clicked = -1;
    QObject::connect(&view, &ImageView::sourceClicked, [&](int i) { clicked = i; });
    const QPointF w = view.imageToWidget({15.5, 45.5});
    QMouseEvent press(QEvent::MouseButtonPress, w, view.mapToGlobal(w), Qt::LeftButton, Qt::LeftButton, {});
    QMouseEvent release(QEvent::MouseButtonRelease, w, view.mapToGlobal(w), Qt::LeftButton, Qt::NoButton, {});
    QCoreApplication::sendEvent(&view, &press);
    QCoreApplication::sendEvent(&view, &release);
    EXPECT_EQ(clicked, 1);
    EXPECT_EQ(view.pixelUploadCount(), 1);
    EXPECT_TRUE(view.renderer()->takeGlErrors().empty());
}

TEST(ViewerImageView, TiledUploadMatchesTheCpuReferenceAtOneToOne) {
    ensureApp();
    ImageView view;
    view.setOverviewVisible(false);
    const std::string why = showAndCheckGl(view, 64, 64);
    if (!why.empty()) GTEST_SKIP() << why;
    view.renderer()->setMaxTileSize(16);
    auto img = std::make_shared<Image<float>>(64, 64);
    for (int y = 0; y < 64; ++y)
        for (int x = 0; x < 64; ++x)
            (*img)(x, y) = static_cast<float>(std::sin(0.3 * x) * 40 + y * 1.5 + 0.01 * x * y);
    (*img)(5, 5) = std::numeric_limits<float>::quiet_NaN();
    view.setImage(img);
    view.setLimitMode(LimitMode::MinMax);
    view.zoomOneToOne();
    view.centerOn(31.5, 31.5);
    const auto [lo, hi] = view.limits();
    for (Stretch s : {Stretch::Linear, Stretch::Log, Stretch::Asinh, Stretch::HistEq}) {
        view.setStretch(s);
        view.setColormap(s == Stretch::Log ? Colormap::Viridis : Colormap::Heat);
        const QImage shot = grab(view);
        ASSERT_EQ(shot.width(), 64);
        StretchParams p;
        p.stretch = s;
        p.lo = lo;
        p.hi = hi;
        const auto lut = histEqLut(samplePixels(img->view()), lo, hi);
        int bad = 0;
        for (int j = 0; j < 64; ++j)
            for (int i = 0; i < 64; ++i) {
                const int x = i, y = 63 - j; // y up
                const float v = (*img)(x, y);
                if (std::isnan(v)) continue;
                if (!near(shot.pixel(i, j), expected(v, p, view.colormap(), lut), 3)) ++bad;
            }
        EXPECT_EQ(bad, 0) << "stretch " << static_cast<int>(s);
        if (s == Stretch::Linear) shot.save("/tmp/viewer_tiled.png");
    }
    EXPECT_EQ(view.renderer()->tileCount(), 16);
    EXPECT_EQ(view.pixelUploadCount(), 16);
    // Segmentation: a translucent colour over labelled pixels only.
    auto seg = std::make_shared<Image<std::int32_t>>(64, 64, 0);
    for (int y = 30; y < 40; ++y)
        for (int x = 30; x < 40; ++x)
            (*seg)(x, y) = 7;
    view.setStretch(Stretch::Linear);
    view.setColormap(Colormap::Grey);
    const QImage before = grab(view);
    view.setSegmentation(seg);
    const QImage after = grab(view);
    EXPECT_NE(before.pixel(35, 63 - 35), after.pixel(35, 63 - 35));
    EXPECT_EQ(before.pixel(10, 63 - 10), after.pixel(10, 63 - 10));
    view.setLayerVisible(Layer::Segmentation, false);
    EXPECT_EQ(grab(view).pixel(35, 63 - 35), before.pixel(35, 63 - 35));
    EXPECT_EQ(view.pixelUploadCount(), 16);
    // A new map while the layer is hidden waits for the layer: no upload until it is shown.
    const int segUploads = view.renderer()->segmentationUploads();
    auto seg2 = std::make_shared<Image<std::int32_t>>(64, 64, 0);
    for (int y = 10; y < 20; ++y)
        for (int x = 10; x < 20; ++x)
            (*seg2)(x, y) = 3;
    view.setSegmentation(seg2);
    EXPECT_EQ(grab(view).pixel(10, 63 - 10), before.pixel(10, 63 - 10));
    EXPECT_EQ(view.renderer()->segmentationUploads(), segUploads);
    view.setLayerVisible(Layer::Segmentation, true);
    const QImage shown = grab(view);
    EXPECT_GT(view.renderer()->segmentationUploads(), segUploads);
    EXPECT_NE(shown.pixel(15, 63 - 15), before.pixel(15, 63 - 15)); // the new map, not the old one
    EXPECT_EQ(shown.pixel(35, 63 - 35), before.pixel(35, 63 - 35));
    EXPECT_TRUE(view.renderer()->takeGlErrors().empty());
}

TEST(ViewerImageView, OverviewShowsInTheCorner) {
    ensureApp();
    ImageView view;
    auto img = std::make_shared<Image<float>>(512, 256, 1.0f);
    view.setImage(img);
    view.setManualLimits(0, 1); // all white
    const std::string why = showAndCheckGl(view, 400, 300);
    if (!why.empty()) GTEST_SKIP() << why;
    view.setZoom(4.0);
    view.setPsfWhiskers({{256.f, 128.f, 20.f, 0.f}});
    view.setResidualVectors({{250.f, 120.f, 1.f, 1.f}}, 5.f);
    view.setReferenceStars({{260.f, 130.f, 0.f, 0.f}});
    view.setApertures({3.f}, 5.f, 8.f);
    const QImage shot = grab(view);
    shot.save("/tmp/viewer_overview.png");
    // The inset sits in the lower-right corner, framed in grey.
    int grey = 0;
    for (int y = 200; y < 300; ++y)
        for (int x = 250; x < 400; ++x)
            grey += shot.pixel(x, y) == qRgb(160, 160, 160);
    EXPECT_GT(grey, 200);
    // The red outline of the visible area: its bounding box in the inset is where the overview's own
    // transform puts the corners of the main view's visible rectangle (checked twice, before and after a
    // pan).
    const auto checkRect = [&](const QImage& im) {
        RenderOptions o;
        ViewTransform v = view.viewTransform();
        const auto r = view.renderer()->overviewRect(v, o);
        ASSERT_GT(r[2], 0);
        const ViewTransform ov = view.renderer()->overviewTransform(v, o);
        const auto vis = v.visibleImageRect();
        const auto lo = ov.imageToWidget(std::max(vis[0], -0.5), std::min(vis[3], 255.5)); // top-left
        const auto hi = ov.imageToWidget(std::min(vis[2], 511.5), std::max(vis[1], -0.5)); // bottom-right
        int x0 = 1 << 20, y0 = 1 << 20, x1 = -1, y1 = -1, red = 0;
        for (int y = r[1]; y < r[1] + r[3]; ++y)
            for (int x = r[0]; x < r[0] + r[2]; ++x)
                if (near(im.pixel(x, y), qRgb(255, 64, 64), 8)) {
                    ++red;
                    x0 = std::min(x0, x), y0 = std::min(y0, y), x1 = std::max(x1, x), y1 = std::max(y1, y);
                }
        ASSERT_GT(red, 20) << "no visible-area rectangle in the overview";
        EXPECT_NEAR(x0, r[0] + lo[0], 1.5);
        EXPECT_NEAR(y0, r[1] + lo[1], 1.5);
        EXPECT_NEAR(x1, r[0] + hi[0], 1.5);
        EXPECT_NEAR(y1, r[1] + hi[1], 1.5);
        // An outline, not a filled box: the pixel at its centre keeps the image's colour.
        EXPECT_EQ(im.pixel((x0 + x1) / 2, (y0 + y1) / 2), qRgb(255, 255, 255));
    };
    checkRect(shot);
    view.centerOn(100, 60);
    const QImage panned = grab(view);
    panned.save("/tmp/viewer_overview_panned.png");
    checkRect(panned);
    EXPECT_TRUE(view.renderer()->takeGlErrors().empty());
}

// Level of detail and CPU grid culling of the markers, and headless segments (PSF whiskers) on screen.
TEST(ViewerImageView, MarkerLevelOfDetailAndGridCulling) {
    ensureApp();
    ImageView view;
    view.setOverviewVisible(false);
    auto img = std::make_shared<Image<float>>(2000, 2000, 0.0f);
    view.setImage(img);
    view.setManualLimits(0, 1); // black
    const std::string why = showAndCheckGl(view, 400, 400);
    if (!why.empty()) GTEST_SKIP() << why;
    std::vector<Marker> markers;
    for (int j = 0; j < 40; ++j)
        for (int i = 0; i < 40; ++i)
            markers.push_back({25.f + 50.f * i, 25.f + 50.f * j, 2.f, 2.f, 0.f, 0u});
    view.setSourceScale(1.0f); // semi-axes 2 image px
    view.setSources(markers);
    view.setApertures({4.f}, 0.f, 0.f);
    const auto& st = view.renderer()->lastStats();
    const auto src = static_cast<std::size_t>(EllipseLayer::Sources);
    const auto ape = static_cast<std::size_t>(EllipseLayer::Apertures);
    const QRgb green = qRgb(0, 230, 0), cyan = qRgb(0, 200, 255);

    // Zoomed out: 2 px * 0.19 is far below 2 screen px: one dot per source, no apertures.
    view.zoomToFit();
    QImage shot = grab(view);
    shot.save("/tmp/viewer_lod_far.png");
    EXPECT_EQ(st.verticesPerInstance[src], 4);
    EXPECT_EQ(st.instancesDrawn[src], 1600);
    EXPECT_EQ(st.verticesPerInstance[ape], 0);
    EXPECT_EQ(st.instancesDrawn[ape], 0);
    int dots = 0;
    for (const Marker& m : markers)
        dots += near(at(shot, view.imageToWidget({m.x, m.y})), green, 40);
    EXPECT_EQ(dots, 1600);
    int cyanPx = 0;
    for (int y = 0; y < shot.height(); ++y)
        for (int x = 0; x < shot.width(); ++x)
            cyanPx += near(shot.pixel(x, y), cyan, 40);
    EXPECT_EQ(cyanPx, 0);

    // Zoomed in: outlines (hollow), apertures shown, and only the grid cells in view submitted.
    for (QPointF c : {QPointF(1025, 1025), QPointF(30, 1970), QPointF(1510, 240)}) {
        view.setZoom(4.0);
        view.centerOn(c.x(), c.y());
        view.setPsfWhiskers({{static_cast<float>(c.x()) + 12.f, static_cast<float>(c.y()), 0.f, 16.f}});
        shot = grab(view);
        EXPECT_GT(st.verticesPerInstance[src], 4);
        EXPECT_GT(st.verticesPerInstance[ape], 4);
        const auto vis = view.viewTransform().visibleImageRect();
        int inView = 0;
        for (const Marker& m : markers)
            inView += m.x + 2 >= vis[0] && m.x - 2 <= vis[2] && m.y + 2 >= vis[1] && m.y - 2 <= vis[3];
        EXPECT_GE(st.instancesDrawn[src], inView);
        EXPECT_LT(st.instancesDrawn[src], 200) << "no culling";
        EXPECT_GE(st.instancesDrawn[ape], inView);
        int rings = 0, hollow = 0, apertures = 0;
        for (const Marker& m : markers) {
            if (m.x < vis[0] + 5 || m.x > vis[2] - 5 || m.y < vis[1] + 5 || m.y > vis[3] - 5) continue;
            const QPointF w = view.imageToWidget({m.x, m.y});
            rings +=
                near(at(shot, w + QPointF(8, 0)), green, 60) || near(at(shot, w + QPointF(7, 0)), green, 60);
            hollow += near(at(shot, w), qRgb(0, 0, 0));
            apertures +=
                near(at(shot, w - QPointF(16, 0)), cyan, 60) || near(at(shot, w - QPointF(15, 0)), cyan, 60);
            ++inView;
        }
        (void)inView;
        int expectedRings = 0;
        for (const Marker& m : markers)
            expectedRings += !(m.x < vis[0] + 5 || m.x > vis[2] - 5 || m.y < vis[1] + 5 || m.y > vis[3] - 5);
        EXPECT_GT(expectedRings, 0);
        EXPECT_EQ(rings, expectedRings) << "at " << c.x() << "," << c.y();
        EXPECT_EQ(hollow, expectedRings);
        EXPECT_EQ(apertures, expectedRings);
        // The whisker: a vertical white segment 12 px right of the centre, 16 image px long.
        const QPointF wc = view.imageToWidget({c.x() + 12, c.y()});
        EXPECT_TRUE(near(at(shot, wc), qRgb(255, 255, 255), 30)) << std::hex << at(shot, wc);
        EXPECT_TRUE(near(at(shot, wc + QPointF(0, 20)), qRgb(255, 255, 255), 30));
        EXPECT_TRUE(near(at(shot, wc + QPointF(0, 40)), qRgb(0, 0, 0)));
    }
    shot.save("/tmp/viewer_lod_near.png");
    EXPECT_EQ(view.pixelUploadCount(), 1);
    EXPECT_TRUE(view.renderer()->takeGlErrors().empty());
}

// One ellipse far larger than the rest (a bleed trail's isophote) is drawn with its own segment count: the
// many small outlines keep few vertices, and the large one is still drawn in full.
TEST(ViewerImageView, OneLargeEllipseDoesNotGiveEveryOutlineItsVertices) {
    ensureApp();
    ImageView view;
    view.setOverviewVisible(false);
    auto img = std::make_shared<Image<float>>(400, 400, 0.0f);
    view.setImage(img);
    view.setManualLimits(0, 1); // black
    const std::string why = showAndCheckGl(view, 400, 400);
    if (!why.empty()) GTEST_SKIP() << why;
    std::vector<Marker> markers;
    for (int j = 0; j < 10; ++j)
        for (int i = 0; i < 10; ++i)
            markers.push_back({20.f + 40.f * i, 20.f + 40.f * j, 3.f, 3.f, 0.f, 0u});
    view.setSourceScale(1.0f);
    view.setSources(markers);
    view.zoomOneToOne();
    view.centerOn(199.5, 199.5);
    const auto& st = view.renderer()->lastStats();
    const auto src = static_cast<std::size_t>(EllipseLayer::Sources);
    grab(view);
    const int smallVerts = st.verticesPerInstance[src];
    EXPECT_GT(smallVerts, 4);
    EXPECT_EQ(st.instancesDrawn[src], 100);

    markers.push_back({200.f, 200.f, 150.f, 150.f, 0.f, 0u}); // 150 px: 128 segments alone
    view.setSources(markers);
    const QImage shot = grab(view);
    EXPECT_EQ(st.verticesPerInstance[src], smallVerts) << "the small outlines took the large one's vertices";
    EXPECT_EQ(st.instancesDrawn[src], 101);
    EXPECT_EQ(st.drawCalls[src], 2);
    const QRgb green = qRgb(0, 230, 0);
    int onCircle = 0;
    for (int k = 0; k < 16; ++k) { // the large circle's outline, all round
        const double t = k * 3.14159265358979 / 8.0;
        const QPointF w = view.imageToWidget({200.0 + 150.0 * std::cos(t), 200.0 + 150.0 * std::sin(t)});
        bool hit = false;
        for (int d = -1; d <= 1 && !hit; ++d)
            for (int e = -1; e <= 1 && !hit; ++e)
                hit = near(at(shot, w + QPointF(d, e)), green, 60);
        onCircle += hit;
    }
    EXPECT_EQ(onCircle, 16);
    EXPECT_TRUE(view.renderer()->takeGlErrors().empty());
}

// A colour composite: three planes, each stretched with its own limits, drawn instead of the image while
// shown; hidden again, the image with its colormap; a new image drops the planes.
TEST(ViewerImageView, ColourPlanesDrawAColourComposite) {
    ensureApp();
    ImageView view;
    view.setOverviewVisible(false);
    auto img = std::make_shared<Image<float>>(64, 64, 0.0f);
    auto red = std::make_shared<Image<float>>(64, 64, 0.0f);
    auto green = std::make_shared<Image<float>>(64, 64, 0.0f);
    auto blue = std::make_shared<Image<float>>(64, 64, 0.0f);
    for (int y = 0; y < 64; ++y)
        for (int x = 0; x < 64; ++x) {
            (*img)(x, y) = static_cast<float>(x + y);
            (*red)(x, y) = static_cast<float>(x);          // red grows to the right
            (*green)(x, y) = 1000.0f + static_cast<float>(y); // green grows upwards, at another level
            (*blue)(x, y) = 5.0f;                              // flat blue: its limits widen, mid-grey
        }
    view.setImage(img);
    view.setLimitMode(LimitMode::MinMax);
    const std::string why = showAndCheckGl(view, 64, 64);
    if (!why.empty()) GTEST_SKIP() << why;
    view.setColourPlanes(red, green, blue);
    ASSERT_TRUE(view.hasColourPlanes());
    const QImage grey = grab(view);
    view.setColourShown(true);
    const QImage colour = grab(view);
    const QPointF left = view.imageToWidget({4, 32}), right = view.imageToWidget({59, 32});
    const QPointF low = view.imageToWidget({32, 4}), high = view.imageToWidget({32, 59});
    EXPECT_GT(qRed(at(colour, right)), qRed(at(colour, left)) + 150) << "red follows x";
    EXPECT_NEAR(qGreen(at(colour, right)), qGreen(at(colour, left)), 8);
    EXPECT_GT(qGreen(at(colour, high)), qGreen(at(colour, low)) + 150) << "green follows y, own limits";
    EXPECT_NEAR(qRed(at(colour, high)), qRed(at(colour, low)), 8);
    const auto lim = view.colourLimits();
    EXPECT_NEAR(lim[1].first, 1000.0, 1.0);
    EXPECT_NEAR(lim[0].second, 63.0, 1.0);
    // Hidden: the image's grey again.
    view.setColourShown(false);
    const QImage back = grab(view);
    EXPECT_EQ(back.pixel(10, 10), grey.pixel(10, 10));
    EXPECT_EQ(qRed(at(back, right)), qGreen(at(back, right)));
    // A new image drops the planes: nothing to show in colour.
    view.setImage(img);
    EXPECT_FALSE(view.hasColourPlanes());
    EXPECT_TRUE(view.renderer()->takeGlErrors().empty());
}

// ---- level of detail --------------------------------------------------------------------------------

// Block means against a direct sum: finite pixels only, partial blocks at the right and bottom edges, NaN
// where a block has no finite pixel; the chain of levels 4, 8, ... and the size threshold.
TEST(ViewerLod, BlockMeanAndLevels) {
    Image<float> img(10, 7, 0.0f);
    for (int y = 0; y < 7; ++y)
        for (int x = 0; x < 10; ++x)
            img(x, y) = static_cast<float>(x + 10 * y);
    for (int y = 0; y < 4; ++y)
        for (int x = 4; x < 8; ++x)
            img(x, y) = std::numeric_limits<float>::quiet_NaN(); // block (1, 0)
    img(0, 0) = std::numeric_limits<float>::infinity();
    const Image<float> m = blockMean(img.view(), 4);
    ASSERT_EQ(m.width(), 3);
    ASSERT_EQ(m.height(), 2);
    for (int j = 0; j < 2; ++j)
        for (int i = 0; i < 3; ++i) {
            double s = 0;
            int n = 0;
            for (int y = 4 * j; y < std::min(7, 4 * j + 4); ++y)
                for (int x = 4 * i; x < std::min(10, 4 * i + 4); ++x)
                    if (std::isfinite(img(x, y))) s += img(x, y), ++n;
            if (n == 0)
                EXPECT_TRUE(std::isnan(m(i, j))) << i << "," << j;
            else
                EXPECT_FLOAT_EQ(m(i, j), static_cast<float>(s / n)) << i << "," << j;
        }
    EXPECT_TRUE(std::isnan(m(1, 0)));

    EXPECT_TRUE(buildLodLevels(img.view()).empty()); // below the default 16 MP
    Image<float> big(3000, 1000, 1.5f);
    const auto levels = buildLodLevels(big.view(), 0, 100);
    ASSERT_EQ(levels.size(), 4u); // 750, 375, 188, 94 px wide
    for (std::size_t k = 0; k < levels.size(); ++k) {
        EXPECT_EQ(levels[k].factor, 4 << k);
        EXPECT_EQ(levels[k].image->width(), (3000 + levels[k].factor - 1) / levels[k].factor);
        EXPECT_EQ(levels[k].image->height(), (1000 + levels[k].factor - 1) / levels[k].factor);
        EXPECT_FLOAT_EQ((*levels[k].image)(3, 2), 1.5f);
    }
}

// A one-pixel checkerboard of 0 and 1 zoomed out 8x: the full-resolution texture aliases (every screen pixel
// shows one texel, 0 or 1: black or white), the level of detail (factor 4) shows the block mean, mid grey. At
// 1:1 the full-resolution texture is drawn.
TEST(ViewerLod, ZoomedOutViewDrawsTheReducedLevel) {
    ensureApp();
    const int n = 2048;
    auto img = std::make_shared<Image<float>>(n, n, 0.0f);
    for (int y = 0; y < n; ++y)
        for (int x = 0; x < n; ++x)
            (*img)(x, y) = static_cast<float>((x + y) & 1);
    ImageView view;
    view.setLodMinPixels(0);
    const std::string why = showAndCheckGl(view, 400, 300);
    if (!why.empty()) GTEST_SKIP() << why;
    view.setLimitMode(LimitMode::Manual);
    view.setManualLimits(0.0, 1.0);
    view.setOverviewVisible(false);
    QElapsedTimer t;
    t.start();
    view.setImage(img);
    while (view.lodLevels() == 0 && t.elapsed() < 20000)
        QApplication::processEvents();
    ASSERT_GT(view.lodLevels(), 0);
    EXPECT_EQ(view.lodLevels(), 1); // 512 px: the last level is the first at most 512 px on a side
    view.setZoom(0.125);
    view.centerOn(1023.5, 1023.5);
    QImage shot = grab(view);
    EXPECT_EQ(view.renderer()->lastLodFactor(), 4);
    const QRgb mid = shot.pixel(shot.width() / 2, shot.height() / 2);
    EXPECT_NEAR(qRed(mid), 128, 8) << std::hex << mid;
    shot.save("/tmp/guilat_lod_on.png");
    view.renderer()->setLodEnabled(false);
    shot = grab(view);
    EXPECT_EQ(view.renderer()->lastLodFactor(), 1);
    const int v = qRed(shot.pixel(shot.width() / 2, shot.height() / 2));
    EXPECT_TRUE(v < 10 || v > 245) << v; // aliased: one texel, black or white
    shot.save("/tmp/guilat_lod_off.png");
    view.renderer()->setLodEnabled(true);
    view.setZoom(1.0);
    shot = grab(view);
    EXPECT_EQ(view.renderer()->lastLodFactor(), 1);
    EXPECT_EQ(view.pixelUploadCount(), 1); // levels are not re-uploads of the frame
    EXPECT_TRUE(view.renderer()->takeGlErrors().empty());
}

// Measurement, not a check: run with --gtest_also_run_disabled_tests under xvfb-run.
TEST(ViewerImageView, DISABLED_Measure151MegapixelAnd150kMarkers) {
    ensureApp();
    const int n = 12288;
    auto img = std::make_shared<Image<float>>(n, n, Image<float>::NoInit{});
    std::uint32_t state = 12345;
    for (std::size_t i = 0; i < img->pixelCount(); ++i) {
        state = state * 1664525u + 1013904223u;
        img->data()[i] = 1000.0f + static_cast<float>(state >> 24) * 0.1f;
    }
    ImageView view;
    const std::string why = showAndCheckGl(view, 1600, 1100);
    if (!why.empty()) GTEST_SKIP() << why;
    view.renderer()->setTiming(true);
    QElapsedTimer t;
    t.start();
    view.setImage(img);
    const double setMs = t.nsecsElapsed() * 1e-6;
    view.repaint();
    const double firstMs = t.nsecsElapsed() * 1e-6;
    std::printf(
        "setImage (sample + zscale) %.1f ms; setImage + first frame %.1f ms (render incl. upload %.1f ms, "
        "%d tiles, max texture %d)\n",
        setMs, firstMs, view.renderer()->lastRenderMs(), view.renderer()->tileCount(),
        view.renderer()->maxTextureSize());
    // Level of detail: built on the thread pool, uploaded by the next frame; fit-zoom frame time with and
    // without.
    while (view.lodLevels() == 0 && t.elapsed() < 60000)
        QApplication::processEvents();
    const double lodReadyMs = t.nsecsElapsed() * 1e-6;
    view.repaint();
    std::printf("level of detail: %d levels ready %.0f ms after setImage; frame with their upload %.1f ms\n",
                view.lodLevels(), lodReadyMs, view.renderer()->lastRenderMs());
    view.zoomToFit();
    for (bool lod : {false, true, false, true}) {
        view.renderer()->setLodEnabled(lod);
        view.repaint();
        double sum = 0;
        for (int k = 0; k < 5; ++k) {
            view.repaint();
            sum += view.renderer()->lastRenderMs();
        }
        std::printf("zoom %.3f, image and overview only, level of detail %s (factor %d): %.1f ms per frame\n",
                    view.zoom(), lod ? "on" : "off", view.renderer()->lastLodFactor(), sum / 5);
    }
    view.renderer()->setLodEnabled(true);
    std::vector<Marker> markers;
    std::uint32_t s2 = 7;
    for (int i = 0; i < 150000; ++i) {
        s2 = s2 * 1664525u + 1013904223u;
        const float x = static_cast<float>(s2 % n);
        s2 = s2 * 1664525u + 1013904223u;
        markers.push_back(
            {x, static_cast<float>(s2 % n), 2.0f, 1.5f, static_cast<float>(i % 180), i % 10 == 0 ? 1u : 0u});
    }
    t.restart();
    view.setSources(markers);
    view.setApertures({3.f, 6.f}, 10.f, 15.f);
    std::printf("setSources + setApertures (150k) %.1f ms\n", t.nsecsElapsed() * 1e-6);
    for (double zoom : {0.0, 1.0, 4.0}) {
        if (zoom == 0.0)
            view.zoomToFit();
        else
            view.setZoom(zoom);
        view.setLayerVisible(Layer::Sources, false);
        view.setLayerVisible(Layer::Apertures, false);
        view.repaint();
        double bare = 0;
        for (int k = 0; k < 5; ++k) {
            view.repaint();
            bare += view.renderer()->lastRenderMs();
        }
        std::printf("zoom %.3f, image and overview only: %.1f ms per frame\n", view.zoom(), bare / 5);
        view.setLayerVisible(Layer::Sources, true);
        for (bool apertures : {false, true}) {
            view.setLayerVisible(Layer::Apertures, apertures);
            view.repaint();
            double sum = 0;
            for (int k = 0; k < 5; ++k) {
                view.repaint();
                sum += view.renderer()->lastRenderMs();
            }
            const RenderStats& st = view.renderer()->lastStats();
            std::printf("zoom %.3f, 150k markers%s: %.1f ms per frame (sources drawn %d x %d vertices, "
                        "apertures drawn %d x %d vertices)\n",
                        view.zoom(), apertures ? " + 750k aperture circles" : "", sum / 5,
                        st.instancesDrawn[0], st.verticesPerInstance[0], st.instancesDrawn[1],
                        st.verticesPerInstance[1]);
        }
    }
    view.grabFramebuffer().save("/tmp/viewer_151mp.png");
}

} // namespace
} // namespace gpuphot::viewers
