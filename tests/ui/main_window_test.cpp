// The workbench's main window end to end: open a simulated frame with its reference catalog, let the
// worker reduce it, and check what the user sees: title, catalog table, overlays drawn where the catalog
// says, a cursor readout, exports, errors as messages (never a crash). The screenshot is kept in the
// build directory (docs/ shows one made by `gpuphot-studio --screenshot`).
#include <gtest/gtest.h>

#include "tests/ui/ui_test_app.hpp"

#include <QApplication>
#include <QCheckBox>
#include <QDockWidget>
#include <QDoubleSpinBox>
#include <QElapsedTimer>
#include <QHeaderView>
#include <QImage>
#include <QLabel>
#include <QLineEdit>
#include <QMenu>
#include <QMenuBar>
#include <QMessageBox>
#include <QSignalSpy>
#include <QSortFilterProxyModel>
#include <QStatusBar>
#include <QTableView>
#include <QTableWidget>
#include <QTest>
#include <cmath>
#include <filesystem>
#include <qcustomplot.h>

#include "core/db/results_store.hpp"
#include "core/io/fits_table.hpp"
#include "core/sim/simulator.hpp"
#include "tests/test_support.hpp"
#include "ui/catalog_model.hpp"
#include "ui/log_panel.hpp"
#include "ui/main_window.hpp"
#include "ui/param_dock.hpp"
#include "ui/pipeline_worker.hpp"
#include "ui/plots_panel.hpp"
#include "ui/source_inspector.hpp"
#include "viewers/image_view.hpp"

namespace {
QApplication& app() {
    return gpuphot::test::uiTestApp();
}

// A 512^2 field with a few hundred stars, header WCS and reference catalog, written once.
struct Field {
    gpuphot::test::TempDir dir;
    std::string frame, ref;
    Field() {
        gpuphot::SimParams p;
        p.width = 512;
        p.height = 512;
        p.stars = 250;
        p.seed = 11;
        p.galaxies = 0;
        p.clusters = 0;
        p.refMagLimit = 19.0;
        const gpuphot::SimResult r = gpuphot::simulateField(p);
        gpuphot::writeSimulation(r, dir.path.string(), "field", -32);
        frame = (dir.path / "field.fits").string();
        ref = (dir.path / "field.ref.fits").string();
    }
};
const Field& field() {
    static Field f;
    return f;
}

// Waits for a snapshot with (or without) calibration.
gpuphot::ui::SnapshotPtr waitForSnapshot(QSignalSpy& spy, bool wantReference, int timeoutMs = 120000) {
    QElapsedTimer t;
    t.start();
    while (t.elapsed() < timeoutMs) {
        if (spy.isEmpty()) spy.wait(500);
        while (!spy.isEmpty()) {
            auto s = spy.takeFirst().at(0).value<gpuphot::ui::SnapshotPtr>();
            if (s && (!wantReference || s->reference)) return s;
        }
    }
    return nullptr;
}
// The field opened in `w` with its reference catalog: the first calibrated result, or null.
gpuphot::ui::SnapshotPtr reduceWithReference(gpuphot::ui::MainWindow& w, const Field& f) {
    QSignalSpy shown(&w, &gpuphot::ui::MainWindow::snapshotShown);
    if (!w.openFrame(QString::fromStdString(f.frame))) return nullptr;
    w.openReference(QString::fromStdString(f.ref));
    return waitForSnapshot(shown, true);
}
} // namespace

