#pragma once
// The workbench's pipeline worker (docs/ARCHITECTURE.md "Front ends"): one QObject living on its own QThread
// that owns the RunContext (threads, backend: CUDA when linked and present, with its device pool), the loaded
// Frame, the optional reference catalog and the last successful result. Each request re-runs the pipeline
// from the first stage its parameters affect; a newer request cancels the running one through the
// RunContext's cancel flag, and only the newest result reaches the UI (resultReady).
//
// Threading: requestRun() and cancel() are thread-safe and return at once (they store the request,
// raise the cancel flag and queue the run on the worker's thread). loadFrame()/loadReference()/setFrame()
// are slots meant to be invoked queued (signal connections across threads, or QMetaObject::invokeMethod);
// they run on the worker's thread and are ordered with the runs. Signals are emitted from the worker's
// thread (progress() also from OpenMP threads) and reach UI-thread receivers queued.
#include <QObject>
#include <QString>
#include <QThread>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/pipeline/pipeline_config.hpp"
#include "core/pipeline/run_context.hpp"
#include "ui/pipeline_types.hpp"
#include "ui/snapshot.hpp"

namespace gpuphot::ui {

class PipelineWorker : public QObject {
    Q_OBJECT
public:
    explicit PipelineWorker(QObject* parent = nullptr);
    ~PipelineWorker() override;

    // Worker settings; call before the thread starts or between runs (they are read on the worker thread).
    void setThreads(int threads);        // 0: all cores
    void setEmitStaleResults(bool on);   // testing aid: also emit results a newer request superseded
    // Reuse of identical PSF star fits between runs (on by default; PsfFitCache, results unchanged).
    void setPsfFitCacheEnabled(bool on);
    // Thread-safe: the catalog table's sort (CatalogModel::Column, -1: none) and aperture index; each result
    // then carries its table flags and row order (Snapshot::catalog), computed here, off the UI thread.
    void setCatalogSort(int column, bool descending, int aperture);
    // Idle-time precomputation (off by default; thread-safe): after each result, while no request waits,
    // the worker runs the same configuration with the detection threshold `step` lower and higher
    // (`count` steps each way) and keeps those complete results (at most 2 * count, frames up to 16 MP).
    // A request for one of them is answered with it at once; the results are the ones a run would give
    // (same deterministic computation), and a real request cancels a precomputation in progress.
    void setThresholdPrefetch(double step, int count = 1);
    quint64 prefetchedRuns() const { return m_prefetchedRuns.load(); } // precomputations completed
    quint64 prefetchHits() const { return m_prefetchHits.load(); }     // requests answered by one
    // Two-step results (off by default; thread-safe): a run that re-detects (a detection or background
    // edit) on a frame with an earlier complete result first emits provisionalReady as soon as the new
    // detection exists, with apertures and calibration measured using the earlier result's PSF model
    // (Snapshot::provisional; the PSF stage's own per-source fluxes NaN), then resultReady with the
    // complete result, bitwise the one a run without this setting gives. Costs the provisional aperture
    // and calibration stages (tens of ms on the demo frame) on top of the complete run.
    void setProvisionalResults(bool on) { m_provisionalResults.store(on); }
    quint64 provisionalResults() const { return m_provisionalEmitted.load(); } // provisionalReady emitted

    // Counters, readable from any thread.
    quint64 latestGeneration() const { return m_generation.load(); }
    quint64 cancelledRuns() const { return m_cancelledRuns.load(); }   // runs stopped by Cancelled
    quint64 supersededRequests() const { return m_superseded.load(); } // requests replaced before they started
    quint64 completedRuns() const { return m_completedRuns.load(); }
    bool isRunning() const { return m_running.load(); }

public slots:
    // Thread-safe and immediate: the config becomes the newest request (an older pending one is dropped),
    // the run in progress is told to stop, and the run is queued on the worker's thread. Returns the
    // request's generation (Snapshot::generation of its result). Call it directly, not through a queued
    // connection: a queued call would wait behind the running job and could not cancel it.
    quint64 requestRun(const gpuphot::PipelineConfig& config);
    // Stops the run in progress and drops a pending request (no result is emitted for either).
    void cancel();

