#include "ui/pipeline_worker.hpp"

#include "core/pipeline/device_registry.hpp"

#include <QMetaObject>

#include <cmath>
#include <exception>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/catalog/reference_catalog.hpp"
#include "core/io/fits_image.hpp"
#include "core/model/frame.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/util/errors.hpp"

namespace gpuphot::ui {

void registerWorkerMetaTypes() {
    static const bool once = [] {
        qRegisterMetaType<gpuphot::PipelineConfig>("gpuphot::PipelineConfig");
        qRegisterMetaType<gpuphot::ui::SnapshotPtr>("gpuphot::ui::SnapshotPtr");
        qRegisterMetaType<gpuphot::ui::FramePtr>("gpuphot::ui::FramePtr");
        qRegisterMetaType<gpuphot::ui::ReferencePtr>("gpuphot::ui::ReferencePtr");
        return true;
    }();
    (void)once;
}

namespace {
std::string instrumentKey(const PipelineConfig& c) {
    return nlohmann::json{{"k", c.keywords}, {"i", c.instrument}}.dump();
}
} // namespace

PipelineWorker::PipelineWorker(QObject* parent) : QObject(parent) {
    registerWorkerMetaTypes();
    // CUDA when the program links the CUDA backend and a device is present (the context then keeps its
    // device pool and the uploaded frame between runs), else the CPU.
    try {
        m_ctx.backend = resolveBackend(Backend::Auto);
    } catch (const std::exception&) {
        m_ctx.backend = Backend::Cpu;
    }
    m_ctx.cancelFlag = &m_cancel;
    m_ctx.progress = [this](const std::string& stage, double fraction) { reportProgress(stage, fraction); };
}

PipelineWorker::~PipelineWorker() = default;

void PipelineWorker::setThreads(int threads) { m_ctx.threads = threads; }
void PipelineWorker::setEmitStaleResults(bool on) { m_emitStale = on; }

quint64 PipelineWorker::requestRun(const PipelineConfig& config) {
    quint64 generation = 0;
    {
        std::lock_guard lock(m_mutex);
        generation = ++m_generation;
        if (m_pending) ++m_superseded; // never started: replaced by this one
        m_pending = config;
        m_pendingGeneration = generation;
        m_latestConfig = config;
        m_cancel.store(true); // the run in progress (if any) is stale now
    }
    QMetaObject::invokeMethod(this, &PipelineWorker::processPending, Qt::QueuedConnection);
    return generation;
}

void PipelineWorker::cancel() {
    std::lock_guard lock(m_mutex);
    if (m_pending) ++m_superseded;
    m_pending.reset();
    m_cancel.store(true);
}

void PipelineWorker::reportProgress(const std::string& stage, double fraction) {
    // Called from OpenMP threads too: at most one signal per stage change or per 50 ms.
    const auto now = std::chrono::steady_clock::now();
    {
        std::lock_guard lock(m_progressMutex);
        if (stage == m_progressStage && fraction < 1.0 && now - m_progressTime < std::chrono::milliseconds(50)) return;
        m_progressStage = stage;
        m_progressTime = now;
    }
    emit progress(QString::fromStdString(stage), fraction);
}

FramePtr PipelineWorker::frameFor(const PipelineConfig& config) {
    if (!m_frame) return nullptr;
    const std::string key = instrumentKey(config);
    if (m_resolvedFrame && key == m_resolvedKey) return m_resolvedFrame;
    if (!m_framePath.empty()) {
        // Saturation also decides the mask: read the file again, as `reduce` would with this config.
        FrameReadOptions read;
        read.hdu = m_frameHdu;
        read.keywords = config.keywords;
        read.overrides = config.instrument;
        m_resolvedFrame = std::make_shared<const Frame>(readFrame(m_framePath, read));
    } else {
        auto frame = std::make_shared<Frame>(*m_frame);
        frame->instrument = readInstrument(frame->header, config.keywords, config.instrument);
        m_resolvedFrame = std::move(frame);
    }
    m_resolvedKey = key;
    return m_resolvedFrame;
}

ReferencePtr PipelineWorker::referenceFor(const FramePtr& framePtr) {
    const Frame& frame = *framePtr;
    if (!m_reference) return nullptr;
    if (m_movedReference && m_movedFor == framePtr) return m_movedReference;
    // As reduceFrame: positions moved to the frame's epoch when the catalog has proper motions.
    m_movedReference = m_reference;
    m_movedFor = framePtr;
    if (std::isfinite(frame.instrument.mjdMid)) {
        bool anyPm = false;
        for (std::size_t i = 0; i < m_reference->pmRa.size() && !anyPm; ++i) anyPm = std::isfinite(m_reference->pmRa[i]);
        if (anyPm) {
            auto moved = std::make_shared<ReferenceCatalog>(*m_reference);
            applyProperMotion(*moved, 2000.0 + (frame.instrument.mjdMid - 51544.5) / 365.25);
            m_movedReference = std::move(moved);
        }
    }
    return m_movedReference;
}

void PipelineWorker::processPending() {
    PipelineConfig config;
    quint64 generation = 0;
    {
        std::lock_guard lock(m_mutex);
        if (!m_pending) return; // coalesced into an earlier call, or cancelled
        config = std::move(*m_pending);
        m_pending.reset();
        generation = m_pendingGeneration;
        m_cancel.store(false); // a request after this point cancels this run
    }
    if (!m_frame) {
        emit runFailed(QStringLiteral("no frame is loaded"), generation);
        return;
    }
    m_running.store(true);
    emit started(generation);
#ifdef _OPENMP
    if (m_ctx.threads > 0) omp_set_num_threads(m_ctx.threads); // per thread in OpenMP: set it here
#endif
    try {
        const FramePtr frame = frameFor(config);
        const ReferencePtr reference = referenceFor(frame);
        auto snap = std::make_shared<Snapshot>();
        snap->generation = generation;
        snap->frame = frame;
        snap->reference = reference;
        snap->config = config;
        snap->backend = backendName(m_ctx.backend);
        Stage first = Stage::Background;
        if (m_last && m_last->frame == frame && m_last->reference == reference) {
            first = firstAffectedStage(m_last->config, config);
            if (first != Stage::Background) snap->result = m_last->result; // reused stages (one copy per run)
        }
        snap->firstStage = first;
        m_ctx.records.clear();
        {
            std::lock_guard lock(m_progressMutex);
            m_progressStage.clear();
        }
        runPipeline(*frame, config, m_ctx, snap->result, first, reference.get());
        snap->timings = m_ctx.records;
        m_last = snap; // valid for its config even when stale: the base of the next incremental run
        ++m_completedRuns;
        m_running.store(false);
        bool stale = false;
        {
            std::lock_guard lock(m_mutex);
            stale = m_pending.has_value() || generation != m_generation.load();
        }
        if (!stale || m_emitStale) emit resultReady(SnapshotPtr(std::move(snap)));
    } catch (const Cancelled&) {
        m_running.store(false);
        ++m_cancelledRuns;
        emit cancelled(generation);
    } catch (const std::exception& e) {
        m_running.store(false);
        emit runFailed(QString::fromStdString(e.what()), generation);
    }
}

void PipelineWorker::loadFrame(const QString& path, const QString& hdu) {
    PipelineConfig config;
    {
        std::lock_guard lock(m_mutex);
        config = m_latestConfig;
    }
    try {
        FrameReadOptions read;
        read.hdu = hdu.toStdString();
        read.keywords = config.keywords;
        read.overrides = config.instrument;
        auto frame = std::make_shared<const Frame>(readFrame(path.toStdString(), read));
        m_frame = frame;
        m_resolvedFrame = frame;
        m_resolvedKey = instrumentKey(config);
        m_framePath = path.toStdString();
        m_frameHdu = read.hdu;
        m_last.reset();
        m_movedReference.reset();
        m_movedFor.reset();
        emit frameLoaded(frame);
    } catch (const std::exception& e) {
        emit loadFailed(QString::fromStdString(e.what()));
    }
}

void PipelineWorker::setFrame(FramePtr frame) {
    m_frame = frame;
    m_framePath.clear();
    m_frameHdu.clear();
    m_resolvedFrame.reset();
    m_resolvedKey.clear();
    m_last.reset();
    m_movedReference.reset();
    m_movedFor.reset();
    if (frame) emit frameLoaded(frame);
}

void PipelineWorker::loadReference(const QString& path, const QString& columns) {
    if (path.isEmpty()) {
        setReference(nullptr);
        return;
    }
    try {
        auto ref = std::make_shared<const ReferenceCatalog>(
            readReferenceCatalog(path.toStdString(), parseRefColumnMap(columns.toStdString())));
        setReference(ref);
    } catch (const std::exception& e) {
        emit loadFailed(QString::fromStdString(e.what()));
    }
}

void PipelineWorker::setReference(ReferencePtr reference) {
    m_reference = std::move(reference);
    m_movedReference.reset();
    m_movedFor.reset();
    emit referenceLoaded(m_reference);
}

PipelineWorkerThread::PipelineWorkerThread() {
    registerWorkerMetaTypes();
    m_thread.setObjectName(QStringLiteral("PipelineWorker"));
    m_worker = new PipelineWorker;
    m_worker->moveToThread(&m_thread);
    m_thread.start();
}

PipelineWorkerThread::~PipelineWorkerThread() {
    m_worker->cancel();
    m_thread.quit();
    m_thread.wait();
    delete m_worker; // its thread has finished: no event can reach it any more
}

} // namespace gpuphot::ui
