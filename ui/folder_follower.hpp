#pragma once
// "Follow a folder": at the telescope the camera writes frames into a directory; the newest complete
// FITS frame is announced as soon as it is ready. A file counts as complete when every HDU's header
// and data are on disk (fitsFileComplete; the camera may still be writing), checked at each change of
// the folder and each poll.
#include <QDateTime>
#include <QFileSystemWatcher>
#include <QObject>
#include <QString>
#include <QTimer>

namespace gpuphot::ui {

class FolderFollower : public QObject {
    Q_OBJECT
public:
    explicit FolderFollower(QObject* parent = nullptr);

    // Starts following `dir` (an empty string stops). Frames already present are not announced.
    void follow(const QString& dir);
    QString folder() const { return m_dir; }
    void setPollInterval(int ms) { m_poll.setInterval(ms); }

signals:
    void frameReady(const QString& path);

private slots:
    void poll();

private:
    QString newestCandidate() const;

    QString m_dir;
    QFileSystemWatcher m_watcher;
    QTimer m_poll;
    QDateTime m_lastAnnounced; // modification time of the last announced frame
    QString m_lastPath;
};

} // namespace gpuphot::ui
