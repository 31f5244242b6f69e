#include "tests/viewers/gl_test_util.hpp"

#include <QApplication>
#include <QOpenGLContext>

#include "viewers/image_view.hpp"

namespace gpuphot::viewers::test {

void ensureApp() {
    static QApplication* app = [] {
        if (qEnvironmentVariableIsEmpty("DISPLAY") && qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM"))
            qputenv("QT_QPA_PLATFORM", "offscreen");
        static int argc = 1;
        static char name[] = "viewers_tests";
        static char* argv[] = {name, nullptr};
        return new QApplication(argc, argv);
    }();
    (void)app;
}

std::string showAndCheckGl(ImageView& view, int w, int h) {
    // Probe first: showing a QOpenGLWidget where the platform has no OpenGL (offscreen, no DISPLAY) crashes
    // inside Qt 6.4 (QPlatformBackingStore::rhiFlush) instead of failing.
    QOpenGLContext probe;
    if (!probe.create()) return "no OpenGL context (run under xvfb-run)";
    view.resize(w, h);
    view.show();
    QCoreApplication::processEvents();
    (void)view.grabFramebuffer();
    if (!view.context() || !view.context()->isValid()) return "no OpenGL context (run under xvfb-run)";
    if (!view.glFailure().isEmpty()) return "OpenGL renderer failed: " + view.glFailure().toStdString();
    return {};
}

QImage grab(ImageView& view) {
    return view.grabFramebuffer().convertToFormat(QImage::Format_RGB32);
}

} // namespace gpuphot::viewers::test
