// PipelineWorker and RunScheduler: incremental re-runs, cancellation of stale runs, an unblocked UI
// thread, debouncing, frame loading. Simulated fields with known content; offscreen Qt.
#include <gtest/gtest.h>

#include "tests/ui/queued_spy.hpp"
#include "tests/ui/ui_test_app.hpp"

#include <QApplication>
#include <QElapsedTimer>
#include <QSemaphore>
#include <QSignalSpy>
#include <QTableView>
#include <QTest>
#include <QThread>
#include <QTimer>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/io/fits_image.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/sim_frame.hpp"
#include "core/sim/simulator.hpp"
#include "tests/test_support.hpp"
#include "ui/catalog_model.hpp"
#include "ui/overlay_builder.hpp"
#include "ui/pipeline_worker.hpp"
#include "ui/run_scheduler.hpp"

using namespace gpuphot;
using namespace gpuphot::ui;
using gpuphot::test::QueuedSpy;

namespace {

QApplication& app() {
    return gpuphot::test::uiTestApp();
}

SimParams fieldParams(int size, int stars) {
    SimParams p;
    p.width = p.height = size;
    p.stars = stars;
    p.seed = 7;
    p.magBright = 12.0;
    p.magFaint = 21.0;
    p.galaxies = 0;
    return p;
}

// A ~1024^2 field: a full run takes long enough (hundreds of ms) to be cancelled mid-way.
FramePtr bigFrame() {
    static const FramePtr frame =
        std::make_shared<const Frame>(frameFromSimulation(simulateField(fieldParams(1024, 1500))));
    return frame;
}

FramePtr smallFrame() {
    static const FramePtr frame =
        std::make_shared<const Frame>(frameFromSimulation(simulateField(fieldParams(256, 120))));
    return frame;
}

// Waits until the spy has recorded `n` signals. (QSignalSpy::wait alone misses a signal that was recorded
// before wait() was entered.)
bool waitFor(QSignalSpy& spy, int n, int ms) {
    QElapsedTimer t;
    t.start();
    while (spy.count() < n && t.elapsed() < ms)
        QTest::qWait(5);
    return spy.count() >= n;
}

SnapshotPtr snapshotFrom(const QSignalSpy& spy, int i) {
    return spy.at(i).at(0).value<SnapshotPtr>();
}

void setFrame(PipelineWorker* w, FramePtr f) {
    QueuedSpy loaded(w, &PipelineWorker::frameLoaded);
    QMetaObject::invokeMethod(w, "setFrame", Qt::QueuedConnection, Q_ARG(gpuphot::ui::FramePtr, f));
    ASSERT_TRUE(waitFor(loaded, 1, 10000));
}

} // namespace

