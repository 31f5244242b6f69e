#pragma once
// The PSF stage's ePSF cells on the device (ePSF stacking): an EpsfCellBatch (core/stages/psf/psf.hpp)
// that builds all cells of the grid at once with the arithmetic of core/stages/psf/psf_epsf_math.hpp, so that
// every cell is bitwise the host's buildEpsfCell (kernels/psf/psf_epsf.cu says how). The CUDA PSF stage
// (kernels/psf/psf.cu) passes it to cpu::buildPsfModel.
#include <cstddef>
#include <vector>

#include "core/model/image.hpp"
#include "core/stages/psf/psf.hpp"

namespace gpuphot {
class RunContext;
struct BackgroundResult;
} // namespace gpuphot

namespace gpuphot::cuda {

// The batch for this frame (pixels and mask from the DeviceContext's frame cache, the background from
// the device maps or bkg's global values). It leaves every cell to the host (done = 0) when the
// background is of a kind it does not read or the device has no room, and a cell whose residuals are not
// all finite (the host sorts NaN its own way). The views and bkg must outlive the batch. Making the batch
// resets psfLastDeviceEpsfCells.
EpsfCellBatch deviceEpsfCellBatch(RunContext& ctx, const ImageView& image, const MaskView& mask,
                                  const BackgroundResult& bkg);

// Test hook: ePSF cells the calling thread's last batch built on the device.
std::size_t psfLastDeviceEpsfCells();
// Test hooks: with keep on, the calling thread's batches also download their cells' double nodes before
// the normalisation (epsfCellNodes' values, core/stages/psf/psf_epsf.hpp), one vector per job of the last
// batch (empty for a cell left to the host).
void psfKeepDeviceEpsfNodes(bool keep);
const std::vector<std::vector<double>>& psfLastDeviceEpsfNodes();

} // namespace gpuphot::cuda
