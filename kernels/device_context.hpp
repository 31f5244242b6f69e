#pragma once
// The CUDA backend's per-RunContext state (docs/ARCHITECTURE.md, GPU memory model): one stream; the memory
// policy (memory_resource.hpp: a stream-ordered pool under a budget ledger with a high-water mark and an
// allocation counter); RAII device buffers from it (and pinned host buffers, pinned_buffer.hpp); the frame
// cache (frame_cache.hpp: the frame and the background maps kept on the device between stages and runs);
// each stage's typed scratch (scratch_store.hpp); pinned staging for large copies; the stage plans.
#include <cuda_runtime.h>

#include <algorithm>
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
#include "kernels/memory_resource.hpp"
#include "kernels/pinned_buffer.hpp"
#include "kernels/scratch_store.hpp"

namespace gpuphot {

class RunContext;

namespace cuda {

template <class T> class DeviceBuffer;
class FrameCache;

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
// Defined for float, std::uint8_t and std::int32_t views (frame_cache.cu).
template <class T> ViewKey viewKey(const ImageViewT<T>& v, std::uint64_t generation = 0);

// The frame cache's frame on the device: pixels and mask (null when there is none), row stride = width.
struct DeviceFrame {
    const float* pixels = nullptr;
    const std::uint8_t* mask = nullptr;
    int width = 0, height = 0;
};

// A large device -> host copy through two pinned staging chunks of `chunk` bytes on `stream`: the DMA into
// one chunk overlaps the copy out of the other (several host threads, host_copy.hpp). staging and done: two
// buffers of at least `chunk` bytes and two events, made by the caller. Returns when `host` holds the data.
void downloadThroughStaging(void* host, const void* device, std::size_t bytes, std::size_t chunk,
                            cudaStream_t stream, unsigned char* const staging[2], cudaEvent_t const done[2]);

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

    // ---- memory (memory_resource.hpp: CountingAdaptor -> BudgetAdaptor -> PoolResource) --------------
    // Stream-ordered allocation from the pool; throws DeviceOutOfMemory over budget or when the device
    // has no memory left. bytes == 0 gives nullptr.
    void* allocate(std::size_t bytes) { return bytes == 0 ? nullptr : m_counting->allocate(bytes); }
    void release(void* p, std::size_t bytes) noexcept {
        if (p) m_counting->release(p, bytes);
    }

    std::size_t inUse() const { return m_budget->inUse(); }
    int device() const { return m_device; }
    // Device memory of this device allocated outside the context (stream-ordered, from another pool: the
    // read phase's raw upload, kernels/frame_upload.hpp) counted against the budget before it is taken
    // over with DeviceBuffer::adopt; false (nothing counted) when it does not fit.
    bool takeOver(std::size_t bytes) { return m_budget->takeOver(bytes); }
    // takeOver of memory reserved with reserveOutside (memory_resource.hpp): the reservation becomes this
    // context's (the total on the device is unchanged); false, nothing changed, when the budget has no room.
    bool takeOverOutside(std::size_t bytes) { return m_budget->takeOverOutside(bytes); }
    // Bytes the budget still allows (0 when over it), less what is held outside any context
    // (reserveOutside: the read phase's raw upload in flight).
    std::size_t available() const { return m_budget->available(); }

    // ---- fault injection (tests) --------------------------------------------------------------------
    // The n-th allocation from now (n >= 1) throws DeviceOutOfMemory, once; 0 disarms. Also armed from
    // RunContext::testHooks.cudaFailAfterAllocs when the context is created.
    void setFailAfter(std::size_t n) { m_counting->setFailAfter(n); }
    std::size_t failAfter() const { return m_counting->failAfter(); }
    // Allocations (non-empty) requested so far, the injected failure included (tests count a clean run).
    std::size_t allocations() const { return m_counting->allocations(); }

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
    // Peak of (memory in use + memory held outside any context on the device) since the last reset.
    std::size_t highWater() const { return m_budget->highWater(); }
    void resetHighWater() { m_budget->resetHighWater(); }
    std::size_t budget() const { return m_budget->budget(); }
    // An explicit budget (as --gpu-mem-limit).
    void setBudget(std::size_t bytes) { m_budget->setBudget(bytes, true); }
    bool explicitBudget() const { return m_budget->explicitBudget(); }

