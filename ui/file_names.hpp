#pragma once
// File names of the workbench's exports: the default suffix a name without one gets (from the save
// dialog's chosen filter, or the export's own format), as a user of a desktop tool expects.
#include <QString>

class QWidget;

namespace gpuphot::ui {

// The first pattern's suffix of a dialog filter: "ECSV (*.ecsv)" -> ".ecsv", "WCS (*.wcs *.fits)" ->
// ".wcs"; "" when it names none ("All files (*)").
QString filterSuffix(const QString& filter);
// `path` with `suffix` (".fits") appended when its file name has no suffix of its own; "" stays "".
QString withDefaultSuffix(const QString& path, const QString& suffix);
// A save dialog ("filters" as QFileDialog takes them) whose answer gets the chosen filter's suffix when
// the name typed has none; "" when cancelled.
QString askSavePath(QWidget* parent, const QString& title, const QString& filters);

} // namespace gpuphot::ui