TEST(PipelineWorker, ThresholdAndApertureChangesReRunFromTheAffectedStage) {
    app();
    PipelineWorkerThread host;
    PipelineWorker* w = host.worker();
    setFrame(w, smallFrame());
    QueuedSpy ready(w, &PipelineWorker::resultReady);
    QueuedSpy failed(w, &PipelineWorker::runFailed);

    PipelineConfig low;
    low.detection.threshold = 1.5;
    const quint64 g1 = w->requestRun(low);
    ASSERT_TRUE(waitFor(ready, 1, 30000))
        << (failed.isEmpty() ? "" : failed.at(0).at(0).toString().toStdString());
    const SnapshotPtr s1 = snapshotFrom(ready, 0);
    EXPECT_EQ(s1->generation, g1);
    EXPECT_EQ(s1->firstStage, Stage::Background);
    const std::size_t n1 = s1->result.detection.sources.size();
    ASSERT_GT(n1, 20u);

    PipelineConfig high = low;
    high.detection.threshold = 6.0;
    const quint64 g2 = w->requestRun(high);
    ASSERT_TRUE(waitFor(ready, 2, 30000));
    const SnapshotPtr s2 = snapshotFrom(ready, 1);
    EXPECT_EQ(s2->generation, g2);
    EXPECT_EQ(s2->firstStage, Stage::Detection);
    const std::size_t n2 = s2->result.detection.sources.size();
    EXPECT_LT(n2, n1) << "a higher threshold must detect fewer sources";
    EXPECT_GT(n2, 0u);
    // Independent: a full run on this thread with the same parameters gives the same catalog size.
    RunContext ctx;
    const PipelineResult direct = runPipeline(*smallFrame(), high, ctx);
    EXPECT_EQ(direct.detection.sources.size(), n2);
    EXPECT_EQ(direct.aperture.flux.size(), s2->result.aperture.flux.size());
    if (!direct.aperture.flux.empty() && !direct.aperture.flux[0].empty()) {
        EXPECT_EQ(direct.aperture.flux[0], s2->result.aperture.flux[0]); // same numbers as a from-scratch run
    }

    PipelineConfig aper = high;
    aper.aperture.radii = {2.5, 5.0};
    w->requestRun(aper);
    ASSERT_TRUE(waitFor(ready, 3, 30000));
    const SnapshotPtr s3 = snapshotFrom(ready, 2);
    EXPECT_EQ(s3->firstStage, Stage::Aperture);
    EXPECT_EQ(s3->result.detection.sources.size(), n2);
    ASSERT_EQ(s3->result.aperture.radii.size(), 2u);
    EXPECT_DOUBLE_EQ(s3->result.aperture.radii[1], 5.0);
    // Only the aperture and later stages were timed in this run.
    for (const auto& rec : s3->timings)
        EXPECT_NE(rec.stage, "detection");
    // Earlier snapshots are unchanged (immutable): s2 still has the old radii.
    EXPECT_EQ(s2->result.aperture.radii.size(), 4u);
    EXPECT_EQ(failed.count(), 0);
    EXPECT_EQ(w->cancelledRuns(), 0u);
}

// The worker's PSF fit cache: a threshold set back to an earlier value takes every PSF star fit from the
// cache, and the result is bitwise a fresh run's; each result carries the table order for the sort asked for.
TEST(PipelineWorker, ReusesIdenticalPsfFitsAndPreparesTheTableOrder) {
    app();
    PipelineWorkerThread host;
    PipelineWorker* w = host.worker();
    setFrame(w, bigFrame());
    QueuedSpy ready(w, &PipelineWorker::resultReady);
    w->setCatalogSort(CatalogModel::MagAper, true, 0);
    PipelineConfig a, b = a;
    b.detection.threshold = a.detection.threshold + 0.5;
    for (const PipelineConfig* c : {&a, &b, &a}) {
        const int before = ready.count();
        w->requestRun(*c);
        ASSERT_TRUE(waitFor(ready, before + 1, 60000));
    }
    const SnapshotPtr first = snapshotFrom(ready, 0), last = snapshotFrom(ready, 2);
    ASSERT_GT(first->psfFitsMade, 10);
    EXPECT_EQ(first->psfFitsReused, 0);
    EXPECT_EQ(last->firstStage, Stage::Detection);
    EXPECT_EQ(last->psfFitsMade, 0);
    EXPECT_EQ(last->psfFitsReused, first->psfFitsMade);
    RunContext ctx;
    PipelineResult fresh;
    fresh.keepFullMaps = false; // as the worker
    runPipeline(*last->frame, a, ctx, fresh, Stage::Background, nullptr);
    const PsfResult &x = last->result.psf, &y = fresh.psf;
    ASSERT_EQ(x.stars.size(), y.stars.size());
    for (std::size_t k = 0; k < x.stars.size(); ++k)
        ASSERT_EQ(std::memcmp(&x.stars[k].fit, &y.stars[k].fit, sizeof x.stars[k].fit), 0) << k;
    ASSERT_EQ(x.fluxPsf.size(), y.fluxPsf.size());
    EXPECT_EQ(std::memcmp(x.fluxPsf.data(), y.fluxPsf.data(), x.fluxPsf.size() * sizeof(double)), 0);
    EXPECT_EQ(std::memcmp(last->result.aperture.fluxOpt.data(), fresh.aperture.fluxOpt.data(),
                          fresh.aperture.fluxOpt.size() * sizeof(double)),
              0);
    // The table order came with the result: descending aperture magnitude, as the model sorts it itself.
    ASSERT_TRUE(last->catalog);
    EXPECT_EQ(last->catalog->column, CatalogModel::MagAper);
    EXPECT_TRUE(last->catalog->descending);
    CatalogModel model;
    model.sortBy(CatalogModel::MagAper, Qt::DescendingOrder);
    model.setSnapshot(last);
    EXPECT_TRUE(model.lastResetUsedPrep());
    auto bare = std::make_shared<Snapshot>(*last);
    bare->catalog.reset();
    CatalogModel local;
    local.sortBy(CatalogModel::MagAper, Qt::DescendingOrder);
    local.setSnapshot(bare);
    EXPECT_FALSE(local.lastResetUsedPrep());
    ASSERT_EQ(model.rowCount(), local.rowCount());
    for (int r = 0; r < model.rowCount(); ++r)
        ASSERT_EQ(model.sourceIndex(r), local.sourceIndex(r)) << r;
}

