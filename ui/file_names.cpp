#include "ui/file_names.hpp"

#include <QFileInfo>
#include <QRegularExpression>

namespace gpuphot::ui {

QString filterSuffix(const QString& filter) {
    static const QRegularExpression pattern(QStringLiteral(R"(\*(\.[A-Za-z0-9_.]+))"));
    const QRegularExpressionMatch m = pattern.match(filter);
    return m.hasMatch() ? m.captured(1) : QString();
}

QString withDefaultSuffix(const QString& path, const QString& suffix) {
    if (path.isEmpty() || suffix.isEmpty() || !QFileInfo(path).suffix().isEmpty()) return path;
    return path + suffix;
}

} // namespace gpuphot::ui
