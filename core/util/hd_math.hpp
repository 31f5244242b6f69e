#pragma once
// exp and log as GPUPHOT_HD functions of + - * / only, so that a CPU stage and its CUDA kernel that need
// them agree bitwise (docs/ARCHITECTURE.md, Determinism). The C library's exp/log (glibc) and CUDA's
// libdevice round differently in the last bit; the PSF profile fits (core/stages/psf/psf_fit_math.hpp) feed
// the fitted FWHM into every aperture radius, so one ulp there would show in the catalog.
//
// Accuracy (tests/core/hd_math_test.cpp, against long double): exp within 1 ulp, log within 1.5 ulp
// and 2 ulp just around 1 (bound 2.5); the C library's are within 0.5. Special values as C's: NaN -> NaN,
// exp(+inf) = inf, exp(-inf) = 0, exp overflows to inf above ~709.78 and underflows through the
// subnormals to 0 below ~-745.13; log(0) = -inf, log(x < 0) = NaN, log(inf) = inf.
// Requires the build's no-contraction rule (-ffp-contract=off on the host, -fmad=false in kernels/):
// a fused multiply-add would round differently.
//
// Method (textbook table-driven reductions, written here; the tables in hd_math_tables.hpp):
//   exp: x = (64 n + j) ln2/64 + r with |r| <= ln2/128 (ln2/64 split in a high part exact in k * hi and
//        a low part); exp x = 2^n 2^(j/64) (1 + expm1 r), expm1 by its Taylor series to r^6, 2^(j/64)
//        from the table as hi + lo; 2^n applied in two halves (a subnormal result is rounded once).
//   log: x = 2^e m with m in [0.75, 1.5), c = j/64 the nearest 64th (exact), f = m - c (exact),
//        log m = log c + log1p(f / c), f / c as f times the table's 64 / j, log1p by its series to
//        g^8; log c from the table as hi + lo. No division.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/util/hd.hpp"
#include "core/util/hd_math_tables.hpp"