// Precomputation of the neighbouring thresholds: the request for one is answered with the precomputed
// result, which is a fresh run's; a request while one is computed cancels it and is answered normally.
TEST(PipelineWorker, ThresholdPrefetchAnswersWithTheFreshResult) {
    app();
    PipelineWorkerThread host;
    PipelineWorker* w = host.worker();
    setFrame(w, bigFrame());
    QueuedSpy ready(w, &PipelineWorker::resultReady);
    w->setThresholdPrefetch(0.25);
    PipelineConfig a;
    a.detection.threshold = 2.0;
    w->requestRun(a);
    ASSERT_TRUE(waitFor(ready, 1, 60000));
    QElapsedTimer t;
    t.start();
    while (w->prefetchedRuns() < 2 && t.elapsed() < 60000)
        QTest::qWait(10);
    ASSERT_EQ(w->prefetchedRuns(), 2u);
    PipelineConfig b = a;
    b.detection.threshold = 2.25;
    w->requestRun(b);
    ASSERT_TRUE(waitFor(ready, 2, 60000));
    EXPECT_EQ(w->prefetchHits(), 1u);
    const SnapshotPtr s = snapshotFrom(ready, 1);
    EXPECT_TRUE(s->prefetched);
    EXPECT_EQ(s->config.detection.threshold, 2.25);
    RunContext ctx;
    PipelineResult fresh;
    fresh.keepFullMaps = false; // as the worker
    runPipeline(*s->frame, b, ctx, fresh, Stage::Background, nullptr);
    ASSERT_EQ(s->result.detection.sources.size(), fresh.detection.sources.size());
    EXPECT_EQ(std::memcmp(s->result.detection.sources.x.data(), fresh.detection.sources.x.data(),
                          fresh.detection.sources.size() * sizeof(double)),
              0);
    EXPECT_EQ(std::memcmp(s->result.psf.fluxPsf.data(), fresh.psf.fluxPsf.data(),
                          fresh.psf.fluxPsf.size() * sizeof(double)),
              0);
    EXPECT_EQ(std::memcmp(s->result.aperture.fluxOpt.data(), fresh.aperture.fluxOpt.data(),
                          fresh.aperture.fluxOpt.size() * sizeof(double)),
              0);
    // Now 2.0 and 2.5 are the neighbours, being computed; ask for something else at once: they give way.
    PipelineConfig c = a;
    c.detection.threshold = 3.1;
    w->requestRun(c);
    ASSERT_TRUE(waitFor(ready, 3, 60000));
    EXPECT_FALSE(snapshotFrom(ready, 2)->prefetched);
    EXPECT_EQ(snapshotFrom(ready, 2)->config.detection.threshold, 3.1);
    EXPECT_EQ(w->cancelledRuns(), 0u); // a cancelled precomputation is not a cancelled run
}

