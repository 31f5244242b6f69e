// DeviceContext: stream, stream-ordered pool with budget and high-water mark, frame and background cache.
#include "kernels/device_context.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

#include "core/pipeline/run_context.hpp"

namespace gpuphot::cuda {
namespace {

// FNV-1a over the bytes of up to ~4096 elements spread over the image (plus its corners): a cheap guard
// against a new frame that happens to reuse a freed frame's address.
template <class T> std::uint64_t fingerprint(const ImageViewT<T>& v) {
    std::uint64_t h = 1469598103934665603ull;
    auto mix = [&h](const void* p, std::size_t n) {
        const auto* b = static_cast<const unsigned char*>(p);
        for (std::size_t i = 0; i < n; ++i) {
            h ^= b[i];
            h *= 1099511628211ull;
        }
    };
    if (v.empty()) return h;
    const int sy = std::max(1, v.height / 64), sx = std::max(1, v.width / 64);
    for (int y = 0; y < v.height; y += sy)
        for (int x = (y * 7) % sx; x < v.width; x += sx)
            mix(&v(x, y), sizeof(T));
    mix(&v(v.width - 1, v.height - 1), sizeof(T));
    mix(&v(0, v.height - 1), sizeof(T));
    mix(&v(v.width - 1, 0), sizeof(T));
    return h;
}

struct ViewKey {
    const void* ptr = nullptr;
    int width = 0, height = 0;
    std::ptrdiff_t stride = 0;
    std::uint64_t generation = 0;
    std::uint64_t print = 0;
    bool operator==(const ViewKey&) const = default;
};

template <class T> ViewKey keyOf(const ImageViewT<T>& v, std::uint64_t generation) {
    return {v.data, v.width, v.height, v.stride, generation, fingerprint(v)};
}

template <class T> void uploadView(DeviceBuffer<T>& dst, const ImageViewT<T>& v, cudaStream_t s) {
    if (v.stride == v.width) {
        dst.upload(v.data, static_cast<std::size_t>(v.width) * v.height);
    } else {
        GPUPHOT_CUDA_CHECK(cudaMemcpy2DAsync(dst.get(), sizeof(T) * v.width, v.data, sizeof(T) * v.stride,
                                             sizeof(T) * v.width, v.height, cudaMemcpyHostToDevice, s));
    }
}

std::size_t freeBytes() {
    std::size_t f = 0, t = 0;
    GPUPHOT_CUDA_CHECK(cudaMemGetInfo(&f, &t));
    return f;
}

} // namespace

struct DeviceContext::Impl {
    ViewKey pixelsKey, maskKey;
    DeviceBuffer<float> pixels;
    DeviceBuffer<std::uint8_t> mask;
    ViewKey levelKey, rmsKey;
    DeviceBuffer<float> level, rms;
    std::vector<PinnedBuffer<unsigned char>> pinned;
    std::size_t defaultBudget = 0;
    std::map<std::string, std::shared_ptr<void>> stageState;
};

DeviceContext::DeviceContext(std::size_t budget) : m_budget(budget), m_impl(std::make_unique<Impl>()) {
    GPUPHOT_CUDA_CHECK(cudaGetDevice(&m_device));
    GPUPHOT_CUDA_CHECK(cudaStreamCreateWithFlags(&m_stream, cudaStreamNonBlocking));
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = m_device;
    GPUPHOT_CUDA_CHECK(cudaMemPoolCreate(&m_pool, &props));
    // Keep freed memory in the pool: later stages and runs reuse it without returning to the driver.
    std::uint64_t threshold = ~0ull;
    GPUPHOT_CUDA_CHECK(cudaMemPoolSetAttribute(m_pool, cudaMemPoolAttrReleaseThreshold, &threshold));
    if (const char* env = std::getenv("GPUPHOT_CUDA_BLOCK")) m_blockSize = std::atoi(env);
    if (const char* env = std::getenv("GPUPHOT_CUDA_FAIL_ALLOC")) {
        const long long n = std::atoll(env);
        m_failAfter = n > 0 ? static_cast<std::size_t>(n) : 0;
    }
    m_impl->defaultBudget = freeBytes();
    if (m_budget == 0) m_budget = m_impl->defaultBudget;
}

DeviceContext::~DeviceContext() {
    m_impl.reset(); // cached buffers go back to the pool first
    if (m_stream) cudaStreamSynchronize(m_stream);
    if (m_pool) cudaMemPoolDestroy(m_pool);
    if (m_stream) cudaStreamDestroy(m_stream);
}

DeviceContext& DeviceContext::of(RunContext& ctx) {
    if (!ctx.deviceState) {
        auto dc = std::make_shared<DeviceContext>(ctx.gpuMemLimit);
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
    dc.m_budget = ctx.gpuMemLimit > 0 ? ctx.gpuMemLimit : dc.m_impl->defaultBudget;
    return dc;
}

void* DeviceContext::allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    ++m_allocations;
    if (m_failAfter > 0 && --m_failAfter == 0)
        throw DeviceOutOfMemory("CUDA backend: injected allocation failure (" + std::to_string(bytes) +
                                " bytes, allocation " + std::to_string(m_allocations) + ")");
    if (m_inUse + bytes > m_budget)
        throw DeviceOutOfMemory("CUDA backend: allocating " + std::to_string(bytes) + " bytes with " +
                                std::to_string(m_inUse) + " in use exceeds the GPU memory budget of " +
                                std::to_string(m_budget) + " bytes (--gpu-mem-limit)");
    void* p = nullptr;
    const cudaError_t e = cudaMallocFromPoolAsync(&p, bytes, m_pool, m_stream);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        throw DeviceOutOfMemory("CUDA backend: the device is out of memory allocating " +
                                std::to_string(bytes) + " bytes (" + std::to_string(m_inUse) +
                                " bytes in use by this context)");
    }
    GPUPHOT_CUDA_CHECK(e);
    m_inUse += bytes;
    if (m_inUse > m_highWater) m_highWater = m_inUse;
    return p;
}