    // Launch-configuration knob for tests (threads per block of the per-pixel kernels; 0: default).
    // Also read from the environment variable GPUPHOT_CUDA_BLOCK at creation.
    int blockSize() const { return m_blockSize; }
    // The RunContext's tuning (copied on every DeviceContext::of): the engines' alternative paths.
    const BackendTuning& tuning() const { return m_tuning; }
    const TestHooks& testHooks() const { return m_hooks; } // likewise RunContext::testHooks
    void setBlockSize(int threads) { m_blockSize = threads; }

    // ---- frame cache (frame_cache.hpp) ----------------------------------------------------------------
    FrameCache& frames();
    // Bytes held by the frame cache and by the background cache.
    std::size_t cachedFrameBytes() const;
    std::size_t cachedBackgroundBytes() const;
    // Release the frame cache (pixels and mask): strips read from the host instead.
    void dropFrame();
    // The frame's pixels (and mask, null when the view is empty) on the device, row stride = width,
    // uploaded only when (host pointer, size, stride, generation, a sampled fingerprint) changed.
    using DeviceFrame = cuda::DeviceFrame;
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
    void markReadFrame();
    bool holdsReadFrame() const;
    void settleReadFrame(bool pixelsChanged, bool maskChanged);
    // Call after changing a frame's pixels in place (same buffer): the next run re-uploads.
    void bumpGeneration();
    std::uint64_t uploads() const; // frame uploads so far (tests)

    // Background maps on the device, stored by the CUDA background stage and found again by the
    // detection stage from the BackgroundResult's host maps (pointer, size and sampled fingerprint).
    void storeBackground(const Image<float>& level, const Image<float>& rms, DeviceBuffer<float>&& dLevel,
                         DeviceBuffer<float>&& dRms);
    // Device maps for these host maps (uploaded when they are not the stored ones).
    std::pair<const float*, const float*> background(const Image<float>& level, const Image<float>& rms);
    // Maps kept on the device only (the host result has no full maps, kernels/device_maps.hpp), stored
    // under a signature of what determines them (frame size, mesh grid, spline kind); findBackground
    // gives {nullptr, nullptr} when the stored maps have another signature.
    void storeBackground(std::vector<std::uint8_t> signature, DeviceBuffer<float>&& dLevel,
                         DeviceBuffer<float>&& dRms);
    std::pair<const float*, const float*> findBackground(const std::vector<std::uint8_t>& signature) const;
    void dropBackground();

    // ---- stage scratch (scratch_store.hpp) ------------------------------------------------------------
    // The stage's own state of type T in this context (e.g. the prepare stage's resident calibration
    // masters, a stage's GrowingPinned download buffers), value-initialised on first use and kept until the
    // context ends, where it is released before the frame cache and the pool.
    template <class T> T& scratch() { return m_scratch.get<T>(); }

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
    void prepareStaging();
    cudaStream_t m_stream = nullptr;
    int m_device = 0;
    std::size_t m_defaultBudget = 0; // what the device had free at creation: the budget without a limit
    // The memory policy, from the pool up (each layer refers to the one below).
    std::unique_ptr<PoolResource> m_pool;
    std::unique_ptr<BudgetAdaptor> m_budget;
    std::unique_ptr<CountingAdaptor> m_counting;
    std::unique_ptr<FrameCache> m_frames;
    ScratchStore m_scratch;
    PinnedBuffer<unsigned char> m_staging[2];
    cudaEvent_t m_stagingDone[2] = {nullptr, nullptr};
    int m_blockSize = 0;
    BackendTuning m_tuning;
    TestHooks m_hooks;
    std::string m_planMode, m_planNote;
    int m_planStrips = 0;
    std::size_t m_stagingChunk = std::size_t(32) << 20;
    std::uint64_t m_stagedBytes = 0;
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
