#pragma once
// The CUDA backend's stage implementations. Core knows nothing of CUDA: gpuphot_kernels fills this table
// when it is linked in (kernels/register.cu), and the public stage functions (estimateBackground,
// detectSources, buildPsfModel, measureApertures, crossmatch) dispatch to an entry when the RunContext's
// backend is Cuda and the entry is set, else to the cpu:: implementation declared beside them. Every entry
// has the exact signature of its cpu:: counterpart and must give the same answer (DESIGN.md,
// Determinism); tests/kernels compares them.
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
};

// Called once by the kernels library (static initialisation); later calls replace entries that are set.
void registerCudaStages(const CudaStageTable& table);
const CudaStageTable& cudaStages();

} // namespace gpuphot
