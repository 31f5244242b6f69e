#include "ui/log_panel.hpp"

#include <QDateTime>
#include <QPlainTextEdit>
#include <QScrollBar>
#include <QTextBlock>
#include <QTextCursor>
#include <QTextDocument>
#include <QVBoxLayout>

namespace gpuphot::ui {

const char* logLevelName(LogLevel level) {
    switch (level) {
    case LogLevel::Debug:
        return "DEBUG";
    case LogLevel::Info:
        return "INFO";
    case LogLevel::Warning:
        return "WARN";
    case LogLevel::Error:
        return "ERROR";
    }
    return "INFO";
}

LogPanel::LogPanel(QWidget* parent) : QWidget(parent) {
    auto* layout = new QVBoxLayout(this);
    layout->setContentsMargins(0, 0, 0, 0);
    m_edit = new QPlainTextEdit(this);
    m_edit->setReadOnly(true);
    m_edit->setLineWrapMode(QPlainTextEdit::NoWrap);
    m_edit->setMaximumBlockCount(m_maxLines);
    QFont mono(QStringLiteral("monospace"));
    mono.setStyleHint(QFont::Monospace);
    m_edit->setFont(mono);
    layout->addWidget(m_edit);
}

void LogPanel::setMaximumLines(int lines) {
    m_maxLines = std::max(1, lines);
    m_edit->setMaximumBlockCount(m_maxLines);
}

int LogPanel::lineCount() const {
    return m_edit->document()->isEmpty() ? 0 : m_edit->document()->blockCount();
}
QString LogPanel::text() const {
    return m_edit->toPlainText();
}
void LogPanel::clear() {
    m_edit->clear();
}

void LogPanel::append(LogLevel level, const QString& text) {
    const QString stamp = QDateTime::currentDateTime().toString(QStringLiteral("HH:mm:ss.zzz"));
    const QString name = QString::fromLatin1(logLevelName(level)).leftJustified(5);
    QString line = stamp + QLatin1Char(' ') + name + QLatin1Char(' ') + text;
    line.replace(QLatin1Char('\n'), QStringLiteral(" / "));
    QScrollBar* bar = m_edit->verticalScrollBar();
    const bool atEnd = bar->value() >= bar->maximum() - 2;
    QTextCharFormat format;
    if (level == LogLevel::Error)
        format.setForeground(QColor(0xc0, 0, 0));
    else if (level == LogLevel::Warning)
        format.setForeground(QColor(0xa0, 0x60, 0));
    else if (level == LogLevel::Debug)
        format.setForeground(QColor(0x80, 0x80, 0x80));
    QTextCursor cursor(m_edit->document());
    cursor.movePosition(QTextCursor::End);
    if (!m_edit->document()->isEmpty()) cursor.insertBlock();
    cursor.insertText(line, format);
    if (atEnd) bar->setValue(bar->maximum());
}

void LogPanel::setSnapshot(SnapshotPtr snapshot) {
    if (!snapshot || snapshot->generation == m_lastGeneration) return;
    m_lastGeneration = snapshot->generation;
    double total = 0.0;
    QStringList parts;
    for (const StageRecord& t : snapshot->timings) {
        total += t.seconds;
        parts << QStringLiteral("%1 %2 ms")
                     .arg(QString::fromStdString(t.stage))
                     .arg(t.seconds * 1e3, 0, 'f', 1);
    }
    const auto& r = snapshot->result;
    QString line =
        QStringLiteral("run %1 (%2, from %3): %4 sources, %5 ms")
            .arg(snapshot->generation)
            .arg(QString::fromStdString(snapshot->backend.empty() ? std::string("cpu") : snapshot->backend))
            .arg(QString::fromLatin1(stageName(snapshot->firstStage)))
            .arg(r.detection.sources.size())
            .arg(total * 1e3, 0, 'f', 1);
    if (!parts.isEmpty())
        line += QStringLiteral(" [") + parts.join(QStringLiteral(", ")) + QStringLiteral("]");
    append(LogLevel::Info, line);
    for (const std::string& w : r.warnings)
        append(LogLevel::Warning, QString::fromStdString(w));
}

} // namespace gpuphot::ui
