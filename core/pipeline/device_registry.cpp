#include "core/pipeline/device_registry.hpp"

#include <future>
#include <mutex>

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

namespace {
std::shared_future<std::vector<DeviceInfo>>& devices(std::launch how) {
    static std::once_flag once;
    static std::shared_future<std::vector<DeviceInfo>> list;
    std::call_once(once, [how] {
        const DeviceLister l = lister();
        list = std::async(how, [l] { return l ? l() : std::vector<DeviceInfo>{}; }).share();
    });
    return list;
}
} // namespace

void prefetchCudaDevices() {
    if (cudaBackendLinked()) devices(std::launch::async);
}

std::vector<DeviceInfo> listCudaDevices() {
    const std::shared_future<std::vector<DeviceInfo>> list = devices(std::launch::deferred);
    return list.get();
}

Backend resolveBackend(Backend requested) {
    if (requested == Backend::Cpu) return Backend::Cpu;
    const bool haveDevice = !listCudaDevices().empty();
    if (requested == Backend::Cuda && !haveDevice)
        throw InvalidInput(cudaBackendLinked() ? "--backend cuda: no CUDA device is available"
                                               : "--backend cuda: this build has no CUDA backend");
    return haveDevice ? Backend::Cuda : Backend::Cpu;
}

} // namespace gpuphot
