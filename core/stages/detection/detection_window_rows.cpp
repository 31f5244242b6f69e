// windowExpRow (detection_window_rows.hpp): the window's weights of a row in one vectorised loop.
#include "core/stages/detection/detection_window_rows.hpp"

#include <bit>
#include <cmath>
#include <cstdint>

namespace gpuphot::detail {

// windowExp's operations in the same order, 2^k from its exponent bits (windowExp's product branch: |k| <=
// 1000 here). The AVX2 clone vectorises (its floor is one instruction; this file is compiled with
// -fno-trapping-math, which lets the compiler evaluate the clamp's both arms and changes no value); no fused
// multiply-adds in either clone (-ffp-contract=off), so the same bits as windowExp.
__attribute__((target_clones("avx2", "default"))) void windowExpRow(const double* x, double* out, int n) {
    const double kInvLn2 = 1.4426950408889634074;
    const double kLn2Hi = 6.93147180369123816490e-01;
    const double kLn2Lo = 1.90821492927058770002e-10;
#pragma omp simd
    for (int i = 0; i < n; ++i) {
        const double xi = x[i] > -690.0 ? x[i] : -690.0;
        const double k = std::floor(xi * kInvLn2 + 0.5);
        const double r = (xi - k * kLn2Hi) - k * kLn2Lo;
        double p = 1.0 / 6227020800.0;
        p = p * r + 1.0 / 479001600.0;
        p = p * r + 1.0 / 39916800.0;
        p = p * r + 1.0 / 3628800.0;
        p = p * r + 1.0 / 362880.0;
        p = p * r + 1.0 / 40320.0;
        p = p * r + 1.0 / 5040.0;
        p = p * r + 1.0 / 720.0;
        p = p * r + 1.0 / 120.0;
        p = p * r + 1.0 / 24.0;
        p = p * r + 1.0 / 6.0;
        p = p * r + 0.5;
        p = p * r + 1.0;
        const double y = 1.0 + r * p;
        const auto bits = static_cast<std::uint64_t>(static_cast<std::int64_t>(static_cast<int>(k)) + 1023)
                          << 52;
        out[i] = y * std::bit_cast<double>(bits);
    }
}

} // namespace gpuphot::detail
