#include "core/stages/prepare/weight_map.hpp"

#include <cmath>
#include <limits>

#include "core/util/errors.hpp"

namespace gpuphot {

WeightMapType parseWeightMapType(const std::string& name) {
    std::string n;
    for (char c : name)
        n += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (n == "none") return WeightMapType::None;
    if (n == "map_rms") return WeightMapType::Rms;
    if (n == "map_var") return WeightMapType::Variance;
    if (n == "map_weight") return WeightMapType::Weight;
    throw InvalidInput("weight map type '" + name + "': none, map_rms, map_var or map_weight");
}

const char* weightMapTypeName(WeightMapType t) {
    switch (t) {
    case WeightMapType::Rms:
        return "map_rms";
    case WeightMapType::Variance:
        return "map_var";
    case WeightMapType::Weight:
        return "map_weight";
    case WeightMapType::None:
        break;
    }
    return "none";
}

namespace {

// The relative variance of one map value, or +infinity when the value makes the pixel unusable.
float varianceOf(float v, WeightMapType type, double threshold) {
    constexpr float kUnusable = std::numeric_limits<float>::infinity();
    if (!std::isfinite(v)) return kUnusable;
    switch (type) {
    case WeightMapType::Weight:
        return v > 0.0f && v > threshold ? 1.0f / v : kUnusable;
    case WeightMapType::Rms:
        return v > 0.0f && !(threshold > 0.0 && v >= threshold) ? v * v : kUnusable;
    case WeightMapType::Variance:
        return v > 0.0f && !(threshold > 0.0 && v >= threshold) ? v : kUnusable;
    case WeightMapType::None:
        break;
    }
    return kUnusable;
}

} // namespace

WeightVariance weightToVariance(const ImageView& map, WeightMapType type, double threshold,
                                Image<std::uint8_t>& mask) {
    if (type == WeightMapType::None)
        throw InvalidInput("a weight map needs a type: map_rms, map_var or map_weight");
    if (mask.width() != map.width || mask.height() != map.height)
        throw InvalidInput("the weight map is " + std::to_string(map.width) + "x" +
                           std::to_string(map.height) + " px, the frame " + std::to_string(mask.width()) +
                           "x" + std::to_string(mask.height()));
    WeightVariance out;
    out.variance = Image<float>(map.width, map.height, Image<float>::NoInit{});
    for (int y = 0; y < map.height; ++y) {
        const float* in = map.row(y);
        float* var = out.variance.row(y);
        std::uint8_t* m = mask.row(y);
        for (int x = 0; x < map.width; ++x) {
            var[x] = varianceOf(in[x], type, threshold);
            if (std::isinf(var[x]) && !(m[x] & MaskBad)) {
                m[x] |= MaskBad;
                ++out.unusable;
            }
        }
    }
    return out;
}

} // namespace gpuphot
