// DS9 regions in the workbench (ui/main_window_regions.cpp): a region file loaded and drawn as a layer,
// statistics of a box against a direct count of the frame's pixels, and forced aperture photometry at
// a Ctrl+click against core's forcedPhotometry at the same position.
#include <gtest/gtest.h>

#include "tests/ui/ui_test_app.hpp"

#include <QAction>
#include <QApplication>
#include <QElapsedTimer>
#include <QMouseEvent>
#include <QSignalSpy>
#include <QStatusBar>
#include <QTableWidget>
#include <QTest>
#include <algorithm>
#include <cmath>
#include <fstream>
#include <vector>

#include "core/io/ds9_regions.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/simulator.hpp"
#include "core/stages/aperture/forced_photometry.hpp"
#include "core/stages/aperture/region_stats.hpp"
#include "core/stages/background/background.hpp"
#include "core/wcs/wcs.hpp"
#include "tests/test_support.hpp"
#include "ui/main_window.hpp"
#include "ui/region_drawer.hpp"
#include "ui/region_layer.hpp"
#include "ui/source_inspector.hpp"
#include "viewers/image_view.hpp"

namespace {

struct RegionsField {
    gpuphot::test::TempDir dir;
    std::string frame;
    RegionsField() {
        gpuphot::SimParams p;
        p.width = 256;
        p.height = 256;
        p.stars = 60;
        p.seed = 29;
        p.galaxies = 0;
        p.clusters = 0;
        gpuphot::writeSimulation(gpuphot::simulateField(p), dir.path.string(), "field", -32);
        frame = (dir.path / "field.fits").string();
    }
};
const RegionsField& field() {
    static RegionsField f;
    return f;
}

// The window with the field reduced (its snapshot), or null after the timeout.
gpuphot::ui::SnapshotPtr openAndReduce(gpuphot::ui::MainWindow& w) {
    QSignalSpy shown(&w, &gpuphot::ui::MainWindow::snapshotShown);
    if (!w.openFrame(QString::fromStdString(field().frame))) return nullptr;
    QElapsedTimer t;
    t.start();
    while (t.elapsed() < 120000) {
        if (shown.isEmpty()) shown.wait(500);
        while (!shown.isEmpty()) {
            auto s = shown.takeFirst().at(0).value<gpuphot::ui::SnapshotPtr>();
            if (s && !s->provisional && s->result.aperture.count == s->result.detection.sources.size())
                return s;
        }
    }
    return nullptr;
}

QString writeText(const gpuphot::test::TempDir& dir, const char* name, const std::string& text) {
    const auto p = dir.path / name;
    std::ofstream(p) << text;
    return QString::fromStdString(p.string());
}

} // namespace

TEST(Regions, LoadedFileIsDrawnAsALayerAndSavedBack) {
    gpuphot::test::uiTestApp();
    gpuphot::ui::MainWindow w;
    w.resize(1000, 700);
    w.show();
    const gpuphot::ui::SnapshotPtr snap = openAndReduce(w);
    ASSERT_TRUE(snap);
    ASSERT_TRUE(snap->frame->wcs) << "the simulated frame has a header WCS";
    const auto [ra, dec] = snap->frame->wcs->pixelToWorld(100.0, 120.0);
    gpuphot::test::TempDir dir;
    const std::string text = "# Region file format: DS9 version 4.1\nglobal color=green\nimage\n"
                             "circle(50,60,8) # color=red text={c}\nbox(128,128,20,10,30)\n"
                             "polygon(10,10,40,10,25,40)\npoint(200,200)\nfk5\ncircle(" +
                             std::to_string(ra) + "," + std::to_string(dec) + ",6\")\n";
    ASSERT_TRUE(w.loadRegions(writeText(dir, "in.reg", text)));
    gpuphot::ui::RegionLayer* layer = w.regionLayer();
    ASSERT_NE(layer, nullptr);
    EXPECT_EQ(layer->shapeCount(), 5);
    EXPECT_TRUE(layer->overlay().problems.empty());
    EXPECT_TRUE(layer->isVisible());
    // The fk5 circle lands on the pixel its RA/Dec came from.
    const auto& sky = layer->overlay().outlines.back().xy;
    double cx = 0, cy = 0;
    for (std::size_t i = 0; i < sky.size(); i += 2)
        cx += sky[i], cy += sky[i + 1];
    EXPECT_NEAR(cx / (sky.size() / 2), 100.0, 0.05);
    EXPECT_NEAR(cy / (sky.size() / 2), 120.0, 0.05);

    auto* toggle = w.findChild<QAction*>(QStringLiteral("ShowRegionsAction"));
    ASSERT_NE(toggle, nullptr);
    toggle->setChecked(false);
    EXPECT_FALSE(layer->isVisible());
    toggle->setChecked(true);
    EXPECT_TRUE(layer->isVisible());

    const QString out = QString::fromStdString((dir.path / "out.reg").string());
    ASSERT_TRUE(w.saveRegions(out));
    const gpuphot::RegionFile back = gpuphot::readDs9Regions(out.toStdString());
    ASSERT_EQ(back.regions.size(), 5u);
    EXPECT_EQ(back.regions[0].color, "red");
    EXPECT_EQ(back.regions[4].system, gpuphot::RegionSystem::Fk5);

    // A bad file is an error, the loaded regions stay.
    EXPECT_FALSE(w.loadRegions(writeText(dir, "bad.reg", "image\ncircle(1,2)\n")));
    EXPECT_EQ(layer->shapeCount(), 5);
}

