#include "kernels/host_copy.hpp"

#include <omp.h>

#include <algorithm>
#include <cstring>

namespace gpuphot::cuda {

void parallelCopy(void* dst, const void* src, std::size_t bytes) {
    constexpr std::size_t kPiece = std::size_t(1) << 20;
    const long long pieces = static_cast<long long>((bytes + kPiece - 1) / kPiece);
    auto* d = static_cast<unsigned char*>(dst);
    const auto* s = static_cast<const unsigned char*>(src);
    const int threads = static_cast<int>(std::min<long long>(pieces, omp_get_max_threads()));
#pragma omp parallel for schedule(static) num_threads(std::max(threads, 1)) if (pieces > 1)
    for (long long p = 0; p < pieces; ++p) {
        const std::size_t off = static_cast<std::size_t>(p) * kPiece;
        std::memcpy(d + off, s + off, std::min(kPiece, bytes - off));
    }
}

} // namespace gpuphot::cuda
