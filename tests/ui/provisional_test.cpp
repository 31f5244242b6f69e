// Two-step results of the workbench's worker (PipelineWorker::setProvisionalResults): a re-detection first
// emits a provisional snapshot (the new detection, apertures and calibration with the previous PSF model),
// then the complete result of the same request, whose catalog is bitwise that of a fresh, uninterrupted
// run of the same config (what `gpuphot reduce` computes). Simulated field with its reference catalog.
#include <gtest/gtest.h>

#include "tests/ui/queued_spy.hpp"
#include "tests/ui/ui_test_app.hpp"

#include <QElapsedTimer>
#include <QSignalSpy>
#include <QTest>

#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "core/catalog/table.hpp"
#include "core/pipeline/catalog_builder.hpp"
#include "core/pipeline/pipeline.hpp"
#include "core/pipeline/run_context.hpp"
#include "core/sim/simulator.hpp"
#include "tests/test_support.hpp"
#include "ui/pipeline_worker.hpp"

using namespace gpuphot;
using namespace gpuphot::ui;
using gpuphot::test::QueuedSpy;

namespace {

bool waitFor(QSignalSpy& spy, int n, int ms) {
    QElapsedTimer t;
    t.start();
    while (spy.count() < n && t.elapsed() < ms)
        QTest::qWait(5);
    return spy.count() >= n;
}

SnapshotPtr at(const QSignalSpy& spy, int i) {
    return spy.at(i).at(0).value<SnapshotPtr>();
}

// Every cell of two catalogs, bit for bit (NaN equal to NaN with the same bits), and the zero point keywords.
void expectSameCatalog(const Table& a, const Table& b) {
    ASSERT_EQ(a.rows(), b.rows());
    ASSERT_EQ(a.columns().size(), b.columns().size());
    for (std::size_t c = 0; c < a.columns().size(); ++c) {
        const Column &x = a.columns()[c], &y = b.columns()[c];
        ASSERT_EQ(x.name, y.name);
        ASSERT_EQ(x.data.index(), y.data.index()) << x.name;
        std::visit(
            [&](const auto& xv) {
                using V = std::decay_t<decltype(xv)>;
                const V& yv = std::get<V>(y.data);
                if constexpr (std::is_same_v<typename V::value_type, std::string>)
                    EXPECT_EQ(xv, yv) << x.name;
                else
                    EXPECT_TRUE(xv.empty() ||
                                std::memcmp(xv.data(), yv.data(), xv.size() * sizeof(xv[0])) == 0)
                        << "column " << x.name << " differs";
            },
            x.data);
    }
    for (const char* key : {"ZP", "ZPERR", "MAGLIM", "FWHM"}) {
        const auto va = a.meta.getDouble(key), vb = b.meta.getDouble(key);
        ASSERT_EQ(va.has_value(), vb.has_value()) << key;
        if (va) EXPECT_EQ(std::memcmp(&*va, &*vb, sizeof(double)), 0) << key;
    }
}

struct Field {
    test::TempDir dir{"provisional"};
    std::string frame, ref;
    Field() {
        SimParams p;
        p.width = p.height = 512;
        p.stars = 260;
        p.seed = 5;
        p.galaxies = 0;
        p.refMagLimit = 19.0;
        writeSimulation(simulateField(p), dir.str(), "f", -32);
        frame = (dir.path / "f.fits").string();
        ref = (dir.path / "f.ref.fits").string();
    }
};

} // namespace

