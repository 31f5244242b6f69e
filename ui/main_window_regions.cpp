// The main window's DS9 regions: File > Load / Save DS9 regions (core/io/ds9_regions.hpp), the regions
// layer over the image (ui/region_layer.hpp), statistics of the pixels inside each region
// (core/stages/aperture/region_stats.hpp) and forced aperture photometry at a Ctrl+click anywhere on the
// image (ui/click_photometry.hpp), shown in the Source panel.
#include <QAction>
#include <QActionGroup>
#include <QDialog>
#include <QDialogButtonBox>
#include <QDockWidget>
#include <QFileDialog>
#include <QHeaderView>
#include <QMenu>
#include <QMenuBar>
#include <QMouseEvent>
#include <QStatusBar>
#include <QTableWidget>
#include <QVBoxLayout>

#include <cmath>
#include <functional>

#include "core/io/ds9_regions.hpp"
#include "core/stages/aperture/region_stats.hpp"
#include "ui/click_photometry.hpp"
#include "ui/file_names.hpp"
#include "ui/log_panel.hpp"
#include "ui/main_window.hpp"
#include "ui/region_drawer.hpp"
#include "ui/region_layer.hpp"
#include "ui/source_inspector.hpp"
#include "viewers/image_view.hpp"

namespace gpuphot::ui {
namespace {

// Ctrl+left click on the view: the press and its release are taken from the view (no pan, no source
// pick); a release within a few pixels of the press reports the image position (0-based).
class CtrlClickFilter : public QObject {
public:
    CtrlClickFilter(viewers::ImageView* view, std::function<void(double, double)> onClick)
        : QObject(view), m_view(view), m_onClick(std::move(onClick)) {
        view->installEventFilter(this);
    }

protected:
    bool eventFilter(QObject* watched, QEvent* e) override {
        if (watched != m_view) return false;
        if (e->type() == QEvent::MouseButtonPress) {
            auto* m = static_cast<QMouseEvent*>(e);
            m_pressed = m->button() == Qt::LeftButton && (m->modifiers() & Qt::ControlModifier);
            m_pressPos = m->position();
            return m_pressed;
        }
        if (e->type() == QEvent::MouseButtonRelease && m_pressed) {
            auto* m = static_cast<QMouseEvent*>(e);
            m_pressed = false;
            if ((m->position() - m_pressPos).manhattanLength() < 4) {
                const QPointF p = m_view->widgetToImage(m->position());
                m_onClick(p.x(), p.y());
            }
            return true;
        }
        return false;
    }

private:
    viewers::ImageView* m_view;
    std::function<void(double, double)> m_onClick;
    bool m_pressed = false;
    QPointF m_pressPos;
};

QMenu* menuTitled(QMenuBar* bar, const QString& title) {
    for (QAction* a : bar->actions())
        if (a->menu() && a->menu()->title() == title) return a->menu();
    return nullptr;
}

QString number(double v, int decimals) {
    return std::isfinite(v) ? QString::number(v, 'f', decimals) : QStringLiteral("–");
}

} // namespace

void MainWindow::buildRegions() {
    m_regionLayer = new RegionLayer(m_view);
    new CtrlClickFilter(m_view, [this](double x, double y) { photometryAt(x, y); });
    connect(this, &MainWindow::snapshotShown, this, &MainWindow::updateRegionLayer);
    connect(this, &MainWindow::frameShown, this, &MainWindow::updateRegionLayer);

    QMenu* file = menuTitled(menuBar(), tr("&File"));
    QAction* before = nullptr; // after "Export DS9 regions..."
    for (int i = 0; file && i + 1 < file->actions().size(); ++i)
        if (file->actions()[i]->text() == tr("Export DS9 &regions...")) before = file->actions()[i + 1];
    auto add = [&](const QString& text, std::function<void()> f) {
        auto* a = new QAction(text, this);
        connect(a, &QAction::triggered, this, f);
        if (file) file->insertAction(before, a);
        return a;
    };
    add(tr("&Load DS9 regions..."), [this] {
        const QString p = QFileDialog::getOpenFileName(this, tr("DS9 regions"), QString(),
                                                       tr("Regions (*.reg);;All files (*)"));
        if (!p.isEmpty()) loadRegions(p);
    });
    add(tr("Save DS9 re&gions..."), [this] {
        const QString p = askSavePath(this, tr("DS9 regions"), tr("Regions (*.reg)"));
        if (!p.isEmpty()) saveRegions(p);
    });
    add(tr("Statistics in regions..."), [this] { showRegionStatistics(); });

    buildRegionDrawing();

    QAction* show = new QAction(tr("Show DS9 regions"), this);
    show->setObjectName(QStringLiteral("ShowRegionsAction"));
    show->setCheckable(true);
    show->setChecked(true);
    connect(show, &QAction::toggled, m_regionLayer, &RegionLayer::setShown);
    if (QMenu* view = menuTitled(menuBar(), tr("&View"))) view->addAction(show);
}

// The Region menu (before Help): the shape the mouse draws (DS9's Region > Shape), and deleting them all.
void MainWindow::buildRegionDrawing() {
    m_regionDrawer = new RegionDrawer(m_view);
    connect(m_regionDrawer, &RegionDrawer::previewChanged, this,
            [this] { m_regionLayer->setPreview(m_regionDrawer->preview()); });
    connect(m_regionDrawer, &RegionDrawer::regionDrawn, this, &MainWindow::addDrawnRegion);
    QMenu* menu = addMenuBeforeHelp(tr("Re&gion"));
    auto* shapes = new QActionGroup(this);
    const struct {
        QString text;
        RegionDrawer::Shape shape;
        QKeySequence key;
    } items[] = {{tr("&No drawing (the mouse pans)"), RegionDrawer::Shape::None, QKeySequence()},
                 {tr("Draw &circles"), RegionDrawer::Shape::Circle, QKeySequence(tr("Ctrl+Shift+1"))},
                 {tr("Draw &boxes"), RegionDrawer::Shape::Box, QKeySequence(tr("Ctrl+Shift+2"))},
                 {tr("Draw &polygons"), RegionDrawer::Shape::Polygon, QKeySequence(tr("Ctrl+Shift+3"))}};
    for (const auto& item : items) {
        QAction* a = menu->addAction(item.text);
        a->setCheckable(true);
        a->setChecked(item.shape == RegionDrawer::Shape::None);
        a->setShortcut(item.key);
        a->setData(static_cast<int>(item.shape));
        shapes->addAction(a);
        connect(a, &QAction::triggered, this, [this, shape = item.shape] {
            m_regionDrawer->setShape(shape);
            m_view->setFocus();
        });
    }
    connect(m_regionDrawer, &RegionDrawer::shapeChanged, this, [shapes](RegionDrawer::Shape shape) {
        for (QAction* a : shapes->actions())
            if (a->data().toInt() == static_cast<int>(shape)) a->setChecked(true);
    });
    menu->addSeparator();
    menu->addAction(tr("&Delete all regions"), this, [this] {
        m_regions.reset();
        updateRegionLayer();
        m_log->append(LogLevel::Info, tr("regions deleted"));
    });
}

// A region drawn with the mouse joins the regions (a new set when none is loaded); its statistics go to
// the status bar and the log.
void MainWindow::addDrawnRegion(const Region& region) {
    if (!m_regions) m_regions = std::make_shared<RegionFile>();
    m_regions->regions.push_back(region);
    updateRegionLayer();
    const char* names[] = {"circle", "box", "polygon", "point", "ellipse"};
    QString text = tr("%1 region drawn").arg(QLatin1String(names[static_cast<int>(region.shape)]));
    const std::shared_ptr<const Frame> frame = m_snapshot ? m_snapshot->frame : m_frame;
    try {
        if (!frame) throw InvalidInput("no frame");
        const BackgroundResult* bkg =
            m_snapshot && m_snapshot->frame ? &m_snapshot->result.background : nullptr;
        const RegionStats st =
            gpuphot::regionStatistics(frame->view(), frame->maskView(), toPixels(region, viewWcs()), bkg);
        text += tr(": %1 px, sum %2, mean %3, median %4, std %5")
                    .arg(st.pixels)
                    .arg(number(st.sum, 1), number(st.mean, 2), number(st.median, 2), number(st.stddev, 2));
    } catch (const std::exception& e) {
        text += tr(" (no statistics: %1)").arg(QString::fromStdString(e.what()));
    }
    statusBar()->showMessage(text, 15000);
    m_log->append(LogLevel::Info, text);
}

void MainWindow::updateRegionLayer() {
    if (!m_regions) {
        m_regionLayer->setOverlay({});
        return;
    }
    RegionOverlay o = buildRegionOverlay(*m_regions, viewWcs());
    for (const std::string& p : o.problems)
        m_log->append(LogLevel::Warning, tr("regions: %1").arg(QString::fromStdString(p)));
    m_regionLayer->setOverlay(std::move(o));
}

bool MainWindow::loadRegions(const QString& path) {
    try {
        m_regions = std::make_shared<RegionFile>(readDs9Regions(path.toStdString()));
    } catch (const std::exception& e) {
        showError(QString::fromStdString(e.what()));
        return false;
    }
    updateRegionLayer();
    m_log->append(LogLevel::Info, tr("%1 regions from %2 (%3 drawn)")
                                      .arg(m_regions->regions.size())
                                      .arg(path)
                                      .arg(m_regionLayer->shapeCount()));
    return true;
}

bool MainWindow::saveRegions(const QString& requested) {
    if (!m_regions) {
        showError(tr("no regions to save (File > Load DS9 regions, or draw some: Region menu)"));
        return false;
    }
    const QString path = outputPath(requested, QStringLiteral(".reg"));
    try {
        writeDs9RegionFile(path.toStdString(), *m_regions);
        confirmWritten(tr("%1 regions").arg(m_regions->regions.size()), path);
        return true;
    } catch (const std::exception& e) {
        showError(QString::fromStdString(e.what()));
        return false;
    }
}

std::vector<RegionStats> MainWindow::regionStatistics() {
    std::vector<RegionStats> out;
    const std::shared_ptr<const Frame> frame = m_snapshot ? m_snapshot->frame : m_frame;
    if (!m_regions || !frame) {
        showError(tr("load a frame and DS9 regions first"));
        return out;
    }
    const BackgroundResult* bkg = m_snapshot && m_snapshot->frame ? &m_snapshot->result.background : nullptr;
    QStringList problems;
    for (const Region& r : m_regions->regions) {
        if (r.shape == RegionShape::Point) continue;
        try {
            out.push_back(
                gpuphot::regionStatistics(frame->view(), frame->maskView(), toPixels(r, viewWcs()), bkg));
        } catch (const std::exception& e) {
            problems << tr("line %1: %2").arg(r.line).arg(QString::fromStdString(e.what()));
        }
    }
    for (const QString& p : problems)
        m_log->append(LogLevel::Warning, tr("region statistics: %1").arg(p));
    return out;
}

QDialog* MainWindow::showRegionStatistics() {
    const std::vector<RegionStats> stats = regionStatistics();
    if (stats.empty()) return nullptr;
    auto* dialog = new QDialog(this);
    dialog->setAttribute(Qt::WA_DeleteOnClose);
    dialog->setWindowTitle(tr("Statistics in regions"));
    auto* table = new QTableWidget(static_cast<int>(stats.size()), 11, dialog);
    table->setObjectName(QStringLiteral("RegionStatsTable"));
    table->setHorizontalHeaderLabels({tr("pixels"), tr("masked"), tr("sum"), tr("mean"), tr("median"),
                                      tr("std"), tr("min"), tr("max"), tr("sum − background"),
                                      tr("centroid x"), tr("centroid y")});
    table->setEditTriggers(QAbstractItemView::NoEditTriggers);
    for (std::size_t i = 0; i < stats.size(); ++i) {
        const RegionStats& s = stats[i];
        const QStringList cells = {QString::number(s.pixels),
                                   QString::number(s.masked),
                                   number(s.sum, 3),
                                   number(s.mean, 4),
                                   number(s.median, 4),
                                   number(s.stddev, 4),
                                   number(s.min, 4),
                                   number(s.max, 4),
                                   number(s.backgroundSubtractedSum, 3),
                                   number(s.centroidX + 1.0, 3),
                                   number(s.centroidY + 1.0, 3)};
        for (int c = 0; c < cells.size(); ++c)
            table->setItem(static_cast<int>(i), c, new QTableWidgetItem(cells[c]));
    }
    table->resizeColumnsToContents();
    auto* buttons = new QDialogButtonBox(QDialogButtonBox::Close, dialog);
    connect(buttons, &QDialogButtonBox::rejected, dialog, &QDialog::reject);
    auto* layout = new QVBoxLayout(dialog);
    layout->addWidget(table);
    layout->addWidget(buttons);
    dialog->resize(900, 260);
    dialog->open();
    return dialog;
}

bool MainWindow::photometryAt(double x, double y) {
    if (!m_snapshot || m_snapshot->provisional) {
        showError(tr("aperture photometry at a click needs a reduced frame"));
        return false;
    }
    feedAllPanels(); // a later feed would drop the click's measurement
    try {
        m_inspector->setClickPhotometry(measureAt(*m_snapshot, x, y));
    } catch (const std::exception& e) {
        showError(QString::fromStdString(e.what()));
        return false;
    }
    if (auto* dock = findChild<QDockWidget*>(QStringLiteral("SourceDock"))) dock->raise();
    return true;
}

} // namespace gpuphot::ui
