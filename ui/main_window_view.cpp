// The main window's DS9 viewing habits (README.md, Workbench): View-menu actions for the crosshair, the
// magnifier, the pixel-table dock, panning to typed coordinates, the view's flips and quarter turns and
// the coordinate grid, and the 2x2 super-pixel (debayered) view of raw colour-filter frames, in luminance or
// in colour.
// The image view does the work (viewers/image_view.hpp); this file only wires actions and docks.
#include <array>
#include <memory>
#include <optional>

#include <QAction>
#include <QDockWidget>
#include <QMenu>
#include <QMenuBar>
#include <QSignalBlocker>

#include "core/pipeline/run_context.hpp"
#include "core/stages/prepare/bayer.hpp"
#include "core/util/errors.hpp"
#include "core/wcs/wcs.hpp"
#include "ui/grid_layer.hpp"
#include "ui/log_panel.hpp"
#include "ui/main_window.hpp"
#include "ui/pan_dialog.hpp"
#include "ui/param_dock.hpp"
#include "ui/pixel_table.hpp"
#include "ui/run_scheduler.hpp"
#include "viewers/image_view.hpp"

namespace gpuphot::ui {

namespace {
QAction* addToggle(QMenu* menu, const QString& text, const QString& name, const QKeySequence& key) {
    QAction* a = menu->addAction(text);
    a->setObjectName(name);
    a->setCheckable(true);
    a->setShortcut(key);
    return a;
}
} // namespace

const Wcs* MainWindow::viewWcs() const {
    if (m_snapshot && m_snapshot->result.fittedWcs) return m_snapshot->result.fittedWcs.get();
    return m_frame ? m_frame->wcs.get() : nullptr;
}

void MainWindow::buildViewTools() {
    QMenu* view = nullptr;
    for (QAction* a : menuBar()->actions())
        if (a->menu() && a->menu()->title() == tr("&View")) view = a->menu();
    if (!view) view = menuBar()->addMenu(tr("&View"));
    view->addSeparator();
    QAction* cross = addToggle(view, tr("&Crosshair"), QStringLiteral("actionCrosshair"),
                               QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_C));
    connect(cross, &QAction::toggled, m_view, &viewers::ImageView::setCrosshair);
    QAction* magnifier = addToggle(view, tr("&Magnifier"), QStringLiteral("actionMagnifier"),
                                   QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_M));
    connect(magnifier, &QAction::toggled, m_view, &viewers::ImageView::setMagnifier);
    QAction* pan = view->addAction(tr("&Pan to coordinates..."), QKeySequence(Qt::CTRL | Qt::Key_G), this,
                                   [this] { showPanDialog(); });
    pan->setObjectName(QStringLiteral("actionPanTo"));
    // The grid follows the WCS the readout uses: the fitted one once a reduction has one.
    m_gridLayer = new GridLayer(m_view, [this] { return viewWcs(); });
    QAction* grid = addToggle(view, tr("Coordinate &grid"), QStringLiteral("actionCoordinateGrid"),
                              QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_G));
    connect(grid, &QAction::toggled, m_gridLayer, &GridLayer::setShown);
    connect(this, &MainWindow::frameShown, m_gridLayer, &GridLayer::refresh);
    connect(this, &MainWindow::snapshotShown, m_gridLayer, &GridLayer::refresh);
    buildOrientationActions(view);
    buildPixelTableDock(view);
    buildCfaAction(view);
}

void MainWindow::buildOrientationActions(QMenu* view) {
    QMenu* orient = view->addMenu(tr("&Orientation"));
    QAction* fx = addToggle(orient, tr("Flip &X"), QStringLiteral("actionFlipX"),
                            QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_H));
    QAction* fy = addToggle(orient, tr("Flip &Y"), QStringLiteral("actionFlipY"),
                            QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_V));
    connect(fx, &QAction::triggered, m_view, &viewers::ImageView::toggleFlipX);
    connect(fy, &QAction::triggered, m_view, &viewers::ImageView::toggleFlipY);
    QAction* rot = orient->addAction(tr("&Rotate 90 degrees"), QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_R),
                                     m_view, &viewers::ImageView::rotate90);
    rot->setObjectName(QStringLiteral("actionRotate90"));
    QAction* reset = orient->addAction(tr("&Normal orientation"), m_view,
                                       [this] { m_view->setOrientation(viewers::Orientation{}); });
    reset->setObjectName(QStringLiteral("actionOrientationReset"));
    // The check marks follow the view, whoever changed it.
    connect(m_view, &viewers::ImageView::viewChanged, fx, [this, fx, fy] {
        fx->setChecked(m_view->orientation().flipX);
        fy->setChecked(m_view->orientation().flipY);
    });
}

void MainWindow::buildPixelTableDock(QMenu* view) {
    auto* table = new PixelTable(m_view, this);
    auto* d = new QDockWidget(tr("Pixel table"), this);
    d->setObjectName(QStringLiteral("PixelTableDock"));
    d->setWidget(table);
    addDockWidget(Qt::RightDockWidgetArea, d);
    d->hide(); // shown from the View menu (restoreState brings back what the last session left)
    QAction* toggle = d->toggleViewAction();
    toggle->setObjectName(QStringLiteral("actionPixelTable"));
    toggle->setShortcut(QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_T));
    view->addAction(toggle);
    // A new frame's pixels under the same cursor position.
    connect(this, &MainWindow::frameShown, table, [this, table] {
        table->setPosition(m_view->cursorPosition().x(), m_view->cursorPosition().y());
    });
}