TEST(PipelineWorkerProvisional, ReDetectionShowsAProvisionalResultThenTheCompleteOneBitwiseAFreshRun) {
    gpuphot::test::uiTestApp();
    const Field f;
    PipelineWorkerThread host;
    PipelineWorker* w = host.worker();
    w->setProvisionalResults(true);
    QueuedSpy loaded(w, &PipelineWorker::frameLoaded);
    QueuedSpy refLoaded(w, &PipelineWorker::referenceLoaded);
    QueuedSpy ready(w, &PipelineWorker::resultReady);
    QueuedSpy prov(w, &PipelineWorker::provisionalReady);
    // The signals in their order of emission (direct: appended on the worker's thread, read on this one,
    // hence the mutex).
    std::mutex orderMutex;
    std::vector<std::string> order;
    QObject::connect(
        w, &PipelineWorker::provisionalReady, w,
        [&](SnapshotPtr) {
            std::lock_guard lock(orderMutex);
            order.push_back("provisional");
        },
        Qt::DirectConnection);
    QObject::connect(
        w, &PipelineWorker::resultReady, w,
        [&](SnapshotPtr) {
            std::lock_guard lock(orderMutex);
            order.push_back("complete");
        },
        Qt::DirectConnection);
    QMetaObject::invokeMethod(w, "loadFrame", Qt::QueuedConnection,
                              Q_ARG(QString, QString::fromStdString(f.frame)), Q_ARG(QString, QString()));
    QMetaObject::invokeMethod(w, "loadReference", Qt::QueuedConnection,
                              Q_ARG(QString, QString::fromStdString(f.ref)), Q_ARG(QString, QString()));
    ASSERT_TRUE(waitFor(refLoaded, 1, 30000));

    PipelineConfig c0;
    w->requestRun(c0);
    ASSERT_TRUE(waitFor(ready, 1, 60000));
    EXPECT_EQ(prov.count(), 0) << "the first run has no earlier PSF model: only the complete result";
    const SnapshotPtr s0 = at(ready, 0);
    ASSERT_TRUE(s0->result.psf.hasModel());
    ASSERT_TRUE(s0->result.zeropoint.ok) << s0->result.calibrationProblem;

    PipelineConfig c1 = c0;
    c1.detection.threshold = c0.detection.threshold + 0.37;
    const quint64 g1 = w->requestRun(c1);
    ASSERT_TRUE(waitFor(ready, 2, 60000));
    ASSERT_EQ(prov.count(), 1);
    QTest::qWait(20);
    {
        std::lock_guard lock(orderMutex);
        ASSERT_EQ(order.size(), 3u);
        EXPECT_EQ(order[1], "provisional");
        EXPECT_EQ(order[2], "complete");
    }
    const SnapshotPtr p = at(prov, 0), s1 = at(ready, 1);
    EXPECT_TRUE(p->provisional);
    EXPECT_FALSE(s1->provisional);
    EXPECT_EQ(p->generation, g1);
    EXPECT_EQ(s1->generation, g1);
    EXPECT_EQ(p->firstStage, Stage::Detection);

    // The provisional snapshot: this config's detection, complete per-source arrays of the right length,
    // apertures measured, PSF fluxes not yet (NaN), the previous PSF model.
    const Sources& ps = p->result.detection.sources;
    const Sources& cs = s1->result.detection.sources;
    ASSERT_EQ(ps.size(), cs.size());
    ASSERT_LT(cs.size(), s0->result.detection.sources.size()) << "a higher threshold finds fewer sources";
    EXPECT_EQ(std::memcmp(ps.x.data(), cs.x.data(), cs.size() * sizeof(double)), 0);
    EXPECT_EQ(std::memcmp(ps.y.data(), cs.y.data(), cs.size() * sizeof(double)), 0);
    const std::size_t n = cs.size();
    ASSERT_EQ(p->result.aperture.fluxOpt.size(), n);
    ASSERT_EQ(p->result.psf.fwhm.size(), n);
    ASSERT_EQ(p->result.psf.flags.size(), n);
    std::size_t finiteOpt = 0, finitePsf = 0;
    for (std::size_t i = 0; i < n; ++i) {
        finiteOpt += std::isfinite(p->result.aperture.fluxOpt[i]);
        finitePsf += std::isfinite(p->result.psf.fluxPsf[i]);
    }
    EXPECT_GT(finiteOpt, n / 2);
    EXPECT_EQ(finitePsf, 0u);
    EXPECT_EQ(std::memcmp(&p->result.psf.medianFwhm, &s0->result.psf.medianFwhm, sizeof(double)), 0);
    EXPECT_EQ(p->result.fwhmSource, s0->result.fwhmSource);
    for (std::int32_t i : p->result.zeropoint.sourceIndex)
        ASSERT_LT(static_cast<std::size_t>(i), n);
    // Its apertures are close to the complete ones (the field FWHM barely moves with the threshold).
    std::size_t close = 0, both = 0;
    for (std::size_t i = 0; i < n; ++i) {
        const double a = p->result.aperture.fluxOpt[i], b = s1->result.aperture.fluxOpt[i];
        if (!(std::isfinite(a) && std::isfinite(b) && b > 0)) continue;
        ++both;
        close += std::abs(a / b - 1.0) < 0.05;
    }
    EXPECT_GT(close, both * 9 / 10);

    // The complete result is the one an uninterrupted fresh run gives, bit for bit.
    RunContext ctx;
    ctx.threads = 2;
    PipelineResult fresh;
    runPipeline(*s1->frame, c1, ctx, fresh, Stage::Background, s1->reference.get());
    ASSERT_NO_FATAL_FAILURE(expectSameCatalog(buildCatalog(*s1->frame, s1->result, c1, s1->reference.get()),
                                              buildCatalog(*s1->frame, fresh, c1, s1->reference.get())));
    std::size_t finitePsfComplete = 0;
    for (double v : s1->result.psf.fluxPsf)
        finitePsfComplete += std::isfinite(v);
    EXPECT_GT(finitePsfComplete, n / 2);

    // An aperture edit (no re-detection) gives only the complete result; so does a re-detection with the
    // setting off.
    PipelineConfig c2 = c1;
    c2.aperture.radii = {2.5, 3.5, 5.0};
    w->requestRun(c2);
    ASSERT_TRUE(waitFor(ready, 3, 60000));
    w->setProvisionalResults(false);
    PipelineConfig c3 = c2;
    c3.detection.threshold = c1.detection.threshold + 0.2;
    w->requestRun(c3);
    ASSERT_TRUE(waitFor(ready, 4, 60000));
    QTest::qWait(20);
    EXPECT_EQ(prov.count(), 1);
    EXPECT_EQ(w->provisionalResults(), 1u);
}

