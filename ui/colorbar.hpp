#pragma once
// The colorbar of the image view (DS9's colorbar): its colormap from the low limit (left) to the high
// limit (right) with the values at both ends and the middle of the stretched range, following
// ImageView::displayChanged.
#include <QWidget>

namespace gpuphot::viewers {
class ImageView;
}

namespace gpuphot::ui {

class Colorbar : public QWidget {
    Q_OBJECT
public:
    explicit Colorbar(viewers::ImageView* view, QWidget* parent = nullptr);
    QSize sizeHint() const override;
    // The labels drawn under the bar, left to right (low, value at mid-colour, high).
    QStringList labels() const;
    QRgb colourAt(double fraction) const; // the colour drawn at this fraction of the bar's width

protected:
    void paintEvent(QPaintEvent* e) override;

private:
    viewers::ImageView* m_view;
};

} // namespace gpuphot::ui
