#include "ui/folder_follower.hpp"

#include <QDir>
#include <QFileInfo>

#include "core/io/fits_image.hpp"
#include "core/util/errors.hpp"

namespace gpuphot::ui {

FolderFollower::FolderFollower(QObject* parent) : QObject(parent) {
    m_poll.setInterval(500);
    connect(&m_poll, &QTimer::timeout, this, &FolderFollower::poll);
    connect(&m_watcher, &QFileSystemWatcher::directoryChanged, this, [this] { poll(); });
}

void FolderFollower::follow(const QString& dir) {
    if (!m_watcher.directories().isEmpty()) m_watcher.removePaths(m_watcher.directories());
    m_dir = dir;
    m_candidate.clear();
    m_candidateSize = -1;
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
    m_watcher.addPath(dir);
    m_poll.start();
}

QString FolderFollower::newestCandidate() const {
    const QDir d(m_dir);
    const QFileInfoList files =
        d.entryInfoList({QStringLiteral("*.fits"), QStringLiteral("*.fit"), QStringLiteral("*.fts"),
                         QStringLiteral("*.fits.fz"), QStringLiteral("*.fz"), QStringLiteral("*.fits.gz")},
                        QDir::Files, QDir::Time);
    for (const QFileInfo& f : files) {
        // Our own outputs (catalogs, maps) are never frames to reduce.
        const QString n = f.fileName();
        if (n.contains(QStringLiteral(".cat.")) || n.endsWith(QStringLiteral(".wcs")) ||
            n.contains(QStringLiteral(".bkg.")) || n.contains(QStringLiteral(".rms.")) ||
            n.contains(QStringLiteral(".seg.")) || n.contains(QStringLiteral(".resid.")) ||
            n.contains(QStringLiteral(".psf.")) || n.contains(QStringLiteral(".solved.")) || n.startsWith('.'))
            continue;
        return f.absoluteFilePath();
    }
    return {};
}

void FolderFollower::poll() {
    if (m_dir.isEmpty()) return;
    const QString newest = newestCandidate();
    if (newest.isEmpty()) return;
    const QFileInfo info(newest);
    if (newest == m_lastPath && info.lastModified() <= m_lastAnnounced) return;
    if (newest != m_candidate) {
        m_candidate = newest;
        m_candidateSize = info.size();
        return; // wait one more poll for the size to settle
    }
    if (info.size() != m_candidateSize || info.size() == 0) {
        m_candidateSize = info.size();
        return;
    }
    try {
        (void)readHeader(newest.toStdString());
    } catch (const Error&) {
        return; // not complete (or not FITS) yet: try again at the next poll
    }
    m_lastPath = newest;
    m_lastAnnounced = info.lastModified();
    m_candidate.clear();
    emit frameReady(newest);
}

} // namespace gpuphot::ui
