#pragma once
// Frees large objects off the calling thread: a 151 MP frame's pixels, mask and results take tens of
// milliseconds to give back to the system, time a writer thread (or the end of a cold run) should not
// wait for. One process-wide thread frees what it is given, in order; the process does not wait for it at
// exit. With one object already waiting, the caller frees its own (memory stays bounded: one object
// being freed, one waiting).
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

namespace gpuphot {

// Runs `release` on the release thread, or here when one is already waiting or the thread could not be
// started (a process under an address-space limit). Returns true when queued.
bool postRelease(std::function<void()> release);

template <class T> void releaseInBackground(T&& object) {
    auto held = std::make_shared<std::decay_t<T>>(std::forward<T>(object));
    postRelease([held]() mutable { held.reset(); });
}

} // namespace gpuphot
