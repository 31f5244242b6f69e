#include "ui/folder_follower.hpp"

#include <QDir>
#include <QFileInfo>

#include "core/pipeline/frame_status.hpp"

namespace gpuphot::ui {

namespace {
QString seenKey(const QFileInfo& f) {
    return f.absoluteFilePath() + QLatin1Char('|') + QString::number(f.lastModified().toMSecsSinceEpoch());
}
} // namespace

FolderFollower::FolderFollower(QObject* parent) : QObject(parent) {
    m_poll.setInterval(500);
    connect(&m_poll, &QTimer::timeout, this, &FolderFollower::poll);
    connect(&m_watcher, &QFileSystemWatcher::directoryChanged, this, [this] { poll(); });
}

void FolderFollower::follow(const QString& dir) {
    if (!m_watcher.directories().isEmpty()) m_watcher.removePaths(m_watcher.directories());
    m_dir = dir;
    m_lastPath.clear();
    m_lastAnnounced = QDateTime();
    if (dir.isEmpty()) {
        m_poll.stop();
        return;
    }
    // Frames already there are history, not new arrivals.
    const QString newest = newestCandidate();
    if (!newest.isEmpty()) {
        m_lastPath = newest;
        m_lastAnnounced = QFileInfo(newest).lastModified();
    }
    m_seen.clear();
    for (const QFileInfo& f : candidates())
        m_seen.insert(seenKey(f));
    m_watcher.addPath(dir);
    m_poll.start();
}

QFileInfoList FolderFollower::candidates() const {
    const QDir d(m_dir);
    QFileInfoList files =
        d.entryInfoList({QStringLiteral("*.fits"), QStringLiteral("*.fit"), QStringLiteral("*.fts"),
                         QStringLiteral("*.fits.fz"), QStringLiteral("*.fz"), QStringLiteral("*.fits.gz")},
                        QDir::Files, QDir::Time);
    // Our own outputs (catalogs, maps) are never frames to reduce.
    files.removeIf([](const QFileInfo& f) {
        const QString n = f.fileName();
        return n.contains(QStringLiteral(".cat.")) || n.endsWith(QStringLiteral(".wcs")) ||
               n.contains(QStringLiteral(".bkg.")) || n.contains(QStringLiteral(".rms.")) ||
               n.contains(QStringLiteral(".seg.")) || n.contains(QStringLiteral(".resid.")) ||
               n.contains(QStringLiteral(".psf.")) || n.contains(QStringLiteral(".solved.")) ||
               n.startsWith('.');
    });
    return files;
}

QString FolderFollower::newestCandidate() const {
    const QFileInfoList files = candidates();
    return files.isEmpty() ? QString() : files.front().absoluteFilePath();
}

// Every complete frame not announced yet, oldest first; one still being written waits for the next poll.
void FolderFollower::announceEvery() {
    const QFileInfoList files = candidates();
    for (auto it = files.crbegin(); it != files.crend(); ++it) {
        const QString key = seenKey(*it);
        if (m_seen.contains(key) || !fitsFileComplete(it->absoluteFilePath().toStdString())) continue;
        m_seen.insert(key);
        emit frameReady(it->absoluteFilePath());
    }
}

void FolderFollower::poll() {
    if (m_dir.isEmpty()) return;
    if (m_everyFrame) return announceEvery();
    const QString newest = newestCandidate();
    if (newest.isEmpty()) return;
    const QFileInfo info(newest);
    if (newest == m_lastPath && info.lastModified() <= m_lastAnnounced) return;
    // Complete when every HDU's header and data are on disk (as `gpuphot watch` asks): announced at the
    // change of the folder that completes it, or at the next poll.
    if (!fitsFileComplete(newest.toStdString())) return;
    m_lastPath = newest;
    m_lastAnnounced = info.lastModified();
    emit frameReady(newest);
}

} // namespace gpuphot::ui
