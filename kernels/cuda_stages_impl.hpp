#pragma once
#include <memory>
// The cuda:: stage implementations registered in core's CudaStageTable (kernels/register.cu). Each has
// the exact signature of its cpu:: counterpart and gives the same answer (tests/kernels).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/model/image.hpp"

namespace gpuphot {
class RunContext;
class SegmentationMap;
struct BackgroundParams;
struct BackgroundResult;
struct DetectionParams;
struct DetectionResult;
struct ApertureParams;
struct PsfParams;
struct PsfResult;
struct ApertureResult;
struct Sources;
class Wcs;
struct ReferenceCatalog;
struct CrossmatchParams;
struct CrossmatchResult;
struct PrepareCalibration;
struct PrepareDeviceJob;
struct PrepareDeviceResult;
struct Instrument;
struct CosmicRayParams;
struct CosmicRayResult;
struct SaltPepperParams;
struct SaltPepperResult;
struct CfaLayout;
enum class CfaOutput;
} // namespace gpuphot

namespace gpuphot::cuda {

// Mesh statistics and full-resolution maps on the device (bad-mesh fill, median filter and spline
// coefficients on the host); the maps stay on the device for detectSources.
BackgroundResult estimateBackground(const ImageView& image, const MaskView& mask,
                                    const BackgroundParams& params, RunContext& ctx,
                                    const ImageViewT<std::int32_t>* sourceMask);

// Per-pixel front on the device (subtraction, pixel states, matched filter, threshold runs); the
// per-object half (labelling, deblending, cleaning, measurement) is core's detail::detectFromRuns on the
// host.
DetectionResult detectSources(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                              const DetectionParams& params, RunContext& ctx);

// PSF stage (kernels/psf/psf.cu): cpu::buildPsfModel for the model (selection, stamps, clipping, spatial model)
// with the stars' profile fits (one block per star, core/stages/psf/psf_fit_math.hpp), the ePSF cells
// (kernels/psf/psf_epsf.cu, core/stages/psf/psf_epsf_math.hpp) and the PSF photometry (one thread per source,
// core/stages/psf/psf_flux_math.hpp) on the device: all bitwise the host loops, which run instead when the device
// has no room; the whole host stage with GPUPHOT_PSF_DEVICE=0.
PsfResult buildPsfModel(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                        const Sources& sources, double gain, const PsfParams& params, RunContext& ctx);

// Aperture photometry: the per-source loops (local sky, circular sums for every radius, Kron) as kernels
// behind core's detail::ApertureEngine; the driver (flags, errors, curve of growth, aperture correction,
// optimal radius choice) runs on the host, shared with the CPU stage.
ApertureResult measureApertures(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                                const ImageViewT<std::int32_t>& segmentation, const Sources& sources,
                                double fwhm, double gain, double readNoise, const ApertureParams& params,
                                RunContext& ctx);
// The same with the detection's shared map: a deferred map made on this context's device
// (kernels/detection/detection_finish.hpp) is read there, never downloaded (unless the sources lack segmentId, or
// the stage runs as strips or on the CPU: then the map is materialised); another map is uploaded.
ApertureResult measureApertures(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                                const SegmentationMap& segmentation, const Sources& sources, double fwhm,
                                double gain, double readNoise, const ApertureParams& params, RunContext& ctx);

// Crossmatch (kernels/crossmatch/crossmatch.cu): the grid-hash candidate search on the device, bitwise equal to
// cpu::crossmatch. crossmatch() is the registered entry: below the measured crossover (below) it calls
// cpu::crossmatch, and it falls back to it when the device is out of memory; crossmatchGpu() always uses
// the device (tests, benchmarks).
CrossmatchResult crossmatch(const std::vector<double>& x, const std::vector<double>& y, int width, int height,
                            const ReferenceCatalog& ref, const Wcs& wcs, const CrossmatchParams& params,
                            RunContext& ctx);
CrossmatchResult crossmatchGpu(const std::vector<double>& x, const std::vector<double>& y, int width,
                               int height, const ReferenceCatalog& ref, const Wcs& wcs,
                               const CrossmatchParams& params, RunContext& ctx);
// When crossmatch() uses the device: reference catalog rows >= minRefsAlone, or rows >= minRefs and
// sources >= minSources. The defaults are the crossover of an H200-class GPU with 16 host threads
// (docs/BENCHMARKS.md, "GPU crossmatch crossover"): the device's grid search replaces the k-d tree, the
// cone cut and the WCSLIB projection stay on the host in both.
struct CrossmatchCrossover {
    std::size_t minSources = 10000;
    std::size_t minRefs = 100000;
    std::size_t minRefsAlone = 500000;
};
CrossmatchCrossover crossmatchCrossover();
void setCrossmatchCrossover(const CrossmatchCrossover& c);
bool crossmatchUsesDevice(std::size_t nSources, std::size_t nRefs);
// Diagnostics of the last crossmatchGpu call: candidates found on the device, and how many of their
// device separations differed in any bit from the CPU formula's (those are recomputed on the host).
std::size_t crossmatchLastCandidates();
std::size_t crossmatchLastSeparationMismatches();

// Frame preparation (kernels/prepare/prepare.cu): prepareFrame's per-pixel calibration on the device, masters
// resident in the DeviceContext, the result kept as its frame cache (cal.keepOnDevice). Returns the pixels
// newly set MaskBad.
// A new DeviceContext (CUDA context, stream, pool) for RunContext::deviceState; any thread.
std::shared_ptr<void> createDeviceState(std::size_t gpuMemLimit, int device);
void useDevice(int device);
std::size_t prepareCalibrate(Image<float>& pixels, Image<std::uint8_t>& mask, const PrepareCalibration& cal,
                             RunContext& ctx);
// Master uploads so far (tests: resident masters are not uploaded again) and the last calibration
// kernel's time; both of the calling thread.
std::uint64_t prepareMasterUploads();
double prepareKernelMilliseconds();
// Steps 1-5 of prepareFrame (the CudaStageTable entry prepareFrame): bleed trails, overscan, trim and the
// calibration in one device pass on the frame cache; {done = false} after noting plan "cpu" when the
// device has no room (the frame is unchanged).
PrepareDeviceResult prepareFrameOnDevice(Image<float>& pixels, Image<std::uint8_t>& mask,
                                         const PrepareDeviceJob& job, RunContext& ctx);
// The calling thread's last prepare call: CUDA-event times on the stream (upload: frame cache take-over,
// uploaded only when not resident, and master uploads; device: bleed + calibration kernels) and host
// clock times (download of the host copy through the pinned staging; the whole call).
struct PrepareTimings {
    bool frameUploaded = false;
    double uploadMs = 0.0, bleedMs = 0.0, calibrateMs = 0.0, deviceMs = 0.0;
    double downloadMs = 0.0, wallMs = 0.0;
};
PrepareTimings prepareLastTimings();

// Frame preparation steps 6-8 (kernels/prepare/cosmic_rays.cu, kernels/prepare/bayer.cu), bitwise equal to the CPU
// functions of core/stages/prepare/cosmic_rays.hpp and bayer.hpp, which dispatch here after checking their inputs.
CosmicRayResult detectCosmicRays(const ImageView& pixels, const MaskView& mask, const Instrument& instrument,
                                 const CosmicRayParams& params, RunContext& ctx);
SaltPepperResult saltPepperMask(const ImageView& pixels, const MaskView& mask, const SaltPepperParams& params,
                                RunContext& ctx);
Image<float> cfaSuperPixels(const ImageView& pixels, const CfaLayout& layout, CfaOutput output,
                            bool luminanceMean, RunContext& ctx);
// Device times (CUDA events, ms) of the last detectCosmicRays call: setup (upload, electrons, background
// level, good-pixel masks), each iteration that ran, output (mask, clean image, download).
struct CosmicRayTimings {
    double setupMs = 0.0;
    std::vector<double> iterationMs;
    double outputMs = 0.0;
};
CosmicRayTimings cosmicRaysLastTimings();
// The last cfaSuperPixels call: the kernel alone, and upload + kernel + download (ms).
double cfaKernelMilliseconds();
double cfaTotalMilliseconds();

} // namespace gpuphot::cuda
