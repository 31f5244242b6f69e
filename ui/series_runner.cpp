#include "ui/series_runner.hpp"

#include <QPointer>
#include <QThread>

#include <algorithm>

namespace gpuphot::ui {

SeriesRunner::SeriesRunner(QObject* parent) : QObject(parent) {
    qRegisterMetaType<SeriesResultPtr>();
}

SeriesRunner::~SeriesRunner() {
    if (m_thread) {
        m_thread->wait();
        delete m_thread;
    }
}

void SeriesRunner::setCatalogs(std::vector<std::string> catalogs) {
    m_catalogs = std::move(catalogs);
    schedule(true);
}

void SeriesRunner::addCatalog(const std::string& catalog) {
    if (std::find(m_catalogs.begin(), m_catalogs.end(), catalog) != m_catalogs.end()) return;
    m_catalogs.push_back(catalog);
    schedule(false);
}

void SeriesRunner::setTargets(TargetList targets) {
    m_targets = std::move(targets);
    schedule(true);
}

void SeriesRunner::setParams(SeriesParams params) {
    m_params = std::move(params);
    schedule(true);
}

void SeriesRunner::setInputs(TargetList targets, SeriesParams params) {
    m_targets = std::move(targets);
    m_params = std::move(params);
    schedule(true);
}

void SeriesRunner::rerun() {
    schedule(true);
}

void SeriesRunner::schedule(bool rebuild) {
    m_rebuild = m_rebuild || rebuild;
    m_pending = true;
    if (!m_thread) startNext();
}

// Appends when the last result was made from a prefix-free subset of the catalogs with the same targets
// and parameters (appendSeries checks those through the state's fingerprint and says when it cannot).
void SeriesRunner::startNext() {
    if (!m_pending || m_catalogs.empty() || m_targets.size() == 0) return;
    m_pending = false;
    auto job = std::make_shared<Job>(Job{m_catalogs, m_targets, m_params, std::nullopt, {}});
    if (!m_rebuild && m_result) {
        for (const auto& c : m_catalogs)
            if (std::find(m_resultCatalogs.begin(), m_resultCatalogs.end(), c) == m_resultCatalogs.end())
                job->newOnes.push_back(c);
        job->state = m_result->state;
    }
    m_rebuild = false;
    emit started();
    QPointer<SeriesRunner> self(this);
    m_thread = QThread::create([self, job] {
        SeriesResultPtr result;
        QString error;
        try {
            result = run(*job);
        } catch (const std::exception& e) {
            error = QString::fromStdString(e.what());
        }
        if (self)
            QMetaObject::invokeMethod(
                self, [self, result, error, cat = job->catalogs] { self->finished(result, error, cat); },
                Qt::QueuedConnection);
    });
    m_thread->start();
}

SeriesResultPtr SeriesRunner::run(Job& job) {
    if (job.state) {
        if (job.newOnes.empty()) return nullptr; // nothing new: the shown result stands
        if (auto r = appendSeries(*job.state, job.newOnes, job.targets, job.params))
            return std::make_shared<const SeriesResult>(std::move(*r));
    }
    return std::make_shared<const SeriesResult>(buildSeries(job.catalogs, job.targets, job.params));
}

void SeriesRunner::finished(SeriesResultPtr result, const QString& error,
                            const std::vector<std::string>& catalogs) {
    if (m_thread) {
        m_thread->wait();
        delete m_thread;
        m_thread = nullptr;
    }
    if (!error.isEmpty()) {
        m_rebuild = true; // the next request starts from the catalogs
        emit failed(error);
    } else if (result && !(m_pending && m_rebuild)) {
        // A rebuild asked for while this job ran (other targets or parameters) supersedes its result:
        // showing it would flash a curve the user has already moved away from.
        m_result = std::move(result);
        m_resultCatalogs = catalogs;
        emit resultReady(m_result);
    }
    startNext();
}

} // namespace gpuphot::ui