namespace {
// Whether a frame is a raw colour-filter-array frame (BAYERPAT, or FILTER naming a 2x2 pattern).
bool isCfaFrame(const Frame& frame) {
    try {
        return cfaLayoutFromHeader(frame.header).has_value();
    } catch (const InvalidInput&) { // a pattern keyword it cannot read: not offered
        return false;
    }
}
} // namespace

// A raw colour-filter frame shown as 2x2 super-pixels (Preparation's Bayer (CFA) "lum"): the run then
// measures those pixels, so the overlays stay on the image shown. Offered for CFA frames only; the check
// mark follows the parameter, whoever set it.
void MainWindow::buildCfaAction(QMenu* view) {
    QAction* cfa =
        addToggle(view, tr("Colour-filter frame as 2x2 &super-pixels"),
                  QStringLiteral("actionCfaSuperPixels"), QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_B));
    cfa->setEnabled(false);
    const auto sync = [this, cfa] {
        const QSignalBlocker block(cfa);
        cfa->setChecked(m_params->config().prepare.bayer != "none");
    };
    connect(m_params, &ParamDock::configChanged, cfa, sync);
    connect(this, &MainWindow::frameShown, cfa, [this, cfa, sync] {
        const bool raw = m_frame && isCfaFrame(*m_frame);
        cfa->setEnabled(raw);
        sync();
        if (raw && m_params->config().prepare.bayer == "none")
            m_log->append(LogLevel::Info, tr("a raw colour-filter frame: View > Colour-filter frame as 2x2 "
                                             "super-pixels shows and measures it debayered"));
    });
    connect(cfa, &QAction::triggered, this, [this](bool on) {
        PipelineConfig c = m_params->config();
        c.prepare.bayer = on ? "lum" : "none";
        m_params->setConfig(c);
        m_scheduler->schedule(c);
    });
    buildColourCompositeAction(view, cfa);
}

namespace {
// The red, green and blue planes of a raw colour-filter frame's 2x2 super-pixels (what the Bayer "lum"
// preparation sums); empty when the frame has no pattern.
std::array<std::shared_ptr<const Image<float>>, 3> colourPlanes(const Frame& raw, const BayerParams& params) {
    std::array<std::shared_ptr<const Image<float>>, 3> planes;
    const std::optional<CfaLayout> layout = cfaLayoutFromHeader(raw.header, params);
    if (!layout) return planes;
    RunContext ctx;
    const CfaOutput outputs[3] = {CfaOutput::Red, CfaOutput::Green, CfaOutput::Blue};
    for (std::size_t k = 0; k < 3; ++k)
        planes[k] = std::make_shared<const Image<float>>(
            cfaSuperPixels(raw.pixels.view(), *layout, outputs[k], false, ctx));
    return planes;
}
} // namespace

// The super-pixels of a raw colour-filter frame in colour: the view draws its red, green and blue planes
// (each with its own limits) instead of the luminance the run measures; offered while the frame is shown
// as super-pixels. The planes are made from the file's pixels (no bias, dark or flat) whenever the view
// takes a new image.
void MainWindow::buildColourCompositeAction(QMenu* view, QAction* superPixels) {
    QAction* colour = addToggle(view, tr("Super-pixels in &colour (RGB)"), QStringLiteral("actionCfaColour"),
                                QKeySequence(Qt::CTRL | Qt::SHIFT | Qt::Key_K));
    colour->setEnabled(false);
    const auto refresh = [this, colour, superPixels] {
        const bool offered = superPixels->isEnabled() && superPixels->isChecked();
        colour->setEnabled(offered);
        m_view->setColourShown(offered && colour->isChecked());
        if (!offered || !colour->isChecked() || m_view->hasColourPlanes() || !m_frame) return;
        const auto shown = m_view->image(); // the super-pixels once the run's prepared frame is shown
        if (!shown || shown->width() != m_frame->width() / 2 || shown->height() != m_frame->height() / 2) return;
        try {
            const auto p = colourPlanes(*m_frame, m_params->config().prepare.bayerParams);
            m_view->setColourPlanes(p[0], p[1], p[2]);
        } catch (const std::exception& e) {
            m_log->append(LogLevel::Warning, tr("colour super-pixels: %1").arg(QString::fromUtf8(e.what())));
        }
    };
    connect(colour, &QAction::toggled, this, refresh);
    connect(superPixels, &QAction::changed, this, refresh);
    connect(this, &MainWindow::provisionalShown, this, refresh);
    connect(this, &MainWindow::snapshotShown, this, refresh);
    connect(this, &MainWindow::frameShown, this, refresh);
}

PanDialog* MainWindow::showPanDialog() {
    auto* dialog = findChild<PanDialog*>();
    if (!dialog) {
        dialog = new PanDialog(
            m_view, [this] { return viewWcs(); }, this);
        dialog->setAttribute(Qt::WA_DeleteOnClose);
    }
    dialog->showCurrentCentre();
    dialog->show();
    dialog->raise();
    return dialog;
}

} // namespace gpuphot::ui
