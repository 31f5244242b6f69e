// The workbench's Mosaic panel end to end (issue 26): a simulated 4-CCD exposure opened in the main window
// shows the panel (no modal HDU choice), per-CCD sky statistics near the simulator's truth, an overview
// laid out as the simulator placed the CCDs, CCDs opened by a click or a table row, and "Reduce
// exposure" filling the table with the CCDs' zero-point offsets, the bad CCD flagged. A single-frame file
// still opens without the panel. The panel's screenshot is kept in the build directory.
#include <gtest/gtest.h>

#include "tests/ui/queued_spy.hpp"
#include "tests/ui/ui_test_app.hpp"

#include <QApplication>
#include <QDockWidget>
#include <QElapsedTimer>
#include <QPushButton>
#include <QSignalSpy>
#include <QTableWidget>
#include <QTest>
#include <QTimer>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <initializer_list>

#include <fitsio.h>
#include <nlohmann/json.hpp>

#include "core/sim/sim_mosaic.hpp"
#include "core/sim/simulator.hpp"
#include "tests/mosaic_support.hpp"
#include "tests/test_support.hpp"
#include "ui/main_window.hpp"
#include "ui/mosaic_panel.hpp"
#include "ui/pipeline_worker.hpp"

namespace {

using gpuphot::ui::MainWindow;
using gpuphot::ui::MosaicPanel;

// 4 CCDs in 2 x 2, CCD 3 with a 0.3 mag zero-point offset, CCD 2 tile-compressed, a guide-star table
// after the CCDs (as tests/core/exposure_test.cpp reduces it).
struct Mosaic {
    gpuphot::test::TempDir dir{"gpuphot_mosaic_ui"};
    gpuphot::MosaicTruth truth;
    nlohmann::json layout; // mos.mosaic.json
    QString file, ref;
    Mosaic() {
        const gpuphot::MosaicSimParams m = gpuphot::test::smallMosaic(384, 768, 450, 11, 60.0);
        truth = gpuphot::writeSimulatedMosaic(m, dir.str(), "mos", 16);
        layout = nlohmann::json::parse(std::ifstream(dir / "mos.mosaic.json"));
        file = QString::fromStdString(dir / "mos.fits");
        ref = QString::fromStdString(dir / "mos.ref.fits");
    }
};
const Mosaic& mosaic() {
    static Mosaic m;
    return m;
}

// Closes any modal dialog that appears (openFrame's HDU choice would otherwise block the test) and
// remembers that one did.
struct ModalWatch {
    QTimer timer;
    bool seen = false;
    ModalWatch() {
        QObject::connect(&timer, &QTimer::timeout, [this] {
            if (QWidget* m = QApplication::activeModalWidget()) {
                seen = true;
                m->close();
            }
        });
        timer.start(50);
    }
};

template <class Pred> bool waitFor(Pred pred, int timeoutMs) {
    QElapsedTimer t;
    t.start();
    while (!pred() && t.elapsed() < timeoutMs)
        QTest::qWait(50);
    return pred();
}

// The HDU of the next frame the worker loads, or -1 on timeout.
int loadedHdu(gpuphot::test::QueuedSpy& spy, int timeoutMs = 60000) {
    if (spy.isEmpty() && !spy.wait(timeoutMs)) return -1;
    const auto f = spy.takeLast().at(0).value<gpuphot::ui::FramePtr>();
    spy.clear();
    return f ? f->hdu : -1;
}

QString cell(const MosaicPanel* p, int hdu, int column) {
    const QTableWidgetItem* item = p->table()->item(p->rowOf(hdu), column);
    return item ? item->text() : QString();
}

void expectLayoutOrder(const Mosaic& m, const MosaicPanel* panel) {
    const auto& ccds = m.layout.at("ccds");
    ASSERT_EQ(ccds.size(), 4u);
    for (const auto& a : ccds)
        for (const auto& b : ccds) {
            const int ha = a.at("hdu"), hb = b.at("hdu");
            const QPointF pa = panel->view()->planeCentre(ha), pb = panel->view()->planeCentre(hb);
            ASSERT_TRUE(std::isfinite(pa.x()) && std::isfinite(pb.x())) << ha << " " << hb;
            const QPointF wa = panel->view()->widgetCentre(ha), wb = panel->view()->widgetCentre(hb);
            if (a.at("row") == b.at("row") && a.at("column") < b.at("column")) {
                EXPECT_LT(pa.x(), pb.x() - 300.0) << ha << " left of " << hb; // a CCD is 384 px wide
                EXPECT_NEAR(pa.y(), pb.y(), 30.0) << ha << " beside " << hb;
                EXPECT_LT(wa.x(), wb.x()) << ha << " left of " << hb << " on the widget";
            }
            if (a.at("column") == b.at("column") && a.at("row") < b.at("row")) { // row 0 at the top
                EXPECT_GT(pa.y(), pb.y() + 600.0) << ha << " above " << hb;      // a CCD is 768 px high
                EXPECT_LT(wa.y(), wb.y()) << ha << " above " << hb << " on the widget";
            }
        }
}

void expectSkyStatistics(const Mosaic& m, const MosaicPanel* panel) {
    const auto overview = panel->overview();
    ASSERT_TRUE(overview);
    ASSERT_EQ(overview->ccds.size(), 4u);
    for (const gpuphot::MosaicCcd& t : m.truth.ccds) {
        const auto it = std::find_if(overview->ccds.begin(), overview->ccds.end(),
                                     [&](const auto& c) { return c.ext.hdu == t.hdu; });
        ASSERT_NE(it, overview->ccds.end()) << t.extname;
        const double sigma =
            std::sqrt(t.params.sky * t.gain + t.params.readNoise * t.params.readNoise) / t.gain;
        EXPECT_NEAR(it->sky, t.params.sky + t.params.bias, 0.03 * t.params.sky) << t.extname;
        EXPECT_NEAR(it->sigma, sigma, 0.08 * sigma) << t.extname;
        EXPECT_NEAR(it->gain, t.gain, 1e-3) << t.extname;
        EXPECT_GE(it->saturated, 0) << t.extname;
        EXPECT_EQ(cell(panel, t.hdu, MosaicPanel::Sky), QString::number(it->sky, 'f', 1)) << t.extname;
        EXPECT_EQ(cell(panel, t.hdu, MosaicPanel::Extname).toStdString(), t.extname);
        EXPECT_FALSE(it->tile.isNull()) << t.extname;
    }
}

} // namespace

