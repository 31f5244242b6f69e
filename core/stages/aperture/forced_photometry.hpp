#pragma once
// Forced aperture photometry at given pixel positions (`gpuphot reduce --targets`): an observer's own
// targets measured whether or not they were detected. Runs the aperture stage's own code
// (measureApertures: exact pixel/circle overlaps, the local annulus sky with the segmentation map's
// objects excluded) with the main catalog's parameters, FWHM and segmentation, so a target placed on a
// detection's position gets exactly that detection's flux_aper_*; the main catalog's curve-of-growth
// aperture corrections turn the fixed-radius fluxes into total magnitudes.
//
// Units and coordinates as in the aperture stage: pixels 0-based (centres at integers), ADU.
#include <cstddef>
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/model/image.hpp"
#include "core/stages/aperture/aperture.hpp"

namespace gpuphot {

class RunContext;
struct BackgroundResult;
struct Sources;

// Flag bits of the targets table only (above every SourceFlags bit; the aperture stage's own bits, e.g.
// FlagApertureIncomplete near the edge or FlagApertureMasked, are ORed in as they are).
enum TargetFlags : std::uint32_t {
    FlagTargetOffFrame =
        1u << 24, // the position falls outside the frame (or did not transform): not measured
    FlagTargetDetected = 1u << 25, // a detection lies within matchRadiusFwhm (det_id, det_sep)
    FlagTargetNearEdge = 1u << 26, // the sky annulus reaches beyond the frame
};

struct ForcedPhotometryParams {
    double matchRadiusFwhm = 1.0; // a detection within this many FWHM is the target's counterpart
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ForcedPhotometryParams, matchRadiusFwhm)

struct ForcedPhotometryResult {
    std::size_t count = 0;
    std::vector<double> x, y; // 0-based positions measured (as given)
    // The aperture stage's result at the targets: flux/fluxErr per fixed radius (RAW), sky, skyRms, flags.
    // Its curve-of-growth fields describe the targets, not the field: use the main catalog's.
    ApertureResult aperture;
    std::vector<std::int32_t> detIndex; // 0-based index of the nearest detection within the radius, -1: none
    std::vector<double> detSeparation;  // px, NaN when none
    // Total instrumental magnitude from the fixed aperture of highest S/N (calAperture, 0-based; -1: none)
    // with the main catalog's aperture correction for that radius; the error includes the correction's.
    std::vector<std::int32_t> calAperture;
    std::vector<double> magTotal, magTotalErr;
    std::vector<std::uint32_t> flags; // aperture-stage SourceFlags | TargetFlags
};

// x, y: 0-based target positions (NaN: did not transform -> off frame). detections / detected: the
// main catalog's sources and aperture result (for the counterparts and the aperture corrections);
// segmentation: the detection stage's map (may be empty). fwhm, gain, readNoise, params: exactly what
// the main catalog's aperture stage got. Throws InvalidInput for inconsistent inputs.
ForcedPhotometryResult
forcedPhotometry(const ImageView& image, const MaskView& mask, const BackgroundResult& bkg,
                 const ImageViewT<std::int32_t>& segmentation, const Sources& detections,
                 const ApertureResult& detected, const std::vector<double>& x, const std::vector<double>& y,
                 double fwhm, double gain, double readNoise, const ApertureParams& params,
                 const ForcedPhotometryParams& forced, RunContext& ctx);

} // namespace gpuphot
