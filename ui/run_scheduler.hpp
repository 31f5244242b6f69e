#pragma once
// UI-thread helper between the parameter dock and the PipelineWorker: edits arrive at typing speed, the
// scheduler waits until they pause (debounce, 150 ms by default) and forwards only the latest config.
#include <QObject>
#include <QTimer>

#include "core/pipeline/pipeline_config.hpp"
#include "ui/pipeline_types.hpp"

namespace gpuphot::ui {

class PipelineWorker;

class RunScheduler : public QObject {
    Q_OBJECT
public:
    explicit RunScheduler(PipelineWorker* worker, QObject* parent = nullptr);

    void setDelay(int milliseconds); // debounce interval (0: forward on the next event-loop turn)
    int delay() const { return m_timer.interval(); }
    bool isPending() const { return m_timer.isActive(); }
    const PipelineConfig& latestConfig() const { return m_latest; }

public slots:
    // Debounced: restarts the timer; when it fires, the latest config goes to the worker.
    void schedule(const gpuphot::PipelineConfig& config);
    // Immediate (a new frame, an explicit "Run" button): forwards the config now, dropping a pending edit.
    void runNow(const gpuphot::PipelineConfig& config);
    void runLatest(); // runNow(latestConfig())

signals:
    void requested(quint64 generation); // a config went to the worker under this generation

private:
    void forward();

    PipelineWorker* m_worker;
    QTimer m_timer;
    PipelineConfig m_latest;
};

} // namespace gpuphot::ui
