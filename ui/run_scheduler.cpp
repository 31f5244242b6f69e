#include "ui/run_scheduler.hpp"

#include <algorithm>

#include "ui/pipeline_worker.hpp"

namespace gpuphot::ui {

RunScheduler::RunScheduler(PipelineWorker* worker, QObject* parent) : QObject(parent), m_worker(worker) {
    m_timer.setSingleShot(true);
    m_timer.setInterval(150);
    connect(&m_timer, &QTimer::timeout, this, &RunScheduler::forward);
}

void RunScheduler::setDelay(int milliseconds) { m_timer.setInterval(std::max(0, milliseconds)); }

void RunScheduler::schedule(const PipelineConfig& config) {
    m_latest = config;
    m_timer.start(); // restarts: only a pause in the edits lets it fire
}

void RunScheduler::runNow(const PipelineConfig& config) {
    m_latest = config;
    m_timer.stop();
    forward();
}

void RunScheduler::runLatest() { runNow(m_latest); }

void RunScheduler::forward() {
    if (!m_worker) return;
    emit requested(m_worker->requestRun(m_latest)); // thread-safe, returns at once
}

} // namespace gpuphot::ui
