#pragma once
// Every CUDA runtime call goes through GPUPHOT_CUDA_CHECK: a failure throws CudaError with file:line.
#include <cuda_runtime.h>
#include <string>

#include "core/util/errors.hpp"

#define GPUPHOT_CUDA_CHECK(call)                                                                             \
    do {                                                                                                     \
        const cudaError_t gpuphot_err_ = (call);                                                             \
        if (gpuphot_err_ != cudaSuccess)                                                                     \
            throw ::gpuphot::CudaError(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " #call   \
                                       ": " + cudaGetErrorString(gpuphot_err_));                             \
    } while (0)
