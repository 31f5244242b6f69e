#include "ui/plots_panel.hpp"

#include <qcustomplot.h>

#include <QCoreApplication>
#include <QFileDialog>
#include <QMenu>
#include <QPushButton>
#include <QTabWidget>
#include <QVBoxLayout>
#include <algorithm>
#include <cmath>
#include <numeric>

#include "ui/panel_data.hpp"
#include "ui/plot_aspect.hpp"

namespace gpuphot::ui {

namespace {
QString noResultText() {
    return QCoreApplication::translate("PlotsPanel", "no result yet: open a frame (File > Open frame...)");
}
} // namespace

namespace {
// The plot layout's rows: the title, the legend, the axis rect (simplify() drops an empty legend row).
int axisRow(QCustomPlot* p) {
    QCPLayoutGrid* grid = p->plotLayout();
    for (int r = 0; r < grid->rowCount(); ++r)
        if (grid->hasElement(r, 0) && grid->element(r, 0) == p->axisRect()) return r;
    return grid->rowCount() - 1;
}
constexpr int kLegendRow = 1;
// The legend's row is empty (and takes no height) while the plot has no legend.
void showLegend(QCustomPlot* p, bool on) {
    p->legend->setVisible(on);
    QCPLayoutGrid* grid = p->plotLayout();
    const bool placed = grid->hasElement(kLegendRow, 0) && grid->element(kLegendRow, 0) == p->legend;
    if (on && !placed) {
        if (axisRow(p) == kLegendRow) grid->insertRow(kLegendRow); // dropped by simplify()
        grid->addElement(kLegendRow, 0, p->legend);
    }
    if (!on && placed) grid->take(p->legend);
}

constexpr const char* kTabNames[PlotsPanel::kPlotCount] = {
    "ZP vs mag",           "ZP vs colour", "Astrometry vs x", "Astrometry vs y",
    "Astrometric vectors", "S/N",          "Background"};

const QColor kUsed(31, 119, 180);
const QColor kClipped(214, 39, 40);
const QColor kDec(44, 160, 44);
const QColor kDecClipped(255, 127, 14);
const QColor kFit(0, 0, 0);

int idx(PlotsPanel::Plot p) {
    return static_cast<int>(p);
}

std::pair<double, double> finiteMinMax(std::initializer_list<const std::vector<double>*> lists) {
    double lo = std::numeric_limits<double>::infinity(), hi = -lo;
    for (const auto* v : lists)
        for (double a : *v)
            if (std::isfinite(a)) {
                lo = std::min(lo, a);
                hi = std::max(hi, a);
            }
    if (lo > hi) return {0.0, 1.0};
    if (lo == hi) return {lo - 0.5, hi + 0.5};
    return {lo, hi};
}

QCPRange padded(std::pair<double, double> r, double frac = 0.05) {
    const double d = (r.second - r.first) * frac;
    return {r.first - d, r.second + d};
}

} // namespace

PlotsPanel::PlotsPanel(QWidget* parent) : QWidget(parent) {
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    m_tabs = new QTabWidget(this);
    layout->addWidget(m_tabs);
    auto* exportButton = new QPushButton(tr("Export…"), m_tabs);
    exportButton->setToolTip(tr("Save the current plot as PNG or PDF"));
    auto* exportMenu = new QMenu(exportButton);
    exportMenu->addAction(tr("PNG…"), this, [this] { exportWithDialog(currentPlot(), false); });
    exportMenu->addAction(tr("PDF…"), this, [this] { exportWithDialog(currentPlot(), true); });
    exportButton->setMenu(exportMenu);
    m_tabs->setCornerWidget(exportButton, Qt::TopRightCorner);

    for (int k = 0; k < kPlotCount; ++k) {
        auto* p = new QCustomPlot(m_tabs);
        p->setObjectName(QString::fromLatin1(kTabNames[k]));
        p->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
        p->plotLayout()->insertRow(0);
        m_titles[k] = new QCPTextElement(p, QString(), QFont(font().family(), 9));
        p->plotLayout()->addElement(0, 0, m_titles[k]);
        // The legend in a row of its own under the title, laid out across: inside the axis rect it
        // covered data (the residual vectors, the zero-point points).
        p->axisRect()->insetLayout()->take(p->legend);
        p->plotLayout()->insertRow(kLegendRow);
        p->plotLayout()->setRowStretchFactor(kLegendRow, 0.001);
        p->legend->setFillOrder(QCPLegend::foColumnsFirst);
        p->legend->setBorderPen(Qt::NoPen);
        m_emptyText[k] = new QCPItemText(p);
        m_emptyText[k]->position->setType(QCPItemPosition::ptAxisRectRatio);
        m_emptyText[k]->position->setCoords(0.5, 0.5);
        m_emptyText[k]->setFont(QFont(font().family(), 11));
        m_emptyText[k]->setColor(Qt::darkGray);
        m_emptyText[k]->setVisible(false);
        m_emptyText[k]->setClipToAxisRect(false);
        p->setContextMenuPolicy(Qt::CustomContextMenu);
        const Plot which = static_cast<Plot>(k);
        connect(p, &QWidget::customContextMenuRequested, this,
                [this, which](const QPoint& pos) { showContextMenu(which, pos); });
        connect(p, &QCustomPlot::plottableClick, this, &PlotsPanel::onPlottableClick);
        m_plots[k] = p;
        m_tabs->addTab(p, tr(kTabNames[k]));
    }
    rebuild();
}

PlotsPanel::~PlotsPanel() = default;

QCustomPlot* PlotsPanel::plot(Plot which) const {
    return m_plots[idx(which)];
}
QString PlotsPanel::plotTitle(Plot which) const {
    return m_titles[idx(which)]->text();
}
QString PlotsPanel::emptyReason(Plot which) const {
    return m_empty[idx(which)];
}
void PlotsPanel::setCurrentPlot(Plot which) {
    m_tabs->setCurrentIndex(idx(which));
}
PlotsPanel::Plot PlotsPanel::currentPlot() const {
    return static_cast<Plot>(std::max(0, m_tabs->currentIndex()));
}

void PlotsPanel::setSnapshot(SnapshotPtr snapshot) {
    m_snapshot = std::move(snapshot);
    rebuild();
}

void PlotsPanel::setSelectedSource(int index) {
    if (index == m_selected) return;
    m_selected = index;
    updateSelection();
}

void PlotsPanel::setVectorExaggeration(double factor) {
    m_requestedExaggeration = factor;
    buildAstrometry();
    updateSelection();
}

bool PlotsPanel::exportCurrent(const QString& path) {
    return exportPlot(currentPlot(), path);
}

bool PlotsPanel::exportPlot(Plot which, const QString& path) {
    QCustomPlot* p = plot(which);
    // an unshown widget has no size yet: export at a sensible default
    const int w = p->width() > 50 ? 0 : 800, h = p->height() > 50 ? 0 : 600;
    if (path.endsWith(QStringLiteral(".pdf"), Qt::CaseInsensitive)) return p->savePdf(path, w, h);
    return p->savePng(path, w, h);
}

void PlotsPanel::exportWithDialog(Plot which, bool pdf) {
    const QString suggested = QString::fromLatin1(kTabNames[idx(which)])
                                  .replace(QLatin1Char(' '), QLatin1Char('_'))
                                  .remove(QLatin1Char('/')) +
                              (pdf ? QStringLiteral(".pdf") : QStringLiteral(".png"));
    const QString path = QFileDialog::getSaveFileName(this, tr("Export plot"), suggested,
                                                      pdf ? tr("PDF (*.pdf)") : tr("PNG image (*.png)"));
    if (path.isEmpty()) return;
    exportPlot(which, path);
}

void PlotsPanel::showContextMenu(Plot which, const QPoint& pos) {
    QMenu menu(this);
    menu.addAction(tr("Export PNG…"), this, [this, which] { exportWithDialog(which, false); });
    menu.addAction(tr("Export PDF…"), this, [this, which] { exportWithDialog(which, true); });
    menu.addSeparator();
    menu.addAction(tr("Reset view"), this, [this] { rebuild(); });
    menu.exec(plot(which)->mapToGlobal(pos));
}

void PlotsPanel::setEmpty(Plot which, const QString& why) {
    m_empty[idx(which)] = why;
    m_emptyText[idx(which)]->setText(why);
    m_emptyText[idx(which)]->setVisible(!why.isEmpty());
}

void PlotsPanel::setTitle(Plot which, const QString& text) {
    m_titles[idx(which)]->setText(text);
}

QCPGraph* PlotsPanel::addScatter(Plot which, const QString& name, const std::vector<double>& keys,
                                 const std::vector<double>& values, const std::vector<int>& sources,
                                 int shape, const QColor& colour, double size) {
    QCustomPlot* p = plot(which);
    QCPGraph* g = p->addGraph();
    g->setName(name);
    g->setLineStyle(QCPGraph::lsNone);
    g->setScatterStyle(QCPScatterStyle(static_cast<QCPScatterStyle::ScatterShape>(shape), colour, size));
    std::vector<std::size_t> order;
    for (std::size_t k = 0; k < keys.size() && k < values.size(); ++k)
        if (std::isfinite(keys[k]) && std::isfinite(values[k])) order.push_back(k);
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return keys[a] < keys[b]; });
    QVector<QCPGraphData> data;
    data.reserve(static_cast<int>(order.size()));
    std::vector<int> src;
    src.reserve(order.size());
    for (std::size_t k : order) {
        data.append(QCPGraphData(keys[k], values[k]));
        src.push_back(k < sources.size() ? sources[k] : -1);
    }
    g->data()->set(data, true);
    m_pointSources.insert(g, std::move(src));
    return g;
}

