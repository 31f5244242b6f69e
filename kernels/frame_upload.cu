// The read phase's raw upload: pinned chunks on a copy stream, converted on the device (frame_upload.hpp).
#include "kernels/frame_upload.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <utility>

#include <omp.h>

#include "core/pipeline/cuda_stages.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/device_context.hpp"

namespace gpuphot::cuda {

namespace {
// Set once a DeviceContext exists (the CUDA context is up): before that, a read does not wait for the
// context's creation (startDeviceWarmUp, ~0.1-0.3 s) but keeps the host path, overlapped with it.
std::atomic<bool> g_deviceReady{false};

// The size and reader count of the latest read that began (prepareRawUpload sizes the pinned buffers for
// it): raw bytes, pixels, readers; 0: none yet.
std::atomic<std::size_t> g_hintRawBytes{0}, g_hintPixels{0};
std::atomic<int> g_hintThreads{0};

// Fault injection and the allocation count (setRawUploadFailAfter).
std::atomic<std::size_t> g_failAfter{0}, g_allocations{0};

constexpr std::size_t kMaxChunk = std::size_t(8) << 20, kMinChunk = std::size_t(64) << 10;

// Counts an allocation of the raw upload; throws DeviceOutOfMemory when it is the injected failure.
void countAllocation(const char* what, std::size_t bytes) {
    ++g_allocations;
    std::size_t n = g_failAfter.load();
    while (n > 0 && !g_failAfter.compare_exchange_weak(n, n - 1)) {
    }
    if (n == 1)
        throw DeviceOutOfMemory(std::string("raw upload: injected allocation failure (") + what + ", " +
                                std::to_string(bytes) + " bytes)");
}

} // namespace

void noteDeviceReady() {
    g_deviceReady = true;
}

void setRawUploadFailAfter(std::size_t n) { g_failAfter = n; }
std::size_t rawUploadFailAfter() { return g_failAfter.load(); }
std::size_t rawUploadAllocations() { return g_allocations.load(); }

std::size_t rawUploadChunkBytes(std::size_t rawBytes, int threads) {
    if (rawBytes == 0) return kMinChunk;
    const std::size_t t = static_cast<std::size_t>(std::max(threads, 1));
    std::size_t chunk = (rawBytes + t - 1) / t;
    chunk = (chunk + kMinChunk - 1) / kMinChunk * kMinChunk;
    return std::min(std::clamp(chunk, kMinChunk, kMaxChunk), rawBytes);
}

// Per device, for the process (never freed: the CUDA runtime may be gone at exit): the copy stream, a memory
// pool, and per reader thread a pinned buffer and an event. `busy` is held by the read that uses them (and
// by prepareRawUpload).
struct RawFrameUpload::Resources {
    std::mutex busy;
    int device = 0;
    cudaStream_t stream = nullptr;
    cudaMemPool_t pool = nullptr;
    cudaEvent_t done = nullptr;
    bool retain = false; // the pool keeps freed memory (no explicit GPU memory limit on the device)
    std::size_t slotBytes = 0;
    std::vector<PinnedBuffer<unsigned char>> pinned;
    std::vector<cudaEvent_t> events;

