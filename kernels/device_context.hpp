#pragma once
// The CUDA backend's per-RunContext state (docs/ARCHITECTURE.md, GPU memory model): one stream, one
// stream-ordered memory pool with a budget and a high-water mark, RAII device and pinned buffers, and a cache
// of the frame (pixels, mask) and of the background maps kept on the device between stages and between runs.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/model/image.hpp"
#include "core/pipeline/backend_tuning.hpp"
#include "core/util/errors.hpp"
#include "kernels/cuda_check.hpp"

namespace gpuphot {

class RunContext;

// An allocation would exceed RunContext::gpuMemLimit, or the device itself is out of memory.
class DeviceOutOfMemory : public CudaError {
public:
    using CudaError::CudaError;
};

namespace cuda {

template <class T> class DeviceBuffer;
struct DeviceLedger; // per device: the live contexts and the memory held outside them (device_context.cu)

// Identity of a host view for the device caches (frame, background maps, prepare's masters): pointer,
// size, stride, the owning Image's allocation serial (a new image at a freed one's address differs from
// it even when only a few pixels differ), a generation counter (in-place edits) and a sampled fingerprint
// (FNV-1a over about 4096 elements spread over the view and its corners: views of foreign memory).
struct ViewKey {
    const void* ptr = nullptr;
    int width = 0, height = 0;
    std::ptrdiff_t stride = 0;
    std::uint64_t generation = 0;
    std::uint64_t print = 0;
    std::uint64_t serial = 0; // the owning Image's allocation serial (ImageViewT::serial)
    bool operator==(const ViewKey&) const = default;
};
// Defined for float, std::uint8_t and std::int32_t views.
template <class T> ViewKey viewKey(const ImageViewT<T>& v, std::uint64_t generation = 0);

// A stream-ordered memory pool of pinned device memory on `device` (no IPC handles) that keeps up to
// releaseThreshold bytes of freed memory for reuse (~0: all of it) instead of returning it to the driver
// at the next synchronisation. The DeviceContext's pool and the raw upload's (kernels/frame_upload.cu).
cudaMemPool_t createDevicePool(int device, std::uint64_t releaseThreshold);

// A large device -> host copy through two pinned staging chunks of `chunk` bytes on `stream`: the DMA into
// one chunk overlaps the copy out of the other (several host threads, host_copy.hpp). staging and done: two
// buffers of at least `chunk` bytes and two events, made by the caller. Returns when `host` holds the data.
void downloadThroughStaging(void* host, const void* device, std::size_t bytes, std::size_t chunk,
                            cudaStream_t stream, unsigned char* const staging[2], cudaEvent_t const done[2]);

// ---- device memory outside the contexts' budgets (the read phase's raw upload, kernels/frame_upload.hpp)
// The raw upload allocates from its own pool, with no RunContext (the read may run beside another frame's
// stages), memory that belongs to the frame cache the stages plan with: the device frame until a context
// adopts it (DeviceContext::takeOverOutside) and the reader slots during the read. It reserves that memory
// first: reserveOutside succeeds only when every live DeviceContext on the device still fits its budget
// with it (in use + everything held outside + bytes <= budget), and every context counts what is held
// outside in its allocations, available() and high-water mark, so that a context's stages plus the upload
// in flight stay within --gpu-mem-limit. false: nothing reserved (the read keeps the host path).
bool reserveOutside(int device, std::size_t bytes);
void releaseOutside(int device, std::size_t bytes) noexcept;
std::size_t heldOutside(int device);
// Some live DeviceContext on the device has an explicit budget (--gpu-mem-limit, setBudget).
bool explicitBudgetOn(int device);

class DeviceContext {
public:
    // The context stored in ctx.deviceState, created on first use (which also installs
    // ctx.deviceCheckpoint); re-reads ctx.gpuMemLimit on every call.
    static DeviceContext& of(RunContext& ctx);

