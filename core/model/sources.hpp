#pragma once
// The detection stage's output: one entry per object, struct of arrays. Pixel coordinates are 0-based
// (pixel centres at integers); fluxes in ADU above the local background. Later stages read these and
// add their own Result structs; the catalog assembler joins them by index.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/util/prefault.hpp"

namespace gpuphot {

struct Sources {
    std::vector<double> x, y;          // best position: windowed centroid (SExtractor XWIN/YWIN)
    std::vector<double> xErr, yErr;    // 1-sigma errors of x, y (px)
    std::vector<double> xIso, yIso;    // isophotal barycentre (SExtractor X_IMAGE/Y_IMAGE - 1)
    std::vector<double> x2, y2, xy;    // second central moments (px^2)
    std::vector<double> a, b, theta;   // semi-axes (px) and angle (deg, counter-clockwise from +x)
    std::vector<double> fluxIso;       // ADU, sum above background inside the isophote
    std::vector<double> fluxIsoErr;
    std::vector<std::int32_t> areaIso; // px above threshold
    std::vector<double> peak;          // ADU above background, highest pixel (unfiltered image)
    std::vector<std::int32_t> xMin, xMax, yMin, yMax; // bounding box of the isophote (inclusive)
    std::vector<std::uint32_t> flags;  // SourceFlags
    std::vector<std::int32_t> segmentId; // value of the object's pixels in the segmentation map (>= 1)

    std::size_t size() const { return x.size(); }
    // Resizes every column; threads > 1: the new pages are faulted in on that many threads first.
    void resize(std::size_t n, int threads = 1);
};

namespace detail {
template <class T> void growColumn(std::vector<T>& v, std::size_t n, int threads) {
    if (threads > 1 && n > v.size()) {
        v.reserve(n);
        prefaultBytes(reinterpret_cast<unsigned char*>(v.data() + v.size()), (n - v.size()) * sizeof(T),
                      threads);
    }
    v.resize(n);
}
} // namespace detail

inline void Sources::resize(std::size_t n, int threads) {
    for (auto* v : {&x, &y, &xErr, &yErr, &xIso, &yIso, &x2, &y2, &xy, &a, &b, &theta, &fluxIso, &fluxIsoErr, &peak})
        detail::growColumn(*v, n, threads);
    for (auto* v : {&areaIso, &xMin, &xMax, &yMin, &yMax, &segmentId})
        detail::growColumn(*v, n, threads);
    detail::growColumn(flags, n, threads);
}

} // namespace gpuphot
