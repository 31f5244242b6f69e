#pragma once
// The mapping between image pixels (0-based, centres at integers, y up as in DS9) and widget pixels
// (origin top-left, y down), Qt-free so it is unit-tested without a display.
#include <algorithm>
#include <array>
#include <cmath>

namespace gpuphot::viewers {

struct ViewTransform {
    double cx = 0.0, cy = 0.0; // image coordinate at the widget centre
    double zoom = 1.0;         // widget px per image px
    double width = 1.0, height = 1.0; // widget size (px)

    std::array<double, 2> imageToWidget(double x, double y) const {
        return {(x - cx) * zoom + 0.5 * width, 0.5 * height - (y - cy) * zoom};
    }
    std::array<double, 2> widgetToImage(double wx, double wy) const {
        return {cx + (wx - 0.5 * width) / zoom, cy - (wy - 0.5 * height) / zoom};
    }
    // Zoom that shows the whole image [-0.5, w - 0.5] x [-0.5, h - 0.5] with a small margin.
    static double fitZoom(int imageWidth, int imageHeight, double width, double height, double margin = 0.98) {
        if (imageWidth <= 0 || imageHeight <= 0 || width <= 0 || height <= 0) return 1.0;
        return margin * std::min(width / imageWidth, height / imageHeight);
    }
    // Visible image rectangle: {xmin, ymin, xmax, ymax}.
    std::array<double, 4> visibleImageRect() const {
        const auto a = widgetToImage(0, height), b = widgetToImage(width, 0);
        return {a[0], a[1], b[0], b[1]};
    }
};

} // namespace gpuphot::viewers
