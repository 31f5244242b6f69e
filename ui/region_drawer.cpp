#include "ui/region_drawer.hpp"

#include <QKeyEvent>
#include <QMouseEvent>
#include <cmath>

#include "viewers/image_view.hpp"

namespace gpuphot::ui {
namespace {
constexpr double kDragPixels = 4.0; // screen px: less is a click
constexpr int kCircleSegments = 48;

Region imageRegion(RegionShape shape) {
    Region r;
    r.shape = shape;
    r.system = RegionSystem::Image;
    return r;
}
} // namespace

RegionDrawer::RegionDrawer(viewers::ImageView* view) : QObject(view), m_view(view) {
    qRegisterMetaType<gpuphot::Region>();
    view->installEventFilter(this);
}

void RegionDrawer::setShape(Shape shape) {
    if (shape == m_shape) return;
    clear();
    m_shape = shape;
    m_view->setCursor(shape == Shape::None ? Qt::ArrowCursor : Qt::CrossCursor);
    emit shapeChanged(shape);
}

void RegionDrawer::clear() {
    m_pressed = false;
    m_vertices.clear();
    if (!m_preview.empty()) {
        m_preview.clear();
        emit previewChanged();
    }
}

bool RegionDrawer::eventFilter(QObject* watched, QEvent* e) {
    if (watched != m_view || m_shape == Shape::None) return false;
    switch (e->type()) {
    case QEvent::MouseButtonPress:
    case QEvent::MouseMove:
    case QEvent::MouseButtonRelease:
    case QEvent::MouseButtonDblClick:
        return mouse(e);
    case QEvent::ShortcutOverride: { // the window's shortcuts (Escape: Run > Cancel) wait while drawing
        const int k = static_cast<QKeyEvent*>(e)->key();
        if (k == Qt::Key_Escape || k == Qt::Key_Return || k == Qt::Key_Enter || k == Qt::Key_Backspace) {
            e->accept();
            return true;
        }
        return false;
    }
    case QEvent::KeyPress:
        return key(e);
    default:
        return false;
    }
}

bool RegionDrawer::mouse(QEvent* e) {
    auto* m = static_cast<QMouseEvent*>(e);
    if (m->modifiers() & Qt::ControlModifier) return false; // Ctrl+click: photometry at the click
    const QPointF image = m_view->widgetToImage(m->position());
    if (e->type() == QEvent::MouseMove) {
        if (m_pressed || (m_shape == Shape::Polygon && !m_vertices.empty())) updatePreview(image);
        return false; // the readout follows the cursor as usual
    }
    if (m->button() != Qt::LeftButton) return false;
    if (e->type() == QEvent::MouseButtonDblClick) {
        if (m_shape == Shape::Polygon) finishPolygon();
        return true;
    }
    if (e->type() == QEvent::MouseButtonPress) {
        m_pressed = true;
        m_pressWidget = m->position();
        m_pressImage = image;
        return true;
    }
    if (!m_pressed) return true;
    m_pressed = false;
    finishDrag(image, (m->position() - m_pressWidget).manhattanLength() >= kDragPixels);
    return true;
}

bool RegionDrawer::key(QEvent* e) {
    auto* k = static_cast<QKeyEvent*>(e);
    switch (k->key()) {
    case Qt::Key_Escape:
        if (m_pressed || !m_vertices.empty())
            clear();
        else
            setShape(Shape::None);
        return true;
    case Qt::Key_Return:
    case Qt::Key_Enter:
        if (m_shape != Shape::Polygon) return false;
        finishPolygon();
        return true;
    case Qt::Key_Backspace:
        if (m_vertices.empty()) return false;
        m_vertices.pop_back();
        updatePreview(m_vertices.empty() ? QPointF() : m_vertices.back());
        return true;
    default:
        return false;
    }
}

void RegionDrawer::finishDrag(QPointF image, bool dragged) {
    if (m_shape == Shape::Polygon) {
        if (m_vertices.empty() || dragged || m_vertices.back() != m_pressImage)
            m_vertices.push_back(m_pressImage);
        updatePreview(image);
        return;
    }
    const QPointF c = m_pressImage;
    if (m_shape == Shape::Circle) {
        Region r = imageRegion(RegionShape::Circle);
        r.points = {c.x() + 1.0, c.y() + 1.0};
        const double radius = dragged ? std::hypot(image.x() - c.x(), image.y() - c.y()) : kClickRadius;
        r.sizes = {{radius, false}};
        emitRegion(std::move(r));
        return;
    }
    Region r = imageRegion(RegionShape::Box);
    if (dragged) {
        r.points = {0.5 * (c.x() + image.x()) + 1.0, 0.5 * (c.y() + image.y()) + 1.0};
        r.sizes = {{std::fabs(image.x() - c.x()), false}, {std::fabs(image.y() - c.y()), false}};
    } else {
        r.points = {c.x() + 1.0, c.y() + 1.0};
        r.sizes = {{2.0 * kClickRadius, false}, {2.0 * kClickRadius, false}};
    }
    emitRegion(std::move(r));
}

void RegionDrawer::finishPolygon() {
    if (m_vertices.size() < 3) return; // not a polygon yet: keep adding vertices
    Region r = imageRegion(RegionShape::Polygon);
    for (const QPointF& v : m_vertices) {
        r.points.push_back(v.x() + 1.0);
        r.points.push_back(v.y() + 1.0);
    }
    emitRegion(std::move(r));
}

void RegionDrawer::emitRegion(Region r) {
    clear();
    emit regionDrawn(r);
}

void RegionDrawer::updatePreview(QPointF image) {
    m_preview.clear();
    const QPointF c = m_pressImage;
    if (m_shape == Shape::Circle && m_pressed) {
        const double radius = std::hypot(image.x() - c.x(), image.y() - c.y());
        for (int k = 0; k < kCircleSegments; ++k) {
            const double t = 2.0 * M_PI * k / kCircleSegments;
            m_preview.push_back(c.x() + radius * std::cos(t));
            m_preview.push_back(c.y() + radius * std::sin(t));
        }
    } else if (m_shape == Shape::Box && m_pressed) {
        m_preview = {c.x(), c.y(), image.x(), c.y(), image.x(), image.y(), c.x(), image.y()};
    } else if (m_shape == Shape::Polygon) {
        for (const QPointF& v : m_vertices) {
            m_preview.push_back(v.x());
            m_preview.push_back(v.y());
        }
        if (!m_vertices.empty()) {
            m_preview.push_back(image.x());
            m_preview.push_back(image.y());
        }
    }
    emit previewChanged();
}

} // namespace gpuphot::ui
