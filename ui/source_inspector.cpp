#include "ui/source_inspector.hpp"

#include <qcustomplot.h>

#include <QGridLayout>
#include <QHeaderView>
#include <QLabel>
#include <QPainter>
#include <QSpinBox>
#include <QTableWidget>
#include <algorithm>
#include <cmath>

#include "ui/panel_data.hpp"

namespace gpuphot::ui {

namespace {
constexpr int kStampView = 220; // px on screen

double percentile(std::vector<float> v, double q) {
    v.erase(std::remove_if(v.begin(), v.end(), [](float a) { return !std::isfinite(a); }), v.end());
    if (v.empty()) return 0.0;
    const std::size_t k = std::min(v.size() - 1, static_cast<std::size_t>(q * (v.size() - 1) + 0.5));
    std::nth_element(v.begin(), v.begin() + k, v.end());
    return v[k];
}
} // namespace

SourceInspector::SourceInspector(QWidget* parent) : QWidget(parent) {
    auto* grid = new QGridLayout(this);
    m_stamp = new QLabel(this);
    m_stamp->setFixedSize(kStampView, kStampView);
    m_stamp->setAlignment(Qt::AlignCenter);
    m_stamp->setStyleSheet(QStringLiteral("background: black; color: gray"));
    m_stamp->setToolTip(tr("Stamp (asinh stretch): apertures in cyan, sky annulus in yellow"));
    m_halfBox = new QSpinBox(this);
    m_halfBox->setRange(4, 100);
    m_halfBox->setValue(m_half);
    m_halfBox->setPrefix(tr("± "));
    m_halfBox->setSuffix(tr(" px"));
    m_halfBox->setToolTip(tr("Half size of the stamp"));
    connect(m_halfBox, &QSpinBox::valueChanged, this, &SourceInspector::setStampHalfSize);
    m_flags = new QLabel(this);
    m_flags->setWordWrap(true);
    m_flags->setTextInteractionFlags(Qt::TextSelectableByMouse);

    m_growth = new QCustomPlot(this);
    m_growth->setObjectName(QStringLiteral("curveOfGrowth"));
    m_growth->xAxis->setLabel(tr("radius (px)"));
    m_growth->yAxis->setLabel(tr("flux − sky (ADU)"));
    m_growth->setMinimumSize(260, 200);
    m_growth->setInteractions(QCP::iRangeDrag | QCP::iRangeZoom);

    m_details = new QTableWidget(this);
    m_details->setColumnCount(2);
    m_details->setHorizontalHeaderLabels({tr("quantity"), tr("value")});
    m_details->horizontalHeader()->setStretchLastSection(true);
    m_details->verticalHeader()->setVisible(false);
    m_details->setEditTriggers(QAbstractItemView::NoEditTriggers);
    m_details->setSelectionBehavior(QAbstractItemView::SelectRows);

    grid->addWidget(m_stamp, 0, 0);
    grid->addWidget(m_growth, 0, 1);
    grid->addWidget(m_halfBox, 1, 0);
    grid->addWidget(m_flags, 1, 1);
    grid->addWidget(m_details, 2, 0, 1, 2);
    grid->setColumnStretch(1, 1);
    grid->setRowStretch(2, 1);
    refresh();
}

QString SourceInspector::flagsText() const {
    return m_flags->text();
}

void SourceInspector::setSnapshot(SnapshotPtr snapshot) {
    m_snapshot = std::move(snapshot);
    m_click.reset();
    if (!m_snapshot || m_index >= static_cast<int>(m_snapshot->result.detection.sources.size())) m_index = -1;
    refresh();
}

void SourceInspector::setSelectedSource(int index) {
    m_index = index;
    m_click.reset();
    refresh();
}

void SourceInspector::setClickPhotometry(const ClickPhotometry& measurement) {
    m_click = measurement;
    m_index = -1;
    refresh();
}

void SourceInspector::setStampHalfSize(int pixels) {
    pixels = std::clamp(pixels, 4, 100);
    if (pixels == m_half) return;
    m_half = pixels;
    if (m_halfBox->value() != pixels) m_halfBox->setValue(pixels);
    refresh();
}

void SourceInspector::refresh() {
    m_growth->clearGraphs();
    m_details->setRowCount(0);
    m_image = QImage();
    if (m_click && m_snapshot && m_snapshot->frame) return refreshClick();
    const bool valid = m_snapshot && m_snapshot->frame && m_index >= 0 &&
                       static_cast<std::size_t>(m_index) < m_snapshot->result.detection.sources.size();
    if (!valid) {
        m_stamp->setPixmap(QPixmap());
        m_stamp->setText(m_snapshot ? tr("no source selected") : tr("no result yet"));
        m_flags->setText(m_snapshot ? tr("Click a source in the image or a row of the catalog; Ctrl+click "
                                         "anywhere measures an aperture there.")
                                    : tr("Open a frame (File > Open frame... or Open demo frame): its "
                                         "sources can then be inspected here."));
        m_growth->replot();
        return;
    }
    const Snapshot& s = *m_snapshot;
    const PipelineResult& r = s.result;
    const Sources& src = r.detection.sources;
    const double x = src.x[m_index], y = src.y[m_index];
    const ApertureResult& ap = r.aperture;
    const bool haveAp = ap.count == src.size();

    const double sky0 = haveAp && std::isfinite(ap.sky[m_index]) ? ap.sky[m_index] : std::nan("");
    const double rms0 = haveAp ? ap.skyRms[m_index] : std::nan("");
    const double ro = haveAp && ap.radiusOpt.size() == src.size() ? ap.radiusOpt[m_index] : 0.0;
    drawStamp(x, y, sky0, rms0, haveAp ? ap.radii : std::vector<double>{}, haveAp ? ap.skyAnnulusInner : 0.0,
              haveAp ? ap.skyAnnulusOuter : 0.0, ro);

    // ---- curve of growth ----------------------------------------------------------------------------
    if (haveAp) {
        const CurveOfGrowth cat = catalogCurveOfGrowth(r, m_index);
        double rMax = 0;
        for (double rad : ap.radii)
            rMax = std::max(rMax, rad);
        rMax = std::max({rMax * 1.5, ap.skyAnnulusInner, 3.0});
        const CurveOfGrowth fine = fineCurveOfGrowth(*s.frame, x, y, ap.sky[m_index], rMax, 0.25);
        QCPGraph* gf = m_growth->addGraph();
        gf->setName(tr("exact overlap, 0.25 px steps"));
        gf->setPen(QPen(QColor(31, 119, 180), 1.5));
        gf->setData(QVector<double>(fine.radius.begin(), fine.radius.end()),
                    QVector<double>(fine.flux.begin(), fine.flux.end()), true);
        QCPGraph* gc = m_growth->addGraph();
        gc->setName(tr("catalog apertures"));
        gc->setLineStyle(QCPGraph::lsNone);
        gc->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssDisc, QColor(214, 39, 40), 8));
        gc->setData(QVector<double>(cat.radius.begin(), cat.radius.end()),
                    QVector<double>(cat.flux.begin(), cat.flux.end()));
        if (ap.fluxOpt.size() == src.size() && std::isfinite(ap.fluxOpt[m_index])) {
            QCPGraph* total = m_growth->addGraph();
            total->setName(tr("flux_opt (total)"));
            total->setPen(QPen(QColor(44, 160, 44), 1, Qt::DashLine));
            total->setData({0.0, rMax}, {ap.fluxOpt[m_index], ap.fluxOpt[m_index]}, true);
        }
        m_growth->legend->setVisible(true);
        m_growth->legend->setFont(QFont(font().family(), 8));
        m_growth->axisRect()->insetLayout()->setInsetAlignment(0, Qt::AlignBottom | Qt::AlignRight);
        m_growth->rescaleAxes();
        m_growth->xAxis->setRangeLower(0.0);
        const QCPRange yr = m_growth->yAxis->range();
        m_growth->yAxis->setRange(std::min(0.0, yr.lower), yr.upper + 0.05 * yr.size());
    }
    m_growth->replot();

    // ---- numbers and flags --------------------------------------------------------------------------
    const auto rows = sourceDetails(s, m_index);
    fillDetails(rows);
    QString flags;
    for (const DetailRow& row : rows)
        if (row.label == "flags") flags = QString::fromStdString(row.value);
    m_flags->setText(tr("Source %1 — flags %2").arg(m_index + 1).arg(flags));
}

