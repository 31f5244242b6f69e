#pragma once
// The read phase's upload of a frame (one upload of the frame as the raw integer type, converted on the
// GPU, overlapped with the decode): a RawChunkSink for readFrame. Each reader thread of
// readRawImage preads its chunk into its own pinned buffer; the chunk goes to the device on a copy stream
// (into the reader's device slot) and is converted there (byte swap, BLANK -> NaN, BSCALE/BZERO in double:
// convertRawPixels's rules, bitwise its floats) into the device frame, with the mask readFrame's rule
// gives, while the reader converts the same bytes on the host and reads its next chunk. No RunContext: the
// read may run on another thread beside a DeviceContext busy with another frame; the copy stream, memory
// pool, pinned buffers and device slots belong to the process (one set per device, one read at a time:
// a second concurrent read is declined and keeps the host path). adoptInto hands the finished frame to a
// DeviceContext's frame cache (DeviceContext::adoptFrame): the first stage uploads nothing.
//
// Memory (the memory budget): the device frame and the reader slots are reserved outside the contexts'
// budgets while the upload holds them (reserveOutside, kernels/memory_resource.hpp): every live DeviceContext
// on the device counts them, and a read that does not fit every explicit budget (--gpu-mem-limit) keeps the
// host path. The pinned reader buffers are host memory: chunks are sized so that they hold about the frame's
// raw bytes (rawUploadChunkBytes), never more than the 8 MiB chunks of a large frame per reader. The warm-up
// thread allocates them when the process is idle (warmUpRawUpload: no read has begun yet), else the first
// uploaded read does, on the reader thread. Every allocation is RAII and checked; a failure (or an injected
// one, setRawUploadFailAfter) leaves the upload not ready and the read on the host path, never an error of
// the read.
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/io/fits_raw_read.hpp"
#include "core/model/image.hpp"

namespace gpuphot::cuda {

class DeviceContext;

class RawFrameUpload final : public RawChunkSink {
public:
    RawFrameUpload();
    ~RawFrameUpload() override;
    RawFrameUpload(const RawFrameUpload&) = delete;
    RawFrameUpload& operator=(const RawFrameUpload&) = delete;

    // RawChunkSink. begin declines (false) when another read holds the upload resources, or the device
    // frame cannot be allocated; errors after begin leave the upload not ready (the host read goes on).
    bool begin(const RawImageLayout& layout, int width, int height, const RawMaskRule& rule) override;
    std::size_t chunkBytes() const override { return m_readChunkBytes; }
    std::vector<unsigned char*> start(int threads, std::size_t chunkBytes) override;
    void reuse(int thread) override;
    void chunk(int thread, std::size_t first, std::size_t n) override;
    void finish() override;

    // Raw bytes per chunk (0: rawUploadChunkBytes); tests split rows with small ones.
    void setChunkBytes(std::size_t bytes) { m_chunkBytes = bytes; }

    // After finish: the device frame (row stride = width) and its mask, complete; null when not ready.
    bool ready() const { return m_ready; }
    const std::string& problem() const { return m_problem; } // why not ready
    const float* pixels() const;
    const std::uint8_t* mask() const;
    int width() const { return m_width; }
    int height() const { return m_height; }
    std::size_t chunks() const { return m_chunks.load(); } // chunks uploaded (tests)

    // Gives the frame to dc's frame cache as the values of these host views (the frame readFrame filled),
    // the mask only when withMask (else the first stage uploads the host mask). False, nothing taken, when
    // not ready, on another device, the views do not match the size, or the budget has no room.
    bool adoptInto(DeviceContext& dc, const ImageView& pixels, const MaskView& mask, bool withMask);

    struct Resources; // per device, for the process (frame_upload.cu)

private:
    struct Held; // the device frame, mask and reader slots of this read (RAII, reserved outside)
    void fail(const std::string& why) noexcept;
    void release() noexcept; // frees the device memory still owned

    Resources* m_res = nullptr;
    std::unique_lock<std::mutex> m_busy;
    RawImageLayout m_layout;
    RawMaskRule m_rule;
    int m_width = 0, m_height = 0, m_device = 0;
    std::size_t m_chunkBytes = 0;     // setChunkBytes (tests); 0: rawUploadChunkBytes
    std::size_t m_readChunkBytes = 0; // this read's (begin)
    std::size_t m_slotBytes = 0;      // device slot per reader (start)
    std::unique_ptr<Held> m_held;
    std::atomic<bool> m_failed{false};
    std::atomic<std::size_t> m_chunks{0};
    bool m_ready = false;
    std::string m_problem;
    std::mutex m_problemMutex;
    std::vector<std::vector<unsigned char>> m_hostFallback; // buffers for the readers after a failed start
};

// Called when a DeviceContext was created (the CUDA context is up): until then begin() declines, so that
// the first frame's read overlaps the context's creation instead of waiting for it (unless the
// environment variable GPUPHOT_RAW_UPLOAD is "wait").
void noteDeviceReady();

// Registers createRawUpload / adoptRawUpload with core's stage table (called by device_context.cu).
void registerFrameUpload();

// Raw bytes per chunk of a read of rawBytes by `threads` readers: about rawBytes / threads, rounded up to
// 64 KiB, between 64 KiB and 8 MiB (readRawImage's default), and at most rawBytes. The pinned reader
// buffers (one chunk per reader) thus hold at most about max(rawBytes, threads * 64 KiB).
std::size_t rawUploadChunkBytes(std::size_t rawBytes, int threads);

// Initialises the upload's resources and allocates the pinned reader buffers for the
// frame whose read has begun meanwhile (RawFrameUpload::begin notes its size and reader count, even when
// it declines), else for 8 MiB chunks and omp_get_max_threads() readers; without an explicit GPU memory
// limit it also warms the upload's pool with that frame's device memory (kept by the pool for the first
// uploaded read). Errors are swallowed: the read then allocates what it needs itself or keeps the host path.
void prepareRawUpload(std::size_t gpuMemLimit) noexcept;

// What startDeviceWarmUp's thread calls (CudaStageTable::prepareRawUpload): prepareRawUpload only when no
// read has begun in this process yet (a worker or workbench waiting for its first frame). When the first
// frame's read began before the context was up (a cold `reduce`: that read keeps the host path), its stages
// follow at once, and preparing then competed with them (+0.1-0.2 s on a cold 151 MP reduce): the first
// uploaded read allocates its buffers itself, on the reader thread.
void warmUpRawUpload(std::size_t gpuMemLimit) noexcept;

// Pinned host bytes of the upload's reader buffers on the current device, and of one of them (tests).
std::size_t rawUploadPinnedBytes();
std::size_t rawUploadSlotBytes();
// The pixels of the latest read that began (0: none yet): what the warm-up sizes its pinned reserve by.
std::size_t rawReadHintPixels();

// ---- fault injection (tests: an allocation failure is re-planned, never a crash) ------------------------
// The n-th allocation of the raw upload from now (device frame, mask, reader slots, pinned buffers; n >= 1)
// fails once as if the device or the host had no memory left; 0 disarms.
void setRawUploadFailAfter(std::size_t n);
std::size_t rawUploadFailAfter();
// Allocations the raw upload attempted so far (the injected failures included).
std::size_t rawUploadAllocations();

} // namespace gpuphot::cuda