TEST(PipelineWorkerProvisional, ANewerRequestDropsTheProvisionalResultOfTheOldOne) {
    gpuphot::test::uiTestApp();
    const Field f;
    PipelineWorkerThread host;
    PipelineWorker* w = host.worker();
    w->setProvisionalResults(true);
    QueuedSpy loaded(w, &PipelineWorker::frameLoaded);
    QueuedSpy ready(w, &PipelineWorker::resultReady);
    QueuedSpy prov(w, &PipelineWorker::provisionalReady);
    QMetaObject::invokeMethod(w, "loadFrame", Qt::QueuedConnection,
                              Q_ARG(QString, QString::fromStdString(f.frame)), Q_ARG(QString, QString()));
    ASSERT_TRUE(waitFor(loaded, 1, 30000));
    PipelineConfig c;
    w->requestRun(c);
    ASSERT_TRUE(waitFor(ready, 1, 60000));
    // Two re-detections back to back: the first is cancelled or superseded; whatever comes is the second's.
    c.detection.threshold += 0.3;
    w->requestRun(c);
    c.detection.threshold += 0.3;
    const quint64 g = w->requestRun(c);
    ASSERT_TRUE(waitFor(ready, 2, 60000));
    QTest::qWait(50);
    EXPECT_EQ(ready.count(), 2);
    EXPECT_EQ(at(ready, 1)->generation, g);
    for (int i = 0; i < prov.count(); ++i)
        EXPECT_EQ(at(prov, i)->generation, g);
}