TEST(MosaicPanel, OpensAMosaicReducesItAndFlagsTheBadCcd) {
    gpuphot::test::uiTestApp();
    const Mosaic& m = mosaic();
    MainWindow w;
    w.resize(1500, 1000);
    w.show();
    MosaicPanel* panel = w.mosaicPanel();
    ASSERT_NE(panel, nullptr);
    auto* dock = w.findChild<QDockWidget*>(QStringLiteral("MosaicDock"));
    ASSERT_NE(dock, nullptr);
    EXPECT_FALSE(dock->isVisible());
    gpuphot::test::QueuedSpy loaded(w.worker(), &gpuphot::ui::PipelineWorker::frameLoaded);
    QSignalSpy ready(panel, &MosaicPanel::overviewReady);

    ModalWatch modal;
    ASSERT_TRUE(w.openFrame(m.file));
    EXPECT_FALSE(modal.seen) << "a mosaic opened with a modal HDU choice";
    EXPECT_TRUE(dock->isVisible());
    EXPECT_EQ(panel->path(), m.file);
    EXPECT_EQ(panel->table()->rowCount(), 4); // listed at once, before the overview lands
    EXPECT_TRUE(panel->overviewBusy());       // the pixels are read off the UI thread
    EXPECT_EQ(loadedHdu(loaded), 1);          // the first CCD opens
    EXPECT_EQ(w.framePath(), m.file);

    ASSERT_TRUE(ready.wait(120000) || !ready.isEmpty()) << "no overview";
    expectSkyStatistics(m, panel);
    expectLayoutOrder(m, panel);
    dock->raise();
    QApplication::processEvents();

    // A click on CCD03 in the overview opens HDU 3; choosing CCD02's row opens HDU 2.
    const QPointF c3 = panel->view()->widgetCentre(3);
    EXPECT_EQ(panel->view()->ccdAt(c3), 3);
    QTest::mouseClick(panel->view(), Qt::LeftButton, {}, c3.toPoint());
    EXPECT_EQ(loadedHdu(loaded), 3);
    EXPECT_EQ(panel->currentHdu(), 3);
    EXPECT_EQ(panel->view()->selected(), 3);
    EXPECT_EQ(panel->table()->currentRow(), panel->rowOf(3));
    panel->table()->setCurrentCell(panel->rowOf(2), 0);
    EXPECT_EQ(loadedHdu(loaded), 2);
    EXPECT_EQ(panel->view()->selected(), 2);
    EXPECT_FALSE(modal.seen);

    // Reduce exposure with the reference catalog loaded, into the default FOLDER/gpuphot.
    gpuphot::test::QueuedSpy refLoaded(w.worker(), &gpuphot::ui::PipelineWorker::referenceLoaded);
    w.openReference(m.ref);
    ASSERT_TRUE(refLoaded.wait(60000) || !refLoaded.isEmpty());
    QApplication::processEvents();
    EXPECT_EQ(panel->outputDir(), QString::fromStdString(m.dir / "gpuphot"));
    QSignalSpy finished(panel, &MosaicPanel::reductionFinished);
    QTest::mouseClick(panel->reduceButton(), Qt::LeftButton);
    EXPECT_TRUE(panel->reducing());
    ASSERT_TRUE(finished.wait(600000) || !finished.isEmpty()) << "the reduction did not finish";
    ASSERT_TRUE(finished.front().at(0).toBool()) << finished.front().at(1).toString().toStdString();
    EXPECT_TRUE(std::filesystem::exists(m.dir / "gpuphot/mos.report.json"));
    EXPECT_TRUE(std::filesystem::exists(m.dir / "gpuphot/mos.cat.fits"));

    const auto reduction = panel->reduction();
    ASSERT_TRUE(reduction);
    ASSERT_EQ(reduction->ccds.size(), 4u);
    int offsets = 0;
    for (const gpuphot::MosaicCcd& t : m.truth.ccds) {
        const gpuphot::ui::MosaicCcdResult* r = reduction->find(t.hdu);
        ASSERT_NE(r, nullptr) << t.extname;
        EXPECT_EQ(r->status, "ok") << t.extname;
        EXPECT_EQ(r->outlier, t.bad) << t.extname;
        const QString offset = cell(panel, t.hdu, MosaicPanel::ZpOffset);
        offsets += offset.contains(QStringLiteral("±"));
        EXPECT_EQ(cell(panel, t.hdu, MosaicPanel::Status).contains(QStringLiteral("outlier")), t.bad)
            << t.extname << ": " << cell(panel, t.hdu, MosaicPanel::Status).toStdString();
        const QTableWidgetItem* item = panel->table()->item(panel->rowOf(t.hdu), MosaicPanel::Extname);
        EXPECT_EQ(item->background().style() != Qt::NoBrush, t.bad) << t.extname << ": highlighted";
    }
    EXPECT_EQ(offsets, 4);
    EXPECT_EQ(reduction->outliers, std::vector<std::string>{"CCD03"});
    panel->resize(1200, 460); // the dock's share of the window is small for a picture
    panel->grab().save(QString::fromStdString(std::string(GPUPHOT_BUILD_DIR) + "/studio_mosaic_panel.png"));

    // Opened again, the exposure's report is found and the CCD last shown opens.
    QSignalSpy found(panel, &MosaicPanel::reductionLoaded);
    ASSERT_TRUE(w.openFrame(m.file));
    EXPECT_EQ(loadedHdu(loaded), 2);
    ASSERT_TRUE(found.wait(120000) || !found.isEmpty()) << "the report was not found";
    ASSERT_TRUE(panel->reduction());
    EXPECT_EQ(panel->reduction()->reportPath, m.dir / "gpuphot/mos.report.json");
    EXPECT_TRUE(cell(panel, 3, MosaicPanel::Status).contains(QStringLiteral("outlier")));
    EXPECT_FALSE(modal.seen);
}

