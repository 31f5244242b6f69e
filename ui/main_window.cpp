#include "ui/main_window.hpp"

#include <QLabel>
#include <QStatusBar>

#include "core/io/fits_image.hpp"
#include "core/util/errors.hpp"

namespace gpuphot::ui {

MainWindow::MainWindow(QWidget* parent) : QMainWindow(parent) {
    setWindowTitle(QStringLiteral("GPUPHOT Studio"));
    auto* label = new QLabel(tr("Open a FITS frame (gpuphot-studio FRAME.fits)"), this);
    label->setAlignment(Qt::AlignCenter);
    setCentralWidget(label);
    resize(1100, 750);
}

bool MainWindow::openFrame(const QString& path) {
    try {
        const Frame frame = readFrame(path.toStdString());
        auto* label = qobject_cast<QLabel*>(centralWidget());
        label->setText(tr("%1\n%2 x %3 pixels").arg(path).arg(frame.width()).arg(frame.height()));
        setWindowTitle(tr("GPUPHOT Studio - %1").arg(path));
        return true;
    } catch (const Error& e) {
        statusBar()->showMessage(QString::fromStdString(e.what()));
        return false;
    }
}

} // namespace gpuphot::ui
