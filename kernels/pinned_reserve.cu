#include "kernels/pinned_reserve.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <mutex>
#include <string>

#include "core/util/timeline.hpp"
#include "kernels/frame_upload.hpp"
#include "kernels/memory_resource.hpp"

namespace gpuphot::cuda {
namespace {

constexpr std::size_t kSlab = std::size_t(64) << 20;
constexpr std::size_t kAlign = 256;

struct Slab {
    unsigned char* base = nullptr;
    std::size_t size = 0;
    std::size_t used = 0; // bump offset
    std::size_t live = 0; // pieces handed out and not released
};

// Process-wide; the slabs are never freed (the CUDA runtime may be gone at exit).
struct Reserve {
    std::mutex mu;
    std::deque<Slab> slabs; // a deque: a Slab* stays valid while slabs are added
    PinnedStats stats;
};
Reserve& reserve() {
    static Reserve* r = new Reserve;
    return *r;
}

// The slab that holds p, or null.
Slab* slabOf(Reserve& r, const void* p) {
    const auto* q = static_cast<const unsigned char*>(p);
    for (Slab& s : r.slabs)
        if (q >= s.base && q < s.base + s.size) return &s;
    return nullptr;
}

} // namespace

void reservePinned(std::size_t bytes) noexcept {
    Reserve& r = reserve();
    while (bytes > 0) {
        const std::size_t size = std::min(bytes, kSlab);
        void* p = nullptr;
        if (cudaMallocHost(&p, size) != cudaSuccess) {
            cudaGetLastError();
            return;
        }
        std::lock_guard lock(r.mu);
        r.slabs.push_back(Slab{static_cast<unsigned char*>(p), size, 0, 0});
        r.stats.reserved += size;
        bytes -= size;
    }
}

void* pinnedAllocate(std::size_t bytes) {
    const std::size_t need = (bytes + kAlign - 1) / kAlign * kAlign;
    {
        Reserve& r = reserve();
        std::lock_guard lock(r.mu);
        for (Slab& s : r.slabs)
            if (s.size - s.used >= need) {
                void* p = s.base + s.used;
                s.used += need;
                ++s.live;
                r.stats.served += need;
                return p;
            }
        r.stats.fresh += bytes;
    }
    void* p = nullptr;
    const auto t0 = std::chrono::steady_clock::now();
    const cudaError_t e = cudaMallocHost(&p, bytes);
    if (timelineEnabled()) { // `reduce -v`: what the reserve did not cover, and what pinning it cost
        char what[96];
        std::snprintf(
            what, sizeof what, "pinned on demand: %.1f MiB in %.1f ms", bytes / 1048576.0,
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        timelineMark(what);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        throw DeviceOutOfMemory("PinnedBuffer: cudaMallocHost of " + std::to_string(bytes) +
                                " bytes failed: " + cudaGetErrorString(e));
    }
    return p;
}

void pinnedRelease(void* p) noexcept {
    if (!p) return;
    Reserve& r = reserve();
    Slab* s = nullptr;
    {
        std::lock_guard lock(r.mu);
        s = slabOf(r, p);
        if (s && (s->live == 0 || --s->live > 0)) return; // the memory is not handed out again yet
    }
    if (!s) {
        cudaFreeHost(p);
        return;
    }
    // The slab's last piece: once the device has finished what was queued into any of its pieces, the
    // slab is handed out again from its start (unless a piece was taken meanwhile).
    if (cudaDeviceSynchronize() != cudaSuccess) cudaGetLastError();
    std::lock_guard lock(r.mu);
    if (s->live == 0) s->used = 0;
}

PinnedStats pinnedStats() {
    Reserve& r = reserve();
    std::lock_guard lock(r.mu);
    return r.stats;
}

void warmUpPinned(int mib) noexcept {
    static std::atomic<bool> done{false};
    if (done.exchange(true)) return;
    const std::size_t bytes = pinnedReserveBytes(rawReadHintPixels(), mib);
    reservePinned(bytes);
    if (timelineEnabled()) {
        char what[80];
        std::snprintf(what, sizeof what, "device warm-up: %.0f MiB pinned ahead",
                      pinnedStats().reserved / 1048576.0);
        timelineMark(what);
    }
}

std::size_t pinnedReserveBytes(std::size_t pixels, int mib) {
    if (mib >= 0) return static_cast<std::size_t>(mib) << 20;
    return std::min(pixels * 2, std::size_t(512) << 20);
}

} // namespace gpuphot::cuda