void PlotsPanel::onPlottableClick(QCPAbstractPlottable* plottable, int, QMouseEvent* event) {
    // The topmost plottable under the cursor may be a fit line or a vector: take the nearest point of
    // the point sets of that plot instead (within 8 px).
    QCustomPlot* p = plottable ? plottable->parentPlot() : nullptr;
    if (!p || !event) return;
    const QPointF pos = event->position();
    double best = 8.0 * 8.0;
    int source = -1;
    for (auto it = m_pointSources.cbegin(); it != m_pointSources.cend(); ++it) {
        auto* graph = qobject_cast<QCPGraph*>(it.key());
        if (!graph || graph->parentPlot() != p || !graph->visible()) continue;
        const QCPAxis* kx = graph->keyAxis();
        const QCPAxis* vy = graph->valueAxis();
        int k = 0;
        for (auto d = graph->data()->constBegin(); d != graph->data()->constEnd(); ++d, ++k) {
            const double dx = kx->coordToPixel(d->key) - pos.x(), dy = vy->coordToPixel(d->value) - pos.y();
            if (dx * dx + dy * dy < best && static_cast<std::size_t>(k) < it->size()) {
                best = dx * dx + dy * dy;
                source = (*it)[static_cast<std::size_t>(k)];
            }
        }
    }
    if (source < 0) return;
    setSelectedSource(source);
    emit sourceSelected(source);
}

