// gpuphot-studio: the interactive workbench.
#include <QApplication>

#include "ui/main_window.hpp"

int main(int argc, char** argv) {
    QApplication app(argc, argv);
    QApplication::setApplicationName(QStringLiteral("gpuphot-studio"));
    QApplication::setApplicationVersion(QStringLiteral(GPUPHOT_VERSION));
    gpuphot::ui::MainWindow window;
    if (argc > 1) window.openFrame(QString::fromLocal8Bit(argv[1]));
    window.show();
    return app.exec();
}
