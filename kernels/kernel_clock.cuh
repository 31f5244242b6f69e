#pragma once
// Device times of the detection stage's kernels and copies (kernels/detection/detection.cu's front,
// kernels/detection/detection_finish.cu's finish step) under GPUPHOT_DETECTION_TIMING, and host laps; the aperture
// stage's phases (kernels/aperture/aperture.cu) under GPUPHOT_APERTURE_TIMING.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace gpuphot::cuda {

// GPUPHOT_DETECTION_TIMING: device times of a step's kernels and copies (CUDA events around each, summed by
// name, printed on stderr with the stage's step times). Off: no events, no synchronisation.
class KernelClock {
public:
    // part: the step's name in the printed lines ("front", "finish"); on: BackendTuning's detection.timing,
    // or aperture.timing for the aperture stage, whose owner reads deviceSums() and hostSums() and prints
    // its own lines.
    KernelClock(cudaStream_t stream, const char* part, bool on)
        : m_on(on), m_stream(stream), m_part(part), m_last(std::chrono::steady_clock::now()) {}
    ~KernelClock() {
        for (Mark& m : m_marks) {
            cudaEventDestroy(m.a);
            cudaEventDestroy(m.b);
        }
    }
    KernelClock(const KernelClock&) = delete;
    KernelClock& operator=(const KernelClock&) = delete;
    bool on() const { return m_on; }
    template <class F> void time(const char* name, F&& f) {
        if (!m_on) {
            f();
            return;
        }
        Mark m{name, nullptr, nullptr, m_stream};
        cudaEventCreate(&m.a);
        cudaEventCreate(&m.b);
        cudaEventRecord(m.a, m_stream);
        f();
        cudaEventRecord(m.b, m_stream);
        m_marks.push_back(m);
    }
    // A device phase around code that is not one callable: start(name) before its launches and copies on the
    // clock's stream (or `stream`: then stop() records there too), stop() after them (phases do not nest).
    void start(const char* name) { start(name, m_stream); }
    void start(const char* name, cudaStream_t stream) {
        if (!m_on) return;
        Mark m{name, nullptr, nullptr, stream};
        cudaEventCreate(&m.a);
        cudaEventCreate(&m.b);
        cudaEventRecord(m.a, stream);
        m_marks.push_back(m);
    }
    void stop() {
        if (m_on && !m_marks.empty()) cudaEventRecord(m_marks.back().b, m_marks.back().stream);
    }
    // A host time measured by the caller, summed by name with the laps.
    void addHost(const char* name, double ms) {
        if (!m_on) return;
        auto it = std::find_if(m_laps.begin(), m_laps.end(), [&](const auto& e) { return e.first == name; });
        if (it == m_laps.end())
            m_laps.push_back({name, ms});
        else
            it->second += ms;
    }
    struct Sum {
        std::string name;
        double ms;
        int count;
    };
    // The device phases summed by name (in order of first use), after the stream is synchronised; the marks
    // are released (report() then prints no device lines).
    std::vector<Sum> deviceSums() {
        std::vector<Sum> sums;
        if (!m_on || m_marks.empty()) return sums;
        for (const Mark& m : m_marks)
            cudaEventSynchronize(m.b);
        for (const Mark& m : m_marks) {
            float ms = 0.0f;
            if (cudaEventElapsedTime(&ms, m.a, m.b) != cudaSuccess) {
                cudaGetLastError();
                continue;
            }
            auto it = std::find_if(sums.begin(), sums.end(), [&](const Sum& e) { return e.name == m.name; });
            if (it == sums.end()) sums.push_back({m.name, 0.0, 0}), it = sums.end() - 1;
            it->ms += ms;
            ++it->count;
        }
        for (Mark& m : m_marks) {
            cudaEventDestroy(m.a);
            cudaEventDestroy(m.b);
        }
        m_marks.clear();
        return sums;
    }
    // The host times (laps and addHost) summed by name, in order of first use.
    const std::vector<std::pair<std::string, double>>& hostSums() const { return m_laps; }
    // Host time since the previous lap (or the clock's construction), summed by name.
    void lap(const char* name) {
        if (!m_on) return;
        const auto now = std::chrono::steady_clock::now();
        const double ms = std::chrono::duration<double, std::milli>(now - m_last).count();
        m_last = now;
        auto it = std::find_if(m_laps.begin(), m_laps.end(), [&](const auto& e) { return e.first == name; });
        if (it == m_laps.end())
            m_laps.push_back({name, ms});
        else
            it->second += ms;
    }
    // Sums by name (in order of first use) and the span from the first event to the last.
    void report() {
        if (!m_on) return;
        for (const auto& [name, ms] : m_laps)
            std::fprintf(stderr, "detection timing: host %s: %s %.3f ms\n", m_part, name.c_str(), ms);
        m_laps.clear();
        if (m_marks.empty()) return;
        cudaStreamSynchronize(m_stream);
        std::vector<std::pair<std::string, std::pair<double, int>>> sums;
        for (const Mark& m : m_marks) {
            float ms = 0.0f;
            cudaEventElapsedTime(&ms, m.a, m.b);
            auto it =
                std::find_if(sums.begin(), sums.end(), [&](const auto& e) { return e.first == m.name; });
            if (it == sums.end()) sums.push_back({m.name, {0.0, 0}}), it = sums.end() - 1;
            it->second.first += ms;
            ++it->second.second;
        }
        for (const auto& [name, v] : sums)
            std::fprintf(stderr, "detection timing: device %s %.3f ms (%d)\n", name.c_str(), v.first,
                         v.second);
        float span = 0.0f;
        cudaEventElapsedTime(&span, m_marks.front().a, m_marks.back().b);
        std::fprintf(stderr, "detection timing: device %s span %.3f ms\n", m_part, span);
        for (Mark& m : m_marks) {
            cudaEventDestroy(m.a);
            cudaEventDestroy(m.b);
        }
        m_marks.clear();
    }

private:
    struct Mark {
        const char* name;
        cudaEvent_t a, b;
        cudaStream_t stream;
    };
    bool m_on;
    cudaStream_t m_stream;
    const char* m_part;
    std::vector<Mark> m_marks;
    std::chrono::steady_clock::time_point m_last;
    std::vector<std::pair<std::string, double>> m_laps;
};

} // namespace gpuphot::cuda
