// Following a folder: a frame the camera is still writing is not announced; once its data is all on disk it
// is, at the next change of the folder or poll; the workbench's own outputs are never frames.
#include <gtest/gtest.h>

#include "tests/ui/ui_test_app.hpp"

#include <QApplication>
#include <QDir>
#include <QElapsedTimer>
#include <QLabel>
#include <QMessageBox>
#include <QSignalSpy>
#include <QTableWidget>
#include <QTest>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/io/fits_image.hpp"
#include "core/model/image.hpp"
#include "core/sim/simulator.hpp"
#include "tests/test_support.hpp"
#include "ui/folder_follower.hpp"
#include "ui/main_window.hpp"

namespace fs = std::filesystem;

TEST(FolderFollower, AnnouncesAFrameOnlyWhenItsDataIsComplete) {
    gpuphot::test::uiTestApp();
    gpuphot::test::TempDir src, dir;
    const std::string frame = (src.path / "f.fits").string();
    gpuphot::Image<float> img(200, 150);
    for (int y = 0; y < 150; ++y)
        for (int x = 0; x < 200; ++x)
            img(x, y) = static_cast<float>((x * 13 + y) % 101);
    gpuphot::writeFitsImage(frame, img.view(), gpuphot::Header{});
    std::string bytes(fs::file_size(frame), '\0');
    std::ifstream(frame, std::ios::binary).read(bytes.data(), static_cast<std::streamsize>(bytes.size()));

    gpuphot::ui::FolderFollower follower;
    follower.setPollInterval(100);
    follower.follow(QString::fromStdString(dir.path.string()));
    QSignalSpy ready(&follower, &gpuphot::ui::FolderFollower::frameReady);
    const fs::path target = dir.path / "night_0001.fits";
    {
        std::ofstream out(target, std::ios::binary);
        out.write(bytes.data(), static_cast<std::streamsize>(2 * 2880)); // the header and a first block
    }
    EXPECT_FALSE(ready.wait(800)) << "announced a frame still being written";
    {
        std::ofstream out(target, std::ios::binary | std::ios::app);
        out.write(bytes.data() + 2 * 2880, static_cast<std::streamsize>(bytes.size() - 2 * 2880));
    }
    ASSERT_TRUE(ready.count() > 0 || ready.wait(5000));
    EXPECT_EQ(ready.at(0).at(0).toString().toStdString(), target.string());
    // A catalog written beside it is not a frame.
    fs::copy_file(frame, dir.path / "night_0001.cat.fits");
    EXPECT_FALSE(ready.wait(600));
    EXPECT_EQ(ready.count(), 1);
}

// Following every frame: a tile-compressed frame (its image in HDU 1), a file without an image and a
// plain frame each get a History row, in order, without a dialog; the failure is logged and the next
// frame goes on.
TEST(FolderFollower, EveryFrameModeReducesEachAndListsFailures) {
    gpuphot::test::uiTestApp();
    gpuphot::test::TempDir src, dir;
    gpuphot::SimParams p;
    p.width = p.height = 256;
    p.stars = 80;
    p.galaxies = 0;
    gpuphot::writeSimulation(gpuphot::simulateField(p), src.path.string(), "plain", -32);
    gpuphot::writeFitsHeader((src.path / "empty.fits").string(), gpuphot::Header{});

    gpuphot::ui::MainWindow w;
    w.resize(1200, 800);
    w.show();
    w.setFollowEveryFrame(true);
    w.followFolder(QString::fromStdString(dir.path.string()));
    QSignalSpy errors(&w, &gpuphot::ui::MainWindow::errorShown);
    fs::copy_file(fs::path(GPUPHOT_TEST_DATA) / "fits" / "astropy_rice_u16.fits.fz",
                  dir.path / "a_rice.fits.fz");
    QTest::qWait(30); // distinct modification times: the frames queue in this order
    fs::copy_file(src.path / "empty.fits", dir.path / "b_empty.fits");
    QTest::qWait(30);
    fs::copy_file(src.path / "plain.fits", dir.path / "c_plain.fits");

    auto* history = w.findChild<QTableWidget*>(QStringLiteral("HistoryTable"));
    ASSERT_NE(history, nullptr);
    for (QElapsedTimer t; history->rowCount() < 3;) {
        if (!t.isValid()) t.start();
        ASSERT_LT(t.elapsed(), 120000) << history->rowCount() << " rows";
        QTest::qWait(50);
    }
    const auto cell = [&](int r, int c) { return history->item(r, c)->text().toStdString(); };
    EXPECT_EQ(cell(0, 0), "a_rice.fits.fz");
    EXPECT_EQ(cell(0, 5).rfind("reduced", 0), 0u) << cell(0, 5);
    EXPECT_EQ(cell(1, 0), "b_empty.fits");
    EXPECT_EQ(cell(1, 5).rfind("failed", 0), 0u) << cell(1, 5);
    EXPECT_EQ(cell(2, 0), "c_plain.fits");
    EXPECT_EQ(cell(2, 5).rfind("reduced", 0), 0u) << cell(2, 5);
    EXPECT_NE(cell(2, 2), "–");
    for (QWidget* top : QApplication::topLevelWidgets())
        EXPECT_FALSE(qobject_cast<QMessageBox*>(top) && top->isVisible()) << "a dialog during the follow";
    EXPECT_TRUE(errors.isEmpty());
    // "following DIR" stays in the status bar (a permanent label, not a passing message) until stopped.
    auto* label = w.findChild<QLabel*>(QStringLiteral("FollowLabel"));
    ASSERT_NE(label, nullptr);
    EXPECT_TRUE(label->isVisible());
    EXPECT_TRUE(
        label->toolTip().contains(QDir::toNativeSeparators(QString::fromStdString(dir.path.string()))));
    w.followFolder(QString());
    EXPECT_FALSE(label->isVisible());
}
