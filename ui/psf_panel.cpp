#include "ui/psf_panel.hpp"

#include <qcustomplot.h>

#include <QComboBox>
#include <QGridLayout>
#include <QLabel>
#include <algorithm>
#include <cmath>

#include "ui/panel_data.hpp"
#include "ui/plot_aspect.hpp"

namespace gpuphot::ui {

namespace {
constexpr int kStampPixels = 180;
}

PsfPanel::PsfPanel(QWidget* parent) : QWidget(parent) {
    auto* grid = new QGridLayout(this);
    m_stampLabel = new QLabel(this);
    m_stampLabel->setFixedSize(kStampPixels, kStampPixels);
    m_stampLabel->setAlignment(Qt::AlignCenter);
    m_stampLabel->setWordWrap(true); // a message, not clipped, when there is no stamp
    m_stampLabel->setStyleSheet(QStringLiteral("background: black; color: gray"));
    m_stampLabel->setToolTip(tr("ePSF of the nearest grid cell (oversampled, asinh stretch)"));
    m_info = new QLabel(this);
    m_info->setWordWrap(true);
    m_info->setTextInteractionFlags(Qt::TextSelectableByMouse);
    m_kindBox = new QComboBox(this);
    m_kindBox->addItem(tr("FWHM map"));
    m_kindBox->addItem(tr("Ellipticity map"));
    connect(m_kindBox, &QComboBox::currentIndexChanged, this,
            [this](int k) { setMapKind(static_cast<MapKind>(k)); });

    m_profile = new QCustomPlot(this);
    m_profile->setObjectName(QStringLiteral("psfProfile"));
    m_profile->plotLayout()->insertRow(0);
    m_profileTitle = new QCPTextElement(m_profile, tr("Radial profile"), QFont(font().family(), 9));
    m_profile->plotLayout()->addElement(0, 0, m_profileTitle);
    m_profile->xAxis->setLabel(tr("radius (px)"));
    m_profile->yAxis->setLabel(tr("fraction of flux per pixel"));
    m_profile->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);
    m_profile->setMinimumSize(240, 180);

    m_map = new QCustomPlot(this);
    m_map->setObjectName(QStringLiteral("psfMap"));
    m_map->plotLayout()->insertRow(0);
    m_mapTitle = new QCPTextElement(m_map, tr("PSF across the field"), QFont(font().family(), 9));
    m_map->plotLayout()->addElement(0, 0, m_mapTitle);
    m_map->xAxis->setLabel(tr("x (px)"));
    m_map->yAxis->setLabel(tr("y (px)"));
    m_map->setMinimumSize(240, 200);
    connect(m_map, &QCustomPlot::mousePress, this, [this](QMouseEvent* e) {
        if (!m_snapshot || m_map->plottableCount() == 0) return;
        const double x = m_map->xAxis->pixelToCoord(e->position().x());
        const double y = m_map->yAxis->pixelToCoord(e->position().y());
        setPosition(x, y);
        emit positionChosen(x, y);
    });

    grid->addWidget(m_stampLabel, 0, 0);
    grid->addWidget(m_profile, 0, 1);
    grid->addWidget(m_info, 1, 0);
    grid->addWidget(m_kindBox, 2, 0, Qt::AlignTop);
    grid->addWidget(m_map, 1, 1, 2, 1);
    grid->setColumnStretch(1, 1);
    grid->setRowStretch(1, 1);
    updateStampAndProfile();
    updateMap();
}

QString PsfPanel::message() const {
    if (!m_snapshot) return tr("no result yet: open a frame (File > Open frame...)");
    const PsfResult& psf = m_snapshot->result.psf;
    if (!psf.hasModel())
        return psf.stars.empty()
                   ? tr("no PSF model: no PSF star passed the selection (Parameters > PSF: the star limits)")
                   : tr("no PSF model: too few usable PSF stars (Parameters > PSF: a coarser grid or looser "
                        "star limits)");
    return {};
}

void PsfPanel::setSnapshot(SnapshotPtr snapshot) {
    m_snapshot = std::move(snapshot);
    if (m_snapshot && m_snapshot->frame && (m_x == 0 && m_y == 0)) {
        m_x = 0.5 * (m_snapshot->frame->width() - 1);
        m_y = 0.5 * (m_snapshot->frame->height() - 1);
    }
    updateStampAndProfile();
    updateMap();
}

void PsfPanel::setSelectedSource(int index) {
    if (!m_snapshot || index < 0) return;
    const Sources& s = m_snapshot->result.detection.sources;
    if (static_cast<std::size_t>(index) >= s.size()) return;
    setPosition(s.x[index], s.y[index]);
}

