#pragma once
// Core knows nothing of CUDA: the kernels library registers itself here when it is linked in, so that
// core can discover devices (for --backend auto) and later dispatch stages to cuda:: implementations.
#include <cstddef>
#include <string>
#include <vector>

namespace gpuphot {

struct DeviceInfo {
    int index = 0;
    std::string name;
    std::size_t totalBytes = 0;
    int computeMajor = 0, computeMinor = 0;
};

using DeviceLister = std::vector<DeviceInfo> (*)();
void registerDeviceLister(DeviceLister lister);
bool cudaBackendLinked();
// Empty without the CUDA backend or without a device. Read once per process (the CUDA driver's start-up
// takes 0.1-0.2 s on a large GPU) and kept; prefetchCudaDevices() starts the reading on another thread so
// that the caller can go on (reading catalogs) until it needs the answer.
std::vector<DeviceInfo> listCudaDevices();
void prefetchCudaDevices();

enum class Backend;
// Auto resolves to Cuda when a device is present, else Cpu; Cuda without a device throws InvalidInput.
Backend resolveBackend(Backend requested);

namespace cuda {
void linkKernels();
}

} // namespace gpuphot
