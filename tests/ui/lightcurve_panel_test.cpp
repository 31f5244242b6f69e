// The workbench's light-curve panel driven as an observer drives it, on a simulated night (gpuphot simulate
// --series) reduced by the CLI: a click on a star gives its curve; excluding a comparison star in the
// panel's table gives the numbers `gpuphot series --exclude` gives; a frame dropped into the followed
// folder adds a point; the curve, its PNG, its periodogram and the frames' steps work.
#include <gtest/gtest.h>

#include "tests/ui/ui_test_app.hpp"

#include <QApplication>
#include <QElapsedTimer>
#include <QSignalSpy>
#include <QStatusBar>
#include <QTabWidget>
#include <QTableWidget>
#include <QTest>

#include <qcustomplot.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/io/fits_image.hpp"
#include "core/io/fits_table.hpp"
#include "core/wcs/wcs.hpp"
#include "tests/test_support.hpp"
#include "ui/lightcurve_panel.hpp"
#include "ui/main_window.hpp"
#include "viewers/image_view.hpp"

namespace fs = std::filesystem;
using gpuphot::ui::LightCurvePanel;

namespace {

int sh(const std::string& cmd) {
    return std::system(cmd.c_str());
}

std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

// 42 exposures of a 400 x 400 field 2 minutes apart with a 5 % transit of 33 minutes mid-way; the first
// 40 reduced by the CLI into FOLDER/gpuphot, where the workbench writes the catalogs of a followed
// FOLDER's frames.
constexpr int kFrames = 40;

struct Night {
    gpuphot::test::TempDir dir{"gpuphot_lc"};
    fs::path sim, folder;
    std::vector<std::string> frames, catalogs;
    std::string failure;
    Night() {
        sim = dir.path / "sim";
        folder = dir.path / "folder";
        const std::string cli = GPUPHOT_CLI;
        if (sh(cli + " simulate --series 42 --size 400x400 --stars 150 --seed 31 -o " + sim.string() +
               " --name night -q --set writeSite=true --set galaxies=0 --set magFaint=18 --series-set "
               "cadence=120" +
               " --series-set transitDuration=0.55 --series-set transitDepth=0.05 --series-set "
               "transitSnr=300") != 0) {
            failure = "simulate failed";
            return;
        }
        for (int i = 1; i <= kFrames + 2; ++i) {
            char b[32];
            std::snprintf(b, sizeof b, "night_%04d", i);
            frames.push_back((sim / (std::string(b) + ".fits")).string());
            if (i <= kFrames)
                catalogs.push_back((folder / "gpuphot" / (std::string(b) + ".cat.fits")).string());
        }
        std::string cmd = cli + " reduce";
        for (int i = 0; i < kFrames; ++i)
            cmd += " " + frames[static_cast<std::size_t>(i)];
        cmd += " --ref " + (sim / "night_0001.ref.fits").string() + " --no-tycho2 -q -o " +
               (folder / "gpuphot").string();
        if (sh(cmd) != 0) failure = "reduce failed";
    }
    QStringList catalogList() const {
        QStringList l;
        for (const auto& c : catalogs)
            l << QString::fromStdString(c);
        return l;
    }
};
const Night& night() {
    static Night n;
    return n;
}

// The brightest source of the first catalog with no other source within 12 px and away from the edges.
struct Star {
    double ra = 0, dec = 0, x = 0, y = 0;
};
Star brightIsolatedStar() {
    const gpuphot::Table t = gpuphot::readFitsTable(night().catalogs[0]);
    const auto x = t.doubles("x"), y = t.doubles("y"), f = t.doubles("flux_opt"), ra = t.doubles("ra"),
               dec = t.doubles("dec");
    long best = -1;
    for (std::size_t i = 0; i < x.size(); ++i) {
        if (x[i] < 30 || y[i] < 30 || x[i] > 370 || y[i] > 370 || !(f[i] > 0)) continue;
        bool alone = true;
        for (std::size_t j = 0; j < x.size() && alone; ++j)
            alone = j == i || std::hypot(x[j] - x[i], y[j] - y[i]) > 12.0;
        if (alone && (best < 0 || f[i] > f[static_cast<std::size_t>(best)])) best = static_cast<long>(i);
    }
    if (best < 0) return {};
    const auto b = static_cast<std::size_t>(best);
    return {ra[b], dec[b], x[b] - 1.0, y[b] - 1.0}; // catalog x, y are 1-based
}

bool waitFor(QSignalSpy& spy, int ms = 120000) {
    return !spy.isEmpty() || spy.wait(ms);
}

// The complete (not provisional) result of the frame opened, or nullptr after two minutes.
gpuphot::ui::SnapshotPtr completeSnapshot(QSignalSpy& shown) {
    QElapsedTimer t;
    t.start();
    while (t.elapsed() < 120000) {
        if (shown.isEmpty()) shown.wait(500);
        while (!shown.isEmpty()) {
            auto s = shown.takeFirst().at(0).value<gpuphot::ui::SnapshotPtr>();
            if (s && !s->provisional) return s;
        }
    }
    return nullptr;
}

#define REQUIRE_NIGHT()                                                                                      \
    gpuphot::test::uiTestApp();                                                                              \
    if (!night().failure.empty()) FAIL() << night().failure

} // namespace

