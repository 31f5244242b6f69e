#include "ui/region_layer.hpp"

#include <QEvent>
#include <QPainter>
#include <QPainterPath>

#include "viewers/image_view.hpp"

namespace gpuphot::ui {
namespace {

QColor colourOf(std::uint32_t rgba) {
    return QColor(static_cast<int>(rgba & 0xff), static_cast<int>((rgba >> 8) & 0xff),
                  static_cast<int>((rgba >> 16) & 0xff));
}

} // namespace

RegionLayer::RegionLayer(viewers::ImageView* view) : QWidget(view), m_view(view) {
    setObjectName(QStringLiteral("RegionLayer"));
    setAttribute(Qt::WA_TransparentForMouseEvents);
    setAttribute(Qt::WA_NoSystemBackground);
    setAttribute(Qt::WA_TranslucentBackground);
    setGeometry(view->rect());
    view->installEventFilter(this);
    connect(view, &viewers::ImageView::viewChanged, this, qOverload<>(&QWidget::update));
    setVisible(false); // nothing to draw yet
}

void RegionLayer::setOverlay(RegionOverlay overlay) {
    m_overlay = std::move(overlay);
    updateVisibility();
}

void RegionLayer::setShown(bool shown) {
    m_shown = shown;
    updateVisibility();
}

void RegionLayer::setPreview(std::vector<double> xy) {
    m_preview = std::move(xy);
    updateVisibility();
}

void RegionLayer::updateVisibility() {
    setVisible((m_shown && !m_overlay.outlines.empty()) || m_preview.size() >= 4);
    raise();
    update();
}

bool RegionLayer::eventFilter(QObject* watched, QEvent* e) {
    if (watched == m_view && e->type() == QEvent::Resize) setGeometry(m_view->rect());
    return QWidget::eventFilter(watched, e);
}

void RegionLayer::paintEvent(QPaintEvent*) {
    if (!m_view->image()) return;
    QPainter p(this);
    p.setRenderHint(QPainter::Antialiasing);
    for (const RegionOutline& o : m_overlay.outlines) {
        if (!m_shown || o.xy.size() < 2) continue;
        QPen pen(colourOf(o.rgba), 1.5, o.exclude ? Qt::DashLine : Qt::SolidLine);
        p.setPen(pen);
        const QPointF first = m_view->imageToWidget(QPointF(o.xy[0], o.xy[1]));
        if (o.point) {
            p.drawLine(first + QPointF(-5, -5), first + QPointF(5, 5));
            p.drawLine(first + QPointF(-5, 5), first + QPointF(5, -5));
        } else {
            QPolygonF poly;
            for (std::size_t i = 0; i + 1 < o.xy.size(); i += 2)
                poly << m_view->imageToWidget(QPointF(o.xy[i], o.xy[i + 1]));
            p.drawPolygon(poly);
        }
        if (!o.text.empty()) p.drawText(first + QPointF(6, -6), QString::fromStdString(o.text));
    }
    if (m_preview.size() >= 4) {
        QPolygonF poly;
        for (std::size_t i = 0; i + 1 < m_preview.size(); i += 2)
            poly << m_view->imageToWidget(QPointF(m_preview[i], m_preview[i + 1]));
        p.setPen(QPen(QColor(0, 255, 255), 1.5, Qt::DashLine));
        p.drawPolygon(poly);
    }
}

} // namespace gpuphot::ui