    explicit Resources(int dev) : device(dev) {
        GPUPHOT_CUDA_CHECK(cudaSetDevice(dev));
        GPUPHOT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        // Release threshold 0 until a read finds no explicit budget on the device (keepFreed): under
        // --gpu-mem-limit a frame freed by the DeviceContext that adopted it goes back to the driver, so
        // that the upload's pool holds nothing beyond what the budgets count.
        pool = createDevicePool(dev, 0);
        GPUPHOT_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    }
    static Resources& of(int dev) {
        static std::mutex mu;
        static std::map<int, Resources*> all;
        std::lock_guard lock(mu);
        Resources*& r = all[dev];
        if (!r) r = new Resources(dev);
        return *r;
    }
    // Without an explicit budget on the device the pool keeps freed memory: the next frame's device memory
    // comes from it without mapping it again (the DeviceContext's pool does the same).
    void keepFreed(bool on) {
        if (on == retain) return;
        std::uint64_t threshold = on ? ~0ull : 0;
        GPUPHOT_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
        retain = on;
    }
    // At least `threads` readers with pinned buffers of `bytes` (the caller holds `busy`; nothing in
    // flight). Checked and counted; a failure keeps the buffers already there.
    void reserve(int threads, std::size_t bytes) {
        if (bytes > slotBytes) {
            pinned.clear();
            slotBytes = bytes;
        }
        while (static_cast<int>(pinned.size()) < threads) {
            countAllocation("pinned reader buffer", slotBytes);
            pinned.emplace_back(slotBytes);
        }
        while (static_cast<int>(events.size()) < threads) {
            cudaEvent_t e = nullptr;
            GPUPHOT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
            events.push_back(e);
        }
    }
    std::size_t pinnedBytes() const { return pinned.size() * slotBytes; }
};

namespace {
// Device memory from the upload's pool, reserved outside the contexts' budgets (reserveOutside) while
// held; freed stream-ordered on the upload's stream. Move-only.
class OutsideBlock {
public:
    OutsideBlock() = default;
    // Throws DeviceOutOfMemory when a context's budget has no room, the device has no memory left, or the
    // failure is injected; nothing is held then.
    OutsideBlock(RawFrameUpload::Resources& r, std::size_t bytes, const char* what) {
        if (bytes == 0) return;
        countAllocation(what, bytes);
        if (!reserveOutside(r.device, bytes))
            throw DeviceOutOfMemory(std::string("raw upload: the ") + what + " (" + bytesText(bytes) +
                                    ") does not fit the GPU memory budget (--gpu-mem-limit)");
        void* p = nullptr;
        const cudaError_t e = cudaMallocFromPoolAsync(&p, bytes, r.pool, r.stream);
        if (e != cudaSuccess) {
            cudaGetLastError();
            releaseOutside(r.device, bytes);
            throw DeviceOutOfMemory(std::string("raw upload: allocating the ") + what + " (" + bytesText(bytes) +
                                    ") failed: " + cudaGetErrorString(e));
        }
        m_res = &r;
        m_ptr = p;
        m_bytes = bytes;
    }
    ~OutsideBlock() { reset(); }
    OutsideBlock(OutsideBlock&& o) noexcept
        : m_res(std::exchange(o.m_res, nullptr)), m_ptr(std::exchange(o.m_ptr, nullptr)),
          m_bytes(std::exchange(o.m_bytes, 0)) {}
    OutsideBlock& operator=(OutsideBlock&& o) noexcept {
        if (this != &o) {
            reset();
            m_res = std::exchange(o.m_res, nullptr);
            m_ptr = std::exchange(o.m_ptr, nullptr);
            m_bytes = std::exchange(o.m_bytes, 0);
        }
        return *this;
    }
    OutsideBlock(const OutsideBlock&) = delete;
    OutsideBlock& operator=(const OutsideBlock&) = delete;