void DeviceContext::release(void* p, std::size_t bytes) noexcept {
    if (!p) return;
    cudaFreeAsync(p, m_stream);
    m_inUse -= bytes;
}

DeviceContext::DeviceFrame DeviceContext::frame(const ImageView& image, const MaskView& mask) {
    Impl& s = *m_impl;
    const std::size_t n = static_cast<std::size_t>(image.width) * image.height;
    const ViewKey pk = keyOf(image, m_generation);
    if (!(pk == s.pixelsKey) || s.pixels.size() != n) {
        s.pixelsKey = {};
        s.pixels.reset();
        s.mask.reset();
        s.maskKey = {};
        s.pixels = DeviceBuffer<float>(*this, n);
        uploadView(s.pixels, image, m_stream);
        s.pixelsKey = pk;
        ++m_uploads;
    }
    if (mask.empty()) {
        s.mask.reset();
        s.maskKey = {};
    } else {
        const ViewKey mk = keyOf(mask, m_generation);
        if (!(mk == s.maskKey) || s.mask.size() != n) {
            s.maskKey = {};
            s.mask.reset();
            s.mask = DeviceBuffer<std::uint8_t>(*this, n);
            uploadView(s.mask, mask, m_stream);
            s.maskKey = mk;
        }
    }
    return {s.pixels.get(), mask.empty() ? nullptr : s.mask.get(), image.width, image.height};
}

void DeviceContext::adoptFrame(const ImageView& image, const MaskView& mask, DeviceBuffer<float>&& pixels,
                               DeviceBuffer<std::uint8_t>&& maskBuffer) {
    Impl& s = *m_impl;
    s.pixels = std::move(pixels);
    s.pixelsKey = keyOf(image, m_generation);
    if (mask.empty()) {
        s.mask.reset();
        s.maskKey = {};
    } else {
        s.mask = std::move(maskBuffer);
        s.maskKey = keyOf(mask, m_generation);
    }
}

std::shared_ptr<void>& DeviceContext::stageState(const std::string& name) { return m_impl->stageState[name]; }

void DeviceContext::storeBackground(const Image<float>& level, const Image<float>& rms,
                                    DeviceBuffer<float>&& dLevel, DeviceBuffer<float>&& dRms) {
    Impl& s = *m_impl;
    s.level = std::move(dLevel);
    s.rms = std::move(dRms);
    s.levelKey = keyOf(level.view(), 0);
    s.rmsKey = keyOf(rms.view(), 0);
}

std::pair<const float*, const float*> DeviceContext::background(const Image<float>& level,
                                                                const Image<float>& rms) {
    Impl& s = *m_impl;
    const std::size_t n = static_cast<std::size_t>(level.width()) * level.height();
    const ViewKey lk = keyOf(level.view(), 0), rk = keyOf(rms.view(), 0);
    if (!(lk == s.levelKey) || s.level.size() != n) {
        s.levelKey = {};
        s.level.reset();
        s.level = DeviceBuffer<float>(*this, n);
        s.level.upload(level.data(), n);
        s.levelKey = lk;
    }
    if (!(rk == s.rmsKey) || s.rms.size() != n) {
        s.rmsKey = {};
        s.rms.reset();
        s.rms = DeviceBuffer<float>(*this, n);
        s.rms.upload(rms.data(), n);
        s.rmsKey = rk;
    }
    return {s.level.get(), s.rms.get()};
}

std::size_t DeviceContext::cachedFrameBytes() const { return m_impl->pixels.bytes() + m_impl->mask.bytes(); }

std::size_t DeviceContext::cachedBackgroundBytes() const { return m_impl->level.bytes() + m_impl->rms.bytes(); }

void DeviceContext::dropFrame() {
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
}

void* DeviceContext::pinned(int slot, std::size_t bytes) {
    auto& v = m_impl->pinned;
    if (static_cast<int>(v.size()) <= slot) v.resize(slot + 1);
    if (v[slot].size() < bytes) {
        v[slot] = PinnedBuffer<unsigned char>(); // free first
        v[slot] = PinnedBuffer<unsigned char>(bytes);
    }
    return v[slot].get();
}

} // namespace gpuphot::cuda
