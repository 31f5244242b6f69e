#pragma once
// The CUDA backend's stage implementations. Core knows nothing of CUDA: gpuphot_kernels fills this table
// when it is linked in (kernels/register.cu), and the public stage functions (estimateBackground,
// detectSources, buildPsfModel, measureApertures, crossmatch) dispatch to an entry when the RunContext's
// backend is Cuda and the entry is set, else to the cpu:: implementation declared beside them. Every entry
// has the exact signature of its cpu:: counterpart and must give the same answer (DESIGN.md,
// Determinism); tests/kernels compares them.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/model/image.hpp"

namespace gpuphot {

class RunContext;
class Wcs;
struct Sources;
struct ReferenceCatalog;
struct BackgroundParams;
struct BackgroundResult;
struct DetectionParams;
struct DetectionResult;
struct PsfParams;
struct PsfResult;
struct ApertureParams;
struct ApertureResult;
struct CrossmatchParams;
struct CrossmatchResult;
struct Instrument;
struct CosmicRayParams;
struct CosmicRayResult;
struct SaltPepperParams;
struct SaltPepperResult;
struct CfaLayout;
enum class CfaOutput;

// The per-pixel calibration of prepareFrame (core/stages/prepare.cpp, step 4-5), views already aligned
// with the (trimmed) frame; empty views are not applied. Every output pixel is
//   v = p - bias; v = float(v - darkScale * dark); v /= flat when flat is finite and > minFlat,
// and MaskBad is set where a master mask, the bad-pixel mask or the flat guard says so.
struct PrepareCalibration {
    ImageView bias, dark, flat;
    MaskView biasMask, darkMask, flatMask, badPixels;
    double darkScale = 0.0;
    float minFlat = 0.05f;
    // The result may stay on the device as the frame cache for the following stages (false when a later
    // prepare step changes the frame in place, e.g. salt-and-pepper or cosmic rays).
    bool keepOnDevice = true;
};

struct CudaStageTable {
    BackgroundResult (*background)(const ImageView& image, const MaskView& mask, const BackgroundParams& params,
                                   RunContext& ctx, const ImageViewT<std::int32_t>* sourceMask) = nullptr;
    DetectionResult (*detection)(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                                 const DetectionParams& params, RunContext& ctx) = nullptr;
    PsfResult (*psf)(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                     const Sources& sources, double gain, const PsfParams& params, RunContext& ctx) = nullptr;
    ApertureResult (*aperture)(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                               const ImageViewT<std::int32_t>& segmentation, const Sources& sources,
                               double fwhm, double gain, double readNoise, const ApertureParams& params,
                               RunContext& ctx) = nullptr;
    CrossmatchResult (*crossmatch)(const std::vector<double>& x, const std::vector<double>& y, int width,
                                   int height, const ReferenceCatalog& ref, const Wcs& wcs,
                                   const CrossmatchParams& params, RunContext& ctx) = nullptr;
    // prepareFrame's per-pixel calibration on pixels/mask in place (same size); returns the pixels newly
    // set MaskBad. The CPU version is the loop in prepareFrame.
    std::size_t (*prepare)(Image<float>& pixels, Image<std::uint8_t>& mask, const PrepareCalibration& cal,
                           RunContext& ctx) = nullptr;
    // Frame preparation steps 6-8 (issue 9), each with the signature of its CPU function, which
    // dispatches to the entry after checking its inputs: L.A.Cosmic and the salt-and-pepper prefilter
    // (core/stages/cosmic_rays.cpp) and the CFA super-pixel image (core/stages/bayer.cpp).
    CosmicRayResult (*cosmicRays)(const ImageView& pixels, const MaskView& mask, const Instrument& instrument,
                                  const CosmicRayParams& params, RunContext& ctx) = nullptr;
    SaltPepperResult (*saltPepper)(const ImageView& pixels, const MaskView& mask,
                                   const SaltPepperParams& params, RunContext& ctx) = nullptr;
    Image<float> (*cfaSuperPixels)(const ImageView& pixels, const CfaLayout& layout, CfaOutput output,
                                   bool luminanceMean, RunContext& ctx) = nullptr;
    // A new device state for RunContext::deviceState (any thread; gpuMemLimit as RunContext's).
    std::shared_ptr<void> (*createDeviceState)(std::size_t gpuMemLimit) = nullptr;
};

// Called once by the kernels library (static initialisation); later calls replace entries that are set.
void registerCudaStages(const CudaStageTable& table);

// With the CUDA backend, starts creating ctx's device state (CUDA context, stream, memory pool: ~0.3 s)
// on another thread, so that it overlaps the read of the first frame; the first stage that needs the
// device waits for it and rethrows its error. No-op for the CPU backend, without the kernels, or when the
// state exists. Call before the context is shared with other threads.
void startDeviceWarmUp(RunContext& ctx);
const CudaStageTable& cudaStages();

} // namespace gpuphot
