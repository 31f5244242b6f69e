// windowExpRow (detection_window_rows.hpp): the window's weights of a row in one vectorised loop.
#include "core/stages/detection/detection_window_rows.hpp"

#include <bit>
#include <cmath>
#include <cstdint>

namespace gpuphot::detail {

// windowExp's pieces (detection_window.hpp), 2^k from its exponent bits (windowExp's product branch: |k| <=
// 1000 here). The AVX2 clone vectorises (its floor is one instruction; this file is compiled with
// -fno-trapping-math, which lets the compiler evaluate the clamp's both arms and changes no value); no fused
// multiply-adds in either clone (-ffp-contract=off), so the same bits as windowExp.
__attribute__((target_clones("avx2", "default"))) void windowExpRow(const double* x, double* out, int n) {
#pragma omp simd
    for (int i = 0; i < n; ++i) {
        const double xi = x[i] > -690.0 ? x[i] : -690.0;
        const double k = windowExpK(xi);
        const double y = windowExpReduced(windowExpR(xi, k));
        const auto bits = static_cast<std::uint64_t>(static_cast<std::int64_t>(static_cast<int>(k)) + 1023)
                          << 52;
        out[i] = y * std::bit_cast<double>(bits);
    }
}

} // namespace gpuphot::detail
