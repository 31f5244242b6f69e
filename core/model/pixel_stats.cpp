#include "core/model/pixel_stats.hpp"

#include <algorithm>
#include <cmath>

namespace gpuphot {

// Branch-free so that the compiler vectorises it (NaN and +-inf fail the magnitude test, masked pixels the
// mask test): the saturated count over the mask bytes alone, then the valid pixels' count and range with
// 32-bit counters as the floats' lanes (n stays below 2^31 per call) and selects that never see a NaN.
namespace {
PixelStats piece(const float* px, const std::uint8_t* m, std::size_t n, std::uint8_t saturatedBits) {
    constexpr float kMax = std::numeric_limits<float>::max();
    constexpr float kInf = std::numeric_limits<float>::infinity();
    const int count = static_cast<int>(n);
    unsigned saturated = 0;
    int valid = 0;
    float lo = kInf, hi = -kInf;
    if (m) {
        for (int i = 0; i < count; ++i)
            saturated += (m[i] & saturatedBits) != 0 ? 1u : 0u;
#pragma omp simd reduction(+ : valid) reduction(min : lo) reduction(max : hi)
        for (int i = 0; i < count; ++i) {
            const float v = px[i];
            const int ok = (std::fabs(v) <= kMax) & (m[i] == 0);
            valid += ok;
            const float a = ok ? v : kInf, b = ok ? v : -kInf;
            lo = lo < a ? lo : a;
            hi = hi > b ? hi : b;
        }
    } else {
#pragma omp simd reduction(+ : valid) reduction(min : lo) reduction(max : hi)
        for (int i = 0; i < count; ++i) {
            const float v = px[i];
            const int ok = std::fabs(v) <= kMax;
            valid += ok;
            const float a = ok ? v : kInf, b = ok ? v : -kInf;
            lo = lo < a ? lo : a;
            hi = hi > b ? hi : b;
        }
    }
    PixelStats s;
    s.pixels = n;
    s.valid = static_cast<std::size_t>(valid);
    s.saturated = saturated;
    s.lo = lo;
    s.hi = hi;
    return s;
}
} // namespace

PixelStats pixelStats(const float* px, const std::uint8_t* mask, std::size_t n, std::uint8_t saturatedBits) {
    constexpr std::size_t kPiece = std::size_t(1) << 30; // within the int counters
    PixelStats s;
    for (std::size_t at = 0; at < n; at += kPiece)
        s.merge(piece(px + at, mask ? mask + at : nullptr, std::min(kPiece, n - at), saturatedBits));
    return s;
}

} // namespace gpuphot
