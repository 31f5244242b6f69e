#include "viewers/stretch.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace gpuphot::viewers {

std::vector<float> samplePixels(const ImageViewT<float>& image, std::size_t maxSamples) {
    std::vector<float> out;
    if (image.empty() || maxSamples == 0) return out;
    const double w = image.width, h = image.height;
    int nx = image.width, ny = image.height;
    if (image.pixelCount() > maxSamples) {
        // A grid with square-ish cells: nx / ny ~ w / h, nx * ny ~ maxSamples.
        const double cell = std::sqrt(w * h / static_cast<double>(maxSamples));
        nx = std::clamp(static_cast<int>(w / cell), 1, image.width);
        ny = std::clamp(static_cast<int>(static_cast<double>(maxSamples) / nx), 1, image.height);
    }
    std::vector<int> xs(static_cast<std::size_t>(nx));
    for (int i = 0; i < nx; ++i) xs[static_cast<std::size_t>(i)] = static_cast<int>((i + 0.5) * w / nx);
    out.reserve(static_cast<std::size_t>(nx) * static_cast<std::size_t>(ny));
    for (int j = 0; j < ny; ++j) {
        const float* row = image.row(static_cast<int>((j + 0.5) * h / ny));
        for (int x : xs) {
            const float v = row[x];
            if (std::isfinite(v)) out.push_back(v);
        }
    }
    return out;
}

double percentile(std::vector<float>& values, double p) {
    if (values.empty()) return std::numeric_limits<double>::quiet_NaN();
    p = std::clamp(p, 0.0, 100.0);
    const double pos = p / 100.0 * static_cast<double>(values.size() - 1);
    const auto k = static_cast<std::size_t>(std::floor(pos));
    const double frac = pos - static_cast<double>(k);
    std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(k), values.end());
    const double a = values[k];
    if (frac == 0.0 || k + 1 >= values.size()) return a;
    const double b = *std::min_element(values.begin() + static_cast<std::ptrdiff_t>(k) + 1, values.end());
    return a + (b - a) * frac;
}

