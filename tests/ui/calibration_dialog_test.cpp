// File > Calibration frames... (ui/calibration_dialog.hpp, MainWindow::setCalibrationFrames): the dialog
// refuses unusable files with a message naming the file and the problem; accepted master frames change the
// prepared frame the worker measures and the viewer shows (bias subtracted, divided by the flat), are shown
// in the status bar and persist in QSettings for the next window; clearing them restores the raw pixels.
#include <gtest/gtest.h>

#include "tests/ui/ui_test_app.hpp"

#include <QElapsedTimer>
#include <QLabel>
#include <QLineEdit>
#include <QMessageBox>
#include <QSignalSpy>
#include <QTest>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/io/fits_image.hpp"
#include "core/sim/simulator.hpp"
#include "tests/test_support.hpp"
#include "ui/calibration_dialog.hpp"
#include "ui/main_window.hpp"
#include "viewers/image_view.hpp"

using namespace gpuphot;
using namespace gpuphot::ui;

namespace {

// Waits for a shown complete snapshot that satisfies `want`.
template <class Pred> SnapshotPtr waitShown(QSignalSpy& spy, Pred want, int ms = 60000) {
    QElapsedTimer t;
    t.start();
    while (t.elapsed() < ms) {
        while (!spy.isEmpty()) {
            SnapshotPtr s = spy.takeFirst().at(0).value<SnapshotPtr>();
            if (s && want(s)) return s;
        }
        QTest::qWait(10);
    }
    return nullptr;
}

// Clears the persisted choice around each test (the other ui tests' windows read it too).
struct SettingsGuard {
    SettingsGuard() { saveCalibrationSettings({}); }
    ~SettingsGuard() { saveCalibrationSettings({}); }
};

} // namespace

TEST(CalibrationDialog, RefusesUnusableFilesNamingThem) {
    gpuphot::test::uiTestApp();
    SettingsGuard guard;
    test::TempDir dir("calib_dialog");
    const std::string good = (dir.path / "bias.fits").string(),
                      small = (dir.path / "dark_small.fits").string();
    writeFitsImage(good, Image<float>(64, 48, 100.0f).view(), Header{});
    writeFitsImage(small, Image<float>(32, 32, 1.0f).view(), Header{});
    const std::string text = (dir.path / "flat.txt").string();
    std::ofstream(text) << "not a FITS file\n";
    const std::string missing = (dir.path / "nowhere.fits").string();

    CalibrationFrames f;
    f.bias = QString::fromStdString(missing);
    QStringList p = validateCalibrationFrames(f);
    ASSERT_EQ(p.size(), 1);
    EXPECT_TRUE(p[0].contains(QString::fromStdString(missing)) &&
                p[0].contains(QStringLiteral("does not exist")))
        << p[0].toStdString();
    f.bias = QString::fromStdString(good);
    f.flat = QString::fromStdString(text);
    p = validateCalibrationFrames(f);
    ASSERT_EQ(p.size(), 1);
    EXPECT_TRUE(p[0].contains(QString::fromStdString(text)) && p[0].contains(QStringLiteral("FITS")))
        << p[0].toStdString();
    f.flat.clear();
    f.dark = QString::fromStdString(small);
    p = validateCalibrationFrames(f);
    ASSERT_EQ(p.size(), 1);
    EXPECT_TRUE(p[0].contains(QString::fromStdString(small)) && p[0].contains(QString::fromStdString(good)) &&
                p[0].contains(QStringLiteral("32 x 32")) && p[0].contains(QStringLiteral("64 x 48")))
        << p[0].toStdString();
    f.dark.clear();
    EXPECT_TRUE(validateCalibrationFrames(f).isEmpty());
    EXPECT_TRUE(validateCalibrationFrames({}).isEmpty());

    // The dialog: OK with a missing file keeps it open and shows the problem; a usable set is accepted.
    CalibrationDialog d({});
    d.show();
    d.pathEdit(CalibrationDialog::Flat)->setText(QString::fromStdString(missing));
    d.accept();
    EXPECT_TRUE(d.isVisible());
    EXPECT_NE(d.result(), QDialog::Accepted);
    ASSERT_TRUE(d.errorBox());
    EXPECT_TRUE(d.errorBox()->isVisible());
    EXPECT_TRUE(d.errorBox()->informativeText().contains(QString::fromStdString(missing)));
    d.errorBox()->close();
    d.pathEdit(CalibrationDialog::Flat)->clear();
    d.pathEdit(CalibrationDialog::Bias)->setText(QString::fromStdString(good));
    d.accept();
    EXPECT_EQ(d.result(), QDialog::Accepted);
    EXPECT_EQ(d.frames().bias, QString::fromStdString(good));
    EXPECT_EQ(d.frames().summary(), QStringLiteral("bias"));
}