TEST(LightCurvePanel, ClickOnAStarGivesItsCurve) {
    REQUIRE_NIGHT();
    gpuphot::ui::MainWindow w;
    w.resize(1300, 900);
    w.show();
    LightCurvePanel* panel = w.lightCurvePanel();
    panel->setCatalogs(night().catalogList());
    QSignalSpy shown(&w, &gpuphot::ui::MainWindow::snapshotShown);
    ASSERT_TRUE(w.openFrame(QString::fromStdString(night().frames[0]), QStringLiteral("0")));
    const gpuphot::ui::SnapshotPtr snap = completeSnapshot(shown);
    ASSERT_TRUE(snap) << "no result";
    const Star star = brightIsolatedStar();
    const auto& s = snap->result.detection.sources;
    std::size_t idx = 0;
    for (std::size_t i = 1; i < s.size(); ++i)
        if (std::hypot(s.x[i] - star.x, s.y[i] - star.y) < std::hypot(s.x[idx] - star.x, s.y[idx] - star.y))
            idx = i;
    ASSERT_LT(std::hypot(s.x[idx] - star.x, s.y[idx] - star.y), 1.0);

    QSignalSpy curve(panel, &LightCurvePanel::curveChanged);
    gpuphot::viewers::ImageView* view = w.imageView();
    view->centerOn(s.x[idx], s.y[idx]);
    view->setZoom(2.0);
    const QPointF at = view->imageToWidget({s.x[idx], s.y[idx]});
    QTest::mouseClick(view, Qt::LeftButton, {}, at.toPoint());
    ASSERT_TRUE(waitFor(curve)) << panel->statusText().toStdString();
    const gpuphot::LightCurve* c = panel->curve();
    ASSERT_NE(c, nullptr);
    EXPECT_TRUE(c->problem.empty()) << c->problem;
    EXPECT_EQ(c->name, "src" + std::to_string(idx + 1));
    EXPECT_EQ(c->relFlux.size(), std::size_t(kFrames));
    EXPECT_LT(c->rms, 0.05);
    EXPECT_GE(panel->ensembleTable()->rowCount(), 3);
    EXPECT_EQ(panel->markers().size(), c->ensemble.size() + 1);
    EXPECT_GT(panel->curvePlot()->graphCount(), 0);
    EXPECT_EQ(panel->curvePlot()->graph(0)->dataCount(), kFrames);
    panel->setBinning(3);
    EXPECT_EQ(panel->curvePlot()->graph(0)->dataCount(), (kFrames + 2) / 3);
    panel->setTimeAxis(LightCurvePanel::TimeAxis::Utc);
    EXPECT_NEAR(panel->curvePlot()->graph(0)->data()->at(0)->key,
                (c->jdUtc[0] + c->jdUtc[1] + c->jdUtc[2]) / 3.0 * 86400.0 - 2440587.5 * 86400.0, 60.0);
    gpuphot::test::TempDir out;
    EXPECT_TRUE(panel->exportPng(QString::fromStdString((out.path / "curve.png").string())));
    EXPECT_GT(fs::file_size(out.path / "curve.png"), 1000u);
    EXPECT_EQ(panel->periodogramPlot()->graphCount(), 1);

    // Stepping shows the series' frames in time order.
    QSignalSpy stepped(panel, &LightCurvePanel::frameStepped);
    panel->stepFrame(1);
    panel->stepFrame(1);
    ASSERT_EQ(stepped.count(), 2);
    EXPECT_EQ(stepped.at(1).at(0).toString().toStdString(), night().frames[1]);
}