TEST(PipelineWorker, NewerRequestCancelsTheRunningOne) {
    app();
    PipelineWorkerThread host;
    PipelineWorker* w = host.worker();
    setFrame(w, bigFrame());
    QueuedSpy started(w, &PipelineWorker::started);
    QueuedSpy ready(w, &PipelineWorker::resultReady);
    QueuedSpy cancelled(w, &PipelineWorker::cancelled);

    PipelineConfig a, b;
    b.detection.threshold = 3.0;
    const quint64 g1 = w->requestRun(a);
    ASSERT_TRUE(waitFor(started, 1, 10000));
    EXPECT_EQ(started.at(0).at(0).toULongLong(), g1);
    const quint64 g2 = w->requestRun(b); // while run 1 is in its background stage
    ASSERT_TRUE(waitFor(ready, 1, 60000));
    QTest::qWait(50); // let any (wrongly) late signal arrive
    ASSERT_EQ(ready.count(), 1) << "only the newest result is emitted";
    EXPECT_EQ(snapshotFrom(ready, 0)->generation, g2);
    EXPECT_DOUBLE_EQ(snapshotFrom(ready, 0)->config.detection.threshold, 3.0);
    ASSERT_EQ(cancelled.count(), 1);
    EXPECT_EQ(cancelled.at(0).at(0).toULongLong(), g1);
    EXPECT_EQ(w->cancelledRuns(), 1u);
    // Cancelled: run 2 started from the background (nothing of run 1 is reused).
    EXPECT_EQ(snapshotFrom(ready, 0)->firstStage, Stage::Background);
}

TEST(PipelineWorker, BackToBackRequestsEmitOnlyTheNewest) {
    app();
    PipelineWorkerThread host;
    PipelineWorker* w = host.worker();
    setFrame(w, smallFrame());
    QueuedSpy ready(w, &PipelineWorker::resultReady);
    // Hold the worker thread until all five requests are made, so that they are back to back however
    // loaded the machine is (without this, a preempted test thread let run 1 finish first under CI load).
    QSemaphore gate;
    QMetaObject::invokeMethod(
        w, [&gate] { gate.acquire(); }, Qt::QueuedConnection);
    PipelineConfig c;
    quint64 last = 0;
    for (int i = 0; i < 5; ++i) {
        c.detection.threshold = 2.0 + i;
        last = w->requestRun(c);
    }
    gate.release();
    ASSERT_TRUE(waitFor(ready, 1, 30000));
    QTest::qWait(300);
    ASSERT_EQ(ready.count(), 1);
    EXPECT_EQ(snapshotFrom(ready, 0)->generation, last);
    EXPECT_DOUBLE_EQ(snapshotFrom(ready, 0)->config.detection.threshold, 6.0);
    // Each of the 4 older requests was either dropped before it started or cancelled while running.
    EXPECT_EQ(w->cancelledRuns() + w->supersededRequests(), 4u);
}

TEST(PipelineWorker, RequestRunIsQueuedAndTheUiThreadStaysResponsive) {
    app();
    PipelineWorkerThread host;
    PipelineWorker* w = host.worker();
    setFrame(w, bigFrame());
    // Written on the worker's thread (direct connection), read on this one: atomic.
    std::atomic<QThread*> runThread{nullptr};
    QObject::connect(
        w, &PipelineWorker::started, w, [&](quint64) { runThread = QThread::currentThread(); },
        Qt::DirectConnection);
    QueuedSpy started(w, &PipelineWorker::started);
    QueuedSpy ready(w, &PipelineWorker::resultReady);

    // A 10 ms timer on the UI thread; its largest gap measures how long the event loop was blocked.
    QElapsedTimer clock;
    qint64 last = 0, maxGap = 0;
    QTimer tick;
    tick.setInterval(10);
    QObject::connect(&tick, &QTimer::timeout, [&] {
        const qint64 now = clock.elapsed();
        maxGap = std::max(maxGap, now - last);
        last = now;
    });
    clock.start();
    tick.start();
    const auto t0 = std::chrono::steady_clock::now();
    w->requestRun(PipelineConfig{});
    const double callMs =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    // Queued: the call returns long before the run (hundreds of ms) can have finished; the worker's
    // thread may already have started it (that race is fine), but never this thread.
    EXPECT_EQ(ready.count(), 0);
    EXPECT_NE(runThread.load(), QThread::currentThread());
    ASSERT_TRUE(waitFor(ready, 1, 60000));
    tick.stop();
    EXPECT_EQ(runThread.load(), host.thread()) << "the run happens on the worker's thread";
    EXPECT_NE(runThread.load(), QThread::currentThread());
    const auto& timings = snapshotFrom(ready, 0)->timings;
    double runS = 0;
    for (const auto& r : timings)
        runS += r.seconds;
    std::printf("[ measure  ] requestRun returned in %.3f ms; full run of 1024x1024 %.0f ms; "
                "max UI event-loop gap during the run %lld ms (goal < 50)\n",
                callMs, runS * 1000, static_cast<long long>(maxGap));
}

