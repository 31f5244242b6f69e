#pragma once
// The display and layers panel: stretch, limits, colormap of the viewer and one check box per overlay
// layer. Acts on the viewer directly (no pipeline work: changing these never re-runs anything).
#include <QWidget>

class QComboBox;
class QDoubleSpinBox;
class QCheckBox;

namespace gpuphot::viewers {
class ImageView;
}

namespace gpuphot::ui {

class DisplayControls : public QWidget {
    Q_OBJECT
public:
    explicit DisplayControls(viewers::ImageView* view, QWidget* parent = nullptr);
    void restoreSettings();
    void saveSettings() const;
    double residualExaggeration() const;

signals:
    void exaggerationChanged(double factor);

private:
    void apply();

    viewers::ImageView* m_view;
    QComboBox* m_stretch = nullptr;
    QComboBox* m_limits = nullptr;
    QComboBox* m_colormap = nullptr;
    QDoubleSpinBox* m_low = nullptr;
    QDoubleSpinBox* m_high = nullptr;
    QDoubleSpinBox* m_ellipseScale = nullptr;
    QDoubleSpinBox* m_exaggeration = nullptr;
    std::vector<QCheckBox*> m_layers;
};

} // namespace gpuphot::ui