// The stamp around (x, y): asinh stretch between the sky and the peak, y up (FITS orientation), the
// apertures in cyan, the sky annulus in yellow, radiusOpt (when > 0) dotted green.
void SourceInspector::drawStamp(double x, double y, double sky, double rms, const std::vector<double>& radii,
                                double annulusInner, double annulusOuter, double radiusOpt) {
    const Stamp st = extractStamp(*m_snapshot->frame, x, y, m_half);
    if (!std::isfinite(sky)) sky = percentile(st.values, 0.5);
    if (!std::isfinite(rms) || rms <= 0) rms = 1.0;
    const double lo = sky - 2.0 * rms;
    const double hi = std::max(lo + 1.0, percentile(st.values, 0.999));
    const auto grey = asinhStretch(st.values, lo, hi, 3.0 * rms);
    QImage img(st.width, st.height, QImage::Format_RGB32);
    for (int j = 0; j < st.height; ++j) {
        auto* line = reinterpret_cast<QRgb*>(img.scanLine(st.height - 1 - j));
        for (int i = 0; i < st.width; ++i) {
            const std::size_t k = static_cast<std::size_t>(j) * st.width + i;
            const int g = grey[k];
            line[i] = st.masked[k] ? qRgb(g / 2 + 60, g / 2, g / 2) : qRgb(g, g, g);
        }
    }
    const double scale = static_cast<double>(kStampView) / st.width;
    m_image = img.scaled(kStampView, kStampView, Qt::IgnoreAspectRatio, Qt::FastTransformation);
    {
        QPainter p(&m_image);
        p.setRenderHint(QPainter::Antialiasing);
        // frame pixel (fx, fy) centre -> image ((fx - x0 + 0.5) s, (y0 + h - 1 - fy + 0.5) s)
        const QPointF c((x - st.x0 + 0.5) * scale, (st.y0 + st.height - 1 - y + 0.5) * scale);
        p.setPen(QPen(QColor(0, 220, 255), 1.2));
        for (double rad : radii)
            p.drawEllipse(c, rad * scale, rad * scale);
        if (annulusOuter > annulusInner && annulusInner > 0) {
            p.setPen(QPen(QColor(255, 220, 0), 1.2, Qt::DashLine));
            p.drawEllipse(c, annulusInner * scale, annulusInner * scale);
            p.drawEllipse(c, annulusOuter * scale, annulusOuter * scale);
        }
        if (radiusOpt > 0) {
            p.setPen(QPen(QColor(0, 255, 0), 1.2, Qt::DotLine));
            p.drawEllipse(c, radiusOpt * scale, radiusOpt * scale);
        }
        p.setPen(QPen(QColor(255, 0, 255), 1));
        p.drawLine(c + QPointF(-4, 0), c + QPointF(4, 0));
        p.drawLine(c + QPointF(0, -4), c + QPointF(0, 4));
    }
    m_stamp->setText(QString());
    m_stamp->setPixmap(QPixmap::fromImage(m_image));
}