void PlotsPanel::rebuild() {
    m_pointSources.clear();
    m_arrowHeads.clear(); // removed with the other items below
    for (QCustomPlot* p : m_plots) {
        p->clearGraphs();
        p->clearPlottables();
        // keep the empty-state text (item 0); remove lines and other items of the previous snapshot
        for (int k = p->itemCount() - 1; k >= 0; --k)
            if (!std::count(std::begin(m_emptyText), std::end(m_emptyText), p->item(k))) p->removeItem(k);
        p->xAxis->setScaleType(QCPAxis::stLinear);
        p->yAxis->setScaleType(QCPAxis::stLinear);
        p->xAxis->setTicker(QSharedPointer<QCPAxisTicker>(new QCPAxisTicker));
        p->yAxis->setTicker(QSharedPointer<QCPAxisTicker>(new QCPAxisTicker));
        showLegend(p, false);
    }
    // colour scales live in the layout: drop those of the previous snapshot
    QCustomPlot* bg = plot(Plot::Background);
    for (int k = bg->plotLayout()->elementCount() - 1; k >= 0; --k)
        if (qobject_cast<QCPColorScale*>(bg->plotLayout()->elementAt(k))) bg->plotLayout()->removeAt(k);
    bg->plotLayout()->simplify();
    buildZeroPoint();
    buildAstrometry();
    buildSnr();
    buildBackground();
    updateSelection();
}