TEST(Regions, BoxStatisticsEqualADirectCountOfTheFrame) {
    gpuphot::test::uiTestApp();
    gpuphot::ui::MainWindow w;
    w.show();
    const gpuphot::ui::SnapshotPtr snap = openAndReduce(w);
    ASSERT_TRUE(snap);
    gpuphot::test::TempDir dir;
    // DS9 box(101,81,31,21): 0-based centre (100, 80), x 85..115, y 70..90
    ASSERT_TRUE(w.loadRegions(writeText(dir, "box.reg", "image\nbox(101,81,31,21)\n")));
    const std::vector<gpuphot::RegionStats> stats = w.regionStatistics();
    ASSERT_EQ(stats.size(), 1u);
    const gpuphot::RegionStats& s = stats[0];

    const gpuphot::Frame& f = *snap->frame;
    const gpuphot::BackgroundResult& bkg = snap->result.background;
    std::vector<double> v;
    double sum = 0, bsum = 0;
    for (int y = 70; y <= 90; ++y)
        for (int x = 85; x <= 115; ++x) {
            const float p = f.pixels.row(y)[x];
            if (f.mask.row(y)[x] != 0 || !std::isfinite(p)) continue;
            v.push_back(p);
            sum += p;
            bsum += p - static_cast<double>(bkg.levelAt(x, y));
        }
    ASSERT_EQ(v.size(), 31u * 21u) << "the simulated frame has no masked pixel there";
    std::sort(v.begin(), v.end());
    EXPECT_EQ(s.pixels, v.size());
    EXPECT_NEAR(s.sum, sum, 1e-9 * std::fabs(sum));
    EXPECT_NEAR(s.mean, sum / v.size(), 1e-9 * std::fabs(sum));
    EXPECT_DOUBLE_EQ(s.median, v[v.size() / 2]); // odd count
    EXPECT_DOUBLE_EQ(s.min, v.front());
    EXPECT_DOUBLE_EQ(s.max, v.back());
    ASSERT_TRUE(s.haveBackground);
    EXPECT_NEAR(s.backgroundSubtractedSum, bsum, 1e-6 * std::max(1.0, std::fabs(bsum)));
    EXPECT_GT(s.stddev, 0.0);
}

