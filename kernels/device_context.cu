// DeviceContext: stream, stream-ordered pool with budget and high-water mark, frame and background cache.
#include "kernels/device_context.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "core/pipeline/run_context.hpp"
#include "kernels/frame_upload.hpp"
#include "kernels/host_copy.hpp"

namespace gpuphot::cuda {
namespace {

template <class T>
void uploadView(DeviceContext& dc, DeviceBuffer<T>& dst, const ImageViewT<T>& v, cudaStream_t s) {
    if (v.stride == v.width) {
        dc.uploadStaged(dst.get(), v.data, sizeof(T) * static_cast<std::size_t>(v.width) * v.height);
    } else {
        GPUPHOT_CUDA_CHECK(cudaMemcpy2DAsync(dst.get(), sizeof(T) * v.width, v.data, sizeof(T) * v.stride,
                                             sizeof(T) * v.width, v.height, cudaMemcpyHostToDevice, s));
    }
}

// The read phase's raw upload registers with this unit, which the stage table always links.
[[maybe_unused]] const bool frameUploadRegistered = (registerFrameUpload(), true);

std::size_t freeBytes() {
    std::size_t f = 0, t = 0;
    GPUPHOT_CUDA_CHECK(cudaMemGetInfo(&f, &t));
    return f;
}

} // namespace

// Per device: the live contexts and the memory held outside them (reserveOutside). Never freed (a context
// may be destroyed during static destruction).
struct DeviceLedger {
    std::mutex mu;
    std::atomic<std::size_t> outside{0};
    std::vector<DeviceContext*> contexts;
};
using Ledger = DeviceLedger;

namespace {
Ledger& ledger(int device) {
    static std::mutex mu;
    static std::map<int, Ledger*> all;
    std::lock_guard lock(mu);
    Ledger*& l = all[device];
    if (!l) l = new Ledger;
    return *l;
}
} // namespace

cudaMemPool_t createDevicePool(int device, std::uint64_t releaseThreshold) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t pool = nullptr;
    GPUPHOT_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
    const cudaError_t e = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &releaseThreshold);
    if (e != cudaSuccess) {
        cudaMemPoolDestroy(pool);
        GPUPHOT_CUDA_CHECK(e);
    }
    return pool;
}

bool reserveOutside(int device, std::size_t bytes) {
    if (bytes == 0) return true;
    Ledger& l = ledger(device);
    std::lock_guard lock(l.mu);
    const std::size_t held = l.outside.load() + bytes;
    for (const DeviceContext* dc : l.contexts)
        if (dc->m_inUse + held > dc->m_budget) return false;
    l.outside = held;
    for (DeviceContext* dc : l.contexts)
        if (dc->m_inUse + held > dc->m_highWater) dc->m_highWater = dc->m_inUse + held;
    return true;
}

void releaseOutside(int device, std::size_t bytes) noexcept {
    if (bytes == 0) return;
    Ledger& l = ledger(device);
    std::lock_guard lock(l.mu);
    l.outside -= std::min(bytes, l.outside.load());
}

std::size_t heldOutside(int device) { return ledger(device).outside.load(); }

bool explicitBudgetOn(int device) {
    Ledger& l = ledger(device);
    std::lock_guard lock(l.mu);
    for (const DeviceContext* dc : l.contexts)
        if (dc->m_explicitBudget) return true;
    return false;
}

