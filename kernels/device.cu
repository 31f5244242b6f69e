// Device discovery for --backend auto and `gpuphot info`.
#include "core/pipeline/device_registry.hpp"
#include "kernels/cuda_check.hpp"

#include <cstdio>

namespace gpuphot::cuda {
namespace {

std::vector<DeviceInfo> listDevices() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError(); // no driver or no device: not an error, just no CUDA backend
        return {};
    }
    std::vector<DeviceInfo> out;
    for (int i = 0; i < n; ++i) {
        cudaDeviceProp p{};
        GPUPHOT_CUDA_CHECK(cudaGetDeviceProperties(&p, i));
        DeviceInfo d;
        d.index = i;
        d.name = p.name;
        d.totalBytes = p.totalGlobalMem;
        d.computeMajor = p.major;
        d.computeMinor = p.minor;
        out.push_back(d);
    }
    return out;
}

// Registers the CUDA backend with core when the program links gpuphot_kernels.
const bool registered = (registerDeviceLister(&listDevices), true);

} // namespace

bool stagesLinked(); // kernels/register.cu

// Referenced from the CLI so that the linker keeps this translation unit (and the stage registration).
void linkKernels() {
    (void)registered;
    (void)stagesLinked();
}

} // namespace gpuphot::cuda
