#pragma once
// GPUPHOT_HD marks small inline functions that both the host compiler and nvcc compile, so that the CPU
// stages and the CUDA kernels run the same arithmetic (docs/ARCHITECTURE.md, Determinism). Empty for non-CUDA
// compilers; core never includes CUDA headers.
#if defined(__CUDACC__)
#define GPUPHOT_HD __host__ __device__
#else
#define GPUPHOT_HD
#endif
