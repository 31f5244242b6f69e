#pragma once
// The frame as the PSF stage's kernels read it (kernels/psf/psf.cu: profile fits' photometry,
// kernels/psf/psf_epsf.cu: the ePSF cells): the DeviceContext's frame cache and the background as the host stage
// reads it (PsfFrame::level / rms, core/stages/psf/psf_epsf.hpp): full maps uploaded, a mesh grid's maps
// interpolated on the device (bitwise the host sampler's), or the global level and rms.
#include <cstdint>

#include "core/model/image.hpp"

namespace gpuphot {
struct BackgroundResult;
}

namespace gpuphot::cuda {

class DeviceContext;

// Row stride = width for every plane; level / rms null: the globals.
struct PsfPlanes {
    const float* image = nullptr;
    const std::uint8_t* mask = nullptr; // null: no mask
    const float* level = nullptr;
    const float* rms = nullptr;
    double globalLevel = 0.0, globalRms = 0.0;
    int width = 0, height = 0;
};

// True when the PSF kernels read bkg's kind (full maps, a mesh grid of the frame's size with its sampler,
// or no maps and no sampler: the globals).
bool psfReadsBackground(const BackgroundResult& bkg, int width, int height);

// The planes of image, mask and bkg on the device (uploads what is not there yet; throws
// DeviceOutOfMemory). Requires psfReadsBackground.
PsfPlanes psfPlanes(DeviceContext& dc, const ImageView& image, const MaskView& mask,
                    const BackgroundResult& bkg);

} // namespace gpuphot::cuda
