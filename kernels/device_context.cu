// DeviceContext: the stream, the memory policy's layers, the frame cache, the stages' scratch, staging.
#include "kernels/device_context.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/pipeline/run_context.hpp"
#include "kernels/frame_cache.hpp"
#include "kernels/frame_upload.hpp"
#include "kernels/host_copy.hpp"

namespace gpuphot::cuda {
namespace {

// The read phase's raw upload registers with this unit, which the stage table always links.
[[maybe_unused]] const bool frameUploadRegistered = (registerFrameUpload(), true);

std::size_t freeBytes() {
    std::size_t f = 0, t = 0;
    GPUPHOT_CUDA_CHECK(cudaMemGetInfo(&f, &t));
    return f;
}

} // namespace

DeviceContext::DeviceContext(std::size_t budget) {
    GPUPHOT_CUDA_CHECK(cudaGetDevice(&m_device));
    GPUPHOT_CUDA_CHECK(cudaStreamCreateWithFlags(&m_stream, cudaStreamNonBlocking));
    m_pool = std::make_unique<PoolResource>(m_device, m_stream);
    m_defaultBudget = freeBytes();
    m_budget =
        std::make_unique<BudgetAdaptor>(*m_pool, m_device, budget > 0 ? budget : m_defaultBudget, budget > 0);
    m_counting = std::make_unique<CountingAdaptor>(*m_budget);
    m_frames = std::make_unique<FrameCache>(*this);
    noteDeviceReady();
}

// Teardown in dependency order: the budget leaves the device's ledger, the queued work ends, then the
// stages' scratch, the staging buffers and the frame cache give their memory back (to the pool, stream-
// ordered) before the pool and the stream go.
DeviceContext::~DeviceContext() {
    m_budget->detach();
    if (m_stream) cudaStreamSynchronize(m_stream);
    for (cudaEvent_t& e : m_stagingDone)
        if (e) cudaEventDestroy(e);
    m_scratch.clear();
    m_staging[1] = PinnedBuffer<unsigned char>();
    m_staging[0] = PinnedBuffer<unsigned char>();
    m_frames.reset();
    if (m_stream) cudaStreamSynchronize(m_stream);
    m_counting.reset();
    m_budget.reset();
    m_pool.reset();
    if (m_stream) cudaStreamDestroy(m_stream);
}

std::shared_ptr<void> createDeviceState(std::size_t gpuMemLimit, int device) {
    if (device >= 0) GPUPHOT_CUDA_CHECK(cudaSetDevice(device)); // the context takes the current device
    return std::make_shared<DeviceContext>(gpuMemLimit);
}

void useDevice(int device) {
    if (device >= 0 && cudaSetDevice(device) != cudaSuccess) cudaGetLastError();
}

DeviceContext& DeviceContext::of(RunContext& ctx) {
    if (!ctx.deviceState) {
        std::shared_ptr<DeviceContext> dc;
        if (ctx.deviceStateWarmUp.valid()) { // created on another thread while the frame was read
            const auto warm = std::move(ctx.deviceStateWarmUp);
            ctx.deviceStateWarmUp = {};
            dc = std::static_pointer_cast<DeviceContext>(warm.get()); // rethrows the creation's error
        }
        if (!dc) dc = std::static_pointer_cast<DeviceContext>(createDeviceState(ctx.gpuMemLimit, ctx.device));
        if (ctx.tuning.cudaBlock > 0) dc->setBlockSize(ctx.tuning.cudaBlock);
        if (ctx.testHooks.cudaFailAfterAllocs > 0) dc->setFailAfter(ctx.testHooks.cudaFailAfterAllocs);
        std::weak_ptr<DeviceContext> weak = dc;
        ctx.deviceState = dc;
        ctx.deviceCheckpoint = [weak](StageRecord& r) {
            const auto d = weak.lock();
            if (!d) return;
            r.deviceHighWater = d->highWater();
            r.devicePlan = d->planMode();
            r.deviceStrips = d->planStrips();
            r.deviceNote = d->planNote();
            d->clearPlan();
            std::size_t f = 0, t = 0;
            if (cudaMemGetInfo(&f, &t) == cudaSuccess)
                r.deviceFree = f;
            else
                cudaGetLastError();
            d->resetHighWater(); // the next stage's record shows its own peak
        };
    }
    auto& dc = *static_cast<DeviceContext*>(ctx.deviceState.get());
    GPUPHOT_CUDA_CHECK(cudaSetDevice(dc.m_device));
    dc.m_tuning = ctx.tuning;
    dc.m_hooks = ctx.testHooks;
    dc.m_budget->setBudget(ctx.gpuMemLimit > 0 ? ctx.gpuMemLimit : dc.m_defaultBudget, ctx.gpuMemLimit > 0);
    return dc;
}

// ---- the frame cache ------------------------------------------------------------------------------------

FrameCache& DeviceContext::frames() {
    return *m_frames;
}
std::size_t DeviceContext::cachedFrameBytes() const {
    return m_frames->frameBytes();
}
std::size_t DeviceContext::cachedBackgroundBytes() const {
    return m_frames->backgroundBytes();
}
void DeviceContext::dropFrame() {
    m_frames->drop();
}
DeviceFrame DeviceContext::frame(const ImageView& image, const MaskView& mask) {
    return m_frames->frame(image, mask);
}
void DeviceContext::adoptFrame(const ImageView& image, const MaskView& mask, DeviceBuffer<float>&& pixels,
                               DeviceBuffer<std::uint8_t>&& maskBuffer) {
    m_frames->adopt(image, mask, std::move(pixels), std::move(maskBuffer));
}
std::pair<DeviceBuffer<float>, DeviceBuffer<std::uint8_t>> DeviceContext::takeFrame(const ImageView& image,
                                                                                     const MaskView& mask) {
    return m_frames->take(image, mask);
}
void DeviceContext::markReadFrame() {
    m_frames->markRead();
}
bool DeviceContext::holdsReadFrame() const {
    return m_frames->holdsRead();
}
void DeviceContext::settleReadFrame(bool pixelsChanged, bool maskChanged) {
    m_frames->settleRead(pixelsChanged, maskChanged);
}
void DeviceContext::bumpGeneration() {
    m_frames->bumpGeneration();
}
std::uint64_t DeviceContext::uploads() const {
    return m_frames->uploads();
}
void DeviceContext::storeBackground(const Image<float>& level, const Image<float>& rms,
                                    DeviceBuffer<float>&& dLevel, DeviceBuffer<float>&& dRms) {
    m_frames->storeBackground(level, rms, std::move(dLevel), std::move(dRms));
}
std::pair<const float*, const float*> DeviceContext::background(const Image<float>& level,
                                                                const Image<float>& rms) {
    return m_frames->background(level, rms);
}
void DeviceContext::storeBackground(std::vector<std::uint8_t> signature, DeviceBuffer<float>&& dLevel,
                                    DeviceBuffer<float>&& dRms) {
    m_frames->storeBackground(std::move(signature), std::move(dLevel), std::move(dRms));
}
std::pair<const float*, const float*>
DeviceContext::findBackground(const std::vector<std::uint8_t>& signature) const {
    return m_frames->findBackground(signature);
}
void DeviceContext::dropBackground() {
    m_frames->dropBackground();
}

// ---- staging --------------------------------------------------------------------------------------------

// The two staging buffers (of the current chunk size) and their events.
void DeviceContext::prepareStaging() {
    for (int b = 0; b < 2; ++b) {
        if (m_staging[b].size() < m_stagingChunk) {
            if (m_stagingDone[b]) GPUPHOT_CUDA_CHECK(cudaEventSynchronize(m_stagingDone[b]));
            m_staging[b] = PinnedBuffer<unsigned char>();
            m_staging[b] = PinnedBuffer<unsigned char>(m_stagingChunk);
        }
        if (!m_stagingDone[b])
            GPUPHOT_CUDA_CHECK(cudaEventCreateWithFlags(&m_stagingDone[b], cudaEventDisableTiming));
    }
}

// Staging: chunk k goes through buffer k % 2; a buffer is refilled (upload) or read (download) only after
// the event recorded behind its previous copy.
void DeviceContext::uploadStaged(void* device, const void* host, std::size_t bytes) {
    if (bytes == 0) return;
    if (bytes < m_stagingChunk) {
        GPUPHOT_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, m_stream));
        return;
    }
    prepareStaging();
    const auto* src = static_cast<const unsigned char*>(host);
    auto* dst = static_cast<unsigned char*>(device);
    for (std::size_t off = 0, k = 0; off < bytes; off += m_stagingChunk, ++k) {
        const int b = static_cast<int>(k % 2);
        const std::size_t n = std::min(m_stagingChunk, bytes - off);
        GPUPHOT_CUDA_CHECK(cudaEventSynchronize(m_stagingDone[b])); // its previous copy is done
        parallelCopy(m_staging[b].get(), src + off, n);
        GPUPHOT_CUDA_CHECK(
            cudaMemcpyAsync(dst + off, m_staging[b].get(), n, cudaMemcpyHostToDevice, m_stream));
        GPUPHOT_CUDA_CHECK(cudaEventRecord(m_stagingDone[b], m_stream));
    }
    m_stagedBytes += bytes;
}