    explicit DeviceContext(std::size_t budget);
    ~DeviceContext();
    DeviceContext(const DeviceContext&) = delete;
    DeviceContext& operator=(const DeviceContext&) = delete;

    cudaStream_t stream() const { return m_stream; }
    void synchronize() const { GPUPHOT_CUDA_CHECK(cudaStreamSynchronize(m_stream)); }
    // After a failed attempt: wait for the work already queued (copies into host memory that the
    // unwinding freed), without throwing.
    void drain() const noexcept {
        if (cudaStreamSynchronize(m_stream) != cudaSuccess) cudaGetLastError();
    }

    // Stream-ordered allocation from the pool; throws DeviceOutOfMemory over budget or when the device
    // has no memory left. bytes == 0 gives nullptr.
    void* allocate(std::size_t bytes);
    void release(void* p, std::size_t bytes) noexcept;

    std::size_t inUse() const { return m_inUse; }
    int device() const { return m_device; }
    // Device memory of this device allocated outside the context (stream-ordered, from another pool: the
    // read phase's raw upload, kernels/frame_upload.hpp) counted against the budget before it is taken
    // over with DeviceBuffer::adopt; false (nothing counted) when it does not fit.
    bool takeOver(std::size_t bytes);
    // takeOver of memory reserved with reserveOutside (below): the reservation becomes this context's
    // (the total on the device is unchanged); false, nothing changed, when the budget has no room for it.
    bool takeOverOutside(std::size_t bytes);
    // Bytes the budget still allows (0 when over it), less what is held outside any context
    // (reserveOutside: the read phase's raw upload in flight).
    std::size_t available() const;

    // ---- fault injection (tests) --------------------------------------------------------------------
    // The n-th allocation from now (n >= 1) throws DeviceOutOfMemory, once; 0 disarms. Also armed from
    // RunContext::testHooks.cudaFailAfterAllocs when the context is created.
    void setFailAfter(std::size_t n) { m_failAfter = n; }
    std::size_t failAfter() const { return m_failAfter; }
    // Allocations (non-empty) requested so far, the injected failure included (tests count a clean run).
    std::size_t allocations() const { return m_allocations; }

    // ---- plans (the report) -------------------------------------------------------------------------
    // How the stage in progress ran: "whole" (the frame resident on the device), "strips" (rows streamed
    // from the host, N strips), "cpu" (the CPU stage: even one strip did not fit); note: a warning for the
    // report. Read (and cleared) by the stage checkpoint into StageRecord::devicePlan / deviceStrips /
    // deviceNote. A stage that runs twice in one record (second pass) keeps the last plan.
    void notePlan(const std::string& mode, int strips, const std::string& note = {}) {
        m_planMode = mode;
        m_planStrips = strips;
        if (!note.empty()) m_planNote = note;
    }
    const std::string& planMode() const { return m_planMode; }
    int planStrips() const { return m_planStrips; }
    const std::string& planNote() const { return m_planNote; }
    void clearPlan() {
        m_planMode.clear();
        m_planStrips = 0;
        m_planNote.clear();
    }
    // Bytes held by the frame cache and by the background cache.
    std::size_t cachedFrameBytes() const;
    std::size_t cachedBackgroundBytes() const;
    // Release the frame cache (pixels and mask): strips read from the host instead.
    void dropFrame();
    // Peak of (memory in use + memory held outside any context on the device) since the last reset.
    std::size_t highWater() const { return m_highWater; }
    void resetHighWater();
    std::size_t budget() const { return m_budget; }
    void setBudget(std::size_t bytes); // an explicit budget (as --gpu-mem-limit)
    bool explicitBudget() const { return m_explicitBudget; }

    // Launch-configuration knob for tests (threads per block of the per-pixel kernels; 0: default).
    // Also read from the environment variable GPUPHOT_CUDA_BLOCK at creation.
    int blockSize() const { return m_blockSize; }
    // The RunContext's tuning (copied on every DeviceContext::of): the engines' alternative paths.
    const BackendTuning& tuning() const { return m_tuning; }
    const TestHooks& testHooks() const { return m_hooks; } // likewise RunContext::testHooks
    void setBlockSize(int threads) { m_blockSize = threads; }