TEST(LightCurvePanel, ExcludingAComparisonGivesTheCliCurve) {
    REQUIRE_NIGHT();
    LightCurvePanel panel;
    QSignalSpy curve(&panel, &LightCurvePanel::curveChanged);
    panel.setCatalogs(night().catalogList());
    const Star star = brightIsolatedStar();
    panel.setTarget(QStringLiteral("tgt"), star.ra, star.dec);
    ASSERT_TRUE(waitFor(curve)) << panel.statusText().toStdString();
    const std::vector<double> before = panel.curve()->relFlux;
    ASSERT_GE(panel.ensembleTable()->rowCount(), 4);

    // The observer ticks "exclude" on the first comparison star.
    QTableWidget* table = panel.ensembleTable();
    const std::size_t source = table->item(0, 0)->data(Qt::UserRole).toULongLong();
    curve.clear();
    table->item(0, 8)->setCheckState(Qt::Checked);
    ASSERT_TRUE(waitFor(curve)) << panel.statusText().toStdString();
    const gpuphot::LightCurve* c = panel.curve();
    EXPECT_EQ(panel.comparison(source), LightCurvePanel::Choice::Excluded);
    EXPECT_TRUE(std::none_of(c->ensemble.begin(), c->ensemble.end(),
                             [&](const gpuphot::EnsembleStar& e) { return e.source == source; }));
    EXPECT_NE(c->relFlux, before);

    // The CLI with the panel's targets and the same exclusion writes the same table, byte for byte.
    gpuphot::test::TempDir out;
    ASSERT_TRUE(panel.exportCurve(QString::fromStdString((out.path / "panel" / "tgt.lc.csv").string())));
    const gpuphot::TargetList& t = panel.runner()->targets();
    ASSERT_EQ(t.size(), 2u);
    {
        std::ofstream f(out.path / "targets.csv");
        f << "name,ra,dec\n";
        for (std::size_t k = 0; k < t.size(); ++k) {
            char b[128];
            std::snprintf(b, sizeof b, "%s,%.17g,%.17g\n", t.name[k].c_str(), t.ra[k], t.dec[k]);
            f << b;
        }
    }
    std::string cmd = std::string(GPUPHOT_CLI) + " series";
    for (const auto& cat : night().catalogs)
        cmd += " " + cat;
    cmd += " --targets " + (out.path / "targets.csv").string() + " --exclude " + t.name[1] +
           " --formats csv --fresh -q -o " + (out.path / "cli").string();
    ASSERT_EQ(sh(cmd), 0);
    const std::string cli = slurp(out.path / "cli" / "tgt.lc.csv"),
                      gui = slurp(out.path / "panel" / "tgt.lc.csv");
    ASSERT_FALSE(cli.empty());
    EXPECT_EQ(gui, cli);

    // Unticked: the automatic ensemble again.
    curve.clear();
    for (int r = 0; r < table->rowCount(); ++r)
        if (table->item(r, 0)->data(Qt::UserRole).toULongLong() == source)
            table->item(r, 8)->setCheckState(Qt::Unchecked);
    ASSERT_TRUE(waitFor(curve));
    EXPECT_EQ(panel.curve()->relFlux, before);
}

