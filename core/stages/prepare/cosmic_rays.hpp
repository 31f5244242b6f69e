#pragma once
// Frame preparation: cosmic-ray detection with L.A.Cosmic (van Dokkum 2001, PASP 113, 1420), with the
// parameter names of astroscrappy (McCully et al.) so that users recognise them, and the reference
// system's salt-and-pepper prefilter. Pure functions of the pixels; the prepare stage calls them and ORs
// the returned masks into Frame::mask. Photometry must use the mask: `cleaned` is for display only.
//
// Algorithm of detectCosmicRays (one iteration; the image is in electrons, e = (ADU - pedestal) * gain):
//  1. L+ : the 2x subsampled image convolved with the Laplacian [0 -1 0; -1 4 -1; 0 -1 0], negative values
//     clipped to 0, block-averaged back. Written directly on the original grid (no 2x buffer): for pixel v
//     with neighbours l, r, u (y-1), d (y+1), L+ = 0.25 * ((max(0, (2v - l) - u) + max(0, (2v - r) - u))
//     + (max(0, (2v - l) - d) + max(0, (2v - r) - d))), in float, in that order (2v is exact).
//  2. Noise model N = sqrt(max(med5(e) + readnoise^2, 1e-5)) (electrons), med5 the exact 5x5 median.
//  3. S = L+ / (2 N); S' = S - med5(S).
//  4. Fine structure F = (med3(e) - med7(med3(e))) / N, clipped below at 0.01.
//  5. Candidates: S' > sigclip and S' / F > objlim on good pixels. Growth (as astroscrappy): the 3x3
//     dilation of the candidates where S' > sigclip, then the 3x3 dilation of that where
//     S' > sigfrac * sigclip; good pixels only.
//  6. Found pixels join the mask; they are replaced in the working image by the mean of the good, not yet
//     masked pixels of their 5x5 neighbourhood (astroscrappy's "meanmask"; the background level when
//     there are none), and the next iteration starts. Stops after niter or when nothing new is found.
// Good pixels: not flagged MaskBad / MaskNonFinite / MaskOutside in the input mask, grown by one pixel
// (3x3), and not part of a saturated star: pixels >= satlevel whose 5x5 median exceeds satlevel / 10,
// dilated twice with the 5x5 kernel without its corners (astroscrappy's update_mask). MaskSaturated in the
// input mask is deliberately ignored: a cosmic ray can saturate a pixel, and must still be found.
// Non-finite pixels are replaced by the median of the good pixels before filtering.
//
// Medians are exact (ties resolved by value, so the result is the order statistic): every window is
// sorted by columns, then by rows with sorting networks, and the median is selected among the few
// entries of the doubly sorted window that can hold it (a pruned Batcher network). Edges replicate the
// nearest pixel. All steps are per-pixel functions of fixed neighbourhoods, computed row-parallel with
// OpenMP: the result does not depend on the thread count.
#include <cstddef>
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/model/image.hpp"

namespace gpuphot {

class RunContext;
struct Instrument;

struct CosmicRayParams {
    double sigclip = 4.5;    // Laplacian-to-noise limit for cosmic-ray pixels (astroscrappy sigclip)
    double sigfrac = 0.3;    // fraction of sigclip for neighbouring pixels (astroscrappy sigfrac)
    double objlim = 5.0;     // minimum contrast between the Laplacian and the fine structure image; raise
                             // it when star cores are flagged (astroscrappy objlim)
    int niter = 4;           // maximum number of iterations (astroscrappy niter)
    double gain = 0.0;       // e-/ADU; <= 0: from the frame's Instrument (astroscrappy gain)
    double readnoise = -1.0; // e- RMS; < 0: from the frame's Instrument (astroscrappy readnoise)
    double satlevel = 0.0;   // ADU; <= 0: the Instrument's saturation (infinite: no saturated-star
                             // masking) (astroscrappy satlevel)
    double pedestal = 0.0;   // ADU subtracted before the Poisson noise model, e.g. the bias level of a
                             // frame that still carries it (astroscrappy has inbkg for this)
    bool clean = false;      // also return `cleaned` (display only)
};


struct CosmicRayResult {
    Image<std::uint8_t> mask; // MaskCosmicRay where a cosmic ray was found, else 0 (OR it into Frame::mask)
    std::size_t crPixels = 0; // pixels set in mask
    std::size_t saturatedStarPixels = 0;                // pixels excluded as (grown) saturated stars
    std::vector<std::size_t> perIteration;              // new pixels found by each iteration that ran
    double gain = 0.0, readnoise = 0.0, satlevel = 0.0; // the values used (e-/ADU, e-, ADU)
    // Only when params.clean: the input with each cosmic-ray pixel replaced by the median of the good,
    // non-cosmic-ray pixels of its 5x5 neighbourhood (unchanged when there are none). DISPLAY ONLY.
    Image<float> cleaned;
};

// mask: optional (empty view = none), MaskBits, same size as pixels. Throws InvalidInput for an empty
// image, a mask of another size or unusable parameters (sigclip <= 0, sigfrac <= 0, objlim <= 0,
// niter < 1, non-finite gain/readnoise); Cancelled through ctx (checked between steps).
CosmicRayResult detectCosmicRays(const ImageView& pixels, const MaskView& mask, const Instrument& instrument,
                                 const CosmicRayParams& params, RunContext& ctx);

// The reference system's salt-and-pepper prefilter: a pixel is flagged when it lies more than
// highSigma above or more than lowSigma below the median of its window x window neighbourhood, with
// sigma = 1.4826 * MAD of those residuals (pixel - local median) over the valid pixels of the frame.
struct SaltPepperParams {
    double highSigma = 10.0; // hot (salt) pixels
    double lowSigma = 5.0;   // cold (pepper) pixels
    int window = 3;          // 3 or 5
};


struct SaltPepperResult {
    Image<std::uint8_t> mask; // MaskBad where flagged, else 0
    std::size_t high = 0;     // salt pixels flagged
    std::size_t low = 0;      // pepper pixels flagged
    double sigma = 0.0;       // ADU, the MAD-based sigma of the residuals
};

// mask: optional; pixels with MaskBad, MaskNonFinite or MaskOutside are neither used for sigma nor
// flagged (non-finite values enter the local medians as the frame's median). Throws InvalidInput for an
// empty image, a mask of another size or bad parameters.
SaltPepperResult saltPepperMask(const ImageView& pixels, const MaskView& mask, const SaltPepperParams& params,
                                RunContext& ctx);

// The exact size x size median filter used above (size 3, 5 or 7), edges replicated. Values must be
// finite (NaN has no order). Row-parallel, deterministic.
Image<float> medianFilter(const ImageView& image, int size, RunContext& ctx);

} // namespace gpuphot