    // ---- frame cache -------------------------------------------------------------------------------
    // The frame's pixels (and mask, null when the view is empty) on the device, row stride = width,
    // uploaded only when (host pointer, size, stride, generation, a sampled fingerprint) changed.
    struct DeviceFrame {
        const float* pixels = nullptr;
        const std::uint8_t* mask = nullptr;
        int width = 0, height = 0;
    };
    DeviceFrame frame(const ImageView& image, const MaskView& mask);
    // Takes device copies that already hold these host views' values (the CUDA prepare stage's result,
    // downloaded into them) as the frame cache, so that the following stages do not upload the frame.
    void adoptFrame(const ImageView& image, const MaskView& mask, DeviceBuffer<float>&& pixels,
                    DeviceBuffer<std::uint8_t>&& maskBuffer);
    // The frame cache's device copies of these host views, moved out of the cache (uploaded first when
    // they are not the cached ones; mask: null when the view is empty), for a stage that changes the frame
    // on the device (prepare) and hands it back with adoptFrame. The cache is empty until then.
    std::pair<DeviceBuffer<float>, DeviceBuffer<std::uint8_t>> takeFrame(const ImageView& image,
                                                                         const MaskView& mask);
    // The frame cache holds a frame adopted from the read phase's raw upload (kernels/frame_upload.hpp)
    // and nothing replaced or re-uploaded it since: settleReadFrame drops what the host changed in place.
    void markReadFrame() { m_readFrame = true; }
    bool holdsReadFrame() const { return m_readFrame; }
    void settleReadFrame(bool pixelsChanged, bool maskChanged);
    // Per-context state of one stage (e.g. the prepare stage's resident calibration masters), created
    // empty on first use and released with the context, before its pool.
    std::shared_ptr<void>& stageState(const std::string& name);
    // Call after changing a frame's pixels in place (same buffer): the next run re-uploads.
    void bumpGeneration() { ++m_generation; }
    std::uint64_t uploads() const { return m_uploads; } // frame uploads so far (tests)

    // Background maps on the device, stored by the CUDA background stage and found again by the
    // detection stage from the BackgroundResult's host maps (pointer, size and sampled fingerprint).
    void storeBackground(const Image<float>& level, const Image<float>& rms,
                         DeviceBuffer<float>&& dLevel, DeviceBuffer<float>&& dRms);
    // Device maps for these host maps (uploaded when they are not the stored ones).
    std::pair<const float*, const float*> background(const Image<float>& level, const Image<float>& rms);
    // Maps kept on the device only (the host result has no full maps, kernels/device_maps.hpp), stored
    // under a signature of what determines them (frame size, mesh grid, spline kind); findBackground
    // gives {nullptr, nullptr} when the stored maps have another signature.
    void storeBackground(std::vector<std::uint8_t> signature, DeviceBuffer<float>&& dLevel,
                         DeviceBuffer<float>&& dRms);
    std::pair<const float*, const float*> findBackground(const std::vector<std::uint8_t>& signature) const;
    void dropBackground();

    // Reusable pinned host memory (grown on demand, with room: half as much again, at most 32 MiB more) for
    // downloads, by slot. Growing frees the old buffer, which synchronises the device: take a slot before
    // queuing copies into it.
    void* pinned(int slot, std::size_t bytes);