    void reset() noexcept {
        if (!m_ptr) return;
        cudaSetDevice(m_res->device);
        if (cudaFreeAsync(m_ptr, m_res->stream) != cudaSuccess) cudaGetLastError();
        releaseOutside(m_res->device, m_bytes);
        m_ptr = nullptr;
        m_bytes = 0;
    }
    // The memory and its reservation pass to the caller (DeviceContext::takeOverOutside, adopt).
    void* handOver() noexcept {
        m_bytes = 0;
        return std::exchange(m_ptr, nullptr);
    }
    void* get() const { return m_ptr; }

private:
    RawFrameUpload::Resources* m_res = nullptr;
    void* m_ptr = nullptr;
    std::size_t m_bytes = 0;
};
} // namespace

struct RawFrameUpload::Held {
    OutsideBlock pixels, mask, slots; // slots: one chunk per reader
};

namespace {

struct ConvertParams {
    int bitpix = 0;
    bool noScale = true;
    double scale = 1.0, zero = 0.0;
    bool blankFits = false;
    long long blank = 0;
    float under = 0.0f; // IEEE: the value of +-0 and subnormals
    double saturation = 0.0;
    std::uint8_t nullBits = 0, saturatedBits = 0;
};

__device__ __forceinline__ float quietNan() {
    return __int_as_float(0x7fc00000);
}

__device__ __forceinline__ std::uint32_t loadBe32(const unsigned char* p) {
    return (std::uint32_t(p[0]) << 24) | (std::uint32_t(p[1]) << 16) | (std::uint32_t(p[2]) << 8) | p[3];
}

// convertRawPixels (core/io/fits_raw_read.cpp) per pixel, and readFrame's mask of the result.
template <int Bitpix>
__global__ void convertRawKernel(const unsigned char* __restrict__ src, std::size_t n, ConvertParams p,
                                 float* __restrict__ out, std::uint8_t* __restrict__ mask) {
    for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
         i += std::size_t(gridDim.x) * blockDim.x) {
        float v;
        if constexpr (Bitpix > 0) {
            long long iv;
            if constexpr (Bitpix == 8) {
                iv = src[i];
            } else if constexpr (Bitpix == 16) {
                const unsigned char* b = src + 2 * i;
                iv = static_cast<std::int16_t>(static_cast<std::uint16_t>((unsigned(b[0]) << 8) | b[1]));
            } else {
                iv = static_cast<std::int32_t>(loadBe32(src + 4 * i));
            }
            if (p.blankFits && iv == p.blank) {
                v = quietNan();
            } else if (p.noScale) {
                if constexpr (Bitpix == 32)
                    v = static_cast<float>(static_cast<std::int32_t>(iv));
                else
                    v = static_cast<float>(static_cast<int>(iv));
            } else {
                const double d = static_cast<double>(iv) * p.scale; // -fmad=false: two roundings, as the host
                v = static_cast<float>(d + p.zero);
            }
        } else if constexpr (Bitpix == -32) {
            const std::uint32_t u = loadBe32(src + 4 * i), e = u & 0x7F800000u;
            if (e == 0x7F800000u) {
                v = quietNan();
            } else if (e == 0) {
                v = p.under;
            } else {
                const float f = __uint_as_float(u);
                v = p.noScale ? f : static_cast<float>(static_cast<double>(f) * p.scale + p.zero);
            }
        } else {
            const std::uint64_t u = (std::uint64_t(loadBe32(src + 8 * i)) << 32) | loadBe32(src + 8 * i + 4);
            const std::uint64_t e = u & 0x7FF0000000000000ull;
            if (e == 0x7FF0000000000000ull) {
                v = quietNan();
            } else if (e == 0) {
                v = p.under;
            } else {
                const double d = __longlong_as_double(static_cast<long long>(u));
                v = p.noScale ? static_cast<float>(d) : static_cast<float>(d * p.scale + p.zero);
            }
        }
        out[i] = v;
        mask[i] = !isfinite(v) ? p.nullBits : (static_cast<double>(v) >= p.saturation ? p.saturatedBits : 0);
    }
}

template <class T> bool blankFits(const RawImageLayout& l) {
    return l.hasBlank && l.blank >= static_cast<long long>(std::numeric_limits<T>::min()) &&
           l.blank <= static_cast<long long>(std::numeric_limits<T>::max());
}

ConvertParams convertParams(const RawImageLayout& l, const RawMaskRule& rule) {
    ConvertParams p;
    p.bitpix = l.bitpix;
    p.noScale = l.scale == 1.0 && l.zero == 0.0;
    p.scale = l.scale;
    p.zero = l.zero;
    p.blankFits = l.bitpix == 8    ? blankFits<std::uint8_t>(l)
                  : l.bitpix == 16 ? blankFits<std::int16_t>(l)
                  : l.bitpix == 32 ? blankFits<std::int32_t>(l)
                                   : false;
    p.blank = l.blank;
    p.under = p.noScale ? 0.0f : static_cast<float>(l.zero);
    p.saturation = rule.saturation;
    p.nullBits = rule.nullBits;
    p.saturatedBits = rule.saturatedBits;
    return p;
}

void launchConvert(const unsigned char* src, std::size_t n, const ConvertParams& p, float* out,
                   std::uint8_t* mask, cudaStream_t s) {
    if (n == 0) return;
    const int block = 256;
    const unsigned grid = static_cast<unsigned>(std::min<std::size_t>((n + block - 1) / block, 4096));
    switch (p.bitpix) {
    case 8:
        convertRawKernel<8><<<grid, block, 0, s>>>(src, n, p, out, mask);
        break;
    case 16:
        convertRawKernel<16><<<grid, block, 0, s>>>(src, n, p, out, mask);
        break;
    case 32:
        convertRawKernel<32><<<grid, block, 0, s>>>(src, n, p, out, mask);
        break;
    case -32:
        convertRawKernel<-32><<<grid, block, 0, s>>>(src, n, p, out, mask);
        break;
    case -64:
        convertRawKernel<-64><<<grid, block, 0, s>>>(src, n, p, out, mask);
        break;
    default:
        throw InvalidInput("raw upload: unsupported BITPIX " + std::to_string(p.bitpix));
    }
    GPUPHOT_CUDA_CHECK(cudaGetLastError());
}

} // namespace