void PlotsPanel::buildZeroPoint() {
    const Plot pm = Plot::ZeroPointVsMag, pc = Plot::ZeroPointVsColour;
    for (Plot w : {pm, pc}) {
        plot(w)->yAxis->setLabel(tr("ref mag − mag_inst"));
        setTitle(w, tr("Zero point"));
    }
    plot(pm)->xAxis->setLabel(tr("reference magnitude"));
    plot(pc)->xAxis->setLabel(tr("reference colour"));
    if (!m_snapshot) {
        setEmpty(pm, noResultText());
        setEmpty(pc, noResultText());
        for (Plot w : {pm, pc})
            plot(w)->replot();
        return;
    }
    const ZeroPointPlotData d = zeroPointPlotData(*m_snapshot);
    if (!d.available) {
        setEmpty(pm, QString::fromStdString(d.why));
        setEmpty(pc, QString::fromStdString(d.why));
        for (Plot w : {pm, pc})
            plot(w)->replot();
        return;
    }
    setEmpty(pm, QString());
    setTitle(pm, QString::fromStdString(d.summary));
    setTitle(pc, QString::fromStdString(d.summary));
    if (d.colourTermFitted) plot(pm)->yAxis->setLabel(tr("ref mag − mag_inst − ct·colour"));
    addScatter(pm, tr("used"), d.used.refMag, d.used.offset, d.used.sourceIndex, QCPScatterStyle::ssDisc,
               kUsed, 5);
    addScatter(pm, tr("clipped"), d.clipped.refMag, d.clipped.offset, d.clipped.sourceIndex,
               QCPScatterStyle::ssCross, kClipped, 7);
    const auto mr = finiteMinMax({&d.used.refMag, &d.clipped.refMag});
    const auto yr = finiteMinMax({&d.used.offset, &d.clipped.offset});
    if (d.fitOk) {
        QCPGraph* fit = plot(pm)->addGraph();
        fit->setName(tr("fit"));
        fit->setPen(QPen(kFit, 1.5));
        const QCPRange xr = padded(mr);
        fit->setData({xr.lower, xr.upper}, {d.zp, d.zp}, true);
        for (double s : {-1.0, 1.0}) {
            if (!(d.scatter > 0)) break;
            QCPGraph* band = plot(pm)->addGraph();
            band->setName(tr("fit ± scatter"));
            band->setPen(QPen(kFit, 1, Qt::DashLine));
            band->setData({xr.lower, xr.upper}, {d.zp + s * d.scatter, d.zp + s * d.scatter}, true);
            if (s > 0) band->removeFromLegend();
        }
    }
    plot(pm)->xAxis->setRange(padded(mr));
    // a robust y range: the used points with some room; clipped outliers may leave it
    const auto ur = finiteMinMax({&d.used.offset});
    plot(pm)->yAxis->setRange(padded(d.used.size() ? ur : yr, 0.3));
    showLegend(plot(pm), true);
    plot(pm)->replot();

    if (!d.hasColour) {
        setEmpty(pc, tr("the reference catalog has no colour"));
        plot(pc)->replot();
        return;
    }
    setEmpty(pc, QString());
    addScatter(pc, tr("used"), d.used.colour, d.used.offsetRaw, d.used.sourceIndex, QCPScatterStyle::ssDisc,
               kUsed, 5);
    addScatter(pc, tr("clipped"), d.clipped.colour, d.clipped.offsetRaw, d.clipped.sourceIndex,
               QCPScatterStyle::ssCross, kClipped, 7);
    const auto cr = padded(finiteMinMax({&d.used.colour, &d.clipped.colour}));
    if (d.fitOk) {
        QCPGraph* fit = plot(pc)->addGraph();
        fit->setName(d.colourTermFitted ? tr("zp + ct·colour") : tr("zp (no colour term)"));
        fit->setPen(QPen(kFit, 1.5));
        fit->setData({cr.lower, cr.upper}, {d.zp + d.colourTerm * cr.lower, d.zp + d.colourTerm * cr.upper},
                     true);
    }
    plot(pc)->xAxis->setRange(cr);
    plot(pc)->yAxis->setRange(
        padded(finiteMinMax({d.used.size() ? &d.used.offsetRaw : &d.clipped.offsetRaw}), 0.3));
    showLegend(plot(pc), true);
    plot(pc)->replot();
}

