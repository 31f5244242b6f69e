#include "ui/run_scheduler.hpp"

#include <algorithm>

#include "ui/pipeline_worker.hpp"

namespace gpuphot::ui {

RunScheduler::RunScheduler(PipelineWorker* worker, QObject* parent) : QObject(parent), m_worker(worker) {
    m_timer.setSingleShot(true);
    m_timer.setInterval(150);
    connect(&m_timer, &QTimer::timeout, this, &RunScheduler::onPause);
}

void RunScheduler::setDelay(int milliseconds) {
    m_timer.setInterval(std::max(0, milliseconds));
}

void RunScheduler::schedule(const PipelineConfig& config) {
    m_latest = config;
    if (m_timer.isActive()) {
        m_trailing = true; // within a burst: only a pause lets the latest go
    } else {
        m_trailing = false; // the first edit after a pause goes at once
        forward();
    }
    m_timer.start();
}

void RunScheduler::onPause() {
    if (!m_trailing) return;
    m_trailing = false;
    forward();
}

void RunScheduler::runNow(const PipelineConfig& config) {
    m_latest = config;
    m_timer.stop();
    m_trailing = false;
    forward();
}

void RunScheduler::runLatest() {
    runNow(m_latest);
}

void RunScheduler::forward() {
    if (!m_worker) return;
    emit requested(m_worker->requestRun(m_latest)); // thread-safe, returns at once
}

} // namespace gpuphot::ui
