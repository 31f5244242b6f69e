#pragma once
// Page-locked host memory: PinnedBuffer (one array, move-only) and GrowingPinned (a download or upload
// buffer a stage keeps between calls in its scratch, grown on demand).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>

#include "kernels/memory_resource.hpp"
#include "kernels/pinned_reserve.hpp"

namespace gpuphot::cuda {

// Page-locked host array (the pinned reserve or cudaMallocHost: kernels/pinned_reserve.hpp), move-only.
template <class T> class PinnedBuffer {
public:
    PinnedBuffer() = default;
    explicit PinnedBuffer(std::size_t count) : m_count(count) {
        if (count) m_ptr = static_cast<T*>(pinnedAllocate(count * sizeof(T)));
    }
    ~PinnedBuffer() { pinnedRelease(m_ptr); }
    PinnedBuffer(PinnedBuffer&& o) noexcept
        : m_count(std::exchange(o.m_count, 0)), m_ptr(std::exchange(o.m_ptr, nullptr)) {}
    PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
        if (this != &o) {
            pinnedRelease(m_ptr);
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

// Reusable pinned host memory for a stage's downloads and uploads, kept in its scratch (DeviceContext::
// scratch) between calls and grown on demand with room: half as much again, at most 32 MiB more (pinning
// costs milliseconds per buffer, and the workbench's next frame or re-run at a lower threshold needs a
// little more; at 151 MP the first re-run that grew every detection buffer at its exact size paid ~30 ms).
// Growing frees the old buffer first, which synchronises the device: take the buffer before queuing copies
// into it. Empty until the first request of more than 0 bytes (get then gives null).
class GrowingPinned {
public:
    void* get(std::size_t bytes) {
        if (m_buffer.size() < bytes) {
            const std::size_t room = bytes + std::min<std::size_t>(bytes / 2, std::size_t{32} << 20);
            m_buffer = PinnedBuffer<unsigned char>(); // free first
            m_buffer = PinnedBuffer<unsigned char>(room);
        }
        return m_buffer.get();
    }
    std::size_t capacity() const { return m_buffer.size(); }

private:
    PinnedBuffer<unsigned char> m_buffer;
};

} // namespace gpuphot::cuda
