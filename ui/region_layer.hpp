#pragma once
// The DS9 regions layer of the viewer: a transparent widget stacked over the ImageView that draws the
// outlines of ui/overlay_builder.hpp's RegionOverlay with QPainter, mapped through the view's
// imageToWidget and redrawn whenever the view pans or zooms (viewChanged). Mouse input passes through
// to the view. Toggled with View > Show DS9 regions; a shape being drawn is shown whatever the toggle.
#include <QWidget>
#include <vector>

#include "ui/overlay_builder.hpp"

namespace gpuphot::viewers {
class ImageView;
}

namespace gpuphot::ui {

class RegionLayer : public QWidget {
    Q_OBJECT
public:
    explicit RegionLayer(viewers::ImageView* view);

    void setOverlay(RegionOverlay overlay);
    const RegionOverlay& overlay() const { return m_overlay; }
    int shapeCount() const { return static_cast<int>(m_overlay.outlines.size()); }
    void setShown(bool shown); // the layer's toggle (the widget is hidden while off)
    // A shape being drawn (ui/region_drawer.hpp): 0-based image x, y pairs, drawn closed and dashed.
    void setPreview(std::vector<double> xy);
    bool shown() const { return m_shown; }

protected:
    void paintEvent(QPaintEvent* e) override;
    bool eventFilter(QObject* watched, QEvent* e) override; // follows the view's size

private:
    viewers::ImageView* m_view;
    void updateVisibility();

    RegionOverlay m_overlay;
    std::vector<double> m_preview;
    bool m_shown = true;
};

} // namespace gpuphot::ui
