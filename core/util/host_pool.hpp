#pragma once
// Large host buffers kept for reuse (Image<T>::Recycled: a frame's pixels and mask). A 151 MP frame's
// pixels and mask are 755 MB of fresh pages per frame; their first touch (the kernel's page faults and
// zero-filling) cost more than the read's conversion itself. A buffer of at least kMinPooledBytes given
// back here is kept, and the next request for exactly as many bytes (the next frame of a night, the next
// repeat of a benchmark) takes it, resident. Kept buffers are bounded by the capacity (oldest given back
// first); a request that fails frees every kept buffer and tries again, so the pool never makes an
// allocation fail. Under AddressSanitizer nothing is kept (a use after free must still be seen).
#include <cstddef>

namespace gpuphot::hostpool {

// Smaller buffers go straight to the allocator (glibc keeps those itself).
inline constexpr std::size_t kMinPooledBytes = std::size_t(16) << 20;

// A buffer of `bytes` (a kept one when its size matches). Throws std::bad_alloc (AllocationFailed).
void* allocate(std::size_t bytes);
// Gives back a buffer from allocate(bytes): kept, or freed when it is small or does not fit the capacity.
void release(void* p, std::size_t bytes) noexcept;

struct Stats {
    std::size_t keptBuffers = 0;
    std::size_t keptBytes = 0;
    std::size_t capacity = 0;
    std::size_t reused = 0; // requests served by a kept buffer, since the start of the process
};
Stats stats();

// Bytes the pool may keep; frees what is over it. Default: 1/8 of the machine's memory, at most 4 GiB.
void setCapacity(std::size_t bytes);
// Frees every kept buffer.
void trim() noexcept;

} // namespace gpuphot::hostpool