std::pair<double, double> zscale(std::span<const float> values, const ZScaleParams& params) {
    std::vector<double> s;
    std::size_t finite = 0;
    for (float v : values) finite += std::isfinite(v) ? 1 : 0;
    if (finite == 0) return {0.0, 1.0};
    const std::size_t nSamples = static_cast<std::size_t>(std::max(1, params.nSamples));
    const std::size_t stride =
        std::max<std::size_t>(1, static_cast<std::size_t>(std::max(1.0, double(finite) / double(nSamples))));
    std::size_t idx = 0;
    for (float v : values) {
        if (!std::isfinite(v)) continue;
        if (idx % stride == 0 && s.size() < nSamples) s.push_back(v);
        ++idx;
    }
    std::sort(s.begin(), s.end());
    const std::size_t npix = s.size();
    double vmin = s.front(), vmax = s.back();
    const std::size_t minpix =
        std::max<std::size_t>(static_cast<std::size_t>(std::max(0, params.minPixels)),
                              static_cast<std::size_t>(static_cast<double>(npix) * params.maxReject));
    const std::size_t ngrow = std::max<std::size_t>(1, static_cast<std::size_t>(static_cast<double>(npix) * 0.01));
    std::vector<char> bad(npix, 0), grown(npix, 0);
    std::size_t ngood = npix, lastNgood = npix + 1;
    double slope = 0.0, intercept = 0.0;
    bool fitted = false;
    for (int it = 0; it < params.maxIterations; ++it) {
        if (ngood >= lastNgood || ngood < minpix) break;
        // Unweighted least-squares line through the good samples (x = index).
        double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
        for (std::size_t i = 0; i < npix; ++i) {
            if (bad[i]) continue;
            const double x = static_cast<double>(i);
            n += 1;
            sx += x;
            sy += s[i];
            sxx += x * x;
            sxy += x * s[i];
        }
        const double den = n * sxx - sx * sx;
        slope = den != 0.0 ? (n * sxy - sx * sy) / den : 0.0;
        intercept = (sy - slope * sx) / n;
        fitted = true;
        // k-sigma threshold from the population std of the good residuals.
        double m = 0, m2 = 0;
        for (std::size_t i = 0; i < npix; ++i) {
            if (bad[i]) continue;
            m += s[i] - (intercept + slope * static_cast<double>(i));
        }
        m /= n;
        for (std::size_t i = 0; i < npix; ++i) {
            if (bad[i]) continue;
            const double d = s[i] - (intercept + slope * static_cast<double>(i)) - m;
            m2 += d * d;
        }
        const double threshold = params.krej * std::sqrt(m2 / n);
        for (std::size_t i = 0; i < npix; ++i) {
            const double flat = s[i] - (intercept + slope * static_cast<double>(i));
            if (flat < -threshold || flat > threshold) bad[i] = 1;
        }
        // Dilate by ngrow samples, aligned as numpy.convolve(mode="same").
        const std::ptrdiff_t off = static_cast<std::ptrdiff_t>((ngrow - 1) / 2);
        const std::ptrdiff_t np = static_cast<std::ptrdiff_t>(npix);
        std::vector<std::ptrdiff_t> prefix(npix + 1, 0);
        for (std::size_t i = 0; i < npix; ++i) prefix[i + 1] = prefix[i] + bad[i];
        for (std::ptrdiff_t i = 0; i < np; ++i) {
            const std::ptrdiff_t hiIdx = std::min(np - 1, i + off);
            const std::ptrdiff_t loIdx = std::max<std::ptrdiff_t>(0, i + off - static_cast<std::ptrdiff_t>(ngrow) + 1);
            grown[static_cast<std::size_t>(i)] = hiIdx >= loIdx && prefix[hiIdx + 1] - prefix[loIdx] > 0;
        }
        bad.swap(grown);
        lastNgood = ngood;
        ngood = static_cast<std::size_t>(std::count(bad.begin(), bad.end(), 0));
    }
    if (fitted && ngood >= minpix) {
        if (params.contrast > 0) slope /= params.contrast;
        const std::size_t center = (npix - 1) / 2;
        const double median = npix % 2 == 1 ? s[npix / 2] : 0.5 * (s[npix / 2 - 1] + s[npix / 2]);
        vmin = std::max(vmin, median - (static_cast<double>(center) - 1.0) * slope);
        vmax = std::min(vmax, median + static_cast<double>(npix - center) * slope);
    }
    return {vmin, vmax};
}

std::pair<double, double> computeLimits(std::span<const float> sample, const LimitRequest& request) {
    double lo = 0.0, hi = 1.0;
    if (request.mode == LimitMode::Manual) {
        lo = request.manualLow;
        hi = request.manualHigh;
    } else if (!sample.empty()) {
        if (request.mode == LimitMode::MinMax) {
            const auto [mn, mx] = std::minmax_element(sample.begin(), sample.end());
            lo = *mn;
            hi = *mx;
        } else if (request.mode == LimitMode::Percentile) {
            std::vector<float> copy(sample.begin(), sample.end());
            lo = percentile(copy, request.lowPercent);
            hi = percentile(copy, request.highPercent);
        } else {
            std::tie(lo, hi) = zscale(sample, request.zscale);
        }
    }
    if (!std::isfinite(lo) || !std::isfinite(hi)) return {0.0, 1.0};
    if (hi < lo) std::swap(lo, hi);
    if (hi == lo) {
        const double d = std::max(1e-6, std::abs(lo) * 1e-6);
        lo -= d;
        hi += d;
    }
    return {lo, hi};
}

