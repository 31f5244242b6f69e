// The analysis panels (plots, PSF panel, source inspector, header view, log) under the offscreen
// platform: each takes a real snapshot of a simulated, calibrated frame, shows graphs whose data counts
// are the stages' counts, exports PNG/PDF that are not blank; screenshots go to /tmp/panels_*.png.
#include <gtest/gtest.h>

#include "tests/ui/ui_test_app.hpp"

#include <qcustomplot.h>

#include <QApplication>
#include <QFile>
#include <QImage>
#include <QLabel>
#include <QMouseEvent>
#include <QPlainTextEdit>
#include <QRegularExpression>
#include <QSet>
#include <QTableWidget>
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/model/flags.hpp"
#include "tests/ui/panel_fixture.hpp"
#include "ui/header_view.hpp"
#include "ui/log_panel.hpp"
#include "ui/panel_data.hpp"
#include "ui/plots_panel.hpp"
#include "ui/psf_panel.hpp"
#include "ui/source_inspector.hpp"

using namespace gpuphot;
using namespace gpuphot::ui;
using gpuphot::test::panelFixture;

namespace {

QApplication& app() {
    return gpuphot::test::uiTestApp();
}

int countOf(QCustomPlot* p, const QString& name) {
    for (int k = 0; k < p->plottableCount(); ++k)
        if (p->plottable(k)->name() == name) {
            if (auto* g = qobject_cast<QCPGraph*>(p->plottable(k))) return g->dataCount();
            if (auto* c = qobject_cast<QCPCurve*>(p->plottable(k))) return c->dataCount();
            if (auto* m = qobject_cast<QCPColorMap*>(p->plottable(k)))
                return m->data()->keySize() * m->data()->valueSize();
        }
    return -1;
}

// An image is "not blank" when it has many distinct colours and pixels far from the dominant one.
void expectNotBlank(const QImage& img, const std::string& what, int minColours = 8) {
    ASSERT_FALSE(img.isNull()) << what;
    QSet<QRgb> colours;
    for (int y = 0; y < img.height(); y += 2)
        for (int x = 0; x < img.width(); x += 2)
            colours.insert(img.pixel(x, y));
    EXPECT_GE(colours.size(), minColours) << what;
}

void save(QWidget& w, const QString& name) {
    const QImage shot = w.grab().toImage();
    shot.save(QStringLiteral("/tmp/panels_%1.png").arg(name));
    expectNotBlank(shot, name.toStdString());
}

void settle() {
    for (int k = 0; k < 3; ++k)
        QApplication::processEvents();
}

} // namespace

