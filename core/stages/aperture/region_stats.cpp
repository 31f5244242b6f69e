#include "core/stages/aperture/region_stats.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/stages/background/background.hpp"
#include "core/util/errors.hpp"

namespace gpuphot {
namespace {

struct Box {
    int x0, y0, x1, y1; // inclusive
};

// The pixels that can hold the region's inside, clipped to the image.
Box boundingBox(const PixelRegion& r, int width, int height) {
    double lox = r.points[0], hix = lox, loy = r.points[1], hiy = loy;
    if (r.shape == RegionShape::Polygon) {
        for (std::size_t i = 0; i + 1 < r.points.size(); i += 2) {
            lox = std::min(lox, r.points[i]), hix = std::max(hix, r.points[i]);
            loy = std::min(loy, r.points[i + 1]), hiy = std::max(hiy, r.points[i + 1]);
        }
    } else if (!r.sizes.empty()) {
        double reach = r.sizes[0];
        if (r.shape == RegionShape::Ellipse) reach = std::max(r.sizes[0], r.sizes[1]);
        if (r.shape == RegionShape::Box) reach = 0.5 * std::hypot(r.sizes[0], r.sizes[1]);
        lox -= reach, hix += reach, loy -= reach, hiy += reach;
    }
    auto clip = [](double v, int n) { return static_cast<int>(std::clamp(v, -1.0, static_cast<double>(n))); };
    return {std::max(clip(std::floor(lox), width), 0), std::max(clip(std::floor(loy), height), 0),
            std::min(clip(std::ceil(hix), width), width - 1),
            std::min(clip(std::ceil(hiy), height), height - 1)};
}

double medianOf(std::vector<float>& v) {
    const std::size_t n = v.size(), h = n / 2;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(h), v.end());
    const double upper = v[h];
    if (n % 2 == 1) return upper;
    const double lower = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(h));
    return 0.5 * (lower + upper);
}

} // namespace

RegionStats regionStatistics(const ImageView& image, const MaskView& mask, const PixelRegion& region,
                             const BackgroundResult* background) {
    if (!mask.empty() && (mask.width != image.width || mask.height != image.height))
        throw InvalidInput("region statistics: the mask is not the image's size");
    if (region.points.size() < 2 || image.empty())
        throw InvalidInput("region statistics: empty region or image");
    const bool bkg = background && background->width == image.width && background->height == image.height &&
                     (background->hasFullMaps() || background->sampler);
    const Box b = boundingBox(region, image.width, image.height);
    RegionStats s;
    s.haveBackground = bkg;
    std::vector<float> values;
    double bsum = 0, wsum = 0, wx = 0, wy = 0;
    s.min = std::numeric_limits<double>::infinity(), s.max = -s.min;
    for (int y = b.y0; y <= b.y1; ++y)
        for (int x = b.x0; x <= b.x1; ++x) {
            if (!contains(region, x, y)) continue;
            const float v = image(x, y);
            if (!std::isfinite(v) || (!mask.empty() && mask(x, y) != 0)) {
                ++s.masked;
                continue;
            }
            values.push_back(v);
            s.sum += v;
            s.min = std::min(s.min, static_cast<double>(v)), s.max = std::max(s.max, static_cast<double>(v));
            const double w = bkg ? v - static_cast<double>(background->levelAt(x, y)) : v;
            bsum += w, wsum += w, wx += w * x, wy += w * y;
        }
    s.pixels = values.size();
    if (s.pixels == 0)
        throw InvalidInput("region statistics: no usable pixel inside the region on the image");
    const double n = static_cast<double>(s.pixels);
    s.mean = s.sum / n;
    double ss = 0; // two passes: no cancellation on a high sky
    for (float v : values)
        ss += (v - s.mean) * (v - s.mean);
    s.stddev = s.pixels > 1 ? std::sqrt(ss / (n - 1.0)) : 0.0;
    s.median = medianOf(values);
    s.backgroundSubtractedSum = bkg ? bsum : std::nan("");
    s.centroidX = wsum > 0 ? wx / wsum : std::nan("");
    s.centroidY = wsum > 0 ? wy / wsum : std::nan("");
    return s;
}

} // namespace gpuphot
