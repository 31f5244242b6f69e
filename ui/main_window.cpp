#include "ui/main_window.hpp"
#include "ui/file_names.hpp"

#include <QAction>
#include <QApplication>
#include <QClipboard>
#include <QCloseEvent>
#include <QDesktopServices>
#include <QDialog>
#include <QDialogButtonBox>
#include <QDir>
#include <QDockWidget>
#include <QDragEnterEvent>
#include <QDropEvent>
#include <QFile>
#include <QFileDialog>
#include <QFileInfo>
#include <QHeaderView>
#include <QInputDialog>
#include <QLabel>
#include <QLineEdit>
#include <QMenuBar>
#include <QMessageBox>
#include <QMimeData>
#include <QProgressBar>
#include <QSettings>
#include <QStandardPaths>
#include <QStatusBar>
#include <QStyle>
#include <QTableView>
#include <QTableWidget>
#include <QThread>
#include <QTime>
#include <QTimer>
#include <QUrl>
#include <QVBoxLayout>
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/catalog/table.hpp"
#include "core/db/db_writer.hpp"
#include "core/db/results_store.hpp"
#include "core/io/ds9_regions.hpp"
#include "core/io/fits_image.hpp"
#include "core/io/fits_table.hpp"
#include "core/io/text_catalog.hpp"
#include "core/pipeline/catalog_builder.hpp"
#include "core/pipeline/device_registry.hpp"
#include "core/pipeline/report.hpp"
#include "core/sim/sim_params.hpp"
#include "core/sim/simulator.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/wcs.hpp"
#include "ui/catalog_model.hpp"
#include "ui/display_controls.hpp"
#include "ui/elided_label.hpp"
#include "ui/folder_follower.hpp"
#include "ui/header_view.hpp"
#include "ui/lightcurve_panel.hpp"
#include "ui/log_panel.hpp"
#include "ui/mosaic_panel.hpp"
#include "ui/overlay_builder.hpp"
#include "ui/param_dock.hpp"
#include "ui/pipeline_worker.hpp"
#include "ui/plots_panel.hpp"
#include "ui/psf_panel.hpp"
#include "ui/readout.hpp"
#include "ui/run_scheduler.hpp"
#include "ui/scrollable.hpp"
#include "ui/source_inspector.hpp"
#include "viewers/image_view.hpp"

static void initUiResources() {
    Q_INIT_RESOURCE(demo);
}

