#pragma once
#include <QMainWindow>

namespace gpuphot::ui {

// The workbench's main window. For now: the frame's name and size; the viewer, docks and panels come
// with the workbench issue.
class MainWindow : public QMainWindow {
    Q_OBJECT
public:
    explicit MainWindow(QWidget* parent = nullptr);
    // Opens a FITS frame; returns false and shows the error in the status bar when it cannot.
    bool openFrame(const QString& path);
};

} // namespace gpuphot::ui