template <class T> ViewKey viewKey(const ImageViewT<T>& v, std::uint64_t generation) {
    std::uint64_t h = 1469598103934665603ull;
    auto mix = [&h](const void* p, std::size_t n) {
        const auto* b = static_cast<const unsigned char*>(p);
        for (std::size_t i = 0; i < n; ++i) {
            h ^= b[i];
            h *= 1099511628211ull;
        }
    };
    if (!v.empty()) {
        const int sy = std::max(1, v.height / 64), sx = std::max(1, v.width / 64);
        for (int y = 0; y < v.height; y += sy)
            for (int x = (y * 7) % sx; x < v.width; x += sx)
                mix(&v(x, y), sizeof(T));
        mix(&v(v.width - 1, v.height - 1), sizeof(T));
        mix(&v(0, v.height - 1), sizeof(T));
        mix(&v(v.width - 1, 0), sizeof(T));
    }
    return {v.data, v.width, v.height, v.stride, generation, h, v.serial};
}
template ViewKey viewKey<float>(const ImageViewT<float>&, std::uint64_t);
template ViewKey viewKey<std::uint8_t>(const ImageViewT<std::uint8_t>&, std::uint64_t);
template ViewKey viewKey<std::int32_t>(const ImageViewT<std::int32_t>&, std::uint64_t);

struct DeviceContext::Impl {
    ViewKey pixelsKey, maskKey;
    DeviceBuffer<float> pixels;
    DeviceBuffer<std::uint8_t> mask;
    ViewKey levelKey, rmsKey;
    std::vector<std::uint8_t> gridSignature; // maps kept on the device only (empty: keyed by host maps)
    DeviceBuffer<float> level, rms;
    std::vector<PinnedBuffer<unsigned char>> pinned;
    PinnedBuffer<unsigned char> staging[2];
    cudaEvent_t stagingDone[2] = {nullptr, nullptr};
    std::size_t defaultBudget = 0;
    std::map<std::string, std::shared_ptr<void>> stageState;
};

DeviceContext::DeviceContext(std::size_t budget) : m_budget(budget), m_impl(std::make_unique<Impl>()) {
    GPUPHOT_CUDA_CHECK(cudaGetDevice(&m_device));
    GPUPHOT_CUDA_CHECK(cudaStreamCreateWithFlags(&m_stream, cudaStreamNonBlocking));
    // Keep freed memory in the pool: later stages and runs reuse it without returning to the driver.
    m_pool = createDevicePool(m_device, ~0ull);
    m_impl->defaultBudget = freeBytes();
    m_explicitBudget = m_budget > 0;
    if (m_budget == 0) m_budget = m_impl->defaultBudget;
    Ledger& l = ledger(m_device);
    {
        std::lock_guard lock(l.mu);
        l.contexts.push_back(this);
        m_highWater = l.outside.load();
    }
    m_ledger = &l;
    noteDeviceReady();
}

DeviceContext::~DeviceContext() {
    if (Ledger* l = m_ledger) {
        std::lock_guard lock(l->mu);
        l->contexts.erase(std::remove(l->contexts.begin(), l->contexts.end(), this), l->contexts.end());
    }
    if (m_stream) cudaStreamSynchronize(m_stream);
    for (cudaEvent_t& e : m_impl->stagingDone)
        if (e) cudaEventDestroy(e);
    m_impl.reset(); // cached buffers go back to the pool first
    if (m_stream) cudaStreamSynchronize(m_stream);
    if (m_pool) cudaMemPoolDestroy(m_pool);
    if (m_stream) cudaStreamDestroy(m_stream);
}

std::shared_ptr<void> createDeviceState(std::size_t gpuMemLimit) {
    return std::make_shared<DeviceContext>(gpuMemLimit);
}

