// The S/N plot as an observer reads it: its title counts every source of the catalog table and says how
// many it could not place (NaN magnitude, zero or NaN error); its axes stay on the plotted data, and a
// limiting magnitude beyond the data is named at the edge instead of widening the axis.
#include <gtest/gtest.h>

#include "tests/ui/ui_test_app.hpp"

#include <qcustomplot.h>

#include <QApplication>
#include <cmath>
#include <limits>
#include <memory>

#include "tests/ui/panel_fixture.hpp"
#include "ui/panel_data.hpp"
#include "ui/plots_panel.hpp"

using namespace gpuphot;
using namespace gpuphot::ui;
using gpuphot::test::panelFixture;

namespace {

using P = PlotsPanel::Plot;

// The calibrated fixture with source 0 without an error (S/N not determinable) and source 1 without a
// magnitude (non-positive flux); the limiting magnitude optionally moved.
SnapshotPtr withUnplaceableSources(double limitingMag = std::numeric_limits<double>::quiet_NaN()) {
    auto s = std::make_shared<Snapshot>(*panelFixture().calibrated);
    s->result.magInstErr.at(0) = 0.0;
    s->result.magInst.at(1) = std::numeric_limits<double>::quiet_NaN();
    if (std::isfinite(limitingMag)) { // the plot's calibration (limit − instrumental limit) stays
        auto& z = s->result.zeropoint;
        z.limitingMagInst += limitingMag - z.limitingMag;
        z.limitingMag = limitingMag;
    }
    return s;
}

const QCPAbstractItem* itemNamed(QCustomPlot* p, const QString& name) {
    for (int k = 0; k < p->itemCount(); ++k)
        if (p->item(k)->objectName() == name) return p->item(k);
    return nullptr;
}

void expectAxesOnData(QCustomPlot* p, const SnrPlotData& d) {
    double mlo = INFINITY, mhi = -INFINITY, slo = INFINITY, shi = -INFINITY;
    for (std::size_t k = 0; k < d.mag.size(); ++k) {
        mlo = std::min(mlo, d.mag[k]);
        mhi = std::max(mhi, d.mag[k]);
        slo = std::min(slo, d.snr[k]);
        shi = std::max(shi, d.snr[k]);
    }
    const double margin = 0.1 * (mhi - mlo);
    EXPECT_LE(p->xAxis->range().lower, mlo);
    EXPECT_GE(p->xAxis->range().lower, mlo - margin);
    EXPECT_GE(p->xAxis->range().upper, mhi);
    EXPECT_LE(p->xAxis->range().upper, mhi + margin);
    EXPECT_LE(p->yAxis->range().lower, slo);
    EXPECT_GE(p->yAxis->range().lower, slo / 2.0);
    EXPECT_GE(p->yAxis->range().upper, shi);
    EXPECT_LE(p->yAxis->range().upper, shi * 2.0);
}

} // namespace

TEST(PlotsPanel, SnrCountsEverySourceAndNamesThoseWithoutSnr) {
    gpuphot::test::uiTestApp();
    const SnapshotPtr s = withUnplaceableSources();
    PlotsPanel panel;
    panel.resize(900, 600);
    panel.setSnapshot(s);
    const SnrPlotData d = snrPlotData(*s);
    const std::size_t total = s->result.detection.sources.size();
    ASSERT_GE(total, 10u);
    std::size_t placed = 0;
    for (std::size_t i = 0; i < s->result.magInst.size(); ++i)
        placed += std::isfinite(s->result.magInst[i]) && s->result.magInstErr[i] > 0;
    ASSERT_EQ(d.mag.size(), placed);
    const QString title = panel.plotTitle(P::SnrVsMag);
    EXPECT_TRUE(title.startsWith(QStringLiteral("%1 sources, %2 without S/N").arg(total).arg(total - placed)))
        << title.toStdString();
    EXPECT_GE(total - placed, 2u);
    expectAxesOnData(panel.plot(P::SnrVsMag), d);
}

TEST(PlotsPanel, SnrLimitBeyondTheDataDoesNotWidenTheAxis) {
    gpuphot::test::uiTestApp();
    const SnapshotPtr s = withUnplaceableSources(99.0);
    PlotsPanel panel;
    panel.setSnapshot(s);
    const SnrPlotData d = snrPlotData(*s);
    QCustomPlot* p = panel.plot(P::SnrVsMag);
    expectAxesOnData(p, d);
    EXPECT_EQ(itemNamed(p, QStringLiteral("limitingMag")), nullptr); // no line outside the data
    const auto* label = qobject_cast<const QCPItemText*>(itemNamed(p, QStringLiteral("limitingMagLabel")));
    ASSERT_NE(label, nullptr);
    EXPECT_TRUE(label->text().contains(QStringLiteral("99.00"))) << label->text().toStdString();
    EXPECT_NEAR(label->position->coords().x(), p->xAxis->range().upper, 1e-9);
    EXPECT_TRUE(panel.plotTitle(P::SnrVsMag).contains(QStringLiteral("99.00")));
}

TEST(PlotsPanel, SnrLimitInsideTheDataIsALine) {
    gpuphot::test::uiTestApp();
    const SnapshotPtr base = withUnplaceableSources();
    const SnrPlotData d0 = snrPlotData(*base);
    const double mid = 0.5 * (*std::min_element(d0.mag.begin(), d0.mag.end()) +
                              *std::max_element(d0.mag.begin(), d0.mag.end()));
    const SnapshotPtr s = withUnplaceableSources(mid);
    PlotsPanel panel;
    panel.setSnapshot(s);
    QCustomPlot* p = panel.plot(P::SnrVsMag);
    expectAxesOnData(p, snrPlotData(*s));
    const auto* line = qobject_cast<const QCPItemStraightLine*>(itemNamed(p, QStringLiteral("limitingMag")));
    ASSERT_NE(line, nullptr);
    EXPECT_NEAR(line->point1->coords().x(), snrPlotData(*s).limitingMag, 1e-9);
}