TEST(MainWindow, ReducesAFrameAndShowsItsCatalogAndOverlays) {
    app();
    const Field& f = field();
    gpuphot::ui::MainWindow w;
    w.resize(1400, 900);
    w.show();
    QSignalSpy shown(&w, &gpuphot::ui::MainWindow::snapshotShown);
    ASSERT_TRUE(w.openFrame(QString::fromStdString(f.frame)));
    w.openReference(QString::fromStdString(f.ref));
    const gpuphot::ui::SnapshotPtr snap = waitForSnapshot(shown, true);
    ASSERT_TRUE(snap) << "no calibrated result within the timeout";
    const std::size_t n = snap->result.detection.sources.size();
    ASSERT_GT(n, 100u);
    EXPECT_TRUE(w.windowTitle().contains(QStringLiteral("512 x 512"))) << w.windowTitle().toStdString();
    auto* table = w.findChild<QTableView*>(QStringLiteral("CatalogTable"));
    ASSERT_NE(table, nullptr);
    EXPECT_EQ(static_cast<std::size_t>(table->model()->rowCount()), n);
    EXPECT_TRUE(snap->result.zeropoint.ok) << snap->result.calibrationProblem;
    // The status line leads with the source count and the total time (a narrow window cuts its end: the
    // per-stage times); its tooltip holds the whole line.
    const QString times = w.statusTimesText();
    const qsizetype at = times.indexOf(QStringLiteral(" sources")),
                    total = times.indexOf(QStringLiteral("total "));
    EXPECT_TRUE(times.contains(QString::number(n) + QStringLiteral(" sources"))) << times.toStdString();
    EXPECT_GT(total, at) << times.toStdString();
    EXPECT_GT(times.indexOf(QStringLiteral("detection ")), total) << times.toStdString();

    // The cursor readout is 1-based and has RA/Dec from the WCS.
    gpuphot::viewers::ImageView* view = w.imageView();
    const QPointF centre = view->imageToWidget(QPointF(99.0, 199.0));
    QTest::mouseMove(view, centre.toPoint());
    QApplication::processEvents();
    const QString readout = w.cursorReadout();
    if (!readout.isEmpty()) { // offscreen platforms may not deliver the move
        EXPECT_TRUE(readout.contains(QStringLiteral("RA"))) << readout.toStdString();
    }

    // Exports write what buildCatalog makes.
    gpuphot::test::TempDir out;
    const QString cat = QString::fromStdString((out.path / "x.cat.fits").string());
    ASSERT_TRUE(w.exportCatalog(cat));
    EXPECT_EQ(gpuphot::readFitsTable(cat.toStdString()).rows(), n);
    EXPECT_TRUE(w.exportRegions(QString::fromStdString((out.path / "x.reg").string())));
    // File > Save to database: the frame and every catalog row; saved again, replaced.
    const std::string dbPath = (out.path / "db/night.sqlite").string();
    ASSERT_TRUE(w.saveToDatabase(QString::fromStdString(dbPath)));
    ASSERT_TRUE(w.saveToDatabase(QString::fromStdString(dbPath)));
    {
        auto store = gpuphot::openResultsStore(dbPath);
        const gpuphot::Table frames = store->frames({});
        ASSERT_EQ(frames.rows(), 1u);
        EXPECT_EQ(static_cast<std::size_t>(frames.at("sources").as<std::int64_t>()[0]), n);
        EXPECT_EQ(store->cone(0.0, 0.0, 648000.0).rows(), n);
    }
    EXPECT_EQ(w.exportWcs(QString::fromStdString((out.path / "x.wcs").string())),
              static_cast<bool>(snap->result.fittedWcs));

    // Screenshot: not blank, and the source ellipses are drawn where the catalog puts the sources.
    if (!view->glFailure().isEmpty()) GTEST_SKIP() << "no working GL: " << view->glFailure().toStdString();
    view->setLayerVisible(gpuphot::viewers::Layer::PsfWhiskers, false);
    view->setLayerVisible(gpuphot::viewers::Layer::ReferenceStars, false);
    view->setOverviewVisible(false); // the inset covers the sources of the lower-right corner
    view->zoomToFit();
    const QImage img = view->grabFramebuffer();
    ASSERT_FALSE(img.isNull());
    const std::string png = std::string(GPUPHOT_BUILD_DIR) + "/studio_main_window.png";
    w.grab().save(QString::fromStdString(png));
    double sum = 0, sum2 = 0;
    for (int y = 0; y < img.height(); y += 4)
        for (int x = 0; x < img.width(); x += 4) {
            const double g = qGray(img.pixel(x, y));
            sum += g;
            sum2 += g * g;
        }
    const double cnt = (img.height() / 4.0) * (img.width() / 4.0);
    EXPECT_GT(std::sqrt(sum2 / cnt - (sum / cnt) * (sum / cnt)), 5.0) << "the view looks blank";
    // Count sources (unflagged, isolated enough to be visible) with green (the source colour) within
    // their drawn ellipse's ring, against random positions.
    const double dpr = view->devicePixelRatioF();
    auto greenNear = [&](double ix, double iy, double radiusPx) {
        const QPointF c = view->imageToWidget(QPointF(ix, iy)) * dpr;
        for (int k = 0; k < 64; ++k) {
            for (double rr = 0.5 * radiusPx; rr <= radiusPx * 1.5 + 2; rr += 1.0) {
                const double a = k * 2 * M_PI / 64;
                const int px = static_cast<int>(c.x() + rr * std::cos(a)),
                          py = static_cast<int>(c.y() + rr * std::sin(a));
                if (px < 0 || py < 0 || px >= img.width() || py >= img.height()) continue;
                const QRgb p = img.pixel(px, py);
                if (qGreen(p) > 180 && qRed(p) < 80 && qBlue(p) < 80) return true;
            }
        }
        return false;
    };
    const auto& s = snap->result.detection.sources;
    int tested = 0, hit = 0;
    for (std::size_t i = 0; i < n; ++i) {
        if (s.flags[i] != 0) continue;
        const double r = 3.0 * s.a[i] * view->zoom() * dpr;
        ++tested;
        hit += greenNear(s.x[i], s.y[i], std::max(r, 2.0)) ? 1 : 0;
    }
    ASSERT_GT(tested, 50);
    EXPECT_GT(hit, 0.9 * tested) << hit << " of " << tested << " sources show their ellipse";
    // Control: the same test at positions shifted far from any source finds green much less often.
    int ctlHit = 0, ctl = 0;
    for (int k = 0; k < 200; ++k) {
        const double x = 20 + (k * 37) % 470, y = 20 + (k * 91) % 470;
        bool near = false;
        for (std::size_t i = 0; i < n && !near; ++i)
            near = std::hypot(s.x[i] - x, s.y[i] - y) < 12.0 + 3.0 * s.a[i];
        if (near) continue;
        ++ctl;
        ctlHit += greenNear(x, y, 3.0 * view->zoom() * dpr) ? 1 : 0;
    }
    if (ctl > 10)
        EXPECT_LT(ctlHit, 0.5 * ctl) << ctlHit << " of " << ctl << " empty positions look like sources";
}

