#pragma once
// The one QApplication of the ui_tests executable (every test file asks for it; whichever comes first
// makes it). Offscreen unless a display is set. Never destroyed: a QApplication torn down by the exit
// handlers, after Qt's own global statics, crashes in Qt 6.4 (input devices, GL contexts).
#include <QApplication>

namespace gpuphot::test {

inline QApplication& uiTestApp() {
    if (auto* existing = qobject_cast<QApplication*>(QCoreApplication::instance())) return *existing;
    static int argc = 1;
    static char name[] = "ui_tests";
    static char* argv[] = {name, nullptr};
    if (qEnvironmentVariableIsEmpty("DISPLAY") && qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM"))
        qputenv("QT_QPA_PLATFORM", "offscreen");
    static QApplication* instance = new QApplication(argc, argv);
    return *instance;
}

} // namespace gpuphot::test