void PlotsPanel::buildAstrometry() {
    const Plot px = Plot::AstrometryVsX, py = Plot::AstrometryVsY, pv = Plot::AstrometryVectors;
    for (Plot w : {px, py, pv}) {
        QCustomPlot* p = plot(w);
        // buildAstrometry may run alone (exaggeration change): drop its previous graphs
        for (int k = p->plottableCount() - 1; k >= 0; --k) {
            m_pointSources.remove(p->plottable(k));
            p->removePlottable(k);
        }
        setTitle(w, tr("Astrometric residuals"));
    }
    for (QCPItemLine* head : m_arrowHeads)
        plot(pv)->removeItem(head);
    m_arrowHeads.clear();
    plot(px)->xAxis->setLabel(tr("x (px)"));
    plot(py)->xAxis->setLabel(tr("y (px)"));
    for (Plot w : {px, py})
        plot(w)->yAxis->setLabel(tr("residual (arcsec), fitted − reference"));
    plot(pv)->xAxis->setLabel(tr("x (px)"));
    plot(pv)->yAxis->setLabel(tr("y (px)"));
    if (!m_snapshot) {
        for (Plot w : {px, py, pv}) {
            setEmpty(w, noResultText());
            plot(w)->replot();
        }
        return;
    }
    const AstrometryPlotData d = astrometryPlotData(*m_snapshot);
    if (!d.available) {
        for (Plot w : {px, py, pv}) {
            setEmpty(w, QString::fromStdString(d.why));
            plot(w)->replot();
        }
        return;
    }
    const QString summary = QString::fromStdString(d.summary);
    for (Plot w : {px, py, pv}) {
        setEmpty(w, QString());
        setTitle(w, summary);
    }
    const auto resRange =
        padded(finiteMinMax({&d.used.dRa, &d.used.dDec, &d.clipped.dRa, &d.clipped.dDec}), 0.1);
    for (Plot w : {px, py}) {
        const bool vsX = w == px;
        const auto& uk = vsX ? d.used.x : d.used.y;
        const auto& ck = vsX ? d.clipped.x : d.clipped.y;
        addScatter(w, tr("ΔRA cos δ"), uk, d.used.dRa, d.used.sourceIndex, QCPScatterStyle::ssDisc, kUsed, 4);
        addScatter(w, tr("ΔDec"), uk, d.used.dDec, d.used.sourceIndex, QCPScatterStyle::ssDisc, kDec, 4);
        addScatter(w, tr("ΔRA clipped"), ck, d.clipped.dRa, d.clipped.sourceIndex, QCPScatterStyle::ssCross,
                   kClipped, 7);
        addScatter(w, tr("ΔDec clipped"), ck, d.clipped.dDec, d.clipped.sourceIndex, QCPScatterStyle::ssCross,
                   kDecClipped, 7);
        const double side = vsX ? d.width : d.height;
        QCPGraph* zero = plot(w)->addGraph();
        zero->setName(tr("zero"));
        zero->setPen(QPen(kFit, 1, Qt::DashLine));
        zero->setData({-0.5, side - 0.5}, {0.0, 0.0}, true);
        zero->removeFromLegend();
        plot(w)->xAxis->setRange(-0.5, side - 0.5);
        plot(w)->yAxis->setRange(resRange);
        showLegend(plot(w), true);
        plot(w)->replot();
    }
    m_exaggeration = m_requestedExaggeration > 0 ? m_requestedExaggeration : autoVectorExaggeration(d);
    setTitle(pv, summary + tr("; vectors × %1").arg(m_exaggeration));
    QCustomPlot* p = plot(pv);
    int nVectors = 0;
    for (const AstrometryPoints* pts : {&d.used, &d.clipped})
        for (std::size_t k = 0; k < pts->size(); ++k)
            nVectors += std::isfinite(pts->dxPx[k]) && std::isfinite(pts->dyPx[k]);
    const bool heads = nVectors <= kMaxArrowHeads;
    for (int set = 0; set < 2; ++set) {
        const AstrometryPoints& pts = set == 0 ? d.used : d.clipped;
        const QColor colour = set == 0 ? kUsed : kClipped;
        auto* curve = new QCPCurve(p->xAxis, p->yAxis);
        curve->setName(set == 0 ? tr("vectors") : tr("vectors clipped"));
        curve->setPen(QPen(colour, 1));
        QVector<double> cx, cy;
        for (std::size_t k = 0; k < pts.size(); ++k) {
            if (!std::isfinite(pts.dxPx[k]) || !std::isfinite(pts.dyPx[k])) continue;
            const double ex = pts.x[k] + m_exaggeration * pts.dxPx[k],
                         ey = pts.y[k] + m_exaggeration * pts.dyPx[k];
            cx << pts.x[k] << ex << qQNaN();
            cy << pts.y[k] << ey << qQNaN();
            if (heads && (pts.dxPx[k] != 0.0 || pts.dyPx[k] != 0.0)) {
                // The head: an item over the last 5% of the shaft (the curve draws the shaft), so it points
                // along the vector on screen whatever the axes' scales; sized in screen pixels.
                auto* head = new QCPItemLine(p);
                head->setObjectName(QStringLiteral("arrowHead"));
                head->setSelectable(false);
                head->setPen(QPen(colour, 1));
                head->start->setCoords(ex - 0.05 * m_exaggeration * pts.dxPx[k],
                                       ey - 0.05 * m_exaggeration * pts.dyPx[k]);
                head->end->setCoords(ex, ey);
                head->setHead(
                    QCPLineEnding(QCPLineEnding::esSpikeArrow, 5, 6)); // px: small, many vectors are short
                m_arrowHeads.push_back(head);
            }
        }
        curve->setData(cx, cy);
        curve->removeFromLegend();
        addScatter(pv, set == 0 ? tr("used") : tr("clipped"), pts.x, pts.y, pts.sourceIndex,
                   set == 0 ? QCPScatterStyle::ssDisc : QCPScatterStyle::ssCross, colour, set == 0 ? 3 : 6);
    }
    keepEqualAspect(p, QCPRange(-0.5, d.width - 0.5), QCPRange(-0.5, d.height - 0.5));
    showLegend(p, true);
    p->replot();
}