TEST(Regions, CtrlClickOffAnySourceGivesCoreForcedPhotometry) {
    gpuphot::test::uiTestApp();
    gpuphot::ui::MainWindow w;
    w.resize(1000, 800);
    w.show();
    const gpuphot::ui::SnapshotPtr snap = openAndReduce(w);
    ASSERT_TRUE(snap);
    const gpuphot::Sources& src = snap->result.detection.sources;
    // A point at least 20 px from every detection and 30 px from the edges.
    double tx = -1, ty = -1;
    for (int y = 30; y < 226 && tx < 0; y += 4)
        for (int x = 30; x < 226 && tx < 0; x += 4) {
            bool clear = true;
            for (std::size_t i = 0; i < src.size() && clear; ++i)
                clear = std::hypot(src.x[i] - x, src.y[i] - y) > 20.0;
            if (clear) tx = x, ty = y;
        }
    ASSERT_GE(tx, 0.0) << "no empty spot on the field";

    gpuphot::viewers::ImageView* view = w.imageView();
    view->setZoom(4.0); // a screen pixel is a quarter of an image pixel
    view->centerOn(tx, ty);
    QApplication::processEvents();
    const QPoint at = view->imageToWidget(QPointF(tx, ty)).toPoint();
    QTest::mouseClick(view, Qt::LeftButton, Qt::ControlModifier, at);
    QApplication::processEvents();
    auto* inspector = w.findChild<gpuphot::ui::SourceInspector*>();
    ASSERT_NE(inspector, nullptr);
    ASSERT_TRUE(inspector->clickPhotometry().has_value()) << "Ctrl+click measured nothing";
    const gpuphot::ui::ClickPhotometry m = *inspector->clickPhotometry();
    EXPECT_NEAR(m.x, tx, 0.5);
    EXPECT_NEAR(m.y, ty, 0.5);
    EXPECT_LT(m.detection, 0);

    const gpuphot::Frame& f = *snap->frame;
    gpuphot::ApertureParams ap = snap->config.aperture;
    if (std::isfinite(f.instrument.saturation)) ap.saturation = f.instrument.saturation;
    gpuphot::RunContext ctx;
    const auto fp = gpuphot::forcedPhotometry(f.view(), f.maskView(), snap->result.background,
                                              snap->result.detection.segmentation.view(), src,
                                              snap->result.aperture, {m.x}, {m.y}, snap->result.fwhm,
                                              f.instrument.gain, f.instrument.readNoise, ap, {}, ctx);
    ASSERT_EQ(m.flux.size(), fp.aperture.radii.size());
    for (std::size_t k = 0; k < m.flux.size(); ++k) {
        EXPECT_DOUBLE_EQ(m.flux[k], fp.aperture.flux[k][0]) << k;
        EXPECT_DOUBLE_EQ(m.fluxErr[k], fp.aperture.fluxErr[k][0]) << k;
        // off any star: the sky-subtracted flux is noise
        EXPECT_LT(std::fabs(m.flux[k]), 5.0 * m.fluxErr[k]) << k;
    }
    EXPECT_DOUBLE_EQ(m.sky, fp.aperture.sky[0]);
    EXPECT_FALSE(inspector->detailsTable()->rowCount() == 0);

    // On a detection, the click's fluxes are that detection's catalog fluxes.
    ASSERT_TRUE(w.photometryAt(src.x[0], src.y[0]));
    const gpuphot::ui::ClickPhotometry d = *inspector->clickPhotometry();
    EXPECT_EQ(d.detection, 0);
    for (std::size_t k = 0; k < d.flux.size(); ++k)
        EXPECT_DOUBLE_EQ(d.flux[k], snap->result.aperture.flux[k][0]) << k;
}

namespace {
// A mouse event sent to the view itself (not through the X server's one pointer, which other GUI tests on
// the same display move too), at image position (x, y) 0-based.
void mouseAt(gpuphot::viewers::ImageView* view, QEvent::Type type, double x, double y,
             Qt::MouseButton button = Qt::LeftButton) {
    const QPointF at = view->imageToWidget(QPointF(x, y));
    const Qt::MouseButtons held =
        type == QEvent::MouseButtonRelease ? Qt::NoButton : Qt::MouseButtons(button);
    QMouseEvent e(type, at, view->mapToGlobal(at), type == QEvent::MouseMove ? Qt::NoButton : button, held,
                  Qt::NoModifier);
    QApplication::sendEvent(view, &e);
}

void dragOn(gpuphot::viewers::ImageView* view, double x0, double y0, double x1, double y1) {
    mouseAt(view, QEvent::MouseButtonPress, x0, y0);
    mouseAt(view, QEvent::MouseMove, 0.5 * (x0 + x1), 0.5 * (y0 + y1));
    mouseAt(view, QEvent::MouseMove, x1, y1);
    mouseAt(view, QEvent::MouseButtonRelease, x1, y1);
}

void clickOn(gpuphot::viewers::ImageView* view, double x, double y) {
    mouseAt(view, QEvent::MouseButtonPress, x, y);
    mouseAt(view, QEvent::MouseButtonRelease, x, y);
}
} // namespace

