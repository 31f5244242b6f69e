#pragma once
// View > Pan to coordinates (DS9's Frame > Pan Zoom Rotate Parameters): centres the image view on a typed
// position, 1-based image pixels or RA/Dec of the frame's WCS. RA is degrees ("150.1") or sexagesimal
// hours ("10:00:24.5", "10h00m24.5s", "10 00 24.5"); Dec degrees ("2.2") or sexagesimal degrees
// ("+02:12:00"). Non-modal; Apply keeps it open, OK applies and closes.
#include <QDialog>

#include <functional>
#include <optional>

class QComboBox;
class QLineEdit;
class QLabel;

namespace gpuphot {
class Wcs;
}
namespace gpuphot::viewers {
class ImageView;
}

namespace gpuphot::ui {

enum class PanSystem { Image, Sky };

// The 0-based image position of the typed coordinates; nullopt with *why set when they do not parse,
// when Sky is asked without a WCS, or when the sky position does not project.
std::optional<std::pair<double, double>> parsePanTarget(const QString& first, const QString& second,
                                                        PanSystem system, const Wcs* wcs, QString* why);

class PanDialog : public QDialog {
    Q_OBJECT
public:
    // wcs: the frame's current WCS (nullptr: none; Sky is then disabled).
    PanDialog(viewers::ImageView* view, std::function<const Wcs*()> wcs, QWidget* parent = nullptr);
    void setCoordinates(const QString& first, const QString& second, PanSystem system);
    bool apply();             // false: the error is shown in the dialog, the view does not move
    void showCurrentCentre(); // the view's centre in the chosen system

private:
    PanSystem system() const;

    viewers::ImageView* m_view;
    std::function<const Wcs*()> m_wcs;
    QComboBox* m_system = nullptr;
    QLineEdit* m_first = nullptr;
    QLineEdit* m_second = nullptr;
    QLabel* m_error = nullptr;
};

} // namespace gpuphot::ui
