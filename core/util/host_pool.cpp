#include "core/util/host_pool.hpp"

#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <new>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define GPUPHOT_POOL_KEEPS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GPUPHOT_POOL_KEEPS 0
#endif
#endif
#ifndef GPUPHOT_POOL_KEEPS
#define GPUPHOT_POOL_KEEPS 1
#endif

namespace gpuphot::hostpool {

namespace {

struct Kept {
    void* p;
    std::size_t bytes;
};

std::size_t defaultCapacity() {
    if (!GPUPHOT_POOL_KEEPS) return 0;
    const long pages = ::sysconf(_SC_PHYS_PAGES), pageSize = ::sysconf(_SC_PAGE_SIZE);
    const std::size_t machine = pages > 0 && pageSize > 0 ? std::size_t(pages) * std::size_t(pageSize) : 0;
    return std::min(machine / 8, std::size_t(4) << 30);
}

struct Pool {
    std::mutex m;
    std::vector<Kept> kept; // oldest first
    std::size_t keptBytes = 0;
    std::size_t capacity = defaultCapacity();
    std::size_t reused = 0;

    // Removes the oldest kept buffers until `room` more bytes fit; returns them (freed by the caller,
    // outside the lock).
    std::vector<Kept> makeRoom(std::size_t room) {
        std::vector<Kept> out;
        std::size_t n = 0;
        while (n < kept.size() && keptBytes + room > capacity) {
            keptBytes -= kept[n].bytes;
            out.push_back(kept[n++]);
        }
        kept.erase(kept.begin(), kept.begin() + static_cast<std::ptrdiff_t>(n));
        return out;
    }
};

Pool& pool() {
    static Pool* p = new Pool; // never destroyed: images may be released during static destruction
    return *p;
}

void freeAll(const std::vector<Kept>& buffers) noexcept {
    for (const Kept& k : buffers)
        ::operator delete[](k.p);
}

// A kept buffer of exactly `bytes`, the most recently given back; nullptr when none.
void* takeKept(std::size_t bytes) {
    Pool& P = pool();
    std::lock_guard lock(P.m);
    for (std::size_t i = P.kept.size(); i-- > 0;)
        if (P.kept[i].bytes == bytes) {
            void* p = P.kept[i].p;
            P.kept.erase(P.kept.begin() + static_cast<std::ptrdiff_t>(i));
            P.keptBytes -= bytes;
            ++P.reused;
            return p;
        }
    return nullptr;
}

} // namespace

void* allocate(std::size_t bytes) {
    if (bytes < kMinPooledBytes) return ::operator new[](bytes);
    if (void* p = takeKept(bytes)) return p;
    try {
        return ::operator new[](bytes);
    } catch (const std::bad_alloc&) {
        trim(); // the kept buffers may be what stands in the way (e.g. under `ulimit -v`)
        return ::operator new[](bytes);
    }
}

void release(void* p, std::size_t bytes) noexcept {
    if (!p) return;
    if (bytes < kMinPooledBytes) {
        ::operator delete[](p);
        return;
    }
    Pool& P = pool();
    std::vector<Kept> evicted;
    bool keep = false;
    try {
        std::lock_guard lock(P.m);
        if (bytes <= P.capacity) {
            evicted = P.makeRoom(bytes);
            P.kept.push_back({p, bytes});
            P.keptBytes += bytes;
            keep = true;
        }
    } catch (...) { // no memory for the bookkeeping: free the buffer instead
    }
    freeAll(evicted);
    if (!keep) ::operator delete[](p);
}

Stats stats() {
    Pool& P = pool();
    std::lock_guard lock(P.m);
    return {P.kept.size(), P.keptBytes, P.capacity, P.reused};
}

void setCapacity(std::size_t bytes) {
    Pool& P = pool();
    std::vector<Kept> evicted;
    {
        std::lock_guard lock(P.m);
        P.capacity = GPUPHOT_POOL_KEEPS ? bytes : 0;
        evicted = P.makeRoom(0);
    }
    freeAll(evicted);
}

void trim() noexcept {
    Pool& P = pool();
    std::vector<Kept> all;
    {
        std::lock_guard lock(P.m);
        all.swap(P.kept);
        P.keptBytes = 0;
    }
    freeAll(all);
}

} // namespace gpuphot::hostpool
