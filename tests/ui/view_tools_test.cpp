// DS9's viewing habits of the image view, driven as a user would: arrow keys move the readout cursor,
// the pixel table shows the image's values around it, typed limits set the stretch, the pan dialog moves
// the centre, flips and turns keep clicks on their sources, the crosshair and magnifier are drawn where
// the cursor is. The rendered checks need a working GL context (xvfb-run) and are skipped without one.
#include <gtest/gtest.h>

#include "tests/ui/ui_test_app.hpp"

#include <QAction>
#include <QApplication>
#include <QComboBox>
#include <QElapsedTimer>
#include <QImage>
#include <QLabel>
#include <QLineEdit>
#include <QMouseEvent>
#include <QSignalSpy>
#include <QTest>

#include <cmath>
#include <map>
#include <memory>

#include "core/model/header.hpp"
#include "core/sim/simulator.hpp"
#include "core/wcs/wcs.hpp"
#include "tests/test_support.hpp"
#include "tests/wcs_support.hpp"
#include "ui/colorbar.hpp"
#include "ui/display_controls.hpp"
#include "ui/grid_layer.hpp"
#include "ui/main_window.hpp"
#include "ui/pan_dialog.hpp"
#include "ui/pixel_table.hpp"
#include "ui/readout.hpp"
#include "viewers/image_renderer.hpp"
#include "viewers/image_view.hpp"

