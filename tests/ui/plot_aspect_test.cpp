// Equal scales on a spatial plot's two axes (ui/plot_aspect.hpp), whatever the plot's shape.
#include <gtest/gtest.h>

#include "tests/ui/ui_test_app.hpp"

#include <QApplication>
#include <cmath>
#include <qcustomplot.h>

#include "ui/plot_aspect.hpp"

namespace {
// Data units per screen pixel on x and on y.
std::pair<double, double> unitsPerPixel(QCustomPlot& p) {
    const QRect r = p.axisRect()->rect();
    return {p.xAxis->range().size() / r.width(), p.yAxis->range().size() / r.height()};
}
} // namespace

TEST(PlotAspect, AFrameKeepsItsShapeInAWideOrTallPlotAndAfterAResize) {
    gpuphot::test::uiTestApp();
    QCustomPlot p;
    p.resize(700, 250); // wide, for a tall frame
    p.show();
    gpuphot::ui::keepEqualAspect(&p, QCPRange(-0.5, 2047.5), QCPRange(-0.5, 4095.5));
    p.replot();
    auto [ux, uy] = unitsPerPixel(p);
    EXPECT_NEAR(ux / uy, 1.0, 1e-9);
    EXPECT_LE(p.xAxis->range().lower, -0.5);
    EXPECT_GE(p.xAxis->range().upper, 2047.5);
    EXPECT_NEAR(p.yAxis->range().lower, -0.5, 1e-9) << "the tall side fills the plot";
    EXPECT_NEAR(p.yAxis->range().upper, 4095.5, 1e-9);
    p.resize(250, 700); // now tall
    QApplication::processEvents();
    p.replot();
    std::tie(ux, uy) = unitsPerPixel(p);
    EXPECT_NEAR(ux / uy, 1.0, 1e-9);
    EXPECT_LE(p.yAxis->range().lower, -0.5);
    EXPECT_GE(p.yAxis->range().upper, 4095.5);
    // Without it the same plot stretches the frame: the check can fail.
    QCustomPlot q;
    q.resize(700, 250);
    q.show();
    q.xAxis->setRange(-0.5, 2047.5);
    q.yAxis->setRange(-0.5, 4095.5);
    q.replot();
    std::tie(ux, uy) = unitsPerPixel(q);
    EXPECT_GT(std::fabs(ux / uy - 1.0), 0.5);
}
