// The read phase's raw upload: pinned chunks on a copy stream, converted on the device (frame_upload.hpp).
#include "kernels/frame_upload.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <utility>

#include "core/pipeline/cuda_stages.hpp"
#include "kernels/cuda_check.hpp"
#include "kernels/device_context.hpp"

namespace gpuphot::cuda {

namespace {
// Set once a DeviceContext exists (the CUDA context is up): before that, a read does not wait for the
// context's creation (startDeviceWarmUp, ~0.1-0.3 s) but keeps the host path, overlapped with it.
std::atomic<bool> g_deviceReady{false};
} // namespace

void noteDeviceReady() {
    g_deviceReady = true;
}

// Per device, for the process (never freed: the CUDA runtime may be gone at exit): the copy stream, a memory
// pool, and per reader thread a pinned buffer, a device slot and an event.
struct RawFrameUpload::Resources {
    std::mutex busy;
    int device = 0;
    cudaStream_t stream = nullptr;
    cudaMemPool_t pool = nullptr;
    cudaEvent_t done = nullptr;
    std::size_t slotBytes = 0;
    std::vector<PinnedBuffer<unsigned char>> pinned;
    std::vector<void*> slots;
    std::vector<cudaEvent_t> events;

    explicit Resources(int dev) : device(dev) {
        GPUPHOT_CUDA_CHECK(cudaSetDevice(dev));
        GPUPHOT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        cudaMemPoolProps props{};
        props.allocType = cudaMemAllocationTypePinned;
        props.handleTypes = cudaMemHandleTypeNone;
        props.location.type = cudaMemLocationTypeDevice;
        props.location.id = dev;
        // Release threshold 0 (the default): a frame freed by the DeviceContext that adopted it goes back to
        // the driver, so that outside a context's budget (--gpu-mem-limit) only the frame between its read
        // and its adoption and the reader slots are held.
        GPUPHOT_CUDA_CHECK(cudaMemPoolCreate(&pool, &props));
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
    void* allocate(std::size_t bytes) {
        void* p = nullptr;
        const cudaError_t e = cudaMallocFromPoolAsync(&p, bytes, pool, stream);
        if (e != cudaSuccess) {
            cudaGetLastError();
            throw DeviceOutOfMemory(std::string("raw upload: allocating ") + std::to_string(bytes) +
                                    " bytes failed: " + cudaGetErrorString(e));
        }
        return p;
    }
    // At least `threads` readers with buffers of `bytes` (the caller holds `busy`; nothing in flight).
    void reserve(int threads, std::size_t bytes) {
        if (bytes > slotBytes) {
            for (void* p : slots)
                GPUPHOT_CUDA_CHECK(cudaFreeAsync(p, stream));
            slots.clear();
            pinned.clear();
            GPUPHOT_CUDA_CHECK(cudaStreamSynchronize(stream));
            slotBytes = bytes;
        }
        while (static_cast<int>(slots.size()) < threads) {
            pinned.emplace_back(slotBytes);
            slots.push_back(allocate(slotBytes));
        }
        while (static_cast<int>(events.size()) < threads) {
            cudaEvent_t e = nullptr;
            GPUPHOT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
            events.push_back(e);
        }
    }
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

RawFrameUpload::RawFrameUpload() = default;

RawFrameUpload::~RawFrameUpload() {
    if (m_res && m_busy.owns_lock()) { // a read that did not finish: nothing may still use the buffers
        if (cudaStreamSynchronize(m_res->stream) != cudaSuccess) cudaGetLastError();
    }
    release();
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
    if (m_res) {
        cudaSetDevice(m_device);
        if (m_pixels && cudaFreeAsync(m_pixels, m_res->stream) != cudaSuccess) cudaGetLastError();
        if (m_mask && cudaFreeAsync(m_mask, m_res->stream) != cudaSuccess) cudaGetLastError();
    }
    m_pixels = nullptr;
    m_mask = nullptr;
    m_ready = false;
    if (m_busy.owns_lock()) m_busy.unlock();
}

bool RawFrameUpload::begin(const RawImageLayout& layout, int width, int height, const RawMaskRule& rule) {
    if (width <= 0 || height <= 0 || m_res) return false;
    // GPUPHOT_RAW_UPLOAD=wait: wait for the CUDA context (benchmarks of the cold first frame).
    const char* env = std::getenv("GPUPHOT_RAW_UPLOAD");
    if (!g_deviceReady && !(env && std::strcmp(env, "wait") == 0)) {
        m_problem = "the CUDA context is not up yet: the host path, overlapped with its creation";
        return false;
    }
    try {
        // The CUDA runtime initialises the primary context once: a warm-up thread creating it
        // (startDeviceWarmUp) makes this call wait for it rather than start another.
        GPUPHOT_CUDA_CHECK(cudaGetDevice(&m_device));
        Resources& res = Resources::of(m_device);
        std::unique_lock<std::mutex> busy(res.busy, std::try_to_lock);
        if (!busy.owns_lock()) return false; // another read is uploading: this one keeps the host path
        const std::size_t n = static_cast<std::size_t>(width) * static_cast<std::size_t>(height);
        m_pixels = static_cast<float*>(res.allocate(n * sizeof(float)));
        try {
            m_mask = static_cast<std::uint8_t*>(res.allocate(n));
        } catch (...) {
            cudaFreeAsync(m_pixels, res.stream);
            m_pixels = nullptr;
            throw;
        }
        m_res = &res;
        m_busy = std::move(busy);
    } catch (const std::exception& e) {
        m_problem = e.what();
        return false;
    }
    m_layout = layout;
    m_rule = rule;
    m_width = width;
    m_height = height;
    return true;
}

std::vector<unsigned char*> RawFrameUpload::start(int threads, std::size_t chunkBytes) {
    std::vector<unsigned char*> out;
    try {
        GPUPHOT_CUDA_CHECK(cudaSetDevice(m_device));
        m_res->reserve(threads, chunkBytes);
        for (int t = 0; t < threads; ++t)
            out.push_back(m_res->pinned[static_cast<std::size_t>(t)].get());
        return out;
    } catch (const std::exception& e) {
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
        auto* slot = static_cast<unsigned char*>(m_res->slots[t]);
        GPUPHOT_CUDA_CHECK(
            cudaMemcpyAsync(slot, m_res->pinned[t].get(), bytes, cudaMemcpyHostToDevice, m_res->stream));
        launchConvert(slot, n, convertParams(m_layout, m_rule), m_pixels + first, m_mask + first,
                      m_res->stream);
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
    m_busy.unlock(); // the next read may use the resources; the frame stays ours until adopted
}

bool RawFrameUpload::adoptInto(DeviceContext& dc, const ImageView& pixels, const MaskView& mask,
                               bool withMask) {
    if (!m_ready || dc.device() != m_device || pixels.width != m_width || pixels.height != m_height)
        return false;
    if (withMask && (mask.width != m_width || mask.height != m_height)) withMask = false;
    const std::size_t n = static_cast<std::size_t>(m_width) * static_cast<std::size_t>(m_height);
    dc.dropFrame(); // the previous frame's buffers go first (budget)
    if (!dc.takeOver(n * sizeof(float))) {
        release();
        return false;
    }
    auto px = DeviceBuffer<float>::adopt(dc, std::exchange(m_pixels, nullptr), n);
    DeviceBuffer<std::uint8_t> mk;
    if (withMask && dc.takeOver(n))
        mk = DeviceBuffer<std::uint8_t>::adopt(dc, std::exchange(m_mask, nullptr), n);
    // The context's stream uses (and frees) the buffers after the upload (finished already: finish()).
    GPUPHOT_CUDA_CHECK(cudaStreamWaitEvent(dc.stream(), m_res->done, 0));
    dc.adoptFrame(pixels, withMask ? mask : MaskView{}, std::move(px), std::move(mk));
    dc.markReadFrame();
    release(); // the mask when it was not adopted
    return true;
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
    registerCudaStages(t);
}

} // namespace gpuphot::cuda
