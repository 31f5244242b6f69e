#pragma once
// Per-source flag bits (catalog column `flags`). Documented in docs/FLAGS.md; never renumber.
#include <cstdint>

namespace gpuphot {

enum SourceFlags : std::uint32_t {
    FlagCrowded = 1u << 0,            // another object's pixels inside the photometric aperture
    FlagBlended = 1u << 1,            // deblended from a larger connected region
    FlagSaturated = 1u << 2,          // at least one pixel at or above saturation
    FlagEdge = 1u << 3,               // isophote touches the frame edge (truncated)
    FlagApertureIncomplete = 1u << 4, // an aperture extends beyond the frame
    FlagBadPixels = 1u << 5,          // masked pixels inside the isophote
    FlagApertureMasked = 1u << 6,     // masked pixels inside an aperture (excluded from the sum)
    FlagPsfFitFailed = 1u << 7,       // PSF fit did not converge (flux_psf NaN)
    FlagSkyFailed = 1u << 8,          // too few annulus pixels for the local sky
    FlagKronFailed = 1u << 9,         // Kron radius undefined (fallback radius used)
    FlagDeblendOverflow = 1u << 10,   // deblending gave up on this blend (too many branches)
    FlagPsfStar = 1u << 11,           // used to build the PSF model
    FlagCalibrator = 1u << 12,        // used in the zero-point fit
    FlagAstromStar = 1u << 13,        // used in the astrometric fit
};

} // namespace gpuphot