TEST(Panels, PlotsShowTheStagesCountsAndExport) {
    app();
    const auto& f = panelFixture();
    const Snapshot& s = *f.calibrated;
    PlotsPanel panel;
    panel.resize(900, 600);
    panel.show();
    panel.setSnapshot(f.calibrated);
    settle();
    using P = PlotsPanel::Plot;
    const ZeroPointResult& z = s.result.zeropoint;
    ASSERT_TRUE(z.ok);
    EXPECT_EQ(countOf(panel.plot(P::ZeroPointVsMag), "used"), z.nUsed);
    EXPECT_EQ(countOf(panel.plot(P::ZeroPointVsMag), "clipped"), z.nCandidates - z.nUsed);
    EXPECT_EQ(countOf(panel.plot(P::ZeroPointVsMag), "fit"), 2);
    EXPECT_EQ(countOf(panel.plot(P::ZeroPointVsColour), "used"), z.nUsed);
    EXPECT_EQ(countOf(panel.plot(P::ZeroPointVsColour), "clipped"), z.nCandidates - z.nUsed);
    const AstrometryResult& a = s.result.astrometry;
    ASSERT_TRUE(a.ok);
    const int clippedAst = static_cast<int>(a.sourceIndex.size()) - a.nUsed;
    for (P w : {P::AstrometryVsX, P::AstrometryVsY}) {
        EXPECT_EQ(countOf(panel.plot(w), QStringLiteral("ΔRA cos δ")), a.nUsed);
        EXPECT_EQ(countOf(panel.plot(w), QStringLiteral("ΔDec")), a.nUsed);
        EXPECT_EQ(countOf(panel.plot(w), QStringLiteral("ΔRA clipped")), clippedAst);
    }
    EXPECT_EQ(countOf(panel.plot(P::AstrometryVectors), "used"), a.nUsed);
    EXPECT_EQ(countOf(panel.plot(P::AstrometryVectors), "vectors"), 3 * a.nUsed); // start, end, gap
    EXPECT_GT(panel.vectorExaggeration(), 1.0);
    // Every vector (used and clipped) ends in an arrow head at its tip: residual x exaggeration from the
    // star.
    {
        const AstrometryPlotData ad = astrometryPlotData(s);
        std::vector<std::pair<double, double>> tips;
        for (const AstrometryPoints* pts : {&ad.used, &ad.clipped})
            for (std::size_t k = 0; k < pts->size(); ++k)
                if (std::isfinite(pts->dxPx[k]) && std::isfinite(pts->dyPx[k]))
                    tips.push_back({pts->x[k] + panel.vectorExaggeration() * pts->dxPx[k],
                                    pts->y[k] + panel.vectorExaggeration() * pts->dyPx[k]});
        ASSERT_LE(static_cast<int>(tips.size()), PlotsPanel::kMaxArrowHeads);
        std::vector<std::pair<double, double>> heads;
        QCustomPlot* vp = panel.plot(P::AstrometryVectors);
        for (int k = 0; k < vp->itemCount(); ++k)
            if (auto* line = qobject_cast<QCPItemLine*>(vp->item(k));
                line && line->objectName() == QLatin1String("arrowHead")) {
                EXPECT_EQ(line->head().style(), QCPLineEnding::esSpikeArrow);
                heads.push_back({line->end->coords().x(), line->end->coords().y()});
            }
        std::sort(tips.begin(), tips.end());
        std::sort(heads.begin(), heads.end());
        ASSERT_EQ(heads.size(), tips.size());
        for (std::size_t k = 0; k < tips.size(); ++k) {
            EXPECT_NEAR(heads[k].first, tips[k].first, 1e-9);
            EXPECT_NEAR(heads[k].second, tips[k].second, 1e-9);
        }
        // The legend sits outside the plotted area (it covered vectors), and the frame keeps its shape.
        panel.setCurrentPlot(P::AstrometryVectors);
        settle();
        vp->replot();
        EXPECT_TRUE(vp->legend->visible());
        EXPECT_FALSE(vp->legend->outerRect().intersects(vp->axisRect()->rect()));
        const double perPxX = vp->xAxis->range().size() / vp->axisRect()->width(),
                     perPxY = vp->yAxis->range().size() / vp->axisRect()->height();
        EXPECT_NEAR(perPxX / perPxY, 1.0, 1e-6);
        // a second snapshot replaces them (no heads left over)
        panel.setSnapshot(f.calibrated);
        settle();
        int again = 0;
        for (int k = 0; k < vp->itemCount(); ++k)
            again += vp->item(k)->objectName() == QLatin1String("arrowHead");
        EXPECT_EQ(again, static_cast<int>(tips.size()));
    }
    std::size_t measured = 0;
    for (std::size_t i = 0; i < s.result.magInst.size(); ++i)
        measured += std::isfinite(s.result.magInst[i]) && s.result.magInstErr[i] > 0;
    EXPECT_EQ(countOf(panel.plot(P::SnrVsMag), "sources"), static_cast<int>(measured));
    bool limitShown = false;
    for (int k = 0; k < panel.plot(P::SnrVsMag)->itemCount(); ++k)
        if (auto* line = qobject_cast<QCPItemStraightLine*>(panel.plot(P::SnrVsMag)->item(k));
            line && line->objectName() == QLatin1String("limitingMag")) {
            limitShown = true;
            EXPECT_NEAR(line->point1->coords().x(), z.limitingMag, 1e-9);
        }
    EXPECT_TRUE(limitShown);
    EXPECT_GT(countOf(panel.plot(P::Background), "background"), 100);
    for (int k = 0; k < PlotsPanel::kPlotCount; ++k)
        EXPECT_TRUE(panel.emptyReason(static_cast<P>(k)).isEmpty());

    // export every plot as PNG (not blank) and PDF; screenshots of the panel on each tab
    const auto dir = std::filesystem::temp_directory_path() / "gpuphot_panels_export";
    std::filesystem::create_directories(dir);
    for (int k = 0; k < PlotsPanel::kPlotCount; ++k) {
        panel.setCurrentPlot(static_cast<P>(k));
        settle();
        const QString png = QString::fromStdString((dir / ("plot" + std::to_string(k) + ".png")).string());
        const QString pdf = QString::fromStdString((dir / ("plot" + std::to_string(k) + ".pdf")).string());
        ASSERT_TRUE(panel.exportCurrent(png)) << k;
        ASSERT_TRUE(panel.exportCurrent(pdf)) << k;
        expectNotBlank(QImage(png), "export " + std::to_string(k), 16);
        QFile pf(pdf);
        ASSERT_TRUE(pf.open(QIODevice::ReadOnly));
        const QByteArray head = pf.read(5);
        EXPECT_EQ(head, QByteArray("%PDF-"));
        EXPECT_GT(pf.size(), 2000);
        save(panel, QStringLiteral("plots_%1").arg(k));
    }
    std::filesystem::remove_all(dir);
}

