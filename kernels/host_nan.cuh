#pragma once
// NaN results with the host's (x86-64 SSE) bits, for kernels that must be bitwise equal to the CPU also
// on NaN pixels: an operation with a NaN operand returns the first NaN operand, quieted; an invalid one
// (inf - inf, 0/0) the default NaN, negative. The device's arithmetic returns a canonical NaN instead.
// (kernels/prepare.cu has its own copy of these, with the double versions.)
#include <cuda_runtime.h>

namespace gpuphot::cuda {

__device__ __forceinline__ float hostQuietF(float x) {
    return __int_as_float(__float_as_int(x) | 0x00400000);
}

// r = a op b as computed by the device; the host's result for the same operands.
__device__ __forceinline__ float hostNanF(float r, float a, float b) {
    if (!isnan(r)) return r;
    if (isnan(a)) return hostQuietF(a);
    if (isnan(b)) return hostQuietF(b);
    return __int_as_float(static_cast<int>(0xffc00000u));
}

} // namespace gpuphot::cuda