TEST(MainWindow, BadFileShowsTheErrorAndKeepsRunning) {
    app();
    gpuphot::ui::MainWindow w;
    QSignalSpy errors(&w, &gpuphot::ui::MainWindow::errorShown);
    EXPECT_FALSE(w.openFrame(QStringLiteral("/nonexistent/frame.fits")));
    ASSERT_EQ(errors.size(), 1);
    EXPECT_TRUE(errors.at(0).at(0).toString().contains(QStringLiteral("/nonexistent/frame.fits")));
    EXPECT_TRUE(w.statusBar()->currentMessage().contains(QStringLiteral("/nonexistent/frame.fits")));
    auto* box = w.findChild<QMessageBox*>();
    ASSERT_NE(box, nullptr);
    EXPECT_FALSE(box->isModal()); // never blocks a night-long session
    // A text file is refused with a message as well.
    gpuphot::test::TempDir d;
    const auto p = d.path / "notes.fits";
    std::FILE* fp = std::fopen(p.c_str(), "w");
    std::fputs("not a FITS file\n", fp);
    std::fclose(fp);
    EXPECT_FALSE(w.openFrame(QString::fromStdString(p.string())));
    EXPECT_EQ(errors.size(), 2);
}

// The table and the image pick the same source whatever the table's sort column, order and filter.
TEST(MainWindow, TableAndImageLinkTheSameSourceUnderEverySort) {
    app();
    const Field& f = field();
    gpuphot::ui::MainWindow w;
    w.resize(1400, 900);
    w.show();
    QSignalSpy shown(&w, &gpuphot::ui::MainWindow::snapshotShown);
    ASSERT_TRUE(w.openFrame(QString::fromStdString(f.frame)));
    const gpuphot::ui::SnapshotPtr snap = waitForSnapshot(shown, false);
    ASSERT_TRUE(snap);
    auto* table = w.findChild<QTableView*>(QStringLiteral("CatalogTable"));
    ASSERT_NE(table, nullptr);
    auto* model = w.findChild<gpuphot::ui::CatalogModel*>();
    ASSERT_NE(model, nullptr);
    EXPECT_EQ(table->horizontalHeader()->sortIndicatorOrder(), Qt::AscendingOrder);
    EXPECT_EQ(model->sourceIndex(0), 0) << "opens with ids ascending";
    // The Instrument section says what the header gave, not just "header".
    const auto* gain = qobject_cast<QDoubleSpinBox*>(w.paramDock()->editorFor("instrument.gain"));
    ASSERT_NE(gain, nullptr);
    EXPECT_TRUE(gain->text().startsWith(QStringLiteral("header: "))) << gain->text().toStdString();
    EXPECT_NE(gain->text(), QStringLiteral("header: none")) << "the simulated frame has a GAIN";
    gpuphot::viewers::ImageView* view = w.imageView();
    const auto& src = snap->result.detection.sources;
    const int columns = table->model()->columnCount();
    QLineEdit* filter = nullptr;
    for (auto* e : w.findChildren<QLineEdit*>())
        if (e->placeholderText().startsWith(QStringLiteral("filter"))) filter = e;
    ASSERT_NE(filter, nullptr);
    for (const QString& text : {QString(), QStringLiteral("1")})
        for (int column : {0, 1, 5, columns - 2})
            for (Qt::SortOrder order : {Qt::AscendingOrder, Qt::DescendingOrder}) {
                filter->setText(text); // "1": ids starting with 1 only
                table->sortByColumn(column, order);
                QApplication::processEvents();
                for (int row : {0, 3, table->model()->rowCount() / 2}) {
                    const QModelIndex at = table->model()->index(row, 0);
                    table->selectionModel()->setCurrentIndex(at, QItemSelectionModel::ClearAndSelect |
                                                                     QItemSelectionModel::Rows);
                    const int source = model->sourceIndex(
                        qobject_cast<QSortFilterProxyModel*>(table->model())->mapToSource(at).row());
                    EXPECT_EQ(view->selectedSource(), source)
                        << "column " << column << " order " << order << " row " << row;
                    // The table's id column shows that source's id.
                    EXPECT_EQ(table->model()->index(row, 0).data().toInt(), source + 1);
                }
                // Image to table: a click on a source selects its row.
                const int k =
                    text.isEmpty() ? static_cast<int>(src.size() / 3) : 9; // id 10 passes the filter
                view->setZoom(2.0);
                view->centerOn(src.x[static_cast<std::size_t>(k)], src.y[static_cast<std::size_t>(k)]);
                QTest::mouseClick(view, Qt::LeftButton, {},
                                  view->imageToWidget({src.x[static_cast<std::size_t>(k)],
                                                       src.y[static_cast<std::size_t>(k)]})
                                      .toPoint());
                const QModelIndex cur = table->selectionModel()->currentIndex();
                ASSERT_TRUE(cur.isValid());
                EXPECT_EQ(table->model()->index(cur.row(), 0).data().toInt(), view->selectedSource() + 1);
            }
}