namespace gpuphot::hdmath {

GPUPHOT_HD inline std::uint64_t bitsOf(double v) {
#if defined(__CUDA_ARCH__)
    return static_cast<std::uint64_t>(__double_as_longlong(v));
#else
    std::uint64_t u;
    std::memcpy(&u, &v, sizeof u);
    return u;
#endif
}

GPUPHOT_HD inline double fromBits(std::uint64_t u) {
#if defined(__CUDA_ARCH__)
    return __longlong_as_double(static_cast<long long>(u));
#else
    double v;
    std::memcpy(&v, &u, sizeof v);
    return v;
#endif
}

GPUPHOT_HD inline bool isNan(double v) {
    return !(v == v);
}
GPUPHOT_HD inline bool isFinite(double v) {
    return v - v == 0.0;
} // inf - inf and NaN - NaN are NaN
GPUPHOT_HD inline double absOf(double v) {
    return v < 0.0 ? -v : v;
}
// The C library's functions on either side (each correctly rounded or exact under IEEE 754, so host and
// device agree): fabs (unlike absOf, -0.0 gives +0.0), sqrt, trunc, ceil.
GPUPHOT_HD inline double fabsOf(double v) {
#if defined(__CUDA_ARCH__)
    return fabs(v);
#else
    return std::fabs(v);
#endif
}
GPUPHOT_HD inline double sqrtOf(double v) {
#if defined(__CUDA_ARCH__)
    return sqrt(v);
#else
    return std::sqrt(v);
#endif
}
GPUPHOT_HD inline double truncOf(double v) {
#if defined(__CUDA_ARCH__)
    return trunc(v);
#else
    return std::trunc(v);
#endif
}
GPUPHOT_HD inline double ceilOf(double v) {
#if defined(__CUDA_ARCH__)
    return ceil(v);
#else
    return std::ceil(v);
#endif
}
GPUPHOT_HD inline double infinity() {
    return fromBits(0x7ff0000000000000ull);
}
GPUPHOT_HD inline double quietNan() {
    return fromBits(0x7ff8000000000000ull);
}

// 2^k for a normal power, -1022 <= k <= 1023.
GPUPHOT_HD inline double pow2(int k) {
    return fromBits(static_cast<std::uint64_t>(k + 1023) << 52);
}

// Round to the nearest integer (ties to even) for |v| < 2^31, without branches or a library call:
// adding and subtracting 1.5 * 2^52 leaves v rounded to an integer (IEEE round to nearest).
GPUPHOT_HD inline int roundToInt(double v) {
    constexpr double kShift = 6755399441055744.0; // 1.5 * 2^52
    const double t = (v + kShift) - kShift;
    return static_cast<int>(t);
}

// ln 2 / 64 = kLn2By64Hi + kLn2By64Lo; the high part has 32 significant bits, so k * kLn2By64Hi is exact
// for |k| < 2^21.
inline constexpr double kLn2Hi = 6.93147180369123816490e-01; // 0x3FE62E42FEE00000
inline constexpr double kLn2Lo = 1.90821492927058770002e-10;
inline constexpr double kLn2By64Hi = kLn2Hi / 64.0;
inline constexpr double kLn2By64Lo = kLn2Lo / 64.0;
inline constexpr double k64ByLn2 = 92.33248261689366;

inline constexpr double kExp2Table[128] = {GPUPHOT_HDMATH_EXP2_TABLE};
inline constexpr double kLogTable[98] = {GPUPHOT_HDMATH_LOG_TABLE};
inline constexpr double kInvTable[49] = {GPUPHOT_HDMATH_INV_TABLE};
#if defined(__CUDACC__)
__device__ const double kExp2TableDevice[128] = {GPUPHOT_HDMATH_EXP2_TABLE};
__device__ const double kLogTableDevice[98] = {GPUPHOT_HDMATH_LOG_TABLE};
__device__ const double kInvTableDevice[49] = {GPUPHOT_HDMATH_INV_TABLE};
#endif

GPUPHOT_HD inline const double* exp2Table() {
#if defined(__CUDA_ARCH__)
    return kExp2TableDevice;
#else
    return kExp2Table;
#endif
}

GPUPHOT_HD inline const double* logTable() {
#if defined(__CUDA_ARCH__)
    return kLogTableDevice;
#else
    return kLogTable;
#endif
}

GPUPHOT_HD inline const double* invTable() {
#if defined(__CUDA_ARCH__)
    return kInvTableDevice;
#else
    return kInvTable;
#endif
}

GPUPHOT_HD inline double exp(double x) {
    if (isNan(x)) return x;
    if (x > 709.782712893384) return infinity(); // > log(DBL_MAX)
    if (x < -745.1332191019412) return 0.0;      // < log(smallest subnormal / 2)
    // k = round(64 x / ln2) as a double and, from the same sum's low bits, as an integer (|k| < 2^17).
    constexpr double kShift = 6755399441055744.0; // 1.5 * 2^52
    const double shifted = x * k64ByLn2 + kShift;
    const double kd = shifted - kShift;
    const int k = static_cast<int>(static_cast<std::uint32_t>(bitsOf(shifted)));
    const double r = (x - kd * kLn2By64Hi) - kd * kLn2By64Lo; // |r| <= ln2 / 128 + rounding
    const int n = k >> 6, j = k & 63;                         // k = 64 n + j (floor division)
    // expm1(r) by its Taylor series to r^6 / 6! (the remainder < 3e-20 relative), grouped in pairs
    // (Estrin) for a shorter dependency chain: r + r^2 ((1/2 + r/6) + r^2 ((1/24 + r/120) + r^2 / 720)).
    const double r2 = r * r;
    const double a = 0.5 + r * (1.0 / 6.0);
    const double b = 1.0 / 24.0 + r * (1.0 / 120.0);
    const double em1 = r + r2 * (a + r2 * (b + r2 * (1.0 / 720.0)));
    const double* t = exp2Table() + 2 * j;
    const double v = t[0] + (t[1] + t[0] * em1); // 2^(j/64) exp(r), in [0.99, 2)
    if (n > -1000 && n < 1000) // a normal result: 2^n added to the exponent field (exact, as v * 2^n)
        return fromBits(bitsOf(v) + (static_cast<std::uint64_t>(static_cast<std::int64_t>(n)) << 52));
    const int n1 = n / 2, n2 = n - n1; // each within the normal exponents; a subnormal rounded once
    return (v * pow2(n1)) * pow2(n2);
}

GPUPHOT_HD inline double log(double x) {
    std::uint64_t u = bitsOf(x);
    int e = 0;
    // One unsigned test for everything but positive normal numbers (zero, subnormal, negative, inf, NaN).
    if (u - 0x0010000000000000ull >= 0x7fe0000000000000ull) {
        if (isNan(x)) return x;
        if (x < 0.0) return quietNan();
        if (x == 0.0) return -infinity();
        if (!isFinite(x)) return x;          // +inf
        u = bitsOf(x * 18014398509481984.0); // subnormal: times 2^54 into the normal range (exact)
        e = -54;
    }
    // m in [0.75, 1.5): the mantissa with exponent 0, or -1 when its top bit is set (m >= 1.5); no branch.
    const std::uint64_t up = (u >> 51) & 1u;
    e += static_cast<int>((u >> 52) & 0x7ff) - 1023 + static_cast<int>(up);
    const double m = fromBits((u & 0x000fffffffffffffull) | ((1023u - up) << 52));
    // j = round(64 m) in 48..96 (c = j / 64, the nearest 64th) from the low bits of a shifted sum.
    constexpr double kShift = 6755399441055744.0; // 1.5 * 2^52
    const double shifted = m * 64.0 + kShift;
    const int j = static_cast<int>(static_cast<std::uint32_t>(bitsOf(shifted)));
    const double c = (shifted - kShift) * (1.0 / 64.0);
    const double f = m - c; // exact (Sterbenz), |f| <= 1/128
    // log m = log c + log1p(g), g = f (64 / j) (one rounding; exact for c = 1), |g| < 0.0105; log1p by
    // its Taylor series to g^8 (the rest < 2e-19 relative), grouped (Estrin):
    // g + g^2 (-1/2 + g/3 + g^2 (-1/4 + g/5) + g^4 (-1/6 + g/7 - g^2/8)).
    const double g = f * invTable()[j - 48];
    const double g2 = g * g, g4 = g2 * g2;
    const double p1 = -0.5 + g * (1.0 / 3.0);
    const double p2 = -0.25 + g * (1.0 / 5.0);
    const double p3 = (-1.0 / 6.0 + g * (1.0 / 7.0)) + g2 * (-1.0 / 8.0);
    const double tail = g2 * ((p1 + g2 * p2) + g4 * p3);
    const double* t = logTable() + 2 * (j - 48);
    const double ed = static_cast<double>(e);
    // e ln2 + log c + g + tail: the large parts first, the small corrections together.
    return (ed * kLn2Hi + t[0]) + (g + (tail + (ed * kLn2Lo + t[1])));
}

} // namespace gpuphot::hdmath
