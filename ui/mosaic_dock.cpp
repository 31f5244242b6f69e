// The main window's Mosaic dock (ui/mosaic_panel.hpp): shown while a mosaic exposure is open, its CCDs
// opened in the viewer when chosen, its reduction run with the parameter dock's configuration and the
// reference catalog the worker loaded.
#include <QDockWidget>
#include <QStatusBar>

#include "core/pipeline/exposure.hpp"
#include "ui/log_panel.hpp"
#include "ui/main_window.hpp"
#include "ui/mosaic_panel.hpp"
#include "ui/param_dock.hpp"
#include "ui/pipeline_worker.hpp"

namespace gpuphot::ui {

void MainWindow::buildMosaicDock() {
    m_mosaic = new MosaicPanel(this);
    m_mosaicDock = new QDockWidget(tr("Mosaic"), this);
    m_mosaicDock->setObjectName(QStringLiteral("MosaicDock"));
    m_mosaicDock->setWidget(m_mosaic);
    addDockWidget(Qt::BottomDockWidgetArea, m_mosaicDock);
    m_mosaicDock->hide();
    connect(m_mosaic, &MosaicPanel::ccdChosen, this,
            [this](int hdu) { openFrame(m_mosaic->path(), QString::number(hdu)); });
    connect(m_mosaic, &MosaicPanel::reduceRequested, this,
            [this] { m_mosaic->startReduction(m_params->config()); });
    connect(m_mosaic, &MosaicPanel::logMessage, this, [this](LogLevel level, const QString& text) {
        m_log->append(level, text);
        if (level == LogLevel::Error) statusBar()->showMessage(text, 15000);
    });
    connect(m_mosaic, &MosaicPanel::reductionFinished, this,
            [this](bool, const QString& message) { statusBar()->showMessage(message, 15000); });
    // The reduction uses the catalog the worker loaded (shared, immutable), not a second read of the file.
    connect(m_thread->worker(), &PipelineWorker::referenceLoaded, m_mosaic, &MosaicPanel::setReference);
}

bool MainWindow::openAsMosaic(const QString& path, QString& hdu) {
    // A CCD chosen in the panel (an HDU given, the exposure already shown) needs no new overview.
    const bool shown = !m_mosaic->path().isEmpty() && m_mosaic->path() == path;
    if (!shown || hdu.isEmpty()) {
        const std::vector<ExposureExtension> exts = exposureExtensions(path.toStdString(), "");
        if (exts.empty()) {
            m_mosaic->clear();
            m_mosaicDock->hide();
            return false;
        }
        m_mosaic->setExposure(path, exts);
        m_mosaicDock->show();
        m_mosaicDock->raise();
        m_log->append(LogLevel::Info, tr("%1: a mosaic exposure of %2 CCDs").arg(path).arg(exts.size()));
    }
    if (hdu.isEmpty()) hdu = QString::number(m_mosaic->rememberedHdu(path));
    return true;
}

} // namespace gpuphot::ui
