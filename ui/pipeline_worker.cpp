#include "ui/pipeline_worker.hpp"

#include "core/pipeline/device_registry.hpp"

#include <QMetaObject>

#include <cmath>
#include <exception>
#include <future>

#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef __linux__
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "core/catalog/reference_catalog.hpp"
#include "core/io/fits_image.hpp"
#include "core/model/frame.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/prepare_inputs.hpp"
#include "core/util/errors.hpp"
#include "ui/catalog_prep.hpp"

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
    m_ctx.tuning = BackendTuning::fromEnvironment(); // docs/CONFIG.md §Tuning
    m_ctx.tuning.applyToProcess();
    m_ctx.cancelFlag = &m_cancel;
    m_ctx.progress = [this](const std::string& stage, double fraction) { reportProgress(stage, fraction); };
    m_psfCache = std::make_shared<PsfFitCache>();
}

PipelineWorker::~PipelineWorker() = default;

void PipelineWorker::setThreads(int threads) {
    m_ctx.threads = threads;
}
void PipelineWorker::setEmitStaleResults(bool on) {
    m_emitStale = on;
}

void PipelineWorker::setPsfFitCacheEnabled(bool on) {
    if (on && !m_psfCache) m_psfCache = std::make_shared<PsfFitCache>();
    if (!on) m_psfCache.reset();
}

void PipelineWorker::setCatalogSort(int column, bool descending, int aperture) {
    std::lock_guard lock(m_mutex);
    m_catalogSort = {column, descending, aperture};
}

namespace {
// Frames up to this many pixels keep what makes the next edit quicker: two precomputed neighbours and the
// detection's images (~9 B/px), which a threshold edit thresholds again instead of making them.
constexpr double kQuickEditPixels = 16e6;
bool keepDetectionImages(const Frame& frame) {
    return static_cast<double>(frame.width()) * frame.height() <= kQuickEditPixels;
}
} // namespace

void PipelineWorker::setThresholdPrefetch(double step, int count) {
    std::lock_guard lock(m_mutex);
    m_prefetchStep = step > 0.0 ? step : 0.0;
    m_prefetchCount = std::max(1, count);
}

void PipelineWorker::schedulePrefetch() {
    double step = 0.0;
    int count = 1;
    {
        std::lock_guard lock(m_mutex);
        step = m_prefetchStep;
        count = m_prefetchCount;
    }
    m_prefetchQueue.clear();
    if (!(step > 0.0) || !m_last || !m_last->frame ||
        static_cast<double>(m_last->frame->width()) * m_last->frame->height() > kQuickEditPixels) {
        m_prefetched.clear();
        m_previous.reset();
        return;
    }
    const PipelineConfig& base = m_last->config;
    // Keep the precomputed results that are still neighbours; queue the missing ones, nearest first.
    std::vector<PipelineConfig> want;
    for (int k = 1; k <= count; ++k)
        for (int sgn : {1, -1}) {
            PipelineConfig c = base;
            c.detection.threshold = base.detection.threshold + sgn * k * step;
            // the parameter dock's rounding (2 decimals): the value a spin-box step gives
            c.detection.threshold = std::round(c.detection.threshold * 100.0) / 100.0;
            if (c.detection.threshold > 0.0) want.push_back(c);
        }
    std::vector<std::pair<std::string, SnapshotPtr>> keep;
    const auto sameData = [this](const SnapshotPtr& s) {
        return s && s->frame == m_last->frame && s->reference == m_last->reference;
    };
    for (const PipelineConfig& c : want) {
        const std::string key = nlohmann::json(c).dump();
        bool have = false;
        for (auto& e : m_prefetched)
            if (e.first == key && sameData(e.second)) {
                keep.push_back(std::move(e));
                have = true;
                break;
            }
        // The result just replaced (one step back) is a neighbour too: kept as it is.
        if (!have && sameData(m_previous) && nlohmann::json(m_previous->config).dump() == key) {
            keep.emplace_back(key, m_previous);
            have = true;
        }
        if (!have) m_prefetchQueue.push_back(c);
    }
    m_prefetched = std::move(keep);
    if (!m_prefetchQueue.empty())
        QMetaObject::invokeMethod(this, &PipelineWorker::prefetchNext, Qt::QueuedConnection);
}