TEST(RunScheduler, SendsTheFirstEditAtOnceAndTheLatestAfterAPause) {
    app();
    PipelineWorkerThread host;
    PipelineWorker* w = host.worker();
    setFrame(w, smallFrame());
    RunScheduler scheduler(w);
    scheduler.setDelay(500); // long against the 20 ms between edits, even on a loaded CI machine
    QSignalSpy requested(&scheduler, &RunScheduler::requested);
    QueuedSpy ready(w, &PipelineWorker::resultReady);
    PipelineConfig c;
    c.detection.minArea = 3;
    scheduler.schedule(c);
    EXPECT_EQ(requested.count(), 1) << "the first edit after a pause waits for nothing";
    EXPECT_FALSE(scheduler.isPending());
    for (int i = 1; i < 6; ++i) {
        QTest::qWait(20); // edits faster than the pause
        c.detection.minArea = 3 + i;
        scheduler.schedule(c);
    }
    EXPECT_EQ(requested.count(), 1) << "nothing more is forwarded while edits keep coming";
    EXPECT_TRUE(scheduler.isPending());
    for (QElapsedTimer t; requested.count() < 2;) {
        if (!t.isValid()) t.start();
        ASSERT_LT(t.elapsed(), 30000) << "the latest edit never went";
        QTest::qWait(20);
    }
    EXPECT_FALSE(scheduler.isPending());
    // The latest edit's result arrives (the first edit's run was superseded or cancelled, or finished).
    for (QElapsedTimer t;;) {
        if (!t.isValid()) t.start();
        ASSERT_LT(t.elapsed(), 30000) << "no result for the latest edit";
        if (!ready.isEmpty() && snapshotFrom(ready, ready.count() - 1)->config.detection.minArea == 8) break;
        QTest::qWait(20);
    }
    QTest::qWait(700);
    EXPECT_EQ(requested.count(), 2) << "one request for the burst's first edit, one for its latest";
    const int results = ready.count();

    // runNow bypasses the timer.
    c.detection.minArea = 4;
    scheduler.runNow(c);
    EXPECT_EQ(requested.count(), 3);
    ASSERT_TRUE(waitFor(ready, results + 1, 30000));
    EXPECT_EQ(snapshotFrom(ready, results)->config.detection.minArea, 4);
}

