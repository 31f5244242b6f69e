#pragma once
// The mapping between image pixels (0-based, centres at integers, y up as in DS9) and widget pixels
// (origin top-left, y down), Qt-free so it is unit-tested without a display. The view's orientation
// (DS9's Zoom > Invert X / Invert Y / 90 deg) flips the image axes first, then turns the result
// counter-clockwise by quarter turns; pixels stay square, so distances on screen are zoom times distances
// in the image whatever the orientation.
#include <algorithm>
#include <array>
#include <cmath>
#include <tuple>
#include <utility>

namespace gpuphot::viewers {

struct Orientation {
    bool flipX = false, flipY = false;
    int quarterTurns = 0; // counter-clockwise on screen, 0..3

    // Image offset (dx, dy) to screen offset (right, up), both in image px.
    std::array<double, 2> apply(double dx, double dy) const {
        double x = flipX ? -dx : dx, y = flipY ? -dy : dy;
        for (int k = 0; k < turns(); ++k)
            std::tie(x, y) = std::pair{-y, x};
        return {x, y};
    }
    std::array<double, 2> invert(double ux, double uy) const {
        double x = ux, y = uy;
        for (int k = 0; k < turns(); ++k)
            std::tie(x, y) = std::pair{y, -x};
        return {flipX ? -x : x, flipY ? -y : y};
    }
    int turns() const { return ((quarterTurns % 4) + 4) % 4; }
    bool swapsAxes() const { return turns() % 2 == 1; }
    // Row-major 2x2 matrix of apply() (the shaders' u_orient).
    std::array<float, 4> matrix() const {
        const auto c0 = apply(1, 0), c1 = apply(0, 1);
        return {static_cast<float>(c0[0]), static_cast<float>(c1[0]), static_cast<float>(c0[1]),
                static_cast<float>(c1[1])};
    }
    bool operator==(const Orientation&) const = default;
};

struct ViewTransform {
    double cx = 0.0, cy = 0.0;        // image coordinate at the widget centre
    double zoom = 1.0;                // widget px per image px
    double width = 1.0, height = 1.0; // widget size (px)
    Orientation orientation;

    std::array<double, 2> imageToWidget(double x, double y) const {
        const auto u = orientation.apply(x - cx, y - cy);
        return {u[0] * zoom + 0.5 * width, 0.5 * height - u[1] * zoom};
    }
    std::array<double, 2> widgetToImage(double wx, double wy) const {
        const auto d = orientation.invert((wx - 0.5 * width) / zoom, (0.5 * height - wy) / zoom);
        return {cx + d[0], cy + d[1]};
    }
    // Image offset of a widget offset (dx right, dy down, widget px): what a drag of the image moves.
    std::array<double, 2> widgetDeltaToImage(double dx, double dy) const {
        return orientation.invert(dx / zoom, -dy / zoom);
    }
    // Zoom that shows the whole image [-0.5, w - 0.5] x [-0.5, h - 0.5] with a small margin.
    static double fitZoom(int imageWidth, int imageHeight, double width, double height,
                          double margin = 0.98) {
        if (imageWidth <= 0 || imageHeight <= 0 || width <= 0 || height <= 0) return 1.0;
        return margin * std::min(width / imageWidth, height / imageHeight);
    }
    // Visible image rectangle (the bounding box of the widget's corners): {xmin, ymin, xmax, ymax}.
    std::array<double, 4> visibleImageRect() const {
        const auto a = widgetToImage(0, height), b = widgetToImage(width, 0);
        return {std::min(a[0], b[0]), std::min(a[1], b[1]), std::max(a[0], b[0]), std::max(a[1], b[1])};
    }
};

} // namespace gpuphot::viewers
