#pragma once
// Host side of kernels/detection/detection_finish.cu (OpenMP): the objects packed into one upload buffer as CSR, and
// the Sources columns filled from the downloaded order and windowed positions.
#include <cstddef>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "core/stages/detection/detection_internal.hpp"

namespace gpuphot::cuda {

// One upload buffer: runStart[n + 1] and pixStart[n + 1] (int64 CSR offsets of each object's runs and
// pixels), the window inputs WindowObject[n], the runs Run[nRuns]; objects in found's order.
struct FinishLayout {
    std::size_t n = 0, nRuns = 0;
    std::int64_t nPix = 0;
    std::size_t runStart = 0, pixStart = 0, objects = 0, runs = 0, bytes = 0; // byte offsets, total
};
// pixStart is computed here (written into `pixStart`, n + 1 entries).
FinishLayout finishLayout(const detail::DetectedObjects& found, std::int64_t* pixStart, int threads);
// Fills dst (layout.bytes) from found; pixStart as finishLayout gave it.
void packFinish(const detail::DetectedObjects& found, const FinishLayout& layout, const std::int64_t* pixStart,
                unsigned char* dst, int threads);
// result.sources (resized to found's count): row k from found.iso[order[k]] and found.objects[order[k]].flags,
// as detail::setSourceRow, but the windowed position (x, y, xErr, yErr) left zero: fillFinishWindow writes
// it. The device computes the windowed positions meanwhile.
void fillFinishColumns(const detail::DetectedObjects& found, const std::int32_t* order, DetectionResult& result,
                       int threads);
// The windowed position columns of row k from win[k] (setSourceRow's x, y, xErr, yErr).
void fillFinishWindow(const detail::WindowResult* win, Sources& s, int threads);
// How the finish step frees the objects: DeferredRelease's thread at idle or normal priority, or at once.
enum class ReleaseMode { IdleThread, Thread, Now };
// Frees found's objects and measurements at once (found is left empty): the objects' runs by `threads`
// threads (the finish step calls it while the device makes the map and the windowed positions).
void releaseNow(detail::DetectedObjects&& found, int threads);
// Frees the objects of finished detections on a helper thread, after the step: their runs are one heap
// block per object (3.9 ms of free() at 59k objects, which would otherwise lie on the step's critical path).
// One release at a time: the next release() (the next frame's finish step) and the destructor (the device
// context's end) join the previous one first. With threads <= 1, or when no thread can be started, the
// objects are freed at once on the calling thread. The helper keeps the emptied object and measurement
// vectors for the next frame (takeRecycled). Not thread-safe (the caller serialises).
class DeferredRelease {
public:
    DeferredRelease() = default;
    ~DeferredRelease() { wait(); }
    DeferredRelease(const DeferredRelease&) = delete;
    DeferredRelease& operator=(const DeferredRelease&) = delete;
    // Takes found's objects and measurements (found is left empty). idle: the helper thread runs at idle
    // scheduling priority (SCHED_IDLE on Linux: only on cores nothing else wants).
    void release(detail::DetectedObjects&& found, int threads, bool idle = false);
    // Joins the release in progress, if any.
    void wait() noexcept;
    // Releases handed to a helper thread so far (tests).
    std::uint64_t threadsStarted() const { return m_started; }
    // The containers of the last release whose helper thread has finished: the objects (each one's runs
    // freed, the vector's size and pages kept) and the measurements (stale values), for the next frame's
    // result storage (ObjectStorage::start), whose ~13 MB at 60k objects are then not faulted in afresh.
    // False (nothing taken, nothing waited for) while the helper still frees, or when there is nothing.
    bool takeRecycled(std::vector<detail::Object>& objects, std::vector<detail::IsoMeasure>& iso);

private:
    std::thread m_thread;
    std::uint64_t m_started = 0;
    std::atomic<bool> m_done{true}; // the helper thread has finished (m_objects, m_iso written)
    std::vector<detail::Object> m_objects;
    std::vector<detail::IsoMeasure> m_iso;
};

} // namespace gpuphot::cuda