// The overview inset covers the image's lower-right corner: Display, layers turns it off and on.
TEST(MainWindow, OverviewInsetCanBeHidden) {
    app();
    gpuphot::ui::MainWindow w;
    auto* toggle = w.findChild<QCheckBox*>(QStringLiteral("OverviewToggle"));
    ASSERT_NE(toggle, nullptr);
    EXPECT_TRUE(w.imageView()->overviewVisible());
    toggle->setChecked(false);
    EXPECT_FALSE(w.imageView()->overviewVisible());
    toggle->setChecked(true);
    EXPECT_TRUE(w.imageView()->overviewVisible());
}

// The plots, PSF and source panels take a result only while their dock is shown (so an edit's overlays
// never wait for them): a hidden panel gets it when its dock is raised, and before a selection refers to
// the result.
TEST(MainWindow, HiddenPanelsTakeTheResultWhenShownOrWhenASourceIsSelected) {
    app();
    const Field& f = field();
    gpuphot::ui::MainWindow w;
    w.resize(1400, 900);
    w.show();
    auto* plotsDock = w.findChild<QDockWidget*>(QStringLiteral("PlotsDock"));
    auto* catalogDock = w.findChild<QDockWidget*>(QStringLiteral("CatalogDock"));
    auto* displayDock = w.findChild<QDockWidget*>(QStringLiteral("DisplayDock"));
    auto* plots = w.findChild<gpuphot::ui::PlotsPanel*>();
    auto* inspector = w.findChild<gpuphot::ui::SourceInspector*>();
    ASSERT_TRUE(plotsDock && catalogDock && displayDock && plots && inspector);
    auto* sourceDock = w.findChild<QDockWidget*>(QStringLiteral("SourceDock"));
    ASSERT_NE(sourceDock, nullptr);
    // The plots and the source panel behind other tabs, whatever layout the settings restored.
    for (QDockWidget* d : {catalogDock, plotsDock, displayDock, sourceDock}) {
        d->setFloating(false);
        d->show();
    }
    w.tabifyDockWidget(catalogDock, plotsDock);
    w.tabifyDockWidget(displayDock, sourceDock);
    catalogDock->raise();
    displayDock->raise();
    ASSERT_TRUE(QTest::qWaitForWindowExposed(&w));
    QApplication::processEvents();
    ASSERT_TRUE(plotsDock->visibleRegion().isEmpty()) << "the plots are not behind the catalog";
    const gpuphot::ui::SnapshotPtr snap = reduceWithReference(w, f);
    ASSERT_TRUE(snap && snap->result.zeropoint.ok);
    QApplication::processEvents();
    using Plot = gpuphot::ui::PlotsPanel::Plot;
    EXPECT_TRUE(plots->emptyReason(Plot::ZeroPointVsMag).startsWith(QStringLiteral("no result yet")))
        << "a hidden panel was drawn";
    plotsDock->raise();
    for (QElapsedTimer t; !plots->emptyReason(Plot::ZeroPointVsMag).isEmpty();) {
        if (!t.isValid()) t.start();
        ASSERT_LT(t.elapsed(), 5000) << "the raised plots never showed the result: "
                                     << plots->emptyReason(Plot::ZeroPointVsMag).toStdString();
        QTest::qWait(10);
    }
    EXPECT_GE(plots->plot(Plot::ZeroPointVsMag)->graphCount(), 2);
    // The source panel is still hidden: a row selected in the table is that result's source there.
    catalogDock->raise();
    auto* table = w.findChild<QTableView*>(QStringLiteral("CatalogTable"));
    ASSERT_NE(table, nullptr);
    const QModelIndex row = table->model()->index(5, 0);
    table->selectionModel()->setCurrentIndex(row,
                                             QItemSelectionModel::ClearAndSelect | QItemSelectionModel::Rows);
    const int id = row.data().toInt();
    EXPECT_EQ(inspector->selectedSource(), id - 1);
    EXPECT_GT(inspector->detailsTable()->rowCount(), 0)
        << "the inspector has no result to show the source from";
}