TEST(MosaicPanel, ReductionCanBeCancelled) {
    gpuphot::test::uiTestApp();
    const Mosaic& m = mosaic();
    gpuphot::test::TempDir out("gpuphot_mosaic_cancel");
    MainWindow w;
    w.show();
    ASSERT_TRUE(w.openFrame(m.file));
    MosaicPanel* panel = w.mosaicPanel();
    panel->setOutputDir(QString::fromStdString(out / "red"));
    QSignalSpy finished(panel, &MosaicPanel::reductionFinished);
    QTest::mouseClick(panel->reduceButton(), Qt::LeftButton);
    ASSERT_TRUE(panel->reducing());
    EXPECT_FALSE(panel->startReduction({})); // one at a time
    panel->cancelReduction();
    ASSERT_TRUE(finished.wait(120000) || !finished.isEmpty());
    EXPECT_FALSE(finished.front().at(0).toBool());
    EXPECT_TRUE(finished.front().at(1).toString().contains(QStringLiteral("cancelled")))
        << finished.front().at(1).toString().toStdString();
    EXPECT_FALSE(panel->reducing());
    EXPECT_TRUE(panel->reduceButton()->isEnabled());
    EXPECT_FALSE(std::filesystem::exists(out / "red/mos.report.json"));
}

TEST(MosaicPanel, SingleFrameOpensWithoutThePanel) {
    gpuphot::test::uiTestApp();
    const Mosaic& m = mosaic();
    gpuphot::test::TempDir dir("gpuphot_mosaic_single");
    gpuphot::SimParams p;
    p.width = 200;
    p.height = 160;
    p.stars = 30;
    p.galaxies = 0;
    p.clusters = 0;
    gpuphot::writeSimulation(gpuphot::simulateField(p), dir.str(), "single", -32);
    const QString single = QString::fromStdString(dir / "single.fits");

    MainWindow w;
    w.show();
    auto* dock = w.findChild<QDockWidget*>(QStringLiteral("MosaicDock"));
    ASSERT_NE(dock, nullptr);
    gpuphot::test::QueuedSpy loaded(w.worker(), &gpuphot::ui::PipelineWorker::frameLoaded);
    ModalWatch modal;
    ASSERT_TRUE(w.openFrame(m.file));
    EXPECT_TRUE(dock->isVisible());
    EXPECT_EQ(loadedHdu(loaded), 1);
    ASSERT_TRUE(w.openFrame(single));
    EXPECT_FALSE(modal.seen);
    EXPECT_FALSE(dock->isVisible()) << "the Mosaic panel stays up for a single frame";
    EXPECT_TRUE(w.mosaicPanel()->path().isEmpty());
    EXPECT_EQ(w.framePath(), single);
    EXPECT_EQ(loadedHdu(loaded), 0);
    EXPECT_TRUE(gpuphot::ui::computeMosaicOverview(single.toStdString(), {}, {}, std::atomic<bool>(false))
                    ->ccds.empty());
}

