#pragma once
// Drawing DS9 regions on the viewer with the mouse (Region menu, as DS9's region shapes): an event filter
// on the ImageView that, while a shape is chosen, takes the left button from the view (no pan, no source
// pick; a Ctrl+click still measures photometry) and turns it into a region in image coordinates:
//   circle   press at the centre, drag to the radius (a click: a circle of kClickRadius image px);
//   box      press at a corner, drag to the opposite one (a click: a box of 2 kClickRadius px);
//   polygon  a click per vertex; a double-click or Enter closes it (3 vertices at least), Backspace
//            removes the last vertex.
// Escape drops the shape being drawn (pressed again, or with nothing drawn, it ends drawing). The shape in
// progress is drawn by the regions layer (preview()). Sizes stay in image pixels however the view is
// zoomed, flipped or turned.
#include <QObject>
#include <QPointF>
#include <vector>

#include "core/io/ds9_regions.hpp"

namespace gpuphot::viewers {
class ImageView;
}

namespace gpuphot::ui {

class RegionDrawer : public QObject {
    Q_OBJECT
public:
    enum class Shape { None, Circle, Box, Polygon };
    static constexpr double kClickRadius = 10.0; // image px, a shape made by a click without a drag

    explicit RegionDrawer(viewers::ImageView* view);

    void setShape(Shape shape); // None: drawing ends (the shape in progress is dropped)
    Shape shape() const { return m_shape; }
    // The outline in progress as 0-based image x, y pairs (closed polygon; empty when none).
    const std::vector<double>& preview() const { return m_preview; }

signals:
    void regionDrawn(const gpuphot::Region& region); // DS9 image system: 1-based pixels
    void previewChanged();
    void shapeChanged(gpuphot::ui::RegionDrawer::Shape shape);

protected:
    bool eventFilter(QObject* watched, QEvent* e) override;

private:
    bool mouse(QEvent* e);
    bool key(QEvent* e);
    void finishDrag(QPointF imagePos, bool dragged);
    void finishPolygon();
    void updatePreview(QPointF imagePos);
    void emitRegion(Region r);
    void clear();

    viewers::ImageView* m_view;
    Shape m_shape = Shape::None;
    bool m_pressed = false;
    QPointF m_pressWidget, m_pressImage; // where the button went down
    std::vector<QPointF> m_vertices;     // polygon vertices so far (0-based image px)
    std::vector<double> m_preview;
};

} // namespace gpuphot::ui

Q_DECLARE_METATYPE(gpuphot::Region)