TEST(LightCurvePanel, ANewFrameInTheFollowedFolderAddsAPoint) {
    REQUIRE_NIGHT();
    gpuphot::ui::MainWindow w;
    w.resize(1300, 900);
    w.show();
    // A folder of its own: the night's 12 catalogs already reduced in FOLDER/gpuphot.
    gpuphot::test::TempDir d{"gpuphot_follow"};
    fs::create_directories(d.path / "gpuphot");
    for (const auto& c : night().catalogs)
        fs::copy_file(c, d.path / "gpuphot" / fs::path(c).filename());
    w.followFolder(QString::fromStdString(d.path.string()));
    LightCurvePanel* panel = w.lightCurvePanel();
    QSignalSpy curve(panel, &LightCurvePanel::curveChanged);
    const Star star = brightIsolatedStar();
    panel->setTarget(QStringLiteral("tgt"), star.ra, star.dec);
    ASSERT_TRUE(waitFor(curve)) << panel->statusText().toStdString();
    ASSERT_EQ(panel->curve()->relFlux.size(), std::size_t(kFrames));

    // The camera writes frame 13: the workbench reduces it, writes its catalog, the curve grows.
    curve.clear();
    QElapsedTimer clock;
    qint64 opened = -1, reduced = -1, written = -1;
    QObject::connect(&w, &gpuphot::ui::MainWindow::frameShown, [&] { opened = clock.elapsed(); });
    QObject::connect(&w, &gpuphot::ui::MainWindow::snapshotShown, [&](gpuphot::ui::SnapshotPtr s) {
        if (s && !s->provisional) reduced = clock.elapsed();
    });
    QObject::connect(&w, &gpuphot::ui::MainWindow::followCatalogWritten, [&] { written = clock.elapsed(); });
    clock.start();
    fs::copy_file(night().frames[kFrames], d.path / "night_0041.fits");
    qint64 latency = -1;
    for (QElapsedTimer t; latency < 0;) {
        if (!t.isValid()) t.start();
        ASSERT_LT(t.elapsed(), 120000) << panel->statusText().toStdString();
        curve.wait(200);
        if (panel->curve() && panel->curve()->relFlux.size() == kFrames + 1u) latency = clock.elapsed();
    }
    EXPECT_TRUE(fs::exists(d.path / "gpuphot" / "night_0041.cat.fits"));
    // The figure of docs/BENCHMARKS.md ("a new frame adds a point"); a benchmark, not a bar of this test.
    std::printf("new frame to new point: %lld ms (frame opened %lld, reduced %lld, catalog written %lld)\n",
                static_cast<long long>(latency), static_cast<long long>(opened),
                static_cast<long long>(reduced), static_cast<long long>(written));
    RecordProperty("latency_ms", static_cast<int>(latency));
}

TEST(LightCurvePanel, ATransitIsFoundFittedAndDrawn) {
    REQUIRE_NIGHT();
    const auto truth = nlohmann::json::parse(std::ifstream(night().sim / "night.series.json"));
    const nlohmann::json* host = nullptr;
    for (const auto& v : truth["variables"])
        if (v["kind"] == "transit") host = &v;
    ASSERT_NE(host, nullptr);
    LightCurvePanel panel;
    QSignalSpy curve(&panel, &LightCurvePanel::curveChanged);
    panel.setCatalogs(night().catalogList());
    panel.setTarget(QStringLiteral("transit"), (*host)["ra"].get<double>(), (*host)["dec"].get<double>());
    ASSERT_TRUE(waitFor(curve));
    const int graphs = panel.curvePlot()->graphCount();
    curve.clear();
    panel.setFitTransit(true);
    ASSERT_TRUE(waitFor(curve));
    const gpuphot::LightCurve* c = panel.curve();
    ASSERT_TRUE(c && c->transit.found) << panel.statusText().toStdString();
    // The truth's mid-time is UTC (MJD); the fit's is BJD_TDB: the curve's own offset between them.
    const double midBjd = truth["transit_mid_mjd"].get<double>() + 2400000.5 + (c->bjdTdb[0] - c->jdUtc[0]);
    EXPECT_NEAR(c->transit.depth, 0.05, 0.005);
    EXPECT_NEAR((c->transit.mid - midBjd) * 1440.0, 0.0, 2.0);
    EXPECT_NEAR(c->transit.duration * 24.0, 0.55, 0.1);
    EXPECT_EQ(panel.curvePlot()->graphCount(), graphs + 1) << "the fitted model is drawn";
    EXPECT_TRUE(panel.statusText().contains(QStringLiteral("transit: depth")))
        << panel.statusText().toStdString();
}