void PipelineWorker::prefetchNext() {
    if (m_prefetchQueue.empty() || !m_last) return;
    {
        std::lock_guard lock(m_mutex);
        if (m_pending) return; // a real request goes first (its own processPending is queued)
        m_cancel.store(false); // a request after this point cancels the precomputation
    }
    const PipelineConfig config = m_prefetchQueue.front();
    m_prefetchQueue.erase(m_prefetchQueue.begin());
    const SnapshotPtr base = m_last;
    auto snap = std::make_shared<Snapshot>();
    snap->frame = base->frame;
    snap->reference = base->reference;
    snap->config = config;
    snap->backend = base->backend;
    snap->firstStage = firstAffectedStage(base->config, config);
    if (snap->firstStage != Stage::Background) snap->result = base->result;
    snap->result.keepFullMaps = false; // as processPending
    snap->result.keepDetectionImages = keepDetectionImages(*snap->frame);
    snap->result.psfFitCache = m_psfCache;
    auto progress = std::move(m_ctx.progress); // background work: no progress shown
    m_ctx.progress = nullptr;
    m_ctx.records.clear();
    bool ok = false;
    try {
#ifdef _OPENMP
        if (m_ctx.threads > 0) omp_set_num_threads(m_ctx.threads);
#endif
        runPipeline(*snap->frame, config, m_ctx, snap->result, snap->firstStage, snap->reference.get());
        ok = true;
    } catch (const std::exception&) { // Cancelled by a request, or a failure the request itself will report
    }
    m_ctx.progress = std::move(progress);
    snap->result.psfFitCache.reset();
    if (!ok) return;
    if (m_psfCache && snap->firstStage <= Stage::Psf && m_ctx.backend == Backend::Cpu) {
        snap->psfFitsReused = m_psfCache->lastHits();
        snap->psfFitsMade = m_psfCache->lastMisses();
    }
    snap->timings = m_ctx.records;
    m_prefetched.emplace_back(nlohmann::json(config).dump(), SnapshotPtr(std::move(snap)));
    ++m_prefetchedRuns;
    if (!m_prefetchQueue.empty())
        QMetaObject::invokeMethod(this, &PipelineWorker::prefetchNext, Qt::QueuedConnection);
}

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
        if (stage == m_progressStage && fraction < 1.0 &&
            now - m_progressTime < std::chrono::milliseconds(50))
            return;
        m_progressStage = stage;
        m_progressTime = now;
    }
    emit progress(QString::fromStdString(stage), fraction);
}

FramePtr PipelineWorker::frameFor(const PipelineConfig& config) {
    if (!m_frame) return nullptr;
    const std::string rawKey = instrumentKey(config);
    if (!m_rawResolved || rawKey != m_rawKey) {
        if (!m_framePath.empty()) {
            // Saturation also decides the mask: read the file again, as `reduce` would with this config.
            FrameReadOptions read;
            read.hdu = m_frameHdu;
            read.keywords = config.keywords;
            read.overrides = config.instrument;
            m_rawResolved = std::make_shared<const Frame>(readFrame(m_framePath, read));
        } else {
            auto frame = std::make_shared<Frame>(*m_frame);
            frame->instrument = readInstrument(frame->header, config.keywords, config.instrument);
            m_rawResolved = std::move(frame);
        }
        m_rawKey = rawKey;
        m_resolvedFrame.reset();
    }
    // The preparation, as `reduce` applies it right after reading the frame: redone from the raw frame
    // whenever a prepare.* key or a calibration file changed (a new frame: the run starts at stage 1).
    const std::string key = rawKey + nlohmann::json(config.prepare).dump() + "|" + m_calibFiles.bias + "|" +
                            m_calibFiles.dark + "|" + m_calibFiles.flat + "|" + m_calibFiles.bpm;
    if (m_resolvedFrame && key == m_resolvedKey) return m_resolvedFrame;
    const PrepareInputs* inputs = prepareInputsFor(config.prepare);
    auto frame = std::make_shared<Frame>(*m_rawResolved);
    m_prepared = prepareFrame(*frame, inputs, config.prepare, m_ctx);
    m_resolvedFrame = std::move(frame);
    m_resolvedKey = key;
    return m_resolvedFrame;
}

