#pragma once
// UI-thread helper between the parameter dock and the PipelineWorker: the first edit after a pause goes
// to the worker at once (a spin-box step, a typed value confirmed); edits that follow it within the
// interval (150 ms by default: typing, a held arrow key) wait until they pause, then only the latest
// config goes. The worker cancels a run that a newer request makes stale.
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

    void setDelay(int milliseconds); // the pause that ends a burst of edits
    int delay() const { return m_timer.interval(); }
    bool isPending() const { return m_trailing; } // an edit waits for the pause
    const PipelineConfig& latestConfig() const { return m_latest; }

public slots:
    // At once after a pause; else restarts the timer, and when it fires the latest config goes.
    void schedule(const gpuphot::PipelineConfig& config);
    // Immediate (a new frame, an explicit "Run" button): forwards the config now, dropping a pending edit.
    void runNow(const gpuphot::PipelineConfig& config);
    void runLatest(); // runNow(latestConfig())

signals:
    void requested(quint64 generation); // a config went to the worker under this generation

private:
    void forward();
    void onPause();

    PipelineWorker* m_worker;
    QTimer m_timer;
    PipelineConfig m_latest;
    bool m_trailing = false; // an edit within the burst has not gone yet
};

} // namespace gpuphot::ui
