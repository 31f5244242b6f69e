#pragma once
// "Follow a folder": at the telescope the camera writes frames into a directory; the newest complete
// FITS frame is announced as soon as it is ready. A file counts as complete when every HDU's header
// and data are on disk (fitsFileComplete; the camera may still be writing), checked at each change of
// the folder and each poll.
#include <QDateTime>
#include <QFileInfoList>
#include <QFileSystemWatcher>
#include <QObject>
#include <QSet>
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
    // Every complete new frame, oldest first (true), or only the newest one (false, the default: at the
    // telescope the newest frame is the one to look at).
    void setEveryFrame(bool on) { m_everyFrame = on; }
    bool everyFrame() const { return m_everyFrame; }

signals:
    void frameReady(const QString& path);

private slots:
    void poll();

private:
    QFileInfoList candidates() const; // frames in the folder, newest first (our own outputs left out)
    QString newestCandidate() const;
    void announceEvery();

    QString m_dir;
    QFileSystemWatcher m_watcher;
    QTimer m_poll;
    QDateTime m_lastAnnounced; // modification time of the last announced frame
    QString m_lastPath;
    bool m_everyFrame = false;
    QSet<QString> m_seen; // every-frame mode: "path|mtime" of the frames announced or already there
};

} // namespace gpuphot::ui
