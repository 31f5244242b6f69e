#pragma once
// The workbench's own benchmarks (gpuphot-studio --time-first-view / --time-first-result / --time-edit):
// each watches the running window as a user would see it, prints its figures on stdout and quits.
#include <QElapsedTimer>

namespace gpuphot::ui {
class MainWindow;

// From the process start (sinceStart) to the first drawn view of the frame.
void timeFirstView(MainWindow& window, const QElapsedTimer& sinceStart);
// From the process start to the first result's overlays and table.
void timeFirstResult(MainWindow& window, const QElapsedTimer& sinceStart);
// After the first calibrated result: the detection threshold's spin box set to a run of values, one at a
// time, each timed from the edit to its first overlays drawn (the provisional result) and to the complete
// result; then the median of each.
void timeThresholdEdits(MainWindow& window);
} // namespace gpuphot::ui
