#include "ui/grid_layer.hpp"

#include <QEvent>
#include <QPainter>
#include <QPainterPath>
#include <algorithm>

#include "core/wcs/wcs.hpp"
#include "viewers/image_view.hpp"

namespace gpuphot::ui {

GridLayer::GridLayer(viewers::ImageView* view, std::function<const Wcs*()> wcs)
    : QWidget(view), m_view(view), m_wcs(std::move(wcs)) {
    setObjectName(QStringLiteral("GridLayer"));
    setAttribute(Qt::WA_TransparentForMouseEvents);
    setAttribute(Qt::WA_NoSystemBackground);
    setAttribute(Qt::WA_TranslucentBackground);
    setGeometry(view->rect());
    view->installEventFilter(this);
    connect(view, &viewers::ImageView::viewChanged, this, [this] {
        m_stale = true;
        if (m_shown) update();
    });
    setVisible(false);
}

void GridLayer::setShown(bool shown) {
    m_shown = shown;
    m_stale = true;
    setVisible(shown);
    if (shown) raise();
}

void GridLayer::refresh() {
    m_stale = true;
    if (m_shown) update();
}

bool GridLayer::eventFilter(QObject* watched, QEvent* e) {
    if (watched == m_view && e->type() == QEvent::Resize) {
        setGeometry(m_view->rect());
        m_stale = true;
    }
    return QWidget::eventFilter(watched, e);
}

const Graticule& GridLayer::graticule() {
    if (m_stale) rebuild();
    return m_grid;
}

// The visible part of the image: the view's corners in image pixels, bounded by the image.
void GridLayer::rebuild() {
    m_stale = false;
    m_grid = {};
    const auto image = m_view->image();
    const Wcs* wcs = m_wcs ? m_wcs() : nullptr;
    if (!image || !wcs) return;
    double x0 = 1e300, y0 = 1e300, x1 = -1e300, y1 = -1e300;
    for (const QPointF c :
         {QPointF(0, 0), QPointF(width(), 0), QPointF(0, height()), QPointF(width(), height())}) {
        const QPointF p = m_view->widgetToImage(c);
        x0 = std::min(x0, p.x());
        x1 = std::max(x1, p.x());
        y0 = std::min(y0, p.y());
        y1 = std::max(y1, p.y());
    }
    GraticuleRegion r{std::max(x0, -0.5), std::max(y0, -0.5), std::min(x1, image->width() - 0.5),
                      std::min(y1, image->height() - 0.5)};
    if (!(r.x1 > r.x0 && r.y1 > r.y0)) return;
    try {
        m_grid = makeGraticule(*wcs, r, 5);
    } catch (const std::exception&) { // a WCS that fails over this area: no grid
        m_grid = {};
    }
}

void GridLayer::paintEvent(QPaintEvent*) {
    const Graticule& g = graticule();
    if (g.lines.empty()) return;
    QPainter p(this);
    p.setRenderHint(QPainter::Antialiasing);
    const QColor line(120, 200, 255, 190), text(170, 225, 255);
    QFont font = p.font();
    font.setPointSizeF(std::max(7.0, font.pointSizeF() * 0.9));
    p.setFont(font);
    const QFontMetrics fm(font);
    for (const GraticuleLine& l : g.lines) {
        p.setPen(QPen(line, 1.0, Qt::DotLine));
        for (const auto& piece : l.pieces) {
            QPainterPath path(m_view->imageToWidget(QPointF(piece[0], piece[1])));
            for (std::size_t k = 2; k + 1 < piece.size(); k += 2)
                path.lineTo(m_view->imageToWidget(QPointF(piece[k], piece[k + 1])));
            p.drawPath(path);
        }
        // The label inside the view, beside where the line leaves it.
        const QString label = QString::fromStdString(l.label);
        QPointF at = m_view->imageToWidget(QPointF(l.labelX, l.labelY));
        const QRectF box(0, 0, fm.horizontalAdvance(label) + 4, fm.height());
        at.setX(std::clamp(at.x() + 3, 2.0, width() - box.width() - 2));
        at.setY(std::clamp(at.y() - box.height() - 2, 2.0, height() - box.height() - 2));
        p.fillRect(box.translated(at), QColor(0, 0, 0, 140));
        p.setPen(text);
        p.drawText(box.translated(at), Qt::AlignCenter, label);
    }
}

} // namespace gpuphot::ui
