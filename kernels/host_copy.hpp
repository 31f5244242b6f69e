#pragma once
// Host memcpy by several threads (OpenMP), for the pinned staging of large host <-> device copies
// (DeviceContext::uploadStaged / downloadStaged): one thread copies 5-10 GB/s, the staging wants more.
#include <cstddef>

namespace gpuphot::cuda {

// memcpy(dst, src, bytes) split into pieces of at least 1 MiB over the OpenMP threads.
void parallelCopy(void* dst, const void* src, std::size_t bytes);

} // namespace gpuphot::cuda