void DeviceContext::downloadStaged(void* host, const void* device, std::size_t bytes) {
    if (bytes == 0) return;
    if (bytes < m_stagingChunk) {
        GPUPHOT_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, m_stream));
        synchronize();
        return;
    }
    prepareStaging();
    unsigned char* const staging[2] = {m_staging[0].get(), m_staging[1].get()};
    downloadThroughStaging(host, device, bytes, m_stagingChunk, m_stream, staging, m_stagingDone);
    m_stagedBytes += bytes;
}

void downloadThroughStaging(void* host, const void* device, std::size_t bytes, std::size_t chunk,
                            cudaStream_t stream, unsigned char* const staging[2], cudaEvent_t const done[2]) {
    const auto* src = static_cast<const unsigned char*>(device);
    auto* dst = static_cast<unsigned char*>(host);
    const std::size_t chunks = (bytes + chunk - 1) / chunk;
    auto enqueue = [&](std::size_t k) {
        const std::size_t b = k % 2, off = k * chunk, n = std::min(chunk, bytes - off);
        GPUPHOT_CUDA_CHECK(cudaMemcpyAsync(staging[b], src + off, n, cudaMemcpyDeviceToHost, stream));
        GPUPHOT_CUDA_CHECK(cudaEventRecord(done[b], stream));
    };
    enqueue(0);
    if (chunks > 1) enqueue(1);
    for (std::size_t k = 0; k < chunks; ++k) {
        const std::size_t b = k % 2, off = k * chunk, n = std::min(chunk, bytes - off);
        GPUPHOT_CUDA_CHECK(cudaEventSynchronize(done[b]));
        parallelCopy(dst + off, staging[b], n);
        if (k + 2 < chunks) enqueue(k + 2);
    }
}

} // namespace gpuphot::cuda