void PsfPanel::setPosition(double x, double y) {
    m_x = x;
    m_y = y;
    updateStampAndProfile();
    // move the position marker on the map
    for (int g = 0; g < m_map->graphCount(); ++g)
        if (m_map->graph(g)->name() == QLatin1String("position")) m_map->graph(g)->setData({x}, {y}, true);
    m_map->replot(QCustomPlot::rpQueuedReplot);
}

void PsfPanel::setMapKind(MapKind kind) {
    m_kind = kind;
    if (m_kindBox->currentIndex() != static_cast<int>(kind))
        m_kindBox->setCurrentIndex(static_cast<int>(kind));
    updateMap();
}

void PsfPanel::updateStampAndProfile() {
    m_profile->clearGraphs();
    m_cell = -1;
    m_stamp = QImage();
    const QString why = message();
    if (!why.isEmpty() || !m_snapshot) {
        m_stampLabel->setPixmap(QPixmap());
        m_stampLabel->setText(why);
        m_info->setText(why);
        m_profileTitle->setText(tr("Radial profile")); // the reason is in the stamp and the text beside it
        m_profile->replot();
        return;
    }
    const PsfResult& psf = m_snapshot->result.psf;
    m_cell = nearestEpsfCell(psf, m_x, m_y);
    const RadialProfile prof = epsfRadialProfile(psf, m_cell, m_x, m_y);
    QString info = tr("at x %1, y %2: FWHM %3 px, ellipticity %4, θ %5°")
                       .arg(m_x + 1, 0, 'f', 1)
                       .arg(m_y + 1, 0, 'f', 1)
                       .arg(psf.fwhmAt(m_x, m_y), 0, 'f', 2)
                       .arg(psf.ellipticityAt(m_x, m_y), 0, 'f', 3)
                       .arg(psf.thetaAt(m_x, m_y), 0, 'f', 1);
    if (psf.model == PsfModelKind::Moffat) info += tr(", β %1").arg(psf.medianBeta, 0, 'f', 2);
    info += tr("\nfield median FWHM %1 px from %2 stars").arg(psf.medianFwhm, 0, 'f', 2).arg(psf.nStars);
    if (m_cell >= 0) {
        const EpsfCell& cell = psf.epsf[m_cell];
        info += tr("\nePSF cell %1 of %2 (centre %3, %4; %5 stars; FWHM %6 px)")
                    .arg(m_cell + 1)
                    .arg(psf.epsf.size())
                    .arg(cell.cx + 1, 0, 'f', 0)
                    .arg(cell.cy + 1, 0, 'f', 0)
                    .arg(cell.nStars)
                    .arg(cell.fwhm, 0, 'f', 2);
        // the stamp: asinh stretch of the oversampled nodes, y up as in the viewer
        const int w = cell.image.width(), h = cell.image.height();
        std::vector<float> v(cell.image.data(), cell.image.data() + static_cast<std::size_t>(w) * h);
        float peak = 0;
        for (float a : v)
            peak = std::max(peak, a);
        const auto grey = asinhStretch(v, 0.0, peak, std::max(1e-12, 0.01 * static_cast<double>(peak)));
        m_stamp = QImage(w, h, QImage::Format_Grayscale8);
        for (int j = 0; j < h; ++j) {
            uchar* line = m_stamp.scanLine(h - 1 - j);
            for (int i = 0; i < w; ++i)
                line[i] = grey[static_cast<std::size_t>(j) * w + i];
        }
        m_stampLabel->setText(QString());
        m_stampLabel->setPixmap(QPixmap::fromImage(
            m_stamp.scaled(kStampPixels, kStampPixels, Qt::KeepAspectRatio, Qt::FastTransformation)));
    } else {
        m_stampLabel->setPixmap(QPixmap());
        m_stampLabel->setText(tr("no ePSF grid"));
    }
    m_info->setText(info);

    QCPGraph* nodes = m_profile->addGraph();
    nodes->setName(tr("ePSF nodes"));
    nodes->setLineStyle(QCPGraph::lsNone);
    nodes->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssDisc, QColor(31, 119, 180, 140), 3));
    {
        std::vector<std::size_t> order(prof.r.size());
        for (std::size_t k = 0; k < order.size(); ++k)
            order[k] = k;
        std::stable_sort(order.begin(), order.end(),
                         [&](std::size_t a, std::size_t b) { return prof.r[a] < prof.r[b]; });
        QVector<QCPGraphData> data;
        data.reserve(static_cast<int>(order.size()));
        for (std::size_t k : order)
            data.append(QCPGraphData(prof.r[k], prof.value[k]));
        nodes->data()->set(data, true);
    }
    QCPGraph* model = m_profile->addGraph();
    model->setName(psf.model == PsfModelKind::Moffat ? tr("Moffat model") : tr("Gaussian model"));
    model->setPen(QPen(QColor(214, 39, 40), 1.5));
    model->setData(QVector<double>(prof.modelR.begin(), prof.modelR.end()),
                   QVector<double>(prof.modelValue.begin(), prof.modelValue.end()), true);
    m_profile->legend->setVisible(true);
    m_profileTitle->setText(tr("Radial profile: FWHM %1 px (model), cell %2")
                                .arg(prof.fwhm, 0, 'f', 2)
                                .arg(m_cell >= 0 ? QString::number(m_cell + 1) : tr("none")));
    m_profile->rescaleAxes();
    m_profile->yAxis->setRangeLower(std::min(0.0, m_profile->yAxis->range().lower));
    if (prof.fwhm > 0) // the core and the first wings; drag or zoom to see more
        m_profile->xAxis->setRange(0.0, std::min(m_profile->xAxis->range().upper, 4.0 * prof.fwhm));
    m_profile->replot();
}