const PrepareInputs* PipelineWorker::prepareInputsFor(const PrepareParams& params) {
    const CalibrationFiles& f = m_calibFiles;
    if (f.bias.empty() && f.dark.empty() && f.flat.empty() && f.bpm.empty()) {
        m_prepareInputs.reset();
        m_prepareInputsKey.clear();
        return nullptr;
    }
    const std::string key = nlohmann::json{
        {"files", {f.bias, f.dark, f.flat, f.bpm}},
        {"auto", params.autoBadPixels},
        {"hot", params.hotSigma},
        {"low", params.flatLow},
        {"high",
         params.flatHigh}}.dump();
    if (!m_prepareInputs || key != m_prepareInputsKey) {
        m_prepareInputs.reset();
        m_prepareInputs = loadPrepareInputs(f.bias, f.dark, f.flat, f.bpm, params);
        m_prepareInputsKey = key;
    }
    return &*m_prepareInputs;
}

void PipelineWorker::setCalibrationFrames(const QString& bias, const QString& dark, const QString& flat,
                                          const QString& bpm) {
    PipelineConfig config;
    {
        std::lock_guard lock(m_mutex);
        config = m_latestConfig;
    }
    m_calibFiles = {bias.toStdString(), dark.toStdString(), flat.toStdString(), bpm.toStdString()};
    m_prepareInputs.reset();
    m_prepareInputsKey.clear();
    m_resolvedFrame.reset();
    m_resolvedKey.clear();
    m_last.reset();
    m_previous.reset();
    m_prefetched.clear();
    m_prefetchQueue.clear();
    try {
        prepareInputsFor(config.prepare); // read now: a bad file is reported at once
    } catch (const std::exception& e) {
        m_calibFiles = {};
        m_prepareInputs.reset();
        m_prepareInputsKey.clear();
        emit loadFailed(QString::fromStdString(e.what()));
    }
    const CalibrationFiles& f = m_calibFiles;
    emit calibrationFramesSet(QString::fromStdString(f.bias), QString::fromStdString(f.dark),
                              QString::fromStdString(f.flat), QString::fromStdString(f.bpm));
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
        for (std::size_t i = 0; i < m_reference->pmRa.size() && !anyPm; ++i)
            anyPm = std::isfinite(m_reference->pmRa[i]);
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
        // A precomputed result for exactly this configuration (setThresholdPrefetch): taken as it is.
        SnapshotPtr ready;
        if (!m_prefetched.empty()) {
            const std::string key = nlohmann::json(config).dump();
            for (auto it = m_prefetched.begin(); it != m_prefetched.end(); ++it)
                if (it->first == key && it->second->frame == frame && it->second->reference == reference) {
                    ready = std::move(it->second);
                    m_prefetched.erase(it);
                    break;
                }
        }
        if (ready) {
            snap = std::make_shared<Snapshot>(*ready); // a copy (it may have been shown before): lean, ~1 ms
            snap->generation = generation;
            snap->prefetched = true;
            ++m_prefetchHits;
        } else {
            Stage first = Stage::Background;
            if (m_last && m_last->frame == frame && m_last->reference == reference) {
                first = firstAffectedStage(m_last->config, config);
                if (first != Stage::Background)
                    snap->result = m_last->result; // reused stages (one copy per run)
            }
            snap->firstStage = first;
            m_ctx.records.clear();
            {
                std::lock_guard lock(m_progressMutex);
                m_progressStage.clear();
            }
            // Lean background maps (CPU): the mesh grid and the shared sampler instead of two full-resolution
            // maps, which the panels do not need (the background plot samples the sampler): 8 B/px less to
            // build and to copy into every incremental run's result. The catalog is bitwise the same.
            snap->result.keepFullMaps = false;
            snap->result.keepDetectionImages = keepDetectionImages(*frame);
            snap->result.psfFitCache =
                m_psfCache; // identical star fits of earlier runs are reused (same result)
            // Two steps (setProvisionalResults): the run pauses where the PSF stage starts, a provisional
            // snapshot with the new detection is measured and emitted, and the run continues from the PSF
            // stage on the same result object (the complete result is the one an uninterrupted run gives).
            const SnapshotPtr previous = m_last;
            if (m_provisionalResults.load() && first <= Stage::Detection && previous &&
                previous->frame == frame && previous->reference == reference &&
                previous->result.completed == Stage::Done) {
                runPipelineUntil(*frame, config, m_ctx, snap->result, first, Stage::Psf, reference.get());
                first = Stage::Psf;
                publishProvisional(*snap, *previous);
            }
            // The provisional snapshot went out with the new detection's map still on the device (a CUDA
            // run): it comes down on another thread while the PSF and later stages run (its own stream).
            std::future<void> segmentationDown;
            if (first == Stage::Psf && !snap->result.detection.segmentation.isMaterialised())
                segmentationDown = std::async(std::launch::async,
                                              [seg = snap->result.detection.segmentation] { seg.host(); });
            runPipeline(*frame, config, m_ctx, snap->result, first, reference.get());
            if (segmentationDown.valid()) segmentationDown.get(); // rethrows a failed download
            snap->result.psfFitCache.reset(); // the snapshot goes to the UI: the cache stays the worker's
            if (m_psfCache && snap->firstStage <= Stage::Psf && m_ctx.backend == Backend::Cpu) {
                snap->psfFitsReused = m_psfCache->lastHits();
                snap->psfFitsMade = m_psfCache->lastMisses();
            }
            snap->timings = m_ctx.records;
        }
        CatalogSort sort;
        {
            std::lock_guard lock(m_mutex);
            sort = m_catalogSort;
        }
        // The table's flags and row order, here rather than on the UI thread.
        snap->catalog = prepareCatalog(*snap, sort.column, sort.descending, sort.aperture);
        m_previous = std::move(m_last);
        m_last = snap; // valid for its config even when stale: the base of the next incremental run
        ++m_completedRuns;
        m_running.store(false);
        bool stale = false;
        {
            std::lock_guard lock(m_mutex);
            stale = m_pending.has_value() || generation != m_generation.load();
        }
        if (!stale || m_emitStale) {
            // The UI thread shows the map only when it is on the host (ui/main_window.cpp): a CUDA detection
            // leaves it on the device, so it comes down here (the whole map: ~40-70 ms at 151 MP), unless
            // the download above already brought it.
            snap->result.detection.segmentation.host();
            emit resultReady(SnapshotPtr(std::move(snap)));
        }
        if (!stale) schedulePrefetch();
    } catch (const Cancelled&) {
        m_running.store(false);
        ++m_cancelledRuns;
        emit cancelled(generation);
    } catch (const std::exception& e) {
        m_running.store(false);
        emit runFailed(QString::fromStdString(e.what()), generation);
    }
}

