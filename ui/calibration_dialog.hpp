#pragma once
// File > Calibration frames...: the master bias, dark, flat and bad-pixel mask the workbench's frame
// preparation uses (PipelineWorker::setCalibrationFrames, `reduce --bias --dark --flat --bpm`).
// Four file choosers with clear buttons; OK checks every chosen file (exists, readable, a FITS file with a
// 2-D image, the masters of one size) and shows what is wrong as a dialog naming the file and the problem,
// keeping the dialog open. The choice persists in QSettings ("calibration/bias" ...). Deeper checks (sizes
// against the frame, EXPTIME of a dark, FILTER of a flat) happen when the worker prepares the frame; their
// errors reach the main window's error dialog.
#include <QDialog>
#include <QPointer>
#include <QString>
#include <QStringList>
#include <array>

class QLineEdit;
class QMessageBox;

namespace gpuphot::ui {

struct CalibrationFrames {
    QString bias, dark, flat, bpm; // empty: not used
    bool empty() const { return bias.isEmpty() && dark.isEmpty() && flat.isEmpty() && bpm.isEmpty(); }
    bool operator==(const CalibrationFrames&) const = default;
    // "bias, flat" (the kinds set) or "none"; for the status bar.
    QString summary() const;
    // One line per set file: "bias: /path" ...
    QString details() const;
};

// QSettings keys calibration/bias, calibration/dark, calibration/flat, calibration/bpm.
CalibrationFrames loadCalibrationSettings();
void saveCalibrationSettings(const CalibrationFrames& frames);

// Problems with the chosen files, one message per problem, each naming the file ("" list: usable as far
// as can be told without reading the pixels). Reads only the FITS headers.
QStringList validateCalibrationFrames(const CalibrationFrames& frames);

class CalibrationDialog : public QDialog {
    Q_OBJECT
public:
    enum Kind { Bias = 0, Dark = 1, Flat = 2, BadPixels = 3 };

    explicit CalibrationDialog(const CalibrationFrames& current, QWidget* parent = nullptr);
    CalibrationFrames frames() const;
    void setFrames(const CalibrationFrames& frames);
    QLineEdit* pathEdit(Kind kind) const { return m_edits[kind]; } // tests
    // The error dialog of the last rejected OK (null when none is shown); tests read its text.
    QMessageBox* errorBox() const;

public slots:
    void accept() override; // validates first; stays open with an error dialog when a file is unusable

private:
    void browse(Kind kind);
    std::array<QLineEdit*, 4> m_edits{};
    QPointer<QMessageBox> m_errorBox;
};

} // namespace gpuphot::ui