TEST(CalibrationDialog, MasterFramesChangeThePreparedFrameAndPersist) {
    gpuphot::test::uiTestApp();
    SettingsGuard guard;
    test::TempDir dir("calib_window");
    SimParams sp;
    sp.width = sp.height = 256;
    sp.stars = 80;
    sp.seed = 3;
    sp.galaxies = 0;
    writeSimulation(simulateField(sp), dir.str(), "f", -32);

    MainWindow w;
    w.resize(1300, 850);
    w.show();
    QSignalSpy shown(&w, &MainWindow::snapshotShown);
    QSignalSpy applied(&w, &MainWindow::calibrationFramesApplied);
    QSignalSpy errors(&w, &MainWindow::errorShown);
    ASSERT_TRUE(w.openFrame(QString::fromStdString((dir.path / "f.fits").string())));
    const SnapshotPtr s0 = waitShown(shown, [](const SnapshotPtr&) { return true; });
    ASSERT_TRUE(s0);
    const Image<float>& raw = s0->frame->pixels;
    const int W = raw.width(), H = raw.height();

    // Masters: a bias of 100 ADU; a flat of 1 with a band of 1.25 (median 1: the band's pixels / 1.25).
    Image<float> flat(W, H, 1.0f);
    for (int y = 0; y < H; ++y)
        for (int x = 0; x < W / 4; ++x)
            flat(x, y) = 1.25f;
    const std::string bias = (dir.path / "bias.fits").string(), flatPath = (dir.path / "flat.fits").string();
    writeFitsImage(bias, Image<float>(W, H, 100.0f).view(), Header{});
    writeFitsImage(flatPath, flat.view(), Header{});

    CalibrationDialog* d = w.showCalibrationDialog();
    ASSERT_TRUE(d);
    d->pathEdit(CalibrationDialog::Bias)->setText(QString::fromStdString(bias));
    d->pathEdit(CalibrationDialog::Flat)->setText(QString::fromStdString(flatPath));
    QTest::qWait(50);
    const QString shot = QString::fromStdString(
        (std::filesystem::temp_directory_path() / "gpuphot_calibration_dialog.png").string());
    EXPECT_TRUE(d->grab().save(shot, "PNG"));
    RecordProperty("screenshot", shot.toStdString());
    d->accept();
    ASSERT_TRUE(QTest::qWaitFor([&] { return applied.count() >= 1; }, 30000));
    const CalibrationFrames want{QString::fromStdString(bias), QString(), QString::fromStdString(flatPath),
                                 QString()};
    EXPECT_EQ(w.calibrationFrames(), want);
    EXPECT_EQ(loadCalibrationSettings(), want) << "persisted once the worker took them";
    const auto* label = w.findChild<QLabel*>(QStringLiteral("CalibrationLabel"));
    ASSERT_TRUE(label);
    EXPECT_TRUE(label->text().contains(QStringLiteral("bias, flat"))) << label->text().toStdString();

    const SnapshotPtr s1 = waitShown(shown, [&](const SnapshotPtr& s) { return s->frame != s0->frame; });
    ASSERT_TRUE(s1) << (errors.isEmpty() ? "no calibrated result"
                                         : errors.last().at(0).toString().toStdString());
    ASSERT_EQ(s1->frame->width(), W);
    ASSERT_EQ(s1->frame->height(), H);
    int checked = 0;
    for (int y = 0; y < H; y += 7)
        for (int x = 0; x < W; x += 5) {
            const double expect = (double(raw(x, y)) - 100.0) / flat(x, y);
            ASSERT_NEAR(s1->frame->pixels(x, y), expect, 1e-5 * std::abs(expect) + 1e-3) << x << "," << y;
            ++checked;
        }
    EXPECT_GT(checked, 1000);
    // The viewer shows the prepared pixels.
    ASSERT_TRUE(w.imageView()->image());
    EXPECT_EQ(w.imageView()->image().get(), &s1->frame->pixels);

    // A new window starts with the persisted choice.
    {
        MainWindow w2;
        QSignalSpy applied2(&w2, &MainWindow::calibrationFramesApplied);
        ASSERT_TRUE(QTest::qWaitFor([&] { return applied2.count() >= 1; }, 30000));
        EXPECT_EQ(w2.calibrationFrames(), want);
    }

    // A file the worker cannot read (deleted after the choice) is an error dialog naming it; cleared.
    const std::string gone = (dir.path / "gone.fits").string();
    writeFitsImage(gone, Image<float>(W, H, 1.0f).view(), Header{});
    CalibrationFrames withDark = want;
    withDark.dark = QString::fromStdString(gone);
    std::filesystem::remove(gone);
    w.setCalibrationFrames(withDark);
    ASSERT_TRUE(QTest::qWaitFor([&] { return applied.count() >= 2; }, 30000));
    ASSERT_FALSE(errors.isEmpty());
    EXPECT_TRUE(errors.last().at(0).toString().contains(QString::fromStdString(gone)))
        << errors.last().at(0).toString().toStdString();
    EXPECT_TRUE(w.calibrationFrames().empty());

    // Cleared: the raw pixels again.
    w.setCalibrationFrames({});
    const SnapshotPtr s2 = waitShown(shown, [&](const SnapshotPtr& s) {
        return s->frame != s1->frame && s->frame->pixels(3, 3) == raw(3, 3);
    });
    ASSERT_TRUE(s2);
    EXPECT_EQ(s2->frame->pixels(W - 2, H - 2), raw(W - 2, H - 2));
    EXPECT_TRUE(loadCalibrationSettings().empty());
}