TEST(PipelineWorker, LoadsFramesAndReportsErrors) {
    app();
    test::TempDir dir("worker_load");
    const SimResult sim = simulateField(fieldParams(200, 60));
    writeSimulation(sim, dir.path.string(), "f", -32);
    PipelineWorkerThread host;
    PipelineWorker* w = host.worker();
    QueuedSpy loaded(w, &PipelineWorker::frameLoaded);
    QueuedSpy failedLoad(w, &PipelineWorker::loadFailed);
    QueuedSpy refLoaded(w, &PipelineWorker::referenceLoaded);
    QueuedSpy ready(w, &PipelineWorker::resultReady);
    QueuedSpy runFailed(w, &PipelineWorker::runFailed);

    // No frame yet: the run fails with a message and the generation.
    const quint64 g0 = w->requestRun(PipelineConfig{});
    ASSERT_TRUE(waitFor(runFailed, 1, 10000));
    EXPECT_EQ(runFailed.at(0).at(1).toULongLong(), g0);

    const QString bad = QString::fromStdString((dir.path / "missing.fits").string());
    QMetaObject::invokeMethod(w, "loadFrame", Qt::QueuedConnection, Q_ARG(QString, bad),
                              Q_ARG(QString, QString()));
    ASSERT_TRUE(waitFor(failedLoad, 1, 10000));
    EXPECT_TRUE(failedLoad.at(0).at(0).toString().contains(bad))
        << failedLoad.at(0).at(0).toString().toStdString();

    const QString good = QString::fromStdString((dir.path / "f.fits").string());
    QMetaObject::invokeMethod(w, "loadFrame", Qt::QueuedConnection, Q_ARG(QString, good),
                              Q_ARG(QString, QString()));
    ASSERT_TRUE(waitFor(loaded, 1, 10000));
    const FramePtr f = loaded.at(0).at(0).value<FramePtr>();
    ASSERT_TRUE(f);
    EXPECT_EQ(f->width(), 200);
    EXPECT_EQ(f->pixels(17, 33), sim.image(17, 33));
    QMetaObject::invokeMethod(w, "loadReference", Qt::QueuedConnection,
                              Q_ARG(QString, QString::fromStdString((dir.path / "f.ref.fits").string())),
                              Q_ARG(QString, QString()));
    ASSERT_TRUE(waitFor(refLoaded, 1, 10000));
    ASSERT_TRUE(refLoaded.at(0).at(0).value<ReferencePtr>());
    EXPECT_EQ(refLoaded.at(0).at(0).value<ReferencePtr>()->size(), sim.reference.rows());

    // A gain override re-reads the frame's instrument (as `reduce --gain` would).
    PipelineConfig c;
    c.instrument.gain = 4.5;
    w->requestRun(c);
    ASSERT_TRUE(waitFor(ready, 1, 30000));
    const SnapshotPtr s = snapshotFrom(ready, 0);
    EXPECT_DOUBLE_EQ(s->frame->instrument.gain, 4.5);
    EXPECT_TRUE(s->reference);
    EXPECT_TRUE(s->result.calibrationRan);
}

