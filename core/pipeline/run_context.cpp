#include "core/pipeline/run_context.hpp"

#include <fstream>
#include <omp.h>
#include <sstream>
#include <thread>

#include "core/util/errors.hpp"
#include "core/util/memory.hpp"
#include "core/util/timeline.hpp"

namespace gpuphot {

const char* backendName(Backend b) {
    switch (b) {
    case Backend::Auto:
        return "auto";
    case Backend::Cpu:
        return "cpu";
    case Backend::Cuda:
        return "cuda";
    }
    return "?";
}

Backend parseBackend(const std::string& s) {
    if (s == "auto") return Backend::Auto;
    if (s == "cpu") return Backend::Cpu;
    if (s == "cuda") return Backend::Cuda;
    throw InvalidInput("unknown backend '" + s + "' (expected auto, cpu or cuda)");
}

void RunContext::checkCancelled() const {
    if (cancelRequested()) throw Cancelled();
}

void RunContext::report(const std::string& stage, double fraction) const {
    if (progress) progress(stage, fraction);
}

int RunContext::threadCount() const {
    if (threads > 0) return threads;
    const int omp = omp_get_max_threads();
    const int n = omp > 0 ? omp : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    // The CUDA backend runs helper threads beside the stages' loops (the detection's release and storage
    // threads, map downloads): on 8 to 15 cores its loops leave two of them free, on 16 or more four. With
    // all 16 cores of a 16-core host in use, a loop thread descheduled for a time slice made 10-20 % of the
    // workbench's aperture stages 2-3x slower (21-42 ms); with 14, 1 in 30, and the re-runs' medians 9 %
    // lower; with 12, the re-runs' medians 28-30 ms against 37 with 14 and the full run unchanged
    // (docs/BENCHMARKS.md).
    if (backend == Backend::Cuda && n >= 16) return n - 4;
    if (backend == Backend::Cuda && n >= 8) return n - 2;
    return n;
}

int threadShare(const RunContext& ctx, int inFlight) {
    if (ctx.threads != 0 || inFlight <= 1) return ctx.threads;
    return (ctx.threadCount() + inFlight - 1) / inFlight;
}

OmpThreadLimit::OmpThreadLimit(int n) {
    if (n <= 0) return;
    m_previous = omp_get_max_threads();
    omp_set_num_threads(n);
}

OmpThreadLimit::~OmpThreadLimit() {
    if (m_previous > 0) omp_set_num_threads(m_previous);
}

RunContext::StageTimer::StageTimer(RunContext& ctx, std::string stage)
    : m_ctx(ctx), m_stage(std::move(stage)), m_start(std::chrono::steady_clock::now()) {}

RunContext::StageTimer::~StageTimer() {
    if (std::uncaught_exceptions() > 0) {
        // Left by an exception: no record (the stage did not end), but the error can name the stage
        // (noteFailedStage keeps the innermost, the first to see it).
        noteFailedStage(m_stage);
        return;
    }
    try {
        StageRecord r;
        r.stage = m_stage;
        r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - m_start).count();
        r.peakHostBytes = peakResidentBytes();
        if (m_ctx.deviceCheckpoint) m_ctx.deviceCheckpoint(r);
        m_ctx.records.push_back(r);
        if (timelineEnabled()) timelineMark((m_stage + " done").c_str());
    } catch (...) { // out of memory for the record: the report misses one stage's timing
    }
}

namespace {
std::size_t statusField(const char* name) {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line)) {
        if (line.rfind(name, 0) == 0) {
            std::istringstream is(line.substr(std::string(name).size()));
            std::size_t kb = 0;
            is >> kb;
            return kb * 1024;
        }
    }
    return 0;
}
} // namespace

std::size_t peakResidentBytes() {
    return statusField("VmHWM:");
}
std::size_t currentResidentBytes() {
    return statusField("VmRSS:");
}

} // namespace gpuphot