DeviceContext& DeviceContext::of(RunContext& ctx) {
    if (!ctx.deviceState) {
        std::shared_ptr<DeviceContext> dc;
        if (ctx.deviceStateWarmUp.valid()) { // created on another thread while the frame was read
            const auto warm = std::move(ctx.deviceStateWarmUp);
            ctx.deviceStateWarmUp = {};
            dc = std::static_pointer_cast<DeviceContext>(warm.get()); // rethrows the creation's error
        }
        if (!dc) dc = std::make_shared<DeviceContext>(ctx.gpuMemLimit);
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
    {
        std::lock_guard lock(dc.m_ledger->mu);
        dc.m_budget = ctx.gpuMemLimit > 0 ? ctx.gpuMemLimit : dc.m_impl->defaultBudget;
        dc.m_explicitBudget = ctx.gpuMemLimit > 0;
    }
    return dc;
}

void DeviceContext::setBudget(std::size_t bytes) {
    std::lock_guard lock(m_ledger->mu);
    m_budget = bytes;
    m_explicitBudget = true;
}

void DeviceContext::resetHighWater() {
    std::lock_guard lock(m_ledger->mu);
    m_highWater = m_inUse + m_ledger->outside.load();
}

std::size_t DeviceContext::available() const {
    const std::size_t used = m_inUse + m_ledger->outside.load();
    return m_budget > used ? m_budget - used : 0;
}

bool DeviceContext::takeOver(std::size_t bytes) {
    Ledger& l = *m_ledger;
    std::lock_guard lock(l.mu);
    const std::size_t used = m_inUse + l.outside.load() + bytes;
    if (used > m_budget) return false;
    m_inUse += bytes;
    if (used > m_highWater) m_highWater = used;
    return true;
}

bool DeviceContext::takeOverOutside(std::size_t bytes) {
    Ledger& l = *m_ledger;
    std::lock_guard lock(l.mu);
    const std::size_t outside = l.outside.load(), moved = std::min(bytes, outside);
    if (m_inUse + bytes + (outside - moved) > m_budget) return false;
    l.outside = outside - moved;
    m_inUse += bytes;
    if (m_inUse + l.outside.load() > m_highWater) m_highWater = m_inUse + l.outside.load();
    return true;
}

void* DeviceContext::allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    ++m_allocations;
    if (m_failAfter > 0 && --m_failAfter == 0)
        throw DeviceOutOfMemory("CUDA backend: injected allocation failure (" + std::to_string(bytes) +
                                " bytes, allocation " + std::to_string(m_allocations) + ")");
    Ledger& l = *m_ledger;
    {
        // Counted first (under the ledger's lock), so that a concurrent reserveOutside sees it.
        std::lock_guard lock(l.mu);
        const std::size_t outside = l.outside.load(), used = m_inUse + outside + bytes;
        if (used > m_budget)
            throw DeviceOutOfMemory("CUDA backend: allocating " + std::to_string(bytes) + " bytes with " +
                                    std::to_string(m_inUse) + " in use" +
                                    (outside ? " (and " + std::to_string(outside) + " held by the raw upload)"
                                             : std::string()) +
                                    " exceeds the GPU memory budget of " + std::to_string(m_budget) +
                                    " bytes (--gpu-mem-limit)");
        m_inUse += bytes;
        if (used > m_highWater) m_highWater = used;
    }
    void* p = nullptr;
    const cudaError_t e = cudaMallocFromPoolAsync(&p, bytes, m_pool, m_stream);
    if (e != cudaSuccess) {
        {
            std::lock_guard lock(l.mu);
            m_inUse -= bytes;
        }
        if (e == cudaErrorMemoryAllocation) {
            cudaGetLastError();
            throw DeviceOutOfMemory("CUDA backend: the device is out of memory allocating " +
                                    std::to_string(bytes) + " bytes (" + std::to_string(m_inUse) +
                                    " bytes in use by this context)");
        }
        GPUPHOT_CUDA_CHECK(e);
    }
    return p;
}

void DeviceContext::release(void* p, std::size_t bytes) noexcept {
    if (!p) return;
    cudaFreeAsync(p, m_stream);
    std::lock_guard lock(m_ledger->mu);
    m_inUse -= bytes;
}