void PipelineWorker::publishProvisional(Snapshot& snap, const Snapshot& previous) {
    auto prov = std::make_shared<Snapshot>();
    prov->generation = snap.generation;
    prov->frame = snap.frame;
    prov->reference = snap.reference;
    prov->config = snap.config;
    prov->backend = snap.backend;
    prov->firstStage = snap.firstStage;
    prov->provisional = true;
    prov->timings = m_ctx.records; // the stages up to the detection
    const std::size_t before = m_ctx.records.size();
    // The new detection with the previous PSF model, apertures and calibration (core's provisionalResult;
    // bench/bench_rerun.cpp times the same calls). The background and detection are moved in: copying them
    // first cost ~5-10 ms at 151 MP / 66k sources of the time the user waits for the provisional result.
    prov->result = provisionalResult(*prov->frame, prov->config, m_ctx, std::move(snap.result),
                                     previous.result, prov->reference.get());
    // ...and copied back once the provisional snapshot is out (or dropped): the complete run continues from
    // the PSF stage on them. The copies read a snapshot the UI thread may be reading too (const; the map is
    // shared). An exception before that abandons `snap` (processPending reports the failed run).
    const auto giveBack = [&snap, &prov] {
        snap.result.background = prov->result.background;
        snap.result.detection = prov->result.detection;
    };
    const auto takeBack = [&snap, &prov] { // the provisional snapshot was not emitted: nobody else reads it
        snap.result.background = std::move(prov->result.background);
        snap.result.detection = std::move(prov->result.detection);
    };
    for (std::size_t k = before; k < m_ctx.records.size(); ++k)
        prov->timings.push_back(m_ctx.records[k]);
    m_ctx.records.resize(before); // the complete result's timings are those of its own stages
    CatalogSort sort;
    {
        std::lock_guard lock(m_mutex);
        sort = m_catalogSort;
    }
    prov->catalog = prepareCatalog(*prov, sort.column, sort.descending, sort.aperture);
    bool stale = false;
    {
        std::lock_guard lock(m_mutex);
        stale = m_pending.has_value() || snap.generation != m_generation.load();
    }
    if (stale && !m_emitStale) {
        takeBack();
        return;
    }
    ++m_provisionalEmitted;
    emit provisionalReady(SnapshotPtr(prov)); // prov stays alive here: giveBack copies from it
    giveBack();
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
        m_rawResolved = frame;
        m_rawKey = instrumentKey(config);
        m_resolvedFrame.reset(); // prepared by the first run
        m_resolvedKey.clear();
        m_framePath = path.toStdString();
        m_frameHdu = read.hdu;
        m_last.reset();
        m_previous.reset();
        m_prefetched.clear();
        m_prefetchQueue.clear();
        if (m_psfCache) m_psfCache->clear();
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
    m_rawResolved.reset();
    m_rawKey.clear();
    m_resolvedFrame.reset();
    m_resolvedKey.clear();
    m_last.reset();
    m_previous.reset();
    m_prefetched.clear();
    m_prefetchQueue.clear();
    if (m_psfCache) m_psfCache->clear();
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
    m_prefetched.clear();
    m_prefetchQueue.clear();
    m_movedReference.reset();
    m_movedFor.reset();
    emit referenceLoaded(m_reference);
}

