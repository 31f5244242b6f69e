#pragma once
// Master calibration frames: combine lists of bias, dark or flat frames (median or sigma-clipped mean,
// per pixel), scale darks by EXPTIME, normalise flats by their median, and find hot and dead pixels in
// the masters (-> a bad-pixel mask, non-zero = bad).
//
// The functions take frames already read (core/io reads files; `gpuphot master` wires them). Every
// input goes through the same overscan subtraction and trimming as the light frames (prepare.hpp), so
// a master has the size of a prepared light frame. Results do not depend on the thread count: each
// output pixel is a function of its own input pixels only.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/model/frame.hpp"
#include "core/model/image.hpp"
#include "core/stages/prepare/prepare.hpp"

namespace gpuphot {

class RunContext;

enum class CombineMethod {
    Median,      // per-pixel median (mean of the two middle values for an even count)
    ClippedMean, // mean after iterative clipping at clipSigma robust sigmas (1.4826 MAD) around the median
};

struct CombineParams {
    CombineMethod method = CombineMethod::Median;
    double clipSigma = 3.0; // sigma, ClippedMean only (IRAF imcombine's lsigma/hsigma, ccdproc sigma_clip)
    int clipIterations = 3; // rounds of clipping, ClippedMean only
};

// Parses "median" / "clipped" (also "mean", "sigma-clip"); throws InvalidInput naming `what`.
CombineMethod parseCombineMethod(const std::string& name, const std::string& what);
std::string combineMethodName(CombineMethod m);

// Per-pixel combination of equally sized images; `scales` (empty or one per image) multiply each
// image first. Pixels that are non-finite or non-zero in the image's mask (when `masks` is given) do not
// take part; a pixel without any valid value is NaN. Throws InvalidInput on an empty list or mismatched sizes.
Image<float> combineImages(const std::vector<ImageView>& images, const CombineParams& p, RunContext& ctx,
                           const std::vector<double>& scales = {}, const std::vector<MaskView>& masks = {});

struct BadPixelParams {
    double hotSigma = 6.0;   // a master-dark pixel above median + hotSigma * robust sigma is hot
    double hotMinAdu = 0.0;  // ... and at least this many ADU above the median (at the dark's EXPTIME)
    double flatLow = 0.5;    // a master-flat pixel below this fraction of the flat's median is dead
    double flatHigh = 1.5;   // ... above this fraction: over-responsive (bad)
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(BadPixelParams, hotSigma, hotMinAdu, flatLow, flatHigh)

struct BadPixelResult {
    Image<std::uint8_t> mask; // 1: bad, 0: good (the size of the dark or flat given)
    std::size_t hot = 0;      // from the dark
    std::size_t dead = 0;     // from the flat (low or high)
    double darkMedian = 0.0;  // ADU
    double darkSigma = 0.0;   // ADU, 1.4826 MAD
};

// Either view may be empty (not used); when both are given their sizes must agree (InvalidInput).
BadPixelResult detectBadPixels(const ImageView& masterDark, const ImageView& masterFlat, const BadPixelParams& p);

// Builds a master from raw frames of one kind. Each frame is overscan-subtracted and trimmed
// (prepare.overscan / prepare.trim), then:
//  bias: combined;
//  dark: minus the master bias (if given), combined after scaling each to the first frame's EXPTIME
//        (the master keeps that EXPTIME; frames without EXPTIME are InvalidInput when the times differ);
//  flat: minus bias and dark (scaled by EXPTIME), each normalised by its median, combined, normalised by
//        the median of the result (so a flat-fielded frame keeps its level).
// All frames must have the same size, binning and (flats) FILTER; errors are InvalidInput naming the
// two files. The master's header: the first frame's, without the section keywords, with IMAGETYP,
// NCOMBINE, COMBMETH and (dark/flat) the calibration used.
struct MasterResult {
    Frame master;
    std::size_t combined = 0;
    double median = 0.0;  // ADU: the master's median (flat: of the combination before normalising)
};
MasterResult buildMaster(const std::string& type, std::vector<Frame>& frames, const CombineParams& combine,
                         const PrepareParams& prepare, const Frame* bias, const Frame* dark, RunContext& ctx);

// Median of the finite, unmasked pixels (subsampled to at most ~4 million pixels, exact below that).
double robustMedian(const ImageView& image, const MaskView& mask = {}, double* sigma = nullptr);

} // namespace gpuphot
