#include "kernels/detection/detection_finish_pack.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <system_error>
#include <utility>
#include <vector>

#ifdef __linux__
#include <pthread.h>
#include <sched.h>
#endif

#include "core/stages/detection/detection_window.hpp"

namespace gpuphot::cuda {

namespace {
constexpr std::size_t align8(std::size_t b) { return (b + 7) & ~std::size_t(7); }
} // namespace

FinishLayout finishLayout(const detail::DetectedObjects& found, std::int64_t* pixStart, int threads) {
    FinishLayout l;
    l.n = found.objects.size();
    const auto n = static_cast<std::int64_t>(l.n);
#pragma omp parallel for num_threads(threads) schedule(dynamic, 256)
    for (std::int64_t i = 0; i < n; ++i)
        pixStart[i + 1] = detail::runsArea(found.objects[i].runs);
    pixStart[0] = 0;
    for (std::int64_t i = 0; i < n; ++i) {
        pixStart[i + 1] += pixStart[i];
        l.nRuns += found.objects[i].runs.size();
    }
    l.nPix = pixStart[n];
    l.runStart = 0;
    l.pixStart = align8(l.runStart + (l.n + 1) * sizeof(std::int64_t));
    l.objects = align8(l.pixStart + (l.n + 1) * sizeof(std::int64_t));
    l.runs = align8(l.objects + l.n * sizeof(detail::WindowObject));
    l.bytes = align8(l.runs + l.nRuns * sizeof(detail::Run));
    return l;
}

void packFinish(const detail::DetectedObjects& found, const FinishLayout& l, const std::int64_t* pixStart,
                unsigned char* dst, int threads) {
    auto* runStart = reinterpret_cast<std::int64_t*>(dst + l.runStart);
    auto* obj = reinterpret_cast<detail::WindowObject*>(dst + l.objects);
    auto* runs = reinterpret_cast<detail::Run*>(dst + l.runs);
    std::memcpy(dst + l.pixStart, pixStart, (l.n + 1) * sizeof(std::int64_t));
    runStart[0] = 0;
    for (std::size_t i = 0; i < l.n; ++i)
        runStart[i + 1] = runStart[i] + static_cast<std::int64_t>(found.objects[i].runs.size());
    const auto n = static_cast<std::int64_t>(l.n);
#pragma omp parallel for num_threads(threads) schedule(dynamic, 256)
    for (std::int64_t i = 0; i < n; ++i) {
        const auto& r = found.objects[i].runs;
        std::memcpy(runs + runStart[i], r.data(), r.size() * sizeof(detail::Run));
        obj[i] = detail::windowObject(found.iso[i]);
    }
}

void fillFinishColumns(const detail::DetectedObjects& found, const std::int32_t* order, DetectionResult& result,
                       int threads) {
    Sources& s = result.sources;
    // The fresh columns are zero-filled (first touch) one per thread rather than all on one (0.9-4.5 ms at
    // 134k objects, 0.3 ms so). A column that fails to grow is grown again by s.resize, which
    // throws.
    std::vector<double>* dcol[] = {&s.x,  &s.y, &s.xErr, &s.yErr,  &s.xIso,    &s.yIso,       &s.x2,  &s.y2,
                                   &s.xy, &s.a, &s.b,    &s.theta, &s.fluxIso, &s.fluxIsoErr, &s.peak};
    std::vector<std::int32_t>* icol[] = {&s.areaIso, &s.xMin, &s.xMax, &s.yMin, &s.yMax, &s.segmentId};
    constexpr int nd = static_cast<int>(std::size(dcol)), ni = static_cast<int>(std::size(icol));
    const std::size_t rows = found.objects.size();
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int c = 0; c <= nd + ni; ++c) {
        try {
            if (c < nd)
                dcol[c]->resize(rows);
            else if (c < nd + ni)
                icol[c - nd]->resize(rows);
            else
                s.flags.resize(rows);
        } catch (...) {
        }
    }
    s.resize(rows);
    const auto n = static_cast<std::int64_t>(rows);
    const detail::WindowResult none{};
#pragma omp parallel for num_threads(threads) schedule(static, 1024)
    for (std::int64_t k = 0; k < n; ++k)
        detail::setSourceRow(s, static_cast<std::size_t>(k), found.iso[order[k]], found.objects[order[k]].flags,
                             none);
}

void fillFinishWindow(const detail::WindowResult* win, Sources& s, int threads) {
    const auto n = static_cast<std::int64_t>(s.size());
    // On the calling thread up to a few hundred thousand rows (0.3 ms at 59k): the step's team has slept
    // through the device's wait, and the parallel loop took 0.6-1.7 ms there.
    constexpr std::int64_t kSerialRows = std::int64_t{1} << 18;
#pragma omp parallel for num_threads(threads) schedule(static, 4096) if (n > kSerialRows && threads > 1)
    for (std::int64_t k = 0; k < n; ++k) {
        s.x[k] = win[k].x;
        s.y[k] = win[k].y;
        s.xErr[k] = win[k].xErr;
        s.yErr[k] = win[k].yErr;
    }
}

void releaseNow(detail::DetectedObjects&& found, int threads) {
    detail::DetectedObjects gone = std::move(found);
    found = {};
    std::vector<detail::Object>& objects = gone.objects;
    const auto n = static_cast<std::int64_t>(objects.size());
#pragma omp parallel for num_threads(std::max(1, threads)) schedule(static) if (n > 4096 && threads > 1)
    for (std::int64_t i = 0; i < n; ++i)
        std::vector<detail::Run>().swap(objects[static_cast<std::size_t>(i)].runs);
}

void DeferredRelease::release(detail::DetectedObjects&& found, int threads, bool idle) {
    wait();
    detail::DetectedObjects gone = std::move(found);
    found = {};
    if (threads > 1) {
        try {
            m_done.store(false, std::memory_order_relaxed);
            m_thread = std::thread([this, g = std::move(gone), idle]() mutable {
#ifdef __linux__
                if (idle) {
                    const sched_param sp{};
                    pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp); // best effort
                }
#else
                (void)idle;
#endif
                // Each object's runs freed on this thread; the two vectors kept for the next frame's storage
                // (those of an earlier release that were not taken are freed here).
                for (detail::Object& o : g.objects)
                    std::vector<detail::Run>().swap(o.runs);
                m_objects = std::move(g.objects);
                m_iso = std::move(g.iso);
                g = {};
                m_done.store(true, std::memory_order_release);
            });
            ++m_started;
        } catch (const std::system_error&) {
            m_done.store(true, std::memory_order_relaxed);
            // no thread: `gone` (or the lambda that took it) is freed here
        }
    }
}

void DeferredRelease::wait() noexcept {
    if (m_thread.joinable()) m_thread.join();
}

bool DeferredRelease::takeRecycled(std::vector<detail::Object>& objects,
                                   std::vector<detail::IsoMeasure>& iso) {
    if (!m_done.load(std::memory_order_acquire)) return false; // still freeing: not waited for
    wait();                                                     // finished: the join is immediate
    if (m_objects.capacity() == 0 || m_iso.capacity() == 0) return false;
    objects = std::move(m_objects);
    iso = std::move(m_iso);
    m_objects = {};
    m_iso = {};
    return true;
}

} // namespace gpuphot::cuda