void PlotsPanel::buildSnr() {
    const Plot w = Plot::SnrVsMag;
    QCustomPlot* p = plot(w);
    setTitle(w, tr("S/N vs magnitude"));
    p->yAxis->setLabel(tr("S/N (flux_opt)"));
    p->xAxis->setLabel(tr("magnitude"));
    if (!m_snapshot) {
        setEmpty(w, noResultText());
        p->replot();
        return;
    }
    const SnrPlotData d = snrPlotData(*m_snapshot);
    if (!d.available) {
        setEmpty(w, QString::fromStdString(d.why));
        p->replot();
        return;
    }
    setEmpty(w, QString());
    setTitle(w, snrTitle(d));
    p->xAxis->setLabel(d.calibrated ? tr("calibrated magnitude") : tr("instrumental magnitude"));
    addScatter(w, tr("sources"), d.mag, d.snr, d.sourceIndex, QCPScatterStyle::ssDisc, kUsed, 3);
    p->yAxis->setScaleType(QCPAxis::stLogarithmic);
    p->yAxis->setTicker(QSharedPointer<QCPAxisTickerLog>(new QCPAxisTickerLog));
    // both axes stay on the data (with a margin): the guides below never widen them
    const auto [slo, shi] = finiteMinMax({&d.snr});
    p->yAxis->setRange(slo * 0.7, shi * 1.5);
    const QCPRange xr = padded(finiteMinMax({&d.mag}));
    p->xAxis->setRange(xr);
    if (slo * 0.7 < 5.0 && 5.0 < shi * 1.5) {
        auto* five = new QCPItemStraightLine(p);
        five->setObjectName(QStringLiteral("snr5"));
        five->point1->setCoords(0, 5);
        five->point2->setCoords(1, 5);
        five->setPen(QPen(Qt::gray, 1, Qt::DashLine));
    }
    if (std::isfinite(d.limitingMag)) addLimitingMag(d.limitingMag, xr);
    p->replot();
}

