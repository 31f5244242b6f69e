#pragma once
// The coordinate grid of the viewer (DS9's coordinate grid): a transparent widget stacked over the
// ImageView that draws core/wcs/graticule.hpp's lines of constant RA and Dec over the visible part of the
// image, labelled at its edges. The grid is made again for the visible area whenever the view pans, zooms
// or turns (viewChanged), so that zooming in refines its steps. Mouse input passes through to the view.
// Toggled with View > Coordinate grid; nothing is drawn for a frame without a WCS.
#include <QWidget>
#include <functional>

#include "core/wcs/graticule.hpp"

namespace gpuphot {
class Wcs;
}
namespace gpuphot::viewers {
class ImageView;
}

namespace gpuphot::ui {

class GridLayer : public QWidget {
    Q_OBJECT
public:
    // `wcs` gives the frame's WCS when the grid is drawn (nullptr: none).
    GridLayer(viewers::ImageView* view, std::function<const Wcs*()> wcs);

    void setShown(bool shown);
    bool shown() const { return m_shown; }
    // The grid of the current view (made again on the next paint after the view or the WCS changed).
    const Graticule& graticule();
    void refresh(); // the WCS changed (a new frame or a fitted solution)

protected:
    void paintEvent(QPaintEvent* e) override;
    bool eventFilter(QObject* watched, QEvent* e) override; // follows the view's size

private:
    void rebuild();
    viewers::ImageView* m_view;
    std::function<const Wcs*()> m_wcs;
    Graticule m_grid;
    bool m_stale = true;
    bool m_shown = false;
};

} // namespace gpuphot::ui
