#include "ui/file_names.hpp"

#include <QFileDialog>
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

QString askSavePath(QWidget* parent, const QString& title, const QString& filters) {
    QString chosen;
    const QString p = QFileDialog::getSaveFileName(parent, title, QString(), filters, &chosen);
    return withDefaultSuffix(
        p, filterSuffix(chosen.isEmpty() ? filters.section(QStringLiteral(";;"), 0, 0) : chosen));
}

} // namespace gpuphot::ui
