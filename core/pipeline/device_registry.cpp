#include "core/pipeline/device_registry.hpp"

#include "core/pipeline/run_context.hpp"
#include "core/util/errors.hpp"

namespace gpuphot {
namespace {
DeviceLister& lister() {
    static DeviceLister l = nullptr;
    return l;
}
} // namespace

void registerDeviceLister(DeviceLister l) { lister() = l; }
bool cudaBackendLinked() { return lister() != nullptr; }
std::vector<DeviceInfo> listCudaDevices() { return lister() ? lister()() : std::vector<DeviceInfo>{}; }

Backend resolveBackend(Backend requested) {
    if (requested == Backend::Cpu) return Backend::Cpu;
    const bool haveDevice = !listCudaDevices().empty();
    if (requested == Backend::Cuda && !haveDevice)
        throw InvalidInput(cudaBackendLinked() ? "--backend cuda: no CUDA device is available"
                                               : "--backend cuda: this build has no CUDA backend");
    return haveDevice ? Backend::Cuda : Backend::Cpu;
}

} // namespace gpuphot
