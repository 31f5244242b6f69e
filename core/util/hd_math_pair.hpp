#pragma once
// Two-element (SSE2, GCC/Clang vector extensions) host versions of core/util/hd_math.hpp's exp and log:
// the same operations in the same order on both elements, so that each element is bitwise the scalar
// function's result (IEEE + - * / round the same in a vector register). Inputs outside the common domain
// (exp: |x| >= 680; log: zero, subnormal, negative, inf, NaN) take the scalar code element by element.
// Host only: the device runs the scalar functions (one thread a sample).
#include <cstdint>
#include <cstring>

#include "core/util/hd_math.hpp"

namespace gpuphot::hdmath {

typedef double D2 __attribute__((vector_size(16)));
typedef std::int64_t I2 __attribute__((vector_size(16)));
typedef std::uint64_t U2 __attribute__((vector_size(16)));

inline U2 bitsOf(D2 v) {
    U2 u;
    std::memcpy(&u, &v, sizeof u);
    return u;
}

inline D2 fromBits(U2 u) {
    D2 v;
    std::memcpy(&v, &u, sizeof v);
    return v;
}

inline D2 exp(D2 x) {
    if (!(x[0] > -680.0 && x[0] < 680.0 && x[1] > -680.0 && x[1] < 680.0)) return D2{exp(x[0]), exp(x[1])};
    constexpr double kShift = 6755399441055744.0;
    const D2 shifted = x * k64ByLn2 + kShift;
    const D2 kd = shifted - kShift;
    const I2 k = reinterpret_cast<I2>(bitsOf(shifted) << 32) >> 32; // the low 32 bits, signed
    const D2 r = (x - kd * kLn2By64Hi) - kd * kLn2By64Lo;
    const I2 n = k >> 6, j = k & 63;
    const D2 r2 = r * r;
    const D2 a = 0.5 + r * (1.0 / 6.0);
    const D2 b = 1.0 / 24.0 + r * (1.0 / 120.0);
    const D2 em1 = r + r2 * (a + r2 * (b + r2 * (1.0 / 720.0)));
    const double* t = exp2Table();
    const D2 t0 = {t[2 * j[0]], t[2 * j[1]]}, t1 = {t[2 * j[0] + 1], t[2 * j[1] + 1]};
    const D2 v = t0 + (t1 + t0 * em1);
    return fromBits(bitsOf(v) + (reinterpret_cast<U2>(n) << 52)); // |n| < 1000: normal results
}

inline D2 log(D2 x) {
    const U2 u = bitsOf(x);
    const U2 off = u - 0x0010000000000000ull;
    if (!(off[0] < 0x7fe0000000000000ull && off[1] < 0x7fe0000000000000ull)) return D2{log(x[0]), log(x[1])};
    const U2 up = (u >> 51) & 1u;
    const I2 e = reinterpret_cast<I2>((u >> 52) & 0x7ffu) - 1023 + reinterpret_cast<I2>(up);
    const D2 m = fromBits((u & 0x000fffffffffffffull) | ((1023u - up) << 52));
    constexpr double kShift = 6755399441055744.0;
    const D2 shifted = m * 64.0 + kShift;
    const I2 j = reinterpret_cast<I2>(bitsOf(shifted) & 0xffffffffu);
    const D2 c = (shifted - kShift) * (1.0 / 64.0);
    const D2 f = m - c;
    const double* inv = invTable();
    const D2 g = f * D2{inv[j[0] - 48], inv[j[1] - 48]};
    const D2 g2 = g * g, g4 = g2 * g2;
    const D2 p1 = -0.5 + g * (1.0 / 3.0);
    const D2 p2 = -0.25 + g * (1.0 / 5.0);
    const D2 p3 = (-1.0 / 6.0 + g * (1.0 / 7.0)) + g2 * (-1.0 / 8.0);
    const D2 tail = g2 * ((p1 + g2 * p2) + g4 * p3);
    const double* t = logTable();
    const D2 t0 = {t[2 * (j[0] - 48)], t[2 * (j[1] - 48)]},
             t1 = {t[2 * (j[0] - 48) + 1], t[2 * (j[1] - 48) + 1]};
    // e as a double without a conversion instruction: 1.5 * 2^52 + e, minus 1.5 * 2^52 (exact).
    const D2 ed = fromBits(bitsOf(D2{kShift, kShift}) + reinterpret_cast<U2>(e)) - kShift;
    return (ed * kLn2Hi + t0) + (g + (tail + (ed * kLn2Lo + t1)));
}

} // namespace gpuphot::hdmath