QString PlotsPanel::snrTitle(const SnrPlotData& d) const {
    // as many sources as the catalog table has rows; those without a positive, finite S/N are named
    const PipelineResult& r = m_snapshot->result;
    const std::size_t total = std::max({r.detection.sources.size(), r.magInst.size(), d.mag.size()});
    const std::size_t missing = total - d.mag.size();
    QString text = total == 1 ? tr("1 source") : tr("%1 sources").arg(total);
    if (missing > 0) text += tr(", %1 without S/N").arg(missing);
    text += d.calibrated ? tr("; calibrated magnitudes") : tr("; instrumental magnitudes");
    text += tr("; limiting magnitude (S/N 5) ");
    text += std::isfinite(d.limitingMag) ? QString::number(d.limitingMag, 'f', 2) : tr("not determinable");
    return text;
}

void PlotsPanel::addLimitingMag(double limit, const QCPRange& xr) {
    // Inside the plotted magnitudes: a line at the limit. Beyond them the axis is not widened: the label
    // sits at the edge on the limit's side and says where the limit is.
    QCustomPlot* p = plot(Plot::SnrVsMag);
    const bool inside = xr.contains(limit);
    if (inside) {
        auto* lim = new QCPItemStraightLine(p);
        lim->setObjectName(QStringLiteral("limitingMag"));
        lim->point1->setCoords(limit, 1);
        lim->point2->setCoords(limit, 10);
        lim->setPen(QPen(kClipped, 1.5));
    }
    const bool right = limit > xr.center();
    auto* label = new QCPItemText(p);
    label->setObjectName(QStringLiteral("limitingMagLabel"));
    label->position->setTypeX(QCPItemPosition::ptPlotCoords);
    label->position->setTypeY(QCPItemPosition::ptAxisRectRatio);
    label->position->setCoords(inside ? limit : (right ? xr.upper : xr.lower), 0.05);
    label->setPositionAlignment((inside || right ? Qt::AlignRight : Qt::AlignLeft) | Qt::AlignTop);
    const QString value = QString::number(limit, 'f', 2);
    label->setText(inside ? tr("limit %1 ").arg(value)
                          : (right ? tr("limit %1 → ").arg(value) : tr(" ← limit %1").arg(value)));
    label->setColor(kClipped);
}

