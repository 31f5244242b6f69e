#include "viewers/image_lod.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace gpuphot::viewers {

Image<float> blockMean(const ImageViewT<float>& image, int factor) {
    factor = std::max(1, factor);
    if (image.empty()) return {};
    const int w = (image.width + factor - 1) / factor, h = (image.height + factor - 1) / factor;
    Image<float> out(w, h, Image<float>::NoInit{});
    std::vector<double> sum(static_cast<std::size_t>(w));
    std::vector<int> count(static_cast<std::size_t>(w));
    for (int j = 0; j < h; ++j) {
        std::fill(sum.begin(), sum.end(), 0.0);
        std::fill(count.begin(), count.end(), 0);
        const int y1 = std::min(image.height, (j + 1) * factor);
        for (int y = j * factor; y < y1; ++y) {
            const float* row = &image(0, y);
            for (int i = 0; i < w; ++i) {
                const int x0 = i * factor, x1 = std::min(image.width, x0 + factor);
                double s = 0.0;
                int n = 0;
                for (int x = x0; x < x1; ++x)
                    if (std::isfinite(row[x])) {
                        s += row[x];
                        ++n;
                    }
                sum[static_cast<std::size_t>(i)] += s;
                count[static_cast<std::size_t>(i)] += n;
            }
        }
        float* dst = &out(0, j);
        for (int i = 0; i < w; ++i)
            dst[i] = count[static_cast<std::size_t>(i)] > 0
                         ? static_cast<float>(sum[static_cast<std::size_t>(i)] / count[static_cast<std::size_t>(i)])
                         : std::numeric_limits<float>::quiet_NaN();
    }
    return out;
}

std::vector<LodLevel> buildLodLevels(const ImageViewT<float>& image, std::int64_t minPixels, int minSide) {
    std::vector<LodLevel> levels;
    if (image.empty() || static_cast<std::int64_t>(image.width) * image.height < minPixels) return levels;
    auto level = std::make_shared<Image<float>>(blockMean(image, 4));
    int factor = 4;
    for (;;) {
        levels.push_back({factor, level});
        if (std::max(level->width(), level->height()) <= minSide) break;
        level = std::make_shared<Image<float>>(blockMean(level->view(), 2));
        factor *= 2;
    }
    return levels;
}

} // namespace gpuphot::viewers