namespace gpuphot::ui {

namespace {
constexpr int kMaxRecent = 10;

constexpr int kProgressDelayMs = 400; // a run shows its progress once it has lasted this long

QDockWidget* dock(QMainWindow* w, const QString& title, const QString& name, QWidget* content,
                  Qt::DockWidgetArea area) {
    auto* d = new QDockWidget(title, w);
    d->setObjectName(name);
    d->setWidget(content);
    w->addDockWidget(area, d);
    return d;
}

QString stageTimes(const Snapshot& s) {
    QStringList parts;
    double total = 0.0;
    for (const StageRecord& r : s.timings) {
        parts << QStringLiteral("%1 %2 ms")
                     .arg(QString::fromStdString(r.stage))
                     .arg(r.seconds * 1e3, 0, 'f', 0);
        total += r.seconds;
    }
    if (s.prefetched) parts << QStringLiteral("computed ahead");
    if (s.provisional) // the first look of a re-detection: the complete result follows
        return QStringLiteral(
                   "#%1  %2 sources  |  %4 ms  |  PROVISIONAL: new detection + apertures, PSF model and "
                   "calibration measured with the previous run's PSF; PSF fits running...  |  %3")
            .arg(s.generation)
            .arg(s.result.detection.sources.size())
            .arg(parts.join(QStringLiteral(", ")))
            .arg(total * 1e3, 0, 'f', 0);
    if (s.psfFitsReused > 0) // star fits the worker's PSF cache supplied (identical inputs, identical result)
        parts << QStringLiteral("%1/%2 PSF fits reused")
                     .arg(s.psfFitsReused)
                     .arg(s.psfFitsReused + s.psfFitsMade);
    // The count and the total first: a window too narrow for the whole line cuts the per-stage times only.
    return QStringLiteral("#%1  %2 sources  |  total %4 ms (%5)  |  %3")
        .arg(s.generation)
        .arg(s.result.detection.sources.size())
        .arg(parts.join(QStringLiteral(", ")))
        .arg(total * 1e3, 0, 'f', 0)
        .arg(QString::fromStdString(s.backend));
}
} // namespace

MainWindow::MainWindow(QWidget* parent) : QMainWindow(parent) {
    initUiResources();
    registerWorkerMetaTypes();
    setWindowTitle(QStringLiteral("GPUPHOT Studio"));
    setAcceptDrops(true);
    setObjectName(QStringLiteral("MainWindow"));

    m_thread = std::make_unique<PipelineWorkerThread>();
    m_scheduler = new RunScheduler(m_thread->worker(), this);
    // While idle, the worker precomputes the detection threshold one spin-box step (0.1 sigma, the
    // parameter dock's step) either way: the most common next edit then lands at once.
    m_thread->worker()->setThresholdPrefetch(0.1);
    // A re-detection shows its sources, apertures and table first, the PSF-dependent numbers when they land.
    m_thread->worker()->setProvisionalResults(true);

    m_view = new viewers::ImageView(this);
    setCentralWidget(m_view);
    buildEmptyHint();

    buildDocks();
    buildMosaicDock();
    buildMenus();
    buildLightCurveDock();
    buildRegions();
    buildViewTools();

    m_readout = new QLabel(this);
    m_readout->setMinimumWidth(420);
    m_times = new ElidedLabel(this); // ends with "…" where the window is too narrow for the whole line
    m_times->setObjectName(QStringLiteral("StageTimes"));
    m_backend = new QLabel(this);
    m_calibLabel = new QLabel(this);
    m_calibLabel->setObjectName(QStringLiteral("CalibrationLabel"));
    m_progress = new QProgressBar(this);
    m_progress->setRange(0, 100);
    m_progress->setMaximumWidth(160);
    m_progress->setVisible(false);
    statusBar()->addWidget(m_readout);
    statusBar()->addWidget(m_times, 1);
    m_followLabel = new QLabel(this); // "following DIR" while a folder is followed: always in view
    m_followLabel->setObjectName(QStringLiteral("FollowLabel"));
    m_followLabel->setVisible(false);
    statusBar()->addPermanentWidget(m_progress);
    statusBar()->addPermanentWidget(m_followLabel);
    statusBar()->addPermanentWidget(m_calibLabel);
    statusBar()->addPermanentWidget(m_backend);
    updateBackendLabel();

    PipelineWorker* w = m_thread->worker();
    connect(w, &PipelineWorker::frameLoaded, this, [this](FramePtr f) { onFrameLoaded(std::move(f)); });
    connect(w, &PipelineWorker::resultReady, this, [this](SnapshotPtr s) { onResult(std::move(s)); });
    connect(w, &PipelineWorker::provisionalReady, this, [this](SnapshotPtr s) { onResult(std::move(s)); });
    connect(w, &PipelineWorker::calibrationFramesSet, this,
            [this](const QString& bias, const QString& dark, const QString& flat, const QString& bpm) {
                m_calibration = {bias, dark, flat, bpm};
                saveCalibrationSettings(m_calibration);
                m_calibLabel->setText(tr("calibration: %1").arg(m_calibration.summary()));
                m_calibLabel->setToolTip(m_calibration.details());
                m_log->append(LogLevel::Info, tr("calibration frames: %1").arg(m_calibration.details()));
                emit calibrationFramesApplied();
            });
    connect(w, &PipelineWorker::loadFailed, this, [this](const QString& m) { frameFailed(m); });
    connect(w, &PipelineWorker::runFailed, this, [this](const QString& m, quint64) {
        hideProgress();
        frameFailed(m);
    });
    connect(w, &PipelineWorker::referenceLoaded, this, [this](ReferencePtr r) {
        m_log->append(LogLevel::Info, r ? tr("reference catalog: %1 stars").arg(r->ra.size())
                                        : tr("reference catalog removed"));
        m_scheduler->runNow(m_params->config());
    });
    // The progress bar appears only for a run that lasts (a re-run after an edit mostly does not): each
    // repaint of the status bar composites the window again, which costs the run CPU where the window
    // is drawn in software.
    m_progressDelay = new QTimer(this);
    m_progressDelay->setSingleShot(true);
    m_progressDelay->setInterval(kProgressDelayMs);
    connect(m_progressDelay, &QTimer::timeout, this, [this] { m_progress->setVisible(true); });
    connect(w, &PipelineWorker::started, this, [this](quint64) {
        m_progress->setValue(0);
        if (!m_progress->isVisible()) m_progressDelay->start();
    });
    connect(w, &PipelineWorker::progress, this, [this](const QString& stage, double f) {
        m_progress->setFormat(stage + QStringLiteral(" %p%"));
        m_progress->setValue(static_cast<int>(f * 100.0));
    });
    connect(m_params, &ParamDock::configChanged, m_scheduler, &RunScheduler::schedule);
    connect(m_scheduler, &RunScheduler::requested, this, [this](quint64) { logParameterChanges(); });
    connect(m_params, &ParamDock::profileError, this, &MainWindow::showError);
    connect(m_view, &viewers::ImageView::cursorMoved, this, &MainWindow::onCursor);
    connect(m_view, &viewers::ImageView::sourceClicked, this, [this](int i) { selectSource(i, false); });
    connect(m_plots, &PlotsPanel::sourceSelected, this, [this](int i) { selectSource(i, true); });
    connect(m_psf, &PsfPanel::positionChosen, this, [this](double x, double y) { m_view->centerOn(x, y); });

    m_follower = new FolderFollower(this);
    connect(m_follower, &FolderFollower::frameReady, this, &MainWindow::followedFrameReady);

    QSettings s;
    restoreGeometry(s.value(QStringLiteral("window/geometry")).toByteArray());
    m_dockSizesToSet = !restoreState(s.value(QStringLiteral("window/state")).toByteArray());
    if (!s.contains(QStringLiteral("window/geometry"))) resize(1500, 950);
    m_mosaicDock->hide(); // shown when a mosaic exposure opens, whatever the last session left
    m_display->restoreSettings();
    // The calibration frames of the last session (the worker reads them; a file gone is an error dialog).
    const CalibrationFrames calib = loadCalibrationSettings();
    m_calibLabel->setText(tr("calibration: %1").arg(calib.summary()));
    m_calibLabel->setToolTip(calib.details());
    if (!calib.empty()) setCalibrationFrames(calib);
}

MainWindow::~MainWindow() = default;

PipelineWorker* MainWindow::worker() const {
    return m_thread->worker();
}

void MainWindow::buildDocks() {
    m_params = new ParamDock(this);
    m_params->setObjectName(QStringLiteral("ParamDock"));
    addDockWidget(Qt::RightDockWidgetArea, m_params);

    m_display = new DisplayControls(m_view, this);
    auto* displayDock = dock(this, tr("Display, layers"), QStringLiteral("DisplayDock"),
                             scrollable(m_display), Qt::LeftDockWidgetArea);
    connect(m_display, &DisplayControls::exaggerationChanged, this, [this](double) {
        if (m_snapshot)
            m_view->setResidualVectors(buildOverlays(*m_snapshot).residuals,
                                       static_cast<float>(m_display->residualExaggeration()));
    });

    m_psf = new PsfPanel(this);
    m_inspector = new SourceInspector(this);
    auto* psfDock =
        dock(this, tr("PSF"), QStringLiteral("PsfDock"), scrollable(m_psf), Qt::LeftDockWidgetArea);
    auto* inspDock = dock(this, tr("Source"), QStringLiteral("SourceDock"), scrollable(m_inspector),
                          Qt::LeftDockWidgetArea);
    m_panelTimer = new QTimer(this);
    m_panelTimer->setSingleShot(true);
    m_panelTimer->setInterval(100);
    connect(m_panelTimer, &QTimer::timeout, this, &MainWindow::feedShownPanels);
    connect(m_view, &QOpenGLWidget::frameSwapped, this, [this] {
        if (m_panelTimer->isActive()) feedShownPanels();
    });
    addPanelFeed(psfDock, [this](SnapshotPtr s) { m_psf->setSnapshot(std::move(s)); });
    addPanelFeed(inspDock, [this](SnapshotPtr s) { m_inspector->setSnapshot(std::move(s)); });
    tabifyDockWidget(displayDock, psfDock);
    tabifyDockWidget(psfDock, inspDock);
    displayDock->raise();

    // Catalog table with its filter line.
    auto* tableBox = new QWidget(this);
    auto* tl = new QVBoxLayout(tableBox);
    tl->setContentsMargins(0, 0, 0, 0);
    auto* filterEdit = new QLineEdit(tableBox);
    filterEdit->setPlaceholderText(tr("filter: id prefix or flag name"));
    m_model = new CatalogModel(this);
    m_filter = new CatalogFilter(this);
    m_filter->setSourceModel(m_model);
    m_table = new QTableView(tableBox);
    m_table->setObjectName(QStringLiteral("CatalogTable"));
    m_table->setModel(m_filter);
    // The worker prepares each result's table order for the sort shown (no O(n log n) on the UI thread).
    connect(m_model, &CatalogModel::sortChanged, this, [this](int column, Qt::SortOrder order, int aperture) {
        m_thread->worker()->setCatalogSort(column, order == Qt::DescendingOrder, aperture);
    });
    m_table->setSortingEnabled(true);
    m_table->sortByColumn(0, Qt::AscendingOrder); // ids ascending (Qt's header starts descending)
    m_table->setSelectionBehavior(QAbstractItemView::SelectRows);
    m_table->setSelectionMode(QAbstractItemView::SingleSelection);
    m_table->verticalHeader()->setVisible(false);
    m_table->verticalHeader()->setDefaultSectionSize(20);
    m_table->horizontalHeader()->setDefaultSectionSize(78);
    tl->addWidget(filterEdit);
    tl->addWidget(m_table);
    connect(filterEdit, &QLineEdit::textChanged, m_filter, &CatalogFilter::setText);
    connect(m_table->selectionModel(), &QItemSelectionModel::currentRowChanged, this,
            [this](const QModelIndex& cur) {
                if (!cur.isValid()) return;
                // Rows follow the table's sort order: the row's source, not its position.
                selectSource(m_model->sourceIndex(m_filter->mapToSource(cur).row()), true);
            });
    auto* tableDock =
        dock(this, tr("Catalog"), QStringLiteral("CatalogDock"), tableBox, Qt::BottomDockWidgetArea);

    m_plots = new PlotsPanel(this);
    auto* plotsDock =
        dock(this, tr("Plots"), QStringLiteral("PlotsDock"), scrollable(m_plots), Qt::BottomDockWidgetArea);
    addPanelFeed(plotsDock, [this](SnapshotPtr s) { m_plots->setSnapshot(std::move(s)); });
    m_header = new HeaderView(this);
    auto* headerDock =
        dock(this, tr("FITS header"), QStringLiteral("HeaderDock"), m_header, Qt::BottomDockWidgetArea);
    m_log = new LogPanel(this);
    auto* logDock = dock(this, tr("Log"), QStringLiteral("LogDock"), m_log, Qt::BottomDockWidgetArea);
    m_history = new QTableWidget(0, 6, this);
    m_history->setObjectName(QStringLiteral("HistoryTable"));
    m_history->setHorizontalHeaderLabels(
        {tr("frame"), tr("time"), tr("sources"), tr("FWHM [px]"), tr("zero point"), tr("status")});
    m_history->horizontalHeader()->setStretchLastSection(true);
    m_history->verticalHeader()->setVisible(false);
    auto* historyDock =
        dock(this, tr("History"), QStringLiteral("HistoryDock"), m_history, Qt::BottomDockWidgetArea);
    tabifyDockWidget(tableDock, plotsDock);
    tabifyDockWidget(plotsDock, headerDock);
    tabifyDockWidget(headerDock, logDock);
    tabifyDockWidget(logDock, historyDock);
    tableDock->raise();
}

QMenu* MainWindow::addMenuBeforeHelp(const QString& title) {
    QMenu* menu = new QMenu(title, this);
    QAction* help = nullptr;
    for (QAction* a : menuBar()->actions())
        if (a->menu() && a->menu()->objectName() == QLatin1String("helpMenu")) help = a;
    menuBar()->insertMenu(help, menu); // appended when there is no Help menu yet
    return menu;
}

void MainWindow::buildMenus() {
    QMenu* file = menuBar()->addMenu(tr("&File"));
    file->addAction(tr("&Open frame..."), QKeySequence::Open, this, [this] {
        QSettings s;
        const QString path = QFileDialog::getOpenFileName(
            this, tr("Open FITS frame"), s.value(QStringLiteral("dirs/frames")).toString(),
            tr("FITS frames (*.fits *.fit *.fts *.fz *.fits.gz);;All files (*)"));
        if (path.isEmpty()) return;
        s.setValue(QStringLiteral("dirs/frames"), QFileInfo(path).absolutePath());
        openFrame(path);
    });
    m_recentMenu = file->addMenu(tr("Open &recent"));
    rebuildRecentMenu();
    file->addAction(tr("Open &demo frame"), this, [this] { openDemo(); });
    file->addAction(tr("Reference &catalog..."), this, [this] {
        const QString path =
            QFileDialog::getOpenFileName(this, tr("Reference catalog"), QString(),
                                         tr("Catalogs (*.fits *.fit *.csv *.ecsv);;All files (*)"));
        if (path.isEmpty()) return;
        bool ok = false;
        const QString cols = QInputDialog::getText(
            this, tr("Reference columns"),
            tr("Column map as for gpuphot reduce --ref-columns (empty: guess), e.g. ra=RA,dec=DEC,mag=G"),
            QLineEdit::Normal, QString(), &ok);
        if (ok) openReference(path, cols);
    });
    file->addAction(tr("Calibration &frames..."), this, [this] { showCalibrationDialog(); });
    file->addAction(tr("&Follow a folder..."), this, [this] {
        const QString dir = QFileDialog::getExistingDirectory(this, tr("Follow the newest frame in"));
        if (!dir.isEmpty()) followFolder(dir);
    });
    file->addAction(tr("Stop following"), this, [this] { followFolder(QString()); });
    QAction* every = file->addAction(tr("Follow every frame (not only the newest)"));
    every->setCheckable(true);
    connect(every, &QAction::toggled, this, &MainWindow::setFollowEveryFrame);
    file->addSeparator();
    file->addAction(tr("Export &catalog..."), this, [this] {
        const QString p =
            askSavePath(this, tr("Export catalog"), tr("FITS table (*.fits);;ECSV (*.ecsv);;CSV (*.csv)"));
        if (!p.isEmpty()) exportCatalog(p);
    });
    file->addAction(tr("Save to &database..."), this, [this] {
        QSettings settings;
        const QString last = settings.value(QStringLiteral("database/url")).toString();
        bool ok = false;
        const QString url = QInputDialog::getText(
            this, tr("Save to database"), tr("SQLite file, or postgresql://USER@HOST/DB:"), QLineEdit::Normal,
            last.isEmpty() && m_frame ? QString::fromStdString(defaultDatabasePath()) : last, &ok);
        if (!ok || url.isEmpty()) return;
        settings.setValue(QStringLiteral("database/url"), url);
        saveToDatabase(url);
    });
    file->addAction(tr("Export DS9 &regions..."), this, [this] {
        const QString p = askSavePath(this, tr("DS9 regions"), tr("Regions (*.reg)"));
        if (!p.isEmpty()) exportRegions(p);
    });
    file->addAction(tr("Export fitted &WCS..."), this, [this] {
        const QString p = askSavePath(this, tr("WCS header"), tr("WCS (*.wcs *.fits)"));
        if (!p.isEmpty()) exportWcs(p);
    });
    file->addAction(tr("Save view as &PNG..."), this, [this] {
        const QString p = askSavePath(this, tr("Snapshot"), tr("PNG (*.png)"));
        if (!p.isEmpty()) saveViewPng(p);
    });
    file->addSeparator();
    file->addAction(tr("&Save parameter profile..."), this, [this] {
        const QString p = askSavePath(this, tr("Save profile"), tr("JSON (*.json)"));
        if (p.isEmpty()) return;
        QString err;
        if (!m_params->saveProfile(p, &err)) showError(err);
    });
    file->addAction(tr("&Load parameter profile..."), this, [this] {
        const QString p =
            QFileDialog::getOpenFileName(this, tr("Load profile"), QString(), tr("JSON (*.json)"));
        if (p.isEmpty()) return;
        QString err;
        if (!m_params->loadProfile(p, &err)) showError(err); // on success configChanged schedules the run
    });
    file->addAction(tr("Import SE&xtractor configuration..."), this, [this] {
        const QString p = QFileDialog::getOpenFileName(this, tr("Import SExtractor configuration"), QString(),
                                                       tr("SExtractor configuration (*.sex);;All files (*)"));
        if (!p.isEmpty()) importSextractor(p);
    });
    file->addAction(tr("Copy the CLI &command"), this, [this] { copyCliCommand(); });
    file->addSeparator();
    file->addAction(tr("&Quit"), QKeySequence::Quit, this, &QWidget::close);

    QMenu* view = menuBar()->addMenu(tr("&View"));
    view->addAction(tr("Zoom to &fit"), QKeySequence(Qt::Key_0), m_view, &viewers::ImageView::zoomToFit);
    view->addAction(tr("Zoom &1:1"), QKeySequence(Qt::Key_1), m_view, &viewers::ImageView::zoomOneToOne);
    view->addSeparator();
    for (QDockWidget* d : findChildren<QDockWidget*>())
        view->addAction(d->toggleViewAction());

    QMenu* run = menuBar()->addMenu(tr("&Run"));
    run->addAction(tr("&Re-run all stages"), QKeySequence(Qt::CTRL | Qt::Key_R), this, [this] {
        if (m_frame) m_thread->worker()->setFrame(m_frame), m_scheduler->runNow(m_params->config());
    });
    run->addAction(tr("&Cancel"), QKeySequence(Qt::Key_Escape), this,
                   [this] { m_thread->worker()->cancel(); });
    buildHelpMenu();
}

void MainWindow::buildHelpMenu() {
    QMenu* help = menuBar()->addMenu(tr("&Help"));
    help->setObjectName(QStringLiteral("helpMenu"));
    QAction* keys = help->addAction(tr("&Keyboard shortcuts"), this, [this] { showShortcutsDialog(); });
    keys->setObjectName(QStringLiteral("actionShortcuts"));
    QAction* docs = help->addAction(tr("&Documentation"), this, [this] {
        const QUrl url = documentationUrl();
        if (url.isEmpty() || !QDesktopServices::openUrl(url))
            showError(tr("The documentation was not found (README.md, docs/)."));
    });
    docs->setObjectName(QStringLiteral("actionDocumentation"));
}

QList<QPair<QString, QString>> MainWindow::shortcuts() const {
    // every action of the window with a shortcut, as its menu names it: the list stays current
    QList<QPair<QString, QString>> rows;
    for (const QAction* a : findChildren<QAction*>()) {
        if (a->shortcuts().isEmpty()) continue;
        QString name = a->text().remove(QLatin1Char('&'));
        while (name.endsWith(QLatin1Char('.')) || name.endsWith(QChar(0x2026)))
            name.chop(1);
        QStringList keys;
        for (const QKeySequence& k : a->shortcuts())
            keys << k.toString(QKeySequence::NativeText);
        const QPair<QString, QString> row(name, keys.join(QStringLiteral(", ")));
        if (!rows.contains(row)) rows << row;
    }
    std::sort(rows.begin(), rows.end());
    return rows;
}

QDialog* MainWindow::showShortcutsDialog() {
    auto* dialog = new QDialog(this);
    dialog->setObjectName(QStringLiteral("shortcutsDialog"));
    dialog->setAttribute(Qt::WA_DeleteOnClose);
    dialog->setWindowTitle(tr("Keyboard shortcuts"));
    auto* layout = new QVBoxLayout(dialog);
    const auto rows = shortcuts();
    auto* table = new QTableWidget(static_cast<int>(rows.size()), 2, dialog);
    table->setHorizontalHeaderLabels({tr("Action"), tr("Shortcut")});
    table->setEditTriggers(QAbstractItemView::NoEditTriggers);
    table->verticalHeader()->hide();
    table->horizontalHeader()->setSectionResizeMode(0, QHeaderView::Stretch);
    for (int r = 0; r < rows.size(); ++r) {
        table->setItem(r, 0, new QTableWidgetItem(rows[r].first));
        table->setItem(r, 1, new QTableWidgetItem(rows[r].second));
    }
    layout->addWidget(table);
    auto* buttons = new QDialogButtonBox(QDialogButtonBox::Close, dialog);
    connect(buttons, &QDialogButtonBox::rejected, dialog, &QDialog::reject);
    layout->addWidget(buttons);
    dialog->resize(420, 360);
    dialog->open();
    return dialog;
}

QUrl MainWindow::documentationUrl() {
    // installed: <prefix>/bin/gpuphot-studio with <prefix>/share/doc/gpuphot/README.md; from a build
    // tree: the repository's README.md (beside docs/) in a folder above the executable
    const QDir bin(QCoreApplication::applicationDirPath());
    const QString installed = bin.absoluteFilePath(QStringLiteral("../share/doc/gpuphot/README.md"));
    if (QFileInfo::exists(installed)) return QUrl::fromLocalFile(QDir::cleanPath(installed));
    for (QDir dir = bin;;) {
        if (QFileInfo::exists(dir.filePath(QStringLiteral("README.md"))) &&
            QFileInfo(dir.filePath(QStringLiteral("docs"))).isDir())
            return QUrl::fromLocalFile(dir.filePath(QStringLiteral("README.md")));
        if (!dir.cdUp()) break;
    }
    return {}; // no documentation found: the action says so
}

void MainWindow::showError(const QString& message) {
    statusBar()->showMessage(message, 15000);
    if (m_log) m_log->append(LogLevel::Error, message);
    emit errorShown(message);
    // A non-modal dialog: the message is seen, nothing blocks (a night-long follow keeps running).
    if (!m_errorBox) {
        m_errorBox =
            new QMessageBox(QMessageBox::Warning, tr("GPUPHOT Studio"), message, QMessageBox::Ok, this);
        m_errorBox->setAttribute(Qt::WA_DeleteOnClose);
        m_errorBox->setModal(false);
    } else {
        m_errorBox->setText(message);
    }
    m_errorBox->show();
}

bool MainWindow::openFrame(const QString& path, const QString& hduIn) {
    QString hdu = hduIn;
    try {
        if (!openAsMosaic(path, hdu) && !chooseImageHdu(path, hdu)) return false;
    } catch (const std::exception& e) {
        showError(QString::fromStdString(e.what()));
        return false;
    }
    m_framePath = path;
    m_fitOnResult = true;
    m_params->setRunInputs(path, m_refPath, hdu);
    m_thread->worker()->loadFrame(path, hdu);
    if (m_mosaic->path() == path) m_mosaic->setCurrentHdu(hdu);
    addRecent(path);
    return true;
}

bool MainWindow::chooseImageHdu(const QString& path, QString& hdu) {
    const std::vector<HduSummary> hdus = listHdus(path.toStdString());
    QStringList images;
    QStringList ids;
    for (const HduSummary& h : hdus)
        if (h.type == "IMAGE" && h.axes.size() == 2) {
            images << QStringLiteral("%1: %2 %3 x %4")
                          .arg(h.index)
                          .arg(QString::fromStdString(h.extname.empty() ? std::string("(primary)")
                                                                        : h.extname))
                          .arg(h.axes[0])
                          .arg(h.axes[1]);
            ids << QString::number(h.index);
        }
    if (images.isEmpty()) throw InvalidInput(path.toStdString() + ": no 2-D image HDU");
    if (!hdu.isEmpty()) return true;
    if (images.size() == 1) {
        hdu = ids.front();
        return true;
    }
    bool ok = false;
    const QString item = QInputDialog::getItem(this, tr("Choose an image HDU"), QFileInfo(path).fileName(),
                                               images, 0, false, &ok);
    if (!ok) return false;
    hdu = ids.at(images.indexOf(item));
    return true;
}

void MainWindow::openReference(const QString& path, const QString& columns) {
    m_refPath = path;
    m_params->setRunInputs(m_framePath, m_refPath);
    QMetaObject::invokeMethod(m_thread->worker(), "loadReference", Qt::QueuedConnection, Q_ARG(QString, path),
                              Q_ARG(QString, columns));
}

void MainWindow::openDemo() {
    const QString dir =
        QStandardPaths::writableLocation(QStandardPaths::CacheLocation) + QStringLiteral("/demo");
    const QString frame = dir + QStringLiteral("/demo.fits");
    const QString ref = dir + QStringLiteral("/demo.ref.fits");
    if (!QFileInfo::exists(frame) || !QFileInfo::exists(ref)) {
        statusBar()->showMessage(tr("simulating the demo field (2048 x 2048, 3000 stars)..."));
        QFile f(QStringLiteral(":/demo/simulate.json"));
        if (!f.open(QIODevice::ReadOnly)) {
            showError(tr("the demo field's parameters are missing from this build"));
            return;
        }
        const std::string json = f.readAll().toStdString();
        // On a helper thread: the UI stays live while the simulator runs (about a second).
        QThread* t = QThread::create([this, json, dir, frame, ref] {
            try {
                QDir().mkpath(dir);
                const SimParams p = nlohmann::json::parse(json).get<SimParams>();
                const SimResult r = simulateField(p);
                writeSimulation(r, dir.toStdString(), "demo", 20);
                QMetaObject::invokeMethod(this, [this, frame, ref] {
                    openFrame(frame, QStringLiteral("0"));
                    openReference(ref);
                });
            } catch (const std::exception& e) {
                const QString msg = QString::fromStdString(e.what());
                QMetaObject::invokeMethod(this, [this, msg] { showError(msg); });
            }
        });
        connect(t, &QThread::finished, t, &QObject::deleteLater);
        t->start();
        return;
    }
    openFrame(frame, QStringLiteral("0"));
    openReference(ref);
}

void MainWindow::followFolder(const QString& dir) {
    m_follower->follow(dir);
    if (!dir.isEmpty()) { // the catalogs of the folder's frames reduced before join the light curves
        QStringList cats;
        const QDir catDir(followCatalogDir());
        for (const QString& f : catDir.entryList({QStringLiteral("*.cat.fits")}, QDir::Files, QDir::Name))
            cats << catDir.filePath(f);
        m_curves->setCatalogs(cats);
    }
    if (dir.isEmpty())
        m_log->append(LogLevel::Info, tr("stopped following"));
    else
        m_log->append(LogLevel::Info,
                      tr("following %1: the newest frame opens and reduces as it arrives").arg(dir));
    statusBar()->showMessage(dir.isEmpty() ? tr("not following a folder") : tr("following %1").arg(dir),
                             5000);
    const QString shown = QDir::toNativeSeparators(dir);
    m_followLabel->setText(tr("following %1").arg(fontMetrics().elidedText(shown, Qt::ElideMiddle, 260)));
    m_followLabel->setToolTip(tr("following %1 (File > Stop following)").arg(shown));
    m_followLabel->setVisible(!dir.isEmpty());
}

void MainWindow::onFrameLoaded(std::shared_ptr<const Frame> frame) {
    m_frame = std::move(frame);
    m_emptyHint->hide();
    m_steppedFrame.reset();
    statusBar()->clearMessage();
    m_snapshot.reset();
    m_view->setImage(std::shared_ptr<const Image<float>>(m_frame, &m_frame->pixels));
    m_shownFrame = m_frame;
    m_view->setSources({});
    m_view->setSegmentation(nullptr);
    m_model->setSnapshot(nullptr);
    m_header->setHeader(m_frame->header);
    m_params->showFrameInstrument(m_frame->instrument);
    m_view->zoomToFit();
    setWindowTitle(tr("GPUPHOT Studio - %1 (%2 x %3)")
                       .arg(QFileInfo(m_framePath).fileName())
                       .arg(m_frame->width())
                       .arg(m_frame->height()));
    m_log->append(LogLevel::Info, tr("opened %1: %2 x %3 px%4")
                                      .arg(m_framePath)
                                      .arg(m_frame->width())
                                      .arg(m_frame->height())
                                      .arg(m_frame->wcs ? tr(", WCS ") + QString::fromStdString(
                                                                             m_frame->wcs->projectionCode())
                                                        : tr(", no WCS")));
    emit frameShown(m_framePath);
    m_scheduler->runNow(m_params->config());
}

void MainWindow::onResult(SnapshotPtr snap) {
    if (!snap || (m_snapshot && snap->generation < m_snapshot->generation)) return;
    // A provisional result never replaces the complete one of its own request.
    if (snap->provisional && m_snapshot && snap->generation == m_snapshot->generation) return;
    if (snap->frame != m_frame && m_frame && snap->frame && snap->frame->path != m_frame->path) return;
    m_snapshot = snap;
    if (!snap->provisional) hideProgress(); // the PSF stage is still running otherwise
    // The run measured the prepared frame (calibrated, trimmed, 2x2-binned for a CFA frame ...): show
    // those pixels, so that the overlays and the readout refer to the image on screen.
    if (snap->frame && (snap->frame != m_shownFrame || m_steppedFrame)) {
        m_steppedFrame.reset(); // a result ends the stepping through the series: its frame is shown
        m_shownFrame = snap->frame;
        m_view->setImage(std::shared_ptr<const Image<float>>(snap->frame, &snap->frame->pixels));
    }
    const OverlayGeometry g = buildOverlays(*snap);
    m_view->setSources(g.sources);
    m_view->setApertures(g.apertureRadii, g.annulusInner, g.annulusOuter);
    m_view->setPsfWhiskers(g.whiskers);
    m_view->setReferenceStars(g.referenceStars);
    m_view->setResidualVectors(g.residuals, static_cast<float>(m_display->residualExaggeration()));
    // The worker materialises the map (a CUDA detection leaves it on the device) before it emits a complete
    // result and while a provisional one is shown: never downloaded on this thread.
    const SegmentationMap& seg = snap->result.detection.segmentation;
    m_view->setSegmentation(
        seg.isMaterialised() ? std::shared_ptr<const Image<std::int32_t>>(snap, &seg.host()) : nullptr);
    m_model->setSnapshot(snap);
    feedPanels(snap->provisional);
    m_times->setText(stageTimes(*snap));
    m_times->setToolTip(m_times->text()); // the whole line, where the status bar cuts it
    if (snap->provisional) {              // the log, history and listeners get the complete result
        emit provisionalShown(snap);
        return;
    }
    m_log->setSnapshot(snap); // the run's line (generation, stages, times), then its warnings
    if (!snap->result.calibrationProblem.empty())
        m_log->append(LogLevel::Warning, QString::fromStdString(snap->result.calibrationProblem));
    if (m_fitOnResult) {
        m_fitOnResult = false;
        m_table->resizeColumnsToContents(); // once per frame: later results keep the user's widths
    }
    if (!m_follower->folder().isEmpty() && m_following == m_framePath) {
        const auto& r = snap->result;
        const bool psf = std::isfinite(r.psf.medianFwhm) && r.psf.medianFwhm > 0.0;
        addHistoryRow({QString::number(r.detection.sources.size()),
                       psf ? QString::number(r.psf.medianFwhm, 'f', 2) : QStringLiteral("–"),
                       r.zeropoint.ok ? QString::number(r.zeropoint.zp, 'f', 3) : QStringLiteral("–"),
                       psf ? tr("reduced") : tr("reduced, no PSF model")});
        writeFollowCatalog(snap);
        nextFollowedFrame();
    }
    updateSeriesMarkers();
    emit snapshotShown(snap);
}

// The parameters a run request changed against the last one logged, as "key: old -> new".
void MainWindow::logParameterChanges() {
    const nlohmann::json now = nlohmann::json(m_scheduler->latestConfig()).flatten();
    if (m_loggedConfig.is_object()) {
        QStringList changes;
        for (const auto& [key, value] : now.items()) {
            const auto was = m_loggedConfig.find(key);
            if (was != m_loggedConfig.end() && *was == value) continue;
            changes
                << tr("%1: %2 -> %3")
                       .arg(QString::fromStdString(key.substr(1)).replace(QLatin1Char('/'), QLatin1Char('.')),
                            was == m_loggedConfig.end() ? QStringLiteral("-")
                                                        : QString::fromStdString(was->dump()),
                            QString::fromStdString(value.dump()));
        }
        if (!changes.isEmpty())
            m_log->append(LogLevel::Info, tr("parameters: %1").arg(changes.join(QStringLiteral(", "))));
    }
    m_loggedConfig = now;
}

// What to do while no frame is open, in the middle of the empty view; hidden by the first frame.
void MainWindow::buildEmptyHint() {
    m_emptyHint = new QLabel(tr("No frame open.\n\nFile > Open frame... (Ctrl+O), drop a FITS file here,\n"
                                "File > Open demo frame, or File > Follow a folder..."),
                             m_view);
    m_emptyHint->setObjectName(QStringLiteral("EmptyViewHint"));
    m_emptyHint->setAlignment(Qt::AlignCenter);
    m_emptyHint->setAttribute(Qt::WA_TransparentForMouseEvents);
    m_emptyHint->setStyleSheet(QStringLiteral("color: #b0b0b8; background: transparent;"));
    m_emptyHint->setGeometry(m_view->rect());
    m_view->installEventFilter(this);
}

bool MainWindow::eventFilter(QObject* watched, QEvent* e) {
    if (watched == m_view && e->type() == QEvent::Resize && m_emptyHint)
        m_emptyHint->setGeometry(m_view->rect());
    return QMainWindow::eventFilter(watched, e);
}

void MainWindow::hideProgress() {
    m_progressDelay->stop();
    m_progress->setVisible(false);
}

void MainWindow::addPanelFeed(QDockWidget* dock, std::function<void(SnapshotPtr)> take) {
    m_panelFeeds.push_back({dock, std::move(take)});
    // A dock behind another tab stays isVisible(); visibilityChanged says when its tab is the one shown.
    connect(dock, &QDockWidget::visibilityChanged, this, [this, dock](bool visible) {
        for (PanelFeed& p : m_panelFeeds)
            if (p.dock == dock) {
                p.shown = visible;
                if (visible) feedPanel(p);
            }
    });
}

void MainWindow::feedPanels(bool provisional) {
    bool shownStale = false;
    for (PanelFeed& p : m_panelFeeds) {
        p.stale = true;
        shownStale = shownStale || (!provisional && p.shown);
    }
    // After the view's next frame (its overlays drawn), or after a moment where the view does not draw.
    if (shownStale) m_panelTimer->start();
}

void MainWindow::feedShownPanels() {
    m_panelTimer->stop();
    for (PanelFeed& p : m_panelFeeds)
        if (p.shown) feedPanel(p);
}

void MainWindow::feedPanel(PanelFeed& panel) {
    if (!panel.stale) return;
    panel.stale = false;
    panel.take(m_snapshot);
}

void MainWindow::feedAllPanels() {
    m_panelTimer->stop();
    for (PanelFeed& p : m_panelFeeds)
        feedPanel(p);
}

void MainWindow::onCursor(double x, double y) {
    m_cursorX = x;
    m_cursorY = y;
    if (!m_frame || !std::isfinite(x) || !std::isfinite(y)) {
        m_readout->clear();
        return;
    }
    const Wcs* wcs = (m_snapshot && m_snapshot->result.fittedWcs) ? m_snapshot->result.fittedWcs.get()
                                                                  : m_frame->wcs.get();
    m_readout->setText(formatReadout(*m_frame, wcs, x, y));
    if (m_psf->isVisible()) m_psf->setPosition(x, y); // the ePSF under the cursor
}

QString MainWindow::cursorReadout() const {
    return m_readout->text();
}

QString MainWindow::statusTimesText() const {
    return m_times->text();
}

void MainWindow::setCalibrationFrames(const CalibrationFrames& frames) {
    PipelineWorker* w = m_thread->worker();
    // Queued on the worker's thread, so the files are read there and before the re-run requested next.
    QMetaObject::invokeMethod(
        w, [w, frames] { w->setCalibrationFrames(frames.bias, frames.dark, frames.flat, frames.bpm); },
        Qt::QueuedConnection);
    if (m_frame) m_scheduler->runNow(m_params->config());
}

CalibrationDialog* MainWindow::showCalibrationDialog() {
    auto* dialog = new CalibrationDialog(m_calibration, this);
    dialog->setAttribute(Qt::WA_DeleteOnClose);
    connect(dialog, &QDialog::accepted, this, [this, dialog] {
        if (dialog->frames() != m_calibration) setCalibrationFrames(dialog->frames());
    });
    dialog->open();
    return dialog;
}

void MainWindow::selectSource(int index, bool centre) {
    if (!m_snapshot || index < 0 ||
        static_cast<std::size_t>(index) >= m_snapshot->result.detection.sources.size())
        return;
    feedAllPanels(); // the index is one of m_snapshot's sources
    m_view->setSelectedSource(index);
    m_inspector->setSelectedSource(index);
    m_psf->setSelectedSource(index);
    if (centre) {
        m_view->centerOn(m_snapshot->result.detection.sources.x[index],
                         m_snapshot->result.detection.sources.y[index]);
    } else {
        const QModelIndex proxy = m_filter->mapFromSource(m_model->index(m_model->rowOfSource(index), 0));
        if (proxy.isValid()) {
            QSignalBlocker block(m_table->selectionModel());
            m_table->selectRow(proxy.row());
            m_table->scrollTo(proxy);
        }
    }
}

bool MainWindow::exportCatalog(const QString& requested) {
    if (!m_snapshot || !m_frame) {
        showError(tr("nothing to export yet: open a frame and let it reduce"));
        return false;
    }
    const QString path = outputPath(requested, QStringLiteral(".fits"));
    try {
        const Table t = buildCatalog(*m_snapshot->frame, m_snapshot->result, m_snapshot->config,
                                     m_snapshot->reference.get());
        const std::string p = path.toStdString();
        if (path.endsWith(QStringLiteral(".ecsv"), Qt::CaseInsensitive))
            writeEcsv(p, t);
        else if (path.endsWith(QStringLiteral(".csv"), Qt::CaseInsensitive))
            writeCsv(p, t);
        else
            writeFitsTable(p, t);
        confirmWritten(tr("catalog (%1 rows)").arg(t.rows()), path);
        return true;
    } catch (const std::exception& e) {
        showError(QString::fromStdString(e.what()));
        return false;
    }
}

std::string MainWindow::defaultDatabasePath() const {
    return (std::filesystem::path(m_snapshot && m_snapshot->frame ? m_snapshot->frame->path
                                                                  : std::string("."))
                .parent_path() /
            "gpuphot.sqlite")
        .string();
}

// The frame, its report and its catalog into the results store (core/db), as `reduce --db` stores them.
bool MainWindow::saveToDatabase(const QString& url) {
    if (!m_snapshot || !m_frame || m_snapshot->provisional) {
        showError(tr("nothing to save yet: open a frame and let it reduce"));
        return false;
    }
    try {
        QApplication::setOverrideCursor(Qt::WaitCursor);
        const Table t = buildCatalog(*m_snapshot->frame, m_snapshot->result, m_snapshot->config,
                                     m_snapshot->reference.get());
        RunContext ctx;
        ctx.records = m_snapshot->timings;
        const nlohmann::json report =
            buildReport(*m_snapshot->frame, m_snapshot->result, m_snapshot->config, ctx);
        auto store = openResultsStore(url.toStdString());
        storeReducedFrame(*store, {}, {}, false, &report, &t);
        QApplication::restoreOverrideCursor();
        m_log->append(LogLevel::Info, tr("saved to %1: %2 sources").arg(url).arg(t.rows()));
        return true;
    } catch (const std::exception& e) {
        QApplication::restoreOverrideCursor();
        showError(QString::fromStdString(e.what()));
        return false;
    }
}

bool MainWindow::exportRegions(const QString& requested) {
    if (!m_snapshot) {
        showError(tr("nothing to export yet"));
        return false;
    }
    const QString path = outputPath(requested, QStringLiteral(".reg"));
    try {
        const Table t = buildCatalog(*m_snapshot->frame, m_snapshot->result, m_snapshot->config,
                                     m_snapshot->reference.get());
        writeDs9RegionFile(path.toStdString(), catalogRegions(t, viewWcs())); // ids, colour by flag, fk5
        confirmWritten(tr("catalog regions (%1)").arg(t.rows()), path);
        return true;
    } catch (const std::exception& e) {
        showError(QString::fromStdString(e.what()));
        return false;
    }
}

bool MainWindow::exportWcs(const QString& requested) {
    if (!m_snapshot || !m_snapshot->result.fittedWcs) {
        showError(tr("no verified astrometric fit to export (load a reference catalog; see the log)"));
        return false;
    }
    const QString path = outputPath(requested, QStringLiteral(".wcs"));
    try {
        writeFitsHeader(path.toStdString(), m_snapshot->result.fittedWcs->toHeader());
        confirmWritten(tr("fitted WCS"), path);
        return true;
    } catch (const std::exception& e) {
        showError(QString::fromStdString(e.what()));
        return false;
    }
}

bool MainWindow::saveViewPng(const QString& requested) {
    const QString path = outputPath(requested, QStringLiteral(".png"));
    const QImage img = m_view->grabFramebuffer();
    if (img.isNull() || !img.save(path, "PNG")) {
        showError(tr("could not write %1").arg(path));
        return false;
    }
    confirmWritten(tr("view (%1 x %2 px)").arg(img.width()).arg(img.height()), path);
    return true;
}

QString MainWindow::outputPath(const QString& requested, const QString& suffix) {
    const QString path = withDefaultSuffix(requested, suffix);
    QDir().mkpath(QFileInfo(path).absolutePath()); // a missing folder is made (a failure shows on writing)
    return path;
}

void MainWindow::confirmWritten(const QString& what, const QString& path) {
    const QString text = tr("wrote %1: %2").arg(what, QDir::toNativeSeparators(path));
    statusBar()->showMessage(text, 10000);
    m_log->append(LogLevel::Info, text);
}

bool MainWindow::importSextractor(const QString& path) {
    QString warning, error;
    if (!m_params->importSextractor(path, &warning, &error)) {
        showError(error);
        return false;
    }
    m_log->append(LogLevel::Info, tr("SExtractor configuration imported: %1").arg(path));
    if (!warning.isEmpty()) m_log->append(LogLevel::Warning, warning);
    return true; // configChanged schedules the run
}

void MainWindow::copyCliCommand() {
    if (m_framePath.isEmpty()) {
        showError(tr("open a frame first"));
        return;
    }
    const QString cmd = m_params->cliCommand(m_framePath, m_refPath);
    QGuiApplication::clipboard()->setText(cmd);
    m_log->append(LogLevel::Info, tr("copied: %1").arg(cmd));
}

void MainWindow::addRecent(const QString& path) {
    QSettings s;
    QStringList recent = s.value(QStringLiteral("recentFiles")).toStringList();
    const QString abs = QFileInfo(path).absoluteFilePath();
    recent.removeAll(abs);
    recent.prepend(abs);
    while (recent.size() > kMaxRecent)
        recent.removeLast();
    s.setValue(QStringLiteral("recentFiles"), recent);
    rebuildRecentMenu();
}

void MainWindow::rebuildRecentMenu() {
    m_recentMenu->clear();
    const QStringList recent = QSettings().value(QStringLiteral("recentFiles")).toStringList();
    for (const QString& p : recent)
        m_recentMenu->addAction(p, this, [this, p] { openFrame(p); });
    m_recentMenu->setEnabled(!recent.isEmpty());
}

void MainWindow::updateBackendLabel() {
    const auto devices = listCudaDevices();
    m_backend->setText(
        devices.empty() ? tr("CPU backend, %1 threads").arg(QThread::idealThreadCount())
                        : tr("CUDA: %1 (%2 GiB)")
                              .arg(QString::fromStdString(devices.front().name))
                              .arg(static_cast<double>(devices.front().totalBytes) / (1 << 30), 0, 'f', 0));
}

void MainWindow::dragEnterEvent(QDragEnterEvent* e) {
    if (e->mimeData()->hasUrls()) e->acceptProposedAction();
}

void MainWindow::dropEvent(QDropEvent* e) {
    const auto urls = e->mimeData()->urls();
    if (!urls.isEmpty() && urls.front().isLocalFile()) openFrame(urls.front().toLocalFile());
}

void MainWindow::showEvent(QShowEvent* e) {
    QMainWindow::showEvent(e);
    if (!m_dockSizesToSet) return;
    m_dockSizesToSet = false;
    // The panels are in scroll areas (no minimum size of their own): without a saved layout the left docks
    // start wide enough for the display controls whole and the bottom ones at a quarter of the window.
    auto* left = findChild<QDockWidget*>(QStringLiteral("DisplayDock"));
    auto* bottom = findChild<QDockWidget*>(QStringLiteral("CatalogDock"));
    resizeDocks({left}, {m_display->sizeHint().width() + style()->pixelMetric(QStyle::PM_ScrollBarExtent)},
                Qt::Horizontal);
    resizeDocks({bottom}, {height() / 4}, Qt::Vertical);
}

void MainWindow::closeEvent(QCloseEvent* e) {
    QSettings s;
    s.setValue(QStringLiteral("window/geometry"), saveGeometry());
    s.setValue(QStringLiteral("window/state"), saveState());
    m_display->saveSettings();
    QMainWindow::closeEvent(e);
}

} // namespace gpuphot::ui