// Menus added by the window's parts (Region, Light curves) go before Help, which stays last.
TEST(MainWindow, HelpIsTheLastMenu) {
    app();
    gpuphot::ui::MainWindow w;
    QStringList titles;
    for (QAction* a : w.menuBar()->actions())
        if (a->menu()) titles << a->menu()->title().remove(QLatin1Char('&'));
    ASSERT_FALSE(titles.isEmpty());
    EXPECT_EQ(titles.back(), QStringLiteral("Help")) << titles.join(QStringLiteral(", ")).toStdString();
    EXPECT_TRUE(titles.contains(QStringLiteral("Region")));
    EXPECT_TRUE(titles.contains(QStringLiteral("Light curves")));
}

// Exports: a name without a suffix gets the export's own, a missing folder is made, and the status bar
// says what was written where.
TEST(MainWindow, ExportsAddTheirSuffixMakeTheirFolderAndSayWhatTheyWrote) {
    app();
    const Field& f = field();
    gpuphot::ui::MainWindow w;
    w.resize(1200, 800);
    w.show();
    const gpuphot::ui::SnapshotPtr snap = reduceWithReference(w, f);
    ASSERT_TRUE(snap && snap->result.fittedWcs);
    gpuphot::test::TempDir out;
    const std::filesystem::path dir = out.path / "new" / "folder";
    ASSERT_TRUE(w.exportCatalog(QString::fromStdString((dir / "night").string())));
    EXPECT_TRUE(std::filesystem::exists(dir / "night.fits"));
    EXPECT_EQ(gpuphot::readFitsTable((dir / "night.fits").string()).rows(),
              snap->result.detection.sources.size());
    EXPECT_TRUE(w.statusBar()->currentMessage().startsWith(QStringLiteral("wrote catalog (")))
        << w.statusBar()->currentMessage().toStdString();
    EXPECT_TRUE(w.statusBar()->currentMessage().contains(QStringLiteral("night.fits")));
    ASSERT_TRUE(w.exportCatalog(QString::fromStdString((dir / "night.csv").string())));
    EXPECT_TRUE(std::filesystem::exists(dir / "night.csv"));
    EXPECT_FALSE(std::filesystem::exists(dir / "night.csv.fits"));
    ASSERT_TRUE(w.exportRegions(QString::fromStdString((dir / "sources").string())));
    EXPECT_TRUE(std::filesystem::exists(dir / "sources.reg"));
    ASSERT_TRUE(w.exportWcs(QString::fromStdString((dir / "fit").string())));
    EXPECT_TRUE(std::filesystem::exists(dir / "fit.wcs"));
    ASSERT_TRUE(w.saveViewPng(QString::fromStdString((dir / "view").string())));
    EXPECT_TRUE(std::filesystem::exists(dir / "view.png"));
    EXPECT_TRUE(w.statusBar()->currentMessage().startsWith(QStringLiteral("wrote view (")));
}