namespace {

using gpuphot::Image;
using gpuphot::viewers::ImageView;

constexpr int kW = 96, kH = 64;

// Every pixel's value says where it is: x + 1000 y.
std::shared_ptr<const Image<float>> rampImage() {
    auto img = std::make_shared<Image<float>>(kW, kH);
    for (int y = 0; y < kH; ++y)
        for (int x = 0; x < kW; ++x)
            (*img)(x, y) = static_cast<float>(x + 1000 * y);
    return img;
}

// Zero everywhere except a 4 x 4 block of ones with its lower-left pixel at (x0, y0).
std::shared_ptr<const Image<float>> blockImage(int x0, int y0) {
    auto img = std::make_shared<Image<float>>(kW, kH);
    for (int y = 0; y < kH; ++y)
        for (int x = 0; x < kW; ++x)
            (*img)(x, y) = (x >= x0 && x < x0 + 4 && y >= y0 && y < y0 + 4) ? 1.f : 0.f;
    return img;
}

// A shown view of w x h with the image; "" when GL works, else why not (the rendered checks skip).
std::string showView(ImageView& view, std::shared_ptr<const Image<float>> img, int w = 480, int h = 320) {
    gpuphot::test::uiTestApp();
    view.resize(w, h);
    view.setImage(std::move(img));
    view.show();
    if (!QTest::qWaitForWindowExposed(&view)) return "window not exposed";
    view.grabFramebuffer();
    if (!view.glFailure().isEmpty()) return view.glFailure().toStdString();
    return {};
}

// Linear grey display of [lo, hi] (manual limits).
void plainDisplay(ImageView& view, double lo, double hi) {
    view.setStretch(gpuphot::viewers::Stretch::Linear);
    view.setColormap(gpuphot::viewers::Colormap::Grey);
    view.setManualLimits(lo, hi);
    view.setOverviewVisible(false);
}

QColor pixelAt(const QImage& frame, const ImageView& view, QPointF widgetPos) {
    const double s = frame.width() / static_cast<double>(view.width()); // device pixel ratio
    return frame.pixelColor(static_cast<int>(widgetPos.x() * s), static_cast<int>(widgetPos.y() * s));
}

TEST(ViewTools, ArrowKeysMoveTheCursorByOnePixelOnScreen) {
    gpuphot::test::uiTestApp();
    ImageView view;
    showView(view, rampImage());
    QSignalSpy moved(&view, &ImageView::cursorMoved);
    view.setCursorPosition(10.3, 20.7);
    QTest::keyClick(&view, Qt::Key_Right);
    EXPECT_EQ(view.cursorPosition(), QPointF(11, 21)); // from the nearest pixel centre, one pixel right
    QTest::keyClick(&view, Qt::Key_Up, Qt::ShiftModifier);
    EXPECT_EQ(view.cursorPosition(), QPointF(11, 31));
    QTest::keyClick(&view, Qt::Key_Left);
    QTest::keyClick(&view, Qt::Key_Down);
    EXPECT_EQ(view.cursorPosition(), QPointF(10, 30));
    ASSERT_GE(moved.size(), 5);
    EXPECT_DOUBLE_EQ(moved.last().at(0).toDouble(), 10.0); // what the readout gets
    EXPECT_DOUBLE_EQ(moved.last().at(1).toDouble(), 30.0);
    // Flipped in x, screen-right is image -x.
    view.toggleFlipX();
    QTest::keyClick(&view, Qt::Key_Right);
    EXPECT_EQ(view.cursorPosition(), QPointF(9, 30));
    // Ctrl+arrows pan instead, leaving the cursor.
    const QPointF c = view.center();
    QTest::keyClick(&view, Qt::Key_Up, Qt::ControlModifier);
    EXPECT_EQ(view.cursorPosition(), QPointF(9, 30));
    EXPECT_GT(view.center().y(), c.y());
    // The cursor stays on the image.
    view.setCursorPosition(kW - 1, 5);
    QTest::keyClick(&view, Qt::Key_Left, Qt::ShiftModifier); // flipped: towards +x
    EXPECT_EQ(view.cursorPosition(), QPointF(kW - 1, 5));
}

TEST(ViewTools, PixelTableShowsTheImageAroundTheCursor) {
    gpuphot::test::uiTestApp();
    ImageView view;
    showView(view, rampImage());
    gpuphot::ui::PixelTable table(&view);
    ASSERT_EQ(table.tableSize(), gpuphot::ui::PixelTable::kDefaultSize);
    const auto img = view.image();
    view.setCursorPosition(30.4, 20.6);
    ASSERT_EQ(table.centerX(), 30);
    ASSERT_EQ(table.centerY(), 21);
    const auto check = [&](int cx, int cy) {
        for (int r = 0; r < 5; ++r)
            for (int c = 0; c < 5; ++c) {
                const int x = cx - 2 + c, y = cy + 2 - r; // top row: highest y
                const bool inside = x >= 0 && y >= 0 && x < kW && y < kH;
                const QString text = table.item(r, c)->text();
                if (inside)
                    EXPECT_FLOAT_EQ(text.toFloat(), (*img)(x, y)) << "cell " << r << "," << c;
                else
                    EXPECT_TRUE(text.isEmpty()) << "cell " << r << "," << c;
            }
        EXPECT_EQ(table.horizontalHeaderItem(2)->text(), QString::number(cx + 1)); // 1-based
        EXPECT_EQ(table.verticalHeaderItem(2)->text(), QString::number(cy + 1));
    };
    check(30, 21);
    QTest::keyClick(&view, Qt::Key_Right); // the table follows the keys
    check(31, 21);
    view.setCursorPosition(0, 1); // part of the table off the image
    check(0, 1);
    table.setTableSize(7);
    EXPECT_EQ(table.tableSize(), 7);
    EXPECT_FLOAT_EQ(table.item(3, 3)->text().toFloat(), (*img)(0, 1));
}

TEST(ViewTools, TypedLimitsSetTheStretchAndTheColorbar) {
    gpuphot::test::uiTestApp();
    ImageView view;
    const std::string why = showView(view, rampImage());
    gpuphot::ui::DisplayControls controls(&view);
    auto* stretch = controls.findChildren<QComboBox*>().at(0);
    stretch->setCurrentIndex(0); // linear
    auto* lo = controls.findChild<QLineEdit*>(QStringLiteral("LimitMin"));
    auto* hi = controls.findChild<QLineEdit*>(QStringLiteral("LimitMax"));
    ASSERT_TRUE(lo && hi);
    const auto zs = view.limits();                                                  // zscale of the ramp
    EXPECT_NEAR(lo->text().toDouble(), zs.first, 1e-6 * std::abs(zs.first) + 1e-9); // shown in the fields
    lo->selectAll();
    QTest::keyClicks(lo, QStringLiteral("100"));
    QTest::keyClick(lo, Qt::Key_Return);
    hi->selectAll();
    QTest::keyClicks(hi, QStringLiteral("5100"));
    QTest::keyClick(hi, Qt::Key_Return);
    EXPECT_EQ(view.limitMode(), gpuphot::viewers::LimitMode::Manual);
    EXPECT_EQ(view.limits(), std::make_pair(100.0, 5100.0));
    auto* bar = controls.findChild<gpuphot::ui::Colorbar*>();
    ASSERT_NE(bar, nullptr);
    EXPECT_EQ(bar->labels(),
              QStringList({QStringLiteral("100"), QStringLiteral("2600"), QStringLiteral("5100")}));
    EXPECT_EQ(qRed(bar->colourAt(0.0)), 0); // grey colormap: black to white
    EXPECT_EQ(qRed(bar->colourAt(1.0)), 255);
    if (why.empty()) { // what the view draws: (v - 100) / 5000 of white
        view.setOverviewVisible(false);
        const QImage frame = view.grabFramebuffer();
        const QColor c = pixelAt(frame, view, view.imageToWidget(QPointF(50, 2)));
        EXPECT_NEAR(c.red(), 255.0 * (2050 - 100) / 5000, 3.0);
    }
    // Back to zscale: the computed limits again.
    controls.findChildren<QComboBox*>().at(1)->setCurrentIndex(2);
    EXPECT_EQ(view.limits(), zs);
}

TEST(ViewTools, PanDialogMovesTheCentre) {
    gpuphot::test::uiTestApp();
    ImageView view;
    showView(view, rampImage());
    const gpuphot::Wcs wcs = gpuphot::Wcs::fromHeader(gpuphot::test::tanHeader(150.0, 2.2, 48.0, 32.0, 1.0));
    const gpuphot::Wcs* current = nullptr;
    gpuphot::ui::PanDialog dialog(&view, [&current] { return current; });
    dialog.setCoordinates(QStringLiteral("33"), QStringLiteral("21"), gpuphot::ui::PanSystem::Image);
    ASSERT_TRUE(dialog.apply());
    EXPECT_EQ(view.center(), QPointF(32, 20)); // 1-based typed
    EXPECT_EQ(view.cursorPosition(), QPointF(32, 20));
    // Sky without a WCS, then text that does not parse: refused, the view stays.
    dialog.setCoordinates(QStringLiteral("150.0"), QStringLiteral("2.2"), gpuphot::ui::PanSystem::Sky);
    EXPECT_FALSE(dialog.apply());
    current = &wcs;
    dialog.setCoordinates(QStringLiteral("ten"), QStringLiteral("2.2"), gpuphot::ui::PanSystem::Sky);
    EXPECT_FALSE(dialog.apply());
    EXPECT_FALSE(dialog.findChild<QLabel*>(QStringLiteral("PanError"))->text().isEmpty());
    EXPECT_EQ(view.center(), QPointF(32, 20));
    // Sexagesimal and degrees of a known pixel.
    const auto [ra, dec] = wcs.pixelToWorld(20.0, 40.0);
    dialog.setCoordinates(gpuphot::ui::formatRa(ra), gpuphot::ui::formatDec(dec),
                          gpuphot::ui::PanSystem::Sky);
    ASSERT_TRUE(dialog.apply());
    EXPECT_NEAR(view.center().x(), 20.0, 0.3);
    EXPECT_NEAR(view.center().y(), 40.0, 0.3);
    const auto [ra2, dec2] = wcs.pixelToWorld(70.0, 10.0);
    dialog.setCoordinates(QString::number(ra2, 'f', 8), QString::number(dec2, 'f', 8),
                          gpuphot::ui::PanSystem::Sky);
    ASSERT_TRUE(dialog.apply());
    EXPECT_NEAR(view.center().x(), 70.0, 0.01);
    EXPECT_NEAR(view.center().y(), 10.0, 0.01);
}

// The coordinate grid: lines of the frame's WCS over the visible area, finer steps when zoomed in, none
// without a WCS; shown and hidden by its toggle.
TEST(ViewTools, CoordinateGridFollowsTheWcsAndTheZoom) {
    gpuphot::test::uiTestApp();
    ImageView view;
    auto img = std::make_shared<Image<float>>(512, 512);
    showView(view, img);
    view.zoomToFit();
    const gpuphot::Wcs wcs =
        gpuphot::Wcs::fromHeader(gpuphot::test::tanHeader(150.0, 2.2, 256.5, 256.5, 1.0));
    const gpuphot::Wcs* current = &wcs;
    gpuphot::ui::GridLayer grid(&view, [&current] { return current; });
    EXPECT_FALSE(grid.isVisible());
    grid.setShown(true);
    EXPECT_TRUE(grid.isVisible());
    const gpuphot::Graticule whole = grid.graticule();
    ASSERT_GE(whole.lines.size(), 4u);
    EXPECT_NEAR(whole.decStep * 60.0, 2.0, 1e-9); // 8.5' of Dec, at most 5 lines: 2' steps
    for (const auto& l : whole.lines) {
        const auto [ra, dec] = wcs.pixelToWorld(l.labelX, l.labelY);
        if (l.meridian)
            EXPECT_NEAR(ra, l.value, 1e-6) << l.label;
        else
            EXPECT_NEAR(dec, l.value, 1e-6) << l.label;
    }
    view.setZoom(view.zoom() * 8.0); // about the centre: an eighth of the field each way
    const gpuphot::Graticule zoomed = grid.graticule();
    ASSERT_GE(zoomed.lines.size(), 2u);
    EXPECT_LT(zoomed.decStep, whole.decStep / 4);
    EXPECT_LT(zoomed.raStep, whole.raStep / 4);
    current = nullptr; // a frame without a WCS
    grid.refresh();
    EXPECT_TRUE(grid.graticule().lines.empty());
    grid.setShown(false);
    EXPECT_FALSE(grid.isVisible());
}

TEST(ViewTools, FlipsAndTurnsKeepClicksOnTheirSources) {
    gpuphot::test::uiTestApp();
    ImageView view;
    const std::string why = showView(view, blockImage(70, 10));
    std::vector<gpuphot::viewers::Marker> markers(3);
    const double pos[3][2] = {{71.5, 11.5}, {20, 50}, {40, 8}};
    for (int i = 0; i < 3; ++i) {
        markers[static_cast<std::size_t>(i)].x = static_cast<float>(pos[i][0]);
        markers[static_cast<std::size_t>(i)].y = static_cast<float>(pos[i][1]);
    }
    view.setSources(markers);
    view.setLayerVisible(gpuphot::viewers::Layer::Sources, false); // the block alone in the rendered check
    plainDisplay(view, 0, 1);
    const QPointF before = view.imageToWidget(QPointF(71.5, 11.5));
    QSignalSpy clicked(&view, &ImageView::sourceClicked);
    using Step = void (ImageView::*)();
    const Step steps[] = {&ImageView::toggleFlipX, &ImageView::toggleFlipY, &ImageView::rotate90,
                          &ImageView::rotate90, &ImageView::toggleFlipX};
    for (const Step step : steps) {
        (view.*step)();
        for (int i = 0; i < 3; ++i) {
            clicked.clear();
            const QPointF w = view.imageToWidget(QPointF(pos[i][0], pos[i][1]));
            QTest::mouseClick(&view, Qt::LeftButton, Qt::NoModifier, w.toPoint());
            ASSERT_EQ(clicked.size(), 1);
            EXPECT_EQ(clicked.at(0).at(0).toInt(), i);
        }
    }
    view.setOrientation({});
    view.toggleFlipX();
    const QPointF after = view.imageToWidget(QPointF(71.5, 11.5));
    EXPECT_NEAR(after.x(), view.width() - before.x(), 1.0); // mirrored about the centre
    EXPECT_NEAR(after.y(), before.y(), 1e-9);
    QSignalSpy moved(&view, &ImageView::cursorMoved); // the readout under the mouse follows too
    // Sent to the view itself: QTest::mouseMove moves the X server's one pointer, which GUI tests running
    // beside this one on the same display move too, and its event may come late or not at all.
    QMouseEvent move(QEvent::MouseMove, after, view.mapToGlobal(after), Qt::NoButton, Qt::NoButton,
                     Qt::NoModifier);
    QApplication::sendEvent(&view, &move);
    ASSERT_FALSE(moved.isEmpty());
    EXPECT_NEAR(moved.last().at(0).toDouble(), 71.5, 1.0 / view.zoom());
    if (!why.empty()) GTEST_SKIP() << why;
    // The GPU draws the block where the transform says: on the mirrored side, not where it was.
    const QImage frame = view.grabFramebuffer();
    EXPECT_GT(pixelAt(frame, view, after).red(), 200);
    EXPECT_LT(pixelAt(frame, view, before).red(), 50);
    view.rotate90();
    const QImage turned = view.grabFramebuffer();
    EXPECT_GT(pixelAt(turned, view, view.imageToWidget(QPointF(71.5, 11.5))).red(), 200);
    // The overview inset turns with the view: the block drawn where its transform says, and a click there
    // centres the view on it.
    if (view.devicePixelRatioF() != 1.0) return;
    view.setOverviewVisible(true);
    const gpuphot::viewers::RenderOptions o;
    const auto r = view.renderer()->overviewRect(view.viewTransform(), o);
    const auto ov = view.renderer()->overviewTransform(view.viewTransform(), o);
    ASSERT_GT(r[2], 0);
    EXPECT_LT(r[2], r[3]); // the 96 x 64 frame turned: taller than wide
    const auto b = ov.imageToWidget(71.5, 11.5);
    const QPointF inset(r[0] + b[0], r[1] + b[1]);
    EXPECT_GT(pixelAt(view.grabFramebuffer(), view, inset).red(), 200);
    QTest::mouseClick(&view, Qt::LeftButton, Qt::NoModifier, inset.toPoint());
    EXPECT_NEAR(view.center().x(), 71.5, 1.5);
    EXPECT_NEAR(view.center().y(), 11.5, 1.5);
}

TEST(ViewTools, CrosshairIsDrawnAndMovedByClicks) {
    gpuphot::test::uiTestApp();
    ImageView view;
    const std::string why = showView(view, rampImage());
    plainDisplay(view, 0, 1e9); // a black image: the crosshair's green stands out
    view.setCursorPosition(30, 20);
    view.setCrosshair(true);
    const QPointF cur = view.imageToWidget(QPointF(30, 20));
    QTest::mouseMove(&view, QPoint(10, 10)); // the mouse no longer moves the cursor
    EXPECT_EQ(view.cursorPosition(), QPointF(30, 20));
    if (why.empty()) {
        const QImage on = view.grabFramebuffer();
        const QPointF farOnLine(cur.x(), 5), farOnRow(view.width() - 5, cur.y());
        EXPECT_GT(pixelAt(on, view, farOnLine).green(), 200);
        EXPECT_GT(pixelAt(on, view, farOnRow).green(), 200);
        view.setCrosshair(false);
        const QImage off = view.grabFramebuffer();
        EXPECT_LT(pixelAt(off, view, farOnLine).green(), 100);
        view.setCrosshair(true);
    }
    const QPointF target = view.imageToWidget(QPointF(60, 40));
    QTest::mouseClick(&view, Qt::LeftButton, Qt::NoModifier, target.toPoint());
    EXPECT_NEAR(view.cursorPosition().x(), 60, 1.0 / view.zoom());
    EXPECT_NEAR(view.cursorPosition().y(), 40, 1.0 / view.zoom());
}

TEST(ViewTools, MagnifierIsBesideTheCursorAndInsideTheView) {
    gpuphot::test::uiTestApp();
    ImageView view;
    auto img = std::make_shared<Image<float>>(kW, kH);
    for (int y = 0; y < kH; ++y)
        for (int x = 0; x < kW; ++x)
            (*img)(x, y) = 0.f;
    (*img)(40, 30) = 1.f;
    const std::string why = showView(view, img);
    plainDisplay(view, 0, 1);
    view.setMagnifier(true);
    view.setCursorPosition(40, 30);
    const QRect r = view.magnifierRect();
    ASSERT_FALSE(r.isEmpty());
    EXPECT_TRUE(view.rect().contains(r));
    const QPointF cur = view.imageToWidget(QPointF(40, 30));
    EXPECT_FALSE(r.contains(cur.toPoint())); // beside the cursor, not over it
    EXPECT_LT(std::hypot(r.center().x() - cur.x(), r.center().y() - cur.y()), 2.0 * r.width());
    view.setCursorPosition(kW - 1, 0); // lower right corner: the inset moves to stay inside
    EXPECT_TRUE(view.rect().contains(view.magnifierRect()));
    if (!why.empty()) GTEST_SKIP() << why;
    view.setCursorPosition(40, 30);
    const QImage frame = view.grabFramebuffer();
    // The bright pixel fills the centre of the inset (8 px per image px); 3 image px away it is dark.
    const QPointF c = QRectF(r).center();
    EXPECT_GT(pixelAt(frame, view, c).red(), 200);
    EXPECT_LT(pixelAt(frame, view, c + QPointF(3 * ImageView::kMagnifierZoom, 0)).red(), 50);
    view.setMagnifier(false);
    EXPECT_TRUE(view.magnifierRect().isEmpty());
    EXPECT_LT(pixelAt(view.grabFramebuffer(), view, c).red(), 50);
}

// The workbench: the status-bar readout and the pixel-table dock follow the arrow keys, and the Help
// menu's shortcut list has the new actions.
TEST(ViewTools, MainWindowReadoutFollowsArrowKeys) {
    gpuphot::test::uiTestApp();
    gpuphot::test::TempDir dir;
    gpuphot::SimParams p;
    p.width = 128;
    p.height = 96;
    p.stars = 20;
    p.seed = 5;
    p.galaxies = 0;
    p.clusters = 0;
    gpuphot::writeSimulation(gpuphot::simulateField(p), dir.path.string(), "field", -32);
    gpuphot::ui::MainWindow w;
    QSignalSpy shown(&w, &gpuphot::ui::MainWindow::frameShown);
    ASSERT_TRUE(w.openFrame(QString::fromStdString((dir.path / "field.fits").string())));
    if (shown.isEmpty()) ASSERT_TRUE(shown.wait(60000));
    ImageView* view = w.imageView();
    ASSERT_TRUE(view->image());
    view->setCursorPosition(9, 19);
    QTest::keyClick(view, Qt::Key_Right);
    QTest::keyClick(view, Qt::Key_Up, Qt::ShiftModifier);
    const QString readout = w.cursorReadout();
    EXPECT_TRUE(readout.startsWith(QStringLiteral("x 11.0  y 30.0  value "))) << readout.toStdString();
    EXPECT_TRUE(readout.contains(QStringLiteral("RA "))) << readout.toStdString(); // the simulated WCS
    auto* table = w.findChild<gpuphot::ui::PixelTable*>();
    ASSERT_NE(table, nullptr);
    EXPECT_EQ(table->centerX(), 10);
    EXPECT_EQ(table->centerY(), 29);
    EXPECT_FLOAT_EQ(table->item(2, 2)->text().toFloat(), (*view->image())(10, 29));
    QStringList names;
    for (const auto& [name, keys] : w.shortcuts())
        names << name;
    for (const char* n : {"Crosshair", "Magnifier", "Pan to coordinates", "Flip X", "Flip Y",
                          "Rotate 90 degrees", "Pixel table", "Coordinate grid"})
        EXPECT_TRUE(names.contains(QString::fromLatin1(n)))
            << n << " not in " << names.join(", ").toStdString();
    // The crosshair action reaches the view.
    auto* cross = w.findChild<QAction*>(QStringLiteral("actionCrosshair"));
    ASSERT_NE(cross, nullptr);
    cross->trigger();
    EXPECT_TRUE(view->crosshair());
    auto* dialog = w.showPanDialog();
    dialog->setCoordinates(QStringLiteral("64"), QStringLiteral("48"), gpuphot::ui::PanSystem::Image);
    ASSERT_TRUE(dialog->apply());
    EXPECT_EQ(view->center(), QPointF(63, 47));
}

} // namespace