std::vector<float> histEqLut(std::span<const float> sample, double lo, double hi, int n) {
    n = std::max(2, n);
    std::vector<double> counts(static_cast<std::size_t>(n), 0.0);
    const double scale = (n - 1) / (hi - lo);
    double total = 0;
    for (float v : sample) {
        if (!(v >= lo && v <= hi)) continue;
        // Bin i collects values in ((i - 1) / (n-1), i / (n-1)] of the range, so cdf[i] counts v <= edge i.
        const double pos = (v - lo) * scale;
        const auto i = static_cast<std::size_t>(std::clamp(std::ceil(pos), 0.0, double(n - 1)));
        counts[i] += 1;
        total += 1;
    }
    std::vector<float> lut(static_cast<std::size_t>(n));
    if (total == 0) {
        for (int i = 0; i < n; ++i) lut[static_cast<std::size_t>(i)] = float(i) / float(n - 1);
        return lut;
    }
    double acc = 0;
    for (int i = 0; i < n; ++i) {
        acc += counts[static_cast<std::size_t>(i)];
        lut[static_cast<std::size_t>(i)] = static_cast<float>(acc / total);
    }
    return lut;
}

float stretchValue(float v, const StretchParams& p, std::span<const float> lut) {
    const float lo = static_cast<float>(p.lo), hi = static_cast<float>(p.hi);
    float t = (v - lo) / (hi - lo);
    t = std::clamp(t, 0.0f, 1.0f);
    switch (p.stretch) {
    case Stretch::Linear:
        return t;
    case Stretch::Log:
        return std::log(1.0f + p.logExponent * t) / std::log(1.0f + p.logExponent);
    case Stretch::Sqrt:
        return std::sqrt(t);
    case Stretch::Asinh:
        return std::asinh(t / p.asinhSoftening) / std::asinh(1.0f / p.asinhSoftening);
    case Stretch::HistEq: {
        if (lut.size() < 2) return t;
        const float pos = t * static_cast<float>(lut.size() - 1);
        const auto i = std::min(static_cast<std::size_t>(pos), lut.size() - 2);
        const float f = pos - static_cast<float>(i);
        return lut[i] + (lut[i + 1] - lut[i]) * f;
    }
    }
    return t;
}

namespace {
std::uint32_t pack(double r, double g, double b) {
    auto c = [](double x) { return static_cast<std::uint32_t>(std::lround(std::clamp(x, 0.0, 1.0) * 255.0)); };
    return c(r) | c(g) << 8 | c(b) << 16 | 0xFFu << 24;
}
// Nine anchor colours of matplotlib's viridis (its published hex values at t = k / 8).
constexpr std::array<std::array<int, 3>, 9> kViridis{{{68, 1, 84},
                                                      {72, 40, 120},
                                                      {62, 73, 137},
                                                      {49, 104, 142},
                                                      {38, 130, 142},
                                                      {31, 158, 137},
                                                      {53, 183, 121},
                                                      {110, 206, 88},
                                                      {253, 231, 37}}};
} // namespace

std::array<std::uint32_t, 256> colormapTable(Colormap colormap) {
    std::array<std::uint32_t, 256> table{};
    for (int i = 0; i < 256; ++i) {
        const double t = i / 255.0;
        switch (colormap) {
        case Colormap::Grey:
            table[static_cast<std::size_t>(i)] = pack(t, t, t);
            break;
        case Colormap::Inverted:
            table[static_cast<std::size_t>(i)] = pack(1 - t, 1 - t, 1 - t);
            break;
        case Colormap::Heat:
            table[static_cast<std::size_t>(i)] = pack(3 * t, 3 * t - 1, 3 * t - 2);
            break;
        case Colormap::Cool:
            table[static_cast<std::size_t>(i)] = pack(t, 1 - t, 1);
            break;
        case Colormap::Viridis: {
            const double pos = t * 8.0;
            const int k = std::min(7, static_cast<int>(pos));
            const double f = pos - k;
            const auto& a = kViridis[static_cast<std::size_t>(k)];
            const auto& b = kViridis[static_cast<std::size_t>(k + 1)];
            table[static_cast<std::size_t>(i)] = pack((a[0] + (b[0] - a[0]) * f) / 255.0,
                                                      (a[1] + (b[1] - a[1]) * f) / 255.0,
                                                      (a[2] + (b[2] - a[2]) * f) / 255.0);
            break;
        }
        }
    }
    return table;
}

} // namespace gpuphot::viewers