namespace {
constexpr int kWorkerNice = 10;

void lowerCurrentThreadPriority(int nice) {
#ifdef __linux__
    // Linux: a nice value belongs to a thread; PRIO_PROCESS with the thread id sets this thread's only.
    (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), nice);
#else
    (void)nice;
#endif
}
} // namespace

PipelineWorkerThread::PipelineWorkerThread() {
    registerWorkerMetaTypes();
    m_thread.setObjectName(QStringLiteral("PipelineWorker"));
    m_worker = new PipelineWorker;
    m_worker->moveToThread(&m_thread);
    // The reductions run below the UI's priority (nice +kWorkerNice, inherited by the worker's OpenMP
    // threads, which it starts): on a machine with few cores the UI thread and the renderer draw a result
    // at once instead of sharing the cores with the next computation (the complete run after a
    // provisional result, the thresholds computed ahead). Idle cores still go to the worker.
    QObject::connect(
        &m_thread, &QThread::started, &m_thread, [] { lowerCurrentThreadPriority(kWorkerNice); },
        Qt::DirectConnection);
    m_thread.start();
}

PipelineWorkerThread::~PipelineWorkerThread() {
    m_worker->cancel();
    m_thread.quit();
    m_thread.wait();
    delete m_worker; // its thread has finished: no event can reach it any more
}

} // namespace gpuphot::ui