TEST(Panels, PlotsSayWhyTheyAreEmpty) {
    app();
    const auto& f = panelFixture();
    using P = PlotsPanel::Plot;
    PlotsPanel panel;
    panel.resize(800, 500);
    EXPECT_EQ(panel.emptyReason(P::ZeroPointVsMag),
              QStringLiteral("no result yet: open a frame (File > Open frame...)")); // says what to do
    panel.setSnapshot(f.noReference);
    for (P w : {P::ZeroPointVsMag, P::ZeroPointVsColour, P::AstrometryVsX, P::AstrometryVectors}) {
        EXPECT_EQ(panel.emptyReason(w), QStringLiteral("no reference catalog"));
        EXPECT_EQ(countOf(panel.plot(w), "used"), -1);
    }
    EXPECT_TRUE(panel.emptyReason(P::SnrVsMag).isEmpty()); // S/N needs no calibration
    panel.setSnapshot(f.noAstrometry);
    EXPECT_TRUE(panel.emptyReason(P::AstrometryVsX).startsWith(QStringLiteral("astrometry did not run")))
        << panel.emptyReason(P::AstrometryVsX).toStdString();
    EXPECT_TRUE(panel.emptyReason(P::ZeroPointVsMag).isEmpty());
    panel.show();
    panel.setCurrentPlot(P::AstrometryVsX);
    settle();
    save(panel, QStringLiteral("plots_empty_astrometry"));
    // the empty state exports too (a plot with its message)
    const QString png = QStringLiteral("/tmp/panels_export_empty.png");
    EXPECT_TRUE(panel.exportCurrent(png));
}

TEST(Panels, ClickingAPointSelectsItsSource) {
    app();
    const auto& f = panelFixture();
    PlotsPanel panel;
    panel.resize(900, 600);
    panel.show();
    panel.setSnapshot(f.calibrated);
    panel.setCurrentPlot(PlotsPanel::Plot::ZeroPointVsMag);
    settle();
    QCustomPlot* p = panel.plot(PlotsPanel::Plot::ZeroPointVsMag);
    p->replot();
    QCPGraph* used = nullptr;
    for (int g = 0; g < p->graphCount(); ++g)
        if (p->graph(g)->name() == QLatin1String("used")) used = p->graph(g);
    ASSERT_NE(used, nullptr);
    // the point nearest the middle of the used set
    const int k = used->dataCount() / 2;
    const auto point = used->data()->at(k);
    const QPointF pos(p->xAxis->coordToPixel(point->key), p->yAxis->coordToPixel(point->value));
    int selected = -2;
    QObject::connect(&panel, &PlotsPanel::sourceSelected, [&](int i) { selected = i; });
    QMouseEvent press(QEvent::MouseButtonPress, pos, p->mapToGlobal(pos), Qt::LeftButton, Qt::LeftButton,
                      Qt::NoModifier);
    QMouseEvent release(QEvent::MouseButtonRelease, pos, p->mapToGlobal(pos), Qt::LeftButton, Qt::NoButton,
                        Qt::NoModifier);
    QApplication::sendEvent(p, &press);
    QApplication::sendEvent(p, &release);
    ASSERT_GE(selected, 0);
    // the selected source's point lies where we clicked
    const Snapshot& s = *f.calibrated;
    const int ri = s.result.crossmatch.refIndex[selected];
    ASSERT_GE(ri, 0);
    EXPECT_NEAR(p->xAxis->coordToPixel(s.reference->mag[ri]), pos.x(), 5.0);
    EXPECT_EQ(panel.selectedSource(), selected);
    // and it is highlighted on the plots that show it
    EXPECT_EQ(countOf(p, "selected"), 1);
    EXPECT_GE(countOf(panel.plot(PlotsPanel::Plot::SnrVsMag), "selected"), 1);
    panel.setSelectedSource(-1);
    EXPECT_EQ(countOf(p, "selected"), 0);
}

