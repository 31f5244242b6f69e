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
std::vector<DeviceInfo> listCudaDevices(); // empty without the CUDA backend or without a device

enum class Backend;
// Auto resolves to Cuda when a device is present, else Cpu; Cuda without a device throws InvalidInput.
Backend resolveBackend(Backend requested);

namespace cuda {
void linkKernels();
}

} // namespace gpuphot