    // Queued slots (run on the worker's thread).
    // Reads a frame (readFrame with the HDU: "" first image, number, or EXTNAME) using the instrument
    // keywords/overrides of the newest requested config; emits frameLoaded or loadFailed. The last
    // result is dropped: the next run starts from the background.
    void loadFrame(const QString& path, const QString& hdu = QString());
    // Uses an in-memory frame (the demo, tests). Its instrument is re-read from its header when a config
    // changes the keywords or overrides.
    void setFrame(gpuphot::ui::FramePtr frame);
    // Reads a reference catalog (FITS table or CSV; columns as `reduce --ref-columns`); emits
    // referenceLoaded or loadFailed. An empty path removes the reference.
    void loadReference(const QString& path, const QString& columns = QString());
    void setReference(gpuphot::ui::ReferencePtr reference);
    // Master bias / dark / flat and bad-pixel mask for the frame preparation (empty: not used); loaded
    // once here (loadPrepareInputs, with the newest config's prepare parameters), again only when the
    // auto-bad-pixel parameters change. Emits loadFailed when a file cannot be used. The next run
    // re-prepares the frame and starts from the background.
    void setCalibrationFrames(const QString& bias, const QString& dark, const QString& flat, const QString& bpm);

signals:
    void started(quint64 generation);
    void progress(const QString& stage, double fraction);
    void resultReady(gpuphot::ui::SnapshotPtr snapshot);
    // A provisional snapshot (setProvisionalResults) of the request whose complete result follows.
    void provisionalReady(gpuphot::ui::SnapshotPtr snapshot);
    void runFailed(const QString& message, quint64 generation);
    void cancelled(quint64 generation);
    void frameLoaded(gpuphot::ui::FramePtr frame);
    void referenceLoaded(gpuphot::ui::ReferencePtr reference); // null when removed
    void loadFailed(const QString& message);
    // After setCalibrationFrames: the files now in use (all empty when one could not be used: loadFailed).
    void calibrationFramesSet(const QString& bias, const QString& dark, const QString& flat, const QString& bpm);

private slots:
    void processPending();
    void prefetchNext(); // one queued precomputation, if no request waits

private:
    // The prepared frame for a config: the instrument re-resolved when keywords/overrides changed, then
    // prepareFrame (config.prepare, the calibration frames) on a copy, redone when any of these changed.
    FramePtr frameFor(const PipelineConfig& config);
    const PrepareInputs* prepareInputsFor(const PrepareParams& params); // null when no calibration files
    ReferencePtr referenceFor(const FramePtr& frame);   // proper motions applied to the frame's epoch
    void reportProgress(const std::string& stage, double fraction);
    // The provisional snapshot of `snap`, whose detection has just completed (setProvisionalResults):
    // apertures and calibration with `previous`'s PSF model, emitted as provisionalReady.
    // Measures and emits the provisional snapshot of `snap` (paused where the PSF stage starts). The new
    // background and detection move into it, so nothing is copied before it goes out; `snap` gets copies of
    // them back afterwards, for the rest of its run.
    void publishProvisional(Snapshot& snap, const Snapshot& previous);

    RunContext m_ctx;
    std::atomic<bool> m_cancel{false};
    std::atomic<quint64> m_generation{0};
    std::atomic<quint64> m_cancelledRuns{0}, m_superseded{0}, m_completedRuns{0};
    std::atomic<bool> m_running{false};
    bool m_emitStale = false;

    std::mutex m_mutex; // guards m_pending, m_pendingGeneration, m_latestConfig, m_cancel's reset
    std::optional<PipelineConfig> m_pending;
    quint64 m_pendingGeneration = 0;
    PipelineConfig m_latestConfig; // the newest requested config (keywords/overrides for loadFrame)

    // Worker-thread state.
    FramePtr m_frame;          // as loaded (instrument from the load-time keywords/overrides)
    FramePtr m_rawResolved;    // m_frame with the instrument of the last run's keywords/overrides
    std::string m_rawKey;      // JSON of those keywords/overrides
    FramePtr m_resolvedFrame;  // m_rawResolved after prepareFrame with the last run's prepare parameters
    std::string m_resolvedKey; // m_rawKey + JSON of those prepare parameters and the calibration files
    PrepareResult m_prepared;  // what the last preparation did
    struct CalibrationFiles {
        std::string bias, dark, flat, bpm;
    } m_calibFiles;
    std::optional<PrepareInputs> m_prepareInputs; // loaded calibration frames (none: no files)
    std::string m_prepareInputsKey;               // files + auto-bad-pixel parameters they were loaded with
    std::string m_framePath, m_frameHdu;
    ReferencePtr m_reference, m_movedReference;
    FramePtr m_movedFor; // the frame m_movedReference was moved for
    SnapshotPtr m_last; // last successful run (the base of incremental re-runs)
    std::shared_ptr<PsfFitCache> m_psfCache; // PSF star fits of earlier runs on this frame (null: disabled)
    struct CatalogSort {
        int column = -1;
        bool descending = false;
        int aperture = 0;
    } m_catalogSort; // guarded by m_mutex
    double m_prefetchStep = 0.0; // guarded by m_mutex
    int m_prefetchCount = 1;     // guarded by m_mutex
    std::vector<PipelineConfig> m_prefetchQueue;                            // worker thread
    std::vector<std::pair<std::string, SnapshotPtr>> m_prefetched; // config JSON -> complete result
    SnapshotPtr m_previous; // the result before m_last (a neighbour after a one-step edit: kept, not recomputed)
    std::atomic<quint64> m_prefetchedRuns{0}, m_prefetchHits{0};
    std::atomic<bool> m_provisionalResults{false};
    std::atomic<quint64> m_provisionalEmitted{0};
    void schedulePrefetch(); // after a result: queue the neighbours of its config

    std::mutex m_progressMutex;
    std::string m_progressStage;
    std::chrono::steady_clock::time_point m_progressTime;
};

// Owns a QThread with a PipelineWorker on it; the destructor cancels, stops and joins the thread.
class PipelineWorkerThread {
public:
    PipelineWorkerThread();
    ~PipelineWorkerThread();
    PipelineWorkerThread(const PipelineWorkerThread&) = delete;
    PipelineWorkerThread& operator=(const PipelineWorkerThread&) = delete;
    PipelineWorker* worker() const { return m_worker; }
    QThread* thread() { return &m_thread; }

private:
    QThread m_thread;
    PipelineWorker* m_worker = nullptr;
};

// Registers the metatypes that travel through queued connections (idempotent).
void registerWorkerMetaTypes();

} // namespace gpuphot::ui