RawFrameUpload::RawFrameUpload() : m_held(std::make_unique<Held>()) {}

RawFrameUpload::~RawFrameUpload() {
    if (m_res && m_busy.owns_lock()) { // a read that did not finish: nothing may still use the buffers
        if (cudaStreamSynchronize(m_res->stream) != cudaSuccess) cudaGetLastError();
    }
    release();
}

const float* RawFrameUpload::pixels() const {
    return m_ready ? static_cast<const float*>(m_held->pixels.get()) : nullptr;
}

const std::uint8_t* RawFrameUpload::mask() const {
    return m_ready ? static_cast<const std::uint8_t*>(m_held->mask.get()) : nullptr;
}

void RawFrameUpload::fail(const std::string& why) noexcept {
    try {
        std::lock_guard lock(m_problemMutex);
        if (m_problem.empty()) m_problem = why;
    } catch (...) {
    }
    m_failed = true;
}

void RawFrameUpload::release() noexcept {
    m_held->slots.reset();
    m_held->pixels.reset();
    m_held->mask.reset();
    m_ready = false;
    if (m_busy.owns_lock()) m_busy.unlock();
}

bool RawFrameUpload::begin(const RawImageLayout& layout, int width, int height, const RawMaskRule& rule) {
    if (width <= 0 || height <= 0 || m_res) return false;
    const std::size_t n = static_cast<std::size_t>(width) * static_cast<std::size_t>(height);
    const std::size_t rawBytes = n * static_cast<std::size_t>(std::abs(layout.bitpix) / 8);
    const int threads = omp_get_max_threads(); // readRawImage's readers (threads = 0), this thread's
    // For the warm-up (prepareRawUpload), which may be creating the context while this first read runs.
    g_hintRawBytes = rawBytes;
    g_hintPixels = n;
    g_hintThreads = threads;
    // GPUPHOT_RAW_UPLOAD=wait: wait for the CUDA context (benchmarks of the cold first frame).
    const bool wait = rawUploadWaits();
    if (!g_deviceReady && !wait) {
        m_problem = "the CUDA context is not up yet: the host path, overlapped with its creation";
        return false;
    }
    try {
        // The CUDA runtime initialises the primary context once: a warm-up thread creating it
        // (startDeviceWarmUp) makes this call wait for it rather than start another.
        GPUPHOT_CUDA_CHECK(cudaGetDevice(&m_device));
        Resources& res = Resources::of(m_device);
        std::unique_lock<std::mutex> busy(res.busy, std::defer_lock);
        if (wait)
            busy.lock(); // the warm-up's preparation first
        else if (!busy.try_lock())
            return false; // another read is uploading (or the warm-up preparing): this one keeps the host path
        res.keepFreed(!explicitBudgetOn(m_device));
        // Reserved outside the budgets and freed by RAII when anything below fails.
        m_held->pixels = OutsideBlock(res, n * sizeof(float), "device frame");
        m_held->mask = OutsideBlock(res, n, "device mask");
        m_res = &res;
        m_busy = std::move(busy);
    } catch (const std::exception& e) {
        cudaGetLastError();
        m_problem = e.what();
        m_held->pixels.reset();
        m_held->mask.reset();
        return false;
    }
    m_layout = layout;
    m_rule = rule;
    m_width = width;
    m_height = height;
    m_readChunkBytes = m_chunkBytes ? m_chunkBytes : rawUploadChunkBytes(rawBytes, threads);
    return true;
}