// Two float images of 64 x 48 named `names` (the first in the primary HDU), no WCS; false on error.
bool writeImages(const std::string& path, std::initializer_list<const char*> names) {
    int status = 0;
    fitsfile* f = nullptr;
    long axes[2] = {64, 48};
    std::vector<float> pixels(64 * 48, 100.0f);
    fits_create_file(&f, path.c_str(), &status);
    for (const char* name : names) {
        fits_create_img(f, FLOAT_IMG, 2, axes, &status);
        fits_write_key(f, TSTRING, "EXTNAME", const_cast<char*>(name), nullptr, &status);
        fits_write_img(f, TFLOAT, 1, static_cast<LONGLONG>(pixels.size()), pixels.data(), &status);
    }
    fits_close_file(f, &status);
    return status == 0;
}

// A science image with its error plane is one frame, not a mosaic: the HDU choice is asked as before.
TEST(MosaicPanel, ImageWithAnErrorPlaneStillAsksForTheHdu) {
    gpuphot::test::uiTestApp();
    gpuphot::test::TempDir dir("gpuphot_mosaic_err");
    const std::string path = dir / "sci.fits";
    ASSERT_TRUE(writeImages(path, {"SCI", "ERR"}));

    MainWindow w;
    w.show();
    ModalWatch modal;
    EXPECT_FALSE(w.openFrame(QString::fromStdString(path))); // the dialog closed: nothing opened
    EXPECT_TRUE(modal.seen) << "no HDU choice for a file with two images";
    EXPECT_TRUE(w.mosaicPanel()->path().isEmpty());
    EXPECT_FALSE(w.findChild<QDockWidget*>(QStringLiteral("MosaicDock"))->isVisible());
}

// CCDs without a WCS are laid out in HDU order, left to right.
TEST(MosaicPanel, CcdsWithoutWcsAreLaidOutInHduOrder) {
    gpuphot::test::uiTestApp();
    gpuphot::test::TempDir dir("gpuphot_mosaic_nowcs");
    const std::string path = dir / "two.fits";
    ASSERT_TRUE(writeImages(path, {"A", "B"}));
    MainWindow w;
    w.show();
    MosaicPanel* panel = w.mosaicPanel();
    QSignalSpy ready(panel, &MosaicPanel::overviewReady);
    ModalWatch modal;
    ASSERT_TRUE(w.openFrame(QString::fromStdString(path)));
    EXPECT_FALSE(modal.seen);
    ASSERT_TRUE(ready.wait(60000) || !ready.isEmpty());
    ASSERT_TRUE(panel->overview());
    EXPECT_FALSE(panel->overview()->placedByWcs);
    EXPECT_LT(panel->view()->planeCentre(0).x(), panel->view()->planeCentre(1).x());
    EXPECT_NEAR(panel->overview()->ccds[1].sky, 100.0, 1e-6);
    EXPECT_NEAR(panel->overview()->ccds[1].sigma, 0.0, 1e-6);
    EXPECT_TRUE(std::isnan(panel->overview()->ccds[1].gain)); // none in the header
    EXPECT_EQ(cell(panel, 1, MosaicPanel::Gain), QStringLiteral("–"));
}
