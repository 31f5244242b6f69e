#pragma once
// Level of detail for the image texture: reduced copies of a large frame (mipmap-like levels) that the
// renderer draws instead of the full-resolution texture when the view is zoomed far out, so that a fit view
// of a 151 MP frame reads a texture of a few MP (no aliasing, a fraction of the texel fetches and cache
// misses). Plain C++: built off the UI thread (ImageView does it on Qt's global thread pool).
//
// Level of factor F: pixel (i, j) is the mean of the finite pixels of the full-resolution block
// [F i, F i + F) x [F j, F j + F) (clipped at the image edge); NaN when the block has none. The first level
// (F = 4) is made from the frame; each next level (2 F) from the previous one, as the mean of the finite
// level pixels of its 2 x 2 block (the usual mipmap chain; equal to the block mean when every pixel is finite
// and the size divisible).
#include <cstdint>
#include <memory>
#include <vector>

#include "core/model/image.hpp"

namespace gpuphot::viewers {

struct LodLevel {
    int factor = 1; // full-resolution pixels per level pixel, per axis
    std::shared_ptr<const Image<float>> image;
};

// Block mean by an integer factor (>= 1), finite pixels only (NaN where a block has none).
Image<float> blockMean(const ImageViewT<float>& image, int factor);

// Levels of factor 4, 8, 16, ... down to a level whose longer side is <= minSide px. Empty when the image
// has fewer than minPixels pixels (a small frame's full-resolution texture is cheap to draw at any zoom).
std::vector<LodLevel> buildLodLevels(const ImageViewT<float>& image, std::int64_t minPixels = 16'000'000,
                                     int minSide = 512);

} // namespace gpuphot::viewers
