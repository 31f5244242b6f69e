#pragma once
// The display and layers panel: stretch, limits, colormap of the viewer and one check box per overlay
// layer. Acts on the viewer directly (no pipeline work: changing these never re-runs anything). Typed
// limits (DS9's Scale > User): editing Min or Max switches the limits to "manual" with those values; in
// the other modes the two fields show the limits in use. A colorbar under the controls shows the colormap
// over the limits.
#include <QWidget>

class QComboBox;
class QDoubleSpinBox;
class QCheckBox;
class QLineEdit;

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
    // Typed limits: the same as entering them in the Min and Max fields.
    void setManualLimits(double lo, double hi);

signals:
    void exaggerationChanged(double factor);

private:
    void apply();
    void showLimits(); // the view's limits in the Min and Max fields (modes other than manual)
    void typedLimits();

    viewers::ImageView* m_view;
    QComboBox* m_stretch = nullptr;
    QComboBox* m_limits = nullptr;
    QComboBox* m_colormap = nullptr;
    QDoubleSpinBox* m_low = nullptr;
    QDoubleSpinBox* m_high = nullptr;
    QLineEdit* m_min = nullptr;
    QLineEdit* m_max = nullptr;
    QDoubleSpinBox* m_ellipseScale = nullptr;
    QDoubleSpinBox* m_exaggeration = nullptr;
    std::vector<QCheckBox*> m_layers;
};

} // namespace gpuphot::ui