// The log records each run (its number, sources, times) and each parameter change a run was asked for;
// the table's columns are sized to their content once the frame's first result is shown.
TEST(MainWindow, LogRecordsRunsAndParameterChanges) {
    app();
    const Field& f = field();
    gpuphot::ui::MainWindow w;
    w.resize(1200, 800);
    w.show();
    QSignalSpy shown(&w, &gpuphot::ui::MainWindow::snapshotShown);
    ASSERT_TRUE(w.openFrame(QString::fromStdString(f.frame)));
    const gpuphot::ui::SnapshotPtr first = waitForSnapshot(shown, false);
    ASSERT_TRUE(first);
    auto* log = w.findChild<gpuphot::ui::LogPanel*>();
    ASSERT_NE(log, nullptr);
    EXPECT_TRUE(log->text().contains(QStringLiteral("run %1 (").arg(first->generation)))
        << log->text().toStdString();
    auto* table = w.findChild<QTableView*>(QStringLiteral("CatalogTable"));
    ASSERT_NE(table, nullptr);
    const int raCol = 3; // "ra": wider than the default 78 px once sized to its content
    EXPECT_EQ(table->model()->headerData(raCol, Qt::Horizontal).toString(), QStringLiteral("ra"));
    EXPECT_GE(table->columnWidth(raCol), table->fontMetrics().horizontalAdvance(QStringLiteral("150.000000")))
        << "the column cuts its numbers";
    auto* spin = qobject_cast<QDoubleSpinBox*>(w.paramDock()->editorFor("detection.threshold"));
    ASSERT_NE(spin, nullptr);
    const double before = spin->value();
    shown.clear();
    spin->setValue(before + 0.7);
    gpuphot::ui::SnapshotPtr after;
    for (QElapsedTimer t; !after || after->provisional;) {
        if (!t.isValid()) t.start();
        ASSERT_LT(t.elapsed(), 120000);
        after = waitForSnapshot(shown, false, 2000);
    }
    const QString text = log->text();
    EXPECT_TRUE(text.contains(
        QStringLiteral("parameters: detection.threshold: %1 -> %2").arg(before).arg(before + 0.7)))
        << text.toStdString();
    EXPECT_TRUE(text.contains(QStringLiteral("run %1 (").arg(after->generation)));
}

