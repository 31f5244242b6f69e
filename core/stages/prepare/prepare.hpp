#pragma once
// Frame preparation: the step before stage 1 (background). In this order, on the Frame as read:
//  1. saturation: pixels at or above SATURATE are MaskSaturated already (readFrame); bleed trails, i.e.
//     runs of pixels above bleedFraction * SATURATE contiguous along the column with a saturated pixel,
//     are added and everything saturated is grown by bleedGrow px along the column (raw values);
//  2. overscan: the median of BIASSEC (one level, or one per row) is subtracted from every pixel;
//  3. trim: the frame is cut to TRIMSEC (else DATASEC); CRPIX1/2 shift by the trim, LTV1/2 record it,
//     the WCS is re-read from the edited header;
//  4. master bias subtracted, master dark subtracted after scaling by EXPTIME(frame) / EXPTIME(dark),
//     divided by the master flat (normalised to median 1); flat pixels <= minFlat are MaskBad;
//  5. bad-pixel mask: non-zero pixels (file, or found in the masters) become MaskBad;
//  6. optional salt-and-pepper prefilter (core/stages/prepare/cosmic_rays.hpp, -> MaskBad);
//  7. optional Bayer (CFA) 2x2 super-pixels (core/stages/prepare/bayer.hpp: pixels, mask, WCS, gain);
//  8. optional L.A.Cosmic (core/stages/prepare/cosmic_rays.hpp, -> MaskCosmicRay), on the binned frame;
//  9. external weight map (PrepareInputs::weight, of the prepared frame's size): its relative variance
//     becomes Frame::weightVariance and its unusable pixels MaskBad (core/stages/prepare/weight_map.hpp).
// Masked pixels keep their values; the stages exclude them (background, detection, apertures flag
// them); nothing is interpolated into the photometry.
// With the CUDA backend, steps 1-5 run on the device in one call (kernels/prepare/prepare.cu, bitwise this
// code's result): the frame from the device frame cache, the masters resident, the prepared frame left as the
// frame cache and downloaded into the Frame; the host path runs when the device has no room.
//
// Masters whose size is that of the untrimmed frame are trimmed with the frame's section. Mismatched
// sizes, binning (XBINNING/YBINNING or CCDSUM) or a flat's FILTER different from the frame's are
// InvalidInput naming both files.
#include <array>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/model/frame.hpp"
#include "core/stages/prepare/bayer.hpp"
#include "core/stages/prepare/cosmic_rays.hpp"

