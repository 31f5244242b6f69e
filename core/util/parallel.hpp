#pragma once
// Exceptions and OpenMP. An exception that leaves an OpenMP parallel region ends the program
// (std::terminate: "terminate called after throwing ..."), so every region whose body can throw (an
// allocation, a typed error from a helper) runs its body through a ParallelErrors: the first exception is
// kept, the remaining iterations are skipped, and the calling thread rethrows it after the region.
//
//     ParallelErrors errors;
//     #pragma omp parallel for
//     for (long i = 0; i < n; ++i)
//         errors.run([&] { body(i); });
//     errors.rethrow();
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <utility>
#include <vector>

#include <omp.h>

namespace gpuphot {

class ParallelErrors {
public:
    // Runs f unless an earlier call failed; keeps the first exception instead of letting it escape.
    template <class F> void run(F&& f) noexcept {
        if (m_failed.load(std::memory_order_relaxed)) return;
        try {
            std::forward<F>(f)();
        } catch (...) {
            std::lock_guard lock(m_mu);
            if (!m_error) m_error = std::current_exception();
            m_failed.store(true, std::memory_order_relaxed);
        }
    }
    bool failed() const { return m_failed.load(std::memory_order_relaxed); }
    // On the thread that opened the region, after it: throws the kept exception, if any.
    void rethrow() {
        if (m_error) std::rethrow_exception(std::exchange(m_error, nullptr));
    }

private:
    std::mutex m_mu;
    std::exception_ptr m_error;
    std::atomic<bool> m_failed{false};
};

// The positions i in [0, n) where keep(i) holds, in ascending order, on `threads` threads (<= 0: OpenMP's
// default): keep(i) for every i in fixed chunks, each chunk's count, then resize(m) (m kept; on the calling
// thread) and fill(k, i) for the k-th kept position i, chunk by chunk in parallel. Every k gets the same i
// whatever the thread count, so the output is the one a serial loop of push_backs gives. keep and fill must
// not throw; resize may.
template <class Keep, class Resize, class Fill>
void compactInOrder(std::size_t n, int threads, Keep&& keep, Resize&& resize, Fill&& fill) {
    constexpr std::size_t kChunk = 16384;
    const std::size_t nChunks = (n + kChunk - 1) / kChunk;
    const int nt = threads > 0 ? threads : omp_get_max_threads();
    std::vector<std::uint8_t> kept(n);
    std::vector<std::size_t> at(nChunks + 1, 0);
#pragma omp parallel for schedule(static) num_threads(nt) if (nChunks > 1)
    for (long long c = 0; c < static_cast<long long>(nChunks); ++c) {
        const std::size_t b = static_cast<std::size_t>(c) * kChunk, e = std::min(n, b + kChunk);
        std::size_t count = 0;
        for (std::size_t i = b; i < e; ++i) {
            kept[i] = keep(i) ? 1 : 0;
            count += kept[i];
        }
        at[static_cast<std::size_t>(c) + 1] = count;
    }
    for (std::size_t c = 0; c < nChunks; ++c)
        at[c + 1] += at[c];
    resize(at[nChunks]);
#pragma omp parallel for schedule(static) num_threads(nt) if (nChunks > 1)
    for (long long c = 0; c < static_cast<long long>(nChunks); ++c) {
        const std::size_t b = static_cast<std::size_t>(c) * kChunk, e = std::min(n, b + kChunk);
        std::size_t k = at[static_cast<std::size_t>(c)];
        for (std::size_t i = b; i < e; ++i)
            if (kept[i]) fill(k++, i);
    }
}

// The per-chunk vectors `chunks` one after the other into `out`, in chunk order (each chunk copied to its
// place in parallel, then freed): what appending them in a loop gives, for any thread count.
template <class T> void concatChunks(std::vector<std::vector<T>>& chunks, std::vector<T>& out, int threads) {
    const std::size_t nChunks = chunks.size();
    std::vector<std::size_t> at(nChunks + 1, 0); // each chunk's place in the concatenation
    for (std::size_t c = 0; c < nChunks; ++c)
        at[c + 1] = at[c] + chunks[c].size();
    out.resize(at[nChunks]);
#pragma omp parallel for schedule(static) num_threads(std::max(1, threads)) if (nChunks > 1)
    for (long long c = 0; c < static_cast<long long>(nChunks); ++c) {
        std::copy(chunks[c].begin(), chunks[c].end(), out.begin() + static_cast<std::ptrdiff_t>(at[c]));
        std::vector<T>().swap(chunks[c]);
    }
}

} // namespace gpuphot
