// Registers the CUDA stage implementations with core's backend interface at static initialisation.
#include "core/pipeline/cuda_stages.hpp"
#include "kernels/cuda_stages_impl.hpp"

namespace gpuphot::cuda {

namespace {
bool registerStages() {
    CudaStageTable t;
    t.background = &cuda::estimateBackground;
    t.detection = &cuda::detectSources;
    // cuda::measureApertures (kernels/aperture.cu) is not registered yet: with a local sky annulus its sky
    // differs from the CPU's for ~10% of sources on the H200 (docs/BENCHMARKS.md). The aperture tests call
    // it directly.
    registerCudaStages(t);
    return true;
}

const bool registered = registerStages();
} // namespace

// Referenced from linkKernels() (kernels/device.cu), so that linking the library keeps this unit.
bool stagesLinked() { return registered; }

} // namespace gpuphot::cuda
