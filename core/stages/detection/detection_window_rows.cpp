// windowExpRow and windowTermsRow (detection_window_rows.hpp): a window's row in vectorised loops.
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

// windowTerms' expressions in its order for every pixel; its conditions become selects and the keep mask
// (the quotient v / gain is computed for every pixel and kept only where windowTerms adds it).
__attribute__((target_clones("avx2", "default"))) void
windowTermsRow(const WindowState& s, const WindowConfig& p, std::int32_t segId, int xa, int yy, int n,
               const WindowRowPixels& px, double* term, std::uint8_t* keep) {
    const auto un = static_cast<std::size_t>(n);
    double* __restrict sw = term;
    double* __restrict swx = term + un;
    double* __restrict swy = term + 2 * un;
    double* __restrict sex = term + 3 * un;
    double* __restrict sey = term + 4 * un;
    std::uint8_t* __restrict kept = keep;
    const double* __restrict wp = px.w;
    const float* __restrict subp = px.sub;
    const float* __restrict rmsp = px.rms;
    const std::uint8_t* __restrict statep = px.state;
    const std::int32_t* __restrict segp = px.seg;
    const double dy = yy - s.y, sx = s.x, rMax2 = s.rMax2;
    // gain <= 0: no Poisson term (a quotient of infinity, never kept)
    const double gain = p.gain > 0.0 ? p.gain : 0.0;
    const double noGain = p.gain > 0.0 ? 0.0 : 1.0;
#pragma omp simd
    for (int i = 0; i < n; ++i) {
        const double dx = (xa + i) - sx;
        const double r2 = dx * dx + dy * dy;
        const std::int32_t g = segp[i];
        const int counted = (r2 < rMax2) & ((statep[i] & (StateBad | StateInvalid)) == 0) & ((g == 0) | (g == segId));
        const double v = subp[i];
        const double wt = wp[i];
        const double wv = wt * v;
        sw[i] = wv;
        swx[i] = wv * dx;
        swy[i] = wv * dy;
        const double rv = rmsp[i];
        const double var0 = rv * rv;
        const double var = (noGain == 0.0 && v > 0.0) ? var0 + v / gain : var0;
        sex[i] = wt * wt * var * dx * dx;
        sey[i] = wt * wt * var * dy * dy;
        kept[i] = static_cast<std::uint8_t>(counted);
    }
}

} // namespace gpuphot::detail