// Region > Draw circles / boxes / polygons: shapes made with the mouse in image coordinates, whatever the
// zoom and orientation; drawn by the layer; their statistics; saved as a DS9 file that reads back the same.
TEST(Regions, CirclesBoxesAndPolygonsDrawnWithTheMouse) {
    gpuphot::test::uiTestApp();
    gpuphot::ui::MainWindow w;
    w.resize(1200, 900);
    w.show();
    ASSERT_TRUE(openAndReduce(w));
    gpuphot::viewers::ImageView* view = w.imageView();
    view->setZoom(2.0);
    view->centerOn(128.0, 128.0);
    QApplication::processEvents();
    using Shape = gpuphot::ui::RegionDrawer::Shape;
    gpuphot::ui::RegionDrawer* drawer = w.regionDrawer();
    ASSERT_NE(drawer, nullptr);
    const QPointF centre0 = view->center();

    // Without a shape chosen a drag pans the view and draws nothing.
    dragOn(view, 100.0, 100.0, 110.0, 100.0);
    EXPECT_EQ(w.regions(), nullptr);

    drawer->setShape(Shape::Circle);
    view->centerOn(centre0.x(), centre0.y());
    QApplication::processEvents();
    mouseAt(view, QEvent::MouseButtonPress, 120.0, 130.0);
    mouseAt(view, QEvent::MouseMove, 126.0, 138.0);
    EXPECT_GE(drawer->preview().size(), 8u) << "the circle being drawn is not shown";
    mouseAt(view, QEvent::MouseButtonRelease, 126.0, 138.0);
    EXPECT_TRUE(drawer->preview().empty());
    EXPECT_NEAR(view->center().x(), centre0.x(), 1e-9) << "the drag panned the view";
    ASSERT_NE(w.regions(), nullptr);
    ASSERT_EQ(w.regions()->regions.size(), 1u);
    const gpuphot::Region c = w.regions()->regions[0];
    EXPECT_EQ(c.shape, gpuphot::RegionShape::Circle);
    EXPECT_EQ(c.system, gpuphot::RegionSystem::Image);
    EXPECT_NEAR(c.points[0], 121.0, 0.51); // DS9's 1-based pixels
    EXPECT_NEAR(c.points[1], 131.0, 0.51);
    EXPECT_NEAR(c.sizes[0].value, 10.0, 0.5);
    EXPECT_TRUE(w.statusBar()->currentMessage().contains(QStringLiteral("circle region drawn: ")))
        << w.statusBar()->currentMessage().toStdString();

    // A box on a turned, flipped view: still the image's rows and columns.
    view->rotate90();
    view->toggleFlipX();
    QApplication::processEvents();
    drawer->setShape(Shape::Box);
    dragOn(view, 40.0, 50.0, 70.0, 60.0);
    ASSERT_EQ(w.regions()->regions.size(), 2u);
    const gpuphot::Region b = w.regions()->regions[1];
    EXPECT_EQ(b.shape, gpuphot::RegionShape::Box);
    EXPECT_NEAR(b.points[0], 56.0, 0.51);
    EXPECT_NEAR(b.points[1], 56.0, 0.51);
    EXPECT_NEAR(b.sizes[0].value, 30.0, 0.6);
    EXPECT_NEAR(b.sizes[1].value, 10.0, 0.6);

    // A polygon: a click per vertex, Escape drops the one in progress, a double-click closes it.
    drawer->setShape(Shape::Polygon);
    clickOn(view, 10.0, 10.0);
    clickOn(view, 30.0, 10.0);
    QTest::keyClick(view, Qt::Key_Escape);
    EXPECT_TRUE(drawer->preview().empty());
    EXPECT_EQ(drawer->shape(), Shape::Polygon) << "one Escape drops the shape, not the tool";
    clickOn(view, 10.0, 10.0);
    clickOn(view, 30.0, 10.0);
    QTest::keyClick(view, Qt::Key_Return); // two vertices: not a polygon yet
    EXPECT_EQ(w.regions()->regions.size(), 2u);
    clickOn(view, 30.0, 25.0);
    mouseAt(view, QEvent::MouseButtonPress, 10.0, 25.0);
    mouseAt(view, QEvent::MouseButtonRelease, 10.0, 25.0);
    mouseAt(view, QEvent::MouseButtonDblClick, 10.0, 25.0);
    mouseAt(view, QEvent::MouseButtonRelease, 10.0, 25.0);
    ASSERT_EQ(w.regions()->regions.size(), 3u);
    const gpuphot::Region poly = w.regions()->regions[2];
    ASSERT_EQ(poly.points.size(), 8u) << "four vertices";
    EXPECT_NEAR(poly.points[4], 31.0, 0.51);
    EXPECT_NEAR(poly.points[5], 26.0, 0.51);
    QTest::keyClick(view, Qt::Key_Escape);
    EXPECT_EQ(drawer->shape(), Shape::None) << "Escape with nothing in progress ends drawing";

    // The layer draws the three; the box's statistics are the frame's pixels inside it.
    EXPECT_EQ(w.regionLayer()->shapeCount(), 3);
    const auto stats = w.regionStatistics();
    ASSERT_EQ(stats.size(), 3u);
    EXPECT_GE(stats[1].pixels, 28u * 9u);
    EXPECT_LE(stats[1].pixels, 32u * 11u);
    // Saved and read back: the same shapes.
    gpuphot::test::TempDir dir;
    const std::string path = (dir.path / "drawn.reg").string();
    ASSERT_TRUE(w.saveRegions(QString::fromStdString(path)));
    const gpuphot::RegionFile back = gpuphot::readDs9Regions(path);
    ASSERT_EQ(back.regions.size(), 3u);
    for (std::size_t k = 0; k < 3; ++k) {
        EXPECT_EQ(back.regions[k].shape, w.regions()->regions[k].shape) << k;
        EXPECT_EQ(back.regions[k].points, w.regions()->regions[k].points) << k;
    }
}
