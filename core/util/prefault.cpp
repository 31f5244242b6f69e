#include "core/util/prefault.hpp"

#include <algorithm>

#include <omp.h>

namespace gpuphot {

void prefaultBytes(unsigned char* bytes, std::size_t n, int threads) {
    constexpr std::size_t kChunk = std::size_t{1} << 16;
    const auto chunks = static_cast<long long>((n + kChunk - 1) / kChunk);
    const int team = threads > 0 ? threads : omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(team) if (chunks > 4)
    for (long long c = 0; c < chunks; ++c) {
        const std::size_t at = static_cast<std::size_t>(c) * kChunk;
        std::memset(bytes + at, 0, std::min(kChunk, n - at));
    }
}

} // namespace gpuphot
