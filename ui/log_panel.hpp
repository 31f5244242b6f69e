#pragma once
// Log panel: a read-only QPlainTextEdit of timestamped lines with a level ("12:03:04.512 WARN ..."),
// capped at a number of lines (the oldest go first). setSnapshot logs a run's backend, stage times and
// warnings.
#include <QString>
#include <QWidget>

#include "ui/snapshot.hpp"

class QPlainTextEdit;

namespace gpuphot::ui {

enum class LogLevel { Debug, Info, Warning, Error };
const char* logLevelName(LogLevel level); // "DEBUG", "INFO", "WARN", "ERROR"

class LogPanel : public QWidget {
    Q_OBJECT
public:
    explicit LogPanel(QWidget* parent = nullptr);

    void setMaximumLines(int lines); // default 5000
    int maximumLines() const { return m_maxLines; }
    int lineCount() const;
    QString text() const;
    QPlainTextEdit* editor() const { return m_edit; }
    void clear();

    // One line per run: generation, backend, total and per-stage times; then its warnings.
    void setSnapshot(SnapshotPtr snapshot);

public slots:
    void append(gpuphot::ui::LogLevel level, const QString& text);
    void info(const QString& text) { append(LogLevel::Info, text); }
    void warning(const QString& text) { append(LogLevel::Warning, text); }
    void error(const QString& text) { append(LogLevel::Error, text); }

private:
    QPlainTextEdit* m_edit = nullptr;
    int m_maxLines = 5000;
    std::uint64_t m_lastGeneration = ~std::uint64_t{0};
};

} // namespace gpuphot::ui
