#pragma once
// Robust statistics of a sample, shared by the stages that estimate a level and its error from a few
// hundred values (curves of growth, aperture-correction errors, PSF-to-aperture ties).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <numbers>
#include <utility>
#include <vector>

namespace gpuphot {

// The median (the mean of the two middle values for an even count): the values a sort would put in the
// middle, found by selection. NaN for an empty sample.
inline double robustMedian(std::vector<double> v) {
    if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
    const std::size_t n = v.size(), m = n / 2;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(m), v.end());
    if (n % 2) return v[m];
    const double below = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(m));
    return 0.5 * (below + v[m]);
}

// The Gaussian-equivalent sigma of v about `median`: 1.4826 times the median absolute deviation.
inline double madSigma(const std::vector<double>& v, double median) {
    std::vector<double> d(v.size());
    for (std::size_t i = 0; i < v.size(); ++i)
        d[i] = std::abs(v[i] - median);
    return 1.482602218505602 * robustMedian(std::move(d));
}

// The median of v and its standard error, sqrt(pi/2) sigma / sqrt(n) (sigma from the MAD).
inline std::pair<double, double> medianWithError(const std::vector<double>& v) {
    const double med = robustMedian(v);
    if (v.empty()) return {med, std::numeric_limits<double>::quiet_NaN()};
    return {med,
            std::sqrt(std::numbers::pi / 2.0) * madSigma(v, med) / std::sqrt(static_cast<double>(v.size()))};
}

} // namespace gpuphot