namespace gpuphot {

class RunContext;
struct BadPixelParams;

struct PrepareParams {
    bool overscan = true;                  // subtract the overscan when the header has BIASSEC
    std::string overscanMethod = "median"; // "median": one level for the frame; "row": the median per row
    bool trim = true;                      // cut to TRIMSEC (else DATASEC) when the header has one
    bool bleedTrails = true;               // mask bleed trails along the columns of saturated pixels
    double bleedFraction = 0.9;            // fraction of SATURATE that continues a trail
    int bleedGrow = 2;                     // px, saturated pixels and trails grown along the column
    double minFlat = 0.05;     // flat values at or below this (or non-finite) are MaskBad, not divided
    bool autoBadPixels = true; // hot pixels of the master dark and dead ones of the master flat -> MaskBad
    double hotSigma = 6.0;     // robust sigmas above the master dark's median: hot
    double flatLow = 0.5;      // fraction of the master flat's median below which a pixel is dead
    double flatHigh = 1.5;     // ... above which it is over-responsive (bad)
    bool saltPepper = false;   // the reference system's salt-and-pepper prefilter (-> MaskBad)
    SaltPepperParams saltPepperParams;
    bool cosmics = false; // L.A.Cosmic (-> MaskCosmicRay)
    CosmicRayParams cosmic;
    std::string bayer = "none"; // CFA frames: "none", "lum" (2x2 super-pixel sum), "r", "g" or "b"
    BayerParams bayerParams;    // pattern / row order / offsets overrides (bayerParams.output is `bayer`)
    std::string weightType = "none"; // how to read PrepareInputs::weight: "map_rms", "map_var", "map_weight"
                                     // (SExtractor's WEIGHT_TYPE); "none" with a weight map is InvalidInput
    double weightThreshold = 0.0;    // map_weight: weights <= this are unusable; map_rms / map_var: values
                                     // >= this are (0: no limit); SExtractor's WEIGHT_THRESH
    bool rescaleWeights = true;      // map_var / map_weight: scale to the measured background noise
                                     // (SExtractor's RESCALE_WEIGHTS); map_rms is taken as it is
};

void to_json(nlohmann::json& j, const PrepareParams& p);
void from_json(const nlohmann::json& j,
               PrepareParams& p); // missing keys keep defaults; bad values InvalidInput

// Robust medians of sections of a calibration frame, computed once: every frame of a run asks for them.
struct CalibrationMedians {
    std::mutex mutex;
    std::vector<std::pair<std::array<std::ptrdiff_t, 4>, double>> values; // (offset, w, h, stride) -> median
};

// A calibration frame loaded once and shared by every frame of a run.
struct CalibrationImage {
    Image<float> pixels;
    Image<std::uint8_t> mask; // MaskBits as read (non-finite values, BLANK)
    Header header;
    std::string path;
    std::shared_ptr<CalibrationMedians> medians = std::make_shared<CalibrationMedians>();
    int width() const { return pixels.width(); }
    int height() const { return pixels.height(); }
    // robustMedian (masters.hpp) of `section`, a view into `pixels` (the whole frame or a trimmed part),
    // remembered per section; thread-safe.
    double sectionMedian(const ImageView& section) const;
};

struct PrepareInputs {
    std::optional<CalibrationImage> bias;  // master bias, ADU
    std::optional<CalibrationImage> dark;  // master dark, bias-subtracted ADU at its EXPTIME
    std::optional<CalibrationImage> flat;  // master flat, relative response (median 1)
    Image<std::uint8_t> badPixels;         // non-zero = bad; empty: none
    std::string badPixelPath;              // file the mask came from ("" or "masters" when found in them)
    std::size_t autoHot = 0, autoDead = 0; // pixels found in the masters (autoBadPixels)
    Image<float> weight; // external weight map as read (PrepareParams::weightType); empty: none
    std::string weightPath;
    bool empty() const { return !bias && !dark && !flat && badPixels.empty() && weight.empty(); }
};

// Completes masters that the caller has read (the stage opens no file: core/pipeline/prepare_inputs.hpp
// reads them): checks that they agree in size with each other and that the dark has a positive EXPTIME,
// and, when params.autoBadPixels, ORs the hot pixels of the dark and the dead pixels of the flat into
// badPixels. Throws InvalidInput naming the file.
void completePrepareInputs(PrepareInputs& in, const PrepareParams& params = {});

struct PrepareResult {
    bool overscanApplied = false;
    double overscanLevel = 0.0; // ADU, the median of BIASSEC (row method: the median of the row levels)
    bool trimmed = false;
    int trimX0 = 0, trimY0 = 0; // 0-based offset of the kept section in the raw frame
    int rawWidth = 0, rawHeight = 0;
    bool biasApplied = false, darkApplied = false, flatApplied = false;
    double darkScale = 0.0;      // EXPTIME(frame) / EXPTIME(dark)
    std::size_t bleedPixels = 0; // pixels added to MaskSaturated by bleed trails and growth
    std::size_t badPixels = 0;   // pixels set MaskBad by the bad-pixel mask and the flat
    std::size_t saltPepperPixels = 0;
    std::size_t cosmicPixels = 0;
    bool bayerApplied = false;
    std::string weightMap;                // the weight map's file ("" : none)
    std::size_t weightUnusablePixels = 0; // pixels set MaskBad by the weight map
    std::vector<std::string> steps;       // what was done, in order (for the report)
};
void to_json(nlohmann::json& j, const PrepareResult& r);

// Prepares `frame` in place (pixels, mask, header, WCS, instrument.saturation). inputs may be null.
// Throws InvalidInput (mismatched masters, unusable sections, missing EXPTIME for a dark) naming the files.
PrepareResult prepareFrame(Frame& frame, const PrepareInputs* inputs, const PrepareParams& params,
                           RunContext& ctx);

// The building blocks (also used to build masters).
// FITS section "[x1:x2,y1:y2]" (1-based, inclusive) -> 0-based x0, y0, width, height. Reversed ranges
// are accepted (normalised). Returns false when the text is not a section.
bool parseFitsSection(const std::string& text, int& x0, int& y0, int& width, int& height);
// Steps 1-3 on their own (saturation/bleed, overscan, trim). Returns the filled part of a PrepareResult.
PrepareResult applyOverscanAndTrim(Frame& frame, const PrepareParams& params, RunContext& ctx);
// Step 1 alone: grows MaskSaturated along columns (bleed trails). Returns the pixels added.
std::size_t maskBleedTrails(const ImageView& pixels, Image<std::uint8_t>& mask, double saturation,
                            double bleedFraction, int grow);

} // namespace gpuphot
