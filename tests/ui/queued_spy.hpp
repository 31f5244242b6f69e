#pragma once
// A QSignalSpy for a signal emitted on another thread (the PipelineWorker's).
//
// Qt 6.4's QSignalSpy connects Qt::DirectConnection, so a signal emitted on the worker's thread appends to
// the spy's list on that thread while the test's thread reads the same list (count(), at()) with no lock: a
// data race, which ThreadSanitizer reports (tests/long/tsan.sh). QueuedSpy takes the signal queued instead:
// the list is only touched on the thread the spy lives on (the test's), and the recorded arguments reach it
// through Qt's event queue. Signals from one sender thread keep their order. The list grows only while the
// test's thread processes events (QTest::qWait, QSignalSpy::wait), which every wait in these tests does.
#include <QMetaMethod>
#include <QSignalSpy>

namespace gpuphot::test {

class QueuedSpy : public QSignalSpy {
public:
    template <typename Func>
    QueuedSpy(const typename QtPrivate::FunctionPointer<Func>::Object* sender, Func signal)
        : QSignalSpy(sender, signal) {
        // The slot QSignalSpy connected: its one method past QObject's (see QSignalSpy::connectToSignal).
        const int signalIndex = QMetaMethod::fromSignal(signal).methodIndex();
        const int slotIndex = QObject::staticMetaObject.methodCount();
        QMetaObject::disconnect(sender, signalIndex, this, slotIndex);
        QMetaObject::connect(sender, signalIndex, this, slotIndex, Qt::QueuedConnection, nullptr);
    }
};

} // namespace gpuphot::test