    // Large host <-> device copies through pinned staging buffers (two of stagingChunk() bytes, filled and
    // drained by several host threads, overlapped with the DMA): pageable memory copies at a few GB/s,
    // pinned at tens. Both return when the host buffer may be reused or read (the stream is synchronised
    // for a download); small copies (under one chunk) go directly.
    void uploadStaged(void* device, const void* host, std::size_t bytes);
    void downloadStaged(void* host, const void* device, std::size_t bytes);
    std::size_t stagingChunk() const { return m_stagingChunk; }
    void setStagingChunk(std::size_t bytes) { m_stagingChunk = std::max<std::size_t>(bytes, 4096); }
    std::uint64_t stagedBytes() const { return m_stagedBytes; } // bytes copied through staging so far

private:
    friend bool reserveOutside(int device, std::size_t bytes);
    friend void releaseOutside(int device, std::size_t bytes) noexcept;
    friend bool explicitBudgetOn(int device);
    void prepareStaging();
    struct Impl;
    cudaStream_t m_stream = nullptr;
    cudaMemPool_t m_pool = nullptr;
    int m_device = 0;
    // Written under the device's ledger lock (device_context.cu), so that reserveOutside on another thread
    // sees a consistent sum; read freely by the owning thread.
    std::size_t m_budget = 0;
    std::size_t m_inUse = 0;
    std::atomic<std::size_t> m_highWater{0};
    bool m_explicitBudget = false;
    DeviceLedger* m_ledger = nullptr;
    int m_blockSize = 0;
    BackendTuning m_tuning;
    TestHooks m_hooks;
    std::uint64_t m_generation = 0;
    std::uint64_t m_uploads = 0;
    bool m_readFrame = false;
    std::size_t m_failAfter = 0;
    std::size_t m_allocations = 0;
    std::string m_planMode, m_planNote;
    int m_planStrips = 0;
    std::size_t m_stagingChunk = std::size_t(32) << 20;
    std::uint64_t m_stagedBytes = 0;
    std::unique_ptr<Impl> m_impl;
};

// Move-only device array of T from the context's pool, freed stream-ordered.
template <class T> class DeviceBuffer {
public:
    DeviceBuffer() = default;
    DeviceBuffer(DeviceContext& dc, std::size_t count)
        : m_dc(&dc), m_count(count), m_ptr(static_cast<T*>(dc.allocate(count * sizeof(T)))) {}
    ~DeviceBuffer() { reset(); }
    DeviceBuffer(DeviceBuffer&& o) noexcept
        : m_dc(std::exchange(o.m_dc, nullptr)), m_count(std::exchange(o.m_count, 0)),
          m_ptr(std::exchange(o.m_ptr, nullptr)) {}
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        if (this != &o) {
            reset();
            m_dc = std::exchange(o.m_dc, nullptr);
            m_count = std::exchange(o.m_count, 0);
            m_ptr = std::exchange(o.m_ptr, nullptr);
        }
        return *this;
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    // Takes over p (count elements, already counted by dc.takeOver): freed by dc like its own memory.
    static DeviceBuffer adopt(DeviceContext& dc, T* p, std::size_t count) {
        DeviceBuffer b;
        b.m_dc = &dc;
        b.m_count = p ? count : 0;
        b.m_ptr = p;
        return b;
    }

    void reset() noexcept {
        if (m_ptr) m_dc->release(m_ptr, m_count * sizeof(T));
        m_ptr = nullptr;
        m_count = 0;
    }
    T* get() const { return m_ptr; }
    std::size_t size() const { return m_count; }
    std::size_t bytes() const { return m_count * sizeof(T); }

    // Asynchronous on the context's stream; the host memory must stay valid until the stream syncs.
    void upload(const T* host, std::size_t count, std::size_t offset = 0) {
        if (count == 0) return;
        GPUPHOT_CUDA_CHECK(cudaMemcpyAsync(m_ptr + offset, host, count * sizeof(T), cudaMemcpyHostToDevice,
                                           m_dc->stream()));
    }
    void download(T* host, std::size_t count, std::size_t offset = 0) const {
        if (count == 0) return;
        GPUPHOT_CUDA_CHECK(cudaMemcpyAsync(host, m_ptr + offset, count * sizeof(T), cudaMemcpyDeviceToHost,
                                           m_dc->stream()));
    }
    void zero() {
        if (m_count) GPUPHOT_CUDA_CHECK(cudaMemsetAsync(m_ptr, 0, bytes(), m_dc->stream()));
    }

private:
    DeviceContext* m_dc = nullptr;
    std::size_t m_count = 0;
    T* m_ptr = nullptr;
};

// Page-locked host array (cudaMallocHost), move-only.
template <class T> class PinnedBuffer {
public:
    PinnedBuffer() = default;
    explicit PinnedBuffer(std::size_t count) : m_count(count) {
        if (count) {
            void* p = nullptr;
            const cudaError_t e = cudaMallocHost(&p, count * sizeof(T));
            if (e != cudaSuccess) {
                cudaGetLastError();
                throw DeviceOutOfMemory("PinnedBuffer: cudaMallocHost of " + std::to_string(count * sizeof(T)) +
                                        " bytes failed: " + cudaGetErrorString(e));
            }
            m_ptr = static_cast<T*>(p);
        }
    }
    ~PinnedBuffer() {
        if (m_ptr) cudaFreeHost(m_ptr);
    }
    PinnedBuffer(PinnedBuffer&& o) noexcept
        : m_count(std::exchange(o.m_count, 0)), m_ptr(std::exchange(o.m_ptr, nullptr)) {}
    PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
        if (this != &o) {
            if (m_ptr) cudaFreeHost(m_ptr);
            m_count = std::exchange(o.m_count, 0);
            m_ptr = std::exchange(o.m_ptr, nullptr);
        }
        return *this;
    }
    PinnedBuffer(const PinnedBuffer&) = delete;
    PinnedBuffer& operator=(const PinnedBuffer&) = delete;
    T* get() const { return m_ptr; }
    std::size_t size() const { return m_count; }

private:
    std::size_t m_count = 0;
    T* m_ptr = nullptr;
};

// ---- strip planning helpers ---------------------------------------------------------------------------

// "1.50 GB"-style text for notes and messages.
inline std::string bytesText(std::size_t b) {
    char buf[48];
    if (b >= (std::size_t(1) << 30))
        std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / double(std::size_t(1) << 30));
    else
        std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / double(std::size_t(1) << 20));
    return buf;
}

