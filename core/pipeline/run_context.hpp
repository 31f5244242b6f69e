#pragma once
// What every stage function receives besides its inputs and Params: the backend choice, the thread
// count, progress and cancellation, and per-stage timings / memory checkpoints for the report.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "core/pipeline/backend_tuning.hpp"

namespace gpuphot {

enum class Backend { Auto, Cpu, Cuda };
const char* backendName(Backend b);
Backend parseBackend(const std::string& s); // "auto" | "cpu" | "cuda"; throws InvalidInput

struct StageRecord {
    std::string stage;
    double seconds = 0.0;
    std::size_t peakHostBytes = 0;   // process peak RSS after the stage (VmHWM)
    std::size_t deviceHighWater = 0; // pool high-water mark (CUDA backend)
    std::size_t deviceFree = 0;      // cudaMemGetInfo free after the stage
    // CUDA backend's plan for the stage: "whole" (frame resident on the device), "strips" (rows streamed
    // from the host in deviceStrips strips), "cpu" (fell back to the CPU stage); empty: not a GPU stage.
    std::string devicePlan;
    int deviceStrips = 0;
    std::string deviceNote; // e.g. "gpu: stage detection ran on the CPU: budget ... too small"
};

class RunContext {
public:
    Backend backend = Backend::Cpu; // resolved backend (never Auto once a run starts)
    int threads = 0;                // 0: all cores (CUDA backend on 8 or more: all but two, threadCount)
    // CUDA backend: the GPU (ordinal among the visible ones) whose device state this context creates and
    // runs on; -1: the creating thread's current device (the first visible one unless changed). Set before
    // the state exists (startDeviceWarmUp, the first stage); a mosaic's CCD contexts spread over the GPUs.
    int device = -1;
    // fraction in [0, 1] within the named stage; may be called from worker threads
    std::function<void(const std::string& stage, double fraction)> progress;
    const std::atomic<bool>* cancelFlag = nullptr;

    void checkCancelled() const; // throws Cancelled
    // Whether a cancel was asked for, without throwing: for the iterations of a parallel loop, which skip
    // their work so that the checkCancelled after the loop comes at once.
    bool cancelRequested() const { return cancelFlag && cancelFlag->load(std::memory_order_relaxed); }
    void report(const std::string& stage, double fraction) const;
    int threadCount() const; // resolved thread count (>= 1)

    // RAII timer: records a StageRecord when it goes out of scope.
    class StageTimer {
    public:
        StageTimer(RunContext& ctx, std::string stage);
        ~StageTimer();
        StageTimer(const StageTimer&) = delete;
        StageTimer& operator=(const StageTimer&) = delete;

    private:
        RunContext& m_ctx;
        std::string m_stage;
        std::chrono::steady_clock::time_point m_start;
    };
    StageTimer time(std::string stage) { return StageTimer(*this, std::move(stage)); }

    std::vector<StageRecord> records;

    BackendTuning tuning; // the engines' alternative paths (defaults: the product's); in the report
    TestHooks testHooks;  // fault injection, set by tests only

    // CUDA backend state (stream, memory pool, the frame kept on the device between stages and runs),
    // opaque to core; created by the backend on first use and kept for the context's lifetime, so a
    // long-lived context (the workbench's worker, `gpuphot worker`) reuses its warm pool.
    std::shared_ptr<void> deviceState;
    // A device state being created on another thread (startDeviceWarmUp, core/pipeline/cuda_stages.hpp):
    // the CUDA context and pool come up while the first frame is read; the backend adopts it on first use.
    std::shared_future<std::shared_ptr<void>> deviceStateWarmUp;
    std::size_t gpuMemLimit = 0; // bytes the CUDA backend may use; 0: what the device has free
    // Set by the CUDA backend: fills deviceHighWater / deviceFree of each stage's record.
    std::function<void(StageRecord&)> deviceCheckpoint;
};

// While it lives, this thread's OpenMP regions that name no thread count (the read's, the stages' host
// loops) use n threads; the thread's own count comes back after. A thread that reduces one of several
// CCDs or frames in flight gives it its context's share of the cores, so that K threads do not each
// start a team of every core. n <= 0: no change.
// The thread count of a context that is one of `inFlight` reducing at once (CCDs of an exposure, frames of
// `--concurrent`): its own when set, else its share of the cores, ceil(threadCount() / inFlight).
int threadShare(const RunContext& ctx, int inFlight);

class OmpThreadLimit {
public:
    explicit OmpThreadLimit(int n);
    ~OmpThreadLimit();
    OmpThreadLimit(const OmpThreadLimit&) = delete;
    OmpThreadLimit& operator=(const OmpThreadLimit&) = delete;

private:
    int m_previous = 0;
};

std::size_t peakResidentBytes();    // VmHWM of this process
std::size_t currentResidentBytes(); // VmRSS

} // namespace gpuphot