void SourceInspector::fillDetails(const std::vector<DetailRow>& rows) {
    m_details->setRowCount(static_cast<int>(rows.size()));
    for (std::size_t k = 0; k < rows.size(); ++k) {
        m_details->setItem(static_cast<int>(k), 0,
                           new QTableWidgetItem(QString::fromStdString(rows[k].label)));
        m_details->setItem(static_cast<int>(k), 1,
                           new QTableWidgetItem(QString::fromStdString(rows[k].value)));
    }
    m_details->resizeColumnToContents(0);
}

// A Ctrl+click measurement: its stamp and apertures, the fine curve of growth about its own sky, its numbers.
void SourceInspector::refreshClick() {
    const ClickPhotometry& m = *m_click;
    drawStamp(m.x, m.y, m.sky, m.skyRms, m.radii, m.annulusInner, m.annulusOuter, 0.0);
    double rMax = 3.0;
    for (double rad : m.radii)
        rMax = std::max(rMax, 1.5 * rad);
    if (std::isfinite(m.sky)) {
        const CurveOfGrowth fine = fineCurveOfGrowth(*m_snapshot->frame, m.x, m.y, m.sky, rMax, 0.25);
        QCPGraph* gf = m_growth->addGraph();
        gf->setPen(QPen(QColor(31, 119, 180), 1.5));
        gf->setData(QVector<double>(fine.radius.begin(), fine.radius.end()),
                    QVector<double>(fine.flux.begin(), fine.flux.end()), true);
        QCPGraph* gc = m_growth->addGraph();
        gc->setLineStyle(QCPGraph::lsNone);
        gc->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssDisc, QColor(214, 39, 40), 8));
        gc->setData(QVector<double>(m.radii.begin(), m.radii.end()),
                    QVector<double>(m.flux.begin(), m.flux.end()));
        m_growth->legend->setVisible(false);
        m_growth->rescaleAxes();
        m_growth->xAxis->setRangeLower(0.0);
    }
    m_growth->replot();
    fillDetails(clickPhotometryDetails(m));
    m_flags->setText(tr("Forced aperture photometry at %1, %2 (1-based)")
                         .arg(m.x + 1.0, 0, 'f', 2)
                         .arg(m.y + 1.0, 0, 'f', 2));
}

} // namespace gpuphot::ui
