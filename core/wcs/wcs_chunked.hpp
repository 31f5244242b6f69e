#pragma once
// Batched Wcs transforms in parallel: a Wcs serialises concurrent calls, so each thread works on its own
// copy; every point transforms on its own, so the result does not depend on the thread count.
#include <algorithm>
#include <cstddef>
#include <optional>

#include "core/util/parallel.hpp"
#include "core/wcs/wcs.hpp"

namespace gpuphot {

// fn(wcs, begin, count) for fixed chunks of [0, n), in parallel on `threads` threads, each with its own
// copy of the WCS (one call on `wcs` itself when there is a single chunk or thread).
template <class Fn> void transformChunked(const Wcs& wcs, std::size_t n, int threads, Fn&& fn) {
    constexpr std::size_t kChunk = 16384;
    const long long chunks = static_cast<long long>((n + kChunk - 1) / kChunk);
    if (chunks <= 1 || threads <= 1) {
        if (n > 0) fn(wcs, std::size_t{0}, n);
        return;
    }
    ParallelErrors errors;
#pragma omp parallel num_threads(threads)
    {
        std::optional<Wcs> local;
        errors.run([&] { local.emplace(wcs); });
#pragma omp for schedule(static)
        for (long long c = 0; c < chunks; ++c)
            errors.run([&] {
                const std::size_t begin = static_cast<std::size_t>(c) * kChunk;
                fn(*local, begin, std::min(n, begin + kChunk) - begin);
            });
    }
    errors.rethrow();
}

} // namespace gpuphot
