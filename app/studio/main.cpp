// gpuphot-studio: the interactive workbench.
//   gpuphot-studio                       the bundled demo field with its reference catalog
//   gpuphot-studio FRAME [--ref CAT]     a frame (and a reference catalog for calibration)
//   --follow DIR                         open and reduce the newest frame written into DIR
//   --every-frame                        with --follow: every new frame in turn, not only the newest
//   --screenshot PNG                     after the first result: save the window to PNG and quit (docs,
//   tests)
//   --time-first-view / --time-first-result
//                                        print the time from start to the first drawn view of the frame, or
//                                        to the first result's overlays and table, then quit (benchmarks)
//   --time-edit                          time threshold edits to their overlays, then quit (benchmarks)
#include <QApplication>
#include <QCommandLineParser>
#include <QElapsedTimer>
#include <QFileInfo>
#include <QTimer>
#include <cstdio>

#include "app/studio/timing.hpp"
#include "core/pipeline/device_registry.hpp"
#include "core/pipeline/pipeline_config.hpp"
#include "ui/main_window.hpp"
#include "ui/param_dock.hpp"
#include "viewers/image_view.hpp"

int main(int argc, char** argv) {
    QElapsedTimer sinceStart;
    sinceStart.start();
    QApplication app(argc, argv);
    QApplication::setOrganizationName(QStringLiteral("gpuphot"));
    QApplication::setApplicationName(QStringLiteral("gpuphot-studio"));
    QApplication::setApplicationVersion(QStringLiteral(GPUPHOT_VERSION));
#ifdef GPUPHOT_HAVE_CUDA_KERNELS
    gpuphot::cuda::linkKernels();
#endif

    QCommandLineParser cli;
    cli.setApplicationDescription(QStringLiteral("GPUPHOT Studio: live photometry and astrometry workbench"));
    cli.addHelpOption();
    cli.addVersionOption();
    cli.addPositionalArgument(QStringLiteral("frame"),
                              QStringLiteral("FITS frame to open (default: the demo field)"));
    const QCommandLineOption ref(QStringLiteral("ref"), QStringLiteral("Reference catalog"),
                                 QStringLiteral("file"));
    const QCommandLineOption refCols(QStringLiteral("ref-columns"), QStringLiteral("Reference column map"),
                                     QStringLiteral("map"));
    const QCommandLineOption hdu(QStringLiteral("hdu"), QStringLiteral("Image HDU (number or EXTNAME)"),
                                 QStringLiteral("hdu"));
    const QCommandLineOption config(QStringLiteral("config"), QStringLiteral("Parameter profile (JSON)"),
                                    QStringLiteral("file"));
    const QCommandLineOption follow(QStringLiteral("follow"),
                                    QStringLiteral("Follow the newest frame in a folder"),
                                    QStringLiteral("dir"));
    const QCommandLineOption everyFrame(QStringLiteral("every-frame"),
                                        QStringLiteral("With --follow: reduce every new frame in turn"));
    const QCommandLineOption shot(
        QStringLiteral("screenshot"),
        QStringLiteral("Save the window to a PNG after the first result, then quit"), QStringLiteral("png"));
    const QCommandLineOption firstView(QStringLiteral("time-first-view"),
                                       QStringLiteral("Print the time from start to the first displayed view "
                                                      "of the frame, then quit (benchmarks)"));
    const QCommandLineOption firstResult(QStringLiteral("time-first-result"),
                                         QStringLiteral("Print the time from start to the first result shown "
                                                        "(overlays and table), then quit (benchmarks)"));
    const QCommandLineOption editTimes(
        QStringLiteral("time-edit"),
        QStringLiteral("After the first calibrated result, time a run of "
                       "threshold edits to their overlays, then quit (benchmarks)"));
    cli.addOptions({ref, refCols, hdu, config, follow, everyFrame, shot, firstView, firstResult, editTimes});
    cli.process(app);

    gpuphot::ui::MainWindow window;
    if (cli.isSet(config)) {
        try {
            window.paramDock()->setConfig(gpuphot::loadPipelineConfig(cli.value(config).toStdString()));
        } catch (const std::exception& e) {
            std::fprintf(stderr, "gpuphot-studio: %s\n", e.what());
            return 2;
        }
    }
    window.show();
    if (cli.isSet(shot)) {
        const QString png = cli.value(shot);
        const bool wantCalibration = cli.isSet(ref) || cli.positionalArguments().isEmpty();
        QObject::connect(&window, &gpuphot::ui::MainWindow::snapshotShown, &app,
                         [&window, png, wantCalibration](gpuphot::ui::SnapshotPtr s) {
                             if (wantCalibration && !s->reference) return; // wait for the calibrated run
                             QTimer::singleShot(300, &window, [&window, png] {
                                 const bool ok = window.grab().save(png, "PNG");
                                 std::fprintf(stderr, "%s %s\n", ok ? "saved" : "could not save",
                                              qPrintable(png));
                                 QApplication::exit(ok ? 0 : 1);
                             });
                         });
        QObject::connect(&window, &gpuphot::ui::MainWindow::errorShown, &app, [](const QString& m) {
            std::fprintf(stderr, "gpuphot-studio: %s\n", qPrintable(m));
            QApplication::exit(1);
        });
    }
    if (cli.isSet(firstView)) gpuphot::ui::timeFirstView(window, sinceStart);
    if (cli.isSet(firstResult)) gpuphot::ui::timeFirstResult(window, sinceStart);
    if (cli.isSet(editTimes)) gpuphot::ui::timeThresholdEdits(window);
    const QStringList args = cli.positionalArguments();
    if (args.isEmpty() && !cli.isSet(follow)) {
        window.openDemo();
    } else if (!args.isEmpty()) {
        if (window.openFrame(args.front(), cli.value(hdu)) && cli.isSet(ref))
            window.openReference(cli.value(ref), cli.value(refCols));
    }
    if (cli.isSet(everyFrame)) window.setFollowEveryFrame(true);
    if (cli.isSet(follow)) window.followFolder(cli.value(follow));
    return app.exec();
}
