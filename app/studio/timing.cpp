#include "app/studio/timing.hpp"

#include <QApplication>
#include <QDoubleSpinBox>
#include <QImage>
#include <QTimer>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "ui/main_window.hpp"
#include "ui/param_dock.hpp"
#include "viewers/image_view.hpp"

namespace gpuphot::ui {

void timeFirstView(MainWindow& window, const QElapsedTimer& sinceStart) {
    QObject::connect(&window, &MainWindow::frameShown, &window, [&window, &sinceStart] {
        // grabFramebuffer renders the view now: the image is uploaded and drawn (zscaled, fitted).
        const QImage img = window.imageView()->grabFramebuffer();
        std::printf("first view after %lld ms (%dx%d view%s)\n", static_cast<long long>(sinceStart.elapsed()),
                    img.width(), img.height(), img.isNull() ? ", EMPTY" : "");
        std::fflush(stdout);
        QApplication::exit(img.isNull() ? 1 : 0);
    });
}

void timeFirstResult(MainWindow& window, const QElapsedTimer& sinceStart) {
    QObject::connect(&window, &MainWindow::snapshotShown, &window, [&window, &sinceStart](SnapshotPtr s) {
        window.imageView()->grabFramebuffer(); // the overlays drawn
        std::printf("first result after %lld ms (%zu sources%s)\n",
                    static_cast<long long>(sinceStart.elapsed()),
                    s ? s->result.detection.sources.size() : std::size_t{0},
                    s && s->provisional ? ", provisional" : "");
        std::fflush(stdout);
        QApplication::exit(0);
    });
}

namespace {
double median(std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// One threshold edit after another, each once the previous one's complete result is shown and the
// window has been idle for a moment (as a user who looks at the result before the next edit).
// Jumps: typed values; steps: one spin-box step (0.1 sigma, the worker computes the neighbours ahead,
// so the edit waits until they are done).
struct EditRun {
    struct Edit {
        double threshold;
        bool step;
    };
    std::vector<Edit> edits{{1.3, false}, {1.7, false}, {2.1, false}, {1.5, false}, {1.9, false},
                            {1.2, false}, {1.6, false}, {2.0, false}, {2.1, true},  {2.2, true},
                            {2.1, true},  {2.0, true},  {1.9, true},  {1.8, true}};
    std::size_t next = 0;
    bool started = false, firstShown = false;
    double firstWorkerMs = 0.0; // the first shown result's stage times: the rest of its wait is elsewhere
    QElapsedTimer clock;
    std::vector<double> first[2], complete[2]; // [jump, step]
};

void nextEdit(MainWindow& window, const std::shared_ptr<EditRun>& run) {
    if (run->next == run->edits.size()) {
        for (int step : {0, 1})
            std::printf("threshold %s to overlays: first (provisional or complete) median %.0f ms, complete "
                        "median %.0f ms over %zu edits\n",
                        step ? "steps" : "jumps", median(run->first[step]), median(run->complete[step]),
                        run->first[step].size());
        std::fflush(stdout);
        QApplication::exit(0);
        return;
    }
    auto* spin = qobject_cast<QDoubleSpinBox*>(window.paramDock()->editorFor("detection.threshold"));
    if (!spin) {
        std::fprintf(stderr, "gpuphot-studio: no threshold editor\n");
        QApplication::exit(1);
        return;
    }
    run->firstShown = false;
    run->clock.start();
    spin->setValue(run->edits[run->next++].threshold);
}

// A result of the current edit shown: its overlays drawn, then the time taken.
void shown(MainWindow& window, const std::shared_ptr<EditRun>& run, const SnapshotPtr& s) {
    window.imageView()->grabFramebuffer();
    const double ms = static_cast<double>(run->clock.nsecsElapsed()) * 1e-6;
    const EditRun::Edit& e = run->edits[run->next - 1];
    if (!run->firstShown) {
        run->firstShown = true;
        run->first[e.step].push_back(ms);
        run->firstWorkerMs = 0.0;
        for (const StageRecord& r : s->timings)
            run->firstWorkerMs += r.seconds * 1e3;
    }
    if (s->provisional) return;
    run->complete[e.step].push_back(ms);
    std::printf("threshold %s to %.2f: first overlays %.0f ms (its stages %.0f ms), complete %.0f ms (%zu "
                "sources)\n",
                e.step ? "step" : "jump", e.threshold, run->first[e.step].back(), run->firstWorkerMs, ms,
                s->result.detection.sources.size());
    std::fflush(stdout);
    // Before a step, time for the worker to compute the neighbours (a user looking at the result).
    const bool stepNext = run->next < run->edits.size() && run->edits[run->next].step;
    QTimer::singleShot(stepNext ? 2500 : 400, &window, [&window, run] { nextEdit(window, run); });
}
} // namespace

void timeThresholdEdits(MainWindow& window) {
    auto run = std::make_shared<EditRun>();
    QObject::connect(&window, &MainWindow::provisionalShown, &window, [&window, run](SnapshotPtr s) {
        if (run->started && s) shown(window, run, s);
    });
    QObject::connect(&window, &MainWindow::snapshotShown, &window, [&window, run](SnapshotPtr s) {
        if (!s) return;
        if (run->started) {
            shown(window, run, s);
        } else if (s->reference) { // the first calibrated result: the edits start
            run->started = true;
            QTimer::singleShot(400, &window, [&window, run] { nextEdit(window, run); });
        }
    });
}

} // namespace gpuphot::ui