DeviceContext::DeviceFrame DeviceContext::frame(const ImageView& image, const MaskView& mask) {
    Impl& s = *m_impl;
    const std::size_t n = static_cast<std::size_t>(image.width) * image.height;
    const ViewKey pk = viewKey(image, m_generation);
    if (!(pk == s.pixelsKey) || s.pixels.size() != n) {
        m_readFrame = false;
        s.pixelsKey = {};
        s.pixels.reset();
        s.mask.reset();
        s.maskKey = {};
        s.pixels = DeviceBuffer<float>(*this, n);
        uploadView(*this, s.pixels, image, m_stream);
        s.pixelsKey = pk;
        ++m_uploads;
    }
    if (mask.empty()) {
        s.mask.reset();
        s.maskKey = {};
    } else {
        const ViewKey mk = viewKey(mask, m_generation);
        if (!(mk == s.maskKey) || s.mask.size() != n) {
            m_readFrame = false;
            s.maskKey = {};
            s.mask.reset();
            s.mask = DeviceBuffer<std::uint8_t>(*this, n);
            uploadView(*this, s.mask, mask, m_stream);
            s.maskKey = mk;
        }
    }
    return {s.pixels.get(), mask.empty() ? nullptr : s.mask.get(), image.width, image.height};
}

void DeviceContext::adoptFrame(const ImageView& image, const MaskView& mask, DeviceBuffer<float>&& pixels,
                               DeviceBuffer<std::uint8_t>&& maskBuffer) {
    Impl& s = *m_impl;
    m_readFrame = false;
    s.pixels = std::move(pixels);
    s.pixelsKey = viewKey(image, m_generation);
    if (mask.empty()) {
        s.mask.reset();
        s.maskKey = {};
    } else {
        s.mask = std::move(maskBuffer);
        s.maskKey = viewKey(mask, m_generation);
    }
}

std::pair<DeviceBuffer<float>, DeviceBuffer<std::uint8_t>> DeviceContext::takeFrame(const ImageView& image,
                                                                                     const MaskView& mask) {
    frame(image, mask);
    Impl& s = *m_impl;
    std::pair<DeviceBuffer<float>, DeviceBuffer<std::uint8_t>> out(std::move(s.pixels), std::move(s.mask));
    s.pixelsKey = {};
    s.maskKey = {};
    return out;
}

std::shared_ptr<void>& DeviceContext::stageState(const std::string& name) { return m_impl->stageState[name]; }

void DeviceContext::storeBackground(const Image<float>& level, const Image<float>& rms,
                                    DeviceBuffer<float>&& dLevel, DeviceBuffer<float>&& dRms) {
    Impl& s = *m_impl;
    s.level = std::move(dLevel);
    s.rms = std::move(dRms);
    s.levelKey = viewKey(level.view(), 0);
    s.rmsKey = viewKey(rms.view(), 0);
    s.gridSignature.clear();
}

void DeviceContext::storeBackground(std::vector<std::uint8_t> signature, DeviceBuffer<float>&& dLevel,
                                    DeviceBuffer<float>&& dRms) {
    Impl& s = *m_impl;
    s.level = std::move(dLevel);
    s.rms = std::move(dRms);
    s.levelKey = {};
    s.rmsKey = {};
    s.gridSignature = std::move(signature);
}

std::pair<const float*, const float*>
DeviceContext::findBackground(const std::vector<std::uint8_t>& signature) const {
    const Impl& s = *m_impl;
    if (signature.empty() || s.gridSignature != signature || !s.level.get() || !s.rms.get())
        return {nullptr, nullptr};
    return {s.level.get(), s.rms.get()};
}

std::pair<const float*, const float*> DeviceContext::background(const Image<float>& level,
                                                                const Image<float>& rms) {
    Impl& s = *m_impl;
    const std::size_t n = static_cast<std::size_t>(level.width()) * level.height();
    const ViewKey lk = viewKey(level.view(), 0), rk = viewKey(rms.view(), 0);
    if (!(lk == s.levelKey) || s.level.size() != n || !s.gridSignature.empty()) {
        s.gridSignature.clear();
        s.rmsKey = {};
        s.rms.reset();
        s.levelKey = {};
        s.level.reset();
        s.level = DeviceBuffer<float>(*this, n);
        uploadStaged(s.level.get(), level.data(), n * sizeof(float));
        s.levelKey = lk;
    }
    if (!(rk == s.rmsKey) || s.rms.size() != n) {
        s.rmsKey = {};
        s.rms.reset();
        s.rms = DeviceBuffer<float>(*this, n);
        uploadStaged(s.rms.get(), rms.data(), n * sizeof(float));
        s.rmsKey = rk;
    }
    return {s.level.get(), s.rms.get()};
}