// A raw colour-filter frame (the PANOPTES DSLR frame, RGGB) is offered as 2x2 super-pixels: the action
// is enabled for it only, the run then measures the half-size luminance frame and the view shows it;
// unchecked, the raw frame again.
TEST(ViewTools, ColourFilterFrameShownAsSuperPixels) {
    gpuphot::test::uiTestApp();
    gpuphot::ui::MainWindow w;
    w.resize(1200, 800);
    w.show();
    auto* cfa = w.findChild<QAction*>(QStringLiteral("actionCfaSuperPixels"));
    ASSERT_NE(cfa, nullptr);
    EXPECT_FALSE(cfa->isEnabled()) << "no frame yet";
    QSignalSpy shown(&w, &gpuphot::ui::MainWindow::snapshotShown);
    const QString raw = QStringLiteral(GPUPHOT_TEST_DATA "/real/panoptes_solved.fits.fz");
    ASSERT_TRUE(w.openFrame(raw));
    const auto next = [&](int width) {
        QElapsedTimer t;
        t.start();
        while (t.elapsed() < 120000) {
            if (shown.isEmpty()) shown.wait(500);
            while (!shown.isEmpty()) {
                const auto s = shown.takeFirst().at(0).value<gpuphot::ui::SnapshotPtr>();
                if (s && !s->provisional && s->frame && s->frame->width() == width) return s;
            }
        }
        return gpuphot::ui::SnapshotPtr{};
    };
    ASSERT_TRUE(next(700)) << "the raw frame's result";
    EXPECT_TRUE(cfa->isEnabled());
    EXPECT_FALSE(cfa->isChecked());
    cfa->trigger();
    const auto binned = next(350);
    ASSERT_TRUE(binned) << "no super-pixel result";
    EXPECT_EQ(binned->config.prepare.bayer, "lum");
    EXPECT_EQ(binned->frame->height(), 350);
    EXPECT_GT(binned->result.detection.sources.size(), 0u);
    // In colour: the view draws the super-pixels' red, green and blue planes; the run still measures the
    // luminance. The file's red phase is its faintest (the camera's white balance), so red's limits are
    // below green's.
    auto* colour = w.findChild<QAction*>(QStringLiteral("actionCfaColour"));
    ASSERT_NE(colour, nullptr);
    EXPECT_TRUE(colour->isEnabled());
    EXPECT_FALSE(w.imageView()->hasColourPlanes());
    colour->trigger();
    EXPECT_TRUE(w.imageView()->colourShown());
    ASSERT_TRUE(w.imageView()->hasColourPlanes());
    const auto lim = w.imageView()->colourLimits();
    EXPECT_LT(lim[0].second, lim[1].second) << "red above green";
    const QImage shot = w.imageView()->grabFramebuffer();
    int tinted = 0, n = 0;
    for (int y = 10; y < shot.height() - 10; y += 17)
        for (int x = 10; x < shot.width() - 10; x += 17) {
            const QRgb c = shot.pixel(x, y);
            ++n;
            tinted += std::abs(qRed(c) - qGreen(c)) > 6 || std::abs(qGreen(c) - qBlue(c)) > 6;
        }
    EXPECT_GT(tinted, n / 10) << "no colour on screen";
    colour->trigger();
    EXPECT_FALSE(w.imageView()->colourShown());
    colour->trigger(); // on again for the way back: not offered for the raw frame
    cfa->trigger();
    ASSERT_TRUE(next(700)) << "back to the raw frame";
    EXPECT_FALSE(colour->isEnabled());
    EXPECT_FALSE(w.imageView()->colourShown());
    // A frame without a colour-filter pattern: not offered.
    const QString plain = QStringLiteral(GPUPHOT_TEST_DATA "/real/decam_ls9_N6_cutout.fits");
    QSignalSpy frames(&w, &gpuphot::ui::MainWindow::frameShown);
    ASSERT_TRUE(w.openFrame(plain));
    ASSERT_TRUE(frames.count() > 0 || frames.wait(30000));
    EXPECT_FALSE(cfa->isEnabled());
}

// Every shortcut of the window's actions is its own: two actions on one key make Qt run neither.
TEST(ViewTools, NoTwoActionsShareAShortcut) {
    gpuphot::test::uiTestApp();
    gpuphot::ui::MainWindow w;
    std::map<QString, QString> owner;
    int shortcuts = 0;
    for (QAction* a : w.findChildren<QAction*>())
        for (const QKeySequence& k : a->shortcuts()) {
            if (k.isEmpty()) continue;
            ++shortcuts;
            const QString key = k.toString();
            const auto [it, fresh] = owner.emplace(key, a->text());
            EXPECT_TRUE(fresh) << key.toStdString() << ": " << it->second.toStdString() << " and "
                               << a->text().toStdString();
        }
    EXPECT_GT(shortcuts, 15);
}
