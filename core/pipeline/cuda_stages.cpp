// Backend dispatch of the stage functions (see cuda_stages.hpp).
#include "core/pipeline/cuda_stages.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <future>
#include <mutex>
#include <vector>

#include "core/pipeline/run_context.hpp"
#include "core/stages/aperture/aperture.hpp"
#include "core/stages/background/background.hpp"
#include "core/stages/crossmatch/crossmatch.hpp"
#include "core/stages/detection/detection.hpp"
#include "core/stages/psf/psf.hpp"
#include "core/util/timeline.hpp"

namespace gpuphot {
namespace {
CudaStageTable& table() {
    static CudaStageTable t;
    return t;
}
bool useCuda(const RunContext& ctx) { return ctx.backend == Backend::Cuda; }
std::atomic<bool> g_rawUploadArmed{false}, g_rawUploadWait{false};
} // namespace

void registerCudaStages(const CudaStageTable& t) {
    auto& dst = table();
    if (t.background) dst.background = t.background;
    if (t.detection) dst.detection = t.detection;
    if (t.psf) dst.psf = t.psf;
    if (t.aperture) dst.aperture = t.aperture;
    if (t.apertureMap) dst.apertureMap = t.apertureMap;
    if (t.crossmatch) dst.crossmatch = t.crossmatch;
    if (t.prepare) dst.prepare = t.prepare;
    if (t.prepareFrame) dst.prepareFrame = t.prepareFrame;
    if (t.cosmicRays) dst.cosmicRays = t.cosmicRays;
    if (t.saltPepper) dst.saltPepper = t.saltPepper;
    if (t.cfaSuperPixels) dst.cfaSuperPixels = t.cfaSuperPixels;
    if (t.createDeviceState) dst.createDeviceState = t.createDeviceState;
    if (t.useDevice) dst.useDevice = t.useDevice;
    if (t.createRawUpload) dst.createRawUpload = t.createRawUpload;
    if (t.adoptRawUpload) dst.adoptRawUpload = t.adoptRawUpload;
    if (t.settleRawUpload) dst.settleRawUpload = t.settleRawUpload;
    if (t.prepareRawUpload) dst.prepareRawUpload = t.prepareRawUpload;
    if (t.reservePinned) dst.reservePinned = t.reservePinned;
}

const CudaStageTable& cudaStages() { return table(); }

namespace {
// The warm-up threads still running their preparation after handing over the device state: joined at exit
// by a handler registered once the CUDA runtime is up (so it runs before the runtime's own teardown).
struct WarmUpThreads {
    std::mutex mu;
    std::vector<std::future<void>> running;
    void add(std::future<void> f) {
        std::lock_guard lock(mu);
        std::erase_if(running, [](const std::future<void>& r) {
            return r.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
        });
        running.push_back(std::move(f));
    }
    void joinAll() {
        std::lock_guard lock(mu);
        for (auto& r : running)
            if (r.valid()) r.wait();
    }
};
WarmUpThreads& warmUpThreads() {
    static WarmUpThreads w;
    return w;
}
// The first frame's preparation ended (noteFramePrepared), or the process is ending: the warm-up pins its
// reserve only then, since pinning beside the preparation's copies slows them as much as it saves later.
struct FramePrepared {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false, ending = false;
    void note(bool atExit) {
        {
            std::lock_guard lock(mu);
            (atExit ? ending : done) = true;
        }
        cv.notify_all();
    }
    // True once a frame is prepared; false when the process ends first or none comes within 10 s.
    bool wait() {
        std::unique_lock lock(mu);
        cv.wait_for(lock, std::chrono::seconds(10), [this] { return done || ending; });
        return done && !ending;
    }
};
FramePrepared& framePrepared() {
    static FramePrepared p;
    return p;
}
void joinWarmUpsAtExit() {
    static std::once_flag once;
    std::call_once(once, [] {
        std::atexit([] {
            framePrepared().note(true);
            warmUpThreads().joinAll();
        });
    });
}
} // namespace

void startDeviceWarmUp(RunContext& ctx) {
    const auto create = table().createDeviceState;
    if (ctx.backend != Backend::Cuda || !create || ctx.deviceState || ctx.deviceStateWarmUp.valid()) return;
    const std::size_t limit = ctx.gpuMemLimit;
    const int device = ctx.device;
    armRawUpload(ctx.tuning.rawUpload);
    setRawUploadWait(ctx.tuning.rawUploadWait);
    const auto prepare = rawUploadEnabled() ? table().prepareRawUpload : nullptr;
    const auto reserve = table().reservePinned;
    const int reserveMiB = ctx.tuning.pinnedReserveMiB;
    auto state = std::make_shared<std::promise<std::shared_ptr<void>>>();
    ctx.deviceStateWarmUp = state->get_future().share();
    WarmUpThreads& threads = warmUpThreads();
    threads.add(std::async(std::launch::async, [create, prepare, reserve, reserveMiB, limit, device, state] {
        try {
            timelineMark("device warm-up: creating the device state");
            state->set_value(create(limit, device));
            timelineMark("device warm-up: device state ready");
        } catch (...) {
            state->set_exception(std::current_exception());
            return;
        }
        joinWarmUpsAtExit();
        if (prepare) prepare(limit); // off the first frame's critical path: the stages have the context
        timelineMark("device warm-up: raw upload prepared");
        if (reserve && reserveMiB != 0 && framePrepared().wait()) reserve(reserveMiB);
    }));
}

void useContextDevice(const RunContext& ctx) {
    if (ctx.backend == Backend::Cuda && ctx.device >= 0 && table().useDevice) table().useDevice(ctx.device);
}

void noteFramePrepared() {
    framePrepared().note(false);
}

void armRawUpload(bool on) { g_rawUploadArmed = on; }

bool rawUploadEnabled() { return g_rawUploadArmed && table().createRawUpload && table().adoptRawUpload; }

void setRawUploadWait(bool wait) { g_rawUploadWait = wait; }
bool rawUploadWaits() { return g_rawUploadWait; }

std::shared_ptr<RawChunkSink> createRawUpload() {
    return rawUploadEnabled() ? table().createRawUpload() : nullptr;
}

bool adoptRawUpload(std::shared_ptr<RawChunkSink>& upload, const ImageView& pixels, const MaskView& mask,
                    bool withMask, RunContext& ctx) {
    const std::shared_ptr<RawChunkSink> u = std::move(upload);
    upload.reset();
    if (!u || !useCuda(ctx) || !table().adoptRawUpload) return false;
    return table().adoptRawUpload(*u, pixels, mask, withMask, ctx);
}

void settleRawUpload(RunContext& ctx, bool pixelsChanged, bool maskChanged) {
    if ((pixelsChanged || maskChanged) && useCuda(ctx) && ctx.deviceState && table().settleRawUpload)
        table().settleRawUpload(pixelsChanged, maskChanged, ctx);
}

} // namespace gpuphot
