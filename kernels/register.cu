// Registers the CUDA stage implementations with core's backend interface at static initialisation.
#include "core/pipeline/cuda_stages.hpp"
#include "kernels/cuda_stages_impl.hpp"
#include "kernels/pinned_reserve.hpp"

#include "core/stages/prepare/bayer.hpp"
#include "core/stages/prepare/cosmic_rays.hpp"
#include "core/stages/crossmatch/crossmatch.hpp"

namespace gpuphot::cuda {

namespace {
bool registerStages() {
    CudaStageTable t;
    t.background = &cuda::estimateBackground;
    t.detection = &cuda::detectSources;
    t.psf = &cuda::buildPsfModel;
    t.aperture = &cuda::measureApertures;
    t.apertureMap = &cuda::measureApertures;
    t.crossmatch = &cuda::crossmatch;
    t.prepare = &cuda::prepareCalibrate;
    t.prepareFrame = &cuda::prepareFrameOnDevice;
    t.cosmicRays = &cuda::detectCosmicRays;
    t.saltPepper = &cuda::saltPepperMask;
    t.cfaSuperPixels = &cuda::cfaSuperPixels;
    t.createDeviceState = &cuda::createDeviceState;
    t.useDevice = &cuda::useDevice;
    t.reservePinned = &cuda::warmUpPinned;
    registerCudaStages(t);
    return true;
}

const bool registered = registerStages();
} // namespace

// Referenced from linkKernels() (kernels/device.cu), so that linking the library keeps this unit.
bool stagesLinked() { return registered; }

} // namespace gpuphot::cuda
