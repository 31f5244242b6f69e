// The main window's light-curve dock: the panel (ui/lightcurve_panel.hpp), its target chosen by a click on
// a star, its comparison stars drawn on the image, the followed folder's catalogs as its series, and the
// series' frames stepped and blinked in the viewer, aligned by WCS, with the display limits kept.
#include <QDir>
#include <QDockWidget>
#include <QFileDialog>
#include <QFileInfo>
#include <QMenu>
#include <QMenuBar>
#include <QPointer>
#include <QStatusBar>
#include <QTableWidget>
#include <QThread>
#include <QTime>

#include <cmath>
#include <filesystem>

#include "core/io/fits_image.hpp"
#include "core/io/fits_table.hpp"
#include "core/pipeline/catalog_builder.hpp"
#include "core/pipeline/outputs.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/wcs.hpp"
#include "ui/folder_follower.hpp"
#include "ui/lightcurve_panel.hpp"
#include "ui/log_panel.hpp"
#include "ui/main_window.hpp"
#include "ui/scrollable.hpp"
#include "viewers/image_view.hpp"

namespace gpuphot::ui {
namespace {

std::uint32_t markerColour(LightCurvePanel::SkyMarker::Kind k) {
    switch (k) {
    case LightCurvePanel::SkyMarker::Target:
        return viewers::packRgba(255, 60, 60);
    case LightCurvePanel::SkyMarker::Comparison:
        return viewers::packRgba(60, 255, 255);
    case LightCurvePanel::SkyMarker::Dropped:
        return viewers::packRgba(255, 160, 0);
    case LightCurvePanel::SkyMarker::Excluded:
        return viewers::packRgba(150, 150, 150);
    }
    return 0;
}

} // namespace

void MainWindow::buildLightCurveDock() {
    m_curves = new LightCurvePanel(this);
    auto* d = new QDockWidget(tr("Light curve"), this);
    d->setObjectName(QStringLiteral("LightCurveDock"));
    d->setWidget(scrollable(m_curves, d));
    addDockWidget(Qt::BottomDockWidgetArea, d);
    if (auto* history = findChild<QDockWidget*>(QStringLiteral("HistoryDock"))) tabifyDockWidget(history, d);
    if (auto* catalog = findChild<QDockWidget*>(QStringLiteral("CatalogDock")))
        catalog->raise(); // shown first
    connect(m_curves, &LightCurvePanel::markersChanged, this, &MainWindow::updateSeriesMarkers);
    connect(m_curves, &LightCurvePanel::errorShown, this,
            [this](const QString& m) { m_log->append(LogLevel::Warning, tr("light curve: %1").arg(m)); });
    connect(m_curves, &LightCurvePanel::frameStepped, this, &MainWindow::showSeriesFrame);
    connect(m_curves, &LightCurvePanel::starChosen, this, [this](double ra, double dec) {
        const Wcs* wcs = (m_snapshot && m_snapshot->result.fittedWcs) ? m_snapshot->result.fittedWcs.get()
                         : m_frame                                    ? m_frame->wcs.get()
                                                                      : nullptr;
        if (!wcs) return;
        const auto [x, y] = wcs->worldToPixel(ra, dec);
        if (std::isfinite(x) && std::isfinite(y)) m_view->centerOn(x, y);
    });
    connect(m_view, &viewers::ImageView::sourceClicked, this, &MainWindow::lightCurveTarget);

    QMenu* menu = addMenuBeforeHelp(tr("&Light curves"));
    menu->addAction(tr("Open &series..."), this, [this] {
        const QString dir = QFileDialog::getExistingDirectory(this, tr("A gpuphot series directory"));
        if (!dir.isEmpty()) openSeries(dir);
    });
    menu->addAction(tr("Load &targets..."), this, [this] {
        const QString p = QFileDialog::getOpenFileName(
            this, tr("Targets"), QString(), tr("Targets (*.csv *.ecsv *.fits *.txt);;All files (*)"));
        if (!p.isEmpty()) m_curves->loadTargets(p);
    });
    menu->addAction(tr("&Find variables"), m_curves, &LightCurvePanel::findVariables);
    menu->addAction(d->toggleViewAction());
}

QString MainWindow::followCatalogDir() const {
    const QString f = m_follower ? m_follower->folder() : QString();
    return f.isEmpty() ? QString() : QDir(f).filePath(QStringLiteral("gpuphot"));
}

bool MainWindow::openSeries(const QString& dir) {
    const bool ok = m_curves->openSeries(dir);
    if (ok) m_log->append(LogLevel::Info, tr("light curves of the series in %1").arg(dir));
    return ok;
}

// A click on a star makes it the panel's target while the panel has a series to measure it in.
void MainWindow::lightCurveTarget(int index) {
    if (!m_snapshot || m_curves->runner()->catalogs().empty() || index < 0) return;
    const Sources& s = m_snapshot->result.detection.sources;
    if (static_cast<std::size_t>(index) >= s.size()) return;
    const Wcs* wcs =
        m_snapshot->result.fittedWcs ? m_snapshot->result.fittedWcs.get() : m_snapshot->frame->wcs.get();
    if (!wcs) {
        m_log->append(LogLevel::Warning,
                      tr("light curve: this frame has no WCS, its stars have no sky position"));
        return;
    }
    const auto [ra, dec] = wcs->pixelToWorld(s.x[index], s.y[index]);
    m_curves->setTarget(tr("src%1").arg(index + 1), ra, dec);
}

// The panel's stars on the image shown, through its WCS (a stepped frame's own, else the reduction's).
void MainWindow::updateSeriesMarkers() {
    const Frame* shown = m_steppedFrame ? m_steppedFrame.get() : m_frame.get();
    const Wcs* wcs = !m_steppedFrame && m_snapshot && m_snapshot->result.fittedWcs
                         ? m_snapshot->result.fittedWcs.get()
                         : (shown ? shown->wcs.get() : nullptr);
    std::vector<viewers::EllipseInstance> circles;
    if (wcs)
        for (const auto& m : m_curves->markers()) {
            const auto [x, y] = wcs->worldToPixel(m.ra, m.dec);
            if (!std::isfinite(x) || !std::isfinite(y)) continue;
            const float r = m.kind == LightCurvePanel::SkyMarker::Target ? 12.f : 9.f;
            circles.push_back(
                {static_cast<float>(x), static_cast<float>(y), r, r, 0.f, markerColour(m.kind)});
        }
    m_view->setSeriesMarkers(std::move(circles));
}

// While following: the complete result's catalog into FOLDER/gpuphot (written off the UI thread, atomically),
// then into the panel's series.
void MainWindow::writeFollowCatalog(const SnapshotPtr& snap) {
    const QString dir = followCatalogDir();
    if (dir.isEmpty() || !snap || !snap->frame || snap->provisional) return;
    const std::string path =
        (std::filesystem::path(dir.toStdString()) / (frameStem(snap->frame->path) + ".cat.fits")).string();
    QPointer<MainWindow> self(this);
    QThread* t = QThread::create([self, snap, path] {
        QString error;
        try {
            std::filesystem::create_directories(std::filesystem::path(path).parent_path());
            writeFitsTable(path,
                           buildCatalog(*snap->frame, snap->result, snap->config, snap->reference.get()));
        } catch (const std::exception& e) {
            error = QString::fromStdString(e.what());
        }
        if (!self) return;
        QMetaObject::invokeMethod(self, [self, path, error] {
            if (!error.isEmpty()) return self->m_log->append(LogLevel::Warning, error);
            self->m_curves->addCatalog(QString::fromStdString(path));
            emit self->followCatalogWritten(QString::fromStdString(path));
        });
    });
    connect(t, &QThread::finished, t, &QObject::deleteLater);
    t->start();
}

// A frame of the series in the viewer without reducing it: read off the UI thread, centred on the sky
// position at the centre of the view, with the current display limits; the panel's markers follow it.
void MainWindow::showSeriesFrame(const QString& path) {
    const Frame* shown = m_steppedFrame ? m_steppedFrame.get() : m_shownFrame.get();
    const Wcs* wcs = !m_steppedFrame && m_snapshot && m_snapshot->result.fittedWcs
                         ? m_snapshot->result.fittedWcs.get()
                         : (shown ? shown->wcs.get() : nullptr);
    double ra = NAN, dec = NAN;
    if (wcs) std::tie(ra, dec) = wcs->pixelToWorld(m_view->center().x(), m_view->center().y());
    const auto [lo, hi] = m_view->limits();
    QPointer<MainWindow> self(this);
    QThread* t = QThread::create([self, path, ra, dec, lo = lo, hi = hi] {
        std::shared_ptr<const Frame> f;
        QString error;
        try {
            f = std::make_shared<const Frame>(readFrame(path.toStdString()));
        } catch (const std::exception& e) {
            error = QString::fromStdString(e.what());
        }
        if (!self) return;
        QMetaObject::invokeMethod(self, [self, f, path, error, ra, dec, lo, hi] {
            if (!f) return self->m_log->append(LogLevel::Warning, error);
            self->m_steppedFrame = f;
            self->m_view->setImage(std::shared_ptr<const Image<float>>(f, &f->pixels));
            self->m_view->setManualLimits(lo, hi);
            self->m_view->setSources({});
            self->m_view->setReferenceStars({});
            if (f->wcs && std::isfinite(ra)) {
                const auto [x, y] = f->wcs->worldToPixel(ra, dec);
                if (std::isfinite(x) && std::isfinite(y)) self->m_view->centerOn(x, y);
            }
            self->updateSeriesMarkers();
            self->statusBar()->showMessage(tr("series frame %1 (not reduced; open it to reduce)").arg(path));
        });
    });
    connect(t, &QThread::finished, t, &QObject::deleteLater);
    t->start();
}

void MainWindow::setFollowEveryFrame(bool on) {
    m_follower->setEveryFrame(on);
    m_log->append(LogLevel::Info,
                  on ? tr("following: every new frame, in turn") : tr("following: the newest frame"));
}

void MainWindow::followedFrameReady(const QString& path) {
    m_log->append(LogLevel::Info, tr("new frame: %1").arg(path));
    if (!m_follower->everyFrame()) { // the newest replaces whatever was reducing
        m_followQueue.clear();
        return openFollowedFrame(path);
    }
    m_followQueue << path;
    if (m_following.isEmpty()) nextFollowedFrame();
}

void MainWindow::nextFollowedFrame() {
    m_following.clear();
    if (!m_followQueue.isEmpty()) openFollowedFrame(m_followQueue.takeFirst());
}

// The first 2-D image HDU, as a direct open of a file with one image picks it (a .fits.fz's is HDU 1).
void MainWindow::openFollowedFrame(const QString& path) {
    QString hdu;
    try {
        for (const HduSummary& h : listHdus(path.toStdString()))
            if (h.type == "IMAGE" && h.axes.size() == 2) {
                hdu = QString::number(h.index);
                break;
            }
        if (hdu.isEmpty()) throw InvalidInput(path.toStdString() + ": no 2-D image HDU");
    } catch (const std::exception& e) {
        m_following = path;
        m_framePath = path;
        return frameFailed(QString::fromStdString(e.what()));
    }
    m_following = path;
    openFrame(path, hdu);
}

// While following, a frame that cannot be read or reduced is a History row and a log entry, never a
// dialog (the workbench may be unattended), and the next frame goes on; otherwise the error is shown.
void MainWindow::frameFailed(const QString& message) {
    if (m_following.isEmpty() || m_following != m_framePath) return showError(message);
    m_log->append(LogLevel::Error, message);
    statusBar()->showMessage(message, 15000);
    addHistoryRow(
        {QStringLiteral("–"), QStringLiteral("–"), QStringLiteral("–"), tr("failed: %1").arg(message)});
    nextFollowedFrame();
}

void MainWindow::addHistoryRow(const QStringList& cells) {
    const int row = m_history->rowCount();
    m_history->insertRow(row);
    m_history->setItem(row, 0, new QTableWidgetItem(QFileInfo(m_framePath).fileName()));
    m_history->setItem(row, 1, new QTableWidgetItem(QTime::currentTime().toString()));
    for (int k = 0; k < cells.size(); ++k)
        m_history->setItem(row, 2 + k, new QTableWidgetItem(cells[k]));
    m_history->scrollToBottom();
}

} // namespace gpuphot::ui