TEST(LightCurvePanel, VariablesAreFlaggedAndAClickFollowsOne) {
    REQUIRE_NIGHT();
    const auto truth = nlohmann::json::parse(std::ifstream(night().sim / "night.series.json"));
    LightCurvePanel panel;
    panel.resize(1000, 500);
    panel.show();
    QSignalSpy curve(&panel, &LightCurvePanel::curveChanged),
        vars(&panel, &LightCurvePanel::variablesChanged);
    panel.setCatalogs(night().catalogList());
    const Star star = brightIsolatedStar();
    panel.setTarget(QStringLiteral("tgt"), star.ra, star.dec);
    ASSERT_TRUE(waitFor(curve));
    // The night plot: FWHM, zero point, sky and detections of each frame.
    ASSERT_EQ(panel.nightPlot()->graphCount(), 4);
    EXPECT_EQ(panel.nightPlot()->graph(0)->dataCount(), kFrames);
    panel.findVariables();
    ASSERT_TRUE(waitFor(vars));
    const gpuphot::ui::SeriesResultPtr v = panel.variables();
    ASSERT_TRUE(v && !v->stars.empty());
    // The injected transit host is flagged.
    for (const auto& var : truth["variables"]) {
        if (var["kind"] != "transit") continue;
        const gpuphot::StarCurve* host = nullptr;
        double bestD = 1e9;
        for (const auto& sc : v->stars) {
            const auto& src = v->sources[sc.source];
            const double d = std::hypot((src.ra - var["ra"].get<double>()) * std::cos(src.dec * M_PI / 180.0),
                                        src.dec - var["dec"].get<double>()) *
                             3600.0;
            if (d < bestD) {
                bestD = d;
                host = &sc;
            }
        }
        ASSERT_TRUE(host && bestD < 1.5);
        EXPECT_TRUE(host->variable) << "J " << host->stetsonJ << " chi2 " << host->chi2;
    }
    QCustomPlot* rms = panel.variablesPlot();
    ASSERT_EQ(rms->graphCount(), 2);
    ASSERT_GE(rms->graph(1)->dataCount(), 1) << "no flagged variable drawn";
    // A click on a flagged point makes that star the target.
    panel.findChild<QTabWidget*>()->setCurrentIndex(1);
    rms->replot();
    QApplication::processEvents();
    const auto point = rms->graph(1)->data()->at(0);
    const QPoint at(static_cast<int>(rms->xAxis->coordToPixel(point->key)),
                    static_cast<int>(rms->yAxis->coordToPixel(point->value)));
    QSignalSpy chosen(&panel, &LightCurvePanel::starChosen);
    curve.clear();
    QTest::mouseClick(rms, Qt::LeftButton, {}, at);
    ASSERT_EQ(chosen.count(), 1);
    ASSERT_TRUE(waitFor(curve));
    EXPECT_NE(panel.curve()->name, "tgt");
}

TEST(LightCurvePanel, SteppingShowsTheSeriesFramesAlignedByWcs) {
    REQUIRE_NIGHT();
    gpuphot::ui::MainWindow w;
    w.resize(1300, 900);
    w.show();
    LightCurvePanel* panel = w.lightCurvePanel();
    QSignalSpy curve(panel, &LightCurvePanel::curveChanged);
    panel->setCatalogs(night().catalogList());
    const Star star = brightIsolatedStar();
    panel->setTarget(QStringLiteral("tgt"), star.ra, star.dec);
    ASSERT_TRUE(waitFor(curve));
    QSignalSpy shown(&w, &gpuphot::ui::MainWindow::snapshotShown);
    ASSERT_TRUE(w.openFrame(QString::fromStdString(night().frames[0]), QStringLiteral("0")));
    ASSERT_TRUE(completeSnapshot(shown));
    QTest::qWait(50);
    gpuphot::viewers::ImageView* view = w.imageView();
    view->centerOn(star.x + 3.0, star.y - 2.0);
    const QPointF c0 = view->center();
    const auto limits = view->limits();
    const gpuphot::Frame f0 = gpuphot::readFrame(night().frames[0]),
                         f1 = gpuphot::readFrame(night().frames[1]);
    const auto [ra, dec] = f0.wcs->pixelToWorld(c0.x(), c0.y());
    const auto [x1, y1] = f1.wcs->worldToPixel(ra, dec);

    panel->stepFrame(2); // from the start: the second frame of the series
    for (QElapsedTimer t; !w.statusBar()->currentMessage().contains(QStringLiteral("series frame"));) {
        if (!t.isValid()) t.start();
        ASSERT_LT(t.elapsed(), 30000) << "the stepped frame never showed";
        QTest::qWait(20);
    }
    EXPECT_EQ(panel->currentFrame(), 1);
    EXPECT_NEAR(view->center().x(), x1, 1e-6);
    EXPECT_NEAR(view->center().y(), y1, 1e-6);
    EXPECT_GT(std::hypot(x1 - c0.x(), y1 - c0.y()), 0.05)
        << "the frames share their pointing: nothing tested";
    EXPECT_EQ(view->limits(), limits);
}