// An empty workbench says what to do in the middle of the view; the first frame takes its place.
TEST(MainWindow, EmptyViewSaysHowToOpenAFrame) {
    app();
    gpuphot::ui::MainWindow w;
    w.resize(1000, 700);
    w.show();
    QApplication::processEvents();
    auto* hint = w.findChild<QLabel*>(QStringLiteral("EmptyViewHint"));
    ASSERT_NE(hint, nullptr);
    EXPECT_TRUE(hint->isVisible());
    EXPECT_TRUE(hint->text().contains(QStringLiteral("Open frame")));
    EXPECT_EQ(hint->geometry(), w.imageView()->rect()) << "not over the whole view";
    const gpuphot::ui::SnapshotPtr snap = reduceWithReference(w, field());
    ASSERT_TRUE(snap);
    EXPECT_FALSE(hint->isVisible());
}

// Raising another tab of a dock area keeps the area's size: the left docks' width and the bottom docks'
// height stay where the user put them whichever panel is shown.
TEST(MainWindow, DocksKeepTheirSizeWhenAnotherTabIsRaised) {
    app();
    const Field& f = field();
    gpuphot::ui::MainWindow w;
    w.resize(1400, 900);
    w.show();
    ASSERT_TRUE(reduceWithReference(w, f));
    const auto dockNamed = [&](const char* name) {
        auto* d = w.findChild<QDockWidget*>(QString::fromLatin1(name));
        EXPECT_NE(d, nullptr) << name;
        return d;
    };
    const auto sizesOnRaise = [&](std::initializer_list<const char*> names, Qt::Orientation o, int set) {
        QDockWidget* first = dockNamed(*names.begin());
        first->raise();
        w.resizeDocks({first}, {set}, o);
        QTest::qWait(50);
        std::vector<int> sizes;
        for (int round = 0; round < 2; ++round)
            for (const char* name : names) {
                QDockWidget* d = dockNamed(name);
                d->raise();
                QTest::qWait(50);
                sizes.push_back(o == Qt::Horizontal ? d->width() : d->height());
            }
        return sizes;
    };
    const std::vector<int> left = sizesOnRaise({"DisplayDock", "PsfDock", "SourceDock"}, Qt::Horizontal, 260);
    for (std::size_t k = 0; k < left.size(); ++k)
        EXPECT_EQ(left[k], left[0]) << "left tab " << k % 3;
    const std::vector<int> bottom =
        sizesOnRaise({"CatalogDock", "PlotsDock", "HeaderDock", "LogDock", "HistoryDock", "LightCurveDock"},
                     Qt::Vertical, 240);
    for (std::size_t k = 0; k < bottom.size(); ++k)
        EXPECT_EQ(bottom[k], bottom[0]) << "bottom tab " << k % 6;
}
