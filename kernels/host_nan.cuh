#pragma once
// NaN results with the host's (x86-64 SSE) bits, for kernels that must be bitwise equal to the CPU also
// on NaN pixels: an operation with a NaN operand returns the first NaN operand, quieted; an invalid one
// (inf - inf, 0/0) the default NaN, negative; a float <-> double conversion keeps the sign and the top
// payload bits. The device's arithmetic returns a canonical NaN instead.
#include <cuda_runtime.h>

namespace gpuphot::cuda {

__device__ __forceinline__ float hostQuietF(float x) {
    return __int_as_float(__float_as_int(x) | 0x00400000);
}
__device__ __forceinline__ double hostQuietD(double x) {
    return __longlong_as_double(__double_as_longlong(x) | 0x0008000000000000ll);
}

// r = a op b as computed by the device; the host's result for the same operands.
__device__ __forceinline__ float hostNanF(float r, float a, float b) {
    if (!isnan(r)) return r;
    if (isnan(a)) return hostQuietF(a);
    if (isnan(b)) return hostQuietF(b);
    return __int_as_float(static_cast<int>(0xffc00000u));
}
__device__ __forceinline__ double hostNanD(double r, double a, double b) {
    if (!isnan(r)) return r;
    if (isnan(a)) return hostQuietD(a);
    if (isnan(b)) return hostQuietD(b);
    return __longlong_as_double(static_cast<long long>(0xfff8000000000000ull));
}

// static_cast<double>(x) / static_cast<float>(x) as the host converts NaNs.
__device__ __forceinline__ double hostToDouble(float x) {
    if (!isnan(x)) return static_cast<double>(x);
    const unsigned u = static_cast<unsigned>(__float_as_int(x)) | 0x00400000u;
    const unsigned long long d = (static_cast<unsigned long long>(u >> 31) << 63) | 0x7ff0000000000000ull |
                                 (static_cast<unsigned long long>(u & 0x007fffffu) << 29);
    return __longlong_as_double(static_cast<long long>(d));
}
__device__ __forceinline__ float hostToFloat(double x) {
    if (!isnan(x)) return static_cast<float>(x);
    const unsigned long long d = static_cast<unsigned long long>(__double_as_longlong(x)) | 0x0008000000000000ull;
    const unsigned u = (static_cast<unsigned>(d >> 63) << 31) | 0x7f800000u |
                       static_cast<unsigned>((d >> 29) & 0x007fffffu);
    return __int_as_float(static_cast<int>(u));
}

} // namespace gpuphot::cuda