void PsfPanel::updateMap() {
    m_map->clearPlottables();
    for (int k = m_map->plotLayout()->elementCount() - 1; k >= 0; --k)
        if (qobject_cast<QCPColorScale*>(m_map->plotLayout()->elementAt(k))) m_map->plotLayout()->removeAt(k);
    m_map->plotLayout()->simplify();
    const QString why = message();
    if (!why.isEmpty() || !m_snapshot) {
        m_mapTitle->setText(why);
        m_map->replot();
        return;
    }
    const PsfResult& psf = m_snapshot->result.psf;
    const MapData m = psfFieldMap(psf, m_kind == MapKind::Fwhm ? PsfMapKind::Fwhm : PsfMapKind::Ellipticity);
    auto* map = new QCPColorMap(m_map->xAxis, m_map->yAxis);
    map->setName(m_kind == MapKind::Fwhm ? tr("FWHM") : tr("ellipticity"));
    map->data()->setSize(m.nx, m.ny);
    map->data()->setRange(QCPRange(m.xCentre(0), m.xCentre(m.nx - 1)),
                          QCPRange(m.yCentre(0), m.yCentre(m.ny - 1)));
    for (int j = 0; j < m.ny; ++j)
        for (int i = 0; i < m.nx; ++i)
            map->data()->setCell(i, j, m.at(i, j));
    auto* scale = new QCPColorScale(m_map);
    m_map->plotLayout()->addElement(1, 1, scale);
    scale->axis()->setLabel(m_kind == MapKind::Fwhm ? tr("FWHM (px)") : tr("1 − b/a"));
    map->setColorScale(scale);
    map->setGradient(QCPColorGradient(QCPColorGradient::gpThermal));
    const double lo = m.minValue, hi = m.maxValue > m.minValue ? m.maxValue : m.minValue + 1e-3;
    map->setDataRange(QCPRange(lo, hi));
    // the PSF stars used, and the position shown
    QCPGraph* stars = m_map->addGraph();
    stars->setName(tr("PSF stars"));
    stars->setLineStyle(QCPGraph::lsNone);
    stars->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssCircle, QColor(255, 255, 255), 4));
    QVector<QCPGraphData> sd;
    for (const PsfStar& s : psf.stars)
        if (s.used) sd.append(QCPGraphData(s.fit.x0, s.fit.y0));
    std::sort(sd.begin(), sd.end(),
              [](const QCPGraphData& a, const QCPGraphData& b) { return a.key < b.key; });
    stars->data()->set(sd, true);
    QCPGraph* pos = m_map->addGraph();
    pos->setName(QStringLiteral("position"));
    pos->setLineStyle(QCPGraph::lsNone);
    pos->setScatterStyle(
        QCPScatterStyle(QCPScatterStyle::ssPlusCircle, QPen(QColor(0, 255, 0), 2), Qt::NoBrush, 12));
    pos->setData({m_x}, {m_y}, true);
    m_mapTitle->setText(
        m_kind == MapKind::Fwhm
            ? tr("FWHM across the field: %1 … %2 px").arg(lo, 0, 'f', 2).arg(hi, 0, 'f', 2)
            : tr("Ellipticity across the field: %1 … %2").arg(lo, 0, 'f', 3).arg(hi, 0, 'f', 3));
    const int w = m_snapshot->frame ? m_snapshot->frame->width() : psf.width;
    const int h = m_snapshot->frame ? m_snapshot->frame->height() : psf.height;
    keepEqualAspect(m_map, QCPRange(-0.5, w - 0.5), QCPRange(-0.5, h - 0.5));
    m_map->replot();
}

} // namespace gpuphot::ui