TEST(Panels, PsfPanelShowsTheEpsfProfileAndFieldMap) {
    app();
    const auto& f = panelFixture();
    const PsfResult& psf = f.calibrated->result.psf;
    ASSERT_TRUE(psf.hasModel());
    PsfPanel panel;
    panel.resize(700, 520);
    panel.show();
    panel.setSnapshot(f.calibrated);
    settle();
    EXPECT_TRUE(panel.message().isEmpty());
    ASSERT_GE(panel.currentCell(), 0);
    const EpsfCell& cell = psf.epsf[panel.currentCell()];
    EXPECT_EQ(countOf(panel.profilePlot(), "ePSF nodes"), cell.image.width() * cell.image.height());
    EXPECT_GT(countOf(panel.profilePlot(), "Moffat model"), 10);
    EXPECT_EQ(countOf(panel.mapPlot(), "FWHM"), 48 * 48);
    int used = 0;
    for (const PsfStar& st : psf.stars)
        used += st.used;
    EXPECT_EQ(countOf(panel.mapPlot(), "PSF stars"), used);
    expectNotBlank(panel.stampImage(), "ePSF stamp");
    save(panel, QStringLiteral("psf"));
    // a source in another corner selects the ePSF cell nearest to it
    const Sources& src = f.calibrated->result.detection.sources;
    for (std::size_t i = 0; i < src.size(); i += std::max<std::size_t>(1, src.size() / 7)) {
        panel.setSelectedSource(static_cast<int>(i));
        int nearest = 0;
        for (std::size_t c = 1; c < psf.epsf.size(); ++c)
            if (std::hypot(psf.epsf[c].cx - src.x[i], psf.epsf[c].cy - src.y[i]) <
                std::hypot(psf.epsf[nearest].cx - src.x[i], psf.epsf[nearest].cy - src.y[i]))
                nearest = static_cast<int>(c);
        EXPECT_EQ(panel.currentCell(), nearest);
        EXPECT_DOUBLE_EQ(panel.positionX(), src.x[i]);
    }
    panel.setMapKind(PsfPanel::MapKind::Ellipticity);
    settle();
    EXPECT_EQ(countOf(panel.mapPlot(), "ellipticity"), 48 * 48);
    save(panel, QStringLiteral("psf_ellipticity"));
    // no model: the panel says so
    auto bare = std::make_shared<Snapshot>(*f.calibrated);
    bare->result.psf = PsfResult{};
    panel.setSnapshot(bare);
    EXPECT_FALSE(panel.message().isEmpty());
    EXPECT_EQ(panel.currentCell(), -1);
}

TEST(Panels, SourceInspectorShowsStampCurveOfGrowthAndFlags) {
    app();
    const auto& f = panelFixture();
    const Snapshot& s = *f.calibrated;
    const PipelineResult& r = s.result;
    // a PSF star (its flags include psf_star)
    int index = -1;
    for (const PsfStar& st : r.psf.stars)
        if (st.used) {
            index = st.index;
            break;
        }
    ASSERT_GE(index, 0);
    SourceInspector panel;
    panel.resize(620, 640);
    panel.show();
    panel.setSnapshot(f.calibrated);
    EXPECT_TRUE(panel.stampImage().isNull());
    panel.setSelectedSource(index);
    settle();
    expectNotBlank(panel.stampImage(), "source stamp", 32);
    EXPECT_EQ(countOf(panel.growthPlot(), "catalog apertures"), static_cast<int>(r.aperture.radii.size()));
    EXPECT_GT(countOf(panel.growthPlot(), "exact overlap, 0.25 px steps"), 10);
    EXPECT_TRUE(panel.flagsText().contains(QStringLiteral("psf_star"))) << panel.flagsText().toStdString();
    bool flagsRow = false;
    for (int k = 0; k < panel.detailsTable()->rowCount(); ++k)
        flagsRow |= panel.detailsTable()->item(k, 0)->text() == QLatin1String("flags");
    EXPECT_TRUE(flagsRow);
    // the stamp's centre pixel is bright: the source sits in the middle
    const QImage img = panel.stampImage();
    const QColor centre = img.pixelColor(img.width() / 2, img.height() / 2);
    const QColor corner = img.pixelColor(3, 3);
    EXPECT_GT(centre.lightness(), corner.lightness() + 50);
    save(panel, QStringLiteral("source_inspector"));
    panel.setStampHalfSize(30);
    EXPECT_EQ(panel.stampHalfSize(), 30);
    panel.setSelectedSource(-1);
    EXPECT_TRUE(panel.stampImage().isNull());
}

