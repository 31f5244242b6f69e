#include "core/model/pixel_stats.hpp"

#include <algorithm>
#include <cmath>

namespace gpuphot {

// Branch-free so that the compiler vectorises it (NaN and +-inf fail the magnitude test, masked pixels the
// mask test); 32-bit counters as the floats' lanes, so n stays below 2^32 per call.
namespace {
PixelStats piece(const float* px, const std::uint8_t* m, std::size_t n, std::uint8_t saturatedBits) {
    constexpr float kMax = std::numeric_limits<float>::max();
    constexpr float kInf = std::numeric_limits<float>::infinity();
    float lo = kInf, hi = -kInf;
    unsigned valid = 0, saturated = 0;
    const unsigned satBits = saturatedBits;
    if (m) {
#pragma omp simd reduction(+ : valid, saturated) reduction(min : lo) reduction(max : hi)
        for (std::size_t i = 0; i < n; ++i) {
            const float v = px[i];
            const unsigned mk = m[i];
            const bool ok = (std::fabs(v) <= kMax) & (mk == 0u);
            saturated += (mk & satBits) != 0u ? 1u : 0u;
            valid += ok ? 1u : 0u;
            lo = std::min(lo, ok ? v : kInf);
            hi = std::max(hi, ok ? v : -kInf);
        }
    } else {
#pragma omp simd reduction(+ : valid) reduction(min : lo) reduction(max : hi)
        for (std::size_t i = 0; i < n; ++i) {
            const float v = px[i];
            const bool ok = std::fabs(v) <= kMax;
            valid += ok ? 1u : 0u;
            lo = std::min(lo, ok ? v : kInf);
            hi = std::max(hi, ok ? v : -kInf);
        }
    }
    PixelStats s;
    s.pixels = n;
    s.valid = valid;
    s.saturated = saturated;
    s.lo = lo;
    s.hi = hi;
    return s;
}
} // namespace

PixelStats pixelStats(const float* px, const std::uint8_t* mask, std::size_t n, std::uint8_t saturatedBits) {
    constexpr std::size_t kPiece = std::size_t(1) << 30;
    PixelStats s;
    for (std::size_t at = 0; at < n; at += kPiece)
        s.merge(piece(px + at, mask ? mask + at : nullptr, std::min(kPiece, n - at), saturatedBits));
    return s;
}

} // namespace gpuphot