std::vector<unsigned char*> RawFrameUpload::start(int threads, std::size_t chunkBytes) {
    std::vector<unsigned char*> out;
    try {
        GPUPHOT_CUDA_CHECK(cudaSetDevice(m_device));
        m_res->reserve(threads, chunkBytes);
        m_held->slots = OutsideBlock(*m_res, static_cast<std::size_t>(threads) * chunkBytes, "reader slots");
        m_slotBytes = chunkBytes;
        for (int t = 0; t < threads; ++t)
            out.push_back(m_res->pinned[static_cast<std::size_t>(t)].get());
        return out;
    } catch (const std::exception& e) {
        cudaGetLastError();
        fail(e.what());
    }
    // The host read goes on in plain buffers; the upload is not ready.
    m_hostFallback.assign(static_cast<std::size_t>(threads), std::vector<unsigned char>(chunkBytes));
    out.clear();
    for (auto& b : m_hostFallback)
        out.push_back(b.data());
    return out;
}

void RawFrameUpload::reuse(int thread) {
    if (m_failed) return;
    const cudaError_t e = cudaEventSynchronize(m_res->events[static_cast<std::size_t>(thread)]);
    if (e != cudaSuccess) {
        cudaGetLastError();
        fail(std::string("raw upload: ") + cudaGetErrorString(e));
    }
}

void RawFrameUpload::chunk(int thread, std::size_t first, std::size_t n) {
    if (m_failed) return;
    try {
        GPUPHOT_CUDA_CHECK(cudaSetDevice(m_device)); // the reader threads' current device
        const std::size_t t = static_cast<std::size_t>(thread);
        const std::size_t bytes = n * static_cast<std::size_t>(std::abs(m_layout.bitpix) / 8);
        auto* slot = static_cast<unsigned char*>(m_held->slots.get()) + t * m_slotBytes;
        GPUPHOT_CUDA_CHECK(
            cudaMemcpyAsync(slot, m_res->pinned[t].get(), bytes, cudaMemcpyHostToDevice, m_res->stream));
        launchConvert(slot, n, convertParams(m_layout, m_rule), static_cast<float*>(m_held->pixels.get()) + first,
                      static_cast<std::uint8_t*>(m_held->mask.get()) + first, m_res->stream);
        GPUPHOT_CUDA_CHECK(cudaEventRecord(m_res->events[t], m_res->stream));
        ++m_chunks;
    } catch (const std::exception& e) {
        fail(e.what());
    }
}

void RawFrameUpload::finish() {
    if (!m_failed) {
        try {
            GPUPHOT_CUDA_CHECK(cudaSetDevice(m_device));
            GPUPHOT_CUDA_CHECK(cudaEventRecord(m_res->done, m_res->stream));
            GPUPHOT_CUDA_CHECK(cudaStreamSynchronize(m_res->stream)); // the slots and buffers are free again
            m_ready = true;
        } catch (const std::exception& e) {
            fail(e.what());
        }
    }
    if (!m_ready) {
        if (cudaStreamSynchronize(m_res->stream) != cudaSuccess) cudaGetLastError();
        release();
        return;
    }
    m_held->slots.reset(); // back to the pool (and out of the budgets): only the frame is held now
    m_busy.unlock();       // the next read may use the resources; the frame stays ours until adopted
}

bool RawFrameUpload::adoptInto(DeviceContext& dc, const ImageView& pixels, const MaskView& mask,
                               bool withMask) {
    if (!m_ready || dc.device() != m_device || pixels.width != m_width || pixels.height != m_height)
        return false;
    if (withMask && (mask.width != m_width || mask.height != m_height)) withMask = false;
    const std::size_t n = static_cast<std::size_t>(m_width) * static_cast<std::size_t>(m_height);
    dc.dropFrame(); // the previous frame's buffers go first (budget)
    // The reservation passes to the context (its budget counts the frame from now on).
    if (!dc.takeOverOutside(n * sizeof(float))) {
        release();
        return false;
    }
    auto px = DeviceBuffer<float>::adopt(dc, static_cast<float*>(m_held->pixels.handOver()), n);
    DeviceBuffer<std::uint8_t> mk;
    if (withMask && dc.takeOverOutside(n))
        mk = DeviceBuffer<std::uint8_t>::adopt(dc, static_cast<std::uint8_t*>(m_held->mask.handOver()), n);
    // The context's stream uses (and frees) the buffers after the upload (finished already: finish()).
    GPUPHOT_CUDA_CHECK(cudaStreamWaitEvent(dc.stream(), m_res->done, 0));
    dc.adoptFrame(pixels, withMask ? mask : MaskView{}, std::move(px), std::move(mk));
    dc.markReadFrame();
    release(); // the mask when it was not adopted
    return true;
}

