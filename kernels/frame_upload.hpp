#pragma once
// The read phase's upload of a frame (issue 5, "one upload of the frame as the raw integer type, converted
// on the GPU, overlapped with the decode"): a RawChunkSink for readFrame. Each reader thread of
// readRawImage preads its chunk into its own pinned buffer; the chunk goes to the device on a copy stream
// (into the reader's device slot) and is converted there (byte swap, BLANK -> NaN, BSCALE/BZERO in double:
// convertRawPixels's rules, bitwise its floats) into the device frame, with the mask readFrame's rule
// gives, while the reader converts the same bytes on the host and reads its next chunk. No RunContext: the
// read may run on another thread beside a DeviceContext busy with another frame; the copy stream, memory
// pool, pinned buffers and device slots belong to the process (one set per device, one read at a time:
// a second concurrent read is declined and keeps the host path). adoptInto hands the finished frame to a
// DeviceContext's frame cache (DeviceContext::adoptFrame): the first stage uploads nothing.
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
    std::size_t chunkBytes() const override { return m_chunkBytes; }
    std::vector<unsigned char*> start(int threads, std::size_t chunkBytes) override;
    void reuse(int thread) override;
    void chunk(int thread, std::size_t first, std::size_t n) override;
    void finish() override;

    // Raw bytes per chunk (0: readRawImage's 8 MiB); tests split rows with small ones.
    void setChunkBytes(std::size_t bytes) { m_chunkBytes = bytes; }

    // After finish: the device frame (row stride = width) and its mask, complete; null when not ready.
    bool ready() const { return m_ready; }
    const std::string& problem() const { return m_problem; } // why not ready
    const float* pixels() const { return m_ready ? m_pixels : nullptr; }
    const std::uint8_t* mask() const { return m_ready ? m_mask : nullptr; }
    int width() const { return m_width; }
    int height() const { return m_height; }
    std::size_t chunks() const { return m_chunks.load(); } // chunks uploaded (tests)

    // Gives the frame to dc's frame cache as the values of these host views (the frame readFrame filled),
    // the mask only when withMask (else the first stage uploads the host mask). False, nothing taken, when
    // not ready, on another device, the views do not match the size, or the budget has no room.
    bool adoptInto(DeviceContext& dc, const ImageView& pixels, const MaskView& mask, bool withMask);

private:
    struct Resources;
    void fail(const std::string& why) noexcept;
    void release() noexcept; // frees the device frame still owned

    Resources* m_res = nullptr;
    std::unique_lock<std::mutex> m_busy;
    RawImageLayout m_layout;
    RawMaskRule m_rule;
    int m_width = 0, m_height = 0, m_device = 0;
    std::size_t m_chunkBytes = 0;
    float* m_pixels = nullptr;
    std::uint8_t* m_mask = nullptr;
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

} // namespace gpuphot::cuda