// Empty panels say what to do: open a frame first, then click a source; the PSF stamp's message wraps
// inside the stamp instead of being cut.
TEST(Panels, EmptyStatesSayWhatToDo) {
    app();
    const auto& f = panelFixture();
    const auto labelSays = [](const QWidget& w, const char* words) {
        for (const QLabel* l : w.findChildren<QLabel*>())
            if (l->text().contains(QString::fromLatin1(words))) return true;
        return false;
    };
    SourceInspector inspector;
    EXPECT_TRUE(labelSays(inspector, "Open a frame"));
    inspector.setSnapshot(f.calibrated);
    EXPECT_TRUE(labelSays(inspector, "Click a source"));
    inspector.setSelectedSource(0);
    EXPECT_FALSE(labelSays(inspector, "Click a source"));
    PsfPanel psf;
    EXPECT_TRUE(labelSays(psf, "open a frame"));
    for (const QLabel* l : psf.findChildren<QLabel*>())
        if (l->text().contains(QStringLiteral("open a frame"))) EXPECT_TRUE(l->wordWrap()) << "a cut message";
}

TEST(Panels, HeaderViewFiltersCards) {
    app();
    const auto& f = panelFixture();
    HeaderView view;
    view.resize(600, 400);
    view.show();
    view.setSnapshot(f.calibrated);
    const Header& h = f.calibrated->frame->header;
    EXPECT_EQ(view.cardCount(), static_cast<int>(h.size()));
    EXPECT_EQ(view.visibleCardCount(), static_cast<int>(h.size()));
    for (const QString filter : {QStringLiteral("crval"), QStringLiteral("SIM"), QStringLiteral("exptime")}) {
        view.setFilter(filter);
        int expected = 0;
        for (const HeaderCard& c : h.cards())
            expected += QString::fromStdString(c.key).contains(filter, Qt::CaseInsensitive) ||
                        QString::fromStdString(c.value).contains(filter, Qt::CaseInsensitive) ||
                        QString::fromStdString(c.comment).contains(filter, Qt::CaseInsensitive);
        EXPECT_EQ(view.visibleCardCount(), expected) << filter.toStdString();
        EXPECT_GT(expected, 0) << filter.toStdString();
    }
    view.setFilter(QStringLiteral("sim"));
    settle();
    save(view, QStringLiteral("header"));
}

TEST(Panels, LogPanelTimestampsLevelsAndCap) {
    app();
    LogPanel log;
    log.setMaximumLines(5);
    for (int k = 0; k < 12; ++k)
        log.append(LogLevel::Info, QStringLiteral("line %1").arg(k));
    log.append(LogLevel::Warning, QStringLiteral("careful"));
    EXPECT_EQ(log.lineCount(), 5);
    const QStringList lines = log.text().split(QLatin1Char('\n'));
    ASSERT_EQ(lines.size(), 5);
    EXPECT_TRUE(lines.front().endsWith(QStringLiteral("line 8"))) << lines.front().toStdString();
    const QRegularExpression re(QStringLiteral(R"(^\d\d:\d\d:\d\d\.\d\d\d WARN  careful$)"));
    EXPECT_TRUE(re.match(lines.back()).hasMatch()) << lines.back().toStdString();
    log.setMaximumLines(1000);
    log.clear();
    const auto& f = panelFixture();
    log.setSnapshot(f.calibrated);
    log.setSnapshot(f.calibrated); // the same run is logged once
    log.setSnapshot(f.noReference);
    EXPECT_EQ(log.text().count(QStringLiteral("run 1 (cpu")), 1);
    EXPECT_TRUE(log.text().contains(QStringLiteral("run 2")));
    log.resize(700, 200);
    log.show();
    settle();
    save(log, QStringLiteral("log"));
}