std::size_t DeviceContext::cachedFrameBytes() const { return m_impl->pixels.bytes() + m_impl->mask.bytes(); }

std::size_t DeviceContext::cachedBackgroundBytes() const { return m_impl->level.bytes() + m_impl->rms.bytes(); }

void DeviceContext::settleReadFrame(bool pixelsChanged, bool maskChanged) {
    if (!m_readFrame) return;
    if (pixelsChanged) {
        dropFrame();
    } else if (maskChanged) {
        m_impl->mask.reset();
        m_impl->maskKey = {};
    }
}

void DeviceContext::dropFrame() {
    m_readFrame = false;
    m_impl->pixels.reset();
    m_impl->mask.reset();
    m_impl->pixelsKey = {};
    m_impl->maskKey = {};
}

void DeviceContext::dropBackground() {
    m_impl->level.reset();
    m_impl->rms.reset();
    m_impl->levelKey = {};
    m_impl->rmsKey = {};
    m_impl->gridSignature.clear();
}

// The two staging buffers (of the current chunk size) and their events.
void DeviceContext::prepareStaging() {
    Impl& s = *m_impl;
    for (int b = 0; b < 2; ++b) {
        if (s.staging[b].size() < m_stagingChunk) {
            if (s.stagingDone[b]) GPUPHOT_CUDA_CHECK(cudaEventSynchronize(s.stagingDone[b]));
            s.staging[b] = PinnedBuffer<unsigned char>();
            s.staging[b] = PinnedBuffer<unsigned char>(m_stagingChunk);
        }
        if (!s.stagingDone[b])
            GPUPHOT_CUDA_CHECK(cudaEventCreateWithFlags(&s.stagingDone[b], cudaEventDisableTiming));
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
    Impl& s = *m_impl;
    prepareStaging();
    const auto* src = static_cast<const unsigned char*>(host);
    auto* dst = static_cast<unsigned char*>(device);
    for (std::size_t off = 0, k = 0; off < bytes; off += m_stagingChunk, ++k) {
        const int b = static_cast<int>(k % 2);
        const std::size_t n = std::min(m_stagingChunk, bytes - off);
        GPUPHOT_CUDA_CHECK(cudaEventSynchronize(s.stagingDone[b])); // its previous copy is done
        parallelCopy(s.staging[b].get(), src + off, n);
        GPUPHOT_CUDA_CHECK(
            cudaMemcpyAsync(dst + off, s.staging[b].get(), n, cudaMemcpyHostToDevice, m_stream));
        GPUPHOT_CUDA_CHECK(cudaEventRecord(s.stagingDone[b], m_stream));
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
    Impl& s = *m_impl;
    prepareStaging();
    unsigned char* const staging[2] = {s.staging[0].get(), s.staging[1].get()};
    downloadThroughStaging(host, device, bytes, m_stagingChunk, m_stream, staging, s.stagingDone);
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

void* DeviceContext::pinned(int slot, std::size_t bytes) {
    auto& v = m_impl->pinned;
    if (static_cast<int>(v.size()) <= slot) v.resize(slot + 1);
    if (v[slot].size() < bytes) {
        // Half as much again (at most 32 MiB more): pinning costs milliseconds per slot, and the workbench's
        // next frame or re-run at a lower threshold needs a little more (at 151 MP the first re-run that
        // grew every detection slot at its exact size paid ~30 ms).
        const std::size_t room = bytes + std::min<std::size_t>(bytes / 2, std::size_t{32} << 20);
        v[slot] = PinnedBuffer<unsigned char>(); // free first
        v[slot] = PinnedBuffer<unsigned char>(room);
    }
    return v[slot].get();
}

} // namespace gpuphot::cuda