// Measurement (prints, asserts nothing about time): the 2048^2 demo frame (resources/demo/simulate.json)
// with its reference catalog, loaded through the worker from files as the workbench does; time from
// requestRun to the first result taken in on the UI thread (the provisional one of a re-detection, as the
// workbench shows it: setProvisionalResults) and to the complete result, for aperture-radius and
// threshold changes. Heavy: runs only with GPUPHOT_UI_BENCH=1.
TEST(PipelineWorkerBench, DemoFrameEditLatency) {
    if (qEnvironmentVariableIntValue("GPUPHOT_UI_BENCH") != 1)
        GTEST_SKIP() << "set GPUPHOT_UI_BENCH=1 to measure";
    app();
    test::TempDir dir("worker_bench");
    SimParams p;
    {
        std::ifstream in(std::string(GPUPHOT_TEST_DATA) + "/../../resources/demo/simulate.json");
        ASSERT_TRUE(in.good());
        nlohmann::json j = nlohmann::json::parse(in);
        from_json(j, p);
    }
    writeSimulation(simulateField(p), dir.str(), "demo", 16);
    PipelineWorkerThread host;
    PipelineWorker* w = host.worker();
    QueuedSpy loaded(w, &PipelineWorker::frameLoaded);
    QueuedSpy refLoaded(w, &PipelineWorker::referenceLoaded);
    QueuedSpy ready(w, &PipelineWorker::resultReady);
    QueuedSpy provisional(w, &PipelineWorker::provisionalReady);
    w->setProvisionalResults(true); // as the workbench
    QMetaObject::invokeMethod(w, "loadFrame", Qt::QueuedConnection,
                              Q_ARG(QString, QString::fromStdString(dir / "demo.fits")),
                              Q_ARG(QString, QString()));
    QMetaObject::invokeMethod(w, "loadReference", Qt::QueuedConnection,
                              Q_ARG(QString, QString::fromStdString(dir / "demo.ref.fits")),
                              Q_ARG(QString, QString()));
    ASSERT_TRUE(waitFor(refLoaded, 1, 60000));
    ASSERT_EQ(loaded.count(), 1);

    QElapsedTimer clock;
    qint64 lastTick = 0, maxGap = 0;
    QTimer tick;
    tick.setInterval(10);
    QObject::connect(&tick, &QTimer::timeout, [&] {
        const qint64 now = clock.elapsed();
        maxGap = std::max(maxGap, now - lastTick);
        lastTick = now;
    });
    // The UI side as MainWindow::onResult does it: overlay geometry and the catalog table (sorted by
    // magnitude, the order prepared by the worker) through the filter proxy into a shown QTableView.
    CatalogModel model;
    CatalogFilter proxy;
    proxy.setSourceModel(&model);
    QTableView table;
    table.setModel(&proxy);
    table.resize(900, 500);
    table.show();
    proxy.sort(CatalogModel::MagAper, Qt::AscendingOrder);
    w->setCatalogSort(CatalogModel::MagAper, false, 0);
    std::vector<double> uiMs, completeMs;
    const auto stagesOf = [](const Snapshot& s) {
        std::string stages;
        for (const auto& r : s.timings)
            stages += " " + r.stage + "=" + std::to_string(static_cast<int>(r.seconds * 1000));
        return stages;
    };
    // Takes a snapshot in on the UI thread as MainWindow::onResult does; returns the UI-side ms.
    const auto takeIn = [&](const SnapshotPtr& s) {
        const auto t1 = std::chrono::steady_clock::now();
        const OverlayGeometry g = buildOverlays(*s);
        model.setSnapshot(s);
        (void)proxy.rowCount();
        QApplication::processEvents(); // the table's repaint
        (void)g;
        const double ui =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
        uiMs.push_back(ui);
        return ui;
    };
    // Returns the time to the first updated overlays + table (the provisional result when one comes).
    const auto timed = [&](const PipelineConfig& c, const char* what) {
        const int before = ready.count(), beforeProv = provisional.count();
        const auto t0 = std::chrono::steady_clock::now();
        w->requestRun(c);
        const auto since = [&t0] {
            return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        };
        double first = -1.0;
        QElapsedTimer guard;
        guard.start();
        while (ready.count() <= before && guard.elapsed() < 120000) {
            if (first < 0.0 && provisional.count() > beforeProv) {
                const double ms = since();
                const SnapshotPtr p = provisional.at(beforeProv).at(0).value<SnapshotPtr>();
                const double ui = takeIn(p);
                first = ms + ui;
                std::printf(
                    "[ measure  ] %-28s -> provisional %7.1f ms, + UI %5.1f ms (%zu sources, zp %s;%s ms)\n", what,
                    ms, ui, p->result.detection.sources.size(), p->result.zeropoint.ok ? "ok" : "none",
                    stagesOf(*p).c_str());
            }
            QTest::qWait(2);
        }
        EXPECT_GT(ready.count(), before);
        const double ms = since();
        const SnapshotPtr s = snapshotFrom(ready, before);
        const double ui = takeIn(s);
        std::string psf;
        if (s->psfFitsReused >= 0)
            psf = "; PSF fits reused " + std::to_string(s->psfFitsReused) + "/" +
                  std::to_string(s->psfFitsReused + s->psfFitsMade);
        std::printf("[ measure  ] %-28s -> resultReady %7.1f ms, + UI %5.1f ms (from %s; %zu sources, zp "
                    "%s;%s ms%s%s)\n",
                    what, ms, ui, stageName(s->firstStage), s->result.detection.sources.size(),
                    s->result.zeropoint.ok ? "ok" : "none", stagesOf(*s).c_str(), psf.c_str(),
                    model.lastResetUsedPrep() ? "; table order prepared" : "");
        completeMs.push_back(ms + ui);
        return first >= 0.0 ? first : ms + ui;
    };
    clock.start();
    tick.start();
    PipelineConfig c;
    timed(c, "first full run");
    {
        // What every incremental run pays before its first stage: the copy of the previous result (maps,
        // segmentation, catalog) that the new snapshot starts from.
        const SnapshotPtr s = snapshotFrom(ready, ready.count() - 1);
        const auto t0 = std::chrono::steady_clock::now();
        PipelineResult copy = s->result;
        const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        std::printf("[ measure  ] copy of the previous result (the base of an incremental run): %.1f ms\n",
                    ms);
    }
    std::vector<double> aper, thr;
    for (int k = 0; k < 3; ++k) {
        c.aperture.radii = {2.0 + 0.5 * (k + 1), 3.0, 4.0, 6.0};
        aper.push_back(timed(c, "aperture radius change"));
        c.aperture.annulusOuter = 6.0 + 0.5 * (k + 1);
        aper.push_back(timed(c, "annulus change"));
    }
    std::vector<double> thrComplete;
    for (int k = 0; k < 5; ++k) {
        c.detection.threshold = 1.5 + 0.25 * (k + 1) + (k >= 3 ? 0.05 : 0.0); // five values not seen before
        thr.push_back(timed(c, "threshold change"));
        thrComplete.push_back(completeMs.back());
    }
    // Values seen before (a slider moved back): every PSF star's fit inputs are those of an earlier run.
    std::vector<double> back, other;
    for (double t : {2.0, 1.75, 2.0}) {
        c.detection.threshold = t;
        back.push_back(timed(c, "threshold set back"));
    }
    // Idle-time precomputation of the neighbouring spin-box steps (as the workbench sets it): an edit by one
    // step after the worker had the time to compute it (it waits here until both neighbours are ready).
    std::vector<double> ahead;
    w->setThresholdPrefetch(0.1);
    const auto waitPrefetch = [&](quint64 n) {
        QElapsedTimer t;
        t.start();
        while (w->prefetchedRuns() < n && t.elapsed() < 30000)
            QTest::qWait(5);
    };
    c.detection.threshold = 1.6;
    timed(c, "threshold change");
    for (int k = 0; k < 3; ++k) {
        waitPrefetch(w->prefetchedRuns() + (k == 0 ? 2 : 1));
        QTest::qWait(50);
        c.detection.threshold = std::round((c.detection.threshold + 0.1) * 100.0) / 100.0;
        ahead.push_back(timed(c, "threshold step (computed ahead)"));
    }
    std::printf("[ measure  ] precomputed runs %llu, used %llu\n",
                static_cast<unsigned long long>(w->prefetchedRuns()),
                static_cast<unsigned long long>(w->prefetchHits()));
    w->setThresholdPrefetch(0.0);
    c.detection.deblendContrast = 0.01;
    other.push_back(timed(c, "deblend contrast change"));
    c.detection.deblendContrast = 0.02;
    other.push_back(timed(c, "deblend contrast change"));
    c.psf.gridNx = c.psf.gridNy = 4;
    other.push_back(timed(c, "ePSF grid change"));
    c.psf.psfFitRadius = 4.0;
    other.push_back(timed(c, "PSF fit radius change"));
    tick.stop();
    std::sort(aper.begin(), aper.end());
    std::sort(thr.begin(), thr.end());
    std::sort(thrComplete.begin(), thrComplete.end());
    std::sort(back.begin(), back.end());
    std::sort(uiMs.begin(), uiMs.end());
    std::sort(ahead.begin(), ahead.end());
    std::printf("[ measure  ] median threshold step computed ahead: %.1f ms\n", ahead[ahead.size() / 2]);
    std::printf(
        "[ measure  ] threshold change, new value: first overlays + table (provisional) median %.1f ms "
        "(%.1f-%.1f), complete result median %.1f ms (%.1f-%.1f); provisional results %llu\n",
        thr[thr.size() / 2], thr.front(), thr.back(), thrComplete[thrComplete.size() / 2],
        thrComplete.front(), thrComplete.back(), static_cast<unsigned long long>(w->provisionalResults()));
    std::printf(
        "[ measure  ] median (request to overlays + table): aperture/annulus change %.1f ms (goal <= 100), "
        "threshold change %.1f ms (goal <= 400), threshold set back %.1f ms; UI side median %.1f ms, max "
        "%.1f ms; max UI event-loop gap %lld ms (goal < 50); threads %d\n",
        aper[aper.size() / 2], thr[thr.size() / 2], back[back.size() / 2], uiMs[uiMs.size() / 2], uiMs.back(),
        static_cast<long long>(maxGap), QThread::idealThreadCount());
}