void PlotsPanel::buildBackground() {
    const Plot w = Plot::Background;
    QCustomPlot* p = plot(w);
    setTitle(w, tr("Background level (ADU)"));
    p->xAxis->setLabel(tr("x (px)"));
    p->yAxis->setLabel(tr("y (px)"));
    if (!m_snapshot) {
        setEmpty(w, noResultText());
        p->replot();
        return;
    }
    const MapData m = backgroundMap(m_snapshot->result.background);
    if (m.empty()) {
        setEmpty(w, tr("the background stage did not run"));
        p->replot();
        return;
    }
    setEmpty(w, QString());
    auto* map = new QCPColorMap(p->xAxis, p->yAxis);
    map->setName(tr("background"));
    map->data()->setSize(m.nx, m.ny);
    map->data()->setRange(QCPRange(m.xCentre(0), m.xCentre(m.nx - 1)),
                          QCPRange(m.yCentre(0), m.yCentre(m.ny - 1)));
    for (int j = 0; j < m.ny; ++j)
        for (int i = 0; i < m.nx; ++i)
            map->data()->setCell(i, j, m.at(i, j));
    auto* scale = new QCPColorScale(p);
    p->plotLayout()->addElement(axisRow(p), 1, scale);
    scale->setType(QCPAxis::atRight);
    scale->axis()->setLabel(tr("ADU"));
    map->setColorScale(scale);
    map->setGradient(QCPColorGradient(QCPColorGradient::gpThermal));
    map->setDataRange(QCPRange(m.minValue, m.maxValue > m.minValue ? m.maxValue : m.minValue + 1));
    auto* group = new QCPMarginGroup(p);
    p->axisRect()->setMarginGroup(QCP::msBottom | QCP::msTop, group);
    scale->setMarginGroup(QCP::msBottom | QCP::msTop, group);
    const int width = m_snapshot->frame ? m_snapshot->frame->width() : static_cast<int>(m.nx * m.dx);
    const int height = m_snapshot->frame ? m_snapshot->frame->height() : static_cast<int>(m.ny * m.dy);
    keepEqualAspect(p, QCPRange(-0.5, width - 0.5), QCPRange(-0.5, height - 0.5));
    setTitle(w, tr("Background level (ADU): %1 … %2, %3 × %4 cells")
                    .arg(m.minValue, 0, 'f', 1)
                    .arg(m.maxValue, 0, 'f', 1)
                    .arg(m.nx)
                    .arg(m.ny));
    p->replot();
}

void PlotsPanel::updateSelection() {
    for (int k = 0; k < kPlotCount; ++k) {
        QCustomPlot* p = m_plots[k];
        if (k == idx(Plot::Background)) continue;
        QCPGraph* sel = nullptr;
        for (int g = 0; g < p->graphCount(); ++g)
            if (p->graph(g)->name() == QLatin1String("selected")) sel = p->graph(g);
        if (!sel) {
            sel = p->addGraph();
            sel->setName(QStringLiteral("selected"));
            sel->setLineStyle(QCPGraph::lsNone);
            sel->setScatterStyle(
                QCPScatterStyle(QCPScatterStyle::ssCircle, QPen(QColor(255, 0, 255), 2), Qt::NoBrush, 13));
            sel->removeFromLegend();
        }
        QVector<QCPGraphData> data;
        if (m_selected >= 0)
            for (auto it = m_pointSources.cbegin(); it != m_pointSources.cend(); ++it) {
                auto* graph = qobject_cast<QCPGraph*>(it.key());
                if (!graph || graph->parentPlot() != p) continue;
                for (std::size_t d = 0; d < it->size(); ++d)
                    if ((*it)[d] == m_selected) {
                        const auto point = graph->data()->at(static_cast<int>(d));
                        data.append(QCPGraphData(point->key, point->value));
                    }
            }
        std::sort(data.begin(), data.end(),
                  [](const QCPGraphData& a, const QCPGraphData& b) { return a.key < b.key; });
        sel->data()->set(data, true);
        p->replot(QCustomPlot::rpQueuedReplot);
    }
}

} // namespace gpuphot::ui
