#pragma once
// Statistics of the pixels inside a region (ds9_regions.hpp's PixelRegion): the workbench's
// "Statistics in regions". A pixel belongs to the region when its centre is inside (no partial
// pixels); masked pixels (any mask bit) and non-finite values are left out and counted.
//
// Units: ADU; positions 0-based image pixels (centres at integers).
#include <cstddef>

#include "core/io/ds9_regions.hpp"
#include "core/model/image.hpp"

namespace gpuphot {

struct BackgroundResult;

struct RegionStats {
    std::size_t pixels = 0; // pixels used (centre inside, unmasked, finite)
    std::size_t masked = 0; // pixels inside that were left out (mask bit set or non-finite)
    double sum = 0.0;
    double mean = 0.0, median = 0.0;
    double stddev = 0.0; // sample standard deviation (n - 1); 0 for one pixel
    double min = 0.0, max = 0.0;
    // Sum of (pixel - background level) when the background is known (NaN otherwise).
    double backgroundSubtractedSum = 0.0;
    bool haveBackground = false;
    // Weighted centroid, weights = pixel - background (or the pixel values without a background); NaN
    // when the weights do not sum to a positive value.
    double centroidX = 0.0, centroidY = 0.0;
};

// mask: may be empty. background: may be null or without maps (then no background-subtracted sum).
// Throws InvalidInput when the region has no pixel on the image or the mask size differs.
RegionStats regionStatistics(const ImageView& image, const MaskView& mask, const PixelRegion& region,
                             const BackgroundResult* background);

} // namespace gpuphot
