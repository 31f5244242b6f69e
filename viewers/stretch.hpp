#pragma once
// Display stretch, limits and colormaps of the image viewer, Qt-free. Limits come from a deterministic
// sample of the pixels (a regular grid, non-finite values skipped), so a 151-megapixel frame costs a few
// tens of milliseconds. stretchValue() and colormapTable() are the CPU reference of what the fragment
// shader (resources/shaders/image.frag.glsl) does: the shader must give the same colours.
#include <array>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "core/model/image.hpp"

namespace gpuphot::viewers {

enum class Stretch { Linear, Log, Sqrt, Asinh, HistEq };
enum class LimitMode { MinMax, Percentile, ZScale, Manual };
enum class Colormap { Grey, Inverted, Heat, Viridis, Cool };

// At most about maxSamples finite pixels on a regular grid (row and column steps chosen so the grid covers
// the whole frame); every pixel when the image has no more than maxSamples. Deterministic.
std::vector<float> samplePixels(const ImageViewT<float>& image, std::size_t maxSamples = 500'000);

// Linear-interpolated percentile (numpy's default) of values, p in [0, 100]. values is reordered.
double percentile(std::vector<float>& values, double p);

struct ZScaleParams {
    int nSamples = 1000; // IRAF/astropy: the sample is values[::stride][:nSamples]
    double contrast = 0.25;
    double maxReject = 0.5;
    int minPixels = 5;
    double krej = 2.5;
    int maxIterations = 5;
};
// IRAF's zscale (as astropy.visualization.ZScaleInterval) on the given values in the given order.
std::pair<double, double> zscale(std::span<const float> values, const ZScaleParams& params = {});

struct LimitRequest {
    LimitMode mode = LimitMode::ZScale;
    double lowPercent = 0.25;
    double highPercent = 99.75;
    double manualLow = 0.0, manualHigh = 1.0;
    ZScaleParams zscale;
};
// Display limits from a sample (samplePixels). Returns lo < hi always (widened when the sample is flat
// or empty).
std::pair<double, double> computeLimits(std::span<const float> sample, const LimitRequest& request);

struct StretchParams {
    Stretch stretch = Stretch::Linear;
    double lo = 0.0, hi = 1.0;
    float asinhSoftening = 0.1f; // asinh(t / s) / asinh(1 / s)
    float logExponent = 1000.0f; // log(1 + a t) / log(1 + a)
};

inline constexpr int kHistEqLutSize = 4096;
// Histogram equalisation table over [lo, hi]: lut[i] = fraction of the in-range sample at or below
// lo + (i / (n - 1)) (hi - lo), so lut[0] ~ 0 and lut[n-1] = 1. Interpolated linearly in t.
std::vector<float> histEqLut(std::span<const float> sample, double lo, double hi, int n = kHistEqLutSize);

// The shader's stretch: t = clamp((v - lo) / (hi - lo), 0, 1) then the stretch function; returns [0, 1].
// lut is used by HistEq only.
float stretchValue(float v, const StretchParams& params, std::span<const float> lut = {});

// 256 RGBA8 entries (r | g << 8 | b << 16 | a << 24), index = round(255 t).
std::array<std::uint32_t, 256> colormapTable(Colormap colormap);
inline int colormapIndex(float t) {
    const float c = t < 0.f ? 0.f : (t > 1.f ? 1.f : t);
    return static_cast<int>(c * 255.0f + 0.5f);
}

} // namespace gpuphot::viewers