namespace {
// `what` of the current device's resources, under their lock (0 without a device).
template <class F> std::size_t currentResources(F what) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    RawFrameUpload::Resources& res = RawFrameUpload::Resources::of(dev);
    std::lock_guard lock(res.busy);
    return what(res);
}
} // namespace

std::size_t rawUploadPinnedBytes() {
    return currentResources([](const RawFrameUpload::Resources& r) { return r.pinnedBytes(); });
}

std::size_t rawReadHintPixels() {
    return g_hintPixels.load();
}

std::size_t rawUploadSlotBytes() {
    return currentResources([](const RawFrameUpload::Resources& r) { return r.slotBytes; });
}

void warmUpRawUpload(std::size_t gpuMemLimit) noexcept {
    if (g_hintRawBytes.load() == 0) prepareRawUpload(gpuMemLimit);
}

void prepareRawUpload(std::size_t gpuMemLimit) noexcept {
    try {
        int dev = 0;
        GPUPHOT_CUDA_CHECK(cudaGetDevice(&dev));
        GPUPHOT_CUDA_CHECK(cudaFree(nullptr)); // the CUDA context (the warm-up's ~0.1-0.3 s)
        RawFrameUpload::Resources& res = RawFrameUpload::Resources::of(dev);
        // The first frame's read has usually begun by now (its header is read in milliseconds).
        const std::size_t rawBytes = g_hintRawBytes.load(), pixels = g_hintPixels.load();
        int threads = g_hintThreads.load();
        if (threads <= 0) threads = omp_get_max_threads();
        const std::size_t chunk = rawBytes ? rawUploadChunkBytes(rawBytes, threads) : kMaxChunk;
        std::lock_guard busy(res.busy);
        res.reserve(threads, chunk);
        if (gpuMemLimit == 0 && pixels > 0) {
            // Map the first uploaded frame's device memory now: the pool keeps it (no explicit budget).
            res.keepFreed(true);
            OutsideBlock px(res, pixels * sizeof(float), "device frame (warm-up)");
            OutsideBlock mk(res, pixels, "device mask (warm-up)");
            OutsideBlock slots(res, static_cast<std::size_t>(threads) * chunk, "reader slots (warm-up)");
            slots.reset();
            mk.reset();
            px.reset();
            GPUPHOT_CUDA_CHECK(cudaStreamSynchronize(res.stream));
        }
    } catch (...) {
        cudaGetLastError();
    }
}

namespace {
std::shared_ptr<RawChunkSink> createUpload() {
    return std::make_shared<RawFrameUpload>();
}

bool adoptUpload(RawChunkSink& sink, const ImageView& pixels, const MaskView& mask, bool withMask,
                 RunContext& ctx) {
    auto* up = dynamic_cast<RawFrameUpload*>(&sink);
    if (!up || !up->ready()) return false;
    return up->adoptInto(DeviceContext::of(ctx), pixels, mask, withMask); // waits for the warm-up
}
void settleUpload(bool pixelsChanged, bool maskChanged, RunContext& ctx) {
    DeviceContext::of(ctx).settleReadFrame(pixelsChanged, maskChanged);
}
} // namespace

void registerFrameUpload() {
    CudaStageTable t;
    t.createRawUpload = &createUpload;
    t.adoptRawUpload = &adoptUpload;
    t.settleRawUpload = &settleUpload;
    t.prepareRawUpload = &warmUpRawUpload;
    registerCudaStages(t);
}

} // namespace gpuphot::cuda
