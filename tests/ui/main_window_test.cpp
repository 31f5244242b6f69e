#include <gtest/gtest.h>

#include <QApplication>
#include <QLabel>
#include <QStatusBar>
#include <filesystem>

#include "core/io/fits_image.hpp"
#include "ui/main_window.hpp"

namespace {
QApplication& app() {
    static int argc = 1;
    static char name[] = "ui_tests";
    static char* argv[] = {name, nullptr};
    // Under CI without a display (and without xvfb-run) the offscreen platform still renders.
    if (qEnvironmentVariableIsEmpty("DISPLAY") && qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM"))
        qputenv("QT_QPA_PLATFORM", "offscreen");
    static QApplication instance(argc, argv);
    return instance;
}
} // namespace

TEST(MainWindow, OpensAFrameAndShowsItsSize) {
    app();
    const auto path = std::filesystem::temp_directory_path() / "gpuphot_ui_open.fits";
    gpuphot::Image<float> img(37, 21, 5.0f);
    gpuphot::writeFitsImage(path.string(), img.view(), gpuphot::Header{});
    gpuphot::ui::MainWindow w;
    ASSERT_TRUE(w.openFrame(QString::fromStdString(path.string())));
    auto* label = qobject_cast<QLabel*>(w.centralWidget());
    ASSERT_NE(label, nullptr);
    EXPECT_TRUE(label->text().contains(QStringLiteral("37 x 21"))) << label->text().toStdString();
    std::filesystem::remove(path);
}

TEST(MainWindow, BadFileShowsTheErrorAndKeepsRunning) {
    app();
    gpuphot::ui::MainWindow w;
    EXPECT_FALSE(w.openFrame(QStringLiteral("/nonexistent/frame.fits")));
    EXPECT_TRUE(w.statusBar()->currentMessage().contains(QStringLiteral("/nonexistent/frame.fits")));
}