// Rows per strip so that rows * bytesPerRow + fixed fits in avail (at most maxRows); 0 when not even one.
inline int stripRowsFor(std::size_t avail, std::size_t bytesPerRow, std::size_t fixed, int maxRows) {
    if (avail <= fixed || bytesPerRow == 0) return 0;
    const std::size_t rows = (avail - fixed) / bytesPerRow;
    return static_cast<int>(std::min<std::size_t>(rows, static_cast<std::size_t>(maxRows)));
}

// Copies rows [r0, r1) of a host view (any stride) into dst (row stride = width), stream-ordered; a
// contiguous block of at least one staging chunk goes through the pinned staging buffers.
template <class T>
void uploadRows(DeviceContext& dc, T* dst, const ImageViewT<T>& v, int r0, int r1) {
    if (r1 <= r0 || v.empty()) return;
    const std::size_t bytes =
        sizeof(T) * static_cast<std::size_t>(v.width) * static_cast<std::size_t>(r1 - r0);
    if (v.stride == v.width && bytes >= dc.stagingChunk()) {
        dc.uploadStaged(dst, v.data + static_cast<std::ptrdiff_t>(r0) * v.stride, bytes);
        return;
    }
    GPUPHOT_CUDA_CHECK(cudaMemcpy2DAsync(dst, sizeof(T) * v.width, v.data + static_cast<std::ptrdiff_t>(r0) * v.stride,
                                         sizeof(T) * v.stride, sizeof(T) * v.width, r1 - r0,
                                         cudaMemcpyHostToDevice, dc.stream()));
}

// The note a stage leaves when it falls back to the CPU.
inline std::string cpuFallbackNote(const char* stage, std::size_t budget, const std::string& why) {
    return std::string("gpu: stage ") + stage + " ran on the CPU: budget " + bytesText(budget) + " too small (" +
           why + ")";
}

} // namespace cuda
} // namespace gpuphot
